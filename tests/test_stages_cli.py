"""``trainsim stages``: train a predictor on measured stages, predict them, search with it."""

from __future__ import annotations

import itertools
import json
import re

import pytest
from typer.testing import CliRunner

from trainsim.cli.main import _register, app
from trainsim.learn.stages import StageSpec

pytest.importorskip("jax")
pytest.importorskip("torch_geometric")

STAGES = [(f"c-{i}", StageSpec("gpt", hidden=64, heads=2, seq=16 * (1 + i % 3), micro_batch=1 + i % 2,
                               layers=1 + i % 3, shard=1 + i % 2, vocab=128)) for i in range(10)]  # fmt: skip


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from trainsim.learn.dataset import collect

    folder = tmp_path_factory.mktemp("stages") / "ds"
    collect(folder, STAGES, min_repeats=3, max_repeats=3, min_total_s=0.0)
    return folder


def _run(*args: str):
    _register()
    return CliRunner().invoke(app, ["stages", *args])


def test_train_predict_and_search_with_a_predictor(dataset, tmp_path):
    out = tmp_path / "pred"
    res = _run("train", str(dataset), "--out", str(out), "--model", "gcn", "--epochs", "3",
               "--fraction", "0.5", "--format", "json")  # fmt: skip
    assert res.exit_code == 0, res.output
    case = json.loads(res.stdout)
    assert case["model"] == "gcn" and case["features"] == "table1+work" and case["mre_pct"] >= 0
    assert case["train"] == 5 and case["val"] == 1 and case["test"] == 4
    assert (out / "predictor.safetensors").exists()
    meta = json.loads((out / "predictor.json").read_text())["meta"]
    assert meta["test_mre_pct"] == case["mre_pct"] and meta["families"] == ["gpt"]
    res = _run("search", "--family", "moe", "--predictor", str(out))  # a GPT predictor for MoE stages
    assert res.exit_code != 0 and "trained on gpt stages, not 'moe'" in str(res.exception)
    res = _run("train", str(dataset), "--out", str(tmp_path / "p2"), "--model", "foo")
    assert res.exit_code == 2 and "--model must be one of dag_transformer, gcn, gat, got 'foo'" in res.stderr

    res = _run("predict", str(out), str(dataset), "--format", "json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert [s["id"] for s in doc["stages"]] == [i for i, _ in STAGES]
    assert all(s["predicted_s"] > 0 for s in doc["stages"])
    assert "learned" in doc["provenance"]
    # the stages it trained and validated on are told from the held-out ones (it mixed them)
    assert {s["split"] for s in doc["stages"]} == {"train", "val", "test"}
    assert {k: v["stages"] for k, v in doc["by_split"].items()} == {"train": 5, "val": 1, "test": 4}
    # float32 inference in other batches (all ten graphs here, the four test graphs in training)
    assert doc["by_split"]["test"]["mre_pct"] == pytest.approx(case["mre_pct"], rel=1e-4)
    # the same stages in another folder (copied, moved): still the ones it trained on, by the stage
    # itself (walkthrough 2026-12-02: a copy was scored as all unseen, flattering the MRE)
    other = tmp_path / "copy"
    import shutil

    shutil.copytree(dataset, other)
    res = _run("predict", str(out), str(other), "--format", "json")
    assert res.exit_code == 0
    copied = json.loads(res.stdout)
    specs = [json.dumps(st["spec"], sort_keys=True) for st in doc["stages"]]
    for a, b, sp in zip(doc["stages"], copied["stages"], specs, strict=True):
        if specs.count(sp) == 1:  # a stage measured once keeps its split
            assert a["split"] == b["split"]
        else:  # STAGES repeats specs: one it trained on anywhere is not held out anywhere
            splits = {x["split"] for x, y in zip(doc["stages"], specs, strict=True) if y == sp}
            assert b["split"] == min(splits, key=("train", "val", "test").index)
    pj = out / "predictor.json"
    d = json.loads(pj.read_text())
    assert d["meta"]["spec_ranges"]["layers"] == [1, 3] and d["meta"]["host"]["cpu"]
    old = json.loads(pj.read_text())  # a predictor saved before split_specs: ids, of its own folder only
    old["meta"].pop("split_specs")
    pj.write_text(json.dumps(old))
    res = _run("predict", str(out), str(other), "--format", "json")
    assert res.exit_code == 0 and set(json.loads(res.stdout)["by_split"]) == {"unseen"}
    # a predictor validate predtop saved before 2026-12-02 names its family as "family" only
    d["meta"].pop("families")
    d["meta"]["family"] = "gpt"
    pj.write_text(json.dumps(d))
    res = _run("search", "--family", "moe", "--predictor", str(out))
    assert res.exit_code != 0 and "trained on gpt stages, not 'moe'" in str(res.exception)

    bag = tmp_path / "bag"  # a bag of two "sum" models: saved as one predictor, read back as one
    res = _run("train", str(dataset), "--out", str(bag), "--model", "gcn", "--epochs", "2", "--fraction", "0.5",
               "--readout", "sum", "--members", "2", "--format", "json")  # fmt: skip
    assert res.exit_code == 0, res.output
    case = json.loads(res.stdout)
    assert (case["readout"], case["target"], case["members"], len(case["member_history"])) == ("sum", "log", 2, 2)
    model = json.loads((bag / "predictor.json").read_text())["model"]
    assert (model["readout"], model["members"]) == ("sum", 2)
    res = _run("predict", str(bag), str(dataset), "--format", "json")
    assert res.exit_code == 0 and all(s["predicted_s"] > 0 for s in json.loads(res.stdout)["stages"])
    res = _run("train", str(dataset), "--out", str(tmp_path / "b2"), "--model", "gcn", "--epochs", "2",
               "--members", "2", "--stop", "common", "--format", "json")  # fmt: skip
    assert res.exit_code == 0, res.output
    case = json.loads(res.stdout)
    assert case["stop"] == "common" and len({m["best_epoch"] for m in case["member_history"]}) == 1
    res = _run("train", str(dataset), "--out", str(tmp_path / "b3"), "--stop", "common")
    assert res.exit_code == 2 and "needs --members 2 or more" in res.stderr  # a usage error


@pytest.mark.slow
def test_search_with_a_predictor_returns_a_valid_plan(dataset, tmp_path):
    out = tmp_path / "pred"
    assert _run("train", str(dataset), "--out", str(out), "--model", "gcn", "--epochs", "1").exit_code == 0
    res = _run("search", "--family", "gpt", "--devices", "4", "--microbatches", "8", "--predictor", str(out),
               "--format", "json")  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    stages = doc["stages"]
    assert stages[0][0] == 0 and stages[-1][1] == 8 and sum(s[2] for s in stages) <= 4
    assert all(a[1] == b[0] for a, b in itertools.pairwise(stages))


def test_train_refuses_an_out_inside_the_dataset_and_warns_of_a_tiny_test_set(dataset, tmp_path):
    res = _run("train", str(dataset), "--out", str(dataset / "p"), "--model", "gcn", "--epochs", "1")
    assert res.exit_code == 1 and "inside the dataset folder" in str(res.exception)
    assert not (dataset / "p").exists()
    res = _run("train", str(dataset), "--out", str(tmp_path / "p"), "--model", "gcn", "--epochs", "1")
    assert res.exit_code == 0 and "only 1 stages were held out to test" in res.stderr  # 10 stages at 0.8
    res = _run("train", str(tmp_path / "nothing"), "--out", str(tmp_path / "q"), "--model", "gcn")
    assert res.exit_code == 1 and not (tmp_path / "q").exists()  # a failed run leaves no empty folder
    assert "nothing: no such dataset folder" in str(res.exception)  # was "stages.jsonl is missing or empty"
    afile = tmp_path / "afile"
    afile.write_text("x")
    res = _run("search", "--measured", str(afile))  # was "no such dataset folder" of a file that is there
    assert res.exit_code == 1 and "afile: is a file; a stage dataset is a folder" in str(res.exception)
    res = _run("predict", str(tmp_path / "p"), str(tmp_path / "nothing"))
    assert res.exit_code == 1 and "no such dataset folder" in str(res.exception)


def test_search_says_what_it_models_and_warns_beyond_the_training_range(dataset, tmp_path):
    out = tmp_path / "pred"
    assert _run("train", str(dataset), "--out", str(out), "--model", "gcn", "--epochs", "1").exit_code == 0
    res = _run("search", "--family", "gpt", "--devices", "2", "--microbatches", "2", "--predictor", str(out))
    assert res.exit_code == 0, res.output
    # the dataset's stages: 1-3 layers, hidden 64, seq 16-48; the search model's: 1-4 layers, hidden 512
    assert "trained on stages of layers 1-3, shard 1-2, hidden 64" in res.stderr
    assert "search model (fixed, 003 §VIII-B; --layers/--hidden/... change it): gpt, 8 layers, hidden 512" in res.stderr
    assert "calibrated: gcn learned from stage latencies measured on" in " ".join(res.stdout.split())


def test_errors_are_one_line(dataset, tmp_path):
    res = _run("search", "--family", "gpt")  # usage errors (exit 2) first
    assert res.exit_code == 2 and "exactly one of --predictor" in res.stderr
    res = _run("train", str(dataset), "--out", str(tmp_path / "p"), "--features", "table9")
    assert res.exit_code == 2 and "features must be one of" in res.stderr
    res = _run("train", str(dataset), "--out", str(tmp_path / "p"), "--readout", "mean")
    assert res.exit_code == 2 and "--readout must be one of" in res.stderr
    res = _run("predict", str(tmp_path / "missing"), str(dataset))
    assert res.exit_code != 0 and "missing: no such folder; expected a predictor folder" in str(res.exception)
    (tmp_path / "empty").mkdir()
    res = _run("predict", str(tmp_path / "empty"), str(dataset))
    assert res.exit_code != 0 and "no predictor.json" in str(res.exception)


def test_damaged_predictors_and_datasets_are_one_line_errors(dataset, tmp_path):
    """Review findings: each of these was a traceback (JSONDecodeError, FileNotFoundError,
    SafetensorError, NotADirectoryError, UnicodeDecodeError, BadGzipFile, IndexError)."""
    good = tmp_path / "good"
    assert _run("train", str(dataset), "--out", str(good), "--model", "gcn", "--epochs", "1").exit_code == 0
    weights, meta = (good / "predictor.safetensors").read_bytes(), (good / "predictor.json").read_bytes()
    cases = {
        "json": ({"predictor.json": b'{"schema":', "predictor.safetensors": weights}, "unreadable predictor JSON"),
        "nonutf": ({"predictor.json": b"\xff\xfe", "predictor.safetensors": weights}, "unreadable predictor JSON"),
        "noweights": ({"predictor.json": meta}, "no predictor.safetensors"),
        "torn": ({"predictor.json": meta, "predictor.safetensors": weights[:1000]}, "not a readable safetensors"),
    }
    for name, (files, message) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        for f, data in files.items():
            (folder / f).write_bytes(data)
        res = _run("predict", str(folder), str(dataset))
        assert res.exit_code == 1 and message in str(res.exception), (name, res.exception)
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert "not a predictor folder" in str(_run("predict", str(afile), str(dataset)).exception)
    res = _run("train", str(dataset), "--out", str(afile), "--model", "gcn", "--epochs", "1")
    assert res.exit_code == 1 and "is a file; give a folder" in str(res.exception)
    import shutil

    small = tmp_path / "small"
    shutil.copytree(dataset / "graphs", small / "graphs")
    lines = (dataset / "stages.jsonl").read_bytes().splitlines(keepends=True)
    (small / "stages.jsonl").write_bytes(b"".join(lines[:3]))
    res = _run("train", str(small), "--out", str(tmp_path / "p3"), "--model", "gcn", "--epochs", "1")
    assert res.exit_code == 1 and "3 stages split" in str(res.exception)
    (small / "stages.jsonl").write_bytes(b"\xff" + b"".join(lines[:3]))
    res = _run("predict", str(good), str(small))
    assert res.exit_code == 1 and "line 1: not UTF-8 text (byte 0)" in str(res.exception)


def test_a_damaged_stage_graph_is_a_one_line_error(dataset, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(dataset, copy)
    for g in (copy / "graphs").glob("*.json.gz"):
        g.write_bytes(b"hello")
    good = tmp_path / "good"
    res = _run("train", str(copy), "--out", str(good), "--model", "gcn", "--epochs", "1")
    assert res.exit_code == 1 and "unreadable stage graph" in str(res.exception)


def test_collect_follows_the_cli_contract(tmp_path):
    """Review findings: collect always printed JSON (no --format), its errors were tracebacks
    from the re-executed process, and --family bogus showed an internal usage text. It runs
    as its own process (single-threaded XLA), so this test runs the real command."""
    import subprocess
    import sys

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "trainsim", "stages", "collect", *args], capture_output=True,
                              text=True, timeout=300, check=False)  # fmt: skip

    folder = tmp_path / "ds"
    p = run(str(folder), "--family", "gpt", "--count", "1")
    assert p.returncode == 0, p.stderr
    # the summary is the table-mode result: stdout (review 2026-11-27: it went to stderr)
    assert p.stdout.startswith("measured 1 stage(s)") and "measured 1 stage(s)" not in p.stderr
    p = run(str(folder), "--family", "gpt", "--count", "1", "--format", "json")
    assert p.returncode == 0 and json.loads(p.stdout) == {"measured": 0, "skipped": 1, "restored_graphs": 0,
                                                          "total": 1, "noisy": []}  # fmt: skip
    p = run(str(folder), "--family", "gpt", "--protocol", "--count", "3")  # a fixed set: --count is not used
    assert p.returncode == 2 and "--count is for random stages; --protocol measures a fixed set" in p.stderr
    p = run(str(folder), "--family", "gpt", "--search-set")
    assert p.returncode == 1 and "holds random gpt stages of sampler seed 0 (--seed 0); this run asks for the gpt " \
        "search model's candidate stages (--search-set)" in p.stderr
    p = run(str(folder), "--family", "bogus")
    assert p.returncode == 2 and p.stderr.strip() == "trainsim: error: --family must be gpt or moe, got 'bogus'"
    p = run(str(folder), "--family", "gpt", "--count", "1", "--seed", "5")
    assert p.returncode == 1 and "Traceback" not in p.stderr and "collect into another folder" in p.stderr


