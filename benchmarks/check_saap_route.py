"""Saap fused route vs the torch route at the timing benchmark's full shapes (32 query / 8 KV
heads, D = 128, C = 1024 buckets, classifier hidden 256, bf16 q/k; l = 19, 35, 43: the probes
of bench_saap.py at 64K/128K/256K; 6 random steps each). Runs the real kernel on the GPU, or
under TRITON_INTERPRET=1 on the CPU (about 17 minutes on 2 cores). Prints how many (step, KV
head) rows probe the same ids in the same order, the same set, and assign the same bucket.

    TRITON_INTERPRET=1 python benchmarks/check_saap_route.py
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from sas.methods.saap import assign, group_scores, probe  # noqa: E402
from sas.methods.saap_runtime import SaapDecoder  # noqa: E402
from bench_saap import random_layer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--probes", default="19,35,43")
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    hq, hkv, d, c, hidden, n = 32, 8, 128, 1024, 256, 4096
    layer = random_layer(hkv, c, d, hidden=256, seed=1, device=dev)
    same = sets = bk = tot = 0
    t0 = time.time()
    for trial in range(args.trials):
        g = torch.Generator().manual_seed(100 + trial)
        q = torch.randn(1, hq, 1, d, generator=g).bfloat16().to(dev)
        k = torch.randn(1, hkv, 1, d, generator=g).bfloat16().to(dev)
        for P in (int(x) for x in args.probes.split(",")):
            dec = SaapDecoder(layer, P, sink=1, window=64, max_len=n, route="fused")
            cache = torch.zeros(1, hkv, n, d, dtype=torch.bfloat16, device=dev)
            dec.fill(cache, torch.zeros_like(cache), torch.zeros(1, hkv, n, dtype=torch.int32, device=dev), n - 1)
            pf, _ = dec.route_step(q, k, k, k, n - 1)
            sc = group_scores(q, layer.classifier, hkv)
            want = probe(sc, P)
            same += int((pf.long() == want).all(-1).sum())
            tot += hkv
            sets += int((pf.long().sort(-1).values == want.sort(-1).values).all(-1).sum())
            bk += int((dec.bucket_of[..., n - 1] == assign(k, layer.centroids[None])[..., 0]).sum())
    print(f"rows {tot}: same order {same}, same set {sets}, same new-key bucket {bk}; {time.time()-t0:.0f}s")


if __name__ == "__main__":
    main()
