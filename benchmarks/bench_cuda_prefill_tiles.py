"""CUDA prefill in every tile shape against Triton's prefill, paired (bf16, 64 heads, D 128, batch 1).

For the six Table-1 patterns and the fully causal one at one length: Triton's prefill and the
CUDA prefill with 64 / 128 rows x 64 / 32 keys and 128 x 128, timed in turn for 3 rounds (median round each,
`triton.testing.do_bench` medians); each CUDA output is checked against Triton's (largest
relative error printed). "auto" is `CudaRuntime.tile_shape`'s choice; the fully causal row is
also timed against SDPA's dense causal kernel in the same rounds. Times in ms.

    python benchmarks/bench_cuda_prefill_tiles.py --length 16384
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_kernels import CAUSAL, PATTERNS, load_pattern, paired_ms, rel_err  # noqa: E402

from sas.codegen.cuda_backend import device_arch, uses_wgmma  # noqa: E402
from sas.runtime import SASAttnKernel  # noqa: E402

SHAPES = ((64, 64), (64, 32), (128, 64), (128, 32), (128, 128))   # 128 x 128: Hopper (sm_90a) only


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--length", type=int, default=16384)
    ap.add_argument("--rep", type=int, default=50, help="timing window per measurement, ms")
    args = ap.parse_args()
    dev, dt, D, N, H = torch.device("cuda"), torch.bfloat16, 128, args.length, 64
    q, k, v = (torch.randn(1, H, N, D, device=dev, dtype=dt) for _ in range(3))
    global SHAPES
    if not uses_wgmma(device_arch(*torch.cuda.get_device_capability())):
        SHAPES = SHAPES[:-1]
    kernels = {}
    for name in PATTERNS + [CAUSAL]:
        tk = SASAttnKernel(load_pattern(name), max_len=N)
        kernels[name] = (tk, SASAttnKernel(plan=tk.plan, backend="cuda"))
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda c: c.runtime.ensure_built(dt, D), [c for _, c in kernels.values()]))
    print(f"N={N}  pattern  triton  auto(tile)  " + " ".join(f"{m}x{n}" for m, n in SHAPES)
          + "  (ms; auto / Triton, best / Triton)")
    for name, (tk, ck) in kernels.items():
        rt = ck.runtime
        auto = (rt.tile_height(N, N), rt.tile_width(N, N))

        def shaped(bm, bn):
            def run():
                rt.block_m, rt.block_n = bm, bn
                return ck(q, k, v)
            return run

        fns = [lambda: tk(q, k, v)] + [shaped(bm, bn) for bm, bn in SHAPES]
        if name == CAUSAL:   # SDPA's dense causal kernel in the same rounds
            fns.append(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
        ms = paired_ms(fns, False, args.rep, 3)
        if name == CAUSAL:
            sdpa_ms, ms, fns = ms[-1], ms[:-1], fns[:-1]
        ref = tk(q, k, v)
        err = max(rel_err(fn(), ref) for fn in fns[1:])
        rt.block_m, rt.block_n = None, None
        a = ms[1 + SHAPES.index(auto)]
        print(f"{name:20s} {ms[0]:7.3f}  {a:7.3f} {auto[0]}x{auto[1]}  " + " ".join(f"{t:7.3f}" for t in ms[1:])
              + f"  auto/T={a / ms[0]:.3f} best/T={min(ms[1:]) / ms[0]:.3f} max rel err={err:.1e}", flush=True)
        if name == CAUSAL:
            print(f"{'':20s} SDPA causal {sdpa_ms:7.3f}: auto / SDPA {a / sdpa_ms:.3f}, best / SDPA "
                  f"{min(ms[1:]) / sdpa_ms:.3f}", flush=True)


if __name__ == "__main__":
    main()
