"""`CudaRuntime`: the CUDA C++ executor of a static pattern's plan (`SASAttnKernel(...,
backend="cuda")`, the `StaticRuntime` protocol of `sas.runtime.executor`).

At construction it renders the pattern's kernels (`sas.codegen.cuda_backend.render_cuda`) and
their loader, builds the library with nvcc for the current device (cached by a hash of the
source: a second kernel of the same pattern reuses it) and binds it through ctypes. Prefill runs
over the plan's exact tile runs for the kernel's `block_m` x 64 tiles; decode over the compact
cache in one launch (split-K with the merge done by the last split). Limits checked before any
work: CUDA tensors, bf16 / fp16, head dims 64 and 128.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from sas.codegen.cuda_backend import (
    CUDA_DTYPES,
    SUPPORTED_HEAD_DIMS,
    build_library,
    device_arch,
    find_nvcc,
    render_cuda,
    render_loader,
    uses_wgmma,
)
from sas.codegen.triton_backend import load_source, narrow_tiles_pay, tiles_per_block, wide_tiles_pay
from sas.errors import KernelError, NotYetSupportedError
from sas.ir.tile_runs import tile_runs
from sas.plan import Plan
from sas.runtime.executor import register_backend
from sas.runtime.standalone import HeldKeys
from sas.runtime.tiles import runs_tensors

#: prefill tile shape: 64 or 128 query rows by 64 or 32 keys, or 128 by 128 (Hopper builds only)
BLOCK_MS = (64, 128)
BLOCK_NS = (64, 32, 128)
#: decode kernels: CUDA cores ("simt"), tensor cores with 4 or 8 warps a block ("mma", "mma8");
#: by default ("auto") "simt" with one query head a block, "mma" with several
DECODE_KERNELS = ("simt", "mma", "mma8")
_DTYPES = (torch.bfloat16, torch.float16)


def check_cuda_tensor(where: str, name: str, t: torch.Tensor) -> None:
    if t.device.type != "cuda":
        raise KernelError(f"{where}: {name} is on {t.device}; the cuda backend needs CUDA tensors")
    if t.dtype not in _DTYPES:
        raise KernelError(f"{where}: {name} has dtype {t.dtype}; the cuda backend supports torch.bfloat16 and "
                          f"torch.float16")
    if t.shape[-1] not in SUPPORTED_HEAD_DIMS:
        raise KernelError(f"{where}: head_dim {t.shape[-1]} is not supported by the cuda backend; supported: "
                          f"{', '.join(map(str, SUPPORTED_HEAD_DIMS))}")


class CudaRuntime:
    """Generated CUDA kernels for a static plan. `num_splits` fixes the decode split count
    (None: `num_splits_for` of the loader); `cache_dir` is where the loader module and the built
    libraries are kept; `block_n` (64, 32, or 128 with 128 rows on Hopper) fixes the prefill tile
    width and `block_m` (64 or 128) its height (None: `tile_shape`, the automatic choice per
    length); `decode_kernel` picks the decode kernel (one of DECODE_KERNELS; None: the loader's
    default, "auto": "simt" for one query head per KV head, else "mma")."""

    def __init__(self, plan: Plan, *, num_splits: int | None = None, cache_dir: str | os.PathLike | None = None,
                 block_n: int | None = None, arch: str | None = None, block_m: int | None = None,
                 decode_kernel: str | None = None):
        if plan.is_dynamic:
            raise NotYetSupportedError("SASAttnKernel: backend='cuda' runs static patterns only")
        if block_n is not None and block_n not in BLOCK_NS:
            raise KernelError(f"CudaRuntime: block_n must be one of {BLOCK_NS}, got {block_n!r}")
        if block_m is not None and block_m not in BLOCK_MS:
            raise KernelError(f"CudaRuntime: block_m must be one of {BLOCK_MS}, got {block_m!r}")
        if block_n == 128 and block_m not in (None, 128):
            raise KernelError(f"CudaRuntime: block_n=128 needs block_m=128 (128 x 128 tiles), got block_m={block_m!r}")
        if decode_kernel is not None and decode_kernel not in DECODE_KERNELS:
            raise KernelError(f"CudaRuntime: decode_kernel must be one of {', '.join(DECODE_KERNELS)}, got "
                              f"{decode_kernel!r}")
        self.decode_kernel = decode_kernel
        self.plan = plan
        self.num_splits = num_splits
        self.block_n = block_n
        self.source = render_cuda(plan.pattern, plan.analysis if plan.analysis is not None else None)
        if arch is None:
            if not torch.cuda.is_available():
                raise KernelError("SASAttnKernel: backend='cuda' needs a CUDA device (none is visible); use "
                                  "backend='triton' (TRITON_INTERPRET=1 on the CPU) or 'torch'")
            arch = device_arch(*torch.cuda.get_device_capability())
        if block_n == 128 and not uses_wgmma(arch):
            raise KernelError(f"CudaRuntime: block_n=128 runs on the Hopper wgmma kernel only (arch sm_90a), not on "
                              f"{arch}; use block_n 64 or 32")
        self.arch = arch
        self.block_m = 128 if block_n == 128 else block_m
        self.nvcc = find_nvcc()
        self._directory = Path(cache_dir) / "cuda" if cache_dir is not None else None
        self.loader: ModuleType = load_source(render_loader(self.source, plan.pattern, plan.max_len),
                                              "sas_cuda_loader", Path(cache_dir) if cache_dir is not None else None)
        self.loader.builder = self._build
        self._tiles: OrderedDict[tuple, tuple] = OrderedDict()
        #: per (q_len, k_len): the automatic shape, and the height for a fixed width under 128
        self._shapes: dict[tuple[int, int], tuple[tuple[int, int], int]] = {}
        self._held: HeldKeys | None = None

    def _build(self, dtype: int | None = None, head_dim: int | None = None) -> Path:
        """Build (or find in the cache) the library for one element type code and head dim."""
        lib = build_library(self.source.source, self.arch, self._directory, self.nvcc, dtype=dtype, head_dim=head_dim)
        self.loader.bind(lib, dtype, head_dim)
        return lib

    def ensure_built(self, dtype: torch.dtype, head_dim: int) -> Path:
        """Build the library for `dtype` / `head_dim` now (else the first call builds it)."""
        return self._build(CUDA_DTYPES[str(dtype).removeprefix("torch.")], head_dim)

    # --- prefill -----------------------------------------------------------------------------
    def tile_width(self, q_len: int, k_len: int) -> int:
        """The prefill tile width for this length: the fixed `block_n`, else the automatic
        choice (`tile_shape`, made once per length)."""
        if self.block_n is not None:
            return self.block_n
        width = self.tile_shape(q_len, k_len)[1]
        return 64 if width == 128 and self.block_m not in (None, 128) else width   # 128 keys: 128 rows only

    def tile_height(self, q_len: int, k_len: int) -> int:
        """The prefill tile height: the fixed `block_m`, else the automatic choice (`tile_shape`;
        with a fixed width under 128 where that is 128 x 128: 128 rows only for near-dense rows)."""
        if self.block_m is not None:
            return self.block_m
        shape, narrow_height = self._auto_shape(q_len, k_len)
        if shape == (128, 128) and self.block_n not in (None, 128):
            return narrow_height
        return shape[0]

    def tile_shape(self, q_len: int, k_len: int) -> tuple[int, int]:
        """The automatic (block_m, block_n) for this length, decided once per length.

        The mma.sync kernel (targets other than sm_90a): the plan's choice for the Triton kernels
        (its schedule: 64 x 32 tiles for narrow column structure or short rows), 64 rows. The
        Hopper wgmma kernel (fitted to the H100 sweeps of docs/cuda.md, Table-1 patterns at 4K
        and 16K): 128 x 128 tiles where rows hold >= 8 tiles of 64 x 64 and the wide tiles compute
        at most 15% more cells (`wide_tiles_pay`: windows, streaming, fully causal; 9-23% faster
        than the best other shape there, 7-200% slower on strided patterns); 64 x 32 tiles where
        they compute >= 10% fewer cells or rows are very short (< 4 tiles of 64 x 64 a query
        block: the lighter tile runs more blocks per SM); 128 x 64 for other near-dense rows (>= 64
        tiles a query block); otherwise 64 x 64, also for rows of 4-8 tiles, where Triton prefers
        64 x 32 (block-local 16K: 0.69 vs 0.73 ms)."""
        return self._auto_shape(q_len, k_len)[0]

    def _auto_shape(self, q_len: int, k_len: int) -> tuple[tuple[int, int], int]:
        """`tile_shape`, and the height for a width fixed under 128 (made once per length)."""
        key = (q_len, k_len)
        hit = self._shapes.get(key)
        if hit is not None:
            return hit
        if not uses_wgmma(self.arch):
            shape = (64, 32 if self.plan.schedule(q_len, k_len).options.block_n == 32 else 64)
            height = 64
        else:
            pattern = self.plan.prefill_pattern
            per_block = tiles_per_block(pattern, q_len, k_len, 64, 64)
            narrow = narrow_tiles_pay(pattern, q_len, k_len, per_block) or per_block < 4
            height = 128 if per_block >= 64 else 64
            if not narrow and wide_tiles_pay(pattern, q_len, k_len, per_block):
                shape = (128, 128)
            else:
                shape = (height, 32 if narrow else 64)
        self._shapes[key] = (shape, height)
        return shape, height

    def tile_tensors(self, q_len: int, k_len: int, device: torch.device) -> tuple:
        """(block_m, block_n, full_rowptr, full_cols, part_rowptr, part_cols, order) for
        block_m x block_n tiles."""
        return self._tiles_of(q_len, k_len, device, self.tile_height(q_len, k_len), self.tile_width(q_len, k_len))

    def _tiles_of(self, q_len: int, k_len: int, device: torch.device, bm: int, bn: int) -> tuple:
        key = (q_len, k_len, bm, bn, str(device))
        hit = self._tiles.get(key)
        if hit is not None:
            self._tiles.move_to_end(key)
            return hit
        runs = tile_runs(self.plan.prefill_pattern, q_len, k_len, bm, bn, k_len - q_len)
        out = (bm, bn) + runs_tensors(runs, device)
        self._tiles[key] = out
        while len(self._tiles) > 16:
            self._tiles.popitem(last=False)
        return out

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        for name, t in (("q", q), ("k", k), ("v", v)):
            check_cuda_tensor("prefill", name, t)
        bm, bn, *tiles = self.tile_tensors(q.shape[2], k.shape[2], q.device)
        with torch.cuda.device(q.device):
            try:
                return self.loader.prefill(q, k, v, *tiles, q_offset=k.shape[2] - q.shape[2], out=out,
                                           block_m=bm, block_n=bn)
            except self.loader.WideTilesUnavailable:
                # tensors the 128 x 128 kernel's copies cannot read (the loader copies the usual
                # cases): 128 x 64 tiles, which fall back to the mma.sync kernel, as other shapes do
                if self.block_n == 128:
                    raise
            bm, bn, *tiles = self._tiles_of(q.shape[2], k.shape[2], q.device, 128, 64)
            return self.loader.prefill(q, k, v, *tiles, q_offset=k.shape[2] - q.shape[2], out=out,
                                       block_m=bm, block_n=bn)

    # --- the compact cache ---------------------------------------------------------------------
    def new_cache(self, batch: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype = torch.bfloat16,
                  device: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (batch, num_kv_heads, max(1, self.plan.cache_size), head_dim)
        return torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)

    def _require_decode(self, where: str) -> None:
        if not self.source.decode:
            raise NotYetSupportedError(f"{where}: {self.source.decode_note}")

    def fill_cache(self, k: torch.Tensor, v: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor) -> None:
        self._require_decode("fill_cache")
        check_cuda_tensor("fill_cache", "k", k)
        self.loader.fill_cache(k, v, past_k, past_v)

    # --- decode --------------------------------------------------------------------------------
    def decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor,
               position: int, out: torch.Tensor | None = None) -> torch.Tensor:
        self._require_decode("decode")
        for name, t in (("q", q), ("k", k), ("v", v), ("past_k", past_k), ("past_v", past_v)):
            check_cuda_tensor("decode", name, t)
        for name, t in (("past_k", past_k), ("past_v", past_v)):
            if t.stride(-1) != 1 or t.data_ptr() % 16 or any(s % 8 for s in t.stride()[:-1]):
                raise KernelError(f"decode: {name} must have a contiguous last dimension and 16-byte aligned rows "
                                  f"(new_cache makes such caches)")
        slot_keys = None
        if self.loader.HELD_KEYS:   # mask_func is a table search: the key each slot holds, made on the device
            if self._held is None:
                self._held = HeldKeys(self.loader)
            slot_keys = self._held(int(position), q.device)
        with torch.cuda.device(q.device):
            return self.loader.decode(q, k, v, past_k, past_v, int(position), out=out, num_splits=self.num_splits,
                                     kernel=self.decode_kernel, slot_keys=slot_keys)


register_backend("cuda", CudaRuntime)

__all__ = ["BLOCK_MS", "BLOCK_NS", "DECODE_KERNELS", "CudaRuntime", "check_cuda_tensor"]
