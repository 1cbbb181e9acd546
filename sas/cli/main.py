"""The `sas` command line: `inspect`, `plot` and `compile` a pattern script.

A pattern script is a `.py` file that defines the variable `pattern`, or a `.sas` text file
(`sas.lang.loader.load_pattern` reads both). Every `sas.errors.SASError` is reported as one
`error: <message>` line on stderr with exit code 2, never as a traceback.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from sas.errors import SASError

DEFAULT_MAX_LEN = 16384
DEFAULT_WINDOW = 64
MAX_WINDOW = 4096
FALLBACK_BACKENDS = ("triton",)
_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


class CLIError(click.ClickException):
    """A user error: printed as `error: <message>` on stderr, exit code 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True, file=file)


class _SASGroup(click.Group):
    """Turns every `SASError` raised by a command into a `CLIError`."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SASError as e:
            raise CLIError(str(e)) from None


def parse_length(text: str | int, what: str = "--max-len") -> int:
    """'16384', '16K', '1M' (binary multiples: K = 1024) -> a positive int; CLIError otherwise."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)\s*", str(text))
        if not m:
            raise CLIError(f"{what} must be a positive integer, optionally with a K or M suffix "
                           f"(16384, 16K, 1M), got {text!r}")
        value = int(m.group(1)) * _SUFFIXES[m.group(2).upper()]
    if value <= 0:
        raise CLIError(f"{what} must be a positive integer, optionally with a K or M suffix "
                       f"(16384, 16K, 1M), got {text!r}")
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


def load(path: str) -> Any:
    """The pattern defined by a `.py` script (variable `pattern`) or a `.sas` file."""
    p = Path(path)
    if not p.exists():
        raise CLIError(f"pattern file not found: {path}")
    if p.is_dir():
        raise CLIError(f"{path} is a folder; give a pattern script (.py) or a .sas file")
    try:
        from sas.lang.loader import load_pattern
    except ImportError as e:   # the loader ships with the .sas front-end
        raise CLIError(f"the pattern loader is not available ({e})") from None
    try:
        return load_pattern(p)
    except OSError as e:
        raise CLIError(f"cannot read {path}: {e.strerror or e}") from None


def _analyze(pattern: Any, max_len: int) -> Any:
    from sas import analyze

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


def format_inspect(a: Any) -> str:
    """The human-readable report of an `Analysis`."""
    s = a.structure
    lines = [
        f"pattern:      {a.pattern!r}",
        f"max_len:      {a.max_len}",
        f"KV cache:     {a.cache_size} slots (dense: {a.max_len}; {_ratio(a.cache_size, a.max_len)})",
    ]
    if getattr(a, "peak_query", 0):
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
    lines.append("synthesized functions:")
    lines.append("")
    lines += ["    " + ln if ln else "" for ln in abbreviate_tables(a.source).splitlines()]
    return "\n".join(lines) + "\n"


# --- commands ------------------------------------------------------------------------------

def _version() -> str:
    try:
        from importlib.metadata import version

        return version("sas")
    except Exception:   # running from a source tree that is not installed
        return "unknown"


