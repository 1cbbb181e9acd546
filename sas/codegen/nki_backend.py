"""The NKI (AWS Trainium) backend: renders templates/nki/ with the pattern's tile schedule and
its mask predicate lowered to NKI index-tile arithmetic (`sas.codegen.lower_nki`).

Two kernels per pattern, in one module (`nki_kernels.py`):

- block-sparse flash attention over the analyzer's schedule (`sas.ir.tile_runs` at the
  kernel's BLOCK_M x BLOCK_N tiles, baked into the module as runs of key blocks per query
  block): full tiles run without a mask, partial tiles evaluate the exact predicate on
  `nisa.iota` index tiles, empty tiles are never visited; it stores each row's max and softmax
  denominator beside the output;
- the importance-score kernel (paper section 7.2): per key, the attention probability summed
  over queries and the query heads of a KV head, rebuilt from those row statistics without a
  softmax pass (inter-kernel memoization), column sums on the Tensor Engine accumulated in PSUM.

Tile sizes obey NKI's limits (nki.language.tile_size): at most 128 partitions (query rows of a
score tile, key rows of a transposed probability tile, the head dimension of q and k), a
stationary matmul operand of at most 128 columns, a PSUM tile of at most 2 KiB per partition.
No Neuron compiler runs here: see docs/nki.md for what is and is not checked.
"""

from __future__ import annotations

import hashlib
import json
import math
from functools import lru_cache
from typing import Any

import jinja2
import numpy as np

from sas.codegen.lower_nki import EXACT_INT, lower_mask
from sas.codegen.lower_triton import check_identifier
from sas.codegen.nki_api import PMAX, check_kernel_source
from sas.errors import KernelError, NotYetSupportedError
from sas.ir.tile_runs import tile_runs
from sas.lang.pattern import Pattern
from sas.resources import data_folder

#: Bumped whenever a template's meaning changes.
NKI_TEMPLATE_VERSION = "nki-1"
#: Head dims the kernels support: q and k tiles hold the head dim on the partitions (<= 128).
NKI_HEAD_DIMS = (16, 32, 64, 128)
#: Tile sizes tried, largest first: the first that divides the sequence length is used.
NKI_BLOCKS = (128, 64, 32, 16)
NKI_DTYPES = ("bfloat16", "float16", "float32")
KERNEL_FILE = "nki_kernels.py"


def choose_block(seq_len: int) -> int:
    """The largest of NKI_BLOCKS dividing `seq_len` (kernels tile the sequence exactly)."""
    for blk in NKI_BLOCKS:
        if seq_len % blk == 0:
            return blk
    raise KernelError(f"NKI backend: the sequence length {seq_len} must be a multiple of 16 (kernels tile it "
                      f"exactly with blocks of {', '.join(map(str, NKI_BLOCKS))}); pick such a max_len")


def _check(pattern: Any, seq_len: Any, head_dim: Any, group: Any, block_m: Any, block_n: Any) -> None:
    if not isinstance(pattern, Pattern):
        raise KernelError(f"NKI backend: pattern must be a sas Pattern, got {type(pattern).__name__}")
    if pattern.dynamics():
        raise NotYetSupportedError("NKI backend: render the static form of a dynamic pattern (its split.full); "
                                   "run-time selection is not generated for NKI")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or not 0 < seq_len < EXACT_INT:
        raise KernelError(f"NKI backend: sequence length must be an integer in 1..{EXACT_INT - 1} (index "
                          f"arithmetic runs in float32 on the vector engines), got {seq_len!r}")
    if head_dim not in NKI_HEAD_DIMS:
        raise KernelError(f"NKI backend: head_dim {head_dim!r} is not supported; supported: "
                          f"{', '.join(map(str, NKI_HEAD_DIMS))} (q and k hold it on <= {PMAX} partitions)")
    if isinstance(group, bool) or not isinstance(group, int) or group <= 0:
        raise KernelError(f"NKI backend: group (query heads per KV head) must be a positive integer, got {group!r}")
    for name, blk in (("block_m", block_m), ("block_n", block_n)):
        if blk not in NKI_BLOCKS:
            raise KernelError(f"NKI backend: {name} must be one of {', '.join(map(str, NKI_BLOCKS))} "
                              f"(at most {PMAX} partitions), got {blk!r}")
        if seq_len % blk:
            raise KernelError(f"NKI backend: {name}={blk} must divide the sequence length {seq_len}")


