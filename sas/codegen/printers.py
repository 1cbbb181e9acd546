"""One walker over the integer Python AST expressions of sas, with one printer per target
language: Triton, torch and C++ (CUDA device code).

Inputs are the expressions that `Pattern.predicate(i, j)` builds and the bodies of the
synthesized `cache_id_func` / `mask_func` (docs/architecture.md): integer and boolean
constants, parameter names, `+ - * // %`, unary `-`, comparisons (chained too), `and` / `or`
/ `not`, conditional expressions and `TABLE[expr]` subscripts of module-level tables. A body
may assign local names before its `return` (they become generated local variables) and call
the other functions of its module (inlined).

`ExprWalker` decides everything that does not depend on the target: constant folding (so
`not True` never reaches Triton as `~True`, which Python would turn into -2), the int/bool
typing of each value, Python's value semantics of `and` / `or` on integers, function inlining
and table guards. A `Printer` only spells the result:

- Triton / torch evaluate every operand (there is no short-circuit on tensors): `and` / `or`
  / `not` become `&` / `|` / `== 0` on boolean tensors, `a if c else b` a `where`, and
  `TABLE[x]` a masked load (Triton) or a clamped gather (torch) reading 0 where `x` is outside
  `[0, len(TABLE))`; Python would only evaluate such an index under a true guard, here it is
  evaluated anyway and the mask keeps it in bounds.
- C++ uses `&` / `|` (every term evaluated) / `?:` on `bool` and the kernel's integer type, and `TABLE[x]` reads
  `((x) >= 0 && (x) < n) ? tbl[x] : 0`; constants outside the 32-bit range carry an `LL`
  suffix, so the arithmetic is done in 64 bits exactly where Triton would promote too.

`//` and `%` keep C semantics in every target; the contract guarantees non-negative left
operands wherever the result matters, so this equals Python's floor semantics there.
"""

from __future__ import annotations

import ast
import keyword
import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from sas.errors import KernelError, NotYetSupportedError

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

#: C++ keywords and names the generated CUDA code defines, refused as generated identifiers
#: (Python keywords are refused for every target)
_CPP_RESERVED = frozenset("""
    alignas alignof and and_eq asm auto bitand bitor bool break case catch char class compl const constexpr
    const_cast continue decltype default delete do double dynamic_cast else enum explicit export extern false
    float for friend goto if inline int long mutable namespace new noexcept not not_eq nullptr operator or
    or_eq private protected public register reinterpret_cast return short signed sizeof static static_assert
    static_cast struct switch template this throw true try typedef typeid typename union unsigned using
    virtual void volatile wchar_t while xor xor_eq
""".split())


def check_identifier(name: object, what: str = "identifier") -> str:
    """Return `name` if it is a plain ASCII Python identifier (and not a keyword), else raise."""
    if not isinstance(name, str) or not _IDENT.match(name) or keyword.iskeyword(name):
        raise KernelError(
            f"{what} {name!r} cannot be used in generated code: it must be an ASCII identifier "
            f"(letters, digits and '_', not starting with a digit, not a Python keyword)"
        )
    return name


def check_cpp_identifier(name: object, what: str = "identifier") -> str:
    """`check_identifier`, and not a C++ keyword either."""
    check_identifier(name, what)
    if name in _CPP_RESERVED:
        raise KernelError(f"{what} {name!r} cannot be used in generated C++ code: it is a C++ keyword")
    return name  # type: ignore[return-value]


@dataclass(frozen=True)
class TableRef:
    """A module-level table as seen from generated code: the argument (tensor) name holding it,
    and its values (used for the bounds guard and to fold constant subscripts)."""

    arg: str
    values: tuple[int, ...] = field(repr=False)

    def __post_init__(self):
        check_identifier(self.arg, "table argument name")

    @property
    def length(self) -> int:
        return len(self.values)


@dataclass(frozen=True)
class _V:
    """A lowered value: its text, whether it is boolean, and its value when constant."""

    text: str
    is_bool: bool
    const: int | bool | None = None

    @property
    def is_const(self) -> bool:
        return self.const is not None


_INT64 = (-(1 << 63), (1 << 63) - 1)
_INT32 = (-(1 << 31), (1 << 31) - 1)

