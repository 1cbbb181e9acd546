"""Polygon IR (shapely): the attended cells of a mask window as exact rectilinear polygons.

Only small windows are ever turned into polygons (one period of a group, or a plot); the
length-independent description lives in `sas.ir.periodicity`.
"""

from __future__ import annotations

import numpy as np
import shapely
from shapely.geometry import box
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


def corner_xs(geom: BaseGeometry) -> list[int]:
    xs: set[int] = set()
    for poly in getattr(geom, "geoms", [geom]):
        if poly.is_empty:
            continue
        for ring in [poly.exterior, *poly.interiors]:
            xs.update(int(round(x)) for x, _ in ring.coords)
    return sorted(xs)
