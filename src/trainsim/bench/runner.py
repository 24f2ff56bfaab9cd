"""The micro-benchmark runner: warm-up/repeat schedule, timers, and resumable sweeps.

Schedule (001 §III-A, 002 §4.3.2): build the case (allocation and the first forward are not
timed); warm up for at least ``warmup`` calls and ``min_warmup_s``; then time ``repeats``
repeats, a repeat being ``inner`` back-to-back calls with ``inner`` chosen from the fastest
warm-up call so that one repeat lasts about ``min_repeat_s`` (a µs op is timed over many calls,
a 10 ms op once). While the repeats' spread ((p75 − p25) / median) exceeds ``target_spread``,
more repeats are taken, up to ``max_repeats`` and ``max_case_s`` (as
``torch.utils.benchmark``'s ``adaptive_autorange``). A row keeps every repeat's per-call time
and their median. On CUDA, a repeat is one replay of a CUDA graph that holds ``inner`` calls
(captured on the timer's own stream after warm-up), timed with CUDA events: the row is the device time
of the op's kernels, as a Kineto trace shows them, not the host's launch rate (an eager loop of
a 3 µs kernel whose autograd call costs 40 µs of Python would time the Python). A case whose
calls cannot be captured (a host sync inside) falls back to events around eager calls, and its
row says so (``timer``: ``cuda_graph`` or ``cuda_event``). Before a CUDA sweep the GPU is kept
busy for about a second so that its clocks have left idle. On CPU, repeats are timed with
``time.perf_counter``, each repeat started right after ``sched_yield`` so that a short repeat
rarely spans a preemption on a shared machine. Rows record the load average: on a machine
shared with other jobs, contention is the main source of repeat-to-repeat noise.

Sweeps are resumable and crash-safe: rows are appended one ``write`` + ``fsync`` at a time
(:func:`trainsim.bench.dataset.append_row`); before a sweep starts, a torn last line left by a
crash is cut off and the keys already present for this device fingerprint and thread count are
skipped. An exclusive ``flock`` on the dataset keeps two sweeps from writing the same file.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainsim.bench.dataset import (
    KERNEL_BENCH_SCHEMA,
    append_row,
    check_appendable,
    iter_rows,
    repair_tail,
    sweep_lock,
)
from trainsim.bench.suites.base import DTYPE_LABEL, Case, Timed
from trainsim.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Schedule:
    """How each case is timed (see the module docstring)."""

    warmup: int = 5  # calls, at least ...
    min_warmup_s: float = 0.05  # ... and at least this long
    repeats: int = 15  # first batch of repeats
    max_repeats: int = 45  # more while the spread exceeds target_spread ...
    target_spread: float = 0.03  # (p75 − p25) / median of the repeats
    max_case_s: float = 3.0  # ... and this case has been timed for less than this
    min_repeat_s: float = 1e-3  # short: a repeat rarely spans a preemption on a shared machine
    max_inner: int = 1000
    quick: bool = False  # the --quick schedule (rows say so: a full sweep reuses them)

    @classmethod
    def for_run(cls, *, quick: bool, cuda: bool = False) -> Schedule:
        if cuda:  # graph replays on an otherwise idle GPU: repeats agree to ~1 %
            return cls(warmup=3, min_warmup_s=0.005, repeats=7 if quick else 9, max_repeats=25,
                       target_spread=0.02, max_case_s=0.5 if quick else 1.0, min_repeat_s=1e-3,
                       max_inner=200 if quick else 500, quick=quick)  # fmt: skip
        if quick:
            return cls(warmup=2, min_warmup_s=0.01, repeats=7, max_repeats=15, target_spread=0.05,
                       max_case_s=1.0, min_repeat_s=5e-4, max_inner=300, quick=True)  # fmt: skip
        return cls()


@dataclass(frozen=True, slots=True)
class Timing:
    times_s: tuple[float, ...]  # per-call seconds of each repeat
    inner: int
    timer: str

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)


def _yield() -> None:
    sched_yield = getattr(os, "sched_yield", None)
    if sched_yield is not None:
        sched_yield()


class CpuTimer:
    name = "perf_counter"

    def total_s(self, fn: Timed, calls: int) -> float:
        _yield()  # start on a fresh time slice: a short repeat then rarely spans a preemption
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return time.perf_counter() - t0


class CudaGraphTimer:
    """Device time of ``calls`` calls replayed from one CUDA graph, between two CUDA events.

    One graph is captured per (case, call count) and kept until :meth:`release`; a case whose
    calls cannot be captured is timed with the events around eager calls, and :attr:`name`
    says so (``cuda_event``).
    """

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)
        self._fn: Timed | None = None
        self._graphs: dict[int, Any] = {}
        self._eager = False
        self.name = "cuda_graph"
        # Cases are built, warmed up, captured and timed on this stream: autograd runs a
        # backward on the stream its forward ran on, so a backward captured on another stream
        # would launch outside the capture.
        self._stream = torch.cuda.Stream()

    def stream(self) -> Any:
        """The context in which a case is built and timed."""
        return self._torch.cuda.stream(self._stream)

    def release(self) -> None:
        """Drop the graphs (and with them the case's memory pool)."""
        self._fn, self._graphs, self._eager, self.name = None, {}, False, "cuda_graph"

    def _capture(self, fn: Timed, calls: int) -> Any:
        torch = self._torch
        with torch.cuda.stream(self._stream):
            for _ in range(2):  # warm-up outside the capture (lazy handles, workspaces)
                fn()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=self._stream):
                for _ in range(calls):
                    fn()
        return graph

    def _recover(self) -> None:
        """After a failed capture: a capture that raises leaves the default CUDA generator in
        capture mode (every later random op then fails); an empty capture ends it cleanly."""
        torch = self._torch
        with contextlib.suppress(RuntimeError):
            torch.cuda.synchronize()
        with (contextlib.suppress(RuntimeError), torch.cuda.stream(self._stream),
              torch.cuda.graph(torch.cuda.CUDAGraph(), stream=self._stream)):  # fmt: skip
            pass
        torch.cuda.synchronize()

    def total_s(self, fn: Timed, calls: int) -> float:
        torch = self._torch
        if fn is not self._fn:
            self.release()
            self._fn = fn
        graph = None
        if not self._eager:
            graph = self._graphs.get(calls)
            if graph is None:
                try:
                    graph = self._graphs[calls] = self._capture(fn, calls)
                except (RuntimeError, ValueError, TypeError, NotImplementedError):
                    self._recover()
                    self._graphs, self._eager, self.name, graph = {}, True, "cuda_event", None
        torch.cuda.synchronize()
        self._start.record(self._stream)
        if graph is not None:
            graph.replay()
        else:
            for _ in range(calls):
                fn()
        self._end.record(self._stream)
        self._end.synchronize()
        return float(self._start.elapsed_time(self._end)) / 1e3


