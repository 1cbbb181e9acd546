"""Kascade on the real SmolLM2 (first 6 of its 30 layers, to keep the CPU interpreter short):
the integration's per-forward store, the Triton path against the torch reference through
prefill and decode, a budget covering every key equal to the model's own attention,
calibration (`sas calibrate` included) and bad input before the model changes."""

from __future__ import annotations

import copy

import pytest
import torch
from click.testing import CliRunner

import sas.models
from sas.cli.main import cli
from sas.integrations.kascade import LAYER_ATTR, kascade_attention, kascade_attention_forward
from sas.methods.kascade import KascadeError
from sas.methods.kascade_calibrate import calibrate
from sas.methods.kascade_dynamic import anchor_pattern
from sas.methods.kascade_state import load_state

from helpers.attention import DEV
from model_fixtures import smollm2

LAYERS = 6
ANCHOR_PY = """from sas import Causal, Dynamic, ops
pattern = Causal() * Dynamic(budget=ops.fraction(0.1, min=128), refresh=True, publish="kascade",
                             score=ops.attn_score().sum(dim=1))
"""
REUSE_PY = """from sas import Causal, Dynamic, ops
pattern = Causal() * Dynamic(budget=ops.fraction(0.1, min=128), refresh=True, score=ops.reuse("kascade"))
"""


@pytest.fixture(scope="module")
def small():
    """A deep copy of SmolLM2 cut to its first LAYERS layers, and the tokenizer."""
    model, tok = smollm2()
    m = copy.deepcopy(model)
    m.model.layers = m.model.layers[:LAYERS]
    m.config.num_hidden_layers = LAYERS
    m.config.layer_types = m.config.layer_types[:LAYERS] if getattr(m.config, "layer_types", None) else None
    m.eval()
    return m, tok


def ids_of(tok, n, offset=0):
    from sas.evaluation.text import corpus_tokens
    return torch.tensor([corpus_tokens(tok, n + offset)[offset:]])


def fresh(small):
    m = copy.deepcopy(small[0])
    return m


@pytest.mark.kernels
def test_triton_path_matches_the_torch_reference_through_generate(small):
    ids = ids_of(small[1], 44)
    outs = {}
    for backend in ("torch", "triton"):
        m = fresh(small).to(DEV)                     # the kernels run where the model is (a GPU, or the interpreter)
        kascade_attention(m, anchors=[0, 3], head_map=[[0, 1, 2]] * 3 + [[2, 2, 0]] * 3, frac=0.1, min_keys=16,
                          backend=backend, torch_dtype=torch.float64)
        with torch.no_grad():
            outs[backend] = m.generate(ids.to(DEV), attention_mask=torch.ones_like(ids, device=DEV), max_new_tokens=2,
                                       do_sample=False, output_logits=True, return_dict_in_generate=True,
                                       pad_token_id=0)
        assert m._sas_kascade_steps.steps == 2      # one store per forward: prefill + 1 decode step
    assert torch.equal(outs["torch"].sequences, outs["triton"].sequences)
    for a, b in zip(outs["torch"].logits, outs["triton"].logits):
        torch.testing.assert_close(a, b, atol=2e-3, rtol=2e-3)


def test_budget_covering_every_key_is_the_models_attention(small):
    ids = ids_of(small[1], 48, offset=100)
    with torch.no_grad():
        dense = small[0](ids, use_cache=False).logits
        m = fresh(small)
        kascade_attention(m, anchors=[0, 2], frac=1.0, min_keys=1, backend="torch")
        got = m(ids, use_cache=False).logits
        kascade_attention(m, anchors=[0, 2], frac=0.1, min_keys=4, backend="torch")
        sparse = m(ids, use_cache=False).logits
    torch.testing.assert_close(got, dense, atol=1e-4, rtol=1e-4)
    assert (sparse - dense).abs().max() > 1e-3         # a real selection changes the output


