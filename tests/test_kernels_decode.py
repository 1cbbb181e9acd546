"""Decode kernels: prefill followed by decode steps must reproduce the rows of a full
prefill (float64 reference from `to_mask`), through the compact KV cache."""

from __future__ import annotations

import ast
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sas
from sas import Diag
from sas.codegen.triton_backend import DecodeOptions, PrefillOptions
from sas.errors import KernelError
from sas.runtime import SASAttnKernel

from helpers.attention import DEV, TOL, qkv, reference_attention, rel_error
from helpers.table1 import TABLE1_KERNELS
from strategies import causal_patterns

pytestmark = pytest.mark.kernels

PO = PrefillOptions(block_m=32, block_n=16, num_warps=4, num_stages=1)
DO = DecodeOptions(block_n=32, num_warps=4, num_stages=1)


def prefill_then_decode(kern, pattern, B=1, Hq=2, Hkv=1, L=72, P=40, D=64, dtype=torch.float32, seed=0):
    q, k, v = qkv(B, Hq, Hkv, L, D, dtype=dtype, device=DEV, seed=seed)
    ref = reference_attention(pattern, q, k, v)
    out = kern.prefill(q[:, :, :P], k[:, :, :P], v[:, :, :P])
    errs = [rel_error(out, ref[:, :, :P])]
    for t in range(P, L):
        o = kern.decode(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1])
        assert o.shape == (B, Hq, 1, D) and o.dtype == dtype
        r = ref[:, :, t:t + 1]
        if r.norm() > 0:
            errs.append(rel_error(o, r))
        else:
            assert (o == 0).all()
    assert kern.length == L
    return max(errs)


@pytest.mark.parametrize("name", list(TABLE1_KERNELS))
@pytest.mark.parametrize("splits", [None, 1, 3])
def test_table1_decode_matches_prefill_rows(name, splits):
    p = TABLE1_KERNELS[name]
    kern = SASAttnKernel(p, max_len=72, prefill_options=PO, decode_options=DO, num_splits=splits)
    assert kern.cache_size == kern.analysis.cache_size
    err = prefill_then_decode(kern, p)
    assert err < TOL[torch.float32], f"{name}: rel err {err:.2e}"
    assert kern.k_cache.shape == (1, 1, max(1, kern.cache_size), 64)


@pytest.mark.parametrize("opts", [DecodeOptions(16, 4, 1, fused_combine=True, skip_mode="none"),
                                  DecodeOptions(32, 2, 2, mha_dot=True, waves=1, skip_mode="mask"),
                                  DecodeOptions(16, 4, 1, skip_mode="flags", fused_combine=True, mha_dot=True),
                                  DecodeOptions(16, 4, 1, skip_mode="flags", pdl=True),
                                  DecodeOptions(32, 4, 1, skip_mode="none", pdl=True),
                                  DecodeOptions(16, 4, 1, store_new_last=False, skip_mode="mask"),
                                  DecodeOptions(16, 4, 1, store_new_last=True, fused_combine=True)])
def test_decode_option_variants(opts):
    """(`pdl` is ignored under the interpreter; on a GPU of compute capability 9+ the kernels
    then run as programmatic dependent launches. The new token's store before or after the slot
    loop: each step reads the keys the steps before stored.)"""
    p = TABLE1_KERNELS["openai_fixed"]
    kern = SASAttnKernel(p, max_len=64, prefill_options=PO, decode_options=opts, num_splits=3)
    assert prefill_then_decode(kern, p, B=2, Hq=2, Hkv=2, L=64, P=55) < TOL[torch.float32]
    kern = SASAttnKernel(p, max_len=64, prefill_options=PO, decode_options=opts)
    assert prefill_then_decode(kern, p, B=1, Hq=4, Hkv=2, L=64, P=59) < TOL[torch.float32]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_decode_half_precision_gqa_batch(dtype):
    p = TABLE1_KERNELS["streaming_llm"]
    kern = SASAttnKernel(p, max_len=64, prefill_options=PO, decode_options=DO)
    err = prefill_then_decode(kern, p, B=2, Hq=4, Hkv=2, L=64, P=48, dtype=dtype)
    assert err < TOL[dtype]


