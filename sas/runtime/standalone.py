"""Host side of generated static kernels, and the one-call entry of `sas compile` output.

This module imports only torch, the standard library and its sibling `checks` (the argument
checks of `SASAttnKernel`): `sas compile` copies both beside the generated modules (as
`standalone.py` and `checks.py`, whose errors are then ValueErrors), and sas's own Triton
runtime uses the same functions (tile schedule expansion, held-key tables, split counts), so
both paths run one code.

A compiled folder is a Python package:

    import importlib.util, sys
    spec = importlib.util.spec_from_file_location("my_attn", "build/__init__.py",
                                                  submodule_search_locations=["build"])
    attn = importlib.util.module_from_spec(spec); sys.modules["my_attn"] = attn
    spec.loader.exec_module(attn)
    out = attn.prefill(q, k, v)                      # any length <= MAX_LEN
    k_cache, v_cache = attn.new_cache(batch, num_kv_heads, head_dim, dtype, device)
    attn.fill_cache(k, v, k_cache, v_cache)          # the prompt's keys, as decoding leaves them
    out = attn.decode(q1, k1, v1, k_cache, v_cache, position)

(or `import build` when the folder's parent is on sys.path and its name is an identifier).
Dynamic patterns: `attn.prefill(q, k, v)` starts a sequence batch and `attn.decode(q1, k1, v1)`
continues it (the selection state lives beside the cache; `attn.Runtime` makes more).

The prefill tile schedule for `max_len` is stored as runs of key blocks per query block
(`plan.pt`, `schedule["prefill"]`), or, where the pattern repeats, as those of its first query
blocks and a period (`period_m`, `period_n`, `fixed`: `sas.ir.tile_period`) from which
`schedule_rows` derives every later query block. A prompt of length L <= max_len (queries =
keys) uses its first query blocks with the runs clipped to L (`prefix_runs`): exact, since a tile's class can
only go from partial to empty or full when rows and columns are cut, and partial tiles test the
mask cell by cell; a full tile of a ragged last key block becomes partial. Queries that are a
suffix of the keys (Lq < Lk) recompute their tiles from the generated mask predicate on the
device (`build_tiles` in prefill.py: O(Lq * Lk) evaluations, chunked). Where 128 x 128 tiles
pay once the Gluon kernel runs them, `schedule["prefill_wide"]` holds that schedule too; the
prefill takes it where prefill.py's `gluon_ok` allows the tensors (`StaticKernel.wide`).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from .checks import (check_cache, check_fill, check_new_cache, check_no_grad, check_one_token, check_position,
                     check_qkv, check_tensors)

#: the file beside the kernels holding the plan's tables (torch.save of a dict)
PLAN_FILE = "plan.pt"
FORMAT = 1


# --- tile schedules ---------------------------------------------------------------------------


def _normalize(rows: torch.Tensor, a: torch.Tensor, b: torch.Tensor, nrows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR (ptr, runs) of runs given as (row, start, stop): empty runs dropped, sorted, adjacent
    runs merged."""
    keep = b > a
    rows, a, b = rows[keep], a[keep], b[keep]
    span = int(b.max()) + 1 if b.numel() else 1
    order = torch.argsort(rows * span + a, stable=True)
    rows, a, b = rows[order], a[order], b[order]
    if rows.numel():
        new = torch.ones(rows.numel(), dtype=torch.bool, device=rows.device)
        new[1:] = (rows[1:] != rows[:-1]) | (a[1:] != b[:-1])
        start = new.nonzero()[:, 0]
        end = torch.cat([start[1:], torch.tensor([rows.numel()], device=rows.device)]) - 1
        rows, a, b = rows[start], a[start], b[end]
    ptr = torch.zeros(nrows + 1, dtype=torch.int64, device=rows.device)
    ptr[1:] = torch.cumsum(torch.bincount(rows, minlength=nrows)[:nrows], 0)
    return ptr.to(torch.int32), torch.stack([a, b], dim=1).to(torch.int32).reshape(-1, 2)


def _rows_of(ptr: torch.Tensor, runs: torch.Tensor, nrows: int) -> tuple[torch.Tensor, ...]:
    ptr = ptr.to(torch.int64)
    n = int(ptr[nrows])
    rows = torch.repeat_interleave(torch.arange(nrows, device=ptr.device), ptr[1:nrows + 1] - ptr[:nrows])
    runs = runs.to(torch.int64)
    return rows, runs[:n, 0], runs[:n, 1]


