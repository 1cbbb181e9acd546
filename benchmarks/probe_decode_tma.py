"""How close to the HBM floor can a split-K decode over a small, fully attended cache get, and
do TMA (tensor-descriptor) loads of K and V bring it closer? (issue 11, item 4)

A stripped decode step (every slot attended: no mask, no pattern, no new token) over a compact
cache of C slots, [B, Hkv, C, D] bf16, with each variant's output checked against dense SDPA:

- `ptr`: K and V read by pointer loads, as the sas decode templates do (a slot mask only at the
  cache's end);
- `tma`: K and V read through 3-D tensor descriptors ([B * Hkv, C, D], blocks [1, BLOCK_N, D]:
  rows past the cache come back as zeros), pipelined by `tl.range(num_stages=)`.

Splits write (m, l, acc) partials merged by a second kernel; one split writes the output. Timed
by CUDA-graph replay against the HBM floor (K + V bytes over the copy bandwidth measured in the
same run) and dense SDPA over the same compact cache (`enable_gqa`).

    python benchmarks/probe_decode_tma.py [--cases "GQA@16:384,1056,2272;MHA@1:384,1024"] [--out PATH]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels import checked_ms, copy_bandwidth, median_ms  # noqa: E402


@triton.jit
def _split(Q, K, V, MP, LP, AP, Out, kd, vd, C, scale,
           HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BN: tl.constexpr,
           SPLIT: tl.constexpr, NS: tl.constexpr, TMA: tl.constexpr, STAGES: tl.constexpr):
    split = tl.program_id(0)
    bh = tl.program_id(1)
    offs_g = tl.arange(0, GP)
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BN)
    g_ok = offs_g < G
    rows = bh * G + offs_g                        # query rows [B * Hq] of this KV head
    q = tl.load(Q + rows[:, None] * D + offs_d[None, :], mask=g_ok[:, None], other=0.0)
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    s_lo = split * SPLIT
    s_hi = tl.minimum(s_lo + SPLIT, C)
    base = bh.to(tl.int64) * C * D
    for s0 in tl.range(s_lo, s_hi, BN, num_stages=STAGES):
        slot = s0 + offs_n
        ok = slot < s_hi
        if TMA:
            k = kd.load([bh, s0, 0]).reshape(BN, D)
            v = vd.load([bh, s0, 0]).reshape(BN, D)
        else:
            k = tl.load(K + base + slot[:, None] * D + offs_d[None, :], mask=ok[:, None], other=0.0)
            v = tl.load(V + base + slot[:, None] * D + offs_d[None, :], mask=ok[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k)) * scale
        qk = tl.where(ok[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    if NS == 1:
        tl.store(Out + rows[:, None] * D + offs_d[None, :], (acc / l_i[:, None]).to(Out.dtype.element_ty),
                 mask=g_ok[:, None])
    else:
        tl.store(MP + rows * NS + split, m_i, mask=g_ok)
        tl.store(LP + rows * NS + split, l_i, mask=g_ok)
        tl.store(AP + (rows * NS + split)[:, None] * D + offs_d[None, :], acc, mask=g_ok[:, None])


@triton.jit
def _combine(MP, LP, AP, Out, D: tl.constexpr, NS: tl.constexpr, SP: tl.constexpr):
    row = tl.program_id(0)
    offs_s = tl.arange(0, SP)
    offs_d = tl.arange(0, D)
    s_ok = offs_s < NS
    m = tl.load(MP + row * NS + offs_s, mask=s_ok, other=float("-inf"))
    lv = tl.load(LP + row * NS + offs_s, mask=s_ok, other=0.0)
    a = tl.load(AP + (row * NS + offs_s)[:, None] * D + offs_d[None, :], mask=s_ok[:, None], other=0.0)
    mx = tl.max(m, 0)
    w = tl.where(s_ok, tl.math.exp2(m - mx), 0.0)
    o = tl.sum(a * w[:, None], 0) / tl.sum(lv * w, 0)
    tl.store(Out + row * D + offs_d, o.to(Out.dtype.element_ty))


def split_shape(C: int, splits: int, bn: int) -> tuple[int, int]:
    """(slots a split, splits) for about `splits` splits of C slots in whole bn-slot blocks."""
    split = -(-C // splits)
    split = -(-split // bn) * bn
    return split, -(-C // split)


def make_step(q, kc, vc, out, splits: int, bn: int, warps: int, stages: int, tma: bool):
    B, Hq, _, D = q.shape
    _, Hkv, C, _ = kc.shape
    G = Hq // Hkv
    GP = max(16, triton.next_power_of_2(G))
    split, ns = split_shape(C, splits, bn)
    rows = B * Hq
    mp = torch.empty(rows * ns, device=q.device, dtype=torch.float32)
    lp = torch.empty_like(mp)
    ap = torch.empty(rows * ns * D, device=q.device, dtype=torch.float32)
    kd = vd = None
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor
        kd = TensorDescriptor.from_tensor(kc.view(B * Hkv, C, D), [1, bn, D])
        vd = TensorDescriptor.from_tensor(vc.view(B * Hkv, C, D), [1, bn, D])
    scale = D ** -0.5 * 1.4426950408889634
    qf = q.view(rows, D)
    of = out.view(rows, D)

    def step():
        _split[(ns, B * Hkv)](qf, kc, vc, mp, lp, ap, of, kd, vd, C, scale, HKV=Hkv, G=G, GP=GP, D=D, BN=bn,
                              SPLIT=split, NS=ns, TMA=tma, STAGES=stages, num_warps=warps, num_stages=stages)
        if ns > 1:
            _combine[(rows,)](mp, lp, ap, of, D=D, NS=ns, SP=max(2, triton.next_power_of_2(ns)), num_warps=4)
    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="GQA@16:384,1056,2272;MHA@1:384,1024,2272")
    ap.add_argument("--splits", default="1,2,3,4,6,8")
    ap.add_argument("--configs", default="64,4,2;64,4,3;64,4,4;128,8,2;128,4,3;32,4,4",
                    help="block_n,num_warps,num_stages;...")
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("probe_decode_tma.py needs an NVIDIA GPU (tensor descriptors: compute capability 9+)")
    dev = torch.device("cuda")
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))
    bw = copy_bandwidth(dev)
    lines = [f"# {torch.cuda.get_device_name(dev)}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"triton {triton.__version__}; copy bandwidth {bw / 1e12:.2f} TB/s; D=128 bf16, CUDA-graph medians"]
    print(lines[0], flush=True)
    summary = ["", "| case | slots | floor us | SDPA us | best ptr (variant) | best tma (variant) | ptr / floor | "
               "tma / floor |", "|---|---:|---:|---:|---|---|---:|---:|"]
    g = torch.Generator(device=dev).manual_seed(0)
    for case in args.cases.split(";"):
        kind, sizes = case.split(":")
        name, batch = kind.split("@")
        B = int(batch)
        Hq, Hkv = (32, 8) if name == "GQA" else (64, 64)
        D = 128
        for C in map(int, sizes.split(",")):
            q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16, generator=g)
            kc = torch.randn(B, Hkv, C, D, device=dev, dtype=torch.bfloat16, generator=g)
            vc = torch.randn(B, Hkv, C, D, device=dev, dtype=torch.bfloat16, generator=g)
            ref = torch.nn.functional.scaled_dot_product_attention(q, kc, vc, enable_gqa=True).float()
            floor = 2 * B * Hkv * C * D * 2 / bw * 1e6
            sd = median_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, kc, vc, enable_gqa=True),
                           True, args.rep) * 1e3
            best = {False: (float("inf"), ""), True: (float("inf"), "")}
            for cfg, sp, tma in itertools.product(args.configs.split(";"), map(int, args.splits.split(",")),
                                                  (False, True)):
                bn, w, st = map(int, cfg.split(","))
                out = torch.empty_like(q)
                got = checked_ms(f"{name} C={C} {cfg} s={sp} tma={tma}",
                                 lambda: (make_step(q, kc, vc, out, sp, bn, w, st, tma), out), ref,
                                 lambda f: median_ms(f, True, args.rep))
                if got is None:
                    continue
                us = got[0] * 1e3
                label = f"bn{bn} w{w} st{st} splits {split_shape(C, sp, bn)[1]}"
                lines.append(f"{name}@{B} C={C} {'tma' if tma else 'ptr'} {label}: {us:.2f} us ({us / floor:.2f}x)")
                print(lines[-1], flush=True)
                if us < best[tma][0]:
                    best[tma] = (us, label)
            summary.append(f"| {name} b{B} | {C} | {floor:.2f} | {sd:.2f} | {best[False][0]:.2f} ({best[False][1]}) | "
                           f"{best[True][0]:.2f} ({best[True][1]}) | {best[False][0] / floor:.2f} | "
                           f"{best[True][0] / floor:.2f} |")
            q = kc = vc = None  # free this cache before the next
    print("\n".join(summary))
    if args.out:
        Path(args.out).write_text("\n".join(lines + summary) + "\n")


if __name__ == "__main__":
    main()