def test_decode_head_dim_128_gqa8():
    p = TABLE1_KERNELS["openai_fixed"]
    kern = SASAttnKernel(p, max_len=48, prefill_options=PO, decode_options=DecodeOptions(32, 4, 1), num_splits=2)
    err = prefill_then_decode(kern, p, Hq=8, Hkv=1, L=48, P=40, D=128, dtype=torch.bfloat16)
    assert err < TOL[torch.bfloat16]


def test_decode_from_one_token_prompt():
    p = TABLE1_KERNELS["block_local"]
    kern = SASAttnKernel(p, max_len=40, prefill_options=PO, decode_options=DO)
    assert prefill_then_decode(kern, p, L=40, P=1) < TOL[torch.float32]


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# the analyzer refuses patterns that attend nothing: such draws are filtered out before any work
@given(p=causal_patterns(3).filter(lambda p: not p.dynamics() and p.to_mask(32).any()), P=st.integers(1, 24))
def test_random_causal_decode(p, P):
    kern = SASAttnKernel(p, max_len=32, prefill_options=PO, decode_options=DO, num_splits=2)
    assert prefill_then_decode(kern, p, L=32, P=P, seed=P) < TOL[torch.float32], repr(p)


def test_functional_form_with_caller_caches():
    p = TABLE1_KERNELS["openai_strided"]
    L, P = 60, 46      # 14 steps through caller-held caches (ring wrap and the strided columns included)
    kern = SASAttnKernel(p, max_len=L, prefill_options=PO, decode_options=DO)
    q, k, v = qkv(2, 2, 2, L, 64, dtype=torch.float32, device=DEV, seed=3)
    ref = reference_attention(p, q, k, v)
    assert rel_error(kern(q[:, :, :P], k[:, :, :P], v[:, :, :P]), ref[:, :, :P]) < TOL[torch.float32]
    pk, pv = kern.new_cache(2, 2, 64, torch.float32, DEV)
    kern.fill_cache(k[:, :, :P], v[:, :, :P], pk, pv)
    for t in range(P, L):
        o = kern(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], pk, pv, position=t)
        assert rel_error(o, ref[:, :, t:t + 1]) < TOL[torch.float32]
    assert kern.length == 0 and kern.k_cache is None           # the functional form keeps no state
    # the stateful caches can be passed back in without a position
    kern.prefill(q[:, :, :P], k[:, :, :P], v[:, :, :P])
    o = kern(q[:, :, P:P + 1], k[:, :, P:P + 1], v[:, :, P:P + 1], kern.k_cache, kern.v_cache)
    assert rel_error(o, ref[:, :, P:P + 1]) < TOL[torch.float32] and kern.length == P + 1


@pytest.mark.parametrize("store_new_last", [None, False, True])
def test_cache_contents_follow_cache_id_func(store_new_last):
    p = TABLE1_KERNELS["streaming_llm"]
    do = DecodeOptions(block_n=32, num_warps=4, num_stages=1, store_new_last=store_new_last)
    kern = SASAttnKernel(p, max_len=50, prefill_options=PO, decode_options=do)
    assert kern.runtime.decode_module(do).STORE_NEW_LAST == (store_new_last is not False)   # 50 slots at most
    q, k, v = qkv(1, 1, 1, 50, 64, dtype=torch.float32, device=DEV)
    kern.prefill(q[:, :, :20], k[:, :, :20], v[:, :, :20])
    for t in range(20, 50):
        kern.decode(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1])
    a = kern.analysis
    last = {}
    for j in range(50):
        s = a.cache_id_func(j)
        if s >= 0:
            last[s] = j
    for s, j in last.items():
        assert torch.equal(kern.k_cache[0, 0, s].cpu(), k[0, 0, j].cpu())
        assert torch.equal(kern.v_cache[0, 0, s].cpu(), v[0, 0, j].cpu())


