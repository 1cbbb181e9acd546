"""Launching a `@triton.jit` kernel without Triton's per-call argument binding.

`kernel[grid](*args, **consts)` costs ~15-30 us of host time a call in Triton 3.6: it binds the
arguments, computes the specialization key and looks the compiled kernel up. A decode step of a
few such launches is host-bound on small problems. `DirectLaunch(kernel)(grid, args, consts,
options)` takes Triton's path the first time it meets a specialization and keeps the compiled
kernel; later calls with the same specialization call its launcher directly.

The specialization key is computed here from the arguments the way Triton 3.6 specializes
them: each tensor's dtype and whether its address is 16-byte aligned; each integer's type range
(i32, i64, u64), whether it equals 1 and whether it is divisible by 16; floats and bools by type;
anything else (None, strings) by value; plus the compile-time constants and the launch options
(num_warps, num_stages), which the caller passes the same way as to `kernel[grid]`.

Only with Triton 3.6 (the launcher signature this was checked against), never under the
interpreter, and never while a launch hook is set (profilers): every other launch takes Triton's
ordinary path.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import triton

try:
    from triton import knobs as _knobs
    from triton.runtime import driver as _driver
except ImportError:          # pragma: no cover - an older Triton: every launch takes the ordinary path
    _knobs = _driver = None

#: direct launches only with the Triton whose launcher signature they were checked against
FAST_LAUNCH = _knobs is not None and tuple(int(x) for x in triton.__version__.split(".")[:2]) == (3, 6)

_I32, _I64 = 1 << 31, 1 << 63


def no_hook(hook: Any) -> bool:
    """No launch hook set: None (older Triton) or an empty `HookChain` (Triton 3.6+, where the
    knob is never None: testing `is None` alone would keep every launch on the slow path)."""
    return hook is None or (isinstance(getattr(hook, "calls", None), list) and not hook.calls)


def hooks_clear() -> bool:
    return no_hook(_knobs.runtime.launch_enter_hook) and no_hook(_knobs.runtime.launch_exit_hook)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def current_stream(device: torch.device) -> int:
    """The raw handle of the current stream of a CUDA device (0 for other devices)."""
    if device.type != "cuda":
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _driver.active.get_current_stream(index) if _driver is not None else \
        torch.cuda.current_stream(device).cuda_stream


def _arg_key(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    if isinstance(a, bool):
        return bool
    if isinstance(a, int):
        return (0 if -_I32 <= a < _I32 else 1 if -_I64 <= a < _I64 else 2, a == 1, a % 16 == 0)
    if isinstance(a, float):
        return float
    return a


class DirectLaunch:
    """One `@triton.jit` kernel, launched as `launch(grid, args, consts, options)` = `kernel[grid](
    *args, **consts, **options)`. The compile-time constants must be the kernel's last
    parameters (passed by name in `consts`), the per-call arguments its first ones."""

    def __init__(self, kernel: Any):
        self.kernel = kernel
        self.names = list(kernel.arg_names)
        self.compiled: dict[tuple, tuple[Any, tuple]] = {}

    def __call__(self, grid: tuple[int, ...], args: tuple, consts: dict[str, Any],
                 options: dict[str, Any] | None = None) -> None:
        opts = options or {}
        grid3 = tuple(grid) + (1,) * (3 - len(grid))
        key = None
        if FAST_LAUNCH and not interpreting():
            key = (tuple(_arg_key(a) for a in args), tuple(consts.values()), tuple(opts.items()))
            hit = self.compiled.get(key)
            if hit is not None and hooks_clear():
                ck, tail = hit
                dev = next(a for a in args if isinstance(a, torch.Tensor)).device
                ck.run(grid3[0], grid3[1], grid3[2], current_stream(dev), ck.function, ck.packed_metadata,
                       None, None, None, *args, *tail)
                return
        ck = self.kernel[grid3](*args, **consts, **opts)
        trailing = self.names[len(args):]
        if (key is not None and all(n in consts for n in trailing)
                and all(hasattr(ck, a) for a in ("run", "function", "packed_metadata"))):
            dev = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if dev is not None and dev.is_cuda:
                tail = tuple(consts[n] for n in trailing)
                self.compiled[key] = (ck, tail)


__all__ = ["DirectLaunch", "FAST_LAUNCH", "current_stream", "hooks_clear", "interpreting", "no_hook"]
