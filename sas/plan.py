"""One plan per (pattern, max_len, shapes): everything sas derives before running a kernel
(FlashInfer's plan / run split).

`make_plan(pattern, max_len, ...)` decides, once:

- static patterns: whether the pattern is causal within `max_len`, and if so its KV-cache
  `Analysis` (cache size, synthesized `cache_id_func` / `mask_func`); a non-causal pattern gets
  a prefill-only plan whose `analysis_error` says why it cannot decode;
- dynamic patterns: the split (`sas.dynamic.plan_dynamic`) and the run-time cache layout
  (`DynamicCachePlan`: static segment, pool, region schedule, fused score);
- the launch choices (`PrefillOptions` / `DecodeOptions`, fixed by the caller or chosen per
  length and query-group size), and the prefill tile schedules, made lazily per
  (query length, key length) and kept in a small cache the plan owns.

`sas compile` (`compile_pattern(..., plan=)`), `sas inspect` and the runtime
(`SASAttnKernel(..., plan=)`, `StaticRuntime`, `DynamicRuntime`) take the plan instead of each
rebuilding these. Set-up memory follows the KV-cache size, not `max_len`: causality is decided
from the pattern's periodic structure, and tables over `max_len` are estimated first
(`sas.limits`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from sas.analysis.analyze import analyze
from sas.analysis.columns import upper_triangle_clear
from sas.analysis.per_token import non_causal_cell
from sas.codegen.triton_backend import DecodeOptions, PrefillOptions, auto_decode_options, auto_prefill_options
from sas.dynamic.cache_plan import DynamicCachePlan, dynamic_cache_plan
from sas.dynamic.plan import DynamicPlan, plan_dynamic
from sas.errors import AnalysisError, AnalysisLimitError, KernelError, PatternError, SASError
from sas.ir.periodicity import structure
from sas.ir.tile_period import TilePeriod, tile_period
from sas.ir.tile_runs import TileRuns, tile_runs
from sas.lang.pattern import And, Or, Pattern
from sas.lang.primitives import Diag
from sas.limits import positive_length

DTYPES = {"bfloat16": 2, "float16": 2, "float32": 4}
_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
#: prefill tile schedules a plan keeps (least recently used dropped first)
SCHEDULE_CACHE_SIZE = 16


def dtype_name(dtype: Any) -> str:
    """'bfloat16', 'float16' or 'float32' for a torch dtype or its name (bf16, fp16, half, ...)."""
    name = str(dtype).replace("torch.", "")
    name = _DTYPE_ALIASES.get(name, name)
    if name not in DTYPES:
        raise KernelError(f"unsupported dtype {dtype!r}; supported: bfloat16, float16, float32")
    return name


@dataclass(frozen=True)
class TileSchedule:
    """The prefill launch choice and tile runs of one (query length, key length)."""

    options: PrefillOptions
    runs: TileRuns


class ScheduleCache:
    """Prefill tile schedules (and the square ones' periodic forms) made on demand, least
    recently used dropped first (thread-safe)."""

    def __init__(self, size: int = SCHEDULE_CACHE_SIZE):
        self._size = size
        self._items: OrderedDict[tuple, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple, make) -> Any:
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit
        value = make()
        with self._lock:
            self._items[key] = value
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._items)

    # a copy (copy.deepcopy, pickle) starts empty: schedules are remade on demand, and a lock
    # cannot be copied
    def __getstate__(self) -> dict[str, Any]:
        return {"size": self._size}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["size"])


@dataclass(frozen=True, eq=False)
class Plan:
    """What sas derives for one pattern, max_len and shapes (see the module doc).

    `analysis` is the static KV-cache analysis (None for dynamic patterns and for static ones
    that cannot decode; `analysis_error` then says why); `split` and `dynamic` are the dynamic
    split and run-time cache layout (`dynamic_error`: why a dynamic pattern has no layout, e.g.
    a region that starts after the static part lets its keys go). `prefill_options` /
    `decode_options` are the caller's fixed choices (None: automatic).
    """

    pattern: Pattern
    max_len: int
    head_dim: int | None
    num_heads: int | None
    num_kv_heads: int | None
    dtype: str | None
    causal: bool
    analysis: Any | None
    analysis_error: SASError | None
    split: DynamicPlan | None
    dynamic: DynamicCachePlan | None
    dynamic_error: SASError | None
    prefill_options: PrefillOptions | None
    decode_options: DecodeOptions | None
    schedules: ScheduleCache = field(default_factory=ScheduleCache, repr=False, compare=False)

    # --- what the plan is for --------------------------------------------------------------
    @property
    def is_dynamic(self) -> bool:
        return self.split is not None

    @property
    def prefill_pattern(self) -> Pattern:
        """The pattern the prefill kernel computes: the pattern itself, or for a dynamic pattern
        its `full` form (the Dynamic as its whole region: exactly `pattern.to_mask`)."""
        return self.split.full if self.split is not None else self.pattern

    @property
    def can_decode(self) -> bool:
        return self.analysis is not None or self.dynamic is not None

    def require_decode(self, where: str) -> None:
        """Raise the reason this plan has no decode cache (a `KernelError` naming `where`)."""
        if self.can_decode:
            return
        if self.is_dynamic:
            raise self.dynamic_error if self.dynamic_error is not None else KernelError(
                f"{where}: no run-time cache layout for {self.pattern!r}")
        if not self.causal:
            raise KernelError(
                f"{where}: the pattern {self.pattern!r} is not causal (some query attends a later key), so it "
                f"has no decode KV cache; prefill works, decode needs a causal pattern (multiply it by Causal())")
        raise KernelError(f"{where}: no KV-cache analysis for this pattern, so it cannot decode: "
                          f"{self.analysis_error or 'none given'}")

    @property
    def cache_size(self) -> int:
        """Compact KV-cache slots per (batch, KV head); KernelError when the plan cannot decode."""
        self.require_decode("cache_size")
        if self.dynamic is not None:
            return self.dynamic.cache_size
        return int(self.analysis.cache_size)

    # --- launch choices ----------------------------------------------------------------------
    def prefill_config(self, q_len: int, k_len: int | None = None, *, wide_kernel: bool = False) -> PrefillOptions:
        """The caller's prefill options, or the automatic choice for this length (`wide_kernel`:
        the Hopper kernel for 128-row tiles can run; see `auto_prefill_options`)."""
        k_len = q_len if k_len is None else k_len
        return self.prefill_options or auto_prefill_options(self.prefill_pattern, q_len, k_len,
                                                            wide_kernel=wide_kernel)

    def decode_config(self, group: int = 1, dtype: Any = None) -> DecodeOptions:
        """The caller's decode options, or the automatic choice for `group` query heads per KV head
        and `dtype` (None: the plan's, else bfloat16) (static patterns; the dynamic kernels
        choose their own blocks)."""
        self.require_decode("decode_config")
        if self.decode_options is not None:
            return self.decode_options
        a = self.analysis if self.analysis is not None else self.dynamic.static_analysis
        elem_bytes = DTYPES[dtype_name(dtype if dtype is not None else self.dtype or "bfloat16")]
        return auto_decode_options(a, group, elem_bytes) if a is not None else DecodeOptions()

    def schedule(self, q_len: int, k_len: int | None = None, *, wide_kernel: bool = False) -> TileSchedule:
        """Prefill options and tile runs for queries at the last `q_len` of `k_len` positions
        (made once, then kept in the plan's cache)."""
        k_len = q_len if k_len is None else k_len

        def make() -> TileSchedule:
            if q_len == k_len:
                # a repeating pattern's square schedule from its first rows and period, as a
                # compiled package derives it (time and memory follow the runs, not the tiles)
                o, period = self.tile_period(q_len, wide_kernel=wide_kernel)
                if period is not None:
                    from sas.runtime.tiles import period_runs    # (sas.runtime imports this module)

                    return TileSchedule(o, period_runs(period, q_len))
            o = self.prefill_config(q_len, k_len, wide_kernel=wide_kernel)
            return TileSchedule(o, tile_runs(self.prefill_pattern, q_len, k_len, o.block_m, o.block_n,
                                             k_len - q_len))

        return self.schedules.get((q_len, k_len, wide_kernel), make)

    def tile_period(self, length: int, *, wide_kernel: bool = False) -> tuple[PrefillOptions, TilePeriod | None]:
        """The prefill options of the square `length x length` problem and its schedule's
        periodic form (`sas.ir.tile_period`: the first query blocks and the period; None where
        the pattern has none), made once: what `sas compile` stores and `schedule` unrolls."""

        def make() -> tuple[PrefillOptions, TilePeriod | None]:
            o = self.prefill_config(length, length, wide_kernel=wide_kernel)
            return o, tile_period(self.prefill_pattern, length, o.block_m, o.block_n)

        return self.schedules.get(("period", length, wide_kernel), make)

    # --- description ---------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pattern": repr(self.pattern), "max_len": self.max_len, "causal": self.causal,
                               "dynamic": self.is_dynamic, "head_dim": self.head_dim, "num_heads": self.num_heads,
                               "num_kv_heads": self.num_kv_heads, "dtype": self.dtype}
        if self.can_decode:
            out["cache_size"] = self.cache_size
        if self.analysis is not None:
            out.update(scheme=str(getattr(self.analysis, "scheme", "")),
                       closed_form=bool(getattr(self.analysis, "closed_form", not self.analysis.tables)))
        if self.dynamic is not None:
            out.update(self.dynamic.report())
        errors = [e for e in (self.analysis_error, self.dynamic_error) if e is not None]
        if errors:
            out["decode_error"] = str(errors[0])
        return out


