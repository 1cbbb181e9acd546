"""Bad input on the language / analysis / dynamic side: a table of inputs that must be refused
with a `SASError` naming the argument and what is valid, a table of edge cases that must give
the exact result, and property tests of huge parameters against an independent evaluation.

Policy checked here (issue 9): integer parameters are Python integers of any size and mean
exactly what they say; every computation first restricts a pattern to the length it works on
(`Pattern.restrict`), so nothing wraps around in int64 and no size larger than the sequence is
ever allocated. Lengths are positive and at most 2**61; what would allocate more than a fixed
limit (masks, tile maps, analysis windows, per-token schedules) is refused before allocating.
"""

from __future__ import annotations

import ast
import math
import re
from typing import Any, Callable

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sas import Causal, Diag, Dynamic, Pattern, Rect, analyze, ops
from sas.codegen.lower_triton import Lowering, lower_predicate
from sas.codegen.triton_backend import dynamic_decode_module
from sas.dynamic import plan_dynamic
from sas.dynamic.cache_plan import FusedScore, dynamic_cache_plan, float_literal
from sas.dynamic.h2o import dynamic_attention_reference, masked_attention
from sas.errors import AnalysisError, KernelError, ParseError, PatternError, SASError
from sas.ir.tiles import EMPTY, FULL, PARTIAL, classify_tiles, tile_map
from sas.lang.pattern import MAX_DEPTH, And, Not, Or, Spread
from sas.lang.text import load_sas

from analysis_checks import brute_cache_size, decode_with_functions

H2O = Diag(0, 4) * Causal() + Diag(4, None) * Causal() * Dynamic(budget=10**9)
H2O_REFRESH = Diag(0, 4) * Causal() + Diag(4, None) * Causal() * Dynamic(budget=10**9, refresh=True)


# --- an independent evaluation in Python integers -------------------------------------------

