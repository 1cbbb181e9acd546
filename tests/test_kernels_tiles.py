"""Block-sparse tile maps (sas.ir.tiles) against the exact oracle `to_mask`."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sas import Causal, Diag, Rect
from sas.errors import PatternError
from sas.ir.tiles import EMPTY, FULL, PARTIAL, UNKNOWN, classify_tiles, is_causal, tile_map

from helpers.examples import TABLE1_NAMES, example_pattern
from helpers.table1 import TABLE1_KERNELS
from strategies import causal_patterns, patterns


def expected_classes(pattern, q_len, k_len, bm, bn, q_offset):
    mask = pattern.to_mask(q_offset + q_len)[q_offset:, :k_len] if q_offset + q_len >= k_len else \
        pattern.to_mask(k_len)[q_offset:q_offset + q_len, :k_len]
    nqb, nkb = -(-q_len // bm), -(-k_len // bn)
    out = np.zeros((nqb, nkb), dtype=np.int8)
    for m in range(nqb):
        for n in range(nkb):
            t = mask[m * bm:(m + 1) * bm, n * bn:(n + 1) * bn]
            if not t.any():
                out[m, n] = EMPTY
            elif t.all() and (n + 1) * bn <= k_len:
                out[m, n] = FULL
            else:
                out[m, n] = PARTIAL
    return out


def check(pattern, q_len, k_len, bm, bn, q_offset=None):
    if q_offset is None:
        q_offset = k_len - q_len
    got = classify_tiles(pattern, q_len, k_len, bm, bn, q_offset)
    want = expected_classes(pattern, q_len, k_len, bm, bn, q_offset)
    assert got.shape == want.shape
    bad = np.argwhere(got != want)
    assert not len(bad), f"{pattern!r}: tile {bad[0]} got {got[tuple(bad[0])]}, want {want[tuple(bad[0])]}"
    tm = tile_map(pattern, q_len, k_len, bm, bn, q_offset)
    np.testing.assert_array_equal(tm.classes(), want)
    return tm


@pytest.mark.parametrize("name", list(TABLE1_KERNELS))
@pytest.mark.parametrize("shape", [(128, 128, 32, 16), (100, 100, 16, 16), (37, 100, 16, 8), (96, 96, 64, 32)])
def test_table1_patterns_exact(name, shape):
    check(TABLE1_KERNELS[name], *shape)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=patterns(3), q_len=st.integers(1, 70), extra=st.integers(0, 30),
       bm=st.sampled_from([1, 2, 4, 8, 16]), bn=st.sampled_from([1, 3, 4, 8, 16]))
def test_random_patterns_exact(p, q_len, extra, bm, bn):
    check(p, q_len, q_len + extra, bm, bn)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=causal_patterns(3), n=st.integers(1, 80), bm=st.sampled_from([4, 8, 16]), bn=st.sampled_from([4, 8]),
       q_offset=st.integers(0, 20))
def test_random_offsets_exact(p, n, bm, bn, q_offset):
    # queries at positions q_offset .. q_offset + n - 1 against k_len keys (not a suffix)
    k_len = q_offset + n
    check(p, n, k_len, bm, bn, q_offset)


def test_csr_structure():
    p = TABLE1_KERNELS["streaming_llm"]
    tm = check(p, 128, 128, 32, 16)
    assert tm.full_rowptr.dtype == np.int32 and tm.part_cols.dtype == np.int32
    assert tm.num_q_blocks == 4 and tm.num_k_blocks == 8
    c = tm.counts()
    assert c["full"] + c["partial"] + c["empty"] == c["total"] == 32
    order = tm.block_order()
    assert sorted(order.tolist()) == [0, 1, 2, 3]
    work = np.diff(tm.full_rowptr) + np.diff(tm.part_rowptr)
    assert list(work[order]) == sorted(work, reverse=True)
    for m in range(tm.num_q_blocks):
        cols = tm.full_cols[tm.full_rowptr[m]:tm.full_rowptr[m + 1]]
        assert list(cols) == sorted(cols)


def test_uneven_last_column_never_full():
    # every cell on: only the clipped last column block is partial
    tm = check(Rect(), 40, 40, 16, 16)
    cls = tm.classes()
    assert (cls[:, :2] == FULL).all() and (cls[:, 2] == PARTIAL).all()


def test_unknown_only_internal():
    cls = classify_tiles(Diag(0, 5) + Diag(5, None), 64, 64, 16, 16)
    assert not (cls == UNKNOWN).any()
    np.testing.assert_array_equal(cls, classify_tiles(Causal(), 64, 64, 16, 16))


def test_argument_errors():
    with pytest.raises(PatternError, match="q_len"):
        tile_map(Causal(), 0)
    with pytest.raises(PatternError, match="block_n"):
        tile_map(Causal(), 16, 16, 16, 0)
    with pytest.raises(PatternError, match="q_offset"):
        tile_map(Causal(), 16, 16, 16, 16, q_offset=-1)


def test_is_causal():
    for name, p in TABLE1_KERNELS.items():
        assert is_causal(p, 200), name
    assert not is_causal(Rect(), 10)
    assert not is_causal(Diag(-1, 3), 300)
    assert is_causal(Diag(1, 3), 300)
    assert is_causal(Rect(rows=(0, 5), cols=(100, 200)), 100)   # its upper cells lie past n
    assert not is_causal(Rect(rows=(0, 5), cols=(100, 200)), 101)


@pytest.mark.parametrize("name", TABLE1_NAMES)
def test_table1_examples_at_2k_exact(name):
    check(example_pattern(name), 2048, 2048, 128, 64)


def test_table1_examples_at_16k_without_a_dense_mask():
    """The tile map at 16K classifies boxes; it never builds the 16K x 16K mask (256 MiB of
    bools), which is what keeps it fast (timed in benchmarks, never in a test): its peak
    allocation stays under 32 MiB (about 2-4 MiB measured)."""
    for name in TABLE1_NAMES:
        p = example_pattern(name)
        started = not tracemalloc.is_tracing()      # (a session may trace already: measure from here)
        if started:
            tracemalloc.start()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        try:
            tm = tile_map(p, 16384, 16384, 128, 64)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            if started:
                tracemalloc.stop()
        assert peak < 32 << 20, f"{name}: the tile map at 16K allocated {peak / 2**20:.0f} MiB"
        assert tm.num_full + tm.num_partial > 0
