"""The `sas` command line: `inspect`, `plot` and `compile` a pattern script.

A pattern script is a `.py` file that defines the variable `pattern`, or a `.sas` text file
(`sas.lang.loader.load_pattern` reads both). Every `sas.errors.SASError` and every bad option
value is reported as one `error: <message>` line on stderr with exit code 2, never as a
traceback; an exception of any other type is a bug in sas and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Iterator, NoReturn

import click
import numpy as np

from sas.analysis.analyze import analyze
from sas.cli.empty_rows import EmptyRows, empty_rows
from sas.errors import AnalysisError, EmptyPatternError, SASError
from sas.lang.loader import load_pattern
from sas.lang.ops import Fraction
from sas.lang.pattern import Not
from sas.lang.primitives import Rect

# Imported where used, so that `sas inspect` of a static pattern never loads torch:
# sas.plan / sas.dynamic (torch.fx), sas.cli.plotting (matplotlib), sas.codegen.compile (the
# kernel extras).

DEFAULT_MAX_LEN = 16384
DEFAULT_WINDOW = 64
MAX_WINDOW = 4096
#: The longest --max-len: 2**40 tokens (the static analysis works in int64 with room to spare).
MAX_LEN = 1 << 40
FALLBACK_BACKENDS = ("triton", "cuda", "nki")   # = sas.codegen.compile.BACKENDS, without importing torch
_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_LENGTH_FORMS = "a positive integer, optionally with a K, M or G suffix (16384, 16K, 1M)"
#: click >= 8.2 reports a bare `sas` as this usage error, shown as the help text: keep it so
_HELP_FOR_NO_ARGS = getattr(click.exceptions, "NoArgsIsHelpError", ())


class CLIError(click.ClickException):
    """A user error: printed as one `error: <message>` line on stderr, exit code 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        message = " ".join(line.strip() for line in self.format_message().splitlines() if line.strip())
        click.echo(f"error: {message}", err=True, file=file)


def _usage_error(e: click.UsageError) -> CLIError:
    """click's multi-line usage report (usage, hint, message) as one line."""
    command = e.ctx.command_path if e.ctx is not None else "sas"
    message = e.format_message().rstrip(".")
    return CLIError(f"{message[:1].lower()}{message[1:]} (see `{command} --help`)")


def _user_error(e: click.UsageError | SASError | MemoryError) -> click.ClickException:
    """What to show for an exception caused by the user's input (any other type is a bug
    and keeps its traceback)."""
    if isinstance(e, (CLIError, _HELP_FOR_NO_ARGS)):
        return e
    if isinstance(e, click.UsageError):
        return _usage_error(e)
    if isinstance(e, MemoryError):   # a size the machine cannot hold: say so, not a traceback
        return CLIError(f"out of memory: {e or 'MemoryError'} (the pattern's sizes or --max-len need more "
                        f"memory than this machine has)")
    return CLIError(str(e))


#: optional packages the commands import, and the extra of pyproject.toml that installs each
_EXTRA_OF = {"torch": "kernels", "triton": "kernels", "transformers": "models", "gguf": "models",
             "accelerate": "models", "safetensors": "models", "tqdm": "models"}
#: commands that run a model: they need both extras
_MODEL_COMMANDS = frozenset({"generate", "eval", "train", "calibrate", "align"})


def _missing_extra(e: ModuleNotFoundError, command: str | None) -> CLIError | None:
    """A missing optional dependency as a one-line error saying which extra installs it (None for
    any other missing module: a bug, which keeps its traceback)."""
    top = (e.name or "").split(".")[0]
    if top not in _EXTRA_OF:
        return None
    extras = "kernels,models" if command in _MODEL_COMMANDS else _EXTRA_OF[top]
    return CLIError(f"`sas {command}` needs the Python package {top!r}, which is not installed; "
                    f"install the extras: pip install 'sas[{extras}]'")


