"""Prefill tile lists on a device: the runs of a `sas.ir.tile_runs.TileRuns` schedule expanded
to the int32 CSR tensors the prefill kernels take (by `sas.runtime.standalone.tile_tensors`,
the code compiled output runs too)."""

from __future__ import annotations

from typing import Any

import torch

from sas.ir.tile_runs import TileRuns
from sas.runtime import standalone


def runs_tensors(runs: TileRuns, device: Any) -> tuple[torch.Tensor, ...]:
    """(full_rowptr, full_cols, part_rowptr, part_cols, order) of `runs` on `device`; an empty
    array becomes one placeholder element (never read)."""
    arrays = (runs.full_ptr, runs.full_runs, runs.part_ptr, runs.part_runs)
    return standalone.tile_tensors(*(torch.from_numpy(a.copy()) for a in arrays), device)


def schedule_tensors(runs: TileRuns) -> dict[str, Any]:
    """The runs as the dict of CPU tensors `standalone.prefix_runs` reads (what `sas compile`
    stores in plan.pt for the square max_len problem)."""
    return {"length": runs.k_len, "block_m": runs.block_m, "block_n": runs.block_n,
            "full_ptr": torch.from_numpy(runs.full_ptr.copy()), "full_runs": torch.from_numpy(runs.full_runs.copy()),
            "part_ptr": torch.from_numpy(runs.part_ptr.copy()), "part_runs": torch.from_numpy(runs.part_runs.copy())}


__all__ = ["runs_tensors", "schedule_tensors"]
