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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

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


def _ints(values: Sequence[int]) -> list[int] | dict[str, list[int]]:
    """Integers for JSON: an arithmetic run of more than two as {"range": [start, stop, step]}."""
    if isinstance(values, range):
        return {"range": [values.start, values.stop, values.step]}
    v = [int(x) for x in values]
    if len(v) > 2 and len({b - a for a, b in zip(v, v[1:])}) == 1 and v[1] > v[0]:
        return {"range": [v[0], v[-1] + 1, v[1] - v[0]]}
    return v


@dataclass(frozen=True)
class CacheEvent:
    kind: str                       # store | active | inactive | evict
    boundary: tuple[int, ...]       # explicit boundary keys (< T)
    classes: Sequence[int]          # interior residues of (j - T) % P (a tuple, or a range)
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

    def record(self) -> dict[str, Any]:
        """The event as fields (`sas inspect --json`'s `event_records`): the keys j it applies to
        (explicit boundary keys below T, and the interior residues (j - T) % P), and its rows
        i as bounds relative to an anchor ("key": j + value; "period": the first key of j's
        period + value; lo None: the end of the sequence), recurring every `repeat` rows, only
        `every` = [p, w] rows with (i - lo) % p < w where given."""
        bound = lambda b: None if b is None else {"anchor": b.anchor, "value": b.value}  # noqa: E731
        return {"kind": self.kind, "boundary_keys": _ints(self.boundary), "T": self.T, "P": self.P,
                "classes": _ints(self.classes),
                "lo": bound(self.lo), "hi": bound(self.hi), "repeat": self.repeat,
                "every": list(self.every) if self.every else None, "text": self.describe()}

    def describe(self) -> str:
        if self.kind == "store":
            rng = "i = j"
        elif self.kind == "evict":
            rng = "end of sequence" if self.lo is None else f"i = {self.lo.text()}"
        elif self.repeat and self.hi.anchor == self.lo.anchor and self.hi.value - self.lo.value == self.repeat:
            rng = f"i >= {self.lo.text()}"          # a range recurring with its own length: every row from lo on
        else:
            rng = f"i in [{self.lo.text()}, {self.hi.text()})"
        rep = f", every {self.repeat} rows" if self.repeat and not rng.startswith("i >=") else ""
        if self.every:
            rep += f", {self.every[1]} row(s) of every {self.every[0]} (inactive between)"
        anchor = "; j0 = first key of the period" if "j0" in rng else ""
        return f"{self.kind:8s} {self.keys_text()}: {rng}{rep}{anchor}"


@dataclass(frozen=True, eq=False)
class _Borders:
    """Per column shape, the borders its events are made of (vectorized over shapes).

    A used shape's `dist[ptr[s]:ptr[s + 1]]` lists its head borders (start, stop of each run
    before D, or of the runs up to D for a column attended forever; a strided run of >= 3
    equal runs at equal gaps is one `every` range: its first start and last stop), then its
    tail borders (the runs inside one period [D, D + Q), forever columns only)."""

    used: np.ndarray
    forever: np.ndarray
    n_head: np.ndarray
    n_tail: np.ndarray
    D: np.ndarray           # D of forever shapes, -1 for the others
    every_p: np.ndarray     # (gap, width) of a strided head, 0 when none
    every_w: np.ndarray
    ptr: np.ndarray
    dist: np.ndarray

    def key(self, s: int) -> tuple:
        every = (int(self.every_p[s]), int(self.every_w[s])) if self.every_p[s] else None
        return (bool(self.forever[s]), int(self.n_head[s]), int(self.n_tail[s]),
                int(self.D[s]) if self.forever[s] else None, every)

    def borders(self, s: int) -> list[int]:
        return [int(x) for x in self.dist[self.ptr[s]:self.ptr[s + 1]]]


def _segment_all_equal(values: np.ndarray, seg: np.ndarray, n: int) -> np.ndarray:
    """Per segment id in [0, n): are all its values equal (True for empty segments); `seg` is
    non-decreasing (each segment's values are contiguous)."""
    out = np.ones(n, dtype=bool)
    if len(values) == 0:
        return out
    new = np.ones(len(seg), dtype=bool)
    new[1:] = seg[1:] != seg[:-1]
    head = np.flatnonzero(new)
    first = values[head][np.cumsum(new) - 1]          # each value's segment's first value
    out[seg[values != first]] = False
    return out


