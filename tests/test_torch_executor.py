"""The pure-torch executor (`sas.runtime.torch_executor`) against the exact oracle
(`pattern.to_mask`, float64 dense attention), against the synthesized functions of the
analysis, and against the Triton kernels (CPU interpreter) on the same compact cache."""

from __future__ import annotations

import math
import os

import torch

if not torch.cuda.is_available():  # must precede the first import of triton
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sas import Causal, Diag, Dynamic, Rect, analyze  # noqa: E402
from sas.codegen.triton_backend import DecodeOptions, PrefillOptions  # noqa: E402
from sas.errors import AnalysisError, KernelError, NotYetSupportedError  # noqa: E402
from sas.runtime import SASAttnKernel  # noqa: E402
from sas.runtime.torch_executor import TorchExecutor  # noqa: E402

try:
    from tests.strategies import causal_patterns
except ImportError:  # pragma: no cover
    from strategies import causal_patterns  # type: ignore

PATTERNS = {
    "causal": Causal(),
    "sliding_window": Diag(0, 6),
    "streaming_llm": (Diag(0, 6) + Rect(cols=(0, 2))) * Causal(),
    "block_local": (Rect(size=(4, 4)) >> Diag(0, 3)) * Causal(),
    "openai_strided": (Diag(0, 4) + Diag(0, None, stride=4)) * Causal(),
    "openai_fixed": ((Rect(size=(8, 8)) >> Diag(0, 1)) + ((Rect(size=(8, 8)) * Rect(cols=(6, None))) >> Rect()))
    * Causal(),
    "strided_block_local": (Rect(size=(8, 8)) >> Diag(0, 1)) * Rect(stride=2) * Causal(),
    # a drifting spread (no periodic description) and a sink column: no ring fits, a table
    "table_scheme": ((Rect(size=(3, 2)) >> Diag(0, 3)) + Rect(cols=(0, 1))) * Causal(),
}
TOL = 2e-5
DEV = "cuda" if torch.cuda.is_available() else "cpu"     # where the Triton kernels run


# one CPU thread: small ops run far faster so than on OpenMP threads fighting over shared cores
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def qkv(B, Hq, Hkv, L, D, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, h, L, D, generator=g, dtype=torch.float64).to(dtype) for h in (Hq, Hkv, Hkv))


def reference(pattern, q, k, v, positions=None):
    """Dense float64 attention under `pattern.to_mask`; `positions` [B, L] (-1: padding) maps
    each column to its position in its row (default 0..L-1). Rows without keys give 0."""
    B, Hq, Lq, D = q.shape
    L = k.shape[2]
    if positions is None:
        positions = torch.arange(L).expand(B, L)
    n = int(positions.max()) + 1
    oracle = torch.from_numpy(pattern.to_mask(max(n, 1)))
    p = positions.clamp(min=0)
    m = oracle[p[:, :, None], p[:, None, :]] & (positions[:, :, None] >= 0) & (positions[:, None, :] >= 0)
    m = m[:, L - Lq:]                                                   # [B, Lq, L]
    g = Hq // k.shape[1]
    kk, vv = k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    s = (q.double() @ kk.transpose(-1, -2)) / math.sqrt(D)
    s = s.masked_fill(~m[:, None], -math.inf)
    w = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return w @ vv


def err(a, b):
    return (a.double() - b.double()).abs().max().item()


def executor(pattern, max_len, block_q=8):
    return TorchExecutor(pattern, analyze(pattern, max_len=max_len), block_q=block_q)


# --- prefill against the oracle --------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_prefill_matches_oracle(name):
    p = PATTERNS[name]
    ex = executor(p, 48)
    q, k, v = qkv(2, 4, 2, 40, 16, seed=len(name))
    assert err(ex.prefill(q, k, v), reference(p, q, k, v)) < TOL
    # suffix queries (the last 7 of 40)
    assert err(ex.prefill(q[:, :, -7:], k, v), reference(p, q[:, :, -7:], k, v)) < TOL


def test_plans_are_reused_or_rebuilt_within_the_memory_limit():
    p = PATTERNS["openai_fixed"]
    ex = executor(p, 48)
    q, k, v = qkv(1, 2, 2, 40, 16, seed=2)
    want = reference(p, q, k, v)
    small = ex.prefill_plan(None, 40, 40, 1, "cpu")
    small._keep_limit = 100                       # more mask elements than that: rebuilt on each use
    big = ex.prefill_plan(None, 40, 40, 1, "cpu")
    for _ in range(2):
        assert err(ex.prefill(q, k, v, plan=small), want) < TOL
        assert err(ex.prefill(q, k, v, plan=big), want) < TOL
    assert big.kept and not small.kept


