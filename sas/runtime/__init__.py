"""Run time: `SASAttnKernel`, the torch module that runs a pattern's plan on generated kernels
and owns the compact KV cache; the executors behind it (`StaticRuntime` protocol, the Triton
`TritonRuntime`, `DynamicRuntime`); `standalone` and `dynamic_host`, the torch-only host code
that `sas compile` copies beside its output."""

from sas.runtime.dynamic import DynamicRuntime
from sas.runtime.executor import StaticRuntime, register_backend, static_runtime
from sas.runtime.kernel import SASAttnKernel
from sas.runtime.static import TritonRuntime

__all__ = ["DynamicRuntime", "SASAttnKernel", "StaticRuntime", "TritonRuntime", "register_backend",
           "static_runtime"]
