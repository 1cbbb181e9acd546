"""Length-independent periodic structure of a pattern (paper 5.3, equation 3).

Every primitive is a family of cells invariant under translations, away from finitely many
boundary lines. `structure(pattern)` derives, from the tree alone, numbers that bound that
behaviour; the analyzer evaluates the exact oracle only inside the small window they define
and maps the answers to any length.

Guarantees of `Structure` for the pattern's mask M on the quadrant i, j >= 0:

- diagonal: `M(i + P, j + P) == M(i, j)` whenever `i >= T` and `j >= T`;
- vertical: `M(i + Qv, j) == M(i, j)` whenever `i >= T` and `i - j >= Dv`;
- horizontal: `M(i, j + Qh) == M(i, j)` whenever `j >= T` and `j - i >= Dh`.

`row_period` / `col_period` (optional) give full invariance under (R, 0) for `i >= T` and
(0, C) for `j >= T`, used to handle spreads whose unit is not square.
`periodic` is False when no such description is known (then the analyzer falls back to a
per-token table and says so).

A spread whose unit is wider than tall drifts off the diagonal (its layout's diagonal becomes a
line of slope w / h in cells), so it has no such description on the whole quadrant. Inside a
product whose cells all lie on or below a diagonal, `i - j >= g` (a `Diag` factor, `gap`), its
cells sit ever further below its layout's diagonal, where the layout repeats vertically and
diagonally; `structure_in(p, g)` derives the guarantees that hold there, and the product's
structure (empty above the line) holds everywhere: `(Rect(size=(1, 2)) >> Causal()) * Causal()`
(every cell on or below the diagonal) repeats with P = 2, its layout strided by 7 under 3 x 4
blocks every 84 cells.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache, reduce
from math import lcm

from sas.ir.emptiness import provably_empty
from sas.ir.envelope import node_extent
from sas.lang.pattern import And, Not, Or, Pattern, Spread
from sas.lang.primitives import Diag, Dynamic, Rect


@dataclass(frozen=True)
class Structure:
    periodic: bool
    P: int = 1
    T: int = 0
    Qv: int = 1
    Dv: int = 0
    Qh: int = 1
    Dh: int = 0
    row_period: int | None = None
    col_period: int | None = None

    def within(self, n: int | None) -> "Structure":
        """The description as sequences of at most n tokens see it.

        - A boundary T past n ends at n: its keys from n on never occur.
        - Where the boundary and one period pass n (a period longer than the sequence, e.g. the
          least common multiple of two chunk sizes), the period becomes n - T. No key of such a
          sequence has a later copy in its class then, so the diagonal guarantee holds
          vacuously, and the analysis reads min(T + P, n) columns instead of T + P.
        - A vertical (or horizontal) period longer than n, e.g. the least common multiple of
          several strides, becomes n: a column's pattern at distances d >= Dv then claims to
          repeat at d + n, a distance no query of the sequence reaches, and the analysis reads
          distances up to Dv + n instead of Dv + Qv.

        n = None (any length): unchanged."""
        if n is None or not self.periodic:
            return self
        n = int(n)
        changes = {}
        if self.T > n:   # keys past the sequence have no shapes to keep: the boundary ends at n
            changes["T"] = n
        if min(self.T, n) + self.P > n:
            changes["P"] = max(n - min(self.T, n), 1)
        if self.Qv > n:
            changes["Qv"] = n
        if self.Qh > n:
            changes["Qh"] = n
        return replace(self, **changes) if changes else self

    @property
    def window(self) -> int:
        """A length past which every query row is in the steady state."""
        return self.T + self.Dv + 2 * self.Qv + self.P


NON_PERIODIC = Structure(periodic=False)
#: The structure of a pattern with no cell: invariant under every translation.
EMPTY = Structure(True, row_period=1, col_period=1)


def _merge(a: Structure, b: Structure) -> Structure:
    if not (a.periodic and b.periodic):
        return NON_PERIODIC
    rp = lcm(a.row_period, b.row_period) if a.row_period and b.row_period else None
    cp = lcm(a.col_period, b.col_period) if a.col_period and b.col_period else None
    return Structure(True, lcm(a.P, b.P), max(a.T, b.T), lcm(a.Qv, b.Qv), max(a.Dv, b.Dv),
                     lcm(a.Qh, b.Qh), max(a.Dh, b.Dh), rp, cp)


def _finite(*xs: int | None) -> int:
    return max([x for x in xs if x is not None] + [0])


@lru_cache(maxsize=4096)
def structure(p: Pattern) -> Structure:
    """Derive the periodic structure of `p` from its tree (never from its mask)."""
    if isinstance(p, Diag):
        o, s, st = p.offset, p.size, p.stride
        if s is None:
            qv, dv = st, max(0, o)
        else:
            qv, dv = 1, max(0, o + s)
        return Structure(True, 1, 0, qv, dv, 1, max(0, 1 - o))
    if isinstance(p, Rect):
        (r0, r1), (c0, c1) = p.rows, p.cols
        sr, sc = p.stride
        t = _finite(r0, r1, c0, c1)
        # A bounded side ends before the boundary t: past it the rectangle has no cell, so that
        # side's stride repeats nothing there (its rows, or its columns, stay finite). Only an
        # unbounded side carries its stride into the periods, and only a rectangle unbounded
        # both ways has cells on the diagonal beyond t (e.g. one row of strided columns, rows <
        # 128 with stride (401, 7), has P = 1 and row period 1, not 2807 and 401).
        rows_end, cols_end = r1 is not None, c1 is not None
        qv = 1 if rows_end else sr
        qh = 1 if cols_end else sc
        period = 1 if rows_end or cols_end else lcm(sr, sc)
        return Structure(True, period, t, qv, 0, qh, 0, qv, qh)
    if isinstance(p, Dynamic):
        return Structure(True, 1, 0, 1, 0, 1, 0, 1, 1)
    if isinstance(p, (Or, And, Spread)) and provably_empty(p):
        # no cell (a product of diagonals of different residues, say): a sum gains nothing
        # from it, so a spread of a non-square unit that is empty leaves the sum periodic
        return EMPTY
    if isinstance(p, (Or, And, Spread)):
        return _bounded(p, _composite(p))
    if isinstance(p, Not):
        return structure(p.a)
    raise TypeError(f"unknown pattern node {type(p).__name__}")


#: Largest extent `_bounded` turns into a boundary: each key below it is a column shape of its
#: own, of up to T distances (T^2 / 2 cells in all); the extent of a node can reach billions of
#: cells (a spread's layout scaled up), which the per-token search handles far faster.
BOUNDED_T = 1 << 12


def _bounded(p: Pattern, rules: Structure) -> Structure:
    """A node whose envelope ends (`sas.ir.envelope.node_extent`: no cell at row r or key c or
    beyond) is empty past T = max(r, c), so every translation keeps it there: its structure is
    that boundary with periods 1, taken where T is at most `BOUNDED_T` and the rules give no
    period (a spread of a non-square unit cut by a bounded band) or a boundary no smaller."""
    t = max(node_extent(p))
    if t > BOUNDED_T or (rules.periodic and t > rules.T):
        return rules
    return Structure(True, 1, t, 1, 0, 1, 0, 1, 1)


def _composite(p: Pattern) -> Structure:
    """The structure of a sum, product or spread from its operands' (module rules)."""
    if isinstance(p, Or):
        return reduce(_merge, (structure(t) for t in p.terms if not provably_empty(t)))
    if isinstance(p, And):
        out = reduce(_merge, (structure(t) for t in p.terms))
        g = gap(p)
        return out if out.periodic or g is None else _product_in(p, g)
    if isinstance(p, Spread):
        b = structure(p.layout)
        if not b.periodic:
            return NON_PERIODIC
        h, w = p.shape
        rp = b.row_period * h if b.row_period else None
        cp = b.col_period * w if b.col_period else None
        if h == w:
            return Structure(True, b.P * h, b.T * h, b.Qv * h, b.Dv * h + h - 1,
                             b.Qh * h, b.Dh * h + h - 1, rp, cp)
        if rp and cp:
            # Fully periodic layout: invariant under (rp, 0) and (0, cp) beyond the boundary.
            t = max(b.T * h, b.T * w)
            return Structure(True, lcm(rp, cp), t, rp, 0, cp, 0, rp, cp)
        return NON_PERIODIC
    raise TypeError(f"unknown pattern node {type(p).__name__}")