def test_cache_bytes():
    p = TABLE1_KERNELS["sliding_window"]
    kern = SASAttnKernel(p, max_len=64, prefill_options=PO, decode_options=DO)
    assert kern.cache_size == 24
    assert kern.kv_cache_bytes(batch=2, num_kv_heads=4, head_dim=64, dtype=torch.float16) == 2 * 24 * 2 * 4 * 64 * 2
    assert kern.dense_kv_cache_bytes(batch=2, num_kv_heads=4, head_dim=64, dtype=torch.float16) == 2 * 64 * 2 * 4 * 64 * 2
    with pytest.raises(KernelError, match="prefill first"):
        kern.kv_cache_bytes()
    q, k, v = qkv(1, 2, 2, 30, 64, dtype=torch.float32, device=DEV)
    kern.prefill(q, k, v)
    assert kern.kv_cache_bytes() == 2 * 24 * 2 * 64 * 4
    assert kern.kv_cache_bytes() == kern.k_cache.numel() * 4 * 2


# --- a table-driven analysis (exercises table subscripts in the generated decode kernel) -----

def table_analysis(pattern, n):
    """Brute force: optimal interval colouring as a per-token table, mask through a
    per-(slot, query) key table."""
    m = pattern.to_mask(n)
    used = m.any(0)
    last = np.where(used, n - 1 - np.argmax(m[::-1], axis=0), -1)
    slot = np.full(n, -1)
    free, busy, size = [], [], 0
    for j in range(n):
        for (lu, s) in list(busy):
            if lu < j:
                busy.remove((lu, s))
                free.append(s)
        if last[j] < j:
            continue
        s = min(free) if free else size
        if free:
            free.remove(s)
        size = max(size, s + 1)
        slot[j] = s
        busy.append((last[j], s))
    held = np.full((max(size, 1), n), -1)
    cur = np.full(max(size, 1), -1)
    for t in range(n):
        if slot[t] >= 0:
            cur[slot[t]] = t
        held[:, t] = cur
    pred = ast.unparse(pattern.predicate(ast.Name("token_id"), ast.Name("key")))
    src = (f"def cache_id_func(token_id):\n    return CACHE_ID[token_id] if token_id >= 0 and token_id < {n} else -1\n\n"
           f"def mask_func(cache_id, token_id):\n    key = SLOT_KEY[cache_id * {n} + token_id]\n"
           f"    return key >= 0 and ({pred})\n")
    tables = {"CACHE_ID": tuple(int(x) for x in slot), "SLOT_KEY": tuple(int(x) for x in held.reshape(-1))}
    ns = dict(tables)
    exec(src, ns)  # noqa: S102
    return SimpleNamespace(pattern=pattern, max_len=n, cache_size=size, functions=ast.parse(src), tables=tables,
                           source=src, scheme="table", closed_form=False, cache_id_func=ns["cache_id_func"],
                           mask_func=ns["mask_func"])


@pytest.mark.parametrize("name", ["openai_fixed", "streaming_llm"])
def test_table_driven_decode(name):
    p = TABLE1_KERNELS[name]
    a = table_analysis(p, 56)
    kern = SASAttnKernel(p, max_len=56, analysis=a, prefill_options=PO, decode_options=DO, num_splits=2)
    assert kern.cache_size == a.cache_size
    assert prefill_then_decode(kern, p, L=56, P=20) < TOL[torch.float32]


@pytest.mark.parametrize("scheme", ["ring", "table"])
def test_per_token_decode_past_the_former_length_limit(monkeypatch: pytest.MonkeyPatch, scheme: str):
    # no periodic description (a spread of a non-square unit over a diagonal layout): analysed per
    # token at any length (refused past max_len 32768 before); its last uses fit a ring, and the
    # slot table (where no ring fits, forced here) decodes as well
    p = ((sas.Rect(size=(3, 2)) >> Diag(0, 2)) + Diag(0, 16)) * Diag(0, 64)
    if scheme == "table":
        monkeypatch.setattr(sys.modules["sas.analysis.analyze"], "ring_from_last_use", lambda last_use: None)
    kern = SASAttnKernel(p, max_len=40000, prefill_options=PO, decode_options=DO, num_splits=2)
    a = kern.plan.analysis
    assert a.scheme == scheme and kern.cache_size == a.cache_size
    assert (scheme == "table") == ("CACHE_ID" in a.tables and len(a.tables["CACHE_ID"]) == 40000)
    assert prefill_then_decode(kern, p, L=24, P=8) < TOL[torch.float32]


