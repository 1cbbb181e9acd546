"""sas across GPUs: a Llama-3.1-8B-shaped model under transformers' tensor parallelism
(issue 15; docs/models.md "Across GPUs").

The model: hidden 4096, intermediate 14336, 32 query / 8 KV heads, head dim 128, vocab 128256,
random weights, `--layers` of its 32 layers (default 8), saved once as a checkpoint so that
every rank loads it with `tp_plan="auto"` (transformers shards q/k/v/o by heads, the MLP by
columns / rows, over NCCL). One GPU loads the same checkpoint without sharding.

    python benchmarks/bench_tp.py make-model --dir /tmp/llama8b --layers 8
    torchrun --nproc-per-node 1 benchmarks/bench_tp.py run --dir /tmp/llama8b --out /tmp/tp1.json
    torchrun --nproc-per-node 2 benchmarks/bench_tp.py run --dir /tmp/llama8b --out /tmp/tp2.json
    python benchmarks/bench_tp.py report /tmp/tp1.json /tmp/tp2.json --out /tmp/tp.json

`run`, in every rank:
1. check (float32): greedy generation of a batch of 2 random prompts (256 tokens, 24 new) with
   dense `sdpa`, a static sas pattern (sink 4 + window 64) and a Dynamic one (window 32 + H2O
   budget 32 over the rest); the tokens and each rank's KV bytes are recorded.
2. speed (bfloat16): `--context` random tokens x `--batch` rows, then greedy decode timed per
   step on CUDA events (median after `--warm` steps), for dense `sdpa` and the sas patterns;
   then `--profile-steps` steps under torch.profiler give the GPU busy time per step (the rest
   of a step is the GPU waiting for the host: Python, DTensor dispatch, launches); per-rank
   peak memory (prefill and decode) and KV bytes, gathered from every rank.
`report` puts the 1-GPU and 2-GPU runs side by side: tokens/s, the 2-GPU speed-up, per-GPU
memory and KV bytes, and whether the greedy tokens of 2 GPUs equal those of 1.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_models import LLAMA8B, StepRecorder, build_llama8b, copy_bandwidth  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, LogitsProcessorList  # noqa: E402

from sas import Causal, Diag, Dynamic, Rect, ops  # noqa: E402
from sas.models import tp_plan_kwargs  # noqa: E402

CHECK_PATTERNS: dict[str, Any] = {
    "sas:streaming64": (Diag(0, 64) + Rect(cols=(0, 4))) * Causal(),
    "sas:window32+h2o32": Diag(0, 32) + Diag(32, 1 << 20) * Dynamic(budget=32, score=ops.attn_score().sum(dim=1),
                                                                     refresh=False),
}
SPEED_PATTERNS: dict[str, Any] = {
    "sas:window1k": Diag(0, 1024) * Causal(),
    "sas:streaming": (Diag(0, 1024) + Rect(cols=(0, 32))) * Causal(),   # examples/streaming_llm.py
}


def world() -> tuple[int, int]:
    return (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)


def log(msg: str) -> None:
    if world()[1] == 0:
        print(msg, flush=True)


def make_model(directory: Path, layers: int) -> None:
    build_llama8b(torch.bfloat16, layers).save_pretrained(directory)   # the same weights as bench_models


def load(directory: str, dtype: torch.dtype, attn: str = "sdpa") -> Any:
    n, _ = world()
    if n > 1:
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, attn_implementation=attn,
                                                     **tp_plan_kwargs())
    else:
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, attn_implementation=attn).to("cuda")
    model.generation_config.eos_token_id = None
    return model.eval()


def local_bytes(model: Any, skip_input_embedding: bool = True) -> int:
    """Parameter bytes this rank holds (and a decode step reads)."""
    emb = model.get_input_embeddings().weight
    total = 0
    for p in model.parameters():
        if skip_input_embedding and p is emb and model.get_output_embeddings().weight is not emb:
            continue
        t = p.to_local() if hasattr(p, "to_local") else p
        total += t.numel() * t.element_size()
    return total


def nccl_ms_per_step(rec: StepRecorder) -> float | None:
    """Device time of NCCL kernels per profiled step: a rank's all-reduce kernel runs until the
    other rank arrives, so it counts waiting as busy; busy minus this is the rank's compute."""
    if rec.prof is None or not rec.profiled:
        return None
    us = sum(e.self_device_time_total for e in rec.prof.key_averages() if "nccl" in e.key.lower())
    return us / 1e3 / rec.profiled


def gather(value: Any) -> list[Any]:
    n, _ = world()
    if n == 1:
        return [value]
    out: list[Any] = [None] * n
    dist.all_gather_object(out, value)
    return out


def patched(model: Any, name: str, pattern: Any, max_len: int) -> Any:
    if pattern is None:
        return model
    from sas.integrations.transformers import sas_attention

    return sas_attention(model, pattern, backend="triton", max_len=max_len)


