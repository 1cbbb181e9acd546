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
        return reduce(_merge, (structure(t) for t in p.terms))
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


def with_threshold(s: Structure, t: int) -> Structure:
    return replace(s, T=max(s.T, t))