class _SASGroup(click.Group):
    """Turns every user error raised while parsing or running a command into a `CLIError`."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except (click.UsageError, SASError) as e:
            raise _user_error(e) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.UsageError, SASError, MemoryError) as e:
            raise _user_error(e) from None
        except ModuleNotFoundError as e:
            error = _missing_extra(e, ctx.invoked_subcommand)
            if error is None:
                raise
            raise error from None


def parse_length(text: str | int, what: str = "--max-len") -> int:
    """'16384', '16K', '1M' (binary multiples: K = 1024) -> an int in [1, MAX_LEN]; CLIError otherwise."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = re.fullmatch(r"\s*(\d{1,30})\s*([kKmMgG]?)\s*", str(text))
        if not m:
            shown = str(text) if len(str(text)) <= 40 else str(text)[:37] + "..."
            raise CLIError(f"{what} must be {_LENGTH_FORMS}, got {shown!r}")
        value = int(m.group(1)) * _SUFFIXES[m.group(2).upper()]
    if not 1 <= value <= MAX_LEN:
        raise CLIError(f"{what} must be a positive integer no larger than 2**40 = {MAX_LEN} (1048576M), "
                       f"got {text!r}" + (f" = {value}" if str(value) != str(text).strip() else ""))
    return value


class LengthType(click.ParamType):
    """A token count: a positive integer with an optional K (x1024) or M (x1024^2) suffix."""

    name = "N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        what = param.opts[0] if param is not None and param.opts else "value"
        return parse_length(value, what)


LENGTH = LengthType()


