"""Block-sparse attention with the spread operator (>>): a block-diagonal pattern.

Source: paper Figure 6 ("we first define a 2 x 2 block pattern and then spread it across a
diagonal pattern"). Mask: i // 2 == j // 2.
"""

from sas import Causal, Diag, Dynamic, Rect, ops  # noqa: F401

block = Rect(size=(2, 2))           # the unit: a full 2 x 2 tile
diagonal = Diag(0, 1)               # the layout on the block grid: the main diagonal

pattern = block >> diagonal
