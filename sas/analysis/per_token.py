"""Per-token analysis of patterns without a periodic description, at any length, exactly.

A pattern whose `structure` is not periodic (a spread of a non-square unit over a layout that
is not fully periodic: its blocks drift off the diagonal) has no length-independent column
shapes. What decoding needs from it is the last use `L(j)` of every key `j < n` (the last
query `i < n` attending it) and the check that no query attends a later key. Both are read
here from the runs of attended cells along the columns, derived from the pattern tree by
`sas.ir.line_runs` (never from the `n x n` mask), a chunk of columns at a time:

- last use, in three steps that each read a line's runs about once:
  1. the last `W` rows (`W = FIRST_WINDOW`) along the rows, all keys at once, when they hold
     few runs (about `n / 2`): every key attended near the end of the sequence gets its last
     use there (a column attended all along by a stride, say) for the cost of those runs;
  2. the columns left over all their rows at once, when those hold few runs (about 8 a
     column): columns attended only near their key, or not at all (an empty pattern is
     one such pass over its columns);
  3. where a step passes its limit, the columns left by windows going back from the end,
     `[n - 2W, n - W)` after `[n - W, n)` and so on (doubling), until a window holds a run
     (its end is the last use) or reaches the diagonal (the key is never attended), with
     step 2 tried again on the columns left after each window that resolved some;
- causality: the runs of each column above the diagonal (rows `0 <= i < j`), which must be
  empty (a product with `Causal()` is bounded by it first: no run is built there).

Memory is O(chunk + n): the `n` last uses and the runs of one chunk (in step 1, of the last
rows: at most `CHUNK_RUNS`). A window whose runs pass `CHUNK_RUNS` is split in halves (a
single column past it raises `AnalysisError`); past `TOTAL_RUNS` runs read in all the search
stops with an `AnalysisError` naming the numbers.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from sas.errors import AnalysisError
from sas.ir.line_runs import COLUMN, ROW, Runs, line_runs
from sas.lang.pattern import Pattern

_I64 = np.int64
#: Columns read per call of `line_runs`.
CHUNK = 1 << 17
#: Width of the first window at the end of the sequence.
FIRST_WINDOW = 8
#: Most runs one call may build before its columns are split in halves.
CHUNK_RUNS = 1 << 22
#: Most runs the last-use search reads in all (about 10 s on one core): a pattern whose
#: columns are attended all along by a fine stride, far from the end, would need O(n^2) runs.
TOTAL_RUNS = 1 << 26
#: Step 1: read the last `FIRST_WINDOW` rows along the rows first, when they hold at most
#: `ROW_RUNS_PER_KEY * n` runs (and at most `CHUNK_RUNS`; plus `WHOLE_RUNS_MIN`).
ROWS_FIRST = True
ROW_RUNS_PER_KEY = 0.5
#: Past that limit, step 1 evaluates those rows cell by cell (`DENSE_COLUMNS` keys at a time)
#: instead of leaving them to the windows of the columns.
DENSE_LAST_ROWS = True
DENSE_COLUMNS = 1 << 15
#: Step 2: read the columns left over all their rows at once when that takes at most this
#: many runs per column (plus `WHOLE_RUNS_MIN`); `WHOLE_FIRST`: before the first window (a
#: chunk tries it there only while it worked for the chunks before), else after it.
WHOLE_RUNS_PER_COLUMN = 8
WHOLE_RUNS_MIN = 1 << 16
WHOLE_FIRST = True


def _runs(pattern: Pattern, j: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> list[tuple[np.ndarray, Runs]]:
    """Runs of the columns j over rows [lo, hi), as (columns, runs) pieces: split in halves
    while a piece needs more than CHUNK_RUNS runs."""
    try:
        return [(j, line_runs(pattern, COLUMN, j, lo, hi, limit=CHUNK_RUNS))]
    except AnalysisError:
        if len(j) <= 1:
            raise
    h = len(j) // 2
    return _runs(pattern, j[:h], lo[:h], hi[:h]) + _runs(pattern, j[h:], lo[h:], hi[h:])


def _record(out: np.ndarray, cols: np.ndarray, r: Runs) -> np.ndarray:
    """Set out[col] to the end of the last run of each column that has one; which have one."""
    has = np.zeros(len(cols), dtype=bool)
    if len(r):
        last = np.searchsorted(r.line, np.arange(len(cols), dtype=_I64), side="right") - 1
        has = (last >= 0) & (r.line[np.maximum(last, 0)] == np.arange(len(cols)))
        out[cols[has]] = r.stop[last[has]] - 1
    return has


def _whole(pattern: Pattern, todo: np.ndarray, hi: int) -> Runs | None:
    """Step 2: the runs of the columns `todo` over all their rows [j, hi) when they number at
    most about `WHOLE_RUNS_PER_COLUMN` per column (None past that: on by windows)."""
    try:
        return line_runs(pattern, COLUMN, todo, todo, np.full(len(todo), hi, dtype=_I64),
                         limit=WHOLE_RUNS_PER_COLUMN * len(todo) + WHOLE_RUNS_MIN)
    except AnalysisError:
        return None


def _last_rows(pattern: Pattern, n: int, out: np.ndarray, count: Callable[[int], None]) -> int | None:
    """Step 1: the last uses within the last `FIRST_WINDOW` rows, read along those rows (all
    keys at once) when they hold few runs: sets `out[j]` for the keys they attend and returns
    the first of those rows (None, nothing set, past the limit)."""
    top = max(0, n - FIRST_WINDOW)
    rows = np.arange(top, n, dtype=_I64)
    try:
        r = line_runs(pattern, ROW, rows, np.zeros(len(rows), dtype=_I64), rows + 1,
                      limit=min(int(ROW_RUNS_PER_KEY * n), CHUNK_RUNS) + WHOLE_RUNS_MIN)
    except AnalysisError:
        if not DENSE_LAST_ROWS:
            return None
        # many runs in those rows: cell by cell is cheaper than the run algebra
        cells = pattern._index_safe
        i = rows[:, None]
        for c0 in range(0, n, DENSE_COLUMNS):
            j = np.arange(c0, min(n, c0 + DENSE_COLUMNS), dtype=_I64)
            on = np.asarray(cells.evaluate(i, j[None, :]), dtype=bool) & (i >= j[None, :])
            has = on.any(axis=0)
            out[j[has]] = rows[len(rows) - 1 - np.argmax(on[::-1], axis=0)][has]
        return top
    count(len(r))
    # The runs of one row are disjoint: summing 2^k over the runs of row k that cover a key
    # gives the set of rows attending it as bits, exactly in float64 for up to 52 rows a pass;
    # its highest bit is the last use.
    ptr = r.ptr
    for g1 in range(len(rows), 0, -52):             # the last rows first
        g0 = max(0, g1 - 52)
        a, b = ptr[g0], ptr[g1]
        if a == b:
            continue
        bit = np.ldexp(1.0, (r.line[a:b] - g0).astype(np.int32))
        rows_on = np.cumsum((np.bincount(r.start[a:b], bit, minlength=n + 1)
                             - np.bincount(r.stop[a:b], bit, minlength=n + 1))[:n])
        new = (rows_on > 0) & (out < 0)
        out[new] = rows[g0 + np.frexp(rows_on[new])[1] - 1]
    return top


def last_use(pattern: Pattern, n: int) -> np.ndarray:
    """Last query i < n attending each key j < n (int64, -1 when none does), exactly."""
    out = np.full(n, -1, dtype=_I64)
    read = 0

    def count(k: int) -> None:
        nonlocal read
        read += k
        if read > TOTAL_RUNS:
            raise AnalysisError(
                f"analyze: the last uses of the keys of {pattern!r} up to max_len={n} need more than "
                f"{TOTAL_RUNS} runs of attended cells (the runs limit of the per-token analysis: its "
                f"columns are attended all along by a fine stride); give a smaller max_len")

    # the last rows along the rows when they hold few runs (then the columns left start below)
    top = _last_rows(pattern, n, out, count) if ROWS_FIRST else None
    whole_first = WHOLE_FIRST
    for c0 in range(0, n, CHUNK):
        todo = np.arange(c0, min(n, c0 + CHUNK), dtype=_I64)
        hi, width = n, FIRST_WINDOW
        if top is not None:
            todo = todo[out[todo] < 0]
            hi, width = top, 2 * FIRST_WINDOW
        failed = len(todo) + 1              # columns of the last attempt at all rows that failed
        first = True
        while True:
            todo = todo[todo < hi]               # keys at or past the window's end: never attended later
            if not len(todo):
                break
            if len(todo) < failed and (whole_first or not first):
                # all the rows of the columns left at once, when they hold few runs (columns
                # attended only near their key, or not at all), else on by windows
                r = _whole(pattern, todo, hi)
                if first:
                    whole_first = r is not None
                if r is not None:
                    count(len(r))
                    _record(out, todo, r)
                    break
                failed = len(todo)
            first = False
            lo = np.maximum(todo, hi - width)
            found = np.zeros(len(todo), dtype=bool)
            pos = 0
            for cols, r in _runs(pattern, todo, lo, np.full(len(todo), hi, dtype=_I64)):
                count(len(r))
                found[pos:pos + len(cols)] = _record(out, cols, r)
                pos += len(cols)
            todo = todo[~found & (lo > todo)]
            hi, width = hi - width, 2 * width
    return out


def non_causal_cell(pattern: Pattern, n: int) -> tuple[int, int] | None:
    """A cell (i, j) with i < j < n that the pattern attends, or None when it is causal below n."""
    for c0 in range(0, n, CHUNK):
        j = np.arange(c0, min(n, c0 + CHUNK), dtype=_I64)
        for cols, r in _runs(pattern, j, np.zeros(len(j), dtype=_I64), j):
            if len(r):
                return int(r.start[0]), int(cols[r.line[0]])
    return None


__all__ = ["CHUNK", "CHUNK_RUNS", "FIRST_WINDOW", "ROWS_FIRST", "ROW_RUNS_PER_KEY", "TOTAL_RUNS", "WHOLE_FIRST",
           "WHOLE_RUNS_MIN", "WHOLE_RUNS_PER_COLUMN", "last_use", "non_causal_cell"]
