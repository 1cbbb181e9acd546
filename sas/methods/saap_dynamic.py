"""`ops.partition` inside `SASAttnKernel`: a dynamic pattern whose score chain is
`ops.partition(centroids, classifier, probes).sum(dim=1)` runs on `SaapDecoder` instead of the
H2O runtime (docs/dynamic.md section 6, Saap).

The pattern is the paper's: a static sink + window and the Dynamic over the rest of the causal
triangle, e.g.

    dense = (Rect(cols=(0, 1)) + Diag(0, 2047)) * Causal()
    saap = dense + (Causal() * ~dense) * Dynamic(budget=1, refresh=True,
               score=ops.partition(centroids="cent", classifier="qclf", probes=32).sum(dim=1))

The selection is by whole buckets: the `probes` buckets with the highest group score (the
chain's per-key value: the sum over the GQA group of the classifier probabilities of the key's
bucket), so `budget` plays no part (any value >= 1). The sink and window sizes are read off the
static part; other static parts raise `NotYetSupportedError`.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from sas.dynamic.plan import DynamicPlan
from sas.errors import KernelError, NotYetSupportedError
from sas.methods.decoder_runtime import DecoderRuntime
from sas.methods.saap import CLASSIFIER_PARTS, SaapLayer, check_probes
from sas.methods.saap_runtime import SaapDecoder
from sas.plan import Plan

#: rows examined to read the sink and window off the static part
SHAPE_ROWS = 4096


def is_partition(split: DynamicPlan | None) -> bool:
    """Whether a dynamic split's score chain starts with `ops.partition`."""
    return split is not None and split.dynamic.score.nodes[0].name == "partition"


def sink_window(split: DynamicPlan, max_len: int) -> tuple[int, int]:
    """(sink, window) such that the static row i is keys [0, sink) and (i - window, i], and the
    region is the rest of the causal triangle; `NotYetSupportedError` otherwise."""
    n = min(max_len, SHAPE_ROWS)
    while True:
        st = split.static.to_mask(n)
        last = st[n - 1]
        if not last.all() or n >= SHAPE_ROWS:
            break
        # every key of the last row is static (a sink + window at least max_len): read the layout
        # off longer rows, so that it is the pattern's own and not max_len's
        n = min(2 * n, SHAPE_ROWS)
    sink = int(np.argmin(last)) if not last.all() else n
    window = int(np.argmin(last[::-1])) if not last.all() else n
    if sink + window >= n and n < max_len:
        raise NotYetSupportedError(f"ops.partition: the static part {split.static!r} covers whole rows up to "
                                   f"{n} keys; a sink + window longer than {SHAPE_ROWS - 1} keys is not supported")
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    want = (j <= i) & ((j < sink) | (j > i - window))
    full = split.full.to_mask(n)
    if not np.array_equal(st, want) or not np.array_equal(full, j <= i):
        raise NotYetSupportedError(
            f"ops.partition runs with the paper's layout only: a static sink + recent window "
            f"(Rect(cols=(0, s)) + Diag(0, w)) * Causal() and the Dynamic over the rest of the causal triangle; "
            f"got static part {split.static!r} and full pattern {split.full!r}")
    return sink, window


class SaapDynamicRuntime(DecoderRuntime):
    """The `DynamicRuntime` stand-in for `ops.partition` patterns (same interface for
    `SASAttnKernel`: prefill, decode, reset, state with .k/.v, length)."""

    def __init__(self, plan: Plan, other_inputs: Mapping[str, Any], *, rebuild_every: int = 64, pieces: int = 1):
        split = plan.split
        nodes = split.dynamic.score.nodes
        args = dict(nodes[0].args)
        if len(nodes) != 2 or nodes[1].name != "reduce" or dict(nodes[1].args) != {"dim": 1, "kind": "sum"}:
            raise NotYetSupportedError(
                f"ops.partition runs as the paper's batched ranking only: write "
                f"ops.partition(...).sum(dim=1) (the sum over the GQA group); got {split.dynamic.score!r}")
        if not split.refresh:
            raise NotYetSupportedError("ops.partition selects the probed buckets anew at every step and keeps "
                                       "every key: use Dynamic(..., refresh=True)")
        names = {"centroids": args["centroids"]}
        names.update({p: f"{args['classifier']}_{p}" for p in CLASSIFIER_PARTS})
        missing = [n for n in names.values() if n not in other_inputs]
        if missing:
            raise KernelError(f"SASAttnKernel: ops.partition needs other_inputs {missing} (centroids [Hkv, C, D] "
                              f"and the folded classifier w1 [Hkv, D, H], b1 [Hkv, H], w2 [Hkv, H, C], b2 [Hkv, C]); "
                              f"given: {sorted(other_inputs)}")
        t = {k: other_inputs[n] for k, n in names.items()}
        cent = t["centroids"]
        if cent.dim() != 3:
            raise KernelError(f"SASAttnKernel: other_inputs[{names['centroids']!r}] must be [Hkv, C, D], "
                              f"got {tuple(cent.shape)}")
        self.layer = SaapLayer(cent, t["w1"], t["b1"], t["w2"], t["b2"])
        self.layer.check(cent.shape[0], cent.shape[2], "SASAttnKernel (ops.partition state)")
        self.probes = check_probes(args["probes"], self.layer.clusters, "ops.partition")
        self.plan = plan
        self.split = split
        self.max_len = plan.max_len
        self.sink, self.window = sink_window(split, plan.max_len)
        self.decoder = SaapDecoder(self.layer, self.probes, sink=self.sink, window=self.window,
                                   max_len=plan.max_len, rebuild_every=rebuild_every, split=pieces)

    @property
    def last_looked_up(self) -> torch.Tensor | None:
        """Keys attended per (batch, KV head) at the last decode step."""
        return self.decoder.last_looked_up

    def report(self) -> dict[str, Any]:
        return {"method": "saap", "sink": self.sink, "window": self.window, "probes": self.probes,
                "clusters": self.layer.clusters, "rebuild_every": self.decoder.rebuild_every,
                "split": self.decoder.split}


__all__ = ["SaapDynamicRuntime", "is_partition", "sink_window"]
