"""`analyze(pattern, max_len)`: the static KV-cache analysis of paper section 5."""

from __future__ import annotations

import ast
import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from sas.analysis.columns import ColumnShapes, column_shapes, estimated_runs, upper_triangle_clear
from sas.analysis.events import CacheEvent, derive_events
from sas.analysis.functions import compile_functions, synthesize, synthesized_source
from sas.analysis.simplify import ReadableFunctions, readable_functions
from sas.analysis.groups import Group, decompose
from sas.analysis.liveness import cache_size as _cache_size
from sas.analysis.per_token import last_use as per_token_last_use, non_causal_cell
from sas.analysis.slots import (PAD_FRACTION, PAD_SLOTS, RingScheme, Scheme, TableScheme, cache_ids, choose_scheme,
                                greedy_table, padded_scheme, padding_ok, ring_from_last_use, scheme_size)
from sas.errors import AnalysisError, AnalysisLimitError, EmptyPatternError
from sas.ir.periodicity import NON_PERIODIC, Structure, structure
from sas.lang.pattern import MAX_INDEX, Pattern
from sas.lang.primitives import Causal
from sas.limits import check_host_bytes, host_table_limit, positive_length

#: Up to this length a per-token table is preferred to a padded closed form (more slots than
#: the minimal cache) for periodic patterns without a minimal closed form; beyond it the padded
#: closed form is used when one exists. Tables themselves are built at any length (limited by
#: memory only: `sas.limits`).
TABLE_LIMIT = 1 << 15
#: A periodic padded closed form within 1/PAD_CLOSE_FRACTION of the minimal cache (or
#: PAD_CLOSE_SLOTS slots) is taken as it is; past that the keys' last uses are read (O(max_len))
#: for a smaller ring. Over 13000 fuzzed compositions at 2^20 that read found 4 slots fewer in
#: the median (of about a million) for 0.2 s more each.
PAD_CLOSE_FRACTION = 1024
PAD_CLOSE_SLOTS = 4
#: ... and past this max_len the periodic padded closed form is taken as it is too, so that the
#: analysis of a pattern with a closed form keeps memory and time that follow its cache, not
#: max_len (the read holds a few arrays of max_len entries: about 0.15 s and 100 MB at 2^20).
PAD_READ_MAX_LEN = 1 << 20
#: Column shapes estimated to need more runs than this (about a second of run algebra) are not
#: built: the per-token search comes first (usually tenths of a second at 2^20), and the shapes
#: only where it stops at its limit.
PER_TOKEN_FIRST_RUNS = 1 << 22
#: Host bytes per token of the table fallback: the last uses, the slot table and its sorted
#: copy (int64 each), and the tables the synthesized module holds.
TABLE_BYTES_PER_TOKEN = 48


def _check_table_bytes(pattern: Pattern, n: int, why: str = "") -> None:
    """Refuse a per-token slot table over the host limit, saying why the pattern needs one (`why`,
    e.g. a period too long for the periodic analysis) and the largest max_len the limit allows."""
    most = host_table_limit() // TABLE_BYTES_PER_TOKEN
    check_host_bytes(f"{why + ', so ' if why else ''}the per-token slot table of {pattern!r} at max_len={n}",
                     TABLE_BYTES_PER_TOKEN * n,
                     f"give a max_len of at most {most}, or raise SAS_HOST_TABLE_LIMIT")


def _host_allows(n: int) -> bool:
    """Whether the host may hold per-token arrays of max_len n (what `_check_table_bytes` checks)."""
    return TABLE_BYTES_PER_TOKEN * n <= host_table_limit()


