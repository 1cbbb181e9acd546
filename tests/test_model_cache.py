"""sas.model_cache: a GGUF file is dequantized once and read back as a transformers checkpoint."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from sas import model_cache
from sas.model_cache import ENV, cache_root, cached_checkpoint, entry_dir, is_complete
from sas.models import SMOLLM2_GGUF, default_model_dir

from model_fixtures import smollm2


class FakeModel:
    """Stands in for a transformers model: save_pretrained writes config.json."""

    def __init__(self, fail: bool = False):
        self.config = type("Config", (), {})()
        self.config.quantization_config = {"quant_method": "gguf"}
        self.hf_quantizer = object()
        self.fail = fail

    def save_pretrained(self, d: Path) -> None:
        if self.fail:
            (Path(d) / "half").write_text("x")
            raise OSError("disk full")
        (Path(d) / "config.json").write_text("{}")


class FakeTokenizer:
    def save_pretrained(self, d: Path) -> None:
        (Path(d) / "tokenizer.json").write_text("{}")


class Converter:
    """A `convert` callable that counts its calls (and may take its time)."""

    def __init__(self, delay: float = 0.0):
        self.calls = 0
        self.delay = delay

    def __call__(self) -> tuple[FakeModel, FakeTokenizer]:
        self.calls += 1
        time.sleep(self.delay)
        return FakeModel(), FakeTokenizer()


def _gguf(tmp_path: Path, name: str = "m.gguf", data: bytes = b"gguf") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_converts_once_then_reads_the_entry(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "cache"))
    f = _gguf(tmp_path)
    convert = Converter()
    first = cached_checkpoint(f, convert)
    second = cached_checkpoint(f, convert)
    assert first == second == entry_dir(tmp_path / "cache", f) and convert.calls == 1
    assert is_complete(first) and (first / "tokenizer.json").is_file()
    # no temporary folders or stray files are left beside the entry
    assert sorted(p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")) == [first.name]


def test_a_changed_file_gets_a_new_entry(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "cache"))
    f = _gguf(tmp_path)
    a = cached_checkpoint(f, lambda: (FakeModel(), FakeTokenizer()))
    f.write_bytes(b"gguf, another version")
    os.utime(f, ns=(time.time_ns(), time.time_ns() + 10**9))
    b = cached_checkpoint(f, lambda: (FakeModel(), FakeTokenizer()))
    assert a != b and is_complete(a) and is_complete(b)


@pytest.mark.parametrize("off", ["off", "0", "none", "OFF"])
def test_off_converts_nothing(tmp_path, monkeypatch, off):
    monkeypatch.setenv(ENV, off)
    assert cache_root() is None
    assert cached_checkpoint(_gguf(tmp_path), lambda: pytest.fail("convert must not run")) is None


def test_default_root_follows_xdg(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_root() == tmp_path / "sas" / "models"


def test_a_failed_write_leaves_nothing_and_warns(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "cache"))
    f = _gguf(tmp_path)
    with pytest.warns(RuntimeWarning, match="cannot be used"):
        assert cached_checkpoint(f, lambda: (FakeModel(fail=True), FakeTokenizer())) is None
    assert [p for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == []
    # the next load converts again and succeeds
    assert is_complete(cached_checkpoint(f, lambda: (FakeModel(), FakeTokenizer())))


def test_an_unwritable_root_warns(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(ENV, str(blocker / "cache"))
    with pytest.warns(RuntimeWarning, match="cannot be used"):
        assert cached_checkpoint(_gguf(tmp_path), lambda: (FakeModel(), FakeTokenizer())) is None


def test_an_incomplete_entry_is_converted_again(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "cache"))
    f = _gguf(tmp_path)
    e = entry_dir(tmp_path / "cache", f)
    e.mkdir(parents=True)
    (e / "config.json").write_text("{}")       # no completion marker: a copy from a crashed run
    convert = Converter()
    cached_checkpoint(f, convert)
    assert convert.calls == 1 and is_complete(e)


def test_concurrent_loaders_convert_once(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "cache"))
    f = _gguf(tmp_path)
    slow = Converter(delay=0.3)
    out: list[Path | None] = []
    start = threading.Barrier(3, timeout=60)   # the three ask at once (a sleep alone may run them in turn)

    def load() -> None:
        start.wait()
        out.append(cached_checkpoint(f, slow))
    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == 3 and slow.calls == 1 and len(set(out)) == 1 and is_complete(out[0])   # no loader failed


def test_smollm2_from_the_cache_equals_the_gguf_dequantization():
    """The default model, loaded through the cache, holds the GGUF file's tensors as gguf's own
    dequantizer reads them (a quantized one and a float one), and its entry is complete."""
    model, _ = smollm2()
    path = default_model_dir() / SMOLLM2_GGUF
    root = cache_root()
    if root is not None:
        assert is_complete(entry_dir(root, path))
    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    emb = tensors["token_embd.weight"]
    ref = gguf.quants.dequantize(emb.data, emb.tensor_type)
    assert emb.tensor_type != gguf.GGMLQuantizationType.F32
    assert np.array_equal(model.model.embed_tokens.weight.detach().numpy(), ref)
    norm = tensors["blk.0.attn_norm.weight"]
    assert torch.equal(model.model.layers[0].input_layernorm.weight.detach(),
                       torch.from_numpy(np.array(norm.data, dtype=np.float32)))


def test_module_names_its_version(tmp_path, monkeypatch):
    """The format version is part of an entry's folder: a new format never reads an old entry."""
    assert isinstance(model_cache.FORMAT_VERSION, int)
    f = _gguf(tmp_path)
    before = entry_dir(tmp_path / "cache", f)
    monkeypatch.setattr(model_cache, "FORMAT_VERSION", model_cache.FORMAT_VERSION + 1)
    assert entry_dir(tmp_path / "cache", f) != before
