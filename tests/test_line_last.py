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
from sas.lang.pattern import And


def _want(mask: np.ndarray, axis: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    lines = mask.T if axis == COLUMN else mask
    x = np.arange(lines.shape[1])[None, :]
    on = lines & (x >= lo[:, None]) & (x < hi[:, None])
    return np.where(on.any(axis=1), lines.shape[1] - 1 - np.argmax(on[:, ::-1], axis=1), -1)


#: How a product's lines that have not agreed skip periodic pieces (`line_last._skip_pieces`):
#: as by default; every such line after one round by reading the rest of a period cell by
#: cell, on every position or a lattice's members, or on the positions of the residues the
#: terms allow wherever they give any; only by the positions passed (no cells read). But for
#: the default, the leapfrog steps to every position (no residues it skips), so that more
#: lines reach the pieces.
SKIP_MODES = {
    "default": {},
    "cells": {"CHECK_AFTER": 1, "ROUND_CELLS": 1 << 40, "RESIDUE_SHARE": 0.0, "SNAP_MODULUS": 0},
    "residues": {"CHECK_AFTER": 1, "ROUND_CELLS": 1 << 40, "RESIDUE_SHARE": float(1 << 40), "SNAP_MODULUS": 0},
    "passed": {"CHECK_AFTER": 1, "WINDOW_PERIOD": 0, "SNAP_MODULUS": 0},
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
    j, lo, hi = np.arange(n), np.zeros(n, dtype=np.int64), np.full(n, n)
    want = _want(np.asarray(p.to_mask(n), dtype=bool), COLUMN, lo, hi)
    got, known = last_cells(p, COLUMN, j, lo, hi)
    assert known.all()
    np.testing.assert_array_equal(got, want)
    monkeypatch.setattr(line_last_module, "ROUNDS", 1)
    monkeypatch.setattr(line_last_module, "SNAP_MODULUS", 0)     # not to the residues both allow
    got, known = last_cells(p, COLUMN, j, lo, hi)
    assert not known.any()


def test_the_leapfrog_steps_to_the_residues_both_lattices_allow(monkeypatch: pytest.MonkeyPatch) -> None:
    # rows 0 mod 7 and 1 mod 8 meet every 56 rows, about four rounds down a column; the
    # position steps to the one residue of 56 both allow, and they agree in the first round
    p = Rect(stride=(7, 1)) * Rect(stride=(8, 1), offset=(1, 0))
    n = 300
    j, lo, hi = np.arange(n), np.zeros(n, dtype=np.int64), np.full(n, n)
    want = _want(np.asarray(p.to_mask(n), dtype=bool), COLUMN, lo, hi)
    monkeypatch.setattr(line_last_module, "ROUNDS", 1)
    got, known = last_cells(p, COLUMN, j, lo, hi)
    assert known.all()
    np.testing.assert_array_equal(got, want)
    monkeypatch.setattr(line_last_module, "SNAP_MODULUS", 0)
    got, known = last_cells(p, COLUMN, j, lo, hi)
    assert not known.all()
    np.testing.assert_array_equal(got[known], want[known])


@pytest.mark.parametrize("p, share", [
    # a spread's unit rows 3-5 of 6 against another's block-diagonal 2 x 2 cells (the fuzzer's
    # #3611, about): on a third of the columns no row is allowed, on the others one or two of 6
    ((Rect(rows=(3, 6), cols=(0, 4)) >> ~Rect(rows=(None, 2), cols=(3, None), stride=(3, 7), offset=(2, 5)))
     * ((Rect(size=(2, 2)) >> (Rect(size=(3, 3)) * Diag(0, 1, stride=5))) >> (Diag(-1, None) + Rect(cols=(1, None))))
     * Causal(), 0.6),
    (Diag(-4, None, stride=2) * (Rect(rows=(4, 6), cols=(1, 2), stride=(2, 1)) >> Causal()) * Causal(), 0.2),
    # one term with residues, a spread on 2 columns of 5 (the fuzzer's #20854, about): the
    # sum before it is not asked on the other 3
    ((Diag(0, None, stride=3) + Rect(cols=(0, 5))) * (Rect(rows=(5, 6), cols=(3, 5)) >> ~Diag(45, 67, stride=65))
     * Causal(), 0.9),
])
def test_the_leapfrog_steps_to_allowed_residues(p, share: float, monkeypatch: pytest.MonkeyPatch) -> None:
    n = 600
    j, lo, hi = np.arange(n), np.zeros(n, dtype=np.int64), np.full(n, n)
    mask = np.asarray(p.to_mask(n), dtype=bool)
    asked = []
    last = line_last_module._last

    def counted(q, neg, axis, fixed, lo_, hi_):
        asked.append(len(fixed))
        return last(q, neg, axis, fixed, lo_, hi_)

    monkeypatch.setattr(line_last_module, "_last", counted)
    lines = []
    for snap in (64, 0):
        monkeypatch.setattr(line_last_module, "SNAP_MODULUS", snap)
        asked.clear()
        for axis in (COLUMN, ROW):
            got, known = last_cells(p, axis, j, lo, hi)
            np.testing.assert_array_equal(got[known], _want(mask, axis, lo, hi)[known])
        lines.append(sum(asked))
    assert lines[0] < share * lines[1]     # lines asked of the terms, all levels


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
    # without the pieces (nor the residues the leapfrog skips) the same columns are left to
    # the caller
    monkeypatch.setattr(line_last_module, "SNAP_MODULUS", 0)
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


@pytest.mark.parametrize("p, cells", [
    # row 3 of a spread's 4 x 4 unit against rows 0 and 2 of another's, four rows high (the
    # fuzzer's #20185): they never meet, which the units' residues show without a cell read
    ((Rect(rows=(3, 4), cols=(3, 4), stride=(2, 1)) >> (Rect(size=(1, 4)) >> Diag(1, None)))
     * (Rect(rows=(0, 4), cols=(0, 1), stride=(2, 1)) >> ~(Diag(-41, 20, stride=65) + Diag(45, 1, stride=65)))
     * Causal(), 0),
    # odd rows of a spread's 6-row unit against a band of stride 2 (#3901, about): on the columns
    # of the band's even rows nothing, on the others every other row of a period
    ((Rect(rows=(1, 6), cols=(1, 4), stride=(2, 1)) >> ~(Rect(size=(3, 4)) >> Diag(-4, None, stride=7)))
     * Diag(4, None, stride=2) * Causal(), None),
])
def test_windows_read_only_the_residues_the_units_allow(p, cells: int | None,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    n = 1500
    lo, hi = np.zeros(n, dtype=np.int64), np.full(n, n)
    want = _want(np.asarray(p.to_mask(n), dtype=bool), COLUMN, lo, hi)
    _skip_mode(monkeypatch, "cells")            # the leapfrog steps to every position
    read: list[int] = []
    first_held = line_last_module._first_held

    def counted(terms, neg, axis, fixed, start, x):
        read.append(x.size)
        return first_held(terms, neg, axis, fixed, start, x)

    monkeypatch.setattr(line_last_module, "_first_held", counted)
    by_cells = []
    for share in (0.0, 1.0):        # every position (or a lattice's members), the residues
        monkeypatch.setattr(line_last_module, "RESIDUE_SHARE", share)
        read.clear()
        got, known = last_cells(p, COLUMN, np.arange(n), lo, hi)
        assert known.all()
        np.testing.assert_array_equal(got, want)
        by_cells.append(sum(read))
    assert by_cells[1] <= by_cells[0] // 4
    if cells is not None:
        assert by_cells[1] == cells


@settings(max_examples=150, deadline=None)
@given(patterns(max_depth=4), st.integers(1, 40), st.integers(1, 48))
def test_residues_allow_every_cell_of_the_product(p, n: int, width: int) -> None:
    """`_residues` is a necessary condition: every cell where all terms hold has an allowed
    residue, along columns and rows; its modulus stays within the window's width."""
    terms = list(p.terms) if isinstance(p, And) else [p]
    mask = np.asarray(p.to_mask(n), dtype=bool)
    for axis, lines in ((COLUMN, mask.T), (ROW, mask)):
        fixed = np.arange(n, dtype=np.int64)
        found = line_last_module._residues(terms, axis, fixed, width)
        if found is None:
            continue
        modulus, allowed = found.modulus, found.allowed(fixed)
        assert 1 <= modulus <= width and allowed.shape == (n, modulus)
        assert found.period * modulus <= line_last_module.RESIDUE_CELLS
        line, x = np.nonzero(lines)
        assert allowed[line, x % modulus].all()


@pytest.mark.parametrize("mode", ["cells", "residues"])
@pytest.mark.parametrize("p", [
    ~(~Rect(stride=(5, 1)) + ~Rect(stride=(7, 1), offset=(1, 0))),
    ~(~Diag(-3, None, stride=4) + ~(Rect(size=(3, 2)) >> Diag(0, None, stride=3))),
])
def test_windows_of_a_complement_read_the_complement(p, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # a complement of a sum is a product of its terms' complements, which its windows test
    _skip_mode(monkeypatch, mode)
    n = 60
    mask = np.asarray(p.to_mask(n), dtype=bool)
    for axis in (COLUMN, ROW):
        lo, hi = np.zeros(n, dtype=np.int64), np.full(n, n)
        got, known = last_cells(p, axis, np.arange(n), lo, hi)
        np.testing.assert_array_equal(got[known], _want(mask, axis, lo, hi)[known])
        assert known.any()


@pytest.mark.parametrize("share", [0.0, 1.0, float(1 << 40)])
@settings(max_examples=100, deadline=None)
@given(patterns(max_depth=4), st.integers(1, 40), st.data())
def test_window_last_equals_the_mask(share: float, p, n: int, data) -> None:
    """A window read cell by cell (every position or a lattice's members, as chosen, or the
    allowed residues) finds the last position in [start, top] where every term holds (every
    term's complement), against the terms' masks."""
    terms = list(p.terms) if isinstance(p, And) else [p]
    masks = [np.asarray(t.to_mask(n), dtype=bool) for t in terms]
    ends = st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), min_size=n, max_size=n)
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(line_last_module, "RESIDUE_SHARE", share)
        for neg in (False, True):
            held = np.logical_and.reduce([~m if neg else m for m in masks])
            for axis in (COLUMN, ROW):
                start, top = np.sort(np.array(data.draw(ends), dtype=np.int64).reshape(n, 2), axis=1).T
                got = line_last_module._window_last(terms, neg, axis, np.arange(n, dtype=np.int64), start, top)
                np.testing.assert_array_equal(got, _want(held, axis, start, top + 1))


def test_a_lattice_window_stops_at_its_band(monkeypatch: pytest.MonkeyPatch) -> None:
    # on column 1, Diag(2, None, stride=2) holds at rows 3, 5, ...: row 1, two below its last
    # member in the window, is not one, though Diag(0, 1) holds there (explore-profile finding)
    monkeypatch.setattr(line_last_module, "RESIDUE_SHARE", 0.0)
    terms = [Diag(2, None, stride=2), Diag(0, 1)]
    one = np.ones(1, dtype=np.int64)
    assert line_last_module._window_last(terms, False, COLUMN, one, 0 * one, 3 * one).tolist() == [-1]