@dataclass(frozen=True, eq=False)
class Analysis:
    pattern: Pattern
    max_len: int
    cache_size: int
    peak_query: int
    structure: Structure
    functions: ast.Module
    tables: dict[str, np.ndarray]
    scheme: str
    closed_form: bool
    notes: tuple[str, ...]
    cache_id_func: Callable[[int], int] = field(repr=False)
    slot_key_func: Callable[[int, int], int] = field(repr=False)
    mask_func: Callable[[int, int], bool] = field(repr=False)
    _scheme: Scheme = field(repr=False)
    _columns: ColumnShapes | None = field(repr=False)
    #: the minimal KV-cache size where the closed form in use needs more slots (None: equal)
    minimal_cache_size: int | None = None

    @functools.cached_property
    def groups(self) -> tuple[Group, ...]:
        """The periodic decomposition into groups (none for a per-token pattern), derived from the
        column shapes on first use: only `report()`, `sas inspect` and `sas plot` read it (up to a
        few seconds at 2^20 for nested spreads with a million column classes)."""
        return decompose(self._columns, self.max_len) if self._columns is not None else ()

    @functools.cached_property
    def events(self) -> tuple[CacheEvent, ...]:
        """The cache events of the periodic decomposition (empty for a per-token pattern), derived
        from the column shapes on first use: nothing the kernels or the synthesized functions need,
        so `analyze` does not pay for them (up to a few tenths of a second at 2^20 for patterns with
        a million column classes)."""
        return derive_events(self._columns) if self._columns is not None and self.cache_size > 0 else ()

    @functools.cached_property
    def source(self) -> str:
        """The synthesized functions as built (what the kernels are generated from), with the
        tables of a table scheme written out (as long as the sequence: computed on first use)."""
        return synthesized_source(self.functions, self.tables)

    @functools.cached_property
    def readable(self) -> ReadableFunctions:
        """The functions simplified with sympy for reading, checked equal to `functions`
        (`sas.analysis.simplify`); computed on first use."""
        s = self.structure
        boundary, period = (int(s.T or 0), int(s.P or 1)) if s.periodic else (0, 1)
        if not s.periodic and isinstance(self._scheme, RingScheme):     # a ring from per-token last uses
            boundary, period = self._scheme.keys.T, self._scheme.keys.P
        r = readable_functions(self.functions, closed_form=self.closed_form, max_len=self.max_len,
                               cache_size=self.cache_size, boundary=boundary, period=period)
        # a table scheme is printed as synthesized, its tables written out
        return r if self.closed_form else dataclasses.replace(r, source=self.source)

    # --- copying and pickling: the synthesized functions are compiled again from their AST ---------
    _FUNCTIONS = ("cache_id_func", "slot_key_func", "mask_func")

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in self._FUNCTIONS}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.update(compile_functions(state["functions"], tables=state["tables"]))

    def function_ast(self, name: str) -> ast.FunctionDef:
        for node in self.functions.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return node
        raise KeyError(name)

    def cache_ids(self, n: int | None = None) -> np.ndarray:
        """cache_id_func for tokens 0..n-1 (n <= max_len; None: max_len), computed in bulk."""
        if n is None:
            n = self.max_len
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= self.max_len:
            raise AnalysisError(f"cache_ids: n must be None or an integer in [0, max_len={self.max_len}] (tokens "
                                f"0 .. n-1; the analysis says nothing past max_len), got {n!r}")
        return cache_ids(self._scheme, int(n))

    def last_use(self, j: np.ndarray) -> np.ndarray:
        """Last query < max_len attending each key j (0 <= j < max_len), -1 when none does."""
        if self._columns is None:
            raise AnalysisError("last_use is only available for periodic patterns")
        arr = np.asarray(j)
        if arr.dtype.kind not in "iu" or (arr.size and not (0 <= arr.min() and arr.max() < self.max_len)):
            raise AnalysisError(f"last_use: j must be integer token ids in [0, max_len={self.max_len}), got {j!r}")
        return self._columns.last_use(arr.astype(np.int64), self.max_len)

    def report(self) -> dict[str, Any]:
        s = self.structure
        return {
            "pattern": repr(self.pattern),
            "max_len": self.max_len,
            "cache_size": self.cache_size,
            "minimal_cache_size": self.cache_size if self.minimal_cache_size is None else self.minimal_cache_size,
            "dense_cache_size": self.max_len,
            "peak_query": self.peak_query,
            "scheme": self.scheme,
            "closed_form": self.closed_form,
            "structure": {"periodic": s.periodic, "period": s.P, "boundary": s.T,
                          "vertical_period": s.Qv, "vertical_from": s.Dv},
            "groups": [g.describe() for g in self.groups],
            "events": [e.describe() for e in self.events],
            "group_records": [g.record() for g in self.groups],
            "event_records": [e.record() for e in self.events],
            "source": self.source,
            "notes": list(self.notes),
        }


def _check_len(max_len: Any) -> int:
    max_len = positive_length("analyze", max_len, AnalysisError)
    if max_len > MAX_INDEX:
        raise AnalysisError(f"max_len must be at most 2**61 (the largest index sas handles), got {max_len}")
    return int(max_len)


def _padded_note(name: str, minimal: int, size: int, n: int) -> str:
    return (f"none of the closed-form slot schemes sas searches fits the minimal cache of {minimal} slots; the "
            f"smallest closed form "
            f"found ({name}) uses {size} slots (+{size - minimal}, {100.0 * (size - minimal) / minimal:.1f}% more) "
            f"instead of a per-token table of {n} entries (a table is preferred up to max_len {TABLE_LIMIT}, a "
            f"closed form with at most 1/{PAD_FRACTION} or {PAD_SLOTS} more slots beyond)")


