"""Eager dynamic decode in a loop: the step graph's rebound pointer arguments against copies (issue 11, item 5).

For a static + H2O(512) pattern at 16K: decode steps back to back at advancing positions, as a
model's loop calls `kernel.decode`, alternating rounds of the rebinding path (the graph's kernels
pointed at the caller's q, k, v and a fresh output, `sas.runtime.graph_params`) and the copy path
(inputs copied in, output copied out), in one process; then the host time of one `bind()` with
the GPU idle and right after a replay queued behind a long kernel (it must not wait for it).
Prints microseconds per step; never asserted anywhere.

    python benchmarks/bench_dynamic_rebind.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_dynamic import dynamic_of, eager_loop_ms  # noqa: E402
from bench_kernels import load_pattern  # noqa: E402

from sas.runtime import SASAttnKernel  # noqa: E402

CONFIGS = [("strided_block_local", (1, 64, 64)), ("block_local", (1, 64, 64)), ("strided_block_local", (16, 32, 8))]


def main() -> None:
    dev = torch.device("cuda")
    N, D, dt, LOOP, ROUNDS = 16384, 128, torch.bfloat16, 1500, 3
    print(f"# {torch.cuda.get_device_name(dev)}, torch {torch.__version__}; us per step, {ROUNDS} rounds each")
    for name, (B, H, Hkv) in CONFIGS:
        P = N - 20 - 2 * ROUNDS * LOOP
        k = torch.randn(B, Hkv, P, D, device=dev, dtype=dt)
        v = torch.randn_like(k)
        q = torch.randn(B, H, P, D, device=dev, dtype=dt)
        qd = torch.randn(B, H, 1, D, device=dev, dtype=dt)
        kd, vd = torch.randn(B, Hkv, 1, D, device=dev, dtype=dt), torch.randn(B, Hkv, 1, D, device=dev, dtype=dt)
        kern = SASAttnKernel(dynamic_of(load_pattern(name), 512), max_len=N)
        kern.prefill(q, k, v)
        del q, k, v
        for _ in range(4):
            kern.decode(qd, kd, vd)
        torch.cuda.synchronize()
        sg = kern.dynamic.rt._graph
        slots = sg.found
        if slots is None:
            print(f"{name}: the graph's arguments cannot be rebound here (driver API or graph); nothing to compare")
            continue
        res: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(ROUNDS):
            for rebind in (True, False):
                sg.slots = slots if rebind else None
                kern.decode(qd, kd, vd)
                res[rebind].append(eager_loop_ms(kern, qd, kd, vd, LOOP - 1) * 1e3)
        sg.slots = slots
        t = time.perf_counter()
        for _ in range(1000):
            slots.bind({"q": qd, "k": kd, "v": vd, "out": sg.out})
        idle = (time.perf_counter() - t) / 1000 * 1e6
        torch.cuda._sleep(50_000_000)
        sg.graph.replay()
        t = time.perf_counter()
        slots.bind({"q": qd, "k": kd, "v": vd, "out": sg.out})
        busy = (time.perf_counter() - t) * 1e6
        torch.cuda.synchronize()
        sg.own = slots.bind({"q": sg.q, "k": sg.k, "v": sg.v, "out": sg.out})
        print(f"{name:20s} B={B} H={H}/{Hkv}: loop rebound {' '.join(f'{x:.1f}' for x in res[True])} | copies "
              f"{' '.join(f'{x:.1f}' for x in res[False])}; bind() {idle:.1f} us idle, {busy:.1f} us behind a "
              f"long kernel", flush=True)


if __name__ == "__main__":
    main()
