"""Run :func:`~trainsim.capture.recorder.record_rank` on 1..N ranks of one host.

One rank runs in this process. More ranks run in processes started with torch.multiprocessing
(``forkserver`` with torch preloaded, else ``spawn``), joined into one process group over ``MASTER_ADDR=127.0.0.1`` and a free port: gloo
on CPU, NCCL on GPUs. Each worker's stdout/stderr go to a log file so that a failure can be
reported with its tail; a worker that fails or hangs stops the others.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from trainsim.capture.examples import example_info
from trainsim.capture.manifest import CaptureSpec, RankCapture, write_atomic
from trainsim.errors import CaptureError
from trainsim.lifetime import exit_with_parent, main_module_hidden, sigint_held

_TAIL_CHARS = 2000
_PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "trainsim.capture.recorder")
_LOOPBACK_IFNAME = {"linux": "lo", "darwin": "lo0"}


def free_port() -> int:
    """A TCP port free on the loopback interface now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def threads_per_rank(spec: CaptureSpec) -> int:
    """Intra-op threads per rank: as asked, else the usable cores shared evenly (at least 1)."""
    return spec.threads_per_rank or max(1, usable_cores() // spec.nproc)


def run_ranks(spec: CaptureSpec) -> list[RankCapture]:
    """Record every rank of ``spec``; raise :class:`CaptureError` if any rank fails."""
    if spec.nproc == 1:
        return [_run_in_process(spec)]
    return _run_spawned(spec)


def _run_in_process(spec: CaptureSpec) -> RankCapture:
    import torch

    from trainsim.capture.recorder import record_rank

    threads = torch.get_num_threads()
    try:  # leave the caller's thread count and random state as they were
        torch.set_num_threads(threads_per_rank(spec))
        with torch.random.fork_rng(devices=[]), _quiet_profiler_logs():
            return record_rank(spec, rank=0, world_size=1)
    finally:
        torch.set_num_threads(threads)


# what libkineto and the execution-trace observer print to fd 2 on every profiled run (the rank
# workers' go to their log files): 4 lines a capture, 250 in a `validate cpu-e2e` run
_PROFILER_NOISE = ("USDT:", "Enabling Execution Trace Observer", "Disabling Execution Trace Observer")


@contextlib.contextmanager
def _quiet_profiler_logs() -> Iterator[None]:
    """Route fd 2 through a pipe while the in-process rank records: a thread passes every line on
    as it comes (a crash's last words too) but the profiler's routine start/stop notices."""
    import threading

    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # no real fd 2 (a test's captured stream)
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    r, w = os.pipe()

    def forward() -> None:
        with os.fdopen(r, "rb") as src:
            for line in src:
                if not any(n.encode() in line for n in _PROFILER_NOISE):
                    os.write(saved, line)

    t = threading.Thread(target=forward, name="trainsim-stderr", daemon=True)
    t.start()
    os.dup2(w, fd)
    os.close(w)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, fd)  # closes the pipe's last write end: the thread drains and stops
        t.join(timeout=5)
        os.close(saved)


def _run_spawned(spec: CaptureSpec) -> list[RankCapture]:
    ctx = _context(spec)
    port = free_port()
    env = dict(os.environ)  # a forkserver's children would otherwise see the server's
    with tempfile.TemporaryDirectory(prefix="trainsim-capture-") as tmp:
        work = Path(tmp)
        procs = [
            ctx.Process(
                target=_worker, args=(spec, rank, port, str(work), env), kwargs={"parent": os.getpid()},
                name=f"trainsim-rank{rank}",
            )
            for rank in range(spec.nproc)
        ]
        try:
            with main_module_hidden():  # the ranks need nothing from a library user's script
                for p in procs:
                    p.start()
            _wait_all(procs, spec=spec, work=work)
        finally:
            stop_processes(procs)
        return [_read_result(work, rank) for rank in range(spec.nproc)]


def _context(spec: CaptureSpec) -> Any:
    """``forkserver`` with torch preloaded where the platform has it, else ``spawn``.

    The server imports torch once (never running an op, so no OpenMP pool exists when it
    forks); each rank then starts in milliseconds instead of re-importing torch, which costs
    seconds per rank and per capture.
    """
    import torch.multiprocessing as mp

    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    # Takes effect only when the server starts (the first capture of this process).
    ctx.set_forkserver_preload([*_PRELOAD, example_info(spec.model).module])
    start_forkserver_deaf_to_ctrl_c()
    return ctx


