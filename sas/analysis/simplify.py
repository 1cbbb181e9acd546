"""Readable synthesized functions: the ASTs of `sas.analysis.functions` simplified with sympy.

Synthesis composes the functions from parts (slot scheme, key unranking, the pattern's own
predicate), which leaves redundancy a reader has to see through: conditions tested twice,
conditionals nested under the condition they repeat. `simplify_module` removes it:

- every boolean expression (comparisons, `and` / `or` / `not`) becomes a sympy formula over
  its comparisons (integer symbols; `//`, `%` and conditionals inside stay opaque atoms) and is
  minimised with `sympy.simplify_logic`; each comparison is printed back in a fixed
  orientation (`token_id - key < 1024`, `key <= token_id`);
- a conditional expression whose test is decided by the tests of the conditionals around it
  (the same comparison, or a contradiction sympy finds) collapses to its branch, and one whose
  branches are equal to that branch;
- a name assigned plain arithmetic once is substituted into the lines after it, and integer
  arithmetic is collected where it gets shorter (`cnt - 1 - (cnt - 1 - cache_id + 1024) % 1024`
  with `cnt = token_id + 1` -> `token_id - (token_id - cache_id) % 1024`).

The rewrite never changes a value: `check_equal` evaluates the original and the simplified
functions (numpy, vectorized) on every slot and on every query row of the boundary, the first
periods and the last rows before max_len, `check_python` runs both in Python on a sample of
those points (short-circuit evaluation, exceptions), and `readable_functions` keeps the
original where they differ. Expressions whose evaluation a guard protects (subscripts, calls,
division by a variable) are never reordered. The kernels are generated from the original functions; the simplified ones are
what `sas inspect` and compile reports print.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import sympy as sp

from sas.analysis.expr import constant_tuple

#: the functions a person reads, in module order
FUNCTIONS = ("cache_id_func", "slot_key_func", "mask_func")
#: preferred sign of a variable in a printed comparison (earlier = printed with a + sign)
_ORDER = ("token_id", "cache_id")
#: largest grid (slots x query rows) `check_equal` evaluates
MAX_CHECK_POINTS = 1 << 22
#: points (slots x query rows) `check_equal` evaluates at once
CHECK_BLOCK_POINTS = 1 << 16
#: most cache slots the check compares (every slot -1 .. cache_size up to this; beyond it the
#: first and last quarter and an even sample: time and memory stay bounded at any cache size)
MAX_CHECK_SLOTS = 1 << 16

_CMP = {ast.Lt: sp.Lt, ast.LtE: sp.Le, ast.Gt: sp.Gt, ast.GtE: sp.Ge, ast.Eq: sp.Eq, ast.NotEq: sp.Ne}
_REL = {sp.StrictLessThan: ast.Lt, sp.LessThan: ast.LtE, sp.StrictGreaterThan: ast.Gt,
        sp.GreaterThan: ast.GtE, sp.Equality: ast.Eq, sp.Unequality: ast.NotEq}
_FLIP = {ast.Lt: ast.Gt, ast.LtE: ast.GtE, ast.Gt: ast.Lt, ast.GtE: ast.LtE, ast.Eq: ast.Eq, ast.NotEq: ast.NotEq}


def _is_bool(node: ast.expr) -> bool:
    if isinstance(node, (ast.Compare, ast.BoolOp)):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return True
    if isinstance(node, ast.Constant):
        return isinstance(node.value, bool)
    if isinstance(node, ast.IfExp):
        return _is_bool(node.body) and _is_bool(node.orelse)
    return False


class _Translator:
    """AST <-> sympy for one function: names become integer symbols, anything else that is
    not linear arithmetic or boolean structure becomes an opaque atom."""

    def __init__(self) -> None:
        self.opaque: dict[str, ast.expr] = {}
        self.by_dump: dict[str, sp.Symbol] = {}

    def _atom(self, node: ast.expr, boolean: bool) -> sp.Symbol:
        key = ast.dump(node)
        if key not in self.by_dump:
            name = f"_o{len(self.by_dump)}"
            sym = sp.Symbol(name) if boolean else sp.Symbol(name, integer=True)
            self.by_dump[key], self.opaque[name] = sym, node
        return self.by_dump[key]

    def num(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Name):
            return sp.Symbol(node.id, integer=True)
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return sp.Integer(node.value)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
            a, b = self.num(node.left), self.num(node.right)
            if isinstance(node.op, ast.Mult) and not (a.is_Number or b.is_Number):
                return self._atom(node, False)
            return a + b if isinstance(node.op, ast.Add) else a - b if isinstance(node.op, ast.Sub) else a * b
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -self.num(node.operand)
        return self._atom(node, False)

    def boolean(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, bool):
            return sp.true if node.value else sp.false
        if isinstance(node, ast.BoolOp):
            parts = [self.boolean(v) for v in node.values]
            return sp.And(*parts) if isinstance(node.op, ast.And) else sp.Or(*parts)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return sp.Not(self.boolean(node.operand))
        if isinstance(node, ast.Compare) and all(type(op) in _CMP for op in node.ops):
            terms = [self.num(x) for x in [node.left, *node.comparators]]
            return sp.And(*[_CMP[type(op)](a, b, evaluate=False)
                            for op, a, b in zip(node.ops, terms, terms[1:])])
        return self._atom(node, True)

    # --- back to Python ----------------------------------------------------------------------
    def _linear(self, expr: Any) -> ast.expr:
        coeffs = expr.as_coefficients_dict()
        terms = [(s, int(c)) for s, c in coeffs.items() if s != 1]
        terms.sort(key=lambda t: (t[1] < 0, self._rank(t[0])))
        out: ast.expr | None = None
        for s, c in terms:
            base = self._symbol(s)
            mag = abs(c)
            term = base if mag == 1 else ast.BinOp(ast.Constant(mag), ast.Mult(), base)
            if out is None:
                out = term if c > 0 else ast.UnaryOp(ast.USub(), term)
            else:
                out = ast.BinOp(out, ast.Add() if c > 0 else ast.Sub(), term)
        const = int(coeffs.get(sp.S.One, 0))
        if out is None:
            return ast.Constant(const)
        if const:
            out = ast.BinOp(out, ast.Add() if const > 0 else ast.Sub(), ast.Constant(abs(const)))
        return out

    def _rank(self, s: Any) -> tuple[int, str]:
        return _name_rank(str(s))

    def _symbol(self, s: Any) -> ast.expr:
        name = str(s)
        if name in self.opaque:
            return copy.deepcopy(self.opaque[name])
        return ast.Name(name, ast.Load())

    def _relation(self, rel: Any) -> ast.expr:
        op = _REL[type(rel)]
        diff = sp.expand(rel.lhs - rel.rhs)          # diff OP 0
        coeffs = diff.as_coefficients_dict()
        const = int(coeffs.get(sp.S.One, 0))
        linear = diff - const                        # linear OP -const
        terms = sorted((s for s in coeffs if s != 1), key=self._rank)
        if terms and coeffs[terms[0]] < 0:           # lead with a + sign: flip the comparison
            linear, const, op = -linear, -const, _FLIP[op]
        lc = linear.as_coefficients_dict()
        pos = [s for s, c in lc.items() if c == 1]
        neg = [s for s, c in lc.items() if c == -1]
        if const == 0 and len(lc) == 2 and len(pos) == 1 and len(neg) == 1:   # a - b OP 0  ->  a OP b
            return ast.Compare(self._symbol(pos[0]), [op()], [self._symbol(neg[0])])
        return ast.Compare(self._linear(linear), [op()], [ast.Constant(-const)])

    def to_ast(self, expr: Any) -> ast.expr:
        if expr is sp.true or expr is sp.false:
            return ast.Constant(bool(expr))
        if isinstance(expr, (sp.And, sp.Or)):
            values = [self.to_ast(a) for a in expr.args]
            if isinstance(expr, sp.And):
                values = _chain_bounds(values)
            values.sort(key=self._order_key)
            if len(values) == 1:
                return values[0]
            return ast.BoolOp(ast.And() if isinstance(expr, sp.And) else ast.Or(), values)
        if isinstance(expr, sp.Not):
            return ast.UnaryOp(ast.Not(), self.to_ast(expr.args[0]))
        if type(expr) in _REL:
            return self._relation(expr)
        if isinstance(expr, sp.Symbol):
            return self._symbol(expr)
        raise ValueError(f"cannot print {expr!r} back as Python")

    def _order_key(self, node: ast.expr) -> tuple[int, str]:
        """Conditions on the slot first, then the query, then the rest; compound ones last."""
        text = ast.unparse(node)
        if isinstance(node, ast.BoolOp):
            return (3, text)
        if "cache_id" in text:
            return (0, text)
        return (1, text) if "token_id" in text else (2, text)


def _bound(node: ast.expr) -> tuple[str, str, int, type] | None:
    """(dump of x, "lo" | "hi", constant, op) for `x >= c`, `x > c`, `x < c`, `x <= c`."""
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.comparators[0], ast.Constant)):
        return None
    op, c = type(node.ops[0]), node.comparators[0].value
    if op in (ast.GtE, ast.Gt):
        return ast.dump(node.left), "lo", c, op
    if op in (ast.Lt, ast.LtE):
        return ast.dump(node.left), "hi", c, op
    return None


def _chain_bounds(values: list[ast.expr]) -> list[ast.expr]:
    """`x >= a and x < b` -> `a <= x < b` (one lower and one upper bound of the same x)."""
    bounds = [_bound(v) for v in values]
    out: list[ast.expr] = []
    used: set[int] = set()
    for i, bi in enumerate(bounds):
        if i in used or bi is None or bi[1] != "lo":
            continue
        for k, bk in enumerate(bounds):
            if k not in used and bk is not None and bk[1] == "hi" and bk[0] == bi[0]:
                lower = ast.LtE() if bi[3] is ast.GtE else ast.Lt()
                out.append(ast.Compare(ast.Constant(bi[2]), [lower, bk[3]()],
                                       [values[i].left, ast.Constant(bk[2])]))
                used |= {i, k}
                break
    return out + [v for i, v in enumerate(values) if i not in used]


def _fragile(node: ast.expr) -> bool:
    """Whether evaluating `node` can fail where a guard before it (short-circuit) protects it:
    a subscript, a call, or `//` / `%` by a non-constant. Such expressions are never reordered."""
    for n in ast.walk(node):
        if isinstance(n, (ast.Subscript, ast.Call)):
            return True
        if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.FloorDiv, ast.Mod)) and not isinstance(n.right, ast.Constant):
            return True
    return False


_BOUND_OPS = (sp.StrictLessThan, sp.LessThan, sp.StrictGreaterThan, sp.GreaterThan, sp.Equality)


def _integer_node(node: ast.expr, plain: bool = False) -> bool:
    """Whether `node` has an integer value in the synthesized functions: names, int constants,
    and +, -, *, //, % (and unary -) of those; `plain`: +, -, unary - and * by a constant only."""
    if isinstance(node, ast.Name):
        return True
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _integer_node(node.operand, plain)
    if not isinstance(node, ast.BinOp):
        return False
    both = _integer_node(node.left, plain) and _integer_node(node.right, plain)
    if isinstance(node.op, (ast.Add, ast.Sub)):
        return both
    if isinstance(node.op, ast.Mult):
        return both and (not plain or isinstance(node.left, ast.Constant) or isinstance(node.right, ast.Constant))
    return both and not plain and isinstance(node.op, (ast.FloorDiv, ast.Mod))