def check(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    torch.manual_seed(1)
    ids = torch.randint(100, LLAMA8B["vocab_size"] - 100, (2, 256)).cuda()
    for name, pattern in {"sdpa": None, **CHECK_PATTERNS}.items():
        row: dict[str, Any] = {"variant": name}
        try:
            model = patched(load(args.dir, torch.float32), name, pattern, 512)
            with torch.no_grad():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, min_new_tokens=24,
                                     do_sample=False, pad_token_id=0, return_dict_in_generate=True,
                                     disable_compile=True)
            row["tokens"] = out.sequences[:, 256:].tolist()
            from sas.integrations.transformers import output_cache
            cache = output_cache(out)
            row["kv_bytes_per_rank"] = gather(int(cache.kv_cache_bytes()) if hasattr(cache, "kv_cache_bytes")
                                              else None)
            del model, out, cache
        except Exception as e:   # a failed variant is a row
            row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            row["traceback"] = traceback.format_exc(limit=6)[-2500:]
        rows.append(row)
        log(f"  check {name}: {'ok' if 'tokens' in row else row['error']}")
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def speed(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    n, _ = world()
    new = args.warm + args.steps + args.profile_steps
    torch.manual_seed(2)
    ids = torch.randint(100, LLAMA8B["vocab_size"] - 100, (args.batch, args.context)).cuda()
    for name, pattern in {"sdpa": None, **SPEED_PATTERNS}.items():
        row: dict[str, Any] = {"variant": name, "context": args.context, "batch": args.batch, "gpus": n}
        t = time.perf_counter()
        try:
            model = patched(load(args.dir, torch.bfloat16), name, pattern, args.context + new)
            rec = StepRecorder(new, args.profile_steps)
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            if n > 1:
                dist.barrier()
            torch.cuda.synchronize()
            t0 = torch.cuda.Event(enable_timing=True)
            t0.record()
            with torch.no_grad():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                     min_new_tokens=new, do_sample=False, pad_token_id=0,
                                     return_dict_in_generate=True, disable_compile=True,
                                     logits_processor=LogitsProcessorList([rec]))
            torch.cuda.synchronize()
            steps = rec.step_ms(args.warm, rec.profiled)
            row["ms_per_token"] = statistics.median(steps)
            row["host_ms_per_step"] = statistics.median(rec.host_ms(args.warm, rec.profiled))
            busy = rec.gpu_busy_ms_per_step()
            row["gpu_busy_ms_per_step_per_rank"] = gather(busy)
            row["nccl_ms_per_step_per_rank"] = gather(nccl_ms_per_step(rec))
            row["tokens_per_s"] = args.batch * 1e3 / row["ms_per_token"]
            row["prefill_ms"] = t0.elapsed_time(rec.events[0])
            from sas.integrations.transformers import output_cache
            cache = output_cache(out)
            kv = int(cache.kv_cache_bytes()) if hasattr(cache, "kv_cache_bytes") else sum(
                (layer.keys.numel() * layer.keys.element_size() * 2) for layer in cache.layers)
            row["kv_bytes_per_rank"] = gather(kv)
            row["weight_bytes_per_rank"] = gather(local_bytes(model))
            row["prefill_peak_gib_per_rank"] = gather(rec.prefill_peak / 2**30)
            row["decode_peak_gib_per_rank"] = gather(torch.cuda.max_memory_allocated() / 2**30)
            row["floor_ms"] = max((w + k) / args.bandwidth * 1e3 for w, k in
                                  zip(row["weight_bytes_per_rank"], row["kv_bytes_per_rank"]))
            del model, out, cache
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            row["traceback"] = traceback.format_exc(limit=6)[-2500:]
        row["wall_s"] = round(time.perf_counter() - t, 1)
        rows.append(row)
        log(f"  speed {name} x{n}: " + (f"{row['ms_per_token']:.2f} ms/step, {row['tokens_per_s']:.0f} tok/s, "
                                        f"peak {max(row['decode_peak_gib_per_rank']):.1f} GiB/GPU"
                                        if "error" not in row else row["error"]) + f" ({row['wall_s']} s)")
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def run(args: argparse.Namespace) -> None:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # transformers initializes the process group in from_pretrained; the first collective
        # here needs it earlier
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
    n, rank = world()
    args.bandwidth = copy_bandwidth()
    log(f"{n} GPU(s) {torch.cuda.get_device_name()}, copy bandwidth {args.bandwidth / 1e12:.2f} TB/s")
    t = time.perf_counter()
    result = {"meta": {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
                       "gpus": n, "torch": torch.__version__, "transformers": transformers.__version__,
                       "copy_bandwidth_bytes_per_s": args.bandwidth,
                       "layers": LlamaConfig.from_pretrained(args.dir).num_hidden_layers,
                       "patterns": {k: repr(v) for k, v in {**CHECK_PATTERNS, **SPEED_PATTERNS}.items()}},
              "check": [] if args.skip_check else check(args), "speed": speed(args)}
    result["meta"]["wall_s"] = round(time.perf_counter() - t, 1)
    if rank == 0:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.out} in {result['meta']['wall_s']} s", flush=True)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def busy(row: dict[str, Any]) -> str:
    """GPU busy ms per step of each rank (`r0 / r1`), and of its NCCL kernels where recorded."""
    values = row.get("gpu_busy_ms_per_step_per_rank") or []
    nccl = row.get("nccl_ms_per_step_per_rank") or [None] * len(values)
    parts = [("-" if b is None else f"{b:.1f}") + ("" if n is None else f" (nccl {n:.1f})")
             for b, n in zip(values, nccl)]
    return " / ".join(parts) if parts else "-"


