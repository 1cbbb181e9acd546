"""Analysis time of the six paper Table-1 patterns at 16K, 128K and 1M tokens, and of
compositions a user writes next.

Run: `python benchmarks/bench_analysis.py [--markdown]` (the Makefile pins one core with taskset
where available; unpinned, the per-token analysis uses `sas.limits.analysis_threads()` threads,
which the output names). Prints cache size, slot scheme and the median wall time of `sas.analyze`
over a few repeats; never asserted anywhere.

`--random N [--random-max-len L]`: N random compositions of the primitives (windows, strided
and offset Rects and Diags, spreads, sums, products, NOT, Dynamic regions; the test suite's
hypothesis strategy `causal_patterns`, derandomized so every run draws the same ones), each
analysed once at max_len L: how many get a closed form, a padded closed form, a table, are
empty or refused (and why), and the p50 / p99 / max analysis time. `--deep N`: the same for
N compositions of a harder seeded generator (`deep_pattern`: trees up to depth 5, spreads whose
layout is a NOT, a strided or offset Rect or a long strided Diag, products of strided diagonals,
parameters up to 200; composition k is drawn from `random.Random(k)`, so `--deep-from K` resumes
the list). `--hard`: the compositions of issue 11 (strided window, chunked attention at 1K..64K,
two-scale block-local) at 2^20.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import platform  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
from collections import Counter  # noqa: E402
import runpy  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from datetime import date  # noqa: E402
from pathlib import Path  # noqa: E402

from sas import Causal, Diag, Rect, analyze  # noqa: E402
from sas.errors import AnalysisError  # noqa: E402
from sas.ir.emptiness import provably_empty  # noqa: E402
from sas.ir.periodicity import structure  # noqa: E402
from sas.lang.pattern import Pattern  # noqa: E402
from sas.limits import analysis_threads  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["streaming_llm", "block_local", "sliding_window", "openai_strided", "openai_fixed",
         "strided_block_local"]
LENGTHS = [16384, 131072, 1048576]
PAPER_TABLE4 = {"streaming_llm": "16K -> 1056", "block_local": "16K -> 384", "sliding_window": "16K -> 1K",
                "openai_strided": "16K -> 15.5K", "openai_fixed": "16K -> 15.8K",
                "strided_block_local": "16K -> 64"}


def _timed(pattern, n: int, keep: list | None = None) -> tuple[str, float, str]:
    """(outcome, seconds, detail) of one analysis (the analysis appended to `keep` if given)."""
    structure.cache_clear()
    provably_empty.cache_clear()
    t0 = time.perf_counter()
    try:
        a = analyze(pattern, n)
        if keep is not None:
            keep.append(a)
    except AnalysisError as e:
        dt = time.perf_counter() - t0
        msg = str(e)
        kind = ("empty" if "attends no key" in msg else "refused: window limit" if "window of" in msg
                else "refused: runs limit" if "runs limit" in msg or "shapes limit" in msg
                else "refused: no periodic description" if "periodic description" in msg
                else "refused: no closed form" if "no closed-form" in msg else "refused: other")
        return kind, dt, msg[:160]
    dt = time.perf_counter() - t0
    if not a.closed_form:
        return "table", dt, f"{a.cache_size} slots"
    if a.minimal_cache_size is not None:
        return "padded closed form", dt, f"{a.cache_size} slots, minimal {a.minimal_cache_size}"
    return "closed form", dt, f"{a.cache_size} slots, {a.scheme}"


def random_compositions(count: int, n: int, markdown: bool) -> None:
    # the test suite's strategy (tests/strategies.py), drawn by a derandomized hypothesis run
    sys.path.insert(0, str(ROOT / "tests"))
    from hypothesis import HealthCheck, given, settings
    from strategies import causal_patterns

    results: list[tuple[str, float, str, str]] = []

    @settings(max_examples=count, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(causal_patterns(max_depth=4))
    def draw(p) -> None:
        kind, dt, detail = _timed(p, n)
        results.append((kind, dt, detail, repr(p)))

    draw()
    _summary(results, "random compositions", n, markdown)


def deep_pattern(r: random.Random, big: int, depth: int) -> Pattern:
    """A random composition of depth <= `depth` with parameters up to about `big` (`--deep`)."""
    if depth <= 0 or r.random() < 0.2:
        return _deep_leaf(r, big)
    c = r.random()
    if c < 0.25:
        return deep_pattern(r, big, depth - 1) + deep_pattern(r, big, depth - 1)
    if c < 0.5:
        return deep_pattern(r, big, depth - 1) * deep_pattern(r, big, depth - 1)
    if c < 0.7:
        return ~deep_pattern(r, big, depth - 1)
    return _deep_unit(r, big, depth - 1) >> deep_pattern(r, big, depth - 1)


def _deep_leaf(r: random.Random, big: int) -> Pattern:
    c = r.random()
    if c < 0.4:
        return _deep_rect(r, big)
    if c < 0.85:
        offset = r.randint(-big, big)
        size = r.choice([None, 1, r.randint(1, big), r.randint(1, 3 * big)])
        return Diag(offset, size, stride=r.choice([1, 1, 2, 3, 5, 7, big + 1]))
    return Causal()


def _deep_axis(r: random.Random, big: int) -> tuple[int | None, int | None] | None:
    c = r.random()
    if c < 0.2:
        return None
    a = r.randint(0, big)
    if c < 0.6:
        return (a, a + r.randint(1, big))
    if c < 0.8:
        return (a, None)
    if c < 0.9:
        return (None, r.randint(1, big))
    return (None, None)


def _deep_rect(r: random.Random, big: int) -> Rect:
    sr, sc = (r.choice([1, 1, 2, 3, 5, 7, 13, big, 2 * big + 1]) for _ in range(2))
    kw = {}
    if r.random() < 0.6:
        kw = dict(stride=(sr, sc), offset=(r.randint(0, sr - 1), r.randint(0, sc - 1)))
    if r.random() < 0.3:
        return Rect(size=(r.randint(1, big), r.randint(1, big)), **kw)
    return Rect(rows=_deep_axis(r, big), cols=_deep_axis(r, big), **kw)


def _deep_unit(r: random.Random, big: int, depth: int) -> Pattern:
    h, w = r.randint(1, 6), r.randint(1, 6)
    box = (Rect(size=(h, w)) if r.random() < 0.5 else
           Rect(rows=(r.randint(0, h - 1), h), cols=(r.randint(0, w - 1), w), stride=(r.randint(1, 2), r.randint(1, 2))))
    if depth > 0 and r.random() < 0.4:
        return box * deep_pattern(r, big, depth - 1)
    if depth > 0 and r.random() < 0.2:
        return Rect(size=(2, 2)) >> (Rect(size=(3, 3)) * deep_pattern(r, big, depth - 1))
    return box


def deep_compositions(first: int, count: int, n: int, markdown: bool) -> None:
    results: list[tuple[str, float, str, str]] = []
    for k in range(first, first + count):
        r = random.Random(k)
        big = r.choice([3, 8, 20, 64, 200])
        p = deep_pattern(r, big, r.choice([2, 3, 4, 5])) * Causal()
        kind, dt, detail = _timed(p, n)
        results.append((kind, dt, detail, f"#{k} {p!r}"))
    _summary(results, f"deep compositions (#{first}..#{first + count - 1})", n, markdown)


def _machine() -> str:
    """The processor, Python and the analysis's threads (one on a process pinned to one core)."""
    threads = analysis_threads()
    return (f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, "
            f"{threads} analysis thread{'s' if threads > 1 else ''}")


