"""Plan search for LLM training: screen every plan of a space fast, simulate the best, rank.

1. Enumerate :class:`~trainsim.search.space.PlanSpace` (structural constraints from
   ``Plan.validate``; infeasible plans counted by reason).
2. **Screen** every valid plan with paper 001's closed form (Eq. 7) over the same operator and
   collective costs the simulator uses, plus the peak memory per GPU; plans that do not fit are
   counted as infeasible. Screening runs in local processes (``workers``; default: every core)
   or on a Dask cluster (``scheduler="tcp://…"``), in chunks, with a progress bar.
3. **Simulate** the ``simulate_top`` best screened plans (:func:`trainsim.builders.predict.predict_llm`)
   and rank them by the objective on the simulated time (paper 003 §VIII-B: a cheap model
   prunes, the accurate one decides).

Objectives: ``time`` (iteration time), ``time-to-train`` (``train_tokens`` / tokens per second),
``cost`` (GPU-hours × ``gpu_hour_price`` for ``train_tokens``, or per iteration without it).
"""

from __future__ import annotations

import atexit
import math
import os
import signal
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import asdict, dataclass
from functools import cache
from multiprocessing import forkserver, get_context
from typing import Any

from trainsim.builders.costs import OpCoster
from trainsim.builders.llm import closed_form_001, stage_costs
from trainsim.builders.llm_comm import check_job_placement
from trainsim.builders.memory import fits_within, memory_limit, memory_per_gpu
from trainsim.builders.plan import Plan, check_moe_imbalance
from trainsim.builders.predict import predict_llm
from trainsim.builders.spec import ModelSpec
from trainsim.comm.registry import USER_MODELS_ENV as USER_COMM_MODELS_ENV
from trainsim.envvars import restored_environ
from trainsim.errors import ConfigError, TrainsimError
from trainsim.hardware import SystemSpec, get_device, get_system
from trainsim.kernels.registry import USER_MODELS_ENV as USER_KERNEL_MODELS_ENV
from trainsim.lifetime import exit_with_parent, main_module_hidden, sigint_held
from trainsim.search.frameworks import framework_note
from trainsim.search.space import PlanSpace, reason_key

OBJECTIVES = ("time", "time-to-train", "cost")
MEMORY_REASON = "does not fit in GPU memory"
_CHUNK = 256  # plans per chunk at most (a task's overhead is a few ms; a chunk of 256 ~0.2 s)
_MIN_CHUNK = 32
_CHUNKS_PER_WORKER = 4  # a worker left with a slow chunk holds the search up by 1/4 of its share


@dataclass(frozen=True, slots=True)
class Screened:
    index: int
    closed_form_s: float
    memory_bytes: float  # peak stage; the search compares it with its memory limit
    error: str = ""


_COSTERS: dict[tuple[str, str], OpCoster] = {}


def _coster(device: str) -> OpCoster:
    key = (device, os.environ.get(USER_KERNEL_MODELS_ENV, ""))  # --kernel-models change the answers
    c = _COSTERS.get(key)
    if c is None:
        c = _COSTERS[key] = OpCoster(get_device(device))
    return c


_CALIBRATION_ENV = (USER_KERNEL_MODELS_ENV, USER_COMM_MODELS_ENV)
_ENV_LOCK = threading.Lock()


def _calibration_env() -> dict[str, str]:
    """The ``--kernel-models`` / ``--comm-models`` variables as this process has them: sent with
    each chunk to the kept pool, whose workers may have started before they were set."""
    return {n: os.environ[n] for n in _CALIBRATION_ENV if n in os.environ}


@contextmanager
def _with_env(env: dict[str, str]) -> Iterator[None]:
    """The calibration variables as ``env`` has them (absent there: unset) for the block."""
    with restored_environ(_CALIBRATION_ENV):
        for n in _CALIBRATION_ENV:
            if n in env:
                os.environ[n] = env[n]
            else:
                os.environ.pop(n, None)
        yield


def screen_plans(
    model: ModelSpec, system: SystemSpec, plans: Sequence[tuple[int, Plan]],
    env: dict[str, str] | None = None, memory_limit: float | None = None,
) -> list[Screened]:  # fmt: skip
    """Closed form + peak memory per plan (a worker's unit of work; picklable arguments).
    ``env``: the calibration variables to screen under (:func:`_calibration_env`); ``None``
    keeps this process's. ``memory_limit``: bytes per GPU above which a plan is not timed (its
    closed form is inf: the search counts it as not fitting and ranks it nowhere)."""
    if env is None:
        return _screen(model, system, plans, memory_limit)
    with _ENV_LOCK, _with_env(env):  # os.environ is the process's: one chunk at a time
        return _screen(model, system, plans, memory_limit)


