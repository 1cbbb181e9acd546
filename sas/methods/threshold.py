"""Threshold selection shared by top-p (SpecAttn) and top-k (Kascade): the keys whose score is
at least a threshold θ, with θ chosen per row so that the kept keys hold mass p of the row
(top-p) or number at least k (top-k). Spec: /work/shared/methods/kascade-specattn.md §2.1, §2.5, §3.

This module is the definition (plain PyTorch, sort-based, float64) that the sorting-free Triton
kernel (`sas.methods.threshold_triton`) is tested against, plus the argument checks both share.

Input layout: `scores [M, R, P, N]`

- `M` output rows (e.g. batch x KV head, or batch x query head);
- `R` rows whose selections are **unioned** (SpecAttn's γ speculative steps);
- `P` rows that are **pooled** (summed) before selecting (the query heads of a GQA group; 1
  for a per-head selection);
- `N` keys. With `chunk > 1` the keys are grouped in chunks of `chunk` consecutive keys (the
  last one may be short) and a chunk's score is the SUM of its keys' scores: chunk top-p keeps
  the fewest chunks holding mass p (Quest / SpecAttn chunk 16).

Per (m, r) the pooled row `y = sum_p x[m, r, p]` (chunked) is selected:

- top-p (`p` in (0, 1]): `target = p * sum(max(y, 0))`; θ = the largest value v of y with
  `sum(max(y, 0)[y >= v]) >= target`; kept = `{y >= θ}`. This is the sorted nucleus (the
  shortest prefix of y sorted descending reaching the target) **with all ties of its last value**,
  so it always keeps at least mass p. Negative scores count as 0 mass. `p = 1` keeps every
  entry (the dense selection; not the nucleus, which would drop zero-mass keys).
- top-k (`k >= 1`): θ = the k-th largest value of y; kept = `{y >= θ}` (exactly the
  `torch.topk` set when the k-th value is unique; all its ties otherwise; everything when
  k >= number of entries).
- the paper's Algorithm 2 with a fixed number of iterations (`iters`, top-p only): value
  bisection on [0, max(y)]; the kept set is `{y >= θ_low}`, the last threshold that still held
  the target (the paper returns `{y >= θ_mid}`, which can fall short of p, spec pitfall 1): a
  superset of the nucleus whose extras lie in [θ_low, θ*).

The mask `[M, ceil(N / chunk)]` is the union over r of the kept sets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from sas.errors import KernelError, PatternError

#: SpecAttn / Quest chunk size
CHUNK = 16


def check_p(p: object, where: str, error: type = KernelError) -> float:
    """p must be a real number in (0, 1]."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not (0.0 < float(p) <= 1.0) or math.isnan(float(p)):
        raise error(f"{where}: p must be a number in (0, 1] (the attention mass to keep), got {p!r}")
    return float(p)


def check_k(k: object, where: str, error: type = KernelError) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise error(f"{where}: k must be a positive integer (keys to keep), got {k!r}")
    return k


def check_chunk(chunk: object, where: str, error: type = KernelError) -> int:
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise error(f"{where}: chunk must be a positive integer (1 = token granularity, 16 = SpecAttn's chunks), "
                    f"got {chunk!r}")
    return chunk


def check_iters(iters: object, where: str, error: type = KernelError) -> int | None:
    if iters is None:
        return None
    if isinstance(iters, bool) or not isinstance(iters, int) or not 1 <= iters <= 64:
        raise error(f"{where}: iters must be None (exact threshold) or an integer in [1, 64] (the paper's fixed "
                    f"bisection, 10 in the paper), got {iters!r}")
    return iters


def check_request(p: object, k: object, chunk: object, iters: object, where: str,
                  error: type = KernelError) -> tuple[float | None, int | None, int, int | None]:
    """Exactly one of p (top-p) and k (top-k); iters only with p."""
    if (p is None) == (k is None):
        raise error(f"{where}: give exactly one of p= (top-p) and k= (top-k), got p={p!r}, k={k!r}")
    pp = check_p(p, where, error) if p is not None else None
    kk = check_k(k, where, error) if k is not None else None
    it = check_iters(iters, where, error)
    if it is not None and kk is not None:
        raise error(f"{where}: iters= (the paper's fixed bisection) applies to top-p only; top-k is exact")
    return pp, kk, check_chunk(chunk, where, error), it


