"""`sas.plan.make_plan`: one plan per (pattern, max_len, shapes), shared by the runtime,
`compile_pattern` and `sas inspect`; set-up memory that follows the cache size, not max_len;
host tables over max_len checked against the documented limit before they are built."""

from __future__ import annotations

import os
import tracemalloc

import numpy as np
import torch

if not torch.cuda.is_available():  # must precede the first import of triton
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sas import Causal, Diag, Dynamic, Rect, analyze, ops  # noqa: E402
from helpers.attention import DEV  # noqa: E402
from sas.codegen import compile_pattern  # noqa: E402
from sas.codegen.triton_backend import (  # noqa: E402
    DecodeOptions,
    PrefillOptions,
    tiles_per_block,
    attended_fraction,
    auto_prefill_options,
)
from sas.dynamic.cache_plan import dynamic_cache_plan  # noqa: E402
from sas.errors import KernelError, NotYetSupportedError, PatternError  # noqa: E402
from sas.ir.tiles import is_causal, tile_map  # noqa: E402
from sas.limits import format_bytes, host_table_limit  # noqa: E402
from sas.plan import Plan, causal_by_form, causal_within, make_plan  # noqa: E402
from sas.runtime import SASAttnKernel  # noqa: E402
from strategies import patterns  # noqa: E402

STREAMING = (Diag(0, 1024) + Rect(cols=(0, 32))) * Causal()
SMALL_STREAMING = (Diag(0, 24) + Rect(cols=(0, 4))) * Causal()
PO = PrefillOptions(16, 16, 4, 1)


@pytest.fixture(autouse=True, scope="module")
def _cache_dir(tmp_path_factory):
    old = os.environ.get("SAS_CACHE_DIR")
    os.environ["SAS_CACHE_DIR"] = str(tmp_path_factory.mktemp("sas_cache_plan"))
    yield
    if old is None:
        os.environ.pop("SAS_CACHE_DIR", None)
    else:
        os.environ["SAS_CACHE_DIR"] = old


def test_static_plan_holds_the_analysis_and_schedules():
    plan = make_plan(SMALL_STREAMING, 64, head_dim=16, num_heads=4, num_kv_heads=2, dtype=torch.float32)
    a = analyze(SMALL_STREAMING, max_len=64)
    assert plan.causal and plan.can_decode and not plan.is_dynamic
    assert plan.cache_size == a.cache_size == 28 and plan.analysis.source == a.source
    assert (plan.head_dim, plan.num_heads, plan.num_kv_heads, plan.dtype) == (16, 4, 2, "float32")
    s1 = plan.schedule(40, 40)
    assert plan.schedule(40, 40) is s1                       # made once, then cached
    want = tile_map(SMALL_STREAMING, 40, 40, s1.options.block_m, s1.options.block_n, 0)
    got = s1.runs.to_tile_map()
    np.testing.assert_array_equal(got.full_cols, want.full_cols)
    np.testing.assert_array_equal(got.part_cols, want.part_cols)
    assert plan.report()["cache_size"] == 28


def test_non_causal_plan_is_prefill_only():
    plan = make_plan(Diag(-2, 5), 32)
    assert not plan.causal and plan.analysis is None and not plan.can_decode
    with pytest.raises(KernelError, match="not causal"):
        plan.require_decode("decode")
    with pytest.raises(KernelError, match="not causal"):
        plan.cache_size


def test_dynamic_plan_holds_split_and_layout():
    p = Diag(0, 4) + Diag(4, None) * Dynamic(budget=3)
    plan = make_plan(p, 64)
    assert plan.is_dynamic and plan.split.static == Diag(0, 4) and plan.dynamic.static_size == 4
    assert plan.cache_size == plan.dynamic.cache_size
    assert plan.prefill_pattern == plan.split.full
    # a region that starts after the static part lets its keys go: no layout, the reason kept
    gap = make_plan(Diag(0, 2) + Diag(5, None) * Dynamic(budget=2), 64)
    assert gap.dynamic is None and isinstance(gap.dynamic_error, NotYetSupportedError)
    with pytest.raises(NotYetSupportedError, match="static part"):
        gap.require_decode("SASAttnKernel")


