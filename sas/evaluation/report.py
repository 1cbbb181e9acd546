"""Run patterns on a model at several contexts: perplexity against dense, KV-cache bytes and
passkey accuracy (what `sas eval` prints and `benchmarks/quality_models.py` writes).

Each sas pattern runs on its own deep copy of the model, patched with
`sas.integrations.transformers.sas_attention(copy, pattern, backend=..., max_len=...)`
(`max_len` = the longest context + the passkey's new tokens); "dense" is the model as
loaded, with transformers' own attention, and is always measured for the "vs dense" column.
"""

from __future__ import annotations

import copy
import json
import math
import platform
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable, Sequence

import torch
from tqdm.auto import tqdm

from sas.errors import SASError
from sas.integrations.backend_names import MODEL_BACKENDS
from sas.evaluation.cache_bytes import CacheBytes, PatternArg, kv_cache_bytes, layer_patterns
from sas.evaluation.coverage import EmptyRows, empty_rows
from sas.evaluation.passkey import (DEFAULT_DEPTHS, DEFAULT_NEW_TOKENS, PasskeyResult, accuracy, check_depth,
                                    passkey_jobs, run_passkey)
from sas.evaluation.perplexity import DEFAULT_DECODE_TOKENS, Perplexity, check_args, perplexity
from sas.evaluation.text import corpus_info, corpus_tokens
from sas.models import ModelError, ModelShape

DENSE = "dense"
BACKENDS = MODEL_BACKENDS

#: (model, pattern, backend=, max_len=) -> the patched model
Apply = Callable[..., Any]


@dataclass(frozen=True)
class EvalPattern:
    """A pattern to evaluate under a display name; `pattern` None is dense attention."""

    name: str
    pattern: PatternArg = None

    @property
    def dense(self) -> bool:
        return self.pattern is None


@dataclass(frozen=True)
class EvalRow:
    """One pattern at one context."""

    pattern: str
    context: int
    perplexity: Perplexity | None
    dense_perplexity: float
    cache: CacheBytes
    passkey: tuple[PasskeyResult, ...] = ()
    empty: tuple[EmptyRows, ...] = ()    # per layer pattern with empty rows at this context
    error: str | None = None

    @property
    def ppl(self) -> float:
        return self.perplexity.perplexity if self.perplexity is not None else math.nan

    @property
    def ppl_ratio(self) -> float:
        return self.ppl / self.dense_perplexity if self.dense_perplexity else math.nan

    @property
    def passkey_accuracy(self) -> float:
        return accuracy(self.passkey)

    def report(self) -> dict[str, Any]:
        return {
            "pattern": self.pattern, "context": self.context,
            "perplexity": _num(self.ppl), "dense_perplexity": _num(self.dense_perplexity),
            "perplexity_vs_dense": _num(self.ppl_ratio),
            "perplexity_detail": self.perplexity.report() if self.perplexity is not None else None,
            "kv_cache_bytes": self.cache.compact, "dense_kv_cache_bytes": self.cache.dense,
            "kv_cache_ratio": _num(self.cache.ratio),
            "passkey_accuracy": _num(self.passkey_accuracy) if self.passkey else None,
            "passkey": [r.report() for r in self.passkey],
            "queries_without_keys": sum(e.count for e in self.empty),
            "error": self.error,
        }


def _num(x: float) -> float | None:
    """JSON has no NaN/inf: None for a number that is not finite."""
    return x if math.isfinite(x) else None


@dataclass(frozen=True)
class EvalReport:
    model: str
    settings: dict[str, Any]
    rows: tuple[EvalRow, ...]
    warnings: tuple[str, ...] = ()
    corpus: dict[str, Any] = field(default_factory=dict)

    def report(self) -> dict[str, Any]:
        return {"model": self.model, "settings": self.settings, "corpus": self.corpus,
                "environment": {"python": platform.python_version(), "torch": torch.__version__,
                                "transformers": _transformers_version()},
                "rows": [r.report() for r in self.rows], "warnings": list(self.warnings)}

    def to_json(self) -> str:
        return json.dumps(self.report(), indent=2)

    def table(self) -> str:
        """A markdown table, one row per (pattern, context)."""
        head = ("| pattern | context | perplexity | vs dense | KV cache | dense KV cache | KV smaller by | "
                "passkey |\n|---|---:|---:|---:|---:|---:|---:|---:|")
        lines = [head]
        for r in self.rows:
            if r.error is not None:
                lines.append(f"| {r.pattern} | {r.context} | error | | {fmt_bytes(r.cache.compact)} | "
                             f"{fmt_bytes(r.cache.dense)} | {r.cache.ratio:.1f}x | |")
                continue
            pk = (f"{sum(p.retrieved for p in r.passkey)}/{len(r.passkey)}" if r.passkey else "-")
            lines.append(f"| {r.pattern} | {r.context} | {fmt_ppl(r.ppl)} | {fmt_ratio(r.ppl_ratio)} | "
                         f"{fmt_bytes(r.cache.compact)} | {fmt_bytes(r.cache.dense)} | {r.cache.ratio:.1f}x | {pk} |")
        return "\n".join(lines) + "\n"


