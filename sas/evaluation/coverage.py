"""Queries a pattern leaves without a single key, read off the exact oracle mask.

A row of `pattern.to_mask(n)` with no True cell is a query that attends nothing; paper
Table 1's strided block-local pattern leaves three queries in four so. Its output is
defined (zero, docs/semantics.md) but carries no information, so `sas eval` warns about it.
A `Dynamic` component counts as its whole region here (the mask the oracle draws).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from sas.lang.pattern import Pattern


@dataclass(frozen=True)
class EmptyRows:
    length: int
    count: int
    first: int | None          # the first query without keys

    def warning(self, name: str) -> str | None:
        if not self.count:
            return None
        return (f"{name}: {self.count} of {self.length} queries ({100.0 * self.count / self.length:.1f}%) attend no "
                f"key at length {self.length} (the first is query {self.first}); their attention output is zero")


@lru_cache(maxsize=64)
def empty_rows(pattern: Pattern, n: int) -> EmptyRows:
    """The queries `0..n-1` whose mask row is empty."""
    empty = np.flatnonzero(~np.asarray(pattern.to_mask(n)).any(axis=1))
    return EmptyRows(n, int(empty.size), int(empty[0]) if empty.size else None)


__all__ = ["EmptyRows", "empty_rows"]