def cell(p: Pattern, i: int, j: int) -> bool:
    """M(i, j) from the definitions in docs/semantics.md, in arbitrary-precision ints."""
    if isinstance(p, Or):
        return any(cell(t, i, j) for t in p.terms)
    if isinstance(p, And):
        return all(cell(t, i, j) for t in p.terms)
    if isinstance(p, Not):
        return not cell(p.a, i, j)
    if isinstance(p, Spread):
        h, w = p.shape
        return cell(p.layout, i // h, j // w) and cell(p.unit, i % h, j % w)
    if isinstance(p, Rect):
        return all(_axis(x, rng, s, o) for x, rng, s, o in
                   ((i, p.rows, p.stride[0], p.offset[0]), (j, p.cols, p.stride[1], p.offset[1])))
    if isinstance(p, Diag):
        d = i - j - p.offset
        return d >= 0 and (p.size is None or d < p.size) and d % p.stride == 0
    if isinstance(p, Dynamic):
        return True
    raise AssertionError(f"no rule for {p!r}")


def _axis(x: int, rng, stride: int, offset: int) -> bool:
    lo, hi = rng
    return (lo is None or x >= lo) and (hi is None or x < hi) and (x - (lo or 0)) % stride == offset


def reference_mask(p: Pattern, n: int) -> np.ndarray:
    return np.array([[cell(p, i, j) for j in range(n)] for i in range(n)], dtype=bool)


def predicate_mask(p: Pattern, n: int) -> np.ndarray:
    """The mask the emitted predicate gives, evaluated by Python cell by cell."""
    code = compile(p.predicate_source(), "<predicate>", "eval")
    return np.array([[bool(eval(code, {}, {"i": i, "j": j})) for j in range(n)] for i in range(n)])


def sas_sum(terms: int) -> str:
    return "a = Diag(0, 4)\np = (" + " + ".join(["a"] * terms) + ") * Causal()"


def deep_pattern(depth: int) -> Pattern:
    """Alternating + and * nested `depth` levels deep, the primitive at the bottom one of them
    (sums and products do not flatten);
    causal, since every term is."""
    p: Pattern = Causal()
    while p.depth < depth:
        p = (p + Diag(0, 4)) if p.depth % 2 else (p * Diag(0, 8))
    return p


def region_most_candidates(plan, n: int) -> int:
    """Independent count: most keys alive in the region at query i, or entering at i + 1."""
    region = plan.region.to_mask(n)
    used = region.any(axis=0)
    first = np.where(used, region.argmax(axis=0), n)
    last = np.where(used, n - 1 - region[::-1].argmax(axis=0), -1)
    return max(int(((first - 1 <= i) & (i <= last)).sum()) for i in range(n))


# --- bad inputs: (what, call, error class, words the message must name) ----------------------

def _analysis():
    return analyze(Diag(0, 4) * Causal(), 64)


BAD: list[tuple[str, Callable[[], Any], type[SASError], tuple[str, ...]]] = [
    # lengths
    ("analyze max_len=0", lambda: analyze(Causal(), 0), AnalysisError, ("max_len", "positive integer")),
    ("analyze max_len=-1", lambda: analyze(Causal(), -1), AnalysisError, ("max_len", "positive integer")),
    ("analyze max_len=True", lambda: analyze(Causal(), True), AnalysisError, ("max_len", "True")),
    ("analyze max_len=8.0", lambda: analyze(Causal(), 8.0), AnalysisError, ("max_len", "8.0")),
    ("analyze max_len=None", lambda: analyze(Causal(), None), AnalysisError, ("max_len", "None")),
    ("analyze max_len=2**62", lambda: analyze(Causal(), 2**62), AnalysisError, ("max_len", "2**61")),
    ("analyze not a pattern", lambda: analyze("Causal()", 8), AnalysisError, ("pattern", "str")),
    ("to_mask n=0", lambda: Causal().to_mask(0), PatternError, ("to_mask", "positive")),
    ("to_mask n=2**17", lambda: Causal().to_mask(2**17), PatternError, ("to_mask", "131072", "65536")),
    ("restrict n=0", lambda: Causal().restrict(0), PatternError, ("restrict", "positive")),
    ("restrict n='2'", lambda: Causal().restrict("2"), PatternError, ("restrict", "'2'")),
    ("restrict n=2**62", lambda: Causal().restrict(2**62), PatternError, ("restrict", "2**61")),
    ("plan_dynamic max_len=-1", lambda: plan_dynamic(H2O, max_len=-1), PatternError, ("max_len", "positive")),
    ("plan_dynamic max_len=0", lambda: plan_dynamic(H2O, max_len=0), PatternError, ("max_len", "positive")),
    ("plan_dynamic max_len=True", lambda: plan_dynamic(H2O, max_len=True), PatternError, ("max_len", "True")),
    ("plan_dynamic max_len=1.5", lambda: plan_dynamic(H2O, max_len=1.5), PatternError, ("max_len", "1.5")),
    ("dynamic_cache_plan refresh max_len=2**30", lambda: dynamic_cache_plan(H2O_REFRESH, 2**30), PatternError,
     ("max_len=1073741824", "16777216", "refresh=True")),
    ("dynamic_cache_plan max_len=-3", lambda: dynamic_cache_plan(H2O, -3), PatternError, ("max_len", "positive")),
    # analysis results
    ("cache_ids(-1)", lambda: _analysis().cache_ids(-1), AnalysisError, ("cache_ids", "[0, max_len=64]")),
    ("cache_ids(1.5)", lambda: _analysis().cache_ids(1.5), AnalysisError, ("cache_ids", "1.5")),
    ("cache_ids(10**9) past max_len", lambda: _analysis().cache_ids(10**9), AnalysisError,
     ("cache_ids", "max_len=64", "1000000000")),
    ("last_use(-1)", lambda: _analysis().last_use(-1), AnalysisError, ("last_use", "[0, max_len=64)")),
    ("last_use(64)", lambda: _analysis().last_use(64), AnalysisError, ("last_use", "[0, max_len=64)")),
    ("last_use(2**70)", lambda: _analysis().last_use(2**70), AnalysisError, ("last_use", "integer")),
    ("last_use(0.5)", lambda: _analysis().last_use(0.5), AnalysisError, ("last_use", "integer")),
    # windows and tables that cannot be allocated
    ("dynamic plan of coprime strides without max_len",
     lambda: plan_dynamic(Diag(0, 8) * Causal() + Rect(stride=(4099, 4093)) * Causal() * Dynamic(4)),
     AnalysisError, ("shapes limit", "P=16777207", "max_len")),
    ("tile_map of 2**40 tokens", lambda: tile_map(Causal(), 2**40), PatternError, ("tiles", "limit")),
    ("tile_map q_len=2**62", lambda: tile_map(Causal(), 2**62), PatternError, ("q_len", "2**61")),
    ("tile_map not a pattern", lambda: tile_map(None, 8), PatternError, ("pattern", "NoneType")),
    ("tile_map block_m=0", lambda: tile_map(Causal(), 8, 8, 0, 4), PatternError, ("block_m", "positive")),
    # pattern construction
    ("'-' between patterns", lambda: Rect() - Diag(0, 1), PatternError, ("'-'", "a * ~b")),
    ("Or of one term", lambda: Or(Rect()), PatternError, ("Or", "two")),
    ("And of a number", lambda: And(Rect(), Causal(), 3), PatternError, ("terms[2]", "int")),
    ("Spread box=(0, 1)", lambda: Spread(Rect(size=2), Rect(), box=(0, 1)), PatternError, ("box", "positive")),
    ("'~' nested too deep", lambda: ~deep_pattern(MAX_DEPTH), PatternError, ("nested", "101", "100")),
    ("'>>' nested too deep", lambda: Rect(size=2) >> deep_pattern(MAX_DEPTH), PatternError, ("nested", "100")),
    # score chains
    ("score * nan", lambda: ops.attn_score().sum(dim=1) * float("nan"), PatternError, ("mul", "NaN")),
    ("score / 0", lambda: ops.attn_score().sum(dim=1) / 0, PatternError, ("div", "division", "0")),
    ("score + 10**400", lambda: ops.attn_score().sum(dim=1) + 10**400, PatternError, ("add", "401 digits")),
    ("2 - score", lambda: 2 - ops.attn_score().sum(dim=1), PatternError, ("2 - chain", "chain * -1 + 2")),
    ("2 / score", lambda: 2 / ops.attn_score().sum(dim=1), PatternError, ("2 / chain",)),
    ("'x' + score", lambda: "x" + ops.attn_score().sum(dim=1), PatternError, ("number", "'x'")),
    ("float_literal(nan)", lambda: float_literal(float("nan")), PatternError, ("NaN",)),
    # code generation
    ("int constant beyond int64", lambda: Lowering({}).value(ast.Constant(1 << 70)), KernelError,
     ("1180591620717411303424", "int64")),
    # SASAttnKernel arguments (found by a fuzzing helper: raw AttributeError / TypeError /
    # RuntimeError, or accepted and wrong)
    ("SASAttnKernel analysis='x'", lambda: _kernel(analysis="x"), KernelError, ("analysis", "sas.analyze", "str")),
    ("new_cache dtype=int32", lambda: _kernel().new_cache(1, 1, 16, dtype=torch.int32), KernelError,
     ("dtype", "torch.int32")),
    ("new_cache dtype='x'", lambda: _kernel().new_cache(1, 1, 16, dtype="x"), KernelError, ("dtype", "'x'")),
    ("new_cache device='bogus'", lambda: _kernel().new_cache(1, 1, 16, device="bogus"), KernelError,
     ("device", "'bogus'")),
    ("kv_cache_bytes batch=-1", lambda: _kernel().kv_cache_bytes(-1, 1, 16), KernelError, ("batch", "-1")),
    ("kv_cache_bytes dtype='x'", lambda: _kernel().kv_cache_bytes(1, 1, 16, "x"), KernelError, ("dtype", "'x'")),
    ("prefill of batch 0", lambda: _kernel(backend="torch").prefill(*[torch.zeros(0, 1, 8, 16)] * 3), KernelError,
     ("q", "batch, heads and head_dim", "at least 1")),
    ("prefill of head_dim 0", lambda: _kernel(backend="torch").prefill(*[torch.zeros(1, 1, 8, 0)] * 3),
     KernelError, ("head_dim", "at least 1")),
    ("prefill of meta tensors", lambda: _kernel().prefill(*[torch.zeros(1, 1, 8, 16, device="meta")] * 3),
     KernelError, ("q", "meta tensor")),
    ("decode into an expanded cache", lambda: _kernel()(*[torch.zeros(1, 1, 1, 16)] * 3,
                                                        *[torch.zeros(1, 1, 1, 16).expand(1, 1, 8, 16)] * 2,
                                                        position=0), KernelError, ("past_k", "broadcast view")),
    ("triton prefill of a q that requires grad",
     lambda: _kernel().prefill(torch.zeros(1, 1, 8, 16, requires_grad=True), *[torch.zeros(1, 1, 8, 16)] * 2),
     KernelError, ("q requires grad", "backend='triton' has no backward pass", "backend='torch'")),
    ("triton forward of a v that requires grad",
     lambda: _kernel()(*[torch.zeros(1, 1, 8, 16)] * 2, torch.zeros(1, 1, 8, 16, requires_grad=True)),
     KernelError, ("v requires grad", "torch.no_grad()")),
    # .sas text
    ("5000-digit literal", lambda: load_sas("p = Diag(" + "9" * 5000 + ", 3)"), ParseError,
     ("out of range", "5000 characters", "2**63", "line 1", "column 10")),
    ("literal 2**63", lambda: load_sas("p = Diag(0, 9223372036854775808)"), ParseError,
     ("9223372036854775808", "out of range", "column 13")),
    ("literal 2**63 with K", lambda: load_sas("p = Diag(0, 9999999999999999K)"), ParseError,
     ("9999999999999999K", "out of range")),
    ("150 nested '!'", lambda: load_sas("p = " + "!" * 150 + "Causal()"), ParseError,
     ("nested", "limit is 100", "line 1", "column 55")),   # the 100th "!" from the inside
    ("2000 alternating levels", lambda: load_sas(
        "a = Diag(0, 4)\np = " + "a * (a + (" * 1000 + "a" + "))" * 1000), ParseError,
     ("nested", "limit is 100", "line 2")),
    # each name used twice: 2^30 terms if nothing stopped it; line 17 would have 2^16 + 1 nodes
    ("a name doubled 30 times", lambda: load_sas(
        "a0 = Diag(0, 1)\n" + "".join(f"a{i} = a{i - 1} + a{i - 1}\n" for i in range(1, 31)) + "p = a30 * Causal()"),
     ParseError, ("65537 nodes", "limit is 65536", "line 17", "column 11")),
    ("a sum of 65536 terms", lambda: Or(*[Diag(0, 1)] * 65536), PatternError, ("65537 nodes", "limit is 65536")),
]


def _kernel(**kw: Any):
    from sas.runtime import SASAttnKernel
    return SASAttnKernel(Diag(0, 8) * Causal(), max_len=64, **kw)


@pytest.mark.parametrize("what,call,error,words", BAD, ids=[row[0] for row in BAD])
def test_bad_input_is_refused_clearly(what, call, error, words):
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    for word in words:
        assert word in message, f"{what}: {word!r} missing from {message!r}"


# --- edge cases with exact results: (what, call returning (got, want)) ----------------------

def _h2o_reference_equals_dense() -> tuple[np.ndarray, np.ndarray]:
    """H2O with a budget no region can reach evicts nothing: dense attention on the mask."""
    n = 24
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 8, generator=g, dtype=torch.float64) for _ in range(3))
    pattern = Diag(0, 3) * Causal() + Diag(3, None) * Causal() * Dynamic(budget=10**12)
    ref = dynamic_attention_reference(pattern, q, k, v, prefill_len=4)
    mask = torch.from_numpy(pattern.to_mask(n))[None, None].expand(1, 2, n, n)
    dense, _ = masked_attention(q, k, v, mask)
    return ref.out.numpy(), dense.numpy()


