"""Cache events from the borders of each column group, and the event-based simulator (Algorithm 1).

Events are length-independent: each names a set of keys (boundary keys, or interior classes
repeating with period P) and a range of query distances d = i - j relative to each key:

- `store`   at d = 0: the key is written to its slot when it is produced;
- `active`  for d in [lo, hi): queries attend it (lower/upper borders of a polygon);
- `inactive` for d in [lo, hi): it stays cached but is masked out (inner borders);
- `evict`   at d = lo: its slot is free again (hi = None: kept to the end of the sequence).

A range with `repeat=Q` recurs every Q rows for ever (strided columns).
The simulator turns events into a KV-cache trace for a window of queries, processing
events from a priority queue in batches of the same query position.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from sas.analysis.columns import ColumnShapes

EMPTY, INACTIVE, ACTIVE = 0, 1, 2


@dataclass(frozen=True)
class CacheEvent:
    kind: str                       # store | active | inactive | evict
    keys: str                       # human readable key set, e.g. "j >= 32, (j - 32) % 1 == 0"
    boundary: tuple[int, ...]       # explicit boundary keys (< T)
    classes: tuple[int, ...]        # interior residues of (j - T) % P
    T: int
    P: int
    lo: int
    hi: int | None                  # None: until the end of the sequence
    repeat: int | None = None       # the range recurs every `repeat` rows

    def describe(self) -> str:
        rng = f"d={self.lo}" if self.kind in ("store", "evict") else f"d in [{self.lo}, {self.hi})"
        if self.kind == "evict" and self.hi is None:
            rng = "end of sequence"
        rep = f" every {self.repeat}" if self.repeat else ""
        return f"{self.kind:8s} {self.keys}: {rng}{rep}"


def _runs(row: np.ndarray, start: int, stop: int) -> list[tuple[int, int]]:
    seg = row[start:stop].astype(np.int8)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], seg, [0]])))
    return [(start + int(a), start + int(b)) for a, b in zip(edges[::2], edges[1::2])]


def _signature(cols: ColumnShapes, s: int) -> tuple:
    D, Q, row = int(cols.D[s]), cols.Q, cols.on[s]
    forever = bool(cols.forever[s])
    head = _runs(row, 0, D)
    tail = _runs(row, D, D + Q) if forever else []
    return (D if forever else None, tuple(head), tuple(tail), forever)


def _keys_text(boundary: tuple[int, ...], classes: tuple[int, ...], T: int, P: int) -> str:
    parts = []
    if boundary:
        b = boundary
        parts.append(f"j in [{b[0]}, {b[-1] + 1})" if len(b) == b[-1] + 1 - b[0] else f"j in {list(b)}")
    if classes:
        if len(classes) == P:
            parts.append(f"j >= {T}")
        else:
            parts.append(f"j >= {T} with (j - {T}) % {P} in {list(classes)}")
    return " or ".join(parts)


def derive_events(cols: ColumnShapes) -> tuple[CacheEvent, ...]:
    """Group column shapes with identical borders and emit their events."""
    groups: dict[tuple, tuple[list[int], list[int]]] = {}
    for s in range(cols.n_shapes):
        if not cols.on[s].any():
            continue
        sig = _signature(cols, s)
        b, c = groups.setdefault(sig, ([], []))
        (b if s < cols.T else c).append(s if s < cols.T else s - cols.T)
    events: list[CacheEvent] = []
    for (D, head, tail, forever), (b, c) in groups.items():
        kw = dict(keys=_keys_text(tuple(b), tuple(c), cols.T, cols.P), boundary=tuple(b),
                  classes=tuple(c), T=cols.T, P=cols.P)
        events.append(CacheEvent("store", lo=0, hi=1, **kw))
        runs = list(head)
        prev = 0
        for lo, hi in runs:
            if lo > prev:
                events.append(CacheEvent("inactive", lo=prev, hi=lo, **kw))
            events.append(CacheEvent("active", lo=lo, hi=hi, **kw))
            prev = hi
        if forever:
            prev_t = D
            for lo, hi in tail:
                if lo > prev_t:
                    events.append(CacheEvent("inactive", lo=prev_t, hi=lo, repeat=cols.Q, **kw))
                events.append(CacheEvent("active", lo=lo, hi=hi, repeat=cols.Q, **kw))
                prev_t = hi
            if prev_t < D + cols.Q:
                events.append(CacheEvent("inactive", lo=prev_t, hi=D + cols.Q, repeat=cols.Q, **kw))
            events.append(CacheEvent("evict", lo=D, hi=None, **kw))
        else:
            events.append(CacheEvent("evict", lo=prev, hi=prev + 1, **kw))
    return tuple(events)


def _members(ev: CacheEvent, lo: int, hi: int) -> np.ndarray:
    keys = [k for k in ev.boundary if lo <= k < hi]
    out = np.array(keys, dtype=np.int64)
    if ev.classes:
        start = max(lo, ev.T)
        base = np.arange(start - (start - ev.T) % ev.P, hi, ev.P, dtype=np.int64)
        inner = (base[:, None] + np.array(ev.classes)[None, :]).ravel()
        out = np.concatenate([out, inner[(inner >= start) & (inner < hi)]])
    return np.sort(out)


def simulate(events: tuple[CacheEvent, ...], cache_id: np.ndarray, n: int,
             q0: int, q1: int, cache_size: int) -> np.ndarray:
    """KV-cache trace for queries [q0, q1): state[slot, query - q0] in {EMPTY, INACTIVE, ACTIVE}.

    Algorithm 1: every event instance (key, query position, kind) goes into a priority queue
    keyed by its query position; events of the same position form one batch that updates the
    cache state before the trace column of that query is recorded.
    """
    queue: list[tuple[int, int, int]] = []   # (query, order, key) ; order: store<inactive<active<evict
    order = {"store": 0, "inactive": 1, "active": 2, "evict": 3}
    for ev in events:
        for j in _members(ev, 0, q1):
            j = int(j)
            if j >= n:
                continue
            lo, hi = ev.lo, ev.hi
            if ev.kind in ("store",):
                starts = [j]
            elif ev.kind == "evict":
                starts = [n if hi is None else j + lo]
            elif ev.repeat:
                first = j + lo
                if first < q0:
                    first += ((q0 - first) // ev.repeat) * ev.repeat
                starts = list(range(first, q1, ev.repeat))
            else:
                starts = [j + lo]
            for st in starts:
                if st >= q1:
                    continue
                length = 1 if ev.kind in ("store", "evict") else (hi - lo)
                if st + length <= q0 and ev.kind != "store":
                    continue
                heapq.heappush(queue, (st, order[ev.kind], j, length))
    state = np.zeros((cache_size, q1 - q0), dtype=np.int8)
    slot_state: dict[int, int] = {}
    pending_off: list[tuple[int, int]] = []
    while queue:
        q = queue[0][0]
        batch = []
        while queue and queue[0][0] == q:
            batch.append(heapq.heappop(queue))
        while pending_off and pending_off[0][0] <= q:
            _, key = heapq.heappop(pending_off)
            if key in slot_state and slot_state[key] == ACTIVE:
                slot_state[key] = INACTIVE
        for _, kind, key, length in batch:
            if kind == 0:
                slot_state[key] = INACTIVE
            elif kind == 3:
                slot_state.pop(key, None)
            elif key in slot_state:
                slot_state[key] = ACTIVE if kind == 2 else INACTIVE
                if kind == 2:
                    heapq.heappush(pending_off, (q + length, key))
        nxt = queue[0][0] if queue else q1
        for t in range(max(q, q0), min(nxt, q1)):
            while pending_off and pending_off[0][0] <= t:
                _, key = heapq.heappop(pending_off)
                if key in slot_state and slot_state[key] == ACTIVE:
                    slot_state[key] = INACTIVE
            for key, st in slot_state.items():
                s = int(cache_id[key])
                if 0 <= s < cache_size and key <= t:
                    state[s, t - q0] = max(state[s, t - q0], st) if st == ACTIVE else max(state[s, t - q0], st)
    return state
