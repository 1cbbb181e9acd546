"""Every bad argument to a primitive or operator raises `sas.errors.PatternError` (a `SASError`)
whose message names the offending argument (DESIGN.md, "Errors")."""

from __future__ import annotations

import re

import numpy as np
import pytest

from sas import Causal, Diag, Dynamic, Rect, ops
from sas.errors import PatternError, SASError
from sas.lang import And, Not, Or, Spread


def raises(fn, *names: str) -> PatternError:
    """Call fn, expect a PatternError whose message mentions every one of `names`."""
    with pytest.raises(PatternError) as info:
        fn()
    err = info.value
    assert isinstance(err, SASError)
    message = str(err)
    for name in names:
        assert name in message, f"{name!r} not named in: {message}"
    return err


def test_pattern_error_is_a_sas_error():
    assert issubclass(PatternError, SASError)
    assert not issubclass(PatternError, TypeError)


# --- Rect ------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [0, -1, (0, 2), (2, 0), (2, -3), (-1, -1)])
def test_rect_nonpositive_size(size):
    raises(lambda: Rect(size=size), "size", ">= 1")


@pytest.mark.parametrize("size", [2.5, (2.0, 2), (2, 2.0), "22", (2,), (1, 2, 3), True, (True, 2), (2, False), [None, 2]])
def test_rect_size_not_integers(size):
    raises(lambda: Rect(size=size), "size")


@pytest.mark.parametrize("kwargs", [{"rows": (0, 2)}, {"cols": (0, 2)}, {"rows": (0, 2), "cols": (0, 2)},
                                    {"rows": (None, None)}])
def test_rect_size_with_rows_or_cols(kwargs):
    raises(lambda: Rect(size=(2, 2), **kwargs), "size", "rows", "cols")


@pytest.mark.parametrize("stride,axis", [(0, "rows"), (-2, "rows"), ((1, 0), "cols"), ((0, 1), "rows"), ((2, -1), "cols")])
def test_rect_stride_below_one(stride, axis):
    raises(lambda: Rect(stride=stride), "stride", axis, ">= 1")


@pytest.mark.parametrize("stride", [1.5, True, None, "2", (1, 2, 3), (2.0, 2), (2, True)])
def test_rect_stride_not_integers(stride):
    raises(lambda: Rect(stride=stride), "stride")


@pytest.mark.parametrize("stride,offset", [(1, 1), (2, 2), (2, 3), ((2, 4), (1, 4)), ((3, 2), (3, 0)), (4, (0, 4))])
def test_rect_offset_not_below_stride(stride, offset):
    raises(lambda: Rect(stride=stride, offset=offset), "offset", "stride")


def test_rect_offset_without_stride():
    raises(lambda: Rect(rows=(0, 8), offset=1), "offset", "stride")


@pytest.mark.parametrize("offset", [-1, (0, -1), 0.5, True, None, (1, 1, 1)])
def test_rect_offset_bad_value(offset):
    raises(lambda: Rect(stride=4, offset=offset), "offset")


@pytest.mark.parametrize("field", ["rows", "cols"])
@pytest.mark.parametrize("rng", [(3, 3), (4, 2), (7, 1), (1, 1)])
def test_rect_empty_range(field, rng):
    err = raises(lambda: Rect(**{field: rng}), field, "empty")
    assert "stop" in str(err) and "start" in str(err)


@pytest.mark.parametrize("field", ["rows", "cols"])
@pytest.mark.parametrize("rng,what", [((None, 0), "stop"), ((0, 0), "stop"), ((None, -2), "stop"), ((-1, 3), "start"), ((-1, None), "start")])
def test_rect_range_out_of_domain(field, rng, what):
    raises(lambda: Rect(**{field: rng}), field, what)


@pytest.mark.parametrize("field", ["rows", "cols"])
@pytest.mark.parametrize("rng", [5, (0, 1, 2), (0,), "ab", (0.5, 2), (0, 2.0), (False, 2), (0, True), {0, 2}])
def test_rect_range_not_integers(field, rng):
    raises(lambda: Rect(**{field: rng}), field)


def test_rect_positional_range_checked():
    raises(lambda: Rect((2, 1)), "rows")
    raises(lambda: Rect(None, (5, 5)), "cols")


# --- Diag ------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [0, -1, -100])
def test_diag_nonpositive_size(size):
    raises(lambda: Diag(0, size), "Diag", "size", ">= 1")


@pytest.mark.parametrize("stride", [0, -1])
def test_diag_stride_below_one(stride):
    raises(lambda: Diag(0, None, stride=stride), "Diag", "stride", ">= 1")


@pytest.mark.parametrize("field,value", [("offset", 1.5), ("offset", True), ("offset", None), ("offset", "0"),
                                         ("size", 2.0), ("size", True), ("size", "3"), ("size", (1, 2)),
                                         ("stride", 2.0), ("stride", True), ("stride", None), ("stride", False)])
