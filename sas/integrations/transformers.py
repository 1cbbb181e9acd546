"""sas patterns in Hugging Face transformers decoders (docs/integration.md).

```python
from sas import Diag
from sas.integrations.transformers import sas_attention, SASCache

model = sas_attention(model, Diag(0, 1024))          # or {layer_index: pattern}
out = model.generate(ids, max_new_tokens=64)          # prefill + decode through sas
```

Only transformers' own extension points are used, no modeling file is forked:

- the attention function `sas_attention_forward` is registered in `AttentionInterface` (and a
  mask function in `AttentionMaskInterface`) under the name "sas", and the model is switched to
  it with `set_attn_implementation("sas")`. RoPE is applied by the model before the cache, as
  usual; the function receives the rotated queries and keys.
- `SASCache` (a `Cache` subclass, `sas.integrations.cache`) holds each layer's compact cache;
  the model's `_prepare_cache_for_generation` is overridden on the instance so that `generate`
  creates an `SASCache` by itself (the way it creates a `DynamicCache` otherwise).
- the mask function passes the 2-D padding mask through (as `TokenMask`): the pattern is the
  mask, and each row numbers its own real tokens from 0.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface

from sas.errors import IntegrationError, NotYetSupportedError
from sas.integrations.cache import SASCache, TokenMask, clear_binding, positions_of, take_binding
from sas.integrations.parallel import check_dynamic_under_tp, tensor_parallel_of
from sas.integrations.pattern_runtime import PatternRuntime, check_backend
from sas.integrations.state import ATTN_IMPLEMENTATION, RUNTIME_ATTR, STATE_ATTR, ModelState, model_state
from sas.lang.pattern import Pattern
from sas.lang.primitives import Causal
from sas.limits import positive_length

#: `config.model_type` of the supported decoder families (RoPE before the cache, GQA, one
#: self-attention module per layer calling the AttentionInterface)
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


# --- the functions registered with transformers -------------------------------------------
def sas_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
             mask_function: Any = None, attention_mask: torch.Tensor | None = None, **kwargs) -> TokenMask:
    """Mask function of the "sas" implementation: the pattern is the mask, so only the padding
    (which key columns are real tokens) is passed on, once per forward pass."""
    clear_binding()          # a new forward pass of a sas model: nothing of an earlier pass is pending
    if attention_mask is None:
        return TokenMask(None)
    valid = attention_mask.to(torch.bool)
    valid = valid[:, -kv_length:] if valid.shape[1] >= kv_length else valid
    return TokenMask(None if bool(valid.all()) else valid)


def sas_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: Any, scaling: float | None = None, dropout: float = 0.0,
                          **kwargs) -> tuple[torch.Tensor, None]:
    """The "sas" attention function: q [B, Hq, L, D], k, v as the cache update returned them.
    Returns ([B, L, Hq, D], None) like transformers' own implementations."""
    layer = take_binding(key)        # first: the cache's next update checks that this ran
    runtime = getattr(module, RUNTIME_ATTR, None)
    if not isinstance(runtime, PatternRuntime):
        raise IntegrationError(f"attention implementation {ATTN_IMPLEMENTATION!r}: module "
                               f"{type(module).__name__} was not prepared by sas_attention(model, pattern)")
    if module.training and dropout > 0:
        raise NotYetSupportedError("sas attention runs inference only: attention dropout (training mode) is not "
                                   "supported; call model.eval()")
    if attention_mask is not None and not isinstance(attention_mask, TokenMask):
        shape = tuple(attention_mask.shape) if hasattr(attention_mask, "shape") else type(attention_mask).__name__
        raise IntegrationError(f"sas attention got an attention mask of shape {shape}; the pattern is the mask, "
                               f"so pass only the 2-D padding mask attention_mask [batch, length]")
    memo = attention_mask.plans if attention_mask is not None else {}
    valid_all = attention_mask.valid if attention_mask is not None else None
    q_len = query.shape[2]
    if layer is not None:
        valid = None
        if valid_all is not None:
            if valid_all.shape[1] < q_len:
                raise IntegrationError(f"sas attention: attention_mask has {valid_all.shape[1]} columns, fewer "
                                       f"than the {q_len} new tokens")
            valid = valid_all[:, -q_len:]
        made = layer.runtime
        if made is not runtime and (made.pattern, made.max_len, made.backend) != (runtime.pattern, runtime.max_len,
                                                                                  runtime.backend):
            raise IntegrationError(
                f"sas attention (layer {layer.layer_idx}): this SASCache was made for pattern {made.pattern!r} "
                f"(max_len={made.max_len}, backend={made.backend!r}), but the layer now runs {runtime.pattern!r} "
                f"(max_len={runtime.max_len}, backend={runtime.backend!r}): make a new SASCache(model)")
        out = layer.attend(query, key, value, valid, scaling, memo)
    else:
        out = _uncached(runtime, module, query, key, value, valid_all, scaling, memo, kwargs.get("position_ids"),
                        kwargs.get("sliding_window"))
    return out.transpose(1, 2).contiguous(), None


