"""SpecAttn in a transformers model: a target model whose layers select keys by top-p of a draft
model's attention (docs/specattn.md).

Two paths, the same selection (`sas.methods.specattn`):

- **kernels** (`run_with_draft`): the target is prepared by `sas_attention` with
  `specattn_pattern(...)` on its sparse layers and runs on `SASCache` (the `SpecAttnRuntime`
  behind each layer's `SASAttnKernel`); the draft runs beside it on its own cache with eager
  attention; per step (the prompt, then blocks of γ tokens, teacher-forced) the draft's
  attention rows of the block, layer f(j) for target layer j (the alignment), are handed to the
  target's layers through `use_draft_scores` and the target runs the block as one
  verification step.
- **masks** (`specattn_masks` + `masked_logits`): the same per-step selections computed from the
  draft's full-sequence attention and applied as exact boolean masks in one forward pass (each
  row's mask is the one its verification step uses, so the logits are the step-by-step ones);
  what the CPU accuracy runs use, and what tests compare the kernel path against.

Draft heads: when the draft has the target's query-head count its heads map one to one;
otherwise its head-averaged rows are given to every target head.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Any, Iterator, Mapping, Sequence

import torch
import torch.nn.functional as F

from sas.errors import IntegrationError
from sas.lang import ops
from sas.lang.pattern import Pattern
from sas.lang.primitives import Causal, Diag, Dynamic
from sas.methods.specattn import attend_mask, step_rows, visit_chunks
from sas.methods.threshold import expand_chunks, select_reference

DRAFT_INPUT = "draft_attn"
_SCORES: ContextVar[Mapping[int, torch.Tensor] | None] = ContextVar("sas_draft_scores", default=None)


@contextlib.contextmanager
def use_draft_scores(scores: Mapping[int, torch.Tensor]) -> Iterator[None]:
    """Within the block, target layer j's SpecAttn step reads `scores[j]` [B, Hq, Lq, Lk]."""
    token = _SCORES.set(dict(scores))
    try:
        yield
    finally:
        _SCORES.reset(token)


def draft_scores(layer: int) -> torch.Tensor | None:
    s = _SCORES.get()
    return None if s is None else s.get(layer)


def specattn_pattern(p: float, *, chunk: int = 16, pooled: bool = False, window: int = 0,
                     iters: int | None = None) -> Pattern:
    """`[Diag(0, window) +] Causal() * Dynamic(top-p of ops.external("draft_attn"))`."""
    dyn = Dynamic(budget=1, refresh=True, score=ops.external(DRAFT_INPUT).top_p(p, chunk=chunk, pooled=pooled,
                                                                               iters=iters))
    if window:
        local = Diag(0, window)
        return local + (Causal() * ~local) * dyn
    return Causal() * dyn


def map_scores(draft_attn: Sequence[torch.Tensor], mapping: Sequence[int], layers: Sequence[int],
               num_heads: int) -> dict[int, torch.Tensor]:
    """Target layer j -> the draft attention of layer mapping[j], as [B, Hq, Lq, Lk]."""
    out = {}
    for j in layers:
        if not 0 <= j < len(mapping) or not 0 <= mapping[j] < len(draft_attn):
            raise IntegrationError(f"SpecAttn: target layer {j} has no draft layer in the alignment {list(mapping)} "
                                   f"({len(draft_attn)} draft layers)")
        a = draft_attn[mapping[j]]
        if a.shape[1] != num_heads:
            a = a.mean(1, keepdim=True).expand(-1, num_heads, -1, -1)
        out[j] = a
    return out


def _draft_step(draft: Any, ids: torch.Tensor, cache: Any) -> tuple[list[torch.Tensor], Any]:
    from sas.integrations.transformers import cache_argument

    with torch.no_grad():
        out = draft(ids, **{cache_argument(draft): cache}, use_cache=True, output_attentions=True)
    return [a.float() for a in out.attentions], cache


