"""Predictors: the DAG Transformer's mask and positional encoding, training, artifacts without pickle."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from trainsim.learn.graphs import StageGraph, op_vocabulary  # noqa: E402
from trainsim.learn.models import (  # noqa: E402
    DAGAttentionLayer,
    ModelConfig,
    build_model,
    collate,
    sinusoidal_encoding,
    size_chunks,
)
from trainsim.learn.train import Predictor, TrainConfig, featurize, train_predictor  # noqa: E402


def _chain(n_ops: int, width: int) -> StageGraph:
    """input -> (dot_general, add)* -> output, with tensors of ``width`` columns."""
    g = StageGraph()
    prev = g.add_node("input", "input", (16, width), "float32")
    for i in range(n_ops):
        op = "dot_general" if i % 2 == 0 else "add"
        node = g.add_node(op, "operator", (16, width), "float32")
        g.add_edge(prev, node)
        prev = node
    out = g.add_node("output", "output", (16, width), "float32")
    g.add_edge(prev, out)
    return g


def _synthetic(n: int, seed: int = 0) -> tuple[list[StageGraph], np.ndarray]:
    rng = np.random.default_rng(seed)
    graphs, lat = [], []
    for _ in range(n):
        k, w = int(rng.integers(1, 8)), int(rng.choice([8, 16, 32, 64, 128]))
        graphs.append(_chain(k, w))
        lat.append(1e-4 * k * w * w / 64)  # a "latency" that grows with ops and width²
    return graphs, np.array(lat)


def test_depth_encoding_distinguishes_depths_and_is_bounded():
    pe = sinusoidal_encoding(torch.arange(6), 16)
    assert pe.shape == (6, 16)
    assert torch.all(pe.abs() <= 1.0)
    assert torch.allclose(pe[0, :8], torch.zeros(8)) and torch.allclose(pe[0, 8:], torch.ones(8))
    assert len({tuple(r.round(decimals=4).tolist()) for r in pe}) == 6
    odd = sinusoidal_encoding(torch.tensor([3]), 7)  # odd width: zero-padded
    assert odd.shape == (1, 7) and odd[0, -1] == 0


def test_attention_respects_the_reachability_mask():
    """A node's output must not change when a node it cannot reach (either way) changes."""
    torch.manual_seed(0)
    layer = DAGAttentionLayer(8, 2).eval()
    # 0 -> 1, 2 isolated: node 2 may attend only to itself
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [0, 0, 1]], dtype=torch.bool).view(1, 1, 3, 3)
    x = torch.randn(1, 3, 8)
    y = layer(x, mask)
    x2 = x.clone()
    x2[0, 2] = torch.randn(8) * 3.0
    y2 = layer(x2, mask)
    assert torch.allclose(y[0, :2], y2[0, :2], atol=1e-6)  # nodes 0, 1 never see node 2
    assert not torch.allclose(y[0, 2], y2[0, 2])
    full = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    assert not torch.allclose(layer(x, full)[0, :2], layer(x2, full)[0, :2])


def test_padding_does_not_change_predictions():
    graphs, _ = _synthetic(4)
    vocab = op_vocabulary(graphs)
    t = featurize(graphs, vocab, reach=True)
    model = build_model(
        ModelConfig.for_kind("dag_transformer", t[0].x.shape[1], hidden=16, layers=2)
    ).eval()
    with torch.no_grad():
        together = model(collate(t, padded=True))
        alone = torch.cat([model(collate([g], padded=True)) for g in t])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


def _chunk_cost(sizes, chunks, fixed=128**2):
    return sum(len(c) * max(sizes[i] for i in c) ** 2 + fixed for c in chunks)


