"""The Pattern tree: primitives and the boolean / spread operators that combine them.

Every node can
- evaluate itself exactly on integer index arrays (`evaluate(i, j)`), straight from the
  definitions in docs/semantics.md; `to_mask(n)` is the oracle every derived artefact is
  checked against;
- emit the same predicate as a Python AST expression (`predicate(i, j)`), which the analysis
  uses inside `mask_func` and the backends lower to kernel code;
- report the origin-anchored extent of its True set (`extent()`), which a spread uses as
  the unit shape.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from sas.errors import PatternError

Extent = tuple[int | None, int | None]


def _b(op: ast.boolop, values: list[ast.expr]) -> ast.expr:
    values = [v for v in values if not (isinstance(v, ast.Constant) and v.value is True)]
    if not values:
        return ast.Constant(True)
    if len(values) == 1:
        return values[0]
    return ast.BoolOp(op=op, values=values)


class Pattern:
    """Base class of every pattern node. Subclasses are frozen dataclasses."""

    # --- operators -------------------------------------------------------------------------
    def __add__(self, other: "Pattern") -> "Pattern":
        return Or(self, _check_operand(other, "+"))

    def __mul__(self, other: "Pattern") -> "Pattern":
        return And(self, _check_operand(other, "*"))

    def __invert__(self) -> "Pattern":
        return Not(self)

    def __rshift__(self, other: "Pattern") -> "Pattern":
        return Spread(self, _check_operand(other, ">>"))

    # A non-pattern on the left (`1 + p`, `mask * p`) lands here: report it as a PatternError
    # instead of Python's bare TypeError.
    def __radd__(self, other: object) -> "Pattern":
        raise _left_operand_error(other, "+")

    def __rmul__(self, other: object) -> "Pattern":
        raise _left_operand_error(other, "*")

    def __rrshift__(self, other: object) -> "Pattern":
        raise _left_operand_error(other, ">>")

    # FlexAttention habits: `|`, `&` are not the pattern operators; say which ones are.
    def __or__(self, other: object) -> "Pattern":
        raise PatternError("operator '|' is not a pattern operator: use '+' for OR (a + b)")

    __ror__ = __or__

    def __and__(self, other: object) -> "Pattern":
        raise PatternError("operator '&' is not a pattern operator: use '*' for AND (a * b)")

    __rand__ = __and__

    # --- semantics -------------------------------------------------------------------------
    def evaluate(self, i: np.ndarray, j: np.ndarray) -> np.ndarray:
        """Exact membership of (i, j) for broadcastable int64 arrays of non-negative indices."""
        raise NotImplementedError

    def predicate(self, i: ast.expr, j: ast.expr) -> ast.expr:
        """The membership test as a Python expression over the expressions `i` and `j`."""
        raise NotImplementedError

    def extent(self) -> Extent:
        """(rows, cols) of the smallest origin-anchored box holding the pattern; None = unbounded."""
        raise NotImplementedError

    def children(self) -> tuple["Pattern", ...]:
        return ()

    def to_mask(self, n: int) -> np.ndarray:
        """The exact boolean `n x n` mask: row = query index i, column = key index j."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0:
            raise PatternError(f"to_mask: n must be a positive integer, got {n!r}")
        idx = np.arange(int(n), dtype=np.int64)
        return np.asarray(self.evaluate(idx[:, None], idx[None, :]), dtype=bool)

    def walk(self) -> Iterator["Pattern"]:
        yield self
        for c in self.children():
            yield from c.walk()

    def dynamics(self) -> list["Pattern"]:
        # Local: sas.lang.primitives imports this module (its nodes subclass Pattern).
        from sas.lang.primitives import Dynamic

        return [p for p in self.walk() if isinstance(p, Dynamic)]

    def predicate_source(self, i: str = "i", j: str = "j") -> str:
        return ast.unparse(self.predicate(ast.Name(i), ast.Name(j)))


def _check_operand(other: object, op: str) -> Pattern:
    if not isinstance(other, Pattern):
        raise PatternError(
            f"operator {op!r}: right operand must be a sas pattern (Rect, Diag, Dynamic, ...), "
            f"got {type(other).__name__}"
        )
    return other


def _left_operand_error(other: object, op: str) -> PatternError:
    return PatternError(
        f"operator {op!r}: left operand must be a sas pattern (Rect, Diag, Dynamic, ...), "
        f"got {type(other).__name__}"
    )


def _check_fields(node: Pattern, *names: str) -> None:
    """Operator nodes built directly (Or(a, b), Spread(u, l), ...) get the operators' check."""
    for name in names:
        value = getattr(node, name)
        if not isinstance(value, Pattern):
            raise PatternError(
                f"{type(node).__name__}({name}=...) must be a sas pattern (Rect, Diag, Dynamic, ...), "
                f"got {type(value).__name__}"
            )


