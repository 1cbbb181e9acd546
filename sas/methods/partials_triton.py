"""Split-K partial outputs merged by log-sum-exp (a plain `@triton.jit` module shared by the
Saap, Kascade and SpecAttn decode kernels, which write the same partial layout): per (batch, KV
head) `bh`, S_CAP rows of partials, each BLOCK_G query heads x BLOCK_D dims of unnormalised
output (`O_PART`) with log2-domain row maximum (`M_PART`) and sum of exponentials (`L_PART`).

- `merge_step` (a `@triton.jit` helper): one log-sum-exp step of a running (m, l, acc) with a
  partial (m, l, o), the step every merge here and SANTA's static merge take;
- `merge_partials` (a `@triton.jit` helper): merge rows 0..S-1 of `bh` into OUT, in order (so a
  caller that merges inside its own kernel gets results bit-identical to the separate launch);
- `merge_partials_kernel`: that merge as its own launch, one program per (batch, KV head).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def merge_step(m_tot, l_tot, acc, m, l, o):
    """(m_tot, l_tot, acc) merged with one partial (m, l, o) in their common log2-domain max
    frame; rows that have seen nothing yet (m = -inf on both sides) stay empty."""
    m_new = tl.maximum(m_tot, m)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    a = tl.exp2(m_tot - m_safe)
    b = tl.exp2(m - m_safe)
    return m_new, l_tot * a + l * b, acc * a[:, None] + o * b[:, None]


@triton.jit
def merge_partials(O_PART, M_PART, L_PART, OUT, bh, S, S_CAP, G, D,
                    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, CG: tl.constexpr):
    """Log-sum-exp merge of partial rows 0..S-1 of (batch, KV head) bh into OUT (CG: load
    through L2 only, for partials written by other programs of the same launch)."""
    rows = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, BLOCK_D)
    m_tot = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_tot = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for s in range(0, S):
        part = (bh * S_CAP + s) * BLOCK_G
        if CG:
            m = tl.load(M_PART + part + rows, cache_modifier=".cg")
            l = tl.load(L_PART + part + rows, cache_modifier=".cg")
            o = tl.load(O_PART + (part + rows[:, None]) * BLOCK_D + dims[None, :], cache_modifier=".cg")
        else:
            m = tl.load(M_PART + part + rows)
            l = tl.load(L_PART + part + rows)
            o = tl.load(O_PART + (part + rows[:, None]) * BLOCK_D + dims[None, :])
        m_tot, l_tot, acc = merge_step(m_tot, l_tot, acc, m, l, o)
    out = acc / tl.maximum(l_tot, 1e-30)[:, None]
    tl.store(OUT + (bh * G + rows[:, None]) * D + dims[None, :], out.to(OUT.dtype.element_ty),
             mask=(rows[:, None] < G) & (dims[None, :] < D))


@triton.jit
def merge_partials_kernel(O_PART, M_PART, L_PART, OUT, S, S_CAP, G, D,
                      BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr):
    merge_partials(O_PART, M_PART, L_PART, OUT, tl.program_id(0), S, S_CAP, G, D, BLOCK_G, BLOCK_D, False)
