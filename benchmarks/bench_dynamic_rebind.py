"""Eager dynamic decode in a loop: the step graph's rebound pointer arguments against copies (issue 11, item 5).

For a static + H2O(512) pattern at 16K: decode steps back to back at advancing positions, as a
model's loop calls `kernel.decode`, alternating rounds of the rebinding path (the graph's kernels
pointed at the caller's q, k, v and a fresh output, `sas.runtime.graph_params`; a bind to the
addresses the graph holds already makes no driver call), the same with every bind updating the
graph (as before 2026-11-27: "rebound, always set") and the copy path (inputs copied in, output
copied out), in one process; then the host time of one `bind()` with the GPU idle (to new
addresses, and to the ones held) and right after a replay queued behind a long kernel (it must
not wait for it).
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
        P = N - 20 - 3 * ROUNDS * LOOP                 # room for three paths' rounds
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
        bind = slots.bind

        def bind_always(tensors):
            slots._bound = None          # forget the held addresses: every bind updates the graph
            return bind(tensors)
        paths = ("rebound", "rebound, always set", "copies")
        res: dict[str, list[float]] = {p: [] for p in paths}
        for _ in range(ROUNDS):
            for path in paths:
                sg.slots = None if path == "copies" else slots
                slots.bind = bind_always if path == "rebound, always set" else bind
                kern.decode(qd, kd, vd)
                res[path].append(eager_loop_ms(kern, qd, kd, vd, LOOP - 1) * 1e3)
        sg.slots = slots
        slots.bind = bind
        outs = [torch.empty_like(sg.out), torch.empty_like(sg.out)]
        t = time.perf_counter()
        for i in range(1000):
            slots.bind({"q": qd, "k": kd, "v": vd, "out": outs[i % 2]})
        idle = (time.perf_counter() - t) / 1000 * 1e6
        t = time.perf_counter()
        for _ in range(1000):
            slots.bind({"q": qd, "k": kd, "v": vd, "out": outs[0]})
        held = (time.perf_counter() - t) / 1000 * 1e6
        torch.cuda._sleep(50_000_000)
        sg.graph.replay()
        t = time.perf_counter()
        slots.bind({"q": qd, "k": kd, "v": vd, "out": outs[1]})
        busy = (time.perf_counter() - t) * 1e6
        torch.cuda.synchronize()
        sg.own = slots.bind({"q": sg.q, "k": sg.k, "v": sg.v, "out": sg.out})
        print(f"{name:20s} B={B} H={H}/{Hkv}: loop " + " | ".join(
            f"{p} {' '.join(f'{x:.1f}' for x in res[p])}" for p in paths)
              + f"; bind() {idle:.1f} us idle to new addresses, {held:.1f} us to the held ones, {busy:.1f} us "
              f"behind a long kernel", flush=True)


if __name__ == "__main__":
    main()
