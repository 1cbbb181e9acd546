"""SANTA at run time: the decode launches (`santa_decode`) and the per-layer decoder state
(`SantaDecoder`: a KV cache of the attended pattern, the uniforms, one step per token).

`santa_decode(q, k_cache, v_cache, n_keys, n, strategy=..., ...)` runs one decode query per
head over the cache slots [0, n_keys) (optionally filtered by `mask`): prop (score stash,
per-tile budgets, parallel sparse V gather) or flash (per-tile draws, deferred merge), on the
kernels of `sas.methods.santa_triton`; `strategy="torch"` runs the section-2 estimators
(multinomial, stratified, systematic) in plain PyTorch. The same uniforms give the same draws,
and the float64 references `sas.methods.santa.prop_reference` / `flash_reference` reproduce
the kernels' counts from them. `static=` marks slots attended exactly: the draws then cover
the other slots only and the two parts merge by their exact row sums (`composed_reference`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sas.errors import KernelError
from sas.methods.direct_launch import FAST_LAUNCH, current_stream as _stream, hooks_clear
from sas.methods.direct_launch import interpreting as _interpreting
from sas.methods.santa import (ALLOCS, ESTIMATORS, GROUPS, METHODS, STRATEGIES, SantaRandom, bernoulli_query,
                               bernoulli_uniform_shape, check_choice, check_samples, flash_tile_samples,
                               sample_counts, tile_budgets, uniforms_shape)
from sas.methods.santa_cuda import Ineligible, PropCudaPlan, prop_cuda_plan
from sas.methods.santa_triton import (santa_flash_kernel, santa_flash_merge_kernel, santa_prop_budget_kernel,
                                      santa_prop_gather_kernel, santa_prop_scores_kernel,
                                      santa_static_partial_kernel)

LOG2E = 1.4426950408889634
#: prop's kernels: "triton" (two launches, the default) or "cuda" (one persistent launch,
#: `sas.methods.santa_cuda`; slower than Triton on the H100 so far: docs/santa.md)
BACKENDS = ("triton", "cuda")
DEFAULT_TILE = {"prop": 256, "flash": 256}
# prop's global_sys budgets run in the scores kernel's last program per KV head up to this many
# (query head, tile) pairs (128K keys at tile 256 for 4 heads a group: more would cost the scores
# kernel registers), else in a launch of their own over chunks of BUDGET_CHUNK_PAIRS pairs
FUSED_BUDGET_PAIRS = 2048
BUDGET_CHUNK_PAIRS = 4096
# prop's score pass on a GPU: about SCORE_PROGRAMS_PER_SM programs per multiprocessor (one
# wave), each streaming a run of tiles with its K loads pipelined SCORE_STAGES deep; the
# gather's warps and the drawn keys it compacts at a time (None: by group size). Chosen on an
# H100 (docs/santa.md)
SCORE_PROGRAMS_PER_SM = 1
SCORE_STAGES = 3
SCORE_WARPS = 8
GATHER_WARPS: int | None = None
GATHER_R: int | None = None
# the exact static part: keys per block of its online softmax, and the list entries per split
# (splits * B * Hkv programs; the GPU rule aims at one wave)
STATIC_BLOCK_N = 64
STATIC_MIN_CHUNK = 256


def _pow2(x: int, least: int = 1) -> int:
    return max(least, 1 << max(0, (x - 1).bit_length()))


@dataclass(frozen=True)
class SantaOptions:
    """How one SANTA layer samples: S draws per query head (`n`), the estimator (`method`), the
    kernel (`strategy`), prop's tile budgets (`alloc`), the key tile, the stash precision, and
    the score estimator (`qk="exact"` or the paper's Bernoulli ternary query with `qk_samples`
    draws, `qk_group` "mean" (GQA mean group query) or "head"), and prop's kernels (`backend`:
    "triton", or "cuda" for the one-launch CUDA kernel, a KernelError naming why where it cannot
    run a step)."""

    n: int
    method: str = "systematic"
    strategy: str = "prop"
    alloc: str = "global_sys"
    tile: int | None = None
    stash: str = "float32"
    qk: str = "exact"
    qk_samples: int = 8
    qk_group: str = "mean"
    backend: str = "triton"

    def __post_init__(self):
        where = "SANTA options"
        check_samples(self.n, where, KernelError)
        check_choice(self.method, METHODS, "method", where, KernelError)
        check_choice(self.strategy, STRATEGIES, "strategy", where, KernelError)
        check_choice(self.alloc, ALLOCS, "alloc", where, KernelError)
        check_choice(self.stash, ("float32", "cache"), "stash", where, KernelError)
        check_choice(self.qk, ESTIMATORS, "qk", where, KernelError)
        check_samples(self.qk_samples, f"{where} (qk_samples)", KernelError)
        check_choice(self.qk_group, GROUPS, "qk_group", where, KernelError)
        check_choice(self.backend, BACKENDS, "backend", where, KernelError)
        if self.backend == "cuda" and (self.strategy != "prop" or self.alloc != "global_sys"):
            raise KernelError(f"{where}: backend='cuda' runs strategy='prop' with alloc='global_sys' only, got "
                              f"strategy={self.strategy!r}, alloc={self.alloc!r}; use backend='triton'")
        if self.method != "systematic" and self.strategy != "torch":
            raise KernelError(f"{where}: the prop and flash kernels draw systematically; method={self.method!r} "
                              f"runs with strategy='torch'")
        if self.strategy != "torch" and self.n > 65535:
            raise KernelError(f"{where}: the prop and flash kernels count up to 65535 draws per key; n={self.n}")
        if self.tile is not None and (isinstance(self.tile, bool) or not isinstance(self.tile, int)
                                      or self.tile < 16 or self.tile & (self.tile - 1)):
            raise KernelError(f"{where}: tile must be a power of two >= 16, got {self.tile!r}")

    @property
    def block_n(self) -> int:
        return self.tile if self.tile is not None else DEFAULT_TILE.get(self.strategy, 256)


@dataclass
class StepResult:
    out: torch.Tensor
    counts: torch.Tensor | None       # [B, Hq, n_keys] int, when asked for
    uniforms: torch.Tensor


def _check_decode(q, k_cache, v_cache, n_keys, mask, static=None) -> None:
    where = "santa_decode"
    for name, t, rank in (("q", q, 3), ("k_cache", k_cache, 4), ("v_cache", v_cache, 4)):
        if not isinstance(t, torch.Tensor) or t.dim() != rank:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise KernelError(f"{where}: {name} must be a {rank}-d tensor, got {got}")
    b, hq, d = q.shape
    if k_cache.shape != v_cache.shape or k_cache.shape[0] != b or k_cache.shape[3] != d:
        raise KernelError(f"{where}: k_cache {tuple(k_cache.shape)} / v_cache {tuple(v_cache.shape)} must both be "
                          f"[B={b}, Hkv, slots, D={d}]")
    if hq % k_cache.shape[1]:
        raise KernelError(f"{where}: {hq} query heads cannot be grouped onto {k_cache.shape[1]} KV heads")
    if isinstance(n_keys, bool) or not isinstance(n_keys, int) or not 1 <= n_keys <= k_cache.shape[2]:
        raise KernelError(f"{where}: n_keys must be an integer in [1, {k_cache.shape[2]}], got {n_keys!r}")
    if q.device != k_cache.device or v_cache.device != k_cache.device:
        raise KernelError(f"{where}: q, k_cache and v_cache must be on one device")
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dim() != 1 or mask.shape[0] < n_keys):
        raise KernelError(f"{where}: mask must be a 1-d tensor of at least n_keys={n_keys} slots")
    if static is not None and (not isinstance(static, torch.Tensor) or static.dim() != 1
                               or static.shape[0] < n_keys):
        raise KernelError(f"{where}: static must be a 1-d tensor (bool/int8 per slot) of at least n_keys={n_keys} "
                          f"slots")


def santa_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, n_keys: int,
                 options: SantaOptions, random: SantaRandom | None = None, *, mask: torch.Tensor | None = None,
                 static: torch.Tensor | None = None, uniforms: torch.Tensor | None = None,
                 qk_uniforms: torch.Tensor | None = None, scale: float | None = None,
                 return_counts: bool = False) -> StepResult:
    """One SANTA decode step: q [B, Hq, D] (one query per head), caches [B, Hkv, slots, D]; keys
    are slots [0, n_keys) where `mask` (int8/bool per slot, shared by batch and heads) is set.
    Returns the estimate [B, Hq, D] in q's dtype (and the draws per slot if `return_counts`).
    `uniforms` overrides the random source (shape: [B, Hq, 1] for systematic prop with
    global_sys and for strategy torch's systematic, [B, Hq, n] for its other methods, [B, Hq, T]
    otherwise).

    `static` (int8/bool per slot, shared like `mask`) marks the keys attended exactly: the
    draws then come from the softmax restricted to the other keys (the sampled region R_d), and
    the output is `(Z_s O_s + Z_d O_d) / (Z_s + Z_d)` with O_s the exact attention over the
    static keys, O_d the estimate over R_d and Z the exact row sums (docs/santa.md, "Exact
    static part"). A step whose keys are all static is exact attention (no draws; `uniforms`
    empty); a `static` with no key set is the same as None."""
    _check_decode(q, k_cache, v_cache, n_keys, mask, static)
    random = SantaRandom() if random is None else random
    b, hq, d = q.shape
    hkv = k_cache.shape[1]
    g = hq // hkv
    scale = d ** -0.5 if scale is None else float(scale)
    dev = q.device
    if options.qk == "bernoulli":
        shape = bernoulli_uniform_shape((b, hq, d), hkv, options.qk_samples, options.qk_group)
        qu = random.uniform(shape, dev) if qk_uniforms is None else qk_uniforms
        q_score = bernoulli_query(q, hkv, options.qk_samples, options.qk_group, qu).to(q.dtype)
    else:
        q_score = q
    parts = _static_split(mask, static, n_keys, dev)
    if parts is not None:
        mask, static_idx, n_region = parts
    else:
        static_idx, n_region = None, n_keys
    if options.strategy == "torch":
        return _torch_step(q, q_score, k_cache, v_cache, n_keys, options, random, mask, uniforms, scale, static_idx,
                           n_region)
    if static_idx is not None and n_region == 0:
        return _static_only(q, q_score, k_cache, v_cache, static_idx, scale, return_counts, n_keys)
    block_n = options.block_n
    t = max(1, math.ceil(n_keys / block_n))
    block_g = _pow2(g, 16)
    block_d = _pow2(d, 16)
    interp = _interpreting() or dev.type != "cuda"
    precision = "ieee" if interp or q.dtype == torch.float32 else "tf32"
    upcast = interp
    lowp = (not interp and k_cache.dtype in (torch.bfloat16, torch.float16)) or (
        interp and k_cache.dtype == torch.float16)   # the interpreter has fp16 (numpy), not bf16
    qc = q_score.contiguous()
    kc, vc = k_cache.contiguous(), v_cache.contiguous()
    ncap = kc.shape[2]
    has_mask = mask is not None
    mk = mask.to(device=dev, dtype=torch.int8).contiguous() if has_mask else _dummy(dev, torch.int8)
    counts = torch.zeros(b * hq, t * block_n, dtype=torch.int32, device=dev) if return_counts else \
        _dummy(dev, torch.int32)
    grid = (b * hkv, t)
    qk_scale_log2 = scale * LOG2E
    # 256 x 128 tiles without register spills (ptxas, sm_90): 8 warps
    warps = 8 if block_n * block_d >= 16384 else 4
    if options.strategy == "flash":
        u = random.uniform((b, hq, t), dev) if uniforms is None else uniforms
        _check_uniforms(u, (b, hq, t), "flash")
        s_tile = flash_tile_samples(options.n, t)
        o_part = torch.empty(b * hq, t, d, dtype=torch.float32, device=dev)
        m_part = torch.empty(b * hq, t, dtype=torch.float32, device=dev)
        l_part = torch.empty(b * hq, t, dtype=torch.float32, device=dev)
        santa_flash_kernel[grid](qc, kc, vc, mk, u.contiguous(), o_part, m_part, l_part, counts, ncap, n_keys, g, d,
                                 t, qk_scale_log2, float(s_tile), BLOCK_G=block_g, BLOCK_N=block_n, BLOCK_D=block_d,
                                 HAS_MASK=has_mask, STORE_COUNTS=return_counts, UPCAST=upcast,
                                 DOT_PRECISION=precision, LOWP=lowp, BIG=s_tile > 256, num_warps=warps)
        sp = _static_partials(q_score, kc, vc, static_idx, scale, interp, precision, upcast)
        out = torch.empty(b, hq, d, dtype=q.dtype, device=dev)
        santa_flash_merge_kernel[(b * hq,)](o_part, m_part, l_part, out, t, d, *sp.args, BLOCK_T=min(_pow2(t), 64),
                                            BLOCK_D=block_d, HAS_STATIC=sp.splits > 0)
        return StepResult(out, _counts(counts, b, hq, n_keys) if return_counts else None, u)
    compose = static_idx is not None
    if options.backend == "cuda":
        if compose:
            raise KernelError("santa_decode: backend='cuda' does not take a step with an exact static part; use "
                              "backend='triton'")
        out, u = _prop_cuda(q, qc, kc, vc, mk if has_mask else None, counts if return_counts else None, n_keys, t,
                            options, random, uniforms, scale, interp)
        return StepResult(out, _counts(counts, b, hq, n_keys) if return_counts else None, u)
    # prop: two launches (scores + stash, with the budgets in the last program of each KV head;
    # gather, with the cast in the last program of each KV head) on scratch buffers kept per shape
    plan = _prop_plan(dev, b, hq, hkv, d, ncap, t, block_n, q.dtype, k_cache.dtype, options, has_mask,
                      return_counts, interp, precision, upcast, compose)
    if plan.global_sys:
        u = random.uniform((b, hq, 1), dev) if uniforms is None else uniforms
        _check_uniforms(u, (b, hq, 1), "prop (alloc='global_sys')")
    else:
        u = random.uniform((b, hq, t), dev) if uniforms is None else uniforms
        _check_uniforms(u, (b, hq, t), "prop (alloc='largest_remainder')")
    u = u.contiguous()
    bufs = plan.bufs
    n_flags = (n_keys % 16 == 0, n_keys == 1)
    plan.scores(plan.score_grid, (_aligned(qc), _aligned(kc), _aligned(mk), _aligned(u), n_flags),
                (qc, kc, mk, bufs.stash, bufs.m_t, bufs.l_t, bufs.cnt, u, bufs.inv, bufs.off, bufs.st, bufs.mz, ncap,
                 n_keys, g, d, t, plan.tpp, scale * LOG2E, float(options.n)), dev)
    if plan.budget is not None:
        plan.budget((b * hkv, 1, 1), (_aligned(u),), (bufs.m_t, bufs.l_t, u, bufs.inv, bufs.off, bufs.st, bufs.mz, g,
                                                     t, float(options.n)), dev)
    if plan.global_sys:
        inv, off, st = bufs.inv, bufs.off, bufs.st
    else:
        bud = tile_budgets(bufs.m_t.double() / LOG2E, bufs.l_t.double(), options.n, "largest_remainder",
                           u.reshape(b * hq, t))
        inv = bud.inv.float().contiguous()
        off = bud.offset.float().contiguous()
        st = bud.samples.to(torch.int32).contiguous()
        if compose:          # the region's (m*, Z) per head, log2 domain, as the budget program stores them
            live = bufs.l_t > 0
            mstar = torch.where(live, bufs.m_t, float("-inf")).amax(-1)
            mstar = torch.where(torch.isfinite(mstar), mstar, torch.zeros_like(mstar))
            z = torch.where(live, torch.exp2(bufs.m_t - mstar[:, None]) * bufs.l_t, torch.zeros_like(bufs.l_t)).sum(-1)
            bufs.mz.copy_(torch.stack([mstar, z], -1))
    sp = _static_partials(q_score, kc, vc, static_idx, scale, interp, precision, upcast)
    out = torch.empty(b, hq, d, dtype=q.dtype, device=dev)
    plan.gather(plan.gather_grid, (_aligned(inv), _aligned(off), _aligned(st), _aligned(vc), _aligned(out),
                                   _aligned(counts), *(_aligned(x) for x in sp.args[:3]), sp.splits == 1,
                                   sp.splits % 16 == 0, n_flags),
                (bufs.stash, inv, off, st, vc, bufs.out32, out, plan.cnt_gather, counts, ncap, n_keys, g, d, t,
                 1.0 / options.n, bufs.mz, *sp.args), dev)
    return StepResult(out, _counts(counts, b, hq, n_keys) if return_counts else None, u)


def _prop_cuda(q, qc, kc, vc, mk, counts, n_keys, t, options, random, uniforms, scale, interp):
    """prop on the one-launch CUDA kernel: (out, uniforms); a KernelError naming why where the
    kernel cannot run the step (before any uniform is drawn or buffer written)."""
    dev = q.device
    b, hq, d = q.shape
    hkv, ncap = kc.shape[1], kc.shape[2]
    if interp or dev.type != "cuda":
        plan: PropCudaPlan | Ineligible = Ineligible("it runs on CUDA devices (not under TRITON_INTERPRET=1)")
    else:
        plan = prop_cuda_plan(dev, b, hq, hkv, d, ncap, options.block_n, qc.dtype, kc.dtype, options.n,
                              options.stash != "float32", scale * LOG2E, _sm_count(dev), _smem_limit(dev))
    layout = plan.layout(t) if isinstance(plan, PropCudaPlan) else plan
    if isinstance(layout, Ineligible):
        raise KernelError(f"santa_decode: backend='cuda' cannot run this step: {layout.reason}")
    u = random.uniform((b, hq, 1), dev) if uniforms is None else uniforms
    _check_uniforms(u, (b, hq, 1), "prop (alloc='global_sys')")
    u = u.to(device=dev, dtype=torch.float32).contiguous()
    out = torch.empty(b, hq, d, dtype=q.dtype, device=dev)
    plan.run(qc, kc, vc, mk, u, counts, out, n_keys, layout, _stream(dev))
    return out, u


@dataclass
class _StaticPartials:
    """The exact static part's split-K partials: acc [B*Hq, P, D] fp32 (unnormalised), log2-domain
    max and row sum [B*Hq, P]; `args` = (O_S, M_S, L_S, P) as the merge kernels take them (dummy
    pointers and P = 0 without a static part)."""

    splits: int
    args: tuple


def _static_split(mask, static, n_keys, dev):
    """(sampled-region mask, static slot list int32 on `dev`, sampled-key count), or None when
    no key is static. Computed where `static` lives (a host tensor costs no device sync)."""
    if static is None:
        return None
    st = static[:n_keys].to(torch.bool)
    if mask is not None:
        st = st & mask[:n_keys].to(device=st.device, dtype=torch.bool)
    idx = torch.nonzero(st).flatten().to(torch.int32)
    if idx.numel() == 0:
        return None
    region = ~st if mask is None else mask[:n_keys].to(device=st.device, dtype=torch.bool) & ~st
    return region.to(device=dev, dtype=torch.int8), idx.to(dev), int(region.sum())


def _static_partials(q, kc, vc, idx, scale, interp, precision, upcast) -> _StaticPartials:
    """Launch `santa_static_partial_kernel` over the listed static slots (nothing without any)."""
    dev = q.device
    if idx is None:
        dummy = _dummy(dev, torch.float32)
        return _StaticPartials(0, (dummy, dummy, dummy, 0))
    b, hq, d = q.shape
    hkv, ncap = kc.shape[1], kc.shape[2]
    g = hq // hkv
    n_list = int(idx.numel())
    blocks = -(-n_list // STATIC_BLOCK_N)
    want = 2 if interp else max(1, _sm_count(dev) // (b * hkv))
    chunk = max(-(-blocks // want), -(-STATIC_MIN_CHUNK // STATIC_BLOCK_N) if not interp else 1) * STATIC_BLOCK_N
    splits = -(-n_list // chunk)
    o_s = torch.empty(b * hq, splits, d, dtype=torch.float32, device=dev)
    m_s = torch.empty(b * hq, splits, dtype=torch.float32, device=dev)
    l_s = torch.empty(b * hq, splits, dtype=torch.float32, device=dev)
    block_d = _pow2(d, 16)
    santa_static_partial_kernel[(b * hkv, splits)](
        q.contiguous(), kc, vc, idx, o_s, m_s, l_s, ncap, n_list, g, d, chunk, splits, scale * LOG2E,
        BLOCK_G=_pow2(g, 16), BLOCK_N=STATIC_BLOCK_N, BLOCK_D=block_d, UPCAST=upcast, DOT_PRECISION=precision,
        num_warps=4)
    return _StaticPartials(splits, (o_s, m_s, l_s, splits))


def _static_only(q, q_score, k_cache, v_cache, idx, scale, return_counts, n_keys) -> StepResult:
    """A step whose attended keys are all static: exact attention over them (the flash merge
    with no tile), no draws."""
    b, hq, d = q.shape
    dev = q.device
    interp = _interpreting() or dev.type != "cuda"
    precision = "ieee" if interp or q.dtype == torch.float32 else "tf32"
    sp = _static_partials(q_score, k_cache.contiguous(), v_cache.contiguous(), idx, scale, interp, precision,
                          interp)
    out = torch.empty(b, hq, d, dtype=q.dtype, device=dev)
    dummy = _dummy(dev, torch.float32)
    santa_flash_merge_kernel[(b * hq,)](dummy, dummy, dummy, out, 0, d, *sp.args, BLOCK_T=1, BLOCK_D=_pow2(d, 16),
                                        HAS_STATIC=True)
    counts = torch.zeros(b, hq, n_keys, dtype=torch.int64, device=dev) if return_counts else None
    return StepResult(out, counts, torch.empty(b, hq, 0, device=dev))


def _aligned(x: torch.Tensor) -> bool:
    return x.data_ptr() % 16 == 0


class _Launch:
    """Launches one `@triton.jit` kernel with fixed compile-time arguments. The first launch of
    each specialization goes through Triton (`kernel[grid](...)`, which compiles or finds the
    kernel); later ones call the compiled kernel's launcher directly, skipping Triton's per-call
    argument binding (most of a launch's ~20 us of host time). The key of a specialization is
    what Triton specializes on: 16-byte alignment of the per-call pointers and the per-call
    integers (equal to 1, divisible by 16); everything else is fixed by the plan that owns this."""

    def __init__(self, kernel, constexprs: dict[str, Any], launch: dict[str, Any]):
        self.kernel = kernel
        self.constexprs = constexprs
        self.launch = launch
        names = list(kernel.arg_names)
        self.tail = tuple(constexprs[n] for n in names[len(names) - len(constexprs):])
        assert set(names[len(names) - len(constexprs):]) == set(constexprs), "constexprs must come last"
        self.compiled: dict[tuple, Any] = {}

    def __call__(self, grid: tuple[int, int, int], key: tuple, args: tuple, dev: torch.device) -> None:
        ck = self.compiled.get(key) if FAST_LAUNCH else None
        if ck is not None and hooks_clear():
            stream = _stream(dev)
            ck.run(grid[0], grid[1], grid[2], stream, ck.function, ck.packed_metadata, None, None, None, *args,
                   *self.tail)
            return
        ck = self.kernel[grid](*args, **self.constexprs, **self.launch)
        if (FAST_LAUNCH and dev.type == "cuda" and not _interpreting() and hasattr(ck, "run")
                and hasattr(ck, "packed_metadata") and hasattr(ck, "function")):
            self.compiled[key] = ck


@dataclass
class _PropPlan:
    bufs: "_PropScratch"
    global_sys: bool
    tpp: int
    score_grid: tuple[int, int, int]
    gather_grid: tuple[int, int, int]
    scores: _Launch
    budget: _Launch | None
    gather: _Launch
    cnt_gather: torch.Tensor


_PLANS: dict[tuple, _PropPlan] = {}
_PLANS_MAX = 64


def _prop_plan(dev, b, hq, hkv, d, ncap, t, block_n, q_dtype, k_dtype, options, has_mask, return_counts, interp,
               precision, upcast, compose=False) -> _PropPlan:
    """Everything of a prop step that its shapes and options fix: scratch buffers, grids,
    compile-time arguments and launchers (kept, so a step costs little host time)."""
    stream = _stream(dev)
    knobs = (SCORE_PROGRAMS_PER_SM, SCORE_STAGES, SCORE_WARPS, GATHER_WARPS, GATHER_R, FUSED_BUDGET_PAIRS,
             BUDGET_CHUNK_PAIRS)
    key = (dev.type, dev.index, stream, b, hq, hkv, d, ncap, t, block_n, q_dtype, k_dtype, options.n, options.alloc,
           options.stash, has_mask, return_counts, interp, precision, knobs, compose)
    plan = _PLANS.get(key)
    if plan is not None:
        return plan
    g = hq // hkv
    block_g, block_d, gblock = _pow2(g, 16), _pow2(d, 16), _pow2(g)
    bufs = _prop_scratch(dev, b * hq, b * hkv, t, block_n, d,
                         torch.float32 if options.stash == "float32" else k_dtype)
    global_sys = options.alloc == "global_sys"
    fused = global_sys and gblock * t <= FUSED_BUDGET_PAIRS
    if interp:
        tpp, stages, score_warps = 2, 1, 8 if block_n * block_d >= 16384 else 4   # two tiles a program: tested
    else:
        want = max(1, _sm_count(dev) * SCORE_PROGRAMS_PER_SM // (b * hkv))     # one wave
        tpp = -(-t // min(t, want))
        stages, score_warps = _score_stages(dev, block_g, block_n, block_d, k_dtype.itemsize), SCORE_WARPS
    scores = _Launch(santa_prop_scores_kernel,
                     dict(BLOCK_G=block_g, BLOCK_N=block_n, BLOCK_D=block_d, HAS_MASK=has_mask, UPCAST=upcast,
                          DOT_PRECISION=precision, BUDGETS=fused, BLOCK_GB=gblock, BLOCK_T=_pow2(t), STAGES=stages,
                          COMPOSE=compose),
                     dict(num_warps=score_warps))
    budget = None
    if global_sys and not fused:
        chunk = min(_pow2(t), max(1, BUDGET_CHUNK_PAIRS // gblock))
        budget = _Launch(santa_prop_budget_kernel, dict(BLOCK_GB=gblock, BLOCK_T=chunk, ONE_CHUNK=t <= chunk,
                                                        COMPOSE=compose), {})
    gather = _Launch(santa_prop_gather_kernel,
                     dict(BLOCK_G=gblock, BLOCK_N=block_n, BLOCK_D=block_d,
                          BLOCK_R=(max(16, GATHER_R or 16) if gblock >= 16 else GATHER_R or max(2, 32 // gblock)),
                          STORE_COUNTS=return_counts, COMPOSE=compose),
                     dict(num_warps=GATHER_WARPS or max(2, min(16, gblock * block_n // 512))))
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.pop(next(iter(_PLANS)))
    plan = _PLANS[key] = _PropPlan(bufs, global_sys, tpp, (b * hkv, -(-t // tpp), 1), (b * hkv, t, 1), scores,
                                   budget, gather, bufs.cnt[b * hkv:])
    return plan


@dataclass
class _PropScratch:
    stash: torch.Tensor
    m_t: torch.Tensor
    l_t: torch.Tensor
    inv: torch.Tensor
    off: torch.Tensor
    st: torch.Tensor
    mz: torch.Tensor        # [rows, 2]: the sampled region's (m*, Z) per head (written when composing)
    out32: torch.Tensor     # zero between calls: the gather's last program per KV head re-zeroes its rows
    cnt: torch.Tensor       # [2 B Hkv] arrival counters (scores, gather), zero between calls likewise


_SCRATCH: dict[tuple, tuple[int, dict[str, torch.Tensor]]] = {}
_SCRATCH_MAX = 8


def _prop_scratch(dev: torch.device, rows: int, kv_rows: int, t: int, block_n: int, d: int,
                  stash_dtype: torch.dtype) -> _PropScratch:
    """The prop step's scratch buffers, kept per (device, stream, heads, head dim, tile, stash
    dtype) and grown with the number of tiles, so a decode step allocates nothing but its output.
    The counters and the fp32 output rows are left at zero by the kernels themselves."""
    key = (str(dev), _stream(dev), rows, kv_rows, block_n, d, stash_dtype)
    have = _SCRATCH.get(key)
    if have is None or have[0] < t:
        _PLANS.clear()              # plans hold views of the buffers replaced here (or evicted below)
        cap = max(t, 2 * have[0] if have is not None else t)
        f32 = dict(dtype=torch.float32, device=dev)
        old = have[1] if have is not None else None
        buf = {"stash": torch.empty(rows * cap * block_n, dtype=stash_dtype, device=dev),
               "m_t": torch.empty(rows * cap, **f32), "l_t": torch.empty(rows * cap, **f32),
               "inv": torch.empty(rows * cap, **f32), "off": torch.empty(rows * cap, **f32),
               "st": torch.empty(rows * cap, dtype=torch.int32, device=dev),
               "mz": old["mz"] if old is not None else torch.zeros(rows * 2, **f32),
               "out32": old["out32"] if old is not None else torch.zeros(rows * d, **f32),
               "cnt": old["cnt"] if old is not None else torch.zeros(2 * kv_rows, dtype=torch.int32, device=dev)}
        if len(_SCRATCH) >= _SCRATCH_MAX and key not in _SCRATCH:
            _SCRATCH.pop(next(iter(_SCRATCH)))
        have = _SCRATCH[key] = (cap, buf)
    buf = have[1]
    return _PropScratch(buf["stash"][:rows * t * block_n].view(rows, t * block_n),
                        *(buf[k][:rows * t].view(rows, t) for k in ("m_t", "l_t", "inv", "off")),
                        buf["st"][:rows * t].view(rows, t), buf["mz"].view(rows, 2), buf["out32"].view(rows, d),
                        buf["cnt"])


def _score_stages(dev: torch.device, block_g: int, block_n: int, block_d: int, k_size: int) -> int:
    """SCORE_STAGES, or fewer where the scores kernel's shared memory would not fit: each stage
    holds a K tile, beside the fp32 scores and the query rows (the footprint Triton 3.6 asks
    for: 278528 bytes at 64 heads a group, tile 256, head dim 128, bf16, 3 stages)."""
    limit = _smem_limit(dev)
    fixed = block_g * block_n * 4 + block_g * block_d * k_size
    stages = SCORE_STAGES
    while stages > 1 and stages * block_n * block_d * k_size + fixed > limit:
        stages -= 1
    return stages


_PROPS: dict[str, Any] = {}


def _props(dev: torch.device) -> Any:
    """The device's properties, read once per device."""
    key = str(dev)
    if key not in _PROPS:
        _PROPS[key] = torch.cuda.get_device_properties(dev)
    return _PROPS[key]


