"""`sas train`: Saap state from SmolLM2's own queries and keys (tiny: 96 tokens, 2 layers), the
file it writes loads for its pattern and model only, bad arguments fail before the model loads."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

import sas.models
from sas.cli.main import cli
from sas.lang.loader import load_pattern
from sas.methods.saap_state import SaapStateError, load_state
from sas.methods.saap_train import capture_qk

from model_fixtures import smollm2
from helpers.examples import EXAMPLES

PATTERN = """from sas import Causal, Diag, Dynamic, Rect, ops
dense = (Rect(cols=(0, 1)) + Diag(0, {window})) * Causal()
pattern = dense + (Causal() * ~dense) * Dynamic(
    budget=1, refresh=True, score=ops.partition(centroids="cent", classifier="qclf", probes=2).sum(dim=1))
"""


def write_pattern(tmp_path, window=16, name="saap.py"):
    p = tmp_path / name
    p.write_text(PATTERN.format(window=window))
    return p


@pytest.fixture
def loaded(monkeypatch):
    monkeypatch.setattr(sas.models, "load_model", lambda spec="default", **kw: smollm2())


@pytest.fixture
def no_model(monkeypatch):
    def fail(*a, **k):
        raise AssertionError("the model was loaded before the arguments were checked")
    monkeypatch.setattr(sas.models, "load_model", fail)


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_train_writes_state_for_its_pattern_and_model(tmp_path, loaded):
    pat = write_pattern(tmp_path)
    out = tmp_path / "state.safetensors"
    r = run("train", pat, "--tokens", 96, "--clusters", 8, "--layers", "1,2", "--hidden", 16, "--steps", 20,
            "-o", out)
    assert r.exit_code == 0, r.output
    assert "2 layer(s)" in r.output
    p = load_pattern(pat)
    st = load_state(out, p, "SmolLM2-135M-Instruct")
    assert sorted(st.layers) == [1, 2]
    assert tuple(st.layers[1].centroids.shape) == (3, 8, 64)          # SmolLM2: 3 KV heads, head dim 64
    with pytest.raises(SaapStateError, match="pattern"):
        load_state(out, load_pattern(write_pattern(tmp_path, window=17, name="other.py")), "SmolLM2-135M-Instruct")
    with pytest.raises(SaapStateError, match="model"):
        load_state(out, p, "Llama-3.1-8B")
    # the hooks saw pre-RoPE vectors: post-RoPE keys differ from them except at position 0
    model, tok = smollm2()
    cap = capture_qk(model, torch.tensor([list(range(100, 116))]), [1])[1]
    assert torch.allclose(cap.k_pre[:, 0], cap.k_post[:, 0], atol=1e-5)
    assert not torch.allclose(cap.k_pre[:, 5], cap.k_post[:, 5], atol=1e-3)


@pytest.mark.parametrize("args,fragment", [
    (("--clusters", 0), "--clusters"),
    (("--clusters", 1), "--clusters >= 2"),
    (("--layers", "a,b"), "--layers"),
    (("--text", "/nonexistent.txt"), "--text"),
    (("--lr", -1), "--lr"),
])
def test_train_bad_arguments_before_loading(tmp_path, no_model, args, fragment):
    r = run("train", write_pattern(tmp_path), *args, "-o", tmp_path / "s.safetensors")
    assert r.exit_code == 2 and fragment in r.stderr, r.output


def test_train_refuses_a_pattern_without_partition(tmp_path, no_model):
    p = tmp_path / "h2o.py"
    p.write_text("from sas import Diag, Dynamic, ops\npattern = Diag(0, 4) + Diag(4, None) * "
                 "Dynamic(budget=4, score=ops.attn_score().sum(dim=1))\n")
    r = run("train", p, "-o", tmp_path / "s.safetensors")
    assert r.exit_code == 2 and "ops.partition" in r.stderr, r.output


def test_train_needs_tokens_past_the_sink_and_window(tmp_path, no_model):
    """The refusal names the pattern's own sink and window and the smallest --tokens, before the
    model loads. (Found running the docs' commands: with the old default of 2048 tokens,
    `sas train examples/saap.py` failed after loading the model, saying 'a sink of 2048 and a
    window of 2048' for the example's sink of 1 and window of 2047.)"""
    saap = EXAMPLES / "saap.py"
    r = run("train", saap, "--tokens", 2048, "-o", tmp_path / "s.safetensors")
    assert r.exit_code == 2, r.output
    assert "a sink of 1 and a window of 2047" in r.stderr and "--tokens 2049 or more" in r.stderr, r.stderr
    r = run("train", write_pattern(tmp_path, window=100), "--tokens", 80, "--clusters", 8, "-o", tmp_path / "s")
    assert r.exit_code == 2 and "a sink of 1 and a window of 100" in r.stderr and "--tokens 102" in r.stderr


def test_train_default_tokens_cover_the_example(tmp_path, loaded, monkeypatch):
    """The documented `sas train examples/saap.py -o ...` with every default passes the checks
    and fits the state (the fit itself is cut down: one layer, a few steps)."""
    import sas.methods.saap_train as saap_train
    fitted = {}

    def small_fit(model, ids, pattern, name, **kw):
        fitted.update(tokens=int(ids.shape[1]), clusters=kw["clusters"])
        return real_fit(model, ids[:, :2200], pattern, name, **{**kw, "layers": [1], "steps": 2, "hidden": 8})
    real_fit = saap_train.train_state
    monkeypatch.setattr(saap_train, "train_state", small_fit)
    r = run("train", EXAMPLES / "saap.py", "-o", tmp_path / "s.safetensors")
    assert r.exit_code == 0, r.output
    assert fitted == {"tokens": 4096, "clusters": 64}
