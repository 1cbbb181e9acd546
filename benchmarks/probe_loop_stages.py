"""Are the decode kernels' slot loops software-pipelined? (issue 11, items 4 and 5)

Triton pipelines a loop's loads (cp.async into shared memory, `num_stages` deep) only where
they feed a `tl.dot`, unless the loop itself asks for stages: `tl.range(..., num_stages=n)`
(Triton's AssignLatencies pass: `pipelineWithoutDot` is set by the loop's own attribute only).
The MHA decode (one query row per KV head: `tl.sum` instead of `tl.dot`) loops over its slot
blocks with a plain `range`, so `DecodeOptions.num_stages` does nothing there and each slot
block's loads wait for the block before.

This probe renders each decode module as the template has it and with the slot loop written as
`tl.range(s_lo, s_hi, BLOCK_N, num_stages=n)` for n in --stages (n = 0: a register double
buffer by hand instead, the next slot block's K and V loaded before the current block's
arithmetic; static decodes of skip mode "none" only), counts the cp.async copies in
each compiled kernel's TTGIR, checks that every variant leaves the same output and cache bit
for bit (the dynamic step: the whole state), and times them by CUDA-graph replay, paired rounds:
- static decodes (MHA batch 1, 64 heads, and GQA 32 / 8 heads batch 16; head dim 128, bf16,
  16K), over the HBM floor of the compact cache;
- the dynamic step's attention loop (each pattern + H2O, budget 512, bench_dynamic.py's
  configurations).

    python benchmarks/probe_loop_stages.py [--patterns a,b] [--stages 2,3] [--no-dynamic]
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from ab_dynamic_update import CONFIGS, D, N  # noqa: E402
from bench_kernels import copy_bandwidth, load_pattern, paired_ms  # noqa: E402
from probe_store_last import decode_each, dynamic_rows, print_dynamic_rows, static_cases  # noqa: E402

from sas.codegen import triton_backend as tb  # noqa: E402
from sas.runtime import SASAttnKernel  # noqa: E402

LOOP = "    for s0 in range(s_lo, s_hi, BLOCK_N):\n"


def staged(source: str, stages: int) -> tuple[str, str]:
    """`source` with its slot loop(s) as `tl.range(..., num_stages=stages)`."""
    if source.count(LOOP) < 1:
        raise SystemExit("no slot loop found: the template changed, update the probe")
    return source.replace(LOOP, f"    for s0 in tl.range(s_lo, s_hi, BLOCK_N, num_stages={stages}):\n"), \
        f"tl.range/{stages}"


#: one online-softmax step per slot lane (qk, m_l, l_l: [BLOCK_N]), shared by both lane loops
_LANE_SOFTMAX = ["        qk = tl.where(attend, qk, float(\"-inf\"))\n",
                 "        m_new = tl.maximum(m_l, qk)\n",
                 "        m_use = tl.where(m_new == float(\"-inf\"), 0.0, m_new)\n",
                 "        p = tl.math.exp2(qk - m_use)\n",
                 "        alpha = tl.math.exp2(m_l - m_use)\n",
                 "        l_l = l_l * alpha + p\n"]


def _loop_parts(source: str):
    """(lines, first line of the slot loop, line after it, its body, the slot-mask lines) of a
    static decode module of skip mode "none"; None for the other skip modes."""
    lines = source.splitlines(keepends=True)
    if LOOP not in lines or 'SKIP_MODE = "none"\n' not in lines:
        return None
    i = lines.index(LOOP)
    j = i + 1
    while j < len(lines) and (lines[j].startswith("        ") or not lines[j].strip()):
        j += 1
    body = lines[i + 1:j]
    strip = [ln.strip() for ln in body]
    a = strip.index("slot = s0 + offs_n")
    b = next(n for n, ln in enumerate(strip) if ln.startswith("attend = "))
    return lines, i, j, body, body[a + 1:b + 1]


def prefetched(source: str) -> tuple[str, str]:
    """`source` with the static decode's slot loop (skip mode "none") loading the next slot
    block's K and V into registers before it computes on the current one (a register double
    buffer: the loads of block i + 1 are in flight during block i's arithmetic)."""
    parts = _loop_parts(source)
    if parts is None:
        return source, "prefetch"  # (blocks are skipped in a branch: left as rendered)
    lines, i, j, body, mask = parts
    c = next((n for n, ln in enumerate(body) if ln.strip().startswith("v = tl.where(is_new")), None)
    if c is None:   # (since 2026-11-28 the loop leaves the new token's slot to a column after it)
        raise SystemExit("prefetch variant: the slot loop no longer substitutes the new token's value "
                         "(v = tl.where(is_new, ...)); the template changed, update the probe")
    rest = body[c + 1:]
    kl = "tl.load(kc + slot[None, :] * stride_kc_s + offs_d[:, None] * stride_kc_d, mask=att_nx[None, :], other=0.0)"
    vl = "tl.load(vc + slot[:, None] * stride_vc_s + offs_d[None, :] * stride_vc_d, mask=att_nx[:, None], other=0.0)"
    pro = ["    slot = s_lo + offs_n\n"] + [ln[4:] for ln in mask] + [
        "    att_nx = attend\n", f"    k_nx = {kl}\n", f"    v_nx = {vl}\n"]
    loop = [LOOP, "        k = k_nx\n", "        v = v_nx\n", "        att_c = att_nx\n",
            "        slot = s0 + BLOCK_N + offs_n\n"] + mask + [
        "        att_nx = attend\n", f"        k_nx = {kl}\n", f"        v_nx = {vl}\n",
        "        slot = s0 + offs_n\n", "        attend = att_c\n", "        is_new = slot == new_slot\n",
        "        k = tl.where(is_new[None, :], k_new[:, None], k)\n",
        "        v = tl.where(is_new[:, None], v_new[None, :], v)\n"] + rest
    return "".join(lines[:i] + pro + loop + lines[j:]), "prefetch"


