"""Slot assignment: which cache slot each key is written to (interval-graph colouring).

Key j occupies its slot from step j to its last use L(j). A slot scheme is valid when no
key is overwritten before its last use; it is minimal when it uses `cache_size` slots.
Closed-form schemes are tried first and verified exactly from the periodic column shapes
(length-independent); when none fits, an optimal greedy colouring is stored as a table.

- `ring`: all stored keys in one ring buffer over their ranks: slot = rank(j) % C.
- `prefix+ring`: keys attended until the end of the sequence (sinks, summary columns) get
  a fixed prefix slot each; every other key goes to a ring of the remaining slots.
- `table`: greedy colouring by start time (optimal for interval graphs), one entry per token,
  vectorized (first-in first-out slot reuse, by pointer jumping).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sas.analysis.columns import ColumnShapes
from sas.analysis.keysets import KeySet, flag_keyset


@dataclass(frozen=True)
class RingScheme:
    keys: KeySet
    C: int
    name: str = "ring"


@dataclass(frozen=True)
class PrefixRingScheme:
    prefix: KeySet        # keys that keep a slot to the end
    F: int                # number of prefix slots (prefix keys < N)
    ring: KeySet
    R: int                # ring slots
    name: str = "prefix+ring"


@dataclass(frozen=True, eq=False)
class TableScheme:
    cache_id: np.ndarray  # per token, -1 when never stored
    C: int
    name: str = "table"


Scheme = RingScheme | PrefixRingScheme | TableScheme


def _divisors(P: int) -> list[int]:
    small = [d for d in range(1, int(P ** 0.5) + 1) if P % d == 0]
    return sorted(set(small + [P // d for d in small]))


def keyset(cols: ColumnShapes, select: np.ndarray) -> KeySet:
    """Keys whose column shape is selected (per shape flags, boundary first)."""
    T, P = cols.T, cols.P
    member = np.asarray(select[T:], dtype=bool)
    # Use the smallest period of the membership itself: a ring over "every 4th key" should
    # read (j // 4), not a table over the pattern's full period.
    for p in _divisors(P):
        if np.array_equal(member.reshape(P // p, p), np.broadcast_to(member[:p], (P // p, p))):
            P, member = p, member[:p]
            break
    return KeySet(T, P, tuple(int(j) for j in np.flatnonzero(select[:T])),
                  tuple(int(r) for r in np.flatnonzero(member)))


def _ring_ok(cols: ColumnShapes, keys: KeySet, C: int, n: int) -> bool:
    """Exact check that slot = rank % C never overwrites a key before its last use."""
    if keys.empty:
        return True
    if C <= 0:
        return False
    # Boundary keys one by one.
    if keys.boundary:
        j = np.array(keys.boundary, dtype=np.int64)
        j = j[j < n]
        nxt = keys.unrank(keys.rank(j) + C)
        live = cols.last_use(j, n)
        if np.any((nxt < n) & (live >= nxt)):
            return False
    # Interior classes, CHUNK_CLASSES at a time: the successor distance depends on the class only.
    hi = min(cols.T + cols.P, n)
    return all(_ring_ok_classes(cols, keys, C, n, np.arange(c0, min(hi, c0 + CHUNK_CLASSES), dtype=np.int64))
               for c0 in range(cols.T, hi, CHUNK_CLASSES))


#: Interior classes checked per pass of `_ring_ok` (its temporaries reused from pass to pass).
CHUNK_CLASSES = 1 << 16


def _ring_ok_classes(cols: ColumnShapes, keys: KeySet, C: int, n: int, j0: np.ndarray) -> bool:
    """`_ring_ok` for the interior classes of the keys j0 (T <= j0 < min(T + P, n))."""
    j0 = j0[keys.contains(j0)]
    delta = keys.unrank(keys.rank(j0) + C) - j0
    near = j0 + delta < n
    j0, delta = j0[near], delta[near]
    shape = j0            # interior keys below T + P are their own class's shape
    forever = cols.forever[shape]
    # Not attended forever: the class's first key lives longest (its column is cut last by the end).
    if np.any(cols.last_d(shape[~forever], n - 1 - j0[~forever]) >= delta[~forever]):
        return False
    # Attended forever: only keys whose successor arrives near the end can survive.
    j0, delta, shape = j0[forever], delta[forever], shape[forever]
    if np.any(j0 + delta < n - cols.Q - cols.D[shape]):
        return False
    # keys j = j0 + k P below n - delta (at most (Q + D) / P + 1 per class)
    count = np.maximum(0, -(-(n - delta - j0) // cols.P))
    k = np.repeat(np.arange(len(j0), dtype=np.int64), count)
    j = j0[k] + cols.P * (np.arange(int(count.sum()), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count))
    return not (j.size and np.any(cols.last_use(j, n) >= j + delta[k]))


def _count_below(keys: KeySet, n: int) -> int:
    return int(keys.count_upto(np.array([n - 1]))[0])


def _smallest_ring(cols: ColumnShapes, keys: KeySet, lo: int, n: int) -> int | None:
    """The smallest ring size >= lo that is valid for `keys` (validity only grows with the
    size: a larger ring puts a key's successor in its slot later); a ring as large as the
    number of keys below n never wraps, so one always exists for lo <= that number."""
    hi = _count_below(keys, n)
    if keys.empty or lo > hi:
        return None if not keys.empty else 0
    lo = max(lo, 1)
    if not _ring_ok(cols, keys, hi, n):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if _ring_ok(cols, keys, mid, n):
            hi = mid
        else:
            lo = mid + 1
    return hi


def padded_scheme(cols: ColumnShapes, C: int, n: int) -> Scheme | None:
    """The closed-form scheme with the fewest slots above C: one ring over every stored key,
    or fixed slots for the keys attended to the end plus a ring for the others, each ring as
    small as is valid (binary search)."""
    stored = cols.ever_used
    everything = keyset(cols, stored)
    best: Scheme | None = None
    size = _smallest_ring(cols, everything, C + 1, n)
    if size is not None:
        best = RingScheme(everything, size)
    prefix = keyset(cols, stored & cols.forever)
    ring = keyset(cols, stored & ~cols.forever)
    F = _count_below(prefix, n)
    if not ring.empty:
        R = _smallest_ring(cols, ring, max(1, C + 1 - F), n)
        if R is not None and (best is None or F + R < best.C):
            best = PrefixRingScheme(prefix, F, ring, R)
    return best


#: A closed form with more slots than the minimal cache (`padded_scheme`, `ring_from_last_use`)
#: replaces a per-token table only while its extra slots stay within 1/PAD_FRACTION of the
#: minimal size, or PAD_SLOTS slots for a small cache: every slot costs a key and a value per
#: head and layer, a table entry a few bytes per token.
PAD_FRACTION = 8
PAD_SLOTS = 64


def padding_ok(minimal: int, size: int) -> bool:
    """Whether a closed form of `size` slots may stand in for a table of `minimal` slots."""
    return size - minimal <= max(minimal // PAD_FRACTION, PAD_SLOTS)


#: Every key, one ring over positions: slot = j % C.
ALL_KEYS = KeySet(0, 1, (), (0,))


def ring_from_last_use(last_use: np.ndarray) -> RingScheme | None:
    """The smallest ring valid for per-token last uses (`last_use[j]`, -1 for keys never
    used), over the used keys when they have a periodic description (`flag_keyset`), else over
    every key; None when no key is used.

    A key j keeps its slot until the ring comes back to it: the ring is valid with C slots when
    fewer than C members of the key set arrive in (j, last_use[j]] for every used key j, so the
    smallest C is that count's maximum plus one (exact, no search)."""
    last_use = np.asarray(last_use, dtype=np.int64)
    used = last_use >= 0
    if not used.any():
        return None
    keys = flag_keyset(used)
    j = np.flatnonzero(used).astype(np.int64)
    if keys is None:                        # every key a member: (j, L(j)] holds L(j) - j
        keys, between = ALL_KEYS, last_use[j] - j
    else:                                   # the members are the used keys (below n)
        count = np.cumsum(used, dtype=np.int64)
        between = count[last_use[j]] - count[j]
    return RingScheme(keys, int(between.max()) + 1)


def scheme_size(scheme: Scheme) -> int:
    """Slots a scheme uses."""
    return scheme.F + scheme.R if isinstance(scheme, PrefixRingScheme) else scheme.C


def choose_scheme(cols: ColumnShapes, C: int, n: int) -> Scheme | None:
    """The first closed-form scheme that is valid with C slots, or None."""
    stored = cols.ever_used
    everything = keyset(cols, stored)
    if _ring_ok(cols, everything, C, n):
        return RingScheme(everything, C)
    prefix = keyset(cols, stored & cols.forever)
    ring = keyset(cols, stored & ~cols.forever)
    F = _count_below(prefix, n)
    R = C - F
    if F <= C and (ring.empty or R > 0) and _ring_ok(cols, ring, R, n):
        return PrefixRingScheme(prefix, F, ring, max(R, 0))
    return None


def greedy_table(last_use: np.ndarray) -> TableScheme:
    """Optimal interval colouring by start time; last_use[j] = -1 for keys never used.

    Key j holds a slot over [j, last_use[j]]. Slots are handed out first-in first-out: the
    first C stored keys (C = the most keys live at once) take slots 0 .. C-1, and the k-th
    stored key after them takes the slot of the k-th key to be released (in release order).
    That key is released in time: when the (C + k)-th key is stored at step t, at most C keys
    are live, so at least k + 1 have been released by t. So every key's slot is that of an
    earlier key (or its own first one), and the slots follow by pointer jumping over those
    links, vectorized (O(n log n) time, O(n) memory; no loop over tokens)."""
    last_use = np.asarray(last_use, dtype=np.int64)
    n = len(last_use)
    slot = np.full(n, -1, dtype=np.int64)
    stored = np.flatnonzero(last_use >= np.arange(n)).astype(np.int64)     # acquires, by start time
    m = len(stored)
    if m == 0:
        return TableScheme(slot, 0)
    ends = last_use[stored]
    # live count after each step: +1 at j, -1 after last_use[j]
    delta = np.zeros(n + 1, dtype=np.int64)
    np.add.at(delta, stored, 1)
    np.add.at(delta, ends + 1, -1)
    C = int(np.cumsum(delta).max())
    # the k-th release (stable by end, then start): the acquire index of the key released k-th
    released = np.argsort(ends, kind="stable")
    link = np.arange(m, dtype=np.int64)
    link[C:] = released[:m - C]
    # follow the links to a root (one of the first C acquires): its index is the slot
    while True:
        nxt = link[link]
        if np.array_equal(nxt, link):
            break
        link = nxt
    slot[stored] = link
    return TableScheme(slot, C)


def cache_ids(scheme: Scheme, n: int) -> np.ndarray:
    """Numeric cache_id for tokens 0..n-1 (used for verification and plots)."""
    j = np.arange(n, dtype=np.int64)
    if isinstance(scheme, TableScheme):
        return scheme.cache_id[:n]
    if isinstance(scheme, RingScheme):
        return np.where(scheme.keys.contains(j), scheme.keys.rank(j) % max(scheme.C, 1), -1)
    pre = scheme.prefix.contains(j)
    ring = scheme.ring.contains(j)
    return np.where(pre, scheme.prefix.rank(j),
                    np.where(ring, scheme.F + scheme.ring.rank(j) % max(scheme.R, 1), -1))
