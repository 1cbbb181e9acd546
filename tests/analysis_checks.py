"""Brute-force references the analyzer is checked against (shared by the analysis tests)."""

from __future__ import annotations

import ast

import numpy as np


def brute_last_use(mask: np.ndarray) -> np.ndarray:
    n = mask.shape[0]
    used = mask.any(axis=0)
    return np.where(used, n - 1 - np.argmax(mask[::-1], axis=0), -1)


def brute_cache_size(mask: np.ndarray) -> int:
    """max_i |{j <= i : some i' in [i, n) attends j}| by direct counting."""
    n = mask.shape[0]
    L = brute_last_use(mask)
    j = np.arange(n)
    diff = np.zeros(n + 1, dtype=np.int64)
    ok = L >= j
    np.add.at(diff, j[ok], 1)
    np.add.at(diff, L[ok] + 1, -1)
    return int(np.cumsum(diff)[:-1].max()) if n else 0


def brute_candidates_at_once(region: np.ndarray) -> int:
    """max_i |{j : first(j) <= i <= last(j)}|, with first/last the first and last row of column j
    that is on in `region`: the most keys a dynamic region holds as candidates at once within
    the mask's rows (`plan_dynamic`'s `capacity` is this over all rows, so never smaller)."""
    n = region.shape[0]
    used = region.any(axis=0)
    if not used.any():
        return 0
    first = np.argmax(region, axis=0)[used]
    last = (n - 1 - np.argmax(region[::-1], axis=0))[used]
    diff = np.zeros(n + 1, dtype=np.int64)
    np.add.at(diff, first, 1)
    np.add.at(diff, last + 1, -1)
    return int(np.cumsum(diff)[:-1].max())


def decode_with_functions(analysis, mask: np.ndarray, cache_id_func=None, slot_key_func=None, mask_func=None) -> None:
    """Decode token by token with the synthesized functions and compare with the mask rows.

    Key j is written to slot cache_id_func(j) when produced; query i attends the keys held
    in the slots s with mask_func(s, i). Asserts exact equality with row i of `mask`.
    """
    cid = cache_id_func or analysis.cache_id_func
    key_of = slot_key_func or analysis.slot_key_func
    attends = mask_func or analysis.mask_func
    n, C = mask.shape[0], analysis.cache_size
    slots = [-1] * C
    for i in range(n):
        s = cid(i)
        assert -1 <= s < C, f"cache_id_func({i}) = {s} outside [-1, {C})"
        if s >= 0:
            slots[s] = i
        got = set()
        for slot in range(C):
            assert key_of(slot, i) == slots[slot], f"slot_key_func({slot}, {i}) = {key_of(slot, i)}, slot holds {slots[slot]}"
            if attends(slot, i):
                got.add(slots[slot])
        want = set(np.flatnonzero(mask[i]).tolist())
        assert got == want, f"query {i}: attends {sorted(got - want)} wrongly, misses {sorted(want - got)}"


class _CStyle(ast.NodeTransformer):
    """Rewrite `a // b` and `a % b` to C-style (truncating) integer division."""

    def visit_BinOp(self, node: ast.BinOp):
        self.generic_visit(node)
        if isinstance(node.op, (ast.FloorDiv, ast.Mod)):
            fn = "_cdiv" if isinstance(node.op, ast.FloorDiv) else "_cmod"
            return ast.Call(ast.Name(fn, ast.Load()), [node.left, node.right], [])
        return node


def _cdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _cmod(a: int, b: int) -> int:
    return a - b * _cdiv(a, b)


def c_semantics_functions(analysis) -> dict:
    """The synthesized functions compiled with C-style `//` and `%` (as Triton/CUDA/NKI do)."""
    mod = ast.fix_missing_locations(_CStyle().visit(ast.parse(analysis.source)))
    ns: dict = {"_cdiv": _cdiv, "_cmod": _cmod}
    exec(compile(mod, "<c-style>", "exec"), ns)
    return ns
