"""Block-local attention: each query block sees its own and the two previous key blocks.

Source: paper Table 1, "Block Local: 3 local blocks with block size 128".
Reference mask (reference-figures.md): (q >= k) & (q // 128 - k // 128 < 3).
"""

from sas import Causal, Diag, Dynamic, Rect, ops  # noqa: F401

BLOCK = 128
BLOCKS = 3

block = Rect(size=(BLOCK, BLOCK))   # one full 128 x 128 tile
local_blocks = Diag(0, BLOCKS)      # on the block grid: block-row - block-col in [0, 3)

pattern = (block >> local_blocks) * Causal()