def _screen(model: ModelSpec, system: SystemSpec, plans: Sequence[tuple[int, Plan]],
            memory_limit: float | None = None) -> list[Screened]:  # fmt: skip
    coster = _coster(system.device)
    out = []
    for i, plan in plans:
        try:
            # memory first: a plan that does not fit is not timed (most of an MoE model's space
            # on few GPUs: 5,116 of DeepSeek-V3's 6,288 plans on 256 H100s)
            mem = max(m.total_bytes for m in memory_per_gpu(model, plan))
            if memory_limit is not None and not fits_within(mem, memory_limit):
                out.append(Screened(i, math.inf, mem))
                continue
            stages = stage_costs(model, plan, system, coster, tp_shares=False)  # no breakdown here
            cf = closed_form_001(stages, plan)
        except TrainsimError as e:
            out.append(Screened(i, math.inf, math.inf, str(e)))
            continue
        out.append(Screened(i, cf, mem))
    return out


def _objective(name: str, seconds: float, plan: Plan, model: ModelSpec, *, train_tokens: float | None,
               gpu_hour_price: float | None) -> float:  # fmt: skip
    if name == "time":
        return seconds
    tokens = plan.batch * plan.seq(model)
    total_s = (train_tokens / tokens * seconds) if train_tokens is not None else seconds
    value = total_s if name == "time-to-train" else \
        plan.gpus * total_s / 3600.0 * (gpu_hour_price if gpu_hour_price is not None else 1.0)
    if not math.isfinite(value):  # every plan inf: ranked in enumeration order, as if tied
        given = " and ".join(f"{f} {v:g}" for f, v in (("--train-tokens", train_tokens),
                                                        ("--gpu-hour-price", gpu_hour_price)) if v is not None)
        raise ConfigError(f"{given}: the {name} of plan {plan.label()} is {value} (beyond a float); "
                          "give smaller numbers")  # fmt: skip
    return value


def check_objective(name: str, *, train_tokens: float | None, gpu_hour_price: float | None) -> None:
    """A ConfigError naming the option when the objective or its numbers are not usable."""
    if name not in OBJECTIVES:
        raise ConfigError(f"objective must be one of {', '.join(OBJECTIVES)}, got {name!r}")
    for flag, value in (("--train-tokens", train_tokens), ("--gpu-hour-price", gpu_hour_price)):
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ConfigError(f"{flag} must be a positive number, got {value:g}")
    if name == "time-to-train" and train_tokens is None:
        raise ConfigError("objective time-to-train needs --train-tokens")


def objective_unit(name: str, *, train_tokens: float | None, gpu_hour_price: float | None) -> str:
    """What an objective value measures, e.g. ``"GPU-hours per iteration"``."""
    if name == "time":
        return "s per iteration"
    if name == "time-to-train":
        return "s to train"
    what = "money in --gpu-hour-price units" if gpu_hour_price is not None else "GPU-hours"
    return f"{what} {'to train' if train_tokens is not None else 'per iteration'}"


_DASK_SCHEMES = ("tcp", "tls", "ucx", "ucxx", "ws", "wss")


