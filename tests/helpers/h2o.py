"""The independent H2O reference: a step-by-step plain-Python implementation (floats, lists and
sets, one (batch, KV head) at a time) written from docs/dynamic.md, which the dynamic runtime
(sas.dynamic.h2o and the dynamic Triton kernels) is checked against."""

from __future__ import annotations

import math

import numpy as np
import torch


def region_last_use(region_mask_long: np.ndarray, n: int) -> list[float]:
    """Last row using each key in a mask computed far past n; inf when used up to the horizon."""
    horizon = region_mask_long.shape[0]
    out = []
    for j in range(n):
        rows = [i for i in range(horizon) if region_mask_long[i, j]]
        if not rows:
            out.append(-1)
        elif rows[-1] >= horizon - 8:      # still in use at the horizon: unbounded
            out.append(math.inf)
        else:
            out.append(rows[-1])
    return out


def plain_h2o(static_mask, region_mask, last_use, budget, refresh, q, k, v, prefill_len, reduce="sum"):
    """Step-by-step H2O with Python floats, lists and sets, one (batch, KV head) at a time."""
    B, Hq, N, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    scale = 1.0 / math.sqrt(D)
    Q, K, V = q.tolist(), k.tolist(), v.tolist()
    out = [[[[0.0] * D for _ in range(N)] for _ in range(Hq)] for _ in range(B)]
    steps = [(0, max(prefill_len, 1))] + [(i, i + 1) for i in range(max(prefill_len, 1), N)]
    held_log = [[[None] * Hkv for _ in range(B)] for _ in steps]
    attended = [[[set() for _ in range(N)] for _ in range(Hkv)] for _ in range(B)]
    for b in range(B):
        for h in range(Hkv):
            acc = {}
            entered, expired, evicted = set(), set(), set()
            for s_idx, (i0, i1) in enumerate(steps):
                for i in range(i0, i1):
                    for j in range(i1):
                        if region_mask[i][j] and j not in entered:
                            entered.add(j)
                held = entered - expired - evicted
                step_score = {}
                for i in range(i0, i1):
                    in_region = {j for j in held if region_mask[i][j]}
                    if refresh and i0 > 0:
                        loaded = set(sorted(in_region, key=lambda j: (acc.get(j, 0.0), j), reverse=True)[:budget])
                    else:
                        loaded = in_region
                    A = {j for j in range(i1) if static_mask[i][j]} | loaded
                    Z = A | in_region if refresh else A
                    attended[b][h][i] = A
                    for g in range(G):
                        hq = h * G + g
                        s = {j: sum(a * c for a, c in zip(Q[b][hq][i], K[b][h][j])) * scale for j in Z}
                        if not A:
                            continue
                        m = max(s[j] for j in A)
                        l = sum(math.exp(s[j] - m) for j in A)
                        p = {j: math.exp(s[j] - m) / l for j in Z}
                        out[b][hq][i] = [sum(p[j] * V[b][h][j][d] for j in A) for d in range(D)]
                        for j in Z:
                            if reduce == "sum":
                                step_score[j] = step_score.get(j, 0.0) + p[j]
                            else:
                                step_score[j] = max(step_score.get(j, 0.0), p[j])
                for j in range(i1):
                    if j not in evicted:
                        acc[j] = acc.get(j, 0.0) + step_score.get(j, 0.0)
                for j in list(entered - expired):
                    if last_use[j] < i1:
                        expired.add(j)
                if not refresh:
                    held = entered - expired - evicted
                    if len(held) > budget:
                        lowest_first = sorted(held, key=lambda j: (acc[j], j))
                        evicted.update(lowest_first[: len(held) - budget])
                held_log[s_idx][b][h] = tuple(sorted(entered - expired - evicted))
    return torch.tensor(out, dtype=torch.float64), held_log, attended


__all__ = ["plain_h2o", "region_last_use"]