def _transformers_version() -> str:
    try:
        return version("transformers")
    except PackageNotFoundError:   # not installed as a distribution (a source checkout)
        return "unknown"


def fmt_ppl(x: float) -> str:
    if not math.isfinite(x):
        return "nan" if math.isnan(x) else "inf"
    return f"{x:.3g}" if x >= 1e4 else f"{x:.2f}"


def fmt_ratio(x: float) -> str:
    if not math.isfinite(x):
        return "-"
    return f"{x:.2f}x" if x < 100 else f"{x:.3g}x"


def fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def default_apply(model: Any, pattern: PatternArg, *, backend: str, max_len: int) -> Any:
    """Patch `model` with `sas_attention` (imported here: the integration loads the kernel
    backends, which a dense-only evaluation does not need)."""
    from sas.integrations.transformers import sas_attention

    return sas_attention(model, pattern, backend=backend, max_len=max_len)


def check_contexts(contexts: Sequence[int]) -> list[int]:
    out = []
    for c in contexts:
        if isinstance(c, bool) or not isinstance(c, int) or c < 2:
            raise ModelError(f"context must be an integer of at least 2 tokens, got {c!r}")
        if c not in out:
            out.append(c)
    if not out:
        raise ModelError("give at least one context length")
    return out


def pattern_checks(patterns: Sequence[EvalPattern], contexts: Sequence[int], shape: ModelShape,
                   dtype: torch.dtype, warnings: list[str]) -> tuple[dict[str, dict[int, CacheBytes]],
                                                                      dict[str, dict[int, tuple[EmptyRows, ...]]]]:
    """KV-cache bytes and queries without keys of every pattern at every context, before any
    forward: a pattern the analysis refuses (not causal, a layer index out of range, ...)
    raises its `SASError` here. Appends a warning per pattern that leaves queries without keys."""
    names = [p.name for p in patterns]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise ModelError(f"pattern name {dup!r} is given twice; give each pattern once")
    caches: dict[str, dict[int, CacheBytes]] = {}
    empties: dict[str, dict[int, tuple[EmptyRows, ...]]] = {}
    for p in patterns:
        distinct = [q for q in dict.fromkeys(layer_patterns(p.pattern, shape.layers)) if q is not None]
        caches[p.name] = {c: kv_cache_bytes(p.pattern, c, shape, dtype) for c in contexts}
        empties[p.name] = {c: tuple(e for e in (empty_rows(q, c) for q in distinct) if e.count) for c in contexts}
        for c in contexts:
            for e in empties[p.name][c]:
                warnings.append(e.warning(p.name))
    return caches, empties


