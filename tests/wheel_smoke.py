"""Smoke test of an installed sas wheel (run by `.ci/wheel-smoke`, not collected by pytest).

Run with the Python of a virtual environment that holds sas installed from its wheel, from a
folder outside the repository:

    TRITON_INTERPRET=1 VENV/bin/python tests/wheel_smoke.py REPO/examples

It checks that `sas` is the installed copy (not the source tree) with its grammar and kernel
templates inside the package, loads a `.sas` example, runs a prefill and decode kernel under
the Triton interpreter against the oracle, and runs `sas inspect`, `sas compile` and
`sas plot` through the installed console script.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")   # before the first import of triton

import numpy as np  # noqa: E402
import torch  # noqa: E402

import sas  # noqa: E402
from sas import Causal, Diag, Rect  # noqa: E402
from sas.codegen.triton_backend import template_dir  # noqa: E402
from sas.lang.text import GRAMMAR_PATH  # noqa: E402
from sas.runtime import SASAttnKernel  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def check(cond: bool, what: str) -> None:
    if not cond:
        raise SystemExit(f"wheel smoke: FAILED: {what}")
    print(f"ok: {what}")


def inside(path: Path, folder: Path) -> bool:
    return Path(path).resolve().is_relative_to(folder.resolve())


def installed_copy() -> Path:
    """The site-packages folder of this environment, after checking that sas comes from it."""
    site = Path(sysconfig.get_paths()["purelib"])
    check(sys.prefix != sys.base_prefix, f"running inside a virtual environment ({sys.prefix})")
    check(inside(Path(sas.__file__), site), f"sas is imported from the venv: {sas.__file__}")
    package = Path(sas.__file__).parent
    check(inside(Path(str(GRAMMAR_PATH)), package) and Path(str(GRAMMAR_PATH)).is_file(),
          f"the .sas grammar ships inside the package: {GRAMMAR_PATH}")
    tdir = Path(str(template_dir()))
    check(os.environ.get("SAS_TEMPLATE_DIR") is None and inside(tdir, package)
          and (tdir / "prefill.py.jinja").is_file(), f"the kernel templates ship inside the package: {tdir}")
    return site


def reference(mask: np.ndarray, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Dense float64 attention under the oracle mask (rows without a key give 0)."""
    s = (q.double() @ k.double().transpose(-1, -2)) * q.shape[-1] ** -0.5
    w = torch.softmax(s.masked_fill(~torch.from_numpy(mask), float("-inf")), -1).nan_to_num(0.0)
    return w @ v.double()


def kernels(pattern: sas.Pattern) -> None:
    """Prefill the first P tokens and decode the rest; every row against the oracle."""
    n, prefix, d = 48, 32, 16
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, d, generator=g) for _ in range(3))
    ref = reference(pattern.to_mask(n), q, k, v)
    kern = SASAttnKernel(pattern, max_len=n)
    out = [kern.prefill(q[:, :, :prefix], k[:, :, :prefix], v[:, :, :prefix])]
    out += [kern.decode(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]) for t in range(prefix, n)]
    err = float((torch.cat(out, 2).double() - ref).abs().max())
    check(err < 1e-4, f"prefill + decode of {pattern!r} under the Triton interpreter match the "
                      f"oracle (max abs error {err:.1e}, cache {kern.cache_size} of {n} slots)")


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "sas"
    p = subprocess.run([str(exe), *args], capture_output=True, text=True, cwd=cwd, timeout=300)
    if p.returncode != 0:
        raise SystemExit(f"wheel smoke: FAILED: sas {' '.join(args)} exited {p.returncode}:\n{p.stderr}")
    return p


def main(examples: Path) -> None:
    installed_copy()
    pattern = sas.load_pattern(examples / "streaming_llm.sas")
    check(pattern == (Diag(0, 1024) + Rect(cols=(0, 32))) * Causal(),
          f"loaded {examples / 'streaming_llm.sas'}: {pattern!r}")
    kernels((Diag(0, 8) + Rect(cols=(0, 2))) * Causal())
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        p = cli(["inspect", str(examples / "streaming_llm.sas"), "--max-len", "16K"], work)
        check("1056 slots" in p.stdout, "sas inspect prints the StreamingLLM cache (1056 slots)")
        report = json.loads(cli(["inspect", str(examples / "sliding_window.py"), "--json"], work).stdout)
        check(report["cache_size"] == 1024, "sas inspect --json is JSON with the sliding-window cache size")
        cli(["compile", str(examples / "sliding_window.sas"), "-o", "build", "--max-len", "1K"], work)
        out = work / "build"
        files = json.loads((out / "report.json").read_text())["files"]
        check(sorted(p.name for p in out.iterdir()) == sorted(files) and "decode.py" in files,
              f"sas compile wrote {', '.join(files)}")
        for name in files:
            if name.endswith(".py"):
                compile((out / name).read_text(), name, "exec")
        cli(["plot", str(examples / "strided_block_local.sas"), "-o", "sbl.png", "-w", "32"], work)
        check((work / "sbl.png").read_bytes().startswith(PNG_MAGIC), "sas plot wrote a PNG")
    print("wheel smoke: all checks passed")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: wheel_smoke.py EXAMPLES_FOLDER")
    main(Path(sys.argv[1]).resolve())
