"""The NKI API surface the generated Trainium kernels may use, written down from the public
Neuron documentation, and a static checker of generated kernel text against it.

Every entry names the documented signature and the page it was taken from. The kernels target
the `neuronxcc.nki` API (Neuron SDK 2.2x: `import neuronxcc.nki.language as nl`,
`import neuronxcc.nki.isa as nisa`), where instructions return their result tile (e.g.
`nisa.nc_matmul(stationary, moving)` returns a PSUM tile). The newer `nki` namespace of SDK
2.30+ (destination-passing `nisa.nc_matmul(dst, stationary, moving)`) is a different surface
and is not targeted.

`check_kernel_source(text)` parses the text (Python `ast`) and checks:

- the imports are exactly the three NKI modules (plus `numpy as np` is refused: kernels are
  pure NKI);
- every `nki.*`, `nl.*`, `nisa.*` attribute is in the table below; every call passes at most
  the documented positional parameters and only documented keywords, and all required ones;
- inside `nl.affine_range` / `nl.sequential_range` loops (traced once, with a symbolic index on
  the device), no plain Python variable is carried from one iteration to the next (a name read
  in the body before the body assigns it and bound outside the loop): loop-carried state must
  live in a tile updated in place (`buf[...] = ...`); and no `if` tests the loop index.

It raises `sas.errors.KernelError` naming the line and what is allowed. What it does not check
(types, shapes, buffers) the emulator (`sas.codegen.nki_emulator`) checks at run time.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from sas.errors import KernelError

_BASE = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/generated/"
_V2261 = "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.26.1/nki/api/generated/"
_GENERAL = "https://awsdocs-neuron.readthedocs-hosted.com/general/nki/api/generated/"


@dataclass(frozen=True)
class ApiFunction:
    """One documented function: `params` positional-or-keyword (those before `required` are
    required), `kwonly` keyword-only, `varargs` takes *args; `url` the page it came from."""

    qualname: str
    params: tuple[str, ...]
    required: int
    kwonly: tuple[str, ...] = ()
    varargs: bool = False
    url: str = ""
    #: "" when the signature was read on `url` itself; else the function whose page documents
    #: the same form (e.g. the comparison family's keyword-only dtype / mask, from nl.less_equal)
    form_of: str = ""

    @property
    def signature(self) -> str:
        ps = [p if k < self.required else f"{p}=..." for k, p in enumerate(self.params)]
        if self.varargs:
            ps.append("*args")
        elif self.kwonly:
            ps.append("*")
        ps += [f"{k}=..." for k in self.kwonly]
        return f"{self.qualname}({', '.join(ps)})"


def _f(qualname: str, params: str, required: int, kwonly: str = "", *, varargs: bool = False,
       url: str | None = None, form_of: str = "") -> ApiFunction:
    page = url if url is not None else _BASE + qualname + ".html"
    return ApiFunction(qualname, tuple(p for p in params.split() if p), required,
                       tuple(k for k in kwonly.split() if k), varargs, page, form_of)


_EW2 = "dtype mask"          # keyword-only parameters of the element-wise nl functions

#: The functions generated kernels may call (`nki.language.*` as `nl.*`, `nki.isa.*` as `nisa.*`).
FUNCTIONS: dict[str, ApiFunction] = {f.qualname: f for f in [
    _f("nki.jit", "func mode", 0, url="https://awsdocs-neuron.readthedocs-hosted.com/en/v2.29.1/_modules/nki.html"),
    # memory and creation
    _f("nki.language.load", "src", 1, "mask dtype", url=_GENERAL + "nki.language.load.html"),
    _f("nki.language.store", "dst value", 2, "mask"),
    _f("nki.language.ndarray", "shape dtype buffer name", 2),
    _f("nki.language.zeros", "shape dtype buffer name", 2),
    _f("nki.language.full", "shape fill_value dtype", 3, "buffer name"),
    _f("nki.language.copy", "src", 1, "mask dtype"),
    _f("nki.language.transpose", "x", 1, "dtype mask"),
    # indexing and iteration
    _f("nki.language.arange", "", 0, varargs=True),
    _f("nki.language.ds", "start size", 2),
    _f("nki.language.static_range", "start stop step", 1),
    _f("nki.language.affine_range", "start stop step", 1),
    _f("nki.language.sequential_range", "start stop step", 1),
    _f("nki.language.program_id", "axis", 1, url=_V2261.replace("en/v2.26.1/nki", "en/v2.26.0/general/nki")
       + "nki.language.program_id.html"),
    # math
    _f("nki.language.exp", "x", 1, _EW2),
    _f("nki.language.add", "x y", 2, _EW2),
    _f("nki.language.subtract", "x y", 2, _EW2, form_of="nki.language.add"),
    _f("nki.language.multiply", "x y", 2, _EW2, form_of="nki.language.add"),
    _f("nki.language.divide", "x y", 2, _EW2, form_of="nki.language.add"),
    _f("nki.language.maximum", "x y", 2, _EW2, form_of="nki.language.add"),
    _f("nki.language.mod", "x y dtype mask", 2),
    _f("nki.language.where", "condition x y", 3, _EW2),
    _f("nki.language.max", "x axis", 2, "dtype mask keepdims", form_of="nki.language.sum"),
    _f("nki.language.sum", "x axis", 2, "dtype mask keepdims"),
    # comparisons and logic (result dtype bool unless dtype= says otherwise)
    _f("nki.language.equal", "x y", 2, _EW2, form_of="nki.language.less_equal"),
    _f("nki.language.not_equal", "x y", 2, _EW2, form_of="nki.language.less_equal"),
    _f("nki.language.less", "x y", 2, _EW2, form_of="nki.language.less_equal"),
    _f("nki.language.less_equal", "x y", 2, _EW2),
    _f("nki.language.greater", "x y", 2, _EW2, form_of="nki.language.less_equal"),
    _f("nki.language.greater_equal", "x y", 2, _EW2, form_of="nki.language.less_equal"),
    _f("nki.language.logical_and", "x y", 2, _EW2, form_of="nki.language.less_equal"),
    _f("nki.language.logical_or", "x y", 2, _EW2, form_of="nki.language.less_equal"),
    _f("nki.language.logical_not", "x", 1, _EW2),
    # ISA
    _f("nki.isa.nc_matmul", "stationary moving", 2,
       "is_stationary_onezero is_moving_onezero is_transpose tile_position tile_size mask",
       url=_V2261 + "nki.isa.nc_matmul.html"),
    _f("nki.isa.nc_transpose", "data", 1, "mask dtype engine", url=_V2261 + "nki.isa.nc_transpose.html"),
    _f("nki.isa.iota", "expr dtype", 2, "mask", url=_V2261 + "nki.isa.iota.html"),
    _f("nki.isa.affine_select", "pred on_true_tile on_false_value", 3, "mask dtype",
       url=_V2261 + "nki.isa.affine_select.html"),
]}

#: Non-callable attributes (data types, buffers), with the page listing them.
CONSTANTS: dict[str, str] = {
    **{f"nki.language.{t}": _BASE.replace("generated/", "nki.language.html")
       for t in ("float32", "bfloat16", "float16", "int32", "bool_")},
    **{f"nki.language.{b}": _BASE + f"nki.language.{b}.html" for b in ("sbuf", "psum", "shared_hbm")},
}

#: The module aliases generated kernels import, and the module each stands for.
ALIASES = {"nki": "nki", "nl": "nki.language", "nisa": "nki.isa"}
IMPORTS = {"neuronxcc.nki": "nki", "neuronxcc.nki.language": "nl", "neuronxcc.nki.isa": "nisa"}
#: Standard-library modules the plain-Python host functions beside the kernels may import
#: (the synthesized cache functions' table search); never usable inside a kernel.
HOST_IMPORTS = frozenset({"bisect"})
#: Python builtins a kernel may call at trace time (on Python ints: shapes, schedule constants).
KERNEL_BUILTINS = frozenset({"len", "min", "max", "int"})

#: Hardware limits the kernels and the emulator use (nki.language.tile_size, Trn1/Trn2).
PMAX = 128                 # tile_size.pmax: partitions of an SBUF / PSUM tile
PSUM_FMAX = 512            # tile_size.psum_fmax: fp32 elements per partition of a PSUM tile (2 KiB)
GEMM_STATIONARY_FMAX = 128  # tile_size.gemm_stationary_fmax
GEMM_MOVING_FMAX = 512      # tile_size.gemm_moving_fmax
SBUF_PARTITION_BYTES = 192 * 1024   # Trn2 SBUF: 24 MiB over 128 partitions


def _qualname(node: ast.expr) -> str | None:
    """`nl.exp` -> 'nki.language.exp' (None for anything not rooted at an NKI alias)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in ALIASES or not parts:
        return None
    return ".".join([ALIASES[node.id], *reversed(parts)])


