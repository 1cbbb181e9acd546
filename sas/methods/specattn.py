"""SpecAttn (Shah, "Speculative sparse attention"): the verifier attends, at every step, only the
keys that carry mass p of a draft model's attention for the same positions (sorting-free top-p),
the union over the draft's γ speculative steps. Spec: /work/shared/methods/kascade-specattn.md §2.

In sas the draft's attention is an input (`ops.external(name)`) and the selection a chain op:

    spec = Diag(0, 16) + (Causal() * ~Diag(0, 16)) * Dynamic(
        budget=1, refresh=True, score=ops.external("draft_attn").top_p(0.95, chunk=16))

This module holds the semantics (plain PyTorch, float64): the `top_p` score op, the per-step
selection and the exact reference of selection + attention. The attention kernel is
`sas.methods.specattn_triton`, the run-time state `sas.methods.specattn_runtime`, the threshold
kernel `sas.methods.threshold_triton`, the layer alignment `sas.methods.specattn_align`.

Per step (queries [i0, i1), keys [0, i1)), per batch entry and KV head:

1. the step's draft rows `a [Hq, Lq, i1]` (query head h belongs to KV head h // G) are selected
   by top-p: per (query head, query) row, or per query with the G heads summed (`pooled`),
   at token or chunk granularity (`chunk`, a chunk's score is the sum of its keys);
2. the union over the rows (the γ = Lq speculative steps, and the group's heads) is the KV
   head's set T (one set per KV head, shared by its G query heads: the kernel serves them in one
   program);
3. query i attends key j <= i when j is in the static part (a sink [0, sink) and the window
   (i - window, i] read off the pattern), or j belongs to the step's own block (j >= i0, the
   new tokens see each other causally: spec pitfall 7), or j is in T. Softmax renormalised over
   the attended keys (the paper's FlashInfer kernel does the same).

The first step (the prompt) is dense causal attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from sas.errors import KernelError
from sas.methods.threshold import check_p, expand_chunks, select_reference


def top_p_op(x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, p: float, chunk: int, pooled: bool,
             iters: int | None) -> torch.Tensor:
    """The `top_p` score op (fx target): `x` in the chain view `[B, Hkv, G*Lq, Lk]` -> `[B, Hkv, Lk]`
    (union over the rows), or a per-key `[B, Hkv, Lk]` / `[B, Lk]` -> the same shape."""
    g = q.shape[1] // k.shape[1]
    n = x.shape[-1]
    if x.dim() == 4:
        b, h, rows, _ = x.shape
        lq = rows // g
        s = x.reshape(b * h, g, lq, n).transpose(1, 2)          # [M, Lq, G, N]
        if not pooled:
            s = s.reshape(b * h, lq * g, 1, n)
        sel = select_reference(s, p=p, chunk=chunk, iters=iters)
        return expand_chunks(sel.mask, chunk, n).reshape(b, h, n).to(x.dtype)
    lead = x.shape[:-1]
    sel = select_reference(x.reshape(-1, 1, 1, n), p=p, chunk=chunk, iters=iters)
    return expand_chunks(sel.mask, chunk, n).reshape(*lead, n).to(x.dtype)


def step_rows(scores: torch.Tensor, num_kv_heads: int, pooled: bool) -> torch.Tensor:
    """A step's draft scores `[B, Hq, Lq, Lk]` as the selection input `[B*Hkv, R, P, Lk]`:
    R = Lq (pooled, P = G heads summed) or R = G*Lq (per head, P = 1)."""
    b, hq, lq, n = scores.shape
    g = hq // num_kv_heads
    s = scores.reshape(b * num_kv_heads, g, lq, n)
    if pooled:
        return s.transpose(1, 2)
    return s.reshape(b * num_kv_heads, g * lq, 1, n)


def check_step_scores(scores: object, name: str, b: int, hq: int, lq: int, lk: int, device: torch.device,
                      where: str) -> torch.Tensor:
    """A step's external scores must be a floating tensor [B, Hq, Lq, Lk] on the device of q."""
    want = (b, hq, lq, lk)
    if not isinstance(scores, torch.Tensor) or not scores.is_floating_point() or tuple(scores.shape) != want:
        got = f"{tuple(scores.shape)} {scores.dtype}" if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise KernelError(f"{where}: external score {name!r} for this step must be a floating-point tensor "
                          f"[B, Hq, Lq, Lk] = {want} (the draft's attention rows of the step's queries over the "
                          f"keys so far), got {got}")
    if scores.device != device:
        raise KernelError(f"{where}: external score {name!r} is on {scores.device}, the queries on {device}; "
                          f"move it to {device}")
    return scores


