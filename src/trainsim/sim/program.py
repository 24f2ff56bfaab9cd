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

Compilation has two phases: the *structure* (calls, lanes, edges) and the *timings* (host
gaps, durations of blocking calls, launch latencies), so that ``STATS`` mode can take its
statistics from the structure of every rank first (``selfstats.py``).

Launch latency and kernel-kernel gap: with measured kernels, their medians over the rank
(launch-bound kernels: start − runtime-call end; stream-bound kernels: start − readiness), per
class (memory copies vs. kernels); ``TRACE`` host mode keeps each kernel's own measured value
where it decided the start. Without measurements, 002 Alg. 3's T4/2 and 1 µs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from trainsim.errors import SimulationError
from trainsim.ir.graph import Kernel, Op, RankGraph, Workload
from trainsim.ir.kinds import CollectiveKind, KernelFamily, SyncKind
from trainsim.sim import syncs
from trainsim.sim.durations import ModelRegistry, default_registry, device_spec
from trainsim.sim.edges import intra_rank_rule, thread_edges
from trainsim.sim.host import Call, HostModel, op_calls
from trainsim.sim.options import HostMode, KernelSource, SimOptions
from trainsim.sim.whatif import WHATIF

_ALG3_GAP_S = 1e-6  # 002 Alg. 3 line 11: consecutive kernels of a stream are ≥ 1 µs apart
_MEMORY = (KernelFamily.MEMCPY, KernelFamily.MEMSET)


@dataclass(slots=True)
class Instance:
    """One collective instance across ranks."""

    group: str
    seq: int
    kind: CollectiveKind
    members: list[tuple[int, int]]  # (rank program index, kernel index)
    transfer_s: float = 0.0
    provenance: str = ""


@dataclass(slots=True)
class RankProgram:
    graph: RankGraph
    cpu_start_s: float
    step_start_s: float
    ops: list[Op]
    # structure
    op_lane: list[int] = field(default_factory=list)
    op_call0: list[int] = field(default_factory=list)  # calls of op o: op_call0[o]:op_call0[o+1]
    op_preds: list[tuple[tuple[int, float | None], ...]] = field(default_factory=list)  # cross-thread
    calls: list[Call] = field(default_factory=list)
    call_op: list[int] = field(default_factory=list)
    call_block: list[tuple[int, ...] | None] = field(default_factory=list)
    kernels: list[Kernel] = field(default_factory=list)
    k_call: list[int] = field(default_factory=list)
    k_lane: list[int] = field(default_factory=list)
    k_dur: list[float] = field(default_factory=list)  # collectives: the member's own duration
    k_prov: list[str] = field(default_factory=list)
    k_waits: list[list[int]] = field(default_factory=list)  # kernels whose END bounds the start
    k_after: list[list[int]] = field(default_factory=list)  # kernels whose START bounds it
    k_inst: list[int] = field(default_factory=list)
    cpu_lanes: list[list[int]] = field(default_factory=list)
    lane_thread: list[int] = field(default_factory=list)
    stream_lanes: list[list[int]] = field(default_factory=list)
    lane_stream: list[int] = field(default_factory=list)
    lane_busy_until: list[float | None] = field(default_factory=list)
    device: Any = None  # catalog DeviceSpec once looked up (False: not in the catalog)
    # timings
    op_t1: list[float] = field(default_factory=list)
    op_cross: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    op_tail: list[float] = field(default_factory=list)
    call_gap: list[float] = field(default_factory=list)
    call_dur: list[float] = field(default_factory=list)
    call_wake: list[float] = field(default_factory=list)
    k_lat: list[float] = field(default_factory=list)  # from the call's start
    k_gap: list[float] = field(default_factory=list)
    diagnostics: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True)
class Program:
    workload: Workload
    ranks: list[RankProgram]
    instances: list[Instance]
    options: SimOptions


def compile_workload(w: Workload, options: SimOptions) -> Program:
    registry = options.kernel_models or default_registry()
    ranks = [_structure(rg, registry, options) for rg in w.ranks]
    if options.overheads is HostMode.STATS and options.overhead_db is None:
        from trainsim.sim.selfstats import self_means

        per_op, glob, entry = self_means(ranks)
        host = HostModel(options.overheads, means=(per_op, glob), entry_gap_s=entry)
    else:
        host = HostModel(options.overheads, options.overhead_db)
    for rp in ranks:
        _timings(rp, host, options)
    return Program(w, ranks, _instances(w, ranks, options, registry), options)


# ---------------------------------------------------------------------------------- structure


