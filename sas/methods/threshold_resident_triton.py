"""Sorting-free threshold selection with the whole row held in one program's registers (the
`resident` method of `sas.methods.threshold_triton.threshold_select`; the definition is
`sas.methods.threshold`).

For rows of up to `RESIDENT_MAX_ENTRIES` entries (SpecAttn's chunk-16 rows up to 256K keys;
token rows up to 16K): one program per row (m, r) loads its row once, maps it to the int32 keys
of the other kernels (signed order = float order) and runs the search on registers, one block
reduction per step and no memory traffic:

- **exact**: a binary search for the largest key θ with `stat(key >= θ) >= target` (stat =
  mass, or count for top-k), from `[min int32, key(max) + 1)`: at most 32 steps, each one
  compare-select-sum over the row. Same θ as the row and split kernels' 16-way search in exact
  arithmetic (fp32 summation order of the mass differs);
- **paper** (`iters`, top-p only): the paper's value bisection on [0, max], keeping θ_low;

then the mask `key >= θ`, θ and the kept count. Pooled (P > 1) or chunked (chunk > 1) rows are
first summed into a float32 scratch row by `pool_kernel` (one more launch, all programs in
parallel); plain rows are read where they are.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sas.methods.threshold_triton import RESIDENT_MAX_ENTRIES, _keys, _pooled
from sas.methods.direct_launch import DirectLaunch

#: entries per pooling program, and the most scores one program sums at once (entries x chunk)
POOL_BLOCK = 256
POOL_TILE = 65536


@triton.jit
def pool_kernel(X, Y, R, P, N, NC, STRIDE_M, STRIDE_R, STRIDE_P,
                CHUNK: tl.constexpr, CHUNK_P2: tl.constexpr, BLOCK: tl.constexpr):
    """Y [rows, NC] float32: the chunk sums of row pid0 summed over its P pooled rows, entries
    [pid1 BLOCK, (pid1 + 1) BLOCK)."""
    row = tl.program_id(0)
    c0 = tl.program_id(1) * BLOCK
    base = (row // R).to(tl.int64) * STRIDE_M + (row % R) * STRIDE_R
    y = _pooled(X, base, c0, N, P, STRIDE_P, CHUNK, CHUNK_P2, BLOCK)
    cs = c0 + tl.arange(0, BLOCK)
    tl.store(Y + row.to(tl.int64) * NC + cs, y, mask=cs < NC)


@triton.jit
def _stat(key, cand, COUNT: tl.constexpr):
    """Count (COUNT) or mass of the entries with key >= cand (> min int32)."""
    hit = key >= cand
    if COUNT:
        return tl.sum(hit.to(tl.float32), 0)
    return tl.sum(tl.where(hit & (key >= 0), key.to(tl.float32, bitcast=True), 0.0), 0)


@triton.jit
def resident_select_kernel(Y, MASK, THETA, KEPT, R, NC, STRIDE_M, STRIDE_R, VALUE,
                           COUNT: tl.constexpr, ITERS: tl.constexpr, BLOCK: tl.constexpr):
    """Row pid0 = m R + r of Y (entries at m STRIDE_M + r STRIDE_R + [0, NC), any float dtype):
    the threshold search on registers, then mask [rows, NC] int8, θ and the kept count."""
    row = tl.program_id(0)
    cs = tl.arange(0, BLOCK)
    okc = cs < NC
    base = (row // R).to(tl.int64) * STRIDE_M + (row % R) * STRIDE_R
    y = tl.load(Y + base + cs, mask=okc, other=0.0).to(tl.float32)
    y = tl.where(y == 0.0, 0.0, y)          # -0.0 is 0.0, as in the reference (and the pooling kernels' 0.0 + x)
    if COUNT:
        target = tl.minimum(VALUE, NC * 1.0)
    else:
        target = VALUE * tl.sum(tl.where(okc, tl.maximum(y, 0.0), 0.0), 0)
    ymax = tl.max(tl.where(okc, y, -float("inf")), 0)
    # only the int32 keys stay live (one register an entry): a non-negative key is the float's
    # own bits, so an entry's mass max(y, 0) is read back from its key; absent entries get the
    # smallest key, below every candidate (mid > lo >= min int32)
    key = tl.where(okc, _keys(y), -2147483648).to(tl.int32)
    if ITERS > 0:
        lo_v = 0.0
        hi_v = ymax
        for _ in range(ITERS):
            mid = (lo_v + hi_v) * 0.5
            short = _stat(key, _keys(mid).to(tl.int32), False) < target
            hi_v = tl.where(short, mid, hi_v)
            lo_v = tl.where(short, lo_v, mid)
        theta_key = _keys(lo_v)
    else:
        lo = -2147483648 + 0 * row.to(tl.int64)         # pred(lo) holds: every entry is >= lo
        hi = _keys(ymax) + 1                             # exclusive: nothing above the max
        while hi - lo > 1:
            mid = lo + (hi - lo) // 2                    # < hi <= 2^31 - 1: an int32
            held = _stat(key, mid.to(tl.int32), COUNT) >= target
            lo = tl.where(held, mid, lo)
            hi = tl.where(held, hi, mid)
        theta_key = lo
    keep = okc & (key >= theta_key)
    tl.store(MASK + row.to(tl.int64) * NC + cs, keep.to(tl.int8), mask=okc)
    tk = theta_key.to(tl.int32)
    tb = tl.where(tk < 0, tk ^ 0x7FFFFFFF, tk)
    tl.store(THETA + row, tb.to(tl.float32, bitcast=True))
    tl.store(KEPT + row, tl.sum(keep.to(tl.int32), 0))


#: entries a thread of the resident program holds (its warps: 1 to 32)
ENTRIES_PER_THREAD = 32


def resident_warps(nc: int) -> int:
    """Warps of the resident program: about ENTRIES_PER_THREAD entries a thread."""
    return max(1, min(32, triton.next_power_of_2(max(nc, 1)) // (32 * ENTRIES_PER_THREAD)))


_POOL = DirectLaunch(pool_kernel)
_SELECT = DirectLaunch(resident_select_kernel)


def run_resident(scores: torch.Tensor, value: float, count: bool, iters: int | None, chunk: int,
                 num_warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Host side of the resident selection (arguments checked by `threshold_select`, at most
    RESIDENT_MAX_ENTRIES entries a row): -> mask [M, R, Nc] int8, theta [M, R] float32, kept
    [M, R] int32."""
    m, r, pp, n = scores.shape
    nc = -(-n // chunk)
    rows = m * r
    dev = scores.device
    if pp == 1 and chunk == 1:
        y, strides = scores, (scores.stride(0), scores.stride(1))
    else:
        y = torch.empty(rows, nc, dtype=torch.float32, device=dev)
        chunk_p2 = triton.next_power_of_2(chunk)
        blk = max(1, min(POOL_BLOCK, triton.next_power_of_2(nc), POOL_TILE // chunk_p2))   # [blk, chunk_p2] tiles
        _POOL((rows, triton.cdiv(nc, blk)),
              (scores, y, r, pp, n, nc, scores.stride(0), scores.stride(1), scores.stride(2)),
              dict(CHUNK=chunk, CHUNK_P2=chunk_p2, BLOCK=blk))
        strides = (r * nc, nc)
    mask = torch.empty(m, r, nc, dtype=torch.int8, device=dev)
    theta = torch.empty(m, r, dtype=torch.float32, device=dev)
    kept = torch.empty(m, r, dtype=torch.int32, device=dev)
    paper = iters is not None and not count
    _SELECT((rows,), (y, mask, theta, kept, r, nc, *strides, value),
            dict(COUNT=count, ITERS=iters if paper else 0, BLOCK=triton.next_power_of_2(max(nc, 16))),
            dict(num_warps=num_warps or resident_warps(nc)))
    return mask, theta, kept


__all__ = ["ENTRIES_PER_THREAD", "POOL_BLOCK", "POOL_TILE", "pool_kernel", "resident_select_kernel", "resident_warps",
           "run_resident"]
