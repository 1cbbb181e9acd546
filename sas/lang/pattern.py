"""The Pattern tree: primitives and the boolean / spread operators that combine them.

Every node can
- evaluate itself exactly on integer index arrays (`evaluate(i, j)`), straight from the
  definitions in docs/semantics.md; `to_mask(n)` is the oracle every derived artefact is
  checked against;
- emit the same predicate as a Python AST expression (`predicate(i, j)`), which the analysis
  uses inside `mask_func` and the backends lower to kernel code;
- report the origin-anchored extent of its True set (`extent()`), which a spread uses as
  the unit shape;
- give an equal pattern with small parameters for a bounded length (`restrict(n)`).

Integer parameters are Python integers of any size and mean exactly what they say. Indices
(query i, key j) are below `MAX_INDEX`; everything that computes with fixed-width integers
(numpy evaluation, the analysis, generated kernels) first restricts the pattern to the
length it works on, so `Diag(0, 2**200)` is "unbounded" and `Diag(-2**63, None)` attends
every key at and below the diagonal plus all keys above it, as written.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cached_property, reduce
from typing import Iterator

import numpy as np

from sas.errors import PatternError

Extent = tuple[int | None, int | None]

#: Every query / key index sas reasons about is below this (2^61): parameters restricted to
#: it, and index arithmetic on them, fit in int64 with room to spare.
MAX_INDEX = 1 << 61
#: Most levels a pattern tree may have, a primitive being one and each operator above it one
#: more (so at most MAX_DEPTH - 1 nested operators; sums and products of many terms are flat;
#: only alternating operators, `~` and `>>` nest). Deeper trees would run into Python's
#: recursion limit in the analysis and in code generation.
MAX_DEPTH = 100
#: Most nodes (primitives and operators, a shared sub-pattern counted at each use) a pattern
#: may have: a `.sas` name used twice copies its pattern into both uses, so 30 lines of
#: `a_k = a_(k-1) + a_(k-1)` would otherwise build 2^30 terms. sas itself builds patterns of
#: up to about twice a user pattern's nodes (a dynamic region is `full * ~static`), which
#: leaves room for user patterns of up to about 30000 nodes.
MAX_NODES = 1 << 16
#: Largest `n` of `to_mask(n)`: the mask is n x n booleans (4 GiB at the limit).
MASK_LIMIT = 1 << 16
#: `Spread.evaluate` asks its layout only at the cells where its unit is on when those are at
#: most this share of at least `SPARSE_UNIT_CELLS` cells (gathering them costs about as much
#: as a few operations on every cell).
SPARSE_UNIT_SHARE = 0.2
SPARSE_UNIT_CELLS = 1 << 12


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

    # `a - b` for "a without b" is `a * ~b`.
    def __sub__(self, other: object) -> "Pattern":
        raise PatternError("operator '-' is not a pattern operator: write a * ~b for the cells of a that "
                           "are not in b")

    __rsub__ = __sub__

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

    def restrict(self, n: int) -> "Pattern":
        """A pattern equal to this one on every cell (i, j) with 0 <= i, j < n whose integer
        parameters all lie within about [-2n, 2n] (`self` when they already do; a spread's
        unit and layout are restricted one past the coordinates they are read at, so each
        nested spread may leave numbers up to 2 more).

        Parameters beyond the length are exact to clamp: a band longer than any distance
        becomes unbounded, an offset past every index becomes empty, a stride longer than
        the index range keeps its single on-line, a spread unit larger than n is cut to n. A
        region's stop at n or past it becomes unbounded, and a spread whose one block covers
        [0, n)^2 becomes its unit (or nothing, where the layout's first cell is off): a chunk
        as long as the sequence leaves no boundary or period of n for the analysis to read.
        """
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 < n <= MAX_INDEX:
            raise PatternError(f"restrict: n must be a positive integer at most 2**61, got {n!r}")
        return self._restrict(int(n))

    def _restrict(self, n: int) -> "Pattern":
        raise NotImplementedError

    def _params_within(self, n: int) -> bool:
        """Do this node's own integer parameters lie within [-2n, 2n]?"""
        return True

    def _empty_within(self, n: int) -> bool:
        """Is this node, read alone, off on every cell of [0, n)^2? (Only what its own numbers
        show at a glance: a primitive past the sequence; False where unsure.)"""
        return False

    @cached_property
    def _index_safe(self) -> "Pattern":
        """`restrict(MAX_INDEX)`: the form numpy evaluation and predicates compute with."""
        return self._restrict(MAX_INDEX)

    @cached_property
    def depth(self) -> int:
        """Operator nesting depth: 1 for a primitive."""
        return 1 + max((c.depth for c in self.children()), default=0)

    @cached_property
    def node_count(self) -> int:
        """Nodes of the pattern tree (primitives and operators; a sub-pattern used twice counts
        twice): 1 for a primitive."""
        return 1 + sum(c.node_count for c in self.children())

    def to_mask(self, n: int) -> np.ndarray:
        """The exact boolean `n x n` mask: row = query index i, column = key index j."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0:
            raise PatternError(f"to_mask: n must be a positive integer, got {n!r}")
        if n > MASK_LIMIT:
            raise PatternError(f"to_mask: n={n} would build an {n} x {n} mask ({n * n} cells); the limit "
                               f"is n <= {MASK_LIMIT}: use sas.analyze for long sequences")
        idx = np.arange(int(n), dtype=np.int64)
        return np.asarray(self.evaluate(idx[:, None], idx[None, :]), dtype=bool)

    def walk(self) -> Iterator["Pattern"]:
        stack: list[Pattern] = [self]
        while stack:
            p = stack.pop()
            yield p
            stack.extend(reversed(p.children()))

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


def _check_depth(node: Pattern) -> None:
    """An operator node's nesting depth and node count against MAX_DEPTH and MAX_NODES."""
    if node.depth > MAX_DEPTH:
        raise PatternError(
            f"{type(node).__name__}: the pattern would be {node.depth} levels deep ({node.depth - 1} nested "
            f"operators over a primitive); the limit is {MAX_DEPTH} levels (sums and products of many terms are "
            f"flat; only alternating operators, '~' and '>>' nest): build it with fewer nested levels")
    if node.node_count > MAX_NODES:
        raise PatternError(
            f"{type(node).__name__}: the pattern would have {node.node_count} nodes; the limit is {MAX_NODES} "
            f"(every term of a sum or product counts, and a sub-pattern used more than once, such as a "
            f".sas name, counts at each use): build it from fewer terms")


def _terms(cls: type, terms: tuple[object, ...]) -> tuple[Pattern, ...]:
    """Check the operands of an n-ary node and splice in those of nested nodes of its kind."""
    if len(terms) < 2:
        raise PatternError(f"{cls.__name__}(...) needs at least two sas patterns, got {len(terms)}")
    out: list[Pattern] = []
    for k, t in enumerate(terms):
        if not isinstance(t, Pattern):
            label = ("a", "b")[k] if len(terms) == 2 else f"terms[{k}]"
            raise PatternError(
                f"{cls.__name__}({label}=...) must be a sas pattern (Rect, Diag, Dynamic, ...), "
                f"got {type(t).__name__}")
        out.extend(t.terms if type(t) is cls else (t,))
    return tuple(out)


def _nothing(n: int) -> Pattern:
    """`restrict`'s pattern with no cell on [0, n)^2 (`sas.lang.primitives._empty`; imported
    here, where it is needed, since the primitives import this module)."""
    from sas.lang.primitives import _empty
    return _empty(n)


def _restricted_terms(terms: tuple[Pattern, ...], n: int) -> tuple[Pattern, ...] | None:
    """The terms restricted to n, or None when none of them changes."""
    new = tuple(t._restrict(n) for t in terms)
    return None if all(a is b for a, b in zip(new, terms)) else new


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


class _NAry(Pattern):
    """Shared by Or and And: a flat tuple of at least two terms, none of the node's own kind.

    `a` and `b` give the left-associative binary view (`a + b + c` is `(a + b) + c`).
    """

    terms: tuple[Pattern, ...]
    _symbol = "?"

    def __init__(self, *terms: Pattern):
        cls = type(self)
        object.__setattr__(self, "terms", _terms(cls, terms))
        # depth and node count from the operands' own (cached) ones: a spliced operand of this
        # kind gives its terms, one level and one node less; so a sum built term by term costs
        # O(operands) a step here, not O(terms)
        spliced = [type(t) is cls for t in terms]
        self.__dict__["depth"] = 1 + max(t.depth - s for t, s in zip(terms, spliced))
        self.__dict__["node_count"] = 1 + sum(t.node_count - s for t, s in zip(terms, spliced))
        _check_depth(self)

    @property
    def a(self) -> Pattern:
        return self.terms[0] if len(self.terms) == 2 else type(self)(*self.terms[:-1])

    @property
    def b(self) -> Pattern:
        return self.terms[-1]

    def children(self):
        return self.terms

    def _restrict(self, n):
        new = _restricted_terms(self.terms, n)
        terms = self.terms if new is None else new
        # a term off everywhere in the sequence: a product is nothing, a sum goes without it
        # (else its numbers, about n, would set the distance the columns repeat from). A product
        # holding a Dynamic keeps it (its region, empty within n, is the pattern's own: the
        # dynamic plan reads it at any length)
        empty = [t._empty_within(n) for t in terms]
        if any(empty) and not (isinstance(self, And) and self.dynamics()):
            if isinstance(self, And) or all(empty):
                return _nothing(n)
            kept = [t for t, e in zip(terms, empty) if not e]
            return kept[0] if len(kept) == 1 else type(self)(*kept)
        return self if new is None else type(self)(*new)

    def __repr__(self):
        return "(" + f" {self._symbol} ".join(repr(t) for t in self.terms) + ")"


@dataclass(frozen=True, init=False, repr=False)
class Or(_NAry):
    """`a + b + ...`: a cell is on when it is on in any term."""

    terms: tuple[Pattern, ...]
    _symbol = "+"

    def evaluate(self, i, j):
        return reduce(np.logical_or, (t.evaluate(i, j) for t in self.terms))

    def predicate(self, i, j):
        preds = [t.predicate(i, j) for t in self.terms]
        if any(isinstance(p, ast.Constant) and p.value is True for p in preds):
            return ast.Constant(True)
        return ast.BoolOp(op=ast.Or(), values=preds)

    def extent(self):
        return reduce(lambda x, y: (_max_bound(x[0], y[0]), _max_bound(x[1], y[1])),
                      (t.extent() for t in self.terms))


@dataclass(frozen=True, init=False, repr=False)
class And(_NAry):
    """`a * b * ...`: a cell is on when it is on in every term."""

    terms: tuple[Pattern, ...]
    _symbol = "*"

    def evaluate(self, i, j):
        return reduce(np.logical_and, (t.evaluate(i, j) for t in self.terms))

    def predicate(self, i, j):
        return _b(ast.And(), [t.predicate(i, j) for t in self.terms])

    def extent(self):
        return reduce(lambda x, y: (_min_bound(x[0], y[0]), _min_bound(x[1], y[1])),
                      (t.extent() for t in self.terms))


@dataclass(frozen=True)
class Not(Pattern):
    """`~a` (the paper's `!a`): a cell is on when it is off in `a`."""

    a: Pattern

    def __post_init__(self):
        _check_fields(self, "a")
        _check_depth(self)

    def evaluate(self, i, j):
        return ~self.a.evaluate(i, j)

    def _restrict(self, n):
        a = self.a._restrict(n)
        if a._empty_within(n):          # not nothing: every cell
            from sas.lang.primitives import Rect
            return Rect()
        return self if a is self.a else Not(a)

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

    `box`, when given, is the block size `(h, w)` instead of the unit's box: `restrict` uses
    it to cut a unit larger than the length without nesting the tree deeper.
    """

    unit: Pattern
    layout: Pattern
    box: tuple[int, int] | None = None

    def __post_init__(self):
        _check_fields(self, "unit", "layout")
        if self.box is not None:
            ok = (isinstance(self.box, tuple) and len(self.box) == 2
                  and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in self.box))
            if not ok:
                raise PatternError(f"Spread(box=...) must be None or a pair (h, w) of positive integers, "
                                   f"got {self.box!r}")
            _check_depth(self)
            return
        h, w = self.unit.extent()
        if h is None or w is None:
            raise PatternError(
                f"spread '>>': the left side must be a bounded unit (a Rect with finite rows and "
                f"cols, possibly intersected with more pattern), got {self.unit!r} whose box is "
                f"unbounded in {'rows' if h is None else 'cols'}"
            )
        if h <= 0 or w <= 0:
            raise PatternError(f"spread '>>': the unit {self.unit!r} has an empty box {h}x{w}")
        _check_depth(self)

    @property
    def shape(self) -> tuple[int, int]:
        if self.box is not None:
            return self.box
        h, w = self.unit.extent()
        assert h is not None and w is not None
        return h, w

    def _params_within(self, n):
        h, w = self.shape
        return h <= 2 * n and w <= 2 * n

    def _restrict(self, n):
        # Rows i < n see the unit at i % h < min(h, n) and the layout at i // h: a unit taller
        # (wider) than n is the same as one cut to n, since then i // h = 0 and i % h = i.
        h, w = self.shape
        hh, ww = (h if h <= 2 * n else n), (w if w <= 2 * n else n)
        # (one past the coordinates they are read at: a unit's own stop at its box stays a stop)
        m = max(-(-n // hh), -(-n // ww)) + 1
        layout = self.layout._restrict(m)
        if layout._empty_within(m) and not self.unit.dynamics():
            return _nothing(n)
        if h >= n and w >= n and not layout.dynamics():
            # one block covers [0, n)^2: the unit itself where the layout's first cell is on
            # (chunks as long as the sequence are the unit), else nothing. (The restricted
            # layout decides: a Dynamic it dropped cannot keep the block, or a second restrict
            # would collapse what the first kept.)
            if bool(layout.evaluate(np.zeros((), dtype=np.int64), np.zeros((), dtype=np.int64))):
                return self.unit._restrict(n)
            return _nothing(n)
        unit = self.unit._restrict(max(min(hh, n), min(ww, n)) + 1)
        if (hh, ww) == (h, w) and unit is self.unit and layout is self.layout:
            return self
        return Spread(unit, layout, None if unit.extent() == (hh, ww) else (hh, ww))

    def evaluate(self, i, j):
        if not self._params_within(MAX_INDEX):
            return self._index_safe.evaluate(i, j)
        h, w = self.shape
        unit = np.asarray(self.unit.evaluate(i % h, j % w), dtype=bool)
        if (unit.size >= SPARSE_UNIT_CELLS and np.count_nonzero(unit) <= SPARSE_UNIT_SHARE * unit.size
                and unit.shape == np.broadcast_shapes(np.shape(i), np.shape(j))):
            # a unit on at few of many cells: the layout only there (a stride's other residues,
            # the columns a narrow unit leaves out)
            out = np.zeros(unit.shape, dtype=bool)
            rows, cols = np.broadcast_to(i, unit.shape)[unit], np.broadcast_to(j, unit.shape)[unit]
            out[unit] = self.layout.evaluate(rows // h, cols // w)
            return out
        return self.layout.evaluate(i // h, j // w) & unit

    def predicate(self, i, j):
        if not self._params_within(MAX_INDEX):
            return self._index_safe.predicate(i, j)
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
        if self.box is not None:
            return f"Spread({self.unit!r}, {self.layout!r}, box={self.box})"
        return f"({self.unit!r} >> {self.layout!r})"