def _merge_bounds(formula: Any, integers: set[Any] | None = None) -> Any:
    """In a conjunction, the comparisons of one integer linear form (`token_id - key >= -3`,
    `token_id - key < 7`, `token_id - key >= 0`) merged into its tightest bounds (`0 <= ... < 7`),
    or an equality where they meet (`a // 8 - b // 8 < 1 and a // 8 >= b // 8` -> `a // 8 ==
    b // 8`); only forms over `integers` (symbols known to hold integers; None: any symbol
    sympy takes for an integer), so that `x < c` is `x <= c - 1`. Forms with one comparison
    are left as they are."""
    if not isinstance(formula, sp.And):
        return formula
    groups: dict[Any, list[tuple[int | None, int | None, Any]]] = {}
    rest = []
    for a in formula.args:
        if type(a) not in _BOUND_OPS:
            rest.append(a)
            continue
        d = sp.expand(a.lhs - a.rhs)
        coeffs = d.as_coefficients_dict()
        const = coeffs.get(sp.S.One, 0)
        lin = d - const
        if lin == 0 or not all(c.is_Integer for c in lin.as_coefficients_dict().values()) \
                or not all(x.is_integer and (integers is None or x in integers) for x in lin.free_symbols):
            rest.append(a)
            continue
        b, op = -int(const), type(a)                    # lin OP b
        lead = min(lin.as_coefficients_dict().items(), key=lambda t: _name_rank(str(t[0])))
        flip = lead[1] < 0                              # the printer's orientation: lead with a + sign
        if flip:
            lin, b = -lin, -b
            op = {sp.StrictLessThan: sp.StrictGreaterThan, sp.LessThan: sp.GreaterThan,
                  sp.StrictGreaterThan: sp.StrictLessThan, sp.GreaterThan: sp.LessThan,
                  sp.Equality: sp.Equality}[op]
        lo = b + 1 if op is sp.StrictGreaterThan else b if op in (sp.GreaterThan, sp.Equality) else None
        hi = b - 1 if op is sp.StrictLessThan else b if op in (sp.LessThan, sp.Equality) else None
        groups.setdefault(lin, []).append((lo, hi, a))
    for lin, items in groups.items():
        if len(items) == 1:
            rest.append(items[0][2])
            continue
        los = [x[0] for x in items if x[0] is not None]
        his = [x[1] for x in items if x[1] is not None]
        lo, hi = (max(los) if los else None), (min(his) if his else None)
        if lo is not None and hi is not None and lo > hi:
            return sp.false
        if lo is not None and lo == hi:
            rest.append(sp.Eq(lin, lo, evaluate=False))
        elif len(items) > (lo is not None) + (hi is not None):       # a bound made redundant
            if lo is not None:
                rest.append(sp.GreaterThan(lin, lo, evaluate=False))
            if hi is not None:
                rest.append(sp.StrictLessThan(lin, hi + 1, evaluate=False))
        else:
            rest.extend(x[2] for x in items)
    return sp.And(*rest)


