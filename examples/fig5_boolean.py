"""Composing basic components with boolean operators: OR (+), AND (*), NOT (~, the paper's !).

Source: paper Figure 5 ("Examples of composing SAS's basic components with boolean logic
operators ... these boolean operations work in the same way as if we are directly using
them on the boolean attention masks").

Reconstructed: the figure image is not available; the operands are chosen here on the
paper's 8 x 8 canvas.
"""

from sas import Causal, Diag, Dynamic, Rect, ops  # noqa: F401

causal = Causal()
window = Diag(0, 3)                 # 0 <= i - j < 3
sink = Rect(cols=(0, 2))            # key columns 0 and 1, every row
lower_half = Rect(rows=(4, 8))      # query rows 4..7

# OR: the union of two masks (a StreamingLLM-like window + sink).
union = (window + sink) * causal

# AND: the intersection, here the causal triangle cut to the lower rows.
intersection = causal * lower_half

# NOT: the complement over the whole plane, intersected with causal -> causal minus the window.
complement = causal * ~window

pattern = union
