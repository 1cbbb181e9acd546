"""How fast can one kernel read the K of a SANTA prop step? (issue 12's 1.6x target at 32K batch 1)

Prop must read all of K (Llama-3.1-8B shapes, 32K keys: 8 KV heads x 32768 x 128 bf16 = 64 MiB)
before any budget is known; this times kernels that only read such a buffer
(`benchmarks/probe_k_stream.cu`: a cp.async ring per block as santa_prop.cu.jinja streams K, the
same ring filled by bulk (TMA) copies, plain 16-byte loads) against dense SDPA decode over K and V
and a torch copy in the same process: CUDA-graph medians (back-to-back replays), and single
launches after a 256 MB write that leaves the L2 dirty (triton's do_bench flush, the profile's
conditions). Needs sm_90 or later (the bulk copies and their mbarriers). A ring kernel gives
each block whole stages, so fewer blocks than the grid may read ("reading" column).

    python benchmarks/probe_k_stream.py [--out results/NAME]
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sas.codegen.cuda_backend import build_library, device_arch  # noqa: E402

#: (entry, grid in blocks per multiprocessor or "128": the prop kernel's 32K batch-1 grid)
PROBES = (("cpa_4_16384_256", "128"), ("cpa_4_16384_256", 1), ("cpa_4_16384_256", 2), ("cpa_4_32768_256", 1),
          ("bulk_4_32768_256", 1), ("bulk_3_65536_256", 1), ("ldg_4_256", 2), ("ldg_4_256", 8))


def reading_blocks(entry: str, grid: int, nbytes: int) -> int:
    """Blocks of a launch that read something: a ring kernel (cpa_*, bulk_*) gives each block
    ceil(nbytes / grid) bytes rounded up to whole stages; plain loads stride over the grid."""
    if entry.startswith("ldg"):
        return grid
    stage = int(entry.split("_")[2])
    share = -(-(-(-nbytes // grid)) // stage) * stage
    return -(-nbytes // share)


def build() -> ctypes.CDLL:
    source = (ROOT / "benchmarks" / "probe_k_stream.cu").read_text()
    return ctypes.CDLL(str(build_library(source, device_arch(*torch.cuda.get_device_capability()))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write NAME.md beside the printed table")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("probe_k_stream.py needs an NVIDIA GPU")
    import triton.testing as tt
    lib = build()
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    n, hkv, d = 32768, 8, 128
    k = torch.randn(1, hkv, n, d, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(1, 32, 1, d, device=dev, dtype=torch.bfloat16)
    nbytes = k.numel() * k.element_size()
    sink = torch.zeros(64 * sms, dtype=torch.int32, device=dev)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)

    def graph_us(fn) -> float:
        fn()
        torch.cuda.synchronize()
        return min(float(tt.do_bench_cudagraph(fn, rep=100, return_mode="median")) for _ in range(3)) * 1e3

    def flushed_us(fn) -> float:
        times = []
        for _ in range(20):
            flush.zero_()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) * 1e3)
        return statistics.median(times)

    def probe(entry: str, grid: int):
        f = getattr(lib, entry)
        f.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]

        def run() -> None:
            rc = f(k.data_ptr(), nbytes, sink.data_ptr(), grid, torch.cuda.current_stream().cuda_stream)
            if rc:
                raise RuntimeError(f"{entry}: CUDA error {rc}")
        return run

    dst = torch.empty_like(k)
    rows = [("dense SDPA decode (reads K and V)", "-",
             lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True), 2 * nbytes),
            ("torch copy of K (reads and writes)", "-", lambda: dst.copy_(k), 2 * nbytes)]
    for entry, per in PROBES:
        grid = 128 if per == "128" else per * sms
        rows.append((entry, f"{grid} ({reading_blocks(entry, grid, nbytes)} reading)", probe(entry, grid), nbytes))
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# `python benchmarks/probe_k_stream.py` ({torch.cuda.get_device_name()}, torch {torch.__version__}, "
             f"{when})",
             "", f"64 MiB of K (32K keys x 8 KV heads x 128 dims, bf16), {sms} multiprocessors.", "",
             "| kernel | grid | graph us | TB/s | after L2 flush us | TB/s |", "|---|---|---:|---:|---:|---:|"]
    for name, grid, fn, moved in rows:
        g, fl = graph_us(fn), flushed_us(fn)
        lines.append(f"| {name} | {grid} | {g:.1f} | {moved / g / 1e6:.2f} | {fl:.1f} | {moved / fl / 1e6:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).with_suffix(".md").write_text(text)


if __name__ == "__main__":
    main()
