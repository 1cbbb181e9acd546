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
  the position drops below it (a leapfrog join). Terms that never meet would step down a
  line without end (lattices of one period and other residues): the product repeats along a
  line between a few boundaries (`sas.ir.line_period`), so a periodic piece in which a whole
  period holds no common cell holds none, and the position drops below it. Where two or more
  terms restrict a position's residue (a strided Diag or Rect its stride's, a spread its
  unit's rows on the line: `_residues`), the position steps only to residues all of them
  allow, and a line that allows none holds no common cell. Lines that have not agreed after
  `ROUNDS` passes over the terms are left unknown (`known` False) for the caller's run-based
  search;
- a spread asks its layout for the last on-block (off-block) and its unit for the last cell
  (non-cell) inside it: the top block, partly in range, first, then the blocks below;
- a sum, product or spread whose envelope (`sas.ir.envelope.node_extent`) ends before a line or
  a range's end answers there without its subtree: nothing past the extent, and for its
  complement the range's last position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sas.ir.emptiness import merge_diags, provably_empty
from sas.ir.envelope import NODE_BOX, node_extent
from sas.ir.line_period import LONG, line_period, terms_period, terms_piece_period, terms_piece_start
from sas.ir.line_runs import COLUMN, ROW, axis_selects, progression, unique_rows
from sas.lang.pattern import MAX_INDEX, And, Not, Or, Pattern, Spread
from sas.lang.primitives import Diag, Dynamic, Rect

#: Passes over its terms a product may take down a line before the line is left unknown.
ROUNDS = 48

