"""The square prefill schedule from its first query blocks and a period (sas.ir.tile_period):
every length it derives equals the classification of that length (`tile_runs`) where the
length is whole tiles and is a valid schedule of it otherwise (checked cell by cell against
`pattern.to_mask`), its tile counts in closed form equal the counts of the runs listed, and a
compiled package of a 1K-slot pattern at max_len 2^30 stays small and fast."""

from __future__ import annotations

import json
import time
import tracemalloc

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sas import Causal, Diag, Rect
from sas.codegen.compile import compile_pattern
from sas.ir.tile_period import right_bound, tile_period
from sas.ir.tile_runs import TileRuns, tile_runs
from sas.ir.tiles import TileMap, tile_map
from sas.runtime.standalone import prefix_runs
from sas.runtime.tiles import schedule_counts, schedule_tensors
from helpers.attention import DEV
from helpers.table1 import TABLE1_KERNELS
from strategies import causal_patterns, patterns

CHUNKED = (Rect(size=(96, 96)) >> Diag(0, 1)) * Causal()
STREAMING = (Diag(0, 100) + Rect(cols=(0, 5))) * Causal()
BAND = Diag(-20, 41)              # 20 keys either side: not causal, bounded right of the diagonal


def listed(schedule: dict, length: int) -> TileMap:
    r = prefix_runs(schedule, length)
    arrays = [a.numpy() for a in (r["full_ptr"], r["full_runs"], r["part_ptr"], r["part_runs"])]
    return TileRuns(length, length, 0, int(r["block_m"]), int(r["block_n"]), *arrays).to_tile_map()


def check_valid(tm: TileMap, pattern, length: int) -> None:
    """Every tile holding an on-cell is listed; a listed full tile is all on and in bounds."""
    mask = pattern.to_mask(length)
    got = tm.classes()
    bm, bn = tm.block_m, tm.block_n
    for m in range(tm.num_q_blocks):
        for n in range(tm.num_k_blocks):
            cells = mask[m * bm:(m + 1) * bm, n * bn:(n + 1) * bn]
            if cells.any():
                assert got[m, n] != 0, (m, n)
            if got[m, n] == 1:
                assert cells.all() and (n + 1) * bn <= length, (m, n)


def check_lengths(p, n: int, bm: int, bn: int, lengths) -> None:
    period = tile_period(p, n, bm, bn)
    assert period is not None
    sched = schedule_tensors(period, n)
    for length in lengths:
        got = listed(sched, length)
        want = tile_map(p, length, length, bm, bn, 0)
        if length % bm == 0 and length % bn == 0:
            np.testing.assert_array_equal(got.classes(), want.classes(), err_msg=f"length {length}")
        else:
            check_valid(got, p, length)
            # the derived schedule never calls full what the exact one does not
            assert not ((got.classes() == 1) & (want.classes() != 1)).any()
        # every tile listed once: the runs' lengths add up to the tiles they cover
        r = prefix_runs(sched, length)
        run_tiles = sum(int((r[x][:, 1] - r[x][:, 0]).sum()) for x in ("full_runs", "part_runs"))
        assert run_tiles == int((got.classes() != 0).sum()), length
        c = schedule_counts(sched, length)
        cls = got.classes()
        assert c == {"full": int((cls == 1).sum()), "partial": int((cls == 2).sum()),
                     "empty": int((cls == 0).sum()), "total": cls.size}, length


@pytest.mark.parametrize("name", list(TABLE1_KERNELS))
def test_table1_periods(name):
    p = TABLE1_KERNELS[name]
    for bm, bn in ((64, 64), (128, 64), (64, 32)):
        period = tile_period(p, 1 << 16, bm, bn)
        assert period is not None, (name, bm, bn)
        assert period.rows * bm <= 4096, (name, bm, bn, period.rows)
    check_lengths(p, 1 << 13, 32, 16, (32 * 50, 4096, 5000, 8192))


@pytest.mark.parametrize("p", [CHUNKED, STREAMING, BAND, Causal(), Diag(0, 1, stride=3) * Causal(),
                               Rect(size=(8, 8), stride=(24, 24)) >> Diag(0, 2),
                               Rect(size=(16, 16)) >> Diag(0, 1)])   # its rows end in full tiles
def test_hand_picked_lengths(p):
    check_lengths(p, 2000, 16, 8, (16, 208, 400, 800, 803, 1000, 1337, 2000))


def test_ragged_lengths_list_a_tile_once():
    """A band reaching 127 keys right of the diagonal: at a ragged length the last query block's
    full runs past the last key block are empty once clipped, not made partial a second time
    (they listed tile 15 twice, and Plan.schedule's runs gave SASAttnKernel.prefill an error of
    0.15 at 200 tokens; found by review)."""
    check_lengths(Diag(-127, 128), 4096, 64, 64, (1000, 999, 1024))
    check_lengths(Diag(-100, 140), 1024, 64, 32, (200, 1000))


@pytest.mark.parametrize("p", [Diag(-100, 140), Rect(rows=(0, 3)) + Rect(cols=(0, 3)) + Diag(-30, 61)],
                         ids=["band", "global+band"])
def test_prefill_over_a_derived_ragged_schedule_equals_dense(p):
    import math

    from sas.runtime import SASAttnKernel

    n = 200
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, 16) for _ in range(3))
    out = SASAttnKernel(p, max_len=1024).prefill(q.to(DEV), k.to(DEV), v.to(DEV)).float().cpu()
    s = (q @ k.transpose(-1, -2) / math.sqrt(16)).masked_fill(~torch.from_numpy(p.to_mask(n)), float("-inf"))
    torch.testing.assert_close(out, torch.softmax(s, -1) @ v, rtol=1e-4, atol=1e-4)


