"""Per-token analysis of patterns without a periodic description, at any length, exactly.

A pattern whose `structure` is not periodic (a spread of a non-square unit over a layout that
is not fully periodic: its blocks drift off the diagonal) has no length-independent column
shapes. What decoding needs from it is the last use `L(j)` of every key `j < n` (the last
query `i < n` attending it) and the check that no query attends a later key. Both are read
here from the runs of attended cells along the columns, derived from the pattern tree by
`sas.ir.line_runs` (never from the `n x n` mask), a chunk of columns at a time:

- last use, in three steps that each read a line's runs about once:
  1. the last `W` rows (`W = FIRST_WINDOW`) along the rows, all keys at once, when they hold
     few runs (about `n / 2`; cell by cell when they hold more): every key attended near the
     end of the sequence gets its last use there (a column attended all along by a short
     stride, say);
  2. the columns left over all their rows at once, when those hold few runs (about 8 a
     column): columns attended only near their key, or not at all (an empty pattern is
     one such pass over its columns); else their last attended rows from the tree without
     their runs (`sas.ir.line_last.last_cells`: a column of many runs, as the complement of a
     drifting spread cut by a lattice, is settled there), the columns it leaves unknown (a
     product whose terms did not agree within its steps) going on to step 3; after a chunk
     whose runs came to `CELLS_FIRST_RUNS_PER_COLUMN` or more a column, the next chunks ask
     the last cells first and read runs only for the columns left unknown;
  3. the keys still left by windows going back from the end, `[n - 5W, n - W)` after
     `[n - W, n)` and so on (each `GROWTH` times the last): first along the rows, all keys
     at once, while the windows hold few runs (`ROW_RUNS_PER_KEY * n` a window; each window's
     last uses from its runs by a range maximum over a segment tree, O(runs log n + n): columns
     attended all along by a long stride, or rows holding one long run each, are resolved in
     O(n log n)), then along
     the columns left, until a window holds a run (its end is the last use) or reaches the
     diagonal (the key is never attended), with step 2 tried again on the columns left after
     each window that resolved some.
  A sum (or a product with a sum among its factors, `(a + b) * c = a * c + b * c`) takes
  steps 1 and 2 as a whole, then searches the keys they leave term by term, the simplest
  first, each term only in the rows above the last use found so far: a term that needs
  windows (a long stride) does not make the search of the others go by windows too.
- causality: the runs of each column above the diagonal (rows `0 <= i < j`), which must be
  empty (a product with `Causal()` is bounded by it first: no run is built there).

Both stop where the pattern's envelope ends (`sas.ir.envelope`): the rows and keys past the
last one a convex superset of its cells reaches are not searched (a band of the block grid
spread over non-square blocks against a band of the cell grid ends near the origin).

Memory is O(chunk + n): the `n` last uses and the runs of one chunk (along rows: at most
`CHUNK_RUNS` runs, and a segment tree of 2n entries). A window whose runs pass `CHUNK_RUNS` is split in halves (a
single column past it raises `AnalysisLimitError`); past `TOTAL_RUNS` runs read in all the search
stops with an `AnalysisLimitError` naming the numbers.
"""

from __future__ import annotations

import copy
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from time import perf_counter
from typing import Callable, TypeVar

import numpy as np

from sas.errors import AnalysisLimitError
from sas.ir.envelope import attended_extent
from sas.ir.line_last import last_cells
from sas.ir.line_runs import COLUMN, ROW, Runs, line_runs
from sas.limits import analysis_threads
from sas.lang.pattern import And, Or, Pattern

