"""`SASAttnKernel`: a torch module running a pattern's generated kernels and owning its
compact KV cache (paper section 4.3, Figure 8).

Two ways to call it:

- functional: `out = kernel(q, k, v)` runs prefill (q [B, Hq, Lq, D], k, v [B, Hkv, Lk, D],
  queries at positions Lk - Lq .. Lk - 1); `out = kernel(q, k, v, past_k, past_v,
  position=p)` runs one decode step for the token at position p over the compact caches
  past_k, past_v [B, Hkv, cache_size, D], which it updates in place (the new key goes to slot
  `cache_id_func(p)`). `kernel.new_cache(...)` / `kernel.fill_cache(...)` make and fill such
  caches.
- stateful: `kernel.prefill(q, k, v)` computes the prompt's attention and fills the kernel's
  own compact cache; each `kernel.decode(q, k, v)` (one token) appends a token and returns
  its attention output.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, Mapping

import numpy as np
import torch

from sas.codegen.lower_triton import check_identifier
from sas.codegen.triton_backend import (
    SUPPORTED_HEAD_DIMS,
    auto_decode_options,
    auto_prefill_options,
    DecodeOptions,
    PrefillOptions,
    decode_module,
    prefill_module,
)
from sas.errors import KernelError, NotYetSupportedError
from sas.ir.tiles import is_causal
from sas.lang.pattern import Pattern
from sas.runtime.tiles import tile_tensors

BACKENDS = ("triton",)
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def interpreting() -> bool:
    """True when Triton kernels run on the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


