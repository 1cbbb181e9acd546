"""Host side of the dynamic decode kernels (docs/dynamic.md, section 7): the device state of one
sequence batch, the kernel launches, and the prefill / decode orchestration (`Runtime`).

This module imports only torch: `sas compile` copies it next to the generated kernel module
(`dynamic_decode.py`), and `sas.runtime.dynamic.DynamicRuntime` uses it in place. The kernel
module is passed in (`kernels`): it holds the Triton kernels (`ATTN_KERNEL`, `FLAGS_KERNEL`,
`COMBINE_KERNEL`, `SCORE_KERNEL`, `UPDATE_KERNEL`), the layout constants (`STATIC_SIZE`, `POOL_SIZE`,
`TOTAL`, `MAX_LEN`, `BUDGET`, `REFRESH`, `MAX_ENTERING`, `REDUCE`, `BLOCK_N`, `NUM_WARPS`,
`STATIC_SPARSE`, `FLAG_N`, `FLAGS_FROM_BLOCKS`) and the pattern's torch
functions (`region(i, j)`, `cache_ids(token_ids)`, `epilogue(x)`).

    rt = Runtime(dynamic_decode, static_decode, tables)   # tables: the region schedule
    out = rt.prefill(prefill, q, k, v)                    # the prompt's prefill module
    out = rt.decode(q1, k1, v1)                           # one token per call
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any, Callable, Mapping

import torch

try:      # a sibling module, in sas and in `sas compile`'s output package
    from .graph_params import PointerSlots
except ImportError:     # this file loaded on its own: replayed steps copy their tensors
    PointerSlots = None

LOG2E = 1.4426950408889634
#: a replayed decode step reads the caller's q, k, v and writes a fresh output through rebound
#: kernel arguments (`StepGraph`); SAS_GRAPH_REBIND=0 copies them in and out instead
POINTER_REBINDING = os.environ.get("SAS_GRAPH_REBIND", "1") != "0"
TABLE_NAMES = ("enter_at", "region_last", "enter_ptr", "enter_keys")
#: the update's score pass runs as a launch of its own, SCORE_SLOTS slots a program, from caches
#: of SPLIT_SCORE_FROM slots on (below, the update kernel's one program per KV head walks them)
SCORE_SLOTS = 512
SPLIT_SCORE_FROM = 1024
#: warps of the update kernel's one program per KV head
UPDATE_WARPS = 4
#: slots a block of the attention kernel takes for a GQA group in bf16 / fp16 (H100, 32 / 8
#: heads at batch 16, head dim 128: 128 slots were 12-29% faster a step than 64;
#: docs/benchmarks.md), where the shared memory holds them (`attend_block_n`)
GROUP_BLOCK_N = 128


#: one query row a KV head (MHA) through the query groups' `tl.dot` loop (the row padded to 16),
#: whose loads Triton pipelines, instead of the CUDA-core loop: off. Not measured yet
#: (`benchmarks/sweep_dynamic_attend.py --mha-dot`); a State's `use_dot` overrides it.
MHA_DOT = False


def attend_stages(use_dot: bool, dtype: torch.dtype) -> int:
    """Pipeline stages of the attention's slot loop. A query group's loop (`use_dot`) has no
    branch, so Triton pipelines its loads: with 4-byte tiles two stages need up to 148 KB of
    shared memory a program (64-slot blocks, head dim 256; sm_90 PTX), over sm_86 / sm_89's
    99 KB, so fp32 takes one (the shared memory the loop took before it lost its branch,
    2026-11-28). 2-byte tiles take two (36.6 KB at 128 slots, head dim 128). One query row's
    loop is not pipelined either way."""
    return 1 if use_dot and dtype.itemsize > 2 else 2


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (>= 1)."""
    return 1 << max(0, int(n) - 1).bit_length()


def _interpreting_bf16(dtype: torch.dtype) -> bool:
    """Triton's CPU interpreter has no bf16 arithmetic: the kernels compute in fp32 there."""
    return dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"


#: a query group's attention (`tl.dot`) takes the one-wave split rule of `num_splits_for` from
#: this many programs a split (batch x KV heads) on
GROUP_ONE_WAVE_FROM = 16


