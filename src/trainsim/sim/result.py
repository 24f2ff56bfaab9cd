"""What a simulation returns: the predicted step, per-rank and per-stream time, the critical path.

Definitions (the same as for a measured step, ``Workload.measured_step_s``):

- a rank's step starts at its traced start (``RankGraph.step_start_s``) and ends with its last
  kernel, or, on a rank without device kernels (gloo collectives run on CPU threads), with its
  CPU window: its last op plus the step's tail after it, or its last collective if that ends
  later (a measured step ends with the window alone); the predicted step spans the earliest
  rank start to the latest rank end;
- a stream's busy time is the sum of its kernels' simulated [start, end) (for a collective this
  includes waiting for peers, as in a trace); idle = the rank's step − busy;
- exposed communication: time when a communication kernel runs and no other kernel of the rank
  does; collective wait: time a rank's collective kernels spend waiting for the latest peer;
- a rank without device kernels (``cpu_only``) is read as ``trainsim analyze`` reads its trace
  (``trainsim.analyze.breakdown``): no device busy time (0) and no device idle time (None);
  its exposed communication is the collective time, within its step, that no computing CPU op
  (an op not of the communication category) overlaps;
- the kernel-sum baseline of 000 §IV-B: the max over ranks of the busiest stream's kernel sum
  (with measured kernels: the raw measured durations, waiting included, as a trace shows them;
  with models: a collective's predicted transfer).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from trainsim.analyze.intervals import intersect_length, length
from trainsim.ir.kinds import KernelFamily, OpCategory
from trainsim.sim.engine import Evaluation
from trainsim.sim.options import KernelSource, SegmentKind, SimOptions
from trainsim.sim.program import Program

_IS_COMM = {f: f.is_communication for f in KernelFamily}


@dataclass(frozen=True, slots=True)
class Segment:
    """One piece of a critical path."""

    kind: SegmentKind
    rank: int
    start_s: float
    end_s: float
    label: str

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "rank": self.rank, "start_s": self.start_s,
                "end_s": self.end_s, "duration_s": self.duration_s, "label": self.label}  # fmt: skip


@dataclass(frozen=True, slots=True)
class StreamResult:
    stream: int
    kernels: int
    busy_s: float
    idle_s: float
    kernel_sum_s: float  # as the kernel-sum baseline counts it


@dataclass(frozen=True, slots=True)
class RankResult:
    rank: int
    represents: int
    start_s: float
    end_s: float
    predicted_step_s: float
    measured_step_s: float | None
    cpu_end_s: float
    device_busy_s: float
    idle_s: float | None  # None: a rank without a device
    exposed_comm_s: float
    collective_wait_s: float
    streams: tuple[StreamResult, ...]
    cpu_only: bool = False  # no device kernels: gloo collectives on CPU threads, CPU compute

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank, "represents": self.represents, "cpu_only": self.cpu_only, "start_s": self.start_s,
            "end_s": self.end_s, "predicted_step_s": self.predicted_step_s,
            "measured_step_s": self.measured_step_s, "cpu_end_s": self.cpu_end_s,
            "device_busy_s": self.device_busy_s, "idle_s": self.idle_s,
            "exposed_comm_s": self.exposed_comm_s, "collective_wait_s": self.collective_wait_s,
            "streams": {str(s.stream): {"kernels": s.kernels, "busy_s": s.busy_s, "idle_s": s.idle_s,
                                        "kernel_sum_s": s.kernel_sum_s} for s in self.streams},
        }  # fmt: skip


@dataclass(frozen=True, eq=False)
class SimResult:
    """The outcome of :func:`trainsim.sim.simulate`; ``program``/``evaluation`` feed the
    timeline export and per-rank critical paths."""

    predicted_step_s: float
    start_s: float
    end_s: float
    ranks: tuple[RankResult, ...]
    kernel_sum_baseline_s: float
    diagnostics: dict[str, int]
    options: SimOptions
    program: Program = field(repr=False)
    evaluation: Evaluation = field(repr=False)

    @cached_property
    def critical_path(self) -> tuple[Segment, ...]:
        """The global critical path (computed on first use)."""
        from trainsim.sim.critical_path import critical_path

        return tuple(critical_path(self))

    def critical_path_for(self, rank: int) -> tuple[Segment, ...]:
        """The critical path of one rank (collective waits shown, not followed)."""
        from trainsim.sim.critical_path import critical_path

        return tuple(critical_path(self, rank=rank))

    def rank(self, rank: int) -> RankResult:
        for r in self.ranks:
            if r.rank == rank:
                return r
        raise KeyError(rank)

    @property
    def device_kernel_sum_baseline_s(self) -> float | None:
        """:attr:`kernel_sum_baseline_s`, or None when no rank has a device (a CPU trace: its
        "kernels" are gloo records, and the sum would read as -80..-100 %)."""
        if all(r.idle_s is None for r in self.ranks):
            return None
        return self.kernel_sum_baseline_s

    def critical_path_by_kind(self) -> dict[str, float]:
        out = {k.value: 0.0 for k in SegmentKind}
        for s in self.critical_path:
            out[s.kind.value] += s.duration_s
        return out

    def to_dict(self, *, segments: bool = True) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "predicted_step_s": self.predicted_step_s,
            "kernel_sum_baseline_s": self.device_kernel_sum_baseline_s,
            "ranks": [r.to_dict() for r in self.ranks],
            "critical_path": {
                "by_kind_s": self.critical_path_by_kind(),
                "segments": len(self.critical_path),
            },  # fmt: skip
            "diagnostics": dict(sorted(self.diagnostics.items())),
        }
        if segments:
            doc["critical_path"]["path"] = [s.to_dict() for s in self.critical_path]
        return doc


def _busy_and_exposed(
    starts: np.ndarray, ends: np.ndarray, comm: np.ndarray
) -> tuple[float, float]:
    """Length of the union of all intervals, and of the time only communication runs
    (a sweep over the interval boundaries counting active comm and other kernels)."""
    if starts.size == 0:
        return 0.0, 0.0
    times = np.concatenate((starts, ends))
    c = comm.astype(np.int64)
    d_comm = np.concatenate((c, -c))
    d_other = np.concatenate((1 - c, c - 1))
    order = np.argsort(times, kind="stable")
    times, n_comm, n_other = times[order], np.cumsum(d_comm[order]), np.cumsum(d_other[order])
    seg = np.diff(times)
    busy = (n_comm[:-1] > 0) | (n_other[:-1] > 0)
    exposed = (n_comm[:-1] > 0) & (n_other[:-1] == 0)
    return float(seg[busy].sum()), float(seg[exposed].sum())


def _rank_result(program: Program, ev: Evaluation, ri: int) -> RankResult:
    rp = program.ranks[ri]
    t = ev.times[ri]
    ks = rp.kernels
    starts = np.array(t.k_start, dtype=float) if ks else np.zeros(0)
    ends = np.array(t.k_end, dtype=float) if ks else np.zeros(0)
    cpu_end = max(t.op_end, default=rp.cpu_start_s)
    end = float(ends.max()) if ks else -np.inf
    if rp.graph.cpu_only:  # no device kernels: the step ends with the CPU window
        window_end = max((t.op_end[i] for i in rp.window_ops), default=rp.cpu_start_s)
        end = max(end, window_end + rp.end_tail_s)
    step = end - rp.step_start_s
    dur = np.array(rp.k_dur, dtype=float)
    inst = np.array(rp.k_inst, dtype=np.intp)
    member = inst >= 0
    if member.any() and program.options.kernels is not KernelSource.MEASURED:
        transfer = np.array([i.transfer_s for i in program.instances], dtype=float)
        dur[member] = transfer[inst[member]]  # models: a collective's transfer
    streams = []
    for lane, kidx in enumerate(rp.stream_lanes):
        sel = np.array(kidx, dtype=np.intp)
        busy = float((ends[sel] - starts[sel]).sum())
        streams.append(
            StreamResult(rp.lane_stream[lane], len(kidx), busy, step - busy, float(dur[sel].sum()))
        )
    comm = np.array([_IS_COMM[k.family] for k in ks], dtype=bool)
    busy_all, exposed = _busy_and_exposed(starts, ends, comm)
    idle: float | None = step - busy_all
    if rp.graph.cpu_only:  # the CPU computes (as trainsim analyze reads a CPU trace)
        busy_all, idle, exposed = 0.0, None, _cpu_exposed(rp, t, starts[comm], ends[comm], end)
    wait = 0.0
    if member.any():
        inst_start = np.array(ev.inst_start, dtype=float)
        wait = float((inst_start[inst[member]] - starts[member]).sum())
    g = rp.graph
    return RankResult(g.rank, g.represents, rp.step_start_s, end, step, g.measured_step_s, cpu_end,
                      busy_all, idle, exposed, wait, tuple(streams), cpu_only=g.cpu_only)  # fmt: skip


def _cpu_exposed(rp: Any, t: Any, c_start: np.ndarray, c_end: np.ndarray, end: float) -> float:
    """A CPU rank's collective time within its step that no computing CPU op overlaps."""
    if c_start.size == 0:
        return 0.0
    lo = rp.step_start_s
    comm = (np.clip(c_start, lo, end), np.clip(c_end, lo, end))
    idx = [i for i, op in enumerate(rp.ops) if op.category is not OpCategory.COMMUNICATION]
    if not idx:
        return length(*comm)
    compute = (np.array([t.op_start[i] for i in idx], dtype=float), np.array([t.op_end[i] for i in idx], dtype=float))
    return length(*comm) - intersect_length(comm, compute)


def build_result(program: Program, ev: Evaluation) -> SimResult:
    ranks = tuple(_rank_result(program, ev, i) for i in range(len(program.ranks)))
    start = min(r.start_s for r in ranks)
    end = max(r.end_s for r in ranks)
    baseline = max((s.kernel_sum_s for r in ranks for s in r.streams), default=0.0)
    diag: dict[str, int] = {}
    for rp in program.ranks:
        for k, v in rp.diagnostics.items():
            diag[k] = diag.get(k, 0) + v
    diag["collective_instances"] = len(program.instances)
    return SimResult(end - start, start, end, ranks, baseline, diag, program.options, program, ev)