def lanes(source: str, transposed: bool | str = False) -> tuple[str, str]:
    """`source` with the static MHA decode's slot loop (skip mode "none", one query row per KV
    head) keeping one online softmax per slot lane: K and V are loaded as [BLOCK_N, HEAD_DIM],
    each lane j runs its own max, sum and [HEAD_DIM] accumulator over slots j, j + BLOCK_N, ...,
    so the loop has no reduction across warps and no layout conversion (only q.k's sum over the
    head dimension, inside a warp); the lanes are merged once after the loop. `transposed`: K
    and V both loaded as [HEAD_DIM, BLOCK_N] instead ("qfix": and the new token's q.k patched
    into the products rather than its key into the tile)."""
    parts = _loop_parts(source)
    if parts is None:
        return source, "lanes"  # (blocks are skipped in a branch: left as rendered)
    lines, i, j, _, mask = parts
    if transposed:
        return _lanes_dn(lines, i, j, mask, qfix=transposed == "qfix")
    new = ["    m_l = tl.full([BLOCK_N], float(\"-inf\"), dtype=tl.float32)\n",
           "    l_l = tl.zeros([BLOCK_N], dtype=tl.float32)\n",
           "    acc_l = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)\n",
           "    qv = tl.sum(q, 0)\n",
           LOOP, "        slot = s0 + offs_n\n"] + mask + [
        "        is_new = slot == new_slot\n",
        "        k = tl.load(kc + slot[:, None] * stride_kc_s + offs_d[None, :] * stride_kc_d, mask=attend[:, None], other=0.0)\n",
        "        k = tl.where(is_new[:, None], k_new[None, :], k)\n",
        "        v = tl.load(vc + slot[:, None] * stride_vc_s + offs_d[None, :] * stride_vc_d, mask=attend[:, None], other=0.0)\n",
        "        v = tl.where(is_new[:, None], v_new[None, :], v)\n",
        "        qk = tl.sum(k.to(tl.float32) * qv[None, :], 1)\n",
    ] + _LANE_SOFTMAX + [
        "        acc_l = acc_l * alpha[:, None] + p[:, None] * v.to(tl.float32)\n",
        "        m_l = m_new\n",
        "    m_1 = tl.max(m_l, 0)\n",
        "    w_l = tl.math.exp2(m_l - tl.where(m_1 == float(\"-inf\"), 0.0, m_1))\n",
        "    m_i = tl.zeros([G_PAD], dtype=tl.float32) + m_1\n",
        "    l_i = tl.zeros([G_PAD], dtype=tl.float32) + tl.sum(l_l * w_l, 0)\n",
        "    acc = tl.zeros([G_PAD, HEAD_DIM], dtype=tl.float32) + tl.sum(acc_l * w_l[:, None], 0)[None, :]\n",
        "\n"]
    return "".join(lines[:i] + new + lines[j:]), "lanes"


