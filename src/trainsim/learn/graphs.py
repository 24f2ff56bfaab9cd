"""Stage graphs (003 §IV-B2–4): DAGs of tensor operations from a jaxpr or a torch.fx graph.

A :class:`StageGraph` has one node per tensor operation (a jaxpr equation, an fx ``call_*``
node), one per graph input (stage inputs and parameters), one per literal constant and one per
graph output, and an edge wherever a value flows. Each node keeps what 003 Table I encodes:
its operator type, its output tensor's shape and dtype, and its kind (input, literal, operator,
output). Nested jaxprs (``jit``/``pjit``, ``custom_jvp_call``, ``custom_vjp_call``, ``remat``,
``closed_call``) are inlined; control flow (``scan``, ``while``, ``cond``) stays one node.

:func:`prune` (003 §IV-B4, Fig. 5) removes operators whose effect the remaining nodes already
record — reshapes, dtype conversions, broadcasts, squeezes, copies: a shape or dtype change
between two connected nodes implies them — and (by default) the literal nodes, connecting each
removed node's predecessors to its successors.

:func:`node_features` builds 003 Table I's node vectors: one-hot operator type (over a
vocabulary fixed at training time, unknown operators share one slot), the output shape as the
log2 of its last :data:`MAX_RANK` dimensions (right-aligned; absent dimensions are 1, i.e. 0
after the log — a neutral pad) plus log2 of the element count, one-hot dtype and one-hot kind.
:func:`reachability` is Eq. 1's mask with k = ∞ (u attends to v iff a path joins them either
way, or u = v); :func:`depths` the depth of each node (longest path from a source), the DAG
positional encoding's position.

The JSON form (:meth:`StageGraph.to_json`) is columnar: ``op``, ``kind``, ``dtype`` are lists
of strings, ``shape`` a list of lists, ``edges`` a ``[sources, targets]`` pair of lists.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainsim.errors import GraphError

GRAPH_SCHEMA = "trainsim.stage-graph/1"
KINDS = ("input", "literal", "operator", "output")
DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64", "uint32", "bool", "other")
MAX_RANK = 6
# 003 §IV-B4: operators whose effect the graph keeps after removing them (shape/dtype of the
# neighbours). jaxpr names first, then torch (aten and fx) names.
PRUNED_OPS = frozenset({
    "reshape", "convert_element_type", "broadcast_in_dim", "squeeze", "expand_dims", "copy",
    "copy_p", "stop_gradient", "reduce_precision", "pjit", "jit",
    "view", "_unsafe_view", "reshape_as", "view_as", "expand", "contiguous", "clone", "to",
    "_to_copy", "type_as", "unsqueeze", "flatten", "detach", "alias", "lift_fresh_copy",
})  # fmt: skip
_INLINED = ("jit", "pjit", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr",
            "remat", "checkpoint", "closed_call", "core_call", "custom_lin")  # fmt: skip


@dataclass(slots=True)
class StageGraph:
    """A DAG of tensor operations with 003 Table I's per-node attributes."""

    op: list[str] = field(default_factory=list)
    kind: list[str] = field(default_factory=list)
    shape: list[tuple[int, ...]] = field(default_factory=list)
    dtype: list[str] = field(default_factory=list)
    src: list[int] = field(default_factory=list)
    dst: list[int] = field(default_factory=list)
    # Optional per-node work, from the operator's parameters where the shapes alone do not say it
    # (a dot_general's contraction): floating-point operations and the contracted length (0 = not
    # a contraction). Empty when the graph was built without them (then features read 0).
    flops: list[float] = field(default_factory=list)
    contract: list[int] = field(default_factory=list)

    @property
    def num_nodes(self) -> int:
        return len(self.op)

    @property
    def num_edges(self) -> int:
        return len(self.src)

    def add_node(self, op: str, kind: str, shape: Sequence[int], dtype: str, *,
                 flops: float = 0.0, contract: int = 0) -> int:  # fmt: skip
        self.op.append(op)
        self.kind.append(kind)
        self.shape.append(tuple(int(d) for d in shape))
        self.dtype.append(dtype)
        self.flops.append(float(flops))
        self.contract.append(int(contract))
        return len(self.op) - 1

    def add_edge(self, u: int, v: int) -> None:
        self.src.append(u)
        self.dst.append(v)

    def to_json(self) -> dict[str, Any]:
        return {"schema": GRAPH_SCHEMA, "op": self.op, "kind": self.kind,
                "shape": [list(s) for s in self.shape], "dtype": self.dtype,
                "edges": [self.src, self.dst], "flops": self.flops, "contract": self.contract}  # fmt: skip

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StageGraph:
        if not isinstance(d, dict) or d.get("schema") != GRAPH_SCHEMA:
            got = d.get("schema") if isinstance(d, dict) else type(d).__name__
            raise GraphError(f"not a {GRAPH_SCHEMA} document (schema {got!r})")
        g = cls(list(d["op"]), list(d["kind"]), [tuple(s) for s in d["shape"]], list(d["dtype"]),
                list(d["edges"][0]), list(d["edges"][1]))  # fmt: skip
        n = g.num_nodes
        g.flops = [float(x) for x in d.get("flops", [0.0] * n)]
        g.contract = list(d.get("contract", [0] * n))  # check() refuses a fractional or negative one
        g.check()
        return g

    def check(self) -> None:
        """Columns of equal length, edges within range, no cycle."""
        n = self.num_nodes
        if not (len(self.kind) == len(self.shape) == len(self.dtype) == len(self.flops)
                == len(self.contract) == n):  # fmt: skip
            raise GraphError("stage graph columns differ in length")
        if len(self.src) != len(self.dst):
            raise GraphError("stage graph edge lists differ in length")
        if any(not 0 <= u < n for u in self.src) or any(not 0 <= v < n for v in self.dst):
            raise GraphError("stage graph edge refers to a missing node")
        if any(k not in KINDS for k in self.kind):
            raise GraphError(f"stage graph node kind outside {KINDS}")
        if n == 0:
            raise GraphError("stage graph has no nodes")
        if not all(0.0 <= f < math.inf for f in self.flops):  # features take log2(1 + flops)
            raise GraphError("stage graph flops must be finite and >= 0")
        # features take log2 of each dimension, clamped at 1: a negative one would read as 1
        bad = next((i for i, s in enumerate(self.shape)
                    if any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in s)), None)  # fmt: skip
        if bad is not None:
            raise GraphError(f"stage graph node {bad}'s shape {list(self.shape[bad])} must be whole numbers >= 0")
        if any(not isinstance(c, int) or isinstance(c, bool) or c < 0 for c in self.contract):
            raise GraphError("stage graph contract sizes must be whole numbers >= 0")
        topo_order(self)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.op:
            out[o] = out.get(o, 0) + 1
        return out


