"""Column shapes as runs (`sas.analysis.columns`, `sas.ir.line_runs`): exact against dense
evaluation of the oracle, and length-independent for chunked attention with large chunks."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from strategies import causal_patterns, patterns

from analysis_checks import DenseColumns, brute_last_use, dense_upper_triangle
from sas import Causal, Diag, Rect, analyze
from sas.errors import AnalysisError
import sas.analysis.columns as columns_module
from sas.analysis.columns import column_shapes, upper_triangle_clear
import sas.ir.line_runs as line_runs_module
from sas.ir.emptiness import merge_diags
from sas.ir.line_runs import COLUMN, ROW, line_runs
from sas.ir.periodicity import structure


def _dense(runs, n_lines: int, width: int) -> np.ndarray:
    out = np.zeros((n_lines, width), dtype=bool)
    for line, a, b in zip(runs.line, runs.start, runs.stop):
        out[line, a:b] = True
    return out


def _same(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in ((a.line, b.line), (a.start, b.start), (a.stop, b.stop)))


@contextlib.contextmanager
def run_algebra_only():
    """Within: no window is small enough to be evaluated cell by cell (line_runs.DENSE_CELLS)."""
    old = line_runs_module.DENSE_CELLS
    line_runs_module.DENSE_CELLS = 0
    try:
        yield
    finally:
        line_runs_module.DENSE_CELLS = old


def chunked(b: int):
    return (Rect(size=(b, b)) >> Diag(0, 1)) * Causal()


@settings(max_examples=100, deadline=None)
@given(patterns(max_depth=4), st.integers(1, 40), st.data())
def test_line_runs_equal_the_mask(p, n: int, data) -> None:
    m = p.to_mask(n)
    bounds = st.lists(st.integers(0, n), min_size=n, max_size=n)
    for axis in (COLUMN, ROW):
        lo, hi = np.array(data.draw(bounds)), np.array(data.draw(bounds))
        r = line_runs(p, axis, np.arange(n), lo, hi, dense_cells=0)
        assert _same(r, line_runs(p, axis, np.arange(n), lo, hi))      # the cell-by-cell path
        # sorted by line then start, disjoint, never touching, never empty
        same = r.line[1:] == r.line[:-1]
        assert np.all(np.diff(r.line) >= 0) and np.all(r.start[1:][same] > r.stop[:-1][same])
        assert np.all(r.stop > r.start)
        x = np.arange(n)[None, :]
        want = (m.T if axis == COLUMN else m) & (x >= lo[:, None]) & (x < hi[:, None])
        assert np.array_equal(_dense(r, n, n), want)


def _periodic_causal(p) -> bool:
    st_ = structure(p)
    return st_.periodic and upper_triangle_clear(p, st_) is None


def _check_shapes(p) -> None:
    st_ = structure(p)
    with run_algebra_only():
        cols = column_shapes(p, st_)
    ref = DenseColumns(p, st_)
    assert np.array_equal(cols.ever_used, ref.ever_used)
    assert np.array_equal(cols.forever, ref.forever)
    s = np.arange(cols.n_shapes)
    W = ref.on.shape[1]
    x = np.arange(-1, 3 * W + 2 * cols.Q + 3)
    S, X = np.meshgrid(s, x, indexing="ij")
    assert np.array_equal(cols.last_d(S, X), ref.last_d(S, X))
    X0 = np.maximum(X, 0)
    assert np.array_equal(cols.next_d(S, X0), ref.next_d(S, X0))
    assert np.array_equal(cols.first_used, np.where(ref.ever_used, np.argmax(ref.on, axis=1), -1))
    finite = ~ref.forever
    assert np.array_equal(cols.last_finite[finite], ref.last_upto[finite, -1])
    # count_below: cells above each distance, against the unrolled dense column
    dense = np.stack([ref.column(k, int(X0.max()) + 1) for k in s])
    before = np.concatenate([np.zeros((len(s), 1), np.int64), np.cumsum(dense, axis=1)], axis=1)
    assert np.array_equal(cols.count_below(S, X0), before[S, X0])
    for width in (W, W + 2 * cols.Q + 1):
        got = _dense(cols.window_runs(s, np.zeros_like(s), np.full_like(s, width)), len(s), width)
        assert np.array_equal(got, np.stack([ref.column(k, width) for k in s]))


@settings(max_examples=120, deadline=None)
@given(causal_patterns(max_depth=4), st.sampled_from([1 << 18, 16]))
def test_column_shapes_answer_like_dense_evaluation(p, chunk_runs: int) -> None:
    # chunk_runs 16: shapes of more than 16 cells in passes of about 16 runs
    q = p.restrict(1 << 20)
    assume(_periodic_causal(q))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(columns_module, "CHUNK_RUNS", chunk_runs)
        _check_shapes(q)


@settings(max_examples=60, deadline=None)
@given(causal_patterns(max_depth=4), st.integers(1, 48))
def test_last_use_matches_the_mask(p, n: int) -> None:
    q = p.restrict(n)
    st_ = structure(q)
    assume(st_.periodic)
    with run_algebra_only():
        cols = column_shapes(q, st_)
    j = np.arange(n)
    assert np.array_equal(cols.last_use(j, n), brute_last_use(p.to_mask(n)))


@settings(max_examples=60, deadline=None)
@given(patterns(max_depth=4), st.integers(1, 40))
def test_upper_triangle_check_is_exact(p, n: int) -> None:
    q = p.restrict(1 << 20)
    st_ = structure(q)
    assume(st_.periodic)
    with run_algebra_only():
        bad = upper_triangle_clear(q, st_)
    assert bad == dense_upper_triangle(q, st_) == upper_triangle_clear(q, st_)
    if not np.triu(p.to_mask(n), 1).any():
        assert bad is None or bad[1] >= n


def test_chunked_columns_are_one_run_each() -> None:
    for b in (4, 16, 64, 8192):
        p = chunked(b).restrict(1 << 20)
        cols = column_shapes(p, structure(p))
        assert cols.n_shapes == b and cols.n_runs == b
        assert np.array_equal(cols.stop - cols.start, b - np.arange(b))
        if b <= 64:
            _check_shapes(p)


def test_chunked_attention_small_against_the_mask() -> None:
    from analysis_checks import brute_cache_size, decode_with_functions
    for b, n in ((4, 37), (16, 100), (64, 200)):
        p = chunked(b)
        a = analyze(p, n)
        m = p.to_mask(n)
        assert a.closed_form and a.cache_size == brute_cache_size(m) == min(b, n)
        assert np.array_equal(a.last_use(np.arange(n)), brute_last_use(m))
        decode_with_functions(a, m)


def test_chunked_attention_with_large_chunks_at_a_million_tokens() -> None:
    n = 1 << 20
    for b in (8192, 65536):
        a = analyze(chunked(b), n)
        assert a.closed_form and a.minimal_cache_size is None and a.scheme == "ring" and a.cache_size == b
        j = np.array([0, 1, b - 1, b, 5 * b + 7, n - 1])
        assert np.array_equal(a.last_use(j), np.minimum((j // b + 1) * b - 1, n - 1))
        assert np.array_equal(a.cache_ids(3 * b)[[0, b - 1, b, 2 * b + 5]], [0, b - 1, 0, 5])
        assert a.mask_func(5, 2 * b + 9) and not a.mask_func(5, 3 * b)   # slot 5 holds key 2b + 5, then 3b + 5
        first = a.groups[0]
        assert (first.kind, first.key_start, first.key_stop, first.repeats) == ("periodic", 0, b, b)
        assert first.area == b * (b + 1) // 2 and first.query_bounds == (0, b)


def test_a_band_of_2_40_tokens_is_one_run_per_column() -> None:
    """A band wider than any dense window (refused before runs): the dynamic plan without
    max_len reads its region's columns as one run each."""
    from sas import Dynamic
    from sas.dynamic.plan import FOREVER, plan_dynamic

    split = plan_dynamic(Diag(0, 2**40) * Causal() + Diag(2**40, None) * Causal() * Dynamic(4))
    assert split.columns.n_runs == split.columns.n_shapes == 1
    assert split.columns.first_used[0] == 2**40 and split.region_last_use(np.array([7]))[0] == FOREVER


