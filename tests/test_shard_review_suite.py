"""The ``shard`` suite's bookkeeping, without real ranks: row counts by origin across a resume,
noise that one repeat cannot measure, contended sets, and what Ctrl-C leaves behind.

``measure_assignments`` is replaced by a stand-in that returns synthetic measurements (one
repeat, chosen clean flags), so these tests check the suite's logic in seconds; the real
harness is covered by the slow tests of ``test_shard_suite.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainsim.bench import dlrm_shard
from trainsim.bench.dlrm_shard import ShardMeasurement, repeat_spread_pct
from trainsim.validate import shard_suite
from trainsim.validate.shard_suite import _case, _summary, read_rows

# --- the spread of repeat medians --------------------------------------------------------------


@pytest.mark.parametrize(
    ("medians", "steps", "clean", "expected"),
    [
        ([1.0], [3], [True] * 3, None),  # one repeat: nothing to compare
        ([1.0, 1.1], [2, 2], [True] * 4, 10 / 1.05),
        ([1.0, 1.5], [2, 2], [True, True, False, False], None),  # only one repeat is clean
        ([1.0, 1.5], [2, 2], [False] * 4, None),  # contended throughout: no clean spread
        ([1.0, 1.2, 1.1], [1, 1, 1], [], 0.2 / 1.1 * 100),  # older rows: no flags, all count
    ],
)
def test_repeat_spread_pct(medians, steps, clean, expected) -> None:
    got = repeat_spread_pct(medians, steps, clean)
    assert got == (None if expected is None else pytest.approx(expected))


def _measurement(
    name: str, median: float, *, clean: list[bool], repeats: int = 1
) -> ShardMeasurement:
    per = len(clean) // repeats
    return ShardMeasurement(name=name, assignment=[0], median_s=median, samples_s=[median] * len(clean),
                            repeat_medians_s=[median] * repeats, clean=clean, cpu_ratios=[1.0] * len(clean),
                            all_median_s=median, repeat_steps=[per] * repeats)  # fmt: skip


def test_one_repeat_has_no_spread() -> None:
    d = _measurement("a", 1.0, clean=[True] * 3).to_dict()
    assert d["spread_pct"] is None and d["clean_fraction"] == 1.0


# --- cases and summary from synthetic rows -----------------------------------------------------


class _Spec:
    tables = (1, 2, 3)
    batch = 64


_PREDS = {"x": {"predicted_step_s": 1.0, "assignment": [0, 1, 0]},
          "y": {"predicted_step_s": 2.0, "assignment": [1, 0, 0]}}  # fmt: skip


def _row(median: float, clean: list[bool], repeats: int = 1) -> dict[str, Any]:
    d = _measurement("r", median, clean=clean, repeats=repeats).to_dict()
    return {**d, "per_rank": []}


def test_one_repeat_noise_is_none_not_zero_and_nothing_crashes() -> None:
    rows = {"x": _row(1.05, [True] * 3), "y": _row(1.0, [True] * 3)}
    c = _case(0, _Spec(), _PREDS, rows, "note")
    assert c["status"] == "ok" and c["noise_pct"] is None and c["max_spread_pct"] is None
    assert all(e["spread_pct"] is None for e in c["sharders"])
    assert not c["contended"] and c["warnings"] == []
    s = _summary([c], ["x", "y"])
    assert s["median_noise_pct"] is None and s["max_noise_pct"] is None
    assert any("noise is not measured" in w for w in s["warnings"])


def test_old_rows_that_stored_zero_spread_for_one_repeat_read_as_none() -> None:
    rows = {
        "x": {**_row(1.05, [True] * 3), "spread_pct": 0.0},
        "y": {**_row(1.0, [True] * 3), "spread_pct": 0.0},
    }
    assert _case(0, _Spec(), _PREDS, rows, "note")["noise_pct"] is None


def test_two_clean_repeats_measure_noise() -> None:
    rows = {"x": _row(1.05, [True] * 4, repeats=2), "y": _row(1.0, [True] * 4, repeats=2)}
    rows["x"]["repeat_medians_s"] = [1.0, 1.1]
    c = _case(0, _Spec(), _PREDS, rows, "note")
    assert c["max_spread_pct"] == pytest.approx(10 / 1.05)
    s = _summary([c], ["x", "y"])
    assert s["max_noise_pct"] == pytest.approx(10 / 1.05)
    assert not any("noise" in w for w in s["warnings"])


def test_a_set_measured_on_preempted_cores_is_flagged() -> None:
    contended = {
        "x": _row(1.05, [False] * 3),
        "y": _row(1.0, [True] * 3),
    }  # x: every step preempted
    c0 = _case(0, _Spec(), _PREDS, contended, "note")
    assert c0["success"] and c0["contended"]  # still judged, but said to be contended
    assert (
        len(c0["warnings"]) == 1 and "set 0" in c0["warnings"][0] and "x 0 %" in c0["warnings"][0]
    )
    c1 = _case(
        1, _Spec(), _PREDS, {"x": _row(1.0, [True] * 3), "y": _row(1.1, [True, True, False])}, "n"
    )
    assert not c1["contended"] and c1["warnings"] == []  # 67 % clean: above the threshold
    s = _summary([c0, c1], ["x", "y"])
    assert s["sets_contended"] == 1
    assert s["sets_uncontended"] == 1 and s["success_rate_uncontended"] == float(c1["success"])
    assert "success_rate_uncontended" not in _summary(
        [c1], ["x", "y"]
    )  # said only when some set was contended
    assert any("1 of 2 sets" in w and "set 0" in w for w in s["warnings"])


def test_table_view_shows_dashes_and_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    from trainsim.cli.validate_cmd import _print_table

    c = _case(0, _Spec(), _PREDS, {"x": _row(1.05, [False] * 3), "y": _row(1.0, [True] * 3)}, "n")
    s = _summary([c], ["x", "y"])
    s.update(rows_measured_now=0, rows_from_file=2, rows_copied_identical=0, rows_reused=0)
    _print_table({"suite": "shard", "cases": [c], "summary": s})
    out = capsys.readouterr().out
    assert "noise_pct" in out and "contended" in out and "—" in out
    assert "warning: set 0: contended measurement" in out
    assert "rows_from_file 2" in out and "rows_copied_identical 0" in out
    assert "rows_reused" not in out  # the same count as rows_copied_identical: said once
    assert "noise is not measured" in out


# --- the suite with a stand-in measurement -------------------------------------------------------


@pytest.fixture
def fake_runs(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Tiny table sets, and a measurement that returns at once (one clean repeat per
    assignment); ``state["interrupt_at"]``: the call that raises KeyboardInterrupt."""
    from trainsim.builders.dlrm import DLRMSpec, TableSpec

    def table_set(index: int, *, seed: int, world: int, heavy: bool, batch: int, bottom_mlp: Any,
                  top_mlp: Any) -> DLRMSpec:  # fmt: skip
        tabs = tuple(TableSpec(f"t{i}", 500 + 700 * i + 100 * index, 8 * (1 + i % 2), 1.0 + i + index, None)
                     for i in range(3))  # fmt: skip
        return DLRMSpec(tabs, batch=64, bottom_mlp=(8,), top_mlp=(8, 1))

    state: dict[str, Any] = {"calls": 0, "interrupt_at": None}

    def measure(
        spec: Any, todo: dict[str, list[int]], *, world: int, run: Any
    ) -> dict[str, ShardMeasurement]:
        state["calls"] += 1
        if state["calls"] == state["interrupt_at"]:
            raise KeyboardInterrupt
        return {k: _measurement(k, 0.01 * (1 + sum(a)), clean=[True] * 2) for k, a in todo.items()}

    monkeypatch.setattr(shard_suite, "table_set", table_set)
    monkeypatch.setattr(dlrm_shard, "measure_assignments", measure)
    return state


