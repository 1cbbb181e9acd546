"""The dynamic runtime's region schedule in periodic form (`DynamicCachePlan.table_period`):
the tables list a region's first keys and queries, and every later key's first and last region
query and every later query's entering keys follow by the period (`dynamic_host.table_row`, as
the update kernel reads them). Checked against the per-token schedule of the plan
(`DynamicPlan.candidate_span` over every key) on random compositions and Table 1 + H2O; a kernel
at max_len 2^30 decodes the same tokens and keys as one at a short max_len and as the plain H2O
reference; and the plans of 1K-slot patterns at 2^24 and 2^30 stay small and fast."""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sas import Causal, Diag, Dynamic, Rect, analyze, load_pattern
from sas.dynamic.cache_plan import dynamic_cache_plan
from sas.dynamic.plan import SCHEDULE_LIMIT, most_candidates
from sas.errors import NotYetSupportedError, PatternError
from sas.runtime import SASAttnKernel
from sas.runtime.dynamic_host import table_row

from helpers.attention import qkv
from helpers.h2o import plain_h2o, region_last_use
from helpers.table1 import TABLE1_H2O
from strategies import static_plus_h2o
from test_dynamic_kernels import run_steps

TABLE1_NAMES = ("streaming_llm", "block_local", "sliding_window", "openai_strided", "openai_fixed",
                "strided_block_local")


def h2o_on(static, budget=512, refresh=False):
    return static + (Causal() * ~static) * Dynamic(budget=budget, refresh=refresh)


def check_tables(pattern, n: int) -> None:
    """The tables, read through `table_row`, give every key's span and every query's entering
    keys of the per-token schedule over all n keys."""
    cplan = dynamic_cache_plan(pattern, n)
    first, last = cplan.plan.candidate_span(n)
    t = cplan.table_arrays()
    j = np.arange(n, dtype=np.int64)
    row, shift = table_row(j, cplan.table_rows, cplan.table_period)
    got_first = np.where(t["enter_at"][row] >= 0, t["enter_at"][row] + shift, -1)
    got_first = np.where(got_first >= n, -1, got_first)
    got_last = np.where(got_first < 0, -1, np.minimum(t["region_last"][row] + shift, n))
    np.testing.assert_array_equal(got_first, first)
    np.testing.assert_array_equal(got_last, np.where(first < 0, -1, np.minimum(last, n)))
    for q in range(n):
        r, s = table_row(q, cplan.table_rows, cplan.table_period)
        entering = t["enter_keys"][t["enter_ptr"][r]:t["enter_ptr"][r + 1]].astype(np.int64) + s
        np.testing.assert_array_equal(entering, np.flatnonzero(first == q), err_msg=f"query {q}")
    counts = np.bincount(first[first >= 0], minlength=n + 1)
    assert cplan.max_entering == max(1, int(counts[1:n].max()) if n > 1 else 0)
    if cplan.plan.refresh:      # the pool holds every candidate alive at one query
        alive = [int(((first >= 0) & (first <= q) & (q <= last)).sum()) for q in range(n)]
        assert cplan.pool_size == max(1, max(alive))
    # the budget in effect: clamped to the most candidates at once over all n queries
    most = max(1, most_candidates(first, last, n))
    budget = cplan.plan.dynamic.budget
    assert cplan.plan.budget == min(budget, most)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=static_plus_h2o(), n=st.sampled_from([64, 128, 192, 256, 320]), refresh=st.booleans())
def test_random_compositions_equal_the_per_token_schedule(case, n, refresh):
    static, budget = case
    # the strategy vouches for a closed-form static part at 64; the runtime refuses table-driven ones
    assume(not static.to_mask(n).any() or not analyze(static, max_len=n).tables)
    check_tables(h2o_on(static, budget, refresh), n)


@pytest.mark.parametrize("name", TABLE1_NAMES)
def test_table1_h2o_tables(name):
    pattern = h2o_on(load_pattern(f"examples/{name}.sas"))
    cplan = dynamic_cache_plan(pattern, 1 << 14)
    assert cplan.table_period > 0 and cplan.table_rows <= 1100, (cplan.table_rows, cplan.table_period)
    check_tables(pattern, 4096)


@pytest.mark.parametrize("name", list(TABLE1_H2O))
def test_small_table1_h2o_tables(name):
    """Table 1's patterns at block sizes of 4-8 (periods up to 16 past the tables' rows)."""
    for n in (96, 256):
        check_tables(h2o_on(TABLE1_H2O[name], 3), n)


def test_budgets_clamped_to_the_region():
    """Window 4 + H2O with a budget of 50: the region holds fewer keys than that before 20 and
    300 tokens (the budget is clamped to the per-token count), and not before 2^20."""
    for n in (20, 300):
        check_tables(h2o_on(Diag(0, 4), 50), n)
    assert dynamic_cache_plan(h2o_on(Diag(0, 4), 50), 1 << 20).plan.budget == 50


