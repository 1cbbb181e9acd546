"""GPU diagnostic: SANTA prop (with and without an exact static part), replicates as query heads
in groups of G per KV head; z of the mean against exact attention, and each head's output
against sum c V / S of its own draws. H100, 2026-11-26, before the fix: G = 4 unbiased (max |z|
2.2 / 1.7), G = 16 and 64 biased (59 / 158; 6.0 off their own draws), flash at G = 64 unbiased
(2.7); after (the gather's `tl.dot`, docs/santa.md): |z| 2.2 and 1e-7 at every G (H200)."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from sas.methods.santa import SantaRandom, estimate  # noqa: E402
from sas.methods.santa_runtime import SantaOptions, santa_decode  # noqa: E402

from helpers.santa import replicate_problem  # noqa: E402


def run(G, reps, strategy, static_on, dev):
    pr = replicate_problem()
    q, k, v = pr.replicates(reps, G, dev)
    res = santa_decode(q, k, v, k.shape[2], SantaOptions(n=4, strategy=strategy, tile=16), SantaRandom(5),
                       mask=pr.mask.to(dev), static=pr.static if static_on else None, return_counts=True)
    est = res.out[0].cpu().double()
    se = (est.var(0) / reps).sqrt()
    z = ((est.mean(0) - pr.exact) / se).abs().max().item()
    c = res.counts[0].cpu()
    uniq = len({tuple(r.tolist()) for r in c})
    u = res.uniforms.flatten().cpu()
    own = float("nan")
    if strategy == "prop":
        own = (est - estimate(c[None].double(), v.cpu().double(), 4)[0]).abs().max().item()
    print(f"{dev} {strategy} G={G} static={static_on}: max|z| {z:.1f}; distinct count rows {uniq}/{reps}; "
          f"distinct uniforms {len(set(u.tolist()))}/{u.numel()}; counts sum {c.sum(-1).unique().tolist()}; "
          f"|out - estimate(own counts)| {own:.2e}")


if __name__ == "__main__":
    for static_on in (False, True):
        for G in (1, 4, 8, 16, 64):
            run(G, 2048, "prop", static_on, "cuda")
    run(64, 256, "flash", True, "cuda")
