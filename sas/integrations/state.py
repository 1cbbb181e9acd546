"""What `sas_attention` attaches to a model: the compiled pattern of every layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sas.errors import IntegrationError
from sas.integrations.parallel import TensorParallel
from sas.integrations.pattern_runtime import PatternRuntime

#: the name sas_attention registers its attention (and mask) function under in transformers
ATTN_IMPLEMENTATION = "sas"
#: attribute of the model holding its `ModelState`, and of each attention module holding its runtime
STATE_ATTR = "sas_state"
RUNTIME_ATTR = "sas_runtime"


@dataclass(frozen=True, eq=False)
class ModelState:
    """The patterns of a model prepared by `sas_attention`: one runtime per layer (layers with
    equal patterns share one), the analysed length, the backend and, under transformers' tensor
    parallelism, how the heads are split over the ranks (None: one process holds every head)."""

    runtimes: tuple[PatternRuntime, ...]
    max_len: int
    backend: str
    tensor_parallel: TensorParallel | None = None

    @property
    def num_layers(self) -> int:
        return len(self.runtimes)


def model_state(model: Any, where: str) -> ModelState:
    state = getattr(model, STATE_ATTR, None)
    if not isinstance(state, ModelState):
        raise IntegrationError(f"{where}: the model was not prepared by sas_attention(model, pattern)")
    return state


__all__ = ["ModelState", "model_state", "STATE_ATTR", "RUNTIME_ATTR"]
