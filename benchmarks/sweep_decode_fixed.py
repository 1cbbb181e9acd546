"""Decode launch options for the OpenAI-fixed cache (issue 11, item 4: within 1.3x of the HBM
floor): block sizes, splits and warps, with every launch a programmatic dependent launch, MHA
batch 1, 64 heads, head dim 128, bf16, CUDA-graph replay, against the HBM floor measured in the
same run. One row per variant (medians of --rounds rounds).

    python benchmarks/sweep_decode_fixed.py --lengths 8192,16384
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench_kernels import copy_bandwidth, load_pattern, paired_ms  # noqa: E402
from sas.codegen.triton_backend import DecodeOptions  # noqa: E402
from sas.runtime import SASAttnKernel  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="8192,16384")
    ap.add_argument("--patterns", default="openai_fixed,streaming_llm")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep", type=int, default=50)
    ap.add_argument("--block-n", default="32,64", help="slot blocks to try")
    ap.add_argument("--bps", default="2,4,6,8,12", help="blocks per split to try")
    ap.add_argument("--waves", default="1,2,3", help="waves to try")
    args = ap.parse_args()
    dev = torch.device("cuda")
    H, D, dt = 64, 128, torch.bfloat16
    bw = copy_bandwidth(dev)
    ap_bps = [int(x) for x in args.bps.split(",")]
    ap_waves = [int(x) for x in args.waves.split(",")]
    ap_bn = [int(x) for x in args.block_n.split(",")]
    variants = [
        (f"bn{bn} bps{bps} w{waves}", DecodeOptions(block_n=bn, blocks_per_split=bps, waves=waves, pdl=True))
        for bn in ap_bn for bps in ap_bps for waves in ap_waves]
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    for N in map(int, args.lengths.split(",")):
        for name in args.patterns.split(","):
            pattern = load_pattern(name)
            base = SASAttnKernel(pattern, max_len=N)      # one analysis, shared by every variant
            analysis, auto = base.runtime.plan.analysis, base.runtime.plan.decode_config(1)
            C = base.cache_size
            floor_ms = 2 * H * C * D * 2 / bw * 1e3       # bench_kernels' HBM floor
            # the automatic choice first, as a programmatic dependent launch
            runs = [(f"auto ({auto.block_n}/{auto.blocks_per_split}/{auto.waves})",
                     dataclasses.replace(auto, pdl=True))] + variants
            fns, labels = [], []
            for label, opts in runs:
                kern = SASAttnKernel(pattern, max_len=N, analysis=analysis, decode_options=opts)
                kc, vc = kern.new_cache(1, H, D, dt, dev)
                kc.normal_()
                vc.normal_()
                q, k, v = (torch.randn(1, H, 1, D, device=dev, dtype=dt) for _ in range(3))
                out = torch.empty_like(q)
                fn = (lambda kern=kern, kc=kc, vc=vc, q=q, k=k, v=v, out=out:
                      kern.runtime.decode(q, k, v, kc, vc, N - 1, out=out))
                fn()
                fns.append(fn)
                labels.append(label)
            ms = paired_ms(fns, True, args.rep, args.rounds)
            best = min(range(len(ms)), key=lambda i: ms[i])
            print(f"\n{name} N={N} C={C} floor {floor_ms * 1e3:.2f} us")
            for lab, t in sorted(zip(labels, ms), key=lambda x: x[1])[:8] + [(labels[0], ms[0])]:
                print(f"  {lab:28s} {t * 1e3:7.2f} us  {t / floor_ms:.3f}x floor")
            print(f"  best: {labels[best]}")


if __name__ == "__main__":
    main()
