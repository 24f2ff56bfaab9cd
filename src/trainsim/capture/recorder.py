"""Record one rank's traces of a training step, in two separate runs of the same process:

1. Kineto only (``torch.profiler.profile`` with a ``schedule``, ``record_shapes=True``): the
   timing run. Traced steps carry ``ProfilerStep#N`` markers; per-step wall times are measured
   here because the execution-trace observer slows the host side down severalfold.
2. Execution trace only (``ExecutionTraceObserver``) of as many steps, each wrapped in a
   ``ProfilerStep#N`` record_function so that the ET is cut into the same steps.

The caller owns the process group (if any); this module only wraps the model in DDP when the
world has more than one rank.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import torch
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, record_function
from torch.profiler import schedule as profiler_schedule

from trainsim.capture.examples import TrainingStep, example_info
from trainsim.capture.manifest import CaptureSpec, RankCapture, et_name, kineto_name
from trainsim.errors import CaptureError


def _device_for(spec: CaptureSpec, rank: int) -> str:
    if spec.device != "cuda":
        return "cpu"
    torch.cuda.set_device(rank % torch.cuda.device_count())
    return f"cuda:{torch.cuda.current_device()}"


def _make_step(spec: CaptureSpec, *, rank: int, world_size: int) -> Callable[[], None]:
    device = _device_for(spec, rank)
    example: TrainingStep = example_info(spec.model).build(
        batch_size=spec.batch_size or example_info(spec.model).default_batch_size,
        device=device,
        seed=spec.seed + rank,
        seq_len=spec.seq_len,
        hidden=spec.hidden,
        heads=spec.heads,
    )
    module: torch.nn.Module = example.model
    if world_size > 1:
        from torch.nn.parallel import DistributedDataParallel

        ids = [torch.cuda.current_device()] if spec.device == "cuda" else None
        module = DistributedDataParallel(module, device_ids=ids)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01)
    sync = torch.cuda.synchronize if spec.device == "cuda" else (lambda: None)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = example.loss(module, example.batch)
        loss.backward()
        optimizer.step()
        sync()

    return step


def _timed(step: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def _tmp_beside(path: Path) -> Path:
    # The suffix keeps half-written files out of trace loaders (they read *.json only).
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def _record_kineto(spec: CaptureSpec, step: Callable[[], None], path: Path) -> list[float]:
    activities = [ProfilerActivity.CPU]
    if spec.device == "cuda":
        activities.append(ProfilerActivity.CUDA)
    wait = spec.warmup_steps - 1  # the profiler's own warm-up needs one step
    sched = profiler_schedule(wait=wait, warmup=1, active=spec.steps, repeat=1)
    tmp = _tmp_beside(path)

    def export(prof: profile) -> None:
        prof.export_chrome_trace(str(tmp))
        os.replace(tmp, path)

    times: list[float] = []
    with profile(
        activities=activities, schedule=sched, on_trace_ready=export, record_shapes=True
    ) as prof:
        for i in range(spec.warmup_steps + spec.steps):
            dt = _timed(step)
            if i >= spec.warmup_steps:
                times.append(dt)
            prof.step()
    if not path.exists():
        raise CaptureError(f"the profiler wrote no Kineto trace to {path}")
    return times


def _drain_collectives(spec: CaptureSpec) -> None:
    """Return once every collective this rank started has ended, its record function included.

    gloo completes a collective's future (what DDP waits on) *before* it ends the collective's
    record function on its worker thread (``ProcessGroupGloo::AsyncWork::finishWorkGloo``). The
    execution-trace observer's end callback there holds a raw pointer to the observer
    (pytorch/pytorch#180086), so removing the observer while that callback runs crashes the
    rank: SIGSEGV in about 1 two-rank capture in 130 here. A barrier waits for all prior work
    to finish, callbacks and all; the observer is stopped first so the barrier is not recorded.
    """
    if spec.device == "cuda":
        torch.cuda.synchronize()
        torch.distributed.barrier(device_ids=[torch.cuda.current_device()])
    else:
        torch.distributed.barrier()


_FAILED_OBSERVERS: list[ExecutionTraceObserver] = []


@contextlib.contextmanager
def _execution_trace(path: Path, *, drain: Callable[[], None] | None = None) -> Iterator[None]:
    """Record an execution trace to ``path`` around the body. ``drain`` (a rank of several:
    :func:`_drain_collectives`) runs between stopping the observer and removing it; when the
    body fails there, the observer is only stopped, never freed: its collectives may still be
    running callbacks on it, and the process is about to exit with the body's traceback."""
    tmp = _tmp_beside(path)
    observer = ExecutionTraceObserver().register_callback(str(tmp))
    finished = False
    try:
        observer.start()
        yield
        observer.stop()
        if drain is not None:
            drain()
        finished = True
    finally:
        if finished or drain is None:
            observer.unregister_callback()  # stops and finalizes the JSON document
        else:
            observer.stop()
            _FAILED_OBSERVERS.append(observer)  # its __del__ would remove (free) it: kept till exit
        if not finished:
            tmp.unlink(missing_ok=True)
    os.replace(tmp, path)


def _record_et(
    spec: CaptureSpec, step: Callable[[], None], path: Path, *, first_step: int, world_size: int
) -> list[float]:
    times: list[float] = []
    with _execution_trace(path, drain=partial(_drain_collectives, spec) if world_size > 1 else None):
        for i in range(spec.steps):
            with record_function(f"ProfilerStep#{first_step + i}"):
                times.append(_timed(step))
    return times


def record_rank(spec: CaptureSpec, *, rank: int, world_size: int) -> RankCapture:
    """Run the warm-up, Kineto and ET passes for ``rank``; write both traces to ``out_dir``."""
    out = Path(spec.out_dir)
    step = _make_step(spec, rank=rank, world_size=world_size)
    kineto_path, et_path = out / kineto_name(rank), out / et_name(rank)
    times = _record_kineto(spec, step, kineto_path)
    et_times = _record_et(
        spec, step, et_path, first_step=spec.warmup_steps + spec.steps, world_size=world_size
    )
    return RankCapture(
        rank=rank, kineto_file=kineto_path.name, et_file=et_path.name,
        step_times_s=tuple(times), et_step_times_s=tuple(et_times),
    )  # fmt: skip