def test_real_analysis_is_used():
    p = TABLE1_KERNELS["block_local"]
    kern = SASAttnKernel(p, max_len=64, prefill_options=PO, decode_options=DO)
    assert kern.cache_size == sas.analyze(p, max_len=64).cache_size


# --- errors --------------------------------------------------------------------------------

def make(max_len=32):
    return SASAttnKernel(TABLE1_KERNELS["sliding_window"], max_len=max_len, prefill_options=PO, decode_options=DO)


def tok(B=1, H=2, L=1, D=64, dtype=torch.float32):
    return torch.randn(B, H, L, D).to(dtype).to(DEV)


def test_decode_before_prefill():
    with pytest.raises(KernelError, match="prefill"):
        make().decode(tok(), tok(), tok())


def test_decode_past_max_len():
    kern = make(max_len=20)
    kern.prefill(tok(L=19), tok(L=19), tok(L=19))
    kern.decode(tok(), tok(), tok())
    with pytest.raises(KernelError, match="max_len"):
        kern.decode(tok(), tok(), tok())
    with pytest.raises(KernelError, match="max_len"):
        make(max_len=20).prefill(tok(L=21), tok(L=21), tok(L=21))


def test_decode_non_causal_pattern():
    kern = SASAttnKernel(Diag(-2, 5), max_len=32, prefill_options=PO, decode_options=DO)
    out = kern.prefill(tok(L=16), tok(L=16), tok(L=16))          # prefill is fine
    assert out.shape == (1, 2, 16, 64)
    with pytest.raises(KernelError, match="not causal"):
        kern.decode(tok(), tok(), tok())
    with pytest.raises(KernelError, match="not causal"):
        kern.new_cache(1, 2, 64)


def test_decode_shape_errors():
    kern = make()
    kern.prefill(tok(L=8), tok(L=8), tok(L=8))
    with pytest.raises(KernelError, match="one token"):
        kern.decode(tok(L=2), tok(L=2), tok(L=2))
    with pytest.raises(KernelError, match="past_k"):
        kern.decode(tok(H=4), tok(H=4), tok(H=4))                # cache has 2 kv heads
    with pytest.raises(KernelError, match="dtype"):
        kern.decode(tok(dtype=torch.float16), tok(dtype=torch.float16), tok(dtype=torch.float16))
    with pytest.raises(KernelError, match="position"):
        pk, pv = kern.new_cache(1, 2, 64, torch.float32, DEV)
        kern(tok(), tok(), tok(), pk, pv)
    with pytest.raises(KernelError, match="position"):
        kern(tok(), tok(), tok(), pk, pv, position=-1)
    with pytest.raises(KernelError, match="both past_k and past_v"):
        kern(tok(), tok(), tok(), pk, None)
    with pytest.raises(KernelError, match="past_v"):
        kern(tok(), tok(), tok(), pk, pv[:, :, :3], position=9)


