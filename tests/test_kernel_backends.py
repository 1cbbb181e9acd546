"""`SASAttnKernel(backend="torch")`: the pure-torch executor behind the same front as the Triton
kernels. Both backends against the oracle and against each other, stateful and functional
forms, on hand-picked patterns and on hypothesis-drawn causal compositions."""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sas import Causal, Diag, Dynamic, Rect, ops
from sas.errors import KernelError, NotYetSupportedError
from sas.runtime import SASAttnKernel, TorchExecutor
from helpers.attention import DEV, qkv, reference_attention, rel_error
from strategies import causal_patterns

STREAMING = (Diag(0, 6) + Rect(cols=(0, 2))) * Causal()
STRIDED = (Diag(0, 4) + Diag(0, None, stride=5)) * Causal()
KEYLESS = Rect(rows=(0, None), cols=(0, None), stride=(2, 1)) * Diag(0, 3)   # odd rows attend nothing


def run_both_ways(kernel: SASAttnKernel, q, k, v, prefill: int) -> torch.Tensor:
    """Stateful prefill of the first `prefill` tokens, then decode token by token; the outputs
    of every position, [B, Hq, N, D]."""
    outs = [kernel.prefill(q[:, :, :prefill], k[:, :, :prefill], v[:, :, :prefill])]
    for p in range(prefill, q.shape[2]):
        outs.append(kernel.decode(q[:, :, p:p + 1], k[:, :, p:p + 1], v[:, :, p:p + 1]))
    return torch.cat(outs, dim=2)


@pytest.mark.parametrize("pattern", [Causal(), STREAMING, STRIDED, KEYLESS], ids=repr)
def test_torch_backend_matches_oracle_and_triton(pattern):
    q, k, v = qkv(2, 4, 2, 20, 16, dtype=torch.float32, device=DEV, seed=3)
    ref = reference_attention(pattern, q, k, v)
    torch_out = run_both_ways(SASAttnKernel(pattern, max_len=32, backend="torch"), q, k, v, prefill=7)
    triton_out = run_both_ways(SASAttnKernel(pattern, max_len=32, backend="triton"), q, k, v, prefill=7)
    assert rel_error(torch_out, ref) < 1e-5
    assert rel_error(triton_out, ref) < 1e-4
    assert (torch_out - triton_out).abs().max() < 1e-4


def test_only_the_torch_backend_is_differentiable():
    """backend='torch' keeps autograd (its gradient equals the float64 reference's); the Triton
    backend, which has no backward pass, refuses inputs that require grad while gradients are
    recorded, and runs them under torch.no_grad()."""
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 1, 10, 16, dtype=torch.float32, device=DEV, seed=5))
    out = SASAttnKernel(STREAMING, max_len=32, backend="torch")(q, k, v)
    q64, k64, v64 = (t.detach().cpu().double().requires_grad_() for t in (q, k, v))
    ref = reference_attention(STREAMING, q64, k64, v64)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    got = torch.autograd.grad((out * w.to(DEV)).sum(), (q, k, v))
    want = torch.autograd.grad((ref * w.double()).sum(), (q64, k64, v64))
    for g, r in zip(got, want):
        torch.testing.assert_close(g.double().cpu(), r, rtol=1e-4, atol=1e-5)
    triton = SASAttnKernel(STREAMING, max_len=32, backend="triton")
    with pytest.raises(KernelError, match="q requires grad"):
        triton(q, k, v)
    with torch.no_grad():
        assert rel_error(triton(q, k, v).cpu(), ref.detach()) < 1e-4


def test_the_torch_backend_takes_float64_as_its_executor_does():
    """SASAttnKernel(backend='torch') takes the dtypes of TorchExecutor, float64 included (a
    reference in double precision): prefill, decode, the functional step and new_cache / fill_cache
    give the float64 reference; the Triton backend refuses float64 naming the dtypes it takes
    (before: the torch backend refused float64 while its executor took it)."""
    q, k, v = qkv(1, 2, 1, 12, 16, dtype=torch.float64, seed=3)
    kern = SASAttnKernel(STREAMING, max_len=32, backend="torch")
    assert kern.prefill(q[:, :, :11], k[:, :, :11], v[:, :, :11]).dtype == torch.float64
    out = kern.decode(q[:, :, 11:], k[:, :, 11:], v[:, :, 11:])
    want = reference_attention(STREAMING, q, k, v)[:, :, 11:]
    assert out.dtype == torch.float64 and rel_error(out, want) < 1e-12
    kc, vc = kern.new_cache(1, 1, 16, torch.float64)
    kern.fill_cache(k[:, :, :11], v[:, :, :11], kc, vc)
    assert rel_error(kern(q[:, :, 11:], k[:, :, 11:], v[:, :, 11:], kc, vc, position=11), want) < 1e-12
    with pytest.raises(KernelError, match="q has unsupported dtype torch.int32; supported: float16, bfloat16, "
                                          "float32, float64"):
        kern.prefill(q.int(), k.int(), v.int())
    with pytest.raises(KernelError, match="q has unsupported dtype torch.float64; supported: bfloat16, float16, "
                                          "float32$"):
        SASAttnKernel(STREAMING, max_len=32).prefill(q, k, v)
    with pytest.raises(KernelError, match="dtype must be one of bfloat16, float16, float32"):
        SASAttnKernel(STREAMING, max_len=32).new_cache(1, 1, 16, torch.float64)