TINY = ("--layers", "2", "--hidden", "64", "--heads", "2", "--seq", "16", "--micro-batch", "1", "--vocab", "128",
        "--shards", "1,2", "--max-stage-layers", "2")  # fmt: skip


def test_a_search_model_of_ones_own_is_validated_by_flag_and_tagged():
    from trainsim.errors import ConfigError
    from trainsim.learn.provider import SEARCH_MODELS, candidate_id, search_candidates, search_model

    assert search_model("gpt") == SEARCH_MODELS["gpt"]
    assert search_candidates("gpt")[0][0] == "gptsearch-0-1-t1"  # the shipped sets' ids are unchanged
    m = search_model("gpt", layers=2, hidden=64, heads=2, seq=16, micro_batch=1, vocab=128, shards=[2, 1, 2])
    assert m.shards == (1, 2) and m.max_stage_layers == 2  # clipped to the layers
    ids = [i for i, _ in search_candidates("gpt", m)]
    assert len(ids) == 6 and all(i.startswith("gptsearch-") and i != candidate_id("gpt", (0, 1, 1)) for i in ids)
    with pytest.raises(ConfigError, match=r"search model \(--hidden 100\): heads must divide hidden"):
        search_model("gpt", hidden=100)
    with pytest.raises(ConfigError, match="apply to the moe family"):
        search_model("gpt", experts=8)
    with pytest.raises(ConfigError, match="--shards"):
        search_model("gpt", shards=[0])