def _uncached(rt: PatternRuntime, module: torch.nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              valid_all: torch.Tensor | None, scale: float | None, memo: dict,
              position_ids: torch.Tensor | None = None, sliding_window: int | None = None) -> torch.Tensor:
    """Attention without an SASCache: the keys are the whole sequence so far (no cache, or a
    dense transformers cache); the queries are its last tokens. `sliding_window` (the model's,
    where it has one) and `position_ids`: a sliding-window model's own cache keeps only the
    window's last keys, which is checked (from the shapes alone: a cache that holds window - 1
    past keys with positions given past them is refused even when it dropped none)."""
    where = f"sas attention (layer {getattr(module, 'layer_idx', '?')}, no SASCache)"
    B, Lq, Lk = q.shape[0], q.shape[2], k.shape[2]
    # a sliding-window cache drops keys once it is full (it then hands over its window - 1 past keys):
    # then fewer keys than the queries' positions mean it dropped some (without a cache Lq == Lk)
    if sliding_window is not None and Lk - Lq >= sliding_window - 1 and isinstance(position_ids, torch.Tensor) \
            and position_ids.numel() and int(position_ids.max()) >= Lk:
        raise IntegrationError(
            f"{where}: the queries reach position {int(position_ids.max())} but the cache handed over only {Lk} "
            f"keys: a transformers cache that drops keys (a sliding-window model's DynamicCache keeps its window's "
            f"last keys) cannot run a sas pattern, which numbers the keys from 0; pass SASCache(model) as the "
            f"cache, or use_cache=False")
    valid = None
    if valid_all is not None:
        if valid_all.shape[1] < Lk:
            raise IntegrationError(f"{where}: attention_mask has {valid_all.shape[1]} columns for {Lk} keys")
        valid = valid_all[:, -Lk:]
    pos = positions_of(valid, torch.zeros(B, dtype=torch.int64, device=q.device), Lk, q.device)
    longest = int(pos.max()) + 1
    if longest > rt.max_len:
        raise IntegrationError(f"{where}: the sequence has {longest} tokens but the pattern was analysed for "
                               f"max_len={rt.max_len}; pass a larger max_len to sas_attention")
    if rt.is_dynamic:
        if valid is not None or Lq != Lk:
            raise NotYetSupportedError(f"{where}: a Dynamic pattern without an SASCache runs a whole unpadded "
                                       f"prompt only")
        return rt.new_dynamic_kernel(getattr(module, "layer_idx", 0) or 0).prefill(
            PatternRuntime._kernel_q(q, scale), k.contiguous(), v.contiguous())
    if rt.use_kernel(q) and valid is None:
        return rt.kernel_prefill(q, k, v, None, None, scale)
    ex = rt.executor
    plan = memo.get((id(rt), "uncached"))
    if plan is None:
        plan = memo[(id(rt), "uncached")] = ex.prefill_plan(pos, Lk, Lq, B, q.device)
    return ex.prefill(q, k, v, scale=scale, plan=plan)


def _register() -> None:
    AttentionInterface.register(ATTN_IMPLEMENTATION, sas_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sas_mask)


# at import too: a model saved after sas_attention (torch.save) and loaded in another process
# imports this module while it is unpickled, and then finds "sas" registered
_register()


# --- the cache argument's name --------------------------------------------------------------
def cache_argument(model: Any) -> str:
    """The keyword under which this transformers version passes the KV cache to `model`'s
    forward and `generate` ("cache" from transformers 5.2x on, "past_key_values" before)."""
    params = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def output_cache(output: Any) -> Any:
    """The KV cache a forward pass or `generate(..., return_dict_in_generate=True)` returned,
    under either transformers' new name (`cache`) or its old one (`past_key_values`)."""
    for name in ("cache", "past_key_values"):
        if name in output.keys():
            return output[name]
    return None


