"""Score op chains traced to torch.fx (sas.dynamic.trace), custom ops over sas.sym inputs,
the fusion summary (sas.dynamic.fusion), and every bad input named in docs/dynamic.md."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx as fx

import sas
from sas import ops
from sas.dynamic import analyze_fusion, trace_score
from sas.errors import KernelError, NotYetSupportedError, PatternError, SASError
from sas.lang.sym import active_K, active_Q

B, HQ, HKV, LQ, LK, D = 2, 4, 2, 3, 7, 5
G = HQ // HKV


def inputs(seed=0, hq=HQ, hkv=HKV):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(B, hq, LQ, LK, generator=g, dtype=torch.float64)
    q = torch.randn(B, hq, LQ, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, hkv, LK, D, generator=g, dtype=torch.float64)
    return p, q, k


def folded(x, hkv=HKV):
    """[B, Hq, Lq, Lk] -> [B, Hkv, G*Lq, Lk], written out with loops (query head h -> KV head h // G)."""
    b, hq, lq, lk = x.shape
    g = hq // hkv
    out = torch.zeros(b, hkv, g * lq, lk, dtype=x.dtype)
    for h in range(hq):
        for r in range(lq):
            out[:, h // g, (h % g) * lq + r] = x[:, h, r]
    return out


# --- registered custom ops used by the tests --------------------------------------------------------

@ops.register
def mm_score():                                   # paper Figure 4
    q = sas.sym.active_Q
    w = sas.sym.custom_weight(name="wgt")
    return torch.matmul(q, w)


@ops.register
def qk_score():                                   # module-level imported symbols work too
    return torch.matmul(active_Q, active_K.transpose(-1, -2)).relu()


@ops.register
def declared_score():
    w = sas.sym.custom_weight(name="proj", shape=("D", "Lk"))
    return sas.sym.active_Q @ w


@ops.register
def sliced_weight_score():                        # a [D, max_len] weight cut to the keys so far
    w = sas.sym.custom_weight(name="wlong")
    return sas.sym.active_Q @ w[:, : sas.sym.active_K.shape[-2]]


@ops.register
def wrong_shape_score():
    return sas.sym.active_Q.sum(dim=-1)           # [B, Hq, Lq]: no key axis


@ops.register
def branching_score():
    q = sas.sym.active_Q
    if q.sum() > 0:
        return q
    return -q


@ops.register
def constant_score():
    return 3.0


# --- tracing ---------------------------------------------------------------------------------------

def test_default_chain_graph_and_value():
    sg = trace_score(ops.attn_score().sum(dim=1))
    assert isinstance(sg.graph_module, fx.GraphModule)
    names = [n.name for n in sg.graph.nodes if n.op == "placeholder"]
    assert names == ["attn_probs", "q", "k"]
    calls = [n for n in sg.graph.nodes if n.op == "call_function"]
    assert [n.meta["sas_op"] for n in calls] == ["attn_score()", "reduce(dim=1, kind='sum')"]
    assert calls[1].target is torch.sum and calls[1].kwargs["dim"] == 2
    p, q, k = inputs()
    got = sg(p, q, k)
    assert got.shape == (B, HKV, LK)
    torch.testing.assert_close(got, folded(p).sum(dim=2))
    # GQA: summing over the folded axis == sum over queries, then over the group's heads
    manual = p.sum(dim=2).reshape(B, HKV, G, LK).sum(dim=2)
    torch.testing.assert_close(got, manual)
    assert sg.starts_with_attn_score and not sg.head_shared


@pytest.mark.parametrize("chain,fn", [
    (ops.attn_score().mean(dim=1), lambda f: f.mean(dim=2)),
    (ops.attn_score().max(dim=1), lambda f: f.amax(dim=2)),
    (ops.attn_score().sum(dim=-2), lambda f: f.sum(dim=2)),
    (ops.attn_score().max(dim=1).sum(dim=0), lambda f: f.amax(dim=2).sum(dim=1, keepdim=True).expand(B, HKV, LK)),
    (ops.attn_score().sum(dim=0).mean(dim=0), lambda f: f.sum(dim=1).mean(dim=1, keepdim=True).expand(B, HKV, LK)),
    ((ops.attn_score().sum(dim=1) * 2 - 1) / 4 + ops.attn_score().max(dim=1),
     lambda f: (f.sum(dim=2) * 2 - 1) / 4 + f.amax(dim=2)),
    (ops.attn_score().sum(dim=1) * ops.attn_score().mean(dim=1), lambda f: f.sum(dim=2) * f.mean(dim=2)),
    ((ops.attn_score() + 1.0).sum(dim=1), lambda f: (f + 1).sum(dim=2)),
])
def test_reductions_and_arithmetic(chain, fn):
    p, q, k = inputs(1)
    torch.testing.assert_close(trace_score(chain)(p, q, k), fn(folded(p)))


def _pool_loop(x, ks, kind):
    lo, hi = (ks - 1) // 2, ks // 2
    out = torch.empty_like(x)
    n = x.shape[-1]
    for j in range(n):
        win = x[..., max(0, j - lo): min(n, j + hi + 1)]
        out[..., j] = win.amax(dim=-1) if kind == "max" else win.mean(dim=-1)
    return out


@pytest.mark.parametrize("ks", [1, 2, 3, 4, 9])
@pytest.mark.parametrize("kind", ["max", "avg"])
def test_pooling_along_keys(ks, kind):
    p, q, k = inputs(2)
    got = trace_score(ops.attn_score().sum(dim=1).pooling(kernel_size=ks, kind=kind))(p, q, k)
    torch.testing.assert_close(got, _pool_loop(folded(p).sum(dim=2), ks, kind))


def test_pooling_before_reduction():
    p, q, k = inputs(3)
    got = trace_score(ops.attn_score().pooling(kernel_size=3).sum(dim=1))(p, q, k)
    torch.testing.assert_close(got, _pool_loop(folded(p), 3, "max").sum(dim=2))


def test_topk_is_a_vote_with_deterministic_ties():
    p, q, k = inputs(4)
    got = trace_score(ops.attn_score().sum(dim=1).topk(3))(p, q, k)
    s = folded(p).sum(dim=2)
    for b in range(B):
        for h in range(HKV):
            top = sorted(range(LK), key=lambda j: (-float(s[b, h, j]), j))[:3]
            assert set(torch.nonzero(got[b, h]).flatten().tolist()) == set(top)
    flat = torch.zeros(B, HQ, LQ, LK, dtype=torch.float64)
    tie = trace_score(ops.attn_score().sum(dim=1).topk(2))(flat, q, k)
    assert (tie[..., :2] == 1).all() and (tie[..., 2:] == 0).all()
    assert (trace_score(ops.attn_score().sum(dim=1).topk(99))(p, q, k) == 1).all()


def test_custom_op_figure4_with_other_inputs_weight():
    sg = trace_score(ops.mm_score().sum(dim=1))
    assert dict(sg.weights) == {"wgt": None}
    assert sg.extra_inputs == (("weight", "wgt"),)
    assert any(n.op == "call_function" and n.target is torch.matmul for n in sg.graph.nodes)
    assert not sg.starts_with_attn_score
    p, q, k = inputs(5)
    w = torch.randn(D, LK, dtype=torch.float64, generator=torch.Generator().manual_seed(15))
    torch.testing.assert_close(sg(p, q, k, {"wgt": w}), folded(q @ w).sum(dim=2))


def test_custom_op_with_active_k_and_module_level_symbols():
    p, q, k = inputs(6, hq=2, hkv=2)
    got = trace_score(ops.qk_score().mean(dim=1) + ops.attn_score().sum(dim=1))(p, q, k)
    want = (q @ k.transpose(-1, -2)).relu().mean(dim=2) + p.sum(dim=2)
    torch.testing.assert_close(got, want)


def test_custom_op_reads_symbolic_shapes():
    sg = trace_score(ops.sliced_weight_score().sum(dim=1))
    p, q, k = inputs(9)
    w = torch.randn(D, 50, dtype=torch.float64, generator=torch.Generator().manual_seed(19))
    torch.testing.assert_close(sg(p, q, k, {"wlong": w}), folded(q @ w[:, :LK]).sum(dim=2))


def test_declared_weight_shape_is_checked_by_name():
    sg = trace_score(ops.declared_score().sum(dim=1))
    p, q, k = inputs(7)
    sg(p, q, k, {"proj": torch.randn(D, LK, dtype=torch.float64)})
    with pytest.raises(KernelError) as info:
        sg(p, q, k, {"proj": torch.randn(D, LK + 1)})
    assert "'proj'" in str(info.value) and "Lk=7" in str(info.value) and "(5, 8)" in str(info.value)


def test_sym_repr_and_use_outside_tracing():
    assert repr(sas.sym.active_Q) == "sas.sym.active_Q"
    assert repr(sas.sym.custom_weight(name="w")) == "sas.sym.custom_weight(name='w')"
    with pytest.raises(SASError, match="symbolic input"):
        torch.matmul(sas.sym.active_Q, torch.ones(2, 2))
    with pytest.raises(SASError, match="symbolic input"):
        sas.sym.active_K.sum()


# --- chain shape validation ---------------------------------------------------------------------

@pytest.mark.parametrize("chain,words", [
    (ops.attn_score(), ["attn_score()", "reduce the query axis", "G*Lq"]),
    (ops.attn_score().pooling(kernel_size=3), ["pooling", "reduce the query axis"]),
    (ops.attn_score().sum(dim=2), ["reduce(dim=2", "key axis"]),
    (ops.attn_score().sum(dim=-1), ["reduce(dim=-1", "key axis"]),
    (ops.attn_score().sum(dim=3), ["dim=3", "out of range"]),
    (ops.attn_score().sum(dim=1).sum(dim=1), ["key axis"]),
    (ops.attn_score().sum(dim=0), ["reduce(dim=0", "['G*Lq', 'Lk']"]),
    (ops.attn_score() * ops.attn_score().sum(dim=1), ["mul", "different axes"]),
    (ops.attn_score().sum(dim=1).topk(2).sum(dim=-1), ["key axis"]),
])
def test_chain_must_end_with_one_score_per_key(chain, words):
    with pytest.raises(PatternError) as info:
        trace_score(chain)
    for w in words:
        assert w in str(info.value), str(info.value)


def test_custom_op_wrong_shape_names_op_and_shapes():
    sg = trace_score(ops.wrong_shape_score().sum(dim=1))  # symbolic: shapes unknown until run
    p, q, k = inputs()
    with pytest.raises(PatternError) as info:
        sg(p, q, k)
    msg = str(info.value)
    assert "wrong_shape_score" in msg and str((B, HQ, LQ)) in msg and str((B, HQ, LQ, LK)) in msg


def test_custom_op_bad_weight_shape_names_tensor():
    sg = trace_score(ops.mm_score().sum(dim=1))
    p, q, k = inputs()
    with pytest.raises(KernelError) as info:
        sg(p, q, k, {"wgt": torch.randn(D + 2, LK)})
    msg = str(info.value)
    assert "mm_score" in msg and "'wgt'" in msg and str((D + 2, LK)) in msg
    assert "Traceback" not in msg and "While executing" not in msg


@pytest.mark.parametrize("other,words", [
    ({}, ["'wgt'", "missing", "mm_score"]),
    ({"wrong": torch.zeros(D, LK)}, ["'wgt'", "missing", "['wrong']"]),
    ({"wgt": [[1.0]]}, ["'wgt'", "torch.Tensor", "list"]),
])
def test_custom_weight_missing_or_not_a_tensor(other, words):
    sg = trace_score(ops.mm_score().sum(dim=1))
    p, q, k = inputs()
    with pytest.raises(KernelError) as info:
        sg(p, q, k, other)
    for w in words:
        assert w in str(info.value)


def test_step_tensor_shapes_checked():
    sg = trace_score(ops.attn_score().sum(dim=1))
    p, q, k = inputs()
    with pytest.raises(KernelError, match="attn_probs"):
        sg(p[..., :-1], q, k)
    with pytest.raises(KernelError, match="query heads"):
        sg(torch.zeros(B, 3, LQ, LK), torch.zeros(B, 3, LQ, D), k)


@pytest.mark.parametrize("op,words", [
    (lambda: ops.branching_score(), ["branching_score", "control flow"]),
    (lambda: ops.constant_score(), ["constant_score", "torch expression"]),
])
def test_untraceable_custom_ops(op, words):
    with pytest.raises(PatternError) as info:
        trace_score(op().sum(dim=1))
    for w in words:
        assert w in str(info.value)


def test_custom_op_with_arguments_rejected():
    @ops.register
    def needs_arg(x):
        return x

    with pytest.raises(PatternError, match="no arguments"):
        trace_score(ops.needs_arg().sum(dim=1))


@pytest.mark.parametrize("name", ["1abc", "a-b", "class", "", "q", "attn_probs", "_hidden", 3, None])
def test_custom_weight_name_must_be_identifier(name):
    with pytest.raises(PatternError) as info:
        sas.sym.custom_weight(name=name)
    assert "custom_weight" in str(info.value)


@pytest.mark.parametrize("shape", [(0, 2), ("Lx",), 5, (True,)])
def test_custom_weight_bad_declared_shape(shape):
    with pytest.raises(PatternError, match="shape"):
        sas.sym.custom_weight(name="w", shape=shape)


def test_register_name_must_be_identifier():
    fn = lambda: sas.sym.active_Q  # noqa: E731  (__name__ is '<lambda>')
    with pytest.raises(PatternError, match="identifier"):
        ops.register(fn)
    for reserved in ("attn_score", "external", "sample", "dataclass"):
        def f():
            return sas.sym.active_Q
        f.__name__ = reserved
        with pytest.raises(PatternError, match="reserved"):
            ops.register(f)


def test_external_and_weight_cannot_share_a_name():
    @ops.register
    def uses_draft():
        return sas.sym.active_Q @ sas.sym.custom_weight(name="draft")

    with pytest.raises(PatternError, match="one role"):
        trace_score(ops.uses_draft().sum(dim=1) + ops.external("draft").sum(dim=1))


def test_external_source():
    sg = trace_score(ops.external("draft").max(dim=1))
    assert sg.externals == ("draft",) and sg.extra_inputs == (("external", "draft"),)
    p, q, k = inputs(8)
    x = torch.rand(B, HQ, LQ, LK, dtype=torch.float64, generator=torch.Generator().manual_seed(18))
    torch.testing.assert_close(sg(p, q, k, {"draft": x}), folded(x).amax(dim=2))
    with pytest.raises(KernelError, match="draft"):
        sg(p, q, k, {"draft": x[..., :-1]})


# --- designed-only operators -------------------------------------------------------------------------

@pytest.mark.parametrize("make,words", [
    (lambda: ops.attn_score().sample(n=0), ["sample", "n"]),
    (lambda: ops.attn_score().sample(n=4, method="gumbel"), ["sample", "method"]),
    (lambda: ops.partition(centroids="c-1", classifier="clf", probes=2), ["centroids", "identifier"]),
    (lambda: ops.partition(centroids="c", classifier="clf", probes=0), ["probes"]),
    (lambda: ops.reuse(layer=-1), ["layer"]),
    (lambda: ops.reuse(layer=1, head_map=(0, -1)), ["head_map"]),
    (lambda: ops.external("not ok"), ["external", "identifier"]),
])
def test_design_op_records_validate_arguments(make, words):
    with pytest.raises(PatternError) as info:
        make()
    for w in words:
        assert w in str(info.value)


def test_source_in_the_middle_rejected():
    chain = ops.OpChain(ops.attn_score().nodes + ops.attn_score().nodes)
    with pytest.raises(PatternError, match="only start a chain"):
        trace_score(chain)


# --- fusion ------------------------------------------------------------------------------------------

def test_fusion_default_chain_is_one_memoized_kernel():
    fp = analyze_fusion(trace_score(ops.attn_score().sum(dim=1)))
    assert fp.memoize_softmax and fp.starts_with_attn_score
    assert len(fp.kernels) == 1 and fp.kernels[0].kinds == ("source", "reduce")
    text = fp.summary()
    assert "inter-kernel memoization: yes" in text and "row max m" in text
    assert fp.report()["kernels"][0]["memoized_softmax"] is True


def test_fusion_elementwise_chain_becomes_epilogue():
    fp = analyze_fusion(trace_score(((ops.attn_score() * 2.0) + 1.0).sum(dim=1).pooling(kernel_size=3)))
    assert [k.kinds for k in fp.kernels] == [("source", "elementwise", "elementwise", "reduce"), ("pool",)]
    (chain,) = fp.elementwise_chains
    assert chain.nodes == ("mul", "add") and chain.fused_into == "epilogue of attn_score" and chain.kernel == 0


def test_fusion_custom_op_not_memoized_and_topk_splits():
    fp = analyze_fusion(trace_score((ops.mm_score().sum(dim=1) * 0.5).topk(4)))
    assert not fp.memoize_softmax
    assert fp.kernels[0].kinds[0] == "opaque" and "topk" in fp.kernels[1].kinds
    assert "inter-kernel memoization: no" in fp.summary()
    assert "custom weight 'wgt'" in fp.summary()


def test_fusion_reads_attn_score_later_in_chain():
    fp = analyze_fusion(trace_score(ops.mm_score().sum(dim=1) + ops.attn_score().max(dim=1)))
    assert fp.memoize_softmax and not fp.starts_with_attn_score
    add = [n for n in fp.score.graph.nodes if n.target is operator.add]
    assert add and any("add" in k.nodes for k in fp.kernels)
