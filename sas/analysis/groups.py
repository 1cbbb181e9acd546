"""Decomposition of a pattern into groups by vertical cuts (paper 5.1).

A vertical cut falls wherever the border of the attended region has a corner, i.e. where
the shape of a key column changes. The column shapes (`ColumnShapes`) already list every
distinct shape, so the cuts are found without drawing the full-length polygon:

- boundary keys (j < T) are cut wherever consecutive columns differ;
- interior keys repeat with period P; inside one period, consecutive classes whose borders
  are translates of each other (same run structure relative to the key) form one group;
- the last keys, whose columns are cut short by the end of the sequence, form the tail.

Each group carries the exact polygon (shapely) of its first occurrence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from shapely import affinity
from shapely.geometry.base import BaseGeometry

from sas.analysis.columns import ColumnShapes
from sas.ir.polygons import Lattice, lattice_geometry
from sas.lang.pattern import Pattern


@dataclass(frozen=True, eq=False)
class Group:
    index: int
    key_start: int
    key_stop: int               # first occurrence: keys [key_start, key_stop)
    repeats: int | None         # the group recurs every `repeats` keys (None: once)
    kind: str                   # boundary | periodic | tail
    polygon: BaseGeometry       # cells of the first occurrence (x = key, y = query)
    #: with a lattice, the polygon covers each attended lattice point's cell (sx x sy)
    lattice: Lattice | None = None
    #: first and last + 1 query row with an attended cell (None: no cell)
    query_bounds: tuple[int, int] | None = None

    @property
    def area(self) -> int:
        """Attended cells of the first occurrence."""
        per = self.lattice.cell_area if self.lattice is not None else 1
        return int(round(self.polygon.area)) // per

    @property
    def n_polygons(self) -> int:
        return len(getattr(self.polygon, "geoms", [self.polygon])) if not self.polygon.is_empty else 0

    def describe(self) -> str:
        rep = f", repeats every {self.repeats} keys" if self.repeats else ""
        lat = f" on a lattice ({self.lattice.describe()})" if self.lattice is not None else ""
        return (f"group {self.index} ({self.kind}): keys [{self.key_start}, {self.key_stop}){rep}; "
                f"{self.n_polygons} polygon(s){lat}, {self.area} cells, query bounds "
                f"{self.query_bounds if self.query_bounds is not None else ()}")


def _profile(cols: ColumnShapes, s: int) -> bytes:
    return np.packbits(cols.on[s]).tobytes() + int(cols.D[s]).to_bytes(8, "little", signed=True)


def _translate(cols: ColumnShapes, a: int, b: int) -> bool:
    """Are columns a and b (adjacent) shaped alike up to a one-row shift of their lower border?"""
    ra, rb = cols.on[a], cols.on[b]
    if not ra.any() and not rb.any():
        return True
    # Same number of runs and same start offsets: only the lower ends move (a straight border).
    ea = np.flatnonzero(np.diff(np.concatenate([[0], ra.astype(np.int8), [0]])))
    eb = np.flatnonzero(np.diff(np.concatenate([[0], rb.astype(np.int8), [0]])))
    if len(ea) != len(eb):
        return False
    if len(ea) == 0:
        return True
    da = ea - eb
    return bool(np.all(da[0::2] == da[0]) and np.all(np.abs(da[1::2] - da[1]) <= 0) and abs(int(da[1]) - int(da[0])) <= 1)


def _runs(cols: ColumnShapes, start: int, stop: int) -> list[tuple[int, int]]:
    out, a = [], start
    for s in range(start + 1, stop + 1):
        if s == stop or not _translate(cols, s - 1, s):
            out.append((a, s))
            a = s
    return out


def decompose(pattern: Pattern, cols: ColumnShapes, n: int, max_groups: int = 64) -> tuple[Group, ...]:
    T, P = cols.T, cols.P
    spans: list[tuple[int, int, int | None, str]] = []
    for a, b in _runs(cols, 0, min(T, n)):
        spans.append((a, b, None, "boundary"))
    if n > T:
        runs = _runs(cols, T, T + P)
        if len(runs) > 8:   # fine striding: every column differs, keep the period whole
            runs = [(T, T + P)]
        for a, b in runs:
            if a < n:
                spans.append((a, min(b, n), P, "periodic"))
        tail = int(cols.last_finite.max()) if not cols.forever.any() else int(cols.D.max()) + 2 * cols.Q
        if n - tail > T:
            spans.append((n - tail, n, None, "tail"))
    if len(spans) > max_groups:
        spans = spans[:max_groups]
    groups = []
    for k, (a, b, rep, kind) in enumerate(spans):
        depth = int(cols.D.max()) + 2 * cols.Q
        rows = np.arange(a, min(n, b + depth), dtype=np.int64)
        keys = np.arange(a, b, dtype=np.int64)
        cells = np.asarray(pattern.evaluate(rows[:, None], keys[None, :]), dtype=bool)
        poly, lat = lattice_geometry(cells)
        if lat is not None:
            lat = lat.shifted(a, a)
        on_rows = np.flatnonzero(cells.any(axis=1))
        bounds = (a + int(on_rows[0]), a + int(on_rows[-1]) + 1) if len(on_rows) else None
        groups.append(Group(k, a, b, rep, kind, affinity.translate(poly, xoff=a, yoff=a), lat, bounds))
    return tuple(groups)
