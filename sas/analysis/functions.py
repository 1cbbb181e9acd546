"""Synthesis of `cache_id_func`, `slot_key_func` and `mask_func` as Python ASTs (paper 5.4).

- `cache_id_func(token_id)`: the slot key `token_id` is written to, -1 when never stored.
- `slot_key_func(cache_id, token_id)`: the key held in slot `cache_id` while query
  `token_id` runs (-1 when the slot is still empty).
- `mask_func(cache_id, token_id)`: whether query `token_id` attends that key; it is the
  pattern's own predicate applied to the key the slot holds, so it is exact by construction.

Each body is zero or more `name = <expr>` assignments followed by `return <expr>`, using
integer arithmetic with floor division and modulo on non-negative operands, comparisons,
boolean operators and conditional expressions: a form that lowers to Triton/C++/NKI.
Only the table fallback uses module-level tables (named in the module, bound by `compile_functions`).
"""

from __future__ import annotations

import ast
import copy
from typing import Callable, Mapping

import numpy as np

from sas.analysis.expr import E, all_of, where
from sas.analysis.slots import PrefixRingScheme, RingScheme, Scheme, TableScheme
from sas.lang.pattern import Pattern

TOKEN, SLOT = "token_id", "cache_id"


def _fn(name: str, args: list[str], body: list[ast.stmt], doc: str) -> ast.FunctionDef:
    return ast.FunctionDef(
        name=name,
        args=ast.arguments(posonlyargs=[], args=[ast.arg(a) for a in args], kwonlyargs=[],
                           kw_defaults=[], defaults=[]),
        body=[ast.Expr(ast.Constant(doc))] + body,
        decorator_list=[], returns=None, type_params=[],
    )


def _assign(name: str, value: E) -> ast.stmt:
    return ast.Assign(targets=[ast.Name(name, ast.Store())], value=value.node)


def _ret(value: E) -> ast.stmt:
    return ast.Return(value.node)


def _ring_rank(keys, C: int, s: E, i: E) -> list[ast.stmt]:
    """`rho`: rank of the latest member written to ring slot s (rank = s mod C) by query i."""
    return [_assign("cnt", keys.count_upto_expr(i)),
            _assign("rho", E.name("cnt") - 1 - ((E.name("cnt") - 1 - s + C) % C))]


def _closed_form(scheme: Scheme, n: int) -> tuple[list[ast.stmt], list[ast.stmt]]:
    j, s, i = E.name(TOKEN), E.name(SLOT), E.name(TOKEN)
    rho = E.name("rho")
    in_range = all_of(j.ge(0), j.lt(n))
    if isinstance(scheme, RingScheme):
        keys, C = scheme.keys, scheme.C
        cid = where(in_range & keys.contains_expr(j), keys.rank_mod_expr(j, C), -1)
        body = _ring_rank(keys, C, s, i)
        body.append(_ret(where(all_of(s.ge(0), s.lt(C), i.ge(0), rho.ge(0)), keys.unrank_expr(rho), -1)))
        return [_ret(cid)], body
    assert isinstance(scheme, PrefixRingScheme)
    pre, F, ring, R = scheme.prefix, scheme.F, scheme.ring, scheme.R
    ring_id = where(ring.contains_expr(j), F + ring.rank_mod_expr(j, R), -1) if not ring.empty else E(-1)
    cid = where(in_range, where(pre.contains_expr(j), pre.rank_expr(j), ring_id) if not pre.empty else ring_id, -1)
    prefix_key = pre.unrank_expr(s) if not pre.empty else E(-1)
    body: list[ast.stmt] = []
    if ring.empty:
        ring_key = E(-1)
    else:
        body += _ring_rank(ring, R, s - F, i)
        ring_key = where(rho.ge(0), ring.unrank_expr(rho), -1)
    body += [
        _assign("key", where(s.lt(F), prefix_key, ring_key)),
        _ret(where(all_of(s.ge(0), s.lt(F + R), i.ge(0), E.name("key").le(i)), E.name("key"), -1)),
    ]
    return [_ret(cid)], body


