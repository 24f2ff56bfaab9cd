"""Compile a Workload into flat per-rank programs the engine evaluates.

A rank program has *lanes*: one per CPU thread (its ops in issue order, each op a sequence of
runtime calls) and one per stream (its kernels in FIFO order). Everything else is an edge:

- a kernel starts at max(its call's start + launch latency, its stream/event/data readiness
  + kernel-kernel gap) — readiness being the previous kernel of its stream (or the previous
  step's backlog), the kernels it waits for (event waits, ``Op.deps``) and, for a collective,
  the start of the first dependent of the previous collective on its stream (000 §III-D);
- a blocking call (stream/event/device sync, a copy to or from pageable memory) ends at
  max(its start + its own duration, the awaited kernels' end + wake-up);
- an op starts after the previous op of its thread (T1) and after its cross-thread
  predecessors (inferred fork/join edges, ``Op.deps`` on other threads);
- every member of a collective instance (same group and sequence number) ends at the latest
  member's start plus the instance's transfer time.

Compilation has three phases: the *structure* (calls, lanes, edges: here), the *timings*
(host gaps, blocking calls, launch latencies: ``timings.py``) — apart so that ``STATS`` mode can
take its statistics from the structure of every rank first (``selfstats.py``) — and the
collective instances across ranks (``collectives.py``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np

from trainsim.errors import SimulationError
from trainsim.host.overheads import OverheadDB
from trainsim.ir.graph import Collective, Kernel, Op, RankGraph, SyncPoint, Workload
from trainsim.ir.kinds import KernelFamily, SyncKind
from trainsim.sim import syncs
from trainsim.sim.collectives import NO_MODEL, Instance, build_instances
from trainsim.sim.durations import (
    CollectiveSystem,
    ModelRegistry,
    collective_system,
    default_registry,
    device_spec,
)
from trainsim.sim.edges import intra_rank_rule, thread_edges
from trainsim.sim.host import HostModel, blocks_cpu_copy, op_calls
from trainsim.sim.options import HostMode, KernelSource, SimOptions
from trainsim.sim.timings import end_tails, fill_timings
from trainsim.sim.whatif import RESIZE, WHATIF

# Kernel durations a pass over the workload predicted (what-if, resize): they replace the
# measured ones whatever the kernel source, as the pass meant.
_PASSES = (WHATIF, RESIZE)
# the provenance of a kernel only what-if passes changed, from its measured duration
_WHATIF_OF_MEASURED = re.compile(rf"^(?:{WHATIF} ×\S+ of )+measured$")


@dataclass(slots=True)
class RankProgram:
    graph: RankGraph
    cpu_start_s: float
    step_start_s: float
    ops: list[Op]
    # structure
    op_lane: list[int] = field(default_factory=list)
    op_call0: list[int] = field(default_factory=list)  # calls of op o: op_call0[o]:op_call0[o+1]
    op_preds: list[tuple[tuple[int, float | None], ...]] = field(
        default_factory=list
    )  # cross-thread
    # runtime calls, as columns (a call launches kernels call_k0[c]:call_k0[c+1], or syncs)
    call_key: list[float] = field(default_factory=list)  # issue order within the rank
    call_start_m: list[float | None] = field(default_factory=list)  # measured start
    call_dur_m: list[float | None] = field(default_factory=list)  # measured duration
    call_sync: list[SyncPoint | None] = field(default_factory=list)
    call_k0: list[int] = field(default_factory=list)
    call_op: list[int] = field(default_factory=list)
    multi_calls: list[int] = field(default_factory=list)  # calls that launched several kernels
    blocking_calls: list[int] = field(default_factory=list)  # calls with a call_block
    # calls by which a gloo worker thread's own record runs its collective (see _worker_runs)
    worker_runs: set[int] = field(default_factory=set)
    call_block: list[tuple[int, ...] | None] = field(default_factory=list)
    kernels: list[Kernel] = field(default_factory=list)
    k_call: list[int] = field(default_factory=list)
    k_lane: list[int] = field(default_factory=list)
    k_dur: list[float] = field(default_factory=list)  # collectives: the member's own duration
    k_prov: list[str] = field(default_factory=list)
    k_waits: list[tuple[int, ...]] = field(
        default_factory=list
    )  # kernels whose END bounds the start
    k_after: list[tuple[int, ...]] = field(default_factory=list)  # kernels whose START bounds it
    k_inst: list[int] = field(default_factory=list)
    cpu_lanes: list[list[int]] = field(default_factory=list)
    lane_thread: list[int] = field(default_factory=list)
    stream_lanes: list[list[int]] = field(default_factory=list)
    lane_stream: list[int] = field(default_factory=list)
    lane_busy_until: list[float | None] = field(default_factory=list)
    device: Any = None  # catalog DeviceSpec once looked up (False: not in the catalog)
    end_tail_s: float = 0.0  # a rank without device kernels: its step ends this long after its ops
    # a rank without device kernels: the ops whose ends bound its CPU window (all but the
    # records of its gloo collectives on their worker threads, which its kernels stand for)
    window_ops: list[int] = field(default_factory=list)
    # timings
    op_t1: list[float] = field(default_factory=list)
    op_cross: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    op_tail: list[float] = field(default_factory=list)
    call_gap: list[float] = field(default_factory=list)
    call_dur: list[float] = field(default_factory=list)
    call_wake: list[float] = field(default_factory=list)
    k_lat: list[float] = field(default_factory=list)  # from the call's start
    k_gap: list[float] = field(default_factory=list)
    k_hold: dict[int, float] = field(default_factory=dict)  # graph nodes: measured internal wait
    typical_post_s: dict[bool, float | None] = field(default_factory=dict)  # by is-memory class
    typical_gap_s: dict[bool, float | None] = field(default_factory=dict)
    diagnostics: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True)
class Program:
    workload: Workload
    ranks: list[RankProgram]
    instances: list[Instance]
    options: SimOptions
    collective_system: CollectiveSystem | None = None  # MODEL mode: whose comm models answer


def compile_workload(w: Workload, options: SimOptions) -> Program:
    system = None
    if options.kernels is KernelSource.MODEL and options.kernel_models is None:
        system = collective_system((rg.device for rg in w.ranks), options.system)
    registry = options.kernel_models or default_registry(system.spec if system else None)
    ranks = [_structure(rg, registry, options) for rg in w.ranks]
    if options.overheads is HostMode.STATS and options.overhead_db is None:
        from trainsim.sim.selfstats import self_means, self_overheads

        means = self_means(ranks)
        if options.stats_iqr:
            host = HostModel(
                options.overheads,
                self_overheads(ranks, filtered=True),
                entry_gap_s=means.entry_gap_s,
                blocking_s=means.call_median_s,
            )
        else:
            host = HostModel(
                options.overheads,
                means=(means.per_op, means.global_),
                entry_gap_s=means.entry_gap_s,
                blocking_s=means.call_median_s,
            )
    else:
        host = HostModel(options.overheads, options.overhead_db)
    for rp in ranks:
        fill_timings(rp, host, options)
    end_tails(ranks, options.overheads)

    def duration(
        k: Kernel, op: Op, rp: RankProgram, members: Mapping[int, Collective] | None
    ) -> tuple[float, str]:
        return _duration(k, op, options, registry, rp, members=members)

    return Program(w, ranks, build_instances(w, ranks, options, duration), options, system)


# ---------------------------------------------------------------------------------- structure


def _duration(
    k: Kernel,
    op: Op,
    opts: SimOptions,
    reg: ModelRegistry,
    rp: RankProgram,
    *,
    members: Mapping[int, Collective] | None = None,
) -> tuple[float, str]:
    if k.predicted_s is not None and k.provenance.startswith(_PASSES):
        if opts.kernels is KernelSource.MODEL and _WHATIF_OF_MEASURED.match(k.provenance) and k.duration_s:
            # what-ifs of a measured kernel scale the time this mode gives it, the model's: a
            # collective's measured time counts waiting for peers (network ×1 had been +38 % on
            # the DLRM, ×2 slower than no what-if)
            factor = k.predicted_s / k.duration_s
            seconds, prov = _duration(replace(k, predicted_s=None, provenance=""), op, opts, reg, rp, members=members)
            return seconds * factor, f"{WHATIF} ×{factor:g} of {prov}"
        return k.predicted_s, k.provenance  # a what-if or resize pass changed this kernel
    if opts.kernels is KernelSource.MODEL:
        if k.predicted_s is not None:
            return k.predicted_s, k.provenance or "predicted"
        if rp.device is None:
            rp.device = device_spec(rp.graph.device) or False
        p = reg.predict(k, op, rp.device or None, members=members)
        if p is not None:
            rp.diagnostics["kernels_model"] += 1
            return p.seconds, p.provenance
        if k.duration_s is not None:
            rp.diagnostics["kernels_model_fallback_measured"] += 1
            return k.duration_s, NO_MODEL
    elif k.duration_s is not None:
        return k.duration_s, "measured"
    elif k.predicted_s is not None:
        return k.predicted_s, k.provenance or "predicted"
    raise SimulationError(
        f"rank {rp.graph.rank}: kernel {k.id} ({k.name[:60]}) of op {op.id} ({op.name}) has no "
        f"{'prediction' if opts.kernels is KernelSource.MODEL else 'measured duration'}; "
        "annotate it with a kernel model or use --kernels model"
    )


def _structure(rg: RankGraph, reg: ModelRegistry, opts: SimOptions) -> RankProgram:
    first = next((o.start_s for o in rg.ops if o.start_s is not None), None)
    cpu_start = rg.metadata.get("cpu_step_start_s", rg.step_start_s)
    cpu_start = float(cpu_start if cpu_start is not None else (first if first is not None else 0.0))
    step_start = float(rg.step_start_s if rg.step_start_s is not None else cpu_start)
    rp = RankProgram(graph=rg, cpu_start_s=cpu_start, step_start_s=step_start, ops=list(rg.ops))
    if rg.cpu_only:
        rp.window_ops = _window_ops(rg)
    timed = _all_known(rg.ops, "kernels", "launch_start_s") and _all_known(
        rg.ops, "syncs", "start_s"
    )
    kernel_op, copy_calls = _calls(rp, timed=timed)
    _durations(rp, kernel_op, reg, opts)
    n = len(rp.kernels)
    rp.call_block = [None] * len(rp.call_key)
    rp.k_waits = [()] * n  # tuples, replaced when an edge is added (most kernels have none)
    rp.k_after = [()] * n
    rp.k_inst = [-1] * n
    keys = [rp.call_key[c] for c in rp.k_call]
    by_start = _stream_lanes(rp, keys, ordered=not timed)
    ops = rp.ops
    idx = syncs.IssueIndex(
        rp.kernels,
        keys,
        lambda: [ops[o].thread for o in kernel_op],
        ordered=not timed,  # then lanes not ordered by measured starts are in issue order
        stream_lanes=None if by_start else dict(zip(rp.lane_stream, rp.stream_lanes, strict=True)),
    )
    _sync_edges(rp, idx, copy_calls)
    if opts.overheads is not HostMode.TRACE:
        _worker_runs(rp, kernel_op)
    _dep_edges(rp, kernel_op)
    if opts.intra_rank_sync:
        intra_rank_rule(rp, keys)
    rp.op_preds = thread_edges(rp, infer=opts.thread_edges)
    return rp


def _window_ops(rg: RankGraph) -> list[int]:
    """Indices of the ops on the rank's own threads: not on a thread that ran gloo collectives."""
    workers = {k.stream for op in rg.ops for k in op.kernels if k.on_host}
    own = [i for i, op in enumerate(rg.ops) if op.thread not in workers]
    return own or list(range(len(rg.ops)))