def _epilogue_of_generated_module(chain) -> tuple[np.ndarray, np.ndarray]:
    pattern = Diag(0, 4) * Causal() + Diag(4, None) * Causal() * Dynamic(budget=4, score=chain)
    module = dynamic_decode_module(dynamic_cache_plan(pattern, 64))
    x = torch.tensor([0.5, 2.0, -1.0])
    return module.epilogue(x).numpy(), (x * math.inf - math.inf).numpy()


EDGE: list[tuple[str, Callable[[], tuple[Any, Any]]]] = [
    ("Diag(-2**63, None) holds all 64 cells of 8x8",
     lambda: (Diag(-2**63, None).to_mask(8), np.ones((8, 8), dtype=bool))),
    ("Diag(0, 2**200) is unbounded within 8",
     lambda: (Diag(0, 2**200).to_mask(8), np.tril(np.ones((8, 8), dtype=bool)))),
    ("Diag(2**63 - 1, None) is empty within 8",
     lambda: (Diag(2**63 - 1, None).to_mask(8), np.zeros((8, 8), dtype=bool))),
    ("Diag stride 2**100 keeps one diagonal",
     lambda: (Diag(-3, None, stride=2**100).to_mask(8), np.eye(8, k=3, dtype=bool))),
    ("Diag offset -2**100 stride 3", lambda: (Diag(-2**100, None, stride=3).to_mask(9),
                                             reference_mask(Diag(-2**100, None, stride=3), 9))),
    ("Rect rows from 2**70 is empty", lambda: (Rect(rows=(2**70, None)).to_mask(6), np.zeros((6, 6), dtype=bool))),
    ("Rect cols up to 2**70 is full", lambda: (Rect(cols=(0, 2**70)).to_mask(6), np.ones((6, 6), dtype=bool))),
    ("Rect stride 2**64 offset 2**64-1", lambda: (Rect(rows=(0, None), stride=(2**64, 1), offset=(5, 0)).to_mask(8),
                                                  reference_mask(Rect(stride=(2**64, 1), offset=(5, 0)), 8))),
    ("spread of a 2**70-tall unit", lambda: ((Rect(size=(2**70, 3)) >> Diag(0, 1)).to_mask(8),
                                             reference_mask(Rect(size=(2**70, 3)) >> Diag(0, 1), 8))),
    ("predicate of Diag(0, 2**200) fits int64 and is exact",
     lambda: (predicate_mask(Diag(0, 2**200) * Rect(cols=(2**80, None)) + Diag(-2**90, 3), 7),
              reference_mask(Diag(0, 2**200) * Rect(cols=(2**80, None)) + Diag(-2**90, 3), 7))),
    ("lowered predicate has no constant beyond int64",
     lambda: (max(int(t) for t in re.findall(r"\d+", lower_predicate(
         Diag(-2**63, 2**200, stride=2**70) + Rect(rows=(2**90, None)), "i", "j"))) < 2**63, True)),
    ("analyze Diag(0, 2**40) at 64: cache <= 64",
     lambda: (analyze(Diag(0, 2**40) * Causal(), 64).cache_size, 64)),
    ("analyze Diag(-2**63, None) * Causal at 64",
     lambda: (analyze(Diag(-2**63, None) * Causal(), 64).cache_size, 64)),
    ("analyze streaming with a 2**40 sink range",
     lambda: (analyze((Diag(0, 5) + Rect(cols=(0, 3), rows=(0, 2**40))) * Causal(), 40).cache_size,
              brute_cache_size(reference_mask((Diag(0, 5) + Rect(cols=(0, 3))) * Causal(), 40)))),
    ("analysis notes say what was clamped",
     lambda: ("clamped" in " ".join(analyze(Diag(0, 2**40) * Causal(), 64).notes), True)),
    ("cache_ids(0) is empty", lambda: (len(_analysis().cache_ids(0)), 0)),
    ("cache_ids() covers max_len", lambda: (len(_analysis().cache_ids()), 64)),
    ("cache_ids(np.int64(5))", lambda: (_analysis().cache_ids(np.int64(5)).tolist(), [0, 1, 2, 3, 0])),
    ("to_mask(np.int64(3))", lambda: (Causal().to_mask(np.int64(3)), np.tril(np.ones((3, 3), dtype=bool)))),
    ("analyze max_len=1", lambda: (analyze(Causal(), 1).cache_size, 1)),
    ("analyze max_len=2**61 (periodic)", lambda: (analyze(Diag(0, 7) * Causal(), 2**61).cache_size, 7)),
    ("budget 10**9 clamped to the region at 64",
     lambda: (dynamic_cache_plan(H2O, 64).plan.budget, region_most_candidates(plan_dynamic(H2O, max_len=64), 64))),
    ("pool fits max_len", lambda: (dynamic_cache_plan(H2O, 64).pool_size <= 64, True)),
    ("summary says the budget was clamped",
     lambda: ("clamped to 60" in plan_dynamic(H2O, max_len=64).summary(), True)),
    ("a plan for 64 clamps again at 32",
     lambda: (dynamic_cache_plan(plan_dynamic(H2O, max_len=64), 32).plan.budget,
              region_most_candidates(plan_dynamic(H2O, max_len=32), 32))),
    ("a small budget is not clamped", lambda: (plan_dynamic(
        Diag(0, 4) * Causal() + Diag(4, None) * Causal() * Dynamic(budget=5), max_len=64).budget, 5)),
    ("H2O with an unreachable budget = dense attention", _h2o_reference_equals_dense),
    ("inf in a fused score runs in the generated module",
     lambda: _epilogue_of_generated_module(ops.attn_score().sum(dim=1) * float("inf") - float("inf"))),
    ("FusedScore prints -inf validly", lambda: (eval(FusedScore("sum", (("+", -math.inf, True),)).triton_expr("x"),
                                                     {"x": 1.0}), -math.inf)),
    ("2 + chain is chain + 2", lambda: (2 + ops.attn_score().sum(dim=1), ops.attn_score().sum(dim=1) + 2)),
    ("2000 nested parentheses", lambda: (load_sas("p = " + "(" * 2000 + "Causal()" + ")" * 2000), Causal())),
    ("5000-term .sas sum is one flat Or",
     lambda: (len(load_sas(sas_sum(5000)).terms[0].terms), 5000)),
    ("a + (b + c) == (a + b) + c", lambda: (Rect() + (Causal() + Diag(0, 1)), (Rect() + Causal()) + Diag(0, 1))),
]


