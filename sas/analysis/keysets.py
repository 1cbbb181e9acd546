"""Periodic key sets: which keys a cache region stores, their ranks, and the inverse.

A `KeySet` is a finite set of boundary keys below T plus every key `j >= T` whose class
`(j - T) % P` is listed. Ranks (the position of a key among the set's keys in token order)
and their inverse have closed forms, available both numerically (numpy, for verification)
and as Python AST expressions (for the synthesized functions).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from sas.analysis.expr import E, lookup, where


#: What `KeySet.unrank` gives for a rank no member has: past every position.
NO_MEMBER = np.iinfo(np.int64).max


@dataclass(frozen=True)
class KeySet:
    T: int
    P: int
    boundary: tuple[int, ...]   # sorted keys < T
    classes: tuple[int, ...]    # sorted residues in [0, P)

    @property
    def nb(self) -> int:
        return len(self.boundary)

    @property
    def k(self) -> int:
        return len(self.classes)

    @property
    def empty(self) -> bool:
        return not self.boundary and not self.classes

    # ---- numeric -----------------------------------------------------------------------
    @functools.cached_property
    def _numeric(self):
        member = np.zeros(self.P, dtype=bool)
        member[list(self.classes)] = True
        idx = np.cumsum(member) - member          # rank of a class inside the period
        cnt_lt = np.concatenate([[0], np.cumsum(member)])[: self.P]  # classes < y
        bmember = np.zeros(max(self.T, 1), dtype=bool)
        bmember[list(self.boundary)] = True
        bidx = np.cumsum(bmember) - bmember
        return member, idx, cnt_lt, bmember, bidx

    def contains(self, j: np.ndarray) -> np.ndarray:
        member, _, _, bmember, _ = self._numeric
        j = np.asarray(j, dtype=np.int64)
        inner = member[np.maximum(j - self.T, 0) % self.P]
        outer = bmember[np.clip(j, 0, max(self.T - 1, 0))]
        return np.where(j < 0, False, np.where(j < self.T, outer, inner))

    def rank(self, j: np.ndarray) -> np.ndarray:
        """Rank of members (undefined for non-members)."""
        _, idx, _, _, bidx = self._numeric
        j = np.asarray(j, dtype=np.int64)
        r = np.maximum(j - self.T, 0)
        inner = self.nb + (r // self.P) * self.k + idx[r % self.P]
        return np.where(j < self.T, bidx[np.clip(j, 0, max(self.T - 1, 0))], inner)

    def unrank(self, rho: np.ndarray) -> np.ndarray:
        """The member of each rank; `NO_MEMBER` (past every position) for ranks past the last
        member of a set without classes (boundary keys only)."""
        rho = np.asarray(rho, dtype=np.int64)
        b = np.array(self.boundary + (0,), dtype=np.int64)
        c = np.array(self.classes + (0,), dtype=np.int64)
        r = np.maximum(rho - self.nb, 0)
        k = max(self.k, 1)
        inner = self.T + (r // k) * self.P + c[r % k] if self.classes else np.full(np.shape(r), NO_MEMBER)
        return np.where(rho < self.nb, b[np.clip(rho, 0, max(self.nb - 1, 0))], inner)

    def count_upto(self, i: np.ndarray) -> np.ndarray:
        """Number of members <= i."""
        _, _, cnt_lt, bmember, _ = self._numeric
        i = np.asarray(i, dtype=np.int64)
        bcum = np.cumsum(bmember)
        y = np.maximum(i - self.T + 1, 0)
        inner = self.nb + (y // self.P) * self.k + cnt_lt[y % self.P]
        outer = np.where(i < 0, 0, bcum[np.clip(i, 0, max(self.T - 1, 0))])
        return np.where(i < self.T, outer, inner)

    # ---- AST ---------------------------------------------------------------------------
    def contains_expr(self, j: E) -> E:
        inner = _class_member(self.classes, self.P, (j - self.T) % self.P) if self.classes else E(False)
        if self.T == 0:
            return j.ge(0) & inner if self.classes else E(False)
        outer = _range_member(self.boundary, self.T, j)
        return where(j.lt(self.T), outer, inner) if self.classes else (j.lt(self.T) & outer)

    def rank_expr(self, j: E) -> E:
        if not self.classes:
            return _boundary_index(self.boundary, self.T, j)
        r = j - self.T
        inner = self.nb + (r // self.P) * self.k + _class_index(self.classes, self.P, r % self.P)
        if not self.boundary:
            return inner
        return where(j.lt(self.T), _boundary_index(self.boundary, self.T, j), inner)

    def rank_mod_expr(self, j: E, C: int) -> E:
        """`rank(j) % C`, written without the rank when C is a whole number of periods."""
        if self.classes and not self.boundary and C % self.k == 0:
            r = j - self.T
            return ((r // self.P) % (C // self.k)) * self.k + _class_index(self.classes, self.P, r % self.P)
        return self.rank_expr(j) % C

    def unrank_expr(self, rho: E) -> E:
        r = rho - self.nb
        inner = E(self.T) + (r // self.k) * self.P + lookup(self.classes, r % self.k) if self.classes else E(-1)
        if not self.boundary:
            return inner
        # a range reads as its first two keys do (the same progression, without a scan of all)
        b = lookup(self.boundary[:2] if _contiguous(self.boundary) else self.boundary, rho)
        return where(rho.lt(self.nb), b, inner)

    def count_upto_expr(self, i: E) -> E:
        y = i - self.T + 1
        cnt = tuple(_count_below(self.classes, self.P).tolist())
        inner = (self.nb + (y // self.P) * self.k + _prefix_count(cnt, self.classes, self.P, y % self.P)
                 if self.classes else E(self.nb))
        if self.T == 0:
            return inner
        bcnt = () if _contiguous(self.boundary) else \
            tuple((_count_below(self.boundary, self.T) + _flags(self.boundary, self.T)).tolist())
        outer = _boundary_count(self.boundary, bcnt, i)
        return where(i.lt(self.T), outer, inner)


#: Most boundary keys and classes `flag_keyset` describes: each becomes a tuple literal in the
#: synthesized functions, which the kernel lowering inlines up to 256 items.
MAX_TERMS = 256
#: Positions `flag_keyset` compares first for each candidate period (the whole rest only for a
#: candidate that passes).
_PROBE = 1 << 12


def flag_keyset(flags: np.ndarray, max_terms: int = MAX_TERMS) -> KeySet | None:
    """The keys j < n with `flags[j]` as a `KeySet` whose synthesized form stays small, or None
    when the flags have no such description (on keys < n; the set claims nothing past them).

    Past a boundary the flags must repeat with a period of at most `max_terms` keys; the
    boundary is either at most `max_terms` keys long (none tried first), or ends where the first
    run of flagged keys ends (keys used up to some point: a range, which the functions test
    without a table). The smallest period of the rest is searched by `_period`, and the boundary
    is then the smallest T from which the flags repeat every P keys."""
    flags = np.asarray(flags, dtype=bool)
    n = len(flags)
    for t0 in _boundary_candidates(flags, max_terms):
        period = _period(flags[t0:], max_terms)
        if period is None or t0 + period > n:
            continue
        differ = np.flatnonzero(flags[:t0] != flags[period:t0 + period])
        T = int(differ[-1]) + 1 if len(differ) else 0
        boundary = tuple(np.flatnonzero(flags[:T]).tolist())
        if len(boundary) > max_terms and not _contiguous(boundary):
            continue
        return KeySet(T, period, boundary, tuple(np.flatnonzero(flags[T:T + period]).tolist()))
    if n <= max_terms:                      # no full period past a boundary: all boundary keys
        return KeySet(n, 1, tuple(np.flatnonzero(flags).tolist()), ())
    return None


def _boundary_candidates(flags: np.ndarray, max_terms: int) -> list[int]:
    """Where the periodic part may start: at the first key, after `max_terms` keys, or after the
    first run of flagged keys when that ends later."""
    out = [0, min(max_terms, len(flags))]
    on = np.flatnonzero(flags)
    if len(on):
        off = np.flatnonzero(~flags[on[0]:])
        end = int(on[0] + off[0]) if len(off) else len(flags)
        if end > out[0]:
            out.append(end)
    return out


def _period(x: np.ndarray, max_period: int) -> int | None:
    """The smallest p <= max_period with x[k + p] == x[k] for every k (1 for a constant x),
    or None."""
    if len(x) == 0 or x.all() or not x.any():
        return 1
    # a period maps the first position of the rarer value to another of the same value
    rare = bool(x.sum() * 2 <= len(x))
    at = np.flatnonzero(x == rare)[:max_period + 1]
    for p in (at[1:] - at[0]).tolist():
        if p > max_period:
            break
        probe = min(len(x) - p, _PROBE)
        if np.array_equal(x[p:p + probe], x[:probe]) and np.array_equal(x[p:], x[:-p]):
            return int(p)
    return None


def _contiguous(members: tuple[int, ...]) -> bool:
    """Whether sorted members form one range (tested as such, without a table)."""
    return bool(members) and members[-1] - members[0] + 1 == len(members)


def _flags(members: tuple[int, ...], size: int) -> np.ndarray:
    """[size] int64: 1 where v is a member, else 0."""
    out = np.zeros(size, dtype=np.int64)
    out[list(members)] = 1
    return out


def _count_below(members: tuple[int, ...], size: int) -> np.ndarray:
    """[size] int64: how many members are < v, for v in 0 .. size-1."""
    flags = _flags(members, size)
    return np.cumsum(flags) - flags


def _ap(values: tuple[int, ...]) -> tuple[int, int] | None:
    """(start, step) when values form an arithmetic progression with positive step."""
    if not values:
        return None
    if len(values) == 1:
        return values[0], 1
    step = values[1] - values[0]
    if step > 0 and all(values[k + 1] - values[k] == step for k in range(len(values) - 1)):
        return values[0], step
    return None


def _class_member(classes: tuple[int, ...], P: int, r: E) -> E:
    if len(classes) == P:
        return E(True)
    if len(classes) == 1:
        return r.eq(classes[0])
    ap = _ap(classes)
    if ap is not None:
        c0, s = ap
        last = classes[-1]
        conds = []
        if c0 > 0:
            conds.append(r.ge(c0))
        if last < P - 1:
            conds.append(r.le(last))
        if s > 1:
            conds.append(((r - c0) % s).eq(0))
        return E(True) if not conds else _and(conds)
    return lookup(tuple(_flags(classes, P).tolist()), r).eq(1)


def _and(conds: list[E]) -> E:
    out = conds[0]
    for c in conds[1:]:
        out = out & c
    return out


def _class_index(classes: tuple[int, ...], P: int, r: E) -> E:
    if len(classes) == P:
        return r
    if len(classes) == 1:
        return E(0)
    ap = _ap(classes)
    if ap is not None:
        c0, s = ap
        return (r - c0) // s
    pos = {c: k for k, c in enumerate(classes)}
    return lookup(tuple(pos.get(c, 0) for c in range(P)), r)


def _prefix_count(cnt: tuple[int, ...], classes: tuple[int, ...], P: int, y: E) -> E:
    if len(classes) == P:
        return y
    if len(classes) == 1:
        return where(y.le(classes[0]), 0, 1)
    ap = _ap(classes)
    if ap is not None:
        c0, s = ap
        last = classes[-1]
        inside = (y - c0 - 1) // s + 1
        return where(y.le(c0), 0, inside if last >= P - 1 else where(y.gt(last), len(classes), inside))
    return lookup(cnt, y)


def _range_member(boundary: tuple[int, ...], T: int, j: E) -> E:
    if not boundary:
        return E(False)
    b0, b1 = boundary[0], boundary[-1] + 1
    if _contiguous(boundary):
        conds = [j.ge(b0)] if b0 > 0 else [j.ge(0)]
        if b1 < T:
            conds.append(j.lt(b1))
        return _and(conds)
    return j.ge(0) & lookup(tuple(_flags(boundary, T).tolist()), j).eq(1)


def _boundary_index(boundary: tuple[int, ...], T: int, j: E) -> E:
    b0 = boundary[0]
    if _contiguous(boundary):
        return j - b0
    pos = {b: k for k, b in enumerate(boundary)}
    return lookup(tuple(pos.get(v, 0) for v in range(T)), j)


def _boundary_count(boundary: tuple[int, ...], bcnt: tuple[int, ...], i: E) -> E:
    if not boundary:
        return E(0)
    b0, b1 = boundary[0], boundary[-1] + 1
    if _contiguous(boundary):
        return where(i.lt(b0), 0, where(i.lt(b1), i + 1 - b0, len(boundary)))
    return where(i.lt(0), 0, lookup(bcnt, i))