@pytest.mark.skipif(DEV != "cuda", reason="direct launches run compiled kernels on a GPU (the interpreter always binds)")
@pytest.mark.parametrize("name", ["streaming_llm", "openai_fixed"])
def test_direct_launches_equal_bound_launches_and_capture_in_a_graph(name):
    """After the first launch of a specialization the generated decode module calls the compiled
    kernels directly: the same output bit for bit, and the step still captures in a CUDA graph."""
    p = TABLE1_KERNELS[name]
    kern = SASAttnKernel(p, max_len=72, prefill_options=PO, decode_options=DO, num_splits=3)
    q, k, v = qkv(2, 4, 2, 72, 64, dtype=torch.bfloat16, device=DEV, seed=3)
    kc, vc = kern.new_cache(2, 2, 64, torch.bfloat16, DEV)
    kern.fill_cache(k[:, :, :60], v[:, :, :60], kc, vc)
    q1, k1, v1 = q[:, :, 60:61], k[:, :, 60:61], v[:, :, 60:61]
    outs = [kern(q1, k1, v1, kc.clone(), vc.clone(), position=60) for _ in range(3)]
    assert all(torch.equal(o, outs[0]) for o in outs)
    kc2, vc2 = kc.clone(), vc.clone()
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph.capture_begin()
        gout = kern(q1, k1, v1, kc2, vc2, position=60)
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    kc2.copy_(kc)
    vc2.copy_(vc)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(gout, outs[0])


def test_pdl_option_checked_and_off_where_unsupported():
    with pytest.raises(KernelError, match="pdl must be None, True or False"):
        DecodeOptions(pdl="yes")
    with pytest.raises(KernelError, match="blocks_per_split must be a positive integer"):
        DecodeOptions(blocks_per_split=0)
    with pytest.raises(KernelError, match="store_new_last must be None, True or False"):
        DecodeOptions(store_new_last=1)
    kern = SASAttnKernel(TABLE1_KERNELS["streaming_llm"], max_len=64, decode_options=DecodeOptions(pdl=True))
    mod = kern.runtime.decode_module(DecodeOptions(pdl=True))
    assert not mod.pdl_supported(torch.device("cpu"))
    # the default (pdl=None): programmatic dependent launches only where the step is one launch
    assert DecodeOptions().pdl is None
    mod = kern.runtime.decode_module(DecodeOptions(skip_mode="none"))
    assert mod.pdl_by_default(1) and not mod.pdl_by_default(3)
    assert not kern.runtime.decode_module(DecodeOptions(skip_mode="flags")).pdl_by_default(1)


PDL_GPU = DEV == "cuda" and torch.cuda.get_device_capability()[0] >= 9


@pytest.mark.skipif(not PDL_GPU, reason="programmatic dependent launch needs a GPU of compute capability 9+")
@pytest.mark.parametrize("name", ["streaming_llm", "strided_block_local"])
def test_pdl_decode_chain_in_a_graph_equals_plain_launches(name):
    """A chain of decodes over four layers' caches, each query written by a torch kernel just
    before its decode, captured in a CUDA graph: with programmatic dependent launches the
    outputs and caches equal those of plain launches bit for bit (several splits with a
    combine kernel, and one split)."""
    p = TABLE1_KERNELS[name]
    q, k, v = qkv(1, 4, 2, 72, 64, dtype=torch.bfloat16, device=DEV, seed=5)
    runs = []
    for pdl in (False, True):
        kern = SASAttnKernel(p, max_len=72, decode_options=DecodeOptions(block_n=32, pdl=pdl))
        kc, vc = kern.new_cache(1, 2, 64, torch.bfloat16, DEV)
        kern.fill_cache(k[:, :, :60], v[:, :, :60], kc, vc)
        layers = [(kc.clone(), vc.clone(), torch.empty_like(q[:, :, :1]), torch.empty_like(q[:, :, :1]))
                  for _ in range(4)]
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for i, (lk, lv, lq, lo) in enumerate(layers):  # warm-up: compile outside the capture
                lq.copy_(q[:, :, 60 + i:61 + i])
                kern.runtime.decode(lq, k[:, :, 60:61], v[:, :, 60:61], lk.clone(), lv.clone(), 60, out=lo)
            graph.capture_begin()
            for i, (lk, lv, lq, lo) in enumerate(layers):
                lq.copy_(q[:, :, 60 + i:61 + i] * 2)
                kern.runtime.decode(lq, k[:, :, 60:61], v[:, :, 60:61], lk, lv, 60, out=lo)
            graph.capture_end()
        torch.cuda.current_stream().wait_stream(stream)
        graph.replay()
        torch.cuda.synchronize()
        runs.append([t.clone() for layer in layers for t in (layer[0], layer[1], layer[3])])
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    assert not torch.equal(runs[0][2], runs[0][5])  # the layers' queries, hence outputs, differ