@pytest.mark.parametrize("what,call", EDGE, ids=[row[0] for row in EDGE])
def test_edge_case_is_exact(what, call):
    got, want = call()
    if isinstance(want, np.ndarray) and want.dtype.kind == "f":
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12, err_msg=what)
    elif isinstance(want, np.ndarray):
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=what)
    else:
        assert got == want, f"{what}: got {got!r}, want {want!r}"


# --- long sums and deep trees survive every consumer ----------------------------------------

@pytest.mark.parametrize("source", ["sas", "python"])
def test_500_term_sum_survives_everything(source):
    if source == "sas":
        p = load_sas(sas_sum(500))
    else:
        s = Diag(0, 4)
        for _ in range(499):
            s = s + Diag(0, 4)
        p = s * Causal()
    want = reference_mask(Diag(0, 4) * Causal(), 16)
    assert "Diag(offset=0, size=4) + Diag(offset=0, size=4)" in repr(p)
    np.testing.assert_array_equal(p.to_mask(16), want)
    np.testing.assert_array_equal(predicate_mask(p, 16), want)
    a = analyze(p, 16)
    assert a.cache_size == brute_cache_size(want)
    decode_with_functions(a, want)
    assert "i - j" in lower_predicate(p, "i", "j")
    assert hash(p) == hash(load_sas(sas_sum(500)))


