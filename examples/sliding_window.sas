# Sliding-window attention.
# Source: paper Table 1, "Sliding Window: local window of size 1024".
# Reference mask: (q >= k) & (q - k < 1024).
# A Diag with offset 0 is causal by itself (i - j >= 0), so no Causal() is needed.
# Mirrors examples/sliding_window.py.

pattern = Diag(offset=0, size=1K)  # 0 <= i - j < 1024
