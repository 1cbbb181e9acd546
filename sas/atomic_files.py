"""Files replaced whole: written to a temporary file beside the target, then renamed into place,
so a reader never sees one half-written and a failure leaves the old file (or none)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Callable


def replace_file(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """`write(tmp)` fills a temporary file beside `path` (folders created), which then replaces
    `path`. The file is created with mode 0666 less the process's umask, as a plain new file
    would be (a `tempfile.mkstemp` file is 0600; reading the umask would set it for a moment,
    for every thread). On any error the temporary file is removed."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = str(out.parent / f".{out.name}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


__all__ = ["replace_file"]
