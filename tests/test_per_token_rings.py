"""Closed forms for patterns analysed per token (`sas.analysis.slots.ring_from_last_use`,
`sas.analysis.keysets.flag_keyset`).

A pattern without a periodic description is analysed into every key's last use. Where those
last uses fit a ring (slot = rank of the key among a key set, modulo C), the synthesized
functions use it instead of a per-token table. Here the key set must describe the used keys
exactly, and the ring must hold every key until its last use (a decode simulated key by key)
with the fewest slots that do (one slot fewer overwrites a live key).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sas.analysis.keysets import KeySet, flag_keyset
from sas.analysis import slots
from sas.analysis.slots import ALL_KEYS, padding_ok, ring_from_last_use


def _ring_holds(last_use: np.ndarray, keys: KeySet, C: int) -> bool:
    """Decode step by step: key j goes to slot rank(j) % C when it is a member; every used key
    must still be in its slot at each step up to its last use."""
    n = len(last_use)
    slot_of: dict[int, int] = {}
    holder = [-1] * C
    for i in range(n):
        if keys.contains(np.array([i]))[0]:
            s = int(keys.rank(np.array([i]))[0]) % C
            holder[s] = i
            slot_of[i] = s
        for j in range(i + 1):
            if last_use[j] >= i and (j not in slot_of or holder[slot_of[j]] != j):
                return False
    return True


@st.composite
def lifetimes(draw) -> np.ndarray:
    n = draw(st.integers(1, 60))
    reach = draw(st.integers(0, 20))
    unused = draw(st.sampled_from(["none", "some", "periodic"]))
    ends = []
    for j in range(n):
        if unused == "some" and draw(st.booleans()) or unused == "periodic" and j % 3 == 1:
            ends.append(-1)
        else:
            ends.append(draw(st.integers(j, min(n - 1, j + reach))))
    return np.asarray(ends, dtype=np.int64)


@settings(max_examples=150, deadline=None)
@given(lifetimes(), st.booleans())
def test_ring_holds_every_key_with_the_fewest_slots(last_use: np.ndarray, every_key: bool) -> None:
    """Over the used keys' key set, and over every key (where the used keys have no key set)."""
    assume((last_use >= 0).any())
    with pytest.MonkeyPatch.context() as mp:
        if every_key:
            mp.setattr(slots, "flag_keyset", lambda flags: None)
        ring = ring_from_last_use(last_use)
    assert ring.keys == ALL_KEYS or not every_key
    used = last_use >= 0
    assert np.array_equal(ring.keys.contains(np.arange(len(last_use))) & used, used)
    assert _ring_holds(last_use, ring.keys, ring.C)
    assert ring.C == 1 or not _ring_holds(last_use, ring.keys, ring.C - 1)


def test_ring_of_no_used_key_is_none() -> None:
    assert ring_from_last_use(np.full(5, -1)) is None


def test_hand_picked_rings() -> None:
    # every other key used for two steps: the used keys form a set of period 2, ring of 2 slots
    last_use = np.array([1, -1, 3, -1, 5, -1, 7, -1])
    ring = ring_from_last_use(last_use)
    assert (ring.keys.T, ring.keys.P, ring.keys.classes, ring.C) == (0, 2, (0,), 1)
    last_use = np.array([2, -1, 4, -1, 6, -1, 7, -1])
    assert ring_from_last_use(last_use).C == 2
    # a key kept to the end: the ring comes back to its slot after C keys, so it needs a slot for
    # every key up to the end (6), where a table needs 2 (analyze then keeps the table)
    last_use = np.array([5, 1, 2, 3, 4, 5])
    assert ring_from_last_use(last_use).C == 6


@st.composite
def periodic_flags(draw) -> tuple[np.ndarray, int, int]:
    """Flags that are arbitrary for t keys, then repeat a p-key pattern (or a run of flagged keys
    then a pattern); with the t and p used."""
    p = draw(st.integers(1, 300))
    pattern = np.asarray(draw(st.lists(st.booleans(), min_size=p, max_size=p)), dtype=bool)
    if draw(st.booleans()):
        t = draw(st.integers(0, 300))
        head = np.asarray(draw(st.lists(st.booleans(), min_size=t, max_size=t)), dtype=bool)
    else:
        t = draw(st.integers(0, 3000))
        head = np.concatenate([np.zeros(draw(st.integers(0, 5)), dtype=bool), np.ones(t, dtype=bool)])
        t = len(head)
    reps = draw(st.integers(1, 12))
    return np.concatenate([head, np.tile(pattern, reps)[:reps * p - draw(st.integers(0, p - 1))]]), t, p


@settings(max_examples=200, deadline=None)
@given(periodic_flags())
def test_flag_keyset_describes_the_flags_exactly(case) -> None:
    flags, t, p = case
    ks = flag_keyset(flags)
    n = len(flags)
    if ks is not None:
        assert np.array_equal(ks.contains(np.arange(n)), flags)
        boundary_is_range = len(ks.boundary) == 0 or ks.boundary[-1] - ks.boundary[0] + 1 == len(ks.boundary)
        assert ks.P <= 256 and (ks.T <= 256 or boundary_is_range)
    # a boundary of at most 256 keys and a period of at most 256, repeated at least twice past
    # the 256 first keys, is always found
    if t <= 256 and p <= 256 and n >= 256 + 2 * p:
        assert ks is not None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.booleans(), min_size=0, max_size=700))
def test_flag_keyset_of_any_flags_is_exact_or_none(bits) -> None:
    flags = np.asarray(bits, dtype=bool)
    ks = flag_keyset(flags)
    if ks is not None:
        assert np.array_equal(ks.contains(np.arange(len(flags))), flags)


@pytest.mark.parametrize("minimal,size,ok", [(1000, 1125, True), (1000, 1126, False), (3, 67, True),
                                             (3, 68, False), (10, 10, True)])
def test_padding_allowed(minimal: int, size: int, ok: bool) -> None:
    assert padding_ok(minimal, size) is ok


def test_all_keys_ring_is_positions_modulo_c() -> None:
    j = np.arange(20)
    assert np.array_equal(ALL_KEYS.rank(j) % 7, j % 7)
