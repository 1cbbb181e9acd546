"""Prefill tile lists on a device: the CSR arrays of `sas.ir.tiles.tile_map` as the int32
tensors the prefill kernels take."""

from __future__ import annotations

import torch

from sas.ir.tiles import tile_map
from sas.lang.pattern import Pattern


def tile_tensors(pattern: Pattern, q_len: int, k_len: int, block_m: int, block_n: int,
                 device: torch.device) -> tuple[torch.Tensor, ...]:
    """(full_rowptr, full_cols, part_rowptr, part_cols, order) for queries at the last `q_len`
    of `k_len` positions; an empty array becomes one placeholder element (never read)."""
    tm = tile_map(pattern, q_len, k_len, block_m, block_n, k_len - q_len)
    arrays = (tm.full_rowptr, tm.full_cols, tm.part_rowptr, tm.part_cols, tm.block_order())
    return tuple(torch.from_numpy(a.copy()).to(device) if a.size
                 else torch.zeros(1, dtype=torch.int32, device=device) for a in arrays)


__all__ = ["tile_tensors"]
