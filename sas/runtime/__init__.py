"""Run time: `SASAttnKernel`, the torch module that runs a pattern's plan on generated kernels
and owns the compact KV cache; the executors behind it (`StaticRuntime` protocol, the Triton
`TritonRuntime`, `DynamicRuntime`); `standalone` and `dynamic_host`, the torch-only host code
that `sas compile` copies beside its output."""

from sas.runtime.dynamic import DynamicRuntime
from sas.runtime.executor import StaticRuntime, register_backend, static_runtime
from sas.runtime.kernel import SASAttnKernel
from sas.runtime.static import TritonRuntime
from sas.runtime.torch_executor import TorchExecutor, torch_runtime
from sas.runtime import cuda as _cuda  # noqa: F401,E402  (registers backend "cuda")

__all__ = ["DynamicRuntime", "SASAttnKernel", "StaticRuntime", "TorchExecutor", "TritonRuntime", "torch_runtime", "register_backend",
           "static_runtime"]
