"""The six Table-1 patterns of the paper with the formulas of examples/*.py and small constants,
at three scales (keyed by the names of helpers.examples.TABLE1_NAMES):

- TABLE1_KERNELS: 32-token blocks, for the Triton kernels and their tile maps (several tiles of
  16 or 32 per block);
- TABLE1_ANALYSIS: 16-token blocks, for the analyzer's brute-force and decode-simulation checks;
- TABLE1_H2O: 8-token blocks, for the dynamic (H2O) runtime, small enough for the plain-Python
  reference of helpers.h2o.

Patterns are frozen values: the dicts are built once and shared."""

from __future__ import annotations

from sas import Causal, Diag, Pattern, Rect

TABLE1_KERNELS: dict[str, Pattern] = {
    "streaming_llm": (Diag(0, 24) + Rect(cols=(0, 4))) * Causal(),
    "block_local": (Rect(size=(16, 16)) >> Diag(0, 3)) * Causal(),
    "sliding_window": Diag(0, 24),
    "openai_strided": (Diag(0, 16) + Diag(0, None, stride=16)) * Causal(),
    "openai_fixed": ((Rect(size=(32, 32)) >> Diag(0, 1))
                     + ((Rect(size=(32, 32)) * Rect(cols=(28, None))) >> Rect())) * Causal(),
    "strided_block_local": (Rect(size=(32, 32)) >> Diag(0, 1)) * Rect(stride=4) * Causal(),
}

TABLE1_ANALYSIS: dict[str, Pattern] = {
    "streaming_llm": (Diag(0, 12) + Rect(cols=(0, 3))) * Causal(),
    "block_local": (Rect(size=(8, 8)) >> Diag(0, 3)) * Causal(),
    "sliding_window": Diag(0, 10),
    "openai_strided": (Diag(0, 6) + Diag(0, None, stride=6)) * Causal(),
    "openai_fixed": ((Rect(size=(16, 16)) >> Diag(0, 1))
                     + ((Rect(size=(16, 16)) * Rect(cols=(12, None))) >> Rect())) * Causal(),
    "strided_block_local": (Rect(size=(16, 16)) >> Diag(0, 1)) * Rect(stride=4) * Causal(),
}


def _h2o_scale() -> dict[str, Pattern]:
    window = Diag(0, 4)
    block = Rect(size=(8, 8))
    return {
        "streaming_llm": (window + Rect(cols=(0, 2))) * Causal(),
        "block_local": (Rect(size=(4, 4)) >> Diag(0, 3)) * Causal(),
        "sliding_window": Diag(0, 4),
        "openai_strided": (Diag(0, 4) + Diag(0, None, stride=4)) * Causal(),
        "openai_fixed": ((block >> Diag(0, 1)) + ((block * Rect(cols=(6, None))) >> Rect())) * Causal(),
        "strided_block_local": (block >> Diag(0, 1)) * Rect(stride=2) * Causal(),
    }


TABLE1_H2O: dict[str, Pattern] = _h2o_scale()

__all__ = ["TABLE1_KERNELS", "TABLE1_ANALYSIS", "TABLE1_H2O"]