def _fail(node: ast.AST, msg: str) -> KernelError:
    return KernelError(f"NKI kernel check, line {getattr(node, 'lineno', '?')}: {msg}")


def _check_imports(tree: ast.Module) -> None:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            raise _fail(node, f"'from {node.module} import ...' is not allowed; kernels import only "
                              f"{', '.join(f'{m} as {a}' for m, a in IMPORTS.items())}")
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in HOST_IMPORTS and alias.asname is None:
                    continue
                if IMPORTS.get(alias.name) != alias.asname:
                    raise _fail(node, f"import {alias.name!r} (as {alias.asname!r}) is not allowed; kernels "
                                      f"import only {', '.join(f'{m} as {a}' for m, a in IMPORTS.items())}")


def _check_call(node: ast.Call, fn: ApiFunction) -> None:
    if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
        raise _fail(node, f"{fn.qualname}: *args / **kwargs are not checked and not allowed")
    npos = len(node.args)
    if npos > len(fn.params) and not fn.varargs:
        raise _fail(node, f"{fn.qualname} takes at most {len(fn.params)} positional arguments, {npos} given; "
                          f"documented: {fn.signature} ({fn.url})")
    names = [k.arg for k in node.keywords]
    allowed = set(fn.params[npos:]) | set(fn.kwonly)
    for k in names:
        if k not in allowed:
            raise _fail(node, f"{fn.qualname}: keyword {k!r} is not documented (or repeats a positional "
                              f"argument); documented: {fn.signature} ({fn.url})")
    missing = [p for p in fn.params[npos:fn.required] if p not in names]
    if missing:
        raise _fail(node, f"{fn.qualname}: missing required argument(s) {', '.join(missing)}; "
                          f"documented: {fn.signature} ({fn.url})")