_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%"}
_CMPOPS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}


# --- printers --------------------------------------------------------------------------------


class Printer:
    """How one target language spells the walker's values (see the module doc). Every method
    gets operand texts that are already parenthesized where needed and returns a text that is
    safe to embed anywhere (parenthesized)."""

    name = "?"

    def check_name(self, name: str, what: str) -> str:
        return check_identifier(name, what)

    def const(self, value: int | bool) -> str:
        if isinstance(value, bool):
            return "True" if value else "False"
        return str(int(value)) if value >= 0 else f"({int(value)})"

    def where(self, c: str, a: str, b: str) -> str:
        raise NotImplementedError

    def ne0(self, x: str) -> str:
        return f"({x} != 0)"

    def eq0(self, x: str) -> str:
        return f"({x} == 0)"

    def neg(self, x: str) -> str:
        return f"(-{x})"

    def binop(self, a: str, op: str, b: str) -> str:
        return f"({a} {op} {b})"

    def compare(self, a: str, op: str, b: str) -> str:
        return f"({a} {op} {b})"

    def conj(self, items: Sequence[str]) -> str:
        return "(" + " & ".join(items) + ")"

    def disj(self, items: Sequence[str]) -> str:
        return "(" + " | ".join(items) + ")"

    def table(self, ref: TableRef, idx: str) -> str:
        raise NotImplementedError

    def assign(self, name: str, text: str) -> str:
        """A statement binding the local `name` to `text` (one generated line)."""
        return f"{name} = {text}"


class TritonPrinter(Printer):
    name = "triton"

    def where(self, c: str, a: str, b: str) -> str:
        return f"tl.where({c}, {a}, {b})"

    def table(self, ref: TableRef, idx: str) -> str:
        guard = f"(({idx} >= 0) & ({idx} < {ref.length}))"
        return f"tl.load({ref.arg} + {idx}, mask={guard}, other=0)"


class GluonPrinter(Printer):
    """Triton's Gluon dialect (the Hopper prefill kernel): `gl.where`; no tables (the prefill
    predicate reads none)."""
    name = "gluon"

    def where(self, c: str, a: str, b: str) -> str:
        return f"gl.where({c}, {a}, {b})"


class TorchPrinter(Printer):
    name = "torch"

    def where(self, c: str, a: str, b: str) -> str:
        return f"torch.where({c}, {a}, {b})"

    def table(self, ref: TableRef, idx: str) -> str:
        guard = f"(({idx} >= 0) & ({idx} < {ref.length}))"
        return self.where(guard, f"{ref.arg}[{idx}.clamp(0, {ref.length - 1})]", "0")


class CppPrinter(Printer):
    """C++ for CUDA device code: variables are ints of the kernel's integer type (`int`
    positions and slots, as Triton's), booleans are `bool`, tables `const int*` arguments."""

    name = "cpp"

    def check_name(self, name: str, what: str) -> str:
        return check_cpp_identifier(name, what)

    def const(self, value: int | bool) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        v = int(value)
        if v == _INT64[0]:
            return "(-9223372036854775807LL - 1)"
        text = str(abs(v)) + ("" if _INT32[0] < v <= _INT32[1] else "LL")
        return text if v >= 0 else f"(-{text})"

    def where(self, c: str, a: str, b: str) -> str:
        return f"({c} ? {a} : {b})"

    def eq0(self, x: str) -> str:
        return f"(!{x})" if x.startswith("(") else f"(!({x}))"

    def binop(self, a: str, op: str, b: str) -> str:
        return f"({a} {'/' if op == '//' else op} {b})"

    # Conjunctions and disjunctions evaluate every term (`&` / `|` on bools): the terms are pure
    # integer tests (constant divisors, guarded table reads), and without short-circuit branches
    # nvcc predicates a tile's per-cell masks instead of branching on every cell.
    def conj(self, items: Sequence[str]) -> str:
        return "(" + " & ".join(items) + ")"

    def disj(self, items: Sequence[str]) -> str:
        return "(" + " | ".join(items) + ")"

    def table(self, ref: TableRef, idx: str) -> str:
        return f"((({idx} >= 0) && ({idx} < {ref.length})) ? {ref.arg}[{idx}] : 0)"

    def assign(self, name: str, text: str) -> str:
        return f"const auto {name} = {text};"