@pytest.mark.parametrize("kwargs,match", [
    ({"max_len": 0}, "max_len"), ({"head_dim": -1}, "head_dim"), ({"num_heads": 6, "num_kv_heads": 4}, "num_kv_heads"),
    ({"dtype": "int8"}, "dtype"), ({"prefill_options": "64"}, "prefill_options"),
])
def test_make_plan_argument_errors(kwargs, match):
    max_len = kwargs.pop("max_len", 64)
    with pytest.raises(KernelError, match=match):
        make_plan(SMALL_STREAMING, max_len, **kwargs)
    with pytest.raises(PatternError, match="pattern"):
        make_plan("Diag(0, 4)", 64)  # type: ignore[arg-type]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=patterns(3), n=st.integers(1, 90))
def test_causal_within_matches_the_tile_check(p, n):
    assert causal_within(p, n) == is_causal(p, n) == (not np.triu(p.to_mask(n), 1).any())


def test_kernel_and_compile_take_the_plan(tmp_path):
    plan = make_plan(SMALL_STREAMING, 64, prefill_options=PO, decode_options=DecodeOptions(16, 4, 1))
    ker = SASAttnKernel(plan=plan)
    assert ker.plan is plan and ker.cache_size == 28 and ker.analysis is plan.analysis
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 20, 16, generator=g).to(DEV) for _ in range(3))
    ker.prefill(q, k, v)
    # the runtime used the plan's cache: the square schedule of 20 tokens and its periodic form
    assert len(plan.schedules) == 2
    rep = compile_pattern(SMALL_STREAMING, tmp_path / "out", plan=plan, head_dim=16, dtype="float32")
    assert rep["cache_size"] == 28 and rep["prefill"]["block_m"] == 16
    with pytest.raises(KernelError, match="max_len"):
        SASAttnKernel(plan=plan, max_len=32)
    with pytest.raises(KernelError, match="make_plan"):
        SASAttnKernel(plan=plan, prefill_options=PO)
    with pytest.raises(KernelError, match="plan's pattern"):
        SASAttnKernel(Diag(0, 4), plan=plan)
    with pytest.raises(KernelError, match="plan"):
        SASAttnKernel(plan="plan")  # type: ignore[arg-type]


def test_compile_takes_the_shapes_the_plan_was_made_for(tmp_path):
    plan = make_plan(SMALL_STREAMING, 64, head_dim=64, num_heads=4, num_kv_heads=2, dtype="float32")
    rep = compile_pattern(SMALL_STREAMING, tmp_path / "a", plan=plan)
    assert (rep["head_dim"], rep["dtype"], rep["num_heads"], rep["num_kv_heads"]) == (64, "float32", 4, 2)
    rep = compile_pattern(SMALL_STREAMING, tmp_path / "b", plan=plan, head_dim=64, dtype=torch.float32)
    assert (rep["head_dim"], rep["dtype"]) == (64, "float32")          # the same shapes, given again
    for kwargs, name in (({"head_dim": 128}, "head_dim"), ({"dtype": "bf16"}, "dtype"),
                         ({"num_heads": 8}, "num_heads"), ({"num_kv_heads": 4}, "num_kv_heads")):
        with pytest.raises(KernelError, match=f"{name}=.* but the plan was made for {name}="):
            compile_pattern(SMALL_STREAMING, tmp_path / "c", plan=plan, **kwargs)
        assert not (tmp_path / "c").exists()                                  # refused before any work
    with pytest.raises(KernelError, match="unsupported dtype 'int8'"):
        compile_pattern(SMALL_STREAMING, tmp_path / "c", plan=plan, dtype="int8")
    kv_only = make_plan(SMALL_STREAMING, 64, num_kv_heads=4)                # heads = KV heads (a review finding)
    rep = compile_pattern(SMALL_STREAMING, tmp_path / "e", plan=kv_only)
    assert (rep["num_heads"], rep["num_kv_heads"]) == (4, 4)
    bare = make_plan(SMALL_STREAMING, 64)                                   # no shapes: the defaults
    rep = compile_pattern(SMALL_STREAMING, tmp_path / "d", plan=bare)
    assert (rep["head_dim"], rep["dtype"], rep["num_heads"], rep["num_kv_heads"]) == (128, "bfloat16", 1, 1)


