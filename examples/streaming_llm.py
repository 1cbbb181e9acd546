"""StreamingLLM: attention sinks plus a local window.

Source: paper Table 1, "Streaming-LLM [35]: sink size 32, local window size 1024".
Reference mask (reference-figures.md): (q >= k) & ((q - k < 1024) | (k < 32)).
"""

from sas import Causal, Diag, Dynamic, Rect, ops  # noqa: F401  (the standard pattern-script import)

SINK = 32
WINDOW = 1024

window = Diag(0, WINDOW)            # 0 <= i - j < 1024: the most recent 1024 keys
sink = Rect(cols=(0, SINK))         # every query sees keys 0..31

pattern = (window + sink) * Causal()
