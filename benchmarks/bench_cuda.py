"""The CUDA backend on the GPU: correctness against the exact mask, then the kernel table of
docs/benchmarks.md with a CUDA column (SDPA, Flex, sas Triton and sas CUDA in the same run).

Correctness (`--check`): for the six Table-1 patterns at small scale (tests/helpers/table1.py,
32-token blocks), at their real scale (examples/*.py, N = 2048) and for causal compositions drawn
by hypothesis (tests/strategies.py, derandomized: the same ones every run), prefill (square and suffix
queries, lengths not a multiple of 64) and several decode steps over the compact cache (filled
from the prompt, then appended token by token), bf16 / fp16, head dims 64 / 128, MHA and GQA;
each compared with a float32 softmax over `pattern.to_mask(n)` (the oracle, never the IR).

Timing (default): for the Table-1 patterns plus causal at the given lengths, 64 heads, head dim
128, bf16, batch 1: prefill and decode (one token at position N - 1, CUDA-graph replay, the new
token's store included), and GQA decode (32 / 8 heads, batch 16, largest N). The CUDA libraries
are built first, in parallel (nvcc runs in threads). Medians in ms; ratios CUDA / Triton.

    python benchmarks/bench_cuda.py --check --out results/cuda      # correctness, then timing
    python benchmarks/bench_cuda.py --lengths 16384 --sweep       # plus block_n / split choices
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import sys
import time
import traceback
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "helpers"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from sas.codegen.cuda_backend import uses_wgmma  # noqa: E402
from sas.runtime.cuda import DECODE_KERNELS  # noqa: E402
from bench_kernels import (CAUSAL, PATTERNS, copy_bandwidth, flex_masks, load_pattern, median_ms,  # noqa: E402
                           paired_ms, rel_err, write_results)

from sas.errors import SASError  # noqa: E402
from sas.runtime import SASAttnKernel  # noqa: E402


# --- correctness ---------------------------------------------------------------------------------

def reference(q, k, v, mask):
    """float32 softmax attention of q [B, H, Lq, D] over k, v [B, Hkv, Lk, D] with a boolean
    mask [Lq, Lk]; rows attending nothing give 0."""
    H, Hkv = q.shape[1], k.shape[1]
    k = k.float().repeat_interleave(H // Hkv, 1)
    v = v.float().repeat_interleave(H // Hkv, 1)
    s = (q.float() @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return p @ v


def check_pattern(name, kern, n, dtype, D, B, H, Hkv, steps, dev, results):
    pattern = kern.pattern
    mask = torch.as_tensor(pattern.to_mask(n + steps), device=dev)
    tol = 2e-2
    g = torch.Generator(device=dev).manual_seed(zlib.crc32(f"{name} {n} {D}".encode()))
    L = n + steps
    q = torch.randn(B, H, L, D, device=dev, dtype=dtype, generator=g)
    k = torch.randn(B, Hkv, L, D, device=dev, dtype=dtype, generator=g)
    v = torch.randn(B, Hkv, L, D, device=dev, dtype=dtype, generator=g)
    cases = []
    # prefill: the square prompt, and suffix queries (the last 37 of n), every tile shape
    lq = min(37, n)
    bm0 = kern.runtime.block_m
    shapes = ((64, 64), (64, 32), (128, 64), (128, 32)) + (((128, 128),) if uses_wgmma(kern.runtime.arch) else ())
    for bm, bn in shapes:
        kern.runtime.block_m, kern.runtime.block_n = bm, bn
        out = kern(q[:, :, :n], k[:, :, :n], v[:, :, :n])
        ref = reference(q[:, :, :n], k[:, :, :n], v[:, :, :n], mask[:n, :n])
        cases.append((f"prefill_{bm}x{bn}", (out.float() - ref).abs().max().item()))
        out = kern(q[:, :, n - lq:n], k[:, :, :n], v[:, :, :n])
        ref = reference(q[:, :, n - lq:n], k[:, :, :n], v[:, :, :n], mask[n - lq:n, :n])
        cases.append((f"prefill_suffix_{bm}x{bn}", (out.float() - ref).abs().max().item()))
    kern.runtime.block_m, kern.runtime.block_n = bm0, None
    # decode: the prompt's cache, then `steps` tokens, with each decode kernel
    if kern.plan.can_decode and not kern.runtime.source.decode:
        print(f"check {name:22s} n={n:5d}: no CUDA decode ({kern.runtime.source.decode_note[:120]})", flush=True)
    elif kern.plan.can_decode:
        kernel0 = kern.runtime.decode_kernel
        for which in DECODE_KERNELS:
            kern.runtime.decode_kernel = which
            kc, vc = kern.new_cache(B, Hkv, D, dtype, dev)
            kern.fill_cache(k[:, :, :n], v[:, :, :n], kc, vc)
            err = 0.0
            for p in range(n, n + steps):
                o = kern(q[:, :, p:p + 1], k[:, :, p:p + 1], v[:, :, p:p + 1], kc, vc, position=p)
                r = reference(q[:, :, p:p + 1], k[:, :, :p + 1], v[:, :, :p + 1], mask[p:p + 1, :p + 1])
                err = max(err, (o.float() - r).abs().max().item())
            cases.append((f"decode_{which}", err))
        kern.runtime.decode_kernel = kernel0
    for what, err in cases:
        ok = err < tol
        results.append({"pattern": name, "n": n, "dtype": str(dtype).removeprefix("torch."), "head_dim": D,
                        "batch": B, "q_heads": H, "kv_heads": Hkv, "case": what, "max_abs_err": err, "ok": ok})
        print(f"check {name:22s} n={n:5d} {str(dtype):15s} D={D:3d} B={B} H={H}/{Hkv} {what:15s} "
              f"max|err| {err:.2e} {'ok' if ok else 'FAIL'}", flush=True)


def drawn_patterns(count):
    """`count` static causal compositions drawn by the test suite's strategy (hypothesis,
    derandomized: the same patterns every run)."""
    from hypothesis import HealthCheck, given, settings
    from strategies import causal_patterns

    drawn = []

    @settings(max_examples=4 * count, deadline=None, suppress_health_check=list(HealthCheck), database=None,
              derandomize=True)
    @given(causal_patterns(max_depth=3))
    def collect(p):
        drawn.append(p)

    collect()
    return [p for p in drawn if not p.dynamics()][:count]


def run_checks(dev):
    from table1 import TABLE1_KERNELS

    results = []
    configs = [(torch.bfloat16, 128, 1, 4, 4), (torch.float16, 64, 2, 8, 2), (torch.bfloat16, 64, 1, 16, 2),
               (torch.float16, 128, 2, 6, 3)]
    small = {name: SASAttnKernel(p, max_len=512, backend="cuda") for name, p in TABLE1_KERNELS.items()}
    real = {name: SASAttnKernel(load_pattern(name), max_len=2050, backend="cuda") for name in PATTERNS}
    for i, p in enumerate(drawn_patterns(12)):
        try:
            small[f"drawn_{i}"] = SASAttnKernel(p, max_len=512, backend="cuda")
        except SASError as e:   # a composition the analysis refuses is not a kernel case
            print(f"check drawn_{i}: not analysed ({str(e)[:120]}): {p!r}", flush=True)
    jobs = [(kern, dtype, D) for kern in small.values() for dtype, D, *_ in configs]
    jobs += [(kern, torch.bfloat16, 128) for kern in real.values()]
    t = time.time()
    with ThreadPoolExecutor(max_workers=16) as ex:
        list(ex.map(lambda j: j[0].runtime.ensure_built(j[1], j[2]), jobs))
    print(f"# built {len(jobs)} CUDA libraries for the checks in {time.time() - t:.1f} s", flush=True)
    for name, kern in small.items():
        for dtype, D, B, H, Hkv in configs:
            for n in (200, 333):
                try:
                    check_pattern(name, kern, n, dtype, D, B, H, Hkv, 5, dev, results)
                except Exception as e:  # noqa: BLE001 - report and go on
                    traceback.print_exc()
                    results.append({"pattern": name, "n": n, "case": "error", "ok": False, "error": repr(e)[:300]})
    for name, kern in real.items():
        try:
            check_pattern(name, kern, 2047, torch.bfloat16, 128, 1, 8, 8, 3, dev, results)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            results.append({"pattern": name, "n": 2047, "case": "error", "ok": False, "error": repr(e)[:300]})
    bad = [r for r in results if not r["ok"]]
    print(f"# correctness: {len(results) - len(bad)}/{len(results)} cases ok", flush=True)
    return results


# --- timing --------------------------------------------------------------------------------------

SPLIT_CHOICES = ((2, 128), (4, 64), (8, 64), (8, 32))


def decode_sweep(name, ck, qd, kd, vd, N, rep, dtype, dev):
    """CUDA decode time of each decode kernel under a few split choices (loader.DECODE_WAVES and
    DECODE_WAVES_MHA / DECODE_MIN_SLOTS)."""
    out = []
    mod = ck.runtime.loader
    saved = (mod.DECODE_WAVES, mod.DECODE_WAVES_MHA, mod.DECODE_MIN_SLOTS, ck.runtime.decode_kernel)
    kc, vc = ck.new_cache(qd.shape[0], kd.shape[1], qd.shape[3], dtype, dev)
    kc.normal_()
    vc.normal_()
    o = torch.empty_like(qd)
    for which in DECODE_KERNELS:
        for waves, min_slots in SPLIT_CHOICES:
            what = f"decode {which} B={qd.shape[0]} Hq={qd.shape[1]} waves={waves} min_slots={min_slots}"
            try:
                mod.DECODE_WAVES, mod.DECODE_WAVES_MHA, mod.DECODE_MIN_SLOTS = waves, waves, min_slots
                ck.runtime.decode_kernel = which
                ms = median_ms(lambda: ck.runtime.decode(qd, kd, vd, kc, vc, N - 1, out=o), True, rep)
                out.append({"pattern": name, "N": N, "what": what, "ms": ms})
                print(f"sweep N={N} {name:20s} {what} {ms:8.4f} ms", flush=True)
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                out.append({"pattern": name, "N": N, "what": what, "error": repr(e)[:300]})
    mod.DECODE_WAVES, mod.DECODE_WAVES_MHA, mod.DECODE_MIN_SLOTS, ck.runtime.decode_kernel = saved
    return out


def prebuild(kernels, dtype, D):
    """Build every CUDA kernel's library for (dtype, D) in parallel (nvcc in threads)."""
    t = time.time()
    with ThreadPoolExecutor(max_workers=16) as ex:
        list(ex.map(lambda kern: kern.runtime.ensure_built(dtype, D), kernels))
    print(f"# built {len(kernels)} CUDA libraries in {time.time() - t:.1f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="path prefix for .json and .md results")
    ap.add_argument("--check", action="store_true", help="correctness against the exact mask first")
    ap.add_argument("--lengths", default="2048,8192,16384")
    ap.add_argument("--patterns", default=",".join(PATTERNS + [CAUSAL]))
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--rep", type=int, default=100, help="timing window per measurement, ms")
    ap.add_argument("--rounds", type=int, default=3,
                    help="Triton and CUDA are timed in turn this many times; each reports its median round")
    ap.add_argument("--no-main", action="store_true")
    ap.add_argument("--no-gqa", action="store_true")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--block-n", type=int, default=None, help="CUDA prefill block_n (64 or 32; default: automatic)")
    ap.add_argument("--sweep", action="store_true",
                    help="at the largest length: CUDA prefill with block_n 64 and 32, CUDA decode with a few "
                         "(waves, min_slots) split choices")
    ap.add_argument("--gqa-batch", type=int, default=16)
    ap.add_argument("--baseline-arch", default=None,
                    help="with --sweep: also time the prefill built for this target (e.g. sm_90, the mma.sync "
                         "kernel, against the default sm_90a wgmma kernel on an H100)")
    args = ap.parse_args()

    dev = torch.device("cuda")
    dtype, H, D, rep = torch.bfloat16, args.heads, 128, args.rep
    props = torch.cuda.get_device_properties(dev)
    import triton

    meta = {"device": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
            "triton": triton.__version__, "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "dtype": "bfloat16", "heads": H, "head_dim": D, "rep_ms": rep, "rounds": args.rounds}
    t_start = time.time()
    checks = run_checks(dev) if args.check else []
    bw = copy_bandwidth(dev)
    meta["copy_bandwidth_TBps"] = bw / 1e12
    # the shortest step a CUDA graph replays: one one-element kernel, back to back (what a decode
    # of a tiny cache cannot go below, whatever its bytes)
    tiny = torch.zeros(1, device=dev)
    meta["launch_floor_ms"] = median_ms(lambda: tiny.add_(1.0), True, args.rep)
    print(f"# {props.name}, torch {torch.__version__}, triton {triton.__version__}; copy {bw / 1e12:.2f} TB/s",
          flush=True)
    flex = None
    if not args.no_flex:
        from torch import _dynamo
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        _dynamo.config.cache_size_limit = 512
        if hasattr(_dynamo.config, "accumulated_cache_size_limit"):
            _dynamo.config.accumulated_cache_size_limit = 4096
        flex = torch.compile(flex_attention)
    masks = flex_masks()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    lengths = [int(x) for x in args.lengths.split(",")]
    names = args.patterns.split(",")
    rows, gqa_rows, sweep = [], [], []

    def dump():
        if args.out:
            p = Path(args.out).with_suffix(".partial.json")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps({"meta": meta, "checks": checks, "rows": rows, "gqa": gqa_rows,
                                     "sweep": sweep}, indent=1))

    kernels = {}
    for N in lengths:
        for name in names:
            p = load_pattern(name)
            tk = SASAttnKernel(p, max_len=N)
            ck = SASAttnKernel(plan=tk.plan, backend="cuda")
            if args.block_n:
                ck.runtime.block_n = args.block_n
            kernels[(name, N)] = (tk, ck)
    prebuild([c for _, c in kernels.values()], dtype, D)

    for N in ([] if args.no_main else lengths):
        q = torch.randn(1, H, N, D, device=dev, dtype=dtype)
        k = torch.randn(1, H, N, D, device=dev, dtype=dtype)
        v = torch.randn(1, H, N, D, device=dev, dtype=dtype)
        sdpa_prefill = median_ms(lambda: sdpa(q, k, v, is_causal=True), False, rep)
        qd, kd, vd = (x[:, :, N - 1:N].contiguous() for x in (q, k, v))
        sdpa_decode = median_ms(lambda: sdpa(qd, k, v), True, rep)
        for name in names:
            try:
                tk, ck = kernels[(name, N)]
                C = tk.cache_size
                row = {"pattern": name, "N": N, "cache_size": C, "sdpa_prefill_ms": sdpa_prefill,
                       "sdpa_decode_ms": sdpa_decode, "cuda_block_m": ck.runtime.tile_height(N, N),
                       "cuda_block_n": ck.runtime.tile_width(N, N),
                       "triton_prefill_config": list(dataclasses.astuple(tk.plan.prefill_config(N, N)))}
                t_out = tk(q, k, v)
                c_out = ck(q, k, v)
                row["cuda_prefill_rel_err_vs_triton"] = rel_err(c_out, t_out)
                kc, vc = tk.new_cache(1, H, D, dtype, dev)
                tk.fill_cache(k[:, :, :N - 1], v[:, :, :N - 1], kc, vc)
                kc2, vc2 = kc.clone(), vc.clone()
                t_dec = tk(qd, kd, vd, kc, vc, position=N - 1)
                c_dec = ck(qd, kd, vd, kc2, vc2, position=N - 1)
                row["cuda_decode_rel_err_vs_triton"] = rel_err(c_dec, t_dec)
                if flex is not None:
                    mm = masks[name]
                    bm = create_block_mask(mm, None, None, N, N, device=dev)
                    row["cuda_prefill_rel_err_vs_flex"] = rel_err(c_out, flex(q, k, v, block_mask=bm))
                    row["flex_prefill_ms"] = median_ms(lambda: flex(q, k, v, block_mask=bm), False, rep)
                    dmm = (lambda mm_, off_: (lambda b, h, qi, ki: mm_(b, h, qi + off_, ki)))(mm, N - 1)
                    dbm = create_block_mask(dmm, None, None, 1, N, device=dev)
                    row["cuda_decode_rel_err_vs_flex"] = rel_err(c_dec, flex(qd, k, v, block_mask=dbm))
                    row["flex_decode_ms"] = median_ms(lambda: flex(qd, k, v, block_mask=dbm), True, rep)
                row["triton_prefill_ms"], row["cuda_prefill_ms"] = paired_ms(
                    [lambda: tk(q, k, v), lambda: ck(q, k, v)], False, rep, args.rounds)
                o1, o2 = torch.empty_like(qd), torch.empty_like(qd)
                row["triton_decode_ms"], row["cuda_decode_ms"] = paired_ms(
                    [lambda: tk.runtime.decode(qd, kd, vd, kc, vc, N - 1, out=o1),
                     lambda: ck.runtime.decode(qd, kd, vd, kc2, vc2, N - 1, out=o2)], True, rep, args.rounds)
                row["hbm_floor_decode_ms"] = 2 * C * H * D * 2 / bw * 1e3
                rows.append(row)
                print(_fmt(row), flush=True)
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                rows.append({"pattern": name, "N": N, "error": repr(e)[:300]})
            dump()
        if args.sweep and N == max(lengths):
            for name in names:
                _, ck = kernels[(name, N)]
                old = ck.runtime.block_m, ck.runtime.block_n
                for bm in (64, 128):
                    for bn in (64, 32):
                        what = f"prefill block_m={bm} block_n={bn}"
                        try:
                            ck.runtime.block_m, ck.runtime.block_n = bm, bn
                            ms = median_ms(lambda: ck(q, k, v), False, rep)
                            sweep.append({"pattern": name, "N": N, "what": what, "ms": ms})
                            print(f"sweep N={N} {name:20s} {what} {ms:8.4f} ms", flush=True)
                        except Exception as e:  # noqa: BLE001
                            traceback.print_exc()
                            sweep.append({"pattern": name, "N": N, "what": what, "error": repr(e)[:300]})
                ck.runtime.block_m, ck.runtime.block_n = old
                if args.baseline_arch:   # the same plan's prefill built for another target (sm_90: mma.sync)
                    try:
                        from sas.runtime.cuda import CudaRuntime
                        base = CudaRuntime(ck.plan, arch=args.baseline_arch)
                        base.ensure_built(dtype, D)
                        err = rel_err(base.prefill(q, k, v), ck(q, k, v))
                        for bn in (64, 32):
                            base.block_n = bn
                            ms = median_ms(lambda: base.prefill(q, k, v), False, rep)
                            what = f"prefill {args.baseline_arch} block_n={bn}"
                            sweep.append({"pattern": name, "N": N, "what": what, "ms": ms, "rel_err": err})
                            print(f"sweep N={N} {name:20s} {what} {ms:8.4f} ms (rel err {err:.1e})", flush=True)
                    except Exception as e:  # noqa: BLE001
                        traceback.print_exc()
                        sweep.append({"pattern": name, "N": N, "what": f"prefill {args.baseline_arch}",
                                      "error": repr(e)[:300]})
                sweep += decode_sweep(name, ck, qd, kd, vd, N, rep, dtype, dev)
            dump()
        del q, k, v
        torch.cuda.empty_cache()

    if not args.no_gqa:
        N, B, Hq, Hkv = max(lengths), args.gqa_batch, 32, 8
        qd = torch.randn(B, Hq, 1, D, device=dev, dtype=dtype)
        k = torch.randn(B, Hkv, N, D, device=dev, dtype=dtype)
        v = torch.randn(B, Hkv, N, D, device=dev, dtype=dtype)
        kd, vd = k[:, :, N - 1:N].contiguous(), v[:, :, N - 1:N].contiguous()
        sdpa_decode = median_ms(lambda: sdpa(qd, k, v, enable_gqa=True), True, rep)
        for name in names:
            try:
                tk, ck = kernels[(name, N)]
                C = tk.cache_size
                kc, vc = tk.new_cache(B, Hkv, D, dtype, dev)
                tk.fill_cache(k[:, :, :N - 1], v[:, :, :N - 1], kc, vc)
                kc2, vc2 = kc.clone(), vc.clone()
                row = {"pattern": name, "N": N, "batch": B, "q_heads": Hq, "kv_heads": Hkv, "cache_size": C,
                       "sdpa_decode_ms": sdpa_decode}
                t_dec = tk(qd, kd, vd, kc, vc, position=N - 1)
                c_dec = ck(qd, kd, vd, kc2, vc2, position=N - 1)
                row["cuda_decode_rel_err_vs_triton"] = rel_err(c_dec, t_dec)
                if flex is not None:
                    mm = masks[name]
                    dmm = (lambda mm_, off_: (lambda b, h, qi, ki: mm_(b, h, qi + off_, ki)))(mm, N - 1)
                    dbm = create_block_mask(dmm, None, None, 1, N, device=dev)
                    row["cuda_decode_rel_err_vs_flex"] = rel_err(c_dec, flex(qd, k, v, block_mask=dbm,
                                                                              enable_gqa=True))
                    row["flex_decode_ms"] = median_ms(lambda: flex(qd, k, v, block_mask=dbm, enable_gqa=True),
                                                      True, rep)
                o1, o2 = torch.empty_like(qd), torch.empty_like(qd)
                row["triton_decode_ms"], row["cuda_decode_ms"] = paired_ms(
                    [lambda: tk.runtime.decode(qd, kd, vd, kc, vc, N - 1, out=o1),
                     lambda: ck.runtime.decode(qd, kd, vd, kc2, vc2, N - 1, out=o2)], True, rep, args.rounds)
                row["hbm_floor_decode_ms"] = 2 * C * B * Hkv * D * 2 / bw * 1e3
                gqa_rows.append(row)
                print("GQA " + _fmt(row), flush=True)
                if args.sweep:
                    sweep += decode_sweep(name, ck, qd, kd, vd, N, rep, dtype, dev)
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                gqa_rows.append({"pattern": name, "N": N, "error": repr(e)[:300]})
            dump()

    meta["total_seconds"] = round(time.time() - t_start, 1)
    summary = _summary(rows, gqa_rows)
    md = _markdown(meta, checks, rows, gqa_rows, sweep, summary)
    print()
    print(md)
    write_results(args.out, {"meta": meta, "checks": checks, "rows": rows, "gqa": gqa_rows, "sweep": sweep,
                             "summary": summary}, md, indent=1)


def _fmt(r):
    f = lambda k: f"{r[k]:8.4f}" if k in r else "     n/a"  # noqa: E731
    pre = (f"| prefill sdpa {f('sdpa_prefill_ms')} flex {f('flex_prefill_ms')} triton {f('triton_prefill_ms')} "
           f"cuda {f('cuda_prefill_ms')} ") if "cuda_prefill_ms" in r else ""
    return (f"N={r['N']:6d} {r['pattern']:20s} C={r['cache_size']:6d} {pre}| decode sdpa {f('sdpa_decode_ms')} "
            f"flex {f('flex_decode_ms')} triton {f('triton_decode_ms')} cuda {f('cuda_decode_ms')} "
            f"floor {f('hbm_floor_decode_ms')} | err vs triton "
            f"{r.get('cuda_prefill_rel_err_vs_triton', float('nan')):.1e}/{r.get('cuda_decode_rel_err_vs_triton', float('nan')):.1e}")


def _geomean(xs):
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def _summary(rows, gqa_rows):
    s = {}
    rows = [r for r in rows if "cuda_decode_ms" in r]
    for N in sorted({r["N"] for r in rows}):
        rs = [r for r in rows if r["N"] == N and r["pattern"] in PATTERNS]
        s[f"cuda_over_triton_prefill_geomean_{N}"] = _geomean([r["cuda_prefill_ms"] / r["triton_prefill_ms"] for r in rs])
        s[f"cuda_over_triton_decode_geomean_{N}"] = _geomean([r["cuda_decode_ms"] / r["triton_decode_ms"] for r in rs])
    small = [r for r in rows if r["cache_size"] <= 1100]
    s["cuda_over_triton_decode_geomean_caches_le_1100"] = _geomean(
        [r["cuda_decode_ms"] / r["triton_decode_ms"] for r in small])
    g = [r for r in gqa_rows if "cuda_decode_ms" in r]
    if g:
        s["gqa_cuda_over_triton_decode_geomean"] = _geomean([r["cuda_decode_ms"] / r["triton_decode_ms"] for r in g])
    # issue 11's targets, on the CUDA backend
    for N in sorted({r["N"] for r in rows}):
        rs = [r for r in rows if r["N"] == N]
        causal = [r for r in rs if r["pattern"] == CAUSAL]
        if causal:
            s[f"cuda_causal_prefill_over_sdpa_{N}"] = causal[0]["cuda_prefill_ms"] / causal[0]["sdpa_prefill_ms"]
        t1 = [r for r in rs if r["pattern"] in PATTERNS and "flex_prefill_ms" in r]
        if t1:
            ups = [r["flex_prefill_ms"] / r["cuda_prefill_ms"] for r in t1]
            s[f"table1_prefill_flex_over_cuda_geomean_{N}"] = _geomean(ups)
            s[f"table1_prefill_flex_over_cuda_min_{N}"] = min(ups)
            dec = [r for r in t1 if "flex_decode_ms" in r]
            s[f"table1_decode_flex_over_cuda_geomean_{N}"] = _geomean([r["flex_decode_ms"] / r["cuda_decode_ms"]
                                                                       for r in dec])
            s[f"all_decode_flex_over_cuda_geomean_{N}"] = _geomean([r["flex_decode_ms"] / r["cuda_decode_ms"]
                                                                    for r in rs if "flex_decode_ms" in r])
        for r in rs:
            if r["N"] == max(x["N"] for x in rows) and "hbm_floor_decode_ms" in r:
                s[f"cuda_decode_over_floor_{r['pattern']}_{N}"] = r["cuda_decode_ms"] / r["hbm_floor_decode_ms"]
    return s


def _markdown(meta, checks, rows, gqa_rows, sweep, summary):
    g = lambda r, k: f"{r[k]:.4f}" if k in r else "n/a"  # noqa: E731
    x = lambda r: f"{r['cuda_prefill_ms'] / r['triton_prefill_ms']:.2f}" if "cuda_prefill_ms" in r else "n/a"  # noqa: E731
    y = lambda r: f"{r['cuda_decode_ms'] / r['triton_decode_ms']:.2f}" if "cuda_decode_ms" in r else "n/a"  # noqa: E731
    lines = ["# sas CUDA backend vs sas Triton, FlexAttention and SDPA", "",
             f"{meta['device']} ({meta['sms']} SMs), torch {meta['torch']}, triton {meta['triton']}, {meta['date']}; "
             f"bf16, {meta['heads']} heads, head dim {meta['head_dim']}, batch 1; medians in ms; "
             f"copy bandwidth {meta['copy_bandwidth_TBps']:.2f} TB/s"
             + (f"; one-element kernel in a CUDA graph {meta['launch_floor_ms'] * 1e3:.2f} us"
                if "launch_floor_ms" in meta else "") + ".", ""]
    if checks:
        bad = [c for c in checks if not c["ok"]]
        worst = max((c.get("max_abs_err", 0.0) for c in checks), default=0.0)
        lines += [f"Correctness vs the exact mask: {len(checks) - len(bad)}/{len(checks)} cases within 2e-2 "
                  f"(max abs error {worst:.2e}).", ""]
    lines += ["## Prefill", "", f"Triton and CUDA timed in turn, {meta.get('rounds', 1)} rounds (median round each).", "",
              "| pattern | N | SDPA causal | Flex | Triton | CUDA | CUDA tile | CUDA / Triton |",
              "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "cuda_prefill_ms" in r:
            lines.append(f"| {r['pattern']} | {r['N']} | {g(r, 'sdpa_prefill_ms')} | {g(r, 'flex_prefill_ms')} | "
                         f"{g(r, 'triton_prefill_ms')} | {g(r, 'cuda_prefill_ms')} | "
                         f"{r.get('cuda_block_m')}x{r.get('cuda_block_n')} | {x(r)} |")
    lines += ["", "## Decode (one token at position N - 1, CUDA-graph replay)", "",
              "| pattern | N | cache slots | SDPA dense | Flex | Triton | CUDA | CUDA / Triton | HBM floor |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "cuda_decode_ms" in r:
            lines.append(f"| {r['pattern']} | {r['N']} | {r['cache_size']} | {g(r, 'sdpa_decode_ms')} | "
                         f"{g(r, 'flex_decode_ms')} | {g(r, 'triton_decode_ms')} | {g(r, 'cuda_decode_ms')} | {y(r)} | "
                         f"{g(r, 'hbm_floor_decode_ms')} |")
    if gqa_rows:
        r0 = next((r for r in gqa_rows if "batch" in r), None)
        if r0:
            lines += ["", f"## GQA decode ({r0['q_heads']} query / {r0['kv_heads']} kv heads, batch {r0['batch']}, "
                          f"N = {r0['N']})", "",
                      "| pattern | cache slots | SDPA dense | Flex | Triton | CUDA | CUDA / Triton | HBM floor |",
                      "|---|---|---|---|---|---|---|---|"]
            for r in gqa_rows:
                if "cuda_decode_ms" in r:
                    lines.append(f"| {r['pattern']} | {r['cache_size']} | {g(r, 'sdpa_decode_ms')} | "
                                 f"{g(r, 'flex_decode_ms')} | {g(r, 'triton_decode_ms')} | {g(r, 'cuda_decode_ms')} | "
                                 f"{y(r)} | {g(r, 'hbm_floor_decode_ms')} |")
    if sweep:
        lines += ["", "## CUDA option sweep (largest N)", "", "| pattern | N | choice | ms |", "|---|---|---|---|"]
        lines += [f"| {r['pattern']} | {r['N']} | {r['what']} | {g(r, 'ms')} |" for r in sweep]
    errs = [r for r in rows + gqa_rows if "error" in r]
    lines += ["", "## Summary", ""] + [f"- {k}: {v:.3f}" for k, v in summary.items()]
    lines += [f"- FAILED: {r['pattern']} N={r['N']}: {r['error']}" for r in errs]
    lines += ["", f"Total run {meta['total_seconds']} s.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
