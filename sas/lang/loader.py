"""Load a pattern from a file: a Python pattern script (`.py`) or a `.sas` text file.

A `.py` script is run in a fresh module namespace and must leave its pattern in the
module-level variable `pattern`. A `.sas` file is parsed by `sas.lang.text` (never run as
Python); its pattern is the definition named `pattern`, or the last definition.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from pathlib import Path
from typing import Callable

from sas.errors import SASError
from sas.lang.pattern import Pattern
from sas.lang.text import load_sas

__all__ = ["load_pattern", "LOADERS"]

# The module name a script runs under: not "__main__", so `if __name__ == "__main__":`
# blocks (demos, benchmarks) do not run when the pattern is loaded.
_RUN_NAME = "__sas_pattern__"


def _load_script(path: Path) -> Pattern:
    """Run a Python pattern script and return its module-level `pattern`."""
    # Like `python script.py`, let the script import modules that sit next to it.
    script_dir = str(path.parent.resolve())
    sys.path.insert(0, script_dir)
    try:
        namespace = runpy.run_path(str(path), run_name=_RUN_NAME)
    except SASError:
        raise
    except SyntaxError as e:
        raise SASError(f"{path}: syntax error in pattern script at line {e.lineno}: {e.msg}") from e
    except (Exception, SystemExit) as e:  # KeyboardInterrupt still stops the caller
        raise SASError(f"{path}: the pattern script failed{_script_line(e, path)}: "
                       f"{type(e).__name__}: {e}") from e
    finally:
        try:
            sys.path.remove(script_dir)
        except ValueError:
            pass
    if "pattern" not in namespace:
        raise SASError(f"{path}: the script defines no module-level variable 'pattern'; "
                       f"assign the final pattern to it, e.g. `pattern = (window + sink) * Causal()`")
    pattern = namespace["pattern"]
    if not isinstance(pattern, Pattern):
        raise SASError(f"{path}: 'pattern' must be a sas pattern (Rect, Diag, Dynamic, ...), "
                       f"got {type(pattern).__name__}")
    return pattern


def _script_line(e: BaseException, path: Path) -> str:
    """' at line N' for the innermost traceback frame inside the script, else ''."""
    target = os.path.realpath(path)
    lines = [f.lineno for f in traceback.extract_tb(e.__traceback__)
             if os.path.realpath(f.filename) == target]
    return f" at line {lines[-1]}" if lines else ""


def _load_text(path: Path) -> Pattern:
    """Parse a `.sas` file and return its pattern."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise SASError(f"{path}: a .sas file must be UTF-8 text ({e.reason} at byte {e.start})") from None
    return load_sas(text, str(path))


#: File extension -> loader.
LOADERS: dict[str, Callable[[Path], Pattern]] = {".py": _load_script, ".sas": _load_text}


def load_pattern(path: str | os.PathLike[str]) -> Pattern:
    """Load the pattern defined by a `.py` script or a `.sas` file.

    Raises `SASError` when the extension is unknown, the file is missing, the script does
    not define a `pattern`, or the file does not parse; `SASError`s raised by the script
    itself propagate unchanged.
    """
    p = Path(path)
    loader = LOADERS.get(p.suffix.lower())
    if loader is None:
        valid = ", ".join(LOADERS)
        raise SASError(f"{p}: unknown pattern file type {p.suffix or '(no extension)'!r}; "
                       f"valid extensions: {valid}")
    if not p.exists():
        raise SASError(f"{p}: no such file")
    if not p.is_file():
        raise SASError(f"{p}: not a file")
    return loader(p)
