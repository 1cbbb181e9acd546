"""Key columns of a pattern, described once per period.

Column j of the mask is the set of queries that attend key j. Using the guarantees of
`sas.ir.periodicity.Structure`, every column is one of finitely many shapes:

- boundary keys `j < T`: one shape each;
- interior keys `j >= T`: the shape depends only on `(j - T) % P`.

A shape is `s(d) = M(j + d, j)` for d >= 0 (d = query distance below the key); it is
periodic with period Q for `d >= D`, so the analyzer stores it for `d < D + 2Q` only. All
questions about a column at any sequence length (is the key ever used, its last use before
N, is it attended "forever") are answered from these arrays, never by scanning N tokens.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from sas.errors import AnalysisError
from sas.ir.periodicity import Structure
from sas.lang.pattern import Pattern

#: Most cells the length-independent analysis evaluates in one window (~256 MiB of int64).
WINDOW_LIMIT = 1 << 25


def check_window(pattern: Pattern, rows: int, cols: int, st: Structure) -> None:
    """Refuse, before allocating, a window of rows x cols cells larger than WINDOW_LIMIT."""
    if rows * cols > WINDOW_LIMIT:
        raise AnalysisError(
            f"the periodic description of {pattern!r} (boundary T={st.T}, period P={st.P}, vertical "
            f"period {st.Qv} from distance {st.Dv}) needs a window of {rows} x {cols} = {rows * cols} "
            f"cells, more than the limit {WINDOW_LIMIT}: its offsets, sizes or strides are too large "
            f"for the length-independent analysis (give a max_len no larger than needed, or use "
            f"smaller parameters)")


@dataclass(frozen=True, eq=False)
class ColumnShapes:
    """Column shapes for boundary keys (rows 0..T-1) and interior classes (rows T..T+P-1)."""

    T: int
    P: int
    Q: int
    D: np.ndarray        # per shape: periodic for d >= D
    on: np.ndarray       # [T + P, W] bool, s(d) for d < W (W >= max(D) + 2Q)
    last_upto: np.ndarray  # [T + P, W] int, last d' <= d with s(d'), -1 if none

    @property
    def n_shapes(self) -> int:
        return self.T + self.P

    def shape_of(self, j: np.ndarray) -> np.ndarray:
        j = np.asarray(j, dtype=np.int64)
        return np.where(j < self.T, j, self.T + (j - self.T) % self.P)

    @functools.cached_property
    def ever_used(self) -> np.ndarray:
        """Per shape: does the column hold any attended cell at all (infinite length)."""
        return self.on.any(axis=1)

    @functools.cached_property
    def forever(self) -> np.ndarray:
        """Per shape: is the key attended again and again until the end of any sequence."""
        W = self.on.shape[1]
        d = np.arange(W)[None, :]
        tail = (d >= self.D[:, None]) & (d < self.D[:, None] + self.Q)
        return (self.on & tail).any(axis=1)

    @functools.cached_property
    def last_finite(self) -> np.ndarray:
        """Per shape: last attended distance for columns that are not `forever` (-1 if none)."""
        return self.last_upto[:, -1]

    def last_d(self, shape: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Last attended distance d <= x (x >= 0) in each column shape, -1 if none."""
        shape = np.asarray(shape, dtype=np.int64)
        x = np.asarray(x, dtype=np.int64)
        W = self.on.shape[1]
        D = self.D[shape]
        Q = self.Q
        far = x >= W
        xr = np.where(far, D + Q + (x - D) % Q, np.minimum(x, W - 1))
        ld = self.last_upto[shape, xr]
        shift = np.where(far & (ld >= D), x - xr, 0)
        return np.where(x < 0, -1, ld + shift)

    def next_d(self, shape: np.ndarray, x: np.ndarray) -> np.ndarray:
        """First attended distance d >= x in each column shape (x >= 0), -1 if none."""
        shape = np.asarray(shape, dtype=np.int64)
        x = np.asarray(x, dtype=np.int64)
        out = np.full(np.broadcast(shape, x).shape, -1, dtype=np.int64)
        shape, x = np.broadcast_arrays(shape, x)
        W = self.on.shape[1]
        for k in np.ndindex(shape.shape):
            s, xx = int(shape[k]), int(x[k])
            D = int(self.D[s])
            base = 0
            if xx >= D + self.Q:
                base = ((xx - D) // self.Q - 1) * self.Q
                xx -= base
            hits = np.flatnonzero(self.on[s, xx:W])
            out[k] = -1 if hits.size == 0 else base + xx + int(hits[0])
        return out

    def last_use(self, j: np.ndarray, n: int) -> np.ndarray:
        """Last query < n attending key j (j < n), -1 when no query in [j, n) attends it."""
        j = np.asarray(j, dtype=np.int64)
        ld = self.last_d(self.shape_of(j), n - 1 - j)
        return np.where(ld >= 0, j + ld, -1)


def column_shapes(pattern: Pattern, st: Structure) -> ColumnShapes:
    """Evaluate the oracle on the few cells that determine every column shape."""
    T, P, Q = st.T, st.P, st.Qv
    check_window(pattern, T + P, max(T, st.Dv) + 2 * Q, st)
    keys = np.concatenate([np.arange(T), T + np.arange(P)]).astype(np.int64)
    D = np.concatenate([np.maximum(T - np.arange(T), st.Dv), np.full(P, st.Dv)]).astype(np.int64)
    W = int(D.max()) + 2 * Q
    d = np.arange(W, dtype=np.int64)
    on = np.asarray(pattern.evaluate(keys[:, None] + d[None, :], keys[:, None]), dtype=bool)
    idx = np.where(on, d[None, :], -1)
    last_upto = np.maximum.accumulate(idx, axis=1)
    return ColumnShapes(T, P, Q, D, on, last_upto)


def upper_triangle_clear(pattern: Pattern, st: Structure) -> tuple[int, int] | None:
    """Return a cell (i, j) with j > i that the pattern attends, or None if it is causal."""
    rows = st.T + st.P
    cols = max(st.T, rows + st.Dh) + st.Qh + 1
    check_window(pattern, rows, cols, st)
    i = np.arange(rows, dtype=np.int64)[:, None]
    j = np.arange(cols, dtype=np.int64)[None, :]
    bad = np.asarray(pattern.evaluate(i, j), dtype=bool) & (j > i)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        return int(r), int(c)
    return None
