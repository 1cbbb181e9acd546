"""`TritonRuntime`: the Triton executor of a static pattern's plan (the `StaticRuntime`
protocol of `sas.runtime.executor`): block-sparse prefill over the plan's tile schedules and
split-K decode over the compact cache, with the generated modules rendered once per launch
configuration."""

from __future__ import annotations

import os
from collections import OrderedDict
from types import ModuleType
from typing import Any

import torch

from sas.codegen.triton_backend import (SUPPORTED_HEAD_DIMS, WIDE_TILES, DecodeOptions, PrefillOptions, decode_module,
                                       prefill_module)
from sas.errors import KernelError
from sas.plan import Plan
from sas.runtime import standalone
from sas.runtime.executor import register_backend
from sas.runtime.tiles import runs_tensors


def interpreting() -> bool:
    """True when Triton kernels run on the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def check_triton_tensor(where: str, name: str, t: torch.Tensor) -> None:
    """The Triton backend's own limits: a CUDA tensor (or the CPU interpreter), a head dim the
    kernels are built for."""
    if t.device.type != "cuda" and not interpreting():
        raise KernelError(f"{where}: {name} is on {t.device}; the triton backend needs CUDA tensors (or "
                          f"TRITON_INTERPRET=1 to run on the CPU interpreter; SASAttnKernel(..., "
                          f"backend='torch') runs a static pattern on the CPU at model sizes)")
    if t.shape[-1] not in SUPPORTED_HEAD_DIMS:
        raise KernelError(f"{where}: head_dim {t.shape[-1]} is not supported; supported: "
                          f"{', '.join(map(str, SUPPORTED_HEAD_DIMS))}")


class TritonRuntime:
    """Generated Triton kernels for a static plan. `num_splits` fixes the decode split count
    (None: about two programs per SM); `cache_dir` is where rendered modules are written."""

    def __init__(self, plan: Plan, *, num_splits: int | None = None, cache_dir: str | os.PathLike | None = None):
        if plan.is_dynamic:
            raise KernelError("TritonRuntime runs static patterns; a dynamic pattern runs on DynamicRuntime")
        self.plan = plan
        self.num_splits = num_splits
        self._cache_dir = cache_dir
        self._prefill_mods: dict[PrefillOptions, ModuleType] = {}
        self._decode_mods: dict[DecodeOptions, ModuleType] = {}
        self._held: dict[DecodeOptions, standalone.HeldKeys] = {}
        self._tiles: OrderedDict[tuple, tuple] = OrderedDict()
        # render (and import) the default configuration now: errors surface at construction
        self.prefill_module(plan.prefill_options or PrefillOptions())

    # --- modules -----------------------------------------------------------------------------
    def prefill_module(self, options: PrefillOptions) -> ModuleType:
        mod = self._prefill_mods.get(options)
        if mod is None:
            mod = self._prefill_mods[options] = prefill_module(self.plan.prefill_pattern, options, self._cache_dir)
        return mod

    def decode_module(self, options: DecodeOptions | None = None) -> ModuleType:
        options = options or self.plan.decode_config()
        mod = self._decode_mods.get(options)
        if mod is None:
            mod = self._decode_mods[options] = decode_module(self.plan.analysis, options, self._cache_dir)
        return mod

    # --- prefill -----------------------------------------------------------------------------
    def tile_tensors(self, q_len: int, k_len: int, device: torch.device, *, wide_kernel: bool = False) -> tuple:
        """(options, full_rowptr, full_cols, part_rowptr, part_cols, order) for this length
        (`wide_kernel`: see `wide_kernel`)."""
        key = (q_len, k_len, str(device), wide_kernel)
        hit = self._tiles.get(key)
        if hit is not None:
            self._tiles.move_to_end(key)
            return hit
        sched = self.plan.schedule(q_len, k_len, wide_kernel=wide_kernel)
        out = (sched.options,) + runs_tensors(sched.runs, device)
        self._tiles[key] = out
        while len(self._tiles) > 16:
            self._tiles.popitem(last=False)
        return out

    def wide_kernel(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
        """Whether the Gluon kernel (Hopper, 128-row tiles) can run this prefill: the automatic
        tile choice then also takes 128 x 128 tiles where they pay (`auto_prefill_options`)."""
        if self.plan.prefill_options is not None:  # the caller's tiles: nothing to decide
            return False
        if interpreting() or not q.is_cuda or torch.cuda.get_device_capability(q.device)[0] != 9:
            return False  # decided before any module is rendered
        return bool(self.prefill_module(WIDE_TILES).gluon_ok(q, k, v, WIDE_TILES.block_m, WIDE_TILES.block_n))

    def prefill_tiles(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple:
        """`tile_tensors` for the prefill of these tensors (the tiles `prefill` uses)."""
        return self.tile_tensors(q.shape[2], k.shape[2], q.device, wide_kernel=self.wide_kernel(q, k, v))

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        check_triton_tensor("prefill", "q", q)
        o, fr, fc, pr, pc, order = self.prefill_tiles(q, k, v)
        return self.prefill_module(o).prefill(q, k, v, fr, fc, pr, pc, order, q_offset=k.shape[2] - q.shape[2],
                                              out=out, block_m=o.block_m, block_n=o.block_n,
                                              num_warps=o.num_warps, num_stages=o.num_stages)

    # --- the compact cache ---------------------------------------------------------------------
    def new_cache(self, batch: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype = torch.bfloat16,
                  device: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (batch, num_kv_heads, max(1, self.plan.cache_size), head_dim)
        return torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)

    def fill_cache(self, k: torch.Tensor, v: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor) -> None:
        check_triton_tensor("fill_cache", "k", k)
        self.decode_module().fill_cache(k, v, past_k, past_v)

    # --- decode --------------------------------------------------------------------------------
    def splits(self, mod: ModuleType, o: DecodeOptions, batch: int, num_kv_heads: int, device: torch.device,
               group: int = 1) -> int:
        if self.num_splits is not None:
            return self.num_splits
        return mod.num_splits_for(batch, num_kv_heads, num_sms=standalone.num_sms(device), block_n=o.block_n,
                                  waves=o.waves, blocks_per_split=o.blocks_per_split, group=group)

    def decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor,
               position: int, out: torch.Tensor | None = None) -> torch.Tensor:
        check_triton_tensor("decode", "q", q)
        group = q.shape[1] // k.shape[1]
        o = self.plan.decode_config(group, q.dtype)
        mod = self.decode_module(o)
        splits = self.splits(mod, o, q.shape[0], k.shape[1], q.device, group)
        slot_keys = None
        if mod.HELD_KEYS:
            held = self._held.get(o)
            if held is None:
                held = self._held[o] = standalone.HeldKeys(mod)
            slot_keys = held(position, q.device)
        return mod.decode(q, k, v, past_k, past_v, position, out=out, num_splits=splits, slot_keys=slot_keys,
                          block_n=o.block_n, num_warps=o.num_warps, num_stages=o.num_stages,
                          use_dot=(q.shape[1] > k.shape[1]) or o.mha_dot, fused_combine=o.fused_combine,
                          pdl=o.pdl)


register_backend("triton", TritonRuntime)

__all__ = ["TritonRuntime", "check_triton_tensor", "interpreting"]
