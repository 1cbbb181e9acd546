"""`compile_pattern`: standalone kernel modules and reports, written atomically."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest
import torch

from sas import Causal, Diag, Dynamic, Rect
from sas.codegen import compile_pattern
from sas.codegen.triton_backend import DecodeOptions, PrefillOptions
from sas.errors import KernelError, NotYetSupportedError, SASError

from helpers.attention import DEV, reference_attention
from helpers.table1 import TABLE1_KERNELS

pytestmark = pytest.mark.kernels

STREAMING = TABLE1_KERNELS["streaming_llm"]


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def import_package(out, name, monkeypatch):
    """The compiled package in folder `out` imported as module `name` (its submodules load
    relative to it; sys.modules restored after the test)."""
    spec = importlib.util.spec_from_file_location(name, out / "__init__.py", submodule_search_locations=[str(out)])
    attn = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, attn)
    spec.loader.exec_module(attn)
    return attn


def test_compile_writes_standalone_modules_and_report(tmp_path):
    out = tmp_path / "build"
    rep = compile_pattern(STREAMING, out, max_len=64, head_dim=64, dtype="float32",
                          prefill_options=PrefillOptions(32, 16, 4, 1), decode_options=DecodeOptions(16, 4, 1))
    assert sorted(os.listdir(out)) == ["__init__.py", "checks.py", "decode.py", "plan.pt", "prefill.py",
                                       "report.json", "report.md", "standalone.py"]
    assert os.listdir(tmp_path) == ["build"]                       # no temporary folders left
    data = json.loads((out / "report.json").read_text())
    assert data == json.loads(json.dumps(rep))
    assert data["cache_size"] == 28 and data["causal"] is True
    assert "def cache_id_func" in data["functions_source"] and "def mask_func" in data["functions_source"]
    t = data["prefill"]["tiles"]
    assert t["full"] + t["partial"] + t["empty"] == t["total"] == 2 * 4
    md = (out / "report.md").read_text()
    assert "KV-cache slots: 28" in md and "| full | partial |" in md
    for name in ("prefill.py", "decode.py"):
        src = (out / name).read_text()
        imports = {line.split()[1].split(".")[0] for line in src.splitlines() if line.startswith(("import ", "from "))}
        assert imports <= {"os", "torch", "triton"}, imports

    # the modules run on their own (no sas import needed by them)
    pre = load(out / "prefill.py", "sas_test_standalone_prefill")
    dec = load(out / "decode.py", "sas_test_standalone_decode")
    L, P = 60, 40
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, L, 64, generator=g).to(DEV) for _ in range(3))
    ref = reference_attention(STREAMING, q, k, v)
    tiles = pre.build_tiles(P, device=DEV)
    o = pre.prefill(q[:, :, :P], k[:, :, :P], v[:, :, :P], *tiles)
    assert float((o.double().cpu() - ref[:, :, :P]).norm() / ref[:, :, :P].norm()) < 1e-4
    kc = torch.zeros(1, 1, dec.CACHE_SIZE, 64, device=DEV)
    vc = torch.zeros_like(kc)
    dec.fill_cache(k[:, :, :P], v[:, :, :P], kc, vc)
    for t in range(P, L):
        o = dec.decode(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], kc, vc, t,
                       num_splits=2)
        r = ref[:, :, t:t + 1]
        assert float((o.double().cpu() - r).norm() / r.norm()) < 1e-4


def test_recompile_replaces_folder(tmp_path):
    out = tmp_path / "b"
    compile_pattern(STREAMING, out, max_len=64)
    (out / "stale.txt").write_text("x")
    compile_pattern(Diag(0, 8), out, max_len=64)
    assert "stale.txt" not in os.listdir(out)
    assert json.loads((out / "report.json").read_text())["cache_size"] == 8
    assert os.listdir(tmp_path) == ["b"]


def test_non_causal_pattern_compiles_prefill_only(tmp_path):
    rep = compile_pattern(Diag(-3, 8), tmp_path / "nc", max_len=64)
    assert rep["causal"] is False and "cache_size" not in rep
    assert sorted(os.listdir(tmp_path / "nc")) == ["__init__.py", "checks.py", "plan.pt", "prefill.py", "report.json",
                                                   "report.md", "standalone.py"]


@pytest.mark.parametrize("kwargs,err,match", [
    ({"backend": "metal"}, SASError, "backend"),
    ({"max_len": 0}, KernelError, "max_len"),
    ({"head_dim": 96}, KernelError, "head_dim"),
    ({"dtype": "int8"}, KernelError, "dtype"),
    ({"num_heads": 6, "num_kv_heads": 4}, KernelError, "num_kv_heads"),
])
def test_compile_errors_leave_nothing(tmp_path, kwargs, err, match):
    with pytest.raises(err, match=match):
        compile_pattern(STREAMING, tmp_path / "x", **kwargs)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("refresh", [False, True])
def test_compile_dynamic_pattern_runs_standalone(tmp_path, refresh):
    """A window + H2O pattern compiles to prefill.py, static_decode.py, dynamic_decode.py and
    the region schedule; the files run without sas and give exactly what SASAttnKernel gives."""
    from sas import ops
    from sas.runtime import SASAttnKernel

    pattern = (Diag(0, 6) + Rect(cols=(0, 2))) * Causal()
    pattern = pattern + (Causal() * ~pattern) * Dynamic(budget=3, score=ops.attn_score().mean(dim=1) * 2.0,
                                                        refresh=refresh)
    out = tmp_path / "dyn"
    rep = compile_pattern(pattern, out, max_len=48, head_dim=16, dtype="float32", num_heads=4, num_kv_heads=2,
                          prefill_options=PrefillOptions(16, 16, 4, 1))
    assert sorted(os.listdir(out)) == ["__init__.py", "checks.py", "dynamic_decode.py", "dynamic_host.py",
                                       "graph_params.py", "plan.pt", "prefill.py", "report.json", "report.md",
                                       "standalone.py", "static_decode.py"]
    assert rep["dynamic"] is True and rep["score_path"] == "fused kernel"
    assert (rep["static_slots"], rep["budget"]) == (8, 3)
    assert rep["cache_size"] == rep["static_slots"] + rep["pool_slots"]
    assert "KV cache" in (out / "report.md").read_text()
    for name in ("prefill.py", "static_decode.py", "dynamic_decode.py"):
        src = (out / name).read_text()
        imports = {line.split()[1].split(".")[0] for line in src.splitlines() if line.startswith(("import ", "from "))}
        assert imports <= {"os", "torch", "triton"}, imports
    tag = f"sas_test_dyn_{int(refresh)}"
    pre = load(out / "prefill.py", f"{tag}_prefill")
    sdec = load(out / "static_decode.py", f"{tag}_static")
    ddec = load(out / "dynamic_decode.py", f"{tag}_dynamic")
    host = load(out / "dynamic_host.py", f"{tag}_host")
    rt = host.Runtime(ddec, sdec, torch.load(out / "plan.pt")["dynamic"])

    g = torch.Generator().manual_seed(4)
    N, P = 20, 12
    q = torch.randn(2, 4, N, 16, generator=g).to(DEV)
    k = torch.randn(2, 2, N, 16, generator=g).to(DEV)
    v = torch.randn(2, 2, N, 16, generator=g).to(DEV)
    ker = SASAttnKernel(pattern, max_len=48, prefill_options=PrefillOptions(16, 16, 4, 1))
    got = [rt.prefill(pre, q[:, :, :P], k[:, :, :P], v[:, :, :P])]
    want = [ker.prefill(q[:, :, :P], k[:, :, :P], v[:, :, :P])]
    assert rt.held_keys() == ker.dynamic.held_keys()
    for t in range(P, N):
        got.append(rt.decode(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]))
        want.append(ker.decode(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]))
        assert rt.held_keys() == ker.dynamic.held_keys()
    torch.testing.assert_close(torch.cat(got, 2), torch.cat(want, 2), rtol=1e-5, atol=1e-5)
    # the package's checks are ValueErrors, as the static package's (before: RuntimeError here)
    one = [t[:, :, N - 1:N] for t in (q, k, v)]
    with pytest.raises(ValueError, match="no prompt yet"):
        host.Runtime(ddec, sdec, torch.load(out / "plan.pt")["dynamic"]).decode(*one)
    rt.length = 48
    with pytest.raises(ValueError, match="position 48 is past MAX_LEN=48; compile the package with a larger"):
        rt.decode(*one)


def test_compile_dynamic_errors(tmp_path):
    from sas import ops

    # a chain that runs as a torch graph cannot be written as standalone kernels
    pooled = Diag(0, 4) + Diag(4, None) * Dynamic(budget=2, score=ops.attn_score().sum(dim=1).pooling(3))
    with pytest.raises(NotYetSupportedError, match="not fused"):
        compile_pattern(pooled, tmp_path / "d", max_len=64)
    # a region that starts after the static part lets its keys go
    with pytest.raises(NotYetSupportedError, match="static part"):
        compile_pattern(Diag(0, 2) + Diag(5, None) * Dynamic(budget=2), tmp_path / "d", max_len=64)
    with pytest.raises(SASError, match="budget"):
        compile_pattern(Diag(0, 2) + Diag(2, 6) * Dynamic(budget=7), tmp_path / "d", max_len=64)
    with pytest.raises(SASError, match="pattern must be a sas Pattern, got str"):
        compile_pattern("Diag(0, 4)", tmp_path / "d")  # type: ignore[arg-type]
    assert os.listdir(tmp_path) == []


def test_failure_keeps_previous_output(tmp_path, monkeypatch):
    out = tmp_path / "keep"
    compile_pattern(STREAMING, out, max_len=64)
    before = (out / "report.json").read_text()
    import sas.codegen.compile as comp

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(comp.os, "replace", boom)
    with pytest.raises(KernelError, match="disk full"):
        compile_pattern(Diag(0, 8), out, max_len=64)
    monkeypatch.undo()
    assert (out / "report.json").read_text() == before
    assert sorted(os.listdir(tmp_path)) == ["keep"]


def test_compiled_package_on_cpu_tensors_without_the_interpreter_says_so(tmp_path, monkeypatch):
    """The compiled package's prefill and decode refuse CPU tensors unless Triton's interpreter is
    on, with a message naming TRITON_INTERPRET=1 (instead of Triton's "0 active drivers")."""
    out = tmp_path / "cpu_pkg"
    compile_pattern(Diag(0, 4) * Causal(), out, max_len=32, head_dim=16, dtype="float32")
    attn = import_package(out, "sas_test_cpu_pkg", monkeypatch)
    q = torch.randn(1, 1, 8, 16)
    kc, vc = attn.new_cache(1, 1, 16, torch.float32, "cpu")
    attn.fill_cache(q, q, kc, vc)                    # torch only: fine on the CPU either way
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="prefill: q is on cpu.*TRITON_INTERPRET=1"):
        attn.prefill(q, q, q)
    one = q[:, :, :1]
    with pytest.raises(ValueError, match="decode: q is on cpu.*TRITON_INTERPRET=1"):
        attn.decode(one, one, one, kc, vc, 8)