def run_with_draft(target: Any, draft: Any, mapping: Sequence[int], ids: torch.Tensor, *, prefill_len: int,
                   gamma: int, sparse_layers: Sequence[int]) -> torch.Tensor:
    """Teacher-forced run of `ids` [B, N]: the prompt [0, prefill_len), then blocks of `gamma`
    tokens; the target (prepared by `sas_attention` with SpecAttn patterns on `sparse_layers`)
    runs each block on its SASCache with the draft's attention of the block. Returns the
    target's logits [B, N, V]."""
    from transformers import DynamicCache

    from sas.integrations.cache import SASCache
    from sas.integrations.transformers import cache_argument

    if not 1 <= prefill_len < ids.shape[1] or gamma < 1:
        raise IntegrationError(f"run_with_draft: need 1 <= prefill_len < N={ids.shape[1]} and gamma >= 1, got "
                               f"prefill_len={prefill_len}, gamma={gamma}")
    draft.set_attn_implementation("eager")
    hq = target.config.num_attention_heads
    cache = SASCache(target)
    dcache = DynamicCache()
    key = cache_argument(target)
    logits = []
    with torch.no_grad():
        _, dcache = _draft_step(draft, ids[:, :prefill_len], dcache)
        logits.append(target(ids[:, :prefill_len], **{key: cache}, use_cache=True).logits)
        for i0 in range(prefill_len, ids.shape[1], gamma):
            blk = ids[:, i0:i0 + gamma]
            attn, dcache = _draft_step(draft, blk, dcache)
            with use_draft_scores(map_scores(attn, mapping, sparse_layers, hq)):
                logits.append(target(blk, **{key: cache}, use_cache=True).logits)
    return torch.cat(logits, 1)


# --- the mask path --------------------------------------------------------------------------------

def specattn_masks(draft_maps: Sequence[torch.Tensor], mapping: Sequence[int], layers: Sequence[int], num_heads: int,
                   num_kv_heads: int, *, p: float, prefill_len: int, gamma: int, chunk: int = 16,
                   pooled: bool = False, window: int = 0, sink: int = 0, iters: int | None = None
                   ) -> tuple[dict[int, torch.Tensor], dict[str, float]]:
    """Per sparse target layer the [B, Hkv, N, N] mask of the step-by-step run (prompt dense,
    then blocks of `gamma`; the static part: keys [0, sink) and the window (i - window, i])
    and the load statistics: `loads_skipped` (the fraction of the KV rows
    dense decoding reads that the visited 16-key chunks skip, over the decode steps and the sparse
    layers) and `keys_skipped` (the same for the attended keys themselves)."""
    full = map_scores(draft_maps, mapping, layers, num_heads)
    masks, dense, loaded, attended = {}, 0, 0, 0
    for j, a in full.items():
        b, _, n, _ = a.shape
        m = torch.ones(b * num_kv_heads, n, n, dtype=torch.bool, device=a.device).tril()
        for i0 in range(prefill_len, n, gamma):
            i1 = min(n, i0 + gamma)
            sel = select_reference(step_rows(a[:, :, i0:i1, :i1], num_kv_heads, pooled), p=p, chunk=chunk,
                                   iters=iters)
            keys = expand_chunks(sel.mask, chunk, i1)
            att = attend_mask(keys, i0, i1, sink, window)
            m[:, i0:i1, :i1] = att
            m[:, i0:i1, i1:] = False
            _, ld = visit_chunks(keys, i0, i1, sink, window, -(-i1 // 16))
            loaded += int(ld.sum())
            attended += int(att.any(1).sum())
            dense += i1 * keys.shape[0]
        masks[j] = m.reshape(b, num_kv_heads, n, n)
    stats = {"loads_skipped": 1 - loaded / dense if dense else 0.0,
             "keys_skipped": 1 - attended / dense if dense else 0.0}
    return masks, stats


class _Masks:
    current: Mapping[int, torch.Tensor] = {}


def _masked_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    g = query.shape[1] // key.shape[1]
    mask = _Masks.current.get(module.layer_idx)
    k, v = key.repeat_interleave(g, 1), value.repeat_interleave(g, 1)
    if mask is None:
        out = F.scaled_dot_product_attention(query, k, v, is_causal=True, scale=scaling)
    else:
        out = F.scaled_dot_product_attention(query, k, v, attn_mask=mask.repeat_interleave(g, 1), scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def masked_logits(model: Any, ids: torch.Tensor, masks: Mapping[int, torch.Tensor]) -> torch.Tensor:
    """One forward pass with `masks[layer]` [B, Hkv, N, N] (others dense causal), registered as
    transformers attention implementation "sas_specattn_masks"."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register("sas_specattn_masks", _masked_attention)
    AttentionMaskInterface.register("sas_specattn_masks", lambda *a, **k: None)
    before = model.config._attn_implementation
    model.set_attn_implementation("sas_specattn_masks")
    _Masks.current = masks
    try:
        with torch.no_grad():
            return model(ids, use_cache=False).logits
    finally:
        _Masks.current = {}
        model.set_attn_implementation(before)


__all__ = ["DRAFT_INPUT", "draft_scores", "map_scores", "masked_logits", "run_with_draft", "specattn_masks",
           "specattn_pattern", "use_draft_scores"]
