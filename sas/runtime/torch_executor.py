"""A pure-torch executor for static patterns over the compact KV cache of the Triton path.

Same layout as `SASAttnKernel`: a cache `[batch, kv_heads, cache_size, head_dim]` whose slot
for key `j` is `cache_id_func(j)`; a decode query at position `p` attends the slots `s` with
`mask_func(s, p)`. Both synthesized functions run here as torch expressions, lowered from the
analysis' ASTs by `sas.codegen.lower_triton` (dialect "torch"), so the executor runs on any
device torch supports (a laptop CPU, or CUDA tensors beside the Triton kernels).

Entry points (q [B, Hq, Lq, D], k, v [B, Hkv, Lk, D], Hq a multiple of Hkv):

- `prefill(q, k, v, positions=None)`: the queries are the last Lq of the Lk keys; the mask
  comes from the pattern's predicate on the keys' positions (default 0..Lk-1), computed per
  block of queries so that memory stays bounded (no [Lk, Lk] tensor per head).
- `new_cache`, `fill_cache(k, v, past_k, past_v, positions=None)`: a compact cache and a
  prompt written into it as token-by-token decoding would have left it.
- `decode(q, k, v, past_k, past_v, position)`: one token per row; `position` is an int or a
  LongTensor [B] (rows of a padded batch sit at different positions).
- `prefill_chunk(q, k, v, past_k, past_v, positions)`: chunked prefill: the chunk's queries
  attend the cache as it was before the chunk plus the chunk's own keys, then the chunk's
  keys are written. Equal to one prefill of the whole prompt.

Positions: a LongTensor [L] (shared by every row) or [B, L]; -1 marks a padding token, which
is never attended nor written and whose output is zero. A query that attends no key at all
(a padding token, or a pattern row without keys) outputs zero, as FlexAttention does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from sas.analysis import Analysis
from sas.codegen.lower_triton import (
    LoweredFunction,
    find_function,
    lower_function,
    lower_predicate,
    table_refs,
)
from sas.errors import KernelError, NotYetSupportedError
from sas.lang.pattern import Pattern
from sas.runtime.executor import register_backend

#: queries per block of the masked attention (bounds the score tensor to B x Hq x 128 x Lk)
BLOCK_Q = 128
#: a block gathers its attended key columns when they are at most this fraction of the range
GATHER_FRACTION = 0.5
#: a plan keeps its block masks (for reuse by other layers) up to this many mask elements
KEEP_LIMIT = 1 << 27
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True, eq=False)
class PlanBlock:
    """One block of queries `[q0, q1)`: the keys it reads (`cols`, or the range `[0, k_hi)`)
    and which of them each query attends (`mask` [Bm, q1 - q0, keys], Bm = 1 or B; None: all)."""

    q0: int
    q1: int
    k_hi: int
    cols: torch.Tensor | None
    mask: torch.Tensor | None
    empty: bool = False


class AttendPlan:
    """The masks of one masked-attention call, block by block. They depend only on the pattern
    and the positions, so every layer with the same pattern can reuse the plan: the blocks are
    built on first use and kept while their masks hold at most `keep_limit` elements (beyond
    that each use rebuilds them, so memory stays bounded by one block at long contexts)."""

    def __init__(self, q_len: int, k_len: int, rows: int, make: Callable[[int, int], PlanBlock] | None = None,
                 block_q: int = BLOCK_Q, blocks: tuple[PlanBlock, ...] | None = None,
                 keep_limit: int = KEEP_LIMIT):
        self.q_len, self.k_len, self.rows = q_len, k_len, rows
        self._make, self._block_q, self._keep_limit = make, block_q, keep_limit
        self._blocks = blocks

    def blocks(self) -> Iterator[PlanBlock]:
        if self._blocks is not None:
            yield from self._blocks
            return
        kept: list[PlanBlock] | None = []
        size = 0
        for q0 in range(0, self.q_len, self._block_q):
            blk = self._make(q0, min(q0 + self._block_q, self.q_len))
            if kept is not None:
                size += 0 if blk.mask is None else blk.mask.numel()
                kept = kept + [blk] if size <= self._keep_limit else None
            yield blk
        if kept is not None:
            self._blocks = tuple(kept)

    @property
    def kept(self) -> bool:
        """Whether the blocks are stored (built once, reused)."""
        return self._blocks is not None


@dataclass(frozen=True, eq=False)
class DecodePlan:
    """One decode step: each row's position [B] (-1: padding row), the slot its key goes to
    [B] (-1: not stored) and the plan over the attended slots."""

    positions: torch.Tensor
    slots: torch.Tensor
    attend: AttendPlan


def _compile(name: str, params: list[str], fn: LoweredFunction, table_args: list[str]) -> Callable[..., Any]:
    """A Python function from lowered torch text (parameters, then the table tensors)."""
    lines = [f"def {name}({', '.join(params + table_args)}):"]
    lines += [f"    {line}" for line in fn.lines]
    lines.append(f"    return {fn.expr}")
    namespace: dict[str, Any] = {"torch": torch}
    exec(compile("\n".join(lines) + "\n", f"<sas torch {name}>", "exec"), namespace)  # noqa: S102
    return namespace[name]


def _positions(where: str, positions: Any, length: int, batch: int, device: torch.device,
               max_len: int | None) -> torch.Tensor:
    """Positions as int64 [rows, length] (rows 1 or batch) on `device`, checked."""
    if positions is None:
        return torch.arange(length, device=device, dtype=torch.int64)[None]
    if not isinstance(positions, torch.Tensor) or positions.dtype not in (torch.int32, torch.int64):
        raise KernelError(f"{where}: positions must be an integer torch.Tensor [L] or [B, L] (-1 marks "
                          f"padding), got {type(positions).__name__ if not isinstance(positions, torch.Tensor) else positions.dtype}")
    p = positions.to(device=device, dtype=torch.int64)
    if p.dim() == 1:
        p = p[None]
    if p.dim() != 2 or p.shape[1] != length or p.shape[0] not in (1, batch):
        raise KernelError(f"{where}: positions must have shape [{length}] or [{batch}, {length}], "
                          f"got {list(positions.shape)}")
    if p.numel():
        lo, hi = int(p.min()), int(p.max())
        if lo < -1:
            raise KernelError(f"{where}: positions must be >= 0, or -1 for padding; got {lo}")
        if max_len is not None and hi >= max_len:
            raise KernelError(f"{where}: position {hi} is past max_len={max_len} (the cache analysis covers "
                              f"positions 0..{max_len - 1}); build the executor with a larger max_len")
        prev = torch.cat([torch.full_like(p[:, :1], -1), torch.cummax(p, dim=1).values[:, :-1]], dim=1)
        if bool(((p >= 0) & (p <= prev)).any()):
            raise KernelError(f"{where}: the positions of each row must increase along the sequence "
                              f"(padding, -1, anywhere)")
    return p


class TorchExecutor:
    """Pure-torch prefill / decode of a static `pattern` over the compact cache described by
    `analysis` (`sas.analyze(pattern, max_len)`); with `analysis=None` only `prefill` runs
    (patterns without a decode cache, e.g. non-causal ones)."""

    #: the dtypes it takes (float64 too: a reference in double precision)
    DTYPES = FLOAT_DTYPES

    def __init__(self, pattern: Pattern, analysis: Analysis | None = None, *, block_q: int = BLOCK_Q):
        if not isinstance(pattern, Pattern):
            raise KernelError(f"TorchExecutor: pattern must be a sas Pattern, got {type(pattern).__name__}")
        if pattern.dynamics():
            raise NotYetSupportedError(
                f"TorchExecutor: {pattern!r} has a Dynamic component; the torch executor runs static "
                f"patterns only; dynamic selection runs on the Triton kernels (SASAttnKernel, CUDA or "
                f"TRITON_INTERPRET=1)")
        if analysis is not None and (not isinstance(analysis, Analysis) or analysis.pattern != pattern):
            raise KernelError("TorchExecutor: analysis must be sas.analyze(pattern, max_len) of this pattern")
        if isinstance(block_q, bool) or not isinstance(block_q, int) or block_q < 1:
            raise KernelError(f"TorchExecutor: block_q must be a positive integer, got {block_q!r}")
        self.pattern = pattern
        self.analysis = analysis
        self.block_q = block_q
        self._predicate = _compile("sas_predicate", ["i", "j"],
                                   LoweredFunction((), lower_predicate(pattern, "i", "j", dialect="torch")), [])
        self._tables: dict[str, tuple[int, ...]] = {}
        self._tables_on: dict[str, dict[str, torch.Tensor]] = {}
        self._mask_fn: Callable[..., Any] | None = None
        self._codes_on: dict[str, torch.Tensor] = {}
        if analysis is None:
            return
        functions = analysis.functions
        refs = table_refs(dict(analysis.tables))
        self._tables = {ref.arg: ref.values for ref in refs.values()}
        targs = sorted(self._tables)
        cid = lower_function(find_function(functions, "cache_id_func"), ["pos"], refs, module=functions,
                             prefix="cid_", dialect="torch")
        self._cache_id_fn = _compile("sas_cache_id", ["pos"], cid, targs)
        try:
            msk = lower_function(find_function(functions, "mask_func"), ["slot", "pos"], refs, boolean=True,
                                 module=functions, prefix="msk_", dialect="torch")
            self._mask_fn = _compile("sas_mask", ["slot", "pos"], msk, targs)
        except NotYetSupportedError:
            # mask_func is a table search (bisect): decode then applies the pattern's predicate
            # to the key each slot holds, which is what mask_func computes.
            self._mask_fn = None

    def __reduce__(self) -> tuple[Any, ...]:
        """Copies and pickles are built again from the pattern and analysis (the lowered
        functions are compiled text; the per-device tensors are remade on demand)."""
        return _rebuilt, (self.pattern, self.analysis, self.block_q, getattr(self, "plan", None))

    # --- properties ------------------------------------------------------------------------
    @property
    def max_len(self) -> int | None:
        return None if self.analysis is None else self.analysis.max_len

    @property
    def cache_size(self) -> int:
        """Slots of the compact cache per (batch, kv head)."""
        self._need_cache("TorchExecutor.cache_size")
        return max(1, int(self.analysis.cache_size))

    def _need_cache(self, where: str) -> None:
        if self.analysis is None:
            raise KernelError(f"{where}: this executor has no cache analysis (built with analysis=None); "
                              f"pass sas.analyze(pattern, max_len) to decode")

    # --- the synthesized functions, vectorized ---------------------------------------------
    def _table_args(self, device: torch.device) -> dict[str, torch.Tensor]:
        key = str(device)
        if key not in self._tables_on:
            self._tables_on[key] = {name: torch.tensor(values or (0,), dtype=torch.int64, device=device)
                                    for name, values in self._tables.items()}
        return self._tables_on[key]

    def predicate(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """The pattern's membership on broadcastable int64 tensors of positions (>= 0)."""
        out = self._predicate(i, j)
        shape = torch.broadcast_shapes(i.shape, j.shape)
        return torch.as_tensor(out, dtype=torch.bool, device=i.device).expand(shape)

    def cache_ids(self, pos: torch.Tensor) -> torch.Tensor:
        """cache_id_func on an int64 tensor of positions (-1 stays -1: padding is never stored)."""
        self._need_cache("TorchExecutor.cache_ids")
        out = self._cache_id_fn(pos, **self._table_args(pos.device))
        out = torch.as_tensor(out, dtype=torch.int64, device=pos.device).expand(pos.shape)
        return torch.where(pos >= 0, out, -1)

    def _codes(self, device: torch.device) -> torch.Tensor:
        """Sorted `slot * max_len + key` over every stored key below max_len."""
        key = str(device)
        if key not in self._codes_on:
            n = self.analysis.max_len
            cid = torch.from_numpy(self.analysis.cache_ids(n).astype("int64"))
            j = torch.nonzero(cid >= 0)[:, 0]
            self._codes_on[key] = torch.sort(cid[j] * n + j).values.to(device)
        return self._codes_on[key]

    def held_keys(self, pos: torch.Tensor) -> torch.Tensor:
        """[B, cache_size]: the key each slot holds once key `pos[b]` is written (the last key
        `j <= pos` with `cache_id_func(j) == slot`), -1 if none; all -1 where pos < 0. A held
        key whose lifetime is over is still returned: the pattern's predicate rejects it."""
        self._need_cache("TorchExecutor.held_keys")
        n, C = self.analysis.max_len, self.cache_size
        codes = self._codes(pos.device)
        slots = torch.arange(C, device=pos.device, dtype=torch.int64)
        want = slots[None, :] * n + pos.clamp(min=0)[:, None]
        idx = torch.searchsorted(codes, want, right=True) - 1
        got = codes[idx.clamp(min=0)] if codes.numel() else torch.zeros_like(want)
        ok = (idx >= 0) & (got // n == slots[None, :]) & (pos[:, None] >= 0)
        return torch.where(ok, got % n, -1)

    def attended_slots(self, pos: torch.Tensor) -> torch.Tensor:
        """[B, cache_size] bool: `mask_func(slot, pos[b])` for every slot, after key `pos[b]`
        is written; all False where pos < 0."""
        self._need_cache("TorchExecutor.attended_slots")
        C = self.cache_size
        p = pos[:, None]
        if self._mask_fn is not None:
            slots = torch.arange(C, device=pos.device, dtype=torch.int64)[None, :]
            m = self._mask_fn(slots, p, **self._table_args(pos.device))
            m = torch.as_tensor(m, dtype=torch.bool, device=pos.device).expand(pos.shape[0], C)
        else:
            held = self.held_keys(pos)
            m = (held >= 0) & self.predicate(p, held)
        return m & (p >= 0)

    # --- masked attention ------------------------------------------------------------------
    def attend_plan(self, q_pos: torch.Tensor, k_pos: torch.Tensor, *, ordered: bool = False) -> AttendPlan:
        """Masks for queries at `q_pos` [R, Lq] over keys at `k_pos` [R, Lk] (R = 1 or B; -1:
        no token). `ordered`: query t never attends a key of index > Lk - Lq + t (true for a
        causal pattern when the keys are in position order and the queries are the last Lq)."""
        R = max(q_pos.shape[0], k_pos.shape[0])
        Lq, Lk = q_pos.shape[1], k_pos.shape[1]
        shift = Lk - Lq

        def make(q0: int, q1: int) -> PlanBlock:
            k_hi = min(Lk, shift + q1) if ordered else Lk
            qp = q_pos[:, q0:q1, None]
            kp = k_pos[:, None, :k_hi]
            m = (qp >= 0) & (kp >= 0) & self.predicate(qp.clamp(min=0), kp.clamp(min=0))
            on = m.any(dim=1).any(dim=0)
            n_on = int(on.sum())
            if n_on == 0:
                return PlanBlock(q0, q1, 0, None, None, empty=True)
            cols = None
            if n_on <= GATHER_FRACTION * k_hi:
                cols = torch.nonzero(on)[:, 0]
                m = m[:, :, cols]
            return PlanBlock(q0, q1, k_hi, cols, None if bool(m.all()) else m)

        return AttendPlan(Lq, Lk, R, make, self.block_q)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: AttendPlan,
               scale: float | None = None) -> torch.Tensor:
        """Softmax attention of q over k, v restricted by `plan`; rows without keys give 0."""
        B, Hq, Lq, D = q.shape
        Hkv = k.shape[1]
        G = Hq // Hkv
        scale = D ** -0.5 if scale is None else float(scale)
        ct = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        out = torch.zeros(B, Hkv, G, Lq, v.shape[3], dtype=ct, device=q.device)
        qg = q.view(B, Hkv, G, Lq, D)
        for blk in plan.blocks():
            if blk.empty:
                continue
            n = blk.q1 - blk.q0
            if blk.cols is None:
                kb, vb = k[:, :, :blk.k_hi], v[:, :, :blk.k_hi]
            else:
                kb, vb = k.index_select(2, blk.cols), v.index_select(2, blk.cols)
            qb = qg[:, :, :, blk.q0:blk.q1].to(ct).reshape(B, Hkv, G * n, D)
            s = torch.matmul(qb, kb.to(ct).transpose(-1, -2)).view(B, Hkv, G, n, -1) * scale
            if blk.mask is not None:
                s = s.masked_fill(~blk.mask[:, None, None], -math.inf)
            mx = s.amax(dim=-1, keepdim=True)
            mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
            p = torch.exp(s - mx)
            denom = p.sum(dim=-1, keepdim=True)
            o = torch.matmul(p.view(B, Hkv, G * n, -1), vb.to(ct)).view(B, Hkv, G, n, -1)
            out[:, :, :, blk.q0:blk.q1] = torch.where(denom > 0, o / torch.where(denom > 0, denom, 1), 0)
        res = out.view(B, Hq, Lq, -1).to(q.dtype)
        if torch.is_grad_enabled() and not res.requires_grad and (q.requires_grad or k.requires_grad
                                                                   or v.requires_grad):
            # no query attends a key: zeros, still in the graph (zero gradients, as dense attention gives)
            res = res + (q.sum() + k.sum() + v.sum()).to(res.dtype) * 0
        return res

    # --- checks ----------------------------------------------------------------------------
    @staticmethod
    def _check(where: str, **tensors: torch.Tensor) -> None:
        first = None
        for name, t in tensors.items():
            if not isinstance(t, torch.Tensor):
                raise KernelError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() != 4:
                raise KernelError(f"{where}: {name} must be 4-D [batch, heads, seq, head_dim], got shape "
                                  f"{tuple(t.shape)}")
            if t.dtype not in FLOAT_DTYPES:
                raise KernelError(f"{where}: {name} has dtype {t.dtype}; supported: float16, bfloat16, "
                                  f"float32, float64")
            if first is None:
                first = (name, t)
                continue
            fname, f = first
            if t.dtype != f.dtype or t.device != f.device:
                raise KernelError(f"{where}: {name} is {t.dtype} on {t.device} but {fname} is {f.dtype} on "
                                  f"{f.device}; all tensors must share one dtype and device")
            if t.shape[0] != f.shape[0] or t.shape[3] != f.shape[3]:
                raise KernelError(f"{where}: {name} {tuple(t.shape)} and {fname} {tuple(f.shape)} must share "
                                  f"batch and head_dim")

    def _check_qkv(self, where: str, q, k, v) -> None:
        self._check(where, q=q, k=k, v=v)
        if k.shape != v.shape:
            raise KernelError(f"{where}: k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
        if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
            raise KernelError(f"{where}: q has {q.shape[1]} heads and k/v have {k.shape[1]}; the query heads "
                              f"must be a multiple of the kv heads (GQA)")
        if q.shape[2] > k.shape[2]:
            raise KernelError(f"{where}: q has {q.shape[2]} positions but k/v only {k.shape[2]}; the queries "
                              f"must be the last Lq <= Lk positions")

    def _check_cache(self, where: str, past_k, past_v, k) -> None:
        self._check(where, k=k, past_k=past_k, past_v=past_v)
        want = (k.shape[0], k.shape[1], self.cache_size, k.shape[3])
        for name, c in (("past_k", past_k), ("past_v", past_v)):
            if tuple(c.shape) != want:
                raise KernelError(f"{where}: {name} must have shape [batch, kv_heads, cache_size, head_dim] = "
                                  f"{list(want)}, got {list(c.shape)}")
            if c.is_inference() and not torch.is_inference_mode_enabled():
                raise KernelError(f"{where}: {name} was made under torch.inference_mode(), and torch writes such "
                                  f"a tensor in place only inside it; run this step under torch.inference_mode() "
                                  f"too, or make the cache (or the prompt's prefill) outside it")

    # --- prefill ---------------------------------------------------------------------------
    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, positions: Any = None,
                scale: float | None = None, plan: AttendPlan | None = None) -> torch.Tensor:
        """Attention of the last Lq keys' queries over k, v under the pattern (no cache).
        `positions` [Lk] or [B, Lk] of the keys (default 0..Lk-1, -1 = padding)."""
        where = "TorchExecutor.prefill"
        self._check_qkv(where, q, k, v)
        if plan is None:
            plan = self.prefill_plan(positions, k.shape[2], q.shape[2], k.shape[0], q.device)
        elif plan.q_len != q.shape[2] or plan.k_len != k.shape[2] or plan.rows not in (1, q.shape[0]):
            raise KernelError(f"{where}: the plan is for {plan.q_len} queries over {plan.k_len} keys, got "
                              f"{q.shape[2]} over {k.shape[2]}")
        return self.attend(q, k, v, plan, scale)

    def prefill_plan(self, positions: Any, k_len: int, q_len: int, batch: int, device: Any) -> AttendPlan:
        """The plan `prefill` uses for these positions (reusable across layers)."""
        p = _positions("TorchExecutor.prefill", positions, k_len, batch, torch.device(device), self.max_len)
        # a pattern causal within max_len (what the analysis proves) need not be past it: the keys
        # above the diagonal are skipped only for positions inside max_len (given positions are
        # checked to be; the default 0..Lk-1 may reach past it, as the Triton backend allows)
        within = positions is not None or (self.max_len is not None and k_len <= self.max_len)
        return self.attend_plan(p[:, k_len - q_len:], p, ordered=self.analysis is not None and within)

    # --- compact cache ---------------------------------------------------------------------
    def new_cache(self, batch: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype = torch.float32,
                  device: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Zeroed compact caches (k, v), each [batch, num_kv_heads, cache_size, head_dim]."""
        for name, x in (("batch", batch), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
            if isinstance(x, bool) or not isinstance(x, int) or x < 1:
                raise KernelError(f"TorchExecutor.new_cache: {name} must be a positive integer, got {x!r}")
        shape = (batch, num_kv_heads, self.cache_size, head_dim)
        return (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    def _write(self, k: torch.Tensor, v: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor,
               p: torch.Tensor) -> None:
        """Write token t of each row to slot cache_id_func(p[b, t]); the last writer wins."""
        B, L, C = k.shape[0], k.shape[2], self.cache_size
        slot = self.cache_ids(p).expand(B, L)
        t = torch.arange(L, device=k.device).expand(B, L)
        rows = torch.arange(B, device=k.device)[:, None].expand(B, L)
        ok = slot >= 0
        if not bool(ok.any()):
            return
        last = torch.full((B * C,), -1, dtype=torch.int64, device=k.device)
        last.scatter_reduce_(0, (rows * C + slot)[ok], t[ok], reduce="amax")
        sel = torch.nonzero(last >= 0)[:, 0]
        b_idx, s_idx, t_idx = sel // C, sel % C, last[sel]
        past_k[b_idx, :, s_idx] = k[b_idx, :, t_idx].to(past_k.dtype)
        past_v[b_idx, :, s_idx] = v[b_idx, :, t_idx].to(past_v.dtype)

    def fill_cache(self, k: torch.Tensor, v: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor, *,
                   positions: Any = None) -> None:
        """Write a prompt's keys/values (positions default 0..L-1, -1 = padding) into the compact
        caches as token-by-token decoding would have left them."""
        where = "TorchExecutor.fill_cache"
        self._need_cache(where)
        self._check(where, k=k, v=v)
        if k.shape != v.shape:
            raise KernelError(f"{where}: k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
        self._check_cache(where, past_k, past_v, k)
        p = _positions(where, positions, k.shape[2], k.shape[0], k.device, self.max_len)
        self._write(k, v, past_k, past_v, p)

    # --- decode ----------------------------------------------------------------------------
    def decode_plan(self, position: int | torch.Tensor, batch: int, device: Any = None) -> DecodePlan:
        """The slots a decode step at `position` (int, or LongTensor [B]) writes and attends
        (reusable by every layer with the same pattern)."""
        where = "TorchExecutor.decode"
        self._need_cache(where)
        if isinstance(position, bool) or not isinstance(position, (int, torch.Tensor)):
            raise KernelError(f"{where}: position must be an int or an integer tensor [B], got {position!r}")
        if isinstance(position, int):
            if position < 0:
                raise KernelError(f"{where}: position must be a non-negative integer, got {position}")
            pos = torch.full((batch, 1), position, dtype=torch.int64, device=device)
        else:
            if position.dim() != 1 or position.shape[0] != batch:
                raise KernelError(f"{where}: position must be an int or a tensor [B={batch}], got shape "
                                  f"{list(position.shape)}")
            pos = position[:, None]
        pos = _positions(where, pos, 1, batch, pos.device, self.max_len)[:, 0].expand(batch).contiguous()
        return DecodePlan(pos, self.cache_ids(pos), self._slot_plan(self.attended_slots(pos)))

    def decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past_k: torch.Tensor,
               past_v: torch.Tensor, position: int | torch.Tensor, *, scale: float | None = None,
               plan: DecodePlan | None = None) -> torch.Tensor:
        """One token per row at `position` (int, or LongTensor [B]; -1: a padding row, output 0,
        nothing written): writes k, v to slot cache_id_func(position) of the caches (in place),
        then attends the slots mask_func(slot, position). Returns [B, Hq, 1, D]. `plan`: a
        `decode_plan` for this position (then `position` is not read)."""
        where = "TorchExecutor.decode"
        self._need_cache(where)
        self._check_qkv(where, q, k, v)
        self._check_cache(where, past_k, past_v, k)
        if q.shape[2] != 1 or k.shape[2] != 1:
            raise KernelError(f"{where}: decode takes one token: q [B, Hq, 1, D] and k, v [B, Hkv, 1, D], got "
                              f"q length {q.shape[2]} and k length {k.shape[2]}")
        if plan is None:
            plan = self.decode_plan(position, q.shape[0], q.device)
        elif plan.positions.shape[0] != q.shape[0]:
            raise KernelError(f"{where}: the plan is for a batch of {plan.positions.shape[0]}, got {q.shape[0]}")
        rows = torch.nonzero(plan.slots >= 0)[:, 0]
        past_k[rows, :, plan.slots[rows]] = k[rows, :, 0].to(past_k.dtype)
        past_v[rows, :, plan.slots[rows]] = v[rows, :, 0].to(past_v.dtype)
        kk, vv = past_k, past_v
        if torch.is_grad_enabled() and (past_k.requires_grad or past_v.requires_grad):
            # autograd keeps what the products read: a copy, so that the next step's in-place
            # write to the cache does not change a tensor saved for this step's backward
            kk, vv = past_k.clone(), past_v.clone()
        return self.attend(q, kk, vv, plan.attend, scale)

    def _slot_plan(self, attended: torch.Tensor) -> AttendPlan:
        """A one-query plan over the cache slots `attended` [B, C]: only the slots some row
        attends are read when they are few (a causal cache early in a long max_len)."""
        C = attended.shape[1]
        on = attended.any(dim=0)
        n_on = int(on.sum())
        if n_on == 0:
            blk = PlanBlock(0, 1, 0, None, None, empty=True)
        elif n_on <= GATHER_FRACTION * C:
            cols = torch.nonzero(on)[:, 0]
            blk = PlanBlock(0, 1, C, cols, attended[:, None, cols])
        else:
            blk = PlanBlock(0, 1, C, None, attended[:, None, :])
        return AttendPlan(1, C, attended.shape[0], blocks=(blk,))

    # --- chunked prefill -------------------------------------------------------------------
    def chunk_plan(self, positions: torch.Tensor, batch: int) -> AttendPlan:
        """The plan of `prefill_chunk` for a chunk at `positions` [C] or [B, C] (reusable across
        layers): cache slots (holding the keys as before the chunk) then the chunk's keys."""
        where = "TorchExecutor.prefill_chunk"
        self._need_cache(where)
        if not isinstance(positions, torch.Tensor):
            raise KernelError(f"{where}: positions must be an integer tensor [C] or [B, C] (the chunk's "
                              f"positions, -1 for padding), got {type(positions).__name__}")
        L = positions.shape[-1]
        p = _positions(where, positions, L, batch, positions.device, self.max_len)
        start = torch.where(p >= 0, p, torch.iinfo(torch.int64).max).amin(dim=1)
        before = torch.where(start == torch.iinfo(torch.int64).max, -1, start - 1)
        held = self.held_keys(before)                                         # [R, C]
        return self.attend_plan(p, torch.cat([held, p], dim=1), ordered=True)

    def prefill_chunk(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past_k: torch.Tensor,
                      past_v: torch.Tensor, positions: torch.Tensor, *, scale: float | None = None,
                      plan: AttendPlan | None = None) -> torch.Tensor:
        """A prompt chunk (q [B, Hq, C, D], k, v [B, Hkv, C, D] at `positions` [C] or [B, C], each
        row's positions following the keys already in the cache): attends the cache as it was
        before the chunk plus the chunk's own keys, then writes the chunk's keys."""
        where = "TorchExecutor.prefill_chunk"
        self._need_cache(where)
        self._check_qkv(where, q, k, v)
        self._check_cache(where, past_k, past_v, k)
        if q.shape[2] != k.shape[2]:
            raise KernelError(f"{where}: a chunk has one query per key, got q length {q.shape[2]} and k "
                              f"length {k.shape[2]}")
        if plan is None:
            plan = self.chunk_plan(positions, q.shape[0])
        elif plan.q_len != q.shape[2] or plan.k_len != self.cache_size + k.shape[2]:
            raise KernelError(f"{where}: the plan does not match this chunk")
        p = _positions(where, positions, k.shape[2], k.shape[0], k.device, self.max_len)
        out = self.attend(q, torch.cat([past_k, k.to(past_k.dtype)], dim=2),
                          torch.cat([past_v, v.to(past_v.dtype)], dim=2), plan, scale)
        self._write(k, v, past_k, past_v, p)
        return out


def torch_runtime(plan: Any, *, num_splits: int | None = None, cache_dir: Any = None) -> TorchExecutor:
    """`SASAttnKernel(..., backend="torch")`: the executor of a static `sas.plan.Plan`
    (`num_splits` and `cache_dir` concern the Triton kernels and are ignored)."""
    executor = TorchExecutor(plan.pattern, plan.analysis if plan.can_decode else None)
    executor.plan = plan
    return executor


register_backend("torch", torch_runtime)


def _rebuilt(pattern: Pattern, analysis: Analysis | None, block_q: int, plan: Any = None) -> TorchExecutor:
    executor = TorchExecutor(pattern, analysis, block_q=block_q)
    if plan is not None:            # the StaticRuntime protocol's plan (torch_runtime sets it)
        executor.plan = plan
    return executor


__all__ = ["TorchExecutor", "torch_runtime", "AttendPlan", "DecodePlan", "PlanBlock", "BLOCK_Q"]