def test_deepest_allowed_tree_survives_everything():
    p = deep_pattern(MAX_DEPTH)        # causal: every term is
    assert p.depth == MAX_DEPTH
    want = reference_mask(p, 12)
    np.testing.assert_array_equal(p.to_mask(12), want)
    np.testing.assert_array_equal(predicate_mask(p, 12), want)
    assert repr(p).count("Diag") == MAX_DEPTH
    a = analyze(p, 12)
    assert a.cache_size == brute_cache_size(want)
    decode_with_functions(a, want)
    assert lower_predicate(p, "i", "j", dialect="torch")


# --- huge parameters against the independent evaluation -------------------------------------

HUGE = [2**31, 2**40, 2**61, 2**62, 2**63, 2**64, 2**100, 2**200]


def ints(lo: int, small: int = 6):
    """Small integers >= lo, or a huge power of two plus a small term (both signs if lo < 0)."""
    huge = st.tuples(st.sampled_from(HUGE), st.integers(-2, 2)).map(lambda t: t[0] + t[1])
    if lo < 0:
        huge = st.one_of(huge, huge.map(lambda v: -v))
    return st.one_of(st.integers(lo, small), huge).filter(lambda v: v >= lo)


@st.composite
def huge_diags(draw) -> Diag:
    stride = draw(st.one_of(st.integers(1, 3), ints(1)))
    return Diag(draw(ints(-6)), draw(st.one_of(st.none(), ints(1))), stride)


