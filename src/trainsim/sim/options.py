"""What a simulation is asked to do: where durations and host gaps come from (enums, options)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainsim.host.overheads import OverheadDB
    from trainsim.sim.durations import ModelRegistry


class KernelSource(StrEnum):
    """Where kernel and collective durations come from."""

    MEASURED = "measured"  # Kernel.duration_s (collectives: transfer derived across members)
    MODEL = "model"  # Kernel.predicted_s, else the model registry, else measured (counted)


class HostMode(StrEnum):
    """Where the CPU-side gaps T1–T5 come from (002 §4.3.3)."""

    TRACE = "trace"  # the exact measured gaps of this trace (sanity mode)
    STATS = "stats"  # per-op-name means over this workload (002 Alg. 3)
    SHARED = "shared"  # an OverheadDB built from other traces


class SegmentKind(StrEnum):
    """Kinds of time on a critical path (HTA's vocabulary, plus collectives)."""

    KERNEL = "kernel"  # a kernel executing (for a collective: the transfer after the last arrival)
    KERNEL_GAP = "kernel_gap"  # device gap between back-to-back kernels of one stream
    LAUNCH_DELAY = "launch_delay"  # runtime call start → kernel start (stream idle)
    HOST_GAP = "host_gap"  # CPU time: T1–T5, CPU-only ops, runtime calls
    STREAM_WAIT = "stream_wait"  # an event wait, an intra-rank sync, or the CPU blocked on a stream
    COLLECTIVE_WAIT = "collective_wait"  # a rank waiting in a collective for its latest peer
    RANK_START = "rank_start"  # the path's rank began its step after the earliest rank (traced)


@dataclass(frozen=True, slots=True)
class SimOptions:
    """Options of :func:`trainsim.sim.simulate`.

    ``overhead_db`` is required for ``HostMode.SHARED``; for ``STATS`` it defaults to the
    database built from the simulated workload itself. ``intra_rank_sync`` applies 000 §III-D's
    rule (a collective starts no earlier than the first dependent of the previous collective on
    its stream). ``thread_edges`` infers fork/join edges between CPU threads from the trace
    (e.g. the autograd thread starts after ``backward()`` is called and the optimizer waits for
    it); it needs measured op times and is ignored without them. ``launch_latency_s`` (from a
    runtime call's start to its kernel's earliest start) and ``kernel_gap_s`` (between
    back-to-back kernels of a stream) replace the values otherwise estimated from the trace
    (or 002 Alg. 3's T4/2 and 1 µs without one); ``TRACE`` mode keeps each measured kernel's
    own values. ``system`` (``KernelSource.MODEL``): the catalog system whose collective
    models (``trainsim.comm``: calibrated, then spec-based hierarchical) size and time the
    collectives; without it, the only catalog system built of the workload's device, if any.
    """

    kernels: KernelSource = KernelSource.MEASURED
    overheads: HostMode = HostMode.STATS
    overhead_db: OverheadDB | None = None
    kernel_models: ModelRegistry | None = None
    intra_rank_sync: bool = True
    thread_edges: bool = True
    launch_latency_s: float | None = None
    kernel_gap_s: float | None = None
    stats_iqr: bool = False  # STATS: 002 §4.4.2's IQR-filtered means instead of plain means
    system: str | None = None  # MODEL: catalog system (name or YAML) whose comm models answer
