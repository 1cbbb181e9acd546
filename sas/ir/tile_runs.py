"""Prefill tile schedules in run form, classified coarse to fine with memory bounded by the
number of runs rather than by the number of tiles.

`tile_map` classifies every BLOCK_M x BLOCK_N tile of the attention matrix at once: at a million
tokens and 64 x 64 tiles that is 2^28 tiles and tens of GB of temporaries. `tile_runs` gives the
same classification (`TileRuns.to_tile_map()` equals `tile_map` exactly) by one quadtree over
the whole matrix: a square box of tiles the interval pass calls EMPTY or FULL is settled for all
its tiles at once (a box called full has every in-bounds cell on, so each of its tiles does),
and only PARTIAL / UNKNOWN boxes are split, 4 x 4, down to single tiles, which are settled
exactly (`classify_boxes`: UNKNOWN tiles by sub-boxes down to a few cells). The work follows the
boundary of the pattern (a diagonal band: about n / tile boxes a level), not the area of the
matrix. The result is stored as runs of consecutive key
blocks per query block (`[start, stop)`), which stays small for the structured patterns sas
describes (one run of full tiles per row for a causal pattern, a few for a window plus sinks).

A schedule for the square `max_len x max_len` problem (queries = keys, `q_offset = 0`) gives the
schedule of every shorter square problem without reclassifying: `prefix(L)` keeps the first
query blocks, clips the runs, and turns a full tile of a ragged last key block into a partial
one (docs/architecture.md, "Tile schedules").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sas.errors import KernelError, PatternError
from sas.ir.tiles import EMPTY, FULL, PARTIAL, TileMap, check_tile_args, classify_boxes
from sas.lang.pattern import Pattern
from sas.limits import check_host_bytes, host_table_limit

#: Boxes classified per numpy call; bounds the temporaries of one band.
MAX_BOXES = 1 << 20
#: Tiles refined one by one at most before `tile_runs` gives up (a pattern whose every tile is
#: partial at a very long length); the message names the numbers.
MAX_LEAVES = 1 << 27
_SPLIT = 4   # children per axis when a box is split


@dataclass(frozen=True, eq=False)
class TileRuns:
    """Full and partial tiles per query block as runs of key blocks.

    Query block m's full tiles are the key blocks `a .. b-1` for each row `(a, b)` of
    `full_runs[full_ptr[m]:full_ptr[m + 1]]` (sorted, disjoint, not adjacent); likewise for the
    partial tiles. Query row r is at absolute position `q_offset + r`. Arrays are int32.
    """

    q_len: int
    k_len: int
    q_offset: int
    block_m: int
    block_n: int
    full_ptr: np.ndarray
    full_runs: np.ndarray
    part_ptr: np.ndarray
    part_runs: np.ndarray

    @property
    def num_q_blocks(self) -> int:
        return len(self.full_ptr) - 1

    @property
    def num_k_blocks(self) -> int:
        return -(-self.k_len // self.block_n)

    @property
    def num_full(self) -> int:
        return int((self.full_runs[:, 1].astype(np.int64) - self.full_runs[:, 0]).sum())

    @property
    def num_partial(self) -> int:
        return int((self.part_runs[:, 1].astype(np.int64) - self.part_runs[:, 0]).sum())

    def counts(self) -> dict[str, int]:
        total = self.num_q_blocks * self.num_k_blocks
        return {"full": self.num_full, "partial": self.num_partial,
                "empty": total - self.num_full - self.num_partial, "total": total}

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.full_ptr, self.full_runs, self.part_ptr, self.part_runs))

    def to_tile_map(self) -> TileMap:
        """The CSR tile lists (`sas.ir.tiles.TileMap`) these runs stand for."""
        fr, fc = _expand(self.full_ptr, self.full_runs)
        pr, pc = _expand(self.part_ptr, self.part_runs)
        return TileMap(self.q_len, self.k_len, self.q_offset, self.block_m, self.block_n, fr, fc, pr, pc)

    def prefix(self, length: int) -> TileRuns:
        """The schedule of the `length x length` problem (queries = keys, offset 0) derived from
        this one (which must be square with offset 0 and at least as long). Tiles the longer
        problem calls partial stay partial (their mask test is exact), so the result may list
        a tile whose in-bounds cells turn out all on or all off at `length`; full tiles of a
        ragged last key block become partial (their loads need a bounds mask)."""
        if self.q_offset != 0 or self.q_len != self.k_len:
            raise KernelError("TileRuns.prefix: the schedule must be square (queries = keys) with q_offset 0")
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or not 0 < length <= self.q_len:
            raise KernelError(f"TileRuns.prefix: length must be an integer in 1..{self.q_len}, got {length!r}")
        length = int(length)
        nqb = -(-length // self.block_m)
        nkb = -(-length // self.block_n)
        rows_f, a_f, b_f = _rows_of(self.full_ptr[:nqb + 1], self.full_runs)
        rows_p, a_p, b_p = _rows_of(self.part_ptr[:nqb + 1], self.part_runs)
        b_f, b_p = np.minimum(b_f, nkb), np.minimum(b_p, nkb)
        if length % self.block_n:
            cut = (b_f == nkb) & (a_f < nkb)     # (a run past the last key block is empty once clipped)
            rows_p = np.concatenate([rows_p, rows_f[cut]])
            a_p = np.concatenate([a_p, np.full(int(cut.sum()), nkb - 1, dtype=np.int64)])
            b_p = np.concatenate([b_p, np.full(int(cut.sum()), nkb, dtype=np.int64)])
            b_f = np.where(cut, nkb - 1, b_f)
        fp, fr = _normalize(rows_f, a_f, b_f, nqb)
        pp, pr = _normalize(rows_p, a_p, b_p, nqb)
        return TileRuns(length, length, 0, self.block_m, self.block_n, fp, fr, pp, pr)


def _expand(ptr: np.ndarray, runs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR (rowptr, cols) of the key blocks the runs cover."""
    lengths = runs[:, 1].astype(np.int64) - runs[:, 0]
    cum = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=cum[1:])
    rowptr = cum[ptr.astype(np.int64)].astype(np.int32)
    total = int(cum[-1])
    starts = np.repeat(runs[:, 0].astype(np.int64), lengths)
    first = np.repeat(cum[:-1], lengths)
    cols = (starts + np.arange(total, dtype=np.int64) - first).astype(np.int32)
    return rowptr, cols


