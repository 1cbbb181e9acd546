"""A convex region of the plane holding every attended cell of a pattern, from the tree alone.

Cell (i, j) is the unit square [j, j + 1] x [i, i + 1] (x = key, y = query). `envelope(p, rows,
cols)` is a convex shapely polygon inside the box [0, cols] x [0, rows] that contains the square
of every cell (i, j), i < rows, j < cols, the pattern attends:

- a `Diag` is the strip offset - 1 <= y - x <= offset + size between its first and last
  distance (its stride ignored), a `Rect` the box from its first row (column) to its end;
- a product is the intersection of its terms' regions, a sum the convex hull of their union;
- a spread is its layout's region (on the grid of blocks) scaled by the block's size: a block
  square maps onto its cells' squares exactly;
- a complement or a dynamic component may attend anything: the whole box.

It is a superset, never exact: a strided lattice, a complement or a spread's unit can leave
most of it empty. What it gives cheaply is where a pattern stops: a product of a band along
the diagonal and a spread that drifts away from it (blocks of 3 x 1 on a band of the block
grid) attends only near the origin, however long the sequence, which neither the periodic
structure nor a search of a million columns learns quickly. `attended_extent` turns it into
bounds on the rows and keys to search.
"""

from __future__ import annotations

import math
from functools import lru_cache

import shapely
from shapely import affinity
from shapely.geometry import Polygon

from sas.ir.emptiness import axis_span
from sas.lang.pattern import And, Or, Pattern, Spread
from sas.lang.primitives import Diag, Rect

#: Slack (relative to the box) added to the region's bounds before rounding them down to whole
#: cells: the vertices of a skewed intersection are rounded to doubles.
SLACK = 1e-9
#: Area under which a region holds no cell's square (each has area 1).
EMPTY_AREA = 0.5


def _box(x0: float, y0: float, x1: float, y1: float) -> Polygon:
    return shapely.box(x0, y0, x1, y1) if x1 > x0 and y1 > y0 else Polygon()


@lru_cache(maxsize=4096)
def envelope(p: Pattern, rows: int, cols: int) -> Polygon:
    """A convex polygon in [0, cols] x [0, rows] holding the squares of the cells p attends
    there (module doc); empty when p provably attends none."""
    box = _box(0, 0, cols, rows)
    if box.is_empty:
        return box
    if isinstance(p, Diag):
        low = p.offset - 1                                   # y - x >= low
        high = math.inf if p.size is None else p.offset + p.size   # y - x <= high
        # the strip within the box: corners of the box and the lines' crossings, kept when in it
        pts = [(x, y) for x, y in ((0, 0), (cols, 0), (0, rows), (cols, rows)) if low <= y - x <= high]
        for d in (low, high):
            if math.isfinite(d):
                pts += [(x, x + d) for x in (0, cols) if 0 <= x + d <= rows]
                pts += [(y - d, y) for y in (0, rows) if 0 <= y - d <= cols]
        return _hull(pts)
    if isinstance(p, Rect):
        (y0, r1), (x0, c1) = (axis_span(r, o) for r, o in zip((p.rows, p.cols), p.offset))
        y1 = rows if r1 is None else min(r1, rows)
        x1 = cols if c1 is None else min(c1, cols)
        return _box(x0, y0, x1, y1)
    if isinstance(p, And):
        region = box
        for t in p.terms:
            region = region.intersection(envelope(t, rows, cols))
            if region.is_empty or region.area < EMPTY_AREA:
                return Polygon()
        return region
    if isinstance(p, Or):
        parts = [e for e in (envelope(t, rows, cols) for t in p.terms) if not e.is_empty]
        return shapely.union_all(parts).convex_hull if parts else Polygon()
    if isinstance(p, Spread):
        h, w = p.shape
        layout = envelope(p.layout, -(-rows // h), -(-cols // w))
        if layout.is_empty:
            return layout
        return affinity.scale(layout, xfact=w, yfact=h, origin=(0, 0)).intersection(box)
    return box                                  # a complement, a dynamic component: anything


def _hull(pts: list[tuple[float, float]]) -> Polygon:
    if len(pts) < 3:
        return Polygon()
    hull = shapely.MultiPoint(pts).convex_hull
    return hull if isinstance(hull, Polygon) and hull.area >= EMPTY_AREA else Polygon()


def attended_extent(p: Pattern, rows: int, cols: int) -> tuple[int, int]:
    """(r, c): p attends no cell (i, j) with i >= r or j >= c inside rows x cols (0, 0 when it
    attends none), from its envelope."""
    region = envelope(p, rows, cols)
    if region.is_empty or region.area < EMPTY_AREA:
        return 0, 0
    # the squares of the attended cells end at whole numbers at or below the region's bounds
    _, _, x1, y1 = region.bounds
    slack = SLACK * max(rows, cols, 1)
    return min(rows, math.floor(y1 + slack)), min(cols, math.floor(x1 + slack))


#: The box `node_extent` reads a node's region in (any line or position past it: no bound).
NODE_BOX = 1 << 32


@lru_cache(maxsize=4096)
def node_extent(p: Pattern) -> tuple[int, int]:
    """`attended_extent` of p in the `NODE_BOX` square: (NODE_BOX, NODE_BOX) where p reaches
    its edges (no bound), bounds a few cells loose (the slack at that size)."""
    return attended_extent(p, NODE_BOX, NODE_BOX)


__all__ = ["NODE_BOX", "attended_extent", "envelope", "node_extent"]
