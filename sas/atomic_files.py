"""Files replaced whole: written to a temporary file beside the target, then renamed into place,
so a reader never sees one half-written and a failure leaves the old file (or none)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def replace_file(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """`write(tmp)` fills a temporary file beside `path` (folders created), which then replaces
    `path`; the file gets the permissions a new file gets under the umask (a bare
    `tempfile.mkstemp` file is 0600). On any error the temporary file is removed."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        os.chmod(tmp, 0o666 & ~_umask())
        write(tmp)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


__all__ = ["replace_file"]
