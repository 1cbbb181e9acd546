"""The static-runtime protocol: what an executor of a static pattern provides, and the registry
`SASAttnKernel(backend=...)` picks one from (docs/architecture.md, "Executors").

An executor is made from a `sas.plan.Plan` (static, i.e. `not plan.is_dynamic`) and runs:

- `prefill(q, k, v) -> out`: q [B, Hq, Lq, D], k, v [B, Hkv, Lk, D], the queries at the last Lq
  of the Lk positions; out like q. Rows that attend no key give 0.
- `new_cache(batch, num_kv_heads, head_dim, dtype, device) -> (k_cache, v_cache)`: zeroed
  compact caches [batch, num_kv_heads, max(1, plan.cache_size), head_dim].
- `fill_cache(k, v, past_k, past_v)`: a prompt's keys/values (positions 0..L-1) written into
  the compact caches as token-by-token decoding would have left them.
- `decode(q, k, v, past_k, past_v, position: int) -> out`: one token at absolute `position`
  (q [B, Hq, 1, D], k, v [B, Hkv, 1, D]); the new key is written to slot
  `cache_id_func(position)` of the caches, in place; the query attends the slots `s` with
  `mask_func(s, position)`.

`SASAttnKernel` checks every argument before calling (shapes, dtypes, one device, lengths
<= max_len, positions, cache shapes, `plan.require_decode` for the cache methods), so an
executor may assume them; it checks only its own limits (devices, head dims) and raises
`KernelError` before any work. A factory takes the plan and the keyword arguments
`num_splits` and `cache_dir`, which it may ignore.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

import torch

from sas.errors import KernelError


@runtime_checkable
class StaticRuntime(Protocol):
    """An executor of a static pattern's plan (module doc)."""

    plan: Any

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...

    def new_cache(self, batch: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                  device: Any) -> tuple[torch.Tensor, torch.Tensor]: ...

    def fill_cache(self, k: torch.Tensor, v: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor) -> None: ...

    def decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past_k: torch.Tensor,
               past_v: torch.Tensor, position: int) -> torch.Tensor: ...


#: executor factories by backend name: factory(plan, *, num_splits=None, cache_dir=None)
RuntimeFactory = Callable[..., StaticRuntime]
_FACTORIES: dict[str, RuntimeFactory] = {}


def register_backend(name: str, factory: RuntimeFactory) -> None:
    """Make `SASAttnKernel(..., backend=name)` run static patterns on `factory(plan, **options)`."""
    _FACTORIES[name] = factory


def static_runtime(plan: Any, backend: str, **options: Any) -> StaticRuntime:
    """The executor of `backend` for a static plan."""
    factory = _FACTORIES.get(backend)
    if factory is None:
        raise KernelError(f"SASAttnKernel: unknown backend {backend!r}; available: {', '.join(sorted(_FACTORIES))}")
    return factory(plan, **options)


__all__ = ["RuntimeFactory", "StaticRuntime", "register_backend", "static_runtime"]