def test_no_period_where_cells_run_right():
    # every row attending every key: no bound right of the diagonal past the boundary, no period
    assert right_bound(Rect()) is None and tile_period(Rect(), 1 << 20, 64, 64) is None
    assert right_bound(Causal()) == 1
    assert right_bound(BAND) == 21
    # the first rows reach the length: the explicit schedule is no larger
    assert tile_period(CHUNKED, 96 * 2, 16, 16) is None
    # early rows whose far tiles alternate (every third key, one-key tiles): no finite runs
    strided_rows = Rect(rows=(0, 2)) * Rect(stride=(1, 3)) + Causal()
    assert tile_period(strided_rows, 1 << 20, 1, 1) is None
    assert tile_period(strided_rows, 1 << 20, 4, 3) is not None     # one partial tile every 3 keys


GLOBAL = [Rect(rows=(0, 4)) + Causal(),                                  # global rows (prefix tokens)
          Rect(rows=(0, 3)) + Rect(cols=(0, 3)) + Diag(-8, 17),          # Longformer: global + both-sided window
          Rect(rows=(0, 2)) * Rect(stride=(1, 3)) + Causal()]            # strided global rows


@pytest.mark.parametrize("p", GLOBAL)
def test_rows_open_to_the_end(p):
    """Early rows attending every later key (global tokens) store runs open to the end: the
    schedule of any length from a few rows (before: classified row by row, plan.pt growing with
    max_len, `sas compile` at 2^30 refused)."""
    for bm, bn in ((16, 8), (4, 3)):
        check_lengths(p, 2000, bm, bn, (16, 100, 203, 1000, 1337, 2000))
    period = tile_period(p, 1 << 30, 64, 64)
    assert period is not None and period.rows <= 8
    c = schedule_counts(schedule_tensors(period, 1 << 30))
    assert c["total"] == (1 << 24) ** 2


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=st.one_of(causal_patterns(3), patterns(3)), bm=st.sampled_from([1, 2, 4, 8]),
       bn=st.sampled_from([1, 2, 3, 4, 8]), n=st.integers(100, 400), data=st.data())
def test_random_compositions(p, bm, bn, n, data):
    period = tile_period(p, n, bm, bn)
    assume(period is not None)
    lengths = data.draw(st.lists(st.integers(1, n), min_size=1, max_size=3))
    check_lengths(p, n, bm, bn, lengths + [n])


def test_causal_counts_at_a_billion():
    """Causal() at 2^30 with 64 x 64 tiles: q_blocks (q_blocks - 1) / 2 full and q_blocks
    partial tiles, counted without listing 2^24 rows."""
    n, b = 1 << 30, 64
    sched = schedule_tensors(tile_period(Causal(), n, b, b), n)
    nqb = n // b
    assert sched["full_ptr"].numel() - 1 <= 4
    assert schedule_counts(sched) == {"full": nqb * (nqb - 1) // 2, "partial": nqb, "empty": nqb * nqb - nqb * (nqb + 1) // 2,
                                      "total": nqb * nqb}
    m = n - 100                      # a ragged length: the diagonal's tiles stay partial
    q = -(-m // b)
    assert schedule_counts(sched, m) == {"full": q * (q - 1) // 2, "partial": q, "empty": q * q - q * (q + 1) // 2,
                                         "total": q * q}


def test_compile_a_billion_tokens(tmp_path):
    """`sas compile` of a 1024-slot sliding window at max_len 2^30: the plan file holds a few
    rows of runs, made in well under a second of tile work and little memory; the package's
    prefill schedule of a short prompt equals the exact one."""
    p = TABLE1_KERNELS["sliding_window"]
    tracemalloc.start()
    t0 = time.perf_counter()
    report = compile_pattern(p, tmp_path / "k", max_len=1 << 30, head_dim=64)
    took = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    pre = report["prefill"]
    assert pre["schedule_rows"] < 64 and pre["plan_file_bytes"] < 64 << 10
    assert peak < 256 << 20, peak
    assert took < 60, took
    nqb = (1 << 30) // pre["block_m"]
    assert pre["tiles"]["total"] == nqb * ((1 << 30) // pre["block_n"])
    assert json.loads((tmp_path / "k" / "report.json").read_text())["prefill"]["tiles"] == pre["tiles"]
    sched = torch.load(tmp_path / "k" / "plan.pt", weights_only=True)["prefill"]
    for length in (4096, 5000):
        got = listed(sched, length).classes()
        want = tile_map(p, length, length, pre["block_m"], pre["block_n"], 0).classes()
        if length % pre["block_m"] == 0:
            np.testing.assert_array_equal(got, want)
        else:
            assert ((got != 0) == (want != 0)).all()


@pytest.mark.parametrize("name", list(TABLE1_KERNELS))
def test_launch_choice_counts_exactly(name):
    """Past 256 query blocks `tiles_per_block` counts a square problem's tiles from the period
    (OpenAI-strided at 16M took 53 s to sample, as every row has a tile every other key block):
    the exact mean of the classified schedule."""
    from sas.codegen.triton_backend import tiles_per_block

    p, n = TABLE1_KERNELS[name], 1 << 15
    for bm, bn in ((64, 64), (64, 32), (128, 128)):
        c = tile_runs(p, n, n, bm, bn).counts()
        assert tiles_per_block(p, n, n, bm, bn) == (c["full"] + c["partial"]) / (n // bm)
