"""Importance-score op chains for `Dynamic` components (paper section 4.1, Figure 4).

An `OpChain` is an immutable record of the operators a user chained together, e.g.
`ops.attn_score().sum(dim=1)`. It holds no tensors: the chain is traced to torch.fx and
lowered to kernels by `sas.dynamic` (see docs/dynamic.md for what runs today).
"""

from __future__ import annotations

import keyword
import math
import sys
from dataclasses import dataclass
from typing import Any, Callable

from sas.errors import PatternError
from sas.lang.sym import check_input_name

_REGISTRY: dict[str, Callable[..., Any]] = {}
SAMPLE_METHODS = ("multinomial", "stratified", "systematic")
SAMPLE_STRATEGIES = ("prop", "flash", "torch")
SAMPLE_ALLOCS = ("global_sys", "largest_remainder")
_RESERVED_OPS = frozenset({"attn_score", "register", "default_score", "custom_op", "external",
                           "partition", "reuse", "sample", "OpChain", "OpNode", "fraction", "Fraction"})


@dataclass(frozen=True)
class OpNode:
    """One operator application: a name and its keyword arguments as sorted (key, value) pairs."""

    name: str
    args: tuple[tuple[str, Any], ...] = ()

    def __repr__(self):
        if self.name == "custom":            # a registered op prints as it is called: mm_score()
            return f"{dict(self.args)['op']}()"
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

    def top_p(self, p: float, *, chunk: int = 1, pooled: bool = False, iters: int | None = None) -> "OpChain":
        """SpecAttn: per row the fewest keys holding mass `p` of the row (ties kept: at least p),
        then the union over the rows (query heads and the step's queries) -> 1.0 / 0.0 per key.

        `chunk`: select chunks of that many keys by their summed score (SpecAttn / Quest: 16);
        `pooled`: sum the G query heads of a KV head before selecting (one distribution per
        query); `iters`: the paper's fixed bisection (keeps theta_low) instead of the exact
        threshold. See docs/specattn.md and sas.methods.threshold.
        """
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < float(p) <= 1.0:
            raise PatternError(f"top_p: p must be a number in (0, 1] (the attention mass to keep), got {p!r}")
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise PatternError(f"top_p(chunk=...) must be a positive integer (1 = token granularity, 16 = "
                               f"SpecAttn's chunks), got {chunk!r}")
        if iters is not None and (isinstance(iters, bool) or not isinstance(iters, int) or not 1 <= iters <= 64):
            raise PatternError(f"top_p(iters=...) must be None (exact threshold) or an integer in [1, 64] (the "
                               f"paper's fixed bisection), got {iters!r}")
        if not isinstance(pooled, bool):
            raise PatternError(f"top_p(pooled=...) must be True or False, got {pooled!r}")
        return self._then("top_p", p=float(p), chunk=chunk, pooled=pooled, iters=iters)

    def sample(self, n: int, method: str = "systematic", *, strategy: str = "prop", alloc: str = "global_sys",
               tile: int | None = None, seed: int | None = 0) -> "OpChain":
        """SANTA: draw `n` key indices per query head from the post-softmax distribution and
        average their value rows (an unbiased estimate of the attention output; docs/santa.md).

        `method`: "multinomial" | "stratified" | "systematic"; kernel options (recorded only when
        not the default): `strategy` "prop" | "flash" (systematic) or "torch", prop's tile budgets
        `alloc` "global_sys" (unbiased) | "largest_remainder" (the paper's, biased), the key
        `tile` (a power of two), and the random `seed` (None: torch's global generator).
        """
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise PatternError(f"sample(n=...) must be a positive integer, got {n!r}")
        if method not in SAMPLE_METHODS:
            raise PatternError(f"sample(method=...) must be one of {SAMPLE_METHODS}, got {method!r}")
        opts: dict[str, Any] = {}
        for name, value, valid, default in (("strategy", strategy, SAMPLE_STRATEGIES, "prop"),
                                            ("alloc", alloc, SAMPLE_ALLOCS, "global_sys")):
            if value not in valid:
                raise PatternError(f"sample({name}=...) must be one of {valid}, got {value!r}")
            if value != default:
                opts[name] = value
        if method != "systematic" and strategy != "torch":
            raise PatternError(f"sample(method={method!r}): the prop and flash kernels draw systematically; "
                               f"use strategy='torch' for {method!r}")
        if tile is not None:
            if not isinstance(tile, int) or isinstance(tile, bool) or tile < 16 or tile & (tile - 1):
                raise PatternError(f"sample(tile=...) must be a power of two >= 16, got {tile!r}")
            opts["tile"] = tile
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
            raise PatternError(f"sample(seed=...) must be None or an integer >= 0, got {seed!r}")
        if seed != 0:
            opts["seed"] = seed
        return self._then("sample", method=method, n=n, **opts)

    def _arith(self, name: str, other: Any) -> "OpChain":
        if isinstance(other, OpChain):
            return self._then(name, other=other)
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            try:
                value = float(other)
            except OverflowError:
                raise PatternError(f"score arithmetic '{name}': the integer constant ({len(str(abs(other)))} "
                                   f"digits) is too large for a float (at most {sys.float_info.max:g})") from None
            if math.isnan(value):
                raise PatternError(f"score arithmetic '{name}': the constant is NaN, which would make every "
                                   f"score NaN and the key selection arbitrary; use a finite number")
            if name == "div" and value == 0:
                raise PatternError(f"score arithmetic 'div': division by the constant 0 makes every score "
                                   f"inf or NaN; divide by a non-zero number")
            return self._then(name, other=value)
        raise PatternError(f"score arithmetic '{name}': operand must be a number or an op chain, got {other!r}")

    def __add__(self, other): return self._arith("add", other)
    def __sub__(self, other): return self._arith("sub", other)
    def __mul__(self, other): return self._arith("mul", other)
    def __truediv__(self, other): return self._arith("div", other)

    # A number on the left: `2 + chain` and `2 * chain` are the same as with the chain first;
    # `2 - chain` and `2 / chain` are not recorded (write them with the chain first).
    def __radd__(self, other): return self._arith("add", other)
    def __rmul__(self, other): return self._arith("mul", other)

    def __rsub__(self, other):
        raise PatternError(f"score arithmetic: {other!r} - chain is not supported; write the chain first, "
                           f"e.g. chain * -1 + {other!r}")

    def __rtruediv__(self, other):
        raise PatternError(f"score arithmetic: {other!r} / chain is not supported; only a chain divided by "
                           f"a number or by another chain (chain / x)")

    def __repr__(self):
        return ".".join(repr(n) for n in self.nodes)


