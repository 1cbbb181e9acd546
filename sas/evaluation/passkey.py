"""Passkey retrieval: a 5-digit number hidden in filler text, and the model asked for it.

Protocol (after Mohtashami & Jaggi, "Landmark Attention", 2023):

    <intro> <filler x k> <key sentence> <filler x (n - k)> <question>

- intro: "There is an important info hidden inside a lot of irrelevant text. Find it and
  memorize it. I will quiz you about the important information there."
- filler unit: " The grass is green. The sky is blue. The sun is yellow. Here we go. There and
  back again.", repeated n times, n as large as fits the context;
- key sentence: " The pass key is 12345. Remember it. 12345 is the pass key." after k = round(d * n)
  filler units, d the depth (0: right after the intro, 1: right before the question);
- question: "\\n\\nWhat is the pass key? Answer with the 5-digit number only.", sent as the
  user turn of the tokenizer's chat template, and the assistant's answer started with
  "The pass key is". Tokenizers without a chat template get the plain text followed by
  "\\n\\nWhat is the pass key? The pass key is".

The key is a seeded random 5-digit number (`random.Random(f"{seed}:{context}:{depth}:{trial}")`).
Greedy generation of `max_new_tokens` tokens; the key counts as retrieved when the first
number in the generated text is the key.

Why the chat form: on SmolLM2-135M-Instruct at ~512 tokens (dense attention, float32) the
plain-text form missed the key when it sits right before the question (depth 1.0: the model
continued with "a key that is used to unlock the"), and a chat turn without the started answer
retrieved none (it spelled out "The pass key is 721" and ran out of tokens or made one up);
the chat turn with "Answer with the 5-digit number only." and the started answer retrieved
every key at depths 0, 0.5 and 1.0 in that check.

The prompt is built from separately tokenized pieces, so every prompt of one context has
the same token count whatever the depth, and a batch of depths needs no padding.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from sas.models import ModelError

INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
         "I will quiz you about the important information there.")
FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
KEY_SENTENCE = " The pass key is {key}. Remember it. {key} is the pass key."
CHAT_QUESTION = "\n\nWhat is the pass key? Answer with the 5-digit number only."
ANSWER_START = "The pass key is"
PLAIN_QUESTION = "\n\nWhat is the pass key? The pass key is"
DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
DEFAULT_NEW_TOKENS = 8
_PLACEHOLDER = "\x00SAS_PASSKEY_BODY\x00"


@dataclass(frozen=True)
class PasskeyPrompt:
    """One passkey prompt as token ids, with where its pieces lie."""

    input_ids: tuple[int, ...] = field(repr=False)
    key: str
    depth: float                 # the depth asked for
    units_before: int            # filler units before the key sentence (k)
    units: int                   # filler units in all (n)
    filler_start: int            # token index of the first filler unit
    key_start: int               # token index of the key sentence
    key_end: int                 # token index after the key sentence
    filler_end: int              # token index after the last filler unit

    @property
    def placed_depth(self) -> float:
        """Where the key sentence sits: filler tokens before it / all filler tokens."""
        filler = (self.filler_end - self.filler_start) - (self.key_end - self.key_start)
        return (self.key_start - self.filler_start) / filler if filler else 0.0

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass(frozen=True)
class PasskeyResult:
    context: int                 # the context asked for
    tokens: int                  # the prompt's length in tokens
    depth: float
    trial: int
    key: str
    answer: str                  # the generated text
    retrieved: bool

    def report(self) -> dict[str, Any]:
        return {"context": self.context, "tokens": self.tokens, "depth": self.depth, "trial": self.trial,
                "key": self.key, "answer": self.answer, "retrieved": self.retrieved}


def passkey_key(seed: int, context: int, depth: float, trial: int) -> str:
    """The seeded 5-digit key of one prompt."""
    return str(random.Random(f"{seed}:{context}:{depth}:{trial}").randint(10000, 99999))


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _frame(tokenizer: Any) -> tuple[list[int], list[int]]:
    """Token ids before the intro and after the filler: the chat turn around the body, or
    the tokenizer's BOS (if it adds one) and the plain question."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": _PLACEHOLDER}], tokenize=False,
                                             add_generation_prompt=True)
        before, after = text.split(_PLACEHOLDER)
        return _ids(tokenizer, before), _ids(tokenizer, CHAT_QUESTION + after + ANSWER_START)
    bos = getattr(tokenizer, "bos_token_id", None)
    with_special = tokenizer("a")["input_ids"]
    lead = [bos] if bos is not None and with_special and with_special[0] == bos else []
    return lead, _ids(tokenizer, PLAIN_QUESTION)


