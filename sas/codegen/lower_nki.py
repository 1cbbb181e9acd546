"""Lowering of sas's integer Python AST expressions (a pattern's predicate `M(i, j)`) to NKI
statements over index tiles.

The query and key positions of a BLOCK_M x BLOCK_N tile are int32 SBUF tiles built with
`nisa.iota` (`qi`, `kj`); every operation of the predicate becomes one `nl.*` element-wise call
assigned to a fresh name (`m_0 = nl.less(...)`), so the kernel reads as a sequence of
instructions. Constants are folded; identical sub-expressions are emitted once.

Mapping (documented functions only, see sas.codegen.nki_api):

- `+ - *` -> nl.add / nl.subtract / nl.multiply; unary `-x` -> nl.multiply(x, -1);
- `x % c` (c > 0 constant) -> nl.mod(x, c) (Python's sign convention, as documented);
- `x // c` -> nl.divide(nl.subtract(x, nl.mod(x, c)), c, dtype=nl.int32): the dividend is made
  an exact multiple first, so the division is exact also in the engines' float32 math;
- comparisons -> nl.less / less_equal / greater / greater_equal / equal / not_equal (chains
  become conjunctions); `and` / `or` / `not` -> nl.logical_and / logical_or / logical_not;
- `a if c else b` -> nl.where (its `x` operand must be a tile: constants are arranged so);
- a boolean used as a number -> nl.multiply(b, 1, dtype=nl.int32).

The vector engines compute in float32, so integer index arithmetic is exact below 2**24:
`nki_backend` refuses longer sequences. Calls of the other synthesized functions are
inlined (`lower_function_mask`, for decode's `mask_func`); subscripts of tuple literals and of tables of at most
MAX_INLINE_TABLE entries become nl.where chains; larger tables (cache functions without a
closed form at long lengths) are not lowered (NotYetSupportedError).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

from sas.codegen.lower_triton import _body_statements, _params, check_identifier, find_function
from sas.errors import KernelError, NotYetSupportedError

_CMP = {ast.Lt: "less", ast.LtE: "less_equal", ast.Gt: "greater", ast.GtE: "greater_equal",
        ast.Eq: "equal", ast.NotEq: "not_equal"}
_MIRROR = {ast.Lt: ast.Gt, ast.LtE: ast.GtE, ast.Gt: ast.Lt, ast.GtE: ast.LtE, ast.Eq: ast.Eq,
           ast.NotEq: ast.NotEq}
_ARITH = {ast.Add: "add", ast.Sub: "subtract", ast.Mult: "multiply"}

#: Largest table (or tuple literal) inlined as a chain of nl.where.
MAX_INLINE_TABLE = 64

#: Largest absolute index value the float32 vector-engine math represents exactly.
EXACT_INT = 1 << 24


@dataclass(frozen=True)
class _V:
    """A lowered value: a generated name (tile) or a constant."""

    text: str
    is_bool: bool
    const: int | bool | None = None

    @property
    def is_const(self) -> bool:
        return self.const is not None


def _c(v: int | bool) -> _V:
    if isinstance(v, bool):
        return _V(repr(v), True, v)
    if abs(v) >= EXACT_INT:
        raise KernelError(f"NKI mask expression needs the constant {v}, beyond the float32-exact range "
                          f"+-2**24 of the NKI vector engines")
    return _V(str(v) if v >= 0 else f"({v})", False, v)


def _floordiv(a: int, b: int) -> int:
    return a // b


class NkiLowering:
    """Lowers expressions over `names` (source name -> generated tile name) to `self.lines`."""

    def __init__(self, names: dict[str, str], prefix: str = "m_",
                 functions: dict[str, ast.FunctionDef] | None = None):
        self.env = {check_identifier(k, "parameter name"): _V(check_identifier(v, "tile name"), False)
                    for k, v in names.items()}
        self.prefix = check_identifier(prefix, "generated name prefix")
        self.functions = dict(functions or {})
        self.tables: dict[str, tuple[int, ...]] = {}
        self.lines: list[str] = []
        self._seen: dict[str, _V] = {}
        self._depth = 0

    def body(self, fdef: ast.FunctionDef, args: list[_V]) -> _V:
        """Inline a function body (`name = expr` assignments, then `return expr`) with its
        parameters bound to `args`."""
        params = _params(fdef)
        if len(params) != len(args):
            raise KernelError(f"function {fdef.name!r} takes {len(params)} parameters, {len(args)} given")
        self._depth += 1
        if self._depth > 16:
            raise NotYetSupportedError(f"function {fdef.name!r}: calls nest too deep (recursion?)")
        saved, self.env = self.env, dict(zip(params, args))
        try:
            stmts = _body_statements(fdef)
            for stmt in stmts[:-1]:
                if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                        and isinstance(stmt.targets[0], ast.Name)):
                    raise NotYetSupportedError(f"function {fdef.name!r}: statement {ast.unparse(stmt)!r} cannot be "
                                               f"lowered to NKI ('name = <expr>' assignments, then 'return <expr>')")
                self.env[stmt.targets[0].id] = self.lower(stmt.value)
            return self.lower(stmts[-1].value)
        finally:
            self.env = saved
            self._depth -= 1

    def _emit(self, call: str, is_bool: bool) -> _V:
        hit = self._seen.get(call)
        if hit is not None:
            return hit
        name = f"{self.prefix}{len(self._seen)}"
        self.lines.append(f"{name} = {call}")
        v = self._seen[call] = _V(name, is_bool)
        return v

    # -- conversions ------------------------------------------------------------------------------
    def _as_int(self, v: _V) -> _V:
        if not v.is_bool:
            return v
        if v.is_const:
            return _c(int(v.const))
        return self._emit(f"nl.multiply({v.text}, 1, dtype=nl.int32)", False)

    def _truth(self, v: _V) -> _V:
        if v.is_bool:
            return v
        if v.is_const:
            return _c(bool(v.const))
        return self._emit(f"nl.not_equal({v.text}, 0)", True)

    def _not(self, v: _V) -> _V:
        v = self._truth(v)
        if v.is_const:
            return _c(not v.const)
        return self._emit(f"nl.logical_not({v.text})", True)

    def _fold(self, vals: list[_V], op: str) -> _V:
        is_and = op == "logical_and"
        if any(v.is_const and bool(v.const) != is_and for v in vals):
            return _c(not is_and)
        rest = [v for v in vals if not v.is_const]
        if not rest:
            return _c(is_and)
        out = rest[0]
        for v in rest[1:]:
            out = self._emit(f"nl.{op}({out.text}, {v.text})", True)
        return out

    # -- the recursive lowering -------------------------------------------------------------------
    def lower(self, node: ast.expr) -> _V:
        if isinstance(node, ast.Constant) and isinstance(node.value, (bool, int)):
            return _c(node.value)
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in self.functions or node.keywords:
                raise NotYetSupportedError(f"call {ast.unparse(node)!r} cannot be lowered to NKI: only positional "
                                           f"calls of the analysis functions ({sorted(self.functions)})")
            return self.body(self.functions[node.func.id], [self.lower(a) for a in node.args])
        if isinstance(node, ast.Subscript):
            return self._subscript(node)
        if isinstance(node, ast.Name):
            if node.id not in self.env:
                raise KernelError(f"unknown name {node.id!r} in a mask expression; known: {sorted(self.env)}")
            return self.env[node.id]
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.Not):
                return self._not(self.lower(node.operand))
            v = self._as_int(self.lower(node.operand))
            if isinstance(node.op, ast.UAdd):
                return v
            if isinstance(node.op, ast.USub):
                return _c(-v.const) if v.is_const else self._emit(f"nl.multiply({v.text}, -1)", False)
        if isinstance(node, ast.BinOp):
            a, b = self._as_int(self.lower(node.left)), self._as_int(self.lower(node.right))
            op = type(node.op)
            if op in _ARITH:
                if a.is_const and b.is_const:
                    return _c({ast.Add: a.const + b.const, ast.Sub: a.const - b.const,
                               ast.Mult: a.const * b.const}[op])
                return self._emit(f"nl.{_ARITH[op]}({a.text}, {b.text})", False)
            if op in (ast.FloorDiv, ast.Mod):
                if not (b.is_const and b.const > 0):
                    raise NotYetSupportedError(f"'{ast.unparse(node)}': the NKI lowering needs a positive constant "
                                               f"divisor")
                if a.is_const:
                    return _c(_floordiv(a.const, b.const) if op is ast.FloorDiv else a.const % b.const)
                r = self._emit(f"nl.mod({a.text}, {b.text})", False)
                if op is ast.Mod:
                    return r
                d = self._emit(f"nl.subtract({a.text}, {r.text})", False)
                return self._emit(f"nl.divide({d.text}, {b.text}, dtype=nl.int32)", False)
        if isinstance(node, ast.Compare):
            parts: list[_V] = []
            left = self._as_int(self.lower(node.left))
            for op, rnode in zip(node.ops, node.comparators):
                right = self._as_int(self.lower(rnode))
                t = type(op)
                if t not in _CMP:
                    raise NotYetSupportedError(f"comparison {t.__name__} cannot be lowered to NKI")
                if left.is_const and right.is_const:
                    parts.append(_c({ast.Lt: left.const < right.const, ast.LtE: left.const <= right.const,
                                     ast.Gt: left.const > right.const, ast.GtE: left.const >= right.const,
                                     ast.Eq: left.const == right.const,
                                     ast.NotEq: left.const != right.const}[t]))
                elif left.is_const:      # keep the tile first: nl.greater(tile, c) for c < tile
                    parts.append(self._emit(f"nl.{_CMP[_MIRROR[t]]}({right.text}, {left.text})", True))
                else:
                    parts.append(self._emit(f"nl.{_CMP[t]}({left.text}, {right.text})", True))
                left = right
            return self._fold(parts, "logical_and")
        if isinstance(node, ast.BoolOp):
            vals = [self.lower(v) for v in node.values]
            if not all(v.is_bool for v in vals):
                raise NotYetSupportedError(f"'{ast.unparse(node)}': and/or over integers cannot be lowered to NKI")
            return self._fold(vals, "logical_and" if isinstance(node.op, ast.And) else "logical_or")
        if isinstance(node, ast.IfExp):
            c = self._truth(self.lower(node.test))
            a, b = self.lower(node.body), self.lower(node.orelse)
            if c.is_const:
                return a if c.const else b
            both_bool = a.is_bool and b.is_bool
            a, b = self._as_int(a), self._as_int(b)
            if a.is_const and b.is_const:
                if a.const == b.const:
                    out = a
                else:   # c * (a - b) + b, on a tile
                    t = self._emit(f"nl.multiply({c.text}, {_c(a.const - b.const).text}, dtype=nl.int32)", False)
                    out = self._emit(f"nl.add({t.text}, {b.text})", False)
            elif a.is_const:
                out = self._emit(f"nl.where({self._not(c).text}, {b.text}, {a.text})", False)
            else:
                out = self._emit(f"nl.where({c.text}, {a.text}, {b.text})", False)
            return self._truth(out) if both_bool else out
        raise NotYetSupportedError(
            f"expression {ast.unparse(node)!r} ({type(node).__name__}) cannot be lowered to NKI: supported are "
            f"integer constants, names, + - * // %, comparisons, and/or/not and conditional expressions")

    def _subscript(self, node: ast.Subscript) -> _V:
        """`(c0, c1, ...)[x]` or `TABLE[x]` with a small table of integer constants: a chain of
        nl.where over `x == k` (0 outside the range, as the Triton lowering reads it)."""
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, tuple):   # expr.lookup, long
            raise NotYetSupportedError(f"subscript of a {len(node.value.value)}-entry table: the NKI lowering "
                                       f"inlines at most {MAX_INLINE_TABLE} (as nl.where chains)")
        if isinstance(node.value, ast.Tuple):
            items = [self.lower(e) for e in node.value.elts]
            if not all(v.is_const for v in items):
                raise NotYetSupportedError(f"subscript {ast.unparse(node)!r}: tuple items must be constants")
            values = [int(v.const) for v in items]
        elif isinstance(node.value, ast.Name) and node.value.id in self.tables:
            values = [int(x) for x in self.tables[node.value.id]]
        else:
            raise NotYetSupportedError(f"subscript {ast.unparse(node)!r} cannot be lowered to NKI")
        if len(values) > MAX_INLINE_TABLE:
            raise NotYetSupportedError(f"subscript {ast.unparse(node)!r}: a table of {len(values)} entries; the NKI "
                                       f"lowering inlines at most {MAX_INLINE_TABLE} (as nl.where chains)")
        idx = self._as_int(self.lower(node.slice))
        if idx.is_const:
            k = int(idx.const)
            return _c(values[k] if 0 <= k < len(values) else 0)
        out = self._emit(f"nl.multiply({idx.text}, 0)", False)
        for k, val in enumerate(values):
            if val != 0:
                hit = self._emit(f"nl.equal({idx.text}, {k})", True)
                out = self._emit(f"nl.where({self._not(hit).text}, {out.text}, {_c(val).text})", False)
        return out

    def mask(self, node: ast.expr, tile: str) -> str:
        """The boolean tile of `node`; a constant becomes a tile through `tile` (compared to itself)."""
        v = self._truth(self.lower(node))
        if v.is_const:
            v = self._emit(f"nl.{'equal' if v.const else 'not_equal'}({tile}, {tile})", True)
        return v.text


@dataclass(frozen=True)
class LoweredMask:
    """Statements computing a mask tile, and the name holding it."""

    lines: tuple[str, ...]
    name: str


def lower_mask(pattern, qi: str = "qi", kj: str = "kj", prefix: str = "m_") -> LoweredMask:
    """The pattern's exact membership test M(i, j) as NKI statements over the int32 index tiles
    `qi` (query positions) and `kj` (key positions)."""
    node = pattern.predicate(ast.Name("i", ast.Load()), ast.Name("j", ast.Load()))
    low = NkiLowering({"i": qi, "j": kj}, prefix)
    name = low.mask(node, qi)
    return LoweredMask(tuple(low.lines), name)


def lower_function_mask(module: ast.Module, name: str, args: list[str], tile: str,
                        prefix: str = "m_", tables: dict[str, Any] | None = None) -> LoweredMask:
    """The boolean tile of the synthesized function `name` of `module` (e.g. mask_func) with its
    parameters bound to the tiles `args`, other functions of the module inlined, subscripts of
    small `tables` (at most MAX_INLINE_TABLE entries) as nl.where chains."""
    functions = {s.name: s for s in module.body if isinstance(s, ast.FunctionDef)}
    low = NkiLowering({}, prefix, functions)
    low.tables = {k: tuple(int(x) for x in v) for k, v in (tables or {}).items()}
    v = low._truth(low.body(find_function(module, name), [_V(check_identifier(a, "tile name"), False)
                                                            for a in args]))
    if v.is_const:
        v = low._emit(f"nl.{'equal' if v.const else 'not_equal'}({tile}, {tile})", True)
    return LoweredMask(tuple(low.lines), v.text)


def lower_function_value(module: ast.Module, name: str, args: list[str], tile: str, prefix: str = "k_",
                         tables: dict[str, Any] | None = None) -> LoweredMask:
    """The int32 tile of the synthesized function `name` of `module` (e.g. slot_key_func) with
    its parameters bound to the tiles `args`; a constant result becomes a tile through `tile`."""
    functions = {s.name: s for s in module.body if isinstance(s, ast.FunctionDef)}
    low = NkiLowering({}, prefix, functions)
    low.tables = {k: tuple(int(x) for x in v) for k, v in (tables or {}).items()}
    v = low._as_int(low.body(find_function(module, name), [_V(check_identifier(a, "tile name"), False)
                                                           for a in args]))
    if v.is_const:
        z = low._emit(f"nl.multiply({tile}, 0)", False)
        v = low._emit(f"nl.add({z.text}, {v.text})", False)
    return LoweredMask(tuple(low.lines), v.text)


__all__ = ["EXACT_INT", "LoweredMask", "NkiLowering", "lower_function_mask", "lower_function_value", "lower_mask"]
