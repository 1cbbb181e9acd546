"""`sas.cli.empty_rows`: the queries that attend no key, counted from one period of the
pattern's structure, against the oracle `to_mask(n)` on hand-picked and random patterns."""

from __future__ import annotations

from math import lcm

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sas import Causal, Diag, Rect
from sas.cli import empty_rows as er
from sas.cli.empty_rows import empty_rows
from sas.ir.periodicity import structure

try:
    from tests.strategies import causal_patterns
except ImportError:  # pragma: no cover
    from strategies import causal_patterns  # type: ignore


def oracle(pattern, n):
    empty = ~pattern.to_mask(n).any(axis=1)
    return int(empty.sum()), (int(np.argmax(empty)) if empty.any() else None)


CASES = {
    "strided block-local (Table 1)": (Rect(size=(32, 32)) >> Diag(0, 1)) * Rect(stride=4) * Causal(),
    "rows from 5 on, every 3rd": Diag(0, 2) * Rect(rows=(5, None), stride=(3, 1)),
    "sink only from row 40": Rect(rows=(40, None), cols=(0, 2)),
    "window": Diag(0, 8),
    "every other row, late keys": Diag(3, 4) * Rect(stride=(2, 1)),
    "block diagonal, odd rows": (Rect(size=(6, 6)) >> Diag(0, 1)) * Rect(stride=(2, 1), offset=(1, 0)) * Causal(),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("n", [1, 7, 64, 333])
def test_hand_picked_against_the_oracle(name, n):
    p = CASES[name]
    e = empty_rows(p, n, structure(p))
    assert (e.count, e.first) == oracle(p, n)
    assert e.exact and e.checked == n


def test_the_period_summary_is_true_from_where_it_says():
    p = CASES["rows from 5 on, every 3rd"]
    e = empty_rows(p, 10_000, structure(p))
    assert (e.period, e.per_period) == (3, 2)
    empty = ~p.to_mask(600).any(axis=1)
    s = e.steady_from
    assert all(empty[i] == empty[i + e.period] for i in range(s, 600 - e.period))
    assert s == 0 or empty[s - 1] != empty[s - 1 + e.period]
    assert "2 in every 3 queries" in e.describe() and f"query {e.first}" in e.describe()


def test_long_lengths_from_one_period():
    p = CASES["strided block-local (Table 1)"]
    e = empty_rows(p, 1 << 40, structure(p))
    assert e.exact and e.count == 3 * (1 << 38) and e.first == 1


def test_without_a_period_or_past_the_row_limit_it_says_how_far_it_checked(monkeypatch):
    monkeypatch.setattr(er, "ROW_LIMIT", 300)
    monkeypatch.setattr(er, "BLOCK_CELLS", 1000)          # many small blocks
    p = CASES["rows from 5 on, every 3rd"]
    e = empty_rows(p, 10_000, None)                       # no structure given: the oracle, capped
    assert not e.exact and e.checked == 300 and (e.count, e.first) == oracle(p, 300)
    assert "the first 300 checked (of 10000)" in e.describe() and e.period is None
    assert empty_rows(p, 200, None).exact
    p = CASES["sink only from row 40"]                   # T = 40, period 1: the oracle reads 42 rows
    assert empty_rows(p, 1000, structure(p)).exact
    monkeypatch.setattr(er, "ROW_LIMIT", 41)
    e = empty_rows(p, 1000, structure(p))
    assert (e.checked, e.count, e.first) == (41, 40, 0) and not e.exact


@settings(max_examples=40, deadline=None)
@given(causal_patterns(), st.integers(1, 200))
def test_random_patterns_against_the_oracle(pattern, n):
    e = empty_rows(pattern, n, structure(pattern))
    assert (e.count, e.first) == oracle(pattern, n)
    if e.period is not None:   # the steady-state summary holds on the rows the oracle can show
        m = 3 * n + 64
        empty = ~pattern.to_mask(m).any(axis=1)
        s, d = e.steady_from, e.period
        assert all(empty[i] == empty[i + d] for i in range(s, m - d))
        assert int(empty[s:s + d].sum()) == e.per_period


@settings(max_examples=25, deadline=None)
@given(causal_patterns(), st.integers(1, 120))
def test_counts_past_the_oracle_prefix_extend_periodically(pattern, extra):
    """Lengths beyond the evaluated prefix: the count at n from one period equals the oracle."""
    st_ = structure(pattern)
    assume(st_.periodic)
    n = st_.T + st_.Dv + 2 * lcm(st_.P, st_.Qv) + extra
    assume(n <= 1500)
    e = empty_rows(pattern, n, st_)
    assert (e.count, e.first) == oracle(pattern, n)