# --- construction from a jaxpr ----------------------------------------------------------------


def _aval(v: Any) -> tuple[tuple[int, ...], str]:
    aval = getattr(v, "aval", None)
    shape = tuple(int(d) for d in getattr(aval, "shape", ()) or ())
    dtype = str(getattr(aval, "dtype", "other"))
    return shape, dtype


def _inner_jaxpr(eqn: Any) -> Any | None:
    if eqn.primitive.name not in _INLINED:
        return None
    for name in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        sub = eqn.params.get(name)
        if sub is not None:
            return sub
    return None


def eqn_work(eqn: Any) -> tuple[float, int]:
    """(floating-point operations, contracted length) of one jaxpr equation.

    ``dot_general``: 2 × output elements × the product of the contracting dimensions (read from
    ``dimension_numbers``); ``conv_general_dilated``: 2 × output elements × input features per
    group × kernel window; any other operator: the elements of its largest operand or result
    (one operation per element: element-wise work and reductions).
    """
    name = eqn.primitive.name
    out_n = max((math.prod(_aval(o)[0]) for o in eqn.outvars), default=0)
    if name == "dot_general":
        (lhs_contract, _), _ = eqn.params["dimension_numbers"]
        lhs = _aval(eqn.invars[0])[0]
        k = math.prod(lhs[d] for d in lhs_contract)
        return 2.0 * out_n * k, int(k)
    if name == "conv_general_dilated":
        rhs = _aval(eqn.invars[1])[0]
        spec = eqn.params["dimension_numbers"].rhs_spec  # (out feature, in feature, *spatial)
        k = math.prod(rhs[d] for d in spec[1:])
        return 2.0 * out_n * k, int(k)
    in_n = max((math.prod(_aval(v)[0]) for v in eqn.invars), default=0)
    return float(max(out_n, in_n)), 0


