"""Models for the tests of sas.models / sas.evaluation / `sas eval`.

`smollm2()` loads the real SmolLM2-135M-Instruct (float32, CPU) once per test process (~30-80 s
on the shared CI machine), whatever test file asks first; tests must not modify it (the
harness patches deep copies). `tiny_llama()` is a seeded random 2-layer Llama with
SmolLM2's vocabulary, for plumbing tests that need no real weights. `tiny_checkpoint(dir, ...)`
saves a seeded random Llama with a word-level tokenizer (`w0 w1 ...`) as a transformers folder,
for tests that load from disk (`load_model`, `sas generate`, torchrun ranks).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

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


TINY_VOCAB = 256


def tiny_checkpoint(directory: Path, heads: int = 8, kv_heads: int = 4, head_dim: int = 16) -> Path:
    """Save a seeded random 2-layer Llama (`heads` / `kv_heads`) and a word-level tokenizer
    over the words w0..w255 (w0 unknown, w1 end of text) to `directory`."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=TINY_VOCAB, hidden_size=heads * head_dim, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         head_dim=head_dim, max_position_embeddings=512, bos_token_id=2, eos_token_id=1,
                         pad_token_id=0)
    LlamaForCausalLM(config).save_pretrained(directory)
    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(TINY_VOCAB)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="w0", eos_token="w1", pad_token="w0").save_pretrained(
        directory)
    return directory
