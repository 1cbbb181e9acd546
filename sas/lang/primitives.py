"""The geometric primitives: Rect, Diag, Causal and Dynamic (docs/semantics.md)."""

from __future__ import annotations

import ast
import functools
import inspect
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sas.errors import PatternError
from sas.lang.ops import Fraction, OpChain, default_score
from sas.lang.pattern import MAX_INDEX, Pattern, _b

Bound = tuple[int | None, int | None] | None


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _check_int(name: str, value: Any, *, minimum: int | None = None, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if not _is_int(value):
        kind = "an integer or None" if allow_none else "an integer"
        raise PatternError(f"{name} must be {kind}, got {value!r}")
    if minimum is not None and value < minimum:
        raise PatternError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _pair(name: str, value: Any) -> tuple[Any, Any]:
    if _is_int(value):
        return value, value
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return value[0], value[1]
    raise PatternError(f"{name} must be an integer or a pair (rows, cols) of integers, got {value!r}")


def _check_range(name: str, value: Any) -> tuple[int | None, int | None]:
    if value is None:
        return None, None
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise PatternError(f"{name} must be None or a pair (start, stop) with None for unbounded, got {value!r}")
    lo = _check_int(f"{name}[0] (start)", value[0], minimum=0, allow_none=True)
    hi = _check_int(f"{name}[1] (stop)", value[1], minimum=1, allow_none=True)
    if lo is not None and hi is not None and hi <= lo:
        raise PatternError(f"{name} = ({lo}, {hi}) is empty: stop must be greater than start")
    return lo, hi


def _empty(n: int) -> "Diag":
    """A pattern with no cell (i, j), 0 <= i, j < n, on: the diagonal i - j = n."""
    return Diag(n, 1)


def _axis_restrict(rng: tuple[int | None, int | None], stride: int, offset: int, n: int):
    """One Rect axis on the indices [0, n): the same selection with small numbers as
    (range, stride, offset), or None when it selects no index."""
    lo, hi = rng
    start = lo or 0
    stop = n if hi is None else min(hi, n)
    first = start + offset                    # the first selected index
    if first >= stop:
        return None
    if first + stride >= stop:                # a single selected index
        return (first, first + 1 if first + 1 < n else None), 1, 0
    return (lo, hi if hi is not None and hi < n else None), stride, offset


def _cmp(left: ast.expr, op: ast.cmpop, right: ast.expr) -> ast.expr:
    return ast.Compare(left=left, ops=[op], comparators=[right])


def _const(v: int) -> ast.expr:
    return ast.Constant(v)


def _sub(a: ast.expr, k: int) -> ast.expr:
    if k == 0:
        return a
    if k < 0:
        return ast.BinOp(a, ast.Add(), _const(-k))
    return ast.BinOp(a, ast.Sub(), _const(k))


def _named_arguments(cls: type) -> type:
    """`cls.__init__` refusing arguments it does not take with a `PatternError` that lists the
    ones it does (Python's own TypeError names only the bad one: `Diag(0, 64, strde=4)`)."""
    init = cls.__init__
    sig = inspect.signature(init)
    names = [n for n in sig.parameters if n != "self"]

    @functools.wraps(init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except TypeError:
            try:                        # the arguments themselves? (checked only on failure: no cost)
                sig.bind(self, *args, **kwargs)
            except TypeError as e:
                raise PatternError(f"{cls.__name__}(...): {e}; its arguments are {', '.join(names)}") from None
            raise

    cls.__init__ = __init__
    return cls


@_named_arguments
@dataclass(frozen=True)
class Diag(Pattern):
    """Cells with `offset <= i - j < offset + size` and `(i - j - offset) % stride == 0`.

    `size=None` is unbounded below the offset; `stride` dilates the band (every stride-th
    diagonal), as in Longformer's dilated window or OpenAI-strided's "every 512th key".
    """

    offset: int = 0
    size: int | None = None
    stride: int = 1

    def __post_init__(self):
        object.__setattr__(self, "offset", _check_int("Diag(offset=...)", self.offset))
        object.__setattr__(self, "size", _check_int("Diag(size=...)", self.size, minimum=1, allow_none=True))
        object.__setattr__(self, "stride", _check_int("Diag(stride=...)", self.stride, minimum=1))

    def _params_within(self, n):
        o, s, t = self.offset, self.size, self.stride
        return abs(o) <= 2 * n and (s is None or o + s <= 2 * n) and t <= 2 * n

    def _empty_within(self, n):
        # on [0, n)^2, i - j runs over [-(n - 1), n - 1]
        return self.offset >= n or (self.size is not None and self.offset + self.size <= -(n - 1))

    def _restrict(self, n):
        # (a band reaching distance n or past it is unbounded: its columns then repeat from a
        # short distance instead of the band's end; offsets n and past are empty either way)
        if self._params_within(n) and (self.size is None or self.offset + self.size < n or self.offset >= n):
            return self
        o, s, t = self.offset, self.size, self.stride
        # On [0, n)^2, i - j runs over [-(n - 1), n - 1]: the band [o, o + s) matters there only.
        lo = max(o, -(n - 1))
        hi = n if s is None else min(o + s, n)
        first = lo + (o - lo) % t              # the first on-diagonal at or after lo
        if first >= hi:
            return _empty(n)
        if first + t >= hi:                    # a single on-diagonal in range
            return Diag(first, 1 if first + 1 < n else None)
        return Diag(first, None if s is None or o + s >= n else hi - first, t)

    def evaluate(self, i, j):
        if not self._params_within(MAX_INDEX):
            return self._index_safe.evaluate(i, j)
        if np.size(i) + np.size(j) < np.broadcast(i, j).size:
            # a column of rows against a row of keys: each test compares the two operands (the
            # stride's as their residues) without the grid of i - j
            a = i - self.offset
            m = a >= j
            if self.size is not None:
                m &= a - self.size < j
            if self.stride > 1:
                m &= np.remainder(i, self.stride) == np.remainder(j + self.offset, self.stride)
            return m
        d = i - j - self.offset
        m = d >= 0
        if self.size is not None:
            m = m & (d < self.size)
        if self.stride > 1:
            m = m & (d % self.stride == 0)
        return m

    def predicate(self, i, j):
        if not self._params_within(MAX_INDEX):
            return self._index_safe.predicate(i, j)
        diff = ast.BinOp(i, ast.Sub(), j)
        parts = [_cmp(diff, ast.GtE(), _const(self.offset))]
        if self.size is not None:
            parts.append(_cmp(diff, ast.Lt(), _const(self.offset + self.size)))
        if self.stride > 1:
            parts.append(_cmp(ast.BinOp(_sub(diff, self.offset), ast.Mod(), _const(self.stride)), ast.Eq(), _const(0)))
        return _b(ast.And(), parts)

    def extent(self):
        return None, None

    def __repr__(self):
        args = [f"offset={self.offset}", f"size={self.size}"]
        if self.stride != 1:
            args.append(f"stride={self.stride}")
        return f"Diag({', '.join(args)})"


def Causal(*args: Any, **kwargs: Any) -> Diag:
    """The causal mask `j <= i`, i.e. `Diag(offset=0, size=None)`; it takes no arguments."""
    if args or kwargs:
        raise PatternError("Causal() takes no arguments (it is Diag(0, None)); a causal window of w keys is "
                           "Diag(0, w)")
    return Diag(0, None)


Causal.__signature__ = inspect.Signature(return_annotation="Diag")   # what it takes: nothing (the .sas parser reads it)


@_named_arguments
@dataclass(frozen=True, init=False)
class Rect(Pattern):
    """An axis-aligned region `rows x cols` (None = unbounded on that side).

    `stride`/`offset` (an int for both axes or a pair (rows, cols)) keep only the rows and
    columns whose distance from the region start is `offset` modulo `stride`.
    `Rect(size=(h, w))` is the `h x w` box at the origin.
    """

    rows: tuple[int | None, int | None]
    cols: tuple[int | None, int | None]
    stride: tuple[int, int]
    offset: tuple[int, int]

    def __init__(self, rows: Bound = None, cols: Bound = None, *, size: Any = None,
                 stride: Any = 1, offset: Any = 0):
        if size is not None:
            if rows is not None or cols is not None:
                raise PatternError("Rect: give either size=(h, w) or rows=/cols=, not both")
            h, w = _pair("Rect(size=...)", size)
            h = _check_int("Rect(size=...)[0] (rows)", h, minimum=1)
            w = _check_int("Rect(size=...)[1] (cols)", w, minimum=1)
            rows, cols = (0, h), (0, w)
        r = _check_range("Rect(rows=...)", rows)
        c = _check_range("Rect(cols=...)", cols)
        sr, sc = _pair("Rect(stride=...)", stride)
        sr = _check_int("Rect(stride=...) (rows)", sr, minimum=1)
        sc = _check_int("Rect(stride=...) (cols)", sc, minimum=1)
        orr, oc = _pair("Rect(offset=...)", offset)
        orr = _check_int("Rect(offset=...) (rows)", orr, minimum=0)
        oc = _check_int("Rect(offset=...) (cols)", oc, minimum=0)
        if orr >= sr or oc >= sc:
            raise PatternError(
                f"Rect: offset {(orr, oc)} must be smaller than stride {(sr, sc)} on each axis "
                f"(valid offsets are 0 .. stride-1)"
            )
        object.__setattr__(self, "rows", r)
        object.__setattr__(self, "cols", c)
        object.__setattr__(self, "stride", (sr, sc))
        object.__setattr__(self, "offset", (orr, oc))

    def _params_within(self, n):
        bounds = [b for b in self.rows + self.cols if b is not None]
        return all(b <= 2 * n for b in bounds) and max(self.stride) <= 2 * n

    def _empty_within(self, n):
        return any(lo is not None and lo >= n for lo in (self.rows[0], self.cols[0]))

    def _restrict(self, n):
        # a stop at or past n bounds nothing on [0, n): unbounded (a region as long as the
        # sequence then has no boundary of n keys for the analysis to read one by one)
        if self._params_within(n) and all(b is None or b < n for b in (self.rows[1], self.cols[1])):
            return self
        r = _axis_restrict(self.rows, self.stride[0], self.offset[0], n)
        c = _axis_restrict(self.cols, self.stride[1], self.offset[1], n)
        if r is None or c is None:
            return _empty(n)
        return Rect(r[0], c[0], stride=(r[1], c[1]), offset=(r[2], c[2]))

    def _axis(self, x, rng, stride, offset):
        lo, hi = rng
        m = np.ones(np.shape(x), dtype=bool)
        if lo is not None:
            m = m & (x >= lo)
        if hi is not None:
            m = m & (x < hi)
        if stride > 1:
            m = m & ((x - (lo or 0)) % stride == offset)
        return m

    def evaluate(self, i, j):
        if not self._params_within(MAX_INDEX):
            return self._index_safe.evaluate(i, j)
        return self._axis(i, self.rows, self.stride[0], self.offset[0]) & \
            self._axis(j, self.cols, self.stride[1], self.offset[1])

    def _axis_pred(self, x: ast.expr, rng, stride, offset) -> list[ast.expr]:
        lo, hi = rng
        parts: list[ast.expr] = []
        if lo:
            parts.append(_cmp(x, ast.GtE(), _const(lo)))
        wrapped = (isinstance(x, ast.BinOp) and isinstance(x.op, ast.Mod)
                   and isinstance(x.right, ast.Constant) and x.right.value <= (hi or 0))
        if hi is not None and not wrapped:   # `x % m < hi` always holds when m <= hi
            parts.append(_cmp(x, ast.Lt(), _const(hi)))
        if stride > 1:
            parts.append(_cmp(ast.BinOp(_sub(x, lo or 0), ast.Mod(), _const(stride)), ast.Eq(), _const(offset)))
        return parts

    def predicate(self, i, j):
        if not self._params_within(MAX_INDEX):
            return self._index_safe.predicate(i, j)
        return _b(ast.And(), self._axis_pred(i, self.rows, self.stride[0], self.offset[0])
                  + self._axis_pred(j, self.cols, self.stride[1], self.offset[1]))

    def extent(self):
        return self.rows[1], self.cols[1]

    def __repr__(self):
        args = []
        if self.rows != (None, None):
            args.append(f"rows={self.rows}")
        if self.cols != (None, None):
            args.append(f"cols={self.cols}")
        if self.stride != (1, 1):
            args.append(f"stride={self.stride}")
        if self.offset != (0, 0):
            args.append(f"offset={self.offset}")
        return f"Rect({', '.join(args)})"


@_named_arguments
@dataclass(frozen=True)
class Dynamic(Pattern):
    """A region whose keys are chosen at run time by an importance score.

    `refresh=False`: the cache holds exactly `budget` dynamic entries, evicted keys are gone
    (H2O). `refresh=True`: all keys stay, `budget` of them are loaded per step.
    As a region (`to_mask`, static analysis) a Dynamic covers every cell; intersect it with
    the region it should act on.
    """

    budget: Any
    score: Any = field(default=None)
    refresh: bool = False
    #: Kascade: the name under which this layer publishes its selected key sets for
    #: `ops.reuse(name)` layers of the same forward step (None: not published)
    publish: str | None = None

    def __post_init__(self):
        if isinstance(self.budget, Fraction):       # a run-time budget (ops.fraction)
            pass
        else:
            object.__setattr__(self, "budget", _check_int("Dynamic(budget=...)", self.budget, minimum=1))
        if self.publish is not None and (not isinstance(self.publish, str) or not self.publish.isidentifier()):
            raise PatternError(f"Dynamic(publish=...) must be an identifier naming the published selection "
                               f"(e.g. 'kascade') or None, got {self.publish!r}")
        if self.score is None:
            object.__setattr__(self, "score", default_score())
        elif not isinstance(self.score, OpChain):
            raise PatternError(
                f"Dynamic(score=...) must be an op chain built from sas.ops (e.g. "
                f"ops.attn_score().sum(dim=1)), got {type(self.score).__name__}"
            )
        if not isinstance(self.refresh, bool):
            raise PatternError(f"Dynamic(refresh=...) must be True or False, got {self.refresh!r}")

    def _restrict(self, n):
        return self

    def evaluate(self, i, j):
        return np.ones(np.broadcast_shapes(np.shape(i), np.shape(j)), dtype=bool)

    def predicate(self, i, j):
        return ast.Constant(True)

    def extent(self):
        return None, None

    def __repr__(self):
        pub = f", publish={self.publish!r}" if self.publish is not None else ""
        return f"Dynamic(budget={self.budget!r}, score={self.score!r}, refresh={self.refresh}{pub})"
