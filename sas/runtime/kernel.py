"""`SASAttnKernel`: a torch module running a pattern's generated kernels and owning its
compact KV cache (paper section 4.3, Figure 8).

It is a thin front: the pattern's `sas.plan.Plan` (made once, or passed as `plan=`) decides
everything; a static pattern runs on an executor of the `StaticRuntime` protocol
(`sas.runtime.executor`; `backend="triton"`: `sas.runtime.static.TritonRuntime`), a dynamic one
on `sas.runtime.dynamic.DynamicRuntime`. The front checks every argument and keeps the
stateful cache.

Two ways to call it:

- functional: `out = kernel(q, k, v)` runs prefill (q [B, Hq, Lq, D], k, v [B, Hkv, Lk, D],
  queries at positions Lk - Lq .. Lk - 1); `out = kernel(q, k, v, past_k, past_v,
  position=p)` runs one decode step for the token at position p over the compact caches
  past_k, past_v [B, Hkv, cache_size, D], which it updates in place (the new key goes to slot
  `cache_id_func(p)`). `kernel.new_cache(...)` / `kernel.fill_cache(...)` make and fill such
  caches.
- stateful: `kernel.prefill(q, k, v)` computes the prompt's attention and fills the kernel's
  own compact cache; each `kernel.decode(q, k, v)` (one token) appends a token and returns
  its attention output.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping

import torch

from sas.codegen.lower_triton import check_identifier
from sas.codegen.triton_backend import DecodeOptions, PrefillOptions
from sas.errors import KernelError, NotYetSupportedError
from sas.lang.pattern import Pattern
from sas.limits import positive_length
from sas.methods.saap_dynamic import SaapDynamicRuntime, is_partition
from sas.methods.santa_dynamic import SantaDynamicRuntime, is_sample
from sas.methods.specattn_runtime import SpecAttnRuntime, is_top_p
from sas.plan import Plan, make_plan
from sas.runtime.checks import (SUPPORTED_DTYPES, check_cache, check_fill, check_geometry, check_new_cache,
                               check_no_grad, check_one_token, check_position, check_qkv, check_tensors)
from sas.runtime.dynamic import DynamicRuntime
from sas.runtime.executor import StaticRuntime, static_runtime
from sas.runtime.static import interpreting

BACKENDS = ("triton", "torch", "cuda")
DEFAULT_MAX_LEN = 16384


#: The seed methods' runtimes, chosen by what the Dynamic component's score chain ends in (first
#: match wins); every other dynamic pattern runs on the generic `DynamicRuntime` (H2O, refresh,
#: fused and traced score chains).
METHOD_RUNTIMES: tuple[tuple[Callable[[Any], bool], Callable[[Plan, dict[str, Any]], Any]], ...] = (
    (is_partition, SaapDynamicRuntime),      # ops.partition: bucket index + its own kernel
    (is_sample, SantaDynamicRuntime),        # .sample(...): value sampling on its own kernels
    (is_top_p, SpecAttnRuntime),             # .top_p(p): per-step top-p of external scores
)


def dynamic_runtime(plan: Plan, other_inputs: dict[str, Any], cache_dir: str | os.PathLike | None = None) -> Any:
    """The runtime of a dynamic plan: a seed method's (`METHOD_RUNTIMES`) or `DynamicRuntime`."""
    for matches, runtime in METHOD_RUNTIMES:
        if matches(plan.split):
            return runtime(plan, other_inputs)
    return DynamicRuntime(plan, other_inputs, cache_dir)


