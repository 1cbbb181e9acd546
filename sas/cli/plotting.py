"""Figures for `sas plot`: the mask with its decomposition groups, and the KV-cache trace.

Panel (a) is the mask of the first W queries (rows) and keys (columns), the oracle
`pattern.to_mask(W)`, with the outline of every group of the analysis that meets the window
(paper Figures 9/10). Panel (b) is the KV-cache trace of queries [0, W): one row per slot,
each cell active (the query attends the key in the slot), inactive (the key is cached and
still needed later, but masked for this query) or empty (paper Figure 11).

The trace comes from the event simulator (`sas.analysis.events.simulate`). It is also
rebuilt from the synthesized functions (`mask_func`, `slot_key_func`, `last_use`); when the
two disagree on an active cell, or the pattern has no events (the per-token fallback), the
function trace is drawn and a warning says so.

The figure is written in the format its file name's extension names (`FIGURE_FORMATS`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import shapely
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from shapely.geometry.base import BaseGeometry

from sas.atomic_files import replace_file
from sas.analysis.events import ACTIVE, EMPTY, INACTIVE, simulate
from sas.errors import SASError
from sas.ir.polygons import mask_polygon

MAX_SLOTS = 256
STATE_COLORS = {EMPTY: "#ffffff", INACTIVE: "#f5b041", ACTIVE: "#1f618d"}
MASK_COLOR = "#aab7c4"
#: File extension -> the matplotlib format written for it (JPEG through pillow).
FIGURE_FORMATS = {".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg", ".svg": "svg", ".pdf": "pdf"}
GROUP_COLORS = ("#c0392b", "#27ae60", "#8e44ad", "#d35400", "#2980b9", "#16a085", "#7f8c8d",
                "#f1c40f", "#e84393", "#2c3e50")


# --- traces --------------------------------------------------------------------------------

def window_slots(analysis: Any, window: int, limit: int | None = MAX_SLOTS) -> np.ndarray:
    """The slots (sorted, at most `limit`) that keys 0..window-1 are written to: the only
    slots queries before `window` can see."""
    ids = np.asarray(analysis.cache_ids(min(window, analysis.max_len)))
    used = np.unique(ids[(ids >= 0) & (ids < analysis.cache_size)])
    return used if limit is None else used[:limit]


def trace_from_events(analysis: Any, window: int, slots: np.ndarray | None = None) -> np.ndarray:
    """state[row, query] for queries [0, window) from the cache events (Algorithm 1); row k
    is slot `slots[k]` (all slots when `slots` is None)."""
    w = min(window, analysis.max_len)
    ids = np.asarray(analysis.cache_ids(w))
    if slots is None:
        return simulate(analysis.events, ids, analysis.max_len, 0, w, analysis.cache_size)
    slots = np.asarray(slots, dtype=np.int64)
    if len(slots):   # simulate draws only the keys whose slot is a row in [0, len(slots))
        pos = np.minimum(np.searchsorted(slots, ids), len(slots) - 1)
        rows = np.where(slots[pos] == ids, pos, -1)
    else:
        rows = np.full_like(ids, -1)
    return simulate(analysis.events, rows, analysis.max_len, 0, w, len(slots))


def last_use(analysis: Any, keys: int) -> np.ndarray:
    """Last query (< max_len) attending each key 0..keys-1, -1 if none."""
    try:
        return np.asarray(analysis.last_use(np.arange(keys)), dtype=np.int64)
    except SASError:   # no periodic description: the per-token fallback is limited in length
        pass
    n, pattern = analysis.max_len, analysis.pattern
    cols = np.arange(keys, dtype=np.int64)[None, :]
    last = np.full(keys, -1, dtype=np.int64)
    step = max(1, (1 << 22) // max(1, keys))
    for r0 in range(0, n, step):
        rows = np.arange(r0, min(n, r0 + step), dtype=np.int64)[:, None]
        hit = np.asarray(pattern.evaluate(rows, cols), dtype=bool)
        any_hit = hit.any(axis=0)
        last = np.where(any_hit, r0 + hit.shape[0] - 1 - np.argmax(hit[::-1], axis=0), last)
    return last


def trace_from_functions(analysis: Any, window: int, slots: np.ndarray | None = None) -> np.ndarray:
    """state[row, query] from the synthesized functions: active when `mask_func(s, i)`,
    inactive when slot s holds a key still used by a query >= i, empty otherwise; row k is
    slot `slots[k]` (all slots when `slots` is None)."""
    w = min(window, analysis.max_len)
    slots = np.arange(analysis.cache_size) if slots is None else np.asarray(slots, dtype=np.int64)
    last = last_use(analysis, w)
    state = np.full((len(slots), w), EMPTY, dtype=np.int8)
    mask_func, slot_key_func = analysis.mask_func, analysis.slot_key_func
    for i in range(w):
        for row, s in enumerate(slots.tolist()):
            if mask_func(s, i):
                state[row, i] = ACTIVE
            else:
                k = slot_key_func(s, i)
                if 0 <= k <= i and last[k] >= i:
                    state[row, i] = INACTIVE
    return state


def kv_trace(analysis: Any, window: int, max_slots: int = MAX_SLOTS
             ) -> tuple[np.ndarray, np.ndarray, str, list[str]]:
    """(state[row, query], the slot of each row, where the trace came from, warnings).

    The rows are the slots that queries [0, window) can see (at most `max_slots`)."""
    slots = window_slots(analysis, window, max_slots)
    funcs = trace_from_functions(analysis, window, slots)
    if not analysis.events:
        return funcs, slots, "the synthesized functions", []
    events = trace_from_events(analysis, window, slots)
    bad = np.argwhere((events == ACTIVE) != (funcs == ACTIVE))
    if len(bad):
        row, i = (int(v) for v in bad[0])
        return funcs, slots, "the synthesized functions", [
            f"the event simulation disagrees with mask_func on {len(bad)} trace cell(s) (first: slot "
            f"{int(slots[row])}, query {i}); drawing the trace from the synthesized functions"]
    return events, slots, "the cache events", []


# --- geometry ------------------------------------------------------------------------------

def _rings(geom: BaseGeometry):
    for poly in getattr(geom, "geoms", [geom]):
        if poly.is_empty or not hasattr(poly, "exterior"):
            continue
        yield poly.exterior
        yield from poly.interiors


def group_regions(analysis: Any, mask: np.ndarray) -> list[tuple[Any, BaseGeometry, BaseGeometry]]:
    """(group, first occurrence clipped to the window, later occurrences in the window) for
    every group that meets the window. Later occurrences of a periodic group are the mask's
    cells in the group's key columns (the group repeats every `repeats` keys)."""
    w = mask.shape[0]
    frame = shapely.box(0, 0, w, w)
    j = np.arange(w)
    out = []
    for g in analysis.groups:
        first = g.polygon.intersection(frame) if not g.polygon.is_empty else g.polygon
        later: BaseGeometry = shapely.Polygon()
        if g.repeats and g.key_start + g.repeats < w:
            span = g.key_stop - g.key_start
            cols = (j >= g.key_start + g.repeats) & ((j - g.key_start) % g.repeats < span)
            later = mask_polygon(mask & cols[None, :])
        if first.is_empty and later.is_empty:
            continue
        out.append((g, first, later))
    return out