def _runs(mask_rows: np.ndarray) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Per row of a boolean matrix: the runs (first, stop) of its true entries."""
    out = []
    for row in mask_rows:
        idx = np.flatnonzero(row)
        runs: list[tuple[int, int]] = []
        for x in idx.tolist():
            if runs and runs[-1][1] == x:
                runs[-1] = (runs[-1][0], x + 1)
            else:
                runs.append((x, x + 1))
        out.append(tuple(runs))
    return tuple(out)


def tile_classes(pattern: Pattern, seq_len: int, block_m: int, block_n: int) -> tuple[np.ndarray, np.ndarray]:
    """Boolean [query blocks, key blocks] matrices of the full and of the partial tiles."""
    runs = tile_runs(pattern, seq_len, seq_len, block_m, block_n)
    tm = runs.to_tile_map()
    nqb, nkb = runs.num_q_blocks, runs.num_k_blocks
    full = np.zeros((nqb, nkb), dtype=bool)
    part = np.zeros((nqb, nkb), dtype=bool)
    for ptr, cols, dst in ((tm.full_rowptr, tm.full_cols, full), (tm.part_rowptr, tm.part_cols, part)):
        ptr = np.asarray(ptr)
        rows = np.repeat(np.arange(nqb), np.diff(ptr))
        dst[rows, np.asarray(cols)] = True
    return full, part


@lru_cache(maxsize=None)
def _environment() -> jinja2.Environment:
    root = data_folder("templates") / "nki"
    loader = jinja2.FunctionLoader(lambda name: (root / name).read_text(encoding="utf-8"))
    return jinja2.Environment(loader=loader, undefined=jinja2.StrictUndefined, trim_blocks=True,
                              lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)


def _template(name: str) -> jinja2.Template:
    root = data_folder("templates") / "nki"
    if not (root / name).is_file():
        raise KernelError(f"NKI template {name!r} not found in {root}")
    return _environment().get_template(name)


def render_nki(pattern: Pattern, seq_len: int, head_dim: int = 128, group: int = 1, *,
               block_m: int | None = None, block_n: int | None = None) -> str:
    """Source of the NKI kernel module for `pattern` at `seq_len` x `seq_len` (queries = keys),
    checked against the documented API surface (`nki_api.check_kernel_source`)."""
    if block_m is None and isinstance(seq_len, int) and not isinstance(seq_len, bool) and seq_len > 0:
        block_m = choose_block(seq_len)
    if block_n is None:
        block_n = block_m
    _check(pattern, seq_len, head_dim, group, block_m, block_n)
    full, part = tile_classes(pattern, seq_len, block_m, block_n)
    mask = lower_mask(pattern, "qi", "kj")
    key = int(hashlib.sha256(repr((repr(pattern), seq_len, head_dim, group, block_m, block_n,
                                   NKI_TEMPLATE_VERSION)).encode()).hexdigest()[:10], 16)
    src = _template("kernels.py.jinja").render(
        pattern_repr=" ".join(repr(pattern).split()),
        pattern_literal=repr(repr(pattern)),
        predicate_source=" ".join(pattern.predicate_source().split()),
        seq_len=seq_len, head_dim=head_dim, group=group, block_m=block_m, block_n=block_n,
        num_q_blocks=full.shape[0], num_k_blocks=full.shape[1],
        scale=repr(1.0 / math.sqrt(head_dim)),
        full_runs=repr(_runs(full)), part_runs=repr(_runs(part)),
        col_full_runs=repr(_runs(full.T)), col_part_runs=repr(_runs(part.T)),
        prefill_name=check_identifier(f"sas_nki_attention_{key:010x}", "kernel name"),
        score_name=check_identifier(f"sas_nki_score_{key:010x}", "kernel name"),
        mask_lines=mask.lines, mask_name=mask.name,
    )
    check_kernel_source(src, KERNEL_FILE)
    return src


def kernel_names(source: str) -> tuple[str, str]:
    """(attention kernel, score kernel) names defined in a rendered module."""
    tree = check_kernel_source(source)
    names = [n.name for n in tree.body if hasattr(n, "decorator_list") and n.decorator_list]
    att = [n for n in names if n.startswith("sas_nki_attention_")]
    sc = [n for n in names if n.startswith("sas_nki_score_")]
    if len(att) != 1 or len(sc) != 1:
        raise KernelError("NKI module: expected one attention and one score kernel")
    return att[0], sc[0]


def nki_files(plan: Any, head_dim: int, dtype: str, num_heads: int, num_kv_heads: int,
              batch: int) -> tuple[dict[str, str | bytes], dict[str, Any]]:
    """Files and report of `sas compile --backend nki` (compile_pattern's NKI branch)."""
    if dtype not in NKI_DTYPES:
        raise KernelError(f"NKI backend: dtype {dtype!r} is not supported; supported: {', '.join(NKI_DTYPES)}")
    notes: list[str] = []
    pattern = plan.pattern
    if plan.is_dynamic:
        split = plan.split
        if split is None:
            raise NotYetSupportedError(f"NKI backend: the pattern {pattern!r} has no static/dynamic split")
        pattern = split.full
        notes.append("dynamic pattern: the kernels cover its static form (the Dynamic as its whole region) and "
                     "the importance scores; run-time selection, eviction and decode are not generated for NKI")
    seq_len = int(plan.max_len)
    group = num_heads // num_kv_heads
    block = choose_block(seq_len)
    src = render_nki(pattern, seq_len, head_dim, group, block_m=block, block_n=block)
    attention, score = kernel_names(src)
    full, part = tile_classes(pattern, seq_len, block, block)
    report: dict[str, Any] = {
        "pattern": repr(plan.pattern), "kernel_pattern": repr(pattern), "backend": "nki",
        "template_version": NKI_TEMPLATE_VERSION, "max_len": seq_len, "head_dim": head_dim, "dtype": dtype,
        "batch": batch, "num_heads": num_heads, "num_kv_heads": num_kv_heads,
        "predicate": pattern.predicate_source(), "block_m": block, "block_n": block,
        "kernels": {"attention": attention, "score": score},
        "tiles": {"full": int(full.sum()), "partial": int(part.sum()),
                  "empty": int(full.size - full.sum() - part.sum()), "total": int(full.size)},
        "verified": "parsed, API-checked against sas.codegen.nki_api, emulated in numpy "
                    "(sas.codegen.nki_emulator); not compiled by neuronx-cc, not run on Trainium",
        "notes": notes,
        "files": [KERNEL_FILE, "README.md", "report.json"],
    }
    files: dict[str, str | bytes] = {KERNEL_FILE: src}
    decode_name = None
    if not plan.is_dynamic and plan.can_decode:
        try:
            dsrc = render_nki_decode(plan.analysis, head_dim, group)
        except NotYetSupportedError as e:
            notes.append(f"decode not generated: {e}")
        else:
            files[DECODE_FILE] = dsrc
            decode_name = next(line.split("(")[0][4:] for line in dsrc.splitlines()
                               if line.startswith("def sas_nki_decode_"))
            report["kernels"]["decode"] = decode_name
            report["decode_takes_slot_keys"] = f"def {decode_name}(q, k_cache, v_cache, position, slot_keys)" in dsrc
            fill_name = next((line.split("(")[0][4:] for line in dsrc.splitlines()
                              if line.startswith("def sas_nki_fill_cache_")), None)
            if fill_name:
                report["kernels"]["fill_cache"] = fill_name
            else:
                notes.append("no NKI fill_cache kernel (slot_key_func is a table search): the host writes the "
                             "prompt's keys with cache_id_func; the decode kernel then takes slot_keys")
            report["cache_size"] = int(plan.analysis.cache_size)
            report["decode_block_n"] = int(dsrc.split("BLOCK_N = ")[1].split("\n")[0])
            report["files"].insert(1, DECODE_FILE)
    elif not plan.is_dynamic and plan.causal:
        notes.append(f"decode not generated: the analysis failed ({plan.analysis_error})")
    elif not plan.is_dynamic:
        notes.append("pattern is not causal: prefill only (decode needs a causal pattern)")
    readme = _template("README.md.jinja").render(r=report, attention=attention, score=score, group=group,
                                                 decode=decode_name, fill=report["kernels"].get("fill_cache"))
    files["README.md"] = readme
    files["report.json"] = json.dumps(report, indent=2) + "\n"
    return files, report


def load_emulated(source: str) -> dict[str, Any]:
    """The rendered module executed against the numpy emulator (its namespace)."""
    from sas.codegen.nki_emulator import load_kernel_module
    return load_kernel_module(source)




DECODE_FILE = "nki_decode.py"


def render_nki_decode(analysis: Any, head_dim: int = 128, group: int = 1) -> str:
    """Source of the NKI decode module for an `Analysis` of a causal static pattern: attention of
    one new token over the compact cache with `mask_func` inlined, or, where mask_func is not
    an expression (a table search), with the pattern's predicate applied to the key each slot
    holds (the kernel then takes `slot_keys`)."""
    if head_dim not in NKI_HEAD_DIMS:
        raise KernelError(f"NKI backend: head_dim {head_dim!r} is not supported; supported: "
                          f"{', '.join(map(str, NKI_HEAD_DIMS))}")
    if isinstance(group, bool) or not isinstance(group, int) or not 0 < group <= PMAX:
        raise KernelError(f"NKI backend: group (query heads per KV head) must be in 1..{PMAX}, got {group!r}")
    if int(analysis.max_len) >= EXACT_INT:
        raise KernelError(f"NKI decode: max_len must be below {EXACT_INT} (float32-exact index arithmetic)")
    from sas.codegen.lower_nki import lower_function_mask
    import ast as _ast
    from sas.codegen.lower_nki import lower_mask
    try:
        mask = lower_function_mask(analysis.functions, "mask_func", ["slot", "pos"], "slot",
                                   tables=dict(analysis.tables))
        held_keys = False
    except NotYetSupportedError:
        # mask_func is not an expression (a table search): the host passes the key each slot
        # holds and the kernel applies the pattern's predicate to it, which is what mask_func
        # computes (the Triton backend's fallback too)
        mask = lower_mask(analysis.pattern, "pos", "key")
        held_keys = True
    from sas.codegen.lower_nki import lower_function_value
    try:
        fill = lower_function_value(analysis.functions, "slot_key_func", ["slot", "pos"], "slot",
                                    tables=dict(analysis.tables))
    except (NotYetSupportedError, KernelError):
        fill = None   # slot_key_func is a table search: the host fills the cache (README)
    cache = int(analysis.cache_size)
    block_n = next(b for b in NKI_BLOCKS if b <= max(16, cache)) if cache < PMAX else PMAX
    # the module's statements, with the tables of a table scheme written out after its import
    defs = [s for s in _ast.parse(analysis.source).body if isinstance(s, (_ast.FunctionDef, _ast.Assign, _ast.Import))]
    functions_source = "\n\n\n".join(_ast.unparse(d) for d in defs).splitlines()
    key = int(hashlib.sha256(repr((repr(analysis.pattern), int(analysis.max_len), cache, head_dim, group,
                                   analysis.source, NKI_TEMPLATE_VERSION)).encode())
              .hexdigest()[:10], 16)
    src = _template("decode.py.jinja").render(
        pattern_repr=" ".join(repr(analysis.pattern).split()), pattern_literal=repr(repr(analysis.pattern)),
        scheme=" ".join(str(getattr(analysis, "scheme", "?")).split()), max_len=int(analysis.max_len),
        cache_size=cache, head_dim=head_dim, group=group, block_n=block_n,
        num_slot_blocks=-(-cache // block_n), scale=repr(1.0 / math.sqrt(head_dim)),
        functions_source=functions_source, mask_lines=mask.lines, mask_name=mask.name, held_keys=held_keys,
        decode_name=check_identifier(f"sas_nki_decode_{key:010x}", "kernel name"),
        fill_name=check_identifier(f"sas_nki_fill_cache_{key:010x}", "kernel name") if fill else None,
        fill_lines=fill.lines if fill else (), fill_name_held=fill.name if fill else "",
    )
    check_kernel_source(src, DECODE_FILE)
    return src


__all__ = ["DECODE_FILE", "KERNEL_FILE", "NKI_BLOCKS", "NKI_DTYPES", "NKI_HEAD_DIMS", "NKI_TEMPLATE_VERSION",
           "choose_block", "kernel_names", "nki_files", "render_nki", "render_nki_decode", "tile_classes"]