# --- generate: create an SASCache by default ----------------------------------------------
class _SASCachePreparer:
    """`model._prepare_cache_for_generation` of a model prepared by sas_attention
    (`_prepare_sas_cache` bound to the model); an object rather than a bound method so that
    torch.save / pickle of the model keeps it (a bound method pickles as a lookup of its
    function's name on the model, which the model does not have)."""

    def __init__(self, model: PreTrainedModel):
        self.model = model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        model = self.model
        if getattr(model.config, "_attn_implementation", None) != ATTN_IMPLEMENTATION:
            # the attention was set back (model.set_attn_implementation("sdpa")): transformers' own cache
            return type(model)._prepare_cache_for_generation(model, *args, **kwargs)
        return _prepare_sas_cache(model, *args, **kwargs)


def _prepare_sas_cache(self: PreTrainedModel, generation_config: Any, model_kwargs: dict, *args: Any,
                       **kwargs: Any) -> Any:
    """`GenerationMixin._prepare_cache_for_generation` for a model prepared by sas_attention:
    checks the lengths against max_len before anything runs and puts an SASCache in
    `model_kwargs` unless the caller passed one (or asked for no cache). The remaining
    arguments go unchanged to transformers' own method in the other cases."""
    state = model_state(self, "generate")
    draft = [i for i, rt in enumerate(state.runtimes) if rt.needs_draft]
    if draft and generation_config.use_cache is not False:     # (without a cache every step is a whole prefill)
        raise IntegrationError(
            f"generate: layer(s) {draft} run a SpecAttn pattern, whose cached steps select keys from a draft "
            f"model's attention rows, and generate has no draft: run the model with "
            f"sas.integrations.specattn_draft.run_with_draft(target, draft, ...) (docs/specattn.md), or "
            f"generate with use_cache=False (dense steps)")
    dynamic = [i for i, rt in enumerate(state.runtimes) if rt.is_dynamic]
    if dynamic and (generation_config.num_beams or 1) > 1 and generation_config.use_cache is not False:
        raise NotYetSupportedError(
            f"generate: beam search (num_beams={generation_config.num_beams}) reorders the cache between steps, "
            f"and layer(s) {dynamic} have a Dynamic pattern, whose selection state cannot be reordered yet: "
            f"use num_beams=1 (greedy or sampling), or a static pattern")
    longest = int(generation_config.max_length) - 1          # the last new token is never fed back
    mask = model_kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        # padded columns are not tokens of the row: count each row's real tokens
        longest = int(mask.sum(dim=1).max()) + max(0, longest - mask.shape[1])
    if longest > state.max_len:
        raise IntegrationError(
            f"generate: the prompt plus max_new_tokens runs {longest} tokens through the model, but the sas "
            f"pattern was analysed for max_len={state.max_len}; pass a larger max_len to sas_attention "
            f"(or generate fewer tokens)")
    key = cache_argument(self)
    cache = model_kwargs.get(key)
    if cache is not None and not isinstance(cache, SASCache):
        raise IntegrationError(f"generate: {key} is a {type(cache).__name__}; a model prepared by "
                               f"sas_attention keeps its keys in an SASCache (pass SASCache(model) or nothing)")
    if cache is None and generation_config.use_cache is not False:
        impl = generation_config.cache_implementation
        if impl not in (None, "dynamic"):
            raise IntegrationError(f"generate: cache_implementation={impl!r} is not available with sas patterns; "
                                   f"the model uses its own compact SASCache (leave cache_implementation unset)")
        model_kwargs[key] = SASCache(self)
        return None
    return type(self)._prepare_cache_for_generation(self, generation_config, model_kwargs, *args, **kwargs)


# --- sas_attention ---------------------------------------------------------------------------
def _attention_modules(model: Any) -> tuple[Any, list[torch.nn.Module]]:
    """The decoder config and its self-attention modules in layer order; raises for anything
    that is not a supported decoder family."""
    if not isinstance(model, PreTrainedModel):
        raise IntegrationError(f"sas_attention: model must be a transformers PreTrainedModel, got "
                               f"{type(model).__name__}")
    config = model.config
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES or getattr(config, "is_encoder_decoder", False):
        raise IntegrationError(f"sas_attention: model family {model_type!r} ({type(model).__name__}) is not "
                               f"supported; supported decoder families: {', '.join(SUPPORTED_MODEL_TYPES)}")
    n = config.num_hidden_layers
    found: dict[int, torch.nn.Module] = {}
    for m in model.modules():
        if all(hasattr(m, a) for a in ("q_proj", "k_proj", "v_proj", "o_proj", "layer_idx", "head_dim")):
            found[int(m.layer_idx)] = m
    if sorted(found) != list(range(n)):
        raise IntegrationError(f"sas_attention: expected one self-attention module per layer 0..{n - 1} in "
                               f"{type(model).__name__}, found layers {sorted(found)}")
    return config, [found[i] for i in range(n)]