# --- figure --------------------------------------------------------------------------------

def _short(text: str, limit: int = 110) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def draw(pattern: Any, window: int, analysis: Any = None, state: np.ndarray | None = None,
         slots: np.ndarray | None = None, trace_source: str = "", reason: str = ""):
    """The matplotlib Figure (Agg canvas; no pyplot state). Without an analysis (a pattern
    that cannot be decoded) panel (b) says why instead of drawing a trace."""
    w = window
    mask = pattern.to_mask(w)

    fig = Figure(figsize=(14, 7.4), dpi=110, layout="constrained")
    ax_m, ax_t = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.0, 1.25]})

    ax_m.imshow(mask, cmap=ListedColormap(["#ffffff", MASK_COLOR]), vmin=0, vmax=1,
                extent=(0, w, w, 0), interpolation="nearest")
    handles = [Patch(facecolor=MASK_COLOR, label="attended (mask)")]
    regions = group_regions(analysis, mask) if analysis is not None else []
    for k, (g, first, later) in enumerate(regions):
        color = GROUP_COLORS[k % len(GROUP_COLORS)]
        for ring in _rings(first):
            xs, ys = ring.xy
            ax_m.fill(xs, ys, facecolor=color, alpha=0.25, edgecolor="none")
            ax_m.plot(xs, ys, color=color, linewidth=2.0)
        for ring in _rings(later):
            xs, ys = ring.xy
            ax_m.plot(xs, ys, color=color, linewidth=1.2, linestyle="--")
        rep = f", every {g.repeats} keys" if g.repeats else ""
        handles.append(Patch(facecolor=color, alpha=0.5, edgecolor=color,
                             label=f"group {g.index} ({g.kind}): keys [{g.key_start}, {g.key_stop}){rep}"))
    ax_m.set_xlim(0, w)
    ax_m.set_ylim(w, 0)
    ax_m.set_xlabel("key j")
    ax_m.set_ylabel("query i")
    sub = "(solid: first occurrence, dashed: repeats)" if regions else "(no decomposition groups)"
    ax_m.set_title(f"(a) mask of the first {w} x {w} and its groups\n{sub}", fontsize=10)
    ax_m.legend(handles=handles[:12], loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=2,
                fontsize=7, frameon=False)

    ax_t.set_xlim(0, w)
    ax_t.set_xlabel("query i")
    ax_t.set_ylabel("cache slot")
    if analysis is None:
        ax_t.text(0.5, 0.5, f"no KV-cache trace:\n{reason}", ha="center", va="center", wrap=True,
                  transform=ax_t.transAxes)
        ax_t.set_yticks([])
        ax_t.set_title("(b) KV-cache trace", fontsize=10)
        fig.suptitle(_short(repr(pattern)), fontsize=10)
        return fig

    rows = len(slots)
    total = len(window_slots(analysis, w, None))
    if rows:
        cmap = ListedColormap([STATE_COLORS[EMPTY], STATE_COLORS[INACTIVE], STATE_COLORS[ACTIVE]])
        ax_t.imshow(state, cmap=cmap, vmin=0, vmax=2, extent=(0, w, rows, 0), aspect="auto",
                    interpolation="nearest")
        for k in np.flatnonzero(np.diff(slots) != 1):   # slot numbers jump: mark the seam
            ax_t.axhline(k + 1, color="#555555", linewidth=0.6, linestyle=":")
        ticks = np.unique(np.linspace(0, rows - 1, min(rows, 9)).round().astype(int))
        ax_t.set_yticks(ticks + 0.5)
        ax_t.set_yticklabels([str(int(slots[t])) for t in ticks])
        ax_t.set_ylim(rows, 0)
    else:
        ax_t.text(0.5, 0.5, f"no key is cached before query {w}", ha="center", va="center",
                  transform=ax_t.transAxes)
    shown = f"{total} slots" if rows == total else f"first {rows} of {total} slots"
    ax_t.set_title(f"(b) KV-cache trace of queries 0..{w - 1}: the {shown} they use "
                   f"(cache: {analysis.cache_size})\n(from {trace_source})", fontsize=10)
    ax_t.legend(handles=[Patch(facecolor=STATE_COLORS[ACTIVE], label="active (attended)"),
                         Patch(facecolor=STATE_COLORS[INACTIVE], label="inactive (cached, masked)"),
                         Patch(facecolor=STATE_COLORS[EMPTY], edgecolor="#999999", label="empty")],
                loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=3, fontsize=7, frameon=False)

    form = "closed form" if analysis.closed_form else "no closed form"
    fig.suptitle(f"{_short(repr(pattern))}\nmax_len {analysis.max_len}: KV cache "
                 f"{analysis.cache_size} slots (dense {analysis.max_len}), scheme {analysis.scheme}, {form}",
                 fontsize=10)
    return fig


