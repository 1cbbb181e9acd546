"""Saap decode kernel (a plain `@triton.jit` module: nothing in it depends on the pattern, the
sink and window arrive as key ranges at run time). Host side: `sas.methods.saap_runtime`.

One launch, grid (B * Hkv, NR + P): the first NR = N_SP + N_WP + N_PP programs each run one
key-position range (the sink [0, SINK_HI), CHUNK-sized pieces of the window [W_LO, W_HI), and,
filtered, pieces of [P_LO, P_HI): the keys that left the window since the CSR index was last
rebuilt, kept only when their bucket is probed; all scalars, so a step is graph-capturable); the last P programs each run one probed bucket through the CSR index
(`idx[off[c]:off[c+1]]`, gathered rows: K and V are not reordered). The G query heads of a KV
head are the rows of one program. Each program writes its unnormalised output and log2-domain
row statistics (m, l) into row s of partial buffers of S_CAP >= S rows per (batch, KV head)
(allocated once, reused across steps); the NR + P partials are then merged (log-sum-exp) into
the output in its dtype, either by a second launch (`sas.methods.partials_triton.merge_partials_kernel`,
FUSE_MERGE=False) or,
with FUSE_MERGE=True, by the last program of the (batch, KV head) to arrive: each program bumps
a per-(batch, KV head) arrival counter (acq_rel atomic after a CTA barrier, as the route kernel
does); the program that sees the count reach S merges the row's partials (the same
`merge_partials` code, the same order: results bit-identical to the two-launch path) and resets
the counter to 0 for the next step.
"""

from __future__ import annotations

import triton
import triton.language as tl

from sas.methods.partials_triton import merge_partials


@triton.jit
def saap_decode_kernel(Q, K, V, BUCKET_OF, PROBED_MASK, OFF, IDX, PROBED,
                       O_PART, M_PART, L_PART, OUT, COUNTER,
                       N_CAP, C, P, G, D, qk_scale_log2,
                       SINK_HI, W_LO, W_HI, P_LO, P_HI, N_SP, N_WP, N_PP, CHUNK, SPLIT, S_CAP,
                       BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                       DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, FUSE_MERGE: tl.constexpr):
    bh = tl.program_id(0)
    s = tl.program_id(1)
    NR = N_SP + N_WP + N_PP
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
    in_w = ((s >= N_SP) & (s < N_SP + N_WP)).to(tl.int32)
    in_p = ((s >= N_SP + N_WP) & (s < NR)).to(tl.int32)
    in_s = (s < N_SP).to(tl.int32)
    w_lo = W_LO + (s - N_SP) * CHUNK
    p_lo = P_LO + (s - N_SP - N_WP) * CHUNK
    rng_lo = in_w * w_lo + in_p * p_lo
    rng_hi = in_s * SINK_HI + in_w * tl.minimum(w_lo + CHUNK, W_HI) + in_p * tl.minimum(p_lo + CHUNK, P_HI)
    filt = in_p
    bp = tl.maximum(s - NR, 0)                 # bucket program: piece bp % SPLIT of probe bp // SPLIT
    c = tl.load(PROBED + bh * P + tl.minimum(bp // SPLIT, P - 1))
    c_lo = tl.load(OFF + bh * (C + 1) + c)
    c_hi = tl.load(OFF + bh * (C + 1) + c + 1)
    piece = (c_hi - c_lo + SPLIT - 1) // SPLIT
    b_lo = tl.minimum(c_lo + (bp % SPLIT) * piece, c_hi)
    b_hi = tl.minimum(b_lo + piece, c_hi)
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
    part = (bh * S_CAP + s) * BLOCK_G
    tl.store(O_PART + (part + rows[:, None]) * BLOCK_D + dims[None, :], acc)
    tl.store(M_PART + part + rows, m_i)
    tl.store(L_PART + part + rows, l_i)
    if FUSE_MERGE:
        # the last program of the (batch, KV head) to arrive merges the row's partials
        S = tl.num_programs(1)
        tl.debug_barrier()
        arrived = tl.atomic_add(COUNTER + bh, 1, sem="acq_rel", scope="gpu")
        if arrived == S - 1:
            tl.atomic_xchg(COUNTER + bh, 0, sem="relaxed", scope="gpu")
            merge_partials(O_PART, M_PART, L_PART, OUT, bh, S, S_CAP, G, D, BLOCK_G, BLOCK_D, True)