class SASAttnKernel(torch.nn.Module):
    """Sparse attention for a static `pattern`, with a KV cache of the minimal size.

    `max_len` bounds the positions decode may reach (the cache analysis is exact up to it).
    `analysis` may pass a precomputed `sas.analyze(pattern, max_len)` result.
    """

    def __init__(self, pattern: Pattern, other_inputs: Mapping[str, Any] | None = None,
                 max_len: int = 16384, backend: str = "triton", *, analysis: Any = None,
                 prefill_options: PrefillOptions | None = None,
                 decode_options: DecodeOptions | None = None, num_splits: int | None = None,
                 cache_dir: str | os.PathLike | None = None):
        super().__init__()
        if not isinstance(pattern, Pattern):
            raise KernelError(f"SASAttnKernel: pattern must be a sas Pattern (Rect, Diag, ... combined "
                              f"with + * ~ >>), got {type(pattern).__name__}")
        if backend not in BACKENDS:
            raise KernelError(f"SASAttnKernel: unknown backend {backend!r}; available: {', '.join(BACKENDS)}")
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len <= 0:
            raise KernelError(f"SASAttnKernel: max_len must be a positive integer, got {max_len!r}")
        if other_inputs is None:
            other_inputs = {}
        if not isinstance(other_inputs, Mapping):
            raise KernelError(f"SASAttnKernel: other_inputs must be a mapping name -> tensor, "
                              f"got {type(other_inputs).__name__}")
        for name, value in other_inputs.items():
            check_identifier(name, "other_inputs name")
            if not isinstance(value, torch.Tensor):
                raise KernelError(f"SASAttnKernel: other_inputs[{name!r}] must be a torch.Tensor, "
                                  f"got {type(value).__name__}")
        if num_splits is not None and (not isinstance(num_splits, int) or num_splits < 1):
            raise KernelError(f"SASAttnKernel: num_splits must be a positive integer or None, got {num_splits!r}")
        self.pattern = pattern
        self.other_inputs = dict(other_inputs)
        self.max_len = max_len
        self.backend = backend
        #: None: chosen per sequence length by `auto_prefill_options`
        self.prefill_options = prefill_options
        #: None: chosen per query-group size by `auto_decode_options`
        self.decode_options = decode_options
        self.num_splits = num_splits
        self._cache_dir = cache_dir
        #: the run-time selection of a pattern with a Dynamic component (sas.runtime.dynamic)
        self.dynamic = None
        if pattern.dynamics():
            from sas.runtime.dynamic import DynamicRuntime

            self.dynamic = DynamicRuntime(pattern, max_len, self.other_inputs, cache_dir)
            self.causal = True
            self.analysis = None
            self.register_buffer("k_cache", None, persistent=False)
            self.register_buffer("v_cache", None, persistent=False)
            self.length = 0
            return
        self.causal = is_causal(pattern, max_len)
        self._analysis_error: str | None = None
        if analysis is None and self.causal:
            from sas import analyze
            from sas.errors import AnalysisError

            try:
                analysis = analyze(pattern, max_len=max_len)
            except AnalysisError as e:
                # Prefill needs no cache analysis; decode reports this when asked for.
                self._analysis_error = str(e)
        self.analysis = analysis
        self._prefill_mods: dict[PrefillOptions, Any] = {}
        # render (and import) the default configuration now: errors surface at construction
        self._prefill_module(self.prefill_options or PrefillOptions())
        self._decode_mods: dict[DecodeOptions, Any] = {}
        self._tiles: OrderedDict[tuple, tuple] = OrderedDict()
        self._slot_codes: np.ndarray | None = None
        self.register_buffer("k_cache", None, persistent=False)
        self.register_buffer("v_cache", None, persistent=False)
        self.length = 0

    # --- properties ------------------------------------------------------------------------
    @property
    def cache_size(self) -> int:
        """Slots of the compact KV cache per (batch, kv head)."""
        if self.dynamic is not None:
            return self.dynamic.cache_size
        self._need_decode("cache_size")
        return int(self.analysis.cache_size)

    def extra_repr(self) -> str:
        size = self.analysis.cache_size if self.analysis is not None else None
        if self.dynamic is not None:
            c = self.dynamic.cplan
            size = f"{c.static_size} static + {c.pool_size} dynamic"
        return f"pattern={self.pattern!r}, max_len={self.max_len}, cache_size={size}, backend={self.backend!r}"

    # --- validation ------------------------------------------------------------------------
    def _need_decode(self, what: str) -> None:
        if self.dynamic is not None:
            return
        if not self.causal:
            raise KernelError(
                f"{what}: the pattern {self.pattern!r} is not causal (some query attends a later "
                f"key), so it has no decode KV cache; prefill works, decode needs a causal "
                f"pattern (multiply it by Causal())"
            )
        if self.analysis is None:
            raise KernelError(f"{what}: no KV-cache analysis for this pattern, so it cannot decode: "
                              f"{self._analysis_error or 'none given'}")

    def _decode_config(self, group: int = 1) -> DecodeOptions:
        return self.decode_options or auto_decode_options(self.analysis, group)

    def _decode_module(self, options: DecodeOptions | None = None):
        options = options or self._decode_config()
        mod = self._decode_mods.get(options)
        if mod is None:
            mod = self._decode_mods[options] = decode_module(self.analysis, options, self._cache_dir)
        return mod

    @staticmethod
    def _check_tensors(where: str, **tensors: torch.Tensor) -> None:
        first_name, first = None, None
        for name, t in tensors.items():
            if not isinstance(t, torch.Tensor):
                raise KernelError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() != 4:
                raise KernelError(f"{where}: {name} must be 4-D [batch, heads, seq, head_dim], "
                                  f"got shape {tuple(t.shape)}")
            if first is None:
                first_name, first = name, t
                if t.dtype not in SUPPORTED_DTYPES:
                    raise KernelError(f"{where}: {name} has unsupported dtype {t.dtype}; supported: "
                                      f"bfloat16, float16, float32")
                if t.device.type != "cuda" and not interpreting():
                    raise KernelError(f"{where}: {name} is on {t.device}; the triton backend needs CUDA "
                                      f"tensors (or TRITON_INTERPRET=1 to run on the CPU interpreter)")
                continue
            if t.dtype != first.dtype:
                raise KernelError(f"{where}: {name} has dtype {t.dtype} but {first_name} has "
                                  f"{first.dtype}; all tensors must share one dtype")
            if t.device != first.device:
                raise KernelError(f"{where}: {name} is on {t.device} but {first_name} is on "
                                  f"{first.device}; all tensors must be on one device")
            if t.shape[0] != first.shape[0]:
                raise KernelError(f"{where}: {name} has batch {t.shape[0]} but {first_name} has "
                                  f"{first.shape[0]}")
            if t.shape[3] != first.shape[3]:
                raise KernelError(f"{where}: {name} has head_dim {t.shape[3]} but {first_name} has "
                                  f"{first.shape[3]}")
        d = first.shape[3]
        if d not in SUPPORTED_HEAD_DIMS:
            raise KernelError(f"{where}: head_dim {d} is not supported; supported: "
                              f"{', '.join(map(str, SUPPORTED_HEAD_DIMS))}")

    def _check_qkv(self, where: str, q, k, v) -> None:
        self._check_tensors(where, q=q, k=k, v=v)
        if k.shape != v.shape:
            raise KernelError(f"{where}: k and v must have the same shape, got {tuple(k.shape)} and "
                              f"{tuple(v.shape)}")
        hq, hkv = q.shape[1], k.shape[1]
        if hkv == 0 or hq % hkv:
            raise KernelError(f"{where}: q has {hq} heads and k/v have {hkv}; the query heads must "
                              f"be a multiple of the kv heads (GQA)")
        if q.shape[2] == 0 or k.shape[2] == 0:
            raise KernelError(f"{where}: empty sequence (q length {q.shape[2]}, k length {k.shape[2]})")

    # --- prefill ---------------------------------------------------------------------------
    def _prefill_module(self, options: PrefillOptions):
        mod = self._prefill_mods.get(options)
        if mod is None:
            mod = self._prefill_mods[options] = prefill_module(self.pattern, options, self._cache_dir)
        return mod

    def _tile_tensors(self, q_len: int, k_len: int, device: torch.device) -> tuple:
        """(options, full_rowptr, full_cols, part_rowptr, part_cols, order) for this length."""
        key = (q_len, k_len, str(device))
        hit = self._tiles.get(key)
        if hit is not None:
            self._tiles.move_to_end(key)
            return hit
        o = self.prefill_options or auto_prefill_options(self.pattern, q_len, k_len)
        out = (o,) + tile_tensors(self.pattern, q_len, k_len, o.block_m, o.block_n, device)
        self._tiles[key] = out
        while len(self._tiles) > 16:
            self._tiles.popitem(last=False)
        return out

    def _prefill(self, where: str, q, k, v, out=None) -> torch.Tensor:
        self._check_qkv(where, q, k, v)
        if q.shape[2] > k.shape[2]:
            raise KernelError(f"{where}: q has {q.shape[2]} positions but k/v only {k.shape[2]}; the "
                              f"queries must be the last Lq <= Lk positions")
        o, fr, fc, pr, pc, order = self._tile_tensors(q.shape[2], k.shape[2], q.device)
        return self._prefill_module(o).prefill(q, k, v, fr, fc, pr, pc, order, q_offset=k.shape[2] - q.shape[2],
                                               out=out, block_m=o.block_m, block_n=o.block_n,
                                               num_warps=o.num_warps, num_stages=o.num_stages)

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Attention of the prompt (q, k, v of equal length); for a causal pattern also fills
        the kernel's own compact cache with the prompt's keys and values."""
        where = "SASAttnKernel.prefill"
        self._check_qkv(where, q, k, v)
        if q.shape[2] != k.shape[2]:
            raise KernelError(f"{where}: q has {q.shape[2]} positions and k/v {k.shape[2]}; a prompt "
                              f"has one query per key (use kernel(q, k, v) for suffix queries)")
        if self.causal and k.shape[2] > self.max_len:
            raise KernelError(f"{where}: prompt length {k.shape[2]} exceeds max_len={self.max_len}")
        if self.dynamic is not None:
            out = self.dynamic.prefill(q, k, v, self.prefill_options)
            self.k_cache, self.v_cache = self.dynamic.state.k, self.dynamic.state.v
            self.length = k.shape[2]
            return out
        out = self._prefill(where, q, k, v)
        if self.causal and self.analysis is not None:
            self.k_cache, self.v_cache = self.new_cache(k.shape[0], k.shape[1], k.shape[3], k.dtype, k.device)
            self.fill_cache(k, v, self.k_cache, self.v_cache)
            self.length = k.shape[2]
        else:
            self.k_cache = self.v_cache = None
            self.length = k.shape[2]
        return out

    # --- compact caches --------------------------------------------------------------------
    def new_cache(self, batch: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype = torch.bfloat16,
                  device: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Zeroed compact caches (k, v), each [batch, num_kv_heads, cache_size, head_dim]."""
        self._need_decode("SASAttnKernel.new_cache")
        slots = max(1, self.cache_size)
        shape = (batch, num_kv_heads, slots, head_dim)
        return (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    def fill_cache(self, k: torch.Tensor, v: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor) -> None:
        """Write a prompt's keys/values (positions 0..L-1) into compact caches, as
        token-by-token decoding would have left them."""
        where = "SASAttnKernel.fill_cache"
        self._need_decode(where)
        self._check_tensors(where, k=k, v=v, past_k=past_k, past_v=past_v)
        self._check_cache(where, past_k, past_v, k)
        if k.shape != v.shape:
            raise KernelError(f"{where}: k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
        if k.shape[2] > self.max_len:
            raise KernelError(f"{where}: prompt length {k.shape[2]} exceeds max_len={self.max_len}")
        self._decode_module().fill_cache(k, v, past_k, past_v)

    def _check_cache(self, where: str, past_k, past_v, k) -> None:
        want = (k.shape[0], k.shape[1], max(1, self.cache_size), k.shape[3])
        for name, c in (("past_k", past_k), ("past_v", past_v)):
            if tuple(c.shape) != want:
                raise KernelError(f"{where}: {name} must have shape [batch, kv_heads, cache_size, head_dim] = "
                                  f"{list(want)}, got {list(c.shape)}")
            if c.stride(3) != 1:
                raise KernelError(f"{where}: {name} must be contiguous in head_dim")

    # --- decode ----------------------------------------------------------------------------
    def _splits(self, mod, o: DecodeOptions, batch: int, num_kv_heads: int, device: torch.device) -> int:
        if self.num_splits is not None:
            return self.num_splits
        sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
        return mod.num_splits_for(batch, num_kv_heads, num_sms=sms, block_n=o.block_n, waves=o.waves)

    def _decode(self, where: str, q, k, v, past_k, past_v, position: int, out=None) -> torch.Tensor:
        self._need_decode(where)
        self._check_qkv(where, q, k, v)
        self._check_tensors(where, q=q, past_k=past_k, past_v=past_v)
        self._check_cache(where, past_k, past_v, k)
        if q.shape[2] != 1 or k.shape[2] != 1:
            raise KernelError(f"{where}: decode takes one token: q [B, Hq, 1, D] and k, v [B, Hkv, 1, D], "
                              f"got q length {q.shape[2]} and k length {k.shape[2]}")
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise KernelError(f"{where}: position must be a non-negative integer, got {position!r}")
        if position >= self.max_len:
            raise KernelError(f"{where}: position {position} is past max_len={self.max_len} (the cache "
                              f"analysis covers positions 0..{self.max_len - 1}); build the kernel with a "
                              f"larger max_len")
        o = self._decode_config(q.shape[1] // k.shape[1])
        mod = self._decode_module(o)
        splits = self._splits(mod, o, q.shape[0], k.shape[1], q.device)
        slot_keys = self._held_keys(position, q.device) if mod.HELD_KEYS else None
        return mod.decode(q, k, v, past_k, past_v, position, out=out, num_splits=splits,
                          slot_keys=slot_keys, block_n=o.block_n, num_warps=o.num_warps,
                          num_stages=o.num_stages, use_dot=(q.shape[1] > k.shape[1]) or o.mha_dot,
                          fused_combine=o.fused_combine)

    def _held_keys(self, position: int, device: torch.device) -> torch.Tensor:
        """Key held by each slot once key `position` is written (-1: empty), for analyses whose
        mask_func is table-driven rather than an inlinable expression."""
        if self._slot_codes is None:
            n = self.max_len
            cid = np.array([self.analysis.cache_id_func(j) for j in range(n)], dtype=np.int64)
            j = np.nonzero(cid >= 0)[0]
            self._slot_codes = np.sort(cid[j] * n + j)
        n, C = self.max_len, max(1, self.cache_size)
        codes = self._slot_codes
        want = np.arange(C, dtype=np.int64) * n + position
        idx = np.searchsorted(codes, want, side="right") - 1
        hit = idx >= 0
        got = codes[np.maximum(idx, 0)]
        held = np.where(hit & (got // n == np.arange(C)), got % n, -1).astype(np.int32)
        return torch.from_numpy(held).to(device)

    def decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Append one token (q [B, Hq, 1, D], k, v [B, Hkv, 1, D]) at the next position and
        return its attention output [B, Hq, 1, D]."""
        where = "SASAttnKernel.decode"
        self._need_decode(where)
        if self.k_cache is None:
            raise KernelError(f"{where}: no prompt yet; call kernel.prefill(q, k, v) before decode")
        if self.dynamic is not None:
            self._check_qkv(where, q, k, v)
            if q.shape[2] != 1 or k.shape[2] != 1:
                raise KernelError(f"{where}: decode takes one token: q [B, Hq, 1, D] and k, v [B, Hkv, 1, D], "
                                  f"got q length {q.shape[2]} and k length {k.shape[2]}")
            if self.length >= self.max_len:
                raise KernelError(f"{where}: position {self.length} is past max_len={self.max_len}; build the "
                                  f"kernel with a larger max_len")
            out = self.dynamic.decode(q, k, v)
            self.length += 1
            return out
        out = self._decode(where, q, k, v, self.k_cache, self.v_cache, self.length)
        self.length += 1
        return out

    def reset(self) -> None:
        """Forget the stateful cache."""
        self.k_cache = self.v_cache = None
        self.length = 0

    # --- functional form -------------------------------------------------------------------
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past_k: torch.Tensor | None = None,
                past_v: torch.Tensor | None = None, *, position: int | None = None) -> torch.Tensor:
        """Prefill when no past caches are given, else one decode step at `position` (default:
        the kernel's own length when past_k/past_v are its own caches)."""
        if self.dynamic is not None:
            if past_k is not None or past_v is not None:
                raise NotYetSupportedError(
                    "SASAttnKernel: a pattern with a Dynamic component keeps per-head selection state "
                    "beside its cache; use the stateful kernel.prefill(q, k, v) / kernel.decode(q, k, v) "
                    "instead of caller-held past_k/past_v")
            return self.prefill(q, k, v)
        if past_k is None and past_v is None:
            return self._prefill("SASAttnKernel", q, k, v)
        if past_k is None or past_v is None:
            raise KernelError("SASAttnKernel: give both past_k and past_v (or neither, for prefill)")
        if position is None:
            if past_k is self.k_cache and past_v is self.v_cache and self.k_cache is not None:
                out = self._decode("SASAttnKernel", q, k, v, past_k, past_v, self.length)
                self.length += 1
                return out
            raise KernelError("SASAttnKernel: position= (the new token's absolute position) is required "
                              "with caller-owned past_k/past_v")
        return self._decode("SASAttnKernel", q, k, v, past_k, past_v, position)

    # --- accounting ------------------------------------------------------------------------
    def _cache_geometry(self, what: str, batch, num_kv_heads, head_dim, dtype):
        if self.k_cache is not None:
            batch = self.k_cache.shape[0] if batch is None else batch
            num_kv_heads = self.k_cache.shape[1] if num_kv_heads is None else num_kv_heads
            head_dim = self.k_cache.shape[3] if head_dim is None else head_dim
            dtype = self.k_cache.dtype if dtype is None else dtype
        if None in (batch, num_kv_heads, head_dim):
            raise KernelError(f"{what}: no cache yet; call prefill first or pass batch, num_kv_heads and head_dim")
        dtype = torch.bfloat16 if dtype is None else dtype
        return batch * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def kv_cache_bytes(self, batch: int | None = None, num_kv_heads: int | None = None,
                       head_dim: int | None = None, dtype: torch.dtype | None = None) -> int:
        """Bytes of the compact K and V caches (cache_size slots)."""
        self._need_decode("SASAttnKernel.kv_cache_bytes")
        return 2 * self.cache_size * self._cache_geometry("kv_cache_bytes", batch, num_kv_heads, head_dim, dtype)

    def dense_kv_cache_bytes(self, batch: int | None = None, num_kv_heads: int | None = None,
                             head_dim: int | None = None, dtype: torch.dtype | None = None) -> int:
        """Bytes a dense cache of max_len positions would take."""
        return 2 * self.max_len * self._cache_geometry("dense_kv_cache_bytes", batch, num_kv_heads, head_dim, dtype)


__all__ = ["SASAttnKernel", "interpreting"]
