"""`SASCache`: a transformers `Cache` whose layers hold sas compact KV caches.

Each layer keeps `[batch, kv_heads, cache_size, head_dim]` keys and values laid out by the
pattern's `cache_id_func` (not a dense cache), the number of real tokens of every row
(`lengths`: padding is never stored) and, for a Dynamic pattern, the stateful Triton kernel
that holds the selection state beside its cache.

transformers calls `Cache.update(key, value, layer_idx)` right before the layer's attention
function; `SASCache.update` returns the new keys unchanged and records which layer they belong
to, so that the attention function (`sas.integrations.transformers`) can run prefill, decode
or a prompt chunk against that layer's compact cache (`take_binding`).
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from sas.errors import IntegrationError, NotYetSupportedError
from sas.integrations.parallel import TensorParallel
from sas.integrations.pattern_runtime import PatternRuntime
from sas.integrations.specattn_draft import draft_scores
from sas.integrations.state import model_state
from sas.methods.specattn_runtime import SpecAttnRuntime
from sas.runtime.kernel import SASAttnKernel


@dataclass(frozen=True, eq=False)
class TokenMask:
    """What sas's mask function hands every attention layer of one forward pass: which key
    columns are real tokens (`valid` [B, kv_len] bool; None: all of them), and a memo of
    attention plans that the layers sharing a pattern reuse within the pass."""

    valid: torch.Tensor | None
    plans: dict = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class _Binding:
    layer: "SASCacheLayer"
    key: torch.Tensor


_BINDING: ContextVar[_Binding | None] = ContextVar("sas_cache_binding", default=None)


def clear_binding() -> None:
    """Forget a binding left by an earlier forward pass (sas's mask function calls it first, so a
    pass whose keys another attention read, or that raised, does not refuse the next pass)."""
    _BINDING.set(None)


def take_binding(key: torch.Tensor) -> "SASCacheLayer | None":
    """The cache layer whose `update` returned `key` just now (None when the keys did not come
    from an SASCache, e.g. a forward pass without a cache)."""
    b = _BINDING.get()
    _BINDING.set(None)          # taken, or not this call's: either way sas attention ran after the update
    if b is None or b.key is not key:
        return None
    return b.layer


def positions_of(valid: torch.Tensor | None, lengths: torch.Tensor, q_len: int, device: torch.device) -> torch.Tensor:
    """Per-row positions [B, q_len] of new tokens (-1: padding): a row's real tokens are
    numbered on from the `lengths[b]` it already holds."""
    if valid is None:
        return lengths[:, None] + torch.arange(q_len, device=device)[None, :]
    return torch.where(valid, lengths[:, None] + valid.long().cumsum(dim=1) - 1, -1)


def _memo(memo: dict, key: tuple, make) -> Any:
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = make()
    return hit


class SASCacheLayer(CacheLayerMixin):
    """The compact cache of one model layer."""

    is_compileable = False
    is_sliding = False
    is_croppable = False

    def __init__(self, runtime: PatternRuntime, layer_idx: int, tensor_parallel: TensorParallel | None = None):
        super().__init__()
        self.runtime = runtime
        self.layer_idx = layer_idx
        self.tensor_parallel = tensor_parallel
        self.lengths: torch.Tensor | None = None        # [B] real tokens stored per row
        self.host_lengths: list[int] = []                # the same on the host: decode needs no sync
        self.seen = 0                                    # columns seen, padding included
        self.kernel: SASAttnKernel | None = None         # Dynamic: the stateful kernel

    def __repr__(self) -> str:
        return f"SASCacheLayer(layer={self.layer_idx}, pattern={self.runtime.pattern!r}, seen={self.seen})"

    # --- transformers' layer protocol ------------------------------------------------------
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        B, H, _, D = key_states.shape
        tp = self.tensor_parallel
        if tp is not None and H != tp.local_kv_heads:
            raise IntegrationError(f"sas attention (layer {self.layer_idx}): rank {tp.rank} of {tp.size} received "
                                   f"{H} KV heads, but a head-wise split of the model's {tp.kv_heads} KV heads "
                                   f"gives each rank {tp.local_kv_heads}")
        self.dtype, self.device = key_states.dtype, key_states.device
        self._geometry = (B, H, D)
        if self.runtime.is_dynamic:
            self.kernel = self.runtime.new_dynamic_kernel(self.layer_idx)
        else:
            self.keys, self.values = self.runtime.executor.new_cache(B, H, D, key_states.dtype, key_states.device)
        self.lengths = torch.zeros(B, dtype=torch.int64, device=key_states.device)
        self.host_lengths = [0] * B
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return self.runtime.max_len

    def reset(self) -> None:
        if self.keys is not None:
            self.keys.zero_()
            self.values.zero_()
        if self.lengths is not None:
            self.lengths.zero_()
            self.host_lengths = [0] * len(self.host_lengths)
        if self.kernel is not None:
            self.kernel = self.runtime.new_dynamic_kernel(self.layer_idx)
            self.keys = self.values = None
        self.seen = 0

    def _static_only(self, what: str) -> None:
        if self.runtime.is_dynamic:
            raise NotYetSupportedError(f"SASCache.{what}: layer {self.layer_idx} has a Dynamic pattern, whose "
                                       f"selection state cannot be reordered or repeated yet")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._static_only("reorder_cache")
        if self.keys is not None:
            idx = beam_idx.to(self.keys.device)
            self.keys, self.values = self.keys.index_select(0, idx), self.values.index_select(0, idx)
            self.lengths = self.lengths.index_select(0, idx)
            self.host_lengths = self.lengths.tolist()

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._static_only("batch_repeat_interleave")
        if self.keys is not None:
            self.keys = self.keys.repeat_interleave(repeats, dim=0)
            self.values = self.values.repeat_interleave(repeats, dim=0)
            self.lengths = self.lengths.repeat_interleave(repeats, dim=0)
            self.host_lengths = self.lengths.tolist()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._static_only("batch_select_indices")
        if self.keys is not None:
            self.keys, self.values, self.lengths = self.keys[indices], self.values[indices], self.lengths[indices]
            self.host_lengths = self.lengths.tolist()

    def crop(self, tokens_to_remove: int) -> None:
        raise NotYetSupportedError("SASCache.crop: a compact cache overwrites slots in place, so it cannot roll "
                                   "tokens back (assisted / speculative generation)")

    # --- accounting ------------------------------------------------------------------------
    def kv_cache_bytes(self) -> int:
        """Bytes of this layer's compact keys and values (0 before the first token)."""
        if self.kernel is not None:
            k, v = self.kernel.k_cache, self.kernel.v_cache
        else:
            k, v = self.keys, self.values
        if k is None:
            return 0
        return k.numel() * k.element_size() + v.numel() * v.element_size()

    def dense_kv_cache_bytes(self, length: int) -> int:
        """Bytes a dense cache of `length` positions would take for this layer."""
        if not self.is_initialized:
            return 0
        B, H, D = self._geometry
        if self.keys is not None and not self.runtime.is_dynamic:
            B = self.keys.shape[0]                       # after batch_repeat_interleave / select
        return 2 * B * H * length * D * torch.empty((), dtype=self.dtype).element_size()

    # --- attention -------------------------------------------------------------------------
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor | None,
               scale: float | None, memo: dict) -> torch.Tensor:
        """Attention of the new tokens (q [B, Hq, L, D], k, v [B, Hkv, L, D], `valid` [B, L]:
        real tokens) against this layer's cache, which then holds them. Chooses prefill (empty
        cache), decode (one token) or a prompt chunk."""
        where = f"sas attention (layer {self.layer_idx})"
        B, L = q.shape[0], q.shape[2]
        if self.lengths.shape[0] != B:
            raise IntegrationError(f"{where}: the cache holds a batch of {self.lengths.shape[0]} rows, the input "
                                   f"has {B}; use a new SASCache for a new batch")
        if valid is not None and bool(valid.all()):
            valid = None
        pos = positions_of(valid, self.lengths, L, q.device)
        # the lengths after this call, on the host: no device sync without padding
        count = L if valid is None else valid.sum(dim=1)
        after = [n + L for n in self.host_lengths] if valid is None else (self.lengths + count).tolist()
        longest = max(after)
        rt = self.runtime
        if longest > rt.max_len:
            raise IntegrationError(f"{where}: a row reaches {longest} tokens but the pattern was analysed for "
                                   f"max_len={rt.max_len}; pass a larger max_len to sas_attention")
        first = not any(self.host_lengths)
        if rt.is_dynamic:
            out = self._attend_dynamic(where, q, k, v, valid, first, scale)
        elif first:
            if rt.use_kernel(q):
                rows = None if valid is None else [torch.nonzero(valid[b])[:, 0] for b in range(B)]
                out = rt.kernel_prefill(q, k, v, rows, (self.keys, self.values), scale)
            else:
                ex = rt.executor
                plan = _memo(memo, (id(rt), "prefill"), lambda: ex.prefill_plan(pos, L, L, B, q.device))
                out = ex.prefill(q, k, v, scale=scale, plan=plan)
                ex.fill_cache(k, v, self.keys, self.values, positions=pos)
        elif L == 1:
            if rt.use_kernel(q):
                rows = self.host_lengths if valid is None else pos[:, 0].tolist()
                out = rt.kernel_decode(q, k, v, self.keys, self.values, rows, scale)
            else:
                ex = rt.executor
                plan = _memo(memo, (id(rt), "decode"), lambda: ex.decode_plan(pos[:, 0], B))
                out = ex.decode(q, k, v, self.keys, self.values, None, scale=scale, plan=plan)
        else:
            ex = rt.executor
            plan = _memo(memo, (id(rt), "chunk"), lambda: ex.chunk_plan(pos, B))
            out = ex.prefill_chunk(q, k, v, self.keys, self.values, pos, scale=scale, plan=plan)
        self.lengths += count
        self.host_lengths = after
        self.seen += L
        return out

    def _attend_dynamic(self, where: str, q, k, v, valid, first: bool, scale) -> torch.Tensor:
        if valid is not None:
            raise NotYetSupportedError(f"{where}: a Dynamic pattern runs on a batch without padding only (its "
                                       f"kernels take one position for the whole batch)")
        qk = PatternRuntime._kernel_q(q, scale)
        spec = self.kernel.dynamic
        if isinstance(spec, SpecAttnRuntime) and not first:   # SpecAttn: one step per block, draft scores
            scores = draft_scores(self.layer_idx)
            if scores is None and spec.name not in spec.other_inputs:
                raise IntegrationError(
                    f"{where}: this layer's SpecAttn pattern selects keys from a draft model's attention, and no "
                    f"draft scores were given for the step: run the model with "
                    f"sas.integrations.specattn_draft.run_with_draft(target, draft, ...) (or give each step's rows "
                    f"inside use_draft_scores({{layer: scores}})); model.generate alone has no draft")
            out = spec.step(qk, k.contiguous(), v.contiguous(), scores=scores)
        elif first:
            out = self.kernel.prefill(qk, k.contiguous(), v.contiguous())
        elif q.shape[2] == 1:
            out = self.kernel.decode(qk, k.contiguous(), v.contiguous())
        else:
            raise NotYetSupportedError(f"{where}: chunked prefill of a Dynamic pattern (the selection runs "
                                       f"the prompt in one step); prefill the prompt in one call")
        self.keys, self.values = self.kernel.k_cache, self.kernel.v_cache
        return out