PRINTERS: dict[str, Printer] = {p.name: p for p in (TritonPrinter(), GluonPrinter(), TorchPrinter(), CppPrinter())}


def printer_for(dialect: str) -> Printer:
    p = PRINTERS.get(dialect) if isinstance(dialect, str) else None
    if p is None:
        raise KernelError(f"unknown lowering dialect {dialect!r}: expected one of {', '.join(map(repr, PRINTERS))}")
    return p


# --- constant folding (C semantics, as the kernels compute) ----------------------------------


def _fold_bin(op: type, a: int, b: int) -> int:
    if op is ast.Add:
        return a + b
    if op is ast.Sub:
        return a - b
    if op is ast.Mult:
        return a * b
    if b == 0:
        raise KernelError("generated expression divides by the constant 0")
    # C semantics (truncation), as the kernel would compute; equal to Python's for a >= 0.
    q = abs(a) // abs(b)
    q = q if (a >= 0) == (b > 0) else -q
    return q if op is ast.FloorDiv else a - q * b


def _fold_cmp(op: type, a: int, b: int) -> bool:
    return {ast.Lt: a < b, ast.LtE: a <= b, ast.Gt: a > b, ast.GtE: a >= b,
            ast.Eq: a == b, ast.NotEq: a != b}[op]


# --- the walker ------------------------------------------------------------------------------


