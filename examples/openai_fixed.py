"""OpenAI fixed sparse attention (Child et al., Sparse Transformer).

Source: paper Table 1, "OpenAI Fixed [9]: block size 256, stride 256", with the last 32
columns of every 256-block as summary columns (as measured in reference-figures.md).
Reference mask (reference-figures.md): (q >= k) & ((q // 256 == k // 256) | (k % 256 >= 224)).
"""

from sas import Causal, Diag, Dynamic, Rect, ops  # noqa: F401

BLOCK = 256
SUMMARY = 32

block = Rect(size=(BLOCK, BLOCK))
own_block = block >> Diag(0, 1)                                   # block diagonal: i // 256 == j // 256
summary_unit = block * Rect(cols=(BLOCK - SUMMARY, None))         # a 256 x 256 unit, last 32 columns on
summary_columns = summary_unit >> Rect()                          # repeated over every block: j % 256 >= 224

pattern = (own_block + summary_columns) * Causal()
