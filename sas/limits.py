"""Host limits: memory checked before sas allocates a table whose size follows the sequence
length, and the threads its analysis may use.

Most of what a plan holds grows with the KV-cache size, not with `max_len` (docs/architecture.md,
"Sizes"). A few tables are per token or per tile where the pattern does not repeat: the region
schedule of a dynamic pattern with refresh=True or a region without a periodic description
(`enter_at`, `region_last`, ... over `max_len` positions), the per-token slot table of a
pattern without a closed-form slot scheme (about 48 bytes per token: `analyze` refuses it past
the limit, never for length alone), and the prefill tile schedule that `sas compile` writes for
`max_len` for a pattern without a tile period (`sas.ir.tile_period`). Each is estimated first and refused with a `KernelError`
giving the numbers when it would exceed `host_table_limit()` bytes: 1 GiB unless the
environment variable `SAS_HOST_TABLE_LIMIT` (bytes; K, M, G suffixes) says otherwise.

The per-token analysis (`sas.analysis.per_token`) searches chunks of keys in threads (numpy
releases the interpreter lock inside its array operations): `analysis_threads()`, the CPUs this
process may run on (at most `MAX_ANALYSIS_THREADS`) unless `SAS_ANALYSIS_THREADS` says
otherwise (1: one thread, as a process pinned to one core gets anyway).
"""

from __future__ import annotations

import os
import re

import numpy as np

from sas.errors import AnalysisError, KernelError, SASError

#: Most threads the analysis uses by default, whatever the CPU count.
MAX_ANALYSIS_THREADS = 8
#: Default largest host table, in bytes.
DEFAULT_HOST_TABLE_LIMIT = 1 << 30

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def positive_length(where: str, max_len: object, error: type[SASError] = KernelError) -> int:
    """`max_len` as a Python int: a positive int or numpy integer (not a bool), else `error`."""
    if isinstance(max_len, bool) or not isinstance(max_len, (int, np.integer)) or max_len <= 0:
        raise error(f"{where}: max_len must be a positive integer, got {max_len!r}")
    return int(max_len)


def host_table_limit() -> int:
    """The largest host-side table sas builds, in bytes (`SAS_HOST_TABLE_LIMIT` or 1 GiB)."""
    text = os.environ.get("SAS_HOST_TABLE_LIMIT", "").strip()
    if not text:
        return DEFAULT_HOST_TABLE_LIMIT
    m = re.fullmatch(r"(\d+)\s*([kKmMgG]?)", text)
    if not m:
        raise KernelError(f"SAS_HOST_TABLE_LIMIT must be a byte count such as 1073741824 or 1G, got {text!r}")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def analysis_threads() -> int:
    """Threads the per-token analysis may use: `SAS_ANALYSIS_THREADS` (a positive integer) or
    the CPUs this process may run on, at most `MAX_ANALYSIS_THREADS`."""
    text = os.environ.get("SAS_ANALYSIS_THREADS", "").strip()
    if not text:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return max(1, min(cpus, MAX_ANALYSIS_THREADS))
    if not re.fullmatch(r"\d+", text) or int(text) < 1:
        raise AnalysisError(f"SAS_ANALYSIS_THREADS must be a positive integer such as 1 or 4, got {text!r}")
    return int(text)


def format_bytes(n: int) -> str:
    """`n` bytes in binary units, e.g. '1.5 GiB'."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def check_host_bytes(what: str, nbytes: int, hint: str) -> None:
    """Raise `KernelError` naming `what`, its size and the limit when `nbytes` exceeds it."""
    limit = host_table_limit()
    if nbytes > limit:
        raise KernelError(f"{what} would take about {format_bytes(nbytes)} of host memory ({nbytes} bytes), "
                          f"more than the limit of {format_bytes(limit)} (SAS_HOST_TABLE_LIMIT); {hint}")


__all__ = ["DEFAULT_HOST_TABLE_LIMIT", "MAX_ANALYSIS_THREADS", "analysis_threads", "check_host_bytes", "format_bytes",
           "host_table_limit"]
