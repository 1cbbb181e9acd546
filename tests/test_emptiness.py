"""Products found empty from the tree (`sas.ir.emptiness`), and what the analysis does with
them: a sum drops them from its periodic structure. And the order `sas.ir.line_runs` reads
the terms of products and sums in: a strided diagonal's band first, a spread over a short
band before an endless stride, and the term that stays sparse on the lines at hand before
one that cuts them finely."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import diags, patterns, rects

from analysis_checks import brute_cache_size, brute_last_use
from sas import Causal, Diag, Rect, analyze
from sas.errors import AnalysisError, EmptyPatternError
from sas.ir.emptiness import provably_empty
import sas.ir.line_runs as line_runs_module
from sas.ir.line_runs import COLUMN, line_runs
from sas.ir.periodicity import structure
from sas.lang.pattern import And

N = 150     # past every parameter the strategies draw (ranges start <= 10, sizes <= 8)


def _products():
    """Products of two to four primitives: often empty (ranges that miss, diagonals of other
    residues, a band that misses a box)."""
    return st.lists(st.one_of(rects(), diags(), st.just(Causal())), min_size=2, max_size=4).map(
        lambda ts: And(*ts))


@settings(max_examples=400, deadline=None)
@given(st.one_of(_products(), patterns(max_depth=4)))
def test_a_pattern_found_empty_has_no_cell(p):
    if provably_empty(p):
        assert not np.asarray(p.to_mask(N), dtype=bool).any()


@pytest.mark.parametrize("p", [
    Diag(3, None, stride=7) * Diag(2, None, stride=7),                  # residues that never meet
    Rect(rows=(0, 1), cols=(0, 2)) * Rect(rows=(3, 5)),                  # rows that do not meet
    Rect(rows=(2, 6), cols=(0, 4), stride=(1, 5), offset=(0, 4)),        # offset past the range
    Rect(rows=(0, 4), cols=(10, 20)) * Causal(),                         # a box above the diagonal
    Rect(rows=(0, 1), cols=(0, 2)) * Diag(2, 1),                         # a band that misses the box
    Rect(rows=(None, 1), cols=(1, 3), stride=(2, 3)) * Diag(-4, None, stride=7),
    Rect(size=(2, 3)) >> (Diag(3, None, stride=7) * Diag(2, None, stride=7)),
    (Rect(rows=(0, 1), cols=(0, 2)) * Rect(rows=(3, 5))) + (Rect(size=(2, 2)) * Rect(rows=(4, None))),
])
def test_empty_products_are_found(p):
    assert provably_empty(p)
    assert not np.asarray(p.to_mask(64), dtype=bool).any()


@pytest.mark.parametrize("p", [
    Rect(rows=(0, 4), cols=(3, 20)) * Causal(),                          # the box touches the diagonal
    Diag(3, None, stride=7) * Diag(10, None, stride=7),
    Rect(size=(2, 3)) >> Diag(0, None, stride=5),
    ~(Diag(3, None, stride=7) * Diag(2, None, stride=7)),                # everything
])
def test_non_empty_patterns_are_not_found_empty(p):
    assert not provably_empty(p)


# A sum whose first term is a spread of a non-square unit (no periodic structure) that is
# empty, and whose second is periodic: a fuzzing helper's pattern that took 66 s at 2^18 per
# token; with the empty term dropped, the sum is periodic and analysed in milliseconds.
SUM_WITH_EMPTY_TERM = ((((Rect(rows=(0, 1), cols=(0, 2)) * Rect(rows=(3, 5)))
                         >> (Diag(1, 1, stride=4) * Diag(-3, 1, stride=2)))
                        + (Diag(1, None, stride=7) * (Rect(rows=(1, 5), cols=(1, 4))
                                                      >> Rect(stride=(13, 1), offset=(2, 0)))))
                       * Causal())


def test_an_empty_term_leaves_the_sum_periodic():
    assert structure(SUM_WITH_EMPTY_TERM).periodic
    n = 3000
    mask = np.asarray(SUM_WITH_EMPTY_TERM.to_mask(n), dtype=bool)
    a = analyze(SUM_WITH_EMPTY_TERM, n)
    assert a.cache_size == brute_cache_size(mask)
    L = brute_last_use(mask)
    assert L.max() > 0
    assert a.structure.periodic and a._columns is not None      # the length-independent column shapes
    np.testing.assert_array_equal(a._columns.last_use(np.arange(n), n), L)


# A product of a spread over a short band (strictly above the diagonal) and an endless strided
# diagonal below it: the diagonal alone makes a run every 5 cells of every column (O(n^2 / 5)
# runs; past 100 s at 2^20 before), its band bounds the spread, which is empty there.
SPREAD_TIMES_STRIDE = ((Rect(rows=(0, 2), cols=(0, 4), stride=(2, 2))
                        >> (Rect(rows=(0, 2), cols=(0, 3)) >> Diag(-163, 123, stride=5)))
                       * Diag(52, None, stride=5) * Causal())


def test_a_strided_diagonal_bounds_a_product_by_its_band_first():
    n = 1 << 12
    j = np.arange(n)
    # 8 runs allowed for the 4096 columns' whole height: none is built
    assert len(line_runs(SPREAD_TIMES_STRIDE, COLUMN, j, np.zeros(n, dtype=np.int64), np.full(n, n), limit=8)) == 0
    assert not np.asarray(SPREAD_TIMES_STRIDE.to_mask(400), dtype=bool).any()
    with pytest.raises(EmptyPatternError):
        analyze(SPREAD_TIMES_STRIDE, 1 << 16)


def test_a_spread_over_a_short_band_is_read_before_an_endless_stride():
    # a stride-3 diagonal from distance -60 on and a spread over a short strided band (few
    # cells a column, as strided as the diagonal): the spread first, the stride inside its runs
    p = Diag(-60, None, stride=3) * (Rect(size=(2, 3)) >> Diag(-20, 14, stride=2))
    n = 1 << 11
    j = np.arange(n)
    lo, hi = np.zeros(n, dtype=np.int64), np.full(n, n)
    want = np.asarray(p.to_mask(n), dtype=bool)
    r = line_runs(p, COLUMN, j, lo, hi, limit=4 * n)     # the stride alone: ~n / 3 a column
    np.testing.assert_array_equal(_cells(r, n), want)
    with pytest.raises(AnalysisError, match="runs limit"):
        line_runs(Diag(-60, None, stride=3), COLUMN, j, lo, hi, limit=4 * n)


def _cells(r, n: int) -> np.ndarray:
    got = np.zeros((n, n), dtype=bool)
    for line, a, b in zip(r.line, r.start, r.stop):
        got[a:b, line] = True
    return got


def test_a_sum_reads_the_term_that_fills_its_lines_first():
    # a stride-2 diagonal comes first in the tree's order (as strided, as unbounded); the
    # complement fills every column but one, so the diagonal is read only inside its gaps
    p = Diag(-5, None, stride=2) + ~Rect(rows=(5, None), cols=(0, 8), stride=(17, 17), offset=(2, 4))
    n = 1 << 11
    j = np.arange(n)
    r = line_runs(p, COLUMN, j, np.zeros(n, dtype=np.int64), np.full(n, n), limit=8 * n)
    np.testing.assert_array_equal(_cells(r, n), np.asarray(p.to_mask(n), dtype=bool))


def test_a_product_reads_the_term_empty_on_its_lines_first():
    # on the columns of the second half, the spread (rows from 3j on) is empty and the sum of
    # stride-2 diagonals cuts every column into (n - j) / 2 cells: the spread is read first
    a = Diag(-5, None, stride=2) + Diag(24, 3, stride=2)
    b = Rect(rows=(1, 3), cols=(0, 1), stride=(2, 2)) >> (Causal() + Diag(1, None, stride=3))
    p = a * b
    n = 1 << 11
    j = np.arange(n // 2, n)
    assert len(line_runs(p, COLUMN, j, j, np.full(len(j), n), limit=8 * len(j))) == 0
    all_j = np.arange(n)
    r = line_runs(p, COLUMN, all_j, np.zeros(n, dtype=np.int64), np.full(n, n))
    np.testing.assert_array_equal(_cells(r, n), np.asarray(p.to_mask(n), dtype=bool))


@settings(max_examples=300, deadline=None)
@given(st.one_of(_products(), patterns(max_depth=4)))
def test_the_order_bounds_hold_on_every_line(p):
    """The bounds the tree's order of terms reads (cells and runs a line) hold on the mask's
    rows and columns; a spread over a short band has a finite bound however long its lines."""
    m = np.asarray(p.to_mask(60), dtype=np.int8)
    for lines in (m, m.T):
        cells = lines.sum(axis=1).max()
        runs = (np.diff(np.pad(lines, ((0, 0), (1, 0))), axis=1) == 1).sum(axis=1).max()
        assert cells <= line_runs_module._cells_bound(p)
        assert runs <= line_runs_module._runs_bound(p)


def test_a_spread_over_a_short_band_is_bounded_before_an_endless_stride():
    assert line_runs_module._runs_bound(Rect(size=(2, 3)) >> Diag(-20, 14, stride=2)) <= 7 * 3
    assert line_runs_module._runs_bound(Diag(-60, None, stride=3)) == float("inf")
    assert line_runs_module._cells_bound(Rect(rows=(None, 1), cols=(1, 3), stride=(2, 3))) == 1
