"""Trace an importance-score op chain into a torch.fx graph (paper section 6, Figure 13).

`trace_score(chain)` turns `ops.attn_score().sum(dim=1)`, and chains built from registered
custom operators over `sas.sym` inputs, into a `ScoreGraph`: a `torch.fx.GraphModule` plus
what the runtime and the code generators need to know about it.

Graph inputs (placeholders, in this order):

| placeholder | tensor | shape |
|---|---|---|
| `attn_probs` | attention probabilities of the step's queries over all keys so far | `[B, Hq, Lq, Lk]` |
| `q` | the step's queries (`sas.sym.active_Q`) | `[B, Hq, Lq, D]` |
| `k` | the keys produced so far (`sas.sym.active_K`) | `[B, Hkv, Lk, D]` |
| `w_<name>` | `other_inputs[name]`, a custom weight | as the user passes it |
| `ext_<name>` | `ops.external(name)`: the step's rows of `other_inputs[name]` | `[B, Hq, Lq, Lk]` |

Graph output: one score per key, `[B, Hkv, Lk]` (or `[B, 1, Lk]` for a score shared by all
KV heads; `ScoreGraph.__call__` expands it).

The chain view (what `dim=` means): every source (`attn_score()`, a custom op, an external
score) is a `[B, Hq, Lq, Lk]` tensor; it is viewed as `[B, Hkv, G*Lq, Lk]` with the `G = Hq/Hkv`
query heads of a KV head stacked on the query axis (GQA groups pool onto their KV head), and
the batch axis is implicit. Chain dims therefore are `0 = KV head`, `1 = (group head, query)`,
`2 = key`; `sum(dim=1)` is the paper's "sum over the queries" and also sums the group's heads.
Negative dims count from the end (`-1` is the key axis). The chain must end with one score per
key: `[Hkv, Lk]`, or `[Lk]` (shared by every KV head).
"""

from __future__ import annotations

import inspect
import operator
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.fx as fx

from sas.dynamic import score_ops
from sas.errors import KernelError, NotYetSupportedError, PatternError, SASError
from sas.lang import ops as ops_mod
from sas.lang import sym as sym_mod
from sas.lang.ops import OpChain, OpNode
from sas.methods import kascade as kascade_mod
from sas.methods import saap as saap_mod
from sas.methods import santa as santa_mod
from sas.methods import specattn as specattn_mod

# Axis labels of the chain view (batch implicit).
HEAD, QUERY, KEY = "Hkv", "G*Lq", "Lk"
SOURCE_LABELS = (HEAD, QUERY, KEY)

_ARITH = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv}
_REDUCE = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax}