class ExprWalker:
    """Lowers one expression language to text through `printer`.

    `names` maps each parameter name of the source expression to the text it stands for in
    the generated code (e.g. {"i": "qi", "j": "kj"}); `tables` maps table names to TableRefs.
    """

    def __init__(self, names: Mapping[str, str], tables: Mapping[str, TableRef] | None = None,
                 printer: Printer | str = "triton", functions: Mapping[str, ast.FunctionDef] | None = None,
                 prefix: str = "t_"):
        self.printer = printer_for(printer) if isinstance(printer, str) else printer
        self.dialect = self.printer.name
        self.env: dict[str, _V] = {}
        for k, v in names.items():
            check_identifier(k, "parameter name")
            self.env[k] = _V(self.printer.check_name(v, "generated variable name"), False)
        self.tables = dict(tables or {})
        for k in self.tables:
            check_identifier(k, "table name")
        self.functions = dict(functions or {})
        self.prefix = self.printer.check_name(prefix, "generated name prefix")
        #: statements `name = expr` that must precede the lowered expression (function bodies
        #: with local assignments), in order, spelled by the printer.
        self.lines: list[str] = []
        self._fresh = 0
        self._depth = 0

    # -- entry points -------------------------------------------------------------------------
    def value(self, node: ast.expr) -> str:
        """Text of the expression's value (ints stay ints, booleans stay booleans)."""
        return self._lower(node).text

    def boolean(self, node: ast.expr) -> str:
        """Text of the expression's truth value."""
        return self._truth(self._lower(node)).text

    # -- helpers ------------------------------------------------------------------------------
    def _c(self, value: int | bool) -> _V:
        if isinstance(value, bool):
            return _V(self.printer.const(value), True, value)
        if not _INT64[0] <= value <= _INT64[1]:
            raise KernelError(f"generated expression needs the integer constant {value}, outside the int64 "
                              f"range [-2**63, 2**63 - 1] that kernels compute in")
        return _V(self.printer.const(int(value)), False, int(value))

    def _where(self, c: str, a: str, b: str) -> str:
        return self.printer.where(c, a, b)

    def _truth(self, v: _V) -> _V:
        if v.is_bool:
            return v
        if v.is_const:
            return self._c(bool(v.const))
        return _V(self.printer.ne0(v.text), True)

    def _not(self, v: _V) -> _V:
        v = self._truth(v)
        if v.is_const:
            return self._c(not v.const)
        return _V(self.printer.eq0(v.text), True)

    def _as_int(self, v: _V) -> _V:
        """Booleans used as numbers (Python allows True + 1) become 0/1 integers."""
        if not v.is_bool:
            return v
        if v.is_const:
            return self._c(int(v.const))
        return _V(self._where(v.text, "1", "0"), False)

    # -- the recursive lowering ---------------------------------------------------------------
    def _lower(self, node: ast.expr) -> _V:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool):
                return self._c(node.value)
            if isinstance(node.value, int):
                return self._c(node.value)
            raise NotYetSupportedError(
                f"constant {node.value!r} ({type(node.value).__name__}) cannot be lowered: only "
                f"integer and boolean constants are supported"
            )
        if isinstance(node, ast.Name):
            if node.id in self.env:
                return self.env[node.id]
            if node.id in self.tables:
                raise KernelError(f"table {node.id!r} used without a subscript")
            raise KernelError(
                f"unknown name {node.id!r} in expression; known names: {sorted(self.env)}"
            )
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.Not):
                return self._not(self._lower(node.operand))
            v = self._as_int(self._lower(node.operand))
            if isinstance(node.op, ast.USub):
                return self._c(-v.const) if v.is_const else _V(self.printer.neg(v.text), False)
            if isinstance(node.op, ast.UAdd):
                return v
            raise NotYetSupportedError(f"unary operator {type(node.op).__name__} cannot be lowered")
        if isinstance(node, ast.BinOp):
            op = type(node.op)
            if op not in _BINOPS:
                raise NotYetSupportedError(
                    f"binary operator {op.__name__} cannot be lowered: supported are + - * // %"
                )
            a, b = self._as_int(self._lower(node.left)), self._as_int(self._lower(node.right))
            if a.is_const and b.is_const:
                return self._c(_fold_bin(op, a.const, b.const))
            if op in (ast.FloorDiv, ast.Mod) and not (b.is_const and b.const > 0):
                raise NotYetSupportedError(
                    f"'{_BINOPS[op]}' needs a positive constant right operand in generated code, "
                    f"got {ast.unparse(node.right)!r}"
                )
            return _V(self.printer.binop(a.text, _BINOPS[op], b.text), False)
        if isinstance(node, ast.Compare):
            parts: list[_V] = []
            left = self._lower(node.left)
            for op, right_node in zip(node.ops, node.comparators):
                if type(op) not in _CMPOPS:
                    raise NotYetSupportedError(f"comparison {type(op).__name__} cannot be lowered")
                right = self._lower(right_node)
                a, b = self._as_int(left), self._as_int(right)
                if a.is_const and b.is_const:
                    parts.append(self._c(_fold_cmp(type(op), a.const, b.const)))
                else:
                    parts.append(_V(self.printer.compare(a.text, _CMPOPS[type(op)], b.text), True))
                left = right
            return self._conj(parts)
        if isinstance(node, ast.BoolOp):
            raw = [self._lower(v) for v in node.values]
            is_and = isinstance(node.op, ast.And)
            if all(v.is_bool for v in raw):
                return self._conj(raw) if is_and else self._disj(raw)
            # Integer operands: Python's value semantics (`a and b` is b when a is truthy, else a).
            out = self._as_int(raw[-1])
            for v in reversed(raw[:-1]):
                t, vi = self._truth(v), self._as_int(v)
                if t.is_const:
                    out = out if bool(t.const) == is_and else vi
                else:
                    a, b = (out, vi) if is_and else (vi, out)
                    out = _V(self._where(t.text, a.text, b.text), False)
            return out
        if isinstance(node, ast.IfExp):
            c = self._truth(self._lower(node.test))
            a, b = self._lower(node.body), self._lower(node.orelse)
            if c.is_const:
                return a if c.const else b
            if a.is_bool != b.is_bool:
                a, b = self._as_int(a), self._as_int(b)
            if a.is_const and b.is_const and a.const == b.const:
                return a
            return _V(self._where(c.text, a.text, b.text), a.is_bool)
        if isinstance(node, ast.Subscript):
            return self._subscript(node)
        raise NotYetSupportedError(
            f"expression node {type(node).__name__} ({ast.unparse(node)!r}) cannot be lowered to "
            f"{self.dialect}: supported are integer constants, names, + - * // %, comparisons, "
            f"and/or/not, conditional expressions and TABLE[index]"
        )

    def _conj(self, vals: Sequence[_V]) -> _V:
        if any(v.is_const and not v.const for v in vals):
            return self._c(False)
        rest = [v for v in vals if not v.is_const]
        if not rest:
            return self._c(True)
        if len(rest) == 1:
            return rest[0]
        return _V(self.printer.conj([v.text for v in rest]), True)

    def _disj(self, vals: Sequence[_V]) -> _V:
        if any(v.is_const and v.const for v in vals):
            return self._c(True)
        rest = [v for v in vals if not v.is_const]
        if not rest:
            return self._c(False)
        if len(rest) == 1:
            return rest[0]
        return _V(self.printer.disj([v.text for v in rest]), True)

    # -- function bodies ------------------------------------------------------------------------
    def body(self, fdef: ast.FunctionDef, args: Sequence[_V]) -> _V:
        """Lower a function body (`name = expr` assignments, then `return expr`) with its
        parameters bound to `args`; assignments become `self.lines`."""
        params = _params(fdef)
        if len(params) != len(args):
            raise KernelError(f"function {fdef.name!r} takes {len(params)} parameters, {len(args)} given")
        self._depth += 1
        if self._depth > 16:
            raise NotYetSupportedError(f"function {fdef.name!r}: calls nest too deep (recursion?)")
        saved = self.env
        self.env = dict(zip(params, args))
        try:
            stmts = _body_statements(fdef)
            for stmt in stmts[:-1]:
                if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                        and isinstance(stmt.targets[0], ast.Name)):
                    raise NotYetSupportedError(
                        f"function {fdef.name!r}: statement {ast.unparse(stmt)!r} cannot be lowered; "
                        f"a body is 'name = <expr>' assignments followed by 'return <expr>'"
                    )
                target = stmt.targets[0].id
                v = self._lower(stmt.value)
                if not v.is_const:
                    fresh = self.printer.check_name(f"{self.prefix}{target}_{self._fresh}", "generated name")
                    self._fresh += 1
                    self.lines.append(self.printer.assign(fresh, v.text))
                    v = _V(fresh, v.is_bool)
                self.env[target] = v
            return self._lower(stmts[-1].value)
        finally:
            self.env = saved
            self._depth -= 1

    def _call(self, node: ast.Call) -> _V:
        if not isinstance(node.func, ast.Name) or node.func.id not in self.functions or node.keywords:
            raise NotYetSupportedError(
                f"call {ast.unparse(node)!r} cannot be lowered: only positional calls of the "
                f"analysis functions ({sorted(self.functions)}) are supported"
            )
        args = [self._lower(a) for a in node.args]
        return self.body(self.functions[node.func.id], args)

    def _tuple_subscript(self, node: ast.Subscript) -> _V:
        """`(c0, c1, ...)[x]` with integer constants: a chain of selects (0 out of range)."""
        if isinstance(node.value, ast.Constant):          # one node holding a long tuple (expr.lookup)
            values = [int(v) for v in node.value.value]
            items: list[ast.expr] = []
        else:
            items = node.value.elts  # type: ignore[attr-defined]
            values = []
        for e in items:
            v = self._lower(e)
            if not v.is_const:
                raise NotYetSupportedError(f"subscript {ast.unparse(node)!r}: tuple items must be constants")
            values.append(int(v.const))
        if len(values) > 256:
            raise NotYetSupportedError(f"subscript of a {len(values)}-item tuple literal: at most 256 items "
                                       f"are inlined; use a module-level table")
        idx = self._as_int(self._lower(node.slice))
        if idx.is_const:
            k = int(idx.const)
            return self._c(values[k] if 0 <= k < len(values) else 0)
        is_bool = all(isinstance(e, ast.Constant) and isinstance(e.value, bool) for e in items)
        if is_bool:
            on = [k for k, v in enumerate(values) if v]
            return (self._disj([_V(self.printer.compare(idx.text, "==", str(k)), True) for k in on]) if on
                    else self._c(False))
        out = "0"
        for k in reversed(range(len(values))):
            if values[k] != 0:
                out = self._where(self.printer.compare(idx.text, "==", str(k)), self._c(values[k]).text, out)
        return _V(out, False) if out != "0" else self._c(0)

    def _subscript(self, node: ast.Subscript) -> _V:
        if isinstance(node.value, ast.Tuple) or (isinstance(node.value, ast.Constant)
                                                 and isinstance(node.value.value, tuple)):
            return self._tuple_subscript(node)
        if not isinstance(node.value, ast.Name) or node.value.id not in self.tables:
            raise KernelError(
                f"subscript {ast.unparse(node)!r}: only module-level tables can be indexed; "
                f"known tables: {sorted(self.tables)}"
            )
        sl = node.slice
        if isinstance(sl, ast.Slice) or (isinstance(sl, ast.Tuple)):
            raise NotYetSupportedError(f"subscript {ast.unparse(node)!r}: only a single integer index is supported")
        table = self.tables[node.value.id]
        idx = self._as_int(self._lower(sl))
        if idx.is_const:
            k = int(idx.const)
            return self._c(int(table.values[k]) if 0 <= k < table.length else 0)
        if table.length == 0:
            return self._c(0)
        return _V(self.printer.table(table, idx.text), False)


