"""Kascade (Dynamic(publish=...), ops.reuse, ops.fraction): selection against torch.topk on
the pooled scores, the Triton kernels against the float64 reference (prefill tiles and decode),
reuse layers attending exactly the anchor's sets under the head map, the anchor DP against brute
force, head maps, the state file, and bad input (docs/kascade.md)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sas import Causal, Diag, Dynamic, ops
from sas.dynamic.trace import trace_score
from sas.errors import KernelError, NotYetSupportedError, PatternError, SASError
from sas.integrations.kascade import layer_roles
from sas.lang.ops import Fraction
from sas.methods.kascade import (KascadeError, KascadeLayer, SelectionStore, decode_mask, masked_attention,
                                 pooled_decode_scores, pooled_tile_scores, prefill_mask, reference_decode,
                                 reference_prefill, select_prefill, tile_counts, topk_sorted)
from sas.methods.kascade_calibrate import (Similarity, brute_force_anchors, evenly_spaced, head_maps,
                                           head_similarity, objective, select_anchors, tile_pooled)
from sas.methods.kascade_dynamic import anchor_pattern, kascade_layer, reuse_pattern
from sas.methods.kascade_runtime import KascadeRuntime
from sas.methods.kascade_state import KascadeStateError, load_state, make_state

from helpers.attention import DEV

BUDGET = Fraction(0.25, 16)        # small enough that tiles 1.. are sparse at N = 160
RT = KascadeRuntime(block_n=32, block_m=32)


def inputs(b=1, hq=6, hkv=2, n=160, d=32, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*s, generator=g).to(DEV, dtype) for s in ((b, hq, n, d), (b, hkv, n, d), (b, hkv, n, d)))


def sdpa_causal(q, k, v):
    g = q.shape[1] // k.shape[1]
    return torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1), is_causal=True)


# --- budget and selection semantics -------------------------------------------------------------

def test_fraction_budget_counts():
    f = ops.fraction(0.1, min=128)
    assert [f.keys(n) for n in (50, 128, 1000, 1280, 1290, 131072)] == [50, 128, 128, 128, 129, 13107]
    assert repr(f) == "fraction(0.1, min=128)"
    assert tile_counts(100, 32, Fraction(0.5, 4)) == [0, 16, 32, 48]


@pytest.mark.parametrize("frac,mn", [(0, 1), (1.5, 1), (-0.1, 1), (float("nan"), 1), (0.1, 0), (0.1, 1.5),
                                     (True, 1), ("0.1", 1)])
def test_fraction_outside_range_is_an_error(frac, mn):
    with pytest.raises(PatternError, match="ops.fraction"):
        ops.fraction(frac, min=mn)
    with pytest.raises(KascadeError):
        layer_roles(4, [0], None, 2, frac=frac, min_keys=mn)


def test_topk_sorted_breaks_ties_to_the_lower_index():
    s = torch.tensor([[0.5, 0.9, 0.5, 0.9, 0.1]])
    assert topk_sorted(s, 3).tolist() == [[1, 3, 0]]


@settings(max_examples=25)
@given(st.integers(0, 10_000), st.integers(1, 3), st.integers(1, 3), st.integers(2, 70), st.integers(1, 70))
def test_reference_selection_is_torch_topk_of_the_pooled_scores(seed, hkv, g, n, k):
    k = min(k, n)
    q, kk, _ = inputs(2, hkv * g, hkv, n, 8, seed)
    pooled = pooled_decode_scores(q[:, :, -1:], kk, 0.3)
    assert pooled.shape == (2, hkv, n)
    # pooled = sum over the G heads of each head's own softmax (post-softmax pooling)
    p = torch.softmax(torch.einsum("bhd,bhnd->bhn", q[:, :, -1].double(), kk.double().repeat_interleave(g, 1)) * 0.3,
                      dim=-1)
    torch.testing.assert_close(pooled, p.view(2, hkv, g, n).sum(2))
    mine = topk_sorted(pooled, k)
    ref = torch.topk(pooled, k, dim=-1, sorted=True).indices
    assert torch.equal(mine.sort(-1).values, ref.sort(-1).values)


def test_prefill_tile_selection_is_topk_before_the_tile():
    q, k, _ = inputs(1, 4, 2, 100, 16, seed=3)
    pooled = pooled_tile_scores(q, k, 0.25, 32)
    idx, counts = select_prefill(pooled, 32, Fraction(0.5, 4))
    assert counts == [0, 16, 32, 48]
    for t, c in enumerate(counts):
        if c:
            want = torch.topk(pooled[:, :, t, : 32 * t], c, dim=-1).indices
            assert torch.equal(idx[:, :, t, :c].sort(-1).values, want.sort(-1).values)
            assert bool((idx[:, :, t, :c] < 32 * t).all())
    # a tile's score sums its rows and G heads: rows of tile 1 are queries 32..63
    p = torch.softmax((torch.einsum("bhid,bhjd->bhij", q.double(), k.double().repeat_interleave(2, 1)) * 0.25)
                      .masked_fill(torch.ones(100, 100, dtype=torch.bool, device=DEV).triu(1), float("-inf")), -1)
    torch.testing.assert_close(pooled[0, 1, 1], p[0, 2:4, 32:64].sum(dim=(0, 1)))


# --- kernels against the reference --------------------------------------------------------------

def _run(fn_ref, fn_rt, layers, q, k, v):
    """Run the same layer sequence through the reference and the kernels; per layer outputs."""
    s1, s2 = SelectionStore(), SelectionStore()
    outs = []
    for i, layer in enumerate(layers):
        outs.append((fn_ref(layer, q, k, v, s1, i), fn_rt(layer, q, k, v, s2, i)))
    return outs, s1, s2


@pytest.mark.kernels
@pytest.mark.parametrize("n,g,hkv,d", [(160, 3, 2, 32), (97, 2, 2, 64)])
def test_prefill_kernels_match_the_reference(n, g, hkv, d):
    q, k, v = inputs(1, g * hkv, hkv, n, d, seed=n)
    hm = tuple(reversed(range(hkv)))
    layers = [KascadeLayer("dense_anchor", budget=BUDGET), KascadeLayer("reuse", budget=BUDGET, head_map=hm),
              KascadeLayer("anchor", budget=BUDGET), KascadeLayer("reuse", budget=BUDGET, head_map=(0,) * hkv)]
    outs, s1, s2 = _run(reference_prefill, RT.prefill, layers, q, k, v)
    for ref, got in outs:
        torch.testing.assert_close(got.double(), ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(outs[0][1].double(), sdpa_causal(q, k, v), atol=2e-5, rtol=2e-5)
    a, b = s1.get("kascade", layer=9, mode="prefill", length=n, batch=1), s2.get("kascade", layer=9, mode="prefill",
                                                                                  length=n, batch=1)
    assert a.counts == b.counts and a.layer == b.layer == 2
    for t, c in enumerate(a.counts):    # identical sets, in the same (descending-score) order
        assert torch.equal(a.idx[:, :, t, :c].long(), b.idx[:, :, t, :c].long())


@pytest.mark.kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_kernels_match_the_reference(dtype):
    q, k, v = inputs(2, 6, 3, 150, 32, seed=7, dtype=dtype)
    q1 = q[:, :, -1:]
    layers = [KascadeLayer("dense_anchor", budget=BUDGET), KascadeLayer("reuse", budget=BUDGET, head_map=(2, 0, 0)),
              KascadeLayer("anchor", budget=BUDGET), KascadeLayer("reuse", budget=BUDGET, head_map=(1, 1, 2))]
    s1, s2 = SelectionStore(), SelectionStore()
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    for i, layer in enumerate(layers):
        ref = reference_decode(layer, q1, k, v, s1, i)
        got = RT.decode(layer, q1, k, v, s2, i)
        torch.testing.assert_close(got.double(), ref, atol=tol, rtol=tol)
        if layer.role != "reuse" and dtype == torch.float32:
            assert torch.equal(s1._sets["kascade"].idx.long(), s2._sets["kascade"].idx.long())


@pytest.mark.kernels
def test_budget_covering_every_key_is_dense():
    q, k, v = inputs(1, 4, 2, 70, 32, seed=11)
    full = KascadeLayer("anchor", budget=Fraction(1.0, 1))
    out = RT.prefill(full, q, k, v, SelectionStore(), 0)
    torch.testing.assert_close(out.double(), sdpa_causal(q, k, v), atol=2e-5, rtol=2e-5)
    out = RT.decode(full, q[:, :, -1:], k, v, SelectionStore(), 0)
    torch.testing.assert_close(out.double(), sdpa_causal(q, k, v)[:, :, -1:], atol=2e-5, rtol=2e-5)


@pytest.mark.kernels
def test_reuse_attends_exactly_the_anchor_set_under_the_head_map():
    """Changing V at keys outside the head-mapped anchor set (and outside the tile) leaves every
    output row of the reuse layer unchanged; changing one key inside the set changes it."""
    n, hkv = 128, 2
    q, k, v = inputs(1, 4, hkv, n, 32, seed=5)
    anchor = KascadeLayer("anchor", budget=BUDGET)
    reuse = KascadeLayer("reuse", budget=BUDGET, head_map=(1, 1))
    store = SelectionStore()
    RT.prefill(anchor, q, k, v, store, 0)
    base = RT.prefill(reuse, q, k, v, store, 1)
    sel = store.get("kascade", layer=1, mode="prefill", length=n, batch=1)
    mask = prefill_mask(sel.idx.long(), sel.counts, n, 32, (1, 1))          # [1, Hkv, N, N]
    torch.testing.assert_close(base.double(), masked_attention(q, k, v, mask, 32 ** -0.5), atol=2e-5, rtol=2e-5)
    row = n - 1
    outside = (~mask[0, 0, row]).nonzero().flatten()
    inside = sel.idx[0, 1, -1, 0].item()
    v2 = v.clone()
    v2[:, 0, outside] += 100.0
    out2 = RT.prefill(reuse, q, k, v2, store, 1)
    torch.testing.assert_close(out2[:, :2, row], base[:, :2, row], atol=1e-4, rtol=1e-4)   # KV head 0 = q heads 0,1
    v3 = v.clone()
    v3[:, 0, inside] += 100.0
    assert not torch.allclose(RT.prefill(reuse, q, k, v3, store, 1)[:, :2, row], base[:, :2, row], atol=1e-2)
    # decode: the same with the decode set
    store = SelectionStore()
    q1 = q[:, :, -1:]
    RT.decode(anchor, q1, k, v, store, 0)
    base = RT.decode(reuse, q1, k, v, store, 1)
    sel = store.get("kascade", layer=1, mode="decode", length=n, batch=1)
    dm = decode_mask(sel.idx.long(), sel.counts[0], n, (1, 1))
    v2 = v.clone()
    v2[:, 0, (~dm[0, 0]).nonzero().flatten()] += 100.0
    torch.testing.assert_close(RT.decode(reuse, q1, k, v2, store, 1)[:, :2], base[:, :2], atol=1e-4, rtol=1e-4)


@pytest.mark.kernels
def test_prefill_rows_do_not_see_keys_after_their_tile():
    """The tile's selection pools all its rows, so row i may depend on keys up to the end of its
    tile (through which keys are selected), never beyond it."""
    q, k, v = inputs(1, 4, 2, 96, 32, seed=2)
    layer = KascadeLayer("anchor", budget=BUDGET)
    base = RT.prefill(layer, q, k, v, SelectionStore(), 0)
    k2, v2 = k.clone(), v.clone()
    g = torch.Generator().manual_seed(9)
    k2[:, :, 64:] = torch.randn(k2[:, :, 64:].shape, generator=g)
    v2[:, :, 64:] += 5
    torch.testing.assert_close(RT.prefill(layer, q, k2, v2, SelectionStore(), 0)[:, :, :64], base[:, :, :64])


# --- the anchor DP and head maps -----------------------------------------------------------------

def test_dp_on_a_hand_made_matrix():
    # layers 0-1, 2-3, 4-5 are blocks: anchors at the block starts are optimal
    S = torch.full((6, 6), 0.1, dtype=torch.float64).triu()
    for b in ((0, 2), (2, 4), (4, 6)):
        S[b[0]:b[1], b[0]:b[1]] = 1.0
    assert select_anchors(S, 3)[0] == (0, 2, 4)
    assert objective(S, (0, 2, 4)) == pytest.approx(6.0)
    assert select_anchors(S, 1) == ((0,), pytest.approx(float(S[0].sum())))


@settings(max_examples=40)
@given(st.integers(0, 10_000), st.integers(1, 9), st.integers(1, 4))
def test_dp_equals_brute_force(seed, L, M):
    M = min(M, L)
    g = torch.Generator().manual_seed(seed)
    S = torch.rand(L, L, generator=g, dtype=torch.float64).triu()
    a, v = select_anchors(S, M)
    b, w = brute_force_anchors(S, M)
    assert a[0] == 0 and len(a) == M and v == pytest.approx(w) and objective(S, a) == pytest.approx(v)


def test_evenly_spaced():
    assert evenly_spaced(30, 5) == (0, 6, 12, 18, 24)


def test_head_map_recovers_a_planted_permutation():
    g = torch.Generator().manual_seed(0)
    n, hkv, tile = 192, 3, 32
    probs = torch.rand(3 * hkv, n, n, generator=g, dtype=torch.float64).tril()
    probs = probs / probs.sum(-1, keepdim=True)
    perm = [2, 0, 1]            # layer 1's KV head h is layer 0's head perm[h]
    probs1 = probs.view(hkv, 3, n, n)[perm].reshape(3 * hkv, n, n)
    pooled, inside = zip(*(tile_pooled(p, hkv, tile) for p in (probs, probs1)))
    hs = head_similarity(pooled, inside, tile)
    assert torch.allclose(hs[0, 0].diagonal(), torch.ones(hkv, dtype=torch.float64))      # a layer vs itself: 1
    assert head_maps(hs, (0,))[1].tolist() == perm
    assert head_maps(hs, (0, 1))[1].tolist() == [0, 1, 2]                               # anchors: identity
    sim = Similarity(hs, torch.ones(2, dtype=torch.float64))
    assert sim.layer_sim[0, 1] == pytest.approx(1.0)


def test_similarity_counts_the_tile_mass():
    # all mass inside the tile: similarity 1 whatever the sets
    n, tile = 128, 32
    p = torch.eye(n, dtype=torch.float64)[None].repeat(2, 1, 1)
    pooled, inside = tile_pooled(p, 1, tile)
    assert torch.allclose(inside[0], torch.full((4,), 2.0 * tile, dtype=torch.float64))
    hs = head_similarity([pooled, pooled], [inside, inside], tile)
    assert torch.allclose(hs[0, 1], torch.ones(1, 1, dtype=torch.float64))


# --- patterns, trace, state ------------------------------------------------------------------------

def test_patterns_read_into_layers():
    a = kascade_layer(anchor_pattern(0.1, 128))
    assert (a.role, a.name, a.budget) == ("anchor", "kascade", Fraction(0.1, 128))
    assert kascade_layer(anchor_pattern(), dense=True).role == "dense_anchor"
    r = kascade_layer(reuse_pattern((1, 0), 0.2, 64, name="sel"))
    assert (r.role, r.name, r.head_map, r.budget) == ("reuse", "sel", (1, 0), Fraction(0.2, 64))
    sg = trace_score(ops.reuse("sel", head_map=(1, 0)))
    assert sg.graph.nodes  # traced as an index source
    with pytest.raises(KascadeError, match="computes no score"):
        sg(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 4, 8))


@pytest.mark.parametrize("make,err,word", [
    (lambda: Diag(0, 4) + Causal() * Dynamic(budget=ops.fraction(0.1), refresh=True, publish="k",
                                             score=ops.attn_score().sum(dim=1)), NotYetSupportedError, "layout"),
    (lambda: Causal() * Dynamic(budget=8, refresh=True, publish="k", score=ops.attn_score().sum(dim=1)),
     NotYetSupportedError, "fraction"),
    (lambda: Causal() * Dynamic(budget=ops.fraction(0.1), refresh=False, publish="k",
                                score=ops.attn_score().sum(dim=1)), NotYetSupportedError, "refresh"),
    (lambda: Causal() * Dynamic(budget=ops.fraction(0.1), refresh=True, publish="k",
                                score=ops.attn_score().max(dim=1)), NotYetSupportedError, "sum"),
    (lambda: Causal() * Dynamic(budget=ops.fraction(0.1), refresh=True, score=ops.reuse(3)),
     NotYetSupportedError, "name"),
])
def test_patterns_kascade_cannot_run(make, err, word):
    with pytest.raises(err, match=word):
        kascade_layer(make())


def test_bad_publish_name_and_reuse_with_transform():
    with pytest.raises(PatternError, match="publish"):
        Dynamic(budget=ops.fraction(0.1), publish="not a name")
    with pytest.raises(PatternError, match="index source"):
        trace_score(ops.reuse("x") * 2)


def test_h2o_runtime_refuses_kascade_patterns():
    from sas.runtime.kernel import SASAttnKernel
    with pytest.raises(NotYetSupportedError, match="Kascade"):
        SASAttnKernel(anchor_pattern(0.1, 16), max_len=256)


def test_state_round_trip_and_mismatch(tmp_path):
    g = torch.Generator().manual_seed(1)
    hs = torch.rand(4, 4, 2, 2, generator=g, dtype=torch.float64)
    sim = Similarity(hs, torch.rand(4, generator=g, dtype=torch.float64))
    a, v = select_anchors(sim.weighted, 2)
    p = anchor_pattern(0.1, 128)
    st_ = make_state(sim, a, p, "m", v)
    path = tmp_path / "k.safetensors"
    st_.save(path)
    back = load_state(path, p, "m")
    assert back.anchors == a and torch.equal(back.head_map, st_.head_map) and back.dp_value == pytest.approx(v)
    assert back.with_anchors((0, 2)).anchors == (0, 2)
    with pytest.raises(KascadeStateError, match="pattern"):
        load_state(path, anchor_pattern(0.2, 128), "m")
    with pytest.raises(KascadeStateError, match="model"):
        load_state(path, p, "other")
    with pytest.raises(KascadeStateError, match="does not exist"):
        load_state(tmp_path / "none.safetensors", p, "m")
    (tmp_path / "bad.safetensors").write_bytes(b"junk")
    with pytest.raises(KascadeStateError, match="readable"):
        load_state(tmp_path / "bad.safetensors", p, "m")


# --- bad input at run time -------------------------------------------------------------------------

def test_reuse_without_publisher_is_an_error_before_any_kernel():
    q, k, v = inputs(1, 4, 2, 40, 16)
    reuse = KascadeLayer("reuse", budget=BUDGET)
    for fn in (reference_prefill, RT.prefill):
        with pytest.raises(KascadeError, match="no anchor layer published"):
            fn(reuse, q, k, v, SelectionStore(), 3)
    with pytest.raises(KascadeError, match="before any anchor"):
        layer_roles(6, [2, 4], None, 2)
    # a prefill selection is stale for a decode step
    store = SelectionStore()
    reference_prefill(KascadeLayer("anchor", budget=BUDGET), q, k, v, store, 0)
    with pytest.raises(KascadeError, match="another step"):
        RT.decode(reuse, q[:, :, -1:], k, v, store, 1)


def test_head_map_of_wrong_size_or_range():
    q, k, v = inputs(1, 4, 2, 40, 16)
    store = SelectionStore()
    reference_decode(KascadeLayer("anchor", budget=BUDGET), q[:, :, -1:], k, v, store, 0)
    for hm, word in (((0, 1, 1), "3 entries"), ((0, 2), "not KV heads")):
        with pytest.raises(KascadeError, match=word):
            RT.decode(KascadeLayer("reuse", budget=BUDGET, head_map=hm), q[:, :, -1:], k, v, store, 1)
    with pytest.raises(KascadeError, match="rows"):
        layer_roles(4, [0], [[0, 1]] * 3, 2)


def test_step_shapes_are_checked():
    q, k, v = inputs(1, 4, 2, 40, 16)
    layer = KascadeLayer("anchor", budget=BUDGET)
    with pytest.raises(KernelError, match="one query"):
        RT.decode(layer, q, k, v, SelectionStore(), 0)
    with pytest.raises(KernelError, match="whole prompt"):
        RT.prefill(layer, q[:, :, :5], k, v, SelectionStore(), 0)
    with pytest.raises(KernelError, match="multiple"):
        RT.prefill(layer, q[:, :3], k, v, SelectionStore(), 0)
    with pytest.raises(SASError, match="tile=.* must be a positive integer"):
        KascadeLayer("anchor", tile=0)


@pytest.mark.kernels
def test_prefill_kernels_with_one_token_tiles():
    """tile=1: every row selects by its own GQA-pooled scores (the causal, decode-like form)."""
    q, k, v = inputs(1, 2, 2, 20, 16, seed=4)
    b = Fraction(0.25, 2)
    layers = [KascadeLayer("anchor", budget=b, tile=1), KascadeLayer("reuse", budget=b, head_map=(1, 0), tile=1)]
    outs, s1, s2 = _run(reference_prefill, RT.prefill, layers, q, k, v)
    for ref, got in outs:
        torch.testing.assert_close(got.double(), ref, atol=2e-5, rtol=2e-5)
    a = s1.get("kascade", layer=9, mode="prefill", length=20, batch=1)
    bb = s2.get("kascade", layer=9, mode="prefill", length=20, batch=1)
    for t, c in enumerate(a.counts):   # dense tiles (c == t): the kernel path lists them in key order
        x, y = a.idx[:, :, t, :c].long(), bb.idx[:, :, t, :c].long()
        assert torch.equal(x.sort(-1).values, y.sort(-1).values) if c == t else torch.equal(x, y)
