"""Pointer arguments of a captured CUDA graph's kernels, rebound before each replay.

A decode step captured as a CUDA graph reads its inputs from, and writes its output to, the
buffers it was captured with. Copying the caller's q, k, v into them and the output out of
them costs three launches a step (9-14 us of host time each on the H100 machine's host, more
than the step's kernels take for small caches). `PointerSlots` finds, through the CUDA driver
API, every kernel argument of the instantiated graph that holds one of those buffers' addresses
and rewrites it for the next replay (`cuGraphExecKernelNodeSetParams`: launches already
enqueued keep their arguments). It refuses (returns None from `find`) unless every reference to
the buffers is such an exact 8-byte pointer argument of a kernel node: a pointer into the middle
of a buffer, inside a larger argument (a struct), or a copy / memset node would keep reading the
old buffer, so then the caller copies as before.

The caller must only rebind tensors with the captured buffers' strides, dtype and 16-byte
alignment (the compiled kernels are specialized on them).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Mapping

import torch

_CU_GRAPH_NODE_TYPE_KERNEL = 0
_MAX_PARAMS = 4096


class _KernelParams(ctypes.Structure):
    """CUDA_KERNEL_NODE_PARAMS_v2 of the driver API."""

    _fields_ = [("func", ctypes.c_void_p), ("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint),
                ("grid_z", ctypes.c_uint), ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint),
                ("block_z", ctypes.c_uint), ("shared_bytes", ctypes.c_uint),
                ("kernel_params", ctypes.POINTER(ctypes.c_void_p)), ("extra", ctypes.POINTER(ctypes.c_void_p)),
                ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


_driver: ctypes.CDLL | None | bool = False     # False: not looked up yet


def _cuda() -> ctypes.CDLL | None:
    """The driver library with the entry points this module calls, or None."""
    global _driver
    if _driver is False:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            for name in ("cuGraphGetNodes", "cuGraphNodeGetType", "cuGraphKernelNodeGetParams_v2",
                         "cuGraphExecKernelNodeSetParams_v2", "cuFuncGetParamInfo"):
                getattr(lib, name)
            _driver = lib
        except (OSError, AttributeError):
            _driver = None
    return _driver or None


@dataclass
class _Node:
    handle: ctypes.c_void_p
    params: _KernelParams         # as read from the graph, its argument pointers replaced by `array`
    array: ctypes.Array           # the argument pointers handed to SetParams (the slots' holders)
    slots: list[tuple[str, ctypes.c_uint64]]


class PointerSlots:
    """The kernel arguments of an instantiated graph that hold the named buffers' addresses."""

    def __init__(self, exec_handle: int, nodes: list[_Node], bound: Mapping[str, int] | None = None):
        self._exec = ctypes.c_void_p(exec_handle)
        #: the addresses the graph's arguments hold now (None: unknown, after a refused update)
        self._bound = dict(bound) if bound is not None else None
        self._nodes = nodes
        self.names = sorted({name for n in nodes for name, _ in n.slots})
        # per node: its handle, a pointer to its parameters, and its (name, holder) slots
        self._calls = [(n.handle, ctypes.pointer(n.params), n.slots) for n in nodes]
        self._set = _cuda().cuGraphExecKernelNodeSetParams_v2

    @classmethod
    def find(cls, graph: torch.cuda.CUDAGraph, buffers: Mapping[str, torch.Tensor]) -> PointerSlots | None:
        """The slots of `buffers` in `graph` (captured with `keep_graph=True` and instantiated),
        or None when the graph refers to them in a way this cannot rebind (module doc) or the
        driver API is missing. Every buffer must be referred to at least once."""
        cu = _cuda()
        if cu is None:
            return None
        try:
            graph_handle, exec_handle = graph.raw_cuda_graph(), graph.raw_cuda_graph_exec()
        except (AttributeError, RuntimeError):      # a torch without them, or a graph not kept
            return None
        ranges = {name: (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for name, t in buffers.items()}
        count = ctypes.c_size_t(0)
        g = ctypes.c_void_p(graph_handle)
        if cu.cuGraphGetNodes(g, None, ctypes.byref(count)) != 0:
            return None
        handles = (ctypes.c_void_p * count.value)()
        if count.value and cu.cuGraphGetNodes(g, handles, ctypes.byref(count)) != 0:
            return None
        nodes: list[_Node] = []
        seen: set[str] = set()
        for h in handles:
            node = ctypes.c_void_p(h)
            kind = ctypes.c_int(-1)
            if cu.cuGraphNodeGetType(node, ctypes.byref(kind)) != 0 or kind.value != _CU_GRAPH_NODE_TYPE_KERNEL:
                return None                 # a copy, memset, event... node: not rebindable
            p = _KernelParams()
            if cu.cuGraphKernelNodeGetParams_v2(node, ctypes.byref(p)) != 0 or bool(p.extra) or not p.func:
                return None
            sizes = []
            for i in range(_MAX_PARAMS):
                off, size = ctypes.c_size_t(0), ctypes.c_size_t(0)
                if cu.cuFuncGetParamInfo(ctypes.c_void_p(p.func), ctypes.c_size_t(i), ctypes.byref(off),
                                         ctypes.byref(size)) != 0:
                    break
                sizes.append(size.value)
            else:
                return None
            array = (ctypes.c_void_p * max(1, len(sizes)))()
            slots: list[tuple[str, ctypes.c_uint64]] = []
            for i, size in enumerate(sizes):
                addr = p.kernel_params[i]
                array[i] = addr
                for w in range(size // 8):
                    value = ctypes.c_uint64.from_address(addr + 8 * w).value
                    for name, (lo, hi) in ranges.items():
                        if lo <= value < hi:
                            if size != 8 or value != lo:
                                return None         # inside a struct, or into the middle of a buffer
                            holder = ctypes.c_uint64(value)
                            array[i] = ctypes.cast(ctypes.byref(holder), ctypes.c_void_p)
                            slots.append((name, holder))
                            seen.add(name)
            if slots:
                p.kernel_params = ctypes.cast(array, ctypes.POINTER(ctypes.c_void_p))
                nodes.append(_Node(node, p, array, slots))
        if seen != set(buffers):
            return None
        return cls(exec_handle, nodes, {name: lo for name, (lo, _) in ranges.items()})

    def bind(self, tensors: Mapping[str, torch.Tensor]) -> bool:
        """Point the graph's arguments at `tensors` (by buffer name) for the next replay; False
        when the driver refused an update (the graph then holds a mix: the caller must rebind
        the captured buffers or stop replaying it)."""
        ptrs = {name: t.data_ptr() for name, t in tensors.items()}
        if ptrs == self._bound:
            return True     # the arguments hold these addresses already (a decode loop's tensors
            #                 often come back at the same addresses from the caching allocator)
        self._bound = None
        for handle, params, slots in self._calls:
            for name, holder in slots:
                holder.value = ptrs[name]
            if self._set(self._exec, handle, params) != 0:
                return False
        self._bound = ptrs
        return True


__all__ = ["PointerSlots"]
