"""SANTA prop on the one-launch CUDA kernel (`sas.methods.santa_cuda`,
templates/cuda/santa_prop.cu.jinja).

Everywhere nvcc is (the CPU CI included): the source builds for sm_90a, and the library's
argument block matches the ctypes mirror field for field; the option checks and the CPU error.
On a GPU: the kernel's draws against the float64 reference `prop_reference` for the same
uniforms (bf16 / fp16, head dims 64 / 128, 1-8 query heads per KV head, masks, the cache-dtype
stash, tiles of 64-1024 keys, runs of 1 to 16 blocks per KV head, batch 2), the same draws as
the Triton kernels, exactly S per head, the estimate of its own draws, bit-identical repeats, a
CUDA-graph replay, the counters left at zero, and the steps it declines (a KernelError naming why)."""

from __future__ import annotations

import ctypes

import pytest
import torch

from sas.codegen.cuda_backend import WGMMA_ARCH
from sas.errors import KernelError
from sas.methods.santa import SantaRandom, estimate, prop_reference
from sas.methods import santa_cuda
from sas.methods.santa_cuda import PropArgs, library
from sas.methods.santa_runtime import SantaOptions, santa_decode

from helpers.cuda import needs_nvcc

GPU = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not GPU, reason="runs the CUDA kernel: needs an NVIDIA GPU (the CPU CI builds it, "
                                               "test_library_builds_and_its_argument_block_matches)")


@needs_nvcc
def test_library_builds_and_its_argument_block_matches():
    lib = library(WGMMA_ARCH, 0, 128, 4)      # bf16, head dim 128, 4 query heads a KV head (nvcc, cached)
    names = [f[0] for f in PropArgs._fields_]
    offsets = (ctypes.c_longlong * len(names))()
    assert lib.sas_santa_prop_layout(offsets) == ctypes.sizeof(PropArgs)
    assert list(offsets) == [getattr(PropArgs, n).offset for n in names]
    # four 16 KB stages of K, the stash of 4 heads over 8 tiles of 256 keys, 8 warps' sums of 4 x 128
    assert lib.sas_santa_prop_smem(4, 128, 8, 256) == 4 * 16384 + (4 * 8 * 256 + 8 * 4 * 128) * 4
    # a group this library was not built for, a head dim it does not hold, a tile it does not take
    blocks = ctypes.c_int(0)
    assert lib.sas_santa_prop_occupancy(0, 128, 2, 256, 1024, ctypes.byref(blocks)) != 0
    assert lib.sas_santa_prop_occupancy(0, 64, 4, 256, 1024, ctypes.byref(blocks)) != 0
    assert lib.sas_santa_prop_occupancy(0, 128, 4, 96, 1024, ctypes.byref(blocks)) != 0


def test_backend_option_checks():
    assert SantaOptions(n=8).backend == "triton"
    with pytest.raises(KernelError, match="backend must be one of"):
        SantaOptions(n=8, backend="cutlass")
    with pytest.raises(KernelError, match="backend='cuda' runs strategy='prop' with alloc='global_sys' only"):
        SantaOptions(n=8, strategy="flash", backend="cuda")
    with pytest.raises(KernelError, match="backend='cuda' runs strategy='prop' with alloc='global_sys' only"):
        SantaOptions(n=8, alloc="largest_remainder", backend="cuda")


@pytest.mark.skipif(GPU, reason="checks the error on a machine without a GPU")
def test_cuda_backend_on_the_cpu_names_why():
    q, k, v = _inputs(1, 4, 2, 64, 64, torch.bfloat16, "cpu", seed=0)
    with pytest.raises(KernelError, match="backend='cuda' cannot run this step: it runs on CUDA devices"):
        santa_decode(q, k, v, 64, SantaOptions(n=8, tile=64, backend="cuda"), SantaRandom(0))


def _inputs(b, hq, hkv, slots, d, dtype, dev, seed, peak=2.0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(b, hq, d, generator=g) * peak).to(dtype)
    k = torch.randn(b, hkv, slots, d, generator=g).to(dtype)
    v = torch.randn(b, hkv, slots, d, generator=g).to(dtype)
    return q.to(dev), k.to(dev), v.to(dev)


CASES = [  # dtype, (b, hq, hkv, slots, n_keys, d), S, tile, masked, stash
    (torch.bfloat16, (1, 32, 8, 4096, 4096, 128), 128, 256, False, "float32"),     # Llama-8B groups, 16 tiles
    (torch.bfloat16, (2, 12, 4, 3000, 2900, 128), 64, 256, True, "float32"),       # group 3 (padded to 4), tail
    (torch.float16, (1, 8, 8, 2048, 2000, 64), 40, 64, False, "float32"),          # group 1, 32 tiles of 64
    (torch.float16, (2, 16, 2, 1024, 1024, 64), 300, 128, True, "cache"),          # group 8 at head dim 64
    (torch.bfloat16, (1, 16, 1, 40000, 39000, 128), 512, 1024, False, "float32"),  # group 16, 1024-key tiles
    (torch.bfloat16, (1, 4, 2, 200, 130, 128), 24, 256, False, "cache"),           # one tile: one block
]