def _table(scheme: TableScheme) -> tuple[list[ast.stmt], list[ast.stmt], dict[str, np.ndarray]]:
    """Table fallback: per-token slot ids, and per slot the keys it holds in order (int64 arrays;
    the module refers to them by name and `compile_functions` binds them)."""
    ids = scheme.cache_id
    order = np.argsort(ids, kind="stable")        # by slot, then by token
    order = order[ids[order] >= 0].astype(np.int64)
    starts = np.searchsorted(ids[order], np.arange(scheme.C + 1)).astype(np.int64)
    tables = {"CACHE_ID": np.asarray(ids, dtype=np.int64), "SLOT_KEYS": order, "SLOT_START": starts}
    src = f"""
def _cid(token_id):
    return CACHE_ID[token_id] if 0 <= token_id < {len(ids)} else -1

def _key(cache_id, token_id):
    if not 0 <= cache_id < {scheme.C}:
        return -1
    lo, hi = SLOT_START[cache_id], SLOT_START[cache_id + 1]
    k = bisect.bisect_right(SLOT_KEYS, token_id, lo, hi) - 1
    return SLOT_KEYS[k] if k >= lo else -1
"""
    helpers = ast.parse(src).body
    cid = [ast.Return(ast.parse(f"_cid({TOKEN})", mode="eval").body)]
    key = [ast.Return(ast.parse(f"_key({SLOT}, {TOKEN})", mode="eval").body)]
    return cid, key, tables, helpers


def synthesize(pattern: Pattern, scheme: Scheme, n: int) -> tuple[ast.Module, dict[str, np.ndarray]]:
    """Build the module holding the three functions, and the tables of the fallback: the
    module names them (`CACHE_ID`, ...) without holding their values (a table has one entry
    per token: as literals they would make the module as large as the sequence);
    `compile_functions(module, tables)` binds them."""
    tables: dict[str, np.ndarray] = {}
    prelude: list[ast.stmt] = []
    if isinstance(scheme, TableScheme):
        cid_body, key_body, tables, helpers = _table(scheme)
        prelude = [ast.Import([ast.alias("bisect")])]
        prelude += helpers
    else:
        cid_body, key_body = _closed_form(scheme, n)
    key_name = E.name("key")
    pred = E(pattern.predicate(E.name(TOKEN).node, key_name.node))
    # mask_func inlines slot_key_func's body so that it lowers on its own.
    mask_body = [copy.deepcopy(st) for st in key_body[:-1]]
    mask_body += [_assign("key", E(copy.deepcopy(key_body[-1].value))), _ret(all_of(key_name.ge(0), pred))]
    mod = ast.Module(body=prelude + [
        _fn("cache_id_func", [TOKEN], cid_body, "Cache slot that key `token_id` is written to; -1 if never stored."),
        _fn("slot_key_func", [SLOT, TOKEN], key_body, "Key held in slot `cache_id` while query `token_id` runs; -1 if empty."),
        _fn("mask_func", [SLOT, TOKEN], mask_body, "Whether query `token_id` attends the key held in slot `cache_id`."),
    ], type_ignores=[])
    return ast.fix_missing_locations(mod), tables


def compile_functions(mod: ast.Module, filename: str = "<sas-synthesized>",
                      tables: Mapping[str, np.ndarray] | None = None) -> dict[str, Callable]:
    """The three functions of a synthesized module, with its tables (if any) bound by name."""
    namespace: dict = dict(tables or {})
    exec(compile(mod, filename, "exec"), namespace)
    return {k: namespace[k] for k in ("cache_id_func", "slot_key_func", "mask_func")}


def synthesized_source(functions: ast.Module, tables: Mapping[str, np.ndarray]) -> str:
    """The module's source with its tables written out as tuple literals after its import (a
    module that runs on its own, as the synthesized module did when it held its tables)."""
    text = ast.unparse(functions)
    if not tables:
        return text
    head, _, rest = text.partition("\n")         # `import bisect` comes first
    lines = [f"{name} = ({', '.join(map(str, np.asarray(v).tolist()))}{',' if len(v) == 1 else ''})"
             for name, v in tables.items()]
    return "\n".join([head, *lines, rest])
