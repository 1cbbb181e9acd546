"""The NKI (Trainium) backend: generated kernels parse, use only the documented API surface
(sas.codegen.nki_api) and, run in the numpy emulator of that subset, match attention and
importance scores computed from the exact mask `pattern.to_mask(n)`; the emulator and the API
check refuse invalid kernels; `sas compile --backend nki` writes the files or nothing."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, assume, given, settings

from sas import Causal, Diag, Rect
from sas.codegen.compile import compile_pattern
from sas.codegen.nki_api import FUNCTIONS, check_kernel_source
from sas.codegen.nki_backend import kernel_names, render_nki
from sas.codegen.nki_emulator import NkiEmulationError, load_kernel_module, reference_attention
from sas.errors import KernelError, SASError

from helpers.table1 import TABLE1_KERNELS
from strategies import patterns


def _run(pattern, L: int, D: int, H: int, Hkv: int, block: int, *, dtype: str = "float32", seed: int = 0,
         source: str | None = None):
    """Render (or take) the module, emulate both kernels, return (out, ref, score, ref_score)."""
    src = source if source is not None else render_nki(pattern, L, D, H // Hkv, block_m=block, block_n=block)
    ns = load_kernel_module(src)
    att, sc = kernel_names(src)
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, H, L, D)).astype(np.float32)
    k = rng.standard_normal((1, Hkv, L, D)).astype(np.float32)
    v = rng.standard_normal((1, Hkv, L, D)).astype(np.float32)
    qT = np.ascontiguousarray(q.transpose(0, 1, 3, 2))
    kT = np.ascontiguousarray(k.transpose(0, 1, 3, 2))
    if dtype == "bfloat16":
        out, m, l = ns[att][1, H]((qT, "bfloat16"), (kT, "bfloat16"), (v, "bfloat16"))
    else:
        out, m, l = ns[att][1, H](qT, kT, v)
    score = ns[sc][1, Hkv](qT, kT, m, l)
    ref, p = reference_attention(q, k, v, pattern.to_mask(L))
    ref_score = p.reshape(1, Hkv, H // Hkv, L, L).sum(axis=(2, 3))
    return out, ref, score[..., 0], ref_score


@pytest.mark.parametrize("name", sorted(TABLE1_KERNELS))
def test_table1_matches_exact_mask(name):
    pattern = TABLE1_KERNELS[name]
    out, ref, score, ref_score = _run(pattern, 128, 32, 2, 1, 32)   # GQA: 2 query heads per KV head
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=0)
    np.testing.assert_allclose(score, ref_score, atol=2e-5, rtol=1e-5)


def test_bfloat16_and_wider_tiles():
    pattern = TABLE1_KERNELS["openai_fixed"]
    out, ref, score, ref_score = _run(pattern, 128, 64, 1, 1, 64, dtype="bfloat16")
    assert np.abs(out - ref).max() < 0.05          # bf16 q, k, v, p and output
    assert np.abs(score - ref_score).max() < 0.05 * max(1.0, ref_score.max())


def test_empty_rows_and_non_causal():
    # rows 0..15 attend nothing (output 0); the window looks ahead (non-causal, prefill only)
    pattern = Rect(rows=(16, None)) * (Diag(-8, 20) + Rect(cols=(60, 64)))
    out, ref, score, ref_score = _run(pattern, 64, 16, 1, 1, 16)
    assert not pattern.to_mask(64)[:16].any() and np.all(out[0, 0, :16] == 0)
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=0)
    np.testing.assert_allclose(score, ref_score, atol=2e-5, rtol=1e-5)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(patterns(3))
def test_random_compositions_match_exact_mask(pattern):
    assume(not pattern.dynamics())
    src = render_nki(pattern, 64, 16, 1, block_m=16, block_n=16)     # every drawn form lowers (no refusal hidden)
    out, ref, score, ref_score = _run(pattern, 64, 16, 1, 1, 16, source=src)
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=0)
    np.testing.assert_allclose(score, ref_score, atol=2e-5, rtol=1e-5)


def test_generated_kernel_uses_only_documented_api():
    src = render_nki(TABLE1_KERNELS["strided_block_local"], 128, 32, 1, block_m=32, block_n=32)
    used = set(re.findall(r"\b(nl|nisa|nki)\.([a-z_0-9]+)\(", src))
    prefix = {"nl": "nki.language", "nisa": "nki.isa", "nki": "nki"}
    assert used and all(f"{prefix[a]}.{f}" in FUNCTIONS for a, f in used)
    assert all(FUNCTIONS[q].url.startswith("https://awsdocs-neuron.readthedocs-hosted.com/") for q in FUNCTIONS)
    assert "nl.mod(" in src   # the stride is lowered to index arithmetic on iota tiles


# --- the emulator and the API check refuse invalid kernels ---------------------------------------

_HEAD = "import neuronxcc.nki as nki\nimport neuronxcc.nki.language as nl\nimport neuronxcc.nki.isa as nisa\n\n"


def _kernel(body: str) -> str:
    lines = "\n".join("    " + ln for ln in body.strip().splitlines())
    return _HEAD + "@nki.jit\ndef kern(a):\n" + lines + "\n"


def _emulate(body: str, shape=(128, 64)):
    ns = load_kernel_module(_kernel(body))
    return ns["kern"](np.ones(shape, dtype=np.float32))


@pytest.mark.parametrize("body, message", [
    ("t = nl.zeros((256, 4), dtype=nl.float32)\nreturn a", "exceeds nl.tile_size.pmax"),
    ("t = nl.zeros((128, 1024), dtype=nl.float32, buffer=nl.psum)\nreturn a", "PSUM tile"),
    ("x = nl.load(a)\nps = nisa.nc_matmul(x, x)\ny = nisa.nc_matmul(ps, x)\nreturn a", "Tensor Engine reads SBUF"),
    ("x = nl.zeros((64, 256), dtype=nl.float32)\ny = nisa.nc_matmul(x, x)\nreturn a", "stationary free size"),
    ("x = nl.zeros((64, 16), dtype=nl.float32)\ny = nl.zeros((32, 16), dtype=nl.float32)\n"
     "z = nisa.nc_matmul(x, y)\nreturn a", "contraction"),
    ("x = nl.zeros((64, 16), dtype=nl.float32)\ny = nl.zeros((64, 1024), dtype=nl.float32)\n"
     "z = nisa.nc_matmul(x, y)\nreturn a", "moving free size"),
    ("x = nl.load(a)\ns = nl.sum(x, axis=0, keepdims=True)\nreturn a", "partition axis"),
    ("x = nl.load(a)\ns = nl.sum(x, axis=1)\nreturn a", "keepdims"),
    ("acc = nl.zeros((128, 64), dtype=nl.float32)\nfor i in nl.affine_range(3):\n"
     "    acc[...] = nl.add(acc, 1.0)\nreturn a", "loop-carried dependency"),
    ("RUNS = (1, 2, 3)\nfor i in nl.sequential_range(0, 3, 1):\n    n = RUNS[i]\nreturn a", "symbolic"),
    ("x = nl.load(a)\nt = nisa.nc_transpose(nisa.nc_transpose(x))\nreturn a", "reads an SBUF tile"),
    ("p = nl.arange(8)[:, None]\nt = nisa.iota(p * p, dtype=nl.int32)\nreturn a", "not affine"),
    ("x = nl.load(a)\nnl.store(a[0:64, :], x)\nreturn a", "nl.store of a tile of shape"),
])
def test_emulator_refuses(body, message):
    with pytest.raises(NkiEmulationError, match=message):
        _emulate(body)


def test_emulator_allows_psum_accumulation_across_affine_iterations():
    body = ("ones = nl.full((128, 1), 1.0, dtype=nl.float32, buffer=nl.sbuf)\n"
            "col = nl.zeros((64, 1), dtype=nl.float32, buffer=nl.psum)\n"
            "out = nl.ndarray((64, 1), dtype=nl.float32, buffer=nl.shared_hbm)\n"
            "for i in nl.affine_range(3):\n"
            "    x = nl.load(a)\n"
            "    col[...] += nisa.nc_matmul(x, ones)\n"
            "nl.store(out, nl.copy(col))\nreturn out")
    np.testing.assert_allclose(_emulate(body), np.full((64, 1), 3 * 128.0))


def test_rendered_kernel_edited_to_256_row_tiles_is_refused():
    src = render_nki(Causal(), 256, 32, 1, block_m=128, block_n=128)
    bad = src.replace("BLOCK_M = 128", "BLOCK_M = 256").replace("NUM_Q_BLOCKS = 2", "NUM_Q_BLOCKS = 1")
    assert bad != src
    with pytest.raises(NkiEmulationError, match="stationary free size 256|pmax"):
        _run(Causal(), 256, 32, 1, 1, 128, source=bad)


@pytest.mark.parametrize("src, message", [
    (_kernel("return nl.softmax(a)"), "not a documented function|not in the documented"),
    (_kernel("x = nl.load(a)\nreturn nl.exp(x, approx=True)"), "keyword 'approx' is not documented"),
    (_kernel("return nl.exp()"), "missing required"),
    (_HEAD + "import numpy as np\n" + _kernel("return a")[len(_HEAD):], "not allowed"),
    (_kernel("m = nl.load(a)\nfor i in nl.sequential_range(0, 2, 1):\n    m = nl.maximum(m, 1.0)\nreturn a"),
     "carried between iterations"),
    (_kernel("for i in nl.affine_range(2):\n    if i > 0:\n        x = nl.load(a)\nreturn a"), "'if' on the index"),
    (_kernel("for i in range(2):\n    x = nl.load(a)\nreturn a"), "loops must iterate|calls .range."),
    (_kernel("return nl.tile_size.pmax"), "not in the documented"),
    (_HEAD + "def kern(a):\n    return a\n", "defines no @nki.jit kernel"),
    (_HEAD + "import bisect\n" + _kernel("return bisect.bisect(a, 1)")[len(_HEAD):], "host module 'bisect'"),
    (_kernel("return helper(a)"), "calls 'helper'"),
    ("def broken(:\n", "not valid Python"),
])
def test_api_check_refuses(src, message):
    with pytest.raises(KernelError, match=message):
        check_kernel_source(src)


# --- sas compile --backend nki --------------------------------------------------------------------


def test_compile_writes_kernels_that_run(tmp_path):
    pattern = TABLE1_KERNELS["streaming_llm"]
    out_dir = tmp_path / "nki"
    report = compile_pattern(pattern, out_dir, backend="nki", max_len=128, head_dim=32, dtype="float32",
                             num_heads=2, num_kv_heads=1)
    assert sorted(p.name for p in out_dir.iterdir()) == ["README.md", "nki_decode.py", "nki_kernels.py",
                                                         "report.json"]
    assert sorted(report["files"]) == sorted(p.name for p in out_dir.iterdir())
    assert report["kernels"]["decode"] in (out_dir / "nki_decode.py").read_text()
    check_kernel_source((out_dir / "nki_decode.py").read_text())
    assert json.loads((out_dir / "report.json").read_text())["backend"] == "nki" == report["backend"]
    readme = (out_dir / "README.md").read_text()
    assert "not compiled, not run on hardware" in readme and report["kernels"]["attention"] in readme
    out, ref, score, ref_score = _run(pattern, 128, 32, 2, 1, 128, source=(out_dir / "nki_kernels.py").read_text())
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=0)
    np.testing.assert_allclose(score, ref_score, atol=2e-5, rtol=1e-5)
    # compiling again over sas's own output replaces it
    compile_pattern(pattern, out_dir, backend="nki", max_len=256, head_dim=32)
    assert "SEQ_LEN = 256" in (out_dir / "nki_kernels.py").read_text()


@pytest.mark.parametrize("kwargs, message", [
    (dict(backend="neuron"), "unknown backend"),
    (dict(backend="nki", head_dim=256), "head_dim 256"),
    (dict(backend="nki", max_len=1000), "multiple of 16"),
])
def test_compile_bad_input_leaves_nothing(tmp_path, kwargs, message):
    kwargs = {"max_len": 256, **kwargs}
    with pytest.raises(SASError, match=message):
        compile_pattern(Diag(0, 16), tmp_path / "out", **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_failed_compile_keeps_the_previous_output(tmp_path):
    out_dir = tmp_path / "nki"
    compile_pattern(Diag(0, 16), out_dir, backend="nki", max_len=256, head_dim=32)
    before = {p.name: p.read_bytes() for p in out_dir.iterdir()}
    with pytest.raises(KernelError, match="multiple of 16"):
        compile_pattern(Diag(0, 16), out_dir, backend="nki", max_len=1000, head_dim=32)
    assert {p.name: p.read_bytes() for p in out_dir.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nki"]


def test_non_causal_and_dynamic_patterns_say_what_is_missing(tmp_path):
    from sas import Dynamic, ops
    r = compile_pattern(Diag(-4, 12), tmp_path / "a", backend="nki", max_len=64, head_dim=16)
    assert "decode" not in r["kernels"] and any("not causal" in n for n in r["notes"])
    dyn = Diag(0, 8) + Diag(8, 24) * Dynamic(budget=4, score=ops.attn_score().sum(dim=1))
    r = compile_pattern(dyn, tmp_path / "b", backend="nki", max_len=64, head_dim=16)
    static_form = Diag(0, 8) + Diag(8, 24)
    assert r["kernel_pattern"] == repr(static_form) and "Dynamic" in r["pattern"]
    assert any("selection" in n for n in r["notes"]) and "decode" not in r["kernels"]
    # the kernels of the static form, with H2O's accumulated scores, run against its exact mask
    out, ref, score, ref_score = _run(static_form, 64, 16, 1, 1, 64,
                                      source=(tmp_path / "b" / "nki_kernels.py").read_text())
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=0)
    np.testing.assert_allclose(score, ref_score, atol=2e-5, rtol=1e-5)


def test_render_refuses_bad_tiles_and_lengths():
    with pytest.raises(KernelError, match="block_m must be one of"):
        render_nki(Causal(), 256, 32, 1, block_m=256, block_n=128)
    with pytest.raises(KernelError, match="must divide"):
        render_nki(Causal(), 96, 32, 1, block_m=64, block_n=32)
    with pytest.raises(KernelError, match="float32"):
        render_nki(Causal(), 1 << 24, 32, 1)


def test_cli_compile_nki(tmp_path):
    from sas.cli.main import cli
    out = tmp_path / "k"
    r = CliRunner().invoke(cli, ["compile", "examples/sliding_window.py", "--backend", "nki", "-o", str(out),
                                 "--max-len", "512"])
    assert r.exit_code == 0, r.output
    check_kernel_source((out / "nki_kernels.py").read_text())


# --- decode over the compact cache ---------------------------------------------------------------


def _decode_check(pattern, L: int, D: int, H: int, Hkv: int, positions, seed: int = 1):
    from sas import analyze
    from sas.codegen.nki_backend import render_nki_decode
    a = analyze(pattern, L)
    G = H // Hkv
    src = render_nki_decode(a, D, G)
    ns = load_kernel_module(src)
    name = next(k for k in ns if k.startswith("sas_nki_decode_"))
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, H, L, D)).astype(np.float32)
    k = rng.standard_normal((1, Hkv, L, D)).astype(np.float32)
    v = rng.standard_normal((1, Hkv, L, D)).astype(np.float32)
    ref, _ = reference_attention(q, k, v, pattern.to_mask(L))
    P = ns["PADDED_SLOTS"]
    assert ns["CACHE_SIZE"] == a.cache_size <= P
    # slots start with garbage (finite): only what mask_func admits may reach the output
    kc = rng.standard_normal((1, Hkv, D, P)).astype(np.float32)
    vc = rng.standard_normal((1, Hkv, P, D)).astype(np.float32)
    held = "slot_keys" in src.split(f"def {name}(")[1].split(")")[0]
    slot_keys = np.full((1, P), -1, dtype=np.int32)
    t = 0
    for p in positions:
        for t in range(t, p + 1):
            s = ns["cache_id_func"](t)
            if s >= 0:
                kc[:, :, :, s] = k[:, :, t]
                vc[:, :, s] = v[:, :, t]
                slot_keys[0, s] = t
        t = p + 1
        q1 = np.ascontiguousarray(q[:, :, p].reshape(1, Hkv, G, D).transpose(0, 1, 3, 2))
        args = (q1, kc, vc, np.array([[p]], dtype=np.int32)) + ((slot_keys,) if held else ())
        out = ns[name][1, Hkv](*args)
        np.testing.assert_allclose(out.reshape(1, H, D), ref[:, :, p], atol=2e-5, rtol=0,
                                   err_msg=f"position {p}")


@pytest.mark.parametrize("name", sorted(TABLE1_KERNELS))
def test_decode_table1_matches_exact_mask(name):
    _decode_check(TABLE1_KERNELS[name], 192, 16, 2, 1, [0, 5, 31, 32, 33, 63, 64, 100, 127, 128, 160, 191])


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(patterns(3))
def test_decode_random_causal_compositions(pattern):
    from sas import analyze
    assume(not pattern.dynamics())
    pattern = pattern * Causal()
    assume(pattern.to_mask(48).any())       # an empty pattern has nothing to decode (analyze refuses it)
    analyze(pattern, 48)
    _decode_check(pattern, 48, 16, 1, 1, [0, 7, 16, 30, 47])


def test_decode_with_table_cache_functions_uses_held_keys():
    # no closed form: mask_func is a table search, so the kernel takes the key each slot holds
    pattern = Diag(offset=-2, size=None, stride=3) * Causal()
    from sas import analyze
    from sas.codegen.nki_backend import render_nki_decode
    a = analyze(pattern, 48)
    assert a.tables
    src = render_nki_decode(a, 16, 2)
    assert "slot_keys" in src and "import bisect" in src
    _decode_check(pattern, 48, 16, 2, 1, range(48))


# --- the expression lowering, against Python's own evaluation --------------------------------------

import ast as _ast  # noqa: E402

from hypothesis import strategies as st  # noqa: E402

from sas.codegen.lower_nki import NkiLowering  # noqa: E402

_INT_LEAVES = st.one_of(st.sampled_from(["i", "j"]).map(lambda n: _ast.Name(n, _ast.Load())),
                        st.integers(-6, 9).map(lambda v: _ast.Constant(v)))


def _exprs():
    def ints(children):
        return st.one_of(
            st.tuples(children, st.sampled_from([_ast.Add(), _ast.Sub(), _ast.Mult()]), children)
            .map(lambda t: _ast.BinOp(t[0], t[1], t[2])),
            st.tuples(children, st.sampled_from([_ast.FloorDiv(), _ast.Mod()]), st.integers(1, 5))
            .map(lambda t: _ast.BinOp(t[0], t[1], _ast.Constant(t[2]))),
            children.map(lambda c: _ast.UnaryOp(_ast.USub(), c)),
            st.tuples(bools(children), children, children).map(lambda t: _ast.IfExp(t[0], t[1], t[2])),
        )

    def bools(children):
        cmp = st.tuples(children, st.sampled_from([_ast.Lt(), _ast.LtE(), _ast.Gt(), _ast.GtE(), _ast.Eq(),
                                                    _ast.NotEq()]), children) \
            .map(lambda t: _ast.Compare(t[0], [t[1]], [t[2]]))
        return st.one_of(cmp, st.tuples(cmp, cmp).map(lambda t: _ast.BoolOp(_ast.And(), list(t))),
                         st.tuples(cmp, cmp).map(lambda t: _ast.BoolOp(_ast.Or(), list(t))),
                         cmp.map(lambda c: _ast.UnaryOp(_ast.Not(), c)))

    return st.recursive(_INT_LEAVES, ints, max_leaves=8).flatmap(lambda e: st.one_of(st.just(e), bools(st.just(e))))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_exprs())
def test_lowering_matches_python_semantics(node):
    node = _ast.fix_missing_locations(node)
    low = NkiLowering({"i": "qi", "j": "kj"})
    v = low.lower(node)
    code = compile(_ast.Expression(node), "<expr>", "eval")
    want = np.array([[int(eval(code, {"i": i, "j": j})) for j in range(-3, 13)] for i in range(-5, 11)])
    if v.is_const:      # folded to a constant: it must be the expression's value everywhere
        assert (want == int(eval(v.text))).all(), (_ast.unparse(node), v.text)
        return
    body = "\n    ".join(low.lines)
    src = (_HEAD + "@nki.jit\ndef kern(a):\n"
           "    out = nl.ndarray((16, 16), dtype=nl.int32, buffer=nl.shared_hbm)\n"
           "    i_p = nl.arange(16)[:, None]\n    i_f = nl.arange(16)[None, :]\n"
           "    qi = nisa.iota(i_p - 5 + 0 * i_f, dtype=nl.int32)\n"
           "    kj = nisa.iota(i_f - 3 + 0 * i_p, dtype=nl.int32)\n"
           f"    {body}\n"
           f"    nl.store(out, nl.multiply({v.text}, 1, dtype=nl.int32))\n    return out\n")
    got = load_kernel_module(src)["kern"](np.zeros((1, 1), np.float32))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", sorted(TABLE1_KERNELS))
def test_fill_cache_kernel_then_decode(name):
    """The NKI fill kernel (slot_key_func lowered, one-hot matmuls) leaves the cache the host's
    cache_id_func writes leave on every slot a query can attend, and decode from it matches."""
    from sas import analyze
    from sas.codegen.nki_backend import render_nki_decode
    pattern, L, D, H, Hkv = TABLE1_KERNELS[name], 192, 16, 2, 1
    a = analyze(pattern, L)
    ns = load_kernel_module(render_nki_decode(a, D, H // Hkv))
    fill = next(k for k in ns if k.startswith("sas_nki_fill_cache_"))
    dec = next(k for k in ns if k.startswith("sas_nki_decode_"))
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, H, L, D)).astype(np.float32)
    k = rng.standard_normal((1, Hkv, L, D)).astype(np.float32)
    v = rng.standard_normal((1, Hkv, L, D)).astype(np.float32)
    ref, _ = reference_attention(q, k, v, pattern.to_mask(L))
    for prompt in (1, 37, 100, 160):
        kc, vc = ns[fill][1, Hkv](k, v, np.array([[prompt - 1]], np.int32))
        for s in range(a.cache_size):
            t = a.slot_key_func(s, prompt - 1) if hasattr(a, "slot_key_func") else ns["slot_key_func"](s, prompt - 1)
            if t >= 0:
                np.testing.assert_array_equal(kc[0, :, :, s], k[0, :, t])
                np.testing.assert_array_equal(vc[0, :, s], v[0, :, t])
        # decode the next token: its key goes to cache_id_func(prompt) first (host side)
        p = prompt
        slot = ns["cache_id_func"](p)
        if slot >= 0:
            kc[:, :, :, slot], vc[:, :, slot] = k[:, :, p], v[:, :, p]
        q1 = np.ascontiguousarray(q[:, :, p].reshape(1, Hkv, H // Hkv, D).transpose(0, 1, 3, 2))
        out = ns[dec][1, Hkv](q1, kc, vc, np.array([[p]], np.int32))
        np.testing.assert_allclose(out.reshape(1, H, D), ref[:, :, p], atol=2e-5, rtol=0, err_msg=f"prompt {prompt}")


def test_compile_table_search_pattern_reports_held_keys(tmp_path):
    r = compile_pattern(Diag(offset=-2, size=None, stride=3) * Causal(), tmp_path / "t", backend="nki", max_len=48,
                        head_dim=16)
    assert r["decode_takes_slot_keys"] and "fill_cache" not in r["kernels"]
    assert any("slot_keys" in n for n in r["notes"])
    assert "slot_keys[0, slot] = t" in (tmp_path / "t" / "README.md").read_text()
    r = compile_pattern(TABLE1_KERNELS["openai_fixed"], tmp_path / "f", backend="nki", max_len=128, head_dim=16)
    assert not r["decode_takes_slot_keys"] and r["kernels"]["fill_cache"] in (tmp_path / "f" / "README.md").read_text()
