"""SmolLM2 accuracy of SANTA (`.sample(...)`) at S in {32, 128, 512} against dense attention
and against H2O with the same number of keys.

1. Perplexity (teacher forced, one forward per configuration): attention runs through a
   PyTorch function registered with transformers' AttentionInterface. Rows before `--prompt`
   are the prompt (exact attention, as the dense prefill); every later row i is what a decode
   query at position i computes:
   - SANTA: S2ANTA-sys over its whole causal row, one fresh uniform per (row, head)
     (`sas.methods.santa.sample_counts`, the estimator of the prop kernel with
     alloc='global_sys': systematic draws over every key in order, S per query head);
   - H2O for `Diag(0, S/2) + Diag(S/2, None) * Dynamic(budget=S/2, attn_score().sum(dim=1))`:
     S/2 recent keys plus S/2 heavy hitters (the H2O paper's split), prompt prefilled, then cut;
     `h2o_fast`, the docs/dynamic.md section 4 policy specialised to this pattern, checked at
     start against `sas.dynamic.dynamic_attention_reference` (the generic float64 spec, too slow
     for 30 layers x 512 steps on a CPU);
   NLL is scored on the positions >= prompt.
2. Passkey retrieval (`sas.evaluation.passkey`) through the real integration
   (`sas_attention(model, pattern, backend="triton")`: SASCache, each layer's own stateful
   `SASAttnKernel`), SANTA on the prop kernel and H2O on its Triton runtime, TRITON_INTERPRET=1
   on the CPU: the prompt is prefilled exactly, the answer tokens are decoded.

    python benchmarks/quality_santa.py            # JSON to $OUT/quality_santa.json when OUT is set
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

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transformers import AttentionInterface  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface  # noqa: E402

from sas import Causal, Diag, Dynamic, ops  # noqa: E402
from sas.dynamic import dynamic_attention_reference  # noqa: E402
from sas.evaluation.passkey import accuracy, run_passkey  # noqa: E402
from sas.evaluation.text import corpus_tokens  # noqa: E402
from sas.integrations.transformers import sas_attention  # noqa: E402
from sas.methods.santa import sample_counts, uniforms_shape  # noqa: E402
from sas.models import load_model  # noqa: E402

NAME = "santa_eval"


class Ctx:
    mode = "dense"
    n = 128
    method = "systematic"
    prompt = 64
    gen: torch.Generator | None = None
    history: dict = {}


def h2o_pattern(n: int):
    w = max(1, n // 2)
    return Diag(0, w) + Diag(w, None) * Dynamic(budget=n - w, score=ops.attn_score().sum(dim=1))


def santa_pattern(n: int, strategy: str = "prop"):
    return Causal() * Dynamic(budget=n, score=ops.attn_score().sample(n=n, strategy=strategy), refresh=True)


def h2o_fast(q, k, v, n, prompt, scale):
    """H2O for h2o_pattern(n) (window w = n/2 plus n - w heavy hitters), the policy of
    docs/dynamic.md section 4 step by step in float64, specialised to this pattern (checked
    against `dynamic_attention_reference` by `check_h2o_fast`): prefill exact over the causal
    rows < prompt, accumulate attention per key (summed over the group and queries), cut the
    candidates (keys outside the window) to the budget; then per decode query: the key leaving
    the window becomes a candidate, attend window + held, accumulate, evict the lowest score
    (ties: the older key)."""
    b, hq, N, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    w, budget = max(1, n // 2), n - max(1, n // 2)
    s_all = torch.einsum("bhgid,bhjd->bhgij", q.double().reshape(b, hkv, g, N, d), k.double()) * scale
    vv = v.double()
    out = torch.zeros(b, hkv, g, N, d, dtype=torch.float64)
    causal = torch.ones(N, N, dtype=torch.bool).tril()
    P = max(1, min(prompt, N))
    p = torch.softmax(s_all[:, :, :, :P, :P].masked_fill(~causal[:P, :P], float("-inf")), -1)
    out[:, :, :, :P] = p @ vv[:, :, None, :P]
    acc = torch.zeros(b, hkv, N, dtype=torch.float64)
    acc[:, :, :P] = p.sum((2, 3))
    held = torch.zeros(b, hkv, N, dtype=torch.bool)
    held[:, :, :max(0, P - w)] = True

    def evict():
        while True:
            over = held.sum(-1) > budget
            if not bool(over.any()):
                return
            score = torch.where(held, acc, torch.full_like(acc, float("inf")))
            j = score.argmin(-1)                     # the first minimum: the older key
            held.scatter_(-1, j[..., None], ~over[..., None] & held.gather(-1, j[..., None]))

    evict()
    for i in range(P, N):
        if i - w >= 0:
            held[:, :, i - w] = True
        att = held[:, :, :i + 1].clone()
        att[:, :, max(0, i - w + 1):] = True
        p = torch.softmax(s_all[:, :, :, i, :i + 1].masked_fill(~att[:, :, None], float("-inf")), -1)
        out[:, :, :, i] = (p[..., None] * vv[:, :, None, :i + 1]).sum(-2)
        acc[:, :, :i + 1] += p.sum(2)
        evict()
    return out.reshape(b, hq, N, d)


def check_h2o_fast() -> float:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 48, 8, generator=g, dtype=torch.float64) for h in (4, 2, 2))
    err = 0.0
    for n in (4, 8, 9):
        ref = dynamic_attention_reference(h2o_pattern(n), q, k, v, prefill_len=12).out
        err = max(err, float((h2o_fast(q, k, v, n, 12, 8 ** -0.5) - ref).abs().max()))
    if err > 1e-9:
        raise SystemExit(f"h2o_fast differs from dynamic_attention_reference by {err}")
    return err


def no_mask(*args, **kwargs):
    return None


def eval_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    b, hq, n, d = query.shape
    hkv = key.shape[1]
    g = hq // hkv
    kk, vv = key.repeat_interleave(g, 1), value.repeat_interleave(g, 1)
    if Ctx.mode == "dense":
        out = F.scaled_dot_product_attention(query, kk, vv, is_causal=True, scale=scaling)
    elif Ctx.mode == "santa":
        scale = d ** -0.5 if scaling is None else scaling
        s = (query.double() @ kk.double().transpose(-1, -2)) * scale
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        p = torch.softmax(s, -1)
        out = p @ vv.double()
        rows = p[:, :, Ctx.prompt:]                                   # decode queries
        u = torch.rand(uniforms_shape(Ctx.method, tuple(rows.shape[:-1]), Ctx.n), generator=Ctx.gen)
        c = sample_counts(rows, Ctx.n, Ctx.method, u)
        out[:, :, Ctx.prompt:] = c.double() @ vv.double() / Ctx.n
        out = out.to(query.dtype)
    elif Ctx.mode == "h2o":
        scale = d ** -0.5 if scaling is None else scaling
        out = h2o_fast(query, key, value, Ctx.n, Ctx.prompt, scale).to(query.dtype)
    else:   # "h2o_generate": decode steps of generate(); the policy replayed over the queries so far
        li = module.layer_idx
        if query.shape[2] == key.shape[2]:          # the prompt: dense prefill, then the cut
            Ctx.history[li] = (query, query.shape[2])
        else:
            Ctx.history[li] = (torch.cat([Ctx.history[li][0], query], 2), Ctx.history[li][1])
        qs, p_len = Ctx.history[li]
        scale = d ** -0.5 if scaling is None else scaling
        out = h2o_fast(qs, key, value, Ctx.n, p_len, scale)[:, :, -query.shape[2]:].to(query.dtype)
    return out.transpose(1, 2).contiguous(), None


def nll(model, ids, start):
    with torch.no_grad():
        logits = model(ids).logits.float()
    lp = F.log_softmax(logits[0, start:-1], -1)
    return float(-lp.gather(1, ids[0, start + 1:, None]).mean())


def perplexities(model, ids, sizes, methods, seed):
    rows = []
    for mode, n, method in [("dense", None, None)] + [("santa", s, m) for s in sizes for m in methods] + \
                           [("h2o", s, None) for s in sizes]:
        t = time.time()
        Ctx.mode, Ctx.n, Ctx.method = mode, n or 0, method or ""
        Ctx.gen = torch.Generator().manual_seed(seed)
        v = nll(model, ids, Ctx.prompt)
        rows.append({"mode": mode, "S": n, "method": method, "nll": v, "perplexity": math.exp(v),
                     "seconds": time.time() - t})
        print(rows[-1], flush=True)
    return rows


def passkeys(tok, context, depths, sizes, max_len, which, strategy="prop", dense=True):
    """SANTA through sas_attention (prop kernel); H2O replayed by `h2o_fast` inside
    generate() (the H2O Triton runtime under the CPU interpreter is too slow for 1K prompts)."""
    rows = []
    for label, make in [("dense", None)] * dense + [(f"{w}", s) for s in sizes for w in which]:
        t = time.time()
        model, _ = load_model("default", dtype=torch.float32)
        if label == "santa":
            sas_attention(model, santa_pattern(make, strategy), backend="triton", max_len=max_len)
        elif label == "h2o":
            Ctx.mode, Ctx.n, Ctx.history = "h2o_generate", make, {}
            model.set_attn_implementation(NAME)
        res = run_passkey(model, tok, context, depths, max_new_tokens=8, batch_size=1)
        rows.append({"mode": label, "S": make, "context": context, "strategy": strategy if label == "santa" else None, "accuracy": accuracy(res),
                     "answers": [r.answer for r in res], "seconds": time.time() - t})
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--sizes", default="32,128,512")
    ap.add_argument("--methods", default="systematic,multinomial")
    ap.add_argument("--passkey-context", type=int, default=1024)
    ap.add_argument("--depths", default="0.1,0.5,0.9")
    ap.add_argument("--passkey", default="santa,h2o", help="methods for the passkey part ('' to skip)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-perplexity", action="store_true")
    ap.add_argument("--santa-strategy", default="prop", help="SANTA kernel in the passkey part (prop, flash, torch)")
    ap.add_argument("--no-dense-passkey", action="store_true")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    t0 = time.time()
    h2o_check = check_h2o_fast()
    sizes = [int(x) for x in args.sizes.split(",")]
    model, tok = load_model("default", dtype=torch.float32)
    ids = torch.tensor([corpus_tokens(tok, args.tokens)])
    Ctx.prompt = args.prompt
    AttentionInterface.register(NAME, eval_attention)
    AttentionMaskInterface.register(NAME, no_mask)
    own = nll(model, ids, args.prompt)
    model.set_attn_implementation(NAME)
    report = {"model": "SmolLM2-135M-Instruct", "device": "cpu", "tokens": args.tokens, "prompt": args.prompt,
              "date": time.strftime("%Y-%m-%d", time.gmtime()), "model_attention_nll": own,
              "h2o_fast_vs_reference_max_abs": h2o_check,
              "perplexity": [] if args.skip_perplexity else
              perplexities(model, ids, sizes, args.methods.split(","), args.seed)}
    if report["perplexity"] and abs(report["perplexity"][0]["nll"] - own) > 1e-3:
        raise SystemExit(f"the dense row ({report['perplexity'][0]['nll']}) differs from the model's own attention "
                         f"({own})")
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "quality_santa.json").write_text(json.dumps(report, indent=1))
    which = [x for x in args.passkey.split(",") if x]
    if which:
        depths = [float(x) for x in args.depths.split(",")]
        report["passkey"] = passkeys(tok, args.passkey_context, depths, sizes, args.passkey_context + 64, which,
                                     args.santa_strategy, not args.no_dense_passkey)
    report["seconds"] = time.time() - t0
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "quality_santa.json").write_text(json.dumps(report, indent=1))
    print(f"\nSmolLM2 perplexity, {args.tokens} tokens, decode rows from {args.prompt}")
    print("| mode | S | sampler | perplexity |\n|---|---|---|---|")
    for r in report["perplexity"]:
        print(f"| {r['mode']} | {r['S'] or '-'} | {r['method'] or '-'} | {r['perplexity']:.3f} |")
    for r in report.get("passkey", []):
        print(f"passkey {r['mode']} S={r['S']}: {r['accuracy']:.2f} ({r['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