def test_diag_not_integers(field, value):
    raises(lambda: Diag(**{field: value}), "Diag", field)


def test_diag_accepts_negative_offsets_and_numpy_ints():
    assert Diag(-3, 2).offset == -3
    assert Diag(np.int64(2), np.int32(3), stride=np.int64(2)) == Diag(2, 3, stride=2)


# --- spread ----------------------------------------------------------------------------------

@pytest.mark.parametrize("make_unit,axis", [
    (lambda: Diag(0, 1), "rows"),
    (lambda: ~Rect(size=(2, 2)), "rows"),
    (lambda: Rect(cols=(0, 2)), "rows"),
    (lambda: Rect(rows=(0, 2)), "cols"),
    (lambda: Rect(rows=(0, 2), cols=(1, None)), "cols"),
    (lambda: Dynamic(budget=1), "rows"),
    (lambda: Rect(size=(2, 2)) + Diag(0, 1), "rows"),
    (lambda: Causal(), "rows"),
])
def test_spread_unbounded_unit(make_unit, axis):
    unit = make_unit()
    raises(lambda: unit >> Diag(0, 1), "'>>'", "bounded", axis)
    raises(lambda: Spread(unit, Diag(0, 1)), "'>>'", "bounded", axis)


def test_spread_bounded_units_are_accepted():
    Rect(size=(2, 2)) >> Diag(0, 1)
    (Rect(size=(2, 2)) * Diag(0, 1)) >> Rect()
    (Diag(0, 1) * Rect(size=(2, 3))) >> Rect()
    (Rect(size=2) >> Rect(size=2)) >> Diag(0, 1)      # a spread of bounded layout is bounded
    (Rect(size=2) + Rect(rows=(1, 3), cols=(0, 1))) >> Rect()


# --- operators -------------------------------------------------------------------------------

BAD_OPERANDS = [1, 0, 2.5, None, "Diag(0, 1)", True, np.ones((2, 2), dtype=bool), ops.attn_score()]


@pytest.mark.parametrize("other", BAD_OPERANDS, ids=lambda o: type(o).__name__)
@pytest.mark.parametrize("op", ["+", "*", ">>"])
def test_operator_right_operand_not_a_pattern(op, other):
    left = Rect(size=(2, 2))
    fn = {"+": lambda: left + other, "*": lambda: left * other, ">>": lambda: left >> other}[op]
    err = raises(fn, op, "right operand")
    assert type(other).__name__ in str(err)


@pytest.mark.parametrize("other", [1, 0, 2.5, None, "x", True], ids=lambda o: type(o).__name__)
@pytest.mark.parametrize("op", ["+", "*", ">>"])
def test_operator_left_operand_not_a_pattern(op, other):
    right = Diag(0, 1)
    fn = {"+": lambda: other + right, "*": lambda: other * right, ">>": lambda: other >> right}[op]
    raises(fn, op, "left operand")


def test_score_chain_with_pattern_operand():
    # an op chain on the left handles the operator itself and rejects the pattern
    raises(lambda: ops.attn_score() + Diag(0, 1), "score arithmetic", "operand")
    raises(lambda: ops.attn_score() * Diag(0, 1), "score arithmetic", "operand")


def test_numpy_left_operand():
    raises(lambda: np.ones((2, 2), dtype=bool) * Rect(), "'*'", "left operand")


@pytest.mark.parametrize("op,hint", [("|", "'+'"), ("&", "'*'")])
def test_flex_style_operators_point_to_pattern_operators(op, hint):
    fn = {"|": lambda: Rect() | Diag(0, 1), "&": lambda: Rect() & Diag(0, 1)}[op]
    raises(fn, op, hint)


@pytest.mark.parametrize("make,field", [
    (lambda: Or(Rect(), 1), "b"),
    (lambda: Or(None, Rect()), "a"),
    (lambda: And(1, Rect()), "a"),
    (lambda: And(Rect(), "x"), "b"),
    (lambda: Not(1), "a"),
    (lambda: Spread(1, Rect()), "unit"),
    (lambda: Spread(Rect(size=2), 1), "layout"),
])
def test_operator_nodes_built_directly(make, field):
    raises(make, f"({field}=...)")


# --- Dynamic ---------------------------------------------------------------------------------

@pytest.mark.parametrize("budget", [0, -1, -512])
def test_dynamic_budget_not_positive(budget):
    raises(lambda: Dynamic(budget=budget), "Dynamic", "budget", ">= 1")


@pytest.mark.parametrize("budget", [1.5, True, None, "8"])
def test_dynamic_budget_not_integer(budget):
    raises(lambda: Dynamic(budget=budget), "Dynamic", "budget")