def _ranks(counts: torch.Tensor) -> torch.Tensor:
    """0 .. c - 1 for each count c, in one tensor: each item's place in its group (the key
    blocks of a run, the runs of a row, the copies of a band)."""
    counts = counts.to(torch.int64)
    return (torch.arange(int(counts.sum()), dtype=torch.int64, device=counts.device)
            - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts))


def _period_rows(schedule: dict[str, Any], ptr: torch.Tensor, runs: torch.Tensor, lo: int,
                 hi: int, copies: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(row, start, stop) of the runs of query blocks lo .. hi - 1 (lo at or past the stored
    rows) of a periodic schedule (`sas.ir.tile_period`): row r of the last stored period with
    its key blocks below `fixed` kept, its band `[fixed - period_n, fixed)` repeated k - 1 times
    and the rest moved by k periods, k = (m - r) / period_m; not clipped to a length. The fourth
    value: with `copies=False`, the tiles of the band's copies, counted instead of listed (else
    0). A count at a length may leave them out of the clipping: no copy reaches the last key
    block. (Row r lies past `fixed` key blocks, `r * block_m >= fixed * block_n - 1`, so the
    copies of query block m end by token (m - period_m) * block_m + 1 <= m * block_m, below any
    length that has query block m.)"""
    pm, pn, fixed = int(schedule["period_m"]), int(schedule["period_n"]), int(schedule["fixed"])
    ptr = ptr.to(torch.int64)
    base = ptr.numel() - 1
    m = torch.arange(lo, hi, dtype=torch.int64)
    r = base - pm + (m - base) % pm
    k = (m - r) // pm
    count = ptr[r + 1] - ptr[r]
    row = torch.repeat_interleave(m, count)
    k = torch.repeat_interleave(k, count)
    runs = runs.to(torch.int64)[torch.repeat_interleave(ptr[r], count) + _ranks(count)]
    a, b = runs[:, 0], runs[:, 1]
    band_a, band_b = a.clamp(min=fixed - pn), b.clamp(max=fixed)
    # the band's copies j = 1 .. k - 1: one run where a run spans the band, else one per copy
    has = (band_b > band_a) & (k > 1)
    if not copies:
        counted = int(((k - 1) * (band_b - band_a))[has].sum())
        has = torch.zeros_like(has)
    else:
        counted = 0
    whole = has & (band_a == fixed - pn) & (band_b == fixed)
    some = has & ~whole
    n_copies = k[some] - 1
    shift = (_ranks(n_copies) + 1) * pn                      # copy j = 1 .. k - 1 moves j periods
    return (torch.cat([row, row[whole], torch.repeat_interleave(row[some], n_copies), row]),
            torch.cat([a, torch.full_like(row[whole], fixed), torch.repeat_interleave(band_a[some], n_copies) + shift,
                       band_a + k * pn]),
            torch.cat([b.clamp(max=fixed), fixed + (k[whole] - 1) * pn,
                       torch.repeat_interleave(band_b[some], n_copies) + shift, b + k * pn]), counted)


def schedule_rows(schedule: dict[str, Any], full: bool, lo: int, hi: int,
                  copies: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(row, start, stop) of the full (or partial) runs of query blocks lo .. hi - 1 of the
    stored square schedule, before any clipping to a length: the stored rows, then for a
    periodic schedule (`period_m` set) the rows it derives; and the tiles of the derived rows'
    band copies where `copies=False` counts them instead of listing them (`_period_rows`)."""
    ptr, runs = (schedule["full_ptr"], schedule["full_runs"]) if full else (schedule["part_ptr"], schedule["part_runs"])
    stored = ptr.numel() - 1
    rows, a, b = _rows_of(ptr, runs, min(hi, stored))
    keep = rows >= lo
    rows, a, b = rows[keep], a[keep], b[keep]
    skipped = 0
    if hi > stored:
        *more, skipped = _period_rows(schedule, ptr, runs, max(lo, stored), hi, copies)
        rows, a, b = (torch.cat([x, y]) for x, y in zip((rows, a, b), more))
    return rows, a, b, skipped