def test_size_chunks_partition_is_exhaustive_and_optimal():
    import itertools

    rng = np.random.default_rng(3)
    for _ in range(20):
        sizes = [int(v) for v in rng.integers(5, 1200, size=int(rng.integers(1, 9)))]
        chunks = size_chunks(sizes)
        assert sorted(i for c in chunks for i in c) == list(range(len(sizes)))
        # brute force over every contiguous partition of the sorted sizes
        order = sorted(range(len(sizes)), key=lambda i: sizes[i])
        best = min(
            _chunk_cost(sizes, [order[a:b] for a, b in itertools.pairwise((0, *cuts, len(sizes)))])
            for r in range(len(sizes))
            for cuts in itertools.combinations(range(1, len(sizes)), r)
        )
        assert _chunk_cost(sizes, chunks) == pytest.approx(best)
    # a GPT protocol batch (15 stages of 215–1,058 nodes): far less padding than one chunk
    gpt = [215] * 4 + [286, 423, 423, 423, 434, 631, 839, 839, 1047, 1047, 1058]
    assert _chunk_cost(gpt, size_chunks(gpt)) < _chunk_cost(gpt, [list(range(15))]) / 2.5
    assert size_chunks([]) == []


def test_chunked_batch_gives_the_whole_batch_gradient():
    """Training in size chunks is one optimizer step on the same mean loss (models.size_chunks)."""
    graphs, _ = _synthetic(12, seed=4)
    t = featurize(graphs, op_vocabulary(graphs), reach=True)
    cfg = ModelConfig.for_kind("dag_transformer", t[0].x.shape[1], hidden=16, layers=2)
    torch.manual_seed(0)
    model = build_model(cfg)
    y = torch.randn(len(t))
    torch.abs(model(collate(t, padded=True)) - y).mean().backward()
    whole = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    chunks = size_chunks([g.num_nodes for g in t], overhead_nodes=1)
    assert len(chunks) > 1
    for c in chunks:
        (torch.abs(model(collate([t[i] for i in c], padded=True)) - y[c]).sum() / len(t)).backward()
    for a, b in zip(whole, (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_predictions_do_not_depend_on_batching():
    """predict_tensors batches by size and chunks the padded layout: each graph's prediction is
    what it gets alone, returned in the caller's order."""
    graphs, lat = _synthetic(24, seed=5)
    vocab = op_vocabulary(graphs)
    t = featurize(graphs, vocab, reach=True)
    cfg = ModelConfig.for_kind("dag_transformer", t[0].x.shape[1], hidden=16, layers=2)
    pred = train_predictor(t[:16], lat[:16], t[16:], lat[16:], model_config=cfg, op_vocab=vocab,
                           config=TrainConfig(epochs=2, patience=2, threads=1))  # fmt: skip
    together = pred.predict_tensors(t, batch_size=7)
    alone = np.array([pred.predict_tensors([g])[0] for g in t])
    np.testing.assert_allclose(together, alone, rtol=1e-5)


@pytest.mark.parametrize("kind", ["dag_transformer", "gcn", "gat"])
def test_training_reduces_loss_and_round_trips_without_pickle(kind, tmp_path):
    pytest.importorskip("torch_geometric")
    graphs, lat = _synthetic(40)
    vocab = op_vocabulary(graphs)
    t = featurize(graphs, vocab, reach=kind == "dag_transformer")
    small = {"dag_transformer": {"hidden": 16, "layers": 2}, "gcn": {"hidden": 32, "layers": 2},
             "gat": {"hidden": 16, "layers": 2}}[kind]  # fmt: skip
    cfg = ModelConfig.for_kind(kind, t[0].x.shape[1], **small)
    pred = train_predictor(t[:32], lat[:32], t[32:], lat[32:], model_config=cfg, op_vocab=vocab,
                           config=TrainConfig(epochs=40, patience=40, batch_size=8, lr=3e-3, threads=1))  # fmt: skip
    hist = pred.history
    assert hist is not None and hist.epochs_run == 40
    assert hist.train_loss[-1] < 0.5 * hist.train_loss[0]
    assert hist.best_val_loss == min(hist.val_loss)  # best weights restored
    before = pred.predict(graphs[32:])

    folder = pred.save(tmp_path / kind)
    files = sorted(p.name for p in folder.iterdir())
    assert files == ["predictor.json", "predictor.safetensors"]
    raw = (folder / "predictor.safetensors").read_bytes()
    assert not zipfile.is_zipfile(folder / "predictor.safetensors") and b"\x80\x02" not in raw[:16]
    header = json.loads(
        raw[8 : 8 + int.from_bytes(raw[:8], "little")]
    )  # safetensors: JSON header + tensors
    assert all("dtype" in v for k, v in header.items() if k != "__metadata__")
    loaded = Predictor.load(folder)
    np.testing.assert_allclose(loaded.predict(graphs[32:]), before, rtol=1e-6)
    assert loaded.op_vocab == vocab and loaded.config == cfg


def test_early_stopping_restores_best(tmp_path):
    graphs, lat = _synthetic(20, seed=1)
    vocab = op_vocabulary(graphs)
    t = featurize(graphs, vocab, reach=True)
    cfg = ModelConfig.for_kind("dag_transformer", t[0].x.shape[1], hidden=8, layers=1)
    # validation targets unrelated to the graphs: the best epoch comes early, training stops
    pred = train_predictor(t[:16], lat[:16], t[16:], lat[16:][::-1] * 50, model_config=cfg, op_vocab=vocab,
                           config=TrainConfig(epochs=200, patience=5, batch_size=8, threads=1))  # fmt: skip
    hist = pred.history
    assert hist is not None and hist.epochs_run == hist.best_epoch + 6 < 200
    assert "no validation improvement" in hist.stopped


def test_per_work_target_predicts_latency_over_flops_and_round_trips(tmp_path):
    graphs, _ = _synthetic(30, seed=2)
    for g in graphs:  # give each operator its work: dot 2·16·w·w, add 16·w
        g.flops = [2.0 * 16 * s[1] * s[1] if o == "dot_general" else 16.0 * s[1] if k == "operator" else 0.0
                   for o, k, s in zip(g.op, g.kind, g.shape, strict=True)]  # fmt: skip
    lat = np.array([sum(g.flops) / 5e10 for g in graphs])  # constant efficiency: 50 GFLOP/s
    vocab = op_vocabulary(graphs)
    t = featurize(graphs, vocab, reach=False)
    assert t[0].log_work == pytest.approx(np.log(sum(graphs[0].flops)))
    cfg = ModelConfig.for_kind("gcn", t[0].x.shape[1], hidden=8, layers=1)
    pred = train_predictor(t[:24], lat[:24], t[24:], lat[24:], model_config=cfg, op_vocab=vocab, per_work=True,
                           config=TrainConfig(epochs=3, patience=3, threads=1))  # fmt: skip
    # the target ln(latency / FLOPs) is constant: its standardisation alone predicts every graph
    np.testing.assert_allclose(pred.predict(graphs[24:]), lat[24:], rtol=1e-3)
    loaded = Predictor.load(pred.save(tmp_path / "p"))
    assert loaded.per_work
    np.testing.assert_allclose(loaded.predict(graphs[24:]), lat[24:], rtol=1e-3)
    with pytest.raises(Exception, match="needs graphs with FLOPs"):
        bare = featurize(_synthetic(4)[0], vocab, reach=False)
        train_predictor(bare[:3], [1.0] * 3, bare[3:], [1.0], model_config=cfg, op_vocab=vocab, per_work=True)


def test_work_readout_pools_seconds_per_flop():
    from trainsim.learn.models import _Readout

    r = _Readout(4, 3, "work", work_col=0)
    with torch.no_grad():  # every node: the same log-cost per FLOP, c = -3
        r.node[-1].weight.zero_()
        r.node[-1].bias.fill_(-3.0)
    x = torch.tensor([[10.0, 1, 0], [3.0, 0, 1], [0.0, 1, 1]])  # log2(1 + FLOPs) in column 0
    h = torch.randn(3, 4)
    flat = r.pool_flat(h, x, torch.tensor([0, 0, 1]), 2)
    torch.testing.assert_close(flat, torch.full((2, 4), -3.0))
    pad = r.pool_padded(h[:2].unsqueeze(0), x[:2].unsqueeze(0), torch.tensor([[True, True]]))
    torch.testing.assert_close(pad, torch.full((1, 4), -3.0))
    with pytest.raises(ValueError, match="FLOPs feature column"):
        _Readout(4, 3, "work")


def _union(a: StageGraph, b: StageGraph) -> StageGraph:
    """Two graphs side by side, with no edge between them."""
    g = StageGraph()
    for part in (a, b):
        off = g.num_nodes
        for i in range(part.num_nodes):
            g.add_node(part.op[i], part.kind[i], part.shape[i], part.dtype[i], flops=part.flops[i],
                       contract=part.contract[i])  # fmt: skip
        for u, v in zip(part.src, part.dst, strict=True):
            g.add_edge(u + off, v + off)
    return g


@pytest.mark.parametrize("kind", ["dag_transformer", "gcn", "gat"])
def test_sum_readout_adds_stages_in_seconds(kind):
    """Readout "sum": a graph made of two unconnected graphs is predicted as the sum of the two."""
    pytest.importorskip("torch_geometric")
    graphs, lat = _synthetic(12, seed=3)
    for g in graphs:
        g.flops = [2.0 * 16 * s[1] * s[1] if o == "dot_general" else 0.0 for o, s in zip(g.op, g.shape, strict=True)]
    vocab = op_vocabulary(graphs)
    reach = kind == "dag_transformer"
    t = featurize(graphs, vocab, reach=reach, inputs=True)
    dim = t[0].x.shape[1]
    cfg = ModelConfig.for_kind(kind, dim, hidden=16, layers=2, readout="sum", work_col=dim - 2)
    pred = train_predictor(t[:9], lat[:9], t[9:], lat[9:], model_config=cfg, op_vocab=vocab, input_features=True,
                           config=TrainConfig(epochs=3, patience=3, batch_size=4, threads=1))  # fmt: skip
    assert pred.target_std == 1.0
    a, b = pred.predict(graphs[:4]), pred.predict(graphs[4:8])
    both = pred.predict([_union(x, y) for x, y in zip(graphs[:4], graphs[4:8], strict=True)])
    np.testing.assert_allclose(both, a + b, rtol=1e-4)


def test_sum_readout_starts_from_time_proportional_to_work():
    """At zero node weights a "sum" predictor answers e^μ Σ_n (1 + FLOPs_n); μ fits the training set."""
    from trainsim.errors import ConfigError
    from trainsim.learn.train import target_scaling

    graphs, _ = _synthetic(6, seed=4)
    for g in graphs:
        g.flops = [1e6 * (i + 1) if k == "operator" else 0.0 for i, k in enumerate(g.kind)]
    vocab = op_vocabulary(graphs)
    t = featurize(graphs, vocab, reach=False, inputs=True)
    dim = t[0].x.shape[1]
    cfg = ModelConfig.for_kind("gcn", dim, hidden=8, layers=1, readout="sum", work_col=dim - 2)
    work = np.array([sum(1.0 + f for f in g.flops) for g in graphs])
    log_y = np.log(3e-9 * work)  # 3 ns per unit of work
    mean, std = target_scaling(cfg, t, log_y, per_work=False)
    assert std == 1.0 and mean == pytest.approx(np.log(3e-9), abs=1e-4)
    with pytest.raises(ConfigError, match="log target"):
        target_scaling(cfg, t, log_y, per_work=True)


def test_member_folds_rotate_validation_over_the_labelled_pool():
    from trainsim.errors import ConfigError
    from trainsim.learn.train import member_folds

    folds = member_folds(11, 3, 4)
    assert [list(va) for _, va in folds] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 0]]
    for tr, va in folds:  # disjoint, and together the whole pool
        assert not set(tr) & set(va) and sorted([*tr, *va]) == list(range(11))
    with pytest.raises(ConfigError, match="cannot give 3 to validation"):
        member_folds(4, 3, 2)