def spin_up_gpu(seconds: float = 1.0) -> None:
    """Keep the GPU busy for about ``seconds`` (bf16 products) so that its clocks leave idle
    before the first timed case (the lent H100 read 345 MHz on the SM clock idle, 1,980 under load)."""
    import torch

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def time_call(fn: Timed, *, schedule: Schedule, timer: CpuTimer | CudaGraphTimer) -> Timing:
    """Warm up, pick ``inner``, time ``repeats`` repeats of ``inner`` calls, then keep adding
    repeats while their spread exceeds ``target_spread`` (within ``max_repeats`` and
    ``max_case_s``), as ``torch.utils.benchmark``'s adaptive_autorange does."""
    from trainsim.bench.dataset import relative_iqr

    start = time.perf_counter()
    warm: list[float] = []
    while len(warm) < max(schedule.warmup, 1) or (
        sum(warm) < schedule.min_warmup_s and len(warm) < schedule.max_inner
    ):
        warm.append(timer.total_s(fn, 1))
    per_call = min(warm[1:] or warm)  # the first call pays one-off set-up
    inner = 1
    if per_call < schedule.min_repeat_s:
        inner = min(schedule.max_inner, math.ceil(schedule.min_repeat_s / max(per_call, 1e-9)))
    times = [timer.total_s(fn, inner) / inner for _ in range(schedule.repeats)]
    while (
        len(times) < schedule.max_repeats
        and relative_iqr(times) > schedule.target_spread
        and time.perf_counter() - start < schedule.max_case_s
    ):
        times.append(timer.total_s(fn, inner) / inner)
    return Timing(tuple(times), inner, timer.name)  # read last: a graph timer may fall back


@dataclass(frozen=True, slots=True)
class SweepPlan:
    """What a sweep is about to do, once the dataset's rows are known (before the first case)."""

    cases: int  # cases asked for
    pending: int  # to measure now
    reused: int  # already in the dataset for this fingerprint and thread count (resume)
    reused_quick: int = 0  # of those, cases a --quick sweep measured, when this sweep is a full one