def test_plans_analyses_and_kernels_copy_and_pickle(tmp_path):
    """copy.deepcopy and pickle of a plan (its analysis's synthesized functions are compiled
    again from their AST; the schedule cache starts empty), and of an SASAttnKernel (built again
    from its plan, with a copy of a static pattern's cache). Before, both failed (a thread lock;
    functions made by exec). A Dynamic kernel that holds a sequence is refused: its selection
    state is not copied."""
    import copy
    import io
    import pickle

    plan = make_plan(SMALL_STREAMING, 64, head_dim=16)
    plan.schedule(40)
    for twin in (copy.deepcopy(plan), pickle.loads(pickle.dumps(plan))):
        a, b = twin.analysis, plan.analysis
        assert twin.cache_size == plan.cache_size and len(twin.schedules) == 0 and twin.head_dim == 16
        assert a.cache_id_func is not b.cache_id_func
        assert all(a.cache_id_func(t) == b.cache_id_func(t) for t in range(64))
        assert all(a.mask_func(s, t) == b.mask_func(s, t) for s in range(28) for t in range(64))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 20, 16, generator=g).to(DEV) for h in (2, 1, 1))
    q1, k1, v1 = (torch.randn(1, h, 1, 16, generator=g).to(DEV) for h in (2, 1, 1))
    ker = SASAttnKernel(plan=plan)
    ker.prefill(q, k, v)
    twin = copy.deepcopy(ker)
    buf = io.BytesIO()
    torch.save(ker, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert twin.k_cache is not ker.k_cache and torch.equal(twin.k_cache, ker.k_cache)
    step = ker.decode(q1, k1, v1)
    assert torch.equal(twin.decode(q1, k1, v1), step) and torch.equal(loaded.decode(q1, k1, v1), step)
    torch_ker = SASAttnKernel(plan=plan, backend="torch")
    assert copy.deepcopy(torch_ker.runtime).plan is not None                 # the StaticRuntime protocol's plan
    dyn = SASAttnKernel(Diag(0, 4) + Diag(4, None) * Dynamic(budget=3, score=ops.attn_score().sum(dim=1)),
                        max_len=64)
    fresh = copy.deepcopy(dyn)                               # before a prompt: a copy
    assert torch.equal(fresh.prefill(q, k, v), dyn.prefill(q, k, v))
    with pytest.raises(NotYetSupportedError, match="selection state is not copied"):
        copy.deepcopy(dyn)
    dyn.reset()
    assert copy.deepcopy(dyn).dynamic is not dyn.dynamic


def test_attended_fraction_is_the_oracle_row_over_the_cache():
    for p, n in ((SMALL_STREAMING, 200), ((Rect(size=(16, 16)) >> Diag(0, 1)) * Rect(stride=4) * Causal(), 256)):
        a = analyze(p, max_len=n)
        rows = np.unique(np.linspace(max(0, n - 1 - n // 4), n - 1, 8).astype(np.int64))
        want = np.mean(p.to_mask(n)[rows].sum(axis=1) / a.cache_size)
        assert attended_fraction(a) == pytest.approx(want)


def test_sampled_launch_choice_agrees_with_exact_counts():
    """Beyond 256 query blocks the tile counts are sampled; the decision matches the exact one."""
    table1 = [STREAMING, Causal(), Diag(0, 4096), (Diag(0, 512) + Diag(0, None, stride=512)) * Causal(),
              (Rect(size=(256, 256)) >> Diag(0, 1)) * Rect(stride=4) * Causal()]
    n = 1 << 15
    for p in table1:
        got = auto_prefill_options(p, n)
        exact = {bn: tile_map(p, n, n, 64, bn) for bn in (64, 32)}
        per = (exact[64].num_full + exact[64].num_partial) / exact[64].num_q_blocks
        narrow = (exact[32].num_full + exact[32].num_partial) * 64 * 32
        want = (PrefillOptions(64, 32, 4, 3) if narrow < 0.9 * per * exact[64].num_q_blocks * 64 * 64 or per < 8
                else PrefillOptions(128, 128, 8, 3) if per >= 64 else PrefillOptions(64, 64, 4, 3))
        assert got == want, p
        assert tiles_per_block(p, n, n, 64, 64) == pytest.approx(per, rel=0.1)


def test_streaming_at_4m_tokens_sets_up_in_cache_sized_memory():
    """SASAttnKernel(streaming, max_len=2**22): no table over the 4M positions (the cache has
    1056 slots); numpy allocations stay far below one byte per position."""
    tracemalloc.start()
    try:
        ker = SASAttnKernel(STREAMING, max_len=1 << 22)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ker.cache_size == 1056 and ker.plan.causal
    assert peak < 64 << 20, format_bytes(peak)
    assert ker.plan.decode_config(1).skip_mode is None


def test_compile_streaming_at_1m_tokens(tmp_path):
    """`sas compile --max-len 1M` of streaming: the tile schedule is stored as runs (about 65K,
    under a MB) and built without a table over all 2^28 tiles."""
    tracemalloc.start()
    try:
        rep = compile_pattern(STREAMING, tmp_path / "s1m", max_len=1 << 20, head_dim=64)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert rep["cache_size"] == 1056
    assert rep["prefill"]["plan_file_bytes"] < 2 << 20
    assert peak < 512 << 20, format_bytes(peak)
    t = rep["prefill"]["tiles"]
    assert t["total"] == (1 << 20) // rep["prefill"]["block_m"] * ((1 << 20) // rep["prefill"]["block_n"])


def test_host_tables_over_the_limit_are_refused_first(monkeypatch):
    monkeypatch.setenv("SAS_HOST_TABLE_LIMIT", "1M")
    assert host_table_limit() == 1 << 20
    # refresh=True counts its candidates per token: its region schedule spans max_len
    h2o = Diag(0, 64) + Diag(64, None) * Dynamic(budget=8, refresh=True)
    with pytest.raises(KernelError, match=r"region schedule .* max_len=65536 .*SAS_HOST_TABLE_LIMIT"):
        dynamic_cache_plan(h2o, 1 << 16)
    with pytest.raises(KernelError, match="MiB"):
        SASAttnKernel(h2o, max_len=1 << 16)
    # without refresh the schedule lists the region's first 65 keys and its period
    assert dynamic_cache_plan(Diag(0, 64) + Diag(64, None) * Dynamic(budget=8), 1 << 16).table_rows == 65
    monkeypatch.setenv("SAS_HOST_TABLE_LIMIT", "lots")
    with pytest.raises(KernelError, match="SAS_HOST_TABLE_LIMIT"):
        host_table_limit()


def test_plan_is_frozen():
    plan = make_plan(SMALL_STREAMING, 64)
    assert isinstance(plan, Plan)
    with pytest.raises(AttributeError):
        plan.max_len = 32  # type: ignore[misc]


@settings(max_examples=80, deadline=None)
@given(p=patterns(3), n=st.integers(1, 60))
def test_causal_by_form_is_sound(p, n):
    """A pattern the tree calls causal attends no key above the diagonal (the check that lets
    `causal_within` skip its per-column pass: 16-47 s at 2^30 tokens before a refusal)."""
    if causal_by_form(p):
        assert not np.triu(p.to_mask(n), 1).any()
    assert causal_by_form(p * Causal()) and causal_by_form(Diag(2, 3) + Diag(0, 4) * p)
    assert not causal_by_form(Diag(-1, 3) + Causal())
