"""Kascade in Hugging Face transformers decoders (docs/kascade.md).

```python
from sas.integrations.kascade import kascade_attention
from sas.methods.kascade_state import load_state

state = load_state("kascade.safetensors", anchor_pattern(0.1, 128), "SmolLM2-135M-Instruct")
model = kascade_attention(model, state)                 # or anchors=[0, 6, ...], head_map=[[...], ...]
out = model.generate(ids, max_new_tokens=32)
```

- Layer roles come from the anchors (layer 0 must be one: it attends densely and publishes; a
  reuse layer before any anchor is an error) and the head map [L, Hkv] (reuse layer l, KV head
  h reads the latest anchor's head `head_map[l][h]`).
- A forward pre-hook on the model creates one `SelectionStore` per forward call (one prefill or
  one decode step); every layer's attention receives it, anchors publish into it and reuse
  layers read from it. The store never outlives the step.
- The attention function "kascade" is registered in transformers' AttentionInterface; the KV
  cache is the model's own (every key is kept: Kascade selects per step, it does not evict).
- `backend`: "triton" (the kernels, `sas.methods.kascade_runtime`), "torch" (the float64
  reference of `sas.methods.kascade`, for CPU evaluation) or "auto" (triton on CUDA).
- Prefill runs from an empty cache (queries = keys) and decode one token per step; chunked
  prefill and padded batches raise NotYetSupportedError.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from sas.errors import IntegrationError, NotYetSupportedError
from sas.integrations.transformers import _attention_modules
from sas.methods.kascade import (TILE, KascadeError, KascadeLayer, SelectionStore, check_fraction, check_head_map,
                                 reference_decode, reference_prefill)
from sas.methods.kascade_runtime import KascadeRuntime

ATTN_IMPLEMENTATION = "kascade"
LAYER_ATTR = "_sas_kascade_layer"
HOOK_ATTR = "_sas_kascade_hook"
BACKENDS = ("auto", "triton", "torch")


class StepStore:
    """Holds the current forward step's SelectionStore (replaced by the model's pre-hook)."""

    def __init__(self) -> None:
        self.store = SelectionStore()
        self.steps = 0

    def new_step(self) -> None:
        self.store = SelectionStore()
        self.steps += 1

    def pre_hook(self, module: torch.nn.Module, args: Any) -> None:
        """The model's forward pre-hook (a bound method, not a closure, so that a copied or
        pickled model renews its own copy of the store)."""
        self.new_step()


class _LayerBinding:
    def __init__(self, layer: KascadeLayer, index: int, holder: StepStore, backend: str, runtime: KascadeRuntime,
                 dtype: torch.dtype):
        self.layer, self.index, self.holder, self.backend, self.runtime = layer, index, holder, backend, runtime
        self.dtype = dtype


def kascade_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                 mask_function: Any = None, attention_mask: torch.Tensor | None = None, **kwargs) -> None:
    """Mask function of "kascade": the causal structure is the method's; padding is refused."""
    if attention_mask is not None and not bool(attention_mask.to(torch.bool).all()):
        raise NotYetSupportedError("kascade attention: padded batches are not supported (every row must be real "
                                   "tokens)")
    return None


def kascade_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              attention_mask: Any, scaling: float | None = None, dropout: float = 0.0,
                              **kwargs) -> tuple[torch.Tensor, None]:
    """q [B, Hq, L, D], k, v [B, Hkv, N, D] after the cache update; returns ([B, L, Hq, D], None)."""
    bind = getattr(module, LAYER_ATTR, None)
    if not isinstance(bind, _LayerBinding):
        raise IntegrationError(f"attention implementation {ATTN_IMPLEMENTATION!r}: module {type(module).__name__} was "
                               f"not prepared by kascade_attention(model, ...)")
    if module.training and dropout > 0:
        raise NotYetSupportedError("kascade attention runs inference only; call model.eval()")
    lq, n = query.shape[2], key.shape[2]
    if lq != n and lq != 1:
        raise NotYetSupportedError(f"kascade attention: a step of {lq} queries over {n} keys (chunked prefill) is "
                                   f"not supported; prefill the whole prompt at once, then decode one token per step")
    store = bind.holder.store
    decode = lq == 1 and n > 1
    use_torch = bind.backend == "torch" or (bind.backend == "auto" and query.device.type != "cuda")
    if use_torch:
        fn = reference_decode if decode else reference_prefill
        out = fn(bind.layer, query, key, value, store, bind.index, scaling, bind.dtype).to(query.dtype)
    else:
        fn = bind.runtime.decode if decode else bind.runtime.prefill
        out = fn(bind.layer, query, key, value, store, bind.index, scaling)
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    AttentionInterface.register(ATTN_IMPLEMENTATION, kascade_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, kascade_mask)


