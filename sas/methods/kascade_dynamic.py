"""Kascade patterns: `Dynamic(..., publish=name)` anchors and `ops.reuse(name, head_map)` layers
read into a `KascadeLayer` (what `sas.methods.kascade_runtime` and the integration run).

    anchor = Causal() * Dynamic(budget=ops.fraction(0.1, min=128), refresh=True, publish="kascade",
                                score=ops.attn_score().sum(dim=1))        # sum over the GQA group (+ tile)
    reuse  = Causal() * Dynamic(budget=ops.fraction(0.1, min=128), refresh=True,
                                score=ops.reuse("kascade", head_map=(0, 2, 1)))

The Dynamic covers the whole causal triangle (no static part: the prefill tile's own causal
keys are always attended, by the runtime, and top-k draws from the keys before the tile).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from sas.dynamic.plan import plan_dynamic
from sas.errors import NotYetSupportedError, PatternError
from sas.lang import ops
from sas.lang.ops import Fraction
from sas.lang.pattern import Pattern
from sas.lang.primitives import Causal, Dynamic
from sas.methods.kascade import TILE, KascadeError, KascadeLayer

#: rows compared when checking that the Dynamic covers exactly the causal triangle
SHAPE_ROWS = 96


def anchor_pattern(frac: float = 0.1, min_keys: int = 128, name: str = "kascade") -> Pattern:
    """The paper's anchor layer: exact top-k of the GQA/tile-pooled post-softmax scores, published."""
    return Causal() * Dynamic(budget=ops.fraction(frac, min=min_keys), refresh=True, publish=name,
                              score=ops.attn_score().sum(dim=1))


def reuse_pattern(head_map: Sequence[int] | None, frac: float = 0.1, min_keys: int = 128,
                  name: str = "kascade") -> Pattern:
    """A reuse layer attending the selection `name` through `head_map` (None = identity)."""
    hm = None if head_map is None else tuple(int(h) for h in head_map)
    return Causal() * Dynamic(budget=ops.fraction(frac, min=min_keys), refresh=True,
                              score=ops.reuse(name, head_map=hm))


def is_kascade(pattern: Pattern) -> bool:
    """Whether `pattern` holds a publishing Dynamic or an ops.reuse source."""
    return any(d.publish is not None or d.score.nodes[0].name == "reuse" for d in pattern.dynamics())


def kascade_layer(pattern: Pattern, *, dense: bool = False, tile: int = TILE) -> KascadeLayer:
    """The `KascadeLayer` a pattern describes (`dense=True`: the first anchor, attending densely
    while publishing). PatternError / NotYetSupportedError naming what is not Kascade's form."""
    if not isinstance(pattern, Pattern):
        raise PatternError(f"Kascade: expected a sas Pattern, got {type(pattern).__name__}")
    split = plan_dynamic(pattern)
    dyn = split.dynamic
    n = SHAPE_ROWS
    if split.static.to_mask(n).any() or not np.array_equal(split.full.to_mask(n), np.tril(np.ones((n, n), bool))):
        raise NotYetSupportedError(f"Kascade runs the paper's layout only: Causal() * Dynamic(...) over the whole "
                                   f"causal triangle (the tile's own keys are added by the runtime); got {pattern!r}")
    if not isinstance(dyn.budget, Fraction):
        raise NotYetSupportedError(f"Kascade: the budget is a run-time fraction of the current length; write "
                                   f"Dynamic(budget=ops.fraction(0.1, min=128), ...), got budget={dyn.budget!r}")
    if not dyn.refresh:
        raise NotYetSupportedError("Kascade keeps every key and selects anew at every step: use refresh=True")
    nodes = dyn.score.nodes
    if nodes[0].name == "reuse":
        if dyn.publish is not None:
            raise NotYetSupportedError(f"Kascade: a reuse layer cannot publish (publish={dyn.publish!r}); re-publishing "
                                       f"a reused selection is not supported")
        a = dict(nodes[0].args)
        if not isinstance(a["layer"], str):
            raise NotYetSupportedError(f"ops.reuse({a['layer']!r}): name the selection (the anchor's "
                                       f"Dynamic(publish=...)), not a layer number")
        if dense:
            raise KascadeError("Kascade: dense=True is for the first anchor, not a reuse layer")
        return KascadeLayer("reuse", a["layer"], dyn.budget, a["head_map"], tile)
    if dyn.publish is None:
        raise NotYetSupportedError(f"Kascade: {dyn!r} neither publishes nor reuses a selection")
    if repr(dyn.score) != repr(ops.attn_score().sum(dim=1)):
        raise NotYetSupportedError(f"Kascade anchors rank keys by attn_score().sum(dim=1) (post-softmax, summed over "
                                   f"the GQA group and the prefill tile); got {dyn.score!r}")
    return KascadeLayer("dense_anchor" if dense else "anchor", dyn.publish, dyn.budget, None, tile)


__all__ = ["anchor_pattern", "is_kascade", "kascade_layer", "reuse_pattern"]
