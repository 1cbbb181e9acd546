"""Fitting Saap's state from a model's own queries and keys (`sas train`).

`capture_qk` runs the model once over a token sequence with forward hooks on each chosen
layer's `q_proj` / `k_proj` (Llama-family attention: SmolLM2, Llama): the projections' outputs
are the pre-RoPE queries and keys the paper clusters and classifies; the post-RoPE ones (which
define the attention targets) are made with the model's own rotary embedding. `train_state`
fits every layer (`sas.methods.saap.fit_layer`) with the sink and window of the pattern.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from sas.dynamic.plan import plan_dynamic
from sas.errors import SASError
from sas.lang.pattern import Pattern
from sas.methods.saap import SaapLayer, check_probes, fit_layer
from sas.methods.saap_dynamic import SHAPE_ROWS, is_partition, sink_window
from sas.methods.saap_state import SaapState, make_state


class SaapTrainError(SASError):
    """`sas train` was given a pattern, model or sizes it cannot fit Saap state for."""


@dataclass(frozen=True)
class Captured:
    q_pre: torch.Tensor    # [Hq, N, D]
    k_pre: torch.Tensor    # [Hkv, N, D]
    q_post: torch.Tensor
    k_post: torch.Tensor


def pattern_layout(pattern: Pattern, length: int) -> tuple[int, int, int]:
    """(sink, window, probes) of an `ops.partition` pattern; `SaapTrainError` for other patterns."""
    if not isinstance(pattern, Pattern) or not pattern.dynamics():
        raise SaapTrainError(f"sas train: the pattern must hold a Dynamic scored by ops.partition(...), got {pattern!r}")
    # the layout is the pattern's own, read at SHAPE_ROWS tokens at least: at `length` alone a
    # window longer than the text leaves the Dynamic nothing to select, which plan_dynamic
    # refuses before check_tokens can name the --tokens needed
    split = plan_dynamic(pattern, max_len=max(length, SHAPE_ROWS))
    if not is_partition(split):
        raise SaapTrainError(f"sas train: the pattern's Dynamic is scored by {split.dynamic.score!r}; sas train fits "
                             f"state for ops.partition(...) (Saap) only")
    sink, window = sink_window(split, length)
    probes = dict(split.dynamic.score.nodes[0].args)["probes"]
    return sink, window, probes


def check_tokens(n: int, sink: int, window: int, clusters: int) -> None:
    """`n` tokens leave keys outside every query's sink + window, and at least `clusters` keys
    after the sink to cluster; `SaapTrainError` naming the smallest `--tokens` otherwise."""
    if n - sink < clusters or n <= sink + window:
        raise SaapTrainError(f"sas train: {n} tokens are too few for {clusters} clusters with a sink of {sink} and a "
                             f"window of {window} (need more than sink + window tokens and at least sink + clusters: "
                             f"--tokens {max(sink + window + 1, sink + clusters)} or more)")


def _attention_modules(model: Any) -> list[Any]:
    try:
        return [layer.self_attn for layer in model.model.layers]
    except AttributeError:
        raise SaapTrainError(f"sas train: {type(model).__name__} is not a Llama-family model "
                             f"(model.model.layers[i].self_attn with q_proj / k_proj)") from None


def capture_qk(model: Any, input_ids: torch.Tensor, layers: Sequence[int]) -> dict[int, Captured]:
    """Pre- and post-RoPE queries and keys of `layers` for one sequence input_ids [1, N] (float32,
    on the model's device)."""
    # transformers is an optional heavy dependency: imported where a model is already loaded.
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    attn = _attention_modules(model)
    cfg = model.config
    hq = int(cfg.num_attention_heads)
    hkv = int(getattr(cfg, "num_key_value_heads", None) or hq)
    d = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // hq)
    got: dict[tuple[int, str], torch.Tensor] = {}
    hooks = []
    for i in layers:
        for name in ("q_proj", "k_proj"):
            def hook(_m, _inp, out, i=i, name=name):
                got[(i, name)] = out.detach()
            hooks.append(getattr(attn[i], name).register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(input_ids)
    finally:
        for h in hooks:
            h.remove()
    n = input_ids.shape[1]
    pos = torch.arange(n, device=input_ids.device)[None]
    out = {}
    for i in layers:
        q = got[(i, "q_proj")].view(1, n, hq, d).transpose(1, 2)
        k = got[(i, "k_proj")].view(1, n, hkv, d).transpose(1, 2)
        cos, sin = model.model.rotary_emb(q, pos)
        qp, kp = apply_rotary_pos_emb(q, k, cos, sin)
        out[i] = Captured(q[0].float(), k[0].float(), qp[0].float(), kp[0].float())
    return out


def train_state(model: Any, input_ids: torch.Tensor, pattern: Pattern, model_name: str, *, clusters: int,
                layers: Sequence[int], hidden: int = 256, steps: int = 200, lr: float = 1e-3, kmeans_iters: int = 10,
                seed: int = 0) -> SaapState:
    """Fit centroids and classifiers for `layers` from one sequence; checks everything first."""
    n = int(input_ids.shape[1])
    sink, window, probes = pattern_layout(pattern, n)
    check_probes(probes, clusters, "sas train (the pattern's probes against --clusters)")
    nlayers = len(_attention_modules(model))
    bad = [i for i in layers if not 0 <= i < nlayers]
    if bad or not layers:
        raise SaapTrainError(f"sas train: layers must be in [0, {nlayers}), got {list(layers)}")
    check_tokens(n, sink, window, clusters)
    cap = capture_qk(model, input_ids, layers)
    hkv = cap[layers[0]].k_pre.shape[0]
    out: dict[int, SaapLayer] = {}
    for i in layers:
        c = cap[i]
        out[i] = fit_layer(c.q_pre, c.k_pre, c.q_post, c.k_post, hkv, clusters, sink=sink, window=window,
                           hidden=hidden, kmeans_iters=kmeans_iters, steps=steps, lr=lr, seed=seed + 1000 * i)
    return make_state(out, pattern, model_name)


__all__ = ["Captured", "SaapTrainError", "capture_qk", "pattern_layout", "train_state"]
