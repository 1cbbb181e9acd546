"""Split a pattern with a Dynamic component into what is static and what is selected at run time.

For a pattern `P` holding one Dynamic component `D` (possibly at several places of the tree):

- `static`  = `P` with `D` replaced by the empty pattern: cells attended whatever is selected;
- `full`    = `P` with `D` replaced by the whole plane: every cell the selection may use
              (the same mask as `P.to_mask`, the oracle);
- `region`  = `full * ~static`: the cells only the dynamic selection can turn on. Key `j` is a
              *candidate* from the first query `i` with `region(i, j)` on.

`P` must be monotone in `D` (no `~` above a Dynamic), causal, and its region non-empty.
The region's column structure (`sas.analysis.columns`) gives, without any sequence length,
the last query that can use each key through the region (`region_last_use`) and, when every
region column is finite, the most candidates that can be alive at once (`capacity`):
`Dynamic(budget=...)` may not exceed it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from sas.analysis.columns import ColumnShapes, column_shapes, upper_triangle_clear
from sas.analysis.liveness import used_within
from sas.errors import NotYetSupportedError, PatternError
from sas.dynamic.fusion import analyze_fusion
from sas.dynamic.trace import ScoreGraph, trace_score
from sas.ir.periodicity import structure
from sas.lang.pattern import MAX_INDEX, And, Not, Or, Pattern, Spread
from sas.lang.primitives import Dynamic, Rect
from sas.limits import check_host_bytes

#: Longest max_len for which per-token schedules (candidate spans, the run-time region tables)
#: are built: 16M tokens, 128 MiB per int64 table.
SCHEDULE_LIMIT = 1 << 24
FOREVER = np.iinfo(np.int64).max // 4   # region_last_use of a key the region uses until any length
NEVER = -1

_EVERYTHING = Rect()
_NOTHING = Not(Rect())


def substitute(p: Pattern, target: Dynamic, by: Pattern) -> Pattern:
    """`p` with every occurrence of the Dynamic `target` replaced by `by` (the empty or the whole
    plane), folding the constants away so that the parts print as the user wrote them."""
    if isinstance(p, Dynamic):
        return by if p == target else p
    if isinstance(p, (Or, And)):
        # `_NOTHING` is the identity of a sum and absorbs a product; `_EVERYTHING` the reverse.
        unit, zero = (_NOTHING, _EVERYTHING) if isinstance(p, Or) else (_EVERYTHING, _NOTHING)
        terms = [t for t in (substitute(t, target, by) for t in p.terms) if t != unit]
        if zero in terms:
            return zero
        if not terms:
            return unit
        return terms[0] if len(terms) == 1 else type(p)(*terms)
    if isinstance(p, Spread):
        u, l = substitute(p.unit, target, by), substitute(p.layout, target, by)
        if _NOTHING in (u, l):
            return _NOTHING
        # Keep the block size: the substituted unit may have another box.
        return Spread(u, l, None if u.extent() == p.shape else p.shape)
    if isinstance(p, Not):
        return Not(substitute(p.a, target, by))
    return p


def _check_monotone(p: Pattern, negated: bool = False) -> None:
    if isinstance(p, Dynamic):
        if negated:
            raise PatternError(
                f"{p!r} appears under '~' (NOT): the dynamic selection must only add cells, so a Dynamic "
                f"cannot be negated; write the static part explicitly instead")
        return
    for c in p.children():
        _check_monotone(c, negated ^ isinstance(p, Not))


@dataclass(frozen=True, eq=False)
class DynamicPlan:
    """A pattern split into its static part and its dynamic region, with the traced score."""

    pattern: Pattern
    dynamic: Dynamic
    static: Pattern
    full: Pattern
    region: Pattern
    score: ScoreGraph
    capacity: int | None          # most candidates alive at once; None = grows with the length
    columns: ColumnShapes | None  # region column shapes (None: no periodic description)
    max_len: int | None
    _last_table: np.ndarray | None = None   # region last use per key, non-periodic regions only
    #: most candidates the region holds at once (plus those entering next) within max_len, when
    #: that is less than the Dynamic's budget: the budget is clamped to it (never evicting
    #: either way, so nothing changes but the pool size)
    budget_cap: int | None = None
    #: parameters larger than max_len were clamped: the split is exact on positions < max_len only
    clamped: bool = False

    @property
    def budget(self) -> int:
        """The budget in effect: the Dynamic's, clamped to what the region can hold (budget_cap)."""
        return self.dynamic.budget if self.budget_cap is None else min(self.dynamic.budget, self.budget_cap)

    def candidate_span(self, n: int, keys: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per key j < n (`keys`, default all of them): the first query whose region row holds it
        and the last one (clipped to n); both -1 for a key that is never a candidate before n.
        Given keys of a region with a periodic description cost nothing per other key."""
        j = np.arange(n, dtype=np.int64) if keys is None else np.asarray(keys, dtype=np.int64)
        if self.columns is not None:
            c = self.columns
            s = c.shape_of(j)
            used = c.ever_used[s]
            first = np.where(used, j + c.first_used[s], NEVER)
        else:
            m = self.region.to_mask(n)
            rows = np.arange(n)[:, None]
            used = m.any(axis=0)
            first = np.where(used, np.where(m, rows, n).min(axis=0), NEVER)[j]
        last = self.region_last_use(j)
        first = np.where(first >= n, NEVER, first)
        last = np.where(first < 0, NEVER, np.minimum(last, n))
        return first, last

    def table_rows(self) -> tuple[int, int] | None:
        """(rows, period) of the region schedule in periodic form: key j >= rows has key
        j - period's first and last region query moved by the period, and the keys entering at a
        query q >= rows are those entering at q - period moved by it (every such key past the
        columns' boundary T: rows = T + P + the latest first use). None without a periodic
        description."""
        c = self.columns
        if c is None:
            return None
        used = c.ever_used
        latest = int(c.first_used[used].max()) if used.any() else 0
        return c.T + c.P + latest, c.P

    @property
    def keeps_forever(self) -> bool:
        """Some key stays a candidate until the end of any sequence (True without a periodic
        description: not known otherwise)."""
        c = self.columns
        return c is None or bool((c.forever & c.ever_used).any())

    def window_spans(self, n: int) -> tuple[np.ndarray, np.ndarray, int] | None:
        """(first, last, upto): the spans (`candidate_span(n, keys)`) of the keys of a window
        that holds the steady state, and the last query that sees keys of the window only; past
        it, where no key stays forever, the candidates alive at a query repeat every period.
        None without a periodic description or where the window reaches n."""
        c, rows = self.columns, self.table_rows()
        if c is None:
            return None
        # a key alive at query q (or entering at q + 1) lies in [q - lmax, q + 1]: past
        # T + lmax every such key is past the boundary, and the count repeats every P queries
        lmax = int(c.last_finite[c.ever_used].max(initial=0))
        window = rows[0] + lmax + 2 * rows[1] + 2
        if window >= n:
            return None
        first, last = self.candidate_span(n, np.arange(window, dtype=np.int64))
        return first, last, window - 2

    def _window_most(self, n: int) -> tuple[int, bool] | None:
        """(count, exact): the most candidates at once among the queries of the steady window
        (`window_spans`), exact for length n where no key stays a candidate forever, else a
        lower bound (keys kept forever only add up); None where there is no such window."""
        spans = self.window_spans(n)
        if spans is None:
            return None
        first, last, upto = spans
        first = np.where(first - 1 <= upto, first, NEVER)
        return most_candidates(first, np.where(first < 0, NEVER, last), upto), not self.keeps_forever

    def for_length(self, n: int) -> "DynamicPlan":
        """This plan with its budget clamped to what the region can hold within length n."""
        if self.clamped and self.max_len is not None and n > self.max_len:
            raise PatternError(
                f"this plan of {self.pattern!r} was made for max_len={self.max_len} and its parameters "
                f"larger than that were clamped; make a new plan for max_len={n}")
        budget = self.dynamic.budget
        window = self._window_most(n)
        if window is not None and (window[1] or (isinstance(budget, int) and budget <= window[0])):
            most = window[0]            # exact, or a lower bound the budget does not pass (no cap either way)
        elif n > SCHEDULE_LIMIT:        # no per-token schedule this long: no more than n keys exist
            most = n
        else:
            first, last = self.candidate_span(n)
            most = most_candidates(first, last, n)
        most = max(1, most)
        cap = most if isinstance(budget, int) and budget > most else None
        return self if cap == self.budget_cap else replace(self, budget_cap=cap)

    @property
    def refresh(self) -> bool:
        return self.dynamic.refresh

    @property
    def is_sample(self) -> bool:
        """SANTA: the chain ends with `.sample(...)` (value sampling, sas.methods.santa_dynamic)."""
        return self.score.sample is not None

    def static_rows(self, i0: int, i1: int, n_keys: int) -> np.ndarray:
        """`[i1 - i0, n_keys]` bool: static cells of queries i0..i1-1."""
        i = np.arange(i0, i1, dtype=np.int64)[:, None]
        j = np.arange(n_keys, dtype=np.int64)[None, :]
        return np.asarray(self.static.evaluate(i, j), dtype=bool) & np.ones((i1 - i0, n_keys), dtype=bool)

    def region_rows(self, i0: int, i1: int, n_keys: int) -> np.ndarray:
        """`[i1 - i0, n_keys]` bool: region cells of queries i0..i1-1."""
        i = np.arange(i0, i1, dtype=np.int64)[:, None]
        j = np.arange(n_keys, dtype=np.int64)[None, :]
        return np.asarray(self.region.evaluate(i, j), dtype=bool) & np.ones((i1 - i0, n_keys), dtype=bool)

    def region_last_use(self, j) -> np.ndarray:
        """Last query whose region row holds key j: `FOREVER` if unbounded, `NEVER` (-1) if none."""
        j = np.asarray(j, dtype=np.int64)
        if self.columns is None:
            if self._last_table is None or (j.size and j.max() >= len(self._last_table)):
                raise NotYetSupportedError(
                    f"the region of {self.pattern!r} has no periodic description; its key lifetimes are "
                    f"known only up to max_len={self.max_len}")
            return self._last_table[j]
        c = self.columns
        s = c.shape_of(j)
        used, forever = c.ever_used[s], c.forever[s]
        return np.where(~used, NEVER, np.where(forever, FOREVER, j + c.last_finite[s]))

    def summary(self) -> str:
        """Human-readable description for `sas inspect`: the split, the policy, the score kernels."""
        cap = (f"at most {self.capacity} candidate keys at once" if self.capacity is not None
               else "its candidates grow with the sequence length")
        policy = (f"refresh=True: every candidate stays cached; each decode query loads the {self.budget} "
                  f"with the highest accumulated score" if self.refresh else
                  f"H2O (refresh=False): at most {self.budget} candidates held between steps; the lowest "
                  f"accumulated score is evicted for good")
        lines = [
            f"dynamic component: {self.dynamic!r}",
            f"static part: {self.static!r}",
            f"dynamic region: the cells of {self.full!r} outside the static part; {cap}",
            f"policy: {policy}",
        ]
        if self.budget_cap is not None:
            lines.append(f"budget: Dynamic(budget={self.dynamic.budget}) clamped to {self.budget}: within "
                         f"max_len={self.max_len} the region never holds more candidate keys at once")
        if self.clamped:
            lines.append(f"parameters larger than max_len={self.max_len} clamped (exact on positions < "
                         f"{self.max_len}): the parts above are those of {self.full!r}")
        lines.append(analyze_fusion(self.score).summary())
        return "\n".join(lines)

    def report(self) -> dict:
        def plain(budget):   # a key count, or a run-time budget (ops.fraction) as its repr: JSON either way
            return budget if isinstance(budget, int) else repr(budget)

        return {"static": repr(self.static), "region": repr(self.region), "budget": plain(self.budget),
                "requested_budget": plain(self.dynamic.budget),
                "refresh": self.refresh, "score": repr(self.dynamic.score), "capacity": self.capacity,
                "head_shared_score": self.score.head_shared}


def most_candidates(first: np.ndarray, last: np.ndarray, n: int) -> int:
    """Most keys a region holds at once before length n, counting with the keys alive at query i
    those that enter at i + 1 (a step stages them before evicting): `first` / `last` as given by
    `DynamicPlan.candidate_span`."""
    keys = first >= 0
    if not keys.any():
        return 0
    delta = np.zeros(n + 3, dtype=np.int64)
    np.add.at(delta, np.maximum(first[keys] - 1, 0), 1)
    np.add.at(delta, np.minimum(last[keys], n) + 1, -1)
    return int(np.cumsum(delta)[:n + 1].max())


def _check_max_len(max_len: Any) -> int | None:
    if max_len is None:
        return None
    if isinstance(max_len, bool) or not isinstance(max_len, (int, np.integer)) or not 0 < max_len <= MAX_INDEX:
        raise PatternError(f"plan_dynamic: max_len must be None or a positive integer at most 2**61, "
                           f"got {max_len!r}")
    return int(max_len)


def _region_capacity(c: ColumnShapes) -> int | None:
    used = c.ever_used
    if (c.forever & used).any():
        return None
    first_d = np.where(used, c.first_used, 0)
    last_d = c.last_finite
    lmax = int(last_d[used].max())
    n = c.T + lmax + 2 * c.P + 1
    j = np.arange(n, dtype=np.int64)
    s = c.shape_of(j)
    u = used[s]
    lo, hi = (j + first_d[s])[u], (j + last_d[s])[u]
    delta = np.zeros(n + lmax + 2, dtype=np.int64)
    np.add.at(delta, lo, 1)
    np.add.at(delta, hi + 1, -1)
    return int(np.cumsum(delta)[:n].max())


def plan_dynamic(pattern: Pattern, *, max_len: int | None = None) -> DynamicPlan:
    """Split `pattern` (with exactly one Dynamic component) and trace its score chain.

    `max_len` is needed only when the region has no periodic description (then key lifetimes
    are computed up to it). Raises `PatternError` for a pattern without a Dynamic, a Dynamic
    under `~`, a non-causal pattern, an empty region, a budget larger than a bounded region,
    or a bad score chain; `NotYetSupportedError` for several different Dynamic components.
    """
    if not isinstance(pattern, Pattern):
        raise PatternError(f"plan_dynamic: expected a sas Pattern, got {type(pattern).__name__}")
    max_len = _check_max_len(max_len)
    dyns = []
    for d in pattern.dynamics():
        if d not in dyns:
            dyns.append(d)
    if not dyns:
        raise PatternError(f"{pattern!r} has no Dynamic component; the static runtime handles it")
    if len(dyns) > 1:
        raise NotYetSupportedError(
            f"{pattern!r} has {len(dyns)} different Dynamic components ({', '.join(map(repr, dyns))}); "
            f"one Dynamic component per pattern is supported (the same Dynamic may appear several times)")
    dyn = dyns[0]
    _check_monotone(pattern)
    # The split works on the equal pattern whose numbers fit the lengths it will see.
    work = pattern.restrict(MAX_INDEX if max_len is None else max_len)
    static = substitute(work, dyn, _NOTHING)
    full = substitute(work, dyn, _EVERYTHING)
    region = And(full, Not(static))
    # a period longer than max_len: no key repeats within it (`Structure.within`)
    st = structure(region).within(max_len)
    cols: ColumnShapes | None = None
    last_table = None
    st_full = structure(full)
    if st.periodic and st_full.periodic:
        bad = upper_triangle_clear(full, st_full.within(max_len))
        if bad is not None:
            raise PatternError(f"{pattern!r} is not causal (query {bad[0]} may attend key {bad[1]}); dynamic "
                               f"selection runs query by query: multiply the pattern by Causal()")
        cols = column_shapes(region, st)
        if not cols.ever_used.any() or (max_len is not None and not used_within(cols, max_len)):
            where, longer = ((f" within max_len={max_len}", ", or give a longer max_len where the static part covers "
                              "every cell up to it") if max_len is not None else ("", ""))
            raise PatternError(f"the Dynamic component of {pattern!r} covers no cell outside the static part{where}: "
                               f"its region is empty (intersect the Dynamic with the cells it should select from"
                               f"{longer})")
    else:
        if max_len is None:
            raise NotYetSupportedError(f"{pattern!r}: the dynamic region has no periodic description; pass "
                                       f"max_len to analyse it up to a sequence length")
        check_host_bytes(f"the per-token analysis of the dynamic region of {pattern!r} (no periodic "
                         f"description) at max_len={max_len}", 3 * max_len * max_len, "use a smaller max_len")
        m_full = full.to_mask(max_len)
        if np.triu(m_full, 1).any():
            i, j = np.argwhere(np.triu(m_full, 1))[0]
            raise PatternError(f"{pattern!r} is not causal (query {i} may attend key {j}); multiply it by Causal()")
        m = region.to_mask(max_len)
        if not m.any():
            raise PatternError(f"the Dynamic component of {pattern!r} covers no cell outside the static part")
        rows = np.arange(max_len)[:, None]
        last_table = np.where(m.any(0), np.where(m, rows, -1).max(0), NEVER).astype(np.int64)
    capacity = _region_capacity(cols) if cols is not None else None
    if capacity is not None and isinstance(dyn.budget, int) and dyn.budget > capacity:
        raise PatternError(
            f"Dynamic(budget={dyn.budget}) is larger than its region (the cells of {full!r} outside the "
            f"static part {static!r}), which never holds more than {capacity} candidate keys at once; use "
            f"Dynamic(budget=...) <= {capacity}")
    score = trace_score(dyn.score)
    plan = DynamicPlan(pattern, dyn, static, full, region, score, capacity, cols, max_len, last_table,
                       clamped=work is not pattern)
    return plan if max_len is None else plan.for_length(max_len)


__all__ = ["DynamicPlan", "plan_dynamic", "substitute", "most_candidates", "FOREVER", "NEVER", "SCHEDULE_LIMIT"]
