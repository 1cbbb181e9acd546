"""The dynamic runtime's Triton kernels (prefill with memoized scores, decode with the static
segment + pool, the update kernel) against the independent plain-Python H2O reference of
tests/helpers/h2o.py, on the CPU under TRITON_INTERPRET=1: same outputs, and exactly the
same held key set after every step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sas import Causal, Diag, Dynamic, Rect, ops
from sas.dynamic import dynamic_attention_reference
from sas.dynamic.cache_plan import dynamic_cache_plan, fused_score
from sas.errors import KernelError, NotYetSupportedError, SASError
from sas.runtime import SASAttnKernel, dynamic_host

from helpers.attention import DEV, qkv
from helpers.h2o import plain_h2o, region_last_use
from helpers.table1 import TABLE1_H2O
from strategies import static_plus_h2o

pytestmark = pytest.mark.kernels


def run_steps(ker, q, k, v, prefill, *, dtype=torch.float32):
    """`ker`'s prefill of `prefill` tokens, then one decode step per remaining token; returns the
    outputs [B, Hq, N, D] (float64, on the CPU) and the held key sets after each step (as the
    reference's records)."""
    cast = lambda t: t.to(dtype).to(DEV)  # noqa: E731
    outs = [ker.prefill(cast(q[:, :, :prefill]), cast(k[:, :, :prefill]), cast(v[:, :, :prefill]))]
    held = [ker.dynamic.held_keys()]
    for i in range(prefill, q.shape[2]):
        outs.append(ker.decode(cast(q[:, :, i:i + 1]), cast(k[:, :, i:i + 1]), cast(v[:, :, i:i + 1])))
        held.append(ker.dynamic.held_keys())
    return torch.cat(outs, dim=2).double().cpu(), held


def run_kernel(pattern, q, k, v, prefill, *, dtype=torch.float32, max_len=64, other_inputs=None):
    """`run_steps` on a new kernel of `pattern`; returns its outputs, held key sets and the kernel."""
    ker = SASAttnKernel(pattern, other_inputs=other_inputs, max_len=max_len)
    return (*run_steps(ker, q, k, v, prefill, dtype=dtype), ker)


def check(static, region, dyn, *, N=26, prefill=9, B=1, Hq=4, Hkv=2, D=16, seed=0, prepare=None):
    """The kernel of `static + region * dyn` against the plain H2O reference: the same outputs
    and held key sets after every step. `prepare(kernel)`, if given, runs before the prompt."""
    pattern = static + region * dyn
    q, k, v = qkv(B, Hq, Hkv, N, D, seed=seed)
    long = N + 96
    S = static.to_mask(N)
    full = pattern.to_mask(long)
    R_long = full & ~static.to_mask(long)
    want_out, held_log, _ = plain_h2o(S.tolist(), R_long[:N, :N].tolist(), region_last_use(R_long, N),
                                      dyn.budget, dyn.refresh, q, k, v, prefill)
    ker = SASAttnKernel(pattern, max_len=64)
    if prepare is not None:
        prepare(ker)
    got_out, held = run_steps(ker, q, k, v, prefill)
    want_held = [[[list(t) for t in per_b] for per_b in step] for step in held_log]
    assert held == want_held
    torch.testing.assert_close(got_out, want_out, rtol=1e-4, atol=1e-4)
    return ker


# both refresh modes and both prompt lengths, in two of the four pairings (the Table-1 + H2O cases
# below run both modes again)
@pytest.mark.parametrize("refresh,prefill", [(True, 1), (False, 9)])
def test_window_plus_h2o(refresh, prefill):
    ker = check(Diag(0, 4), Diag(4, None), Dynamic(budget=3, refresh=refresh), prefill=prefill, seed=prefill)
    assert ker.dynamic.cplan.static_size == 4


def test_h2o_alone_every_key_a_candidate_at_once():
    # the static part is empty: each new key goes straight to the pool
    pattern = Causal() * Dynamic(budget=5)
    q, k, v = qkv(2, 4, 2, 24, 16, seed=3)
    N, P = 24, 7
    R = pattern.to_mask(N + 96)
    want_out, held_log, _ = plain_h2o(np.zeros((N, N), bool).tolist(), R[:N, :N].tolist(),
                                      region_last_use(R, N), 5, False, q, k, v, P)
    got_out, held, ker = run_kernel(pattern, q, k, v, P)
    assert ker.dynamic.cplan.static_size == 0
    assert held == [[[list(t) for t in per_b] for per_b in step] for step in held_log]
    torch.testing.assert_close(got_out, want_out, rtol=1e-4, atol=1e-4)


def test_bounded_region_expires_keys():
    # Fig. 7a: keys leave the region 6 queries after they entered it
    check(Diag(0, 2), Diag(2, 6), Dynamic(budget=2), N=24, prefill=5, seed=11)


def test_many_keys_entering_at_once_are_copied_in_several_chunks():
    """Blocks of 20: at each block's end its 20 keys enter the pool at once, more than the update
    kernel's 16 keys a chunk, so their K/V rows are copied in two chunks (and evicted down to the
    budget at the next step)."""
    static = (Rect(size=(20, 20)) >> Diag(0, 1)) * Causal()
    ker = check(static, Causal() * ~static, Dynamic(budget=3), N=46, prefill=9, B=1, Hq=2, Hkv=1, seed=5)
    assert ker.dynamic.cplan.max_entering > 16


@pytest.mark.parametrize("name", sorted(TABLE1_H2O))
@pytest.mark.parametrize("refresh", [False, True])
def test_table1_static_plus_h2o(name, refresh):
    """Paper Table 6: each Table-1 pattern plus H2O on the region it leaves uncovered."""
    static = TABLE1_H2O[name]
    # one batch and one KV head (a group of 2 query heads): the patterns are the point here;
    # batches are covered by the chain and bf16 tests, several KV heads by those and the window tests
    check(static, Causal() * ~static, Dynamic(budget=3, refresh=refresh), N=26, prefill=9, B=1, Hq=2, Hkv=1,
          seed=len(name))


def test_static_part_whose_period_passes_max_len():
    """Chunks of 9 plus chunks of 8 (period 72) under max_len 64: the kernel's plan reads the
    region up to max_len (`Structure.within`) and still equals the plain H2O reference."""
    static = ((Rect(size=(9, 9)) >> Diag(0, 1)) + (Rect(size=(8, 8)) >> Diag(0, 1))) * Causal()
    check(static, Causal() * ~static, Dynamic(budget=3), N=26, prefill=9, B=1, Hq=2, Hkv=1, seed=4)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=static_plus_h2o(), refresh=st.booleans(), prefill=st.integers(1, 12), seed=st.integers(0, 99))