def test_split_count_follows_the_decode_options():
    """The split rule takes its slot blocks per program from the options: streaming-LLM's 1056
    slots at 16K (one query head per kv head: 32-slot blocks, at most 6 a program) get
    ceil(33 / 6) = 6 splits for one sequence of 64 heads on 132 SMs, and 9 with 4 a program."""
    kern = SASAttnKernel((Diag(0, 1024) + sas.Rect(cols=(0, 32))) * sas.Causal(), max_len=16384)
    assert kern.cache_size == 1056
    o = kern.plan.decode_config(1)
    assert (o.block_n, o.blocks_per_split) == (32, 6)
    mod = kern.runtime.decode_module(o)
    assert mod.BLOCKS_PER_SPLIT == 6
    assert mod.num_splits_for(1, 64, num_sms=132) == 6
    assert mod.num_splits_for(1, 64, num_sms=132, blocks_per_split=4) == 9
    assert kern.plan.decode_config(4).blocks_per_split == 4         # query groups keep 64-slot blocks


def test_fp32_query_groups_keep_two_stages(monkeypatch):
    """Query groups pipeline their slot loop 3 stages deep in 2-byte dtypes, 2 in fp32 (3 would
    need more shared memory than sm_86 / sm_89 GPUs have): the plan's automatic options follow
    the dtype asked for (else the plan's, else bfloat16), and the module's own default caps fp32
    at FP32_MAX_STAGES. Explicit options are kept."""
    from sas.plan import make_plan
    pattern = (Diag(0, 64) + sas.Rect(cols=(0, 4))) * sas.Causal()
    kern = SASAttnKernel(pattern, max_len=256)
    assert [kern.plan.decode_config(4, dt).num_stages for dt in (None, torch.float16, torch.float32)] == [3, 3, 2]
    assert kern.plan.decode_config(1).num_stages == 2
    assert make_plan(pattern, 256, dtype="float32").decode_config(4).num_stages == 2
    assert make_plan(pattern, 256, dtype="float32", decode_options=DecodeOptions(num_stages=3)) \
        .decode_config(4).num_stages == 3
    mod = kern.runtime.decode_module(kern.plan.decode_config(4))
    assert (mod.NUM_STAGES, mod.FP32_MAX_STAGES) == (3, 2)
    seen = []
    monkeypatch.setattr(mod, "_launch", lambda kernel, grid, key, args, consts, tensors:
                        seen.append(consts["num_stages"]) if "SPLIT_SIZE" in consts else None)
    for dt, stages in ((torch.float32, None), (torch.float16, None), (torch.float32, 3)):
        q, k = torch.zeros(1, 8, 1, 16, dtype=dt), torch.zeros(1, 2, 1, 16, dtype=dt)
        kc, vc = kern.new_cache(1, 2, 16, dt)
        mod.decode(q, k, k, kc, vc, 5, num_splits=1, num_stages=stages)
    assert seen == [2, 3, 3]


