"""The CUDA toolkit as the tests find it: `NVCC` (the nvcc sas would use, or None) and the
`needs_nvcc` mark for tests that compile CUDA code."""

from __future__ import annotations

import pytest

from sas.codegen.cuda_backend import find_nvcc
from sas.errors import KernelError


def _nvcc() -> str | None:
    try:
        return find_nvcc()
    except KernelError:
        return None


NVCC = _nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) not found on PATH, $CUDA_HOME/bin or "
                                                     "/usr/local/cuda/bin: the CUDA compile checks need it")
