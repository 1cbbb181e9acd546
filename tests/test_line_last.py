"""`sas.ir.line_last.last_cells` (the last attended cell of a line, from the tree) against the
mask: every pattern and its complement, along columns and rows, on random ranges."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import patterns

import sas.ir.line_last as line_last_module
from sas import Causal, Diag, Rect
from sas.ir.line_last import COLUMN, ROW, last_cells


def _want(mask: np.ndarray, axis: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    lines = mask.T if axis == COLUMN else mask
    x = np.arange(lines.shape[1])[None, :]
    on = lines & (x >= lo[:, None]) & (x < hi[:, None])
    return np.where(on.any(axis=1), lines.shape[1] - 1 - np.argmax(on[:, ::-1], axis=1), -1)


#: How a product's lines that have not agreed skip periodic pieces (`line_last._skip_pieces`):
#: as by default; every such line after one round by reading the rest of a period cell by
#: cell; only by the positions passed (no cells read).
SKIP_MODES = {
    "default": {},
    "cells": {"CHECK_AFTER": 1, "ROUND_CELLS": 1 << 40},
    "passed": {"CHECK_AFTER": 1, "WINDOW_PERIOD": 0},
}


def _skip_mode(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    for name, value in SKIP_MODES[mode].items():
        monkeypatch.setattr(line_last_module, name, value)


@pytest.mark.parametrize("mode", list(SKIP_MODES))
@settings(max_examples=120, deadline=None)
@given(patterns(max_depth=4), st.integers(1, 40), st.data())
def test_last_cells_equal_the_mask(mode: str, p, n: int, data) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        _skip_mode(monkeypatch, mode)
        _check_last_cells(p, n, data)


def _check_last_cells(p, n: int, data) -> None:
    bounds = st.lists(st.integers(0, n), min_size=n, max_size=n)
    for q in (p, ~p):
        m = np.asarray(q.to_mask(n), dtype=bool)
        for axis in (COLUMN, ROW):
            lo, hi = np.array(data.draw(bounds)), np.array(data.draw(bounds))
            got, known = last_cells(q, axis, np.arange(n), lo, hi)
            want = _want(m, axis, lo, hi)
            np.testing.assert_array_equal(got[known], want[known])


@pytest.mark.parametrize("p", [
    # a drifting spread's complement cut by a strided lattice (the fuzzer's #676, about)
    ~(Rect(size=(4, 3)) >> (Rect(rows=(3, None), cols=(3, None), stride=(7, 3), offset=(2, 2)) + Causal()))
    * Causal(),
    (Rect(rows=(1, 3), cols=(0, 1), stride=(2, 2)) >> (Causal() + Diag(1, None, stride=3)))
    * (Diag(-5, None, stride=2) + Diag(24, 3, stride=2)) * Causal(),
    (Rect(size=(3, 2)) >> Diag(0, 2)) + Diag(0, None, stride=64),
])
def test_columns_of_many_runs_are_settled(p) -> None:
    n = 600
    j = np.arange(n)
    got, known = last_cells(p, COLUMN, j, j, np.full(n, n))
    assert known.all()
    np.testing.assert_array_equal(got, _want(np.asarray(p.to_mask(n), dtype=bool), COLUMN, j, np.full(n, n)))


def test_products_that_do_not_agree_are_left_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    # two lattices that meet every 35 rows: one step at a time down a column
    p = Rect(stride=(5, 1)) * Rect(stride=(7, 1), offset=(1, 0))
    n = 200
    j = np.arange(n)
    want = _want(np.asarray(p.to_mask(n), dtype=bool), COLUMN, np.zeros(n, dtype=np.int64), np.full(n, n))
    got, known = last_cells(p, COLUMN, j, np.zeros(n, dtype=np.int64), np.full(n, n))
    assert known.all()
    np.testing.assert_array_equal(got, want)
    monkeypatch.setattr(line_last_module, "ROUNDS", 1)
    got, known = last_cells(p, COLUMN, j, np.zeros(n, dtype=np.int64), np.full(n, n))
    assert not known.any()


# Products whose terms never meet on most columns, with one period along them, so that the
# leapfrog steps down the column without end: (pattern, whether the positions passed alone
# settle every column). Blocks of a spread drifting off the diagonal against a strided band
# (the fuzzer's #4241, about): a period of 9 rows a round. Odd rows of a spread against the
# even rows of a band (#3901, about): a row or two a round in a period of 126, so only cells
# read settle them. Even rows from row 100 against odd rows: they meet only below the boundary
# at row 100, on its last row (99).
NEVER_MEET = [
    ((Rect(rows=(0, 100)) + Rect(rows=(100, None), stride=(2, 1))) * Rect(stride=(2, 1), offset=(1, 0)), True),
    ((Rect(size=(3, 6)) >> Diag(-2, None, stride=3)) * Diag(-6, None, stride=9) * Causal(), True),
    ((Rect(rows=(1, 6), cols=(1, 4), stride=(2, 1)) >> ~(Rect(size=(3, 4)) >> Diag(-4, None, stride=7)))
     * Diag(4, None, stride=2) * Causal(), False),
]


@pytest.mark.parametrize("mode", list(SKIP_MODES))
@pytest.mark.parametrize("p, by_passed", NEVER_MEET)
def test_products_whose_terms_never_meet_skip_their_pieces(p, by_passed: bool, mode: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    n = 1500
    mask = np.asarray(p.to_mask(n), dtype=bool)
    _skip_mode(monkeypatch, mode)
    lo, hi = np.zeros(n, dtype=np.int64), np.full(n, n)
    got, known = last_cells(p, COLUMN, np.arange(n), lo, hi)
    assert known.all() or (mode == "passed" and not by_passed)
    np.testing.assert_array_equal(got[known], _want(mask, COLUMN, lo, hi)[known])
    got, known = last_cells(p, ROW, np.arange(n), lo, hi)
    np.testing.assert_array_equal(got[known], _want(mask, ROW, lo, hi)[known])
    # without the pieces the same columns are left to the caller
    monkeypatch.setattr(line_last_module, "terms_period", lambda terms, axis: line_last_module.LONG)
    monkeypatch.setattr(line_last_module, "terms_piece_period",
                        lambda terms, axis, fixed, x: np.full(len(fixed), line_last_module.LONG))
    _, known = last_cells(p, COLUMN, np.arange(n), np.zeros(n, dtype=np.int64), np.full(n, n))
    assert not known.all()


def test_a_piece_steps_by_its_own_period(monkeypatch: pytest.MonkeyPatch) -> None:
    # the fuzzer's #8658, about: blocks of a spread drifting off the diagonal (every 36th row of
    # a column) against every third diagonal meet on no row of two columns in three. The strided
    # rows near the origin (17) and the band of stride 7 make the line's period 17 x 7 x 36 =
    # 4284, longer than the sequence; past them each column repeats every 36 rows, and a few
    # rounds of 36 rows settle it
    p = (Diag(0, None, stride=3) * (Rect(rows=(2, 4), cols=(1, 3), stride=(2, 2)) >> Diag(0, None, stride=9))
         * (~Diag(2, 19, stride=7) + Rect(rows=(0, 8), cols=(0, 3), stride=(17, 13), offset=(15, 4))
            + Diag(-7, 24, stride=2)) * Causal())
    n = 1500
    monkeypatch.setattr(line_last_module, "ROUNDS", 8)
    j, lo, hi = np.arange(n), np.arange(n), np.full(n, n)
    want = _want(np.asarray(p.to_mask(n), dtype=bool), COLUMN, lo, hi)
    assert (want < 0).sum() > n // 2
    got, known = last_cells(p, COLUMN, j, lo, hi)
    assert known.all()
    np.testing.assert_array_equal(got, want)
    # with the line's period alone (longer than the sequence) some are left unknown (the envelope
    # settles those the spread's blocks never reach)
    monkeypatch.setattr(line_last_module, "terms_piece_period",
                        lambda terms, axis, fixed, x: np.full(len(fixed), line_last_module.LONG))
    _, known = last_cells(p, COLUMN, j, lo, hi)
    assert not known.all()