def test_a_product_is_bounded_by_its_band_first() -> None:
    # A drifting spread whose columns hold O(n) runs above the diagonal, times Causal(): the
    # band is read first, so the rows above the diagonal build no run at all (the spread first
    # built ~n^2 / 16 runs there: the causality check took 25 s at n = 65536).
    p = (((Rect(rows=(0, 2), cols=(0, 4)) * Causal()) >> Diag(1, None)) * Causal())
    n = 1 << 16
    j = np.arange(n, dtype=np.int64)
    with run_algebra_only():
        assert len(line_runs(p, COLUMN, j, np.zeros(n, dtype=np.int64), j, limit=0)) == 0
    small = 64
    js = np.arange(small, dtype=np.int64)
    with run_algebra_only():
        below = line_runs(p, COLUMN, js, js, np.full(small, small, dtype=np.int64))
    assert np.array_equal(_dense(below, small, small).T, np.tril(p.to_mask(small)))


@contextlib.contextmanager
def union_gaps(value: int):
    """Within: a sum merges its later terms read on the whole lines once its first terms leave
    more than `value` gaps a line (line_runs.UNION_GAPS; -1: always, huge: never)."""
    old = line_runs_module.UNION_GAPS
    line_runs_module.UNION_GAPS = value
    try:
        yield
    finally:
        line_runs_module.UNION_GAPS = old


