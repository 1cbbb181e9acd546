"""SANTA decode kernels (plain `@triton.jit`, nothing in them depends on a pattern: the keys are
slots [0, N) of a cache [B*Hkv, NCAP, D], optionally filtered by a per-slot mask). Host side:
`sas.methods.santa_runtime`; float64 specification: `sas.methods.santa`.

Both strategies of the paper (section 3) realise systematic sampling with the count form
`c_n = floor(a0 + P_n) - floor(a0 + P_n - x_n)` (P_n the inclusive prefix of x inside a tile).
The G query heads of a KV head are the rows of one program (padded to BLOCK_G >= 16 for
`tl.dot`); scores are kept in the log2 domain (`qk_scale_log2 = scale * log2(e)`).

- **prop** (two launches): `santa_prop_scores_kernel`, grid (B*Hkv, P): each program streams
  a run of TPP BLOCK_N tiles of its KV head (K loads software-pipelined): scores, the tile's max
  m_t and sum l_t, and the stash `u_n = exp2(s_n - m_t)` (STASH [B*Hq, T*BLOCK_N], fp32 or the
  cache dtype). With alloc="global_sys" the last program of a KV head to finish (an atomic
  arrival counter, left at 0) computes the global systematic tile offsets, scales and draws of
  its G query heads (one uniform per head); past FUSED_BUDGET_PAIRS (head, tile) pairs
  `santa_prop_budget_kernel` does this as a launch of its own, and largest_remainder budgets
  are computed on the host. `santa_prop_gather_kernel`, grid (B*Hkv, T): counts from the
  stash, the union of the drawn keys compacted (only their V rows are loaded), `sum c V / S`
  added atomically into fp32 rows; the last program of a KV head writes them to the output in
  its dtype and zeroes them (no memset or cast launch). Tiles where no head draws skip the
  counting.
- **flash** (two launches): `santa_flash_kernel`, grid (B*Hkv, T): scores, (m_t, l_t) and
  S_TILE systematic draws from the tile's own softmax in one pass, partial `sum c V / S_TILE`;
  `santa_flash_merge_kernel` merges the T partials with the exact weights exp2(m_t - m*) l_t.
- **exact static part** (keys attended exactly beside the sampled ones):
  `santa_static_partial_kernel`, grid (B*Hkv, P), online softmax over the listed static slots
  (split-K partials acc, m, l per query head); the sampled keys run as above with the static
  ones masked out, and the output is `(Z_s O_s + Z_d O_d) / (Z_s + Z_d)`: prop's budget program
  stores the region's (m*, Z) and its gather's last program per KV head merges
  (`_merge_static`); flash's merge takes the static partials as extra terms.
"""

from __future__ import annotations

import triton
import triton.language as tl

from sas.methods.kascade_triton import _attend_listed
from sas.methods.partials_triton import merge_step


@triton.jit
def _load_q(Q, bh, G, D, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr):
    """The G query rows of KV head bh, padded to BLOCK_G rows (zeros)."""
    rows = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, BLOCK_D)
    q = tl.load(Q + (bh * G + rows[:, None]) * D + dims[None, :],
                mask=(rows[:, None] < G) & (dims[None, :] < D), other=0.0)
    if UPCAST:  # Triton's CPU interpreter has no bf16 arithmetic: compute in fp32 there
        q = q.to(tl.float32)
    return q


@triton.jit
def _scores_with(q, K, MASK, bh, t, NCAP, N, D, qk_scale_log2,
                 BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HAS_MASK: tl.constexpr, UPCAST: tl.constexpr,
                 DOT_PRECISION: tl.constexpr):
    """Log2-domain scores [BLOCK_G, BLOCK_N] of tile t (-inf where a key is absent), the key
    indices and their validity. K rows below N are read whether or not MASK keeps them (the
    K load does not wait on the mask load)."""
    dims = tl.arange(0, BLOCK_D)
    keys = t * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = keys < N
    kv_base = bh.to(tl.int64) * NCAP * D
    k = tl.load(K + kv_base + keys[:, None] * D + dims[None, :], mask=ok[:, None] & (dims[None, :] < D), other=0.0)
    if HAS_MASK:
        ok = ok & (tl.load(MASK + keys, mask=ok, other=0) != 0)
    if UPCAST:
        k = k.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale_log2
    s = tl.where(ok[None, :], s, float("-inf"))
    return s, keys, ok


