"""SpecAttn (ops.external(...).top_p): the SASAttnKernel runtime against the float64 reference,
the traced top_p op, the layer alignment DP against brute force, the alignment file, the draft
integration (kernel path == exact-mask path on a tiny Llama), bad input (docs/specattn.md)."""

from __future__ import annotations

import copy
import itertools
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sas import Causal, Diag, Dynamic, ops
from sas.dynamic.trace import trace_score
from sas.errors import IntegrationError, KernelError, NotYetSupportedError, SASError
from sas.methods.specattn import specattn_attention_reference
from sas.methods.specattn_align import (AlignmentError, Alignment, align, kl_rows, load_alignment, make_alignment,
                                        parse_draft_layers, similarity)
from sas.methods.threshold import select_reference
from sas.runtime.kernel import SASAttnKernel

from helpers.attention import DEV

sys.path.insert(0, str(Path(__file__).parent))


def spec_pattern(p=0.8, chunk=1, pooled=False, window=4, refresh=True, chain=None):
    score = ops.external("draft_attn").top_p(p, chunk=chunk, pooled=pooled) if chain is None else chain
    dyn = Dynamic(budget=1, refresh=refresh, score=score)
    if not window:
        return Causal() * dyn
    return Diag(0, window) + (Causal() * ~Diag(0, window)) * dyn


def inputs(b, hq, hkv, n, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*s, generator=g) for s in ((b, hq, n, d), (b, hkv, n, d), (b, hkv, n, d)))
    causal = torch.triu(torch.full((n, n), -math.inf), 1)
    draft = torch.softmax(torch.randn(b, hq, n, n, generator=g) * 3 + causal, -1)
    return q, k, v, draft


@pytest.mark.kernels
@pytest.mark.parametrize("pooled,chunk,gamma,window", [(False, 1, 1, 4), (True, 16, 3, 0)])
def test_kernel_matches_reference(pooled, chunk, gamma, window):
    b, hq, hkv, n, d, prompt = 1, 4, 2, 44, 16, 36
    q, k, v, draft = inputs(b, hq, hkv, n, d, seed=chunk)
    qd, kd, vd, dd = (t.to(DEV) for t in (q, k, v, draft))    # the kernel's inputs; the reference's stay on the CPU
    ker = SASAttnKernel(spec_pattern(0.8, chunk, pooled, window), other_inputs={"draft_attn": dd}, max_len=64)
    outs = [ker.prefill(qd[:, :, :prompt], kd[:, :, :prompt], vd[:, :, :prompt])]
    for i in range(prompt, n, gamma):
        j = min(n, i + gamma)
        if gamma == 1:
            outs.append(ker.decode(qd[:, :, i:j], kd[:, :, i:j], vd[:, :, i:j]))
        else:   # the verification step, scores passed per step
            outs.append(ker.dynamic.step(qd[:, :, i:j], kd[:, :, i:j], vd[:, :, i:j], scores=dd[:, :, i:j, :j]))
    ref = specattn_attention_reference(q, k, v, draft, 0.8, chunk=chunk, pooled=pooled, window=window,
                                       prefill_len=prompt, gamma=gamma)
    assert torch.allclose(torch.cat(outs, 2).cpu().double(), ref.out, atol=1e-5)
    # the last step's selection is the reference's, and loads are counted
    assert ker.dynamic.last_selected.shape == (b, hkv, n)
    assert (ker.dynamic.last_loaded <= n).all() and 0.0 <= ker.dynamic.loads_skipped() < 1.0


@pytest.mark.kernels
@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(1, 700), st.sampled_from([1, 3, 16, 40]), st.integers(0, 5),
       st.integers(0, 40), st.integers(1, 4), st.floats(0.0, 0.3), st.integers(0, 10_000))