def test_split_count_of_query_groups_is_one_wave(monkeypatch):
    """A query group with GROUP_ONE_WAVE_FROM (16) or more programs a split (batch x KV heads)
    takes one wave of WAVES (2) programs an SM, at least 2 splits, no more than its blocks; one
    split where those programs fill more than half of the SMs, at most one an SM, each reading
    at most GROUP_ONE_SPLIT_BLOCKS (24) slot blocks; with fewer programs, or one query head a
    KV head, the blocks-per-split rule stays. The runtime passes the group (q heads // KV
    heads) on."""
    kern = SASAttnKernel((Diag(0, 1024) + sas.Rect(cols=(0, 32))) * sas.Causal(), max_len=16384)
    o = kern.plan.decode_config(4)
    mod = kern.runtime.decode_module(o)
    assert (o.block_n, o.num_stages, o.waves, o.blocks_per_split) == (64, 3, 2, 4)   # 17 blocks
    assert (mod.GROUP_ONE_WAVE_FROM, mod.GROUP_ONE_SPLIT_BLOCKS) == (16, 24)

    def rule(batch, kv_heads, group, cache_size=mod.CACHE_SIZE):
        return mod.num_splits_for(batch, kv_heads, cache_size=cache_size, num_sms=132, group=group)
    assert [rule(b, 8, 4) for b in (2, 4, 8, 16, 64)] == [16, 8, 4, 1, 2]      # 264 // (8 b), at least 2; 128: one
    assert [rule(b, 8, 4, 2272) for b in (4, 8, 16, 32, 64)] == [8, 4, 2, 2, 2]  # 36 blocks: never one
    assert [rule(1, h, 4) for h in (66, 67, 132, 133)] == [4, 1, 1, 2]        # one split for 67-132 programs
    assert rule(1, 8, 4) == 17 and rule(1, 8, 1) == 17                        # 8 programs: ceil(264 / 8), capped
    assert rule(16, 8, 1) == 5 and rule(64, 8, 1) == 5                        # one row: ceil(17 / 4)
    assert rule(1, 16, 4) == 16 and rule(2, 8, 4, 320) == 5                   # no more splits than blocks
    cpu = torch.device("cpu")                                                # (4 "SMs" there)
    assert kern.runtime.splits(mod, o, 16, 8, cpu, 4) == 2 and kern.runtime.splits(mod, o, 16, 8, cpu) == 5
    small = SASAttnKernel(Diag(0, 8) * sas.Causal(), max_len=32)
    seen = []
    monkeypatch.setattr(small.runtime, "splits", lambda *a, **kw: seen.append(a[5:]) or 1)
    q, k = torch.zeros(3, 8, 1, 16, device=DEV), torch.zeros(3, 2, 1, 16, device=DEV)
    kc, vc = small.new_cache(3, 2, 16, torch.float32, DEV)
    small.runtime.decode(q, k, k, kc, vc, 5)
    assert seen == [(4,)]
    mod_s = small.runtime.decode_module(small.plan.decode_config(4))        # the module's own default too
    real = mod_s.num_splits_for
    monkeypatch.setattr(mod_s, "num_splits_for", lambda *a, **kw: seen.append(kw.get("group")) or real(*a, **kw))
    mod_s.decode(q, k, k, kc, vc, 6)
    assert seen == [(4,), 4]


@pytest.mark.parametrize("pattern, options", [
    ((sas.Rect(size=(128, 128)) >> Diag(0, 3)) * sas.Causal(), DecodeOptions(block_n=32, waves=3, blocks_per_split=6)),
    ((Diag(0, 1024) + sas.Rect(cols=(0, 32))) * sas.Causal(), DecodeOptions(block_n=32, blocks_per_split=6)),
], ids=["block_local_384", "streaming_llm_1056"])
def test_automatic_options_of_one_query_head_per_kv_head_decode_exactly(pattern, options):
    """The launch rules for one query head per KV head (129-512 slots: 32-slot blocks, 3 programs
    per SM; a ragged cache: 32-slot blocks) at the Table-1 sizes: one decode step at position
    1500, past the ring's wrap, matches the float64 reference row of the exact mask."""
    kern = SASAttnKernel(pattern, max_len=1600)
    assert kern.plan.decode_config(1) == options
    P = 1500
    q, k, v = qkv(1, 2, 2, P + 1, 64, dtype=torch.float32, device=DEV, seed=11)
    kc, vc = kern.new_cache(1, 2, 64, torch.float32, DEV)
    kern.fill_cache(k[:, :, :P], v[:, :, :P], kc, vc)
    out = kern(q[:, :, P:P + 1], k[:, :, P:P + 1], v[:, :, P:P + 1], kc, vc, position=P)
    ref = reference_attention(pattern, q[:, :, P:P + 1], k, v)
    assert rel_error(out, ref) < TOL[torch.float32]
