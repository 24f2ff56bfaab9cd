"""Turn an op's sync points into simulator edges, resolving what ingestion left open.

Kineto traces without ``cuda_sync`` events do not say which stream a ``cudaStreamWaitEvent``
makes wait; ingestion infers it from the next kernel the same op launches and leaves it
``None`` otherwise. Here, inside the simulator (the IR is not changed):

- the waiting stream of an unresolved wait is the stream of the next kernel launched by the
  same CPU thread (else by any thread of the rank); if that is the waited-on stream itself,
  the wait is a no-op;
- the wait applies to the first kernel issued on the waiting stream after the call;
- with measured times, a wait (or a blocking sync) that the trace contradicts — the dependent
  kernel started before the awaited one ended — is dropped: no real wait can be violated.
  NCCL's own event waits right after a collective launch (its internal streams) are the
  typical case. Every decision is counted in the rank's diagnostics.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass

from trainsim.ir.graph import Kernel, SyncPoint
from trainsim.ir.kinds import SyncKind

# Kineto rounds timestamps and durations to 1 µs (or 1 ns): a wait is "contradicted" only if
# the dependent started more than this before the awaited kernel ended.
TOLERANCE_S = 2e-6


@dataclass(slots=True)
class IssueIndex:
    """Per-rank lookups over kernels in issue order (keys are call issue keys)."""

    kernels: list[Kernel]
    keys: list[float]  # issue key of each kernel (by kernel index)
    threads: list[int]  # CPU thread of each kernel's op
    by_id: dict[int, int]  # Kernel.id → kernel index
    _all: list[tuple[float, int]]
    _stream: dict[int, list[tuple[float, int]]]
    _thread: dict[int, list[tuple[float, int]]] | None = None  # built on first use

    @classmethod
    def build(cls, kernels: list[Kernel], keys: list[float], threads: list[int]) -> IssueIndex:
        everything = sorted(zip(keys, range(len(kernels)), strict=True))
        per_stream: dict[int, list[tuple[float, int]]] = {}
        for item in everything:
            st = kernels[item[1]].stream
            lst = per_stream.get(st)
            if lst is None:
                per_stream[st] = [item]
            else:
                lst.append(item)
        by_id = {k.id: i for i, k in enumerate(kernels)}
        return cls(kernels, keys, threads, by_id, everything, per_stream)

    @staticmethod
    def _after(lst: list[tuple[float, int]], key: float) -> int | None:
        j = bisect.bisect_right(lst, (key, float("inf")))
        return lst[j][1] if j < len(lst) else None

    @staticmethod
    def _before(lst: list[tuple[float, int]], key: float) -> int | None:
        j = bisect.bisect_left(lst, (key, -1)) - 1
        return lst[j][1] if j >= 0 else None

    def next_on_thread(self, thread: int, key: float) -> int | None:
        if self._thread is None:
            self._thread = {}
            for item in self._all:
                self._thread.setdefault(self.threads[item[1]], []).append(item)
        return self._after(self._thread.get(thread, []), key)

    def next_any(self, key: float) -> int | None:
        return self._after(self._all, key)

    def next_on_stream(self, stream: int, key: float) -> int | None:
        return self._after(self._stream.get(stream, []), key)

    def last_on_stream(self, stream: int, key: float) -> int | None:
        return self._before(self._stream.get(stream, []), key)

    def streams(self) -> list[int]:
        return list(self._stream)


def contradicted(dependent: Kernel, awaited: Kernel) -> bool:
    if dependent.start_s is None or awaited.end_s is None:
        return False
    return dependent.start_s < awaited.end_s - TOLERANCE_S


def event_wait(
    s: SyncPoint, *, key: float, thread: int, idx: IssueIndex, diag: Counter[str]
) -> tuple[int, int] | None:
    """(dependent kernel, awaited kernel) for a STREAM_WAIT_EVENT, or None when it has no effect."""
    awaited = idx.by_id.get(s.wait_on_kernel) if s.wait_on_kernel is not None else None
    if awaited is None and s.wait_on_stream is not None:
        awaited = idx.last_on_stream(s.wait_on_stream, key)
    if awaited is None:
        diag["waits_unresolved"] += 1
        return None
    src_stream = idx.kernels[awaited].stream
    stream = s.stream
    if stream is None:
        nxt = idx.next_on_thread(thread, key)
        if nxt is None:
            nxt = idx.next_any(key)
        if nxt is None:
            diag["waits_unresolved"] += 1
            return None
        stream = idx.kernels[nxt].stream
        diag["waits_stream_inferred"] += 1
    if stream == src_stream:
        diag["waits_noop"] += 1
        return None
    dependent = idx.next_on_stream(stream, key)
    if dependent is None:
        diag["waits_noop"] += 1
        return None
    if contradicted(idx.kernels[dependent], idx.kernels[awaited]):
        diag["waits_dropped_contradicted"] += 1
        return None
    diag["waits"] += 1
    return dependent, awaited


def blocking_targets(
    s: SyncPoint,
    *,
    key: float,
    idx: IssueIndex,
    end_s: float | None,
    diag: Counter[str],
) -> tuple[int, ...]:
    """Kernels a blocking sync (stream/event/device) waits for; ``end_s``: measured call end."""
    targets: list[int] = []
    if s.kind is SyncKind.DEVICE_SYNC:
        targets = [k for st in idx.streams() if (k := idx.last_on_stream(st, key)) is not None]
    else:
        k = idx.by_id.get(s.wait_on_kernel) if s.wait_on_kernel is not None else None
        stream = s.stream if s.stream is not None else s.wait_on_stream
        if k is None and stream is not None:
            k = idx.last_on_stream(stream, key)
        if k is not None:
            targets = [k]
        elif stream is None:  # nothing to go on: wait for the whole device (conservative)
            diag["blocking_as_device_sync"] += 1
            targets = [k for st in idx.streams() if (k := idx.last_on_stream(st, key)) is not None]
    kept = []
    for k in targets:
        ker = idx.kernels[k]
        if end_s is not None and ker.end_s is not None and end_s < ker.end_s - TOLERANCE_S:
            diag["blocking_dropped_contradicted"] += 1
            continue
        kept.append(k)
    diag["blocking_syncs"] += 1
    return tuple(kept)
