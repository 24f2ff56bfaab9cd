"""Stage sampling, resumable measurement with provenance, and the pipeline search (003 Eq. 4)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from trainsim.errors import ConfigError, ModelError
from trainsim.learn.dataset import collect, read_rows, sample_stages
from trainsim.learn.provider import (
    SEARCH_MODELS,
    best_pipeline,
    pipeline_time_s,
    search_candidates,
    search_experiment,
)
from trainsim.learn.stages import StageSpec

TINY = [(f"t-{i}", StageSpec("gpt", hidden=64, heads=2, seq=16, micro_batch=1, layers=1 + i % 2,
                             shard=1 + i % 2, embed=i == 0, head=i == 3, vocab=128)) for i in range(4)]  # fmt: skip


def test_sampling_is_deterministic_prefix_stable_and_spread():
    a = sample_stages("gpt", 40, seed=3)
    assert a == sample_stages("gpt", 40, seed=3)
    assert sample_stages("gpt", 25, seed=3) == a[:25]  # a shorter run is a prefix
    assert a != sample_stages("gpt", 40, seed=4)
    assert len({s.key() for _, s in a}) == 40  # distinct stages
    assert {s.layers for _, s in a} == {1, 2, 3, 4}
    flops = np.array([s.flops() for _, s in a])
    assert flops.max() / flops.min() > 50  # latencies spread over orders of magnitude
    moe = sample_stages("moe", 20)
    assert all(s.family == "moe" and s.experts % s.shard == 0 for _, s in moe)
    with pytest.raises(ConfigError):
        sample_stages("resnet", 3)


def test_stage_spec_validates_and_round_trips():
    s = TINY[1][1]
    assert StageSpec.from_dict(s.to_dict()) == s
    with pytest.raises(ConfigError, match=r"divide heads: gpt layers 0-0, hidden 64, 3 heads, seq 16, micro-batch 1$"):
        StageSpec("gpt", hidden=64, heads=3, seq=16, micro_batch=1, layers=1)  # one line, no repr
    assert str(TINY[3][1]) == "gpt layers 0-1, hidden 64, 2 heads, seq 16, micro-batch 1, shard 1/2, + head"
    with pytest.raises(ConfigError):
        StageSpec(
            "moe", hidden=64, heads=2, seq=16, micro_batch=1, layers=2, experts=1, group_size=16
        )
    moe = StageSpec("moe", hidden=64, heads=2, seq=16, micro_batch=2, layers=3, first_layer=0, experts=4,
                    group_size=16, capacity_factor=1.0)  # fmt: skip
    assert moe.moe_layers == 1 and moe.capacity == 8


def test_collection_resumes_without_duplicates(tmp_path):
    pytest.importorskip("jax")
    folder = tmp_path / "ds"
    first = collect(folder, TINY, min_repeats=3, max_repeats=3, min_total_s=0.0, stop_after=2)
    assert {k: first[k] for k in ("measured", "skipped", "total")} == {"measured": 2, "skipped": 0, "total": 2}
    assert set(first["noisy"]) <= {"t-0", "t-1"}  # measured now with a spread above NOISY_REL_IQR
    with (folder / "stages.jsonl").open("ab") as fh:  # an interruption mid-write: a torn last line
        fh.write(b'{"schema": "trainsim.predtop-stage/1", "id": "t-2", "lat')
    assert [r.id for r in read_rows(folder)] == ["t-0", "t-1"]
    second = collect(folder, TINY, min_repeats=3, max_repeats=3, min_total_s=0.0)
    assert {k: second[k] for k in ("measured", "skipped", "total")} == {"measured": 2, "skipped": 2, "total": 4}
    rows = read_rows(folder)
    assert [r.id for r in rows] == ["t-0", "t-1", "t-2", "t-3"]
    for r in rows:
        assert r.latency_s > 0 and r.raw["repeats"] == 3 and len(r.raw["samples_s"]) == 3
        assert r.raw["nodes"] < r.raw["nodes_full"]  # pruned
        assert r.raw["nodes_forward"] < r.raw["nodes"]  # the forward part alone
        assert 0 < r.profile_s < r.raw["wall_s"]
        assert (folder / "graphs" / f"{r.graph}.json.gz").exists()
    prov = json.loads((folder / "provenance.json").read_text())
    assert prov["host"]["versions"]["jax"] and len(prov["runs"]) == 2
    assert collect(folder, TINY, min_repeats=3, max_repeats=3)["measured"] == 0
    changed = [
        (
            TINY[0][0],
            StageSpec("gpt", hidden=64, heads=2, seq=32, micro_batch=1, layers=1, vocab=128),
        )
    ]
    with pytest.raises(ConfigError, match="sampler changed"):
        collect(folder, changed)


def test_rebuild_graphs_keeps_measurements_and_replaces_digests(tmp_path):
    pytest.importorskip("jax")
    from trainsim.learn.dataset import iter_graphs, rebuild_graphs

    folder = tmp_path / "ds"
    collect(folder, TINY[:2], min_repeats=3, max_repeats=3, min_total_s=0.0)
    before = read_rows(folder)
    # an older graph format: strip the work columns from the stored graph files
    import gzip

    for f in (folder / "graphs").glob("*.json.gz"):
        doc = json.loads(gzip.decompress(f.read_bytes()))
        doc.pop("flops"), doc.pop("contract")
        f.write_bytes(gzip.compress(json.dumps(doc).encode()))
    assert rebuild_graphs(folder) == 2
    after = read_rows(folder)
    assert [(r.id, r.latency_s, r.raw["samples_s"]) for r in after] == [
        (r.id, r.latency_s, r.raw["samples_s"]) for r in before
    ]
    graphs = list(iter_graphs(folder, after))
    assert all(any(f > 0 for f in g.flops) for g in graphs)
    kept = {f.name for f in (folder / "graphs").glob("*.json.gz")}
    assert kept == {f"{d}.json.gz" for r in after for d in (r.graph, r.raw["graph_forward"])}


def _brute_force(lat, layers, devices, b):
    best = None
    keys = list(lat)
    for n in range(1, layers + 1):
        for combo in itertools.product(keys, repeat=n):
            if combo[0][0] != 0 or combo[-1][1] != layers or sum(k[2] for k in combo) > devices:
                continue
            if any(x[1] != y[0] for x, y in itertools.pairwise(combo)):
                continue
            t = pipeline_time_s([lat[k] for k in combo], b)
            best = t if best is None else min(best, t)
    return best


@pytest.mark.parametrize("seed", range(4))
def test_best_pipeline_is_exact(seed):
    rng = np.random.default_rng(seed)
    layers, shards = 4, (1, 2)
    lat = {(i, i + n, t): float(n * rng.uniform(0.5, 1.5) / t ** rng.uniform(0.3, 1.0))
           for i in range(layers) for n in (1, 2, 3) if i + n <= layers for t in shards}  # fmt: skip
    for devices, b in ((2, 1), (4, 4), (6, 16)):
        plan = best_pipeline(lat, layers=layers, devices=devices, microbatches=b)
        assert plan.devices <= devices
        assert plan.iteration_s == pytest.approx(_brute_force(lat, layers, devices, b))


def test_pipeline_time_is_eq4_and_infeasible_raises():
    assert pipeline_time_s([1.0, 3.0, 2.0], 4) == 6.0 + 3 * 3.0
    with pytest.raises(ModelError):
        best_pipeline({(0, 1, 4): 1.0}, layers=1, devices=2, microbatches=1)


def test_search_experiment_regret_is_zero_with_exact_predictions():
    model = SEARCH_MODELS["gpt"]
    assert len(search_candidates("gpt")) == len(model.candidates()) == 78
    rng = np.random.default_rng(0)
    measured = {
        k: (k[1] - k[0]) / k[2] ** 0.8 + 0.3 * (k[0] == 0) + rng.uniform(0, 0.05)
        for k in model.candidates()
    }
    noisy = {k: v * (1 + rng.normal(0, 0.3)) for k, v in measured.items()}
    cases = search_experiment(
        model, measured, {"exact": measured, "noisy": noisy}, microbatches=(1, 8), devices=(4, 8)
    )
    assert len(cases) == 4
    for c in cases:
        assert (
            c["approaches"]["exact"]["regret_pct"] == 0.0 and c["approaches"]["exact"]["same_plan"]
        )
        assert c["approaches"]["noisy"]["regret_pct"] >= 0.0


def test_a_resumed_collection_rebuilds_missing_or_damaged_graphs(tmp_path, capsys):
    """Walkthrough finding (2026-12-02): a missing graph's error said to re-run the collection,
    which skipped the measured row and left the graph missing: a loop. Graphs are a function of
    the spec, so a resume writes them again and keeps the measurement."""
    pytest.importorskip("jax")
    from trainsim.learn.dataset import load_graph

    folder = tmp_path / "ds"
    collect(folder, TINY[:2], min_repeats=3, max_repeats=3, min_total_s=0.0)
    rows = read_rows(folder)
    (folder / "graphs" / f"{rows[0].graph}.json.gz").unlink()
    (folder / "graphs" / f"{rows[1].graph_of('forward')}.json.gz").write_bytes(b"hello")
    before = (folder / "stages.jsonl").read_bytes()
    res = collect(folder, TINY[:2], min_repeats=3, max_repeats=3, min_total_s=0.0, log=print)
    assert (res["measured"], res["skipped"], res["restored_graphs"]) == (0, 2, 2)
    assert (folder / "stages.jsonl").read_bytes() == before  # measurements kept as they were
    for r in rows:
        load_graph(folder, r.graph), load_graph(folder, r.graph_of("forward"))
    assert "t-0: train graph rebuilt" in capsys.readouterr().out


def test_a_torn_last_line_is_said_when_rows_are_read(tmp_path, capsys):
    from trainsim.learn import dataset as ds

    folder = tmp_path / "torn"
    folder.mkdir()
    row = {"schema": ds.STAGE_SCHEMA, "id": "a", "family": "gpt", "spec": TINY[0][1].to_dict(), "latency_s": 1e-3,
           "graph": "x"}  # fmt: skip
    (folder / "stages.jsonl").write_text(json.dumps(row) + "\n" + '{"schema": "trainsim.pre')
    assert len(read_rows(folder)) == 1 and len(read_rows(folder)) == 1
    err = capsys.readouterr().err
    assert err.count("its last line is incomplete") == 1  # once per file, not per read


def test_a_folder_keeps_one_sampler(tmp_path):
    """Review finding: `stages collect --seed 5` on a seed-0 folder silently mixed samplers."""
    from trainsim.errors import ConfigError
    from trainsim.learn.dataset import _check_provenance, host_fingerprint

    def prov(seed: int) -> dict:
        sampler = {"kind": "stratified-log-latency", "family": "gpt", "count": 10, "seed": seed}
        return {"host": host_fingerprint(), "runs": [{"sampler": sampler}]}

    _check_provenance(tmp_path, prov(0))
    _check_provenance(tmp_path, prov(0))  # the same sampler resumes
    with pytest.raises(ConfigError, match=r"holds random gpt stages of sampler seed 0 \(--seed 0\); this run asks for "
                                          r"random gpt stages of sampler seed 5"):
        _check_provenance(tmp_path, prov(5))


def test_a_training_fraction_that_leaves_no_test_stage_is_refused_up_front():
    """Walkthrough finding: --fraction 0.9 passed the range check ``(0, 0.9]`` and then always
    failed (0.9 train + 0.1 validation leaves nothing to test)."""
    from trainsim.learn.evaluate import split

    with pytest.raises(ConfigError, match=r"must be in \(0, 0.9\): 0.1 validates and the rest tests; got 0.9"):
        split(340, 0.9, seed=0)
    tr, va, te = split(340, 0.89, seed=0)
    assert len(te) and len(va) and len(tr) > 2



def test_a_resume_on_a_machine_that_times_the_stages_otherwise_is_warned(tmp_path, capsys):
    """Two VMs of one CPU model share a host fingerprint; one timed the shipped MoE stages
    29-47 % faster, and a resume mixed its rows in silently (walkthrough, 2026-12-02). The
    first stage is re-timed on resume and a large difference is said."""
    pytest.importorskip("jax")
    folder = tmp_path / "ds"
    collect(folder, TINY, min_repeats=3, max_repeats=3, min_total_s=0.0, stop_after=1)
    path = folder / "stages.jsonl"
    row = json.loads(path.read_text().splitlines()[0])
    row["latency_s"] *= 3.0  # as if another, slower machine had measured it
    path.write_text(json.dumps(row) + "\n")
    capsys.readouterr()
    collect(folder, TINY, min_repeats=3, max_repeats=3, min_total_s=0.0, stop_after=1)
    err = capsys.readouterr().err
    assert f"stage {row['id']} re-timed at" in err and "another machine of the same fingerprint" in err


def test_a_row_without_a_forward_graph_is_a_one_line_error_for_a_forward_predictor(tmp_path):
    """Review finding: a forward predictor's data (``FamilyData(part="forward")``,
    ``iter_graphs(..., "forward")``) on rows that record only the training graph raised a bare
    ``KeyError: 'graph_forward'``; now the error names the file, the stage and the field, a resumed
    collection does not trip on it, and ``rebuild_graphs`` adds the very graph the row lacked."""
    pytest.importorskip("jax")
    from trainsim.errors import TraceFormatError
    from trainsim.learn.dataset import iter_graphs, rebuild_graphs
    from trainsim.learn.evaluate import FamilyData

    folder = tmp_path / "ds"
    collect(folder, TINY[:2], min_repeats=3, max_repeats=3, min_total_s=0.0)
    rows = read_rows(folder)
    forward = [r.graph_of("forward") for r in rows]
    stripped = [{k: v for k, v in r.raw.items() if k != "graph_forward"} for r in rows]
    (folder / "stages.jsonl").write_text("".join(json.dumps(d) + "\n" for d in stripped))
    old = read_rows(folder)
    assert [r.graph_of("train") for r in old] == [r.graph for r in rows]  # the training graph still reads
    with pytest.raises(TraceFormatError, match=r"stages\.jsonl: stage t-0: no graph_forward .*rebuild_graphs"):
        FamilyData(folder, part="forward")
    with pytest.raises(TraceFormatError, match="no graph_forward"):
        list(iter_graphs(folder, old, "forward"))
    with pytest.raises(ConfigError, match="part must be one of train, forward, got 'fwd'"):
        old[0].graph_of("fwd")
    res = collect(folder, TINY[:2], min_repeats=3, max_repeats=3, min_total_s=0.0)  # a resume skips them
    assert (res["skipped"], res["restored_graphs"]) == (2, 0)
    assert rebuild_graphs(folder) == 2
    assert [r.graph_of("forward") for r in read_rows(folder)] == forward
    assert len(FamilyData(folder, part="forward").graphs) == 2
