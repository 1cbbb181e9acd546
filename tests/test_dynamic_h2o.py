"""The H2O policy of sas.dynamic.h2o against an independent step-by-step plain-Python reference
written from docs/dynamic.md (tests/helpers/h2o.py), on random inputs: identical kept key sets,
attended sets and outputs. Covers paper Figure 7a (window + H2O) and the six Table-1 static patterns with H2O on
the region they leave uncovered (paper Table 6: `static + (Causal() * ~static) * Dynamic(...)`),
scaled down."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sas
from sas import Causal, Diag, Dynamic, Rect, ops
from sas.dynamic import H2OState, dynamic_attention_reference, masked_attention, plan_dynamic
from sas.errors import KernelError, NotYetSupportedError, PatternError, SASError

from helpers.attention import qkv
from helpers.examples import EXAMPLES, TABLE1_NAMES
from helpers.h2o import plain_h2o, region_last_use
from helpers.table1 import TABLE1_H2O


def check_against_plain(static, region_pattern, dyn, *, N=28, prefill=10, B=2, Hq=4, Hkv=2, D=8, seed=0,
                        reduce="sum"):
    pattern = static + region_pattern * dyn
    torch.manual_seed(seed)
    q = torch.randn(B, Hq, N, D, dtype=torch.float64)
    k = torch.randn(B, Hkv, N, D, dtype=torch.float64)
    v = torch.randn(B, Hkv, N, D, dtype=torch.float64)
    res = dynamic_attention_reference(pattern, q, k, v, prefill_len=prefill)

    long = N + 96
    S = static.to_mask(N)
    full = pattern.to_mask(long)
    R_long = full & ~static.to_mask(long)
    plain_out, held_log, attended = plain_h2o(S.tolist(), R_long[:N, :N].tolist(),
                                              region_last_use(R_long, N), dyn.budget, dyn.refresh,
                                              q, k, v, prefill, reduce)
    assert res.kept_sets() == held_log
    for b in range(B):
        for h in range(Hkv):
            for i in range(N):
                got = set(torch.nonzero(res.attended[b, h, i]).flatten().tolist())
                assert got == attended[b][h][i], (b, h, i)
    torch.testing.assert_close(res.out, plain_out, rtol=1e-10, atol=1e-10)
    # invariants: attended cells are cells of the oracle; the static part is always attended
    oracle = torch.from_numpy(pattern.to_mask(N))
    assert not (res.attended & ~oracle).any()
    assert (res.attended | ~torch.from_numpy(S)).all()
    if not dyn.refresh:
        for r in res.steps:
            assert int(r.held.sum(-1).max()) <= dyn.budget
        assert any(r.evicted.any() for r in res.steps), "no eviction: the test exercises nothing"
    else:
        R = torch.from_numpy(R_long[:N, :N])
        loaded = (res.attended & R).sum(-1)[..., prefill:]
        assert int(loaded.max()) <= dyn.budget
        assert (R.sum(-1)[prefill:] > dyn.budget).any(), "the budget never binds: the test exercises nothing"
    return res


# --- paper Figure 7a -----------------------------------------------------------------------------

@pytest.mark.parametrize("prefill", [0, 1, 5, 12])
@pytest.mark.parametrize("seed", [0, 1])
def test_fig7a_window_h2o_matches_plain_reference(prefill, seed):
    check_against_plain(Diag(0, 2), Diag(2, 6), Dynamic(budget=2), prefill=prefill, seed=seed)


@pytest.mark.parametrize("refresh", [False, True])
@pytest.mark.parametrize("prefill", [1, 9])
def test_window_plus_unbounded_h2o(refresh, prefill):
    """`Diag(0, W) + Diag(W, None) * Dynamic(...)`: H2O on everything that left the window."""
    check_against_plain(Diag(0, 4), Diag(4, None), Dynamic(budget=3, refresh=refresh), prefill=prefill, seed=3)


def test_max_reduction_matches_plain_reference():
    dyn = Dynamic(budget=3, score=ops.attn_score().max(dim=1))
    check_against_plain(Diag(0, 3), Diag(3, None), dyn, prefill=7, reduce="max", seed=5)


def test_gqa_groups_share_one_selection_per_kv_head():
    res = check_against_plain(Diag(0, 2), Diag(2, None), Dynamic(budget=2), Hq=6, Hkv=2, prefill=4, seed=7)
    assert res.attended.shape[1] == 2


# --- Table 1 patterns with H2O on the uncovered region (paper Table 6), scaled down ---------------

@pytest.mark.parametrize("name", sorted(TABLE1_H2O))
@pytest.mark.parametrize("refresh", [False, True])
def test_table1_static_plus_h2o_matches_plain_reference(name, refresh):
    static = TABLE1_H2O[name]
    check_against_plain(static, Causal() * ~static, Dynamic(budget=3, refresh=refresh), N=26, prefill=9,
                        seed=len(name))


@pytest.mark.parametrize("refresh", [False, True])
def test_static_part_whose_period_passes_the_sequence(refresh):
    """Chunks of 6 plus chunks of 5 have period 30, longer than the 28 tokens here: the plan
    reads the region up to max_len (`Structure.within`); H2O on what the chunks leave uncovered
    still equals the plain reference."""
    static = ((Rect(size=(6, 6)) >> Diag(0, 1)) + (Rect(size=(5, 5)) >> Diag(0, 1))) * Causal()
    check_against_plain(static, Causal() * ~static, Dynamic(budget=3, refresh=refresh), N=28, prefill=9, seed=11)


def test_table1_mask_checks_against_reference_figures():
    """The scaled patterns keep the reference-figures.md definitions (with scaled constants)."""
    n = 40
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    c = i >= j
    want = {
        "streaming_llm": c & ((i - j < 4) | (j < 2)),
        "block_local": c & (i // 4 - j // 4 < 3),
        "sliding_window": c & (i - j < 4),
        "openai_strided": c & ((i - j < 4) | ((i - j) % 4 == 0)),
        "openai_fixed": c & ((i // 8 == j // 8) | (j % 8 >= 6)),
        "strided_block_local": c & (i // 8 == j // 8) & (i % 2 == 0) & (j % 2 == 0),
    }
    for name, p in TABLE1_H2O.items():
        assert (p.to_mask(n) == want[name]).all(), name


# --- semantics checks that need no second implementation --------------------------------------

def test_budget_never_binding_equals_oracle_attention():
    """With a budget no region can exceed, nothing is evicted: attention over pattern.to_mask."""
    N = 20
    pattern = Diag(0, 3) + Diag(3, None) * Dynamic(budget=N)
    q, k, v = qkv(1, 2, 2, N, 4)
    res = dynamic_attention_reference(pattern, q, k, v, prefill_len=6)
    mask = torch.from_numpy(pattern.to_mask(N))[None, None].expand(1, 2, N, N)
    want, _ = masked_attention(q, k, v, mask)
    torch.testing.assert_close(res.out, want, rtol=1e-12, atol=1e-12)
    assert (res.attended == mask).all()


def test_prefill_attends_the_whole_region_then_evicts_to_budget():
    N, P = 16, 10
    pattern = Diag(0, 2) + Diag(2, None) * Dynamic(budget=3)
    q, k, v = qkv(1, 2, 1, N, 4, seed=2)
    res = dynamic_attention_reference(pattern, q, k, v, prefill_len=P)
    oracle = torch.from_numpy(pattern.to_mask(N))
    assert (res.attended[0, 0, :P, :P] == oracle[:P, :P]).all()
    first = res.steps[0]
    assert (first.i0, first.i1) == (0, P)
    assert len(first.held_sets()[0][0]) == 3
    # the kept keys are the 3 candidates with the highest summed prefill probabilities
    mask = oracle[None, None, :P, :P]
    _, probs = masked_attention(q[:, :, :P], k[:, :, :P], v[:, :, :P], mask)
    score = probs.sum(dim=(1, 2))[0]
    cand = [j for j in range(P) if any(pattern.to_mask(N)[i, j] and i - j >= 2 for i in range(P))]
    best = sorted(cand, key=lambda j: (float(score[j]), j), reverse=True)[:3]
    assert first.held_sets()[0][0] == tuple(sorted(best))


def test_evicted_keys_never_return_and_static_cells_stay():
    N = 30
    static = (Diag(0, 3) + Diag(0, None, stride=5)) * Causal()
    pattern = static + (Causal() * ~static) * Dynamic(budget=2)
    q, k, v = qkv(1, 1, 1, N, 4, seed=4)
    res = dynamic_attention_reference(pattern, q, k, v, prefill_len=1)
    gone_at: dict[int, int] = {}       # key -> first query after its eviction
    S = torch.from_numpy(static.to_mask(N))
    for r in res.steps:
        held = set(r.held_sets()[0][0])
        assert not (held & set(gone_at))
        for j in r.evicted_sets()[0][0]:
            gone_at[j] = r.i1
    assert gone_at
    for j, after in gone_at.items():
        for i in range(after, N):
            assert bool(res.attended[0, 0, i, j]) == bool(S[i, j]), (i, j)


def test_refresh_keeps_everything_and_loads_budget_per_decode_step():
    N, P, B_ = 24, 6, 3
    pattern = Diag(0, 2) + Diag(2, None) * Dynamic(budget=B_, refresh=True)
    q, k, v = qkv(1, 1, 1, N, 4, seed=6)
    res = dynamic_attention_reference(pattern, q, k, v, prefill_len=P)
    for r in res.steps:
        assert not r.evicted.any()
    for i in range(P, N):
        dyn_loaded = res.attended[0, 0, i, : max(i - 1, 0)].sum().item()
        assert dyn_loaded == min(B_, max(i - 1, 0))


def test_state_step_by_step_equals_reference_function():
    N = 18
    pattern = Diag(0, 2) + Diag(2, 6) * Dynamic(budget=2)
    q, k, v = qkv(2, 2, 1, N, 4, seed=8)
    res = dynamic_attention_reference(pattern, q, k, v, prefill_len=5)
    st = H2OState(plan_dynamic(pattern), 2, 1)
    outs = [st.step(q[:, :, :5], k[:, :, :5], v[:, :, :5])]
    for i in range(5, N):
        outs.append(st.step(q[:, :, i:i + 1], k[:, :, :i + 1], v[:, :, :i + 1]))
    torch.testing.assert_close(torch.cat(outs, dim=2), res.out)
    assert [r.held_sets() for r in st.records] == res.kept_sets()


def test_state_begin_end_protocol_errors():
    st = H2OState(plan_dynamic(Diag(0, 2) + Diag(2, 6) * Dynamic(budget=2)), 1, 1)
    with pytest.raises(KernelError, match="must start at query 0"):
        st.begin(3, 4)
    sp = st.begin(0, 4)
    with pytest.raises(KernelError, match="not ended"):
        st.begin(4, 5)
    with pytest.raises(KernelError, match=r"scores must be \[B, Hkv, Lk\]"):
        st.end(sp, torch.zeros(1, 1, 3))
    st.end(sp, torch.zeros(1, 1, 4))


def test_external_scores_drive_selection():
    """SpecAttn-style: a draft model's attention supplied from outside decides the kept keys."""
    N, P = 16, 6
    pattern = Diag(0, 2) + Diag(2, None) * Dynamic(budget=2, score=ops.external("draft").sum(dim=1))
    q, k, v = qkv(1, 1, 1, N, 4, seed=9)
    draft = torch.zeros(1, 1, N, N, dtype=torch.float64)
    draft[..., 3] = 1.0                 # the draft model always looks at keys 3 and 5
    draft[..., 5] = 0.5
    res = dynamic_attention_reference(pattern, q, k, v, prefill_len=P, other_inputs={"draft": draft})
    assert res.kept_sets()[-1] == [[(3, 5)]]
    with pytest.raises(KernelError, match="draft"):
        dynamic_attention_reference(pattern, q, k, v, prefill_len=P, other_inputs={})


