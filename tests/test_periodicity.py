"""The periodic structure of a pattern (`sas.ir.periodicity`) against its mask.

Every guarantee the `Structure` docstring states is checked cell by cell on the exact mask of
random compositions (and on hand-picked ones), over a window long enough to hold each period
twice past its boundary.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings

from sas import Causal, Diag, Rect
from sas.ir.periodicity import Structure, gap, structure

from strategies import diags, drifting_spreads, leaves, patterns

#: Largest mask side the property reads (a pattern whose window is longer is skipped by assume).
MAX_SIDE = 400


def _side(st: Structure) -> int:
    longest = max(st.P, st.Qv, st.Qh, st.row_period or 1, st.col_period or 1)
    return st.T + max(st.Dv, st.Dh) + 2 * longest + 8


def _broken_guarantees(m: np.ndarray, st: Structure) -> list[str]:
    """Names of the guarantees of st that the n x n mask m contradicts."""
    n = len(m)
    i, j = np.indices((n, n))
    broken = []

    def check(name: str, di: int, dj: int, where: np.ndarray) -> None:
        inside = where & (i + di < n) & (j + dj < n)
        a, b = i[inside], j[inside]
        if not np.array_equal(m[a + di, b + dj], m[a, b]):
            broken.append(name)

    T = st.T
    check("diagonal", st.P, st.P, (i >= T) & (j >= T))
    check("vertical", st.Qv, 0, (i >= T) & (i - j >= st.Dv))
    check("horizontal", 0, st.Qh, (j >= T) & (j - i >= st.Dh))
    if st.row_period:
        check("row period", st.row_period, 0, i >= T)
    if st.col_period:
        check("column period", 0, st.col_period, j >= T)
    return broken


def _check_guarantees(p) -> None:
    """Every guarantee of p's structure on its mask (patterns without one, or with a window past
    `MAX_SIDE`, are left out by assume)."""
    st = structure(p)
    assume(st.periodic)
    n = _side(st)
    assume(n <= MAX_SIDE)
    assert _broken_guarantees(p.to_mask(n), st) == []


@settings(max_examples=300, deadline=None)
@given(patterns())
def test_random_compositions_keep_every_guarantee(p):
    _check_guarantees(p)


@settings(max_examples=200, deadline=None)
@given(leaves())
def test_every_primitive_keeps_every_guarantee(p):
    """Primitives alone: in a composition another term's period often hides a wrong one."""
    st = structure(p)
    assert _broken_guarantees(p.to_mask(_side(st)), st) == []


HAND_PICKED = [
    # one bounded side: the stride of the other side still repeats beyond the boundary
    Rect(rows=(0, 3), cols=(2, None), stride=(1, 2)),
    Rect(rows=(None, 4), cols=(1, None), stride=(3, 5), offset=(1, 2)),
    Rect(rows=(2, None), cols=(0, 5), stride=(3, 2), offset=(2, 1)),
    Rect(rows=(1, None), cols=(3, None), stride=(2, 3)),
    Rect(rows=(1, 6), cols=(0, 4), stride=(2, 3)),
    # the fuzzer's #12263, scaled down: strided diagonals and one row of strided columns
    (Diag(5, stride=7) + Diag(2, stride=5) + Diag(4, size=30, stride=2)
     + Rect(rows=(None, 12), stride=(41, 7), offset=(10, 3))) * Causal(),
    ~Rect(rows=(None, 12), stride=(41, 7), offset=(10, 3)) * Diag(-3, stride=4),
    # a drifting spread (3 x 1 blocks) cut by a band: bounded, so periodic past its extent
    (Rect(size=(3, 1)) >> Diag(0, 4)) * Diag(0, 8),
    ~((Rect(size=(3, 1)) >> Diag(0, 4)) * Diag(0, 8)) * Diag(0, 5),
    # spreads of units wider than tall below a diagonal (`structure_in`): the fuzzer's #7171,
    # about, and strided layouts, complements and sums of them
    (Rect(size=(1, 2)) >> Causal()) * Causal(),
    (Diag(-4, 48, stride=2) * Diag(-7, 16, stride=3) * (Rect(size=(1, 2)) >> Causal())
     + Diag(-15, 35, stride=7)) * Causal(),
    (Rect(size=(3, 4)) >> Diag(-4, None, stride=7)) * Diag(2, None),
    ~(Rect(size=(2, 5)) >> Diag(1, None, stride=3)) * Diag(-3, None),
    ((Rect(rows=(0, 2), cols=(2, 5)) >> (Rect(stride=(4, 2), offset=(3, 1)) * Diag(2, None, stride=5)))
     + Diag(3, 7)) * Diag(0, None, stride=2),
]


@pytest.mark.parametrize("p", HAND_PICKED, ids=repr)
def test_hand_picked_patterns_keep_every_guarantee(p):
    st = structure(p)
    assert _broken_guarantees(p.to_mask(_side(st)), st) == []


def test_bounded_side_carries_no_stride():
    """A strided row block that ends is empty past its boundary: it adds no period there (the
    fuzzer's #12263 had P = 2807 from it, and took 6.7 s instead of 16 ms at 2^20)."""
    st = structure(Rect(rows=(None, 128), stride=(401, 7), offset=(103, 3)))
    assert (st.P, st.Qv, st.row_period, st.Qh, st.col_period) == (1, 1, 1, 7, 7)
    st = structure(Rect(rows=(5, None), cols=(0, 9), stride=(4, 3)))
    assert (st.P, st.Qv, st.row_period, st.Qh, st.col_period) == (1, 4, 4, 1, 1)


def test_a_bounded_node_is_empty_past_its_extent():
    """A node whose envelope ends (a drifting spread cut by a band: no cell past row 17) repeats
    trivially past that boundary; without the envelope it had no periodic description at all, and
    was analysed per token."""
    p = (Rect(size=(3, 1)) >> Diag(0, 4)) * Diag(0, 8)
    st = structure(p)
    assert st.periodic and (st.T, st.P, st.Qv, st.Qh) == (17, 1, 1, 1)
    assert not structure(Rect(size=(3, 1)) >> Diag(0, 4)).periodic




@settings(max_examples=200, deadline=None)
@given(drifting_spreads(wide=True, max_depth=1), diags())
def test_wide_spreads_below_a_diagonal_keep_every_guarantee(p, line):
    """A spread of a unit wider than tall in a sum, product or complement, cut by a Diag:
    periodic below the Diag's line (`structure_in`)."""
    _check_guarantees(p * line)


def test_a_wide_spread_below_a_diagonal_repeats():
    """Blocks of 1 x 2 over the causal layout drift off the diagonal (no structure alone), but
    below the diagonal every cell is attended from row 0 on; with a strided layout the blocks
    repeat every lcm(h, w) P' rows, P' = lcm(layout P, layout Qv) (here 84 = lcm(3 x 7, 4 x 7))."""
    wide = Rect(size=(1, 2)) >> Causal()
    assert not structure(wide).periodic and gap(wide * Causal()) == 0
    st = structure(wide * Causal())
    assert st.periodic and (st.P, st.T, st.Qv) == (2, 0, 1)
    st = structure((Rect(size=(3, 4)) >> Diag(-4, None, stride=7)) * Diag(2, None))
    assert st.periodic and (st.P, st.Qv, st.Dv) == (84, 21, 2)
    # a unit taller than wide reaches both sides of its layout's diagonal below any line: none
    assert not structure((Rect(size=(3, 1)) >> Causal()) * Causal()).periodic
