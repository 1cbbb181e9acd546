"""Where the time of the one-launch CUDA prop kernel goes (`SantaOptions(backend="cuda")`,
sas.methods.santa_cuda): each block stamps %globaltimer at its phase boundaries into
`PropArgs.timing`, and this prints the medians over the blocks of a step (median of 5 steps, each
after a 256 MB write that evicts the L2 as triton's do_bench does), beside the CUDA-graph time of
the step, the Triton prop step and dense SDPA decode in the same process.

Phases (us): start spread (last block start - first), score (the K stream and the scores of a
block), score end max (from the first start), stats (tile max / stash / sums), budget wait (to
the KV head's budgets: the slowest block's scores plus the budget block's work), counts, gather
(list of drawn keys, V rows, the block's partial), final (the last block's sum of the partials),
total (first start to the end).

    python benchmarks/profile_santa_cuda.py [--contexts 32768,131072] [--variants 4:1,4:2] [--no-flush]

--no-flush runs one unstamped step before each stamped one instead of the L2-evicting write: the
L2 then holds what a back-to-back replay loop leaves (the conditions of the graph time).

Variants are STAGES:BLOCKS_PER_SM pairs (K ring stages of 16 KB, blocks per multiprocessor).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sas.methods import santa_cuda  # noqa: E402
from sas.methods.santa import SantaRandom  # noqa: E402
from sas.methods.santa_runtime import SantaOptions, santa_decode  # noqa: E402

PHASES = ("start spread", "score", "score end max", "stats", "budget wait", "budget end max", "counts", "gather",
          "final", "total")


def graph_us(fn) -> float:
    import triton.testing as tt
    return float(tt.do_bench_cudagraph(fn, rep=100, return_mode="median")) * 1e3


def phases(stamps: torch.Tensor) -> list[float]:
    """The PHASES of one step from the blocks' stamps [blocks, 8] (ns)."""
    t = stamps[stamps[:, 0] > 0].double()
    t0 = t[:, 0].min()
    last = t[t[:, 6] > 0]
    return [float(t[:, 0].max() - t0), float((t[:, 1] - t[:, 0]).median()), float((t[:, 1] - t0).max()),
            float((t[:, 2] - t[:, 1]).median()), float((t[:, 3] - t[:, 2]).median()), float((t[:, 3] - t0).max()),
            float((t[:, 4] - t[:, 3]).median()), float((t[:, 5] - t[:, 4]).median()),
            float((last[:, 7] - last[:, 6]).median()), float(last[:, 7].max() - t0)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="32768,131072")
    ap.add_argument("--variants", default="4:1,4:2", help="STAGES:BLOCKS_PER_SM pairs")
    ap.add_argument("--no-flush", action="store_true",
                    help="an unstamped step before each stamped one instead of the L2-evicting write")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("profile_santa_cuda.py needs an NVIDIA GPU")
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    b, hq, hkv, d = 1, 32, 8, 128
    for n in (int(x) for x in args.contexts.split(",")):
        gen = torch.Generator().manual_seed(n)
        k, v = (torch.randn(b, hkv, n, d, generator=gen).to(dev, torch.bfloat16) for _ in range(2))
        q = torch.randn(b, hq, d, generator=gen).to(dev, torch.bfloat16)
        rnd = SantaRandom(None)
        sdpa = graph_us(lambda: torch.nn.functional.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True))
        tri = graph_us(lambda: santa_decode(q, k, v, n, SantaOptions(n=128), rnd))
        print(f"n={n} batch 1: SDPA {sdpa:.1f} us, Triton prop {tri:.1f} us ({sdpa / tri:.2f}x SDPA)")
        for variant in args.variants.split(","):
            stages, bps = (int(x) for x in variant.split(":"))
            santa_cuda.STAGES, santa_cuda.BLOCKS_PER_SM = stages, bps
            santa_cuda._PLANS.clear()
            opts = SantaOptions(n=128, backend="cuda")
            try:
                cu = graph_us(lambda: santa_decode(q, k, v, n, opts, rnd))
            except Exception as e:  # noqa: BLE001 - report, do not fake a number
                print(f"  stages {stages}, {bps} blocks/SM: {type(e).__name__}: {str(e)[:160]}")
                continue
            plan = next(p for p in santa_cuda._PLANS.values() if isinstance(p, santa_cuda.PropCudaPlan))
            sms = torch.cuda.get_device_properties(dev).multi_processor_count
            stamps = torch.zeros(b * hkv * sms * bps, 8, dtype=torch.int64, device=dev)
            runs = []
            for _ in range(5):
                if args.no_flush:
                    santa_decode(q, k, v, n, opts, rnd)
                else:
                    flush.zero_()
                plan.args.timing = stamps.data_ptr()
                stamps.zero_()
                santa_decode(q, k, v, n, opts, rnd)
                torch.cuda.synchronize()
                plan.args.timing = None
                runs.append(phases(stamps))
            med = [statistics.median(r[i] for r in runs) / 1e3 for i in range(len(PHASES))]
            print(f"  stages {stages}, {bps} blocks/SM: graph {cu:.1f} us ({sdpa / cu:.2f}x SDPA) | "
                  + ", ".join(f"{name} {x:.1f}" for name, x in zip(PHASES, med)))


if __name__ == "__main__":
    main()
