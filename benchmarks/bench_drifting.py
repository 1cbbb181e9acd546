"""Analysis time of compositions without a periodic description at max_len 2^20 (issue 11).

Draws the test suite's `drifting()` strategy (tests/test_per_token.py: spreads of a non-square
unit over a diagonal layout, combined with random patterns), derandomized so every run sees the
same compositions, multiplies each by `Causal()` and times `sas.analyze` once on it. Prints the
outcome counts, p50 / p99 / max and the compositions over one second (an analysis still running
after `--timeout` seconds is stopped and counted as such).

    taskset -c 0 python benchmarks/bench_drifting.py --count 150
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from hypothesis import HealthCheck, given, settings  # noqa: E402

from sas import Causal, analyze  # noqa: E402
from sas.errors import AnalysisError  # noqa: E402
from test_per_token import drifting  # noqa: E402


class _TimedOut(Exception):
    pass


def _alarm(signum, frame):
    raise _TimedOut()


def main() -> None:
    signal.signal(signal.SIGALRM, _alarm)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=150)
    ap.add_argument("--max-len", type=int, default=1 << 20)
    ap.add_argument("--timeout", type=int, default=30, help="stop an analysis after this many seconds")
    ap.add_argument("--verbose", action="store_true", help="print each composition as it is analysed")
    args = ap.parse_args()
    rows: list[tuple[float, str, str]] = []

    @settings(max_examples=args.count, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(drifting())
    def draw(p) -> None:
        q = p * Causal()
        if args.verbose:
            print(f"start {repr(q)[:400]}", flush=True)
        t = time.perf_counter()
        signal.alarm(args.timeout)
        try:
            a = analyze(q, args.max_len)
            kind = "closed form" if a.closed_form else "table"
        except AnalysisError as e:
            kind = "empty" if "empty" in str(e) else f"refused: {str(e)[:60]}"
        except _TimedOut:
            kind = f"stopped after {args.timeout} s"
        finally:
            signal.alarm(0)
        rows.append((time.perf_counter() - t, kind, repr(q)))
        if args.verbose:
            print(f"{rows[-1][0]:.3f} {kind} {repr(q)[:150]}", flush=True)

    draw()
    times = sorted(r[0] for r in rows)
    print(f"{len(rows)} drawn compositions times Causal() at max_len {args.max_len}:")
    for kind, c in Counter(r[1] for r in rows).most_common():
        print(f"  {kind}: {c}")
    p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
    print(f"analysis time: p50 {statistics.median(times):.3f} s, p99 {p99:.3f} s, max {times[-1]:.3f} s")
    for dt, kind, text in sorted(rows, reverse=True):
        if dt < 1.0:
            break
        print(f"  over 1 s: {dt:.2f} s {kind} {text[:160]}")


if __name__ == "__main__":
    main()
