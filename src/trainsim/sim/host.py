"""The host side of an op for the simulator: its runtime calls, and the T1–T5 statistics
that time them (002 §4.3.3, Fig. 4.6, Alg. 3).

- ``TRACE``: the measured gaps of this trace (op start relative to the previous op's end on its
  thread, runtime calls at their measured offsets, measured call durations);
- ``STATS``/``SHARED``: per-op-name means from an :class:`OverheadDB` (with its global fallback):
  T1 before the op, T2 before its first runtime call, T4 per call, T5 between calls, T3 after
  the last one; an op without runtime calls takes its mean CPU duration (plus the change a
  pass such as ``sim.resize`` predicted, when one set its ``predicted_s``).

A runtime call is a kernel launch (kernels launched by one call share it: a CUDA/HIP graph)
or a sync call. ``timings.py`` applies the gaps to every op at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter

from trainsim.errors import ConfigError
from trainsim.host.overheads import Overhead, OverheadDB
from trainsim.ir.graph import Kernel, Op, SyncPoint
from trainsim.ir.kinds import KernelFamily
from trainsim.sim.options import HostMode
from trainsim.sim.syncs import TOLERANCE_S

_KINDS = (Overhead.T1, Overhead.T2, Overhead.T3, Overhead.T4, Overhead.T5, Overhead.CPU)


# One runtime call of an op: (issue key, measured start, measured duration, the kernels it
# launched, the sync it made). The issue key orders calls within a rank (the measured start
# when every call has one). The simulator keeps calls as columns (``RankProgram.call_*``).
CallSpec = tuple[float, float | None, float | None, tuple[Kernel, ...], SyncPoint | None]


def blocks_cpu_copy(
    kernels: Sequence[Kernel], start_s: float | None, duration_s: float | None
) -> bool:
    """A copy whose runtime call holds the CPU until the copy is done.

    cudaMemcpy(Async) to pageable host memory always does; from pageable memory it does
    when the data cannot be staged at once — visible in a trace as a call still running
    after its copy started.
    """
    for k in kernels:
        if k.family is not KernelFamily.MEMCPY:
            continue
        if "DtoH" in k.name and "Pageable" in k.name:
            return True
        if (
            start_s is not None
            and duration_s is not None
            and k.start_s is not None
            and start_s + duration_s > k.start_s + TOLERANCE_S
        ):
            return True
    return False


def op_calls(op: Op, *, timed: bool, counter: list[int]) -> list[CallSpec]:
    """The op's runtime calls in issue order.

    ``timed``: every call of the rank has a measured start, which orders them (kernels with
    one launch start share one call). Otherwise the order is structural — event waits first
    (they order the kernels that follow), then the kernels in their tuple order, then blocking
    syncs (they wait for the work just issued) — keyed by ``counter``.
    """
    calls: list[CallSpec] = []
    if timed:
        kernels = op.kernels
        if len(kernels) == 1:
            k = kernels[0]
            assert k.launch_start_s is not None
            calls.append((k.launch_start_s, k.launch_start_s, k.launch_duration_s, kernels, None))
        elif kernels:
            by_start: dict[float, list[Kernel]] = {}
            for k in kernels:
                assert k.launch_start_s is not None
                got = by_start.get(k.launch_start_s)
                if got is None:
                    by_start[k.launch_start_s] = [k]
                else:
                    got.append(k)
            for t, ks in by_start.items():
                calls.append((t, t, ks[0].launch_duration_s, tuple(ks), None))
        for s in op.syncs:
            assert s.start_s is not None
            calls.append((s.start_s, s.start_s, s.duration_s, (), s))
        if len(calls) > 1:
            calls.sort(key=itemgetter(0))
        return calls
    for s in op.syncs:
        if not s.kind.blocks_cpu:
            counter[0] += 1
            calls.append((float(counter[0]), s.start_s, s.duration_s, (), s))
    for k in op.kernels:
        counter[0] += 1
        calls.append((float(counter[0]), k.launch_start_s, k.launch_duration_s, (k,), None))
    for s in op.syncs:
        if s.kind.blocks_cpu:
            counter[0] += 1
            calls.append((float(counter[0]), s.start_s, s.duration_s, (), s))
    return calls


class HostModel:
    """The T1–T5 statistics of one host mode, per op name (``timings.py`` applies them; in
    ``TRACE`` mode it replays the measured gaps instead).

    Statistics come from ``db`` (``SHARED``, or ``STATS`` with a given database) or from
    ``means`` = (per op name (T1, T2, T3, T4, T5, CPU), global means) of the workload itself.
    ``entry_gap_s``: the gap before a thread's first op, when known (self statistics);
    otherwise that op's T1 is used. ``blocking_s``: the own duration of a blocking call that
    does not wait (default: the database's global median T4).
    """

    def __init__(
        self,
        mode: HostMode,
        db: OverheadDB | None = None,
        *,
        means: tuple[dict[str, tuple[float, ...]], tuple[float, ...]] | None = None,
        entry_gap_s: float | None = None,
        blocking_s: float | None = None,
    ) -> None:
        if mode is not HostMode.TRACE and db is None and means is None:
            raise ConfigError(f"host mode {mode.value} needs an overhead database")
        self.mode = mode
        self.entry_gap_s = entry_gap_s
        self._cache: dict[str, tuple[float, ...]] = {}
        self._global: tuple[float, ...] = (0.0,) * 6
        if means is not None:
            self._cache, self._global = dict(means[0]), means[1]
        elif db is not None:
            self._db = db
            self._global = tuple(db.lookup("", k) for k in _KINDS)
            t4 = db.global_.get(Overhead.T4)
            if blocking_s is None and t4 is not None:
                blocking_s = t4.median_s
        self._blocking_s = self._global[3] if blocking_s is None else blocking_s

    @property
    def cached_stats(self) -> dict[str, tuple[float, ...]]:
        """The per-name cache behind :meth:`op_stats` (read it first in hot loops)."""
        return self._cache

    def op_stats(self, name: str) -> tuple[float, ...]:
        """(T1, T2, T3, T4, T5, CPU) means of an op name (cached lookups with fallbacks)."""
        got = self._cache.get(name)
        if got is None:
            if hasattr(self, "_db"):
                got = tuple(self._db.lookup(name, k) for k in _KINDS)
            else:
                got = self._global
            self._cache[name] = got
        return got

    def blocking_call_duration(self) -> float:
        """Own duration of a blocking call (when it does not wait): the typical (median)
        runtime-call duration.

        Per-op T4 would be wrong here: it is dominated by the op's non-blocking launches, and
        where an op's only call blocks, its samples include the waiting. The global *mean* is
        no better: one-time costs (a first launch loading a code module) dominate it.
        """
        return self._blocking_s
