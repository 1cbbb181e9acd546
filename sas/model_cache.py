"""A disk cache of dequantized GGUF models, so that a GGUF file is converted once, not on
every `load_model`.

transformers reads a GGUF file by dequantizing every tensor in numpy and converting the
tokenizer (for SmolLM2-135M about 30 s on a 2-core machine); the same model saved as a
transformers checkpoint (float32 safetensors + tokenizer.json) loads in under a second.
`load_model` therefore converts a GGUF file once, saves the result under

    $SAS_MODEL_CACHE/<file stem>-<key>/     (default ~/.cache/sas/models; off: SAS_MODEL_CACHE=off)

and reads that folder from then on. The key hashes the GGUF file's absolute path, size and
modification time, the transformers version and this cache's format version, so a changed
file or a different converter never reads a stale copy. An entry is written into a temporary
folder beside it and renamed into place when complete (a crash leaves no half-written
entry); concurrent loaders of the same file (pytest-xdist workers, torchrun ranks) take a
file lock, so one converts and the others wait and read its copy. A cache that cannot be
written (read-only home, full disk) warns and the model still loads from the GGUF file.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

#: Bump when the layout of an entry changes.
FORMAT_VERSION = 1
ENV = "SAS_MODEL_CACHE"
_OFF = {"off", "0", "false", "no", "none"}
_COMPLETE = "sas-complete"


def cache_root() -> Path | None:
    """The cache folder (`$SAS_MODEL_CACHE`, else `$XDG_CACHE_HOME/sas/models`, else
    ~/.cache/sas/models), or None when the variable turns the cache off."""
    env = os.environ.get(ENV, "").strip()
    if env.lower() in _OFF:
        return None
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sas" / "models"


def entry_key(gguf_path: Path) -> str:
    """The key of a GGUF file's entry: its identity on disk and the converter's version."""
    import transformers

    p = gguf_path.resolve()
    st = p.stat()
    ident = f"{p}|{st.st_size}|{st.st_mtime_ns}|transformers {transformers.__version__}|format {FORMAT_VERSION}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def entry_dir(root: Path, gguf_path: Path) -> Path:
    return root / f"{gguf_path.stem}-{entry_key(gguf_path)}"


def is_complete(entry: Path) -> bool:
    return (entry / _COMPLETE).is_file() and (entry / "config.json").is_file()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on `path` (fcntl where it exists; no lock elsewhere)."""
    try:
        import fcntl
    except ImportError:        # not POSIX: concurrent loaders may convert twice, never clash (rename)
        yield
        return
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _save(entry: Path, model: Any, tokenizer: Any) -> None:
    """Write `model` (dequantized) and `tokenizer` as a transformers checkpoint at `entry`,
    through a temporary folder renamed into place."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    try:
        # The GGUF quantizer marks the model unserializable; its weights are plain tensors now.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _COMPLETE).write_text(f"sas model cache format {FORMAT_VERSION}\n")
        if entry.exists():
            shutil.rmtree(entry)
        os.replace(tmp, entry)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def cached_checkpoint(gguf_path: Path, convert: Callable[[], tuple[Any, Any]]) -> Path | None:
    """The folder of `gguf_path`'s converted checkpoint, converting it first with `convert()`
    (-> (model, tokenizer), the model dequantized to float32) when the cache lacks it. None
    when the cache is off or cannot be written (then the caller loads the GGUF file itself)."""
    root = cache_root()
    if root is None:
        return None
    try:
        root.mkdir(parents=True, exist_ok=True)
        entry = entry_dir(root, gguf_path)
        if is_complete(entry):
            return entry
        with _locked(root / f".{entry.name}.lock"):
            if not is_complete(entry):        # another process may have written it meanwhile
                model, tokenizer = convert()
                _save(entry, model, tokenizer)
        return entry
    except OSError as e:
        warnings.warn(f"sas: the model cache {root} cannot be used ({e}); loading {gguf_path.name} from the "
                      f"GGUF file (set {ENV}=off to silence this)", RuntimeWarning, stacklevel=3)
        return None


__all__ = ["ENV", "FORMAT_VERSION", "cache_root", "cached_checkpoint", "entry_dir", "entry_key", "is_complete"]
