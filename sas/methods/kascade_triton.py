"""Kascade kernels (plain `@triton.jit`: nothing here depends on a pattern; the budget, the
counts and the head map arrive at run time). Host side: `sas.methods.kascade_runtime`.

Layouts: q [B, Hq, Lq, D], k, v [B, Hkv, N, D] contiguous; query head hq belongs to KV head
hq // G. Scores are in the log2 domain (`qk_scale_log2 = scale * log2(e)`), row statistics as
`lse = m + log2(l)`.

Prefill (one program per query tile of TILE tokens x G heads = BLOCK_R rows, per batch x KV head):

- `kascade_flash_kernel`: causal FlashAttention per query head that writes each row's lse
  (anchor pass 1) and, with WRITE_O, the dense output (the first anchor, layer 0);
- `kascade_tile_scores_kernel`: for the tiles of one chunk, the post-softmax probabilities
  `exp2(s - lse)` of the tile's rows, summed over rows and heads, for every key before the
  tile, written as one row per tile into a chunk-sized scratch (the top-k of each row is then
  taken on the host): at most `chunk` tile rows of pooled scores exist at once, never the
  whole [n_tiles, N] tensor;
- `kascade_gather_prefill_kernel`: attention of a tile over its selected keys (gathered K/V
  rows through the index list of KV head HMAP[h]) plus its own causal in-tile keys.

Decode (split-K, one program per (batch x KV head, split), the G query heads are its rows):

- `kascade_decode_scores_kernel`: the scaled scores of every key (written, fp32) and each
  split's row statistics; with WRITE_O also the dense partial output (layer 0);
- `kascade_decode_pool_kernel`: `sum_g exp2(s_g - lse_g)` per key (the GQA-pooled score);
- `kascade_gather_decode_kernel`: attention over a piece of the selected index list.
Partials are merged by `sas.methods.partials_triton.merge_partials_kernel` (same partial layout).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def kascade_flash_kernel(Q, K, V, O, LSE, N, HQ, G, D, qk_scale_log2,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                         WRITE_O: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    mb = tl.program_id(0)
    bq = tl.program_id(1)
    b = bq // HQ
    hkv = (bq % HQ) // G
    hkv_n = HQ // G
    rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < N
    dim_ok = dims < D
    q_base = bq.to(tl.int64) * N * D
    kv_base = (b * hkv_n + hkv).to(tl.int64) * N * D
    q = tl.load(Q + q_base + rows[:, None].to(tl.int64) * D + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lo_diag = mb * BLOCK_M
    hi = tl.minimum(mb * BLOCK_M + BLOCK_M, N)
    # key blocks left of the diagonal block: no mask
    for start in range(0, lo_diag, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k = tl.load(K + kv_base + cols[:, None].to(tl.int64) * D + dims[None, :], mask=dim_ok[None, :], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale_log2
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if WRITE_O:
            v = tl.load(V + kv_base + cols[:, None].to(tl.int64) * D + dims[None, :], mask=dim_ok[None, :],
                        other=0.0)
            if UPCAST:
                v = v.to(tl.float32)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    # the diagonal block(s): causal mask
    for start in range(lo_diag, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        k = tl.load(K + kv_base + cols[:, None].to(tl.int64) * D + dims[None, :],
                    mask=col_ok[:, None] & dim_ok[None, :], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale_log2
        s = tl.where((cols[None, :] <= rows[:, None]) & col_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if WRITE_O:
            v = tl.load(V + kv_base + cols[:, None].to(tl.int64) * D + dims[None, :],
                        mask=col_ok[:, None] & dim_ok[None, :], other=0.0)
            if UPCAST:
                v = v.to(tl.float32)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    tl.store(LSE + bq.to(tl.int64) * N + rows, m_i + tl.log2(l_i), mask=row_ok)
    if WRITE_O:
        out = acc / l_i[:, None]
        tl.store(O + q_base + rows[:, None].to(tl.int64) * D + dims[None, :], out.to(O.dtype.element_ty),
                 mask=row_ok[:, None] & dim_ok[None, :])


@triton.jit
def kascade_tile_scores_kernel(Q, K, LSE, SCR, N, HKV, G, D, T0, NT, CH, TILE, qk_scale_log2,
                               BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                               DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    c = tl.program_id(0)
    bh = tl.program_id(1)
    t = T0 + c
    b = bh // HKV
    h = bh % HKV
    r = tl.arange(0, BLOCK_R)
    g = r // TILE
    pos = t * TILE + r % TILE
    row_ok = (g < G) & (pos < N)
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < D
    qh = (b * HKV * G + h * G + g).to(tl.int64)
    q = tl.load(Q + (qh[:, None] * N + pos[:, None]) * D + dims[None, :], mask=row_ok[:, None] & dim_ok[None, :],
                other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    lse = tl.load(LSE + qh * N + pos, mask=row_ok, other=float("inf"))
    kv_base = bh.to(tl.int64) * N * D
    out_base = (bh * CH + c).to(tl.int64) * N
    hi = t * TILE
    for start in range(0, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = cols < hi
        k = tl.load(K + kv_base + cols[:, None].to(tl.int64) * D + dims[None, :],
                    mask=col_ok[:, None] & dim_ok[None, :], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale_log2
        p = tl.exp2(s - lse[:, None])
        p = tl.where(row_ok[:, None], p, 0.0)
        tl.store(SCR + out_base + cols, tl.sum(p, 0), mask=col_ok)


@triton.jit
def _attend_listed(q, K, V, IDX, list_base, kv_base, lo, hi, D, dims, dim_ok, m_i, l_i, acc, qk_scale_log2,
                   BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """Online softmax of the rows of q over the keys listed in IDX[list_base + lo : list_base + hi]
    (K, V rows gathered at kv_base + key * D), continuing (m_i, l_i, acc); returns them updated."""
    for start in range(lo, hi, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        ok = offs < hi
        j = tl.load(IDX + list_base + offs, mask=ok, other=0).to(tl.int64)
        k = tl.load(K + kv_base + j[:, None] * D + dims[None, :], mask=ok[:, None] & dim_ok[None, :], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale_log2
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + kv_base + j[:, None] * D + dims[None, :], mask=ok[:, None] & dim_ok[None, :], other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def kascade_gather_prefill_kernel(Q, K, V, O, IDX, CNT, HMAP, N, HKV, HSRC, G, D, NT, KMAX, TILE, qk_scale_log2,
                                  BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr,
                                  BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    t = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // HKV
    h = bh % HKV
    hs = tl.load(HMAP + h)
    cnt = tl.load(CNT + t)
    r = tl.arange(0, BLOCK_R)
    g = r // TILE
    pos = t * TILE + r % TILE
    row_ok = (g < G) & (pos < N)
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < D
    qh = (b * HKV * G + h * G + g).to(tl.int64)
    q_off = (qh[:, None] * N + pos[:, None]) * D + dims[None, :]
    q = tl.load(Q + q_off, mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    kv_base = bh.to(tl.int64) * N * D
    list_base = ((b * HSRC + hs).to(tl.int64) * NT + t) * KMAX
    m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    m_i, l_i, acc = _attend_listed(q, K, V, IDX, list_base, kv_base, 0, cnt, D, dims, dim_ok, m_i, l_i, acc,
                                   qk_scale_log2, BLOCK_N, DOT_PRECISION, UPCAST)
    # the tile's own keys, causal
    cols = t * TILE + tl.arange(0, BLOCK_T)
    col_ok = (cols < N) & (tl.arange(0, BLOCK_T) < TILE)
    k = tl.load(K + kv_base + cols[:, None].to(tl.int64) * D + dims[None, :],
                mask=col_ok[:, None] & dim_ok[None, :], other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale_log2
    s = tl.where(col_ok[None, :] & (cols[None, :] <= pos[:, None]), s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(V + kv_base + cols[:, None].to(tl.int64) * D + dims[None, :],
                mask=col_ok[:, None] & dim_ok[None, :], other=0.0)
    if UPCAST:
        v = v.to(tl.float32)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    out = acc / l_i[:, None]
    tl.store(O + q_off, out.to(O.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


@triton.jit
def kascade_decode_scores_kernel(Q, K, V, SL, O_PART, M_PART, L_PART, N, G, D, CHUNK, S, qk_scale_log2,
                                 BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                                 WRITE_O: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    bh = tl.program_id(0)
    sp = tl.program_id(1)
    rows = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < G
    dim_ok = dims < D
    q = tl.load(Q + (bh * G + rows[:, None]) * D + dims[None, :], mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    kv_base = bh.to(tl.int64) * N * D
    sl_base = (bh * G + rows).to(tl.int64) * N
    lo = sp * CHUNK
    hi = tl.minimum(lo + CHUNK, N)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = cols < hi
        k = tl.load(K + kv_base + cols[:, None].to(tl.int64) * D + dims[None, :],
                    mask=col_ok[:, None] & dim_ok[None, :], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale_log2
        tl.store(SL + sl_base[:, None] + cols[None, :], s, mask=row_ok[:, None] & col_ok[None, :])
        s = tl.where(col_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if WRITE_O:
            v = tl.load(V + kv_base + cols[:, None].to(tl.int64) * D + dims[None, :],
                        mask=col_ok[:, None] & dim_ok[None, :], other=0.0)
            if UPCAST:
                v = v.to(tl.float32)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    part = (bh * S + sp) * BLOCK_G
    tl.store(M_PART + part + rows, m_i)
    tl.store(L_PART + part + rows, l_i)
    if WRITE_O:
        tl.store(O_PART + (part + rows[:, None]) * BLOCK_D + dims[None, :], acc)


@triton.jit
def kascade_decode_pool_kernel(SL, LSE, POOLED, N, G, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr):
    bh = tl.program_id(0)
    nb = tl.program_id(1)
    rows = tl.arange(0, BLOCK_G)
    row_ok = rows < G
    cols = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    lse = tl.load(LSE + bh * G + rows, mask=row_ok, other=float("inf"))
    s = tl.load(SL + (bh * G + rows[:, None]).to(tl.int64) * N + cols[None, :],
                mask=row_ok[:, None] & col_ok[None, :], other=float("-inf"))
    p = tl.exp2(s - lse[:, None])
    p = tl.where(row_ok[:, None] & col_ok[None, :], p, 0.0)
    tl.store(POOLED + bh.to(tl.int64) * N + cols, tl.sum(p, 0), mask=col_ok)


@triton.jit
def kascade_gather_decode_kernel(Q, K, V, IDX, HMAP, O_PART, M_PART, L_PART, N, HKV, HSRC, G, D, KMAX, CNT, S,
                                 qk_scale_log2, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
                                 BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    bh = tl.program_id(0)
    sp = tl.program_id(1)
    b = bh // HKV
    h = bh % HKV
    hs = tl.load(HMAP + h)
    rows = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < G
    dim_ok = dims < D
    q = tl.load(Q + (bh * G + rows[:, None]) * D + dims[None, :], mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    kv_base = bh.to(tl.int64) * N * D
    list_base = (b * HSRC + hs).to(tl.int64) * KMAX
    piece = (CNT + S - 1) // S
    lo = tl.minimum(sp * piece, CNT)
    hi = tl.minimum(lo + piece, CNT)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    m_i, l_i, acc = _attend_listed(q, K, V, IDX, list_base, kv_base, lo, hi, D, dims, dim_ok, m_i, l_i, acc,
                                   qk_scale_log2, BLOCK_N, DOT_PRECISION, UPCAST)
    part = (bh * S + sp) * BLOCK_G
    tl.store(O_PART + (part + rows[:, None]) * BLOCK_D + dims[None, :], acc)
    tl.store(M_PART + part + rows, m_i)
    tl.store(L_PART + part + rows, l_i)
