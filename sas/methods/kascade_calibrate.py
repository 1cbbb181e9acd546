"""Kascade's offline calibration (paper §3.2-3.5): the cross-layer similarity of top-k sets on a
development text, the layer importance weights, the anchor dynamic program (Alg. 1) and the
KV-head remapping, all from one pass of the model over the text.

- Pooled scores, per layer l, KV head h and query tile t (`tile` tokens x G heads):
  `Pbar_t^(l,h)[j]` = post-softmax probabilities summed over the tile's rows and the G heads,
  for the keys j before the tile; `m_t^(l,h)` = the mass on the tile's own keys.
- Head similarity of layer b (head h_b) to layer a (head h_a) on tile t ([code]'s form of Eq. 3):
  `(sum_{i in I_t^(a,h_a)} Pbar_t^(b,h_b)[i] + m_t) / (sum_{i in I_t^(b,h_b)} Pbar_t^(b,h_b)[i] + m_t)`
  with `I` the top-`k` keys before the tile (k = 32 keys, [code]'s 64 minus the tile); tiles with
  no more than k earlier keys are skipped; the **min over tiles**, then the mean over windows.
- Layer similarity `S[a][b] = mean_{h_b} max_{h_a} sim` (it assumes head remapping); the head
  map of reuse layer b under anchor a is `argmax_{h_a}`.
- Weights `w_l = 1 - cos(x_l, x_l + attn_l(x_l))` (x_l the residual entering layer l), averaged
  over tokens; the DP maximises `sum_l w_l S[a(l)][l]` with layer 0 forced, `M` anchors in all.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from sas.methods.kascade import TILE, KascadeError

#: keys outside the tile in the similarity's top-k ([code]: 64 including a tile of 32)
SIM_K = 32


@dataclass(frozen=True)
class Similarity:
    """Calibration measurements: head_sim [L, L, Hkv, Hkv] (a, b, h_b, h_a; a <= b), weights [L]."""

    head_sim: torch.Tensor
    weights: torch.Tensor

    @property
    def layer_sim(self) -> torch.Tensor:
        """S[a][b] = mean over h_b of max over h_a (unweighted; 0 below the diagonal)."""
        return self.head_sim.amax(dim=3).mean(dim=2)

    @property
    def weighted(self) -> torch.Tensor:
        """S[a][b] * w_b: the DP's objective matrix."""
        return self.layer_sim * self.weights[None, :]


