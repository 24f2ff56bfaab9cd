"""The *timings* phase of compilation: host gaps of every op and call, how long blocking calls
hold the CPU, launch latency and kernel-kernel gap of every kernel (see ``program.py``).

Launch latency and kernel-kernel gap: with measured kernels, their medians over the rank
(launch-bound kernels: start − runtime-call end; stream-bound kernels: start − readiness), per
class (memory copies vs. kernels); ``TRACE`` host mode keeps each kernel's own measured value
where it decided the start. Without measurements, 002 Alg. 3's T4/2 and 1 µs.

CUDA/HIP graphs (``graph_kernels``): one runtime call launches all of a graph's nodes, which
run as one unit on its stream, and a trace records only some of them. Each recorded node keeps
its measured delay beyond what its launch and stream allow (``RankProgram.k_hold``): time the
graph spent in nodes the trace does not show, replayed in every host mode as measured device
time, like a kernel's duration. Graph nodes are not launch-latency or gap samples.
"""

from __future__ import annotations

from operator import attrgetter
from statistics import median
from typing import TYPE_CHECKING

import numpy as np

from trainsim.errors import ConfigError
from trainsim.ir.kinds import KernelFamily
from trainsim.sim.host import HostModel
from trainsim.sim.options import HostMode, SimOptions
from trainsim.sim.whatif import RESIZE, WHATIF

if TYPE_CHECKING:
    from trainsim.ir.graph import Op
    from trainsim.sim.program import RankProgram

ALG3_GAP_S = 1e-6  # 002 Alg. 3 line 11: consecutive kernels of a stream are ≥ 1 µs apart
MEMORY_FAMILIES = (KernelFamily.MEMCPY, KernelFamily.MEMSET)
# Runtime calls that launch a whole graph (its nodes share the call's correlation id).
GRAPH_LAUNCH_APIS = frozenset({"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"})
_PASSES = (WHATIF, RESIZE)  # provenance prefixes of the passes over a workload (program.py)


def fill_timings(rp: RankProgram, host: HostModel, opts: SimOptions) -> None:
    ops = rp.ops
    if host.mode is HostMode.TRACE:
        _trace_timings(rp)
    else:
        _stat_timings(rp, host)
    rp.call_wake = [0.0] * len(rp.call_key)
    blocking_dur = host.blocking_call_duration()
    for ci in rp.blocking_calls:
        _blocking(rp, ci, rp.call_block[ci], host.mode, blocking_dur)  # type: ignore[arg-type]
    for ci in rp.worker_runs:  # the record is its collective: no call time of its own beyond it
        rp.call_dur[ci] = 0.0
    trace = host.mode is HostMode.TRACE
    # inferred thread edges carry their measured delay (TRACE) or the op's T1; deps carry none
    rp.op_cross = [()] * len(ops)
    for oi, pr in enumerate(rp.op_preds):
        if pr:
            rp.op_cross[oi] = tuple(
                (src, 0.0 if d is None else d if trace else rp.op_t1[oi]) for src, d in pr
            )
    _latencies(rp, host.mode, opts)


def _trace_timings(rp: RankProgram) -> None:
    """``TRACE`` host gaps (this loop runs once per op of every rank): each op at its measured
    offset after the previous op of its thread, calls at their measured offsets with their
    measured durations, the measured tail after the last call."""
    ops, call0, c_start, c_dur = rp.ops, rp.op_call0, rp.call_start_m, rp.call_dur_m
    t1s, tails, gaps, durs = rp.op_t1, rp.op_tail, rp.call_gap, rp.call_dur
    anchor: dict[int, float] = {}
    cpu_start = rp.cpu_start_s
    for oi, op in enumerate(ops):
        start, dur = op.start_s, op.duration_s
        if start is None or dur is None:
            raise ConfigError(
                f"op {op.id} ({op.name}) has no measured CPU time: host mode 'trace' replays "
                "measured gaps; use 'stats' or 'shared' for built workloads"
            )
        thread = op.thread
        t1s.append(start - anchor.get(thread, cpu_start))
        anchor[thread] = start + dur
        prev = start
        for c in range(call0[oi], call0[oi + 1]):
            cs, cd = c_start[c], c_dur[c]
            if cs is None or cd is None:
                raise ConfigError(
                    f"op {op.id} ({op.name}): a runtime call has no measured time; "
                    "use host mode 'stats'"
                )
            gaps.append(cs - prev)
            durs.append(cd)
            prev = max(prev, cs + cd)
        if op.predicted_s is not None and call0[oi] == call0[oi + 1]:  # resized CPU-only op
            tails.append(op.predicted_s)
        else:
            tails.append(start + dur - prev)


