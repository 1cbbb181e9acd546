"""sas attention under transformers' tensor parallelism (docs/integration.md, "Across GPUs").

transformers shards a decoder's attention by heads when it is loaded with `tp_plan="auto"`
under `torchrun`: `q_proj`, `k_proj`, `v_proj` are split by output rows (whole heads) and
`o_proj` by input columns, followed by an all-reduce. The attention function of each rank
therefore sees only that rank's query and KV heads, and sas needs nothing from the other
ranks: each rank's `SASCache` holds the compact cache of its own KV heads, and a Dynamic
pattern's selection state (scores per KV head) stays on the rank that owns the head.

What sas checks, before anything is loaded or changed:

- the KV heads split evenly over the ranks and every GQA group stays on one rank
  (`check_head_split`): transformers itself would only fail later with a reshape error, or
  split a group across ranks;
- the heads a rank's attention layer receives are the heads it should own (`TensorParallel`,
  checked again when a layer's cache is first filled);
- a Dynamic score pooled over all KV heads (`[B, 1, Lk]`) is refused: under tensor
  parallelism each rank sees only its heads, so the pooled score would need an all-reduce per
  step, which sas does not do.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from typing import Any, NoReturn

import torch

from sas.errors import IntegrationError, NotYetSupportedError


@dataclass(frozen=True)
class TensorParallel:
    """How a model's attention heads are split: `size` ranks, this process is `rank`; the
    model's global head counts."""

    size: int
    rank: int
    q_heads: int
    kv_heads: int

    @property
    def local_q_heads(self) -> int:
        return self.q_heads // self.size

    @property
    def local_kv_heads(self) -> int:
        return self.kv_heads // self.size

    def kv_head_range(self) -> range:
        """The global KV heads this rank holds (transformers shards by contiguous rows)."""
        return range(self.rank * self.local_kv_heads, (self.rank + 1) * self.local_kv_heads)


def valid_tp_sizes(q_heads: int, kv_heads: int) -> list[int]:
    """Tensor-parallel sizes that keep every GQA group on one rank: divisors of the KV heads
    that also divide the query heads."""
    return [d for d in range(1, kv_heads + 1) if kv_heads % d == 0 and q_heads % d == 0]


