# Strided block-local attention (LongNet-style dilation inside local blocks).
# Source: paper Table 1, "Strided Block-Local: block size 256, stride 4".
# Reference mask: (q >= k) & (q // 256 == k // 256) & (q % 4 == 0) & (k % 4 == 0).
# Mirrors examples/strided_block_local.py.

block_local = Rect(size=(256, 256)) >> Diag(0, 1)   # block diagonal
every_4th   = Rect(stride=4)                         # rows and columns that are multiples of 4

pattern = block_local * every_4th * Causal()