def evaluate_patterns(model: Any, tokenizer: Any, patterns: Sequence[EvalPattern], contexts: Sequence[int], *,
                      tokens: int | None = None, depths: Sequence[float] = DEFAULT_DEPTHS, trials: int = 1,
                      seed: int = 0, backend: str = "auto", mode: str = "prefill",
                      decode_tokens: int = DEFAULT_DECODE_TOKENS, passkey_new_tokens: int = DEFAULT_NEW_TOKENS,
                      passkey_batch: int = 8, model_name: str = "", progress: bool = True,
                      apply: Apply | None = None) -> EvalReport:
    """Perplexity (vs dense), KV-cache bytes and passkey accuracy of each pattern at each context.

    `tokens` is how much text is scored per context (default: the longest context; it must be
    at least every context). Every argument is checked before the first forward. A pattern
    the integration refuses (a `SASError`) gets a row with its error; the other patterns run.
    """
    contexts = check_contexts(contexts)
    tokens = max(contexts) if tokens is None else tokens
    for c in contexts:
        check_args(c, tokens, mode, decode_tokens)
    depths = [check_depth(d) for d in depths]
    if backend not in BACKENDS:
        raise ModelError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if not patterns:
        raise ModelError("give at least one pattern (or 'dense')")
    shape = ModelShape.of(model.config)
    dtype = next(model.parameters()).dtype
    apply = apply or default_apply
    max_len = max(contexts) + passkey_new_tokens
    warnings: list[str] = []
    if shape.max_positions and max(contexts) > shape.max_positions:
        warnings.append(f"context {max(contexts)} exceeds the model's {shape.max_positions} trained positions")
    caches, empties = pattern_checks(patterns, contexts, shape, dtype, warnings)
    if depths:      # the passkey arguments, and every real prompt fitting its context: before any forward
        for c in contexts:
            passkey_jobs(tokenizer, c, depths, trials=trials, seed=seed, max_new_tokens=passkey_new_tokens,
                         batch_size=passkey_batch)

    ids = corpus_tokens(tokenizer, tokens)
    units = (len(patterns) + (not any(p.dense for p in patterns))) * len(contexts)
    bar = tqdm(total=units, desc="sas eval", unit="run", disable=not progress, leave=False)
    dense_ppl: dict[int, Perplexity] = {}
    dense_passkey: dict[int, tuple[PasskeyResult, ...]] = {}
    try:
        want_dense_passkey = any(p.dense for p in patterns)
        for c in contexts:
            bar.set_postfix_str(f"dense @ {c}")
            dense_ppl[c] = perplexity(model, tokenizer, c, tokens=tokens, mode=mode, decode_tokens=decode_tokens,
                                      ids=ids)
            if want_dense_passkey and depths:
                dense_passkey[c] = tuple(run_passkey(model, tokenizer, c, depths, trials=trials, seed=seed,
                                                     max_new_tokens=passkey_new_tokens, batch_size=passkey_batch))
            bar.update(1)
        rows: list[EvalRow] = []
        for p in patterns:
            if p.dense:
                for c in contexts:
                    rows.append(EvalRow(p.name, c, dense_ppl[c], dense_ppl[c].perplexity, caches[p.name][c],
                                        dense_passkey.get(c, ())))
                continue
            rows += _pattern_rows(model, tokenizer, p, contexts, caches[p.name], empties[p.name], dense_ppl,
                                  warnings, bar,
                                  apply=apply, backend=backend, max_len=max_len, tokens=tokens, ids=ids, mode=mode,
                                  decode_tokens=decode_tokens, depths=depths, trials=trials, seed=seed,
                                  passkey_new_tokens=passkey_new_tokens, passkey_batch=passkey_batch)
    finally:
        bar.close()
    settings = {"contexts": contexts, "tokens": tokens, "mode": mode, "decode_tokens": decode_tokens,
                "passkey_depths": depths, "passkey_trials": trials, "passkey_new_tokens": passkey_new_tokens,
                "seed": seed, "backend": backend, "max_len": max_len, "dtype": str(dtype).removeprefix("torch."),
                "device": str(next(model.parameters()).device), "layers": shape.layers, "kv_heads": shape.kv_heads,
                "head_dim": shape.head_dim}
    return EvalReport(model_name, settings, tuple(rows), tuple(warnings), corpus_info().report())


def _pattern_rows(model: Any, tokenizer: Any, p: EvalPattern, contexts: list[int],
                  caches: dict[int, CacheBytes], empties: dict[int, tuple[EmptyRows, ...]],
                  dense_ppl: dict[int, Perplexity], warnings: list[str], bar: Any, *, apply: Apply, backend: str,
                  max_len: int, tokens: int, ids: list[int], mode: str, decode_tokens: int, depths: list[float],
                  trials: int, seed: int, passkey_new_tokens: int, passkey_batch: int) -> list[EvalRow]:
    try:
        patched = apply(copy.deepcopy(model), p.pattern, backend=backend, max_len=max_len)
    except SASError as e:
        warnings.append(f"{p.name}: {e}")
        bar.update(len(contexts))
        return [EvalRow(p.name, c, None, dense_ppl[c].perplexity, caches[c], empty=empties[c], error=str(e))
                for c in contexts]
    rows: list[EvalRow] = []
    try:
        for c in contexts:
            bar.set_postfix_str(f"{p.name} @ {c}")
            try:
                ppl = perplexity(patched, tokenizer, c, tokens=tokens, mode=mode, decode_tokens=decode_tokens,
                                 ids=ids)
                pk = tuple(run_passkey(patched, tokenizer, c, depths, trials=trials, seed=seed,
                                       max_new_tokens=passkey_new_tokens, batch_size=passkey_batch)) if depths else ()
            except SASError as e:
                warnings.append(f"{p.name} at context {c}: {e}")
                rows.append(EvalRow(p.name, c, None, dense_ppl[c].perplexity, caches[c], empty=empties[c],
                                    error=str(e)))
            else:
                rows.append(EvalRow(p.name, c, ppl, dense_ppl[c].perplexity, caches[c], pk, empties[c]))
            bar.update(1)
    finally:
        del patched
    return rows


__all__ = ["BACKENDS", "DENSE", "EvalPattern", "EvalReport", "EvalRow", "check_contexts", "default_apply",
           "evaluate_patterns", "fmt_bytes", "fmt_ppl", "fmt_ratio", "pattern_checks"]
