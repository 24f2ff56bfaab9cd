"""A new user's review of the command line (2026-12-03): an output that cannot be written is
refused before the work it would hold (not after a fit or a simulation), a file in the way of
an output's folder is named, ``validate search`` reports the contract's error summary, and a
mistyped ``hw show`` name lists devices and systems with close matches."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_cli_review import _error, _run, _usage
from trainsim.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "src" / "trainsim" / "bench" / "data" / "cpu_quick_f97e94a9cbddf655.jsonl"
DLRM = ROOT / "examples" / "data" / "param_dlrm_8xv100"

# a folder that exists and takes no file, for root too: /proc (Linux)
NO_FILES = Path("/proc")
needs_proc = pytest.mark.skipif(not (NO_FILES / "self").is_dir(), reason="needs Linux /proc")




@needs_proc
def test_fit_refuses_an_unwritable_output_before_fitting():
    res = _run("fit", str(QUICK), "--op", "mm", "-o", str(NO_FILES / "x.npz"))
    assert f"--output {NO_FILES / 'x.npz'}: cannot write there" in _error(res)
    assert "held-out" not in res.output  # nothing was fitted


@needs_proc
def test_predict_and_analyze_refuse_unwritable_outputs_before_the_work():
    res = _run("predict", "llama2-7b", "--timeline", str(NO_FILES / "it.json"))
    assert f"--timeline {NO_FILES / 'it.json'}: cannot write there" in _error(res)
    res = _run("analyze", str(DLRM), "--overhead-db", str(NO_FILES / "o.json"))
    assert f"--overhead-db {NO_FILES / 'o.json'}: cannot write there" in _error(res)
    res = _run("analyze", str(DLRM), "--export-kernels", str(NO_FILES / "k.csv"))
    assert "cannot write there" in _error(res)


def test_a_file_in_the_way_of_an_outputs_folder_is_named(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    res = _run("predict", "llama2-7b", "--timeline", str(afile / "sub" / "it.json"))
    assert f"cannot create its folder: {afile} is a file, not a folder" in _error(res)
    res = _run("analyze", str(DLRM), "--save-workload", str(afile / "w.json"))
    assert f"{afile} is a file, not a folder" in _error(res)
    assert afile.read_text() == "x"


def test_writable_path_creates_nothing(tmp_path):
    from trainsim.ir.serialize import writable_path

    target = tmp_path / "new" / "deeper" / "t.json"
    writable_path(target, "--timeline")
    assert list(tmp_path.iterdir()) == []  # no folder made, no scratch file left


@needs_proc
def test_output_folder_refuses_a_folder_that_takes_no_file(tmp_path):
    from trainsim.ir.serialize import output_folder

    with pytest.raises(ConfigError, match="cannot write there"):
        output_folder(NO_FILES, "--out ")
    assert output_folder(tmp_path / "ok", "--out ").is_dir()
    assert list((tmp_path / "ok").iterdir()) == []  # the probe's scratch file is gone


def test_validate_search_summary_has_the_contracts_error_keys(tmp_path):
    """DESIGN.md: a suite's summary holds median_abs_err_pct, mape_pct and max_abs_err_pct."""
    from trainsim.builders.predict import predict_llm
    from trainsim.hardware import get_system
    from trainsim.validate.llm_cases import read_runs
    from trainsim.validate.search_suite import run_search_suite

    runs = tmp_path / "my_runs.csv"
    runs.write_text("model,system,gpus,tp,pp,micro_batch,global_batch,iteration_s\n"
                    "llama2-7b,dgx-a100,16,1,1,1,64,9.0\n"
                    "llama2-7b,dgx-a100,16,2,1,2,64,8.0\n")  # fmt: skip
    doc = run_search_suite(tmp_path, files=str(runs))
    s = doc["summary"]
    assert {"median_abs_err_pct", "mape_pct", "max_abs_err_pct"} <= set(s) and s["plans"] == 2
    (g,) = doc["cases"]
    for e, c in zip(g["plan_errors"], read_runs(runs), strict=True):
        predicted = predict_llm(c.model, c.plan, get_system(c.system)).iteration_time_s
        assert e["plan"] == c.plan.label()
        assert e["error_pct"] == pytest.approx(100 * (predicted - c.measured_s) / c.measured_s)
    assert s["max_abs_err_pct"] == pytest.approx(max(abs(e["error_pct"]) for e in g["plan_errors"]))


def test_unknown_hardware_names_get_close_matches_and_hw_show_lists_devices_too():
    msg = _error(_run("hw", "show", "a100x"))
    assert msg.startswith("unknown device or system 'a100x' (close matches: a100-sxm4-80gb")
    assert "devices: a100-sxm4-40gb" in msg and "systems: azure-nd-a100-v4" in msg
    msg = _error(_run("predict", "llama2-7b", "--system", "dgx-a1000"))
    assert msg.startswith("unknown system 'dgx-a1000' (close matches: dgx-a100")
    msg = _error(_run("shard", str(ROOT / "examples" / "dlrm_tables.json"), "--device", "a100-sxm4-80g"))
    assert msg.startswith("unknown device 'a100-sxm4-80g' (close matches: a100-sxm4-80gb")


