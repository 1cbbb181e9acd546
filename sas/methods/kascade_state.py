"""Kascade's offline state on disk (made by `sas calibrate`): the anchors, the head map
[L, Hkv], and the calibration behind them (head similarity [L, L, Hkv, Hkv], weights [L]), in
one safetensors file whose metadata names the anchor pattern (a hash of its canonical text) and
the model. Loading it for another pattern or model is a `KascadeStateError`, before anything runs.

Metadata: `sas_method = "kascade"`, `format`, `pattern_hash`, `pattern`, `model`, `anchors`
(comma list), `dp_value` (the DP's objective) and `brute_force` (the exhaustive check's anchors,
or "skipped" when there are too many choices).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from sas.errors import SASError
from sas.lang.pattern import Pattern
from sas.methods.kascade_calibrate import Similarity, head_maps, objective
from sas.methods.state_file import StateKind, pattern_hash, read_state_file, save_state_file

FORMAT = "1"


class KascadeStateError(SASError):
    """A Kascade state file that is missing, malformed, or calibrated for another pattern or model."""


KIND = StateKind("kascade", FORMAT, "Kascade", KascadeStateError, "calibrated", "sas calibrate")


@dataclass(frozen=True)
class KascadeState:
    """Anchors and head map of one model, with the calibration they were chosen from."""

    anchors: tuple[int, ...]
    head_map: torch.Tensor            # int32 [L, Hkv]
    head_sim: torch.Tensor            # float64 [L, L, Hkv, Hkv]
    weights: torch.Tensor             # float64 [L]
    pattern_hash: str
    pattern: str
    model: str
    dp_value: float
    brute_force: str = "skipped"

    @property
    def num_layers(self) -> int:
        return int(self.head_map.shape[0])

    @property
    def similarity(self) -> Similarity:
        return Similarity(self.head_sim, self.weights)

    def with_anchors(self, anchors: Sequence[int]) -> "KascadeState":
        """The same calibration with other anchors (their head map recomputed), e.g. evenly spaced."""
        a = tuple(sorted(int(x) for x in anchors))
        if not a or a[0] != 0 or a[-1] >= self.num_layers:
            raise KascadeStateError(f"Kascade anchors must start at layer 0 and lie in 0..{self.num_layers - 1}, "
                                    f"got {list(anchors)}")
        return replace(self, anchors=a, head_map=head_maps(self.head_sim, a),
                       dp_value=objective(self.similarity.weighted, a), brute_force="skipped")

    def save(self, path: str | os.PathLike) -> None:
        tensors = {"head_map": self.head_map.to(torch.int32).contiguous().cpu(),
                   "head_sim": self.head_sim.double().contiguous().cpu(),
                   "weights": self.weights.double().contiguous().cpu()}
        meta = {"pattern_hash": self.pattern_hash, "pattern": self.pattern, "model": self.model,
                "anchors": ",".join(str(a) for a in self.anchors), "dp_value": repr(float(self.dp_value)),
                "brute_force": self.brute_force}
        save_state_file(KIND, path, tensors, meta)


def make_state(sim: Similarity, anchors: Sequence[int], pattern: Pattern, model: str, dp_value: float,
               brute_force: str = "skipped") -> KascadeState:
    a = tuple(sorted(int(x) for x in anchors))
    return KascadeState(a, head_maps(sim.head_sim, a), sim.head_sim, sim.weights, pattern_hash(pattern),
                        repr(pattern), model, float(dp_value), brute_force)


def load_state(path: str | os.PathLike, pattern: Pattern, model: str) -> KascadeState:
    """Read a state file and check it was calibrated for `pattern` and `model` (`KascadeStateError`)."""
    meta, tensors = read_state_file(KIND, path, pattern, model)
    path = os.fspath(path)
    try:
        anchors = tuple(int(x) for x in meta["anchors"].split(",") if x)
        hm, hs, w = tensors["head_map"], tensors["head_sim"], tensors["weights"]
        dp_value = float(meta["dp_value"])
    except (KeyError, ValueError) as e:
        raise KascadeStateError(f"Kascade state file {path!r} is incomplete: {e}") from None
    L = hm.shape[0] if hm.dim() == 2 else -1
    if (hm.dim() != 2 or hs.shape != (L, L, hm.shape[1], hm.shape[1]) or w.shape != (L,) or not anchors
            or anchors[0] != 0 or max(anchors) >= L or int(hm.min()) < 0 or int(hm.max()) >= hm.shape[1]):
        raise KascadeStateError(f"Kascade state file {path!r} is inconsistent: head_map {tuple(hm.shape)}, head_sim "
                                f"{tuple(hs.shape)}, weights {tuple(w.shape)}, anchors {anchors}")
    return KascadeState(anchors, hm.to(torch.int32), hs.double(), w.double(), pattern_hash(pattern),
                        meta.get("pattern", ""), model,
                        dp_value, meta.get("brute_force", "skipped"))


__all__ = ["KascadeState", "KascadeStateError", "load_state", "make_state", "pattern_hash"]
