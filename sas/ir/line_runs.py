"""Exact runs of attended cells along the lines of a mask, derived from the pattern tree.

`line_runs(pattern, axis, fixed, lo, hi)` gives, for each line k (the column `j = fixed[k]`
when `axis` is `COLUMN`, the row `i = fixed[k]` when it is `ROW`), the maximal runs
`[start, stop)` of attended cells among the positions `lo[k] <= x < hi[k]` along the line
(x is the query i on a column, the key j on a row).

Nothing is evaluated cell by cell. Each primitive gives its runs in closed form (a `Diag` is
one run per line, or one cell per stride; a `Rect` one run when the line crosses it), `*` and
`+` combine the runs of their terms by a sweep over the run ends, `~` takes the gaps, and a
spread `unit >> layout` asks its layout for the runs of the block lines its lines cross and
its unit for the runs inside one block, then tiles the unit's runs over the layout's
on-blocks. So the cost follows the number of runs (of the result and of the terms), not the
number of cells: a column of a chunked-attention pattern with chunks of 64K tokens is one run.
"""

from __future__ import annotations

from dataclasses import dataclass
import numpy as np

from sas.errors import AnalysisLimitError
from sas.ir.emptiness import merge_diags, provably_empty
from sas.lang.pattern import And, Not, Or, Pattern, Spread
from sas.lang.primitives import Diag, Dynamic, Rect

COLUMN, ROW = 0, 1
#: Windows of at most this many cells (lines x longest range) are evaluated cell by cell with
#: `Pattern.evaluate` and read back as runs: for a small window one pass over the tree costs
#: less than the run algebra's many small steps.
DENSE_CELLS = 1 << 15
#: Most runs one step of `line_runs` builds (each run costs 24 bytes, its sort about as much
#: again); the message names the pattern and the numbers when a pattern needs more.
RUN_LIMIT = 1 << 24
#: A sum whose first terms leave more than this many gaps a line evaluates the next term on the
#: whole lines and merges (while that takes at most as many runs as the gaps and the runs so
#: far), instead of inside every gap.
UNION_GAPS = 2

#: A product (a sum) reads next the first of its terms left, in the tree's order, that makes at
#: most `AND_RUNS` times as many runs as the lines and runs (gaps) so far, that budget growing
#: `AND_GROWTH` times a round while none does (`_sparsest`).
AND_RUNS = 4
AND_GROWTH = 8

_I64 = np.int64


@dataclass(frozen=True, eq=False)
class Runs:
    """Runs `[start, stop)` of attended positions on `n_lines` lines: sorted by line, then by
    start; disjoint and never adjacent on one line (int64 arrays of one length)."""

    line: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    n_lines: int

    def __len__(self) -> int:
        return len(self.line)

    @property
    def ptr(self) -> np.ndarray:
        """CSR offsets: the runs of line k are `[ptr[k], ptr[k + 1])`."""
        ptr = np.zeros(self.n_lines + 1, dtype=_I64)
        np.cumsum(self.counts(), out=ptr[1:])
        return ptr

    def counts(self) -> np.ndarray:
        """Runs per line."""
        return np.bincount(self.line, minlength=self.n_lines).astype(_I64)


def _empty(n_lines: int) -> Runs:
    z = np.zeros(0, dtype=_I64)
    return Runs(z, z, z, n_lines)


class _Context:
    """The pattern being analysed (for messages) and the running limit check."""

    def __init__(self, pattern: Pattern, limit: int, dense_cells: int):
        self.pattern = pattern
        self.limit = limit
        self.dense_cells = dense_cells

    def check(self, count: int, what: str) -> None:
        if count > self.limit:
            raise AnalysisLimitError(
                f"the runs of attended cells of {self.pattern!r} along the lines the length-independent "
                f"analysis reads need {count} runs for {what}, more than the limit {self.limit} (the runs "
                f"limit): its strides are too fine for its periods, or its offsets and sizes too large; "
                f"give a max_len no larger than needed, or use smaller parameters")


