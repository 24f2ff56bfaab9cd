"""Child processes that end with the process that started them.

A parent that is killed (SIGKILL, the OOM killer) runs no ``finally``. Children of the
forkserver rather than of it (capture and shard ranks, the search's screening workers) would go
on measuring or screening on the cores a rerun uses; Linux's parent-death signal does not reach
them, since the forkserver, not the parent, forked them.

A pid is only a number: once the parent is gone, the system may give it to a new process, and
a child that only asked whether *some* process has that pid (``os.kill(pid, 0)``) would then
live on. So the child holds the parent itself where it can: a pidfd (Linux ≥ 5.3), which
refers to one process and becomes readable when that process ends, zombie included. Elsewhere
(no ``os.pidfd_open``, or a seccomp filter that refuses it) it polls, and takes the parent for
gone when its pid is missing or another user's, is a zombie, or belongs to a process started
after the one recorded at first (``/proc/PID/stat``'s start time, where there is a /proc), or
when this process, first a direct child of it, has been reparented.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def exit_with_parent(pid: int, cleanup: Path | None = None, *, period_s: float = 1.0, status: int = 1) -> None:
    """In a child: a daemon thread waits for process ``pid`` to end (see the module
    docstring); then the child removes ``cleanup`` (the run's scratch folder, which the dead
    parent would have removed), if given, and exits at once with ``status``. Where the parent
    cannot be held by a pidfd, it is polled every ``period_s``."""
    wait = _waiter(pid, period_s)

    def watch() -> None:
        wait()
        if cleanup is not None:
            shutil.rmtree(cleanup, ignore_errors=True)
        os._exit(status)

    threading.Thread(target=watch, name="trainsim-parent-watch", daemon=True).start()


def _waiter(pid: int, period_s: float) -> Callable[[], None]:
    """A function that returns once process ``pid`` has ended: the process holding ``pid``
    now, unless it started after this one (then it cannot be the parent, which already ended)."""
    born, mine = _start_time(pid), _start_time(os.getpid())
    if born is not None and mine is not None and born > mine:
        return lambda: None
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return lambda: None
    except (AttributeError, OSError):  # not Linux, a kernel before 5.3, or a seccomp filter
        return _poller(pid, period_s, born)
    poller = select.poll()
    poller.register(fd, select.POLLIN)  # readable once the process has ended

    def wait() -> None:
        while not poller.poll():  # an interrupted poll returns nothing: wait again
            pass

    return wait


def _poller(pid: int, period_s: float, born: int | None) -> Callable[[], None]:
    direct = os.getppid() == pid

    def alive() -> bool:
        if direct and os.getppid() != pid:  # reparented: the parent has ended
            return False
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):  # gone, or its pid now another user's
            return False
        state = _stat(pid)
        if state is None:  # no /proc (macOS, the BSDs): the pid is all there is
            return True
        return state[0] != "Z" and (born is None or state[1] == born)

    def wait() -> None:
        while alive():
            time.sleep(period_s)

    return wait


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) from ``/proc/PID/stat``, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        fields = text[text.rindex(")") + 2 :].split()  # the command name, in parentheses, may hold spaces
        return fields[0], int(fields[19])  # fields 3 (state) and 22 (starttime) of proc(5)
    except (OSError, ValueError, IndexError):
        return None


def _start_time(pid: int) -> int | None:
    state = _stat(pid)
    return None if state is None else state[1]


@contextmanager
def main_module_hidden() -> Iterator[None]:
    """For the block: the processes started in it (the forkserver, screening workers, ranks) do not
    import this program's ``__main__``, which multiprocessing otherwise runs again in each of
    them as ``__mp_main__``. Those processes run trainsim's own functions on its own data
    classes and need nothing from it, and a library user's script without an
    ``if __name__ == "__main__":`` guard, or one read from stdin (``<stdin>``, no file to run),
    made every search worker fail to start (``BrokenProcessPool`` after multiprocessing's
    bootstrapping traceback) or run the script's top level again. multiprocessing reads the main module's
    ``__spec__`` and ``__file__`` as it starts a process (``spawn.get_preparation_data``); they
    are put back after the block. A plan or model object of a class the script defines cannot
    be sent to the workers this way (the worker's unpickling names the class that is missing)."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    missing = object()
    saved = {k: main.__dict__.get(k, missing) for k in ("__spec__", "__file__")}
    main.__dict__["__spec__"] = None
    main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is missing:
                main.__dict__.pop(k, None)
            else:
                main.__dict__[k] = v


@contextmanager
def sigint_held() -> Iterator[None]:
    """For the block (main thread): SIGINT is blocked, so a Ctrl-C that comes while the block
    sets SIGINT to ignored (for a process it starts to inherit) stays pending instead of being
    discarded, and reaches the handler that is back in place when the block ends. A Ctrl-C in
    the few milliseconds a forkserver took to start had been lost (the command ran on to exit 0:
    about 1 capture in 15 interrupted then). Linux keeps a blocked, ignored signal pending; the
    processes started in the block inherit the mask, and ignore SIGINT anyway. Where there is
    no ``pthread_sigmask``, nothing is held."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


__all__ = ["exit_with_parent", "main_module_hidden", "sigint_held"]
