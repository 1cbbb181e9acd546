"""The last attended cell of each line of a mask, from the pattern tree, without its runs.

`last_cells(pattern, axis, fixed, lo, hi)` gives, for each line k (the column `j = fixed[k]`
when `axis` is `COLUMN`, the row `i = fixed[k]` when it is `ROW`), the largest position
`lo[k] <= x < hi[k]` the pattern attends on that line (-1 when none does), and whether the
query settled it (`known`). The per-token analysis asks it for the last use of every key: a
column whose cells come in many runs (a strided spread, the complement of a drifting spread cut
by a lattice) is answered without building them.

Each node answers for itself and for its complement (`neg`):
- a `Diag` or `Rect` is a progression on each line: its last member, or its last non-member
  (the last position, the one before it, or the cell before the band);
- a sum of the attended (a product of the complements) is the largest of its terms' answers,
  each term asked only above the best answer of the terms before it;
- a product of the attended (a sum of the complements) steps down: each term in turn answers at
  or below the position so far, which becomes its answer, until all terms agree (the line's
  answer) or one has none; a term that answered the position itself is not asked again until
  the position drops below it (a leapfrog join); lines that have not agreed after `ROUNDS`
  passes over the terms are left unknown (`known` False) for the caller's run-based search;
- a spread asks its layout for the last on-block (off-block) and its unit for the last cell
  (non-cell) inside it: the top block, partly in range, first, then the blocks below;
- a sum, product or spread whose envelope (`sas.ir.envelope.node_extent`) ends before a line or
  a range's end answers there without its subtree: nothing past the extent, and for its
  complement the range's last position.
"""

from __future__ import annotations

import numpy as np

from sas.ir.emptiness import merge_diags, provably_empty
from sas.ir.envelope import NODE_BOX, node_extent
from sas.ir.line_runs import COLUMN, ROW, progression, unique_rows
from sas.lang.pattern import And, Not, Or, Pattern, Spread
from sas.lang.primitives import Diag, Dynamic, Rect

#: Passes over its terms a product may take down a line before the line is left unknown.
ROUNDS = 48

_I64 = np.int64
#: Above every position: a term not yet asked.
_ABOVE = np.iinfo(np.int64).max