def test_a_bag_predicts_the_geometric_mean_of_its_members_and_round_trips(tmp_path):
    from trainsim.learn.train import train_members

    graphs, lat = _synthetic(14, seed=5)
    vocab = op_vocabulary(graphs)
    t = featurize(graphs, vocab, reach=False)
    cfg = ModelConfig.for_kind("gcn", t[0].x.shape[1], hidden=8, layers=1)
    bag = train_members(t[:11], lat[:11], 3, model_config=cfg, op_vocab=vocab,
                        config=TrainConfig(epochs=4, patience=4, threads=1, members=3, max_time_s=60.0))  # fmt: skip
    assert bag.config.members == 3 and len(bag.meta["members"]) == 3
    assert all(m["epochs"] == 4 for m in bag.meta["members"]) and bag.history.epochs_run == 12
    members = [Predictor(cfg, vocab, bag.target_mean, bag.target_std, m) for m in bag.model.members]
    each = np.array([p.predict(graphs[11:]) for p in members])
    np.testing.assert_allclose(bag.predict(graphs[11:]), np.exp(np.log(each).mean(axis=0)), rtol=1e-5)
    assert len({tuple(np.round(e, 12)) for e in each}) == 3  # three different models
    loaded = Predictor.load(bag.save(tmp_path / "bag"))
    assert loaded.config == bag.config
    np.testing.assert_allclose(loaded.predict(graphs[11:]), bag.predict(graphs[11:]), rtol=1e-6)


