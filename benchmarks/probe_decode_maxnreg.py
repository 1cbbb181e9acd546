"""Does a register cap let more decode programs share an SM, and does that shorten a step?
(issue 11, item 4)

Nsight Compute found the MHA split kernel at 128-152 registers a thread (OpenAI-fixed: 152, so
3 programs of 4 warps an SM and 1.94 waves, DRAM 69.5% busy; block-local: 128, a 0.73-wave
grid bound by instruction latency). Triton compiles a kernel under a cap when it is launched
with `maxnreg=` (ptx `.maxnreg`); the cap trades spills for resident programs, and with more of
them a step may also take more splits.

This probe renders each static decode module once per cap (0: none, as the template has it),
compiles its split kernel under that cap (the combine and flags kernels are left alone), reports
the registers and spills the compiler gave it, checks that every variant writes the same output
and cache as the uncapped one (bit for bit), and times them by CUDA-graph replay in paired rounds
with the default split count and with `--split-factors` times it, plain launches and (with
--pdl) programmatic dependent launches; MHA batch 1, 64 heads and GQA 32 / 8 heads batch 16,
head dim 128, bf16, 16K, against the HBM floor of the compact cache.

    python benchmarks/probe_decode_maxnreg.py [--patterns a,b] [--caps 0,128,96,80] [--split-factors 1,2]
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from ab_dynamic_update import CONFIGS, D, N  # noqa: E402
from bench_kernels import copy_bandwidth, load_pattern, paired_ms  # noqa: E402
from probe_store_last import static_cases  # noqa: E402

from sas.codegen import triton_backend as tb  # noqa: E402
from sas.runtime import SASAttnKernel  # noqa: E402

PATTERNS = "block_local,openai_fixed,streaming_llm,sliding_window,strided_block_local"


_MODULES: dict = {}
#: module name -> the split kernel's (registers, spills) as compiled for its first launch
REGS: dict = {}


def capped_kernel(name: str, opts, cap: int) -> SASAttnKernel:
    """A kernel whose decode module (a copy of its own per cap) compiles the split kernel under
    `maxnreg=cap` (0: no cap); `REGS[module name]` gets the split kernel's (registers, spills)."""
    kern = SASAttnKernel(load_pattern(name), max_len=N, decode_options=opts)
    src = tb.render_decode(kern.plan.analysis, opts) + f"\n# probe_decode_maxnreg: cap {cap}\n"
    mod = _MODULES.get(src)
    if mod is None:
        mod = _MODULES[src] = tb.load_source(src, f"sas_decode_cap{cap}")
        launch = mod._launch

        def capped(kernel, grid, key, args, consts, tensors):
            if "SPLIT_SIZE" not in consts:            # the combine or flags kernel: as it is
                return launch(kernel, grid, key, args, consts, tensors)
            if cap:
                consts, key = dict(consts, maxnreg=cap), (key, cap)
            if mod.__name__ not in REGS:              # the first launch: compile here, note registers
                ck = kernel[grid](*args, **consts)
                REGS[mod.__name__] = (getattr(ck, "n_regs", None), getattr(ck, "n_spills", None))
                return None
            return launch(kernel, grid, key, args, consts, tensors)

        mod._launch = capped
    kern.runtime._decode_mods[opts] = mod
    return kern


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--patterns", default=PATTERNS)
    ap.add_argument("--caps", default="0,128,96,80")
    ap.add_argument("--split-factors", default="1,2")
    ap.add_argument("--pdl", action="store_true", help="time programmatic dependent launches too")
    ap.add_argument("--configs", default="MHA,GQA")
    ap.add_argument("--rep", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    dev = torch.device("cuda")
    bw = copy_bandwidth(dev)
    caps = [int(c) for c in args.caps.split(",")]
    factors = [int(f) for f in args.split_factors.split(",")]
    configs = [c for c in CONFIGS if c[0] in args.configs.split(",")]
    print(f"# {torch.cuda.get_device_name(dev)}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"N={N}, D={D}, copy bandwidth {bw / 1e12:.2f} TB/s; caps {caps}, split factors {factors}", flush=True)
    rows = []
    for cfg, B, Hq, Hkv, q, kd, vd, name, base, kc, vc in static_cases(args.patterns.split(","), configs, dev):
        floor = 2 * base.cache_size * B * Hkv * D * 2 / bw * 1e6
        auto = base.runtime.splits(base.runtime.decode_module(), base.plan.decode_config(Hq // Hkv), B, Hkv, dev)
        variants, fns, outs = [], [], []
        for pdl in ((False, True) if args.pdl else (False,)):
            opts = dataclasses.replace(base.plan.decode_config(Hq // Hkv), pdl=pdl)
            for cap in caps:
                for f in factors:
                    kern_f = capped_kernel(name, opts, cap)
                    kern_f.runtime.num_splits = max(1, auto * f)
                    c = (kc.clone(), vc.clone())
                    out = torch.empty_like(q)
                    kern_f.runtime.decode(q, kd, vd, c[0], c[1], N - 1, out=out)
                    torch.cuda.synchronize()
                    outs.append((out, c[0], c[1]))
                    fns.append(lambda k=kern_f, c=c, out=out: k.runtime.decode(q, kd, vd, c[0], c[1], N - 1, out=out))
                    variants.append((pdl, cap, f, auto * f, kern_f.runtime._decode_mods[opts].__name__))
        ref = {(v[0], v[2]): o for v, o in zip(variants, outs) if v[1] == caps[0]}
        same = [all(torch.equal(a, b) for a, b in zip(o, ref[(v[0], v[2])])) for v, o in zip(variants, outs)]
        t = [x * 1e3 for x in paired_ms(fns, True, args.rep, args.rounds)]
        for v, us, ok in zip(variants, t, same):
            r, s = REGS.get(v[4], (None, None))
            rows.append(dict(cfg=cfg, name=name, slots=base.cache_size, floor=floor, pdl=v[0], cap=v[1],
                             factor=v[2], splits=v[3], regs=r, spills=s, us=us, same=ok))
            print(f"{cfg} {name:20s} slots {base.cache_size:5d} pdl {int(v[0])} cap {v[1]:3d} splits {v[3]:3d} "
                  f"regs {r} spills {s}: {us:7.2f} us ({us / floor:.2f}x floor){'' if ok else '  DIFFERS'}",
                  flush=True)
    print("\n| config | pattern | slots | floor us | PDL | cap | splits | regs / spills | us | x floor | same |")
    print("|---|---|---:|---:|---|---:|---:|---|---:|---:|---|")
    for r in rows:
        print(f"| {r['cfg']} | {r['name']} | {r['slots']} | {r['floor']:.2f} | {'yes' if r['pdl'] else 'no'} | "
              f"{r['cap'] or '-'} | {r['splits']} | {r['regs']} / {r['spills']} | {r['us']:.2f} | "
              f"{r['us'] / r['floor']:.2f} | {'yes' if r['same'] else 'NO'} |")


if __name__ == "__main__":
    main()
