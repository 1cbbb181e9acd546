"""Static decode over batch sizes and GQA ratios (issue 11, item 7): one token at position N - 1
for batch 1..64 and 32 query heads over 32/16/8/4 KV heads (GQA 1, 2, 4, 8), head dim 128, bf16,
N = 16K by default, against dense SDPA decode (`enable_gqa`) and the HBM floor of the compact
cache, measured in the same run; every sas output is first compared with SDPA under the pattern's
exact mask row. FlexAttention is left out here (a block mask and a compile per shape would take
most of a device call); bench_kernels.py times it at batch 1 (MHA) and 16 (GQA 4).

    python benchmarks/bench_decode_sweep.py --out results/decode-sweep     # .json and .md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_kernels import copy_bandwidth, load_pattern, median_ms, rel_err, write_results  # noqa: E402

from sas.runtime import SASAttnKernel  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--groups", default="1,2,4,8", help="query heads per KV head (32 query heads)")
    ap.add_argument("--patterns", default="streaming_llm,sliding_window,openai_fixed,strided_block_local")
    ap.add_argument("--rep", type=int, default=50)
    ap.add_argument("--no-check", action="store_true", help="skip the comparison with masked SDPA")
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    small = dev.type != "cuda"
    N = 256 if small else args.n
    D, Hq, dtype = (64 if small else 128), (8 if small else 32), (torch.float32 if small else torch.bfloat16)
    batches = [1, 2] if small else [int(x) for x in args.batches.split(",")]
    groups = [1, 2] if small else [int(x) for x in args.groups.split(",")]
    names = args.patterns.split(",")
    bw = copy_bandwidth(dev)
    meta = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (interpreter)",
            "torch": torch.__version__, "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "N": N, "head_dim": D, "q_heads": Hq, "dtype": str(dtype), "copy_bandwidth_TBps": bw / 1e12}
    print("# " + json.dumps(meta), flush=True)
    kernels = {name: SASAttnKernel(load_pattern(name), max_len=N) for name in names}
    j = np.arange(N, dtype=np.int64)       # the exact mask row of query N - 1
    masks = {name: torch.from_numpy(np.asarray(k.pattern.evaluate(np.full(N, N - 1, dtype=np.int64), j), dtype=bool))
             .to(dev) for name, k in kernels.items()}
    rows = []
    for g in groups:
        Hkv = Hq // g
        for B in batches:
            q = torch.randn(B, Hq, 1, D, device=dev, dtype=dtype)
            k = torch.randn(B, Hkv, N, D, device=dev, dtype=dtype)
            v = torch.randn(B, Hkv, N, D, device=dev, dtype=dtype)
            kd, vd = k[:, :, N - 1:N].contiguous(), v[:, :, N - 1:N].contiguous()
            sdpa = torch.nn.functional.scaled_dot_product_attention
            sdpa_ms = median_ms(lambda: sdpa(q, k, v, enable_gqa=g > 1), True, args.rep)
            for name, kern in kernels.items():
                kc, vc = kern.new_cache(B, Hkv, D, dtype, dev)
                kern.fill_cache(k[:, :, :N - 1], v[:, :, :N - 1], kc, vc)
                out = torch.empty_like(q)
                kern.runtime.decode(q, kd, vd, kc, vc, N - 1, out=out)
                err = float("nan")
                if not args.no_check and bool(masks[name].any()):   # a row without keys has no reference
                    ref = sdpa(q, k, v, attn_mask=masks[name][None, None, None, :], enable_gqa=g > 1)
                    err = rel_err(out, ref)
                ms = median_ms(lambda: kern.runtime.decode(q, kd, vd, kc, vc, N - 1, out=out), True, args.rep)
                floor = 2 * kern.cache_size * B * Hkv * D * k.element_size() / bw * 1e3
                row = {"pattern": name, "batch": B, "group": g, "kv_heads": Hkv, "cache_size": kern.cache_size,
                       "sas_ms": ms, "sdpa_ms": sdpa_ms, "speedup": sdpa_ms / ms, "floor_ms": floor,
                       "over_floor": ms / floor, "rel_err_vs_masked_sdpa": err}
                rows.append(row)
                print(json.dumps(row), flush=True)
                if dev.type == "cuda":
                    torch.cuda.synchronize()      # the timed graph may still use kc / vc
                del kc, vc
            del q, k, v
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    lines = [f"{meta['device']}, torch {meta['torch']}, {meta['date']}; N = {N}, {Hq} query heads, head dim {D}, "
             f"{dtype}; CUDA-graph medians in ms; floor = compact K+V bytes / {bw / 1e12:.2f} TB/s", "",
             "| pattern | GQA | batch | slots | sas | SDPA | x SDPA | floor | sas / floor | rel err |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['pattern']} | {r['group']} | {r['batch']} | {r['cache_size']} | {r['sas_ms']:.4f} | "
                     f"{r['sdpa_ms']:.4f} | {r['speedup']:.2f} | {r['floor_ms']:.4f} | {r['over_floor']:.2f} | "
                     f"{r['rel_err_vs_masked_sdpa']:.1e} |")
    md = "\n".join(lines) + "\n"
    print(md)
    write_results(args.out, {"meta": meta, "rows": rows}, md)


if __name__ == "__main__":
    main()
