"""The KV-cache layout of a dynamic pattern at run time (docs/dynamic.md, section 7).

The compact cache of a pattern with a `Dynamic` component is two segments per (batch, KV head):

- `static` slots `[0, C)`: the static part's own minimal cache (`sas.analyze(plan.static)`),
  written through its `cache_id_func`, masked with its `mask_func`;
- `pool` slots `[C, C + pool_size)`: the keys the dynamic selection holds, one key per slot,
  with a per-slot key index and flags (held, loaded) that differ per (batch, KV head).

A key reaches the pool when it becomes a candidate (`enter_at[j]`, the first query whose region
row holds it). The runtime copies it there from its static slot at the end of the step before
(the *handoff*), or writes it straight to the pool when it is a candidate from its own query on.
So the static part must keep each key until the region takes it over: `enter_at[j] == j`, or
the static part uses key `j` at `enter_at[j] - 1` or later. A key may be static and a candidate
at once (a strided static part with the region in between): the kernels attend it through its
static slot on static rows and through the pool on region rows, and its pool slot accumulates
both. Patterns that leave a gap raise `NotYetSupportedError`; every static pattern plus H2O on
what it leaves uncovered (paper Table 6) and H2O alone satisfy the condition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from math import lcm
from typing import Any

import numpy as np

from sas.analysis.analyze import analyze
from sas.dynamic.fusion import analyze_fusion
from sas.dynamic.plan import FOREVER, SCHEDULE_LIMIT, DynamicPlan, plan_dynamic
from sas.dynamic.trace import ScoreGraph
from sas.errors import AnalysisError, EmptyPatternError, NotYetSupportedError, PatternError
from sas.ir.periodicity import structure
from sas.lang.ops import Fraction
from sas.lang.pattern import MAX_INDEX, Pattern
from sas.limits import check_host_bytes, format_bytes, host_table_limit

#: host bytes per position of the region schedule and its temporaries (int64 / int32 arrays)
SCHEDULE_BYTES_PER_TOKEN = 160

_ELEMENTWISE = {"add": "+", "sub": "-", "mul": "*", "truediv": "/"}


@dataclass(frozen=True)
class FusedScore:
    """A score chain the kernels compute themselves: `attn_score()`, one reduction over the
    (group head, query) axis, then elementwise arithmetic with constants (`epilogue`, applied
    in order to the reduced value `x`: (op, constant, constant_on_left))."""

    reduce: str                                   # "sum" | "mean" | "max"
    epilogue: tuple[tuple[str, float, bool], ...]

    def triton_expr(self, x: str) -> str:
        """The epilogue applied to the expression `x`, in operator order (valid Triton and
        Python, rendered into the update kernel and the generated `epilogue`)."""
        for op, c, left in self.epilogue:
            x = f"({float_literal(c)} {op} {x})" if left else f"({x} {op} {float_literal(c)})"
        return x


def float_literal(c: float) -> str:
    """`c` as source text valid in Python and Triton: `float('inf')` for infinities (whose
    repr, `inf`, is not a name there); NaN is refused by the score op chain before this."""
    if math.isnan(c):
        raise PatternError("a NaN constant cannot be part of a fused score chain")
    if math.isinf(c):
        return "float('inf')" if c > 0 else "float('-inf')"
    return repr(float(c))


def fused_score(sg: ScoreGraph) -> FusedScore | None:
    """The `FusedScore` form of a traced chain, or None when the chain needs the general
    (torch) path: custom ops, external scores, pooling, top-k, reductions over KV heads."""
    fusion = analyze_fusion(sg)
    if not fusion.starts_with_attn_score or sg.extra_inputs or sg.head_shared or len(fusion.kernels) != 1:
        return None
    nodes = [n for n in sg.graph.nodes if n.op not in ("placeholder", "output")]
    if len(nodes) < 2 or nodes[0].meta.get("sas_source") != "attn_score":
        return None
    red = nodes[1]
    kind = {"sum": "sum", "mean": "mean", "amax": "max"}.get(getattr(red.target, "__name__", ""))
    if red.op != "call_function" or kind is None or red.kwargs.get("dim") != 2 or red.args[0] is not nodes[0]:
        return None
    epilogue = []
    prev = red
    for n in nodes[2:]:
        name = getattr(n.target, "__name__", "")
        if n.op != "call_function" or name not in _ELEMENTWISE or len(n.args) != 2 or n.kwargs:
            return None
        a, b = n.args
        if a is prev and isinstance(b, (int, float)) and not isinstance(b, bool):
            epilogue.append((_ELEMENTWISE[name], float(b), False))
        elif b is prev and isinstance(a, (int, float)) and not isinstance(a, bool):
            epilogue.append((_ELEMENTWISE[name], float(a), True))
        else:
            return None
        prev = n
    return FusedScore(kind, tuple(epilogue))


@dataclass(frozen=True, eq=False)
class DynamicCachePlan:
    """Static segment, pool and per-step schedule of a dynamic pattern up to `max_len`."""

    plan: DynamicPlan
    max_len: int
    static_analysis: Any | None        # sas Analysis of plan.static; None when it is empty
    pool_size: int                     # pool slots per (batch, KV head)
    max_entering: int                  # most keys entering at one decode step
    enter_at: np.ndarray = field(repr=False)      # [rows] int64: first region query (-1: never)
    region_last: np.ndarray = field(repr=False)   # [rows] int64: last region query, clipped to max_len
    enter_ptr: np.ndarray = field(repr=False)     # [rows + 2] int32 CSR over queries
    enter_keys: np.ndarray = field(repr=False)    # keys ordered by enter_at
    fused: FusedScore | None = None
    #: 0: the tables above span max_len; else they list the first `table_rows` keys (queries)
    #: and key j >= table_rows is key j - table_period moved by the period (its first and last
    #: region query), as are the keys entering at a query past them (`DynamicPlan.table_rows`;
    #: `sas.runtime.dynamic_host.table_row` reads them so, as the kernels do)
    table_period: int = 0

    @property
    def static_size(self) -> int:
        return 0 if self.static_analysis is None else int(self.static_analysis.cache_size)

    @property
    def cache_size(self) -> int:
        """Slots per (batch, KV head): static segment plus pool."""
        return self.static_size + self.pool_size

    @property
    def table_rows(self) -> int:
        return len(self.enter_at)

    def table_arrays(self) -> dict[str, np.ndarray]:
        """The region schedule the generated `Runtime` reads, as int32 arrays: `enter_at`,
        `region_last` (clipped to max_len; -1: never), `enter_ptr`, `enter_keys` (CSR)."""
        last = np.where(self.region_last < 0, -1, np.minimum(self.region_last, self.max_len))
        return {"enter_at": self.enter_at.astype(np.int32), "region_last": last.astype(np.int32),
                "enter_ptr": self.enter_ptr.astype(np.int32),
                "enter_keys": np.append(self.enter_keys, 0).astype(np.int32)}

    def report(self) -> dict[str, Any]:
        return {"static_slots": self.static_size, "pool_slots": self.pool_size, "budget": self.plan.budget,
                "refresh": self.plan.refresh, "max_entering_per_step": self.max_entering,
                "score_path": "fused kernel" if self.fused else "torch (general chain)",
                "region_table_rows": self.table_rows, "region_table_period": self.table_period}


def _check_kascade(pattern: Any) -> None:
    """Kascade's operators (a run-time fraction budget, publish=, ops.reuse) run on their own
    runtime (`sas.methods.kascade_runtime`), not on the H2O cache layout."""
    dyn = pattern.dynamic if isinstance(pattern, DynamicPlan) else None
    dyns = [dyn] if dyn is not None else list(pattern.dynamics())
    for d in dyns:
        if isinstance(d.budget, Fraction) or d.publish is not None or d.score.nodes[0].name == "reuse":
            raise NotYetSupportedError(
                f"{d!r}: a fraction budget, publish= and ops.reuse run on Kascade's runtime "
                f"(sas.integrations.kascade.kascade_attention, sas.methods.kascade_runtime), not on the H2O "
                f"cache layout of SASAttnKernel")


def _handoff_keys(plan: DynamicPlan, static: Any, n: int) -> int:
    """Keys below which the handoff condition decides every key below n: where the region has
    a periodic description and the static part a periodic structure, both a key's first region
    query and its last static use move with a key moved by lcm of the periods past the later
    boundary, so one period past it decides (no per-token pass over n)."""
    c = plan.columns
    st = structure(plan.static) if static is not None else None
    if c is None or (st is not None and not st.periodic):
        return n
    period, boundary = (lcm(c.P, st.P), max(c.T, st.T)) if st is not None else (c.P, c.T)
    return min(n, boundary + period)


def dynamic_cache_plan(pattern: Pattern | DynamicPlan, max_len: int) -> DynamicCachePlan:
    """Lay out the run-time cache of a dynamic pattern for positions `0 .. max_len-1`.

    The region schedule spans max_len only where it must: a region with a periodic description
    (`DynamicPlan.table_rows`) and no refresh lists its first `rows` keys and queries, and the
    kernels and the runtime derive the rest (`table_period`), so that its size and time follow
    the pattern, not max_len."""
    if isinstance(max_len, bool) or not isinstance(max_len, int) or not 0 < max_len <= MAX_INDEX:
        raise PatternError(f"max_len must be a positive integer at most 2**61, got {max_len!r}")
    if max_len >= 2 ** 31:
        raise PatternError(f"max_len={max_len} is too long for the dynamic runtime: it holds keys, positions and "
                           f"region ends as int32 (max_len < 2**31)")
    _check_kascade(pattern)
    # The budget in effect is clamped to what the region can hold within max_len.
    plan = (pattern if isinstance(pattern, DynamicPlan) else plan_dynamic(pattern, max_len=max_len)).for_length(max_len)
    n = max_len
    # refresh=True holds every candidate alive: counted from the steady window where none stays forever
    window = plan.window_spans(n) if plan.refresh and not plan.keeps_forever else None
    rows = None if plan.refresh and window is None else plan.table_rows()
    if rows is not None and rows[0] < n:
        size, period = rows
    else:
        size, period = n, 0
        why = ("refresh=True keeps every candidate, some of them to the end of the sequence, counted per token"
               if plan.refresh and plan.columns is not None else "its region has no periodic description")
        if n > SCHEDULE_LIMIT:
            most = min(SCHEDULE_LIMIT, host_table_limit() // SCHEDULE_BYTES_PER_TOKEN)
            raise PatternError(f"max_len={n} is too long for the dynamic runtime here: {why}, so its region "
                               f"schedule is per token, which is limited to max_len <= {SCHEDULE_LIMIT} "
                               f"({SCHEDULE_LIMIT * 8 // 2**20} MiB per table) and to {SCHEDULE_BYTES_PER_TOKEN} "
                               f"bytes a token within the host-table limit of {format_bytes(host_table_limit())} "
                               f"(SAS_HOST_TABLE_LIMIT): max_len <= {most} here")
        check_host_bytes(f"the region schedule of a dynamic pattern at max_len={n} (per-token tables: {why})",
                         SCHEDULE_BYTES_PER_TOKEN * n, "use a smaller max_len")
    try:
        static = analyze(plan.static, max_len=max_len)
    except EmptyPatternError:
        static = None
    if static is not None and static.tables:
        raise NotYetSupportedError(
            f"the static part {plan.static!r} needs table-driven cache functions at max_len={n}; the "
            f"dynamic runtime needs closed forms (choose max_len as a multiple of the pattern's period)")
    # the spans of the keys the handoff check and the tables read (one pass: per token where the
    # tables are); a key enters at its own query or later, so the first `size` queries' entering
    # keys are among the first `size` keys
    m = _handoff_keys(plan, static, n)
    spans = plan.candidate_span(n, np.arange(max(m, size), dtype=np.int64))
    # the handoff: the static part keeps each key until the region takes it over
    j = np.arange(m, dtype=np.int64)
    first = spans[0][:m]
    if static is not None:
        try:
            s_last = np.asarray(static.last_use(j), dtype=np.int64)
        except AnalysisError:
            check_host_bytes(f"the static part's last uses at max_len={n} (its mask)", n * n,
                             "use a smaller max_len")
            mask = plan.static.to_mask(n)
            s_last = np.where(mask.any(axis=0), np.where(mask, np.arange(n)[:, None], -1).max(axis=0), -1)[:m]
    else:
        s_last = np.full(m, -1, dtype=np.int64)
    bad = np.flatnonzero((first >= 0) & (first != j) & (s_last < first - 1))
    if bad.size:
        k = int(bad[0])
        raise NotYetSupportedError(
            f"{plan.pattern!r}: key {k} becomes a dynamic candidate at query {int(first[k])} but the static "
            f"part {'last uses it at query ' + str(int(s_last[k])) if s_last[k] >= 0 else 'never uses it'}; "
            f"the runtime copies a key from the static cache to the dynamic pool when it becomes a candidate, "
            f"so the region must start before the static part lets the key go (e.g. Diag(0, W) + Diag(W, None) * Dynamic(...), or "
            f"static + (Causal() * ~static) * Dynamic(...))")
    first, last = spans[0][:size], spans[1][:size]
    keys = np.flatnonzero((first >= 0) & (first < size))
    order = np.argsort(first[keys], kind="stable")
    enter_keys = keys[order].astype(np.int32)
    counts = np.bincount(first[keys], minlength=size + 1)[: size + 1]
    enter_ptr = np.zeros(size + 2, dtype=np.int32)
    enter_ptr[1:] = np.cumsum(counts)
    max_entering = int(counts[1:n].max()) if n > 1 else 0
    if plan.refresh:
        # the most candidates alive at one query: over all n, or over the steady window
        f, l_, upto = (first, last, n - 1) if period == 0 else window
        cand = (f >= 0) & (f <= upto)
        delta = np.zeros(upto + 2, dtype=np.int64)
        np.add.at(delta, f[cand], 1)
        np.add.at(delta, np.minimum(l_[cand], upto) + 1, -1)
        pool = int(np.cumsum(delta)[:upto + 1].max())
    else:
        pool = plan.budget + max(1, max_entering)
    pool = max(1, pool)
    return DynamicCachePlan(plan, n, static, pool, max(1, max_entering), first, last, enter_ptr, enter_keys,
                            fused_score(plan.score), period)


__all__ = ["DynamicCachePlan", "FusedScore", "dynamic_cache_plan", "fused_score", "FOREVER"]