@lru_cache(maxsize=4096)
def gap(p: Pattern) -> int | None:
    """A g with i - j >= g for every cell (i, j) of p, from its diagonals (None: unknown)."""
    if isinstance(p, Diag):
        return p.offset
    if isinstance(p, And):
        known = [g for g in (gap(t) for t in p.terms) if g is not None]
        return max(known) if known else None
    if isinstance(p, Or):
        gs = [gap(t) for t in p.terms if not provably_empty(t)]
        return min(gs) if gs and all(g is not None for g in gs) else None
    return None


@lru_cache(maxsize=4096)
def structure_in(p: Pattern, g: int) -> Structure:
    """The guarantees of `Structure` for p's cells on or below the line i - j = g only: each
    holds where both cells it compares satisfy i - j >= g (Dv >= g; no horizontal, row or column
    claim: Qh = 1, Dh >= 1 - g lies above the line, row and column periods None). A product whose
    cells all lie there (`gap`) keeps the same guarantees on the whole quadrant.

    - a node with a structure of its own keeps it (it holds everywhere);
    - a sum or a complement as its operands (merged), a product with the larger of g and its
      own gap;
    - a spread whose unit is wider than tall (h < w) over a periodic layout L: below the line a
      cell (i, j) lies in the layout's block (I, J) = (i // h, j // w) with
      I - J >= i (1/h - 1/w) - (h - 1)/h + g/w, so from row `T` on I - J >= L.Dv, where L
      repeats vertically every L.Qv and diagonally every L.P. Moving (i, j) by (P, P) moves
      (I, J) by (P/h, P/w): vertically by P/h - P/w, then diagonally by P/w; with P a multiple
      of h P' and w P' (P' = lcm(L.P, L.Qv)) both are whole periods, and the unit's cell stays.
      Vertically, h L.Qv rows move the block by L.Qv;
    - anything else (a drifting spread of a unit taller than wide, whose cells reach both sides
      of its layout's diagonal): none."""
    own = structure(p)
    if own.periodic:
        return own
    if isinstance(p, And):
        mine = gap(p)
        return _product_in(p, g if mine is None else max(g, mine))
    if isinstance(p, Or):
        parts = [structure_in(t, g) for t in p.terms if not provably_empty(t)]
        out = reduce(_merge, parts) if parts else EMPTY
    elif isinstance(p, Not):
        out = structure_in(p.a, g)
    elif isinstance(p, Spread) and p.shape[0] < p.shape[1]:
        lay = structure(p.layout)
        if not lay.periodic:
            return NON_PERIODIC
        h, w = p.shape
        step = lcm(lay.P, lay.Qv)
        period = lcm(h * step, w * step)
        # first row with I - J >= L.Dv for every cell on or below the line: i (w - h) >=
        # L.Dv h w + (h - 1) w - g h
        need = lay.Dv * h * w + (h - 1) * w - g * h
        first = max(0, -(-need // (w - h)))
        out = Structure(True, period, max(first, w * lay.T), h * lay.Qv, 0, 1, 0)
    else:
        return NON_PERIODIC
    return _below(out, g)


def _product_in(p: And, g: int) -> Structure:
    """`structure_in(p, g)` of a product from its terms' (never from `structure(p)`, which asks
    for it)."""
    return _below(reduce(_merge, (structure_in(t, g) for t in p.terms)), g)


def _below(s: Structure, g: int) -> Structure:
    """s with only the claims of `structure_in(., g)`: vertical ones from i - j >= g, none above."""
    if not s.periodic:
        return s
    return replace(s, Dv=max(s.Dv, g, 0), Qh=1, Dh=max(s.Dh, 1 - g, 0), row_period=None, col_period=None)


def with_threshold(s: Structure, t: int) -> Structure:
    return replace(s, T=max(s.T, t))
