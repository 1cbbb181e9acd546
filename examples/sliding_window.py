"""Sliding-window attention.

Source: paper Table 1, "Sliding Window [19]: local window of size 1024".
Reference mask (reference-figures.md): (q >= k) & (q - k < 1024).
A Diag with offset 0 is causal by itself (i - j >= 0), so no Causal() is needed.
"""

from sas import Causal, Diag, Dynamic, Rect, ops  # noqa: F401

WINDOW = 1024

window = Diag(0, WINDOW)            # 0 <= i - j < 1024

pattern = window