@dataclass(frozen=True, slots=True)
class SweepResult:
    dataset: Path
    samples: int  # rows written by this run
    skipped: int  # cases already in the dataset (resume)
    failed: tuple[tuple[str, str], ...]  # (case key, first line of the error)
    device: str  # device name (CPU model or GPU name)
    fingerprint: str
    wall_s: float
    per_suite: dict[str, int] = field(default_factory=dict)  # rows written per suite
    reused_quick: int = 0  # skipped cases a --quick sweep measured, when this sweep is a full one


def _sig(x: float, digits: int = 4) -> float:
    """Rounded to ``digits`` significant digits: far below the repeat-to-repeat noise, short rows."""
    return float(f"{x:.{digits}g}")


def done_keys(path: Path, fingerprint: str, threads: int | None) -> set[str]:
    """Keys of rows already in ``path`` for this fingerprint and thread count."""
    return set(_done(path, fingerprint, threads))


def _done(path: Path, fingerprint: str, threads: int | None) -> dict[str, bool]:
    """Key → whether only --quick sweeps measured it, for the rows already in ``path`` for this
    fingerprint and thread count."""
    done: dict[str, bool] = {}
    if path.exists():
        for r in iter_rows(path):
            if "key" in r and r.get("fingerprint") == fingerprint and r.get("threads") == threads:
                key = str(r["key"])
                done[key] = done.get(key, True) and measured_quick(r)
    return done


def measured_quick(row: dict[str, Any]) -> bool:
    """Whether a dataset row was measured with the --quick schedule: its ``quick`` field, or,
    for rows written before the field, the schedule where the two differ (CPU: 2 warm-up calls
    against 5; CUDA: fewer repeats than the 9 a full sweep starts with, so a quick CUDA row that
    took 9 or more is not recognised)."""
    if "quick" in row:
        return bool(row["quick"])
    cuda = row.get("device_kind") == "cuda"
    quick, full = Schedule.for_run(quick=True, cuda=cuda), Schedule.for_run(quick=False, cuda=cuda)
    if cuda:
        return int(row.get("repeats", full.repeats)) < full.repeats
    return row.get("warmup") == quick.warmup != full.warmup


