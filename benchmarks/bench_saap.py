"""Saap decode (ops.partition): correctness, keys looked up vs recall, decode time vs dense.

1. check: the Triton kernel (`SaapDecoder`) against the float64 reference
   (`saap_attention_reference`) at a small length, bf16 and fp32, GQA;
2. recall (needs SmolLM2: `SMOLLM2_DIR` or the installed package, skipped with --no-model):
   state fitted on the first half of a corpus sequence, evaluated on the queries of the second
   half: per probe count, the fraction of region keys looked up and the recall of each query
   head's exact top-k region keys (by post-RoPE score), Saap's classifier ranking against the
   k-means-only ranking (centroid . pre-RoPE query, summed over the group) at equal probes;
3. timing at Llama-3.1-8B shapes (32 query / 8 KV heads, head dim 128, bf16, batch 1) at
   64K / 128K / 256K context: one Saap decode step (classifier, probing, the kernel, the
   merge; eager, host work included) and the kernel alone, with balanced buckets (C = 1024)
   and probes chosen for ~5% selectivity, against dense SDPA decode and FlexAttention decode
   (no mask) over the same cache, in the same run. Each step twice: the torch route (the
   reference: a dozen small launches before the kernel) and the fused route (one Triton launch,
   `SaapDecoder(route="fused", merge="separate")`: 3 launches a step), and the fused route with
   the merge folded into the decode kernel (`merge="fused"`: 2 launches a step), CUDA-graph
   replay and eager; the fused route alone; the kernel alone with either merge; at 128K
   fused-route variants (buckets per route program).

    python benchmarks/bench_saap.py                 # GPU; JSON to $OUT/saap.json when OUT is set
    python benchmarks/bench_saap.py --small         # CPU (TRITON_INTERPRET=1): tiny sizes
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

from sas.methods.saap import (SaapLayer, assign, classifier_probs, fit_layer, group_scores, probe,  # noqa: E402
                              saap_attention_reference)
from sas.methods import saap_runtime  # noqa: E402
from sas.methods.saap_runtime import SaapDecoder  # noqa: E402


def bench_ms(fn, reps: int, graph: bool = False) -> float:
    if not torch.cuda.is_available():
        fn()
        ts = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t) * 1e3)
        return sorted(ts)[1]
    import triton.testing as tt

    if graph:
        try:
            return float(tt.do_bench_cudagraph(fn, rep=reps, return_mode="median"))
        except Exception as e:  # noqa: BLE001 - fall back, but say so
            print(f"    (CUDA graph capture failed: {type(e).__name__}: {str(e)[:160]}; timing eagerly)")
    return float(tt.do_bench(fn, warmup=max(5, reps // 4), rep=reps, return_mode="median"))


def random_layer(hkv, c, d, hidden=64, seed=0, device="cpu") -> SaapLayer:
    g = torch.Generator().manual_seed(seed)
    return SaapLayer(*(torch.randn(*s, generator=g).to(device) for s in
                       ((hkv, c, d), (hkv, d, hidden), (hkv, hidden), (hkv, hidden, c), (hkv, c))))


# --- 1. check ----------------------------------------------------------------------------------------

def check(dev, small: bool) -> list[dict]:
    """Both routes against the float64 reference. A torch-route mismatch stops the run; a
    fused-route failure is reported (and its timings are then not to be trusted)."""
    rows = []
    n, prefill = (40, 32) if small else (640, 600)
    for dtype in (torch.float32, torch.bfloat16):
        g = torch.Generator().manual_seed(0)
        hq, hkv, d, c = 8, 2, 64, 16
        q, k, v = (torch.randn(1, h, n, d, generator=g).to(dtype) for h in (hq, hkv, hkv))
        layer = random_layer(hkv, c, d, seed=1)
        window = 8 if small else 128
        ref = saap_attention_reference(q, k, v, layer, 4, sink=1, window=window, prefill_len=prefill)
        outs = {}
        for route, merge in (("torch", "separate"), ("fused", "separate"), ("fused", "fused")):
            row = {"dtype": str(dtype).replace("torch.", ""), "route": route, "merge": merge, "steps": n - prefill}
            try:
                dec = SaapDecoder(layer.to(dev), 4, sink=1, window=window, max_len=n, rebuild_every=3, route=route,
                                  merge=merge)
                dec.prefill(q[:, :, :prefill].to(dev), k[:, :, :prefill].to(dev), v[:, :, :prefill].to(dev))
                err, looked_ok, steps = 0.0, True, []
                for i in range(prefill, n):
                    o = dec.decode(q[:, :, i:i + 1].to(dev), k[:, :, i:i + 1].to(dev), v[:, :, i:i + 1].to(dev))
                    steps.append(o.cpu())
                    err = max(err, float((o.double().cpu() - ref.out[:, :, i:i + 1]).abs().max()))
                    looked_ok &= bool(torch.equal(dec.last_looked_up.cpu(), ref.looked_up[i]))
                tol = 1e-3 if dtype == torch.float32 else 3e-2
                row.update({"max_abs_err": err, "looked_up_exact": looked_ok, "ok": err < tol and looked_ok})
                outs[route, merge] = torch.cat(steps, 2)
                if merge == "fused" and (route, "separate") in outs:   # the same merge code: the same bits
                    row["bit_identical_to_separate_merge"] = bool(torch.equal(outs[route, merge],
                                                                              outs[route, "separate"]))
                    row["ok"] &= row["bit_identical_to_separate_merge"]
            except Exception as e:  # noqa: BLE001 - the fused route is reported, the torch route stops the run
                row.update({"ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            print(f"check {row}")
            if not row["ok"] and route == "torch":
                raise SystemExit(f"Saap kernel disagrees with the reference: {row}")
            rows.append(row)
    return rows


# --- 2. recall on SmolLM2 ---------------------------------------------------------------------------

def recall(dev, small: bool, layers: list[int], topk: int) -> list[dict]:
    from sas.evaluation.text import corpus_tokens
    from sas.methods.saap_train import capture_qk
    from sas.models import load_model

    n = 512 if small else 4096
    model, tok = load_model("default", dtype=torch.float32, device=dev)
    ids = torch.tensor([corpus_tokens(tok, n)], device=dev)
    cap = capture_qk(model, ids, layers)
    half = n // 2
    sink, window = 1, 64 if small else 256
    clusters = 16 if small else 64
    out = []
    for li in layers:
        c = cap[li]
        hq, hkv = c.q_pre.shape[0], c.k_pre.shape[0]
        gsz = hq // hkv
        layer = fit_layer(c.q_pre[:, :half], c.k_pre[:, :half], c.q_post[:, :half], c.k_post[:, :half], hkv,
                          clusters, sink=sink, window=window, hidden=128, steps=100 if small else 400, seed=li)
        bk = assign(c.k_pre, layer.centroids)                       # [Hkv, N]
        qpos = torch.arange(half + window, n, max(1, (n - half - window) // 64))
        for ell in sorted({1, 2, 4, 8, 16} & set(range(1, clusters + 1))):
            res = {}
            for method in ("saap", "kmeans"):
                looked, hits, tot = 0.0, 0, 0
                for i in qpos.tolist():
                    region = torch.arange(sink, i - window + 1)
                    qi = c.q_pre[:, i][None, :, None]                # [1, Hq, 1, D]
                    if method == "saap":
                        sc = group_scores(qi, layer.classifier, hkv)[0]
                    else:
                        qq = c.q_pre[:, i].reshape(hkv, gsz, -1)
                        sc = torch.einsum("hgd,hcd->hc", qq, layer.centroids)
                    top = probe(sc[None], ell)[0]                    # [Hkv, ell]
                    sel = (bk[:, region][..., None] == top[:, None, :]).any(-1)   # [Hkv, R]
                    looked += float(sel.float().mean())
                    s = torch.einsum("hd,hrd->hr", c.q_post[:, i], c.k_post[:, region].repeat_interleave(gsz, 0))
                    kk = min(topk, region.numel())
                    best = s.topk(kk, dim=-1).indices                 # [Hq, kk]
                    hits += int(sel.repeat_interleave(gsz, 0).gather(1, best).sum())
                    tot += best.numel()
                res[method] = {"fraction_looked_up": looked / len(qpos), "recall_topk": hits / tot}
            row = {"layer": li, "probes": ell, "clusters": clusters, "topk": topk, "window": window, **res}
            print(f"recall layer {li} probes {ell}: saap {res['saap']['fraction_looked_up']:.3f} looked up, "
                  f"recall {res['saap']['recall_topk']:.3f}; k-means-only recall {res['kmeans']['recall_topk']:.3f} "
                  f"at {res['kmeans']['fraction_looked_up']:.3f}")
            out.append(row)
    return out


# --- 3. timing -----------------------------------------------------------------------------------------

def copy_bandwidth(dev) -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read plus written)."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    ms = bench_ms(lambda: b.copy_(a), 200)
    return 2 * a.numel() / (ms * 1e-3)


def timing(dev, small: bool, contexts: list[int], flex_contexts: set[int], reps: int, split: int,
           variant_contexts: set[int] = frozenset()) -> list[dict]:
    hq, hkv, d, c = (8, 2, 64, 32) if small else (32, 8, 128, 1024)
    dtype = torch.bfloat16
    window = 64 if small else 2047
    out = []
    bandwidth = copy_bandwidth(dev) if dev.type == "cuda" else None
    flex_fn = None
    if flex_contexts and dev.type == "cuda":
        try:
            from torch.nn.attention.flex_attention import flex_attention
            flex_fn = torch.compile(flex_attention)
        except Exception as e:  # noqa: BLE001 - FlexAttention is a baseline only: report and go on
            print(f"FlexAttention unavailable: {type(e).__name__}: {e}")
    for n in contexts:
        target = 0.05
        probes = max(1, round((target * n - window - 1) / (n / c)))
        g = torch.Generator(device="cpu").manual_seed(n)
        k = torch.randn(1, hkv, n, d, generator=g).to(dev, dtype)
        v = torch.randn(1, hkv, n, d, generator=g).to(dev, dtype)
        q = torch.randn(1, hq, 1, d, generator=g).to(dev, dtype)
        # balanced buckets (the kernel does not care how they were made): a random permutation
        perm = torch.stack([torch.randperm(n, generator=g) for _ in range(hkv)])[None]
        buckets = (perm % c).to(dev)
        layer = random_layer(hkv, c, d, hidden=256, seed=1, device=dev)
        dec = SaapDecoder(layer, probes, sink=1, window=window, max_len=n, rebuild_every=1 << 30, split=split,
                          route="torch", merge="separate")
        dec.fill(k, v, buckets, n - 1)
        decf = SaapDecoder(layer, probes, sink=1, window=window, max_len=n, rebuild_every=1 << 30, split=split,
                           route="fused", merge="separate")
        decf.fill(k, v, buckets, n - 1)
        decm = SaapDecoder(layer, probes, sink=1, window=window, max_len=n, rebuild_every=1 << 30, split=split,
                           route="fused", merge="fused")
        decm.fill(k, v, buckets, n - 1)
        knew, vnew = k[:, :, n - 1:n].clone(), v[:, :, n - 1:n].clone()   # a new token's k, v (contiguous)

        def saap_step():
            dec.length = n - 1
            return dec.decode(q, knew, vnew)

        def fused_step():
            decf.length = n - 1
            return decf.decode(q, knew, vnew)

        def merged_step():
            decm.length = n - 1
            return decm.decode(q, knew, vnew)

        o = saap_step()
        looked = float(dec.last_looked_up.float().mean())
        probed = probe(group_scores(q, layer.classifier, hkv), probes)
        mask = dec.probed_mask(probed)
        fused_error = None
        try:
            of = fused_step()
            probed_f = decf._last_step[1].long().clone()
            fused_same = {"probed_equal": bool(torch.equal(probed_f, probed)),
                          "probed_set_equal": bool(torch.equal(probed_f.sort(-1).values, probed.sort(-1).values)),
                          "new_key_bucket_equal": bool(torch.equal(decf.bucket_of[..., n - 1],
                                                                   dec.bucket_of[..., n - 1])),
                          "max_abs_diff_vs_torch_route": float((of.float() - o.float()).abs().max()),
                          "looked_up_equal": bool(torch.equal(decf.last_looked_up, dec.last_looked_up))}
            print(f"fused route at {n}: {fused_same}")
        except Exception as e:  # noqa: BLE001 - report and time the rest
            fused_error = f"{type(e).__name__}: {str(e)[:300]}"
            fused_same = {}
            print(f"fused route failed at {n}: {fused_error}")
        merged_error = None
        try:
            om = merged_step()
            merged_same = {"bit_identical_to_separate_merge": bool(torch.equal(om, of)) if not fused_error else None,
                           "probed_equal": bool(torch.equal(decm._last_step[1].long(), probed)),
                           "max_abs_diff_vs_torch_route": float((om.float() - o.float()).abs().max()),
                           "counters_reset": not bool(decm._merge_counter.any())}
            print(f"fused route + fused merge at {n}: {merged_same}")
        except Exception as e:  # noqa: BLE001 - report and time the rest
            merged_error = f"{type(e).__name__}: {str(e)[:300]}"
            merged_same = {}
            print(f"fused merge failed at {n}: {merged_error}")
        kernel_only = lambda: dec.attend(q, probed, mask, n - 1)  # noqa: E731
        kernel_merged = lambda: decm.attend(q, probed, mask, n - 1)  # noqa: E731
        # the same selection, dense over the allowed keys, as a check at full size
        allowed = torch.zeros(1, hkv, n, dtype=torch.bool, device=dev)
        allowed[..., :1] = True
        allowed[..., n - window:] = True
        allowed |= mask.long().gather(2, buckets.long()).bool() & (torch.arange(n, device=dev) < n - window)
        gsz = hq // hkv
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.float(), k.float().repeat_interleave(gsz, 1), v.float().repeat_interleave(gsz, 1),
            attn_mask=allowed.repeat_interleave(gsz, 1)[:, :, None, :])
        err = float((o.float() - ref).abs().max())
        # dense decode baseline: the G query heads of a KV head as G query rows (exact for one
        # decode token, every key visible; plain MHA shapes, so SDPA picks its flash kernel)
        qg = q.reshape(1, hkv, gsz, d)
        sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(qg, k, v)  # noqa: E731
        sdpa_gqa = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
        row = {"context": n, "split": split, "heads": hq, "kv_heads": hkv, "head_dim": d, "clusters": c,
               "probes": probes, "window": window, "keys_looked_up": looked, "selectivity": looked / n,
               "max_abs_err_vs_masked_sdpa": err, "kv_bytes_dense": 2 * k.numel() * k.element_size(),
               "timing": "CUDA-graph replay of one step at position n-1 (triton do_bench_cudagraph, median); "
                         "*_eager_ms: eager calls (Saap: with its host work); Flex: eager call of the compiled function"}
        # eager timings first: a failed graph capture must not spoil them
        row["saap_step_eager_ms"] = bench_ms(saap_step, reps)
        row["fused"] = fused_same
        if fused_error:
            row["fused_error"] = fused_error
        else:
            row["fused_step_eager_ms"] = bench_ms(fused_step, reps)
        row["fused_merge"] = merged_same
        if merged_error:
            row["fused_merge_error"] = merged_error
        else:
            row["merged_step_eager_ms"] = bench_ms(merged_step, reps)
        row["sdpa_dense_eager_ms"] = bench_ms(sdpa, reps)
        if flex_fn is not None and n in flex_contexts:
            try:
                flex_fn(qg, k, v)   # compile outside the timing
                row["flex_dense_ms"] = bench_ms(lambda: flex_fn(qg, k, v), reps)
            except Exception as e:  # noqa: BLE001
                row["flex_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        row["saap_step_ms"] = bench_ms(saap_step, reps, graph=True)
        row["saap_kernel_ms"] = bench_ms(kernel_only, reps, graph=True)
        if not fused_error:
            try:
                row["fused_step_ms"] = bench_ms(fused_step, reps, graph=True)
                row["fused_route_ms"] = bench_ms(lambda: decf.route_step(q, knew, knew, vnew, n - 1), reps,
                                                 graph=True)
                if n in variant_contexts:
                    base = saap_runtime.ROUTE_BLOCK_C
                    row["fused_step_ms_by_route_block_c"] = {}
                    for bc in (32, 64, 128, 256):
                        saap_runtime.ROUTE_BLOCK_C = bc
                        try:
                            fused_step()
                            row["fused_step_ms_by_route_block_c"][bc] = bench_ms(fused_step, reps, graph=True)
                        except Exception as e:  # noqa: BLE001
                            row["fused_step_ms_by_route_block_c"][bc] = f"{type(e).__name__}: {str(e)[:160]}"
                    saap_runtime.ROUTE_BLOCK_C = base
            except Exception as e:  # noqa: BLE001
                row["fused_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                print(f"fused timing failed at {n}: {row['fused_error']}")
        if not merged_error:
            try:
                row["merged_step_ms"] = bench_ms(merged_step, reps, graph=True)
                row["merged_kernel_ms"] = bench_ms(kernel_merged, reps, graph=True)
                merged_step()   # after the timings: the counters must be back at 0
                row["fused_merge"]["counters_reset_after_timing"] = not bool(decm._merge_counter.any())
            except Exception as e:  # noqa: BLE001
                row["fused_merge_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                print(f"fused merge timing failed at {n}: {row['fused_merge_error']}")
        row["sdpa_dense_ms"] = bench_ms(sdpa, reps, graph=True)
        row["sdpa_enable_gqa_ms"] = bench_ms(sdpa_gqa, reps, graph=True)
        best = min(row["sdpa_dense_ms"], row["sdpa_enable_gqa_ms"])     # the faster SDPA form is the baseline
        row["sdpa_best_ms"] = best
        row["speedup_step_vs_sdpa"] = best / row["saap_step_ms"]
        row["speedup_kernel_vs_sdpa"] = best / row["saap_kernel_ms"]
        if "fused_step_ms" in row:
            row["speedup_fused_step_vs_sdpa"] = best / row["fused_step_ms"]
            row["fused_max_abs_err_vs_masked_sdpa"] = float((of.float() - ref).abs().max())
        if "merged_step_ms" in row:
            row["speedup_merged_step_vs_sdpa"] = best / row["merged_step_ms"]
            row["speedup_merged_kernel_vs_sdpa"] = best / row["merged_kernel_ms"]
            row["merged_max_abs_err_vs_masked_sdpa"] = float((om.float() - ref).abs().max())
        if bandwidth:
            row["dense_hbm_floor_ms"] = row["kv_bytes_dense"] / bandwidth * 1e3
        print(f"timing {row}")
        out.append(row)
        del k, v, dec, decf, decm
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny sizes (CPU, TRITON_INTERPRET=1)")
    ap.add_argument("--no-model", action="store_true", help="skip the SmolLM2 recall part")
    ap.add_argument("--flex-contexts", default="131072", help="contexts timed with FlexAttention ('' for none; "
                    "each compiles once)")
    ap.add_argument("--contexts", default=None, help="comma list of context lengths (default 64K,128K,256K)")
    ap.add_argument("--layers", default="4,12,20", help="SmolLM2 layers for the recall part")
    ap.add_argument("--topk", type=int, default=32)
    ap.add_argument("--variant-contexts", default="131072", help="contexts where fused-route variants are timed")
    ap.add_argument("--no-check", action="store_true", help="skip the correctness check against the reference")
    ap.add_argument("--split", type=int, default=1, help="pieces per probed bucket (kernel programs)")
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    small = args.small or dev.type != "cuda"
    contexts = ([int(x) for x in args.contexts.split(",")] if args.contexts else
                ([1024, 2048] if small else [65536, 131072, 262144]))
    report = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (interpreter)",
              "torch": torch.__version__, "small": small}
    out = os.environ.get("OUT")

    def save() -> None:   # after each part, so a run cut short keeps what it measured
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / "saap.json").write_text(json.dumps(report, indent=1))

    flex_contexts = {int(x) for x in args.flex_contexts.split(",") if x}
    variant_contexts = {int(x) for x in args.variant_contexts.split(",") if x}
    report["timing"] = timing(dev, small, contexts, flex_contexts, 20 if small else 200, args.split, variant_contexts)
    save()
    if not args.no_check:
        report["check"] = check(dev, small)
        save()
    if not args.no_model:
        try:
            report["recall"] = recall(dev, small, [int(x) for x in args.layers.split(",")], args.topk)
        except Exception as e:  # noqa: BLE001 - the model may be absent: report why
            report["recall_error"] = f"{type(e).__name__}: {e}"
            print(f"recall skipped: {report['recall_error']}")
    save()
    print("\ncontext | probes | selectivity | torch-route step ms (eager) | fused step ms (eager) | "
          "fused+merge step ms (eager) | fused route ms | kernel ms | kernel+merge ms | "
          "SDPA ms (MHA form / enable_gqa) | Flex ms | dense HBM floor ms | torch-route x | fused x | fused+merge x | "
          "kernel x | kernel+merge x")
    for r in report["timing"]:
        print(f"{r['context']} | {r['probes']} | {r['selectivity']:.3f} | {r['saap_step_ms']:.4f} "
              f"({r['saap_step_eager_ms']:.4f}) | {r.get('fused_step_ms', math.nan):.4f} "
              f"({r.get('fused_step_eager_ms', math.nan):.4f}) | {r.get('merged_step_ms', math.nan):.4f} "
              f"({r.get('merged_step_eager_ms', math.nan):.4f}) | {r.get('fused_route_ms', math.nan):.4f} | "
              f"{r['saap_kernel_ms']:.4f} | {r.get('merged_kernel_ms', math.nan):.4f} | "
              f"{r['sdpa_dense_ms']:.4f} / {r['sdpa_enable_gqa_ms']:.4f} | "
              f"{r.get('flex_dense_ms', math.nan):.4f} | {r.get('dense_hbm_floor_ms', math.nan):.4f} | "
              f"{r['speedup_step_vs_sdpa']:.2f} | {r.get('speedup_fused_step_vs_sdpa', math.nan):.2f} | "
              f"{r.get('speedup_merged_step_vs_sdpa', math.nan):.2f} | {r['speedup_kernel_vs_sdpa']:.2f} | "
              f"{r.get('speedup_merged_kernel_vs_sdpa', math.nan):.2f}")
    for r in report["timing"]:
        print(f"{r['context']}: fused merge {r.get('fused_merge')} {r.get('fused_merge_error', '')}")
    for r in report.get("check", []):
        print(f"check {r['dtype']} route={r['route']} merge={r['merge']}: ok={r['ok']} "
              f"err={r.get('max_abs_err', math.nan):.2e} bit_identical={r.get('bit_identical_to_separate_merge')} "
              f"{r.get('error', '')}")
    for r in report.get("recall", []):
        print(f"recall L{r['layer']} probes {r['probes']}: saap {r['saap']['fraction_looked_up']:.3f} -> "
              f"{r['saap']['recall_topk']:.3f} | k-means {r['kmeans']['fraction_looked_up']:.3f} -> "
              f"{r['kmeans']['recall_topk']:.3f}")


if __name__ == "__main__":
    main()
