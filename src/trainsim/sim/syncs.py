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
from collections.abc import Callable

from trainsim.ir.graph import Kernel, SyncPoint
from trainsim.ir.kinds import SyncKind

# Kineto rounds timestamps and durations to 1 µs (or 1 ns): a wait is "contradicted" only if
# the dependent started more than this before the awaited kernel ended.
TOLERANCE_S = 2e-6


class IssueIndex:
    """Per-rank lookups over kernels in issue order (keys are call issue keys).

    Kernels are ranked by issue order (key, then index); a stream's or thread's kernels are
    kept as ascending ranks, so that every lookup is two bisections. Built lazily on first
    use: most ranks need a few lookups, some none. ``ordered``: the keys already ascend with
    the kernel index, and ``stream_lanes`` (stream → its kernel indices, ascending), when
    given, are the per-stream groups as they are; ``threads()``: each kernel's CPU thread,
    asked only for thread lookups.
    """

    def __init__(self, kernels: list[Kernel], keys: list[float], threads: Callable[[], list[int]], *,
                 ordered: bool = False, stream_lanes: dict[int, list[int]] | None = None) -> None:  # fmt: skip
        self.kernels = kernels
        self.keys = keys
        self._threads = threads
        self._ordered = ordered
        self._order: list[int] | None = None  # rank → kernel index
        self._okeys: list[float] | None = None  # rank → key (ascending)
        self._by_id: dict[int, int] | None = None
        self._stream: dict[int, list[int]] | None = stream_lanes if ordered else None
        self._thread: dict[int, list[int]] | None = None

    def index_of(self, kernel_id: int) -> int | None:
        """The kernel index of ``Kernel.id``, or None (ids are usually the indices)."""
        kernels = self.kernels
        if 0 <= kernel_id < len(kernels) and kernels[kernel_id].id == kernel_id:
            return kernel_id
        if self._by_id is None:
            self._by_id = {k.id: i for i, k in enumerate(self.kernels)}
        return self._by_id.get(kernel_id)

    def _ranked(self) -> tuple[list[int], list[float]]:
        if self._order is None:
            keys = self.keys
            if self._ordered:
                self._order, self._okeys = list(range(len(keys))), keys
            else:
                self._order = sorted(range(len(keys)), key=keys.__getitem__)
                self._okeys = [keys[i] for i in self._order]
        assert self._okeys is not None
        return self._order, self._okeys

    def _grouped(self, group: list[int]) -> dict[int, list[int]]:
        """Ranks of each group's kernels (``group``: per kernel), ascending; groups in the
        order of their first kernel's rank."""
        out: dict[int, list[int]] = {}
        for r, i in enumerate(self._ranked()[0]):
            g = group[i]
            got = out.get(g)
            if got is None:
                out[g] = [r]
            else:
                got.append(r)
        return out

    def _streams(self) -> dict[int, list[int]]:
        if self._stream is None:
            self._stream = self._grouped([k.stream for k in self.kernels])
        return self._stream

    def _after(self, group: list[int] | None, key: float) -> int | None:
        """The group's first kernel issued after ``key``."""
        if not group:
            return None
        okeys = self._okeys if self._okeys is not None else self._ranked()[1]
        q = bisect.bisect_left(group, bisect.bisect_right(okeys, key))
        return self._order[group[q]] if q < len(group) else None  # type: ignore[index]

    def _before(self, group: list[int] | None, key: float) -> int | None:
        """The group's last kernel issued before ``key``."""
        if not group:
            return None
        okeys = self._okeys if self._okeys is not None else self._ranked()[1]
        q = bisect.bisect_left(group, bisect.bisect_left(okeys, key)) - 1
        return self._order[group[q]] if q >= 0 else None  # type: ignore[index]

    def next_on_thread(self, thread: int, key: float) -> int | None:
        if self._thread is None:
            self._thread = self._grouped(self._threads())
        return self._after(self._thread.get(thread), key)

    def next_any(self, key: float) -> int | None:
        order, okeys = self._ranked()
        r = bisect.bisect_right(okeys, key)
        return order[r] if r < len(order) else None

    def next_on_stream(self, stream: int, key: float) -> int | None:
        return self._after(self._streams().get(stream), key)

    def last_on_stream(self, stream: int, key: float) -> int | None:
        return self._before(self._streams().get(stream), key)

    def streams(self) -> list[int]:
        """Streams in the order their first kernel was issued."""
        groups = self._streams()
        return sorted(groups, key=lambda st: groups[st][0] if groups[st] else -1)


def contradicted(dependent: Kernel, awaited: Kernel) -> bool:
    if dependent.start_s is None or awaited.end_s is None:
        return False
    return dependent.start_s < awaited.end_s - TOLERANCE_S


def event_wait(
    s: SyncPoint, *, key: float, thread: int, idx: IssueIndex, diag: Counter[str]
) -> tuple[int, int] | None:
    """(dependent kernel, awaited kernel) for a STREAM_WAIT_EVENT, or None when it has no effect."""
    awaited = idx.index_of(s.wait_on_kernel) if s.wait_on_kernel is not None else None
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
        k = idx.index_of(s.wait_on_kernel) if s.wait_on_kernel is not None else None
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
