"""The prefill of `sas compile` output on Hopper: the wide schedule against the default one.

A compiled static package carries a second prefill schedule (`plan.pt["prefill_wide"]`,
128 x 128 tiles) where those tiles pay once the Gluon kernel runs them; its prefill takes it
where prefill.py's `gluon_ok` allows the tensors (SAS_GLUON=0: never). For each pattern, the
package is compiled for --max-len and its prefill timed at each length (a prefix of the
max_len schedule) both ways, paired rounds, beside SDPA's dense causal kernel; outputs of the
two ways are compared first.

    python benchmarks/bench_compiled_prefill.py [--patterns a,b] [--lengths 8192,16384]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_kernels import load_pattern, paired_ms  # noqa: E402

from sas import Causal  # noqa: E402
from sas.codegen import compile_pattern  # noqa: E402


def _package(pattern, max_len: int, folder: Path, name: str):
    compile_pattern(pattern, folder, max_len=max_len, head_dim=128, dtype="bfloat16")
    spec = importlib.util.spec_from_file_location(name, folder / "__init__.py", submodule_search_locations=[str(folder)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--patterns", default="causal,sliding_window,streaming_llm,block_local")
    ap.add_argument("--max-len", type=int, default=16384)
    ap.add_argument("--lengths", default="2048,8192,16384")
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    print(f"# {props.name}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, torch {torch.__version__}; "
          f"batch 1, {args.heads} heads, head dim 128, bf16; packages compiled for max_len {args.max_len}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(args.patterns.split(",")):
            p = Causal() if name == "causal" else load_pattern(name)
            attn = _package(p, args.max_len, Path(tmp) / name, f"sas_bench_pkg_{i}")
            sched = attn.kernel.schedule
            wide = sched.get("prefill_wide")
            tiles = f"{int(sched['prefill']['block_m'])}x{int(sched['prefill']['block_n'])}"
            wtiles = f"{int(wide['block_m'])}x{int(wide['block_n'])}" if wide is not None else "-"
            for L in map(int, args.lengths.split(",")):
                g = torch.Generator(device=dev).manual_seed(L)
                q, k, v = (torch.randn(1, args.heads, L, 128, device=dev, dtype=torch.bfloat16, generator=g)
                           for _ in range(3))
                took = attn.kernel.wide(q, k, v)
                used = wide if took else sched["prefill"]
                kernel = "gluon" if attn.kernel.prefill_module.gluon_ok(
                    q, k, v, int(used["block_m"]), int(used["block_n"])) else "triton"

                def default():
                    os.environ["SAS_GLUON"] = "0"
                    try:
                        return attn.prefill(q, k, v)
                    finally:
                        os.environ.pop("SAS_GLUON", None)

                def auto():
                    return attn.prefill(q, k, v)

                a, b = auto().float(), default().float()
                err = float((a - b).norm() / b.norm())
                sdpa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
                ta, td, ts = paired_ms([auto, default, sdpa], False, args.rep, args.rounds)
                rows.append((name, L, tiles, wtiles, f"{took} ({kernel})", ta, td, ts, err))
                print(f"{name:15s} {L:6d}: package {ta:.3f} ms ({wtiles if took else tiles}, {kernel}), "
                      f"SAS_GLUON=0 {td:.3f} "
                      f"ms ({tiles}), SDPA causal {ts:.3f} ms; rel diff {err:.1e}", flush=True)
    print("\n| pattern | length | default tiles | wide tiles | wide taken | package ms | SAS_GLUON=0 ms | "
          "speedup | SDPA causal ms | rel diff |\n|---|---:|---|---|---|---:|---:|---:|---:|---:|")
    for name, L, tiles, wtiles, took, ta, td, ts, err in rows:
        print(f"| {name} | {L} | {tiles} | {wtiles} | {took} | {ta:.3f} | {td:.3f} | {td / ta:.2f}x | {ts:.3f} | "
              f"{err:.1e} |")


if __name__ == "__main__":
    main()
