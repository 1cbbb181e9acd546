"""How should a small compact cache be decoded? (issue 11, item 4; issue 14's one-launch decode)

For the Table-1 patterns with small caches, one MHA decode step (batch 1, 64 heads, head dim
128, position N - 1) is timed by CUDA-graph replay with the split count, the combine (second
kernel or the fused atomic ticket), warps, stages and slot-block size varied, against the HBM
floor of the compact cache (copy bandwidth measured in the same run). Each variant's output is
checked against the default decode first.

    python benchmarks/sweep_decode_small.py --length 16384
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels import checked_ms, copy_bandwidth, load_pattern, median_ms  # noqa: E402

from sas.runtime import SASAttnKernel  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--length", type=int, default=16384)
    ap.add_argument("--patterns", default="strided_block_local,block_local,sliding_window,streaming_llm,openai_fixed")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--splits", default="auto,1,2,3,4,6")
    ap.add_argument("--no-fused", action="store_true")
    ap.add_argument("--pdl", action="store_true", help="every variant (the default too) as programmatic "
                                                       "dependent launches")
    ap.add_argument("--bps", default="", help="time the default decode with the split rule's blocks_per_split "
                                              "set to each of these, e.g. 4,8,16")
    ap.add_argument("--skip", default=None, choices=("none", "mask", "flags"),
                    help="DecodeOptions.skip_mode of every --configs variant (default: the pattern's)")
    ap.add_argument("--mha-dot", action="store_true",
                    help="the --configs variants of a one-query-head group use tl.dot (DecodeOptions.mha_dot)")
    ap.add_argument("--configs", default="64,4,2;64,8,2;64,4,3;128,8,2;32,4,2",
                    help="block_n,num_warps,num_stages[,waves];...")
    args = ap.parse_args()
    dev = torch.device("cuda")
    N, B, H, D = args.length, args.batch, args.heads, args.head_dim
    Hkv = args.kv_heads or H
    dtype = torch.bfloat16
    props = torch.cuda.get_device_properties(dev)
    bw = copy_bandwidth(dev)
    print(f"# {props.name}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; B={B} Hq={H} Hkv={Hkv} D={D} "
          f"N={N}; copy bandwidth {bw / 1e12:.2f} TB/s")
    g = torch.Generator(device=dev).manual_seed(0)
    qd = torch.randn(B, H, 1, D, device=dev, dtype=dtype, generator=g)
    kd = torch.randn(B, Hkv, 1, D, device=dev, dtype=dtype, generator=g)
    vd = torch.randn(B, Hkv, 1, D, device=dev, dtype=dtype, generator=g)
    table = []
    for name in args.patterns.split(","):
        base = SASAttnKernel(load_pattern(name), max_len=N)
        C = base.cache_size
        floor = 2 * C * B * Hkv * D * 2 / bw * 1e3
        kc, vc = base.new_cache(B, Hkv, D, dtype, dev)
        kc.normal_(generator=g)
        vc.normal_(generator=g)
        ref = base.runtime.decode(qd, kd, vd, kc.clone(), vc.clone(), N - 1).float()
        # every variant plain, or (--pdl) every one as programmatic dependent launches
        default_cfg = dataclasses.replace(base.plan.decode_config(H // Hkv), pdl=bool(args.pdl))
        base = SASAttnKernel(load_pattern(name), max_len=N, decode_options=default_cfg)
        dout = torch.empty_like(qd)
        dflt_ms = median_ms(lambda: base.runtime.decode(qd, kd, vd, kc, vc, N - 1, out=dout), True, args.rep)
        torch.cuda.synchronize()
        table.append((name, C, "default", dflt_ms * 1e3, dflt_ms / floor))
        print(f"{name}: {C} slots, floor {floor * 1e3:.2f} us, default {default_cfg}: {dflt_ms * 1e3:.2f} us",
              flush=True)
        dmod = base.runtime.decode_module(default_cfg)
        for bps in filter(None, args.bps.split(",")):
            sp = dmod.num_splits_for(B, Hkv, num_sms=props.multi_processor_count, block_n=default_cfg.block_n,
                                     waves=default_cfg.waves, blocks_per_split=int(bps))

            def step_bps():
                dmod.decode(qd, kd, vd, kc, vc, N - 1, out=dout, num_splits=sp, block_n=default_cfg.block_n,
                            num_warps=default_cfg.num_warps, num_stages=default_cfg.num_stages,
                            use_dot=(H > Hkv) or default_cfg.mha_dot, fused_combine=default_cfg.fused_combine,
                            pdl=args.pdl)
            ms = median_ms(step_bps, True, args.rep)
            torch.cuda.synchronize()
            table.append((name, C, f"default, blocks_per_split={bps} ({sp} splits)", ms * 1e3, ms / floor))
        for cfg in filter(None, args.configs.split(";")):
            bn, w, st, *wv = map(int, cfg.split(","))
            opts = dataclasses.replace(default_cfg, block_n=bn, num_warps=w, num_stages=st,
                                       waves=wv[0] if wv else default_cfg.waves, skip_mode=args.skip,
                                       mha_dot=args.mha_dot or default_cfg.mha_dot)
            kern = SASAttnKernel(load_pattern(name), max_len=N, decode_options=opts)
            mod = kern.runtime.decode_module(opts)
            for sp in args.splits.split(","):
                for fused in ((False,) if args.no_fused else (False, True)):
                    if sp != "auto" and int(sp) == 1 and fused:
                        continue
                    n_sp = None if sp == "auto" else int(sp)
                    out = torch.empty_like(qd)

                    def step():
                        mod.decode(qd, kd, vd, kc, vc, N - 1, out=out, num_splits=n_sp, block_n=bn, num_warps=w,
                                   num_stages=st, use_dot=(H > Hkv) or opts.mha_dot, fused_combine=fused, pdl=args.pdl)
                    label = (f"bn={bn} w={w} st={st}{f' waves={wv[0]}' if wv else ''} splits={sp}"
                             f"{' dot' if opts.mha_dot and H == Hkv else ''}"
                             f"{' fused' if fused else ''}{f' skip={args.skip}' if args.skip else ''}")
                    got = checked_ms(label, lambda: (step, out), ref, lambda f: median_ms(f, True, args.rep))
                    if got is None:
                        continue
                    ms = got[0]
                    table.append((name, C, label, ms * 1e3, ms / floor))
        best = sorted((r for r in table if r[0] == name), key=lambda r: r[3])[:4]
        for r in best:
            print(f"  {r[2]:38s} {r[3]:7.2f} us  {r[4]:5.2f}x floor", flush=True)
        print("  all: " + "; ".join(f"{r[2].replace('bn=', '').replace(' splits=', '/')} {r[3]:.1f}"
                                    for r in table if r[0] == name), flush=True)
        kc = vc = None  # free this pattern's cache before the next one
    print("\n| pattern | slots | best variant | us | x floor | default us |\n|---|---|---|---|---|---|")
    for name in args.patterns.split(","):
        rows = [r for r in table if r[0] == name]
        if not rows:
            continue
        best = min(rows, key=lambda r: r[3])
        dflt = [r for r in rows if r[2] == "default"]
        print(f"| {name} | {best[1]} | {best[2]} | {best[3]:.2f} | {best[4]:.2f} | "
              f"{', '.join(f'{r[3]:.2f}' for r in dflt[:1])} |")


if __name__ == "__main__":
    main()
