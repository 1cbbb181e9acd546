"""Saap (Mazaré et al. 2025, "Inference-time sparse attention with asymmetric indexing"):
keys are partitioned by k-means, a small query classifier ranks the partitions, each decode
query attends the keys of the top-`probes` partitions plus a static sink + recent window.

This module holds the algorithm (offline fitting, the per-step selection) and the exact
PyTorch reference of selection + attention; the Triton kernel is `sas.methods.saap_triton`, the
run-time index and launches `sas.methods.saap_runtime`. Spec: /work/shared/methods/santa-saap.md
part B; docs/dynamic.md section 6.

Choices where the paper is silent or inconsistent (all documented in docs/dynamic.md):

- standard (L2) k-means with k-means++ initialisation (seeded), `iters` Lloyd steps; empty
  clusters are re-seeded with the point farthest from its centroid;
- one classifier per KV head, applied to every query head of its group (the paper does not
  say); Linear(D, H) -> BatchNorm1d(H) -> ReLU -> Linear(H, C) -> softmax, trained with the soft
  bucket-mass targets of Eq. 1 (KL(target || f) = cross-entropy with soft targets), Adam;
  at inference BatchNorm runs with its running statistics and is folded into the first linear
  layer, so the run-time classifier is four tensors `w1 [Hkv, D, H]`, `b1 [Hkv, H]`,
  `w2 [Hkv, H, C]`, `b2 [Hkv, C]`;
- GQA ranking: per KV head the SUM over its query heads (and the step's queries) of the
  classifier probabilities; one shared top-`probes` (ties to the lower bucket index);
- keys produced during decode are assigned to their nearest centroid when they are written,
  and become probe-able when they leave the window (the paper does not maintain the index
  during decode).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sas.errors import KernelError, PatternError

CLASSIFIER_PARTS = ("w1", "b1", "w2", "b2")


# --- k-means -------------------------------------------------------------------------------------

def _sq_dist(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Squared L2 distances [..., N, C] between x [..., N, D] and c [..., C, D]."""
    return (x * x).sum(-1, keepdim=True) - 2 * x @ c.transpose(-1, -2) + (c * c).sum(-1).unsqueeze(-2)


def kmeans(x: torch.Tensor, clusters: int, iters: int = 10, seed: int = 0, n_init: int = 1) -> torch.Tensor:
    """Centroids [C, D] of `x` [N, D] (float32): k-means++ initialisation from a seeded generator,
    then `iters` Lloyd iterations (L2); with `n_init` > 1 the run of lowest inertia among
    `n_init` (seeds seed, seed+1, ...). Needs N >= C."""
    if isinstance(n_init, bool) or not isinstance(n_init, int) or n_init < 1:
        raise KernelError(f"kmeans: n_init must be a positive integer, got {n_init!r}")
    if n_init > 1:
        runs = [kmeans(x, clusters, iters, seed + r) for r in range(n_init)]
        inertia = [float(_sq_dist(x.float(), c).amin(-1).sum()) for c in runs]
        return runs[min(range(n_init), key=inertia.__getitem__)]
    if x.dim() != 2:
        raise KernelError(f"kmeans: x must be [N, D], got shape {tuple(x.shape)}")
    if isinstance(clusters, bool) or not isinstance(clusters, int) or not 1 <= clusters <= x.shape[0]:
        raise KernelError(f"kmeans: clusters must be an integer in [1, N={x.shape[0]}], got {clusters!r}")
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 0:
        raise KernelError(f"kmeans: iters must be a non-negative integer, got {iters!r}")
    x = x.float()
    g = torch.Generator(device="cpu").manual_seed(seed)
    n = x.shape[0]
    first = int(torch.randint(n, (1,), generator=g))
    cent = [x[first]]
    d2 = ((x - x[first]) ** 2).sum(-1)
    for _ in range(1, clusters):
        w = d2.clamp_min(0).cpu().double()
        idx = int(torch.multinomial(w, 1, generator=g)) if float(w.sum()) > 0 else int(torch.randint(n, (1,), generator=g))
        cent.append(x[idx])
        d2 = torch.minimum(d2, ((x - x[idx]) ** 2).sum(-1))
    c = torch.stack(cent)
    for _ in range(iters):
        dist = _sq_dist(x, c)
        a = dist.argmin(-1)
        sums = torch.zeros_like(c).index_add_(0, a, x)
        counts = torch.bincount(a, minlength=clusters).to(x.dtype)
        new = sums / counts.clamp_min(1).unsqueeze(-1)
        empty = counts == 0
        if bool(empty.any()):   # re-seed empty clusters with the points farthest from their centroid
            far = dist.gather(1, a[:, None])[:, 0].argsort(descending=True)
            new[empty] = x[far[: int(empty.sum())]]
        c = new
    return c