@st.composite
def huge_rects(draw) -> Rect:
    def axis():
        lo = draw(st.one_of(st.none(), ints(0)))
        hi = draw(st.one_of(st.none(), ints(1)))
        if lo is not None and hi is not None and hi <= lo:
            hi = lo + draw(st.integers(1, 4))
        stride = draw(st.one_of(st.integers(1, 3), ints(1)))
        return (lo, hi), stride, draw(st.integers(0, min(stride - 1, 3)))
    (r, sr, orr), (c, sc, oc) = axis(), axis()
    return Rect(r, c, stride=(sr, sc), offset=(orr, oc))


@st.composite
def huge_patterns(draw, depth: int = 3) -> Pattern:
    if depth == 0 or draw(st.booleans()):
        return draw(st.one_of(huge_diags(), huge_rects()))
    kind = draw(st.sampled_from(["or", "and", "not", "spread"]))
    a = draw(huge_patterns(depth - 1))
    if kind == "not":
        return ~a
    if kind == "spread":
        h, w = draw(st.sampled_from([1, 2, 3, 2**40, 2**70])), draw(st.sampled_from([1, 2, 3, 2**70]))
        return (Rect(size=(h, w)) * a) >> draw(huge_patterns(depth - 1))
    b = draw(huge_patterns(depth - 1))
    return a + b if kind == "or" else a * b


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(huge_patterns(), st.integers(1, 12))
def test_huge_parameters_match_python_int_evaluation(p, n):
    want = reference_mask(p, n)
    np.testing.assert_array_equal(p.to_mask(n), want)
    np.testing.assert_array_equal(p.restrict(n).to_mask(n), want)
    np.testing.assert_array_equal(predicate_mask(p, n), want)
    r = p.restrict(n)
    assert r.restrict(n) is r                       # restricting is idempotent
    for node in r.walk():                           # ... and leaves only small numbers
        numbers = [v for v in _parameters(node) if v is not None]
        assert all(abs(v) <= 4 * n for v in numbers), (node, n)
    cls = classify_tiles(p, n, n, 4, 4, 0)
    for (m, k), c in np.ndenumerate(cls):
        block = want[4 * m:4 * m + 4, 4 * k:4 * k + 4]
        assert c == (FULL if block.all() and block.shape[1] == 4 else PARTIAL if block.any() else EMPTY)


def _parameters(node: Pattern) -> list[int | None]:
    if isinstance(node, Diag):
        return [node.offset, node.size, node.stride]
    if isinstance(node, Rect):
        return [*node.rows, *node.cols, *node.stride]
    if isinstance(node, Spread):
        return list(node.shape)
    return []


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(huge_patterns(depth=2), st.integers(1, 24))
def test_huge_parameters_analysis_matches_brute_force(p, n):
    p = p * Causal()
    want = reference_mask(p, n)
    assume(want.any())                               # an empty pattern is refused, rightly
    a = analyze(p, n)
    assert a.cache_size == brute_cache_size(want) <= n
    decode_with_functions(a, want)