def _stat_timings(rp: RankProgram, host: HostModel) -> None:
    """``STATS``/``SHARED`` host gaps from the ``HostModel`` (this loop runs once per op of
    every rank): T1 before each op (a thread's first op: the step-entry gap), T2 before its
    first call, T5 between calls, T4 per call, T3 after the last one (its CPU time when it has
    no calls)."""
    ops, call0, preds = rp.ops, rp.op_call0, rp.op_preds
    entry = host.entry_gap_s
    stats, cached = host.op_stats, host.cached_stats
    seen: set[int] = set()
    t1s, tails, gaps, durs = rp.op_t1, rp.op_tail, rp.call_gap, rp.call_dur
    add_t1, add_tail, add_gap, add_dur = t1s.append, tails.append, gaps.append, durs.append
    for oi, op in enumerate(ops):
        t1, t2, t3, t4, t5, cpu = cached.get(op.name) or stats(op.name)
        if op.thread not in seen:
            seen.add(op.thread)
            if entry is not None and not preds[oi]:
                t1 = entry
        add_t1(t1)
        n = call0[oi + 1] - call0[oi]
        if n == 1:
            add_gap(t2)
            add_dur(t4)
            add_tail(t3)
        elif n:
            add_gap(t2)
            gaps.extend([t5] * (n - 1))
            durs.extend([t4] * n)
            add_tail(t3)
        else:
            add_tail(cpu if op.predicted_s is None else resized_cpu_s(op, cpu))


def resized_cpu_s(op: Op, host_s: float) -> float:
    """The CPU time of an op without runtime calls that a pass re-predicted (``Op.predicted_s``:
    ``sim.resize``), in ``STATS``/``SHARED`` mode: the time the host model gives the op plus the
    change the pass predicts from its measured time (measured × (ratio − 1)), not below 0.

    The pass scales the op's own measured time, while these modes time the op by its per-name
    mean: taking the prediction as it is had moved the step for ops the pass kept (×1: views,
    weight-sized ops) — a resize to the traced batch was not the plain replay (H100 LLaMA b1
    +0.35 %). On one thread the step is the same as before (per-name means summed over a
    chain are the measured total). A prediction not made from a measured time is used as is."""
    d, p = op.duration_s, op.predicted_s
    assert p is not None
    if d is None or not op.provenance.startswith(_PASSES) or not op.provenance.endswith("of measured"):
        return p
    return max(0.0, host_s + (p - d))


def end_tails(ranks: list[RankProgram], mode: HostMode) -> None:
    """A rank that launches no device kernel (``RankGraph.cpu_only``: none at all, or only gloo
    collectives, which CPU threads run) ends its step with its CPU window (``step_end_s``), some
    Python after its last op (``window_ops``): measured (``TRACE``) or the mean of such ranks
    (``STATS``)."""
    if mode is HostMode.SHARED:
        return
    tails: list[float] = []
    for rp in ranks:
        if not rp.graph.cpu_only or rp.graph.step_end_s is None:
            continue
        ends = [e for i in rp.window_ops if (e := rp.ops[i].end_s) is not None]
        if ends:
            rp.end_tail_s = max(0.0, rp.graph.step_end_s - max(ends))
            tails.append(rp.end_tail_s)
    if mode is HostMode.STATS and tails:
        mean = sum(tails) / len(tails)
        for rp in ranks:
            if rp.graph.cpu_only:
                rp.end_tail_s = mean


def _blocking(
    rp: RankProgram, ci: int, targets: tuple[int, ...], mode: HostMode, own_s: float
) -> None:
    """Own duration and wake-up of a blocking call: it ends at
    max(start + own, awaited end + wake). ``TRACE`` reproduces the measured end exactly."""
    if mode is not HostMode.TRACE:
        rp.call_dur[ci] = own_s
        return
    start, dur = rp.call_start_m[ci], rp.call_dur_m[ci]
    assert start is not None and dur is not None
    ends = [e for t in targets if (e := rp.kernels[t].end_s) is not None]
    done = max(ends) if ends else None
    if done is not None and done > start:
        rp.call_dur[ci] = 0.0
        rp.call_wake[ci] = start + dur - done  # < 0: pageable copies return before the last chunk
    else:
        rp.call_dur[ci] = dur