def _row(case: Case, t: Timing, *, schedule: Schedule, env: dict[str, Any]) -> dict[str, Any]:
    """A row in :mod:`trainsim.kernels.readers`' format plus the runner's own fields."""
    features = {k: _int_if_whole(v) for k, v in case.features}
    params = dict(case.params)
    row = {
        "schema": KERNEL_BENCH_SCHEMA, "device": env["device"], "fingerprint": env["fingerprint"],
        "family": case.family.value, "op": case.model_op, "phase": case.phase.value,
        "dtype": DTYPE_LABEL[case.dtype], "features": features, "duration_s": _sig(t.median_s),
        "repeats": len(t.times_s), "statistic": "median", "samples_s": [_sig(x, 3) for x in t.times_s],
        "key": case.key, "suite": case.suite, "bench_op": case.op,
        "shapes": [list(s) for s in case.shapes], "flops": case.flops, "bytes": case.bytes,
        "inner": t.inner, "warmup": schedule.warmup, "quick": schedule.quick, "timer": t.timer,
        "device_kind": env["device_kind"], "threads": env["threads"], "load_1m": _load_1m(),
        "versions": env["versions"],
        "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }  # fmt: skip
    if params != features:
        row["params"] = params
    return row


def _load_1m() -> float | None:
    """The machine's 1-minute load average when the row was measured (contention shows here)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _int_if_whole(v: float) -> float | int:
    return int(v) if float(v).is_integer() else v


def _environment(device: str, threads: int | None) -> tuple[dict[str, Any], Any, Any]:
    """(row fields describing the machine, torch device, timer); sets the thread count."""
    import torch

    from trainsim.bench.comm import device_fingerprint

    if device not in ("cpu", "cuda"):
        raise ConfigError(f"--device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible to torch")
    if threads is not None:
        if threads < 1:
            raise ConfigError(f"--threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)
    fp = device_fingerprint(device)
    versions = {k: v for k, v in fp["versions"].items() if v}
    env = {"device": fp["gpu"] or fp["cpu"], "device_kind": device, "fingerprint": fp["id"],
           "threads": torch.get_num_threads(), "versions": versions}  # fmt: skip
    if device == "cuda":
        spin_up_gpu()
    timer = CudaGraphTimer() if device == "cuda" else CpuTimer()
    return env, torch.device(device), timer


def _progress(enabled: bool, total: int) -> Any:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TimeRemainingColumn(),
        console=Console(stderr=True), disable=not enabled or total == 0,
    )  # fmt: skip


def measure(case: Case, *, device: Any, schedule: Schedule, timer: Any) -> Timing:
    """Build ``case`` on ``device`` and time it (a fixed seed makes the inputs reproducible)."""
    import torch

    stream = getattr(timer, "stream", None)  # a CUDA graph timer's stream
    with stream() if stream is not None else contextlib.nullcontext():
        torch.manual_seed(0)
        fn = case.build(device)
        try:
            return time_call(fn, schedule=schedule, timer=timer)
        finally:
            release = getattr(timer, "release", None)
            if release is not None:
                release()
            del fn  # no gc.collect(): it costs ~0.1 s a case; the inputs are freed by refcount


def run_sweep(
    dataset: str | Path,
    cases: Iterable[Case],
    *,
    device: str = "cpu",
    schedule: Schedule | None = None,
    resume: bool = True,
    threads: int | None = None,
    progress: bool = True,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    on_start: Callable[[SweepPlan], None] | None = None,
) -> SweepResult:
    """Measure every case not yet in ``dataset`` and append one row per case.

    ``on_start`` is told how many cases are left and how many are reused before the first is
    measured (the CLI's start line: on a resume most cases may be in the dataset already).
    A case that raises (unsupported dtype, out of memory) is reported in ``failed`` and the sweep
    goes on; it is retried by the next resumed run.
    """
    schedule = schedule or Schedule()
    from trainsim.ir.serialize import output_path

    env, dev, timer = _environment(device, threads)  # refuses a device torch cannot see: no folder made
    path = output_path(dataset)  # a folder, or a file where a folder should be: one line
    todo = list(cases)
    t0 = time.perf_counter()
    written: Counter[str] = Counter()
    failed: list[tuple[str, str]] = []
    check_appendable(path, KERNEL_BENCH_SCHEMA, "a trainsim bench dataset")  # before its tail is repaired
    with sweep_lock(path):
        repair_tail(path)
        done = _done(path, env["fingerprint"], env["threads"]) if resume else {}
        pending, quick_rows = [], 0
        for c in todo:
            if c.key not in done:
                done[c.key] = False  # a case listed twice is measured once
                pending.append(c)
            elif done[c.key] and not schedule.quick:  # a full sweep takes a quick sweep's row
                done[c.key] = False  # counted once
                quick_rows += 1
        plan = SweepPlan(cases=len(todo), pending=len(pending), reused=len(todo) - len(pending),
                         reused_quick=quick_rows)  # fmt: skip
        if on_start is not None:
            on_start(plan)
        with _progress(progress, len(pending)) as bar, _interrupt_note(path, written, len(pending), resume):
            task = bar.add_task("benchmark", total=len(pending))
            for case in pending:
                bar.update(task, description=f"{case.suite}/{case.op} {case.phase.value}")
                try:
                    timing = measure(case, device=dev, schedule=schedule, timer=timer)
                except (RuntimeError, ValueError, TypeError, NotImplementedError) as e:
                    failed.append(
                        (case.key, (str(e).strip().splitlines() or [type(e).__name__])[0])
                    )
                else:
                    row = _row(case, timing, schedule=schedule, env=env)
                    append_row(path, row)
                    written[case.suite] += 1
                    if on_row is not None:
                        on_row(row)
                bar.advance(task)
    return SweepResult(
        dataset=path, samples=sum(written.values()), skipped=len(todo) - len(pending),
        failed=tuple(failed), device=env["device"], fingerprint=env["fingerprint"],
        wall_s=time.perf_counter() - t0, per_suite=dict(written), reused_quick=plan.reused_quick,
    )  # fmt: skip


@contextlib.contextmanager
def _interrupt_note(path: Path, written: Counter[str], pending: int, resume: bool) -> Iterator[None]:
    """On Ctrl-C, one line: what the dataset kept and how to go on; then the interrupt goes on."""
    import sys

    try:
        yield
    except KeyboardInterrupt:
        n = sum(written.values())
        how = ("rerun the same command to measure the rest" if resume else
               "rerun it with --resume (not --no-resume) to measure the rest")  # fmt: skip
        print(f"[bench] interrupted: {n} of this run's {pending} cases are in {path} (each row is written as it is "
              f"measured); {how}", file=sys.stderr, flush=True)  # fmt: skip
        raise


__all__ = [
    "CpuTimer",
    "CudaGraphTimer",
    "Schedule",
    "SweepPlan",
    "SweepResult",
    "Timing",
    "done_keys",
    "measure",
    "measured_quick",
    "run_sweep",
    "time_call",
]
