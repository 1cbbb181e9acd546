"""Strided block-local attention at the small sizes of Figures 7b and 9-12.

Source: paper Figure 12 ("Strided block-local attention. KV_CACHE_SIZE = 2"), Figures 9-11
(8 x 8 drawings: "decomposed to four vertical blocks with stride 2") and the listing of
Figure 7b (4 x 4 blocks, stride 2).

Reconstructed: Figure 12's functions keep only even tokens
(`cache_id_func` returns -1 unless `token_id % 2 == 0`), so the stride here has offset 0
(rows/columns 0, 2, 4, ...), unlike the `offset=1` printed in Figure 7b; causal masking is
added, and the pattern is not cut to the 8 x 8 drawing so that it is defined at any length
(`drawn` is the 8 x 8 version). The printed functions are

    def cache_id_func(token_id):
        return token_id // 2 if token_id % 2 == 0 else -1
    def mask_func(cache_id, token_id):
        return cache_id <= (token_id // 2) % 2 if token_id % 2 == 0 else False

(as printed, `cache_id_func` exceeds the 2 slots from token 4 on; `(token_id // 2) % 2` is
the consistent reading). Mask: i // 4 == j // 4 and j <= i and i % 2 == 0 and j % 2 == 0.
"""

from sas import Causal, Diag, Dynamic, Rect, ops  # noqa: F401

KV_CACHE_SIZE = 2                   # as printed in Figure 12

block_local = Rect(size=(4, 4)) >> Diag(offset=0, size=1)
every_2nd = Rect(stride=2)          # even rows and even columns

pattern = block_local * every_2nd * Causal()

drawn = pattern * Rect(size=(8, 8))  # the 8 x 8 matrix of Figures 9-11
