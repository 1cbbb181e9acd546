"""The warp-specialized Gluon prefill kernel (Hopper, 128-row tiles; issue 11, item 3).

Gluon has no CPU interpreter, so on a machine without a Hopper GPU these tests compile the
rendered kernel for sm_90 (Triton's own compiler and ptxas, no driver needed) and check the
routing rules; on a Hopper GPU they run it against the exact mask's float64 reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sas import Causal
from sas.codegen.printers import lower_predicate
from sas.codegen.triton_backend import PrefillOptions, prefill_module

from helpers.attention import DEV, TOL, qkv, reference_attention, rel_error
from helpers.table1 import TABLE1_KERNELS
from strategies import causal_patterns

pytestmark = pytest.mark.kernels

WIDE = PrefillOptions(block_m=128, block_n=128, num_warps=8, num_stages=3)
PATTERNS = dict(TABLE1_KERNELS, causal=Causal())
HELPER = Path(__file__).parent / "helpers" / "gluon_compile.py"


def _hopper() -> bool:
    return DEV == "cuda" and torch.cuda.get_device_capability()[0] == 9


def _gluon_module(pattern, options=WIDE):
    mod = prefill_module(pattern, options)
    if mod.gluon is None:
        pytest.fail("this Triton has no Gluon (triton.experimental.gluon): the Hopper prefill cannot exist")
    return mod


def compile_in_subprocess(jobs: list[dict]) -> list[dict]:
    """`helpers/gluon_compile.py` over the jobs, in a process without TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, str(HELPER), json.dumps(jobs)], capture_output=True, text=True, env=env,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_gluon_predicate_dialect():
    p = TABLE1_KERNELS["openai_fixed"]
    text = lower_predicate(p, "qi", "kj", dialect="gluon")
    assert text == lower_predicate(p, "qi", "kj").replace("tl.where(", "gl.where(")
    assert "tl." not in text


def test_gluon_kernel_compiles_for_hopper():
    """Every Table-1 pattern's predicate (and fully causal's) inlines into valid Gluon: the kernel
    compiles for sm_90 with warpgroup MMAs, 4-D TMA copies and the register hand-over between the
    partitions; ptxas spills nothing for fully causal attention and at most a few hundred bytes for
    the predicates of the others (the H100 timings in docs/benchmarks.md are with those spills)."""
    jobs = [dict(path=_gluon_module(PATTERNS[name]).__file__, block_n=128, head_dim=128, even_n=True,
                 store_lse=False) for name in PATTERNS]
    jobs.append(dict(path=_gluon_module(PATTERNS["causal"]).__file__, block_n=64, head_dim=64, even_n=False,
                     store_lse=True))
    names = list(PATTERNS) + ["causal (128 x 64, head dim 64, ragged keys, row statistics)"]
    for name, res in zip(names, compile_in_subprocess(jobs)):
        assert all(res["ptx_ok"].values()), (name, res)
        if name.startswith("causal"):
            assert res["spills"] == [0, 0], (name, res)
        else:  # a predicate's temporaries may spill a little (streaming-LLM: 92 bytes with Triton 3.6)
            assert max(res["spills"]) <= 512, (name, res)


def test_gluon_kernel_compiles_for_random_compositions():
    """Random compositions' predicates (strides, spreads, NOT, nested sums and products) print
    into Gluon that compiles for sm_90, with ragged keys and row statistics (the heaviest
    variant)."""
    paths: list[str] = []

    @settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(p=causal_patterns(3).filter(lambda p: not p.dynamics()))
    def draw(p):
        paths.append(_gluon_module(p).__file__)

    draw()
    jobs = [dict(path=f, block_n=128, head_dim=128, even_n=False, store_lse=True) for f in paths]
    for f, res in zip(paths, compile_in_subprocess(jobs)):
        assert all(res["ptx_ok"].values()), (f, res)


def test_gluon_stages_fit_shared_memory():
    mod = _gluon_module(PATTERNS["causal"])
    for block_n in (64, 128):
        for d in (64, 128):
            s = mod.gluon_stages(block_n, d)
            assert 2 <= s <= 3
            assert 128 * d * 2 + s * 2 * block_n * d * 2 <= 227 * 1024
    assert mod.gluon_stages(128, 128) == 2 and mod.gluon_stages(64, 128) == 3