def test_search_over_ones_own_model_measured_and_predicted(dataset, tmp_path):
    from trainsim.learn.dataset import collect
    from trainsim.learn.provider import search_candidates, search_model

    m = search_model("gpt", layers=2, hidden=64, heads=2, seq=16, micro_batch=1, vocab=128, shards=[1, 2])
    folder = tmp_path / "own"
    collect(folder, search_candidates("gpt", m), min_repeats=3, max_repeats=3, min_total_s=0.0)
    res = _run("search", "--family", "gpt", "--devices", "2", "--microbatches", "4", "--measured", str(folder),
               *TINY, "--format", "json")  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["model"]["layers"] == 2 and doc["candidates"] == 6 and doc["stages"][-1][1] == 2
    res = _run("search", "--family", "gpt", "--devices", "2", "--measured", str(folder))  # the fixed model: not there
    assert res.exit_code == 1 and "78 of 78 stages were not measured" in str(res.exception)
    res = _run("search", "--family", "gpt", "--devices", "2", "--measured", str(dataset), *TINY)
    assert res.exit_code == 1 and "trainsim stages collect DIR --family gpt --search-set --layers 2 --hidden 64" in str(res.exception)
    out = tmp_path / "pred"
    assert _run("train", str(dataset), "--out", str(out), "--model", "gcn", "--epochs", "1").exit_code == 0
    res = _run("search", "--family", "gpt", "--devices", "2", "--microbatches", "4", "--predictor", str(out), *TINY)
    assert res.exit_code == 0, res.output
    assert "search model (your own): gpt, 2 layers, hidden 64, 2 heads, seq 16, micro-batch 1, vocabulary 128" in res.stderr
    res = _run("search", "--family", "gpt", "--predictor", str(out), "--shards", "1,x")
    assert res.exit_code == 2 and "--shards '1,x': expected comma-separated integers" in res.stderr


