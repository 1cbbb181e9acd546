"""Should the dynamic attention load a slot block's K and V before the pool's flags and keys?
(issue 11, item 5)

`_attend_block` of `dynamic_decode.py.jinja` loads K and V masked by the static mask and the
pool's range (no memory read decides them), so that they are in flight together with the pool's
flags and keys; before 2026-11-27 it loaded them after, masked by the held / loaded flags and
inside the branch those flags decide (one dependent memory round trip more a block). This
script renders the module as the template has it and with the earlier block body, checks the
state after one step equal, and times both steps by CUDA-graph replay (each Table-1 pattern +
H2O, budget 512, the configurations of bench_dynamic.py).

    python benchmarks/ab_dynamic_kv_loads.py [--patterns a,b] [--configs MHA,GQA]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_dynamic_update import CONFIGS  # noqa: E402
from probe_store_last import dynamic_rows  # noqa: E402

NEW = '''    kv = (st_att | is_pool) != 0
    k = tl.load(kc + slot[None, :] * stride_kc_s + offs_d[:, None] * stride_kc_d,
                mask=kv[None, :], other=0.0)
    v = tl.load(vc + slot[:, None] * stride_vc_s + offs_d[None, :] * stride_vc_d,
                mask=kv[:, None], other=0.0)
'''
NEW_USE = '''        k = tl.where(is_new[None, :], k_new[:, None], tl.where(scored[None, :], k, 0.0))
        v = tl.where(is_new[:, None], v_new[None, :], tl.where(attend[:, None], v, 0.0))
'''
OLD_USE = '''        k = tl.load(kc + slot[None, :] * stride_kc_s + offs_d[:, None] * stride_kc_d,
                    mask=scored[None, :], other=0.0)
        k = tl.where(is_new[None, :], k_new[:, None], k)
        v = tl.load(vc + slot[:, None] * stride_vc_s + offs_d[None, :] * stride_vc_d,
                    mask=attend[:, None], other=0.0)
        v = tl.where(is_new[:, None], v_new[None, :], v)
'''


def loads_after_flags(src: str) -> tuple[str, str]:
    """The module with the block body before 2026-11-27: K and V loaded inside the branch."""
    if src.count(NEW) != 1 or src.count(NEW_USE) != 1:
        raise SystemExit("the template's block body changed: update ab_dynamic_kv_loads.py")
    return src.replace(NEW, "").replace(NEW_USE, OLD_USE), "after flags"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--patterns", default="strided_block_local,block_local,openai_fixed,streaming_llm,sliding_window,"
                                          "openai_strided")
    ap.add_argument("--configs", default="MHA,GQA")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("ab_dynamic_kv_loads.py needs an NVIDIA GPU")
    dev = torch.device("cuda")
    configs = [c for c in CONFIGS if c[0] in args.configs.split(",")]
    print(f"# `python benchmarks/ab_dynamic_kv_loads.py` ({torch.cuda.get_device_name(dev)}, torch {torch.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n", flush=True)
    rows = dynamic_rows(args.patterns.split(","), configs, 40, args.rounds, dev, transform=loads_after_flags)
    print("\nDynamic step (+ H2O, budget 512), us (CUDA-graph replay): K/V loaded before the pool's flags (template) "
          "/ after them (before 2026-11-27)\n")
    print("| config | pattern | step | same state |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['cfg']} | {r['name']} | {r['us'][0]:.2f} / {r['us'][1]:.2f} | {r['same']} |")


if __name__ == "__main__":
    main()