def _all_known(ops: list[Op] | tuple[Op, ...], items: str, time: str) -> bool:
    """Every kernel (sync) of ``ops`` has a measured ``time`` (iterated in C: once per op)."""
    return None not in map(attrgetter(time), chain.from_iterable(map(attrgetter(items), ops)))


def _calls(rp: RankProgram, *, timed: bool) -> tuple[list[int], list[int]]:
    """CPU lanes, runtime calls and kernels in issue order; returns each kernel's op and the
    calls that may be blocking copies (a memcpy, or several activities).

    This loop runs once per op of every rank: ops without syncs whose kernels each have
    their own call (one kernel, or no measured launch times) are handled inline, and the
    columns that follow from the others (a call's op and first kernel, a kernel's op) are
    derived at the end."""
    lane_of_thread: dict[int, tuple[int, list[int]]] = {}
    counter = [0]
    copy_calls: list[int] = []
    memcpy = KernelFamily.MEMCPY
    kernels, call_key, k_call = rp.kernels, rp.call_key, rp.k_call
    add_kernel, add_k_call = kernels.append, k_call.append
    add_key, add_start, add_dur = call_key.append, rp.call_start_m.append, rp.call_dur_m.append
    add_sync, add_op_lane, add_op_call0 = rp.call_sync.append, rp.op_lane.append, rp.op_call0.append
    cpu_lanes, lane_thread = rp.cpu_lanes, rp.lane_thread
    count = 0  # issue keys without measured launch times
    for oi, op in enumerate(rp.ops):
        thread = op.thread
        got = lane_of_thread.get(thread)
        if got is None:
            got = lane_of_thread[thread] = (len(cpu_lanes), [])
            cpu_lanes.append(got[1])
            lane_thread.append(thread)
        add_op_lane(got[0])
        got[1].append(oi)
        ci = len(call_key)
        add_op_call0(ci)
        ks = op.kernels
        if not op.syncs and (not timed or len(ks) <= 1):  # the common case: a call per kernel
            for k in ks:
                if timed:
                    add_key(k.launch_start_s)  # type: ignore[arg-type]  # timed: all known
                else:
                    count += 1
                    add_key(float(count))
                add_start(k.launch_start_s)
                add_dur(k.launch_duration_s)
                add_sync(None)
                add_kernel(k)
                add_k_call(ci)
                if k.family is memcpy:
                    copy_calls.append(ci)
                ci += 1
            continue
        counter[0] = count
        for key, start, dur, cks, sync in op_calls(op, timed=timed, counter=counter):
            add_key(key)
            add_start(start)
            add_dur(dur)
            add_sync(sync)
            for k in cks:
                add_kernel(k)
                add_k_call(ci)
            if len(cks) > 1:
                rp.multi_calls.append(ci)
                copy_calls.append(ci)
            elif cks and cks[0].family is memcpy:
                copy_calls.append(ci)
            ci += 1
        count = counter[0]
    add_op_call0(len(call_key))
    call0 = np.asarray(rp.op_call0, dtype=np.intp)
    call_op = np.repeat(np.arange(len(rp.ops), dtype=np.intp), np.diff(call0))
    rp.call_op = call_op.tolist()
    k_calls = np.asarray(k_call, dtype=np.intp)
    rp.call_k0 = np.searchsorted(k_calls, np.arange(len(call_key) + 1)).tolist()
    return call_op[k_calls].tolist(), copy_calls


