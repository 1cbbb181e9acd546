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
                    decode_options: DecodeOptions | None = None, analysis: Any = None,
                    force: bool = False) -> dict[str, Any]:
    """Render the pattern's kernels for `backend` into `out_dir` and return the report (also
    written as report.json / report.md). An existing `out_dir` is replaced when it is empty or
    sas wrote it, any other only with `force=True` (`check_output_folder`)."""
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
    check_output_folder(out_dir, force)   # before any work: refuse a folder it must not replace
    if pattern.dynamics():
        files, report = _dynamic_files(pattern, backend, max_len, head_dim, dtype_name, num_heads, num_kv_heads,
                                       batch, prefill_options, decode_options)
        _write_folder(Path(out_dir), files, force)
        return report
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
    _write_folder(out_dir, files, force)
    return report


def _dynamic_files(pattern: Pattern, backend: str, max_len: int, head_dim: int, dtype_name: str,
                   num_heads: int, num_kv_heads: int, batch: int, prefill_options: PrefillOptions | None,
                   decode_options: DecodeOptions | None) -> tuple[dict[str, str | bytes], dict[str, Any]]:
    """Files and report of a pattern with a Dynamic component (docs/dynamic.md, section 7):
    the prefill module of the full pattern (with its score kernel), the static part's decode
    module, the dynamic decode module (kernels and `Runtime`) and the region schedule."""
    import io

    import torch

    from sas.codegen.triton_backend import auto_decode_options, auto_prefill_options, render_dynamic_decode
    from sas.dynamic.cache_plan import dynamic_cache_plan
    from sas.dynamic.fusion import analyze_fusion
    from sas.ir.tiles import tile_map

    cplan = dynamic_cache_plan(pattern, max_len)
    plan = cplan.plan
    if cplan.fused is None:
        raise NotYetSupportedError(
            f"compile_pattern: the score chain {plan.dynamic.score!r} is not fused into the kernels (custom ops, "
            f"ops.external, pooling, top-k and reductions over KV heads run as their torch.fx graph inside "
            f"SASAttnKernel); sas compile writes standalone kernels for attn_score(), one reduction over "
            f"dim 1 (sum, mean, max) and elementwise arithmetic with constants")
    po = prefill_options or auto_prefill_options(plan.full, max_len, max_len)
    tiles = tile_map(plan.full, max_len, max_len, po.block_m, po.block_n, 0)
    files: dict[str, str | bytes] = {"prefill.py": render_prefill(plan.full, po)}
    static = cplan.static_analysis
    itemsize = _DTYPES[dtype_name]
    per_slot = 2 * batch * num_kv_heads * head_dim * itemsize
    report: dict[str, Any] = {
        "pattern": repr(pattern),
        "dynamic": True,
        "backend": backend,
        "template_version": TEMPLATE_VERSION,
        "max_len": max_len, "head_dim": head_dim, "dtype": dtype_name, "batch": batch,
        "num_heads": num_heads, "num_kv_heads": num_kv_heads, "causal": True,
        "split": {"static": repr(plan.static) if static is not None else None, "region": repr(plan.region),
                  "full": repr(plan.full), "budget": plan.budget, "refresh": plan.refresh,
                  "score": repr(plan.dynamic.score)},
        "fusion": analyze_fusion(plan.score).summary(),
        "prefill": {
            "pattern": repr(plan.full), "block_m": po.block_m, "block_n": po.block_n,
            "num_warps": po.num_warps, "num_stages": po.num_stages, "tiles": tiles.counts(),
            "density": round((tiles.num_full + tiles.num_partial) / max(1, tiles.counts()["total"]), 6),
        },
        **cplan.report(),
        "cache_size": cplan.cache_size,
        "dense_cache_size": max_len,
        "kv_cache_bytes": per_slot * cplan.cache_size,
        "dense_kv_cache_bytes": per_slot * max_len,
        "files": ["prefill.py"],
    }
    if static is not None:
        do = decode_options or auto_decode_options(static, num_heads // num_kv_heads)
        files["static_decode.py"] = render_decode(static, do)
        report["static_functions_source"] = static.source
        report["files"].append("static_decode.py")
    files["dynamic_decode.py"] = render_dynamic_decode(cplan)
    buf = io.BytesIO()
    torch.save({name: torch.from_numpy(a) for name, a in cplan.table_arrays().items()}, buf)
    files["dynamic_tables.pt"] = buf.getvalue()
    report["files"] += ["dynamic_decode.py", "dynamic_tables.pt", "report.json", "report.md"]
    report["notes"] = [
        "run: rt = dynamic_decode.Runtime(static_decode or None, torch.load('dynamic_tables.pt')); "
        "out = rt.prefill(prefill, q, k, v); out = rt.decode(q1, k1, v1) per token",
    ]
    files["report.json"] = json.dumps(report, indent=2) + "\n"
    files["report.md"] = _dynamic_markdown(report)
    return files, report


#: report.json keys that mark a folder as `compile_pattern`'s own output (it may replace it)
_OUTPUT_MARKER_KEYS = ("template_version", "backend", "files")


def _written_by_sas(folder: Path) -> bool:
    """Does `folder` hold a report.json that `compile_pattern` wrote?"""
    try:
        report = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return (isinstance(report, dict) and all(k in report for k in _OUTPUT_MARKER_KEYS)
            and isinstance(report["files"], list) and "report.json" in report["files"])


def check_output_folder(out_dir: str | os.PathLike, force: bool = False) -> Path:
    """The folder `compile_pattern` will write for `out_dir`, after checking that it may.

    A new or empty folder, or one that sas compile wrote before (its report.json), is
    replaced; any other non-empty folder only with `force=True`. A symlink is never replaced:
    the folder it points to is written (a dangling symlink is refused). The home folder and
    the current folder or any folder holding it are refused even with `force`. Raises
    `KernelError` naming the folder and what would be valid; touches nothing.
    """
    given = Path(out_dir)
    if given.is_symlink():
        target = given.resolve()
        if not target.exists():
            raise KernelError(f"compile_pattern: output {given} is a symlink to {target}, which does not "
                              f"exist; create that folder or give another output folder")
    else:
        target = given.resolve()
    if target.exists() and not target.is_dir():
        link = f" (a symlink to {target})" if given.is_symlink() else ""
        raise KernelError(f"compile_pattern: output {given}{link} exists and is not a folder; "
                          f"give a new or empty folder")
    cwd = Path.cwd().resolve()
    if target == Path.home().resolve() or target == cwd or target in cwd.parents:
        what = "the home folder" if target == Path.home().resolve() else "the current folder or holds it"
        raise KernelError(f"compile_pattern: refusing to replace {target}: it is {what}; "
                          f"give a new or empty folder such as build/kernels")
    if target.is_dir() and not force and not _written_by_sas(target):
        try:
            entries = sorted(p.name for p in target.iterdir())
        except OSError as e:
            raise KernelError(f"compile_pattern: cannot read output folder {target}: {e.strerror or e}") from None
        if entries:
            shown = ", ".join(entries[:5]) + (f", ... ({len(entries)} entries)" if len(entries) > 5 else "")
            raise KernelError(
                f"compile_pattern: output folder {given} is not empty ({shown}) and was not written by "
                f"sas compile (no report.json of sas); it would be replaced as a whole: give a new or "
                f"empty folder, or force it (sas compile --force, compile_pattern(..., force=True))")
    return target


def _write_folder(out_dir: Path, files: dict[str, str | bytes], force: bool = False) -> None:
    """Write `files` into a temporary sibling folder, then rename it into place (a failed
    write leaves the old folder, or nothing). `check_output_folder` says which folder that
    is (the target of a symlink) and refuses folders sas did not write unless `force`."""
    target = check_output_folder(out_dir, force)
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)
    except OSError as e:
        raise KernelError(f"compile_pattern: cannot create output folder {out_dir}: {e.strerror or e}") from None
    old = None
    try:
        for name, data in files.items():
            if isinstance(data, bytes):
                (tmp / name).write_bytes(data)
            else:
                (tmp / name).write_text(data)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=parent))
            os.rmdir(old)
            os.replace(target, old)
        os.replace(tmp, target)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not target.exists():
            os.replace(old, target)
            old = None
        if isinstance(e, OSError):
            raise KernelError(f"compile_pattern: writing {out_dir} failed: {e}") from None
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _tile_lines(r: dict[str, Any]) -> list[str]:
    """The report's prefill tile table and launch line."""
    t, pre = r["prefill"]["tiles"], r["prefill"]
    return [
        f"Tiles of {pre['block_m']} x {pre['block_n']} at {r['max_len']} x {r['max_len']}:",
        "",
        "| full | partial | empty | total | density |",
        "|---|---|---|---|---|",
        f"| {t['full']} | {t['partial']} | {t['empty']} | {t['total']} | {pre['density']:.4f} |",
        "",
        f"Launch: num_warps={pre['num_warps']}, num_stages={pre['num_stages']}.",
        "",
    ]


