"""CUDA vs Triton decode on small compact caches, each CUDA decode kernel, empty and attended steps.

For a few patterns (default: strided block-local's 64-slot cache, block-local's 384, sliding
window's 1024, OpenAI-fixed's 2272 at N = 16384), MHA (batch 1, 64 heads) and GQA (batch 16, 32
query / 8 KV heads), head dim 128, bf16: one decode step at position N - 1 (for strided
block-local a query that attends nothing: the step is all fixed cost) and at N - 4 (one that
attends), timed by CUDA-graph replay, Triton and the CUDA kernels ("auto", "simt", "mma") in
turn for `--rounds` rounds (median round each). Every CUDA output is checked against Triton's
first (largest relative error printed). Times in microseconds.

    python benchmarks/bench_cuda_small_decode.py --out results/small.json
    python benchmarks/bench_cuda_small_decode.py --root /path/to/other/checkout --tag old   # A/B

`--ncu` instead runs each decode once between `torch.cuda.profiler.start()` / `stop()` for
`ncu --profile-from-start off` (labels printed before each).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="the sas checkout to measure (default: this one)")
    ap.add_argument("--tag", default="new", help="label of this checkout in the output")
    ap.add_argument("--patterns", default="strided_block_local,block_local,sliding_window,openai_fixed")
    ap.add_argument("--length", type=int, default=16384)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep", type=int, default=60, help="timing window per measurement, ms")
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--out", default=None, help="JSON file for the rows")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    for p in (root, root + "/benchmarks", root + "/tests/helpers", root + "/tests"):
        sys.path.insert(0, p)
    import torch
    from bench_kernels import load_pattern, median_ms, rel_err

    from sas.runtime import SASAttnKernel

    dev, dt, D, N = torch.device("cuda"), torch.bfloat16, 128, args.length
    names = args.patterns.split(",")
    kern = {}
    for name in names:
        tk = SASAttnKernel(load_pattern(name), max_len=N)
        kern[name] = (tk, SASAttnKernel(plan=tk.plan, backend="cuda"))
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda c: c.runtime.ensure_built(dt, D), [c for _, c in kern.values()]))
    rows = []
    torch.manual_seed(0)
    for cfg, (B, Hq, Hkv) in (("MHA", (1, 64, 64)), ("GQA", (16, 32, 8))):
        q = torch.randn(B, Hq, 1, D, device=dev, dtype=dt)
        k = torch.randn(B, Hkv, N, D, device=dev, dtype=dt)
        v = torch.randn(B, Hkv, N, D, device=dev, dtype=dt)
        for name in names:
            tk, ck = kern[name]
            for pos in (N - 1, N - 4):
                kd, vd = k[:, :, pos:pos + 1].contiguous(), v[:, :, pos:pos + 1].contiguous()
                kc, vc = tk.new_cache(B, Hkv, D, dt, dev)
                tk.fill_cache(k[:, :, :pos], v[:, :, :pos], kc, vc)
                kc2, vc2 = kc.clone(), vc.clone()
                o1, o2 = torch.empty_like(q), torch.empty_like(q)
                ref = tk.runtime.decode(q, kd, vd, kc, vc, pos, out=o1).clone()
                labels = ["triton", "auto", "simt", "mma"]
                fns = [lambda: tk.runtime.decode(q, kd, vd, kc, vc, pos, out=o1)]
                fns += [(lambda kn: (lambda: ck.runtime.loader.decode(q, kd, vd, kc2, vc2, pos, out=o2, kernel=kn)))(kn)
                        for kn in labels[1:]]
                errs = {}
                for lab, fn in zip(labels[1:], fns[1:]):
                    kc2.copy_(kc)
                    vc2.copy_(vc)
                    errs[lab] = rel_err(fn().clone(), ref)
                if args.ncu:
                    for fn in fns:
                        fn()
                    torch.cuda.synchronize()
                    for lab, fn in zip(labels, fns):
                        print(f"NCU {cfg} {name} pos={pos} {lab}", flush=True)
                        torch.cuda.profiler.start()
                        fn()
                        torch.cuda.synchronize()
                        torch.cuda.profiler.stop()
                    continue
                # bench_kernels.paired_ms's loop, written out: with --root, bench_kernels is the other
                # checkout's, which may predate paired_ms
                times = [[] for _ in fns]
                for _ in range(args.rounds):
                    for i, fn in enumerate(fns):
                        times[i].append(median_ms(fn, True, args.rep))
                us = [sorted(t)[len(t) // 2] * 1e3 for t in times]
                rows.append(dict(tag=args.tag, cfg=cfg, pattern=name, C=tk.cache_size, pos=pos,
                                 us=dict(zip(labels, us)), err=errs))
                print(f"{args.tag:4s} {cfg} {name:20s} C={tk.cache_size:5d} pos={pos} "
                      + " ".join(f"{lab}={t:6.2f}" for lab, t in zip(labels, us))
                      + f"  auto/triton={us[1] / us[0]:.3f}  max rel err={max(errs.values()):.1e}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
