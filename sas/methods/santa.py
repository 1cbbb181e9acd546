"""SANTA / S2ANTA: stochastic value sampling (Lee et al., "Stochastic Sparse Attention for
Memory-Bound Inference"; spec: shared/methods/santa-saap.md, part A).

Decode attention `mu = A V` with `A = softmax(q K^T * scale)` is replaced by the unbiased
estimate `(1/S) sum_n c_n V_n`, where the integer counts `c_n` (summing to S per query head)
come from S draws from `A`:

- `multinomial` (SANTA): S i.i.d. draws, `t_m ~ U[0, 1)`;
- `stratified` (S2ANTA-strat): `t_m = (m + U_m) / S`, one uniform per stratum;
- `systematic` (S2ANTA-sys): `t_m = (m + U) / S`, ONE uniform per query head;

each draw picks the key `j` with `F(j-1) <= t < F(j)` (F the CDF in key order, so zero-mass keys
are never drawn). Systematic counts equal the "count form" of the paper's kernels
(`count_form`): with `x_n = S p_n` and prefix `P_n`, `c_n = floor(a0 + P_n) - floor(a0 + P_n - x_n)`,
so every count is `floor(S p_n)` or `ceil(S p_n)`.

This module holds the plain PyTorch specification: the samplers, the random source
(`SantaRandom`), the per-tile budget rules of the two kernels (`tile_budgets`), float64
references of the prop and flash kernels for given uniforms (`prop_reference`,
`flash_reference`), the paper's Bernoulli ternary-query estimator of `q K^T`
(`bernoulli_query`), and `composed_reference` (a step with an exact static part beside the
sampled keys, for given draws). The Triton
kernels are `sas.methods.santa_triton`, their host side `sas.methods.santa_runtime`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sas.errors import KernelError, PatternError

METHODS = ("multinomial", "stratified", "systematic")
STRATEGIES = ("prop", "flash", "torch")
ALLOCS = ("global_sys", "largest_remainder")
ESTIMATORS = ("exact", "bernoulli")
GROUPS = ("mean", "head")
DEFAULT_SEED = 0


# --- argument checks -----------------------------------------------------------------------------

def check_samples(n: Any, where: str, error: type = PatternError) -> int:
    """S, the number of draws per query head: a positive integer."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise error(f"{where}: the number of samples n (S) must be a positive integer, got {n!r}")
    return n


def check_choice(value: Any, valid: tuple[str, ...], name: str, where: str, error: type = PatternError) -> str:
    if not isinstance(value, str) or value not in valid:
        raise error(f"{where}: {name} must be one of {', '.join(map(repr, valid))}, got {value!r}")
    return value


def check_seed(seed: Any, where: str, error: type = PatternError) -> int | None:
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise error(f"{where}: seed must be None or an integer >= 0, got {seed!r}")
    return seed


# --- the random source ----------------------------------------------------------------------------

