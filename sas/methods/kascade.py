"""Kascade (Deshmukh et al. 2025, shared/papers/kascade-anchor-reuse-attention.md): exact top-k
attention in a few *anchor* layers, whose selected key sets the other (*reuse*) layers of the
same forward step attend through a KV-head remapping, computing no scores themselves.

This module holds the semantics: the layer roles, the budget, the per-forward-step store of
published selections, and a plain PyTorch reference of every step (the specification the
Triton path in `sas.methods.kascade_runtime` is tested against). docs/kascade.md describes it.

Selection (one set per (batch, KV head) and *query group*):

- scores are the post-softmax probabilities of each query head over its whole causal row
  (each head its own normaliser), **summed** over the G query heads of the KV head (GQA
  pooling) and, in prefill, over the rows of a query tile of `tile` tokens (default 32):
  `P_t[j] = sum_{g, i in tile t} p_{g,i}[j]`;
- decode: the k keys of the largest pooled score among all N keys, `k = budget.keys(N)`;
- prefill tile t (queries [t*T, t*T+T)): the k_t = `budget.keys(t*T)` keys before the tile with
  the largest pooled score, plus the tile's own causal keys (always attended); a tile with
  k_t >= t*T attends every earlier key (dense);
- sets are sorted by descending score, ties to the lower key index;
- attention over a set is the softmax renormalised over the set (the paper's oracle top-k).

Roles: the first anchor (layer 0, the paper's rule) attends densely and publishes; other
anchors select, publish, and attend their own sets; reuse layers attend the published sets of
the latest anchor, KV head h reading the anchor's head `head_map[h]`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from sas.errors import SASError
from sas.lang.ops import Fraction

#: prefill query tile (tokens) of the paper's kernels ([code]: 32 tokens x G heads)
TILE = 32
ROLES = ("dense_anchor", "anchor", "reuse")


class KascadeError(SASError):
    """Bad Kascade input: a reuse with no publisher in the step, a head map of the wrong size,
    a budget outside (0, 1], mismatched shapes."""


def check_fraction(frac: Any, min_keys: Any, where: str) -> Fraction:
    """A `Fraction` budget from a number in (0, 1] and a minimum >= 1 (KascadeError otherwise)."""
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not (0 < frac <= 1) or math.isnan(frac):
        raise KascadeError(f"{where}: the top-k fraction must be a number in (0, 1], got {frac!r}")
    if isinstance(min_keys, bool) or not isinstance(min_keys, int) or min_keys < 1:
        raise KascadeError(f"{where}: the minimum number of keys must be an integer >= 1, got {min_keys!r}")
    return Fraction(float(frac), int(min_keys))


def check_head_map(head_map: Any, hkv: int, publisher_hkv: int | None, where: str) -> tuple[int, ...]:
    """`head_map` as a tuple of `hkv` anchor KV heads (< publisher_hkv); None = identity."""
    if head_map is None:
        head_map = tuple(range(hkv))
    if isinstance(head_map, torch.Tensor):
        head_map = tuple(int(x) for x in head_map.reshape(-1).tolist())
    if not isinstance(head_map, (tuple, list)) or not all(
            isinstance(h, int) and not isinstance(h, bool) for h in head_map):
        raise KascadeError(f"{where}: head_map must be a sequence of KV-head indices, got {head_map!r}")
    if len(head_map) != hkv:
        raise KascadeError(f"{where}: head_map has {len(head_map)} entries but the layer has {hkv} KV heads "
                           f"(one anchor head per KV head)")
    bound = publisher_hkv if publisher_hkv is not None else hkv
    bad = [h for h in head_map if not 0 <= h < bound]
    if bad:
        raise KascadeError(f"{where}: head_map entries {bad} are not KV heads of the anchor (valid: 0..{bound - 1})")
    return tuple(int(h) for h in head_map)


@dataclass(frozen=True)
class KascadeLayer:
    """What one layer does: its role, the selection name it publishes / reuses, the budget,
    the head map (reuse layers) and the prefill tile."""

    role: str
    name: str = "kascade"
    budget: Fraction = field(default_factory=lambda: Fraction(0.1, 128))
    head_map: tuple[int, ...] | None = None
    tile: int = TILE

    def __post_init__(self):
        if self.role not in ROLES:
            raise KascadeError(f"KascadeLayer(role=...) must be one of {ROLES}, got {self.role!r}")
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise KascadeError(f"KascadeLayer(name=...) must be an identifier, got {self.name!r}")
        if not isinstance(self.budget, Fraction):
            raise KascadeError(f"KascadeLayer(budget=...) must be an ops.fraction(...), got {self.budget!r}")
        check_fraction(self.budget.frac, self.budget.min_keys, "KascadeLayer(budget=...)")
        if isinstance(self.tile, bool) or not isinstance(self.tile, int) or self.tile < 1:
            raise KascadeError(f"KascadeLayer(tile=...) must be a positive integer, got {self.tile!r}")


# --- budgets per step ----------------------------------------------------------------------------

def tile_counts(n: int, tile: int, budget: Fraction) -> list[int]:
    """Prefill: keys selected for each query tile of a prompt of n tokens (the keys before
    the tile: k_t = budget.keys(t * tile), which is t * tile for a dense tile)."""
    return [budget.keys(t * tile) for t in range(-(-n // tile))]


# --- the per-forward-step store ------------------------------------------------------------------

@dataclass
class Published:
    """A selection published by an anchor layer.

    prefill: `idx` int [B, Hkv, n_tiles, kmax] (tile t uses its first `counts[t]` entries);
    decode: `idx` int [B, Hkv, kmax] (the first `counts[0]` entries). Sorted by descending score.
    """

    layer: int
    mode: str                 # "prefill" | "decode"
    length: int               # keys the step saw (N)
    idx: torch.Tensor
    counts: list[int]
    tile: int


class SelectionStore:
    """Selections published in one forward step, by name (created per forward by the
    integration and handed to every layer; the latest anchor of a name wins)."""

    def __init__(self) -> None:
        self._sets: dict[str, Published] = {}

    def publish(self, name: str, sel: Published) -> None:
        self._sets[name] = sel

    def names(self) -> list[str]:
        return sorted(self._sets)

    def get(self, name: str, *, layer: int, mode: str, length: int, batch: int) -> Published:
        """The selection `name` for a reuse layer; KascadeError if no anchor published it in this
        step or it was made for another step shape (stale)."""
        sel = self._sets.get(name)
        if sel is None:
            raise KascadeError(f"Kascade: layer {layer} reuses the selection {name!r}, but no anchor layer published "
                               f"it earlier in this forward step (published: {self.names() or 'none'}); a reuse "
                               f"layer needs an anchor (Dynamic(..., publish={name!r})) before it")
        if sel.mode != mode or sel.length != length or sel.idx.shape[0] != batch:
            raise KascadeError(f"Kascade: layer {layer} ({mode}, {length} keys, batch {batch}) cannot reuse the "
                               f"selection {name!r} of layer {sel.layer} ({sel.mode}, {sel.length} keys, batch "
                               f"{sel.idx.shape[0]}): it belongs to another step")
        return sel


def reuse_source(k: torch.Tensor, name: Any, head_map: Any) -> torch.Tensor:
    """The fx target of `ops.reuse(...)`: an index source computes no score, so calling the
    traced chain directly is an error (the keys come from the SelectionStore)."""
    raise KascadeError(f"ops.reuse({name!r}) computes no score: its keys are the selection an anchor layer "
                       f"published in the same forward step; run it through sas.integrations.kascade "
                       f"(kascade_attention) or sas.methods.kascade_runtime")


# --- reference (plain PyTorch; the specification) --------------------------------------------------

def topk_sorted(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest entries along the last axis, by descending score, ties to the
    lower index (a stable sort)."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    return order[..., :k]


def _expand(kv: torch.Tensor, g: int) -> torch.Tensor:
    return kv.repeat_interleave(g, dim=1)


def causal_probs(q: torch.Tensor, k: torch.Tensor, scale: float, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Post-softmax causal probabilities [B, Hq, Lq, N] of the last Lq positions (in `dtype`)."""
    b, hq, lq, _ = q.shape
    n = k.shape[2]
    s = torch.einsum("bhid,bhjd->bhij", q.to(dtype), _expand(k, hq // k.shape[1]).to(dtype)) * scale
    i = torch.arange(n - lq, n, device=q.device)[:, None]
    j = torch.arange(n, device=q.device)[None, :]
    s = s.masked_fill(j > i, float("-inf"))
    return torch.softmax(s, dim=-1)


def pooled_decode_scores(q: torch.Tensor, k: torch.Tensor, scale: float,
                         dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Decode: the probabilities of the query [B, Hq, 1, D] summed over each KV head's G query
    heads: [B, Hkv, N] (float64 unless `dtype` says otherwise)."""
    p = causal_probs(q, k, scale, dtype)[:, :, 0]
    b, hq, n = p.shape
    return p.view(b, k.shape[1], hq // k.shape[1], n).sum(2)


def pooled_tile_scores(q: torch.Tensor, k: torch.Tensor, scale: float, tile: int,
                       dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Prefill: per query tile t, the probabilities of its rows and G heads summed, over every
    key: [B, Hkv, n_tiles, N] (float64 unless `dtype`; only keys before the tile are candidates)."""
    p = causal_probs(q, k, scale, dtype)
    b, hq, n, _ = p.shape
    hkv = k.shape[1]
    nt = -(-n // tile)
    pad = nt * tile - n
    p = torch.nn.functional.pad(p, (0, 0, 0, pad))
    return p.view(b, hkv, hq // hkv, nt, tile, n).sum(dim=(2, 4))


def select_prefill(pooled: torch.Tensor, tile: int, budget: Fraction) -> tuple[torch.Tensor, list[int]]:
    """Per-tile sets from pooled tile scores [B, Hkv, n_tiles, N]: ([B, Hkv, n_tiles, kmax], counts)
    (one stable descending sort with the keys at or after each tile's start masked out)."""
    b, hkv, nt, n = pooled.shape
    counts = tile_counts(n, tile, budget)
    kmax = max(max(counts), 1) if counts else 1
    start = torch.arange(nt, device=pooled.device)[:, None] * tile
    cand = pooled.masked_fill(torch.arange(n, device=pooled.device)[None, :] >= start, float("-inf"))
    idx = topk_sorted(cand, kmax) if kmax <= n else torch.zeros(b, hkv, nt, kmax, dtype=torch.int64,
                                                                   device=pooled.device)
    keep = torch.arange(kmax, device=pooled.device)[None, :] < torch.tensor(counts, device=pooled.device)[:, None]
    return idx.masked_fill(~keep, 0), counts


def prefill_mask(idx: torch.Tensor, counts: Sequence[int], n: int, tile: int,
                 head_map: Sequence[int]) -> torch.Tensor:
    """The keys each query attends, [B, Hkv, N, N] bool: tile t's first counts[t] entries of
    the (head-mapped) set, plus its own causal in-tile keys."""
    b, _, nt, kmax = idx.shape
    hm = torch.as_tensor(list(head_map), device=idx.device)
    src = idx[:, hm]                                                     # [B, H, nt, kmax]
    keep = torch.arange(kmax, device=idx.device)[None, :] < torch.as_tensor(list(counts), device=idx.device)[:, None]
    sel = torch.zeros(b, len(head_map), nt, n + 1, dtype=torch.bool, device=idx.device)
    sel.scatter_(3, torch.where(keep, src, torch.full_like(src, n)), True)   # dropped entries go to column n
    rows = torch.arange(n, device=idx.device)
    mask = sel[:, :, rows // tile, :n]                                   # [B, H, N, N]
    j = rows[None, :]
    i = rows[:, None]
    return mask | ((j >= (i // tile) * tile) & (j <= i))[None, None]


def decode_mask(idx: torch.Tensor, count: int, n: int, head_map: Sequence[int]) -> torch.Tensor:
    """[B, Hkv, N] bool: the first `count` entries of the head-mapped decode set."""
    hm = torch.as_tensor(list(head_map), device=idx.device)
    src = idx[:, hm, :count]
    mask = torch.zeros(idx.shape[0], len(head_map), n, dtype=torch.bool, device=idx.device)
    return mask.scatter_(2, src, True)


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                     scale: float, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Softmax attention renormalised over `mask` [B, Hkv, Lq, N] (shared by a KV head's query
    heads), output [B, Hq, Lq, D] in `dtype` (float64 by default)."""
    hq, hkv = q.shape[1], k.shape[1]
    g = hq // hkv
    s = torch.einsum("bhid,bhjd->bhij", q.to(dtype), _expand(k, g).to(dtype)) * scale
    s = s.masked_fill(~_expand(mask, g), float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.einsum("bhij,bhjd->bhid", p, _expand(v, g).to(dtype))


def reference_prefill(layer: KascadeLayer, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      store: SelectionStore, layer_idx: int, scale: float | None = None,
                      dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """One layer's prefill (queries = keys = the whole prompt), output [B, Hq, N, D] computed in
    `dtype` (float64: the specification; float32 for evaluations); anchors publish their
    selection into `store`."""
    n, d, hkv = k.shape[2], k.shape[3], k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    t = layer.tile
    if layer.role == "reuse":
        sel = store.get(layer.name, layer=layer_idx, mode="prefill", length=n, batch=q.shape[0])
        hm = check_head_map(layer.head_map, hkv, sel.idx.shape[1], f"Kascade layer {layer_idx}")
        mask = prefill_mask(sel.idx.long().cpu(), sel.counts, n, sel.tile, hm).to(q.device)
        return masked_attention(q, k, v, mask, scale, dtype)
    pooled = pooled_tile_scores(q, k, scale, t, dtype)
    idx, counts = select_prefill(pooled.cpu(), t, layer.budget)
    store.publish(layer.name, Published(layer_idx, "prefill", n, idx.to(q.device), counts, t))
    if layer.role == "dense_anchor":
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()[None, None].expand(q.shape[0], hkv, n, n)
    else:
        mask = prefill_mask(idx, counts, n, t, tuple(range(hkv))).to(q.device)
    return masked_attention(q, k, v, mask, scale, dtype)


def reference_decode(layer: KascadeLayer, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     store: SelectionStore, layer_idx: int, scale: float | None = None,
                     dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """One layer's decode step: q [B, Hq, 1, D] at position N-1 over k, v [B, Hkv, N, D]
    (the new key included); output [B, Hq, 1, D] computed in `dtype`."""
    n, d, hkv = k.shape[2], k.shape[3], k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if layer.role == "reuse":
        sel = store.get(layer.name, layer=layer_idx, mode="decode", length=n, batch=q.shape[0])
        hm = check_head_map(layer.head_map, hkv, sel.idx.shape[1], f"Kascade layer {layer_idx}")
        mask = decode_mask(sel.idx.long(), sel.counts[0], n, hm)
        return masked_attention(q, k, v, mask[:, :, None], scale, dtype)
    c = layer.budget.keys(n)
    idx = topk_sorted(pooled_decode_scores(q, k, scale, dtype), c)
    store.publish(layer.name, Published(layer_idx, "decode", n, idx, [c], 1))
    if layer.role == "dense_anchor":
        mask = torch.ones(q.shape[0], hkv, 1, n, dtype=torch.bool, device=q.device)
    else:
        mask = decode_mask(idx, c, n, tuple(range(hkv)))[:, :, None]
    return masked_attention(q, k, v, mask, scale, dtype)


__all__ = ["KascadeError", "KascadeLayer", "Published", "SelectionStore", "TILE", "check_fraction",
           "check_head_map", "decode_mask", "masked_attention", "pooled_decode_scores", "pooled_tile_scores",
           "prefill_mask", "reference_decode", "reference_prefill", "reuse_source", "select_prefill",
           "tile_counts", "topk_sorted"]
