"""KV-cache bytes of a pattern on a model, from the static analysis.

Slots per (batch, KV head, layer): `sas.analyze(pattern, max_len).cache_size` for a static
pattern; for a pattern with a `Dynamic` component the run-time layout of
`sas.dynamic.cache_plan.dynamic_cache_plan` (static slots + the pool: the budget plus the
keys entering during one decode step), which is what the kernels allocate. Dense attention
keeps `max_len` slots. Bytes = slots x layers x KV heads x head_dim x 2 (K and V) x dtype
bytes x batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

import torch

from sas.analysis import analyze
from sas.dynamic.cache_plan import dynamic_cache_plan
from sas.lang.pattern import Pattern
from sas.models import ModelError, ModelShape

PatternArg = Pattern | Mapping[int, Pattern] | None


def has_dynamic(pattern: Pattern) -> bool:
    return bool(pattern.dynamics())


@lru_cache(maxsize=64)
def cache_slots(pattern: Pattern, max_len: int) -> int:
    """Compact cache slots per (batch, KV head) of one layer running `pattern` up to `max_len`."""
    if has_dynamic(pattern):
        return int(dynamic_cache_plan(pattern, max_len).cache_size)
    return int(analyze(pattern, max_len=max_len).cache_size)


@dataclass(frozen=True)
class CacheBytes:
    """KV-cache bytes of all layers: compact (the pattern's) and dense."""

    compact: int
    dense: int

    @property
    def ratio(self) -> float:
        """dense / compact (how many times smaller the compact cache is)."""
        return self.dense / self.compact if self.compact else float("inf")


def layer_patterns(pattern: PatternArg, layers: int) -> list[Pattern | None]:
    """The pattern of each layer (None: dense), from one pattern, a {layer: pattern} mapping
    (absent layers dense) or None (all dense)."""
    if pattern is None or isinstance(pattern, Pattern):
        return [pattern] * layers
    bad = [i for i in pattern if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < layers]
    if bad:
        raise ModelError(f"layer index {bad[0]!r} is out of range: the model has layers 0..{layers - 1}")
    return [pattern.get(i) for i in range(layers)]


def kv_cache_bytes(pattern: PatternArg, max_len: int, shape: ModelShape, dtype: torch.dtype,
                   batch: int = 1) -> CacheBytes:
    """Compact and dense KV-cache bytes of a model of `shape` running `pattern` up to `max_len`."""
    per_slot = shape.kv_heads * shape.head_dim * 2 * torch.empty((), dtype=dtype).element_size() * batch
    slots = [max_len if p is None else cache_slots(p, max_len) for p in layer_patterns(pattern, shape.layers)]
    return CacheBytes(sum(slots) * per_slot, shape.layers * max_len * per_slot)


__all__ = ["CacheBytes", "PatternArg", "cache_slots", "has_dynamic", "kv_cache_bytes", "layer_patterns"]
