"""How fast can a decode kernel stream all of K? (issue 12: SANTA's score pass reads K in full)

A bare score pass at Llama-3.1-8B decode shapes (B x 8 KV heads x N keys x 128 dims, bf16, 4 query
heads per KV head): each program reads a run of K tiles of its KV head, computes the scores of
the group's queries (tl.dot) and keeps a running max, timed by CUDA-graph replay against the HBM
floor (K bytes over the measured copy bandwidth). Loads through pointers or TMA tensor
descriptors, with tile size, pipeline depth, warps and programs per SM varied.

    python benchmarks/sweep_key_stream.py --n 32768 --batch 1
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels import copy_bandwidth, median_ms  # noqa: E402

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:
    TensorDescriptor = None


@triton.jit
def _stream(Q, K, desc_k, OUT, N, TPP, T, G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
            STAGES: tl.constexpr, USE_TMA: tl.constexpr):
    bh = tl.program_id(0)
    p = tl.program_id(1)
    rows = tl.arange(0, 16)
    dims = tl.arange(0, D)
    q = tl.load(Q + (bh * G + rows[:, None]) * D + dims[None, :], mask=rows[:, None] < G, other=0.0)
    m = tl.full([16], float("-inf"), tl.float32)
    base = bh.to(tl.int64) * N
    for t in tl.range(p * TPP, tl.minimum(p * TPP + TPP, T), num_stages=STAGES):
        if USE_TMA:
            k = desc_k.load([(bh * N + t * BLOCK_N).to(tl.int32), 0])
        else:
            keys = t * BLOCK_N + tl.arange(0, BLOCK_N)
            k = tl.load(K + (base + keys[:, None]) * D + dims[None, :])
        s = tl.dot(q, tl.trans(k))
        m = tl.maximum(m, tl.max(s, axis=1))
    tl.store(OUT + (bh * tl.num_programs(1) + p) * 16 + rows, m)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=32768)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--rep", type=int, default=100)
    args = ap.parse_args()
    dev = torch.device("cuda")
    B, H, N, D, G = args.batch, args.kv_heads, args.n, 128, 4
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    bw = copy_bandwidth(dev)
    k = torch.randn(B * H, N, D, device=dev, dtype=torch.bfloat16)
    q = torch.randn(B * H * G, D, device=dev, dtype=torch.bfloat16)
    floor = k.numel() * 2 / bw * 1e6           # K bytes at the copy rate (read + write bytes per second)
    print(f"# {torch.cuda.get_device_name(dev)}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          f"K {k.numel() * 2 / 2**20:.0f} MiB, floor {floor:.1f} us at {bw / 1e12:.2f} TB/s")
    rows = []
    for tma, bn, stages, warps, per_sm in itertools.product((False, True), (64, 128, 256), (2, 3, 4),
                                                            (4, 8), (1, 2)):
        if tma and TensorDescriptor is None:
            continue
        T = N // bn
        progs = max(1, per_sm * sms // (B * H))
        tpp = -(-T // progs)
        progs = -(-T // tpp)
        out = torch.empty(B * H * progs * 16, device=dev, dtype=torch.float32)
        desc = TensorDescriptor.from_tensor(k.view(-1, D), [bn, D]) if tma else k

        def step():
            _stream[(B * H, progs)](q, k, desc, out, N, tpp, T, G=G, D=D, BLOCK_N=bn, STAGES=stages,
                                    USE_TMA=tma, num_warps=warps)
        try:
            step()
            us = median_ms(step, True, args.rep) * 1e3
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            print(f"tma={tma} bn={bn} st={stages} w={warps} per_sm={per_sm}: failed {type(e).__name__}")
            continue
        rows.append((us, f"tma={int(tma)} bn={bn} stages={stages} warps={warps} per_sm={per_sm}"))
    rows.sort()
    print("| variant | us | x floor |\n|---|---|---|")
    for us, name in rows[:12]:
        print(f"| {name} | {us:.1f} | {us / floor:.2f} |")
    best_ptr = min(r for r in rows if r[1].startswith("tma=0"))
    print(f"| best pointer: {best_ptr[1]} | {best_ptr[0]:.1f} | {best_ptr[0] / floor:.2f} |")


if __name__ == "__main__":
    main()
