"""Dynamic components with cache budget B and refresh mode R.

Source: paper Figure 3c ("a few examples of using the dynamic component. Users can tweak
the refresh mode (R in the figure) ... the number of tokens loaded is determined by the
cache budget B") and the score operators of section 4.1.

Reconstructed: the figure image is not available; the budgets are chosen here. As a region
a Dynamic covers every cell, so each example is intersected with the causal triangle.
"""

from sas import Causal, Diag, Dynamic, Rect, ops  # noqa: F401

# H2O: accumulated attention score, R = False -> the cache holds exactly B = 2 entries and
# evicted keys are gone.
h2o = Dynamic(budget=2, score=ops.attn_score().sum(dim=1), refresh=False) * Causal()

# R = True: every past key stays in the cache, B = 2 of them are loaded per step.
refreshed = Dynamic(budget=2, score=ops.attn_score().sum(dim=1), refresh=True) * Causal()

# A pooled score (section 4.1: `.pooling()` aggregates local information), R = True.
pooled = Dynamic(budget=4, score=ops.attn_score().sum(dim=1).pooling(kernel_size=3), refresh=True) * Causal()

pattern = h2o