def test_plan_kernel_lists_the_chunks_of_visit_chunks(m, i1, chunk, sink, window, lq, density, seed):
    """`specattn_plan_kernel` (blocks of 16 chunks here, several blocks a row) against the torch
    reference `visit_chunks` over the expanded key mask: the same chunks, ascending, and the
    same count of keys loaded."""
    from sas.methods.specattn import visit_chunks
    from sas.methods.specattn_triton import specattn_plan_kernel
    from sas.methods.threshold import expand_chunks

    i0 = max(0, i1 - lq)
    g = torch.Generator().manual_seed(seed)
    nc = -(-i1 // chunk)
    selc = torch.rand(m, nc, generator=g) < density
    nch = -(-(i1 + 37) // 16)                       # room past the keys, as the cache's max_len gives
    visit_ref, loaded_ref = visit_chunks(expand_chunks(selc, chunk, i1), i0, i1, sink, window, nch)
    visit = torch.full((m, nch), -1, dtype=torch.int32, device=DEV)
    count, loaded = (torch.zeros(m, dtype=torch.int32, device=DEV) for _ in range(2))
    specattn_plan_kernel[(m,)](selc.to(DEV), visit, count, loaded, nc, nch, chunk, i0, i1, sink, window, BLOCK=16)
    visit, count, loaded = visit.cpu(), count.cpu(), loaded.cpu()
    for r in range(m):
        want = torch.nonzero(visit_ref[r])[:, 0]
        assert int(count[r]) == len(want)
        assert torch.equal(visit[r, :len(want)].long(), want)
    assert torch.equal(loaded.long(), loaded_ref)


def test_reference_p1_is_dense_and_low_p_attends_less():
    q, k, v, draft = inputs(1, 2, 1, 24, 8, seed=3)
    dense = specattn_attention_reference(q, k, v, draft, 1.0, prefill_len=8)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double().repeat_interleave(2, 1),
                                                            v.double().repeat_interleave(2, 1), is_causal=True)
    assert torch.allclose(dense.out, sdpa, atol=1e-10)
    low = specattn_attention_reference(q, k, v, draft, 0.3, prefill_len=8)
    assert low.attended.sum() < dense.attended.sum()
    # every decode row keeps at least mass p of its own draft row (the union can only add)
    for i in range(8, 24):
        keep = low.attended[0, 0, i, : i + 1]
        for h in range(2):
            assert float(draft[0, h, i, : i + 1][keep].sum()) >= 0.3 - 1e-6


def test_traced_top_p_is_the_union_of_row_nuclei():
    sg = trace_score(ops.external("d").top_p(0.5))
    q, k, _, draft = inputs(1, 4, 2, 10, 8, seed=1)
    rows = draft[:, :, 6:9, :9]                                     # a 3-query step
    got = sg(torch.zeros_like(rows), q[:, :, 6:9], k[:, :, :9], {"d": rows})
    for h in range(2):
        want = select_reference(rows[0, 2 * h:2 * h + 2].reshape(1, 6, 1, 9), p=0.5).mask[0]
        assert torch.equal(got[0, h].bool(), want)
    pooled = trace_score(ops.external("d").top_p(0.5, pooled=True))(torch.zeros_like(rows), q[:, :, 6:9],
                                                                      k[:, :, :9], {"d": rows})
    want = select_reference(rows[0, 0:2].transpose(0, 1)[None], p=0.5).mask[0]
    assert torch.equal(pooled[0, 0].bool(), want)


# --- bad input -----------------------------------------------------------------------------------

def test_bad_external_scores():
    q, k, v, draft = inputs(1, 4, 2, 20, 16)
    ker = SASAttnKernel(spec_pattern(), other_inputs={}, max_len=32)
    ker.prefill(q[:, :, :16], k[:, :, :16], v[:, :, :16])
    for bad in (draft[:, :2, 16:17, :17], draft[:, :, 16:17, :16], draft[:, :, 16:17, :17].long(), "x",
                draft[:, :, 16:17, :17].to("meta")):
        with pytest.raises(KernelError, match="external score|on meta"):
            ker.dynamic.step(q[:, :, 16:17], k[:, :, 16:17], v[:, :, 16:17], scores=bad)
    with pytest.raises(KernelError, match="no draft scores"):
        ker.decode(q[:, :, 16:17], k[:, :, 16:17], v[:, :, 16:17])
    step = (q[:, :, 16:17], k[:, :, 16:17], v[:, :, 16:17])
    scores = draft[:, :, 16:17, :17]
    with pytest.raises(KernelError, match="do not match the cache"):       # a bf16 q over a float32 cache
        ker.dynamic.step(step[0].bfloat16(), *step[1:], scores=scores)
    with pytest.raises(KernelError, match="requires grad"):
        ker.dynamic.step(step[0].clone().requires_grad_(), *step[1:], scores=scores)
    assert ker.length == 16                                     # nothing was written
    short = SASAttnKernel(spec_pattern(), other_inputs={"draft_attn": draft[:, :, :10, :10]}, max_len=32)
    short.prefill(q[:, :, :16], k[:, :, :16], v[:, :, :16])
    with pytest.raises(KernelError, match="full-sequence"):
        short.decode(q[:, :, 16:17], k[:, :, 16:17], v[:, :, 16:17])


def test_unsupported_chains_and_modes():
    with pytest.raises(NotYetSupportedError, match="refresh=True"):
        SASAttnKernel(spec_pattern(refresh=False), max_len=32)
    with pytest.raises(NotYetSupportedError, match="whole"):
        SASAttnKernel(spec_pattern(chain=ops.external("draft_attn").top_p(0.9) * 2), max_len=32)


# --- layer alignment ------------------------------------------------------------------------------

def brute_force(s: torch.Tensor) -> float:
    nd, nv = s.shape
    return max(sum(float(s[f[j], j]) for j in range(nv))
               for f in itertools.combinations_with_replacement(range(nd), nv))


def test_alignment_counts_the_84_maps_and_identity():
    assert len(list(itertools.combinations_with_replacement(range(4), 6))) == 84
    s = -torch.rand(5, 5, generator=torch.Generator().manual_seed(0)) - 0.1
    s.fill_diagonal_(0.0)
    assert align(s)[0] == (0, 1, 2, 3, 4)


@settings(max_examples=40)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(0, 10_000))
def test_alignment_dp_equals_brute_force(nd, nv, seed):
    s = torch.randn(nd, nv, generator=torch.Generator().manual_seed(seed)).double()
    f, score = align(s)
    assert all(a <= b for a, b in zip(f, f[1:])) and len(f) == nv and all(0 <= i < nd for i in f)
    assert score == pytest.approx(sum(float(s[f[j], j]) for j in range(nv)), abs=1e-12)
    assert score == pytest.approx(brute_force(s), abs=1e-12)