def test_compiled_package_carries_the_wide_schedule(tmp_path, monkeypatch):
    """Where the Gluon kernel's 128 x 128 tiles pay (a 1K window at 4K), plan.pt holds that
    schedule beside the default one and the report says so; its tiles clipped to a prompt, and
    the suffix queries' tiles at its block sizes, give the exact attention (the Triton kernel
    runs them here); the package takes them only where prefill.py's gluon_ok allows the tensors.
    Block-local (its 64-row tiles win) and caller-fixed tiles keep one schedule."""
    from sas.runtime import standalone

    window = Diag(0, 1024) * Causal()
    out = tmp_path / "wide_pkg"
    rep = compile_pattern(window, out, max_len=4096, head_dim=16, dtype="float32")
    sched = torch.load(out / "plan.pt", weights_only=True)
    assert (int(sched["prefill"]["block_m"]), int(sched["prefill"]["block_n"])) == (64, 64)
    assert (int(sched["prefill_wide"]["block_m"]), int(sched["prefill_wide"]["block_n"])) == (128, 128)
    assert sched["prefill_wide"]["num_warps"] == 8
    g = rep["prefill"]["gluon"]
    assert (g["block_m"], g["block_n"]) == (128, 128) and g["tiles"]["total"] == 32 * 32
    assert "128 x 128 tiles instead" in (out / "report.md").read_text()

    attn = import_package(out, "sas_test_wide_pkg", monkeypatch)
    kern = attn.kernel
    L, S = 300, 170
    g_ = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, L, 16, generator=g_).to(DEV) for _ in range(3))
    ref = reference_attention(window, q, k, v)
    for lq in (L, L - S):
        tiles = kern.tiles(lq, L, q.device, wide=True)
        o = kern.prefill_module.prefill(q[:, :, L - lq:], k, v, *tiles, block_m=128, block_n=128, num_warps=8,
                                        num_stages=3, use_gluon=False)
        r = ref[:, :, L - lq:]
        assert float((o.double().cpu() - r).norm() / r.norm()) < 1e-4, lq
    assert not kern.wide(q, k, v)                                   # float32: the default schedule
    calls = []
    monkeypatch.setattr(kern.prefill_module, "gluon_ok", lambda *a: calls.append(a[3:5]) or True)
    assert kern.wide(q, k, v) and calls == [(128, 128)]

    for name, kw in (("block_local", {}), ("fixed", {"prefill_options": PrefillOptions(64, 64, 4, 3)})):
        p = TABLE1_KERNELS["block_local"] if name == "block_local" else window
        rep = compile_pattern(p, tmp_path / name, max_len=4096, head_dim=16, dtype="float32", **kw)
        assert "gluon" not in rep["prefill"], name
        assert "prefill_wide" not in torch.load(tmp_path / name / "plan.pt", weights_only=True), name
    assert not standalone.StaticKernel(None, None, {"max_len": 4096, "prefill": {}}).wide(q, k, v)


