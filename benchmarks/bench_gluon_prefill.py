"""The warp-specialized Gluon prefill (Hopper, 128-row tiles) against the Triton kernel and SDPA
(issue 11, item 3).

For the six Table-1 patterns and fully causal attention at 2K, 8K and 16K (64 heads, head dim
128, bf16, batch 1): SDPA's causal kernel, the Triton kernel at the plan's automatic tiles, and
both kernels at 128 x 128 and 128 x 64 tiles, measured in turn for `--rounds` rounds (medians).
Each Gluon output is compared with the Triton kernel's at the same tiles first.

    python benchmarks/bench_gluon_prefill.py --out benchmarks/results/DATE-h100-gluon-prefill
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_kernels import CAUSAL, PATTERNS, load_pattern, paired_ms, rel_err  # noqa: E402
from sas.codegen.triton_backend import PrefillOptions  # noqa: E402
from sas.runtime import SASAttnKernel  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="2048,8192,16384")
    ap.add_argument("--patterns", default=",".join(PATTERNS + [CAUSAL]))
    ap.add_argument("--rep", type=int, default=100, help="ms per timing")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None, help="path prefix for .json and .md")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_gluon_prefill: needs a CUDA GPU (the Gluon kernel runs on compute capability 9.x)")
    dev = torch.device("cuda")
    H, D = 64, 128
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    rows = []
    for N in map(int, args.lengths.split(",")):
        g = torch.Generator(device=dev).manual_seed(N)
        q, k, v = (torch.randn(1, H, N, D, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
        for name in args.patterns.split(","):
            pattern = load_pattern(name)
            fns, labels = [lambda: sdpa(q, k, v, is_causal=True)], ["sdpa causal"]
            auto = SASAttnKernel(pattern, max_len=N)
            ao = auto.runtime.prefill_tiles(q, k, v)[0]
            fns.append(lambda auto=auto: auto(q, k, v))
            labels.append(f"sas auto {ao.block_m}x{ao.block_n}")
            errs = {}
            for bn in (128, 64):
                kern = SASAttnKernel(pattern, max_len=N, analysis=auto.runtime.plan.analysis,
                                     prefill_options=PrefillOptions(128, bn, 8, 3))
                o, *tiles = kern.runtime.tile_tensors(N, N, dev)
                mod = kern.runtime.prefill_module(o)
                kw = dict(block_m=128, block_n=bn, num_warps=8, num_stages=3)
                tri = mod.prefill(q, k, v, *tiles, use_gluon=False, **kw)
                glu = mod.prefill(q, k, v, *tiles, use_gluon=True, **kw)
                errs[bn] = rel_err(glu, tri)
                fns += [lambda mod=mod, tiles=tiles, kw=kw: mod.prefill(q, k, v, *tiles, use_gluon=False, **kw),
                        lambda mod=mod, tiles=tiles, kw=kw: mod.prefill(q, k, v, *tiles, use_gluon=True, **kw)]
                labels += [f"triton 128x{bn}", f"gluon 128x{bn}"]
            ms = paired_ms(fns, False, args.rep, args.rounds)
            row = {"pattern": name, "N": N, "auto_tiles": [ao.block_m, ao.block_n],
                   "ms": dict(zip(labels, ms)), "gluon_vs_triton_rel_err": errs}
            rows.append(row)
            print(f"N={N:6d} {name:20s} " + " ".join(f"{lab} {t:.4f}" for lab, t in zip(labels, ms))
                  + f" | err {errs[128]:.1e}/{errs[64]:.1e}", flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
            "heads": H, "head_dim": D, "dtype": "bfloat16", "rep_ms": args.rep, "rounds": args.rounds}
    md = _markdown(meta, rows)
    print(md)
    if args.out:
        Path(args.out + ".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
        Path(args.out + ".md").write_text(md)


def _markdown(meta, rows) -> str:
    out = [f"Gluon prefill: {meta['device']}, torch {meta['torch']}, triton {meta['triton']}, {meta['date']}; "
           f"bf16, {meta['heads']} heads, head dim {meta['head_dim']}, batch 1; medians of {meta['rounds']} rounds, ms",
           "", "| pattern | N | SDPA causal | sas auto (tiles) | triton 128x128 | gluon 128x128 | triton 128x64 | "
           "gluon 128x64 | best gluon / SDPA | best gluon / auto |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        m = r["ms"]
        auto = next(v for k, v in m.items() if k.startswith("sas auto"))
        best = min(m["gluon 128x128"], m["gluon 128x64"])
        out.append(f"| {r['pattern']} | {r['N']} | {m['sdpa causal']:.4f} | {auto:.4f} ({r['auto_tiles'][0]}x{r['auto_tiles'][1]}) | "
                   f"{m['triton 128x128']:.4f} | {m['gluon 128x128']:.4f} | {m['triton 128x64']:.4f} | "
                   f"{m['gluon 128x64']:.4f} | {best / m['sdpa causal']:.3f} | {best / auto:.3f} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
