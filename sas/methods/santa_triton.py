"""SANTA decode kernels (plain `@triton.jit`, nothing in them depends on a pattern: the keys are
slots [0, N) of a cache [B*Hkv, NCAP, D], optionally filtered by a per-slot mask). Host side:
`sas.methods.santa_runtime`; float64 specification: `sas.methods.santa`.

Both strategies of the paper (section 3) realise systematic sampling with the count form
`c_n = floor(a0 + P_n) - floor(a0 + P_n - x_n)` (P_n the inclusive prefix of x inside a tile).
The G query heads of a KV head are the rows of one program (padded to BLOCK_G >= 16 for
`tl.dot`); scores are kept in the log2 domain (`qk_scale_log2 = scale * log2(e)`).

- **prop** (three launches): `santa_prop_scores_kernel`, grid (B*Hkv, T): scores of one
  BLOCK_N tile, its max m_t and sum l_t, and the stash `u_n = exp2(s_n - m_t)` (STASH
  [B*Hq, T*BLOCK_N], fp32 or the cache dtype). `santa_prop_budget_kernel`, one program per
  query head: the global systematic tile offsets and scales (alloc="global_sys", one uniform
  per head; largest_remainder budgets are computed on the host) and zeroes the fp32 output
  rows. `santa_prop_gather_kernel`, grid (B*Hkv, T): counts from the stash, then only the V
  rows some head of the group drew are loaded (masked loads: rows nobody drew cost no memory
  traffic), `sum c V / S` added atomically into the output. Tiles where no head draws skip
  everything.
- **flash** (two launches): `santa_flash_kernel`, grid (B*Hkv, T): scores, (m_t, l_t) and
  S_TILE systematic draws from the tile's own softmax in one pass, partial `sum c V / S_TILE`;
  `santa_flash_merge_kernel` merges the T partials with the exact weights exp2(m_t - m*) l_t.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tile_scores(Q, K, MASK, bh, t, NCAP, N, G, D, qk_scale_log2,
                 BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                 HAS_MASK: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Log2-domain scores [BLOCK_G, BLOCK_N] of tile t (-inf where a key is absent), the key
    indices and their validity."""
    rows = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, BLOCK_D)
    keys = t * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = keys < N
    if HAS_MASK:
        ok = ok & (tl.load(MASK + keys, mask=ok, other=0) != 0)
    q = tl.load(Q + (bh * G + rows[:, None]) * D + dims[None, :],
                mask=(rows[:, None] < G) & (dims[None, :] < D), other=0.0)
    kv_base = bh.to(tl.int64) * NCAP * D
    k = tl.load(K + kv_base + keys[:, None] * D + dims[None, :], mask=ok[:, None] & (dims[None, :] < D), other=0.0)
    if UPCAST:  # Triton's CPU interpreter has no bf16 arithmetic: compute in fp32 there
        q = q.to(tl.float32)
        k = k.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale_log2
    s = tl.where(ok[None, :], s, float("-inf"))
    return s, keys, ok


@triton.jit
def _counts(x, a0, st, BLOCK_N: tl.constexpr):
    """The count form with the tile's draws fixed to `st` (per row): counts capped at st, and a
    draw lost to fp32 rounding at the tile's end goes to its last key with x > 0 (spec P5)."""
    p_inc = tl.cumsum(x, axis=1)
    f_inc = tl.minimum(tl.floor(a0[:, None] + p_inc), st[:, None])
    f_exc = tl.minimum(tl.floor(a0[:, None] + (p_inc - x)), st[:, None])
    c = f_inc - f_exc
    cols = tl.arange(0, BLOCK_N)
    last = tl.max(tl.where(x > 0, cols[None, :], -1), axis=1)
    deficit = st - tl.max(f_inc, axis=1)
    return c + tl.where(cols[None, :] == last[:, None], deficit[:, None], 0.0)


@triton.jit
def _gather(c, V, bh, keys, NCAP, D, BLOCK_D: tl.constexpr, LOWP: tl.constexpr, BIG: tl.constexpr):
    """sum_n c[g, n] V[n] for the rows some head drew: [BLOCK_G, BLOCK_D] fp32. With a bf16/fp16
    cache (LOWP) the counts enter the tensor-core dot in V's dtype, exact up to 256 (BIG: counts
    up to 65535 as two dots, low and high byte)."""
    dims = tl.arange(0, BLOCK_D)
    drawn = tl.max(c, axis=0) > 0
    kv_base = bh.to(tl.int64) * NCAP * D
    v = tl.load(V + kv_base + keys[:, None] * D + dims[None, :], mask=drawn[:, None] & (dims[None, :] < D),
                other=0.0)
    if LOWP:
        if BIG:
            hi = tl.floor(c / 256.0)
            acc = tl.dot((c - hi * 256.0).to(v.dtype), v) + 256.0 * tl.dot(hi.to(v.dtype), v)
        else:
            acc = tl.dot(c.to(v.dtype), v)
    else:
        acc = tl.dot(c, v.to(tl.float32), input_precision="ieee")
    return acc


