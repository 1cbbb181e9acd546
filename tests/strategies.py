"""Hypothesis strategies that build random, valid `Pattern` trees.

Shared by the oracle, analyzer and kernel property tests. Every primitive and operator
appears: `Rect` (ranges with open ends, `size=`, int and pair strides/offsets), `Diag`
(negative and positive offsets, bounded and unbounded, strided), `Dynamic` (as a region),
`+` (Or), `*` (And), `~` (Not) and `>>` (Spread, whose unit is a bounded box of at most
4 x 4, possibly intersected with more pattern or itself a small spread, and whose layout is
any pattern). Parameters are small (sizes and strides <= 8) so that interesting structure
shows up in masks of a few dozen rows.

Public names:
    patterns(max_depth=4)         any pattern, operator depth <= max_depth
    causal_patterns(max_depth=4)  `patterns(max_depth) * Causal()`
    leaves()                      one primitive
    rects(), diags(), dynamics()  one primitive of that kind
    spread_units(max_depth=2)     a bounded unit for the left side of `>>`
    drifting_spreads(wide, ...)   a spread of a non-square unit over a Diag layout, in a
                                  sum, product or complement
    static_plus_h2o(...)          (static, budget) for `static + (Causal() * ~static) *
                                  Dynamic(budget)` that the dynamic runtime accepts
"""

from __future__ import annotations

import functools

from hypothesis import assume
from hypothesis import strategies as st

from sas import Causal, Diag, Dynamic, Pattern, Rect, analyze, ops

from analysis_checks import brute_candidates_at_once

__all__ = ["patterns", "causal_patterns", "leaves", "rects", "diags", "dynamics",
           "spread_units", "static_plus_h2o", "MAX_PARAM", "MAX_UNIT"]

MAX_PARAM = 8   # largest size / stride / range length
MAX_UNIT = 4    # largest spread unit side


# --- primitives --------------------------------------------------------------------------

def _range(max_start: int = 10, max_len: int = MAX_PARAM):
    """A Rect axis range: None, or (start|None, stop|None) with stop > start."""
    bounded = st.tuples(st.integers(0, max_start), st.integers(1, max_len)).map(
        lambda t: (t[0], t[0] + t[1]))
    return st.one_of(
        st.none(),
        bounded,
        st.integers(0, max_start).map(lambda a: (a, None)),
        st.integers(1, max_start + max_len).map(lambda b: (None, b)),
        st.just((None, None)),
    )


@st.composite
def _stride_offset(draw):
    """(stride, offset) as Rect accepts them: ints or (rows, cols) pairs, offset < stride."""
    sr = draw(st.integers(1, 4))
    sc = draw(st.integers(1, 4))
    orr = draw(st.integers(0, sr - 1))
    oc = draw(st.integers(0, sc - 1))
    form = draw(st.sampled_from(["int", "pair", "default"]))
    if form == "default":
        return {}
    if form == "int":
        s = sr
        o = draw(st.integers(0, s - 1))
        return {"stride": s, "offset": o} if draw(st.booleans()) else {"stride": s}
    return {"stride": (sr, sc), "offset": (orr, oc)}


@st.composite
def rects(draw, max_start: int = 10, max_len: int = MAX_PARAM):
    """A Rect from ranges (possibly unbounded) or from `size=`, with optional stride/offset."""
    so = draw(_stride_offset())
    if draw(st.booleans()):
        size = draw(st.one_of(st.integers(1, max_len),
                              st.tuples(st.integers(1, max_len), st.integers(1, max_len))))
        return Rect(size=size, **so)
    return Rect(rows=draw(_range(max_start, max_len)), cols=draw(_range(max_start, max_len)), **so)


@st.composite
def diags(draw):
    """A Diag with offset in [-6, 6], size None or 1..8, stride 1..4."""
    offset = draw(st.integers(-6, 6))
    size = draw(st.one_of(st.none(), st.integers(1, MAX_PARAM)))
    stride = draw(st.sampled_from([1, 1, 2, 3, 4]))
    return Diag(offset, size, stride=stride)


_SCORES = [
    None,                                           # the default: attn_score().sum(dim=1)
    ops.attn_score().sum(dim=1),
    ops.attn_score().mean(dim=1),
    ops.attn_score().sum(dim=1).pooling(kernel_size=3),
]


@st.composite
def dynamics(draw):
    """A Dynamic; as a region it covers every cell."""
    return Dynamic(budget=draw(st.integers(1, MAX_PARAM)), score=draw(st.sampled_from(_SCORES)),
                   refresh=draw(st.booleans()))


def leaves():
    return st.one_of(rects(), diags(), dynamics(), st.just(Causal()))


# --- spread units --------------------------------------------------------------------------