def test_bag_members_share_what_the_earlier_members_left_of_the_budget(monkeypatch):
    from dataclasses import replace

    import trainsim.learn.train as tr
    from trainsim.learn.train import History, train_members

    graphs, lat = _synthetic(11, seed=6)
    vocab = op_vocabulary(graphs)
    t = featurize(graphs, vocab, reach=False)
    cfg = ModelConfig.for_kind("gcn", t[0].x.shape[1], hidden=8, layers=1)
    real, budgets, spent = tr.train_predictor, [], iter([30.0, 100.0, 20.0])

    def one(*args, **kw):  # the real trainer, with the time each member "took" fixed
        budgets.append(kw["config"].max_time_s)
        p = real(*args, **{**kw, "config": replace(kw["config"], epochs=1, max_time_s=None)})
        p.history.train_s = next(spent)
        return p

    monkeypatch.setattr(tr, "train_predictor", one)
    bag = train_members(t, lat, 3, model_config=cfg, op_vocab=vocab,
                        config=TrainConfig(epochs=4, patience=4, threads=1, members=3, max_time_s=300.0))  # fmt: skip
    # 300 / 3; then (300 − 30) / 2; then (300 − 130) / 1: unspent time moves to later members
    assert budgets == [100.0, 135.0, 170.0]
    assert isinstance(bag.history, History) and bag.history.train_s == 150.0