def test_prefill_without_analysis_runs_non_causal_patterns():
    p = Diag(-2, 5)                                                  # attends two keys ahead
    with pytest.raises(AnalysisError):
        analyze(p, max_len=32)
    ex = TorchExecutor(p)
    q, k, v = qkv(1, 2, 2, 20, 16, seed=1)
    assert err(ex.prefill(q, k, v), reference(p, q, k, v)) < TOL
    with pytest.raises(KernelError, match="no cache analysis"):
        ex.new_cache(1, 2, 16)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=causal_patterns(3).filter(lambda p: not p.dynamics()), L=st.integers(1, 30), seed=st.integers(0, 99))
def test_random_patterns_prefill_decode_chunks(p, L, seed):
    """Prefill, decode after any prompt length and chunked prefill all equal the oracle."""
    assume(p.to_mask(32).any())              # the analyzer refuses patterns that attend nothing
    a = analyze(p, max_len=32)
    ex = TorchExecutor(p, a, block_q=4)
    q, k, v = qkv(1, 2, 1, L, 16, seed)
    want = reference(p, q, k, v)
    assert err(ex.prefill(q, k, v), want) < TOL
    P = seed % L + 1
    kc, vc = ex.new_cache(1, 1, 16)
    ex.fill_cache(k[:, :, :P], v[:, :, :P], kc, vc)
    for t in range(P, L):
        o = ex.decode(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], kc, vc, t)
        assert err(o, want[:, :, t:t + 1]) < TOL
    C = seed % 5 + 1
    kc, vc = ex.new_cache(1, 1, 16)
    outs = [ex.prefill_chunk(q[:, :, s:s + C], k[:, :, s:s + C], v[:, :, s:s + C], kc, vc,
                             torch.arange(s, min(s + C, L))) for s in range(0, L, C)]
    assert err(torch.cat(outs, dim=2), want) < TOL


def test_keyless_rows_give_zero():
    """Paper Table 1's strided block-local pattern leaves odd queries without a single key."""
    p = PATTERNS["strided_block_local"]
    ex = executor(p, 32)
    q, k, v = qkv(1, 2, 2, 24, 16, seed=3)
    out = ex.prefill(q, k, v)
    keyless = ~torch.from_numpy(p.to_mask(24)).any(dim=1)
    assert keyless.sum() == 12
    assert torch.equal(out[:, :, keyless], torch.zeros_like(out[:, :, keyless]))
    assert bool(out[:, :, ~keyless].abs().gt(0).all())
    kc, vc = ex.new_cache(1, 2, 16)
    ex.fill_cache(k[:, :, :9], v[:, :, :9], kc, vc)
    o = ex.decode(q[:, :, 9:10], k[:, :, 9:10], v[:, :, 9:10], kc, vc, 9)          # 9 is odd: no key
    assert torch.equal(o, torch.zeros_like(o))


# --- the synthesized functions, vectorized --------------------------------------------------
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_vectorized_functions_equal_the_analysis(name):
    p = PATTERNS[name]
    n = 48
    a = analyze(p, max_len=n)
    ex = TorchExecutor(p, a)
    pos = torch.arange(n)
    assert ex.cache_ids(pos).tolist() == [a.cache_id_func(j) for j in range(n)]
    assert ex.cache_ids(torch.tensor([-1])).tolist() == [-1]
    got = ex.attended_slots(pos)                                     # [n, C]
    held = ex.held_keys(pos)
    for t in range(n):
        for s in range(ex.cache_size):
            assert bool(got[t, s]) == bool(a.mask_func(s, t)), (t, s)
            if a.mask_func(s, t):
                assert int(held[t, s]) == a.slot_key_func(s, t)
    # the held-key form (used for table-driven analyses and for chunks) is mask_func too
    via_held = (held >= 0) & ex.predicate(pos[:, None], held.clamp(min=0))
    assert torch.equal(via_held, got)
    assert (ex._mask_fn is None) == (name == "table_scheme")
    assert not ex.attended_slots(torch.tensor([-1])).any()


# --- padding and per-row positions ----------------------------------------------------------
def test_padded_rows_equal_rows_alone():
    p = PATTERNS["streaming_llm"]
    ex = executor(p, 48)
    L, pads = 20, (0, 5, 11)
    q, k, v = qkv(3, 4, 2, L, 16, seed=7)
    pos = torch.stack([torch.where(torch.arange(L) >= d, torch.arange(L) - d, -1) for d in pads])
    out = ex.prefill(q, k, v, positions=pos)
    kc, vc = ex.new_cache(3, 2, 16)
    ex.fill_cache(k, v, kc, vc, positions=pos)
    q2, k2, v2 = qkv(3, 4, 2, 6, 16, seed=8)                     # six decode steps per row
    dec = [ex.decode(q2[:, :, t:t + 1], k2[:, :, t:t + 1], v2[:, :, t:t + 1], kc, vc,
                     torch.tensor([L - d + t for d in pads])) for t in range(6)]
    for b, d in enumerate(pads):
        qa, ka, va = (torch.cat([x[b:b + 1, :, d:], y[b:b + 1]], dim=2) for x, y in ((q, q2), (k, k2), (v, v2)))
        want = reference(p, qa, ka, va)
        assert err(out[b:b + 1, :, d:], want[:, :, :L - d]) < TOL
        assert torch.equal(out[b, :, :d], torch.zeros_like(out[b, :, :d]))          # padding rows: 0
        assert err(torch.cat([o[b:b + 1] for o in dec], dim=2), want[:, :, L - d:]) < TOL