@settings(max_examples=100, deadline=None)
@given(patterns(max_depth=4), st.integers(1, 40), st.data())
def test_sums_read_on_whole_lines_equal_the_gaps(p, n: int, data) -> None:
    """A sum's later terms read on the whole lines and merged with the runs before (the path
    taken where the first terms cut lines into many gaps) give the runs of the gap-by-gap path,
    and the mask."""
    m = p.to_mask(n)
    bounds = st.lists(st.integers(0, n), min_size=n, max_size=n)
    for axis in (COLUMN, ROW):
        lo, hi = np.array(data.draw(bounds)), np.array(data.draw(bounds))
        with run_algebra_only(), union_gaps(-1):
            merged = line_runs(p, axis, np.arange(n), lo, hi)
        with run_algebra_only(), union_gaps(1 << 40):
            gaps = line_runs(p, axis, np.arange(n), lo, hi)
        assert _same(merged, gaps)
        x = np.arange(n)[None, :]
        want = (m.T if axis == COLUMN else m) & (x >= lo[:, None]) & (x < hi[:, None])
        assert np.array_equal(_dense(merged, n, n), want)


def test_a_strided_first_term_makes_the_sum_merge_whole_lines(monkeypatch) -> None:
    # The drifting spread of the analysis benchmark: the doubly negated strided band leaves three
    # gaps a column, so the spread is read once per column (not once per gap) and merged.
    p = (((Rect(rows=(0, 3), cols=(0, 1)) * Rect(rows=(None, 2), cols=(0, 1), stride=(2, 1), offset=(1, 0)))
          >> Diag(5, 3, stride=2)) + ~~Diag(3, 3, stride=2)) * Causal()
    calls = []
    real = line_runs_module._union
    monkeypatch.setattr(line_runs_module, "_union", lambda a, b: calls.append(len(b)) or real(a, b))
    n = 300
    j = np.arange(n, dtype=np.int64)
    with run_algebra_only():
        r = line_runs(p, COLUMN, j, np.zeros(n, dtype=np.int64), np.full(n, n, dtype=np.int64))
    assert calls and np.array_equal(_dense(r, n, n), p.to_mask(n).T)


def test_the_merged_sum_keeps_the_runs_limit() -> None:
    # two interleaved strided row bands: a run every other cell of 120 rows on each of 200 columns
    # (12000 runs); past the limit both paths refuse (the merge checks the count as the gap path does)
    p = Rect(rows=(0, 120), stride=(4, 1)) + Rect(rows=(0, 120), stride=(4, 1), offset=(2, 0))
    n = 200
    j = np.arange(n, dtype=np.int64)
    lo, hi = np.zeros(n, dtype=np.int64), np.full(n, n, dtype=np.int64)
    for gaps in (-1, 1 << 40):
        with run_algebra_only(), union_gaps(gaps):
            assert len(line_runs(p, COLUMN, j, lo, hi, limit=12000)) == 12000
            with pytest.raises(AnalysisError, match="runs limit"):
                line_runs(p, COLUMN, j, lo, hi, limit=8000)


_DIAG = st.builds(Diag, st.integers(-20, 20), st.one_of(st.none(), st.integers(1, 25)), st.integers(1, 12))


@settings(max_examples=300, deadline=None)
@given(st.lists(_DIAG, min_size=2, max_size=4))
def test_merged_diagonals_attend_the_same_distances(diags):
    """The product's diagonals merged into one (Chinese remainder theorem) attend exactly the
    distances i - j every one of them attends; None exactly when none does."""
    merged = merge_diags(tuple(diags))
    d = np.arange(-80, 400)
    zero = np.zeros_like(d)
    want = np.logical_and.reduce([np.asarray(g.evaluate(d, zero), dtype=bool) for g in diags])
    if merged is None:
        assert not want.any()
    else:
        assert len(merged) == 1
        np.testing.assert_array_equal(np.asarray(merged[0].evaluate(d, zero), dtype=bool), want)


def test_strided_diagonals_of_different_residues_build_no_runs():
    """Diag(3, None, stride=7) * Diag(2, None, stride=7) is empty: its runs come out empty without
    a run for every cell of one diagonal (11 s at 2^16 and past 60 s at 2^20 for a spread of it
    before: found by a fuzzing helper), and the spread of it is refused as empty."""
    p = Diag(3, None, stride=7) * Diag(2, None, stride=7)
    n = 1 << 12
    j = np.arange(n)
    assert len(line_runs(p, COLUMN, j, j, np.full(n, n), limit=1)) == 0      # 1 run allowed: none built
    with pytest.raises(AnalysisError, match="empty"):
        analyze((Rect(size=(1, 4)) >> p) * Causal(), 1 << 16)


