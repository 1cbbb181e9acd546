"""Saap fused route kernel: everything a decode step does before attention, in one launch.

Grid (B * Hkv, T), T = cdiv(C, BLOCK_C): program (bh, t) handles the bucket slice
[t * BLOCK_C, (t + 1) * BLOCK_C) of the KV head bh:

1. the folded query classifier for the G query heads of the group, logits of its slice
   (`relu(q w1 + b1) w2 + b2`, float32, plain FMA reductions: no TF32), stored to a scratch row;
2. the squared L2 distance of the new key (its index vector) to the slice's centroids,
   `|x|^2 - 2 x.c + |c|^2` exactly as `sas.methods.saap.assign` writes it, to a scratch row;
3. program t == 0 writes the new key and value into the cache at position POS.

Each program then bumps a per-(bh) arrival counter (release/acquire); the last program of the
row to arrive (the counter reaches T) finishes the step for the row and resets the counter for
the next step: softmax of the logits per query row, the SUM over the group's rows (the spec's
group score), the top-P buckets by score, ties to the lower bucket index (P rounds of a max over
the packed key `score_bits << 32 | (C - 1 - c)`: scores are >= 0, so their IEEE bits order like
the scores and the low word breaks ties towards lower c, the order of the torch path's stable
descending sort), the probed ids, the probed mask (every key >= the P-th key), and the new
key's bucket (argmin of the distances, ties to the lower index) into BUCKET_OF at POS.

All scalars and buffers are fixed per step: the launch is graph-capturable with no host sync.
Host side: `sas.methods.saap_runtime.SaapDecoder` (route="fused").
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def saap_route_kernel(Q, KIDX, KNEW, VNEW, K, V, BUCKET_OF,
                      CENT, CNORM, W1, B1, W2, B2,
                      LOGITS, DIST, COUNTER, PROBED, PROBED_MASK,
                      POS, N_CAP, HKV, G, D, H, C, P, T,
                      BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr,
                      BLOCK_C: tl.constexpr, BLOCK_CA: tl.constexpr, BLOCK_DC: tl.constexpr,
                      LIBDEVICE_EXP: tl.constexpr):
    bh = tl.program_id(0)
    t = tl.program_id(1)
    kvh = bh % HKV
    rows = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < G
    dim_ok = dims < D
    cols = t * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < C

    # 1. classifier logits of this slice: [BLOCK_G, BLOCK_C]
    q = tl.load(Q + (bh * G + rows[:, None]) * D + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_C], tl.float32)
    for h0 in range(0, H, BLOCK_H):
        hs = h0 + tl.arange(0, BLOCK_H)
        h_ok = hs < H
        w1 = tl.load(W1 + (kvh * D + dims[:, None]) * H + hs[None, :],
                     mask=dim_ok[:, None] & h_ok[None, :], other=0.0)
        hid = tl.sum(q[:, :, None] * w1[None, :, :], axis=1)
        hid = hid + tl.load(B1 + kvh * H + hs, mask=h_ok, other=0.0)[None, :]
        hid = tl.maximum(hid, 0.0)
        w2 = tl.load(W2 + (kvh * H + hs[:, None]) * C + cols[None, :],
                     mask=h_ok[:, None] & col_ok[None, :], other=0.0)
        acc += tl.sum(hid[:, :, None] * w2[None, :, :], axis=1)
    logits = acc + tl.load(B2 + kvh * C + cols, mask=col_ok, other=0.0)[None, :]
    tl.store(LOGITS + (bh * BLOCK_G + rows[:, None]) * C + cols[None, :], logits,
             mask=row_ok[:, None] & col_ok[None, :])

    # 2. distances of the new key's index vector to this slice's centroids
    xdot = tl.zeros([BLOCK_C], tl.float32)
    xx = tl.zeros([BLOCK_DC], tl.float32)
    for d0 in range(0, D, BLOCK_DC):
        ds = d0 + tl.arange(0, BLOCK_DC)
        d_ok = ds < D
        x = tl.load(KIDX + bh * D + ds, mask=d_ok, other=0.0).to(tl.float32)
        cent = tl.load(CENT + (kvh * C + cols[:, None]) * D + ds[None, :],
                       mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        xdot += tl.sum(cent * x[None, :], axis=1)
        xx += x * x
    dist = tl.sum(xx, axis=0) - 2.0 * xdot + tl.load(CNORM + kvh * C + cols, mask=col_ok, other=0.0)
    tl.store(DIST + bh * C + cols, dist, mask=col_ok)

    # 3. the new key and value into the cache
    if t == 0:
        kv_at = (bh.to(tl.int64) * N_CAP + POS) * D + dims
        tl.store(K + kv_at, tl.load(KNEW + bh * D + dims, mask=dim_ok), mask=dim_ok)
        tl.store(V + kv_at, tl.load(VNEW + bh * D + dims, mask=dim_ok), mask=dim_ok)

    # the last program of the row to arrive finishes it
    tl.debug_barrier()
    arrived = tl.atomic_add(COUNTER + bh, 1, sem="acq_rel", scope="gpu")
    if arrived == T - 1:
        tl.atomic_xchg(COUNTER + bh, 0, sem="relaxed", scope="gpu")
        ca = tl.arange(0, BLOCK_CA)
        ca_ok = ca < C
        lg = tl.load(LOGITS + (bh * BLOCK_G + rows[:, None]) * C + ca[None, :],
                     mask=row_ok[:, None] & ca_ok[None, :], other=float("-inf"), cache_modifier=".cg")
        mx = tl.max(lg, axis=1)
        mx = tl.where(row_ok, mx, 0.0)
        if LIBDEVICE_EXP:   # correctly rounded-ish exp on the GPU (tl.exp is ex2.approx there)
            e = libdevice.exp(lg - mx[:, None])
        else:               # the CPU interpreter has no libdevice; its tl.exp is numpy's
            e = tl.exp(lg - mx[:, None])
        e = tl.where(row_ok[:, None] & ca_ok[None, :], e, 0.0)
        den = tl.sum(e, axis=1)
        den = tl.where(row_ok, den, 1.0)
        score = tl.sum(e / den[:, None], axis=0)                 # [BLOCK_CA], >= 0
        key = (score.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (C - 1 - ca).to(tl.int64)
        key = tl.where(ca_ok, key, -1)
        work = key
        last = tl.max(work, axis=0)
        for j in range(0, P):
            last = tl.max(work, axis=0)
            tl.store(PROBED + bh * P + j, (C - 1 - (last - ((last >> 32) << 32))).to(tl.int32))
            work = tl.where(work == last, -1, work)
        tl.store(PROBED_MASK + bh * C + ca, (key >= last).to(tl.int8), mask=ca_ok)
        dd = tl.load(DIST + bh * C + ca, mask=ca_ok, other=float("inf"), cache_modifier=".cg")
        best = tl.argmin(dd, axis=0, tie_break_left=True)
        tl.store(BUCKET_OF + bh.to(tl.int64) * N_CAP + POS, best.to(tl.int32))


__all__ = ["saap_route_kernel"]