def _lanes_dn(lines, i, j, mask, qfix: bool = False) -> tuple[str, str]:
    """lanes(transposed=True); `qfix`: the new token's slot gets its q.k from a product taken
    before the loop instead of its key substituted into the loaded tile (so that the first use
    of the loaded K is the product, not a select)."""
    ptr = "slot[None, :] * stride_{0}c_s + offs_d[:, None] * stride_{0}c_d"
    fix = (["        qk = tl.where(is_new, qk_nw, qk)\n"] if qfix
           else ["        k = tl.where(is_new[None, :], k_new[:, None], k)\n"])
    new = ["    m_l = tl.full([BLOCK_N], float(\"-inf\"), dtype=tl.float32)\n",
           "    l_l = tl.zeros([BLOCK_N], dtype=tl.float32)\n",
           "    acc_l = tl.zeros([HEAD_DIM, BLOCK_N], dtype=tl.float32)\n",
           "    qv = tl.sum(q, 0)\n",
           "    qk_nw = tl.sum(k_new.to(tl.float32) * qv, 0)\n",
           LOOP, "        slot = s0 + offs_n\n"] + mask + [
        "        is_new = slot == new_slot\n",
        f"        k = tl.load(kc + {ptr.format('k')}, mask=attend[None, :], other=0.0)\n",
        f"        v = tl.load(vc + {ptr.format('v')}, mask=attend[None, :], other=0.0)\n"] + (
        [] if qfix else fix) + [
        "        v = tl.where(is_new[None, :], v_new[:, None], v)\n",
        "        qk = tl.sum(k.to(tl.float32) * qv[:, None], 0)\n"] + (fix if qfix else []) + [
    ] + _LANE_SOFTMAX + [
        "        acc_l = acc_l * alpha[None, :] + p[None, :] * v.to(tl.float32)\n",
        "        m_l = m_new\n",
        "    m_1 = tl.max(m_l, 0)\n",
        "    w_l = tl.math.exp2(m_l - tl.where(m_1 == float(\"-inf\"), 0.0, m_1))\n",
        "    m_i = tl.zeros([G_PAD], dtype=tl.float32) + m_1\n",
        "    l_i = tl.zeros([G_PAD], dtype=tl.float32) + tl.sum(l_l * w_l, 0)\n",
        "    acc = tl.zeros([G_PAD, HEAD_DIM], dtype=tl.float32) + tl.sum(acc_l * w_l[None, :], 1)[None, :]\n",
        "\n"]
    return "".join(lines[:i] + new + lines[j:]), "lanes-dn" + ("-qfix" if qfix else "")


def registers(mod) -> str:
    """"registers/spills" of the split (attention) kernel(s) of `mod` compiled so far."""
    out = []
    for name, obj in vars(mod).items():
        for dc in (getattr(obj, "device_caches", None) or {}).values():
            kernels = dc[0] if isinstance(dc, tuple) else dc
            for ck in getattr(kernels, "values", lambda: [])():
                if "combine" not in name and "flags" not in name and hasattr(ck, "n_regs"):
                    out.append(f"{ck.n_regs}/{ck.n_spills}")
    return ",".join(out) or "?"


def async_copies(mod) -> int:
    """cp.async copies in the TTGIR of every kernel of `mod` compiled so far (-1: unknown)."""
    n, seen = 0, False
    for obj in vars(mod).values():
        caches = getattr(obj, "device_caches", None)
        if not caches:
            continue
        for dc in caches.values():
            kernels = dc[0] if isinstance(dc, tuple) else dc
            for ck in getattr(kernels, "values", lambda: [])():
                asm = getattr(ck, "asm", {}) or {}
                if "ttgir" in asm:
                    seen = True
                    n += asm["ttgir"].count("async_copy_global_to_local")
    return n if seen else -1