@triton.jit
def santa_prop_scores_kernel(Q, K, MASK, STASH, M_T, L_T, NCAP, N, G, D, T, qk_scale_log2,
                             BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                             HAS_MASK: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    bh = tl.program_id(0)
    t = tl.program_id(1)
    s, keys, ok = _tile_scores(Q, K, MASK, bh, t, NCAP, N, G, D, qk_scale_log2, BLOCK_G, BLOCK_N, BLOCK_D,
                               HAS_MASK, UPCAST, DOT_PRECISION)
    m = tl.max(s, axis=1)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    u = tl.exp2(s - m_safe[:, None]).to(STASH.dtype.element_ty)
    l = tl.sum(u.to(tl.float32), axis=1)      # the sum of what is stashed: the tile's draws add up exactly
    rows = tl.arange(0, BLOCK_G)
    row_ok = rows < G
    hrow = bh * G + rows
    tl.store(STASH + hrow[:, None].to(tl.int64) * (T * BLOCK_N) + keys[None, :],
             u, mask=row_ok[:, None])
    tl.store(M_T + hrow * T + t, m_safe, mask=row_ok)
    tl.store(L_T + hrow * T + t, l, mask=row_ok)


@triton.jit
def santa_prop_budget_kernel(M_T, L_T, U0, INV, OFF, ST, OUT, T, D, n_samples,
                             BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """One query head (alloc="global_sys"): a0 = U0[h]; C_t = S sum_{t'<=t} W_t'/Z;
    offset frac(a0 + C_{t-1}); inv = S exp2(m_t - m*) / Z; draws floor(a0 + C_t) - floor(a0 + C_{t-1})."""
    h = tl.program_id(0)
    ts = tl.arange(0, BLOCK_T)
    t_ok = ts < T
    m = tl.load(M_T + h * T + ts, mask=t_ok, other=0.0)
    l = tl.load(L_T + h * T + ts, mask=t_ok, other=0.0)
    live = l > 0
    mstar = tl.max(tl.where(live, m, float("-inf")), axis=0)
    scale = tl.where(live, tl.exp2(m - mstar), 0.0)
    w = scale * l
    z = tl.sum(w, axis=0)
    share = w * (n_samples / z)
    c_inc = tl.cumsum(share, axis=0)
    c_exc = c_inc - share
    a0 = tl.load(U0 + h)
    lo = a0 + c_exc
    off = lo - tl.floor(lo)
    draws = tl.where(t_ok, tl.floor(a0 + c_inc) - tl.floor(lo), 0.0)
    # fp32 prefix sums over many tiles can lose or gain a draw: the tile with most draws takes the fix
    fix = n_samples - tl.sum(draws, axis=0)
    draws += tl.where(ts == tl.argmax(draws, axis=0), fix, 0.0)
    tl.store(INV + h * T + ts, scale * (n_samples / z), mask=t_ok)
    tl.store(OFF + h * T + ts, off, mask=t_ok)
    tl.store(ST + h * T + ts, draws.to(tl.int32), mask=t_ok)
    dims = tl.arange(0, BLOCK_D)
    tl.store(OUT + h * D + dims, tl.zeros([BLOCK_D], tl.float32), mask=dims < D)


@triton.jit
def santa_prop_gather_kernel(STASH, INV, OFF, ST, V, OUT, COUNTS, NCAP, N, G, D, T, inv_samples,
                             BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                             STORE_COUNTS: tl.constexpr, LOWP: tl.constexpr, BIG: tl.constexpr):
    bh = tl.program_id(0)
    t = tl.program_id(1)
    rows = tl.arange(0, BLOCK_G)
    row_ok = rows < G
    hrow = bh * G + rows
    draws = tl.load(ST + hrow * T + t, mask=row_ok, other=0)
    if tl.sum(draws, axis=0) > 0:
        keys = t * BLOCK_N + tl.arange(0, BLOCK_N)
        u = tl.load(STASH + hrow[:, None].to(tl.int64) * (T * BLOCK_N) + keys[None, :],
                    mask=row_ok[:, None] & (keys[None, :] < N), other=0.0).to(tl.float32)
        inv = tl.load(INV + hrow * T + t, mask=row_ok, other=0.0)
        a0 = tl.load(OFF + hrow * T + t, mask=row_ok, other=0.0)
        x = inv[:, None] * u
        c = _counts(x, a0, draws.to(tl.float32), BLOCK_N)
        if STORE_COUNTS:
            tl.store(COUNTS + hrow[:, None].to(tl.int64) * (T * BLOCK_N) + keys[None, :], c.to(tl.int32),
                     mask=row_ok[:, None])
        acc = _gather(c, V, bh, keys, NCAP, D, BLOCK_D, LOWP, BIG)
        dims = tl.arange(0, BLOCK_D)
        tl.atomic_add(OUT + hrow[:, None] * D + dims[None, :], acc * inv_samples,
                      mask=row_ok[:, None] & (dims[None, :] < D))


@triton.jit
def santa_flash_kernel(Q, K, V, MASK, U, O_PART, M_PART, L_PART, COUNTS, NCAP, N, G, D, T, qk_scale_log2,
                       s_tile,
                       BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                       HAS_MASK: tl.constexpr, STORE_COUNTS: tl.constexpr, UPCAST: tl.constexpr,
                       DOT_PRECISION: tl.constexpr, LOWP: tl.constexpr, BIG: tl.constexpr):
    bh = tl.program_id(0)
    t = tl.program_id(1)
    s, keys, ok = _tile_scores(Q, K, MASK, bh, t, NCAP, N, G, D, qk_scale_log2, BLOCK_G, BLOCK_N, BLOCK_D,
                               HAS_MASK, UPCAST, DOT_PRECISION)
    m = tl.max(s, axis=1)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    u = tl.exp2(s - m_safe[:, None])
    l = tl.sum(u, axis=1)
    rows = tl.arange(0, BLOCK_G)
    row_ok = rows < G
    hrow = bh * G + rows
    a0 = tl.load(U + hrow * T + t, mask=row_ok, other=0.0)
    x = u * (s_tile / tl.where(l > 0, l, 1.0))[:, None]
    c = _counts(x, a0, tl.where(l > 0, s_tile, 0.0), BLOCK_N)
    if STORE_COUNTS:
        tl.store(COUNTS + hrow[:, None].to(tl.int64) * (T * BLOCK_N) + keys[None, :], c.to(tl.int32),
                 mask=row_ok[:, None])
    acc = _gather(c, V, bh, keys, NCAP, D, BLOCK_D, LOWP, BIG) / s_tile
    dims = tl.arange(0, BLOCK_D)
    tl.store(O_PART + ((hrow[:, None].to(tl.int64) * T + t) * D) + dims[None, :], acc,
             mask=row_ok[:, None] & (dims[None, :] < D))
    tl.store(M_PART + hrow * T + t, m_safe, mask=row_ok)
    tl.store(L_PART + hrow * T + t, l, mask=row_ok)


@triton.jit
def santa_flash_merge_kernel(O_PART, M_PART, L_PART, OUT, T, D,
                             BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """One query head: out = sum_t exp2(m_t - m*) l_t O_t / sum_t exp2(m_t - m*) l_t."""
    h = tl.program_id(0)
    dims = tl.arange(0, BLOCK_D)
    mstar = tl.full([], float("-inf"), tl.float32)
    for t0 in range(0, T, BLOCK_T):
        ts = t0 + tl.arange(0, BLOCK_T)
        m = tl.load(M_PART + h * T + ts, mask=ts < T, other=0.0)
        l = tl.load(L_PART + h * T + ts, mask=ts < T, other=0.0)
        mstar = tl.maximum(mstar, tl.max(tl.where(l > 0, m, float("-inf")), axis=0))
    z = tl.zeros([], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for t0 in range(0, T, BLOCK_T):
        ts = t0 + tl.arange(0, BLOCK_T)
        t_ok = ts < T
        m = tl.load(M_PART + h * T + ts, mask=t_ok, other=0.0)
        l = tl.load(L_PART + h * T + ts, mask=t_ok, other=0.0)
        w = tl.where(l > 0, tl.exp2(m - mstar) * l, 0.0)
        o = tl.load(O_PART + (h.to(tl.int64) * T + ts[:, None]) * D + dims[None, :],
                    mask=t_ok[:, None] & (dims[None, :] < D), other=0.0)
        z += tl.sum(w, axis=0)
        acc += tl.sum(w[:, None] * o, axis=0)
    out = acc / tl.where(z > 0, z, 1.0)
    tl.store(OUT + h * D + dims, out.to(OUT.dtype.element_ty), mask=dims < D)


__all__ = ["santa_flash_kernel", "santa_flash_merge_kernel", "santa_prop_budget_kernel",
           "santa_prop_gather_kernel", "santa_prop_scores_kernel"]