def graph_from_jaxpr(closed: Any) -> StageGraph:
    """Build the full (unpruned) stage graph of a ``ClosedJaxpr`` or ``Jaxpr``."""
    from jax.extend.core import Literal

    jaxpr = getattr(closed, "jaxpr", closed)
    g = StageGraph()
    env: dict[Any, int] = {}

    for v in jaxpr.constvars:
        env[v] = g.add_node("constant", "literal", *_aval(v))
    for v in jaxpr.invars:
        env[v] = g.add_node("input", "input", *_aval(v))

    def walk(jx: Any, inner_env: dict[Any, int]) -> None:
        for eqn in jx.eqns:
            sub = _inner_jaxpr(eqn)
            if sub is not None:
                sub_jx = getattr(sub, "jaxpr", sub)
                consts = getattr(sub, "consts", ())
                sub_env: dict[Any, int] = {}
                for cv, c in zip(sub_jx.constvars, consts, strict=False):
                    shape = tuple(getattr(c, "shape", ()))
                    sub_env[cv] = g.add_node(
                        "constant", "literal", shape, str(getattr(c, "dtype", "other"))
                    )
                for iv, ov in zip(sub_jx.invars, eqn.invars, strict=True):
                    sub_env[iv] = source_in(ov, inner_env)
                walk(sub_jx, sub_env)
                for so, oo in zip(sub_jx.outvars, eqn.outvars, strict=True):
                    if type(oo).__name__ != "DropVar":
                        inner_env[oo] = source_in(so, sub_env)
                continue
            outs = [o for o in eqn.outvars if type(o).__name__ != "DropVar"]
            shape, dtype = _aval(outs[0] if outs else eqn.outvars[0])
            flops, contract = eqn_work(eqn)
            node = g.add_node(eqn.primitive.name, "operator", shape, dtype, flops=flops,
                              contract=contract)  # fmt: skip
            for iv in eqn.invars:
                g.add_edge(source_in(iv, inner_env), node)
            for o in outs:
                inner_env[o] = node

    def source_in(v: Any, e: dict[Any, int]) -> int:
        if isinstance(v, Literal):
            return g.add_node("literal", "literal", *_aval(v))
        if v not in e:
            raise GraphError(f"jaxpr variable {v} used before it is defined")
        return e[v]

    walk(jaxpr, env)
    for v in jaxpr.outvars:
        shape, dtype = _aval(v)
        out = g.add_node("output", "output", shape, dtype)
        g.add_edge(source_in(v, env), out)
    return g


# --- construction from torch.fx -------------------------------------------------------------


def _fx_meta(node: Any) -> tuple[tuple[int, ...], str]:
    val = node.meta.get("val", node.meta.get("tensor_meta"))
    if isinstance(val, list | tuple):
        val = next((x for x in val if hasattr(x, "shape")), None)
    if val is None or not hasattr(val, "shape"):
        return (), "other"
    return tuple(int(d) for d in val.shape), str(val.dtype).removeprefix("torch.")


def _fx_op(node: Any) -> str:
    t = node.target
    if node.op == "call_module":
        return type(node.graph.owning_module.get_submodule(t)).__name__.lower()
    if node.op == "call_method":
        return str(t)
    name = getattr(t, "__name__", None) or str(t)
    overload = getattr(t, "_overloadpacket", None)  # aten.mm.default -> mm
    if overload is not None:
        name = getattr(overload, "__name__", name)
    return name.split(".")[0]


def graph_from_fx(gm: Any) -> StageGraph:
    """Build the full stage graph of a ``torch.fx.GraphModule`` whose nodes carry shapes.

    Shapes come from ``node.meta["val"]`` (``make_fx``/``torch.export``) or
    ``node.meta["tensor_meta"]`` (``torch.fx.passes.shape_prop.ShapeProp``); see
    :func:`fx_training_graph`. ``get_attr`` nodes (parameters, buffers) are inputs.
    """
    import torch.fx

    g = StageGraph()
    ids: dict[Any, int] = {}
    for node in gm.graph.nodes:
        shape, dtype = _fx_meta(node)
        if node.op in ("placeholder", "get_attr"):
            ids[node] = g.add_node("input", "input", shape, dtype)
            continue
        if node.op == "output":
            for arg in _flat(node.args):
                if isinstance(arg, torch.fx.Node):
                    s, dt = _fx_meta(arg)
                    out = g.add_node("output", "output", s, dt)
                    g.add_edge(ids[arg], out)
            continue
        if _fx_op(node) == "getitem" and node.args and node.args[0] in ids:
            ids[node] = ids[node.args[0]]  # a tuple element of a multi-output op: the op itself
            continue
        ids[node] = g.add_node(_fx_op(node), "operator", shape, dtype)
        for arg in _flat((node.args, node.kwargs)):
            if isinstance(arg, torch.fx.Node):
                g.add_edge(ids[arg], ids[node])
            elif isinstance(arg, int | float) and not isinstance(arg, bool):
                lit = g.add_node(
                    "literal", "literal", (), "float32" if isinstance(arg, float) else "int64"
                )
                g.add_edge(lit, ids[node])
    return g