# --- making a plan ---------------------------------------------------------------------------------


def _positive(name: str, value: Any, where: str = "make_plan") -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise KernelError(f"{where}: {name} must be a positive integer, got {value!r}")
    return value


def causal_by_form(pattern: Pattern) -> bool:
    """Causal whatever the length, read from the tree: a `Diag` that starts on or below the
    diagonal (`Causal()`, windows), a product with such a factor, a sum of such terms."""
    if isinstance(pattern, Diag):
        return pattern.offset >= 0
    if isinstance(pattern, And):
        return any(causal_by_form(t) for t in pattern.terms)
    if isinstance(pattern, Or):
        return all(causal_by_form(t) for t in pattern.terms)
    return False


def causal_within(pattern: Pattern, n: int) -> bool:
    """Exactly whether no query i < n attends a key j with i < j < n.

    Decided from the tree where it is causal by form (`causal_by_form`: `... * Causal()`); else
    from the pattern's periodic structure when it has one (length-independent, no table);
    otherwise, or when the first acausal cell lies beyond n, from the runs of the columns above
    the diagonal (`sas.analysis.per_token.non_causal_cell`: O(n) time, any length; chunks of 2^24
    at 2^30 tokens took 47 s there before a refusal)."""
    if causal_by_form(pattern):
        return True
    st = structure(pattern).within(n)
    if st.periodic:
        try:
            bad = upper_triangle_clear(pattern, st)
            if bad is None:
                return True
            if bad[1] < n:
                return False
        except AnalysisLimitError:          # a period too long to read: per token, as analyze does
            pass
    return non_causal_cell(pattern, n) is None