def _layer_patterns(pattern: Any, n: int) -> list[Pattern]:
    if isinstance(pattern, Pattern):
        return [pattern] * n
    if not isinstance(pattern, Mapping):
        raise IntegrationError(f"sas_attention: pattern must be a sas Pattern or a dict {{layer_index: Pattern}}, "
                               f"got {type(pattern).__name__}")
    out: list[Pattern] = [Causal()] * n
    for key, p in pattern.items():
        if isinstance(key, bool) or not isinstance(key, int):
            raise IntegrationError(f"sas_attention: layer index {key!r} must be an int in [0, {n})")
        if not 0 <= key < n:
            raise IntegrationError(f"sas_attention: layer index {key} is out of range; the model has {n} layers "
                                   f"(valid: 0..{n - 1})")
        if not isinstance(p, Pattern):
            raise IntegrationError(f"sas_attention: the pattern of layer {key} must be a sas Pattern, got "
                                   f"{type(p).__name__}")
        out[key] = p
    return out


def _max_len(max_len: Any, config: Any) -> int:
    if max_len is None:
        max_len = getattr(config, "max_position_embeddings", None)
        if max_len is None:
            raise IntegrationError("sas_attention: the model config has no max_position_embeddings; pass max_len")
    return positive_length("sas_attention", max_len, IntegrationError)


def sas_attention(model: Any, pattern: Pattern | Mapping[int, Pattern], *, backend: str = "auto",
                  max_len: int | None = None) -> Any:
    """Run every attention layer of a transformers decoder through sas and return the same model.

    `pattern`: one pattern for every layer, or `{layer_index: pattern}` (the other layers keep
    dense attention, `Causal()`, through the same compact cache). `backend`: "torch" (the
    pure-torch executor), "triton" (the generated kernels), "cuda" (the nvcc-built CUDA kernels
    of `sas compile --backend cuda`, static patterns, model on a GPU) or "auto" (triton for CUDA
    tensors, torch otherwise). `max_len`: the longest sequence (prompt plus generated tokens, per row)
    the patterns are analysed for; default `config.max_position_embeddings`. All checks run
    before the model is changed.
    """
    config, modules = _attention_modules(model)
    tp = tensor_parallel_of(model, modules[0], "sas_attention")
    patterns = _layer_patterns(pattern, len(modules))
    max_len = _max_len(max_len, config)
    backend = check_backend(backend)
    try:
        first = next(model.parameters())
        device, dtype = first.device, first.dtype
    except StopIteration:
        device, dtype = torch.device("cpu"), None
    head_dim = int(modules[0].head_dim)
    by_pattern: dict[Pattern, list[int]] = {}
    for i, p in enumerate(patterns):
        by_pattern.setdefault(p, []).append(i)
    runtimes = {p: PatternRuntime.build(p, max_len, backend, layers, device, head_dim, dtype)
                for p, layers in by_pattern.items()}
    check_dynamic_under_tp(runtimes.values(), tp, "sas_attention")
    can_set = getattr(model, "_can_set_attn_implementation", None)
    if can_set is not None and not can_set():
        raise IntegrationError(f"sas_attention: {type(model).__name__} does not dispatch its attention through "
                               f"transformers' AttentionInterface, so its attention cannot be replaced")
    window = getattr(config, "sliding_window", None)
    if window is not None and getattr(config, "use_sliding_window", True) and window < max_len:
        warnings.warn(f"sas_attention: the model's own sliding window ({window}) is replaced by the sas "
                      f"patterns; write it into the pattern (e.g. Diag(0, {window})) to keep it", stacklevel=2)
    _register()
    for i, m in enumerate(modules):
        setattr(m, RUNTIME_ATTR, runtimes[patterns[i]])
    setattr(model, STATE_ATTR, ModelState(tuple(runtimes[p] for p in patterns), max_len, backend, tp))
    model.set_attn_implementation(ATTN_IMPLEMENTATION)
    model._prepare_cache_for_generation = _SASCachePreparer(model)
    return model


__all__ = ["sas_attention", "SASCache", "cache_argument", "output_cache", "sas_attention_forward", "sas_mask", "ATTN_IMPLEMENTATION",
           "SUPPORTED_MODEL_TYPES"]