def _flat(x: Any) -> Iterable[Any]:
    if isinstance(x, list | tuple):
        for y in x:
            yield from _flat(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _flat(y)
    else:
        yield x


def fx_training_graph(module: Any, *inputs: Any) -> Any:
    """An aten-level fx graph of ``module``'s forward and backward (``make_fx``) with shapes."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    params = dict(module.named_parameters())

    def step(p: dict[str, Any], *xs: Any) -> Any:
        out = torch.func.functional_call(module, p, xs)
        loss = out.float().sum()
        return torch.autograd.grad(loss, list(p.values()))

    return make_fx(step)(params, *inputs)


# --- pruning, features, masks ---------------------------------------------------------------


def prune(
    g: StageGraph, *, ops: Iterable[str] = PRUNED_OPS, drop_literals: bool = True
) -> StageGraph:
    """003 §IV-B4: remove ``ops`` nodes (and literal nodes), bridging their in- and out-edges."""
    drop = set(ops)
    n = g.num_nodes
    preds: list[list[int]] = [[] for _ in range(n)]
    for u, v in zip(g.src, g.dst, strict=True):
        preds[v].append(u)
    removed = [
        (g.kind[i] == "operator" and g.op[i] in drop) or (drop_literals and g.kind[i] == "literal")
        for i in range(n)
    ]
    # the kept ancestors of each node through removed ones, in topological order
    kept_src: list[set[int]] = [set() for _ in range(n)]
    for v in topo_order(g):
        for u in preds[v]:
            if removed[u]:
                kept_src[v] |= kept_src[u]
            else:
                kept_src[v].add(u)
    out = StageGraph()
    new_id: dict[int, int] = {}
    for i in range(n):
        if not removed[i]:
            new_id[i] = out.add_node(g.op[i], g.kind[i], g.shape[i], g.dtype[i], flops=g.flops[i],
                                     contract=g.contract[i])  # fmt: skip
    for v in range(n):
        if removed[v]:
            continue
        for u in sorted(kept_src[v]):
            out.add_edge(new_id[u], new_id[v])
    return out


def topo_order(g: StageGraph) -> list[int]:
    """Kahn's order; raises :class:`GraphError` on a cycle."""
    n = g.num_nodes
    indeg = [0] * n
    succ: list[list[int]] = [[] for _ in range(n)]
    for u, v in zip(g.src, g.dst, strict=True):
        succ[u].append(v)
        indeg[v] += 1
    order = [i for i in range(n) if indeg[i] == 0]
    k = 0
    while k < len(order):
        u = order[k]
        k += 1
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                order.append(v)
    if len(order) != n:
        raise GraphError(f"stage graph has a cycle ({n - len(order)} nodes on or after it)")
    return order


def depths(g: StageGraph) -> np.ndarray:
    """Depth of every node: the longest path from a source (sources have depth 0)."""
    d = np.zeros(g.num_nodes, dtype=np.int64)
    preds: list[list[int]] = [[] for _ in range(g.num_nodes)]
    for u, v in zip(g.src, g.dst, strict=True):
        preds[v].append(u)
    for v in topo_order(g):
        if preds[v]:
            d[v] = 1 + max(d[u] for u in preds[v])
    return d


def reachability(g: StageGraph) -> np.ndarray:
    """Eq. 1 with k = ∞: ``M[u, v]`` is True iff u = v or a directed path joins u and v."""
    n = g.num_nodes
    preds: list[list[int]] = [[] for _ in range(n)]
    for u, v in zip(g.src, g.dst, strict=True):
        preds[v].append(u)
    anc = np.zeros((n, n), dtype=bool)  # anc[v, u]: u reaches v
    for v in topo_order(g):
        for u in preds[v]:
            anc[v] |= anc[u]
            anc[v, u] = True
    return anc | anc.T | np.eye(n, dtype=bool)


def shape_features(shape: Sequence[int]) -> list[float]:
    """log2 of the last :data:`MAX_RANK` dims (right-aligned, pad 0) and of the element count."""
    dims = [max(int(d), 1) for d in shape]
    tail = dims[-MAX_RANK:]
    pad = [0.0] * (MAX_RANK - len(tail))
    head = math.prod(dims[: max(0, len(dims) - MAX_RANK)])  # folded into the first kept dim
    logs = [math.log2(d) for d in tail]
    if logs and head > 1:
        logs[0] += math.log2(head)
    return pad + logs + [math.log2(math.prod(dims)) if dims else 0.0]


INPUT_FEATURES = ("log2_numel_in[0]", "log2_numel_in[1]", "log2_numel_in_sum", "log2_flops",
                  "log2_contract")  # fmt: skip


def feature_names(op_vocab: Sequence[str], *, inputs: bool = False) -> list[str]:
    return ([f"op={o}" for o in op_vocab] + ["op=<other>"]
            + [f"log2_dim[-{MAX_RANK - i}]" for i in range(MAX_RANK)] + ["log2_numel"]
            + [f"dtype={d}" for d in DTYPES] + [f"kind={k}" for k in KINDS]
            + (list(INPUT_FEATURES) if inputs else []))  # fmt: skip


def node_features(g: StageGraph, op_vocab: Sequence[str], *, inputs: bool = False) -> np.ndarray:
    """003 Table I: [one-hot op | log2 shape | one-hot dtype | one-hot kind] per node (float32).

    ``inputs`` appends :data:`INPUT_FEATURES`: log2 element counts of the node's two largest
    inputs and of all its inputs together — read off its predecessors in the (pruned) graph, so
    the operand sizes that set an operator's cost (a matmul's contraction) are local to it.
    """
    index = {o: i for i, o in enumerate(op_vocab)}
    n_op = len(op_vocab) + 1
    base = n_op + MAX_RANK + 1 + len(DTYPES) + len(KINDS)
    x = np.zeros((g.num_nodes, base + (len(INPUT_FEATURES) if inputs else 0)), dtype=np.float32)
    numel = [math.prod(max(int(d), 1) for d in s) for s in g.shape]
    for i in range(g.num_nodes):
        x[i, index.get(g.op[i], n_op - 1)] = 1.0
        x[i, n_op : n_op + MAX_RANK + 1] = shape_features(g.shape[i])
        dt = g.dtype[i] if g.dtype[i] in DTYPES else "other"
        x[i, n_op + MAX_RANK + 1 + DTYPES.index(dt)] = 1.0
        x[i, n_op + MAX_RANK + 1 + len(DTYPES) + KINDS.index(g.kind[i])] = 1.0
    if inputs:
        ins: list[list[int]] = [[] for _ in range(g.num_nodes)]
        for u, v in zip(g.src, g.dst, strict=True):
            ins[v].append(numel[u])
        for i, sizes in enumerate(ins):
            top = [*sorted(sizes, reverse=True)[:2], 1, 1]
            x[i, base : base + 5] = [
                math.log2(top[0]),
                math.log2(top[1]),
                math.log2(max(1, sum(sizes))),
                math.log2(1.0 + g.flops[i]),
                math.log2(1.0 + g.contract[i]),
            ]
    return x


def op_vocabulary(graphs: Iterable[StageGraph]) -> list[str]:
    """The sorted operator names of ``graphs`` (inputs/outputs/literals have their own kind)."""
    ops: set[str] = set()
    for g in graphs:
        ops.update(o for o, k in zip(g.op, g.kind, strict=True) if k == "operator")
    return sorted(ops)


__all__ = [
    "DTYPES",
    "GRAPH_SCHEMA",
    "KINDS",
    "MAX_RANK",
    "PRUNED_OPS",
    "StageGraph",
    "depths",
    "feature_names",
    "fx_training_graph",
    "graph_from_fx",
    "graph_from_jaxpr",
    "node_features",
    "op_vocabulary",
    "prune",
    "reachability",
    "shape_features",
    "topo_order",
]
