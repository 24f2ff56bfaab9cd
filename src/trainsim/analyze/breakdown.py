"""Per-rank breakdown of a real step (002 §4.3.1; 000 §III-B, Fig. 5.2 of 002).

For each rank: the measured step time; per stream the busy time (union of its kernel
intervals) split by kernel family group; idle time of the device (step − union of its
kernels); exposed communication (communication kernels running while no compute kernel runs);
GPU utilisation; and host overheads T1–T5.

Gloo collectives are recorded as kernels on their worker thread's "stream" but run on the CPU
(``Kernel.on_host``): they count as communication, never as device time. A rank without device
kernels (``RankGraph.cpu_only``) has no device idle time or GPU utilisation (None); its exposed
communication is the collective time no CPU op overlaps, and its top ops rank by CPU time.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainsim.analyze.intervals import intersect_length, length
from trainsim.host.overheads import Overhead, collect_samples, summarize
from trainsim.ir.graph import Kernel, RankGraph, Workload
from trainsim.ir.kinds import FamilyGroup, OpCategory


@dataclass(frozen=True, slots=True)
class StreamBreakdown:
    stream: int
    busy_s: float
    kernels: int
    groups: dict[str, float]  # family group → summed kernel time on this stream
    communication: bool  # a stream carrying collective kernels
    host_thread: bool = False  # a CPU thread running gloo collectives, not a device stream

    def to_dict(self) -> dict[str, Any]:
        return {
            "busy_s": self.busy_s, "kernels": self.kernels, "groups": self.groups,
            "communication": self.communication, "host_thread": self.host_thread,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class RankBreakdown:
    rank: int
    step_time_s: float | None  # None: no complete step in the trace (sampled, cut)
    device_busy_s: float  # union of device kernels (gloo collectives run on the CPU: not here)
    idle_s: float | None  # None: no complete step, or no device (a CPU rank)
    exposed_comm_s: float
    gpu_utilization: float | None  # None: no complete step, or no device (a CPU rank)
    streams: dict[int, StreamBreakdown]
    families: dict[str, float]  # family group → summed kernel time (all streams)
    family_detail: dict[str, float]  # fine kernel family (gloo_<kind> for gloo) → summed time
    overheads: dict[str, dict[str, float | int]]
    ops: int
    kernels: int
    busiest_stream_s: float
    top_ops: list[dict[str, Any]] = field(default_factory=list)
    cpu_only: bool = False  # no device kernels: the step is CPU work

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank, "step_time_s": self.step_time_s, "cpu_only": self.cpu_only,
            "device_busy_s": self.device_busy_s, "idle_s": self.idle_s,
            "exposed_comm_s": self.exposed_comm_s, "gpu_utilization": self.gpu_utilization,
            "streams": {str(k): v.to_dict() for k, v in self.streams.items()},
            "families": self.families, "family_detail": self.family_detail,
            "overheads": self.overheads, "ops": self.ops, "kernels": self.kernels,
            "busiest_stream_s": self.busiest_stream_s, "top_ops": self.top_ops,
        }  # fmt: skip


def _arrays(kernels: list[Kernel]) -> tuple[np.ndarray, np.ndarray]:
    s = np.array([k.start_s for k in kernels], dtype=float)
    d = np.array([k.duration_s for k in kernels], dtype=float)
    return s, s + d


def _cpu_op_arrays(rank: RankGraph) -> tuple[np.ndarray, np.ndarray]:
    """Intervals of the rank's CPU ops that compute (collective ops and gloo work left out)."""
    ops = [
        o for o in rank.ops
        if o.category is not OpCategory.COMMUNICATION and o.start_s is not None and o.duration_s is not None
    ]  # fmt: skip
    s = np.array([o.start_s for o in ops], dtype=float)
    return s, s + np.array([o.duration_s for o in ops], dtype=float)


def _detail_name(k: Kernel) -> str:
    if k.on_host:  # a gloo collective: its IR family is named after NCCL's kernels
        return f"gloo_{k.collective.kind.value}" if k.collective is not None else "gloo"
    return k.family.value


