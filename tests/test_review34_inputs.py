"""Input-robustness review of 2026-12-02 (a fuzzing helper): damaged or odd inputs that gave a
wrong answer or a traceback now give one line naming the file and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainsim.errors import ConfigError
from trainsim.host.overheads import SCHEMA_VERSION, Overhead, OverheadDB

_STAT = {"mean_s": 1e-5, "median_s": 1e-5, "std_s": 1e-6, "count": 10, "raw_count": 12}


def _db(tmp_path: Path, **edit: object) -> Path:
    doc: dict[str, object] = {"schema_version": SCHEMA_VERSION, "unit": "s", "sources": [],
                              "global": {"T1": dict(_STAT)}, "per_op": {"aten::mm": {"T2": dict(_STAT)}}}  # fmt: skip
    doc.update(edit)
    p = tmp_path / "odb.json"
    p.write_text(json.dumps(doc), encoding="utf-8")
    return p


def test_an_overhead_database_is_checked_value_by_value(tmp_path):
    db = OverheadDB.load(_db(tmp_path))
    assert db.lookup("aten::mm", Overhead.T2) == 1e-5 and db.lookup("aten::add", Overhead.T1) == 1e-5
    cases = [
        ({"global": {"T1": {**_STAT, "mean_s": -1.0}}}, "global.T1.mean_s must be a non-negative number of seconds, got -1.0"),
        ({"global": {"T1": {**_STAT, "mean_s": float("nan")}}}, "global.T1.mean_s must be a non-negative number"),
        ({"per_op": {"aten::mm": {"T2": {**_STAT, "median_s": "x"}}}}, "per_op.aten::mm.T2.median_s must be a non-negative"),
        ({"per_op": []}, "per_op must be an object of overhead statistics, got a list"),
        ({"global": {"T9": dict(_STAT)}}, "global: unknown overhead 'T9'"),
        ({"global": {"T1": {**_STAT, "count": 2.5}}}, "global.T1.count must be a non-negative integer"),
        ({"unit": "ms"}, "unit 'ms'; an overhead database holds seconds"),
    ]
    for edit, said in cases:
        with pytest.raises(ConfigError) as e:
            OverheadDB.load(_db(tmp_path, **edit))
        assert said in str(e.value) and str(tmp_path / "odb.json") in str(e.value), (edit, str(e.value))


@pytest.mark.parametrize("value", [0, 2.7, float("inf"), "8", True])
def test_a_capture_manifest_batch_that_is_not_a_positive_integer_is_named(tmp_path, value):
    import shutil

    from typer.testing import CliRunner

    from trainsim.cli.main import _register, app

    trace = tmp_path / "run" / "linear_kineto.json.gz"
    trace.parent.mkdir()
    shutil.copy(Path(__file__).resolve().parents[2] / "shared/data/traces/param_linear_2080ti/linear_kineto.json.gz", trace)
    (tmp_path / "run" / "capture.json").write_text(json.dumps({"batch_size": value}), encoding="utf-8")
    _register()
    res = CliRunner().invoke(app, ["replay", str(trace), "--batch", "8"])
    assert res.exit_code == 1, res.output
    assert f"{tmp_path / 'run' / 'capture.json'}: batch_size must be a positive integer, got {value!r}" in str(res.exception)
    res = CliRunner().invoke(app, ["replay", str(trace), "--batch", "8", "--old-batch", "4"])
    assert "batch_size" not in str(res.exception)  # the traced batch given: the manifest's is not needed