def attn_score(*, estimator: str = "exact", samples: int = 8, group: str = "mean") -> OpChain:
    """Post-softmax attention probabilities of the active queries over the keys.

    `estimator="bernoulli"` (SANTA section 5, only before `.sample(...)`): the scores come from
    the paper's Bernoulli ternary query, `samples` draws per feature, `group` "mean" (the GQA
    mean group query) or "head"; recorded only when not "exact".
    """
    if estimator == "exact":
        return OpChain((OpNode("attn_score"),))
    if estimator != "bernoulli":
        raise PatternError(f"attn_score(estimator=...) must be 'exact' or 'bernoulli', got {estimator!r}")
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
        raise PatternError(f"attn_score(samples=...) must be a positive integer, got {samples!r}")
    if group not in ("mean", "head"):
        raise PatternError(f"attn_score(group=...) must be 'mean' or 'head', got {group!r}")
    return OpChain((OpNode("attn_score", (("estimator", estimator), ("group", group), ("samples", samples))),))


def external(name: str) -> OpChain:
    """Scores supplied from outside at every step (SpecAttn: a draft model's attention).

    `other_inputs[name]` holds the full-sequence tensor `[B, Hq, N, N]` (row = query position);
    each step reads its rows `[i0, i1)` and key columns `[0, i1)`, like `attn_score()`.
    """
    check_input_name(name, "ops.external")
    return OpChain((OpNode("external", (("name", name),)),))