def scheduler_address(text: str) -> str:
    """``text`` checked as a Dask scheduler address (``[tcp|tls|ucx|ws|wss]://host:port`` or
    ``host:port``, which Dask reads as TCP); a ConfigError names what is wrong."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "tcp", text
    if scheme == "inproc":  # in-process: inproc://IP/PID/N, no port
        if rest:
            return text
        raise ConfigError(f"--scheduler {text!r}: an in-process address names its scheduler (inproc://IP/PID/N, "
                          "as a LocalCluster(processes=False) in this process gives it)")  # fmt: skip
    host, colon, port = rest.rpartition(":")
    expect = "expected tcp://HOST:PORT (or tls, ucx, ucxx, ws, wss; inproc://…)"
    if scheme not in _DASK_SCHEMES:
        raise ConfigError(f"--scheduler {text!r}: unknown scheme {scheme!r}; {expect}")
    if not colon or not host.strip("[]") or "/" in rest:
        raise ConfigError(f"--scheduler {text!r}: {expect}")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--scheduler {text!r}: port must be 1-65535, got {port!r}; {expect}")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ConfigError(f"--scheduler {text!r}: an IPv6 host goes in brackets: {scheme}://[{host}]:{port}")
    return f"{scheme}://{rest}"


def _chunks(items: list[tuple[int, Plan]], workers: int) -> list[list[tuple[int, Plan]]]:
    """``items`` in chunks for ``workers`` to share: about :data:`_CHUNKS_PER_WORKER` each, of
    :data:`_MIN_CHUNK` to :data:`_CHUNK` plans (a fixed 256 gave GPT-3 175B's 2,000 plans eight
    tasks: at most eight workers busy)."""
    size = math.ceil(len(items) / max(workers * _CHUNKS_PER_WORKER, 1))
    size = max(min(size, _CHUNK), min(_MIN_CHUNK, _CHUNK), 1)
    return [items[k : k + size] for k in range(0, len(items), size)]


def _cores() -> int:
    """The cores this process may run on (taskset, a cgroup's cpuset), not the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


CONNECT_DEADLINE_S = 20.0  # to reach the scheduler and finish its handshake
WORKERS_DEADLINE_S = 30.0  # for the first worker to be there


# What Dask's handshake raises on bytes of another protocol: an SSH or SMTP banner read as a frame
# length (numpy: "Unable to allocate 2.82 EiB"), a frame too short to unpack, msgpack garbage.
_NOT_DASK = (MemoryError, OverflowError, struct.error, ValueError, TypeError, KeyError)


def _probe_tcp(scheduler: str, deadline: float) -> None:
    """A ConfigError unless a ``tcp://`` (or bare ``host:port``) address sends bytes first by
    ``deadline`` (``time.monotonic()``), as a Dask scheduler does: its handshake goes out as soon
    as a connection opens. Other protocols are not probed. A silent port would stall Dask's own
    handshake past its timeout, and the client left behind in its thread would be freed later by
    the garbage collector, in whichever thread that runs: better never built."""
    import socket

    scheme, _, rest = scheduler.partition("://")
    if scheme != "tcp":
        return
    host, _, port = rest.rpartition(":")
    where = f"--scheduler {scheduler}"
    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=max(deadline - time.monotonic(), 0.1))
    except TimeoutError:
        raise ConfigError(f"{where}: cannot connect (no answer within {CONNECT_DEADLINE_S:.0f} s: "
                          "a firewall, or a host that is down?)") from None  # fmt: skip
    except (OSError, UnicodeError) as e:  # UnicodeError: a host name IDNA cannot encode ("a..b")
        raise ConfigError(f"{where}: cannot connect ({getattr(e, 'strerror', None) or e})") from None
    reset: OSError | None = None
    first = b""
    with sock:
        try:
            while len(first) < 16:  # Dask's frame header: total bytes, frame count
                sock.settimeout(max(deadline - time.monotonic(), 0.1))
                more = sock.recv(16 - len(first))
                if not more:
                    break
                first += more
        except TimeoutError:
            if first:
                raise ConfigError(f"{where}: the address did not answer as a Dask scheduler (it sent {len(first)} "
                                  "bytes and stalled; is it another service's port?)") from None  # fmt: skip
            raise ConfigError(f"{where}: connected, but nothing came within {CONNECT_DEADLINE_S:.0f} s (a Dask "
                              "scheduler sends its handshake at once: is this a Dask scheduler's address, not "
                              "its dashboard's?)") from None  # fmt: skip
        except OSError as e:  # reset by the peer
            first, reset = b"", e
    if not first:
        raise ConfigError(f"{where}: the port closed the connection without sending anything"
                          + (f" ({reset.strerror or reset})" if reset else "")
                          + "; a Dask scheduler sends its handshake at once")  # fmt: skip
    if not _dask_header(first):
        # checked here so that no Dask client is built for another protocol's bytes: one that
        # fails mid-handshake is left to the garbage collector, whose run of its __del__ in
        # another client's IO-loop thread can deadlock on Dask's loop-runner lock
        raise ConfigError(f"{where}: the address did not answer as a Dask scheduler (what it sent is not Dask's "
                          "protocol; is it another service's port?)")  # fmt: skip


def _dask_header(head: bytes) -> bool:
    """Whether ``head`` opens a Dask TCP message: a little-endian uint64 of the bytes that follow
    (the handshake: well under 1 MiB), then a uint64 count of frames (a few) whose 8-byte lengths
    fit in it."""
    if len(head) < 16:
        return False
    total, frames = struct.unpack("<QQ", head[:16])
    return 1 <= frames <= 64 and 8 + 8 * frames <= total <= 1 << 20


