"""Sorting-free threshold selection with each row split across many programs (the `split`
method of `sas.methods.threshold_triton.threshold_select`; the definition is `sas.methods.threshold`).

The one-program-per-row kernel (`threshold_select_kernel`) walks a 128K-key row tile after tile
in each of its passes: latency-bound. Here grid `(rows, splits)`: each program owns a contiguous
range of the row's entries, and every pass of the search is one launch:

- each program evaluates the pass' predicate on its range (exact: the 15 candidate keys of the
  16-way search, stat = mass or count of `key >= cand`; paper: the one bisection midpoint) and
  writes its partial stats `[16]` to a small global buffer `STATS [rows, splits, 16]`;
- the **last-arriving** program of the row (an atomic counter per row) sums the partials in
  split order (deterministic, independent of arrival order), updates the row's search state
  (key interval `[lo, hi)`, or the value interval and target) and resets the counter;
- the first pass also sums the row's mass (top-p target `p * mass`) and, in paper mode, the max;
- a final parallel pass writes `key >= θ` into the int8 mask, θ, and the kept count (int atomics).

The exact search is the same as the row kernel's (same keys, same 15 candidates per pass, 8
passes over the full int32 key range), so the selected set is the same up to fp32 summation
order of the mass (here: per-split partial sums added in split order).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sas.methods.threshold_triton import _keys, _pooled

#: passes of the exact 16-way search over the 2^32 int32 keys
EXACT_PASSES = 8


@triton.jit
def split_pass_kernel(X, STATS, TOT, CNT, KEYS, VALS, R, P, N, NC, SPAN, NS, STRIDE_M, STRIDE_R, STRIDE_P, VALUE,
                      FIRST: tl.constexpr, COUNT: tl.constexpr, PAPER: tl.constexpr, CHUNK: tl.constexpr,
                      CHUNK_P2: tl.constexpr, BLOCK: tl.constexpr):
    """One pass of the search for row `pid0` over entries `[pid1 * SPAN, (pid1 + 1) * SPAN)`.
    State per row: KEYS [rows, 2] int64 (lo, hi of the exact search), VALS [rows, 3] fp32
    (target, lo_v, hi_v of the paper's bisection; target also in exact mode)."""
    row = tl.program_id(0)
    s = tl.program_id(1)
    m = row // R
    r = row % R
    base = m.to(tl.int64) * STRIDE_M + r * STRIDE_R
    lanes = tl.arange(0, 16)
    c_lo = s * SPAN
    c_hi = tl.minimum(c_lo + SPAN, NC)
    lo = -2147483648 + 0 * row.to(tl.int64)                # pred(lo) holds: every entry is >= lo
    hi = 2147483648 + 0 * row.to(tl.int64)                 # exclusive
    mid = 0.0
    if not FIRST:
        if PAPER:
            mid = (tl.load(VALS + row * 3 + 1) + tl.load(VALS + row * 3 + 2)) * 0.5
        else:
            lo = tl.load(KEYS + row * 2)
            hi = tl.load(KEYS + row * 2 + 1)
    step = (hi - lo + 15) // 16
    cand = lo + (lanes + 1).to(tl.int64) * step
    stat = tl.zeros([16], tl.float32)
    tot = 0.0
    ymax = -float("inf")
    for c0 in range(c_lo, c_hi, BLOCK):
        y = _pooled(X, base, c0, N, P, STRIDE_P, CHUNK, CHUNK_P2, BLOCK)
        okc = (c0 + tl.arange(0, BLOCK)) < c_hi
        w = tl.where(okc, tl.maximum(y, 0.0), 0.0)
        if FIRST:
            tot += tl.sum(w, 0)
            ymax = tl.maximum(ymax, tl.max(tl.where(okc, y, -float("inf")), 0))
        if PAPER:
            if not FIRST:
                stat += tl.where(lanes == 0, tl.sum(tl.where(y >= mid, w, 0.0), 0), 0.0)
        else:
            if COUNT:
                w = tl.where(okc, 1.0, 0.0)
            hit = _keys(y)[:, None] >= cand[None, :]
            stat += tl.sum(tl.where(hit, w[:, None], 0.0), 0)
    tl.store(STATS + (row * NS + s) * 16 + lanes, stat)
    if FIRST:
        tl.store(TOT + (row * NS + s) * 2, tot)
        tl.store(TOT + (row * NS + s) * 2 + 1, ymax)
    tl.debug_barrier()
    arrived = tl.atomic_add(CNT + row, 1)
    if arrived == NS - 1:                                   # the last program of the row reduces
        allstat = tl.zeros([16], tl.float32)
        alltot = 0.0
        allmax = -float("inf")
        for s2 in range(0, NS):
            allstat += tl.load(STATS + (row * NS + s2) * 16 + lanes, volatile=True)
            if FIRST:
                alltot += tl.load(TOT + (row * NS + s2) * 2, volatile=True)
                allmax = tl.maximum(allmax, tl.load(TOT + (row * NS + s2) * 2 + 1, volatile=True))
        if FIRST:
            if COUNT:
                target = tl.minimum(VALUE, NC * 1.0)
            else:
                target = VALUE * alltot
            tl.store(VALS + row * 3, target)
        else:
            target = tl.load(VALS + row * 3)
        if PAPER:
            if FIRST:
                tl.store(VALS + row * 3 + 1, 0.0)
                tl.store(VALS + row * 3 + 2, allmax)
            else:
                mass = tl.sum(tl.where(lanes == 0, allstat, 0.0), 0)
                short = mass < target
                lo_v = tl.load(VALS + row * 3 + 1)
                hi_v = tl.load(VALS + row * 3 + 2)
                tl.store(VALS + row * 3 + 1, tl.where(short, lo_v, mid))
                tl.store(VALS + row * 3 + 2, tl.where(short, mid, hi_v))
        else:
            valid = (lanes < 15) & (cand < hi)
            if FIRST:                                       # nothing above the max (a target of 0 holds there)
                kmax = _keys(allmax)
                valid = valid & (cand <= kmax)
                hi = tl.minimum(hi, kmax + 1)
            ok = valid & (allstat >= target)
            tl.store(KEYS + row * 2, tl.max(tl.where(ok, cand, lo), 0))
            tl.store(KEYS + row * 2 + 1, tl.min(tl.where(valid & ~ok, cand, hi), 0))
        tl.atomic_xchg(CNT + row, 0)


@triton.jit
def split_mask_kernel(X, MASK, THETA, KEPT, KEYS, VALS, R, P, N, NC, SPAN, STRIDE_M, STRIDE_R, STRIDE_P,
                      PAPER: tl.constexpr, CHUNK: tl.constexpr, CHUNK_P2: tl.constexpr, BLOCK: tl.constexpr):
    """`key >= θ` for row `pid0`'s entries of split `pid1`; θ and the kept count (int atomics)."""
    row = tl.program_id(0)
    s = tl.program_id(1)
    m = row // R
    r = row % R
    base = m.to(tl.int64) * STRIDE_M + r * STRIDE_R
    if PAPER:
        theta_key = _keys(tl.load(VALS + row * 3 + 1))
    else:
        theta_key = tl.load(KEYS + row * 2)
    c_lo = s * SPAN
    c_hi = tl.minimum(c_lo + SPAN, NC)
    kept = 0
    for c0 in range(c_lo, c_hi, BLOCK):
        cs = c0 + tl.arange(0, BLOCK)
        okc = cs < c_hi
        y = _pooled(X, base, c0, N, P, STRIDE_P, CHUNK, CHUNK_P2, BLOCK)
        keep = okc & (_keys(y) >= theta_key)
        kept += tl.sum(keep.to(tl.int32), 0)
        tl.store(MASK + row.to(tl.int64) * NC + cs, keep.to(tl.int8), mask=okc)
    tl.atomic_add(KEPT + row, kept)
    if s == 0:
        tk = theta_key.to(tl.int32)
        tb = tl.where(tk < 0, tk ^ 0x7FFFFFFF, tk)
        tl.store(THETA + row, tb.to(tl.float32, bitcast=True))


def split_layout(rows: int, nc: int, block: int, splits: int | None, programs: int = 2048) -> tuple[int, int]:
    """(splits, entries per split): about `programs` programs in all unless `splits` is given,
    each split a whole number of `block`-entry tiles, no split empty."""
    tiles = -(-nc // block)
    want = splits if splits is not None else -(-programs // rows)
    ns = max(1, min(want, tiles))
    span = -(-tiles // ns) * block
    return -(-nc // span), span


def run_split(scores: torch.Tensor, value: float, count: bool, iters: int | None, chunk: int, block: int,
              num_warps: int, splits: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Host side of the split selection (arguments already checked by `threshold_select`):
    -> mask [M, R, Nc] int8, theta [M, R] float32, kept [M, R] int32."""
    m, r, pp, n = scores.shape
    nc = -(-n // chunk)
    rows = m * r
    dev = scores.device
    ns, span = split_layout(rows, nc, block, splits)
    mask = torch.empty(m, r, nc, dtype=torch.int8, device=dev)
    theta = torch.empty(m, r, dtype=torch.float32, device=dev)
    kept = torch.zeros(m, r, dtype=torch.int32, device=dev)
    stats = torch.empty(rows, ns, 16, dtype=torch.float32, device=dev)
    tot = torch.empty(rows, ns, 2, dtype=torch.float32, device=dev)
    cnt = torch.zeros(rows, dtype=torch.int32, device=dev)
    keys = torch.empty(rows, 2, dtype=torch.int64, device=dev)
    vals = torch.empty(rows, 3, dtype=torch.float32, device=dev)
    paper = iters is not None and not count
    passes = 1 + (iters if paper else EXACT_PASSES)
    common = dict(COUNT=count, PAPER=paper, CHUNK=chunk, CHUNK_P2=triton.next_power_of_2(chunk), BLOCK=block,
                  num_warps=num_warps)
    strides = (scores.stride(0), scores.stride(1), scores.stride(2))
    for i in range(passes):
        split_pass_kernel[(rows, ns)](scores, stats, tot, cnt, keys, vals, r, pp, n, nc, span, ns, *strides, value,
                                      FIRST=i == 0, **common)
    split_mask_kernel[(rows, ns)](scores, mask, theta, kept, keys, vals, r, pp, n, nc, span, *strides, PAPER=paper,
                                  CHUNK=chunk, CHUNK_P2=triton.next_power_of_2(chunk), BLOCK=block,
                                  num_warps=num_warps)
    return mask, theta, kept


__all__ = ["EXACT_PASSES", "run_split", "split_layout", "split_mask_kernel", "split_pass_kernel"]