class SASCache(Cache):
    """A transformers cache of sas compact KV caches, one per layer of a model prepared by
    `sas_attention` (generate creates it by itself; pass `SASCache(model)` to a forward call
    to keep one across calls)."""

    def __init__(self, model: Any):
        state = model_state(model, "SASCache")
        layers = [SASCacheLayer(rt, i, state.tensor_parallel) for i, rt in enumerate(state.runtimes)]
        super().__init__(layers=layers)
        self.max_len = state.max_len

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        if not 0 <= layer_idx < len(self.layers):
            raise IntegrationError(f"SASCache.update: layer_idx {layer_idx} is out of range; the model has "
                                   f"{len(self.layers)} layers")
        if _BINDING.get() is not None:
            # the keys the last update handed over were not taken by sas attention: another attention
            # read them (it would see the new keys alone, not the compact cache)
            _BINDING.set(None)
            raise IntegrationError(
                "SASCache.update: the previous layer's attention was not sas's (e.g. after "
                "model.set_attn_implementation('sdpa')); an SASCache holds compact caches that only sas attention "
                "reads: pass a transformers cache (or none) to a model whose attention is not sas's")
        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        _BINDING.set(_Binding(self.layers[layer_idx], keys))
        return keys, values

    def crop(self, tokens_to_remove: int) -> None:
        self.layers[0].crop(tokens_to_remove)

    def kv_cache_bytes(self) -> int:
        """Bytes of the compact K and V caches of all layers (of this rank's heads under tensor
        parallelism)."""
        return sum(layer.kv_cache_bytes() for layer in self.layers)

    def dense_kv_cache_bytes(self, length: int | None = None) -> int:
        """Bytes a dense K/V cache of `length` positions per row would take over all layers
        (default: the columns seen so far, what transformers' DynamicCache would hold)."""
        if length is not None and (isinstance(length, bool) or not isinstance(length, int) or length < 0):
            raise IntegrationError(f"SASCache.dense_kv_cache_bytes: length must be a non-negative int, got {length!r}")
        n = self.get_seq_length() if length is None else length
        return sum(layer.dense_kv_cache_bytes(n) for layer in self.layers)


__all__ = ["SASCache", "SASCacheLayer", "TokenMask", "clear_binding", "take_binding", "positions_of"]
