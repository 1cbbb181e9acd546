"""Models for the tests of sas.models / sas.evaluation / `sas eval`.

`smollm2()` loads the real SmolLM2-135M-Instruct (float32, CPU) once per test process (~30-80 s
on the shared CI machine), whatever test file asks first; tests must not modify it (the
harness patches deep copies). `tiny_llama()` is a seeded random 2-layer Llama with
SmolLM2's vocabulary, for plumbing tests that need no real weights.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from sas.models import load_model


@lru_cache(maxsize=1)
def smollm2() -> tuple[Any, Any]:
    torch.manual_seed(0)
    return load_model("default", dtype=torch.float32, device="cpu")


@lru_cache(maxsize=1)
def tiny_llama() -> Any:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                         tie_word_embeddings=True)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.pad_token_id = 0
    return model
