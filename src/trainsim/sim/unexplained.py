"""Device waits a trace does not explain: can a step be replayed from its trace at all?

Replayed with the trace's own host gaps (``HostMode.TRACE``, measured kernels), every kernel
starts exactly when it did. Each kernel's start is compared with the earliest start its
*traced causes* allow: its runtime call (start, measured duration, then the rank's typical
launch latency), its stream (the previous kernel's end, or the previous step's backlog, plus
the typical kernel-kernel gap), the kernels it waits for (event waits, ``Op.deps``) and 000
§III-D's intra-rank bound. Kernels launched by a CUDA/HIP graph also follow the graph's
internal schedule (``RankProgram.k_hold``: time in nodes the trace does not record), which is
replayed as measured device time and reported apart. What is left — waits on peers absent
from the input, on untraced work, on the driver — no host statistic can reproduce; ``trace``
mode does only because it replays every kernel's own delay.

Two figures (``explain``):

- **unexplained wait** (per rank): time the device sat idle (no kernel on any stream) while
  some kernel had been allowed to start by all its traced causes and had not;
- **unexplained step**: how much shorter the step is when the trace is replayed with every
  kernel starting as soon as its traced causes allow (the same replay, delays capped at the
  typical ones). Only waits on the critical path count here, so this is what bounds the error
  of any replay from the trace: the first figure also counts idle time off the critical path
  (a rank waiting for a collective while its compute stream is busy with queued work that is
  itself late for another reason).

Typical launch latencies and gaps are the rank's medians, so a little of every launch-bound
trace counts in both (≤ 0.6 % of the step on the real traces of ``validate replay``).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainsim.sim.options import HostMode, KernelSource, SimOptions
from trainsim.sim.timings import ALG3_GAP_S, MEMORY_FAMILIES

if TYPE_CHECKING:
    from trainsim.ir.graph import Workload
    from trainsim.sim.engine import RankTimes
    from trainsim.sim.program import RankProgram
    from trainsim.sim.result import SimResult

Interval = tuple[float, float]


@dataclass(frozen=True, slots=True)
class RankWait:
    """One rank's device idle time that its traced causes leave open (seconds)."""

    rank: int
    unexplained_s: float  # device idle while a kernel waited beyond every traced cause
    graph_internal_s: float  # device idle inside CUDA/HIP graph launches (replayed as measured)
    largest: tuple[tuple[str, float, float], ...]  # (kernel, start_s, device idle it waited)

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "unexplained_wait_s": self.unexplained_s,
                "graph_internal_wait_s": self.graph_internal_s,
                "largest": [{"kernel": n, "start_s": s, "wait_s": w} for n, s, w in self.largest]}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Explanation:
    """How much of a traced step its traced causes explain."""

    trace_step_s: float  # replayed with the trace's own delays (= the measured step)
    explained_step_s: float  # replayed with every kernel as early as its traced causes allow
    ranks: tuple[RankWait, ...]

    @property
    def unexplained_step_s(self) -> float:
        return self.trace_step_s - self.explained_step_s

    @property
    def unexplained_wait_s(self) -> float:
        """The largest per-rank unexplained wait."""
        return max((r.unexplained_s for r in self.ranks), default=0.0)

    @property
    def graph_internal_wait_s(self) -> float:
        return max((r.graph_internal_s for r in self.ranks), default=0.0)

    def largest(self) -> tuple[str, float, float] | None:
        items = [i for r in self.ranks for i in r.largest]
        return max(items, key=lambda x: x[2], default=None)


def explain(workload: Workload, *, trace_result: SimResult | None = None) -> Explanation:
    """Replay ``workload`` with its own delays and with traced causes only; compare.
    ``trace_result``: a trace-mode replay with measured kernels already at hand."""
    from trainsim.errors import ConfigError

    opts = SimOptions(overheads=HostMode.TRACE, kernels=KernelSource.MEASURED)
    if trace_result is None:
        from trainsim.sim import simulate

        trace_result = simulate(workload, opts)
    o = trace_result.options
    if o.overheads is not HostMode.TRACE or o.kernels is not KernelSource.MEASURED:
        raise ConfigError(
            "unexplained waits are defined on a replay with the trace's own host gaps and "
            "measured kernels (HostMode.TRACE, KernelSource.MEASURED)"
        )
    return Explanation(
        trace_result.predicted_step_s,
        _explained_replay(workload, opts).predicted_step_s,
        device_waits(trace_result),
    )


