"""Attention inputs and the float64 reference the kernel tests compare with.

`DEV` is where kernel inputs live: the GPU when there is one and Triton is not interpreted,
else the CPU (tests/conftest.py sets TRITON_INTERPRET=1 when torch sees no GPU)."""

from __future__ import annotations

import os

import torch

from sas import Pattern

DEV = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"

#: largest relative error (`rel_error`) a kernel output may have against `reference_attention`
TOL = {torch.float32: 2e-5 if DEV == "cpu" else 1e-4, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def qkv(B: int, Hq: int, Hkv: int, Lq: int, D: int, *, Lk: int | None = None, dtype: torch.dtype = torch.float64,
        device: str | torch.device = "cpu", seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded normal q [B, Hq, Lq, D], k and v [B, Hkv, Lk, D] (Lk defaults to Lq), drawn in that
    order from one generator. float64 is drawn in float64; any other dtype is drawn in float32
    and rounded to it (so every half-precision test sees the same values as its float32 twin)."""
    Lk = Lq if Lk is None else Lk
    g = torch.Generator().manual_seed(seed)
    draw = torch.float64 if dtype == torch.float64 else torch.float32

    def mk(heads: int, length: int) -> torch.Tensor:
        return torch.randn(B, heads, length, D, generator=g, dtype=draw).to(dtype).to(device)

    return mk(Hq, Lq), mk(Hkv, Lk), mk(Hkv, Lk)


def reference_attention(pattern: Pattern, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        q_offset: int | None = None) -> torch.Tensor:
    """float64 softmax attention over the oracle `pattern.to_mask`, on the CPU; query row r is
    position q_offset + r (default: the last Lq of the Lk keys); GQA by repeating each KV head
    over its group; rows that attend no key give 0."""
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    q_offset = Lk - Lq if q_offset is None else q_offset
    mask = torch.from_numpy(pattern.to_mask(max(Lk, q_offset + Lq))[q_offset:q_offset + Lq, :Lk])
    g = H // k.shape[1]
    kk = k.double().cpu().repeat_interleave(g, 1)
    vv = v.double().cpu().repeat_interleave(g, 1)
    s = (q.double().cpu() @ kk.transpose(-1, -2)) * D ** -0.5
    w = torch.softmax(s.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0)
    return w @ vv


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error of a kernel output against the float64 reference (all finite)."""
    out = out.double().cpu()
    assert torch.isfinite(out).all()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-12))


__all__ = ["DEV", "TOL", "qkv", "reference_attention", "rel_error"]


def assert_repeatable(again: torch.Tensor, first: torch.Tensor) -> None:
    """Two runs of one step with the same random numbers: identical on the CPU; on a GPU equal up
    to the last bit of the output dtype (kernels that sum partial outputs with float atomics add
    them in arrival order, so a rounding can differ between runs; the draws themselves are equal
    and are compared exactly by the callers)."""
    if first.device.type == "cpu":
        assert torch.equal(again, first)
        return
    tol = {torch.bfloat16: 8e-3, torch.float16: 1e-3}.get(first.dtype, 1e-5)
    torch.testing.assert_close(again, first, atol=tol, rtol=tol)
