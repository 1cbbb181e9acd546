"""Prefill and decode latency of sas kernels against FlexAttention and SDPA (paper Tables 2, 3).

For the six Table-1 patterns (examples/*.py) at 2K, 8K and 16K, 64 heads, head dim 128,
bf16, batch 1, plus a GQA decode configuration (32 query / 8 KV heads, batch 16):

- prefill: sas block-sparse kernel, torch.compile'd flex_attention with a BlockMask, and
  dense causal SDPA;
- decode (one token at position N - 1, timed by CUDA-graph replay): sas split-K kernel over
  the compact cache (the new token's store included), flex_attention over the dense cache
  with the decode BlockMask, dense SDPA, and the HBM floor = compact K+V cache bytes over the
  measured device copy bandwidth (bytes read + written); the "sas" column is the default
  configuration, which on compute capability 9+ launches a one-launch decode (one split, no
  flags kernel) as a programmatic dependent launch (`DecodeOptions.pdl=None`); on compute
  capability 9+ the sas decode also with every launch a programmatic dependent launch
  (`DecodeOptions(pdl=True)`, column "sas PDL"; its output checked equal to the default
  decode's bit for bit).

Every number is a median. Before timing, each sas output is checked against Flex on the same
inputs (decode: the compact cache is filled from the dense one).

    python benchmarks/bench_kernels.py --out results/bench        # writes .json and .md
    python benchmarks/bench_kernels.py --lengths 16384 --quick     # fewer repetitions
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import runpy
import sys
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sas.codegen.triton_backend import DecodeOptions, PrefillOptions  # noqa: E402
from sas.runtime import SASAttnKernel  # noqa: E402

PATTERNS = ["streaming_llm", "block_local", "sliding_window", "openai_strided", "openai_fixed",
            "strided_block_local"]
#: a fully causal pattern, timed beside the six: its prefill is compared with SDPA's causal kernel
CAUSAL = "causal"


def flex_masks():
    """FlexAttention mask_mods, exactly as in reference-figures.md."""
    return {
        "streaming_llm": lambda b, h, q, k: (q >= k) & ((q - k < 1024) | (k < 32)),
        "block_local": lambda b, h, q, k: (q >= k) & (q // 128 - k // 128 < 3),
        "sliding_window": lambda b, h, q, k: (q >= k) & (q - k < 1024),
        "openai_strided": lambda b, h, q, k: (q >= k) & ((q - k < 512) | ((q - k) % 512 == 0)),
        "openai_fixed": lambda b, h, q, k: (q >= k) & ((q // 256 == k // 256) | (k % 256 >= 224)),
        "strided_block_local": lambda b, h, q, k: (q >= k) & (q // 256 == k // 256) & (q % 4 == 0) & (k % 4 == 0),
        CAUSAL: lambda b, h, q, k: q >= k,
    }


def load_pattern(name: str):
    if name == CAUSAL:
        from sas import Causal

        return Causal()
    path = ROOT / "examples" / f"{name}.py"
    try:
        from sas.lang.loader import load_pattern as loader  # type: ignore

        return loader(path)
    except ImportError:
        return runpy.run_path(str(path))["pattern"]


def median_ms(fn, graph: bool, rep_ms: int) -> float:
    if not torch.cuda.is_available():  # CPU dry run (TRITON_INTERPRET=1): wall clock
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
            return float(tt.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median"))
        except Exception as e:  # noqa: BLE001 - fall back, but say so
            print(f"    (CUDA graph capture failed: {type(e).__name__}: {str(e)[:120]}; timing without)")
    return float(tt.do_bench(fn, warmup=max(5, rep_ms // 4), rep=rep_ms, return_mode="median"))


def checked_ms(label: str, make, ref: torch.Tensor, time_ms, tol: float = 2e-2) -> tuple[float, float] | None:
    """A sweep variant timed only once its output matches `ref`: `make()` gives (step, out);
    `step` runs once, then `time_ms(step)` times it. Returns (ms, max abs error), or None after
    printing why (a wrong output, or an exception: a variant that does not compile is reported,
    not fatal)."""
    try:
        step, out = make()
        step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        err = (out.float() - ref.float()).abs().max().item()
        if not err < tol:
            print(f"  {label}: WRONG (max err {err:.3g})", flush=True)
            return None
        ms = time_ms(step)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - report and go on
        print(f"  {label}: failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
        return None
    return ms, err


def paired_ms(fns, graph: bool, rep: int, rounds: int) -> list[float]:
    """Medians of `fns` measured in turn, `rounds` times over (so clock and thermal drift hit all
    of them alike); each entry is the median of its rounds."""
    times = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            times[i].append(median_ms(fn, graph, rep))
    return [sorted(t)[len(t) // 2] for t in times]


def pdl_decode_ms(pattern, N: int, kern, po, do, args5, dout: torch.Tensor, rep: int) -> float | None:
    """The same decode as programmatic dependent launches (`DecodeOptions.pdl`; compute
    capability 9+): its graph-replay median, after checking it writes `dout` bit for bit.
    None where PDL is not available."""
    dev = dout.device
    if dev.type != "cuda" or torch.cuda.get_device_capability(dev)[0] < 9:
        return None
    q, kd, vd, kc, vc = args5
    group = q.shape[1] // kd.shape[1]
    pk = SASAttnKernel(pattern, max_len=N, prefill_options=po,
                       decode_options=dataclasses.replace(do or kern.plan.decode_config(group), pdl=True))
    out = torch.empty_like(dout)
    pk.runtime.decode(q, kd, vd, kc.clone(), vc.clone(), N - 1, out=out)
    if not torch.equal(out, dout):
        raise RuntimeError(f"{pattern!r}: the PDL decode's output differs from the default decode's")
    return median_ms(lambda: pk.runtime.decode(q, kd, vd, kc, vc, N - 1, out=out), True, rep)


def copy_bandwidth(dev) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus written."""
    n = 1 << 30 if dev.type == "cuda" else 1 << 24
    a = torch.empty(n, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    a.random_(0, 255)
    ms = median_ms(lambda: b.copy_(a), False, 300)
    del a, b
    return 2 * n / (ms * 1e-3)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="path prefix for .json and .md results")
    ap.add_argument("--lengths", default=None,
                    help="comma-separated [default: 2048,8192,16384 on a GPU; 256 for the CPU dry run]")
    ap.add_argument("--patterns", default=",".join(PATTERNS + [CAUSAL]))
    ap.add_argument("--heads", type=int, default=None, help="[default: 64 on a GPU; 2 for the CPU dry run]")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--quick", action="store_true", help="shorter timing (rep 50 ms instead of 200)")
    ap.add_argument("--rep", type=int, default=None, help="timing window per measurement, ms")
    ap.add_argument("--no-gqa", action="store_true")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--prefill-config", default=None, help="block_m,block_n,num_warps,num_stages")
    ap.add_argument("--decode-config", default=None, help="block_n,num_warps,num_stages")
    ap.add_argument("--sweep", action="store_true", help="time a few prefill configs at the largest length")
    ap.add_argument("--sweep-configs", default="128,64,8,3;64,64,4,3;64,64,4,4;64,128,4,3;64,64,8,3;64,32,4,3",
                    help="prefill configs for --sweep: block_m,block_n,num_warps,num_stages;...")
    ap.add_argument("--decode-sweep", action="store_true", help="time decode option variants at the largest length")
    ap.add_argument("--no-main", action="store_true", help="skip the main tables (sweeps only)")
    ap.add_argument("--gqa-batch", type=int, default=16)
    args = ap.parse_args()

    torch.manual_seed(0)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cpu":
        # the Triton interpreter runs a 2K prefill of 64 heads for many minutes per pattern
        if args.lengths is None:
            print("# no GPU: a dry run of the CPU interpreter at 256 tokens and 2 heads, without the GQA table "
                  "(about a minute; timings mean nothing; --lengths / --heads change it)", file=sys.stderr)
            args.lengths, args.no_gqa = "256", True
        args.heads = 2 if args.heads is None else args.heads
    args.lengths = args.lengths or "2048,8192,16384"
    args.heads = args.heads or 64
    dtype = torch.bfloat16
    H, D = args.heads, args.head_dim
    lengths = [int(x) for x in args.lengths.split(",")]
    names = args.patterns.split(",")
    rep = args.rep or (50 if args.quick else 200)
    po = PrefillOptions(*map(int, args.prefill_config.split(","))) if args.prefill_config else None
    do = DecodeOptions(*map(int, args.decode_config.split(","))) if args.decode_config else None
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        dev_name, sms = props.name, props.multi_processor_count
    else:
        dev_name, sms = "cpu (interpreter dry run)", 0
    import triton

    meta = {
        "device": dev_name, "sms": sms, "torch": torch.__version__,
        "triton": triton.__version__, "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "dtype": "bfloat16", "heads": H, "head_dim": D, "prefill_options": dataclasses.asdict(po) if po else "auto (per pattern and length)",
        "decode_options": dataclasses.asdict(do) if do else "auto (per pattern and query group)",
    }
    t_start = time.time()
    bw = copy_bandwidth(dev)
    meta["copy_bandwidth_TBps"] = bw / 1e12
    print(f"# {dev_name}, torch {torch.__version__}, triton {triton.__version__}; copy {bw / 1e12:.2f} TB/s")

    flex = None
    if not args.no_flex:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        from torch import _dynamo

        # one recompile per mask_mod and shape: keep dynamo from falling back to eager
        _dynamo.config.cache_size_limit = 512
        if hasattr(_dynamo.config, "accumulated_cache_size_limit"):
            _dynamo.config.accumulated_cache_size_limit = 4096
        flex = torch.compile(flex_attention)
    masks = flex_masks()
    sdpa = torch.nn.functional.scaled_dot_product_attention

    rows: list[dict] = []
    gqa_rows: list[dict] = []
    sweep_rows: list[dict] = []
    for N in ([] if args.no_main else lengths):
        q = torch.randn(1, H, N, D, device=dev, dtype=dtype)
        k = torch.randn(1, H, N, D, device=dev, dtype=dtype)
        v = torch.randn(1, H, N, D, device=dev, dtype=dtype)
        sdpa_prefill = median_ms(lambda: sdpa(q, k, v, is_causal=True), False, rep)
        qd = q[:, :, N - 1:N].contiguous()
        kd = k[:, :, N - 1:N].contiguous()
        vd = v[:, :, N - 1:N].contiguous()
        sdpa_decode = median_ms(lambda: sdpa(qd, k, v), True, rep)
        for name in names:
            t0 = time.time()
            pattern = load_pattern(name)
            kern = SASAttnKernel(pattern, max_len=N, prefill_options=po, decode_options=do)
            C = kern.cache_size
            row = {"pattern": name, "N": N, "cache_size": C, "sdpa_prefill_ms": sdpa_prefill,
                   "sdpa_decode_ms": sdpa_decode}
            tiles = kern.runtime.prefill_tiles(q, k, v)
            row["prefill_config"] = [tiles[0].block_m, tiles[0].block_n, tiles[0].num_warps, tiles[0].num_stages]
            row["tiles"] = {"full": int(tiles[1][-1]), "partial": int(tiles[3][-1])}
            out = kern(q, k, v)
            # decode: compact cache filled from the dense prompt (positions 0..N-2)
            kc, vc = kern.new_cache(1, H, D, dtype, dev)
            kern.fill_cache(k[:, :, :N - 1], v[:, :, :N - 1], kc, vc)
            dout = kern(qd, kd, vd, kc, vc, position=N - 1)
            if flex is not None:
                mm = masks[name]
                bm = create_block_mask(mm, None, None, N, N, device=dev)
                ref = flex(q, k, v, block_mask=bm)
                row["prefill_rel_err_vs_flex"] = rel_err(out, ref)
                row["flex_prefill_ms"] = median_ms(lambda: flex(q, k, v, block_mask=bm), False, rep)
                off = N - 1
                dmm = (lambda mm_, off_: (lambda b, h, qi, ki: mm_(b, h, qi + off_, ki)))(mm, off)
                dbm = create_block_mask(dmm, None, None, 1, N, device=dev)
                dref = flex(qd, k, v, block_mask=dbm)
                row["decode_rel_err_vs_flex"] = rel_err(dout, dref)
                row["flex_decode_ms"] = median_ms(lambda: flex(qd, k, v, block_mask=dbm), True, rep)
            row["sas_prefill_ms"] = median_ms(lambda: kern(q, k, v), False, rep)
            dec_out = torch.empty_like(qd)
            row["sas_decode_ms"] = median_ms(
                lambda: kern.runtime.decode(qd, kd, vd, kc, vc, N - 1, out=dec_out), True, rep)
            row["sas_decode_pdl_ms"] = pdl_decode_ms(pattern, N, kern, po, do, (qd, kd, vd, kc, vc), dec_out, rep)
            row["hbm_floor_decode_ms"] = 2 * C * H * D * 2 / bw * 1e3
            row["seconds"] = round(time.time() - t0, 1)
            rows.append(row)
            print(_fmt_row(row), flush=True)
            _dump(args.out, meta, rows, gqa_rows, sweep_rows)
        del q, k, v
        torch.cuda.empty_cache()

    if not args.no_gqa and not args.no_main:
        N, B, Hq, Hkv = max(lengths), args.gqa_batch, 32, 8
        qd = torch.randn(B, Hq, 1, D, device=dev, dtype=dtype)
        k = torch.randn(B, Hkv, N, D, device=dev, dtype=dtype)
        v = torch.randn(B, Hkv, N, D, device=dev, dtype=dtype)
        kd, vd = k[:, :, N - 1:N].contiguous(), v[:, :, N - 1:N].contiguous()
        sdpa_decode = median_ms(lambda: sdpa(qd, k, v, enable_gqa=True), True, rep)
        for name in names:
            pattern = load_pattern(name)
            kern = SASAttnKernel(pattern, max_len=N, prefill_options=po, decode_options=do)
            C = kern.cache_size
            kc, vc = kern.new_cache(B, Hkv, D, dtype, dev)
            kern.fill_cache(k[:, :, :N - 1], v[:, :, :N - 1], kc, vc)
            row = {"pattern": name, "N": N, "batch": B, "q_heads": Hq, "kv_heads": Hkv, "cache_size": C,
                   "sdpa_decode_ms": sdpa_decode}
            dout = kern(qd, kd, vd, kc, vc, position=N - 1)
            if flex is not None:
                mm = masks[name]
                dmm = (lambda mm_, off_: (lambda b, h, qi, ki: mm_(b, h, qi + off_, ki)))(mm, N - 1)
                dbm = create_block_mask(dmm, None, None, 1, N, device=dev)
                dref = flex(qd, k, v, block_mask=dbm, enable_gqa=True)
                row["decode_rel_err_vs_flex"] = rel_err(dout, dref)
                row["flex_decode_ms"] = median_ms(lambda: flex(qd, k, v, block_mask=dbm, enable_gqa=True), True, rep)
            dec_out = torch.empty_like(qd)
            row["sas_decode_ms"] = median_ms(
                lambda: kern.runtime.decode(qd, kd, vd, kc, vc, N - 1, out=dec_out), True, rep)
            row["sas_decode_pdl_ms"] = pdl_decode_ms(pattern, N, kern, po, do, (qd, kd, vd, kc, vc), dec_out, rep)
            row["hbm_floor_decode_ms"] = 2 * C * B * Hkv * D * 2 / bw * 1e3
            gqa_rows.append(row)
            print("GQA " + _fmt_gqa(row), flush=True)
            _dump(args.out, meta, rows, gqa_rows, sweep_rows)
        del k, v
        torch.cuda.empty_cache()

    if args.sweep:
        N = max(lengths)
        q = torch.randn(1, H, N, D, device=dev, dtype=dtype)
        k = torch.randn(1, H, N, D, device=dev, dtype=dtype)
        v = torch.randn(1, H, N, D, device=dev, dtype=dtype)
        configs = [tuple(int(x) for x in c.split(",")) for c in args.sweep_configs.split(";")]
        for cfg in configs:
            for name in names:
                kern = SASAttnKernel(load_pattern(name), max_len=N, prefill_options=PrefillOptions(*cfg))
                ms = median_ms(lambda: kern(q, k, v), False, rep)
                sweep_rows.append({"pattern": name, "N": N, "config": cfg, "sas_prefill_ms": ms})
                print(f"sweep {cfg} {name:22s} {ms:8.3f} ms", flush=True)

    if args.decode_sweep:
        N = max(lengths)
        variants = {
            "default": {},
            "waves4": {"waves": 4},
            "bn32": {"block_n": 32},
            "mask_skip": {"skip_mode": "mask"},
            "fused": {"fused_combine": True},
        }
        for B, Hq, Hkv in ((1, H, H), (args.gqa_batch, 32, 8)):
            qd = torch.randn(B, Hq, 1, D, device=dev, dtype=dtype)
            kd = torch.randn(B, Hkv, 1, D, device=dev, dtype=dtype)
            vd = torch.randn(B, Hkv, 1, D, device=dev, dtype=dtype)
            for vname, kw in variants.items():
                opts = dataclasses.replace(do or DecodeOptions(), **kw)
                for name in names:
                    kern = SASAttnKernel(load_pattern(name), max_len=N, prefill_options=po, decode_options=opts)
                    kc, vc = kern.new_cache(B, Hkv, D, dtype, dev)
                    kc.normal_()
                    vc.normal_()
                    dec_out = torch.empty_like(qd)
                    ms = median_ms(lambda: kern.runtime.decode(qd, kd, vd, kc, vc, N - 1, out=dec_out), True, rep)
                    sweep_rows.append({"pattern": name, "N": N, "config": f"decode B={B} Hq={Hq} {vname}",
                                       "sas_decode_ms": ms})
                    print(f"dsweep B={B:2d} {vname:9s} {name:22s} {ms:8.4f} ms", flush=True)

    meta["total_seconds"] = round(time.time() - t_start, 1)
    summary = _summary(rows, gqa_rows)
    md = _markdown(meta, rows, gqa_rows, sweep_rows, summary)
    print()
    print(md)
    write_results(args.out, {"meta": meta, "rows": rows, "gqa": gqa_rows, "sweep": sweep_rows, "summary": summary},
                  md)


