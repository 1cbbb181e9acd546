"""Cache events from the borders of column groups, and the event-based simulator (Algorithm 1).

Events are length-independent. Each names a set of keys (boundary keys below T, and/or
interior classes `(j - T) % P`) and a range of queries written relative to an anchor:
`key` (the key's own position j, a diagonal border) or `period` (the first key of the
key's period, `j0 = j - (j - T) % P`, a horizontal border such as a block end).

- `store`    at i = j: the key is written to its slot when it is produced;
- `active`   for i in [lo, hi): queries attend it (upper and lower borders of a polygon);
- `inactive` for i in [lo, hi): it stays cached but is masked out (inner borders);
- `evict`    at i = lo: its slot is free again (`end of sequence` when it is kept to the end).

A range with `repeat=Q` recurs every Q rows until the end (strided columns). Consecutive
interior classes whose borders coincide under one of the two anchors share their events,
so a block-local pattern has 3 events, not 3 per key.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from sas.analysis.columns import ColumnShapes

EMPTY, INACTIVE, ACTIVE = 0, 1, 2
KEY, PERIOD = "key", "period"


@dataclass(frozen=True)
class Bound:
    anchor: str    # key | period
    value: int

    def at(self, j: int, T: int, P: int) -> int:
        if self.anchor == KEY or j < T:
            return j + self.value
        return j - (j - T) % P + self.value

    def text(self) -> str:
        base = "j" if self.anchor == KEY else "j0"
        return base if self.value == 0 else f"{base} {'+' if self.value > 0 else '-'} {abs(self.value)}"


@dataclass(frozen=True)
class CacheEvent:
    kind: str                       # store | active | inactive | evict
    boundary: tuple[int, ...]       # explicit boundary keys (< T)
    classes: tuple[int, ...]        # interior residues of (j - T) % P
    T: int
    P: int
    lo: Bound | None                # None for an eviction at the end of the sequence
    hi: Bound | None = None
    repeat: int | None = None       # the range recurs every `repeat` rows
    every: tuple[int, int] | None = None   # (p, w): only rows with (i - lo) % p < w, gaps inactive

    def keys_text(self) -> str:
        parts = []
        b = self.boundary
        if b:
            parts.append(f"j in [{b[0]}, {b[-1] + 1})" if len(b) == b[-1] + 1 - b[0] else f"j in {list(b)}")
        if self.classes:
            c = self.classes
            if len(c) == self.P:
                parts.append(f"j >= {self.T}")
            elif len(c) == c[-1] + 1 - c[0]:
                parts.append(f"j >= {self.T}, (j - {self.T}) % {self.P} in [{c[0]}, {c[-1] + 1})")
            elif len(c) > 2 and len({b - a for a, b in zip(c, c[1:])}) == 1:
                parts.append(f"j >= {self.T}, (j - {self.T}) % {self.P} in range({c[0]}, {c[-1] + 1}, {c[1] - c[0]})")
            else:
                parts.append(f"j >= {self.T}, (j - {self.T}) % {self.P} in {list(c)}")
        return " or ".join(parts)

    def describe(self) -> str:
        if self.kind == "store":
            rng = "i = j"
        elif self.kind == "evict":
            rng = "end of sequence" if self.lo is None else f"i = {self.lo.text()}"
        else:
            rng = f"i in [{self.lo.text()}, {self.hi.text()})"
        rep = f", every {self.repeat} rows" if self.repeat else ""
        if self.every:
            rep += f", {self.every[1]} row(s) of every {self.every[0]} (inactive between)"
        anchor = "; j0 = first key of the period" if "j0" in rng else ""
        return f"{self.kind:8s} {self.keys_text()}: {rng}{rep}{anchor}"


def _edges(row: np.ndarray, start: int, stop: int) -> list[int]:
    seg = row[start:stop].astype(np.int8)
    return [start + int(e) for e in np.flatnonzero(np.diff(np.concatenate([[0], seg, [0]])))]


def _shape(cols: ColumnShapes, s: int) -> tuple[tuple, list[int]]:
    """(structure key, border distances) of column shape s."""
    forever = bool(cols.forever[s])
    D = int(cols.D[s])
    head = _edges(cols.on[s], 0, D if forever else cols.on.shape[1])
    tail = _edges(cols.on[s], D, D + cols.Q) if forever else []
    every = None
    starts, ends = head[0::2], head[1::2]
    if len(starts) >= 3:
        widths = {b - a for a, b in zip(starts, ends)}
        gaps = {b - a for a, b in zip(starts, starts[1:])}
        if len(widths) == 1 and len(gaps) == 1:   # a strided run: one event, not one per row
            every = (gaps.pop(), widths.pop())
            head = [starts[0], ends[-1]]
    return (forever, len(head), len(tail), D if forever else None, every), head + tail


def _merge_interior(cols: ColumnShapes) -> list[tuple[list[int], tuple, list[Bound]]]:
    """Consecutive interior classes whose borders agree under a common anchor per border."""
    out: list[tuple[list[int], tuple, list[set[Bound]]]] = []
    for r in range(cols.P):
        s = cols.T + r
        if not cols.on[s].any():
            continue
        key, dist = _shape(cols, s)
        cands = [{Bound(KEY, d), Bound(PERIOD, d + r)} for d in dist]
        if out and out[-1][1] == key:
            merged = [a & b for a, b in zip(out[-1][2], cands)]
            if all(merged):
                out[-1][0].append(r)
                out[-1] = (out[-1][0], key, merged)
                continue
        out.append(([r], key, cands))
    return [(rs, key, [min(c, key=lambda b: b.anchor != KEY) for c in cs]) for rs, key, cs in out]


def _emit(kw: dict, key: tuple, bounds: list[Bound], Q: int) -> list[CacheEvent]:
    forever, n_head, n_tail, D, every = key
    head, tail = bounds[:n_head], bounds[n_head:]
    ev = [CacheEvent("store", lo=Bound(KEY, 0), **kw)]
    prev = Bound(KEY, 0)
    for a, b in zip(head[0::2], head[1::2]):
        if a != prev:
            ev.append(CacheEvent("inactive", lo=prev, hi=a, **kw))
        ev.append(CacheEvent("active", lo=a, hi=b, every=every, **kw))
        prev = b
    if not forever:
        ev.append(CacheEvent("evict", lo=prev, **kw))
        return ev
    prev_t = Bound(KEY, D)
    for a, b in zip(tail[0::2], tail[1::2]):
        if a != prev_t:
            ev.append(CacheEvent("inactive", lo=prev_t, hi=a, repeat=Q, **kw))
        ev.append(CacheEvent("active", lo=a, hi=b, repeat=Q, **kw))
        prev_t = b
    if prev_t != Bound(KEY, D + Q) and prev_t.value != D + Q:
        ev.append(CacheEvent("inactive", lo=prev_t, hi=Bound(KEY, D + Q), repeat=Q, **kw))
    ev.append(CacheEvent("evict", lo=None, **kw))
    return ev


def derive_events(cols: ColumnShapes) -> tuple[CacheEvent, ...]:
    """Events of every group of column shapes with the same borders."""
    events: list[CacheEvent] = []
    by_key: dict[tuple, list[int]] = {}
    for j in range(cols.T):
        if cols.on[j].any():
            key, dist = _shape(cols, j)
            by_key.setdefault((key, tuple(dist)), []).append(j)
    for (key, dist), keys in by_key.items():
        kw = dict(boundary=tuple(keys), classes=(), T=cols.T, P=cols.P)
        events += _emit(kw, key, [Bound(KEY, d) for d in dist], cols.Q)
    for rs, key, bounds in _merge_interior(cols):
        kw = dict(boundary=(), classes=tuple(rs), T=cols.T, P=cols.P)
        events += _emit(kw, key, bounds, cols.Q)
    return tuple(events)


def _members(ev: CacheEvent, hi: int) -> list[int]:
    out = [k for k in ev.boundary if k < hi]
    if ev.classes:
        for base in range(ev.T, hi, ev.P):
            out += [base + c for c in ev.classes if base + c < hi]
    return out


def simulate(events: tuple[CacheEvent, ...], cache_id: np.ndarray, n: int,
             q0: int, q1: int, cache_size: int) -> np.ndarray:
    """KV-cache trace for queries [q0, q1): state[slot, query - q0] in {EMPTY, INACTIVE, ACTIVE}.

    Algorithm 1: each event instance (query position, kind, key) enters a priority queue keyed
    by its query position; the instances of one position form a batch that updates the cache
    before that query's trace column is recorded.
    """
    order = {"store": 0, "evict": 1, "inactive": 2, "active": 3}
    queue: list[tuple[int, int, int, int]] = []   # (query, order, key, end)
    for ev in events:
        for j in _members(ev, min(q1, n)):
            if ev.kind == "store":
                queue.append((j, 0, j, j + 1))
            elif ev.kind == "evict":
                at = n if ev.lo is None else ev.lo.at(j, ev.T, ev.P)
                queue.append((at, 1, j, at))
            else:
                lo, hi = ev.lo.at(j, ev.T, ev.P), ev.hi.at(j, ev.T, ev.P)
                if ev.every:   # expand the strided run into its rows
                    p, w = ev.every
                    for a in range(lo, hi, p):
                        if a < q1 and a + w > q0:
                            queue.append((a, order[ev.kind], j, min(a + w, hi)))
                    continue
                step = ev.repeat or n
                while lo < q1:
                    if hi > q0:
                        queue.append((lo, order[ev.kind], j, hi))
                    if not ev.repeat:
                        break
                    lo, hi = lo + step, hi + step
    heapq.heapify(queue)
    state = np.zeros((cache_size, q1 - q0), dtype=np.int8)
    cached: dict[int, tuple[int, int]] = {}   # key -> (state, until)
    q = 0
    while q < q1:
        while queue and queue[0][0] <= q:      # one batch: every event at this position
            _, kind, key, end = heapq.heappop(queue)
            if kind == 0:
                cached[key] = (INACTIVE, n)
            elif kind == 1:
                cached.pop(key, None)
            elif key in cached:
                cached[key] = (ACTIVE if kind == 3 else INACTIVE, end)
        if q >= q0:
            for key, (st, until) in cached.items():
                s = int(cache_id[key])
                if 0 <= s < cache_size:
                    state[s, q - q0] = st if q < until else INACTIVE
        q += 1
    return state