class _StaticSession:
    """The stateful cache of a static pattern over its executor."""

    def __init__(self, runtime: StaticRuntime, plan: Plan):
        self.runtime = runtime
        self.plan = plan
        #: the dtypes the executor takes (the torch executor also float64)
        self.dtypes: tuple[torch.dtype, ...] = getattr(runtime, "DTYPES", SUPPORTED_DTYPES)
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None
        self.length = 0

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = self.runtime.prefill(q, k, v)
        self.k_cache = self.v_cache = None
        if self.plan.can_decode:
            self.k_cache, self.v_cache = self.runtime.new_cache(k.shape[0], k.shape[1], k.shape[3], k.dtype, k.device)
            self.runtime.fill_cache(k, v, self.k_cache, self.v_cache)
        self.length = k.shape[2]
        return out

    def decode(self, where: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = self.step(where, q, k, v, self.k_cache, self.v_cache, self.length)
        self.length += 1
        return out

    def step(self, where: str, q, k, v, past_k, past_v, position) -> torch.Tensor:
        """One decode step over caller-held (or the session's) caches, every argument checked."""
        self.plan.require_decode(where)
        check_qkv(where, q, k, v, self.dtypes)
        check_tensors(where, self.dtypes, q=q, past_k=past_k, past_v=past_v)
        check_cache(where, past_k, past_v, k, max(1, self.plan.cache_size))
        check_one_token(where, q, k)
        position = check_position(where, position, self.plan.max_len)
        return self.runtime.decode(q, k, v, past_k, past_v, position)

    def forward(self, q, k, v, past_k, past_v, position) -> torch.Tensor:
        where = "SASAttnKernel"
        if past_k is None and past_v is None:
            check_qkv(where, q, k, v, self.dtypes)
            if q.shape[2] > k.shape[2]:
                raise KernelError(f"{where}: q has {q.shape[2]} positions but k/v only {k.shape[2]}; the "
                                  f"queries must be the last Lq <= Lk positions")
            return self.runtime.prefill(q, k, v)
        if past_k is None or past_v is None:
            raise KernelError(f"{where}: give both past_k and past_v (or neither, for prefill)")
        if position is None:
            if past_k is self.k_cache and past_v is self.v_cache and self.k_cache is not None:
                return self.decode(where, q, k, v)
            raise KernelError(f"{where}: position= (the new token's absolute position) is required with "
                              f"caller-owned past_k/past_v")
        return self.step(where, q, k, v, past_k, past_v, position)


class _DynamicSession:
    """The stateful cache and selection of a dynamic pattern (`DynamicRuntime`)."""

    def __init__(self, runtime: DynamicRuntime | SaapDynamicRuntime | SantaDynamicRuntime, plan: Plan):
        self.runtime = runtime
        self.plan = plan
        #: shapes, dtypes and devices of the last q, k, v that passed the argument checks (and,
        #: for a `DynamicRuntime`, the prompt's shape they were checked against): a step with
        #: the same ones skips the checks, the session's and the runtime's (host time a step)
        self._checked: tuple | None = None

    @property
    def k_cache(self) -> torch.Tensor | None:
        return self.runtime.state.k if self.runtime.state is not None else None

    @property
    def v_cache(self) -> torch.Tensor | None:
        return self.runtime.state.v if self.runtime.state is not None else None

    @property
    def length(self) -> int:
        return self.runtime.length

    @length.setter
    def length(self, value: int) -> None:
        self.runtime.length = value

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self._checked = None
        return self.runtime.prefill(q, k, v)

    def decode(self, where: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        runtime = self.runtime
        fast = getattr(runtime, "decode_checked", None)
        sig = None
        if type(q) is torch.Tensor and type(k) is torch.Tensor and type(v) is torch.Tensor:
            sig = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device,
                   runtime.shape if fast is not None else None)
        if sig is None or sig != self._checked:
            if fast is not None:
                runtime.check_step(q, k, v)     # check_qkv, one token, the prompt's shapes
            else:
                check_qkv(where, q, k, v)
                check_one_token(where, q, k)
                cache = self.k_cache
                if cache is not None and (k.shape[:2] != cache.shape[:2] or k.shape[3] != cache.shape[3]
                                          or q.dtype != cache.dtype or q.device != cache.device):
                    raise KernelError(f"{where}: q, k, v do not match the prompt's batch, KV heads, head dim, "
                                      f"dtype or device: k is {list(k.shape)} {q.dtype} on {q.device}, the cache "
                                      f"{list(cache.shape)} (batch, KV heads, slots, head dim) {cache.dtype} on "
                                      f"{cache.device}")
            self._checked = sig
        if runtime.length >= self.plan.max_len:
            raise KernelError(f"{where}: position {runtime.length} is past max_len={self.plan.max_len}; build the "
                              f"kernel with a larger max_len")
        return fast(q, k, v) if fast is not None else runtime.decode(q, k, v)

    def forward(self, q, k, v, past_k, past_v, position) -> torch.Tensor:
        if past_k is not None or past_v is not None:
            raise NotYetSupportedError(
                "SASAttnKernel: a pattern with a Dynamic component keeps per-head selection state beside its "
                "cache; use the stateful kernel.prefill(q, k, v) / kernel.decode(q, k, v) instead of "
                "caller-held past_k/past_v")
        check_qkv("SASAttnKernel", q, k, v)
        if q.shape[2] != k.shape[2]:
            raise KernelError(f"SASAttnKernel: q has {q.shape[2]} positions and k/v {k.shape[2]}; a pattern with a "
                              f"Dynamic component runs the whole prompt (queries = keys)")
        if k.shape[2] > self.plan.max_len:
            raise KernelError(f"SASAttnKernel: prompt length {k.shape[2]} exceeds max_len={self.plan.max_len}")
        self._checked = None        # a new sequence: the next step is checked against its cache
        return self.runtime.prefill(q, k, v)


class SASAttnKernel(torch.nn.Module):
    """Sparse attention for `pattern`, with a KV cache of the minimal size.

    `max_len` (default 16384) bounds the positions decode may reach (the cache analysis is exact
    up to it). `plan` may pass a `sas.plan.make_plan(pattern, max_len, ...)` result (then
    `pattern`, `max_len`, `analysis`, `prefill_options`, `decode_options` come from it);
    `analysis` a precomputed `sas.analyze(pattern, max_len)` result.
    """

    def __init__(self, pattern: Pattern | None = None, other_inputs: Mapping[str, Any] | None = None,
                 max_len: int | None = None, backend: str = "triton", *, plan: Plan | None = None,
                 analysis: Any = None, prefill_options: PrefillOptions | None = None,
                 decode_options: DecodeOptions | None = None, num_splits: int | None = None,
                 cache_dir: str | os.PathLike | None = None):
        super().__init__()
        if plan is not None:
            if not isinstance(plan, Plan):
                raise KernelError(f"SASAttnKernel: plan must be a sas.plan.Plan (make_plan(...)), "
                                  f"got {type(plan).__name__}")
            if pattern is not None and pattern != plan.pattern:
                raise KernelError(f"SASAttnKernel: pattern {pattern!r} is not the plan's pattern {plan.pattern!r}")
            if max_len is not None and max_len != plan.max_len:
                raise KernelError(f"SASAttnKernel: max_len={max_len!r} but the plan is for max_len={plan.max_len}")
            given = [n for n, x in (("analysis", analysis), ("prefill_options", prefill_options),
                                    ("decode_options", decode_options)) if x is not None]
            if given:
                raise KernelError(f"SASAttnKernel: with plan=, give {', '.join(given)} to make_plan instead")
            pattern = plan.pattern
        if not isinstance(pattern, Pattern):
            raise KernelError(f"SASAttnKernel: pattern must be a sas Pattern (Rect, Diag, ... combined "
                              f"with + * ~ >>), got {type(pattern).__name__}")
        if backend not in BACKENDS:
            raise KernelError(f"SASAttnKernel: unknown backend {backend!r}; available: {', '.join(BACKENDS)}")
        max_len = DEFAULT_MAX_LEN if max_len is None else max_len
        max_len = positive_length("SASAttnKernel", max_len)
        other_inputs = {} if other_inputs is None else other_inputs
        if not isinstance(other_inputs, Mapping):
            raise KernelError(f"SASAttnKernel: other_inputs must be a mapping name -> tensor, "
                              f"got {type(other_inputs).__name__}")
        for name, value in other_inputs.items():
            check_identifier(name, "other_inputs name")
            if not isinstance(value, torch.Tensor):
                raise KernelError(f"SASAttnKernel: other_inputs[{name!r}] must be a torch.Tensor, "
                                  f"got {type(value).__name__}")
        if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int)
                                       or num_splits < 1):
            raise KernelError(f"SASAttnKernel: num_splits must be a positive integer or None, got {num_splits!r}")
        if plan is None:
            plan = make_plan(pattern, max_len, prefill_options=prefill_options, decode_options=decode_options,
                             analysis=analysis)
        self.plan = plan
        self.pattern = plan.pattern
        self.other_inputs = dict(other_inputs)
        self.max_len = plan.max_len
        self.backend = backend
        self._build = {"num_splits": num_splits, "cache_dir": cache_dir}     # for copies (__getstate__)
        if plan.is_dynamic and backend != "triton":
            raise NotYetSupportedError(f"SASAttnKernel: backend={backend!r} runs static patterns only; a pattern "
                                       f"with a Dynamic component runs on backend='triton' (CUDA, or the CPU "
                                       f"under TRITON_INTERPRET=1)")
        if plan.is_dynamic:
            self._session: _StaticSession | _DynamicSession = _DynamicSession(
                dynamic_runtime(plan, self.other_inputs, cache_dir), plan)
        else:
            self._session = _StaticSession(static_runtime(plan, backend, num_splits=num_splits,
                                                          cache_dir=cache_dir), plan)

    # --- copies (copy.deepcopy, pickle, torch.save) --------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """A copy is built again from the plan (its compiled kernels are not copied) and gets a
        copy of the stateful cache of a static pattern (its values, without an autograd graph it may
        hold); a Dynamic pattern's kernel is copied
        only before its first prompt (or after `reset()`): its selection state is not."""
        session = self._session
        if isinstance(session, _DynamicSession) and session.k_cache is not None:
            raise NotYetSupportedError(
                "SASAttnKernel: a kernel of a pattern with a Dynamic component cannot be copied or pickled while "
                "it holds a sequence (its selection state is not copied); copy it before its prompt or after "
                "reset(), or make another with SASAttnKernel(plan=kernel.plan)")
        cache = None
        if isinstance(session, _StaticSession) and session.k_cache is not None:
            # the values only: a cache filled while autograd recorded (backend='torch') holds a graph
            # that torch copies no more than it pickles; the copy's gradients start at its own inputs
            cache = (session.k_cache.detach(), session.v_cache.detach(), session.length)
        random = self.dynamic.random if isinstance(self.dynamic, SantaDynamicRuntime) else None
        return {"plan": self.plan, "other_inputs": self.other_inputs, "backend": self.backend, "build": self._build,
                "cache": cache, "random": random, "training": self.training}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(other_inputs=state["other_inputs"], backend=state["backend"], plan=state["plan"],
                      **state["build"])
        if state["cache"] is not None:
            self._session.k_cache, self._session.v_cache, self._session.length = state["cache"]
        if state["random"] is not None:
            self.dynamic.random = state["random"]
        self.train(state["training"])

    # --- what the plan holds -----------------------------------------------------------------
    @property
    def runtime(self) -> StaticRuntime | DynamicRuntime:
        """The executor: a `StaticRuntime` (static patterns) or the `DynamicRuntime`."""
        return self._session.runtime

    @property
    def dynamic(self) -> DynamicRuntime | None:
        """The run-time selection of a pattern with a Dynamic component (None for static ones)."""
        return self._session.runtime if isinstance(self._session, _DynamicSession) else None

    @property
    def analysis(self) -> Any:
        return self.plan.analysis

    @property
    def causal(self) -> bool:
        return self.plan.causal

    @property
    def prefill_options(self) -> PrefillOptions | None:
        """The fixed prefill options (None: chosen per sequence length by `auto_prefill_options`)."""
        return self.plan.prefill_options

    @property
    def decode_options(self) -> DecodeOptions | None:
        """The fixed decode options (None: chosen per query-group size by `auto_decode_options`)."""
        return self.plan.decode_options

    @property
    def cache_size(self) -> int:
        """Slots of the compact KV cache per (batch, kv head)."""
        return self.plan.cache_size

    @property
    def k_cache(self) -> torch.Tensor | None:
        return self._session.k_cache

    @property
    def v_cache(self) -> torch.Tensor | None:
        return self._session.v_cache

    @property
    def length(self) -> int:
        """Tokens the stateful cache holds (the next decode position)."""
        return self._session.length

    def extra_repr(self) -> str:
        if self.plan.dynamic is not None:
            size: Any = f"{self.plan.dynamic.static_size} static + {self.plan.dynamic.pool_size} dynamic"
        else:
            size = self.plan.analysis.cache_size if self.plan.analysis is not None else None
        return f"pattern={self.pattern!r}, max_len={self.max_len}, cache_size={size}, backend={self.backend!r}"

    # --- stateful form -------------------------------------------------------------------------
    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Attention of the prompt (q, k, v of equal length); for a causal pattern also fills
        the kernel's own compact cache with the prompt's keys and values."""
        where = "SASAttnKernel.prefill"
        check_qkv(where, q, k, v, self._dtypes)
        self._check_grad(where, q=q, k=k, v=v)
        if q.shape[2] != k.shape[2]:
            raise KernelError(f"{where}: q has {q.shape[2]} positions and k/v {k.shape[2]}; a prompt has one query "
                              f"per key (use kernel(q, k, v) for suffix queries)")
        if self.plan.causal and k.shape[2] > self.max_len:
            raise KernelError(f"{where}: prompt length {k.shape[2]} exceeds max_len={self.max_len}")
        return self._session.prefill(q, k, v)

    def decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Append one token (q [B, Hq, 1, D], k, v [B, Hkv, 1, D]) at the next position and
        return its attention output [B, Hq, 1, D]."""
        where = "SASAttnKernel.decode"
        self.plan.require_decode(where)
        self._check_grad(where, q=q, k=k, v=v)
        if self._session.k_cache is None:
            raise KernelError(f"{where}: no prompt yet; call kernel.prefill(q, k, v) before decode")
        return self._session.decode(where, q, k, v)

    def reset(self) -> None:
        """Forget the stateful cache."""
        if isinstance(self._session, _DynamicSession):
            self._session.runtime.reset()
        else:
            self._session.k_cache = self._session.v_cache = None
            self._session.length = 0

    # --- functional form -------------------------------------------------------------------------
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past_k: torch.Tensor | None = None,
                past_v: torch.Tensor | None = None, *, position: int | None = None) -> torch.Tensor:
        """Prefill when no past caches are given, else one decode step at `position` (default:
        the kernel's own length when past_k/past_v are its own caches)."""
        self._check_grad("SASAttnKernel", q=q, k=k, v=v, past_k=past_k, past_v=past_v)
        return self._session.forward(q, k, v, past_k, past_v, position)

    @property
    def _dtypes(self) -> tuple[torch.dtype, ...]:
        """The dtypes this kernel's executor takes."""
        return self._session.dtypes if isinstance(self._session, _StaticSession) else SUPPORTED_DTYPES

    def _check_grad(self, where: str, **tensors: Any) -> None:
        """Only backend='torch' is differentiable: elsewhere an input that requires grad, with
        gradients being recorded, is refused (`check_no_grad`)."""
        if self.backend != "torch" and torch.is_grad_enabled():
            ways_out = ("run it under torch.no_grad() or torch.inference_mode(); a pattern with a Dynamic component "
                        "has no differentiable backend" if self.plan.is_dynamic else
                        "run it under torch.no_grad() or torch.inference_mode(), or use backend='torch', whose "
                        "output is differentiable")
            check_no_grad(where, self.backend, ways_out, **tensors)

    # --- compact caches ------------------------------------------------------------------------
    def new_cache(self, batch: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype = torch.bfloat16,
                  device: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Zeroed compact caches (k, v), each [batch, num_kv_heads, cache_size, head_dim]."""
        where = "SASAttnKernel.new_cache"
        self._static_cache(where)
        (batch, num_kv_heads, head_dim), device = check_new_cache(where, batch, num_kv_heads, head_dim, dtype, device,
                                                                  self._dtypes)
        return self._session.runtime.new_cache(batch, num_kv_heads, head_dim, dtype, device)

    def fill_cache(self, k: torch.Tensor, v: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor) -> None:
        """Write a prompt's keys/values (positions 0..L-1) into compact caches, as
        token-by-token decoding would have left them."""
        where = "SASAttnKernel.fill_cache"
        self._static_cache(where)
        check_fill(where, k, v, past_k, past_v, max(1, self.plan.cache_size), self.max_len, dtypes=self._dtypes)
        self._session.runtime.fill_cache(k, v, past_k, past_v)

    def _static_cache(self, where: str) -> None:
        self.plan.require_decode(where)
        if isinstance(self._session, _DynamicSession):
            raise NotYetSupportedError(
                f"{where}: a pattern with a Dynamic component keeps per-head selection state beside its cache; "
                f"use the stateful kernel.prefill(q, k, v) / kernel.decode(q, k, v)")

    # --- accounting ------------------------------------------------------------------------------
    def _cache_geometry(self, what: str, batch, num_kv_heads, head_dim, dtype) -> int:
        kc = self.k_cache
        if kc is not None:
            batch = kc.shape[0] if batch is None else batch
            num_kv_heads = kc.shape[1] if num_kv_heads is None else num_kv_heads
            head_dim = kc.shape[3] if head_dim is None else head_dim
            dtype = kc.dtype if dtype is None else dtype
        if None in (batch, num_kv_heads, head_dim):
            raise KernelError(f"{what}: no cache yet; call prefill first or pass batch, num_kv_heads and head_dim")
        batch, num_kv_heads, head_dim = check_geometry(what, batch, num_kv_heads, head_dim)
        dtype = torch.bfloat16 if dtype is None else dtype
        if not isinstance(dtype, torch.dtype):
            raise KernelError(f"{what}: dtype must be a torch.dtype, got {dtype!r}")
        return batch * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def kv_cache_bytes(self, batch: int | None = None, num_kv_heads: int | None = None,
                       head_dim: int | None = None, dtype: torch.dtype | None = None) -> int:
        """Bytes of the compact K and V caches (cache_size slots)."""
        self.plan.require_decode("SASAttnKernel.kv_cache_bytes")
        return 2 * self.cache_size * self._cache_geometry("kv_cache_bytes", batch, num_kv_heads, head_dim, dtype)

    def dense_kv_cache_bytes(self, batch: int | None = None, num_kv_heads: int | None = None,
                             head_dim: int | None = None, dtype: torch.dtype | None = None) -> int:
        """Bytes a dense cache of max_len positions would take."""
        return 2 * self.max_len * self._cache_geometry("dense_kv_cache_bytes", batch, num_kv_heads, head_dim, dtype)


__all__ = ["BACKENDS", "METHOD_RUNTIMES", "SASAttnKernel", "dynamic_runtime", "interpreting"]
