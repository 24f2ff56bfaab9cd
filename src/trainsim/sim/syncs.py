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

import numpy as np

from trainsim.ir.graph import Kernel, SyncPoint
from trainsim.ir.kinds import SyncKind

# Kineto rounds timestamps and durations to 1 µs (or 1 ns): a wait is "contradicted" only if
# the dependent started more than this before the awaited kernel ended.
TOLERANCE_S = 2e-6


class IssueIndex:
    """Per-rank lookups over kernels in issue order (keys are call issue keys).

    Built lazily, piece by piece, on first use: most ranks need only a few lookups, and
    some none. ``ordered``: the keys already ascend with the kernel index (no sort needed);
    ``thread_of``: a kernel's CPU thread (its op's), asked only for thread lookups.
    """

    def __init__(self, kernels: list[Kernel], keys: list[float], thread_of: Callable[[int], int],
                 *, ordered: bool = False) -> None:  # fmt: skip
        self.kernels = kernels
        self.keys = keys
        self._thread_of = thread_of
        self._ordered = ordered
        self._order: list[int] | None = None
        self._by_id: dict[int, int] | None = None
        self._stream: dict[int, tuple[list[float], list[int]]] | None = None
        self._thread: dict[int, tuple[list[float], list[int]]] | None = None

    def index_of(self, kernel_id: int) -> int | None:
        """The kernel index of ``Kernel.id``, or None (ids are usually the indices)."""
        kernels = self.kernels
        if 0 <= kernel_id < len(kernels) and kernels[kernel_id].id == kernel_id:
            return kernel_id
        if self._by_id is None:
            self._by_id = {k.id: i for i, k in enumerate(self.kernels)}
        return self._by_id.get(kernel_id)

    def _issue_order(self) -> list[int]:
        if self._order is None:
            n = len(self.kernels)
            self._order = (
                list(range(n)) if self._ordered else sorted(range(n), key=self.keys.__getitem__)
            )
        return self._order

    def _grouped(self, group_of: Callable[[int], int]) -> dict[int, tuple[list[float], list[int]]]:
        out: dict[int, tuple[list[float], list[int]]] = {}
        keys = self.keys
        for i in self._issue_order():
            g = group_of(i)
            got = out.get(g)
            if got is None:
                out[g] = ([keys[i]], [i])
            else:
                got[0].append(keys[i])
                got[1].append(i)
        return out

    def _streams(self) -> dict[int, tuple[list[float], list[int]]]:
        """Per stream, its kernels in issue order (vectorised: this runs for every rank with
        a sync to resolve); streams in the order their first kernel was issued."""
        if self._stream is None:
            n = len(self.kernels)
            stream = np.fromiter((k.stream for k in self.kernels), dtype=np.int64, count=n)
            keys = np.asarray(self.keys, dtype=float)
            order = np.lexsort((np.arange(n), keys, stream))  # by stream, key, index
            cuts = np.flatnonzero(np.diff(stream[order])) + 1
            groups = [(keys[g].tolist(), g.tolist()) for g in np.split(order, cuts) if g.size]
            groups.sort(key=lambda grp: (grp[0][0], grp[1][0]))
            self._stream = {self.kernels[g[1][0]].stream: g for g in groups}
        return self._stream

    @staticmethod
    def _after(group: tuple[list[float], list[int]] | None, key: float) -> int | None:
        """The first kernel issued after ``key``."""
        if group is None:
            return None
        j = bisect.bisect_right(group[0], key)
        return group[1][j] if j < len(group[1]) else None

    @staticmethod
    def _before(group: tuple[list[float], list[int]] | None, key: float) -> int | None:
        """The last kernel issued before ``key``."""
        if group is None:
            return None
        j = bisect.bisect_left(group[0], key) - 1
        return group[1][j] if j >= 0 else None

    def next_on_thread(self, thread: int, key: float) -> int | None:
        if self._thread is None:
            self._thread = self._grouped(self._thread_of)
        return self._after(self._thread.get(thread), key)

    def next_any(self, key: float) -> int | None:
        order = self._issue_order()
        keys = [self.keys[i] for i in order] if not self._ordered else self.keys
        return self._after((keys, order), key)

    def next_on_stream(self, stream: int, key: float) -> int | None:
        return self._after(self._streams().get(stream), key)

    def last_on_stream(self, stream: int, key: float) -> int | None:
        return self._before(self._streams().get(stream), key)

    def streams(self) -> list[int]:
        return list(self._streams())


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
