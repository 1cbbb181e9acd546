"""Saap at run time: the bucket index beside the KV cache and the decode launches.

`SaapDecoder` keeps, per (batch, KV head), the whole K/V cache (Saap cuts lookups, not the
cache), the bucket of every key (its nearest centroid, assigned when the key is written, from
its pre-RoPE vector when one is given) and a CSR index over the keys that have left the
window: `off [B, Hkv, C+1]`, `idx [B, Hkv, N]` (key ids grouped by bucket). The index is
rebuilt every `rebuild_every` steps; keys that left the window since the last rebuild are
scanned by a filtered range program of the same launch (kept when their bucket is probed), so
every step is exact. Per step: classifier -> group scores (sum over the GQA group) -> top-ℓ
buckets -> one kernel launch (`sas.methods.saap_triton`) -> log-sum-exp merge.
`last_looked_up` is the number of keys attended per (batch, KV head) at the last step.

Two routes select the buckets and write the new key (flag `route`):

- "torch": the reference path, a dozen small torch ops (`assign`, `group_scores`, `probe`,
  cache writes, mask scatter); runs wherever torch runs;
- "fused": one Triton launch (`sas.methods.saap_route.saap_route_kernel`) does the classifier,
  the group sum, the top-l selection (same buckets, same tie order), the probed ids and mask,
  the new key's bucket and the cache writes; with the decode kernel (merging in place) a step
  is 2 launches (3 with merge="separate") into buffers allocated once per cache (only the output is allocated per step).

The merge of the decode kernel's partials (flag `merge`): "fused" (the default) in the decode
launch itself (the last program of each (batch, KV head) to arrive merges, via an arrival
counter allocated once per decoder), "separate" a second launch (`merge_partials_kernel`); both
run the same merge code in the same order, so their outputs are bit-identical.
  The classifier runs in float32 FMAs in another summation order than torch's matmuls, so
  scores agree to float rounding; the probed sets are the same unless two buckets' group
  scores are within that rounding (~1e-6 relative) of each other at the l-th place.
- "auto" (the default): "fused" on CUDA up to ROUTE_MAX_CLUSTERS buckets, "torch" elsewhere
  (the CPU interpreter, more buckets).

Checked on an H100 (2026-11-25, `benchmarks/bench_saap.py`): the fused route picks the same
buckets as the torch route at 64K-256K and matches the float64 reference; docs/saap.md.
"""

from __future__ import annotations

import math

import torch

from sas.errors import KernelError, NotYetSupportedError
from sas.methods.saap import SaapLayer, assign, check_probes, group_scores, probe
from sas.methods.saap_route import saap_route_kernel
from sas.methods.direct_launch import interpreting
from sas.methods.partials_triton import merge_partials_kernel
from sas.methods.saap_triton import saap_decode_kernel

LOG2E = 1.4426950408889634
DENSE_CHUNK = 256
ROUTES = ("auto", "fused", "torch")
MERGES = ("fused", "separate")
ROUTE_BLOCK_C = 64       # buckets per route program
ROUTE_BLOCK_H = 16       # classifier hidden units per inner step
ROUTE_MAX_CLUSTERS = 4096


def _pow2(x: int, least: int = 1) -> int:
    return max(least, 1 << max(0, (x - 1).bit_length()))