@needs_gpu
@pytest.mark.parametrize("dtype,shape,n,tile,masked,stash", CASES)
def test_draws_match_the_reference_and_the_triton_kernels(dtype, shape, n, tile, masked, stash):
    b, hq, hkv, slots, n_keys, d = shape
    q, k, v = _inputs(b, hq, hkv, slots, d, dtype, "cuda", seed=n + slots)
    mask = None
    if masked:
        mask = torch.rand(slots, generator=torch.Generator().manual_seed(1)) > 0.3
        mask[n_keys - 1] = True
        mask = mask.cuda()
    opts = SantaOptions(n=n, tile=tile, stash=stash, backend="cuda")
    res = santa_decode(q, k, v, n_keys, opts, SantaRandom(3), mask=mask, return_counts=True)
    counts = res.counts.cpu()
    assert (counts.sum(-1) == n).all()
    valid = None if mask is None else mask[:n_keys].cpu()
    if valid is not None:
        assert counts[..., ~valid].sum() == 0
    kk, vv = k[:, :, :n_keys].cpu().float(), v[:, :, :n_keys].cpu().float()
    ref, rc = prop_reference(q.cpu().float(), kk, vv, n, res.uniforms.cpu(), tile=tile, valid=valid,
                             stash_dtype=None if stash == "float32" else dtype)
    # the same draws up to fp32-vs-float64 rounding at a boundary: a draw moved to a neighbouring
    # key (the running totals of the two never differ by more than one draw), a few per head and
    # hundred draws (fp32 prefix sums over 1024-key tiles meet more boundaries than over 256),
    # and a bf16 / fp16 stash rounding u to a neighbouring value now and then
    assert (counts.cumsum(-1) - rc.cumsum(-1)).abs().max() <= 1
    allowed = max(2, b * hq * n // 256) if stash == "float32" else max(2, counts.numel() // 40)
    assert (counts != rc).sum() <= allowed, (counts != rc).nonzero()
    # the estimate of its own draws, in the output dtype
    tol = {torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    assert res.out.dtype == dtype
    torch.testing.assert_close(res.out.cpu().float(), estimate(counts, vv, n).float(), atol=tol, rtol=tol)
    # the Triton kernels draw the same keys from the same uniforms
    tri = santa_decode(q, k, v, n_keys, SantaOptions(n=n, tile=tile, stash=stash, backend="triton"), mask=mask,
                       uniforms=res.uniforms, return_counts=True)
    assert (tri.counts.cpu() != counts).sum() <= 2 * allowed     # each within `allowed` of the reference
    # the same uniforms give the same bits again (the partials are summed in block order)
    again = santa_decode(q, k, v, n_keys, opts, mask=mask, uniforms=res.uniforms)
    assert torch.equal(again.out, res.out)


@needs_gpu
def test_graph_replay_draws_afresh_and_leaves_the_counters_at_zero():
    q, k, v = _inputs(1, 32, 8, 8192, 128, torch.bfloat16, "cuda", seed=5)
    opts = SantaOptions(n=128, backend="cuda")
    rnd = SantaRandom(None)                      # torch's global generator: capturable
    santa_decode(q, k, v, 8192, opts, rnd)       # builds, plans and warms up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        res = santa_decode(q, k, v, 8192, opts, rnd)
    outs = []
    for _ in range(3):
        graph.replay()
        outs.append(res.out.clone())
        eager = santa_decode(q, k, v, 8192, opts, uniforms=res.uniforms.clone())
        assert torch.equal(eager.out, res.out)    # the replay is the eager step of its own uniforms
    assert not torch.equal(outs[0], outs[1])     # each replay draws fresh uniforms
    torch.cuda.synchronize()
    plans = [p for p in santa_cuda._PLANS.values() if isinstance(p, santa_cuda.PropCudaPlan)]
    assert plans and all(int(p.buffers[-1].abs().sum()) == 0 for p in plans)   # arrivals and flags


@needs_gpu
def test_steps_the_kernel_declines_name_why_and_run_on_triton():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cases = [
        ((1, 4, 2, 256, 256, 128), torch.float32, "cache dtype is float32"),
        ((1, 64, 2, 256, 256, 128), torch.bfloat16, "32 query heads per KV head"),
        ((sms * santa_cuda.BLOCKS_PER_SM + 1, 2, 1, 256, 256, 64), torch.float16, "exceed one wave"),
    ]
    for (b, hq, hkv, slots, n_keys, d), dtype, why in cases:
        q, k, v = _inputs(b, hq, hkv, slots, d, dtype, "cuda", seed=1)
        res = santa_decode(q, k, v, n_keys, SantaOptions(n=16, tile=64), SantaRandom(0), return_counts=True)
        assert (res.counts.sum(-1) == 16).all()              # the Triton kernels run it
        with pytest.raises(KernelError, match=why):
            santa_decode(q, k, v, n_keys, SantaOptions(n=16, tile=64, backend="cuda"), SantaRandom(0))
    q, k, v = _inputs(1, 4, 2, 256, 128, torch.bfloat16, "cuda", seed=2)
    static = torch.zeros(256, dtype=torch.bool, device="cuda")
    static[:8] = True
    with pytest.raises(KernelError, match="exact static part"):
        santa_decode(q, k, v, 256, SantaOptions(n=16, tile=64, backend="cuda"), SantaRandom(0), static=static)

