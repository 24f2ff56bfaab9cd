"""trainsim.lifetime: a child ends with the process that started it, not with its pid number."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# The child: holds the pid it reads on stdin as its parent, removes a folder and exits 7 once
# that process has ended; "fallback" hides os.pidfd_open (the polling path of other systems).
_CHILD = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    if sys.argv[1] == "fallback":
        del os.pidfd_open
    from trainsim.lifetime import exit_with_parent
    print("started", flush=True)
    pid = int(sys.stdin.readline())
    exit_with_parent(pid, Path(sys.argv[2]), period_s=0.05, status=7)
    print("watching", flush=True)
    time.sleep(60)
    """
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="zombies and /proc as Linux has them")
PATHS = ["pidfd", "fallback"]


def _child(path: str, scratch) -> subprocess.Popen[str]:
    child = subprocess.Popen([sys.executable, "-c", _CHILD, path, str(scratch)], text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    assert child.stdout.readline() == "started\n"  # well after its start time (in 10 ms ticks)
    return child


def _ends(child: subprocess.Popen[str]) -> int:
    try:
        return child.wait(timeout=20)
    finally:
        child.kill()


@pytest.mark.parametrize("path", PATHS)
def test_a_child_ends_when_its_parent_has_exited_though_its_pid_lingers(path, tmp_path):
    """The parent exits and is not reaped yet: a zombie still holds its pid, which os.kill(pid, 0)
    found alive, as it would find a new process given the same pid."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    parent = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    child = _child(path, scratch)
    try:
        child.stdin.write(f"{parent.pid}\n")
        child.stdin.flush()
        assert child.stdout.readline() == "watching\n"
        parent.stdin.close()  # the parent exits; not waited for, it stays a zombie
        assert _ends(child) == 7
        assert not scratch.exists()
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.parametrize("path", PATHS)
def test_a_pid_given_to_a_process_younger_than_the_child_is_not_its_parent(path, tmp_path):
    """A parent that died before the child first looked, its pid already another process's."""
    child = _child(path, tmp_path)
    younger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        child.stdin.write(f"{younger.pid}\n")
        child.stdin.flush()
        assert _ends(child) == 7
        assert younger.poll() is None  # it was alive all along
    finally:
        younger.kill()
        younger.wait()


@pytest.mark.parametrize("path", PATHS)
def test_a_child_lives_while_its_parent_does(path, tmp_path):
    """The test process, older than the child, is its parent: the child keeps watching."""
    child = _child(path, tmp_path)
    try:
        child.stdin.write(f"{__import__('os').getpid()}\n")
        child.stdin.flush()
        assert child.stdout.readline() == "watching\n"
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=1.0)
        assert tmp_path.exists()
    finally:
        child.kill()
        child.wait()


def test_processes_started_with_the_main_module_hidden_do_not_run_it_again():
    """multiprocessing gives each process it starts the main module to run again
    (init_main_from_name / init_main_from_path); inside the block it gives none, and the
    module's __spec__ and __file__ are as they were afterwards, absent ones absent."""
    import sys
    import types
    from multiprocessing import spawn

    from trainsim.lifetime import main_module_hidden

    real = sys.modules["__main__"]
    fake = types.ModuleType("__main__")
    fake.__file__ = "/tmp/a_user_script.py"
    fake.__spec__ = None
    sys.modules["__main__"] = fake
    try:
        assert spawn.get_preparation_data("x")["init_main_from_path"].endswith("a_user_script.py")
        with main_module_hidden():
            data = spawn.get_preparation_data("x")
            assert "init_main_from_path" not in data and "init_main_from_name" not in data
        assert fake.__file__ == "/tmp/a_user_script.py" and fake.__spec__ is None
        del fake.__file__
        with main_module_hidden():
            pass
        assert not hasattr(fake, "__file__")
    finally:
        sys.modules["__main__"] = real


@pytest.mark.parametrize("where", ["capture", "search"])
def test_a_ctrl_c_while_the_forkserver_starts_is_held_not_lost(monkeypatch, where):
    """The forkserver is started with SIGINT ignored (its children inherit that); a Ctrl-C in
    those milliseconds was discarded and the command ran on (a capture to exit 0). It is now
    held and reaches the command's handler once the server has started."""
    import os
    import signal
    import threading
    from multiprocessing import forkserver

    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        pytest.skip("needs pthread_sigmask and the main thread")
    monkeypatch.setattr(forkserver, "ensure_running", lambda: os.kill(os.getpid(), signal.SIGINT))
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            if where == "capture":
                from trainsim.capture.distributed import start_forkserver_deaf_to_ctrl_c

                start_forkserver_deaf_to_ctrl_c()
            else:
                from trainsim.search.llm import _children_ignore_interrupts

                with _children_ignore_interrupts():
                    pass
            for _ in range(1000):  # the pending signal's handler runs between bytecodes
                pass
    finally:
        signal.signal(signal.SIGINT, old)
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