class SantaRandom:
    """Where SANTA's uniforms come from: a seeded `torch.Generator` per device (`seed`), or the
    caller's `generator`, or torch's global generator (`seed=None, generator=None`; needed to
    capture a step in a CUDA graph). Each call draws fresh numbers, so successive decode steps
    sample anew; `reset()` rewinds a seeded source (the same seed gives the same draws again)."""

    def __init__(self, seed: int | None = DEFAULT_SEED, generator: torch.Generator | None = None):
        self.seed = check_seed(seed, "SantaRandom", KernelError)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise KernelError(f"SantaRandom: generator must be a torch.Generator, got {type(generator).__name__}")
        if generator is not None and seed not in (None, DEFAULT_SEED):
            raise KernelError("SantaRandom: give a seed or a generator, not both")
        self.generator = generator
        self._gens: dict[str, torch.Generator] = {}
        self.draws = 0          # calls so far (a step counter)

    def reset(self) -> None:
        self._gens.clear()
        self.draws = 0

    def for_layer(self, layer: int) -> SantaRandom:
        """The source of model layer `layer` (spec P6: fresh draws per layer as per step): a
        seeded source gives each layer a seed of its own, derived from (seed, layer) by numpy's
        `SeedSequence` (layer 0 keeps the seed itself); the caller's generator or torch's global
        one is shared, and successive layers draw successive numbers from it."""
        if self.generator is not None or self.seed is None or layer == 0:
            return self
        seed = int(np.random.SeedSequence([self.seed, int(layer)]).generate_state(1, dtype=np.uint64)[0] >> 1)
        return SantaRandom(seed)

    def _generator(self, device: torch.device) -> torch.Generator | None:
        if self.generator is not None:
            return self.generator
        if self.seed is None:
            return None
        key = str(device)
        if key not in self._gens:
            g = torch.Generator(device=device)
            g.manual_seed(self.seed)
            self._gens[key] = g
        return self._gens[key]

    def uniform(self, shape: tuple[int, ...], device: Any = "cpu") -> torch.Tensor:
        """fp32 uniforms in [0, 1) of `shape`."""
        device = torch.device(device)
        self.draws += 1
        return torch.rand(shape, generator=self._generator(device), device=device, dtype=torch.float32)

    def __repr__(self) -> str:
        src = "generator" if self.generator is not None else f"seed={self.seed}"
        return f"SantaRandom({src})"


def uniforms_shape(method: str, rows: tuple[int, ...], n: int) -> tuple[int, ...]:
    """The uniforms one estimate needs: one per query head (systematic), else one per draw."""
    return (*rows, 1) if method == "systematic" else (*rows, n)


# --- the samplers (section 2 of the paper) -----------------------------------------------------------

def draw_points(method: str, u: torch.Tensor, n: int) -> torch.Tensor:
    """The n points t in [0, 1) of one query head's draws, from its uniforms `u [..., 1 | n]`."""
    m = torch.arange(n, device=u.device, dtype=torch.float64)
    u = u.to(torch.float64)
    if method == "multinomial":
        return u
    if method == "stratified":
        return (m + u) / n
    return (m + u[..., :1]) / n


def sample_counts(p: torch.Tensor, n: int, method: str, u: torch.Tensor) -> torch.Tensor:
    """Counts `c [..., Lk]` (int64, summing to n over the keys) of n draws from the rows of `p`
    (probabilities over the last axis, each row summing to 1) by inverse CDF at the points of
    `draw_points`; `u` holds the uniforms (`uniforms_shape`)."""
    check_samples(n, "sample_counts", KernelError)
    check_choice(method, METHODS, "method", "sample_counts", KernelError)
    want = uniforms_shape(method, tuple(p.shape[:-1]), n)
    if tuple(u.shape) != want:
        raise KernelError(f"sample_counts: u must be {want} for method {method!r}, got {tuple(u.shape)}")
    p64 = p.to(torch.float64).clamp_min(0)
    cdf = p64.cumsum(-1)
    cdf = cdf / cdf[..., -1:].clamp_min(1e-300)
    t = draw_points(method, u, n).contiguous()
    idx = torch.searchsorted(cdf.contiguous(), t, right=True).clamp_max(p.shape[-1] - 1)
    counts = torch.zeros(p.shape, dtype=torch.int64, device=p.device)
    counts.scatter_add_(-1, idx, torch.ones_like(idx))
    return counts


def count_form(x: torch.Tensor, a0: torch.Tensor) -> torch.Tensor:
    """The kernels' systematic counts (paper App. P, Alg. 5) over the last axis:
    `c_n = floor(a0 + P_n) - floor(a0 + P_n - x_n)`, `P_n` the inclusive prefix sum of `x`
    (sample units, x >= 0) and `a0 [..., 1]` the offset. Computed in x's dtype."""
    p_inc = x.cumsum(-1)
    return (torch.floor(a0 + p_inc) - torch.floor(a0 + (p_inc - x))).to(torch.int64)


