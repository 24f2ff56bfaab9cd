"""Build one rank's IR graph from a decoded Kineto trace and one iteration window.

Pipeline (002 §4.3.1, §4.3.3; 000 §III-B):
1. per CPU thread, nest CPU ops, annotations and runtime calls by time containment;
2. every top-level CPU op in the window becomes an ``Op``; runtime calls outside any op that
   launch work or synchronise become an ``Op`` of their own;
3. runtime call → device activity via the correlation id gives each op its ``Kernel``s;
4. ``cudaStreamWaitEvent``/``Synchronize`` calls become ``SyncPoint``s (resolved with
   ``cuda_sync`` events where the trace has them, otherwise inferred from launch order);
5. collective kernels get a ``Collective`` (kind, group, bytes, per-group sequence number).
"""

from __future__ import annotations

import bisect
import zlib
from collections import defaultdict
from dataclasses import dataclass, field

from trainsim.ingest import collectives as coll
from trainsim.ingest.families import classify_kernel
from trainsim.ingest.iterations import StepWindow
from trainsim.ingest.kineto import Event, KinetoTrace
from trainsim.ir.graph import Collective, Kernel, Op, RankGraph, SyncPoint, TensorMeta
from trainsim.ir.kinds import CollectiveKind, KernelFamily, OpCategory, SyncKind

_SYNC_CALLS: dict[str, SyncKind] = {
    "cudaStreamWaitEvent": SyncKind.STREAM_WAIT_EVENT,
    "hipStreamWaitEvent": SyncKind.STREAM_WAIT_EVENT,
    "cudaEventSynchronize": SyncKind.EVENT_SYNC,
    "hipEventSynchronize": SyncKind.EVENT_SYNC,
    "cudaStreamSynchronize": SyncKind.STREAM_SYNC,
    "hipStreamSynchronize": SyncKind.STREAM_SYNC,
    "cudaDeviceSynchronize": SyncKind.DEVICE_SYNC,
    "hipDeviceSynchronize": SyncKind.DEVICE_SYNC,
}
_RECORD_CALLS = frozenset({"cudaEventRecord", "hipEventRecord", "cudaEventRecordWithFlags"})
_COMM_CONTEXT_PREFIXES = ("nccl:", "gloo:", "c10d::", "record_param_comms")
# Nested CPU ops that write memory (``Op.moved_data``): what shows, in a CPU trace, that a
# top-level op named like a view (a reshape of a non-contiguous tensor, SliceBackward0's
# zero-fill, a dtype cast) moved data. With timestamps rounded to whole µs, a zero-length copy_
# at its parent's end can mark the op that starts in that µs instead.
_MOVES_DATA = frozenset({"aten::copy_", "aten::fill_", "aten::zero_"})


@dataclass(slots=True)
class _OpDraft:
    event: Event | None  # the top-level CPU op (None for an orphan runtime call)
    name: str
    thread: int
    start: float
    dur: float
    annotation: str = ""
    calls: list[tuple[Event, Event | None]] = field(default_factory=list)  # (runtime, comm ctx)
    moved_data: bool = False  # a nested CPU op copied or filled memory (_MOVES_DATA)
    async_work: list[Event] = field(default_factory=list)  # gloo work run on a worker thread


@dataclass(slots=True)
class BuildStats:
    runtime_calls: int = 0
    launches_without_activity: int = 0
    activities_linked: int = 0
    activities_unlinked: int = 0
    syncs_resolved: int = 0
    syncs_inferred: int = 0


def _tid_int(tid: int | str) -> int:
    if isinstance(tid, int):
        return tid
    digits = "".join(ch for ch in str(tid) if ch.isdigit())
    # A stable id for textual thread names (hash() is salted per process).
    return int(digits) if digits else zlib.crc32(str(tid).encode()) % (1 << 31)


def _is_comm_context(e: Event) -> bool:
    return e.name.startswith(_COMM_CONTEXT_PREFIXES)


