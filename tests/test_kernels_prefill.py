"""Prefill kernels (Triton; CPU interpreter unless a GPU is present) against a float64
reference built from the oracle `to_mask`."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sas import Causal, Diag, Dynamic, Rect
from sas.codegen.triton_backend import PrefillOptions, prefill_module
from sas.errors import KernelError, SASError
from sas.ir.tiles import tile_map
from sas.runtime import SASAttnKernel

from helpers.attention import DEV, TOL, qkv, reference_attention, rel_error
from helpers.table1 import TABLE1_KERNELS
from strategies import causal_patterns

pytestmark = pytest.mark.kernels

SMALL = PrefillOptions(block_m=32, block_n=16, num_warps=4, num_stages=1)


def run_prefill(pattern, B=1, Hq=2, Hkv=1, L=96, D=64, dtype=torch.float32, options=SMALL, seed=0, Lq=None):
    Lq = L if Lq is None else Lq
    q, k, v = qkv(B, Hq, Hkv, Lq, D, Lk=L, dtype=dtype, device=DEV, seed=seed)
    kern = SASAttnKernel(pattern, max_len=max(L, 1), prefill_options=options)
    out = kern(q, k, v)
    assert out.shape == q.shape and out.dtype == dtype and out.device == q.device
    return rel_error(out, reference_attention(pattern, q, k, v)), out


@pytest.mark.parametrize("name", list(TABLE1_KERNELS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_table1_prefill(name, dtype):
    err, _ = run_prefill(TABLE1_KERNELS[name], L=100 if dtype == torch.float32 else 96, dtype=dtype)
    assert err < TOL[dtype], f"{name} {dtype}: rel err {err:.2e}"


def test_batch_and_gqa():
    err, _ = run_prefill(TABLE1_KERNELS["streaming_llm"], B=2, Hq=4, Hkv=2, L=80, dtype=torch.bfloat16)
    assert err < TOL[torch.bfloat16]
    err, _ = run_prefill(TABLE1_KERNELS["openai_fixed"], B=2, Hq=3, Hkv=3, L=64)
    assert err < TOL[torch.float32]


def test_head_dim_128_and_default_tiles():
    err, _ = run_prefill(TABLE1_KERNELS["block_local"], L=64, D=128, dtype=torch.bfloat16,
                         options=PrefillOptions(block_m=64, block_n=32, num_warps=4, num_stages=1))
    assert err < TOL[torch.bfloat16]


def test_auto_options():
    from sas.codegen.triton_backend import auto_prefill_options

    p = TABLE1_KERNELS["openai_fixed"]
    assert auto_prefill_options(p, 128).block_n == 32          # 4 summary columns of 32: narrow tiles
    assert auto_prefill_options(Diag(0, 900), 2048).block_n == 64
    q, k, v = qkv(1, 2, 1, 128, 64, dtype=torch.bfloat16, device=DEV)
    kern = SASAttnKernel(p, max_len=128)                       # prefill_options=None: automatic
    assert rel_error(kern(q, k, v), reference_attention(p, q, k, v)) < TOL[torch.bfloat16]


def test_query_suffix():
    p = TABLE1_KERNELS["streaming_llm"]
    q, k, v = qkv(1, 2, 1, 37, 64, Lk=100, dtype=torch.float32, device=DEV)
    kern = SASAttnKernel(p, max_len=100, prefill_options=SMALL)
    assert rel_error(kern(q, k, v), reference_attention(p, q, k, v)) < TOL[torch.float32]


def test_non_causal_prefill_and_empty_rows():
    p = Rect(rows=(10, 50), cols=(40, 90)) + Diag(-5, 3)     # not causal; many rows attend nothing
    err, out = run_prefill(p, L=90)
    assert err < TOL[torch.float32]
    m = torch.from_numpy(p.to_mask(90))
    empty = ~m.any(1)
    assert empty.any()
    assert (out[:, :, empty.to(out.device)] == 0).all()


def test_nothing_attended_gives_zeros():
    p = Rect(rows=(0, 1), cols=(500, 501))
    q, k, v = qkv(1, 2, 2, 40, 64, dtype=torch.float16, device=DEV)
    out = SASAttnKernel(p, max_len=40, prefill_options=SMALL)(q, k, v)
    assert (out == 0).all()


def test_non_contiguous_inputs():
    p = TABLE1_KERNELS["sliding_window"]
    q, k, v = qkv(1, 2, 2, 64, 64, dtype=torch.float32, device=DEV)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)       # [B, L, H, D] storage
    assert not qt.is_contiguous()
    out = SASAttnKernel(p, max_len=64, prefill_options=SMALL)(qt, k, v)
    assert rel_error(out, reference_attention(p, q, k, v)) < TOL[torch.float32]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=causal_patterns(3).filter(lambda p: not p.dynamics()), L=st.integers(20, 64))
def test_random_causal_compositions(p, L):
    err, _ = run_prefill(p, L=L, seed=L)
    assert err < TOL[torch.float32], f"{p!r}: rel err {err:.2e}"


def test_standalone_module_build_tiles_matches_tile_map():
    p = TABLE1_KERNELS["openai_fixed"]
    mod = prefill_module(p, SMALL)
    for (lq, lk) in [(96, 96), (40, 100)]:
        got = mod.build_tiles(lq, lk, block_m=32, block_n=16, device=DEV)
        tm = tile_map(p, lq, lk, 32, 16)
        for a, b in zip(got[:4], (tm.full_rowptr, tm.full_cols, tm.part_rowptr, tm.part_cols)):
            assert a.cpu().tolist() == b.tolist()
        q, k, v = qkv(1, 2, 1, lq, 64, Lk=lk, dtype=torch.float32, device=DEV)
        out = mod.prefill(q, k, v, *got, block_m=32, block_n=16, num_warps=4, num_stages=1)
        assert rel_error(out, reference_attention(p, q, k, v)) < TOL[torch.float32]


@pytest.mark.parametrize("name,lq,lk,hq,hkv,transposed", [
    ("streaming_llm", 96, 96, 2, 1, False),      # GQA, lengths a multiple of the tiles
    ("openai_fixed", 37, 100, 3, 3, True),       # query suffix, ragged lengths, [B, L, H, D] storage of q
    ("sliding_window", 50, 50, 2, 2, False),
])
def test_tma_descriptor_path(name, lq, lk, hq, hkv, transposed):
    """The TMA tensor-descriptor loads (the default on Hopper for 16-bit inputs) against the
    reference: K/V rows past the end of a head (the next head's rows in the [B*H*L, D] matrix)
    must not count."""
    p = TABLE1_KERNELS[name]
    mod = prefill_module(p, SMALL)
    if mod.TensorDescriptor is None:
        pytest.skip("this Triton has no tensor descriptors")  # Triton >= 3.4 has them
    dtype = torch.bfloat16
    q, k, v = qkv(1, hq, hkv, lq, 64, Lk=lk, dtype=dtype, device=DEV, seed=lq)
    if transposed:
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    tiles = mod.build_tiles(lq, lk, block_m=32, block_n=16, device=DEV)
    ref = reference_attention(p, q, k, v)
    out = mod.prefill(q, k, v, *tiles, block_m=32, block_n=16, num_warps=4, num_stages=1, use_tma=True)
    assert rel_error(out, ref) < TOL[dtype]
    plain = mod.prefill(q, k, v, *tiles, block_m=32, block_n=16, num_warps=4, num_stages=1, use_tma=False)
    assert rel_error(plain, ref) < TOL[dtype]


def test_tma_ok_refuses_what_descriptors_cannot_read():
    mod = prefill_module(TABLE1_KERNELS["sliding_window"], SMALL)
    x = torch.zeros(1, 2, 16, 64, dtype=torch.bfloat16)
    assert not mod.tma_ok(x, x)                                  # CPU tensors
    assert not mod.tma_ok(x.float(), x.float())                  # 32-bit elements
    assert not mod.tma_ok(x[..., ::2], x[..., ::2])              # rows not contiguous
    xt = x.transpose(1, 2).contiguous().transpose(1, 2)
    assert not mod.tma_ok(xt)                                    # heads do not collapse into rows
    assert mod.rows_collapse(x) and not mod.rows_collapse(xt)
    with pytest.raises(ValueError, match="use_tma"):
        tiles = mod.build_tiles(16, 16, block_m=32, block_n=16, device=DEV)
        mod.prefill(x.to(DEV), xt.to(DEV), xt.to(DEV), *tiles, block_m=32, block_n=16, use_tma=True)


def test_compiled_module_is_cached():
    p = Diag(0, 37) * Rect(cols=(1, None))                   # used by no other test
    a = prefill_module(p, SMALL)
    b = prefill_module(p, SMALL)
    assert a is b
    assert os.path.isfile(a.__file__) and a.__file__.startswith(os.environ["SAS_CACHE_DIR"])
    with open(a.__file__) as f:
        src = f.read()
    assert "import torch" in src and "import triton" in src
    imports = [line for line in src.splitlines() if line.startswith(("import ", "from "))]
    assert all(line.split()[1].split(".")[0] in ("os", "torch", "triton") for line in imports), imports


# --- errors --------------------------------------------------------------------------------

def kernel():
    return SASAttnKernel(TABLE1_KERNELS["sliding_window"], max_len=64, prefill_options=SMALL)


def t(*shape, dtype=torch.float32, device=DEV):
    return torch.randn(*shape).to(dtype).to(device)


@pytest.mark.parametrize("args,match", [
    (lambda: (t(2, 2, 16, 64), t(1, 2, 16, 64), t(1, 2, 16, 64)), "batch"),
    (lambda: (t(1, 2, 16, 64), t(1, 2, 16, 64), t(1, 2, 17, 64)), "same shape"),
    (lambda: (t(1, 3, 16, 64), t(1, 2, 16, 64), t(1, 2, 16, 64)), "multiple of the kv heads"),
    (lambda: (t(1, 2, 16, 64), t(1, 2, 16, 32), t(1, 2, 16, 32)), "head_dim"),
    (lambda: (t(1, 2, 16, 48), t(1, 2, 16, 48), t(1, 2, 16, 48)), "head_dim 48"),
    (lambda: (t(1, 2, 16, 64), t(1, 2, 16, 64, dtype=torch.float16), t(1, 2, 16, 64)), "dtype"),
    (lambda: (t(1, 2, 16, 64, dtype=torch.float64), t(1, 2, 16, 64), t(1, 2, 16, 64)), "unsupported dtype"),
    (lambda: (t(1, 2, 16, 64), t(1, 2, 16, 64, device="meta"), t(1, 2, 16, 64)), "device|on meta"),
    (lambda: (t(2, 16, 64), t(1, 2, 16, 64), t(1, 2, 16, 64)), "4-D"),
    (lambda: ([1.0], t(1, 2, 16, 64), t(1, 2, 16, 64)), "torch.Tensor"),
    (lambda: (t(1, 2, 20, 64), t(1, 2, 16, 64), t(1, 2, 16, 64)), "last Lq"),
])
def test_prefill_argument_errors(args, match):
    with pytest.raises(KernelError, match=match):
        kernel()(*args())


def test_constructor_errors():
    with pytest.raises(KernelError, match="backend"):
        SASAttnKernel(Causal(), backend="metal")
    with pytest.raises(KernelError, match="pattern"):
        SASAttnKernel("causal")  # type: ignore[arg-type]
    with pytest.raises(KernelError, match="max_len"):
        SASAttnKernel(Causal(), max_len=0)
    with pytest.raises(SASError, match="budget"):
        SASAttnKernel(Diag(0, 8) + Diag(8, 4) * Dynamic(budget=5))
    with pytest.raises(KernelError, match="other_inputs"):
        SASAttnKernel(Causal(), other_inputs={"not an id": torch.zeros(1)})
    with pytest.raises(KernelError, match="other_inputs"):
        SASAttnKernel(Causal(), other_inputs={"w": 3})
    with pytest.raises(KernelError, match="block_m"):
        PrefillOptions(block_m=48)
    assert issubclass(KernelError, SASError)