def tile_pooled(probs: torch.Tensor, hkv: int, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """probs [Hq, N, N] (one layer, one window) -> (Pbar [Hkv, T, N] over keys before each tile,
    other keys 0; m [Hkv, T] the mass on each tile's own keys)."""
    hq, n, _ = probs.shape
    nt = -(-n // tile)
    p = torch.nn.functional.pad(probs.double(), (0, 0, 0, nt * tile - n))
    pooled = p.view(hkv, hq // hkv, nt, tile, n).sum(dim=(1, 3))           # [Hkv, T, N]
    before = torch.arange(n)[None, :] < (torch.arange(nt) * tile)[:, None]  # [T, N]
    inside = pooled.masked_fill(before[None], 0.0).sum(-1)
    return pooled.masked_fill(~before[None], 0.0), inside


def head_similarity(pooled: Sequence[torch.Tensor], inside: Sequence[torch.Tensor], tile: int,
                    k: int = SIM_K) -> torch.Tensor:
    """[L, L, Hkv, Hkv] min-over-tiles similarity of one window (a > b entries are 0)."""
    L = len(pooled)
    hkv, nt, n = pooled[0].shape
    tiles = [t for t in range(nt) if t * tile > k]
    if not tiles:
        raise KascadeError(f"Kascade calibration: a window of {n} tokens has no query tile with more than {k} earlier "
                           f"keys; use windows longer than {k + tile} tokens")
    P = torch.stack([p[:, tiles] for p in pooled])                 # [L, H, T', N]
    m = torch.stack([x[:, tiles] for x in inside])                 # [L, H, T']
    idx = torch.topk(P, k, dim=-1).indices                         # [L, H, T', k]
    own = torch.gather(P, -1, idx).sum(-1) + m                     # [L, H, T'] denominator
    out = torch.zeros(L, L, hkv, hkv, dtype=torch.float64)
    for b in range(L):
        # Pbar of layer b (head h_b) at the top-k of every layer a (head h_a)
        pb = P[b][None, :, None].expand(L, hkv, hkv, len(tiles), n)           # [a, h_b, h_a, T', N]
        ia = idx[:, None].expand(L, hkv, hkv, len(tiles), k)
        got = torch.gather(pb, -1, ia).sum(-1) + m[b][None, :, None]          # [a, h_b, h_a, T']
        sim = (got / own[b][None, :, None]).amin(-1)
        out[: b + 1, b] = sim[: b + 1]
    return out


def capture(model: Any, ids: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """One eager forward over ids [1, N]: per-layer probabilities [Hq, N, N] and the weights w_l."""
    from sas.integrations.transformers import _attention_modules

    _, modules = _attention_modules(model)
    attn_out: dict[int, torch.Tensor] = {}
    inputs: dict[int, torch.Tensor] = {}
    hooks = []
    for i, mod in enumerate(modules):
        def pre(m, args, kwargs, i=i):           # x_l: the residual entering decoder layer l
            inputs[i] = kwargs.get("hidden_states", args[0] if args else None)

        def post(m, args, kwargs, out, i=i):     # the attention's output (after o_proj)
            attn_out[i] = out[0]
        hooks.append(mod.register_forward_hook(post, with_kwargs=True))
        parent = _decoder_layer(model, mod)
        hooks.append(parent.register_forward_pre_hook(pre, with_kwargs=True))
    old = model.config._attn_implementation
    try:
        model.set_attn_implementation("eager")
        with torch.no_grad():
            out = model(ids, output_attentions=True, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
        model.set_attn_implementation(old)
    probs = [a[0].detach().double().cpu() for a in out.attentions]
    w = []
    for i in range(len(modules)):
        x = inputs[i][0].double()
        y = x + attn_out[i][0].double()
        w.append(1.0 - torch.nn.functional.cosine_similarity(x, y, dim=-1).mean())
    return probs, torch.stack(w).cpu()


def _decoder_layer(model: Any, attn: torch.nn.Module) -> torch.nn.Module:
    for m in model.modules():
        if getattr(m, "self_attn", None) is attn:
            return m
    raise KascadeError(f"Kascade calibration: no decoder layer holds attention module {type(attn).__name__} as "
                       f"self_attn")


def measure(model: Any, ids: torch.Tensor, *, window: int = 512, tile: int = TILE, k: int = SIM_K) -> Similarity:
    """Similarity and weights over the windows of `window` tokens of ids [1, N] (mean over windows)."""
    n = ids.shape[1]
    if n < window:
        raise KascadeError(f"Kascade calibration: {n} tokens given, fewer than one window of {window}")
    hkv = int(model.config.num_key_value_heads)
    sims, ws = [], []
    for s in range(0, n - window + 1, window):
        probs, w = capture(model, ids[:, s:s + window])
        pooled, inside = zip(*(tile_pooled(p, hkv, tile) for p in probs))
        sims.append(head_similarity(pooled, inside, tile, k))
        ws.append(w)
    return Similarity(torch.stack(sims).mean(0), torch.stack(ws).mean(0))


# --- the anchor DP (Alg. 1) -----------------------------------------------------------------------

def objective(S: torch.Tensor, anchors: Sequence[int]) -> float:
    """sum_l S[a(l)][l], a(l) = the latest anchor <= l (anchors sorted, starting at 0)."""
    L = S.shape[0]
    a = sorted(anchors)
    total, cur = 0.0, a[0]
    for l in range(L):
        if l in a:
            cur = l
        total += float(S[cur, l])
    return total


def select_anchors(S: torch.Tensor, M: int) -> tuple[tuple[int, ...], float]:
    """The M anchors (layer 0 forced, counted in M) maximising `objective(S, anchors)`: the
    paper's DP in O(M L^2) with prefix sums of each anchor's row."""
    L = S.shape[0]
    if isinstance(M, bool) or not isinstance(M, int) or not 1 <= M <= L:
        raise KascadeError(f"Kascade: the number of anchors must be an integer in 1..{L} (layer 0 included), got {M!r}")
    S = S.double()
    pre = torch.zeros(L, L + 1, dtype=torch.float64)
    pre[:, 1:] = torch.cumsum(S, dim=1)

    def seg(i: int, j: int) -> float:                 # anchor i serving layers i..j-1
        return float(pre[i, j] - pre[i, i])

    NEG = float("-inf")
    dp = [[NEG] * (L + 1) for _ in range(M + 1)]
    back = [[-1] * (L + 1) for _ in range(M + 1)]
    for j in range(1, L + 1):
        dp[1][j] = seg(0, j)
    for m in range(2, M + 1):
        for j in range(m, L + 1):
            for i in range(m - 1, j):
                if dp[m - 1][i] == NEG:
                    continue
                v = dp[m - 1][i] + seg(i, j)
                if v > dp[m][j]:
                    dp[m][j], back[m][j] = v, i
    anchors, j = [], L
    for m in range(M, 1, -1):
        i = back[m][j]
        anchors.append(i)
        j = i
    anchors.append(0)
    return tuple(sorted(anchors)), dp[M][L]


def brute_force_anchors(S: torch.Tensor, M: int) -> tuple[tuple[int, ...], float]:
    """Every choice of M-1 anchors after layer 0 (the DP's check)."""
    L = S.shape[0]
    best, arg = float("-inf"), (0,)
    for rest in itertools.combinations(range(1, L), M - 1):
        a = (0,) + rest
        v = objective(S, a)
        if v > best + 1e-12:
            best, arg = v, a
    return arg, best


def evenly_spaced(L: int, M: int) -> tuple[int, ...]:
    """M anchors spread evenly from layer 0 (the comparison baseline)."""
    return tuple(sorted({(i * L) // M for i in range(M)}))


def head_maps(head_sim: torch.Tensor, anchors: Sequence[int]) -> torch.Tensor:
    """[L, Hkv] int32: reuse layer b's KV head h reads anchor a(b)'s head argmax_{h_a} sim;
    anchors map to themselves (identity)."""
    L, _, hkv, _ = head_sim.shape
    a = sorted(anchors)
    out = torch.empty(L, hkv, dtype=torch.int32)
    cur = a[0]
    for b in range(L):
        if b in a:
            cur = b
            out[b] = torch.arange(hkv, dtype=torch.int32)
        else:
            out[b] = head_sim[cur, b].argmax(dim=-1).to(torch.int32)
    return out


def calibrate(model: Any, ids: torch.Tensor, pattern: Any, model_name: str, *, anchors: int = 5, window: int = 512,
              tile: int = TILE, k: int = SIM_K, brute_limit: int = 200_000) -> Any:
    """One pass over ids [1, N]: similarity, weights, the DP's anchors (checked against brute
    force when there are at most `brute_limit` choices) and head maps, as a `KascadeState`."""
    from sas.methods.kascade_state import make_state

    L = int(model.config.num_hidden_layers)
    if isinstance(anchors, bool) or not isinstance(anchors, int) or not 1 <= anchors <= L:
        raise KascadeError(f"Kascade: the number of anchors must be an integer in 1..{L} (layer 0 included), "
                           f"got {anchors!r}")
    sim = measure(model, ids, window=window, tile=tile, k=k)
    S = sim.weighted
    chosen, value = select_anchors(S, anchors)
    check = "skipped"
    if math.comb(L - 1, anchors - 1) <= brute_limit:
        bf, bv = brute_force_anchors(S, anchors)
        if abs(bv - value) > 1e-9 * max(1.0, abs(bv)):
            raise KascadeError(f"Kascade: the anchor DP found {chosen} (value {value}) but brute force {bf} ({bv})")
        check = ",".join(str(a) for a in bf)
    return make_state(sim, chosen, pattern, model_name, value, check)


__all__ = ["SIM_K", "calibrate", "Similarity", "brute_force_anchors", "capture", "evenly_spaced", "head_maps", "head_similarity",
           "measure", "objective", "select_anchors", "tile_pooled"]
