"""Dynamic components: score op chains traced to torch.fx, fusion analysis, the H2O policy.

- `trace_score(chain) -> ScoreGraph`: the chain as a torch.fx graph (docs/dynamic.md, "Shapes").
- `analyze_fusion(score_graph) -> FusionPlan`: kernels, fused elementwise chains, and whether the
  attention kernel's softmax statistics can be memoized; `.summary()` for `sas inspect`.
- `plan_dynamic(pattern) -> DynamicPlan`: static part, dynamic region, traced score.
- `H2OState`, `dynamic_attention_reference`: the run-time policy in plain PyTorch (the spec).
"""

from sas.dynamic.fusion import FusionPlan, analyze_fusion
from sas.dynamic.h2o import DynamicResult, H2OState, dynamic_attention_reference, masked_attention
from sas.dynamic.plan import DynamicPlan, plan_dynamic
from sas.dynamic.trace import ScoreGraph, trace_score

__all__ = ["trace_score", "ScoreGraph", "analyze_fusion", "FusionPlan", "plan_dynamic", "DynamicPlan",
           "H2OState", "DynamicResult", "dynamic_attention_reference", "masked_attention"]