def _durations(rp: RankProgram, kernel_op: list[int], reg: ModelRegistry, opts: SimOptions) -> None:
    """Each kernel's duration and its provenance (collectives: per instance, collectives.py)."""
    kernels = rp.kernels
    if opts.kernels is KernelSource.MEASURED:
        rp.k_dur = [k.duration_s for k in kernels]  # type: ignore[misc]
        rp.k_prov = ["measured"] * len(kernels)
        other = [
            i
            for i, k in enumerate(kernels)
            if k.collective is not None
            or k.duration_s is None
            or (k.predicted_s is not None and k.provenance.startswith(_PASSES))
        ]
    else:
        rp.k_dur, rp.k_prov = [0.0] * len(kernels), [""] * len(kernels)
        other = list(range(len(kernels)))
    for i in other:
        k = kernels[i]
        if k.collective is not None:
            rp.k_dur[i], rp.k_prov[i] = 0.0, ""
        else:
            rp.k_dur[i], rp.k_prov[i] = _duration(k, rp.ops[kernel_op[i]], opts, reg, rp)


def _stream_lanes(rp: RankProgram, keys: list[float], *, ordered: bool) -> bool:
    """One lane per stream, its kernels in FIFO order: by measured start when every kernel
    of the stream has one, else by issue key (``ordered``: keys already ascend with the
    kernel index, as they do without measured launch times). True if a lane is ordered by
    measured starts."""
    by_start = False
    by_stream: dict[int, list[int]] = {}
    for i, k in enumerate(rp.kernels):
        lst = by_stream.get(k.stream)
        if lst is None:
            by_stream[k.stream] = [i]
        else:
            lst.append(i)
    busy = {int(s): float(t) for s, t in rp.graph.metadata.get("stream_busy_until_s", {}).items()}
    rp.k_lane = k_lane = [0] * len(rp.kernels)
    kernels = rp.kernels
    for stream in sorted(by_stream):
        ks = by_stream[stream]
        if all(kernels[i].start_s is not None for i in ks):
            ks.sort(key=lambda i: (kernels[i].start_s, keys[i]))
            by_start = True
        elif not ordered:
            ks.sort(key=keys.__getitem__)
        lane = len(rp.stream_lanes)
        for i in ks:
            k_lane[i] = lane
        rp.stream_lanes.append(ks)
        rp.lane_stream.append(stream)
        rp.lane_busy_until.append(busy.get(stream))
    return by_start