def line_runs(pattern: Pattern, axis: int, fixed: np.ndarray, lo: np.ndarray, hi: np.ndarray, *,
              limit: int = RUN_LIMIT, dense_cells: int | None = None) -> Runs:
    """Runs of attended cells on each line (module doc); `fixed`, `lo`, `hi` are int64 arrays of
    one length with `fixed >= 0` and `0 <= lo`. Raises `AnalysisLimitError` past `limit` runs.
    A window of at most `dense_cells` cells (default `DENSE_CELLS`) is evaluated cell by cell."""
    fixed, lo, hi = (np.asarray(x, dtype=_I64).reshape(-1) for x in (fixed, lo, hi))
    if axis not in (COLUMN, ROW):
        raise ValueError(f"line_runs: axis must be COLUMN or ROW, got {axis!r}")
    ctx = _Context(pattern, limit, DENSE_CELLS if dense_cells is None else dense_cells)
    # the equal pattern with parameters within the index range (no overflow below)
    return _runs(pattern._index_safe, axis, fixed, np.maximum(lo, 0), hi, ctx)


def _dense(pattern: Pattern, axis: int, fixed: np.ndarray, lo: np.ndarray, hi: np.ndarray, width: int) -> Runs:
    """`line_runs` by evaluating every cell of the window (small windows)."""
    m = len(fixed)
    if m == 0 or width <= 0:
        return _empty(m)
    x = lo[:, None] + np.arange(width, dtype=_I64)[None, :]
    on = x < hi[:, None]
    xs = np.minimum(x, np.maximum(hi - 1, lo)[:, None])
    i, j = (xs, fixed[:, None]) if axis == COLUMN else (fixed[:, None], xs)
    on &= np.asarray(pattern.evaluate(i, j), dtype=bool)
    padded = np.zeros((m, width + 2), dtype=np.int8)
    padded[:, 1:-1] = on
    line, edge = np.nonzero(np.diff(padded, axis=1))
    return Runs(line[0::2].astype(_I64), lo[line[0::2]] + edge[0::2], lo[line[1::2]] + edge[1::2], m)


# --- helpers --------------------------------------------------------------------------------


def _merge_adjacent(line: np.ndarray, start: np.ndarray, stop: np.ndarray, n_lines: int) -> Runs:
    """Runs from disjoint runs sorted by (line, start): empty ones dropped, touching ones joined."""
    keep = stop > start
    if not keep.all():
        line, start, stop = line[keep], start[keep], stop[keep]
    if len(line) > 1:
        new = np.ones(len(line), dtype=bool)
        new[1:] = (line[1:] != line[:-1]) | (start[1:] != stop[:-1])
        if not new.all():
            first = np.flatnonzero(new)
            last = np.append(first[1:], len(line)) - 1
            line, start, stop = line[first], start[first], stop[last]
    return Runs(line, start, stop, n_lines)