@dataclass(frozen=True, eq=False)
class ScoreGraph:
    """A traced score chain: `graph_module(attn_probs, q, k, *extra)` -> `[B, Hkv | 1, Lk]`, with
    `extra` the tensors named by `extra_inputs`, in that order. Call the `ScoreGraph` itself to
    get checked inputs, errors that name the op, and `[B, Hkv, Lk]` scores."""

    chain: OpChain
    graph_module: fx.GraphModule
    weights: Mapping[str, tuple | None]       # custom weight name -> declared shape (or None)
    externals: tuple[str, ...]                 # ops.external names
    uses: frozenset[str]                       # which of attn_probs / q / k the chain reads
    head_shared: bool                          # output [B, 1, Lk] (reduced over KV heads)
    starts_with_attn_score: bool               # first op is attn_score(): softmax stats reusable
    extra_inputs: tuple[tuple[str, str], ...] = ()  # ("weight" | "external", name) in call order
    #: SANTA (`.sample(...)` ends the chain): its arguments plus the score estimator's
    #: (`qk`, `qk_samples`, `qk_group`); None for selection chains
    sample: Mapping[str, Any] | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        """Copies and pickles trace the chain again (fx would re-trace the generated code with
        its default tracer, which runs sas's operators on proxies and fails)."""
        return trace_score, (self.chain,)

    @property
    def graph(self) -> fx.Graph:
        return self.graph_module.graph

    @property
    def code(self) -> str:
        return self.graph_module.code

    def check_inputs(self, attn_probs: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                     other_inputs: Mapping[str, Any] | None = None) -> None:
        """Raise `KernelError` naming the tensor when a step's inputs do not fit the graph."""
        _check_step_tensors(attn_probs, q, k)
        dims = _dims(attn_probs, q, k)
        other_inputs = other_inputs or {}
        for name, decl in self.weights.items():
            users = self._users_of(name)
            if name not in other_inputs:
                raise KernelError(
                    f"custom weight {name!r} (used by {users}) is missing from other_inputs; "
                    f"given: {sorted(other_inputs)}")
            w = other_inputs[name]
            if not isinstance(w, torch.Tensor):
                raise KernelError(f"other_inputs[{name!r}] (custom weight used by {users}) must be a "
                                  f"torch.Tensor, got {type(w).__name__}")
            if decl is not None:
                want = tuple(dims[s] if isinstance(s, str) else s for s in decl)
                ok = len(want) == w.dim() and all(a is None or a == b for a, b in zip(want, w.shape))
                if not ok:
                    shown = tuple(f"{s}={dims[s]}" if isinstance(s, str) else s for s in decl)
                    raise KernelError(f"custom weight {name!r} (used by {users}) must have shape "
                                      f"{shown}, got {tuple(w.shape)}")
        for name in self.externals:
            if name not in other_inputs:
                raise KernelError(f"external score {name!r} (ops.external) is missing from other_inputs; "
                                  f"given: {sorted(other_inputs)}")
            x = other_inputs[name]
            want = (dims["B"], dims["Hq"], dims["Lq"], dims["Lk"])
            if not isinstance(x, torch.Tensor) or tuple(x.shape) != want:
                got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise KernelError(f"external score {name!r} must be [B, Hq, Lq, Lk] = {want} for this "
                                  f"step, got {got}")

    def __call__(self, attn_probs: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                 other_inputs: Mapping[str, Any] | None = None) -> torch.Tensor:
        """One score per key `[B, Hkv, Lk]` for one step (externals already sliced to the step)."""
        other_inputs = other_inputs or {}
        self.check_inputs(attn_probs, q, k, other_inputs)
        dtype = attn_probs.dtype
        extra = [_as_dtype(other_inputs[name], dtype) for _, name in self.extra_inputs]
        out = _ScoreInterpreter(self, _dims(attn_probs, q, k)).run(attn_probs, q, k, *extra)
        b, hkv, lk = q.shape[0], k.shape[1], k.shape[2]
        if not isinstance(out, torch.Tensor) or out.dim() != 3 or out.shape[0] != b or \
                out.shape[2] != lk or out.shape[1] not in (1, hkv):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise PatternError(f"score chain {self.chain!r} produced {got}, expected one score per key "
                               f"[B, Hkv, Lk] = {(b, hkv, lk)}")
        return out.expand(b, hkv, lk)

    def _users_of(self, weight: str) -> str:
        ops = sorted({u.meta.get("sas_op", "?") for n in self.graph.nodes
                      if n.op == "placeholder" and n.meta.get("sas_weight") == weight for u in n.users})
        return ", ".join(ops) if ops else "the score chain"


