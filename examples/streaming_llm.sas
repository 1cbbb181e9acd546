# StreamingLLM: attention sinks plus a local window.
# Source: paper Table 1, "Streaming-LLM: sink size 32, local window size 1024".
# Reference mask: (q >= k) & ((q - k < 1024) | (k < 32)).
# Mirrors examples/streaming_llm.py.

window  = Diag(0, 1K)              # 0 <= i - j < 1024: the most recent 1024 keys
sink    = Rect(cols=(0, 32))       # every query sees keys 0..31

pattern = (window + sink) * Causal()