def check_depth(depth: float) -> float:
    if isinstance(depth, bool) or not isinstance(depth, (int, float)) or not 0.0 <= depth <= 1.0:
        raise ModelError(f"passkey depth must be a number in [0, 1] (0: right after the intro, 1: right before "
                         f"the question), got {depth!r}")
    return float(depth)


def passkey_prompt(tokenizer: Any, context: int, depth: float, key: str) -> PasskeyPrompt:
    """The prompt of at most `context` tokens (as many filler units as fit) hiding `key` at `depth`."""
    depth = check_depth(depth)
    if not re.fullmatch(r"\d{5}", key):
        raise ModelError(f"passkey key must be a 5-digit number, got {key!r}")
    head, tail = _frame(tokenizer)
    intro, unit, key_ids = _ids(tokenizer, INTRO), _ids(tokenizer, FILLER), _ids(tokenizer, KEY_SENTENCE.format(key=key))
    fixed = len(head) + len(intro) + len(key_ids) + len(tail)
    n = (context - fixed) // len(unit)
    if n < 1:
        raise ModelError(f"context {context} is too short for a passkey prompt: it needs at least "
                         f"{fixed + len(unit)} tokens with this tokenizer")
    k = round(depth * n)
    ids = head + intro + unit * k + key_ids + unit * (n - k) + tail
    filler_start = len(head) + len(intro)
    key_start = filler_start + k * len(unit)
    return PasskeyPrompt(tuple(ids), key, depth, k, n, filler_start, key_start, key_start + len(key_ids),
                         key_start + len(key_ids) + (n - k) * len(unit))


def retrieved(answer: str, key: str) -> bool:
    """Is the first number in `answer` the key?"""
    m = re.search(r"\d+", answer)
    return m is not None and m.group(0) == key


def _pad_id(tokenizer: Any) -> int:
    for v in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if v is not None:
            return int(v)
    return 0


def passkey_jobs(tokenizer: Any, context: int, depths: Sequence[float], *, trials: int, seed: int,
                 max_new_tokens: int, batch_size: int) -> tuple[list[tuple[float, int, str]], list[PasskeyPrompt]]:
    """The (depth, trial, key) jobs of `run_passkey` and their prompts, every argument checked:
    the tokenizer alone tells, before any forward, whether the context holds each real prompt."""
    depths = [check_depth(d) for d in depths]
    for name, v in (("trials", trials), ("max_new_tokens", max_new_tokens), ("batch_size", batch_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ModelError(f"{name} must be a positive integer, got {v!r}")
    jobs = [(d, t, passkey_key(seed, context, d, t)) for d in depths for t in range(trials)]
    return jobs, [passkey_prompt(tokenizer, context, d, key) for d, _, key in jobs]


@torch.no_grad()
def run_passkey(model: Any, tokenizer: Any, context: int, depths: Sequence[float] = DEFAULT_DEPTHS, *,
                trials: int = 1, seed: int = 0, max_new_tokens: int = DEFAULT_NEW_TOKENS,
                batch_size: int = 8) -> list[PasskeyResult]:
    """Greedy passkey retrieval at each depth (x `trials` keys), `batch_size` prompts per
    `generate` call (prompts of one context have one length: no padding)."""
    jobs, prompts = passkey_jobs(tokenizer, context, depths, trials=trials, seed=seed,
                                 max_new_tokens=max_new_tokens, batch_size=batch_size)
    device = next(model.parameters()).device
    results: list[PasskeyResult] = []
    for start in range(0, len(jobs), batch_size):
        chunk = prompts[start:start + batch_size]
        if len({len(p) for p in chunk}) != 1:   # a tokenizer that splits some keys differently
            groups = [[p] for p in chunk]
        else:
            groups = [chunk]
        answers: list[str] = []
        for g in groups:
            ids = torch.tensor([p.input_ids for p in g], dtype=torch.long, device=device)
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False, num_beams=1, pad_token_id=_pad_id(tokenizer))
            answers += tokenizer.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)
        for (d, t, key), p, a in zip(jobs[start:start + batch_size], chunk, answers):
            results.append(PasskeyResult(context, len(p), d, t, key, a, retrieved(a, key)))
    return results


def accuracy(results: Sequence[PasskeyResult]) -> float:
    return sum(r.retrieved for r in results) / len(results) if results else float("nan")


__all__ = ["ANSWER_START", "DEFAULT_DEPTHS", "DEFAULT_NEW_TOKENS", "FILLER", "INTRO", "KEY_SENTENCE",
           "PasskeyPrompt", "PasskeyResult", "accuracy", "check_depth", "passkey_jobs", "passkey_key", "passkey_prompt",
           "retrieved", "run_passkey"]
