"""Prefill tile lists on a device: the runs of a `sas.ir.tile_runs.TileRuns` schedule expanded
to the int32 CSR tensors the prefill kernels take (by `sas.runtime.standalone.tile_tensors`,
the code compiled output runs too), and the square schedule `sas compile` stores: explicit
runs, or the first query blocks and a period (`sas.ir.tile_period`), with its tile counts."""

from __future__ import annotations

from typing import Any

import torch

from sas.ir.tile_period import TilePeriod
from sas.ir.tile_runs import TileRuns
from sas.runtime import standalone


def runs_tensors(runs: TileRuns, device: Any) -> tuple[torch.Tensor, ...]:
    """(full_rowptr, full_cols, part_rowptr, part_cols, order) of `runs` on `device`; an empty
    array becomes one placeholder element (never read)."""
    arrays = (runs.full_ptr, runs.full_runs, runs.part_ptr, runs.part_runs)
    return standalone.tile_tensors(*(torch.from_numpy(a.copy()) for a in arrays), device)


def schedule_tensors(runs: TileRuns | TilePeriod, length: int | None = None) -> dict[str, Any]:
    """The square schedule as the dict of CPU tensors `standalone.prefix_runs` reads (what `sas
    compile` stores in plan.pt): explicit runs of the `length x length` problem (`TileRuns`,
    length: its own), or the first query blocks of the unbounded one with the period that
    derives the rest (`TilePeriod`, for `length`)."""
    base = runs.base if isinstance(runs, TilePeriod) else runs
    if isinstance(runs, TilePeriod):
        if length is None:
            raise ValueError("schedule_tensors: a TilePeriod needs the length it stands for")
        extra = {"period_m": runs.period_m, "period_n": runs.period_n, "fixed": runs.fixed}
    else:
        length, extra = runs.k_len, {}
    return {"length": int(length), "block_m": base.block_m, "block_n": base.block_n,
            "full_ptr": torch.from_numpy(base.full_ptr.copy()), "full_runs": torch.from_numpy(base.full_runs.copy()),
            "part_ptr": torch.from_numpy(base.part_ptr.copy()), "part_runs": torch.from_numpy(base.part_runs.copy()),
            **extra}


def period_runs(period: TilePeriod, length: int) -> TileRuns:
    """The `length x length` schedule that `period` derives (`standalone.prefix_runs`, the code a
    compiled package runs), as `TileRuns`."""
    r = standalone.prefix_runs(schedule_tensors(period, length), length)
    return TileRuns(length, length, 0, period.block_m, period.block_n,
                    *(r[k].numpy() for k in ("full_ptr", "full_runs", "part_ptr", "part_runs")))


def _tiles(ptr: torch.Tensor, runs: torch.Tensor) -> int:
    return int((runs[:int(ptr[-1]), 1].to(torch.int64) - runs[:int(ptr[-1]), 0]).sum()) if ptr.numel() > 1 else 0


def _exact_counts(schedule: dict[str, Any], length: int, lo: int, hi: int) -> tuple[int, int]:
    """Full and partial tiles of query blocks lo .. hi - 1 at `length`: the runs clipped, the
    repeated band's copies (which never reach the last key block) counted without listing them."""
    if hi <= lo:
        return 0, 0
    *full, skip_f = standalone.schedule_rows(schedule, True, lo, hi, copies=False)
    *part, skip_p = standalone.schedule_rows(schedule, False, lo, hi, copies=False)
    fp, fr, pp, pr = standalone.clip_runs(tuple(full), tuple(part), length, int(schedule["block_n"]), lo, hi)
    return _tiles(fp, fr) + skip_f, _tiles(pp, pr) + skip_p


def _row_pieces(schedule: dict[str, Any], full: bool) -> tuple[torch.Tensor, ...]:
    """Per row r of the last stored period: its tiles below `fixed`, in the band and from the
    band on (`sas.runtime.standalone._period_rows`), and the end of its last run."""
    pm, pn, fixed = int(schedule["period_m"]), int(schedule["period_n"]), int(schedule["fixed"])
    ptr, runs = (schedule["full_ptr"], schedule["full_runs"]) if full else (schedule["part_ptr"], schedule["part_runs"])
    stored = ptr.numel() - 1
    rows, a, b, _ = standalone.schedule_rows(schedule, full, stored - pm, stored)
    rows = rows - (stored - pm)

    def per_row(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(pm, dtype=torch.int64).index_add_(0, rows, x.clamp(min=0))

    end = torch.zeros(pm, dtype=torch.int64).scatter_reduce_(0, rows, b, "amax")
    return (per_row(b.clamp(max=fixed) - a), per_row(b.clamp(max=fixed) - a.clamp(min=fixed - pn)),
            per_row(b - a.clamp(min=fixed - pn)), end)


def schedule_counts(schedule: dict[str, Any], length: int | None = None) -> dict[str, int]:
    """Full, partial, empty and total tiles of the `length x length` problem (default: the
    schedule's own length), counted without listing the runs of a periodic schedule: the
    stored rows and the last rows (those that reach the last key block) exactly, the rows
    between in closed form (query block m of the period's row r repeats r's band k - 1 times and
    keeps its other tiles, k = (m - r) / period_m)."""
    length = int(schedule["length"]) if length is None else int(length)
    bm, bn = int(schedule["block_m"]), int(schedule["block_n"])
    nqb, nkb = -(-length // bm), -(-length // bn)
    stored = schedule["full_ptr"].numel() - 1
    if "period_m" not in schedule or nqb <= stored:
        full, part = _exact_counts(schedule, length, 0, nqb)
        return {"full": full, "partial": part, "empty": nqb * nkb - full - part, "total": nqb * nkb}
    pm, pn, fixed = int(schedule["period_m"]), int(schedule["period_n"]), int(schedule["fixed"])
    af, bf, cf, ef = _row_pieces(schedule, True)
    ap, bp, cp, ep = _row_pieces(schedule, False)
    # row m = stored + t + s * period_m (k = s + 1) ends by key block max(fixed, end_t + k * period_n);
    # it is counted in closed form while that stays below the last key block
    t = torch.arange(pm, dtype=torch.int64)
    end = torch.maximum(ef, ep)
    inside = torch.div(nkb - 1 - end, pn, rounding_mode="floor").clamp(min=0)    # k <= inside
    inside = torch.where(torch.tensor(fixed) <= nkb - 1, inside, torch.zeros_like(inside))
    rows_t = torch.div(nqb - stored - t + pm - 1, pm, rounding_mode="floor").clamp(min=0)   # rows m < nqb
    first_edge = int((stored + t + torch.minimum(inside, rows_t) * pm).min())
    s = torch.div(first_edge - stored - t + pm - 1, pm, rounding_mode="floor").clamp(min=0)  # rows m < first_edge
    full = int((s * (af + cf) + bf * s * (s - 1) // 2).sum())
    part = int((s * (ap + cp) + bp * s * (s - 1) // 2).sum())
    for lo, hi in ((0, stored), (first_edge, nqb)):
        f, p = _exact_counts(schedule, length, lo, hi)
        full, part = full + f, part + p
    return {"full": full, "partial": part, "empty": nqb * nkb - full - part, "total": nqb * nkb}


__all__ = ["period_runs", "runs_tensors", "schedule_counts", "schedule_tensors"]