def test_random_static_plus_h2o(case, refresh, prefill, seed):
    """Random compositions of every primitive and operator as the static part, H2O on what
    they leave uncovered (paper Table 6's construction); the strategy draws only patterns and
    budgets the runtime accepts (a budget within the region's candidate count, closed-form
    static analysis), so every example runs."""
    static, budget = case
    check(static, Causal() * ~static, Dynamic(budget=budget, refresh=refresh), N=26, prefill=prefill, B=1, Hq=2,
          Hkv=1, seed=seed)


def test_mha_whole_static_blocks_skip_the_pool_logic():
    """One query head a KV head (MHA: the attention's CUDA-core loop) in 8-slot blocks over a
    16-slot static part (sinks + window) and a pool: the first two blocks are whole static
    blocks, which run `_attend_static_block` (no pool loads, no region test), the rest run
    `_attend_block`; outputs and held keys equal the plain H2O reference."""
    static = Diag(0, 12) + Rect(cols=(0, 4)) * Causal()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dynamic_host, "attend_block_n", lambda *args: 8)
        for prefill in (3, 30):
            ker = check(static, Causal() * ~static, Dynamic(budget=5), N=48, prefill=prefill, B=2, Hq=2, Hkv=2,
                        seed=prefill)
            assert ker.dynamic.cplan.static_size == 16 and ker.dynamic.rt.state.block_n == 8


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=static_plus_h2o(), refresh=st.booleans(), prefill=st.integers(1, 12), seed=st.integers(0, 99))
def test_random_static_plus_h2o_mha(case, refresh, prefill, seed):
    """As `test_random_static_plus_h2o` with one query head a KV head (MHA) and 8-slot attention
    blocks, so that static parts of 8 slots or more also run the MHA loop's whole static
    blocks (`_attend_static_block`)."""
    static, budget = case
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dynamic_host, "attend_block_n", lambda *args: 8)
        check(static, Causal() * ~static, Dynamic(budget=budget, refresh=refresh), N=26, prefill=prefill, B=1,
              Hq=2, Hkv=2, seed=seed)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=static_plus_h2o(), refresh=st.booleans(), prefill=st.integers(1, 12), seed=st.integers(0, 99))
def test_random_static_plus_h2o_mha_through_the_dot_loop(case, refresh, prefill, seed):
    """One query head a KV head with `MHA_DOT` on: the attention runs the query groups' `tl.dot`
    loop (no per-block branch, the new token's slots outside the tiles) over the row padded to
    16, in 16-slot blocks; outputs and held keys equal the plain H2O reference."""
    static, budget = case
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dynamic_host, "MHA_DOT", True)
        mp.setattr(dynamic_host, "attend_block_n", lambda *args: 16)
        loops, stages = [], dynamic_host.attend_stages    # which loop each attention launch took
        mp.setattr(dynamic_host, "attend_stages",
                   lambda use_dot, dtype: loops.append(use_dot) or stages(use_dot, dtype))
        check(static, Causal() * ~static, Dynamic(budget=budget, refresh=refresh), N=26, prefill=prefill,
              B=1, Hq=2, Hkv=2, seed=seed)
        assert loops and all(loops)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=static_plus_h2o(), prefill=st.integers(1, 12), seed=st.integers(0, 99))
def test_random_static_plus_h2o_with_block_flags_forced(case, prefill, seed):
    """As above (two KV heads of one query head each), with the attention's per-step block flags
    forced on for every random static part: 8-slot attention blocks, a flag per 4 slots,
    `FLAGS_FROM_BLOCKS` 1 and `STATIC_SPARSE` set (at the test's sizes they are otherwise off).
    The flags kernel marks the ranges with an attended static slot or a pool slot, the attention
    skips blocks without one and the update kernel's score pass reads no raw score under a 0
    flag. Skipping is exact for any static part, so outputs and held keys still equal the plain
    H2O reference. (Whether a draw leaves blocks unflagged depends on its static part: under the
    derandomized draws 44 of 64 flagged steps did; `test_static_block_flags_skip_unattended_
    blocks_exactly` asserts skipping on a hand-picked pattern.)"""
    static, budget = case

    def force_flags(ker):
        mp.setattr(ker.dynamic.mod, "STATIC_SPARSE", True)
        mp.setattr(ker.dynamic.mod, "FLAG_N", 4)
        mp.setattr(ker.dynamic.mod, "FLAGS_FROM_BLOCKS", 1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dynamic_host, "attend_block_n", lambda *args: 8)
        ker = check(static, Causal() * ~static, Dynamic(budget=budget), N=26, prefill=prefill, B=1, Hq=2, Hkv=2,
                    seed=seed, prepare=force_flags)
        assert ker.dynamic.rt.state.skip_flags == (ker.dynamic.cplan.static_size > 0)