def last_cells(pattern: Pattern, axis: int, fixed: np.ndarray, lo: np.ndarray,
               hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(last, known): the last attended position in [lo, hi) of each line (-1: none), exact
    where `known` (module doc); `fixed`, `lo`, `hi` int64 arrays of one length, `fixed >= 0`."""
    if axis not in (COLUMN, ROW):
        raise ValueError(f"last_cells: axis must be COLUMN or ROW, got {axis!r}")
    fixed, lo, hi = (np.asarray(x, dtype=_I64).reshape(-1) for x in (fixed, lo, hi))
    return _last(pattern._index_safe, False, axis, fixed, np.maximum(lo, 0), hi)


def _last(p: Pattern, neg: bool, axis: int, fixed: np.ndarray, lo: np.ndarray,
          hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The last position in [lo, hi) where p (its complement when `neg`) holds, and known."""
    m = len(fixed)
    known = np.ones(m, dtype=bool)
    if m == 0:
        return np.zeros(0, dtype=_I64), known
    if isinstance(p, Not):
        return _last(p.a, not neg, axis, fixed, lo, hi)
    if isinstance(p, Dynamic):                  # a region covering every cell
        return (np.full(m, -1, dtype=_I64) if neg else np.where(hi > lo, hi - 1, -1)), known
    if isinstance(p, (And, Or, Spread)) and provably_empty(p):
        return (np.where(hi > lo, hi - 1, -1) if neg else np.full(m, -1, dtype=_I64)), known
    if isinstance(p, (Diag, Rect)):
        return _progression_last(p, neg, axis, fixed, lo, hi), known
    bounded = _within_extent(p, neg, axis, fixed, lo, hi)
    if bounded is not None:
        return bounded
    if isinstance(p, (And, Or)):
        if isinstance(p, Or) != neg:            # a union: the largest answer
            # the first term on every line, each next one only above the best answer so far
            # and on the lines where it can still raise it
            best, known = (x.copy() for x in _last(p.terms[0], neg, axis, fixed, lo, hi))
            for t in p.terms[1:]:
                start = np.maximum(lo, best + 1)
                ask = np.flatnonzero(start < hi)
                if not len(ask):
                    break
                x, k = _last(t, neg, axis, fixed[ask], start[ask], hi[ask])
                best[ask] = np.maximum(best[ask], x)
                known[ask] &= k
            return best, known
        # a product's diagonals merged (never None here: provably_empty above reads the merge)
        terms = list(p.terms) if neg else merge_diags(p.terms)
        return _intersection(terms, neg, axis, fixed, lo, hi)
    if isinstance(p, Spread):
        return _spread_last(p, neg, axis, fixed, lo, hi)
    raise TypeError(f"last_cells: unknown pattern node {type(p).__name__}")


def _within_extent(p: Pattern, neg: bool, axis: int, fixed: np.ndarray, lo: np.ndarray,
                   hi: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """`_last` of a sum, product or spread whose envelope (`sas.ir.envelope.node_extent`) ends
    before the lines or positions asked: past it, p holds nowhere, so its complement holds at
    the range's last position; p itself is asked only on the lines that reach into it, cut to
    its extent. None where the extent cuts nothing."""
    if not isinstance(p, (And, Or, Spread)):
        return None
    rows, cols = node_extent(p)
    if max(rows, cols) >= NODE_BOX and max(int(hi.max()), int(fixed.max()) + 1) > NODE_BOX:
        return None                         # past the box, a region reaching its edge may go on
    line_end, pos_end = (cols, rows) if axis == COLUMN else (rows, cols)
    if int(hi.max()) <= pos_end and int(fixed.max()) < line_end:
        return None
    inside = fixed < line_end
    if neg:                                 # the complement holds past the extent
        beyond = ~inside | (hi > pos_end)
        if not beyond.any():
            return None
        x, known = np.where(hi > lo, hi - 1, -1), np.ones(len(fixed), dtype=bool)
        ask = np.flatnonzero(~beyond)
        if len(ask):
            x[ask], known[ask] = _last(p, neg, axis, fixed[ask], lo[ask], hi[ask])
        return x, known
    x, known = np.full(len(fixed), -1, dtype=_I64), np.ones(len(fixed), dtype=bool)
    ask = np.flatnonzero(inside & (lo < pos_end))
    if len(ask):
        x[ask], known[ask] = _last(p, neg, axis, fixed[ask], lo[ask], np.minimum(hi[ask], pos_end))
    return x, known


def _progression_last(p: Diag | Rect, neg: bool, axis: int, fixed: np.ndarray, lo: np.ndarray,
                      hi: np.ndarray) -> np.ndarray:
    """A Diag or Rect on each line (`line_runs.progression`): its last member in [lo, hi), or
    its last non-member."""
    on, a, b, mod, residue = progression(p, axis, fixed)
    top = hi - 1
    if not neg:
        first = np.maximum(a, lo)
        last = np.minimum(b, hi) - 1
        x = last if mod == 1 else last - (last - residue) % mod
        return np.where(on & (last >= first) & (x >= first), x, -1)
    member = on & (top >= a) & (top < b) & ((top - residue) % mod == 0)
    # the line's last position if it is off; else (stride >= 2) the one before it; else (one
    # band) the cell before the band
    x = np.where(~member, top, top - 1 if mod >= 2 else a - 1)
    return np.where(x >= lo, x, -1)


def _intersection(terms: list[Pattern], neg: bool, axis: int, fixed: np.ndarray, lo: np.ndarray,
                  hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The last position where every term holds (each negated when `neg`): step down until the
    terms agree (module doc). A term is asked again only on the lines where its last answer
    lies above the position so far (one that answered the position itself still holds there),
    and each answer lowers the position before the next term is asked (a leapfrog join)."""
    m = len(fixed)
    out = np.full(m, -1, dtype=_I64)
    known = np.ones(m, dtype=bool)
    live = np.flatnonzero(hi > lo).astype(_I64)
    top = hi[live] - 1
    xs = np.full((len(terms), len(live)), _ABOVE, dtype=_I64)   # each term's last answer
    sure = np.ones(len(live), dtype=bool)
    for _ in range(ROUNDS):
        if not len(live):
            return out, known
        for t, term in enumerate(terms):
            want = (xs[t] > top) & (top >= 0) & sure
            ask = np.flatnonzero(want)
            if not len(ask):
                continue
            if len(ask) == len(live):           # every line (a first round): views, no gathers
                ask = slice(None)
            at = live[ask]
            x, k = _last(term, neg, axis, fixed[at], lo[at], top[ask] + 1)
            xs[t, ask] = x
            sure[ask] &= k
            top[ask] = np.minimum(top[ask], x)
        agree = (xs == top).all(axis=0)
        done = agree | (top < 0) | ~sure
        out[live[done]] = np.where(agree[done], top[done], -1)
        known[live[done]] = sure[done]
        keep = ~done
        live, top, xs, sure = live[keep], top[keep], xs[:, keep], sure[keep]
    known[live] = False
    return out, known


def _distinct(p: Pattern, neg: bool, axis: int, fixed: np.ndarray, lo: np.ndarray,
              hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`_last` asked once per distinct (line, lo, hi): a spread's neighbouring lines share
    their layout's block line and their unit's line (and a chunk of columns its range's end),
    so nested spreads ask each level for ever fewer lines. A primitive answers a line for less
    than the sort that finds its repeats, and distinct lines cannot repeat: both are asked as
    they are."""
    if len(fixed) < 2 or isinstance(p, (Diag, Rect)) or bool((np.diff(fixed) > 0).all()):
        return _last(p, neg, axis, fixed, lo, hi)
    (f, a, b), which = unique_rows(fixed, lo, hi)
    if len(f) == len(fixed):
        return _last(p, neg, axis, fixed, lo, hi)
    x, known = _last(p, neg, axis, f, a, b)
    return x[which], known[which]


def _spread_last(p: Spread, neg: bool, axis: int, fixed: np.ndarray, lo: np.ndarray,
                 hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`unit >> layout` on each line: the layout's block line and the unit's line inside a block
    (module doc)."""
    h, w = p.shape
    across, along = (w, h) if axis == COLUMN else (h, w)
    m = len(fixed)
    out = np.full(m, -1, dtype=_I64)
    known = np.ones(m, dtype=bool)
    live = np.flatnonzero(hi > lo).astype(_I64)
    if not len(live):
        return out, known
    f, a, b = fixed[live], lo[live], hi[live]
    uline, bline = f % across, f // across
    btop = (b - 1) // along                     # the top block, partly in range
    bot = a // along                            # the bottom block, partly in range

    def layout(lines: np.ndarray, neg_: bool, b0: np.ndarray, b1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return _distinct(p.layout, neg_, axis, lines, b0, b1)

    def unit(at: np.ndarray, u0: np.ndarray, u1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return _distinct(p.unit, neg, axis, uline[at], u0, u1)

    # the last on-block up to the top one (partly in range)
    last_on, sure = layout(bline, False, bot, btop + 1)
    sure = sure.copy()
    top_on = last_on == btop
    # an off top block (complement): the range's last position; an on one: its unit's last cell
    # (non-cell) from the range's start in it to the range's end
    best = np.where(top_on, -1, b - 1) if neg else np.full(len(f), -1, dtype=_I64)
    at = np.flatnonzero(top_on)
    if len(at):
        x, k = unit(at, np.maximum(a[at] - btop[at] * along, 0), b[at] - btop[at] * along)
        best[at] = np.where(x >= 0, btop[at] * along + x, -1)
        sure[at] &= k
    # the blocks below the top one, on the lines the top block leaves unanswered: the last
    # on-block (every whole block holds its unit line's last cell, or non-cell, at the same
    # place, so the last on-block holds the largest; the bottom block only from the range's
    # start), and for the complement the last off-block too (its last position)
    need = np.flatnonzero((best < 0) & (btop > bot))
    if len(need):
        below_on = last_on[need]
        again = np.flatnonzero(top_on[need])          # the last on-block was the top one
        if len(again):
            i = need[again]
            below_on[again], k = layout(bline[i], False, bot[i], btop[i])
            sure[i] &= k
        is_whole = below_on > bot[need]
        whole, at_bot = need[is_whole], need[below_on == bot[need]]
        if len(whole):
            x, k = unit(whole, np.zeros(len(whole), dtype=_I64), np.full(len(whole), along, dtype=_I64))
            best[whole] = np.where(x >= 0, below_on[is_whole] * along + x, -1)
            sure[whole] &= k
        if len(at_bot):
            x, k = unit(at_bot, a[at_bot] - bot[at_bot] * along, np.full(len(at_bot), along, dtype=_I64))
            best[at_bot] = np.where(x >= 0, bot[at_bot] * along + x, -1)
            sure[at_bot] &= k
        if neg:
            x, k = layout(bline[need], True, bot[need], btop[need])
            best[need] = np.maximum(best[need], np.where(x >= 0, (x + 1) * along - 1, -1))
            sure[need] &= k
    out[live] = best
    known[live] = sure
    return out, known


__all__ = ["COLUMN", "ROUNDS", "ROW", "last_cells"]