def _nest(window: StepWindow, cpu: list[Event], runtime: list[Event]) -> list[_OpDraft]:
    """Assign runtime calls to top-level CPU ops, thread by thread (events sorted by ts, -dur)."""
    lo, hi = window.start, window.end
    # (ts, -dur, is runtime call, arrival, event): sorted whole, the arrival number keeps equal
    # keys in the order the events came (a stable sort on the first three)
    by_thread: dict[tuple[int | str, int | str], list[tuple[float, float, int, int, Event]]] = defaultdict(list)
    n = 0
    for e in cpu:
        ts = float(e.ts)  # type: ignore[arg-type]
        if lo <= ts < hi and not e.name.startswith("ProfilerStep#"):
            by_thread[(e.pid, e.tid)].append((ts, -e.dur, 0, n, e))
            n += 1
    for e in runtime:
        ts = float(e.ts)  # type: ignore[arg-type]
        if lo <= ts < hi:
            by_thread[(e.pid, e.tid)].append((ts, -e.dur, 1, n, e))
            n += 1
    drafts: list[_OpDraft] = []
    for (_pid, tid), items in by_thread.items():
        items.sort()
        # the open CPU events, innermost last, with their start and end times
        stack: list[Event] = []
        starts: list[float] = []
        ends: list[float] = []
        first_op = -1  # index in stack of the outermost open op that is not an annotation
        thread = _tid_int(tid)
        current: dict[int, _OpDraft] = {}
        for ts, _, is_rt, _, e in items:
            while stack and ends[-1] <= ts and not (stack[-1].dur == 0 and starts[-1] == ts):
                stack.pop()
                starts.pop()
                ends.pop()
                if first_op == len(stack):
                    first_op = -1
            top_op = stack[first_op] if first_op >= 0 else None
            if not is_rt:
                # A collective annotation outside any op (gloo/NCCL work threads) is an op too.
                if top_op is None and (e.cat != "user_annotation" or _is_comm_context(e)):
                    d = _OpDraft(e, e.name, thread, ts, e.dur, annotation=stack[-1].name if stack else "")
                    drafts.append(d)
                    current[id(e)] = d
                elif top_op is not None and e.name in _MOVES_DATA:
                    current[id(top_op)].moved_data = True
                if first_op < 0 and e.cat != "user_annotation":
                    first_op = len(stack)
                stack.append(e)
                starts.append(ts)
                ends.append(ts + e.dur)
                continue
            ctx = next((s for s in reversed(stack) if _is_comm_context(s)), None)
            if top_op is not None:
                current[id(top_op)].calls.append((e, ctx))
            else:
                d = _OpDraft(None, e.name, thread, ts, e.dur, annotation=stack[-1].name if stack else "")
                d.calls.append((e, ctx))
                drafts.append(d)
    drafts.sort(key=lambda d: (d.start, d.thread))
    return drafts


def _dims(e: Event) -> list[object]:
    dims = e.args.input_dims if e.args is not None else None
    if not isinstance(dims, list) or not dims:
        return []
    first = dims[0]
    # c10d ops take a TensorList: [[[672]], [], ...]; gloo annotations a tensor: [[672]].
    if isinstance(first, list) and first and isinstance(first[0], list):
        return list(first[0])
    return list(first) if isinstance(first, list) else []


def _attach_gloo_work(drafts: list[_OpDraft], trace: KinetoTrace, window: StepWindow) -> list[_OpDraft]:
    """Pair each ``c10d::<collective>`` op with the ``gloo:<collective>`` annotation that ran it.

    Gloo runs collectives asynchronously on worker threads; torch 2.13 writes no sequence
    number, so the pairing is: same kind, same tensor shape, the earliest unused annotation
    starting after the op. Unpaired annotations inside the window become ops of their own.
    """
    work = [e for e in trace.cpu if e.cat == "user_annotation" and e.name.startswith("gloo:")]
    if not work:
        return drafts
    used: set[int] = set()
    kept = [d for d in drafts if not (d.event is not None and d.event.name.startswith("gloo:"))]
    for d in kept:
        if d.event is None or not d.name.startswith("c10d::"):
            continue
        kind = coll.kind_from_name(d.name)
        shape = _dims(d.event)
        for i, w in enumerate(work):
            if i in used or float(w.ts) < d.start:  # type: ignore[arg-type]
                continue
            if coll.kind_from_name(w.name) == kind and _dims(w) == shape:
                used.add(i)
                d.async_work.append(w)
                break
    for i, w in enumerate(work):
        ts = float(w.ts)  # type: ignore[arg-type]
        if i not in used and window.start <= ts < window.end:
            d = _OpDraft(w, w.name, _tid_int(w.tid), ts, w.dur, annotation="")
            d.async_work.append(w)
            kept.append(d)
    kept.sort(key=lambda d: (d.start, d.thread))
    return kept