#: what the runtime reads of an analysis given to make_plan (an `Analysis`, or an object with
#: these attributes: the tests hand-build table-driven ones)
ANALYSIS_FIELDS = ("pattern", "max_len", "cache_size", "functions")


def make_plan(pattern: Pattern, max_len: int, *, head_dim: int | None = None, num_heads: int | None = None,
              num_kv_heads: int | None = None, dtype: Any = None,
              prefill_options: PrefillOptions | None = None, decode_options: DecodeOptions | None = None,
              analysis: Any = None) -> Plan:
    """Analyse `pattern` for positions `0 .. max_len-1` (module doc). Shapes are optional (the
    plan is then valid for any); `analysis` may pass a precomputed `sas.analyze(pattern,
    max_len)` result (or an object with the same fields) for a static pattern."""
    if not isinstance(pattern, Pattern):
        raise PatternError(f"make_plan: pattern must be a sas Pattern (Rect, Diag, ... combined with + * ~ >>), "
                           f"got {type(pattern).__name__}")
    max_len = positive_length("make_plan", max_len)
    head_dim = _positive("head_dim", head_dim)
    num_heads = _positive("num_heads", num_heads)
    num_kv_heads = _positive("num_kv_heads", num_kv_heads)
    if num_heads is not None and num_kv_heads is not None and num_heads % num_kv_heads:
        raise KernelError(f"make_plan: num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}")
    name = dtype_name(dtype) if dtype is not None else None
    if prefill_options is not None and not isinstance(prefill_options, PrefillOptions):
        raise KernelError(f"make_plan: prefill_options must be a PrefillOptions, got {type(prefill_options).__name__}")
    if decode_options is not None and not isinstance(decode_options, DecodeOptions):
        raise KernelError(f"make_plan: decode_options must be a DecodeOptions, got {type(decode_options).__name__}")
    common = dict(pattern=pattern, max_len=max_len, head_dim=head_dim, num_heads=num_heads,
                  num_kv_heads=num_kv_heads, dtype=name, prefill_options=prefill_options,
                  decode_options=decode_options)
    if pattern.dynamics():
        if analysis is not None:
            raise KernelError("make_plan: analysis= is for static patterns; a dynamic pattern's static part is "
                              "analysed by its cache layout")
        split = plan_dynamic(pattern, max_len=max_len)
        try:
            layout, why = dynamic_cache_plan(split, max_len), None
        except SASError as e:   # not yet supported, or not at this size: the plan says why
            layout, why = None, e
        except MemoryError:
            layout, why = None, KernelError(f"make_plan: the run-time tables of {pattern!r} at max_len={max_len} "
                                            f"do not fit in memory; use a smaller max_len")
        return Plan(causal=True, analysis=None, analysis_error=None, split=split, dynamic=layout,
                    dynamic_error=why, **common)
    causal = causal_within(pattern, max_len)
    error: SASError | None = None
    missing = [a for a in ANALYSIS_FIELDS if not hasattr(analysis, a)] if analysis is not None else []
    if missing:
        raise KernelError(f"make_plan: analysis must be the result of sas.analyze(pattern, max_len) (or None), got "
                          f"{type(analysis).__name__} without {', '.join(missing)}")
    if analysis is not None:
        got = getattr(analysis, "max_len", max_len)
        if got != max_len or getattr(analysis, "pattern", pattern) != pattern:
            raise KernelError(f"make_plan: the analysis given is for {getattr(analysis, 'pattern', '?')!r} at "
                              f"max_len={got}, not {pattern!r} at max_len={max_len}")
    elif causal:
        try:
            analysis = analyze(pattern, max_len=max_len)
        except AnalysisError as e:
            # prefill needs no cache analysis; decode reports this when asked for
            error = e
    if not causal:
        analysis = None
    return Plan(causal=causal, analysis=analysis, analysis_error=error, split=None, dynamic=None,
                dynamic_error=None, **common)


__all__ = ["DTYPES", "Plan", "ScheduleCache", "TileSchedule", "causal_within", "dtype_name", "make_plan"]
