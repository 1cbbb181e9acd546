"""`sas.methods.direct_launch.DirectLaunch`: after the first launch of a specialization the
compiled launcher runs directly; a launch whose arguments Triton would specialize differently
(an integer equal to 1, divisible by 16 or not, a misaligned tensor, another dtype, other
constants or warps) must not reuse it. Checked by the results of every launch, on the CPU
(interpreter: Triton's path every time) and on a GPU (the direct path)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from sas.methods.direct_launch import FAST_LAUNCH, DirectLaunch, interpreting

from helpers.attention import DEV


@triton.jit
def _axpy_kernel(X, Y, OUT, N, A, BLOCK: tl.constexpr, NEG: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    x = tl.load(X + offs, mask=ok, other=0.0)
    y = tl.load(Y + offs, mask=ok, other=0.0)
    r = A * x + y
    if NEG:
        r = -r
    tl.store(OUT + offs, r, mask=ok)


@pytest.mark.kernels
def test_direct_launches_equal_triton_launches_across_specializations():
    launch = DirectLaunch(_axpy_kernel)
    g = torch.Generator().manual_seed(0)
    base = torch.randn(300, generator=g)
    cases = [(16, 0, torch.float32, 2.0, False, 4), (16, 0, torch.float32, 2.0, False, 4),   # a repeat: direct
             (1, 0, torch.float32, 2.0, False, 4), (5, 0, torch.float32, 2.0, False, 4),      # N == 1, then 5
             (17, 0, torch.float32, 2.0, False, 4), (32, 0, torch.float32, 2.0, False, 4),
             (32, 1, torch.float32, 2.0, False, 4),                                         # misaligned views
             (32, 0, torch.float16, 2.0, False, 4), (40, 0, torch.float32, -1.5, True, 4),
             (40, 0, torch.float32, -1.5, True, 2), (257, 0, torch.float32, 0.5, False, 4)]
    for n, off, dtype, a, neg, warps in cases:
        x = base.to(DEV, dtype)[off:off + n]
        y = (base.flip(0) * 3).to(DEV, dtype)[off:off + n]
        out = torch.full((n + off,), 7.0, dtype=dtype, device=DEV)[off:]
        launch((triton.cdiv(n, 16),), (x, y, out, n, a), dict(BLOCK=16, NEG=neg), dict(num_warps=warps))
        want = -(a * x.float() + y.float()) if neg else a * x.float() + y.float()
        torch.testing.assert_close(out.float(), want, atol=2e-3, rtol=2e-3)
    if DEV == "cuda" and FAST_LAUNCH and not interpreting():
        # one compiled kernel per distinct specialization: N = 16 and 32 share one (divisible by
        # 16), so do N = 5, 17 and 257 (not), and the rest differ (N == 1, a misaligned view,
        # float16, other constants, other warps)
        assert len(launch.compiled) == 7
    else:
        assert not launch.compiled
