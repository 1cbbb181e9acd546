"""Where a pattern repeats along a line: its period and the boundaries of its periodic pieces.

Along a line (the column `j = fixed` when `axis` is `COLUMN`, the row `i = fixed` when it is
`ROW`), every node attends a set of positions that is periodic between a few boundaries:

- a `Diag` or `Rect` is a progression `a <= x < b`, `x = residue (mod stride)`
  (`line_runs.progression`): period its stride, boundaries `a` and `b`;
- a complement has its operand's period and boundaries, a sum or product the least common
  multiple of its terms' periods and all of their boundaries; a dynamic component attends the
  whole line (period 1, no boundary);
- a spread `unit >> layout` on the grid of `h x w` blocks holds the same unit line in every
  on-block of its block line, so it repeats every `along` positions times its layout's period,
  between its layout's boundaries times `along` (`along` = h along a column, w along a row).

So between two consecutive boundaries `[beta, gamma)` of a line, `x` and `x + period` are both
attended or both not (when both lie in the piece). `sas.ir.line_last` uses it to stop a
product's terms from stepping down a line whose terms never meet: once the positions it has
passed in a piece cover a whole period without a common cell, the piece holds none.

Within one piece a node may repeat sooner (`piece_period`): a `Diag` or `Rect` is constant
outside `[a, b)` (and on a line it misses), so it repeats there with period 1, and a sum or
product takes the least common multiple of its terms' periods in that piece only. A band that
ended long before, or strided rows near the origin, then no longer stretch the period of a
product far down its lines (the fuzzer's #8658: 36 rows there instead of 17 x 7 x 36 = 4284).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from sas.ir.line_runs import COLUMN, FAR, progression
from sas.lang.pattern import And, Not, Or, Pattern, Spread
from sas.lang.primitives import Diag, Dynamic, Rect

_I64 = np.int64
#: A period this long or longer is reported as `LONG` (no line repeats within it in practice).
LONG = 1 << 40


@lru_cache(maxsize=4096)
def line_period(p: Pattern, axis: int) -> int:
    """The period of p along every line of `axis` (module doc), at most `LONG`."""
    if isinstance(p, Diag):
        return p.stride
    if isinstance(p, Rect):
        return p.stride[0] if axis == COLUMN else p.stride[1]
    if isinstance(p, Dynamic):
        return 1
    if isinstance(p, Not):
        return line_period(p.a, axis)
    if isinstance(p, (And, Or)):
        return terms_period(p.terms, axis)
    if isinstance(p, Spread):
        h, w = p.shape
        return min(LONG, (h if axis == COLUMN else w) * line_period(p.layout, axis))
    raise TypeError(f"line_period: unknown pattern node {type(p).__name__}")


def terms_period(terms: Sequence[Pattern], axis: int) -> int:
    """The period of a sum or product of `terms` (the lcm of theirs), at most `LONG`."""
    out = 1
    for t in terms:
        out = math.lcm(out, line_period(t, axis))
        if out >= LONG:
            return LONG
    return out


def piece_start(p: Pattern, axis: int, fixed: np.ndarray, x: np.ndarray) -> np.ndarray:
    """On each line, the largest boundary of p at or below position x (module doc), 0 when
    there is none (positions start at 0): p repeats with `line_period(p, axis)` within
    [piece_start, next boundary). `fixed`, `x` int64 arrays of one length, x >= 0."""
    if isinstance(p, (Diag, Rect)):
        _, a, b, _, _ = progression(p, axis, fixed)
        out = np.where((b <= x) & (b < FAR), b, 0)
        np.maximum(out, np.where((a <= x) & (a > -FAR), a, 0), out=out)
        return np.maximum(out, 0)               # a boundary below 0 starts no piece
    if isinstance(p, Dynamic):
        return np.zeros(len(fixed), dtype=_I64)
    if isinstance(p, Not):
        return piece_start(p.a, axis, fixed, x)
    if isinstance(p, (And, Or)):
        return terms_piece_start(p.terms, axis, fixed, x)
    if isinstance(p, Spread):
        h, w = p.shape
        across, along = (w, h) if axis == COLUMN else (h, w)
        return piece_start(p.layout, axis, fixed // across, x // along) * along
    raise TypeError(f"piece_start: unknown pattern node {type(p).__name__}")


def piece_period(p: Pattern, axis: int, fixed: np.ndarray, x: np.ndarray) -> np.ndarray:
    """On each line, a period of p within the piece holding position x (module doc): a divisor
    of `line_period(p, axis)`, at most `LONG`. `fixed`, `x` int64 arrays of one length, x >= 0."""
    if isinstance(p, (Diag, Rect)):
        on, a, b, mod, _ = progression(p, axis, fixed)
        return np.where(on & (a <= x) & (x < b), mod, 1).astype(_I64)
    if isinstance(p, Dynamic):
        return np.ones(len(fixed), dtype=_I64)
    if isinstance(p, Not):
        return piece_period(p.a, axis, fixed, x)
    if isinstance(p, (And, Or)):
        return terms_piece_period(p.terms, axis, fixed, x)
    if isinstance(p, Spread):
        h, w = p.shape
        across, along = (w, h) if axis == COLUMN else (h, w)
        inner = piece_period(p.layout, axis, fixed // across, x // along)
        return np.where(inner < LONG // along, np.minimum(inner, LONG // along) * along, LONG)
    raise TypeError(f"piece_period: unknown pattern node {type(p).__name__}")


def terms_piece_period(terms: Sequence[Pattern], axis: int, fixed: np.ndarray, x: np.ndarray) -> np.ndarray:
    """`piece_period` of a sum or product of `terms` (at least one): the least common multiple
    of theirs, at most `LONG`."""
    out = piece_period(terms[0], axis, fixed, x)
    for t in terms[1:]:
        q = piece_period(t, axis, fixed, x)
        step = out // np.gcd(out, q)
        cap = LONG // q
        out = np.where(step < cap, np.minimum(step, cap) * q, LONG)   # both at most LONG: no overflow
    return out


def terms_piece_start(terms: Sequence[Pattern], axis: int, fixed: np.ndarray, x: np.ndarray) -> np.ndarray:
    """`piece_start` of a sum or product of `terms` (at least one): the largest of theirs."""
    out = piece_start(terms[0], axis, fixed, x)
    for t in terms[1:]:
        np.maximum(out, piece_start(t, axis, fixed, x), out=out)
    return out


__all__ = ["LONG", "line_period", "piece_period", "piece_start", "terms_period", "terms_piece_period",
           "terms_piece_start"]
