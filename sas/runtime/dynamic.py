"""Run-time selection for patterns with a `Dynamic` component (docs/dynamic.md, sections 4 and 7).

`DynamicRuntime` holds one sequence batch's state and runs the generated kernels:

- **prefill**: the block-sparse prefill kernel of the full pattern (the Dynamic as its whole
  region: the prompt attends exactly `pattern.to_mask`) stores each row's softmax statistic;
  the score kernel rebuilds the probabilities from it (inter-kernel memoization) and reduces
  them per key; the cache is then cut down to the budget (H2O) and laid out as static segment
  plus pool (`sas.dynamic.cache_plan`).
- **decode**, one token: the attention kernel over the static segment (`mask_func` inlined) and
  the loaded pool slots, then the update kernel (score accumulation, expiry, eviction, staging
  of the keys entering at the next query). With `refresh=True` the `budget` best held keys are
  marked loaded for the next query (torch, sort-based).

Chains the kernels cannot compute (custom ops, external scores, pooling, top-k, a reduction over
KV heads) run as their traced torch.fx graph on the probabilities in key order, from the same
memoized statistics; only the accumulation then happens outside the update kernel.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import torch

from sas.codegen.triton_backend import (
    auto_prefill_options,
    decode_module,
    dynamic_decode_module,
    prefill_module,
)
from sas.dynamic.cache_plan import DynamicCachePlan, dynamic_cache_plan
from sas.errors import KernelError
from sas.ir.tiles import tile_map
from sas.lang.pattern import Pattern

LOG2E = 1.4426950408889634


class DynamicRuntime:
    """Kernels and state for one dynamic pattern; `SASAttnKernel` delegates to it."""

    def __init__(self, pattern: Pattern, max_len: int, other_inputs: Mapping[str, Any], cache_dir=None):
        self.cplan: DynamicCachePlan = dynamic_cache_plan(pattern, max_len)
        self.plan = self.cplan.plan
        self.max_len = max_len
        self.other_inputs = dict(other_inputs)
        self._cache_dir = cache_dir
        self.mod = dynamic_decode_module(self.cplan, cache_dir)
        sa = self.cplan.static_analysis
        self.static_mod = decode_module(sa, directory=cache_dir) if sa is not None else None
        self._prefill_mods: dict = {}
        self._device_tables: dict[str, tuple[torch.Tensor, ...]] = {}
        self.state = None
        self.length = 0
        self._static_keys: np.ndarray | None = None
        for name in self.plan.score.weights:
            if name not in self.other_inputs:
                raise KernelError(f"SASAttnKernel: the score chain's custom weight {name!r} is missing from "
                                  f"other_inputs; given: {sorted(self.other_inputs)}")
        for name in self.plan.score.externals:
            if name not in self.other_inputs:
                raise KernelError(f"SASAttnKernel: the score chain's external score {name!r} (ops.external) "
                                  f"is missing from other_inputs; given: {sorted(self.other_inputs)}")

    # --- geometry on the device ------------------------------------------------------------
    def _tables(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        key = str(device)
        t = self._device_tables.get(key)
        if t is None:
            c = self.cplan
            last = np.minimum(np.where(c.region_last < 0, -1, c.region_last), np.iinfo(np.int32).max)
            t = self._device_tables[key] = (
                torch.from_numpy(last.astype(np.int32)).to(device),
                torch.from_numpy(c.enter_ptr.astype(np.int32)).to(device),
                torch.from_numpy(np.append(c.enter_keys, 0).astype(np.int32)).to(device),
            )
        return t

    @property
    def cache_size(self) -> int:
        return self.cplan.cache_size

    # --- prefill ---------------------------------------------------------------------------
    def _prefill_module(self, options):
        mod = self._prefill_mods.get(options)
        if mod is None:
            mod = self._prefill_mods[options] = prefill_module(self.plan.full, options, self._cache_dir)
        return mod

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefill_options=None) -> torch.Tensor:
        B, H, P, D = q.shape
        Hkv = k.shape[1]
        dev = q.device
        o = prefill_options or auto_prefill_options(self.plan.full, P, P)
        tm = tile_map(self.plan.full, P, P, o.block_m, o.block_n, 0)
        arrays = [torch.from_numpy(a.copy()).to(dev) if a.size else torch.zeros(1, dtype=torch.int32, device=dev)
                  for a in (tm.full_rowptr, tm.full_cols, tm.part_rowptr, tm.part_cols, tm.block_order())]
        mod = self._prefill_module(o)
        lse = torch.empty(B, H, P, dtype=torch.float32, device=dev)
        out = mod.prefill(q, k, v, *arrays, q_offset=0, lse=lse, block_m=o.block_m, block_n=o.block_n,
                          num_warps=o.num_warps, num_stages=o.num_stages)
        fused = self.cplan.fused
        if fused is not None:
            red = mod.score(q, k, lse, *arrays, reduce="max" if fused.reduce == "max" else "sum",
                            q_offset=0, block_m=o.block_m, block_n=o.block_n, num_warps=o.num_warps)
            if fused.reduce == "mean":
                red = red / ((H // Hkv) * P)
            scores = fused.apply(red)
        else:
            probs = self._prefill_probs(q, k, lse)
            scores = self.plan.score(probs, q.float(), k.float(), self._externals(0, P, dev)).float()
        self._init_state(q, k, v, scores)
        return out

    def _prefill_probs(self, q, k, lse) -> torch.Tensor:
        """The prompt's attention probabilities [B, Hq, P, P], rebuilt from the prefill kernel's
        row statistics (general chains only: this materializes P x P per head)."""
        B, H, P, D = q.shape
        g = H // k.shape[1]
        kq = k.float().repeat_interleave(g, dim=1)
        s = torch.einsum("bhqd,bhkd->bhqk", q.float(), kq) * (D ** -0.5 * LOG2E)
        m = torch.from_numpy(self.plan.full.to_mask(P)).to(q.device)
        ok = m[None, None] & torch.isfinite(lse)[..., None]
        return torch.where(ok, torch.exp2(s - torch.where(ok, lse[..., None], 0.0)), 0.0)

    def _externals(self, i0: int, i1: int, device: torch.device) -> dict[str, Any]:
        """`other_inputs` for the score graph of queries [i0, i1): external scores sliced to
        the step; every tensor the chain reads must live on the kernel's device."""
        out = dict(self.other_inputs)
        for name in (*self.plan.score.weights, *self.plan.score.externals):
            x = out[name]
            if isinstance(x, torch.Tensor) and x.device != device:
                raise KernelError(f"other_inputs[{name!r}] is on {x.device} but q, k, v are on {device}; "
                                  f"move it with .to({str(device)!r})")
        for name in self.plan.score.externals:
            x = out[name]
            if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.shape[2] < i1 or x.shape[3] < i1:
                got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise KernelError(f"other_inputs[{name!r}] (ops.external) must be the full-sequence "
                                  f"[B, Hq, N, N] scores with N >= {i1}, got {got}")
            out[name] = x[:, :, i0:i1, :i1]
        return out

    def _init_state(self, q, k, v, scores: torch.Tensor) -> None:
        """Lay the prompt out as static segment + pool, cut the pool to the budget, stage the
        keys entering at the first decode query."""
        B, H, P, D = q.shape
        Hkv = k.shape[1]
        dev = q.device
        c = self.cplan
        C = c.static_size
        st = self.mod.State(B, H, Hkv, D, k.dtype, dev)
        scores = scores.to(torch.float32).reshape(B * Hkv, P)
        # static segment: each slot holds the last key written to it
        keys_static = np.full(max(C, 1), -1, dtype=np.int64)
        if C:
            self.static_mod.fill_cache(k, v, st.k[:, :, :C], st.v[:, :, :C])
            cid = c.static_analysis.cache_ids(P)
            j = np.flatnonzero(cid >= 0)
            np.maximum.at(keys_static, cid[j], j)
            held_static = keys_static[:C]
            sel = np.flatnonzero(held_static >= 0)
            st.acc[:, torch.from_numpy(sel).to(dev)] = scores[:, torch.from_numpy(held_static[sel]).to(dev)]
        self._static_keys = keys_static[:C].copy()
        # pool: candidates entered by the prompt whose region use is not over
        j = np.arange(P)
        cand = (c.enter_at[:P] >= 0) & (c.enter_at[:P] <= P - 1) & (c.region_last[:P] >= P)
        cand_t = torch.from_numpy(cand).to(dev)[None, :].expand(B * Hkv, P)
        if self.plan.refresh:
            keep = cand_t
        else:
            keep = _top(scores, cand_t, self.plan.budget, torch.arange(P, device=dev))
        n_keep = keep.sum(dim=1)
        if int(n_keep.max()) > c.pool_size:
            raise KernelError(f"internal: {int(n_keep.max())} candidate keys after prefill exceed the pool "
                              f"of {c.pool_size} slots")
        order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)[:, :c.pool_size]   # kept keys first
        npool = min(c.pool_size, P)
        order = order[:, :npool]
        valid = torch.arange(npool, device=dev)[None, :] < n_keep[:, None]
        st.keys[:, :npool] = torch.where(valid, order, -1).to(torch.int32)
        st.flags[:, :npool] = torch.where(valid, 3, 0).to(torch.int8)
        st.acc[:, C:C + npool] = torch.where(valid, scores.gather(1, order), 0.0)
        kf = k.reshape(B * Hkv, P, D)
        vf = v.reshape(B * Hkv, P, D)
        idx = order[..., None].expand(-1, -1, D)
        pk = st.k.view(B * Hkv, c.cache_size, D)
        pv = st.v.view(B * Hkv, c.cache_size, D)
        pk[:, C:C + npool] = torch.where(valid[..., None], kf.gather(1, idx), 0)
        pv[:, C:C + npool] = torch.where(valid[..., None], vf.gather(1, idx), 0)
        self.state = st
        self.length = P
        self.batch_shape = (B, H, Hkv, D, k.dtype, dev)
        region_last, enter_ptr, enter_keys = self._tables(dev)
        self.mod.update(st, P - 1, region_last, enter_ptr, enter_keys, score=False, evict=False)
        if self.plan.refresh:
            self._select(P)

    # --- decode ----------------------------------------------------------------------------
    def decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        B, H, Hkv, D, dtype, dev = self.batch_shape
        if (q.shape[0], q.shape[1], k.shape[1], q.shape[3], q.dtype, q.device) != (B, H, Hkv, D, dtype, dev):
            raise KernelError(f"SASAttnKernel.decode: q {tuple(q.shape)} {q.dtype} on {q.device} and k "
                              f"{tuple(k.shape)} do not match the prompt's batch {B}, {H} query / {Hkv} kv "
                              f"heads, head_dim {D}, {dtype} on {dev}")
        pos = self.length
        st = self.state
        out = torch.empty_like(q)
        self.mod.attend(st, q, k, v, pos, out)
        fused = self.cplan.fused is not None
        if not fused:
            self._torch_scores(q, pos)
        region_last, enter_ptr, enter_keys = self._tables(dev)
        self.mod.update(st, pos, region_last, enter_ptr, enter_keys, score=fused, evict=not self.plan.refresh)
        if self.plan.refresh and pos + 1 < self.max_len:
            self._select(pos + 1)
        if self.cplan.static_size:
            s = int(self.cplan.static_analysis.cache_id_func(pos))
            if s >= 0:
                self._static_keys[s] = pos
        self.length = pos + 1
        return out

    def _select(self, i: int) -> None:
        """refresh=True: mark loaded the `budget` held pool keys of region row i with the highest
        accumulated score (ties: the more recent key)."""
        st = self.state
        C = self.cplan.static_size
        keys = st.keys.to(torch.int64)
        held = ((st.flags & 1) != 0) & (keys >= 0)
        pos = torch.full_like(keys, i)
        held = held & self.mod.region(pos, keys.clamp(min=0))
        chosen = _top(st.acc[:, C:], held, self.plan.budget, keys)
        st.flags.copy_(torch.where(held | ((st.flags & 1) != 0), (st.flags & 1) | (chosen.to(torch.int8) * 2),
                                   st.flags))

    def _torch_scores(self, q: torch.Tensor, pos: int) -> None:
        """A general chain for query `pos`: probabilities in key order from the attention
        kernel's raw scores and row statistics, the traced graph, then accumulation per slot."""
        B, H, Hkv, D, dtype, dev = self.batch_shape
        st = self.state
        C, T, n = self.cplan.static_size, self.cplan.cache_size, pos + 1
        ns = st.num_splits
        m_s = st.mpart.view(B * H, ns)
        l_s = st.lpart.view(B * H, ns)
        m = m_s.max(dim=1, keepdim=True).values
        m_use = torch.where(torch.isfinite(m), m, 0.0)
        l = (l_s * torch.exp2(m_s - m_use)).sum(dim=1, keepdim=True)
        s = st.sraw
        p = torch.where(torch.isfinite(s) & (l > 0), torch.exp2(s - m_use) / torch.where(l > 0, l, 1.0), 0.0)
        p = p.view(B, H, T)
        g = H // Hkv
        # slot -> key: the static segment (same for every head; the new key is written now), then pool
        sk = self._static_keys.copy()
        if C:
            s_new = int(self.cplan.static_analysis.cache_id_func(pos))
            if s_new >= 0:
                sk[s_new] = pos
        static_keys = torch.from_numpy(sk).to(dev)
        pool_keys = st.keys.view(B, Hkv, -1).to(torch.int64)
        pool_held = ((st.flags.view(B, Hkv, -1) & 1) != 0) & (pool_keys >= 0)
        probs = torch.zeros(B, H, 1, n, dtype=torch.float32, device=dev)
        kk = torch.zeros(B, Hkv, n, D, dtype=torch.float32, device=dev)
        if C:
            ok = static_keys >= 0
            sl = torch.nonzero(ok)[:, 0]
            probs[:, :, 0, static_keys[sl]] = p[:, :, sl]
            kk[:, :, static_keys[sl]] = st.k[:, :, sl].float()
        pk = torch.where(pool_held, pool_keys, n)                         # n: a dump column
        probs_x = torch.cat([probs, torch.zeros(B, H, 1, 1, device=dev)], dim=-1)
        probs_x.scatter_add_(-1, pk.repeat_interleave(g, dim=1)[:, :, None, :],
                         torch.where(pool_held.repeat_interleave(g, dim=1), p[:, :, C:], 0.0)[:, :, None, :])
        kk_x = torch.cat([kk, torch.zeros(B, Hkv, 1, D, device=dev)], dim=2)
        kk_x.scatter_(2, pk[..., None].expand(-1, -1, -1, D), st.k[:, :, C:].float())
        scores = self.plan.score(probs_x[..., :n], q.float(), kk_x[:, :, :n], self._externals(pos, n, dev))
        scores = scores.float()                                            # [B, Hkv, n]
        acc = st.acc.view(B, Hkv, T)
        if C:
            acc[:, :, sl] += scores[:, :, static_keys[sl]]
        gathered = torch.cat([scores, torch.zeros(B, Hkv, 1, device=dev)], dim=-1).gather(2, pk)
        acc[:, :, C:] += torch.where(pool_held, gathered, 0.0)

    def attended_keys(self) -> list[list[list[int]]]:
        """Per batch entry and KV head: the keys the next decode query will attend through the
        pool (held and loaded, in its region row), sorted."""
        st = self.state
        B, H, Hkv = self.batch_shape[:3]
        keys = st.keys.to(torch.int64)
        loaded = ((st.flags & 2) != 0) & (keys >= 0)
        loaded &= self.mod.region(torch.full_like(keys, self.length), keys.clamp(min=0))
        out = []
        for b in range(B):
            out.append([sorted(int(x) for x in keys[b * Hkv + h][loaded[b * Hkv + h]]) for h in range(Hkv)])
        return out

    def held_keys(self) -> list[list[list[int]]]:
        """Per batch entry and KV head: the keys the dynamic selection holds after the last step
        (sorted; the keys already staged for the next query are not counted)."""
        st = self.state
        B, H, Hkv = self.batch_shape[:3]
        keys = st.keys.to(torch.int64)
        enter = torch.from_numpy(self.cplan.enter_at).to(keys.device)[keys.clamp(min=0)]
        held = ((st.flags & 1) != 0) & (keys >= 0) & (enter < self.length)
        return [[sorted(int(x) for x in keys[b * Hkv + h][held[b * Hkv + h]]) for h in range(Hkv)]
                for b in range(B)]


def _top(score: torch.Tensor, mask: torch.Tensor, b: int, key: torch.Tensor) -> torch.Tensor:
    """Bool mask of the `b` entries of `mask` with the highest `score` per row; ties to the larger
    `key` (the more recent key)."""
    key = key.expand_as(score)
    s = torch.where(mask, score, torch.full_like(score, -math.inf))
    o1 = torch.argsort(key, dim=1, descending=True, stable=True)
    o2 = torch.argsort(s.gather(1, o1), dim=1, descending=True, stable=True)
    order = o1.gather(1, o2)[:, :b]
    chosen = torch.zeros_like(mask).scatter(1, order, True)
    return chosen & mask


__all__ = ["DynamicRuntime"]
