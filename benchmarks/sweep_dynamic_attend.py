"""Sweep of the dynamic decode attention's slot block and split count (issue 11, item 5).

For Table-1 patterns + H2O (budget 512, 16K, bf16, head dim 128; MHA 64 heads batch 1, GQA
32 / 8 heads batch 16) the step's state is copied into runtime states (`dynamic_host.State`)
whose attention takes `bn` slots a block and `ns` splits; each variant's output is compared
with the default's, then the CUDA-graph time of the whole step (attention, combine, score and
update kernels) is taken in turns with the static decode (`paired_ms`) and printed beside the
floor (static decode + the pool's bytes at the copy bandwidth), one markdown row a pattern.
`--mha-dot`: one query row a KV head also through the query groups' `tl.dot` loop (`State(use_dot=
True)`, as `dynamic_host.MHA_DOT` would make it), labelled "dot bn../ns..".

    python benchmarks/sweep_dynamic_attend.py [--cases "GQA@4:openai_strided,openai_fixed;MHA:block_local"]
        [--blocks 32,64,128] [--splits 2,4,8] [--mha-dot]
"""
import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from ab_dynamic_update import DTYPE, D, floor_ms, prepare, random_inputs  # noqa: E402
from bench_kernels import copy_bandwidth, paired_ms  # noqa: E402

from sas.runtime import dynamic_host as dh  # noqa: E402

dev = torch.device("cuda")
dtype = DTYPE
COPY = ("k", "v", "acc", "flags", "keys", "new_pool", "enter_dst", "pos")
CASES = (("MHA", 1, 64, 64, ("block_local", "streaming_llm", "sliding_window", "strided_block_local", "openai_fixed")),
         ("GQA", 16, 32, 8, ("block_local", "streaming_llm", "strided_block_local")))


def variant_state(kern, st, B: int, H: int, Hkv: int, bn: int, ns: int, use_dot: bool | None = None) -> dh.State:
    """A copy of state `st` whose attention takes `bn` slots a block and `ns` splits (rounded as
    `dh.State` rounds them), through the `tl.dot` loop where `use_dot`."""
    s2 = dh.State(kern, B, H, Hkv, D, dtype, dev, num_splits=ns, block_n=bn, use_dot=use_dot)
    for a in COPY:
        getattr(s2, a).copy_(getattr(st, a))
    return s2


def sweep(cfg: str, B: int, Hq: int, Hkv: int, name: str, k, v, qd, kd, vd, bw: float,
          blocks: tuple[int, ...] | None = None, splits: tuple[int, ...] | None = None, mha_dot: bool = False) -> str:
    static_step, dk, P = prepare(name, B, Hq, Hkv, k, v, qd, kd, vd)
    host = dk.dynamic.rt
    kern, st, tabs = host.kernels, host.state, host.device_tables(dev)
    variants = [("default", st)]
    seen = {(st.use_dot, st.block_n, st.num_splits)}
    dots = (False, True) if mha_dot and Hq == Hkv else (None,)
    for dot in dots:
        for bn in blocks or ((32, 64) if cfg == "MHA" and not dot else (32, 64, 128)):
            nb = -(-kern.TOTAL // bn)
            rule = dh.num_splits_for(kern, B, Hkv, block_n=bn, group=Hq // Hkv)
            for ns in sorted(set(splits) if splits else {max(1, nb // 8), max(1, nb // 4), max(1, nb // 2), nb, rule}):
                s2 = variant_state(kern, st, B, Hq, Hkv, bn, ns, use_dot=dot)
                if (s2.use_dot, bn, s2.num_splits) not in seen:        # labelled by the splits it runs (ns rounds)
                    seen.add((s2.use_dot, bn, s2.num_splits))
                    variants.append((f"{'dot ' if dot else ''}bn{bn}/ns{s2.num_splits}", s2))
    outs = []
    for _, s in variants:
        o = torch.empty_like(qd)
        dh.attend(kern, s, qd, kd, vd, P, o)
        outs.append(o.float())
    agree = all(torch.allclose(o, outs[0], atol=2e-2, rtol=2e-2) for o in outs)

    def step_of(s):
        o = torch.empty_like(qd)

        def step():
            dh.step(kern, s, qd, kd, vd, P, o, tabs, evict=True)
        return step

    times = paired_ms([static_step] +
                      [step_of(s) for _, s in variants], True, 40, 3)
    floor = floor_ms(times[0], dk, B, Hkv, bw)
    steps = times[1:]
    best = min(range(len(variants)), key=lambda i: steps[i])
    return (f"| {cfg} b{B} | {name} | {kern.TOTAL} | {agree} | bn{st.block_n}/ns{st.num_splits} {steps[0] * 1e3:.1f} "
            f"({steps[0] / floor:.2f}) | {variants[best][0]} {steps[best] * 1e3:.1f} ({steps[best] / floor:.2f}) | "
            + ", ".join(f"{label} {t * 1e3:.1f}" for (label, _), t in zip(variants, steps)) + " |")


def parse_cases(text: str) -> tuple:
    """`CASES` narrowed to "CFG[@batch]:pattern,pattern;CFG:..." (CFG: MHA or GQA, with CASES'
    heads and, without @batch, their batch)."""
    shapes = {cfg: (B, Hq, Hkv) for cfg, B, Hq, Hkv, _ in CASES}
    out = []
    for part in filter(None, text.split(";")):
        head, _, names = part.partition(":")
        cfg, _, batch = head.partition("@")
        if cfg not in shapes or not names or (batch and not batch.isdigit()):
            raise SystemExit(f"--cases: {part!r} is not CFG[@batch]:pattern[,pattern] with CFG one of {sorted(shapes)}")
        B, Hq, Hkv = shapes[cfg]
        out.append((cfg, int(batch) if batch else B, Hq, Hkv, tuple(names.split(","))))
    return tuple(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=None, help='e.g. "GQA:openai_strided,openai_fixed;MHA:block_local"')
    ap.add_argument("--blocks", default=None, help="slot blocks to try, e.g. 32,64,128")
    ap.add_argument("--splits", default=None, help="split counts to try (each rounded as State rounds it), e.g. 2,4,8")
    ap.add_argument("--mha-dot", action="store_true", help="MHA rows also through the tl.dot loop")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("sweep_dynamic_attend.py needs an NVIDIA GPU")
    cases = parse_cases(args.cases) if args.cases else CASES
    blocks = tuple(int(x) for x in args.blocks.split(",")) if args.blocks else None
    splits = tuple(int(x) for x in args.splits.split(",")) if args.splits else None
    bw = copy_bandwidth(dev)
    rows = []
    for cfg, B, Hq, Hkv, names in cases:
        k, v, qd, kd, vd = random_inputs(B, Hq, Hkv, dev)
        for name in names:
            rows.append(sweep(cfg, B, Hq, Hkv, name, k, v, qd, kd, vd, bw, blocks, splits, args.mha_dot))
            print(rows[-1], flush=True)
            torch.cuda.empty_cache()
    print("| config | pattern | slots | outputs agree | default | best | every variant |")
    print("|---|---|---:|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