@pytest.mark.skipif(DEV != "cuda" or torch.cuda.get_device_capability()[0] != 9,
                    reason="the Gluon kernel runs on compute capability 9.x GPUs only")
def test_compiled_package_takes_the_wide_schedule_on_hopper(tmp_path, monkeypatch):
    """On Hopper a compiled 1K window's prefill (bf16, head dim 128) takes the wide schedule and
    the Gluon kernel, exactly; SAS_GLUON=0 takes the default schedule, exactly too."""
    window = Diag(0, 1024) * Causal()
    out = tmp_path / "wide_gpu_pkg"
    compile_pattern(window, out, max_len=4096, head_dim=128, dtype="bfloat16")
    attn = import_package(out, "sas_test_wide_gpu_pkg", monkeypatch)
    g = torch.Generator(device=DEV).manual_seed(2)
    q, k, v = (torch.randn(1, 4, 2500, 128, generator=g, device=DEV, dtype=torch.bfloat16) for _ in range(3))
    ref = reference_attention(window, q, k, v)
    assert attn.kernel.wide(q, k, v)
    for env in (None, "0"):
        if env is not None:
            monkeypatch.setenv("SAS_GLUON", env)
            assert not attn.kernel.wide(q, k, v)
        for lq in (2500, 700):
            o = attn.prefill(q[:, :, 2500 - lq:], k, v)
            r = ref[:, :, 2500 - lq:]
            assert float((o.double().cpu() - r).norm() / r.norm()) < 1e-2, (env, lq)