def attend_mask(sel_keys: torch.Tensor, i0: int, i1: int, sink: int, window: int) -> torch.Tensor:
    """[M, Lq, i1] bool: step rows i0..i1-1 over keys 0..i1-1 (selected keys `sel_keys [M, i1]`)."""
    i = torch.arange(i0, i1, device=sel_keys.device)[:, None]
    j = torch.arange(i1, device=sel_keys.device)[None, :]
    static = (j < sink) | (j > i - window) | (j >= i0)
    return (j <= i)[None] & (static[None] | sel_keys[:, None, :])


def visit_chunks(sel_keys: torch.Tensor, i0: int, i1: int, sink: int, window: int, nch: int,
                 chunk_keys: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """The 16-key chunks a step loads: those holding a selected key (`sel_keys [M, i1]`) or a
    static key of one of the step's rows. Returns (visit [M, nch] bool, keys loaded [M] int64:
    the existing keys of the visited chunks)."""
    m = sel_keys.shape[0]
    j = torch.arange(i1, device=sel_keys.device)
    static = (j < sink) | (j > i0 - window) | (j >= i0)
    keys = torch.zeros(m, nch * chunk_keys, dtype=torch.bool, device=sel_keys.device)
    keys[:, :i1] = sel_keys | static[None]
    visit = keys.reshape(m, nch, chunk_keys).any(-1)
    keys_in = torch.clamp(i1 - torch.arange(nch, device=sel_keys.device) * chunk_keys, 0, chunk_keys)
    return visit, (visit.long() * keys_in[None]).sum(-1)


@dataclass(frozen=True)
class SpecAttnReference:
    out: torch.Tensor            # [B, Hq, N, D] float64
    attended: torch.Tensor       # [B, Hkv, N, N] bool
    loaded: torch.Tensor         # [steps, B, Hkv] keys attended by the union of a step's rows
    steps: tuple[tuple[int, int], ...]


def specattn_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, draft: torch.Tensor, p: float,
                                 *, chunk: int = 1, pooled: bool = False, sink: int = 0, window: int = 0,
                                 prefill_len: int = 1, gamma: int = 1, iters: int | None = None,
                                 scale: float | None = None) -> SpecAttnReference:
    """Prefill [0, prefill_len) dense causal, then steps of `gamma` queries with the selection of
    the module docstring from `draft [B, Hq, N, N]` (row = query position). Float64, sort-based."""
    check_p(p, "specattn_attention_reference")
    b, hq, n, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = torch.zeros(b, hq, n, d, dtype=torch.float64)
    attended = torch.zeros(b, hkv, n, n, dtype=torch.bool)
    P = max(1, prefill_len)
    bounds = [(0, P)] + [(i, min(n, i + gamma)) for i in range(P, n, gamma)]
    loaded = []
    for i0, i1 in bounds:
        if i0 == 0:
            att = torch.ones(b * hkv, i1, i1, dtype=torch.bool).tril()
        else:
            rows = step_rows(draft[:, :, i0:i1, :i1].double(), hkv, pooled)
            sel = select_reference(rows, p=p, chunk=chunk, iters=iters)
            att = attend_mask(expand_chunks(sel.mask, chunk, i1), i0, i1, sink, window)
            loaded.append(att.any(1).sum(-1).reshape(b, hkv))
        att = att.reshape(b, hkv, i1 - i0, i1)
        attended[:, :, i0:i1, :i1] = att
        s = torch.einsum("bhqd,bhkd->bhqk", q[:, :, i0:i1].double(), k[:, :, :i1].double().repeat_interleave(g, 1))
        s = s * scale
        s = s.masked_fill(~att.repeat_interleave(g, 1), float("-inf"))
        out[:, :, i0:i1] = torch.softmax(s, -1) @ v[:, :, :i1].double().repeat_interleave(g, 1)
    ld = torch.stack(loaded) if loaded else torch.zeros(0, b, hkv, dtype=torch.int64)
    return SpecAttnReference(out, attended, ld, tuple(bounds))


__all__ = ["SpecAttnReference", "attend_mask", "check_step_scores", "specattn_attention_reference", "step_rows",
           "top_p_op", "visit_chunks"]