def _positive_int(what: str, value: int, upper: int | None = None) -> int:
    if value <= 0 or (upper is not None and value > upper):
        limit = f" and at most {upper}" if upper is not None else ""
        raise CLIError(f"{what} must be a positive integer{limit}, got {value}")
    return value


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send what runs meanwhile prints to stdout to stderr instead (Python's sys.stdout and,
    when it is the process's own, file descriptor 1), so that stdout holds only sas's output
    (`--json` stays JSON when a pattern script prints)."""
    sys.stdout.flush()
    try:
        fd_level = sys.stdout.fileno() == 1 and sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):   # captured streams
        fd_level = False
    saved = os.dup(1) if fd_level else None
    try:
        if saved is not None:
            os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


def load(path: str) -> Any:
    """The pattern defined by a `.py` script (variable `pattern`) or a `.sas` file; what a
    script prints goes to stderr."""
    p = Path(path)
    if not p.exists():
        raise CLIError(f"pattern file not found: {path}")
    if p.is_dir():
        raise CLIError(f"{path} is a folder; give a pattern script (.py) or a .sas file")
    notes: list[str] = []
    try:
        with _stdout_to_stderr():
            pattern = load_pattern(p, notes=notes)
    except OSError as e:
        raise CLIError(f"cannot read {path}: {e.strerror or e}") from None
    for note in notes:
        click.echo(f"note: {note}", err=True)
    return pattern


def _analyze(pattern: Any, max_len: int) -> Any:
    return analyze(pattern, max_len=max_len)


# --- inspect -------------------------------------------------------------------------------

_TABLE_LINE = re.compile(r"^([A-Za-z_][A-Za-z_0-9]*) = \((.*)\)$")


def abbreviate_tables(source: str, keep: int = 8, longer_than: int = 160) -> str:
    """Shorten module-level table literals (`NAME = (0, 1, ...)`) of the table fallback."""
    out = []
    for line in source.splitlines():
        m = _TABLE_LINE.match(line)
        if m and len(line) > longer_than:
            items = m.group(2).split(", ")
            out.append(f"{m.group(1)} = ({', '.join(items[:keep])}, ...)  "
                       f"# {len(items)} entries; `sas inspect --json` prints them all")
        else:
            out.append(line)
    return "\n".join(out)


def _ratio(cache: int, dense: int) -> str:
    if cache >= dense:
        return "no reduction"
    return f"{dense / cache:.1f}x smaller, {100.0 * (1 - cache / dense):.1f}% saved"


def format_inspect(a: Any, synthesized: bool = False) -> str:
    """The human-readable report of an `Analysis` (`synthesized`: the functions as built,
    else simplified for reading)."""
    lines = [
        f"pattern:      {a.pattern!r}",
        f"max_len:      {a.max_len}",
        f"KV cache:     {a.cache_size} slots (dense: {a.max_len}; {_ratio(a.cache_size, a.max_len)})",
    ]
    minimal = getattr(a, "minimal_cache_size", None)
    if minimal is not None:
        lines.append(f"minimal:      {minimal} slots (no closed form fits them; the smallest closed form needs "
                     f"+{a.cache_size - minimal})")
    lines += _analysis_body(a, synthesized)
    return "\n".join(lines) + "\n"


def _analysis_body(a: Any, synthesized: bool = False) -> list[str]:
    """Everything `format_inspect` prints after the KV-cache line."""
    s = a.structure
    lines: list[str] = []
    if getattr(a, "peak_query", None) is not None:       # (query 0 is a peak too)
        lines.append(f"peak at:      query {a.peak_query}")
    form = "closed form" if a.closed_form else "per-token table, no closed form"
    lines.append(f"slot scheme:  {a.scheme} ({form})")
    if s.periodic:
        lines.append(f"structure:    periodic: key period P={s.P} after boundary T={s.T}; columns repeat "
                     f"every {s.Qv} row(s) from row offset {s.Dv}")
    else:
        lines.append("structure:    no known period (analysed per token)")
    lines.append("")
    lines.append(f"notes ({len(a.notes)}):")
    lines += [f"  - {n}" for n in a.notes] or ["  (none)"]
    lines.append("")
    lines.append(f"groups ({len(a.groups)}):")
    lines += [f"  {g.describe()}" for g in a.groups] or ["  (none: no periodic decomposition)"]
    lines.append("")
    lines.append(f"cache events ({len(a.events)}):")
    lines += [f"  {e.describe()}" for e in a.events] or ["  (none: no periodic decomposition)"]
    lines.append("")
    if synthesized:
        lines.append("synthesized functions (as built, unsimplified):")
        source = a.source
    else:
        r = a.readable
        lines.append(f"synthesized functions ({r.note}; --synthesized prints them as built):")
        source = r.source
    lines.append("")
    lines += ["    " + ln if ln else "" for ln in abbreviate_tables(source).splitlines()]
    return lines


# --- inspect, patterns with a Dynamic component -------------------------------------------

@dataclass
class DynamicInspection:
    """What `sas inspect` derives for a pattern with a Dynamic component.

    `plan` is the split of `sas.dynamic.plan_dynamic`; `static` the static analysis of
    `plan.static` (None when the static part is empty: 0 static slots); `bound` the analysis of
    the whole pattern, the Dynamic read as its full region (the region-as-static upper bound);
    `fusion` the fusion plan of the traced score graph.
    """

    pattern: Any
    max_len: int
    plan: Any
    static: Any
    bound: Any
    fusion: Any
    #: the run-time layout (`sas.dynamic.cache_plan.DynamicCachePlan`), or why there is none
    runtime: Any = None
    runtime_error: str | None = None

    @property
    def static_cache_size(self) -> int:
        return self.static.cache_size if self.static is not None else 0

    @property
    def cache_size(self) -> int:
        """Slots the decode cache needs: static + budget (H2O); refresh=True keeps every
        candidate cached, which is the region bound."""
        if self.plan.refresh:
            return self.bound.cache_size
        return self.static_cache_size + self.budget_keys

    @property
    def dynamic_cache_size(self) -> int:
        return self.cache_size - self.static_cache_size

    @property
    def budget_keys(self) -> int:
        """Keys the Dynamic selects a step at most: its budget, or for a run-time budget
        (`ops.fraction`) its count over the region's largest candidate set."""
        budget = self.plan.budget
        return budget.keys(self.bound.cache_size) if isinstance(budget, Fraction) else budget

    @property
    def loaded_per_step(self) -> int:
        """Cached keys a decode query may read at most: the static slots and `budget` selected ones."""
        return self.static_cache_size + self.budget_keys

    def notes(self) -> list[str]:
        plan, out = self.plan, []
        if plan.refresh:
            out.append(f"refresh=True: no candidate is ever evicted, so the cache holds the whole region "
                       f"(the region bound, {self.bound.cache_size} slots); each decode query loads the "
                       f"{plan.budget} candidates with the highest accumulated score")
        else:
            out.append(f"H2O (refresh=False): the dynamic cache holds {plan.budget} keys (the budget) between "
                       f"decode steps, plus the keys entering the region while a step runs")
            if self.cache_size > self.bound.cache_size:
                out.append(f"static + budget ({self.cache_size}) exceeds the region bound "
                           f"({self.bound.cache_size}): within max_len={self.max_len} the region never holds "
                           f"{plan.budget} candidates beside the static keys")
        if self.static is None:
            out.append("the static part is empty: every cached key is chosen by the Dynamic component")
        if plan.capacity is None:
            out.append("the dynamic region is unbounded: its candidates grow with the sequence length")
        return out

    def report(self) -> dict[str, Any]:
        plan, sg = self.plan, self.plan.score
        split = dict(plan.report())
        split.update({"component": repr(plan.dynamic), "full": repr(plan.full),
                      "policy": "refresh" if plan.refresh else "h2o"})
        fusion = dict(self.fusion.report())
        fusion["summary"] = self.fusion.summary()
        return {
            "pattern": repr(self.pattern),
            "max_len": self.max_len,
            "dynamic": True,
            "cache_size": self.cache_size,
            "static_cache_size": self.static_cache_size,
            "dynamic_cache_size": self.dynamic_cache_size,
            "loaded_per_step": self.loaded_per_step,
            "dense_cache_size": self.max_len,
            "region_bound_cache_size": self.bound.cache_size,
            "kernel_cache": (dict(self.runtime.report(), cache_size=self.runtime.cache_size)
                             if self.runtime is not None else {"error": self.runtime_error}),
            "split": split,
            "score_graph": {
                "chain": repr(sg.chain),
                "graph": str(sg.graph).strip("\n"),
                "code": _fx_code(sg),
                "nodes": [_fx_node(n) for n in sg.graph.nodes],
            },
            "fusion": fusion,
            "static_analysis": self.static.report() if self.static is not None else None,
            "region_bound_analysis": self.bound.report(),
            "notes": self.notes(),
        }


def _fx_code(sg: Any) -> str:
    return "\n".join(ln.rstrip() for ln in sg.code.strip("\n").splitlines()).strip("\n")


def _fx_node(n: Any) -> dict[str, Any]:
    return {"name": n.name, "op": n.op, "kind": n.meta.get("sas_kind"), "chain_op": n.meta.get("sas_op"),
            "fx": n.format_node()}


def _analyze_static(static: Any, max_len: int) -> Any:
    """`sas.analyze(static)`, or None when the static part is empty (0 static slots).

    `plan_dynamic` folds an empty static part (`Causal() * Dynamic(...)`) into `~Rect()`;
    `analyze` refuses a pattern that attends no key (`EmptyPatternError`), which is caught here
    and only here: every other analysis error is the user's.
    """
    if static == Not(Rect()):
        return None
    try:
        return _analyze(static, max_len)
    except EmptyPatternError:
        return None


def _make_plan(pattern: Any, max_len: int) -> Any:
    """`sas.plan.make_plan(pattern, max_len)`."""
    # Deferred: sas.plan imports torch (sas.dynamic traces score chains with torch.fx), which
    # `sas --help`, `sas plot` and the CLI's argument errors do not need.
    from sas.plan import make_plan

    return make_plan(pattern, max_len)


def inspect_dynamic(pattern: Any, max_len: int, plan: Any = None) -> DynamicInspection:
    """Split, static analysis, region bound and fusion plan of a pattern with a Dynamic
    (from its `sas.plan.Plan`, made here unless given)."""
    # Deferred with sas.plan (torch); see _make_plan.
    from sas.dynamic.fusion import analyze_fusion

    plan = plan if plan is not None else _make_plan(pattern, max_len)
    bound = _analyze(pattern, max_len)
    runtime, why = plan.dynamic, (str(plan.dynamic_error) if plan.dynamic_error is not None else None)
    # the run-time layout analyses the static part already; analyse it here only without one
    static = runtime.static_analysis if runtime is not None else _analyze_static(plan.split.static, max_len)
    return DynamicInspection(pattern, max_len, plan.split, static, bound, analyze_fusion(plan.split.score), runtime,
                             why)


def format_dynamic_inspect(d: DynamicInspection, synthesized: bool = False) -> str:
    """The human-readable report of a pattern with a Dynamic component."""
    plan, n = d.plan, d.max_len
    cap = (f"{plan.capacity} candidate keys at most at once" if plan.capacity is not None
           else "unbounded (the region's candidates grow with the sequence length)")
    policy = (f"True: every candidate stays cached; each decode query loads the {plan.budget} with the "
              f"highest accumulated score" if plan.refresh else
              f"False (H2O): at most {plan.budget} candidates held between steps; the lowest accumulated "
              f"score is evicted for good")
    lines = [
        f"pattern:      {d.pattern!r}",
        f"max_len:      {n}",
        f"KV cache:     {d.cache_size} slots = {d.static_cache_size} static + {d.dynamic_cache_size} dynamic "
        f"(dense: {n}; {_ratio(d.cache_size, n)})",
    ]
    if plan.refresh:
        lines.append(f"loaded:       {d.loaded_per_step} keys per decode query = {d.static_cache_size} static "
                     f"+ {plan.budget} selected (budget)")
    if d.runtime is not None:
        c = d.runtime
        entering = "the key" if c.max_entering == 1 else f"the up to {c.max_entering} keys"
        lines.append(f"kernel cache: {c.cache_size} slots = {c.static_size} static + {c.pool_size} pool "
                     f"(SASAttnKernel; the pool also holds {entering} entering its region during one decode step; "
                     f"score: {c.report()['score_path']})")
    else:
        lines.append(f"kernel cache: none: SASAttnKernel cannot run this pattern: {d.runtime_error}")
    lines += [
        f"region bound: {d.bound.cache_size} slots when the Dynamic region is cached as if static "
        f"(sas.analyze of the whole pattern; {_ratio(d.bound.cache_size, n)})",
        "",
        "dynamic split (sas.dynamic.plan_dynamic):",
        f"  component:  {plan.dynamic!r}",
        f"  static:     {'(empty)' if d.static is None else repr(plan.static)}",
        f"  region:     {plan.full!r}  (all of it: the static part is empty)" if d.static is None
        else f"  region:     {plan.region!r}",
        f"  budget:     {plan.budget}" + ("" if plan.budget_cap is None else
                                             f" (Dynamic(budget={plan.dynamic.budget}) clamped: within "
                                             f"max_len={plan.max_len} the region never holds more candidate "
                                             f"keys at once, so nothing is evicted)"),
        f"  refresh:    {policy}",
        f"  capacity:   {cap}",
        "",
        f"notes ({len(d.notes())}):",
    ]
    lines += [f"  - {x}" for x in d.notes()]
    lines += ["", f"score graph (torch.fx, traced from {plan.score.chain!r}):"]
    lines += ["    " + ln if ln else "" for ln in str(plan.score.graph).strip("\n").splitlines()]
    lines.append("")
    lines += ["    " + ln if ln else "" for ln in _fx_code(plan.score).splitlines()]
    lines += ["", "fusion plan (sas.dynamic.analyze_fusion):"]
    lines += ["  " + ln for ln in d.fusion.summary().splitlines()]
    lines.append("")
    if d.static is None:
        lines.append("static part: empty: 0 static slots, no static cache functions")
    else:
        a = d.static
        lines.append(f"static part analysis (sas.analyze({plan.static!r})):")
        lines.append(f"KV cache:     {a.cache_size} static slots (dense: {n}; {_ratio(a.cache_size, n)})")
        lines += _analysis_body(a, synthesized)
    return "\n".join(lines) + "\n"


# --- commands ------------------------------------------------------------------------------

def _version() -> str:
    try:
        return version("sas")
    except PackageNotFoundError:   # running from a source tree that is not installed
        return "unknown"


@click.group(cls=_SASGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(_version(), "--version", prog_name="sas")
def cli() -> None:
    """sas: the sparse attention synthesizer.

    PATTERN is a Python script that defines the variable `pattern` (see examples/) or a
    `.sas` text file. Lengths accept K, M and G suffixes (16K = 16384, 1M = 1048576), up to
    2**40.

    \b
    Examples:
      sas inspect examples/streaming_llm.py --max-len 16K
      sas plot examples/strided_block_local.py -o out/strided_block_local.png
      sas compile examples/sliding_window.py --backend triton -o build/sliding_window
    """


_max_len_option = click.option(
    "--max-len", type=LENGTH, default=str(DEFAULT_MAX_LEN), show_default=True, metavar="N",
    help="Longest sequence (tokens) the KV cache is sized for; accepts 16K, 1M.")


@cli.command(short_help="Print the KV-cache size, groups, events and synthesized functions.")
@click.argument("pattern", metavar="PATTERN")
@_max_len_option
@click.option("--json", "as_json", is_flag=True, help="Print the full analysis report as JSON.")
@click.option("--synthesized", is_flag=True,
              help="Print the functions as synthesized (what the kernels are built from), not simplified.")
def inspect(pattern: str, max_len: int, as_json: bool, synthesized: bool) -> None:
    """Print what the static analysis derives for PATTERN.

    The minimal KV-cache size (against the dense cache of max_len slots), the slot scheme
    and whether it is a closed form, notes, the periodic structure, the decomposition
    groups, the cache events and the Python source of the synthesized cache_id_func,
    slot_key_func and mask_func. Decoding needs a causal pattern.

    With a Dynamic component: the split into static part and dynamic region, the cache as
    static slots + budget (next to the region-as-static bound), the traced torch.fx score
    graph and its fusion plan, then the static part's analysis.
    """
    p = load(pattern)
    if _has_dynamic(p):
        d = inspect_dynamic(p, max_len)
        empty = empty_rows(p, max_len, d.bound.structure)
        if as_json:
            click.echo(json.dumps({**d.report(), "queries_without_keys": empty.report()}, indent=2))
        else:
            click.echo(format_dynamic_inspect(d, synthesized), nl=False)
    else:
        analysis = _analyze(p, max_len)
        empty = empty_rows(p, max_len, analysis.structure)
        if as_json:
            readable = analysis.readable
            click.echo(json.dumps({**analysis.report(), "dynamic": False, "readable_source": readable.source,
                                   "readable_note": readable.note,
                                   "queries_without_keys": empty.report()}, indent=2))
        else:
            click.echo(format_inspect(analysis, synthesized), nl=False)
    _warn_empty_rows(empty)


def _warn_empty_rows(empty: EmptyRows) -> None:
    """A `warning:` line on stderr when some queries attend no key."""
    if empty.count:
        click.echo(f"warning: {empty.describe()}", err=True)


def _has_dynamic(pattern: Any) -> bool:
    dynamics = getattr(pattern, "dynamics", None)
    return bool(dynamics()) if callable(dynamics) else False


@cli.command(short_help="Draw the mask with its groups and the KV-cache trace (PNG, JPEG, SVG, PDF).")
@click.argument("pattern", metavar="PATTERN")
@click.option("-o", "--output", required=True, metavar="FILE",
              help="Image to write, in the format of its extension: .png, .jpg/.jpeg, .svg or .pdf "
                   "(folders are created; replaced atomically).")
@_max_len_option
@click.option("--window", "-w", type=int, default=DEFAULT_WINDOW, show_default=True, metavar="W",
              help=f"Draw the first W queries and keys (at most {MAX_WINDOW}).")
def plot(pattern: str, output: str, max_len: int, window: int) -> None:
    """Draw PATTERN's mask with its groups and its KV-cache trace into an image.

    Left: the mask of the first W x W queries (rows) and keys (columns) with the outline
    of every decomposition group that meets the window (paper Figures 9/10). Right: the
    KV-cache trace of queries 0..W-1, one row per slot those queries use (at most 256
    drawn), colored active (attended), inactive (cached but masked) or empty (paper
    Figure 11). A non-causal pattern has no decode cache: only its mask is drawn.
    """
    from sas.cli.plotting import figure_format, plot_analysis, plot_mask_only   # matplotlib

    window = _positive_int("--window", window, MAX_WINDOW)
    if output.endswith(("/", "\\")) or Path(output).is_dir():
        raise CLIError(f"-o/--output must be a file name such as out/pattern.png, got the folder {output!r}")
    figure_format(output)   # refuse an extension it cannot write before any work
    p = load(pattern)
    try:
        analysis = _analyze(p, max_len)
    except AnalysisError as e:
        w = min(window, max_len)
        if not _upper_triangle(p, w):
            raise
        # A non-causal (prefill-only) pattern: its mask is still worth a figure.
        plot_mask_only(p, output, w, "the pattern is not causal, so it has no decode KV cache "
                                     "(multiply it by Causal())")
        click.echo(f"wrote {output}: window {w}, mask only")
        click.echo(f"warning: no KV-cache trace: {e}", err=True)
        return
    info = plot_analysis(analysis, output, window=window)
    click.echo(f"wrote {output}: window {info['window']}, trace of {info['slots_drawn']} slot(s) "
               f"(used in the window: {info['slots_used']}, cache: {analysis.cache_size}), "
               f"from {info['trace_source']}")
    for w in info["warnings"]:
        click.echo(f"warning: {w}", err=True)


def _upper_triangle(pattern: Any, w: int) -> bool:
    """Does the pattern attend a later key within the first w x w?"""
    return bool(np.triu(pattern.to_mask(w), 1).any())


def _backends() -> tuple[str, ...]:
    try:
        from sas.codegen.compile import BACKENDS   # the kernel extras may be missing
    except ImportError:
        return FALLBACK_BACKENDS
    return tuple(BACKENDS)


@cli.command(name="compile", short_help="Generate kernel modules and a report into a folder.")
@click.argument("pattern", metavar="PATTERN")
@click.option("--backend", "-b", default="triton", show_default=True, metavar="NAME",
              help="Kernel backend (available: " + ", ".join(FALLBACK_BACKENDS) + ").")
@click.option("-o", "--output", required=True, metavar="DIR",
              help="Folder to write the kernel modules and report to: a new or empty folder, or one "
                   "sas compile wrote before (replaced as a whole); a symlink's target is written.")
@click.option("--force", is_flag=True,
              help="Replace DIR even when it holds files that sas compile did not write.")
@_max_len_option
@click.option("--head-dim", type=int, default=128, show_default=True, help="Attention head dimension.")
@click.option("--dtype", default="bfloat16", show_default=True,
              help="Element type: bfloat16, float16 or float32.")
def compile_(pattern: str, backend: str, output: str, force: bool, max_len: int, head_dim: int,
             dtype: str) -> None:
    """Generate kernels for PATTERN into the folder given by -o.

    --backend triton (the default): a Python package that runs with only torch and triton:
    __init__.py (the entry: prefill, and new_cache / fill_cache / decode), prefill.py,
    decode.py (causal patterns), plan.pt (the tile schedule for max_len and any tables),
    standalone.py and checks.py (its host code and argument checks), report.json and report.md
    (with usage); for a pattern with a Dynamic component static_decode.py, dynamic_decode.py,
    dynamic_host.py and graph_params.py instead of decode.py. --backend cuda: kernels.cu,
    loader.py (builds and loads it), report.json and report.md (docs/cuda.md). --backend nki:
    nki_kernels.py, nki_decode.py, README.md and report.json (docs/nki.md). The folder is
    written whole or not at all.

    An existing DIR is replaced only when it is empty or holds sas compile's own output (its
    report.json); any other folder needs --force. A symlink is kept and the folder it points
    to is written. The home folder and the current folder (or one holding it) are refused.
    """
    valid = _backends()
    if backend not in valid:
        raise CLIError(f"unknown backend {backend!r}; valid backends: {', '.join(valid)}")
    try:
        from sas.codegen.compile import check_output_folder, compile_pattern   # the kernel extras
    except ImportError as e:
        raise CLIError(f"the {backend} backend cannot be loaded (sas.codegen.compile: {e}); "
                       f"install the kernel extras: pip install 'sas[kernels]'") from None
    target = check_output_folder(output, force)   # before any work: refuse what it must not replace
    p = load(pattern)
    report = compile_pattern(p, output, backend=backend, max_len=max_len, head_dim=head_dim, dtype=dtype,
                             force=force)
    where = f"{output} (a symlink: wrote its target {target})" if Path(output).is_symlink() else output
    files = ", ".join(report.get("files", [])) if isinstance(report, dict) else ""
    click.echo(f"wrote {where}" + (f": {files}" if files else ""))
    if isinstance(report, dict) and report.get("dynamic"):
        click.echo(f"KV cache: {report['cache_size']} slots = {report['static_slots']} static + "
                   f"{report['pool_slots']} pool (dense: {report['dense_cache_size']})")
    elif isinstance(report, dict) and "cache_size" in report:
        click.echo(f"KV cache: {report['cache_size']} slots (dense: {report.get('dense_cache_size', max_len)})")


from sas.cli.model_commands import evaluate, generate  # noqa: E402  (`sas generate`, `sas eval`: docs/models.md)

cli.add_command(generate)
cli.add_command(evaluate)
from sas.cli.train_commands import train  # noqa: E402,I001  (`sas train`: Saap state, docs/cli.md)
cli.add_command(train)
from sas.cli.train_commands import align  # noqa: E402,I001  (`sas align`: SpecAttn layer alignment)
cli.add_command(align)
from sas.cli.train_commands import calibrate  # noqa: E402,I001  (`sas calibrate`: Kascade state, docs/kascade.md)
cli.add_command(calibrate)


def main(argv: list[str] | None = None) -> NoReturn:
    """Console entry point (`sas = sas.cli.main:main`)."""
    cli.main(args=argv, prog_name="sas")
    sys.exit(0)   # cli.main exits itself in standalone mode; this only satisfies NoReturn


if __name__ == "__main__":
    main()
