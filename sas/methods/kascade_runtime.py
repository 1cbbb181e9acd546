"""Kascade on its Triton kernels (`sas.methods.kascade_triton`): one layer's prefill or decode
step, reading and writing the per-forward-step `SelectionStore`.

`KascadeRuntime().prefill(layer, q, k, v, store, layer_idx)` (queries = keys = the prompt) and
`.decode(layer, q, k, v, store, layer_idx)` (one query at position N-1 over the N cached keys)
compute what `sas.methods.kascade.reference_prefill` / `reference_decode` specify:

- dense anchor: FlashAttention with row lse (prefill) / split-K scores (decode), output dense;
- anchor: the same score pass without the output, then the pooled scores (prefill: per query
  tile, streamed in chunks of tiles; decode: over the G heads), the top-k on the host
  (torch.topk, sorted), the selection published, and attention over it (gather kernel);
- reuse: only the gather kernel, over the published sets through the head map.

The budget is a run-time count (never a kernel constant), so no step recompiles.
"""

from __future__ import annotations

import math
import os

import torch
import triton

from sas.errors import KernelError
from sas.methods.kascade import KascadeError, KascadeLayer, Published, SelectionStore, check_head_map, tile_counts
from sas.methods.kascade_triton import (kascade_decode_pool_kernel, kascade_decode_scores_kernel,
                                        kascade_flash_kernel, kascade_gather_decode_kernel,
                                        kascade_gather_prefill_kernel, kascade_tile_scores_kernel)
from sas.methods.partials_triton import merge_partials_kernel

LOG2E = 1.4426950408889634
#: bytes of pooled tile scores alive at once in prefill selection (the chunk of tiles)
CHUNK_BYTES = 2**30


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _flags(t: torch.Tensor) -> dict:
    return dict(DOT_PRECISION="ieee" if t.dtype == torch.float32 else "tf32",
                UPCAST=t.dtype == torch.bfloat16 and _interpreting())


