"""SpecAttn inside `SASAttnKernel`: a dynamic pattern whose score chain is
`ops.external(name).top_p(p, ...)` runs on `SpecAttnRuntime` (the DynamicRuntime stand-in, as
Saap's `SaapDynamicRuntime`), not on the H2O runtime: nothing accumulates between steps, every
key stays in the cache, and each step loads the chunks selected from that step's draft scores.

Per step: the draft scores of the step's queries (`scores=` of `decode` / `step`, else the rows
of the full-sequence `other_inputs[name] [B, Hq, N, N]`) -> `threshold_select` (Triton) -> the
KV head's selection at its own chunk granularity (the union over the head's rows) ->
`specattn_plan_kernel`: the 16-key chunks to load (selected or static), compacted, and the keys
they hold -> `specattn_attn_kernel` over them -> `merge_partials_kernel`: four Triton launches
and no per-key tensor (`last_selected` expands the chunks on request). `last_loaded` / `loads` count the keys
of the chunks loaded (what the kernel reads) per (batch, KV head).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from sas.dynamic.plan import DynamicPlan
from sas.errors import KernelError, NotYetSupportedError
from sas.methods.direct_launch import DirectLaunch, interpreting
from sas.methods.saap_dynamic import sink_window
from sas.methods.partials_triton import merge_partials_kernel
from sas.methods.specattn import check_step_scores, step_rows
from sas.methods.specattn_triton import CHUNK_KEYS, specattn_attn_kernel, specattn_plan_kernel
from sas.methods.threshold import expand_chunks
from sas.methods.threshold_triton import threshold_select
from sas.plan import Plan

LOG2E = 1.4426950408889634
#: 16-key chunks per program of the attention kernel
CHUNKS_PER_PROGRAM = 64
#: 16-key chunks per block of the plan kernel (one prefix sum each)
PLAN_BLOCK = 256


_PLAN = DirectLaunch(specattn_plan_kernel)
_ATTN = DirectLaunch(specattn_attn_kernel)
_MERGE = DirectLaunch(merge_partials_kernel)


def _pow2(x: int, least: int = 1) -> int:
    return max(least, 1 << max(0, (x - 1).bit_length()))


def is_top_p(split: DynamicPlan | None) -> bool:
    """Whether a dynamic split's score chain is SpecAttn's `... .top_p(...)`."""
    return split is not None and any(n.name == "top_p" for n in split.dynamic.score.nodes)


class SpecAttnRuntime:
    """The stand-in for `DynamicRuntime` (prefill, decode, reset, state with .k/.v, length), plus
    `step(q, k, v, scores=...)` for a multi-query verification step."""

    def __init__(self, plan: Plan, other_inputs: Mapping[str, Any]):
        split = plan.split
        nodes = split.dynamic.score.nodes
        if len(nodes) != 2 or nodes[0].name != "external" or nodes[1].name != "top_p":
            raise NotYetSupportedError(
                f"top_p runs as SpecAttn's selection only: write ops.external(name).top_p(p, ...) as the whole "
                f"score chain; got {split.dynamic.score!r}")
        if not split.refresh:
            raise NotYetSupportedError("SpecAttn selects anew at every step and keeps every key: use "
                                       "Dynamic(..., refresh=True)")
        args = dict(nodes[1].args)
        self.name = dict(nodes[0].args)["name"]
        self.p, self.chunk, self.pooled, self.iters = args["p"], args["chunk"], args["pooled"], args["iters"]
        self.plan = plan
        self.max_len = plan.max_len
        self.other_inputs = dict(other_inputs)
        self.sink, self.window = sink_window(split, plan.max_len)
        self.scale: float | None = None
        self.reset()

    def reset(self) -> None:
        self.k = self.v = None
        self.length = 0
        self.last_loaded: torch.Tensor | None = None      # [B, Hkv] keys loaded at the last step
        self._last_selection: tuple[torch.Tensor, int] | None = None    # (chunk mask [B*Hkv, Nc], L)
        self.loads: list[tuple[int, torch.Tensor]] = []   # (keys that existed, loaded [B, Hkv]) per step

    @property
    def state(self) -> "SpecAttnRuntime | None":
        return self if self.k is not None else None

    def report(self) -> dict[str, Any]:
        return {"method": "specattn", "p": self.p, "chunk": self.chunk, "pooled": self.pooled, "iters": self.iters,
                "sink": self.sink, "window": self.window}

    def loads_skipped(self) -> float:
        """Fraction of the KV rows that dense decoding would load and these steps did not."""
        dense = sum(n * t.numel() for n, t in self.loads)
        got = sum(float(t.sum()) for _, t in self.loads)
        return 1.0 - got / dense if dense else 0.0

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Dense causal attention of the prompt; the cache takes its keys and values."""
        b, hkv, n, d = k.shape
        g = q.shape[1] // hkv
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), is_causal=True, scale=self.scale)
        self.k = torch.zeros(b, hkv, self.max_len, d, dtype=k.dtype, device=k.device)
        self.v = torch.zeros_like(self.k)
        self.k[:, :, :n] = k
        self.v[:, :, :n] = v
        self.length = n
        return out

    def decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
               scores: torch.Tensor | None = None) -> torch.Tensor:
        return self.step(q, k, v, scores=scores)

    def _scores(self, scores: torch.Tensor | None, q: torch.Tensor, i0: int, i1: int, where: str) -> torch.Tensor:
        b, hq, lq, _ = q.shape
        if scores is None:
            full = self.other_inputs.get(self.name)
            if full is None:
                raise KernelError(f"{where}: no draft scores: pass scores= [B, Hq, Lq, Lk] for the step or "
                                  f"other_inputs[{self.name!r}] = the full-sequence [B, Hq, N, N] tensor")
            if not isinstance(full, torch.Tensor) or full.dim() != 4 or tuple(full.shape[:2]) != (b, hq) \
                    or full.shape[2] < i1 or full.shape[3] < i1:
                got = tuple(full.shape) if isinstance(full, torch.Tensor) else type(full).__name__
                raise KernelError(f"{where}: other_inputs[{self.name!r}] must be the full-sequence [B, Hq, N, N] "
                                  f"tensor with B={b}, Hq={hq}, N >= {i1}, got {got}")
            scores = full[:, :, i0:i1, :i1]
        return check_step_scores(scores, self.name, b, hq, lq, i1, q.device, where)

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
             scores: torch.Tensor | None = None) -> torch.Tensor:
        """Append Lq tokens (q [B, Hq, Lq, D], k, v [B, Hkv, Lq, D]) and return their attention
        [B, Hq, Lq, D] under the selection from `scores` [B, Hq, Lq, Lk] (Lk = length + Lq)."""
        where = "SpecAttnRuntime.step"
        if self.k is None:
            raise KernelError(f"{where}: no prompt yet; call prefill first")
        b, hq, lq, d = q.shape
        hkv = k.shape[1]
        if k.shape != v.shape or tuple(k.shape) != (b, hkv, lq, d) or hq % hkv or \
                tuple(self.k.shape[:2]) != (b, hkv) or self.k.shape[3] != d or \
                not q.dtype == k.dtype == v.dtype == self.k.dtype:
            raise KernelError(f"{where}: q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)} {k.dtype}, v "
                              f"{tuple(v.shape)} {v.dtype} do not match the cache {tuple(self.k.shape)} {self.k.dtype}")
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            raise KernelError(f"{where}: q, k or v requires grad, but these kernels have no backward pass (the "
                              f"output would be silently cut off from autograd); run the step under torch.no_grad() "
                              f"or pass detached tensors")
        i0, i1 = self.length, self.length + lq
        if i1 > self.max_len:
            raise KernelError(f"{where}: positions up to {i1 - 1} are past max_len={self.max_len}")
        sc = self._scores(scores, q, i0, i1, where)
        selc = threshold_select(step_rows(sc, hkv, self.pooled), p=self.p, chunk=self.chunk, iters=self.iters).mask
        # nothing above wrote state
        self.k[:, :, i0:i1] = k
        self.v[:, :, i0:i1] = v
        self.length = i1
        m = b * hkv
        nch = -(-self.max_len // CHUNK_KEYS)
        visit = torch.empty(m, nch, dtype=torch.int32, device=q.device)
        count_loaded = torch.empty(2, m, dtype=torch.int32, device=q.device)
        _PLAN((m,), (selc, visit, count_loaded[0], count_loaded[1], selc.shape[1], nch, self.chunk, i0, i1, self.sink,
                     self.window), dict(BLOCK=PLAN_BLOCK))
        out = self._attend(q, visit, count_loaded[0], selc, i0, lq)
        loaded = count_loaded[1].view(b, hkv)
        self.last_loaded = loaded
        self._last_selection = (selc, i1)
        self.loads.append((i1, loaded))
        return out

    @property
    def last_selected(self) -> torch.Tensor | None:
        """[B, Hkv, L] bool: the keys the last step selected (expanded from its chunks on request)."""
        if self._last_selection is None:
            return None
        selc, i1 = self._last_selection
        b, hkv = self.last_loaded.shape
        return expand_chunks(selc, self.chunk, i1).reshape(b, hkv, i1)

    def _attend(self, q: torch.Tensor, visit: torch.Tensor, count: torch.Tensor, selc: torch.Tensor, i0: int,
                lq: int) -> torch.Tensor:
        b, hkv, _, d = self.k.shape
        hq = q.shape[1]
        g = hq // hkv
        rows = g * lq
        nch = visit.shape[-1]
        used = -(-self.length // CHUNK_KEYS)                  # chunks holding keys
        s = max(1, -(-used // CHUNKS_PER_PROGRAM))
        br, bd = _pow2(rows, 16), _pow2(d, 16)
        parts = torch.empty(b * hkv * s * br * (bd + 2), dtype=torch.float32, device=q.device)   # one allocation
        o_part = parts[:b * hkv * s * br * bd].view(b * hkv, s, br, bd)
        m_part, l_part = parts[b * hkv * s * br * bd:].view(2, b * hkv, s, br).unbind(0)
        scale = (1.0 / math.sqrt(d)) if self.scale is None else self.scale
        qc = q.reshape(b * hkv, rows, d).to(self.k.dtype).contiguous()
        _ATTN((b * hkv, s),
              (qc, self.k, self.v, selc, visit, count, o_part, m_part, l_part, self.max_len, selc.shape[1], self.chunk,
               nch, rows, lq, d, i0, self.sink, self.window, CHUNKS_PER_PROGRAM, scale * LOG2E),
              dict(BLOCK_R=br, BLOCK_C=4, BLOCK_D=bd, DOT_PRECISION="ieee" if self.k.dtype == torch.float32 else "tf32",
                   UPCAST=self.k.dtype == torch.bfloat16 and interpreting()))
        out = torch.empty(b * hkv, rows, d, dtype=q.dtype, device=q.device)
        _MERGE((b * hkv,), (o_part, m_part, l_part, out, s, s, rows, d), dict(BLOCK_G=br, BLOCK_D=bd))
        return out.reshape(b, hq, lq, d)


__all__ = ["SpecAttnRuntime", "is_top_p"]
