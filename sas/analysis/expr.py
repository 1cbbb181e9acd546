"""A small builder for the integer Python AST expressions that synthesized functions return.

`E` wraps an `ast.expr` and overloads arithmetic so synthesis code reads like the formula
it emits, folding constants and dropping identities (x + 0, x * 1, x // 1, x % 1 == 0).
`//` and `%` are only ever built on operands the caller guarantees non-negative, so the
same expression means the same thing under C-style integer division (Triton, CUDA, NKI).
"""

from __future__ import annotations

import ast
from typing import Union

import numpy as np

Operand = Union["E", int]


def _node(x: Operand) -> ast.expr:
    return x.node if isinstance(x, E) else ast.Constant(int(x))


def _const(x: Operand) -> int | None:
    if isinstance(x, E):
        return x.node.value if isinstance(x.node, ast.Constant) and not isinstance(x.node.value, bool) else None
    return int(x)


class E:
    __slots__ = ("node",)

    def __init__(self, node: ast.expr | int | bool):
        self.node = ast.Constant(node) if isinstance(node, (int, bool)) else node

    @staticmethod
    def name(identifier: str) -> "E":
        if not identifier.isidentifier():
            raise ValueError(f"not an identifier: {identifier!r}")
        return E(ast.Name(identifier, ast.Load()))

    def _bin(self, op: ast.operator, other: Operand, fold) -> "E":
        a, b = _const(self), _const(other)
        if a is not None and b is not None:
            return E(fold(a, b))
        return E(ast.BinOp(self.node, op, _node(other)))

    def _offset(self) -> tuple["E", int]:
        """Split `x + c` / `x - c` into (x, c) so chains of constant offsets fold."""
        n = self.node
        if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Add, ast.Sub)):
            c = _const(E(n.right))
            if c is not None:
                return E(n.left), (c if isinstance(n.op, ast.Add) else -c)
        return self, 0

    def shift(self, c: int) -> "E":
        base, k = self._offset()
        total = k + c
        if _const(base) is not None:
            return E(_const(base) + total)
        if total == 0:
            return base
        if total > 0:
            return E(ast.BinOp(base.node, ast.Add(), ast.Constant(total)))
        return E(ast.BinOp(base.node, ast.Sub(), ast.Constant(-total)))

    def __add__(self, o: Operand) -> "E":
        c = _const(o)
        if c is not None:
            return self.shift(c)
        if _const(o) == 0:
            return self
        if _const(self) == 0:
            return E(_node(o))
        c = _const(o)
        if c is not None and c < 0:
            return self - (-c)
        return self._bin(ast.Add(), o, lambda a, b: a + b)

    def __radd__(self, o: int) -> "E":
        return E(o) + self

    def __sub__(self, o: Operand) -> "E":
        c = _const(o)
        if c is not None:
            return self.shift(-c)
        if c == 0:
            return self
        if c is not None and c < 0:
            return self + (-c)
        return self._bin(ast.Sub(), o, lambda a, b: a - b)

    def __rsub__(self, o: int) -> "E":
        return E(o) - self

    def __mul__(self, o: Operand) -> "E":
        if _const(o) == 1:
            return self
        if _const(o) == 0 or _const(self) == 0:
            return E(0)
        if _const(self) == 1:
            return E(_node(o))
        return self._bin(ast.Mult(), o, lambda a, b: a * b)

    def __floordiv__(self, o: Operand) -> "E":
        if _const(o) == 1:
            return self
        return self._bin(ast.FloorDiv(), o, lambda a, b: a // b)

    def __mod__(self, o: Operand) -> "E":
        if _const(o) == 1:
            return E(0)
        return self._bin(ast.Mod(), o, lambda a, b: a % b)

    def _cmp(self, op: ast.cmpop, o: Operand) -> "E":
        return E(ast.Compare(self.node, [op], [_node(o)]))

    def lt(self, o: Operand) -> "E": return self._cmp(ast.Lt(), o)
    def le(self, o: Operand) -> "E": return self._cmp(ast.LtE(), o)
    def gt(self, o: Operand) -> "E": return self._cmp(ast.Gt(), o)
    def ge(self, o: Operand) -> "E": return self._cmp(ast.GtE(), o)
    def eq(self, o: Operand) -> "E": return self._cmp(ast.Eq(), o)
    def ne(self, o: Operand) -> "E": return self._cmp(ast.NotEq(), o)

    def __and__(self, o: "E") -> "E":
        return all_of(self, o)

    def __or__(self, o: "E") -> "E":
        return any_of(self, o)

    def __invert__(self) -> "E":
        n = self.node
        flip = {ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq}
        if isinstance(n, ast.Compare) and len(n.ops) == 1 and type(n.ops[0]) in flip:
            return E(ast.Compare(n.left, [flip[type(n.ops[0])]()], n.comparators))
        if isinstance(n, ast.Constant) and isinstance(n.value, bool):
            return E(not n.value)
        return E(ast.UnaryOp(ast.Not(), n))

    def __repr__(self) -> str:
        return ast.unparse(self.node)


def _is_bool(x: E, v: bool) -> bool:
    return isinstance(x.node, ast.Constant) and x.node.value is v


def all_of(*xs: E) -> E:
    if any(_is_bool(x, False) for x in xs):
        return E(False)
    xs = tuple(x for x in xs if not _is_bool(x, True))
    if not xs:
        return E(True)
    if len(xs) == 1:
        return xs[0]
    return E(ast.BoolOp(ast.And(), [x.node for x in xs]))


def any_of(*xs: E) -> E:
    if any(_is_bool(x, True) for x in xs):
        return E(True)
    xs = tuple(x for x in xs if not _is_bool(x, False))
    if not xs:
        return E(False)
    if len(xs) == 1:
        return xs[0]
    return E(ast.BoolOp(ast.Or(), [x.node for x in xs]))


def where(cond: E, then: Operand, other: Operand) -> E:
    t, o = E(_node(then)), E(_node(other))
    if _is_bool(t, False) and _is_bool(o, True):
        return ~cond
    if _is_bool(t, True) and _is_bool(o, False):
        return cond
    if _is_bool(o, False) and isinstance(t.node, (ast.Compare, ast.BoolOp)):
        return all_of(cond, t)
    if _is_bool(cond, True):
        return E(_node(then))
    if _is_bool(cond, False):
        return E(_node(other))
    return E(ast.IfExp(cond.node, _node(then), _node(other)))


#: Longest tuple written as a tuple of constant nodes; a longer one (the boundary keys of a key set
#: with a boundary of 10^5 keys) is one constant node holding the tuple: a node per item made
#: building, copying and compiling the functions take seconds. The kernel lowerings inline at
#: most 256 items either way (`sas.codegen.printers`).
INLINE_NODES = 256


def lookup(values: tuple[int, ...], index: E) -> E:
    """`values[index]` with the simplest arithmetic form found, else an inline tuple.

    Recognizes constant and arithmetic-progression tuples so that periodic structure turns
    into floor/mod arithmetic; other tuples stay as a per-period table literal (one constant
    node past `INLINE_NODES` items).
    """
    if len(values) == 1:
        return E(values[0])
    steps = np.diff(np.asarray(values, dtype=np.int64))
    if bool((steps == steps[0]).all()):
        return index * int(steps[0]) + values[0]
    if len(values) > INLINE_NODES:
        table: ast.expr = ast.Constant(tuple(int(v) for v in values))
    else:
        table = ast.Tuple([ast.Constant(v) for v in values], ast.Load())
    return E(ast.Subscript(table, index.node, ast.Load()))


def constant_tuple(node: ast.expr) -> tuple[int, ...] | None:
    """The items of a tuple of constants (as `lookup` writes it, either way), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, tuple):
        return node.value
    if isinstance(node, ast.Tuple) and all(isinstance(e, ast.Constant) for e in node.elts):
        return tuple(e.value for e in node.elts)
    return None