def estimate(counts: torch.Tensor, v: torch.Tensor, n: int | torch.Tensor) -> torch.Tensor:
    """`(1/n) sum_j c_j v_j` per query head: counts [B, Hq, Lk], v [B, Hkv, Lk, D] -> [B, Hq, D]
    (query head h reads KV head h // (Hq / Hkv))."""
    b, hq, lk = counts.shape
    hkv = v.shape[1]
    c = counts.to(torch.float64).reshape(b, hkv, hq // hkv, lk)
    out = torch.einsum("bgxk,bgkd->bgxd", c, v.to(torch.float64)).reshape(b, hq, -1)
    n = n if isinstance(n, torch.Tensor) else torch.tensor(float(n), dtype=torch.float64)
    return out / n.to(torch.float64)


def exact_moments(p: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact mean `mu = p V` and `tr(Sigma_q)`-style per-coordinate variance of ONE draw,
    `sum_j p_j v_j^2 - mu^2` (the multinomial estimator's variance is this over S).
    p [..., Lk], v [Lk, D] -> ([..., D], [..., D])."""
    p64, v64 = p.to(torch.float64), v.to(torch.float64)
    mu = p64 @ v64
    return mu, p64 @ (v64 * v64) - mu * mu


# --- scores ------------------------------------------------------------------------------------------

def group_query(q: torch.Tensor, hkv: int) -> torch.Tensor:
    """[B, Hq, D] -> [B, Hkv, G, D]."""
    b, hq, d = q.shape
    if hq % hkv:
        raise KernelError(f"SANTA: {hq} query heads cannot be grouped onto {hkv} KV heads")
    return q.reshape(b, hkv, hq // hkv, d)


def bernoulli_query(q: torch.Tensor, hkv: int, samples: int, group: str, u: torch.Tensor) -> torch.Tensor:
    """The paper's Bernoulli ternary-query estimate of q (section 5, Eq. 8-13), unbiased:
    `E[q_hat] = q`, so `q_hat K^T` is an unbiased estimate of `q K^T` read from the K columns
    with a nonzero entry only.

    - `group="head"` (Eq. 8/9): per head, `norm = max_i |q_i|`, `b_i ~ Bernoulli(|q_i| / norm)`
      drawn `samples` (B) times, `q_hat = norm / B * sum_n b^(n) * sign(q)`;
    - `group="mean"` (Eq. 10-13, the paper's GQA default): `m = mean_g |q_g|` over the group,
      `b_i ~ Bernoulli(m_i / norm)`, `m_hat = norm / B * sum_n b^(n)`, `q_hat_g = m_hat * q_g / m`
      (one feature set per KV head).

    q [B, Hq, D]; u [B, Hq | Hkv, B, D] uniforms (b = [u < prob]). Returns q_hat [B, Hq, D] in fp32.
    """
    check_samples(samples, "bernoulli_query(samples)", KernelError)
    check_choice(group, GROUPS, "group", "bernoulli_query", KernelError)
    qg = group_query(q.to(torch.float32), hkv)                          # [B, Hkv, G, D]
    if group == "head":
        a = qg.abs()
        norm = a.amax(-1, keepdim=True).clamp_min(1e-30)
        bits = (u.reshape(*qg.shape[:3], samples, qg.shape[-1]) < (a / norm)[..., None, :]).float()
        return (norm / samples * bits.sum(-2) * torch.sign(qg)).reshape(q.shape)
    m = qg.abs().mean(2)                                                # [B, Hkv, D]
    norm = m.amax(-1, keepdim=True).clamp_min(1e-30)
    bits = (u.reshape(*m.shape[:2], samples, m.shape[-1]) < (m / norm)[..., None, :]).float()
    m_hat = norm / samples * bits.sum(-2)                               # [B, Hkv, D]
    ratio = torch.where(m > 0, m_hat / m.clamp_min(1e-30), torch.zeros_like(m))
    return (qg * ratio[:, :, None, :]).reshape(q.shape)


def bernoulli_uniform_shape(q_shape: tuple[int, ...], hkv: int, samples: int, group: str) -> tuple[int, ...]:
    b, hq, d = q_shape
    return (b, hq if group == "head" else hkv, samples, d)


def probabilities(q: torch.Tensor, k: torch.Tensor, valid: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Post-softmax attention `[B, Hq, Lk]` (float64) of queries q [B, Hq, D] over k [B, Hkv, Lk, D];
    `valid [Lk]` bool (None: every key)."""
    hkv = k.shape[1]
    qg = group_query(q.to(torch.float64), hkv)
    s = torch.einsum("bhgd,bhkd->bhgk", qg, k.to(torch.float64)) * scale
    if valid is not None:
        s = s.masked_fill(~valid.to(s.device), float("-inf"))
    return torch.softmax(s, -1).reshape(q.shape[0], q.shape[1], k.shape[2])


def expected_draws(probs: torch.Tensor, n: int) -> torch.Tensor:
    """The score-graph stand-in of `.sample(n)`: expected draws per key and KV head,
    `n * sum(p)` over the chain view's (group head, query) axis: [B, Hkv, G*Lq, Lk] -> [B, Hkv, Lk]."""
    return probs.sum(dim=2) * n


# --- per-tile budgets (the two kernels' rules) ---------------------------------------------------------

@dataclass(frozen=True)
class TileBudgets:
    """Per (query head, tile): `inv` maps the tile's stashed `u_n = exp(s_n - m_t)` to sample units
    `x_n = inv * u_n`, `offset` is the count form's `a0`, `samples` the tile's number of draws."""

    inv: torch.Tensor
    offset: torch.Tensor
    samples: torch.Tensor


def tile_weights(m_t: torch.Tensor, l_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(m*, W_t = exp(m_t - m*) l_t, Z) from tile maxima m_t and sums l_t (natural-log domain;
    empty tiles have l_t = 0)."""
    live = l_t > 0
    m = torch.where(live, m_t, torch.full_like(m_t, float("-inf")))
    mstar = m.amax(-1, keepdim=True)
    w = torch.where(live, torch.exp(m - mstar) * l_t, torch.zeros_like(l_t))
    return mstar, w, w.sum(-1, keepdim=True)


def tile_budgets(m_t: torch.Tensor, l_t: torch.Tensor, n: int, alloc: str, u: torch.Tensor) -> TileBudgets:
    """prop's budgets (float64). `alloc="global_sys"` (default, unbiased): one uniform per head
    `u [..., 1]`; tile t gets the global systematic sample's share, offset frac(u + C_{t-1}) with
    `C_t = S sum_{t' <= t} W_t' / Z`, and `inv = S exp(m_t - m*) / Z` (so x_n = S p_n exactly): the
    whole step is S2ANTA-sys over every key, `samples_t` in {floor(S W_t/Z), ceil(S W_t/Z)}.
    `alloc="largest_remainder"` (the paper's kernels, biased: spec pitfall P3): `S_t` = floor of
    `S W_t / Z` plus one for the largest remainders (ties: lower tile), `inv = S_t / l_t`,
    `u [..., T]` one offset per tile; tile t's draws follow its own softmax, so each tile weighs
    `S_t / S` instead of `W_t / Z`."""
    m64, l64 = m_t.to(torch.float64), l_t.to(torch.float64)
    mstar, w, z = tile_weights(m64, l64)
    live = l64 > 0
    if alloc == "global_sys":
        share = n * w / z
        c_inc = share.cumsum(-1)
        c_exc = c_inc - share
        a0 = u.to(torch.float64)
        offset = torch.frac(a0 + c_exc)
        samples = torch.floor(a0 + c_inc) - torch.floor(a0 + c_exc)
        inv = torch.where(live, n * torch.exp(m64 - mstar) / z, torch.zeros_like(m64))
        return TileBudgets(inv, offset, samples.to(torch.int64))
    q = n * w / z
    base = torch.floor(q)
    rem = (n - base.sum(-1, keepdim=True)).to(torch.int64)
    frac = torch.where(live, q - base, torch.full_like(q, -1.0))
    t = q.shape[-1]
    order = torch.sort(frac, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(t, device=q.device).expand_as(order))
    samples = (base + (rank < rem).to(base.dtype)).to(torch.int64)
    inv = torch.where(live & (samples > 0), samples.to(torch.float64) / l64.clamp_min(1e-300),
                      torch.zeros_like(l64))
    return TileBudgets(inv, u.to(torch.float64), samples)


def flash_tile_samples(n: int, tiles: int) -> int:
    """flash's uniform per-tile budget: max(1, floor(S / T)) (the released code)."""
    return max(1, n // tiles)


# --- float64 references of the kernels ---------------------------------------------------------------

def _tile_scores(q, k, valid, scale, tile):
    """Scores [B, Hq, T, tile] (padded with -inf), tile maxima m_t and u = exp(s - m_t)."""
    b, hq, _ = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    qg = group_query(q.to(torch.float64), hkv)
    s = torch.einsum("bhgd,bhkd->bhgk", qg, k.to(torch.float64)).reshape(b, hq, lk) * scale
    ok = torch.ones(lk, dtype=torch.bool, device=q.device) if valid is None else valid.to(q.device)
    s = s.masked_fill(~ok, float("-inf"))
    t = max(1, math.ceil(lk / tile))
    s = torch.nn.functional.pad(s, (0, t * tile - lk), value=float("-inf")).reshape(b, hq, t, tile)
    m_t = s.amax(-1)
    m_safe = torch.where(torch.isfinite(m_t), m_t, torch.zeros_like(m_t))
    u = torch.exp(s - m_safe[..., None])
    return s, m_t, u, t


def prop_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n: int, u: torch.Tensor, *,
                   alloc: str = "global_sys", tile: int = 256, valid: torch.Tensor | None = None,
                   scale: float | None = None, stash_dtype: torch.dtype | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """S2ANTA-prop for one decode query per head: q [B, Hq, D], k, v [B, Hkv, Lk, D];
    `u [B, Hq, 1]` (global_sys) or `[B, Hq, T]` (largest_remainder). Returns (out [B, Hq, D]
    float64, counts [B, Hq, Lk]). `stash_dtype` rounds u as the kernel's stash does."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    b, hq, _ = q.shape
    lk = k.shape[2]
    _, m_t, ut, t = _tile_scores(q, k, valid, scale, tile)
    if stash_dtype is not None:
        ut = ut.to(stash_dtype).to(torch.float64)
    l_t = ut.sum(-1)
    bud = tile_budgets(m_t, l_t, n, alloc, u)
    x = bud.inv[..., None] * ut
    counts = count_form(x, bud.offset[..., None]).reshape(b, hq, t * tile)[..., :lk]
    return estimate(counts, v, n), counts


def flash_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n: int, u: torch.Tensor, *,
                    tile: int = 256, valid: torch.Tensor | None = None, scale: float | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """S2ANTA-flash: per tile, S_tile = max(1, S // T) systematic draws from the tile's own
    softmax (offset `u [B, Hq, T]`), tile estimate `sum c V / S_tile`, merged with the exact tile
    weights `W_t / Z` (unbiased). Returns (out [B, Hq, D] float64, counts [B, Hq, Lk])."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    b, hq, _ = q.shape
    hkv, lk, d = k.shape[1], k.shape[2], v.shape[-1]
    _, m_t, ut, t = _tile_scores(q, k, valid, scale, tile)
    l_t = ut.sum(-1)
    st = flash_tile_samples(n, t)
    x = st * ut / l_t.clamp_min(1e-300)[..., None]
    counts = count_form(x, u.to(torch.float64)[..., None])                        # [B, Hq, T, tile]
    vp = torch.nn.functional.pad(v.to(torch.float64), (0, 0, 0, t * tile - lk)).reshape(b, hkv, t, tile, d)
    c = counts.to(torch.float64).reshape(b, hkv, hq // hkv, t, tile)
    o_t = torch.einsum("bhgtk,bhtkd->bhgtd", c, vp).reshape(b, hq, t, d) / st
    _, w, z = tile_weights(m_t, l_t)
    out = (w[..., None] * o_t).sum(-2) / z
    return out, counts.reshape(b, hq, t * tile)[..., :lk]


def composed_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, counts: torch.Tensor, n: int,
                       static: torch.Tensor, region: torch.Tensor, *, strategy: str = "prop", tile: int = 256,
                       scale: float | None = None) -> torch.Tensor:
    """float64 output of a decode step with an exact static part, for given draws: keys with
    `static [Lk]` (bool) are attended exactly, the draws `counts [B, Hq, Lk]` lie on `region [Lk]`
    (disjoint from static) and `out = (Z_s O_s + Z_d O_d) / (Z_s + Z_d)` with O_s the exact
    attention over the static keys, Z the exact row sums (softmax denominators) of the two parts
    and O_d the estimator of the draws: `(1/S) sum c V` (prop, torch), or flash's
    `sum_t W_t / Z_d sum_{n in t} c_n V_n / S_tile` (tiles of `tile` keys). q [B, Hq, D], k, v
    [B, Hkv, Lk, D] -> [B, Hq, D]."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    b, hq, _ = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    qg = group_query(q.to(torch.float64), hkv)
    s = (torch.einsum("bhgd,bhkd->bhgk", qg, k.to(torch.float64)) * scale).reshape(b, hq, lk)
    st, rg = static.to(torch.bool).to(q.device), region.to(torch.bool).to(q.device)
    s_s, s_d = s.masked_fill(~st, float("-inf")), s.masked_fill(~rg, float("-inf"))
    lse_s, lse_d = torch.logsumexp(s_s, -1), torch.logsumexp(s_d, -1)
    f64 = {"dtype": torch.float64, "device": q.device}
    o_s = estimate(torch.softmax(s_s, -1), v, 1) if st.any() else torch.zeros(b, hq, v.shape[-1], **f64)
    if not rg.any():
        return o_s
    if strategy == "flash":
        t = max(1, math.ceil(lk / tile))
        tile_of = torch.arange(lk, device=q.device) // tile
        p_d = torch.softmax(s_d, -1)                                    # p_n = W_t(n) / Z_d * u_n / l_t(n)
        w_t = torch.zeros(b, hq, t, **f64).index_add_(-1, tile_of, p_d)                    # W_t / Z_d
        o_d = estimate(counts.to(torch.float64) * w_t[..., tile_of], v, flash_tile_samples(n, t))
    else:
        o_d = estimate(counts, v, n)
    w_s = torch.sigmoid(lse_s - lse_d)[..., None] if st.any() else torch.zeros(b, hq, 1, **f64)
    return w_s * o_s + (1 - w_s) * o_d


def torch_sample(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n: int, method: str, u: torch.Tensor, *,
                 valid: torch.Tensor | None = None, scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The paper's section 2 estimators over the exact softmax (no tiles): (out, counts)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    p = probabilities(q, k, valid, scale)
    counts = sample_counts(p, n, method, u)
    return estimate(counts, v, n), counts


__all__ = ["ALLOCS", "DEFAULT_SEED", "ESTIMATORS", "GROUPS", "METHODS", "STRATEGIES", "SantaRandom",
           "TileBudgets", "bernoulli_query", "bernoulli_uniform_shape", "check_choice", "check_samples",
           "check_seed", "composed_reference", "count_form", "draw_points", "estimate", "exact_moments", "expected_draws", "flash_reference",
           "flash_tile_samples", "group_query", "probabilities", "prop_reference", "sample_counts",
           "tile_budgets", "tile_weights", "torch_sample", "uniforms_shape"]
