"""Decomposition of a pattern into groups by vertical cuts (paper 5.1).

A vertical cut falls wherever the border of the attended region has a corner, i.e. where
the shape of a key column changes. The column shapes (`ColumnShapes`) already list every
distinct shape, so the cuts are found without drawing the full-length polygon:

- boundary keys (j < T) are cut wherever consecutive columns differ;
- interior keys repeat with period P; inside one period, consecutive classes whose borders
  are translates of each other (same run structure relative to the key) form one group;
- the last keys, whose columns are cut short by the end of the sequence, form the tail.

Each group carries the exact polygon (shapely) of its first occurrence, traced from the
column runs on first use.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from shapely.geometry.base import BaseGeometry

from sas.analysis.columns import ColumnShapes
from sas.errors import AnalysisError
from sas.ir.polygons import Lattice, lattice_polygon, runs_lattice


#: `Group.describe` (and so `Analysis.report`) counts polygons only for groups of at most this
#: many vertical runs of cells; tracing hundreds of thousands of separate polygons (a strided
#: diagonal far from the others: seconds in shapely) tells a reader no more than the run count.
#: `Group.polygon` still draws any group within the runs limit.
DESCRIBE_RUNS = 1 << 16


@dataclass(frozen=True, eq=False)
class Group:
    """Keys [key_start, key_stop) (first occurrence) and their attended cells on the query rows
    [key_start, row_stop). The cells (column runs), their lattice and their exact polygon are
    derived from the column shapes on first use: a group of a long period can hold many cells,
    and the analysis itself never needs them."""

    index: int
    key_start: int
    key_stop: int               # first occurrence: keys [key_start, key_stop)
    repeats: int | None         # the group recurs every `repeats` keys (None: once)
    kind: str                   # boundary | periodic | tail
    columns: ColumnShapes = field(repr=False)
    row_stop: int = 0           # the rows of the first occurrence: [key_start, row_stop)

    def _keys(self) -> tuple[np.ndarray, np.ndarray]:
        keys = np.arange(self.key_start, self.key_stop, dtype=np.int64)
        return keys, self.columns.shape_of(keys)

    @functools.cached_property
    def query_bounds(self) -> tuple[int, int] | None:
        """First and last + 1 query row with an attended cell of the first occurrence (None: no
        cell); computed on first use (one pass over the group's keys)."""
        cols = self.columns
        keys, shapes = self._keys()
        first = cols.next_d(shapes, np.zeros(len(keys), np.int64))
        first_ok = (first >= 0) & (keys + first < self.row_stop)
        if not first_ok.any():
            return None
        last = cols.last_d(shapes, self.row_stop - 1 - keys)
        return int((keys + first)[first_ok].min()), int((keys + last)[last >= 0].max()) + 1

    @functools.cached_property
    def cells(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(key, first row, stop row) of every vertical run of attended cells (raises
        `AnalysisError` past the runs limit)."""
        keys, shapes = self._keys()
        r = self.columns.window_runs(shapes, np.zeros(len(keys), np.int64), self.row_stop - keys)
        x = keys[r.line]
        return x, x + r.start, x + r.stop

    @functools.cached_property
    def lattice(self) -> Lattice | None:
        """With a lattice, the polygon covers each attended lattice point's cell (sx x sy)."""
        return runs_lattice(*self.cells)

    @functools.cached_property
    def polygon(self) -> BaseGeometry:
        """The cells of the first occurrence (x = key, y = query), on the lattice if any."""
        return lattice_polygon(*self.cells, self.lattice)

    @functools.cached_property
    def area(self) -> int:
        """Attended cells of the first occurrence."""
        keys, shapes = self._keys()
        return int(self.columns.count_below(shapes, self.row_stop - keys).sum())

    @property
    def n_polygons(self) -> int:
        return len(getattr(self.polygon, "geoms", [self.polygon])) if not self.polygon.is_empty else 0

    def record(self) -> dict[str, Any]:
        """The group as fields (`sas inspect --json`'s `group_records`): query_bounds are the
        first and one past the last row attending its first occurrence, within the rows
        [key_start, row_stop) the analysis draws (a key attended forever is attended past them)."""
        qb = self.query_bounds
        return {"index": self.index, "kind": self.kind, "key_start": self.key_start, "key_stop": self.key_stop,
                "repeats": self.repeats, "cells": self.area, "rows_drawn": [self.key_start, self.row_stop],
                "query_bounds": list(qb) if qb is not None else None, "text": self.describe()}

    def describe(self) -> str:
        rep = f", repeats every {self.repeats} keys" if self.repeats else ""
        try:
            lat = f" on a lattice ({self.lattice.describe()})" if self.lattice is not None else ""
            runs = len(self.cells[0])
            shape = (f"{self.n_polygons} polygon(s){lat}" if runs <= DESCRIBE_RUNS else
                     f"{runs} vertical runs of cells{lat} (polygons not traced for the description: more than "
                     f"{DESCRIBE_RUNS} runs; Group.polygon traces them)")
        except AnalysisError:
            shape = "polygons not drawn (more runs of cells than the runs limit)"
        qb = self.query_bounds
        edge = (f" (the rows drawn, [{self.key_start}, {self.row_stop}), end there: its keys may be attended "
                f"past them)" if qb is not None and qb[1] >= self.row_stop and self.kind != "tail" else "")
        return (f"group {self.index} ({self.kind}): keys [{self.key_start}, {self.key_stop}){rep}; "
                f"{shape}, {self.area} cells, query bounds {qb if qb is not None else ()}{edge}")


def _translates(cols: ColumnShapes, shapes: np.ndarray) -> np.ndarray:
    """For consecutive shapes (shapes[k], shapes[k + 1]): are the two columns shaped alike up to
    a one-row shift of their lower border (same number of runs, starts all moved by one amount,
    stops by one amount, the two amounts at most one apart), over the window of D + 2Q rows?"""
    m = len(shapes)
    if m < 2:
        return np.zeros(0, dtype=bool)
    W = int(cols.D.max()) + 2 * cols.Q
    r = cols.window_runs(shapes, np.zeros(m, np.int64), np.full(m, W, np.int64))
    cnt, ptr = r.counts(), r.ptr
    out = (cnt[:-1] == 0) & (cnt[1:] == 0)
    pairs = np.flatnonzero((cnt[:-1] == cnt[1:]) & (cnt[:-1] > 0))
    c = cnt[pairs]
    rep = np.repeat(pairs, c)
    within = np.arange(int(c.sum()), dtype=np.int64) - np.repeat(np.cumsum(c) - c, c)
    ia, ib = ptr[rep] + within, ptr[rep + 1] + within
    ds = r.start[ia] - r.start[ib]
    de = r.stop[ia] - r.stop[ib]
    ds0, de0 = r.start[ptr[pairs]] - r.start[ptr[pairs + 1]], r.stop[ptr[pairs]] - r.stop[ptr[pairs + 1]]
    at = np.searchsorted(pairs, rep)
    bad = np.bincount(at[(ds != ds0[at]) | (de != de0[at])], minlength=len(pairs))
    out[pairs] = (bad == 0) & (np.abs(de0 - ds0) <= 1)
    return out


#: Shapes compared per pass when cutting a period into groups (a pass stops the search once
#: it has found more cuts than a period keeps).
CUT_CHUNK = 1 << 16


def _runs(cols: ColumnShapes, start: int, stop: int, max_runs: int | None = None) -> list[tuple[int, int]] | None:
    """Maximal ranges of consecutive shapes in [start, stop) that are translates of each other;
    None as soon as there are more than `max_runs` of them (read CUT_CHUNK shapes at a time)."""
    if stop <= start:
        return []
    cuts: list[int] = []
    for c0 in range(start, stop, CUT_CHUNK):
        c1 = min(stop, c0 + CUT_CHUNK + 1)              # one shape of overlap: the pair across
        ok = _translates(cols, np.arange(c0, c1, dtype=np.int64))
        cuts += (c0 + 1 + np.flatnonzero(~ok)).tolist()
        if max_runs is not None and len(cuts) + 1 > max_runs:
            return None
    edges = [start, *cuts, stop]
    return list(zip(edges[:-1], edges[1:]))


def decompose(cols: ColumnShapes, n: int, max_groups: int = 64) -> tuple[Group, ...]:
    T, P = cols.T, cols.P
    spans: list[tuple[int, int, int | None, str]] = []
    for a, b in _runs(cols, 0, min(T, n)):
        spans.append((a, b, None, "boundary"))
    if n > T:
        runs = _runs(cols, T, T + P, max_runs=8)
        if runs is None:    # fine striding: every column differs, keep the period whole
            runs = [(T, T + P)]
        for a, b in runs:
            if a < n:
                spans.append((a, min(b, n), P, "periodic"))
        tail = int(cols.last_finite.max()) if not cols.forever.any() else int(cols.D.max()) + 2 * cols.Q
        if n - tail > T:
            spans.append((n - tail, n, None, "tail"))
    if len(spans) > max_groups:
        spans = spans[:max_groups]
    depth = int(cols.D.max()) + 2 * cols.Q
    groups = []
    for k, (a, b, rep, kind) in enumerate(spans):
        groups.append(Group(k, a, b, rep, kind, cols, min(n, b + depth)))
    return tuple(groups)