_I64 = np.int64
#: Columns read per call of `line_runs`.
CHUNK = 1 << 17
#: Columns of the first chunk (at most `CHUNK`): the way it takes (runs first or not) is
#: decided there, so a way that fails costs a small chunk.
FIRST_CHUNK = 1 << 14
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
#: Step 3: each window is this many times as tall as the one before.
GROWTH = 4
#: Search the terms of a sum apart for the keys that steps 1 and 2 leave.
DISTRIBUTE = True
#: Step 3 along the rows first, while its windows hold few runs (`ROW_RUNS_PER_KEY`); the keys
#: a window settles come from its runs by a range maximum (`range_max`), never cell by cell.
ROW_WINDOWS = True
#: After step 2, the last attended row of each column left from the tree (`sas.ir.line_last`),
#: without its runs; the columns it leaves unknown go on by windows.
LAST_CELLS = True
#: ... and before step 2 in the chunks after one whose step 2 read at least this many runs a
#: column (the last cells are then found for less than their runs cost). Chunks of at least
#: `TIMED_COLUMNS` columns are timed too: after one with step 2 first that took at least
#: `CELLS_FIRST_SECONDS_PER_COLUMN` a column (a deep tree whose intermediate runs cancel: few
#: runs read, many built), the next asks the last cells first, and once both ways are timed
#: the faster goes on. A choice of the path, never of the answer (both are exact); smaller
#: chunks are not timed (their time is the interpreter's), and the first chunk's path never
#: depends on a time, so a max_len up to `FIRST_CHUNK` takes one path, always the same.
CELLS_FIRST_RUNS_PER_COLUMN = 4
CELLS_FIRST_SECONDS_PER_COLUMN = 0.5e-6
TIMED_COLUMNS = 1 << 14
#: Step 1 reads ranges of at least this many keys in threads (`sas.limits.analysis_threads`);
#: steps 2 and 3 take chunks (`CHUNK` keys) in threads, each the next one when it is free.
THREADED_KEYS = 1 << 17

T = TypeVar("T")
R = TypeVar("R")


