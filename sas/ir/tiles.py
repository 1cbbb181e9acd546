"""Block-sparse tile maps for prefill: which BLOCK_M x BLOCK_N tiles of the attention matrix
are empty, full or partial, in CSR form per query block.

Classification is exact: a first pass reasons on index intervals per primitive for every tile
at once (length-independent cost per tile, no cell evaluated), giving EMPTY / FULL / PARTIAL
when that is certain and UNKNOWN otherwise (e.g. `a * b` of two partial tiles); a second pass
settles the UNKNOWN tiles only: it splits them into sub-boxes for the first pass, recursively,
and evaluates the exact oracle `pattern.evaluate` on sub-boxes of a few cells (vectorized,
batched), stopping at a tile once it holds cells on and off.
So a tile called full has every in-bounds cell on, a tile called empty has none on, and every
tile holding an on-cell is listed.

Query rows may be a suffix of the keys: query row r is at absolute position `q_offset + r`.
A tile whose key columns run past `k_len` is never called full (its loads need a bounds mask).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sas.errors import PatternError
from sas.lang.pattern import MAX_INDEX, And, Not, Or, Pattern, Spread
from sas.lang.primitives import Causal, Diag, Dynamic, Rect

EMPTY, FULL, PARTIAL, UNKNOWN = 0, 1, 2, 3
#: Most tiles one map classifies (int64 index arrays of this many entries are built).
TILE_LIMIT = 1 << 26


@dataclass(frozen=True, eq=False)
class TileMap:
    """CSR lists of the non-empty tiles of each query block.

    `full_cols[full_rowptr[m]:full_rowptr[m + 1]]` are the key-block indices of the tiles of
    query block m whose cells are all on (computed without a mask); `part_*` likewise for
    tiles with some cells on (computed with the mask expression). Arrays are int32.
    """

    q_len: int
    k_len: int
    q_offset: int
    block_m: int
    block_n: int
    full_rowptr: np.ndarray
    full_cols: np.ndarray
    part_rowptr: np.ndarray
    part_cols: np.ndarray

    @property
    def num_q_blocks(self) -> int:
        return len(self.full_rowptr) - 1

    @property
    def num_k_blocks(self) -> int:
        return -(-self.k_len // self.block_n)

    @property
    def num_full(self) -> int:
        return int(self.full_rowptr[-1])

    @property
    def num_partial(self) -> int:
        return int(self.part_rowptr[-1])

    @property
    def num_empty(self) -> int:
        return self.num_q_blocks * self.num_k_blocks - self.num_full - self.num_partial

    def counts(self) -> dict[str, int]:
        return {"full": self.num_full, "partial": self.num_partial, "empty": self.num_empty,
                "total": self.num_q_blocks * self.num_k_blocks}

    def block_order(self) -> np.ndarray:
        """Query blocks, most tiles first (int32): launching heavy blocks first balances SMs."""
        work = np.diff(self.full_rowptr) + np.diff(self.part_rowptr)
        return np.argsort(-work, kind="stable").astype(np.int32)

    def classes(self) -> np.ndarray:
        """Dense [num_q_blocks, num_k_blocks] array of EMPTY / FULL / PARTIAL (for tests, plots)."""
        out = np.full((self.num_q_blocks, self.num_k_blocks), EMPTY, dtype=np.int8)
        for m in range(self.num_q_blocks):
            out[m, self.full_cols[self.full_rowptr[m]:self.full_rowptr[m + 1]]] = FULL
            out[m, self.part_cols[self.part_rowptr[m]:self.part_rowptr[m + 1]]] = PARTIAL
        return out


# ---------------------------------------------------------------------------------------------
# Interval pass. Every function gets inclusive index ranges r0..r1 (rows) and c0..c1 (cols),
# int64 arrays of one shape, and returns an int8 array of classes of the same shape.


def _and(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.full(a.shape, UNKNOWN, dtype=np.int8)
    out = np.where(a == FULL, b, out)
    out = np.where(b == FULL, a, out)
    out = np.where((a == EMPTY) | (b == EMPTY), EMPTY, out)
    return out.astype(np.int8)


def _or(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.full(a.shape, UNKNOWN, dtype=np.int8)
    out = np.where(a == EMPTY, b, out)
    out = np.where(b == EMPTY, a, out)
    out = np.where((a == FULL) | (b == FULL), FULL, out)
    return out.astype(np.int8)


def _not(a: np.ndarray) -> np.ndarray:
    return np.where(a == FULL, EMPTY, np.where(a == EMPTY, FULL, a)).astype(np.int8)


def _count_congruent(lo: np.ndarray, hi: np.ndarray, residue: int, mod: int) -> np.ndarray:
    """How many x in [lo, hi] (inclusive; empty when hi < lo) have x % mod == residue % mod."""
    if mod == 1:
        return np.maximum(hi - lo + 1, 0)
    r = residue % mod
    # numbers <= x congruent to r: floor((x - r) / mod) + 1 (floor division handles x < r)
    upto = lambda x: np.floor_divide(x - r, mod) + 1  # noqa: E731
    return np.where(hi >= lo, upto(hi) - upto(lo - 1), 0)


def _axis_count(lo: np.ndarray, hi: np.ndarray, rng, stride: int, offset: int) -> np.ndarray:
    a, b = rng
    lo2 = lo if a is None else np.maximum(lo, a)
    hi2 = hi if b is None else np.minimum(hi, b - 1)
    return _count_congruent(lo2, hi2, (a or 0) + offset, stride)


def _classify(p: Pattern, r0, r1, c0, c1) -> np.ndarray:
    if isinstance(p, Rect):
        nr = _axis_count(r0, r1, p.rows, p.stride[0], p.offset[0])
        nc = _axis_count(c0, c1, p.cols, p.stride[1], p.offset[1])
        full = (nr == r1 - r0 + 1) & (nc == c1 - c0 + 1)
        empty = (nr == 0) | (nc == 0)
        return np.where(empty, EMPTY, np.where(full, FULL, PARTIAL)).astype(np.int8)
    if isinstance(p, Diag):
        # d = i - j - offset takes every integer value in [dlo, dhi] on a rectangle.
        dlo = r0 - c1 - p.offset
        dhi = r1 - c0 - p.offset
        lo = np.maximum(dlo, 0)
        hi = dhi if p.size is None else np.minimum(dhi, p.size - 1)
        n = _count_congruent(lo, hi, 0, p.stride)
        # Full when every value of d in the range is on; with stride > 1 that needs a single
        # value, i.e. a single cell.
        full = n == dhi - dlo + 1
        return np.where(n == 0, EMPTY, np.where(full, FULL, PARTIAL)).astype(np.int8)
    if isinstance(p, Dynamic):
        return np.full(np.shape(r0), FULL, dtype=np.int8)
    if isinstance(p, (And, Or)):
        # Fold the terms, stopping once every tile is settled (all empty / all full).
        combine, settled = (_and, EMPTY) if isinstance(p, And) else (_or, FULL)
        acc = _classify(p.terms[0], r0, r1, c0, c1)
        for t in p.terms[1:]:
            if np.all(acc == settled):
                return acc
            acc = combine(acc, _classify(t, r0, r1, c0, c1))
        return _resolve_diagonal(p, acc, r0, r1, c0, c1)
    if isinstance(p, Not):
        return _not(_classify(p.a, r0, r1, c0, c1))
    if isinstance(p, Spread):
        h, w = p.shape
        layout = _classify(p.layout, r0 // h, r1 // h, c0 // w, c1 // w)
        if np.all(layout == EMPTY):
            return layout
        # The unit sees the residues (i % h, j % w) of the tile's cells: on each axis one
        # interval, or two when the tile wraps a block boundary, or the whole axis. Their
        # product is exactly what the tile covers, so classifying the unit on it is exact.
        (ra0, ra1), (rb0, rb1) = _residues(r0, r1, h)
        (ca0, ca1), (cb0, cb1) = _residues(c0, c1, w)
        pieces = [_classify(p.unit, x0, x1, y0, y1)
                  for (x0, x1) in ((ra0, ra1), (rb0, rb1)) for (y0, y1) in ((ca0, ca1), (cb0, cb1))]
        return _and(layout, _union(pieces))
    raise PatternError(f"tile classification: unknown pattern node {type(p).__name__}")


def _diagonal_only(p: Pattern) -> bool:
    """True when membership depends on i - j alone (Diags under and/or/not)."""
    if isinstance(p, Diag):
        return True
    if isinstance(p, (And, Or, Not)):
        return all(_diagonal_only(c) for c in p.children())
    return False


def _resolve_diagonal(p: Pattern, cls: np.ndarray, r0, r1, c0, c1) -> np.ndarray:
    """Settle UNKNOWN tiles of a pattern that depends on i - j alone: a rectangle meets every
    value of i - j in [r0 - c1, r1 - c0], so evaluating those values (a few hundred per tile,
    not a tile's cells) classifies it exactly."""
    unk = cls == UNKNOWN
    if not unk.any() or not _diagonal_only(p):
        return cls
    dlo, dhi = (r0 - c1)[unk], (r1 - c0)[unk]
    width = int((dhi - dlo).max()) + 1
    shift = max(0, -int(dlo.min()))
    out = cls.copy()
    res = np.empty(dlo.shape, dtype=np.int8)
    per = max(1, (1 << 22) // width)
    ar = np.arange(width, dtype=np.int64)
    for s in range(0, len(dlo), per):
        d = dlo[s:s + per, None] + ar[None, :]
        valid = d <= dhi[s:s + per, None]
        on = np.asarray(p.evaluate(d + shift, np.full_like(d, shift)), dtype=bool)
        anyon = np.any(on & valid, axis=1)
        allon = np.all(on | ~valid, axis=1)
        res[s:s + per] = np.where(~anyon, EMPTY, np.where(allon, FULL, PARTIAL))
    out[unk] = res
    return out


def _residues(lo: np.ndarray, hi: np.ndarray, h: int):
    """Residues mod h of [lo, hi] as two inclusive intervals (the second repeats the first
    when one suffices)."""
    whole = hi - lo + 1 >= h
    same = (lo // h == hi // h) & ~whole
    a0 = np.where(whole, 0, lo % h)
    a1 = np.where(whole | ~same, h - 1, hi % h)
    b0 = np.where(whole | same, a0, 0)
    b1 = np.where(whole | same, a1, hi % h)
    return (a0, a1), (b0, b1)


def _union(pieces: list[np.ndarray]) -> np.ndarray:
    """Class of a union of regions from the classes of the regions."""
    st = np.stack(pieces)
    anyp = np.any(st == PARTIAL, axis=0)
    anyu = np.any(st == UNKNOWN, axis=0)
    allf = np.all(st == FULL, axis=0)
    alle = np.all(st == EMPTY, axis=0)
    out = np.where(allf, FULL, np.where(alle, EMPTY, np.where(anyu, UNKNOWN, PARTIAL)))
    return np.where(anyp, PARTIAL, out).astype(np.int8)


# ---------------------------------------------------------------------------------------------


def _check_pos_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
        raise PatternError(f"tile_map: {name} must be a positive integer, got {v!r}")
    if v > MAX_INDEX:
        raise PatternError(f"tile_map: {name} must be at most 2**61 (the largest index sas handles), got {v}")
    return int(v)


def classify_boxes(pattern: Pattern, r0: np.ndarray, r1: np.ndarray, c0: np.ndarray, c1: np.ndarray, *,
                   refine: bool = True, max_cells: int = 1 << 22) -> np.ndarray:
    """Classes (EMPTY / FULL / PARTIAL, int8) of cell boxes `[r0, r1] x [c0, c1]` (inclusive
    bounds, int64 arrays of one shape, every box non-empty). With `refine` the interval pass's
    UNKNOWN boxes are settled exactly, by sub-boxes down to a few cells evaluated one by one
    (`_refine`; `max_cells` cells' worth of boxes at a time); without it they are called
    PARTIAL."""
    r0, r1, c0, c1 = (np.asarray(x, dtype=np.int64) for x in (r0, r1, c0, c1))
    cls = _classify(pattern, r0, r1, c0, c1)
    cls = np.array(np.broadcast_to(cls, r0.shape), dtype=np.int8)
    if not refine:
        return np.where(cls == UNKNOWN, PARTIAL, cls).astype(np.int8)
    unk = np.flatnonzero(cls == UNKNOWN)
    if not unk.size:
        return cls
    flat = cls.reshape(-1)
    fr0, fr1, fc0, fc1 = (x.reshape(-1)[unk] for x in (r0, r1, c0, c1))
    per = max(1, max_cells // int(((fr1 - fr0 + 1) * (fc1 - fc0 + 1)).max()))
    # Sub-boxes pay off near the boundaries of a pattern; a pattern UNKNOWN all over (a fine
    # stride, a product the interval pass cannot settle) costs more so than its cells. A probe
    # of the first boxes decides: when most of them had to be evaluated whole, the rest are too.
    probe = min(len(unk), _PROBE, per)
    flat[unk[:probe]], whole = _refine(pattern, fr0[:probe], fr1[:probe], fc0[:probe], fc1[:probe], max_cells)
    by_cells = 2 * whole > probe
    for s in range(probe, len(unk), per):
        sl = slice(s, s + per)
        if by_cells:
            flat[unk[sl]] = _evaluate(pattern, fr0[sl], fr1[sl], fc0[sl], fc1[sl], max_cells)
        else:
            flat[unk[sl]] = _refine(pattern, fr0[sl], fr1[sl], fc0[sl], fc1[sl], max_cells)[0]
    return cls


#: UNKNOWN boxes refined first to choose between sub-boxes and cells for the rest
_PROBE = 256


#: boxes of at most this many cells are settled by evaluating their cells
_CELL_BOXES = 16


def _refine(pattern: Pattern, r0, r1, c0, c1, max_cells: int) -> tuple[np.ndarray, int]:
    """Exact classes of boxes (1-D arrays of inclusive bounds) the interval pass left UNKNOWN:
    each is split into up to 4 x 4 sub-boxes and those are classified again, recursively, the
    UNKNOWN ones only, down to a few cells that are evaluated one by one (`_evaluate`). A box
    is PARTIAL as soon as one of its sub-boxes is (the interval pass calls a box PARTIAL only
    when it holds cells on and off) or it has both FULL and EMPTY sub-boxes; FULL (EMPTY) when
    every sub-box is. The same classes as evaluating every cell, for the cost of the cells
    near the boundaries of the pattern; a box whose UNKNOWN cells splitting does not halve has
    them evaluated at once (at most about twice the cost of its cells). The sub-boxes of all
    boxes never hold more cells than the boxes, so `max_cells` cells' worth of boxes bounds the
    memory. Returns the classes and how many boxes were evaluated whole."""
    n = len(r0)
    seen_full = np.zeros(n, dtype=bool)
    seen_empty = np.zeros(n, dtype=bool)
    mixed = np.zeros(n, dtype=bool)
    own = np.arange(n, dtype=np.int64)
    a0, a1, b0, b1 = r0, r1, c0, c1
    left = ((r1 - r0 + 1) * (c1 - c0 + 1)).astype(np.float64)   # cells still UNKNOWN per box
    whole = np.full(n, -1, dtype=np.int8)    # classes of boxes evaluated whole
    first = True

    def note(owner, c):
        mixed[owner[c == PARTIAL]] = True
        seen_full[owner[c == FULL]] = True
        seen_empty[owner[c == EMPTY]] = True

    while len(own):
        small = (a1 - a0 + 1) * (b1 - b0 + 1) <= _CELL_BOXES
        if small.any():
            note(own[small], _evaluate(pattern, a0[small], a1[small], b0[small], b1[small], max_cells))
        big = ~small
        own, a0, a1, b0, b1 = own[big], a0[big], a1[big], b0[big], b1[big]
        # 4 x 4 children: rows a0 + k * ceil(h / 4) .., likewise columns; empty ones dropped
        sh, sw = -(-(a1 - a0 + 1) // 4), -(-(b1 - b0 + 1) // 4)
        k = np.arange(4, dtype=np.int64)
        ca0 = (a0[:, None] + k[None, :] * sh[:, None])[:, :, None]
        cb0 = (b0[:, None] + k[None, :] * sw[:, None])[:, None, :]
        ca1 = np.minimum(ca0 + sh[:, None, None] - 1, a1[:, None, None])
        cb1 = np.minimum(cb0 + sw[:, None, None] - 1, b1[:, None, None])
        shape = (len(own), 4, 4)
        ca0, ca1, cb0, cb1 = (np.broadcast_to(x, shape).reshape(-1) for x in (ca0, ca1, cb0, cb1))
        cown = np.broadcast_to(own[:, None, None], shape).reshape(-1)
        ok = (ca0 <= ca1) & (cb0 <= cb1)
        cown, ca0, ca1, cb0, cb1 = cown[ok], ca0[ok], ca1[ok], cb0[ok], cb1[ok]
        c = np.array(np.broadcast_to(_classify(pattern, ca0, ca1, cb0, cb1), ca0.shape), dtype=np.int8)
        note(cown, c)
        done = mixed | (seen_full & seen_empty)
        keep = (c == UNKNOWN) & ~done[cown]
        own, a0, a1, b0, b1 = cown[keep], ca0[keep], ca1[keep], cb0[keep], cb1[keep]
        # A box whose UNKNOWN sub-boxes still hold more than half of its UNKNOWN cells (a fine
        # stride, a pattern UNKNOWN everywhere) is not helped by splitting: its cells are
        # evaluated now, so a box costs at most about twice its cells.
        now = np.bincount(own, weights=((a1 - a0 + 1) * (b1 - b0 + 1)).astype(np.float64), minlength=n)
        slow = 2 * now[own] > left[own]
        if slow.any():
            if first:
                # the whole box at once (long rows of cells evaluate faster than sub-boxes)
                o = np.unique(own[slow])
                whole[o] = _evaluate(pattern, r0[o], r1[o], c0[o], c1[o], max_cells)
            else:
                note(own[slow], _evaluate(pattern, a0[slow], a1[slow], b0[slow], b1[slow], max_cells))
            fast = ~slow
            own, a0, a1, b0, b1 = own[fast], a0[fast], a1[fast], b0[fast], b1[fast]
        left = now
        first = False
    mixed |= seen_full & seen_empty
    out = np.where(mixed, PARTIAL, np.where(seen_full, FULL, EMPTY)).astype(np.int8)
    return np.where(whole >= 0, whole, out).astype(np.int8), int((whole >= 0).sum())


def _evaluate(pattern: Pattern, fr0, fr1, fc0, fc1, max_cells: int) -> np.ndarray:
    """Classes of boxes (1-D arrays of inclusive bounds) from evaluating their cells."""
    out = np.empty(len(fr0), dtype=np.int8)
    h, w = int((fr1 - fr0).max()) + 1, int((fc1 - fc0).max()) + 1
    per = max(1, max_cells // (h * w))
    ar = np.arange(h, dtype=np.int64)
    ac = np.arange(w, dtype=np.int64)
    for s in range(0, len(fr0), per):
        rows = fr0[s:s + per, None] + ar[None, :]                           # [T, h]
        cols = fc0[s:s + per, None] + ac[None, :]                           # [T, w]
        rv = rows <= fr1[s:s + per, None]
        cv = cols <= fc1[s:s + per, None]
        # Clamp out-of-box indices to an in-box one (ignored below).
        rows = np.minimum(rows, fr1[s:s + per, None])
        cols = np.minimum(cols, fc1[s:s + per, None])
        on = np.asarray(pattern.evaluate(rows[:, :, None], cols[:, None, :]), dtype=bool)
        valid = rv[:, :, None] & cv[:, None, :]
        anyon = np.any(on & valid, axis=(1, 2))
        allon = np.all(on | ~valid, axis=(1, 2))
        out[s:s + per] = np.where(~anyon, EMPTY, np.where(allon, FULL, PARTIAL))
    return out


def check_tile_args(q_len, k_len, block_m, block_n, q_offset) -> tuple[int, int, int, int, int]:
    """Validated (q_len, k_len, block_m, block_n, q_offset); k_len None: q_len; q_offset None:
    k_len - q_len."""
    q_len = _check_pos_int("q_len", q_len)
    k_len = q_len if k_len is None else _check_pos_int("k_len", k_len)
    block_m = _check_pos_int("block_m", block_m)
    block_n = _check_pos_int("block_n", block_n)
    if q_offset is None:
        q_offset = k_len - q_len
    if isinstance(q_offset, bool) or not isinstance(q_offset, (int, np.integer)) or q_offset < 0:
        raise PatternError(f"tile_map: q_offset must be a non-negative integer, got {q_offset!r}")
    if q_offset + q_len > MAX_INDEX:
        raise PatternError(f"tile_map: q_offset + q_len must be at most 2**61 (the largest index sas "
                           f"handles), got {q_offset} + {q_len}")
    return q_len, k_len, block_m, block_n, int(q_offset)


def classify_tiles(pattern: Pattern, q_len: int, k_len: int | None = None, block_m: int = 128,
                   block_n: int = 64, q_offset: int | None = None, *, refine: bool = True,
                   max_cells: int = 1 << 22) -> np.ndarray:
    """Dense [num_q_blocks, num_k_blocks] int8 array of EMPTY / FULL / PARTIAL classes."""
    if not isinstance(pattern, Pattern):
        raise PatternError(f"tile_map: pattern must be a sas Pattern, got {type(pattern).__name__}")
    q_len, k_len, block_m, block_n, q_offset = check_tile_args(q_len, k_len, block_m, block_n, q_offset)
    # Only indices below the last query / key matter: the same pattern with small numbers.
    pattern = pattern.restrict(max(q_offset + q_len, k_len))
    nqb, nkb = -(-q_len // block_m), -(-k_len // block_n)
    if nqb * nkb > TILE_LIMIT:
        raise PatternError(f"tile_map: {q_len} queries x {k_len} keys in {block_m} x {block_n} tiles make "
                           f"{nqb} x {nkb} = {nqb * nkb} tiles, more than the limit {TILE_LIMIT}: use larger "
                           f"blocks or shorter sequences")
    m = np.arange(nqb, dtype=np.int64)[:, None]
    n = np.arange(nkb, dtype=np.int64)[None, :]
    r0 = np.broadcast_to(q_offset + m * block_m, (nqb, nkb))
    r1 = np.broadcast_to(q_offset + np.minimum((m + 1) * block_m, q_len) - 1, (nqb, nkb))
    c0 = np.broadcast_to(n * block_n, (nqb, nkb))
    c1 = np.broadcast_to(np.minimum((n + 1) * block_n, k_len) - 1, (nqb, nkb))
    cls = classify_boxes(pattern, r0, r1, c0, c1, refine=refine, max_cells=max_cells)
    if k_len % block_n:
        last = cls[:, nkb - 1]
        cls[:, nkb - 1] = np.where(last == FULL, PARTIAL, last)
    return cls


def tile_map(pattern: Pattern, q_len: int, k_len: int | None = None, block_m: int = 128,
             block_n: int = 64, q_offset: int | None = None) -> TileMap:
    """Classify every BLOCK_M x BLOCK_N tile of the (q_len x k_len) attention matrix.

    Query row r is at absolute position `q_offset + r` (default `k_len - q_len`: the queries
    are the last q_len keys). Returns full and partial tile lists in CSR form per query block.
    """
    k_len = q_len if k_len is None else k_len
    cls = classify_tiles(pattern, q_len, k_len, block_m, block_n, q_offset)
    if q_offset is None:
        q_offset = k_len - q_len
    full, part = cls == FULL, cls == PARTIAL

    def csr(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rowptr = np.zeros(mask.shape[0] + 1, dtype=np.int32)
        np.cumsum(mask.sum(axis=1), out=rowptr[1:])
        return rowptr, np.nonzero(mask)[1].astype(np.int32)

    fr, fc = csr(full)
    pr, pc = csr(part)
    return TileMap(int(q_len), int(k_len), int(q_offset), int(block_m), int(block_n), fr, fc, pr, pc)


def is_causal(pattern: Pattern, n: int) -> bool:
    """Exact check that no query i < n attends a key j > i (tile classes, refined exactly)."""
    upper = classify_tiles(pattern * Not(Causal()), n, n, block_m=256, block_n=256, q_offset=0)
    return bool((upper == EMPTY).all())
