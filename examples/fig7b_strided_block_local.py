"""Strided block-local pattern (LongNet) as written in the paper.

Source: paper Figure 7b, code listing reproduced line for line. The caption says "causal
masking is omitted from the code for simplicity", so `pattern` is the listing as printed
(not causal) and `causal_pattern` adds it back.

Note: with docs/semantics.md, `offset=1` keeps the odd rows and columns (1, 3, 5, 7) of the
8 x 8 region; the Figure 12 functions for the same pattern keep the even tokens instead
(see fig12_strided_block_local.py).
"""

from sas import Causal, Diag, Dynamic, Rect, ops  # noqa: F401

# First create a diagonal pattern
p1 = Diag(offset=0, size=1)
# Then create a rectangular block
p2 = Rect(size=[4, 4])

# Create the block local pattern
block_local = p2 >> p1
# Add stride
strided_block_local = block_local * Rect(size=[8, 8], stride=2, offset=1)

causal_pattern = strided_block_local * Causal()

pattern = strided_block_local
