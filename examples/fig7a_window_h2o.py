"""Sliding window + H2O (the pattern of paper Figure 1b).

Source: paper Figure 7a, code listing reproduced line for line. Both Diags have offset >= 0,
so the pattern is already causal (the caption's "causal masking omitted" changes nothing).
"""

from sas import Causal, Diag, Dynamic, Rect, ops  # noqa: F401

# Sliding window pattern
p0 = Diag(offset=0, size=2)
# Area covered by dynamic component
p1 = Diag(offset=2, size=6)
# Add dynamic component
p2 = p1 * Dynamic(budget=2, score=ops.attn_score().sum(dim=1), refresh=False)
# Compose
window_w_h2o_pattern = p0 + p2

static_part = p0                    # the static part analyzed in Figures 9-12

pattern = window_w_h2o_pattern
