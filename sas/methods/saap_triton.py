"""Saap decode kernel (a plain `@triton.jit` module: nothing in it depends on the pattern, the
sink and window arrive as key ranges at run time). Host side: `sas.methods.saap_runtime`.

One launch, grid (B * Hkv, NR + P): the first NR programs each run one key-position range
`[lo, hi)` (the sink, chunks of the recent window, and, `filtered`, chunks of the keys that left
the window since the CSR index was last rebuilt: those are kept only when their bucket is
probed); the last P programs each run one probed bucket through the CSR index
(`idx[off[c]:off[c+1]]`, gathered rows: K and V are not reordered). The G query heads of a KV
head are the rows of one program. Each program writes its unnormalised output and log2-domain
row statistics (m, l); `combine` merges the NR + P partials (log-sum-exp) in torch.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def saap_decode_kernel(Q, K, V, RANGES, BUCKET_OF, PROBED_MASK, OFF, IDX, PROBED,
                       O_PART, M_PART, L_PART,
                       N_CAP, C, NR, P, G, D, qk_scale_log2,
                       BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                       DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    bh = tl.program_id(0)
    s = tl.program_id(1)
    S = NR + P
    rows = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < G
    dim_ok = dims < D
    q = tl.load(Q + (bh * G + rows[:, None]) * D + dims[None, :], mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    if UPCAST:  # Triton's CPU interpreter has no bf16 arithmetic: compute in fp32 there
        q = q.to(tl.float32)
    kv_base = bh.to(tl.int64) * N_CAP * D
    # scalar flags as int32 (0/1), broadcast into vector masks below
    is_b = (s >= NR).to(tl.int32)
    r = tl.maximum(tl.minimum(s, NR - 1), 0)
    rng_lo = tl.load(RANGES + r * 3 + 0)
    rng_hi = tl.load(RANGES + r * 3 + 1)
    filt = tl.load(RANGES + r * 3 + 2) * (1 - is_b)
    c = tl.load(PROBED + bh * P + tl.minimum(tl.maximum(s - NR, 0), P - 1))
    b_lo = tl.load(OFF + bh * (C + 1) + c)
    b_hi = tl.load(OFF + bh * (C + 1) + c + 1)
    lo = b_lo * is_b + rng_lo * (1 - is_b)
    hi = b_hi * is_b + rng_hi * (1 - is_b)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        inb = offs < hi
        bucket_rows = (offs * 0 + is_b) != 0
        filt_rows = (offs * 0 + filt) != 0
        gathered = tl.load(IDX + bh.to(tl.int64) * N_CAP + offs, mask=inb & bucket_rows, other=0)
        pos = tl.where(bucket_rows, gathered, offs)
        bkt = tl.load(BUCKET_OF + bh.to(tl.int64) * N_CAP + pos, mask=inb & filt_rows, other=0)
        hit = tl.load(PROBED_MASK + bh * C + bkt, mask=inb & filt_rows, other=1)
        keep = inb & (hit != 0)
        k = tl.load(K + kv_base + pos[:, None].to(tl.int64) * D + dims[None, :],
                    mask=keep[:, None] & dim_ok[None, :], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        sc = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale_log2
        sc = tl.where(keep[None, :], sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(sc - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + kv_base + pos[:, None].to(tl.int64) * D + dims[None, :],
                    mask=keep[:, None] & dim_ok[None, :], other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    part = (bh * S + s) * BLOCK_G
    tl.store(O_PART + (part + rows[:, None]) * BLOCK_D + dims[None, :], acc)
    tl.store(M_PART + part + rows, m_i)
    tl.store(L_PART + part + rows, l_i)
