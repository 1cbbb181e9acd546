"""Where the dynamic decode step's time goes, with the L2 warm and cold (issue 11, item 5).

For each Table-1 pattern + H2O (budget 512, 16K, bf16, head dim 128; MHA 64 heads batch 1, GQA
32 / 8 heads batch 16), from the state bench_dynamic.py times, CUDA-graph replays in us:
- the static decode of the pattern; the dynamic step (`dynamic_host.step`: the attention, then
  the score and update kernels, which merge the attention's splits); the same step with the
  merge in a combine launch of its own (as before 2026-11-26 21:50 UTC); and the step's parts:
  attention + combine, score + update;
- each twice: over one set of buffers, as bench_dynamic.py and ab_dynamic_update.py time it (a
  replay then finds in the H100's 50 MB L2 whatever of its working set the last replay left
  there: all of a 33.5 MB static cache), and rotating over `--copies` sets of buffers whose
  working sets together exceed the L2 (each call reads what the L2 does not hold, as a decode
  step of one layer among many does); the cold time is the graph time of one pass over the
  copies divided by their number;
- the step over its floor (static decode + the pool's bytes at the copy bandwidth), warm over
  warm and cold over cold;
- in the JSON rows, `state_sha256`: a digest of the state after the prepared step
  (`state_digest`), to check that a template variant (`SAS_TEMPLATE_DIR`) leaves the same state.

    python benchmarks/profile_dynamic_step.py [--patterns a,b] [--configs MHA,GQA] [--copies 4]
                                              [--out results/NAME]
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from ab_dynamic_update import CONFIGS, DTYPE, D, STATE, floor_ms, prepare, random_inputs  # noqa: E402
from bench_kernels import PATTERNS, copy_bandwidth, paired_ms, write_results  # noqa: E402

from sas.runtime import dynamic_host as dh  # noqa: E402

COPY = STATE + ("pos",)


def state_digest(st: dh.State) -> str:
    """SHA-256 of the state's bytes after `prepare`'s one decode step (the cache, the pool's keys
    and flags, the staging, the position), for comparing template variants (`SAS_TEMPLATE_DIR`)
    that must leave the same state: equal across runs of one template in practice (eviction
    follows the scores, so a near-tie could still differ). The accumulated scores
    are left out: the prefill adds them with float atomics, so their low bits differ from run to
    run (H100, 2026-11-28)."""
    h = hashlib.sha256()
    for a in COPY:
        if a != "acc":
            h.update(getattr(st, a).contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def rotated(fns):
    """One call that runs every function of `fns` once, in order."""
    def run():
        for f in fns:
            f()
    return run


def profile(cfg: str, B: int, Hq: int, Hkv: int, name: str, k, v, qd, kd, vd, bw: float, copies: int,
            dev) -> dict:
    static_steps, dk, P = prepare(name, B, Hq, Hkv, k, v, qd, kd, vd, copies=copies)
    host = dk.dynamic.rt
    kern, st, tabs = host.kernels, host.state, host.device_tables(dev)
    digest = state_digest(st)
    states = [st]
    for _ in range(copies - 1):
        s2 = dh.State(kern, B, Hq, Hkv, D, DTYPE, dev, num_splits=st.num_splits, block_n=st.block_n)
        for a in COPY:
            getattr(s2, a).copy_(getattr(st, a))
        states.append(s2)
    do = torch.empty_like(qd)

    def attend(s):
        return lambda: dh.attend(kern, s, qd, kd, vd, P, do)

    def update(s):
        return lambda: dh.update(kern, s, P, *tabs, score=True, evict=True)

    def step(s):
        return lambda: dh.step(kern, s, qd, kd, vd, P, do, tabs, evict=True)

    def step_combine_launch(s):            # the step before the merge moved out of a combine launch
        return rotated([attend(s), update(s)])

    kinds = {"static": static_steps, "step": [step(s) for s in states],
             "step (combine launch)": [step_combine_launch(s) for s in states],
             "attend+combine": [attend(s) for s in states], "score+update": [update(s) for s in states]}
    fns = [f[0] for f in kinds.values()] + [rotated(f) for f in kinds.values()]
    times = paired_ms(fns, True, 40, 3)
    warm = {kind: t * 1e3 for kind, t in zip(kinds, times[:len(kinds)])}
    cold = {kind: t * 1e3 / copies for kind, t in zip(kinds, times[len(kinds):])}
    floor_w = floor_ms(warm["static"] / 1e3, dk, B, Hkv, bw) * 1e3
    floor_c = floor_ms(cold["static"] / 1e3, dk, B, Hkv, bw) * 1e3
    per_slot = 2 * B * Hkv * D * st.k.element_size()           # K and V of one slot, every (batch, KV head)
    ws = {"static": per_slot * dk.dynamic.cplan.static_size, "dynamic": per_slot * kern.TOTAL}
    return {"config": cfg, "pattern": name, "slots": kern.TOTAL, "split": f"bn{st.block_n}/ns{st.num_splits}",
            "state_sha256": digest,
            "working_set_mb": {a: b / 2 ** 20 for a, b in ws.items()}, "warm_us": warm, "cold_us": cold,
            "floor_warm_us": floor_w, "floor_cold_us": floor_c,
            "step_over_floor_warm": warm["step"] / floor_w, "step_over_floor_cold": cold["step"] / floor_c}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--patterns", default=",".join(PATTERNS))
    ap.add_argument("--configs", default="MHA,GQA")
    ap.add_argument("--copies", type=int, default=4, help="buffer sets rotated for the cold-L2 times")
    ap.add_argument("--out", default=None, help="write NAME.md and NAME.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("profile_dynamic_step.py needs an NVIDIA GPU")
    if args.copies < 2:
        raise SystemExit("--copies must be at least 2")
    dev = torch.device("cuda")
    bw = copy_bandwidth(dev)
    rows = []
    for cfg, B, Hq, Hkv in CONFIGS:
        if cfg not in args.configs.split(","):
            continue
        k, v, qd, kd, vd = random_inputs(B, Hq, Hkv, dev)
        for name in args.patterns.split(","):
            row = profile(cfg, B, Hq, Hkv, name, k, v, qd, kd, vd, bw, args.copies, dev)
            print(json.dumps(row), flush=True)
            rows.append(row)
            torch.cuda.empty_cache()
        del k, v
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# `python benchmarks/profile_dynamic_step.py --copies {args.copies}` ({torch.cuda.get_device_name()}, "
             f"torch {torch.__version__}, copy {bw / 1e12:.2f} TB/s, L2 "
             f"{torch.cuda.get_device_properties(dev).L2_cache_size / 2 ** 20:.0f} MB, {when})", "",
             "CUDA-graph times in us, warm (one buffer set) / cold (rotating over the copies); the step over "
             "its floor (static decode + pool bytes), warm / cold.", "",
             "| config | pattern | slots | working set MB static / dynamic | static | step | step with a combine "
             "launch | attend+combine | score+update | step / floor |", "|---|---|---:|---|---|---|---|---|---|---|"]
    for r in rows:
        w, c = r["warm_us"], r["cold_us"]
        cell = lambda kind: f"{w[kind]:.1f} / {c[kind]:.1f}"  # noqa: E731
        lines.append(f"| {r['config']} | {r['pattern']} | {r['slots']} | {r['working_set_mb']['static']:.0f} / "
                     f"{r['working_set_mb']['dynamic']:.0f} | {cell('static')} | {cell('step')} | "
                     f"{cell('step (combine launch)')} | {cell('attend+combine')} | {cell('score+update')} | "
                     f"{r['step_over_floor_warm']:.2f} / "
                     f"{r['step_over_floor_cold']:.2f} |")
    text = "\n".join(lines)
    print(text)
    write_results(args.out, rows, text + "\n", indent=1)


if __name__ == "__main__":
    main()
