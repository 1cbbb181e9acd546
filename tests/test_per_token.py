"""Per-token analysis of patterns without a periodic description (sas.analysis.per_token) at
any length: the last use of every key and the causality check are read from column runs of
the pattern tree, never from the n x n mask; they must equal the mask's on small lengths
(with tiny chunks and windows, so that every path of the search runs), and a long length is
analysed into a valid table (no refusal for length, only for memory)."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest
from analysis_checks import brute_cache_size, brute_last_use, decode_with_functions
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from strategies import causal_patterns, drifting_spreads

from sas import Causal, Diag, Dynamic, Rect, analyze
from sas.analysis import columns, per_token
from sas.errors import AnalysisError, KernelError
from sas.ir import line_last
from sas.plan import causal_within
from sas.ir.line_runs import COLUMN, line_runs
from sas.ir.periodicity import NON_PERIODIC, structure
from sas.limits import MAX_ANALYSIS_THREADS, analysis_threads

ANALYZE = sys.modules["sas.analysis.analyze"]

# spreads of non-square units over diagonal layouts: no periodic description (2 x 3 blocks on the
# diagonal of blocks leave the lower triangle: bounded, periodic past its end, tests/test_periodicity.py)
#: The first two have no periodic description; the third has one since spreads of units wider
#: than tall below a diagonal got theirs (`sas.ir.periodicity.structure_in`): the tests that ask
#: `analyze` for its per-token scheme take that away (`_per_token_only`).
DRIFTING = [(Rect(size=(3, 1)) >> Diag(0, 1)) * Causal(), (Rect(size=(3, 2)) >> Diag(0, 2)) * Causal(),
            ((Rect(size=(1, 3)) >> Diag(-2, None, stride=4)) + Diag(0, 4)) * Causal()]


def drifting(max_depth: int = 2):
    """Compositions without a periodic description: spreads of units taller than wide
    (`strategies.drifting_spreads`)."""
    return drifting_spreads(wide=False, max_depth=max_depth)


@pytest.fixture
def tiny_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(per_token, "CHUNK", 7)
    monkeypatch.setattr(per_token, "FIRST_WINDOW", 2)


#: the search's steps: (rows first, cell by cell past their limit, all rows of the columns
#: first, runs allowed per key along the last rows, runs allowed per column over all rows, runs
#: allowed on top of those, growth of the windows, terms of a sum searched apart, windows of
#: rows, steps of the last-cell query (0: not asked), runs a column after which the next chunks
#: ask the last cells first (0: always after the first chunk), threads); limits of 0 or 1 make those
#: steps fail (or pass only when nothing or almost nothing is attended)
SEARCH_STEPS = st.tuples(st.booleans(), st.booleans(), st.booleans(), st.sampled_from([0, 0.5, 4]),
                         st.sampled_from([0, 1, 8]), st.sampled_from([0, 1, 2, 1 << 16]), st.sampled_from([2, 3, 8]),
                         st.booleans(), st.booleans(), st.sampled_from([0, 1, 2, 48]), st.sampled_from([0, 1, 4]),
                         st.sampled_from([1, 2, 5]))


def _last_use_with(q, n: int, steps) -> np.ndarray:
    (rows_first, dense, whole_first, per_key, per_column, runs_min, growth, distribute, row_windows, rounds,
     cells_first, threads) = steps
    with pytest.MonkeyPatch.context() as mp:
        # threads: step 1 by ranges of at least 6 keys, steps 2 and 3 by runs of 7-key chunks
        mp.setattr(per_token, "analysis_threads", lambda: threads)
        mp.setattr(per_token, "THREADED_KEYS", 6)
        mp.setattr(per_token, "CELLS_FIRST_RUNS_PER_COLUMN", cells_first)
        mp.setattr(per_token, "LAST_CELLS", rounds > 0)
        mp.setattr(line_last, "ROUNDS", max(rounds, 1))
        mp.setattr(per_token, "CHUNK", 7)
        mp.setattr(per_token, "FIRST_WINDOW", (2, 3, 60)[n % 3])      # 60: two passes of row bits
        mp.setattr(per_token, "DENSE_COLUMNS", 5)
        mp.setattr(per_token, "ROWS_FIRST", rows_first)
        mp.setattr(per_token, "DENSE_LAST_ROWS", dense)
        mp.setattr(per_token, "WHOLE_FIRST", whole_first)
        mp.setattr(per_token, "ROW_RUNS_PER_KEY", per_key)
        mp.setattr(per_token, "WHOLE_RUNS_PER_COLUMN", per_column)
        mp.setattr(per_token, "WHOLE_RUNS_MIN", runs_min)
        mp.setattr(per_token, "GROWTH", growth)
        mp.setattr(per_token, "DISTRIBUTE", distribute)
        mp.setattr(per_token, "ROW_WINDOWS", row_windows)
        return per_token.last_use(q, n)


@settings(max_examples=60, deadline=None)
@given(drifting().map(lambda p: p * Causal()), st.integers(1, 90), SEARCH_STEPS)
def test_last_use_equals_the_mask(p, n: int, steps) -> None:
    assume(not structure(p).periodic)
    q = p.restrict(n)
    got = _last_use_with(q, n, steps)
    np.testing.assert_array_equal(got, brute_last_use(q.to_mask(n)))
    np.testing.assert_array_equal(per_token.last_use(q, n), got)      # default steps


@settings(max_examples=60, deadline=None)
@given(causal_patterns(max_depth=3), st.integers(1, 70), SEARCH_STEPS)
def test_last_use_equals_the_mask_on_any_composition(p, n: int, steps) -> None:
    # every path of the search on compositions of all kinds (periodic ones too: the search
    # does not need a period), empty ones included
    q = p.restrict(n)
    np.testing.assert_array_equal(_last_use_with(q, n, steps), brute_last_use(q.to_mask(n)))


# Patterns whose per-token search was slow at 2^20 (bench_analysis.py --random 300): empty ones
# that every column searched back to its key, and one whose causality check built O(n^2) runs
SLOW_BEFORE = [
    ((Rect(rows=(0, 4), cols=(0, 1)) >> Diag(3, None))
     * ((Rect(rows=(2, 3), cols=(None, 3), stride=(2, 1), offset=(1, 0))
         >> Rect(rows=(0, 2), cols=(0, 7), stride=(2, 2)))
        + (Rect(rows=(0, 4), cols=(0, 2)) >> ~Dynamic(7))) * Causal()),
    ((Rect(rows=(0, 1), cols=(0, 1))
      >> (Rect(rows=(0, 2), cols=(0, 2)) * Rect(rows=(0, 1), cols=(0, 5), stride=(3, 3))))
     >> Diag(-5, 1, stride=2)) * Causal(),
    (Rect(rows=(0, 3), cols=(0, 1)) >> (Diag(4, 3) * Causal())) * Causal(),
    ((Rect(rows=(0, 2), cols=(0, 4)) * Causal()) >> Diag(1, None)) * Causal(),
    DRIFTING[0], DRIFTING[1], DRIFTING[2],
]


@pytest.mark.parametrize("p", SLOW_BEFORE, ids=repr)
def test_the_search_reads_each_line_about_once(monkeypatch: pytest.MonkeyPatch, p) -> None:
    n = 1 << 13
    q = p.restrict(n)
    lines = []

    def counted(pattern, axis, fixed, lo, hi, **kw):
        lines.append(len(fixed))
        return line_runs(pattern, axis, fixed, lo, hi, **kw)

    monkeypatch.setattr(per_token, "line_runs", counted)
    # few runs per key in all, each column (or row) read about once: the doubling windows
    # alone read these columns about log2(n) times each (5 to 9 at this length)
    monkeypatch.setattr(per_token, "TOTAL_RUNS", 4 * n)
    np.testing.assert_array_equal(per_token.last_use(q, n), brute_last_use(q.to_mask(n)))
    assert sum(lines) <= 1.25 * n
    # the causality check reads no run above the diagonal: `Causal()` bounds the product first
    j = np.arange(n, dtype=np.int64)
    assert len(line_runs(q, COLUMN, j, np.zeros(n, dtype=np.int64), j, limit=0)) == 0
    assert per_token.non_causal_cell(q, n) is None


@settings(max_examples=40, deadline=None)
@given(drifting(), st.integers(1, 60))
def test_causality_check_equals_the_mask(p, n: int) -> None:
    assume(not structure(p).periodic)
    q = p.restrict(n)
    upper = np.triu(q.to_mask(n), 1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(per_token, "CHUNK", 5)
        bad = per_token.non_causal_cell(q, n)
    if upper.any():
        assert bad is not None and bad[0] < bad[1] and upper[bad]
    else:
        assert bad is None


def _per_token_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """`analyze` finds no periodic description (DRIFTING[2] has one): analysed per token."""
    monkeypatch.setattr(ANALYZE, "structure", lambda p: NON_PERIODIC)


def _no_ring(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-token analyses keep their table (as when no ring fits)."""
    monkeypatch.setattr(ANALYZE, "ring_from_last_use", lambda last_use: None)