def _duration(
    k: Kernel, op: Op, opts: SimOptions, reg: ModelRegistry, rp: RankProgram
) -> tuple[float, str]:
    if k.predicted_s is not None and k.provenance.startswith(WHATIF):
        return k.predicted_s, k.provenance  # a what-if pass changed this kernel (whatif.py)
    if opts.kernels is KernelSource.MODEL:
        if k.predicted_s is not None:
            return k.predicted_s, k.provenance or "predicted"
        if rp.device is None:
            rp.device = device_spec(rp.graph.device) or False
        p = reg.predict(k, op, rp.device or None)
        if p is not None:
            rp.diagnostics["kernels_model"] += 1
            return p.seconds, p.provenance
        if k.duration_s is not None:
            rp.diagnostics["kernels_model_fallback_measured"] += 1
            return k.duration_s, "measured (no model)"
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
    timed = all(k.launch_start_s is not None for o in rg.ops for k in o.kernels) and all(
        s.start_s is not None for o in rg.ops for s in o.syncs
    )
    lane_of_thread: dict[int, tuple[int, list[int]]] = {}
    counter = [0]
    keys: list[float] = []
    threads: list[int] = []
    kernel_op: list[int] = []
    calls, call_op, kernels, k_call = rp.calls, rp.call_op, rp.kernels, rp.k_call
    k_dur, k_prov, op_lane, op_call0 = rp.k_dur, rp.k_prov, rp.op_lane, rp.op_call0
    cpu_lanes, lane_thread = rp.cpu_lanes, rp.lane_thread
    measured = opts.kernels is KernelSource.MEASURED
    for oi, op in enumerate(rp.ops):
        thread = op.thread
        got = lane_of_thread.get(thread)
        if got is None:
            got = lane_of_thread[thread] = (len(cpu_lanes), [])
            cpu_lanes.append(got[1])
            lane_thread.append(thread)
        op_lane.append(got[0])
        got[1].append(oi)
        op_call0.append(len(calls))
        if not op.kernels and not op.syncs:
            continue
        for c in op_calls(op, timed=timed, counter=counter):
            ci = len(calls)
            calls.append(c)
            call_op.append(oi)
            for k in c.kernels:
                kernels.append(k)
                k_call.append(ci)
                keys.append(c.key)
                threads.append(thread)
                kernel_op.append(oi)
                if k.collective is not None:  # durations set per instance by _instances
                    k_dur.append(0.0)
                    k_prov.append("")
                elif measured and k.duration_s is not None and not k.provenance.startswith(WHATIF):
                    k_dur.append(k.duration_s)
                    k_prov.append("measured")
                else:
                    d, prov = _duration(k, op, opts, reg, rp)
                    k_dur.append(d)
                    k_prov.append(prov)
    rp.call_block = [None] * len(calls)
    rp.op_call0.append(len(rp.calls))
    n = len(rp.kernels)
    rp.k_waits = [[] for _ in range(n)]
    rp.k_after = [[] for _ in range(n)]
    rp.k_inst = [-1] * n
    idx = syncs.IssueIndex.build(rp.kernels, keys, threads)
    _stream_lanes(rp, keys)
    _sync_edges(rp, idx)
    _dep_edges(rp, kernel_op)
    if opts.intra_rank_sync:
        intra_rank_rule(rp, keys)
    rp.op_preds = thread_edges(rp, infer=opts.thread_edges)
    return rp


def _stream_lanes(rp: RankProgram, keys: list[float]) -> None:
    by_stream: dict[int, list[int]] = {}
    for i, k in enumerate(rp.kernels):
        by_stream.setdefault(k.stream, []).append(i)
    busy = {int(s): float(t) for s, t in rp.graph.metadata.get("stream_busy_until_s", {}).items()}
    rp.k_lane = [0] * len(rp.kernels)
    for stream in sorted(by_stream):
        ks = by_stream[stream]
        if all(rp.kernels[i].start_s is not None for i in ks):
            ks.sort(key=lambda i: (rp.kernels[i].start_s, keys[i]))
        else:
            ks.sort(key=lambda i: keys[i])
        lane = len(rp.stream_lanes)
        for i in ks:
            rp.k_lane[i] = lane
        rp.stream_lanes.append(ks)
        rp.lane_stream.append(stream)
        rp.lane_busy_until.append(busy.get(stream))


def _sync_edges(rp: RankProgram, idx: syncs.IssueIndex) -> None:
    diag = rp.diagnostics
    for ci, c in enumerate(rp.calls):
        s = c.sync
        if s is not None:
            if s.kind.blocks_cpu:
                end = (
                    None if c.start_s is None or c.duration_s is None else c.start_s + c.duration_s
                )
                rp.call_block[ci] = syncs.blocking_targets(
                    s, key=c.key, idx=idx, end_s=end, diag=diag
                )
            elif s.kind is SyncKind.STREAM_WAIT_EVENT:
                thread = rp.ops[rp.call_op[ci]].thread
                edge = syncs.event_wait(s, key=c.key, thread=thread, idx=idx, diag=diag)
                if edge is not None:
                    rp.k_waits[edge[0]].append(edge[1])
        elif (len(c.kernels) > 1 or c.kernels[0].family is KernelFamily.MEMCPY) and c.blocks_cpu_copy():
            rp.call_block[ci] = tuple(idx.by_id[k.id] for k in c.kernels)
            diag["blocking_copies"] += 1