def rank_breakdown(rank: RankGraph) -> RankBreakdown:
    kernels = [k for k in rank.kernels() if k.start_s is not None and k.duration_s is not None]
    step = rank.measured_step_s  # None without a complete step: then no idle time or utilization
    by_stream: dict[int, list[Kernel]] = defaultdict(list)
    for k in kernels:
        by_stream[k.stream].append(k)
    streams: dict[int, StreamBreakdown] = {}
    for sid, ks in sorted(by_stream.items()):
        groups: dict[str, float] = defaultdict(float)
        for k in ks:
            groups[k.family.group.value] += k.duration_s or 0.0
        streams[sid] = StreamBreakdown(
            stream=sid, busy_s=length(*_arrays(ks)), kernels=len(ks), groups=dict(groups),
            communication=any(k.family.is_communication for k in ks),
            host_thread=all(k.on_host for k in ks),
        )  # fmt: skip
    families: dict[str, float] = defaultdict(float)
    detail: dict[str, float] = defaultdict(float)
    for k in kernels:
        families[k.family.group.value] += k.duration_s or 0.0
        detail[_detail_name(k)] += k.duration_s or 0.0
    device = [k for k in kernels if not k.on_host]
    cpu_only = not device
    busy = length(*_arrays(device)) if device else 0.0
    comm = [k for k in kernels if k.family.is_communication]
    comm_iv = _arrays(comm)
    compute = _arrays([k for k in device if not k.family.is_communication])
    if cpu_only:  # the CPU computes: a collective is hidden while a CPU op runs
        compute = _cpu_op_arrays(rank)
        lo, hi = rank.step_start_s, rank.step_end_s
        if lo is not None and hi is not None:  # a gloo worker's record past the step is not in it
            comm_iv = (np.clip(comm_iv[0], lo, hi), np.clip(comm_iv[1], lo, hi))
    comm_busy = length(*comm_iv) if comm else 0.0
    overlap = intersect_length(comm_iv, compute) if comm and compute[0].size else 0.0
    idle = utilization = None
    if step and not cpu_only:  # device idle time and utilisation need a step and a device
        idle, utilization = max(0.0, step - busy), busy / step
    return RankBreakdown(
        rank=rank.rank, step_time_s=step, device_busy_s=busy, idle_s=idle,
        exposed_comm_s=comm_busy - overlap, gpu_utilization=utilization,
        streams=streams, families={g.value: families.get(g.value, 0.0) for g in FamilyGroup},
        family_detail=dict(sorted(detail.items(), key=lambda kv: -kv[1])),
        overheads=overhead_summary(rank), ops=len(rank.ops), kernels=len(kernels),
        busiest_stream_s=max((s.busy_s for s in streams.values()), default=0.0),
        top_ops=_top_ops(rank, by_cpu=cpu_only), cpu_only=cpu_only,
    )  # fmt: skip


def overhead_summary(rank: RankGraph) -> dict[str, dict[str, float | int]]:
    """Global T1–T5 statistics of one rank (IQR-filtered means, 002 §4.4.2), in seconds."""
    pooled: dict[Overhead, list[float]] = defaultdict(list)
    for kinds in collect_samples(rank).values():
        for kind, vals in kinds.items():
            pooled[kind].extend(vals)
    return {k.value: summarize(v).to_dict() for k, v in sorted(pooled.items()) if v}


def _top_ops(rank: RankGraph, *, by_cpu: bool = False, n: int = 10) -> list[dict[str, Any]]:
    """Op names with the most device time (sum of their device kernels), or with the most CPU
    time (``by_cpu``: a rank without device kernels, where all device times are 0)."""
    acc: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for op in rank.ops:
        a = acc[op.name]
        a[0] += sum(k.duration_s or 0.0 for k in op.kernels if not k.on_host)
        a[1] += op.duration_s or 0.0
        a[2] += 1
    key = 1 if by_cpu else 0
    rows = sorted(acc.items(), key=lambda kv: -kv[1][key])[:n]
    return [
        {"op": name, "device_s": v[0], "cpu_s": v[1], "calls": int(v[2])} for name, v in rows
    ]


def workload_breakdown(w: Workload) -> list[RankBreakdown]:
    return [rank_breakdown(r) for r in w.ranks]
