"""GPU check of SANTA with an exact static part (issue 12): the composed decode
`S + (Causal() * ~S) * Dynamic(sample)` with S = (Rect(cols=(0, 4)) + Diag(0, 64)) * Causal()
(exact sinks + window, sampled rest) at a model-like shape (B=1, 32 query / 8 KV heads, D 128,
bf16, 32K keys, S=128 draws), prop and flash, against the float64 `composed_reference` of the
kernels' own draws (`last_counts`); plus `santa_decode(static=...)` at batch 2 with a large
random static set (several static splits) and a step whose keys are all static (exact
attention). Prints the max errors and one PASS / FAIL line (exit status 1 on FAIL). No timing.

    python benchmarks/check_santa_static.py [--context 32768] [--n 128] [--steps 3]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import numpy as np
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sas import Causal, Diag, Dynamic, Rect, ops  # noqa: E402
from sas.methods.santa import SantaRandom, composed_reference, flash_tile_samples  # noqa: E402
from sas.methods.santa_runtime import SantaOptions, santa_decode  # noqa: E402
from sas.runtime.kernel import SASAttnKernel  # noqa: E402


def kernel_steps(strategy: str, context: int, n: int, steps: int, hq: int, hkv: int, d: int, dev: str,
                 tol: float) -> tuple[float, list[str]]:
    """Prefill context - steps tokens, decode `steps`; max |out - reference| and the failures."""
    static = (Rect(cols=(0, 4)) + Diag(0, 64)) * Causal()
    pat = static + (Causal() * ~static) * Dynamic(budget=n, refresh=True,
                                                  score=ops.attn_score().sample(n=n, strategy=strategy))
    ker = SASAttnKernel(pat, max_len=context)
    ker.dynamic.keep_counts = True
    tile = ker.dynamic.options.block_n
    g = torch.Generator().manual_seed(1)
    q = (torch.randn(1, hq, context, d, generator=g) * 1.5).bfloat16().to(dev)
    k = torch.randn(1, hkv, context, d, generator=g).bfloat16().to(dev)
    v = torch.randn(1, hkv, context, d, generator=g).bfloat16().to(dev)
    prompt = context - steps
    ker.prefill(q[:, :, :prompt], k[:, :, :prompt], v[:, :, :prompt])
    worst, bad = 0.0, []
    for i in range(prompt, context):
        out = ker.decode(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1])[:, :, 0]
        dec = ker.dynamic.decoder
        c = ker.dynamic.last_counts
        nk = c.shape[-1]
        pos = dec.slot_pos[:nk]
        held = pos >= 0
        st_np = held & np.asarray(static.evaluate(np.full(nk, i), np.maximum(pos, 0)), dtype=bool)
        st = torch.from_numpy(st_np).to(dev)
        region = torch.from_numpy(held & (pos <= i)).to(dev) & ~st
        if int(st.sum()) != 4 + 64:
            bad.append(f"{strategy} step {i}: {int(st.sum())} static slots, expected 68")
        if (c[..., ~region] != 0).any():
            bad.append(f"{strategy} step {i}: draws on static or unattended slots")
        t = math.ceil(nk / tile)
        live_tiles = int(torch.zeros(t, device=dev).index_add_(0, torch.arange(nk, device=dev) // tile,
                                                               region.float()).gt(0).sum())
        want = n if strategy == "prop" else live_tiles * flash_tile_samples(n, t)   # flash: tiles with sampled keys
        if not (c.sum(-1) == want).all():
            bad.append(f"{strategy} step {i}: draws per head {sorted(set(c.sum(-1).flatten().tolist()))}, "
                       f"expected {want}")
        ref = composed_reference(q[:, :, i], dec.k[:, :, :nk], dec.v[:, :, :nk], c, n, st, region,
                                 strategy=strategy, tile=tile)
        err = float((out.double() - ref).abs().max())
        worst = max(worst, err)
        if not err <= tol:
            bad.append(f"{strategy} step {i}: max error {err:.3e} > {tol}")
    return worst, bad


def direct_steps(strategy: str, context: int, n: int, hq: int, hkv: int, d: int, dev: str,
                 tol: float) -> tuple[float, list[str]]:
    """santa_decode at batch 2 with min(4096, context / 4) random static slots (several splits),
    then a step whose keys are all static."""
    g = torch.Generator().manual_seed(2)
    q = (torch.randn(2, hq, d, generator=g) * 1.5).bfloat16().to(dev)
    k = torch.randn(2, hkv, context, d, generator=g).bfloat16().to(dev)
    v = torch.randn(2, hkv, context, d, generator=g).bfloat16().to(dev)
    mask = torch.rand(context, generator=g) > 0.1
    static = torch.zeros(context, dtype=torch.bool)
    static[torch.randperm(context, generator=g)[:min(4096, context // 4)]] = True
    opts = SantaOptions(n=n, strategy=strategy)
    res = santa_decode(q, k, v, context, opts, SantaRandom(3), mask=mask.to(dev), static=static, return_counts=True)
    st, region = (static & mask).to(dev), (mask & ~static).to(dev)
    ref = composed_reference(q, k, v, res.counts, n, st, region, strategy=strategy, tile=opts.block_n)
    err = float((res.out.double() - ref).abs().max())
    bad = [] if err <= tol else [f"{strategy} santa_decode(static=...): max error {err:.3e} > {tol}"]
    if (res.counts[..., ~region] != 0).any():
        bad.append(f"{strategy} santa_decode(static=...): draws outside the region")
    allst = santa_decode(q, k, v, context, opts, SantaRandom(3), mask=mask.to(dev), static=mask.clone())
    exact = torch.nn.functional.scaled_dot_product_attention(
        q[:, :, None].float(), k.float(), v.float(), attn_mask=mask[None].to(dev), enable_gqa=True)[:, :, 0]
    e2 = float((allst.out.float() - exact).abs().max())
    if not e2 <= tol:
        bad.append(f"{strategy} all-static step: max error {e2:.3e} vs exact attention > {tol}")
    return max(err, e2), bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--strategies", default="prop,flash")
    ap.add_argument("--tol", type=float, default=1e-2, help="max abs error vs the float64 reference (bf16 output)")
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    hq, hkv, d = 32, 8, 128
    print(f"device: {torch.cuda.get_device_name() if dev == 'cuda' else 'cpu (Triton interpreter)'}; "
          f"B=1, {hq} q / {hkv} kv heads, D {d}, bf16, {args.context} keys, S={args.n}")
    failures: list[str] = []
    for strategy in args.strategies.split(","):
        e1, b1 = kernel_steps(strategy, args.context, args.n, args.steps, hq, hkv, d, dev, args.tol)
        e2, b2 = direct_steps(strategy, args.context, args.n, hq, hkv, d, dev, args.tol)
        print(f"{strategy}: SASAttnKernel decode max error {e1:.3e}; santa_decode(static=...) / all-static "
              f"max error {e2:.3e}")
        failures += b1 + b2
    for f in failures:
        print("  " + f)
    print("PASS" if not failures else f"FAIL ({len(failures)} problems)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
