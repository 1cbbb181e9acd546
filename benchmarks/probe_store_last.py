"""Does writing the new token's key and value after the slot loop shorten a decode's latency chain?
(issue 11, items 4 and 5)

The decode kernels (static `decode.py.jinja`, dynamic `dynamic_decode.py.jinja`) store the new
token's K and V into its cache slot at the top of the program, before the loop reads the cache.
The compiler cannot move a later load above a store it cannot prove to be elsewhere, so the
first K/V loads (and the query's) wait for the new token's load and store: one more dependent
memory round trip a step. The loop replaces the new slot's loaded values by the new token's
anyway (`tl.where(is_new, ...)`), so the store may come after the loop.

This probe renders each kernel module as the template has it and with the new-token stores
moved to the other end of the program (whichever way the template has them), checks that both
leave the same output and cache (static: output and K/V cache bit for bit; dynamic: the whole
state after one step), and times both by CUDA-graph replay, paired rounds:
- static decodes (MHA batch 1, 64 heads, and GQA 32 / 8 heads batch 16; head dim 128, bf16,
  16K), plain and as programmatic dependent launches, against the HBM floor of the compact cache;
- the dynamic step (each pattern + H2O, budget 512, the configurations of bench_dynamic.py).

    python benchmarks/probe_store_last.py [--patterns a,b] [--no-dynamic]
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
from ab_dynamic_update import CONFIGS, D, DTYPE, N, STATE, prepare, random_inputs  # noqa: E402
from bench_kernels import copy_bandwidth, load_pattern, paired_ms  # noqa: E402

from sas.codegen import triton_backend as tb  # noqa: E402
from sas.runtime import SASAttnKernel  # noqa: E402
from sas.runtime import dynamic_host as dh  # noqa: E402

#: the line each kernel's new-token stores are moved before (template order: stores first)
STATIC_ANCHORS = ("    if PDL and NUM_SPLITS > 1:\n", "    hq = hk * GROUP + offs_g\n")
DYNAMIC_ANCHORS = ("    tl.store(MPart + row * NUM_SPLITS + split, m_i, mask=g_ok)\n",
                   "    hq = hk * GROUP + offs_g\n")


def _store_blocks(lines: list[str]) -> list[tuple[int, int]]:
    """(start, end) line ranges of the `if (new_slot ...` / `if (new_pslot ...` store blocks of
    the attention kernel (a 4-space `if` and its 8-space body)."""
    out = []
    for i, ln in enumerate(lines):
        if ln.startswith("    if (new_slot >= s_lo)") or ln.startswith("    if (new_pslot >= s_lo)"):
            j = i + 1
            while j < len(lines) and lines[j].startswith("        "):
                j += 1
            out.append((i, j))
    return out


def moved(source: str, anchors: tuple[str, str]) -> tuple[str, str]:
    """(`source` with the new-token stores moved to the other end of the kernel, "last" or
    "first": where they are in the returned source)."""
    lines = source.splitlines(keepends=True)
    blocks = _store_blocks(lines)
    if not blocks:
        raise SystemExit("no new-token store block found: the template changed, update the probe")
    body = [ln for a, b in blocks for ln in lines[a:b]]
    rest = [ln for i, ln in enumerate(lines) if not any(a <= i < b for a, b in blocks)]
    last_anchor, first_anchor = anchors
    before_loop = blocks[0][0] < lines.index(first_anchor) if first_anchor in lines else True
    anchor, where = (last_anchor, "last") if before_loop else (first_anchor, "first")
    if rest.count(anchor) != 1:
        raise SystemExit(f"anchor {anchor.strip()!r} found {rest.count(anchor)} times: update the probe")
    i = rest.index(anchor)
    return "".join(rest[:i] + body + rest[i:]), where


def static_cases(names, configs, dev):
    """For each configuration (label, batch, query heads, KV heads) and pattern: seeded decode
    inputs q [B, Hq, 1, D], k, v [B, Hkv, 1, D], the pattern's default kernel and its compact
    caches filled from N - 1 seeded keys and values (freed after the caller's turn)."""
    for cfg, B, Hq, Hkv in configs:
        g = torch.Generator(device=dev).manual_seed(0)
        q = torch.randn(B, Hq, 1, D, device=dev, dtype=DTYPE, generator=g)
        kd = torch.randn(B, Hkv, 1, D, device=dev, dtype=DTYPE, generator=g)
        vd = torch.randn(B, Hkv, 1, D, device=dev, dtype=DTYPE, generator=g)
        for name in names:
            base = SASAttnKernel(load_pattern(name), max_len=N)
            k = torch.randn(B, Hkv, N, D, device=dev, dtype=DTYPE, generator=g)
            v = torch.randn_like(k)
            kc, vc = base.new_cache(B, Hkv, D, DTYPE, dev)
            base.fill_cache(k[:, :, :N - 1], v[:, :, :N - 1], kc, vc)
            del k, v
            yield cfg, B, Hq, Hkv, q, kd, vd, name, base, kc, vc
            del kc, vc
            torch.cuda.empty_cache()


def decode_each(kerns, q, kd, vd, kc, vc):
    """One decode at N - 1 by each kernel on its own copy of the caches: ([(output, k cache,
    v cache)], [a callable repeating each decode, for timing])."""
    outs, fns = [], []
    for kk in kerns:
        c = (kc.clone(), vc.clone())
        out = torch.empty_like(q)
        kk.runtime.decode(q, kd, vd, c[0], c[1], N - 1, out=out)
        outs.append((out, c[0], c[1]))
        fns.append(lambda kk=kk, c=c, out=out: kk.runtime.decode(q, kd, vd, c[0], c[1], N - 1, out=out))
    torch.cuda.synchronize()
    return outs, fns


def static_rows(names, configs, bw, rep, rounds, dev):
    rows = []
    for cfg, B, Hq, Hkv, q, kd, vd, name, base, kc, vc in static_cases(names, configs, dev):
        opts = base.plan.decode_config(Hq // Hkv)
        fns, same, where = [], True, ""
        for pdl in (False, True):
            o = dataclasses.replace(opts, pdl=pdl)
            kern = SASAttnKernel(load_pattern(name), max_len=N, decode_options=o)
            src, where = moved(tb.render_decode(kern.plan.analysis, o), STATIC_ANCHORS)
            var = SASAttnKernel(load_pattern(name), max_len=N, decode_options=o)
            var.runtime._decode_mods[o] = tb.load_source(src, "sas_decode_probe")
            outs, more = decode_each((kern, var), q, kd, vd, kc, vc)
            fns += more
            same = same and all(torch.equal(a, b) for a, b in zip(*outs))
        t = [x * 1e3 for x in paired_ms(fns, True, rep, rounds)]
        floor = 2 * base.cache_size * B * Hkv * D * 2 / bw * 1e6
        rows.append(dict(cfg=cfg, name=name, slots=base.cache_size, floor=floor, us=t, where=where, same=same))
        print(f"static {cfg} {name}: floor {floor:.2f} us, template / stores {where}: plain {t[0]:.2f} / {t[1]:.2f}, "
              f"PDL {t[2]:.2f} / {t[3]:.2f}, same={same}", flush=True)
        del fns
    return rows


def dynamic_rows(names, configs, rep, rounds, dev, transform=None):
    """The dynamic step of each pattern + H2O with the module as rendered and as `transform`
    (source -> (source, label); default: the new-token stores moved) makes it: the state after
    one step compared, then both steps timed."""
    transform = transform or (lambda src: moved(src, DYNAMIC_ANCHORS))
    rows = []
    for cfg, B, Hq, Hkv in configs:
        k, v, qd, kd, vd = random_inputs(B, Hq, Hkv, dev)
        for name in names:
            _, dk, P = prepare(name, B, Hq, Hkv, k, v, qd, kd, vd)
            host = dk.dynamic.rt
            kern, st, tabs = host.kernels, host.state, host.device_tables(dev)
            src, where = transform(tb.render_dynamic_decode(dk.dynamic.cplan))
            var = tb.load_source(src, "sas_dyn_decode_probe")
            st2 = dh.State(var, B, Hq, Hkv, D, DTYPE, dev, num_splits=st.num_splits, block_n=st.block_n)
            saved = {a: getattr(st, a).clone() for a in STATE}
            for a in STATE:
                getattr(st2, a).copy_(saved[a])
            outs = [torch.empty_like(qd), torch.empty_like(qd)]
            dh.step(kern, st, qd, kd, vd, P, outs[0], tabs, evict=True)
            dh.step(var, st2, qd, kd, vd, P, outs[1], tabs, evict=True)
            torch.cuda.synchronize()
            same = torch.equal(outs[0], outs[1]) and all(torch.equal(getattr(st, a), getattr(st2, a)) for a in STATE)
            fns = [lambda m=m, s=s, o=o: dh.step(m, s, qd, kd, vd, P, o, tabs, evict=True)
                   for m, s, o in ((kern, st, outs[0]), (var, st2, outs[1]))]
            t = [x * 1e3 for x in paired_ms(fns, True, rep, rounds)]
            rows.append(dict(cfg=cfg, name=name, us=t, where=where, same=same))
            print(f"dynamic {cfg} {name}: template / stores {where}: {t[0]:.2f} / {t[1]:.2f} us, same={same}", flush=True)
            del dk, st2, var
            torch.cuda.empty_cache()
        del k, v
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--patterns", default="strided_block_local,block_local,openai_fixed,streaming_llm,sliding_window")
    ap.add_argument("--configs", default="MHA,GQA")
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-dynamic", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("probe_store_last.py needs an NVIDIA GPU")
    dev = torch.device("cuda")
    names = args.patterns.split(",")
    configs = [c for c in CONFIGS if c[0] in args.configs.split(",")]
    bw = copy_bandwidth(dev)
    print(f"# `python benchmarks/probe_store_last.py` ({torch.cuda.get_device_name(dev)}, torch {torch.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}); N={N}, D={D}, bf16; copy bandwidth "
          f"{bw / 1e12:.2f} TB/s\n", flush=True)
    srows = static_rows(names, configs, bw, args.rep, args.rounds, dev)
    drows = [] if args.no_dynamic else dynamic_rows(names, configs, 40, args.rounds, dev)
    print("\nStatic decode, us (CUDA-graph replay): the template's order / the stores moved (where they go);"
          " over the HBM floor\n")
    print("| config | pattern | slots | floor us | moved to | plain | PDL | plain / floor | PDL / floor | same |")
    print("|---|---|---:|---:|---|---|---|---|---|---|")
    for r in srows:
        u, f = r["us"], r["floor"]
        print(f"| {r['cfg']} | {r['name']} | {r['slots']} | {f:.2f} | {r['where']} | {u[0]:.2f} / {u[1]:.2f} | "
              f"{u[2]:.2f} / {u[3]:.2f} | {u[0] / f:.2f} / {u[1] / f:.2f} | {u[2] / f:.2f} / {u[3] / f:.2f} | "
              f"{r['same']} |")
    print_dynamic_rows(drows, "moved", "moved to")


def print_dynamic_rows(rows, variant: str, column: str) -> None:
    """The markdown table of `dynamic_rows` (nothing when there are none): each step as rendered
    and as its variant (`variant` names it in the title, `column` heads its label)."""
    if not rows:
        return
    print(f"\nDynamic step (+ H2O, budget 512), us (CUDA-graph replay): template / {variant}\n")
    print(f"| config | pattern | {column} | step | same state |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['cfg']} | {r['name']} | {r['where']} | {r['us'][0]:.2f} / {r['us'][1]:.2f} | {r['same']} |")


if __name__ == "__main__":
    main()
