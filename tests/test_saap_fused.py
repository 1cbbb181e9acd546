"""Saap fused route kernel (`sas.methods.saap_route`, `SaapDecoder(route="fused")`) against the
torch path (`assign`, `probe(group_scores(...))`, cache writes) and the float64 reference."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sas.errors import KernelError, NotYetSupportedError
from sas.methods.saap import SaapLayer, assign, group_scores, probe, saap_attention_reference
from sas.methods.saap_runtime import ROUTE_BLOCK_C, ROUTE_MAX_CLUSTERS, SaapDecoder

from helpers.attention import DEV

pytestmark = pytest.mark.kernels


def layer_and_step(b, hkv, g, d, c, hidden, seed, ties):
    """A random layer and one step's tensors. With `ties`: about half the classifier columns
    (w2, b2) duplicate another column, so those buckets' group scores are equal floats on both
    paths (same products, same order); centroids and keys are small integers (distances exact
    in float32) with duplicated centroids, so nearest-centroid ties are exact too.

    (Small-integer classifier data would also make scores that are equal only as real numbers,
    e.g. two columns whose per-row logits are permutations of each other: their float sums
    depend on the summation order, which differs between the paths: not a tie either path
    sees, so not drawn here.)"""
    gen = torch.Generator().manual_seed(seed)

    def draw(*shape, integer=False):
        if integer:
            return torch.randint(-2, 3, shape, generator=gen).float()
        return torch.randn(*shape, generator=gen)

    cent = draw(hkv, c, d, integer=ties)
    w1, b1, w2, b2 = draw(hkv, d, hidden), draw(hkv, hidden), draw(hkv, hidden, c), draw(hkv, c)
    if ties and c > 1:
        src = torch.randint(0, c, (c,), generator=gen)
        dup = torch.rand(c, generator=gen) < 0.5
        for j in range(c):
            if dup[j]:
                w2[:, :, j], b2[:, j], cent[:, j] = w2[:, :, src[j]], b2[:, src[j]], cent[:, src[j]]
    layer = SaapLayer(cent, w1, b1, w2, b2)
    q, k, v = draw(b, hkv * g, 1, d), draw(b, hkv, 1, d, integer=ties), draw(b, hkv, 1, d)
    return layer, q, k, v


def fused_route(layer, probes, q, k, v, max_len=6, pos=3):
    """One fused route step on DEV (the cache, and so the layer, and the step's tensors there);
    probed and mask come back as CPU copies, the decoder (cache, buckets, scratch) stays on DEV."""
    b, hkv, _, d = k.shape
    dec = SaapDecoder(layer, probes, sink=1, window=2, max_len=max_len, route="fused")
    cache_k = torch.zeros(b, hkv, max_len, d, device=DEV)
    dec.fill(cache_k, torch.zeros_like(cache_k), torch.zeros(b, hkv, max_len, dtype=torch.int32, device=DEV), pos)
    k_dev = k.to(DEV)
    probed, mask = dec.route_step(q.to(DEV), k_dev, k_dev, v.to(DEV), pos)
    return dec, probed.clone().cpu(), mask.clone().cpu()


def check_selection(probed, mask, layer, q, hkv, probes):
    """The fused selection against the torch path's scores (float32, `group_scores`):

    - it is a top-`probes` ranking of those scores up to float rounding (eps, relative 1e-5):
      ordered, and no unprobed bucket scores above a probed one;
    - buckets with identical classifier columns (equal scores in exact arithmetic) are taken
      lower index first;
    - every place whose torch score is more than eps from its neighbours in the torch order
      holds the same bucket as the torch path's `probe(group_scores(...))`: the two paths
      differ only inside near-ties. (The torch path itself does not always give equal floats
      to identical columns: on CPU with 5+ query rows a copy can differ in the last bit.)
    - the mask marks exactly the probed buckets."""
    scores = group_scores(q, layer.classifier, hkv)
    s = scores.double()
    c = s.shape[-1]
    eps = 1e-5 * s.abs().amax(-1, keepdim=True) + 1e-30
    p = probed.long()
    assert p.shape[-1] == probes and p.min() >= 0 and p.max() < c
    assert all(len(set(row)) == probes for row in p.reshape(-1, probes).tolist())
    sel = s.gather(-1, p)
    assert (sel[..., 1:] <= sel[..., :-1] + eps).all()
    unsel = s.masked_fill(torch.zeros_like(s, dtype=torch.bool).scatter_(-1, p, True), float("-inf"))
    assert (unsel.amax(-1, keepdim=True) <= sel.amin(-1, keepdim=True) + eps).all()
    want = probe(scores, probes)
    full = torch.sort(scores, dim=-1, descending=True, stable=True).values.double()
    pad = torch.full_like(full[..., :1], float("inf"))
    gap_prev = full - torch.cat([pad, full[..., :-1]], -1)
    gap_next = torch.cat([full[..., 1:], -pad], -1) - full
    clear = (gap_prev.abs() > eps) & (gap_next.abs() > eps)
    assert torch.equal(torch.where(clear[..., :probes], p, -1), torch.where(clear[..., :probes], want, -1))
    cols = torch.cat([layer.w2, layer.b2[:, None]], 1)      # [Hkv, H + 1, C]
    for h in range(hkv):
        for row in p[:, h].tolist():
            for at, j in enumerate(row):
                twins = [i for i in range(j) if torch.equal(cols[h, :, i], cols[h, :, j])]
                assert all(i in row[:at] for i in twins), (h, row, j, twins)
    assert torch.equal(mask, torch.zeros_like(mask).scatter_(2, p, 1))


def check_route(layer, probes, q, k, v, pos=3):
    b, hkv, _, d = k.shape
    dec, probed, mask = fused_route(layer, probes, q, k, v, pos=pos)
    check_selection(probed, mask, layer, q, hkv, probes)
    assert torch.equal(dec.bucket_of[:, :, pos].cpu(), assign(k, layer.centroids[None])[:, :, 0].to(torch.int32))
    assert torch.equal(dec.k[:, :, pos].cpu(), k[:, :, 0]) and torch.equal(dec.v[:, :, pos].cpu(), v[:, :, 0])
    others = [j for j in range(dec.max_len) if j != pos]
    assert not dec.k[:, :, others].any() and not dec.bucket_of[:, :, others].any()
    assert not dec._route_bufs["counter"].any()      # reset for the next step
    return dec


def test_route_equals_torch_path_without_ties():
    # plain random data (no near-ties): the very same probed ids, in the same order
    for g in (1, 3, 8):
        layer, q, k, v = layer_and_step(2, 2, g, 16, ROUTE_BLOCK_C + 5, 12, seed=g, ties=False)
        dec, probed, mask = fused_route(layer, 9, q, k, v)
        assert torch.equal(probed.long(), probe(group_scores(q, layer.classifier, 2), 9))


@pytest.mark.parametrize("b,hkv,g,d,c,hidden,probes", [
    (1, 2, 4, 16, 8, 8, 3),                    # GQA 4, one bucket tile
    (2, 1, 8, 24, ROUTE_BLOCK_C + 9, 20, 11),  # GQA 8, head dim not a power of 2, two tiles
    (1, 3, 1, 8, 5, 3, 5),                     # MHA, every bucket probed
    (1, 1, 3, 8, 1, 4, 1),                     # one bucket
])
def test_route_matches_torch_path(b, hkv, g, d, c, hidden, probes):
    for ties in (False, True):
        layer, q, k, v = layer_and_step(b, hkv, g, d, c, hidden, seed=c + g, ties=ties)
        check_route(layer, probes, q, k, v)


def test_route_ties_go_to_the_lower_bucket():
    # every bucket scores the same (zero second layer): the lowest `probes` ids, in order;
    # every centroid equal: bucket 0
    hkv, c, d, hidden = 2, 70, 8, 4
    layer = SaapLayer(torch.ones(hkv, c, d), torch.randn(hkv, d, hidden), torch.randn(hkv, hidden),
                      torch.zeros(hkv, hidden, c), torch.zeros(hkv, c))
    q, k, v = (torch.randn(1, h, 1, d) for h in (2 * hkv, hkv, hkv))
    dec, probed, mask = fused_route(layer, 5, q, k, v)
    assert probed.tolist() == [[[0, 1, 2, 3, 4]] * hkv]
    assert mask[..., :5].all() and not mask[..., 5:].any()
    assert not dec.bucket_of.any()


@settings(max_examples=12, deadline=None)
@given(b=st.integers(1, 2), hkv=st.integers(1, 3), g=st.integers(1, 8), d=st.sampled_from([4, 8, 12]),
       c=st.integers(1, 80), hidden=st.integers(1, 18), probes=st.integers(1, 80), ties=st.booleans(),
       seed=st.integers(0, 10_000))
def test_route_matches_torch_path_random(b, hkv, g, d, c, hidden, probes, ties, seed):
    assume(probes <= c)
    layer, q, k, v = layer_and_step(b, hkv, g, d, c, hidden, seed, ties)
    check_route(layer, probes, q, k, v)


def test_route_uses_the_index_vectors():
    # q_index / k_index (pre-RoPE) choose the buckets; k, v are what the cache stores
    layer, q, k, v = layer_and_step(1, 2, 2, 8, 12, 6, seed=4, ties=False)
    qi, ki = q.flip(-1) * 3, k.roll(1, -1) - 1
    dec = SaapDecoder(layer, 4, sink=1, window=2, max_len=6, route="fused")
    dec.fill(torch.zeros(1, 2, 6, 8, device=DEV), torch.zeros(1, 2, 6, 8, device=DEV),
             torch.zeros(1, 2, 6, dtype=torch.int32, device=DEV), 3)
    probed, _ = dec.route_step(qi.to(DEV), ki.to(DEV), k.to(DEV), v.to(DEV), 3)
    assert torch.equal(probed.long().cpu(), probe(group_scores(qi, layer.classifier, 2), 4))
    assert torch.equal(dec.bucket_of[:, :, 3].cpu(), assign(ki, layer.centroids[None])[:, :, 0].to(torch.int32))
    assert torch.equal(dec.k[:, :, 3].cpu(), k[:, :, 0])


def inputs(b, hq, hkv, n, d, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*s, generator=g).to(dtype) for s in ((b, hq, n, d), (b, hkv, n, d), (b, hkv, n, d)))


def decode_all(route, layer, probes, sink, window, q, k, v, prefill, rebuild, split=1, chunk=256):
    """Prefill and decode on DEV (layer and inputs moved there); the outputs, looked-up counts
    and probed ids come back on the CPU, the decoder stays on DEV."""
    layer, q, k, v = layer.to(DEV), q.to(DEV), k.to(DEV), v.to(DEV)
    dec = SaapDecoder(layer, probes, sink=sink, window=window, max_len=q.shape[2], rebuild_every=rebuild,
                      block_n=16, chunk=chunk, split=split, route=route)
    outs = [dec.prefill(q[:, :, :prefill], k[:, :, :prefill], v[:, :, :prefill])]
    looked, probed = [], []
    for i in range(prefill, q.shape[2]):
        outs.append(dec.decode(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1]))
        looked.append(dec.last_looked_up.cpu())
        probed.append(dec._last_step[1].long().clone().cpu())
    return torch.cat(outs, 2).cpu(), looked, probed, dec


@pytest.mark.parametrize("b,hq,hkv,d,c,probes,sink,window,rebuild,split,chunk", [
    (1, 4, 2, 16, 8, 3, 1, 6, 2, 1, 256),     # GQA 2, index rebuilt mid-run, pending keys filtered
    (1, 8, 1, 16, 6, 2, 0, 5, 100, 2, 4),     # GQA 8, no sink, never rebuilt, buckets and window in pieces
])
def test_fused_decoder_matches_reference_and_torch_route(b, hq, hkv, d, c, probes, sink, window, rebuild, split,
                                                         chunk):
    n, prefill = 30, 26
    q, k, v = inputs(b, hq, hkv, n, d, seed=hq + c)
    gen = torch.Generator().manual_seed(c)
    layer = SaapLayer(*(torch.randn(*s, generator=gen) for s in
                        ((hkv, c, d), (hkv, d, 8), (hkv, 8), (hkv, 8, c), (hkv, c))))
    ref = saap_attention_reference(q, k, v, layer, probes, sink=sink, window=window, prefill_len=prefill)
    out_f, looked_f, probed_f, dec_f = decode_all("fused", layer, probes, sink, window, q, k, v, prefill, rebuild,
                                                  split, chunk)
    out_t, _, probed_t, dec_t = decode_all("torch", layer, probes, sink, window, q, k, v, prefill, rebuild, split,
                                           chunk)
    assert (out_f.double() - ref.out).abs().max() < 1e-4
    assert torch.equal(out_f, out_t)          # same probed sets, same decode kernel: the same bits
    assert all(torch.equal(a, b) for a, b in zip(probed_f, probed_t))
    for step, i in enumerate(range(prefill, n)):
        assert torch.equal(looked_f[step], ref.looked_up[i])
    assert torch.equal(dec_f.bucket_of, dec_t.bucket_of) and torch.equal(dec_f.k, dec_t.k)
    assert torch.equal(dec_f.off, dec_t.off) and torch.equal(dec_f.idx, dec_t.idx)


def test_fused_decoder_bf16():
    q, k, v = inputs(1, 4, 2, 31, 16, seed=5, dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(1)
    layer = SaapLayer(*(torch.randn(*s, generator=gen) for s in ((2, 8, 16), (2, 16, 8), (2, 8), (2, 8, 8), (2, 8))))
    ref = saap_attention_reference(q, k, v, layer, 2, sink=1, window=6, prefill_len=28)
    out_f, _, _, _ = decode_all("fused", layer, 2, 1, 6, q, k, v, 28, 2)
    out_t, _, _, _ = decode_all("torch", layer, 2, 1, 6, q, k, v, 28, 2)
    assert (out_f.double() - ref.out)[:, :, 28:].abs().max() < 3e-2
    assert torch.equal(out_f, out_t)


def test_route_flag():
    gen = torch.Generator().manual_seed(0)
    layer = SaapLayer(*(torch.randn(*s, generator=gen) for s in ((1, 4, 8), (1, 8, 4), (1, 4), (1, 4, 4), (1, 4))))
    with pytest.raises(KernelError, match="route"):
        SaapDecoder(layer, 2, max_len=8, route="triton")
    assert SaapDecoder(layer, 2, max_len=8).route == "auto"       # the default: fused on CUDA, torch elsewhere
    assert not SaapDecoder(layer, 2, max_len=8, route="auto").fused   # auto: torch off CUDA
    dec = SaapDecoder(layer, 2, max_len=8, route="auto")
    dec.fill(torch.zeros(1, 1, 8, 8), torch.zeros(1, 1, 8, 8), torch.zeros(1, 1, 8, dtype=torch.int32), 4)
    assert dec.fused == dec.k.is_cuda
    assert SaapDecoder(layer, 2, max_len=8, route="fused").fused
    big = SaapLayer(torch.zeros(1, ROUTE_MAX_CLUSTERS + 1, 4), torch.zeros(1, 4, 2), torch.zeros(1, 2),
                    torch.zeros(1, 2, ROUTE_MAX_CLUSTERS + 1), torch.zeros(1, ROUTE_MAX_CLUSTERS + 1))
    with pytest.raises(NotYetSupportedError, match="fused route"):
        SaapDecoder(big, 2, max_len=8, route="fused")
    assert SaapDecoder(big, 2, max_len=8, route="torch").route == "torch"
    auto = SaapDecoder(big, 2, max_len=8)                  # auto: the torch route above the limit, even on CUDA
    auto.k = SimpleNamespace(is_cuda=True)                 # stands for a CUDA cache (no GPU here)
    assert auto.route == "auto" and not auto.fused
    small = SaapDecoder(layer, 2, max_len=8)
    small.k = SimpleNamespace(is_cuda=True)
    assert small.fused