def _as_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Floating-point inputs follow the score dtype; integer tensors (indices) are left alone."""
    return t.to(dtype) if t.is_floating_point() else t


def _check_step_tensors(attn_probs, q, k) -> None:
    for name, t, rank in (("attn_probs", attn_probs, 4), ("q", q, 4), ("k", k, 4)):
        if not isinstance(t, torch.Tensor) or t.dim() != rank:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise KernelError(f"score graph input {name!r} must be a {rank}-d torch.Tensor, got {got}")
    b, hq, lq, d = q.shape
    if k.shape[0] != b or k.shape[3] != d:
        raise KernelError(f"score graph: k {tuple(k.shape)} does not match q {tuple(q.shape)} "
                          f"(expected [B={b}, Hkv, Lk, D={d}])")
    if hq % k.shape[1] != 0:
        raise KernelError(f"score graph: {hq} query heads cannot be grouped onto {k.shape[1]} KV heads")
    want = (b, hq, lq, k.shape[2])
    if tuple(attn_probs.shape) != want:
        raise KernelError(f"score graph input 'attn_probs' must be [B, Hq, Lq, Lk] = {want}, "
                          f"got {tuple(attn_probs.shape)}")


def _dims(attn_probs, q, k) -> dict[str, int]:
    b, hq, lq, d = q.shape
    return {"B": b, "Hq": hq, "Hkv": k.shape[1], "Lq": lq, "Lk": k.shape[2], "D": d}


class _ScoreInterpreter(fx.Interpreter):
    """Runs the graph node by node so that a failure is reported with the chain op it belongs to."""

    def __init__(self, sg: ScoreGraph, dims: dict[str, int]):
        super().__init__(sg.graph_module)
        self.extra_traceback = False      # our messages already name the op and the inputs
        self.sg, self.dims, self.shapes = sg, dims, {}

    def run_node(self, n: fx.Node) -> Any:
        try:
            result = super().run_node(n)
        except SASError:
            raise
        except Exception as e:  # a torch error inside an op: name the op and the inputs' shapes
            op = n.meta.get("sas_op", "?")
            ins = ", ".join(f"{k} {v}" for k, v in self.shapes.items())
            raise KernelError(f"score op {op} failed at graph node '{n.name}': "
                              f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                              f"(inputs: {ins})") from None
        if n.op == "placeholder" and isinstance(result, torch.Tensor):
            self.shapes[n.meta.get("sas_label", n.name)] = tuple(result.shape)
        check = n.meta.get("sas_check_source")
        if check is not None:
            d = self.dims
            want = (d["B"], d["Hq"], d["Lq"], d["Lk"])
            if not isinstance(result, torch.Tensor) or tuple(result.shape) != want:
                got = tuple(result.shape) if isinstance(result, torch.Tensor) else type(result).__name__
                ins = ", ".join(f"{k} {v}" for k, v in self.shapes.items())
                raise PatternError(
                    f"custom score op {check!r} returned shape {got}; a score source must return "
                    f"[B, Hq, Lq, Lk] = {want} (one value per query head, query and key; inputs: {ins})")
        return result


# --- tracing ------------------------------------------------------------------------------------

class _Tracer:
    def __init__(self, chain: OpChain):
        self.root_chain = chain
        self.graph = fx.Graph()
        self.proxy_tracer = fx.proxy.GraphAppendingTracer(self.graph)
        self.ph: dict[str, fx.Node] = {}
        for name, label in (("attn_probs", "attn_probs"), ("q", "active_Q"), ("k", "active_K")):
            node = self.graph.placeholder(name)
            node.meta.update(sas_kind="input", sas_label=label)
            self.ph[name] = node
        self.weights: dict[str, tuple | None] = {}
        self.externals: list[str] = []
        self.uses: set[str] = set()

    # placeholders for named tensors are created on first use, after the fixed ones
    def _named_input(self, key: str, label: str) -> fx.Node:
        if key not in self.ph:
            last = [n for n in self.graph.nodes if n.op == "placeholder"][-1]
            with self.graph.inserting_after(last):
                node = self.graph.placeholder(key)
            node.meta.update(sas_kind="input", sas_label=label)
            self.ph[key] = node
        return self.ph[key]

    def weight(self, s: sym_mod.Sym, op: str) -> fx.Node:
        if s.name in self.externals:
            raise PatternError(f"custom op {op!r}: {s.name!r} is already used as an external score "
                               f"(ops.external); a tensor name has one role")
        decl, before = s.declared_shape, self.weights.get(s.name)
        if decl is not None and before is not None and decl != before:
            raise PatternError(f"custom weight {s.name!r} declared with two shapes: {before} and {decl}")
        if before is None:
            self.weights[s.name] = decl
        node = self._named_input("w_" + s.name, f"custom weight {s.name!r}")
        node.meta["sas_weight"] = s.name
        return node

    def call(self, target, args, kwargs=None, *, op: str, kind: str) -> fx.Node:
        node = self.graph.call_function(target, tuple(args), kwargs or {})
        node.meta.update(sas_op=op, sas_kind=kind)
        return node

    # chain -> (node, labels)
    def trace(self, chain: OpChain) -> tuple[fx.Node, tuple[str, ...]]:
        node, labels = None, ()
        for idx, op_node in enumerate(chain.nodes):
            where = repr(OpChain(chain.nodes[: idx + 1]))
            if idx == 0:
                node, labels = self.source(op_node, where)
            else:
                node, labels = self.transform(op_node, node, labels, where)
        return node, labels

    def source(self, n: OpNode, where: str) -> tuple[fx.Node, tuple[str, ...]]:
        a = dict(n.args)
        if n.name == "attn_score":
            if a and self.root_chain.nodes[-1].name != "sample":
                raise NotYetSupportedError(
                    f"score op {where}: the Bernoulli score estimator (SANTA section 5) runs only in a "
                    f"sampling chain, ops.attn_score(estimator='bernoulli').sample(n=...)")
            self.uses.update({"attn_probs", "k"})
            node = self.call(score_ops.attn_score, (self.ph["attn_probs"], self.ph["k"]),
                             op="attn_score()", kind="source")
            node.meta["sas_source"] = "attn_score"
            return node, SOURCE_LABELS
        if n.name == "custom":
            return self.custom(a["op"]), SOURCE_LABELS
        if n.name == "external":
            name = a["name"]
            if name in self.weights:
                raise PatternError(f"ops.external({name!r}): {name!r} is already a custom weight; a tensor "
                                   f"name has one role")
            if name not in self.externals:
                self.externals.append(name)
            self.uses.add("k")
            ph = self._named_input("ext_" + name, f"external {name!r}")
            ph.meta["sas_external"] = name
            node = self.call(score_ops.fold_heads, (ph, self.ph["k"]), op=f"external({name!r})", kind="source")
            node.meta["sas_source"] = "external"
            return node, SOURCE_LABELS
        if n.name == "partition":
            return self.partition(a, where), SOURCE_LABELS
        if n.name == "reuse":
            return self.reuse(a, where), (HEAD, KEY)
        raise PatternError(f"score chain {self.root_chain!r}: {where} cannot start a chain; a chain starts "
                           f"with ops.attn_score(), ops.external(...) or a registered custom op")

    def partition(self, a: dict, where: str) -> fx.Node:
        """Saap: `other_inputs[centroids]` [Hkv, C, D] and the folded classifier
        `other_inputs[classifier + "_w1" | "_b1" | "_w2" | "_b2"]` (sas.methods.saap); the source
        value of (query, key) is the classifier probability of the key's bucket."""
        names = [a["centroids"]] + [f"{a['classifier']}_{part}" for part in saap_mod.CLASSIFIER_PARTS]
        nodes = []
        for name in names:
            if name in self.externals:
                raise PatternError(f"score op {where}: {name!r} is already an external score (ops.external); a "
                                   f"tensor name has one role")
            self.weights.setdefault(name, None)
            node = self._named_input("w_" + name, f"Saap state {name!r}")
            node.meta["sas_weight"] = name
            nodes.append(node)
        self.uses.update({"q", "k"})
        node = self.call(saap_mod.partition_source, (self.ph["q"], self.ph["k"], *nodes), op=where, kind="source")
        node.meta["sas_source"] = "partition"
        return node

    def reuse(self, a: dict, where: str) -> fx.Node:
        """Kascade: an index source. The keys come from the selection another layer published in
        the same forward step (sas.methods.kascade); it is already one value per (KV head, key),
        so the chain ends here (no transform may follow)."""
        if len(self.root_chain.nodes) != 1:
            raise PatternError(f"score chain {self.root_chain!r}: ops.reuse(...) is an index source and takes no "
                               f"transforms; write score=ops.reuse(name, head_map=...)")
        self.uses.add("k")
        node = self.call(kascade_mod.reuse_source, (self.ph["k"], a["layer"], a["head_map"]), op=where,
                         kind="source")
        node.meta["sas_source"] = "reuse"
        return node

    def custom(self, name: str) -> fx.Node:
        fn = ops_mod.custom_op(name)
        op = f"{name}()"
        before = set(self.graph.nodes)

        def resolve(s: sym_mod.Sym) -> fx.Proxy:
            if s.kind == "weight":
                node = self.weight(s, name)
            elif s.name == "active_Q":
                self.uses.add("q")
                node = self.ph["q"]
            else:
                self.uses.add("k")
                node = self.ph["k"]
            return fx.Proxy(node, self.proxy_tracer)

        try:
            required = [p for p in inspect.signature(fn).parameters.values()
                        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD,
                                                               p.KEYWORD_ONLY)]
        except (TypeError, ValueError):
            required = []
        if required:
            raise PatternError(f"custom score op {name!r} must take no arguments (it reads sas.sym inputs), "
                               f"but requires {[p.name for p in required]}")
        token = sym_mod._RESOLVER.set(resolve)
        try:
            result = fn()
        except SASError:
            raise
        except fx.proxy.TraceError as e:
            raise PatternError(f"custom score op {name!r} cannot be traced: {e} (no Python control flow on "
                               f"symbolic tensors)") from None
        except Exception as e:
            raise PatternError(f"custom score op {name!r} failed while tracing: {type(e).__name__}: {e}") from None
        finally:
            sym_mod._RESOLVER.reset(token)
        if isinstance(result, sym_mod.Sym):
            token = sym_mod._RESOLVER.set(resolve)
            try:
                result = result._value()
            finally:
                sym_mod._RESOLVER.reset(token)
        if not isinstance(result, fx.Proxy):
            raise PatternError(f"custom score op {name!r} must return a torch expression over sas.sym inputs "
                               f"(a [B, Hq, Lq, Lk] score), got {type(result).__name__}")
        for node in self.graph.nodes:
            if node not in before and node.op != "placeholder":
                node.meta.setdefault("sas_op", op)
                node.meta.setdefault("sas_kind", classify(node))
        result.node.meta["sas_check_source"] = name
        self.uses.add("k")
        node = self.call(score_ops.fold_heads, (result.node, self.ph["k"]), op=op, kind="source")
        node.meta["sas_source"] = "custom"
        return node

    def transform(self, n: OpNode, x: fx.Node, labels: tuple[str, ...], where: str):
        a = dict(n.args)
        if n.name == "reduce":
            r, d = len(labels), a["dim"]
            if not -r <= d < r:
                raise PatternError(f"score op {where}: dim={d} is out of range for a {r}-d score "
                                   f"{list(labels)} (chain dims: 0 = KV head, 1 = (group head, query), "
                                   f"2 = key)")
            d = d % r
            if labels[d] == KEY:
                raise PatternError(f"score op {where}: reduces the key axis ({KEY}), which leaves no score "
                                   f"per key; reduce the query axis (dim=1) instead")
            node = self.call(_REDUCE[a["kind"]], (x,), {"dim": d + 1}, op=repr(n), kind="reduce")
            return node, labels[:d] + labels[d + 1:]
        if n.name == "pooling":
            node = self.call(score_ops.pool_keys, (x, a["kernel_size"], a["kind"]), op=repr(n), kind="pool")
            return node, labels
        if n.name == "topk":
            node = self.call(score_ops.topk_mask, (x, a["k"]), op=repr(n), kind="topk")
            return node, labels
        if n.name == "top_p":          # SpecAttn selection: union over the rows (sas.methods.specattn)
            if labels not in (SOURCE_LABELS, (HEAD, KEY), (KEY,)):
                raise PatternError(f"score op {where}: top_p selects along the key axis of a source "
                                   f"[{HEAD}, {QUERY}, {KEY}] or a per-key score; got axes {list(labels)}")
            self.uses.update({"q", "k"})
            node = self.call(specattn_mod.top_p_op, (x, self.ph["q"], self.ph["k"], a["p"], a["chunk"],
                                                    a["pooled"], a["iters"]), op=repr(n), kind="topk")
            return node, ((HEAD, KEY) if labels == SOURCE_LABELS else labels)
        if n.name in _ARITH:
            other = a["other"]
            if isinstance(other, OpChain):
                y, ylab = self.trace(other)
                if ylab != labels:
                    raise PatternError(
                        f"score op {where}: operands have different axes, {list(labels)} and {list(ylab)} "
                        f"(of {other!r}); reduce both to the same axes first")
            else:
                y = other
            node = self.call(_ARITH[n.name], (x, y), op=f"{n.name}({'chain' if isinstance(other, OpChain) else other})",
                             kind="elementwise")
            return node, labels
        if n.name == "sample":
            return self.sample(n, x, labels, where)
        if n.name in ("attn_score", "custom", "external"):
            raise PatternError(f"score op {where}: a source can only start a chain")
        raise PatternError(f"score op {where}: unknown operator {n.name!r}")


    def sample(self, n: OpNode, x: fx.Node, labels: tuple[str, ...], where: str):
        """SANTA: `.sample(n, method)` ends a chain `ops.attn_score().sample(...)`; per query head it
        turns the probabilities into draw counts and changes the output (sas.methods.santa). In
        the graph it stands for the expected draws per key and KV head, `n * sum(p)` over the
        group's heads and the step's queries."""
        chain = self.root_chain
        if chain.nodes[-1] is not n or len(chain.nodes) != 2 or chain.nodes[0].name != "attn_score":
            raise NotYetSupportedError(
                f"score op {where}: SANTA value sampling runs as ops.attn_score().sample(n=..., method=...) "
                f"alone (per query head, over the exact post-softmax attention; docs/dynamic.md section 6, "
                f"docs/santa.md); got {chain!r}")
        node = self.call(santa_mod.expected_draws, (x, dict(n.args)["n"]), op=repr(n), kind="sample")
        return node, (HEAD, KEY)