def test_compiled_package_passes_the_query_group_to_the_split_rule(tmp_path, monkeypatch):
    """A package's decode asks its split rule with the query group (q heads // KV heads), and
    leaves the argument out for a decode module compiled before the rule had one."""
    out = tmp_path / "group_pkg"
    compile_pattern(Diag(0, 4) * Causal(), out, max_len=32, head_dim=16, dtype="float32")
    attn = import_package(out, "sas_test_group_pkg", monkeypatch)
    mod = attn.kernel.decode_module
    asked = []
    real = mod.num_splits_for

    def spy(*a, **kw):
        asked.append(kw.get("group"))
        return real(*a, **kw)
    monkeypatch.setattr(mod, "num_splits_for", spy)
    q, k = torch.randn(2, 4, 1, 16, device=DEV), torch.randn(2, 2, 1, 16, device=DEV)
    kc, vc = attn.new_cache(2, 2, 16, torch.float32, DEV)
    attn.decode(q, k, k, kc, vc, 8)
    monkeypatch.delattr(mod, "GROUP_ONE_WAVE_FROM")
    monkeypatch.setattr(mod, "num_splits_for", lambda *a, **kw: asked.append(sorted(kw)) or real(*a, **kw))
    attn.decode(q, k, k, kc, vc, 9)
    assert asked == [2, ["num_sms"]]
