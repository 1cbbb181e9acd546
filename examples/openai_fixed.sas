# OpenAI fixed sparse attention (Child et al., Sparse Transformer).
# Source: paper Table 1, "OpenAI Fixed: block size 256, stride 256", with the last 32
# columns of every 256-block as summary columns.
# Reference mask: (q >= k) & ((q // 256 == k // 256) | (k % 256 >= 224)).
# Mirrors examples/openai_fixed.py.

block     = Rect(size=(256, 256))
own_block = block >> Diag(0, 1)                     # block diagonal: i // 256 == j // 256

# A 256 x 256 unit with its last 32 columns on, repeated over every block: j % 256 >= 224.
summary_unit    = block * Rect(cols=(224, None))
summary_columns = summary_unit >> Rect()

pattern = (own_block + summary_columns) * Causal()
