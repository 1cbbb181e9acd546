"""sas.evaluation: KV-cache bytes, queries without keys, the report over patterns x contexts
and its plot. The sas integration is replaced here by a stand-in `apply` that returns the model
unpatched (the plumbing is under test, not the attention); the runs through `sas_attention`
are in test_eval_patterns.py."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sas import Causal, Diag, Dynamic, Rect, analyze, load_pattern, ops
from sas.dynamic.cache_plan import dynamic_cache_plan
from sas.errors import SASError
from sas.evaluation.cache_bytes import cache_slots, kv_cache_bytes, layer_patterns
from sas.evaluation.coverage import empty_rows
from sas.evaluation.perplexity import perplexity
from sas.evaluation.plot import write_eval_plot
from sas.evaluation.report import EvalPattern, evaluate_patterns, fmt_bytes
from sas.models import ModelError, ModelShape

from analysis_checks import brute_cache_size
from model_fixtures import smollm2, tiny_llama
from strategies import causal_patterns

SMOL = ModelShape(30, 9, 3, 64, 8192)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
WINDOW_H2O = Diag(0, 16) + Diag(16, None) * Dynamic(budget=8, score=ops.attn_score().sum(dim=1), refresh=False)


def test_kv_bytes_of_the_table1_window_on_smollm2():
    window = load_pattern("examples/sliding_window.py")
    b = kv_cache_bytes(window, 2048, SMOL, torch.float32)
    per_slot = 30 * 3 * 64 * 2 * 4
    assert (b.compact, b.dense) == (1024 * per_slot, 2048 * per_slot) and b.ratio == 2.0
    assert kv_cache_bytes(window, 2048, SMOL, torch.bfloat16, batch=4).compact == 1024 * per_slot // 2 * 4
    assert kv_cache_bytes(None, 512, SMOL, torch.float32).compact == 512 * per_slot


@settings(max_examples=10, deadline=None)
@given(causal_patterns(max_depth=2), st.integers(16, 64))
def test_cache_slots_match_the_brute_force_live_count(pattern, n):
    assume(not pattern.dynamics())   # a Dynamic's cache is its budget, not the live count of its region
    mask = pattern.to_mask(n)
    assume(mask.any())               # the analyzer refuses a pattern that attends no key
    assert cache_slots(pattern, n) == brute_cache_size(mask)


def test_dynamic_pattern_bytes_are_the_runtime_layout():
    n = 256
    plan = dynamic_cache_plan(WINDOW_H2O, n)
    assert cache_slots(WINDOW_H2O, n) == plan.cache_size == plan.static_size + plan.pool_size
    assert plan.static_size == 16 and plan.pool_size >= 8
    shape = ModelShape(2, 4, 2, 16, 2048)
    assert kv_cache_bytes(WINDOW_H2O, n, shape, torch.float32).compact == plan.cache_size * 2 * 2 * 16 * 2 * 4


def test_per_layer_patterns():
    window = Diag(0, 64)
    shape = ModelShape(4, 4, 2, 16, 2048)
    per_slot = 2 * 16 * 2 * 4
    b = kv_cache_bytes({0: window, 2: window}, 256, shape, torch.float32)
    assert b.compact == (64 + 256 + 64 + 256) * per_slot and b.dense == 4 * 256 * per_slot
    assert layer_patterns({1: window}, 3) == [None, window, None]
    with pytest.raises(ModelError, match="layer index 4 is out of range"):
        kv_cache_bytes({4: window}, 256, shape, torch.float32)


def test_empty_rows_of_strided_block_local():
    p = load_pattern("examples/strided_block_local.py")
    e = empty_rows(p, 1024)
    mask = p.to_mask(1024)
    assert e.count == int((~mask.any(axis=1)).sum()) == 768 and e.first == 1
    assert "768 of 1024 queries (75.0%) attend no key" in e.warning("sbl")
    assert empty_rows(Causal(), 64).count == 0 and empty_rows(Causal(), 64).warning("c") is None
    assert empty_rows(Diag(1, None), 8).first == 0


def _unpatched(calls):
    def apply(model, pattern, *, backend, max_len):
        calls.append((pattern, backend, max_len))
        return model
    return apply


def test_report_plumbing_with_an_unpatched_stand_in(tmp_path):
    model = tiny_llama()
    _, tok = smollm2()
    calls = []
    window = Diag(0, 64)
    sbl = Rect(size=(16, 16)) >> Diag(0, 1)
    sbl = sbl * Rect(stride=4) * Causal()
    pats = [EvalPattern("dense"), EvalPattern("window", window), EvalPattern("sbl", sbl)]
    rep = evaluate_patterns(model, tok, pats, [192, 256], tokens=512, depths=(0.0, 1.0), progress=False,
                            apply=_unpatched(calls), model_name="tiny")
    assert calls == [(window, "auto", 256 + 8), (sbl, "auto", 256 + 8)]
    assert [(r.pattern, r.context) for r in rep.rows] == [(n, c) for n in ("dense", "window", "sbl") for c in (192, 256)]
    for r in rep.rows:
        ref = perplexity(model, tok, r.context, tokens=512)
        assert math.isclose(r.ppl, ref.perplexity, rel_tol=1e-6) and math.isclose(r.ppl_ratio, 1.0, rel_tol=1e-6)
        assert r.perplexity.windows == 512 // r.context and len(r.passkey) == 2
        shape = ModelShape.of(model.config)
        expect = kv_cache_bytes(None if r.pattern == "dense" else dict(window=window, sbl=sbl)[r.pattern], r.context,
                                shape, torch.float32)
        assert r.cache == expect
    assert rep.rows[2].cache.compact == 64 * 2 * 2 * 16 * 2 * 4          # window 64 < 192
    assert any("sbl:" in w and "attend no key" in w for w in rep.warnings)
    assert not any(w.startswith("window") for w in rep.warnings)
    table = rep.table()
    assert table.splitlines()[0].startswith("| pattern | context | perplexity | vs dense | KV cache |")
    assert f"| window | 192 | " in table and "| 1.00x |" in table and fmt_bytes(rep.rows[2].cache.compact) in table
    data = json.loads(rep.to_json())
    assert data["model"] == "tiny" and len(data["rows"]) == 6 and data["corpus"]["source"].startswith("pydoc_data")
    assert data["rows"][4]["queries_without_keys"] == 192 * 3 // 4 and data["settings"]["max_len"] == 264
    out = write_eval_plot(rep, tmp_path / "sub" / "eval.png")
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_a_pattern_the_integration_refuses_gets_an_error_row():
    model = tiny_llama()
    _, tok = smollm2()

    def refuse(model, pattern, *, backend, max_len):
        raise SASError("this model family is not supported")

    rep = evaluate_patterns(model, tok, [EvalPattern("w", Diag(0, 8))], [64], depths=(), progress=False, apply=refuse)
    (row,) = rep.rows
    assert row.error == "this model family is not supported" and math.isnan(row.ppl) and row.passkey == ()
    assert math.isfinite(row.dense_perplexity) and rep.warnings == ("w: this model family is not supported",)
    assert "| w | 64 | error |" in rep.table()


@pytest.mark.parametrize("kwargs, match", [
    ({"contexts": [0]}, "at least 2 tokens"),
    ({"contexts": [128], "tokens": 64}, "at least the context"),
    ({"contexts": [128], "depths": (2.0,)}, "depth"),
    ({"contexts": [128], "backend": "nki"}, "backend must be one of"),
    ({"contexts": [128], "patterns": []}, "at least one pattern"),
    ({"contexts": [128], "patterns": [EvalPattern("a"), EvalPattern("a", Diag(0, 4))]}, "given twice"),
    ({"contexts": [128], "patterns": [EvalPattern("x", {5: Diag(0, 4)})]}, "out of range"),
    ({"contexts": [128], "patterns": [EvalPattern("nc", Diag(-4, 8))]}, "not causal"),
    # found by a new-user exploration: once refused only after the dense perplexity had run
    ({"contexts": [16, 128], "patterns": [EvalPattern("dense"), EvalPattern("w", Diag(0, 4))]},
     "too short for a passkey prompt"),
    ({"contexts": [128], "trials": 0}, "trials must be a positive integer"),
    ({"contexts": [128], "passkey_batch": 0}, "batch_size must be a positive integer"),
])
def test_report_bad_arguments_fail_before_any_forward(kwargs, match):
    model = tiny_llama()
    _, tok = smollm2()
    calls = []
    patterns = kwargs.pop("patterns", [EvalPattern("dense")])
    contexts = kwargs.pop("contexts")
    forwards = []
    handle = model.register_forward_hook(lambda *a: forwards.append(1))
    try:
        with pytest.raises(SASError, match=match):
            evaluate_patterns(model, tok, patterns, contexts, progress=False, apply=_unpatched(calls), **kwargs)
    finally:
        handle.remove()
    assert forwards == [] and calls == []