def test_a_kernel_whose_cache_holds_an_autograd_graph_copies():
    """After a prefill recorded by autograd (backend='torch'), copy.deepcopy and pickle take the
    cache's values (before: torch refused to deepcopy the non-leaf cache); the copy decodes as the
    original does, and gradients still flow through the original's cache to its prompt."""
    import copy
    import pickle

    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 1, 12, 16, dtype=torch.float32, seed=7))
    kern = SASAttnKernel(STREAMING, max_len=32, backend="torch")
    kern.prefill(q[:, :, :11], k[:, :, :11], v[:, :, :11])
    assert kern.k_cache.grad_fn is not None
    step = [t[:, :, 11:].detach() for t in (q, k, v)]
    for twin in (copy.deepcopy(kern), pickle.loads(pickle.dumps(kern))):
        assert twin.k_cache.grad_fn is None and twin.length == 11
        torch.testing.assert_close(twin.decode(*step), kern.runtime.decode(*step, kern.k_cache.clone(),
                                                                           kern.v_cache.clone(), 11), rtol=0, atol=0)
    out = kern.decode(*step)
    (g,) = torch.autograd.grad(out.sum(), (k,))
    assert g[:, :, :11].abs().sum() > 0


def test_max_len_may_be_a_numpy_integer():
    """As in sas.analyze: a numpy integer max_len (e.g. from an array of lengths) is a length."""
    import numpy as np

    from sas.plan import make_plan
    kernel = SASAttnKernel(STREAMING, max_len=np.int64(32))
    assert kernel.max_len == 32 and type(kernel.max_len) is int
    assert make_plan(STREAMING, np.int32(32)).max_len == 32
    with pytest.raises(KernelError, match="max_len must be a positive integer"):
        SASAttnKernel(STREAMING, max_len=np.True_)


def test_torch_backend_runtime_and_caches():
    kernel = SASAttnKernel(STREAMING, max_len=64, backend="torch")
    assert isinstance(kernel.runtime, TorchExecutor)
    q, k, v = qkv(1, 2, 2, 12, 16, dtype=torch.float32, device=DEV, seed=1)
    kernel.prefill(q, k, v)
    assert kernel.k_cache.shape == (1, 2, kernel.cache_size, 16)
    # functional form over caller-held caches gives the stateful result
    kc, vc = kernel.new_cache(1, 2, 16, torch.float32, DEV)
    kernel.fill_cache(k[:, :, :11], v[:, :, :11], kc, vc)
    out = kernel(q[:, :, 11:], k[:, :, 11:], v[:, :, 11:], kc, vc, position=11)
    ref = reference_attention(STREAMING, q, k, v)[:, :, 11:]
    assert rel_error(out, ref) < 1e-5


@settings(max_examples=12)
@given(pattern=causal_patterns(max_depth=3), prefill=st.integers(1, 10))
def test_torch_backend_random_compositions(pattern, prefill):
    assume(not pattern.dynamics() and pattern.to_mask(16).any())
    q, k, v = qkv(1, 2, 1, 16, 16, dtype=torch.float32, device=DEV, seed=prefill)
    kernel = SASAttnKernel(pattern, max_len=16, backend="torch")
    out = run_both_ways(kernel, q, k, v, prefill)
    assert rel_error(out, reference_attention(pattern, q, k, v)) < 1e-5


def test_torch_backend_refuses_dynamic_patterns_and_unknown_backends():
    h2o = Diag(0, 4) + Diag(4, None) * Dynamic(budget=2, score=ops.attn_score().sum(dim=1))
    with pytest.raises(NotYetSupportedError, match="backend='torch' runs static patterns only"):
        SASAttnKernel(h2o, max_len=32, backend="torch")
    with pytest.raises(KernelError, match="unknown backend 'metal'.*triton, torch, cuda"):
        SASAttnKernel(Causal(), max_len=32, backend="metal")
