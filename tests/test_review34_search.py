"""Review 34: `trainsim search` in local processes and on Dask (interrupts, workers that differ,
leave or fail, a lost scheduler, chunking)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# 21,248 plans, ~14 s to screen on two cores: long enough to be interrupted anywhere
BIG = ["mixtral-8x22b", "--system", "dgx-h100", "--gpus", "1024", "--global-batch", "1024", "--seq-len", "8192",
       "--cp", "1,2,4", "--micro-batch", "1,2,4,8"]  # fmt: skip
TRAINSIM = [sys.executable, "-c", "from trainsim.cli.main import app_entry; app_entry()"]


def _session(sid: int) -> list[int]:
    """The live processes of session ``sid`` (zombies are gone for this purpose)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def _gone(sid: int, within_s: float) -> list[int]:
    deadline = time.monotonic() + within_s
    while (left := _session(sid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.slow
@pytest.mark.parametrize("after_s", [0.7, 1.5, 3.0])
def test_ctrl_c_of_a_local_search_is_one_line_and_exit_130(after_s):
    """Review finding: Ctrl-C (SIGINT to the whole process group) hung 7 times in 10, once for
    656 s, after tracebacks from the pool's thread, the forkserver or a starting worker."""
    proc = subprocess.Popen([*TRAINSIM, "search", *BIG, "--workers", "2"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        time.sleep(after_s)
        os.killpg(proc.pid, signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail("the interrupted search did not end within 20 s")
        assert proc.returncode == 130 and err == "trainsim: interrupted\n", err
        assert not _gone(proc.pid, 5), "screening processes outlived the search"
    finally:
        for pid in _session(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
