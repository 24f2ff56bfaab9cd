"""T1–T5 statistics of the simulated workload itself (``HostMode.STATS``).

Same statistics as 002's T1–T5 (:func:`trainsim.host.overheads.collect_samples`, per op name, with the
global fallback), but sampled the way the simulator replays them, so that no waiting the
simulator derives by itself is also counted as host time:

- T1 is measured from the op's *binding* predecessor: the later of the previous op of its
  thread and its cross-thread predecessors (the autograd thread's hand-off, ``Op.deps``). A
  main thread blocked in ``backward()`` for 100 ms is not a 100 ms T1 of the optimizer's first
  op — that op waits for the autograd thread instead;
- T4 excludes calls that block the CPU until the device is done (synchronisations, and copies
  to or from pageable memory, whose duration is mostly waiting for the stream).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainsim.host.overheads import Overhead, OverheadDB, Stat, summarize

if TYPE_CHECKING:
    from trainsim.sim.program import RankProgram

# Sample lists per op name, indexed like _KINDS (plain indices: enum hashing is slow here).
_KINDS = (Overhead.T1, Overhead.T2, Overhead.T3, Overhead.T4, Overhead.T5, Overhead.CPU)
T1, T2, T3, T4, T5, CPU = range(6)
Samples = dict[str, list[list[float]]]


def collect(rp: RankProgram, into: Samples, entry: list[float]) -> None:
    """Add one rank's samples to ``into`` (op name → kind index → seconds) and its threads'
    step-entry gaps (CPU step start → first op without a predecessor) to ``entry``.

    This loop runs once per op of every rank (``max(0, x)`` written out: it is hot)."""
    ops, blocks, call0, preds = rp.ops, rp.call_block, rp.op_call0, rp.op_preds
    c_start, c_dur = rp.call_start_m, rp.call_dur_m
    prev_end: dict[int, float] = {}
    get_samples, get_prev = into.get, prev_end.get
    for oi, op in enumerate(ops):
        start, dur = op.start_s, op.duration_s
        if start is None or dur is None:
            continue
        d = get_samples(op.name)
        if d is None:
            d = into[op.name] = [[], [], [], [], [], []]
        thread = op.thread
        pe = anchor = get_prev(thread)
        if preds[oi]:
            for src, _ in preds[oi]:
                e = ops[src].end_s
                if e is not None and (anchor is None or e > anchor):
                    anchor = e
        if anchor is None:
            x = start - rp.cpu_start_s
            entry.append(x if x > 0.0 else 0.0)
        else:
            x = start - anchor
            d[T1].append(x if x > 0.0 else 0.0)
        end = start + dur
        prev_end[thread] = end if pe is None or end > pe else pe
        c0, c1 = call0[oi], call0[oi + 1]
        if c1 == c0:
            d[CPU].append(dur)
            continue
        last = start
        t5, t4 = d[T5], d[T4]
        for ci in range(c0, c1):
            s, cd = c_start[ci], c_dur[ci]
            if s is None or cd is None:
                break
            x = s - (start if ci == c0 else last)
            (d[T2] if ci == c0 else t5).append(x if x > 0.0 else 0.0)
            if blocks[ci] is None:
                t4.append(cd)
            last = max(last, s + cd)
        else:
            x = end - last
            d[T3].append(x if x > 0.0 else 0.0)


def self_overheads(ranks: list[RankProgram], *, filtered: bool) -> OverheadDB:
    """An :class:`OverheadDB` of the workload (IQR-filtered like 002 §4.4.2 when ``filtered``,
    else plain statistics), for export and comparison."""
    pooled: Samples = {}
    entry: list[float] = []
    for rp in ranks:
        collect(rp, pooled, entry)
    stat = summarize if filtered else _unfiltered
    db = OverheadDB(sources=["simulated workload (self statistics)"])
    glob: list[list[float]] = [[] for _ in _KINDS]
    for name, lists in pooled.items():
        db.per_op[name] = {_KINDS[i]: stat(v) for i, v in enumerate(lists) if v}
        for i, v in enumerate(lists):
            glob[i].extend(v)
    db.global_ = {_KINDS[i]: stat(v) for i, v in enumerate(glob) if v}
    return db


@dataclass(frozen=True, slots=True)
class SelfMeans:
    """What ``STATS`` mode needs from the workload itself."""

    per_op: dict[str, tuple[float, ...]]  # (T1, T2, T3, T4, T5, CPU) means per op name
    global_: tuple[float, ...]  # the same over every op
    entry_gap_s: float  # mean gap from a thread's step start to its first op
    call_median_s: float  # median runtime-call duration (T4): a blocking call's own duration


def self_means(ranks: list[RankProgram]) -> SelfMeans:
    """Per op name the mean (T1, T2, T3, T4, T5, CPU) — a kind the name has no sample of takes
    the global mean —, the global means, the mean step-entry gap, the median T4.

    Plain means, not 002's IQR-filtered ones: the simulator derives the waits that filtering
    was meant to remove (blocking calls, thread hand-offs) by itself, and a mean keeps each op
    name's total host time; the filtered means under-predict CPU-bound steps (DLRM: −10 %).
    The median T4 is the *typical* cost of one runtime call: a blocking call that does not
    wait takes that long. A mean would not do there — it stands for other calls' total time,
    and one-time costs dominate it (a first launch that loads a code module: 6.5 ms against
    ~6 µs for every other launch of the MI250 trace).
    """
    pooled: Samples = {}
    entry: list[float] = []
    for rp in ranks:
        collect(rp, pooled, entry)
    sums = [0.0] * 6
    counts = [0] * 6
    t4: list[float] = []
    for lists in pooled.values():
        t4.extend(lists[T4])
        for i, v in enumerate(lists):
            if v:
                sums[i] += math.fsum(v)
                counts[i] += len(v)
    glob = tuple(s / c if c else 0.0 for s, c in zip(sums, counts, strict=True))
    per_op = {
        name: tuple(math.fsum(v) / len(v) if v else glob[i] for i, v in enumerate(lists))
        for name, lists in pooled.items()
    }
    return SelfMeans(
        per_op,
        glob,
        math.fsum(entry) / len(entry) if entry else 0.0,
        statistics.median(t4) if t4 else 0.0,
    )


def _unfiltered(values: list[float]) -> Stat:
    """Plain statistics (no outlier filtering: count == raw_count)."""
    n = len(values)
    mean = math.fsum(values) / n
    ordered = sorted(values)
    mid = n // 2
    med = ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / n)
    return Stat(mean_s=mean, median_s=med, std_s=std, count=n, raw_count=n)