# --- bad inputs ------------------------------------------------------------------------------------

def test_budget_larger_than_region_is_an_error():
    with pytest.raises(PatternError, match=r"budget=7.*6 candidate keys"):
        plan_dynamic(Diag(0, 2) + Diag(2, 6) * Dynamic(budget=7))
    assert plan_dynamic(Diag(0, 2) + Diag(2, 6) * Dynamic(budget=6)).capacity == 6


@pytest.mark.parametrize("pattern,exc,words", [
    (Diag(0, 4), PatternError, ["no Dynamic"]),
    (Diag(0, 2) + Diag(2, 3) * Dynamic(budget=1) + Diag(5, None) * Dynamic(budget=2),
     NotYetSupportedError, ["2 different Dynamic"]),
    (Diag(0, 2) + ~(Diag(2, None) * Dynamic(budget=2)) * Causal(), PatternError, ["under '~'"]),
    (Rect() * Dynamic(budget=2), PatternError, ["not causal", "Causal()"]),
    (Diag(0, 4) + Diag(0, 2) * Dynamic(budget=2), PatternError, ["region is empty"]),
])
def test_plan_errors(pattern, exc, words):
    with pytest.raises(exc) as info:
        plan_dynamic(pattern)
    assert isinstance(info.value, SASError)
    for w in words:
        assert w in str(info.value)