def _latencies(rp: RankProgram, mode: HostMode, opts: SimOptions) -> None:
    """Launch latency (from the call's start) and kernel-kernel gap of every kernel, and the
    graph-internal holds (``rp.k_hold``) of kernels launched by a CUDA/HIP graph."""
    kernels, k_call, call_dur = rp.kernels, rp.k_call, rp.call_dur
    c_start, c_dur = rp.call_start_m, rp.call_dur_m
    fixed_lat, fixed_gap = opts.launch_latency_s, opts.kernel_gap_s
    starts = list(map(attrgetter("start_s"), kernels))
    if starts.count(None) == len(starts):  # 002 Alg. 3 (or the given values)
        if fixed_lat is not None:
            rp.k_lat = [fixed_lat] * len(kernels)
        else:
            rp.k_lat = (np.asarray(call_dur, dtype=float)[k_call] / 2).tolist() if kernels else []
        rp.k_gap = [fixed_gap if fixed_gap is not None else ALG3_GAP_S] * len(kernels)
        return
    ready = _measured_readiness(rp)
    graph = graph_kernels(rp)
    post: dict[bool, list[float]] = {True: [], False: []}
    gaps: dict[bool, list[float]] = {True: [], False: []}
    for i, k in enumerate(kernels):
        ci = k_call[i]
        cs, cd = c_start[ci], c_dur[ci]
        if (
            k.start_s is None
            or cs is None
            or cd is None
            or rp.call_block[ci] is not None
            or i in graph  # a graph's nodes follow its internal schedule, not launches
        ):
            continue
        mem = k.family in MEMORY_FAMILIES
        r = ready[i]
        if r is None or cs + cd >= r:
            post[mem].append(k.start_s - (cs + cd))
        else:
            gaps[mem].append(max(0.0, k.start_s - r))
    typ_post = {m: _median(post[m], post[not m]) for m in (True, False)}
    typ_gap = {m: _median(gaps[m], gaps[not m]) for m in (True, False)}
    rp.typical_post_s, rp.typical_gap_s = typ_post, typ_gap
    if graph:
        rp.k_hold = _graph_holds(rp, graph, ready, typ_post, typ_gap)
    trace = mode is HostMode.TRACE
    hold = rp.k_hold if not trace else {}
    worker_runs = rp.worker_runs
    for i, k in enumerate(kernels):
        ci = k_call[i]
        mem = k.family in MEMORY_FAMILIES
        dur = call_dur[ci]
        p, g = typ_post[mem], typ_gap[mem]
        if ci in worker_runs:  # the record is the collective: it starts with it
            lat = 0.0
        elif fixed_lat is not None:
            lat = fixed_lat
        else:
            lat = max(0.0, dur + p) if p is not None else dur / 2
        gap = fixed_gap if fixed_gap is not None else g if g is not None else ALG3_GAP_S
        cs = c_start[ci]
        if trace and k.start_s is not None and cs is not None:
            own = k.start_s - cs
            r = ready[i]
            if r is None or cs + (c_dur[ci] or 0.0) >= r:
                lat = own
                if r is not None:
                    gap = min(gap, max(0.0, k.start_s - r))
            else:
                gap = max(0.0, k.start_s - r)
                lat = min(lat, own)
        elif hold:
            h = hold.get(i)
            if h:  # start = max(launch, ready + gap) + h
                lat += h
                gap += h
        rp.k_lat.append(lat)
        rp.k_gap.append(gap)


def graph_kernels(rp: RankProgram) -> set[int]:
    """Kernels launched by a CUDA/HIP graph: one runtime call that launched several device
    activities under one correlation id (only a graph launch does), or a kernel whose
    ``features["launch_api"]`` names a graph launch (ingestion records it when it can)."""
    kernels, k0 = rp.kernels, rp.call_k0
    out = {i for i, k in enumerate(kernels) if k.features.get("launch_api") in GRAPH_LAUNCH_APIS}
    for ci in rp.multi_calls:
        corr = {k.features.get("correlation") for k in kernels[k0[ci] : k0[ci + 1]]}
        if len(corr) == 1 and None not in corr:
            out.update(range(k0[ci], k0[ci + 1]))
    return out


def _graph_holds(
    rp: RankProgram,
    graph: set[int],
    ready: list[float | None],
    typ_post: dict[bool, float | None],
    typ_gap: dict[bool, float | None],
) -> dict[int, float]:
    """Per graph node, how much later than its launch and stream readiness allow it started
    (measured): time the graph spent in nodes the trace does not record (or waiting inside
    itself). A graph executes as one unit on its stream, so this is its device time, replayed
    as measured like a kernel's duration."""
    holds: dict[int, float] = {}
    for i in sorted(graph):
        k = rp.kernels[i]
        cs, cd = rp.call_start_m[rp.k_call[i]], rp.call_dur_m[rp.k_call[i]]
        if k.start_s is None or cs is None or cd is None:
            continue
        mem = k.family in MEMORY_FAMILIES
        p, g = typ_post[mem], typ_gap[mem]
        allowed = cs + (max(0.0, cd + p) if p is not None else cd / 2)
        r = ready[i]
        if r is not None:
            allowed = max(allowed, r + (g if g is not None else ALG3_GAP_S))
        if k.start_s > allowed:
            holds[i] = k.start_s - allowed
    return holds


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
