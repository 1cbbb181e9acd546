"""Readable synthesized functions (sas.analysis.simplify): simplified with sympy, checked
equal to the functions as synthesized, and decoding exactly the oracle's keys."""

from __future__ import annotations

import ast

import numpy as np
import sympy
import pytest
from analysis_checks import decode_with_functions
from helpers.examples import TABLE1_NAMES, example_pattern
from helpers.table1 import TABLE1_ANALYSIS
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from strategies import causal_patterns

import sas.analysis.simplify as simplify
from sas import Causal, Diag, Rect, analyze
from sas.analysis.functions import compile_functions


def _function_source(source: str, name: str) -> str:
    mod = ast.parse(source)
    return next(ast.unparse(f) for f in mod.body if isinstance(f, ast.FunctionDef) and f.name == name)


def _exhaustive_equal(a, n: int) -> None:
    """The readable functions equal the synthesized ones on every slot and token (Python ints)."""
    fa, fb = compile_functions(a.functions), compile_functions(a.readable.module)
    for j in range(-2, n + 2):
        assert fa["cache_id_func"](j) == fb["cache_id_func"](j), j
    for s in range(-1, a.cache_size + 1):
        for i in range(-1, n + 1):
            assert fa["slot_key_func"](s, i) == fb["slot_key_func"](s, i), (s, i)
            assert bool(fa["mask_func"](s, i)) == bool(fb["mask_func"](s, i)), (s, i)


def test_streaming_llm_mask_tests_each_condition_once() -> None:
    a = analyze((Diag(0, 1024) + Rect(cols=(0, 32))) * Causal(), 16384)
    r = a.readable
    assert r.simplified, r.note
    mask = _function_source(r.source, "mask_func")
    assert mask.splitlines()[-1].strip() == "return key >= 0 and (token_id - key < 1024 or key < 32)"
    assert _function_source(a.source, "mask_func").count("token_id - key >= 0") == 2   # the redundancy removed
    cid = _function_source(r.source, "cache_id_func")
    assert ("(token_id if token_id < 32 else 32 + (token_id - 32) % 1024) if 0 <= token_id < 16384 else -1"
            in cid)


@pytest.mark.parametrize("name", TABLE1_NAMES)
def test_table1_readable_functions_check_out_and_are_shorter(name: str) -> None:
    a = analyze(example_pattern(name), 16384)
    r = a.readable
    assert r.simplified, r.note
    assert len(r.source) < len(a.source)
    assert "equal to the synthesized functions" in r.note


@pytest.mark.parametrize("name", TABLE1_NAMES)
def test_table1_small_readable_functions_decode_the_mask(name: str) -> None:
    p = TABLE1_ANALYSIS[name]
    n = 120
    a = analyze(p, n)
    assert a.readable.simplified, a.readable.note
    _exhaustive_equal(a, n)
    f = compile_functions(a.readable.module)
    decode_with_functions(a, p.to_mask(n), f["cache_id_func"], f["slot_key_func"], f["mask_func"])


@settings(max_examples=25, deadline=None)
@given(causal_patterns(max_depth=4), st.integers(1, 48))
def test_random_readable_functions_equal_and_decode_the_mask(p, n: int) -> None:
    mask = p.to_mask(n)
    assume(mask.any())                       # an empty pattern has no functions
    a = analyze(p, n)
    r = a.readable
    if not a.closed_form:
        assert not r.simplified and r.source == a.source
        return
    assert r.simplified, r.note
    _exhaustive_equal(a, n)
    f = compile_functions(r.module)
    decode_with_functions(a, mask, f["cache_id_func"], f["slot_key_func"], f["mask_func"])


