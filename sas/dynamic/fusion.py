"""Fusion analysis of a traced score graph (paper section 6).

Two questions for the code generators, answered on the fx graph of `sas.dynamic.trace`:

1. **Inter-kernel memoization.** When the chain reads `attn_score()` (in the paper: when it
   starts with it), the score kernel need not recompute the softmax: the attention kernel
   already has each row's max `m` and sum of exponentials `l`, so the score kernel rebuilds
   `p = exp(q . k * scale - m) / l` key block by key block, in one pass.
2. **Operator fusion.** Nodes are grouped into kernels. Elementwise nodes (arithmetic,
   exp, ...) and layout nodes (reshape, the GQA fold) never start a kernel: they become the
   epilogue of the kernel producing their input. A reduction joins the kernel producing its
   input when it is that node's only use (it accumulates in registers while the producer
   sweeps the queries). Pooling (needs neighbouring keys across key blocks), top-k (needs the
   whole key row) and opaque custom operations (e.g. a matmul) start a new kernel.

`FusionPlan.summary()` is the text `sas inspect` prints.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.fx as fx

from sas.dynamic.trace import ScoreGraph, classify

_FREE = ("elementwise", "layout")
_REASON = {
    "source": "score source",
    "pool": "pooling needs neighbouring keys' scores across key blocks",
    "topk": "top-k needs the whole key row",
    "opaque": "custom operation with no fusion rule",
    "reduce": "reduction over a value used more than once",
    "elementwise": "elementwise over graph inputs only",
    "sample": "SANTA sampling runs on its own decode kernels (sas.methods.santa_triton)",
}


@dataclass(frozen=True)
class FusedKernel:
    """Graph nodes computed by one kernel, in graph order."""

    index: int
    nodes: tuple[str, ...]
    kinds: tuple[str, ...]
    ops: tuple[str, ...]          # chain operators covered, in order, without repeats
    reason: str                   # why this kernel starts (its first node)
    memoized_softmax: bool        # it rebuilds attention probabilities from the memoized (m, l)


@dataclass(frozen=True)
class ElementwiseChain:
    """A run of elementwise/layout nodes, each the only user of the previous one."""

    nodes: tuple[str, ...]
    fused_into: str               # "epilogue of <node>" / "prologue of <node>" / "own kernel"
    kernel: int


@dataclass(frozen=True)
class FusionPlan:
    score: ScoreGraph
    memoize_softmax: bool         # the chain reads attn_score(): reuse the attention's (m, l)
    starts_with_attn_score: bool  # the paper's condition for inter-kernel memoization
    kernels: tuple[FusedKernel, ...]
    elementwise_chains: tuple[ElementwiseChain, ...]

    def report(self) -> dict:
        return {
            "chain": repr(self.score.chain),
            "inputs": _inputs(self.score),
            "output": "[B, 1, Lk] shared by every KV head" if self.score.head_shared else "[B, Hkv, Lk]",
            "memoize_softmax": self.memoize_softmax,
            "starts_with_attn_score": self.starts_with_attn_score,
            "kernels": [{"nodes": list(k.nodes), "kinds": list(k.kinds), "ops": list(k.ops),
                         "reason": k.reason, "memoized_softmax": k.memoized_softmax} for k in self.kernels],
            "elementwise_chains": [{"nodes": list(c.nodes), "fused_into": c.fused_into, "kernel": c.kernel}
                                   for c in self.elementwise_chains],
        }

    def summary(self) -> str:
        sg = self.score
        lines = [f"score chain: {sg.chain!r}",
                 "graph inputs: " + ", ".join(_inputs(sg)),
                 "output: " + ("[B, 1, Lk]: one score per key, shared by every KV head" if sg.head_shared
                               else "[B, Hkv, Lk]: one score per key and KV head")]
        if self.memoize_softmax:
            how = ("the chain starts with attn_score()" if self.starts_with_attn_score
                   else "the chain reads attn_score()")
            lines.append(f"inter-kernel memoization: yes ({how}): the score kernel rebuilds "
                         f"p = exp(q.k*scale - m) / l from the attention kernel's row max m and "
                         f"sum of exponentials l instead of recomputing the softmax")
        else:
            lines.append("inter-kernel memoization: no (the chain does not read attn_score())")
        lines.append(f"kernels: {len(self.kernels)}")
        for k in self.kernels:
            body = " -> ".join(f"{n} [{kind}]" for n, kind in zip(k.nodes, k.kinds))
            lines.append(f"  #{k.index} ({k.reason}): {body}")
        if self.elementwise_chains:
            lines.append("elementwise chains fused:")
            for c in self.elementwise_chains:
                lines.append(f"  {' -> '.join(c.nodes)}: {c.fused_into} (kernel #{c.kernel})")
        else:
            lines.append("elementwise chains fused: none")
        return "\n".join(lines)


def _inputs(sg: ScoreGraph) -> list[str]:
    out = []
    if "attn_probs" in sg.uses:
        out.append("attn_probs [B, Hq, Lq, Lk]")
    if "q" in sg.uses:
        out.append("q [B, Hq, Lq, D]")
    if "k" in sg.uses:
        out.append("k [B, Hkv, Lk, D]")
    for kind, name in sg.extra_inputs:
        if kind == "weight":
            decl = sg.weights.get(name)
            out.append(f"custom weight {name!r}" + (f" {list(decl)}" if decl is not None else ""))
        else:
            out.append(f"external {name!r} [B, Hq, Lq, Lk]")
    return out


def _tensor_inputs(n: fx.Node) -> list[fx.Node]:
    return [a for a in n.all_input_nodes]


def analyze_fusion(sg: ScoreGraph) -> FusionPlan:
    """Group the score graph's nodes into kernels and list the fused elementwise chains."""
    compute = [n for n in sg.graph.nodes if n.op not in ("placeholder", "output", "get_attr")]
    group: dict[fx.Node, int] = {}
    members: list[list[fx.Node]] = []
    reasons: list[str] = []

    def new(n: fx.Node, kind: str) -> None:
        group[n] = len(members)
        members.append([n])
        reasons.append(_REASON.get(kind, kind))

    for n in compute:
        kind = classify(n)
        producers = [p for p in _tensor_inputs(n) if p in group]
        if kind in _FREE or (kind == "source" and n.meta.get("sas_source") == "custom"):
            # elementwise/layout (and the GQA fold after a custom op) ride on their latest producer
            if producers:
                g = max(group[p] for p in producers)
                group[n] = g
                members[g].append(n)
            else:
                new(n, "source" if kind == "source" else "elementwise")
        elif kind == "reduce" and len(producers) == 1 and len(producers[0].users) == 1:
            g = group[producers[0]]
            group[n] = g
            members[g].append(n)
        else:
            new(n, kind)

    kernels = []
    for idx, nodes in enumerate(members):
        ops: list[str] = []
        for n in nodes:
            op = n.meta.get("sas_op")
            if op and op not in ops:
                ops.append(op)
        memo = any(n.meta.get("sas_source") == "attn_score" for n in nodes)
        kernels.append(FusedKernel(idx, tuple(n.name for n in nodes), tuple(classify(n) for n in nodes),
                                   tuple(ops), reasons[idx], memo))

    chains: list[ElementwiseChain] = []
    seen: set[fx.Node] = set()
    for n in compute:
        if classify(n) != "elementwise" or n in seen:
            continue
        run = [n]
        while True:
            users = list(run[-1].users)
            if len(users) == 1 and classify(users[0]) in _FREE and users[0].op != "output":
                run.append(users[0])
            else:
                break
        seen.update(run)
        prod = [p for p in _tensor_inputs(run[0]) if p in group and p not in run]
        if prod:
            p = max(prod, key=lambda x: group[x])
            where = f"epilogue of {p.name}"
        else:
            users = list(run[-1].users)
            where = (f"prologue of {users[0].name}" if len(users) == 1 and users[0].op != "output"
                     else "own kernel")
        chains.append(ElementwiseChain(tuple(x.name for x in run), where, group[run[0]]))

    memo = any(n.meta.get("sas_source") == "attn_score" for n in compute)
    return FusionPlan(sg, memo, sg.starts_with_attn_score, tuple(kernels), tuple(chains))


__all__ = ["FusionPlan", "FusedKernel", "ElementwiseChain", "analyze_fusion"]
