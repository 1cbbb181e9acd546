"""The Gluon prefill inside a real model: SmolLM2-135M-Instruct in bfloat16 on a Hopper GPU.

On compute capability 9.x the runtime's prefill runs the warp-specialized Gluon kernel wherever
its tiles are 128 rows (`TritonRuntime.wide_kernel`); SAS_GLUON=0 turns it off. This script
patches the model with each pattern (`sas_attention`, backend triton) and, at each context:
- counts the prefill calls that took the Gluon kernel (it must be all of them where the
  automatic tiles are 128 x 128: fully causal, sliding window, streaming-LLM);
- compares the logits of one window with the Gluon kernel and with SAS_GLUON=0 (max absolute
  difference, share of positions whose argmax token agrees);
- reports the perplexity over --tokens tokens of the evaluation text both ways, and the
  model's own dense attention (transformers' SDPA) beside them.

    SMOLLM2_DIR=... python benchmarks/check_gluon_model.py [--contexts 2048,8192] [--tokens 8192]
"""
from __future__ import annotations

import argparse
import collections
import copy
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sas import Causal, load_pattern  # noqa: E402
from sas.evaluation.perplexity import perplexity, windows_of  # noqa: E402
from sas.evaluation.text import corpus_tokens  # noqa: E402
from sas.integrations.transformers import sas_attention  # noqa: E402
from sas.models import load_model  # noqa: E402
from sas.runtime import static  # noqa: E402

PATTERNS = {"causal": lambda: Causal(), **{n: (lambda n=n: load_pattern(ROOT / "examples" / f"{n}.py"))
                                          for n in ("sliding_window", "streaming_llm", "block_local")}}

used: collections.Counter = collections.Counter()
_orig_prefill = static.TritonRuntime.prefill


def _counted_prefill(self, q, k, v, out=None):
    o = self.prefill_tiles(q, k, v)[0]
    gl = o.block_m == 128 and self.prefill_module(o).gluon_ok(q, k, v, o.block_m, o.block_n, out)
    used["gluon" if gl else "triton"] += 1
    return _orig_prefill(self, q, k, v, out)


static.TritonRuntime.prefill = _counted_prefill


def _logits(model, window):
    with torch.no_grad():
        return model(input_ids=window[None].cuda(), use_cache=False).logits[0].float()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--contexts", default="2048,8192")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--patterns", default=",".join(PATTERNS))
    args = ap.parse_args()
    model, tok = load_model("default", dtype=torch.bfloat16, device="cuda")
    props = torch.cuda.get_device_properties(0)
    print(f"# {props.name}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, torch {torch.__version__}, "
          f"SmolLM2-135M-Instruct bfloat16", flush=True)
    ids = corpus_tokens(tok, args.tokens)
    rows = []
    for ctx in map(int, args.contexts.split(",")):
        dense = perplexity(model, tok, ctx, tokens=args.tokens, ids=ids).perplexity
        window = windows_of(list(ids), ctx)[0]
        for name in args.patterns.split(","):
            patched = sas_attention(copy.deepcopy(model), PATTERNS[name](), backend="triton", max_len=ctx)
            res = {}
            for mode in ("gluon", "off"):
                if mode == "off":
                    os.environ["SAS_GLUON"] = "0"
                used.clear()
                logits = _logits(patched, window)
                ppl = perplexity(patched, tok, ctx, tokens=args.tokens, ids=ids).perplexity
                res[mode] = (logits, ppl, dict(used))
                os.environ.pop("SAS_GLUON", None)
            (lg, pg, ug), (lt, pt, ut) = res["gluon"], res["off"]
            diff = (lg - lt).abs().max().item()
            agree = (lg.argmax(-1) == lt.argmax(-1)).float().mean().item()
            rows.append((name, ctx, ug, ut, diff, agree, pg, pt, dense))
            print(f"{name:15s} {ctx:5d}: prefill calls {ug} / SAS_GLUON=0 {ut}; logits max |diff| {diff:.3f}, "
                  f"argmax agrees {agree:.4f}; perplexity {pg:.3f} / {pt:.3f} (dense SDPA {dense:.3f})", flush=True)
            if name != "block_local" and ug.get("triton"):
                print(f"  NOTE: {name} at {ctx} ran {ug['triton']} prefill calls on the Triton kernel", flush=True)
            del patched
            torch.cuda.empty_cache()
    print("\n| pattern | context | prefill calls (Gluon run) | logits max abs diff | argmax agrees | "
          "perplexity Gluon | SAS_GLUON=0 | dense (SDPA) |\n|---|---:|---|---:|---:|---:|---:|---:|")
    for name, ctx, ug, ut, diff, agree, pg, pt, dense in rows:
        calls = ", ".join(f"{v} {k}" for k, v in sorted(ug.items()))
        print(f"| {name} | {ctx} | {calls} | {diff:.3f} | {agree:.4f} | {pg:.3f} | {pt:.3f} | {dense:.3f} |")


if __name__ == "__main__":
    main()