def test_kl_rows_by_hand_and_eps_clamp():
    t = torch.tensor([[0.5, 0.5, 0.0]])
    d = torch.tensor([[0.25, 0.75, 0.0]])
    want = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert float(kl_rows(t, d)) == pytest.approx(want)
    assert float(kl_rows(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]]), eps=1e-8)) == pytest.approx(
        -math.log(1e-8))
    maps = [torch.softmax(torch.randn(2, 6, 6, generator=torch.Generator().manual_seed(i)), -1) for i in range(3)]
    s = similarity(maps, maps)
    assert torch.allclose(s.diagonal(), torch.zeros(3, dtype=torch.float64), atol=1e-12) and (s <= 1e-12).all()


def test_alignment_file_round_trip_and_other_model(tmp_path):
    maps = [torch.softmax(torch.randn(2, 6, 6, generator=torch.Generator().manual_seed(i)), -1) for i in range(3)]
    al = make_alignment(maps[:2], maps, "ModelA", "layers:0,2")
    path = tmp_path / "a.json"
    al.save(path)
    back = load_alignment(path, "ModelA", "layers:0,2", num_layers=3)
    assert back == al
    with pytest.raises(AlignmentError, match="target model 'ModelA', not 'ModelB'"):
        load_alignment(path, "ModelB")
    with pytest.raises(AlignmentError, match="draft"):
        load_alignment(path, "ModelA", "layers:0,1")
    with pytest.raises(AlignmentError, match="maps 3 target layers"):
        load_alignment(path, "ModelA", num_layers=30)
    data = json.loads(path.read_text())
    data["mapping"] = [1, 0, 0]
    path.write_text(json.dumps(data))
    with pytest.raises(AlignmentError, match="monotone"):
        load_alignment(path, "ModelA")
    path.write_text("{not json")
    with pytest.raises(AlignmentError):
        load_alignment(path, "ModelA")
    with pytest.raises(AlignmentError):
        load_alignment(tmp_path / "missing.json", "ModelA")
    assert isinstance(Alignment, type) and issubclass(AlignmentError, SASError)


