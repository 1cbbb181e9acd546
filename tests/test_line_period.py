"""`sas.ir.line_period`: a pattern's period along a line and the starts of its periodic pieces,
against the mask: within a piece, positions a period apart are both attended or both not."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import patterns

from sas import Causal, Diag, Rect
from sas.ir.line_period import LONG, line_period, piece_start
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
    # boundaries below 0 start no piece: row 0 of Diag(2, 1) has its band at columns -2 .. -1
    np.testing.assert_array_equal(piece_start(Diag(2, 1), ROW, np.array([0, 5]), np.array([0, 9])), [0, 4])