@pytest.mark.parametrize("table", [False, True], ids=["ring", "table"])
@pytest.mark.parametrize("p", DRIFTING, ids=repr)
def test_per_token_schemes_decode_the_mask(tiny_steps: None, monkeypatch: pytest.MonkeyPatch, p, table: bool) -> None:
    """Their last uses fit a ring of the minimal size (the keys in one ring, in order): the closed
    form is used; the table (where no ring fits) decodes the mask as well."""
    n = 70
    _per_token_only(monkeypatch)
    if table:
        _no_ring(monkeypatch)
    a = analyze(p, n)
    assert (a.scheme, a.closed_form) == (("table", False) if table else ("ring", True))
    assert a.cache_size == brute_cache_size(p.to_mask(n)) and a.minimal_cache_size is None
    decode_with_functions(a, p.to_mask(n))


@settings(max_examples=30, deadline=None)
@given(drifting(), st.integers(1, 90))
def test_random_per_token_schemes_decode_the_mask(p, n: int) -> None:
    """Patterns without a periodic description, at lengths up to the table's preference: the
    scheme (a ring where one fits the minimal cache, else a table) has the minimal size and
    decodes the mask."""
    p = p * Causal()
    assume(not structure(p.restrict(n)).periodic)
    mask = p.to_mask(n)
    assume(mask.any())
    a = analyze(p, n)
    assert a.scheme in ("ring", "table") and a.minimal_cache_size is None
    assert a.cache_size == brute_cache_size(mask)
    decode_with_functions(a, mask)