# at import too: a Kascade model saved with torch.save and loaded in another process imports
# this module while it is unpickled, and then finds "kascade" registered
_register()


def layer_roles(num_layers: int, anchors: Sequence[int], head_map: Any, hkv: int, *, frac: float = 0.1,
                min_keys: int = 128, tile: int = TILE, name: str = "kascade") -> list[KascadeLayer]:
    """The KascadeLayer of every layer: anchors[0] == 0 dense, other anchors sparse, the rest
    reuse with head_map[l] (None: identity). KascadeError before anything runs."""
    budget = check_fraction(frac, min_keys, "kascade_attention(frac=..., min_keys=...)")
    try:
        a = sorted({int(x) for x in anchors})
    except (TypeError, ValueError):
        raise KascadeError(f"kascade_attention(anchors=...) must be layer indices, got {anchors!r}") from None
    if not a or a[0] != 0:
        first = a[0] if a else num_layers
        raise KascadeError(f"kascade_attention: layers 0..{first - 1} would reuse a selection before any anchor "
                           f"published one; layer 0 must be an anchor (the paper's dense first layer), got "
                           f"anchors={list(anchors)}")
    if a[-1] >= num_layers:
        raise KascadeError(f"kascade_attention: anchor {a[-1]} is not a layer of this model (0..{num_layers - 1})")
    if head_map is not None:
        hm = head_map.tolist() if isinstance(head_map, torch.Tensor) else list(head_map)
        if len(hm) != num_layers:
            raise KascadeError(f"kascade_attention: head_map has {len(hm)} rows but the model has {num_layers} layers "
                               f"(one row of {hkv} anchor KV heads per layer)")
    else:
        hm = [None] * num_layers
    out = []
    for i in range(num_layers):
        if i in a:
            out.append(KascadeLayer("dense_anchor" if i == 0 else "anchor", name, budget, None, tile))
        else:
            out.append(KascadeLayer("reuse", name, budget, check_head_map(hm[i], hkv, hkv, f"head_map[{i}]"), tile))
    return out


def kascade_attention(model: Any, state: Any = None, *, anchors: Sequence[int] | None = None, head_map: Any = None,
                      frac: float = 0.1, min_keys: int = 128, tile: int = TILE, backend: str = "auto",
                      name: str = "kascade", torch_dtype: torch.dtype = torch.float32) -> Any:
    """Run every attention layer of a transformers decoder as Kascade and return the same model.

    `state` (a `KascadeState` from `sas calibrate`) gives the anchors and head map; or pass
    `anchors` (and `head_map`, default identity). `torch_dtype`: the compute precision of the
    torch backend (float64 is the specification's). All checks run before the model is changed."""
    config, modules = _attention_modules(model)
    if backend not in BACKENDS:
        raise KascadeError(f"kascade_attention(backend=...) must be one of {BACKENDS}, got {backend!r}")
    hkv = int(config.num_key_value_heads)
    if state is not None:
        if anchors is not None or head_map is not None:
            raise KascadeError("kascade_attention: give either state= or anchors=/head_map=, not both")
        anchors, head_map = state.anchors, state.head_map
        if state.num_layers != len(modules) or state.head_map.shape[1] != hkv:
            raise KascadeError(f"kascade_attention: the state is for {state.num_layers} layers x "
                               f"{state.head_map.shape[1]} KV heads, the model has {len(modules)} x {hkv}")
    if anchors is None:
        raise KascadeError("kascade_attention: pass state= (sas calibrate) or anchors=[0, ...]")
    roles = layer_roles(len(modules), anchors, head_map, hkv, frac=frac, min_keys=min_keys, tile=tile, name=name)
    can_set = getattr(model, "_can_set_attn_implementation", None)
    if can_set is not None and not can_set():
        raise IntegrationError(f"kascade_attention: {type(model).__name__} does not dispatch its attention through "
                               f"transformers' AttentionInterface")
    _register()
    holder = StepStore()
    runtime = KascadeRuntime()
    for i, m in enumerate(modules):
        setattr(m, LAYER_ATTR, _LayerBinding(roles[i], i, holder, backend, runtime, torch_dtype))
    old = getattr(model, HOOK_ATTR, None)
    if old is not None:
        old.remove()
    setattr(model, HOOK_ATTR, model.register_forward_pre_hook(holder.pre_hook))
    model._sas_kascade_steps = holder
    model.set_attn_implementation(ATTN_IMPLEMENTATION)
    return model


__all__ = ["ATTN_IMPLEMENTATION", "StepStore", "kascade_attention", "kascade_attention_forward", "kascade_mask",
           "layer_roles"]
