"""Static part of sliding window + H2O, the pattern whose functions Figure 12 lists.

Source: paper Figure 12 ("Sliding window H2O. KV_CACHE_SIZE = 2"), Figures 9-11 and the
listing of Figure 7a (p0 = Diag(offset=0, size=2)). The paper's generated functions:

    def cache_id_func(token_id):
        return token_id % 2 if token_id >= 0 else -1
    def mask_func(cache_id, token_id):
        return cache_id <= token_id and cache_id < 2
"""

from sas import Causal, Diag, Dynamic, Rect, ops  # noqa: F401

KV_CACHE_SIZE = 2                   # as printed in Figure 12

window = Diag(offset=0, size=2)     # each query sees itself and the previous key

pattern = window
