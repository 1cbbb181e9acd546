"""The functions that score-graph nodes call (one `call_function` node per chain operator).

They define the exact numerics of every built-in operator; backends map each of them to a
native operator (docs/dynamic.md, "Operators"). All take and return torch tensors laid out
as in the chain view: `[B, Hkv, G*Lq, Lk]` for a source, fewer axes after reductions, the
key axis always last.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sas.errors import KernelError


def fold_heads(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """`[B, Hq, Lq, Lk]` -> `[B, Hkv, G*Lq, Lk]`: the G query heads of a KV head (query head
    h uses KV head h // G, as in SDPA's enable_gqa) are stacked along the query axis, head
    major (row g*Lq + r is query r of the group's head g)."""
    b, hq, lq, lk = x.shape
    hkv = k.shape[1]
    if hq % hkv != 0:
        raise KernelError(f"score graph: {hq} query heads cannot be grouped onto {hkv} KV heads "
                          f"(Hq must be a multiple of Hkv)")
    return x.reshape(b, hkv, (hq // hkv) * lq, lk)


def attn_score(attn_probs: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The attention probabilities `[B, Hq, Lq, Lk]` in the chain view `[B, Hkv, G*Lq, Lk]`."""
    return fold_heads(attn_probs, k)


def pool_keys(x: torch.Tensor, kernel_size: int, kind: str) -> torch.Tensor:
    """Pooling along the key axis (the last), stride 1, same length.

    out[..., j] aggregates x[..., j - (kernel_size - 1) // 2 : j + kernel_size // 2 + 1]
    clipped to the valid keys: `max` over them, `avg` = their mean (positions past either end
    are not counted).
    """
    lo, hi = (kernel_size - 1) // 2, kernel_size // 2
    if kind == "max":
        padded = F.pad(x, (lo, hi), value=float("-inf"))
        return padded.unfold(-1, kernel_size, 1).amax(dim=-1)
    padded = F.pad(x, (lo, hi), value=0.0)
    ones = F.pad(torch.ones_like(x), (lo, hi), value=0.0)
    return padded.unfold(-1, kernel_size, 1).sum(dim=-1) / ones.unfold(-1, kernel_size, 1).sum(dim=-1)


def topk_mask(x: torch.Tensor, k: int) -> torch.Tensor:
    """1.0 at the `k` largest entries along the key axis, 0.0 elsewhere (all ones if k >= Lk).

    Ties go to the lower key index (a stable sort), so the result is deterministic. Used as a
    vote: accumulated over steps it counts how often a key was among the top k.
    """
    lk = x.shape[-1]
    if k >= lk:
        return torch.ones_like(x)
    order = torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :k]
    out = torch.zeros_like(x)
    return out.scatter(-1, order, 1.0)
