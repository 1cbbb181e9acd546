"""Strided regions as a lattice on a polygon (sas.ir.polygons.lattice_geometry): the polygon
and lattice describe exactly the mask's cells, and decomposition groups report exact counts."""

from __future__ import annotations

import numpy as np
import shapely
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import causal_patterns

from sas import Causal, Diag, Rect, analyze
from sas.ir.polygons import Lattice, lattice_geometry, mask_lattice, mask_polygon, runs_polygon


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


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 9), st.integers(1, 9), st.floats(0.1, 0.9), st.integers(0, 2**32 - 1))
def test_traced_polygon_is_the_valid_union_of_the_cells(h: int, w: int, density: float, seed: int) -> None:
    """mask_polygon traces the boundary of the cells (rings linked at diagonal touches,
    holes given to their shells): a valid geometry equal to the union of one box per cell,
    with as many polygons as shapely's union makes."""
    m = np.random.default_rng(seed).random((h, w)) < density
    g = mask_polygon(m)
    i, j = np.nonzero(m)
    union = shapely.union_all(shapely.box(j, i, j + 1, i + 1)) if len(i) else shapely.Polygon()
    assert g.is_valid and round(g.area) == m.sum()
    assert g.symmetric_difference(union).area == 0
    assert len(getattr(g, "geoms", [g])) == len(getattr(union, "geoms", [union]))


def test_staircase_of_chunked_attention_is_one_polygon() -> None:
    """A chunk's triangle of 4096 columns: one shell whose corners are the staircase's."""
    b = 4096
    x = np.arange(b)
    g = runs_polygon(x, x, np.full(b, b))
    assert g.geom_type == "Polygon" and g.is_valid and round(g.area) == b * (b + 1) // 2
    assert len(g.exterior.coords) == 2 * b + 3       # 2b + 2 corners, closed