def _connect(client_cls: Any, scheduler: str, say: Callable[[str], None]) -> Any:
    """A Dask client of ``scheduler`` with at least one worker, or a one-line ConfigError. A TCP
    address must first speak (:func:`_probe_tcp`); the connection itself (handshake included) then
    runs in a daemon thread, since a port held by another service can also stall the handshake or
    answer garbage; both within :data:`CONNECT_DEADLINE_S` in all. ``say`` hears of the wait for
    a first worker."""
    import threading

    deadline = time.monotonic() + CONNECT_DEADLINE_S
    _probe_tcp(scheduler, deadline)
    box: dict[str, Any] = {}

    def connect() -> None:
        try:
            box["client"] = client_cls(scheduler, timeout="10s")
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=connect, name="trainsim-dask-connect", daemon=True)
    t.start()
    t.join(max(deadline - time.monotonic(), 0.1))
    if t.is_alive():
        raise ConfigError(f"--scheduler {scheduler}: no Dask scheduler answered within {CONNECT_DEADLINE_S:.0f} s "
                          "(is it a Dask scheduler's address, not its dashboard's?)")  # fmt: skip
    if "error" in box and scheduler.startswith("inproc://"):  # nothing was sent: there is nothing there
        raise ConfigError(f"--scheduler {scheduler}: no in-process scheduler of that address in this program "
                          "(inproc:// reaches a LocalCluster(processes=False) made in this Python process)") from None  # fmt: skip
    if isinstance(box.get("error"), _NOT_DASK):
        raise ConfigError(f"--scheduler {scheduler}: the address did not answer as a Dask scheduler (what it "
                          "sent is not Dask's protocol; is it another service's port?)") from None  # fmt: skip
    if "error" in box:
        first = (str(box["error"]).splitlines() or [type(box["error"]).__name__])[0]
        raise ConfigError(f"--scheduler {scheduler}: cannot use it as a Dask scheduler ({first})") from None
    client = box["client"]
    try:
        if not client.scheduler_info()["workers"]:
            say(f"connected to {scheduler}; waiting up to {WORKERS_DEADLINE_S:.0f} s for a worker")
        client.wait_for_workers(1, timeout=WORKERS_DEADLINE_S)
    except Exception:
        client.close()
        raise ConfigError(f"--scheduler {scheduler}: the scheduler has no workers after {WORKERS_DEADLINE_S:.0f} s "
                          f"(start some: dask worker {scheduler})") from None  # fmt: skip
    except BaseException:
        _close_now(client)
        raise
    return client


def _source_probe() -> Callable[[], tuple[str, str] | None]:
    """A function giving where the ``trainsim`` package is and a digest of its ``.py`` files, or
    None where it is not importable. Made here, a local function, so that cloudpickle ships its
    code to a Dask worker (by value): it runs there without importing trainsim, which may be
    missing or another version (every commit is 0.1.0: the source tells them apart)."""

    def probe() -> tuple[str, str] | None:
        import hashlib
        import importlib.util
        from pathlib import Path

        spec = importlib.util.find_spec("trainsim")  # the imported package's, once imported
        if spec is None or not spec.submodule_search_locations:
            return None
        root = Path(next(iter(spec.submodule_search_locations)))
        digest = hashlib.sha256()
        for f in sorted(root.rglob("*.py")):
            digest.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
        return str(root), digest.hexdigest()

    return probe


@cache
def _our_source() -> tuple[str, str]:
    """This process's trainsim, where it is and its digest (read once)."""
    ours = _source_probe()()
    assert ours is not None, "this process runs trainsim"
    return ours


@dataclass(slots=True)
class _Dask:
    client: Any
    scheduler: str
    checked: set[str]  # the workers whose trainsim is this process's


CHECK_DEADLINE_S = 15.0  # for the workers' answers to the source check


def _run_bounded(dask: _Dask, workers: list[str]) -> dict[str, Any]:
    """``client.run`` of the source probe on ``workers``, within :data:`CHECK_DEADLINE_S`: a
    worker killed while it runs can leave the call waiting for good (review finding). Those
    still registered but silent by then are a one-line error."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["answers"] = dask.client.run(_source_probe(), workers=workers, on_error="return")
        except BaseException as e:  # OSError: the scheduler is gone; the caller's loop says so
            box["error"] = e

    t = threading.Thread(target=run, name="trainsim-dask-check", daemon=True)
    t.start()
    t.join(CHECK_DEADLINE_S)
    if "error" in box:
        raise box["error"]
    if "answers" in box:
        return dict(box["answers"])
    still = [w for w in workers if w in dask.client.scheduler_info()["workers"]]
    if still:
        raise ConfigError(f"--scheduler {dask.scheduler}: Dask workers {', '.join(still[:3])} did not answer which "
                          f"trainsim they run within {CHECK_DEADLINE_S:.0f} s; see their logs")  # fmt: skip
    return {}


def _check_workers(dask: _Dask) -> int:
    """The number of workers the scheduler has, or a ConfigError naming those (not yet checked)
    whose trainsim is missing or not this process's: their screening failed on every plan, or
    answered other numbers, with exit 0 (review finding)."""
    info = dask.client.scheduler_info()["workers"]
    new = [w for w in info if w not in dask.checked]
    if not new:
        return len(info)
    root, digest = _our_source()
    answers = _run_bounded(dask, new)
    bad = []
    for w, a in answers.items():
        name = info.get(w, {}).get("name", w)
        who = w if str(name) == w else f"{name} ({w})"
        if isinstance(a, OSError):  # gone since
            continue
        if isinstance(a, BaseException):
            bad.append(f"{who}: the check failed, {type(a).__name__}: {(str(a).splitlines() or [''])[0]}")
        elif a is None:
            bad.append(f"{who}: no trainsim importable")
        elif a[1] != digest:
            bad.append(f"{who}: another trainsim source, {a[0]}")
    dask.checked.update(new)
    if bad:
        more = f"; and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise ConfigError(f"--scheduler {dask.scheduler}: {len(bad)} of {len(answers)} Dask workers do not run this "
                          f"trainsim ({'; '.join(bad[:3])}{more}); they need the same source as {root}")  # fmt: skip
    return len(info)


@contextmanager
def _quiet_dask_logs() -> Iterator[None]:
    """Dask's and tornado's loggers silent for the block, as they were after it: what they log of
    a scheduler or worker lost (tracebacks, reconnection attempts) the search says in one line."""
    import logging

    names = ["distributed", "tornado", "asyncio",
             *(n for n in logging.root.manager.loggerDict if n.startswith(("distributed.", "tornado.")))]  # fmt: skip
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _close_now(client: Any) -> None:
    """Close ``client`` on an interrupt, waiting at most a second for the scheduler."""
    with suppress(BaseException):  # a second Ctrl-C, a scheduler gone
        client.close(timeout=1)


@contextmanager
def _dask_client(scheduler: str, say: Callable[[str], None]) -> Iterator[_Dask]:
    """A client of ``scheduler`` whose workers run this trainsim (:func:`_check_workers`),
    closed after the block; Dask's logging quiet meanwhile."""
    try:
        from dask.distributed import Client
    except ImportError:
        raise ConfigError(
            "--scheduler needs dask.distributed: pip install 'trainsim[search]' (or dask[distributed])"
        ) from None
    with _quiet_dask_logs():
        client = _connect(Client, scheduler, say)
        try:
            dask = _Dask(client, scheduler, set())
            _check_workers(dask)
            yield dask
        except KeyboardInterrupt:
            _close_now(client)
            raise
        except BaseException:
            with suppress(Exception):
                client.close(timeout=5)
            raise
        else:
            client.close()