def _inputs(e: Event | None) -> tuple[TensorMeta, ...]:
    if e is None or e.args is None or not isinstance(e.args.input_dims, list):
        return ()
    types = e.args.input_type if isinstance(e.args.input_type, list) else []
    out = []
    for i, dims in enumerate(e.args.input_dims):
        if isinstance(dims, list) and dims and all(isinstance(d, int) for d in dims):
            out.append(TensorMeta(tuple(dims), str(types[i]) if i < len(types) else ""))
    return tuple(out)


def _category(name: str, kernels: list[Kernel], syncs: list[SyncPoint]) -> OpCategory:
    if any(k.family.is_communication for k in kernels) or name.startswith(_COMM_CONTEXT_PREFIXES):
        return OpCategory.COMMUNICATION
    if kernels:
        if all(k.family in (KernelFamily.MEMCPY, KernelFamily.MEMSET) for k in kernels):
            return OpCategory.MEMORY
        return OpCategory.COMPUTE
    if any(s.kind.blocks_cpu or s.kind is SyncKind.STREAM_WAIT_EVENT for s in syncs):
        return OpCategory.SYNC
    return OpCategory.CPU_ONLY


class RankBuilder:
    """Turns (trace, window) into a RankGraph; times become seconds since ``origin``."""

    def __init__(self, trace: KinetoTrace, *, origin: float, world: tuple[int, ...] | None) -> None:
        self.trace = trace
        self.origin = origin
        self.scale = trace.unit_to_s
        self.world = world
        self.stats = BuildStats()
        self.gpu_by_corr: dict[int, list[Event]] = defaultdict(list)
        for g in trace.gpu:
            if g.args is not None and g.args.correlation is not None:
                self.gpu_by_corr[g.args.correlation].append(g)
        self.sync_by_corr = {
            s.args.correlation: s for s in trace.sync if s.args and s.args.correlation is not None
        }
        self.record_ts_by_corr = {
            r.args.correlation: float(r.ts)  # type: ignore[arg-type]
            for r in trace.runtime
            if r.name in _RECORD_CALLS and r.args and r.args.correlation is not None
        }

    def s(self, raw: float) -> float:
        return (raw - self.origin) * self.scale

    def stream_ends(self, window: StepWindow) -> dict[int, float]:
        """Per stream, the raw end time of the last device activity launched in ``window``."""
        ends: dict[int, float] = {}
        for rt in self.trace.runtime:
            ts = float(rt.ts)  # type: ignore[arg-type]
            if not (window.start <= ts < window.end) or rt.args is None:
                continue
            for g in self.gpu_by_corr.get(rt.args.correlation or -1, ()):
                st = g.args.stream if g.args and g.args.stream is not None else -1
                end = float(g.ts) + g.dur  # type: ignore[arg-type]
                if end > ends.get(st, float("-inf")):
                    ends[st] = end
        return ends

    def build(
        self, window: StepWindow, *, rank: int, previous: StepWindow | None = None
    ) -> RankGraph:
        """Build the rank graph of ``window``.

        The rank's step starts when both its CPU has entered the step and its device has
        drained the previous step (when the trace holds it): in a GPU-bound steady state the
        CPU runs ahead, and "CPU step start → last kernel end" would count the backlog twice.
        The CPU start and the per-stream backlog are kept in metadata for the simulator.
        """
        backlog = self.stream_ends(previous) if previous is not None else {}
        drafts = _attach_gloo_work(_nest(window, self.trace.cpu, self.trace.runtime), self.trace, window)
        ops: list[Op] = []
        # Per stream: sorted launch timestamps (raw) and kernel ids, for sync resolution.
        launches: dict[int, list[tuple[float, int]]] = defaultdict(list)
        next_kernel_id = 0
        pending: list[tuple[int, _OpDraft, list[Kernel], list[tuple[Event, int]]]] = []
        for op_id, d in enumerate(drafts):
            kernels: list[Kernel] = []
            sync_calls: list[tuple[Event, int]] = []
            for rt, ctx in d.calls:
                self.stats.runtime_calls += 1
                corr = rt.args.correlation if rt.args else None
                acts = self.gpu_by_corr.get(corr, []) if corr is not None else []
                for g in acts:
                    k = self._kernel(next_kernel_id, g, rt, ctx, d.name)
                    next_kernel_id += 1
                    kernels.append(k)
                    launches[k.stream].append((float(rt.ts), k.id))  # type: ignore[arg-type]
                if acts:
                    self.stats.activities_linked += len(acts)
                if rt.name in _SYNC_CALLS:
                    sync_calls.append((rt, len(kernels)))
            for work in d.async_work:
                k = self._gloo_kernel(next_kernel_id, work, d, window.end)
                next_kernel_id += 1
                kernels.append(k)
                launches[k.stream].append((d.start, k.id))
            if kernels or sync_calls or d.event is not None:
                pending.append((op_id, d, kernels, sync_calls))
        for lst in launches.values():
            lst.sort()
        kernels_by_id = {k.id: k for _, _, ks, _ in pending for k in ks}
        for op_id, d, kernels, sync_calls in pending:
            syncs = [
                self._sync(rt, d=d, kernels=kernels, n_before=n, launches=launches, kernels_by_id=kernels_by_id)
                for rt, n in sync_calls
            ]
            ops.append(
                Op(
                    id=op_id, name=d.name, thread=d.thread,
                    category=_category(d.name, kernels, syncs),
                    start_s=self.s(d.start), duration_s=d.dur * self.scale,
                    kernels=tuple(kernels), syncs=tuple(syncs), inputs=_inputs(d.event),
                    rf_id=d.event.args.rf_id if d.event and d.event.args else None,
                    seq_nr=d.event.args.seq_nr if d.event and d.event.args else None,
                    moved_data=d.moved_data,
                    annotation=d.annotation,
                )  # fmt: skip
            )
        ops = _number_collectives(ops)
        all_kernels = [k for o in ops for k in o.kernels]
        step_end = self._step_end(all_kernels, window)
        cpu_start = self.s(window.start)
        busy_until = {st: self.s(t) for st, t in backlog.items() if self.s(t) > cpu_start}
        step_start = min(max([cpu_start, *busy_until.values()]), step_end)
        return RankGraph(
            rank=rank, ops=tuple(ops), streams=tuple(sorted({k.stream for k in all_kernels})),
            device=self.trace.device_name, step_start_s=step_start, step_end_s=step_end,
            metadata={
                "cpu_step_start_s": cpu_start,
                "stream_busy_until_s": {str(k): v for k, v in sorted(busy_until.items())},
                "source": self.trace.source, "step": window.number,
                "step_from_marker": window.from_marker, "step_anchor": window.anchor,
                "sync_resolution": "cuda_sync events" if self.trace.sync else "launch order",
                "runtime_calls": self.stats.runtime_calls,
                # CPU window time after the rank's last op ends: large only in a cut trace
                # (every event past some point dropped; the step marker kept), see Analysis
                "window_tail_without_ops_s": max(0.0, window.end - max((d.start + d.dur for d in drafts),
                                                                       default=window.start)) * self.scale,
            },
        )  # fmt: skip

    def _step_end(self, kernels: list[Kernel], window: StepWindow) -> float:
        """The end of the rank's last kernel of the step; on a rank without device kernels (a
        CPU rank: gloo collectives run on CPU threads) the end of its CPU window, which holds
        the CPU work after the last collective (gradient copies, optimizer step). A gloo
        worker's record can end after the window, when the main thread has already gone on:
        that tail is not the step's."""
        if any(k.end_s is not None and not k.on_host for k in kernels):
            return max(e for k in kernels if (e := k.end_s) is not None)
        return self.s(window.end)

    def _kernel(self, kid: int, g: Event, rt: Event, ctx: Event | None, op_name: str) -> Kernel:
        fam = classify_kernel(g.name, g.cat, op_name)
        a = g.args
        features: dict[str, int | float | str] = {"correlation": a.correlation or 0} if a else {}
        if rt.name != "cudaLaunchKernel":
            # Graph launches (cudaGraphLaunch/hipGraphLaunch) replay many recorded kernels from
            # one call; the simulator schedules those from the graph, not from the call.
            features["launch_api"] = rt.name
        if a is not None:
            if a.bytes is not None:
                features["bytes"] = a.bytes
            if isinstance(a.grid, list) and len(a.grid) == 3:
                features["grid"] = a.grid[0] * a.grid[1] * a.grid[2]
            if isinstance(a.block, list) and len(a.block) == 3:
                features["block"] = a.block[0] * a.block[1] * a.block[2]
        collective = None
        if fam.is_communication or (ctx is not None and ctx.name.startswith("nccl:")):
            collective = self._collective(g, ctx, fam)
            if collective is not None:
                # The collective's kind (from its annotation/metadata) is more specific than
                # the kernel name: all_to_all runs as ncclKernel_SendRecv, for instance.
                fam = collective.kind.family
        return Kernel(
            id=kid, name=g.name, family=fam,
            stream=a.stream if a is not None and a.stream is not None else -1,
            start_s=self.s(float(g.ts)), duration_s=g.dur * self.scale,  # type: ignore[arg-type]
            launch_start_s=self.s(float(rt.ts)), launch_duration_s=rt.dur * self.scale,  # type: ignore[arg-type]
            features=features, collective=collective, provenance="measured",
        )  # fmt: skip

    def _gloo_kernel(self, kid: int, work: Event, d: _OpDraft, window_end: float) -> Kernel:
        """A gloo collective: the c10d op on the main thread enqueues it, a gloo worker thread
        runs it (the ``gloo:<collective>`` annotation). The worker thread acts as its stream.

        A worker's record that ends after the step window is cut at the window's end: the
        main thread had the collective's result before it left the step (it waits for the
        buckets before the optimizer step), and on a loaded host a worker closes its record
        milliseconds after it signalled completion (seen here: 3-9 ms, about 1 capture in 6).
        Uncut, that tail would reach a replayed step through the collective's end."""
        ts, dur = float(work.ts), float(work.dur)  # type: ignore[arg-type]
        if ts < window_end < ts + dur:
            dur = window_end - ts
        kind = coll.kind_from_name(work.name) or CollectiveKind.ALL_REDUCE
        nbytes, dtype = coll.first_tensor_bytes(work.args)
        collective = Collective(
            kind=kind, group="default", group_ranks=self.world or (), bytes=nbytes or 0, seq=0,
            dtype=dtype,
        )  # fmt: skip
        return Kernel(
            id=kid, name=work.name, family=kind.family, stream=_tid_int(work.tid),
            start_s=self.s(ts), duration_s=dur * self.scale,
            launch_start_s=self.s(d.start), launch_duration_s=d.dur * self.scale,
            features={"backend": "gloo"}, collective=collective, provenance="measured",
        )  # fmt: skip

    def _collective(self, g: Event, ctx: Event | None, fam: KernelFamily) -> Collective | None:
        ka, ca = g.args, (ctx.args if ctx else None)
        kind = None
        for a in (ka, ca):
            if a is not None and a.coll_name:
                kind = coll.kind_from_name(a.coll_name)
                if kind:
                    break
        if kind is None and ctx is not None:
            kind = coll.kind_from_name(ctx.name)
        if kind is None:
            kind = coll.kind_from_family(fam)
        if kind is None:
            return None
        nbytes, out_bytes, dtype, splits = coll.message(ka, ca)
        if kind is CollectiveKind.ALL_TO_ALL and splits:
            kind = CollectiveKind.ALL_TO_ALLV
        group, ranks = "default", self.world or ()
        for a in (ka, ca):
            if a is not None and a.pg_name is not None:
                group = str(a.pg_name)
                ranks = coll.parse_ranks(a.pg_ranks) or ranks
                break
        elem = coll.dtype_bytes(dtype) or 1
        return Collective(
            kind=kind, group=group, group_ranks=tuple(ranks), bytes=nbytes or 0, seq=0,
            dtype=dtype, out_bytes=out_bytes,
            peer_bytes=tuple(s * elem for s in splits) if splits else None,
        )  # fmt: skip

    def _sync(
        self,
        rt: Event,
        *,
        d: _OpDraft,
        kernels: list[Kernel],
        n_before: int,
        launches: dict[int, list[tuple[float, int]]],
        kernels_by_id: dict[int, Kernel],
    ) -> SyncPoint:
        kind = _SYNC_CALLS[rt.name]
        ts = float(rt.ts)  # type: ignore[arg-type]
        info = self.sync_by_corr.get(rt.args.correlation) if rt.args and rt.args.correlation is not None else None
        stream = wait_stream = wait_kernel = None
        if info is not None and info.args is not None:
            self.stats.syncs_resolved += 1
            a = info.args
            stream = a.stream if a.stream is not None and a.stream >= 0 else None
            wait_stream = a.wait_on_stream if a.wait_on_stream not in (None, -1) else None
            rec_ts = self.record_ts_by_corr.get(a.wait_on_record_corr or -1)
            if wait_stream is not None:
                wait_kernel = _last_before(launches.get(wait_stream, []), rec_ts or ts)
        else:
            self.stats.syncs_inferred += 1
            if kind is SyncKind.STREAM_WAIT_EVENT:
                # Launch-order inference: the waiting stream is the next one this op launches
                # on; it waits for the latest kernel issued on any other stream before the call.
                nxt = kernels[n_before] if n_before < len(kernels) else None
                stream = nxt.stream if nxt is not None else None
                best: tuple[float, int] | None = None
                for st, lst in launches.items():
                    if st == stream:
                        continue
                    kid = _last_before(lst, ts)
                    if kid is not None:
                        t = kernels_by_id[kid].launch_start_s or 0.0
                        if best is None or t > best[0]:
                            best = (t, kid)
                            wait_stream = st
                wait_kernel = best[1] if best else None
            elif kind in (SyncKind.STREAM_SYNC, SyncKind.EVENT_SYNC):
                prev = kernels[n_before - 1] if n_before > 0 else None
                if prev is None:
                    cands = [(t, st) for st, lst in launches.items() for t, _ in lst if t < ts]
                    stream = max(cands)[1] if cands else None
                else:
                    stream = prev.stream
                wait_stream = stream
                wait_kernel = _last_before(launches.get(stream, []), ts) if stream is not None else None
        return SyncPoint(
            kind=kind, start_s=self.s(ts), duration_s=rt.dur * self.scale, stream=stream,
            wait_on_stream=wait_stream, wait_on_kernel=wait_kernel,
        )  # fmt: skip


def _last_before(lst: list[tuple[float, int]], ts: float) -> int | None:
    i = bisect.bisect_right(lst, (ts, float("inf"))) - 1
    return lst[i][1] if i >= 0 else None


def _number_collectives(ops: list[Op]) -> list[Op]:
    """Give each collective its sequence number within its process group (launch order)."""
    from dataclasses import replace

    entries = [
        (k.launch_start_s or 0.0, oi, ki)
        for oi, o in enumerate(ops)
        for ki, k in enumerate(o.kernels)
        if k.collective is not None
    ]
    if not entries:
        return ops
    entries.sort()
    seq: dict[str, int] = defaultdict(int)
    new_kernels: dict[int, list[Kernel]] = {}
    for _t, oi, ki in entries:
        ks = new_kernels.setdefault(oi, list(ops[oi].kernels))
        c = ks[ki].collective
        assert c is not None
        ks[ki] = replace(ks[ki], collective=replace(c, seq=seq[c.group]))
        seq[c.group] += 1
    return [replace(o, kernels=tuple(new_kernels[i])) if i in new_kernels else o for i, o in enumerate(ops)]
