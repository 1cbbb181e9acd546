"""`sas train PATTERN`: fit Saap's offline state (k-means centroids and query classifiers per
layer and KV head) from a model's own queries and keys, saved as safetensors with the
pattern's hash and the model's name (docs/cli.md, docs/dynamic.md section 6).

Every argument and the pattern are checked before the model is loaded; a `SASError` becomes
one `error: ...` line, exit code 2. torch / transformers are imported inside the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from sas.errors import SASError


class TrainCommandError(SASError):
    """A bad argument of `sas train`."""


def _layers(text: str) -> list[int] | None:
    if text.strip().lower() == "all":
        return None
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        raise TrainCommandError(f"--layers must be 'all' or comma-separated layer indices such as 1,2,5, got {text!r}") from None
    if any(x < 0 for x in out) or len(set(out)) != len(out):
        raise TrainCommandError(f"--layers must be distinct non-negative layer indices, got {text!r}")
    return out


def _positive(value: int, what: str) -> None:
    if value < 1:
        raise TrainCommandError(f"{what} must be a positive integer, got {value}")


def _text_ids(tokenizer: Any, text_path: Path | None, text_arg: str, tokens: int) -> list[int]:
    """The first `tokens` token ids of --text: the built-in corpus (text_path None) or a file."""
    from sas.evaluation.text import corpus_tokens   # deferred like the commands' other model imports

    if text_path is None:
        return corpus_tokens(tokenizer, tokens)
    ids = tokenizer(text_path.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"][:tokens]
    if len(ids) < tokens:
        raise TrainCommandError(f"--text {text_arg!r} has {len(ids)} tokens, fewer than --tokens {tokens}")
    return ids


@click.command(name="train", short_help="Fit Saap state (ops.partition) from a model's own queries and keys.")
@click.argument("pattern", metavar="PATTERN")
@click.option("--model", "model_spec", default="default", show_default=True, metavar="SPEC",
              help="'default' (SmolLM2-135M-Instruct), a folder with config.json or a .gguf file.")
@click.option("--text", "text_arg", default="corpus", show_default=True, metavar="corpus|FILE",
              help="Training text: the built-in corpus (sas.evaluation.text) or a UTF-8 text file.")
@click.option("--tokens", type=int, default=4096, show_default=True, metavar="N", help="Tokens of the text to run.")
@click.option("--clusters", type=int, default=64, show_default=True, metavar="C", help="k-means clusters per KV head.")
@click.option("--layers", "layers_arg", default="all", show_default=True, metavar="all|L[,L...]",
              help="Layers to fit ('all': every layer except 0, which the paper keeps dense).")
@click.option("--hidden", type=int, default=256, show_default=True, help="Classifier hidden width.")
@click.option("--steps", type=int, default=200, show_default=True, help="Classifier training steps (Adam).")
@click.option("--lr", type=float, default=1e-3, show_default=True, help="Classifier learning rate.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of k-means and the classifier.")
@click.option("--device", default="cpu", show_default=True, help="Torch device of the model.")
@click.option("-o", "--output", required=True, metavar="FILE.safetensors", help="Where to write the state.")
def train(pattern: str, model_spec: str, text_arg: str, tokens: int, clusters: int, layers_arg: str, hidden: int,
          steps: int, lr: float, seed: int, device: str, output: str) -> None:
    """Fit Saap state for PATTERN (a Dynamic scored by ops.partition(...).sum(dim=1)).

    Runs the model over --tokens tokens of --text, captures every chosen layer's pre-RoPE
    queries and keys, clusters the keys (k-means) and trains a query classifier per KV head on
    the attention mass each query puts in each cluster outside the pattern's sink + window.
    """
    # sas.cli.main imports this module to register the command: import its loader at call time.
    from sas.cli.main import load

    for v, what in ((tokens, "--tokens"), (clusters, "--clusters"), (hidden, "--hidden"), (steps, "--steps")):
        _positive(v, what)
    if not lr > 0:
        raise TrainCommandError(f"--lr must be a positive number, got {lr}")
    layers = _layers(layers_arg)
    out = Path(output)
    if out.is_dir() or not out.parent.is_dir():
        raise TrainCommandError(f"-o/--output must be a file in an existing folder, got {output!r}")
    text_path = None if text_arg == "corpus" else Path(text_arg)
    if text_path is not None and not text_path.is_file():
        raise TrainCommandError(f"--text must be 'corpus' or a text file, got {text_arg!r} (not a file)")
    p = load(pattern)
    # torch / transformers: optional heavy dependencies, imported once the arguments are valid.
    import torch

    from sas.methods.saap_train import check_tokens, pattern_layout, train_state
    from sas.models import load_model, parse_device, resolve_model

    sink, window, probes = pattern_layout(p, tokens)
    if probes > clusters:
        raise TrainCommandError(f"the pattern probes {probes} clusters but --clusters is {clusters}; "
                                f"use --clusters >= {probes}")
    check_tokens(tokens, sink, window, clusters)
    parse_device(device)
    source = resolve_model(model_spec)
    model, tokenizer = load_model(model_spec, dtype=torch.float32, device=device)
    ids = _text_ids(tokenizer, text_path, text_arg, tokens)
    n_layers = int(model.config.num_hidden_layers)
    if layers is None:
        layers = list(range(1, n_layers)) or [0]
    state = train_state(model, torch.tensor([ids], device=model.device), p, source.name, clusters=clusters,
                        layers=layers, hidden=hidden, steps=steps, lr=lr, seed=seed)
    state.save(out)
    click.echo(f"wrote {output}: Saap state for {len(layers)} layer(s) of {source.name}, {clusters} clusters, "
               f"pattern hash {state.pattern_hash}")


@click.command(name="align", short_help="SpecAttn layer alignment: map each target layer to a draft layer (min KL).")
@click.option("--model", "model_spec", default="default", show_default=True, metavar="SPEC",
              help="Target model: 'default' (SmolLM2-135M-Instruct), a folder with config.json or a .gguf file.")
@click.option("--draft-layers", "draft_arg", default="every:3", show_default=True, metavar="every:K|L[,L...]",
              help="The draft: the target's own embeddings, final norm and head with these decoder layers.")
@click.option("--text", "text_arg", default="corpus", show_default=True, metavar="corpus|FILE",
              help="Alignment text: the built-in corpus (sas.evaluation.text) or a UTF-8 text file.")
@click.option("--tokens", type=int, default=512, show_default=True, metavar="N", help="Tokens of the text to run.")
@click.option("--device", default="cpu", show_default=True, help="Torch device of the models.")
@click.option("-o", "--output", required=True, metavar="FILE.json", help="Where to write the alignment.")
def align(model_spec: str, draft_arg: str, text_arg: str, tokens: int, device: str, output: str) -> None:
    """Align the target's layers to a draft's (SpecAttn §3.3): S[i, j] = -KL(target layer j ||
    draft layer i) over --tokens tokens of --text (head-averaged rows), then the monotone map
    maximising the sum of S (dynamic programming). Writes JSON with the target model's name."""
    _positive(tokens, "--tokens")
    out = Path(output)
    if out.is_dir() or not out.parent.is_dir():
        raise TrainCommandError(f"-o/--output must be a file in an existing folder, got {output!r}")
    text_path = None if text_arg == "corpus" else Path(text_arg)
    if text_path is not None and not text_path.is_file():
        raise TrainCommandError(f"--text must be 'corpus' or a text file, got {text_arg!r} (not a file)")
    import torch

    from sas.methods.specattn_align import (attention_maps, draft_name, layer_subset_model, make_alignment,
                                            parse_draft_layers)
    from sas.models import load_model, parse_device, read_config, resolve_model

    parse_device(device)
    source = resolve_model(model_spec)
    layers = parse_draft_layers(draft_arg, int(read_config(source).num_hidden_layers))
    model, tokenizer = load_model(model_spec, dtype=torch.float32, device=device)
    ids = _text_ids(tokenizer, text_path, text_arg, tokens)
    x = torch.tensor([ids], device=model.device)
    draft = layer_subset_model(model, layers)
    al = make_alignment(attention_maps(draft, x), attention_maps(model, x), source.name, draft_name(layers))
    al.save(out)
    click.echo(f"wrote {output}: {source.name} target layers -> draft {al.draft}: {list(al.mapping)} "
               f"(sum of -KL {al.score:.4f})")


