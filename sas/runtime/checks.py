"""Argument checks shared by `SASAttnKernel` and the executors: shapes, dtypes, devices and
lengths of q, k, v and the compact caches, each a `KernelError` naming the argument before any
work starts. Executor-specific limits (the Triton backend's devices and head dims) are checked
by the executor itself."""

from __future__ import annotations

import numbers

import torch

from sas.errors import KernelError

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _dtype_names(dtypes: tuple[torch.dtype, ...]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_tensors(where: str, dtypes: tuple[torch.dtype, ...] = SUPPORTED_DTYPES, **tensors: torch.Tensor) -> None:
    """Each argument a 4-D tensor [batch, heads, seq, head_dim]; all of one dtype of `dtypes` (the
    executor's) and one device, with one batch size and one head_dim."""
    first_name, first = None, None
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise KernelError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise KernelError(f"{where}: {name} must be 4-D [batch, heads, seq, head_dim], got shape {tuple(t.shape)}")
        if 0 in t.shape[:2] or t.shape[3] == 0:
            raise KernelError(f"{where}: {name} has shape {tuple(t.shape)}; batch, heads and head_dim must be at "
                              f"least 1")
        if t.device.type == "meta":
            raise KernelError(f"{where}: {name} is a meta tensor (a shape without data); pass tensors on the "
                              f"device that runs the kernels")
        if first is None:
            first_name, first = name, t
            if t.dtype not in dtypes:
                raise KernelError(f"{where}: {name} has unsupported dtype {t.dtype}; supported: "
                                  f"{_dtype_names(dtypes)}")
            continue
        if t.dtype != first.dtype:
            raise KernelError(f"{where}: {name} has dtype {t.dtype} but {first_name} has {first.dtype}; all tensors "
                              f"must share one dtype")
        if t.device != first.device:
            raise KernelError(f"{where}: {name} is on {t.device} but {first_name} is on {first.device}; all tensors "
                              f"must be on one device")
        if t.shape[0] != first.shape[0]:
            raise KernelError(f"{where}: {name} has batch {t.shape[0]} but {first_name} has {first.shape[0]}")
        if t.shape[3] != first.shape[3]:
            raise KernelError(f"{where}: {name} has head_dim {t.shape[3]} but {first_name} has {first.shape[3]}")


def check_qkv(where: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              dtypes: tuple[torch.dtype, ...] = SUPPORTED_DTYPES) -> None:
    """q [B, Hq, Lq, D], k and v [B, Hkv, Lk, D] of one shape and one dtype of `dtypes`, Hq a
    multiple of Hkv, no empty sequence."""
    check_tensors(where, dtypes, q=q, k=k, v=v)
    if k.shape != v.shape:
        raise KernelError(f"{where}: k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    hq, hkv = q.shape[1], k.shape[1]
    if hkv == 0 or hq % hkv:
        raise KernelError(f"{where}: q has {hq} heads and k/v have {hkv}; the query heads must be a multiple of "
                          f"the kv heads (GQA)")
    if q.shape[2] == 0 or k.shape[2] == 0:
        raise KernelError(f"{where}: empty sequence (q length {q.shape[2]}, k length {k.shape[2]})")


def check_one_token(where: str, q: torch.Tensor, k: torch.Tensor) -> None:
    if q.shape[2] != 1 or k.shape[2] != 1:
        raise KernelError(f"{where}: decode takes one token: q [B, Hq, 1, D] and k, v [B, Hkv, 1, D], got q length "
                          f"{q.shape[2]} and k length {k.shape[2]}")


def check_cache(where: str, past_k: torch.Tensor, past_v: torch.Tensor, k: torch.Tensor, slots: int,
                names: tuple[str, str] = ("past_k", "past_v"), new_cache: str = "kernel.new_cache(...)") -> None:
    """past_k, past_v [batch, kv_heads, slots, head_dim] matching k, contiguous in head_dim;
    `names`: the caller's names of the two caches, `new_cache`: how the caller makes one."""
    want = (k.shape[0], k.shape[1], slots, k.shape[3])
    for name, c in zip(names, (past_k, past_v)):
        if tuple(c.shape) != want:
            raise KernelError(f"{where}: {name} must have shape [batch, kv_heads, cache_size, head_dim] = "
                              f"{list(want)}, got {list(c.shape)}")
        if c.stride(3) != 1:
            raise KernelError(f"{where}: {name} must be contiguous in head_dim")
        if any(c.stride(d) == 0 for d in range(3) if c.shape[d] > 1):
            raise KernelError(f"{where}: {name} is a broadcast view (stride 0 in a dimension of size > 1, e.g. "
                              f"from .expand): its slots alias one another; pass a tensor of its own, e.g. "
                              f"{new_cache} or .clone()")


def check_geometry(where: str, batch: object, num_kv_heads: object, head_dim: object) -> tuple[int, int, int]:
    """batch, num_kv_heads and head_dim of a compact cache: positive integers (ints or numpy
    integers, not bools), returned as ints."""
    for name, x in (("batch", batch), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
        if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x <= 0:
            raise KernelError(f"{where}: {name} must be a positive integer, got {x!r}")
    return int(batch), int(num_kv_heads), int(head_dim)  # type: ignore[call-overload]


def check_new_cache(where: str, batch: object, num_kv_heads: object, head_dim: object, dtype: object,
                    device: object, dtypes: tuple[torch.dtype, ...] = SUPPORTED_DTYPES
                    ) -> tuple[tuple[int, int, int], torch.device | None]:
    """The arguments of new_cache: (batch, num_kv_heads, head_dim) as ints and the device (None:
    torch's default); the dtype one of `dtypes`."""
    geometry = check_geometry(where, batch, num_kv_heads, head_dim)
    if dtype not in dtypes:
        raise KernelError(f"{where}: dtype must be one of {_dtype_names(dtypes)}, got {dtype!r}")
    if device is None:
        return geometry, None
    try:
        return geometry, torch.device(device)  # type: ignore[call-overload]
    except (RuntimeError, TypeError) as e:
        raise KernelError(f"{where}: device must be a torch device such as 'cpu' or 'cuda:0', got {device!r} "
                          f"({e})") from None


def check_fill(where: str, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               slots: int, max_len: int, names: tuple[str, str] = ("past_k", "past_v"),
               new_cache: str = "kernel.new_cache(...)", dtypes: tuple[torch.dtype, ...] = SUPPORTED_DTYPES) -> None:
    """The arguments of fill_cache: a prompt's k, v [B, Hkv, L, D] (one shape, L <= max_len) and
    compact caches that match them (`check_cache`), all of one dtype of `dtypes` and one device."""
    check_tensors(where, dtypes, k=k, v=v, **dict(zip(names, (k_cache, v_cache))))
    if k.shape != v.shape:
        raise KernelError(f"{where}: k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    check_cache(where, k_cache, v_cache, k, slots, names=names, new_cache=new_cache)
    if k.shape[2] > max_len:
        raise KernelError(f"{where}: prompt length {k.shape[2]} exceeds max_len={max_len}")


def check_no_grad(where: str, backend: str, ways_out: str, **tensors: object) -> None:
    """No autograd through a backend without a backward pass: where gradients are being recorded
    and an input requires one, refuse instead of returning an output cut off from the graph.
    `ways_out`: what the caller can do instead."""
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.requires_grad:
            raise KernelError(f"{where}: {name} requires grad, but backend={backend!r} has no backward pass (its "
                              f"output would be silently cut off from autograd); {ways_out}")


def check_position(where: str, position: object, max_len: int, larger: str = "build the kernel with a larger "
                   "max_len") -> int:
    """`position` as an int (an int or numpy integer, not a bool) in 0..max_len - 1; `larger`: how
    to get a larger max_len."""
    if isinstance(position, bool) or not isinstance(position, numbers.Integral) or position < 0:
        raise KernelError(f"{where}: position must be a non-negative integer, got {position!r}")
    if position >= max_len:
        raise KernelError(f"{where}: position {position} is past max_len={max_len} (the cache analysis covers "
                          f"positions 0..{max_len - 1}); {larger}")
    return int(position)


__all__ = ["SUPPORTED_DTYPES", "check_cache", "check_fill", "check_geometry", "check_new_cache", "check_no_grad", "check_one_token", "check_position", "check_qkv",
           "check_tensors"]
