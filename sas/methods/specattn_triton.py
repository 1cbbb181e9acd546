"""SpecAttn verification attention (a plain `@triton.jit` module; host side:
`sas.methods.specattn_runtime`).

One step runs the queries [I0, I0 + LQ) of every (batch, KV head) over the chunks of 16 keys
listed in `VISIT [B*Hkv, NCH]` (the first `COUNT[bh]` entries: chunks holding a selected or a
static key, ascending; `specattn_plan_kernel` lists them). The G*LQ query rows of a KV head (row g*LQ + r = query head g of the
group at position I0 + r) are the rows of one program; program s of a KV head takes the list
entries [s*PER, (s+1)*PER) and gathers their K/V rows (the cache is not reordered). Per key the
exact predicate is applied: key j is attended by row r when j <= I0 + r and (j < SINK or
j > I0 + r - WINDOW or j >= I0 or SELC[bh, j // CHUNK]), SELC being the selection's union
over the KV head's rows at its own chunk granularity (nothing is expanded to keys). Each program writes its unnormalised output and
log2-domain row statistics; `sas.methods.partials_triton.merge_partials_kernel` merges them.
"""

from __future__ import annotations

import triton
import triton.language as tl

CHUNK_KEYS = 16


@triton.jit
def specattn_plan_kernel(SELC, VISIT, COUNT, LOADED, NC, NCH, CHUNK, I0, I1, SINK, WINDOW,
                         BLOCK: tl.constexpr):
    """Per (batch, KV head): the 16-key chunks of keys < I1 holding a selected key (SELC [., NC]
    at the selection's granularity CHUNK) or a static one (j < SINK, j > I0 - WINDOW, j >= I0),
    written ascending to VISIT[bh, :COUNT[bh]] (one prefix sum per block of chunks); LOADED[bh]
    counts the existing keys of those chunks (what the attention kernel reads)."""
    bh = tl.program_id(0)
    t = tl.arange(0, 16)
    total = tl.sum(tl.zeros([BLOCK], tl.int32), 0)
    loaded = tl.sum(tl.zeros([BLOCK], tl.int32), 0)
    used = (I1 + 15) // 16
    for c0 in range(0, used, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        j = c[:, None] * 16 + t[None, :]
        inb = j < I1
        sel = tl.load(SELC + bh.to(tl.int64) * NC + j // CHUNK, mask=inb, other=0) != 0
        hit = inb & (sel | (j < SINK) | (j > I0 - WINDOW) | (j >= I0))
        visited = tl.max(hit.to(tl.int32), 1)
        pos = total + tl.cumsum(visited, 0) - 1
        tl.store(VISIT + bh.to(tl.int64) * NCH + pos, c, mask=visited != 0)
        keys_in = tl.minimum(tl.maximum(I1 - c * 16, 0), 16)
        loaded += tl.sum(visited * keys_in, 0)
        total += tl.sum(visited, 0)
    tl.store(COUNT + bh, total)
    tl.store(LOADED + bh, loaded)


@triton.jit
def specattn_attn_kernel(Q, K, V, SELC, VISIT, COUNT, O_PART, M_PART, L_PART,
                         N_CAP, NC, CHUNK, NCH, ROWS, LQ, D, I0, SINK, WINDOW, PER, qk_scale_log2,
                         BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr,
                         DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    bh = tl.program_id(0)
    s = tl.program_id(1)
    S = tl.num_programs(1)
    rows = tl.arange(0, BLOCK_R)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < ROWS
    dim_ok = dims < D
    qpos = I0 + rows % LQ
    q = tl.load(Q + (bh * ROWS + rows[:, None]) * D + dims[None, :], mask=row_ok[:, None] & dim_ok[None, :],
                other=0.0)
    if UPCAST:  # Triton's CPU interpreter has no bf16 arithmetic
        q = q.to(tl.float32)
    kv_base = bh.to(tl.int64) * N_CAP * D
    cnt = tl.load(COUNT + bh)
    lo = tl.minimum(s * PER, cnt)
    hi = tl.minimum(lo + PER, cnt)
    BLOCK_N: tl.constexpr = BLOCK_C * 16
    offs = tl.arange(0, BLOCK_N)
    m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK_C):
        e = start + offs // 16
        e_ok = e < hi
        cid = tl.load(VISIT + bh.to(tl.int64) * NCH + e, mask=e_ok, other=0)
        pos = cid * 16 + offs % 16
        inb = e_ok & (pos < N_CAP)
        sel = tl.load(SELC + bh.to(tl.int64) * NC + pos // CHUNK, mask=inb & (pos < I0 + LQ), other=0) != 0
        k = tl.load(K + kv_base + pos[:, None].to(tl.int64) * D + dims[None, :], mask=inb[:, None] & dim_ok[None, :],
                    other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        sc = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale_log2
        j = pos[None, :]
        i = qpos[:, None]
        keep = inb[None, :] & (j <= i) & ((j < SINK) | (j > i - WINDOW) | (j >= I0) | sel[None, :])
        sc = tl.where(keep, sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        pr = tl.exp2(sc - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(pr, 1)
        v = tl.load(V + kv_base + pos[:, None].to(tl.int64) * D + dims[None, :], mask=inb[:, None] & dim_ok[None, :],
                    other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        acc = tl.dot(pr.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    part = (bh * S + s) * BLOCK_R
    tl.store(O_PART + (part + rows[:, None]) * BLOCK_D + dims[None, :], acc)
    tl.store(M_PART + part + rows, m_i)
    tl.store(L_PART + part + rows, l_i)


__all__ = ["CHUNK_KEYS", "specattn_attn_kernel", "specattn_plan_kernel"]
