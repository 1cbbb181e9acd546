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

The orchestration (`Runtime`, `State` and the kernel launches) is `sas.runtime.dynamic_host`,
which imports only torch, so that `sas compile` copies it beside the generated kernels and the
output runs without sas. Chains the kernels cannot compute (custom ops, external scores,
pooling, top-k, a reduction over KV heads) run as their traced torch.fx graph on the
probabilities in key order, from the same memoized statistics; only the accumulation then
happens outside the update kernel.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from sas.codegen.triton_backend import decode_module, dynamic_decode_module, prefill_module
from sas.errors import KernelError
from sas.plan import Plan
from sas.runtime import dynamic_host
from sas.runtime.checks import check_one_token, check_qkv
from sas.runtime.static import check_triton_tensor
from sas.runtime.tiles import runs_tensors

LOG2E = dynamic_host.LOG2E
#: the name a decode step's errors give
_DECODE = "SASAttnKernel.decode"


class DynamicRuntime:
    """Kernels and state for one dynamic pattern's plan; `SASAttnKernel` delegates to it. The
    orchestration of the fused path is `dynamic_host.Runtime` (what `sas compile` copies); this
    class adds the prefill tile lists from the plan and the torch path of chains the kernels
    cannot compute."""

    def __init__(self, plan: Plan, other_inputs: Mapping[str, Any], cache_dir=None):
        plan.require_decode("SASAttnKernel")
        self.plan = plan
        #: the split (static part, region, traced score) and the run-time cache layout
        self.split = plan.split
        self.cplan = plan.dynamic
        self.max_len = plan.max_len
        self.other_inputs = dict(other_inputs)
        self._cache_dir = cache_dir
        for name in self.split.score.weights:
            if name not in self.other_inputs:
                raise KernelError(f"SASAttnKernel: the score chain's custom weight {name!r} is missing from "
                                  f"other_inputs; given: {sorted(self.other_inputs)}")
        for name in self.split.score.externals:
            if name not in self.other_inputs:
                raise KernelError(f"SASAttnKernel: the score chain's external score {name!r} (ops.external) "
                                  f"is missing from other_inputs; given: {sorted(self.other_inputs)}")
        self.mod = dynamic_decode_module(self.cplan, cache_dir)
        sa = self.cplan.static_analysis
        self.static_mod = decode_module(sa, directory=cache_dir) if sa is not None else None
        self.rt = dynamic_host.Runtime(self.mod, self.static_mod, {name: torch.from_numpy(a) for name, a in
                                                                   self.cplan.table_arrays().items()})
        self._prefill_mods: dict = {}

    def reset(self) -> None:
        """Forget the sequence batch (a fresh `dynamic_host.Runtime` over the same kernels)."""
        self.rt = dynamic_host.Runtime(self.mod, self.static_mod, self.rt.tables, graphs=self.rt.graphs)

    @property
    def cache_size(self) -> int:
        return self.cplan.cache_size

    @property
    def state(self):
        return self.rt.state

    @property
    def length(self) -> int:
        return self.rt.length

    @length.setter
    def length(self, value: int) -> None:
        self.rt.length = value

    # --- prefill ---------------------------------------------------------------------------
    def _prefill_module(self, options):
        mod = self._prefill_mods.get(options)
        if mod is None:
            mod = self._prefill_mods[options] = prefill_module(self.split.full, options, self._cache_dir)
        return mod

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The prompt's attention (q, k, v of one length P); starts a new sequence batch."""
        check_triton_tensor("SASAttnKernel.prefill", "q", q)
        B, H, P, D = q.shape
        dev = q.device
        sched = self.plan.schedule(P, P)
        tiles = runs_tensors(sched.runs, dev)
        mod = self._prefill_module(sched.options)
        if self.cplan.fused is not None:
            return self.rt.prefill(mod, q, k, v, tiles)
        out, lse, _ = self.rt.attention(mod, q, k, v, tiles)
        probs = self._prefill_probs(q, k, lse)
        scores = self.split.score(probs, q.float(), k.float(), self._externals(0, P, dev)).float()
        self.rt.start(q, k, v, scores)
        return out

    def _prefill_probs(self, q, k, lse) -> torch.Tensor:
        """The prompt's attention probabilities [B, Hq, P, P], rebuilt from the prefill kernel's
        row statistics (general chains only: this materializes P x P per head)."""
        B, H, P, D = q.shape
        g = H // k.shape[1]
        kq = k.float().repeat_interleave(g, dim=1)
        s = torch.einsum("bhqd,bhkd->bhqk", q.float(), kq) * (D ** -0.5 * LOG2E)
        m = torch.from_numpy(self.split.full.to_mask(P)).to(q.device)
        ok = m[None, None] & torch.isfinite(lse)[..., None]
        return torch.where(ok, torch.exp2(s - torch.where(ok, lse[..., None], 0.0)), 0.0)

    def _externals(self, i0: int, i1: int, device: torch.device) -> dict[str, Any]:
        """`other_inputs` for the score graph of queries [i0, i1): external scores sliced to
        the step; every tensor the chain reads must live on the kernel's device."""
        out = dict(self.other_inputs)
        for name in (*self.split.score.weights, *self.split.score.externals):
            x = out[name]
            if isinstance(x, torch.Tensor) and x.device != device:
                raise KernelError(f"other_inputs[{name!r}] is on {x.device} but q, k, v are on {device}; "
                                  f"move it with .to({str(device)!r})")
        for name in self.split.score.externals:
            x = out[name]
            if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.shape[2] < i1 or x.shape[3] < i1:
                got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise KernelError(f"other_inputs[{name!r}] (ops.external) must be the full-sequence "
                                  f"[B, Hq, N, N] scores with N >= {i1}, got {got}")
            out[name] = x[:, :, i0:i1, :i1]
        return out

    # --- decode ----------------------------------------------------------------------------
    @property
    def shape(self) -> tuple | None:
        """The prompt's (batch, query heads, KV heads, head dim, dtype, device); None before one."""
        return self.rt.shape if self.rt.state is not None else None

    def check_step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """A decode step's q, k, v: one token each, k and v of one shape, all of one dtype and
        device (`check_qkv`, `check_one_token`), and of the prompt's batch, heads, head dim,
        dtype and device."""
        check_qkv(_DECODE, q, k, v)
        check_one_token(_DECODE, q, k)
        if self.rt.state is None:
            raise KernelError(f"{_DECODE}: no prompt yet; call kernel.prefill(q, k, v) before decode")
        B, H, Hkv, D, dtype, dev = self.rt.shape
        if (q.shape[0], q.shape[1], k.shape[1], q.shape[3], q.dtype, q.device) != (B, H, Hkv, D, dtype, dev):
            raise KernelError(f"{_DECODE}: q {tuple(q.shape)} {q.dtype} on {q.device} and k "
                              f"{tuple(k.shape)} do not match the prompt's batch {B}, {H} query / {Hkv} kv "
                              f"heads, head_dim {D}, {dtype} on {dev}")

    def decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """One token at the next position of the sequence batch the last prefill started."""
        self.check_step(q, k, v)
        return self.decode_checked(q, k, v)

    def decode_checked(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """`decode` for q, k, v that passed `check_step` against the current prompt (the caller
        vouches for it: a replayed step then skips comparing them with its graph's).
        `SASAttnKernel`'s session checks each new signature of shapes, dtypes, devices and
        prompt once, and its later steps skip the checks' host time (H100: 2-3 us a layer)."""
        if self.rt.state is None:
            raise KernelError(f"{_DECODE}: no prompt yet; call kernel.prefill(q, k, v) before decode")
        if self.cplan.fused is not None:
            return self.rt.decode(q, k, v, prompt_shaped=True)
        return self.rt.decode(q, k, v, accumulate=lambda rt, q_, pos: self._torch_scores(q_, pos), prompt_shaped=True)

    def _torch_scores(self, q: torch.Tensor, pos: int) -> None:
        """A general chain for query `pos`: probabilities in key order from the attention
        kernel's raw scores and row statistics, the traced graph, then accumulation per slot."""
        B, H, Hkv, D, dtype, dev = self.rt.shape
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
        sk = self.rt.static_keys.clone()
        if C:
            s_new = int(self.cplan.static_analysis.cache_id_func(pos))
            if s_new >= 0:
                sk[s_new] = pos
        static_keys = sk.to(dev)
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
        scores = self.split.score(probs_x[..., :n], q.float(), kk_x[:, :, :n], self._externals(pos, n, dev))
        scores = scores.float()                                            # [B, Hkv, n]
        acc = st.acc.view(B, Hkv, T)
        if C:
            acc[:, :, sl] += scores[:, :, static_keys[sl]]
        gathered = torch.cat([scores, torch.zeros(B, Hkv, 1, device=dev)], dim=-1).gather(2, pk)
        acc[:, :, C:] += torch.where(pool_held, gathered, 0.0)

    def attended_keys(self) -> list[list[list[int]]]:
        """Per batch entry and KV head: the keys the next decode query will attend through the
        pool (held and loaded, in its region row), sorted."""
        self._started("attended_keys")
        return self.rt.attended_keys()

    def held_keys(self) -> list[list[list[int]]]:
        """Per batch entry and KV head: the keys the dynamic selection holds after the last step
        (sorted; the keys already staged for the next query are not counted)."""
        self._started("held_keys")
        return self.rt.held_keys()

    def _started(self, where: str) -> None:
        if self.rt.state is None:
            raise KernelError(f"SASAttnKernel.dynamic.{where}: no prompt yet; call kernel.prefill(q, k, v) first")


__all__ = ["DynamicRuntime"]
