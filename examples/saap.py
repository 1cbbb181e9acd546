"""Saap: asymmetric partitions (Mazare et al. 2025), the pattern `sas train` fits state for.

A decode query attends a sink key and a window of recent keys exactly, and over the rest of the
causal triangle the keys of the `probes` buckets that its learned classifier ranks highest (the
buckets: k-means of the pre-RoPE keys). The paper: 1 sink, 2047 recent keys, 1024 clusters and
32 probes at 100K+ contexts. `sas train` fits 64 clusters by default (SmolLM2 contexts of a few
thousand tokens), so this script probes 4 of them, about the paper's share.

    sas train examples/saap.py --model default -o saap.safetensors
"""

from sas import Causal, Diag, Dynamic, Rect, ops  # noqa: F401  (the standard pattern-script import)

SINK = 1
WINDOW = 2047
PROBES = 4

dense = (Rect(cols=(0, SINK)) + Diag(0, WINDOW)) * Causal()
pattern = dense + (Causal() * ~dense) * Dynamic(
    budget=1, refresh=True,
    score=ops.partition(centroids="cent", classifier="qclf", probes=PROBES).sum(dim=1))