@click.command(name="calibrate", short_help="Kascade: anchors (DP) and head maps from a model's attention.")
@click.argument("pattern", metavar="PATTERN")
@click.option("--model", "model_spec", default="default", show_default=True, metavar="SPEC",
              help="'default' (SmolLM2-135M-Instruct), a folder with config.json or a .gguf file.")
@click.option("--text", "text_arg", default="corpus", show_default=True, metavar="corpus|FILE",
              help="Development text: the built-in corpus (sas.evaluation.text) or a UTF-8 text file.")
@click.option("--tokens", type=int, default=1024, show_default=True, metavar="N", help="Tokens of the text to run.")
@click.option("--window", type=int, default=512, show_default=True, metavar="W",
              help="Tokens per forward pass (the similarity is averaged over the windows).")
@click.option("--anchors", type=int, default=5, show_default=True, metavar="M",
              help="Anchor layers, layer 0 included (the paper: 5 of 32).")
@click.option("--device", default="cpu", show_default=True, help="Torch device of the model.")
@click.option("-o", "--output", required=True, metavar="FILE.safetensors", help="Where to write the state.")
def calibrate(pattern: str, model_spec: str, text_arg: str, tokens: int, window: int, anchors: int, device: str,
              output: str) -> None:
    """Calibrate Kascade for PATTERN (the anchor layer: a Dynamic(..., publish=name) scored by
    ops.attn_score().sum(dim=1)).

    One pass of the model over --tokens tokens of --text (eager attention, windows of --window):
    the cross-layer similarity of top-k sets, the layer weights, the paper's anchor DP (checked
    against brute force when feasible) and the KV-head maps, saved with the pattern's hash.
    """
    from sas.cli.main import load

    for v, what in ((tokens, "--tokens"), (window, "--window"), (anchors, "--anchors")):
        _positive(v, what)
    if window > tokens:
        raise TrainCommandError(f"--window ({window}) must be at most --tokens ({tokens})")
    out = Path(output)
    if out.is_dir() or not out.parent.is_dir():
        raise TrainCommandError(f"-o/--output must be a file in an existing folder, got {output!r}")
    text_path = None if text_arg == "corpus" else Path(text_arg)
    if text_path is not None and not text_path.is_file():
        raise TrainCommandError(f"--text must be 'corpus' or a text file, got {text_arg!r} (not a file)")
    p = load(pattern)
    from sas.methods.kascade_dynamic import kascade_layer

    layer = kascade_layer(p)
    if layer.role == "reuse":
        raise TrainCommandError("sas calibrate takes the anchor pattern (Dynamic(..., publish=name)), not a reuse "
                                "pattern")
    import torch

    from sas.methods.kascade_calibrate import calibrate as run_calibration
    from sas.models import load_model, parse_device, resolve_model

    parse_device(device)
    source = resolve_model(model_spec)
    model, tokenizer = load_model(model_spec, dtype=torch.float32, device=device)
    n_layers = int(model.config.num_hidden_layers)
    if anchors > n_layers:
        raise TrainCommandError(f"--anchors must be at most the model's {n_layers} layers, got {anchors}")
    ids = _text_ids(tokenizer, text_path, text_arg, tokens)
    state = run_calibration(model, torch.tensor([ids], device=model.device), p, source.name, anchors=anchors,
                            window=window, tile=layer.tile)
    state.save(out)
    click.echo(f"wrote {output}: Kascade state for {source.name}: anchors {list(state.anchors)} (DP objective "
               f"{state.dp_value:.4f}, brute force {state.brute_force}), pattern hash {state.pattern_hash}")


__all__ = ["align", "calibrate", "train"]
