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

The rows of the unbounded problem must be finite for that: every cell lies left of `i + U`
(U = max(Dh, 1), checked over one period of rows and one horizontal period of keys). Patterns
without such a description (no periodic structure, cells arbitrarily far right of the
diagonal, a period whose prefix is longer than the schedule) keep `tile_runs`.
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
    """U >= 1 with every attended cell (i, j) at j < i + U, from the periodic structure alone;
    None when the pattern has no such bound (cells arbitrarily far right of the diagonal) or no
    periodic structure."""
    st = structure(pattern)
    if not st.periodic or st.T + st.P > CHECK_ROWS:
        return None
    u = max(st.Dh, 1)
    # Rows past T repeat diagonally onto rows T .. T + P - 1 (a cell right of i + U stays right
    # of it); keys past max(T, i + Dh) repeat every Qh: one horizontal period per row decides.
    i = np.arange(st.T + st.P, dtype=np.int64)
    lo = i + u
    try:
        runs = line_runs(pattern, ROW, i, lo, np.maximum(lo, st.T) + st.Qh)
    except AnalysisLimitError:
        return None
    return None if len(runs) else u


def tile_period(pattern: Pattern, length: int, block_m: int, block_n: int) -> TilePeriod | None:
    """The periodic form of the `length x length` schedule (module doc), or None where the
    pattern has none or its first rows reach `length` (then `tile_runs` is no larger)."""
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
    k_len = _ceil(q_len + u, block_n) * block_n        # every cell of the rows: j < q_len - 1 + u
    base = tile_runs(pattern, q_len, k_len, block_m, block_n, 0)
    return TilePeriod(base, period_m, period_n, fixed)


__all__ = ["CHECK_ROWS", "TilePeriod", "right_bound", "tile_period"]
