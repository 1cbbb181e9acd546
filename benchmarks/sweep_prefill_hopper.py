"""Which Hopper features pay in the block-sparse prefill loop? (issue 11, item 3)

A sweep over variants of sas's prefill kernel on the fully causal pattern, timed against SDPA's
causal kernel and sas's current prefill in the same run. The variants keep sas's structure (CSR
lists of full and partial tiles per query block, heaviest block first) and change one thing at a
time:

- `ptr`: pointer loads, as templates/triton/prefill.py.jinja (K read transposed);
- `desc`: TMA tensor descriptors (`triton.tools.tensor_descriptor.TensorDescriptor`) for Q, K, V
  and the output; out-of-range rows come back as zeros;
- `fma`: the scale folded into one multiply-add (`qk * scale - m`) with the row max taken before
  scaling, instead of scaling the whole tile first;
- `ws`: `tl.range(..., warp_specialize=True)` over the full tiles;
- tile sizes, warps and pipeline stages.

Every variant's output is checked against SDPA first (a variant that fails to compile or
disagrees is listed as such). Timings are medians of `triton.testing.do_bench`.

    python benchmarks/sweep_prefill_hopper.py --lengths 8192,16384
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
from bench_kernels import checked_ms  # noqa: E402

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # older Triton
    TensorDescriptor = None


@triton.jit
def _exp2_poly(x):
    # 2^x on the FMA pipes (Cody-Waite split + degree-3 polynomial, ~1e-4 relative error), to
    # take part of the exponentials off the MUFU unit.
    x = tl.maximum(x, -126.0)
    xi = tl.floor(x)
    f = x - xi
    p = 1.0 + f * (0.6951786 + f * (0.2261587 + f * 0.0780236))
    return (p.to(tl.int32, bitcast=True) + (xi.to(tl.int32) << 23)).to(tl.float32, bitcast=True)


@triton.jit
def _exp2_mixed(x, POLY: tl.constexpr):
    if POLY == 0:
        return tl.math.exp2(x)
    elif POLY == 2:
        return _exp2_poly(x)
    else:
        a, b = tl.split(tl.reshape(x, [x.shape[0], x.shape[1] // 2, 2]))
        return tl.reshape(tl.join(tl.math.exp2(a), _exp2_poly(b)), [x.shape[0], x.shape[1]])


@triton.jit
def _step(q, k, v, m_i, l_i, acc, qk_scale, keep, MASKED: tl.constexpr, FMA: tl.constexpr,
          KT: tl.constexpr, POLY: tl.constexpr = 0):
    if KT:
        qk = tl.dot(q, k)
    else:
        qk = tl.dot(q, k.T)
    if MASKED:
        qk = tl.where(keep, qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(qk - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
    elif FMA:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = _exp2_mixed(qk * qk_scale - m_new[:, None], POLY)
        alpha = tl.math.exp2(m_i - m_new)
    else:
        qk = qk * qk_scale
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return m_new, l_i, acc


@triton.jit
def _fwd_ptr(Q, K, V, Out, FullPtr, FullCols, PartPtr, PartCols, Order, H, HKV, N, qk_scale,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             FMA: tl.constexpr, WS: tl.constexpr):
    blk = tl.load(Order + tl.program_id(0))
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // (H // HKV)
    offs_m = blk * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    qbase = (bh.to(tl.int64) * N) * HEAD_DIM
    kbase = ((b * HKV + hk).to(tl.int64) * N) * HEAD_DIM
    q = tl.load(Q + qbase + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=offs_m[:, None] < N, other=0.0)
    k_ptrs = K + kbase + offs_n[None, :] * HEAD_DIM + offs_d[:, None]
    v_ptrs = V + kbase + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    lo = tl.load(FullPtr + blk)
    hi = tl.load(FullPtr + blk + 1)
    for t in tl.range(lo, hi, warp_specialize=WS):
        start_n = tl.load(FullCols + t).to(tl.int64) * BLOCK_N
        k = tl.load(k_ptrs + start_n * HEAD_DIM)
        v = tl.load(v_ptrs + start_n * HEAD_DIM)
        m_i, l_i, acc = _step(q, k, v, m_i, l_i, acc, qk_scale, 0, False, FMA, True)
    lo = tl.load(PartPtr + blk)
    hi = tl.load(PartPtr + blk + 1)
    qi = offs_m[:, None]
    for t in range(lo, hi):
        start_n = tl.load(PartCols + t) * BLOCK_N
        kj = (start_n + offs_n)[None, :]
        k = tl.load(k_ptrs + start_n.to(tl.int64) * HEAD_DIM)
        v = tl.load(v_ptrs + start_n.to(tl.int64) * HEAD_DIM)
        m_i, l_i, acc = _step(q, k, v, m_i, l_i, acc, qk_scale, qi >= kj, True, FMA, True)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    tl.store(Out + qbase + offs_m[:, None] * HEAD_DIM + offs_d[None, :], (acc / l_safe[:, None]).to(Out.dtype.element_ty),
             mask=offs_m[:, None] < N)


@triton.jit
def _fwd_desc(desc_q, desc_k, desc_v, desc_o, FullPtr, FullCols, PartPtr, PartCols, Order, H, HKV, N, qk_scale,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              FMA: tl.constexpr, WS: tl.constexpr, POLY: tl.constexpr, PERSIST: tl.constexpr, NBLK,
              RANK4: tl.constexpr = False, TWEAK: tl.constexpr = 0, Out=None, stride_om=0):
    if PERSIST:
        # one program per SM slot walks the (query block, head) items, heaviest blocks first
        for w in range(tl.program_id(0), NBLK * H, tl.num_programs(0)):
            _desc_item(desc_q, desc_k, desc_v, desc_o, FullPtr, FullCols, PartPtr, PartCols, Order,
                       w // H, w % H, H, HKV, N, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, FMA, WS, POLY, RANK4)
    else:
        _desc_item(desc_q, desc_k, desc_v, desc_o, FullPtr, FullCols, PartPtr, PartCols, Order,
                   tl.program_id(0), tl.program_id(1), H, HKV, N, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, FMA, WS, POLY,
                   RANK4, TWEAK, Out, stride_om)


@triton.jit
def _kv_desc(desc_k, desc_v, b, hk, k_row, start_n, RANK4: tl.constexpr, BLOCK_N: tl.constexpr,
             HEAD_DIM: tl.constexpr):
    # the K and V tiles at key start_n of KV head (b, hk): 4-D descriptors, or 2-D over the rows
    if RANK4:
        k = desc_k.load([b, hk, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        v = desc_v.load([b, hk, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
    else:
        k = desc_k.load([k_row + start_n, 0])
        v = desc_v.load([k_row + start_n, 0])
    return k, v


@triton.jit
def _desc_item(desc_q, desc_k, desc_v, desc_o, FullPtr, FullCols, PartPtr, PartCols, Order, item, bh,
               H, HKV, N, qk_scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               FMA: tl.constexpr, WS: tl.constexpr, POLY: tl.constexpr, RANK4: tl.constexpr,
               TWEAK: tl.constexpr = 0, Out=None, stride_om=0):
    # TWEAK bits, to find what the template does differently: 1 int64 row arithmetic, 2 the
    # dot's input_precision="tf32", 4 a masked pointer store, 8 V loaded after the softmax
    blk = tl.load(Order + item)
    b = bh // H
    h = bh % H
    hk = h // (H // HKV)
    q_row = bh * N + blk * BLOCK_M
    k_row = (b * HKV + hk) * N
    if RANK4:
        q = desc_q.load([b, h, blk * BLOCK_M, 0]).reshape(BLOCK_M, HEAD_DIM)
    else:
        q = desc_q.load([q_row, 0])
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    lo = tl.load(FullPtr + blk)
    hi = tl.load(FullPtr + blk + 1)
    for t in tl.range(lo, hi, warp_specialize=WS):
        if TWEAK != 0:
            if TWEAK & 1:
                sn = tl.load(FullCols + t).to(tl.int64) * BLOCK_N
                krow = ((b.to(tl.int64) * HKV + hk) * N + sn).to(tl.int32)
            else:
                krow = k_row + tl.load(FullCols + t) * BLOCK_N
            k = desc_k.load([krow, 0]).T
            if TWEAK & 2:
                qk = tl.dot(q, k, input_precision="tf32")
            else:
                qk = tl.dot(q, k)
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.math.exp2(qk * qk_scale - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            v = desc_v.load([krow, 0])
            if TWEAK & 2:
                acc = tl.dot(p.to(v.dtype), v, acc, input_precision="tf32")
            else:
                acc = tl.dot(p.to(v.dtype), v, acc)
            m_i = m_new
        else:
            start_n = tl.load(FullCols + t) * BLOCK_N
            k, v = _kv_desc(desc_k, desc_v, b, hk, k_row, start_n, RANK4, BLOCK_N, HEAD_DIM)
            m_i, l_i, acc = _step(q, k, v, m_i, l_i, acc, qk_scale, 0, False, FMA, False, POLY)
    lo = tl.load(PartPtr + blk)
    hi = tl.load(PartPtr + blk + 1)
    qi = (blk * BLOCK_M + tl.arange(0, BLOCK_M))[:, None]
    for t in range(lo, hi):
        start_n = tl.load(PartCols + t) * BLOCK_N
        kj = (start_n + tl.arange(0, BLOCK_N))[None, :]
        k, v = _kv_desc(desc_k, desc_v, b, hk, k_row, start_n, RANK4, BLOCK_N, HEAD_DIM)
        m_i, l_i, acc = _step(q, k, v, m_i, l_i, acc, qk_scale, qi >= kj, True, FMA, False)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    if TWEAK & 4:
        offs_m = blk * BLOCK_M + tl.arange(0, BLOCK_M)
        o_ptrs = Out + bh.to(tl.int64) * N * stride_om + offs_m[:, None] * stride_om + tl.arange(0, HEAD_DIM)[None, :]
        tl.store(o_ptrs, (acc / l_safe[:, None]).to(Out.dtype.element_ty), mask=offs_m[:, None] < N)
    else:
        desc_o.store([q_row, 0], (acc / l_safe[:, None]).to(q.dtype))


def causal_tiles(n: int, bm: int, bn: int, device):
    """CSR lists of the fully causal pattern: full tiles left of the diagonal band, partial on it."""
    nqb = -(-n // bm)
    fp, fc, pp, pc, work = [0], [], [0], [], []
    for i in range(nqb):
        r0, r1 = i * bm, min(n, (i + 1) * bm) - 1
        full = [j for j in range(-(-n // bn)) if (j + 1) * bn - 1 <= r0]
        part = [j for j in range(-(-n // bn)) if j * bn <= r1 and (j + 1) * bn - 1 > r0]
        fc += full
        pc += part
        fp.append(len(fc))
        pp.append(len(pc))
        work.append(len(full) + len(part))
    order = sorted(range(nqb), key=lambda i: -work[i])
    t = lambda x: torch.tensor(x, dtype=torch.int32, device=device)  # noqa: E731
    return t(fp), t(fc), t(pp), t(pc), t(order)


def run_variant(kind, q, k, v, cfg, fma, ws, poly=0, persist=0, tweak=0):
    rank4 = kind == "desc4"
    bm, bn, warps, stages = cfg
    B, H, N, D = q.shape
    Hkv = k.shape[1]
    tiles = causal_tiles(N, bm, bn, q.device)
    out = torch.empty_like(q)
    nblk = tiles[4].numel()
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 4
    grid = (persist * sms, 1) if persist else (nblk, B * H)
    scale = D ** -0.5 * 1.4426950408889634
    if kind == "ptr":
        def call():
            _fwd_ptr[grid](q, k, v, out, *tiles, H, Hkv, N, scale, HEAD_DIM=D, BLOCK_M=bm, BLOCK_N=bn,
                           FMA=fma, WS=ws, num_warps=warps, num_stages=stages)
    else:
        if rank4:
            dq = TensorDescriptor.from_tensor(q, [1, 1, bm, D])
            dk = TensorDescriptor.from_tensor(k, [1, 1, bn, D])
            dv = TensorDescriptor.from_tensor(v, [1, 1, bn, D])
        else:
            dq = TensorDescriptor.from_tensor(q.view(-1, D), [bm, D])
            dk = TensorDescriptor.from_tensor(k.view(-1, D), [bn, D])
            dv = TensorDescriptor.from_tensor(v.view(-1, D), [bn, D])
        do = TensorDescriptor.from_tensor(out.view(-1, D), [bm, D])

        def call():
            _fwd_desc[grid](dq, dk, dv, do, *tiles, H, Hkv, N, scale, HEAD_DIM=D, BLOCK_M=bm, BLOCK_N=bn,
                            FMA=fma, WS=ws, POLY=poly, PERSIST=bool(persist), NBLK=nblk, RANK4=rank4,
                            TWEAK=tweak, Out=out, stride_om=out.stride(2),
                            num_warps=warps, num_stages=stages)
    return call, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="16384")
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--rep", type=int, default=200, help="do_bench rep (ms)")
    ap.add_argument("--configs", default="128,128,8,2;128,128,8,3;128,64,4,3;128,64,8,3;128,64,4,4;128,128,8,4")
    ap.add_argument("--kinds", default="ptr,desc")
    ap.add_argument("--tweaks", default="", help="desc TWEAK bit sets to time, e.g. '1,2,4,8,15'")
    ap.add_argument("--extras", default="", help="desc extras 'poly,persist;...' e.g. '1,0;2,0;0,1'")
    args = ap.parse_args()
    import triton.testing as tt

    from sas import Causal
    from sas.runtime import SASAttnKernel

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    print(f"# {props.name}, torch {torch.__version__}, triton {triton.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    cfgs = [tuple(map(int, c.split(","))) for c in args.configs.split(";")]
    H, D = args.heads, args.head_dim
    table = []
    for N in map(int, args.lengths.split(",")):
        g = torch.Generator(device=dev).manual_seed(0)
        q, k, v = (torch.randn(1, H, N, D, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        bench = lambda f: float(tt.do_bench(f, warmup=50, rep=args.rep, return_mode="median"))  # noqa: E731
        sdpa = bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
        kern = SASAttnKernel(Causal(), max_len=N)
        sas_ms = bench(lambda: kern(q, k, v))
        from sas.codegen.triton_backend import PrefillOptions

        for cfg in cfgs:
            mod = kern.runtime.prefill_module(PrefillOptions(*cfg))
            tiles = mod.build_tiles(N, N, block_m=cfg[0], block_n=cfg[1], device=dev)
            direct = {}
            for tma in (True, False):
                try:
                    direct[tma] = "%.3f ms" % bench(lambda: mod.prefill(
                        q, k, v, *tiles, block_m=cfg[0], block_n=cfg[1], num_warps=cfg[2], num_stages=cfg[3],
                        use_tma=tma))
                except Exception as e:  # noqa: BLE001
                    direct[tma] = f"failed ({type(e).__name__})"
            print(f"  sas module {cfg}: TMA {direct[True]}, pointers {direct[False]}", flush=True)
        flops = 4 * N * N * D * H / 2
        print(f"N={N}: SDPA {sdpa:.3f} ms ({flops / sdpa / 1e9:.0f} TFLOP/s), sas now {sas_ms:.3f} ms "
              f"({sas_ms / sdpa:.3f}x SDPA)", flush=True)
        variants = [(kind, cfg, fma, ws, 0, 0) for kind, cfg, fma, ws in
                    itertools.product(args.kinds.split(","), cfgs, (False, True), (False, True))]
        variants = [v + (0,) for v in variants]
        variants += [("desc", cfg, True, False, *map(int, e.split(",")), 0) for cfg in cfgs
                     for e in filter(None, args.extras.split(";"))]
        variants += [("desc", cfg, True, False, 0, 0, int(t)) for cfg in cfgs for t in filter(None, args.tweaks.split(","))]
        for kind, cfg, fma, ws, poly, persist, tweak in variants:
            if kind.startswith("desc") and TensorDescriptor is None:
                continue
            name = f"{kind} {cfg} fma={int(fma)} ws={int(ws)}" + (f" poly={poly} persist={persist}" if poly or persist else "") \
                + (f" tweak={tweak}" if tweak else "")
            got = checked_ms(name, lambda: run_variant(kind, q, k, v, cfg, fma, ws, poly, persist, tweak), ref,
                             bench)
            if got is None:
                continue
            ms, err = got
            table.append((N, name, ms, ms / sdpa))
            print(f"  {name}: {ms:.3f} ms = {ms / sdpa:.3f}x SDPA (err {err:.1e})", flush=True)
    print("\n| N | variant | ms | x SDPA |\n|---|---|---|---|")
    for N, name, ms, r in sorted(table, key=lambda x: (x[0], x[2])):
        print(f"| {N} | {name} | {ms:.3f} | {r:.3f} |")


if __name__ == "__main__":
    main()
