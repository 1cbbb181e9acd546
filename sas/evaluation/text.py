"""The English prose that perplexity is measured on, available offline.

Source: the Python documentation text that CPython ships in the standard library module
`pydoc_data.topics` (the topics of `help()`: the language reference chapters on statements,
expressions, the data model, ...; about 465,000 characters in Python 3.11). The topics are
concatenated in sorted key order, separated by a blank line, so the text is the same on
every run of the same Python version. Its content changes between Python versions:
`corpus_info()` records the version and a SHA-256 of the text, and every report carries it.
"""

from __future__ import annotations

import hashlib
import platform
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from pydoc_data.topics import topics

from sas.models import ModelError

SOURCE = "pydoc_data.topics (the Python documentation topics shipped with CPython)"
SEPARATOR = "\n\n"
_MARGIN = 8


@lru_cache(maxsize=1)
def corpus_text() -> str:
    """All topics of `pydoc_data.topics`, in sorted key order, separated by a blank line."""
    return SEPARATOR.join(topics[k].strip() for k in sorted(topics))


@dataclass(frozen=True)
class CorpusInfo:
    source: str
    python_version: str
    topics: int
    characters: int
    sha256: str

    def report(self) -> dict[str, Any]:
        return {"source": self.source, "python_version": self.python_version, "topics": self.topics,
                "characters": self.characters, "sha256": self.sha256}


def corpus_info() -> CorpusInfo:
    """Where the text comes from, and a fingerprint that changes when its content does."""
    text = corpus_text()
    return CorpusInfo(SOURCE, platform.python_version(), len(topics), len(text),
                      hashlib.sha256(text.encode("utf-8")).hexdigest())


def corpus_tokens(tokenizer: Any, n: int) -> list[int]:
    """The first `n` token ids of the text (no special tokens); `ModelError` when it is shorter."""
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise ModelError(f"the number of tokens must be a positive integer, got {n!r}")
    text = corpus_text()
    # Tokenizing the whole text costs seconds; tokenize a prefix that ends before a space (so
    # its last word is whole and tokenizes as in the full text), with a margin of tokens.
    end = min(len(text), 8 * n + 64)
    while True:
        cut = text.rfind(" ", 0, end) if end < len(text) else end
        ids = tokenizer(text[:cut], add_special_tokens=False)["input_ids"]
        if len(ids) >= n + _MARGIN or end == len(text):
            break
        end = min(len(text), 2 * end)
    if len(ids) < n:
        raise ModelError(f"{n} tokens asked for, more than the {len(ids)} tokens of the text ({SOURCE})")
    return list(ids[:n])


__all__ = ["SOURCE", "CorpusInfo", "corpus_info", "corpus_text", "corpus_tokens"]