def _check_slots(ids: np.ndarray, L: np.ndarray, minimal: int) -> None:
    """Every used key has a slot; two keys live at once never share one (per slot, each key's
    last use is before the next key); and the most keys live at once is `minimal`."""
    n = len(ids)
    assert np.all(ids[L >= 0] >= 0)
    order = np.argsort(ids, kind="stable")
    order = order[ids[order] >= 0]
    same = ids[order[1:]] == ids[order[:-1]]
    assert np.all(L[order[:-1]][same] < order[1:][same])
    live = np.zeros(n + 1, dtype=np.int64)
    np.add.at(live, np.flatnonzero(L >= 0), 1)
    np.add.at(live, L[L >= 0] + 1, -1)
    assert np.cumsum(live).max() == minimal


@pytest.mark.parametrize("p", DRIFTING[:2], ids=repr)
def test_long_lengths_are_analysed_not_refused(monkeypatch: pytest.MonkeyPatch, p) -> None:
    n = 1 << 17                      # past the former limit of 32768
    _no_ring(monkeypatch)
    a = analyze(p, n)
    assert not a.closed_form and len(a.tables["CACHE_ID"]) == n
    ids = a.cache_ids()
    L = per_token.last_use(p.restrict(n), n)
    assert np.array_equal(ids >= 0, L >= np.arange(n)) and ids.max() == a.cache_size - 1
    _check_slots(ids, L, a.cache_size)
    # the last uses agree with the mask on the first rows' keys where the mask is small
    m = 400
    head = p.to_mask(m)
    near = np.flatnonzero(L[:m] < m - 1)
    near = near[L[near] >= 0]
    np.testing.assert_array_equal(L[near], brute_last_use(head)[near])
    k = int(np.flatnonzero(ids >= 0)[-1])
    assert a.slot_key_func(int(ids[k]), k) == k and a.cache_id_func(k) == ids[k]


