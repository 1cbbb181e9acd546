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


@settings(max_examples=200, deadline=None)
@given(patterns(max_depth=4), st.integers(1, 40), st.data())
def test_last_cells_equal_the_mask(p, n: int, data) -> None:
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