@pytest.mark.parametrize("score", ["attn_score", 1, lambda: 0, ops.attn_score, [ops.attn_score()], Rect()],
                         ids=lambda s: type(s).__name__)
def test_dynamic_bad_score(score):
    raises(lambda: Dynamic(budget=4, score=score), "Dynamic", "score", "ops")


@pytest.mark.parametrize("refresh", [1, 0, "yes", None, np.bool_(True)])
def test_dynamic_bad_refresh(refresh):
    raises(lambda: Dynamic(budget=4, refresh=refresh), "Dynamic", "refresh")


@pytest.mark.parametrize("make,names", [
    (lambda: ops.attn_score().reduce(dim=1, kind="median"), ("reduce", "kind")),
    (lambda: ops.attn_score().sum(dim=1.5), ("reduce", "dim")),
    (lambda: ops.attn_score().pooling(kernel_size=0), ("pooling", "kernel_size")),
    (lambda: ops.attn_score().pooling(kernel_size=3, kind="min"), ("pooling", "kind")),
    (lambda: ops.attn_score().topk(0), ("topk", "k")),
    (lambda: ops.attn_score() + "x", ("add", "operand")),
])
def test_bad_score_chains(make, names):
    raises(make, *names)


# --- to_mask ---------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [0, -3, 2.5, True, False, "4", None, np.int64(0), np.float64(4.0)],
                         ids=lambda n: repr(n))
def test_to_mask_bad_n(n):
    raises(lambda: Causal().to_mask(n), "to_mask", "n", "positive integer")


def test_to_mask_accepts_numpy_ints():
    assert Causal().to_mask(np.int64(3)).shape == (3, 3)


# --- messages say what would be valid ----------------------------------------------------------

@pytest.mark.parametrize("make,pattern", [
    (lambda: Rect(stride=2, offset=2), r"0 \.\. stride-1"),
    (lambda: Rect(rows=(3, 3)), r"stop must be greater than start"),
    (lambda: Diag(0, 0), r">= 1"),
    (lambda: Diag(0, 1) >> Diag(0, 1), r"Rect with finite rows and cols"),
    (lambda: Rect(size=(2, 2), rows=(0, 1)), r"either size=\(h, w\) or rows=/cols="),
])
def test_messages_say_what_is_valid(make, pattern):
    err = raises(make)
    assert re.search(pattern, str(err)), str(err)


@pytest.mark.parametrize("make,words", [
    (lambda: Diag(0, 64, strde=4), ["Diag(...)", "'strde'", "offset, size, stride"]),
    (lambda: Diag(1, 2, 3, 4), ["Diag(...)", "too many positional", "offset, size, stride"]),
    (lambda: Rect(rows=(0, 1), colz=(0, 2)), ["Rect(...)", "'colz'", "rows, cols, size, stride, offset"]),
    (lambda: Dynamic(budgt=3), ["Dynamic(...)", "budget, score, refresh"]),
    (lambda: Causal(1), ["Causal() takes no arguments", "Diag(0, w)"]),
])
def test_primitive_arguments_are_named(make, words):
    """A primitive given an argument it does not take says which ones it takes, as a
    PatternError (Python's TypeError named only the bad one; `Causal(1)` said 'takes 0
    positional arguments'), as the .sas parser already does."""
    with pytest.raises(PatternError) as e:
        make()
    assert all(w in str(e.value) for w in words), str(e.value)


# --- depth and node count, kept from the operands --------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from strategies import patterns  # noqa: E402

from sas.lang.pattern import Pattern  # noqa: E402


@settings(max_examples=80, deadline=None)
@given(st.lists(patterns(max_depth=3), min_size=2, max_size=5), st.lists(st.booleans(), min_size=4, max_size=4))
def test_sums_and_products_keep_depth_and_node_count_of_their_terms(parts, ops_):
    """Or / And take their depth and node count from the operands (a spliced operand of their
    kind gives its terms': one level and one node less), so building a sum term by term costs
    O(operands) a step (before: the whole tree was walked at every '+', 12.8 s for 20000 terms;
    found by a new-user exploration). Every node equals the definitions walked over its
    children."""
    p = parts[0]
    for q, plus in zip(parts[1:], ops_):
        p = p + q if plus else p * q
    for node in p.walk():
        assert node.depth == Pattern.depth.func(node)
        assert node.node_count == Pattern.node_count.func(node)


def test_a_long_sum_keeps_its_count_and_limit():
    p = Diag(0, 1)
    for i in range(1, 3000):
        p = p + Diag(i, 1)
    assert isinstance(p, Or) and len(p.terms) == 3000 and p.node_count == 3001 and p.depth == 2
    with pytest.raises(PatternError, match="65537 nodes; the limit is 65536"):
        Or(*[Diag(i, 1) for i in range(65536)])
