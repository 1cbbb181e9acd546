"""Key columns of a pattern, described once per period as runs of attended queries.

Column j of the mask is the set of queries that attend key j. Using the guarantees of
`sas.ir.periodicity.Structure`, every column is one of finitely many shapes:

- boundary keys `j < T`: one shape each;
- interior keys `j >= T`: the shape depends only on `(j - T) % P`.

A shape is `s(d) = M(j + d, j)` for d >= 0 (d = query distance below the key); it is
periodic with period Q for `d >= D`, so the analyzer stores it for `d < D + Q` only, as the
runs `[start, stop)` of attended distances (`sas.ir.line_runs`, derived from the pattern tree,
never cell by cell). Memory follows the number of shapes and of runs: a column of chunked
attention is one run whatever the chunk size. All questions about a column at any sequence
length (is the key ever used, its last use before N, is it attended "forever", the first
attended distance after x) are answered from the runs by binary search, vectorized over
many (shape, distance) pairs, never by scanning N tokens.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from sas.errors import AnalysisLimitError
from sas.ir.line_runs import COLUMN, ROW, RUN_LIMIT, Runs, from_disjoint, line_runs
from sas.ir.periodicity import Structure
from sas.lang.pattern import Pattern

#: Most column shapes (boundary keys plus interior classes, T + P) or rows the analysis reads.
SHAPE_LIMIT = 1 << 22
#: Column shapes derived per pass of the run algebra: at most `CHUNK_LINES`, and about
#: `CHUNK_RUNS` runs a pass when the shapes hold more than that many cells (estimated from
#: `ESTIMATE_LINES` shapes): a pass's arrays then stay under the 4 MiB from which numpy asks
#: the kernel for huge pages, whose first touch can stall on memory compaction (a pass of 3.4
#: million runs took 0.9 s of system time of its 1.4 s).
CHUNK_LINES = 1 << 16
CHUNK_RUNS = 1 << 18
#: Column shapes read first, evenly spread, to estimate the runs of all of them when there are
#: more than a pass's worth; the analysis stops at once when the estimate passes
#: `ESTIMATE_MARGIN` times the runs limit (it would stop at the limit, seconds later).
SAMPLE_LINES = 1 << 12
ESTIMATE_MARGIN = 2

_I64 = np.int64


def check_lines(pattern: Pattern, lines: int, st: Structure, what: str) -> None:
    """Refuse, before allocating, more than SHAPE_LIMIT column shapes or rows."""
    if lines > SHAPE_LIMIT:
        raise AnalysisLimitError(
            f"the periodic description of {pattern!r} (boundary T={st.T}, period P={st.P}, vertical period "
            f"{st.Qv} from distance {st.Dv}) has {lines} {what}, more than the limit {SHAPE_LIMIT} (the shapes "
            f"limit): its periods or boundary are too large for the length-independent analysis (give a "
            f"max_len no larger than needed, or use smaller parameters)")


@dataclass(frozen=True, eq=False)
class ColumnShapes:
    """Column shapes for boundary keys (shapes 0..T-1) and interior classes (T..T+P-1), as runs.

    The runs of shape s are `start[ptr[s]:ptr[s + 1]]`, `stop[...]` (distances d, sorted,
    disjoint, not touching), inside `[0, D[s] + Q)`; beyond, `s(d + Q) = s(d)` for d >= D[s].
    """

    T: int
    P: int
    Q: int
    D: np.ndarray        # per shape: periodic for d >= D
    ptr: np.ndarray      # [T + P + 1] offsets of each shape's runs
    start: np.ndarray    # run starts (distance below the key)
    stop: np.ndarray     # run stops (exclusive)

    @property
    def n_shapes(self) -> int:
        return self.T + self.P

    @property
    def n_runs(self) -> int:
        return len(self.start)

    @functools.cached_property
    def H(self) -> np.ndarray:
        """Per shape: the stored horizon D + Q (runs lie in [0, H))."""
        return self.D + self.Q

    @functools.cached_property
    def counts(self) -> np.ndarray:
        """Per shape: how many runs it has in [0, H)."""
        return np.diff(self.ptr)

    @functools.cached_property
    def run_shape(self) -> np.ndarray:
        """Per run: its shape."""
        return np.repeat(np.arange(self.n_shapes, dtype=_I64), self.counts)

    @functools.cached_property
    def _base(self) -> np.ndarray:
        """Per shape: an offset making (base + d) increase over shapes, then distances."""
        base = np.zeros(self.n_shapes + 1, dtype=_I64)
        np.cumsum(self.H + 1, out=base[1:])
        return base

    @functools.cached_property
    def _gstart(self) -> np.ndarray:
        return self._base[self.run_shape] + self.start

    @functools.cached_property
    def _gstop(self) -> np.ndarray:
        return self._base[self.run_shape] + self.stop

    def shape_of(self, j: np.ndarray) -> np.ndarray:
        j = np.asarray(j, dtype=_I64)
        return np.where(j < self.T, j, self.T + (j - self.T) % self.P)

    def runs(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        """(starts, stops) of shape s in [0, H[s])."""
        a, b = int(self.ptr[s]), int(self.ptr[s + 1])
        return self.start[a:b], self.stop[a:b]

    @functools.cached_property
    def _single(self) -> bool:
        """Every shape holds at most one run (windows, chunks, causal columns): the stored-horizon
        queries below read that run directly instead of searching."""
        return self.n_runs > 0 and int(self.counts.max()) <= 1

    def _one_run(self, shape: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(has a run, its start, its stop) per shape, when every shape has at most one."""
        k = np.minimum(self.ptr[shape], self.n_runs - 1)
        return self.counts[shape] > 0, self.start[k], self.stop[k]

    # --- stored-horizon queries ----------------------------------------------------------------
    def _last_upto(self, shape: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Last attended d <= x with 0 <= x < H[shape] (-1 if none)."""
        if self.n_runs == 0:
            return np.full(np.shape(x), -1, dtype=_I64)
        if self._single:
            has, a, b = self._one_run(shape)
            return np.where(has & (a <= x), np.minimum(b - 1, x), -1)
        k = np.searchsorted(self._gstart, self._base[shape] + x, side="right") - 1
        kk = np.maximum(k, 0)
        return np.where(k >= self.ptr[shape], np.minimum(self.stop[kk] - 1, x), -1)

    def _first_from(self, shape: np.ndarray, x: np.ndarray) -> np.ndarray:
        """First attended d >= x, d < H[shape], for 0 <= x <= H[shape] (-1 if none)."""
        if self.n_runs == 0:
            return np.full(np.shape(x), -1, dtype=_I64)
        if self._single:
            has, a, b = self._one_run(shape)
            return np.where(has & (x < b), np.maximum(a, x), -1)
        k = np.searchsorted(self._gstop, self._base[shape] + x, side="right")
        kk = np.minimum(k, self.n_runs - 1)
        return np.where(k < self.ptr[shape + 1], np.maximum(self.start[kk], x), -1)

    # --- per-shape summaries -------------------------------------------------------------------
    @functools.cached_property
    def ever_used(self) -> np.ndarray:
        """Per shape: does the column hold any attended cell at all (infinite length)."""
        return self.counts > 0

    @functools.cached_property
    def forever(self) -> np.ndarray:
        """Per shape: is the key attended again and again until the end of any sequence."""
        if self.n_runs == 0:
            return np.zeros(self.n_shapes, dtype=bool)
        return self.ever_used & (self.stop[np.maximum(self.ptr[1:] - 1, 0)] > self.D)

    @functools.cached_property
    def last_finite(self) -> np.ndarray:
        """Per shape: last attended distance in [0, D + Q), the last one at all for columns that
        are not `forever` (-1 if none)."""
        if self.n_runs == 0:
            return np.full(self.n_shapes, -1, dtype=_I64)
        return np.where(self.ever_used, self.stop[np.maximum(self.ptr[1:] - 1, 0)] - 1, -1)

    @functools.cached_property
    def first_used(self) -> np.ndarray:
        """Per shape: first attended distance (-1 if none)."""
        if self.n_runs == 0:
            return np.full(self.n_shapes, -1, dtype=_I64)
        return np.where(self.ever_used, self.start[np.minimum(self.ptr[:-1], self.n_runs - 1)], -1)

    @functools.cached_property
    def _tail_first(self) -> np.ndarray:
        """Per shape: first attended distance in [D, D + Q) (-1 if none)."""
        s = np.arange(self.n_shapes, dtype=_I64)
        return self._first_from(s, self.D)

    @functools.cached_property
    def _tail_last(self) -> np.ndarray:
        """Per shape: last attended distance in [D, D + Q) (-1 if none)."""
        return np.where(self.forever, self.last_finite, -1)

    @functools.cached_property
    def _tail_full(self) -> np.ndarray:
        """Per shape: is every distance of [D, D + Q) attended (one run covers the period)?"""
        if self.n_runs == 0:
            return np.zeros(self.n_shapes, dtype=bool)
        last = np.maximum(self.ptr[1:] - 1, 0)
        return self.ever_used & (self.start[last] <= self.D) & (self.stop[last] == self.H)

    # --- any distance --------------------------------------------------------------------------
    def last_d(self, shape: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Last attended distance d <= x in each column shape, -1 if none (x < 0: -1)."""
        shape, x = np.broadcast_arrays(np.asarray(shape, dtype=_I64), np.asarray(x, dtype=_I64))
        D, H, Q = self.D[shape], self.H[shape], self.Q
        far = x >= H
        k = np.where(far, (x - D) // Q, 0)
        xr = np.where(far, x - k * Q, np.maximum(x, 0))
        ld = self._last_upto(shape, xr)
        prev = self._tail_last[shape] + (k - 1) * Q      # the previous period's last attended
        out = np.where(far & (ld >= D), ld + k * Q, np.where(far & self.forever[shape], prev, ld))
        return np.where(x < 0, -1, out)

    def next_d(self, shape: np.ndarray, x: np.ndarray) -> np.ndarray:
        """First attended distance d >= x in each column shape (x >= 0), -1 if none."""
        shape, x = np.broadcast_arrays(np.asarray(shape, dtype=_I64), np.maximum(np.asarray(x, dtype=_I64), 0))
        D, H, Q = self.D[shape], self.H[shape], self.Q
        far = x >= H
        k = np.where(far, (x - D) // Q, 0)
        xr = np.where(far, x - k * Q, x)
        nd = self._first_from(shape, xr)
        nxt = self._tail_first[shape] + (k + 1) * Q       # the next period's first attended
        return np.where(nd >= 0, nd + k * Q, np.where(self.forever[shape], nxt, -1))

    def last_use(self, j: np.ndarray, n: int) -> np.ndarray:
        """Last query < n attending key j (j < n), -1 when no query in [j, n) attends it."""
        j = np.asarray(j, dtype=_I64)
        ld = self.last_d(self.shape_of(j), n - 1 - j)
        return np.where(ld >= 0, j + ld, -1)

    @functools.cached_property
    def _cum(self) -> np.ndarray:
        """Cells of the runs before each run (exclusive prefix sum over all runs)."""
        return np.concatenate([[0], np.cumsum(self.stop - self.start)]).astype(_I64)

    def _count_stored(self, shape: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Attended distances in [0, x) for 0 <= x <= H[shape]."""
        if self.n_runs == 0:
            return np.zeros(np.shape(x), dtype=_I64)
        if self._single:
            has, a, b = self._one_run(shape)
            return np.where(has & (a < x), np.minimum(b, x) - a, 0)
        k = np.searchsorted(self._gstart, self._base[shape] + x, side="left") - 1   # last run starting below x
        kk = np.maximum(k, 0)
        got = self._cum[kk] - self._cum[self.ptr[shape]] + np.minimum(self.stop[kk], x) - self.start[kk]
        return np.where(k >= self.ptr[shape], got, 0)

    def count_below(self, shape: np.ndarray, x: np.ndarray) -> np.ndarray:
        """How many distances d in [0, x) each column shape attends (periodic tail included)."""
        shape, x = np.broadcast_arrays(np.asarray(shape, dtype=_I64), np.maximum(np.asarray(x, dtype=_I64), 0))
        D, H, Q = self.D[shape], self.H[shape], self.Q
        inside = self._count_stored(shape, np.minimum(x, H))
        far = x > H
        m = np.where(far, (x - H) // Q, 0)
        at_d = self._count_stored(shape, D)
        per = self._count_stored(shape, H) - at_d
        part = self._count_stored(shape, np.where(far, D + (x - H) % Q, D)) - at_d
        return inside + np.where(far, m * per + part, 0)

    def window_runs(self, shape: np.ndarray, a: np.ndarray, b: np.ndarray) -> Runs:
        """Runs of attended distances in [a[k], b[k]) of shape[k] (periodic tails unrolled past
        H), one line per k; touching runs are joined."""
        shape, a, b = (np.asarray(x, dtype=_I64).reshape(-1) for x in (shape, a, b))
        m = len(shape)
        lines, starts, stops = [], [], []
        # stored part: the runs of each shape clipped to [a, min(b, H))
        cnt = self.counts[shape]
        if int(cnt.sum()) > RUN_LIMIT:
            raise AnalysisLimitError(f"the column shapes read over a window need {int(cnt.sum())} runs, more than "
                                f"the limit {RUN_LIMIT} (the runs limit)")
        idx = np.repeat(np.arange(m, dtype=_I64), cnt)
        run = self.ptr[shape][idx] + np.arange(int(cnt.sum()), dtype=_I64) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        hi = np.minimum(b, self.H[shape])
        lines.append(idx)
        starts.append(np.maximum(self.start[run], a[idx]))
        stops.append(np.minimum(self.stop[run], hi[idx]))
        # unrolled tail: the runs in [D, H) shifted by Q * p for the periods p >= 1 that meet [a, b)
        D, H, Q = self.D[shape], self.H[shape], self.Q
        lo2 = np.maximum(a, H)
        want = self.forever[shape] & (b > lo2)
        full = want & self._tail_full[shape]      # the tail is one run over the whole period
        if full.any():
            lines.append(np.flatnonzero(full).astype(_I64))
            starts.append(lo2[full])
            stops.append(b[full])
        want &= ~full
        if want.any():
            w = np.flatnonzero(want)
            p0 = np.maximum(1, (lo2[w] - D[w]) // Q)
            p1 = (b[w] - 1 - D[w]) // Q + 1               # periods [p0, p1)
            s_w = shape[w]
            first = np.searchsorted(self._gstop, self._base[s_w] + D[w], side="right")
            nt = self.ptr[s_w + 1] - first                # tail runs of each shape
            per = np.maximum(p1 - p0, 0) * nt
            total = int(per.sum())
            if total > RUN_LIMIT:
                raise AnalysisLimitError(f"the column shapes unrolled over a window need {total} runs, more than "
                                    f"the limit {RUN_LIMIT} (the runs limit)")
            r = np.repeat(np.arange(len(w), dtype=_I64), per)
            within = np.arange(total, dtype=_I64) - np.repeat(np.cumsum(per) - per, per)
            period = p0[r] + within // np.maximum(nt[r], 1)
            tr = first[r] + within % np.maximum(nt[r], 1)
            lines.append(w[r])
            starts.append(np.maximum(np.maximum(self.start[tr], D[w][r]) + period * Q, lo2[w][r]))
            stops.append(np.minimum(self.stop[tr] + period * Q, b[w][r]))
        return from_disjoint(np.concatenate(lines), np.concatenate(starts), np.concatenate(stops), m)


def _shape_keys(st: Structure) -> tuple[np.ndarray, np.ndarray]:
    """The first key of every column shape (boundary keys, then one key per class) and the
    distance D from which each shape repeats every Qv."""
    T, P = st.T, st.P
    keys = np.concatenate([np.arange(T), T + np.arange(P)]).astype(_I64)
    D = np.concatenate([np.maximum(T - np.arange(T), st.Dv), np.full(P, st.Dv)]).astype(_I64)
    return keys, D


def column_shapes(pattern: Pattern, st: Structure) -> ColumnShapes:
    """The runs of every column shape, from the pattern tree (`sas.ir.line_runs`)."""
    T, P, Q = st.T, st.P, st.Qv
    check_lines(pattern, T + P, st, "column shapes")
    keys, D = _shape_keys(st)
    if int((D + Q + 1).sum()) >= (1 << 62):
        check_lines(pattern, SHAPE_LIMIT + 1, st, "column cells")
    # CHUNK_LINES columns at a time: the run algebra's temporaries (a few dozen arrays of the
    # lines' length) are then reused from chunk to chunk instead of touching fresh memory for
    # every column at once (a million classes: 200 MiB and most of the first analysis's time)
    estimate = _estimate_runs(pattern, keys, D, Q) if len(keys) > CHUNK_LINES else None
    lines = _chunk_lines(pattern, keys, D, Q, estimate)
    counts, starts, stops = [], [], []
    total = 0
    for c0 in range(0, len(keys), lines):
        k = keys[c0:c0 + lines]
        r = line_runs(pattern, COLUMN, k, k, k + D[c0:c0 + lines] + Q, limit=RUN_LIMIT - total)
        total += len(r)
        counts.append(r.counts())
        starts.append(r.start - k[r.line])
        stops.append(r.stop - k[r.line])
    ptr = np.zeros(len(keys) + 1, dtype=_I64)
    np.cumsum(np.concatenate(counts), out=ptr[1:])
    return ColumnShapes(T, P, Q, D, ptr, np.concatenate(starts), np.concatenate(stops))


def _chunk_lines(pattern: Pattern, keys: np.ndarray, D: np.ndarray, Q: int, estimate: float | None) -> int:
    """Column shapes a pass of `column_shapes` reads: `CHUNK_LINES`, or fewer so that a pass
    builds about `CHUNK_RUNS` runs (by `estimate`, the runs of all shapes where
    `_estimate_runs` gave it, else estimated from `ESTIMATE_LINES` shapes evenly spread, where
    all hold more than `CHUNK_RUNS` cells)."""
    if float((D + Q).sum()) <= CHUNK_RUNS:
        return CHUNK_LINES
    try:
        runs = _sampled_runs(pattern, keys, D, Q, ESTIMATE_LINES) if estimate is None else estimate
    except AnalysisLimitError:
        return CHUNK_LINES                  # the passes stop at the runs limit, as before
    return int(min(CHUNK_LINES, max(1, len(keys) * CHUNK_RUNS // max(int(runs), 1))))


#: Column shapes `estimated_runs` reads (evenly spread), and the cells (distances over all
#: shapes) below which it reads none: so few runs need no estimate.
ESTIMATE_LINES = 32
ESTIMATE_FROM_CELLS = 1 << 24


def estimated_runs(pattern: Pattern, st: Structure) -> float:
    """About how many runs `column_shapes` would build: the runs per distance of
    `ESTIMATE_LINES` shapes evenly spread, times the distances of all (0 where they hold fewer
    than `ESTIMATE_FROM_CELLS` cells; inf past the shapes limit, which `column_shapes` refuses)."""
    T, P, Q = st.T, st.P, st.Qv
    if T + P > SHAPE_LIMIT:
        return float("inf")
    keys, D = _shape_keys(st)
    if float((D + Q).sum()) < ESTIMATE_FROM_CELLS:
        return 0.0
    try:
        return _sampled_runs(pattern, keys, D, Q, ESTIMATE_LINES)
    except AnalysisLimitError:
        return float("inf")


def _sampled_runs(pattern: Pattern, keys: np.ndarray, D: np.ndarray, Q: int, lines: int) -> float:
    """The runs of all column shapes, estimated from `lines` of them evenly spread: runs per
    cell read, times the cells of all (`AnalysisLimitError` where the sample alone passes the
    runs limit)."""
    pick = np.unique(np.linspace(0, len(keys) - 1, lines).astype(_I64))
    k = keys[pick]
    r = line_runs(pattern, COLUMN, k, k, k + D[pick] + Q, limit=RUN_LIMIT)
    cells = (D + Q).astype(np.float64)
    return len(r) / float(cells[pick].sum()) * float(cells.sum())


def _estimate_runs(pattern: Pattern, keys: np.ndarray, D: np.ndarray, Q: int) -> float:
    """The runs of all column shapes, estimated from `SAMPLE_LINES` of them (`_sampled_runs`);
    refused where they pass `ESTIMATE_MARGIN` times the runs limit."""
    estimate = _sampled_runs(pattern, keys, D, Q, SAMPLE_LINES)
    if estimate > ESTIMATE_MARGIN * RUN_LIMIT:
        raise AnalysisLimitError(f"the column shapes need about {estimate:.3g} runs (estimated from "
                                 f"{min(SAMPLE_LINES, len(keys))} of the {len(keys)} shapes), more than the "
                                 f"limit {RUN_LIMIT} (the runs limit)")
    return estimate


def upper_triangle_clear(pattern: Pattern, st: Structure) -> tuple[int, int] | None:
    """Return a cell (i, j) with j > i that the pattern attends, or None if it is causal."""
    rows = st.T + st.P
    cols = max(st.T, rows + st.Dh) + st.Qh + 1
    check_lines(pattern, rows, st, "rows to check for causality")
    i = np.arange(rows, dtype=_I64)
    r = line_runs(pattern, ROW, i, i + 1, np.full(rows, cols, dtype=_I64))
    if len(r):
        return int(r.line[0]), int(r.start[0])
    return None