def device_waits(result: SimResult, *, largest: int = 5) -> tuple[RankWait, ...]:
    """Per rank, the unexplained and graph-internal device waits of a trace-mode replay;
    ``largest``: how many kernels to name (those whose unexplained wait idled the device
    longest)."""
    out = []
    for ri, rp in enumerate(result.program.ranks):
        t = result.evaluation.times[ri]
        window = (result.ranks[ri].start_s, result.ranks[ri].end_s)
        wait, graph, items = _rank_waits(rp, t)
        busy = _Busy(_union(list(zip(t.k_start, t.k_end, strict=True))))
        named = sorted(
            ((name, start, busy.idle_within(lo, start, window)) for name, lo, start in items),
            key=lambda x: -x[2],
        )
        out.append(
            RankWait(
                rp.graph.rank,
                busy.idle_measure(_union(wait), window),
                busy.idle_measure(_union(graph), window),
                tuple(x for x in named[:largest] if x[2] > 0.0),
            )
        )
    return tuple(out)


def _explained_replay(workload: Workload, opts: SimOptions) -> SimResult:
    """The trace-mode replay with every kernel's launch latency and kernel-kernel gap capped at
    the typical ones (plus its graph-internal hold)."""
    from trainsim.sim import simulate_program
    from trainsim.sim.program import compile_workload

    program = compile_workload(workload, opts)
    for rp in program.ranks:
        k_lat, k_gap, hold = rp.k_lat, rp.k_gap, rp.k_hold
        for k in range(len(rp.kernels)):
            h = hold.get(k, 0.0)
            k_lat[k] = min(k_lat[k], _typical_latency(rp, k) + h)
            k_gap[k] = min(k_gap[k], _typical_gap(rp, k) + h)
    return simulate_program(program)


def _typical_latency(rp: RankProgram, k: int) -> float:
    """From the call's start: its measured duration, then the rank's typical latency (a
    blocking call's duration is mostly waiting: the latency alone)."""
    post = rp.typical_post_s.get(rp.kernels[k].family in MEMORY_FAMILIES)
    ci = rp.k_call[k]
    dur = rp.call_dur_m[ci]
    if rp.call_block[ci] is not None or dur is None:
        return max(0.0, post or 0.0)
    return max(0.0, dur + post) if post is not None else dur / 2


def _typical_gap(rp: RankProgram, k: int) -> float:
    gap = rp.typical_gap_s.get(rp.kernels[k].family in MEMORY_FAMILIES)
    return gap if gap is not None else ALG3_GAP_S


def _rank_waits(
    rp: RankProgram, t: RankTimes
) -> tuple[list[Interval], list[Interval], list[tuple[str, float, float]]]:
    """Unexplained and graph-internal wait intervals of one rank's kernels, and per late
    kernel (name, allowed start, start)."""
    wait: list[Interval] = []
    graph: list[Interval] = []
    items: list[tuple[str, float, float]] = []
    call_start, k_start, k_end = t.call_start, t.k_start, t.k_end
    for lane, ks in enumerate(rp.stream_lanes):
        prev_end = rp.lane_busy_until[lane]
        for k in ks:
            ready = prev_end
            for w in rp.k_waits[k]:
                e = k_end[w]
                if ready is None or e > ready:
                    ready = e
            allowed = call_start[rp.k_call[k]] + _typical_latency(rp, k)
            if ready is not None:
                allowed = max(allowed, ready + _typical_gap(rp, k))
            for a in rp.k_after[k]:
                allowed = max(allowed, k_start[a])
            hold = rp.k_hold.get(k, 0.0)
            if hold > 0.0:
                graph.append((allowed, allowed + hold))
                allowed += hold
            start = k_start[k]
            if start > allowed:
                wait.append((allowed, start))
                items.append((rp.kernels[k].name, allowed, start))
            prev_end = k_end[k]
    return wait, graph, items


def _union(intervals: list[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


class _Busy:
    """The merged busy intervals of a rank's device, with prefix sums for idle queries."""

    def __init__(self, busy: list[Interval]) -> None:
        self.starts = [s for s, _ in busy]
        self.ends = [e for _, e in busy]
        self.cum = [0.0]
        for s, e in busy:
            self.cum.append(self.cum[-1] + e - s)

    def _busy_before(self, x: float) -> float:
        """Busy time in (-inf, x)."""
        i = bisect_right(self.starts, x)  # intervals starting at or before x
        if i == 0:
            return 0.0
        return self.cum[i - 1] + min(x, self.ends[i - 1]) - self.starts[i - 1]

    def idle_within(self, s: float, e: float, window: Interval) -> float:
        s, e = max(s, window[0]), min(e, window[1])
        if e <= s:
            return 0.0
        return (e - s) - (self._busy_before(e) - self._busy_before(s))

    def idle_measure(self, merged: list[Interval], window: Interval) -> float:
        """Idle time inside ``window`` covered by ``merged`` (disjoint intervals)."""
        return sum(self.idle_within(s, e, window) for s, e in merged)
