"""Token lifetimes and the minimal KV-cache size (paper 5.2), without scanning every token.

live(i) = |{j <= i : L(j) >= i}| with L(j) the last query < N attending key j. In the steady
state between the transient at the start and the drain at the end, live(i + P) = live(i) + f,
with f the number of interior column classes attended forever; so the maximum over all i
is reached in the first window or in the last one, and those are all we count.
"""

from __future__ import annotations

from math import lcm

import numpy as np

from sas.analysis.columns import ColumnShapes
from sas.limits import check_host_bytes


#: Keys whose last use is computed per pass.
CHUNK = 1 << 16


def _first_key(cols: ColumnShapes, a: int) -> int:
    """The first key `live_counts` reads one by one for the window from query a: the keys further
    behind (past the boundary) are counted per residue."""
    return max(0, a - (int(cols.D.max()) + 2 * cols.Q + cols.P + 1))


def live_counts(cols: ColumnShapes, n: int, a: int, b: int) -> np.ndarray:
    """live(i) for i in [a, b), exactly, touching O(window + period) keys."""
    T, P, Q = cols.T, cols.P, cols.Q
    lo = _first_key(cols, a)
    # boundary keys below lo, then every key of [lo, b): sorted, distinct
    explicit = np.concatenate([np.arange(min(T, lo)), np.arange(lo, b)]).astype(np.int64)
    # CHUNK keys at a time (last_use's temporaries reused), each key's live range [start, stop]
    starts, stops = [], []
    for c0 in range(0, len(explicit), CHUNK):
        e = explicit[c0:c0 + CHUNK]
        start = np.maximum(e, a)
        stop = np.minimum(cols.last_use(e, n), b - 1)
        keep = stop >= start
        starts.append(start[keep] - a)
        stops.append(stop[keep] - a + 1)
    diff = (np.bincount(np.concatenate(starts), minlength=b - a + 1)
            - np.bincount(np.concatenate(stops), minlength=b - a + 1))
    live = np.cumsum(diff)[:-1]
    if lo > T:
        # Keys in [T, lo) are far behind the window: count them per residue of lcm(P, Q).
        M = lcm(P, Q)
        rho = np.arange(M, dtype=np.int64)
        count = np.maximum(0, (lo - T - rho + M - 1) // M)
        has = count > 0
        rep = T + rho[has] + M * (count[has] - 1)
        Lrep = cols.last_use(rep, n)
        order = np.sort(Lrep)
        cum = np.concatenate([[0], np.cumsum(count[has][np.argsort(Lrep)])])
        # keys with L >= i: total - (# with L < i)
        i = np.arange(a, b, dtype=np.int64)
        below = np.searchsorted(order, i, side="left")
        live = live + (cum[-1] - cum[below])
    return live


def windows(cols: ColumnShapes, n: int) -> list[tuple[int, int]]:
    """The query windows that must be counted to find max_i live(i)."""
    head = cols.T + int(cols.D.max()) + 2 * cols.Q + 2 * cols.P + 1
    tail = int(cols.D.max()) + 2 * cols.Q + 2 * cols.P + 1
    if head + tail >= n:
        return [(0, n)]
    return [(0, head), (n - tail, n)]


#: Host bytes per position of `live_counts` at its peak: the keys read (int64, their live
#: ranges' starts and stops, joined) and the queries counted (measured with tracemalloc: 48
#: bytes a key, the queries' histograms freed by then; 8 a query kept as a margin), plus the
#: temporaries of one pass of `last_use` over up to CHUNK keys.
KEY_BYTES, QUERY_BYTES, PASS_BYTES = 48, 8, 128


def used_within(cols: ColumnShapes, n: int) -> bool:
    """Does any query below n attend any key? (A shape's first key, the shape's index, is
    attended first: later keys of its class only start later.)"""
    s = np.arange(min(cols.n_shapes, n), dtype=np.int64)
    first = cols.first_used[s]
    return bool(np.any((first >= 0) & (s + first < n)))


def count_bytes(cols: ColumnShapes, n: int) -> int:
    """Host bytes `cache_size` takes at its peak: its largest window's (what `check_host_bytes`
    is asked; the windows are counted one after the other)."""
    most = 0
    for a, b in windows(cols, n):
        lo = _first_key(cols, a)
        keys = min(cols.T, lo) + b - lo
        most = max(most, KEY_BYTES * keys + QUERY_BYTES * (b - a) + PASS_BYTES * min(keys, CHUNK))
    return most


def cache_size(cols: ColumnShapes, n: int) -> tuple[int, int]:
    """(minimal cache size, a query position where it is reached); (0, 0) when no query below
    n attends a key. Refused (`KernelError`) where counting the live keys would take more host
    memory than SAS_HOST_TABLE_LIMIT: the windows follow the distance from which the columns
    repeat (a band's length), about the cache size."""
    if not used_within(cols, n):
        return 0, 0
    check_host_bytes(f"counting the live keys query by query up to distance {int(cols.D.max())} (from which the "
                     f"pattern's columns repeat, e.g. a band's length: about its cache size) at max_len={n}",
                     count_bytes(cols, n), "give a smaller max_len, or raise SAS_HOST_TABLE_LIMIT")
    best, where = -1, 0
    for a, b in windows(cols, n):
        live = live_counts(cols, n, a, b)
        k = int(np.argmax(live))
        if live[k] > best:
            best, where = int(live[k]), a + k
    return best, where