def write_results(out: str | None, data: dict | list, md: str, indent: int = 2) -> None:
    """The run's results as `<out>.json` (`data`) and `<out>.md` (`md`); nothing when `out` is None."""
    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.with_suffix(".json").write_text(json.dumps(data, indent=indent))
        path.with_suffix(".md").write_text(md)


def _dump(out, meta, rows, gqa_rows, sweep_rows):
    """Partial results, rewritten after every row (a cut-off run keeps what it measured)."""
    if out:
        p = Path(out).with_suffix(".partial.json")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps({"meta": meta, "rows": rows, "gqa": gqa_rows, "sweep": sweep_rows}, indent=1))


def _geomean(xs):
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def _summary(rows, gqa_rows):
    """Geometric means over the six Table-1 patterns; the causal pattern is reported apart."""
    s = {}
    for r in rows:
        if r["pattern"] == CAUSAL:
            s[f"causal_prefill_over_sdpa_{r['N']}"] = r["sas_prefill_ms"] / r["sdpa_prefill_ms"]
    rows = [r for r in rows if r["pattern"] in PATTERNS]
    gqa_rows = [r for r in gqa_rows if r["pattern"] in PATTERNS]
    for N in sorted({r["N"] for r in rows}):
        rs = [r for r in rows if r["N"] == N and "flex_prefill_ms" in r]
        if rs:
            s[f"prefill_speedup_vs_flex_geomean_{N}"] = _geomean([r["flex_prefill_ms"] / r["sas_prefill_ms"] for r in rs])
            s[f"decode_speedup_vs_flex_geomean_{N}"] = _geomean([r["flex_decode_ms"] / r["sas_decode_ms"] for r in rs])
        rs = [r for r in rows if r["N"] == N]
        s[f"prefill_speedup_vs_sdpa_geomean_{N}"] = _geomean([r["sdpa_prefill_ms"] / r["sas_prefill_ms"] for r in rs])
        s[f"decode_over_floor_max_{N}_ge1k_slots"] = max(
            [r["sas_decode_ms"] / r["hbm_floor_decode_ms"] for r in rs if r["cache_size"] >= 1024] or [float("nan")])
        if all(r.get("sas_decode_pdl_ms") for r in rs):
            s[f"decode_pdl_over_floor_max_{N}_ge256_slots"] = max(
                [r["sas_decode_pdl_ms"] / r["hbm_floor_decode_ms"] for r in rs if r["cache_size"] >= 256] or [float("nan")])
            if all("flex_decode_ms" in r for r in rs):
                s[f"decode_pdl_speedup_vs_flex_geomean_{N}"] = _geomean(
                    [r["flex_decode_ms"] / r["sas_decode_pdl_ms"] for r in rs])
    if gqa_rows and "flex_decode_ms" in gqa_rows[0]:
        s["gqa_decode_speedup_vs_flex_geomean"] = _geomean([r["flex_decode_ms"] / r["sas_decode_ms"] for r in gqa_rows])
    return s