def static_rows(names, configs, stages, alts, bw, rep, rounds, dev):
    rows = []
    for cfg, B, Hq, Hkv, q, kd, vd, name, base, kc, vc in static_cases(names, configs, dev):
        floor = 2 * base.cache_size * B * Hkv * D * 2 / bw * 1e6
        default = base.plan.decode_config(Hq // Hkv)
        for label, o in [("default", default)] + [
                (f"bn={bn} w={w} bps={bps}" + (" dot" if dot else ""),
                 dataclasses.replace(default, block_n=bn, num_warps=w, blocks_per_split=bps, mha_dot=bool(dot)))
                for bn, w, bps, dot in (alts if Hq == Hkv else ())]:
            kern = SASAttnKernel(load_pattern(name), max_len=N, decode_options=o)
            src = tb.render_decode(kern.plan.analysis, o)
            kerns, labels = [kern], ["range"]
            for s in stages:
                vsrc, lab = (staged(src, s) if s > 0 else prefetched(src) if s == 0
                             else lanes(src, transposed={-1: False, -2: True, -3: "qfix"}[s]))
                var = SASAttnKernel(load_pattern(name), max_len=N, decode_options=o)
                var.runtime._decode_mods[o] = tb.load_source(vsrc, "sas_decode_stages_probe")
                kerns.append(var)
                labels.append(lab)
            outs, fns = decode_each(kerns, q, kd, vd, kc, vc)
            same = all(torch.equal(a, b) for o2 in outs[1:] for a, b in zip(outs[0], o2))
            if not same:  # (lanes sum in another order: outputs within bf16 rounding, caches equal)
                err = max((o2[0].float() - outs[0][0].float()).abs().max().item() for o2 in outs[1:])
                caches = all(torch.equal(a, b) for o2 in outs[1:] for a, b in zip(outs[0][1:], o2[1:]))
                same = f"out max diff {err:.1e}, caches equal {caches}"
            copies = [f"{async_copies(kk.runtime.decode_module(o))} ({registers(kk.runtime.decode_module(o))})"
                      for kk in kerns]
            t = [x * 1e3 for x in paired_ms(fns, True, rep, rounds)]
            rows.append(dict(cfg=cfg, name=name, slots=base.cache_size, floor=floor, opts=label, labels=labels,
                             us=t, copies=copies, same=same))
            print(f"static {cfg} {name} {label}: floor {floor:.2f} us; "
                  + ", ".join(f"{lab} {u:.2f} ({c} cp.async)" for lab, u, c in zip(labels, t, copies))
                  + f"; same={same}", flush=True)
            del kerns, fns, outs
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--patterns", default="strided_block_local,block_local,openai_fixed,streaming_llm,sliding_window,"
                                          "openai_strided,causal")
    ap.add_argument("--configs", default="MHA,GQA")
    ap.add_argument("--stages", default="2,3", help="tl.range num_stages of each variant; 0: the register prefetch; "
                                                      "-1: per-lane softmax (MHA only); -2: the same over [head dim, slots] tiles; "
                                                      "-3: -2 with the new token's q.k patched in")
    ap.add_argument("--alts", default="", help="MHA option variants block_n,num_warps,blocks_per_split[,mha_dot 0/1];...")
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-dynamic", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("probe_loop_stages.py needs an NVIDIA GPU")
    dev = torch.device("cuda")
    names = args.patterns.split(",")
    stages = [int(s) for s in args.stages.split(",")]
    alts = [tuple(int(x) for x in (a + ",0").split(",")[:4]) for a in filter(None, args.alts.split(";"))]
    configs = [c for c in CONFIGS if c[0] in args.configs.split(",")]
    bw = copy_bandwidth(dev)
    print(f"# `python benchmarks/probe_loop_stages.py` ({torch.cuda.get_device_name(dev)}, torch {torch.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}); N={N}, D={D}, bf16; copy bandwidth "
          f"{bw / 1e12:.2f} TB/s\n", flush=True)
    srows = static_rows(names, configs, stages, alts, bw, args.rep, args.rounds, dev)
    drows = []
    if not args.no_dynamic:
        dnames = [n for n in names if n != "causal"]
        for s in (s for s in stages if s > 0):     # (the other variants rewrite the static decode only)
            drows += dynamic_rows(dnames, configs, 40, args.rounds, dev, transform=lambda src, s=s: staged(src, s))
    print("\nStatic decode, us (CUDA-graph replay) and over the HBM floor: the template's `range` / "
          "`tl.range(num_stages=n)`; cp.async copies in the compiled TTGIR (split kernel registers / spills)\n")
    print("| config | pattern | slots | options | floor us | " + " | ".join(srows[0]["labels"]) + " | x floor | cp.async | same |")
    print("|---|---|---:|---|---:|" + "---:|" * len(srows[0]["labels"]) + "---|---|---|")
    for r in srows:
        f = r["floor"]
        print(f"| {r['cfg']} | {r['name']} | {r['slots']} | {r['opts']} | {f:.2f} | "
              + " | ".join(f"{u:.2f}" for u in r["us"]) + " | " + " / ".join(f"{u / f:.2f}" for u in r["us"])
              + " | " + " / ".join(str(c) for c in r["copies"]) + f" | {r['same']} |")
    print_dynamic_rows(drows, "tl.range(num_stages=n)", "variant")


if __name__ == "__main__":
    main()
