"""Quality of sas patterns on SmolLM2-135M-Instruct: the docs/models.md table (issue 10).

Dense attention, the six paper Table-1 patterns (examples/streaming_llm.py, block_local.py,
sliding_window.py, openai_strided.py, openai_fixed.py, strided_block_local.py) and a sliding
window + H2O pattern, at 2K and 8K context (8K is the model's trained context):

- perplexity over the first --tokens tokens of the Python documentation text
  (`pydoc_data.topics`, sas/evaluation/text.py), in windows of the context, next to dense:
  once through one forward per window (the pattern's prefill), and once with the last
  --decode-tokens tokens of each window through decode steps against the compact cache. The
  two agree for a static pattern; a Dynamic pattern's prefill attends its whole region
  (docs/dynamic.md), so only the decode column shows what H2O's eviction costs;
- passkey-retrieval accuracy: a seeded 5-digit key at depths 0, 0.25, 0.5, 0.75, 1 of filler
  text, --trials keys per depth, greedy (sas/evaluation/passkey.py);
- KV-cache bytes of all 30 layers at that context (static analysis; for window + H2O the
  run-time layout: static window + pool), next to a dense cache, at the model's dtype;
- a warning for a pattern that leaves queries without keys.

Runs on a GPU (backend triton) or on the CPU (the pure-torch executor; 8K is slow there).

    python benchmarks/quality_models.py --out benchmarks/results/quality          # .json and .md
    python benchmarks/quality_models.py --quick --out /tmp/quality                 # 2K only, 3 depths, 64 decode
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sas import Diag, Dynamic, load_pattern, ops  # noqa: E402
from sas.evaluation.report import EvalPattern, EvalReport, evaluate_patterns, fmt_bytes, fmt_ppl, fmt_ratio  # noqa: E402
from sas.models import SMOLLM2_NAME, load_model  # noqa: E402

TABLE1 = ("streaming_llm", "block_local", "sliding_window", "openai_strided", "openai_fixed", "strided_block_local")
#: sliding window of 512 plus H2O (budget 512, accumulated attention score, evicted keys gone)
#: over everything before it: the same cache size as the 1K sliding window (512 + 512 + 1).
WINDOW_H2O = Diag(0, 512) + Diag(512, None) * Dynamic(budget=512, score=ops.attn_score().sum(dim=1), refresh=False)


def patterns(names: list[str]) -> list[EvalPattern]:
    out = []
    for n in names:
        if n == "dense":
            out.append(EvalPattern("dense"))
        elif n == "window_h2o":
            out.append(EvalPattern("window_h2o", WINDOW_H2O))
        else:
            out.append(EvalPattern(n, load_pattern(ROOT / "examples" / f"{n}.py")))
    return out


def table(pre: EvalReport, dec: EvalReport | None) -> str:
    """One row per (pattern, context): both perplexities, KV bytes, passkey."""
    k = dec.settings["decode_tokens"] if dec is not None else None
    by_dec = {(r.pattern, r.context): r for r in dec.rows} if dec is not None else {}
    lines = [f"| pattern | context | perplexity | vs dense | decode-step perplexity (last {k}) | vs dense | KV cache | "
             f"dense KV cache | KV smaller by | passkey |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in pre.rows:
        d = by_dec.get((r.pattern, r.context))
        dp = "-" if d is None else ("error" if d.error else fmt_ppl(d.ppl))
        dr = "-" if d is None or d.error else fmt_ratio(d.ppl_ratio)
        pk = f"{sum(p.retrieved for p in r.passkey)}/{len(r.passkey)}" if r.passkey else "-"
        ppl = "error" if r.error else fmt_ppl(r.ppl)
        lines.append(f"| {r.pattern} | {r.context} | {ppl} | {'-' if r.error else fmt_ratio(r.ppl_ratio)} | {dp} | {dr} | "
                     f"{fmt_bytes(r.cache.compact)} | {fmt_bytes(r.cache.dense)} | {r.cache.ratio:.1f}x | {pk} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output path without suffix: writes OUT.json and OUT.md")
    ap.add_argument("--patterns", default=",".join(("dense",) + TABLE1 + ("window_h2o",)))
    ap.add_argument("--contexts", default="2048,8192")
    ap.add_argument("--tokens", type=int, default=8192, help="text tokens scored per context (>= every context)")
    ap.add_argument("--depths", default="0,0.25,0.5,0.75,1")
    ap.add_argument("--trials", type=int, default=2, help="passkeys per depth")
    ap.add_argument("--decode-tokens", type=int, default=256,
                    help="tokens per window scored through decode steps (0: skip the decode-step perplexity)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--backend", default="auto", choices=("auto", "torch", "triton"))
    ap.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct) or a model folder")
    ap.add_argument("--quick", action="store_true",
                    help="2K only, 2048 tokens, depths 0,0.5,1, one key each, 64 decode-step tokens")
    args = ap.parse_args(argv)
    if args.quick:
        args.contexts, args.tokens, args.depths, args.trials = "2048", 2048, "0,0.5,1", 1
        args.decode_tokens = min(args.decode_tokens, 64)
    contexts = [int(c) for c in args.contexts.split(",")]
    depths = [float(d) for d in args.depths.split(",") if d.strip()]
    names = [n.strip() for n in args.patterns.split(",") if n.strip()]
    unknown = [n for n in names if n not in ("dense", "window_h2o") + TABLE1]
    if unknown:
        ap.error(f"unknown pattern(s) {', '.join(unknown)}; valid: dense, {', '.join(TABLE1)}, window_h2o")
    evals = patterns(names)
    t0 = time.perf_counter()
    model, tok = load_model(args.model, dtype=args.dtype, device=args.device)
    print(f"loaded {args.model} in {time.perf_counter() - t0:.1f} s", flush=True)
    name = SMOLLM2_NAME if args.model == "default" else args.model
    rep = evaluate_patterns(model, tok, evals, contexts, tokens=args.tokens, depths=depths, trials=args.trials,
                            backend=args.backend, mode="prefill", model_name=name)
    dec = None
    if args.decode_tokens:
        dec = evaluate_patterns(model, tok, evals, contexts, tokens=args.tokens, depths=(), backend=args.backend,
                                mode="decode", decode_tokens=args.decode_tokens, model_name=name)
    wall = time.perf_counter() - t0
    data = rep.report()
    data["decode_mode"] = dec.report() if dec is not None else None
    data["meta"] = {"date": datetime.date.today().isoformat(),
                    "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
                    "wall_s": round(wall, 1),
                    "patterns": {p.name: repr(p.pattern) if p.pattern is not None else "dense" for p in evals}}
    s = rep.settings
    md = [f"Model: {rep.model}, {s['dtype']} on {data['meta']['device']}, sas backend {s['backend']}; "
          f"measured {data['meta']['date']} (torch {data['environment']['torch']}, transformers "
          f"{data['environment']['transformers']}, Python {data['environment']['python']}).",
          f"Perplexity: {s['tokens']} tokens of {rep.corpus['source']} (sha256 {rep.corpus['sha256'][:12]}), "
          f"windows of the context: one forward per window, and "
          + (f"the last {args.decode_tokens} tokens of each window through decode steps." if dec is not None
             else "no decode-step perplexity."),
          f"Passkey: depths {', '.join(f'{d:g}' for d in s['passkey_depths'])}, {s['passkey_trials']} key(s) each, "
          f"seed {s['seed']}, greedy.", "", table(rep, dec)]
    warnings = list(dict.fromkeys(rep.warnings + (dec.warnings if dec is not None else ())))
    if warnings:
        md += ["Warnings:", ""] + [f"- {w}" for w in warnings] + [""]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(data, indent=2))
    out.with_suffix(".md").write_text("\n".join(md))
    print("\n".join(md))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')} in {wall:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
