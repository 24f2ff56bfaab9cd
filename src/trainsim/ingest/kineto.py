"""Decode a Kineto (PyTorch profiler) Chrome-trace JSON into a typed, compact event table.

Decoding uses msgspec with typed structs: only the fields trainsim needs are materialised,
everything else is skipped by the C decoder (hundreds of MB/s, memory ≈ the uncompressed size).
Time units: Chrome-trace ``ts``/``dur`` are microseconds; some producers write nanoseconds.
We detect the unit from the timestamp magnitude (epoch ns ≈ 1e18, epoch µs ≈ 1e15) and the
``displayTimeUnit`` hint, and allow an explicit override.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import msgspec

from trainsim.errors import TraceFormatError


class Args(msgspec.Struct, omit_defaults=True):
    correlation: int | None = None
    stream: int | None = None
    device: int | None = None
    bytes: int | None = None
    external_id: int | None = msgspec.field(name="External id", default=None)
    rf_id: int | None = msgspec.field(name="Record function id", default=None)
    input_dims: Any = msgspec.field(name="Input Dims", default=None)
    input_type: Any = msgspec.field(name="Input type", default=None)
    # NCCL metadata written by recent PyTorch on kernels and record_param_comms ops.
    coll_name: str | None = msgspec.field(name="Collective name", default=None)
    in_nelems: int | None = msgspec.field(name="In msg nelems", default=None)
    out_nelems: int | None = msgspec.field(name="Out msg nelems", default=None)
    group_size: int | None = msgspec.field(name="Group size", default=None)
    dtype: str | None = None
    in_split: Any = msgspec.field(name="In split size", default=None)
    out_split: Any = msgspec.field(name="Out split size", default=None)
    pg_name: Any = msgspec.field(name="Process Group Name", default=None)
    pg_ranks: Any = msgspec.field(name="Process Group Ranks", default=None)
    # cuda_sync events (recent Kineto).
    sync_kind: str | None = msgspec.field(name="cuda_sync_kind", default=None)
    wait_on_stream: int | None = None
    wait_on_record_corr: int | None = msgspec.field(
        name="wait_on_cuda_event_record_corr_id", default=None
    )
    grid: Any = None
    block: Any = None


class Event(msgspec.Struct):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float | None = None
    dur: float = 0.0
    args: Args | None = None


class _Doc(msgspec.Struct):
    traceEvents: list[Event] | None = None  # noqa: N815 — the format's own key
    schemaVersion: Any = None  # noqa: N815
    distributedInfo: dict[str, Any] | None = None  # noqa: N815
    deviceProperties: list[dict[str, Any]] | None = None  # noqa: N815
    displayTimeUnit: str | None = None  # noqa: N815
    baseTimeNanoseconds: int | None = None  # noqa: N815
    traceName: str | None = None  # noqa: N815


CPU_CATS = frozenset({"cpu_op", "user_annotation", "operator", "Operator"})
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "runtime", "Runtime"})
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"})
SYNC_CAT = "cuda_sync"


@dataclass(slots=True)
class KinetoTrace:
    """The events of one Kineto file, split by role; times still in the file's raw unit."""

    source: str
    cpu: list[Event]  # cpu_op + user_annotation (X events with a duration)
    runtime: list[Event]  # CUDA/HIP runtime and driver calls
    gpu: list[Event]  # kernels, memcpy, memset
    sync: list[Event]  # cuda_sync events (recent Kineto only)
    distributed: dict[str, Any]
    devices: list[dict[str, Any]]
    unit_to_s: float  # seconds per raw time unit (1e-6 for µs)
    rank_hint: int | None = None  # rank from the file name when distributedInfo lacks it
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def rank(self) -> int | None:
        r = self.distributed.get("rank")
        if isinstance(r, int):
            return r
        return self.rank_hint

    @property
    def world_size(self) -> int | None:
        w = self.distributed.get("world_size")
        return w if isinstance(w, int) else None

    @property
    def device_name(self) -> str:
        return str(self.devices[0].get("name", "")) if self.devices else ""

    def origin(self) -> float:
        """Earliest timestamp of any CPU, runtime or GPU event (raw unit)."""
        # Lists are sorted by ts at decode time, so the first element is the minimum.
        firsts = [float(lst[0].ts) for lst in (self.cpu, self.runtime, self.gpu) if lst]  # type: ignore[arg-type]
        if not firsts:
            raise TraceFormatError(self.source, "trace has no CPU, runtime or GPU events")
        return min(firsts)


_RANK_PATTERNS = (
    re.compile(r"rank[-_]?(\d+)", re.I),
    re.compile(r"worker[-_]?(\d+)", re.I),
    re.compile(r"_(\d+)\.(?:pt\.trace\.)?json", re.I),
)


def rank_from_name(name: str) -> int | None:
    base = name.rsplit("/", 1)[-1].rsplit(":", 1)[-1]
    for pat in _RANK_PATTERNS:
        m = pat.search(base)
        if m:
            return int(m.group(1))
    return None


def _unit_to_s(events: list[Event], display_unit: str | None, override: str | None) -> float:
    if override is not None:
        return {"us": 1e-6, "ns": 1e-9, "ms": 1e-3}[override]
    sample = [e.ts for e in events[:2000] if e.ts is not None]
    if sample and max(sample) > 1e17:  # epoch nanoseconds (2001+); epoch µs is ~1.7e15
        return 1e-9
    # displayTimeUnit is a display hint in the Chrome-trace format; Kineto keeps ts in µs
    # (fractional for ns resolution) even when it says "ns". Large-magnitude check above wins.
    del display_unit
    return 1e-6


def decode_kineto(name: str, data: bytes, *, time_unit: str | None = None) -> KinetoTrace:
    """Decode one Kineto JSON document. Raises TraceFormatError naming the file and field."""
    try:
        doc = msgspec.json.decode(data, type=_Doc)
    except msgspec.ValidationError as e:
        raise TraceFormatError(name, f"not a Kineto trace: {e}") from e
    except msgspec.DecodeError as e:
        raise TraceFormatError(name, f"invalid or truncated JSON ({e})") from e
    if doc.traceEvents is None:
        raise TraceFormatError(name, "JSON has no 'traceEvents' list (expected a Kineto trace)")
    cpu: list[Event] = []
    runtime: list[Event] = []
    gpu: list[Event] = []
    sync: list[Event] = []
    counts: dict[str, int] = {}
    for e in doc.traceEvents:
        if e.ph != "X" or e.ts is None:
            continue
        cat = e.cat
        counts[cat] = counts.get(cat, 0) + 1
        if e.dur < 0:
            raise TraceFormatError(name, f"event {e.name!r} at ts={e.ts} has negative 'dur'")
        if cat in CPU_CATS:
            cpu.append(e)
        elif cat in RUNTIME_CATS:
            runtime.append(e)
        elif cat in GPU_CATS:
            gpu.append(e)
        elif cat == SYNC_CAT:
            sync.append(e)
    if not (cpu or runtime or gpu):
        raise TraceFormatError(name, "trace holds no CPU op, runtime or GPU events")
    for lst in (cpu, runtime, gpu, sync):
        lst.sort(key=lambda e: (e.ts, -e.dur))
    dist = dict(doc.distributedInfo or {})
    return KinetoTrace(
        source=name,
        cpu=cpu,
        runtime=runtime,
        gpu=gpu,
        sync=sync,
        distributed=dist,
        devices=list(doc.deviceProperties or []),
        unit_to_s=_unit_to_s(cpu or runtime or gpu, doc.displayTimeUnit, time_unit),
        rank_hint=rank_from_name(name),
        counts=counts,
    )
