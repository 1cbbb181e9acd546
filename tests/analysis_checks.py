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
    ns: dict = {"_cdiv": _cdiv, "_cmod": _cmod, **analysis.tables}   # table schemes name their tables
    exec(compile(mod, "<c-style>", "exec"), ns)
    return ns


class DenseColumns:
    """The column shapes evaluated cell by cell (the analyzer's former representation): the
    reference `sas.analysis.columns.ColumnShapes` (runs) is checked against. Shape s, distance
    d < W: `on[s, d] = M(key_s + d, key_s)`, W = max(D) + 2Q."""

    def __init__(self, pattern, st) -> None:
        T, P, Q = st.T, st.P, st.Qv
        keys = np.concatenate([np.arange(T), T + np.arange(P)]).astype(np.int64)
        self.T, self.P, self.Q = T, P, Q
        self.D = np.concatenate([np.maximum(T - np.arange(T), st.Dv), np.full(P, st.Dv)]).astype(np.int64)
        W = int(self.D.max()) + 2 * Q
        d = np.arange(W, dtype=np.int64)
        self.on = np.asarray(pattern.evaluate(keys[:, None] + d[None, :], keys[:, None]), dtype=bool)
        self.last_upto = np.maximum.accumulate(np.where(self.on, d[None, :], -1), axis=1)

    def shape_of(self, j):
        j = np.asarray(j, dtype=np.int64)
        return np.where(j < self.T, j, self.T + (j - self.T) % self.P)

    @property
    def ever_used(self):
        return self.on.any(axis=1)

    @property
    def forever(self):
        d = np.arange(self.on.shape[1])[None, :]
        tail = (d >= self.D[:, None]) & (d < self.D[:, None] + self.Q)
        return (self.on & tail).any(axis=1)

    def last_d(self, shape, x):
        shape, x = np.broadcast_arrays(np.asarray(shape, dtype=np.int64), np.asarray(x, dtype=np.int64))
        W = self.on.shape[1]
        D, Q = self.D[shape], self.Q
        far = x >= W
        xr = np.where(far, D + Q + (x - D) % Q, np.clip(x, 0, W - 1))
        ld = self.last_upto[shape, xr]
        return np.where(x < 0, -1, ld + np.where(far & (ld >= D), x - xr, 0))

    def next_d(self, shape, x):
        """First attended d >= x, -1 if none: read on the columns unrolled far enough."""
        shape, x = np.broadcast_arrays(np.asarray(shape, dtype=np.int64), np.asarray(x, dtype=np.int64))
        x = np.maximum(x, 0)
        width = int(x.max(initial=0)) + self.on.shape[1] + self.Q + 1
        on = np.stack([self.column(s, width) for s in range(len(self.D))])
        idx = np.where(on, np.arange(width)[None, :], -1)
        big = np.where(idx >= 0, idx, width)
        first_from = np.minimum.accumulate(big[:, ::-1], axis=1)[:, ::-1]      # first hit at >= d
        out = first_from[shape, x]
        return np.where(out >= width, -1, out)

    def last_use(self, j, n):
        j = np.asarray(j, dtype=np.int64)
        ld = self.last_d(self.shape_of(j), n - 1 - j)
        return np.where(ld >= 0, j + ld, -1)

    def column(self, s: int, width: int) -> np.ndarray:
        """on[s, :width], unrolled periodically past W."""
        d = np.arange(width, dtype=np.int64)
        D, Q, W = int(self.D[s]), self.Q, self.on.shape[1]
        dr = np.where(d >= W, D + Q + (d - D) % Q, d)
        return self.on[s, dr]


def dense_upper_triangle(pattern, st):
    """The first cell (i, j), j > i, in row-major order that the pattern attends among the rows
    [0, T + P) and columns [0, max(T, T + P + Dh) + Qh + 1), or None (dense evaluation: the
    reference of `sas.analysis.columns.upper_triangle_clear`)."""
    rows = st.T + st.P
    cols = max(st.T, rows + st.Dh) + st.Qh + 1
    i = np.arange(rows, dtype=np.int64)[:, None]
    j = np.arange(cols, dtype=np.int64)[None, :]
    bad = np.asarray(pattern.evaluate(i, j), dtype=bool) & (j > i)
    return tuple(int(v) for v in np.argwhere(bad)[0]) if bad.any() else None
