"""003's own protocol (``trainsim.learn.protocol``): the sets, the per-configuration evaluation."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from trainsim.errors import ConfigError
from trainsim.learn import protocol as proto
from trainsim.learn.provider import PipelineModel
from trainsim.learn.stages import StageSpec


def test_protocol_sets_are_003_table_iii_columns_of_one_model():
    for family, per_config in (("gpt", 50), ("moe", 27)):
        items = proto.protocol_stages(family)
        assert len({i for i, _ in items}) == len(items)  # ids are unique
        cols = Counter(proto.config_of(s, family).label for _, s in items)
        assert cols == {c.label: per_config for c in proto.RUNTIME_CONFIGS}
        m = proto.PROTOCOL_MODELS[family]
        for _, s in items:
            c = proto.config_of(s, family)
            # one device of the mesh: its share of the micro-batch, its model-parallel shard
            assert s.micro_batch * c.dp == m.micro_batch and s.shard == c.mp
            assert (s.hidden, s.seq, s.vocab) == (m.hidden, m.seq, m.vocab)
            assert s.embed == (s.first_layer == 0) and s.head == (s.first_layer + s.layers == m.layers)
            assert 1 <= s.layers <= m.max_stage_layers
    assert len(proto.protocol_stages("gpt")) >= 300 and len(proto.protocol_stages("moe")) >= 150  # the sizes
    with pytest.raises(ConfigError, match="no protocol model"):
        proto.protocol_stages("bert")
    odd = StageSpec("gpt", hidden=512, heads=8, seq=128, micro_batch=3, layers=1, vocab=16384)
    with pytest.raises(ConfigError, match="not one of the gpt protocol's configurations"):
        proto.config_of(odd, "gpt")


def test_runtime_configs_describe_themselves():
    assert [c.label for c in proto.RUNTIME_CONFIGS] == ["m1c1", "m2c1", "m2c2", "m3c1", "m3c2", "m3c3"]
    assert proto.RUNTIME_CONFIGS[0].describe() == "1 device"
    assert proto.RUNTIME_CONFIGS[4].describe() == "2-way data × 2-way model parallel"
    assert {c.dp * c.mp for c in proto.RUNTIME_CONFIGS} == {1, 2, 4}


def test_summary_means_over_configurations_and_counts_wins():
    cases = [{"family": "gpt", "config": cfg, "fraction": 0.3, "model": k, "seed": 0, "mre_pct": v}
             for cfg, vals in (("m1c1", (2.0, 3.0, 5.0)), ("m2c1", (6.0, 4.0, 4.5)))
             for k, v in zip(("dag_transformer", "gcn", "gat"), vals, strict=True)]  # fmt: skip
    s = proto.summarize_protocol(cases)
    assert s["mean_mre_pct"]["gpt"]["0.3"] == {"dag_transformer": 4.0, "gcn": 3.5, "gat": 4.75}
    assert s["dag_transformer_mre_at_30pct"] == {"gpt": 4.0}
    assert (s["dag_transformer_wins"], s["cases_compared"]) == (0, 1)  # the mean decides: GCN's 3.5 wins
    assert (s["column_wins"], s["columns_compared"]) == (1, 2)
    # two of six columns: the acceptance figures read complete rows only
    assert s["acceptance"] == {"mre_at_30pct_le_4": False, "wins_ge_75pct": False}
    assert (s["complete_rows"], s["complete_row_wins"]) == (0, 0)
    full = [{"family": "gpt", "config": rc.label, "fraction": fr, "model": k, "seed": 0, "mre_pct": v}
            for fr in (0.3, 0.8) for rc in proto.RUNTIME_CONFIGS
            for k, v in zip(("dag_transformer", "gcn", "gat"), (3.0, 4.0, 5.0), strict=True)]  # fmt: skip
    s = proto.summarize_protocol(full)
    assert (s["complete_rows"], s["complete_row_wins"]) == (2, 2)
    assert s["acceptance"] == {"mre_at_30pct_le_4": True, "wins_ge_75pct": True}
    # asked for GPT and MoE at 30 and 80 %: two complete rows of four are not enough
    assert not proto.summarize_protocol(full, expected_rows=4)["acceptance"]["wins_ge_75pct"]
    assert proto.summarize_protocol(full, expected_rows=2)["acceptance"]["wins_ge_75pct"]
    s = proto.summarize_protocol([c for c in full if c["config"] != "m3c3" or c["model"] != "gcn"])
    assert (s["cases_compared"], s["complete_rows"], s["acceptance"]["wins_ge_75pct"]) == (2, 0, False)
    assert proto.summarize_protocol(cases, seed=1)["cases_compared"] == 0
    extra = {"family": "gpt", "config": "m3c1", "fraction": 0.3, "model": "dag_transformer", "seed": 0, "mre_pct": 0.1}
    s = proto.summarize_protocol([*cases, extra])  # a column only one model has: not compared
    assert (s["dag_transformer_wins"], s["cases_compared"], s["columns_compared"]) == (0, 1, 2)
    # other readouts and bag sizes are other experiments: summarized only when asked for
    bagged = [c | {"readout": "sum", "members": 3, "mre_pct": c["mre_pct"] / 2} for c in cases]
    s = proto.summarize_protocol([*cases, *bagged], readout="sum", members=3)
    assert s["mean_mre_pct"]["gpt"]["0.3"] == {"dag_transformer": 2.0, "gcn": 1.75, "gat": 2.375}
    assert proto.summarize_protocol(bagged)["cases_compared"] == 0
    # a bag's stop: rows before the choice (no "stop") are "each"; a "common" row only when asked for
    common = [c | {"stop": "common", "mre_pct": c["mre_pct"] / 4} for c in bagged]
    s = proto.summarize_protocol([*bagged, *common], readout="sum", members=3)
    assert s["mean_mre_pct"]["gpt"]["0.3"]["dag_transformer"] == 2.0
    s = proto.summarize_protocol([*bagged, *common], readout="sum", members=3, stop="common")
    assert s["mean_mre_pct"]["gpt"]["0.3"]["dag_transformer"] == 0.5
    legacy = [c | {"train_config": {"stop": "common"}} for c in bagged]  # read from the config it recorded
    assert proto.summarize_protocol(legacy, readout="sum", members=3, stop="common")["cases_compared"] == 1
    assert proto.target_of("sum") == "log" and proto.target_of("logsumexp") == "log-per-flop"


def test_protocol_run_names_an_unknown_configuration(tmp_path):
    from trainsim.errors import ConfigError

    with pytest.raises(ConfigError, match=r"unknown configuration\(s\) \['m9c9'\]; known: m1c1"):
        proto.evaluate_protocol({"gpt": tmp_path}, tmp_path / "res", configs=["m1c1", "m9c9"])


@pytest.fixture()
def tiny_protocol(monkeypatch, tmp_path):
    """A two-configuration protocol of a tiny GPT, measured here (a few seconds)."""
    pytest.importorskip("jax")
    pytest.importorskip("torch_geometric")
    from trainsim.learn.dataset import collect

    tiny = PipelineModel("gpt", layers=3, hidden=64, heads=2, seq=16, micro_batch=2, vocab=128, max_stage_layers=2)
    monkeypatch.setitem(proto.PROTOCOL_MODELS, "gpt", tiny)
    monkeypatch.setattr(proto, "RUNTIME_CONFIGS", (proto.RuntimeConfig(1, 1, 1, 1), proto.RuntimeConfig(2, 2, 1, 2)))
    items = proto.protocol_stages("gpt")
    assert len(items) == 10  # 3 + 2 layer ranges per configuration
    folder = tmp_path / "data" / "gpt-003"
    collect(folder, items, min_repeats=3, max_repeats=3, min_total_s=0.0)
    return folder


def test_protocol_evaluation_per_configuration_resumes_and_validate_prints_it(tiny_protocol, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from trainsim.cli.main import _register, app
    from trainsim.learn.train import TrainConfig

    # the CLI's runs train with the protocol's schedule: cut to the test's (500 epochs took ~90 s)
    monkeypatch.setattr(proto, "PROTOCOL_EPOCHS", 2)
    monkeypatch.setattr(proto, "PROTOCOL_PATIENCE", 2)
    out = tmp_path / "res"
    tc = TrainConfig(epochs=2, patience=2)
    s = proto.evaluate_protocol({"gpt": tiny_protocol}, out, fractions=(0.5,), kinds=("gcn",), train_config=tc)
    rows = proto.read_protocol_cases(out)
    assert sorted(r["config"] for r in rows) == ["m1c1", "m2c2"]
    assert all(r["stages"] == 5 and r["train"] == 2 and r["test"] == 2 for r in rows)  # 5 stages a column
    assert set(s["mre_pct"]["gpt"]["0.5"]["gcn"]) == {"m1c1", "m2c2"}
    assert proto.evaluate_protocol({"gpt": tiny_protocol}, out, fractions=(0.5,), kinds=("gcn",),
                               train_config=tc) == s  # fmt: skip
    assert len(proto.read_protocol_cases(out)) == 2  # resumed: nothing trained twice

    from trainsim.bench.dataset import append_row

    append_row(out / "protocol_cases.jsonl", rows[0] | {"fraction": 0.8, "mre_pct": 99.0})  # not asked for below
    _register()  # the suite reads the finished cases back (--resume): nothing is trained again
    res = CliRunner().invoke(app, ["validate", "predtop", "--protocol", "--dataset", str(tiny_protocol.parent),
                                   "--resume", str(out), "--fractions", "0.5", "--models", "gcn",
                                   "--format", "json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["params"]["protocol"] == "003" and doc["configs"] == ["m1c1", "m2c2"]
    assert {c["case"] for c in doc["cases"]} == {"gpt/m1c1/50%/gcn", "gpt/m2c2/50%/gcn"}
    assert doc["mre_table"]["gpt"]["0.5"]["gcn"] == pytest.approx(
        sum(r["mre_pct"] for r in rows) / 2)  # fmt: skip
    # the 80 % row is not summarized (a 2-epoch GCN's own errors can be anything, even above 99 %)
    assert doc["summary"]["cases"] == 2
    assert doc["summary"]["max_abs_err_pct"] == pytest.approx(max(abs(r["mre_pct"]) for r in rows))
    assert set(doc["mre_table"]["gpt"]) == {"0.5"} and len(proto.read_protocol_cases(out)) == 3
    res = CliRunner().invoke(app, ["validate", "predtop", "--protocol", "--format", "table", "--dataset",
                                   str(tiny_protocol.parent), "--resume", str(out), "--fractions", "0.5",
                                   "--models", "gcn"])  # fmt: skip
    assert res.exit_code == 0 and "003 protocol" in res.output and "m2c2" in res.output, res.output
    # another readout or bag size is another set of cases in the same folder: trained once, summarized apart
    res = CliRunner().invoke(app, ["validate", "predtop", "--protocol", "--dataset", str(tiny_protocol.parent),
                                   "--resume", str(out), "--fractions", "0.5", "--models", "gcn",
                                   "--readout", "sum", "--members", "2", "--format", "json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    added = proto.read_protocol_cases(out)[3:]
    assert len(added) == 2 and {(r["readout"], r["target"], r["members"]) for r in added} == {("sum", "log", 2)}
    assert all(len(r["member_history"]) == 2 for r in added)
    assert doc["params"]["readout"] == "sum" and doc["mre_table"]["gpt"]["0.5"]["gcn"] == pytest.approx(
        sum(r["mre_pct"] for r in added) / 2)  # fmt: skip
    # the bag's common stop is another set again; --stop needs a bag
    res = CliRunner().invoke(app, ["validate", "predtop", "--protocol", "--dataset", str(tiny_protocol.parent),
                                   "--resume", str(out), "--fractions", "0.5", "--models", "gcn", "--readout", "sum",
                                   "--members", "2", "--stop", "common", "--format", "json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    added = proto.read_protocol_cases(out)[5:]
    assert len(added) == 2 and {r["stop"] for r in added} == {"common"}
    assert json.loads(res.stdout)["params"]["stop"] == "common"
    for h in (r["member_history"] for r in added):  # every member restored at the same epoch
        assert len({m["best_epoch"] for m in h}) == 1
    res = CliRunner().invoke(app, ["validate", "predtop", "--protocol", "--dataset", str(tiny_protocol.parent),
                                   "--stop", "common"])  # fmt: skip
    assert res.exit_code == 2 and "needs --members 2 or more" in res.stderr  # a usage error
    res = CliRunner().invoke(app, ["validate", "predtop", "--protocol", "--dataset", str(tiny_protocol.parent),
                                   "--members", "2", "--stop", "best"])  # fmt: skip
    assert res.exit_code == 2 and "--stop must be one of each, common" in res.stderr
    res = CliRunner().invoke(app, ["validate", "predtop", "--protocol", "--dataset", str(tiny_protocol.parent),
                                   "--readout", "mean"])  # fmt: skip
    assert res.exit_code == 2 and "--readout must be one of" in res.stderr
    res = CliRunner().invoke(app, ["validate", "predtop", "--protocol", "--dataset", str(tiny_protocol.parent),
                                   "--models", "mlp"])  # fmt: skip
    assert res.exit_code == 2 and "unknown model 'mlp'" in res.stderr
    res = CliRunner().invoke(app, ["validate", "predtop", "--protocol", "--dataset", str(tmp_path)])
    assert res.exit_code == 1 and "no protocol stage sets" in str(res.exception)  # what the folder holds


def test_per_mesh_predictors_train_on_the_mesh_and_test_each_configuration_on_its_own_split(monkeypatch, tmp_path):
    pytest.importorskip("jax")
    pytest.importorskip("torch_geometric")
    import numpy as np

    from trainsim.learn.dataset import collect
    from trainsim.learn.evaluate import split
    from trainsim.learn.train import TrainConfig

    tiny = PipelineModel("gpt", layers=3, hidden=64, heads=2, seq=16, micro_batch=2, vocab=128, max_stage_layers=2)
    monkeypatch.setitem(proto.PROTOCOL_MODELS, "gpt", tiny)
    rcs = (proto.RuntimeConfig(1, 1, 1, 1), proto.RuntimeConfig(2, 1, 2, 1), proto.RuntimeConfig(2, 2, 1, 2))
    monkeypatch.setattr(proto, "RUNTIME_CONFIGS", rcs)
    folder = tmp_path / "gpt-003"
    collect(folder, proto.protocol_stages("gpt"), min_repeats=3, max_repeats=3, min_total_s=0.0)
    out, tc = tmp_path / "res", TrainConfig(epochs=2, patience=2)
    # mesh 1 has one configuration: its per-configuration row serves both settings
    proto.evaluate_protocol({"gpt": folder}, out, fractions=(0.5,), kinds=("gcn",), train_config=tc, configs=["m1c1"])
    s = proto.evaluate_protocol({"gpt": folder}, out, fractions=(0.5,), kinds=("gcn",), train_config=tc, per="mesh")
    rows = proto.read_protocol_cases(out)
    assert [(r["config"], r.get("per", "config")) for r in rows] == [("m1c1", "config"), ("m2c1", "mesh"),
                                                                     ("m2c2", "mesh")]  # fmt: skip
    m21, m22 = rows[1], rows[2]
    n_tr, n_va, n_te = (len(p) for p in split(5, 0.5, seed=0))  # each column's own split of its 5 stages
    for r in (m21, m22):
        assert (r["stages"], r["train"], r["val"], r["test"]) == (5, n_tr, n_va, n_te)
        assert (r["mesh_train"], r["mesh_val"]) == (2 * n_tr, 2 * n_va)  # one predictor, both columns' stages
    assert m21["train_s"] == m22["train_s"] and m21["mre_pct"] != m22["mre_pct"]  # one model, two test sets
    assert set(s["mre_pct"]["gpt"]["0.5"]["gcn"]) == {"m1c1", "m2c1", "m2c2"}
    assert s["mean_mre_pct"]["gpt"]["0.5"]["gcn"] == pytest.approx(np.mean([r["mre_pct"] for r in rows]))
    # the per-configuration summary does not read the mesh rows; a rerun trains nothing
    assert set(proto.summarize_protocol(rows)["mre_pct"]["gpt"]["0.5"]["gcn"]) == {"m1c1"}
    proto.evaluate_protocol({"gpt": folder}, out, fractions=(0.5,), kinds=("gcn",), train_config=tc, per="mesh")
    assert len(proto.read_protocol_cases(out)) == 3
    with pytest.raises(ConfigError, match="--per must be one of config, mesh"):
        proto.evaluate_protocol({"gpt": folder}, out, per="node")


def test_per_is_a_protocol_option(tmp_path):
    from trainsim.learn.suite import run_predtop_suite

    with pytest.raises(ConfigError, match="--per applies to --protocol"):
        run_predtop_suite(tmp_path, per="mesh")
    with pytest.raises(ConfigError, match="--per must be one of config, mesh"):
        proto.row_per("m2c1", "node")


def test_predictors_of_different_settings_never_share_a_folder(tmp_path):
    """validate predtop --resume saved every setting's predictor to one folder per (family,
    model, seed), so a later run's search read another readout's predictor under its own label
    (walkthrough, 2026-12-02)."""
    from trainsim.learn.evaluate import predictor_dir, predictor_setting

    base = predictor_setting(readout="logsumexp", part="train", features="table1+work", target="log-per-flop",
                             members=1, stop="each")  # fmt: skip
    other = {**base, "readout": "sum", "target": "log"}
    bag = {**base, "members": 3, "stop": "common"}
    paths = {predictor_dir(tmp_path, "gpt", "gcn", 0, s) for s in (base, other, bag)}
    assert len(paths) == 3 and predictor_dir(tmp_path, "gpt", "gcn", 0, base).name == "gpt-gcn-s0"
    assert predictor_setting(readout="sum", part="train", features="table1", target="log", members=1,
                             stop="common")["stop"] == "each"  # one model: no bag stop to tell apart


def test_results_folders_and_case_files_fail_in_one_line(tmp_path):
    import pytest

    from trainsim.errors import ConfigError
    from trainsim.learn.evaluate import read_cases, results_folder

    f = tmp_path / "README.md"
    f.write_text("x", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"README\.md: is a file; give a folder"):
        results_folder(f)
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "cases.jsonl").write_text('{"a": 1}\nnot json\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"cases\.jsonl: line 2: not JSON"):
        read_cases(tmp_path / "r")


def test_the_search_integration_is_kept_in_the_resume_folder(tmp_path, monkeypatch):
    """It retrained 003 §VI's sampled predictor on every run, so its cost figure (which counts
    that training's wall time) moved 25-35 % between identical runs."""
    from trainsim.learn import provider, suite
    from trainsim.learn.train import TrainConfig

    calls = []

    def fake(folder, **kw):
        calls.append(kw)
        return {"family": kw["family"], "approaches": {"sampled30-gcn": {"saved_pct": 30.0 + len(calls)}}}

    monkeypatch.setattr(provider, "run_search_integration", fake)
    args = {"fam": "gpt", "preds": {}, "sampled": ("gcn",), "seed": 0, "tc": TrainConfig(epochs=3), "inputs": True,
            "setting": {"readout": "logsumexp"}}  # fmt: skip
    first = suite._search(tmp_path, tmp_path / "gpt-search", **args)
    assert suite._search(tmp_path, tmp_path / "gpt-search", **args) == first and len(calls) == 1
    suite._search(tmp_path, tmp_path / "gpt-search", **{**args, "setting": {"readout": "sum"}})  # another setting
    suite._search(None, tmp_path / "gpt-search", **args)  # no --resume: nothing kept
    assert len(calls) == 3
    # re-measured candidates (another stages.jsonl) or another predictor are another search (review)
    (tmp_path / "gpt-search").mkdir()
    (tmp_path / "gpt-search" / "stages.jsonl").write_text("{}\n")
    suite._search(tmp_path, tmp_path / "gpt-search", **args)
    suite._search(tmp_path, tmp_path / "gpt-search", **args, digests={"gcn": "abc"})
    assert len(calls) == 5
    suite._search(tmp_path, tmp_path / "gpt-search", **args, digests={"gcn": "abc"})
    assert len(calls) == 5