def _run_screening(model: ModelSpec, system: SystemSpec, items: list[tuple[int, Plan]], *, workers: int | None,
                   dask: _Dask | None, tick: Callable[[int], None],
                   memory_limit: float | None = None) -> list[Screened]:  # fmt: skip
    out: list[Screened] = []
    if dask is not None:
        return _screen_on_dask(dask, model, system, _chunks(items, _dask_threads(dask)), tick, memory_limit=memory_limit)
    n = workers if workers is not None else _cores()
    chunks = _chunks(items, n)
    n = min(n, len(chunks))  # no process without a chunk to screen
    if n <= 1 or len(chunks) <= 1:
        for ch in chunks:
            res = screen_plans(model, system, ch, memory_limit=memory_limit)
            out.extend(res)
            tick(len(res))
        return out
    env = _calibration_env()
    with _POOL_LOCK:  # one search at a time on the kept pool (threads: see _pool)
        for attempt in (1, 2):
            pool = _pool(n)
            futs: list[Future[list[Screened]]] = []
            try:
                with main_module_hidden(), _children_ignore_interrupts():  # the forkserver, then the submits start the workers
                    futs = [pool.submit(screen_plans, model, system, ch, env, memory_limit) for ch in chunks]
                for fut in as_completed(futs):
                    res = fut.result()
                    out.extend(res)
                    tick(len(res))
                return out
            except BrokenProcessPool:
                _drop_pool()  # a worker died (killed, out of memory, an interrupt while idle)
                if attempt == 2 or out:  # only a pool found broken before any result is retried
                    raise
            except KeyboardInterrupt:
                _kill_pool()
                raise
            except BaseException:
                for f in futs:
                    f.cancel()
                raise
    raise AssertionError("unreachable")


def _screen_on_dask(dask: _Dask, model: ModelSpec, system: SystemSpec, chunks: list[list[tuple[int, Plan]]],
                    tick: Callable[[int], None], *, memory_limit: float | None = None) -> list[Screened]:  # fmt: skip
    """The chunks screened on the Dask workers (the workers' own environment: local artifacts
    are refused with --scheduler). One-line ConfigErrors for a scheduler lost, workers all gone
    for :data:`WORKERS_DEADLINE_S`, a worker's exception and a chunk that kept killing workers."""
    from concurrent.futures import CancelledError

    from dask.distributed import wait

    total = sum(map(len, chunks))
    out: list[Screened] = []
    where = f"--scheduler {dask.scheduler}"
    try:
        pending = set(dask.client.map(screen_plans, [model] * len(chunks), [system] * len(chunks), chunks,
                                      [None] * len(chunks), [memory_limit] * len(chunks), pure=False))  # fmt: skip
        alone_since: float | None = None
        while pending:
            try:
                done, pending = wait(list(pending), timeout=1.0, return_when="FIRST_COMPLETED")
            except TimeoutError:
                done = set()
            for fut in done:
                if fut.status == "error":
                    raise _worker_failure(where, fut.exception())
                res = fut.result()
                out.extend(res)
                tick(len(res))
            if not pending:
                break
            if _check_workers(dask):  # those that joined are checked too
                alone_since = None
            elif alone_since is None:
                alone_since = time.monotonic()
            elif time.monotonic() - alone_since > WORKERS_DEADLINE_S:
                raise ConfigError(f"{where}: all Dask workers left mid-search ({len(out):,} of {total:,} plans "
                                  "screened); see their logs")  # fmt: skip
    except (OSError, CancelledError) as e:  # the worker's own errors are _worker_failure's
        why = "" if isinstance(e, CancelledError) else f"; {(str(e).splitlines() or [''])[0] or type(e).__name__}"
        raise ConfigError(f"{where}: lost the scheduler mid-search ({len(out):,} of {total:,} plans screened{why})") from e
    return out