def num_splits_for(kernels: ModuleType, batch: int, num_kv_heads: int, *, block_n: int | None = None,
                   group: int = 1, num_sms: int = 132, waves: int = 2, blocks_per_split: int = 2,
                   max_splits: int = 128) -> int:
    """Splits of the slot range.

    One query row a KV head (`group` 1): fewer slot blocks per program than the static decode
    kernel, since its loop (no `tl.dot`, a block-skipping branch) is not software-pipelined, so
    memory parallelism comes from more programs instead (at least `waves` programs an SM, at most
    `blocks_per_split` blocks a program).

    A query group (`tl.dot`) with at least GROUP_ONE_WAVE_FROM programs a split: as many splits
    as fill one wave of `waves` programs an SM, no more (H100, 32 / 8 heads, bf16, 128-slot
    blocks, 16K, Table-1 patterns + H2O: at batch 16 two splits were the fastest step for all
    six patterns, OpenAI-strided 187 -> 135 us and strided block-local 32 -> 25 against the
    rule above; likewise at batch 2, 4, 8 and 64; docs/benchmarks.md). Below that (batch 1 x 8
    KV heads) the rule above stays: there 65 splits beat 33 on OpenAI-strided (26 vs 31 us)."""
    block_n = kernels.BLOCK_N if block_n is None else block_n
    blocks = max(1, -(-kernels.TOTAL // block_n))
    programs = max(1, batch * num_kv_heads)
    if group > 1 and programs >= GROUP_ONE_WAVE_FROM:
        return max(1, min(blocks, waves * num_sms // programs, max_splits))
    want = -(-waves * num_sms // programs)
    want = min(max(want, -(-blocks // blocks_per_split)), max_splits)
    return max(1, min(blocks, want))


def uses_flags(kernels: ModuleType, block_n: int) -> bool:
    """Whether the attention skips slot blocks through the flags kernel's per-step flags: where a
    decode row attends under half of the static segment (the module's STATIC_SPARSE) and that
    segment spans at least the module's FLAGS_FROM_BLOCKS blocks of `block_n` slots (block_n a
    multiple of FLAG_N)."""
    return (bool(kernels.STATIC_SPARSE) and block_n % kernels.FLAG_N == 0
            and -(-kernels.STATIC_SIZE // block_n) >= kernels.FLAGS_FROM_BLOCKS)


def attend_block_n(kernels: ModuleType, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                   device: Any) -> int:
    """Slots a block of the attention kernel takes: 32 for one query head per KV head (no
    tl.dot; a ragged last block costs less); GROUP_BLOCK_N for a GQA group in bf16 / fp16 (tl.dot
    over the group padded to 16 rows) where the device's shared memory holds two stages of K and
    V tiles of that many slots with room to spare (H100, A100; the CPU interpreter); otherwise
    the module's BLOCK_N."""
    if num_heads == num_kv_heads:
        return min(32, kernels.BLOCK_N)
    if dtype in (torch.float16, torch.bfloat16):
        dev = torch.device(device)
        if dev.type != "cuda" or _shared_memory(dev) >= 2 * 2 * GROUP_BLOCK_N * head_dim * 2 + 32 * 1024:
            return max(GROUP_BLOCK_N, kernels.BLOCK_N)
    return kernels.BLOCK_N


def _shared_memory(dev: torch.device) -> int:
    """Shared memory of one multiprocessor of a CUDA device (bytes)."""
    props = torch.cuda.get_device_properties(dev)
    smem = getattr(props, "shared_memory_per_multiprocessor", None)
    if smem is None:    # a torch without the field: the data-centre parts (sm_80/90/100) have 164-228 KB
        smem = (164 if (props.major, props.minor) in ((8, 0), (9, 0), (10, 0)) else 100) * 1024
    return int(smem)


class State:
    """Device state of one sequence batch: the compact cache (static segment + pool), the
    accumulated scores per slot, the pool's keys and flags, and scratch buffers. The attention's
    slot block and split count follow `attend_block_n` / `num_splits_for` unless given."""

    def __init__(self, kernels: ModuleType, batch: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: Any, num_splits: int | None = None, block_n: int | None = None,
                 use_dot: bool | None = None):
        B, H, Hkv, D = batch, num_heads, num_kv_heads, head_dim
        #: the attention's loop: `tl.dot` over the query rows padded to 16 (always for a query
        #: group; for one row a KV head where `use_dot` or, if None, MHA_DOT), else CUDA cores
        self.use_dot = H > Hkv or (MHA_DOT if use_dot is None else bool(use_dot))
        total, pool = kernels.TOTAL, kernels.POOL_SIZE
        self.k = torch.zeros(B, Hkv, total, D, dtype=dtype, device=device)
        self.v = torch.zeros(B, Hkv, total, D, dtype=dtype, device=device)
        self.acc = torch.zeros(B * Hkv, total, dtype=torch.float32, device=device)
        self.flags = torch.zeros(B * Hkv, pool, dtype=torch.int8, device=device)
        self.keys = torch.full((B * Hkv, pool), -1, dtype=torch.int32, device=device)
        self.new_pool = torch.full((B * Hkv,), -1, dtype=torch.int32, device=device)
        self.enter_dst = torch.zeros(B * Hkv, kernels.MAX_ENTERING, dtype=torch.int32, device=device)
        self.sraw = torch.empty(B * H, total, dtype=torch.float32, device=device)
        self.block_n = block_n or attend_block_n(kernels, H, Hkv, D, dtype, device)
        #: per-step flags of FLAG_N-slot ranges holding an attended static slot or a pool slot
        #: (`skip_flags`: the flags kernel writes them and the attention skips unflagged blocks)
        self.skip_flags = uses_flags(kernels, self.block_n)
        self.sflags = torch.ones(max(1, -(-total // kernels.FLAG_N)), dtype=torch.int32, device=device)
        blocks = max(1, -(-total // self.block_n))
        dev = torch.device(device)
        sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 132
        ns = num_splits or num_splits_for(kernels, B, Hkv, block_n=self.block_n, group=H // Hkv, num_sms=sms)
        ns = max(1, min(ns, blocks))
        self.split_size = -(-blocks // ns) * self.block_n
        self.num_splits = max(1, -(-total // self.split_size))
        n = B * H * self.num_splits
        #: the decode position in device memory, read by the kernels when a CUDA graph replays
        #: the step (`pos_on_device`)
        self.pos = torch.zeros(1, dtype=torch.int32 if kernels.MAX_LEN < 2 ** 31 else torch.int64, device=device)
        #: the update kernel's ticket counter for advancing `pos` (`update(..., advance=True)`):
        #: 0 between launches, since each program draws one ticket and the one drawing the last
        #: sets it back. Only an update kernel stopped part-way leaves it elsewhere (a device
        #: fault, after which the CUDA context takes no more work; on the CPU interpreter, an
        #: exception inside the kernel), and such a step has already left the pool half updated;
        #: the next prompt (`Runtime.start`) makes a new State, with the counter at 0.
        self.pos_ticket = torch.zeros(1, dtype=torch.int32, device=device)
        self.mpart = torch.empty(n, dtype=torch.float32, device=device)
        self.lpart = torch.empty(n, dtype=torch.float32, device=device)
        self.apart = torch.empty(n * D, dtype=torch.float32, device=device)
        self.shape = (B, H, Hkv, D)


def attend(kernels: ModuleType, state: State, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
           pos: int, out: torch.Tensor, sm_scale: float | None = None, use_dot: bool | None = None,
           pos_on_device: bool = False, combine: bool = True) -> torch.Tensor:
    """The attention of query `pos` (q [B, Hq, 1, D]; k_new, v_new [B, Hkv, 1, D]) over the
    static segment and the loaded pool slots; writes the new key, the raw scores and the row
    statistics into `state` and the output into `out`. `pos_on_device`: the kernel reads the
    position from `state.pos` instead (what a CUDA graph of the step needs). `combine=False`:
    the splits are left in `state` for `update(..., out=out)` to merge (what `step` does)."""
    B, H, _, D = q.shape
    Hkv = k_new.shape[1]
    group = H // Hkv
    if sm_scale is None:
        sm_scale = D ** -0.5
    if use_dot is None:
        use_dot = state.use_dot
    g_pad = max(16, next_power_of_2(group)) if use_dot else next_power_of_2(group)
    kc, vc = state.k, state.v
    if state.skip_flags:
        kernels.FLAGS_KERNEL[(state.sflags.numel(),)](
            state.sflags, pos, state.pos, STATIC=kernels.STATIC_SIZE, POOL=kernels.POOL_SIZE,
            FLAG_N=kernels.FLAG_N, POS_PTR=bool(pos_on_device), num_warps=1,
        )
    kernels.ATTN_KERNEL[(state.num_splits, B * Hkv)](
        q, k_new, v_new, kc, vc, out, state.mpart, state.lpart, state.apart, state.sraw, state.acc,
        state.flags, state.keys, state.new_pool, pos, state.pos, state.sflags,
        q.stride(0), q.stride(1), q.stride(3),
        k_new.stride(0), k_new.stride(1), k_new.stride(3),
        v_new.stride(0), v_new.stride(1), v_new.stride(3),
        kc.stride(0), kc.stride(1), kc.stride(2), kc.stride(3),
        vc.stride(0), vc.stride(1), vc.stride(2), vc.stride(3),
        out.stride(0), out.stride(1), out.stride(3),
        Hkv, sm_scale * LOG2E,
        STATIC=kernels.STATIC_SIZE, POOL=kernels.POOL_SIZE, GROUP=group, G_PAD=g_pad, HEAD_DIM=D,
        BLOCK_N=state.block_n, SPLIT_SIZE=state.split_size, NUM_SPLITS=state.num_splits, USE_DOT=use_dot,
        DOT_PRECISION=("ieee" if q.dtype == torch.float32 else "tf32"), UPCAST=_interpreting_bf16(q.dtype),
        POS_PTR=bool(pos_on_device), SKIP_FLAGS=state.skip_flags, FLAG_N=kernels.FLAG_N,
        num_warps=kernels.NUM_WARPS, num_stages=attend_stages(use_dot, q.dtype),
    )
    if combine and state.num_splits > 1:
        kernels.COMBINE_KERNEL[(B * H,)](
            out, state.mpart, state.lpart, state.apart, out.stride(0), out.stride(1), out.stride(3), H,
            HEAD_DIM=D, NUM_SPLITS=state.num_splits, S_PAD=next_power_of_2(state.num_splits), num_warps=4,
        )
    return out


def update(kernels: ModuleType, state: State, pos: int, region_last: torch.Tensor, enter_ptr: torch.Tensor,
           enter_keys: torch.Tensor, *, score: bool, evict: bool, pos_on_device: bool = False,
           out: torch.Tensor | None = None, advance: bool = False) -> None:
    """Steps 1-4 of the update kernel after query `pos` (score: the fused chain accumulates,
    from SPLIT_SCORE_FROM cache slots on in the score kernel, over slot blocks; evict: H2O
    eviction down to BUDGET; pos_on_device: read the position from `state.pos`). `out`: the
    output of an `attend(..., combine=False)`, whose splits the score or update kernel merges.
    `advance` (with pos_on_device): the update kernel then advances `state.pos` by one, after
    every program has read it (through `state.pos_ticket`), so no kernel of the step may follow
    it that reads the position."""
    if advance and not pos_on_device:
        raise ValueError("update: advance=True advances the position in state.pos; pass pos_on_device=True")
    B, H, Hkv, D = state.shape
    group = H // Hkv
    kc, vc = state.k, state.v
    pool_pad = next_power_of_2(kernels.POOL_SIZE)
    split = bool(score) and kernels.TOTAL >= SPLIT_SCORE_FROM
    merge = out is not None and state.num_splits > 1
    o = out if out is not None else state.apart          # (not read without a merge)
    o_strides = (o.stride(0), o.stride(1), o.stride(3)) if out is not None else (0, 0, 0)
    if split:
        kernels.SCORE_KERNEL[(-(-kernels.TOTAL // SCORE_SLOTS), B * Hkv)](
            state.sraw, state.mpart, state.lpart, state.acc, state.flags, state.keys, pos, state.pos, Hkv,
            o, state.apart, *o_strides, state.sflags,
            STATIC=kernels.STATIC_SIZE, POOL=kernels.POOL_SIZE, GROUP=group, G_PAD=next_power_of_2(group),
            NUM_SPLITS=state.num_splits, S_PAD=next_power_of_2(state.num_splits), BLOCK=SCORE_SLOTS,
            POS_PTR=bool(pos_on_device), HEAD_DIM=D, MERGE=merge, SKIP_FLAGS=state.skip_flags,
            FLAG_N=kernels.FLAG_N, num_warps=4,
        )
    kernels.UPDATE_KERNEL[(B * Hkv,)](
        state.sraw, state.mpart, state.lpart, state.acc, state.flags, state.keys, state.new_pool,
        state.enter_dst, region_last, enter_ptr, enter_keys, kc, vc, pos, state.pos, state.pos_ticket,
        kc.stride(0), kc.stride(1), kc.stride(2), kc.stride(3),
        vc.stride(0), vc.stride(1), vc.stride(2), vc.stride(3),
        Hkv, o, state.apart, *o_strides, state.sflags,
        STATIC=kernels.STATIC_SIZE, POOL=kernels.POOL_SIZE, GROUP=group, G_PAD=next_power_of_2(group),
        NUM_SPLITS=state.num_splits, S_PAD=next_power_of_2(state.num_splits), HEAD_DIM=D,
        BLOCK=min(1024, pool_pad) if evict else 256, POOL_PAD=pool_pad if evict else 16,
        SCORE=bool(score) and not split, EVICT=bool(evict), MAX_LEN=kernels.MAX_LEN, BUDGET=kernels.BUDGET,
        MAX_IN=kernels.MAX_ENTERING, CHUNK=min(16, next_power_of_2(kernels.MAX_ENTERING)),
        POS_PTR=bool(pos_on_device), MERGE=merge and not split, SKIP_FLAGS=state.skip_flags,
        FLAG_N=kernels.FLAG_N, ADVANCE=bool(advance), TABLE_ROWS=kernels.TABLE_ROWS,
        TABLE_PERIOD=kernels.TABLE_PERIOD, num_warps=UPDATE_WARPS,
    )


#: a step merges the attention's splits in the kernel after it up to this many splits a row
MERGE_MAX_SPLITS = 64


def merges_after(state: State) -> bool:
    """Whether `step` merges the attention's splits in the score or update kernel instead of a
    combine launch: for one query head per KV head and at most MERGE_MAX_SPLITS splits. (H100,
    Table-1 patterns + H2O at 16K: 1.2-1.6 us a step faster for MHA; 0.6-14 us slower for GQA
    groups of 4, whose rows the one program per KV head merges in series, and for MHA over 103
    splits; docs/benchmarks.md.)"""
    B, H, Hkv, D = state.shape
    return H == Hkv and 1 < state.num_splits <= MERGE_MAX_SPLITS


def step(kernels: ModuleType, state: State, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, pos: int,
         out: torch.Tensor, tables: tuple[torch.Tensor, ...], *, evict: bool, pos_on_device: bool = False,
         advance: bool = False) -> None:
    """One decode step of a fused score chain: the attention, then the update with the step's
    scores; the attention's splits are merged into `out` by a combine launch, or where
    `merges_after` by the score or update kernel. `tables`: `Runtime.device_tables`. `advance`
    (with pos_on_device): the update kernel, the step's last, advances `state.pos` by one."""
    merge = merges_after(state)
    attend(kernels, state, q, k_new, v_new, pos, out, pos_on_device=pos_on_device, combine=not merge)
    update(kernels, state, pos, *tables, score=True, evict=evict, pos_on_device=pos_on_device,
           out=out if merge else None, advance=advance)


class StepGraph:
    """One decode step captured as a CUDA graph for one sequence batch and input shape: the
    kernels read the position from `state.pos` (which the step's last kernel advances). The first
    step at a shape runs the same kernels eagerly on the graph's own buffers (compiling them
    outside the capture) and captures them; every later step replays the graph.

    The graph's kernels are pointed at the caller's q, k, v and a fresh output before each
    replay (`graph_params.PointerSlots`: their pointer arguments rewritten, no copy), when the
    tensors have the captured buffers' strides (on every dimension of more than one entry) and
    16-byte aligned addresses; otherwise, or where the driver API or the graph does not allow
    it, the inputs are copied into the graph's buffers and the output out of them (three
    launches of host work instead of one)."""

    def __init__(self, runtime: Runtime, key: tuple, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        self.runtime = runtime
        self.key = key
        self.q = torch.empty_like(q, memory_format=torch.contiguous_format)
        self.k = torch.empty_like(k, memory_format=torch.contiguous_format)
        self.v = torch.empty_like(v, memory_format=torch.contiguous_format)
        self.out = torch.empty_like(self.q)
        self.graph: Any = None
        self.found: PointerSlots | None = None          # the graph's rebindable arguments, if any
        self.slots: PointerSlots | None = None          # `found` while rebinding; None: copy in and out
        self.own = True              # the graph's arguments point at its own buffers
        self.pos_at: int | None = None       # the value state.pos holds, as far as the host knows
        #: the graph's shapes, dtype and device are the prompt's (`Runtime.decode(prompt_shaped=True)`)
        self.prompt_shaped = False

    def _capture(self, device: torch.device) -> None:
        rt = self.runtime
        try:
            graph = torch.cuda.CUDAGraph(keep_graph=True)    # the graph stays readable for PointerSlots
        except TypeError:                                      # (a torch without keep_graph)
            graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream(device=device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):                           # records the step; runs nothing
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                rt._device_step(self.q, self.k, self.v, self.out)
            finally:
                graph.capture_end()
        torch.cuda.current_stream(device).wait_stream(stream)
        if hasattr(graph, "instantiate"):
            graph.instantiate()
        self.graph = graph
        self.own = True
        if POINTER_REBINDING and PointerSlots is not None:
            self.slots = self.found = PointerSlots.find(graph, {"q": self.q, "k": self.k, "v": self.v,
                                                                "out": self.out})

    def _bindable(self, *pairs: tuple[torch.Tensor, torch.Tensor]) -> bool:
        """Each tensor 16-byte aligned with its buffer's strides (where a dimension has more than
        one entry: the kernels never step along the others)."""
        for t, b_ in pairs:
            if t.data_ptr() % 16:
                return False
            st, sb = t.stride(), b_.stride()
            if st != sb and not all(n == 1 or a == b for n, a, b in zip(t.shape, st, sb)):
                return False
        return True

    def _run(self, pos: int, kernels: Callable[[], Any]) -> None:
        """`kernels()` at position `pos` (state.pos written only where the host's copy differs)."""
        if self.pos_at != pos:
            self.runtime.state.pos.fill_(pos)
        kernels()
        self.pos_at = pos + 1

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: int) -> torch.Tensor:
        if self.graph is not None and self.slots is not None and self._bindable((q, self.q), (k, self.k), (v, self.v)):
            out = torch.empty_like(self.out)
            self.own = False
            if self.slots.bind({"q": q, "k": k, "v": v, "out": out}):
                self._run(pos, self.graph.replay)
                return out
            self.slots = None       # refused: copies from now on (below)
        if self.graph is not None and not self.own:
            # the graph's arguments point at an earlier step's tensors: back to its own buffers
            # (or, where even that is refused, a fresh capture)
            self.own = self.found.bind({"q": self.q, "k": self.k, "v": self.v, "out": self.out})
            if not self.own:
                self.graph, self.slots = None, None
        torch._foreach_copy_((self.q, self.k, self.v), (q, k, v))     # one launch for the three inputs
        if self.graph is None:      # eager (compiles the kernels), then captured
            self._run(pos, lambda: self.runtime._device_step(self.q, self.k, self.v, self.out))
            self._capture(q.device)
        else:
            self._run(pos, self.graph.replay)
        return self.out.clone()


def top_mask(score: torch.Tensor, mask: torch.Tensor, b: int, key: torch.Tensor) -> torch.Tensor:
    """Bool mask of the `b` entries of `mask` with the highest `score` per row; ties to the larger
    `key` (the more recent key)."""
    key = key.expand_as(score)
    s = torch.where(mask, score, torch.full_like(score, float("-inf")))
    o1 = torch.argsort(key, dim=1, descending=True, stable=True)
    o2 = torch.argsort(s.gather(1, o1), dim=1, descending=True, stable=True)
    order = o1.gather(1, o2)[:, :b]
    chosen = torch.zeros_like(mask).scatter(1, order, True)
    return chosen & mask


def table_row(x: Any, rows: int, period: int) -> tuple[Any, Any]:
    """(row, shift) of index x (a key or a query: an int or an integer tensor) in region tables
    of `rows` rows whose last `period` rows repeat past them, moved by the period (period 0: the
    tables span MAX_LEN): key x has the first and last region query of key `row` plus `shift`,
    and the keys entering at query x are those entering at query `row` plus `shift`. The update
    kernel computes the same (`_table_row` in the template)."""
    if not period:
        return x, x * 0
    shift = (x >= rows) * ((x - (rows - period)) // period * period)
    return x - shift, shift


class Runtime:
    """Prefill, then token-by-token decode, of one sequence batch over the generated kernels.

    `kernels` is the generated dynamic decode module; `static_module` the static part's decode
    module (`fill_cache`; None when STATIC_SIZE is 0); `tables` holds the region schedule as
    int32 CPU tensors of TABLE_ROWS entries (MAX_LEN, or fewer for a region that repeats:
    `table_row`): `enter_at` (first region query of each key, -1: never), `region_last` (last
    region query, clipped to MAX_LEN; -1: never), `enter_ptr` / `enter_keys` (keys by the query
    they enter at, CSR).

    With REDUCE None the score chain is not fused: pass the prompt's per-key scores to
    `start` and an `accumulate(runtime, q, pos)` callback to `decode`.
    """

    def __init__(self, kernels: ModuleType, static_module: ModuleType | None, tables: Mapping[str, Any],
                 graphs: bool = True):
        if kernels.STATIC_SIZE and static_module is None:
            raise ValueError("Runtime: the static part has cache slots; pass its decode module")
        missing = [n for n in TABLE_NAMES if n not in tables]
        if missing:
            raise ValueError(f"Runtime: the region schedule lacks {', '.join(missing)}")
        self.kernels = kernels
        self.static_module = static_module
        self.tables = {name: torch.as_tensor(tables[name]) for name in TABLE_NAMES}
        self._device_tables: dict[str, tuple[torch.Tensor, ...]] = {}
        self.state: State | None = None
        self.length = 0
        self.shape: tuple | None = None
        #: replay each CUDA decode step from a CUDA graph (fused chains without refresh; see decode)
        self.graphs = bool(graphs)
        self._graph: StepGraph | None = None
        self._static_keys = torch.full((kernels.STATIC_SIZE,), -1, dtype=torch.int64)
        self._static_upto = 0          # _static_keys covers the keys < _static_upto

    @property
    def static_keys(self) -> torch.Tensor:
        """The key each static slot holds before query `length` (CPU int64; -1: empty): the
        latest key j < length with cache_ids(j) == slot, brought up to date on demand."""
        if self._static_upto > self.length:
            self._static_keys.fill_(-1)
            self._static_upto = 0
        if self._static_upto < self.length and self.kernels.STATIC_SIZE:
            j = torch.arange(self._static_upto, self.length, dtype=torch.int64)
            cid = self.kernels.cache_ids(j).to(torch.int64)
            ok = cid >= 0
            self._static_keys.scatter_reduce_(0, cid[ok], j[ok], reduce="amax")
        self._static_upto = self.length
        return self._static_keys

    def key_spans(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(first, last) region query of `keys` (CPU, int64), as the kernels read the tables:
        -1 for a key never in the region before MAX_LEN, the last clipped to MAX_LEN."""
        K = self.kernels
        row, shift = table_row(keys.to(torch.int64), K.TABLE_ROWS, K.TABLE_PERIOD)
        first = self.tables["enter_at"][row].to(torch.int64)
        first = torch.where(first >= 0, first + shift, -1)
        first = torch.where(first >= K.MAX_LEN, -1, first)
        last = (self.tables["region_last"][row].to(torch.int64) + shift).clamp(max=K.MAX_LEN)
        return first, torch.where(first < 0, -1, last)

    def device_tables(self, device: Any) -> tuple[torch.Tensor, ...]:
        """(region_last, enter_ptr, enter_keys) on `device`, for `update`."""
        key = str(device)
        if key not in self._device_tables:
            t = self.tables
            self._device_tables[key] = tuple(t[n].to(device=device, dtype=torch.int32).contiguous()
                                             for n in ("region_last", "enter_ptr", "enter_keys"))
        return self._device_tables[key]

    # --- prefill ----------------------------------------------------------------------------
    def attention(self, prefill_module: ModuleType, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  tiles: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor, tuple]:
        """The prompt's attention (every region key: exactly the pattern's mask) and each row's
        log2 softmax statistic; `tiles` from `prefill_module.build_tiles` by default."""
        P = q.shape[2]
        if tiles is None:
            tiles = prefill_module.build_tiles(P, q_offset=0, device=q.device)
        lse = torch.empty(q.shape[0], q.shape[1], P, dtype=torch.float32, device=q.device)
        out = prefill_module.prefill(q, k, v, *tiles, q_offset=0, lse=lse)
        return out, lse, tiles

    def fused_scores(self, prefill_module: ModuleType, q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor,
                     tiles: tuple) -> torch.Tensor:
        """Per-key scores [B, Hkv, P] of the fused chain over the prompt (the score kernel reuses
        the attention's row statistics)."""
        reduce = self.kernels.REDUCE
        if reduce is None:
            raise ValueError("Runtime: the score chain is not fused; compute the scores outside")
        red = prefill_module.score(q, k, lse, *tiles, reduce="max" if reduce == "max" else "sum", q_offset=0)
        if reduce == "mean":
            red = red / ((q.shape[1] // k.shape[1]) * q.shape[2])
        return self.kernels.epilogue(red)

    def prefill(self, prefill_module: ModuleType, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                tiles: tuple | None = None) -> torch.Tensor:
        """Attention over the prompt, then the cache cut to the budget (fused chains)."""
        out, lse, tiles = self.attention(prefill_module, q, k, v, tiles)
        self.start(q, k, v, self.fused_scores(prefill_module, q, k, lse, tiles))
        return out

    def start(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scores: torch.Tensor) -> None:
        """Lay the prompt (P tokens) out as static segment + pool: the static part's slots, the
        candidates cut to the BUDGET best `scores` (refresh=False; ties: the more recent key),
        the keys entering at query P staged."""
        K = self.kernels
        B, H, P, D = q.shape
        Hkv = k.shape[1]
        dev = q.device
        C = K.STATIC_SIZE
        st = State(K, B, H, Hkv, D, k.dtype, dev)
        scores = scores.to(torch.float32).reshape(B * Hkv, P)
        self._graph = None
        self._static_keys.fill_(-1)
        self._static_upto = 0
        self.length = P
        if C:
            self.static_module.fill_cache(k, v, st.k[:, :, :C], st.v[:, :, :C])
            static_keys = self.static_keys
            sel = (static_keys >= 0).nonzero()[:, 0]
            st.acc[:, sel.to(dev)] = scores[:, static_keys[sel].to(dev)]
        first, last = self.key_spans(torch.arange(P))
        cand = (first >= 0) & (first <= P - 1) & (last >= P)
        cand = cand.to(dev)[None, :].expand(B * Hkv, P)
        keep = cand if K.REFRESH else top_mask(scores, cand, K.BUDGET, torch.arange(P, device=dev))
        n_keep = keep.sum(dim=1)
        npool = min(K.POOL_SIZE, P)
        if int(n_keep.max()) > K.POOL_SIZE:
            raise RuntimeError(f"{int(n_keep.max())} candidate keys after the prompt exceed the pool of "
                               f"{K.POOL_SIZE} slots")
        order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)[:, :npool]   # kept keys first
        valid = torch.arange(npool, device=dev)[None, :] < n_keep[:, None]
        st.keys[:, :npool] = torch.where(valid, order, -1).to(torch.int32)
        st.flags[:, :npool] = torch.where(valid, 3, 0).to(torch.int8)
        st.acc[:, C:C + npool] = torch.where(valid, scores.gather(1, order), 0.0)
        idx = order[..., None].expand(-1, -1, D)
        pk = st.k.view(B * Hkv, K.TOTAL, D)
        pv = st.v.view(B * Hkv, K.TOTAL, D)
        pk[:, C:C + npool] = torch.where(valid[..., None], k.reshape(B * Hkv, P, D).gather(1, idx), 0)
        pv[:, C:C + npool] = torch.where(valid[..., None], v.reshape(B * Hkv, P, D).gather(1, idx), 0)
        self.state = st
        self.shape = (B, H, Hkv, D, k.dtype, dev)
        update(K, st, P - 1, *self.device_tables(dev), score=False, evict=False)
        if K.REFRESH and P < K.MAX_LEN:
            self.select(P)

    # --- decode -----------------------------------------------------------------------------
    def decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               accumulate: Callable[[Runtime, torch.Tensor, int], None] | None = None, *,
               prompt_shaped: bool = False) -> torch.Tensor:
        """One token at position `self.length`: q [B, Hq, 1, D], k, v [B, Hkv, 1, D].
        `prompt_shaped`: the caller has checked that q, k and v are one token each, k and v of
        one shape, all three of one dtype and device, and of the prompt's batch, heads, head dim,
        dtype and device (a replayed step then skips comparing them with the graph's)."""
        K = self.kernels
        if self.state is None:
            raise ValueError("Runtime.decode: no prompt yet; call prefill (or start) first")
        pos = self.length
        if pos >= K.MAX_LEN:
            raise ValueError(f"Runtime.decode: position {pos} is past MAX_LEN={K.MAX_LEN}; compile the package with a "
                             f"larger --max-len")
        if K.REDUCE is None and accumulate is None:
            raise ValueError("Runtime.decode: the score chain is not fused; pass accumulate=")
        st = self.state
        if self._graphable(q, accumulate):
            out = self._graph_step(q, k, v, pos, prompt_shaped)
        else:
            out = torch.empty_like(q)
            if K.REDUCE is None:
                attend(K, st, q, k, v, pos, out)
                accumulate(self, q, pos)
                update(K, st, pos, *self.device_tables(q.device), score=False, evict=not K.REFRESH)
            else:
                step(K, st, q, k, v, pos, out, self.device_tables(q.device), evict=not K.REFRESH)
            if K.REFRESH and pos + 1 < K.MAX_LEN:
                self.select(pos + 1)
        self.length = pos + 1
        return out

    # --- CUDA graphs of the decode step ---------------------------------------------------------
    def _graphable(self, q: torch.Tensor, accumulate: Any) -> bool:
        """A step runs from a CUDA graph on CUDA for fused chains without refresh (the step is
        then two to four kernels reading the position from device memory), unless a graph is
        being captured around it already (the caller's graph then holds the kernels themselves)."""
        K = self.kernels
        return (self.graphs and q.is_cuda and K.REDUCE is not None and not K.REFRESH and accumulate is None
                and not torch.cuda.is_current_stream_capturing())

    def _graph_step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: int,
                    prompt_shaped: bool = False) -> torch.Tensor:
        g = self._graph         # (None after each prompt: `start`)
        if prompt_shaped and g is not None and g.prompt_shaped:
            return g.step(q, k, v, pos)
        key = (id(self.state), q.shape, k.shape, v.shape, q.dtype, k.dtype, q.device)
        if g is None or g.key != key:
            g = self._graph = StepGraph(self, key, q, k, v)
        g.prompt_shaped = g.prompt_shaped or prompt_shaped
        return g.step(q, k, v, pos)

    def _device_step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
        """The step's kernels with the position read from `state.pos`, which the last of them (the
        update kernel, `advance=True`) advances there: no increment launch after the step (H200,
        2026-11-28: replayed steps of 15-35 us 0.4-0.7 us faster)."""
        step(self.kernels, self.state, q, k, v, 0, out, self.device_tables(q.device), evict=True, pos_on_device=True,
             advance=True)

    def select(self, i: int) -> None:
        """refresh=True: mark loaded the BUDGET held pool keys of region row i with the highest
        accumulated score (ties: the more recent key)."""
        K = self.kernels
        st = self.state
        keys = st.keys.to(torch.int64)
        held = ((st.flags & 1) != 0) & (keys >= 0)
        held = held & K.region(torch.full_like(keys, i), keys.clamp(min=0))
        chosen = top_mask(st.acc[:, K.STATIC_SIZE:], held, K.BUDGET, keys)
        st.flags.copy_(torch.where(held | ((st.flags & 1) != 0), (st.flags & 1) | (chosen.to(torch.int8) * 2),
                                   st.flags))

    # --- what the selection holds -------------------------------------------------------------
    def _started(self, where: str) -> State:
        if self.state is None:
            raise ValueError(f"Runtime.{where}: no prompt yet; call prefill (or start) first")
        return self.state

    def held_keys(self) -> list[list[list[int]]]:
        """Per batch entry and KV head: the keys the dynamic selection holds after the last step
        (sorted; keys already staged for the next query are not counted)."""
        st = self._started("held_keys")
        B, H, Hkv = self.shape[:3]
        keys = st.keys.to(torch.int64)
        enter = self.key_spans(keys.clamp(min=0).cpu())[0].to(keys.device)
        held = ((st.flags & 1) != 0) & (keys >= 0) & (enter < self.length)
        return [[sorted(int(x) for x in keys[b * Hkv + h][held[b * Hkv + h]]) for h in range(Hkv)]
                for b in range(B)]

    def attended_keys(self) -> list[list[list[int]]]:
        """Per batch entry and KV head: the pool keys the next decode query attends, sorted."""
        st = self._started("attended_keys")
        B, H, Hkv = self.shape[:3]
        keys = st.keys.to(torch.int64)
        loaded = ((st.flags & 2) != 0) & (keys >= 0)
        loaded &= self.kernels.region(torch.full_like(keys, self.length), keys.clamp(min=0))
        return [[sorted(int(x) for x in keys[b * Hkv + h][loaded[b * Hkv + h]]) for h in range(Hkv)]
                for b in range(B)]


__all__ = ["GROUP_ONE_WAVE_FROM", "MERGE_MAX_SPLITS", "MHA_DOT", "Runtime", "State", "StepGraph", "attend",
           "attend_block_n", "attend_stages", "merges_after", "next_power_of_2", "num_splits_for", "step", "top_mask",
           "update", "uses_flags"]