#: A drifting spread plus a sink column: no ring keeps the sink while the spread's keys pass
#: within the padding allowed, so it keeps a table at every length.
WITH_SINK = ((Rect(size=(3, 2)) >> Diag(0, 2)) + Rect(cols=(0, 1))) * Causal()


def test_tables_are_refused_for_memory_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAS_HOST_TABLE_LIMIT", "1M")
    with pytest.raises(KernelError, match=r"has no known period, so the per-token slot table .* max_len=65536 .*at "
                                          r"most 21845, or raise SAS_HOST_TABLE_LIMIT"):
        analyze(WITH_SINK, 1 << 16)
    assert not analyze(WITH_SINK, 1 << 12).closed_form
    # periodic, without a closed form from its period below the padding's length: its last uses decide
    with pytest.raises(KernelError, match=r"no closed form of its 29998-slot cache follows from its period .*so the "
                                          r"per-token slot table .* max_len=30000 "):
        analyze(Diag(2, None) * Causal(), 30000)


def test_a_period_past_the_shapes_limit_is_named_when_its_table_is_refused() -> None:
    """Chunks of 2^23 tokens at max_len 2^26: the period (8M column classes) is past the periodic
    analysis' limit, and the per-token table at that length past the host's. The refusal names the
    period and the largest max_len the table may have (before: it blamed max_len alone)."""
    chunks = (Rect(size=(1 << 23, 1 << 23)) >> Diag(0, 1)) * Causal()
    with pytest.raises(KernelError, match=r"periodic analysis stopped at its limit \(period 8388608.*so the per-token "
                                          r"slot table .* at most 22369621, or raise SAS_HOST_TABLE_LIMIT"):
        analyze(chunks, 1 << 26)


def test_a_ring_too_large_for_the_padding_leaves_the_table() -> None:
    """At a length past the table's preference the smallest ring over the used keys needs 43692
    slots (the sink's slot comes back after that many keys), three times the minimal 14569: the
    table stays, and the note says why."""
    a = analyze(WITH_SINK, 1 << 16)
    assert (a.scheme, a.cache_size, a.minimal_cache_size) == ("table", 14569, None)
    assert any("needs 43692 slots" in note and "padding allowed" in note for note in a.notes)


def test_a_padded_ring_past_the_table_length(monkeypatch: pytest.MonkeyPatch) -> None:
    """A drifting spread plus a diagonal band at 2^17, analysed per token: a ring of two more
    slots than the minimal cache, valid for every key (the same checks as the table's above)."""
    n = 1 << 17
    p = DRIFTING[2]
    _per_token_only(monkeypatch)
    a = analyze(p, n)
    assert a.closed_form and a.scheme == "ring" and a.cache_size > a.minimal_cache_size
    _check_slots(a.cache_ids(), per_token.last_use(p.restrict(n), n), a.minimal_cache_size)
    assert a.cache_ids().max() < a.cache_size


