"""Closed forms beyond the table limit (sas.analysis.slots.padded_scheme): where no closed
form fits the minimal cache, the smallest ring / prefix+ring with more slots is used instead
of a per-token table. The table limit is lowered to 0 here so that small lengths take that
path; decoding with the functions must still give exactly the oracle's keys."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from analysis_checks import brute_cache_size, decode_with_functions
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from strategies import causal_patterns

from sas import Causal, Diag, Rect, analyze
from sas.ir.periodicity import structure

ANALYZE = sys.modules["sas.analysis.analyze"]


@pytest.fixture
def no_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ANALYZE, "TABLE_LIMIT", 0)


# patterns that random compositions produced without a closed form at the minimal size
PADDED = [Diag(2, None) * Causal(), ~Diag(5, 5) * Causal(), Diag(4, None, stride=2) * Causal(),
          Diag(1, None, stride=4) * Causal(), ~Diag(-1, 5) * Causal()]


@pytest.mark.parametrize("p", PADDED, ids=repr)
def test_padded_closed_forms_decode_the_mask(no_tables: None, p) -> None:
    n = 96
    a = analyze(p, n)
    minimal = brute_cache_size(p.to_mask(n))
    assert a.closed_form and a.scheme in ("ring", "prefix+ring")
    assert a.minimal_cache_size == minimal < a.cache_size
    assert any("smallest closed form" in note and f"{a.cache_size} slots" in note for note in a.notes)
    assert a.report()["minimal_cache_size"] == minimal
    decode_with_functions(a, p.to_mask(n))


def test_without_the_limit_the_minimal_size_is_kept() -> None:
    # up to the table limit nothing is padded: the keys' last uses fit a ring of the minimal
    # size here (a table where they fit none)
    p = Diag(2, None) * Causal()
    a = analyze(p, 96)
    assert a.cache_size == brute_cache_size(p.to_mask(96)) and a.minimal_cache_size is None
    assert a.closed_form and any("fit a closed-form ring of the minimal" in note for note in a.notes)
    decode_with_functions(a, p.to_mask(96))


def test_long_lengths_are_no_longer_refused() -> None:
    a = analyze(~Diag(5, 5) * Causal(), 1 << 17)
    assert a.closed_form and a.minimal_cache_size == (1 << 17) - 5 and a.cache_size == 1 << 17


@settings(max_examples=60, deadline=None)
@given(causal_patterns(max_depth=4), st.integers(1, 80))
def test_random_padded_schemes_decode_the_mask(p, n: int) -> None:
    mask = p.to_mask(n)
    assume(mask.any())                       # an empty pattern caches nothing
    ANALYZE.TABLE_LIMIT, saved = 0, ANALYZE.TABLE_LIMIT
    try:
        a = analyze(p, n)
    finally:
        ANALYZE.TABLE_LIMIT = saved
    minimal = brute_cache_size(mask)
    decode_with_functions(a, mask)
    assert np.all(a.cache_ids(n) < a.cache_size)
    if not a.closed_form:
        # only patterns without a periodic description: a table of the minimal size, at any length
        assert not structure(p.restrict(n)).periodic and a.cache_size == minimal
        return
    assert (a.minimal_cache_size or a.cache_size) == minimal <= a.cache_size


# periodic patterns whose padded closed form (`padded_scheme`) is a dense ring, while their keys'
# last uses fit a ring of the minimal size (keys attended from 8, or 177, tokens after them on)
LAST_USE_RINGS = [Diag(8, None) * Causal(), Diag(177, 493) * Causal()]


@pytest.mark.parametrize("p", LAST_USE_RINGS, ids=repr)
def test_a_ring_from_the_last_uses_beats_a_far_padded_form(no_tables: None, p) -> None:
    n = 600
    mask = p.to_mask(n)
    a = analyze(p, n)
    assert a.structure.periodic and a.closed_form and a.scheme == "ring"
    assert a.cache_size == brute_cache_size(mask) and a.minimal_cache_size is None
    assert any("fit a closed-form ring of the minimal" in note for note in a.notes)
    decode_with_functions(a, mask)


def test_a_close_padded_form_is_taken_without_the_last_uses(no_tables: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # the dense ring of Diag(8) is 8 slots over its minimal: within the padding allowed, but not
    # close enough to skip the last uses; counted close, it is taken as it is
    p, n = LAST_USE_RINGS[0], 600
    mask = p.to_mask(n)
    monkeypatch.setattr(ANALYZE, "PAD_CLOSE_SLOTS", 8)
    a = analyze(p, n)
    assert a.closed_form and a.minimal_cache_size == brute_cache_size(mask) == n - 8 and a.cache_size == n
    decode_with_functions(a, mask)
    # past the length limit of the read, too
    monkeypatch.setattr(ANALYZE, "PAD_CLOSE_SLOTS", 4)
    monkeypatch.setattr(ANALYZE, "PAD_READ_MAX_LEN", n - 1)
    b = analyze(p, n)
    assert b.closed_form and b.minimal_cache_size == n - 8 and b.cache_size == n


# --- patterns that store finitely many keys -----------------------------------------------------

def test_keys_below_a_bound_take_a_ring_at_any_length() -> None:
    """Keys 0..11 attended by rows 16..37 only: a ring of the 12 boundary keys, from the column
    shapes at any length (before: the ring's check took a key past the last member for the 12th
    key's successor, found none valid, and the per-token search ran: 4.5 s at 2^24, refused at
    2^30), as for the same mask with its rows bounded too."""
    p = Rect(cols=(0, 12)) * Diag(16, 11)
    twin = Rect(rows=(16, 38), cols=(0, 12)) * Diag(16, 11)
    assert np.array_equal(p.to_mask(64), twin.to_mask(64))
    for n in (64, 1 << 24, 1 << 30):
        a = analyze(p, n)
        assert a.closed_form and a.scheme == "ring" and a.cache_size == 12
        assert not any("per-token" in note for note in a.notes)
    decode_with_functions(analyze(p, 64), p.to_mask(64))


@settings(max_examples=40, deadline=None)
@given(causal_patterns(max_depth=3), st.integers(1, 40), st.integers(41, 96))
def test_random_patterns_over_finitely_many_keys_get_a_closed_form(p, m: int, n: int) -> None:
    """A composition over the keys below m <= 40 stores at most m keys: a ring as large as them
    never wraps, so a closed form always exists (the minimal one, or padded by at most m slots);
    checked at n and at 2^20 (without the per-token search where the pattern has a period), and
    decoded exactly at n."""
    p = Rect(cols=(0, m)) * p
    mask = p.to_mask(n)
    assume(mask.any())                       # an empty pattern caches nothing
    a = analyze(p, n)
    decode_with_functions(a, mask)
    assert (a.minimal_cache_size or a.cache_size) == brute_cache_size(mask)
    far = analyze(p, 1 << 20)
    assert far.closed_form and far.cache_size <= m
    if structure(p.restrict(1 << 20)).periodic:
        assert not any("per-token" in note for note in far.notes)