def _fmt_row(r):
    f = lambda k: f"{r[k]:8.4f}" if r.get(k) is not None else "     n/a"  # noqa: E731
    return (f"N={r['N']:6d} {r['pattern']:20s} C={r['cache_size']:6d} | prefill sas {f('sas_prefill_ms')} "
            f"flex {f('flex_prefill_ms')} sdpa {f('sdpa_prefill_ms')} | decode sas {f('sas_decode_ms')} "
            f"pdl {f('sas_decode_pdl_ms')} flex {f('flex_decode_ms')} sdpa {f('sdpa_decode_ms')} "
            f"floor {f('hbm_floor_decode_ms')} | err {r.get('prefill_rel_err_vs_flex', float('nan')):.1e}/{r.get('decode_rel_err_vs_flex', float('nan')):.1e}")


def _fmt_gqa(r):
    f = lambda k: f"{r[k]:8.4f}" if r.get(k) is not None else "     n/a"  # noqa: E731
    return (f"N={r['N']} B={r['batch']} {r['pattern']:20s} C={r['cache_size']:6d} | decode sas {f('sas_decode_ms')} "
            f"pdl {f('sas_decode_pdl_ms')} flex {f('flex_decode_ms')} sdpa {f('sdpa_decode_ms')} floor {f('hbm_floor_decode_ms')} | "
            f"err {r.get('decode_rel_err_vs_flex', float('nan')):.1e}")


