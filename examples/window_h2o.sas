# Sliding window + H2O (the pattern of paper Figure 1b), the listing of paper Figure 7a.
# Both Diags have offset >= 0, so the pattern is already causal.
# Mirrors examples/fig7a_window_h2o.py.

# Sliding window pattern
p0 = Diag(offset=0, size=2)
# Area covered by the dynamic component
p1 = Diag(offset=2, size=6)

# Add the dynamic component and compose. `*` binds tighter than `+`, as in Python:
# this is p0 + (p1 * Dynamic(...)).
pattern = p0 + p1 * Dynamic(budget=2, score=attn_score().sum(dim=1), refresh=false)
