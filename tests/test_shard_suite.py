"""The ``shard`` suite: the sharded-DLRM harness on 2 gloo ranks, resumable results, result shape.

The end-to-end tests (marked slow: they start 2 ranks) use tiny table sets (3 tables of a few
thousand rows, batch 64, 2 timed steps): they check plumbing and bookkeeping, not accuracy.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainsim.errors import ConfigError
from trainsim.validate import shard_suite
from trainsim.validate.registry import get_suite
from trainsim.validate.shard_suite import SCHEMA, _case, _summary, read_rows, spearman

TINY = {
    "tables": [
        {"name": "a", "rows": 4000, "dim": 8, "pooling": 4.0, "reuse": "dlrm2022"},
        {"name": "b", "rows": 300, "dim": 16, "pooling": 2.5, "reuse": None},  # folded / uniform
        {"name": "c", "rows": 2000, "dim": 8, "pooling": 1.0, "reuse": (0.5, 0.3, 0.2)},
    ],
    "batch": 64,
    "bottom_mlp": [16, 8],
    "top_mlp": [8, 1],
}


def _backend() -> str:
    pytest.importorskip("torch")
    from trainsim.bench.dlrm_shard import backend_available

    return backend_available()


# --- fast: pure logic ------------------------------------------------------------------------------


def test_registered() -> None:
    spec = get_suite("shard")
    assert spec.load() is shard_suite.run_shard_suite
    assert {"sets", "seed", "repeats", "resume", "limit"} <= set(spec.parameters())


def test_spearman() -> None:
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 1], [1, 2, 3]) is None
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(3 / 10**0.5)  # ties: mean ranks


def test_spec_payload_and_validation() -> None:
    from trainsim.bench.dlrm_shard import measure_assignments, spec_payload

    p = spec_payload(TINY)
    assert [t["reuse"] is None for t in p["tables"]] == [False, True, False]
    bins = p["tables"][2]["reuse"][1]
    assert [b[:2] for b in bins] == [[0, 1], [1, 2], [2, 4]]
    assert sum(b[2] for b in bins) == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="rank < 2"):
        measure_assignments(TINY, {"bad": [0, 1, 2]})
    with pytest.raises(ConfigError, match="3 tables"):
        measure_assignments(TINY, {"short": [0, 1]})


def test_index_batches_follow_the_tables() -> None:
    pytest.importorskip("torch")
    from trainsim.bench.dlrm_shard import _index_batches, spec_payload

    p = spec_payload(TINY)
    batches, folded = _index_batches(p, [0, 1, 2], 2, seed=0)
    for t, tab in enumerate(p["tables"]):
        for idx, offsets in batches[t]:
            n = round(64 * tab["pooling"])
            assert idx.numel() == n and int(offsets[-1]) == n and offsets.numel() == 65
            assert int(idx.min()) >= 0 and int(idx.max()) < tab["rows"]
    assert folded == []  # 'b' is uniform; 'a' and 'c' have room for their unique rows
    small = {**TINY, "tables": [{**TINY["tables"][0], "rows": 10}]}
    _, folded = _index_batches(spec_payload(small), [0], 1, seed=0)
    assert folded == ["a"]


def _row(sharder: str, median: float, reps: list[float]) -> dict:
    return {"median_s": median, "repeat_medians_s": reps, "spread_pct": 1.0, "per_rank": []}


def test_case_criterion() -> None:
    class Spec:
        tables = (1, 2, 3)
        batch = 64

    preds = {"x": {"predicted_step_s": 1.0, "assignment": [0, 1, 0]},
             "y": {"predicted_step_s": 2.0, "assignment": [1, 0, 0]},
             "z": {"predicted_step_s": None, "assignment": None, "error": "cap"}}  # fmt: skip
    rows = {"x": _row("x", 1.05, [1.05, 1.2]), "y": _row("y", 1.0, [1.0, 1.0])}
    c = _case(0, Spec(), preds, rows, "note")
    assert (c["predicted"], c["fastest"], c["success"]) == ("x", "y", True)
    assert c["regret_pct"] == pytest.approx(5.0)
    assert c["success_per_repeat"] == 0.5  # repeat 2: 1.2 vs 1.0, 20 % off
    assert [s["sharder"] for s in c["sharders"]] == ["x", "y", "z"]
    s = _summary([c], ["x", "y", "z"])
    assert s["success_rate"] == 1.0 and s["predictions"] == 2
    assert s["fixed_sharder_success_rate"] == {"x": 1.0, "y": 1.0}
    for k in (
        "median_abs_err_pct",
        "mape_pct",
        "max_abs_err_pct",
        "median_spearman",
        "mean_regret_pct",
    ):
        assert k in s


def test_read_rows_skips_torn_and_foreign_lines(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl"
    good = json.dumps({"schema": SCHEMA, "sharder": "naive"})
    p.write_text(good + "\n" + json.dumps({"schema": "other"}) + "\n" + good[:10], encoding="utf-8")
    assert [r["sharder"] for r in read_rows(p)] == ["naive"]
    assert read_rows(tmp_path / "missing.jsonl") == []


# --- slow: 2 gloo ranks ----------------------------------------------------------------------------


@pytest.mark.slow
def test_harness_two_ranks() -> None:
    backend = _backend()
    from trainsim.bench.dlrm_shard import ShardRun, measure_assignments

    run = ShardRun(steps=2, warmup=1, repeats=2, threads=1, backend=backend)
    res = measure_assignments(TINY, {"split": [0, 1, 0], "one": [1, 1, 1]}, run=run)
    assert set(res) == {"split", "one"}
    for m in res.values():
        # 2 clean steps per repeat, or up to 3 x 2 steps when other jobs take a core
        assert 4 <= len(m.samples_s) <= 12 and len(m.repeat_medians_s) == 2
        assert len(m.clean) == len(m.cpu_ratios) == len(m.samples_s) == sum(m.repeat_steps)
        assert all(0 < r < 1.5 for r in m.cpu_ratios)
        assert m.median_s > 0 and all(s > 0 for s in m.samples_s)
        assert [r["rank"] for r in m.per_rank] == [0, 1] and m.backend == backend
        assert m.per_rank[0]["total"] > 0 and "emb_fwd" in m.per_rank[0]
    assert [r["tables"] for r in res["one"].per_rank] == [0, 3]  # a rank without tables works


@pytest.fixture
def tiny_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two tiny table sets instead of 000-sized ones."""
    from trainsim.builders.dlrm import DLRMSpec, TableSpec

    def table_set(
        index: int, *, seed: int, world: int, heavy: bool, batch: int, bottom_mlp, top_mlp
    ):
        tabs = tuple(TableSpec(f"t{i}", 500 + 700 * i + 100 * index, 8 * (1 + i % 2), 1.0 + i + index, None)
                     for i in range(3))  # fmt: skip
        return DLRMSpec(tabs, batch=64, bottom_mlp=(8,), top_mlp=(8, 1))

    monkeypatch.setattr(shard_suite, "table_set", table_set)


