"""Where the dynamic decode step's time goes, and the attention without its block-skipping branch
(issue 11, item 5).

For each Table-1 pattern + H2O (budget 512, 16K, bf16, head dim 128; MHA 64 heads batch 1, GQA
32 / 8 heads batch 16), from the state bench_dynamic.py times:
- the step (attention + combine, then the score and update kernels) with the runtime's default
  attention and with variants of it: no branch around each slot block (`State(skip=False)`:
  masked loads instead, so the loop can be software-pipelined) at a few slot blocks and splits;
  each variant's output and state after one step compared bit for bit with the default's;
- its parts alone: the attention + combine (default and branch-free), the update with its score
  pass, and the update without it (the score pass's cost is the difference);
all CUDA-graph replays taken in turns with the static decode (`paired_ms`), in us, and the step
over its floor (static decode + pool bytes at the copy bandwidth).

    python benchmarks/profile_dynamic_step.py [--patterns a,b] [--out results/NAME]
"""
from __future__ import annotations

import argparse
import json
import datetime
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from ab_dynamic_update import DTYPE, D, N, STATE, floor_ms, prepare  # noqa: E402
from bench_kernels import PATTERNS, copy_bandwidth, paired_ms  # noqa: E402

from sas.runtime import dynamic_host as dh  # noqa: E402

COPY = STATE + ("pos",)


def variants_for(kern, st: dh.State, cfg: str) -> list[tuple[str, int, int, bool]]:
    """(label, slot block, splits, skip): the default, the same without the branch, and
    branch-free ones with 2 or 4 slot blocks a program (the static decode's rule)."""
    out = [("default", st.block_n, st.num_splits, True), ("noskip", st.block_n, st.num_splits, False)]
    for bn in ((32, 64) if cfg == "MHA" else (64, 128)):
        nb = -(-kern.TOTAL // bn)
        for per in (2, 4):
            out.append((f"noskip bn{bn} {per}/prog", bn, -(-nb // per), False))
    return out


def profile(cfg: str, B: int, Hq: int, Hkv: int, name: str, k, v, qd, kd, vd, bw: float, dev) -> dict:
    static_step, dk, P = prepare(name, B, Hq, Hkv, k, v, qd, kd, vd)
    host = dk.dynamic.rt
    kern, st, tabs = host.kernels, host.state, host.device_tables(dev)
    states = []
    for label, bn, ns, skip in variants_for(kern, st, cfg):
        s2 = dh.State(kern, B, Hq, Hkv, D, DTYPE, dev, num_splits=ns, block_n=bn, skip=skip)
        for a in COPY:
            getattr(s2, a).copy_(getattr(st, a))
        states.append((f"{label} (bn{s2.block_n}/ns{s2.num_splits})", s2))
    saved = {a: getattr(states[0][1], a).clone() for a in COPY}

    def step_of(s, o):
        def step():
            dh.attend(kern, s, qd, kd, vd, P, o)
            dh.update(kern, s, P, *tabs, score=True, evict=True)
        return step

    # one step from the same state under every variant: outputs and state bit for bit
    after = []
    for _, s in states:
        o = torch.empty_like(qd)
        step_of(s, o)()
        torch.cuda.synchronize()
        after.append([getattr(s, a).clone() for a in STATE] + [o.clone()])
        for a in COPY:
            getattr(s, a).copy_(saved[a])
    identical = [all(torch.equal(x, y) for x, y in zip(after[0], a)) for a in after]
    close = [torch.allclose(a[-1].float(), after[0][-1].float(), atol=2e-2, rtol=2e-2) for a in after]

    o = torch.empty_like(qd)
    s0, s1 = states[0][1], states[1][1]
    parts = {
        "attend+combine": lambda: dh.attend(kern, s0, qd, kd, vd, P, o),
        "attend+combine noskip": lambda: dh.attend(kern, s1, qd, kd, vd, P, o),
        "score+update": lambda: dh.update(kern, s0, P, *tabs, score=True, evict=True),
        "update without score": lambda: dh.update(kern, s0, P, *tabs, score=False, evict=True),
    }
    fns = [static_step] + [step_of(s, torch.empty_like(qd)) for _, s in states] + list(parts.values())
    times = paired_ms(fns, True, 40, 3)
    floor = floor_ms(times[0], dk, B, Hkv, bw)
    steps = times[1:1 + len(states)]
    row = {"config": cfg, "pattern": name, "slots": kern.TOTAL, "static_us": times[0] * 1e3,
           "floor_us": floor * 1e3,
           "steps": [{"variant": lab, "us": t * 1e3, "over_floor": t / floor, "bit_identical": same,
                      "output_close": c}
                     for (lab, _), t, same, c in zip(states, steps, identical, close)],
           "parts_us": {lab: t * 1e3 for lab, t in zip(parts, times[1 + len(states):])}}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--patterns", default=",".join(PATTERNS))
    ap.add_argument("--configs", default="MHA,GQA")
    ap.add_argument("--out", default=None, help="write NAME.md and NAME.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("profile_dynamic_step.py needs an NVIDIA GPU")
    dev = torch.device("cuda")
    bw = copy_bandwidth(dev)
    rows = []
    for cfg, B, Hq, Hkv in (("MHA", 1, 64, 64), ("GQA", 16, 32, 8)):
        if cfg not in args.configs.split(","):
            continue
        torch.manual_seed(0)
        k = torch.randn(B, Hkv, N, D, device=dev, dtype=DTYPE)
        v = torch.randn_like(k)
        qd = torch.randn(B, Hq, 1, D, device=dev, dtype=DTYPE)
        kd, vd = k[:, :, N - 1:N].contiguous(), v[:, :, N - 1:N].contiguous()
        for name in args.patterns.split(","):
            row = profile(cfg, B, Hq, Hkv, name, k, v, qd, kd, vd, bw, dev)
            print(row, flush=True)
            rows.append(row)
            torch.cuda.empty_cache()
        del k, v
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# `python benchmarks/profile_dynamic_step.py` ({torch.cuda.get_device_name()}, torch "
             f"{torch.__version__}, copy {bw / 1e12:.2f} TB/s, {when})", "",
             "CUDA-graph times, us; step over its floor (static decode + pool bytes) in parentheses; "
             "`=` state and output after one step bit-identical to the default's, `~` output within 2e-2.", "",
             "| config | pattern | slots | static | floor | steps | attend+combine | noskip | score+update | "
             "update without score |", "|---|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        p = r["parts_us"]
        steps = "; ".join(f"{s['variant']} {s['us']:.1f} ({s['over_floor']:.2f}){'=' if s['bit_identical'] else ''}"
                          f"{'~' if s['output_close'] else ' DIFFERS'}" for s in r["steps"])
        lines.append(f"| {r['config']} | {r['pattern']} | {r['slots']} | {r['static_us']:.1f} | {r['floor_us']:.1f} | "
                     f"{steps} | {p['attend+combine']:.1f} | {p['attend+combine noskip']:.1f} | "
                     f"{p['score+update']:.1f} | {p['update without score']:.1f} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".md").write_text(text + "\n")
        out.with_suffix(".json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