def test_chunks_with_padding_equal_one_prefill():
    p = PATTERNS["openai_strided"]
    ex = executor(p, 48)
    L, pads = 23, (0, 9)
    q, k, v = qkv(2, 2, 2, L, 16, seed=9)
    pos = torch.stack([torch.where(torch.arange(L) >= d, torch.arange(L) - d, -1) for d in pads])
    want = ex.prefill(q, k, v, positions=pos)
    kc, vc = ex.new_cache(2, 2, 16)
    outs = [ex.prefill_chunk(q[:, :, s:s + 4], k[:, :, s:s + 4], v[:, :, s:s + 4], kc, vc, pos[:, s:s + 4])
            for s in range(0, L, 4)]
    assert err(torch.cat(outs, dim=2), want) < TOL
    kf, vf = ex.new_cache(2, 2, 16)
    ex.fill_cache(k, v, kf, vf, positions=pos)
    assert torch.equal(kc, kf) and torch.equal(vc, vf)


# --- errors ------------------------------------------------------------------------------------
def test_bad_input():
    p = PATTERNS["sliding_window"]
    ex = executor(p, 16)
    q, k, v = qkv(1, 2, 2, 8, 16, seed=0)
    with pytest.raises(NotYetSupportedError, match="Dynamic"):
        TorchExecutor(Diag(0, 2) + Diag(2, None) * Dynamic(budget=2))
    with pytest.raises(KernelError, match="analysis"):
        TorchExecutor(p, analyze(Causal(), max_len=16))
    with pytest.raises(KernelError, match="multiple of the kv heads"):
        ex.prefill(q[:, :1], k, v)
    with pytest.raises(KernelError, match="past max_len=16"):
        ex.prefill(q, k, v, positions=torch.arange(10, 18))
    with pytest.raises(KernelError, match="increase"):
        ex.prefill(q, k, v, positions=torch.tensor([0, 1, 2, 2, 3, 4, 5, 6]))
    with pytest.raises(KernelError, match="positions must have shape"):
        ex.prefill(q, k, v, positions=torch.arange(7))
    kc, vc = ex.new_cache(1, 2, 16)
    ex.fill_cache(k[:, :, :4], v[:, :, :4], kc, vc)
    before = (kc.clone(), vc.clone())
    with pytest.raises(KernelError, match="past max_len"):
        ex.decode(q[:, :, :1], k[:, :, :1], v[:, :, :1], kc, vc, 16)
    with pytest.raises(KernelError, match="one token"):
        ex.decode(q[:, :, :2], k[:, :, :2], v[:, :, :2], kc, vc, 4)
    with pytest.raises(KernelError, match="cache_size"):
        ex.decode(q[:, :, :1], k[:, :, :1], v[:, :, :1], kc[:, :, :3], vc[:, :, :3], 4)
    with pytest.raises(KernelError, match="dtype"):
        ex.decode(q[:, :, :1], k[:, :, :1].double(), v[:, :, :1], kc, vc, 4)
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])   # failed calls write nothing


# --- the Triton kernels on the same compact cache (CPU interpreter) -----------------------
PO = PrefillOptions(block_m=16, block_n=16, num_warps=4, num_stages=1)
DO = DecodeOptions(block_n=16, num_warps=4, num_stages=1)


def agree_with_triton(p, L, P, seed, max_len=32):
    a = analyze(p, max_len=max_len)
    ex = TorchExecutor(p, a)
    ker = SASAttnKernel(p, max_len=max_len, analysis=a, prefill_options=PO, decode_options=DO, num_splits=2)
    q, k, v = (x.to(DEV) for x in qkv(1, 2, 1, L, 16, seed))
    assert err(ex.prefill(q, k, v), ker(q, k, v)) < TOL
    kc_t, vc_t = ker.new_cache(1, 1, 16, torch.float32, DEV)
    kc_x, vc_x = ex.new_cache(1, 1, 16, torch.float32, DEV)
    assert kc_t.shape == kc_x.shape
    ker.fill_cache(k[:, :, :P], v[:, :, :P], kc_t, vc_t)
    ex.fill_cache(k[:, :, :P], v[:, :, :P], kc_x, vc_x)
    assert torch.equal(kc_t, kc_x) and torch.equal(vc_t, vc_x)
    for t in range(P, L):
        sl = slice(t, t + 1)
        o_t = ker(q[:, :, sl], k[:, :, sl], v[:, :, sl], kc_t, vc_t, position=t)
        o_x = ex.decode(q[:, :, sl], k[:, :, sl], v[:, :, sl], kc_x, vc_x, t)
        assert err(o_t, o_x) < TOL
        assert torch.equal(kc_t, kc_x) and torch.equal(vc_t, vc_x)


