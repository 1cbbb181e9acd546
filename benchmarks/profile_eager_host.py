"""Host time of an eager dynamic decode step, layer by layer (issue 11, item 5: eager `decode`
within 1.3x of graph replay). A decode loop whose graph step is shorter than the host's work per
step runs at the host's pace; this script finds where that work goes.

A Table-1 pattern + H2O (budget 512) on a small shape (batch 1, 4 heads, head dim 128, 4K
tokens), so that the GPU step (a few us) is shorter than the host's work and a loop of steps
back to back measures the host. Each layer of the call stack is timed as a loop of its own at
advancing positions (the sequence prefilled once, long enough for every loop):

    SASAttnKernel.decode -> _DynamicSession.decode -> DynamicRuntime.decode -> Runtime.decode
    -> StepGraph.step -> CUDAGraph.replay

then one loop under cProfile (functions by own time).

    python benchmarks/profile_eager_host.py [--pattern block_local] [--steps 400]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_dynamic import dynamic_of  # noqa: E402
from bench_kernels import load_pattern  # noqa: E402

from sas.runtime import SASAttnKernel  # noqa: E402


def loop_us(fn, steps: int) -> float:
    """us per call of `fn` over `steps` calls back to back (one synchronize before and after)."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / steps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pattern", default="block_local")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--n", type=int, default=4096)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("profile_eager_host.py needs an NVIDIA GPU")
    dev = torch.device("cuda")
    B, H, D, N, S = 1, args.heads, 128, args.n, args.steps
    layers = 8
    P = N - layers * S - 8
    if P < 64:
        raise SystemExit(f"--n {N} leaves no prompt for {layers} loops of --steps {S}")
    torch.manual_seed(0)
    dt = torch.bfloat16
    k = torch.randn(B, H, P, D, device=dev, dtype=dt)
    v = torch.randn_like(k)
    q = torch.randn_like(k)
    qd, kd, vd = (torch.randn(B, H, 1, D, device=dev, dtype=dt) for _ in range(3))
    kern = SASAttnKernel(dynamic_of(load_pattern(args.pattern), 512), max_len=N)
    with torch.no_grad():
        kern.prefill(q, k, v)
        for _ in range(4):              # compile, capture
            kern.decode(qd, kd, vd)
        sess = kern._session
        dyn = sess.runtime               # sas.dynamic runtime (DynamicRuntime)
        rt = dyn.rt                      # sas.runtime.dynamic_host.Runtime
        g = rt._graph
        shape = g.out.shape

        def graph_step():
            g.step(qd, kd, vd, rt.length)
            rt.length += 1

        def replay():               # the graph advances the device's position: the host follows
            g.graph.replay()
            rt.length += 1
            g.pos_at = rt.length

        rows = [("SASAttnKernel.decode", lambda: kern.decode(qd, kd, vd)),
                ("_DynamicSession.decode", lambda: sess.decode("x", qd, kd, vd)),
                ("dynamic runtime .decode", lambda: dyn.decode(qd, kd, vd)),
                ("dynamic_host.Runtime.decode", lambda: rt.decode(qd, kd, vd)),
                ("StepGraph.step", graph_step),
                ("CUDAGraph.replay", replay),
                ("torch.empty_like(out)", lambda: torch.empty_like(g.out)),
                ("out.new_empty(shape)", lambda: g.out.new_empty(shape)),
                ("torch.empty(shape, dtype, device)", lambda: torch.empty(shape, dtype=dt, device=dev)),
                ("is_current_stream_capturing", torch.cuda.is_current_stream_capturing)]
        res = []
        for name, fn in rows:
            res.append((name, loop_us(fn, S)))
        pr = cProfile.Profile()
        pr.enable()
        loop_us(lambda: kern.decode(qd, kd, vd), S)
        pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
    print(s.getvalue())
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; {args.pattern} + H2O 512, "
          f"B={B}, H={H}, D={D}, N={N}; us per call, {S} calls back to back")
    print("| layer | us per call |\n|---|---:|")
    for name, us in res:
        print(f"| {name} | {us:.2f} |")


if __name__ == "__main__":
    main()
