"""Same-run A/B of the dynamic decode step's update (issue 11, item 5): where the score pass runs
(in the update kernel's one program per KV head, or the score kernel over slot blocks of
SCORE_SLOTS) and the update kernel's warps, on the bench_dynamic.py configurations (each Table-1
pattern + H2O with budget 512 at 16K; MHA 64 heads batch 1, GQA 32 / 8 heads batch 16; bf16,
head dim 128). For each pattern: one step from the same saved state under every variant, the
state after it compared bit for bit with the first variant's; then the CUDA-graph time of the
step (attention, combine, score and update kernels) beside the static decode of the same
pattern, in turns (`paired_ms`), and each step over its floor (static decode + the pool's
bytes at the copy bandwidth), as bench_dynamic.py reports it.

    python benchmarks/ab_dynamic_update.py [--patterns streaming_llm,...] [--variants in-update,split512]
                                           [--out results/NAME]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_dynamic import dynamic_of, item5_floor_ms  # noqa: E402
from bench_kernels import PATTERNS, copy_bandwidth, load_pattern, paired_ms  # noqa: E402

from sas.runtime import SASAttnKernel, dynamic_host  # noqa: E402

#: (label, SPLIT_SCORE_FROM, SCORE_SLOTS, UPDATE_WARPS)
VARIANTS = (("in-update", 10 ** 9, 512, 4), ("split512", 0, 512, 4), ("split512-8w", 0, 512, 8),
            ("split256-8w", 0, 256, 8), ("split512-2w", 0, 512, 2))
STATE = ("k", "v", "acc", "flags", "keys", "new_pool", "enter_dst")
N, D, DTYPE = 16384, 128, torch.bfloat16


#: (label, batch, query heads, KV heads) of bench_dynamic.py's two configurations
CONFIGS = (("MHA", 1, 64, 64), ("GQA", 16, 32, 8))


def random_inputs(B: int, Hq: int, Hkv: int, dev):
    """Seeded keys and values [B, Hkv, N, D], a decode query [B, Hq, 1, D], and the last
    position's key and value (the decode step's new ones)."""
    torch.manual_seed(0)
    k = torch.randn(B, Hkv, N, D, device=dev, dtype=DTYPE)
    v = torch.randn_like(k)
    qd = torch.randn(B, Hq, 1, D, device=dev, dtype=DTYPE)
    return k, v, qd, k[:, :, N - 1:N].contiguous(), v[:, :, N - 1:N].contiguous()


def prepare(name: str, B: int, Hq: int, Hkv: int, k: torch.Tensor, v: torch.Tensor, qd: torch.Tensor,
            kd: torch.Tensor, vd: torch.Tensor, copies: int = 1):
    """Table-1 pattern `name` over keys k, v [B, Hkv, N, D]: its static decode of query N - 1
    (a callable; a list of `copies` of them over copies of the cache when copies > 1), and its
    dynamic pattern (+ H2O, budget 512) prefilled on N - 2 tokens and stepped once at N - 2 with
    graphs off; returns (static step(s), dynamic kernel, position)."""
    dev = k.device
    static = load_pattern(name)
    sk = SASAttnKernel(static, max_len=N)
    kc, vc = sk.new_cache(B, Hkv, D, DTYPE, dev)
    sk.fill_cache(k[:, :, :N - 1], v[:, :, :N - 1], kc, vc)
    so = torch.empty_like(qd)
    caches = [(kc, vc)] + [(kc.clone(), vc.clone()) for _ in range(copies - 1)]
    steps = [lambda c=c: sk.runtime.decode(qd, kd, vd, c[0], c[1], N - 1, out=so) for c in caches]
    P = N - 2
    dk = SASAttnKernel(dynamic_of(static, 512), max_len=N)
    dk.prefill(torch.randn(B, Hq, P, D, device=dev, dtype=DTYPE), k[:, :, :P].contiguous(),
               v[:, :, :P].contiguous())
    dk.dynamic.rt.graphs = False
    dk.decode(qd, kd, vd)
    return (steps if copies > 1 else steps[0]), dk, P


def floor_ms(static_ms: float, dk, B: int, Hkv: int, bw: float) -> float:
    """Item 5's floor of a dynamic step: the static decode's time plus the pool's K and V bytes
    at the copy bandwidth `bw` (bytes/s)."""
    return item5_floor_ms(static_ms, dk.dynamic.cplan.pool_size, B, Hkv, D, bw)


def use(variant) -> None:
    _, dynamic_host.SPLIT_SCORE_FROM, dynamic_host.SCORE_SLOTS, dynamic_host.UPDATE_WARPS = variant


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--patterns", default=",".join(PATTERNS))
    ap.add_argument("--variants", default=",".join(v[0] for v in VARIANTS),
                    help="labels of VARIANTS to run (the first is the one the others are compared with)")
    ap.add_argument("--out", default=None, help="write NAME.md and NAME.json")
    args = ap.parse_args()
    by_label = {v[0]: v for v in VARIANTS}
    unknown = [x for x in args.variants.split(",") if x not in by_label]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; known: {sorted(by_label)}")
    variants = [by_label[x] for x in args.variants.split(",")]
    if not torch.cuda.is_available():
        raise SystemExit("ab_dynamic_update.py needs an NVIDIA GPU")
    dev = torch.device("cuda")
    bw = copy_bandwidth(dev)
    default = (None, dynamic_host.SPLIT_SCORE_FROM, dynamic_host.SCORE_SLOTS, dynamic_host.UPDATE_WARPS)
    rows = []
    for cfg, B, Hq, Hkv in CONFIGS:
        k, v, qd, kd, vd = random_inputs(B, Hq, Hkv, dev)
        for name in args.patterns.split(","):
            static_step, dk, P = prepare(name, B, Hq, Hkv, k, v, qd, kd, vd)
            host = dk.dynamic.rt
            tabs, do, st = host.device_tables(dev), torch.empty_like(qd), host.state
            saved = {a: getattr(st, a).clone() for a in STATE}

            def step(variant):
                use(variant)
                dynamic_host.step(host.kernels, st, qd, kd, vd, P, do, tabs, evict=True)

            after = []
            for variant in variants:
                for a in STATE:
                    getattr(st, a).copy_(saved[a])
                step(variant)
                torch.cuda.synchronize()
                after.append([getattr(st, a).clone() for a in STATE] + [do.clone()])
            same = all(torch.equal(x, y) for other in after[1:] for x, y in zip(after[0], other))
            for a in STATE:
                getattr(st, a).copy_(saved[a])
            times = paired_ms([static_step] +
                              [lambda variant=variant: step(variant) for variant in variants], True, 50, 3)
            use(default)
            floor = floor_ms(times[0], dk, B, Hkv, bw)
            row = {"config": cfg, "pattern": name, "slots": dk.dynamic.cplan.cache_size, "state_bit_identical": same,
                   "static_ms": times[0], "floor_ms": floor,
                   "step_ms": {variant[0]: t for variant, t in zip(variants, times[1:])}}
            print(json.dumps(row), flush=True)
            rows.append(row)
            del dk, static_step, saved, after
            host = st = None            # the step closure's state goes too
            torch.cuda.empty_cache()
        del k, v
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# `python benchmarks/ab_dynamic_update.py` ({torch.cuda.get_device_name()}, torch {torch.__version__}, "
             f"copy {bw / 1e12:.2f} TB/s, {when})", "",
             "Step time in a CUDA graph, us (over the floor: static decode + pool bytes); variants: "
             + "; ".join(f"{v[0]} = score pass from {v[1] if v[1] < 10 ** 9 else 'never'} slots, "
                         f"{v[2]} slots a program, {v[3]} update warps" for v in variants), "",
             "| config | pattern | slots | state bit-identical | static us | "
             + " | ".join(v[0] for v in variants) + " |", "|---|---|---:|---|---:|" + "---:|" * len(variants)]
    for r in rows:
        lines.append(f"| {r['config']} | {r['pattern']} | {r['slots']} | {r['state_bit_identical']} | "
                     f"{r['static_ms'] * 1e3:.1f} | " + " | ".join(
                         f"{r['step_ms'][v[0]] * 1e3:.1f} ({r['step_ms'][v[0]] / r['floor_ms']:.2f})" for v in variants)
                     + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).with_suffix(".md").write_text(text)
        Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
