"""Workload IR: the only interface between ingestion/builders, models, simulator and reports.

Values are frozen, slotted dataclasses validated on construction. Times are seconds (float),
relative to the workload's time origin (``Workload.metadata["time_origin_us"]`` for ingested
traces), so that sub-microsecond resolution survives epoch-sized timestamps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from trainsim.errors import GraphError
from trainsim.ir.kinds import CollectiveKind, KernelFamily, OpCategory, SyncKind

FeatureValue = int | float | str
_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _check_duration(value: float | None, what: str) -> None:
    if value is not None and not value >= 0.0:  # also rejects NaN
        raise GraphError(f"{what} must be a non-negative number of seconds, got {value!r}")


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """Shape and dtype of one operator input or output (from an execution trace or Kineto)."""

    shape: tuple[int, ...]
    dtype: str
    tensor_id: int | None = None

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective call on one rank. ``bytes`` is this rank's message size.

    For all_to_allv, ``peer_bytes`` lists bytes sent to each peer; models size the exchange as
    the max over devices of max(sent, received) (000 §III-C).
    """

    kind: CollectiveKind
    group: str
    group_ranks: tuple[int, ...]
    bytes: int
    seq: int
    dtype: str = ""
    out_bytes: int | None = None
    peer_bytes: tuple[int, ...] | None = None
    peer: int | None = None

    def __post_init__(self) -> None:
        if self.bytes < 0:
            raise GraphError(f"collective {self.kind} seq {self.seq}: negative bytes {self.bytes}")
        if self.seq < 0:
            raise GraphError(f"collective {self.kind}: negative sequence number {self.seq}")

    @property
    def group_size(self) -> int:
        return len(self.group_ranks)


@dataclass(frozen=True, slots=True)
class Kernel:
    """One device activity (kernel, memcpy, memset) and the CPU runtime call that launched it."""

    id: int
    name: str
    family: KernelFamily
    stream: int
    start_s: float | None = None  # measured start (trace-driven only)
    duration_s: float | None = None  # measured duration
    launch_start_s: float | None = None  # CPU runtime call (cudaLaunchKernel, ...) start
    launch_duration_s: float | None = None
    features: Mapping[str, FeatureValue] = field(default_factory=dict)
    collective: Collective | None = None
    predicted_s: float | None = None  # filled by kernel/collective models
    provenance: str = ""  # "measured", "calibrated:<dataset>", "spec-based:<device>"

    def __post_init__(self) -> None:
        _check_duration(self.duration_s, f"kernel {self.id} ({self.name[:40]}) duration")
        _check_duration(self.launch_duration_s, f"kernel {self.id} launch duration")
        _check_duration(self.predicted_s, f"kernel {self.id} predicted duration")

    @property
    def end_s(self) -> float | None:
        if self.start_s is None or self.duration_s is None:
            return None
        return self.start_s + self.duration_s

    @property
    def on_host(self) -> bool:
        """Work a CPU thread ran, not a device: a gloo collective, whose worker thread stands
        as its stream (``features["backend"] == "gloo"``, set at ingestion)."""
        return self.features.get("backend") == "gloo"


@dataclass(frozen=True, slots=True)
class SyncPoint:
    """A synchronisation call made by an op.

    STREAM_WAIT_EVENT: ``stream`` waits until ``wait_on_kernel`` (the last kernel issued on
    ``wait_on_stream`` before the event was recorded) has finished.
    STREAM_SYNC / EVENT_SYNC / DEVICE_SYNC: the CPU thread blocks until the stream/event/device
    is drained.
    """

    kind: SyncKind
    start_s: float | None = None
    duration_s: float | None = None
    stream: int | None = None
    wait_on_stream: int | None = None
    wait_on_kernel: int | None = None

    def __post_init__(self) -> None:
        _check_duration(self.duration_s, f"sync {self.kind} duration")


