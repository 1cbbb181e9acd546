"""The repository's `examples/` folder and the names of its pattern scripts."""

from __future__ import annotations

import runpy
from pathlib import Path

from sas import Pattern

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

#: the six Table-1 patterns of the paper, each in examples/NAME.py (and NAME.sas)
TABLE1_NAMES = ["streaming_llm", "block_local", "sliding_window", "openai_strided", "openai_fixed",
                "strided_block_local"]


def example_namespace(name: str) -> dict:
    """Run examples/NAME.py with runpy and return its module namespace."""
    return runpy.run_path(str(EXAMPLES / f"{name}.py"))


def example_pattern(name: str) -> Pattern:
    """The `pattern` variable of examples/NAME.py (run with runpy, not sas.load_pattern)."""
    return example_namespace(name)["pattern"]


__all__ = ["ROOT", "EXAMPLES", "TABLE1_NAMES", "example_namespace", "example_pattern"]