def clip_runs(full: tuple[torch.Tensor, ...], part: tuple[torch.Tensor, ...], length: int, block_n: int,
              lo: int, hi: int) -> tuple[torch.Tensor, ...]:
    """CSR (full_ptr, full_runs, part_ptr, part_runs) of query blocks lo .. hi - 1 of the
    `length x length` problem from runs (row, start, stop) of the longer schedule: runs clipped to
    the key blocks that exist, a ragged last key block's full tiles made partial."""
    nkb = -(-length // block_n)
    rf, af, bf = full
    rp, ap, bp = part
    bf, bp = bf.clamp(max=nkb), bp.clamp(max=nkb)
    if length % block_n:
        cut = (bf == nkb) & (af < nkb)     # (a run past the last key block is empty once clipped)
        rp = torch.cat([rp, rf[cut]])
        ap = torch.cat([ap, torch.full_like(rf[cut], nkb - 1)])
        bp = torch.cat([bp, torch.full_like(rf[cut], nkb)])
        bf = torch.where(cut, nkb - 1, bf)
    fp, fr = _normalize(rf - lo, af, bf, hi - lo)
    pp, pr = _normalize(rp - lo, ap, bp, hi - lo)
    return fp, fr, pp, pr


def prefix_runs(schedule: dict[str, Any], length: int) -> dict[str, Any]:
    """The runs of the `length x length` problem (queries = keys) from those of the square
    max_len problem (module doc): the first query blocks (derived from the period where the
    schedule is periodic), runs clipped to the key blocks that exist, a ragged last key block's
    full tiles made partial."""
    bm, bn = int(schedule["block_m"]), int(schedule["block_n"])
    if not 0 < length <= int(schedule["length"]):
        raise ValueError(f"prefix_runs: length must be in 1..{int(schedule['length'])}, got {length}")
    nqb = -(-length // bm)
    fp, fr, pp, pr = clip_runs(schedule_rows(schedule, True, 0, nqb)[:3], schedule_rows(schedule, False, 0, nqb)[:3],
                               length, bn, 0, nqb)
    return {k: v for k, v in schedule.items() if k not in ("period_m", "period_n", "fixed")} | dict(
        length=length, full_ptr=fp, full_runs=fr, part_ptr=pp, part_runs=pr)


def expand_runs(ptr: torch.Tensor, runs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR (rowptr, cols) int32 of the key blocks that runs `[start, stop)` per row cover."""
    runs = runs.to(torch.int64).reshape(-1, 2)
    lengths = runs[:, 1] - runs[:, 0]
    cum = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=runs.device)
    cum[1:] = torch.cumsum(lengths, 0)
    rowptr = cum[ptr.to(torch.int64)]
    cols = torch.repeat_interleave(runs[:, 0], lengths) + _ranks(lengths)
    return rowptr.to(torch.int32), cols.to(torch.int32)


def tile_tensors(full_ptr: torch.Tensor, full_runs: torch.Tensor, part_ptr: torch.Tensor,
                 part_runs: torch.Tensor, device: Any) -> tuple[torch.Tensor, ...]:
    """(full_rowptr, full_cols, part_rowptr, part_cols, order) on `device`, the arguments the
    prefill kernel takes; `order` lists the query blocks with the most tiles first. An empty
    array becomes one placeholder element (never read)."""
    fr, fc = expand_runs(full_ptr.to(device), full_runs.to(device))
    pr, pc = expand_runs(part_ptr.to(device), part_runs.to(device))
    work = (fr[1:] - fr[:-1]) + (pr[1:] - pr[:-1])
    order = torch.argsort(-work.to(torch.int64), stable=True).to(torch.int32)
    return tuple(t.contiguous() if t.numel() else torch.zeros(1, dtype=torch.int32, device=device)
                 for t in (fr, fc, pr, pc, order))


# --- decode helpers -----------------------------------------------------------------------------


#: what a caller whose inputs require grad can do instead (these kernels have no backward pass)
NO_GRAD = ("run it under torch.no_grad() or pass detached tensors; for gradients use sas's "
           "SASAttnKernel(..., backend='torch')")
NO_GRAD_DYNAMIC = ("run it under torch.no_grad() or pass detached tensors (a pattern with a Dynamic component has "
                   "no differentiable backend)")


#: the head dims the Triton kernels are built for (sas.codegen.triton_backend.SUPPORTED_HEAD_DIMS)
SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)


def check_device(where: str, q: torch.Tensor) -> None:
    """Triton's kernels run on CUDA tensors, or on the CPU under its interpreter (TRITON_INTERPRET=1
    in the environment before triton is first imported); say so instead of Triton's driver error.
    Their head dim is one of SUPPORTED_HEAD_DIMS (any one: the package was compiled for one, but
    the kernels specialize on it at their first call)."""
    if q.device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError(f"{where}: q is on {q.device}; these Triton kernels run on CUDA tensors, or on the CPU "
                         f"with TRITON_INTERPRET=1 set in the environment before triton is imported")
    check_head_dim(where, q.shape[-1])


def check_head_dim(where: str, head_dim: int) -> None:
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"{where}: head_dim {head_dim} is not supported by these Triton kernels; supported: "
                         f"{', '.join(map(str, SUPPORTED_HEAD_DIMS))}")


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (4 elsewhere: the CPU interpreter)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


class HeldKeys:
    """For decode modules whose mask is table-driven (`HELD_KEYS`): the key each cache slot
    holds once key `position` is written (-1: empty), from the module's `cache_ids` over its
    MAX_LEN positions (such tables exist only for short max_len: sas's per-token fallback).

    The sorted (slot, key) codes live on the device of the query, copied there once; a step
    runs a searchsorted there and copies nothing from the host (`position` may be an int or
    a 0-d int64 tensor on that device)."""

    def __init__(self, decode_module: ModuleType):
        n, C = int(decode_module.MAX_LEN), max(1, int(decode_module.CACHE_SIZE))
        j = torch.arange(n, dtype=torch.int64)
        cid = decode_module.cache_ids(j).to(torch.int64)
        ok = cid >= 0
        self._codes = torch.sort(cid[ok] * n + j[ok]).values
        self._n, self._C = n, C
        self._on: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def _device(self, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
        key = str(device)
        hit = self._on.get(key)
        if hit is None:
            hit = self._on[key] = (self._codes.to(device), torch.arange(self._C, dtype=torch.int64, device=device))
        return hit

    def __call__(self, position: int | torch.Tensor, device: Any) -> torch.Tensor:
        n = self._n
        codes, slots = self._device(device)
        idx = torch.searchsorted(codes, slots * n + position, right=True) - 1
        got = codes[idx.clamp(min=0)] if codes.numel() else torch.full_like(slots, -1)
        held = torch.where((idx >= 0) & (got // n == slots), got % n, -1)
        return held.to(torch.int32)


# --- the one-call entry of compiled output ------------------------------------------------------


class StaticKernel:
    """Prefill and decode of a compiled static pattern: `prefill_module` (prefill.py),
    `decode_module` (decode.py; None for a pattern that is not causal) and the plan's stored
    `schedule` (plan.pt)."""

    def __init__(self, prefill_module: ModuleType, decode_module: ModuleType | None, schedule: dict[str, Any]):
        self.prefill_module = prefill_module
        self.decode_module = decode_module
        self.schedule = schedule
        self.max_len = int(schedule["max_len"])
        self._tiles: dict[tuple, tuple] = {}
        self._held = HeldKeys(decode_module) if decode_module is not None and decode_module.HELD_KEYS else None

    @property
    def cache_size(self) -> int:
        return int(self._decoder("cache_size").CACHE_SIZE)

    def wide(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None = None,
             lse: torch.Tensor | None = None) -> bool:
        """Whether this prefill takes the package's wide schedule (`plan.pt["prefill_wide"]`,
        written where the Gluon kernel's 128 x 128 tiles pay): where prefill.py's `gluon_ok`
        allows these tensors (Hopper, 16-bit, head dim 64 or 128; SAS_GLUON=0 turns it off)."""
        w = self.schedule.get("prefill_wide")
        return w is not None and bool(self.prefill_module.gluon_ok(q, k, v, int(w["block_m"]), int(w["block_n"]),
                                                                   out, lse))

    def tiles(self, q_len: int, k_len: int, device: Any, wide: bool = False) -> tuple[torch.Tensor, ...]:
        """Tile lists for queries at the last q_len of k_len positions (module doc); `wide`: of
        the wide schedule (`wide`)."""
        key = (q_len, k_len, str(device), wide)
        hit = self._tiles.get(key)
        if hit is None:
            p = self.schedule["prefill_wide" if wide else "prefill"]
            if q_len == k_len:
                r = prefix_runs(p, k_len)
                hit = tile_tensors(r["full_ptr"], r["full_runs"], r["part_ptr"], r["part_runs"], device)
            else:
                hit = self.prefill_module.build_tiles(q_len, k_len, block_m=int(p["block_m"]),
                                                      block_n=int(p["block_n"]), device=device)
            if len(self._tiles) >= 16:
                self._tiles.pop(next(iter(self._tiles)))
            self._tiles[key] = hit
        return hit

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, out: torch.Tensor | None = None,
                lse: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of q [B, Hq, Lq, D] over k, v [B, Hkv, Lk, D] (queries at the last Lq of the
        Lk <= MAX_LEN positions)."""
        check_qkv("prefill", q, k, v)
        check_device("prefill", q)
        check_no_grad("prefill", "triton", NO_GRAD, q=q, k=k, v=v)
        Lq, Lk = q.shape[2], k.shape[2]
        if not 0 < Lq <= Lk <= self.max_len:
            raise ValueError(f"prefill: need 0 < q length ({Lq}) <= k length ({Lk}) <= MAX_LEN ({self.max_len})")
        wide = self.wide(q, k, v, out, lse)
        p = self.schedule["prefill_wide" if wide else "prefill"]
        return self.prefill_module.prefill(q, k, v, *self.tiles(Lq, Lk, q.device, wide), out=out, lse=lse,
                                           block_m=int(p["block_m"]), block_n=int(p["block_n"]),
                                           num_warps=int(p["num_warps"]), num_stages=int(p["num_stages"]))

    def _decoder(self, where: str) -> ModuleType:
        if self.decode_module is None:
            raise ValueError(f"{where}: this pattern is not causal, so it has no decode cache (prefill only)")
        return self.decode_module

    def new_cache(self, batch: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype = torch.bfloat16,
                  device: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Zeroed compact caches (k, v), each [batch, num_kv_heads, CACHE_SIZE, head_dim]."""
        slots = max(1, int(self._decoder("new_cache").CACHE_SIZE))
        (batch, num_kv_heads, head_dim), device = check_new_cache("new_cache", batch, num_kv_heads, head_dim, dtype,
                                                                  device)
        check_head_dim("new_cache", head_dim)
        shape = (batch, num_kv_heads, slots, head_dim)
        return torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)

    def fill_cache(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        """Write a prompt's keys/values (positions 0..L-1) into the compact caches as token-by-token
        decoding would have left them."""
        mod = self._decoder("fill_cache")
        check_fill("fill_cache", k, v, k_cache, v_cache, max(1, int(mod.CACHE_SIZE)), self.max_len,
                   names=("k_cache", "v_cache"), new_cache="new_cache(...)")
        mod.fill_cache(k, v, k_cache, v_cache)

    def decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor, position: int, *, num_splits: int | None = None,
               out: torch.Tensor | None = None, pdl: bool | None = None) -> torch.Tensor:
        """One token at absolute `position` (q [B, Hq, 1, D]; k, v [B, Hkv, 1, D]); the caches are
        updated in place (the new key goes to slot cache_id_func(position)). `pdl`: launch as
        programmatic dependent launches (compute capability 9+); None: only where the step is one
        launch (the module's `pdl_by_default`)."""
        mod = self._decoder("decode")
        check_qkv("decode", q, k, v)
        check_one_token("decode", q, k)
        check_device("decode", q)
        check_no_grad("decode", "triton", NO_GRAD, q=q, k=k, v=v)
        check_cache("decode", k_cache, v_cache, k, max(1, int(mod.CACHE_SIZE)), names=("k_cache", "v_cache"),
                    new_cache="new_cache(...)")
        check_tensors("decode", q=q, k_cache=k_cache, v_cache=v_cache)     # their dtypes and devices
        position = check_position("decode", position, self.max_len, "compile the package with a larger --max-len")
        if num_splits is None:
            # (a package compiled before the query groups' rule has no GROUP_ONE_WAVE_FROM)
            group = {"group": q.shape[1] // k.shape[1]} if hasattr(mod, "GROUP_ONE_WAVE_FROM") else {}
            num_splits = mod.num_splits_for(q.shape[0], k.shape[1], num_sms=num_sms(q.device), **group)
        slot_keys = self._held(position, q.device) if self._held is not None else None
        return mod.decode(q, k, v, k_cache, v_cache, position, out=out, num_splits=num_splits, slot_keys=slot_keys,
                          pdl=pdl)


class DynamicKernel:
    """Prefill and decode of a compiled dynamic pattern (one sequence batch at a time): the
    prompt's prefill module, the static part's decode module (None without static slots), the
    generated dynamic kernels, their host module (dynamic_host.py) and the stored plan."""

    def __init__(self, prefill_module: ModuleType, static_module: ModuleType | None, kernels: ModuleType,
                 host: ModuleType, schedule: dict[str, Any]):
        self.prefill_module = prefill_module
        self.static_module = static_module
        self.kernels = kernels
        self.host = host
        self.schedule = schedule
        self.max_len = int(schedule["max_len"])
        self.runtime = self.Runtime()

    def Runtime(self) -> Any:  # noqa: N802 - reads as the class it makes
        """A fresh `dynamic_host.Runtime` (one sequence batch) over these kernels."""
        return self.host.Runtime(self.kernels, self.static_module, self.schedule["dynamic"])

    def tiles(self, length: int, device: Any) -> tuple[torch.Tensor, ...]:
        r = prefix_runs(self.schedule["prefill"], length)
        return tile_tensors(r["full_ptr"], r["full_runs"], r["part_ptr"], r["part_runs"], device)

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Start a sequence batch: the prompt's attention (exactly the pattern's mask), then the
        cache cut to the budget. q [B, Hq, P, D], k, v [B, Hkv, P, D], P <= MAX_LEN."""
        check_qkv("prefill", q, k, v)
        check_device("prefill", q)
        check_no_grad("prefill", "triton", NO_GRAD_DYNAMIC, q=q, k=k, v=v)
        P = q.shape[2]
        if not 0 < P <= self.max_len or k.shape[2] != P:
            raise ValueError(f"prefill: q and k/v must have the same length P in 1..{self.max_len}, got "
                             f"{P} and {k.shape[2]}")
        self.runtime = self.Runtime()
        return self.runtime.prefill(self.prefill_module, q, k, v, self.tiles(P, q.device))

    def decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """One token at the next position of the current sequence batch (q [B, Hq, 1, D], k, v
        [B, Hkv, 1, D] of the prompt's batch, heads and head dim)."""
        check_qkv("decode", q, k, v)
        check_one_token("decode", q, k)
        check_device("decode", q)
        check_no_grad("decode", "triton", NO_GRAD_DYNAMIC, q=q, k=k, v=v)
        st = self.runtime.state
        if st is not None:
            got = (q.shape[0], q.shape[1], k.shape[1], q.shape[3])
            if got != tuple(st.shape) or q.dtype != st.k.dtype or q.device != st.k.device:
                raise ValueError(f"decode: q, k, v must have the prompt's batch, query heads, kv heads and head dim "
                                 f"{tuple(st.shape)}, dtype {st.k.dtype} and device {st.k.device}; got {got}, "
                                 f"{q.dtype}, {q.device}")
        return self.runtime.decode(q, k, v)

    def held_keys(self) -> list[list[list[int]]]:
        return self.runtime.held_keys()


def load(package: str, directory: str | os.PathLike) -> StaticKernel | DynamicKernel:
    """The entry object of the compiled package `package` in `directory` (its __init__ calls this)."""
    directory = Path(directory)
    schedule = torch.load(directory / PLAN_FILE, map_location="cpu", weights_only=True)
    if int(schedule.get("format", 0)) != FORMAT:
        raise ValueError(f"{directory / PLAN_FILE}: format {schedule.get('format')!r}, this loader reads {FORMAT}")

    def sub(name: str) -> ModuleType:
        return importlib.import_module(f"{package}.{name}")

    if schedule["kind"] == "dynamic":
        static = sub("static_decode") if schedule["static_slots"] else None
        return DynamicKernel(sub("prefill"), static, sub("dynamic_decode"), sub("dynamic_host"), schedule)
    return StaticKernel(sub("prefill"), sub("decode") if schedule["causal"] else None, schedule)


__all__ = ["DynamicKernel", "HeldKeys", "PLAN_FILE", "StaticKernel", "expand_runs", "load", "num_sms",
           "prefix_runs", "tile_tensors"]
