"""Tile schedules as runs (sas.ir.tile_runs): the coarse-to-fine classification equals the dense
`tile_map` exactly, a prefix of a max_len schedule is a valid schedule of the shorter problem
(checked cell by cell against the oracle), and long lengths stay small in memory; the schedule
and `classify_boxes` also equal the classes of the cells themselves."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sas import Causal, Diag, Rect
from sas.errors import KernelError
from sas.ir.tile_runs import TileRuns, tile_runs
import sas.ir.tiles as tiles
from sas.ir.tiles import classify_boxes, tile_map
from helpers.table1 import TABLE1_KERNELS
from strategies import causal_patterns, patterns

TABLE1 = TABLE1_KERNELS


def same(runs: TileRuns, pattern, q_len, k_len, bm, bn, q_offset) -> None:
    want = tile_map(pattern, q_len, k_len, bm, bn, q_offset)
    got = runs.to_tile_map()
    for name in ("full_rowptr", "full_cols", "part_rowptr", "part_cols"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    assert runs.counts() == want.counts()


def check_valid(tm, pattern, length) -> None:
    """Every tile holding an on-cell is listed; a listed full tile is all on and in bounds."""
    mask = pattern.to_mask(length)
    bm, bn = tm.block_m, tm.block_n
    listed = np.zeros((tm.num_q_blocks, tm.num_k_blocks), dtype=np.int8)
    for m in range(tm.num_q_blocks):
        listed[m, tm.full_cols[tm.full_rowptr[m]:tm.full_rowptr[m + 1]]] = 1
        listed[m, tm.part_cols[tm.part_rowptr[m]:tm.part_rowptr[m + 1]]] = 2
    for m in range(tm.num_q_blocks):
        for n in range(tm.num_k_blocks):
            cells = mask[m * bm:(m + 1) * bm, n * bn:(n + 1) * bn]
            if cells.any():
                assert listed[m, n], (m, n)
            if listed[m, n] == 1:
                assert cells.all() and (n + 1) * bn <= length, (m, n)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=patterns(3), q_len=st.integers(1, 70), extra=st.integers(0, 30),
       bm=st.sampled_from([1, 2, 4, 8]), bn=st.sampled_from([1, 3, 4, 8]), max_boxes=st.sampled_from([4, 16, 64]))
def test_coarse_to_fine_equals_dense(p, q_len, extra, bm, bn, max_boxes):
    # small max_boxes forces several bands and levels of splitting
    runs = tile_runs(p, q_len, q_len + extra, bm, bn, max_boxes=max_boxes)
    same(runs, p, q_len, q_len + extra, bm, bn, extra)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=causal_patterns(3), n=st.integers(1, 60), bm=st.sampled_from([2, 4, 8]), bn=st.sampled_from([2, 4]),
       q_offset=st.integers(0, 20))
def test_offsets_equal_dense(p, n, bm, bn, q_offset):
    runs = tile_runs(p, n, q_offset + n, bm, bn, q_offset, max_boxes=8)
    same(runs, p, n, q_offset + n, bm, bn, q_offset)


@pytest.mark.parametrize("name", list(TABLE1))
def test_table1_equal_dense(name):
    p = TABLE1[name]
    for n, bm, bn in ((256, 16, 16), (300, 32, 16), (1000, 64, 32)):
        same(tile_runs(p, n, n, bm, bn, max_boxes=64), p, n, n, bm, bn, 0)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=causal_patterns(3), n=st.integers(1, 80), frac=st.floats(0.0, 1.0), bm=st.sampled_from([4, 8, 16]),
       bn=st.sampled_from([4, 8, 16]))
def test_prefix_is_a_valid_schedule(p, n, frac, bm, bn):
    length = max(1, int(round(frac * n)))
    pre = tile_runs(p, n, n, bm, bn).prefix(length)
    assert (pre.q_len, pre.k_len, pre.q_offset) == (length, length, 0)
    check_valid(pre.to_tile_map(), p, length)
    # a tile called full at the shorter length is full there too (the exact schedule agrees)
    got = pre.to_tile_map().classes()
    assert not ((got == 1) & (tile_map(p, length, length, bm, bn, 0).classes() != 1)).any()


def test_prefix_of_a_multiple_is_exact():
    p = TABLE1["streaming_llm"]
    long = tile_runs(p, 512, 512, 32, 16)
    same(long.prefix(256), p, 256, 256, 32, 16, 0)
    same(long.prefix(512), p, 512, 512, 32, 16, 0)


def test_prefix_errors():
    runs = tile_runs(TABLE1["sliding_window"], 64, 64, 16, 16)
    with pytest.raises(KernelError, match="length"):
        runs.prefix(65)
    with pytest.raises(KernelError, match="length"):
        runs.prefix(0)
    with pytest.raises(KernelError, match="square"):
        tile_runs(TABLE1["sliding_window"], 32, 64, 16, 16).prefix(16)


def test_million_tokens_stay_small():
    """Streaming at 1M tokens with 64 x 64 tiles: 2^28 tiles, but a few runs per query block."""
    p = (Diag(0, 1024) + Rect(cols=(0, 32))) * Causal()
    n = 1 << 20
    runs = tile_runs(p, n, n, 64, 64)
    assert runs.num_q_blocks == n // 64
    c = runs.counts()
    assert c["total"] == (n // 64) ** 2
    # per query block: the sink tile and 16-17 window tiles
    assert 16 * (n // 64) < c["full"] + c["partial"] < 19 * (n // 64)
    assert runs.nbytes < 48 * (n // 64)           # 4 runs of 8 bytes and 2 pointers per block
    # spot-check a late query block against the oracle
    m = n // 64 - 3
    rows = np.arange(m * 64, (m + 1) * 64)[:, None]
    on_blocks = set()
    for blk in range(n // 64):
        cols = np.arange(blk * 64, (blk + 1) * 64)[None, :]
        if blk in (0,) or abs(blk - m) <= 17:
            if np.asarray(p.evaluate(rows, cols)).any():
                on_blocks.add(blk)
    tm_cols = set()
    for a, b in runs.full_runs[runs.full_ptr[m]:runs.full_ptr[m + 1]]:
        tm_cols |= set(range(a, b))
    for a, b in runs.part_runs[runs.part_ptr[m]:runs.part_ptr[m + 1]]:
        tm_cols |= set(range(a, b))
    assert tm_cols == on_blocks


def dense_classes(pattern, q_len, k_len, bm, bn, q_offset) -> np.ndarray:
    """EMPTY / FULL / PARTIAL of every tile from the cells themselves (no interval pass)."""
    rows = np.arange(q_offset, q_offset + q_len)[:, None]
    on = np.asarray(pattern.evaluate(rows, np.arange(k_len)[None, :]), dtype=bool)
    on = np.broadcast_to(on, (q_len, k_len))
    nqb, nkb = -(-q_len // bm), -(-k_len // bn)
    out = np.zeros((nqb, nkb), dtype=np.int8)
    for m in range(nqb):
        for n in range(nkb):
            cells = on[m * bm:(m + 1) * bm, n * bn:(n + 1) * bn]
            full = cells.all() and (n + 1) * bn <= k_len   # a ragged last key block is never full
            out[m, n] = 1 if full else 2 if cells.any() else 0
    return out


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=patterns(3), q_len=st.integers(1, 90), extra=st.integers(0, 40), bm=st.sampled_from([5, 8, 16, 23]),
       bn=st.sampled_from([3, 8, 16, 31]), max_boxes=st.sampled_from([2, 16, 1 << 20]),
       max_cells=st.sampled_from([1, 64, 1 << 22]), probe=st.sampled_from([0, 1, 256]))
def test_large_tiles_equal_cells(p, q_len, extra, bm, bn, max_boxes, max_cells, probe):
    """Against the cells themselves, not `tile_map` (which shares `classify_boxes`): the
    whole-matrix quadtree and the sub-box refinement of UNKNOWN tiles (tiles of up to 23 x 31
    cells, split 4 x 4 down to a few cells) give the classes of the cells; small max_boxes /
    max_cells force the stack and the chunks, a small probe both ways of settling the rest."""
    saved, tiles._PROBE = tiles._PROBE, probe
    try:
        check_large_tiles(p, q_len, extra, bm, bn, max_boxes, max_cells)
    finally:
        tiles._PROBE = saved


def check_large_tiles(p, q_len, extra, bm, bn, max_boxes, max_cells):
    k_len = q_len + extra
    runs = tile_runs(p, q_len, k_len, bm, bn, max_boxes=max_boxes)
    want = dense_classes(p, q_len, k_len, bm, bn, extra)
    np.testing.assert_array_equal(runs.to_tile_map().classes(), want)
    nqb, nkb = want.shape
    m = np.arange(nqb)[:, None]
    n = np.arange(nkb)[None, :]
    r0 = np.broadcast_to(extra + m * bm, want.shape)
    r1 = np.broadcast_to(extra + np.minimum((m + 1) * bm, q_len) - 1, want.shape)
    c0 = np.broadcast_to(n * bn, want.shape)
    c1 = np.broadcast_to(np.minimum((n + 1) * bn, k_len) - 1, want.shape)
    got = classify_boxes(p.restrict(k_len), r0, r1, c0, c1, max_cells=max_cells)
    if k_len % bn:
        got[:, -1] = np.where(got[:, -1] == 1, 2, got[:, -1])
    np.testing.assert_array_equal(got, want)


def test_prefix_at_a_ragged_length_lists_a_tile_once():
    """A band 127 keys right of the diagonal: the last query block's full runs past the last key
    block are dropped at a ragged length, not turned into a second partial tile (found by review)."""
    p = Diag(-127, 128)
    pre = tile_runs(p, 4096, 4096, 64, 64).prefix(1000)
    tm = pre.to_tile_map()
    check_valid(tm, p, 1000)
    run_tiles = int((pre.full_runs[:, 1] - pre.full_runs[:, 0]).sum() + (pre.part_runs[:, 1] - pre.part_runs[:, 0]).sum())
    assert run_tiles == int((tm.classes() != 0).sum())