def test_draft_layer_arguments():
    assert parse_draft_layers("every:3", 10) == (0, 3, 6, 9)
    assert parse_draft_layers("0,2,5", 10) == (0, 2, 5)
    for bad in ("every:0", "2,1", "0,10", "a", ""):
        with pytest.raises(AlignmentError):
            parse_draft_layers(bad, 10)


def test_align_cli_bad_arguments(tmp_path):
    from click.testing import CliRunner

    from sas.cli.main import cli
    r = CliRunner().invoke(cli, ["align", "--tokens", "0", "-o", str(tmp_path / "a.json")])
    assert r.exit_code == 2 and "--tokens" in r.output
    r = CliRunner().invoke(cli, ["align", "-o", str(tmp_path / "no" / "a.json")])
    assert r.exit_code == 2 and "--output" in r.output
    assert not (tmp_path / "a.json").exists()


# --- the draft integration ------------------------------------------------------------------------

@pytest.mark.kernels
def test_draft_integration_kernel_path_equals_mask_path():
    from model_fixtures import tiny_llama

    from sas.integrations.specattn_draft import masked_logits, run_with_draft, specattn_masks, specattn_pattern
    from sas.integrations.transformers import sas_attention
    from sas.methods.specattn_align import attention_maps, layer_subset_model

    # both paths on DEV (the triton backend needs the model there): the mask path's draft maps
    # then come from the same device as the draft the kernel path runs beside the target
    base = copy.deepcopy(tiny_llama()).to(DEV)         # a copy: tiny_llama() is cached, .to moves in place
    draft = layer_subset_model(base, [0])
    ids = torch.randint(0, 49152, (1, 26), generator=torch.Generator().manual_seed(0)).to(DEV)
    masks, stats = specattn_masks(attention_maps(draft, ids), (0, 0), [1], 4, 2, p=0.3, prefill_len=20, gamma=3,
                                  chunk=1)
    want = masked_logits(copy.deepcopy(base), ids, masks)
    dense = masked_logits(copy.deepcopy(base), ids, {})
    assert stats["keys_skipped"] > 0 and not torch.allclose(want, dense, atol=1e-3)   # the masks matter
    target = sas_attention(copy.deepcopy(base), {1: specattn_pattern(0.3, chunk=1)}, backend="triton", max_len=64)
    got = run_with_draft(target, draft, (0, 0), ids, prefill_len=20, gamma=3, sparse_layers=[1])
    assert torch.allclose(got, want, atol=1e-4)
    # without a draft: generate is refused before it starts, a forward step without scores names run_with_draft
    with pytest.raises(IntegrationError, match=r"layer\(s\) \[1\] run a SpecAttn pattern.*run_with_draft"):
        target.generate(ids[:, :20], max_new_tokens=2, do_sample=False)
    assert target.generate(ids[:, :20], max_new_tokens=2, do_sample=False, use_cache=False).shape == (1, 22)
    from sas.integrations.transformers import SASCache
    cache = SASCache(target)
    with torch.no_grad():
        target(ids[:, :20], past_key_values=cache, use_cache=True)
        with pytest.raises(IntegrationError, match="no draft scores were given.*run_with_draft"):
            target(ids[:, 20:21], past_key_values=cache, use_cache=True)
