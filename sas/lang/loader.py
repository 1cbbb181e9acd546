"""Load a pattern from a file: a Python pattern script (`.py`) or a `.sas` text file.

A `.py` script is run in a fresh module namespace and must leave its pattern in the
module-level variable `pattern`. A `.sas` file is parsed by `sas.lang.text` (never run as
Python); its pattern is the definition named `pattern`, or the last definition.

Scripts load in isolation: like `python script.py`, a script may import the modules beside
it (`from common import W`), and those are its own. Modules of the same names loaded before
(by another script, or from elsewhere) are hidden while it runs, the modules it loads from
its folder are dropped from `sys.modules` afterwards, and `sys.path` is restored; so two
scripts in different folders that each import their own `common` each get theirs.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import runpy
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterator

from sas.errors import SASError
from sas.lang.pattern import Pattern
from sas.lang.text import choose_pattern, parse_sas

__all__ = ["load_pattern", "LOADERS"]

# The module name a script runs under: not "__main__", so `if __name__ == "__main__":`
# blocks (demos, benchmarks) do not run when the pattern is loaded.
_RUN_NAME = "__sas_pattern__"


#: Packages a script folder never shadows: the loader's own (a script beside a checkout of
#: sas must build its pattern from the same classes the loader checks against).
_NEVER_SHADOWED = frozenset({"sas"})


def _local_module_names(folder: Path) -> set[str]:
    """Top-level modules and regular packages in `folder` (a folder without `__init__.py`
    would only be a namespace portion, which loses to a regular package of the same name)."""
    suffixes = tuple(importlib.machinery.all_suffixes())
    names: set[str] = set()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return names
    for entry in entries:
        if entry.is_dir():
            if entry.name.isidentifier() and os.path.isfile(os.path.join(entry.path, "__init__.py")):
                names.add(entry.name)
        elif entry.name.endswith(suffixes):
            name = entry.name.split(".", 1)[0]
            if name.isidentifier():
                names.add(name)
    return names - _NEVER_SHADOWED


def _loaded_from(module: ModuleType | None, name: str, folder: Path) -> bool:
    """Is `module`, the top-level module `name`, the one in `folder` (a module file there, or
    the package, regular or namespace, `folder/name`)?"""
    places = [getattr(module, "__file__", None)]
    places += [str(Path(p) / "__init__.py") for p in (getattr(module, "__path__", None) or [])]
    for place in places:
        if isinstance(place, str):
            parent = Path(place).resolve().parent
            if parent == folder or parent == folder / name:
                return True
    return False


@contextmanager
def _isolated_imports(folder: Path) -> Iterator[None]:
    """Let code import the modules in `folder` as its own, and only while it runs: modules of
    the same names imported before are hidden meanwhile and put back afterwards; the modules
    it imports from `folder` are dropped (others, such as torch, stay imported); `sys.path` is
    restored, and so is the recursion limit (a script that lowers it would break the caller)."""
    saved_path = list(sys.path)
    saved_limit = sys.getrecursionlimit()
    before = set(sys.modules)
    local = _local_module_names(folder)
    hidden = {name: sys.modules.pop(name) for name in list(sys.modules) if name.split(".", 1)[0] in local}
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.setrecursionlimit(saved_limit)
        sys.path[:] = saved_path
        new = [name for name in sys.modules if name not in before or name in hidden]
        ours = {top for top in {name.split(".", 1)[0] for name in new}
                if top in local or (top not in before and top not in _NEVER_SHADOWED
                                    and _loaded_from(sys.modules.get(top), top, folder))}
        for name in new:
            if name.split(".", 1)[0] in ours:
                del sys.modules[name]
        sys.modules.update(hidden)


def _load_script(path: Path, notes: list[str] | None = None) -> Pattern:
    """Run a Python pattern script and return its module-level `pattern` (no notes)."""
    try:
        with _isolated_imports(path.parent.resolve()):
            namespace = runpy.run_path(str(path), run_name=_RUN_NAME)
    except SASError as e:   # a pattern error in the script: say where, keep its type
        raise _located(e, path) from e
    except SyntaxError as e:
        where = f" at line {e.lineno}" if e.lineno else ""
        raise SASError(f"{path}: syntax error in pattern script{where}: {e.msg}") from e
    except (Exception, SystemExit) as e:  # KeyboardInterrupt still stops the caller
        line = _script_lineno(e, path)
        raise SASError(f"{path}: the pattern script failed{f' at line {line}' if line else ''}: "
                       f"{type(e).__name__}: {e}") from e
    if "pattern" not in namespace:
        raise SASError(f"{path}: the script defines no module-level variable 'pattern'; "
                       f"assign the final pattern to it, e.g. `pattern = (window + sink) * Causal()`")
    pattern = namespace["pattern"]
    if not isinstance(pattern, Pattern):
        raise SASError(f"{path}: 'pattern' must be a sas pattern (Rect, Diag, Dynamic, ...), "
                       f"got {type(pattern).__name__}")
    return pattern


def _located(e: SASError, path: Path) -> SASError:
    """`e` with the script and its line in front of the message ("script.py, line 3: ..."), as the
    same exception type where it takes a message alone (else a plain SASError)."""
    message = str(e)
    if message.startswith(str(path)):
        return e
    line = _script_lineno(e, path)
    where = f"{path}, line {line}" if line else str(path)
    try:
        return type(e)(f"{where}: {message}")
    except TypeError:
        return SASError(f"{where}: {message}")


def _script_lineno(e: BaseException, path: Path) -> int | None:
    """The line of the innermost traceback frame inside the script, else None."""
    target = os.path.realpath(path)
    lines = [f.lineno for f in traceback.extract_tb(e.__traceback__)
             if os.path.realpath(f.filename) == target]
    return lines[-1] if lines else None


def _load_text(path: Path, notes: list[str] | None = None) -> Pattern:
    """Parse a `.sas` file and return its pattern (`choose_pattern`; its note, if any, appended
    to `notes`)."""
    try:
        text = path.read_text(encoding="utf-8-sig")   # a byte-order mark is not part of the text
    except UnicodeDecodeError as e:
        raise SASError(f"{path}: a .sas file must be UTF-8 text ({e.reason} at byte {e.start})") from None
    pattern, note = choose_pattern(parse_sas(text, str(path)), str(path))
    if note is not None and notes is not None:
        notes.append(note)
    return pattern


#: File extension -> loader.
LOADERS: dict[str, Callable[[Path, list[str] | None], Pattern]] = {".py": _load_script, ".sas": _load_text}


def load_pattern(path: str | os.PathLike[str], *, notes: list[str] | None = None) -> Pattern:
    """Load the pattern defined by a `.py` script or a `.sas` file; `notes`, a list, gets what
    the caller should tell its user (a `.sas` file of several definitions and no `pattern`
    names the one taken).

    Raises `SASError` when the extension is unknown, the file is missing, the script does
    not define a `pattern`, or the file does not parse; `SASError`s raised by the script
    itself propagate unchanged.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise SASError(f"load_pattern: path must be a str or os.PathLike naming a .py or .sas file, got "
                       f"{type(path).__name__}")
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
    return loader(p, notes)
