"""Polygon IR (shapely): the attended cells of a mask window as exact rectilinear polygons.

Only windows of one period or so are ever turned into polygons (one group, or a plot); the
length-independent description lives in `sas.ir.periodicity`. Polygons are built from
vertical runs of cells (a column's attended queries, `runs_polygon`) by tracing the boundary,
so their cost follows the boundary, not the number of cells or of runs.

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


def mask_runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, y0, y1) of the vertical runs of on-cells of a boolean mask (x = key j = column,
    y = query i = row; cells [y0, y1) of column x), sorted by column then row."""
    m = np.asarray(mask, dtype=bool)
    padded = np.zeros((m.shape[1], m.shape[0] + 2), dtype=np.int8)
    padded[:, 1:-1] = m.T
    x, y = np.nonzero(np.diff(padded, axis=1))
    return x[0::2].astype(np.int64), y[0::2].astype(np.int64), y[1::2].astype(np.int64)


def mask_polygon(mask: np.ndarray) -> BaseGeometry:
    """Union of the on-cells of a boolean mask (x = key j, y = query i) as shapely geometry."""
    return runs_polygon(*mask_runs(mask))


# Directions of boundary edges: +x, +y, -x, -y (a left turn adds 1 modulo 4).
_DX = np.array([1, 0, -1, 0], dtype=np.int64)
_DY = np.array([0, 1, 0, -1], dtype=np.int64)


def _boundary_edges(x: np.ndarray, y0: np.ndarray, y1: np.ndarray):
    """Directed unit-free edges of the boundary of the cells (x, [y0, y1)), the region on the
    left of each edge: (start x, start y, direction, length). Vertical edges are split at
    every run end of the two columns beside them, so every corner is an edge end."""
    n = len(x)
    # horizontal: the top of each run (y0, region above: +x) and its bottom (y1, region below: -x)
    hx = np.concatenate([x, x + 1])
    hy = np.concatenate([y0, y1])
    hd = np.concatenate([np.zeros(n, np.int64), np.full(n, 2, np.int64)])
    # vertical, at the line X between columns X - 1 (left) and X (right): coverage events of
    # the left column (weight 1) and of the right one (weight 2), swept along y
    X = np.concatenate([x + 1, x + 1, x, x])
    Y = np.concatenate([y0, y1, y0, y1])
    W = np.concatenate([np.ones(n, np.int64), -np.ones(n, np.int64), np.full(n, 2, np.int64), np.full(n, -2, np.int64)])
    o = np.argsort(_point_ids(X, Y), kind="stable")
    X, Y, W = X[o], Y[o], W[o]
    cover = np.cumsum(W)
    last = np.ones(len(X), dtype=bool)
    last[:-1] = (X[1:] != X[:-1]) | (Y[1:] != Y[:-1])
    X, Y, cover = X[last], Y[last], cover[last]
    seg = (X[1:] == X[:-1]) & ((cover[:-1] == 1) | (cover[:-1] == 2))
    vx, ya, yb, c = X[:-1][seg], Y[:-1][seg], Y[1:][seg], cover[:-1][seg]
    left = c == 1       # region on the left of the line (x < X): travel +y
    sx = np.concatenate([hx, vx])
    sy = np.concatenate([hy, np.where(left, ya, yb)])
    d = np.concatenate([hd, np.where(left, 1, 3)])
    length = np.concatenate([np.ones(2 * n, np.int64), yb - ya])
    return sx, sy, d, length


def _point_ids(px: np.ndarray, py: np.ndarray) -> np.ndarray:
    """Ids equal for equal points and ordered like (x, y) (int64)."""
    xspan = int(px.max()) - int(px.min()) + 1
    yspan = int(py.max()) - int(py.min()) + 1
    if xspan * yspan < (1 << 62):
        return (px - px.min()) * yspan + (py - py.min())
    ux, ix = np.unique(px, return_inverse=True)
    uy, iy = np.unique(py, return_inverse=True)
    return ix.reshape(-1) * len(uy) + iy.reshape(-1)