def _table_note(minimal: int, closed: int | None, n: int) -> str:
    why = "none of the closed-form slot schemes sas searches fits the minimal cache"
    if closed is not None and closed > minimal and n > TABLE_LIMIT:
        why = (f"the smallest closed form found needs {closed} slots, more than the {minimal} of the minimal "
               f"cache plus the padding allowed (1/{PAD_FRACTION} or {PAD_SLOTS} slots)")
    return f"{why}: cache_id_func uses a per-token table ({n} entries)"


def _per_token_scheme(L: np.ndarray, n: int, padded: Scheme | None = None,
                      size: int | None = None) -> tuple[Scheme, int, int | None, list[str]]:
    """(scheme, slots, minimal slots where more are used, notes) from per-token last uses: a ring
    where one fits the minimal cache, past `TABLE_LIMIT` the smaller of a padded ring and
    `padded` (a periodic padded scheme, where the column shapes gave one) within the padding
    allowed, else the table. `size`: the minimal cache where known (else from the table)."""
    table = greedy_table(L) if size is None else None      # built where needed only
    size = table.C if size is None else size
    ring = ring_from_last_use(L)
    if ring is not None and ring.C == size:
        return ring, size, None, [f"the per-token last uses fit a closed-form ring of the minimal {size} slots: "
                                  f"cache_id_func uses it instead of a table"]
    closed = sorted((c for c in (padded, ring) if c is not None), key=scheme_size)
    if closed and n > TABLE_LIMIT and padding_ok(size, scheme_size(closed[0])):
        return closed[0], scheme_size(closed[0]), size, [_padded_note(closed[0].name, size, scheme_size(closed[0]), n)]
    note = _table_note(size, scheme_size(closed[0]) if closed else None, n)
    return table if table is not None else greedy_table(L), size, None, [note]


def _per_token_first(pattern: Pattern, n: int, user_pattern: Pattern,
                     why: str) -> tuple[Scheme, int, int | None, list[str]] | None:
    """`_per_token_scheme` for a periodic pattern whose column shapes would be costly, or None
    where the per-token search stops at its own limit (the column shapes are then built)."""
    try:
        L = per_token_last_use(pattern, n)
    except AnalysisLimitError:
        return None
    _check_table_bytes(user_pattern, n, why)
    return _per_token_scheme(L, n)