@pytest.mark.parametrize("threads, limit", [(1, 10), (4, 10), (4, 2000)])
def test_the_runs_limit_names_the_numbers(monkeypatch: pytest.MonkeyPatch, threads: int, limit: int) -> None:
    # 2000 of its 2730 runs: past the first chunk (264), in the threads (their counts add up)
    monkeypatch.setattr(per_token, "analysis_threads", lambda: threads)
    monkeypatch.setattr(per_token, "CHUNK", 256)
    monkeypatch.setattr(per_token, "TOTAL_RUNS", limit)
    with pytest.raises(AnalysisError, match=rf"more than {limit} runs .*runs limit"):
        per_token.last_use(DRIFTING[1], 4096)


def test_analysis_threads_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SAS_ANALYSIS_THREADS", raising=False)
    assert 1 <= analysis_threads() <= MAX_ANALYSIS_THREADS
    monkeypatch.setenv("SAS_ANALYSIS_THREADS", " 3 ")
    assert analysis_threads() == 3
    monkeypatch.setattr(per_token, "CHUNK", 512)
    p = DRIFTING[0].restrict(4096)
    np.testing.assert_array_equal(per_token.last_use(p, 4096), brute_last_use(p.to_mask(4096)))
    for bad in ["0", "two", "-1", "1.5"]:
        monkeypatch.setenv("SAS_ANALYSIS_THREADS", bad)
        with pytest.raises(AnalysisError, match=r"SAS_ANALYSIS_THREADS must be a positive integer .*" + re.escape(repr(bad))):
            per_token.last_use(p, 4096)


def test_a_failing_thread_stops_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    # 15 chunks after the first (keys 256-4095), taken in order by two threads as each is free;
    # those from key 2304 on fail: the first of them to fail reaches the caller once every thread
    # has stopped, and no thread takes a chunk after one failed (one still searching stops at
    # its next count)
    chunk, started = per_token._chunk, []

    def failing(pattern, c0, c1, *rest):
        started.append(c0)
        if c0 >= 2304:
            raise AnalysisError(f"chunk {c0} failed")
        return chunk(pattern, c0, c1, *rest)

    monkeypatch.setattr(per_token, "analysis_threads", lambda: 2)
    monkeypatch.setattr(per_token, "CHUNK", 256)
    monkeypatch.setattr(per_token, "_chunk", failing)
    with pytest.raises(AnalysisError, match="chunk (2304|2560) failed"):
        per_token.last_use(DRIFTING[1], 4096)
    assert sorted(started)[:9] == list(range(0, 2304, 256))         # every chunk before it
    assert 2304 in started and max(started) <= 2560                  # at most one more started


@pytest.mark.parametrize("stride", [64, 1024])
def test_a_drifting_spread_plus_a_long_stride(stride: int) -> None:
    # columns attended all along by a stride too long for the last rows and too fine for
    # reading whole columns: the sum is searched term by term (default steps, and windows only)
    p = ((Rect(size=(3, 2)) >> Diag(0, 2)) + Diag(0, None, stride=stride)) * Causal()
    n = 4096
    q = p.restrict(n)
    want = brute_last_use(q.to_mask(n))
    np.testing.assert_array_equal(per_token.last_use(q, n), want)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(per_token, "LAST_CELLS", False)
        mp.setattr(per_token, "WHOLE_RUNS_PER_COLUMN", 0)
        mp.setattr(per_token, "WHOLE_RUNS_MIN", 0)
        mp.setattr(per_token, "ROW_RUNS_PER_KEY", 0)
        mp.setattr(per_token, "DENSE_LAST_ROWS", False)
        np.testing.assert_array_equal(per_token.last_use(q, n), want)
        mp.setattr(per_token, "ROW_RUNS_PER_KEY", 4)
        mp.setattr(per_token, "DISTRIBUTE", False)      # windows of rows
        np.testing.assert_array_equal(per_token.last_use(q, n), want)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 70), st.lists(st.tuples(st.integers(0, 70), st.integers(0, 70), st.integers(0, 500)),
                                    max_size=40))
