"""The evaluation harness and `sas eval` / `sas generate` through the sas integration
(`sas.integrations.transformers.sas_attention`, SASCache) on the real SmolLM2, float32, CPU.

These tests need the model-integration branch: until it is merged they fail at import with
ImportError (sas.integrations.transformers). References are independent of sas: the model's
own attention with the pattern's exact mask (`pattern.to_mask(n)`) as a 4-D attention mask.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import sas.models
from sas import Causal, Diag, Dynamic, Rect, ops
from sas.cli.main import cli
from sas.evaluation.cache_bytes import kv_cache_bytes
from sas.evaluation.perplexity import perplexity
from sas.evaluation.report import EvalPattern, evaluate_patterns
from sas.evaluation.text import corpus_tokens
from sas.integrations.transformers import SASCache, output_cache, sas_attention
from sas.models import ModelShape

from helpers.attention import DEV
from model_fixtures import smollm2, tiny_llama

WINDOW = Diag(0, 64)
STRIDED_BLOCK_LOCAL = (Rect(size=(32, 32)) >> Diag(0, 1)) * Rect(stride=4) * Causal()
WINDOW_H2O = Diag(0, 16) + Diag(16, None) * Dynamic(budget=16, score=ops.attn_score().sum(dim=1), refresh=False)


def _masked_nll(model, ids: list[int], mask: np.ndarray, last: int | None = None) -> tuple[float, int]:
    """Summed next-token NLL of the model's own attention under the exact mask (4-D bool),
    over every position, or over the last `last` predicted tokens."""
    x = torch.tensor([ids])
    with torch.no_grad():
        logits = model(input_ids=x, attention_mask=torch.from_numpy(mask)[None, None]).logits[0].double()
    logp = torch.log_softmax(logits[:-1], -1).gather(1, x[0, 1:, None])[:, 0]
    if last is not None:
        logp = logp[-last:]
    return float(-logp.sum()), logp.numel()


def _eval(pattern, context=256, **kw):
    model, tok = smollm2()
    rep = evaluate_patterns(model, tok, [EvalPattern("p", pattern)], [context], progress=False,
                            **{"depths": (), **kw})
    (row,) = rep.rows
    assert row.error is None, row.error
    return rep, row


def test_causal_pattern_is_dense():
    _, row = _eval(Causal())
    assert math.isclose(row.ppl, row.dense_perplexity, rel_tol=1e-4)
    assert row.cache.compact == row.cache.dense


def test_window_perplexity_equals_the_exact_mask_reference():
    model, tok = smollm2()
    _, row = _eval(WINDOW)
    nll, n = _masked_nll(model, corpus_tokens(tok, 256), WINDOW.to_mask(256))
    assert math.isclose(row.perplexity.nll_sum, nll, rel_tol=1e-4) and row.perplexity.scored == n
    assert row.ppl > row.dense_perplexity      # a 64-token window loses context on this text
    assert row.cache.ratio == 4.0              # 64 of 256 slots


def test_window_decode_steps_equal_the_exact_mask_reference():
    """Perplexity of the last 16 tokens through decode steps against the compact SASCache."""
    model, tok = smollm2()
    _, row = _eval(WINDOW, mode="decode", decode_tokens=16)
    nll, n = _masked_nll(model, corpus_tokens(tok, 256), WINDOW.to_mask(256), last=16)
    assert row.perplexity.scored == n == 16
    assert math.isclose(row.perplexity.nll_sum, nll, rel_tol=1e-4)


def test_queries_without_keys_warn_and_stay_finite():
    rep, row = _eval(STRIDED_BLOCK_LOCAL)
    assert math.isfinite(row.ppl)              # rows without keys give zero, not NaN
    assert any("192 of 256 queries (75.0%) attend no key" in w for w in rep.warnings)


def test_window_h2o_prefill_is_its_region_and_decode_evicts():
    """A Dynamic pattern (on the tiny random Llama: the dynamic kernels run in the Triton
    interpreter on the CPU, too slow for 30 layers). Its prefill attends the whole region
    (docs/dynamic.md), so prefill-mode perplexity is dense's; decode steps keep the window +
    budget only, so decode-mode perplexity differs."""
    model = tiny_llama() if DEV == "cpu" else copy.deepcopy(tiny_llama()).to(DEV)   # the kernels run where it is
    _, tok = smollm2()
    pre = evaluate_patterns(model, tok, [EvalPattern("h2o", WINDOW_H2O)], [160], depths=(0.5,), progress=False)
    dec = evaluate_patterns(model, tok, [EvalPattern("h2o", WINDOW_H2O)], [160], depths=(), mode="decode",
                            decode_tokens=8, progress=False)
    (p,), (d,) = pre.rows, dec.rows
    assert p.error is None and d.error is None, (p.error, d.error)
    assert math.isclose(p.ppl, p.dense_perplexity, rel_tol=1e-5) and len(p.passkey) == 1
    assert d.perplexity.scored == 8 and math.isfinite(d.ppl) and not math.isclose(d.ppl, d.dense_perplexity,
                                                                                   rel_tol=1e-4)
    assert p.cache.compact == kv_cache_bytes(WINDOW_H2O, 160, ModelShape.of(model.config), torch.float32).compact
    assert p.cache.compact < p.cache.dense


def test_kv_bytes_equal_the_sas_cache():
    model, tok = smollm2()
    patched = sas_attention(copy.deepcopy(model), WINDOW, backend="auto", max_len=200)
    ids = torch.tensor([corpus_tokens(tok, 150)])
    out = patched.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False,
                           return_dict_in_generate=True, pad_token_id=tok.eos_token_id)
    cache = output_cache(out)
    assert isinstance(cache, SASCache)
    expect = kv_cache_bytes(WINDOW, 200, ModelShape.of(model.config), torch.float32)
    assert cache.kv_cache_bytes() == expect.compact
    assert cache.dense_kv_cache_bytes() > cache.kv_cache_bytes()


@pytest.fixture
def loaded(monkeypatch):
    """`sas generate` / `sas eval` load the shared SmolLM2 instead of parsing the GGUF again; a
    copy, since `sas generate` patches the model it loaded in place."""
    def load(*args, **kwargs):
        model, tok = smollm2()
        return copy.deepcopy(model), tok

    monkeypatch.setattr(sas.models, "load_model", load)


def _script(tmp_path: Path, name: str, body: str) -> Path:
    p = tmp_path / name
    p.write_text("from sas import Causal, Diag, Dynamic, Rect, ops\n" + body + "\n")
    return p


def test_cli_eval_pattern_files(loaded, tmp_path):
    w = _script(tmp_path, "window64.py", "pattern = Diag(0, 64)")
    sbl = _script(tmp_path, "sbl.py", "pattern = (Rect(size=(32, 32)) >> Diag(0, 1)) * Rect(stride=4) * Causal()")
    r = CliRunner().invoke(cli, ["eval", str(w), str(sbl), "dense", "--context", "256", "--passkey-depths", "none",
                                 "--json", "--no-progress"])
    assert r.exit_code == 0, r.output
    rows = {x["pattern"]: x for x in json.loads(r.stdout)["rows"]}
    assert set(rows) == {"window64", "sbl", "dense"}
    assert rows["window64"]["kv_cache_ratio"] == 4.0 and rows["window64"]["perplexity"] > rows["dense"]["perplexity"]
    assert rows["sbl"]["queries_without_keys"] == 192 and "warning: sbl: 192 of 256 queries" in r.stderr


def test_cli_generate_causal_pattern_gives_the_dense_tokens(loaded, tmp_path):
    causal = _script(tmp_path, "causal.py", "pattern = Causal()")
    args = ["What is the capital of France?", "--max-new-tokens", "8"]
    dense = CliRunner().invoke(cli, ["generate", "dense", *args])
    sparse = CliRunner().invoke(cli, ["generate", str(causal), *args])
    assert dense.exit_code == 0 and sparse.exit_code == 0, (dense.output, sparse.output)
    assert sparse.stdout == dense.stdout and dense.stdout.strip()


def test_cli_generate_window_streams_text(loaded, tmp_path):
    w = _script(tmp_path, "w.py", "pattern = Diag(0, 16)")
    r = CliRunner().invoke(cli, ["generate", str(w), "Tell me about the sky.", "--max-new-tokens", "6"])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() and "KV cache at" in r.stderr
