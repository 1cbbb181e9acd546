"""The CUDA backend: rendering templates/cuda/*.jinja for one pattern and building them with nvcc.

- `render_cuda(pattern, analysis)`: the `.cu` source (block-sparse prefill for the pattern;
  split-K decode over the compact cache when `analysis` is given and its `mask_func` lowers to
  an expression) with the pattern's predicate and the synthesized `cache_id_func` / `mask_func`
  printed as C++ by `sas.codegen.printers` (the walker the Triton backend uses);
- `render_loader(...)`: the small Python module that loads the built library through ctypes
  and launches its entry points on torch tensors (`loader.py` of `sas compile --backend cuda`,
  and what `sas.runtime.cuda.CudaRuntime` runs);
- `find_nvcc()`, `nvcc_command(...)`, `build_library(...)`, `check_compiles(...)`: nvcc,
  called directly (docs/cuda.md says why not torch.utils.cpp_extension), with the compiler's
  message trimmed into a `KernelError`; built libraries are cached by a hash of the source and
  the command.

Templates hold the kernel text; every decision (tile sizes, which functions, names) is here.
"""

from __future__ import annotations

import ast
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from importlib.abc import Traversable
from pathlib import Path
from typing import Any

import jinja2

from sas.codegen.printers import (
    LoweredFunction,
    check_identifier,
    find_function,
    lower_function,
    lower_predicate,
    table_refs,
)
from sas.errors import KernelError, NotYetSupportedError
from sas.resources import data_folder

#: bump when the templates change (part of every cache key)
CUDA_TEMPLATE_VERSION = "cuda-5"
SUPPORTED_HEAD_DIMS = (64, 128)
#: dtype name -> the code the entry points take
CUDA_DTYPES = {"bfloat16": 0, "float16": 1}
#: default key-block width of the prefill kernel (templates/cuda/kernels.cu.jinja; 32 also built)
BLOCK_N = 64
DEFAULT_ARCH = "sm_90"
#: characters of compiler output kept in an error message
MESSAGE_CHARS = 1500
BUILD_TIMEOUT_S = 600


def template_dir() -> Path | Traversable:
    env = os.environ.get("SAS_TEMPLATE_DIR")
    if env:
        return Path(env) / "cuda"
    return data_folder("templates") / "cuda"


@lru_cache(maxsize=None)
def _environment(root: Path | Traversable) -> jinja2.Environment:
    if isinstance(root, Path):
        loader: jinja2.BaseLoader = jinja2.FileSystemLoader(str(root))
    else:
        loader = jinja2.FunctionLoader(lambda name: (root / name).read_text(encoding="utf-8"))
    return jinja2.Environment(loader=loader, undefined=jinja2.StrictUndefined, trim_blocks=True,
                              lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)


def _render(template: str, **context: Any) -> str:
    root = template_dir()
    if not (root / template).is_file():
        raise KernelError(f"kernel template {template!r} not found in {root} (set SAS_TEMPLATE_DIR to the folder "
                          f"holding cuda/{template})")
    return _environment(root).get_template(template).render(**context)


def render_template(template: str, **context: Any) -> str:
    """A CUDA template of templates/cuda rendered with `context` (a KernelError when it is missing)."""
    return _render(template, **context)


def _digest(*parts: Any) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(repr(p).encode())
        h.update(b"\0")
    return h.hexdigest()


