"""`sas compile` output stands on its own: a static and a dynamic pattern are compiled, then
imported in a subprocess where sas is NOT importable (isolated interpreter, no site hooks, only
the site-packages folder that holds torch and triton on sys.path). The package's one-call entry
(prefill, new_cache / fill_cache / decode, or the dynamic prefill / decode) runs under
TRITON_INTERPRET=1 on tiny inputs, and its outputs are checked here against references built
from the oracle mask (and, for the dynamic pattern, the float64 H2O specification)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():  # must precede the first import of triton
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import triton  # noqa: E402

from sas import Causal, Diag, Dynamic, Rect, ops  # noqa: E402
from sas.codegen import compile_pattern  # noqa: E402
from sas.codegen.triton_backend import DecodeOptions, PrefillOptions  # noqa: E402
from sas.dynamic import dynamic_attention_reference  # noqa: E402

from helpers.attention import DEV  # noqa: E402

SITE = {str(Path(m.__file__).resolve().parents[1]) for m in (torch, triton)}

RUNNER = r'''
import importlib.util, json, sys
sys.path[:0] = json.loads(sys.argv[1])
try:
    import sas  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("sas is importable in the isolated interpreter: " + sas.__file__)
import torch
out_dir, io_path, kind = sys.argv[2], sys.argv[3], sys.argv[4]
spec = importlib.util.spec_from_file_location("compiled_attn", out_dir + "/__init__.py",
                                              submodule_search_locations=[out_dir])
attn = importlib.util.module_from_spec(spec)
sys.modules["compiled_attn"] = attn
spec.loader.exec_module(attn)
data = torch.load(io_path)
q, k, v, P = data["q"], data["k"], data["v"], data["P"]
N = q.shape[2]
res = {}
if kind == "static":
    res["prefill_full"] = attn.prefill(q, k, v)                                  # the max_len schedule
    res["prefill_prompt"] = attn.prefill(q[:, :, :P], k[:, :, :P], v[:, :, :P])  # a shorter prefix of it
    res["prefill_suffix"] = attn.prefill(q[:, :, P:], k, v)                      # suffix queries (build_tiles)
    kc, vc = attn.new_cache(q.shape[0], k.shape[1], q.shape[3], q.dtype, q.device)
    attn.fill_cache(k[:, :, :P], v[:, :, :P], kc, vc)
    steps = [attn.decode(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], kc, vc, t) for t in range(P, N)]
    res["decode"] = torch.cat(steps, dim=2)
else:
    outs = [attn.prefill(q[:, :, :P], k[:, :, :P], v[:, :, :P])]
    held = [attn.held_keys()]
    for t in range(P, N):
        outs.append(attn.decode(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]))
        held.append(attn.held_keys())
    res["out"] = torch.cat(outs, dim=2)
    res["held"] = json.dumps(held)
torch.save(res, io_path + ".out")
'''


def run_isolated(out_dir: Path, tmp_path: Path, kind: str, tensors: dict) -> dict:
    io_path = tmp_path / f"{kind}_io.pt"
    torch.save(tensors, io_path)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", str(tmp_path)),
           "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "0"),
           "TRITON_CACHE_DIR": str(tmp_path / "triton_cache")}
    # -I: no PYTHONPATH, no user site, no script folder; -S: no site-packages hooks (the editable
    # install of sas lives in a .pth file); sys.path gets only the folders holding torch and triton.
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", RUNNER, json.dumps(sorted(SITE)), str(out_dir),
                           str(io_path), kind], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(str(io_path) + ".out")


def masked_reference(mask, q, k, v):
    """float64 attention over `mask` (query rows = last rows of the mask); rows without a key: 0."""
    B, H, Lq, D = q.shape
    g = H // k.shape[1]
    kk = k.double().repeat_interleave(g, 1)
    vv = v.double().repeat_interleave(g, 1)
    s = (q.double() @ kk.transpose(-1, -2)) * D ** -0.5
    m = torch.from_numpy(mask)
    w = torch.softmax(s.masked_fill(~m, float("-inf")), -1).nan_to_num(0.0)
    return w @ vv


def qkv(B, Hq, Hkv, N, D, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, Hq, N, D, generator=g), torch.randn(B, Hkv, N, D, generator=g),
            torch.randn(B, Hkv, N, D, generator=g))


def close(got, want, tol=1e-4):
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the isolated run uses the CPU interpreter")
def test_static_output_runs_without_sas(tmp_path):
    # sinks + window: the cache keeps 12 of 40 keys; the schedule has full and partial tiles
    pattern = (Diag(0, 8) + Rect(cols=(0, 4))) * Causal()
    N, P = 40, 29
    out = tmp_path / "static_build"
    rep = compile_pattern(pattern, out, max_len=N, head_dim=16, dtype="float32", num_heads=2, num_kv_heads=1,
                          prefill_options=PrefillOptions(16, 16, 4, 1), decode_options=DecodeOptions(16, 4, 1))
    assert rep["cache_size"] == 12
    assert {"__init__.py", "plan.pt", "standalone.py", "prefill.py", "decode.py"} <= set(os.listdir(out))
    for name in ("__init__.py", "standalone.py", "checks.py", "prefill.py", "decode.py"):
        src = (out / name).read_text()
        assert "import sas" not in src and "from sas" not in src, name
    assert "attn.decode(q1, k1, v1, k_cache, v_cache, position)" in (out / "report.md").read_text()
    q, k, v = qkv(1, 2, 1, N, 16, seed=3)
    res = run_isolated(out, tmp_path, "static", {"q": q, "k": k, "v": v, "P": P})
    mask = pattern.to_mask(N)
    close(res["prefill_full"], masked_reference(mask, q, k, v))
    close(res["prefill_prompt"], masked_reference(mask[:P, :P], q[:, :, :P], k[:, :, :P], v[:, :, :P]))
    close(res["prefill_suffix"], masked_reference(mask[P:], q[:, :, P:], k, v))
    close(res["decode"], masked_reference(mask[P:], q[:, :, P:], k, v))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the isolated run uses the CPU interpreter")
def test_dynamic_output_runs_without_sas(tmp_path):
    # window + H2O (budget 3) on what the window leaves: evictions happen within 24 tokens
    dyn = Dynamic(budget=3, score=ops.attn_score().sum(dim=1))
    pattern = Diag(0, 4) + Diag(4, None) * dyn
    N, P = 24, 10
    out = tmp_path / "dynamic_build"
    rep = compile_pattern(pattern, out, max_len=32, head_dim=16, dtype="float32", num_heads=2, num_kv_heads=1,
                          prefill_options=PrefillOptions(16, 16, 4, 1))
    assert rep["dynamic"] is True and rep["static_slots"] == 4
    assert {"__init__.py", "plan.pt", "standalone.py", "dynamic_host.py", "graph_params.py",
            "dynamic_decode.py"} <= set(os.listdir(out))
    for name in ("__init__.py", "standalone.py", "checks.py", "dynamic_host.py", "graph_params.py", "dynamic_decode.py",
                 "static_decode.py"):
        src = (out / name).read_text()
        assert "import sas" not in src and "from sas" not in src, name
    q, k, v = qkv(1, 2, 1, N, 16, seed=5)
    res = run_isolated(out, tmp_path, "dynamic", {"q": q, "k": k, "v": v, "P": P})
    # the prompt attends exactly the oracle mask
    close(res["out"][:, :, :P], masked_reference(pattern.to_mask(P), q[:, :, :P], k[:, :, :P], v[:, :, :P]))
    # every step against the float64 specification of the policy: outputs and held key sets
    ref = dynamic_attention_reference(pattern, q.double(), k.double(), v.double(), prefill_len=P)
    close(res["out"], ref.out)
    held = json.loads(res["held"])
    assert held == [[[list(t) for t in per_b] for per_b in step.held_sets()] for step in ref.steps]


def load_package(out: Path, name: str):
    """A compiled folder imported as package `name` in this process."""
    spec = importlib.util.spec_from_file_location(name, out / "__init__.py", submodule_search_locations=[str(out)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_compiled_package_checks_its_arguments_before_any_work(tmp_path):
    """A compiled package refuses inputs SASAttnKernel refuses (a batch or head count that does
    not match, a cache of another shape or dtype, a position that is not an integer), with a
    ValueError naming the argument and before any kernel runs: the caches are left as they were.
    (Found by a new-user exploration: a batch-2 decode over a batch-1 cache wrote out of bounds.)"""
    static = tmp_path / "static_build"
    compile_pattern(Diag(0, 4) * Causal(), static, max_len=16, head_dim=16, dtype="float32", num_heads=2,
                    num_kv_heads=1, prefill_options=PrefillOptions(16, 16, 4, 1),
                    decode_options=DecodeOptions(16, 4, 1))
    assert "from sas" not in (static / "checks.py").read_text()
    attn = load_package(static, "compiled_checks_static")
    on_dev = lambda ts: tuple(t.to(DEV) for t in ts)  # noqa: E731 (the interpreter's CPU, or the GPU)
    q, k, v = on_dev(qkv(1, 2, 1, 8, 16, seed=1))
    kc, vc = attn.new_cache(1, 1, 16, torch.float32, DEV)
    attn.fill_cache(k, v, kc, vc)
    before = (kc.clone(), vc.clone())
    one = lambda t: t[:, :, :1]  # noqa: E731
    bad_calls = [
        (lambda: attn.decode(one(q).repeat(2, 1, 1, 1), one(k).repeat(2, 1, 1, 1), one(v).repeat(2, 1, 1, 1),
                             kc, vc, 8), ("k_cache", "[2, 1, 4, 16]")),
        (lambda: attn.decode(one(q), one(k), one(v)[:, :, :, :8], kc, vc, 8), ("v", "head_dim 8")),
        (lambda: attn.decode(one(q)[:, :1].repeat(1, 3, 1, 1), one(k).repeat(1, 2, 1, 1), one(v).repeat(1, 2, 1, 1),
                             kc, vc, 8), ("3 heads", "multiple")),
        (lambda: attn.decode(one(q), one(k), one(v), kc.half(), vc, 8), ("k_cache", "float16")),
        (lambda: attn.decode(one(q), one(k), one(v), kc, vc, 8.0), ("position", "8.0")),
        (lambda: attn.decode(one(q), one(k), one(v), kc, vc, 16), ("position 16", "max_len=16", "--max-len")),
        (lambda: attn.decode(q, k, v, kc, vc, 8), ("one token",)),
        (lambda: attn.prefill(q, k, v[:, :, :6]), ("k and v", "same shape")),
        (lambda: attn.prefill(q[0], k[0], v[0]), ("q", "4-D")),
        (lambda: attn.prefill(q.clone().requires_grad_(), k, v), ("q requires grad", "torch.no_grad()")),
        (lambda: attn.decode(one(q), one(k).clone().requires_grad_(), one(v), kc, vc, 8), ("k requires grad",)),
        # fill_cache: before, a short v wrote k_cache and then failed (an IndexError), half-written
        (lambda: attn.fill_cache(k, v[:, :, :6], kc, vc), ("k and v", "same shape")),
        (lambda: attn.fill_cache(k.repeat(2, 1, 1, 1), v.repeat(2, 1, 1, 1), kc, vc), ("k_cache", "batch 1")),
        (lambda: attn.fill_cache(k.half(), v.half(), kc, vc), ("k_cache", "float32")),
        (lambda: attn.fill_cache(k[..., :8], v[..., :8], kc, vc), ("k_cache", "head_dim")),
        (lambda: attn.fill_cache(k, v, kc[:, :, :2], vc[:, :, :2]), ("k_cache", "[1, 1, 4, 16]")),
        (lambda: attn.fill_cache(*on_dev(qkv(1, 1, 1, 20, 16, 2)[1:]), kc, vc),
         ("prompt length 20", "max_len=16")),
        (lambda: attn.new_cache(1, 1, 16, torch.int32), ("dtype", "torch.int32")),
        (lambda: attn.new_cache(-1, 1, 16, torch.float32), ("batch", "positive")),
        (lambda: attn.new_cache(1, 1, 16, "float32"), ("dtype", "'float32'")),
        (lambda: attn.new_cache(1, 1, 16, torch.float32, "gpu7"), ("device", "'gpu7'")),
        # head dims the kernels are not built for (before: Triton's "arange's range must be a power of 2")
        (lambda: attn.prefill(*on_dev(qkv(1, 2, 1, 8, 24, seed=3))), ("head_dim 24", "16, 32, 64, 128")),
        (lambda: attn.prefill(*on_dev(qkv(1, 2, 1, 8, 256, seed=3))), ("head_dim 256",)),
        (lambda: attn.decode(*(one(t) for t in on_dev(qkv(1, 2, 1, 8, 24, seed=3))),
                             *attn.new_cache(1, 1, 16, torch.float32, DEV), 8), ("head_dim 24",)),
        (lambda: attn.new_cache(1, 1, 24, torch.float32), ("new_cache", "head_dim 24")),
    ]
    for call, words in bad_calls:
        with pytest.raises(ValueError) as e:
            call()
        assert all(w in str(e.value) for w in words), (words, str(e.value))
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])

    dyn = tmp_path / "dynamic_build"
    compile_pattern(Diag(0, 4) + Diag(4, None) * Dynamic(budget=3, score=ops.attn_score().sum(dim=1)), dyn,
                    max_len=16, head_dim=16, dtype="float32", num_heads=2, num_kv_heads=1)
    attn = load_package(dyn, "compiled_checks_dynamic")
    attn.prefill(q, k, v)
    held = attn.held_keys()
    q1, k1, v1 = one(q), one(k), one(v)
    for call, words in [(lambda: attn.decode(q1.repeat(2, 1, 1, 1), k1.repeat(2, 1, 1, 1), v1.repeat(2, 1, 1, 1)),
                         ("prompt's batch", "(1, 2, 1, 16)", "(2, 2, 1, 16)")),
                        (lambda: attn.decode(q1.double(), k1.double(), v1.double()), ("q", "float64")),
                        (lambda: attn.decode(q1, k1[:, :, :, :8], v1), ("k", "head_dim 8")),
                        (lambda: attn.decode(*(one(t) for t in on_dev(qkv(1, 2, 1, 8, 24, seed=3)))), ("head_dim 24",)),
                        (lambda: attn.decode(q1.clone().requires_grad_(), k1, v1),
                         ("q requires grad", "no differentiable backend"))]:
        with pytest.raises(ValueError) as e:
            call()
        assert all(w in str(e.value) for w in words), (words, str(e.value))
    assert attn.held_keys() == held and attn.kernel.runtime.length == 8     # nothing ran
    out = attn.decode(q1, k1, v1)          # the runtime is still usable, at position 8
    assert out.shape == q1.shape and torch.isfinite(out).all() and attn.kernel.runtime.length == 9


def test_compiled_package_head_dims_are_the_backends():
    """The package's head-dim check (standalone.py has no sas to import) names the head dims the
    Triton backend builds its kernels for."""
    from sas.codegen.triton_backend import SUPPORTED_HEAD_DIMS
    from sas.runtime import standalone

    assert standalone.SUPPORTED_HEAD_DIMS == SUPPORTED_HEAD_DIMS
