"""Per-rank breakdown of a real step (002 §4.3.1; 000 §III-B, Fig. 5.2 of 002).

For each rank: the measured step time; per stream the busy time (union of its kernel
intervals) split by kernel family group; idle time of the device (step − union over all
streams); exposed communication (communication kernels running while no compute kernel runs);
GPU utilisation; and host overheads T1–T5.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainsim.analyze.intervals import intersect_length, length
from trainsim.host.overheads import Overhead, collect_samples, summarize
from trainsim.ir.graph import Kernel, RankGraph, Workload
from trainsim.ir.kinds import FamilyGroup


@dataclass(frozen=True, slots=True)
class StreamBreakdown:
    stream: int
    busy_s: float
    kernels: int
    groups: dict[str, float]  # family group → summed kernel time on this stream
    communication: bool  # a stream carrying collective kernels

    def to_dict(self) -> dict[str, Any]:
        return {
            "busy_s": self.busy_s, "kernels": self.kernels, "groups": self.groups,
            "communication": self.communication,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class RankBreakdown:
    rank: int
    step_time_s: float | None  # None: no complete step in the trace (sampled, cut)
    device_busy_s: float
    idle_s: float | None
    exposed_comm_s: float
    gpu_utilization: float | None
    streams: dict[int, StreamBreakdown]
    families: dict[str, float]  # family group → summed kernel time (all streams)
    family_detail: dict[str, float]  # fine kernel family → summed kernel time
    overheads: dict[str, dict[str, float | int]]
    ops: int
    kernels: int
    busiest_stream_s: float
    top_ops: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank, "step_time_s": self.step_time_s,
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
        )  # fmt: skip
    families: dict[str, float] = defaultdict(float)
    detail: dict[str, float] = defaultdict(float)
    for k in kernels:
        families[k.family.group.value] += k.duration_s or 0.0
        detail[k.family.value] += k.duration_s or 0.0
    busy = length(*_arrays(kernels)) if kernels else 0.0
    comm = [k for k in kernels if k.family.is_communication]
    compute = [k for k in kernels if not k.family.is_communication]
    comm_busy = length(*_arrays(comm)) if comm else 0.0
    overlap = intersect_length(_arrays(comm), _arrays(compute)) if comm and compute else 0.0
    return RankBreakdown(
        rank=rank.rank, step_time_s=step, device_busy_s=busy, idle_s=max(0.0, step - busy) if step else None,
        exposed_comm_s=comm_busy - overlap, gpu_utilization=busy / step if step else None,
        streams=streams, families={g.value: families.get(g.value, 0.0) for g in FamilyGroup},
        family_detail=dict(sorted(detail.items(), key=lambda kv: -kv[1])),
        overheads=overhead_summary(rank), ops=len(rank.ops), kernels=len(kernels),
        busiest_stream_s=max((s.busy_s for s in streams.values()), default=0.0),
        top_ops=_top_ops(rank),
    )  # fmt: skip


def overhead_summary(rank: RankGraph) -> dict[str, dict[str, float | int]]:
    """Global T1–T5 statistics of one rank (IQR-filtered means, 002 §4.4.2), in seconds."""
    pooled: dict[Overhead, list[float]] = defaultdict(list)
    for kinds in collect_samples(rank).values():
        for kind, vals in kinds.items():
            pooled[kind].extend(vals)
    return {k.value: summarize(v).to_dict() for k, v in sorted(pooled.items()) if v}


def _top_ops(rank: RankGraph, n: int = 10) -> list[dict[str, Any]]:
    """Op names with the most device time (sum of their kernels)."""
    acc: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for op in rank.ops:
        a = acc[op.name]
        a[0] += sum(k.duration_s or 0.0 for k in op.kernels)
        a[1] += op.duration_s or 0.0
        a[2] += 1
    rows = sorted(acc.items(), key=lambda kv: -kv[1][0])[:n]
    return [
        {"op": name, "device_s": v[0], "cpu_s": v[1], "calls": int(v[2])} for name, v in rows
    ]


def workload_breakdown(w: Workload) -> list[RankBreakdown]:
    return [rank_breakdown(r) for r in w.ranks]
