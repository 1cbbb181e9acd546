"""OpenAI strided sparse attention (Child et al., Sparse Transformer).

Source: paper Table 1, "OpenAI Strided [9]: local window size 512, stride 512".
Reference mask (reference-figures.md): (q >= k) & ((q - k < 512) | ((q - k) % 512 == 0)).
"""

from sas import Causal, Diag, Dynamic, Rect, ops  # noqa: F401

WINDOW = 512
STRIDE = 512

local = Diag(0, WINDOW)                       # the previous 512 keys
strided = Diag(0, None, stride=STRIDE)        # every 512th key back: (i - j) % 512 == 0

pattern = (local + strided) * Causal()
