"""Periodic key sets (`sas.analysis.keysets.KeySet`): the expressions the synthesized functions
are built from equal the numeric methods on every key, for boundaries and classes short
enough to be written a constant node per item and long ones (one constant node holding the
tuple, `sas.analysis.expr.lookup`)."""

from __future__ import annotations

import ast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sas.analysis.expr import INLINE_NODES, E, lookup
from sas.analysis.keysets import KeySet
from sas.analysis.simplify import check_equal
from sas.codegen.printers import lower_expr
from sas.errors import NotYetSupportedError


def _evaluate(expr: E, name: str, values: np.ndarray) -> np.ndarray:
    code = compile(ast.fix_missing_locations(ast.Expression(expr.node)), "<keyset>", "eval")
    return np.array([int(eval(code, {name: int(v)})) for v in values])


@st.composite
def key_sets(draw) -> KeySet:
    T = draw(st.integers(0, 700))
    boundary = sorted(draw(st.sets(st.integers(0, max(T - 1, 0)), max_size=T))) if T else []
    P = draw(st.integers(1, 300))
    classes = sorted(draw(st.sets(st.integers(0, P - 1), min_size=1, max_size=P)))
    return KeySet(T, P, tuple(boundary), tuple(classes))


@settings(max_examples=40, deadline=None)
@given(key_sets())
def test_expressions_equal_the_numeric_key_set(ks: KeySet) -> None:
    j = np.arange(-2, ks.T + 3 * ks.P + 2)
    member = ks.contains(j)
    assert np.array_equal(_evaluate(ks.contains_expr(E.name("j")), "j", j).astype(bool), member)
    assert np.array_equal(_evaluate(ks.rank_expr(E.name("j")), "j", j[member]), ks.rank(j[member]))
    i = j[j >= 0]                  # counts are read at token ids
    assert np.array_equal(_evaluate(ks.count_upto_expr(E.name("i")), "i", i), ks.count_upto(i))
    rho = np.arange(int(ks.count_upto(np.array([j[-1]]))[0]))
    assert np.array_equal(_evaluate(ks.unrank_expr(E.name("r")), "r", rho), ks.unrank(rho))


def test_a_long_table_is_one_constant_node() -> None:
    values = tuple((k * k) % 1009 for k in range(INLINE_NODES + 1))
    expr = lookup(values, E.name("token_id"))
    assert isinstance(expr.node.value, ast.Constant) and expr.node.value.value == values
    assert np.array_equal(_evaluate(expr, "token_id", np.arange(len(values))), np.array(values))
    short = lookup(values[:INLINE_NODES], E.name("token_id"))
    assert isinstance(short.node.value, ast.Tuple)
    # the simplifier's array evaluation reads it as well
    src = "\n".join(f"def {name}({args}):\n    return 0" for name, args in
                    (("cache_id_func", "token_id"), ("slot_key_func", "cache_id, token_id"),
                     ("mask_func", "cache_id, token_id")))
    mod = ast.parse(src)
    for fn in mod.body:
        fn.body = [ast.Return(expr.node)]
    mod = ast.fix_missing_locations(mod)
    same = ast.parse(src.replace("return 0", "return token_id * token_id % 1009"))
    other = ast.parse(src.replace("return 0", "return token_id * token_id % 1013"))
    assert check_equal(mod, same, np.arange(len(values)), 1) is None
    assert check_equal(mod, other, np.arange(len(values)), 1) is not None
    # the kernel lowerings inline at most 256 items: a clear refusal, without the items
    with pytest.raises(NotYetSupportedError, match=r"257-item tuple literal: at most 256"):
        lower_expr(expr.node, {"token_id": "t"})
