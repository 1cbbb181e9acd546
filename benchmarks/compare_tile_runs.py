"""Compare the prefill tile schedules (`sas.ir.tile_runs`) of two checkouts of sas.

`python benchmarks/compare_tile_runs.py OLD_ROOT NEW_ROOT [--large K]` runs `--dump` under each
root in a subprocess (PYTHONPATH=ROOT) and checks that every case gives the same full / partial
runs (or the same error). Cases: the 300 random compositions of `bench_analysis.py --random`
(tests/strategies.py `causal_patterns(max_depth=4)`, derandomized; drawn from this file's
checkout) at small shapes (square, ragged, offset queries, several tile sizes) and as a sampled
window of 4 query blocks at 2^20 keys, every K-th of them (default 30) on the whole 2^20 x 2^20
problem, and the Table-1 examples and the issue-11 patterns without a periodic description at
2^20. Prints the time of each side.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
EXAMPLES = ["streaming_llm", "block_local", "sliding_window", "openai_strided", "strided_block_local"]
HARD = ["((Rect(size=(3, 2)) >> Diag(0, 2)) + Diag(0, 16)) * Diag(0, 64)",
        "(Rect(size=(3, 2)) >> Diag(0, 2)) * Causal()",
        "(Rect(size=(2, 3)) >> Diag(0, 1)) * Causal()",
        "(Rect(size=(2, 16)) >> Diag(0, 1)) * Diag(0, 64)",
        "((Rect(size=(3, 2)) >> Diag(0, 2)) + Diag(0, None, stride=1024)) * Causal()"]
N = 1 << 20
LIMIT = 30   # seconds a case; a case over it on either side is counted, not compared
SMALL = [(1000, 1000, 64, 32, None), (777, 2048, 64, 64, None), (4096, 4096, 128, 64, None),
         (300, 5000, 16, 16, 123), (2500, 2500, 64, 64, None)]


def cases(large_every: int):
    sys.path.insert(0, str(HERE / "tests"))
    from hypothesis import HealthCheck, given, settings
    from strategies import causal_patterns

    from sas import Causal, Diag, Rect  # noqa: F401

    pats = []

    @settings(max_examples=300, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(causal_patterns(max_depth=4))
    def draw(p) -> None:
        pats.append(p)

    draw()
    out = []
    for i, p in enumerate(pats):
        for s in SMALL:
            out.append((f"random {i} {s}", p, s))
        out.append((f"random {i} window", p, (256, N, 64, 64, N - 256 - 4096 * 64)))
        if i % large_every == 0:
            out.append((f"random {i} 2^20", p, (N, N, 64, 64, None)))
    for name in EXAMPLES:
        p = runpy.run_path(str(HERE / "examples" / f"{name}.py"))["pattern"]
        out += [(f"{name} 2^20 64x64", p, (N, N, 64, 64, None)), (f"{name} 2^20 64x32", p, (N, N, 64, 32, None))]
    for src in HARD:
        p = eval(src)
        out += [(f"{src} 2^20 64x32", p, (N, N, 64, 32, None)), (f"{src} 40000 64x64", p, (40000, 40000, 64, 64, None))]
    return out


def _alarm(*_):
    raise TimeoutError


def dump(large_every: int, path: str) -> None:
    from sas.ir.tile_runs import tile_runs
    signal.signal(signal.SIGALRM, _alarm)
    res = {}
    for key, p, (q, k, bm, bn, off) in cases(large_every):
        t0 = time.perf_counter()
        signal.alarm(LIMIT)
        try:
            r = tile_runs(p, q, k, bm, bn, off)
            h = hashlib.sha256()
            for a in (r.full_ptr, r.full_runs, r.part_ptr, r.part_runs):
                h.update(str(a.dtype).encode() + str(a.shape).encode() + a.tobytes())
            val = ("ok", h.hexdigest(), r.counts())
        except TimeoutError:
            val = ("timeout",)
        except Exception as e:   # the same error on both sides counts as the same result
            val = ("error", type(e).__name__, str(e)[:200])
        signal.alarm(0)
        res[key] = (val, time.perf_counter() - t0)
    with open(path, "wb") as f:
        pickle.dump(res, f)


def main() -> None:
    if sys.argv[1] == "--dump":
        dump(int(sys.argv[2]), sys.argv[3])
        return
    old, new = sys.argv[1], sys.argv[2]
    every = int(sys.argv[sys.argv.index("--large") + 1]) if "--large" in sys.argv else 30
    procs, files = [], []
    for i, root in enumerate((old, new)):
        f = f"/tmp/compare_tile_runs_{os.getpid()}_{i}.pkl"
        env = dict(os.environ, PYTHONPATH=root)
        procs.append(subprocess.Popen([sys.executable, __file__, "--dump", str(every), f], cwd=root, env=env))
        files.append(f)
    for pr in procs:
        if pr.wait():
            sys.exit(f"a dump failed ({pr.args})")
    a, b = (pickle.load(open(f, "rb")) for f in files)
    assert a.keys() == b.keys()
    slow = [k for k in a if "timeout" in (a[k][0][0], b[k][0][0])]
    diff = [k for k in a if a[k][0] != b[k][0] and k not in slow]
    print(f"{len(slow)} cases over {LIMIT} s on a side (not compared): " + "; ".join(
        f"{k} old {a[k][0][0]} new {b[k][0][0]}" for k in slow))
    errors = sum(v[0][0] == "error" for v in a.values())
    print(f"{len(a)} cases, {len(diff)} differ, {errors} errors on both sides")
    for k in diff[:20]:
        print("DIFF", k, a[k][0], b[k][0])
    ta, tb = sum(v[1] for v in a.values()), sum(v[1] for v in b.values())
    print(f"total time old {ta:.1f} s, new {tb:.1f} s")
    slow = sorted(a, key=lambda k: -a[k][1])[:12]
    print(json.dumps({k: [round(a[k][1], 2), round(b[k][1], 2)] for k in slow}, indent=0))
    sys.exit(1 if diff else 0)


if __name__ == "__main__":
    main()