def figure_format(output: str | os.PathLike) -> str:
    """The format `output`'s extension names (`FIGURE_FORMATS`); SASError for any other."""
    suffix = Path(output).suffix.lower()
    if suffix not in FIGURE_FORMATS:
        valid = ", ".join(FIGURE_FORMATS)
        got = f"the extension {Path(output).suffix!r}" if suffix else "no extension"
        raise SASError(f"cannot tell the image format of {os.fspath(output)!r} ({got}); "
                       f"give a file name ending in one of {valid}")
    return FIGURE_FORMATS[suffix]


def write_figure(fig: Any, output: str | os.PathLike) -> None:
    """Save in the format of `output`'s extension to a temporary file beside it, then rename
    it into place."""
    fmt = figure_format(output)
    replace_file(output, lambda tmp: fig.savefig(tmp, format=fmt))


def plot_analysis(analysis: Any, output: str | os.PathLike, window: int = 64) -> dict[str, Any]:
    """Draw panels (a) and (b) for `analysis` into the image `output`; returns what was drawn."""
    w = min(window, analysis.max_len)
    state, slots, source, warnings = kv_trace(analysis, w)
    _save(draw(analysis.pattern, w, analysis, state, slots, source), output)
    return {"window": w, "slots_drawn": int(len(slots)), "slots_used": int(len(window_slots(analysis, w, None))),
            "trace_source": source, "warnings": warnings}


def plot_mask_only(pattern: Any, output: str | os.PathLike, window: int, reason: str) -> dict[str, Any]:
    """Panel (a) without groups and panel (b) saying why there is no trace (`reason`)."""
    _save(draw(pattern, window, reason=reason), output)
    return {"window": window, "slots_drawn": 0, "slots_used": 0, "trace_source": None, "warnings": [reason]}


def _save(fig: Any, output: str | os.PathLike) -> None:
    try:
        write_figure(fig, output)
    except OSError as e:
        raise SASError(f"cannot write {output}: {e.strerror or e}") from None
