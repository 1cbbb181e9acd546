"""Offline method state on disk (Saap's `sas train`, Kascade's `sas calibrate`): one
safetensors file whose metadata names the method, the file format, the pattern it was made for
(a hash of the pattern's canonical text) and the model. `read_state_file` checks all of them
before anything runs and raises the method's own error type naming the file and the mismatch.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file

from sas.errors import SASError
from sas.lang.pattern import Pattern


def pattern_hash(pattern: Pattern) -> str:
    """sha256 (first 16 hex digits) of the pattern's canonical text (its repr)."""
    return hashlib.sha256(repr(pattern).encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class StateKind:
    """What distinguishes one method's state files: its metadata name, format, display name,
    error type, the verb for how a file is made ("trained", "calibrated") and the command."""

    method: str
    format: str
    title: str
    error: type[SASError]
    made: str
    command: str


def save_state_file(kind: StateKind, path: str | os.PathLike, tensors: dict[str, torch.Tensor],
                    meta: dict[str, str]) -> None:
    save_file(tensors, os.fspath(path), metadata={"sas_method": kind.method, "format": kind.format, **meta})


def read_state_file(kind: StateKind, path: str | os.PathLike, pattern: Pattern,
                    model: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(metadata, tensors) of a state file made for `pattern` and `model`; `kind.error` when it is
    missing, unreadable, of another method or format, or made for another pattern or model."""
    path = os.fspath(path)
    err = kind.error
    if not os.path.isfile(path):
        raise err(f"{kind.title} state file {path!r} does not exist (make one with `{kind.command}`)")
    try:
        with safe_open(path, framework="pt") as f:
            meta: dict[str, Any] = f.metadata() or {}
        tensors = load_file(path)
    except (SafetensorError, OSError, ValueError) as e:
        raise err(f"{kind.title} state file {path!r} is not a readable safetensors file: {e}") from None
    if meta.get("sas_method") != kind.method or meta.get("format") != kind.format:
        raise err(f"{kind.title} state file {path!r} is not a {kind.title} state of format {kind.format} "
                  f"(metadata: sas_method={meta.get('sas_method')!r}, format={meta.get('format')!r})")
    want = pattern_hash(pattern)
    if meta.get("pattern_hash") != want:
        raise err(f"{kind.title} state file {path!r} was {kind.made} for pattern {meta.get('pattern')!r} "
                  f"(hash {meta.get('pattern_hash')}), not for {pattern!r} (hash {want}); run `{kind.command}` "
                  f"again")
    if meta.get("model") != model:
        raise err(f"{kind.title} state file {path!r} was {kind.made} for model {meta.get('model')!r}, not {model!r}")
    return meta, tensors


__all__ = ["StateKind", "pattern_hash", "read_state_file", "save_state_file"]
