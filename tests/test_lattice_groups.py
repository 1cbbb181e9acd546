"""Strided regions as a lattice on a polygon (sas.ir.polygons.lattice_geometry): the polygon
and lattice describe exactly the mask's cells, and decomposition groups report exact counts."""

from __future__ import annotations

import numpy as np
import shapely
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import causal_patterns

from sas import Causal, Diag, Rect, analyze
from sas.ir.polygons import Lattice, lattice_geometry, mask_lattice


def _cells(poly, lat: Lattice | None, shape: tuple[int, int]) -> np.ndarray:
    """Rasterize: a cell is on when it is a lattice point whose own lattice cell's centre lies
    inside the polygon."""
    i, j = np.mgrid[0:shape[0], 0:shape[1]]
    on = np.ones(shape, dtype=bool)
    x, y = j + 0.5, i + 0.5
    if lat is not None:
        if lat.sd > 1:
            # the cell of (i, j) is the unit box (j, w) of the (u, w) grid sheared back: its
            # centre (u, w) + 0.5 lands at x = j + 0.5, y = i + 0.5 + sd / 2
            on = (i - j - lat.d0) % lat.sd == 0
            y = i + 0.5 + lat.sd / 2
        else:
            on = ((j - lat.x0) % lat.sx == 0) & ((i - lat.y0) % lat.sy == 0)
            x, y = j + lat.sx / 2, i + lat.sy / 2
    inside = shapely.contains_xy(poly, x.ravel(), y.ravel()).reshape(shape)
    return on & inside


def _check(mask: np.ndarray) -> None:
    poly, lat = lattice_geometry(mask)
    per = lat.cell_area if lat is not None else 1
    assert round(poly.area) == mask.sum() * per
    assert np.array_equal(_cells(poly, lat, mask.shape), mask)


def test_strided_window_is_one_band_on_a_diagonal_lattice() -> None:
    a = analyze(Diag(0, 1024, stride=4) * Causal(), 1 << 20)
    tail = a.groups[-1]
    assert tail.lattice is not None and tail.lattice.sd == 4 and tail.n_polygons == 1
    assert tail.area == 130560 and tail.query_bounds == ((1 << 20) - 1020, 1 << 20)


def test_axis_lattice_of_strided_columns() -> None:
    m = np.zeros((12, 12), dtype=bool)
    m[1::3, 2::4] = True
    assert mask_lattice(m) == Lattice(sx=4, sy=3, x0=2, y0=1)
    _check(m)


def test_diagonal_lattice() -> None:
    i, j = np.mgrid[0:20, 0:20]
    m = ((i - j) % 3 == 1) & (i >= j) & (i - j < 12)
    assert mask_lattice(m) == Lattice(sd=3, d0=1)
    _check(m)


@settings(max_examples=40, deadline=None)
@given(causal_patterns(max_depth=3), st.integers(4, 40))
def test_random_masks_round_trip(p, n: int) -> None:
    m = np.asarray(p.to_mask(n), dtype=bool)
    if m.any():
        _check(m)