def _loop_kind(node: ast.For) -> str | None:
    it = node.iter
    if isinstance(it, ast.Call):
        q = _qualname(it.func)
        if q in ("nki.language.affine_range", "nki.language.sequential_range"):
            return q.rsplit(".", 1)[1]
    return None


def _names_read(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _assigned_names(stmt: ast.stmt) -> set[str]:
    out: set[str] = set()
    targets: list[ast.expr] = []
    if isinstance(stmt, ast.Assign):
        targets = list(stmt.targets)
    elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)):
        targets = [stmt.target]
    elif isinstance(stmt, ast.For):
        targets = [stmt.target]
    for t in targets:
        for n in ast.walk(t):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                out.add(n.id)
    return out


def _check_symbolic_loop(loop: ast.For, kind: str, bound_before: set[str]) -> None:
    """A loop traced once with a symbolic index: no Python value may flow between iterations."""
    index = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    assigned: set[str] = set()
    for stmt in ast.walk(loop):
        if isinstance(stmt, ast.If) and _names_read(stmt.test) & index:
            raise _fail(stmt, f"'if' on the index of an nl.{kind} loop: the index is symbolic on the device; "
                              f"use a mask (nl.where / affine_select) instead")
        if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
            raise _fail(stmt, f"'{stmt.target.id} {type(stmt.op).__name__}=' rebinds a Python name inside an "
                              f"nl.{kind} loop; accumulate into a tile with '{stmt.target.id}[...] += ...'")

    def visit(stmts: list[ast.stmt]) -> None:
        for stmt in stmts:
            if isinstance(stmt, (ast.For, ast.While)) and stmt is not loop:
                visit(stmt.body)
                assigned.update(_assigned_names(stmt))
                continue
            reads = _names_read(stmt)
            if isinstance(stmt, ast.Assign):
                reads = _names_read(stmt.value) | set().union(*(_names_read(t) for t in stmt.targets))
            carried = (reads - assigned) & (_all_assigned & bound_before)
            if carried:
                name = sorted(carried)[0]
                raise _fail(stmt, f"Python variable {name!r} is assigned in the body of an nl.{kind} loop and "
                                  f"read before that assignment: its value would be carried between "
                                  f"iterations, which a loop traced once cannot do; keep loop-carried state "
                                  f"in a tile updated in place ({name}[...] = ...)")
            assigned.update(_assigned_names(stmt))

    _all_assigned: set[str] = set()
    for stmt in ast.walk(loop):
        if isinstance(stmt, ast.stmt) and stmt is not loop:
            _all_assigned.update(_assigned_names(stmt))
    visit(loop.body)