def _cycles(nxt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(leader, steps to the cycle's end) of every element of a permutation, by pointer
    jumping: the leader is the smallest element of the cycle; the leader has the most steps."""
    n = len(nxt)
    label = np.arange(n, dtype=np.int64)
    p = nxt.copy()
    rounds = max(1, int(np.ceil(np.log2(max(n, 2)))) + 1)
    for _ in range(rounds):
        new = np.minimum(label, label[p])
        if np.array_equal(new, label):   # constant along every orbit: the cycle minimum
            break
        label = new
        p = p[p]
    terminal = nxt == label                      # the element before the leader
    succ = np.where(terminal, np.arange(n, dtype=np.int64), nxt)
    dist = np.where(terminal, 0, 1).astype(np.int64)
    for _ in range(rounds):
        if np.array_equal(succ[succ], succ):
            break
        dist = dist + dist[succ]
        succ = succ[succ]
    return label, dist


def runs_polygon(x: np.ndarray, y0: np.ndarray, y1: np.ndarray) -> BaseGeometry:
    """The union of the cells `[x, x + 1] x [y0, y1]` of vertical runs (sorted by x, then y0;
    disjoint and not touching within a column) as an exact shapely Polygon or MultiPolygon.

    The boundary is traced, not unioned: directed boundary edges (region on the left) are
    linked into rings (at a corner where two cells touch diagonally, the left turn: the two
    cells' rings stay apart, as OGC validity wants), rings turning counter-clockwise are
    shells and the others holes, each hole goes to the smallest shell around it. Cost
    O(boundary log boundary), against one union of a box per run."""
    x, y0, y1 = (np.asarray(v, dtype=np.int64) for v in (x, y0, y1))
    if len(x) == 0:
        return shapely.Polygon()
    sx, sy, d, length = _boundary_edges(x, y0, y1)
    ex, ey = sx + _DX[d] * length, sy + _DY[d] * length
    start_id = _point_ids(np.concatenate([sx, ex]), np.concatenate([sy, ey]))
    sid, eid = start_id[:len(sx)], start_id[len(sx):]
    order = np.argsort(sid, kind="stable")       # outgoing edges by start point
    first = np.searchsorted(sid[order], eid, side="left")
    cand = order[first]
    two = (first + 1 < len(order)) & (sid[order[np.minimum(first + 1, len(order) - 1)]] == eid)
    other = order[np.minimum(first + 1, len(order) - 1)]
    nxt = np.where(two & (d[cand] != (d + 1) % 4), other, cand)
    leader, steps = _cycles(nxt)
    ring_order = np.lexsort((-steps, leader))
    lead = leader[ring_order]
    # the previous edge in the same ring (cyclically) decides whether a start point is a corner
    is_first = np.ones(len(lead), dtype=bool)
    is_first[1:] = lead[1:] != lead[:-1]
    starts = np.flatnonzero(is_first)
    ends = np.append(starts[1:], len(lead)) - 1
    prev = np.arange(len(lead)) - 1
    prev[starts] = ends
    dd = d[ring_order]
    corner = dd != dd[prev]
    e = ring_order[corner]
    ring = lead[corner]
    px, py = sx[e].astype(float), sy[e].astype(float)
    # shoelace per ring (positive: counter-clockwise, a shell)
    rfirst = np.flatnonzero(np.concatenate([[True], ring[1:] != ring[:-1]]))
    rnext = np.arange(len(ring)) + 1
    rlast = np.append(rfirst[1:], len(ring)) - 1
    rnext[rlast] = rfirst
    area2 = np.add.reduceat(px * py[rnext] - px[rnext] * py, rfirst)
    shell = area2 > 0
    ring_id = np.repeat(np.arange(len(rfirst)), np.diff(np.append(rfirst, len(ring))))
    rings = shapely.linearrings(np.stack([px, py], axis=1), indices=ring_id)
    shells = np.flatnonzero(shell)
    holes = np.flatnonzero(~shell)
    owner = np.zeros(len(holes), dtype=np.int64)
    if len(holes) and len(shells) > 1:
        # a test point in each hole: the centre of the cell right of its first edge
        he = e[rfirst[holes]]
        cx = sx[he] + 0.5 * _DX[d[he]] + 0.5 * _DY[d[he]]
        cy = sy[he] + 0.5 * _DY[d[he]] - 0.5 * _DX[d[he]]
        shell_polys = shapely.polygons(rings[shells])
        tree = shapely.STRtree(shell_polys)
        hit_hole, hit_shell = tree.query(shapely.points(cx, cy), predicate="within")
        areas = area2[shells][hit_shell]
        best = np.lexsort((areas, hit_hole))
        firsts = np.flatnonzero(np.concatenate([[True], hit_hole[best][1:] != hit_hole[best][:-1]]))
        owner[hit_hole[best][firsts]] = hit_shell[best][firsts]
    # rings ordered by polygon: each shell, then its holes
    poly_of = np.concatenate([np.arange(len(shells)), owner])
    members = np.concatenate([shells, holes])
    kind = np.concatenate([np.zeros(len(shells), np.int64), np.ones(len(holes), np.int64)])
    o = np.lexsort((kind, poly_of))
    polys = shapely.polygons(rings[members[o]], indices=poly_of[o])
    out = polys[0] if len(polys) == 1 else shapely.multipolygons(polys)
    # Where cells touch diagonally and the left turn still leaves one ring through the corner
    # twice (a hole touching its shell or another hole there), let GEOS split the ring.
    if np.any(two & (leader[cand] == leader[other])):
        out = shapely.make_valid(out)
        if out.geom_type == "GeometryCollection":
            out = shapely.union_all([g for g in out.geoms if g.geom_type in ("Polygon", "MultiPolygon")])
    return out


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


def _distinct(a: np.ndarray) -> np.ndarray:
    """Sorted distinct values (without a sort when `a` is sorted already)."""
    if len(a) > 1 and np.all(a[1:] >= a[:-1]):
        return a[np.concatenate([[True], a[1:] != a[:-1]])]
    return np.unique(a)


def _axis_lattice(idx: np.ndarray) -> tuple[int, int]:
    """(step, first) of the coarsest arithmetic progression holding every index."""
    first = int(idx[0])
    step = int(np.gcd.reduce(idx - first)) if len(idx) > 1 else 1
    return max(step, 1), first


def runs_lattice(x: np.ndarray, y0: np.ndarray, y1: np.ndarray) -> Lattice | None:
    """The coarsest axis lattice holding every cell of the runs (x, [y0, y1)), else the
    coarsest diagonal one (None: the unit lattice, or no cell)."""
    if len(x) == 0:
        return None
    long = bool(np.any(y1 - y0 > 1))      # a run of two cells or more: no lattice along y
    sy, first_row = (1, int(y0.min())) if long else _axis_lattice(_distinct(y0))
    sx, first_col = _axis_lattice(_distinct(x))
    if sx > 1 or sy > 1:
        return Lattice(sx, sy, first_col, first_row)
    if long:
        return None
    sd, d0 = _axis_lattice(_distinct(y0 - x))
    return Lattice(sd=sd, d0=d0) if sd > 1 else None


def _cells_to_runs(u: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Single cells (column u, row w) -> vertical runs (u, w0, w1)."""
    o = np.lexsort((w, u))
    u, w = u[o], w[o]
    new = np.ones(len(u), dtype=bool)
    new[1:] = (u[1:] != u[:-1]) | (w[1:] != w[:-1] + 1)
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(u)) - 1
    return u[first], w[first], w[last] + 1


def lattice_polygon(x: np.ndarray, y0: np.ndarray, y1: np.ndarray, lat: Lattice | None) -> BaseGeometry:
    """The cells of the runs (x, [y0, y1)) as a polygon drawn on the lattice `lat` (which must
    hold every cell; `runs_lattice`): each attended lattice point owns its cell (an `sx x sy`
    box, or a parallelogram of area `sd` spanning `sd` diagonals), so the area is cells x
    `cell_area`; without a lattice, `runs_polygon(x, y0, y1)`."""
    x, y0, y1 = (np.asarray(v, dtype=np.int64) for v in (x, y0, y1))
    if lat is None:
        return runs_polygon(x, y0, y1)
    if lat.sd == 1:
        u = (x - lat.x0) // lat.sx
        if lat.sy == 1:
            sub = (u, y0 - lat.y0, y1 - lat.y0)
        else:
            sub = _cells_to_runs(u, (y0 - lat.y0) // lat.sy)
        return affinity.affine_transform(runs_polygon(*sub), [lat.sx, 0, 0, lat.sy, lat.x0, lat.y0])
    # diagonal lattice: cell (i, j) -> (w = (i - j - d0) / sd, u = j), drawn on the (u, w) grid;
    # back: x = u, y = u + sd * w + d0 (a shear of determinant sd)
    sub = _cells_to_runs(x, (y0 - x - lat.d0) // lat.sd)
    return affinity.affine_transform(runs_polygon(*sub), [1, 0, 1, lat.sd, 0, lat.d0])


def runs_geometry(x: np.ndarray, y0: np.ndarray, y1: np.ndarray) -> tuple[BaseGeometry, Lattice | None]:
    """(`lattice_polygon`, lattice) of the cells of the runs (x, [y0, y1))."""
    lat = runs_lattice(np.asarray(x, dtype=np.int64), np.asarray(y0, dtype=np.int64), np.asarray(y1, dtype=np.int64))
    return lattice_polygon(x, y0, y1, lat), lat


def mask_lattice(mask: np.ndarray) -> Lattice | None:
    """`runs_lattice` of the on-cells of a boolean mask."""
    return runs_lattice(*mask_runs(mask))


def lattice_geometry(mask: np.ndarray) -> tuple[BaseGeometry, Lattice | None]:
    """`runs_geometry` of the on-cells of a boolean mask."""
    return runs_geometry(*mask_runs(mask))


def corner_xs(geom: BaseGeometry) -> list[int]:
    xs: set[int] = set()
    for poly in getattr(geom, "geoms", [geom]):
        if poly.is_empty:
            continue
        for ring in [poly.exterior, *poly.interiors]:
            xs.update(int(round(x)) for x, _ in ring.coords)
    return sorted(xs)
