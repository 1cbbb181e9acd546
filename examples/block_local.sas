# Block-local attention: each query block sees its own and the two previous key blocks.
# Source: paper Table 1, "Block Local: 3 local blocks with block size 128".
# Reference mask: (q >= k) & (q // 128 - k // 128 < 3).
# Mirrors examples/block_local.py.

block  = Rect(size=(128, 128))     # one full 128 x 128 tile
layout = Diag(0, 3)                # on the grid of blocks: the block row and the 2 before it

# `>>` binds looser than `*` (as in Python), so the spread needs its parentheses.
pattern = (block >> layout) * Causal()
