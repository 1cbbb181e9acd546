"""`sas.ir.envelope` (a convex region holding every attended cell) against the mask: every cell
the mask attends lies inside, on random patterns and on the drifting products it is for."""

from __future__ import annotations

import numpy as np
import pytest
import shapely
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import patterns

from sas import Causal, Diag, Rect, analyze
from sas.errors import EmptyPatternError
from sas.ir.envelope import attended_extent, envelope


def _check_holds(p, rows: int, cols: int) -> None:
    n = max(rows, cols)
    mask = np.asarray(p.to_mask(n), dtype=bool)[:rows, :cols]
    i, j = np.nonzero(mask)
    region = envelope(p, rows, cols)
    r, c = attended_extent(p, rows, cols)
    assert 0 <= r <= rows and 0 <= c <= cols
    if len(i):
        assert int(i.max()) < r and int(j.max()) < c
        # each attended cell's square lies in the region (its corners, allowing rounding)
        grown = region.buffer(1e-6)
        for dx, dy in ((0, 0), (1, 0), (0, 1), (1, 1)):
            assert shapely.contains_xy(grown, j + dx, i + dy).all()


@settings(max_examples=300, deadline=None)
@given(patterns(max_depth=4), st.integers(1, 48), st.integers(1, 48))
def test_envelope_holds_every_attended_cell(p, rows: int, cols: int) -> None:
    _check_holds(p, rows, cols)


# a band of the block grid spread over blocks of 3 x 1 drifts away from a band of the cell grid:
# together they attend only near the origin (the fuzzer's #757, about)
DRIFT = ((Rect(size=(3, 1)) >> Diag(6, 109)) * Diag(156, 229) * Causal())


@pytest.mark.parametrize("p, rows, want", [
    (DRIFT, 4000, (568, 184)),
    (Rect(rows=(3, 9), cols=(2, 5)) * Causal(), 100, (9, 5)),
    (Diag(0, 4) * Rect(rows=(0, 10)), 100, (10, 10)),
    (Diag(10, None, stride=7) * Diag(2, 3), 100, (0, 0)),      # distances 10.. against 2..4: none
    ((Rect(size=(2, 2)) >> (Rect(rows=(5, 7)) * Diag(0, 1))) + Diag(0, 1) * Rect(cols=(0, 3)), 100, (14, 14)),
])
def test_where_a_pattern_stops(p, rows: int, want: tuple[int, int]) -> None:
    _check_holds(p, min(rows, 600), min(rows, 600))
    got = attended_extent(p, rows, rows)
    assert want[0] <= got[0] <= want[0] + 3 and want[1] <= got[1] <= want[1] + 3, got   # near tight


def test_unbounded_patterns_reach_the_end() -> None:
    assert attended_extent(Causal(), 1 << 20, 1 << 20) == (1 << 20, 1 << 20)
    assert attended_extent(~Rect(rows=(0, 5)), 300, 200) == (300, 200)
    assert attended_extent((Rect(size=(2, 3)) >> Diag(0, None)) * Causal(), 1000, 1000) == (1000, 1000)


def test_a_pattern_that_stops_is_analyzed_up_to_its_end() -> None:
    # the per-token analysis reads the rows and keys up to the envelope's extent only: at a
    # million tokens it finds what it finds at 1024
    a = analyze(DRIFT, max_len=1 << 20)
    small = analyze(DRIFT, max_len=1024)
    assert a.cache_size == small.cache_size
    np.testing.assert_array_equal(a.cache_ids(1024), small.cache_ids(1024))
    with pytest.raises(EmptyPatternError):
        analyze(DRIFT * Rect(rows=(600, None)), max_len=1 << 20)


def test_an_envelope_that_shrinks_with_the_box() -> None:
    # empty, but every box n gives a region ending a few rows below n, and the next box a few
    # rows below that (the fuzzer's #262, which once sent the search down n / 5 nested calls)
    p = ((Diag(-6, 1, stride=2) + ((Rect(size=(2, 2)) >> (Rect(size=(3, 3)) * (Rect(size=(4, 4))
          >> Diag(-2, 1, stride=21)))) >> ((Rect(rows=(0, 16), cols=(0, 1), stride=(2, 20), offset=(1, 8))
                                            + Causal()) * (Rect(size=(6, 5)) >> Diag(-7, 3, stride=3)))))
         * Diag(10, 1, stride=3) * (Rect(rows=(3, 4), cols=(0, 3), stride=(2, 1)) >> Rect(rows=(3, None)))
         * Diag(1, None) * Causal())
    n = 1 << 20
    assert attended_extent(p, n, n)[0] < n
    with pytest.raises(EmptyPatternError):
        analyze(p, max_len=n)
