"""The evaluation text (pydoc_data.topics) and its tokens."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from pydoc_data.topics import topics

from sas.evaluation.text import SOURCE, corpus_info, corpus_text, corpus_tokens
from sas.models import ModelError

from model_fixtures import smollm2


def test_text_is_the_sorted_topics_and_deterministic():
    text = corpus_text()
    assert text == "\n\n".join(topics[k].strip() for k in sorted(topics))
    assert text.startswith(topics[sorted(topics)[0]].strip()[:200])
    info = corpus_info()
    assert info.sha256 == corpus_info().sha256 and info.characters == len(text) > 300_000
    assert info.topics == len(topics) and "pydoc_data.topics" in SOURCE == info.source


def test_text_is_english_prose():
    text = corpus_text()
    words = re.findall(r"[a-z]+", text.lower())
    common = Counter(words).most_common(8)
    assert common[0][0] == "the", common
    assert {"the", "a", "is", "of", "to"} <= {w for w, _ in Counter(words).most_common(12)}
    assert sum(c.isascii() for c in text) / len(text) > 0.99
    # sentences of lower-case words (lines wrap inside them), not code or grammar rules
    sentences = re.findall(r"[A-Z][a-z]+\s+[a-z]+\s+[a-z\s,]+\.", text)
    assert len(sentences) > 500


def test_tokens_are_a_prefix_of_the_whole_text_tokens():
    _, tok = smollm2()
    head = corpus_text()[:40_000]
    whole = tok(head[: head.rfind(" ")], add_special_tokens=False)["input_ids"]
    for n in (1, 100, 257, 2048):
        ids = corpus_tokens(tok, n)
        assert len(ids) == n and ids == whole[:n]
    assert corpus_tokens(tok, 300) == corpus_tokens(tok, 600)[:300]


@pytest.mark.parametrize("n", [0, -3, 2.5, True])
def test_tokens_bad_count(n):
    _, tok = smollm2()
    with pytest.raises(ModelError, match="positive integer"):
        corpus_tokens(tok, n)


def test_tokens_more_than_the_text():
    _, tok = smollm2()
    with pytest.raises(ModelError, match="more than the .* tokens of the text"):
        corpus_tokens(tok, 10_000_000)