# --- function bodies and module helpers --------------------------------------------------------


def find_function(module: ast.Module, name: str) -> ast.FunctionDef:
    for stmt in module.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == name:
            return stmt
    raise KernelError(f"the analysis functions define no {name!r}")


def _params(fdef: ast.FunctionDef) -> list[str]:
    a = fdef.args
    if a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs or a.defaults:
        raise NotYetSupportedError(f"function {fdef.name!r}: only plain positional parameters are supported")
    return [check_identifier(p.arg, "parameter name") for p in a.args]


def _body_statements(fdef: ast.FunctionDef) -> list[ast.stmt]:
    body = [s for s in fdef.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                         and isinstance(s.value.value, str))]
    if not body or not isinstance(body[-1], ast.Return) or body[-1].value is None:
        raise NotYetSupportedError(
            f"function {fdef.name!r}: only bodies ending in 'return <expr>' can be lowered"
        )
    return body


@dataclass(frozen=True)
class LoweredFunction:
    """A function inlined into generated code: `lines` (local assignments, in order) then
    the expression `expr`."""

    lines: tuple[str, ...]
    expr: str


def lower_expr(node: ast.expr, names: Mapping[str, str], tables: Mapping[str, TableRef] | None = None,
               *, boolean: bool = False, dialect: str = "triton") -> str:
    """Lower one expression; `boolean=True` lowers its truth value."""
    low = ExprWalker(names, tables, dialect)
    return low.boolean(node) if boolean else low.value(node)