def build_csr(bucket_of: torch.Tensor, lo: int, hi: int, clusters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR over keys [lo, hi): off [B, Hkv, C+1] int32, idx [B, Hkv, N] int32 (first hi-lo used)."""
    b, h, n = bucket_of.shape
    seg = bucket_of[..., lo:hi].long()
    order = torch.sort(seg, dim=-1, stable=True).indices
    idx = torch.zeros(b, h, n, dtype=torch.int32, device=bucket_of.device)
    idx[..., : hi - lo] = (order + lo).to(torch.int32)
    counts = torch.zeros(b, h, clusters + 1, dtype=torch.int64, device=bucket_of.device)
    counts.scatter_add_(2, seg + 1, torch.ones_like(seg))
    return counts.cumsum(-1).to(torch.int32), idx


class SaapDecoder:
    """One layer's Saap decode state and launches (one sequence batch)."""

    def __init__(self, layer: SaapLayer, probes: int, *, sink: int = 1, window: int = 2047, max_len: int,
                 rebuild_every: int = 64, block_n: int = 64, chunk: int = DENSE_CHUNK, split: int = 1,
                 scale: float | None = None, route: str = "auto", merge: str = "fused"):
        if route not in ROUTES:
            raise KernelError(f"SaapDecoder: route must be one of {ROUTES}, got {route!r}")
        if merge not in MERGES:
            raise KernelError(f"SaapDecoder: merge must be one of {MERGES}, got {merge!r}")
        self.route = route
        self.merge = merge
        self.layer = layer
        self.probes = check_probes(probes, layer.clusters, "SaapDecoder")
        if route == "fused" and layer.clusters > ROUTE_MAX_CLUSTERS:
            raise NotYetSupportedError(f"SaapDecoder: the fused route holds a KV head's {layer.clusters} bucket scores "
                                       f"in one program (at most {ROUTE_MAX_CLUSTERS}); use route='torch'")
        for name, x, least in (("sink", sink, 0), ("window", window, 1), ("max_len", max_len, 1),
                               ("rebuild_every", rebuild_every, 1), ("block_n", block_n, 16), ("chunk", chunk, 1),
                               ("split", split, 1)):
            if isinstance(x, bool) or not isinstance(x, int) or x < least:
                raise KernelError(f"SaapDecoder: {name} must be an integer >= {least}, got {x!r}")
        self.sink, self.window, self.max_len = sink, window, max_len
        self.rebuild_every, self.block_n, self.chunk, self.scale = rebuild_every, block_n, chunk, scale
        self.split = split
        self.reset()

    def reset(self) -> None:
        self.k = self.v = self.bucket_of = self.off = self.idx = None
        self.length = 0
        self.indexed_hi = self.sink
        self._last_step: tuple | None = None
        self.steps = 0
        self._route_bufs: dict[str, torch.Tensor] | None = None
        self._parts: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._merge_counter: torch.Tensor | None = None

    # region of query i: keys [sink, i - window + 1)
    def _region_hi(self, i: int) -> int:
        return max(self.sink, i - self.window + 1)

    def _check(self, where: str, q, k, v, q_index=None, k_index=None) -> None:
        if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
            raise KernelError(f"{where}: q must be [B, Hq, L, D] and k, v [B, Hkv, L, D] of one shape, got "
                              f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
        if q.shape[1] % k.shape[1] or q.shape[3] != k.shape[3] or q.shape[0] != k.shape[0]:
            raise KernelError(f"{where}: q {tuple(q.shape)} does not group onto k {tuple(k.shape)}")
        if not q.device == k.device == v.device:
            raise KernelError(f"{where}: q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
        if q.device.type != "cuda" and not interpreting():
            raise KernelError(f"{where}: q is on {q.device}; the Saap kernels run on CUDA tensors (or on the CPU "
                              f"with TRITON_INTERPRET=1 set before triton is imported)")
        self.layer.check(k.shape[1], k.shape[3], where)
        # the index vectors (pre-RoPE q and k, what the state was trained on) stand in for q and k
        for name, idx, like in (("q_index", q_index, q), ("k_index", k_index, k)):
            if idx is None:
                continue
            if not isinstance(idx, torch.Tensor) or idx.shape != like.shape or not idx.is_floating_point() \
                    or idx.device != like.device:
                got = (f"{tuple(idx.shape)} {idx.dtype} on {idx.device}" if isinstance(idx, torch.Tensor)
                       else type(idx).__name__)
                raise KernelError(f"{where}: {name} must be a floating-point tensor of {name[0]}'s shape "
                                  f"{tuple(like.shape)} on {like.device} (its pre-RoPE vectors), got {got}")

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, q_index: torch.Tensor | None = None,
                k_index: torch.Tensor | None = None) -> torch.Tensor:
        """Dense causal attention of the prompt (the first step attends the whole region), then
        the prompt's keys are assigned and indexed."""
        where = "SaapDecoder.prefill"
        self._check(where, q, k, v, q_index, k_index)
        b, hkv, n, d = k.shape
        if n > self.max_len:
            raise KernelError(f"{where}: prompt length {n} exceeds max_len={self.max_len}")
        g = q.shape[1] // hkv
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), is_causal=True, scale=self.scale)
        layer = self.layer.to(k.device)
        self.layer = layer
        self.k = torch.zeros(b, hkv, self.max_len, d, dtype=k.dtype, device=k.device)
        self.v = torch.zeros_like(self.k)
        self.bucket_of = torch.zeros(b, hkv, self.max_len, dtype=torch.int32, device=k.device)
        self.k[:, :, :n] = k
        self.v[:, :, :n] = v
        self.bucket_of[:, :, :n] = assign(k if k_index is None else k_index, layer.centroids[None]).to(torch.int32)
        self.length = n
        self._rebuild()
        self._route_bufs = self._parts = self._merge_counter = None
        return out

    def fill(self, k: torch.Tensor, v: torch.Tensor, buckets: torch.Tensor, length: int) -> None:
        """Take over caches k, v [B, Hkv, max_len, D] holding `length` tokens and their buckets
        [B, Hkv, max_len] (benchmarks: any bucket assignment, e.g. balanced), then index them."""
        if k.shape[2] != self.max_len or v.shape != k.shape or tuple(buckets.shape) != tuple(k.shape[:3]):
            raise KernelError(f"SaapDecoder.fill: k, v must be [B, Hkv, max_len={self.max_len}, D] and buckets "
                              f"[B, Hkv, max_len], got {tuple(k.shape)}, {tuple(v.shape)}, {tuple(buckets.shape)}")
        if not 0 < length <= self.max_len:
            raise KernelError(f"SaapDecoder.fill: length must be in [1, {self.max_len}], got {length}")
        self.layer = self.layer.to(k.device)
        self.k, self.v, self.bucket_of = k, v, buckets.to(torch.int32)
        self.length = length
        self._rebuild()
        self._route_bufs = self._parts = self._merge_counter = None

    def _rebuild(self) -> None:
        hi = self._region_hi(self.length)          # the region of the next query
        self.off, self.idx = build_csr(self.bucket_of, self.sink, max(self.sink, hi), self.layer.clusters)
        self.indexed_hi = max(self.sink, hi)

    def decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, q_index: torch.Tensor | None = None,
               k_index: torch.Tensor | None = None) -> torch.Tensor:
        """One token at position `length`: q [B, Hq, 1, D], k, v [B, Hkv, 1, D] -> [B, Hq, 1, D]."""
        where = "SaapDecoder.decode"
        if self.k is None:
            raise KernelError(f"{where}: no prompt yet; call prefill first")
        self._check(where, q, k, v, q_index, k_index)
        if q.shape[2] != 1 or k.shape[2] != 1:
            raise KernelError(f"{where}: decode takes one token (q [B, Hq, 1, D], k, v [B, Hkv, 1, D])")
        if tuple(k.shape[:2]) != tuple(self.k.shape[:2]) or k.shape[3] != self.k.shape[3] or k.dtype != self.k.dtype:
            raise KernelError(f"{where}: k {tuple(k.shape)} {k.dtype} does not match the cache "
                              f"{tuple(self.k.shape)} {self.k.dtype}")
        i = self.length
        if i >= self.max_len:
            raise KernelError(f"{where}: position {i} is past max_len={self.max_len}")
        hkv = k.shape[1]
        layer = self.layer
        if self.fused:
            probed, mask = self.route_step(q if q_index is None else q_index, k if k_index is None else k_index,
                                           k, v, i)
            self.length = i + 1
            out = self.attend(q, probed, mask, i)
            self._last_step = (i, probed, mask, self.indexed_hi, self.off)
            self.steps += 1
            if self._region_hi(self.length) - self.indexed_hi >= self.rebuild_every:
                self._rebuild()
            return out
        bucket_new = assign(k if k_index is None else k_index, layer.centroids[None]).to(torch.int32)
        probed = probe(group_scores(q if q_index is None else q_index, layer.classifier, hkv), self.probes)
        # nothing above wrote state: the cache changes from here on
        self.k[:, :, i] = k[:, :, 0]
        self.v[:, :, i] = v[:, :, 0]
        self.bucket_of[:, :, i] = bucket_new[:, :, 0]
        self.length = i + 1
        mask = self.probed_mask(probed)
        out = self.attend(q, probed, mask, i)
        self._last_step = (i, probed, mask, self.indexed_hi, self.off)
        self.steps += 1
        if self._region_hi(self.length) - self.indexed_hi >= self.rebuild_every:
            self._rebuild()
        return out

    @property
    def fused(self) -> bool:
        """Whether decode steps take the fused route kernel."""
        if self.route == "auto":
            return self.k is not None and self.k.is_cuda and self.layer.clusters <= ROUTE_MAX_CLUSTERS
        return self.route == "fused"

    def _route_buffers(self, g: int) -> dict[str, torch.Tensor]:
        """Scratch and outputs of the route kernel, allocated once per cache (and group size)."""
        bufs = self._route_bufs
        if bufs is not None and bufs["g"] == g:
            return bufs
        b, hkv = self.k.shape[:2]
        c, dev = self.layer.clusters, self.k.device
        cent = self.layer.centroids.float()
        bufs = {"g": g,
                "cent": cent.contiguous(),
                "cnorm": (cent[None] * cent[None]).sum(-1)[0].contiguous(),   # as `assign` computes |c|^2
                "w1": self.layer.w1.float().contiguous(), "b1": self.layer.b1.float().contiguous(),
                "w2": self.layer.w2.float().contiguous(), "b2": self.layer.b2.float().contiguous(),
                "logits": torch.empty(b * hkv, _pow2(g), c, dtype=torch.float32, device=dev),
                "dist": torch.empty(b * hkv, c, dtype=torch.float32, device=dev),
                "counter": torch.zeros(b * hkv, dtype=torch.int32, device=dev),
                "probed": torch.empty(b, hkv, self.probes, dtype=torch.int32, device=dev),
                "mask": torch.empty(b, hkv, c, dtype=torch.int8, device=dev)}
        self._route_bufs = bufs
        return bufs

    def route_step(self, q_index: torch.Tensor, k_index: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The fused route launch for the token at position i: writes k, v and the bucket of
        k_index into the cache at i and returns (probed int32 [B, Hkv, P], mask int8 [B, Hkv, C])
        (views of buffers that the next step overwrites)."""
        b, hkv, _, d = self.k.shape
        g = q_index.shape[1] // hkv
        c, hidden = self.layer.clusters, self.layer.w1.shape[-1]
        bufs = self._route_buffers(g)
        tiles = -(-c // ROUTE_BLOCK_C)
        bd = _pow2(d)
        saap_route_kernel[(b * hkv, tiles)](
            q_index.contiguous(), k_index.contiguous(), k.contiguous(), v.contiguous(), self.k, self.v,
            self.bucket_of, bufs["cent"], bufs["cnorm"], bufs["w1"], bufs["b1"], bufs["w2"], bufs["b2"],
            bufs["logits"], bufs["dist"], bufs["counter"], bufs["probed"], bufs["mask"],
            i, self.max_len, hkv, g, d, hidden, c, self.probes, tiles,
            BLOCK_G=_pow2(g), BLOCK_D=bd, BLOCK_H=min(ROUTE_BLOCK_H, _pow2(hidden)), BLOCK_C=ROUTE_BLOCK_C,
            BLOCK_CA=_pow2(c), BLOCK_DC=min(32, bd), LIBDEVICE_EXP=not interpreting())
        return bufs["probed"], bufs["mask"]

    def _partials(self, bhkv: int, s: int, bg: int, bd: int, dev) -> tuple[torch.Tensor, ...]:
        """The decode kernel's partial buffers, reused across steps (grown when a step needs more)."""
        parts = self._parts
        if parts is None or parts[0].shape[1] < s or parts[0].shape[0] != bhkv or parts[0].shape[2:] != (bg, bd):
            cap = max(s, 0 if parts is None else parts[0].shape[1])
            o = torch.empty(bhkv, cap, bg, bd, dtype=torch.float32, device=dev)
            m = torch.empty(bhkv, cap, bg, dtype=torch.float32, device=dev)
            parts = self._parts = (o, m, torch.empty_like(m))
        return parts

    def _counter(self, bhkv: int, dev) -> torch.Tensor:
        """The fused merge's arrival counters, one per (batch, KV head), allocated once (zero; the
        last program of each row resets its counter, so they are zero again after every step)."""
        cnt = self._merge_counter
        if cnt is None or cnt.shape[0] != bhkv or cnt.device != dev:
            cnt = self._merge_counter = torch.zeros(bhkv, dtype=torch.int32, device=dev)
        return cnt

    def probed_mask(self, probed: torch.Tensor) -> torch.Tensor:
        """[B, Hkv, C] int8: 1 for the probed buckets."""
        b, hkv, _ = probed.shape
        mask = torch.zeros(b, hkv, self.layer.clusters, dtype=torch.int8, device=probed.device)
        return mask.scatter_(2, probed, 1)

    def step_args(self, i: int) -> tuple[int, ...]:
        """The kernel's key ranges for query i: (SINK_HI, W_LO, W_HI, P_LO, P_HI, N_SP, N_WP, N_PP)."""
        sink_hi = min(self.sink, i + 1)
        w_lo, w_hi = max(self.sink, i - self.window + 1), i + 1
        p_lo, p_hi = self.indexed_hi, self._region_hi(i)
        n_sp = 1 if sink_hi > 0 else 0
        n_wp = -(-max(0, w_hi - w_lo) // self.chunk)
        n_pp = -(-max(0, p_hi - p_lo) // self.chunk)
        return sink_hi, w_lo, w_hi, p_lo, p_hi, n_sp, n_wp, n_pp

    def attend(self, q: torch.Tensor, probed: torch.Tensor, mask: torch.Tensor, i: int) -> torch.Tensor:
        """The kernel launch and merge for query i over the current cache and index (no host
        sync, graph-capturable): q [B, Hq, 1, D], probed [B, Hkv, P], mask from `probed_mask`.
        merge="fused": one launch (the last program of each (batch, KV head) merges);
        merge="separate": the decode launch, then `merge_partials_kernel`."""
        b, hkv, _, d = self.k.shape
        hq = q.shape[1]
        g = hq // hkv
        args = self.step_args(i)
        nr, p = sum(args[5:]), probed.shape[-1]
        bg, bd = _pow2(g, 16), _pow2(d, 16)
        s = nr + p * self.split
        o_part, m_part, l_part = self._partials(b * hkv, s, bg, bd, q.device)
        cap = o_part.shape[1]
        scale = (1.0 / math.sqrt(d)) if self.scale is None else self.scale
        qc = q.reshape(b, hkv, g, d).to(self.k.dtype).contiguous()
        out = torch.empty(b, hq, 1, d, dtype=q.dtype, device=q.device)
        fuse = self.merge == "fused"
        counter = self._counter(b * hkv, q.device) if fuse else m_part   # (unused when not fused)
        saap_decode_kernel[(b * hkv, s)](
            qc, self.k, self.v, self.bucket_of, mask, self.off, self.idx, probed.to(torch.int32).contiguous(),
            o_part, m_part, l_part, out, counter, self.max_len, self.layer.clusters, p, g, d, scale * LOG2E,
            *args, self.chunk, self.split, cap,
            BLOCK_G=bg, BLOCK_N=self.block_n, BLOCK_D=bd,
            DOT_PRECISION="ieee" if self.k.dtype == torch.float32 else "tf32",
            UPCAST=self.k.dtype == torch.bfloat16 and interpreting(), FUSE_MERGE=fuse)
        if not fuse:
            merge_partials_kernel[(b * hkv,)](o_part, m_part, l_part, out, s, cap, g, d, BLOCK_G=bg, BLOCK_D=bd)
        return out

    @property
    def last_looked_up(self) -> torch.Tensor | None:
        """Keys attended at the last decode step per (batch, KV head), int64 [B, Hkv] (computed
        on first access from the step's probed buckets and index)."""
        if self._last_step is None:
            return None
        i, probed, mask, lo, off = self._last_step
        dense = min(self.sink, i + 1) + (i + 1 - max(self.sink, i - self.window + 1))
        off, probed = off.long(), probed.long()
        sizes = (off.gather(2, probed + 1) - off.gather(2, probed)).sum(-1)
        hi = self._region_hi(i)
        pend = mask.long().gather(2, self.bucket_of[..., lo:hi].long()).sum(-1) if hi > lo else 0
        return sizes + pend + dense


__all__ = ["SaapDecoder", "build_csr"]