def _smem_limit(dev: torch.device) -> int:
    """Shared memory one program may opt in to (bytes)."""
    return getattr(_props(dev), "shared_memory_per_block_optin", 0) or 99 * 1024   # unknown: small GPUs' limit


def _sm_count(dev: torch.device) -> int:
    return _props(dev).multi_processor_count


_DUMMIES: dict[tuple, torch.Tensor] = {}


def _dummy(dev: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A one-element stand-in for an unused pointer argument (never read or written)."""
    key = (str(dev), dtype)
    if key not in _DUMMIES:
        _DUMMIES[key] = torch.zeros(1, dtype=dtype, device=dev)
    return _DUMMIES[key]


def _counts(counts: torch.Tensor, b: int, hq: int, n_keys: int) -> torch.Tensor:
    return counts.reshape(b, hq, -1)[..., :n_keys].to(torch.int64)


def _check_uniforms(u: torch.Tensor, want: tuple[int, ...], what: str) -> None:
    if not isinstance(u, torch.Tensor) or tuple(u.shape) != want:
        got = tuple(u.shape) if isinstance(u, torch.Tensor) else type(u).__name__
        raise KernelError(f"santa_decode: uniforms for {what} must be {want}, got {got}")


def _torch_step(q, q_score, k_cache, v_cache, n_keys, options, random, mask, uniforms, scale, static_idx=None,
                n_region=None) -> StepResult:
    """strategy="torch": the section-2 estimators over the exact softmax of the sampled keys
    (`mask`); with `static_idx`, merged with exact attention over the listed static slots by
    their exact row sums (fp32, like the rest of this path)."""
    b, hq, d = q.shape
    hkv = k_cache.shape[1]
    k = k_cache[:, :, :n_keys].to(torch.float32)
    v = v_cache[:, :, :n_keys].to(torch.float32)
    qg = q_score.to(torch.float32).reshape(b, hkv, hq // hkv, d)
    s_all = torch.einsum("bhgd,bhkd->bhgk", qg, k) * scale
    s = s_all
    if mask is not None:
        s = s.masked_fill(~mask[:n_keys].to(device=s.device, dtype=torch.bool), float("-inf"))
    want = uniforms_shape(options.method, (b, hq), options.n)
    if static_idx is not None and n_region == 0:
        c = torch.zeros(b, hq, n_keys, dtype=torch.int64, device=q.device)
        out_d = torch.zeros(b, hkv, hq // hkv, d, dtype=torch.float32, device=q.device)
        u = torch.empty(b, hq, 0, device=q.device)
    else:
        p = torch.softmax(s, -1).reshape(b, hq, n_keys)
        u = random.uniform(want, q.device) if uniforms is None else uniforms
        _check_uniforms(u, want, f"strategy 'torch', method {options.method!r}")
        c = sample_counts(p, options.n, options.method, u)
        out_d = torch.einsum("bhgk,bhkd->bhgd", c.to(torch.float32).reshape(b, hkv, hq // hkv, n_keys), v) / options.n
    if static_idx is None:
        return StepResult(out_d.reshape(b, hq, d).to(q.dtype), c, u)
    sel = static_idx.to(device=q.device, dtype=torch.long)
    s_st = s_all[..., sel]                                          # [B, Hkv, G, n_static]
    lse_s = torch.logsumexp(s_st, -1)
    o_s = torch.einsum("bhgk,bhkd->bhgd", torch.softmax(s_st, -1), v[:, :, sel])
    if n_region == 0:
        out = o_s
    else:
        w_s = torch.sigmoid(lse_s - torch.logsumexp(s, -1))[..., None]      # Z_s / (Z_s + Z_d)
        out = w_s * o_s + (1 - w_s) * out_d
    return StepResult(out.reshape(b, hq, d).to(q.dtype), c, u)


class SantaDecoder:
    """One layer's SANTA state for one sequence batch: the KV cache of the attended pattern
    (`cache_ids`: the slot of every position, from the pattern's cache analysis; `attends(pos,
    slot_pos)`: which cached positions query `pos` attends, None = all of them; `static(pos,
    slot_pos)`: which of those it attends exactly, None = none), the random source, the step
    counter. The prompt attends exactly (prefill is dense over the pattern, as in the paper);
    every decode query samples over its attended non-static keys and merges the estimate with
    exact attention over its static ones (`santa_decode(static=...)`)."""

    def __init__(self, options: SantaOptions, *, max_len: int, cache_size: int, cache_ids: np.ndarray,
                 attends=None, random: SantaRandom | None = None, scale: float | None = None,
                 prompt_mask=None, static=None):
        self.options = options
        self.max_len, self.cache_size = max_len, cache_size
        self.cache_ids = np.asarray(cache_ids, dtype=np.int64)
        self.attends = attends
        self.static = static
        self.prompt_mask = prompt_mask
        self.random = SantaRandom() if random is None else random
        self.scale = scale
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.slot_pos = np.full(cache_size, -1, dtype=np.int64)
        self.length = 0
        self.last_counts: torch.Tensor | None = None
        self.keep_counts = False

    def reset(self) -> None:
        self.k = self.v = None
        self.slot_pos[:] = -1
        self.length = 0
        self.random.reset()

    def _write(self, k: torch.Tensor, v: torch.Tensor, positions: np.ndarray) -> None:
        slots = self.cache_ids[positions]
        last: dict[int, int] = {}
        for i, s in enumerate(slots.tolist()):
            last[s] = i                     # a later position with the same slot wins
        src = torch.tensor(list(last.values()), dtype=torch.long, device=k.device)
        dst = torch.tensor(list(last.keys()), dtype=torch.long, device=k.device)
        self.k[:, :, dst] = k[:, :, src].to(self.k.dtype)
        self.v[:, :, dst] = v[:, :, src].to(self.v.dtype)
        self.slot_pos[list(last.keys())] = positions[list(last.values())]

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, hkv, p, d = k.shape
        if p > self.max_len:
            raise KernelError(f"SANTA prefill: prompt length {p} exceeds max_len={self.max_len}")
        self.reset()
        self.k = torch.zeros(b, hkv, self.cache_size, d, dtype=k.dtype, device=k.device)
        self.v = torch.zeros_like(self.k)
        m = None if self.prompt_mask is None else self.prompt_mask(p)
        mask = None if m is None else torch.as_tensor(m, device=q.device)
        scale = self.scale
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=q.shape[1] != hkv)
        self._write(k, v, np.arange(p))
        self.length = p
        return out

    def decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.k is None:
            raise KernelError("SANTA decode: no prompt yet; call prefill first")
        if k.shape[:2] != self.k.shape[:2] or k.shape[3] != self.k.shape[3] or q.dtype != self.k.dtype:
            raise KernelError(f"SANTA decode: q, k, v do not match the prompt's batch, KV heads, head dim or dtype: "
                              f"k is {list(k.shape)} {q.dtype}, the cache {list(self.k.shape)} {self.k.dtype}")
        pos = self.length
        if pos >= self.max_len:
            raise KernelError(f"SANTA decode: position {pos} is past max_len={self.max_len}")
        self._write(k, v, np.array([pos]))
        used = self.slot_pos >= 0
        n_keys = int(np.nonzero(used)[0].max()) + 1
        ok = used[:n_keys]
        if self.attends is not None:
            ok = ok & np.asarray(self.attends(pos, np.maximum(self.slot_pos[:n_keys], 0)), dtype=bool)
        static = None
        if self.static is not None:
            st = ok & np.asarray(self.static(pos, np.maximum(self.slot_pos[:n_keys], 0)), dtype=bool)
            if st.any():
                static = torch.from_numpy(st.astype(np.int8))
        # with a static part both masks stay on the host: santa_decode lists the static slots and
        # forms the sampled region there, with no device sync
        mask = None if ok.all() else torch.from_numpy(ok.astype(np.int8))
        if mask is not None and static is None:
            mask = mask.to(q.device)
        res = santa_decode(q[:, :, 0], self.k, self.v, n_keys, self.options, self.random, mask=mask, static=static,
                           scale=self.scale, return_counts=self.keep_counts)
        self.last_counts = res.counts
        self.length = pos + 1
        return res.out[:, :, None]


__all__ = ["DEFAULT_TILE", "SantaDecoder", "SantaOptions", "StepResult", "santa_decode"]
