"""The table fallback's slot assignment (`sas.analysis.slots.greedy_table`) against networkx.

Slots of a table scheme colour the interval graph of the keys' lifetimes [j, last_use[j]]:
two keys alive at once need different slots. `greedy_table` colours by start time, reusing
slots first-in first-out, vectorized (O(n log n) time, O(n) memory; an explicit interval graph
has O(n C) edges). Here
networkx builds that graph for small cases: the assignment must be a proper colouring of it,
and use as many slots as networkx's colouring in start order (optimal on interval graphs) and
as its largest clique.
"""

from __future__ import annotations

import networkx as nx
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sas.analysis.slots import greedy_table


def _graph(last_use: np.ndarray) -> nx.Graph:
    live = [j for j in range(len(last_use)) if last_use[j] >= j]
    g = nx.Graph()
    g.add_nodes_from(live)
    for a in live:
        for b in live:
            if a < b <= last_use[a]:          # b is stored while a is still needed
                g.add_edge(a, b)
    return g


@st.composite
def lifetimes(draw) -> np.ndarray:
    n = draw(st.integers(1, 40))
    ends = [draw(st.one_of(st.just(-1), st.integers(j, min(n - 1, j + draw(st.integers(0, 12))))))
            for j in range(n)]
    return np.asarray(ends, dtype=np.int64)


@settings(max_examples=60, deadline=None)
@given(lifetimes())
def test_greedy_table_is_an_optimal_colouring_of_the_interval_graph(last_use: np.ndarray) -> None:
    scheme = greedy_table(last_use)
    g = _graph(last_use)
    for j in range(len(last_use)):
        assert (scheme.cache_id[j] >= 0) == (last_use[j] >= j)
    for a, b in g.edges:
        assert scheme.cache_id[a] != scheme.cache_id[b], (a, b)
    by_start = nx.coloring.greedy_color(g, strategy=lambda graph, colors: sorted(graph))
    colours = len(set(by_start.values()))
    clique = max((len(c) for c in nx.find_cliques(g)), default=0)
    assert scheme.C == colours == clique


def test_hand_picked_lifetimes() -> None:
    # three overlapping keys, then a key after all of them ended reuses slot 0
    s = greedy_table(np.array([2, 3, 4, -1, -1, 5]))
    assert s.C == 3 and s.cache_id.tolist() == [0, 1, 2, -1, -1, 0]
