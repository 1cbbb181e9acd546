"""Does programmatic dependent launch (PDL) take the launch out of a small-cache decode?
(issue 11, item 4)

A decode step over a small compact cache is mostly fixed cost: the launch of the split kernel,
its first loads, and the combine launch. Under PDL (compute capability 9+) a kernel launched
with the programmatic-serialization attribute is scheduled while the kernel before it is still
running; ours wait for it (`griddepcontrol.wait`) before touching memory, so only the launch
overlaps. Triton's `do_bench_cudagraph`, which every decode figure in docs/benchmarks.md uses,
captures many calls back to back in one graph, so the overlap shows there as in a model, where
the decodes of successive layers follow one another with other kernels between them.

Timed per pattern (MHA, batch 1, 64 heads, head dim 128, N = 16384, one token at N - 1, CUDA-graph
replay, medians of paired rounds):
- `one layer`: the decode of one cache, repeated (the kernel table's measurement);
- `stack`: one decode of each of `--layers` caches in turn (their caches together exceed the
  L2 for the larger patterns: nearer a model's cold cache), time per layer;
- `stack + torch producer`: as `stack`, with a torch copy writing each layer's query just
  before its decode (the projection of a model; a plain launch);
- `stack + PDL producer`: the same with a Triton copy kernel that takes part in PDL;
each without and with PDL, against the HBM floor (compact K+V bytes at the copy bandwidth measured
in the same run). A chain of one-element Triton kernels, with and without PDL, gives the floor
of a launch. Each PDL output is compared with the plain one (bitwise) first.

    python benchmarks/probe_decode_pdl.py --layers 30
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels import copy_bandwidth, load_pattern, paired_ms  # noqa: E402

from sas.runtime import SASAttnKernel  # noqa: E402


@triton.jit
def _one(X, PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    tl.store(X, tl.load(X) + 1)


@triton.jit
def _copy(X, Y, n, BLOCK: tl.constexpr):
    # a producer that takes part in PDL: waits for the kernel before, lets the next one launch
    tl.extra.cuda.gdc_wait()
    tl.extra.cuda.gdc_launch_dependents()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < n), mask=offs < n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--length", type=int, default=16384)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--patterns", default="strided_block_local,block_local,openai_fixed,streaming_llm,sliding_window")
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    dev = torch.device("cuda")
    N, B, H, D, L = args.length, args.batch, args.heads, args.head_dim, args.layers
    Hkv = args.kv_heads or H
    dtype = torch.bfloat16
    bw = copy_bandwidth(dev)
    print(f"# `python benchmarks/probe_decode_pdl.py --layers {L}` ({torch.cuda.get_device_name(dev)}, "
          f"torch {torch.__version__}, triton {triton.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}); "
          f"B={B} Hq={H} Hkv={Hkv} D={D} N={N}; copy bandwidth {bw / 1e12:.2f} TB/s\n")

    x = torch.zeros(1, device=dev, dtype=torch.int32)
    chain = paired_ms([lambda p=p: [_one[(1,)](x, PDL=p, launch_pdl=p) for _ in range(L)] for p in (False, True)],
                      True, args.rep, args.rounds)
    print(f"one-element kernel, {L} in a chain, us each: plain {chain[0] / L * 1e3:.2f}, PDL {chain[1] / L * 1e3:.2f}\n")

    g = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for name in args.patterns.split(","):
        base = SASAttnKernel(load_pattern(name), max_len=N)
        C = base.cache_size
        group = H // Hkv
        opts = base.plan.decode_config(group)
        base = SASAttnKernel(load_pattern(name), max_len=N, decode_options=dataclasses.replace(opts, pdl=False))
        pk = SASAttnKernel(load_pattern(name), max_len=N, decode_options=dataclasses.replace(opts, pdl=True))
        k = torch.randn(B, Hkv, N, D, device=dev, dtype=dtype, generator=g)
        v = torch.randn_like(k)
        kc, vc = base.new_cache(B, Hkv, D, dtype, dev)
        base.fill_cache(k[:, :, :N - 1], v[:, :, :N - 1], kc, vc)
        del k, v
        layers = []
        for _ in range(L):
            layers.append(dict(
                q=torch.randn(B, H, 1, D, device=dev, dtype=dtype, generator=g),
                qsrc=torch.randn(B, H, 1, D, device=dev, dtype=dtype, generator=g),
                kd=torch.randn(B, Hkv, 1, D, device=dev, dtype=dtype, generator=g),
                vd=torch.randn(B, Hkv, 1, D, device=dev, dtype=dtype, generator=g),
                kc=kc.clone(), vc=vc.clone(), out=torch.empty(B, H, 1, D, device=dev, dtype=dtype)))
        del kc, vc

        def one(kern, a=layers[0]):
            kern.runtime.decode(a["q"], a["kd"], a["vd"], a["kc"], a["vc"], N - 1, out=a["out"])

        def stack(kern, producer=False):
            for a in layers:
                if producer == "pdl":
                    _copy[(triton.cdiv(a["q"].numel(), 1024),)](a["qsrc"], a["q"], a["q"].numel(), 1024,
                                                                 launch_pdl=True)
                elif producer:
                    a["q"].copy_(a["qsrc"])
                kern.runtime.decode(a["q"], a["kd"], a["vd"], a["kc"], a["vc"], N - 1, out=a["out"])

        same = True
        for producer in (True, "pdl"):
            stack(base, producer)
            ref = [a["out"].clone() for a in layers]
            for a in layers:
                a["out"].zero_()
            stack(pk, producer)
            torch.cuda.synchronize()
            same = same and all(torch.equal(r, a["out"]) for r, a in zip(ref, layers))
        fns = [f for kern in (base, pk) for f in (lambda kern=kern: one(kern), lambda kern=kern: stack(kern),
                                                  lambda kern=kern: stack(kern, True),
                                                  lambda kern=kern: stack(kern, "pdl"))]
        t = paired_ms(fns, True, args.rep, args.rounds)
        us = [x * 1e3 / (1 if i % 4 == 0 else L) for i, x in enumerate(t)]   # plain: us[0:4], PDL: us[4:8]
        floor = 2 * C * B * Hkv * D * 2 / bw * 1e6
        rows.append((name, C, floor, us, same))
        print(f"{name}: {C} slots, floor {floor:.2f} us, plain " + ", ".join(f"{u:.2f}" for u in us[:4])
              + ", PDL " + ", ".join(f"{u:.2f}" for u in us[4:]) + f", same={same}", flush=True)
        layers.clear()

    print("\nus per decode (CUDA-graph replay), plain / PDL; the PDL time over the HBM floor:\n")
    print("| pattern | slots | floor us | one layer | stack | stack + torch producer | stack + PDL producer "
          "| PDL / floor (one layer, stack, torch producer, PDL producer) | PDL output bitwise equal |")
    print("|---|---:|---:|---|---|---|---|---|---|")
    for name, C, floor, us, same in rows:
        cells = " | ".join(f"{us[i]:.2f} / {us[4 + i]:.2f}" for i in range(4))
        print(f"| {name} | {C} | {floor:.2f} | {cells} | " + ", ".join(f"{us[4 + i] / floor:.2f}" for i in range(4))
              + f" | {same} |")
    print(f"\none-element kernel in a chain of {L}: plain {chain[0] / L * 1e3:.2f} us, PDL {chain[1] / L * 1e3:.2f} us")

if __name__ == "__main__":
    main()