@click.group(cls=_SASGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(_version(), "--version", prog_name="sas")
def cli() -> None:
    """sas: the sparse attention synthesizer.

    PATTERN is a Python script that defines the variable `pattern` (see examples/) or a
    `.sas` text file. Lengths accept K and M suffixes (16K = 16384, 1M = 1048576).

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
def inspect(pattern: str, max_len: int, as_json: bool) -> None:
    """Print what the static analysis derives for PATTERN.

    The minimal KV-cache size (against the dense cache of max_len slots), the slot scheme
    and whether it is a closed form, notes, the periodic structure, the decomposition
    groups, the cache events and the Python source of the synthesized cache_id_func,
    slot_key_func and mask_func. Decoding needs a causal pattern.
    """
    analysis = _analyze(load(pattern), max_len)
    if as_json:
        click.echo(json.dumps(analysis.report(), indent=2))
    else:
        click.echo(format_inspect(analysis), nl=False)


@cli.command(short_help="Draw the mask with its groups and the KV-cache trace as a PNG.")
@click.argument("pattern", metavar="PATTERN")
@click.option("-o", "--output", required=True, metavar="FILE.png",
              help="PNG file to write (folders are created; replaced atomically).")
@_max_len_option
@click.option("--window", "-w", type=int, default=DEFAULT_WINDOW, show_default=True, metavar="W",
              help=f"Draw the first W queries and keys (at most {MAX_WINDOW}).")
def plot(pattern: str, output: str, max_len: int, window: int) -> None:
    """Draw PATTERN's mask with its groups and its KV-cache trace as a PNG.

    Left: the mask of the first W x W queries (rows) and keys (columns) with the outline
    of every decomposition group that meets the window (paper Figures 9/10). Right: the
    KV-cache trace of queries 0..W-1, one row per slot those queries use (at most 256
    drawn), colored active (attended), inactive (cached but masked) or empty (paper
    Figure 11). A non-causal pattern has no decode cache: only its mask is drawn.
    """
    from sas.cli.plotting import plot_analysis, plot_mask_only
    from sas.errors import AnalysisError

    window = _positive_int("--window", window, MAX_WINDOW)
    if output.endswith(("/", "\\")) or Path(output).is_dir():
        raise CLIError(f"-o/--output must be a file name such as out/pattern.png, got the folder {output!r}")
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
    import numpy as np

    return bool(np.triu(pattern.to_mask(w), 1).any())


def _backends() -> tuple[str, ...]:
    try:
        from sas.codegen.compile import BACKENDS
    except Exception:
        return FALLBACK_BACKENDS
    return tuple(BACKENDS)


@cli.command(name="compile", short_help="Generate kernel modules and a report into a folder.")
@click.argument("pattern", metavar="PATTERN")
@click.option("--backend", "-b", default="triton", show_default=True, metavar="NAME",
              help="Kernel backend (available: " + ", ".join(FALLBACK_BACKENDS) + ").")
@click.option("-o", "--output", required=True, metavar="DIR",
              help="Folder to write the kernel modules and report to (replaced as a whole).")
@_max_len_option
@click.option("--head-dim", type=int, default=128, show_default=True, help="Attention head dimension.")
@click.option("--dtype", default="bfloat16", show_default=True,
              help="Element type: bfloat16, float16 or float32.")
def compile_(pattern: str, backend: str, output: str, max_len: int, head_dim: int, dtype: str) -> None:
    """Generate kernels for PATTERN into the folder given by -o.

    Writes prefill.py, decode.py (causal patterns), report.json and report.md. The folder
    is written whole or not at all.
    """
    valid = _backends()
    if backend not in valid:
        raise CLIError(f"unknown backend {backend!r}; valid backends: {', '.join(valid)}")
    p = load(pattern)
    try:
        from sas.codegen.compile import compile_pattern
    except ImportError as e:
        raise CLIError(f"the {backend} backend cannot be loaded (sas.codegen.compile: {e}); "
                       f"install the kernel extras: pip install 'sas[kernels]'") from None
    report = compile_pattern(p, output, backend=backend, max_len=max_len, head_dim=head_dim, dtype=dtype)
    files = ", ".join(report.get("files", [])) if isinstance(report, dict) else ""
    click.echo(f"wrote {output}" + (f": {files}" if files else ""))
    if isinstance(report, dict) and "cache_size" in report:
        click.echo(f"KV cache: {report['cache_size']} slots (dense: {report.get('dense_cache_size', max_len)})")


def main(argv: list[str] | None = None) -> NoReturn:
    """Console entry point (`sas = sas.cli.main:main`)."""
    cli.main(args=argv, prog_name="sas")
    sys.exit(0)   # cli.main exits itself in standalone mode; this only satisfies NoReturn


if __name__ == "__main__":
    main()
