"""Decode a Kineto (PyTorch profiler) Chrome-trace JSON into a typed, compact event table.

Decoding uses msgspec with typed structs: only the fields trainsim needs are materialised,
everything else is skipped by the C decoder. Event structs are not tracked by the cyclic
garbage collector (``gc=False``: they hold no cycles), which keeps multi-million-event traces
from triggering full collections that would otherwise dominate ingestion time.

Time units: Chrome-trace ``ts``/``dur`` are microseconds (Kineto writes fractional µs for
nanosecond resolution and may say ``displayTimeUnit: "ns"``: that is a display hint only). Some
producers write nanoseconds; we detect them by the magnitude of the median timestamp (epoch ns
≈ 1.7e18, epoch µs ≈ 1.7e15), and accept an explicit override.

Decoding also rejects what cannot be a real trace, so that a corrupt file fails loudly instead
of yielding a plausible but wrong workload (see docs/ingestion.md, "Error policy"): negative
times or counts, timestamps far outside the trace's own time range, and device activity that
starts before the runtime call that launched it. Those checks are most of this module's
length; they share its types and its one pass over the events, so they stay here.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Annotated, Any, Union

import msgspec
import numpy as np

from trainsim.errors import ConfigError, TraceFormatError
from trainsim.gcpause import gc_paused
from trainsim.ingest.sources import too_large
from trainsim.ir.serialize import is_trainsim_timeline

MAX_COUNT = 1 << 48  # bytes or elements of one tensor or message; more is a corrupt value
Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]  # bytes and element counts
RawTime = Annotated[float, msgspec.Meta(ge=0)]  # ts/dur in the file's raw unit


_NO_JSON = msgspec.Raw()


class Args(msgspec.Struct, omit_defaults=True, gc=False):
    """The ``args`` of an event: the fields trainsim reads (others are skipped by the decoder).

    Raw JSON fields reference the file's bytes (zero-copy), which therefore live as long as
    the events do.
    """

    correlation: int | None = None
    # CUDA writes an int, ROCm runtime calls a hex string ("0x0"): decode_kineto normalises the
    # stream of every runtime, device and cuda_sync event to ``int | None``.
    stream: Any = None
    device: int | None = None
    bytes: Count | None = None
    external_id: int | None = msgspec.field(name="External id", default=None)
    rf_id: int | None = msgspec.field(name="Record function id", default=None)
    ev_idx: int | None = msgspec.field(name="Ev Idx", default=None)
    # autograd's sequence number: a forward op's (the counter when it started), a backward node's
    # (the counter when its forward op created it)
    seq_nr: int | None = msgspec.field(name="Sequence number", default=None)
    # Shapes, dtypes and launch dimensions stay raw JSON until read (the properties below):
    # decoded, they are a quarter of a trace's memory and a million objects for the garbage
    # collector to scan, and only the chosen step's events are ever read.
    input_dims_json: msgspec.Raw = msgspec.field(name="Input Dims", default=_NO_JSON)
    input_type_json: msgspec.Raw = msgspec.field(name="Input type", default=_NO_JSON)
    # NCCL metadata written by recent PyTorch on kernels and record_param_comms ops.
    coll_name: str | None = msgspec.field(name="Collective name", default=None)
    in_nelems: Count | None = msgspec.field(name="In msg nelems", default=None)
    out_nelems: Count | None = msgspec.field(name="Out msg nelems", default=None)
    group_size: Count | None = msgspec.field(name="Group size", default=None)
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
    # Launch dimensions [x, y, z] of kernels (a Triton CPU op writes a string, "grid(100,)").
    grid_json: msgspec.Raw = msgspec.field(name="grid", default=_NO_JSON)
    block_json: msgspec.Raw = msgspec.field(name="block", default=_NO_JSON)

    @property
    def input_dims(self) -> Any:
        """'Input Dims': one shape (list of ints) per input, [] for non-tensors; or None."""
        return msgspec.json.decode(self.input_dims_json) if self.input_dims_json else None

    @property
    def grid(self) -> Any:
        """'grid': the kernel's launch grid [x, y, z]; or None."""
        return msgspec.json.decode(self.grid_json) if self.grid_json else None

    @property
    def block(self) -> Any:
        """'block': the kernel's thread block [x, y, z]; or None."""
        return msgspec.json.decode(self.block_json) if self.block_json else None

    @property
    def input_type(self) -> Any:
        """'Input type': one dtype name per input ("float", "c10::Half", "Scalar"); or None."""
        return msgspec.json.decode(self.input_type_json) if self.input_type_json else None