@pytest.mark.parametrize("name", ["streaming_llm", "openai_fixed", "strided_block_local"])
def test_torch_and_triton_agree(name):
    agree_with_triton(PATTERNS[name], L=24, P=17, seed=len(name))


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=causal_patterns(3).filter(lambda p: not p.dynamics()), seed=st.integers(0, 99))
def test_torch_and_triton_agree_on_random_patterns(p, seed):
    assume(p.to_mask(32).any())              # the analyzer refuses patterns that attend nothing
    analyze(p, max_len=32)
    agree_with_triton(p, L=20, P=seed % 19 + 1, seed=seed)


def test_prefill_past_max_len_reads_every_key_the_pattern_attends():
    """A pattern causal within max_len (what the analysis proves) need not be past it: the
    functional prefill of a longer sequence skips no key above the diagonal (an exploration
    found `Causal() + Rect(rows=(70, 100), cols=(200, 210))` at max_len 64 off by 0.31 at 300
    tokens; the Triton backend was right)."""
    p = Causal() + Rect(rows=(70, 100), cols=(200, 210))
    ker = SASAttnKernel(p, max_len=64, backend="torch")
    assert ker.plan.causal
    q, k, v = qkv(1, 2, 1, 300, 16, seed=5)
    assert err(ker(q, k, v), reference(p, q, k, v)) < 1e-5
    assert err(ker(q[:, :, -40:], k, v), reference(p, q[:, :, -40:], k, v)) < 1e-5


@pytest.mark.parametrize("pattern", [Diag(0, 4), (Diag(0, 8) + Rect(cols=(0, 2))) * Causal(), Causal()])
def test_gradients_through_decode_steps(pattern):
    """backend='torch' is differentiable through a prompt and several decode steps: each step
    writes the cache in place, and autograd keeps a copy of what a step read (before, the second
    step's write raised torch's 'modified by an inplace operation' at backward for windows);
    the gradients equal those of dense attention under the mask."""
    P, L = 6, 10
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 1, L, 16, seed=7))
    ker = SASAttnKernel(pattern, max_len=32, backend="torch")
    outs = [ker.prefill(q[:, :, :P], k[:, :, :P], v[:, :, :P])]
    outs += [ker.decode(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1]) for i in range(P, L)]
    w = torch.randn(1, 2, L, 16, dtype=torch.float64)
    grads = torch.autograd.grad((torch.cat(outs, 2).double() * w).sum(), (q, k, v))
    ref = torch.autograd.grad((reference(pattern, q, k, v) * w).sum(), (q, k, v))
    assert max(err(a, b) for a, b in zip(grads, ref)) < 1e-5


def test_keyless_output_keeps_its_gradient_path():
    """Where no query attends a key the output is zeros that stay in the autograd graph (zero
    gradients, as dense attention gives), not a tensor cut off from it."""
    ker = SASAttnKernel(Diag(5, 2), max_len=16, backend="torch")
    q, k, v = (t.requires_grad_() for t in qkv(1, 1, 1, 4, 16, seed=2))
    out = ker(q, k, v)
    assert out.requires_grad and not out.detach().any()
    gq, gk, gv = torch.autograd.grad(out.sum(), (q, k, v))
    assert not (gq.any() or gk.any() or gv.any())


def test_cache_made_under_inference_mode_is_refused_outside_it():
    """A cache made under torch.inference_mode() (the stateful prefill's, or new_cache's) is
    written in place by the next step: outside inference mode that is a KernelError saying what
    to do, before any work, not torch's 'Inplace update to inference tensor'; inside it, it runs."""
    ker = SASAttnKernel(Diag(0, 4), max_len=32, backend="torch")
    q, k, v = qkv(1, 2, 1, 9, 16, seed=4)
    with torch.inference_mode():
        ker.prefill(q[:, :, :8], k[:, :, :8], v[:, :, :8])
    one = [t[:, :, 8:9] for t in (q, k, v)]
    before = ker.k_cache.clone()
    for mode in (torch.no_grad, torch.enable_grad):
        with mode(), pytest.raises(KernelError, match="inference_mode"):
            ker.decode(*one)
    assert torch.equal(ker.k_cache, before)
    with torch.inference_mode():
        out = ker.decode(*one)
    assert err(out, reference(Diag(0, 4), q, k, v)[:, :, 8:9]) < 1e-5
