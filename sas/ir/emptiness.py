"""Products that select no cell, found from the pattern tree alone.

A product of strided diagonals of different residues (`Diag(3, None, stride=7) *
Diag(2, None, stride=7)`), of Rects whose ranges do not meet, or of a bounded Rect and a band
that misses it selects no cell of the quadrant `i, j >= 0`, whatever the length. Such a term
says nothing about the periodic structure of the pattern around it (`sas.ir.periodicity`
drops it from a sum, and a spread over it is empty), and the runs of its lines are none
(`sas.ir.line_runs` builds none). `provably_empty` is exact where it says True; False means
"not shown empty" (a product can be empty for reasons this check does not read).
"""

from __future__ import annotations

from functools import lru_cache
from math import gcd

from sas.lang.pattern import MAX_INDEX, And, Or, Pattern, Spread
from sas.lang.primitives import Diag, Rect


def merge_diags(terms: tuple[Pattern, ...]) -> list[Pattern] | None:
    """The terms of a product with its diagonals (`Diag`) merged into one: the distances
    d = i - j they share are a band [largest offset, smallest end) on one residue class modulo
    the least common multiple of the strides (the Chinese remainder theorem), or nothing (None).
    Without this, two strided diagonals of different residues (`Diag(3, None, stride=7) *
    Diag(2, None, stride=7)`) built a run for every cell of the first before finding the product
    empty. Strides whose multiple passes the index range are left apart."""
    diags = [t for t in terms if isinstance(t, Diag)]
    if len(diags) < 2:
        return list(terms)
    o, end, t = diags[0].offset, _diag_end(diags[0]), diags[0].stride
    for d in diags[1:]:
        g = gcd(t, d.stride)
        if (d.offset - o) % g:
            return None                     # no distance is on both residue classes
        step = t // g * d.stride
        if step > MAX_INDEX:
            return list(terms)
        q = d.stride // g
        k = (d.offset - o) // g * pow(t // g, -1, q) % q if q > 1 else 0
        residue = (o + t * k) % step        # d = residue (mod step) on both diagonals
        low = max(o, d.offset)
        o, t = low + (residue - low) % step, step
        ends = [x for x in (end, _diag_end(d)) if x is not None]
        end = min(ends) if ends else None
        if (end is not None and o >= end) or o >= MAX_INDEX:
            return None                     # the first shared distance is past the band's end
    return [Diag(o, None if end is None else end - o, t)] + [x for x in terms if not isinstance(x, Diag)]


def _diag_end(d: Diag) -> int | None:
    return None if d.size is None else d.offset + d.size


def axis_span(rng: tuple[int | None, int | None], offset: int) -> tuple[int, int | None]:
    """The first index >= 0 a Rect axis selects and the end of its range (None: unbounded)."""
    a, b = rng
    return (a or 0) + offset, b


def _meets_band(diag: Diag, low: float, high: float) -> bool:
    """Whether the diagonal attends a distance d = i - j with low <= d <= high."""
    first = diag.offset
    if first < low:
        first += -(-(low - first) // diag.stride) * diag.stride
    end = _diag_end(diag)
    return first <= high and (end is None or first < end)


@lru_cache(maxsize=4096)
def provably_empty(p: Pattern) -> bool:
    """True when p selects no cell (i, j) with i, j >= 0 (module doc); exact where True."""
    if isinstance(p, Rect):
        return any(b is not None and first >= b
                   for first, b in (axis_span(r, o) for r, o in zip((p.rows, p.cols), p.offset)))
    if isinstance(p, Or):
        return all(provably_empty(t) for t in p.terms)
    if isinstance(p, Spread):
        return provably_empty(p.unit) or provably_empty(p.layout)
    if not isinstance(p, And):
        return False                        # a Diag, a complement, a dynamic component
    if any(provably_empty(t) for t in p.terms):
        return True
    merged = merge_diags(p.terms)
    if merged is None:
        return True
    rects = [t for t in p.terms if isinstance(t, Rect)]
    if not rects:
        return False
    # the rows and columns every Rect admits: [first, end) on each axis
    box = []
    for axis in (0, 1):
        spans = [axis_span((r.rows, r.cols)[axis], r.offset[axis]) for r in rects]
        first = max(s[0] for s in spans)
        ends = [s[1] for s in spans if s[1] is not None]
        end = min(ends) if ends else None
        if end is not None and first >= end:
            return True
        box.append((first, end))
    (r0, r1), (c0, c1) = box
    low = float("-inf") if c1 is None else r0 - (c1 - 1)          # distances i - j in the box
    high = float("inf") if r1 is None else (r1 - 1) - c0
    return any(isinstance(d, Diag) and not _meets_band(d, low, high) for d in merged)


__all__ = ["axis_span", "merge_diags", "provably_empty"]