def _markdown(r: dict[str, Any]) -> str:
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
        *_tile_lines(r),
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


def _dynamic_markdown(r: dict[str, Any]) -> str:
    sp = r["split"]
    lines = [
        "# sas compile report (pattern with a Dynamic component)",
        "",
        f"- pattern: `{r['pattern']}`",
        f"- static part: `{sp['static']}`" if sp["static"] else "- static part: empty",
        f"- dynamic region: `{sp['region']}`",
        f"- budget {sp['budget']}, refresh={sp['refresh']}, score `{sp['score']}` ({r['score_path']})",
        f"- backend: {r['backend']} (template version {r['template_version']})",
        f"- max_len: {r['max_len']}, head_dim: {r['head_dim']}, dtype: {r['dtype']}, "
        f"heads: {r['num_heads']} query / {r['num_kv_heads']} kv, batch: {r['batch']}",
        "",
        "## KV cache",
        "",
        f"- slots: {r['cache_size']} = {r['static_slots']} static + {r['pool_slots']} pool "
        f"(dense: {r['dense_cache_size']}); at most {r['max_entering_per_step']} keys enter per decode step",
        f"- bytes: {r['kv_cache_bytes']} (dense: {r['dense_kv_cache_bytes']})",
        "",
        "## Prefill (the Dynamic as its whole region)",
        "",
        *_tile_lines(r),
        "## Score fusion",
        "",
        "```",
        r["fusion"],
        "```",
        "",
    ]
    if "static_functions_source" in r:
        lines += ["## Static part: synthesized functions", "", "```python",
                  r["static_functions_source"].rstrip()[:20000], "```", ""]
    lines += ["## Notes", ""] + [f"- {n}" for n in r["notes"]] + [""]
    lines += ["## Files", ""] + [f"- `{f}`" for f in r["files"]] + [""]
    return "\n".join(lines)
