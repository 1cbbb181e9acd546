"""Compile the Gluon kernel of generated prefill modules for sm_90 without a GPU (Triton's
compiler and its bundled ptxas), in a process of its own: Gluon has no interpreter, and under
TRITON_INTERPRET=1 (the test suite's setting) Triton's library functions are interpreted ones.

    python tests/helpers/gluon_compile.py '<json list of jobs>'

Each job: {"path": module file, "block_n", "head_dim", "even_n", "store_lse"}; prints a JSON
list of {"ptx_ok": {...}, "spills": [stores, loads]} (ptxas -v for sm_90a)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import tempfile


def load(path: str):
    spec = importlib.util.spec_from_file_location(f"gluon_mod_{abs(hash(path))}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def compile_for_hopper(mod, block_n: int, head_dim: int, even_n: bool, store_lse: bool):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    gl = mod.gl
    kern = next(getattr(mod, n) for n in dir(mod) if n.endswith("_gl"))
    lay_q = gl.NVMMASharedLayout.get_default_for([1, 1, 128, head_dim], gl.bfloat16)
    lay_kv = gl.NVMMASharedLayout.get_default_for([1, 1, block_n, head_dim], gl.bfloat16)

    def desc(rows, lay):
        return f"tensordesc<bf16[1, 1, {rows}, {head_dim}],{lay!r}>"

    sig = dict(desc_q=desc(128, lay_q), desc_k=desc(block_n, lay_kv), desc_v=desc(block_n, lay_kv),
               Out="*bf16", Lse="*fp32", FullPtr="*i32", FullCols="*i32", PartPtr="*i32", PartCols="*i32",
               Order="*i32", stride_ob="i64", stride_oh="i64", stride_om="i64", num_heads="i32", q_len="i32",
               k_len="i32", q_offset="i32", qk_scale="fp32")
    consts = dict(GROUP=2, HEAD_DIM=head_dim, BLOCK_M=128, BLOCK_N=block_n,
                  STAGES=mod.gluon_stages(block_n, head_dim), EVEN_N=even_n, STORE_LSE=store_lse,
                  CONSUMER_REGS=mod.GLUON_CONSUMER_REGS, PRODUCER_REGS=mod.GLUON_PRODUCER_REGS, num_warps=4)
    sig.update({name: "constexpr" for name in consts})
    names = list(sig)
    src = GluonASTSource(kern, sig, {(names.index(n),): v for n, v in consts.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, maxnreg=mod.GLUON_MAXNREG))


def ptxas_spills(ptx: str) -> list[int]:
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as d:
        with open(f"{d}/k.ptx", "w") as f:
            f.write(ptx)
        res = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                             capture_output=True, text=True, check=True)
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", res.stdout + res.stderr)
    if m is None:
        raise RuntimeError("ptxas -v printed no spill line:\n" + res.stdout + res.stderr)
    return [int(m.group(1)), int(m.group(2))]


def main() -> None:
    out = []
    for job in json.loads(sys.argv[1]):
        mod = load(job["path"])
        k = compile_for_hopper(mod, job["block_n"], job["head_dim"], job["even_n"], job["store_lse"])
        ptx = k.asm["ptx"]
        out.append({
            "ptx_ok": {
                "wgmma": "wgmma.mma_async" in ptx,
                "tma_4d": "cp.async.bulk.tensor.4d" in ptx,
                "consumer_regs": f"setmaxnreg.inc.sync.aligned.u32 \t{mod.GLUON_CONSUMER_REGS};" in ptx,
                "producer_regs": f"setmaxnreg.dec.sync.aligned.u32 \t{mod.GLUON_PRODUCER_REGS};" in ptx,
            },
            "spills": ptxas_spills(ptx),
        })
    print(json.dumps(out))


if __name__ == "__main__":
    main()