@pytest.mark.parametrize("argv", [
    ["stages", "predict", "MISSING_PRED", "--stage", "family=gpt,layers=2"],
    ["stages", "search", "--predictor", "MISSING_PRED"],
])  # fmt: skip
def test_a_missing_predictor_is_refused_before_torch_loads(tmp_path, argv):
    """torch takes seconds to import (10-20 s on a busy machine) before the one-line error came."""
    code = ("import sys; from trainsim.cli.main import app_entry; sys.argv = ['trainsim', *sys.argv[1:]]\n"
            "try:\n    app_entry()\nexcept SystemExit as e:\n"
            "    print('exit', e.code, 'torch' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code, *argv], check=False, capture_output=True, text=True, cwd=tmp_path)
    assert "MISSING_PRED: no such folder; expected a predictor folder" in out.stderr
    assert out.stdout.split() == ["exit", "1", "False"]


@pytest.mark.parametrize(("extra", "message"), [
    (["--train-tokens", "1e12"], "--train-tokens counts for --objective time-to-train or cost, not time"),
    (["--objective", "time-to-train", "--train-tokens", "1e12", "--gpu-hour-price", "2"],
     "--gpu-hour-price counts for --objective cost only, not time-to-train"),
    (["--gpu-hour-price", "2"], "--gpu-hour-price counts for --objective cost only, not time (the default)"),
])  # fmt: skip
def test_search_numbers_its_objective_does_not_use_are_refused(extra, message):
    """They were dropped in silence: a user asking for time-to-train got the iteration-time ranking."""
    res = _run("search", "llama2-7b", "--gpus", "8", "--global-batch", "64", *extra)
    assert message in _usage(res)  # options that do not go together: a usage error


@pytest.mark.parametrize(("doc", "got"), [
    ('{"schema_version": 1, "per_op": {}}', "got schema_version 1)"),
    ("{}", "got no schema_version)"),
    ("[1]", "got a JSON list)"),
])  # fmt: skip
def test_a_foreign_overhead_database_says_what_was_expected_and_found(tmp_path, doc, got):
    """It read "not an overhead database (schema_version 1.1)": the version it wanted, as if the file's."""
    from trainsim.host.overheads import SCHEMA_VERSION, OverheadDB

    p = tmp_path / "db.json"
    p.write_text(doc)
    with pytest.raises(ConfigError) as e:
        OverheadDB.load(p)
    assert f"expected schema_version {SCHEMA_VERSION!r}, {got}" in str(e.value)
    assert "trainsim analyze --overhead-db" in str(e.value)


def test_a_device_file_given_as_a_system_or_the_reverse_says_so():
    """It read "field vendor: unknown field (a misspelling of tiers?) (also: ...)"."""
    data = ROOT / "src" / "trainsim" / "hardware" / "data"
    msg = _error(_run("predict", "llama2-7b", "--system", str(data / "device_a100_sxm4_80gb.yaml")))
    assert "device_a100_sxm4_80gb.yaml: a device file, not a system" in msg
    msg = _error(_run("shard", str(ROOT / "examples" / "dlrm_tables.json"), "--device", str(data / "system_dgx_a100.yaml")))
    assert "system_dgx_a100.yaml: a system file, not a device" in msg


def test_debug_after_the_command_shows_the_traceback():
    """``trainsim predict X --debug`` (added to a command that just failed) was "No such option"."""
    from trainsim.cli.main import _debug_first

    argv = ["trainsim", "predict", "x", "--debug", "--gpus", "8"]
    assert _debug_first(argv) and argv == ["trainsim", "--debug", "predict", "x", "--gpus", "8"]
    argv = ["trainsim", "x", "--", "--debug"]
    assert not _debug_first(argv) and argv == ["trainsim", "x", "--", "--debug"]
    out = subprocess.run([sys.executable, "-m", "trainsim", "predict", "nosuch-model", "--debug"],
                         check=False, capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 1 and "Traceback" in out.stderr and "unknown model 'nosuch-model'" in out.stderr


def test_search_table_states_the_provenance_of_calibrated_plans():
    """A table of calibrated plans said nothing of where its times came from (only a † on
    spec-based plans did)."""
    res = _run("search", "llama2-7b", "--gpus", "8", "--global-batch", "64", "--top-k", "2", "--workers", "1")
    assert res.exit_code == 0, res.output
    assert "provenance: every plan listed is calibrated" in res.stderr
    res = _run("search", "llama2-7b", "--system", "dgx-h200", "--gpus", "8", "--global-batch", "64", "--top-k", "2",
               "--workers", "1")  # fmt: skip
    assert res.exit_code == 0 and "† some operators or collectives" in res.stderr and "provenance: every" not in res.stderr


def test_validate_predtop_refuses_a_bad_fraction_before_training():
    """--fractions 0.3,1.5 trained the 0.3 predictors (minutes) before 1.5 failed."""
    res = _run("validate", "predtop", "--fractions", "1.5")
    assert "--fractions 1.5: each training fraction must be in (0, 0.9)" in _usage(res)
    assert "[predtop]" not in res.output  # no training started