def _one_line(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class CudaSource:
    """A rendered pattern: the `.cu` text, its symbol prefix (`<namespace>_prefill`,
    `<namespace>_decode`), whether it has the decode kernel (and why not), the cache size and
    the cache-function tables (name -> values, passed to decode in this order); `held_keys`:
    mask_func is not an inlinable expression, so decode takes the key each slot holds
    (`slot_keys`) and applies the pattern's predicate to it."""

    source: str
    namespace: str
    decode: bool
    decode_note: str | None
    cache_size: int
    tables: tuple[tuple[str, tuple[int, ...]], ...]
    torch_cache_id: LoweredFunction | None
    held_keys: bool = False


def check_head_dim(head_dim: Any, where: str = "cuda backend") -> int:
    if isinstance(head_dim, bool) or head_dim not in SUPPORTED_HEAD_DIMS:
        raise KernelError(f"{where}: head_dim {head_dim!r} is not supported by the cuda backend; supported: "
                          f"{', '.join(map(str, SUPPORTED_HEAD_DIMS))}")
    return int(head_dim)


def check_dtype(dtype: str, where: str = "cuda backend") -> int:
    if dtype not in CUDA_DTYPES:
        raise KernelError(f"{where}: dtype {dtype!r} is not supported by the cuda backend; supported: "
                          f"{', '.join(CUDA_DTYPES)}")
    return CUDA_DTYPES[dtype]


def render_cuda(pattern: Any, analysis: Any = None) -> CudaSource:
    """The CUDA source of `pattern`'s kernels; with `analysis` (a causal pattern's
    `sas.analyze` result) also the decode kernel over its compact cache."""
    if pattern.dynamics():
        raise NotYetSupportedError("cuda backend: patterns with a Dynamic component are not supported (their "
                                   "run-time selection runs on the triton backend); use a static pattern")
    predicate = lower_predicate(pattern, "qi", "kj", dialect="cpp")
    decode, note = analysis is not None, None
    context: dict[str, Any] = dict(cache_size=0, scheme="", functions_comment=[], tables=[], cache_id_lines=(),
                                   cache_id_expr="-1", mask_lines=(), mask_expr="false", held_keys=False)
    tables: tuple[tuple[str, tuple[int, ...]], ...] = ()
    torch_cid = None
    if analysis is not None:
        functions = analysis.functions
        refs = table_refs(dict(analysis.tables))
        cache_id = find_function(functions, "cache_id_func")
        mask = find_function(functions, "mask_func")
        try:
            cid = lower_function(cache_id, ["pos"], refs, module=functions, prefix="cid_", dialect="cpp")
            torch_cid = lower_function(cache_id, ["pos"], refs, module=functions, prefix="cid_", dialect="torch")
        except NotYetSupportedError as e:
            decode, note = False, (f"decode not generated: cache_id_func is not an inlinable expression ({e}); "
                                   f"the triton backend cannot lower it either")
        else:
            try:
                msk = lower_function(mask, ["slot", "pos"], refs, boolean=True, module=functions, prefix="msk_",
                                     dialect="cpp")
            except NotYetSupportedError:
                # mask_func is not a lowerable expression (e.g. a table search): the kernel reads the
                # key each slot holds from `slot_keys` (the caller's, made by the runtime) and applies
                # the pattern's predicate to it, which is what mask_func computes (as in Triton).
                msk, held = LoweredFunction((), "false"), True
            else:
                held = False
            defs = "\n\n".join(ast.unparse(s) for s in functions.body if isinstance(s, ast.FunctionDef))
            tables = tuple((name, ref.values) for name, ref in refs.items())
            context.update(
                cache_size=int(analysis.cache_size), scheme=_one_line(str(getattr(analysis, "scheme", "?"))),
                functions_comment=[("    " + line).rstrip() for line in defs.splitlines()],
                tables=[{"arg": ref.arg} for ref in refs.values()],
                cache_id_lines=cid.lines, cache_id_expr=cid.expr, mask_lines=msk.lines, mask_expr=msk.expr,
                held_keys=held)
    key = _digest(repr(pattern), predicate, context, CUDA_TEMPLATE_VERSION)[:12]
    namespace = check_identifier(f"sas_cuda_{key}", "kernel namespace")
    source = _render("kernels.cu.jinja", namespace=namespace, pattern_repr=_one_line(repr(pattern)),
                     predicate_source=_one_line(pattern.predicate_source()), predicate=predicate, decode=decode,
                     **context)
    return CudaSource(source, namespace, decode, note, int(context["cache_size"]), tables, torch_cid,
                      bool(context["held_keys"]))


def render_loader(cs: CudaSource, pattern: Any, max_len: int) -> str:
    """The loader module for a rendered source (see the module doc)."""
    tcid = cs.torch_cache_id or LoweredFunction((), "-1")
    src = _render("loader.py.jinja", namespace=cs.namespace, pattern_literal=repr(repr(pattern)),
                  torch_predicate=lower_predicate(pattern, "i", "j", dialect="torch"),
                  cache_size=cs.cache_size, max_len=int(max_len), decode=cs.decode, held_keys=cs.held_keys,
                  tables=[{"arg": f"tbl_{name}", "name_literal": repr(name), "values_literal": repr(values)}
                          for name, values in cs.tables],
                  torch_cache_id_lines=tcid.lines, torch_cache_id_expr=tcid.expr, block_n=BLOCK_N,
                  nvcc_flags=repr(list(NVCC_FLAGS)), template_version=repr(CUDA_TEMPLATE_VERSION),
                  wgmma_arch=repr(WGMMA_ARCH), wgmma_define=repr(WGMMA_DEFINE))
    try:
        compile(src, "loader.py", "exec")
    except SyntaxError as e:  # a template bug, never user input
        raise KernelError(f"rendered loader.py is not valid Python (line {e.lineno}): {e.msg}") from None
    return src


# --- nvcc --------------------------------------------------------------------------------------------

NVCC_FLAGS = ("-O3", "-std=c++17", "--use_fast_math", "-Xcompiler", "-fPIC", "-lineinfo")


def find_nvcc() -> str:
    """The nvcc to use: $SAS_NVCC, else `nvcc` on PATH, else $CUDA_HOME/bin/nvcc or
    /usr/local/cuda/bin/nvcc; KernelError when there is none."""
    env = os.environ.get("SAS_NVCC")
    if env:
        if not (os.path.isfile(env) and os.access(env, os.X_OK)):
            raise KernelError(f"cuda backend: SAS_NVCC={env!r} is not an executable file")
        return env
    found = shutil.which("nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
            return os.path.join(home, "bin", "nvcc")
    raise KernelError("cuda backend: nvcc (the CUDA compiler) was not found on PATH, in $CUDA_HOME/bin or "
                      "/usr/local/cuda/bin; install the CUDA toolkit or set SAS_NVCC to its nvcc")


def check_arch(arch: str) -> str:
    if not (isinstance(arch, str) and arch.startswith("sm_") and arch[3:].rstrip("a").isdigit()):
        raise KernelError(f"cuda backend: arch {arch!r} is not a CUDA target like 'sm_90'")
    return arch


#: The architecture-specific Hopper target (9.0 devices build for it) and the define it implies:
#: the wgmma prefill kernel. Plain sm_90 keeps the mma.sync one. The rendered loader carries both.
WGMMA_ARCH = "sm_90a"
WGMMA_DEFINE = "-DSAS_WGMMA"


def device_arch(major: int, minor: int) -> str:
    """The target for a device of compute capability (major, minor): Hopper (9.0) builds for
    WGMMA_ARCH, whose prefill kernel uses warpgroup MMA (wgmma); other devices for sm_<major><minor>."""
    return WGMMA_ARCH if (major, minor) == (9, 0) else f"sm_{major}{minor}"


def uses_wgmma(arch: str) -> bool:
    """Whether a build for `arch` runs the Hopper (wgmma) prefill."""
    return check_arch(arch) == WGMMA_ARCH


def arch_flags(arch: str) -> list[str]:
    """Defines a target implies (WGMMA_DEFINE for the wgmma prefill)."""
    return [WGMMA_DEFINE] if uses_wgmma(arch) else []


def config_flags(dtype: int | None = None, head_dim: int | None = None, minimal: bool = False) -> list[str]:
    """nvcc defines restricting a build to one element type code / head dim (None: all);
    `minimal`: one prefill and one decode instantiation (compile checks of many patterns)."""
    return ([] if dtype is None else [f"-DSAS_DTYPE={int(dtype)}"]) + \
        ([] if head_dim is None else [f"-DSAS_HEAD_DIM={int(head_dim)}"]) + (["-DSAS_MIN_INSTANCES"] if minimal else [])


def nvcc_command(nvcc: str, arch: str, src: str, out: str, *, shared: bool = True, dtype: int | None = None,
                 head_dim: int | None = None, minimal: bool = False) -> list[str]:
    num = check_arch(arch)[3:]
    gencode = f"-gencode=arch=compute_{num},code=sm_{num}"
    return [nvcc, *NVCC_FLAGS, *config_flags(dtype, head_dim, minimal), *arch_flags(arch), gencode,
            "--shared" if shared else "-c", src, "-o", out]


def trim_message(text: str, limit: int = MESSAGE_CHARS) -> str:
    """The compiler's message, its first error lines kept (nvcc prints the cause first)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    body = "\n".join((errors or lines)[:12])
    return body if len(body) <= limit else body[:limit] + " ..."


def _run_nvcc(cmd: list[str], what: str) -> None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except FileNotFoundError:
        raise KernelError(f"cuda backend: nvcc {cmd[0]!r} cannot be run (not found)") from None
    except subprocess.TimeoutExpired:
        raise KernelError(f"cuda backend: nvcc did not finish {what} within {BUILD_TIMEOUT_S} s") from None
    if r.returncode != 0:
        raise KernelError(f"cuda backend: nvcc failed {what} (exit {r.returncode}):\n"
                          f"{trim_message(r.stderr + r.stdout)}")


def check_compiles(source: str, arch: str = DEFAULT_ARCH, nvcc: str | None = None, *, dtype: int | None = None,
                   head_dim: int | None = None, minimal: bool = False) -> None:
    """Compile `source` to an object for `arch` in a temporary folder (nothing kept); a
    KernelError with nvcc's message when it fails. `dtype` / `head_dim` / `minimal` restrict the
    instantiations (`config_flags`)."""
    nvcc = nvcc or find_nvcc()
    with tempfile.TemporaryDirectory(prefix="sas_nvcc_") as tmp:
        src = os.path.join(tmp, "kernels.cu")
        Path(src).write_text(source)
        _run_nvcc(nvcc_command(nvcc, arch, src, os.path.join(tmp, "kernels.o"), shared=False, dtype=dtype,
                               head_dim=head_dim, minimal=minimal),
                  f"compiling the generated CUDA for {arch}")


def cuda_cache_dir() -> Path:
    env = os.environ.get("SAS_CACHE_DIR")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sas"
    return base / "cuda"


def build_library(source: str, arch: str, directory: Path | None = None, nvcc: str | None = None, *,
                  dtype: int | None = None, head_dim: int | None = None) -> Path:
    """The shared library of `source` for `arch` (for one element type code / head dim, or
    all: None), built once: cached under `directory` (default `cuda_cache_dir()`) by a hash of
    the source and the nvcc command."""
    nvcc = nvcc or find_nvcc()
    directory = Path(directory) if directory is not None else cuda_cache_dir()
    key = _digest(source, nvcc_command("nvcc", arch, "x", "y", dtype=dtype, head_dim=head_dim))[:20]
    lib = directory / f"sas_{key}.so"
    if lib.is_file():
        return lib
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise KernelError(f"cuda backend: cannot create the build cache {directory}: {e} (set SAS_CACHE_DIR)") from None
    with tempfile.TemporaryDirectory(prefix=".build_", dir=directory) as tmp:
        src = os.path.join(tmp, "kernels.cu")
        Path(src).write_text(source)
        out = os.path.join(tmp, "lib.so")
        _run_nvcc(nvcc_command(nvcc, arch, src, out, dtype=dtype, head_dim=head_dim),
                  f"building the generated CUDA for {arch}")
        os.replace(out, lib)   # atomic: a library in the cache is always whole
    return lib


__all__ = ["BLOCK_N", "CUDA_DTYPES", "CUDA_TEMPLATE_VERSION", "CudaSource", "SUPPORTED_HEAD_DIMS", "build_library",
           "check_compiles", "check_dtype", "check_head_dim", "find_nvcc", "nvcc_command", "render_cuda",
           "render_loader", "render_template", "trim_message"]