def _dep_edges(rp: RankProgram, kernel_op: list[int]) -> None:
    """``Op.deps``: an op's kernels start after the last kernel (per stream) of each dep op."""
    if not any(op.deps for op in rp.ops):
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
                    rp.k_waits[dependent].append(awaited)
                    rp.diagnostics["dep_edges"] += 1


# ------------------------------------------------------------------------------------ timings


def _timings(rp: RankProgram, host: HostModel, opts: SimOptions) -> None:
    ops, call0 = rp.ops, rp.op_call0
    seen: set[int] = set()
    if host.mode is HostMode.TRACE:
        anchor: dict[int, float] = {}
        for oi, op in enumerate(ops):
            c0, c1 = call0[oi], call0[oi + 1]
            timing = host.timing(
                op, rp.calls[c0:c1], anchor.get(op.thread, rp.cpu_start_s), first=False
            )
            anchor[op.thread] = op.end_s if op.end_s is not None else rp.cpu_start_s
            rp.op_t1.append(timing.t1_s)
            rp.op_tail.append(timing.tail_s)
            rp.call_gap.extend(timing.gaps_s)
            rp.call_dur.extend(timing.durations_s)
    else:  # inlined HostModel.timing: this loop runs once per op of every rank
        entry = host.entry_gap_s
        stats, cached = host.op_stats, host.cached_stats
        t1s, tails, gaps, durs, preds = rp.op_t1, rp.op_tail, rp.call_gap, rp.call_dur, rp.op_preds
        for oi, op in enumerate(ops):
            t1, t2, t3, t4, t5, cpu = cached.get(op.name) or stats(op.name)
            if op.thread not in seen:
                seen.add(op.thread)
                if entry is not None and not preds[oi]:
                    t1 = entry
            t1s.append(t1)
            n = call0[oi + 1] - call0[oi]
            if n:
                gaps.append(t2)
                if n > 1:
                    gaps.extend([t5] * (n - 1))
                durs.extend([t4] * n)
                tails.append(t3)
            else:
                tails.append(cpu)
    rp.call_wake = [0.0] * len(rp.calls)
    blocking_dur = host.blocking_call_duration()
    for ci, targets in enumerate(rp.call_block):
        if targets is not None:
            _blocking(rp, ci, targets, host.mode, blocking_dur)
    trace = host.mode is HostMode.TRACE
    # inferred thread edges carry their measured delay (TRACE) or the op's T1; deps carry none
    rp.op_cross = [()] * len(ops)
    for oi, pr in enumerate(rp.op_preds):
        if pr:
            rp.op_cross[oi] = tuple((src, 0.0 if d is None else d if trace else rp.op_t1[oi]) for src, d in pr)
    _latencies(rp, host.mode, opts)


def _blocking(
    rp: RankProgram, ci: int, targets: tuple[int, ...], mode: HostMode, own_s: float
) -> None:
    """Own duration and wake-up of a blocking call: it ends at
    max(start + own, awaited end + wake). ``TRACE`` reproduces the measured end exactly."""
    c = rp.calls[ci]
    if mode is not HostMode.TRACE:
        rp.call_dur[ci] = own_s
        return
    assert c.start_s is not None and c.duration_s is not None
    ends = [e for t in targets if (e := rp.kernels[t].end_s) is not None]
    done = max(ends) if ends else None
    end = c.start_s + c.duration_s
    if done is not None and done > c.start_s:
        rp.call_dur[ci] = 0.0
        rp.call_wake[ci] = end - done  # may be < 0: pageable copies return before the last chunk
    else:
        rp.call_dur[ci] = c.duration_s