@st.composite
def _unit_box(draw):
    """A bounded Rect whose origin-anchored box is at most MAX_UNIT x MAX_UNIT."""
    if draw(st.booleans()):
        return Rect(size=(draw(st.integers(1, MAX_UNIT)), draw(st.integers(1, MAX_UNIT))))
    r1 = draw(st.integers(1, MAX_UNIT))
    c1 = draw(st.integers(1, MAX_UNIT))
    r0 = draw(st.one_of(st.none(), st.integers(0, r1 - 1)))
    c0 = draw(st.one_of(st.none(), st.integers(0, c1 - 1)))
    sr = draw(st.integers(1, 2))
    sc = draw(st.integers(1, 2))
    return Rect(rows=(r0, r1), cols=(c0, c1), stride=(sr, sc),
                offset=(draw(st.integers(0, sr - 1)), draw(st.integers(0, sc - 1))))


@functools.lru_cache(maxsize=None)
def spread_units(max_depth: int = 2) -> st.SearchStrategy[Pattern]:
    """A unit for `unit >> layout`: a bounded box, the box intersected with a pattern (either
    side of `*`), or a small spread (2 x 2 unit over a 2 x 2 layout, a 4 x 4 box)."""
    box = _unit_box()
    if max_depth <= 1:
        return box
    inner = patterns(max_depth - 1)
    small_spread = st.builds(lambda u, lay: u >> (Rect(size=(2, 2)) * lay),
                             st.builds(lambda h, w: Rect(size=(h, w)), st.integers(1, 2), st.integers(1, 2)),
                             patterns(max(max_depth - 2, 0)))
    return st.one_of(
        box,
        st.builds(lambda b, p: b * p, box, inner),
        st.builds(lambda p, b: p * b, inner, box),
        small_spread,
    )


# --- trees ---------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def patterns(max_depth: int = 4) -> st.SearchStrategy[Pattern]:
    """Any valid pattern tree with at most `max_depth` levels of operators above the leaves."""
    if max_depth <= 0:
        return leaves()
    sub = patterns(max_depth - 1)
    return st.one_of(
        leaves(),
        st.builds(lambda a, b: a + b, sub, sub),
        st.builds(lambda a, b: a * b, sub, sub),
        st.builds(lambda a: ~a, sub),
        st.builds(lambda u, lay: u >> lay, spread_units(max_depth - 1), sub),
    )


@functools.lru_cache(maxsize=None)
def causal_patterns(max_depth: int = 4) -> st.SearchStrategy[Pattern]:
    """`patterns(max_depth) * Causal()`: every cell with j > i is off."""
    return patterns(max_depth).map(lambda p: p * Causal())


@st.composite
def drifting_spreads(draw, wide: bool, max_depth: int = 2):
    """A spread of a non-square unit (wider than tall when `wide`, else taller) over a layout
    with a Diag, alone or in a sum, a product or a complement: its blocks drift off the
    diagonal (a wide one repeats below a diagonal line, `sas.ir.periodicity.structure_in`; a
    tall one reaches both sides of its layout's diagonal below any line: no period)."""
    short = draw(st.integers(1, 3))
    long = draw(st.integers(short + 1, 4 if not wide else 7))
    unit = Rect(size=(short, long) if wide else (long, short))
    if draw(st.booleans()):
        unit = unit * draw(spread_units(max_depth=1))
    layout = draw(diags())
    if draw(st.booleans()):
        extra = draw(patterns(max_depth=1))
        layout = layout + extra if draw(st.booleans()) else layout * extra
    p = unit >> layout
    how = draw(st.sampled_from(["", "+", "*", "~"]))
    if how == "+":
        p = p + draw(patterns(max_depth=max_depth))
    elif how == "*":
        p = p * draw(patterns(max_depth=max_depth))
    elif how == "~":
        p = ~p
    return p


# --- dynamic compositions ------------------------------------------------------------------------

@st.composite
def static_plus_h2o(draw, max_depth: int = 3, max_budget: int = 5, horizon: int = 122,
                    max_len: int = 64) -> tuple[Pattern, int]:
    """(static, budget) such that `static + (Causal() * ~static) * Dynamic(budget=budget)` (paper
    Table 6: H2O on what a static pattern leaves uncovered) is valid for the dynamic runtime at
    `max_len`, by construction rather than by rejecting what the code under test refuses:

    - `static` is any causal composition without a Dynamic (`causal_patterns(max_depth)`);
    - its region `Causal() * ~static` has a cell within `horizon` rows;
    - the budget is drawn from 1 .. the most candidates that region holds at once within
      `horizon` rows (brute force over the oracle mask; `plan_dynamic` refuses a budget above
      the count over all rows, which is never smaller), capped at `max_budget`;
    - the static part's own cache analysis at `max_len` (when it attends anything) has closed
      forms: the dynamic runtime does not support table-driven static parts.
    """
    static = draw(causal_patterns(max_depth).filter(lambda p: not p.dynamics()))
    region = Causal().to_mask(horizon) & ~static.to_mask(horizon)
    capacity = brute_candidates_at_once(region)
    assume(capacity > 0)
    if static.to_mask(max_len).any():
        assume(not analyze(static, max_len=max_len).tables)
    return static, draw(st.integers(1, min(max_budget, capacity)))