def test_collect_takes_the_search_models_flags_with_search_set_only(tmp_path):
    res = _run("collect", str(tmp_path / "ds"), "--family", "gpt", "--layers", "4")
    assert res.exit_code == 2 and "--layers sets the search model: it goes with --search-set" in res.stderr
    res = _run("collect", str(tmp_path / "ds"), "--family", "gpt", "--search-set", "--hidden", "100")
    assert res.exit_code == 1 and "heads must divide hidden" in str(res.exception)
    assert not (tmp_path / "ds").exists()


def test_a_described_stage_reads_back_from_its_key_and_takes_the_search_models_shape():
    from trainsim.errors import ConfigError
    from trainsim.learn.provider import SEARCH_MODELS, parse_stage

    s = SEARCH_MODELS["moe"].stage(3, 5, 2)
    assert parse_stage(s.key()) == s  # the dataset's key of a stage is a --stage text
    short = parse_stage("family=moe,layers=2,first-layer=3,shard=2")  # the rest: the moe search model's
    assert short == s
    assert parse_stage("family=gpt, layers=1, micro-batch=4, head=true").micro_batch == 4
    for text, message in {
        "layers=2": "give family=",
        "family=gpt,layers=2,batch=4": "unknown field 'batch'; a stage's fields: family, hidden",
        "family=gpt,layers=two": "layers must be an integer, got 'two'",
        "family=gpt,layers=1,embed=yes": "embed must be true or false",
        "family=gpt,layers=1,experts=8": "experts applies to the moe family",
        "family=gpt,layers=1,hidden=100": "heads must divide hidden",
        "family=gpt,layers": "'layers' is not FIELD=VALUE",
    }.items():
        with pytest.raises(ConfigError, match=re.escape(f"--stage {text!r}: {message}")):
            parse_stage(text)


