"""SANTA decode (`.sample(...)`): one decode step at Llama-3.1-8B shapes against dense baselines.

Shapes: 32 query / 8 KV heads, head dim 128, bf16, one query token per sequence, cache of n
keys (Gaussian K/V/q), batch 1 and 16, n = 32K and 128K. Timed in the same run:

- SANTA prop (S = 128, alloc=global_sys) on the Triton kernels (scores + stash with the tile
  budgets in the last program of each KV head, then the sparse V gather with the cast in its last
  program) and on the one-launch CUDA kernel (`--prop-backends`), and
  flash (S = 2048: per-tile draws, merge), each a whole `santa_decode` call including the
  uniforms it draws (torch.rand);
- dense SDPA decode (the faster of the MHA form with the G query heads as rows and
  `enable_gqa=True`), FlexAttention (compiled, no mask; batch 1), sas dense decode
  (`SASAttnKernel(Causal())` over its own cache);
- the HBM floors at the measured copy bandwidth: dense (all of K and V) and SANTA's (all of K
  plus the V rows actually drawn: the union over the 4 heads of a KV head, measured).

Before timing, each configuration checks the estimate against exact attention: its squared
error over the multinomial estimator's expected one, tr(Sigma_q)/S (about 1 or less for a
correct sampler; the relative L2 error is large on Gaussian inputs, whose attention is nearly
uniform and whose exact output is near 0), and that every head drew exactly S (prop).
Timing: triton do_bench (L2 flushed between calls, median) eagerly, and CUDA-graph replay.

    python benchmarks/bench_santa.py            # GPU; JSON + markdown to $OUT when OUT is set
    python benchmarks/bench_santa.py --small    # CPU (TRITON_INTERPRET=1): tiny sizes, no timing claims
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

from sas import Causal  # noqa: E402
from sas.methods.santa import SantaRandom  # noqa: E402
from sas.methods.santa_runtime import SantaOptions, santa_decode  # noqa: E402
from sas.runtime.kernel import SASAttnKernel  # noqa: E402

START = time.time()


def bench_ms(fn, reps: int, graph: bool = False) -> float:
    if not torch.cuda.is_available():
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    import triton.testing as tt

    if graph:
        try:
            return float(tt.do_bench_cudagraph(fn, rep=reps, return_mode="median"))
        except Exception as e:  # noqa: BLE001 - report, do not fake a number
            print(f"    (CUDA graph capture failed: {type(e).__name__}: {str(e)[:160]})")
            return math.nan
    return float(tt.do_bench(fn, warmup=max(5, reps // 4), rep=reps, return_mode="median"))


def copy_bandwidth(dev) -> float:
    """Bytes/s of a large device-to-device copy (read + write counted)."""
    x = torch.empty(1 << 28, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    ms = bench_ms(lambda: y.copy_(x), 50)
    return 2 * x.numel() / (ms * 1e-3)


def config_rows(dev, small: bool, contexts, batches, samples, reps, flex_fn, flex_batches, bandwidth, budget_s):
    hq, hkv, d = (8, 2, 64) if small else (32, 8, 128)
    g_sz = hq // hkv
    dtype = torch.bfloat16
    rows = []
    for n in contexts:
        for b in batches:
            if time.time() - START > budget_s:
                print(f"skipped context {n} batch {b}: time budget of {budget_s} s spent")
                continue
            row: dict = {"context": n, "batch": b, "heads": hq, "kv_heads": hkv, "head_dim": d}
            try:
                gen = torch.Generator(device="cpu").manual_seed(n + b)
                k = torch.randn(b, hkv, n, d, generator=gen).to(dev, dtype)
                v = torch.randn(b, hkv, n, d, generator=gen).to(dev, dtype)
                q = torch.randn(b, hq, d, generator=gen).to(dev, dtype)
                qg = q.reshape(b, hkv, g_sz, d)
                kf, vf = k.float(), v.float()
                probs = torch.softmax(torch.einsum("bhgd,bhkd->bhgk", qg.float(), kf) * d ** -0.5, -1)
                exact = torch.einsum("bhgk,bhkd->bhgd", probs, vf).reshape(b, hq, d)
                # per head: tr(Sigma_q) = sum_j p_j |v_j|^2 - |mu|^2, the multinomial MSE times S
                spread = (torch.einsum("bhgk,bhk->bhg", probs, (vf * vf).sum(-1)).reshape(b, hq)
                          - (exact * exact).sum(-1))
                del kf, vf, probs
                kv_bytes = 2 * k.numel() * k.element_size()
                row["kv_bytes"] = kv_bytes
                sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(qg, k, v)  # noqa: E731
                sdpa_gqa = lambda: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
                    q[:, :, None], k, v, enable_gqa=True)
                row["sdpa_mha_ms"] = bench_ms(sdpa, reps)
                row["sdpa_gqa_ms"] = bench_ms(sdpa_gqa, reps)
                row["sdpa_ms"] = min(row["sdpa_mha_ms"], row["sdpa_gqa_ms"])
                row["sdpa_graph_ms"] = min(bench_ms(sdpa, reps, graph=True), bench_ms(sdpa_gqa, reps, graph=True))
                if flex_fn is not None and b in flex_batches:
                    try:
                        flex_fn(q[:, :, None], k, v, enable_gqa=True)
                        row["flex_ms"] = bench_ms(lambda: flex_fn(q[:, :, None], k, v, enable_gqa=True), reps)
                    except Exception as e:  # noqa: BLE001
                        row["flex_error"] = f"{type(e).__name__}: {str(e)[:200]}"
                try:
                    ker = SASAttnKernel(Causal(), max_len=n)
                    kc, vc = k[:, :, :-1], v[:, :, :-1]      # positions 0 .. n-2 in place (cache of n slots)
                    kc_full = torch.empty_like(k)
                    vc_full = torch.empty_like(v)
                    kc_full[:, :, :-1], vc_full[:, :, :-1] = kc, vc
                    k1, v1 = k[:, :, -1:].contiguous(), v[:, :, -1:].contiguous()
                    sas_dense = lambda: ker(q[:, :, None], k1, v1, kc_full, vc_full, position=n - 1)  # noqa: E731
                    o = sas_dense()
                    row["sas_dense_err"] = float((o[:, :, 0].float() - exact).abs().max())
                    row["sas_dense_ms"] = bench_ms(sas_dense, reps)
                    row["sas_dense_graph_ms"] = bench_ms(sas_dense, reps, graph=True)
                    del kc_full, vc_full
                except Exception as e:  # noqa: BLE001
                    row["sas_dense_error"] = f"{type(e).__name__}: {str(e)[:200]}"
                for strategy, s, stash, backend in samples:
                    key = sample_key(strategy, s, stash, backend)
                    try:
                        opts = SantaOptions(n=s, strategy=strategy, stash=stash, backend=backend)
                        chk = santa_decode(q, k, v, n, opts, SantaRandom(1), return_counts=True)
                        sq = ((chk.out.float() - exact) ** 2).sum(-1)
                        err = sq.sqrt() / exact.norm(dim=-1)
                        row[f"{key}_mse_over_multinomial"] = float((sq / (spread / s)).mean())
                        drawn = (chk.counts.reshape(b, hkv, g_sz, n) > 0).any(2).sum(-1).float()
                        row[f"{key}_rel_l2"] = float(err.mean())
                        row[f"{key}_draws_per_head"] = float(chk.counts.sum(-1).float().mean())
                        row[f"{key}_v_rows_per_kv_head"] = float(drawn.mean())
                        if strategy == "prop" and not bool((chk.counts.sum(-1) == s).all()):
                            row[f"{key}_error"] = "a head did not draw exactly S"
                        rnd = SantaRandom(None)      # torch's global generator: graph-capturable
                        step = lambda: santa_decode(q, k, v, n, opts, rnd)  # noqa: E731
                        row[f"{key}_ms"] = bench_ms(step, reps)
                        row[f"{key}_graph_ms"] = bench_ms(step, reps, graph=True)
                        row[f"{key}_speedup_vs_sdpa"] = row["sdpa_ms"] / row[f"{key}_ms"]
                        row[f"{key}_graph_speedup_vs_sdpa"] = row["sdpa_graph_ms"] / row[f"{key}_graph_ms"]
                        if bandwidth:
                            k_bytes = kv_bytes // 2
                            v_bytes = drawn.sum().item() * d * 2
                            row[f"{key}_floor_ms"] = (k_bytes + v_bytes) / bandwidth * 1e3
                    except Exception as e:  # noqa: BLE001
                        row[f"{key}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                if bandwidth:
                    row["dense_floor_ms"] = kv_bytes / bandwidth * 1e3
                    row["k_only_floor_ms"] = kv_bytes / 2 / bandwidth * 1e3
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(f"row {json.dumps(row)}", flush=True)
            rows.append(row)
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def sample_key(strategy: str, s: int, stash: str, backend: str) -> str:
    return f"{strategy}{s}" + ("" if stash == "float32" else "_bf16stash") + ("_cuda" if backend == "cuda" else "")


def table(rows, samples) -> str:
    head = ("| context | batch | SDPA ms (graph) | Flex ms | sas dense ms | " +
            " | ".join(f"{st} S={s}{'' if sh == 'float32' else ' bf16 stash'}{' cuda' if be == 'cuda' else ''} ms "
                       f"(graph) | x SDPA (graph) | MSE / (trΣ/S) | V rows/KV head | floor ms"
                       for st, s, sh, be in samples) +
            " | dense floor ms |")
    lines = [head, "|" + "---|" * (5 + 5 * len(samples) + 1)]
    f = lambda r, k, fmt=".4f": format(r[k], fmt) if isinstance(r.get(k), (int, float)) else "-"  # noqa: E731
    for r in rows:
        cells = [str(r["context"]), str(r["batch"]), f"{f(r, 'sdpa_ms')} ({f(r, 'sdpa_graph_ms')})", f(r, "flex_ms"),
                 f(r, "sas_dense_ms")]
        for st, s, sh, be in samples:
            key = sample_key(st, s, sh, be)
            cells += [f"{f(r, key + '_ms')} ({f(r, key + '_graph_ms')})",
                      f"{f(r, key + '_speedup_vs_sdpa', '.2f')} ({f(r, key + '_graph_speedup_vs_sdpa', '.2f')})",
                      f(r, key + "_mse_over_multinomial", ".2f"), f(r, key + "_v_rows_per_kv_head", ".0f"), f(r, key + "_floor_ms")]
        cells.append(f(r, "dense_floor_ms"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny sizes (CPU, TRITON_INTERPRET=1)")
    ap.add_argument("--contexts", default=None, help="comma list (default 32768,131072)")
    ap.add_argument("--batches", default=None, help="comma list (default 1,16)")
    ap.add_argument("--flex-batches", default="1", help="batches timed with FlexAttention ('' for none)")
    ap.add_argument("--budget-s", type=float, default=170.0, help="stop starting configurations after this")
    ap.add_argument("--prop-backends", default="triton,cuda",
                    help="prop's kernels to time, comma list of triton / cuda (default: both, same run)")
    ap.add_argument("--bf16-stash", action="store_true", help="also time prop with the cache-dtype stash")
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    small = args.small or dev.type != "cuda"
    contexts = [int(x) for x in args.contexts.split(",")] if args.contexts else ([512] if small else [32768, 131072])
    batches = [int(x) for x in args.batches.split(",")] if args.batches else ([1, 2] if small else [1, 16])
    prop_s = 16 if small else 128
    samples = [("prop", prop_s, "float32", b) for b in args.prop_backends.split(",") if b]
    if args.bf16_stash:
        samples.append(("prop", prop_s, "cache", "triton"))
    samples.append(("flash", 64 if small else 2048, "float32", "triton"))
    flex_fn = None
    flex_batches = {int(x) for x in args.flex_batches.split(",") if x}
    if dev.type == "cuda" and flex_batches:
        try:
            from torch.nn.attention.flex_attention import flex_attention
            flex_fn = torch.compile(flex_attention)
        except Exception as e:  # noqa: BLE001
            print(f"FlexAttention unavailable: {type(e).__name__}: {e}")
    bandwidth = copy_bandwidth(dev) if dev.type == "cuda" else None
    report = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (interpreter)",
              "torch": torch.__version__, "small": small, "copy_bandwidth_GBps": bandwidth / 1e9 if bandwidth else None,
              "date": time.strftime("%Y-%m-%d", time.gmtime()),
              "timing": "triton do_bench median (L2 flushed); *_graph_ms: do_bench_cudagraph median",
              "rows": config_rows(dev, small, contexts, batches, samples, 5 if small else 100, flex_fn, flex_batches,
                                  bandwidth, args.budget_s),
              "samples": samples}
    md = table(report["rows"], samples)
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "santa.json").write_text(json.dumps(report, indent=1))
        (Path(out) / "santa.md").write_text(md + "\n")
    print(f"\ndevice: {report['device']}, copy bandwidth {report['copy_bandwidth_GBps']} GB/s")
    print(md)


if __name__ == "__main__":
    main()
