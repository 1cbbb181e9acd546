"""`compile_pattern`: write a pattern's generated kernel modules and a report to a folder.

The folder gets
- `prefill.py`: the block-sparse prefill module (imports only torch and triton; it carries
  `build_tiles` to make its tile lists on the device);
- `decode.py` (causal patterns): the split-K decode module with `cache_id_func` /
  `mask_func` inlined, plus `fill_cache` / `cache_ids`;
- `report.json` and `report.md`: cache size, slot scheme, the synthesized functions' source,
  tile counts at `max_len`, launch configuration.

Everything is written into a temporary sibling folder that is renamed into place at the end,
so an interrupted or failed compile leaves nothing half-written.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from sas.codegen.triton_backend import (
    SUPPORTED_HEAD_DIMS,
    TEMPLATE_VERSION,
    DecodeOptions,
    PrefillOptions,
    render_decode,
    render_prefill,
)
from sas.errors import KernelError, NotYetSupportedError, SASError
from sas.lang.pattern import Pattern

BACKENDS = ("triton",)
_DTYPES = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2, "float32": 4, "fp32": 4, "float": 4}


def _dtype_name(dtype: Any) -> str:
    name = str(dtype).replace("torch.", "")
    if name not in _DTYPES:
        raise KernelError(f"compile_pattern: unsupported dtype {dtype!r}; supported: bfloat16, float16, float32")
    return {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32",
            "float": "float32"}.get(name, name)


def compile_pattern(pattern: Pattern, out_dir: str | os.PathLike, backend: str = "triton", *,
                    max_len: int = 16384, head_dim: int = 128, dtype: Any = "bfloat16",
                    num_heads: int = 1, num_kv_heads: int | None = None, batch: int = 1,
                    prefill_options: PrefillOptions | None = None,
                    decode_options: DecodeOptions | None = None, analysis: Any = None) -> dict[str, Any]:
    """Render the pattern's kernels for `backend` into `out_dir` (replaced if it exists) and
    return the report (also written as report.json / report.md)."""
    if not isinstance(pattern, Pattern):
        raise SASError(f"compile_pattern: pattern must be a sas Pattern, got {type(pattern).__name__}")
    if backend not in BACKENDS:
        raise KernelError(f"compile_pattern: unknown backend {backend!r}; available: {', '.join(BACKENDS)}")
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len <= 0:
        raise KernelError(f"compile_pattern: max_len must be a positive integer, got {max_len!r}")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise KernelError(f"compile_pattern: head_dim {head_dim!r} is not supported; supported: "
                          f"{', '.join(map(str, SUPPORTED_HEAD_DIMS))}")
    dtype_name = _dtype_name(dtype)
    num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    if num_heads <= 0 or num_kv_heads <= 0 or num_heads % num_kv_heads or batch <= 0:
        raise KernelError(f"compile_pattern: num_heads={num_heads} must be a positive multiple of "
                          f"num_kv_heads={num_kv_heads}, batch={batch} positive")
    if pattern.dynamics():
        raise NotYetSupportedError(
            "compile_pattern: the pattern has Dynamic components; dynamic run-time selection is a "
            "separate issue, for now only static patterns compile")
    from sas.codegen.triton_backend import auto_prefill_options

    po = prefill_options or auto_prefill_options(pattern, max_len, max_len)
    do = decode_options
    out_dir = Path(out_dir)

    from sas.ir.tiles import is_causal, tile_map

    files: dict[str, str] = {"prefill.py": render_prefill(pattern, po)}
    tiles = tile_map(pattern, max_len, max_len, po.block_m, po.block_n, 0)
    causal = is_causal(pattern, max_len)
    itemsize = _DTYPES[dtype_name]
    per_slot = 2 * batch * num_kv_heads * head_dim * itemsize
    report: dict[str, Any] = {
        "pattern": repr(pattern),
        "predicate": pattern.predicate_source(),
        "backend": backend,
        "template_version": TEMPLATE_VERSION,
        "max_len": max_len,
        "head_dim": head_dim,
        "dtype": dtype_name,
        "batch": batch,
        "num_heads": num_heads,
        "num_kv_heads": num_kv_heads,
        "causal": causal,
        "prefill": {
            "block_m": po.block_m, "block_n": po.block_n, "num_warps": po.num_warps,
            "num_stages": po.num_stages, "tiles": tiles.counts(),
            "density": round((tiles.num_full + tiles.num_partial) / max(1, tiles.counts()["total"]), 6),
        },
        "files": ["prefill.py"],
    }
    if causal:
        if analysis is None:
            from sas import analyze

            analysis = analyze(pattern, max_len=max_len)
        if do is None:
            from sas.codegen.triton_backend import auto_decode_options

            do = auto_decode_options(analysis, num_heads // num_kv_heads)
        files["decode.py"] = render_decode(analysis, do)
        report["decode"] = {"block_n": do.block_n, "num_warps": do.num_warps, "num_stages": do.num_stages}
        report["cache_size"] = int(analysis.cache_size)
        report["dense_cache_size"] = max_len
        report["scheme"] = str(getattr(analysis, "scheme", ""))
        report["closed_form"] = bool(getattr(analysis, "closed_form", not analysis.tables))
        report["tables"] = {k: len(v) for k, v in analysis.tables.items()}
        report["functions_source"] = analysis.source
        report["kv_cache_bytes"] = per_slot * int(analysis.cache_size)
        report["dense_kv_cache_bytes"] = per_slot * max_len
        notes = list(getattr(analysis, "notes", ()) or ())
        if analysis.tables:
            notes.append("cache functions use per-token tables (no closed form found); decode.py embeds them")
        report["notes"] = notes
        report["files"].append("decode.py")
    else:
        report["notes"] = ["pattern is not causal: prefill only (decode needs a causal pattern)"]
    report["files"] += ["report.json", "report.md"]
    files["report.json"] = json.dumps(report, indent=2) + "\n"
    files["report.md"] = _markdown(report)

    parent = out_dir.resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=parent))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)
    except OSError as e:
        raise KernelError(f"compile_pattern: cannot create output folder {out_dir}: {e}") from None
    old = None
    try:
        for name, text in files.items():
            (tmp / name).write_text(text)
        if out_dir.exists() or out_dir.is_symlink():
            if not out_dir.is_dir():
                raise KernelError(f"compile_pattern: {out_dir} exists and is not a folder")
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".old", dir=parent))
            os.rmdir(old)
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not out_dir.exists():
            os.replace(old, out_dir)
            old = None
        if isinstance(e, OSError):
            raise KernelError(f"compile_pattern: writing {out_dir} failed: {e}") from None
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return report


def _markdown(r: dict[str, Any]) -> str:
    t = r["prefill"]["tiles"]
    lines = [
        "# sas compile report",
        "",
        f"- pattern: `{r['pattern']}`",
        f"- predicate: `{r['predicate']}`",
        f"- backend: {r['backend']} (template version {r['template_version']})",
        f"- max_len: {r['max_len']}, head_dim: {r['head_dim']}, dtype: {r['dtype']}, "
        f"heads: {r['num_heads']} query / {r['num_kv_heads']} kv, batch: {r['batch']}",
        f"- causal: {r['causal']}",
        "",
        "## Prefill",
        "",
        f"Tiles of {r['prefill']['block_m']} x {r['prefill']['block_n']} at {r['max_len']} x {r['max_len']}:",
        "",
        "| full | partial | empty | total | density |",
        "|---|---|---|---|---|",
        f"| {t['full']} | {t['partial']} | {t['empty']} | {t['total']} | {r['prefill']['density']:.4f} |",
        "",
        f"Launch: num_warps={r['prefill']['num_warps']}, num_stages={r['prefill']['num_stages']}.",
        "",
    ]
    if "cache_size" in r:
        lines += [
            "## Decode",
            "",
            f"- KV-cache slots: {r['cache_size']} (dense: {r['dense_cache_size']}), scheme `{r['scheme']}`, "
            f"closed form: {r['closed_form']}",
            f"- KV-cache bytes: {r['kv_cache_bytes']} (dense: {r['dense_kv_cache_bytes']})",
            f"- slot block {r['decode']['block_n']}, num_warps={r['decode']['num_warps']}, "
            f"num_stages={r['decode']['num_stages']}",
            "",
            "```python",
            r["functions_source"].rstrip() if len(r["functions_source"]) < 20000
            else r["functions_source"][:20000].rstrip() + "\n# ... (truncated; see decode.py)",
            "```",
            "",
        ]
    if r.get("notes"):
        lines += ["## Notes", ""] + [f"- {n}" for n in r["notes"]] + [""]
    lines += ["## Files", ""] + [f"- `{f}`" for f in r["files"]] + [""]
    return "\n".join(lines)
