"""Strided block-local attention (LongNet-style dilation inside local blocks).

Source: paper Table 1, "Strided Block-Local [12]: block size 256, stride 4".
Reference mask (reference-figures.md):
(q >= k) & (q // 256 == k // 256) & (q % 4 == 0) & (k % 4 == 0).
"""

from sas import Causal, Diag, Dynamic, Rect, ops  # noqa: F401

BLOCK = 256
STRIDE = 4

block_local = Rect(size=(BLOCK, BLOCK)) >> Diag(0, 1)   # block diagonal
every_4th = Rect(stride=STRIDE)                          # rows and columns that are multiples of 4

pattern = block_local * every_4th * Causal()