def lower_predicate(pattern, i: str, j: str, *, dialect: str = "triton") -> str:
    """The pattern's exact membership test over the generated variables `i` (query position)
    and `j` (key position)."""
    node = pattern.predicate(ast.Name("i", ast.Load()), ast.Name("j", ast.Load()))
    return lower_expr(node, {"i": i, "j": j}, boolean=True, dialect=dialect)


def lower_function(fdef: ast.FunctionDef, args: Sequence[str], tables: Mapping[str, TableRef] | None = None,
                   *, boolean: bool = False, dialect: str = "triton", module: ast.Module | None = None,
                   prefix: str = "t_") -> LoweredFunction:
    """Inline a function: its parameters are replaced by `args` (generated variable names,
    positionally); local assignments become lines named `prefix + name + _k`; calls of other
    functions of `module` are inlined too."""
    functions = {} if module is None else {s.name: s for s in module.body if isinstance(s, ast.FunctionDef)}
    low = ExprWalker({}, tables, dialect, functions, prefix)
    v = low.body(fdef, [_V(low.printer.check_name(check_identifier(a, "generated variable name"),
                                                  "generated variable name"), False) for a in args])
    if boolean:
        v = low._truth(v)
    return LoweredFunction(tuple(low.lines), v.text)


def table_refs(tables: Mapping[str, Sequence[int]], prefix: str = "tbl_") -> dict[str, TableRef]:
    """TableRefs for the analysis tables, each passed to kernels as argument `prefix + name`."""
    out: dict[str, TableRef] = {}
    for name, values in tables.items():
        check_identifier(name, "table name")
        out[name] = TableRef(check_identifier(prefix + name, "table argument name"),
                             tuple(np.asarray(values, dtype=np.int64).tolist()))
    return out
