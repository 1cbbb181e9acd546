"""One compiled pattern of a model integration: its analysis, the torch executor and the
Triton (or CUDA) kernel, and the dispatch between them (`backend` "torch", "triton", "cuda" or
"auto").

Every layer holding the same pattern shares one `PatternRuntime`; the per-sequence state
(compact caches, positions) lives in `sas.integrations.cache`.

Backends (static patterns):

| call | torch | triton |
|---|---|---|
| prefill of an empty cache | `TorchExecutor.prefill` + `fill_cache` | `SASAttnKernel` prefill + `fill_cache`, one call per row when rows are padded |
| decode (one token per row) | `TorchExecutor.decode`, per-row positions | `SASAttnKernel` decode; one call per row when the rows' positions differ |
| later prompt chunk | `TorchExecutor.prefill_chunk` | the same torch code on the same cache (the Triton kernels have no chunk form) |

`backend="cuda"` runs static patterns on the nvcc-built CUDA kernels (`sas.runtime.cuda`, the
same calls as the triton column; a GPU and nvcc needed, head dims of `sas.codegen.cuda_backend`).

Dynamic patterns run only on the Triton kernels, through the stateful `SASAttnKernel` of each
layer (`sas.runtime.dynamic`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from sas.analysis import Analysis, analyze
from sas.codegen.cuda_backend import CUDA_DTYPES
from sas.codegen.cuda_backend import SUPPORTED_HEAD_DIMS as CUDA_HEAD_DIMS
from sas.codegen.triton_backend import SUPPORTED_HEAD_DIMS
from sas.dynamic.plan import DynamicPlan, plan_dynamic
from sas.errors import AnalysisError, IntegrationError, NotYetSupportedError
from sas.integrations.backend_names import MODEL_BACKENDS
from sas.lang.pattern import Pattern
from sas.methods.santa_dynamic import SantaDynamicRuntime
from sas.methods.specattn_runtime import is_top_p
from sas.runtime.kernel import SASAttnKernel, interpreting
from sas.runtime.torch_executor import TorchExecutor

BACKENDS = MODEL_BACKENDS


def _describe_layers(layers: list[int]) -> str:
    return f"layer {layers[0]}" if len(layers) == 1 else f"layers {', '.join(map(str, layers))}"


@dataclass(eq=False)
class PatternRuntime:
    """A pattern compiled for one model: `analysis` + `executor` (static) or `dynamic_plan`."""

    pattern: Pattern
    max_len: int
    backend: str
    layers: list[int]
    analysis: Analysis | None = None
    executor: TorchExecutor | None = None
    dynamic_plan: DynamicPlan | None = None
    #: whether "auto" may pick the Triton kernels (they support a few head dims only)
    triton_head_dim: bool = True
    _kernel: SASAttnKernel | None = field(default=None, repr=False)

    @classmethod
    def build(cls, pattern: Pattern, max_len: int, backend: str, layers: list[int], device: torch.device,
              head_dim: int, dtype: torch.dtype | None = None) -> "PatternRuntime":
        """Check the pattern for a decoder and compile it; every error names the layers."""
        where = f"sas_attention: the pattern of {_describe_layers(layers)} ({pattern!r})"
        if pattern.dynamics():
            plan = plan_dynamic(pattern, max_len=max_len)
            needs = [f"custom weight {n!r}" for n in plan.score.weights]
            if not is_top_p(plan):      # SpecAttn: a draft supplies the scores per step (specattn_draft)
                needs += [f"external score {n!r} (ops.external)" for n in plan.score.externals]
            if needs:
                raise IntegrationError(
                    f"{where} has a Dynamic score that needs {', '.join(needs)}; a model integration "
                    f"computes scores from the model's own attention only, so use a score chain built "
                    f"from ops.attn_score() (e.g. ops.attn_score().sum(dim=1))")
            if backend in ("torch", "cuda"):
                raise NotYetSupportedError(
                    f"{where} has a Dynamic component; dynamic selection runs on the Triton kernels "
                    f"only (not backend={backend!r}): use backend='triton' or 'auto' (CUDA, or "
                    f"TRITON_INTERPRET=1 on the CPU)")
            if device.type != "cuda" and not interpreting():
                raise NotYetSupportedError(
                    f"{where} has a Dynamic component, which runs on the Triton kernels, but the model is on "
                    f"{device}; move it to CUDA (or set TRITON_INTERPRET=1 to run the kernels on the CPU "
                    f"interpreter)")
            cls._check_triton_head_dim(where, head_dim)
            return cls(pattern, max_len, backend, layers, dynamic_plan=plan)
        try:
            analysis = analyze(pattern, max_len=max_len)
        except AnalysisError as e:
            raise IntegrationError(f"{where} cannot run in a decoder: {e}") from e
        if backend == "triton":
            if device.type != "cuda" and not interpreting():
                raise IntegrationError(
                    f"sas_attention: backend='triton' needs the model on CUDA (or TRITON_INTERPRET=1 for the "
                    f"CPU interpreter); it is on {device}: use backend='torch' or 'auto'")
            cls._check_triton_head_dim(where, head_dim)
        if backend == "cuda":
            if device.type != "cuda":
                raise IntegrationError(
                    f"sas_attention: backend='cuda' runs nvcc-built kernels on an NVIDIA GPU; the model is on "
                    f"{device}: move it to CUDA, or use backend='torch' or 'auto'")
            if dtype is not None and str(dtype).removeprefix("torch.") not in CUDA_DTYPES:
                raise IntegrationError(f"{where}: the CUDA kernels run {', '.join(CUDA_DTYPES)}; the model is "
                                       f"{str(dtype).removeprefix('torch.')}: convert it (model.to(torch.bfloat16)) "
                                       f"or use backend='triton'")
            if head_dim not in CUDA_HEAD_DIMS:
                raise IntegrationError(f"{where}: the CUDA kernels support head_dim "
                                       f"{', '.join(map(str, CUDA_HEAD_DIMS))}; this model has {head_dim}: use "
                                       f"backend='triton' or 'auto'")
        return cls(pattern, max_len, backend, layers, analysis=analysis, executor=TorchExecutor(pattern, analysis),
                   triton_head_dim=head_dim in SUPPORTED_HEAD_DIMS)

    @staticmethod
    def _check_triton_head_dim(where: str, head_dim: int) -> None:
        if head_dim not in SUPPORTED_HEAD_DIMS:
            raise IntegrationError(f"{where}: the Triton kernels support head_dim "
                                   f"{', '.join(map(str, SUPPORTED_HEAD_DIMS))}; this model has {head_dim}")

    @property
    def is_dynamic(self) -> bool:
        return self.dynamic_plan is not None

    @property
    def needs_draft(self) -> bool:
        """A SpecAttn pattern: its steps select keys from a draft model's attention rows
        (`sas.integrations.specattn_draft.run_with_draft` gives them)."""
        return self.dynamic_plan is not None and is_top_p(self.dynamic_plan)

    def use_kernel(self, t: torch.Tensor) -> bool:
        """Whether this call runs on the compiled kernels (Triton, or CUDA for backend='cuda')
        rather than the torch executor. backend='auto' takes the torch executor, which is
        differentiable, where autograd records a `t` that requires grad (the kernels have no
        backward pass)."""
        if self.is_dynamic or self.backend in ("triton", "cuda"):
            return True
        return (self.backend == "auto" and t.is_cuda and self.triton_head_dim
                and not (torch.is_grad_enabled() and t.requires_grad))

    @property
    def kernel(self) -> SASAttnKernel:
        """The functional kernel of a static pattern (Triton, or CUDA for backend='cuda'; built on
        first use)."""
        if self._kernel is None:
            self._kernel = SASAttnKernel(self.pattern, max_len=self.max_len, analysis=self.analysis,
                                         backend="cuda" if self.backend == "cuda" else "triton")
        return self._kernel

    def new_dynamic_kernel(self, layer: int) -> SASAttnKernel:
        """A stateful kernel (one per layer and sequence batch) for a Dynamic pattern of model
        layer `layer`; SANTA's seeded draws differ from layer to layer (`SantaRandom.for_layer`)."""
        kernel = SASAttnKernel(self.pattern, max_len=self.max_len)
        if isinstance(kernel.dynamic, SantaDynamicRuntime):
            kernel.dynamic.random = kernel.dynamic.random.for_layer(layer)
        return kernel

    # --- compiled-kernel helpers (static) -------------------------------------------------------
    @staticmethod
    def _kernel_q(q: torch.Tensor, scale: float | None) -> torch.Tensor:
        """The kernels scale scores by head_dim ** -0.5: fold any other model scale into q."""
        q = q.contiguous()
        if scale is None:
            return q
        ratio = float(scale) * q.shape[-1] ** 0.5
        return q if abs(ratio - 1.0) < 1e-12 else q * ratio

    def kernel_prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: list[torch.Tensor] | None,
                       past: tuple[torch.Tensor, torch.Tensor] | None, scale: float | None) -> torch.Tensor:
        """Prefill of a (possibly padded) prompt on the compiled kernels; fills `past` if given.
        `rows[b]`: the indices of row b's real tokens (None: no padding)."""
        ker = self.kernel
        q, k, v = self._kernel_q(q, scale), k.contiguous(), v.contiguous()
        if rows is None:
            out = ker(q, k, v)
            if past is not None:
                ker.fill_cache(k, v, *past)
            return out
        out = torch.zeros_like(q)
        for b, idx in enumerate(rows):
            if idx.numel() == 0:
                continue
            qb = q[b:b + 1].index_select(2, idx)
            kb, vb = k[b:b + 1].index_select(2, idx), v[b:b + 1].index_select(2, idx)
            out[b:b + 1, :, idx] = ker(qb, kb, vb)
            if past is not None:
                ker.fill_cache(kb, vb, past[0][b:b + 1], past[1][b:b + 1])
        return out

    def kernel_decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past_k: torch.Tensor,
                      past_v: torch.Tensor, p: list[int], scale: float | None) -> torch.Tensor:
        """One token per row at positions `p` (a host list of B ints; -1: padding row, output 0)."""
        ker = self.kernel
        q, k, v = self._kernel_q(q, scale), k.contiguous(), v.contiguous()
        if min(p) >= 0 and len(set(p)) == 1:
            return ker(q, k, v, past_k, past_v, position=p[0])
        out = torch.zeros_like(q)
        for b, pb in enumerate(p):
            if pb >= 0:
                out[b:b + 1] = ker(q[b:b + 1], k[b:b + 1], v[b:b + 1], past_k[b:b + 1], past_v[b:b + 1],
                                   position=pb)
        return out


def check_backend(backend: Any) -> str:
    if backend not in BACKENDS:
        raise IntegrationError(f"sas_attention: backend must be one of {', '.join(map(repr, BACKENDS))}, "
                               f"got {backend!r}")
    return backend


__all__ = ["PatternRuntime", "BACKENDS", "check_backend"]