def test_a_common_stop_restores_every_member_at_the_epoch_of_the_lowest_mean_validation_loss():
    """stop="common": no patience, each member kept per epoch, all restored at one epoch (k-fold)."""
    import torch

    from trainsim.errors import ConfigError
    from trainsim.learn.train import train_members, train_predictor

    graphs, lat = _synthetic(12, seed=7)
    vocab = op_vocabulary(graphs)
    t = featurize(graphs, vocab, reach=False)
    cfg = ModelConfig.for_kind("gcn", t[0].x.shape[1], hidden=8, layers=1)
    tc = TrainConfig(epochs=6, patience=1, threads=1, members=3, max_time_s=None, stop="common")
    bag = train_members(t, lat, 3, model_config=cfg, op_vocab=vocab, config=tc)
    hist = bag.meta["members"]
    assert all(m["epochs"] == 6 for m in hist)  # patience 1 is not applied: the whole schedule ran
    epoch = hist[0]["best_epoch"]
    assert all(m["best_epoch"] == epoch for m in hist)
    # each member equals the same member trained alone to that epoch, and that epoch minimizes
    # the mean of the members' validation curves
    from trainsim.learn.train import member_folds

    curves = []
    for j, ((tr, va), m) in enumerate(zip(member_folds(12, 3, 3), bag.model.members, strict=True)):
        kept: list[dict[str, torch.Tensor]] = []
        alone = train_predictor([t[i] for i in tr], lat[tr], [t[i] for i in va], lat[va], model_config=cfg,
                                op_vocab=vocab, scaling=(bag.target_mean, bag.target_std),
                                config=TrainConfig(epochs=6, patience=6, threads=1, seed=j, max_time_s=None),
                                on_epoch=lambda _e, mod, kept=kept: kept.append(  # type: ignore[misc]
                                    {n: v.clone() for n, v in mod.state_dict().items()}))  # fmt: skip
        assert alone.history is not None
        curves.append(alone.history.val_loss)
        for n, v in m.state_dict().items():
            torch.testing.assert_close(v, kept[epoch][n])
    assert epoch == int(np.argmin(np.mean(curves, axis=0)))
    with pytest.raises(ConfigError, match="stop must be one of"):
        train_members(t, lat, 3, model_config=cfg, op_vocab=vocab, config=TrainConfig(members=3, stop="best"))