def _check_function(fdef: ast.FunctionDef) -> None:
    bound: set[str] = {a.arg for a in fdef.args.args}
    for node in ast.walk(fdef):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id not in KERNEL_BUILTINS:
            raise _fail(node, f"kernel {fdef.name!r} calls {node.func.id!r}: inside a kernel only nki functions and "
                              f"the builtins {', '.join(sorted(KERNEL_BUILTINS))} may be called")
        if isinstance(node, ast.Name) and node.id in HOST_IMPORTS:
            raise _fail(node, f"kernel {fdef.name!r} uses the host module {node.id!r}")

    def walk(stmts: list[ast.stmt], bound: set[str]) -> None:
        for stmt in stmts:
            if isinstance(stmt, ast.While):
                raise _fail(stmt, "'while' loops are not allowed in NKI kernels; use nl.*_range loops")
            if isinstance(stmt, ast.For):
                kind = _loop_kind(stmt)
                if kind is not None:
                    _check_symbolic_loop(stmt, kind, set(bound))
                elif not (isinstance(stmt.iter, ast.Call)
                          and _qualname(stmt.iter.func) == "nki.language.static_range"):
                    raise _fail(stmt, "loops must iterate nl.static_range, nl.affine_range or "
                                      "nl.sequential_range")
                walk(stmt.body, bound | _assigned_names(stmt))
            elif isinstance(stmt, ast.If):
                walk(stmt.body, set(bound))
                walk(stmt.orelse, set(bound))
            elif isinstance(stmt, (ast.FunctionDef, ast.ClassDef, ast.Lambda, ast.Try, ast.With)):
                raise _fail(stmt, f"{type(stmt).__name__} statements are not allowed inside an NKI kernel")
            bound |= _assigned_names(stmt)

    walk(fdef.body, bound)


def check_kernel_source(source: str, filename: str = "<nki kernel>") -> ast.Module:
    """Parse generated NKI kernel text and check it against the documented API surface (see the
    module docstring). Returns the parsed module; raises KernelError."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as e:
        raise KernelError(f"NKI kernel check: {filename} is not valid Python (line {e.lineno}): {e.msg}") from None
    _check_imports(tree)
    kernels = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            q = _qualname(node)
            if q is None:
                continue
            if q not in FUNCTIONS and q not in CONSTANTS:
                raise _fail(node, f"{q} is not in the documented API surface sas.codegen.nki_api allows "
                                  f"(see FUNCTIONS / CONSTANTS there)")
        if isinstance(node, ast.Call):
            q = _qualname(node.func)
            if q is not None:
                if q not in FUNCTIONS:
                    raise _fail(node, f"{q} is not a documented function (allowed: nki_api.FUNCTIONS)")
                _check_call(node, FUNCTIONS[q])
        if isinstance(node, ast.FunctionDef):
            decorated = [d for d in node.decorator_list
                         if _qualname(d.func if isinstance(d, ast.Call) else d) == "nki.jit"]
            if decorated:
                kernels += 1
                _check_function(node)
            elif node.decorator_list:
                raise _fail(node, f"function {node.name!r}: only @nki.jit is allowed as a decorator")
    if kernels == 0:
        raise KernelError(f"NKI kernel check: {filename} defines no @nki.jit kernel")
    return tree


__all__ = ["ApiFunction", "FUNCTIONS", "CONSTANTS", "IMPORTS", "PMAX", "PSUM_FMAX", "GEMM_STATIONARY_FMAX",
           "GEMM_MOVING_FMAX", "SBUF_PARTITION_BYTES", "check_kernel_source"]
