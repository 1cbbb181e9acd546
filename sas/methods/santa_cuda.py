"""SANTA prop decode in one CUDA launch (`templates/cuda/santa_prop.cu.jinja`):
`santa_decode(..., strategy="prop")` with `SantaOptions(backend="cuda")`. Scores, tile budgets and
the sparse V gather run in one persistent launch whose blocks are all resident at once (a block
of a KV head waits for that head's budgets instead of a second launch). The default prop kernels
are the Triton ones (`sas.methods.santa_triton`): on the H100 this kernel is still slower than
they are (docs/santa.md, "One launch in CUDA").

`prop_cuda_plan(...)` returns the plan of a shape, or the reason the kernel cannot run it
(`Ineligible`): the cache dtype (bf16 / fp16, q in the same), head dim 64 or 128, a group of at
most head_dim / 8 query heads per KV head, `alloc="global_sys"`, no exact static part, a tile of
64-1024 keys, nvcc, and a grid that one wave of the device holds with each block's stash in
shared memory (`PropCudaPlan.layout`, per number of tiles). The library is built with nvcc once
per (source, arch, dtype, head dim, group) and cached like the CUDA backend's (`SAS_CACHE_DIR`).
`PropArgs.timing` (null by default) takes a buffer of per-block phase stamps:
benchmarks/profile_santa_cuda.py.

The blocks of a KV head wait for each other, so the grid must be resident at once: the layout is
checked against the whole device's occupancy. Kernels on other streams only delay it, but a
process confined to part of the GPU (MPS with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, green contexts)
may not hold the grid, and the step would not finish: use the Triton backend there.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch

from sas.codegen.cuda_backend import CUDA_DTYPES, build_library, device_arch, find_nvcc, render_template
from sas.errors import KernelError

#: blocks per multiprocessor the grid aims at (one wave; a block of 256 threads streams its run of K)
BLOCKS_PER_SM = 2
#: 16 KB stages of K in the kernel's cp.async ring (STAGES - 1 in flight while one is scored)
STAGES = 4
STAGE_BYTES = 16384
HEAD_DIMS = (64, 128)
TILES = (64, 128, 256, 512, 1024)


class PropArgs(ctypes.Structure):
    """`sas_santa::PropArgs` of the kernel source, field for field."""

    _fields_ = [(name, ctypes.c_void_p) for name in
                ("q", "k", "v", "mask", "u0", "m_t", "l_t", "inv", "off", "st", "part", "counts", "sync", "out",
                 "timing")] + \
        [("ncap", ctypes.c_longlong)] + \
        [(name, ctypes.c_int) for name in
         ("n_keys", "group", "tiles", "bn", "tpc", "cpb", "round_u", "num_bh")] + \
        [("qk_scale_log2", ctypes.c_float), ("n_samples", ctypes.c_float)]


@dataclass(frozen=True)
class Ineligible:
    """Why a step cannot take the CUDA kernel."""

    reason: str


_LIBS: dict[tuple, ctypes.CDLL] = {}


def source(gp: int) -> str:
    """The kernel source for a group padded to `gp` query heads (1, 2, 4, 8 or 16)."""
    return render_template("santa_prop.cu.jinja", gp=gp, stages=STAGES)


def library(arch: str, dtype_code: int, head_dim: int, gp: int) -> ctypes.CDLL:
    """The built kernel library for one element type / head dim / padded group (nvcc on first
    use, cached)."""
    key = (arch, dtype_code, head_dim, gp, STAGES)
    lib = _LIBS.get(key)
    if lib is None:
        path: Path = build_library(source(gp), arch, None, find_nvcc(), dtype=dtype_code, head_dim=head_dim)
        lib = ctypes.CDLL(str(path))
        lib.sas_santa_prop.argtypes = [ctypes.POINTER(PropArgs), ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                       ctypes.c_int, ctypes.c_void_p]
        lib.sas_santa_prop.restype = ctypes.c_int
        lib.sas_santa_prop_occupancy.argtypes = [ctypes.c_int] * 5 + [ctypes.POINTER(ctypes.c_int)]
        lib.sas_santa_prop_occupancy.restype = ctypes.c_int
        lib.sas_santa_prop_smem.argtypes = [ctypes.c_int] * 4
        lib.sas_santa_prop_smem.restype = ctypes.c_int
        lib.sas_santa_prop_layout.argtypes = [ctypes.POINTER(ctypes.c_longlong)]
        lib.sas_santa_prop_layout.restype = ctypes.c_int
        check_layout(lib)
        _LIBS[key] = lib
    return lib


def check_layout(lib: ctypes.CDLL) -> None:
    """The library's PropArgs and this module's mirror agree field for field (a KernelError
    otherwise: a launch would read its arguments from the wrong places)."""
    names = [f[0] for f in PropArgs._fields_]
    offsets = (ctypes.c_longlong * len(names))()
    size = lib.sas_santa_prop_layout(offsets)
    mine = [getattr(PropArgs, n).offset for n in names]
    if size != ctypes.sizeof(PropArgs) or list(offsets) != mine:
        raise KernelError(f"santa_decode: the CUDA prop kernel's argument block ({size} bytes, offsets "
                          f"{list(offsets)}) differs from sas.methods.santa_cuda.PropArgs ({ctypes.sizeof(PropArgs)} "
                          f"bytes, offsets {mine})")


def _pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


@dataclass
class PropCudaPlan:
    """The launches of one shape (batch, heads, head dim, cache capacity, tile, dtypes, S): the
    argument block (its per-call fields rewritten by `run`), the library, the padded group and
    the scratch buffers, sized for a full cache. A step's split of the tiles over blocks
    (`layout`) follows its number of keys."""

    lib: ctypes.CDLL
    args: PropArgs
    dtype_code: int
    head_dim: int
    gp: int
    block_n: int
    kv_rows: int
    sm_count: int
    smem_limit: int
    buffers: tuple[torch.Tensor, ...]
    _layouts: dict[int, tuple[int, int, int] | Ineligible]

    def layout(self, t: int) -> tuple[int, int, int] | Ineligible:
        """(tiles per block, blocks per KV head, shared memory per block) for t tiles, or why
        one wave cannot hold them."""
        have = self._layouts.get(t)
        if have is None:
            have = self._layouts[t] = self._layout(t)
        return have

    def _layout(self, t: int) -> tuple[int, int, int] | Ineligible:
        """BLOCKS_PER_SM blocks a multiprocessor where they fit, else fewer (longer runs of tiles
        a block, more shared memory each)."""
        why = Ineligible("no layout tried")
        for per_sm in range(BLOCKS_PER_SM, 0, -1):
            want = self.sm_count * per_sm // self.kv_rows
            if want < 1:
                continue
            tpc = -(-t // min(t, want))
            cpb = -(-t // tpc)
            ring = STAGES * STAGE_BYTES     # reused for the budgets' (m_t, l_t) and the list of drawn keys
            if 2 * self.args.group * t * 4 > ring or tpc * self.block_n * 4 > ring:
                return Ineligible(f"{t} tiles of {self.block_n} keys: the kernel's budget stage holds "
                                  f"{ring // (8 * self.args.group)} tiles a head and {ring // 4} keys a block")
            smem = self.lib.sas_santa_prop_smem(self.gp, self.head_dim, tpc, self.block_n)
            if smem > self.smem_limit:
                why = Ineligible(f"a block's stash ({smem} bytes of shared memory) exceeds the device's "
                                 f"{self.smem_limit}")
                continue
            blocks = ctypes.c_int(0)
            err = self.lib.sas_santa_prop_occupancy(self.dtype_code, self.head_dim, self.gp, self.block_n, smem,
                                                    ctypes.byref(blocks))
            if err:
                raise KernelError(f"santa_decode: the CUDA prop kernel's occupancy query failed (cudaError {err})")
            if cpb * self.kv_rows <= blocks.value * self.sm_count:
                return tpc, cpb, smem
            why = Ineligible(f"{cpb * self.kv_rows} blocks exceed what the device holds at once "
                             f"({blocks.value} per multiprocessor)")
        return why

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, u0: torch.Tensor,
            counts: torch.Tensor | None, out: torch.Tensor, n_keys: int, layout: tuple[int, int, int],
            stream: int) -> None:
        a = self.args
        a.q, a.k, a.v, a.u0, a.out = q.data_ptr(), k.data_ptr(), v.data_ptr(), u0.data_ptr(), out.data_ptr()
        a.mask = mask.data_ptr() if mask is not None else None
        a.counts = counts.data_ptr() if counts is not None else None
        a.n_keys = n_keys
        a.tiles = -(-n_keys // self.block_n)
        a.tpc, a.cpb, smem = layout
        err = self.lib.sas_santa_prop(ctypes.byref(a), self.dtype_code, self.head_dim, self.gp, smem, stream)
        if err:
            raise KernelError(f"santa_decode: the CUDA prop kernel failed to launch (cudaError {err})")


_PLANS: dict[tuple, PropCudaPlan | Ineligible] = {}
_PLANS_MAX = 64


def prop_cuda_plan(dev: torch.device, b: int, hq: int, hkv: int, d: int, ncap: int, block_n: int,
                   q_dtype: torch.dtype, k_dtype: torch.dtype, n_samples: int, round_u: bool, scale_log2: float,
                   sm_count: int, smem_limit: int) -> PropCudaPlan | Ineligible:
    """The plan of prop steps on the CUDA kernel for these shapes, or why there is none (kept
    per shape: the checks and nvcc run once)."""
    key = (str(dev), b, hq, hkv, d, ncap, block_n, q_dtype, k_dtype, n_samples, round_u, scale_log2)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _make_plan(dev, b, hq, hkv, d, ncap, block_n, q_dtype, k_dtype, n_samples, round_u, scale_log2,
                          sm_count, smem_limit)
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.pop(next(iter(_PLANS)))
        _PLANS[key] = plan
    return plan


def _make_plan(dev, b, hq, hkv, d, ncap, block_n, q_dtype, k_dtype, n_samples, round_u, scale_log2, sm_count,
               smem_limit) -> PropCudaPlan | Ineligible:
    name = str(k_dtype).removeprefix("torch.")
    if name not in CUDA_DTYPES:
        return Ineligible(f"the cache dtype is {name}; the CUDA kernel takes bfloat16 and float16")
    if q_dtype != k_dtype:
        return Ineligible(f"q is {q_dtype} and the cache {k_dtype}; the CUDA kernel needs them equal")
    if d not in HEAD_DIMS:
        return Ineligible(f"head dim {d}; the CUDA kernel takes {HEAD_DIMS}")
    g = hq // hkv
    gp = _pow2(g)
    if gp > d // 8:
        return Ineligible(f"{g} query heads per KV head; the CUDA kernel takes at most {d // 8} at head dim {d}")
    if block_n not in TILES:
        return Ineligible(f"tile {block_n}; the CUDA kernel takes {TILES}")
    want = sm_count * BLOCKS_PER_SM // (b * hkv)
    if want < 1:
        return Ineligible(f"{b * hkv} (batch x KV heads) blocks exceed one wave of {sm_count} multiprocessors")
    try:
        find_nvcc()
    except KernelError as e:
        return Ineligible(str(e))
    major, minor = torch.cuda.get_device_capability(dev)
    dtype_code = CUDA_DTYPES[name]
    lib = library(device_arch(major, minor), dtype_code, d, gp)
    rows, t_max = b * hq, -(-ncap // block_n)
    f32 = dict(dtype=torch.float32, device=dev)
    m_t, l_t, inv, off = (torch.empty(rows, t_max, **f32) for _ in range(4))
    st = torch.empty(rows, t_max, dtype=torch.int32, device=dev)
    part = torch.empty(rows, min(want, t_max), d, **f32)     # the most blocks a KV head a layout takes
    sync = torch.zeros(3 * b * hkv, dtype=torch.int32, device=dev)
    args = PropArgs(m_t=m_t.data_ptr(), l_t=l_t.data_ptr(), inv=inv.data_ptr(), off=off.data_ptr(), st=st.data_ptr(),
                    part=part.data_ptr(), sync=sync.data_ptr(), ncap=ncap, group=g, bn=block_n, round_u=int(round_u),
                    num_bh=b * hkv, qk_scale_log2=scale_log2, n_samples=float(n_samples))
    return PropCudaPlan(lib, args, dtype_code, d, gp, block_n, b * hkv, sm_count, smem_limit,
                        (m_t, l_t, inv, off, st, part, sync), {})


__all__ = ["BLOCKS_PER_SM", "Ineligible", "PropArgs", "PropCudaPlan", "check_layout", "library", "prop_cuda_plan",
           "source"]