def test_predict_a_described_stage(dataset, tmp_path):
    out = tmp_path / "pred"
    assert _run("train", str(dataset), "--out", str(out), "--model", "gcn", "--epochs", "1",
                "--fraction", "0.5").exit_code == 0  # fmt: skip
    whole = json.loads(_run("predict", str(out), str(dataset), "--format", "json").stdout)["stages"][4]
    res = _run("predict", str(out), "--stage", STAGES[4][1].key(), "--format", "json")  # measured once
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    one = doc["stages"][0]
    # its graph traced as collect stored it: the dataset's prediction of that stage, and its split
    assert one["spec"] == whole["spec"] and one["split"] == whole["split"] != "unseen"
    assert one["predicted_s"] == pytest.approx(whole["predicted_s"], rel=1e-5)
    assert one["outside_training"] == "" and one["unseen_ops"] == []
    assert doc["test_mre_pct"] > 0 and "learned from stage latencies" in doc["provenance"]
    assert f"test MRE {doc['test_mre_pct']:.2f} % over" in doc["provenance"]
    # beyond the training stages (1-3 layers, no LM head): said, and still predicted
    res = _run("predict", str(out), "--stage", "family=gpt,layers=4,hidden=64,heads=2,seq=16,vocab=128,head=true")
    assert res.exit_code == 0, res.output
    assert "trained on stages of layers 1-3, without the head; its graph has operators no training stage had" in res.stderr
    assert "nothing measured" in res.stdout and "unseen" in res.stdout and "+ head" in res.stderr
    res = _run("predict", str(out), "--stage", "family=moe,layers=1")
    assert res.exit_code == 1 and "trained on gpt stages, not 'moe'" in str(res.exception)
    res = _run("predict", str(out), str(dataset), "--stage", "family=gpt,layers=1")
    assert res.exit_code == 2 and "give a dataset folder or --stage stages, not both" in res.stderr
    res = _run("predict", str(out))
    assert res.exit_code == 2 and "or --stage FIELD=VALUE" in res.stderr