def analyze(pattern: Pattern, max_len: int) -> Analysis:
    """Minimal KV cache, decomposition, events and synthesized functions for decoding.

    Decoding needs a causal pattern; a pattern that attends a key after its query raises
    `AnalysisError` (multiply it by `Causal()`).
    """
    if not isinstance(pattern, Pattern):
        raise AnalysisError(f"analyze: pattern must be a sas Pattern, got {type(pattern).__name__}")
    n = _check_len(max_len)
    user_pattern = pattern
    # Positions past max_len never occur: analyse the equal pattern whose numbers fit it.
    pattern = pattern.restrict(n)
    notes: list[str] = []
    if pattern is not user_pattern:
        notes.append(f"parameters larger than max_len={n} clamped (exact on positions < {n}): analysed as {pattern!r}")
    st = structure(pattern)
    seen = st.within(n)
    if (seen.T, seen.P) != (st.T, st.P):
        notes.append(f"the period {st.P} (from boundary {st.T}) is longer than max_len={n}: no key repeats within "
                     f"the sequence, analysed with period {seen.P} from boundary {seen.T}")
    if (seen.Qv, seen.Qh) != (st.Qv, st.Qh):
        notes.append(f"the vertical / horizontal periods {st.Qv} / {st.Qh} are longer than max_len={n}: no row "
                     f"or column repeats within the sequence, analysed with {seen.Qv} / {seen.Qh}")
    st = seen
    cols: ColumnShapes | None = None
    scheme: Scheme | None = None
    per_token_why = "pattern has no known period: analysed per token"
    table_why = "the pattern has no known period"
    minimal: int | None = None          # set where the slot scheme needs more than the minimal size
    if st.periodic:
        try:
            bad = upper_triangle_clear(pattern, st)
            if bad is not None and max(bad) >= n:
                # The structure's rows reach past the sequence; what counts is [0, max_len)^2. Causal
                # there, the pattern equals pattern * Causal() on every position that occurs.
                bad = non_causal_cell(pattern, n)
                if bad is None:
                    pattern = (pattern * Causal()).restrict(n)
                    st = structure(pattern).within(n)
                    notes.append(f"the pattern attends keys after their query only at positions >= max_len={n}: "
                                 f"analysed as {pattern!r}")
                    bad = upper_triangle_clear(pattern, st) if st.periodic else non_causal_cell(pattern, n)
            if bad is not None:
                raise AnalysisError(
                    f"analyze: pattern {user_pattern!r} is not causal (query {bad[0]} attends key {bad[1]}); "
                    f"decode analysis needs j <= i everywhere: multiply it by Causal()")
            runs = estimated_runs(pattern, st) if st.periodic else 0.0
            first = (_per_token_first(pattern, n, user_pattern,
                                      f"its column shapes (period {st.P}, boundary {st.T}) would need about "
                                      f"{runs:.3g} runs, more than the periodic analysis takes ({PER_TOKEN_FIRST_RUNS})")
                     if runs > PER_TOKEN_FIRST_RUNS else None)
            if first is not None:
                scheme, size, minimal, more = first
                peak = 0
                notes.append(f"the column shapes (period {st.P}, boundary {st.T}, vertical period {st.Qv}) would "
                             f"need about {runs:.3g} runs, more than {PER_TOKEN_FIRST_RUNS}: analysed per token")
                notes += more
                st = NON_PERIODIC
            else:
                cols = column_shapes(pattern, st)
                size, peak = _cache_size(cols, n)
                scheme = choose_scheme(cols, size, n) if size > 0 else None
                if scheme is None and size > 0:
                    padded = padded_scheme(cols, size, n) if n > TABLE_LIMIT else None
                    close = padded is not None and scheme_size(padded) - size <= max(size // PAD_CLOSE_FRACTION,
                                                                                     PAD_CLOSE_SLOTS)
                    if (padded is not None and padding_ok(size, scheme_size(padded))
                            and (close or n > PAD_READ_MAX_LEN or not _host_allows(n))):
                        minimal, size = size, scheme_size(padded)
                        scheme = padded
                        notes.append(_padded_note(padded.name, minimal, size, n))
                    else:
                        # the keys' last uses (as many entries as the table, which they decide
                        # on): a ring of the minimal size, or a smaller padded one, may fit them
                        _check_table_bytes(user_pattern, n, f"no closed form of its {size}-slot cache follows from "
                                                            f"its period (the keys' last uses decide per token)")
                        scheme, size, minimal, more = _per_token_scheme(cols.last_use(np.arange(n), n), n,
                                                                        padded, size)
                        notes += more
        except AnalysisLimitError as e:
            # a period or boundary too long for the length-independent analysis (a sum of
            # lattices whose strides multiply to about max_len): the keys' last uses per token
            per_token_why = (f"the periodic analysis (period {st.P}, boundary {st.T}) stopped at its limit: "
                             f"analysed per token instead ({e})")
            table_why = f"the periodic analysis stopped at its limit (period {st.P}, boundary {st.T}: {e})"
            st, cols, minimal, scheme = NON_PERIODIC, None, None, None
    if not st.periodic and cols is None and scheme is None:
        _check_table_bytes(user_pattern, n, table_why)
        bad = non_causal_cell(pattern, n)
        if bad is not None:
            raise AnalysisError(
                f"analyze: pattern {user_pattern!r} is not causal (query {bad[0]} attends key {bad[1]}); "
                f"multiply it by Causal()")
        notes.append(per_token_why)
        scheme, size, minimal, more = _per_token_scheme(per_token_last_use(pattern, n), n)
        peak = 0
        notes += more
    dyn = pattern.dynamics()
    if dyn:
        notes.append(
            f"{len(dyn)} Dynamic component(s) analysed as the region they cover; their run-time key "
            f"selection (budget {', '.join(str(d.budget) for d in dyn)}) is handled by sas.dynamic")
    if size <= 0:
        raise EmptyPatternError(f"analyze: pattern {user_pattern!r} attends no key within max_len={n}: it is empty")
    # mask_func applies the user's own predicate: exact at any index (see Pattern.predicate).
    mod, tables = synthesize(user_pattern, scheme, n)
    fns = compile_functions(mod, tables=tables)
    return Analysis(user_pattern, n, size, peak, st, mod, tables, scheme.name,
                    not isinstance(scheme, TableScheme), tuple(notes), fns["cache_id_func"],
                    fns["slot_key_func"], fns["mask_func"], scheme, cols, minimal)
