"""`sas.ir.line_period`: a pattern's period along a line and the starts of its periodic pieces,
against the mask: within a piece, positions a period apart are both attended or both not."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import patterns

from sas import Causal, Diag, Rect
from sas.ir.line_period import LONG, line_period, piece_period, piece_start
from sas.ir.line_runs import COLUMN, ROW


def _lines(mask: np.ndarray, axis: int) -> np.ndarray:
    return mask.T if axis == COLUMN else mask


@settings(max_examples=150, deadline=None)
@given(patterns(max_depth=4), st.integers(1, 48))
def test_pieces_repeat_with_the_period(p, n: int) -> None:
    for q in (p, ~p):
        mask = np.asarray(q.to_mask(n), dtype=bool)
        for axis in (COLUMN, ROW):
            period = line_period(q, axis)
            assert 1 <= period <= LONG
            lines = _lines(mask, axis)
            x = np.arange(n, dtype=np.int64)
            for k in range(n):
                start = piece_start(q, axis, np.full(n, k, dtype=np.int64), x)
                assert ((start >= 0) & (start <= x)).all()
                if period >= n:
                    continue
                # x and x + period in one piece: no boundary in (x, x + period]
                a = x[:n - period]
                one = piece_start(q, axis, np.full(len(a), k, dtype=np.int64), a + period) <= a
                np.testing.assert_array_equal(lines[k, a][one], lines[k, a + period][one])


@settings(max_examples=150, deadline=None)
@given(patterns(max_depth=4), st.integers(1, 40))
def test_a_piece_repeats_with_its_own_period(p, n: int) -> None:
    """`piece_period`: positions that period apart inside the piece holding x agree, and it
    divides the line's period."""
    for q in (p, ~p):
        mask = np.asarray(q.to_mask(n), dtype=bool)
        for axis in (COLUMN, ROW):
            lines, whole = _lines(mask, axis), line_period(q, axis)
            x = np.arange(n, dtype=np.int64)
            for k in range(n):
                fixed = np.full(n, k, dtype=np.int64)
                period, start = piece_period(q, axis, fixed, x), piece_start(q, axis, fixed, x)
                assert ((period >= 1) & (period <= LONG)).all()
                if whole < LONG:
                    assert (whole % period == 0).all()
                for at in range(n):
                    a = np.arange(start[at], n - period[at], dtype=np.int64)
                    one = piece_start(q, axis, np.full(len(a), k, dtype=np.int64), a + period[at]) == start[at]
                    np.testing.assert_array_equal(lines[k, a][one], lines[k, a + period[at]][one])


def test_periods_and_boundaries_of_hand_picked_nodes() -> None:
    j = np.array([10, 10, 10], dtype=np.int64)
    d = Diag(-2, 5, stride=3)                       # column j: rows j - 2 .. j + 2, every third
    assert line_period(d, COLUMN) == 3
    np.testing.assert_array_equal(piece_start(d, COLUMN, j, np.array([7, 8, 13])), [0, 8, 13])
    r = Rect(rows=(4, 20), stride=(5, 1))
    assert line_period(r, COLUMN) == 5 and line_period(r, ROW) == 1
    np.testing.assert_array_equal(piece_start(r, COLUMN, j, np.array([3, 19, 25])), [0, 4, 20])
    # a spread repeats every block height times its layout's period, its boundaries scaled
    s = Rect(size=(3, 2)) >> Diag(1, None, stride=4)
    assert line_period(s, COLUMN) == 12 and line_period(s, ROW) == 8
    np.testing.assert_array_equal(piece_start(s, COLUMN, j, np.array([17, 18, 40])), [0, 18, 18])
    assert line_period(s * Diag(0, None, stride=9) + Causal(), COLUMN) == 36
    assert line_period(~s, ROW) == 8
    # within a piece, only the terms that vary there: past the end of a band of 5 and of the
    # strided rows below 20, the product repeats every 9 rows of its strided diagonal
    # (column 10: the band at rows 8 .. 12, the diagonal from row 10)
    band = Diag(-2, 5, stride=7) + Rect(rows=(0, 20), stride=(17, 1))
    both = band * Diag(0, None, stride=9)
    assert line_period(both, COLUMN) == 7 * 17 * 9
    np.testing.assert_array_equal(piece_period(both, COLUMN, j, np.array([9, 12, 30])), [7 * 17, 7 * 17 * 9, 9])
    np.testing.assert_array_equal(piece_period(s, COLUMN, j, np.array([17, 18, 40])), [3, 12, 12])
    # boundaries below 0 start no piece: row 0 of Diag(2, 1) has its band at columns -2 .. -1
    np.testing.assert_array_equal(piece_start(Diag(2, 1), ROW, np.array([0, 5]), np.array([0, 9])), [0, 4])
