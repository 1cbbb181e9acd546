"""Run time: `SASAttnKernel`, the torch module that runs generated kernels and owns the
compact KV cache."""

from sas.runtime.kernel import SASAttnKernel

__all__ = ["SASAttnKernel"]
