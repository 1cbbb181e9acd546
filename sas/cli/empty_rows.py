"""Queries that attend no key: counted exactly, cheaply, for `sas inspect`'s warning.

A query row without a key has no softmax to take: the kernels return 0 for it, which is
rarely what a pattern's author meant (paper Table 1's strided block-local pattern leaves
three queries in four without a key). `empty_rows` counts them among the first `max_len`
queries of a causal pattern.

With a periodic structure (`sas.ir.periodicity.Structure`) the answer repeats: write
L = lcm(P, Qv). For a query i >= T + Dv + L, the keys of row i + L are the keys j <= i - Dv of
row i (vertical periodicity, applied L / Qv times) and the keys of row i in (i - Dv - L, i]
shifted by L (diagonal periodicity, applied L / P times); together they cover row i, so row
i + L is empty exactly when row i is. The oracle is evaluated on the rows before
T + Dv + 2L only, in blocks of bounded size; every later row is counted from one period.
Without a known period (or when that prefix is longer than `ROW_LIMIT` rows) the oracle is
evaluated row block by row block up to `ROW_LIMIT` queries, and the result says how many
queries it covers.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import lcm

import numpy as np

from sas.ir.periodicity import Structure
from sas.lang.pattern import Pattern

__all__ = ["EmptyRows", "empty_rows", "ROW_LIMIT"]

#: Most query rows evaluated with the oracle (a row i costs i + 1 cells).
ROW_LIMIT = 1 << 14
#: Most cells of one evaluated block.
BLOCK_CELLS = 1 << 22


@dataclass(frozen=True)
class EmptyRows:
    """Queries among the first `checked` (of `max_len`) that attend no key."""

    max_len: int
    #: queries counted: `max_len`, or fewer when the count is not exact
    checked: int
    #: how many of them attend no key
    count: int
    #: the first query that attends no key (None when none does)
    first: int | None
    #: in the steady state, from query `steady_from` on: `per_period` empty queries in every `period`
    period: int | None = None
    per_period: int | None = None
    steady_from: int | None = None

    @property
    def exact(self) -> bool:
        return self.checked == self.max_len

    def report(self) -> dict[str, int | bool | None]:
        return {"count": self.count, "checked_queries": self.checked, "exact": self.exact, "first": self.first,
                "period": self.period, "per_period": self.per_period, "steady_from": self.steady_from}

    def describe(self) -> str:
        """One sentence, for the warning (empty when every query attends a key)."""
        if not self.count:
            return ""
        of = f"the first {self.checked}" if self.exact else f"the first {self.checked} checked (of {self.max_len})"
        text = (f"the pattern leaves {self.count} of {of} queries without any key (their attention output is 0), "
                f"e.g. query {self.first}")
        if self.period is not None and self.per_period:
            since = f" from query {self.steady_from} on" if self.steady_from else ""
            text += f"; {self.per_period} in every {self.period} queries{since}"
        return text


def _row_has_key(pattern: Pattern, start: int, stop: int) -> np.ndarray:
    """Does query i attend a key j <= i, for i in [start, stop)? Blocks of <= BLOCK_CELLS cells."""
    out = np.zeros(stop - start, dtype=bool)
    step = max(1, BLOCK_CELLS // max(1, stop))   # a block's rows read keys 0 .. stop - 1 at most
    r0 = start
    while r0 < stop:
        r1 = min(stop, r0 + step)
        rows = np.arange(r0, r1, dtype=np.int64)[:, None]
        cols = np.arange(r1, dtype=np.int64)[None, :]
        hit = np.asarray(pattern.evaluate(rows, cols), dtype=bool) & (cols <= rows)
        out[r0 - start:r1 - start] = hit.any(axis=1)
        r0 = r1
    return out


def _smallest_period(flags: np.ndarray) -> int:
    """The smallest d dividing len(flags) with flags cyclically invariant under a shift by d."""
    n = len(flags)
    for d in range(1, n + 1):
        if n % d == 0 and np.array_equal(flags, np.roll(flags, d)):
            return d
    return n


def empty_rows(pattern: Pattern, max_len: int, structure: Structure | None = None) -> EmptyRows:
    """Count the queries in [0, max_len) of a causal `pattern` that attend no key.

    `structure` is the pattern's periodic structure (`Analysis.structure`); without one, or
    when it is not periodic, the oracle is evaluated on at most `ROW_LIMIT` rows.
    """
    n = int(max_len)
    if structure is not None and structure.periodic:
        period = lcm(structure.P, structure.Qv)
        steady = structure.T + structure.Dv + period
        if min(n, steady + period) <= ROW_LIMIT:
            return _periodic(pattern, n, period, steady)
    checked = min(n, ROW_LIMIT)
    empty = ~_row_has_key(pattern, 0, checked)
    return EmptyRows(n, checked, int(empty.sum()), int(np.argmax(empty)) if empty.any() else None)


def _periodic(pattern: Pattern, n: int, period: int, steady: int) -> EmptyRows:
    """Rows [0, steady + period) from the oracle, the rest from the period block."""
    prefix = min(n, steady + period)
    empty = ~_row_has_key(pattern, 0, prefix)
    count, first = int(empty.sum()), (int(np.argmax(empty)) if empty.any() else None)
    if prefix < steady + period:
        return EmptyRows(n, n, count, first)
    block = empty[steady:steady + period]             # rows steady .. steady + period - 1
    rest = n - prefix                                 # rows repeating `block` from steady + period on
    count += (rest // period) * int(block.sum()) + int(block[:rest % period].sum())
    d = _smallest_period(block)
    start = steady   # the earliest row from which the flags repeat every d rows
    while start > 0 and empty[start - 1] == empty[start - 1 + d]:
        start -= 1
    return EmptyRows(n, n, count, first, d, int(empty[start:start + d].sum()), start)
