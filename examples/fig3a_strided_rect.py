"""Rectangle components with stride and stride offset.

Source: paper Figure 3a ("Basic attention patterns in SAS": a Rectangle "can be customized
with a stride to control the spacing between valid blocks and a stride offset to adjust the
initial block position within the defined area").

Reconstructed: the figure image is not available, so the exact rectangles are chosen here
on the paper's 8 x 8 canvas to show each feature once. The stride counts from the start of
the region (rows from 2, columns from 0), as in docs/semantics.md.
"""

from sas import Causal, Diag, Dynamic, Rect, ops  # noqa: F401

# A plain region: rows 2..7, columns 0..5.
rect = Rect(rows=(2, 8), cols=(0, 6))

# The same region, every 2nd row and column from the region start: rows 2,4,6 x cols 0,2,4.
strided = Rect(rows=(2, 8), cols=(0, 6), stride=2)

# Stride offset 1 shifts the first kept row/column by one: rows 3,5,7 x cols 1,3,5.
strided_offset = Rect(rows=(2, 8), cols=(0, 6), stride=2, offset=1)

# Per-axis stride and offset (pairs are (rows, cols)): every 3rd column from column 1, all rows.
column_stride = Rect(rows=(0, 8), cols=(0, 8), stride=(1, 3), offset=(0, 1))

# The box at the origin: Rect(size=(h, w)) == Rect(rows=(0, h), cols=(0, w)).
origin_box = Rect(size=(4, 4))

pattern = strided_offset
