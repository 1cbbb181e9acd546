"""The prefill tile schedule of any length from its first query blocks and one period.

`tile_runs` classifies every tile of a `length x length` problem: its time and its runs follow
length / block_m (`sas compile --max-len 1G` of a sliding window took 26 s and 4 GB, then
refused). A pattern with a periodic structure (`sas.ir.periodicity.Structure`) repeats its
tiles instead, and the schedule of any length follows from a short prefix:

- diagonal: `M(i + P, j + P) == M(i, j)` for `i, j >= T`. With a tile period
  `Pt = lcm(P, Qv, block_m, block_n)` (`period_m = Pt / block_m` query blocks,
  `period_n = Pt / block_n` key blocks), tile (m, c) has the class of tile
  (m - period_m, c - period_n) whenever that tile's rows and keys are past T: for key blocks
  `c >= fixed = period_n + ceil(T / block_n)`.
- vertical: `M(i + Qv, j) == M(i, j)` for `i >= T` and `i - j >= Dv`. Tile (m, c) has the class
  of tile (m - period_m, c) for key blocks `c < fixed` once row block m - period_m lies past T
  and at least Dv below the last of those keys: for `m >= rows` (below).

So query block m >= rows is query block m - period_m with its key blocks below `fixed` kept and
the rest moved right by `period_n`. Unrolled down to a row r of the last period before `rows`
(`k = (m - r) / period_m` steps): r's key blocks below `fixed`; r's band `[fixed - period_n,
fixed)` moved by `j * period_n` for j = 1 .. k - 1; and r's key blocks from `fixed - period_n`
on moved by `k * period_n` (`sas.runtime.standalone.schedule_rows` does this on the device's
terms, `schedule_counts` counts the tiles in closed form).

The rows past the boundary must be finite for that: every cell (i, j) with i >= T lies left of
`i + U` (U = max(Dh, 1), checked over one period of rows and one horizontal period of keys).
Rows before T may reach every later key (global tokens: `Rect(rows=(0, g))`): past
`max(T, i + Dh)` a row repeats every Qh keys (the horizontal guarantee), so where the tiles of a
stored query block are of one class over a horizontal tile period there, its run is open to the
end (stop `OPEN`, clipped to the length like any run). Patterns without such a description (no
periodic structure, rows past T with cells arbitrarily far right of the diagonal, an early row
whose far tiles alternate, a period whose prefix is longer than the schedule) keep `tile_runs`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import lcm

import numpy as np

from sas.errors import AnalysisLimitError
from sas.ir.line_runs import ROW, line_runs
from sas.ir.periodicity import structure
from sas.ir.tile_runs import TileRuns, tile_runs
from sas.lang.pattern import Pattern

#: rows of the structure's window read to prove that no cell lies far right of the diagonal
#: (the analysis' limit on the rows it reads)
CHECK_ROWS = 1 << 20
#: the stop of a run open to the end of every row (an early row attending every later key)
OPEN = (1 << 31) - 1
#: key blocks of one horizontal tile period read at most to find an early row's far tiles
MAX_TAIL_BLOCKS = 1 << 12


@dataclass(frozen=True, eq=False)
class TilePeriod:
    """The first `rows` query blocks of the unbounded square schedule (`base`, its keys wide
    enough that no run is cut) and the period that derives every later query block (module
    doc)."""

    base: TileRuns
    period_m: int
    period_n: int
    fixed: int

    @property
    def rows(self) -> int:
        return self.base.num_q_blocks

    @property
    def block_m(self) -> int:
        return self.base.block_m

    @property
    def block_n(self) -> int:
        return self.base.block_n


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@lru_cache(maxsize=4096)
def right_bound(pattern: Pattern) -> int | None:
    """U >= 1 with every attended cell (i, j) of a row i >= T at j < i + U, from the periodic
    structure alone; None when the pattern has no such bound (rows past the boundary with cells
    arbitrarily far right of the diagonal) or no periodic structure."""
    st = structure(pattern)
    if not st.periodic or st.T + st.P > CHECK_ROWS:
        return None
    u = max(st.Dh, 1)
    # Rows past T repeat diagonally onto rows T .. T + P - 1 (a cell right of i + U stays right
    # of it); keys past max(T, i + Dh) repeat every Qh: one horizontal period per row decides.
    i = np.arange(st.T, st.T + st.P, dtype=np.int64)
    lo = i + u
    try:
        runs = line_runs(pattern, ROW, i, lo, np.maximum(lo, st.T) + st.Qh)
    except AnalysisLimitError:
        return None
    return None if len(runs) else u


@lru_cache(maxsize=64)
def tile_period(pattern: Pattern, length: int, block_m: int, block_n: int) -> TilePeriod | None:
    """The periodic form of the `length x length` schedule (module doc), or None where the
    pattern has none or its first rows reach `length` (then `tile_runs` is no larger). Kept for
    the launch choice's tile counts and the plan that then takes it (its arrays are not
    written)."""
    st = structure(pattern)
    if not st.periodic:
        return None
    pt = lcm(st.P, st.Qv, block_m, block_n)
    period_m, period_n = pt // block_m, pt // block_n
    fixed = period_n + _ceil(st.T, block_n)
    rows = period_m + max(_ceil(st.T, block_m), _ceil(max(0, st.Dv) + fixed * block_n - 1, block_m))
    if rows * block_m >= length:
        return None
    u = right_bound(pattern)
    if u is None:
        return None
    q_len = rows * block_m
    # from key block `tail` on, a stored query block's tiles repeat every `h` key blocks (the
    # horizontal guarantee: keys past T and past i + Dh), and rows past T have no cell there
    tail = _ceil(max(st.T, q_len - 1 + u), block_n)
    h = lcm(st.Qh, block_n) // block_n
    if h > MAX_TAIL_BLOCKS:
        return None
    base = tile_runs(pattern, q_len, (tail + h) * block_n, block_m, block_n, 0)
    base = _open_tails(base, tail)
    return None if base is None else TilePeriod(base, period_m, period_n, fixed)


def _open_tails(base: TileRuns, tail: int) -> TileRuns | None:
    """`base` with the run of each query block whose tiles from key block `tail` to the end are
    of one class (full or partial) made open to the end (stop OPEN); None where a query block's
    tiles there are of more than one class (they alternate forever: no finite runs)."""
    end = base.num_k_blocks
    arrays = []
    for ptr, runs in ((base.full_ptr, base.full_runs), (base.part_ptr, base.part_runs)):
        covers = (runs[:, 0] <= tail) & (runs[:, 1] == end)        # the whole tail, to the end
        if ((runs[:, 1] > tail) & ~covers).any():                  # part of the tail only
            return None
        runs = runs.copy()
        runs[covers, 1] = OPEN
        arrays += [ptr, runs]
    return TileRuns(base.q_len, base.k_len, 0, base.block_m, base.block_n, *arrays)


__all__ = ["CHECK_ROWS", "MAX_TAIL_BLOCKS", "OPEN", "TilePeriod", "right_bound", "tile_period"]
