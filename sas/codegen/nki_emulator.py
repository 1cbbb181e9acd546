"""A numpy emulator of the NKI subset sas's Trainium kernels use (sas.codegen.nki_api), to run
generated kernels on small inputs without a Neuron device or compiler.

It executes the kernel as Python with `nki`, `nl` and `nisa` bound to this module's stand-ins,
and refuses what NKI documents as invalid, with `NkiEmulationError` (a KernelError):

- tiles: SBUF / PSUM tiles have at least 2 dimensions, the first (partition) at most 128; a PSUM
  tile holds at most 2 KiB per partition (512 float32), an SBUF tile at most 192 KiB;
- `nl.load` reads HBM into SBUF, `nl.store` writes an SBUF (or PSUM) tile of the same shape to
  HBM; indexing HBM with a loop index works, indexing a Python sequence with one does not;
- `nisa.nc_matmul(stationary, moving)`: both SBUF, float types, same partition size <= 128
  (the contraction), stationary free size <= 128, moving free size <= 512; the result is a new
  float32 PSUM tile `stationary.T @ moving`; `psum_tile[...] += nc_matmul(...)` accumulates;
- `nisa.nc_transpose`: SBUF input of at most 128 x 128 (Tensor Engine), PSUM result;
- `nisa.iota`: a 2-D affine expression of `nl.arange` indices (a product of two index
  expressions is not affine and refused); `nisa.affine_select`: one affine comparison;
- element-wise `nl.*`: at least one tile operand, numpy broadcasting, float32 arithmetic (as
  the Vector / Scalar / GpSimd engines compute) cast to the result dtype; reductions `nl.max` /
  `nl.sum` only over free axes;
- loops: `nl.static_range` yields Python ints; `nl.affine_range` / `nl.sequential_range` yield
  symbolic indices (arithmetic and slicing work; `if`, comparisons and Python indexing refuse).
  Inside an `nl.affine_range` loop, reading a tile that an earlier iteration of that loop wrote is
  a loop-carried dependency and refused (PSUM accumulation with `+=` is the documented
  exception);
- the SPMD grid: `kernel[g0, g1](...)` runs every program; `nl.program_id(axis)` is its index;
  `nl.shared_hbm` tensors allocated by the programs in the same order are one tensor.

`nl.ndarray` fills new SBUF / PSUM tiles with NaN so that reading memory never written shows.
bfloat16 is stored as float32 rounded to bfloat16 (round to nearest even).
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import numpy as np

from sas.codegen.nki_api import (
    GEMM_MOVING_FMAX,
    GEMM_STATIONARY_FMAX,
    IMPORTS,
    PMAX,
    PSUM_FMAX,
    SBUF_PARTITION_BYTES,
    check_kernel_source,
)
from sas.errors import KernelError


class NkiEmulationError(KernelError):
    """The kernel does something NKI refuses (or the emulator does not model)."""


# --- data types ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DType:
    name: str
    storage: Any
    itemsize: int
    is_float: bool

    def __repr__(self) -> str:
        return f"nl.{self.name}"


float32 = DType("float32", np.float32, 4, True)
bfloat16 = DType("bfloat16", np.float32, 2, True)
float16 = DType("float16", np.float16, 2, True)
int32 = DType("int32", np.int32, 4, False)
bool_ = DType("bool_", np.bool_, 1, False)
_BY_NUMPY = {np.dtype(np.float32): float32, np.dtype(np.float16): float16, np.dtype(np.int32): int32,
             np.dtype(np.bool_): bool_}


def _round_bf16(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return u.view(np.float32)


def _cast(a: Any, dtype: DType) -> np.ndarray:
    a = np.asarray(a)
    if dtype is bfloat16:
        return _round_bf16(a.astype(np.float32))
    if dtype is bool_:
        return a.astype(bool)
    if dtype is int32 and a.dtype.kind == "f":
        return np.trunc(a).astype(np.int32)
    return a.astype(dtype.storage)


def _promote(*dts: DType) -> DType:
    floats = [d for d in dts if d.is_float]
    if floats:
        return max(floats, key=lambda d: (d.itemsize, d is float32))
    return int32 if any(d is int32 for d in dts) else bool_


# --- buffers -----------------------------------------------------------------------------------------


class _Buffer:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"nl.{self.name}"


sbuf, psum, shared_hbm = _Buffer("sbuf"), _Buffer("psum"), _Buffer("shared_hbm")


# --- emulation state ------------------------------------------------------------------------------


@dataclass(eq=False)
class _Loop:
    kind: str
    iteration: int = 0


@dataclass
class _State:
    loops: list[_Loop] = field(default_factory=list)
    grid: tuple[int, ...] = ()
    index: tuple[int, ...] = ()
    hbm: list["HbmTensor"] | None = None
    hbm_next: int = 0


_state = _State()


def _stamp() -> tuple[tuple[int, int], ...]:
    return tuple((id(f), f.iteration) for f in _state.loops)


# --- symbolic loop indices and index expressions --------------------------------------------------


class LoopIndex:
    """The index of an affine / sequential loop: symbolic on the device (affine arithmetic only)."""

    __slots__ = ("value",)

    def __init__(self, value: int):
        self.value = value

    def _lin(self, other: Any, fn: Callable[[int, int], int], what: str) -> "LoopIndex":
        if isinstance(other, LoopIndex):
            if what in ("*", "//", "%"):
                raise NkiEmulationError(f"'{what}' of two loop indices is not an affine expression")
            return LoopIndex(fn(self.value, other.value))
        if isinstance(other, (int, np.integer)) and not isinstance(other, bool):
            return LoopIndex(fn(self.value, int(other)))
        return NotImplemented

    def __add__(self, o): return self._lin(o, lambda a, b: a + b, "+")
    def __radd__(self, o): return self._lin(o, lambda a, b: b + a, "+")
    def __sub__(self, o): return self._lin(o, lambda a, b: a - b, "-")
    def __rsub__(self, o): return self._lin(o, lambda a, b: b - a, "-")
    def __mul__(self, o): return self._lin(o, lambda a, b: a * b, "*")
    def __rmul__(self, o): return self._lin(o, lambda a, b: b * a, "*")
    def __floordiv__(self, o): return self._lin(o, lambda a, b: a // b, "//")
    def __mod__(self, o): return self._lin(o, lambda a, b: a % b, "%")
    def __neg__(self): return LoopIndex(-self.value)

    def _refuse(self, *_: Any) -> Any:
        raise NkiEmulationError("the index of an nl.affine_range / nl.sequential_range loop is symbolic on the "
                                "device: it cannot be compared, tested or used to index a Python sequence "
                                "(use nl.static_range for trace-time values)")

    __index__ = __bool__ = __lt__ = __le__ = __gt__ = __ge__ = __int__ = __hash__ = _refuse

    def __eq__(self, o):  # noqa: D105
        return self._refuse()

    def __repr__(self) -> str:
        return f"LoopIndex({self.value})"


def _scalar(x: Any) -> Any:
    if isinstance(x, LoopIndex):
        return x.value
    if isinstance(x, (bool, int, float, np.integer, np.floating)):
        return x
    raise NkiEmulationError(f"expected a scalar or loop index, got {type(x).__name__}")


class IndexExpr:
    """An affine expression of `nl.arange` indices (values on a grid); `is_pred` for comparisons."""

    def __init__(self, values: np.ndarray, degree: int = 1, is_pred: bool = False):
        self.values = values
        self.degree = degree
        self.is_pred = is_pred

    def __getitem__(self, idx: Any) -> "IndexExpr":
        return IndexExpr(self.values[idx], self.degree, self.is_pred)

    def _op(self, o: Any, fn: Callable[[Any, Any], Any], what: str, reverse: bool = False) -> "IndexExpr":
        if self.is_pred or (isinstance(o, IndexExpr) and o.is_pred):
            raise NkiEmulationError(f"'{what}' on an index predicate: combine masks is not supported "
                                    f"(affine_select takes one affine comparison)")
        if isinstance(o, IndexExpr):
            if what == "*" and self.degree and o.degree:
                raise NkiEmulationError("a product of two nl.arange index expressions is not affine")
            a, b, deg = self.values, o.values, max(self.degree, o.degree)
        else:
            o = _scalar(o)
            a, b, deg = self.values, o, (0 if what == "*" and o == 0 else self.degree)
        if reverse:
            a, b = b, a
        return IndexExpr(fn(a, b), deg)

    def __add__(self, o): return self._op(o, np.add, "+")
    def __radd__(self, o): return self._op(o, np.add, "+", True)
    def __sub__(self, o): return self._op(o, np.subtract, "-")
    def __rsub__(self, o): return self._op(o, np.subtract, "-", True)
    def __mul__(self, o): return self._op(o, np.multiply, "*")
    def __rmul__(self, o): return self._op(o, np.multiply, "*", True)

    def _cmp(self, o: Any, fn: Callable[[Any, Any], Any]) -> "IndexExpr":
        r = self._op(o, fn, "comparison")
        return IndexExpr(r.values, r.degree, True)

    def __lt__(self, o): return self._cmp(o, np.less)
    def __le__(self, o): return self._cmp(o, np.less_equal)
    def __gt__(self, o): return self._cmp(o, np.greater)
    def __ge__(self, o): return self._cmp(o, np.greater_equal)

    def __bool__(self):
        raise NkiEmulationError("an index expression has no truth value at trace time")


# --- HBM tensors and on-chip tiles ---------------------------------------------------------------


def _index(idx: Any) -> Any:
    """HBM / tile index: slices, ints, loop indices (as their value), Ellipsis, nl.ds slices."""
    items = idx if isinstance(idx, tuple) else (idx,)
    out = []
    for it in items:
        if isinstance(it, IndexExpr):
            raise NkiEmulationError("indexing with nl.arange expressions is not modelled by the emulator; "
                                    "use slices or nl.ds")
        if isinstance(it, slice):
            out.append(slice(*(None if x is None else _scalar(x) for x in (it.start, it.stop, it.step))))
        elif it is Ellipsis:
            out.append(it)
        else:
            out.append(_scalar(it))
    return tuple(out)


class HbmTensor:
    """A tensor in device memory (kernel inputs, nl.shared_hbm outputs)."""

    def __init__(self, data: np.ndarray, dtype: DType):
        self.data = data
        self.dtype = dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    def __getitem__(self, idx: Any) -> "HbmTensor":
        view = self.data[_index(idx)]
        if not isinstance(view, np.ndarray) or view.ndim == 0:
            raise NkiEmulationError("indexing an HBM tensor down to one element is not modelled; keep a "
                                    "[partition, free] region")
        return HbmTensor(view, self.dtype)

    def __setitem__(self, idx: Any, value: Any) -> None:
        raise NkiEmulationError("HBM tensors are written with nl.store, not by assignment")


class Tile:
    """An SBUF or PSUM tile (partition dimension first)."""

    def __init__(self, data: np.ndarray, dtype: DType, buffer: _Buffer, base: "Tile | None" = None):
        self.data = data
        self.dtype = dtype
        self.buffer = buffer
        self.base = base if base is not None else self
        if base is None:
            _check_tile_shape(data.shape, dtype, buffer)
            self.stamp = _stamp()

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    def __getitem__(self, idx: Any) -> "Tile":
        view = self.data[_index(idx)]
        if view.ndim < 2:
            raise NkiEmulationError(f"indexing a tile of shape {self.shape} down to {view.ndim} dimension(s): tiles "
                                    f"keep a partition and a free dimension (index [N, 1] tiles with slices)")
        return Tile(view, self.dtype, self.buffer, self.base)

    def _write(self, region: np.ndarray, value: Any) -> None:
        if isinstance(value, Tile):
            _read(value)
            if np.shares_memory(region, value.data) and region.shape == value.shape:
                self.base.stamp = _stamp()
                return
            if value.shape != region.shape:
                raise NkiEmulationError(f"assigning a tile of shape {value.shape} to a region of shape "
                                        f"{region.shape}: shapes must match")
            src = value.data
        else:
            src = _scalar(value)
        region[...] = _cast(src, self.dtype) if isinstance(src, np.ndarray) else _cast(np.full(region.shape, src),
                                                                                       self.dtype)
        self.base.stamp = _stamp()

    def __setitem__(self, idx: Any, value: Any) -> None:
        self._write(self.data[_index(idx)], value)

    def __iadd__(self, value: Any) -> "Tile":
        if self.buffer is psum and isinstance(value, Tile) and getattr(value, "from_matmul", False):
            if value.shape != self.shape:
                raise NkiEmulationError(f"PSUM accumulation of a {value.shape} matmul result into {self.shape}")
            self.data[...] = (self.data.astype(np.float32) + value.data).astype(self.data.dtype)
            self.base.stamp = _stamp()
            return self
        _read(self)
        self._write(self.data, _binary(np.add, self, value, None, "add"))
        return self

    def __bool__(self):
        raise NkiEmulationError("a tile has no truth value at trace time")


def _check_tile_shape(shape: tuple[int, ...], dtype: DType, buffer: _Buffer) -> None:
    if len(shape) < 2:
        raise NkiEmulationError(f"{buffer.name} tile of shape {shape}: tiles need a partition and a free dimension "
                                f"(use (n, 1) instead of (n,))")
    if shape[0] > PMAX:
        raise NkiEmulationError(f"{buffer.name} tile of shape {shape}: the partition dimension {shape[0]} exceeds "
                                f"nl.tile_size.pmax = {PMAX}")
    per_partition = int(np.prod(shape[1:])) * dtype.itemsize
    if buffer is psum and per_partition > PSUM_FMAX * 4:
        raise NkiEmulationError(f"PSUM tile of shape {shape} ({dtype!r}): {per_partition} bytes per partition exceed "
                                f"the PSUM tile size of {PSUM_FMAX * 4} bytes (nl.tile_size.psum_fmax = {PSUM_FMAX})")
    if buffer is sbuf and per_partition > SBUF_PARTITION_BYTES:
        raise NkiEmulationError(f"SBUF tile of shape {shape}: {per_partition} bytes per partition exceed "
                                f"{SBUF_PARTITION_BYTES}")


def _read(t: Tile) -> None:
    """Refuse a loop-carried dependency through `t` in an enclosing nl.affine_range loop."""
    stamp = dict(t.base.stamp)
    for f in _state.loops:
        if f.kind == "affine_range" and id(f) in stamp and stamp[id(f)] != f.iteration:
            raise NkiEmulationError("loop-carried dependency in nl.affine_range: a tile written in iteration "
                                    f"{stamp[id(f)]} is read in iteration {f.iteration}; use nl.sequential_range "
                                    "(only PSUM accumulation with += may cross affine iterations)")


def _tile_new(data: np.ndarray, dtype: DType, buffer: _Buffer = sbuf) -> Tile:
    return Tile(_cast(data, dtype), dtype, buffer)


# --- nki.language ---------------------------------------------------------------------------------


def _dtype(dtype: Any) -> DType:
    if isinstance(dtype, DType):
        return dtype
    raise NkiEmulationError(f"unsupported dtype {dtype!r}: use nl.float32, nl.bfloat16, nl.float16, nl.int32 "
                            f"or nl.bool_")


def ndarray(shape: Any, dtype: Any, buffer: Any = None, name: str = "") -> Any:
    shape, dt = tuple(int(_scalar(s)) for s in shape), _dtype(dtype)
    buffer = sbuf if buffer is None else buffer
    if buffer is shared_hbm:
        if _state.hbm is None:
            raise NkiEmulationError("nl.shared_hbm tensors can only be allocated inside a kernel launch")
        k = _state.hbm_next
        _state.hbm_next += 1
        if k < len(_state.hbm):
            t = _state.hbm[k]
            if t.shape != shape or t.dtype is not dt:
                raise NkiEmulationError("SPMD programs allocated different shared_hbm tensors at the same position")
            return t
        fill = np.nan if dt.is_float else 0
        t = HbmTensor(np.full(shape, fill, dtype=dt.storage), dt)
        _state.hbm.append(t)
        return t
    if buffer not in (sbuf, psum):
        raise NkiEmulationError(f"unknown buffer {buffer!r}: use nl.sbuf, nl.psum or nl.shared_hbm")
    return Tile(np.full(shape, np.nan if dt.is_float else 0, dtype=dt.storage), dt, buffer)


def zeros(shape: Any, dtype: Any, buffer: Any = None, name: str = "") -> Any:
    t = ndarray(shape, dtype, buffer, name)
    t.data[...] = 0
    return t


def full(shape: Any, fill_value: Any, dtype: Any, buffer: Any = None, name: str = "") -> Any:
    t = ndarray(shape, dtype, buffer, name)
    t.data[...] = _cast(np.full(t.data.shape, _scalar(fill_value)), t.dtype)
    return t


def load(src: Any, *, mask: Any = None, dtype: Any = None) -> Tile:
    if not isinstance(src, HbmTensor):
        raise NkiEmulationError(f"nl.load reads an HBM tensor, got {type(src).__name__} (tiles are already on chip)")
    if mask is not None:
        raise NkiEmulationError("nl.load(mask=...) is not modelled by the emulator")
    dt = src.dtype if dtype is None else _dtype(dtype)
    return _tile_new(np.array(src.data, copy=True), dt)


def store(dst: Any, value: Any, *, mask: Any = None) -> None:
    if not isinstance(dst, HbmTensor):
        raise NkiEmulationError(f"nl.store writes an HBM tensor, got {type(dst).__name__}")
    if not isinstance(value, Tile):
        raise NkiEmulationError("nl.store stores an SBUF (or PSUM) tile")
    if mask is not None:
        raise NkiEmulationError("nl.store(mask=...) is not modelled by the emulator")
    _read(value)
    if dst.shape != value.shape:
        raise NkiEmulationError(f"nl.store of a tile of shape {value.shape} into HBM region of shape {dst.shape}")
    dst.data[...] = _cast(value.data, dst.dtype)


def copy(src: Any, *, mask: Any = None, dtype: Any = None) -> Tile:
    if not isinstance(src, Tile):
        raise NkiEmulationError("nl.copy copies a tile")
    _read(src)
    return _tile_new(src.data, src.dtype if dtype is None else _dtype(dtype))


def arange(*args: Any) -> IndexExpr:
    return IndexExpr(np.arange(*(int(_scalar(a)) for a in args)))


def ds(start: Any, size: Any) -> slice:
    s, n = _scalar(start), int(_scalar(size))
    return slice(s, s + n)


def static_range(start: Any, stop: Any = None, step: Any = 1) -> range:
    for x in (start, stop, step):
        if isinstance(x, LoopIndex):
            raise NkiEmulationError("nl.static_range bounds must be trace-time integers, not loop indices")
    return range(start, stop, step) if stop is not None else range(0, start, step)


def _symbolic_range(kind: str, start: Any, stop: Any, step: Any) -> Iterator[LoopIndex]:
    bounds = [0, start, step] if stop is None else [start, stop, step]
    if any(isinstance(x, LoopIndex) for x in bounds):
        raise NkiEmulationError(f"nl.{kind} bounds must be trace-time integers")
    frame = _Loop(kind)
    _state.loops.append(frame)
    try:
        for k, v in enumerate(range(*bounds)):
            frame.iteration = k
            yield LoopIndex(v)
    finally:
        _state.loops.remove(frame)


def affine_range(start: Any, stop: Any = None, step: Any = 1) -> Iterator[LoopIndex]:
    return _symbolic_range("affine_range", start, stop, step)


def sequential_range(start: Any, stop: Any = None, step: Any = 1) -> Iterator[LoopIndex]:
    return _symbolic_range("sequential_range", start, stop, step)


def program_id(axis: Any) -> int:
    if not isinstance(axis, int) or not 0 <= axis < len(_state.index):
        raise NkiEmulationError(f"nl.program_id({axis!r}): the launch grid has {len(_state.index)} axes")
    return _state.index[axis]


def _operand(x: Any) -> tuple[Any, DType | None]:
    if isinstance(x, Tile):
        _read(x)
        return x.data.astype(np.float32) if x.dtype.is_float or x.dtype is int32 else x.data, x.dtype
    if isinstance(x, (HbmTensor, IndexExpr)):
        raise NkiEmulationError(f"element-wise operand must be a tile or a scalar, got {type(x).__name__}")
    v = _scalar(x)
    return v, None


def _binary(fn: Callable[[Any, Any], Any], x: Any, y: Any, dtype: Any, name: str, boolean: bool = False) -> Tile:
    if not isinstance(x, Tile) and not isinstance(y, Tile):
        raise NkiEmulationError(f"nl.{name}: at least one operand must be a tile")
    a, da = _operand(x)
    b, db = _operand(y)
    try:
        shape = np.broadcast_shapes(np.shape(a), np.shape(b))
    except ValueError:
        raise NkiEmulationError(f"nl.{name}: operand shapes {np.shape(a)} and {np.shape(b)} do not broadcast") from None
    if len(shape) < 2:
        raise NkiEmulationError(f"nl.{name}: result of shape {shape} is not a tile")
    if boolean:
        out_dt = bool_
    else:
        dts = [d for d in (da, db) if d is not None]
        if any(isinstance(v, float) for v in (a, b) if not isinstance(v, np.ndarray)):
            dts.append(float32)
        out_dt = _promote(*dts)
    if dtype is not None:
        out_dt = _dtype(dtype)
    kind = bool if name.startswith("logical") else np.float32   # the engines compute in float32
    with np.errstate(all="ignore"):
        r = fn(np.asarray(a, dtype=kind), np.asarray(b, dtype=kind))
    return _tile_new(np.broadcast_to(r, shape), out_dt)


def _ew(name: str, fn: Callable[[Any, Any], Any], boolean: bool = False):
    def op(x: Any, y: Any, *, dtype: Any = None, mask: Any = None) -> Tile:
        if mask is not None:
            raise NkiEmulationError(f"nl.{name}(mask=...) is not modelled by the emulator")
        return _binary(fn, x, y, dtype, name, boolean)
    op.__name__ = name
    return op


add = _ew("add", np.add)
subtract = _ew("subtract", np.subtract)
multiply = _ew("multiply", np.multiply)
divide = _ew("divide", np.divide)
maximum = _ew("maximum", np.maximum)
equal = _ew("equal", np.equal, True)
not_equal = _ew("not_equal", np.not_equal, True)
less = _ew("less", np.less, True)
less_equal = _ew("less_equal", np.less_equal, True)
greater = _ew("greater", np.greater, True)
greater_equal = _ew("greater_equal", np.greater_equal, True)
logical_and = _ew("logical_and", np.logical_and, True)
logical_or = _ew("logical_or", np.logical_or, True)


def mod(x: Any, y: Any, dtype: Any = None, mask: Any = None) -> Tile:
    if mask is not None:
        raise NkiEmulationError("nl.mod(mask=...) is not modelled by the emulator")
    return _binary(np.mod, x, y, dtype, "mod")


def logical_not(x: Any, *, dtype: Any = None, mask: Any = None) -> Tile:
    if not isinstance(x, Tile):
        raise NkiEmulationError("nl.logical_not takes a tile")
    _read(x)
    return _tile_new(np.logical_not(x.data.astype(bool)), bool_ if dtype is None else _dtype(dtype))


def exp(x: Any, *, dtype: Any = None, mask: Any = None) -> Tile:
    if not isinstance(x, Tile):
        raise NkiEmulationError("nl.exp takes a tile")
    _read(x)
    with np.errstate(all="ignore"):
        r = np.exp(x.data.astype(np.float32))
    return _tile_new(r, (x.dtype if x.dtype.is_float else float32) if dtype is None else _dtype(dtype))


def where(condition: Any, x: Any, y: Any, *, dtype: Any = None, mask: Any = None) -> Tile:
    if not isinstance(condition, Tile) or not isinstance(x, Tile):
        raise NkiEmulationError("nl.where: condition and x must be tiles (y may be a scalar)")
    _read(condition)
    _read(x)
    yv, dy = _operand(y)
    shape = np.broadcast_shapes(condition.shape, x.shape, np.shape(yv))
    out_dt = _promote(x.dtype, *([dy] if dy else [])) if dtype is None else _dtype(dtype)
    r = np.where(condition.data.astype(bool), x.data.astype(np.float32), np.asarray(yv, dtype=np.float32))
    return _tile_new(np.broadcast_to(r, shape), out_dt)


def _reduce(name: str, fn: Callable[..., Any], x: Any, axis: Any, dtype: Any, keepdims: bool) -> Tile:
    if not isinstance(x, Tile):
        raise NkiEmulationError(f"nl.{name} takes a tile")
    _read(x)
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    nd = len(x.shape)
    if 0 in axes or sorted(axes) != list(range(nd - len(axes), nd)):
        raise NkiEmulationError(f"nl.{name}(axis={axis!r}) on a {nd}-D tile: only the last free axes can be reduced "
                                f"(never the partition axis 0)")
    r = fn(x.data.astype(np.float32), axis=axes, keepdims=keepdims)
    if r.ndim < 2:
        raise NkiEmulationError(f"nl.{name} without keepdims=True leaves a 1-D result, which is not a tile")
    return _tile_new(r, x.dtype if dtype is None else _dtype(dtype))


def nl_max(x: Any, axis: Any, *, dtype: Any = None, mask: Any = None, keepdims: bool = False) -> Tile:
    return _reduce("max", np.max, x, axis, dtype, keepdims)


def nl_sum(x: Any, axis: Any, *, dtype: Any = None, mask: Any = None, keepdims: bool = False) -> Tile:
    return _reduce("sum", np.sum, x, axis, dtype, keepdims)


def transpose(x: Any, *, dtype: Any = None, mask: Any = None) -> Tile:
    return nc_transpose(x, dtype=dtype)


# --- nki.isa ----------------------------------------------------------------------------------------


def nc_matmul(stationary: Any, moving: Any, *, is_stationary_onezero: bool = False,
              is_moving_onezero: bool = False, is_transpose: bool = False, tile_position: Any = (),
              tile_size: Any = (), mask: Any = None) -> Tile:
    for nm, t in (("stationary", stationary), ("moving", moving)):
        if not isinstance(t, Tile):
            raise NkiEmulationError(f"nisa.nc_matmul: {nm} must be an SBUF tile, got {type(t).__name__}")
        if t.buffer is not sbuf:
            raise NkiEmulationError(f"nisa.nc_matmul: {nm} is a {t.buffer.name} tile; the Tensor Engine reads "
                                    f"SBUF (copy PSUM results to SBUF first)")
        if len(t.shape) != 2:
            raise NkiEmulationError(f"nisa.nc_matmul: {nm} must be 2-D, got shape {t.shape}")
        if not t.dtype.is_float:
            raise NkiEmulationError(f"nisa.nc_matmul: {nm} has dtype {t.dtype!r}; supported are float types")
        _read(t)
    if is_transpose or tile_position or tile_size or mask is not None:
        raise NkiEmulationError("nisa.nc_matmul: is_transpose / tile_position / tile_size / mask are not modelled")
    (k1, m), (k2, n) = stationary.shape, moving.shape
    if k1 != k2:
        raise NkiEmulationError(f"nisa.nc_matmul: partition (contraction) sizes differ: stationary {stationary.shape}, "
                                f"moving {moving.shape}")
    if m > GEMM_STATIONARY_FMAX:
        raise NkiEmulationError(f"nisa.nc_matmul: stationary free size {m} exceeds {GEMM_STATIONARY_FMAX}")
    if n > GEMM_MOVING_FMAX:
        raise NkiEmulationError(f"nisa.nc_matmul: moving free size {n} exceeds {GEMM_MOVING_FMAX}")
    r = stationary.data.astype(np.float64).T @ moving.data.astype(np.float64)
    t = Tile(r.astype(np.float32), float32, psum)
    t.from_matmul = True
    return t


def nc_transpose(data: Any, *, mask: Any = None, dtype: Any = None, engine: Any = None) -> Tile:
    if not isinstance(data, Tile) or len(data.shape) != 2:
        raise NkiEmulationError("nisa.nc_transpose takes a 2-D tile")
    if data.buffer is not sbuf:
        raise NkiEmulationError("nisa.nc_transpose (Tensor Engine) reads an SBUF tile")
    if data.shape[0] > PMAX or data.shape[1] > PMAX:
        raise NkiEmulationError(f"nisa.nc_transpose: input {data.shape} exceeds 128 x 128")
    _read(data)
    return _tile_new(data.data.T.copy(), data.dtype if dtype is None else _dtype(dtype), psum)


def iota(expr: Any, dtype: Any, *, mask: Any = None) -> Tile:
    if not isinstance(expr, IndexExpr) or expr.is_pred:
        raise NkiEmulationError("nisa.iota takes an affine expression of nl.arange indices")
    if expr.values.ndim != 2:
        raise NkiEmulationError(f"nisa.iota: the expression has {expr.values.ndim} dimension(s); give a 2-D "
                                f"[partition, free] expression")
    return _tile_new(expr.values.astype(np.int64), _dtype(dtype))


def affine_select(pred: Any, on_true_tile: Any, on_false_value: Any, *, mask: Any = None, dtype: Any = None) -> Tile:
    if not isinstance(pred, IndexExpr) or not pred.is_pred:
        raise NkiEmulationError("nisa.affine_select: pred must be one affine comparison of nl.arange indices")
    if not isinstance(on_true_tile, Tile):
        raise NkiEmulationError("nisa.affine_select: on_true_tile must be a tile")
    _read(on_true_tile)
    if np.broadcast_shapes(pred.values.shape, on_true_tile.shape) != on_true_tile.shape:
        raise NkiEmulationError("nisa.affine_select: predicate and tile shapes differ")
    r = np.where(pred.values, on_true_tile.data.astype(np.float32), float(_scalar(on_false_value)))
    return _tile_new(r, on_true_tile.dtype if dtype is None else _dtype(dtype))


# --- nki.jit and launching ------------------------------------------------------------------------


class Kernel:
    """A traced-by-running kernel: `kernel(*args)` or `kernel[grid](*args)` with numpy inputs."""

    def __init__(self, fn: Callable[..., Any], grid: tuple[int, ...] = ()):
        self.fn = fn
        self.grid = grid
        self.__name__ = getattr(fn, "__name__", "kernel")

    def __getitem__(self, grid: Any) -> "Kernel":
        g = grid if isinstance(grid, tuple) else (grid,)
        if not all(isinstance(x, int) and x > 0 for x in g):
            raise NkiEmulationError(f"launch grid must be positive integers, got {grid!r}")
        return Kernel(self.fn, g)

    def __call__(self, *args: Any) -> Any:
        if _state.hbm is not None:
            raise NkiEmulationError("nested kernel launches are not modelled")
        wrapped = []
        for a in args:
            if isinstance(a, np.ndarray):
                dt = _BY_NUMPY.get(a.dtype)
                if dt is None:
                    raise NkiEmulationError(f"kernel input of numpy dtype {a.dtype} is not supported")
                wrapped.append(HbmTensor(np.array(a, copy=True), dt))
            elif isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], np.ndarray) and a[1] == "bfloat16":
                wrapped.append(HbmTensor(_round_bf16(a[0]), bfloat16))
            else:
                wrapped.append(a)
        _state.hbm = []
        result = None
        try:
            points = np.ndindex(*self.grid) if self.grid else [()]
            for idx in points:
                _state.index, _state.hbm_next, _state.loops = tuple(int(i) for i in idx), 0, []
                result = self.fn(*wrapped)
        finally:
            _state.hbm, _state.index, _state.loops = None, (), []

        def out(x: Any) -> Any:
            return np.array(x.data, dtype=np.float32 if x.dtype.is_float else x.data.dtype) \
                if isinstance(x, HbmTensor) else x
        return tuple(out(x) for x in result) if isinstance(result, tuple) else out(result)


def jit(func: Any = None, mode: str = "auto", **kwargs: Any) -> Any:
    if func is None:
        return lambda f: Kernel(f)
    return Kernel(func)


nki = SimpleNamespace(jit=jit)
language = SimpleNamespace(
    load=load, store=store, ndarray=ndarray, zeros=zeros, full=full, copy=copy, transpose=transpose,
    arange=arange, ds=ds, static_range=static_range, affine_range=affine_range,
    sequential_range=sequential_range, program_id=program_id, exp=exp, add=add, subtract=subtract,
    multiply=multiply, divide=divide, maximum=maximum, mod=mod, where=where, max=nl_max, sum=nl_sum, equal=equal,
    not_equal=not_equal, less=less, less_equal=less_equal, greater=greater, greater_equal=greater_equal,
    logical_and=logical_and, logical_or=logical_or, logical_not=logical_not,
    float32=float32, bfloat16=bfloat16, float16=float16, int32=int32, bool_=bool_,
    sbuf=sbuf, psum=psum, shared_hbm=shared_hbm,
)
isa = SimpleNamespace(nc_matmul=nc_matmul, nc_transpose=nc_transpose, iota=iota, affine_select=affine_select)


def load_kernel_module(source: str, filename: str = "<nki kernels>") -> dict[str, Any]:
    """Check `source` (nki_api.check_kernel_source), then execute it with the NKI imports bound to
    this emulator; returns the module namespace (kernels are `Kernel` objects)."""
    tree = check_kernel_source(source, filename)
    tree.body = [s for s in tree.body
                 if not (isinstance(s, ast.Import) and all(a.name in IMPORTS for a in s.names))]
    code = compile(tree, filename, "exec")
    modules = {"nki": nki, "nl": language, "nisa": isa}
    ns: dict[str, Any] = {"__name__": "sas_nki_emulated", **{a: modules[a] for a in IMPORTS.values()}}
    exec(code, ns)
    return ns


def reference_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Plain masked softmax attention (float64) over q [B, H, L, D], k, v [B, Hkv, L, D] and a
    boolean mask [L, L]: (out [B, H, L, D], probabilities [B, H, L, L]); rows with no key give 0."""
    B, H, L, D = q.shape
    g = H // k.shape[1]
    kk = np.repeat(k.astype(np.float64), g, axis=1)
    vv = np.repeat(v.astype(np.float64), g, axis=1)
    s = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), kk) / math.sqrt(D)
    s = np.where(mask, s, -np.inf)
    mx = s.max(axis=-1, keepdims=True)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    e = np.where(mask, np.exp(s - mx), 0.0)
    den = e.sum(axis=-1, keepdims=True)
    p = e / np.where(den == 0, 1.0, den)
    return np.einsum("bhij,bhjd->bhid", p, vv), p


__all__ = ["HbmTensor", "Kernel", "LoopIndex", "NkiEmulationError", "Tile", "isa", "language", "load_kernel_module",
           "nki", "reference_attention"]