def check_head_split(q_heads: int, kv_heads: int, size: int, where: str) -> None:
    """IntegrationError unless `size` ranks each get whole KV heads and whole GQA groups."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise IntegrationError(f"{where}: the tensor-parallel size must be a positive integer, got {size!r}")
    if q_heads % kv_heads:
        raise IntegrationError(f"{where}: the model has {q_heads} query heads for {kv_heads} KV heads, which is "
                               f"not a whole number of query heads per KV head")
    if kv_heads % size or q_heads % size:
        group = q_heads // kv_heads
        share = f"{kv_heads / size:g} KV heads and {q_heads / size:g} query heads"
        raise IntegrationError(
            f"{where}: tensor parallelism over {size} ranks would give each rank {share} of this model's "
            f"{q_heads} query / {kv_heads} KV heads; sas keeps each rank's KV heads and their GQA groups "
            f"({group} query heads per KV head) whole, so the size must divide the KV heads: valid sizes for "
            f"this model are {', '.join(map(str, valid_tp_sizes(q_heads, kv_heads)))}")


def _head_counts(config: Any) -> tuple[int, int]:
    q = int(config.num_attention_heads)
    return q, int(getattr(config, "num_key_value_heads", None) or q)


def _mesh_of(weight: Any) -> Any:
    """The device mesh of a DTensor weight (None for a plain tensor)."""
    return getattr(weight, "device_mesh", None) if hasattr(weight, "to_local") else None


def tensor_parallel_of(model: Any, attention: torch.nn.Module, where: str) -> TensorParallel | None:
    """The head split of a model loaded with transformers' tensor parallelism (None when its
    attention is not sharded). Raises IntegrationError for a split sas cannot run."""
    weight = attention.q_proj.weight
    mesh = _mesh_of(weight)
    size = int(getattr(model, "tp_size", None) or getattr(model, "_tp_size", None) or 1)
    if mesh is not None:
        size = int(mesh.size())
    if size <= 1:
        return None
    q_heads, kv_heads = _head_counts(model.config)
    check_head_split(q_heads, kv_heads, size, where)
    if mesh is not None:
        rank = int(mesh.get_local_rank())
    elif torch.distributed.is_available() and torch.distributed.is_initialized():
        rank = int(torch.distributed.get_rank())
    else:
        raise IntegrationError(f"{where}: the model reports tensor parallelism over {size} ranks but "
                               f"torch.distributed is not initialized")
    tp = TensorParallel(size, rank, q_heads, kv_heads)
    head_dim = int(attention.head_dim)
    local_rows = (weight.to_local() if mesh is not None else weight).shape[0]
    if mesh is not None and local_rows != tp.local_q_heads * head_dim:
        raise IntegrationError(f"{where}: rank {rank} holds {local_rows} rows of q_proj, not the "
                               f"{tp.local_q_heads} whole query heads x {head_dim} that sas expects from a "
                               f"head-wise split over {size} ranks")
    return tp


def check_dynamic_under_tp(runtimes: Any, tp: TensorParallel | None, where: str) -> None:
    """NotYetSupportedError for a Dynamic score pooled over all KV heads under tensor parallelism."""
    if tp is None:
        return
    for rt in runtimes:
        plan = rt.dynamic_plan
        if plan is not None and plan.score.head_shared:
            raise NotYetSupportedError(
                f"{where}: the Dynamic score of {rt.pattern!r} is pooled over all KV heads ([B, 1, Lk]); under "
                f"tensor parallelism over {tp.size} ranks each rank holds {tp.local_kv_heads} of the "
                f"{tp.kv_heads} KV heads, and the pooled score would need an all-reduce every step, which sas "
                f"does not do: use a score per KV head (e.g. ops.attn_score().sum(dim=1))")


def distributed_world() -> tuple[int, int]:
    """(world size, rank) of this process: (1, 0) outside torch.distributed / torchrun."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return int(torch.distributed.get_world_size()), int(torch.distributed.get_rank())
    return 1, 0


def end_process_group(wait: bool = True) -> None:
    """Shut torch.distributed down in this rank (transformers' tensor-parallel loading starts it
    and nothing else ends it): `wait`, first for every rank. This does not stop gloo's threads
    while anything still holds the device mesh (see `exit_rank`)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if wait:
            torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def exit_rank(code: int = 0) -> NoReturn:
    """End this rank's process with exit status `code`, skipping the interpreter's teardown.

    `destroy_process_group` unregisters the process groups but does not stop their gloo
    threads while a `DeviceMesh` is still referenced, and a tensor-parallel model leaves it
    referenced from the model's DTensors and from module-level caches of torch and transformers
    (measured: 14 of the 21 gloo threads of a 2-rank CPU run stay alive after the model is
    deleted and the groups destroyed). The interpreter's teardown then destroys them in an
    arbitrary order, and now and then a rank aborted there ("terminate called without an active
    exception", SIGABRT) after its work was done. So a rank that succeeded waits for every rank
    (a barrier: no collective is left in flight), destroys the groups, flushes its output and
    leaves with `os._exit`; a rank that failed (`code` != 0) does not wait for the others."""
    end_process_group(wait=code == 0)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):      # a closed or broken stream: nothing more can be written
            pass
    os._exit(code)


def per_rank_bytes(total: int, tp: TensorParallel | None) -> int:
    """Bytes one rank holds of a cache whose heads split evenly over the ranks."""
    return total if tp is None else math.ceil(total / tp.size)


__all__ = ["TensorParallel", "check_dynamic_under_tp", "check_head_split", "distributed_world", "end_process_group",
           "exit_rank", "per_rank_bytes", "tensor_parallel_of", "valid_tp_sizes"]
