"""SpecAttn layer alignment (paper §3.3, Eq. 4, App. B Alg. 3): each verifier (target) layer j
reads the attention of one draft layer f(j); f is non-decreasing (draft layers may be skipped or
reused) and maximises `sum_j S[f(j), j]` with `S[i, j] = -KL(A^v_j || A^d_i)` measured over a text.

Aggregation (the paper does not say how heads and queries become one distribution): per layer
the attention rows are averaged over the heads (a mean of distributions is a distribution), the
KL is taken per query row over its keys (eps-clamped draft probabilities, 0 log 0 = 0, spec
pitfall 9: verifier first), then averaged over the rows.

The alignment is saved as JSON with the target model's name and the draft's description;
`load_alignment` for another target model or draft is an `AlignmentError` before anything runs.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import torch

from sas.errors import SASError

FORMAT = 1
EPS = 1e-8


class AlignmentError(SASError):
    """A SpecAttn alignment that is malformed, missing, or made for another model or draft."""


def mean_rows(attn: torch.Tensor) -> torch.Tensor:
    """[B, H, N, N] or [H, N, N] attention -> [rows, N] head-averaged float64 rows."""
    if attn.dim() == 3:
        attn = attn[None]
    if attn.dim() != 4:
        raise AlignmentError(f"attention maps must be [B, H, N, N] or [H, N, N], got {tuple(attn.shape)}")
    a = attn.double().mean(1)
    return a.reshape(-1, a.shape[-1])


def kl_rows(target: torch.Tensor, draft: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """Mean over rows of KL(target_row || draft_row) (rows of two [R, N] distributions)."""
    t = target.double()
    d = draft.double().clamp_min(eps)
    terms = torch.where(t > 0, t * (torch.log(t.clamp_min(1e-300)) - torch.log(d)), torch.zeros_like(t))
    return terms.sum(-1).mean()


def similarity(draft_maps: Sequence[torch.Tensor], target_maps: Sequence[torch.Tensor], eps: float = EPS) -> torch.Tensor:
    """S [n_draft, n_target] = -KL(A^v_j || A^d_i) (Eq. 4) over the same text."""
    if not draft_maps or not target_maps:
        raise AlignmentError("similarity: need at least one draft and one target attention map")
    dr = [mean_rows(a) for a in draft_maps]
    tr = [mean_rows(a) for a in target_maps]
    shape = tr[0].shape
    for name, rows in (("draft", dr), ("target", tr)):
        for i, r in enumerate(rows):
            if r.shape != shape:
                raise AlignmentError(f"similarity: {name} layer {i} has attention rows {tuple(r.shape)}, "
                                     f"target layer 0 {tuple(shape)}: both models must see the same tokens")
    s = torch.empty(len(dr), len(tr), dtype=torch.float64)
    for i, d in enumerate(dr):
        for j, t in enumerate(tr):
            s[i, j] = -kl_rows(t, d, eps)
    return s


def align(s: torch.Tensor) -> tuple[tuple[int, ...], float]:
    """The monotone map f maximising sum_j s[f(j), j] (f non-decreasing, total over the target
    layers): `dp[i, j] = s[i, j] + max_{k <= i} dp[k, j-1]` with prefix maxima, O(n_d n_v);
    ties go to the smaller draft layer. Returns (f, score)."""
    if not isinstance(s, torch.Tensor) or s.dim() != 2 or s.numel() == 0 or not torch.isfinite(s).all():
        raise AlignmentError(f"align: S must be a finite [n_draft, n_target] matrix, got "
                             f"{tuple(s.shape) if isinstance(s, torch.Tensor) else type(s).__name__}")
    s = s.double()
    nd, nv = s.shape
    dp = torch.empty(nd, nv, dtype=torch.float64)
    arg = torch.zeros(nd, nv, dtype=torch.int64)          # the k <= i taken for column j - 1
    dp[:, 0] = s[:, 0]
    for j in range(1, nv):
        best, best_k = -float("inf"), 0
        for i in range(nd):
            if dp[i, j - 1] > best:
                best, best_k = float(dp[i, j - 1]), i
            dp[i, j] = s[i, j] + best
            arg[i, j] = best_k
    i = int(torch.argmax(dp[:, nv - 1]))                 # first maximum: the smaller draft layer
    score = float(dp[i, nv - 1])
    f = [0] * nv
    for j in range(nv - 1, -1, -1):
        f[j] = i
        i = int(arg[i, j])
    return tuple(f), score


@dataclass(frozen=True)
class Alignment:
    """f (target layer -> draft layer), the S matrix, the DP score and who it was made for."""

    mapping: tuple[int, ...]
    target_model: str
    draft: str
    similarity: tuple[tuple[float, ...], ...]
    score: float
    tokens: int

    def save(self, path: str | os.PathLike) -> None:
        data = asdict(self)
        data.update(sas_method="specattn_align", format=FORMAT)
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1)


def make_alignment(draft_maps: Sequence[torch.Tensor], target_maps: Sequence[torch.Tensor], target_model: str,
                   draft: str) -> Alignment:
    s = similarity(draft_maps, target_maps)
    f, score = align(s)
    return Alignment(f, target_model, draft, tuple(tuple(float(x) for x in row) for row in s.tolist()), score,
                     int(mean_rows(target_maps[0]).shape[-1]))


def load_alignment(path: str | os.PathLike, target_model: str, draft: str | None = None,
                   num_layers: int | None = None) -> Alignment:
    """Read an alignment and check it was made for `target_model` (and `draft`, `num_layers`)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise AlignmentError(f"SpecAttn alignment {path!r} does not exist (make one with `sas align`)")
    try:
        with open(path, encoding="utf-8") as fh:
            data: dict[str, Any] = json.load(fh)
    except (OSError, ValueError) as e:
        raise AlignmentError(f"SpecAttn alignment {path!r} is not readable JSON: {e}") from None
    if not isinstance(data, dict) or data.get("sas_method") != "specattn_align" or data.get("format") != FORMAT:
        raise AlignmentError(f"{path!r} is not a SpecAttn alignment of format {FORMAT}")
    if data.get("target_model") != target_model:
        raise AlignmentError(f"SpecAttn alignment {path!r} was made for target model {data.get('target_model')!r}, "
                             f"not {target_model!r}; run `sas align` for this model")
    if draft is not None and data.get("draft") != draft:
        raise AlignmentError(f"SpecAttn alignment {path!r} was made for draft {data.get('draft')!r}, not {draft!r}")
    try:
        al = Alignment(tuple(int(x) for x in data["mapping"]), data["target_model"], data["draft"],
                       tuple(tuple(float(x) for x in row) for row in data["similarity"]), float(data["score"]),
                       int(data["tokens"]))
    except (KeyError, TypeError, ValueError) as e:
        raise AlignmentError(f"SpecAttn alignment {path!r} is incomplete: {e}") from None
    nd = len(al.similarity)
    if len(al.mapping) != len(al.similarity[0]) or any(not 0 <= i < nd for i in al.mapping) or \
            any(a > b for a, b in zip(al.mapping, al.mapping[1:])):
        raise AlignmentError(f"SpecAttn alignment {path!r}: mapping {al.mapping} is not a monotone map onto "
                             f"{nd} draft layers")
    if num_layers is not None and len(al.mapping) != num_layers:
        raise AlignmentError(f"SpecAttn alignment {path!r} maps {len(al.mapping)} target layers, the model has "
                             f"{num_layers}")
    return al


