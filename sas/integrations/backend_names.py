"""The backends a model integration runs a pattern on (`sas_attention(backend=...)`,
`sas generate / eval --backend`), in a module that imports nothing, so that the CLI can name
them without importing torch.

- "auto": the Triton kernels for CUDA tensors (and dynamic patterns), the torch executor otherwise;
- "torch": the pure-torch executor (static patterns);
- "triton": the generated Triton kernels (CUDA, or the CPU interpreter under TRITON_INTERPRET=1);
- "cuda": the nvcc-built CUDA kernels of `sas compile --backend cuda` (static patterns, a GPU).
"""

MODEL_BACKENDS = ("auto", "torch", "triton", "cuda")

__all__ = ["MODEL_BACKENDS"]
