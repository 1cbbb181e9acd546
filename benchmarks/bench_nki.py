"""NKI (Trainium) backend: what can be measured without a Trainium device or neuronx-cc.

No Trainium timing exists (docs/nki.md). This script reports, for the six Table-1 patterns
(examples/*.py) at 2K-16K, head dim 128, 64 heads:

1. the generated kernels' schedule: tiles of 128 x 128 the attention kernel visits (full +
   partial) against a dense and a dense-causal kernel, i.e. the Tensor Engine matmul work
   relative to dense; the decode kernel's cache slots against the dense cache;
2. generation cost: render + API-check time and kernel text size;
3. correctness in the numpy emulator (sas.codegen.nki_emulator) at a small size: the six
   patterns with 32-token blocks (tests/helpers/table1.py) at 256 tokens, head dim 32, 2 query
   heads per KV head, 64-row tiles: max abs error of the attention
   output, the importance scores and decode against the float64 exact-mask reference, and the
   emulator's wall time.

It needs only the CPU (no GPU, no Neuron SDK); on a CUDA machine it runs the same way.

    python benchmarks/bench_nki.py            # JSON to $OUT/nki.json when OUT is set
    python benchmarks/bench_nki.py --small    # 2K and 4K only, < 1 minute
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import runpy
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from sas import analyze  # noqa: E402
from sas.codegen.nki_backend import (choose_block, kernel_names, render_nki, render_nki_decode,  # noqa: E402
                                     tile_classes)
from sas.codegen.nki_emulator import load_kernel_module, reference_attention  # noqa: E402
from helpers.table1 import TABLE1_KERNELS  # noqa: E402  (the six patterns with 32-token blocks)

PATTERNS = ["streaming_llm", "block_local", "sliding_window", "openai_strided", "openai_fixed",
            "strided_block_local"]


def load_pattern(name: str):
    path = ROOT / "examples" / f"{name}.py"
    try:
        from sas.lang.loader import load_pattern as loader
        return loader(path)
    except ImportError:
        return runpy.run_path(str(path))["pattern"]


def schedule_row(name: str, pattern, L: int, heads: int = 64, head_dim: int = 128) -> dict:
    t = time.perf_counter()
    src = render_nki(pattern, L, head_dim, 1)
    render_s = time.perf_counter() - t
    blk = choose_block(L)
    full, part = tile_classes(pattern, L, blk, blk)
    nb = full.shape[0]
    visited = int(full.sum() + part.sum())
    t = time.perf_counter()
    a = analyze(pattern, L)
    dsrc = render_nki_decode(a, head_dim, 1)
    decode_s = time.perf_counter() - t
    return {"pattern": name, "L": L, "block": blk, "heads": heads, "tiles_full": int(full.sum()),
            "tiles_partial": int(part.sum()), "tiles_dense": nb * nb, "tiles_causal": nb * (nb + 1) // 2,
            "work_vs_dense": visited / (nb * nb), "work_vs_causal": visited / (nb * (nb + 1) // 2),
            "cache_slots": int(a.cache_size), "cache_vs_dense": int(a.cache_size) / L,
            "render_s": render_s, "decode_render_s": decode_s, "kernel_bytes": len(src), "decode_bytes": len(dsrc)}


def emulate_row(name: str, pattern, L: int = 256, D: int = 32, H: int = 2, Hkv: int = 1, blk: int = 64) -> dict:
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, H, L, D)).astype(np.float32)
    k = rng.standard_normal((1, Hkv, L, D)).astype(np.float32)
    v = rng.standard_normal((1, Hkv, L, D)).astype(np.float32)
    ref, p = reference_attention(q, k, v, pattern.to_mask(L))
    src = render_nki(pattern, L, D, H // Hkv, block_m=blk, block_n=blk)
    ns = load_kernel_module(src)
    att, sc = kernel_names(src)
    qT, kT = np.ascontiguousarray(q.transpose(0, 1, 3, 2)), np.ascontiguousarray(k.transpose(0, 1, 3, 2))
    t = time.perf_counter()
    out, m, l = ns[att][1, H](qT, kT, v)
    score = ns[sc][1, Hkv](qT, kT, m, l)
    emu_s = time.perf_counter() - t
    ref_score = p.reshape(1, Hkv, H // Hkv, L, L).sum(axis=(2, 3))
    # decode at a few positions over a cache filled by cache_id_func
    a = analyze(pattern, L)
    dns = load_kernel_module(render_nki_decode(a, D, H // Hkv))
    dname = next(n for n in dns if n.startswith("sas_nki_decode_"))
    P = dns["PADDED_SLOTS"]
    kc = np.zeros((1, Hkv, D, P), np.float32)
    vc = np.zeros((1, Hkv, P, D), np.float32)
    keys = np.full((1, P), -1, np.int32)
    held = "slot_keys" in dns[dname].fn.__code__.co_varnames
    derr, t0 = 0.0, 0
    for pos in (0, L // 3, L // 2 + 1, L - 1):
        for tok in range(t0, pos + 1):
            s = dns["cache_id_func"](tok)
            if s >= 0:
                kc[:, :, :, s], vc[:, :, s], keys[0, s] = k[:, :, tok], v[:, :, tok], tok
        t0 = pos + 1
        q1 = np.ascontiguousarray(q[:, :, pos].reshape(1, Hkv, H // Hkv, D).transpose(0, 1, 3, 2))
        args = (q1, kc, vc, np.array([[pos]], np.int32)) + ((keys,) if held else ())
        o1 = dns[dname][1, Hkv](*args)
        derr = max(derr, float(np.abs(o1.reshape(1, H, D) - ref[:, :, pos]).max()))
    return {"pattern": name, "L": L, "D": D, "heads": H, "kv_heads": Hkv, "block": blk,
            "attention_max_abs_err": float(np.abs(out - ref).max()),
            "score_max_abs_err": float(np.abs(score[..., 0] - ref_score).max()),
            "decode_max_abs_err": derr, "emulator_s": emu_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="2K and 4K only (CPU, < 1 minute)")
    args = ap.parse_args()
    lengths = [2048, 4096] if args.small else [2048, 4096, 8192, 16384]
    pats = {n: load_pattern(n) for n in PATTERNS}
    sched = [schedule_row(n, p, L) for n in PATTERNS for L in lengths for p in [pats[n]]]
    emu = [emulate_row(n, TABLE1_KERNELS[n]) for n in PATTERNS]
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "device": "CPU only (no Trainium, no neuronx-cc)", "schedule": sched, "emulator": emu}
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "nki.json").write_text(json.dumps(result, indent=2) + "\n")
    print("emulator check (Table-1 formulas with 32-token blocks, 256 tokens, D=32, GQA 2:1, 64-row tiles) "
          "vs float64 exact-mask reference:")
    print(f"{'pattern':22s} {'attn err':>9s} {'score err':>9s} {'decode err':>10s} {'emu s':>6s}")
    for r in emu:
        print(f"{r['pattern']:22s} {r['attention_max_abs_err']:9.1e} {r['score_max_abs_err']:9.1e} "
              f"{r['decode_max_abs_err']:10.1e} {r['emulator_s']:6.2f}")
    print("\nschedule of the generated kernels (128 x 128 tiles), work = tiles visited / tiles of the kernel named:")
    print(f"{'pattern':22s} {'L':>6s} {'full':>6s} {'part':>6s} {'vs dense':>8s} {'vs causal':>9s} "
          f"{'cache':>6s} {'render s':>8s} {'KiB':>6s}")
    for r in sched:
        print(f"{r['pattern']:22s} {r['L']:6d} {r['tiles_full']:6d} {r['tiles_partial']:6d} {r['work_vs_dense']:8.3f} "
              f"{r['work_vs_causal']:9.3f} {r['cache_slots']:6d} {r['render_s']:8.2f} {r['kernel_bytes'] / 1024:6.1f}")


if __name__ == "__main__":
    main()