def _latencies(rp: RankProgram, mode: HostMode, opts: SimOptions) -> None:
    """Launch latency (from the call's start) and kernel-kernel gap of every kernel."""
    ready = _measured_readiness(rp)
    post: dict[bool, list[float]] = {True: [], False: []}
    gaps: dict[bool, list[float]] = {True: [], False: []}
    calls = rp.calls
    for i, k in enumerate(rp.kernels):
        ci = rp.k_call[i]
        c = calls[ci]
        if (
            k.start_s is None
            or c.start_s is None
            or c.duration_s is None
            or rp.call_block[ci] is not None
        ):
            continue
        mem = k.family in _MEMORY
        r = ready[i]
        if r is None or c.start_s + c.duration_s >= r:
            post[mem].append(k.start_s - (c.start_s + c.duration_s))
        else:
            gaps[mem].append(max(0.0, k.start_s - r))
    typ_post = {m: _median(post[m], post[not m]) for m in (True, False)}
    typ_gap = {m: _median(gaps[m], gaps[not m]) for m in (True, False)}
    trace = mode is HostMode.TRACE
    for i, k in enumerate(rp.kernels):
        ci = rp.k_call[i]
        mem = k.family in _MEMORY
        dur = rp.call_dur[ci]
        p, g = typ_post[mem], typ_gap[mem]
        if opts.launch_latency_s is not None:
            lat = opts.launch_latency_s
        else:
            lat = max(0.0, dur + p) if p is not None else dur / 2
        gap = (
            opts.kernel_gap_s
            if opts.kernel_gap_s is not None
            else g
            if g is not None
            else _ALG3_GAP_S
        )
        c = calls[ci]
        if trace and k.start_s is not None and c.start_s is not None:
            own = k.start_s - c.start_s
            r = ready[i]
            if r is None or c.start_s + (c.duration_s or 0.0) >= r:
                lat = own
                if r is not None:
                    gap = min(gap, max(0.0, k.start_s - r))
            else:
                gap = max(0.0, k.start_s - r)
                lat = min(lat, own)
        rp.k_lat.append(lat)
        rp.k_gap.append(gap)


def _median(values: list[float], fallback: list[float]) -> float | None:
    if values:
        return float(median(values))
    return float(median(fallback)) if fallback else None


def _measured_readiness(rp: RankProgram) -> list[float | None]:
    """Per kernel, the measured time its stream, event and data constraints were all met."""
    ready: list[float | None] = [None] * len(rp.kernels)
    for lane, ks in enumerate(rp.stream_lanes):
        prev_end = rp.lane_busy_until[lane]
        for i in ks:
            r = prev_end
            for w in rp.k_waits[i]:
                e = rp.kernels[w].end_s
                if e is not None and (r is None or e > r):
                    r = e
            for a in rp.k_after[i]:
                s = rp.kernels[a].start_s
                if s is not None and (r is None or s > r):
                    r = s
            ready[i] = r
            prev_end = rp.kernels[i].end_s
    return ready


# -------------------------------------------------------------------------------- collectives


def _instances(
    w: Workload, ranks: list[RankProgram], opts: SimOptions, reg: ModelRegistry
) -> list[Instance]:
    by_key: dict[tuple[str, int], Instance] = {}
    for ri, rp in enumerate(ranks):
        for ki, k in enumerate(rp.kernels):
            c = k.collective
            if c is None:
                continue
            inst = by_key.get((c.group, c.seq))
            if inst is None:
                inst = by_key[(c.group, c.seq)] = Instance(c.group, c.seq, c.kind, [])
            if inst.members and inst.members[-1][0] == ri:
                raise SimulationError(
                    f"rank {rp.graph.rank} issues collective {c.kind.value} of group {c.group!r} "
                    f"seq {c.seq} twice (kernels {rp.kernels[inst.members[-1][1]].id} and {k.id}); "
                    "sequence numbers must be unique per group and rank"
                )
            inst.members.append((ri, ki))
    present = {rp.graph.rank for rp in ranks}
    expected_of: dict[tuple[str, int], frozenset[int]] = {}
    instances = list(by_key.values())
    for n, inst in enumerate(instances):
        ri0, ki0 = inst.members[0]
        c0 = ranks[ri0].kernels[ki0].collective
        assert c0 is not None
        ck = (inst.group, id(c0.group_ranks))
        expected = expected_of.get(ck)
        if expected is None:
            group = c0.group_ranks or tuple(w.process_groups.get(inst.group, ())) or tuple(present)
            expected = expected_of[ck] = frozenset(r for r in group if r in present)
        have = {ranks[ri].graph.rank for ri, _ in inst.members}
        missing = sorted(expected - have)
        if missing:
            raise SimulationError(
                f"collective {inst.kind.value} of group {inst.group!r} seq {inst.seq}: issued by "
                f"ranks {sorted(have)} but never by member rank(s) {missing}; the traces do not "
                "belong to one step of one job, or a rank's trace is truncated"
            )
        durs = []
        for ri, ki in inst.members:
            rp = ranks[ri]
            rp.k_inst[ki] = n
            d = _duration(rp.kernels[ki], rp.ops[rp.call_op[rp.k_call[ki]]], opts, reg, rp)
            rp.k_dur[ki], rp.k_prov[ki] = d
            durs.append(d)
        # measured: the last arrival's duration is the transfer; models: the largest member
        inst.transfer_s, inst.provenance = (
            min(durs) if opts.kernels is KernelSource.MEASURED else max(durs)
        )
    return instances