def _summary(results: list[tuple[str, float, str, str]], what: str, n: int, markdown: bool) -> None:
    times = sorted(r[1] for r in results)
    p50, p99 = times[len(times) // 2], times[min(len(times) - 1, int(0.99 * len(times)))]
    counts = Counter(r[0] for r in results)
    slowest = max(results, key=lambda r: r[1])
    print(f"{len(results)} {what} at max_len {n}, measured {date.today()} on {_machine()}\n")
    print("| outcome | count |\n|---|---:|" if markdown else "outcome: count")
    for kind, c in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(f"| {kind} | {c} |" if markdown else f"  {kind}: {c}")
    print(f"\nanalysis time: p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, max {times[-1] * 1e3:.1f} ms "
          f"(slowest: {slowest[3][:120]}, {slowest[0]})")
    over = sorted((r for r in results if r[1] > 1.0), key=lambda r: -r[1])
    print(f"over 1 s: {len(over)}" + "".join(f"; {r[3][:48]} {r[1]:.2f} s ({r[0]})" for r in over))


HARD = {
    "strided window Diag(0, 1024, stride=4)": lambda: Diag(0, 1024, stride=4) * Causal(),
    **{f"chunked attention B={b}": (lambda b=b: (Rect(size=(b, b)) >> Diag(0, 1)) * Causal())
       for b in (1024, 2048, 4096, 8192, 65536)},
    "chunked attention B=65536 + 4 sinks": lambda: ((Rect(size=(65536, 65536)) >> Diag(0, 1))
                                                    + Rect(cols=(0, 4))) * Causal(),
    "chunked attention B=65536 + window 1024": lambda: ((Rect(size=(65536, 65536)) >> Diag(0, 1))
                                                        + Diag(0, 1024)) * Causal(),
    "chunks of 8192 + chunks of 3000 (period 3072000)": lambda: ((Rect(size=(8192, 8192)) >> Diag(0, 1))
                                                             + (Rect(size=(3000, 3000)) >> Diag(0, 1))) * Causal(),
    "chunks of 65536 + chunks of 65535 (period 2^32 - 2^16)": lambda: ((Rect(size=(65536, 65536)) >> Diag(0, 1))
                                                                  + (Rect(size=(65535, 65535)) >> Diag(0, 1)))
                                                                 * Causal(),
    "prefix-LM block (65536 keys to the end) + window 1024": lambda: (Rect(cols=(0, 65536)) + Diag(0, 1024))
                                                                   * Causal(),
    "chunks of 65536 + a strided diagonal (stride 65536)": lambda: ((Rect(size=(65536, 65536)) >> Diag(0, 1))
                                                                  + Diag(0, None, stride=65536)) * Causal(),
    "drifting spread + doubly negated strided band (no period)": lambda: (
        ((Rect(rows=(0, 3), cols=(0, 1)) * Rect(rows=(None, 2), cols=(0, 1), stride=(2, 1), offset=(1, 0)))
         >> Diag(5, 3, stride=2)) + ~~Diag(3, 3, stride=2)) * Causal(),
    "two-scale block-local with strides": lambda: ((Rect(size=(64, 64)) >> Diag(0, 2))
                                                   + (Rect(size=(16, 16)) >> Diag(0, 4)) * Rect(stride=(1, 2)))
                                                  * Causal(),
}


def hard_cases(n: int, markdown: bool) -> None:
    print(f"\ncompositions of issue 11 at max_len {n}:\n")
    if markdown:
        print("| pattern | outcome | analyze (s) | report() (s) | detail |\n|---|---|---:|---:|---|")
    for name, make in HARD.items():
        kept: list = []
        kind, dt, detail = _timed(make(), n, kept)
        rt = float("nan")
        if kept:
            t0 = time.perf_counter()
            kept[0].report()
            rt = time.perf_counter() - t0
        print(f"| {name} | {kind} | {dt:.2f} | {rt:.2f} | {detail} |" if markdown
              else f"{name:45s} {kind:22s} {dt:7.2f} s  report {rt:6.2f} s  {detail}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    ap.add_argument("--random", type=int, default=0, metavar="N", help="N random compositions instead")
    ap.add_argument("--random-max-len", type=int, default=1 << 20)
    ap.add_argument("--deep", type=int, default=0, metavar="N", help="N compositions of the deeper generator instead")
    ap.add_argument("--deep-from", type=int, default=0, metavar="K", help="the first of them (default 0)")
    ap.add_argument("--hard", action="store_true", help="the compositions of issue 11 instead")
    args = ap.parse_args()
    if args.random or args.deep or args.hard:
        if args.random:
            random_compositions(args.random, args.random_max_len, args.markdown)
        if args.deep:
            deep_compositions(args.deep_from, args.deep, args.random_max_len, args.markdown)
        if args.hard:
            hard_cases(1 << 20, args.markdown)
        return
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
        print(f"Measured {date.today()} on {_machine()}.\n")
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