def test_max_reduction_and_epilogue_fused():
    score = ops.attn_score().max(dim=1) * 2.0 + 0.5
    pattern = Diag(0, 4) + Diag(4, None) * Dynamic(budget=3, score=score)
    assert fused_score(dynamic_cache_plan(pattern, 64).plan.score) is not None
    q, k, v = qkv(1, 4, 2, 22, 16, seed=5)
    res = dynamic_attention_reference(pattern, q, k, v, prefill_len=6)
    got, held, _ = run_kernel(pattern, q, k, v, 6)
    assert held == [[[list(t) for t in per_b] for per_b in r.held_sets()] for r in res.steps]
    torch.testing.assert_close(got, res.out, rtol=1e-4, atol=1e-4)


class _Launches:
    """A kernel whose launches are counted (`kernel[grid](...)` still runs it)."""

    def __init__(self, kernel):
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


@pytest.mark.parametrize("pattern", [
    Diag(0, 5) + Diag(5, None) * Dynamic(budget=3),
    Diag(0, 5) + Diag(5, None) * Dynamic(budget=3, score=ops.attn_score().max(dim=1) * 2.0 + 0.5),
    Diag(0, 3) + Diag(3, 9) * Dynamic(budget=2),         # keys leave the region: expiry
], ids=["sum", "max-epilogue", "bounded-region"])
def test_score_pass_over_slot_blocks_equals_the_reference(monkeypatch, pattern):
    """From SPLIT_SCORE_FROM cache slots on, step 1 of the update (the score accumulation) runs
    in the score kernel, one program per SCORE_SLOTS slots, before the update kernel. Forced
    here on small caches with 4-slot programs (several per KV head, a ragged last one): batch
    2, two KV heads of two query heads, the summed and the max-reduced chain with an epilogue, a
    region keys leave (expired after the split score pass); held keys and outputs equal the
    reference."""
    monkeypatch.setattr(dynamic_host, "SPLIT_SCORE_FROM", 0)
    monkeypatch.setattr(dynamic_host, "SCORE_SLOTS", 4)
    q, k, v = qkv(2, 4, 2, 22, 16, seed=8)
    ker = SASAttnKernel(pattern, max_len=64)
    ker.dynamic.rt.graphs = False       # every step launches (on CUDA a graph would replay one capture)
    launches = _Launches(ker.dynamic.mod.SCORE_KERNEL)
    monkeypatch.setattr(ker.dynamic.mod, "SCORE_KERNEL", launches)
    total = ker.dynamic.mod.TOTAL
    assert total > 4 and total % 4 != 0
    res = dynamic_attention_reference(pattern, q, k, v, prefill_len=6)
    got, held = run_steps(ker, q, k, v, 6)
    assert launches.grids == [(-(-total // 4), 4)] * 16       # every decode step, 2 x 2 KV heads
    assert held == [[[list(t) for t in per_b] for per_b in r.held_sets()] for r in res.steps]
    torch.testing.assert_close(got, res.out, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("heads, split_score, merged", [
    (2, False, True), (2, True, True), (4, False, False), (4, True, "forced")],
    ids=["mha-update-kernel", "mha-score-kernel", "gqa-combine-launch", "gqa-score-kernel-forced"])
def test_attention_splits_are_merged_after_the_attention(monkeypatch, heads, split_score, merged):
    """A step (`dynamic_host.step`) merges the attention's splits into the output in a combine
    launch, or where `merges_after` (MHA) in the kernel after the attention: the update kernel
    (one program per KV head), or with the score pass in the score kernel (SPLIT_SCORE_FROM
    forced to 0, 4-slot programs) its first program of each KV head; `forced`: a GQA group of
    two rows merged there. 16-slot attention blocks over a 26-slot cache give two splits; batch
    2, two KV heads, 8 steps; outputs and held keys equal the reference at every step, and the combine
    kernel runs only where nothing merges after the attention."""
    monkeypatch.setattr(dynamic_host, "attend_block_n", lambda *args: 16)
    if split_score:
        monkeypatch.setattr(dynamic_host, "SPLIT_SCORE_FROM", 0)
        monkeypatch.setattr(dynamic_host, "SCORE_SLOTS", 4)
    if merged == "forced":
        monkeypatch.setattr(dynamic_host, "merges_after", lambda state: True)
    pattern = Diag(0, 20) + Diag(20, None) * Dynamic(budget=5)
    q, k, v = qkv(2, heads, 2, 32, 16, seed=12)
    res = dynamic_attention_reference(pattern, q, k, v, prefill_len=24)
    ker = SASAttnKernel(pattern, max_len=64)
    ker.dynamic.rt.graphs = False       # every step launches (on CUDA a graph would replay one capture)
    launches = _Launches(ker.dynamic.mod.COMBINE_KERNEL)
    monkeypatch.setattr(ker.dynamic.mod, "COMBINE_KERNEL", launches)
    got, held = run_steps(ker, q, k, v, 24)
    assert ker.dynamic.rt.state.num_splits == 2
    assert len(launches.grids) == (0 if merged else 8)
    assert held == [[[list(t) for t in per_b] for per_b in r.held_sets()] for r in res.steps]
    torch.testing.assert_close(got, res.out, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("score", [
    ops.attn_score().sum(dim=1).pooling(3, "max"),          # pooling: a second kernel, torch path
    ops.attn_score().mean(dim=1).topk(2),                    # top-k vote
    ops.attn_score().sum(dim=1).sum(dim=0),                  # shared by every KV head
])
def test_general_chains_run_their_traced_graph(score):
    pattern = Diag(0, 4) + Diag(4, None) * Dynamic(budget=3, score=score)
    assert fused_score(dynamic_cache_plan(pattern, 64).plan.score) is None
    q, k, v = qkv(2, 4, 2, 22, 16, seed=6)
    res = dynamic_attention_reference(pattern, q, k, v, prefill_len=7)
    got, held, _ = run_kernel(pattern, q, k, v, 7)
    assert held == [[[list(t) for t in per_b] for per_b in r.held_sets()] for r in res.steps]
    torch.testing.assert_close(got, res.out, rtol=1e-4, atol=1e-4)


def test_external_scores_from_other_inputs():
    N = 20
    draft = torch.rand(1, 2, N, N, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    pattern = Diag(0, 3) + Diag(3, None) * Dynamic(budget=2, score=ops.external("draft").sum(dim=1))
    q, k, v = qkv(1, 2, 1, N, 16, seed=2)
    res = dynamic_attention_reference(pattern, q, k, v, prefill_len=5, other_inputs={"draft": draft})
    got, held, _ = run_kernel(pattern, q, k, v, 5, other_inputs={"draft": draft.float().to(DEV)})
    assert held == [[[list(t) for t in per_b] for per_b in r.held_sets()] for r in res.steps]
    torch.testing.assert_close(got, res.out, rtol=1e-4, atol=1e-4)


def test_bf16_gqa_batch_head_dim_64():
    pattern = (Diag(0, 8) + Rect(cols=(0, 2))) * Causal()
    pattern = pattern + (Causal() * ~pattern) * Dynamic(budget=6)
    q, k, v = qkv(2, 4, 2, 24, 64, seed=9)
    res = dynamic_attention_reference(pattern, q.bfloat16().double(), k.bfloat16().double(),
                                      v.bfloat16().double(), prefill_len=12)
    got, held, ker = run_kernel(pattern, q, k, v, 12, dtype=torch.bfloat16)
    assert (got - res.out).abs().max() < 3e-2
    assert ker.cache_size == ker.dynamic.cplan.static_size + ker.dynamic.cplan.pool_size
    assert ker.kv_cache_bytes() < ker.dense_kv_cache_bytes()


def test_bf16_gqa_attends_in_128_slot_blocks():
    """A GQA group in bf16 attends in GROUP_BLOCK_N (128) slot blocks: a cache of two blocks
    (a window of 140 static slots and a pool), every split of them, equals the reference."""
    pattern = Diag(0, 140) + Diag(140, None) * Dynamic(budget=20)
    q, k, v = qkv(1, 4, 2, 196, 32, seed=10)
    res = dynamic_attention_reference(pattern, q.bfloat16().double(), k.bfloat16().double(),
                                      v.bfloat16().double(), prefill_len=180)
    got, _, ker = run_kernel(pattern, q, k, v, 180, dtype=torch.bfloat16, max_len=256)
    state = ker.dynamic.rt.state
    assert state.block_n == dynamic_host.GROUP_BLOCK_N == 128
    assert ker.dynamic.mod.TOTAL > 128 and state.num_splits == 2
    assert (got - res.out).abs().max() < 3e-2


def test_attention_block_follows_heads_dtype_and_shared_memory(monkeypatch):
    """32-slot blocks for MHA; GROUP_BLOCK_N for a bf16 / fp16 group where the GPU's shared
    memory holds two stages of its K and V tiles (a 228 KB H100 at head dim 128, a 100 KB GPU at
    head dim 64), the module's 64 otherwise (a 100 KB GPU at head dim 128, fp32)."""
    kern = SASAttnKernel(Diag(0, 4) + Diag(4, None) * Dynamic(budget=3), max_len=64).dynamic.mod
    assert kern.BLOCK_N == 64

    class Props:
        def __init__(self, kib):
            self.shared_memory_per_multiprocessor = kib * 1024

    class OldProps:              # a torch without the field: judged by the compute capability
        def __init__(self, major, minor):
            self.major, self.minor = major, minor

    def on(kib, heads, d, dtype):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: Props(kib))
        return dynamic_host.attend_block_n(kern, heads, 2, d, dtype, "cuda")

    assert on(228, 2, 128, torch.bfloat16) == 32
    assert on(228, 8, 128, torch.bfloat16) == on(100, 8, 64, torch.float16) == 128
    assert on(100, 8, 128, torch.bfloat16) == on(228, 8, 128, torch.float32) == 64
    assert dynamic_host.attend_block_n(kern, 8, 2, 128, torch.bfloat16, "cpu") == 128
    for cap, want in (((9, 0), 128), ((8, 0), 128), ((8, 6), 64)):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev, cap=cap: OldProps(*cap))
        assert dynamic_host.attend_block_n(kern, 8, 2, 128, torch.bfloat16, "cuda") == want


def test_split_rule_one_wave_for_query_groups():
    """A query group (tl.dot) with GROUP_ONE_WAVE_FROM or more programs a split takes as many
    splits as fill one wave of 2 programs an SM; one query row, and a group of fewer programs,
    keep the rule of at least 2 programs an SM and at most 2 blocks a program (capped at 128).
    129 blocks of 128 slots (OpenAI-strided at 16K + a 513-slot pool), 132 SMs."""
    from types import SimpleNamespace
    kern = SimpleNamespace(TOTAL=16386, BLOCK_N=64)

    def rule(batch, kv_heads, group, block_n=128):
        return dynamic_host.num_splits_for(kern, batch, kv_heads, block_n=block_n, group=group, num_sms=132)

    assert dynamic_host.GROUP_ONE_WAVE_FROM == 16
    assert [rule(b, 8, 4) for b in (2, 4, 8, 16, 64)] == [16, 8, 4, 2, 1]          # 264 // (8 b)
    assert rule(1, 8, 4) == 65                                                       # 8 programs: ceil(129 / 2)
    assert rule(16, 8, 1) == 65 and rule(64, 8, 1) == 65                             # one row: ceil(129 / 2)
    assert rule(1, 64, 1, block_n=32) == 128                                         # 513 blocks, the cap
    assert rule(2, 8, 4, block_n=2048) == 9                                          # no more splits than blocks
    # the runtime's state: 2 blocks of 128 slots for a group, 6 of 32 for one row
    mod = SASAttnKernel(Diag(0, 140) + Diag(140, None) * Dynamic(budget=20), max_len=256).dynamic.mod
    assert -(-mod.TOTAL // 128) == 2 and -(-mod.TOTAL // 32) == 6
    for (b, h, hk), want in (((70, 8, 2), (128, 1)), ((1, 8, 2), (128, 2)), ((70, 2, 2), (32, 3))):
        st = dynamic_host.State(mod, b, h, hk, 16, torch.bfloat16, "cpu")
        assert (st.block_n, st.num_splits) == want, (b, h, hk)


# --- errors -----------------------------------------------------------------------------------

def test_caller_held_caches_are_refused_for_dynamic_patterns():
    ker = SASAttnKernel(Diag(0, 4) + Diag(4, None) * Dynamic(budget=2), max_len=32)
    q = torch.randn(1, 1, 1, 16)
    with pytest.raises(NotYetSupportedError, match="stateful"):
        ker(q, q, q, torch.zeros(1, 1, 8, 16), torch.zeros(1, 1, 8, 16), position=3)


def test_held_and_attended_keys_before_a_prompt_are_refused():
    ker = SASAttnKernel(Diag(0, 4) + Diag(4, None) * Dynamic(budget=3), max_len=32)
    for read in (ker.dynamic.held_keys, ker.dynamic.attended_keys):
        with pytest.raises(KernelError, match="no prompt yet; call kernel.prefill"):
            read()
    q, k, v = qkv(1, 2, 1, 8, 16, seed=0)
    ker.prefill(q.float().to(DEV), k.float().to(DEV), v.float().to(DEV))     # (qkv makes CPU tensors)
    assert len(ker.dynamic.held_keys()) == 1
    ker.reset()
    with pytest.raises(KernelError, match="no prompt yet"):
        ker.dynamic.held_keys()


def test_decode_before_prefill_and_past_max_len():
    ker = SASAttnKernel(Diag(0, 4) + Diag(4, None) * Dynamic(budget=2), max_len=8)
    x = torch.randn(1, 1, 1, 16, device=DEV)
    with pytest.raises(KernelError, match="prefill"):
        ker.decode(x, x, x)
    p = torch.randn(1, 1, 8, 16, device=DEV)
    ker.prefill(p, p, p)
    with pytest.raises(KernelError, match="max_len"):
        ker.decode(x, x, x)


def test_decode_checks_every_new_shape_after_a_checked_one():
    """A step with the shapes, dtypes and devices of a step already checked skips the argument
    checks (host time); any change is checked again and refused before any work, and the cache
    stays usable."""
    ker = SASAttnKernel(Diag(0, 4) + Diag(4, None) * Dynamic(budget=2), max_len=32)
    p = torch.randn(1, 2, 8, 16, device=DEV)
    ker.prefill(p, p, p)
    x = torch.randn(1, 2, 1, 16, device=DEV)
    ker.decode(x, x, x)
    assert ker.dynamic.rt.length == 9
    bad = [((x, x[:, :1], x[:, :1]), "do not match the prompt"),
           ((x, x.half(), x), "dtype"),
           ((torch.randn(1, 2, 2, 16, device=DEV), x, x), "one token"),
           ((x, x, torch.randn(1, 2, 1, 8, device=DEV)), "head_dim 8"),
           ((x, x[0], x), "4-D")]
    for args, match in bad:
        with pytest.raises(KernelError, match=match):
            ker.decode(*args)
        assert ker.dynamic.rt.length == 9
    ker.decode(x, x, x)
    assert ker.dynamic.rt.length == 10


def test_decode_checks_a_step_again_after_a_new_prompt_of_other_heads():
    """The skipped checks are keyed on the prompt too: a prompt with other query heads, laid
    through the runtime (kernel.dynamic.prefill, which SASAttnKernel's own prefill does not see),
    makes the next step of the old shapes a KernelError, not a step read with the wrong heads."""
    ker = SASAttnKernel(Diag(0, 4) + Diag(4, None) * Dynamic(budget=2), max_len=32)
    p = torch.randn(1, 2, 8, 16, device=DEV)
    ker.prefill(p, p, p)
    x = torch.randn(1, 2, 1, 16, device=DEV)
    ker.decode(x, x, x)
    q4 = torch.randn(1, 4, 8, 16, device=DEV)
    ker.dynamic.prefill(q4, p, p)
    with pytest.raises(KernelError, match="do not match the prompt's batch 1, 4 query / 2 kv heads"):
        ker.decode(x, x, x)
    assert ker.dynamic.rt.length == 8
    out = ker.decode(torch.randn(1, 4, 1, 16, device=DEV), x, x)
    assert out.shape == (1, 4, 1, 16) and ker.dynamic.rt.length == 9


def test_dynamic_runtime_decode_checks_every_input_it_vouches_for():
    """kernel.dynamic.decode, called directly, checks what its fast path takes on trust: one token
    each, k and v of one shape, one dtype for all three (the prompt's), before any work."""
    ker = SASAttnKernel(Diag(0, 4) + Diag(4, None) * Dynamic(budget=2), max_len=32)
    p = torch.randn(1, 2, 8, 16, device=DEV)
    ker.prefill(p, p, p)
    x = torch.randn(1, 2, 1, 16, device=DEV)
    ker.dynamic.decode(x, x, x)
    bad = [((x, x.half(), x), "dtype"), ((x, x, x.double()), "dtype"),
           ((torch.randn(1, 2, 3, 16, device=DEV), x, x), "one token"),
           ((x, x, torch.randn(1, 2, 2, 16, device=DEV)), "same shape")]
    for args, match in bad:
        with pytest.raises(KernelError, match=match):
            ker.dynamic.decode(*args)
        assert ker.dynamic.rt.length == 9
    ker.dynamic.decode(x, x, x)
    assert ker.dynamic.rt.length == 10


def test_step_graph_rebinds_only_tensors_laid_out_like_its_buffers(monkeypatch):
    """The replayed step reads the caller's tensors in place only where the kernels would address
    them as they address the captured buffers: 16-byte aligned, the same strides on every
    dimension of more than one entry; and no rebinding at all without the driver API."""
    from sas.runtime import dynamic_host, graph_params

    buf = torch.empty(2, 4, 1, 16)
    sg = dynamic_host.StepGraph.__new__(dynamic_host.StepGraph)
    assert sg._bindable((torch.randn(2, 4, 1, 16), buf))
    assert sg._bindable((torch.randn(2, 1, 4, 16).transpose(1, 2), buf))       # [B, 1, H, D] transposed
    assert not sg._bindable((torch.randn(2, 4, 7, 16)[:, :, 3:4], buf))         # a slice of a longer sequence
    assert not sg._bindable((torch.randn(2 * 4 * 16 + 2)[2:].view(2, 4, 1, 16), buf))   # 8 bytes off
    one = torch.empty(1, 4, 1, 16)
    assert sg._bindable((torch.randn(1, 4, 9, 16)[:, :, 2:3].contiguous(), one))
    assert sg._bindable((torch.randn(1, 9, 4, 16)[:, 2:3].transpose(1, 2), one))   # batch stride: one batch
    monkeypatch.setattr(graph_params, "_driver", None)
    assert graph_params.PointerSlots.find(None, {"q": buf}) is None


def test_pointer_slots_skip_a_bind_to_the_addresses_they_hold(monkeypatch):
    """`PointerSlots.bind` updates the graph's kernel nodes only where an address changes: the
    tensors of a decode loop often come back at the same addresses, and then no driver call is
    made; after a refused update the held addresses are unknown, so the next bind updates."""
    import ctypes
    from types import SimpleNamespace

    from sas.runtime import graph_params

    calls, refuse = [], []

    def set_params(exec_handle, node, params):
        calls.append(node)
        return 1 if refuse else 0
    monkeypatch.setattr(graph_params, "_cuda", lambda: SimpleNamespace(cuGraphExecKernelNodeSetParams_v2=set_params))
    a, b = torch.zeros(4), torch.zeros(4)
    holders = [ctypes.c_uint64(0), ctypes.c_uint64(0)]
    nodes = [graph_params._Node(ctypes.c_void_p(i + 1), graph_params._KernelParams(), (ctypes.c_void_p * 1)(),
                                [("q", holders[i])]) for i in range(2)]
    slots = graph_params.PointerSlots(0, nodes, {"q": a.data_ptr()})
    assert slots.bind({"q": a}) and calls == []                 # captured there: nothing to update
    assert slots.bind({"q": b}) and len(calls) == 2 and all(h.value == b.data_ptr() for h in holders)
    assert slots.bind({"q": b}) and len(calls) == 2
    refuse.append(True)
    assert not slots.bind({"q": a}) and len(calls) == 3         # refused at the first node
    refuse.clear()
    assert slots.bind({"q": b}) and len(calls) == 5             # unknown after the refusal: updated
    assert slots.bind({"q": b}) and len(calls) == 5


def test_missing_other_inputs_named():
    pattern = Diag(0, 3) + Diag(3, None) * Dynamic(budget=2, score=ops.external("draft").sum(dim=1))
    with pytest.raises(KernelError, match="'draft'"):
        SASAttnKernel(pattern, max_len=32)


def test_other_inputs_on_another_device_named():
    pattern = Diag(0, 3) + Diag(3, None) * Dynamic(budget=2, score=ops.external("draft").sum(dim=1))
    ker = SASAttnKernel(pattern, max_len=32, other_inputs={"draft": torch.zeros(1, 1, 32, 32, device="meta")})
    x = torch.randn(1, 1, 8, 16, device=DEV)
    with pytest.raises(KernelError, match=r"'draft'\] is on meta"):
        ker.prefill(x, x, x)


def test_region_that_does_not_follow_the_static_part_is_refused():
    # keys enter the region 3 queries after the static part last used them: a gap
    with pytest.raises(NotYetSupportedError, match="static part"):
        SASAttnKernel(Diag(0, 2) + Diag(5, None) * Dynamic(budget=2), max_len=32)


def test_budget_larger_than_region():
    with pytest.raises(SASError, match="budget"):
        SASAttnKernel(Diag(0, 2) + Diag(2, 6) * Dynamic(budget=7), max_len=32)


@pytest.mark.parametrize("split_score, heads", [(False, 4), (True, 4), (True, 2)],
                         ids=["score-in-update", "score-kernel", "score-kernel-mha-merged"])
def test_device_position_step_equals_the_scalar_step(monkeypatch, split_score, heads):
    """The kernels a CUDA graph replays (position read from `state.pos`, advanced on the device)
    give the scalar path's outputs and held keys step for step; `static_keys` follows the
    length (also when it is set back). `score-kernel`: the score pass as a launch of its own
    (forced from 0 slots, 4 a program), also inside the replayed graph. `-mha-merged`: one query
    head per KV head in 4-slot attention blocks, whose splits the kernel after the attention
    merges (also inside the graph, with its output pointed at the caller's tensors)."""
    if split_score:
        monkeypatch.setattr(dynamic_host, "SPLIT_SCORE_FROM", 0)
        monkeypatch.setattr(dynamic_host, "SCORE_SLOTS", 4)
    if heads == 2:
        monkeypatch.setattr(dynamic_host, "attend_block_n", lambda *args: 4)
    pattern = (Rect(cols=(0, 2)) + Diag(0, 4)) * Causal() + Causal() * ~(Rect(cols=(0, 2)) + Diag(0, 4)) * Dynamic(
        budget=3)
    q, k, v = qkv(1, heads, 2, 24, 16, seed=11)
    P = 9
    want, want_held, _ = run_kernel(pattern, q, k, v, P)
    q, k, v = (t.to(torch.float32).to(DEV) for t in (q, k, v))
    ker = SASAttnKernel(pattern, max_len=64)
    outs = [ker.prefill(q[:, :, :P], k[:, :, :P], v[:, :, :P])]
    held = [ker.dynamic.held_keys()]
    rt = ker.dynamic.rt
    assert dynamic_host.merges_after(rt.state) == (heads == 2)
    rt.state.pos.fill_(P)
    for i in range(P, q.shape[2]):
        o = torch.empty_like(q[:, :, i:i + 1])
        rt._device_step(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1], o)
        rt.length = i + 1
        outs.append(o)
        held.append(ker.dynamic.held_keys())
    assert int(rt.state.pos) == q.shape[2]
    assert held == want_held
    torch.testing.assert_close(torch.cat(outs, 2).double().cpu(), want, rtol=0, atol=0)
    cid = rt.kernels.cache_ids(torch.arange(24)).tolist()
    if DEV == "cuda":   # the replayed CUDA graph: the same outputs as the launches, step for step
        ker2 = SASAttnKernel(pattern, max_len=64)
        ker2.prefill(q[:, :, :P], k[:, :, :P], v[:, :, :P])
        assert ker2.dynamic.rt.graphs
        got = [ker2.decode(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1]) for i in range(P, q.shape[2])]
        assert ker2.dynamic.rt._graph is not None and ker2.dynamic.rt._graph.graph is not None
        torch.testing.assert_close(torch.cat(got, 2), torch.cat(outs[1:], 2), rtol=0, atol=0)
        # the graph's kernels pointed at the caller's tensors (contiguous ones, and [B, 1, H, D]
        # transposed as a model hands them over) and at a fresh output each step, mixed with steps
        # of slices (other strides: copied in and out): the same outputs, none overwritten later
        ker3 = SASAttnKernel(pattern, max_len=64)
        ker3.prefill(q[:, :, :P], k[:, :, :P], v[:, :, :P])
        got3 = []
        for i in range(P, q.shape[2]):
            x = [t[:, :, i:i + 1] for t in (q, k, v)]
            if i % 3 == 0:
                x = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in x]
            elif i % 3 == 1:
                x = [t.contiguous() for t in x]
            got3.append(ker3.decode(*x))
        graph = ker3.dynamic.rt._graph
        assert graph.slots is not None and graph.slots.names == ["k", "out", "q", "v"]
        torch.testing.assert_close(torch.cat(got3, 2), torch.cat(outs[1:], 2), rtol=0, atol=0)
    for n in (24, 10, 17):
        rt.length = n
        expect = [max([j for j in range(n) if cid[j] == s], default=-1) for s in range(rt.kernels.STATIC_SIZE)]
        assert rt.static_keys.tolist() == expect


@pytest.mark.parametrize("heads", [2, 4], ids=["mha", "gqa"])
def test_device_step_advances_the_position_in_its_update_kernel(heads):
    """The replayed step's update kernel advances `state.pos` itself (a ticket per program, the
    last one stores pos + 1): over several steps of two batch entries and two KV heads (four
    programs, run one after another by the interpreter, so a program storing the position
    before the others have read it would show), the position advances by exactly one a step,
    the ticket counter is back at 0 after each, and the outputs and the whole state (cache,
    accumulated scores, the pool's flags and keys, the staging) equal the scalar path's step
    for step, which leaves `state.pos` and the counter alone."""
    pattern = (Rect(cols=(0, 2)) + Diag(0, 4)) * Causal() + Causal() * ~(Rect(cols=(0, 2)) + Diag(0, 4)) * Dynamic(
        budget=3)
    q, k, v = (t.to(torch.float32).to(DEV) for t in qkv(2, heads, 2, 17, 16, seed=5))
    P = 9
    eager, device = SASAttnKernel(pattern, max_len=64), SASAttnKernel(pattern, max_len=64)
    for ker in (eager, device):
        ker.prefill(q[:, :, :P], k[:, :, :P], v[:, :, :P])
        ker.dynamic.rt.graphs = False
    se, sd = eager.dynamic.rt.state, device.dynamic.rt.state
    names = ("k", "v", "acc", "flags", "keys", "new_pool", "enter_dst")
    rt = device.dynamic.rt
    rt.state.pos.fill_(P)
    for i in range(P, q.shape[2]):
        x = [t[:, :, i:i + 1] for t in (q, k, v)]
        want = eager.decode(*x)
        got = torch.empty_like(want)
        rt._device_step(*x, got)
        rt.length = i + 1
        assert int(sd.pos) == i + 1 and int(sd.pos_ticket) == 0
        assert int(se.pos) == 0 and int(se.pos_ticket) == 0
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        for name in names:
            torch.testing.assert_close(getattr(sd, name), getattr(se, name), rtol=0, atol=0, msg=name)
    assert device.dynamic.held_keys() == eager.dynamic.held_keys()


@pytest.mark.parametrize("split_score", [False, True], ids=["update-kernel-scores", "score-kernel-scores"])
def test_static_block_flags_skip_unattended_blocks_exactly(monkeypatch, split_score):
    """Where a decode row attends under half of the static segment (a window of 4 and a
    relative stride of 24: each query attends a few of the cached keys), the attention skips
    slot blocks through per-step flags (the flags kernel) and the score pass reads no raw score
    under a 0 flag (the block's scores of an earlier step are still there). Forced here on a
    small cache (FLAGS_FROM_BLOCKS = 1, 16-slot blocks): the flags kernel runs at every step and
    leaves blocks unflagged; outputs and held keys equal the reference at every step, and the
    accumulated scores of every slot, the pool's keys and flags equal those of the same steps
    without flags bit for bit (batch 2, two KV heads of two query heads; the update kernel or
    the score kernel accumulating; an epilogue that adds to unattended slots too)."""
    monkeypatch.setattr(dynamic_host, "attend_block_n", lambda *args: 16)
    if split_score:
        monkeypatch.setattr(dynamic_host, "SPLIT_SCORE_FROM", 0)
        monkeypatch.setattr(dynamic_host, "SCORE_SLOTS", 16)
    static = (Diag(0, 4) + Diag(0, None, stride=24)) * Causal()
    pattern = static + Causal() * ~static * Dynamic(budget=3, score=ops.attn_score().sum(dim=1) * 2.0 + 0.5)
    q, k, v = qkv(2, 4, 2, 40, 16, seed=21)
    res = dynamic_attention_reference(pattern, q, k, v, prefill_len=21)
    orig_step = dynamic_host.step
    runs = []
    for from_blocks in (1, 10 ** 9):                 # flags forced on, then off
        ker = SASAttnKernel(pattern, max_len=48)     # a multiple of the stride: closed-form cache functions
        monkeypatch.setattr(ker.dynamic.mod, "FLAGS_FROM_BLOCKS", from_blocks)
        ker.dynamic.rt.graphs = False       # every step launches (on CUDA a graph would replay one capture)
        launches = _Launches(ker.dynamic.mod.FLAGS_KERNEL)
        monkeypatch.setattr(ker.dynamic.mod, "FLAGS_KERNEL", launches)
        states, unflagged = [], []

        def step(kernels, state, *args, **kw):
            orig_step(kernels, state, *args, **kw)
            states.append([t.clone() for t in (state.acc, state.keys, state.flags)])
            unflagged.append(int((state.sflags == 0).sum()) if state.skip_flags else 0)
        monkeypatch.setattr(dynamic_host, "step", step)
        got, held = run_steps(ker, q, k, v, 21)
        runs.append((got, states, ker.dynamic.rt.state.skip_flags, len(launches.grids), unflagged))
    (got, states, on, n_flags, unflagged), (got_off, states_off, off, n_off, _) = runs
    assert ker.dynamic.mod.STATIC_SPARSE and on and not off
    assert n_flags == 19 and n_off == 0 and sum(n > 0 for n in unflagged) >= 3
    assert held == [[[list(t) for t in per_b] for per_b in r.held_sets()] for r in res.steps]
    torch.testing.assert_close(got, res.out, rtol=1e-4, atol=1e-4)
    assert torch.equal(got, got_off)
    assert all(torch.equal(a, b) for s1, s2 in zip(states, states_off) for a, b in zip(s1, s2))


def test_attend_stages_keep_fp32_query_groups_to_one():
    """A query group's slot loop is software-pipelined (it has no branch): fp32 tiles take one
    stage (two need up to 148 KB of shared memory a program, over sm_86 / sm_89's 99 KB), 2-byte
    tiles two; one query row's loop keeps two (it is not pipelined)."""
    assert dynamic_host.attend_stages(True, torch.float32) == 1
    assert dynamic_host.attend_stages(True, torch.bfloat16) == 2
    assert dynamic_host.attend_stages(True, torch.float16) == 2
    assert dynamic_host.attend_stages(False, torch.float32) == 2