def _run(path: Path, sets: int, **kw: Any) -> dict[str, Any]:
    return shard_suite.run_shard_suite(path.parent, sets=sets, repeats=1, steps=2, warmup=0, kernel_models=None,
                                       resume=str(path), backend="torch", **kw)  # fmt: skip


@pytest.mark.usefixtures("fake_runs")
def test_rows_are_counted_by_origin_across_a_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "shard.jsonl"
    first = _run(path, 2, progress=True)
    n = len(first["params"]["sharders"])
    s = first["summary"]
    assert (s["rows_measured_now"], s["rows_from_file"], s["rows_copied_identical"]) == (
        2 * n,
        0,
        0,
    )
    assert "noise —" in capsys.readouterr().err  # the progress line with no noise to report
    # the walkthrough: FILE holds sets 0 and 1, the run asks for 3
    s = _run(path, 3, progress=False)["summary"]
    assert (s["rows_measured_now"], s["rows_from_file"], s["rows_copied_identical"]) == (
        n,
        2 * n,
        0,
    )
    assert s["rows_reused"] == s["rows_copied_identical"]  # documented: the copies only
    assert s["median_noise_pct"] is None and any("--repeats 2" in w for w in s["warnings"])


@pytest.mark.usefixtures("fake_runs")
def test_identical_assignments_already_in_the_file_are_copied(tmp_path: Path) -> None:
    path = tmp_path / "shard.jsonl"
    _run(path, 1, sharders=["naive"], progress=False)
    doc = _run(path, 1, progress=False)
    s = doc["summary"]
    copies = [r for r in read_rows(path) if r["sharder"] != "naive" and r.get("same_as") == "naive"]
    assert s["rows_from_file"] == 1 and s["rows_copied_identical"] == len(copies)
    assert s["rows_measured_now"] + s["rows_from_file"] + s["rows_copied_identical"] == len(
        doc["params"]["sharders"]
    )


def test_ctrl_c_says_what_the_file_holds_and_reraises(fake_runs: dict[str, Any], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    path = tmp_path / "shard.jsonl"
    fake_runs["interrupt_at"] = 2  # set 1's measurement
    with pytest.raises(KeyboardInterrupt):
        _run(path, 3, progress=False)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert f"set 0 (1 of 3) complete in {path}" in err[0] and f"--resume {path}" in err[0]
    assert "set 1 starts over" in err[0]
    assert {r["set"] for r in read_rows(path)} == {0}  # set 1 left nothing behind
    assert all(json.loads(ln) for ln in path.read_text().splitlines())


@pytest.mark.usefixtures("fake_runs")
def test_rows_read_back_at_another_repeat_count_are_warned_of(tmp_path: Path) -> None:
    """A --repeats 1 run's rows were passed off as a --repeats 4 run's, params saying 4."""
    path = tmp_path / "shard.jsonl"
    _run(path, 1, progress=False)
    doc = shard_suite.run_shard_suite(path.parent, sets=1, repeats=4, steps=2, warmup=0, kernel_models=None,
                                      resume=str(path), backend="torch", progress=False)  # fmt: skip
    s = doc["summary"]
    assert s["rows_measured_now"] == 0
    assert any("measured with --repeats 1" in w and "not 4" in w for w in s["warnings"])
    again = _run(path, 1, progress=False)["summary"]  # the count they were measured at: no word
    assert not any("measured with --repeats" in w for w in again["warnings"])
