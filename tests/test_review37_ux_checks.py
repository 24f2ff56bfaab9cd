"""A skeptical second look at the 2026-12-03 command-line review (tests/test_review36_ux.py):
the output pre-flight check looks at the path the writers take, leaves no scratch file on an
interrupt, says a folder that cannot be searched in one line; a failed fit leaves no folder it
made; ``--debug`` given twice is one; the search table's provenance line says what ``predict``
says of extrapolated answers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_review36_ux import DLRM, NO_FILES, QUICK, ROOT, _error, _run, needs_proc
from trainsim.errors import ConfigError


@needs_proc
def test_a_quoted_tilde_is_checked_where_it_is_written(tmp_path, monkeypatch):
    """The writers take '~/it.json' as given (a folder named '~' here); the check had looked in
    the home folder, passed, and the write failed after the simulation."""
    from trainsim.ir.serialize import writable_path

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(NO_FILES)
    with pytest.raises(ConfigError, match="cannot write there"):
        writable_path(Path("~/it.json"), "--timeline")
    res = _run("predict", "llama2-7b", "--timeline", "~/it.json")
    assert "--timeline ~/it.json: cannot write there" in _error(res)
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_probe_leaves_no_scratch_file(tmp_path, monkeypatch):
    """A Ctrl-C between the scratch file's creation and its removal left it behind."""
    from trainsim.ir.serialize import writable_path

    close = os.close

    def interrupted(fd: int) -> None:
        close(fd)
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "close", interrupted)
    with pytest.raises(KeyboardInterrupt):
        writable_path(tmp_path / "t.json", "--timeline")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="root and setpriv drop DAC caps")
@pytest.mark.parametrize("argv", [
    ["fit", str(QUICK), "--op", "gemm", "-o", "{locked}/x.npz"],
    ["fit-comm", str(DLRM), "-o", "{locked}/x.json"],
    ["predict", "llama2-7b", "--timeline", "{locked}/it.json"],
    ["analyze", str(DLRM), "--overhead-db", "{locked}/o.json"],
])  # fmt: skip
def test_an_output_under_a_folder_that_cannot_be_searched_is_one_line(tmp_path, argv):
    """stat of the path (Permission denied) was a traceback from pathlib's is_dir()/exists(). A
    real permission check: root without its DAC capabilities, a folder of another user's."""
    locked = tmp_path / "locked"
    locked.mkdir()
    os.chown(locked, 65534, 65534)
    locked.chmod(0o700)
    tmp_path.chmod(0o755)
    args = [a.format(locked=locked) for a in argv]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(["setpriv", "--inh-caps=-all", "--bounding-set=-all", sys.executable, "-m", "trainsim", *args],
                         check=False, capture_output=True, text=True, env=env, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip().splitlines()[-1].endswith(": cannot write there (Permission denied)"), out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("argv", [
    ["fit", str(QUICK), "--op", "nosuchop", "-o", "new/x.npz"],
    ["fit-comm", str(DLRM), "-o", "new/x.json"],
])  # fmt: skip
def test_a_failed_fit_leaves_no_folder_behind(tmp_path, monkeypatch, argv):
    """The output's folder was made before the fit (the check that it could be): a fit that
    failed, or was interrupted, left it behind empty. The writer makes it."""
    monkeypatch.chdir(tmp_path)
    _error(_run(*argv))
    assert list(tmp_path.iterdir()) == []


def test_debug_given_before_and_after_the_command_is_given_once():
    """``trainsim --debug predict X --debug`` was "No such option: --debug"."""
    from trainsim.cli.main import _debug_first

    argv = ["trainsim", "--debug", "predict", "x", "--debug", "--", "--debug"]
    assert _debug_first(argv) and argv == ["trainsim", "--debug", "predict", "x", "--", "--debug"]
    out = subprocess.run([sys.executable, "-m", "trainsim", "--debug", "predict", "nosuch-model", "--debug"],
                         check=False, capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 1 and "Traceback" in out.stderr and "unknown model 'nosuch-model'" in out.stderr


def test_search_provenance_line_says_answers_were_carried_beyond_the_measurements():
    """It said "calibrated (timed from measurements)" where predict, for the same plan, says
    "calibrated (from measurements, some carried beyond the measured sizes ...)"."""
    from trainsim.cli.predict_cmd import carried

    res = _run("search", "llama2-7b", "--gpus", "16", "--global-batch", "64", "--tp", "1,2", "--pp", "1",
               "--micro-batch", "1", "--zero", "0", "--recompute", "none", "--schedule", "1f1b", "--workers", "1",
               "--top-k", "2", "--simulate-top", "2", "--format", "json")  # fmt: skip
    import json

    plans = json.loads(res.stdout)["plans"]
    assert all(p["provenance"]["summary"] == "calibrated" for p in plans)
    assert any("beyond the measured sizes" in carried(p["provenance"]) for p in plans)
    res = _run("search", "llama2-7b", "--gpus", "16", "--global-batch", "64", "--tp", "1,2", "--pp", "1",
               "--micro-batch", "1", "--zero", "0", "--recompute", "none", "--schedule", "1f1b", "--workers", "1",
               "--top-k", "2", "--simulate-top", "2")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "every plan listed is calibrated (its operators and collectives timed from measurements, some carried " \
           "beyond the measured sizes)" in res.stderr
    res = _run("predict", "llama2-7b", "--gpus", "16", "--tp", str(plans[0]["plan_fields"]["tp"]), "--global-batch", "64",
               "--format", "json")  # fmt: skip
    assert "beyond the measured sizes" in carried(json.loads(res.stdout)["provenance"])  # predict's label says so