def start_forkserver_deaf_to_ctrl_c() -> None:
    """Start multiprocessing's forkserver (if it is not running) with SIGINT ignored.

    A Ctrl-C reaches the whole process group: a forkserver still importing its preloads (torch:
    seconds, on the first set or capture) printed its KeyboardInterrupt traceback to the
    terminal, under the command's own interrupt line. Started with SIGINT ignored, the server and
    the ranks it forks (which inherit it) leave the interrupt to the command, which stops them
    (:func:`stop_processes`). A Ctrl-C in the few milliseconds the server takes to start is
    held (:func:`trainsim.lifetime.sigint_held`) and reaches the command after them."""
    import signal
    import threading
    from multiprocessing import forkserver

    if threading.current_thread() is not threading.main_thread():
        forkserver.ensure_running()  # signal dispositions are the main thread's to change
        return
    with sigint_held():
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            forkserver.ensure_running()
        finally:
            signal.signal(signal.SIGINT, old if old is not None else signal.SIG_DFL)


def _wait_all(procs: list[Any], *, spec: CaptureSpec, work: Path) -> None:
    deadline = time.monotonic() + spec.timeout_s
    running = {p.sentinel: rank for rank, p in enumerate(procs)}
    while running:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CaptureError(
                f"capture of {spec.model!r} on {spec.nproc} ranks timed out after {spec.timeout_s:g} s "
                f"(give a longer --timeout, fewer --steps or a smaller --batch-size){_last_line(work, 0)}"
            )  # one line: a hung rank's log ends in the profiler's own messages, not a cause
        for sentinel in wait(list(running), timeout=left):
            rank = running.pop(sentinel)
            procs[rank].join()  # the sentinel fires before exitcode is collected
            code = procs[rank].exitcode
            if code != 0:
                raise CaptureError(
                    f"capture worker for rank {rank} of {spec.nproc} failed (exit code {code}) "
                    f"while recording {spec.model!r}; its log ends with:\n{_log_tail(work, rank)}"
                )


def stop_processes(procs: list[Any]) -> None:
    """Terminate, then kill, every started process (rank workers of a failed or finished run)."""
    procs = [p for p in procs if p.pid is not None]  # started
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join()


def _log_path(work: Path, rank: int) -> Path:
    return work / f"rank{rank}.log"


def _last_line(work: Path, rank: int) -> str:
    """``; rank R's last log line: ...`` (its last non-empty line), or "" without one."""
    lines = [x for x in _log_tail(work, rank).splitlines() if x.strip() and x.strip() not in ("(no log)", "(empty log)")]
    return f"; rank {rank}'s last log line: {lines[-1].strip()[:160]}" if lines else ""


def _log_tail(work: Path, rank: int) -> str:
    try:
        text = _log_path(work, rank).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return text[-_TAIL_CHARS:].strip() or "(empty log)"


def _read_result(work: Path, rank: int) -> RankCapture:
    path = work / f"rank{rank}.result.json"
    try:
        return RankCapture.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError) as e:
        raise CaptureError(
            f"rank {rank} exited cleanly but left no result ({e}); log:\n{_log_tail(work, rank)}"
        ) from e


def _redirect_output(log: Path) -> None:
    """Point this process's stdout/stderr file descriptors (C++ logs included) at ``log``."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _worker(spec: CaptureSpec, rank: int, port: int, work_dir: str, env: dict[str, str], *, parent: int) -> None:
    """Entry point of one rank, in a process forked by the forkserver or spawned afresh; it ends
    with process ``parent`` (:func:`trainsim.lifetime.exit_with_parent`)."""
    work = Path(work_dir)
    exit_with_parent(parent, work)
    try:
        _redirect_output(_log_path(work, rank))
    except FileNotFoundError:  # the run was given up (Ctrl-C) before the forkserver forked this rank
        os._exit(1)
    faulthandler.enable(all_threads=True)  # a crash in torch's C++ leaves its Python stack in the log
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
        WORLD_SIZE=str(spec.nproc), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(spec.nproc),
    )  # fmt: skip
    if spec.backend == "gloo" and sys.platform in _LOOPBACK_IFNAME:
        # All ranks are on this host: keep gloo off interfaces the hostname may resolve to.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", _LOOPBACK_IFNAME[sys.platform])

    import torch
    import torch.distributed as dist

    from trainsim.capture.recorder import record_rank

    torch.set_num_threads(threads_per_rank(spec))
    if spec.device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(
        backend=spec.backend, init_method="env://", rank=rank, world_size=spec.nproc,
        timeout=timedelta(seconds=spec.timeout_s),
    )  # fmt: skip
    try:
        result = record_rank(spec, rank=rank, world_size=spec.nproc)
        if spec.device == "cuda":
            dist.barrier(device_ids=[torch.cuda.current_device()])
        else:
            dist.barrier()
    finally:
        dist.destroy_process_group()
    write_atomic(work / f"rank{rank}.result.json", json.dumps(result.to_dict()))