def _runs(pattern: Pattern, j: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> list[tuple[np.ndarray, Runs]]:
    """Runs of the columns j over rows [lo, hi), as (columns, runs) pieces: split in halves
    while a piece needs more than CHUNK_RUNS runs."""
    try:
        return [(j, line_runs(pattern, COLUMN, j, lo, hi, limit=CHUNK_RUNS))]
    except AnalysisLimitError:
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


def _whole(pattern: Pattern, todo: np.ndarray, lo: np.ndarray, hi: int) -> Runs | None:
    """Step 2: the runs of the columns `todo` over all their rows left, [lo, hi), when they
    number at most about `WHOLE_RUNS_PER_COLUMN` per column (None past that: on by windows)."""
    try:
        return line_runs(pattern, COLUMN, todo, lo, np.full(len(todo), hi, dtype=_I64),
                         limit=WHOLE_RUNS_PER_COLUMN * len(todo) + WHOLE_RUNS_MIN)
    except AnalysisLimitError:
        return None


def _last_rows(pattern: Pattern, end: int, out: np.ndarray,
               count: Callable[[int], None]) -> tuple[int, np.ndarray] | None:
    """Step 1: the last uses within the last `FIRST_WINDOW` rows below `end`, read along those
    rows (all keys at once) when they hold few runs: raises `out[j]` to the last of those rows
    attending key j; returns the first of those rows and which keys they attend (None past
    the limit). From `THREADED_KEYS` keys on, ranges of keys in threads (`analysis_threads`),
    each with its share of the runs limit."""
    n = len(out)
    top = max(0, end - FIRST_WINDOW)
    rows = np.arange(top, end, dtype=_I64)
    hit = np.zeros(n, dtype=bool)
    limit = min(int(ROW_RUNS_PER_KEY * n), CHUNK_RUNS)
    parts = max(1, min(analysis_threads(), end // THREADED_KEYS))
    cuts = [end * p // parts for p in range(parts + 1)]

    def part(k: int) -> bool:
        k0, k1 = cuts[k], cuts[k + 1]
        return _last_rows_in(pattern, rows, k0, k1, out, hit, count, limit * (k1 - k0) // end + WHOLE_RUNS_MIN)

    return (top, hit) if all(_threaded(part, list(range(parts)))) else None


def _last_rows_in(pattern: Pattern, rows: np.ndarray, k0: int, k1: int, out: np.ndarray, hit: np.ndarray,
                  count: Callable[[int], None], limit: int) -> bool:
    """`_last_rows` for the keys [k0, k1) (writing only theirs); False past `limit` runs."""
    try:
        r = line_runs(pattern, ROW, rows, np.full(len(rows), k0, dtype=_I64), np.clip(rows + 1, k0, k1),
                      limit=limit)
    except AnalysisLimitError:
        if not DENSE_LAST_ROWS:
            return False
        # many runs in those rows: cell by cell is cheaper than the run algebra
        cells = pattern._index_safe
        i = rows[:, None]
        for c0 in range(k0, k1, DENSE_COLUMNS):
            j = np.arange(c0, min(k1, c0 + DENSE_COLUMNS), dtype=_I64)
            on = np.asarray(cells.evaluate(i, j[None, :]), dtype=bool) & (i >= j[None, :])
            has = on.any(axis=0)
            k = j[has]
            out[k] = np.maximum(out[k], rows[len(rows) - 1 - np.argmax(on[::-1], axis=0)][has])
            hit[k] = True
        return True
    count(len(r))
    # The runs of one row are disjoint: summing 2^k over the runs of row k that cover a key
    # gives the set of rows attending it as bits, exactly in float64 for up to 52 rows a pass;
    # its highest bit is the last use.
    ptr, width = r.ptr, k1 - k0
    for g1 in range(len(rows), 0, -52):             # the last rows first
        g0 = max(0, g1 - 52)
        a, b = ptr[g0], ptr[g1]
        if a == b:
            continue
        bit = np.ldexp(1.0, (r.line[a:b] - g0).astype(np.int32))
        rows_on = np.cumsum((np.bincount(r.start[a:b] - k0, bit, minlength=width + 1)
                             - np.bincount(r.stop[a:b] - k0, bit, minlength=width + 1))[:width])
        k = k0 + np.flatnonzero((rows_on > 0) & ~hit[k0:k1])
        out[k] = np.maximum(out[k], rows[g0 + np.frexp(rows_on[k - k0])[1] - 1])
        hit[k] = True
    return True


class _Stopped(Exception):
    """A thread's search stopped because another one failed (never seen by the caller)."""


def _threaded(fn: Callable[[T], R], items: list[T]) -> list[R]:
    """`[fn(x) for x in items]`, each item in its own thread when there are several (the
    first error raised again once all have stopped)."""
    if len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(len(items), thread_name_prefix="sas-analysis") as pool:
        futures = [pool.submit(fn, x) for x in items]
    errors = [e for e in (f.exception() for f in futures) if e is not None and not isinstance(e, _Stopped)]
    if errors:
        raise errors[0]
    return [f.result() for f in futures]


def _row_windows(pattern: Pattern, end: int, width: int, out: np.ndarray, base: np.ndarray,
                 count: Callable[[int], None], lock: threading.Lock) -> tuple[int, int]:
    """Windows of rows going back from `end` (each `GROWTH` times the last), read along the
    rows while each holds few runs (`ROW_RUNS_PER_KEY` times n): every key they attend (above
    its `base`) is settled (written under `lock`). Returns the end and width of the next
    window (for the columns)."""
    n = len(out)
    while end > 0 and bool((base < end).any()):
        top = max(0, end - width)
        rows = np.arange(top, end, dtype=_I64)
        try:
            r = line_runs(pattern, ROW, rows, np.zeros(len(rows), dtype=_I64), rows + 1,
                          limit=min(int(ROW_RUNS_PER_KEY * n), CHUNK_RUNS) + WHOLE_RUNS_MIN)
        except AnalysisLimitError:
            break
        count(len(r))
        if len(r):
            last = range_max(n, r.start, r.stop, rows[r.line])
            with lock:
                key = np.flatnonzero((last >= 0) & (base < end))     # attended here, not settled yet
                out[key] = np.maximum(out[key], last[key])
                base[key] = n
        end, width = top, GROWTH * width
    return end, width


def range_max(n: int, start: np.ndarray, stop: np.ndarray, value: np.ndarray) -> np.ndarray:
    """out[j] (j < n) = the largest `value` of the runs [start, stop) covering j, -1 where none
    does (values >= 0): each run is put on the O(log n) nodes of a segment tree that tile it,
    then the maxima are pushed down to the leaves. O(runs log n + n), whatever the runs'
    lengths."""
    size = 1
    while size < n:
        size *= 2
    tree = np.full(2 * size, -1, dtype=_I64)
    lo, hi, v = start.astype(_I64) + size, stop.astype(_I64) + size, value.astype(_I64)
    keep = lo < hi
    lo, hi, v = lo[keep], hi[keep], v[keep]
    while len(lo):
        odd = (lo & 1) == 1                      # a left end that is a right child: take it
        np.maximum.at(tree, lo[odd], v[odd])
        lo = lo + odd
        odd = ((hi & 1) == 1) & (lo < hi)        # a right end past a left child: take that child
        hi = hi - odd
        np.maximum.at(tree, hi[odd], v[odd])
        lo, hi = lo >> 1, hi >> 1
        keep = lo < hi
        lo, hi, v = lo[keep], hi[keep], v[keep]
    width = 1
    while width < size:                          # push down, one depth at a time
        child = np.arange(2 * width, 4 * width, dtype=_I64)
        tree[child] = np.maximum(tree[child], tree[child >> 1])
        width *= 2
    return tree[size:size + n]


def _sum_terms(p: Pattern) -> list[Pattern]:
    """Patterns whose union is p: the terms of a sum, or of a product with one sum among its
    factors distributed over it (`(a + b) * c = a * c + b * c`); else p itself."""
    if isinstance(p, Or):
        return list(p.terms)
    if isinstance(p, And):
        sums = [t for t in p.terms if isinstance(t, Or)]
        if len(sums) == 1:
            rest = [t for t in p.terms if t is not sums[0]]
            return [And(t, *rest) for t in sums[0].terms]
    return [p]


def last_use(pattern: Pattern, n: int) -> np.ndarray:
    """Last query i < n attending each key j < n (int64, -1 when none does), exactly. Rows and
    keys past where the pattern's envelope ends (`sas.ir.envelope`) are not searched."""
    rows, _ = attended_extent(pattern, n, n)
    out = np.full(n, -1, dtype=_I64)
    if rows:
        out[:rows] = _last_use_below(pattern, rows)
    return out


def _last_use_below(pattern: Pattern, n: int) -> np.ndarray:
    """`last_use` over rows and keys below n."""
    read = 0
    lock = threading.Lock()             # the threads of a search count together

    def count(k: int) -> None:
        nonlocal read
        with lock:
            read += k
            over = read > TOTAL_RUNS
        if over:
            raise AnalysisLimitError(
                f"analyze: the last uses of the keys of {pattern!r} up to max_len={n} need more than "
                f"{TOTAL_RUNS} runs of attended cells (the runs limit of the per-token analysis: its "
                f"columns are attended all along by a fine stride); give a smaller max_len")

    out = np.full(n, -1, dtype=_I64)
    base = np.arange(n, dtype=_I64)
    terms = _sum_terms(pattern) if DISTRIBUTE else [pattern]
    if len(terms) == 1:
        _search(pattern, n, count, out, base, windows=True)
        return out
    # Steps 1 and 2 on the whole pattern; the keys they leave (attended all along by a long
    # stride, say) by every term of the sum, each searched by windows only where it can still
    # raise a key's last use: a term that needs windows does not slow the others down.
    end = _search(pattern, n, count, out, base, windows=False)
    for t in sorted(terms, key=lambda t: sum(1 for _ in t.walk())):      # the simplest first
        _search(t, end, count, out, np.maximum(base, out + 1), windows=True)
    return out


@dataclass
class _Path:
    """The path choices carried from one chunk to the next (each thread its own copy, from
    the first chunk's): step 2 before the first window, the last cells before step 2, and the seconds
    a column of the last timed chunk by `cells_first`."""

    whole_first: bool = WHOLE_FIRST
    cells_first: bool = False
    seconds: dict[bool, float] = field(default_factory=dict)


@dataclass
class _Rows:
    """What the chunks of one search share: the rows left below `end` (and the next window's
    `width`) once the row windows ran, whether one chunk has started them (`started`) and
    finished them (`done`), and the lock every write to `out` and `base` takes."""

    end: int
    width: int
    started: bool
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _search(pattern: Pattern, end: int, count: Callable[[int], None], out: np.ndarray, base: np.ndarray,
            windows: bool) -> int:
    """Raise out[j] to the last row i in [base[j], end) where `pattern` attends key j (the
    three steps of the module doc; `windows=False`: steps 1 and 2 only). Sets base[j] past
    every row for the keys it settles; returns the end of the rows left to search.

    The first chunk of columns is searched first; the chunks after it in up to
    `analysis_threads()` threads, each taking the next chunk (in order) when it is free. A chunk
    settles only its own keys; the row windows (all keys) run once, in the first chunk to
    need them, while the others wait for them; writes to `out` and `base` take a lock and only
    raise `out` (a maximum of attended rows), so the answer never depends on the order."""
    n = len(out)
    width = FIRST_WINDOW
    if ROWS_FIRST and bool((base < end).any()):
        # the last rows along the rows when they hold few runs (then the columns left start below)
        got = _last_rows(pattern, end, out, count)
        if got is not None:
            end, hit = got
            base[hit] = n
            width = GROWTH * FIRST_WINDOW
    row_windows = windows and ROW_WINDOWS and width > FIRST_WINDOW      # once, if step 1 read rows
    rows = _Rows(end, width, started=not row_windows)
    if not row_windows:
        rows.done.set()
    first_chunk = min(FIRST_CHUNK, CHUNK)
    bounds = [(c0, min(n, c0 + CHUNK)) for c0 in range(first_chunk, n, CHUNK)]
    path = _Path()
    _chunk(pattern, 0, min(n, first_chunk), count, out, base, windows, rows, path)
    pending, take, stop = iter(bounds), threading.Lock(), threading.Event()

    def counted(k: int) -> None:
        if stop.is_set():
            raise _Stopped()
        count(k)

    def run(_: int) -> None:
        mine = copy.deepcopy(path)
        try:
            while not stop.is_set():
                with take:
                    chunk = next(pending, None)
                if chunk is None:
                    return
                _chunk(pattern, *chunk, counted, out, base, windows, rows, mine)
        except BaseException:
            stop.set()
            raise

    _threaded(run, list(range(min(analysis_threads(), len(bounds)))))     # one: in this thread
    return rows.end


def _chunk(pattern: Pattern, c0: int, c1: int, count: Callable[[int], None], out: np.ndarray,
           base: np.ndarray, windows: bool, rows: _Rows, path: _Path) -> None:
    """The keys [c0, c1) by steps 2 and 3 (module doc), choosing the path by `path` and
    updating it."""
    n = len(out)
    todo = np.arange(c0, c1, dtype=_I64)
    columns, cells_first, started = len(todo), path.cells_first, perf_counter()
    hi, w = rows.end, rows.width
    rowed = rows.done.is_set()
    failed = len(todo) + 1              # columns of the last attempt at all rows that failed
    first = True
    queried = False                     # the last-cell query asked for this chunk
    while True:
        todo = todo[base[todo] < hi]         # no row left to search below the window's end
        if not len(todo):
            break
        whole = len(todo) < failed and (path.whole_first or not first)
        if LAST_CELLS and not queried and (cells_first or not whole):
            # the last attended row of each column left, from the tree (no runs built): a
            # column of many runs (a drifting spread cut by a lattice) is settled here
            queried = True
            last, known = last_cells(pattern, COLUMN, todo, base[todo], np.full(len(todo), hi, dtype=_I64))
            settled = todo[known]
            with rows.lock:
                out[settled] = np.maximum(out[settled], last[known])
                base[settled] = n
            continue
        if whole:
            # all the rows of the columns left at once, when they hold few runs (columns
            # attended only near their key, or not at all), else on by windows
            r = _whole(pattern, todo, base[todo], hi)
            if first:
                path.whole_first = r is not None
            if r is not None:
                count(len(r))
                with rows.lock:
                    _record(out, todo, r)
                    base[todo] = n
                # many runs a column: the next chunks ask the last cells first
                path.cells_first = len(r) >= CELLS_FIRST_RUNS_PER_COLUMN * len(todo)
                break
            failed = len(todo)
            continue
        if not windows:
            break
        if not rowed:
            # before the first window of columns: windows of rows for all the keys left, run
            # by the first chunk here (the others wait for them)
            rowed = True
            with rows.lock:
                mine, rows.started = not rows.started, True
            if mine:
                try:
                    rows.end, rows.width = _row_windows(pattern, rows.end, rows.width, out, base, count, rows.lock)
                finally:
                    rows.done.set()
            else:
                rows.done.wait()
            hi, w = rows.end, rows.width
            continue
        first = False
        lo = np.maximum(base[todo], hi - w)
        found = np.zeros(len(todo), dtype=bool)
        pos = 0
        for cols, r in _runs(pattern, todo, lo, np.full(len(todo), hi, dtype=_I64)):
            count(len(r))
            with rows.lock:
                found[pos:pos + len(cols)] = _record(out, cols, r)
            pos += len(cols)
        todo = todo[~found & (lo > base[todo])]
        hi, w = hi - w, GROWTH * w
    if columns >= TIMED_COLUMNS:
        path.seconds[cells_first] = (perf_counter() - started) / columns
        if len(path.seconds) == 2:           # both paths timed: the faster
            path.cells_first = path.seconds[True] < path.seconds[False]
        elif path.seconds.get(False, 0.0) >= CELLS_FIRST_SECONDS_PER_COLUMN:
            path.cells_first = True          # a slow chunk of runs: try the last cells first


def non_causal_cell(pattern: Pattern, n: int) -> tuple[int, int] | None:
    """A cell (i, j) with i < j < n that the pattern attends, or None when it is causal below n
    (keys past the pattern's envelope not searched)."""
    _, n = attended_extent(pattern, n, n)
    for c0 in range(0, n, CHUNK):
        j = np.arange(c0, min(n, c0 + CHUNK), dtype=_I64)
        for cols, r in _runs(pattern, j, np.zeros(len(j), dtype=_I64), j):
            if len(r):
                return int(r.start[0]), int(cols[r.line[0]])
    return None


__all__ = ["CHUNK", "CHUNK_RUNS", "DENSE_COLUMNS", "DENSE_LAST_ROWS", "DISTRIBUTE", "FIRST_WINDOW", "GROWTH", "LAST_CELLS",
           "CELLS_FIRST_RUNS_PER_COLUMN",
           "ROWS_FIRST", "ROW_RUNS_PER_KEY", "ROW_WINDOWS", "TOTAL_RUNS", "WHOLE_FIRST",
           "WHOLE_RUNS_MIN", "WHOLE_RUNS_PER_COLUMN", "last_use", "non_causal_cell", "range_max"]