def _over(r, key):
    """r[key] over the row's HBM floor, or n/a."""
    return f"{r[key] / r['hbm_floor_decode_ms']:.2f}" if r.get(key) is not None else "n/a"


def _markdown(meta, rows, gqa_rows, sweep_rows, summary):
    x = lambda a, b: f" ({a / b:.2f}x)" if a and b else ""  # noqa: E731
    g = lambda r, k: f"{r[k]:.4f}" if r.get(k) is not None else "n/a"  # noqa: E731
    lines = [f"# sas kernels vs FlexAttention and SDPA",
             "",
             f"{meta['device']} ({meta['sms']} SMs), torch {meta['torch']}, triton {meta['triton']}, {meta['date']}; "
             f"bf16, {meta['heads']} heads, head dim {meta['head_dim']}, batch 1; medians in ms; "
             f"copy bandwidth {meta['copy_bandwidth_TBps']:.2f} TB/s.",
             "",
             "## Prefill (speedup of sas over the baseline in parentheses)",
             "",
             "| pattern | N | tiles full/partial | SDPA causal | Flex | sas |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['pattern']} | {r['N']} | {r['tiles']['full']}/{r['tiles']['partial']} | "
                     f"{g(r, 'sdpa_prefill_ms')} | {g(r, 'flex_prefill_ms')} | "
                     f"{g(r, 'sas_prefill_ms')}{x(r.get('flex_prefill_ms'), r['sas_prefill_ms'])} |")
    lines += ["", "## Decode (one token at position N - 1, CUDA-graph replay)", "",
              "| pattern | N | cache slots | SDPA dense | Flex | sas | sas PDL | HBM floor | sas / floor | PDL / floor |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['pattern']} | {r['N']} | {r['cache_size']} | {g(r, 'sdpa_decode_ms')} | "
                     f"{g(r, 'flex_decode_ms')} | {g(r, 'sas_decode_ms')}{x(r.get('flex_decode_ms'), r['sas_decode_ms'])} | "
                     f"{g(r, 'sas_decode_pdl_ms')} | {r['hbm_floor_decode_ms']:.4f} | "
                     f"{r['sas_decode_ms'] / r['hbm_floor_decode_ms']:.2f} | {_over(r, 'sas_decode_pdl_ms')} |")
    if gqa_rows:
        r0 = gqa_rows[0]
        lines += ["", f"## GQA decode ({r0['q_heads']} query / {r0['kv_heads']} kv heads, batch {r0['batch']}, "
                      f"N = {r0['N']})", "",
                  "| pattern | cache slots | SDPA dense | Flex | sas | sas PDL | HBM floor | sas / floor | PDL / floor |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in gqa_rows:
            lines.append(f"| {r['pattern']} | {r['cache_size']} | {g(r, 'sdpa_decode_ms')} | {g(r, 'flex_decode_ms')} | "
                         f"{g(r, 'sas_decode_ms')}{x(r.get('flex_decode_ms'), r['sas_decode_ms'])} | "
                         f"{g(r, 'sas_decode_pdl_ms')} | {r['hbm_floor_decode_ms']:.4f} | "
                         f"{r['sas_decode_ms'] / r['hbm_floor_decode_ms']:.2f} | {_over(r, 'sas_decode_pdl_ms')} |")
    if sweep_rows:
        lines += ["", "## Prefill configuration sweep", "", "| config (BM, BN, warps, stages) | pattern | ms |", "|---|---|---|"]
        for r in sweep_rows:
            ms = r.get("sas_prefill_ms", r.get("sas_decode_ms"))
            lines.append(f"| {r['config']} | {r['pattern']} | {ms:.4f} |")
    lines += ["", "## Summary", ""] + [f"- {k}: {v:.3f}" for k, v in summary.items()] + [
        "", f"Errors vs Flex (relative L2) are in the JSON; total run {meta['total_seconds']} s.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
