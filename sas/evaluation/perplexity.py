"""Perplexity of a causal LM over the evaluation text (`sas.evaluation.text`).

The first `tokens` tokens of the text are cut into `tokens // context` windows of `context`
tokens (a shorter tail is dropped and reported). Each window is scored independently,
standard shifted cross-entropy: the logits at position i predict token i + 1.

- mode "prefill": one forward over the whole window (`use_cache=False`), every position
  except the first is scored. For a model patched with `sas_attention` this forward runs the
  pattern's prefill, which is what a sparse pattern changes.
- mode "decode": the window's first `context - decode_tokens` tokens are the prompt; its
  last `decode_tokens` tokens are forced one at a time through `model.generate` (greedy, a
  logits processor that allows only the text's next token), so the first of them is scored
  from the prefill's last logits and the others through decode steps against the model's
  KV cache (the compact `SASCache` for a patched model). The raw logits are scored.

perplexity = exp(total cross-entropy / scored tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import LogitsProcessor, LogitsProcessorList

from sas.evaluation.text import corpus_tokens
from sas.models import ModelError

MODES = ("prefill", "decode")
DEFAULT_DECODE_TOKENS = 32


@dataclass(frozen=True)
class Perplexity:
    """The result of `perplexity`: total negative log-likelihood over the scored tokens."""

    context: int
    mode: str
    windows: int
    scored: int            # tokens scored, all windows together
    nll_sum: float         # summed cross-entropy (nats)
    dropped: int           # tokens of `tokens` that fill no whole window

    @property
    def nll(self) -> float:
        """Mean cross-entropy per scored token (nats)."""
        return self.nll_sum / self.scored

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll) if math.isfinite(self.nll) else math.nan

    def report(self) -> dict[str, Any]:
        return {"context": self.context, "mode": self.mode, "windows": self.windows, "scored": self.scored,
                "nll": self.nll, "perplexity": self.perplexity, "dropped": self.dropped}


class ForceTokens(LogitsProcessor):
    """Greedy decoding that follows a given continuation: at step t only `tokens[t]` stays."""

    def __init__(self, tokens: torch.Tensor, prompt_len: int):
        self.tokens = tokens            # [batch, steps]
        self.prompt_len = prompt_len

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        step = input_ids.shape[1] - self.prompt_len
        target = self.tokens[:, step].to(scores.device)
        forced = torch.full_like(scores, -math.inf)
        forced.scatter_(1, target[:, None], 0.0)
        return forced


def windows_of(ids: list[int], context: int) -> torch.Tensor:
    """`[windows, context]` int64: the whole windows of `ids`, in order."""
    w = len(ids) // context
    return torch.tensor(ids[: w * context], dtype=torch.long).view(w, context)


def check_args(context: int, tokens: int, mode: str, decode_tokens: int) -> None:
    """`ModelError` naming the argument when a perplexity argument is outside its domain."""
    for name, v in (("context", context), ("tokens", tokens), ("decode_tokens", decode_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ModelError(f"{name} must be a positive integer, got {v!r}")
    if context < 2:
        raise ModelError(f"context must be at least 2 tokens (one predicts the next), got {context}")
    if tokens < context:
        raise ModelError(f"tokens ({tokens}) must be at least the context ({context}): the text is scored in "
                         f"whole windows of context tokens")
    if mode not in MODES:
        raise ModelError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "decode" and decode_tokens >= context:
        raise ModelError(f"decode_tokens ({decode_tokens}) must be less than the context ({context}): the window's "
                         f"first context - decode_tokens tokens are the prompt")


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def prefill_nll(model: Any, window: torch.Tensor) -> tuple[float, int]:
    """Summed shifted cross-entropy of one forward over `window` ([batch, n]) and tokens scored."""
    ids = window.to(_device(model))
    logits = model(input_ids=ids, use_cache=False).logits
    ce = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                         reduction="sum")
    return float(ce), ids.shape[0] * (ids.shape[1] - 1)


@torch.no_grad()
def decode_nll(model: Any, window: torch.Tensor, decode_tokens: int) -> tuple[float, int]:
    """Summed cross-entropy of the last `decode_tokens` tokens of `window`, forced through
    `generate` (prefill of the rest, then decode steps), and tokens scored."""
    ids = window.to(_device(model))
    prompt, target = ids[:, :-decode_tokens], ids[:, -decode_tokens:]
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=decode_tokens,
                         min_new_tokens=decode_tokens, do_sample=False, num_beams=1,
                         logits_processor=LogitsProcessorList([ForceTokens(target, prompt.shape[1])]),
                         output_logits=True, return_dict_in_generate=True,
                         pad_token_id=_pad_id(model))
    if out.sequences.shape[1] != ids.shape[1] or not torch.equal(out.sequences[:, prompt.shape[1]:], target):
        raise RuntimeError("generate did not follow the forced tokens")
    logits = torch.stack(list(out.logits), dim=1).float()          # [batch, decode_tokens, vocab]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="sum")
    return float(ce), target.numel()


def _pad_id(model: Any) -> int:
    gc = getattr(model, "generation_config", None)
    for v in (getattr(gc, "pad_token_id", None), getattr(gc, "eos_token_id", None), 0):
        if isinstance(v, list):
            v = v[0] if v else None
        if v is not None:
            return int(v)
    return 0


def perplexity(model: Any, tokenizer: Any, context: int, *, tokens: int | None = None, mode: str = "prefill",
               decode_tokens: int = DEFAULT_DECODE_TOKENS, ids: list[int] | None = None) -> Perplexity:
    """Perplexity of `model` over the first `tokens` tokens of the evaluation text (default:
    `context`, one window), in windows of `context` tokens; see the module docstring.

    `ids` replaces the text's tokens (the first `tokens` of them are used).
    """
    tokens = context if tokens is None else tokens
    check_args(context, tokens, mode, decode_tokens)
    if ids is None:
        ids = corpus_tokens(tokenizer, tokens)
    elif len(ids) < tokens:
        raise ModelError(f"ids holds {len(ids)} tokens, fewer than tokens={tokens}")
    wins = windows_of(list(ids[:tokens]), context)
    total, scored = 0.0, 0
    for w in wins:
        nll, n = prefill_nll(model, w[None]) if mode == "prefill" else decode_nll(model, w[None], decode_tokens)
        total += nll
        scored += n
    return Perplexity(context, mode, wins.shape[0], scored, total, tokens - wins.numel())


__all__ = ["DEFAULT_DECODE_TOKENS", "MODES", "ForceTokens", "Perplexity", "check_args", "decode_nll",
           "perplexity", "prefill_nll", "windows_of"]