def test_a_wrong_simplification_is_caught_and_not_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    original = simplify.simplify_module

    def broken(mod: ast.Module) -> ast.Module:
        out = original(mod)
        for node in ast.walk(out):
            if isinstance(node, ast.Constant) and node.value == 1024:
                node.value = 1023
        return out

    monkeypatch.setattr(simplify, "simplify_module", broken)
    a = analyze((Diag(0, 1024) + Rect(cols=(0, 32))) * Causal(), 8192)
    r = a.readable
    assert not r.simplified and r.source == a.source
    assert "did not check out" in r.note and "differs" in r.note


def test_check_rows_cover_boundary_periods_and_the_end() -> None:
    rows = simplify.check_rows(max_len=100_000, cache_size=64, boundary=32, period=8)
    assert rows[0] == -1 and {0, 31, 32, 100, 99_999, 100_000} <= set(rows.tolist())
    big = simplify.check_rows(max_len=1 << 20, cache_size=1 << 15, boundary=0, period=1 << 14)
    assert len(big) * ((1 << 15) + 2) <= 2 * simplify.MAX_CHECK_POINTS and big[-1] == 1 << 20
    assert np.all(np.diff(big) > 0)


_BASE = """
def cache_id_func(token_id):
    return token_id % 10
def slot_key_func(cache_id, token_id):
    return cache_id
def mask_func(cache_id, token_id):
    return cache_id <= token_id{extra}
"""


@pytest.mark.parametrize("block", [1, 8, 64, 1 << 20])
@pytest.mark.parametrize("slot,row", [(-1, 0), (0, 3), (7, 12), (10, 19)])
def test_check_equal_in_blocks_finds_one_differing_point(monkeypatch: pytest.MonkeyPatch, block: int,
                                                          slot: int, row: int) -> None:
    """The grid is evaluated in blocks of slots: a single differing point is found in any block,
    and named by its index in the whole grid (slot -1 is index 0)."""
    monkeypatch.setattr(simplify, "CHECK_BLOCK_POINTS", block)
    rows = np.arange(0, 20, dtype=np.int64)
    same = ast.parse(_BASE.format(extra=""))
    other = ast.parse(_BASE.format(extra=f" and not (cache_id == {slot} and token_id == {row})"))
    assert simplify.check_equal(same, ast.parse(_BASE.format(extra="")), rows, 10) is None
    diff = simplify.check_equal(same, other, rows, 10)
    assert diff == f"mask_func differs at index ({slot + 1}, {row}): True vs False"


def test_check_grid_is_bounded_at_any_cache_size() -> None:
    """The readable functions' check compares a bounded grid, built without anything as long as
    the cache or the sequence (a new user's `sas inspect` of a 64M-token causal pattern took 60 s
    and 2.7 GB; `sas compile` of one of 1G tokens was killed at 24 GB)."""
    n = 1 << 40
    slots = simplify.check_slots(n)
    assert len(slots) <= simplify.MAX_CHECK_SLOTS and slots[0] == -1 and slots[-1] == n
    assert np.all(np.diff(slots) > 0) and {0, 1, n - 1} <= set(slots.tolist())
    assert np.array_equal(simplify.check_slots(10), np.arange(-1, 11))
    rows = simplify.check_rows(max_len=n, cache_size=n, boundary=0, period=1)
    assert len(rows) * len(slots) <= 2 * simplify.MAX_CHECK_POINTS and rows[0] == -1 and rows[-1] == n
    assert np.all(np.diff(rows) > 0)
    a = analyze(Causal() * ~Diag(0, 8), n)
    r = a.readable
    assert r.simplified and f"of the {a.cache_size} slots" in r.note, r.note