def check_scores(scores: object, where: str) -> torch.Tensor:
    if not isinstance(scores, torch.Tensor) or scores.dim() != 4 or not scores.is_floating_point():
        got = f"{tuple(scores.shape)} {scores.dtype}" if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise KernelError(f"{where}: scores must be a floating-point tensor [M, R, P, N] (rows, unioned rows, "
                          f"pooled rows, keys), got {got}")
    if scores.shape[-1] < 1 or scores.numel() == 0:
        raise KernelError(f"{where}: scores must hold at least one key and one row, got {tuple(scores.shape)}")
    return scores


def pool(scores: torch.Tensor, chunk: int) -> torch.Tensor:
    """[M, R, P, N] -> [M, R, ceil(N / chunk)] float64: summed over P and over each chunk."""
    x = scores.double().sum(2)
    n = x.shape[-1]
    nc = -(-n // chunk)
    x = torch.nn.functional.pad(x, (0, nc * chunk - n))
    return x.reshape(*x.shape[:-1], nc, chunk).sum(-1)


@dataclass(frozen=True)
class Selection:
    """A threshold selection: `mask [M, Nc]` bool (union over R), `theta [M, R]` the thresholds
    (float32 on the kernel path), `kept [M, R]` how many entries each (m, r) kept (before the union)."""

    mask: torch.Tensor
    theta: torch.Tensor
    kept: torch.Tensor


def _theta_sorted(y: torch.Tensor, p: float | None, k: int | None) -> torch.Tensor:
    """θ per row of y [..., Nc] from the sorted row."""
    s = torch.sort(y, dim=-1, descending=True).values
    nc = y.shape[-1]
    if k is not None:
        return s[..., min(k, nc) - 1]
    w = s.clamp_min(0)
    target = p * w.sum(-1, keepdim=True)
    cum = w.cumsum(-1)
    # first position whose prefix mass reaches the target (the nucleus' last entry)
    idx = (cum < target).sum(-1, keepdim=True).clamp_max(nc - 1)
    return s.gather(-1, idx)[..., 0]


def _theta_bisect(y: torch.Tensor, p: float, iters: int) -> torch.Tensor:
    """The paper's Algorithm 2 with θ_low kept (spec pitfall 1)."""
    w = y.clamp_min(0)
    target = p * w.sum(-1)
    lo = torch.zeros_like(target)
    hi = y.amax(-1)
    for _ in range(iters):
        mid = (lo + hi) / 2
        mass = torch.where(y >= mid[..., None], w, torch.zeros_like(w)).sum(-1)
        short = mass < target
        hi = torch.where(short, mid, hi)
        lo = torch.where(short, lo, mid)
    return lo


def select_reference(scores: torch.Tensor, *, p: float | None = None, k: int | None = None, chunk: int = 1,
                     iters: int | None = None) -> Selection:
    """The selection of the module docstring, in float64 (sort-based unless `iters`)."""
    where = "select_reference"
    p, k, chunk, iters = check_request(p, k, chunk, iters, where)
    scores = check_scores(scores, where)
    y = pool(scores, chunk)                               # [M, R, Nc]
    if p == 1.0:                                          # keep every entry (dense)
        theta = y.amin(-1)
    else:
        theta = _theta_bisect(y, p, iters) if iters is not None else _theta_sorted(y, p, k)
    keep = y >= theta[..., None]
    return Selection(keep.any(1), theta, keep.sum(-1))


def kept_mass(scores: torch.Tensor, keep: torch.Tensor, chunk: int = 1) -> torch.Tensor:
    """Fraction of each (m, r) pooled row's mass held by `keep [M, Nc]` (float64 [M, R])."""
    y = pool(scores, chunk).clamp_min(0)
    tot = y.sum(-1)
    got = torch.where(keep[:, None, :], y, torch.zeros_like(y)).sum(-1)
    return torch.where(tot > 0, got / torch.where(tot > 0, tot, torch.ones_like(tot)), torch.ones_like(tot))


def expand_chunks(mask: torch.Tensor, chunk: int, n: int) -> torch.Tensor:
    """A chunk mask [..., Nc] as a key mask [..., n]."""
    return mask.repeat_interleave(chunk, dim=-1)[..., :n]


__all__ = ["CHUNK", "Selection", "check_chunk", "check_iters", "check_k", "check_p", "check_request",
           "check_scores", "expand_chunks", "kept_mass", "pool", "select_reference"]