@dataclass(frozen=True, slots=True)
class Op:
    """One top-level CPU operator in issue order, with the kernels it launched."""

    id: int
    name: str
    thread: int
    category: OpCategory
    start_s: float | None = None  # measured CPU start
    duration_s: float | None = None  # measured CPU duration
    kernels: tuple[Kernel, ...] = ()
    syncs: tuple[SyncPoint, ...] = ()
    inputs: tuple[TensorMeta, ...] = ()
    outputs: tuple[TensorMeta, ...] = ()
    deps: tuple[int, ...] = ()  # ids of ops whose outputs this op consumes
    rf_id: int | None = None  # record-function id (links ET nodes to Kineto events)
    et_id: int | None = None  # execution-trace node id, when linked
    # autograd sequence number (Kineto "Sequence number"): a forward op's, or a backward node's,
    # which is that of the forward op that created it (per forward thread)
    seq_nr: int | None = None
    # a CPU op nested under this one copied or filled memory (``aten::copy_``, ``fill_``,
    # ``zero_``); set on every trace, read by the resize for ops named like views: in a CPU trace
    # the only sign that such an op moved data (a GPU trace shows its kernels too)
    moved_data: bool = False
    annotation: str = ""  # innermost user annotation around the op (e.g. "## forward ##")
    # Predicted CPU duration of an op that makes no runtime call (a CPU-only op: its own CPU
    # time is its work), set by what-if passes such as ``sim.resize``; used instead of the
    # host model's per-name CPU time. ``provenance`` says where it came from.
    predicted_s: float | None = None
    provenance: str = ""

    def __post_init__(self) -> None:
        _check_duration(self.duration_s, f"op {self.id} ({self.name}) CPU duration")
        _check_duration(self.predicted_s, f"op {self.id} ({self.name}) predicted CPU duration")
        if self.id in self.deps:
            raise GraphError(f"op {self.id} ({self.name}) depends on itself")

    @property
    def end_s(self) -> float | None:
        if self.start_s is None or self.duration_s is None:
            return None
        return self.start_s + self.duration_s

    @property
    def is_worker_record(self) -> bool:
        """A gloo collective's record on the worker thread that ran it, made an op of its own
        (no ``c10d::`` op enqueued it: DDP's buckets): its one kernel, on the thread as its
        stream, is the collective itself rather than work it launched."""
        return len(self.kernels) == 1 and self.kernels[0].on_host and self.kernels[0].stream == self.thread


@dataclass(frozen=True, slots=True)
class RankGraph:
    """The ops of one rank, in CPU issue order. ``represents`` counts identical real ranks.

    Measured step (trace-driven): ``step_start_s`` is when the rank can begin the step — the
    later of its CPU entering the step and its device draining the previous step (GPU-bound
    steady state: the CPU runs ahead) — and ``step_end_s`` the end of its last kernel of the
    step, or, on a rank without device kernels (``cpu_only``: gloo collectives are CPU work),
    the end of its CPU window (a gloo worker's record may outlast it). ``metadata`` keeps
    ``cpu_step_start_s`` (CPU entry) and ``stream_busy_until_s`` ({stream: time} backlog of the
    previous step still running at CPU entry) so a simulator can start from the same state.
    """

    rank: int
    ops: tuple[Op, ...]
    streams: tuple[int, ...] = ()
    represents: int = 1
    device: str = ""
    step_start_s: float | None = None  # measured step window (trace-driven only)
    step_end_s: float | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.represents < 1:
            raise GraphError(f"rank {self.rank}: represents must be >= 1, got {self.represents}")
        seen_ops: set[int] = set()
        seen_kernels: set[int] = set()
        streams = set(self.streams)
        for op in self.ops:
            if op.id in seen_ops:
                raise GraphError(f"rank {self.rank}: duplicate op id {op.id} ({op.name})")
            seen_ops.add(op.id)
            for k in op.kernels:
                if k.id in seen_kernels:
                    raise GraphError(f"rank {self.rank}: duplicate kernel id {k.id} in op {op.id}")
                seen_kernels.add(k.id)
                if streams and k.stream not in streams:
                    raise GraphError(
                        f"rank {self.rank}: kernel {k.id} on stream {k.stream} not in {sorted(streams)}"
                    )
        for op in self.ops:
            missing = [d for d in op.deps if d not in seen_ops]
            if missing:
                raise GraphError(
                    f"rank {self.rank}: op {op.id} ({op.name}) depends on unknown ops {missing[:5]}"
                )
        if (
            self.step_start_s is not None
            and self.step_end_s is not None
            and self.step_end_s < self.step_start_s
        ):
            raise GraphError(f"rank {self.rank}: step ends before it starts")

    @property
    def measured_step_s(self) -> float | None:
        if self.step_start_s is None or self.step_end_s is None:
            return None
        return self.step_end_s - self.step_start_s

    def kernels(self) -> list[Kernel]:
        return [k for op in self.ops for k in op.kernels]

    @property
    def cpu_only(self) -> bool:
        """No device kernels: the step is CPU work (collectives, if any, ran on CPU threads)."""
        return all(k.on_host for op in self.ops for k in op.kernels)


@dataclass(frozen=True, slots=True)
class Workload:
    """Rank graphs plus process groups (name → member ranks) and metadata."""

    ranks: tuple[RankGraph, ...]
    process_groups: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ids = [r.rank for r in self.ranks]
        if len(ids) != len(set(ids)):
            raise GraphError(f"duplicate rank ids in workload: {sorted(ids)}")
        for name, members in self.process_groups.items():
            if len(set(members)) != len(members):
                raise GraphError(f"process group {name!r} lists a rank twice: {members}")

    def rank(self, rank: int) -> RankGraph:
        for r in self.ranks:
            if r.rank == rank:
                return r
        raise GraphError(f"no rank {rank} in workload (ranks: {[r.rank for r in self.ranks]})")

    @property
    def measured_step_s(self) -> float | None:
        """Span from the earliest rank step start to the latest rank step end."""
        starts = [r.step_start_s for r in self.ranks if r.step_start_s is not None]
        ends = [r.step_end_s for r in self.ranks if r.step_end_s is not None]
        if not starts or not ends:
            return None
        return max(ends) - min(starts)