def _borders(cols: ColumnShapes) -> _Borders:
    S = cols.n_shapes
    rs, a, b = cols.run_shape, cols.start, cols.stop
    # A forever boundary column whose last run covers its whole period [D, D + Q) is attended
    # without a gap from that run's start to the end: its periodic part may start there (D' =
    # that start, one tail run [D', D' + Q)). Boundary keys that differ only in where D falls
    # (D = T - j: the keys of a prefix, each attended to the end) then have the same borders and
    # share their events. Interior classes keep their common D (one D for all of them is what
    # lets `_merge_interior` join classes).
    counts = cols.counts
    has = np.flatnonzero(cols.forever[:cols.T] & (counts[:cols.T] > 0))
    last = cols.ptr[has + 1] - 1
    whole = (b[last] == cols.D[has] + cols.Q) & (a[last] <= cols.D[has])
    D_shape = cols.D
    if whole.any():
        D_shape = cols.D.copy()
        D_shape[has[whole]] = a[last[whole]]
        b = b.copy()
        b[last[whole]] = a[last[whole]] + cols.Q
    fv, D = cols.forever[rs], D_shape[rs]
    # head pieces: the runs (clipped to [0, D) for forever columns); tail pieces: the runs in [D, D + Q)
    hb = np.where(fv, np.minimum(b, D), b)
    hk = hb > a
    if hk.all():
        ha, hs = a, rs
    else:
        ha, hb, hs = a[hk], hb[hk], rs[hk]
    tk = fv & (b > D)
    ta, tb, ts = np.maximum(a, D)[tk], b[tk], rs[tk]
    nh = np.bincount(hs, minlength=S)
    nt = np.bincount(ts, minlength=S)
    hptr = np.zeros(S + 1, dtype=np.int64)
    np.cumsum(nh, out=hptr[1:])
    # a strided head: >= 3 pieces of one width at one gap
    every = nh >= 3
    if every.any():
        same = np.flatnonzero(hs[1:] == hs[:-1])
        every &= _segment_all_equal(hb - ha, hs, S) & _segment_all_equal(ha[1:][same] - ha[:-1][same],
                                                                          hs[1:][same], S)
    n_head = np.where(every, 2, 2 * nh) if every.any() else 2 * nh
    n_tail = 2 * nt
    ptr = np.zeros(S + 1, dtype=np.int64)
    np.cumsum(n_head + n_tail, out=ptr[1:])
    # border lists, written in place: per shape its head (a strided head: the first piece's
    # start and the last piece's stop), then its tail
    dist = np.empty(int(ptr[-1]), dtype=np.int64)
    every_p = np.zeros(S, dtype=np.int64)
    every_w = np.zeros(S, dtype=np.int64)
    at = ptr[hs]                              # the k-th head piece of a shape at ptr + 2k
    if len(ha) and int(nh.max()) > 1:
        at = at + 2 * (np.arange(len(ha), dtype=np.int64) - hptr[hs])
    ev = np.flatnonzero(every)
    if len(ev):
        plain = ~every[hs]
        at, pa, pb = at[plain], ha[plain], hb[plain]
        first, last = hptr[ev], hptr[ev + 1] - 1
        dist[ptr[ev]] = ha[first]
        dist[ptr[ev] + 1] = hb[last]
        every_w[ev] = hb[first] - ha[first]
        every_p[ev] = ha[first + 1] - ha[first]
    else:
        pa, pb = ha, hb
    dist[at] = pa
    dist[at + 1] = pb
    if len(ta):
        tptr = np.zeros(S + 1, dtype=np.int64)
        np.cumsum(nt, out=tptr[1:])
        at = ptr[ts] + n_head[ts] + 2 * (np.arange(len(ta), dtype=np.int64) - tptr[ts])
        dist[at] = ta
        dist[at + 1] = tb
    return _Borders(cols.ever_used, cols.forever, n_head, n_tail, np.where(cols.forever, D_shape, -1),
                    every_p, every_w, ptr, dist)


def _pair_codes_uniform(cols: ColumnShapes, bd: _Borders) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """`_pair_codes` when every interior class is used and all have the same key (so as many
    borders, stored one class after the other): the borders as a [P, L] view, compared row by
    row, in int8 (a million classes: a few MB, not a few hundred)."""
    T, P = cols.T, cols.P
    if P < 2 or not bd.used[T:].all():
        return None
    for f in (bd.forever, bd.n_head, bd.n_tail, bd.D, bd.every_p, bd.every_w):
        fs = f[T:T + P]
        if not (fs == fs[0]).all():
            return None
    lc = int(bd.ptr[T + 1] - bd.ptr[T])
    flat = bd.dist[bd.ptr[T]:bd.ptr[T + P]].reshape(P, lc)
    da, db = flat[:-1], flat[1:]
    eq = db == da
    per = (db + 1 == da) & ~eq
    code = eq.view(np.int8) | (per.view(np.int8) << 1)          # [P - 1, L]: 1 key, 2 period, 0 neither
    pair_ok = (code != 0).all(axis=1)
    same_next = pair_ok[:-1] & pair_ok[1:] & (code[:-1] == code[1:]).all(axis=1)
    return pair_ok, same_next, code


