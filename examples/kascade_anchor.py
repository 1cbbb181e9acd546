"""Kascade: the anchor layer's pattern, the one `sas calibrate` takes (docs/kascade.md).

An anchor layer keeps the top 10% of the causal keys (at least 128) by its attention scores,
summed over each KV head's query heads, and publishes that set under the name "kascade"; the
layers between anchors reuse it (`ops.reuse("kascade")`) instead of scoring.

    sas calibrate examples/kascade_anchor.py --model default -o kascade.safetensors
"""

from sas import Causal, Dynamic, ops

pattern = Causal() * Dynamic(budget=ops.fraction(0.1, min=128), refresh=True, publish="kascade",
                             score=ops.attn_score().sum(dim=1))
