"""Saap decode with the merge folded into the decode kernel (`SaapDecoder(merge="fused")`: the
last program of each (batch, KV head) to arrive merges the partials) against the two-launch
path (`merge="separate"`, `merge_partials_kernel`: bit-identical outputs) and the float64
reference, over several consecutive steps (the arrival counters must be back at 0 after each)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sas.errors import KernelError
from sas.methods.saap import CLASSIFIER_PARTS, SaapLayer, saap_attention_reference
from sas.methods.saap_runtime import MERGES, SaapDecoder

from helpers.attention import DEV

pytestmark = pytest.mark.kernels


def case(b, hkv, g, d, c, n, seed, dtype):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*s, generator=gen).to(dtype) for s in ((b, hkv * g, n, d), (b, hkv, n, d), (b, hkv, n, d)))
    layer = SaapLayer(*(torch.randn(*s, generator=gen) for s in
                        ((hkv, c, d), (hkv, d, 8), (hkv, 8), (hkv, 8, c), (hkv, c))))
    return layer, q, k, v


def on_dev(layer, *ts):
    """The layer and tensors where the kernels run (the GPU when there is one)."""
    return (SaapLayer(*(getattr(layer, f).to(DEV) for f in ("centroids", *CLASSIFIER_PARTS))),
            *(t.to(DEV) for t in ts))


def run(merge, route, layer, probes, q, k, v, prefill, *, sink=1, window=5, rebuild=2, split=1, chunk=256):
    layer, q, k, v = on_dev(layer, q, k, v)
    dec = SaapDecoder(layer, probes, sink=sink, window=window, max_len=q.shape[2], rebuild_every=rebuild,
                      block_n=16, chunk=chunk, split=split, route=route, merge=merge)
    outs = [dec.prefill(q[:, :, :prefill], k[:, :, :prefill], v[:, :, :prefill])]
    looked = []
    for i in range(prefill, q.shape[2]):
        outs.append(dec.decode(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1]))
        looked.append(dec.last_looked_up.cpu())
        if merge == "fused":   # every row's last program reset its counter
            assert dec._merge_counter is not None and not dec._merge_counter.any()
        else:
            assert dec._merge_counter is None
    return torch.cat(outs, 2).cpu(), looked


def check(b, hkv, g, d, c, probes, split, dtype, route="torch", chunk=256, seed=0, sink=1, window=5, rebuild=2):
    n, prefill = 27, 24                     # 3 consecutive decode steps
    layer, q, k, v = case(b, hkv, g, d, c, n, seed, dtype)
    ref = saap_attention_reference(q, k, v, layer, probes, sink=sink, window=window, prefill_len=prefill)
    kw = dict(sink=sink, window=window, rebuild=rebuild, split=split, chunk=chunk)
    out_f, looked_f = run("fused", route, layer, probes, q, k, v, prefill, **kw)
    out_s, looked_s = run("separate", route, layer, probes, q, k, v, prefill, **kw)
    assert torch.equal(out_f, out_s)         # the same merge code in the same order: the same bits
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    assert (out_f.double() - ref.out)[:, :, prefill:].abs().max() < tol
    for step, i in enumerate(range(prefill, n)):
        assert torch.equal(looked_f[step], ref.looked_up[i]) and torch.equal(looked_s[step], ref.looked_up[i])


@pytest.mark.parametrize("g", [1, 3, 8])     # 2 and 4: test_fused_merge_split, _bf16, _random
def test_fused_merge_gqa(g):
    check(1, 2, g, 16, 6, 2, 1, torch.float32, seed=g)


@pytest.mark.parametrize("b,split,chunk", [(2, 2, 256), (1, 3, 4)])   # buckets in pieces; window in pieces too
def test_fused_merge_split(b, split, chunk):
    check(b, 2, 4, 16, 6, 3, split, torch.float32, chunk=chunk, seed=10 + split)


def test_fused_merge_bf16_and_fused_route():
    check(1, 2, 4, 16, 8, 2, 2, torch.bfloat16, seed=3)
    check(1, 2, 8, 16, 8, 3, 1, torch.float32, route="fused", seed=4)


@settings(max_examples=3, deadline=None, derandomize=True)
@given(b=st.integers(1, 2), hkv=st.integers(1, 2), g=st.integers(1, 8), c=st.integers(1, 8),
       split=st.integers(1, 3), bf16=st.booleans(), seed=st.integers(0, 1000), data=st.data())
def test_fused_merge_random(b, hkv, g, c, split, bf16, seed, data):
    probes = data.draw(st.integers(1, c))
    check(b, hkv, g, 8, c, probes, split, torch.bfloat16 if bf16 else torch.float32, seed=seed)


def test_merge_flag():
    layer, _, _, _ = case(1, 1, 1, 8, 4, 1, 0, torch.float32)
    assert MERGES == ("fused", "separate")
    assert SaapDecoder(layer, 2, max_len=8).merge == "fused"      # the default
    with pytest.raises(KernelError, match="merge"):
        SaapDecoder(layer, 2, max_len=8, merge="two")