def test_ring_arithmetic_is_collected() -> None:
    """A ring's key unranking prints as `token_id - (token_id - cache_id) % C`: the count of
    stored keys (`cnt = token_id + 1`) substituted, the sum collected and the multiple of the
    modulus dropped (a new user read `cnt - 1 - (cnt - 1 - cache_id + 1024) % 1024`)."""
    a = analyze(Diag(0, 1024), 16384)
    r = a.readable
    assert r.simplified, r.note
    assert "rho = token_id - (token_id - cache_id) % 1024" in _function_source(r.source, "slot_key_func")
    assert "cnt" not in r.source and "cnt" in a.source
    mod = ast.parse("def slot_key_func(cache_id, token_id):\n    c = token_id + 3\n"
                    "    return (c - 1 - cache_id + 2048) % 1024 + (token_id - 1) % 8 + 2 * c - c\n")
    out = ast.unparse(simplify.simplify_module(mod))
    assert "return token_id + (token_id - cache_id + 2) % 1024 + (token_id - 1) % 8 + 3" in out, out


def test_bounds_of_one_linear_form_are_merged() -> None:
    """The comparisons of one integer linear form keep their tightest bounds, and meet in an
    equality: a chunk prints `token_id // 8192 == key // 8192` (was `token_id // 8192 - key // 8192
    < 1 and token_id // 8192 >= key // 8192`), and a window's lower bound below causality goes."""
    chunk = analyze((Rect(size=(8192, 8192)) >> Diag(0, 1)) * Causal(), 1 << 20).readable
    assert chunk.simplified, chunk.note
    assert "token_id // 8192 == key // 8192" in _function_source(chunk.source, "mask_func")
    window = analyze(Diag(-3, 10) * Causal(), 4096).readable
    assert window.simplified, window.note
    last = _function_source(window.source, "mask_func").splitlines()[-1].strip()
    assert last == "return token_id - key < 7 and token_id >= key and (key >= 0)", last
    f = simplify._merge_bounds(simplify._Translator().boolean(ast.parse("x - y >= 2 and x - y < 2", mode="eval").body))
    assert f is sympy.false


@pytest.mark.parametrize("body", [
    "key = cache_id\n    cache_id = 0\n    return key == token_id",
    "cnt = token_id - 1\n    key = cnt\n    cnt = 5\n    return key >= 0 and cnt > 0",
    "cnt = token_id + 1\n    cnt += 1\n    return cnt > 2",
    "return token_id / 2 > 3 and token_id / 2 < 4",
    "return token_id + 0.5 > 3 and token_id + 0.5 < 4",
])
def test_simplified_functions_keep_their_values(body: str) -> None:
    """The arithmetic pass substitutes only names nothing binds again (a review's repros: a value
    read from a parameter assigned later, a name reassigned, an augmented assignment), and the
    bounds merge takes `x < c` for `x <= c - 1` only over integers (`token_id / 2` is not)."""
    mod = ast.parse(f"def mask_func(cache_id, token_id):\n    {body}\n")
    fa = simplify._compile(mod)["mask_func"]
    fb = simplify._compile(simplify.simplify_module(mod))["mask_func"]
    assert [fa(s, t) for s in range(-2, 4) for t in range(-3, 12)] == \
           [fb(s, t) for s in range(-2, 4) for t in range(-3, 12)]


def test_breakpoints_catch_an_off_by_one_between_samples() -> None:
    """A cache of more slots than MAX_CHECK_SLOTS is checked on a sample of its slots; the
    functions' breakpoints (constants +- 1) are added to it, so an off-by-one at a breakpoint in
    the middle of the cache, between two samples, is still found (a review's repro)."""
    src = "def mask_func(cache_id, token_id):\n    return cache_id < {c} and token_id >= 0\n" \
          "def slot_key_func(cache_id, token_id):\n    return cache_id\n" \
          "def cache_id_func(token_id):\n    return token_id\n"
    a, b = ast.parse(src.format(c=100000)), ast.parse(src.format(c=100001))
    rows = np.arange(0, 4)
    sampled = simplify.check_slots(200000)
    assert 100000 not in set(sampled.tolist())
    assert simplify.check_equal(a, b, rows, 200000, sampled) is None        # missed between samples
    slots = np.union1d(sampled, simplify.breakpoints(a, b))
    assert simplify.check_equal(a, b, rows, 200000, slots) is not None