def _order(line: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Indices sorting by (line, pos)."""
    if len(line) == 0:
        return np.zeros(0, dtype=_I64)
    span = int(pos.max()) - int(pos.min()) + 1
    if (int(line.max()) + 1) * span < (1 << 62):
        return np.argsort(line * span + (pos - pos.min()), kind="stable")
    return np.lexsort((pos, line))


def from_disjoint(line: np.ndarray, start: np.ndarray, stop: np.ndarray, n_lines: int) -> Runs:
    """`Runs` from disjoint runs in any order (empty ones dropped, touching ones joined)."""
    if len(line) > 1:
        dl = np.diff(line)
        if not np.all((dl > 0) | ((dl == 0) & (start[1:] > start[:-1]))):
            o = _order(line, start)
            line, start, stop = line[o], start[o], stop[o]
    return _merge_adjacent(line, start, stop, n_lines)


def _unique(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct values, index of each key's value) of an int64 array; by counting
    when the values span a small range."""
    if len(keys) == 0:
        return keys, keys
    step = np.diff(keys)
    if bool((step >= 0).all()):                 # already sorted (lines in order): no sort
        new = np.ones(len(keys), dtype=bool)
        new[1:] = step > 0
        return keys[new], np.cumsum(new) - 1
    low, span = int(keys.min()), int(keys.max()) - int(keys.min()) + 1
    if span <= 4 * len(keys) + 1024:
        present = np.zeros(span, dtype=bool)
        present[keys - low] = True
        rank = np.cumsum(present) - 1
        return np.flatnonzero(present).astype(_I64) + low, rank[keys - low]
    values, inverse = np.unique(keys, return_inverse=True)
    return values, inverse.reshape(-1)


def unique_rows(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray],
                                                                        np.ndarray]:
    """(the distinct (a, b, c) rows as three int64 columns, sorted; index of each row's) for
    int64 columns of one length >= 1."""
    lows = [int(x.min()) for x in (a, b, c)]
    spans = [int(x.max()) - lo + 1 for x, lo in zip((a, b, c), lows)]
    if spans[0] * spans[1] * spans[2] < (1 << 62):
        key = ((a - lows[0]) * spans[1] + (b - lows[1])) * spans[2] + (c - lows[2])
        step = np.diff(key)
        if bool((step >= 0).all()):          # rows in order already (lines in order): their first copies
            new = np.ones(len(key), dtype=bool)
            new[1:] = step > 0
            first = np.flatnonzero(new)
            return (a[first], b[first], c[first]), np.cumsum(new) - 1
        values, inverse = _unique(key)
        return (values // (spans[1] * spans[2]) + lows[0], values // spans[2] % spans[1] + lows[1],
                values % spans[2] + lows[2]), inverse
    rows, inverse = np.unique(np.stack([a, b, c], axis=1), axis=0, return_inverse=True)
    return (rows[:, 0], rows[:, 1], rows[:, 2]), inverse.reshape(-1)