def test_gluon_ok_refuses_what_it_cannot_run():
    mod = _gluon_module(PATTERNS["sliding_window"])
    x = torch.zeros(1, 2, 256, 128, dtype=torch.bfloat16)
    assert not mod.gluon_ok(x, x, x, 128, 128)                        # CPU tensors
    if DEV == "cuda":
        g = x.to(DEV)
        assert not mod.gluon_ok(g, g, g, 64, 64)                        # 64-row tiles: the Triton kernel
        assert not mod.gluon_ok(g, g, g, 128, 32)
        assert not mod.gluon_ok(g.float(), g.float(), g.float(), 128, 128)
        assert not mod.gluon_ok(g[..., :96], g[..., :96], g[..., :96], 128, 128)   # head dim 96
        assert not mod.gluon_ok(g, g.half(), g, 128, 128)                # mixed dtypes
        assert not mod.gluon_ok(g[..., ::2], g[..., ::2], g[..., ::2], 128, 128)
        assert mod.gluon_ok(g, g, g, 128, 128) == _hopper()
    tiles = tuple(torch.zeros(2, dtype=torch.int32, device=DEV) for _ in range(5))
    cpu_or_not_hopper = x.to(DEV) if not _hopper() else x.to(DEV).float()
    with pytest.raises(ValueError, match="use_gluon"):
        mod.prefill(cpu_or_not_hopper, cpu_or_not_hopper, cpu_or_not_hopper, *tiles, block_m=128, block_n=128,
                    use_gluon=True)


hopper_only = pytest.mark.skipif(not _hopper(), reason="the Gluon kernel runs on compute capability 9.x GPUs only")


def _run(mod, q, k, v, block_n, lse=False):
    tiles = mod.build_tiles(q.shape[2], k.shape[2], block_m=128, block_n=block_n, device=DEV)
    stats = torch.empty(q.shape[:3], dtype=torch.float32, device=DEV) if lse else None
    out = mod.prefill(q, k, v, *tiles, block_m=128, block_n=block_n, use_gluon=True, lse=stats)
    return out, stats, tiles


@hopper_only
@pytest.mark.parametrize("name", list(PATTERNS))
@pytest.mark.parametrize("block_n,head_dim,dtype", [(128, 128, torch.bfloat16), (64, 64, torch.float16)])
def test_gluon_prefill_matches_mask(name, block_n, head_dim, dtype):
    p = PATTERNS[name]
    mod = _gluon_module(p, PrefillOptions(128, block_n, 8, 3))
    for (lq, lk, hq, hkv) in [(512, 512, 4, 2), (300, 1000, 3, 1), (1000, 1000, 2, 2)]:
        q, k, v = qkv(2, hq, hkv, lq, head_dim, Lk=lk, dtype=dtype, device=DEV, seed=lq + lk)
        out, _, _ = _run(mod, q, k, v, block_n)
        err = rel_error(out, reference_attention(p, q, k, v))
        assert err < TOL[dtype], f"{name} Lq {lq} Lk {lk}: rel err {err:.2e}"


@hopper_only
def test_sas_gluon_0_turns_the_gluon_kernel_off(monkeypatch):
    """SAS_GLUON=0: gluon_ok refuses, `use_gluon=True` says why, and the runtime's automatic
    tiles drop the wide-kernel rule (64-row Triton tiles for a causal 2K prefill)."""
    from sas.runtime import SASAttnKernel

    mod = _gluon_module(PATTERNS["sliding_window"])
    q, k, v = qkv(1, 2, 2, 2048, 128, dtype=torch.bfloat16, device=DEV, seed=5)
    kern = SASAttnKernel(Causal(), max_len=2048)
    assert mod.gluon_ok(q, k, v, 128, 128) and kern.runtime.wide_kernel(q, k, v)
    assert kern.runtime.prefill_tiles(q, k, v)[0] == PrefillOptions(128, 128, 8, 3)
    monkeypatch.setenv("SAS_GLUON", "0")
    assert not mod.gluon_ok(q, k, v, 128, 128) and not kern.runtime.wide_kernel(q, k, v)
    assert kern.runtime.prefill_tiles(q, k, v)[0] == PrefillOptions(64, 64, 4, 3)
    tiles = mod.build_tiles(2048, 2048, block_m=128, block_n=128, device=DEV)
    with pytest.raises(ValueError, match="SAS_GLUON=0"):
        mod.prefill(q, k, v, *tiles, block_m=128, block_n=128, use_gluon=True)
    out = mod.prefill(q, k, v, *tiles, block_m=128, block_n=128)          # the Triton kernel
    assert rel_error(out, reference_attention(PATTERNS["sliding_window"], q, k, v)) < TOL[torch.bfloat16]


