"""Saap's offline state on disk: per layer the centroids and the folded classifier
(`sas.methods.saap.SaapLayer`), in one safetensors file whose metadata names the pattern (a
hash of its canonical text) and the model it was trained for. Loading it for another pattern
or model is a `SaapStateError`, before anything runs.

File layout: tensors `layer{L}.centroids`, `layer{L}.w1`, ... (`CLASSIFIER_PARTS`); metadata
`sas_method = "saap"`, `format = "1"`, `pattern_hash`, `pattern`, `model`, `layers` (comma list).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

import torch

from sas.errors import SASError
from sas.lang.pattern import Pattern
from sas.methods.saap import CLASSIFIER_PARTS, SaapLayer
from sas.methods.state_file import StateKind, pattern_hash, read_state_file, save_state_file

FORMAT = "1"


class SaapStateError(SASError):
    """A Saap state file that is missing, malformed, or trained for another pattern or model."""


KIND = StateKind("saap", FORMAT, "Saap", SaapStateError, "trained", "sas train")


@dataclass(frozen=True)
class SaapState:
    """Trained state of every indexed layer (layers absent from `layers` run dense)."""

    layers: Mapping[int, SaapLayer]
    pattern_hash: str
    pattern: str
    model: str

    def other_inputs(self, layer: int, centroids: str = "cent", classifier: str = "qclf") -> dict[str, torch.Tensor]:
        """The `SASAttnKernel(other_inputs=...)` of one layer for `ops.partition(centroids, classifier, ...)`."""
        if layer not in self.layers:
            raise SaapStateError(f"Saap state: no layer {layer}; trained layers: {sorted(self.layers)}")
        st = self.layers[layer]
        out = {centroids: st.centroids}
        out.update({f"{classifier}_{p}": getattr(st, p) for p in CLASSIFIER_PARTS})
        return out

    def save(self, path: str | os.PathLike) -> None:
        tensors = {}
        for i, st in self.layers.items():
            tensors[f"layer{i}.centroids"] = st.centroids.detach().float().contiguous().cpu()
            for p in CLASSIFIER_PARTS:
                tensors[f"layer{i}.{p}"] = getattr(st, p).detach().float().contiguous().cpu()
        meta = {"pattern_hash": self.pattern_hash, "pattern": self.pattern, "model": self.model,
                "layers": ",".join(str(i) for i in sorted(self.layers))}
        save_state_file(KIND, path, tensors, meta)


def make_state(layers: Mapping[int, SaapLayer], pattern: Pattern, model: str) -> SaapState:
    return SaapState(dict(layers), pattern_hash(pattern), repr(pattern), model)


def load_state(path: str | os.PathLike, pattern: Pattern, model: str) -> SaapState:
    """Read a state file and check it was trained for `pattern` and `model` (`SaapStateError`)."""
    meta, tensors = read_state_file(KIND, path, pattern, model)
    path = os.fspath(path)
    layers: dict[int, SaapLayer] = {}
    try:
        ids = [int(x) for x in meta.get("layers", "").split(",") if x]
        for i in ids:
            layers[i] = SaapLayer(tensors[f"layer{i}.centroids"], *(tensors[f"layer{i}.{p}"] for p in CLASSIFIER_PARTS))
    except (KeyError, ValueError) as e:
        raise SaapStateError(f"Saap state file {path!r} is incomplete: {e}") from None
    for i, st in layers.items():
        try:
            if st.centroids.dim() != 3:
                raise SaapStateError(f"centroids must be [Hkv, C, D], got {tuple(st.centroids.shape)}")
            st.check(st.centroids.shape[0], st.centroids.shape[2], f"Saap state layer {i}")
        except SASError as e:
            raise SaapStateError(str(e)) from None
    return SaapState(layers, pattern_hash(pattern), meta.get("pattern", ""), model)


__all__ = ["SaapState", "SaapStateError", "load_state", "make_state", "pattern_hash"]