def _progression(ctx: _Context, line: np.ndarray, a: np.ndarray, b: np.ndarray, mod: int,
                 residue: np.ndarray, n_lines: int) -> Runs:
    """On each listed line, the positions x in [a, b) with x = residue (mod `mod`): one run
    when mod is 1, else one single-cell run per position. `line` is non-decreasing."""
    if mod == 1:
        return _merge_adjacent(line, a, b, n_lines)
    first = a + (residue - a) % mod
    count = np.maximum(0, -(-(b - first) // mod))
    total = int(count.sum())
    ctx.check(total, f"cells every {mod} positions")
    idx = np.repeat(np.arange(len(line), dtype=_I64), count)
    offs = np.cumsum(count) - count
    x = first[idx] + mod * (np.arange(total, dtype=_I64) - offs[idx])
    return Runs(line[idx], x, x + 1, n_lines)


def axis_selects(x: np.ndarray, rng: tuple[int | None, int | None], stride: int, offset: int) -> np.ndarray:
    """Which of the indices x a Rect axis (its range, stride and offset) selects."""
    a, b = rng
    m = np.ones(x.shape, dtype=bool)
    if a is not None:
        m &= x >= a
    if b is not None:
        m &= x < b
    if stride > 1:
        m &= (x - (a or 0)) % stride == offset
    return m


# --- the recursion --------------------------------------------------------------------------


def _runs(p: Pattern, axis: int, fixed: np.ndarray, lo: np.ndarray, hi: np.ndarray, ctx: _Context) -> Runs:
    m = len(fixed)
    if m == 0:
        return _empty(0)
    width = int((hi - lo).max())
    if m * width <= ctx.dense_cells:
        return _dense(p, axis, fixed, lo, hi, width)
    if isinstance(p, Dynamic):
        return _merge_adjacent(np.arange(m, dtype=_I64), lo, hi, m)
    if isinstance(p, (And, Or, Spread)) and provably_empty(p):
        return _empty(m)
    if isinstance(p, (Diag, Rect)):
        return _primitive(p, axis, fixed, lo, hi, ctx)
    if isinstance(p, Not):
        if isinstance(p.a, Not):            # ~~a = a: two complements of the same runs
            return _runs(p.a.a, axis, fixed, lo, hi, ctx)
        return _complement(_runs(p.a, axis, fixed, lo, hi, ctx), lo, hi)
    if isinstance(p, And):
        # Each term only inside the runs of the terms before it (primitives of one run per
        # line first, then the fewest runs a line, finest terms last): the intermediate runs
        # never outnumber the coarsest term's, a band (`Causal()`) bounds the range of
        # everything after it, and a bounded strided Rect is read before an endless strided
        # Diag (which alone makes a run every few cells of every line).
        merged = merge_diags(p.terms)       # not None: provably_empty above reads the same merge
        # A strided diagonal's band (one run a line) bounds the range of the terms after it:
        # `spread * Diag(52, None, stride=5)` reads the spread only below the band's start,
        # where the diagonal alone would make a run every 5 cells of every line.
        merged += [Diag(t.offset, t.size, 1) for t in merged if isinstance(t, Diag) and t.stride > 1]
        rest = sorted(merged, key=lambda t: (not _single_run(t), _runs_bound(t), _fineness(t)))
        acc = _merge_adjacent(np.arange(m, dtype=_I64), lo, hi, m)         # the whole lines
        while rest and len(acc):
            k, acc = _sparsest(rest, acc, axis, fixed, ctx)
            rest.pop(k)
        return acc
    if isinstance(p, Or):
        # Each term only inside the gaps the terms before it leave: the terms of fewest runs a
        # line first (a complement of a short band fills nearly everything and leaves a few gaps
        # for a strided diagonal to fill cell by cell; the other way round the diagonal alone
        # makes a run every few cells), then the least strided.
        rest = sorted(p.terms, key=lambda t: (_runs_bound(t), _fineness(t)))
        acc = _empty(m)
        while rest:
            gaps = _complement(acc, lo, hi)
            if len(gaps) == 0:
                break
            if len(gaps) > UNION_GAPS * m:
                # The terms before cut the lines into many gaps: the term on the whole lines (a
                # third of the lines for three gaps a line), merged, while it has few runs there.
                whole = _bounded(rest[0], axis, fixed, lo, hi, ctx, len(gaps) + len(acc))
                if whole is not None:
                    ctx.check(len(acc) + len(whole), f"the terms of {p!r}")
                    joined = _union(acc, whole)
                    if joined is not None:
                        acc = joined
                        rest.pop(0)
                        continue
            k, more = _sparsest(rest, gaps, axis, fixed, ctx)
            rest.pop(k)
            ctx.check(len(acc) + len(more), f"the terms of {p!r}")
            acc = from_disjoint(np.concatenate([acc.line, more.line]), np.concatenate([acc.start, more.start]),
                                np.concatenate([acc.stop, more.stop]), m)
        return acc
    if isinstance(p, Spread):
        return _spread(p, axis, fixed, lo, hi, ctx)
    raise TypeError(f"line_runs: unknown pattern node {type(p).__name__}")


def _sparsest(terms: list[Pattern], within: Runs, axis: int, fixed: np.ndarray,
              ctx: _Context) -> tuple[int, Runs]:
    """The runs inside `within` of the term (of a product, or of a sum inside its gaps) to read
    next, as (its index, its runs): the first, in the tree's order, that makes at most a budget
    of runs, the budget `AND_RUNS` times the runs and lines of `within` and `AND_GROWTH` times
    larger each round until one fits (the runs limit last). The order from the tree is a guess:
    a term that cuts these lines finely (a stride-2 diagonal, on columns far from the end) may
    come before a spread that is empty on them, or a complement that fills them. A term read
    takes at most `AND_GROWTH` times the runs of the sparsest one; the rounds before cost at
    most their budgets."""
    cap = AND_RUNS * (len(within) + within.n_lines)
    while len(terms) > 1:
        bounded = _Context(ctx.pattern, min(cap, ctx.limit), ctx.dense_cells)
        for k, t in enumerate(terms):
            try:
                return k, _inside(t, within, axis, fixed, bounded)
            except AnalysisLimitError:
                continue
        if cap >= ctx.limit:
            break
        cap *= AND_GROWTH
    return 0, _inside(terms[0], within, axis, fixed, ctx)


def _bounded(p: Pattern, axis: int, fixed: np.ndarray, lo: np.ndarray, hi: np.ndarray, ctx: _Context,
             limit: int) -> Runs | None:
    """The runs of p, or None as soon as a step needs more than `limit` runs (the caller then
    takes another way; the work spent is bounded by the limit)."""
    try:
        return _runs(p, axis, fixed, lo, hi, _Context(ctx.pattern, min(ctx.limit, limit), ctx.dense_cells))
    except AnalysisLimitError:
        return None


def _union(a: Runs, b: Runs) -> Runs | None:
    """The union of two run sets on the same lines (overlapping or touching runs joined); None
    when lines x positions do not pack into an int64."""
    line = np.concatenate([a.line, b.line])
    start = np.concatenate([a.start, b.start])
    stop = np.concatenate([a.stop, b.stop])
    if len(line) == 0:
        return _empty(a.n_lines)
    o = _order(line, start)
    line, start, stop = line[o], start[o], stop[o]
    # the furthest stop of the runs before each one on its line: a run starts a new one past it
    low = int(start.min())
    span = int(stop.max()) - low + 1
    if (int(line.max()) + 1) * span < (1 << 62):
        reach = np.maximum.accumulate(line * span + (stop - low))    # lines ascending: per line
        new = np.ones(len(line), dtype=bool)
        new[1:] = (line[1:] != line[:-1]) | (line[1:] * span + (start[1:] - low) > reach[:-1])
        first = np.flatnonzero(new)
        last = np.append(first[1:], len(line)) - 1
        return Runs(line[first], start[first], reach[last] - line[first] * span + low, a.n_lines)
    return None                                  # positions too wide to pack: the caller reads the gaps


def _single_run(p: Pattern) -> bool:
    """A primitive with at most one run on every line (an unstrided Diag or Rect)."""
    return (isinstance(p, Diag) and p.stride == 1) or (isinstance(p, Rect) and p.stride == (1, 1))


def _runs_bound(p: Pattern) -> float:
    """A bound on the runs a term has on any line, from the tree (inf: grows with the line, as
    a strided primitive without an end does); used only to order the terms of sums and products."""
    return min(_runs_bound_tree(p), _cells_bound(p))


def _cells_bound(p: Pattern) -> float:
    """A bound on the attended cells of any line (row or column), from the tree (inf where a
    line can hold cells without end). A spread's line crosses at most that many on-blocks of
    its layout's line, each holding at most a block's side of cells: a spread over a short
    band has few cells a line however long its lines are."""
    if isinstance(p, Diag):
        return float("inf") if p.size is None else -(-p.size // p.stride)
    if isinstance(p, Rect):
        # positions are >= 0: an open start is 0
        counts = [float("inf") if b is None else max(0, -(-(b - max(a or 0, 0)) // s))
                  for (a, b), s in zip((p.rows, p.cols), p.stride)]
        return max(counts)
    if isinstance(p, And):
        return min(_cells_bound(t) for t in p.terms)
    if isinstance(p, Or):
        return sum(_cells_bound(t) for t in p.terms)
    if isinstance(p, Spread):
        return _cells_bound(p.layout) * max(p.shape)
    return float("inf")                     # a complement, a dynamic component


def _runs_bound_tree(p: Pattern) -> float:
    if isinstance(p, Diag):
        return 1 if p.stride == 1 else (float("inf") if p.size is None else -(-p.size // p.stride))
    if isinstance(p, Rect):
        bound = 1.0
        for (a, b), s in zip((p.rows, p.cols), p.stride):
            if s > 1:
                bound *= float("inf") if a is None or b is None else -(-(b - a) // s)
        return bound
    if isinstance(p, Dynamic):
        return 1
    if isinstance(p, Not):
        return _runs_bound(p.a) + 1
    if isinstance(p, (And, Or)):
        return sum(_runs_bound(t) for t in p.terms)
    return float("inf")                     # a spread: a run per on-block at least (or its cells)


def _fineness(p: Pattern) -> int:
    """How many strided primitives a term holds (the finer, the later it is evaluated)."""
    return sum(1 for q in p.walk() if (isinstance(q, Diag) and q.stride > 1)
               or (isinstance(q, Rect) and q.stride != (1, 1)))


def _inside(p: Pattern, within: Runs, axis: int, fixed: np.ndarray, ctx: _Context) -> Runs:
    """The runs of p inside the runs `within` (each run read as a line of its own)."""
    sub = _runs(p, axis, fixed[within.line], within.start, within.stop, ctx)
    return _merge_adjacent(within.line[sub.line], sub.start, sub.stop, within.n_lines)


#: An end past every index, for a primitive unbounded on that side of a line.
FAR = 1 << 62


def progression(p: Diag | Rect, axis: int, fixed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int,
                                                                        np.ndarray]:
    """A Diag or Rect along each line as a progression: (on, a, b, mod, residue), the line
    attending the positions a <= x < b with x = residue (mod `mod`) where `on` (a Rect misses the
    lines outside its rows or columns); an open end is -FAR or FAR."""
    m = len(fixed)
    if isinstance(p, Diag):
        o, s = p.offset, p.size
        on = np.ones(m, dtype=bool)
        if axis == COLUMN:      # i - j in [o, o + s): i in [j + o, j + o + s), i = j + o (mod t)
            a = fixed + o
            b = np.full(m, FAR, dtype=_I64) if s is None else fixed + o + s
            residue = fixed + o
        else:                   # j in (i - o - s, i - o], j = i - o (mod t)
            a = np.full(m, -FAR, dtype=_I64) if s is None else fixed - o - s + 1
            b = fixed - o + 1
            residue = fixed - o
        return on, a, b, p.stride, residue
    (r0, r1), (c0, c1) = p.rows, p.cols
    (sr, sc), (orr, oc) = p.stride, p.offset
    if axis == COLUMN:
        on = axis_selects(fixed, (c0, c1), sc, oc)
        (x0, x1), mod, off = (r0, r1), sr, orr
    else:
        on = axis_selects(fixed, (r0, r1), sr, orr)
        (x0, x1), mod, off = (c0, c1), sc, oc
    a = np.full(m, x0 or 0, dtype=_I64)
    b = np.full(m, FAR if x1 is None else x1, dtype=_I64)
    return on, a, b, mod, np.full(m, (x0 or 0) + off, dtype=_I64)


def _primitive(p: Diag | Rect, axis: int, fixed: np.ndarray, lo: np.ndarray, hi: np.ndarray, ctx: _Context) -> Runs:
    on, a, b, mod, residue = progression(p, axis, fixed)
    k = np.arange(len(fixed), dtype=_I64) if on.all() else np.flatnonzero(on).astype(_I64)
    return _progression(ctx, k, np.maximum(lo[k], a[k]), np.minimum(hi[k], b[k]), mod, residue[k], len(fixed))


def _complement(r: Runs, lo: np.ndarray, hi: np.ndarray) -> Runs:
    """The gaps of r inside [lo, hi) on each line."""
    m = r.n_lines
    counts = r.counts()
    # line k's gaps: [lo, start_0), [stop_0, start_1), ..., [stop_last, hi), in slots
    # first[k] .. first[k] + counts[k] of the output (one more slot per line than runs)
    first = np.cumsum(counts + 1) - (counts + 1)
    after = np.arange(len(r), dtype=_I64) + r.line + 1      # the slot of the gap after each run
    total = len(r) + m
    g_start = np.empty(total, dtype=_I64)
    g_stop = np.empty(total, dtype=_I64)
    g_start[first] = lo
    g_start[after] = r.stop
    g_stop[after - 1] = r.start
    g_stop[first + counts] = hi
    g_line = np.repeat(np.arange(m, dtype=_I64), counts + 1)
    return _merge_adjacent(g_line, g_start, g_stop, m)


def _spread(p: Spread, axis: int, fixed: np.ndarray, lo: np.ndarray, hi: np.ndarray, ctx: _Context) -> Runs:
    h, w = p.shape
    across, along = (w, h) if axis == COLUMN else (h, w)   # block size across / along the lines
    m = len(fixed)
    live = np.flatnonzero(hi > lo).astype(_I64)
    if len(live) == 0:
        return _empty(m)
    # The unit's lines, inside one block.
    uu, uwhich = _unique(fixed[live] % across)
    unit = _runs(p.unit, axis, uu, np.zeros(len(uu), _I64), np.full(len(uu), along, _I64), ctx)
    ucount = unit.counts()
    # Lines whose unit line is empty hold nothing: the layout is read for the others only.
    if not ucount.all():
        some = ucount[uwhich] > 0
        live, uwhich = live[some], uwhich[some]
        if len(live) == 0:
            return _empty(m)
    # The layout's lines (block lines) over the blocks the line's range crosses.
    (bline, blo, bhi), which = unique_rows(fixed[live] // across, lo[live] // along, -(-hi[live] // along))
    lay = _runs(p.layout, axis, bline, blo, bhi, ctx)
    uptr = unit.ptr
    full = np.zeros(len(uu), dtype=bool)
    if len(unit):
        first = np.minimum(uptr[:-1], len(unit) - 1)
        full = (ucount == 1) & (unit.start[first] == 0) & (unit.stop[first] == along)
    # Every (line, layout run) pair.
    lcount = lay.counts()[which]
    total = int(lcount.sum())
    ctx.check(total, f"the layout of {p!r}")
    if total == 0:
        return _empty(m)
    lptr = lay.ptr
    rep = np.repeat(np.arange(len(live), dtype=_I64), lcount)
    offs = np.cumsum(lcount) - lcount
    run = lptr[which[rep]] + np.arange(total, dtype=_I64) - offs[rep]
    b0, b1 = lay.start[run], lay.stop[run]          # on-blocks [b0, b1)
    k = live[rep]                                   # the line
    uk = uwhich[rep]                                # its unit line
    line_lo, line_hi = lo[k], hi[k]
    # Lines whose unit fills the block: one run per layout run.
    f = full[uk]
    if f.all():
        out_line, out_a, out_b = [k], [np.maximum(b0 * along, line_lo)], [np.minimum(b1 * along, line_hi)]
        g = np.zeros(0, dtype=_I64)
    else:
        out_line = [k[f]]
        out_a = [np.maximum(b0[f] * along, line_lo[f])]
        out_b = [np.minimum(b1[f] * along, line_hi[f])]
        # Others: the unit's runs in every on-block.
        g = np.flatnonzero(~f & (ucount[uk] > 0))
    if len(g):
        nb = b1[g] - b0[g]
        nu = ucount[uk[g]]
        cnt = nb * nu
        tot = int(cnt.sum())
        ctx.check(tot, f"the unit of {p!r} tiled over its layout")
        r2 = np.repeat(np.arange(len(g), dtype=_I64), cnt)
        within = np.arange(tot, dtype=_I64) - (np.cumsum(cnt) - cnt)[r2]
        block = b0[g][r2] + within // nu[r2]
        ur = uptr[uk[g][r2]] + within % nu[r2]
        kk = k[g][r2]
        out_line.append(kk)
        out_a.append(np.maximum(block * along + unit.start[ur], lo[kk]))
        out_b.append(np.minimum(block * along + unit.stop[ur], hi[kk]))
    if len(out_line) == 1:
        line, a, b = out_line[0], out_a[0], out_b[0]
    else:
        line, a, b = np.concatenate(out_line), np.concatenate(out_a), np.concatenate(out_b)
    keep = b > a
    if not keep.all():
        line, a, b = line[keep], a[keep], b[keep]
    return from_disjoint(line, a, b, m)


__all__ = ["COLUMN", "DENSE_CELLS", "FAR", "ROW", "RUN_LIMIT", "Runs", "axis_selects", "from_disjoint", "line_runs",
           "progression", "unique_rows"]