def test_a_forward_predictor_on_rows_without_forward_graphs_is_a_one_line_error(dataset, tmp_path):
    """Review finding: `stages predict` of a predictor trained on forward graphs (the API's
    ``FamilyData(part="forward")``) printed a KeyError traceback for rows recording the training
    graph only; it predicts the dataset's forward graphs, or says which field a row lacks."""
    import shutil
    from dataclasses import replace

    from trainsim.learn.evaluate import FamilyData, train_case
    from trainsim.learn.train import TrainConfig

    pred, _ = train_case(FamilyData(dataset, part="forward"), kind="gcn", fraction=0.5,
                         train_config=replace(TrainConfig(), epochs=1, patience=1))  # fmt: skip
    pred.save(tmp_path / "fwd")
    res = _run("predict", str(tmp_path / "fwd"), str(dataset), "--format", "json")
    assert res.exit_code == 0, res.output
    assert len(json.loads(res.stdout)["stages"]) == len(STAGES)
    old = tmp_path / "old"
    shutil.copytree(dataset, old)
    rows = [json.loads(x) for x in (old / "stages.jsonl").read_text().splitlines()]
    (old / "stages.jsonl").write_text("".join(json.dumps({k: v for k, v in d.items() if k != "graph_forward"}) + "\n"
                                              for d in rows))  # fmt: skip
    res = _run("predict", str(tmp_path / "fwd"), str(old))
    assert res.exit_code == 1 and f"stage {STAGES[0][0]}: no graph_forward" in str(res.exception), res.exception


def test_the_commands_answers_come_from_the_library(dataset, tmp_path):
    """`stages predict` and `stages search` render what trainsim.learn.predictions computes: the
    API gives the same documents without the CLI."""
    from pathlib import Path

    from trainsim.errors import ConfigError
    from trainsim.learn.predictions import predict_dataset, predict_stages, search_provider
    from trainsim.learn.provider import MeasuredStages, search_model
    from trainsim.learn.train import Predictor

    out = tmp_path / "pred"
    assert _run("train", str(dataset), "--out", str(out), "--model", "gcn", "--epochs", "1").exit_code == 0
    pred = Predictor.load(out)
    cli = json.loads(_run("predict", str(out), str(dataset), "--format", "json").stdout)
    assert predict_dataset(pred, out, dataset) == cli
    one = STAGES[4][1]
    cli = json.loads(_run("predict", str(out), "--stage", one.key(), "--format", "json").stdout)
    assert predict_stages(pred, out, [one]) == cli
    shipped = Path(__file__).resolve().parents[1] / "src/trainsim/learn/data/predtop/gpt-search"
    provider, provenance = search_provider(search_model("gpt"), measured=shipped)
    assert isinstance(provider, MeasuredStages) and provenance == f"measured stage latencies ({shipped})"
    with pytest.raises(ConfigError, match="holds gpt stages, not 'moe'"):
        search_provider(search_model("moe"), measured=shipped)
    with pytest.raises(ConfigError, match="give exactly one"):
        search_provider(search_model("gpt"))


def test_train_part_forward_from_the_cli(dataset, tmp_path):
    """`stages train --part forward`: a predictor of the stages' forward graphs, which the API
    alone could make (review finding); `stages predict` then reads the forward graphs."""
    out = tmp_path / "fwd-cli"
    res = _run("train", str(dataset), "--out", str(out), "--model", "gcn", "--epochs", "2", "--fraction", "0.5",
               "--part", "forward", "--format", "json")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["part"] == "forward"
    res = _run("predict", str(out), str(dataset), "--format", "json")
    assert res.exit_code == 0, res.output
    assert len(json.loads(res.stdout)["stages"]) == len(STAGES)
    res = _run("train", str(dataset), "--out", str(tmp_path / "bad"), "--part", "fwd")
    assert res.exit_code == 2 and "--part must be one of train, forward, got 'fwd'" in res.stderr
    assert not (tmp_path / "bad").exists()