def _dask_threads(dask: _Dask) -> int:
    """The threads of the scheduler's workers (each screens one chunk at a time)."""
    return sum(w.get("nthreads", 1) for w in dask.client.scheduler_info()["workers"].values()) or 1


def _worker_failure(where: str, e: BaseException) -> ConfigError:
    """One line for a chunk that failed on a Dask worker (its traceback: ``--debug``)."""
    from distributed.scheduler import KilledWorker

    if isinstance(e, KilledWorker):
        import dask

        tries = int(dask.config.get("distributed.scheduler.allowed-failures")) + 1
        err = ConfigError(f"{where}: Dask workers died {tries} times running a chunk of plans; see the worker logs")
    else:
        first = (str(e).splitlines() or [""])[0]
        err = ConfigError(f"{where}: a Dask worker failed screening: {type(e).__name__}: {first}")
    err.__cause__ = e
    return err


# The screening processes are kept between searches of one program (a notebook, a sweep of
# searches, the benchmark): a worker pays ~1 s to import trainsim and load the kernel models
# once, not once per search. One pool, used by one search at a time (_POOL_LOCK: a thread
# asking for another size waits instead of shutting down a pool in use); replaced when broken
# or resized; shut down at exit. Each worker exits by itself when this process is gone (killed:
# no atexit), see _init_worker (trainsim.lifetime.exit_with_parent).
_POOL: dict[int, ProcessPoolExecutor] = {}  # at most one: workers -> pool
_POOL_LOCK = threading.Lock()


def _pool(n: int) -> ProcessPoolExecutor:
    """The kept pool when it has at least ``n`` workers (a search of fewer chunks than a
    previous one submits fewer, without restarting the workers), else a new one of ``n``."""
    pool = next((p for k, p in _POOL.items() if k >= n), None)
    if pool is not None and getattr(pool, "_broken", False):
        pool = None
    if pool is None:
        _drop_pool()
        pool = _POOL[n] = ProcessPoolExecutor(max_workers=n, mp_context=get_context("forkserver"),
                                              initializer=_init_worker, initargs=(os.getpid(),))  # fmt: skip
    return pool