@hopper_only
def test_gluon_prefill_statistics_and_strided_inputs():
    """The row statistics equal the Triton kernel's, and q in [B, L, H, D] storage reads right."""
    p = PATTERNS["streaming_llm"]
    mod = _gluon_module(p)
    q, k, v = qkv(1, 4, 2, 700, 128, Lk=900, dtype=torch.bfloat16, device=DEV, seed=3)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)
    out, stats, tiles = _run(mod, qt, k, v, 128, lse=True)
    ref = reference_attention(p, q, k, v)
    assert rel_error(out, ref) < TOL[torch.bfloat16]
    stats_t = torch.empty_like(stats)
    mod.prefill(q, k, v, *tiles, block_m=128, block_n=128, use_gluon=False, lse=stats_t)
    finite = torch.isfinite(stats_t)
    assert torch.equal(finite, torch.isfinite(stats))
    assert torch.allclose(stats[finite], stats_t[finite], atol=2e-2, rtol=1e-3)


@hopper_only
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=causal_patterns(3).filter(lambda p: not p.dynamics()), L=st.integers(130, 600))
def test_gluon_prefill_random_compositions(p, L):
    mod = _gluon_module(p)
    q, k, v = qkv(1, 2, 1, L, 64, dtype=torch.bfloat16, device=DEV, seed=L)
    out, _, _ = _run(mod, q, k, v, 128)
    err = rel_error(out, reference_attention(p, q, k, v))
    assert err < TOL[torch.bfloat16], f"{p!r}: rel err {err:.2e}"


def test_auto_tiles_with_the_wide_kernel():
    """Where the Gluon kernel runs, windows and causal rows take 128 x 128 tiles (they pay there);
    few tiles a row and narrow column structure keep the 64-row Triton tiles."""
    from sas import Diag, Rect
    from sas.codegen.triton_backend import auto_prefill_options

    wide = PrefillOptions(128, 128, 8, 3)
    assert auto_prefill_options(Causal(), 2048) == PrefillOptions(64, 64, 4, 3)
    assert auto_prefill_options(Causal(), 2048, wide_kernel=True) == wide
    cases = {
        "sliding_window": (Diag(0, 1024), True),
        "streaming_llm": ((Diag(0, 1024) + Rect(cols=(0, 32))) * Causal(), True),
        "block_local": ((Rect(size=(128, 128)) >> Diag(0, 3)) * Causal(), False),
        "openai_strided": ((Diag(0, 512) + Diag(0, None, stride=512)) * Causal(), False),
        "openai_fixed": (((Rect(size=(256, 256)) >> Diag(0, 1))
                          + ((Rect(size=(256, 256)) * Rect(cols=(224, None))) >> Rect())) * Causal(), False),
    }
    for name, (p, takes_wide) in cases.items():
        got = auto_prefill_options(p, 16384, wide_kernel=True)
        assert (got == wide) == takes_wide, (name, got)
        if not takes_wide:
            assert got == auto_prefill_options(p, 16384), name


def test_runtime_asks_for_wide_tiles_only_where_gluon_runs():
    from sas.runtime import SASAttnKernel

    kern = SASAttnKernel(Causal(), max_len=2048)
    q = torch.zeros(1, 2, 2048, 64, dtype=torch.bfloat16, device=DEV)
    o = kern.runtime.prefill_tiles(q, q, q)[0]
    assert (o.block_m == 128) == _hopper()
    assert kern.runtime.wide_kernel(q, q, q) == _hopper()
    assert not kern.runtime.wide_kernel(q.float(), q.float(), q.float())
