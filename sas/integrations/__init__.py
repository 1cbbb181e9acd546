"""Integrations of sas into model libraries.

- `sas.integrations.transformers`: `sas_attention(model, pattern)` runs a Hugging Face
  transformers decoder (Llama, Mistral, Qwen2, Qwen3 families) through sas patterns, with the
  compact KV cache `SASCache` (docs/integration.md).

Nothing is imported here, so that `import sas.integrations` does not pull in transformers.
"""