def _rows_of(ptr: np.ndarray, runs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, start, stop) of every run of the rows ptr covers."""
    n = int(ptr[-1])
    rows = np.repeat(np.arange(len(ptr) - 1, dtype=np.int64), np.diff(ptr).astype(np.int64))
    return rows, runs[:n, 0].astype(np.int64), runs[:n, 1].astype(np.int64)


def _cat(xs: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(xs).astype(np.int64) if xs else np.zeros(0, dtype=np.int64)


def _merge(rows: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Runs (row, start, stop): empty runs dropped, sorted by row and start, adjacent runs merged
    (int32: row and key-block indices fit)."""
    keep = b > a
    rows, a, b = rows[keep], a[keep], b[keep]
    order = np.lexsort((a, rows))
    rows, a, b = rows[order], a[order], b[order]
    if len(rows):
        new = np.ones(len(rows), dtype=bool)
        new[1:] = (rows[1:] != rows[:-1]) | (a[1:] != b[:-1])
        start = np.flatnonzero(new)
        end = np.append(start[1:], len(rows)) - 1
        rows, a, b = rows[start], a[start], b[end]
    return rows.astype(np.int32), a.astype(np.int32), b.astype(np.int32)


def _csr(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]], nrows: int) -> tuple[np.ndarray, np.ndarray]:
    """(ptr, runs) of merged runs given in row order (one part per band of rows)."""
    count = np.zeros(nrows, dtype=np.int64)
    runs = np.empty((sum(len(p[0]) for p in parts), 2), dtype=np.int32)
    at = 0
    for rows, a, b in parts:
        count += np.bincount(rows, minlength=nrows)[:nrows]
        runs[at:at + len(rows), 0] = a
        runs[at:at + len(rows), 1] = b
        at += len(rows)
    ptr = np.zeros(nrows + 1, dtype=np.int32)
    np.cumsum(count, out=ptr[1:])
    return ptr, runs


