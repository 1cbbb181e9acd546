"""Rows that attend no key get output 0 (docs/semantics.md, "Rows without keys"), as
FlexAttention does: paper Table 1's strided block-local pattern leaves three queries in four
without a key. Prefill (static and dynamic patterns, full and partial tiles, bf16 and fp32) and
decode (one split and several, through the combine kernel) against the oracle mask."""

from __future__ import annotations

import os

import numpy as np
import torch

if not torch.cuda.is_available():  # must precede the first import of triton
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

from sas import Causal, Diag, Dynamic, Rect  # noqa: E402
from sas.codegen.triton_backend import DecodeOptions, PrefillOptions  # noqa: E402
from sas.dynamic import dynamic_attention_reference  # noqa: E402
from sas.runtime import SASAttnKernel  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# Table 1's strided block-local (block 256, stride 4), scaled to block 16
STRIDED_BLOCK_LOCAL = (Rect(size=(16, 16)) >> Diag(0, 1)) * Rect(stride=4) * Causal()


@pytest.fixture(autouse=True, scope="module")
def _cache_dir(tmp_path_factory):
    old = os.environ.get("SAS_CACHE_DIR")
    os.environ["SAS_CACHE_DIR"] = str(tmp_path_factory.mktemp("sas_cache_keyless"))
    yield
    if old is None:
        os.environ.pop("SAS_CACHE_DIR", None)
    else:
        os.environ["SAS_CACHE_DIR"] = old


def qkv(B, Hq, Hkv, L, D, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    mk = lambda h: torch.randn(B, h, L, D, generator=g).to(dtype).to(DEV)  # noqa: E731
    return mk(Hq), mk(Hkv), mk(Hkv)


def reference(mask: np.ndarray, q, k, v) -> torch.Tensor:
    """float64 attention over `mask` (rows = the last rows of the mask); keyless rows: 0."""
    g = q.shape[1] // k.shape[1]
    kk = k.double().cpu().repeat_interleave(g, 1)
    vv = v.double().cpu().repeat_interleave(g, 1)
    s = (q.double().cpu() @ kk.transpose(-1, -2)) * q.shape[3] ** -0.5
    w = torch.softmax(s.masked_fill(~torch.from_numpy(mask), float("-inf")), -1).nan_to_num(0.0)
    return w @ vv


def check_rows(out: torch.Tensor, mask: np.ndarray, ref: torch.Tensor, tol: float) -> None:
    out = out.double().cpu()
    assert torch.isfinite(out).all()
    keyless = ~mask.any(axis=1)
    assert keyless.any()
    assert torch.equal(out[:, :, torch.from_numpy(keyless)], torch.zeros_like(out[:, :, torch.from_numpy(keyless)]))
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)


def test_table1_pattern_leaves_three_queries_in_four_without_a_key():
    m = STRIDED_BLOCK_LOCAL.to_mask(64)
    assert (~m.any(axis=1)).sum() == 48


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("options", [PrefillOptions(16, 16, 4, 1), PrefillOptions(32, 16, 4, 1)])
def test_prefill_keyless_rows_are_zero(dtype, tol, options):
    L = 64
    ker = SASAttnKernel(STRIDED_BLOCK_LOCAL, max_len=L, prefill_options=options)
    q, k, v = qkv(1, 2, 1, L, 16, dtype, seed=1)
    mask = STRIDED_BLOCK_LOCAL.to_mask(L)
    check_rows(ker.prefill(q, k, v), mask, reference(mask, q, k, v), tol)


def test_prefill_keyless_rows_with_full_tiles_elsewhere():
    # a window that starts one key back: query 0 has no key, every other row attends full tiles
    p = Diag(1, 40)
    L = 64
    ker = SASAttnKernel(p, max_len=L, prefill_options=PrefillOptions(16, 16, 4, 1))
    q, k, v = qkv(2, 2, 2, L, 16, torch.float32, seed=2)
    mask = p.to_mask(L)
    check_rows(ker(q, k, v), mask, reference(mask, q, k, v), 1e-4)


@pytest.mark.parametrize("splits", [1, 3])
def test_decode_keyless_rows_are_zero(splits):
    L, P = 48, 20
    ker = SASAttnKernel(STRIDED_BLOCK_LOCAL, max_len=L, prefill_options=PrefillOptions(16, 16, 4, 1),
                        decode_options=DecodeOptions(16, 4, 1), num_splits=splits)
    q, k, v = qkv(1, 4, 2, L, 16, torch.float32, seed=3)
    outs = [ker.prefill(q[:, :, :P], k[:, :, :P], v[:, :, :P])]
    for t in range(P, L):
        outs.append(ker.decode(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]))
    mask = STRIDED_BLOCK_LOCAL.to_mask(L)
    check_rows(torch.cat(outs, 2), mask, reference(mask, q, k, v), 1e-4)


def test_dynamic_prefill_keyless_row_is_zero():
    # query 0 attends nothing (the static part starts one key back, the region four back)
    p = Diag(1, 3) + Diag(4, None) * Dynamic(budget=2)
    L, P = 20, 12
    ker = SASAttnKernel(p, max_len=32, prefill_options=PrefillOptions(16, 16, 4, 1))
    q, k, v = qkv(1, 2, 1, L, 16, torch.float32, seed=4)
    outs = [ker.prefill(q[:, :, :P], k[:, :, :P], v[:, :, :P])]
    for t in range(P, L):
        outs.append(ker.decode(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]))
    out = torch.cat(outs, 2).double().cpu()
    mask = p.to_mask(L)
    check_rows(out[:, :, :P], mask[:P, :P], reference(mask[:P, :P], q[:, :, :P], k[:, :, :P], v[:, :, :P]), 1e-4)
    ref = dynamic_attention_reference(p, q.double().cpu(), k.double().cpu(), v.double().cpu(), prefill_len=P)
    torch.testing.assert_close(out, ref.out, rtol=1e-4, atol=1e-4)
