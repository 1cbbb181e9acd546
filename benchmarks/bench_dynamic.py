"""Decode with H2O (paper Table 6, "SAS-Dyn") against the static patterns and FlexAttention.

For each Table-1 pattern S (examples/*.py) the dynamic pattern is
`S + (Causal() * ~S) * Dynamic(budget=512, score=ops.attn_score().sum(dim=1))`: H2O over the
region S leaves uncovered. At N = 16K (64 heads, head dim 128, bf16, batch 1; and a GQA
configuration 32 query / 8 KV heads, batch 16) the script

1. checks the kernels on the GPU against the float64 step-by-step reference
   (`sas.dynamic.dynamic_attention_reference`) at a small length: outputs and held key sets;
2. runs the dynamic prefill on N - 1 tokens (block-sparse attention over the full region,
   memoized score kernel, cut to the budget), then times one decode step at position N - 1 by
   CUDA-graph replay: the attention kernel (static segment + pool) plus the update kernel
   (score accumulation, expiry, eviction, staging); also the eager `kernel.decode` call with
   its host work;
3. times, in the same run, the static pattern's decode (sas), FlexAttention decode with the
   static pattern's BlockMask and with the oracle mask of the dynamic pattern (every region key:
   what attention without a budget reads), dense SDPA, and the HBM floor of the dynamic cache.

    python benchmarks/bench_dynamic.py --out results/dynamic      # writes .json and .md
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_kernels import (PATTERNS, copy_bandwidth, flex_masks, load_pattern, median_ms, rel_err,  # noqa: E402
                           write_results)

from sas import Causal, Dynamic, ops  # noqa: E402
from sas.dynamic import dynamic_attention_reference  # noqa: E402
from sas.runtime import SASAttnKernel, dynamic_host  # noqa: E402


#: eager steps timed back to back (bench "eager loop")
LOOP = 204


def dynamic_of(static, budget: int):
    return static + (Causal() * ~static) * Dynamic(budget=budget, score=ops.attn_score().sum(dim=1))


def item5_floor_ms(static_ms: float, pool_slots: int, batch: int, kv_heads: int, head_dim: int, bw: float) -> float:
    """Issue 11, item 5's floor of a dynamic step: the static decode's time plus the pool's K and
    V bytes (2-byte elements) at the copy bandwidth `bw` (bytes/s)."""
    return static_ms + 2 * pool_slots * batch * kv_heads * head_dim * 2 / bw * 1e3


def check_small(name: str, dev, dtype) -> dict:
    """Kernels vs the float64 reference: prefill 200 tokens, then 56 decode steps."""
    from sas import Diag, Rect  # noqa: F401

    small = {
        "streaming_llm": (Diag(0, 48) + Rect(cols=(0, 4))) * Causal(),
        "block_local": (Rect(size=(16, 16)) >> Diag(0, 3)) * Causal(),
        "sliding_window": Diag(0, 48),
        "openai_strided": (Diag(0, 32) + Diag(0, None, stride=32)) * Causal(),
        "openai_fixed": ((Rect(size=(64, 64)) >> Diag(0, 1))
                         + ((Rect(size=(64, 64)) * Rect(cols=(56, None))) >> Rect())) * Causal(),
        "strided_block_local": (Rect(size=(64, 64)) >> Diag(0, 1)) * Rect(stride=4) * Causal(),
    }[name]
    pattern = dynamic_of(small, 24)
    N, P, B, Hq, Hkv, D = 256, 200, 2, 8, 2, 128
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B, Hq, N, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, N, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, N, D, generator=g).to(dtype)
    ref = dynamic_attention_reference(pattern, q.double(), k.double(), v.double(), prefill_len=P)
    ker = SASAttnKernel(pattern, max_len=N)
    outs = [ker.prefill(q[:, :, :P].to(dev), k[:, :, :P].to(dev), v[:, :, :P].to(dev))]
    same = [ker.dynamic.held_keys() == [[list(t) for t in x] for x in ref.steps[0].held_sets()]]
    for i in range(P, N):
        outs.append(ker.decode(q[:, :, i:i + 1].to(dev), k[:, :, i:i + 1].to(dev), v[:, :, i:i + 1].to(dev)))
        same.append(ker.dynamic.held_keys() == [[list(t) for t in x] for x in ref.steps[i - P + 1].held_sets()])
    out = torch.cat(outs, dim=2).double().cpu()
    return {"check_rel_err": rel_err(out, ref.out), "check_held_sets_equal": f"{sum(same)}/{len(same)}"}


def eager_loop_ms(kern, qd, kd, vd, steps: int) -> float:
    """ms per step of `steps` calls of `kern.decode` back to back at advancing positions, as a
    model's decode loop makes them (one synchronize before and after; the garbage collector
    emptied before, left on during the loop)."""
    gc.collect()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        kern.decode(qd, kd, vd)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / steps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--budget", type=int, default=512)
    ap.add_argument("--patterns", default=",".join(PATTERNS))
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--no-gqa", action="store_true")
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16
    N, D = args.n, 128
    names = args.patterns.split(",")
    import triton

    props = torch.cuda.get_device_properties(dev) if dev.type == "cuda" else None
    meta = {"device": props.name if props else "cpu (interpreter dry run)", "torch": torch.__version__,
            "triton": triton.__version__, "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "N": N, "budget": args.budget, "dtype": "bfloat16", "head_dim": D}
    bw = copy_bandwidth(dev)
    meta["copy_bandwidth_TBps"] = bw / 1e12
    print(f"# {meta['device']}, torch {torch.__version__}, triton {triton.__version__}, copy {bw / 1e12:.2f} TB/s")
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    from torch import _dynamo

    _dynamo.config.cache_size_limit = 512
    flex = torch.compile(flex_attention)
    masks = flex_masks()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    rows = []
    configs = [("MHA", 1, 64, 64)] + ([] if args.no_gqa else [("GQA", 16, 32, 8)])
    for cfg, B, Hq, Hkv in configs:
        torch.manual_seed(0)
        q = torch.randn(B, Hq, N, D, device=dev, dtype=dtype) if cfg == "MHA" else None
        k = torch.randn(B, Hkv, N, D, device=dev, dtype=dtype)
        v = torch.randn(B, Hkv, N, D, device=dev, dtype=dtype)
        qd = torch.randn(B, Hq, 1, D, device=dev, dtype=dtype)
        kd, vd = k[:, :, N - 1:N].contiguous(), v[:, :, N - 1:N].contiguous()
        sdpa_ms = median_ms(lambda: sdpa(qd, k, v, enable_gqa=Hq != Hkv), True, args.rep)
        for name in names:
            t0 = time.time()
            static = load_pattern(name)
            row = {"config": cfg, "batch": B, "q_heads": Hq, "kv_heads": Hkv, "pattern": name, "N": N,
                   "sdpa_decode_ms": sdpa_ms}
            if cfg == "MHA" and not args.no_check:
                row.update(check_small(name, dev, dtype))
            # static counterpart
            sk = SASAttnKernel(static, max_len=N)
            kc, vc = sk.new_cache(B, Hkv, D, dtype, dev)
            sk.fill_cache(k[:, :, :N - 1], v[:, :, :N - 1], kc, vc)
            so = torch.empty_like(qd)
            row["static_cache_slots"] = sk.cache_size
            row["static_decode_ms"] = median_ms(lambda: sk.runtime.decode(qd, kd, vd, kc, vc, N - 1, out=so),
                                                True, args.rep)
            # dynamic: prefill N - 2 tokens (prompt queries: random for GQA, to save memory); the
            # timed step is position N - 2, so that a key is staged for N - 1 (steady state)
            P = N - 2
            dk = SASAttnKernel(dynamic_of(static, args.budget), max_len=N)
            qp = q[:, :, :P] if q is not None else torch.randn(B, Hq, P, D, device=dev, dtype=dtype)
            torch.cuda.synchronize() if dev.type == "cuda" else None
            t = time.perf_counter()
            dk.prefill(qp, k[:, :, :P].contiguous(), v[:, :, :P].contiguous())
            torch.cuda.synchronize() if dev.type == "cuda" else None
            row["dynamic_prefill_first_call_s"] = round(time.perf_counter() - t, 3)
            del qp
            rt = dk.dynamic
            c = rt.cplan
            row["dynamic_cache_slots"] = c.cache_size
            row["dynamic_static_slots"] = c.static_size
            row["dynamic_pool_slots"] = c.pool_size
            row["score_path"] = "fused" if c.fused else "torch"
            host = rt.rt                            # sas.runtime.dynamic_host.Runtime
            host.graphs = False
            dk.decode(qd, kd, vd)                   # one real step (position N - 2)
            tabs = host.device_tables(dev)
            do = torch.empty_like(qd)

            def step():
                dynamic_host.step(host.kernels, host.state, qd, kd, vd, P, do, tabs, evict=True)

            row["dynamic_decode_ms"] = median_ms(step, True, args.rep)
            row["dynamic_attend_only_ms"] = median_ms(
                lambda: dynamic_host.attend(host.kernels, host.state, qd, kd, vd, P, do), True, args.rep)

            def eager():                            # with host work: the runtime at position N - 2 again
                rt.length = P
                rt.decode(qd, kd, vd)
            # eager `decode` as a model calls it: three Triton launches (graphs off), and the
            # default on CUDA, the step replayed from the runtime's own CUDA graph
            row["dynamic_decode_eager_launches_ms"] = median_ms(eager, False, args.rep)
            host.graphs = True
            eager()                                 # first step at this shape: eager + capture
            row["dynamic_decode_eager_ms"] = median_ms(eager, False, args.rep)
            row["dynamic_eager_over_graph"] = row["dynamic_decode_eager_ms"] / row["dynamic_decode_ms"]
            # as a model runs it: steps back to back at advancing positions (no reset of the
            # position between calls, no event pair around each call); prompt of N - 2 - LOOP
            if dev.type == "cuda":
                qp = q[:, :, :P - LOOP] if q is not None else torch.randn(B, Hq, P - LOOP, D, device=dev, dtype=dtype)
                dk.prefill(qp, k[:, :, :P - LOOP].contiguous(), v[:, :, :P - LOOP].contiguous())
                del qp
                for _ in range(4):                  # first steps: compile, capture
                    dk.decode(qd, kd, vd)
                row["dynamic_decode_eager_loop_ms"] = eager_loop_ms(dk, qd, kd, vd, LOOP - 4)
                row["dynamic_eager_loop_over_graph"] = row["dynamic_decode_eager_loop_ms"] / row["dynamic_decode_ms"]
            row["hbm_floor_dynamic_ms"] = 2 * c.cache_size * B * Hkv * D * 2 / bw * 1e3
            # issue 11, item 5's floor: the static decode plus the pool's K and V bytes
            row["item5_floor_ms"] = item5_floor_ms(row["static_decode_ms"], c.pool_size, B, Hkv, D, bw)
            row["dyn_over_item5_floor"] = row["dynamic_decode_ms"] / row["item5_floor_ms"]
            # FlexAttention: static mask, and the oracle mask of the dynamic pattern (all region keys)
            mm = masks[name]
            off = N - 1
            dmm = (lambda mm_, off_: (lambda b, h, qi, ki: mm_(b, h, qi + off_, ki)))(mm, off)
            dbm = create_block_mask(dmm, None, None, 1, N, device=dev)
            gq = Hq != Hkv
            row["flex_static_decode_ms"] = median_ms(lambda: flex(qd, k, v, block_mask=dbm, enable_gqa=gq),
                                                     True, args.rep)
            cbm = create_block_mask(lambda b, h, qi, ki: qi + off >= ki, None, None, 1, N, device=dev)
            row["flex_oracle_decode_ms"] = median_ms(lambda: flex(qd, k, v, block_mask=cbm, enable_gqa=gq),
                                                     True, args.rep)
            row["dyn_over_static"] = row["dynamic_decode_ms"] / row["static_decode_ms"]
            row["flex_static_over_dyn"] = row["flex_static_decode_ms"] / row["dynamic_decode_ms"]
            row["flex_oracle_over_dyn"] = row["flex_oracle_decode_ms"] / row["dynamic_decode_ms"]
            row["seconds"] = round(time.time() - t0, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.out:  # partial results after every row: a cut-off run keeps what it measured
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                Path(args.out).with_suffix(".partial.json").write_text(json.dumps({"meta": meta, "rows": rows}))
            del dk, sk, kc, vc
            torch.cuda.empty_cache() if dev.type == "cuda" else None
        del q, k, v
    md = markdown(meta, rows)
    print(md)
    write_results(args.out, {"meta": meta, "rows": rows}, md)


def markdown(meta, rows) -> str:
    lines = [f"{meta['device']}, torch {meta['torch']}, triton {meta['triton']}, {meta['date']}; bf16, head dim "
             f"{meta['head_dim']}, N = {meta['N']}, budget {meta['budget']}; medians in ms (CUDA-graph replay); "
             f"copy bandwidth {meta['copy_bandwidth_TBps']:.2f} TB/s.", "",
             "| config | pattern | slots static / dynamic (pool) | sas static | sas dynamic | dyn / static | "
             "eager dyn (graph) | eager / graph | eager loop / graph | eager dyn (launches) | Flex static mask | "
             "Flex oracle mask | SDPA dense | dyn / HBM floor | dyn / (static + pool bytes) | GPU check |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        chk = (f"err {r['check_rel_err']:.1e}, sets {r['check_held_sets_equal']}" if "check_rel_err" in r else "")
        lines.append(
            f"| {r['config']} | {r['pattern']} | {r['static_cache_slots']} / {r['dynamic_cache_slots']} "
            f"({r['dynamic_pool_slots']}) | {r['static_decode_ms']:.4f} | {r['dynamic_decode_ms']:.4f} | "
            f"{r['dyn_over_static']:.2f} | {r['dynamic_decode_eager_ms']:.4f} | {r['dynamic_eager_over_graph']:.2f} | "
            f"{r.get('dynamic_eager_loop_over_graph', float('nan')):.2f} | "
            f"{r['dynamic_decode_eager_launches_ms']:.4f} | {r['flex_static_decode_ms']:.4f} | "
            f"{r['flex_oracle_decode_ms']:.4f} | {r['sdpa_decode_ms']:.4f} | "
            f"{r['dynamic_decode_ms'] / r['hbm_floor_dynamic_ms']:.2f} | "
            f"{r.get('dyn_over_item5_floor', float('nan')):.2f} | {chk} |")
    for cfg in sorted({r["config"] for r in rows}):
        rs = [r for r in rows if r["config"] == cfg]
        gm = lambda xs: math.exp(sum(math.log(x) for x in xs) / len(xs))  # noqa: E731
        lines += ["", f"{cfg}: eager (runtime's graph) / graph replay geomean "
                      f"{gm([r['dynamic_eager_over_graph'] for r in rs]):.2f} (max "
                      f"{max(r['dynamic_eager_over_graph'] for r in rs):.2f}); eager loop (back to back, "
                      f"as a model runs it) / graph replay geomean "
                      f"{gm([r.get('dynamic_eager_loop_over_graph', float('nan')) for r in rs]):.2f}; "
                      f"dynamic / static decode geomean {gm([r['dyn_over_static'] for r in rs]):.2f} "
                      f"(max {max(r['dyn_over_static'] for r in rs):.2f}); Flex (static mask) / dynamic geomean "
                      f"{gm([r['flex_static_over_dyn'] for r in rs]):.2f}; Flex (oracle mask) / dynamic geomean "
                      f"{gm([r['flex_oracle_over_dyn'] for r in rs]):.2f}"]
        i5 = [r["dyn_over_item5_floor"] for r in rs if "dyn_over_item5_floor" in r]
        loops = [r["dynamic_eager_loop_over_graph"] for r in rs if "dynamic_eager_loop_over_graph" in r]
        if i5:
            eager = (f"; eager loop within 1.3x of graph replay for {sum(x <= 1.3 for x in loops)} of {len(loops)}"
                     if loops else "")
            lines.append(f"{cfg}, issue 11 item 5: graph replay within 1.5x of the static decode + the pool's "
                         f"bytes for {sum(x <= 1.5 for x in i5)} of {len(i5)} (max {max(i5):.2f}){eager}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