@pytest.mark.parametrize("n", [50, 300])
def test_refresh_on_an_expiring_region_uses_the_period(n):
    """refresh=True on a band 4-9 keys back (no key stays): the tables and the pool (every
    candidate alive at once) from the steady window, as per token; also at 2^30."""
    pattern = Diag(0, 4) + Diag(4, 6) * Dynamic(budget=3, refresh=True)
    check_tables(pattern, n)
    cplan = dynamic_cache_plan(pattern, 1 << 30)
    assert cplan.table_period == 1 and cplan.pool_size == dynamic_cache_plan(pattern, 300).pool_size


def test_refresh_and_regions_without_period_keep_per_token_tables():
    # refresh=True on what a window leaves: every old key stays a candidate, the pool grows with n
    cplan = dynamic_cache_plan(h2o_on(Diag(0, 4), budget=3, refresh=True), 200)
    assert cplan.table_period == 0 and cplan.table_rows == 200
    with pytest.raises(PatternError, match="refresh=True keeps every candidate"):
        dynamic_cache_plan(h2o_on(Diag(0, 4), budget=3, refresh=True), SCHEDULE_LIMIT + 1)


@pytest.mark.parametrize("n", [1 << 24, 1 << 30])
def test_long_plans_follow_the_pattern(n):
    """A 1K-slot window + H2O and OpenAI-fixed + H2O at 2^24 and 2^30 tokens: tables of a few
    hundred rows, made in well under a second (2^24 took 1-3 s and 870 MB, 2^30 was refused)."""
    for name in ("sliding_window", "openai_fixed"):
        tracemalloc.start()
        t0 = time.perf_counter()
        cplan = dynamic_cache_plan(h2o_on(load_pattern(f"examples/{name}.sas")), n)
        took = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert cplan.table_rows <= 1100 and cplan.pool_size <= 736
        assert peak < 32 << 20, peak
        assert took < 10, took


def test_lengths_past_int32_are_refused():
    """Keys, positions and region ends are int32 on the device: 2^31 is refused before any work
    (it built, with every region end wrapped negative; found by review)."""
    pattern = h2o_on(Diag(0, 6), 3)
    for make in (lambda: dynamic_cache_plan(pattern, 2 ** 31), lambda: SASAttnKernel(pattern, max_len=2 ** 31)):
        with pytest.raises(PatternError, match="int32"):
            make()
    assert dynamic_cache_plan(pattern, 2 ** 31 - 1).table_rows < 16


@pytest.mark.parametrize("static,region,refresh", [(Diag(0, 6), None, False), (Diag(0, 4), Diag(4, 6), False),
                                                   (Diag(0, 4), Diag(4, 6), True)],
                         ids=["window-forever", "band-expiring", "band-refresh"])
def test_a_billion_token_kernel_decodes_as_a_short_one(static, region, refresh):
    """H2O (budget 3) on what a window leaves (keys kept forever), and on a band 4-9 keys back
    (keys expire), over 40 tokens: the decode steps pass the tables' rows many times, and a
    kernel at max_len 2^30 gives the outputs and held keys of one at max_len 64 and of the plain
    H2O reference."""
    dyn = Dynamic(budget=3, refresh=refresh)
    region = Causal() * ~static if region is None else region
    pattern = static + region * dyn
    N, prefill = 40, 5
    q, k, v = qkv(1, 2, 1, N, 16, seed=3)
    long = N + 96
    R_long = pattern.to_mask(long) & ~static.to_mask(long)
    want, held_log, _ = plain_h2o(static.to_mask(N).tolist(), R_long[:N, :N].tolist(), region_last_use(R_long, N),
                                  dyn.budget, dyn.refresh, q, k, v, prefill)
    want_held = [[[list(t) for t in per_b] for per_b in step] for step in held_log]
    for max_len in (64, 1 << 30):
        ker = SASAttnKernel(pattern, max_len=max_len)
        assert ker.dynamic.cplan.table_rows < 16
        out, held = run_steps(ker, q, k, v, prefill)
        assert held == want_held, max_len
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)


def test_handoff_checked_past_the_boundary():
    """A window of 4; the region takes keys 3j from 4 back and the others from 6 back: key 1
    leaves the static part before the region takes it (refused), whatever the length."""
    region = Diag(4, None) * Rect(stride=(1, 3)) + Diag(6, None)
    for n in (64, 1 << 30):
        with pytest.raises(NotYetSupportedError, match="key 1 becomes a dynamic candidate"):
            dynamic_cache_plan(Diag(0, 4) + region * Dynamic(budget=2), n)


def test_compiled_report_tells_the_region_schedule(tmp_path):
    """report.md of a dynamic package at 2^30 says how the region schedule is stored, and no
    longer offers suffix queries (the dynamic package's prefill takes square prompts only)."""
    from sas.codegen.compile import compile_pattern

    rep = compile_pattern(h2o_on(Diag(0, 6), 3), tmp_path / "k", max_len=1 << 30, head_dim=16)
    assert rep["region_table_period"] == 1 and rep["region_table_rows"] < 16
    md = (tmp_path / "k" / "report.md").read_text()
    assert f"listed for the first {rep['region_table_rows']} keys and queries" in md
    assert "at most 1 key enters per decode step" in md and "build_tiles" not in md
