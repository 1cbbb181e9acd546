"""Quality of sas patterns on real models: perplexity, passkey retrieval, KV-cache bytes.

Modules: `text` (the offline English text), `perplexity`, `passkey`, `cache_bytes`,
`coverage` (queries without keys), `report` (patterns x contexts, what `sas eval` prints),
`plot` (`sas eval --plot`). Every function takes any transformers causal LM; a sas pattern
is applied with `sas.integrations.transformers.sas_attention`.
"""