_I64 = np.int64
#: A product's lines that have not agreed after `CHECK_AFTER` rounds skip the periodic pieces
#: of their line that hold no common cell (`sas.ir.line_period`): by the positions passed when
#: they cover a period, else (a period of at most `WINDOW_PERIOD` positions, terms stepping down
#: less than `ROUND_CELLS` positions a round: about what a round costs, in cells) by reading the
#: rest of a period cell by cell (`WINDOW_CELLS` cells at a time).
CHECK_AFTER = 2
WINDOW_PERIOD = 1024
ROUND_CELLS = 4
WINDOW_CELLS = 1 << 21
#: A window is read on the positions of its lines' allowed residues (`_residues`) where they
#: are fewer than `RESIDUE_SHARE` times the cells read otherwise.
RESIDUE_SHARE = 1.0
#: A product's leapfrog steps only to positions whose residues its terms allow (`_residues`)
#: modulo at most `SNAP_MODULUS`; a residue table holds at most `RESIDUE_CELLS` cells (classes
#: of lines x residues).
SNAP_MODULUS = 64
RESIDUE_CELLS = 1 << 16
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
                if len(ask) == len(fixed):      # every line: views, no gathers
                    ask = slice(None)
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
    its last non-member. The members are read from the primitive's numbers directly, in a few
    whole-line passes (this answers most of a deep tree's lines)."""
    if neg:
        return _progression_last_off(p, axis, fixed, lo, hi)
    if isinstance(p, Diag):
        o, s, mod = p.offset, p.size, p.stride
        if axis == COLUMN:      # i in [j + o, j + o + s), i = j + o (mod stride)
            residue = fixed + o
            last = hi - 1 if s is None else np.minimum(residue + s, hi)
            if s is not None:
                last -= 1
            first = np.maximum(residue, lo)
        else:                   # j in (i - o - s, i - o], j = i - o (mod stride)
            residue = fixed - o
            last = np.minimum(residue, hi - 1)
            first = lo if s is None else np.maximum(residue - (s - 1), lo)
        on = None
    else:
        (r0, r1), (c0, c1) = p.rows, p.cols
        (sr, sc), (orr, oc) = p.stride, p.offset
        if axis == COLUMN:
            on = axis_selects(fixed, (c0, c1), sc, oc)
            (x0, x1), mod, residue = (r0, r1), sr, (r0 or 0) + orr
        else:
            on = axis_selects(fixed, (r0, r1), sr, orr)
            (x0, x1), mod, residue = (c0, c1), sc, (c0 or 0) + oc
        last = hi - 1 if x1 is None else np.minimum(hi, x1) - 1
        first = lo if not x0 else np.maximum(lo, x0)
    if mod > 1:                 # down to the progression's last member at or below `last`
        last = last - (last - residue) % mod
    keep = last >= first
    if on is not None:
        keep &= on
    return np.where(keep, last, -1)


def _progression_last_off(p: Diag | Rect, axis: int, fixed: np.ndarray, lo: np.ndarray,
                          hi: np.ndarray) -> np.ndarray:
    """The last non-member of a Diag or Rect in [lo, hi) on each line."""
    on, a, b, mod, residue = progression(p, axis, fixed)
    top = hi - 1
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
    and each answer lowers the position before the next term is asked (a leapfrog join); lines
    that step down slowly skip the periodic pieces without a common cell
    (`_skip_pieces`)."""
    m = len(fixed)
    out = np.full(m, -1, dtype=_I64)
    known = np.ones(m, dtype=bool)
    live = np.flatnonzero(hi > lo).astype(_I64)
    top = hi[live] - 1
    snap = None if neg else _residues(terms, axis, fixed[live], SNAP_MODULUS)
    if snap is not None:                    # the positions the terms' residues allow (module doc)
        down = _down_to_allowed(snap.table)
        some = snap.lines & (down[fixed[live] % snap.period, 0] < snap.modulus)
        if not some.all():                  # no residue allowed: no common cell
            live, top = live[some], top[some]
        if snap.terms < 2:
            snap = None                     # one term answers on its own residues already
        else:
            cls = fixed[live] % snap.period     # each line's row of `down`
            top = _snapped(top, lo[live], down, cls, snap.modulus)
    xs = np.full((len(terms), len(live)), _ABOVE, dtype=_I64)   # each term's last answer
    sure = np.ones(len(live), dtype=bool)
    scan = top.copy()                       # (top, scan] holds no common cell
    rounds = np.zeros(len(live), dtype=_I64)     # rounds since scan was set
    pieces = np.zeros(len(live), dtype=_I64)     # the period of scan's piece (0: not asked yet)
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
        if snap is not None:                # once a round: a common cell stays where it is
            top = _snapped(top, lo[live], down, cls, snap.modulus)
        agree = (xs == top).all(axis=0)
        done = agree | (top < 0) | ~sure
        out[live[done]] = np.where(agree[done], top[done], -1)
        known[live[done]] = sure[done]
        keep = ~done
        live, top, xs, sure, scan, rounds, pieces = (live[keep], top[keep], xs[:, keep], sure[keep], scan[keep],
                                                     rounds[keep] + 1, pieces[keep])
        if snap is not None:
            cls = cls[keep]
        if len(live):
            _skip_pieces(terms, neg, axis, fixed[live], lo[live], top, xs, scan, rounds, pieces)
    known[live] = False
    return out, known


def _down_to_allowed(allowed: np.ndarray) -> np.ndarray:
    """For each row and residue r of `allowed` (rows x m), the distance from r down to the
    nearest allowed residue, cyclically (0 where r is allowed); m or more where none is."""
    m = allowed.shape[1]
    idx = np.arange(2 * m, dtype=_I64)
    last = np.maximum.accumulate(np.where(np.tile(allowed, (1, 2)), idx, -m), axis=1)
    return idx[m:] - last[:, m:]


def _snapped(top: np.ndarray, lo: np.ndarray, down: np.ndarray, cls: np.ndarray, modulus: int) -> np.ndarray:
    """Each line's position moved down to the nearest allowed residue (`down`, rows of
    `_down_to_allowed`; `cls` each line's row); -1 where that falls below the line's `lo`, or
    was already."""
    x = top - down[cls, np.maximum(top, 0) % modulus]
    return np.where((top >= 0) & (x >= lo), x, -1)


def _skip_pieces(terms: list[Pattern], neg: bool, axis: int, fixed: np.ndarray, lo: np.ndarray,
                 top: np.ndarray, xs: np.ndarray, scan: np.ndarray, rounds: np.ndarray,
                 pieces: np.ndarray) -> None:
    """After a round of `_intersection`, in place: the positions passed, (top, scan], hold no
    common cell, and within one periodic piece of the line (`sas.ir.line_period`) the product
    repeats every `period` positions (that piece's own, `terms_piece_period`: the terms constant
    there add nothing to it). So where they cover a period inside the piece, the rest
    of the piece holds no common cell either and the position drops below it; where the terms
    step down slowly (less than `ROUND_CELLS` positions a round) and the period is short (at
    most `WINDOW_PERIOD`), the rest of a period below the position is read cell by cell: its
    last common cell is the line's answer, and without one the position drops below the piece.
    Where a boundary of the pieces lies between top and scan, the scan restarts at the top of
    top's piece. `pieces` keeps the period of scan's piece from the first check after the scan
    restarts (0 before): top has stayed in that piece wherever no boundary lies between them."""
    due = rounds >= CHECK_AFTER
    gain = scan - top
    slow = gain < ROUND_CELLS * rounds
    # the line's period (valid in every piece) first; the piece's own, which costs a pass over
    # the terms, only on the lines that period leaves waiting, once a scan
    whole = terms_period(terms, axis)
    if whole < LONG:
        check = due & ((gain >= whole) | (slow & (whole <= WINDOW_PERIOD)))
        wait = np.flatnonzero(due & ~check)
    else:
        check, wait = np.zeros(len(top), dtype=bool), np.flatnonzero(due)
    if len(wait):
        new = wait[pieces[wait] == 0]
        if len(new):
            pieces[new] = terms_piece_period(terms, axis, fixed[new], top[new])
        q = pieces[wait]
        check[wait] = (q < whole) & ((gain[wait] >= q) | (slow[wait] & (q <= WINDOW_PERIOD)))
    c = np.flatnonzero(check)
    if not len(c):
        return
    period = np.where(pieces[c] > 0, pieces[c], whole)
    f = fixed[c]
    start, scanned = terms_piece_start(terms, axis, f, top[c]), terms_piece_start(terms, axis, f, scan[c])
    moved = start != scanned
    if moved.any():
        i = c[moved]
        scan[i] = scanned[moved] - 1
        rounds[i] = 0
        pieces[i] = 0
        c, f, start, period = c[~moved], f[~moved], start[~moved], period[~moved]
    full = scan[c] - top[c] >= period
    x = np.full(len(c), -1, dtype=_I64)
    part = np.flatnonzero(~full)            # slow lines: the rest of a period, cell by cell
    if len(part):
        i = c[part]
        first = np.maximum(np.maximum(start[part], lo[i]), scan[i] - (period[part] - 1))
        step = max(1, WINDOW_CELLS // int(period[part].max()))
        for c0 in range(0, len(i), step):
            s = slice(c0, c0 + step)
            x[part[s]] = _window_last(terms, neg, axis, f[part[s]], first[s], top[i[s]])
    found = x >= 0
    below = start - 1
    top[c] = np.where(found, x, np.where(below >= lo[c], below, -1))
    xs[:, c] = np.where(found, x, _ABOVE)
    scan[c] = top[c]
    rounds[c] = 0
    pieces[c] = 0


def _window_last(terms: list[Pattern], neg: bool, axis: int, fixed: np.ndarray, start: np.ndarray,
                 top: np.ndarray) -> np.ndarray:
    """The last position in [start, top] of each line where every term holds (each negated when
    `neg`), -1 where none does, cell by cell on the fewer candidates of two: the members of the
    term of the longest stride when it is a strided Diag or Rect, or the positions whose
    residues the terms' residue tables leave (`_residues`); else on every position."""
    width = int((top - start).max()) + 1
    strided = [] if neg else [t for t in terms if isinstance(t, (Diag, Rect)) and line_period(t, axis) > 1]
    step = max((line_period(t, axis) for t in strided), default=1)
    residues = None if neg else _residues(terms, axis, fixed, width)
    if residues is not None:
        modulus, allowed = residues.modulus, residues.allowed(fixed)
        pairs = int(np.count_nonzero(allowed))
        if pairs * ((width - 1) // modulus + 1) < RESIDUE_SHARE * len(fixed) * ((width - 1) // step + 1):
            return _residue_window_last(terms, axis, fixed, start, top, modulus, allowed)
    if strided:
        lattice = max(strided, key=lambda t: line_period(t, axis))
        last = _progression_last(lattice, False, axis, fixed, start, top + 1)
        # the lattice's members down from its last; itself still tested, as the positions
        # below its band (a Diag's lower end, a Rect's first row) are not members
        x = last[:, None] - step * np.arange((width - 1) // step + 1, dtype=_I64)[None, :]
    else:
        x = top[:, None] - np.arange(width, dtype=_I64)[None, :]      # down from the top
    return _first_held(terms, neg, axis, fixed, start, x)


def _first_held(terms: list[Pattern], neg: bool, axis: int, fixed: np.ndarray, start: np.ndarray,
                x: np.ndarray) -> np.ndarray:
    """On each row of the candidate positions x (descending along the row, of the line
    `fixed`), the first at or above `start` where every term holds (negated when `neg`); -1."""
    on = x >= start[:, None]
    x = np.maximum(x, 0)
    line = fixed[:, None]
    i, j = (x, line) if axis == COLUMN else (line, x)
    for term in terms:
        held = np.asarray(term.evaluate(i, j), dtype=bool)
        on &= ~held if neg else held
    first = on.argmax(axis=1)
    rows = np.arange(len(fixed))
    return np.where(on[rows, first], x[rows, first], -1)


@dataclass(frozen=True)
class _Residues:
    """Where a product's terms can all hold, by residues (`_residues`): a position x on line
    k only where `table[fixed[k] % period, x % modulus]` and `lines[k]`."""

    modulus: int
    period: int
    table: np.ndarray       # (period, modulus) bool
    lines: np.ndarray       # per line asked: False where a Rect term misses the line
    terms: int              # the terms whose residues the table combines

    def allowed(self, fixed: np.ndarray) -> np.ndarray:
        """(lines x modulus) bool: the residues allowed on each line of `fixed`, the lines
        `_residues` was asked for."""
        return self.table[fixed % self.period] & self.lines[:, None]


def _residues(terms: list[Pattern], axis: int, fixed: np.ndarray, width: int) -> _Residues | None:
    """Positions x on line k can hold every term only where `allowed(fixed)[k, x % modulus]`.

    Each term gives a necessary condition on a position's residue: a strided Diag or Rect its
    members' residue (a Rect none on the lines it misses), a spread its unit's cells along the
    line (M(i, j) = unit(i % h, j % w) and layout(...), so on column j rows i with
    unit(i % h, j % w) off never hold). A line's condition depends on its index modulo a
    period (a Diag's stride, a spread's unit width), so the table is built once a class of
    lines, not once a line. The most selective are combined while the lcm of their periods
    along the line stays within `width` (a residue class then has a position in the window)
    and the table within `RESIDUE_CELLS`. None where no term gives one."""
    if not len(fixed):
        return None
    lines = np.ones(len(fixed), dtype=bool)
    parts: list[tuple[float, int, int, np.ndarray]] = []       # (share, modulus, period, table)
    for t in terms:
        if isinstance(t, Rect):
            on, _, _, mod, residue = progression(t, axis, fixed)
            lines &= on
            if 1 < mod <= width:                       # the same residue on every line
                parts.append((1 / mod, mod, 1, (np.arange(mod) == int(residue[0]) % mod)[None, :]))
        elif isinstance(t, Diag) and 1 < t.stride <= width:    # residue (line + offset) mod stride
            _, _, _, mod, residue = progression(t, axis, np.arange(t.stride, dtype=_I64))
            parts.append((1 / mod, mod, mod, np.arange(mod)[None, :] == (residue % mod)[:, None]))
        elif isinstance(t, Spread) and t._params_within(MAX_INDEX):
            h, w = t.shape
            along, across = (h, w) if axis == COLUMN else (w, h)
            if along > width or along * across > RESIDUE_CELLS:
                continue
            r, u = np.arange(along, dtype=_I64)[None, :], np.arange(across, dtype=_I64)[:, None]
            held = t.unit.evaluate(r, u) if axis == COLUMN else t.unit.evaluate(u, r)
            table = np.broadcast_to(np.asarray(held, dtype=bool), (across, along))
            parts.append((float(table.mean()), along, across, table))
    modulus, period, table, combined = 1, 1, np.ones((1, 1), dtype=bool), 0
    for _, mod, per, part in sorted(parts, key=lambda x: x[0]):
        m, q = math.lcm(modulus, mod), math.lcm(period, per)
        if m > width or m * q > RESIDUE_CELLS:
            continue
        rows, cols = np.arange(q), np.arange(m)
        table = table[rows % period][:, cols % modulus] & part[rows % per][:, cols % mod]
        modulus, period, combined = m, q, combined + 1
    if modulus == 1 and lines.all():
        return None
    return _Residues(modulus, period, table, lines, combined)


def _residue_window_last(terms: list[Pattern], axis: int, fixed: np.ndarray, start: np.ndarray,
                         top: np.ndarray, modulus: int, allowed: np.ndarray) -> np.ndarray:
    """`_window_last` on the positions of each line's allowed residues (`_residues`): one
    descending row of candidates per (line, residue), the line's answer the largest of its
    rows'."""
    line, residue = np.nonzero(allowed)
    out = np.full(len(fixed), -1, dtype=_I64)
    if not len(line):
        return out
    width = int((top - start).max()) + 1
    head = top[line] - (top[line] - residue) % modulus        # the residue's last position <= top
    x = head[:, None] - modulus * np.arange((width - 1) // modulus + 1, dtype=_I64)[None, :]
    np.maximum.at(out, line, _first_held(terms, False, axis, fixed[line], start[line], x))
    return out


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
    on = hi > lo
    if on.all():                                # every line (the common case): views, no gathers
        live, f, a, b = None, fixed, lo, hi
    else:
        live = np.flatnonzero(on).astype(_I64)
        f, a, b = fixed[live], lo[live], hi[live]
    bline, uline = np.divmod(f, across)
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
        start = btop[at] * along
        x, k = unit(at, np.maximum(a[at] - start, 0), b[at] - start)
        best[at] = np.where(x >= 0, start + x, -1)
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
    if live is None:
        return best, sure
    out = np.full(len(fixed), -1, dtype=_I64)
    known = np.ones(len(fixed), dtype=bool)
    out[live] = best
    known[live] = sure
    return out, known


__all__ = ["COLUMN", "ROUNDS", "ROW", "last_cells"]
