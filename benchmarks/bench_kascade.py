"""Kascade kernels: correctness on the device, then per-layer times and the paper's composite.

1. check: every layer kind (dense anchor, anchor, reuse with a head map) through the Triton
   kernels against the float64 reference (`sas.methods.kascade`) at a small length, prefill and
   decode, fp16;
2. timing at Llama-3.1-8B shapes (32 query / 8 KV heads, head dim 128, fp16), top-k 10% (at
   least 128 keys), prefill tile 32: decode at batch 64 and prefill at batch 1, 8K..128K:
   T_a0 (layer 0: dense + publish), T_a (anchor: scores, pooled top-k, sparse attention),
   T_r (reuse: sparse attention over the published sets), composite
   `(T_a0 + 4 T_a + 27 T_r) / 32` (paper Tab. 3: 32 layers, 5 anchors), against dense SDPA
   (causal in prefill) and FlexAttention in the same run, and the decode HBM floor (K+V bytes
   over the measured copy bandwidth). Kernel times only (eager, host work of the step
   included: the anchor's torch.topk and buffer allocation), like the paper's microbenchmarks.

    python benchmarks/bench_kascade.py                 # GPU; JSON + markdown to $OUT when set
    python benchmarks/bench_kascade.py --small         # CPU (TRITON_INTERPRET=1): tiny sizes
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

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch.nn.functional as F  # noqa: E402

from sas.lang.ops import Fraction  # noqa: E402
from sas.methods.kascade import KascadeLayer, SelectionStore, reference_decode, reference_prefill  # noqa: E402
from sas.methods.kascade_runtime import KascadeRuntime  # noqa: E402

WEIGHTS = (1, 4, 27)        # anchor0, anchors, reuse layers of a 32-layer model with 5 anchors


def bench_ms(fn, budget_s: float = 0.4, max_reps: int = 30) -> float:
    """Median of CUDA-event times after one warm-up (reps fitted to a time budget)."""
    if not torch.cuda.is_available():
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    est = time.perf_counter() - t0
    reps = int(max(2, min(max_reps, budget_s / max(est, 1e-6))))
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return float(ts[len(ts) // 2])


def copy_bandwidth(dev) -> float:
    a = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    ms = bench_ms(lambda: b.copy_(a))
    del a, b
    return 2 * (1 << 30) / (ms * 1e-3)


def layers(frac: float, min_keys: int, hkv: int) -> dict[str, KascadeLayer]:
    b = Fraction(frac, min_keys)
    hm = tuple((h + 1) % hkv for h in range(hkv))        # a non-identity head map
    return {"a0": KascadeLayer("dense_anchor", budget=b), "a": KascadeLayer("anchor", budget=b),
            "r": KascadeLayer("reuse", budget=b, head_map=hm)}


def check(dev, small: bool) -> list[dict]:
    rt = KascadeRuntime()
    out = []
    for mode in ("prefill", "decode"):
        n = 200 if small else 700
        g = torch.Generator().manual_seed(0)
        hq, hkv, d = (4, 2, 64) if small else (32, 8, 128)
        q = torch.randn(1, hq, n, d, generator=g).half()
        k = torch.randn(1, hkv, n, d, generator=g).half()
        v = torch.randn(1, hkv, n, d, generator=g).half()
        if mode == "decode":
            q = q[:, :, -1:]
        lay = layers(0.1, 16, hkv)
        s_ref, s_rt = SelectionStore(), SelectionStore()
        fn_ref = reference_prefill if mode == "prefill" else reference_decode
        fn_rt = rt.prefill if mode == "prefill" else rt.decode
        for i, key in enumerate(("a0", "r", "a", "r")):
            ref = fn_ref(lay[key], q.float(), k.float(), v.float(), s_ref, i)
            got = fn_rt(lay[key], q.to(dev), k.to(dev), v.to(dev), s_rt, i)
            err = (got.double().cpu() - ref).abs().max().item()
            out.append({"mode": mode, "layer": key, "n": n, "max_abs_err": err})
            print(f"check {mode:7s} {key:2s} n={n}: max |kernel - reference| = {err:.2e}")
    return out


def sdpa_decode(q, k, v):
    """Dense decode: the G query heads of a KV head as G rows of one (non-causal) query block."""
    b, hq, _, d = q.shape
    hkv = k.shape[1]
    return F.scaled_dot_product_attention(q.view(b, hkv, hq // hkv, d), k, v)


def timing(dev, small: bool, mode: str, contexts: list[int], frac: float, min_keys: int, batch: int, bw: float,
           save=lambda: None) -> list[dict]:
    hq, hkv, d = (4, 2, 64) if small else (32, 8, 128)
    dtype = torch.float16
    rt = KascadeRuntime()
    lay = layers(frac, min_keys, hkv)
    rows = []
    for n in contexts:
        row: dict = {"mode": mode, "n": n, "batch": batch, "frac": frac, "min_keys": min_keys,
                     "k": Fraction(frac, min_keys).keys(n)}
        try:
            g = torch.Generator(device=dev).manual_seed(n)
            lq = 1 if mode == "decode" else n
            q = torch.randn(batch, hq, lq, d, device=dev, dtype=dtype, generator=g)
            k = torch.randn(batch, hkv, n, d, device=dev, dtype=dtype, generator=g)
            v = torch.randn(batch, hkv, n, d, device=dev, dtype=dtype, generator=g)
            step = rt.decode if mode == "decode" else rt.prefill
            store = SelectionStore()
            for key in ("a0", "a", "r"):
                def run(key=key):
                    return step(lay[key], q, k, v, store, {"a0": 0, "a": 1, "r": 2}[key])
                row[f"T_{key}_ms"] = bench_ms(run)
                torch.cuda.empty_cache() if dev.type == "cuda" else None
            row["kascade_ms"] = (WEIGHTS[0] * row["T_a0_ms"] + WEIGHTS[1] * row["T_a_ms"]
                                 + WEIGHTS[2] * row["T_r_ms"]) / sum(WEIGHTS)
            if mode == "decode":
                row["sdpa_ms"] = bench_ms(lambda: sdpa_decode(q, k, v))
                row["hbm_floor_ms"] = 2 * k.numel() * k.element_size() / bw * 1e3
                row["reuse_hbm_floor_ms"] = row["hbm_floor_ms"] * row["k"] / n
            else:
                try:
                    row["sdpa_ms"] = bench_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                                    enable_gqa=True))
                    row["sdpa_variant"] = "enable_gqa"
                except Exception as e:  # noqa: BLE001
                    print(f"  SDPA enable_gqa failed ({type(e).__name__}); expanding K/V")
                    ke, ve = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
                    row["sdpa_ms"] = bench_ms(lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=True))
                    row["sdpa_variant"] = "expanded K/V"
                    del ke, ve
            row["speedup_vs_sdpa"] = row["sdpa_ms"] / row["kascade_ms"]
            print(f"{mode:7s} N={n:6d} B={batch}: a0 {row['T_a0_ms']:.3f}  a {row['T_a_ms']:.3f}  r {row['T_r_ms']:.3f}"
                  f"  composite {row['kascade_ms']:.3f} ms | SDPA {row['sdpa_ms']:.3f} ms"
                  f"{'  Flex %.3f ms' % row['flex_ms'] if 'flex_ms' in row else ''}"
                  f"  -> {row['speedup_vs_sdpa']:.2f}x SDPA", flush=True)
            del q, k, v, store
        except Exception as e:  # noqa: BLE001 - one failed configuration must not stop the others
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(f"{mode} N={n}: FAILED {row['error']}", flush=True)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        rows.append(row)
        save(rows)
    return rows


def flex_pass(dev, rows: list[dict], flex_contexts: set[int], save=lambda: None) -> None:
    """FlexAttention (compiled, dynamic=False: one compile per shape) at the given contexts,
    timed after everything else so that its compile time cannot crowd out the main rows."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention, dynamic=False)
    except Exception as e:  # noqa: BLE001
        print(f"FlexAttention unavailable: {type(e).__name__}: {e}")
        return
    for row in rows:
        n = row["n"]
        if n not in flex_contexts or "error" in row:
            continue
        hq, hkv, d = 32, 8, 128
        lq = 1 if row["mode"] == "decode" else n
        try:
            q = torch.randn(row["batch"], hq, lq, d, device=dev, dtype=torch.float16)
            k = torch.randn(row["batch"], hkv, n, d, device=dev, dtype=torch.float16)
            v = torch.randn_like(k)
            t = time.perf_counter()
            if row["mode"] == "decode":
                flex(q, k, v, enable_gqa=True)
                row["flex_ms"] = bench_ms(lambda: flex(q, k, v, enable_gqa=True))
            else:
                bm = create_block_mask(lambda b_, h_, i, j: i >= j, None, None, n, n, device=dev)
                flex(q, k, v, block_mask=bm, enable_gqa=True)
                row["flex_ms"] = bench_ms(lambda: flex(q, k, v, block_mask=bm, enable_gqa=True))
            row["speedup_vs_flex"] = row["flex_ms"] / row["kascade_ms"]
            print(f"{row['mode']:7s} N={n:6d}: FlexAttention {row['flex_ms']:.3f} ms (compile + timing "
                  f"{time.perf_counter() - t:.0f} s) -> Kascade {row['speedup_vs_flex']:.2f}x Flex", flush=True)
            del q, k, v
        except Exception as e:  # noqa: BLE001
            row["flex_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            print(f"{row['mode']} N={n}: FlexAttention failed: {row['flex_error']}", flush=True)
        torch.cuda.empty_cache()
        save(rows)


def table(rows: list[dict]) -> str:
    head = ("| step | N | B | k | T_a0 ms | T_a ms | T_r ms | Kascade ms | SDPA ms | Flex ms | x SDPA | x Flex |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    out = []
    for r in rows:
        if "error" in r:
            out.append(f"| {r['mode']} | {r['n']} | {r['batch']} | {r['k']} | failed: {r['error'][:60]} "
                       f"| | | | | | | |")
            continue
        f = lambda x: "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"  # noqa: E731
        out.append(f"| {r['mode']} | {r['n']} | {r['batch']} | {r['k']} | {f(r['T_a0_ms'])} | {f(r['T_a_ms'])} | "
                   f"{f(r['T_r_ms'])} | {f(r['kascade_ms'])} | {f(r['sdpa_ms'])} | {f(r.get('flex_ms'))} | "
                   f"{r['speedup_vs_sdpa']:.2f} | {f(r.get('speedup_vs_flex'))} |")
    return head + "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="tiny sizes (CPU interpreter)")
    ap.add_argument("--decode", default="8192,16384,32768,65536,131072")
    ap.add_argument("--prefill", default="8192,16384,32768,65536,131072")
    ap.add_argument("--flex", default="8192,32768", help="contexts also timed with FlexAttention")
    ap.add_argument("--frac", type=float, default=0.1)
    ap.add_argument("--min-keys", type=int, default=128)
    ap.add_argument("--decode-batch", type=int, default=64)
    ap.add_argument("--no-check", action="store_true")
    args = ap.parse_args()
    small = args.small or not torch.cuda.is_available()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    report: dict = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (interpreter)",
                    "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if not args.no_check:
        report["check"] = check(dev, small)
    parse = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    decode = [256] if small else parse(args.decode)
    prefill = [256] if small else parse(args.prefill)
    flex = set() if small else set(parse(args.flex))
    bw = copy_bandwidth(dev) if dev.type == "cuda" else 1e11
    report["copy_bandwidth_GBs"] = bw / 1e9
    min_keys = 16 if small else args.min_keys
    out = os.environ.get("OUT")
    done: list[dict] = []

    def md() -> str:
        return (f"Kascade kernels, {report['device']}, torch {report['torch']}, {report['date']}; top-k "
                f"{args.frac:.0%} (min {min_keys}), fp16, 32 q / 8 KV heads, d=128 (small: 4/2/64); composite = "
                f"(T_a0 + 4 T_a + 27 T_r)/32\n\n" + table(done))

    def save(rows=None) -> None:
        if out:
            report["timing"] = done + [r for r in (rows or []) if r not in done]
            Path(out).mkdir(parents=True, exist_ok=True)
            Path(out, "kascade.json").write_text(json.dumps(report, indent=1))
            Path(out, "kascade.md").write_text(md())

    done += timing(dev, small, "decode", decode, args.frac, min_keys, 2 if small else args.decode_batch, bw, save)
    done += timing(dev, small, "prefill", prefill, args.frac, min_keys, 1, bw, save)
    if flex:
        flex_pass(dev, done, flex, save)
    report["timing"] = done
    save()
    print()
    print(md())


if __name__ == "__main__":
    main()
