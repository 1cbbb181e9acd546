"""The CUDA backend without a GPU.

- The C++ printer (sas.codegen.printers) is compiled by g++ on the host and its predicate,
  cache_id_func and mask_func evaluated on every cell: they equal the exact mask
  `pattern.to_mask(n)` (the oracle) and the analysis' own Python functions, for the Table-1
  patterns and hypothesis-drawn causal compositions.
- nvcc compiles the generated CUDA for sm_90 for the same patterns (one translation unit, each
  pattern in its own namespace, one prefill and one decode instantiation each to keep it short),
  and `sas compile --backend cuda` compiles the requested dtype / head dim before writing.
- The loader's torch parts (cache ids, fill_cache, tile lists) against the analysis and the mask.
- Bad input: head dims and dtypes the backend does not take, Dynamic patterns, nvcc missing or
  failing: each a SASError naming the problem, with nothing written.

Correctness of the kernels themselves runs on the GPU (benchmarks/bench_cuda.py --check; the
results are in docs/cuda.md).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sas import Causal, Diag, Dynamic, Rect, ops
from sas.analysis import analyze
from sas.codegen.compile import compile_pattern
from sas.codegen.cuda_backend import (WGMMA_ARCH, WGMMA_DEFINE, arch_flags, check_compiles, device_arch, nvcc_command,
                                      render_cuda, render_loader, trim_message, uses_wgmma)
from sas.codegen.printers import find_function, lower_function, lower_predicate, table_refs
from sas.errors import KernelError, NotYetSupportedError, SASError

from helpers.cuda import needs_nvcc
from helpers.table1 import TABLE1_ANALYSIS, TABLE1_KERNELS
from strategies import causal_patterns

pytestmark = pytest.mark.kernels


N = 96   # positions evaluated by the host checks (analysis max_len)


needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found: the C++ printer check needs it")


# --- the C++ printer, evaluated by g++ -----------------------------------------------------------

def _cpp_unit(k: int, pattern, analysis) -> tuple[str, str, bool]:
    """C++ functions of pattern k (namespace p<k>) and the main() lines printing their values:
    the predicate on N x N, cache_id_func on 0..N-1, mask_func on cache x N (when it lowers)."""
    pred = lower_predicate(pattern, "qi", "kj", dialect="cpp")
    fns, refs = analysis.functions, table_refs(dict(analysis.tables))
    cid = lower_function(find_function(fns, "cache_id_func"), ["pos"], refs, module=fns, prefix="cid_",
                         dialect="cpp")
    try:
        msk = lower_function(find_function(fns, "mask_func"), ["slot", "pos"], refs, boolean=True, module=fns,
                             prefix="msk_", dialect="cpp")
    except NotYetSupportedError:   # a table search: the CUDA backend does not generate decode then
        msk = None
    tables = "".join(f"static const int {ref.arg}[] = {{{', '.join(map(str, ref.values))}}};\n"
                     for ref in refs.values() if ref.length)
    body = [f"namespace p{k} {{", tables,
            f"static bool mask(int qi, int kj) {{ return {pred}; }}",
            "static int cid(int pos) {", *cid.lines, f"return (int)({cid.expr}); }}"]
    if msk is not None:
        body += ["static bool att(int slot, int pos) {", *msk.lines, f"return {msk.expr}; }}"]
    body.append("}")
    C = int(analysis.cache_size)
    main = [f"for (int i = 0; i < {N}; ++i) for (int j = 0; j < {N}; ++j) putchar('0' + p{k}::mask(i, j));",
            "putchar('\\n');",
            f"for (int p = 0; p < {N}; ++p) printf(\"%d \", p{k}::cid(p));", "putchar('\\n');"]
    if msk is not None:
        main += [f"for (int s = 0; s < {C}; ++s) for (int p = 0; p < {N}; ++p) putchar('0' + p{k}::att(s, p));",
                 "putchar('\\n');"]
    return "\n".join(body), "\n".join(main), msk is not None


def _run_cpp(patterns, tmp_path: Path) -> None:
    analyses = [analyze(p, N) for p in patterns]
    units = [_cpp_unit(k, p, a) for k, (p, a) in enumerate(zip(patterns, analyses))]
    src = "#include <cstdio>\n" + "\n".join(u[0] for u in units) + "\nint main() {\n" + \
        "\n".join(u[1] for u in units) + "\nreturn 0; }\n"
    (tmp_path / "p.cpp").write_text(src)
    subprocess.run(["g++", "-O0", "-w", "-o", str(tmp_path / "p"), str(tmp_path / "p.cpp")], check=True,
                   capture_output=True, timeout=120)
    lines = subprocess.run([str(tmp_path / "p")], check=True, capture_output=True, text=True,
                           timeout=60).stdout.split("\n")
    at = 0
    for (pattern, a, (_, _, has_mask)) in zip(patterns, analyses, units):
        got = np.frombuffer(lines[at].encode(), dtype=np.uint8).reshape(N, N) == ord("1")
        np.testing.assert_array_equal(got, pattern.to_mask(N), err_msg=repr(pattern))
        assert [int(x) for x in lines[at + 1].split()] == [a.cache_id_func(p) for p in range(N)], repr(pattern)
        at += 2
        if has_mask:
            C = int(a.cache_size)
            got = np.frombuffer(lines[at].encode(), dtype=np.uint8).reshape(C, N) == ord("1")
            want = np.array([[bool(a.mask_func(s, p)) for p in range(N)] for s in range(C)]).reshape(C, N)
            np.testing.assert_array_equal(got, want, err_msg=repr(pattern))
            at += 1


@needs_gxx
def test_cpp_printer_table1(tmp_path):
    _run_cpp(list(TABLE1_ANALYSIS.values()) + list(TABLE1_KERNELS.values()), tmp_path)


@needs_gxx
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.lists(causal_patterns(max_depth=3).filter(lambda p: not p.dynamics() and p.to_mask(N).any()),
                min_size=8, max_size=8))
def test_cpp_printer_random(tmp_path_factory, patterns):
    for p in patterns:
        analyze(p, N)           # every static non-empty pattern analyzes (no error swallowed)
    _run_cpp(patterns, tmp_path_factory.mktemp("cpp"))


def test_cpp_constants_and_tables():
    # a table read is guarded (no out-of-range index), large constants are 64-bit
    refs = table_refs({"T": [5, 6, 7]})
    fdef = ast.parse("def f(pos):\n    x = pos * 3000000000\n    return T[pos - 1] + x").body[0]
    out = lower_function(fdef, ["pos"], refs, dialect="cpp")
    assert out.lines == ("const auto t_x_0 = (pos * 3000000000LL);",)
    assert out.expr == "(((((pos - 1) >= 0) && ((pos - 1) < 3)) ? tbl_T[(pos - 1)] : 0) + t_x_0)"


# --- nvcc for sm_90 --------------------------------------------------------------------------------

@needs_nvcc
def test_nvcc_compiles_table1_and_random_compositions():
    """One translation unit: the six Table-1 patterns (prefill + decode) and drawn compositions
    (decode where they lower; non-causal ones prefill only), each in its own namespace."""
    pats = list(TABLE1_KERNELS.values())
    drawn: list = []

    @settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck), database=None,
              derandomize=True)
    @given(causal_patterns(max_depth=3))
    def collect(p):
        drawn.append(p)

    collect()
    pats += [p for p in drawn if not p.dynamics()][:2]
    # a window plus every 6th key: its keys' last uses fit no ring of the minimal size at 256,
    # so its decode reads a table and its mask_func the slots' held keys
    pats += [(Diag(0, 6) + Diag(0, None, stride=6)) * Causal()]
    pats += [Rect(rows=(0, 40), cols=(8, 24)) + Diag(-3, 8)]   # not causal: prefill only
    sources, decodes, held = [], 0, 0
    for p in pats:
        try:
            a = analyze(p, 256)
        except SASError:
            a = None
        cs = render_cuda(p, a)
        decodes += cs.decode
        held += cs.held_keys
        sources.append(cs.source)
    assert decodes >= 9 and held >= 1
    # sm_90a: the Hopper build (-DSAS_WGMMA): the wgmma prefill and the decode; the mma.sync
    # prefill of other targets is compiled for sm_90 by compile_pattern in the next test
    check_compiles("\n".join(sources), "sm_90a", dtype=0, head_dim=64, minimal=True)


@needs_nvcc
def test_compile_backend_cuda_writes_kernels_and_loader(tmp_path):
    pattern = (Diag(0, 24) + Rect(cols=(0, 4))) * Causal()
    rep = compile_pattern(pattern, tmp_path / "k", backend="cuda", max_len=256, head_dim=64, dtype="float16")
    assert sorted(os.listdir(tmp_path / "k")) == ["kernels.cu", "loader.py", "report.json", "report.md"]
    assert rep["backend"] == "cuda" and rep["decode"] and rep["cache_size"] == 28
    src = (tmp_path / "k" / "kernels.cu").read_text()
    assert "sas_mask(int qi, int kj)" in src and "sas_attend(int slot, int pos" in src
    # the loader imports without a GPU and knows the cache
    spec = importlib.util.spec_from_file_location("sas_cuda_loader_test", tmp_path / "k" / "loader.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.CACHE_SIZE == 28 and mod.HAS_DECODE


def test_targets_and_their_defines():
    assert device_arch(9, 0) == "sm_90a" and device_arch(8, 0) == "sm_80" and device_arch(12, 0) == "sm_120"
    assert arch_flags("sm_90a") == ["-DSAS_WGMMA"] and arch_flags("sm_90") == [] and arch_flags("sm_80") == []
    cmd = nvcc_command("nvcc", "sm_90a", "k.cu", "k.o")
    assert "-DSAS_WGMMA" in cmd and "-gencode=arch=compute_90a,code=sm_90a" in cmd
    assert "-DSAS_WGMMA" not in nvcc_command("nvcc", "sm_90", "k.cu", "k.o")
    with pytest.raises(KernelError, match="not a CUDA target"):
        arch_flags("hopper")
    assert uses_wgmma("sm_90a") and not uses_wgmma("sm_90")
    # the standalone loader applies the same rule (it carries the constants, not a copy of them)
    _, _, mod = _loader(TABLE1_KERNELS["streaming_llm"], 128)
    assert (mod.WGMMA_ARCH, mod.WGMMA_DEFINE) == ("sm_90a", "-DSAS_WGMMA") == (WGMMA_ARCH, WGMMA_DEFINE)


# --- the loader's torch parts ------------------------------------------------------------------------

def _loader(pattern, n):
    a = analyze(pattern, n)
    cs = render_cuda(pattern, a)
    src = render_loader(cs, pattern, n)
    name = f"sas_cuda_loader_{cs.namespace}"
    spec = importlib.util.spec_from_loader(name, loader=None)
    mod = importlib.util.module_from_spec(spec)
    exec(compile(src, name, "exec"), mod.__dict__)
    return a, cs, mod


@pytest.mark.parametrize("name", sorted(TABLE1_KERNELS))
def test_loader_cache_ids_tiles_and_fill(name):
    pattern = TABLE1_KERNELS[name]
    n = 200
    a, cs, mod = _loader(pattern, n)
    # tile lists: every attended cell lies in a listed tile, full tiles are fully attended
    mask = torch.as_tensor(pattern.to_mask(n))
    for bn in (64, 32):
        fr, fc, pr, pc, order = mod.build_tiles(n, block_n=bn)
        cover = torch.zeros_like(mask)
        for blk in range(len(fr) - 1):
            for t in range(int(fr[blk]), int(fr[blk + 1])):
                tile = mask[blk * 64:(blk + 1) * 64, int(fc[t]) * bn:(int(fc[t]) + 1) * bn]
                assert bool(tile.all())
                cover[blk * 64:(blk + 1) * 64, int(fc[t]) * bn:(int(fc[t]) + 1) * bn] = True
            for t in range(int(pr[blk]), int(pr[blk + 1])):
                cover[blk * 64:(blk + 1) * 64, int(pc[t]) * bn:(int(pc[t]) + 1) * bn] = True
        assert not bool((mask & ~cover).any())
        assert sorted(order.tolist()) == list(range(len(fr) - 1))
    assert cs.decode and mod.HAS_DECODE
    # mask_func is a table search for OpenAI-strided at this length: decode applies the predicate
    # to the key each slot holds (slot_keys), and asks for them
    assert mod.HELD_KEYS == cs.held_keys == (name == "openai_strided")
    if mod.HELD_KEYS:
        q = torch.zeros(1, 2, 1, 64, dtype=torch.float16)
        kc = torch.zeros(1, 2, a.cache_size, 64, dtype=torch.float16)
        with pytest.raises(mod.CudaKernelError, match="table-driven; pass slot_keys"):
            mod.decode(q, q, q, kc, kc, 5)
        with pytest.raises(mod.CudaKernelError, match=f"slot_keys must be a contiguous int32 vector of {a.cache_size}"):
            mod.decode(q, q, q, kc, kc, 5, slot_keys=torch.zeros(3, dtype=torch.int32))
    assert mod.cache_ids(torch.arange(n)).tolist() == [a.cache_id_func(p) for p in range(n)]
    # fill_cache leaves each slot holding the last key written to it
    k = torch.randn(1, 2, n, 8)
    kc, vc = torch.zeros(1, 2, a.cache_size, 8), torch.zeros(1, 2, a.cache_size, 8)
    mod.fill_cache(k, k, kc, vc)
    for s in range(a.cache_size):
        keys = [p for p in range(n) if a.cache_id_func(p) == s]
        if keys:
            assert torch.equal(kc[0, :, s], k[0, :, keys[-1]])


# --- bad input ------------------------------------------------------------------------------------------

STREAMING = (Diag(0, 24) + Rect(cols=(0, 4))) * Causal()


@pytest.mark.parametrize("kwargs,error,match", [
    ({"head_dim": 32}, KernelError, "head_dim 32 is not supported by the cuda backend; supported: 64, 128"),
    ({"dtype": "float32"}, KernelError, "dtype 'float32' is not supported by the cuda backend"),
])
def test_compile_bad_input_leaves_nothing(tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        compile_pattern(STREAMING, tmp_path / "k", backend="cuda", max_len=128, **kwargs)
    assert not (tmp_path / "k").exists()


def test_compile_dynamic_pattern_is_refused(tmp_path):
    h2o = Diag(0, 4) + Diag(4, None) * Dynamic(budget=2, score=ops.attn_score().sum(dim=1))
    with pytest.raises(NotYetSupportedError, match="static patterns only"):
        compile_pattern(h2o, tmp_path / "k", backend="cuda", max_len=64)
    with pytest.raises(NotYetSupportedError, match="static patterns only"):     # before the head dim
        compile_pattern(h2o, tmp_path / "k", backend="cuda", max_len=64, head_dim=16)
    assert not (tmp_path / "k").exists()


def test_nvcc_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("SAS_NVCC", str(tmp_path / "no-such-nvcc"))
    with pytest.raises(KernelError, match="SAS_NVCC=.*not an executable"):
        compile_pattern(STREAMING, tmp_path / "k", backend="cuda", max_len=128)
    assert not (tmp_path / "k").exists()
    monkeypatch.delenv("SAS_NVCC")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setattr(os, "access", lambda *a, **k: False)   # no /usr/local/cuda/bin/nvcc either
    with pytest.raises(KernelError, match="nvcc .* was not found"):
        compile_pattern(STREAMING, tmp_path / "k", backend="cuda", max_len=128)
    assert not (tmp_path / "k").exists()


def test_nvcc_failing_message_is_trimmed(tmp_path, monkeypatch):
    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\n" + "echo 'kernels.cu(12): note: something' >&2\n" * 200
                    + "echo 'kernels.cu(40): error: identifier \"oops\" is undefined' >&2\nexit 2\n")
    fake.chmod(0o755)
    monkeypatch.setenv("SAS_NVCC", str(fake))
    with pytest.raises(KernelError) as info:
        compile_pattern(STREAMING, tmp_path / "k", backend="cuda", max_len=128)
    msg = str(info.value)
    assert "nvcc failed compiling the generated CUDA for sm_90 (exit 2)" in msg
    assert 'identifier "oops" is undefined' in msg and len(msg) < 2000
    assert not (tmp_path / "k").exists()
    assert trim_message("x\n" * 5000).count("x") <= 12


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without a GPU")
def test_runtime_needs_a_gpu():
    from sas.runtime import SASAttnKernel

    with pytest.raises(KernelError, match="backend='cuda' needs a CUDA device"):
        SASAttnKernel(STREAMING, max_len=64, backend="cuda")


@needs_nvcc
def test_runtime_decides_the_tile_width_once_per_length(monkeypatch):
    """The prefill tile width comes from the plan's cached schedule: no tile counting per call
    (a first H100 run recomputed it on every call and timed Python, not the kernel)."""
    import sas.plan
    from sas.plan import make_plan
    from sas.runtime.cuda import CudaRuntime

    calls = []
    real = sas.plan.auto_prefill_options
    monkeypatch.setattr(sas.plan, "auto_prefill_options", lambda *a, **k: calls.append(a) or real(*a, **k))
    rt = CudaRuntime(make_plan(TABLE1_KERNELS["openai_fixed"], 512), arch="sm_90")
    widths = {rt.tile_width(512, 512) for _ in range(5)}
    tiles = [rt.tile_tensors(512, 512, torch.device("cpu")) for _ in range(3)]
    assert len(widths) == 1 and len(calls) == 1 and tiles[0] is tiles[2]


@needs_nvcc
def test_tile_shapes_refused_and_chosen():
    """A tile height or width the kernels lack is a KernelError naming it, from the runtime and
    from the standalone loader, before any work; so is a 128-key width with 64 rows or off the
    Hopper target. The automatic shape: 128 x 128 on the Hopper target where rows hold >= 8 tiles
    of 64 x 64 and the wide tiles compute <= 15% more cells (windows, fully causal); 128 x 64 for
    other near-dense rows (>= 64 tiles of 64 x 64 per query block); 32-wide tiles where they
    compute >= 10% fewer cells or, on Hopper, rows are under 4 tiles (the mma.sync kernel keeps the
    plan's width: also for rows under 8 tiles); the tile lists follow it."""
    from sas.codegen.triton_backend import tiles_per_block, wide_tiles_pay
    from sas.plan import make_plan
    from sas.runtime.cuda import CudaRuntime

    plan = make_plan(Causal(), 4096)
    for kw, name in (({"block_m": 96}, "block_m"), ({"block_n": 256}, "block_n"),
                     ({"decode_kernel": "wmma"}, "decode_kernel")):
        with pytest.raises(KernelError, match=f"{name} must be one of"):
            CudaRuntime(plan, arch="sm_90a", **kw)
    with pytest.raises(KernelError, match="block_n=128 needs block_m=128"):
        CudaRuntime(plan, arch="sm_90a", block_n=128, block_m=64)
    with pytest.raises(KernelError, match="block_n=128 runs on the Hopper wgmma kernel only"):
        CudaRuntime(plan, arch="sm_90", block_n=128)
    assert CudaRuntime(plan, arch="sm_90a", block_n=128).tile_height(4096, 4096) == 128
    # fully causal: 128 x 128 on Hopper at every length with >= 8 tiles a row (64 rows, 64 wide elsewhere)
    assert CudaRuntime(plan, arch="sm_90a").tile_shape(4096, 4096) == (128, 128)
    assert CudaRuntime(make_plan(Causal(), 8192), arch="sm_90a").tile_shape(8192, 8192) == (128, 128)
    assert CudaRuntime(make_plan(Causal(), 8192), arch="sm_90").tile_shape(8192, 8192) == (64, 64)
    assert CudaRuntime(plan, arch="sm_90a", block_m=64).tile_width(4096, 4096) == 64   # no 64 x 128 tile
    # a fixed width under 128 where the automatic shape is 128 x 128: 128 rows for near-dense rows only
    assert CudaRuntime(make_plan(Causal(), 8192), arch="sm_90a", block_n=64).tile_height(8192, 8192) == 128
    assert CudaRuntime(make_plan(Diag(0, 1024), 4096), arch="sm_90a", block_n=32).tile_height(4096, 4096) == 64
    # a window of 1024: 128 x 128; a strided pattern whose wide tiles compute 1.3x the cells: 64 x 64;
    # near-dense rows of 64-key blocks with gaps (wide tiles 2x the cells): 128 x 64
    window = Diag(0, 1024)
    assert wide_tiles_pay(window, 4096, 4096, tiles_per_block(window, 4096, 4096, 64, 64))
    assert CudaRuntime(make_plan(window, 4096), arch="sm_90a").tile_shape(4096, 4096) == (128, 128)
    strided = (Diag(0, 128) + Diag(0, None, stride=128)) * Causal()   # OpenAI-strided at its real scale
    assert not wide_tiles_pay(strided, 4096, 4096, tiles_per_block(strided, 4096, 4096, 64, 64))
    halves = Causal() * (Rect(size=(1, 64)) >> Rect(stride=(1, 2)))   # every other 64-key block
    per = tiles_per_block(halves, 16384, 16384, 64, 64)
    assert per >= 64 and not wide_tiles_pay(halves, 16384, 16384, per)
    assert CudaRuntime(make_plan(halves, 16384), arch="sm_90a").tile_shape(16384, 16384) == (128, 64)
    # rows of 4-8 tiles: 64 wide on Hopper, the plan's 32 on the mma.sync kernel
    local = Rect(size=(256, 256)) >> Diag(0, 1)
    assert 4 <= tiles_per_block(local, 2048, 2048, 64, 64) < 8
    assert CudaRuntime(make_plan(local, 2048), arch="sm_90a").tile_shape(2048, 2048) == (64, 64)
    assert CudaRuntime(make_plan(local, 2048), arch="sm_90").tile_shape(2048, 2048) == (64, 32)
    # rows under 4 tiles, and narrow column structure: 32 wide everywhere
    short = Rect(size=(64, 64)) >> Diag(0, 1)
    assert tiles_per_block(short, 2048, 2048, 64, 64) < 4
    assert CudaRuntime(make_plan(short, 2048), arch="sm_90a").tile_shape(2048, 2048) == (64, 32)
    block = Rect(size=(256, 256))   # OpenAI-fixed at its real scale: 32 summary columns a block
    fixed = ((block >> Diag(0, 1)) + ((block * Rect(cols=(224, None))) >> Rect())) * Causal()
    assert CudaRuntime(make_plan(fixed, 8192), arch="sm_90a").tile_shape(8192, 8192) == (64, 32)
    rt = CudaRuntime(make_plan(TABLE1_KERNELS["block_local"], 512), arch="sm_90a", block_m=128)
    bm, bn, fr, fc, pr, pc, order = rt.tile_tensors(512, 512, torch.device("cpu"))
    assert bm == 128 and len(fr) == 512 // 128 + 1 and len(order) == 512 // 128
    _, _, mod = _loader(TABLE1_KERNELS["streaming_llm"], 128)
    q = torch.zeros(1, 1, 64, 64, dtype=torch.float16)
    with pytest.raises(mod.CudaKernelError, match="block_m must be one of"):
        mod.prefill(q, q, q, *mod.build_tiles(64), block_m=96)
    with pytest.raises(mod.CudaKernelError, match="block_n=128 needs block_m=128"):
        mod.prefill(q, q, q, *mod.build_tiles(64), block_n=128)


@needs_nvcc
def test_prefill_falls_back_from_128_key_tiles_the_loader_cannot_run(monkeypatch):
    """Tensors the 128 x 128 kernel's copies cannot read (the loader's error): the automatic shape
    retries with 128 x 64 tiles (which take the mma.sync kernel there, as every other shape does);
    a width fixed at 128 raises the loader's error, and so does any other error."""
    import contextlib

    import sas.runtime.cuda as cuda_rt
    from sas.plan import make_plan
    from sas.runtime.cuda import CudaRuntime

    rt = CudaRuntime(make_plan(Causal(), 1024), arch="sm_90a")
    assert rt.tile_shape(1024, 1024) == (128, 128)
    calls = []

    def fake_prefill(q, k, v, fr, fc, pr, pc, order, *, q_offset, out, block_m, block_n):
        calls.append((block_m, block_n, len(fr) - 1))
        if block_n == 128:
            raise rt.loader.WideTilesUnavailable("prefill: 128 x 128 tiles run on the Hopper wgmma kernel only (...)")
        return q

    monkeypatch.setattr(cuda_rt, "check_cuda_tensor", lambda *a: None)
    monkeypatch.setattr(cuda_rt.torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(rt.loader, "prefill", fake_prefill)
    x = torch.zeros(1, 1, 1024, 64, dtype=torch.bfloat16)
    assert rt.prefill(x, x, x) is x
    assert calls == [(128, 128, 8), (128, 64, 8)]
    fixed = CudaRuntime(make_plan(Causal(), 1024), arch="sm_90a", block_n=128)
    monkeypatch.setattr(fixed.loader, "prefill", fake_prefill)
    with pytest.raises(fixed.loader.CudaKernelError, match="Hopper wgmma kernel only"):
        fixed.prefill(x, x, x)
    assert issubclass(fixed.loader.WideTilesUnavailable, fixed.loader.CudaKernelError)


def test_decode_kernel_choice_is_checked_before_any_work():
    """The decode kernel is "auto" or one of the loader's DECODE_KERNELS (the runtime's list is the same);
    another name is an error naming the valid ones, raised before the library is touched."""
    from sas.runtime.cuda import DECODE_KERNELS

    _, _, mod = _loader(TABLE1_KERNELS["streaming_llm"], 128)
    assert tuple(mod.DECODE_KERNELS) == DECODE_KERNELS and mod.DECODE_KERNEL == "auto"
    q = torch.zeros(1, 2, 1, 64, dtype=torch.float16)
    kc = torch.zeros(1, 2, mod.CACHE_SIZE, 64, dtype=torch.float16)
    with pytest.raises(mod.CudaKernelError, match="kernel must be one of auto, simt, mma, mma8, got 'wmma'"):
        mod.decode(q, q, q, kc, kc, 5, kernel="wmma")


def test_loader_copies_misaligned_views_and_refuses_misaligned_caches():
    """The kernels read and write 16-byte vectors: a contiguous view starting 8 bytes off a 16-byte
    boundary is copied (contiguous() would return it as it is), an aligned tensor passes through, and
    a misaligned cache (updated in place, so no copy can stand in) is refused before any work."""
    _, _, mod = _loader(TABLE1_KERNELS["streaming_llm"], 128)
    t = torch.arange(4 + 2 * 64, dtype=torch.bfloat16)[4:].view(1, 2, 1, 64)
    assert t.is_contiguous() and t.data_ptr() % 16 == 8   # (CPU allocations start on 64 bytes)
    c = mod._aligned(t)
    assert c is not t and c.data_ptr() % 16 == 0 and torch.equal(c, t)
    ok = torch.zeros(1, 2, 1, 64, dtype=torch.bfloat16)
    assert mod._aligned(ok) is ok and mod._tma_ready(ok) is ok
    # an expanded view (stride 0 over several heads): the 128 x 128 tile kernel's copies need it dense
    wide = ok[:, :1].expand(1, 2, 1, 64)
    assert mod._aligned(wide) is wide
    dense = mod._tma_ready(wide)
    assert 0 not in dense.stride() and torch.equal(dense, wide)
    kc = torch.zeros(2 * mod.CACHE_SIZE * 64 + 4, dtype=torch.bfloat16)[4:].view(1, 2, mod.CACHE_SIZE, 64)
    with pytest.raises(mod.CudaKernelError, match="k_cache must have a contiguous last dimension, 16-byte aligned"):
        mod.decode(ok, ok, ok, kc, kc, 5)


def test_decode_kernel_auto_choice():
    """"auto" runs the CUDA-core kernel with one query head a block (4 slots in flight per lane group
    beyond one-step splits) and the 4-warp tensor-core one with several, whatever the split size."""
    _, _, mod = _loader(TABLE1_KERNELS["streaming_llm"], 128)
    simt, mma, mma8 = (mod.DECODE_KERNELS[k] for k in ("simt", "mma", "mma8"))
    assert len({simt, mma, mma8, mod._SIMT_LIGHT}) == 4
    assert mod.decode_kernel_id("auto", 1, 64) == simt
    assert mod.decode_kernel_id("auto", 1, 65) == mod._SIMT_LIGHT
    for heads, split in ((2, 64), (4, 64), (8, 16), (4, 4096)):
        assert mod.decode_kernel_id("auto", heads, split) == mma
    assert mod.decode_kernel_id("simt", 4, 64) == simt and mod.decode_kernel_id("simt", 4, 4096) == simt
    assert mod.decode_kernel_id("mma8", 1, 4096) == mma8 and mod.decode_kernel_id("mma", 1, 8) == mma


def test_decode_split_rule():
    """Splits aim at DECODE_WAVES_MHA blocks an SM with one query head a block and DECODE_WAVES
    with several, each of at least DECODE_MIN_SLOTS slots; a cache that small is one split."""
    _, _, mod = _loader(TABLE1_KERNELS["streaming_llm"], 128)
    assert (mod.DECODE_WAVES_MHA, mod.DECODE_WAVES, mod.DECODE_MIN_SLOTS) == (4, 2, 64)
    assert mod.num_splits_for(1, 64, 1, cache_size=1056, num_sms=132) == 9            # ceil(4 * 132 / 64)
    assert mod.num_splits_for(16, 8, 1, cache_size=1056, num_sms=132, heads_per_block=4) == 3   # ceil(264 / 128)
    assert mod.num_splits_for(1, 64, 1, cache_size=384, num_sms=132) == 6             # 64-slot splits at least
    assert mod.num_splits_for(1, 64, 1, cache_size=64, num_sms=132) == 1
