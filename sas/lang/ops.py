"""Importance-score op chains for `Dynamic` components (paper section 4.1, Figure 4).

An `OpChain` is an immutable record of the operators a user chained together, e.g.
`ops.attn_score().sum(dim=1)`. It holds no tensors: the chain is traced to torch.fx and
lowered to kernels by `sas.dynamic` (see docs/dynamic.md for what runs today).
"""

from __future__ import annotations

import keyword
from dataclasses import dataclass
from typing import Any, Callable

from sas.errors import PatternError

_REGISTRY: dict[str, Callable[..., Any]] = {}


@dataclass(frozen=True)
class OpNode:
    """One operator application: a name and its keyword arguments as sorted (key, value) pairs."""

    name: str
    args: tuple[tuple[str, Any], ...] = ()

    def __repr__(self):
        inner = ", ".join(f"{k}={v!r}" for k, v in self.args)
        return f"{self.name}({inner})"


@dataclass(frozen=True)
class OpChain:
    """A source operator followed by transforms; each method returns a longer chain."""

    nodes: tuple[OpNode, ...]

    def _then(self, name: str, **kwargs: Any) -> "OpChain":
        return OpChain(self.nodes + (OpNode(name, tuple(sorted(kwargs.items()))),))

    def reduce(self, dim: int = 1, kind: str = "sum") -> "OpChain":
        if kind not in ("sum", "mean", "max"):
            raise PatternError(f"reduce(kind=...) must be 'sum', 'mean' or 'max', got {kind!r}")
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise PatternError(f"reduce(dim=...) must be an integer dimension, got {dim!r}")
        return self._then("reduce", dim=dim, kind=kind)

    def sum(self, dim: int = 1) -> "OpChain":
        return self.reduce(dim, "sum")

    def mean(self, dim: int = 1) -> "OpChain":
        return self.reduce(dim, "mean")

    def max(self, dim: int = 1) -> "OpChain":
        return self.reduce(dim, "max")

    def pooling(self, kernel_size: int, kind: str = "max") -> "OpChain":
        if not isinstance(kernel_size, int) or isinstance(kernel_size, bool) or kernel_size < 1:
            raise PatternError(f"pooling(kernel_size=...) must be a positive integer, got {kernel_size!r}")
        if kind not in ("max", "avg"):
            raise PatternError(f"pooling(kind=...) must be 'max' or 'avg', got {kind!r}")
        return self._then("pooling", kernel_size=kernel_size, kind=kind)

    def topk(self, k: int) -> "OpChain":
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise PatternError(f"topk(k=...) must be a positive integer, got {k!r}")
        return self._then("topk", k=k)

    def _arith(self, name: str, other: Any) -> "OpChain":
        if isinstance(other, OpChain):
            return self._then(name, other=other)
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return self._then(name, other=float(other))
        raise PatternError(f"score arithmetic '{name}': operand must be a number or an op chain, got {other!r}")

    def __add__(self, other): return self._arith("add", other)
    def __sub__(self, other): return self._arith("sub", other)
    def __mul__(self, other): return self._arith("mul", other)
    def __truediv__(self, other): return self._arith("div", other)

    def __repr__(self):
        return ".".join(repr(n) for n in self.nodes)


def attn_score() -> OpChain:
    """Post-softmax attention probabilities of the active queries over the keys."""
    return OpChain((OpNode("attn_score"),))


def default_score() -> OpChain:
    """H2O's accumulated attention: `attn_score().sum(dim=1)`."""
    return attn_score().sum(dim=1)


def register(fn: Callable[..., Any]) -> Callable[..., OpChain]:
    """Register a custom score operator written with torch over `sas.sym` inputs (Figure 4).

    The decorated function becomes `sas.ops.<name>()`, a chain source.
    """
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise PatternError(f"ops.register: custom op name must be a Python identifier, got {name!r}")
    if name in ("attn_score", "register", "default_score") or name.startswith("_"):
        raise PatternError(f"ops.register: {name!r} is reserved; choose another name")
    _REGISTRY[name] = fn

    def source() -> OpChain:
        return OpChain((OpNode("custom", (("op", name),)),))

    source.__name__ = name
    globals()[name] = source
    return source


def custom_op(name: str) -> Callable[..., Any]:
    if name not in _REGISTRY:
        raise PatternError(f"unknown custom score op {name!r}; registered: {sorted(_REGISTRY)}")
    return _REGISTRY[name]
