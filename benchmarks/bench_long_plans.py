"""Set-up at any length (issue 11, items 1-2): `sas compile` of the Table-1 patterns and fully
causal attention, and the dynamic layout of Table 1 + H2O (budget 512), at 2^24 and 2^30 tokens,
on the CPU: wall time, peak traced Python memory (tracemalloc: numpy and torch CPU buffers),
the plan file's bytes and the schedules' rows.

    python benchmarks/bench_long_plans.py [--lengths 24,30] [--out results/NAME]

Prints a markdown table last (and writes NAME.md / NAME.json with --out).
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_kernels import write_results  # noqa: E402

from sas import Causal, Dynamic, load_pattern  # noqa: E402
from sas.codegen.compile import compile_pattern  # noqa: E402
from sas.dynamic.cache_plan import dynamic_cache_plan  # noqa: E402

NAMES = ("streaming_llm", "block_local", "sliding_window", "openai_strided", "openai_fixed", "strided_block_local")


def measured(fn):
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        out, error = fn(), None
    except Exception as e:  # noqa: BLE001 - a refusal is a result here
        out, error = None, f"{type(e).__name__}: {str(e)[:120]}"
    took = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return out, error, took, peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="24,30", help="log2 of the lengths")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    patterns = {name: load_pattern(str(ROOT / "examples" / f"{name}.sas")) for name in NAMES}
    patterns["causal"] = Causal()
    for e in (int(x) for x in args.lengths.split(",")):
        n = 1 << e
        for name, p in patterns.items():
            with tempfile.TemporaryDirectory() as tmp:
                rep, err, took, peak = measured(lambda: compile_pattern(p, Path(tmp) / "k", max_len=n, head_dim=128))
            pre = rep["prefill"] if rep else {}
            rows.append({"what": "sas compile", "pattern": name, "log2_len": e, "seconds": took, "peak_mb": peak / 2**20,
                         "plan_file_bytes": pre.get("plan_file_bytes"), "rows": pre.get("schedule_rows"),
                         "cache_slots": rep.get("cache_size") if rep else None, "error": err})
            print(json.dumps(rows[-1]), flush=True)
            if name == "causal":
                continue
            h2o = p + (Causal() * ~p) * Dynamic(budget=512)
            cp, err, took, peak = measured(lambda: dynamic_cache_plan(h2o, n))
            rows.append({"what": "dynamic layout (+ H2O 512)", "pattern": name, "log2_len": e, "seconds": took,
                         "peak_mb": peak / 2**20, "plan_file_bytes": None,
                         "rows": cp.table_rows if cp else None, "cache_slots": cp.cache_size if cp else None,
                         "error": err})
            print(json.dumps(rows[-1]), flush=True)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# `python benchmarks/bench_long_plans.py --lengths {args.lengths}` ({platform.processor() or 'CPU'}, "
             f"{when})", "",
             "| what | pattern | length | s | peak MB | plan.pt bytes | schedule rows | cache slots | refused |",
             "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['what']} | {r['pattern']} | 2^{r['log2_len']} | {r['seconds']:.2f} | {r['peak_mb']:.1f} | "
                     f"{r['plan_file_bytes'] or ''} | {r['rows'] or ''} | {r['cache_slots'] or ''} | "
                     f"{r['error'] or ''} |")
    text = "\n".join(lines)
    print(text)
    write_results(args.out, rows, text + "\n", indent=1)


if __name__ == "__main__":
    main()