def _sync_edges(rp: RankProgram, idx: syncs.IssueIndex, copy_calls: list[int]) -> None:
    diag = rp.diagnostics
    kernels, call_k0 = rp.kernels, rp.call_k0
    for ci, s in enumerate(rp.call_sync):
        if s is None:
            continue
        key = rp.call_key[ci]
        if s.kind.blocks_cpu:
            cs, cd = rp.call_start_m[ci], rp.call_dur_m[ci]
            end = None if cs is None or cd is None else cs + cd
            rp.call_block[ci] = syncs.blocking_targets(s, key=key, idx=idx, end_s=end, diag=diag)
            rp.blocking_calls.append(ci)
        elif s.kind is SyncKind.STREAM_WAIT_EVENT:
            thread = rp.ops[rp.call_op[ci]].thread
            edge = syncs.event_wait(s, key=key, thread=thread, idx=idx, diag=diag)
            if edge is not None:
                rp.k_waits[edge[0]] = (*rp.k_waits[edge[0]], edge[1])
    for ci in copy_calls:
        ks = kernels[call_k0[ci] : call_k0[ci + 1]]
        if blocks_cpu_copy(ks, rp.call_start_m[ci], rp.call_dur_m[ci]):
            rp.call_block[ci] = tuple(range(call_k0[ci], call_k0[ci + 1]))
            rp.blocking_calls.append(ci)
            diag["blocking_copies"] += 1