def check_step(where: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, decode: bool) -> None:
    """Shapes, dtypes and devices of one step (KernelError before any kernel runs)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise KernelError(f"{where}: {name} must be a 4-d tensor [B, H, L, D], got "
                              f"{getattr(t, 'shape', type(t).__name__)}")
        if t.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise KernelError(f"{where}: {name} must be float16, bfloat16 or float32, got {t.dtype}")
        if t.device.type != "cuda" and not _interpreting():
            raise KernelError(f"{where}: {name} is on {t.device}; the Kascade kernels run on CUDA (or the CPU "
                              f"under TRITON_INTERPRET=1)")
    if k.shape != v.shape or q.dtype != k.dtype or k.dtype != v.dtype:
        raise KernelError(f"{where}: k {tuple(k.shape)} {k.dtype} and v {tuple(v.shape)} {v.dtype} must match each "
                          f"other and q's dtype {q.dtype}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] or q.shape[1] % k.shape[1]:
        raise KernelError(f"{where}: q {tuple(q.shape)} and k {tuple(k.shape)}: batch and head dim must match and "
                          f"the query heads must be a multiple of the KV heads")
    want = 1 if decode else k.shape[2]
    if q.shape[2] != want:
        raise KernelError(f"{where}: {'decode takes one query' if decode else 'prefill takes the whole prompt'} "
                          f"(q length {want}), got q length {q.shape[2]} over {k.shape[2]} keys")


class KascadeRuntime:
    """Runs Kascade layers on the Triton kernels (stateless: the store carries the selections)."""

    def __init__(self, *, chunk_bytes: int = CHUNK_BYTES, decode_programs: int = 1024,
                 block_n: int = 64, block_m: int = 128):
        self.chunk_bytes = chunk_bytes
        self.decode_programs = decode_programs
        self.block_n = block_n
        self.block_m = block_m

    # --- prefill -------------------------------------------------------------------------------
    def flash(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
              write_o: bool) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Causal attention per query head: (output or None, lse [B, Hq, N] log2 domain)."""
        b, hq, n, d = q.shape
        g = hq // k.shape[1]
        lse = torch.empty(b, hq, n, device=q.device, dtype=torch.float32)
        out = torch.empty_like(q) if write_o else lse
        bm = self.block_m
        bn = min(self.block_n, bm)
        kascade_flash_kernel[(triton.cdiv(n, bm), b * hq)](
            q, k, v, out, lse, n, hq, g, d, scale * LOG2E, BLOCK_M=bm, BLOCK_N=bn,
            BLOCK_D=triton.next_power_of_2(d), WRITE_O=write_o, num_warps=8 if d > 64 else 4, num_stages=3,
            **_flags(q))
        return (out if write_o else None), lse

    def select_prefill(self, layer: KascadeLayer, q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor,
                       scale: float) -> tuple[torch.Tensor, list[int]]:
        """Per-tile sets [B, Hkv, n_tiles, kmax] int32 (sorted by descending pooled score) and counts."""
        b, hq, n, d = q.shape
        hkv = k.shape[1]
        g = hq // hkv
        tile = layer.tile
        counts = tile_counts(n, tile, layer.budget)
        nt = len(counts)
        kmax = max(max(counts), 1)
        idx = torch.zeros(b, hkv, nt, kmax, device=q.device, dtype=torch.int32)
        sparse = [t for t in range(nt) if counts[t] < t * tile]
        first_sparse = sparse[0] if sparse else nt
        for t in range(first_sparse):            # dense tiles: every earlier key
            if counts[t]:
                idx[:, :, t, : counts[t]] = torch.arange(counts[t], device=q.device, dtype=torch.int32)
        if first_sparse == nt:
            return idx, counts
        ch = max(1, min(nt - first_sparse, self.chunk_bytes // max(1, b * hkv * n * 4)))
        scr = torch.empty(b * hkv, ch, n, device=q.device, dtype=torch.float32)
        br = max(16, triton.next_power_of_2(tile * g))
        for t0 in range(first_sparse, nt, ch):
            c = min(ch, nt - t0)
            scr.fill_(-1.0)                     # probabilities are >= 0: keys not scored never win
            kascade_tile_scores_kernel[(c, b * hkv)](
                q, k, lse, scr, n, hkv, g, d, t0, nt, ch, tile, scale * LOG2E,
                BLOCK_R=br, BLOCK_N=self.block_n, BLOCK_D=triton.next_power_of_2(d),
                num_warps=8 if br * d >= 128 * 128 else 4, **_flags(q))
            kc = max(counts[t0:t0 + c])
            top = torch.topk(scr[:, :c], kc, dim=-1, sorted=True).indices
            idx[:, :, t0:t0 + c, :kc] = top.view(b, hkv, c, kc).to(torch.int32)
        return idx, counts

    def gather_prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor,
                       counts: list[int], head_map: tuple[int, ...], tile: int, scale: float) -> torch.Tensor:
        b, hq, n, d = q.shape
        hkv = k.shape[1]
        g = hq // hkv
        nt = len(counts)
        out = torch.empty_like(q)
        cnt = torch.tensor(counts, device=q.device, dtype=torch.int32)
        hmap = torch.tensor(head_map, device=q.device, dtype=torch.int32)
        br = max(16, triton.next_power_of_2(tile * g))
        kascade_gather_prefill_kernel[(nt, b * hkv)](
            q, k, v, out, idx, cnt, hmap, n, hkv, idx.shape[1], g, d, nt, idx.shape[3], tile, scale * LOG2E,
            BLOCK_R=br, BLOCK_N=self.block_n, BLOCK_T=max(16, triton.next_power_of_2(tile)),
            BLOCK_D=triton.next_power_of_2(d), num_warps=8 if br * d >= 128 * 128 else 4, **_flags(q))
        return out

    def prefill(self, layer: KascadeLayer, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                store: SelectionStore, layer_idx: int, scale: float | None = None) -> torch.Tensor:
        where = f"Kascade prefill (layer {layer_idx}, {layer.role})"
        check_step(where, q, k, v, decode=False)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        n, d, hkv = k.shape[2], k.shape[3], k.shape[1]
        scale = 1.0 / math.sqrt(d) if scale is None else scale
        if layer.role == "reuse":
            sel = store.get(layer.name, layer=layer_idx, mode="prefill", length=n, batch=q.shape[0])
            hm = check_head_map(layer.head_map, hkv, sel.idx.shape[1], where)
            return self.gather_prefill(q, k, v, sel.idx, sel.counts, hm, sel.tile, scale)
        out, lse = self.flash(q, k, v, scale, write_o=layer.role == "dense_anchor")
        idx, counts = self.select_prefill(layer, q, k, lse, scale)
        store.publish(layer.name, Published(layer_idx, "prefill", n, idx, counts, layer.tile))
        if out is not None:
            return out
        return self.gather_prefill(q, k, v, idx, counts, tuple(range(hkv)), layer.tile, scale)

    # --- decode --------------------------------------------------------------------------------
    def _splits(self, bhkv: int, work: int) -> int:
        return max(1, min(triton.cdiv(self.decode_programs, bhkv), triton.cdiv(work, 256)))

    def _merge(self, o_part, m_part, l_part, s, q) -> torch.Tensor:
        b, hq, _, d = q.shape
        out = torch.empty_like(q)
        bg = o_part.shape[2]
        merge_partials_kernel[(m_part.shape[0],)](o_part, m_part, l_part, out, s, s, hq * b // m_part.shape[0], d,
                                             BLOCK_G=bg, BLOCK_D=o_part.shape[3])
        return out

    def decode_scores(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                      write_o: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The GQA-pooled post-softmax scores [B, Hkv, N] and, with write_o, the dense output."""
        b, hq, _, d = q.shape
        hkv, n = k.shape[1], k.shape[2]
        g = hq // hkv
        bg = max(16, triton.next_power_of_2(g))
        bd = triton.next_power_of_2(d)
        s = self._splits(b * hkv, n)
        chunk = triton.cdiv(triton.cdiv(n, s), self.block_n) * self.block_n
        s = triton.cdiv(n, chunk)
        sl = torch.empty(b, hq, n, device=q.device, dtype=torch.float32)
        m_part = torch.empty(b * hkv, s, bg, device=q.device, dtype=torch.float32)
        l_part = torch.empty_like(m_part)
        o_part = torch.empty(b * hkv, s, bg, bd, device=q.device, dtype=torch.float32) if write_o else m_part
        kascade_decode_scores_kernel[(b * hkv, s)](
            q, k, v, sl, o_part, m_part, l_part, n, g, d, chunk, s, scale * LOG2E,
            BLOCK_G=bg, BLOCK_N=self.block_n, BLOCK_D=bd, WRITE_O=write_o, num_warps=4, **_flags(q))
        m = m_part.amax(dim=1)
        lse = m + torch.log2((l_part * torch.exp2(m_part - m[:, None])).sum(dim=1))     # [B*Hkv, BG]
        lse = lse[:, :g].contiguous()
        pooled = torch.empty(b, hkv, n, device=q.device, dtype=torch.float32)
        bn = 256
        kascade_decode_pool_kernel[(b * hkv, triton.cdiv(n, bn))](sl, lse, pooled, n, g, BLOCK_G=bg, BLOCK_N=bn)
        out = self._merge(o_part, m_part, l_part, s, q) if write_o else None
        return pooled, out

    def gather_decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor, count: int,
                      head_map: tuple[int, ...], scale: float) -> torch.Tensor:
        b, hq, _, d = q.shape
        hkv, n = k.shape[1], k.shape[2]
        g = hq // hkv
        bg = max(16, triton.next_power_of_2(g))
        bd = triton.next_power_of_2(d)
        s = self._splits(b * hkv, count)
        m_part = torch.empty(b * hkv, s, bg, device=q.device, dtype=torch.float32)
        l_part = torch.empty_like(m_part)
        o_part = torch.empty(b * hkv, s, bg, bd, device=q.device, dtype=torch.float32)
        hmap = torch.tensor(head_map, device=q.device, dtype=torch.int32)
        kascade_gather_decode_kernel[(b * hkv, s)](
            q, k, v, idx, hmap, o_part, m_part, l_part, n, hkv, idx.shape[1], g, d, idx.shape[2], count, s,
            scale * LOG2E, BLOCK_G=bg, BLOCK_N=self.block_n, BLOCK_D=bd, num_warps=4, **_flags(q))
        return self._merge(o_part, m_part, l_part, s, q)

    def decode(self, layer: KascadeLayer, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               store: SelectionStore, layer_idx: int, scale: float | None = None) -> torch.Tensor:
        where = f"Kascade decode (layer {layer_idx}, {layer.role})"
        check_step(where, q, k, v, decode=True)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        n, d, hkv = k.shape[2], k.shape[3], k.shape[1]
        scale = 1.0 / math.sqrt(d) if scale is None else scale
        if layer.role == "reuse":
            sel = store.get(layer.name, layer=layer_idx, mode="decode", length=n, batch=q.shape[0])
            hm = check_head_map(layer.head_map, hkv, sel.idx.shape[1], where)
            return self.gather_decode(q, k, v, sel.idx, sel.counts[0], hm, scale)
        pooled, out = self.decode_scores(q, k, v, scale, write_o=layer.role == "dense_anchor")
        c = layer.budget.keys(n)
        idx = torch.topk(pooled, c, dim=-1, sorted=True).indices.to(torch.int32)
        store.publish(layer.name, Published(layer_idx, "decode", n, idx, [c], 1))
        if out is not None:
            return out
        return self.gather_decode(q, k, v, idx, c, tuple(range(hkv)), scale)


def check_layer(layer: KascadeLayer, where: str) -> KascadeLayer:
    if not isinstance(layer, KascadeLayer):
        raise KascadeError(f"{where}: expected a KascadeLayer, got {type(layer).__name__}")
    return layer


__all__ = ["CHUNK_BYTES", "KascadeRuntime", "check_step"]
