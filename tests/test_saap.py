"""Saap (ops.partition): k-means, the query classifier, the CSR decode kernel against the exact
reference, SASAttnKernel wiring, the state file, bad input (docs/dynamic.md section 6)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sas import Causal, Diag, Dynamic, Rect, ops
from sas.dynamic.trace import trace_score
from sas.errors import KernelError, NotYetSupportedError, PatternError, SASError
from sas.methods.saap import (CLASSIFIER_PARTS, SaapLayer, assign, bucket_mass, classifier_probs, fit_layer,
                              group_scores, kmeans, probe, saap_attention_reference, train_classifier)
from sas.methods.saap_runtime import SaapDecoder, build_csr
from sas.methods.saap_state import SaapStateError, load_state, make_state, pattern_hash
from sas.runtime.kernel import SASAttnKernel

from helpers.attention import DEV


def saap_pattern(sink: int, window: int, probes: int, budget: int = 1, refresh: bool = True, chain=None):
    dense = (Rect(cols=(0, sink)) + Diag(0, window)) * Causal() if sink else Diag(0, window) * Causal()
    score = ops.partition(centroids="cent", classifier="qclf", probes=probes).sum(dim=1) if chain is None else chain
    return dense + (Causal() * ~dense) * Dynamic(budget=budget, score=score, refresh=refresh)


def random_layer(hkv: int, c: int, d: int, hidden: int = 8, seed: int = 0) -> SaapLayer:
    g = torch.Generator().manual_seed(seed)
    return SaapLayer(torch.randn(hkv, c, d, generator=g), torch.randn(hkv, d, hidden, generator=g),
                     torch.randn(hkv, hidden, generator=g), torch.randn(hkv, hidden, c, generator=g),
                     torch.randn(hkv, c, generator=g))


def inputs(b, hq, hkv, n, d, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*s, generator=g).to(dtype) for s in ((b, hq, n, d), (b, hkv, n, d), (b, hkv, n, d)))


def other_inputs(layer: SaapLayer) -> dict[str, torch.Tensor]:
    return {"cent": layer.centroids, **{f"qclf_{p}": getattr(layer, p) for p in CLASSIFIER_PARTS}}


# --- k-means and the classifier -----------------------------------------------------------------

def clustered(n_clusters=8, per=40, d=16, seed=0, spread=0.15):
    g = torch.Generator().manual_seed(seed)
    centers = torch.nn.functional.normalize(torch.randn(n_clusters, d, generator=g), dim=-1) * 4
    labels = torch.arange(n_clusters).repeat_interleave(per)
    x = centers[labels] + spread * torch.randn(n_clusters * per, d, generator=g)
    return x, labels, centers


def test_kmeans_recovers_separated_clusters_and_assign_is_brute_force():
    x, labels, _ = clustered()
    c = kmeans(x, 8, iters=10, seed=0, n_init=4)
    a = assign(x, c)
    # Lloyd fixed point: every centroid is the mean of its points
    for j in range(8):
        assert torch.allclose(c[j], x[a == j].mean(0), atol=1e-4)
    # each true cluster maps to exactly one centroid and vice versa
    pairs = {(int(t), int(p)) for t, p in zip(labels, a)}
    assert len(pairs) == 8 and len({p for _, p in pairs}) == 8
    brute = torch.tensor([min(range(8), key=lambda j: float(((xi - c[j]) ** 2).sum())) for xi in x])
    assert torch.equal(a, brute)
    assert torch.equal(kmeans(x, 8, seed=3), kmeans(x, 8, seed=3))


def test_classifier_recall_of_true_top_keys_rises_with_probes():
    torch.manual_seed(0)
    keys, labels, centers = clustered(n_clusters=8, per=32, d=16, seed=1)
    g = torch.Generator().manual_seed(2)
    # queries point at one key cluster each (asymmetric: a scaled, noisy copy of its centre)
    qlab = torch.randint(8, (512,), generator=g)
    q = 1.5 * centers[qlab] + 0.8 * torch.randn(512, 16, generator=g)
    cent = kmeans(keys, 8, seed=0)
    bk = assign(keys, cent)
    targets = bucket_mass(q, keys, bk, 8)
    clf = train_classifier(q[:384], targets[:384], hidden=32, steps=300, lr=3e-3, seed=0)
    held = q[384:]
    probs = classifier_probs(held[None, None], *(t[None] for t in clf.folded()))[0, 0]
    top_keys = (held @ keys.t()).topk(16, dim=-1).indices                # exact top-16 keys per query
    recalls = []
    for ell in (1, 2, 4, 8):
        probed = probs.topk(ell, dim=-1).indices
        hit = (bk[top_keys][:, :, None] == probed[:, None, :]).any(-1)
        recalls.append(float(hit.float().mean()))
    assert recalls == sorted(recalls) and recalls[-1] == 1.0
    assert recalls[0] > 0.6          # 1 of 8 buckets (12.5% of the keys) holds most of the top keys
    # the trained classifier beats a uniform ranking on held-out KL
    t = targets[384:]
    kl = torch.nn.functional.kl_div(probs.log(), t, reduction="batchmean")
    kl_uniform = torch.nn.functional.kl_div(torch.full_like(probs, 1 / 8).log(), t, reduction="batchmean")
    assert kl < 0.5 * kl_uniform


def test_folded_classifier_equals_module_in_eval_mode():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(64, 8, generator=g)
    clf = train_classifier(q, torch.softmax(torch.randn(64, 5, generator=g), -1), hidden=16, steps=5, seed=0)
    want = torch.softmax(clf(q), -1)
    got = classifier_probs(q[None, None], *(t[None] for t in clf.folded()))[0, 0]
    assert torch.allclose(got, want, atol=1e-5)


def test_group_score_is_a_sum_over_the_gqa_group():
    layer = random_layer(2, 6, 8)
    q = torch.randn(1, 4, 1, 8, generator=torch.Generator().manual_seed(1))
    s = group_scores(q, layer.classifier, 2)
    for h in range(2):
        want = sum(classifier_probs(q[:, 2 * h + g][:, None], *(t[h:h + 1] for t in layer.classifier))[0, 0, 0]
                   for g in range(2))
        assert torch.allclose(s[0, h], want, atol=1e-6)
    # the traced chain gives each key the group score of its bucket
    k = torch.randn(1, 2, 10, 8, generator=torch.Generator().manual_seed(2))
    sg = trace_score(ops.partition(centroids="cent", classifier="qclf", probes=2).sum(dim=1))
    per_key = sg(torch.zeros(1, 4, 1, 10), q, k, other_inputs(layer))
    bk = assign(k, layer.centroids[None])
    assert torch.allclose(per_key, s.gather(2, bk), atol=1e-6)


def test_csr_index_invariants():
    g = torch.Generator().manual_seed(0)
    bucket_of = torch.randint(5, (2, 3, 40), generator=g, dtype=torch.int32)
    off, idx = build_csr(bucket_of, 3, 30, 5)
    assert torch.all(off[..., 0] == 0) and torch.all(off[..., -1] == 27)
    assert torch.all(off[..., 1:] >= off[..., :-1])
    for b in range(2):
        for h in range(3):
            keys = idx[b, h, :27].long()
            assert sorted(keys.tolist()) == list(range(3, 30))
            for c in range(5):
                seg = keys[off[b, h, c]:off[b, h, c + 1]]
                assert torch.all(bucket_of[b, h, seg] == c)


# --- the kernel against the exact reference ----------------------------------------------------------

def run_decoder(layer, probes, sink, window, q, k, v, prefill, rebuild_every, max_len=None, chunk=256, split=1):
    """The decoder on DEV (layer and inputs moved there), over the CPU-built inputs: the outputs
    and the per-step looked-up counts come back on the CPU (the decoder stays on DEV)."""
    layer, q, k, v = layer.to(DEV), q.to(DEV), k.to(DEV), v.to(DEV)
    dec = SaapDecoder(layer, probes, sink=sink, window=window, max_len=max_len or q.shape[2],
                      rebuild_every=rebuild_every, block_n=16, chunk=chunk, split=split)
    outs = [dec.prefill(q[:, :, :prefill], k[:, :, :prefill], v[:, :, :prefill])]
    looked = []
    for i in range(prefill, q.shape[2]):
        outs.append(dec.decode(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1]))
        looked.append(dec.last_looked_up.cpu())
    return torch.cat(outs, 2).cpu(), looked, dec


@pytest.mark.parametrize("b,hq,hkv,d,c,probes,sink,window,rebuild,chunk,split", [
    (1, 4, 2, 16, 8, 3, 1, 8, 3, 256, 1),     # GQA 2, index rebuilt mid-run, pending keys filtered
    (2, 2, 2, 16, 6, 2, 2, 5, 100, 4, 1),     # MHA, two sinks, never rebuilt; window and pending in 4-key pieces
    (1, 6, 2, 16, 4, 4, 0, 6, 4, 3, 3),       # no sink; probes = C: the whole causal triangle; buckets in 3 pieces
])
def test_kernel_matches_reference(b, hq, hkv, d, c, probes, sink, window, rebuild, chunk, split):
    n, prefill = 38, 28
    q, k, v = inputs(b, hq, hkv, n, d, seed=hq + d)
    layer = random_layer(hkv, c, d, seed=c)
    ref = saap_attention_reference(q, k, v, layer, probes, sink=sink, window=window, prefill_len=prefill)
    out, looked, _ = run_decoder(layer, probes, sink, window, q, k, v, prefill, rebuild, chunk=chunk, split=split)
    assert (out.double() - ref.out).abs().max() < 1e-4
    for step, i in enumerate(range(prefill, n)):
        assert torch.equal(looked[step], ref.looked_up[i])
    if probes == c:   # every bucket probed: dense causal attention
        g = hq // hkv
        dense = torch.nn.functional.scaled_dot_product_attention(
            q.double(), k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1), is_causal=True)
        assert (out.double() - dense).abs().max() < 1e-4


def test_kernel_bf16():
    q, k, v = inputs(1, 4, 2, 36, 16, seed=5, dtype=torch.bfloat16)
    layer = random_layer(2, 8, 16, seed=1)
    ref = saap_attention_reference(q, k, v, layer, 2, sink=1, window=6, prefill_len=30)
    out, _, _ = run_decoder(layer, 2, 1, 6, q, k, v, 30, 2)
    assert (out.double() - ref.out)[:, :, 30:].abs().max() < 3e-2


@settings(max_examples=3, deadline=None)
@given(sink=st.integers(0, 3), window=st.integers(1, 9), probes=st.integers(1, 5), seed=st.integers(0, 100))
def test_kernel_matches_reference_random(sink, window, probes, seed):
    n, prefill, c = 30, 24, 5
    q, k, v = inputs(1, 2, 1, n, 16, seed=seed)
    layer = random_layer(1, c, 16, seed=seed)
    ref = saap_attention_reference(q, k, v, layer, probes, sink=sink, window=window, prefill_len=prefill)
    out, looked, _ = run_decoder(layer, probes, sink, window, q, k, v, prefill, 3, chunk=2, split=2)
    assert (out.double() - ref.out).abs().max() < 1e-4
    assert all(torch.equal(x, ref.looked_up[prefill + s]) for s, x in enumerate(looked))


# --- SASAttnKernel: ops.partition through Dynamic ----------------------------------------------------

def test_sasattnkernel_runs_partition_like_reference():
    n, prefill, sink, window, c, probes = 36, 28, 1, 6, 8, 3
    q, k, v = inputs(1, 4, 2, n, 16, seed=11)
    layer = random_layer(2, c, 16, seed=3)
    kern = SASAttnKernel(saap_pattern(sink, window, probes), other_inputs=other_inputs(layer.to(DEV)), max_len=64)
    assert kern.dynamic.report()["window"] == window and kern.dynamic.report()["sink"] == sink
    qd, kd, vd = q.to(DEV), k.to(DEV), v.to(DEV)        # the kernel's inputs; the reference stays on the CPU
    outs = [kern.prefill(qd[:, :, :prefill], kd[:, :, :prefill], vd[:, :, :prefill])]
    for i in range(prefill, n):
        outs.append(kern.decode(qd[:, :, i:i + 1], kd[:, :, i:i + 1], vd[:, :, i:i + 1]))
    ref = saap_attention_reference(q, k, v, layer, probes, sink=sink, window=window, prefill_len=prefill)
    assert (torch.cat(outs, 2).cpu().double() - ref.out).abs().max() < 1e-4
    assert torch.equal(kern.dynamic.last_looked_up.cpu(), ref.looked_up[n - 1])
    # a bad decode call raises before touching the cache; the next good call still matches
    kern.reset()
    kern.prefill(qd[:, :, :prefill], kd[:, :, :prefill], vd[:, :, :prefill])
    with pytest.raises(KernelError):
        kern.decode(qd[:, :, prefill:prefill + 1], kd[:, :1, prefill:prefill + 1], vd[:, :1, prefill:prefill + 1])
    assert kern.length == prefill
    o = kern.decode(qd[:, :, prefill:prefill + 1], kd[:, :, prefill:prefill + 1], vd[:, :, prefill:prefill + 1])
    assert (o.cpu().double() - ref.out[:, :, prefill:prefill + 1]).abs().max() < 1e-4


def test_bad_input_raises_before_any_kernel():
    layer = random_layer(2, 8, 16)
    for bad in (0, -1, True, 2.5):
        with pytest.raises(PatternError, match="probes"):
            ops.partition(centroids="cent", classifier="qclf", probes=bad)
    with pytest.raises(PatternError, match=r"probes must be an integer in \[1, 8\]"):
        SASAttnKernel(saap_pattern(1, 6, 9), other_inputs=other_inputs(layer), max_len=64)
    missing = other_inputs(layer)
    del missing["qclf_w2"]
    with pytest.raises(KernelError, match="qclf_w2"):
        SASAttnKernel(saap_pattern(1, 6, 2), other_inputs=missing, max_len=64)
    wrong = other_inputs(layer)
    wrong["qclf_b2"] = torch.zeros(2, 7)
    with pytest.raises(KernelError, match="b2"):
        SASAttnKernel(saap_pattern(1, 6, 2), other_inputs=wrong, max_len=64)
    with pytest.raises(NotYetSupportedError, match="sum"):
        SASAttnKernel(saap_pattern(1, 6, 2, chain=ops.partition(centroids="cent", classifier="qclf",
                                                                 probes=2).max(dim=1)),
                      other_inputs=other_inputs(layer), max_len=64)
    with pytest.raises(NotYetSupportedError, match="refresh=True"):
        SASAttnKernel(saap_pattern(1, 6, 2, refresh=False), other_inputs=other_inputs(layer), max_len=64)
    odd = Diag(0, 4) * Causal() + Diag(6, 10) * Dynamic(
        budget=2, refresh=True, score=ops.partition(centroids="cent", classifier="qclf", probes=2).sum(dim=1))
    with pytest.raises(NotYetSupportedError, match="sink"):
        SASAttnKernel(odd, other_inputs=other_inputs(layer), max_len=64)
    # state for other heads / head dim than the step's tensors
    kern = SASAttnKernel(saap_pattern(1, 6, 2), other_inputs=other_inputs(layer), max_len=64)
    q, k, v = (t.to(DEV) for t in inputs(1, 3, 3, 8, 16))
    with pytest.raises(KernelError, match="centroids"):
        kern.prefill(q, k, v)
    with pytest.raises(KernelError, match="prefill"):
        kern.dynamic.decoder.decode(q[:, :, :1], k[:, :, :1], v[:, :, :1])
    # index vectors (pre-RoPE q / k) of another shape, dtype or type: refused, the state unchanged
    # (before: a raw einsum / bmm RuntimeError from inside the step)
    q, k, v = (t.to(DEV) for t in inputs(1, 4, 2, 9, 16))
    kern.prefill(q[:, :, :8], k[:, :, :8], v[:, :, :8])
    one = [t[:, :, 8:9] for t in (q, k, v)]
    for kw, name in (({"q_index": one[0][..., :5]}, "q_index"), ({"k_index": one[1][:, :1]}, "k_index"),
                     ({"q_index": one[0].long()}, "q_index"), ({"k_index": "pre-rope"}, "k_index")):
        with pytest.raises(KernelError, match=f"{name} must be a floating-point tensor of"):
            kern.dynamic.decode(*one, **kw)
        with pytest.raises(KernelError, match=name):
            kern.dynamic.decoder.prefill(q[:, :, :8], k[:, :, :8], v[:, :, :8],
                                         **{n: (x[:, :, :1] if isinstance(x, torch.Tensor) else x)
                                            for n, x in kw.items()})
    assert kern.length == 8
    assert kern.dynamic.decode(*one, q_index=one[0], k_index=one[1]).shape == (1, 4, 1, 16)


def test_tensors_off_cuda_are_refused_without_the_interpreter(monkeypatch):
    """CPU tensors without TRITON_INTERPRET=1: a KernelError naming the device before any work
    (before: the prompt was taken, then the first decode failed in Triton's driver with "Pointer
    argument cannot be accessed from Triton")."""
    layer = random_layer(2, 8, 16)
    kern = SASAttnKernel(saap_pattern(1, 6, 2), other_inputs=other_inputs(layer), max_len=64)
    q, k, v = inputs(1, 4, 2, 9, 16)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(KernelError, match="q is on cpu.*TRITON_INTERPRET=1"):
        kern.prefill(q, k, v)
    assert kern.dynamic.state is None


# --- the state file ----------------------------------------------------------------------------

def test_state_round_trip_and_mismatch(tmp_path):
    pat = saap_pattern(1, 6, 2)
    layers = {0: random_layer(2, 8, 16, seed=0), 3: random_layer(2, 8, 16, seed=1)}
    path = tmp_path / "saap.safetensors"
    make_state(layers, pat, "smollm2-135m").save(path)
    got = load_state(path, pat, "smollm2-135m")
    assert sorted(got.layers) == [0, 3] and got.pattern_hash == pattern_hash(pat)
    for i in layers:
        for name in ("centroids",) + CLASSIFIER_PARTS:
            assert torch.equal(getattr(got.layers[i], name), getattr(layers[i], name))
    oi = got.other_inputs(3)
    assert torch.equal(oi["qclf_w1"], layers[3].w1)
    with pytest.raises(SaapStateError, match="pattern"):
        load_state(path, saap_pattern(1, 7, 2), "smollm2-135m")
    with pytest.raises(SaapStateError, match="model"):
        load_state(path, pat, "llama")
    with pytest.raises(SaapStateError, match="no layer 1"):
        got.other_inputs(1)
    with pytest.raises(SaapStateError, match="does not exist"):
        load_state(tmp_path / "nope.safetensors", pat, "smollm2-135m")
    (tmp_path / "junk.safetensors").write_bytes(b"not a file")
    with pytest.raises(SaapStateError, match="readable"):
        load_state(tmp_path / "junk.safetensors", pat, "smollm2-135m")
    assert issubclass(SaapStateError, SASError)


def test_fit_layer_targets_skip_the_window():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 48, 8, generator=g), torch.randn(1, 48, 8, generator=g)
    layer = fit_layer(q, k, q, k, 1, 4, sink=1, window=8, hidden=8, steps=10, seed=0)
    layer.check(1, 8, "test")
    assert layer.clusters == 4
    probs = classifier_probs(q[None, :1, :4], *layer.classifier)
    assert torch.allclose(probs.sum(-1), torch.ones(1, 1, 4), atol=1e-5)
    assert math.isfinite(float(probs.sum()))
