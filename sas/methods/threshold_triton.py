"""Sorting-free threshold selection (top-p / top-k) as one Triton kernel; the definition and the
sort-based reference are `sas.methods.threshold`.

One program per (output row m, unioned row r) searches the row's threshold without sorting:

- **exact** (default): the pooled scores are mapped to int32 keys whose signed order is the
  float order (`bits` for x >= 0, `bits ^ 0x7fffffff` below), and the largest key θ with
  `stat(key >= θ) >= target` (stat = mass or count) is found by a 16-way search: each pass
  over the row evaluates 15 thresholds splitting the current key interval in 16 and keeps the
  sub-interval where the predicate flips, so 8 passes pin down one of 2^32 keys. The result is
  the sort-based threshold exactly (up to fp32 summation order at the boundary).
- **paper** (`iters`, top-p only): the paper's value bisection on [0, max], `iters` passes,
  keeping θ_low (always at least mass p; spec pitfall 1).

Every pass re-reads the row (pooling the P rows and the chunk's keys on the fly, in fp32);
the final pass writes `key >= θ` into the int8 mask `[M, R, Nc]` (the union over R is one
torch `any`), θ and the kept count.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sas.errors import KernelError
from sas.methods.threshold import Selection, check_request, check_scores

BLOCK_C = 256
#: `threshold_select` methods: the row held in registers, rows split over many programs, one
#: program per row streaming its row, or `auto`
METHODS = ("auto", "resident", "split", "row")
#: `auto` splits rows of at least this many entries that the resident kernel does not take (H100,
#: 128 rows: the split kernel's ~10 launches cost more than they save below 32K entries against
#: the row kernel; docs/specattn.md); with RESIDENT_MAX_ENTRIES above it, `auto` never takes
#: the row kernel
SPLIT_MIN_ENTRIES = 32768
#: rows of at most this many entries fit the resident kernel (32 warps, 128 entries a thread)
RESIDENT_MAX_ENTRIES = 131072


@triton.jit
def _pooled(X, row_base, c0, N, P, STRIDE_P, CHUNK: tl.constexpr, CHUNK_P2: tl.constexpr, BLOCK: tl.constexpr):
    """fp32 [BLOCK] chunk sums of chunks c0 .. c0 + BLOCK - 1, summed over the P pooled rows."""
    cs = c0 + tl.arange(0, BLOCK)
    t = tl.arange(0, CHUNK_P2)
    pos = cs[:, None] * CHUNK + t[None, :]
    ok = (pos < N) & (t[None, :] < CHUNK)
    acc = tl.zeros([BLOCK], tl.float32)
    for pp in range(0, P):
        x = tl.load(X + row_base + pp * STRIDE_P + pos, mask=ok, other=0.0).to(tl.float32)
        acc += tl.sum(x, 1)
    return acc


@triton.jit
def _keys(y):
    bits = y.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)


@triton.jit
def threshold_select_kernel(X, MASK, THETA, KEPT, R, P, N, NC, STRIDE_M, STRIDE_R, STRIDE_P, VALUE,
                            COUNT: tl.constexpr, ITERS: tl.constexpr, CHUNK: tl.constexpr, CHUNK_P2: tl.constexpr,
                            BLOCK: tl.constexpr):
    m = tl.program_id(0)
    lanes = tl.arange(0, 16)
    for r in range(tl.program_id(1), tl.program_id(1) + 1):
        base = m.to(tl.int64) * STRIDE_M + r * STRIDE_R
        # total mass (top-p) and max (paper mode)
        tot = 0.0
        ymax = -float("inf")
        for c0 in range(0, NC, BLOCK):
            y = _pooled(X, base, c0, N, P, STRIDE_P, CHUNK, CHUNK_P2, BLOCK)
            okc = (c0 + tl.arange(0, BLOCK)) < NC
            tot += tl.sum(tl.where(okc, tl.maximum(y, 0.0), 0.0), 0)
            ymax = tl.maximum(ymax, tl.max(tl.where(okc, y, -float("inf")), 0))
        if COUNT:
            target = tl.minimum(VALUE, NC * 1.0)
        else:
            target = VALUE * tot
        if ITERS > 0:
            lo_v = 0.0
            hi_v = ymax
            for _ in range(ITERS):
                mid = (lo_v + hi_v) * 0.5
                mass = 0.0
                for c0 in range(0, NC, BLOCK):
                    y = _pooled(X, base, c0, N, P, STRIDE_P, CHUNK, CHUNK_P2, BLOCK)
                    okc = (c0 + tl.arange(0, BLOCK)) < NC
                    mass += tl.sum(tl.where(okc & (y >= mid), tl.maximum(y, 0.0), 0.0), 0)
                short = mass < target
                hi_v = tl.where(short, mid, hi_v)
                lo_v = tl.where(short, lo_v, mid)
            theta_key = _keys(lo_v)
        else:
            lo = -2147483648 + 0 * m.to(tl.int64)         # pred(lo) holds: every entry is >= lo
            hi = _keys(ymax) + 1                           # exclusive: nothing above the max
            for _ in range(8):
                step = (hi - lo + 15) // 16
                cand = lo + (lanes + 1).to(tl.int64) * step
                valid = (lanes < 15) & (cand < hi)
                stat = tl.zeros([16], tl.float32)
                for c0 in range(0, NC, BLOCK):
                    y = _pooled(X, base, c0, N, P, STRIDE_P, CHUNK, CHUNK_P2, BLOCK)
                    okc = (c0 + tl.arange(0, BLOCK)) < NC
                    key = _keys(y)
                    if COUNT:
                        w = tl.where(okc, 1.0, 0.0)
                    else:
                        w = tl.where(okc, tl.maximum(y, 0.0), 0.0)
                    hit = key[:, None] >= cand[None, :]
                    stat += tl.sum(tl.where(hit, w[:, None], 0.0), 0)
                ok = valid & (stat >= target)
                new_lo = tl.max(tl.where(ok, cand, lo), 0)
                new_hi = tl.min(tl.where(valid & ~ok, cand, hi), 0)
                lo = new_lo
                hi = new_hi
            theta_key = lo
        kept = 0
        for c0 in range(0, NC, BLOCK):
            cs = c0 + tl.arange(0, BLOCK)
            okc = cs < NC
            y = _pooled(X, base, c0, N, P, STRIDE_P, CHUNK, CHUNK_P2, BLOCK)
            keep = okc & (_keys(y) >= theta_key)
            kept += tl.sum(keep.to(tl.int32), 0)
            tl.store(MASK + (m.to(tl.int64) * R + r) * NC + cs, keep.to(tl.int8), mask=okc)
        tk = theta_key.to(tl.int32)
        tb = tl.where(tk < 0, tk ^ 0x7FFFFFFF, tk)
        tl.store(THETA + m * R + r, tb.to(tl.float32, bitcast=True))
        tl.store(KEPT + m * R + r, kept)


def threshold_select(scores: torch.Tensor, *, p: float | None = None, k: int | None = None, chunk: int = 1,
                     iters: int | None = None, block: int = BLOCK_C, num_warps: int = 4, method: str = "auto",
                     splits: int | None = None) -> Selection:
    """The selection of `sas.methods.threshold` on the Triton kernel: scores [M, R, P, N]
    (fp32 / fp16 / bf16; any strides with a unit key stride) -> `Selection` with mask [M, Nc]
    bool, theta [M, R] float32, kept [M, R] int32.

    `method="resident"`: one program per row holding the row in registers, a binary search
    with one block reduction a step (`sas.methods.threshold_resident_triton`; rows of at most
    `RESIDENT_MAX_ENTRIES` entries after chunking); `method="split"`: each row split over
    `splits` programs (default: about 2048 programs in all), one launch per search pass
    (`sas.methods.threshold_split_triton`); `method="row"`: one program per row streaming it
    (`threshold_select_kernel`); `method="auto"` (default): resident up to
    `RESIDENT_MAX_ENTRIES` entries, else split from `SPLIT_MIN_ENTRIES` and row below (the row
    kernel is reached only where RESIDENT_MAX_ENTRIES is lowered below SPLIT_MIN_ENTRIES).
    `block` and `num_warps` apply to the row and split kernels (the resident kernel sizes
    itself). Same θ in exact arithmetic, same set up to fp32 summation order of the mass at the
    p boundary."""
    where = "threshold_select"
    p, k, chunk, iters = check_request(p, k, chunk, iters, where)
    scores = check_scores(scores, where)
    if method not in METHODS:
        raise KernelError(f"{where}: method must be one of {METHODS}, got {method!r}")
    if splits is not None and (isinstance(splits, bool) or not isinstance(splits, int) or splits < 1):
        raise KernelError(f"{where}: splits must be None (automatic) or a positive integer, got {splits!r}")
    if isinstance(block, bool) or not isinstance(block, int) or block < 16 or block & (block - 1):
        raise KernelError(f"{where}: block must be a power of two >= 16 (entries per tile), got {block!r}")
    if scores.stride(-1) != 1:
        scores = scores.contiguous()
    m, r, pp, n = scores.shape
    nc = -(-n // chunk)
    if method == "resident" and nc > RESIDENT_MAX_ENTRIES:
        raise KernelError(f"{where}: method='resident' holds a row of at most {RESIDENT_MAX_ENTRIES} entries "
                          f"(after chunking) in registers, got {nc}; use method='split', 'row' or 'auto'")
    blk = max(16, min(block, triton.next_power_of_2(nc)))
    count = k is not None or p == 1.0          # p = 1 keeps every entry: the count predicate with k = Nc
    value = float(k) if k is not None else (float(nc) if p == 1.0 else p)
    if method == "resident" or (method == "auto" and nc <= RESIDENT_MAX_ENTRIES):
        from sas.methods.threshold_resident_triton import run_resident
        mask, theta, kept = run_resident(scores, value, count, None if count else iters, chunk)
        return Selection(mask.bool().any(1), theta, kept)
    if method == "split" or (method == "auto" and nc >= SPLIT_MIN_ENTRIES):
        from sas.methods.threshold_split_triton import run_split
        mask, theta, kept = run_split(scores, value, count, None if count else iters, chunk, blk, num_warps, splits)
        return Selection(mask.bool().any(1), theta, kept)
    mask = torch.empty(m, r, nc, dtype=torch.int8, device=scores.device)
    theta = torch.empty(m, r, dtype=torch.float32, device=scores.device)
    kept = torch.empty(m, r, dtype=torch.int32, device=scores.device)
    threshold_select_kernel[(m, r)](
        scores, mask, theta, kept, r, pp, n, nc, scores.stride(0), scores.stride(1), scores.stride(2),
        value, COUNT=count, ITERS=0 if count else (iters or 0), CHUNK=chunk, CHUNK_P2=triton.next_power_of_2(chunk), BLOCK=blk,
        num_warps=num_warps)
    return Selection(mask.bool().any(1), theta, kept)


__all__ = ["BLOCK_C", "METHODS", "RESIDENT_MAX_ENTRIES", "SPLIT_MIN_ENTRIES", "threshold_select",
           "threshold_select_kernel"]
