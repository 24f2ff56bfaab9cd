"""Review 39: the command line's output into pipes that close early, and options a mode ignored.

``trainsim ... | head -1`` ends the command quietly with exit 141 (128 + SIGPIPE, what a shell
reports for ``yes | head -1``) and nothing on stderr, for JSON, tables and typer's own help; a
failed write of the output itself (a full disk) and an EPIPE on a pipe that is not stdout or
stderr stay errors, one line, exit 1; a Ctrl-C still exits 130. ``replay --segments`` shows the
segments in table mode too. Real processes, real pipes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainsim.cli.main import EXIT_PIPE_CLOSED, _register, app

ROOT = Path(__file__).resolve().parents[1]
DLRM = ROOT / "examples" / "data" / "param_dlrm_8xv100"
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}
# the CLI with Python's own Ctrl-C handler, whatever this test runs under (as test_review35_interrupts)
_CLI = ("import signal, sys\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from trainsim.cli.main import app_entry\nsys.argv[0] = 'trainsim'\napp_entry()\n")  # fmt: skip


def _read_one_line_then_close(args: list[str], tmp_path: Path, *, stderr_too: bool = False) -> tuple[int, str]:
    """Run ``trainsim ARGS`` into a pipe, read its first line and close the pipe (as ``head -1``
    does); the exit status and what it wrote to stderr (a file, unless ``stderr_too``: the
    same pipe, as ``2>&1 | head -1``)."""
    err = tmp_path / "stderr"
    with err.open("w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "trainsim", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT if stderr_too else f, env=ENV)  # fmt: skip
        assert proc.stdout is not None
        assert proc.stdout.readline()
        proc.stdout.close()
        rc = proc.wait(timeout=120)
    return rc, err.read_text()


def _into_closed_pipe(args: list[str]) -> subprocess.CompletedProcess[bytes]:
    """Run ``trainsim ARGS`` with stdout a pipe whose reader closed before the command began
    (its first write fails, whatever the output's size)."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run([sys.executable, "-m", "trainsim", *args], stdout=w, stderr=subprocess.PIPE,
                              env=ENV, timeout=120, check=False)  # fmt: skip
    finally:
        os.close(w)


def test_json_into_a_pipe_closed_after_one_line_is_quiet_exit_141(tmp_path: Path) -> None:
    rc, err = _read_one_line_then_close(["validate", "llm", "--format", "json"], tmp_path)  # 1.6 MB of JSON
    assert (rc, err) == (EXIT_PIPE_CLOSED, "")


def test_a_table_into_a_pipe_closed_after_one_line_is_quiet_exit_141(tmp_path: Path) -> None:
    rc, err = _read_one_line_then_close(["replay", str(DLRM), "--segments"], tmp_path)  # 450 segment rows
    assert rc == EXIT_PIPE_CLOSED
    assert "Error" not in err and "Traceback" not in err and "BrokenPipe" not in err, err


def test_stdout_and_stderr_into_one_pipe_closed_early_is_quiet_exit_141(tmp_path: Path) -> None:
    rc, _ = _read_one_line_then_close(["validate", "llm"], tmp_path, stderr_too=True)
    assert rc == EXIT_PIPE_CLOSED


@pytest.mark.parametrize("args", [["models", "--format", "json"], ["models"], ["--help"], ["predict", "--help"]])
def test_any_output_into_a_closed_pipe_is_quiet_exit_141(args: list[str]) -> None:
    res = _into_closed_pipe(args)  # rich's tables and help: rich's own hook exited 1
    assert (res.returncode, res.stderr) == (EXIT_PIPE_CLOSED, b"")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("fmt", ["json", "table"])
def test_a_failed_write_of_the_output_is_one_line_exit_1(fmt: str) -> None:
    with Path("/dev/full").open("w") as full:
        res = subprocess.run([sys.executable, "-m", "trainsim", "models", "--format", fmt], stdout=full,
                             stderr=subprocess.PIPE, text=True, env=ENV, timeout=120, check=False)  # fmt: skip
    assert res.returncode == 1
    assert res.stderr == "trainsim: error: [Errno 28] No space left on device\n"


def test_an_epipe_on_a_pipe_that_is_not_stdout_is_an_error() -> None:
    # a real command on the real app writes to a pipe whose reader is gone (as a FIFO given for
    # a file would be): stdout and stderr are fine, so this is no reader leaving early
    script = (
        "import os, sys\nfrom trainsim.cli.main import app, app_entry\n"
        "@app.command('write-pipe')\ndef write_pipe() -> None:\n"
        "    r, w = os.pipe(); os.close(r); os.write(w, b'x')\n"
        "sys.argv = ['trainsim', 'write-pipe']\napp_entry()\n"
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV, timeout=120,
                         check=False)  # fmt: skip
    assert res.returncode == 1
    assert res.stderr == "trainsim: error: [Errno 32] Broken pipe\n"


def test_a_ctrl_c_of_a_command_writing_into_a_pipe_is_still_exit_130() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _CLI, "validate", "llm", "--format", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)  # fmt: skip
    time.sleep(2.0)  # validating: nothing written yet
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert err.strip().splitlines()[-1] == "trainsim: interrupted"


def test_replay_segments_show_in_the_table() -> None:
    _register()
    runner = CliRunner()
    doc = runner.invoke(app, ["replay", str(DLRM), "--segments", "--format", "json"])
    path = json.loads(doc.stdout)["critical_path"]["path"]
    res = runner.invoke(app, ["replay", str(DLRM), "--segments"])
    assert res.exit_code == 0, res.output
    assert f"Critical path: {len(path)} segments (ms)" in res.stdout
    table = res.stdout.split(f"Critical path: {len(path)} segments (ms)", 1)[1]
    rows = [line.split() for line in table.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == len(path)
    for row, seg, i in ((rows[0], path[0], 1), (rows[-1], path[-1], len(path))):
        ms = f"{seg['start_s'] * 1e3:.3f}", f"{seg['duration_s'] * 1e3:.3f}"
        assert row[:5] == [str(i), *ms, seg["kind"], str(seg["rank"])]
    plain = runner.invoke(app, ["replay", str(DLRM)])
    assert "Critical path:" not in plain.stdout  # without the flag, the eight longest only


def test_a_closed_stdout_is_one_line_exit_1() -> None:
    res = subprocess.run([sys.executable, "-m", "trainsim", "models", "--format", "json"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, env=ENV, timeout=120, check=False,
                         preexec_fn=lambda: os.close(1))  # fmt: skip  # as `trainsim ... >&-`
    assert res.returncode == 1
    assert res.stderr.startswith("trainsim: error: stdout is closed;"), res.stderr  # was an AttributeError traceback


def test_replay_table_states_the_critical_paths_unit() -> None:
    _register()
    res = CliRunner().invoke(app, ["replay", str(DLRM)])
    assert "critical path (ms): " in res.stdout  # the per-kind times were bare numbers
