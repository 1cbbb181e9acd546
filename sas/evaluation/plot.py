"""`sas eval --plot out.png`: perplexity and KV-cache size per pattern, one bar per context.

Left: perplexity (log scale) with dense attention's as a dashed line per context; a pattern
whose perplexity is not finite (or that failed) gets a hatched stub labelled "n/a". Right:
KV-cache MiB of all layers (log scale), the dense cache dashed. Drawn on matplotlib's Agg
canvas (`matplotlib.figure.Figure`, no pyplot state), written atomically.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from sas.atomic_files import replace_file
from sas.evaluation.report import EvalReport, fmt_ppl

_COLORS = ("#1f618d", "#c0392b", "#27ae60", "#8e44ad", "#d35400", "#16a085")


def eval_figure(report: EvalReport) -> Figure:
    """The two-panel figure of an evaluation report."""
    names = list(dict.fromkeys(r.pattern for r in report.rows))
    contexts = list(dict.fromkeys(r.context for r in report.rows))
    by = {(r.pattern, r.context): r for r in report.rows}
    fig = Figure(figsize=(max(8.0, 1.4 * len(names) + 4), 4.8), layout="constrained")
    ax_p, ax_c = fig.subplots(1, 2)
    width = 0.8 / len(contexts)
    x = np.arange(len(names))
    finite = [r.ppl for r in report.rows if math.isfinite(r.ppl)] + \
             [r.dense_perplexity for r in report.rows if math.isfinite(r.dense_perplexity)]
    stub = min(finite) if finite else 1.0
    for k, c in enumerate(contexts):
        color = _COLORS[k % len(_COLORS)]
        off = x - 0.4 + width * (k + 0.5)
        rows = [by.get((n, c)) for n in names]
        ppl = [r.ppl if r is not None else math.nan for r in rows]
        ok = [math.isfinite(v) for v in ppl]
        ax_p.bar(off[ok], np.asarray(ppl)[ok], width, color=color, label=f"context {c}")
        for xi, v, good in zip(off, ppl, ok):
            if good:
                ax_p.annotate(fmt_ppl(v), (xi, v), ha="center", va="bottom", fontsize=7, rotation=90,
                              xytext=(0, 2), textcoords="offset points")
            else:
                ax_p.bar([xi], [stub], width, color="white", edgecolor=color, hatch="//")
                ax_p.annotate("n/a", (xi, stub), ha="center", va="bottom", fontsize=7)
        dense = next((r.dense_perplexity for r in rows if r is not None), math.nan)
        if math.isfinite(dense):
            ax_p.axhline(dense, color=color, linestyle="--", linewidth=0.8)
        mib = [r.cache.compact / 2**20 if r is not None else 0.0 for r in rows]
        ax_c.bar(off, mib, width, color=color, label=f"context {c}")
        dense_mib = next((r.cache.dense / 2**20 for r in rows if r is not None), None)
        if dense_mib:
            ax_c.axhline(dense_mib, color=color, linestyle="--", linewidth=0.8)
    for ax in (ax_p, ax_c):
        ax.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    ax_p.set_title("perplexity (dashed: dense attention)", fontsize=10)
    ax_c.set_title("KV cache, all layers, MiB (dashed: dense cache)", fontsize=10)
    fig.suptitle(f"{report.model or 'model'}: sas patterns ({report.settings.get('tokens')} tokens of "
                 f"{report.corpus.get('source', 'text').split(' ')[0]})", fontsize=10)
    return fig


def write_eval_plot(report: EvalReport, output: str | os.PathLike[str]) -> Path:
    """Draw `report` into the PNG file `output` (folders created; replaced atomically)."""
    fig = eval_figure(report)
    return replace_file(output, lambda tmp: fig.savefig(tmp, format="png", dpi=120))


__all__ = ["eval_figure", "write_eval_plot"]
