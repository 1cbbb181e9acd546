"""Threshold selection (sas.methods.threshold, threshold_triton): the sorting-free kernel against
the sort-based reference (same kept set, mass >= p), top-k against torch.topk, the paper's
fixed bisection keeping theta_low, and bad input."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sas.errors import KernelError, PatternError, SASError
from sas.methods.threshold import Selection, expand_chunks, kept_mass, pool, select_reference
from sas.methods.threshold_split_triton import split_layout
from sas.methods.threshold_triton import threshold_select

from helpers.attention import DEV


def kernel_select(x, **kw) -> Selection:
    """`threshold_select` on CPU-built scores moved to DEV, its selection brought back to the CPU
    (to compare with the float64 reference there)."""
    got = threshold_select(x.to(DEV), **kw)
    return Selection(got.mask.cpu(), got.theta.cpu(), got.kept.cpu())


def rows(shape, seed, kind="peaked"):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(*shape, generator=g)
    if kind == "peaked":
        return x ** 6
    if kind == "softmax":
        return torch.softmax(torch.randn(*shape, generator=g) * 3, -1)
    return x


def test_reference_is_the_sorted_nucleus_by_brute_force():
    x = rows((2, 1, 1, 9), 0)
    for p in (0.3, 0.7, 0.95):
        sel = select_reference(x, p=p)
        for m in range(2):
            y = x[m, 0, 0].double()
            sets = [torch.tensor([(bits >> i) & 1 for i in range(9)], dtype=torch.bool) for bits in range(1, 1 << 9)]
            fewest = min(int(s.sum()) for s in sets if y[s].sum() >= p * y.sum())
            most = max(float(y[s].sum()) for s in sets if int(s.sum()) == fewest)
            # the fewest keys reaching p, and among those the most mass (distinct values: unique)
            assert int(sel.mask[m].sum()) == fewest
            assert float(y[sel.mask[m]].sum()) == pytest.approx(most, abs=1e-12)


def test_reference_ties_kept_and_p1_keeps_all():
    x = torch.tensor([[[[0.4, 0.2, 0.2, 0.2, 0.0]]]])
    assert select_reference(x, p=0.5).mask.tolist() == [[True, True, True, True, False]]
    assert select_reference(x, p=1.0).mask.all()
    assert select_reference(x, k=2).mask.tolist() == [[True, True, True, True, False]]   # ties of the 2nd value


@pytest.mark.kernels
@pytest.mark.parametrize("chunk,method", [(1, "split"), (16, "split"), (1, "row"), (16, "row"), (1, "resident"),
                                          (16, "resident")])
def test_kernel_equals_sorted_reference_topp(chunk, method):
    x = rows((2, 2, 2, 70), chunk, "softmax")
    for p in (0.6, 0.95):
        ref = select_reference(x, p=p, chunk=chunk)
        got = kernel_select(x, p=p, chunk=chunk, method=method)
        assert torch.equal(got.mask, ref.mask), (chunk, p)
        assert torch.equal(got.kept.long(), ref.kept)
        assert (kept_mass(x, got.mask, chunk) >= p - 1e-6).all()


@pytest.mark.kernels
def test_kernel_odd_chunk_peaked_rows_and_p1():  # default method (auto: the resident kernel at these sizes)
    x = rows((2, 1, 1, 23), 5, "peaked")
    for p, chunk in ((0.9, 5), (1.0, 1)):
        assert torch.equal(kernel_select(x, p=p, chunk=chunk).mask, select_reference(x, p=p, chunk=chunk).mask)
    assert kernel_select(torch.zeros(1, 1, 1, 9), p=0.5).mask.all()     # all-zero row: every key (ties)


@pytest.mark.kernels
@pytest.mark.parametrize("method", ["resident", "row"])
def test_kernel_topk_equals_torch_topk_and_signed_scores(method):
    x = torch.randn(2, 1, 1, 40, generator=torch.Generator().manual_seed(3))      # negative values too
    for k in (1, 7, 200):
        got = kernel_select(x, k=k, method=method).mask
        want = torch.zeros(2, 40, dtype=torch.bool)
        want.scatter_(1, torch.topk(x[:, 0, 0], min(k, 40), dim=-1).indices, True)
        assert torch.equal(got, want)


@pytest.mark.kernels
@pytest.mark.parametrize("method", ["resident", "row"])
def test_kernel_paper_bisection_keeps_theta_low(method):
    x = rows((3, 1, 1, 64), 4, "softmax")
    ref = select_reference(x, p=0.9, iters=10)
    got = kernel_select(x, p=0.9, iters=10, method=method)
    assert torch.equal(got.mask, ref.mask)
    exact = select_reference(x, p=0.9).mask
    assert (got.mask | ~exact).all()                        # a superset of the nucleus
    assert (kept_mass(x, got.mask) >= 0.9 - 1e-9).all()
    # the paper's {a >= theta_mid} can fall short: theta_low never does
    y = pool(x, 1)[:, 0]
    extras = got.mask & ~exact
    assert (y[extras] >= got.theta.double().repeat_interleave(64, 0).reshape(3, 64)[extras] - 1e-7).all()


@pytest.mark.kernels
@settings(max_examples=4)
@given(st.integers(1, 3), st.integers(1, 2), st.integers(1, 2), st.integers(1, 60), st.sampled_from([1, 16]),
       st.floats(0.05, 0.99), st.integers(0, 10_000), st.sampled_from(["resident", "row"]))
def test_kernel_random_rows(m, r, pp, n, chunk, p, seed, method):
    x = rows((m, r, pp, n), seed, "softmax")
    ref = select_reference(x, p=p, chunk=chunk)
    got = kernel_select(x, p=p, chunk=chunk, method=method)
    assert (kept_mass(x, got.mask, chunk) >= p - 1e-5).all()
    assert torch.equal(got.mask, ref.mask)


@pytest.mark.kernels
def test_split_kernel_many_splits_equals_row_kernel_and_reference():
    """Rows split over 2 or 5 programs of 16-entry tiles (the last split short): every request kind
    gives the reference's set and the row kernel's set and threshold; so does the resident kernel's
    binary search."""
    x = rows((1, 1, 2, 75), 11, "softmax")
    x[0, 0, 1, 3] = -0.5                                       # a negative pooled score (zero mass)
    for kw, all_splits in ((dict(p=0.8), (2, 5)), (dict(k=6), (5,)), (dict(p=1.0), (2,)),
                           (dict(p=0.9, iters=10), (5,)), (dict(p=0.7, chunk=4), (2,))):
        ref = select_reference(x, **kw)
        row = kernel_select(x, method="row", **kw)
        res = kernel_select(x, method="resident", **kw)
        assert torch.equal(res.mask, ref.mask) and torch.equal(res.theta, row.theta), kw
        for splits in all_splits:
            got = kernel_select(x, block=16, splits=splits, method="split", **kw)
            assert torch.equal(got.mask, ref.mask), (kw, splits)
            assert torch.equal(got.kept.long(), ref.kept), (kw, splits)
            assert torch.equal(got.theta, row.theta), (kw, splits)
    z = kernel_select(torch.zeros(1, 1, 1, 40), p=0.5, block=16, method="split")
    assert z.mask.all() and float(z.theta) == 0.0                 # all-zero row: θ = the max, every key (ties)
    z = kernel_select(torch.zeros(1, 1, 1, 40), p=0.5, method="resident")
    assert z.mask.all() and float(z.theta) == 0.0


@pytest.mark.kernels
def test_resident_kernel_long_peaked_rows():
    """Rows of a few thousand entries (several warps' worth; pooled, chunked, unioned) and a row
    of one entry: the resident kernel gives the reference's set."""
    x = rows((2, 2, 2, 3000), 13, "peaked")
    for kw in (dict(p=0.95), dict(p=0.5, chunk=16), dict(k=100), dict(p=0.9, iters=12), dict(p=0.5, chunk=5000)):
        ref = select_reference(x, **kw)
        got = kernel_select(x, method="resident", **kw)
        assert torch.equal(got.mask, ref.mask), kw
        assert torch.equal(got.kept.long(), ref.kept), kw
    one = kernel_select(torch.full((1, 1, 1, 1), 0.25), p=0.3, method="resident")
    assert one.mask.tolist() == [[True]] and float(one.theta) == 0.25


@pytest.mark.kernels
@pytest.mark.parametrize("method", ["resident", "row"])
def test_negative_zero_ties_with_zero(method):
    """-0.0 == 0.0: the k-th largest value's ties include both zeros (the row read as it is
    by the resident kernel once ordered -0.0 below 0.0)."""
    x = torch.tensor([[[[-0.0, 0.0, -1.0, -0.0]]]])
    for kw in (dict(k=1), dict(k=2), dict(p=0.5), dict(p=0.5, iters=5)):
        assert torch.equal(kernel_select(x, method=method, **kw).mask, select_reference(x, **kw).mask), kw


@pytest.mark.parametrize("rows_, nc, block, splits", [(128, 8192, 256, None), (1, 100, 16, None), (4, 75, 16, 5),
                                                      (3, 10, 16, 4), (2, 1000, 64, 7)])
def test_split_layout_covers_every_entry_once(rows_, nc, block, splits):
    ns, span = split_layout(rows_, nc, block, splits)
    assert span % block == 0 and ns >= 1
    assert (ns - 1) * span < nc <= ns * span                    # no empty split, every entry in one
    if splits is not None:
        assert ns <= splits


def test_union_over_rows_and_chunk_expansion():
    x = torch.zeros(1, 2, 1, 6)
    x[0, 0, 0, 1] = 1.0
    x[0, 1, 0, 4] = 1.0
    assert select_reference(x, p=0.9).mask.tolist() == [[False, True, False, False, True, False]]
    m = select_reference(x, p=0.9, chunk=4).mask
    assert m.tolist() == [[True, True]]
    assert expand_chunks(m, 4, 6).tolist() == [[True] * 6]


@pytest.mark.parametrize("kwargs,match", [
    (dict(p=0.0), "p must be a number"), (dict(p=1.5), "p must be a number"), (dict(p=-0.1), "p must be a number"),
    (dict(p=float("nan")), "p must be a number"), (dict(p="0.9"), "p must be a number"),
    (dict(k=0), "k must be a positive integer"), (dict(p=0.9, k=3), "give exactly one of p"), (dict(), "give exactly one of p"),
    (dict(p=0.5, chunk=0), "chunk must be a positive integer"), (dict(k=3, iters=10), "iters=.*applies to top-p only"),
    (dict(p=0.5, iters=0), "iters must be None")])
def test_bad_requests(kwargs, match):
    x = torch.rand(1, 1, 1, 8)
    with pytest.raises(KernelError, match=f"select_reference: {match}"):
        select_reference(x, **kwargs)
    with pytest.raises(KernelError, match=f"threshold_select: {match}"):
        threshold_select(x, **kwargs)


@pytest.mark.parametrize("kwargs,match", [(dict(method="sort"), "method must be one of"),
                                          (dict(splits=0), "splits must be None"),
                                          (dict(splits=2.0), "splits must be None"),
                                          (dict(block=100), "block must be a power of two"),
                                          (dict(block=8), "block must be a power of two")])
def test_bad_kernel_options(kwargs, match):
    with pytest.raises(KernelError, match=f"threshold_select: {match}"):
        threshold_select(torch.rand(1, 1, 1, 8), p=0.5, **kwargs)


def test_resident_refuses_rows_longer_than_its_registers():
    from sas.methods.threshold_triton import RESIDENT_MAX_ENTRIES

    long_row = torch.rand(1, 1, 1, RESIDENT_MAX_ENTRIES + 1, device=DEV)
    with pytest.raises(KernelError, match="at most 131072 entries"):
        threshold_select(long_row, p=0.5, method="resident")
    # chunked, the same row fits
    assert threshold_select(long_row, p=0.5, chunk=2, method="resident").mask.shape == (1, RESIDENT_MAX_ENTRIES // 2 + 1)


def test_bad_scores():
    for bad in (torch.rand(8), torch.ones(1, 1, 1, 8, dtype=torch.int64), "x", torch.rand(1, 1, 1, 0)):
        with pytest.raises(SASError):
            threshold_select(bad, p=0.5)


def test_top_p_chain_arguments():
    from sas import ops
    for p in (0, 1.01, -1, True):
        with pytest.raises(PatternError, match="p must be a number in"):
            ops.external("draft").top_p(p)
    with pytest.raises(PatternError):
        ops.external("draft").top_p(0.9, chunk=0)
    with pytest.raises(PatternError):
        ops.external("draft").top_p(0.9, pooled="yes")