def _strided_sum_shapes():
    """A strided Rect plus a strided Diag at 4096 (87 column shapes): its pattern, structure and
    the column shapes built in one pass."""
    p = (Rect(stride=(3, 29)) + Diag(0, None, stride=5)) * Causal()
    st = structure(p).within(4096)
    return p, st, column_shapes(p, st)


def test_column_shapes_in_passes_of_about_chunk_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    # passes sized from a sample so that each builds about CHUNK_RUNS runs: the same shapes as
    # in one pass, in passes of equal counts of shapes whose runs stay near the target
    p, st, whole = _strided_sum_shapes()
    passes = []
    real = columns_module.line_runs

    def counted(*args, **kwargs):
        r = real(*args, **kwargs)
        passes.append((len(args[2]), len(r)))
        return r

    monkeypatch.setattr(columns_module, "line_runs", counted)
    monkeypatch.setattr(columns_module, "CHUNK_RUNS", 40)
    got = column_shapes(p, st)
    for name in ("ptr", "start", "stop", "D"):
        np.testing.assert_array_equal(getattr(got, name), getattr(whole, name))
    sample, rest = passes[0], passes[1:]
    assert sample[0] <= columns_module.ESTIMATE_LINES and len(rest) > 2
    assert len({lines for lines, _ in rest[:-1]}) == 1 and rest[-1][0] <= rest[0][0]
    assert sum(lines for lines, _ in rest) == len(whole.ptr) - 1
    assert max(runs for _, runs in rest) <= 4 * 40
    passes.clear()
    monkeypatch.setattr(columns_module, "CHUNK_RUNS", 1 << 30)       # more than all the cells: one pass
    column_shapes(p, st)
    assert passes == [(len(whole.ptr) - 1, len(whole.start))]


def test_passes_are_sized_from_the_estimate_already_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    # more shapes than a pass: the estimate that guards the runs limit also sizes the passes
    # (one sample of the shapes, not two), and the shapes are the same
    p, st, whole = _strided_sum_shapes()
    samples = []
    real = columns_module._sampled_runs

    def counted(*args, **kwargs):
        samples.append(args[4])
        return real(*args, **kwargs)

    monkeypatch.setattr(columns_module, "_sampled_runs", counted)
    monkeypatch.setattr(columns_module, "CHUNK_LINES", 16)        # of 87 shapes
    monkeypatch.setattr(columns_module, "CHUNK_RUNS", 40)
    got = column_shapes(p, st)
    assert samples == [columns_module.SAMPLE_LINES]
    for name in ("ptr", "start", "stop", "D"):
        np.testing.assert_array_equal(getattr(got, name), getattr(whole, name))


def test_column_shapes_stop_early_on_an_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    # 87 column shapes of a few runs each: with a limit of 50 runs and passes of 8 shapes, the
    # estimate from 16 shapes stops the analysis before any pass, and analyze goes on per token
    import sas.analysis.columns as columns_module
    p = (Rect(stride=(3, 29)) + Diag(0, None, stride=5)) * Causal()
    want = analyze(p, max_len=4096)
    assert want.structure.periodic and want.cache_size > 0
    calls = []
    real = columns_module.line_runs

    def counted(*args, **kwargs):
        calls.append(len(args[2]))
        return real(*args, **kwargs)

    monkeypatch.setattr(columns_module, "line_runs", counted)
    monkeypatch.setattr(columns_module, "CHUNK_LINES", 8)
    monkeypatch.setattr(columns_module, "SAMPLE_LINES", 16)
    st = structure(p).within(4096)
    for limit, stops in ((50, True), (4000, False)):
        monkeypatch.setattr(columns_module, "RUN_LIMIT", limit)
        calls.clear()
        if stops:
            with pytest.raises(AnalysisError, match="estimated from 16 of the 87 shapes"):
                column_shapes(p, st)
            assert calls == [16]                   # the sample only
        else:
            cols = column_shapes(p, st)             # under the limit: every pass
            assert calls == [16] + [8] * 10 + [7]
            assert cols.ptr[-1] <= limit
    monkeypatch.setattr(columns_module, "RUN_LIMIT", 50)
    got = analyze(p, max_len=4096)
    assert any("stopped at its limit" in note and "estimated" in note for note in got.notes)
    assert got.cache_size == want.cache_size