_ELEMENTWISE_FUNCS = {operator.add, operator.sub, operator.mul, operator.truediv, operator.neg,
                      operator.pow, operator.abs, torch.add, torch.sub, torch.mul, torch.div,
                      torch.exp, torch.log, torch.abs, torch.neg, torch.sqrt, torch.rsqrt,
                      torch.sigmoid, torch.tanh, torch.relu, torch.clamp, torch.where, torch.pow,
                      torch.square, torch.maximum, torch.minimum, torch.nn.functional.relu}
_ELEMENTWISE_METHODS = {"add", "sub", "mul", "div", "exp", "log", "abs", "neg", "sqrt", "rsqrt",
                        "sigmoid", "tanh", "relu", "clamp", "pow", "square", "float", "to", "type_as"}
_REDUCE_FUNCS = {torch.sum, torch.mean, torch.amax, torch.amin}
_REDUCE_METHODS = {"sum", "mean", "amax", "amin", "max", "min"}


def classify(node: fx.Node) -> str:
    """Kind of a graph node: input, source, elementwise, reduce, pool, topk, layout or opaque."""
    if "sas_kind" in node.meta:
        return node.meta["sas_kind"]
    if node.op == "placeholder":
        return "input"
    if node.op == "call_function":
        if node.target in _ELEMENTWISE_FUNCS:
            return "elementwise"
        if node.target in _REDUCE_FUNCS:
            return "reduce"
        if node.target in (operator.getitem, getattr):
            return "layout"
    if node.op == "call_method":
        if node.target in _ELEMENTWISE_METHODS:
            return "elementwise"
        if node.target in _REDUCE_METHODS:
            return "reduce"
        if node.target in ("reshape", "view", "transpose", "permute", "unsqueeze", "squeeze",
                           "expand", "contiguous", "size"):
            return "layout"
    return "opaque"


