"""Polygon IR (shapely): the attended cells of a mask window as exact rectilinear polygons.

Only small windows are ever turned into polygons (one period of a group, or a plot); the
length-independent description lives in `sas.ir.periodicity`.

A strided region is a lattice on a polygon, not a union of unit boxes (`lattice_geometry`):
when every attended cell lies on one lattice (keys `x0 + sx*k`, queries `y0 + sy*m`), the
polygon is drawn on the lattice's own grid, each lattice point stretched to its `sx x sy`
cell, so a strided window is a band of a few boxes instead of one box per attended cell.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import shapely
from shapely import affinity
from shapely.geometry.base import BaseGeometry


def mask_polygon(mask: np.ndarray) -> BaseGeometry:
    """Union of the on-cells of a boolean mask (x = key j, y = query i) as shapely geometry.

    Row runs become boxes; runs repeated on consecutive rows are merged first, so a band
    or a block is one box per change of shape rather than one per row.
    """
    padded = np.concatenate([np.zeros((mask.shape[0], 1), np.int8), mask.astype(np.int8),
                             np.zeros((mask.shape[0], 1), np.int8)], axis=1)
    rows, cols = np.nonzero(np.diff(padded, axis=1))
    per_row: list[set[tuple[int, int]]] = [set() for _ in range(mask.shape[0])]
    for r, a, b in zip(rows[::2].tolist(), cols[::2].tolist(), cols[1::2].tolist()):
        per_row[r].add((a, b))
    active: dict[tuple[int, int], int] = {}   # run -> first row of its box
    boxes: list[tuple[int, int, int, int]] = []
    for r, runs in enumerate(per_row + [set()]):
        for run in [k for k in active if k not in runs]:
            boxes.append((run[0], active.pop(run), run[1], r))
        for run in runs:
            active.setdefault(run, r)
    if not boxes:
        return shapely.Polygon()
    arr = np.array(boxes, dtype=float)
    return shapely.union_all(shapely.box(arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3]))


@dataclass(frozen=True)
class Lattice:
    """The cells (query i, key j) with j = x0 + sx*k and i = y0 + sy*m (an axis lattice), or,
    with `sd` > 1, the cells with i - j = d0 + sd*m (a diagonal lattice: strided diagonals)."""

    sx: int = 1
    sy: int = 1
    x0: int = 0
    y0: int = 0
    sd: int = 1
    d0: int = 0

    @property
    def cell_area(self) -> int:
        return self.sx * self.sy * self.sd

    def shifted(self, dx: int, dy: int) -> "Lattice":
        return Lattice(self.sx, self.sy, self.x0 + dx, self.y0 + dy, self.sd, self.d0 + dy - dx)

    def describe(self) -> str:
        if self.sd > 1:
            return f"every {self.sd}th diagonal from i - j = {self.d0}"
        return f"every {self.sx} key(s) x {self.sy} query(ies) from key {self.x0}, query {self.y0}"


def _axis_lattice(idx: np.ndarray) -> tuple[int, int]:
    """(step, first) of the coarsest arithmetic progression holding every index."""
    first = int(idx[0])
    step = int(np.gcd.reduce(idx - first)) if len(idx) > 1 else 1
    return max(step, 1), first


def mask_lattice(mask: np.ndarray) -> Lattice | None:
    """The coarsest axis lattice holding every on-cell of `mask`, else the coarsest diagonal
    one (None: the unit lattice, or no cell)."""
    rows = np.flatnonzero(mask.any(axis=1))
    if len(rows) == 0:
        return None
    cols = np.flatnonzero(mask.any(axis=0))
    sy, y0 = _axis_lattice(rows)
    sx, x0 = _axis_lattice(cols)
    if sx > 1 or sy > 1:
        return Lattice(sx, sy, x0, y0)
    i, j = np.nonzero(mask)
    sd, d0 = _axis_lattice(np.unique(i - j))
    return Lattice(sd=sd, d0=d0) if sd > 1 else None


def lattice_geometry(mask: np.ndarray) -> tuple[BaseGeometry, Lattice | None]:
    """The on-cells of `mask` as (polygon, lattice): with a lattice, the polygon covers each
    attended lattice point's cell (an `sx x sy` box, or a parallelogram of area `sd` spanning
    `sd` diagonals), so its area is cells x `cell_area`; without, it is `mask_polygon(mask)`."""
    lat = mask_lattice(mask)
    if lat is None:
        return mask_polygon(mask), None
    if lat.sd == 1:
        sub = mask[lat.y0::lat.sy, lat.x0::lat.sx]
        return affinity.affine_transform(mask_polygon(sub), [lat.sx, 0, 0, lat.sy, lat.x0, lat.y0]), lat
    # diagonal lattice: cell (i, j) -> (w = (i - j - d0) / sd, u = j), drawn on the (u, w) grid
    i, j = np.nonzero(mask)
    w = (i - j - lat.d0) // lat.sd
    sub = np.zeros((int(w.max()) + 1, mask.shape[1]), dtype=bool)
    sub[w, j] = True
    # back: x = u, y = u + sd * w + d0 (a shear of determinant sd)
    return affinity.affine_transform(mask_polygon(sub), [1, 0, 1, lat.sd, 0, lat.d0]), lat


def corner_xs(geom: BaseGeometry) -> list[int]:
    xs: set[int] = set()
    for poly in getattr(geom, "geoms", [geom]):
        if poly.is_empty:
            continue
        for ring in [poly.exterior, *poly.interiors]:
            xs.update(int(round(x)) for x, _ in ring.coords)
    return sorted(xs)