def partition(centroids: str, classifier: str, probes: int) -> OpChain:
    """Saap: keys go to the bucket of their nearest centroid, queries probe the `probes` buckets
    a learned classifier ranks best (group score: `.sum(dim=1)` over the GQA group).

    `centroids` names `other_inputs[centroids]` [Hkv, C, D]; `classifier` the prefix of the
    folded classifier `other_inputs[classifier + "_w1" | "_b1" | "_w2" | "_b2"]`
    (sas.methods.saap). Runs in SASAttnKernel on the Saap decoder; see docs/dynamic.md section 6.
    """
    check_input_name(centroids, "ops.partition(centroids=...)")
    check_input_name(classifier, "ops.partition(classifier=...)")
    if not isinstance(probes, int) or isinstance(probes, bool) or probes < 1:
        raise PatternError(f"ops.partition(probes=...) must be a positive integer, got {probes!r}")
    return OpChain((OpNode("partition", (("centroids", centroids), ("classifier", classifier),
                                         ("probes", probes))),))


def reuse(layer: int | str, head_map: tuple[int, ...] | None = None) -> OpChain:
    """Kascade: reuse the key selection an anchor layer published (`Dynamic(..., publish=name)`)
    in the same forward step; `head_map[h]` = the anchor's KV head whose selection KV head h
    reuses (None = the same head). An index source: it computes no score.

    Runs with a name (`ops.reuse("kascade", ...)`) through `sas.integrations.kascade` and
    `sas.methods.kascade_runtime`; a layer index raises NotYetSupportedError there.
    """
    if isinstance(layer, bool) or not (
            (isinstance(layer, int) and layer >= 0) or (isinstance(layer, str) and layer.isidentifier())):
        raise PatternError(f"ops.reuse(layer=...) must be a layer index >= 0 or an identifier naming the "
                           f"anchor layer, got {layer!r}")
    if head_map is not None:
        if not isinstance(head_map, (tuple, list)) or not all(
                isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in head_map):
            raise PatternError(f"ops.reuse(head_map=...) must be a tuple of KV-head indices >= 0, got {head_map!r}")
        head_map = tuple(head_map)
    return OpChain((OpNode("reuse", (("head_map", head_map), ("layer", layer))),))


@dataclass(frozen=True)
class Fraction:
    """A run-time budget: `min(max(int(frac * n), min_keys), n)` keys of the `n` a step sees
    (Kascade: 10% of the current length, at least 128 keys). Made by `ops.fraction`."""

    frac: float
    min_keys: int = 1

    def keys(self, n: int) -> int:
        """The budget for a step over `n` keys (never more than `n`)."""
        return min(max(int(self.frac * n), self.min_keys), n)

    def __repr__(self):
        return f"fraction({self.frac!r}, min={self.min_keys})"


def fraction(frac: float, min: int = 1) -> Fraction:  # noqa: A002  (the paper's word)
    """Budget as a fraction of the keys a step sees, with a minimum count (`Dynamic(budget=...)`).

    `frac` in (0, 1]; `min` >= 1 keys. Kascade: `ops.fraction(0.1, min=128)`."""
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac <= 1 or math.isnan(frac):
        raise PatternError(f"ops.fraction(frac=...) must be a number in (0, 1], got {frac!r}")
    if isinstance(min, bool) or not isinstance(min, int) or min < 1:
        raise PatternError(f"ops.fraction(min=...) must be an integer >= 1 (keys), got {min!r}")
    return Fraction(float(frac), int(min))


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
    if name in _RESERVED_OPS or name.startswith("_") or (name in globals() and name not in _REGISTRY):
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