def test_a_copied_model_renews_its_own_store(small):
    """copy.deepcopy of a Kascade model: the copy's pre-hook renews the copy's step store (a
    closure over the original's once renewed the original's; found by a new-user exploration)."""
    ids = ids_of(small[1], 24)
    m = fresh(small)
    kascade_attention(m, anchors=[0, 2], frac=0.25, min_keys=4, backend="torch")
    c = copy.deepcopy(m)
    with torch.no_grad():
        want, got = m(ids, use_cache=False).logits, c(ids, use_cache=False).logits
        c(ids, use_cache=False)
    assert (m._sas_kascade_steps.steps, c._sas_kascade_steps.steps) == (1, 2)
    assert getattr(c.model.layers[1].self_attn, LAYER_ATTR).holder is c._sas_kascade_steps
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_a_saved_model_loads_in_a_fresh_process(tmp_path):
    """torch.save of a Kascade model, torch.load and generate in another process: unpickling
    imports sas's Kascade integration, which registers its attention (before: KeyError, not a
    valid attention implementation). A review finding."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from model_fixtures import tiny_llama

    m = kascade_attention(copy.deepcopy(tiny_llama()), anchors=[0], frac=0.5, min_keys=2, backend="torch")
    ids = torch.randint(1, 100, (1, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = m.generate(ids, max_new_tokens=3, do_sample=False)
    torch.save(m, tmp_path / "m.pt")
    torch.save(ids, tmp_path / "ids.pt")
    code = (f"import torch; m = torch.load({str(tmp_path / 'm.pt')!r}, weights_only=False); "
            f"ids = torch.load({str(tmp_path / 'ids.pt')!r}); "
            f"print(m.generate(ids, max_new_tokens=3, do_sample=False).tolist())")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                      os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == str(want.tolist())


def test_reuse_layer_called_outside_a_step_with_an_anchor_is_an_error(small):
    m = fresh(small)
    kascade_attention(m, anchors=[0], backend="torch")
    attn = m.model.layers[1].self_attn
    getattr(attn, LAYER_ATTR).holder.new_step()              # an empty store: no anchor ran in this step
    q = torch.randn(1, 9, 8, 64)
    k = torch.randn(1, 3, 8, 64)
    with pytest.raises(KascadeError, match="no anchor layer published"):
        kascade_attention_forward(attn, q, k, k, None, 0.125)


def test_bad_arguments_leave_the_model_unchanged(small):
    m = fresh(small)
    before = m.config._attn_implementation
    for kw, word in ((dict(anchors=[1, 3]), "before any anchor"), (dict(anchors=[0, 9]), "not a layer"),
                     (dict(anchors=[0], head_map=[[0, 1, 2]] * 2), "rows"),
                     (dict(anchors=[0], head_map=[[0, 1]] * LAYERS), "entries"),
                     (dict(anchors=[0], frac=0.0), "fraction"), (dict(anchors=[0], backend="cuda"), "backend"),
                     (dict(), "anchors")):
        with pytest.raises(KascadeError, match=word):
            kascade_attention(m, **kw)
    assert m.config._attn_implementation == before and not hasattr(m.model.layers[0].self_attn, LAYER_ATTR)


def test_calibration_and_state(small, tmp_path):
    m = fresh(small)
    ids = ids_of(small[1], 192, offset=300)
    st = calibrate(m, ids, anchor_pattern(0.1, 128), "SmolLM2-135M-Instruct", anchors=3, window=96)
    assert st.anchors[0] == 0 and len(st.anchors) == 3
    assert st.brute_force == ",".join(map(str, st.anchors))              # the DP equals brute force
    assert tuple(st.head_map.shape) == (LAYERS, 3) and bool((st.weights > 0).all())
    sim = st.similarity.layer_sim
    assert torch.allclose(sim.diagonal(), torch.ones(LAYERS, dtype=torch.float64))   # a layer covers itself
    path = tmp_path / "k.safetensors"
    st.save(path)
    back = load_state(path, anchor_pattern(0.1, 128), "SmolLM2-135M-Instruct")
    kascade_attention(m, back, min_keys=16, backend="torch")
    with torch.no_grad():
        assert torch.isfinite(m(ids[:, :64], use_cache=False).logits).all()


@pytest.fixture
def no_model(monkeypatch):
    def fail(*a, **k):
        raise AssertionError("the model was loaded before the arguments were checked")
    monkeypatch.setattr(sas.models, "load_model", fail)


@pytest.mark.parametrize("args,word", [(["--anchors", "0"], "--anchors"), (["--window", "2048"], "--window"),
                                       (["--text", "nope.txt"], "--text")])
def test_calibrate_cli_bad_arguments(tmp_path, no_model, args, word):
    p = tmp_path / "a.py"
    p.write_text(ANCHOR_PY)
    res = CliRunner().invoke(cli, ["calibrate", str(p), "-o", str(tmp_path / "o.safetensors")] + args)
    assert res.exit_code == 2 and word in res.output and not (tmp_path / "o.safetensors").exists()


def test_calibrate_cli_refuses_a_reuse_pattern(tmp_path, no_model):
    p = tmp_path / "r.py"
    p.write_text(REUSE_PY)
    res = CliRunner().invoke(cli, ["calibrate", str(p), "-o", str(tmp_path / "o.safetensors")])
    assert res.exit_code == 2 and "anchor pattern" in res.output


def test_calibrate_cli_writes_a_state(tmp_path, monkeypatch, small):
    monkeypatch.setattr(sas.models, "load_model", lambda spec="default", **kw: (fresh(small), small[1]))
    p = tmp_path / "a.py"
    p.write_text(ANCHOR_PY)
    out = tmp_path / "k.safetensors"
    res = CliRunner().invoke(cli, ["calibrate", str(p), "--tokens", "128", "--window", "128", "--anchors", "2",
                                   "-o", str(out)])
    assert res.exit_code == 0, res.output
    from sas.lang.loader import load_pattern
    st = load_state(out, load_pattern(p), "SmolLM2-135M-Instruct")
    assert len(st.anchors) == 2 and "wrote" in res.output
