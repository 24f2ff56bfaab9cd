"""Review 35: long-running commands interrupted (Ctrl-C, SIGKILL) and resumed.

Real runs, interrupted for real: a killed ``capture``/``validate shard`` must not leave its gloo
ranks measuring on; ``stages collect`` must end a Ctrl-C with its line and exit 130; the shard
suite keeps a set's rows all or none.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from trainsim.validate import shard_suite
from trainsim.validate.shard_suite import read_rows

# the CLI with Python's own Ctrl-C handler, whatever this test runs under (a background job,
# as CI's, starts with SIGINT ignored)
_CLI = ("import signal, sys\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from trainsim.cli.main import app_entry\nsys.argv[0] = 'trainsim'\napp_entry()\n")  # fmt: skip


def _procs(sid: int) -> dict[int, tuple[int, str]]:
    """Live processes of session ``sid``: pid -> (parent pid, command line)."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
            cmd = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            out[int(stat.parent.name)] = (int(fields[1]), cmd)
    return out


def _assert_session_gone(sid: int, what: str) -> None:
    """Every process of session ``sid`` ends within 10 s (the command was ``what``)."""
    deadline = time.monotonic() + 10
    while _procs(sid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _procs(sid), f"processes outlived the {what} command: {_procs(sid)}"


def _kill_session(proc: subprocess.Popen[str]) -> None:
    """Leave nothing of a test's command behind, whatever the test found."""
    for pid in _procs(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def _ranks(sid: int) -> list[int]:
    """The processes the session's forkserver forked (the ranks)."""
    procs = _procs(sid)
    servers = {pid for pid, (_, cmd) in procs.items() if "multiprocessing.forkserver" in cmd}
    return [pid for pid, (ppid, _) in procs.items() if ppid in servers]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["capture", "shard"])
def test_ranks_end_when_the_command_is_killed(command: str, tmp_path: Path) -> None:
    """Review finding: SIGKILL of `trainsim capture --nproc 2` or `trainsim validate shard` left
    its ranks (the forkserver's children, not the command's) running: the shard ranks measured
    the rest of their set on the cores a rerun measures on, a capture rank waited for its peer
    in init_process_group until the 600 s timeout; and their scratch folder stayed in $TMPDIR."""
    pytest.importorskip("torch")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    args = (["capture", "--model", "gpt2", "--nproc", "2", "--steps", "300", "--out", str(tmp_path / "cap")]
            if command == "capture" else
            ["validate", "shard", "--sets", "1", "--repeats", "1", "--resume", str(tmp_path / "shard.jsonl")])  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", _CLI, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env={**os.environ, "TMPDIR": str(scratch)})  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(_ranks(proc.pid)) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert len(_ranks(proc.pid)) == 2, "the ranks did not start"
        time.sleep(1.0)  # inside init_process_group or measuring
        proc.kill()
        proc.wait()
        _assert_session_gone(proc.pid, "killed")
        assert not list(scratch.glob("trainsim-*")), "a rank's scratch folder was left behind"
    finally:
        _kill_session(proc)


@pytest.mark.slow
@pytest.mark.parametrize(("command", "after_s"), [("capture", 0.3), ("capture", 1.0), ("shard", 0.3), ("shard", 0.7)])
def test_ctrl_c_while_the_ranks_start_is_one_line(command: str, after_s: float, tmp_path: Path) -> None:
    """Review finding: a Ctrl-C (to the whole process group, as a terminal sends it) while the
    forkserver still imported torch printed the server's KeyboardInterrupt traceback under the
    command's own line; and a rank the server forked after the command had given up printed a
    FileNotFoundError traceback for its removed scratch folder."""
    pytest.importorskip("torch")
    args, started = ((["capture", "--model", "gpt2", "--nproc", "2", "--steps", "30", "--out", str(tmp_path / "cap")],
                      "capturing ") if command == "capture" else
                     (["validate", "shard", "--sets", "1", "--repeats", "1", "--resume", str(tmp_path / "s.jsonl")],
                      "measuring "))  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", _CLI, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    lines = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if started in line:
                break
        time.sleep(after_s)
        os.killpg(proc.pid, signal.SIGINT)
        # until every writer of the pipe is gone: the forkserver's and the ranks' words too
        rest = proc.communicate(timeout=60)[1]
        err = "".join(lines) + rest
        assert proc.returncode == 130, err
        assert "Traceback" not in err and err.strip().splitlines()[-1] == "trainsim: interrupted", err
        _assert_session_gone(proc.pid, "interrupted")
    finally:
        _kill_session(proc)


@pytest.mark.slow
@pytest.mark.parametrize("after_s", [0.2, 0.7])
def test_ctrl_c_of_stages_collect_is_its_line_and_exit_130(after_s: float, tmp_path: Path) -> None:
    """Review finding: Ctrl-C of `trainsim stages collect` printed its line, then the process died
    of SIGSEGV (exit -11, 4 times in 4): the next stage's XLA compile, cut short, went on in
    jax's thread pool while the interpreter shut down. A rerun keeps the rows and goes on."""
    pytest.importorskip("jax")
    folder = tmp_path / "stages"
    proc = subprocess.Popen([sys.executable, "-c", _CLI, "stages", "collect", str(folder), "--family", "gpt",
                             "--count", "40"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    lines = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the first stage measured: the next one is compiling
            lines.append(line)
            if line.startswith("[1/"):
                break
        time.sleep(after_s)
        os.kill(proc.pid, signal.SIGINT)
        rest = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    err = "".join(lines) + rest
    assert proc.returncode == 130, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("trainsim: interrupted: ") and "run the same command again to resume" in last, err
    assert "Fatal Python error" not in err and "Traceback" not in err
    kept = [json.loads(x)["id"] for x in (folder / "stages.jsonl").read_text().splitlines()]
    assert f"{len(kept)} stages in {folder} are kept" in last and kept


# a real Ctrl-C as numpy's import starts (its first module), from wherever it is imported
_CTRL_C_IN_NUMPYS_IMPORT = ("import os, signal, sys\n"
    "class CtrlC:\n"
    "    sent = False\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name == 'numpy' and not CtrlC.sent:\n"
    "            CtrlC.sent = True\n"
    "            print('ctrl-c in numpy import', 'under torch' * ('torch' in sys.modules), file=sys.stderr, flush=True)\n"
    "            os.kill(os.getpid(), signal.SIGINT)\n"
    "sys.meta_path.insert(0, CtrlC())\n")  # fmt: skip


def _interrupted_in_numpys_import(code: str, *args: str) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-c", _CTRL_C_IN_NUMPYS_IMPORT + code, *args], check=False,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=300)  # fmt: skip
    assert "ctrl-c in numpy import" in proc.stderr, proc.stderr  # the Ctrl-C came
    return proc.returncode, proc.stderr


def test_a_ctrl_c_while_torch_imports_numpy_is_the_interrupt_line():
    """Review finding: torch's C initialisation imports numpy itself and swallows what that import
    raises ("Failed to initialize NumPy"): a Ctrl-C in it was lost, and the command ran on to exit
    0 (or failed later on the half-imported numpy). The CLI now imports numpy first, in Python,
    whichever command first imports torch: here one whose first step is ``import torch``."""
    pytest.importorskip("torch")
    command = ("import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
               "from trainsim.cli import main\nmain._register = lambda: __import__('torch')\n"
               "sys.argv[1:] = ['--help']\nmain.app_entry()\n")  # fmt: skip
    rc, err = _interrupted_in_numpys_import(command)
    assert (rc, err.splitlines()[-1]) == (130, "trainsim: interrupted"), err
    assert "Failed to initialize NumPy" not in err and "Traceback" not in err


@pytest.mark.parametrize("args", [
    ["capture", "--model", "gpt2", "--steps", "1"],
    ["validate", "shard", "--sets", "1", "--repeats", "1"],
    ["validate", "predtop"],
    ["bench", "gemm", "--quick"],
    ["stages", "train", "DATASET", "--epochs", "1"],
], ids=lambda args: " ".join(args[:2]))  # fmt: skip
def test_a_ctrl_c_as_a_torch_command_imports_numpy_is_the_interrupt_line(args: list[str], tmp_path: Path) -> None:
    """Every command that imports torch, interrupted as numpy's import starts (by torch's C
    initialisation, where the command did not import numpy before: capture did not)."""
    pytest.importorskip("torch")
    out = {"capture": ["--out", str(tmp_path / "cap")], "validate": ["--resume", str(tmp_path / "s.jsonl")],
           "bench": ["--dataset", str(tmp_path / "b.jsonl")], "stages": ["--out", str(tmp_path / "pred")]}  # fmt: skip
    args = [str(tmp_path / "ds") if a == "DATASET" else a for a in args] + (out[args[0]] if args[1] != "predtop" else [])
    rc, err = _interrupted_in_numpys_import(_CLI, *args)
    assert (rc, err.strip().splitlines()[-1]) == (130, "trainsim: interrupted"), err
    assert "Failed to initialize NumPy" not in err and "Traceback" not in err


# --- the shard suite: a set's rows are written together -------------------------------------------


@pytest.fixture
def tiny_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny table sets instead of 000-sized ones (measured for real on 2 gloo ranks)."""
    from trainsim.builders.dlrm import DLRMSpec, TableSpec

    def table_set(index: int, *, seed: int, world: int, heavy: bool, batch: int, bottom_mlp: Any,
                  top_mlp: Any) -> DLRMSpec:  # fmt: skip
        tabs = tuple(TableSpec(f"t{i}", 500 + 700 * i + 100 * index, 8 * (1 + i % 2), 1.0 + i + index, None)
                     for i in range(3))  # fmt: skip
        return DLRMSpec(tabs, batch=64, bottom_mlp=(8,), top_mlp=(8, 1))

    monkeypatch.setattr(shard_suite, "table_set", table_set)


def _suite(path: Path) -> dict[str, Any]:
    pytest.importorskip("torch")
    from trainsim.bench.dlrm_shard import backend_available

    return shard_suite.run_shard_suite(path.parent, sets=1, repeats=1, steps=2, warmup=0, kernel_models=None,
                                       resume=str(path), backend=backend_available(), progress=False)  # fmt: skip


def _measured(doc: dict[str, Any]) -> int:
    return int(doc["summary"]["rows_measured_now"])


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_sets")
def test_a_ctrl_c_while_a_set_is_written_keeps_all_its_rows_or_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review finding: a set's rows were appended one by one (a write and an fsync each); a
    Ctrl-C between two kept some of them, and the resume measured the rest alone, outside the
    interleaved repeats that make a set's sharders comparable. The interrupt is raised here in
    the first fsync of the results file (where a Ctrl-C's handler would run); the measurement
    before it is real."""
    path = tmp_path / "shard.jsonl"
    calls = {"n": 0}
    real = os.fsync

    def interrupted_fsync(fd: int) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt
        real(fd)

    monkeypatch.setattr(os, "fsync", interrupted_fsync)
    with pytest.raises(KeyboardInterrupt):
        _suite(path)
    monkeypatch.setattr(os, "fsync", real)
    assert calls["n"] == 1
    kept = read_rows(path)
    again = _suite(path)
    # every sharder's row of the set was kept: the resume measures nothing, reads them all back
    assert kept and _measured(again) == 0, f"{len(kept)} rows kept, {_measured(again)} measured again"
    assert again["summary"]["rows_from_file"] == len(kept) and again["cases"][0]["status"] == "ok"
    assert len(read_rows(path)) == len(kept)


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_sets")
def test_a_set_whose_write_was_cut_short_is_measured_again_whole(tmp_path: Path) -> None:
    """A process killed inside the set's write (a short write) leaves some of its rows: they
    are not taken as measured; the resume measures every assignment of the set together."""
    path = tmp_path / "shard.jsonl"
    first = _suite(path)
    n = _measured(first)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    assert n >= 2 and len(lines) >= n
    path.write_text("".join(lines[:1]) + lines[1][:40], encoding="utf-8")  # 1 row and a torn one
    assert read_rows(path) == []  # the set's write is not whole: none of it counts
    again = _suite(path)
    assert _measured(again) == n  # all of the set's measured rows, together
    rows = read_rows(path)
    assert len({r["write_id"] for r in rows}) == 1 and len(rows) == len(lines)
    assert all(r["batch"] == 64 for r in rows)  # the set's batch size, beside its write's id
    assert again["cases"][0]["status"] == "ok"


def test_an_edited_write_field_reads_as_a_damaged_write_not_an_error(tmp_path: Path) -> None:
    """read_rows is never fatal: a write_id or write_rows edited into another type had raised
    (int("x") / an unhashable id); such a row now reads as part of a damaged write."""
    from trainsim.validate.shard_suite import SCHEMA

    path = tmp_path / "shard.jsonl"
    base = {"schema": SCHEMA, "sharder": "table_wise"}
    rows = [{**base, "write_id": "w1", "write_rows": 2}, {**base, "write_id": "w1", "write_rows": 2},
            {**base, "write_id": "w2", "write_rows": "x"}, {**base, "write_id": ["w3"], "write_rows": 1},
            {**base, "write_id": None, "write_rows": None}]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    got = read_rows(path)
    assert [r["write_id"] for r in got] == ["w1", "w1", None]