def assign(x: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Nearest centroid (L2, ties to the lower index) of each row: x [..., N, D], centroids
    [..., C, D] -> int64 [..., N]."""
    return _sq_dist(x.float(), centroids.float()).argmin(-1)


# --- the query classifier -------------------------------------------------------------------------

class QueryClassifier(torch.nn.Module):
    """f_q: R^D -> simplex over C buckets (logits from `forward`)."""

    def __init__(self, dim: int, hidden: int, clusters: int):
        super().__init__()
        self.fc1 = torch.nn.Linear(dim, hidden)
        self.bn = torch.nn.BatchNorm1d(hidden)
        self.fc2 = torch.nn.Linear(hidden, clusters)

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.bn(self.fc1(q))))

    def folded(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(w1 [D, H], b1 [H], w2 [H, C], b2 [C]) with BatchNorm (eval mode) folded into fc1."""
        bn = self.bn
        s = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        w1 = (self.fc1.weight * s[:, None]).t()
        b1 = (self.fc1.bias - bn.running_mean) * s + bn.bias
        return (w1.detach().float().contiguous(), b1.detach().float().contiguous(),
                self.fc2.weight.t().detach().float().contiguous(), self.fc2.bias.detach().float().contiguous())


def bucket_mass(q: torch.Tensor, k: torch.Tensor, buckets: torch.Tensor, clusters: int,
                key_mask: torch.Tensor | None = None, scale: float | None = None) -> torch.Tensor:
    """Eq. 1 targets: per query the attention mass of each bucket, `(A H_k)[i, c]`, with A the
    softmax of q k^T * scale over the keys allowed by key_mask [Nq, Nk] (all if None),
    renormalised over the keys that have a bucket. q [Nq, D], k [Nk, D], buckets [Nk]."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q.float() @ k.float().t()) * scale
    if key_mask is not None:
        s = s.masked_fill(~key_mask, float("-inf"))
    a = torch.softmax(s, -1).nan_to_num(0.0)
    onehot = F.one_hot(buckets.long(), clusters).to(a.dtype)
    return a @ onehot


def train_classifier(q: torch.Tensor, targets: torch.Tensor, hidden: int = 256, steps: int = 200,
                     lr: float = 1e-3, batch: int = 256, seed: int = 0) -> QueryClassifier:
    """Fit a `QueryClassifier` on queries q [N, D] against soft targets [N, C] (rows sum to 1;
    all-zero rows are dropped): KL(target || softmax f(q)), Adam; returned in eval mode."""
    keep = targets.sum(-1) > 0
    q, targets = q[keep].float(), targets[keep].float()
    targets = targets / targets.sum(-1, keepdim=True)
    if q.shape[0] < 2:
        raise KernelError(f"train_classifier: need at least 2 queries with attention mass outside the static "
                          f"part, got {q.shape[0]}")
    torch.manual_seed(seed)
    g = torch.Generator(device="cpu").manual_seed(seed)
    clf = QueryClassifier(q.shape[1], hidden, targets.shape[1]).to(q.device)
    opt = torch.optim.Adam(clf.parameters(), lr=lr)
    clf.train()
    for _ in range(steps):
        idx = torch.randint(q.shape[0], (min(batch, q.shape[0]),), generator=g).to(q.device)
        logp = F.log_softmax(clf(q[idx]), -1)
        loss = F.kl_div(logp, targets[idx], reduction="batchmean")
        opt.zero_grad()
        loss.backward()
        opt.step()
    return clf.eval()


def classifier_probs(q: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor,
                     b2: torch.Tensor) -> torch.Tensor:
    """Folded classifier per KV head: q [B, Hkv, R, D], w1 [Hkv, D, H], b1 [Hkv, H], w2 [Hkv, H, C],
    b2 [Hkv, C] -> probabilities [B, Hkv, R, C] (float32)."""
    h = torch.relu(torch.einsum("bkrd,kdh->bkrh", q.float(), w1.float()) + b1.float()[None, :, None])
    logits = torch.einsum("bkrh,khc->bkrc", h, w2.float()) + b2.float()[None, :, None]
    return torch.softmax(logits, -1)


# --- selection -------------------------------------------------------------------------------------

def check_probes(probes: object, clusters: int, where: str = "Saap") -> int:
    if isinstance(probes, bool) or not isinstance(probes, int) or not 1 <= probes <= clusters:
        raise PatternError(f"{where}: probes must be an integer in [1, {clusters}] (the number of clusters), "
                           f"got {probes!r}")
    return probes


def group_scores(q: torch.Tensor, classifier: tuple[torch.Tensor, ...], num_kv_heads: int) -> torch.Tensor:
    """Bucket scores per KV head: the SUM over the group's query heads and the step's queries of
    the classifier probabilities. q [B, Hq, Lq, D] -> [B, Hkv, C]."""
    b, hq, lq, d = q.shape
    g = hq // num_kv_heads
    qq = q.reshape(b, num_kv_heads, g * lq, d)
    return classifier_probs(qq, *classifier).sum(2)


def probe(scores: torch.Tensor, probes: int) -> torch.Tensor:
    """The top-`probes` buckets per [B, Hkv] row of scores [B, Hkv, C] (ties to the lower bucket
    index), int64 [B, Hkv, probes]."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    return order[..., :probes]


@dataclass(frozen=True)
class SaapLayer:
    """One layer's offline state: centroids [Hkv, C, D] and the folded classifier (`CLASSIFIER_PARTS`)."""

    centroids: torch.Tensor
    w1: torch.Tensor
    b1: torch.Tensor
    w2: torch.Tensor
    b2: torch.Tensor

    @property
    def classifier(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return (self.w1, self.b1, self.w2, self.b2)

    @property
    def clusters(self) -> int:
        return self.centroids.shape[1]

    def check(self, num_kv_heads: int, head_dim: int, where: str) -> None:
        hkv, c, d = self.centroids.shape
        hidden = self.w1.shape[-1]
        want = {"centroids": (num_kv_heads, c, head_dim), "w1": (num_kv_heads, head_dim, hidden),
                "b1": (num_kv_heads, hidden), "w2": (num_kv_heads, hidden, c), "b2": (num_kv_heads, c)}
        for name, shape in want.items():
            got = tuple(getattr(self, name).shape)
            if got != shape:
                raise KernelError(f"{where}: Saap state tensor {name!r} has shape {got}, expected {shape} "
                                  f"(Hkv={num_kv_heads}, C={c}, D={head_dim}, hidden={hidden})")

    def to(self, device) -> "SaapLayer":
        return SaapLayer(*(t.to(device) for t in (self.centroids, self.w1, self.b1, self.w2, self.b2)))


def fit_layer(q_index: torch.Tensor, k_index: torch.Tensor, q_attn: torch.Tensor, k_attn: torch.Tensor,
              num_kv_heads: int, clusters: int, *, sink: int = 1, window: int = 2047, hidden: int = 256,
              kmeans_iters: int = 10, steps: int = 200, lr: float = 1e-3, seed: int = 0) -> SaapLayer:
    """Fit one layer from one sequence: `*_index` are the vectors clustered / classified (pre-RoPE,
    as the paper), `*_attn` those whose softmax defines the targets (post-RoPE); q [Hq, N, D],
    k [Hkv, N, D]. Targets use the keys outside the sink + window of each query (the paper's
    long-range training); queries with no such key are dropped."""
    hq, n, d = q_index.shape
    g = hq // num_kv_heads
    i = torch.arange(n, device=q_index.device)[:, None]
    j = torch.arange(n, device=q_index.device)[None, :]
    region = (j <= i) & (j >= sink) & (j <= i - window)
    cents, parts = [], []
    for h in range(num_kv_heads):
        ks = k_index[h, sink:]
        c = kmeans(ks, min(clusters, ks.shape[0]), kmeans_iters, seed + h)
        if c.shape[0] < clusters:
            raise KernelError(f"fit_layer: {ks.shape[0]} keys outside the sink cannot make {clusters} clusters; "
                              f"use more text or fewer clusters")
        bk = assign(k_index[h], c)
        qs, ts = [], []
        for gh in range(g):
            head = h * g + gh
            t = bucket_mass(q_attn[head], k_attn[h], bk, clusters, key_mask=region)
            qs.append(q_index[head])
            ts.append(t)
        clf = train_classifier(torch.cat(qs), torch.cat(ts), hidden, steps, lr, seed=seed + h)
        cents.append(c)
        parts.append(clf.folded())
    return SaapLayer(torch.stack(cents), *(torch.stack([p[i] for p in parts]) for i in range(4)))


# --- the exact reference ---------------------------------------------------------------------------

@dataclass(frozen=True)
class SaapReference:
    out: torch.Tensor          # [B, Hq, N, D] float64
    attended: torch.Tensor     # [B, Hkv, N, N] bool: keys each query attended (per KV head)
    looked_up: torch.Tensor    # [N, B, Hkv] int64: keys attended per step (prefill rows: their own count)


def saap_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: SaapLayer, probes: int,
                             *, sink: int = 1, window: int = 2047, prefill_len: int = 1,
                             q_index: torch.Tensor | None = None, k_index: torch.Tensor | None = None,
                             scale: float | None = None) -> SaapReference:
    """Prefill (queries [0, P) attend causally, dense) then one decode step per query: query i
    attends the sink keys [0, sink), the window (i - window, i] and every key j in between
    (sink <= j <= i - window) whose bucket (nearest centroid of k_index[j]) is among the
    top-`probes` of the group-summed classifier scores of q_index[:, :, i]. Float64, plain loops.
    q [B, Hq, N, D], k, v [B, Hkv, N, D]."""
    b, hq, n, d = q.shape
    hkv = k.shape[1]
    check_probes(probes, layer.clusters, "saap_attention_reference")
    q_index = q if q_index is None else q_index
    k_index = k if k_index is None else k_index
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    g = hq // hkv
    buckets = assign(k_index, layer.centroids[None])          # [B, Hkv, N]
    out = torch.zeros(b, hq, n, d, dtype=torch.float64)
    attended = torch.zeros(b, hkv, n, n, dtype=torch.bool)
    looked = torch.zeros(n, b, hkv, dtype=torch.int64)
    p = max(1, prefill_len)
    for i in range(n):
        j = torch.arange(n)
        causal = j <= i
        if i < p:
            allowed = causal[None, None].expand(b, hkv, n).clone()
        else:
            static = causal & ((j < sink) | (j > i - window))
            region = causal & ~static
            sc = group_scores(q_index[:, :, i:i + 1], layer.classifier, hkv)
            top = probe(sc, probes)                              # [B, Hkv, P]
            hit = (buckets[..., None] == top[:, :, None, :]).any(-1)   # [B, Hkv, N]
            allowed = static[None, None] | (region[None, None] & hit)
        attended[:, :, i] = allowed
        looked[i] = allowed.sum(-1)
        qi = q[:, :, i].double()                                  # [B, Hq, D]
        kk = k.double().repeat_interleave(g, 1)
        vv = v.double().repeat_interleave(g, 1)
        s = torch.einsum("bhd,bhnd->bhn", qi, kk) * scale
        s = s.masked_fill(~allowed.repeat_interleave(g, 1), float("-inf"))
        out[:, :, i] = torch.einsum("bhn,bhnd->bhd", torch.softmax(s, -1), vv)
    return SaapReference(out, attended, looked)


__all__ = ["CLASSIFIER_PARTS", "QueryClassifier", "SaapLayer", "SaapReference", "assign", "bucket_mass",
           "check_probes", "classifier_probs", "fit_layer", "group_scores", "kmeans", "partition_source", "probe",
           "saap_attention_reference", "train_classifier"]


def partition_source(q: torch.Tensor, k: torch.Tensor, centroids: torch.Tensor, w1: torch.Tensor,
                     b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
    """The `ops.partition` score source in the chain view: q [B, Hq, Lq, D], k [B, Hkv, Lk, D] ->
    [B, Hkv, G*Lq, Lk], entry (g*Lq + r, j) = f_q(q[g, r])[bucket(k_j)]; `.sum(dim=1)` then gives
    each key the group score of its bucket (the sum over the GQA group and the step's queries)."""
    b, hq, lq, d = q.shape
    hkv = k.shape[1]
    if hq % hkv:
        raise KernelError(f"ops.partition: {hq} query heads cannot be grouped onto {hkv} KV heads")
    SaapLayer(centroids, w1, b1, w2, b2).check(hkv, d, "ops.partition")
    buckets = assign(k, centroids[None])                                          # [B, Hkv, Lk]
    probs = classifier_probs(q.reshape(b, hkv, (hq // hkv) * lq, d), w1, b1, w2, b2)   # [B, Hkv, R, C]
    idx = buckets[:, :, None, :].expand(b, hkv, probs.shape[2], buckets.shape[-1])
    return probs.gather(3, idx)