# --- models ---------------------------------------------------------------------------------------

def parse_draft_layers(text: str, num_layers: int) -> tuple[int, ...]:
    """'every:K' (layers 0, K, 2K, ...) or a comma list of distinct increasing layer indices."""
    text = text.strip()
    try:
        if text.startswith("every:"):
            k = int(text[6:])
            if k < 1:
                raise ValueError
            return tuple(range(0, num_layers, k))
        out = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise AlignmentError(f"draft layers must be 'every:K' (K >= 1) or increasing layer indices such as "
                             f"0,3,6, got {text!r}") from None
    if not out or any(not 0 <= x < num_layers for x in out) or any(a >= b for a, b in zip(out, out[1:])):
        raise AlignmentError(f"draft layers must be distinct increasing indices in [0, {num_layers}), got {text!r}")
    return out


def draft_name(layers: Sequence[int]) -> str:
    return "layers:" + ",".join(str(i) for i in layers)


def layer_subset_model(model: Any, layers: Sequence[int]) -> Any:
    """A draft made of some of `model`'s decoder layers (plus its embeddings, final norm and
    head): a deep copy whose `model.model.layers` keeps `layers`, renumbered."""
    draft = copy.deepcopy(model)
    keep = [draft.model.layers[i] for i in layers]
    draft.model.layers = torch.nn.ModuleList(keep)
    for new, layer in enumerate(keep):
        layer.self_attn.layer_idx = new
        if hasattr(layer, "layer_idx"):
            layer.layer_idx = new
    draft.config.num_hidden_layers = len(keep)
    types = getattr(draft.config, "layer_types", None)
    if isinstance(types, list) and len(types) >= max(layers) + 1:
        draft.config.layer_types = [types[i] for i in layers]
    return draft


def attention_maps(model: Any, ids: torch.Tensor) -> list[torch.Tensor]:
    """Every layer's post-softmax attention [B, H, N, N] over `ids` (eager attention)."""
    before = getattr(model.config, "_attn_implementation", None)
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(ids, output_attentions=True, use_cache=False)
    finally:
        if before is not None and before != "eager":
            model.set_attn_implementation(before)
    return [a.float() for a in out.attentions]


__all__ = ["Alignment", "AlignmentError", "align", "attention_maps", "draft_name", "kl_rows", "layer_subset_model",
           "load_alignment", "make_alignment", "mean_rows", "parse_draft_layers", "similarity"]