def _normalize(rows: np.ndarray, a: np.ndarray, b: np.ndarray, nrows: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR of runs per row: empty runs dropped, sorted, adjacent runs merged."""
    return _csr([_merge(rows, a, b)], nrows)


def tile_runs(pattern: Pattern, q_len: int, k_len: int | None = None, block_m: int = 128,
              block_n: int = 64, q_offset: int | None = None, *, max_boxes: int = MAX_BOXES) -> TileRuns:
    """Classify the tiles of the (q_len x k_len) attention matrix, coarse to fine (module doc);
    the same tiles as `sas.ir.tiles.tile_map`, as runs."""
    if not isinstance(pattern, Pattern):
        raise PatternError(f"tile_runs: pattern must be a sas Pattern, got {type(pattern).__name__}")
    q_len, k_len, bm, bn, q_offset = check_tile_args(q_len, k_len, block_m, block_n, q_offset)
    # Only indices below the last query / key matter: the same pattern with small numbers.
    pattern = pattern.restrict(max(q_offset + q_len, k_len))
    nqb, nkb = -(-q_len // bm), -(-k_len // bn)
    # One quadtree over the whole matrix: square boxes of `side` x `side` tiles on a grid of
    # that pitch (clipped to the matrix), from one box covering it down to single tiles. A box
    # the interval pass settles (EMPTY / FULL) is done; any other splits into _SPLIT x _SPLIT
    # children, so the work follows the boundary of the pattern, not the area of the matrix.
    # Boxes wait on a stack (children on top: depth first), taken `max_boxes / _SPLIT^2` at a
    # time, so the boxes in memory stay a few `max_boxes` per level whatever the length.
    side = 1
    while side < max(nqb, nkb):
        side *= _SPLIT
    chunk = max(1, max_boxes // (_SPLIT * _SPLIT))
    zero = np.zeros(1, dtype=np.int64)
    stack: list[tuple[int, np.ndarray, np.ndarray]] = [(side, zero, zero)]
    raw_f: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    raw_p: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    done_f: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    done_p: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    leaves = pending = runs = 0

    def flush():
        """Merge the runs found since the last flush (a full tile of a ragged last key block
        made partial); runs of different flushes are merged once at the end."""
        nonlocal pending, runs
        rf, af, bf = (_cat([x[i] for x in raw_f]) for i in range(3))
        rp, ap, bp = (_cat([x[i] for x in raw_p]) for i in range(3))
        raw_f.clear()
        raw_p.clear()
        pending = 0
        if k_len % bn:
            # a tile of the ragged last key block is never full (its loads need a bounds mask)
            cut = bf == nkb
            rp = np.concatenate([rp, rf[cut]])
            ap = np.concatenate([ap, np.full(int(cut.sum()), nkb - 1, dtype=np.int64)])
            bp = np.concatenate([bp, np.full(int(cut.sum()), nkb, dtype=np.int64)])
            bf = np.where(cut, nkb - 1, bf)
        done_f.append(_merge(rf, af, bf))
        done_p.append(_merge(rp, ap, bp))
        runs += len(done_f[-1][0]) + len(done_p[-1][0])
        if 24 * runs > host_table_limit() and len(done_f) > 1:
            # runs of one query block found in several flushes may still merge: count exactly
            for done in (done_f, done_p):
                done[:] = [_merge(*(_cat([x[i] for x in done]) for i in range(3)))]
            runs = len(done_f[0][0]) + len(done_p[0][0])
        # about 24 bytes per run until the schedule is assembled
        check_host_bytes(f"the prefill tile schedule of {pattern!r} at {q_len} x {k_len} with {bm} x {bn} tiles "
                         f"(over {runs} runs of tiles)", 24 * runs,
                         "use larger tiles (PrefillOptions(block_m=..., block_n=...) from Python: sas compile takes the "
                         "default tiles) or a shorter length")

    while stack:
        s, m0, n0 = stack.pop()
        last = s == 1
        take = max_boxes if last else chunk
        if len(m0) > take:
            stack.append((s, m0[take:], n0[take:]))
            m0, n0 = m0[:take], n0[:take]
        m1 = np.minimum(m0 + s, nqb)
        n1 = np.minimum(n0 + s, nkb)
        cls = classify_boxes(pattern, q_offset + m0 * bm, q_offset + np.minimum(m1 * bm, q_len) - 1,
                             n0 * bn, np.minimum(n1 * bn, k_len) - 1, refine=last)
        if last:
            leaves += len(m0)
            if leaves > MAX_LEAVES:
                raise KernelError(
                    f"tile_runs: {pattern!r} at {q_len} x {k_len} with {bm} x {bn} tiles has more than "
                    f"{MAX_LEAVES} tiles that only tile-by-tile classification settles; use larger tiles "
                    f"(PrefillOptions(block_m=..., block_n=...) from Python: sas compile takes the default tiles) "
                    f"or a shorter length")
        full = cls == FULL
        if full.any():
            # a full box: each of its query blocks gets the run [n0, n1)
            h = (m1 - m0)[full]
            rows = np.repeat(m0[full], h) + np.arange(int(h.sum())) - np.repeat(np.cumsum(h) - h, h)
            raw_f.append((rows, np.repeat(n0[full], h), np.repeat(n1[full], h)))
            pending += len(rows)
        if last:
            part = cls == PARTIAL
            raw_p.append((m0[part], n0[part], n0[part] + 1))
            pending += int(part.sum())
        else:
            split = (cls != FULL) & (cls != EMPTY)
            if split.any():
                g = s // _SPLIT
                d = np.arange(_SPLIT, dtype=np.int64) * g
                cm = (m0[split][:, None, None] + d[None, :, None] + 0 * d[None, None, :]).reshape(-1)
                cn = (n0[split][:, None, None] + 0 * d[None, :, None] + d[None, None, :]).reshape(-1)
                ok = (cm < nqb) & (cn < nkb)
                stack.append((g, cm[ok], cn[ok]))
        if pending > max_boxes:
            flush()
    flush()
    merged_f = done_f[0] if len(done_f) == 1 else _merge(*(_cat([x[i] for x in done_f]) for i in range(3)))
    merged_p = done_p[0] if len(done_p) == 1 else _merge(*(_cat([x[i] for x in done_p]) for i in range(3)))
    fp, fr = _csr([merged_f], nqb)
    pp, pr = _csr([merged_p], nqb)
    return TileRuns(q_len, k_len, q_offset, bm, bn, fp, fr, pp, pr)


__all__ = ["MAX_BOXES", "MAX_LEAVES", "TileRuns", "tile_runs"]
