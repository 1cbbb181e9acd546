"""SmolLM2 perplexity with Saap (ops.partition) at a few probe counts, against dense attention
and the sink + window alone (probes = 0).

Saap's state is fitted (`sas.methods.saap_train.train_state`) on the first `--train-tokens`
tokens of the corpus and evaluated on the next `--tokens` tokens (disjoint text). Attention
runs through an exact PyTorch path registered with transformers' AttentionInterface, not the
decode kernel (the integration's SASCache does not carry the pre-RoPE vectors Saap classifies):
every query row i attends the sink, the window (i - W, i] and the region keys whose bucket is
among the top-`probes` of its own group score: the mask each token would get if it were
decoded, applied in one forward pass. Layer 0 stays dense (the paper). The NLL is scored on the
positions that have region keys (i >= sink + window), the fraction of region keys looked up is
reported per probe count.

    python benchmarks/quality_saap.py                 # GPU; JSON to $OUT/quality_saap.json
    python benchmarks/quality_saap.py --small         # CPU: 2 layers fitted, 384 tokens
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

from transformers import AttentionInterface  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface  # noqa: E402

from sas import Causal, Diag, Dynamic, Rect, ops  # noqa: E402
from sas.evaluation.text import corpus_tokens  # noqa: E402
from sas.methods.saap import assign, classifier_probs  # noqa: E402
from sas.methods.saap_train import train_state  # noqa: E402
from sas.models import load_model  # noqa: E402

NAME = "saap_eval"


class Ctx:
    """What the registered attention function reads: the state, the probes, the pre-RoPE
    vectors captured by hooks in the current forward pass, and statistics."""
    state = None
    probes: int | None = None      # None: dense; 0: sink + window only
    sink = 1
    window = 64
    pre: dict = {}
    looked: list = []


def saap_pattern(sink: int, window: int, probes: int):
    dense = (Rect(cols=(0, sink)) + Diag(0, window)) * Causal()
    return dense + (Causal() * ~dense) * Dynamic(
        budget=1, refresh=True, score=ops.partition(centroids="cent", classifier="qclf", probes=probes).sum(dim=1))


def no_mask(*args, **kwargs):
    return None


def saap_eval_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    li = module.layer_idx
    b, hq, n, d = query.shape
    hkv = key.shape[1]
    g = hq // hkv
    i = torch.arange(n, device=query.device)[:, None]
    j = torch.arange(n, device=query.device)[None, :]
    causal = j <= i
    if Ctx.probes is None or li not in Ctx.state.layers:
        allowed = causal[None, None].expand(b, hkv, n, n)
    else:
        static = causal & ((j < Ctx.sink) | (j > i - Ctx.window))
        region = causal & ~static
        if Ctx.probes == 0:
            hit = torch.zeros(b, hkv, n, n, dtype=torch.bool, device=query.device)
        else:
            layer = Ctx.state.layers[li]
            q_pre, k_pre = Ctx.pre[li]                                   # [B, Hq, N, D], [B, Hkv, N, D]
            probs = classifier_probs(q_pre.reshape(b, hkv, g * n, d), *layer.classifier)
            score = probs.reshape(b, hkv, g, n, -1).sum(2)               # [B, Hkv, N, C]: sum over the group
            top = torch.sort(score, dim=-1, descending=True, stable=True).indices[..., :Ctx.probes]
            mask = torch.zeros_like(score, dtype=torch.bool).scatter_(-1, top, True)
            bk = assign(k_pre, layer.centroids[None])                     # [B, Hkv, N]
            hit = mask.gather(3, bk[:, :, None, :].expand(b, hkv, n, n))
        sel = region & hit
        rows = region.sum(-1) > 0
        Ctx.looked.append((sel.sum((-1, -2)).float().sum() / max(1, int(region.sum()) * b * hkv)).item()
                          if bool(rows.any()) else math.nan)
        allowed = static[None, None] | sel
    out = F.scaled_dot_product_attention(query, key.repeat_interleave(g, 1), value.repeat_interleave(g, 1),
                                         attn_mask=allowed.repeat_interleave(g, 1), scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def add_hooks(model, layers):
    cfg = model.config
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // hq
    hooks = []
    for li in layers:
        att = model.model.layers[li].self_attn
        store = {}

        def hq_hook(_m, _i, out, li=li, store=store):
            b, n, _ = out.shape
            store["q"] = out.view(b, n, hq, d).transpose(1, 2)

        def hk_hook(_m, _i, out, li=li, store=store):
            b, n, _ = out.shape
            Ctx.pre[li] = (store["q"], out.view(b, n, hkv, d).transpose(1, 2))

        hooks.append(att.q_proj.register_forward_hook(hq_hook))
        hooks.append(att.k_proj.register_forward_hook(hk_hook))
    return hooks


def nll(model, ids, start):
    with torch.no_grad():
        logits = model(ids).logits.float()
    lp = F.log_softmax(logits[0, start:-1], -1)
    tgt = ids[0, start + 1:]
    return float(-lp.gather(1, tgt[:, None]).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--tokens", type=int, default=None)
    ap.add_argument("--train-tokens", type=int, default=None)
    ap.add_argument("--window", type=int, default=None)
    ap.add_argument("--clusters", type=int, default=None)
    ap.add_argument("--probes", default=None, help="comma list")
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    small = args.small or dev.type != "cuda"
    tokens = args.tokens or (384 if small else 2048)
    train_tokens = args.train_tokens or (384 if small else 4096)
    window = args.window or (64 if small else 256)
    clusters = args.clusters or (16 if small else 64)
    probes_list = [int(x) for x in (args.probes or ("1,4" if small else "1,2,4,8,16")).split(",")]
    t0 = time.time()
    model, tok = load_model("default", dtype=torch.float32, device=dev)
    n_layers = model.config.num_hidden_layers
    layers = [1, 2] if small else list(range(1, n_layers))
    ids_all = corpus_tokens(tok, train_tokens + tokens)
    train_ids = torch.tensor([ids_all[:train_tokens]], device=dev)
    eval_ids = torch.tensor([ids_all[train_tokens:]], device=dev)
    pattern = saap_pattern(1, window, max(probes_list))
    t1 = time.time()
    Ctx.state = train_state(model, train_ids, pattern, "SmolLM2-135M-Instruct", clusters=clusters, layers=layers,
                            hidden=128 if small else 256, steps=100 if small else 300, seed=0)
    train_s = time.time() - t1
    Ctx.window, Ctx.sink = window, 1
    AttentionInterface.register(NAME, saap_eval_attention)
    AttentionMaskInterface.register(NAME, no_mask)
    start = 1 + window
    dense_ref = nll(model, eval_ids, start)           # the model's own attention (as loaded)
    model.set_attn_implementation(NAME)
    hooks = add_hooks(model, layers)
    rows = []
    try:
        for probes in [None, 0] + probes_list:
            Ctx.probes, Ctx.looked = probes, []
            v = nll(model, eval_ids, start)
            looked = [x for x in Ctx.looked if not math.isnan(x)]
            rows.append({"probes": probes if probes is not None else "dense", "nll": v, "perplexity": math.exp(v),
                         "fraction_region_looked_up": (sum(looked) / len(looked)) if looked else None})
            print(rows[-1])
    finally:
        for h in hooks:
            h.remove()
    report = {"model": "SmolLM2-135M-Instruct", "device": str(dev), "tokens": tokens, "train_tokens": train_tokens,
              "window": window, "sink": 1, "clusters": clusters, "layers_indexed": layers, "train_seconds": train_s,
              "dense_model_attention_nll": dense_ref, "rows": rows, "seconds": time.time() - t0,
              "path": "exact PyTorch masks inside transformers attention (not the decode kernel)"}
    if abs(rows[0]["nll"] - dense_ref) > 1e-3:
        raise SystemExit(f"the dense row of the Saap attention path ({rows[0]['nll']}) differs from the model's own "
                         f"attention ({dense_ref})")
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "quality_saap.json").write_text(json.dumps(report, indent=1))
    print(f"\nSmolLM2 perplexity, {tokens} tokens scored from position {start}, window {window}, C={clusters}")
    print("probes | perplexity | region keys looked up")
    for r in rows:
        f = r["fraction_region_looked_up"]
        print(f"{r['probes']} | {r['perplexity']:.3f} | {'-' if f is None else f'{f:.3f}'}")


if __name__ == "__main__":
    main()