def test_same_dynamic_twice_is_one_component():
    d = Dynamic(budget=2)
    plan = plan_dynamic(Diag(0, 2) + Diag(2, 3) * d + Diag(5, 2) * d)
    assert plan.dynamic == d


@pytest.mark.parametrize("kwargs,words", [
    ({"q": torch.zeros(1, 2, 8)}, ["q", "4-d"]),
    ({"k": torch.zeros(1, 1, 7, 4)}, ["k", "N=8"]),
    ({"q": torch.zeros(1, 3, 8, 4), "k": torch.zeros(1, 2, 8, 4), "v": torch.zeros(1, 2, 8, 4)}, ["multiple"]),
    ({"prefill_len": 9}, ["prefill_len"]),
    ({"prefill_len": True}, ["prefill_len"]),
])
def test_reference_bad_inputs(kwargs, words):
    args = {"q": torch.zeros(1, 1, 8, 4), "k": torch.zeros(1, 1, 8, 4), "v": torch.zeros(1, 1, 8, 4)}
    prefill = kwargs.pop("prefill_len", 2)
    args.update(kwargs)
    with pytest.raises(KernelError) as info:
        dynamic_attention_reference(Diag(0, 2) + Diag(2, None) * Dynamic(budget=2), args["q"], args["k"],
                                    args["v"], prefill_len=prefill)
    for w in words:
        assert w in str(info.value)


# --- full-size examples: the split and the summary (no attention run) ---------------------------------

@pytest.mark.parametrize("name", TABLE1_NAMES)
def test_full_size_table1_examples_plan(name):
    static = sas.load_pattern(EXAMPLES / f"{name}.py")
    plan = plan_dynamic(static + (Causal() * ~static) * Dynamic(budget=512))
    assert plan.static == static and plan.capacity is None
    text = plan.summary()
    assert "budget=512" in text and "inter-kernel memoization: yes" in text


def test_fig7a_example_file_plan():
    plan = plan_dynamic(sas.load_pattern(EXAMPLES / "fig7a_window_h2o.py"))
    assert plan.static == Diag(0, 2) and plan.capacity == 6
    assert list(plan.region_last_use([0, 1, 10])) == [7, 8, 17]
