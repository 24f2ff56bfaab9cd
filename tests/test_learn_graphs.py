"""Stage graphs (003 §IV-B2–4): jaxpr and fx extraction, pruning, Eq. 1 mask, depths, features."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from trainsim.errors import GraphError
from trainsim.learn.graphs import (
    DTYPES,
    KINDS,
    MAX_RANK,
    StageGraph,
    depths,
    graph_from_jaxpr,
    node_features,
    op_vocabulary,
    prune,
    reachability,
    shape_features,
)

jax = pytest.importorskip("jax")


def _tiny_jaxpr():
    import jax.numpy as jnp

    def f(x, w):
        y = jnp.tanh(x @ w).reshape(-1)
        return y.astype(jnp.float16) + 1.0

    return jax.make_jaxpr(f)(jnp.ones((2, 3), jnp.float32), jnp.ones((3, 4), jnp.float32))


def _by_op(g: StageGraph, op: str) -> list[int]:
    return [i for i, o in enumerate(g.op) if o == op]


def test_jaxpr_graph_has_table1_attributes():
    g = graph_from_jaxpr(_tiny_jaxpr())
    g.check()
    assert g.kind.count("input") == 2 and g.kind.count("output") == 1
    assert g.kind.count("literal") >= 1  # the 1.0
    (dot,) = _by_op(g, "dot_general")
    assert g.shape[dot] == (2, 4) and g.dtype[dot] == "float32"
    (out,) = [i for i, k in enumerate(g.kind) if k == "output"]
    assert g.shape[out] == (8,) and g.dtype[out] == "float16"
    assert {"reshape", "convert_element_type", "tanh", "add"} <= set(g.op)


def test_pruning_removes_layout_nodes_and_bridges_edges():
    full = graph_from_jaxpr(_tiny_jaxpr())
    p = prune(full)
    p.check()
    assert not {"reshape", "convert_element_type", "literal"} & set(p.op)
    assert (
        p.num_nodes == full.num_nodes - 3 - full.kind.count("literal") + 1
    )  # + the literal "1.0" in kind
    (tanh,), (add,) = _by_op(p, "tanh"), _by_op(p, "add")
    assert (tanh, add) in set(zip(p.src, p.dst, strict=True))  # tanh -> reshape -> convert -> add
    # every path between kept nodes survives: reachability restricted to kept nodes is unchanged
    keep = [
        i
        for i in range(full.num_nodes)
        if full.op[i] not in {"reshape", "convert_element_type"} and full.kind[i] != "literal"
    ]
    np.testing.assert_array_equal(reachability(full)[np.ix_(keep, keep)], reachability(p))


def test_pruning_keeps_literals_when_asked():
    full = graph_from_jaxpr(_tiny_jaxpr())
    assert "literal" in prune(full, drop_literals=False).kind


def _random_dag(n: int, p: float, seed: int) -> StageGraph:
    rng = np.random.default_rng(seed)
    g = StageGraph()
    perm = rng.permutation(n)  # node ids not in topological order
    for _ in range(n):
        g.add_node("add", "operator", (2, 3), "float32")
    for a, b in itertools.combinations(range(n), 2):
        if rng.random() < p:
            g.add_edge(int(perm[a]), int(perm[b]))
    return g


@pytest.mark.parametrize("seed", range(5))
def test_reachability_mask_is_eq1_with_infinite_k(seed):
    g = _random_dag(30, 0.08, seed)
    n = g.num_nodes
    closure = np.eye(n, dtype=bool)  # brute force: Warshall's transitive closure
    for u, v in zip(g.src, g.dst, strict=True):
        closure[u, v] = True
    for k in range(n):
        closure |= closure[:, [k]] & closure[[k], :]
    np.testing.assert_array_equal(reachability(g), closure | closure.T)


@pytest.mark.parametrize("seed", range(3))
def test_depth_is_longest_path_from_a_source(seed):
    g = _random_dag(25, 0.1, seed)
    d = depths(g)
    preds = {
        v: [u for u, w in zip(g.src, g.dst, strict=True) if w == v] for v in range(g.num_nodes)
    }

    def longest(v: int) -> int:  # brute force, memo-free recursion on a small DAG
        return 0 if not preds[v] else 1 + max(longest(u) for u in preds[v])

    assert [longest(v) for v in range(g.num_nodes)] == d.tolist()
    for u, v in zip(g.src, g.dst, strict=True):
        assert d[v] > d[u]


def test_cycle_is_rejected():
    g = StageGraph()
    a, b = (
        g.add_node("add", "operator", (), "float32"),
        g.add_node("mul", "operator", (), "float32"),
    )
    g.add_edge(a, b)
    g.add_edge(b, a)
    with pytest.raises(GraphError, match="cycle"):
        g.check()


def test_features_follow_table1():
    g = prune(graph_from_jaxpr(_tiny_jaxpr()))
    vocab = op_vocabulary([g])
    x = node_features(g, vocab)
    n_op = len(vocab) + 1
    assert x.shape == (g.num_nodes, n_op + MAX_RANK + 1 + len(DTYPES) + len(KINDS))
    np.testing.assert_array_equal(x[:, :n_op].sum(1), 1.0)  # one-hot operator
    np.testing.assert_array_equal(x[:, -len(KINDS) :].sum(1), 1.0)  # one-hot kind
    (dot,) = _by_op(g, "dot_general")
    np.testing.assert_allclose(x[dot, n_op : n_op + MAX_RANK + 1], shape_features((2, 4)))
    # log scaling; a missing leading dimension is a neutral 1 (log 0)
    assert shape_features((2, 4)) == [0.0] * (MAX_RANK - 2) + [1.0, 2.0, 3.0]
    assert shape_features((1, 2, 4))[:-1] == shape_features((2, 4))[:-1]
    unknown = node_features(g, [])  # operators outside the vocabulary share the last op slot
    assert unknown[[i for i, k in enumerate(g.kind) if k == "operator"], 0].all()


def test_json_round_trip_is_identity():
    g = graph_from_jaxpr(_tiny_jaxpr())
    back = StageGraph.from_json(g.to_json())
    assert back == g


def test_fx_graph_extraction_and_pruning():
    torch = pytest.importorskip("torch")
    from trainsim.learn.graphs import fx_training_graph, graph_from_fx

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 4)

        def forward(self, x):
            return torch.relu(self.lin(x)).view(-1)

    gm = fx_training_graph(Tiny(), torch.ones(3, 8))
    full = graph_from_fx(gm)
    full.check()
    p = prune(full)
    assert full.kind.count("input") == 3  # weight, bias, x
    assert {"addmm", "relu"} <= set(full.op)  # forward
    assert "mm" in full.op  # backward: weight gradient
    assert "view" in full.op and "view" not in p.op
    (addmm,) = _by_op(p, "addmm")
    assert p.shape[addmm] == (3, 4) and p.dtype[addmm] == "float32"
    assert p.kind.count("output") == 2  # two parameter gradients


def test_dot_general_work_comes_from_its_dimension_numbers():
    import jax.numpy as jnp

    def f(q, k, w):  # a batched contraction (attention scores) and a plain matmul
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k)
        return jnp.tanh(s).sum() + (q.reshape(-1, 16) @ w).sum()

    q = jnp.ones((2, 3, 5, 16), jnp.float32)
    g = graph_from_jaxpr(jax.make_jaxpr(f)(q, q, jnp.ones((16, 7), jnp.float32)))
    dots = _by_op(g, "dot_general")
    work = sorted((g.contract[i], g.flops[i]) for i in dots)
    # scores: out 2·3·5·5, contracted d = 16; matmul: out 30·7, contracted 16
    assert work == sorted([(16, 2.0 * 2 * 3 * 5 * 5 * 16), (16, 2.0 * 30 * 7 * 16)])
    (tanh,) = _by_op(g, "tanh")
    assert g.contract[tanh] == 0 and g.flops[tanh] == 2 * 3 * 5 * 5
    # the columns survive pruning and the JSON round trip; old documents without them read 0
    p = prune(g)
    assert sorted(p.flops[i] for i in _by_op(p, "dot_general")) == sorted(g.flops[i] for i in dots)
    doc = g.to_json()
    assert StageGraph.from_json(doc) == g
    del doc["flops"], doc["contract"]
    old = StageGraph.from_json(doc)
    assert old.flops == [0.0] * g.num_nodes and old.contract == [0] * g.num_nodes


def test_work_features_are_log_flops_and_contraction():
    g = prune(graph_from_jaxpr(_tiny_jaxpr()))
    vocab = op_vocabulary([g])
    base = node_features(g, vocab).shape[1]
    x = node_features(g, vocab, inputs=True)
    (dot,) = _by_op(g, "dot_general")
    np.testing.assert_allclose(x[dot, base + 3 : base + 5], [np.log2(1 + 2 * 2 * 4 * 3), np.log2(1 + 3)], rtol=1e-6)


def test_a_stage_is_traced_from_its_shapes_without_drawing_weights(monkeypatch):
    """stage_jaxpr (what `stages collect` stores and a predictor's search traces, 78 stages a
    search) traces the stage from ShapeDtypeStructs: drawing the random weights (an LM head of
    hidden x vocabulary) took most of a trace's time. The jaxpr is the one of the real inputs."""
    from trainsim.learn import stages

    specs = [stages.StageSpec("gpt", hidden=64, heads=4, seq=16, micro_batch=2, layers=1, shard=2, embed=True,
                              head=True, vocab=128),
             stages.StageSpec("moe", hidden=32, heads=2, seq=8, micro_batch=2, layers=2, first_layer=1, experts=4,
                              group_size=8, capacity_factor=1.25, vocab=64)]  # fmt: skip
    for spec in specs:
        for part in stages.PARTS:
            fn, args = stages.stage_function(spec, part=part)  # the weights measure_stage times
            want = str(jax.make_jaxpr(fn)(*args))
            with monkeypatch.context() as m:
                m.setattr(stages, "init_params", lambda *a, **k: pytest.fail("a trace drew weights"))  # fmt: skip
                assert str(stages.stage_jaxpr(spec, part=part)) == want