class Event(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    """A complete ('X') event: the only phase trainsim reads. Its ``ph`` is the tag."""

    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: RawTime | None = None
    dur: RawTime = -1.0  # -1: absent from the file (decode_kineto refuses that; the file's are >= 0)
    args: Args | None = None


# Every other phase of the Chrome trace-event format decodes to an empty struct: flow arrows
# ('s'/'f', a third of a Kineto file), metadata and counters cost 16 bytes each instead of a
# full event. A phase outside the format is an error.
_OTHER_PHASES = tuple("BEiICbneSTpFstfPONDMVvRc()")
_Skipped = tuple(
    msgspec.defstruct(f"_Phase{ord(ph)}", [], tag_field="ph", tag=ph, gc=False)
    for ph in _OTHER_PHASES
)
_AnyEvent = Event | Union[_Skipped]  # type: ignore[valid-type]  # noqa: UP007


class _Doc(msgspec.Struct):
    traceEvents: list[_AnyEvent] | None = None  # noqa: N815 — the format's own key
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
_ROLES = (CPU_CATS, RUNTIME_CATS, GPU_CATS, frozenset({SYNC_CAT}))  # KinetoTrace's four lists

TIME_UNITS_S = {"us": 1e-6, "ns": 1e-9, "ms": 1e-3}
COMPLETE_COVERAGE = 0.9  # below this share of 'Ev Idx' indices, events were removed (sampled)
MAX_TIME_RANGE_S = 3600.0  # events farther than this from the trace's median are corrupt
MAX_RESOLUTION_S = 1e-6  # float64 timestamps must still tell microseconds apart (epoch ns: 0.26 µs)
MAX_WORLD_SIZE = 1 << 20  # ranks in one job; larger values are corrupt
LAUNCH_SKEW_S = 100e-6  # a device activity may appear to start this much before its launch


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
    # Share of the profiler's per-event indices ('Ev Idx') present in the file; 1.0 for a
    # complete export, ≈0.01 for the HTA "sampled" traces. None: the producer writes none.
    event_coverage: float | None = None

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

    @property
    def records_device(self) -> bool:
        """Whether the trace shows a device: its properties, runtime calls or device activity
        (a CPU-only trace, e.g. a gloo job's, has none of them)."""
        return bool(self.devices or self.runtime or self.gpu)

    @property
    def is_sampled(self) -> bool:
        """True when events were removed after export (sampled or trimmed traces): the CPU
        ops and kernels of a step are then a subset, and step times and replays are wrong."""
        return self.event_coverage is not None and self.event_coverage < COMPLETE_COVERAGE

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


def decode_kineto(name: str, data: bytes, *, time_unit: str | None = None) -> KinetoTrace:
    """Decode one Kineto JSON document. Raises TraceFormatError naming the file and field."""
    with gc_paused():
        doc = _decode_document(name, data)
        by_cat, untimed = _complete_events_by_category(doc)
        lists = [_join(by_cat, cats) for cats in _ROLES]
        cpu, runtime, gpu, sync = lists
        if not (cpu or runtime or gpu):
            if untimed:
                _untimed_error(name, untimed)
            raise TraceFormatError(
                name,
                "trace holds no CPU op, runtime or GPU events (no 'X' events with category "
                "cpu_op, user_annotation, cuda_runtime or kernel)",
            )
        if not any(e.dur > 0 for lst in (cpu, runtime, gpu) for e in lst):
            raise TraceFormatError(name, "no 'X' event has a duration ('dur' missing or 0 everywhere): "
                                         "not a complete profiler trace")  # fmt: skip
        times = [_sort_by_time(lst) for lst in lists]
        for lst, (_, dur) in zip(lists, times, strict=True):
            if lst and dur.min() < 0:  # the default of an absent 'dur'
                untimed += [(e, "dur") for e in lst if e.dur < 0]
        if untimed:
            _untimed_error(name, untimed)
        unit_to_s = _unit_to_s(name, cpu or runtime or gpu, time_unit)
        _check_time_range(name, lists, times, unit_to_s)
        _check_device_events(name, runtime, gpu, sync, unit_to_s)
        dist = _distributed(name, doc.distributedInfo)
        world = dist.get("world_size")
        coverage = _check_cpu_args(name, cpu, gpu, world if isinstance(world, int) else None)
        return KinetoTrace(
            source=name, cpu=cpu, runtime=runtime, gpu=gpu, sync=sync, distributed=dist,
            devices=list(doc.deviceProperties or []), unit_to_s=unit_to_s,
            rank_hint=rank_from_name(name), counts={c: len(v) for c, v in by_cat.items()},
            event_coverage=coverage,
        )  # fmt: skip


def _bad_utf8(data: bytes, chunk: int = 1 << 20) -> int | None:
    """The offset of the first byte that is not valid UTF-8, or None (decoded a chunk at a
    time: a trace may be gigabytes)."""
    import codecs

    dec = codecs.getincrementaldecoder("utf-8")()
    for start in range(0, len(data), chunk):
        pending = len(dec.getstate()[0])  # a sequence the last chunk cut, decoded with this one
        try:
            dec.decode(data[start : start + chunk], final=start + chunk >= len(data))
        except UnicodeDecodeError as e:
            return start - pending + int(e.start)
    return None


def _decode_document(name: str, data: bytes) -> _Doc:
    if is_trainsim_timeline(data[:256]):  # a simulation, not a measurement
        raise TraceFormatError(name, "a timeline trainsim wrote (--timeline: a simulated step), not a profiler "
                                     "trace: give the trace it was simulated from")  # fmt: skip
    try:
        doc = msgspec.json.decode(data, type=_Doc)
    except msgspec.ValidationError as e:
        if str(e).startswith("Expected `object`"):
            raise TraceFormatError(
                name, f"JSON is not a Kineto trace ({e}); expected an object with 'traceEvents'"
            ) from e
        raise TraceFormatError(
            name, f"not a valid Kineto trace: {e} (corrupt file, or a producer we do not support)"
        ) from e
    except msgspec.DecodeError as e:
        bad = _bad_utf8(data) if "utf-8" in str(e).lower() else None  # msgspec >= 0.19 says so, no offset
        if bad is not None:
            raise TraceFormatError(name, f"invalid UTF-8 in a JSON string at byte {bad}") from e
        raise TraceFormatError(name, f"invalid or truncated JSON ({e})") from e
    except UnicodeDecodeError as e:  # older msgspec raises it for invalid UTF-8 inside a string
        raise TraceFormatError(name, f"invalid UTF-8 in a JSON string at byte {e.start}") from e
    except MemoryError:
        raise too_large(name, f"{len(data) / 1e9:.2f} GB of JSON") from None
    if doc.traceEvents is None:
        raise TraceFormatError(name, "JSON has no 'traceEvents' list (expected a Kineto trace)")
    return doc


_KEPT_CATS = frozenset().union(*_ROLES)


def _complete_events_by_category(doc: _Doc) -> tuple[dict[str, list[Event]], list[tuple[Event, str]]]:
    """The 'X' events with a start time by category, and (event, "ts") for those of the kept
    roles that lack one (a real trace has 'ts' and 'dur' on every one)."""
    by_cat: dict[str, list[Event]] = {}
    untimed: list[tuple[Event, str]] = []
    for e in doc.traceEvents or ():
        if type(e) is Event:
            if e.ts is None:
                if e.cat in _KEPT_CATS:
                    untimed.append((e, "ts"))
                continue
            lst = by_cat.get(e.cat)
            if lst is None:
                by_cat[e.cat] = lst = []
            lst.append(e)
    doc.traceEvents = None  # the other phases' placeholders are garbage now
    return by_cat, untimed


def _untimed_error(name: str, untimed: list[tuple[Event, str]]) -> None:
    groups = Counter((e.cat, field) for e, field in untimed)
    (cat, missing), n = groups.most_common(1)[0]
    first = next(e for e, f in untimed if (e.cat, f) == (cat, missing))
    more = f" (and {len(untimed) - n} other events lack 'ts' or 'dur')" if len(untimed) > n else ""
    lack = "events lack" if n > 1 else "event lacks"
    raise TraceFormatError(name, f"{n} {cat} {lack} '{missing}'{more}, e.g. {short_text(first.name)!r}: "
                                 "every complete ('X') event has a start time and a duration; a cut or edited trace")  # fmt: skip


def _join(by_cat: dict[str, list[Event]], cats: frozenset[str]) -> list[Event]:
    parts = [by_cat[c] for c in cats if c in by_cat]  # by_cat is private: no copy needed
    return parts[0] if len(parts) == 1 else [e for p in parts for e in p]


def _sort_by_time(events: list[Event]) -> tuple[np.ndarray, np.ndarray]:
    """Sort in place by (ts ascending, dur descending): a parent before the children it
    contains. Returns the sorted ts and dur arrays (raw unit)."""
    n = len(events)
    ts = np.fromiter(map(_BY_TS, events), dtype=np.float64, count=n)
    dur = np.fromiter(map(_BY_DUR, events), dtype=np.float64, count=n)
    order = np.lexsort((-dur, ts))  # stable: equal keys keep file order
    objs = np.empty(n, dtype=object)
    objs[:] = events
    events[:] = objs[order].tolist()
    return ts[order], dur[order]


_BY_TS, _BY_DUR = attrgetter("ts"), attrgetter("dur")


def _unit_to_s(name: str, events: list[Event], override: str | None) -> float:
    if override is not None:
        try:
            return TIME_UNITS_S[override]
        except KeyError:
            raise ConfigError(
                f"unknown time unit {override!r} for {name}: use one of {sorted(TIME_UNITS_S)}"
            ) from None
    # Events are sorted by ts: the middle one is the median, immune to one corrupt timestamp.
    median_ts = float(events[len(events) // 2].ts)  # type: ignore[arg-type]
    if median_ts > 1e17:  # epoch nanoseconds (2001+); epoch µs is ~1.7e15
        return 1e-9
    return 1e-6


def _check_time_range(
    name: str,
    lists: list[list[Event]],
    times: list[tuple[np.ndarray, np.ndarray]],
    unit_to_s: float,
) -> None:
    """Reject timestamps too large to resolve a microsecond, and an event far from the bulk of
    the trace: a corrupt digit in a timestamp."""
    all_ts = np.concatenate([ts for ts, _ in times])
    top = float(all_ts.max())
    resolution_s = float(np.spacing(top)) * unit_to_s  # float64 steps between timestamps there
    if resolution_s > MAX_RESOLUTION_S:
        unit = next((u for u, s in TIME_UNITS_S.items() if s == unit_to_s), f"x {unit_to_s:g} s")
        raise TraceFormatError(name, f"timestamps reach {top:.3g} {unit}: so large that float64 values there lie "
                                     f"{resolution_s * 1e6:.3g} µs apart, too coarse for the trace's times; no clock "
                                     "writes such values (corrupt or shifted timestamps)")  # fmt: skip
    median = float(np.median(all_ts))
    spread = float(np.median(np.abs(all_ts - median)))  # robust to up to half the events
    half = max(MAX_TIME_RANGE_S / unit_to_s, 20 * spread)
    lo, hi = median - half, median + half
    for lst, (ts, dur) in zip(lists, times, strict=True):
        if not lst:
            continue
        i = 0 if ts[0] < lo else len(lst) - 1 if ts[-1] > hi else int(np.argmax(dur))
        if ts[i] < lo or ts[i] > hi or dur[i] > 2 * half:
            bad = lst[i]
            raise TraceFormatError(
                name,
                f"event {short_text(bad.name)!r} ({bad.cat}) at ts={bad.ts} dur={bad.dur} lies outside the "
                f"trace's time range [{lo:.0f}, {hi:.0f}]: corrupt timestamp or duration",
            )


def _distributed(name: str, info: dict[str, Any] | None) -> dict[str, Any]:
    dist = dict(info or {})
    rank, world = dist.get("rank"), dist.get("world_size")
    if isinstance(world, int) and not 1 <= world <= MAX_WORLD_SIZE:
        raise TraceFormatError(
            name, f"distributedInfo.world_size is {world}; expected 1..{MAX_WORLD_SIZE}"
        )
    if isinstance(rank, int) and (rank < 0 or (isinstance(world, int) and rank >= world)):
        raise TraceFormatError(
            name, f"distributedInfo.rank is {rank}, outside 0..world_size-1 (world_size {world})"
        )
    return dist


def _check_device_events(
    name: str, runtime: list[Event], gpu: list[Event], sync: list[Event], unit_to_s: float
) -> None:
    """Streams become ints (ROCm writes hex strings); launch dimensions are sizes; and a device
    activity cannot start before the runtime call that launched it (a corrupt timestamp)."""
    launch_ts: dict[int, float] = {}
    reused: dict[int, list[Event]] = {}  # correlation id -> the runtime calls after the first
    for e in runtime:  # sorted by ts: setdefault keeps the earliest call per correlation
        a = e.args
        if a is not None:
            if _needs_check(a):
                _check_device_args(name, e, a)
            if a.correlation is not None:
                if a.correlation in launch_ts and a.correlation:  # 0: no id
                    reused.setdefault(a.correlation, []).append(e)
                launch_ts.setdefault(a.correlation, e.ts)  # type: ignore[arg-type]
    if reused:
        corr, again = max(reused.items(), key=lambda kv: len(kv[1]))
        more = f" (and {len(reused) - 1} other ids used more than once)" if len(reused) > 1 else ""
        raise TraceFormatError(name, f"correlation id {corr} is used by {len(again) + 1} runtime calls{more}, "
                                     f"e.g. {short_text(again[0].name)!r} at ts={again[0].ts}: each call has "
                                     "its own id; corrupt correlation ids")  # fmt: skip
    slack = LAUNCH_SKEW_S / unit_to_s
    # An activity exported twice: the same stream, name, time, duration and launch (correlation
    # id). Activities of one stream may genuinely overlap (Hopper's programmatic dependent launch
    # starts a kernel before the one ahead of it ends; one launch may run a CUDA graph's branches
    # side by side), and older integer-µs traces round two back-to-back sub-µs launches of one
    # kernel to one time with dur 0, each with its own id: none of those is refused.
    seen: set[tuple[int | str, int, float | None, float, str, int]] = set()
    twice: list[Event] = []
    for g in gpu:
        a = g.args
        if a is None:
            continue
        if _needs_check(a):
            _check_device_args(name, g, a)
        t0 = launch_ts.get(a.correlation) if a.correlation is not None else None
        if t0 is not None and g.ts < t0 - slack:  # type: ignore[operator]
            raise TraceFormatError(
                name,
                f"device activity {short_text(g.name)!r} (correlation {a.correlation}) starts at "
                f"ts={g.ts}, before the runtime call that launched it (ts={t0}): corrupt "
                "timestamp or correlation id",
            )
        if type(a.stream) is int and g.dur and a.correlation is not None:
            key = (g.pid, a.stream, g.ts, g.dur, g.name, a.correlation)
            if key in seen:
                twice.append(g)
            else:
                seen.add(key)
    if twice:
        _twice_error(name, twice)
    for e in sync:
        if e.args is not None:
            _check_device_args(name, e, e.args)


def _twice_error(name: str, twice: list[Event]) -> None:
    streams = sorted({g.args.stream for g in twice if g.args is not None})
    where = f"stream {streams[0]}" if len(streams) == 1 else f"streams {', '.join(map(str, streams[:5]))}"
    g = twice[0]
    raise TraceFormatError(name, f"device activities exported twice on {where} ({len(twice)} "
                                 f"pair{'s' * (len(twice) > 1)}; first {short_text(g.name)!r} at ts={g.ts} "
                                 f"dur={g.dur}, correlation {g.args.correlation if g.args else None}, twice): "
                                 "duplicated events")  # fmt: skip


MAX_TEXT_IN_MESSAGE = 120  # kernel names run to thousands of characters (templates)


def short_text(text: str, limit: int = MAX_TEXT_IN_MESSAGE) -> str:
    """An event name, or a value's text, cut for a one-line message."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _needs_check(a: Args) -> bool:
    s = a.stream
    return (
        (s is not None and type(s) is not int)
        or bool(a.grid_json)
        or bool(a.block_json)
        or a.in_split is not None
        or a.out_split is not None
    )


def _check_device_args(name: str, e: Event, a: Args) -> None:
    s = a.stream
    if s is not None and type(s) is not int:
        a.stream = _stream_id(name, e, s)
    for label, raw in (("grid", a.grid_json), ("block", a.block_json)):
        if not raw or not bytes(raw).strip(b"[]0123456789, "):
            continue  # absent, or a list of non-negative integers
        dims = msgspec.json.decode(raw)
        if type(dims) is list and dims:
            try:
                bad = min(dims) < 0
            except TypeError:  # a string, list or null among numbers
                bad = True
            if bad:
                raise TraceFormatError(
                    name,
                    f"kernel {short_text(e.name)!r} at ts={e.ts}: '{label}' {short_text(repr(dims))} is not a list of sizes",
                )
    if a.in_split is not None or a.out_split is not None:
        _check_comm_args(name, e, a, None)


def _stream_id(name: str, e: Event, value: object) -> int:
    if isinstance(value, str):
        try:
            return int(value, 0)
        except ValueError:
            pass
    raise TraceFormatError(
        name,
        f"event {short_text(e.name)!r} at ts={e.ts}: 'stream' is {short_text(repr(value))}; expected an integer or a hex "
        "string such as '0x0'",
    )


def _check_cpu_args(
    name: str, cpu: list[Event], gpu: list[Event], world_size: int | None
) -> float | None:
    """Tensor sizes are non-negative, process groups hold distinct ranks of the job; returns
    the share of 'Ev Idx' indices present per process (``KinetoTrace.event_coverage``)."""
    idx_by_pid: dict[int | str, list[int]] = defaultdict(list)
    for e in cpu:
        a = e.args
        if a is None:
            continue
        if a.ev_idx is not None:
            idx_by_pid[e.pid].append(a.ev_idx)
        dims = a.input_dims_json
        if dims and b"-" in bytes(dims) and _has_negative(a.input_dims):
            raise TraceFormatError(
                name, f"event {short_text(e.name)!r} at ts={e.ts}: negative size in 'Input Dims' {short_text(str(a.input_dims))}"
            )
        if a.in_split is not None or a.out_split is not None or a.pg_ranks is not None:
            _check_comm_args(name, e, a, world_size)
    for g in gpu:
        if g.args is not None and g.args.pg_ranks is not None:
            _check_comm_args(name, g, g.args, world_size)
    if not idx_by_pid:
        return None
    present = spanned = 0
    for idx in idx_by_pid.values():
        present += len(set(idx))
        spanned += max(idx) - min(idx) + 1
    return present / spanned


def _has_negative(dims: Any) -> bool:
    if type(dims) is not list:
        return False
    for d in dims:
        if type(d) is int:
            if d < 0:
                return True
        elif type(d) is list and _has_negative(d):
            return True
    return False


def _int_list(value: Any) -> list[Any] | None:
    """A JSON list given as a list or as its text ("[0, 1]"); None when it is neither
    (PyTorch truncates long lists to "[0, 1, ..., ...]", which is not JSON)."""
    if isinstance(value, str):
        try:
            value = msgspec.json.decode(value)
        except (msgspec.DecodeError, UnicodeDecodeError):
            return None
    return value if isinstance(value, list) else None


def _check_comm_args(name: str, e: Event, a: Args, world_size: int | None) -> None:
    where = f"event {short_text(e.name)!r} at ts={e.ts}"
    for label, value in (("In split size", a.in_split), ("Out split size", a.out_split)):
        splits = _int_list(value)
        if splits and not all(type(s) is int and 0 <= s <= MAX_COUNT for s in splits):
            raise TraceFormatError(
                name, f"{where}: '{label}' {short_text(repr(value))} holds a negative or non-integer size"
            )
    ranks = _int_list(a.pg_ranks)
    if not ranks:
        return
    if not all(type(r) is int and r >= 0 for r in ranks):
        raise TraceFormatError(
            name, f"{where}: 'Process Group Ranks' {short_text(repr(a.pg_ranks))} holds a non-rank value"
        )
    if len(set(ranks)) != len(ranks):
        raise TraceFormatError(
            name, f"{where}: 'Process Group Ranks' {short_text(repr(a.pg_ranks))} lists a rank twice"
        )
    if world_size is not None and max(ranks) >= world_size:
        raise TraceFormatError(
            name, f"{where}: 'Process Group Ranks' {short_text(repr(a.pg_ranks))} exceeds world_size {world_size}"
        )
