"""`sas compile --backend cuda`: the files of a pattern's CUDA kernels (compile_pattern's CUDA
branch): `kernels.cu` (templates/cuda/kernels.cu.jinja), `loader.py` (builds it with nvcc on
first use and launches it on torch tensors through ctypes), `report.json` and `report.md`.

Before anything is written the generated source is compiled by nvcc for sm_90 (an object file
in a temporary folder), with the kernels for the requested dtype and head dim instantiated (the
other pairs are the same template code with other types; compiling them all takes 4x longer):
nvcc missing or failing is a `KernelError` carrying its trimmed message, and the output folder is
left untouched.
"""

from __future__ import annotations

import json
from typing import Any

from sas.codegen.cuda_backend import (
    CUDA_TEMPLATE_VERSION,
    DEFAULT_ARCH,
    check_compiles,
    check_dtype,
    check_head_dim,
    render_cuda,
    render_loader,
)
from sas.errors import NotYetSupportedError

FILES = ("kernels.cu", "loader.py", "report.json", "report.md")


def cuda_files(plan: Any, head_dim: int, dtype: str, num_heads: int, num_kv_heads: int,
               batch: int) -> tuple[dict[str, str | bytes], dict[str, Any]]:
    """Files and report for a static plan (every check, and nvcc, before returning)."""
    if plan.is_dynamic:     # first: no head dim or dtype makes a Dynamic pattern compile here
        raise NotYetSupportedError(
            "compile_pattern: the cuda backend compiles static patterns only; a pattern with a Dynamic component "
            "compiles with --backend triton")
    check_head_dim(head_dim, "compile_pattern")
    dtype_code = check_dtype(dtype, "compile_pattern")
    analysis = plan.analysis if plan.can_decode else None
    cs = render_cuda(plan.pattern, analysis)
    check_compiles(cs.source, DEFAULT_ARCH, dtype=dtype_code, head_dim=head_dim)
    loader = render_loader(cs, plan.pattern, plan.max_len)
    notes = []
    if not plan.causal:
        notes.append("pattern is not causal: prefill only (decode needs a causal pattern)")
    elif analysis is None:
        notes.append(f"no decode: {plan.analysis_error}")
    if cs.decode_note:
        notes.append(cs.decode_note)
    report: dict[str, Any] = {
        "pattern": repr(plan.pattern), "backend": "cuda", "template_version": CUDA_TEMPLATE_VERSION,
        "max_len": plan.max_len, "head_dim": head_dim, "dtype": dtype, "batch": batch, "num_heads": num_heads,
        "num_kv_heads": num_kv_heads, "predicate": plan.pattern.predicate_source(), "causal": plan.causal,
        "namespace": cs.namespace, "checked_with": f"nvcc -c for {DEFAULT_ARCH} ({dtype}, head dim {head_dim} instantiated)",
        "prefill": {"block_m": 64, "block_n": [64, 32]}, "decode": cs.decode,
        "notes": notes, "files": list(FILES),
    }
    if cs.decode:
        report["cache_size"] = cs.cache_size
        report["dense_cache_size"] = plan.max_len
        report["tables"] = {name: len(values) for name, values in cs.tables}
        report["functions_source_synthesized"] = analysis.source
    files: dict[str, str | bytes] = {"kernels.cu": cs.source, "loader.py": loader,
                                     "report.json": json.dumps(report, indent=2) + "\n",
                                     "report.md": _markdown(report)}
    return files, report


def _markdown(r: dict[str, Any]) -> str:
    lines = [f"# sas CUDA kernels: `{r['pattern']}`", "",
             f"- mask predicate: `{r['predicate']}`",
             f"- max_len {r['max_len']}, head dim {r['head_dim']} (the kernels take 64 or 128), {r['dtype']} "
             f"(bfloat16 or float16)",
             f"- decode kernel: {'yes, compact cache of ' + str(r['cache_size']) + ' slots' if r['decode'] else 'no'}",
             f"- checked: {r['checked_with']}"]
    lines += [f"- note: {n}" for n in r["notes"]]
    lines += ["", "## Use", "", "```python",
              "import loader                      # this folder on sys.path (or import it as a package module)",
              "loader.build()                     # nvcc, once per source and GPU architecture (cached)",
              "tiles = loader.build_tiles(L, device='cuda', block_n=64)",
              "out = loader.prefill(q, k, v, *tiles, block_n=64)   # q [B, Hq, L, D], k, v [B, Hkv, L, D]"]
    if r["decode"]:
        lines += ["k_cache = torch.zeros(B, Hkv, loader.CACHE_SIZE, D, dtype=q.dtype, device='cuda')",
                  "v_cache = torch.zeros_like(k_cache)",
                  "loader.fill_cache(k, v, k_cache, v_cache)              # the prompt, positions 0..L-1",
                  "o = loader.decode(q1, k1, v1, k_cache, v_cache, pos=L) # one token [B, H, 1, D]"]
    lines += ["```", ""]
    return "\n".join(lines)


__all__ = ["FILES", "cuda_files"]
