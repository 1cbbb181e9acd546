"""Analysis time of the six paper Table-1 patterns at 16K, 128K and 1M tokens (one CPU core).

Run: `python benchmarks/bench_analysis.py [--markdown]` (the Makefile pins one core with taskset
where available). Prints cache size, slot scheme and the median wall time of `sas.analyze`
over a few repeats; never asserted anywhere.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import platform  # noqa: E402
import runpy  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from datetime import date  # noqa: E402
from pathlib import Path  # noqa: E402

from sas import analyze  # noqa: E402
from sas.ir.periodicity import structure  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["streaming_llm", "block_local", "sliding_window", "openai_strided", "openai_fixed",
         "strided_block_local"]
LENGTHS = [16384, 131072, 1048576]
PAPER_TABLE4 = {"streaming_llm": "16K -> 1056", "block_local": "16K -> 384", "sliding_window": "16K -> 1K",
                "openai_strided": "16K -> 15.5K", "openai_fixed": "16K -> 15.8K",
                "strided_block_local": "16K -> 64"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = ap.parse_args()
    rows = []
    for name in NAMES:
        pattern = runpy.run_path(str(ROOT / "examples" / f"{name}.py"))["pattern"]
        for n in LENGTHS:
            times = []
            for _ in range(args.repeats):
                structure.cache_clear()
                t0 = time.perf_counter()
                a = analyze(pattern, n)
                times.append(time.perf_counter() - t0)
            rows.append((name, n, a.cache_size, a.scheme, a.closed_form, statistics.median(times)))
    if args.markdown:
        print(f"Measured {date.today()} on {platform.processor() or platform.machine()}, "
              f"Python {platform.python_version()}, one core.\n")
        print("| pattern | max_len | cache size | scheme | closed form | analyze (ms) |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {'yes' if r[4] else 'no'} | {r[5] * 1000:.1f} |")
    else:
        print(f"{'pattern':22s} {'max_len':>8s} {'cache':>8s} {'scheme':12s} {'closed':6s} {'ms':>8s}")
        for r in rows:
            print(f"{r[0]:22s} {r[1]:8d} {r[2]:8d} {r[3]:12s} {str(r[4]):6s} {r[5] * 1000:8.1f}")


if __name__ == "__main__":
    main()