def test_range_max_equals_the_cells(n, runs):
    """range_max (the row windows' last uses, a segment tree) against the runs written out cell
    by cell, empty and out-of-order runs included."""
    start = np.array([a for a, _, _ in runs], dtype=np.int64).clip(0, n)
    stop = np.array([b for _, b, _ in runs], dtype=np.int64).clip(0, n)
    value = np.array([v for _, _, v in runs], dtype=np.int64)
    want = np.full(n, -1, dtype=np.int64)
    for a, b, v in zip(start, stop, value):
        want[a:b] = np.maximum(want[a:b], v)
    np.testing.assert_array_equal(per_token.range_max(n, start, stop, value), want)


def test_rows_with_one_long_run_each_are_read_in_runs():
    """Odd rows attend the keys above half their index (a spread of ~Causal): each row is one
    run of ~i/2 cells, so row windows read cell by cell gave up and the columns, each attended
    at every other row, cost O(n^2) runs (2 s at 16K, refused at 64K; found by a fuzzing
    helper). By runs the whole sequence is a few windows of O(n) runs."""
    p = (Rect(rows=(1, 2), cols=(0, 1)) >> ~Causal()) * Causal()
    n = 1 << 16
    read = []
    with pytest.MonkeyPatch.context() as mp:
        real = per_token.line_runs
        mp.setattr(per_token, "line_runs", lambda *a, **k: read.append(real(*a, **k)) or read[-1])
        got = per_token.last_use(p, n)
    np.testing.assert_array_equal(got, _half_window_last_use(n))
    assert sum(len(r) for r in read) < 4 * n
    small = 201
    np.testing.assert_array_equal(_half_window_last_use(small), brute_last_use(p.to_mask(small)))


def _half_window_last_use(n: int) -> np.ndarray:
    """The last odd row i < n with i // 2 < j <= i (i <= 2j - 1), -1 where none."""
    j = np.arange(n, dtype=np.int64)
    last = np.minimum(2 * j - 1, n - 1 if (n - 1) % 2 else n - 2)
    return np.where(last >= j, last, -1)


def test_columns_of_many_runs_are_settled_without_their_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The complement of a drifting spread cut by a strided lattice attends a band below each
    key cut every 28 rows: the windows built those runs (past 30 s at 2^20, a fuzzing helper's
    composition); the last-cell query reads each column's last row from the tree."""
    p = ~(Rect(size=(4, 3)) >> (Rect(rows=(3, None), cols=(3, None), stride=(7, 3), offset=(2, 2))
                                + Causal())) * Causal()
    small = 1 << 11
    np.testing.assert_array_equal(per_token.last_use(p.restrict(small), small),
                                  brute_last_use(p.restrict(small).to_mask(small)))
    n = 1 << 15
    q = p.restrict(n)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(per_token, "LAST_CELLS", False)
        by_windows = per_token.last_use(q, n)            # about 29 runs a column
        mp.setattr(per_token, "TOTAL_RUNS", 8 * n)
        with pytest.raises(AnalysisError, match="runs limit"):
            per_token.last_use(q, n)
    monkeypatch.setattr(per_token, "TOTAL_RUNS", 8 * n)
    np.testing.assert_array_equal(per_token.last_use(q, n), by_windows)


def test_a_periodic_analysis_past_its_limit_is_done_per_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """A period too long for the length-independent analysis (coprime strides: 4099 x 4093 at
    2^24, refused before) is analysed per token, exactly, with a note saying why."""
    p = (Rect(stride=(13, 11)) + Diag(0, 5)) * Causal()
    n = 3000
    mask = np.asarray(p.to_mask(n), dtype=bool)
    periodic = analyze(p, n)
    monkeypatch.setattr(columns, "SHAPE_LIMIT", 10)
    a = analyze(p, n)
    assert a.cache_size == periodic.cache_size == brute_cache_size(mask)
    assert not a.closed_form and not a.structure.periodic
    assert any("stopped at its limit" in note and "shapes limit" in note for note in a.notes)
    decode_with_functions(a, mask)


