"""`.sample(...)` inside `SASAttnKernel`: a dynamic pattern whose score chain is
`ops.attn_score().sample(n=S, method=...)` runs on `SantaDecoder` instead of the H2O runtime
(docs/santa.md, docs/dynamic.md section 6).

    santa = Causal() * Dynamic(budget=S, score=ops.attn_score().sample(n=S, method="systematic"),
                               refresh=True)
    window_santa = (Rect(cols=(0, 4)) + Diag(0, 1024)) * Causal() * Dynamic(budget=S, score=..., refresh=True)
    sink_window = (Rect(cols=(0, 4)) + Diag(0, 64)) * Causal()
    mixed = sink_window + (Causal() * ~sink_window) * Dynamic(budget=S, score=..., refresh=True)

Every decode query draws S keys per query head from its exact softmax over the cells of the
sampled region (`plan.full` outside `plan.static`), inside the compact KV cache of the pattern
without the Dynamic (`sas.analyze(plan.full)`: slots, `cache_id_func`; a window keeps only its
window). A non-empty static part (`mixed`) is attended exactly and merged with the estimate by
the exact row sums, `(Z_s O_s + Z_d O_d) / (Z_s + Z_d)` (still unbiased; docs/santa.md, "Exact
static part"); when the Dynamic multiplies the whole pattern the static part is empty and
every attended key is sampled. The prompt attends `plan.full` exactly (the paper prefills
densely). `refresh=False` raises `NotYetSupportedError` (sampling draws anew at every step and
evicts nothing). `budget` plays no part beyond the usual checks: the draws are `n` per query
head.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from sas.analysis import analyze
from sas.dynamic.plan import DynamicPlan
from sas.errors import KernelError, NotYetSupportedError
from sas.methods.decoder_runtime import DecoderRuntime
from sas.methods.santa import SantaRandom
from sas.methods.santa_runtime import SantaDecoder, SantaOptions
from sas.lang.pattern import Not
from sas.lang.primitives import Rect
from sas.plan import Plan

#: what `plan_dynamic` leaves as the static part of a pattern the Dynamic multiplies whole
EMPTY = Not(Rect())

def is_sample(split: DynamicPlan | None) -> bool:
    """Whether a dynamic split's score chain ends with `.sample(...)` (SANTA)."""
    return split is not None and split.score.sample is not None


def options_of(split: DynamicPlan) -> tuple[SantaOptions, int | None]:
    """The kernel options and the seed recorded in the chain."""
    a = dict(split.score.sample)
    return SantaOptions(n=a["n"], method=a["method"], strategy=a.get("strategy", "prop"),
                        alloc=a.get("alloc", "global_sys"), tile=a.get("tile"), qk=a["qk"],
                        qk_samples=a["qk_samples"], qk_group=a["qk_group"]), a.get("seed", 0)


class SantaDynamicRuntime(DecoderRuntime):
    """The `DynamicRuntime` stand-in for `.sample(...)` patterns (same interface for
    `SASAttnKernel`: prefill, decode, reset, state with .k/.v, length). `random` is the
    `SantaRandom` every step draws from (replace it to use another seed or generator)."""

    def __init__(self, plan: Plan, other_inputs: Mapping[str, Any] | None = None, *,
                 random: SantaRandom | None = None):
        split = plan.split
        if not split.refresh:
            raise NotYetSupportedError("SANTA sampling (.sample) draws anew at every step and keeps every key of "
                                       "the pattern: use Dynamic(..., refresh=True)")
        self.plan, self.split = plan, split
        self.max_len = plan.max_len
        self.options, seed = options_of(split)
        self.analysis = analyze(split.full, plan.max_len)
        full = split.full

        def attends(pos: int, keys: np.ndarray) -> np.ndarray:
            return np.asarray(full.evaluate(np.full(keys.shape, pos, dtype=np.int64), keys), dtype=bool)

        static = None
        if split.static != EMPTY:
            part = split.static

            def static(pos: int, keys: np.ndarray) -> np.ndarray:
                return np.asarray(part.evaluate(np.full(keys.shape, pos, dtype=np.int64), keys), dtype=bool)

        def prompt_mask(p: int) -> np.ndarray | None:
            m = full.to_mask(p)
            return None if np.array_equal(m, np.tri(p, dtype=bool)) else m

        self.decoder = SantaDecoder(self.options, max_len=plan.max_len, cache_size=int(self.analysis.cache_size),
                                    cache_ids=self.analysis.cache_ids(plan.max_len), attends=attends,
                                    random=SantaRandom(seed) if random is None else random,
                                    prompt_mask=prompt_mask, static=static)

    @property
    def random(self) -> SantaRandom:
        return self.decoder.random

    @random.setter
    def random(self, value: SantaRandom) -> None:
        if not isinstance(value, SantaRandom):
            raise KernelError(f"kernel.dynamic.random must be a SantaRandom (SantaRandom(seed), "
                              f"SantaRandom(generator=g) or SantaRandom(None)), got {type(value).__name__}")
        self.decoder.random = value

    @property
    def last_counts(self) -> torch.Tensor | None:
        """Draws per cache slot [B, Hq, slots] of the last step (set `keep_counts = True` first)."""
        return self.decoder.last_counts

    @property
    def keep_counts(self) -> bool:
        return self.decoder.keep_counts

    @keep_counts.setter
    def keep_counts(self, value: bool) -> None:
        self.decoder.keep_counts = bool(value)

    def report(self) -> dict[str, Any]:
        o = self.options
        return {"method": "santa", "n": o.n, "sampler": o.method, "strategy": o.strategy, "alloc": o.alloc,
                "tile": o.block_n, "qk": o.qk, "cache_size": int(self.analysis.cache_size),
                "random": repr(self.random)}


__all__ = ["SantaDynamicRuntime", "is_sample", "options_of"]