def _min_bound(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _max_bound(a: int | None, b: int | None) -> int | None:
    if a is None or b is None:
        return None
    return max(a, b)


@dataclass(frozen=True)
class Or(Pattern):
    """`a + b`: a cell is on when it is on in either operand."""

    a: Pattern
    b: Pattern

    def __post_init__(self):
        _check_fields(self, "a", "b")

    def evaluate(self, i, j):
        return self.a.evaluate(i, j) | self.b.evaluate(i, j)

    def predicate(self, i, j):
        pa, pb = self.a.predicate(i, j), self.b.predicate(i, j)
        if any(isinstance(p, ast.Constant) and p.value is True for p in (pa, pb)):
            return ast.Constant(True)
        return ast.BoolOp(op=ast.Or(), values=[pa, pb])

    def extent(self):
        (ra, ca), (rb, cb) = self.a.extent(), self.b.extent()
        return _max_bound(ra, rb), _max_bound(ca, cb)

    def children(self):
        return (self.a, self.b)

    def __repr__(self):
        return f"({self.a!r} + {self.b!r})"


@dataclass(frozen=True)
class And(Pattern):
    """`a * b`: a cell is on when it is on in both operands."""

    a: Pattern
    b: Pattern

    def __post_init__(self):
        _check_fields(self, "a", "b")

    def evaluate(self, i, j):
        return self.a.evaluate(i, j) & self.b.evaluate(i, j)

    def predicate(self, i, j):
        return _b(ast.And(), [self.a.predicate(i, j), self.b.predicate(i, j)])

    def extent(self):
        (ra, ca), (rb, cb) = self.a.extent(), self.b.extent()
        return _min_bound(ra, rb), _min_bound(ca, cb)

    def children(self):
        return (self.a, self.b)

    def __repr__(self):
        return f"({self.a!r} * {self.b!r})"


@dataclass(frozen=True)
class Not(Pattern):
    """`~a` (the paper's `!a`): a cell is on when it is off in `a`."""

    a: Pattern

    def __post_init__(self):
        _check_fields(self, "a")

    def evaluate(self, i, j):
        return ~self.a.evaluate(i, j)

    def predicate(self, i, j):
        return ast.UnaryOp(op=ast.Not(), operand=self.a.predicate(i, j))

    def extent(self):
        return None, None

    def children(self):
        return (self.a,)

    def __repr__(self):
        return f"~{self.a!r}"


@dataclass(frozen=True)
class Spread(Pattern):
    """`unit >> layout`: `layout` is evaluated on the grid of `h x w` blocks, where `h x w` is
    the unit's origin-anchored box, and every on-block is filled with the unit.

    M(i, j) = layout(i // h, j // w) and unit(i % h, j % w).
    """

    unit: Pattern
    layout: Pattern

    def __post_init__(self):
        _check_fields(self, "unit", "layout")
        h, w = self.unit.extent()
        if h is None or w is None:
            raise PatternError(
                f"spread '>>': the left side must be a bounded unit (a Rect with finite rows and "
                f"cols, possibly intersected with more pattern), got {self.unit!r} whose box is "
                f"unbounded in {'rows' if h is None else 'cols'}"
            )
        if h <= 0 or w <= 0:
            raise PatternError(f"spread '>>': the unit {self.unit!r} has an empty box {h}x{w}")

    @property
    def shape(self) -> tuple[int, int]:
        h, w = self.unit.extent()
        assert h is not None and w is not None
        return h, w

    def evaluate(self, i, j):
        h, w = self.shape
        return self.layout.evaluate(i // h, j // w) & self.unit.evaluate(i % h, j % w)

    def predicate(self, i, j):
        h, w = self.shape

        def op(x: ast.expr, o: ast.operator, k: int) -> ast.expr:
            return x if k == 1 and isinstance(o, (ast.FloorDiv,)) else ast.BinOp(x, o, ast.Constant(k))

        layout = self.layout.predicate(op(i, ast.FloorDiv(), h), op(j, ast.FloorDiv(), w))
        if h == 1 and w == 1:
            unit = self.unit.predicate(ast.Constant(0), ast.Constant(0))
        else:
            unit = self.unit.predicate(ast.BinOp(i, ast.Mod(), ast.Constant(h)), ast.BinOp(j, ast.Mod(), ast.Constant(w)))
        return _b(ast.And(), [layout, unit])

    def extent(self):
        h, w = self.shape
        rb, cb = self.layout.extent()
        return (None if rb is None else rb * h), (None if cb is None else cb * w)

    def children(self):
        return (self.unit, self.layout)

    def __repr__(self):
        return f"({self.unit!r} >> {self.layout!r})"