def _suite(path: Path, backend: str, sets: int = 2) -> dict:
    return shard_suite.run_shard_suite(path.parent, sets=sets, repeats=2, steps=2, warmup=1,
                                       kernel_models=None, resume=str(path), backend=backend,
                                       progress=False)  # fmt: skip


def _keys(path: Path) -> list[tuple[str, str]]:
    return [(r["set_key"], r["sharder"]) for r in read_rows(path)]


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_sets")
def test_suite_writes_resumes_and_never_duplicates(tmp_path: Path) -> None:
    backend = _backend()
    path = tmp_path / "shard.jsonl"
    doc = _suite(path, backend)
    n_sharders = len(doc["params"]["sharders"])
    keys = _keys(path)
    assert len(keys) == 2 * n_sharders == len(set(keys))
    # shape
    assert doc["suite"] == "shard" and len(doc["cases"]) == 2
    for c in doc["cases"]:
        assert c["status"] == "ok" and c["predicted"] in doc["params"]["sharders"]
        assert isinstance(c["success"], bool) and c["regret_pct"] >= 0
        assert len(c["sharders"]) == n_sharders
        assert all(e["err_pct"] is not None for e in c["sharders"])
    s = doc["summary"]
    assert 0 <= s["success_rate"] <= 1 and s["predictions"] == 2 * n_sharders
    assert s["rows_measured_now"] + s["rows_reused"] == 2 * n_sharders
    assert {"median_abs_err_pct", "mape_pct", "max_abs_err_pct", "median_spearman"} <= set(s)

    # a rerun measures nothing and appends nothing
    before = path.read_bytes()
    again = _suite(path, backend)
    assert again["summary"]["rows_measured_now"] == again["summary"]["rows_reused"] == 0
    assert path.read_bytes() == before
    assert [c["regret_pct"] for c in again["cases"]] == [c["regret_pct"] for c in doc["cases"]]

    # a sweep killed mid-way: the first set's rows and a torn line survive; set 1 is re-measured
    lines = before.decode().splitlines(keepends=True)
    first = [ln for ln in lines if json.loads(ln)["set"] == 0]
    path.write_text("".join(first) + lines[-1][:25], encoding="utf-8")
    resumed = _suite(path, backend)
    assert resumed["summary"]["rows_measured_now"] + resumed["summary"]["rows_reused"] == n_sharders
    keys = _keys(path)
    assert len(keys) == 2 * n_sharders == len(set(keys))
    assert path.read_bytes().endswith(b"\n")


@pytest.mark.usefixtures("tiny_sets")
def test_suite_without_measuring_reports_incomplete(tmp_path: Path) -> None:
    doc = shard_suite.run_shard_suite(tmp_path, sets=1, kernel_models=None, measure=False,
                                      resume=str(tmp_path / "none.jsonl"), progress=False,
                                      backend=_backend())  # fmt: skip
    assert doc["cases"][0]["status"] == "incomplete"
    assert doc["summary"]["sets_ok"] == 0
    with pytest.raises(ConfigError, match="unknown sharder"):
        shard_suite.run_shard_suite(tmp_path, sharders=["nope"], progress=False)


def test_the_hosts_own_calibration_sample_is_used_when_it_ships(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainsim.bench import comm

    for cpu, (sample, extra) in shard_suite.CPU_SAMPLES.items():
        monkeypatch.setattr(comm, "_cpu_model", lambda cpu=cpu: cpu)
        assert shard_suite.cpu_sample() == (sample, extra, True)
        assert shard_suite.cpu_device_file().name == f"{sample}.device.yaml"
        assert shard_suite.cpu_device_file().is_file()  # every listed sample ships its device
        rows = next(shard_suite._BENCH_DATA.glob(f"{sample}.jsonl*"))
        assert rows.is_file() and next(shard_suite._BENCH_DATA.glob(f"{extra}.jsonl*")).is_file()
    monkeypatch.setattr(comm, "_cpu_model", lambda: "Some Other CPU")
    assert shard_suite.cpu_sample() == (shard_suite.CPU_SAMPLE, shard_suite.CPU_EXTRA, False)
