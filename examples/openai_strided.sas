# OpenAI strided sparse attention (Child et al., Sparse Transformer).
# Source: paper Table 1, "OpenAI Strided: local window size 512, stride 512".
# Reference mask: (q >= k) & ((q - k < 512) | ((q - k) % 512 == 0)).
# Mirrors examples/openai_strided.py.

local   = Diag(0, 512)                      # the previous 512 keys
strided = Diag(0, None, stride=512)         # every 512th key behind the query: (i - j) % 512 == 0

pattern = (local + strided) * Causal()
