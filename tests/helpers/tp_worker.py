"""Checks of sas under transformers' tensor parallelism, run in each rank.

`python -m torch.distributed.run --standalone --nproc-per-node N tests/helpers/tp_worker.py
MODEL_DIR OUT.json` loads MODEL_DIR (a tiny random Llama checkpoint) with `load_model(tp=N)`
and runs greedy generation with dense attention, a static pattern (torch executor) and a
Dynamic H2O pattern (Triton kernels; the CPU interpreter in CI); rank 0 writes what it saw
to OUT.json. `run_checks(MODEL_DIR, 1)` runs the same in one process, for comparison.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch

from sas import Causal, Diag, Dynamic, Rect, ops
from sas.errors import NotYetSupportedError
from sas.integrations.parallel import exit_rank
from sas.integrations.transformers import SASCache, output_cache, sas_attention
from sas.models import load_model

STATIC = (Rect(cols=(0, 2)) + Diag(0, 4)) * Causal()
H2O = Diag(0, 2) + Diag(2, 6) * Dynamic(budget=2, score=ops.attn_score().sum(dim=1), refresh=False)
POOLED = Diag(0, 2) + Diag(2, 6) * Dynamic(budget=2, score=ops.attn_score().sum(dim=1).sum(dim=0), refresh=False)
PROMPT = [[3, 17, 101, 42, 7, 9, 250, 33, 61, 5, 12, 90]]
NEW_TOKENS = 6
MAX_LEN = 32
#: transformers shards onto CUDA where there is a GPU (NCCL), onto the CPU (gloo) otherwise
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _generate(model: Any, pattern: Any, backend: str) -> dict[str, Any]:
    if pattern is not None:
        sas_attention(model, pattern, backend=backend, max_len=MAX_LEN)
    ids = torch.tensor(PROMPT, device=model.device)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False,
                             pad_token_id=0, return_dict_in_generate=True)
    cache = output_cache(out)
    res: dict[str, Any] = {"tokens": out.sequences[0].tolist()}
    if isinstance(cache, SASCache):
        res["kv_bytes"] = cache.kv_cache_bytes()
        res["kv_heads"] = int(cache.layers[0].keys.shape[1])
        tp = model.sas_state.tensor_parallel
        res["tp"] = None if tp is None else [tp.size, tp.rank, tp.local_q_heads, tp.local_kv_heads]
    return res


def run_checks(model_dir: str, tp: int) -> dict[str, Any]:
    torch.manual_seed(0)
    results: dict[str, Any] = {}
    for name, pattern, backend in (("dense", None, ""), ("static", STATIC, "torch"), ("h2o", H2O, "triton")):
        model, _ = load_model(model_dir, tp=tp, attn_implementation="eager", device=DEVICE)
        results[name] = _generate(model, pattern, backend)
    model, _ = load_model(model_dir, tp=tp, attn_implementation="eager", device=DEVICE)
    try:
        sas_attention(model, POOLED, backend="triton", max_len=MAX_LEN)
        results["pooled"] = "accepted"
    except NotYetSupportedError as e:
        results["pooled"] = str(e)
    return results


def main(argv: list[str]) -> None:
    model_dir, out = argv
    tp = int(os.environ["WORLD_SIZE"])
    results = run_checks(model_dir, tp)
    if int(os.environ["RANK"]) == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    exit_rank(0)     # every rank: gloo's teardown at exit could abort


if __name__ == "__main__":
    main(sys.argv[1:])