def _pair_codes(cols: ColumnShapes, bd: _Borders, r: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, Callable[[int], np.ndarray]]:
    """For consecutive used classes r[k], r[k + 1]: whether they may share events (`pair_ok`),
    whether pairs k and k + 1 agree on every border's anchor (`same_next`), and the anchor
    codes of pair k (one per border: 1 = same distance from the key, 2 = same distance from
    the period start)."""
    uni = _pair_codes_uniform(cols, bd)
    if uni is not None:
        pair_ok, same_next, code = uni
        return pair_ok, same_next, lambda k: code[k]
    T = cols.T
    s = T + r
    same_key = np.ones(len(r) - 1, dtype=bool)
    for f in (bd.forever, bd.n_head, bd.n_tail, bd.D, bd.every_p, bd.every_w):
        fs = f[s]
        same_key &= fs[1:] == fs[:-1]
    ps = bd.ptr[s]                            # first border of each used class
    L = bd.ptr[s + 1] - ps
    pairs = np.flatnonzero(same_key)
    cnt = L[pairs + 1]
    rep = np.repeat(pairs, cnt)
    within = np.arange(int(cnt.sum()), dtype=np.int64) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    ib = ps[rep + 1] + within                 # the second member's borders
    da = bd.dist[ps[rep] + within]
    db = bd.dist[ib]
    code = np.where(db == da, 1, np.where(db + r[rep + 1] - r[rep] == da, 2, 0))
    pair_ok = np.zeros(len(r) - 1, dtype=bool)
    bad = np.bincount(rep[code == 0], minlength=len(r) - 1)
    pair_ok[pairs] = bad[pairs] == 0
    # flat code of each ok pair, at its second member's border positions
    code_at = np.zeros(len(bd.dist), dtype=np.int64)
    code_at[ib] = code
    # consecutive ok pairs with equal codes (they share a member, so have as many borders)
    q = np.flatnonzero(pair_ok[:-1] & pair_ok[1:])
    cq = L[q + 1]
    rq = np.repeat(q, cq)
    wq = np.arange(int(cq.sum()), dtype=np.int64) - np.repeat(np.cumsum(cq) - cq, cq)
    diff = code_at[ps[rq + 1] + wq] != code_at[ps[rq + 2] + wq]
    same_next = np.zeros(max(len(r) - 2, 0), dtype=bool)
    if len(q):
        same_next[q] = np.bincount(rq[diff], minlength=len(r) - 2)[q] == 0
    return pair_ok, same_next, lambda k: code_at[ps[k + 1]:ps[k + 1] + L[k + 1]]


def _merge_interior(cols: ColumnShapes, bd: _Borders) -> list[tuple[Sequence[int], tuple, list[Bound]]]:
    """Interior classes, in order, grouped greedily: a used class joins the group of the used
    class before it when, for every border, all members agree on the border's distance from
    the key (anchor `key`) or on its distance from the period start (anchor `period`)."""
    T = cols.T
    r = np.flatnonzero(bd.used[T:]).astype(np.int64)        # used classes
    if len(r) == 0:
        return []
    pair_ok, same_next, codes_of = _pair_codes(cols, bd, r)
    # run_end[p]: the last pair of the run of equal codes starting at pair p
    idx = np.arange(len(same_next), dtype=np.int64)
    stop_at = np.where(same_next, len(same_next), idx)
    run_end = np.minimum.accumulate(stop_at[::-1])[::-1] if len(same_next) else stop_at
    out: list[tuple[Sequence[int], tuple, list[Bound]]] = []
    i = 0
    while i < len(r):
        si = T + int(r[i])
        key, dist = bd.key(si), bd.borders(si)
        if i + 1 < len(r) and pair_ok[i]:
            j = int(run_end[i]) if i < len(run_end) else i      # last pair of the group
            lo, hi = int(r[i]), int(r[j + 1]) + 1
            # consecutive classes as a range (a million of them for a period as long as the sequence)
            members = range(lo, hi) if hi - lo == j + 2 - i else r[i:j + 2].tolist()
            bounds = [Bound(KEY, d) if c == 1 else Bound(PERIOD, d + lo) for d, c in zip(dist, codes_of(i).tolist())]
            out.append((members, key, bounds))
            i = j + 2
        else:
            out.append(([int(r[i])], key, [Bound(KEY, d) for d in dist]))
            i += 1
    return out


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
    bd = _borders(cols)
    events: list[CacheEvent] = []
    by_key: dict[tuple, list[int]] = {}
    for j in np.flatnonzero(bd.used[:cols.T]).tolist():
        by_key.setdefault((bd.key(j), tuple(bd.borders(j))), []).append(j)
    for (key, dist), keys in by_key.items():
        kw = dict(boundary=tuple(keys), classes=(), T=cols.T, P=cols.P)
        events += _emit(kw, key, [Bound(KEY, d) for d in dist], cols.Q)
    for rs, key, bounds in _merge_interior(cols, bd):
        kw = dict(boundary=(), classes=rs if isinstance(rs, range) else tuple(rs), T=cols.T, P=cols.P)
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
