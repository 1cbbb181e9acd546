"""Symbolic inputs for custom score operators (paper Figure 4).

A custom operator registered with `sas.ops.register` is written with ordinary torch calls
over these symbols::

    @sas.ops.register
    def mm_score():
        q = sas.sym.active_Q                       # [B, Hq, Lq, D]
        w = sas.sym.custom_weight(name="wgt")      # other_inputs["wgt"]
        return torch.matmul(q, w)                  # must be [B, Hq, Lq, Lk]

The function body is run once, by `sas.dynamic.trace`, with every symbol standing for an
input placeholder of a torch.fx graph; torch calls on symbols are recorded as graph nodes.
Outside such a trace a symbol cannot be computed with (a `SASError` says so).

| symbol | stands for | shape |
|---|---|---|
| `active_Q` | the queries of the current step | `[B, Hq, Lq, D]` |
| `active_K` | the keys produced so far (all positions `0 .. Lk-1`) | `[B, Hkv, Lk, D]` |
| `custom_weight(name)` | `other_inputs[name]` of the kernel | whatever the user passes; `shape=` declares it |

This module does not import torch: the symbols hand torch calls to the tracer that is active
(`sas.dynamic.trace` installs it through `_RESOLVER`).
"""

from __future__ import annotations

import keyword
from contextvars import ContextVar
from typing import Any, Callable

from sas.errors import PatternError, SASError

# Names the score graph already uses for its own inputs; a custom weight may not take them.
RESERVED_INPUT_NAMES = frozenset({"attn_probs", "q", "k", "active_Q", "active_K", "self", "torch"})
# Symbolic dimension names allowed in `custom_weight(shape=...)`.
SHAPE_SYMBOLS = ("B", "Hq", "Hkv", "Lq", "Lk", "D")

# Set by sas.dynamic.trace while a custom op is being traced: maps a Sym to its fx proxy.
_RESOLVER: ContextVar[Callable[["Sym"], Any] | None] = ContextVar("sas_sym_resolver", default=None)


def check_input_name(name: Any, what: str) -> str:
    """Validate a tensor name that reaches the generated score graph (an identifier)."""
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise PatternError(f"{what}: name must be a Python identifier (letters, digits, '_', not a "
                           f"keyword), got {name!r}")
    if name in RESERVED_INPUT_NAMES or name.startswith("_"):
        raise PatternError(f"{what}: name {name!r} is reserved (reserved: {sorted(RESERVED_INPUT_NAMES)} "
                           f"and names starting with '_'); choose another name")
    return name


class Sym:
    """A symbolic tensor input of a custom score operator (see the module docstring)."""

    # `declared_shape`, not `shape`: `sym.shape` must reach the traced tensor (`active_K.shape[-2]`)
    __slots__ = ("kind", "name", "declared_shape")

    def __init__(self, kind: str, name: str, declared_shape: tuple[int | str | None, ...] | None = None):
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "declared_shape", declared_shape)

    def __setattr__(self, key, value):
        raise AttributeError("sas.sym symbols are immutable")

    def __repr__(self) -> str:
        if self.kind == "weight":
            decl = f", shape={self.declared_shape!r}" if self.declared_shape is not None else ""
            return f"sas.sym.custom_weight(name={self.name!r}{decl})"
        return f"sas.sym.{self.name}"

    def _value(self) -> Any:
        resolve = _RESOLVER.get()
        if resolve is None:
            raise SASError(
                f"{self!r} is a symbolic input: it can only be used inside a custom score op "
                f"(@sas.ops.register) while sas.dynamic traces it, not computed with directly")
        return resolve(self)

    # torch.* functions called with a symbol land here (the same protocol as torch.fx.Proxy).
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return func(*_resolve(args), **_resolve(kwargs or {}))

    def __getattr__(self, name: str) -> Any:     # methods and attributes: .sum, .shape, .T ...
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._value(), name)

    def __getitem__(self, idx): return self._value()[_resolve(idx)]
    def __add__(self, o): return self._value() + _resolve(o)
    def __radd__(self, o): return _resolve(o) + self._value()
    def __sub__(self, o): return self._value() - _resolve(o)
    def __rsub__(self, o): return _resolve(o) - self._value()
    def __mul__(self, o): return self._value() * _resolve(o)
    def __rmul__(self, o): return _resolve(o) * self._value()
    def __truediv__(self, o): return self._value() / _resolve(o)
    def __rtruediv__(self, o): return _resolve(o) / self._value()
    def __matmul__(self, o): return self._value() @ _resolve(o)
    def __rmatmul__(self, o): return _resolve(o) @ self._value()
    def __pow__(self, o): return self._value() ** _resolve(o)
    def __neg__(self): return -self._value()
    def __abs__(self): return abs(self._value())

    def __bool__(self):
        raise SASError(f"{self!r} is symbolic: its truth value is not known while tracing a custom "
                       f"score op (Python control flow on symbolic tensors is not traceable)")


def _resolve(x: Any) -> Any:
    if isinstance(x, Sym):
        return x._value()
    if isinstance(x, tuple):
        return tuple(_resolve(v) for v in x)
    if isinstance(x, list):
        return [_resolve(v) for v in x]
    if isinstance(x, dict):
        return {k: _resolve(v) for k, v in x.items()}
    if isinstance(x, slice):
        return slice(_resolve(x.start), _resolve(x.stop), _resolve(x.step))
    return x


active_Q = Sym("input", "active_Q")
active_K = Sym("input", "active_K")


def custom_weight(name: str, shape: tuple[int | str | None, ...] | None = None) -> Sym:
    """The tensor `other_inputs[name]` as a symbolic input.

    `name` must be a Python identifier (it becomes a graph input). `shape`, optional, declares
    the expected shape: each entry an int, `None` (any size) or one of the symbols
    "B", "Hq", "Hkv", "Lq", "Lk", "D" (sizes of the step's inputs); a tensor of another shape
    is then reported by name before anything runs.
    """
    check_input_name(name, "sas.sym.custom_weight")
    if shape is not None:
        if not isinstance(shape, (tuple, list)):
            raise PatternError(f"sas.sym.custom_weight(name={name!r}, shape=...): shape must be a tuple, "
                               f"got {shape!r}")
        for s in shape:
            ok = (s is None or (isinstance(s, int) and not isinstance(s, bool) and s >= 1)
                  or s in SHAPE_SYMBOLS)
            if not ok:
                raise PatternError(
                    f"sas.sym.custom_weight(name={name!r}, shape=...): each entry must be a positive int, "
                    f"None or one of {SHAPE_SYMBOLS}, got {s!r}")
        shape = tuple(shape)
    return Sym("weight", name, shape)


__all__ = ["Sym", "active_Q", "active_K", "custom_weight"]