def report(one_path: str, two_path: str, out: str | None) -> str:
    one, two = json.loads(Path(one_path).read_text()), json.loads(Path(two_path).read_text())
    lines = [f"{two['meta']['device']}, {two['meta']['date']}, Llama-3.1-8B-shaped, {two['meta']['layers']} layers, "
             f"random weights, bf16, eager decode",
             "", "| variant | GPUs | context | batch | ms/token | tokens/s | 2 GPUs / 1 GPU | vs sdpa (same GPUs) | "
             "GPU busy ms/step per rank | KV MiB per GPU | weights GiB per GPU | peak GiB per GPU (prefill / decode) | floor ms |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    base = {(r["gpus"], r["variant"]): r for run_ in (one, two) for r in run_["speed"] if "error" not in r}
    for run_ in (one, two):
        for r in run_["speed"]:
            if "error" in r:
                lines.append(f"| {r['variant']} | {r['gpus']} | {r['context']} | {r['batch']} | failed: "
                             f"{r['error'][:100]} ||||||||")
                continue
            single = base.get((1, r["variant"]))
            sdpa = base.get((r["gpus"], "sdpa"))
            lines.append(
                f"| {r['variant']} | {r['gpus']} | {r['context']} | {r['batch']} | {r['ms_per_token']:.2f} | "
                f"{r['tokens_per_s']:.0f} | {r['tokens_per_s'] / single['tokens_per_s']:.2f}x | "
                f"{r['tokens_per_s'] / sdpa['tokens_per_s']:.2f}x | {busy(r)} | "
                f"{max(r['kv_bytes_per_rank']) / 2**20:.0f} | "
                f"{max(r['weight_bytes_per_rank']) / 2**30:.2f} | {max(r['prefill_peak_gib_per_rank']):.1f} / "
                f"{max(r['decode_peak_gib_per_rank']):.1f} | {r['floor_ms']:.2f} |"
                if single and sdpa else f"| {r['variant']} | {r['gpus']} | missing baseline |")
    lines += ["", "| check (float32, greedy, 2 x 24 tokens) | 1 GPU | 2 GPUs | same tokens | KV bytes per GPU (1 / 2) |",
              "|---|---|---|---|---|"]
    checks_two = {r["variant"]: r for r in two["check"]}
    for r in one["check"]:
        s = checks_two.get(r["variant"], {})
        same = ("yes" if r.get("tokens") == s.get("tokens") else
                f"no ({sum(a == b for x, y in zip(r['tokens'], s['tokens']) for a, b in zip(x, y))}/48 equal)")\
            if "tokens" in r and "tokens" in s else "-"
        kv1, kv2 = r.get("kv_bytes_per_rank", [None]), s.get("kv_bytes_per_rank", [None])
        lines.append(f"| {r['variant']} | {'ok' if 'tokens' in r else r.get('error', '')[:80]} | "
                     f"{'ok' if 'tokens' in s else s.get('error', '')[:80]} | {same} | {kv1} / {kv2} |")
    text = "\n".join(lines) + "\n"
    if out:
        Path(out).write_text(json.dumps({"one_gpu": one, "two_gpus": two, "table": text}, indent=2))
        Path(out).with_suffix(".md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make-model")
    mk.add_argument("--dir", required=True)
    mk.add_argument("--layers", type=int, default=8)
    rn = sub.add_parser("run")
    rn.add_argument("--dir", required=True)
    rn.add_argument("--out", required=True)
    rn.add_argument("--context", type=int, default=32768)
    rn.add_argument("--batch", type=int, default=16)
    rn.add_argument("--warm", type=int, default=3)
    rn.add_argument("--steps", type=int, default=16)
    rn.add_argument("--profile-steps", type=int, default=3, help="decode steps under the profiler, after the "
                                                                  "timed ones: GPU busy time per step")
    rn.add_argument("--skip-check", action="store_true")
    rp = sub.add_parser("report")
    rp.add_argument("one")
    rp.add_argument("two")
    rp.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.cmd == "make-model":
        make_model(Path(args.dir), args.layers)
    elif args.cmd == "run":
        run(args)
    else:
        print(report(args.one, args.two, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
