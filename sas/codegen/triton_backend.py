"""The Triton backend: renders the kernel templates in templates/triton/ with lowered pattern
and cache functions, and loads the result as Python modules (cached in memory and on disk).

Templates hold the kernel text; this module holds the decisions (tile sizes, warps, stages,
what gets inlined). A rendered module imports only torch and triton and can be used on its
own (see `prefill(...)` / `decode(...)` in the generated files).
"""

from __future__ import annotations

import ast
import base64
import hashlib
import importlib.util
import os
import sys
import threading
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import jinja2

import numpy as np

from sas.atomic_files import replace_file
from sas.codegen.lower_triton import (
    LoweredFunction,
    check_identifier,
    find_function,
    lower_expr,
    lower_function,
    lower_predicate,
    table_refs,
)
from sas.errors import KernelError, NotYetSupportedError, SASError
from sas.resources import data_folder

if TYPE_CHECKING:   # importlib.resources.abc is new in Python 3.11
    from importlib.resources.abc import Traversable
from sas.ir.tile_period import tile_period
from sas.ir.tile_runs import tile_runs

#: Bumped whenever a template's meaning changes (part of every cache key).
TEMPLATE_VERSION = "4"

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)


@dataclass(frozen=True)
class PrefillOptions:
    """Tile shape and launch configuration of the prefill kernel (H100 defaults; see
    `auto_prefill_options` for the per-pattern choice)."""

    block_m: int = 64
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self):
        for name in ("block_m", "block_n"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 16 or v & (v - 1):
                raise KernelError(f"PrefillOptions.{name} must be a power of two >= 16, got {v!r}")
        _check_launch(self.num_warps, self.num_stages, "PrefillOptions")


@dataclass(frozen=True)
class DecodeOptions:
    """Slot-block size and launch configuration of the split-K decode kernel."""

    block_n: int = 64
    num_warps: int = 4
    #: software-pipelining depth of the slot loop's K/V loads where the loop multiplies with
    #: tl.dot (GQA groups, or `mha_dot`); Triton does not pipeline the one-query-row MHA loop
    #: (no tl.dot), and making it (tl.range num_stages) was 3-4x slower on H100
    #: (docs/benchmarks.md, "Software pipelining of the MHA slot loop")
    num_stages: int = 2
    #: programs per SM the split count aims for
    waves: int = 2
    #: at most about this many slot blocks per program: a longer cache gets more splits (not
    #: for a query group of 16 or more programs a split (batch x KV heads): that takes one wave
    #: of `waves` programs an SM, at least 2 splits, or one split where one split's programs
    #: fill over half of the SMs, at most one an SM, each with at most 24 blocks; the module's
    #: GROUP_ONE_WAVE_FROM and GROUP_ONE_SPLIT_BLOCKS)
    blocks_per_split: int = 4
    #: use tl.dot (query rows padded to 16) also when each kv head serves one query head
    mha_dot: bool = False
    #: skip slot blocks with no attended slot: "none", "mask" (each program tests the block's
    #: mask: a branch, which costs software pipelining) or "flags" (a small kernel marks the
    #: attended blocks once per step); None: decided from the pattern (`decode_skip_mode`)
    skip_mode: str | None = None
    #: merge the splits in the last program to finish (atomic ticket) instead of a second
    #: kernel; measured slower on H100, so off by default
    fused_combine: bool = False
    #: launch the decode's kernels as programmatic dependent launches (compute capability 9+;
    #: ignored elsewhere and under the interpreter): each kernel waits at its start for the
    #: kernel before it, so its launch overlaps that kernel's end. H100: ~1 us faster a step
    #: where the kernel before takes part in PDL (another decode, a Triton kernel launched with
    #: launch_pdl); after a plain kernel 0.4-0.6 us slower for a split decode with its combine
    #: launch, as fast for a one-launch decode. None (the default): on where the step is one
    #: launch (one split, no flags kernel), off otherwise (docs/benchmarks.md, "Programmatic
    #: dependent launch")
    pdl: bool | None = None
    #: write the new token's key and value into the cache after the slot loop rather than
    #: before it, so that the loop's first loads need not wait for that store (the loop uses
    #: the new token's values for its slot either way); None: after the loop for caches of at
    #: most `STORE_LAST_MAX_SLOTS` slots (H100: faster there, mixed above; docs/benchmarks.md,
    #: "The new token's store")
    store_new_last: bool | None = None

    def __post_init__(self):
        if self.store_new_last is not None and not isinstance(self.store_new_last, bool):
            raise KernelError(f"DecodeOptions.store_new_last must be None, True or False, "
                              f"got {self.store_new_last!r}")
        if self.skip_mode not in (None, "none", "mask", "flags"):
            raise KernelError(f"DecodeOptions.skip_mode must be None, 'none', 'mask' or 'flags', "
                              f"got {self.skip_mode!r}")
        if self.pdl is not None and not isinstance(self.pdl, bool):
            raise KernelError(f"DecodeOptions.pdl must be None, True or False, got {self.pdl!r}")
        if not isinstance(self.waves, int) or self.waves < 1:
            raise KernelError(f"DecodeOptions.waves must be a positive integer, got {self.waves!r}")
        if not isinstance(self.blocks_per_split, int) or self.blocks_per_split < 1:
            raise KernelError(f"DecodeOptions.blocks_per_split must be a positive integer, got {self.blocks_per_split!r}")
        v = self.block_n
        if not isinstance(v, int) or v < 16 or v & (v - 1):
            raise KernelError(f"DecodeOptions.block_n must be a power of two >= 16, got {v!r}")
        _check_launch(self.num_warps, self.num_stages, "DecodeOptions")


#: caches of at most this many slots store the new token after the decode's slot loop (see
#: `DecodeOptions.store_new_last`)
STORE_LAST_MAX_SLOTS = 512


#: query blocks beyond which `auto_prefill_options` counts tiles on a sample of them: 16
#: evenly spaced windows of 16 consecutive query blocks (windows, not single blocks, so that a
#: periodic pattern is not sampled at one phase of its period)
SAMPLED_BLOCKS = 256
_WINDOW = 16


def tiles_per_block(pattern, q_len: int, k_len: int, block_m: int, block_n: int) -> float:
    """Mean non-empty tiles per query block: exact up to `SAMPLED_BLOCKS` query blocks or where
    the square problem has a period (`sas.ir.tile_period`: counted in closed form), else on
    that many (each window classified alone, so memory and time stay small)."""
    nqb = -(-q_len // block_m)
    period = tile_period(pattern, q_len, block_m, block_n) if q_len == k_len and nqb > SAMPLED_BLOCKS else None
    if period is not None:
        from sas.runtime.tiles import schedule_counts, schedule_tensors   # (sas.runtime imports this module)

        c = schedule_counts(schedule_tensors(period, q_len))
        return (c["full"] + c["partial"]) / nqb
    if nqb <= SAMPLED_BLOCKS:
        r = tile_runs(pattern, q_len, k_len, block_m, block_n)
        return (r.num_full + r.num_partial) / nqb
    base = k_len - q_len
    starts = np.unique(np.linspace(0, nqb - _WINDOW, SAMPLED_BLOCKS // _WINDOW).astype(np.int64))
    total = blocks = 0
    for m in starts:
        rows = min(_WINDOW * block_m, q_len - int(m) * block_m)
        r = tile_runs(pattern, rows, k_len, block_m, block_n, base + int(m) * block_m)
        total += r.num_full + r.num_partial
        blocks += r.num_q_blocks
    return total / blocks


def narrow_tiles_pay(pattern, q_len: int, k_len: int, per_block: float) -> bool:
    """Whether 64 x 32 tiles compute at least 10% fewer cells than 64 x 64 ones, of which a query
    block has `per_block` on average (narrow column structure, e.g. 32 summary columns per block)."""
    return tiles_per_block(pattern, q_len, k_len, 64, 32) * 32 < 0.9 * per_block * 64


def wide_tiles_pay(pattern, q_len: int, k_len: int, per_block: float) -> bool:
    """Whether 128 x 128 tiles compute at most 15% more cells than 64 x 64 ones, of which a query
    block has `per_block` on average (runs of attended keys much wider than a tile: windows,
    causal rows), and a query block has at least 8 of them."""
    if per_block < 8:
        return False
    return tiles_per_block(pattern, q_len, k_len, 128, 128) * 128 <= 1.15 * per_block * 64


def auto_prefill_options(pattern, q_len: int, k_len: int | None = None, *, wide_kernel: bool = False) -> PrefillOptions:
    """The prefill configuration for this pattern and length (a decision fitted to H100
    measurements of the six Table-1 patterns at 16K, bf16, head dim 128):

    64 x 64 tiles, 4 warps, 3 stages; 64 x 32 tiles when they compute at least 10% fewer
    cells (narrow column structure, e.g. 32 summary columns per block) or when query blocks
    have few tiles (< 8 on average: short loops run better with the lighter tile); 128 x 128
    tiles with 8 warps for near-dense rows (>= 64 tiles of 64 x 64 per query block on average:
    fully causal at 8K and more ran 7-10% faster so on H100 and H200, 2026-11-23). Tile counts
    are exact up to 256 query blocks and estimated on 16 evenly spaced windows of 16 beyond.

    `wide_kernel`: the warp-specialized Gluon kernel runs these 128-row tiles (Hopper, 16-bit
    inputs, head dim 64 or 128; the generated module's `gluon_ok`). It also takes 128 x 128
    tiles where `wide_tiles_pay` (windows, streaming-LLM, fully causal from 2K: 7-28% faster
    than the 64-row Triton tiles on H100, 2026-11-27, docs/benchmarks.md "Gluon prefill").
    """
    k_len = q_len if k_len is None else k_len
    per_block = tiles_per_block(pattern, q_len, k_len, 64, 64)
    if narrow_tiles_pay(pattern, q_len, k_len, per_block) or per_block < 8:
        return PrefillOptions(64, 32, 4, 3)
    if per_block >= 64 or (wide_kernel and wide_tiles_pay(pattern, q_len, k_len, per_block)):
        return WIDE_TILES
    return PrefillOptions(64, 64, 4, 3)


def _check_launch(num_warps: Any, num_stages: Any, who: str) -> None:
    if num_warps not in (1, 2, 4, 8, 16):
        raise KernelError(f"{who}.num_warps must be one of 1, 2, 4, 8, 16, got {num_warps!r}")
    if not isinstance(num_stages, int) or not 1 <= num_stages <= 8:
        raise KernelError(f"{who}.num_stages must be an integer in 1..8, got {num_stages!r}")


#: 128 x 128 tiles with 8 warps: near-dense rows, and the tiles of the Hopper Gluon kernel
#: (`auto_prefill_options(wide_kernel=True)`, `TritonRuntime.wide_kernel`)
WIDE_TILES = PrefillOptions(128, 128, 8, 3)


# --- templates -------------------------------------------------------------------------------


def template_dir() -> Traversable:
    """The folder of the Triton templates: `$SAS_TEMPLATE_DIR/triton` when that variable is set
    (to try edited templates), else the templates that ship with sas (`sas.resources`)."""
    env = os.environ.get("SAS_TEMPLATE_DIR")
    if env:
        return Path(env) / "triton"
    return data_folder("templates") / "triton"


@lru_cache(maxsize=None)
def _environment(root: Traversable) -> jinja2.Environment:
    """A jinja2 environment over `root`: a FileSystemLoader on a real folder (it reloads
    edited templates), else a loader reading through importlib.resources (a zipped install)."""
    if isinstance(root, Path):
        loader: jinja2.BaseLoader = jinja2.FileSystemLoader(str(root))
    else:
        loader = jinja2.FunctionLoader(lambda name: (root / name).read_text(encoding="utf-8"))
    return jinja2.Environment(
        loader=loader,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def _render(template: str, **context: Any) -> str:
    root = template_dir()
    if not (root / template).is_file():
        raise KernelError(f"kernel template {template!r} not found in {root} (set SAS_TEMPLATE_DIR "
                          f"to the folder holding triton/{template})")
    source = _environment(root).get_template(template).render(**context)
    try:
        compile(source, template, "exec")
    except SyntaxError as e:  # a template bug, never user input: say where
        raise KernelError(f"rendered {template} is not valid Python (line {e.lineno}): {e.msg}") from None
    return source


def _digest(*parts: Any) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(repr(p).encode())
        h.update(b"\0")
    return h.hexdigest()


def pattern_key(pattern) -> str:
    """A stable hash of the pattern tree (its repr is canonical and holds every parameter)."""
    return _digest("pattern", repr(pattern))[:16]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def render_prefill(pattern, options: PrefillOptions = PrefillOptions()) -> str:
    """Source of the standalone prefill module for `pattern`."""
    if pattern.dynamics():
        raise NotYetSupportedError(
            "Dynamic components cannot be compiled yet: dynamic run-time selection is a "
            "separate issue; use a static pattern for now"
        )
    key = _digest(pattern_key(pattern), asdict(options), TEMPLATE_VERSION)[:12]
    predicate = lower_predicate(pattern, "qi", "kj")
    gluon_predicate = lower_predicate(pattern, "qi", "kj", dialect="gluon")
    torch_predicate = lower_predicate(pattern, "i", "j", dialect="torch")
    src = pattern.predicate_source()
    return _render(
        "prefill.py.jinja",
        kernel_name=check_identifier(f"sas_prefill_{key}", "kernel name"),
        pattern_repr=_one_line(repr(pattern)),
        pattern_literal=repr(repr(pattern)),
        predicate_source=_one_line(src),
        predicate_literal=repr(src),
        predicate=predicate,
        gluon_predicate=gluon_predicate,
        torch_predicate=torch_predicate,
        block_m=options.block_m,
        block_n=options.block_n,
        num_warps=options.num_warps,
        num_stages=options.num_stages,
    )


def _function_defs_source(functions: ast.Module) -> str:
    defs = [s for s in functions.body if isinstance(s, ast.FunctionDef)]
    return "\n\n".join(ast.unparse(d) for d in defs)


#: Tables longer than this are written into decode modules as base64 int32 bytes (a tuple
#: literal of a million entries takes tens of seconds to compile); shorter ones as tuples.
PACKED_TABLE_MIN = 4096


def _table_literal(name: str, values: tuple[int, ...]) -> str:
    """A Python expression for a table's values in a decode module (a tuple of ints)."""
    if len(values) <= PACKED_TABLE_MIN:
        return repr(tuple(values))
    arr = np.asarray(values, dtype=np.int64)
    if arr.min() < -(1 << 31) or arr.max() >= 1 << 31:
        raise KernelError(f"decode table {name} holds values outside int32 (the kernels' table type)")
    data = base64.b64encode(arr.astype("<i4").tobytes()).decode("ascii")
    # little-endian int32, read back by memoryview's native int (every target sas runs on)
    return f'tuple(memoryview(__import__("base64").b64decode("{data}")).cast("i"))'


def render_decode(analysis, options: DecodeOptions = DecodeOptions()) -> str:
    """Source of the standalone decode module for an `Analysis` (docs/architecture.md)."""
    functions = analysis.functions
    refs = table_refs(dict(analysis.tables))
    cache_id = find_function(functions, "cache_id_func")
    mask = find_function(functions, "mask_func")
    cache_id_fn = lower_function(cache_id, ["pos"], refs, module=functions, prefix="cid_")
    try:
        mask_fn = lower_function(mask, ["slot", "pos"], refs, boolean=True, module=functions, prefix="msk_")
        held_keys = False
    except NotYetSupportedError:
        # mask_func is not a lowerable expression (e.g. a table search): the kernel reads the
        # key each slot holds from an array the caller passes (`slot_keys`) and applies the
        # pattern's own predicate to it, which is what mask_func computes.
        pred = analysis.pattern.predicate(ast.Name("pos", ast.Load()), ast.Name("key", ast.Load()))
        mask_fn = LoweredFunction((), lower_expr(pred, {"pos": "pos", "key": "key"}, boolean=True))
        held_keys = True
    torch_cache_id_fn = lower_function(cache_id, ["pos"], refs, module=functions, prefix="cid_",
                                       dialect="torch")
    defs = _function_defs_source(functions)
    key = _digest(pattern_key(analysis.pattern), analysis.max_len, analysis.cache_size,
                  analysis.source, asdict(options), TEMPLATE_VERSION)[:12]
    tables = [
        {"arg": ref.arg, "name_literal": repr(name), "values_literal": _table_literal(name, ref.values)}
        for name, ref in refs.items()
    ]
    return _render(
        "decode.py.jinja",
        split_kernel=check_identifier(f"sas_decode_{key}", "kernel name"),
        flags_kernel=check_identifier(f"sas_decode_flags_{key}", "kernel name"),
        combine_kernel=check_identifier(f"sas_decode_combine_{key}", "kernel name"),
        pattern_repr=_one_line(repr(analysis.pattern)),
        pattern_literal=repr(repr(analysis.pattern)),
        cache_size=int(analysis.cache_size),
        max_len=int(analysis.max_len),
        scheme=_one_line(str(getattr(analysis, "scheme", "?"))),
        functions_comment=[("    " + line).rstrip() for line in defs.splitlines()],
        functions_literal=repr(defs),
        tables=tables,
        cache_id_lines=cache_id_fn.lines,
        cache_id_expr=cache_id_fn.expr,
        torch_cache_id_lines=torch_cache_id_fn.lines,
        torch_cache_id_expr=torch_cache_id_fn.expr,
        held_keys=held_keys,
        mask_lines=mask_fn.lines,
        mask_expr=mask_fn.expr,
        block_n=options.block_n,
        num_warps=options.num_warps,
        num_stages=options.num_stages,
        waves=options.waves,
        blocks_per_split=options.blocks_per_split,
        mha_dot=bool(options.mha_dot),
        skip_mode=options.skip_mode if options.skip_mode is not None else decode_skip_mode(analysis, options.block_n),
        fused_combine=bool(options.fused_combine),
        store_new_last=(options.store_new_last if options.store_new_last is not None
                        else int(analysis.cache_size) <= STORE_LAST_MAX_SLOTS),
    )


def auto_decode_options(analysis, group: int = 1, elem_bytes: int = 2) -> DecodeOptions:
    """The decode configuration (a decision fitted to H100 measurements of the six Table-1
    patterns at 2K-16K, bf16, head dim 128, 64 heads batch 1 and 32/8 heads batch 16):
    64-slot blocks, 4 warps, 2 stages, splits for about 2 programs per SM, separate combine
    kernel; 32-slot blocks when each kv head serves one query head and the cache is not a
    multiple of 64 slots (a ragged last block then costs a whole iteration). For one query head
    per kv head and 129-512 slots, 32-slot blocks and splits for about 3 programs per SM: at 384
    slots the 64-slot rule leaves 3 splits of 2 blocks (ceil rounding), 32-slot blocks give 6
    splits of 2 (H100, 64 heads, 2026-11-26: 8.5 -> 7.0 us at batch 1, 26.4 -> 25.2 at 4,
    84.9 -> 83.7 at 16; the same blocks were 18% slower at 1024 slots and 1.9x slower at 64,
    batch 1; `benchmarks/sweep_decode_small.py`). With 32-slot blocks, at most about 6 blocks a
    program (192 slots) rather than 4: faster in 16 of 18 H100 cases (streaming-LLM, OpenAI
    fixed and strided at 2K and 16K, batch 1, 4, 16: up to 17% at batch 1, 34% for
    openai-strided at batch 16), 6% slower for openai-strided at 2K batch 1. Query groups
    (tl.dot) pipeline 3 stages deep: H100, 32 / 8 heads, batch 16, 16K, with the new token's
    column after the slot loop: 2272 slots 58.4 us at 2 splits (2 stages: 62.3, 58.9 at 3
    splits), 1024 / 1056 slots 28.2 / 30.2 us at one split against 29.9 / 31.3 for 2 stages at
    their best split count (2026-11-28, `benchmarks/results/2026-11-28-h100-decode-new-column-ab.md`).
    fp32 (`elem_bytes` 4) keeps 2 stages: 3 would need 143 KB of shared memory a program at head
    dim 128, more than sm_86 / sm_89 GPUs have."""
    C = int(analysis.cache_size)
    if group == 1 and 128 < C <= 512:
        return DecodeOptions(block_n=32, waves=3, blocks_per_split=6)
    if group == 1 and C > 128 and C % 64:
        return DecodeOptions(block_n=32, blocks_per_split=6)
    if group > 1 and elem_bytes <= 2:
        return DecodeOptions(num_stages=3)
    return DecodeOptions()


#: cache slots `attended_fraction` tests per position at most (evenly spaced)
SAMPLED_SLOTS = 4096


def attended_fraction(analysis, positions: int = 8) -> float:
    """Mean fraction of cache slots a query attends, over a few positions in the last quarter
    of max_len (`mask_func` on at most `SAMPLED_SLOTS` evenly spaced slots per position: no
    table over max_len)."""
    n, C = int(analysis.max_len), int(analysis.cache_size)
    if C <= 0:
        return 0.0
    slots = np.unique(np.linspace(0, C - 1, min(C, SAMPLED_SLOTS)).astype(np.int64))
    fr = []
    for p in np.unique(np.linspace(max(0, n - 1 - n // 4), n - 1, positions).astype(np.int64)):
        fr.append(np.mean([bool(analysis.mask_func(int(s), int(p))) for s in slots]))
    return float(np.mean(fr))


def rows_attend_under_half(analysis) -> bool:
    """Whether a decode row attends under half of the cache (e.g. a strided pattern whose cache
    holds keys for later queries): where skipping unattended slot blocks pays."""
    return attended_fraction(analysis) < 0.5


#: slot blocks from which skipping through a per-step flags kernel pays (fewer: each program
#: tests its blocks' masks), for the static decode (`decode_skip_mode`) and the dynamic decode's
#: static segment (rendered into its module, read by `dynamic_host.uses_flags`)
FLAGS_FROM_BLOCKS = 16


def decode_skip_mode(analysis, block_n: int = 64) -> str:
    """Skip empty slot blocks when queries attend under half of the cache
    (`rows_attend_under_half`), through a per-step flags kernel when the cache has at least
    `FLAGS_FROM_BLOCKS` blocks; otherwise keep the loop branch-free so that loads pipeline."""
    if not rows_attend_under_half(analysis):
        return "none"
    return "flags" if -(-int(analysis.cache_size) // block_n) >= FLAGS_FROM_BLOCKS else "mask"


# --- loading and caching -----------------------------------------------------------------------


def cache_dir() -> Path:
    env = os.environ.get("SAS_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sas" / "triton"


_lock = threading.Lock()
_modules: dict[tuple[str, str], ModuleType] = {}
_rendered: dict[tuple, str] = {}


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename (never half-written)."""
    replace_file(path, lambda tmp: Path(tmp).write_text(text))


def load_source(source: str, stem: str, directory: Path | None = None) -> ModuleType:
    """Import a rendered module. It is written to disk first (Triton reads kernel source from
    the file); identical sources are loaded once per process and cache folder."""
    check_identifier(stem, "module name")
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    name = f"{stem}_{digest}"
    directory = Path(directory) if directory is not None else cache_dir()
    key = (str(directory.resolve()), name)
    with _lock:
        mod = _modules.get(key)
        if mod is not None:
            return mod
        path = directory / f"{name}.py"
        try:
            if not path.is_file() or path.read_text() != source:
                write_atomic(path, source)
        except OSError as e:
            raise KernelError(f"cannot write the kernel cache under {directory}: {e} "
                              f"(set SAS_CACHE_DIR to a writable folder)") from None
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except SASError:
            raise
        except Exception as e:  # pragma: no cover - a template bug
            del sys.modules[name]
            raise KernelError(f"loading generated kernel module {path} failed: {e}") from e
        _modules[key] = mod
        return mod


def prefill_module(pattern, options: PrefillOptions = PrefillOptions(),
                   directory: Path | None = None) -> ModuleType:
    key = ("prefill", pattern_key(pattern), options, TEMPLATE_VERSION)
    src = _rendered.get(key)
    if src is None:
        src = _rendered[key] = render_prefill(pattern, options)
    return load_source(src, "sas_prefill", directory)


def decode_module(analysis, options: DecodeOptions = DecodeOptions(),
                  directory: Path | None = None) -> ModuleType:
    key = ("decode", pattern_key(analysis.pattern), analysis.max_len, analysis.cache_size,
           _digest(analysis.source), options, TEMPLATE_VERSION)
    src = _rendered.get(key)
    if src is None:
        src = _rendered[key] = render_decode(analysis, options)
    return load_source(src, "sas_decode", directory)


# --- dynamic patterns --------------------------------------------------------------------------


def render_dynamic_decode(cplan, block_n: int = 64, num_warps: int = 4) -> str:
    """Source of the standalone decode module of a dynamic pattern (a
    `sas.dynamic.cache_plan.DynamicCachePlan`): attention over the static segment and the pool,
    the split combine, the score kernel (step 1 of the update over slot blocks, for large caches)
    and the update kernel (score, expiry, eviction, staging)."""
    plan, static = cplan.plan, cplan.static_analysis
    pos, key, slot = (ast.Name(n, ast.Load()) for n in ("pos", "key", "slot"))
    if static is not None:
        functions = static.functions
        cache_id = find_function(functions, "cache_id_func")
        mask = find_function(functions, "mask_func")
        cid = lower_function(cache_id, ["pos"], {}, module=functions, prefix="cid_")
        ecid = lower_function(cache_id, ["ekey"], {}, module=functions, prefix="ecid_")
        kcid = lower_function(cache_id, ["key"], {}, module=functions, prefix="kcid_")
        tcid = lower_function(cache_id, ["pos"], {}, module=functions, prefix="cid_", dialect="torch")
        msk = lower_function(mask, ["slot", "pos"], {}, boolean=True, module=functions, prefix="msk_")
        static_key = ast.unparse(functions)
    else:
        cid = ecid = kcid = LoweredFunction((), "-1")
        tcid = LoweredFunction((), "-1")
        msk = LoweredFunction((), "slot < 0")
        static_key = "empty"
    region_expr = lower_expr(plan.region.predicate(pos, key), {"pos": "pos", "key": "key"}, boolean=True)
    fused = cplan.fused
    # (the region tables' form, and the update kernel's position ticket: the dynamic template's
    # changes of 2026-11-28, which leave the static templates and their names as they were)
    key_digest = _digest(pattern_key(plan.pattern), cplan.max_len, cplan.pool_size, static_key,
                         repr(fused), block_n, num_warps, TEMPLATE_VERSION, "tables", cplan.table_rows,
                         cplan.table_period, "ticket")[:12]
    return _render(
        "dynamic_decode.py.jinja",
        attn_kernel=check_identifier(f"sas_dyn_decode_{key_digest}", "kernel name"),
        flags_kernel=check_identifier(f"sas_dyn_flags_{key_digest}", "kernel name"),
        combine_kernel=check_identifier(f"sas_dyn_combine_{key_digest}", "kernel name"),
        score_kernel=check_identifier(f"sas_dyn_score_{key_digest}", "kernel name"),
        update_kernel=check_identifier(f"sas_dyn_update_{key_digest}", "kernel name"),
        pattern_repr=_one_line(repr(plan.pattern)),
        pattern_literal=repr(repr(plan.pattern)),
        static_repr=_one_line(repr(plan.static)),
        static_size=cplan.static_size,
        static_sparse=static is not None and rows_attend_under_half(static),
        flags_from_blocks=FLAGS_FROM_BLOCKS,
        pool_size=cplan.pool_size,
        region_source=_one_line(ast.unparse(plan.region.predicate(pos, key))),
        budget=plan.budget,
        refresh=bool(plan.refresh),
        score_repr=_one_line(repr(plan.dynamic.score)),
        max_len=cplan.max_len,
        max_entering=cplan.max_entering,
        table_rows=cplan.table_rows,
        table_period=cplan.table_period,
        reduce=fused.reduce if fused else None,
        reduce_literal=repr(fused.reduce if fused else None),
        epilogue_expr=fused.triton_expr("x") if fused else "x",
        block_n=block_n,
        num_warps=num_warps,
        cache_id_lines=cid.lines, cache_id_expr=cid.expr,
        enter_cache_id_lines=ecid.lines, enter_cache_id_expr=ecid.expr,
        torch_cache_id_lines=tcid.lines, torch_cache_id_expr=tcid.expr,
        mask_lines=msk.lines, mask_expr=msk.expr,
        region_expr=region_expr,
        static_pred_lines=(),
        static_pred_expr=(lower_expr(plan.static.predicate(pos, key), {"pos": "pos", "key": "key"}, boolean=True)
                          if static is not None else "key < 0"),
        key_cache_id_lines=kcid.lines, key_cache_id_expr=kcid.expr,
        torch_region=lower_predicate(plan.region, "i", "j", dialect="torch"),
    )


def dynamic_decode_module(cplan, directory: Path | None = None) -> ModuleType:
    return load_source(render_dynamic_decode(cplan), "sas_dyn_decode", directory)
