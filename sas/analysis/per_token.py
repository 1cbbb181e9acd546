"""Per-token analysis of patterns without a periodic description, at any length, exactly.

A pattern whose `structure` is not periodic (a spread of a non-square unit over a layout that
is not fully periodic: its blocks drift off the diagonal) has no length-independent column
shapes. What decoding needs from it is the last use `L(j)` of every key `j < n` (the last
query `i < n` attending it) and the check that no query attends a later key. Both are read
here from the runs of attended cells along the columns, derived from the pattern tree by
`sas.ir.line_runs` (never from the `n x n` mask), a chunk of columns at a time:

- last use: the runs of each column in windows going back from the end of the sequence,
  `[n - 2W, n - W)` after `[n - W, n)` and so on (doubling), until a window holds a run
  (its end is the last use) or reaches the diagonal (the key is never attended); a column
  that is attended near the end stops at once, one attended only near its own key needs
  about `log2(n / W)` windows, each costing its runs, not its cells;
- causality: the runs of each column above the diagonal (rows `0 <= i < j`), which must be
  empty.

Memory is O(chunk + n): the `n` last uses and the runs of one chunk. A chunk whose runs pass
`CHUNK_RUNS` is split in halves (a single column past it raises `AnalysisError`); past
`TOTAL_RUNS` runs read in all the search stops with an `AnalysisError` naming the numbers.
"""

from __future__ import annotations

import numpy as np

from sas.errors import AnalysisError
from sas.ir.line_runs import COLUMN, Runs, line_runs
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


def last_use(pattern: Pattern, n: int) -> np.ndarray:
    """Last query i < n attending each key j < n (int64, -1 when none does), exactly."""
    out = np.full(n, -1, dtype=_I64)
    read = 0
    for c0 in range(0, n, CHUNK):
        todo = np.arange(c0, min(n, c0 + CHUNK), dtype=_I64)
        hi, width = n, FIRST_WINDOW
        while len(todo):
            todo = todo[todo < hi]               # keys at or past the window's end: never attended later
            if not len(todo):
                break
            lo = np.maximum(todo, hi - width)
            found = np.zeros(len(todo), dtype=bool)
            pos = 0
            for cols, r in _runs(pattern, todo, lo, np.full(len(todo), hi, dtype=_I64)):
                read += len(r)
                if read > TOTAL_RUNS:
                    raise AnalysisError(
                        f"analyze: the last uses of the keys of {pattern!r} up to max_len={n} need more than "
                        f"{TOTAL_RUNS} runs of attended cells (the runs limit of the per-token analysis: its "
                        f"columns are attended all along by a fine stride); give a smaller max_len")
                if len(r):
                    last = np.searchsorted(r.line, np.arange(len(cols), dtype=_I64), side="right") - 1
                    has = (last >= 0) & (r.line[np.maximum(last, 0)] == np.arange(len(cols)))
                    out[cols[has]] = r.stop[last[has]] - 1
                    found[pos:pos + len(cols)] = has
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


__all__ = ["CHUNK", "CHUNK_RUNS", "FIRST_WINDOW", "TOTAL_RUNS", "last_use", "non_causal_cell"]