def _name_rank(name: str) -> tuple[int, str]:
    """The printing order of a symbol by name: token_id, cache_id, then the rest by name."""
    return (_ORDER.index(name), name) if name in _ORDER else (len(_ORDER), name)


def _simplify_bool(node: ast.expr) -> ast.expr:
    if _fragile(node):
        return node
    tr = _Translator()
    try:
        formula = sp.simplify_logic(tr.boolean(node), form="cnf", deep=False, force=False)
        integers = {sym for sym in formula.free_symbols
                    if str(sym) not in tr.opaque or _integer_node(tr.opaque[str(sym)])}
        formula = _merge_bounds(formula, integers)
        out = tr.to_ast(formula)
    except (ValueError, TypeError, KeyError):
        return node
    # a rewrite only replaces what it shortens
    return out if len(ast.unparse(out)) <= len(ast.unparse(node)) else node


class _Rewriter(ast.NodeTransformer):
    """Bottom-up: boolean expressions minimised; a conditional's test loses the comparisons the
    tests around it already decide (sympy, over the comparisons that share a variable), and the
    conditional collapses where its test is decided or its branches are equal."""

    def __init__(self) -> None:
        self.facts: list[Any] = []                  # sympy formulas true on this path
        self.tr = _Translator()

    def _decide(self, c: Any) -> bool | None:
        symbols = c.free_symbols
        relevant = [f for f in self.facts if f.free_symbols & symbols]
        if not relevant:
            return None
        try:
            if sp.simplify(sp.And(*relevant, sp.Not(c))) is sp.false:
                return True
            if sp.simplify(sp.And(*relevant, c)) is sp.false:
                return False
        except (TypeError, ValueError, RecursionError):
            return None
        return None

    def visit_IfExp(self, node: ast.IfExp) -> ast.expr:
        test = self.visit(node.test)
        if isinstance(test, ast.Constant) and isinstance(test.value, bool):
            return self.visit(node.body if test.value else node.orelse)
        formula = self.tr.boolean(test)
        parts = list(formula.args) if isinstance(formula, sp.And) else [formula]
        kept = []
        for c in parts:
            decided = self._decide(c)
            if decided is False:
                return self.visit(node.orelse)
            if decided is None:
                kept.append(c)
        if not kept:
            return self.visit(node.body)
        if len(kept) < len(parts) and not _fragile(test):
            test = self.tr.to_ast(sp.And(*kept))
        self.facts.append(formula)
        body = self.visit(node.body)
        self.facts[-1] = sp.Not(formula)
        orelse = self.visit(node.orelse)
        self.facts.pop()
        if ast.dump(body) == ast.dump(orelse):
            return body
        return ast.IfExp(test, body, orelse)

    def _boolean(self, node: ast.expr) -> ast.expr:
        node = self.generic_visit(node)
        return _simplify_bool(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.expr:
        return self._boolean(node)

    def visit_Compare(self, node: ast.Compare) -> ast.expr:
        return self._boolean(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.expr:
        return self._boolean(node) if isinstance(node.op, ast.Not) else self.generic_visit(node)


def _conjuncts(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
        return [c for v in node.values for c in _conjuncts(v)]
    return [node]


def _names(node: ast.expr) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _guard(st: ast.Assign) -> tuple[str, set[str]] | None:
    """`v = x if C else -1` (a negative sentinel): where `v >= 0` holds, so do C's conjuncts
    (those naming v only when x is v itself, the value C was tested on)."""
    if len(st.targets) != 1 or not isinstance(st.targets[0], ast.Name) or not isinstance(st.value, ast.IfExp):
        return None
    v, e = st.targets[0].id, st.value
    if not (isinstance(e.orelse, ast.Constant) and isinstance(e.orelse.value, int) and e.orelse.value < 0):
        return None
    same = isinstance(e.body, ast.Name) and e.body.id == v
    return v, {ast.dump(c) for c in _conjuncts(e.test) if same or v not in _names(c)}


def _nonneg(node: ast.expr, v: str) -> bool:
    return (isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == v
            and len(node.ops) == 1 and isinstance(node.ops[0], ast.GtE)
            and isinstance(node.comparators[0], ast.Constant) and node.comparators[0].value == 0)


def _drop_implied(node: ast.expr, guards: dict[str, set[str]]) -> ast.expr:
    """In `v >= 0 and ...`, drop the conjuncts that `v >= 0` already implies (`_guard`)."""
    if not (isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And)):
        return node
    parts = _conjuncts(node)
    implied: set[str] = set()
    for v, conds in guards.items():
        if any(_nonneg(c, v) for c in parts):
            implied |= conds
    kept = [c for c in parts if ast.dump(c) not in implied]
    return kept[0] if len(kept) == 1 else ast.BoolOp(ast.And(), kept)


def _plain(node: ast.expr) -> bool:
    """Integer arithmetic of names and constants: +, -, unary -, * by a constant."""
    return _integer_node(node, plain=True)


class _Substitute(ast.NodeTransformer):
    def __init__(self, name: str, value: ast.expr):
        self.name, self.value = name, value

    def visit_Name(self, node: ast.Name) -> ast.expr:
        return copy.deepcopy(self.value) if node.id == self.name else node


def _inline_plain(fdef: ast.FunctionDef) -> None:
    """Assignments of plain arithmetic (`cnt = token_id + 1`) are substituted into the statements
    after them and dropped, so that the arithmetic around them can be normalized (`cnt - 1` ->
    `token_id`): where neither the name assigned nor a name its value reads is bound again at
    or after it, in a body of assignments to names and returns only (the synthesized functions)."""
    for st in fdef.body:
        docstring = isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant)
        plain_assign = isinstance(st, ast.Assign) and all(isinstance(t, ast.Name) for t in st.targets)
        if not (docstring or plain_assign or isinstance(st, ast.Return)):
            return
    binds = [{t.id for t in st.targets} if isinstance(st, ast.Assign) else set() for st in fdef.body]
    i = 0
    while i < len(fdef.body):
        st = fdef.body[i]
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and _plain(st.value):
            name = st.targets[0].id
            reads = {n.id for n in ast.walk(st.value) if isinstance(n, ast.Name)}
            later = set().union(*binds[i + 1:])
            if name not in later and not (reads & (later | {name})):
                sub = _Substitute(name, st.value)
                fdef.body[i + 1:] = [sub.visit(x) for x in fdef.body[i + 1:]]
                del fdef.body[i], binds[i]
                continue
        i += 1


class _Arith(ast.NodeTransformer):
    """Integer arithmetic normalized with sympy where it gets shorter: sums collected
    (`token_id + 1 - 1 - x` -> `token_id - x`), and `(e + c) % C` for a positive constant C
    written with c reduced modulo C (Python's % of an integer by C > 0 lies in [0, C): the
    value is the same). Subexpressions sympy does not model (%, //, conditionals, calls) stay
    atoms, simplified inside."""

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        node = self.generic_visit(node)
        if (isinstance(node.op, ast.Mod) and isinstance(node.right, ast.Constant)
                and isinstance(node.right.value, int) and not isinstance(node.right.value, bool)
                and node.right.value > 0):
            tr = _Translator()
            try:
                e = sp.expand(tr.num(node.left))
                const = int(e.as_coefficients_dict().get(sp.S.One, 0))
                left = tr._linear(e - const + const % node.right.value)
            except (TypeError, ValueError):
                return node
            if len(ast.unparse(left)) < len(ast.unparse(node.left)):
                return ast.BinOp(left, ast.Mod(), node.right)
            return node
        if isinstance(node.op, (ast.Add, ast.Sub)):
            tr = _Translator()
            try:
                out = tr._linear(sp.expand(tr.num(node)))
            except (TypeError, ValueError):
                return node
            if len(ast.unparse(out)) < len(ast.unparse(node)):      # (shorter only: no mere reordering)
                return out
        return node


def simplify_module(mod: ast.Module) -> ast.Module:
    """The module with every synthesized function's expressions simplified (a new module;
    `mod` is not changed). Module-level statements (tables of the fallback) are kept as they are."""
    out = copy.deepcopy(mod)
    for fdef in out.body:
        if isinstance(fdef, ast.FunctionDef) and fdef.name in FUNCTIONS:
            _inline_plain(fdef)
            guards: dict[str, set[str]] = {}
            for st in fdef.body:
                if isinstance(st, (ast.Assign, ast.Return)) and st.value is not None:
                    st.value = _drop_implied(_Rewriter().visit(_Arith().visit(st.value)), guards)
                if isinstance(st, ast.Assign):
                    for target in st.targets:
                        if isinstance(target, ast.Name):
                            guards.pop(target.id, None)
                    g = _guard(st)
                    if g is not None:
                        guards[g[0]] = g[1]
    return ast.fix_missing_locations(out)


# --- the check ---------------------------------------------------------------------------------
class _Numpy(ast.NodeVisitor):
    """Evaluates the integer / boolean expression subset of the synthesized functions on numpy
    arrays (conditionals evaluate both branches; `//` and `%` are Python's floor semantics)."""

    _BIN = {ast.Add: np.add, ast.Sub: np.subtract, ast.Mult: np.multiply, ast.FloorDiv: np.floor_divide,
            ast.Mod: np.mod}
    _CMPS = {ast.Lt: np.less, ast.LtE: np.less_equal, ast.Gt: np.greater, ast.GtE: np.greater_equal,
             ast.Eq: np.equal, ast.NotEq: np.not_equal}

    def __init__(self, env: dict[str, np.ndarray]):
        self.env = env

    def visit_Name(self, node: ast.Name) -> Any:
        return self.env[node.id]

    def visit_Constant(self, node: ast.Constant) -> Any:
        return node.value

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        a, b = self.visit(node.left), self.visit(node.right)
        if isinstance(node.op, (ast.FloorDiv, ast.Mod)):
            b = np.where(np.asarray(b) == 0, 1, b)        # guarded by the caller's conditions
        return self._BIN[type(node.op)](a, b)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Any:
        v = self.visit(node.operand)
        return np.logical_not(v) if isinstance(node.op, ast.Not) else np.negative(v)

    def visit_BoolOp(self, node: ast.BoolOp) -> Any:
        vals = [np.asarray(self.visit(v), dtype=bool) for v in node.values]
        f = np.logical_and if isinstance(node.op, ast.And) else np.logical_or
        out = vals[0]
        for v in vals[1:]:
            out = f(out, v)
        return out

    def visit_Compare(self, node: ast.Compare) -> Any:
        left, out = self.visit(node.left), True
        for op, right in zip(node.ops, node.comparators):
            r = self.visit(right)
            out = np.logical_and(out, self._CMPS[type(op)](left, r))
            left = r
        return out

    def visit_IfExp(self, node: ast.IfExp) -> Any:
        return np.where(np.asarray(self.visit(node.test), dtype=bool), self.visit(node.body), self.visit(node.orelse))

    def visit_Subscript(self, node: ast.Subscript) -> Any:
        """A tuple literal of constants indexed by an integer expression (pattern predicates of
        spreads): Python's indexing; lanes out of range are ones a conditional discards."""
        values = constant_tuple(node.value)
        if values is None:
            return self.generic_visit(node)
        table = np.asarray(values)
        idx = np.asarray(self.visit(node.slice))
        idx = np.where(idx < 0, idx + len(table), idx)
        return table[np.clip(idx, 0, len(table) - 1)]

    def generic_visit(self, node: ast.AST) -> Any:
        raise ValueError(f"not evaluable on arrays: {ast.unparse(node)}")


def _run(fdef: ast.FunctionDef, env: dict[str, np.ndarray]) -> np.ndarray:
    env = dict(env)
    for st in fdef.body:
        if isinstance(st, ast.Assign):
            env[st.targets[0].id] = _Numpy(env).visit(st.value)
        elif isinstance(st, ast.Return):
            return np.asarray(_Numpy(env).visit(st.value))
    raise ValueError(f"{fdef.name} has no return")


def _thin(count: int, limit: int) -> np.ndarray:
    """Indices into a sequence of `count` items: all of them up to `limit`, else the first and
    last quarter of `limit` and an even sample of the rest (sorted, no repeats)."""
    if count <= limit:
        return np.arange(count, dtype=np.int64)
    q = max(1, limit // 4)
    picks = np.concatenate([np.arange(q), np.arange(count - q, count),
                            np.linspace(0, count - 1, max(2, limit // 2)).astype(np.int64)])
    return np.unique(picks)


def check_slots(cache_size: int) -> np.ndarray:
    """The cache slots `check_equal` compares: every slot -1 .. cache_size (-1: none, cache_size:
    one past the cache), or for caches of more than MAX_CHECK_SLOTS slots the first and last
    quarter of that many and an even sample between."""
    return _thin(cache_size + 2, MAX_CHECK_SLOTS) - 1


#: most breakpoints (constants +- 1 and their pairwise sums) added to the rows and slots checked
MAX_BREAKPOINTS = 256


def breakpoints(*mods: ast.Module) -> np.ndarray:
    """The places a comparison or a conditional can change its value in the functions of `mods`:
    every integer constant c as c - 1, c, c + 1, and (up to 32 constants) the same around the
    pairwise sums (a prefix + ring's F + R); thinned evenly past MAX_BREAKPOINTS. Added to the
    sampled grid, they catch an off-by-one at a breakpoint between its samples."""
    consts = sorted({n.value for m in mods for f in m.body if isinstance(f, ast.FunctionDef)
                     for n in ast.walk(f) if isinstance(n, ast.Constant) and type(n.value) is int})
    base = set(consts)
    if len(consts) <= 32:
        base |= {a + b for a in consts for b in consts}
    points = np.array(sorted({c + d for c in base for d in (-1, 0, 1)}), dtype=np.int64)
    return points[_thin(len(points), MAX_BREAKPOINTS)]


def check_rows(max_len: int, cache_size: int, boundary: int, period: int) -> np.ndarray:
    """The query rows `check_equal` compares: -1, the boundary and the first periods past the
    cache's reach, and the last rows before (and one past) max_len; thinned evenly where the
    grid (with `check_slots`' slots) would exceed MAX_CHECK_POINTS. Nothing as long as the
    sequence is built: a million-slot cache or a max_len of 2**40 costs what a small one does."""
    head = min(max_len, boundary + 3 * max(period, 1) + cache_size + 2)
    tail = max(0, max_len - cache_size - 2 * max(period, 1))
    # [-1, head) and [max(tail, head), max_len], merged (two sorted ranges), by index
    first = head + 1
    second_lo = max(tail, head)
    count = first + (max_len + 1 - second_lo)
    limit = max(16, MAX_CHECK_POINTS // len(check_slots(cache_size)))
    idx = _thin(count, limit)
    return np.where(idx < first, idx - 1, second_lo + (idx - first)).astype(np.int64)


def check_equal(original: ast.Module, simplified: ast.Module, rows: np.ndarray, cache_size: int,
                slots: np.ndarray | None = None) -> str | None:
    """None when every function gives the same values on every slot of `slots` (default: every
    slot -1 .. cache_size) and query row of `rows` (and `cache_id_func` on `rows` as token ids);
    else what differs (indices into `slots` and `rows`).

    The grid is evaluated in blocks of slots of about CHECK_BLOCK_POINTS points: a million-slot
    ring's 16 million points stay in a few MiB (numpy asks the kernel for huge pages on arrays
    of 4 MiB and more, which can cost more than the arithmetic)."""
    rows = np.asarray(rows, dtype=np.int64)
    slots = np.arange(-1, cache_size + 1, dtype=np.int64) if slots is None else np.asarray(slots, dtype=np.int64)
    diff = _differs("cache_id_func", original, simplified, {"token_id": rows})
    if diff is not None:
        return diff
    block = max(1, CHECK_BLOCK_POINTS // max(len(rows), 1))
    for start in range(0, len(slots), block):
        part = slots[start:start + block]
        grid = {"cache_id": part[:, None], "token_id": rows[None, :]}
        for name in ("slot_key_func", "mask_func"):
            diff = _differs(name, original, simplified, grid, slot_base=start)
            if diff is not None:
                return diff
    return None


def _differs(name: str, original: ast.Module, simplified: ast.Module, env: dict[str, np.ndarray],
             slot_base: int = 0) -> str | None:
    """What differs between the two modules' `name` on `env` (an index into the whole grid:
    slots offset by `slot_base`), or None."""
    a, b = _run(_function(original, name), env), _run(_function(simplified, name), env)
    shape = np.broadcast_shapes(np.shape(a), np.shape(b), np.shape(env["token_id"]))
    a, b = np.broadcast_to(a, shape), np.broadcast_to(b, shape)
    if a.dtype == bool or b.dtype == bool:
        a, b = a.astype(bool), b.astype(bool)
    bad = np.argwhere(a != b)
    if not len(bad):
        return None
    where = tuple(int(x) for x in bad[0])
    at = where if len(where) == 1 else (where[0] + slot_base, *where[1:])
    return f"{name} differs at index {at}: {a[where]} vs {b[where]}"


def check_python(original: ast.Module, simplified: ast.Module, rows: np.ndarray, cache_size: int,
                 points: int = 4096, slots: np.ndarray | None = None) -> str | None:
    """The same comparison in Python itself (short-circuit `and` / `or`, exceptions) on the
    slots of the first and last rows (every slot of `slots` up to `points` // 4 of them, else
    the first and last 16 and an even sample) and an even sample of the rest."""
    fa, fb = _compile(original), _compile(simplified)
    slots = np.arange(-1, cache_size + 1, dtype=np.int64) if slots is None else np.asarray(slots, dtype=np.int64)
    n = len(slots)
    ends = [int(r) for r in (*rows[:2], *rows[-2:])]
    if n > points // 4:
        per_row = slots[np.unique(np.concatenate([np.arange(16), np.arange(n - 16, n),
                                                  np.linspace(0, n - 1, points // 4 - 32).astype(np.int64)]))]
    else:
        per_row = slots
    per_row = per_row.tolist()
    pairs = [(s, r) for r in ends for s in per_row]
    step = max(1, len(rows) * n // points)
    pairs += [(int(slots[k % n]), int(rows[k // n])) for k in range(0, len(rows) * n, step)]
    try:
        for r in rows.tolist():
            if fa["cache_id_func"](r) != fb["cache_id_func"](r):
                return f"cache_id_func differs at token {r}"
        for s, r in pairs:
            for name in ("slot_key_func", "mask_func"):
                if fa[name](s, r) != fb[name](s, r):
                    return f"{name} differs at slot {s}, query {r}"
    except Exception as e:   # noqa: BLE001  (a simplified function that raises is simply wrong)
        return f"raises {type(e).__name__}: {e}"
    return None


def _compile(mod: ast.Module) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(mod, "<sas-readable>", "exec"), namespace)
    return namespace


def _function(mod: ast.Module, name: str) -> ast.FunctionDef:
    for st in mod.body:
        if isinstance(st, ast.FunctionDef) and st.name == name:
            return st
    raise KeyError(name)


@dataclass(frozen=True)
class ReadableFunctions:
    """What `sas inspect` prints: the simplified module (or the original where simplifying
    did not apply or did not check out), its source, and how it was checked."""

    module: ast.Module
    source: str
    simplified: bool
    checked_points: int
    note: str


def readable_functions(functions: ast.Module, *, closed_form: bool, max_len: int, cache_size: int,
                       boundary: int, period: int) -> ReadableFunctions:
    """Simplify and check the synthesized functions (see the module docstring)."""
    if not closed_form:
        return ReadableFunctions(functions, ast.unparse(functions), False, 0,
                                 "table scheme: printed as synthesized (the tables carry the slot assignment)")
    simple = simplify_module(functions)
    bp = breakpoints(functions, simple)
    rows = np.union1d(check_rows(max_len, cache_size, boundary, period), bp[(bp >= -1) & (bp <= max_len)])
    slots = np.union1d(check_slots(cache_size), bp[(bp >= -1) & (bp <= cache_size)])
    try:
        diff = (check_equal(functions, simple, rows, cache_size, slots)
                or check_python(functions, simple, rows, cache_size, slots=slots))
    except ValueError as e:
        diff = f"not checkable: {e}"
    points = len(rows) * len(slots)
    if diff is not None:
        return ReadableFunctions(functions, ast.unparse(functions), False, points,
                                 f"printed as synthesized: the simplified form did not check out ({diff})")
    which = (f"all {cache_size} slots" if len(slots) == cache_size + 2 else
             f"{len(slots) - 2} of the {cache_size} slots (the first and last {MAX_CHECK_SLOTS // 4}, an even "
             f"sample and the functions' breakpoints)")
    return ReadableFunctions(simple, ast.unparse(simple), True, points,
                             f"simplified with sympy; equal to the synthesized functions on {which} x {len(rows)} "
                             f"query rows (boundary, first periods, last rows)")


__all__ = ["FUNCTIONS", "ReadableFunctions", "breakpoints", "check_equal", "check_python", "check_rows", "check_slots", "readable_functions", "simplify_module"]
