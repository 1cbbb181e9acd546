"""Diagonal components: sliding window and causal masking.

Source: paper Figure 3b ("several examples of using the Diagonal component to describe
sliding window or causal masking").

Reconstructed: the figure image is not available; the window sizes and offsets are chosen
here on the paper's 8 x 8 canvas. `shifted` is the band shape Figure 7a uses for its H2O
region, `dilated` is the strided diagonal of OpenAI-strided (Table 1).
"""

from sas import Causal, Diag, Dynamic, Rect, ops  # noqa: F401

# Sliding window of 3: each query sees itself and the two previous keys (0 <= i - j < 3).
sliding_window = Diag(offset=0, size=3)

# Causal masking: the whole lower triangle (i - j >= 0); Causal() is exactly this Diag.
causal = Diag(offset=0, size=None)
causal_builtin = Causal()

# A band that starts 2 below the main diagonal: 2 <= i - j < 5.
shifted = Diag(offset=2, size=3)

# A dilated (strided) diagonal: every 2nd diagonal of the lower triangle.
dilated = Diag(offset=0, size=None, stride=2)

pattern = sliding_window