def _worker_runs(rp: RankProgram, kernel_op: list[int]) -> None:
    """A gloo collective recorded only on its worker thread (DDP's reducer enqueues it from
    C++, so no ``c10d::`` op pairs with it; ingestion makes the record an op on that thread
    and its kernel, on the thread as stream): the record does not launch the collective, it
    *is* the collective. Its call blocks until the kernel is done and the kernel starts with
    the call (``worker_runs``: no launch latency), so the op, and every op tied to its end
    (DDP's ``copy_bucket_to_grad``), ends with the simulated collective. Host statistics would
    otherwise replay the record's wall time (waiting for the peers included) as a launch call,
    the collective after it, and its mean over the records in place of each one's (a 2-rank
    CPU GPT-2 capture: +7.7 % in ``stats`` mode). Not in ``TRACE`` mode, which replays the
    record's measured span: the members of a gloo collective end milliseconds apart, which the
    simulator's common end cannot reproduce (+0.12 % on that capture had it followed it)."""
    ops = rp.ops
    for ki in range(len(rp.kernels)):
        if ops[kernel_op[ki]].is_worker_record:
            ci = rp.k_call[ki]
            if rp.call_block[ci] is None:
                rp.call_block[ci] = (ki,)
                rp.blocking_calls.append(ci)
            rp.worker_runs.add(ci)


def _dep_edges(rp: RankProgram, kernel_op: list[int]) -> None:
    """``Op.deps``: an op's kernels start after the last kernel (per stream) of each dep op."""
    if not any(map(attrgetter("deps"), rp.ops)):
        return
    index = {op.id: i for i, op in enumerate(rp.ops)}
    last: dict[int, dict[int, int]] = {}
    first: dict[int, dict[int, int]] = {}
    for ki, oi in enumerate(kernel_op):
        st = rp.kernels[ki].stream
        last.setdefault(oi, {})[st] = ki
        first.setdefault(oi, {}).setdefault(st, ki)
    for oi, op in enumerate(rp.ops):
        for d in op.deps:
            for awaited in last.get(index[d], {}).values():
                for dependent in first.get(oi, {}).values():
                    if rp.kernels[dependent].stream == rp.kernels[awaited].stream:
                        continue  # stream order already holds
                    if syncs.contradicted(rp.kernels[dependent], rp.kernels[awaited]):
                        rp.diagnostics["dep_edges_dropped_contradicted"] += 1
                        continue
                    rp.k_waits[dependent] = (*rp.k_waits[dependent], awaited)
                    rp.diagnostics["dep_edges"] += 1


def workload_overhead_db(workloads: Iterable[Workload], *, filtered: bool = True) -> OverheadDB:
    """The T1–T5 database of ``workloads`` (every rank pooled), sampled as the simulator replays
    them (:mod:`trainsim.sim.selfstats`: T1 from the binding predecessor, blocking calls out of
    T4), so that replaying a trace with its own database does not count waiting twice; IQR
    filtered per 002 §4.4.2 when ``filtered``. This is what ``analyze --overhead-db`` writes and
    ``--overheads shared`` reads."""
    from trainsim.sim.selfstats import self_overheads

    workloads = list(workloads)
    options = SimOptions()  # measured kernels: the registry answers nothing here
    ranks = [_structure(rg, default_registry(None), options) for w in workloads for rg in w.ranks]
    db = self_overheads(ranks, filtered=filtered)
    db.sources = [str(f) for w in workloads for f in w.metadata.get("files", [])]
    return db

