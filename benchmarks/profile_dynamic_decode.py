"""Where does an eager dynamic decode step spend its host time? (issue 11, item 5)

Runs `kernel.decode` of a static + H2O pattern (bench_dynamic.py's composition) many times at
position N - 2 on the GPU, as a model calls it, and prints (1) wall time per step with a
synchronize every step and without, against the CUDA-graph replay of the same step, and (2) the
cProfile of the host side, so the Python work per step can be cut where it is.

    python benchmarks/profile_dynamic_decode.py --pattern sliding_window --n 16384
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_dynamic import dynamic_of  # noqa: E402
from bench_kernels import load_pattern, median_ms  # noqa: E402

from sas.runtime import SASAttnKernel, dynamic_host  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pattern", default="sliding_window")
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--kv-heads", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--budget", type=int, default=512)
    args = ap.parse_args()
    dev = torch.device("cuda")
    B, Hq, Hkv, N, D = args.batch, args.heads, args.kv_heads, args.n, 128
    dt = torch.bfloat16
    P = N - 2
    g = torch.Generator(device=dev).manual_seed(0)
    k = torch.randn(B, Hkv, P, D, device=dev, dtype=dt, generator=g)
    v = torch.randn(B, Hkv, P, D, device=dev, dtype=dt, generator=g)
    qp = torch.randn(B, Hq, P, D, device=dev, dtype=dt, generator=g)
    qd = torch.randn(B, Hq, 1, D, device=dev, dtype=dt, generator=g)
    kd = torch.randn(B, Hkv, 1, D, device=dev, dtype=dt, generator=g)
    vd = torch.randn(B, Hkv, 1, D, device=dev, dtype=dt, generator=g)
    kern = SASAttnKernel(dynamic_of(load_pattern(args.pattern), args.budget), max_len=N)
    kern.prefill(qp, k, v)
    del qp
    rt = kern.dynamic
    host = rt.rt

    def eager():
        rt.length = P
        kern.decode(qd, kd, vd)

    for _ in range(3):
        eager()
    torch.cuda.synchronize()
    tabs = host.device_tables(dev)
    do = torch.empty_like(qd)

    def step():
        dynamic_host.step(host.kernels, host.state, qd, kd, vd, P, do, tabs, evict=True)
    graph_ms = median_ms(step, True, 100)
    bench_ms = median_ms(eager, False, 100)
    t = time.perf_counter()
    for _ in range(args.steps):
        eager()
    torch.cuda.synchronize()
    loop_ms = (time.perf_counter() - t) / args.steps * 1e3
    t = time.perf_counter()
    for _ in range(args.steps // 4):
        eager()
        torch.cuda.synchronize()
    sync_ms = (time.perf_counter() - t) / (args.steps // 4) * 1e3
    print(f"# {torch.cuda.get_device_name(dev)}; {args.pattern} + H2O({args.budget}), B={B} Hq={Hq} Hkv={Hkv} N={N}")
    print(f"graph replay {graph_ms * 1e3:.1f} us; eager (do_bench) {bench_ms * 1e3:.1f} us; eager loop "
          f"{loop_ms * 1e3:.1f} us/step; eager + synchronize {sync_ms * 1e3:.1f} us/step")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        eager()
    torch.cuda.synchronize()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
    print(s.getvalue()[:6000])


if __name__ == "__main__":
    main()