def trace_score(chain: OpChain) -> ScoreGraph:
    """Trace `chain` into a `ScoreGraph`; `PatternError` if it does not end with one score per key,
    `NotYetSupportedError` where a traced operator has no kernel yet."""
    if not isinstance(chain, OpChain) or not chain.nodes:
        raise PatternError(f"trace_score: expected an op chain from sas.ops (e.g. ops.attn_score().sum(dim=1)), "
                           f"got {chain!r}")
    t = _Tracer(chain)
    node, labels = t.trace(chain)
    last = chain.nodes[-1]
    if labels == (KEY,):
        head_shared = True
        out = t.graph.call_method("unsqueeze", (node, 1))
        out.meta.update(sas_op=repr(last), sas_kind="layout")
    elif labels == (HEAD, KEY):
        head_shared, out = False, node
    else:
        hint = ("reduce the query axis, e.g. .sum(dim=1)" if QUERY in labels
                else "keep the key axis and one score per KV head")
        raise PatternError(
            f"score chain {chain!r} must end with one score per key ([{HEAD}, {KEY}] or [{KEY}]), but its "
            f"last op {last!r} leaves a score of axes {list(labels)}: {hint}")
    t.graph.output(out)
    t.graph.lint()
    gm = fx.GraphModule(torch.nn.Module(), t.graph, class_name="ScoreGraph")
    extra = tuple(("weight", n.meta["sas_weight"]) if "sas_weight" in n.meta else ("external", n.meta["sas_external"])
                  for n in t.graph.nodes if n.op == "placeholder" and n.name not in ("attn_probs", "q", "k"))
    sample = None
    if last.name == "sample":
        qk = dict(chain.nodes[0].args)
        sample = dict(last.args, qk=qk.get("estimator", "exact"), qk_samples=qk.get("samples", 8),
                      qk_group=qk.get("group", "mean"))
    return ScoreGraph(chain, gm, dict(t.weights), tuple(t.externals), frozenset(t.uses), head_shared,
                      chain.nodes[0].name == "attn_score", extra, sample)
