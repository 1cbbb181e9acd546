"""The run-time H2O policy in plain PyTorch: the semantics spec of `Dynamic` components.

docs/dynamic.md states the rules; this module is their executable form, used by tests as the
reference and by the runtime until score kernels exist. Everything here is per batch entry and
per KV head (all query heads of a GQA group share one selection).

A sequence is processed in *steps*. A step is a block of consecutive queries `[i0, i1)`; the
keys `0 .. i1-1` exist. The first step (`i0 == 0`) is the prefill (the prompt, any length);
every later step is usually one decode query. For one step:

1. **Enter**: keys with a region cell in one of the step's rows, that were never candidates,
   become candidates (`entered`). A candidate is *held* by the dynamic cache until it expires
   or is evicted.
2. **Select and attend**: query `i` attends `S_i` (its static row) plus
   - `refresh=False`, and every first step: every held key in its region row `R_i`;
   - `refresh=True`, later steps: the `budget` held keys of `R_i` with the highest accumulated
     score (before this step), ties to the more recent key.
   `m_i`, `l_i` = row max and sum of `exp(q_i . k_j * scale)` over the attended keys;
   output = `sum_j exp(s_ij - m_i) / l_i * v_j` over them (0 if the row attends nothing).
3. **Score**: the chain's `attn_score()` input is `exp(s_ij - m_i) / l_i` for attended keys
   (the attention probabilities) and, with `refresh=True`, also for the held keys of `R_i` that
   were not loaded (what a score kernel reusing `m_i`, `l_i` computes); 0 elsewhere. The chain
   gives one score per key `[B, Hkv, i1]`; it is **added** to the accumulated score of every
   key that is not evicted (static keys too: a key brings its score into the region).
4. **Expire**: held keys whose region use is over (`region_last_use(j) < i1`) leave the cache;
   this is not an eviction.
5. **Evict** (`refresh=False`): while more than `budget` keys are held, the one with the lowest
   accumulated score is evicted for good (ties: the older key goes first). It never becomes a
   candidate again; its static cells are unaffected.

Between steps a `refresh=False` component holds at most `budget` keys; during a step it also
holds the keys entering at that step (so a prompt's whole region is attended at prefill).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import torch

from sas.dynamic.plan import DynamicPlan, plan_dynamic
from sas.errors import KernelError, PatternError
from sas.lang.pattern import Pattern


@dataclass(frozen=True)
class StepPlan:
    """What one step attends and scores, per batch entry and KV head."""

    i0: int
    i1: int
    entering: np.ndarray          # [n] bool: keys that became candidates at this step
    attend: torch.Tensor          # [B, Hkv, Lq, i1] bool
    scored: torch.Tensor          # [B, Hkv, Lq, i1] bool (attend plus unloaded held candidates)


@dataclass(frozen=True)
class StepRecord:
    """What a step did: its queries, the keys that entered, were evicted, and are held after it."""

    i0: int
    i1: int
    entering: tuple[int, ...]
    evicted: torch.Tensor         # [B, Hkv, i1] bool: evicted at this step
    held: torch.Tensor            # [B, Hkv, i1] bool: held by the dynamic cache after this step

    def held_sets(self) -> list[list[tuple[int, ...]]]:
        return _sets(self.held)

    def evicted_sets(self) -> list[list[tuple[int, ...]]]:
        return _sets(self.evicted)


def _sets(mask: torch.Tensor) -> list[list[tuple[int, ...]]]:
    return [[tuple(int(x) for x in torch.nonzero(mask[b, h]).flatten()) for h in range(mask.shape[1])]
            for b in range(mask.shape[0])]


def top_b(acc: torch.Tensor, mask: torch.Tensor, b: int) -> torch.Tensor:
    """Bool mask of the `b` entries of `mask` with the highest `acc` along the last axis; ties go
    to the larger index (the more recent key). Fewer if `mask` holds fewer."""
    n = acc.shape[-1]
    if n == 0:
        return mask.clone()
    key = torch.where(mask, acc, torch.full_like(acc, -math.inf)).flip(-1)
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices[..., :b]
    chosen = torch.zeros_like(mask).scatter(-1, order, True).flip(-1)
    return chosen & mask


class H2OState:
    """The dynamic-selection state of one attention layer: per batch entry x KV head, the
    accumulated scores and the evicted keys; the candidate and expiry flags (the same for every
    head: they follow from the geometry) are shared.

    Use `begin(i0, i1)` -> attend -> `end(step, scores)`, or `step(q, k, v)` for all three.
    """

    def __init__(self, plan: DynamicPlan, batch: int, kv_heads: int, *, dtype: torch.dtype = torch.float64):
        self.plan, self.batch, self.kv_heads, self.dtype = plan, batch, kv_heads, dtype
        self.n_queries = 0
        self.entered = np.zeros(0, dtype=bool)
        self.expired = np.zeros(0, dtype=bool)
        self.evicted = torch.zeros(batch, kv_heads, 0, dtype=torch.bool)
        self.acc = torch.zeros(batch, kv_heads, 0, dtype=dtype)
        self.records: list[StepRecord] = []
        self._open: StepPlan | None = None
        self.last_step: StepPlan | None = None     # the masks of the latest step begun

    @property
    def n_keys(self) -> int:
        return len(self.entered)

    def held(self) -> torch.Tensor:
        """`[B, Hkv, n_keys]` bool: keys held by the dynamic cache now."""
        geo = torch.from_numpy(self.entered & ~self.expired)
        return geo[None, None, :] & ~self.evicted

    def _grow(self, n: int) -> None:
        extra = n - self.n_keys
        if extra <= 0:
            return
        self.entered = np.concatenate([self.entered, np.zeros(extra, dtype=bool)])
        self.expired = np.concatenate([self.expired, np.zeros(extra, dtype=bool)])
        b, h = self.batch, self.kv_heads
        self.evicted = torch.cat([self.evicted, torch.zeros(b, h, extra, dtype=torch.bool)], dim=-1)
        self.acc = torch.cat([self.acc, torch.zeros(b, h, extra, dtype=self.dtype)], dim=-1)

    def begin(self, i0: int, i1: int) -> StepPlan:
        """Steps 1-2 of the module docstring for queries `[i0, i1)`: enter, then select."""
        if self._open is not None:
            raise KernelError(f"H2OState: step [{self._open.i0}, {self._open.i1}) was begun and not ended")
        if i0 != self.n_queries or i1 <= i0:
            raise KernelError(f"H2OState: the next step must start at query {self.n_queries} and hold at "
                              f"least one query, got [{i0}, {i1})")
        self._grow(i1)
        S = self.plan.static_rows(i0, i1, i1)
        R = self.plan.region_rows(i0, i1, i1)
        entering = R.any(axis=0) & ~self.entered
        self.entered |= entering
        held = self.held()                                              # [B, H, n]
        Rt = torch.from_numpy(R)[None, None]                            # [1, 1, Lq, n]
        cand = held[:, :, None, :] & Rt
        if self.plan.refresh and i0 > 0:
            loaded = top_b(self.acc[:, :, None, :].expand(cand.shape), cand, self.plan.budget)
        else:
            loaded = cand
        attend = torch.from_numpy(S)[None, None] | loaded
        scored = attend | cand if self.plan.refresh else attend
        self._open = self.last_step = StepPlan(i0, i1, entering, attend, scored)
        return self._open

    def end(self, step: StepPlan, scores: torch.Tensor) -> StepRecord:
        """Steps 3-5: accumulate the step's per-key `scores` `[B, Hkv, i1]`, expire, evict."""
        if step is not self._open:
            raise KernelError("H2OState.end: this step is not the one begun last")
        want = (self.batch, self.kv_heads, step.i1)
        if tuple(scores.shape) != want:
            raise KernelError(f"H2OState.end: scores must be [B, Hkv, Lk] = {want}, got {tuple(scores.shape)}")
        self.acc = self.acc + torch.where(self.evicted, torch.zeros_like(self.acc), scores.to(self.dtype))
        keys = np.arange(self.n_keys)
        live = self.entered & ~self.expired
        self.expired |= live & (self.plan.region_last_use(keys) < step.i1)
        evicted_now = torch.zeros_like(self.evicted)
        if not self.plan.refresh:
            held = self.held()
            keep = top_b(self.acc, held, self.plan.budget)
            evicted_now = held & ~keep
            self.evicted |= evicted_now
        self.n_queries = step.i1
        self._open = None
        rec = StepRecord(step.i0, step.i1, tuple(int(j) for j in np.flatnonzero(step.entering)),
                         evicted_now, self.held())
        self.records.append(rec)
        return rec

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
             other_inputs: Mapping[str, Any] | None = None) -> torch.Tensor:
        """Run one step on the queries `q [B, Hq, Lq, D]` at positions `n_queries ...`, with all keys
        and values so far `k, v [B, Hkv, Lk, D]`; returns the attention output `[B, Hq, Lq, D]`."""
        i0 = self.n_queries
        i1 = i0 + q.shape[2]
        if k.shape[2] != i1 or v.shape[2] != i1:
            raise KernelError(f"H2OState.step: queries [{i0}, {i1}) need keys and values 0..{i1 - 1}, "
                              f"got {k.shape[2]} keys and {v.shape[2]} values")
        sp = self.begin(i0, i1)
        out, probs = masked_attention(q, k, v, sp.attend, sp.scored, scale, dtype=self.dtype)
        other = _slice_externals(self.plan, other_inputs or {}, i0, i1)
        scores = self.plan.score(probs, q.to(probs.dtype), k.to(probs.dtype), other)
        self.end(sp, scores)
        return out


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attend: torch.Tensor,
                     scored: torch.Tensor | None = None, scale: float | None = None,
                     dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of `q [B, Hq, Lq, D]` over `k, v [B, Hkv, Lk, D]` restricted per KV head to
    `attend [B, Hkv, Lq, Lk]`. Returns the output `[B, Hq, Lq, D]` and the probabilities
    `[B, Hq, Lq, Lk]`: `exp(s - m) / l` (m, l over the attended keys) wherever `scored` is on
    (default: `attend`), 0 elsewhere. Computed in `dtype` (float64 for the reference)."""
    b, hq, lq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    kq = k.repeat_interleave(g, dim=1)
    vq = v.repeat_interleave(g, dim=1)
    att = attend.repeat_interleave(g, dim=1)
    sc = att if scored is None else scored.repeat_interleave(g, dim=1)
    s = torch.einsum("bhqd,bhkd->bhqk", q, kq) * scale
    m = torch.where(att, s, torch.full_like(s, -math.inf)).amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    l = torch.where(att, e, torch.zeros_like(e)).sum(dim=-1, keepdim=True)
    safe = torch.where(l > 0, l, torch.ones_like(l))
    p_att = torch.where(att, e / safe, torch.zeros_like(e))
    out = torch.einsum("bhqk,bhkd->bhqd", p_att, vq)
    probs = torch.where(sc & (l > 0), e / safe, torch.zeros_like(e))
    return out, probs


def _slice_externals(plan: DynamicPlan, other: Mapping[str, Any], i0: int, i1: int) -> dict[str, Any]:
    if not plan.score.externals:
        return dict(other)
    out = dict(other)
    for name in plan.score.externals:
        x = other.get(name)
        if isinstance(x, torch.Tensor):
            if x.dim() != 4 or x.shape[2] < i1 or x.shape[3] < i1:
                raise KernelError(f"external score {name!r} must be the full-sequence [B, Hq, N, N] tensor "
                                  f"(N >= {i1}), got {tuple(x.shape)}")
            out[name] = x[:, :, i0:i1, :i1]
    return out


@dataclass(frozen=True)
class DynamicResult:
    """Output of `dynamic_attention_reference`."""

    out: torch.Tensor                 # [B, Hq, N, D] float64
    attended: torch.Tensor            # [B, Hkv, N, N] bool: keys each query attended
    steps: tuple[StepRecord, ...]
    acc: torch.Tensor                 # [B, Hkv, N] accumulated scores at the end (frozen at eviction)
    plan: DynamicPlan = field(repr=False)

    def kept_sets(self) -> list[list[list[tuple[int, ...]]]]:
        """Per step, per batch entry, per KV head: the sorted keys held after the step."""
        return [r.held_sets() for r in self.steps]


def dynamic_attention_reference(pattern: Pattern | DynamicPlan, q: torch.Tensor, k: torch.Tensor,
                                v: torch.Tensor, *, prefill_len: int | None = None, scale: float | None = None,
                                other_inputs: Mapping[str, Any] | None = None) -> DynamicResult:
    """Prefill then decode with a Dynamic pattern, in float64, by the rules of the module docstring.

    `q [B, Hq, N, D]`, `k, v [B, Hkv, N, D]` hold the whole sequence (prompt then generated
    tokens). Queries `[0, prefill_len)` form the first step, then one step per query. The default
    `prefill_len = N` is a prefill-only run; `prefill_len` 0 or 1 processes every query as a
    decode step.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise KernelError(f"dynamic_attention_reference: {name} must be a 4-d tensor [B, H, N, D], "
                              f"got {tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    b, hq, n, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[2] != n or k.shape[3] != d:
        raise KernelError(f"dynamic_attention_reference: k {tuple(k.shape)} and v {tuple(v.shape)} must be "
                          f"[B={b}, Hkv, N={n}, D={d}] like q {tuple(q.shape)}")
    hkv = k.shape[1]
    if hq % hkv != 0:
        raise KernelError(f"dynamic_attention_reference: Hq={hq} must be a multiple of Hkv={hkv} (GQA)")
    p = n if prefill_len is None else prefill_len
    if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p <= n:
        raise KernelError(f"dynamic_attention_reference: prefill_len must be an int in [0, {n}], got {p!r}")
    plan = pattern if isinstance(pattern, DynamicPlan) else plan_dynamic(pattern, max_len=n)
    if plan.max_len is not None and plan.columns is None and plan.max_len < n:
        raise PatternError(f"the plan was made for max_len={plan.max_len} < N={n}")
    state = H2OState(plan, b, hkv)
    out = torch.zeros(b, hq, n, d, dtype=torch.float64)
    attended = torch.zeros(b, hkv, n, n, dtype=torch.bool)
    bounds = [(0, max(p, 1))] + [(i, i + 1) for i in range(max(p, 1), n)]
    for i0, i1 in bounds:
        out[:, :, i0:i1] = state.step(q[:, :, i0:i1], k[:, :, :i1], v[:, :, :i1], scale=scale,
                                      other_inputs=other_inputs)
        attended[:, :, i0:i1, :i1] = state.last_step.attend
    return DynamicResult(out, attended, tuple(state.records), state.acc, plan)


__all__ = ["H2OState", "StepPlan", "StepRecord", "DynamicResult", "dynamic_attention_reference",
           "masked_attention", "top_b"]