def test_coprime_strides_at_2_24_are_analysed() -> None:
    p = Rect(stride=(4099, 4093)) * Causal()
    a = analyze(p, 2**24)
    assert a.cache_size == -(-2**24 // 4093)          # every key on the lattice stays to the end
    assert any("analysed per token" in note for note in a.notes)
    assert causal_within(p, 2**24) and not causal_within(Rect(stride=(4099, 4093)), 2**24)


def test_chunks_after_columns_of_many_runs_ask_the_last_cells_first(monkeypatch: pytest.MonkeyPatch) -> None:
    # a band of 18 rows below each key, cut by two drifting spreads: about 5 runs a column (the
    # fuzzer's #1138); after the first chunk's runs, the last cells settle every next chunk
    p = ((((Rect(rows=(0, 2), cols=(0, 4)) >> Diag(4, None, stride=2)) * Causal())
          + (Causal() * (Rect(rows=(1, 2), cols=(1, 5), stride=(2, 2)) >> Causal()))) * Diag(1, 18) * Causal())
    n = 2048
    calls = []
    whole, cells = per_token._whole, per_token.last_cells
    monkeypatch.setattr(per_token, "_whole", lambda *a: calls.append("whole") or whole(*a))
    monkeypatch.setattr(per_token, "last_cells", lambda *a: calls.append("cells") or cells(*a))
    monkeypatch.setattr(per_token, "CHUNK", 512)
    got = per_token.last_use(p, n)
    np.testing.assert_array_equal(got, brute_last_use(p.to_mask(n)))
    assert calls == ["whole", "cells", "cells", "cells"]
    calls.clear()
    monkeypatch.setattr(per_token, "CELLS_FIRST_RUNS_PER_COLUMN", 6)     # more than it reads
    np.testing.assert_array_equal(per_token.last_use(p, n), got)
    assert calls == ["whole"] * 4


@pytest.mark.parametrize("cost, want", [
    # the first chunk (runs first) slow, the second (last cells first) faster: cells go on
    ({"whole": 10, "cells": 1}, ["whole", "cells", "cells", "cells"]),
    # the last cells slower: back to the runs
    ({"whole": 10, "cells": 30}, ["whole", "cells", "whole", "whole"]),
    # a fast first chunk: no chunk asks the last cells first
    ({"whole": 1, "cells": 1}, ["whole"] * 4),
])
def test_timed_chunks_keep_the_faster_way(cost: dict[str, int], want: list[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # the pattern of the test above, with a runs rule that never asks the last cells first: the
    # way is chosen by the time of each chunk, read from a clock that each step advances by its
    # cost
    p = ((((Rect(rows=(0, 2), cols=(0, 4)) >> Diag(4, None, stride=2)) * Causal())
          + (Causal() * (Rect(rows=(1, 2), cols=(1, 5), stride=(2, 2)) >> Causal()))) * Diag(1, 18) * Causal())
    n = 2048
    calls = []
    clock = [0]

    def step(name, real):
        def run(*a):
            calls.append(name)
            clock[0] += cost[name]
            return real(*a)
        return run

    monkeypatch.setattr(per_token, "_whole", step("whole", per_token._whole))
    monkeypatch.setattr(per_token, "last_cells", step("cells", per_token.last_cells))
    monkeypatch.setattr(per_token, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(per_token, "analysis_threads", lambda: 1)    # one run of chunks: the way goes on
    monkeypatch.setattr(per_token, "CHUNK", 512)
    monkeypatch.setattr(per_token, "CELLS_FIRST_RUNS_PER_COLUMN", 6)
    monkeypatch.setattr(per_token, "TIMED_COLUMNS", 512)
    monkeypatch.setattr(per_token, "CELLS_FIRST_SECONDS_PER_COLUMN", 5 / 512)
    np.testing.assert_array_equal(per_token.last_use(p, n), brute_last_use(p.to_mask(n)))
    assert calls == want


@pytest.mark.parametrize("p", [
    # the fuzzer's #4241 and #3901 (each past 30 s at 2^20 before the periodic pieces of
    # `sas.ir.line_period`): products whose terms never meet on most columns
    (Rect(rows=(3, 5), cols=(0, 2), stride=(2, 1))
     >> ((Rect(size=(3, 6)) >> Diag(-2, None, stride=3)) * Diag(-6, None, stride=9) * Causal())) * Causal(),
    (((Rect(rows=(1, 6), cols=(1, 4), stride=(2, 1)) >> ~(Rect(size=(3, 4)) >> Diag(-4, None, stride=7)))
      * Diag(4, None, stride=2))
     + ((Rect(size=(4, 4)) * (Rect(rows=(0, 2), cols=(0, 1), stride=(5, 1), offset=(2, 0)) + Diag(6, 6)
                              + (Rect(size=(5, 1)) * Causal())))
        >> ~(Rect(size=(5, 4)) >> ~Diag(5, None, stride=7)))) * Causal(),
])
def test_products_whose_terms_never_meet_search_exactly(p) -> None:
    n = 1500
    assert not structure(p).periodic
    np.testing.assert_array_equal(per_token.last_use(p, n), brute_last_use(p.to_mask(n)))


# --- periodic patterns whose column shapes would be costly: the per-token search first ---------

@settings(max_examples=60, deadline=None)
@given(causal_patterns(max_depth=3))
def test_estimated_runs_of_every_shape_are_the_runs(p) -> None:
    """Where every column shape is sampled (at most `ESTIMATE_LINES` of them) the estimate is
    the number of runs the column shapes hold."""
    st_ = structure(p).within(400)
    assume(st_.periodic and st_.T + st_.P <= columns.ESTIMATE_LINES)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(columns, "ESTIMATE_FROM_CELLS", 0)
        estimate = columns.estimated_runs(p, st_)
    assert estimate == pytest.approx(columns.column_shapes(p, st_).n_runs)


#: Periodic (P = 1, Qv = 35) with a few hundred runs per column shape at n = 600.
STRIDED = (Diag(5, stride=7) + Diag(2, stride=5) + Rect(rows=(None, 12), stride=(41, 7), offset=(10, 3))) * Causal()


def test_costly_column_shapes_are_analysed_per_token(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 600
    monkeypatch.setattr(columns, "ESTIMATE_FROM_CELLS", 0)
    monkeypatch.setattr(ANALYZE, "PER_TOKEN_FIRST_RUNS", 10)
    a = analyze(STRIDED, n)
    assert a._columns is None and not a.structure.periodic
    assert any("analysed per token" in note and "more than 10" in note for note in a.notes)
    mask = STRIDED.to_mask(n)
    assert a.cache_size == brute_cache_size(mask)
    decode_with_functions(a, mask)


def test_costly_column_shapes_are_built_where_the_per_token_search_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 600
    monkeypatch.setattr(columns, "ESTIMATE_FROM_CELLS", 0)
    monkeypatch.setattr(ANALYZE, "PER_TOKEN_FIRST_RUNS", 10)
    monkeypatch.setattr(per_token, "TOTAL_RUNS", 10)
    a = analyze(STRIDED, n)
    assert a._columns is not None and a.structure.periodic
    assert not any("analysed per token" in note for note in a.notes)
    mask = STRIDED.to_mask(n)
    assert a.cache_size == brute_cache_size(mask)
    decode_with_functions(a, mask)
