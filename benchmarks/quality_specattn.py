"""SmolLM2 perplexity with SpecAttn (top-p of a draft's attention) against dense attention, on the
CPU: the paper's protocol (Tab. 1) at a small size: the first 10% of the text is the prompt
(dense), the rest is decoded teacher-forced in blocks of γ tokens; target layers 0 and 1 stay
dense (§4.1); chunks of 16 keys; p in {0.95, 0.99}.

Drafts:
- **own**: the target's own attention (layer j reads its own rows; the upper bound);
- **subset**: SmolLM2 with every 3rd decoder layer (0, 3, ..., 27) plus its embeddings, final
  norm and head; target layers are mapped to draft layers by `sas.methods.specattn_align`
  (monotone min-KL), aligned on a disjoint piece of the text;
- **subset-position**: the same draft with target layer j mapped to draft layer j // every (the
  draft layer made of target layer every * (j // every)): a fixed map, for comparison.

The selection runs on the exact-mask path of `sas.integrations.specattn_draft` (the same
selection as the SpecAttnRuntime kernels; tests/test_specattn.py checks the two paths agree).
Reported per configuration: perplexity on the decoded tokens, its change against dense, the
fraction of KV rows the visited 16-key chunks skip (what the kernel does not load) and of keys
not attended, over the sparse layers and decode steps.

    python benchmarks/quality_specattn.py            # JSON + markdown to $OUT if set
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sas.evaluation.text import corpus_tokens  # noqa: E402
from sas.integrations.specattn_draft import masked_logits, specattn_masks  # noqa: E402
from sas.methods.specattn_align import (attention_maps, draft_name, layer_subset_model, load_alignment,  # noqa: E402
                                        make_alignment)
from sas.models import load_model  # noqa: E402


def nll(logits: torch.Tensor, ids: torch.Tensor, start: int) -> float:
    lp = F.log_softmax(logits[0, start - 1:-1].float(), -1)
    return float(-lp.gather(1, ids[0, start:, None]).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--ps", default="0.95,0.99")
    ap.add_argument("--gammas", default="1,4")
    ap.add_argument("--every", type=int, default=3)
    ap.add_argument("--drafts", default="own,subset,subset-position")
    ap.add_argument("--sink", type=int, default=0, help="keys [0, sink) always attended (static part)")
    args = ap.parse_args()
    t0 = time.time()
    model, tok = load_model("default", dtype=torch.float32, device="cpu")
    cfg = model.config
    n_layers, hq, hkv = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads
    n = args.tokens
    all_ids = corpus_tokens(tok, 2 * n)
    align_ids = torch.tensor([all_ids[n:2 * n]])           # disjoint text for the alignment
    ids = torch.tensor([all_ids[:n]])
    prompt = n // 10
    sparse = list(range(2, n_layers))
    dense_logits = masked_logits(model, ids, {})
    dense = math.exp(nll(dense_logits, ids, prompt))
    print(f"dense ppl {dense:.4f} ({n} tokens, prompt {prompt})", flush=True)

    layers = tuple(range(0, n_layers, args.every))
    sub = layer_subset_model(model, layers)
    al = make_alignment(attention_maps(sub, align_ids), attention_maps(model, align_ids), "SmolLM2-135M-Instruct",
                        draft_name(layers))
    out_dir = os.environ.get("OUT")
    path = Path(out_dir or "/tmp") / "specattn_align_smollm2.json"
    al.save(path)
    al = load_alignment(path, "SmolLM2-135M-Instruct", draft_name(layers), num_layers=n_layers)
    print(f"alignment ({al.draft}): {list(al.mapping)}", flush=True)
    want = args.drafts.split(",")
    sub_maps = attention_maps(sub, ids)
    drafts = {}
    if "own" in want:
        drafts["own"] = (attention_maps(model, ids), tuple(range(n_layers)))
    if "subset" in want:
        drafts[f"subset every {args.every}, KL map"] = (sub_maps, al.mapping)
    if "subset-position" in want:
        drafts[f"subset every {args.every}, j // {args.every}"] = (sub_maps, tuple(j // args.every
                                                                                 for j in range(n_layers)))
    rows = []
    for name, (maps, mapping) in drafts.items():
        for p in [float(x) for x in args.ps.split(",")]:
            for gamma in [int(x) for x in args.gammas.split(",")]:
                t = time.time()
                masks, stats = specattn_masks(maps, mapping, sparse, hq, hkv, p=p, prefill_len=prompt, gamma=gamma,
                                              chunk=16, sink=args.sink)
                ppl = math.exp(nll(masked_logits(model, ids, masks), ids, prompt))
                label = name + (f" + sink {args.sink}" if args.sink else "")
                row = dict(draft=label, p=p, gamma=gamma, ppl=ppl, rel=ppl / dense - 1, **stats)
                rows.append(row)
                print(f"{name:18s} p={p:.2f} gamma={gamma}: ppl {ppl:.4f} ({row['rel']:+.2%}), KV loads skipped "
                      f"{stats['loads_skipped']:.1%}, keys not attended {stats['keys_skipped']:.1%} "
                      f"[{time.time() - t:.0f} s]", flush=True)
    lines = ["| draft | p | γ | ppl | vs dense | KV loads skipped (16-key chunks) | keys not attended |",
             "|---|---|---|---|---|---|---|", f"| dense | - | - | {dense:.3f} | - | - | - |"]
    for r in rows:
        lines.append(f"| {r['draft']} | {r['p']} | {r['gamma']} | {r['ppl']:.3f} | {r['rel']:+.2%} | "
                     f"{r['loads_skipped']:.1%} | {r['keys_skipped']:.1%} |")
    table = "\n".join(lines)
    res = dict(model="SmolLM2-135M-Instruct", tokens=n, prompt=prompt, dense_ppl=dense, sparse_layers=sparse,
               alignment=list(al.mapping), draft_layers=list(layers), rows=rows, seconds=time.time() - t0,
               torch=torch.__version__)
    if out_dir:
        Path(out_dir, "quality_specattn.json").write_text(json.dumps(res, indent=1))
        Path(out_dir, "quality_specattn.md").write_text(table + "\n")
    print("\n" + table)


if __name__ == "__main__":
    main()