@contextmanager
def _children_ignore_interrupts() -> Iterator[None]:
    """For the block: the processes started in it ignore SIGINT, and a Ctrl-C is held until it
    ends. Ctrl-C reaches the whole process group: screening processes it interrupted printed
    tracebacks from wherever they were (an import, a semaphore of a program already gone), and
    the search answers it alone (:func:`_kill_pool`). The forkserver, which forks every worker,
    is started here with SIGINT ignored, which its workers inherit (through fork and exec)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers are the main thread's, and so are Ctrl-Cs
        return
    held: list[int] = []
    old = signal.getsignal(signal.SIGINT)
    try:
        with sigint_held():  # a Ctrl-C while SIGINT is ignored waits for the holding handler
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            forkserver.ensure_running()
            signal.signal(signal.SIGINT, lambda signum, _frame: held.append(signum))
        yield
    finally:
        signal.signal(signal.SIGINT, old if old is not None else signal.SIG_DFL)
    if held and callable(old):
        old(signal.SIGINT, None)  # Python's default handler raises KeyboardInterrupt
    elif held and old == signal.SIG_DFL:  # an embedding program's default action: deliver it again
        os.kill(os.getpid(), signal.SIGINT)


def _init_worker(pid: int) -> None:
    """A worker's initializer: Ctrl-C is the search's to answer (a forkserver that another
    library started passes it on), and the worker ends with the search (:func:`trainsim.lifetime.exit_with_parent`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_parent(pid, period_s=2.0, status=0)


def _drop_pool() -> None:
    for pool in _POOL.values():
        pool.shutdown(wait=False, cancel_futures=True)
    _POOL.clear()


def _kill_pool() -> None:
    """An interrupted search's pool: its workers killed, not joined, and the pool dropped. Its
    futures are left to the pool's own thread, which fails them once it sees the workers gone:
    cancelling them as it did so raised InvalidStateError in that thread (Python 3.11), which then
    never closed the call queue, and the exit hung joining the queue's feeder (review finding)."""
    for pool in _POOL.values():
        for p in list((pool._processes or {}).values()):
            with suppress(OSError):
                p.kill()
    _POOL.clear()


atexit.register(_drop_pool)


def check_param_gather_space(space: PlanSpace) -> None:
    """With ``overlap_param_gather``: a ConfigError (one line) when no plan of ``space`` could take
    it (every plan would run without it, silently), as with a framework other than Megatron."""
    if not space.overlap_param_gather:
        return
    if space.framework in ("deepspeed", "torchtitan"):
        raise ConfigError(f"--overlap-param-gather is Megatron-core's, for its distributed optimizer: {space.framework} "
                          "has no such plan; drop it or use --framework megatron or any")  # fmt: skip
    megatron = space.dist_optimizer or space.framework == "megatron"
    if not (1 in space.zero and space.overlap_grad_reduce and megatron):
        raise ConfigError(f"--overlap-param-gather applies to ZeRO-1 plans with --dist-optimizer (or --framework "
                          f"megatron) and --overlap-grad-reduce (Megatron-core asserts both): --zero "
                          f"{','.join(map(str, space.zero))} with these flags has none")  # fmt: skip


def search_llm(model: ModelSpec, system: SystemSpec | str, space: PlanSpace, *, objective: str = "time",
               top_k: int = 10, simulate_top: int = 32, workers: int | None = None, scheduler: str | None = None,
               train_tokens: float | None = None, gpu_hour_price: float | None = None,
               progress: bool = True, memory_headroom_bytes: float = 0.0) -> dict[str, Any]:  # fmt: skip
    """Search ``space`` for ``model`` on ``system`` (see the module docstring). A plan fits
    when its peak stage leaves ``memory_headroom_bytes`` of the device's memory free."""
    check_objective(objective, train_tokens=train_tokens, gpu_hour_price=gpu_hour_price)
    if scheduler is not None:
        scheduler = scheduler_address(scheduler)
    if scheduler is not None and workers is not None:
        raise ConfigError(f"--workers {workers} and --scheduler {scheduler}: --workers counts local screening "
                          "processes, which a search on a Dask cluster does not start; give one of them")  # fmt: skip
    sys_spec = get_system(system) if isinstance(system, str) else system
    check_job_placement(space.gpus, sys_spec)  # every plan has all the GPUs: one error, not one per plan
    capacity = get_device(sys_spec.device).memory_bytes
    if not (0 <= memory_headroom_bytes < capacity):
        raise ConfigError(f"memory headroom must be at least 0 and below the device's {capacity / 2**30:.1f} GiB, "
                          f"got {memory_headroom_bytes / 2**30:.1f} GiB")  # fmt: skip
    limit = memory_limit(capacity, memory_headroom_bytes)  # predict's: whole bytes, the same plans fit
    if not model.num_experts and any(e > 1 for e in space.ep):
        raise ConfigError(f"--ep {','.join(map(str, space.ep))}: expert parallelism needs a mixture-of-experts "
                          f"model; {model.name} is dense (leave --ep out)")  # fmt: skip
    check_moe_imbalance(space.moe_imbalance, model, "--moe-imbalance")  # once, not as every plan's error
    if space.moe_grouped_gemm and not model.is_moe:  # every plan would be refused, one by one
        raise ConfigError(f"--moe-grouped-gemm runs an MoE model's experts as grouped GEMMs; {model.name} is dense")
    check_param_gather_space(space)
    notes = search_notes(model, space)
    from trainsim.comm.registry import shadowed_note

    if (shadowed := shadowed_note(sys_spec)) is not None:  # a YAML copy of a catalog system, edited (as predict notes)
        notes.append(shadowed)
    from trainsim.kernels.rescaled import rescaled_note

    if (rescaled := rescaled_note(get_device(sys_spec.device))) is not None:  # an edited device copy (as predict)
        notes.append(rescaled)
    t0 = time.perf_counter()
    infeasible: Counter[str] = Counter()
    examples: dict[str, str] = {}  # reason -> its first full message (the reason drops numbers)

    def count(message: str) -> None:
        key = reason_key(message)
        infeasible[key] += 1
        examples.setdefault(key, message.removeprefix("plan: "))

    items: list[tuple[int, Plan]] = []
    for plan, why in space.plans(model, sys_spec.gpus_per_node):
        if plan is None:
            count(why)
        else:
            items.append((len(items), plan))
    enumerated = sum(infeasible.values()) + len(items)
    t1 = time.perf_counter()
    with _dask_client(scheduler, _say if progress else _quiet) if scheduler else nullcontext() as dask:
        _bar, tick, stop = _progress(len(items), progress)  # once the workers are there
        try:
            screened = _run_screening(model, sys_spec, items, workers=workers, dask=dask, tick=tick, memory_limit=limit)
        finally:
            stop()
    t2 = time.perf_counter()
    screened.sort(key=lambda s: s.index)  # in the order enumerated, however the chunks came back
    ok = []
    for s in screened:
        if s.error:
            count(s.error)
        elif not fits_within(s.memory_bytes, limit):
            count(MEMORY_REASON)
        else:
            ok.append(s)

    def obj(s: Screened) -> float:
        return _objective(objective, s.closed_form_s, items[s.index][1], model,
                          train_tokens=train_tokens, gpu_hour_price=gpu_hour_price)  # fmt: skip

    ok.sort(key=obj)
    ranked: list[dict[str, Any]] = []
    for s in ok[: max(simulate_top, top_k)]:
        plan = items[s.index][1]
        r = predict_llm(model, plan, sys_spec, coster=_coster(sys_spec.device))
        ranked.append({
            "plan": plan.label(), "plan_fields": {**asdict(plan), "seq_len": plan.seq(model)}, "iteration_time_s": r.iteration_time_s,
            # the keys predict has, with predict's types (a dict of both closed forms, the
            # provenance object), and the screening's own closed form beside them
            "closed_form_s": dict(r.closed_form_s), "screened_s": s.closed_form_s,
            "memory_per_gpu_bytes": r.peak_memory.total_bytes,
            "tokens_per_s": r.tokens_per_s, "mfu": r.mfu,
            "objective": _objective(objective, r.iteration_time_s, plan, model, train_tokens=train_tokens,
                                    gpu_hour_price=gpu_hour_price),
            "provenance": r.provenance,
        })  # fmt: skip
    ranked.sort(key=lambda d: d["objective"])
    t3 = time.perf_counter()
    if space.framework == "any" and (note := framework_note([d["plan_fields"] for d in ranked[:top_k]])):
        notes.append(note)
    return {
        "model": model.name, "system": sys_spec.name, "gpus": space.gpus, "global_batch": space.global_batch,
        "seq_len": space.seq_len or model.seq_len, "framework": space.framework, "notes": notes,
        "objective": objective, "memory_limit_bytes": limit,
        "objective_unit": objective_unit(objective, train_tokens=train_tokens, gpu_hour_price=gpu_hour_price),
        "plans": ranked[:top_k], "enumerated": enumerated, "evaluated": len(screened),
        "feasible": len(ok), "simulated": len(ranked), "infeasible": dict(infeasible.most_common()),
        "infeasible_examples": {k: examples[k] for k, _ in infeasible.most_common()},
        "timings_s": {"enumerate": t1 - t0, "screen": t2 - t1, "simulate": t3 - t2, "total": t3 - t0},
        "screened_per_min": len(screened) / max(t2 - t1, 1e-9) * 60.0,
    }  # fmt: skip


def search_notes(model: ModelSpec, space: PlanSpace) -> list[str]:
    """What the user should know of the space before reading the ranking (as predict's notes)."""
    from trainsim.builders.predict import MOE_BALANCED_NOTE, default_seq_note

    notes = [MOE_BALANCED_NOTE] if model.is_moe and space.moe_imbalance == 1.0 else []
    if model.is_moe and space.moe_imbalance != 1.0:
        notes.append(f"the busiest expert-parallel rank of every plan with ep > 1 is routed {space.moe_imbalance:g}x "
                     "the mean tokens (--moe-imbalance), whatever its ep; plans with ep 1 hold every expert on each "
                     "rank and keep the mean")  # fmt: skip
    if model.is_moe:  # the expert GEMM path changes which ep wins (few experts a rank: less loop)
        notes.append("every plan's experts run as Megatron-core's --moe-grouped-gemm (TransformerEngine's "
                     "GroupedLinear)" if space.moe_grouped_gemm else
                     "every plan's experts run as Megatron-core's SequentialMLP (its default: a Python loop over "
                     "each rank's local experts, which favours a higher ep); --moe-grouped-gemm ranks the plans "
                     "with TransformerEngine's grouped GEMMs")  # fmt: skip
    if space.seq_len == 0 and (note := default_seq_note(model)):
        notes.append(note)
    if space.attention == "flash" and {"none", "selective"} <= set(space.recompute):
        notes.append("selective recompute is not searched beside none with flash attention: flash keeps no "
                     "attention scores for it to drop, so it is the none plan's memory with more time")  # fmt: skip
    return notes


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _quiet(line: str) -> None:
    pass


def _progress(total: int, enabled: bool) -> tuple[Any, Callable[[int], None], Callable[[], None]]:
    if not enabled or not sys.stderr.isatty() or total == 0:
        return None, lambda n: None, lambda: None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    # on stderr: rich's default console is stdout, which --format json keeps for the document
    p = Progress(
        "screening", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), transient=True,
        console=Console(stderr=True),
    )
    task = p.add_task("screen", total=total)
    p.start()
    return p, lambda n: p.advance(task, n), p.stop