@triton.jit
def _tile_scores(Q, K, MASK, bh, t, NCAP, N, G, D, qk_scale_log2,
                 BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                 HAS_MASK: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    q = _load_q(Q, bh, G, D, BLOCK_G, BLOCK_D, UPCAST)
    return _scores_with(q, K, MASK, bh, t, NCAP, N, D, qk_scale_log2, BLOCK_N, BLOCK_D, HAS_MASK, UPCAST,
                        DOT_PRECISION)


@triton.jit
def _counts(x, a0, st, BLOCK_N: tl.constexpr):
    """The count form with the tile's draws fixed to `st` (per row), capped at st. fp32 prefix
    sums can gain or lose a draw where `a0 + P_n - x_n` and `a0 + P_{n-1}` round to either side
    of an integer (spec P5): the difference to st goes to the row's last key with x > 0 (a lost
    draw) or is taken from its key with most draws (a gained one), so every row draws exactly st."""
    p_inc = tl.cumsum(x, axis=1)
    f_inc = tl.minimum(tl.floor(a0[:, None] + p_inc), st[:, None])
    f_exc = tl.minimum(tl.floor(a0[:, None] + (p_inc - x)), st[:, None])
    c = f_inc - f_exc
    cols = tl.arange(0, BLOCK_N)
    deficit = st - tl.sum(c, axis=1)
    last = tl.max(tl.where(x > 0, cols[None, :], -1), axis=1)
    at = tl.where(deficit >= 0, last, tl.argmax(c, axis=1))
    return c + tl.where(cols[None, :] == at[:, None], deficit[:, None], 0.0)


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
def _budget_pass(m, l, a0, t_ok, carry, n_samples, z, mstar):
    """Tile offsets and draws of one chunk of tiles (rows = query heads): C_t = carry + cumsum of
    S W_t / Z; offset frac(a0 + C_{t-1}); draws floor(a0 + C_t) - floor(a0 + C_{t-1})."""
    live = l > 0
    scale = tl.where(live & t_ok, tl.exp2(m - mstar[:, None]), 0.0)
    w = scale * l
    share = w * (n_samples / z)[:, None]
    c_inc = carry[:, None] + tl.cumsum(share, axis=1)
    c_exc = c_inc - share
    lo = a0[:, None] + c_exc
    off = lo - tl.floor(lo)
    draws = tl.where(t_ok, tl.floor(a0[:, None] + c_inc) - tl.floor(lo), 0.0)
    inv = scale * (n_samples / z)[:, None]
    return inv, off, draws, c_inc


@triton.jit
def _prop_budgets(M_T, L_T, U0, INV, OFF, ST, MZ, h0, G, T, n_samples,
                  BLOCK_GB: tl.constexpr, BLOCK_T: tl.constexpr, ONE_CHUNK: tl.constexpr,
                  STORE_MZ: tl.constexpr):
    """alloc="global_sys" budgets of query heads h0 .. h0+G-1 (one uniform a0 each):
    inv_t = S exp2(m_t - m*) / Z, offsets frac(a0 + C_{t-1}), draws per tile. fp32 prefix sums
    over many tiles can lose or gain a draw: the tile with most draws takes the fix. M_T / L_T
    were written by other programs of this launch: volatile loads (no stale L1 line). With
    STORE_MZ, (m*, Z) of each head go to MZ [heads, 2] (the sampled region's exact row sum, for
    the merge with a static part)."""
    rows = tl.arange(0, BLOCK_GB)
    row_ok = rows < G
    hrow = h0 + rows
    ts0 = tl.arange(0, BLOCK_T)
    a0 = tl.load(U0 + hrow, mask=row_ok, other=0.0)
    base = hrow[:, None] * T
    if ONE_CHUNK:
        t_ok = row_ok[:, None] & (ts0[None, :] < T)
        m = tl.load(M_T + base + ts0[None, :], mask=t_ok, other=0.0, volatile=True)
        l = tl.load(L_T + base + ts0[None, :], mask=t_ok, other=0.0, volatile=True)
        mstar = tl.max(tl.where(l > 0, m, float("-inf")), axis=1)
        mstar = tl.where(mstar == float("-inf"), 0.0, mstar)
        z = tl.sum(tl.where(l > 0, tl.exp2(m - mstar[:, None]), 0.0) * l, axis=1)
        if STORE_MZ:
            tl.store(MZ + hrow * 2, mstar, mask=row_ok)
            tl.store(MZ + hrow * 2 + 1, z, mask=row_ok)
        z = tl.where(z > 0, z, 1.0)
        inv, off, draws, c_inc = _budget_pass(m, l, a0, t_ok, tl.zeros([BLOCK_GB], tl.float32), n_samples, z,
                                              mstar)
        fix = n_samples - tl.sum(draws, axis=1)
        draws += tl.where(ts0[None, :] == tl.argmax(draws, axis=1)[:, None], fix[:, None], 0.0)
        tl.store(INV + base + ts0[None, :], inv, mask=t_ok)
        tl.store(OFF + base + ts0[None, :], off, mask=t_ok)
        tl.store(ST + base + ts0[None, :], draws.to(tl.int32), mask=t_ok)
    else:
        mstar = tl.full([BLOCK_GB], float("-inf"), tl.float32)
        for t0 in tl.range(0, T, BLOCK_T, num_stages=1):
            ts = t0 + ts0
            t_ok = row_ok[:, None] & (ts[None, :] < T)
            m = tl.load(M_T + base + ts[None, :], mask=t_ok, other=0.0, volatile=True)
            l = tl.load(L_T + base + ts[None, :], mask=t_ok, other=0.0, volatile=True)
            mstar = tl.maximum(mstar, tl.max(tl.where(l > 0, m, float("-inf")), axis=1))
        mstar = tl.where(mstar == float("-inf"), 0.0, mstar)
        z = tl.zeros([BLOCK_GB], tl.float32)
        for t0 in tl.range(0, T, BLOCK_T, num_stages=1):
            ts = t0 + ts0
            t_ok = row_ok[:, None] & (ts[None, :] < T)
            m = tl.load(M_T + base + ts[None, :], mask=t_ok, other=0.0, volatile=True)
            l = tl.load(L_T + base + ts[None, :], mask=t_ok, other=0.0, volatile=True)
            z += tl.sum(tl.where(l > 0, tl.exp2(m - mstar[:, None]), 0.0) * l, axis=1)
        if STORE_MZ:
            tl.store(MZ + hrow * 2, mstar, mask=row_ok)
            tl.store(MZ + hrow * 2 + 1, z, mask=row_ok)
        z = tl.where(z > 0, z, 1.0)
        carry = tl.zeros([BLOCK_GB], tl.float32)
        total = tl.zeros([BLOCK_GB], tl.float32)
        best = tl.full([BLOCK_GB], -1.0, tl.float32)
        best_t = tl.zeros([BLOCK_GB], tl.int32)
        for t0 in tl.range(0, T, BLOCK_T, num_stages=1):
            ts = t0 + ts0
            t_ok = row_ok[:, None] & (ts[None, :] < T)
            m = tl.load(M_T + base + ts[None, :], mask=t_ok, other=0.0, volatile=True)
            l = tl.load(L_T + base + ts[None, :], mask=t_ok, other=0.0, volatile=True)
            inv, off, draws, c_inc = _budget_pass(m, l, a0, t_ok, carry, n_samples, z, mstar)
            tl.store(INV + base + ts[None, :], inv, mask=t_ok)
            tl.store(OFF + base + ts[None, :], off, mask=t_ok)
            tl.store(ST + base + ts[None, :], draws.to(tl.int32), mask=t_ok)
            total += tl.sum(draws, axis=1)
            cmax = tl.max(draws, axis=1)
            carg = tl.argmax(draws, axis=1) + t0
            better = cmax > best
            best_t = tl.where(better, carg, best_t)
            best = tl.where(better, cmax, best)
            carry = tl.max(tl.where(t_ok, c_inc, 0.0), axis=1)      # C_t is non-decreasing
        fix = n_samples - total
        tl.debug_barrier()           # the chunk's stores before the fix overwrites one of them
        tl.store(ST + hrow * T + best_t, (best + fix).to(tl.int32), mask=row_ok & (fix != 0))


@triton.jit
def _merge_static(o_d, m_d, l_d, O_S, M_S, L_S, hrow, row_ok, P, D, dims, d_ok):
    """The composed output of rows `hrow` (query heads): the sampled region's estimate o_d
    [rows, BLOCK_D] (normalised) with its exact log2-domain max m_d and row sum l_d, merged with
    the P exact static partials (unnormalised acc, m, l; `santa_static_partial_kernel`) in a
    common max frame: (Z_d o_d + Z_s O_s) / (Z_d + Z_s)."""
    live = l_d > 0
    m_tot = tl.where(live, m_d, float("-inf"))
    l_tot = tl.where(live, l_d, 0.0)
    acc = tl.where(live[:, None], o_d * l_d[:, None], 0.0)
    for s in range(0, P):
        m = tl.load(M_S + hrow * P + s, mask=row_ok, other=float("-inf"))
        l = tl.load(L_S + hrow * P + s, mask=row_ok, other=0.0)
        a = tl.load(O_S + (hrow[:, None].to(tl.int64) * P + s) * D + dims[None, :],
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        m_tot, l_tot, acc = merge_step(m_tot, l_tot, acc, m, l, a)
    return acc / tl.where(l_tot > 0, l_tot, 1.0)[:, None]


@triton.jit
def santa_static_partial_kernel(Q, K, V, IDX, O_S, M_S, L_S, NCAP, N_LIST, G, D, CHUNK, P, qk_scale_log2,
                                BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                                UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Exact attention of the G query heads of KV head bh over the static slots listed in IDX
    [N_LIST] (shared by batch and heads), split p of P taking list entries [p CHUNK, (p+1) CHUNK):
    unnormalised acc [B*Hq, P, D], log2-domain max and row sum [B*Hq, P] (an empty split leaves
    m = -inf, l = 0)."""
    bh = tl.program_id(0)
    sp = tl.program_id(1)
    rows = tl.arange(0, BLOCK_G)
    row_ok = rows < G
    hrow = bh * G + rows
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < D
    q = _load_q(Q, bh, G, D, BLOCK_G, BLOCK_D, UPCAST)
    kv_base = bh.to(tl.int64) * NCAP * D
    lo = sp * CHUNK
    hi = tl.minimum(lo + CHUNK, N_LIST)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    m_i, l_i, acc = _attend_listed(q, K, V, IDX, 0, kv_base, lo, hi, D, dims, dim_ok, m_i, l_i, acc, qk_scale_log2,
                                   BLOCK_N, DOT_PRECISION, UPCAST)
    tl.store(O_S + (hrow[:, None].to(tl.int64) * P + sp) * D + dims[None, :], acc,
             mask=row_ok[:, None] & dim_ok[None, :])
    tl.store(M_S + hrow * P + sp, m_i, mask=row_ok)
    tl.store(L_S + hrow * P + sp, l_i, mask=row_ok)


@triton.jit
def santa_prop_scores_kernel(Q, K, MASK, STASH, M_T, L_T, CNT, U0, INV, OFF, ST, MZ, NCAP, N, G, D, T, TPP,
                             qk_scale_log2, n_samples,
                             BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                             HAS_MASK: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
                             BUDGETS: tl.constexpr, BLOCK_GB: tl.constexpr, BLOCK_T: tl.constexpr,
                             STAGES: tl.constexpr, COMPOSE: tl.constexpr):
    """Grid (B*Hkv, P): program p streams tiles [p TPP, (p+1) TPP) of its KV head (K loads
    software-pipelined STAGES deep): scores, (m_t, l_t) and the stash of each tile. With BUDGETS
    (alloc="global_sys", T <= BLOCK_T) the last program of a KV head to finish (an atomic
    counter per KV head, reset to 0 by that program) computes the tile budgets of its G query
    heads (and, with COMPOSE, stores their (m*, Z) in MZ)."""
    bh = tl.program_id(0)
    p = tl.program_id(1)
    rows = tl.arange(0, BLOCK_G)
    row_ok = rows < G
    hrow = bh * G + rows
    q = _load_q(Q, bh, G, D, BLOCK_G, BLOCK_D, UPCAST)
    t_hi = tl.minimum(p * TPP + TPP, T)
    for t in tl.range(p * TPP, t_hi, num_stages=STAGES):
        s, keys, ok = _scores_with(q, K, MASK, bh, t, NCAP, N, D, qk_scale_log2, BLOCK_N, BLOCK_D, HAS_MASK,
                                   UPCAST, DOT_PRECISION)
        m = tl.max(s, axis=1)
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        u = tl.exp2(s - m_safe[:, None]).to(STASH.dtype.element_ty)
        l = tl.sum(u.to(tl.float32), axis=1)      # the sum of what is stashed: the tile's draws add up exactly
        tl.store(STASH + hrow[:, None].to(tl.int64) * (T * BLOCK_N) + keys[None, :],
                 u, mask=row_ok[:, None])
        tl.store(M_T + hrow * T + t, m_safe, mask=row_ok)
        tl.store(L_T + hrow * T + t, l, mask=row_ok)
    if BUDGETS:
        tl.debug_barrier()                   # every thread's (m_t, l_t) stores before the release
        done = tl.atomic_add(CNT + bh, 1, sem="acq_rel")
        if done == tl.num_programs(1) - 1:
            _prop_budgets(M_T, L_T, U0, INV, OFF, ST, MZ, bh * G, G, T, n_samples, BLOCK_GB, BLOCK_T, True, COMPOSE)
            tl.atomic_xchg(CNT + bh, 0)


@triton.jit
def santa_prop_budget_kernel(M_T, L_T, U0, INV, OFF, ST, MZ, G, T, n_samples,
                             BLOCK_GB: tl.constexpr, BLOCK_T: tl.constexpr, ONE_CHUNK: tl.constexpr,
                             COMPOSE: tl.constexpr):
    """The global_sys budgets of one KV head's G query heads as a launch of its own: for more
    tiles than the scores kernel's last program takes (T chunks of BLOCK_T)."""
    bh = tl.program_id(0)
    _prop_budgets(M_T, L_T, U0, INV, OFF, ST, MZ, bh * G, G, T, n_samples, BLOCK_GB, BLOCK_T, ONE_CHUNK, COMPOSE)


@triton.jit
def santa_prop_gather_kernel(STASH, INV, OFF, ST, V, OUT32, OUT, CNT, COUNTS, NCAP, N, G, D, T, inv_samples,
                             MZ, O_S, M_S, L_S, P,
                             BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                             BLOCK_R: tl.constexpr, STORE_COUNTS: tl.constexpr, COMPOSE: tl.constexpr):
    """Counts of tile t for the G heads (rows, BLOCK_G = next power of two >= G) from the stash;
    the union of the drawn keys is compacted BLOCK_R at a time (their V rows are the only ones
    loaded; `tl.dot` from 16 rows on, BLOCK_R = 16 there), sum c V / S is added atomically into
    the fp32 rows OUT32; the last program of a KV head to finish (atomic counter CNT, reset by
    it) writes those rows to OUT in its dtype and zeroes them for the next call. With COMPOSE
    that last program merges the estimate, weighted by the region's exact row sum (MZ, from the
    budgets), with the P exact static partials (O_S, M_S, L_S of `santa_static_partial_kernel`)
    before writing."""
    bh = tl.program_id(0)
    t = tl.program_id(1)
    rows = tl.arange(0, BLOCK_G)
    row_ok = rows < G
    hrow = bh * G + rows
    dims = tl.arange(0, BLOCK_D)
    d_ok = dims < D
    cols = tl.arange(0, BLOCK_N)
    keys = t * BLOCK_N + cols
    # every load of the tile's inputs at once (the stash read does not wait for the draws)
    draws = tl.load(ST + hrow * T + t, mask=row_ok, other=0)
    inv = tl.load(INV + hrow * T + t, mask=row_ok, other=0.0)
    a0 = tl.load(OFF + hrow * T + t, mask=row_ok, other=0.0)
    u = tl.load(STASH + hrow[:, None].to(tl.int64) * (T * BLOCK_N) + keys[None, :],
                mask=row_ok[:, None] & (keys[None, :] < N), other=0.0).to(tl.float32)
    if tl.sum(draws, axis=0) > 0:
        c = _counts(inv[:, None] * u, a0, draws.to(tl.float32), BLOCK_N)
        if STORE_COUNTS:
            tl.store(COUNTS + hrow[:, None].to(tl.int64) * (T * BLOCK_N) + keys[None, :], c.to(tl.int32),
                     mask=row_ok[:, None])
        drawn = (tl.max(c, axis=0) > 0).to(tl.int32)
        rank = tl.cumsum(drawn, axis=0)               # 1-based rank of a drawn key among the drawn
        n_drawn = tl.sum(drawn, axis=0)
        rs = tl.arange(0, BLOCK_R)
        kv_base = bh.to(tl.int64) * NCAP * D
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        for r0 in range(0, n_drawn, BLOCK_R):
            want = (rank[None, :] == (r0 + 1 + rs)[:, None]) & (drawn[None, :] > 0)
            idx = tl.sum(tl.where(want, cols[None, :], 0), axis=1)                 # [BLOCK_R] tile columns
            r_ok = r0 + rs < n_drawn
            cc = tl.gather(c, tl.broadcast_to(idx[None, :], [BLOCK_G, BLOCK_R]), axis=1)
            v = tl.load(V + kv_base + (t * BLOCK_N + idx)[:, None] * D + dims[None, :],
                        mask=r_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
            if BLOCK_G >= 16:
                # a dot: Triton 3.6 compiled the broadcast product summed over the drawn keys wrongly
                # for 16+ rows on an H100 (a biased estimate, benchmarks/check_santa_groups.py)
                acc += tl.dot(cc, v, input_precision="ieee")
            else:                           # fewer rows than a dot takes: exact on the GPU (1e-7)
                acc += tl.sum(cc[:, :, None] * v[None, :, :], axis=1)
        tl.atomic_add(OUT32 + hrow[:, None] * D + dims[None, :], acc * inv_samples,
                      mask=(row_ok & (draws > 0))[:, None] & d_ok[None, :], sem="relaxed")
    tl.debug_barrier()                       # every thread's adds before the release
    done = tl.atomic_add(CNT + bh, 1, sem="acq_rel")
    if done == T - 1:
        fin = row_ok[:, None] & d_ok[None, :]
        at = hrow[:, None] * D + dims[None, :]
        o = tl.load(OUT32 + at, mask=fin, other=0.0, volatile=True)     # the adds of every program (acquired)
        if COMPOSE:
            m_d = tl.load(MZ + hrow * 2, mask=row_ok, other=float("-inf"))
            l_d = tl.load(MZ + hrow * 2 + 1, mask=row_ok, other=0.0)
            o = _merge_static(o, m_d, l_d, O_S, M_S, L_S, hrow, row_ok, P, D, dims, d_ok)
        tl.store(OUT + at, o.to(OUT.dtype.element_ty), mask=fin)
        tl.store(OUT32 + at, tl.zeros([BLOCK_G, BLOCK_D], tl.float32), mask=fin)
        tl.atomic_xchg(CNT + bh, 0)


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
def santa_flash_merge_kernel(O_PART, M_PART, L_PART, OUT, T, D, O_S, M_S, L_S, P,
                             BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, HAS_STATIC: tl.constexpr):
    """One query head: out = sum_t exp2(m_t - m*) l_t O_t / sum_t exp2(m_t - m*) l_t; with
    HAS_STATIC the P exact static partials (unnormalised acc, m, l) join the sum with their own
    weights exp2(m_s - m*) (T may then be 0: a step with no sampled key)."""
    h = tl.program_id(0)
    dims = tl.arange(0, BLOCK_D)
    mstar = tl.full([], float("-inf"), tl.float32)
    if HAS_STATIC:
        for s in range(0, P):
            m_s = tl.load(M_S + h * P + s)
            l_s = tl.load(L_S + h * P + s)
            mstar = tl.maximum(mstar, tl.where(l_s > 0, m_s, float("-inf")))
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
    if HAS_STATIC:
        for s in range(0, P):
            m_s = tl.load(M_S + h * P + s)
            l_s = tl.load(L_S + h * P + s)
            w_s = tl.where(l_s > 0, tl.exp2(m_s - mstar), 0.0)
            a = tl.load(O_S + (h.to(tl.int64) * P + s) * D + dims, mask=dims < D, other=0.0)
            z += w_s * l_s
            acc += w_s * a
    out = acc / tl.where(z > 0, z, 1.0)
    tl.store(OUT + h * D + dims, out.to(OUT.dtype.element_ty), mask=dims < D)


__all__ = ["santa_flash_kernel", "santa_flash_merge_kernel", "santa_prop_budget_kernel",
           "santa_prop_gather_kernel", "santa_prop_scores_kernel", "santa_static_partial_kernel"]
