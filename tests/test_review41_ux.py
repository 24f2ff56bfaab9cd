"""Review 41, a new user trying the day's features (helper ux41): the 2025 model families with
predict and search, ``validate memory``, the impl-hf peak moment, the exit codes.

Each case below was a problem a user met:

* ``search`` on an 80-column terminal cut every figure to ``1…`` (the plan column, kept whole,
  took the width); ``validate memory``'s table cut the case names to ``llama…`` and the errors
  to ``0.00…``, and left out the predicted moment and the every-term baseline the suite is for;
* ``validate memory`` printed the profiler's ``USDT: ... profiler_start/stop`` notices, two a
  case, four a DDP case (``capture`` already keeps them off the terminal);
* its DDP ranks took Ctrl-C themselves (``Process SpawnProcess-2:`` under the interrupt line),
  and a suite killed outright left both ranks training and their folders in ``$TMPDIR``;
* ``validate --help`` said nothing of what ``--limit`` does for memory or ``--seed`` for predtop;
  ``predict --help`` said the memory model leaves out the optimizer's temporaries, which
  ``--impl hf`` now counts.
"""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_review35_interrupts import _CLI, _assert_session_gone, _kill_session, _procs
from tests.test_review40_ux import _commands

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _on_a_terminal(*args: str, columns: int = 80, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """``trainsim ARGS`` with stdout on a terminal ``columns`` wide (a pty): exit code, what the
    terminal showed (without colours) and stderr."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "trainsim", *args], stdout=slave, stderr=subprocess.PIPE,
                            env={**os.environ, **(env or {}), "COLUMNS": str(columns)})  # fmt: skip
    os.close(slave)
    shown = b""
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the command has closed the terminal
                break
            if not chunk:
                break
            shown += chunk
        err = proc.stderr.read().decode() if proc.stderr else ""
        return proc.wait(timeout=120), _ANSI.sub("", shown.decode()).replace("\r\n", "\n"), err
    finally:
        os.close(master)
        proc.kill()
        proc.wait()


def _rows(table: str, bar: str = "│") -> list[list[str]]:
    return [[c.strip() for c in line.split(bar)[1:-1]] for line in table.splitlines() if line.startswith(bar)]


def test_search_on_an_80_column_terminal_keeps_every_figure_whole():
    rc, shown, err = _on_a_terminal("search", "gpt2", "--gpus", "8", "--global-batch", "64", "--workers", "1")
    assert rc == 0, err
    rows = _rows(shown)
    assert rows and max(map(len, shown.splitlines())) <= 80
    assert "…" not in shown, shown
    firsts = [r for r in rows if r[0]]  # a plan's first line (a folded plan goes on below)
    assert len(firsts) == 10 and all(re.fullmatch(r"[\d,]+\.\d ms", r[2]) for r in firsts), shown
    assert all(re.fullmatch(r"\d+\.\d GiB", r[6]) for r in firsts), shown
    # the plan, folded, still reads whole: each plan's lines joined are a label `predict` takes
    plans, plan = [], ""
    for r in rows:
        if r[0] and plan:
            plans.append(plan)
            plan = ""
        plan += r[1]
    plans.append(plan)
    assert all(re.fullmatch(r"tp\d+-pp\d+-dp\d+(-[a-z0-9]+)*( [†‡])*", p) for p in plans), plans


@pytest.mark.slow
def test_validate_memory_on_an_80_column_terminal_reads_and_is_quiet(tmp_path):
    """One real case: its name, folded, joins whole; the figures, its predicted moment and the
    every-term baseline are there; stderr has none of the profiler's notices."""
    pytest.importorskip("transformers")
    rc, shown, err = _on_a_terminal("validate", "memory", "--limit", "1", env={"TMPDIR": str(tmp_path)})
    assert rc == 0, err
    assert "USDT" not in err and "profiler_start" not in err, err
    assert "…" not in shown and max(map(len, shown.splitlines())) <= 80, shown
    rows = _rows(shown)
    assert "".join(r[0] for r in rows) == "llama-d256-L2-V8192-b4-s256-adam", shown
    first = rows[0]
    assert re.fullmatch(r"\d+\.\d", first[1]) and re.fullmatch(r"\d+\.\d", first[2]), first
    assert re.fullmatch(r"[+-]\d+\.\d\d", first[3]) and re.fullmatch(r"[+-]\d+\.\d\d", first[5]), first
    assert " ".join(r[4] for r in rows).strip() == "loss backward", shown
    text = " ".join(shown.split())
    assert "predicted at loss backward: MAPE" in text and "(1 case)" in text
    assert "baseline, every term alive at once (the fused stacks' sum): MAPE" in text


def _memory_suite_cli(scratch: Path) -> subprocess.Popen[str]:
    """``trainsim validate memory --limit 1`` with the suite's first DDP case first, $TMPDIR ``scratch``."""
    patch = ("import trainsim.validate.memory_suite as ms\n"
             "ms.CASES = tuple(c for c in ms.CASES if c.world > 1)\n")  # fmt: skip
    return subprocess.Popen([sys.executable, "-c", patch + _CLI, "validate", "memory", "--limit", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "TMPDIR": str(scratch)})  # fmt: skip


def _spawned_ranks(sid: int, want: int = 2) -> list[int]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ranks = [pid for pid, (_, cmd) in _procs(sid).items() if "multiprocessing.spawn" in cmd]
        if len(ranks) >= want:
            return ranks
        time.sleep(0.2)
    raise AssertionError(f"the DDP ranks did not start: {_procs(sid)}")


def _ignores_sigint(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(re.search(r"^SigIgn:\s*([0-9a-f]+)$", status, re.M).group(1), 16)  # type: ignore[union-attr]
    return bool(mask & (1 << (signal.SIGINT - 1)))


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_ctrl_c_during_a_ddp_case_is_one_line_exit_130_and_leaves_nothing(tmp_path):
    pytest.importorskip("transformers")
    proc = _memory_suite_cli(tmp_path)
    try:
        ranks = _spawned_ranks(proc.pid)
        assert all(_ignores_sigint(pid) for pid in ranks), "the ranks take the terminal's Ctrl-C themselves"
        time.sleep(2.0)  # measuring
        os.killpg(proc.pid, signal.SIGINT)
        err = proc.communicate(timeout=60)[1]
        assert proc.returncode == 130, err
        assert err == "trainsim: interrupted\n", err
        _assert_session_gone(proc.pid, "interrupted")
        assert not list(tmp_path.iterdir()), list(tmp_path.iterdir())
    finally:
        _kill_session(proc)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_ddp_ranks_end_and_leave_nothing_when_the_suite_is_killed(tmp_path):
    pytest.importorskip("transformers")
    proc = _memory_suite_cli(tmp_path)
    try:
        _spawned_ranks(proc.pid)
        time.sleep(2.0)  # measuring
        proc.kill()
        proc.wait()
        _assert_session_gone(proc.pid, "killed")
        assert not list(tmp_path.iterdir()), list(tmp_path.iterdir())  # the ranks' folder and traces
    finally:
        _kill_session(proc)


def test_validate_option_helps_name_every_suite_that_takes_them():
    from trainsim.validate.registry import CLI_OPTIONS, SUITES

    [validate] = [cmd for path, cmd in _commands() if path == ("validate",)]
    helps = {p.name: p.help or "" for p in validate.params}
    taken = [(s.name, prm) for s in SUITES for prm in s.parameters() if prm in CLI_OPTIONS]
    assert len(taken) >= 20
    unsaid = [f"{name} --{prm}" for name, prm in taken
              if not re.search(rf"(^|[\s,;(]){re.escape(name)}\b", helps[prm])]  # fmt: skip
    assert unsaid == []


def test_predict_memory_headroom_help_says_impl_hf_counts_the_temporaries():
    [predict] = [cmd for path, cmd in _commands() if path == ("predict",)]
    [headroom] = [p for p in predict.params if "--memory-headroom" in getattr(p, "opts", ())]
    text = " ".join((headroom.help or "").split())
    assert "--impl hf counts them at the step's largest moment" in text, text
