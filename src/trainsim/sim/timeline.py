"""Chrome-trace JSON of a simulated step (opens in Perfetto or chrome://tracing).

One process per rank graph; per rank one track per CPU thread (ops, with their runtime calls
nested inside), one per stream (kernels; a collective shows its wait for peers and its
transfer as two slices), and a "critical path" track with the path's segments on that rank.
Times are microseconds from the workload's time origin, as in the source traces.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainsim.ir.serialize import TIMELINE_PRODUCER, is_stream, write_json_atomic
from trainsim.sim.result import SimResult

_US = 1e6
_STREAM_TID = 1_000_000  # stream tracks: this + stream id (CPU tracks use small lane numbers)
_PATH_TID = 2_000_000


def _x(
    name: str, cat: str, where: tuple[int, int], start_s: float, end_s: float, **args: Any
) -> dict[str, Any]:
    pid, tid = where
    return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": start_s * _US,
            "dur": max(0.0, end_s - start_s) * _US, "args": args}  # fmt: skip


def _meta(
    kind: str, pid: int, tid: int | None, name: str, sort: int | None = None
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"ph": "M", "name": kind, "pid": pid, "args": {"name": name}}]
    if tid is not None:
        out[0]["tid"] = tid
    if sort is not None:
        key = "process_sort_index" if tid is None else "thread_sort_index"
        out.append({"ph": "M", "name": key, "pid": pid, **({"tid": tid} if tid is not None else {}),
                    "args": {"sort_index": sort}})  # fmt: skip
    return out


def timeline_events(res: SimResult) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    program, ev = res.program, res.evaluation
    for ri, rp in enumerate(program.ranks):
        g, t = rp.graph, ev.times[ri]
        pid = g.rank
        label = f"rank {g.rank}" + (f" (represents {g.represents})" if g.represents > 1 else "")
        events += _meta("process_name", pid, None, label, sort=g.rank)
        workers = {k.stream for k in rp.kernels if k.on_host}  # gloo worker threads
        for lane, thread in enumerate(rp.lane_thread):
            name = f"gloo worker {thread} (CPU records)" if thread in workers else f"CPU thread {thread}"
            events += _meta("thread_name", pid, lane, name, sort=lane)
        for lane, stream in enumerate(rp.lane_stream):
            name = f"gloo worker {stream} (collectives)" if stream in workers else f"stream {stream}"
            events += _meta("thread_name", pid, _STREAM_TID + stream, name, sort=100 + lane)
        events += _meta("thread_name", pid, _PATH_TID, "critical path", sort=1000)
        for oi, op in enumerate(rp.ops):
            tid = rp.op_lane[oi]
            events.append(
                _x(op.name, "cpu_op", (pid, tid), t.op_start[oi], t.op_end[oi], op_id=op.id)
            )
            for ci in range(rp.op_call0[oi], rp.op_call0[oi + 1]):
                sync = rp.call_sync[ci]
                name = sync.kind.value if sync is not None else "launch"
                events.append(_x(name, "runtime", (pid, tid), t.call_start[ci], t.call_end[ci],
                                 blocking=rp.call_block[ci] is not None))  # fmt: skip
        for ki, k in enumerate(rp.kernels):
            tid = _STREAM_TID + k.stream
            args: dict[str, Any] = {
                "kernel_id": k.id,
                # a gloo collective's IR family is named after NCCL's kernels (analyze: gloo_<kind>)
                "family": f"gloo_{k.collective.kind.value}" if k.on_host and k.collective else k.family.value,
                "provenance": rp.k_prov[ki],
            }
            inst = rp.k_inst[ki]
            if inst < 0:
                events.append(_x(k.name, "kernel", (pid, tid), t.k_start[ki], t.k_end[ki], **args))
                continue
            spec = program.instances[inst]
            args.update(collective=spec.kind.value, group=spec.group, seq=spec.seq)
            begin = ev.inst_start[inst]
            if begin > t.k_start[ki]:
                events.append(_x(f"wait for peers: {spec.kind.value} seq {spec.seq}", "collective_wait",
                                 (pid, tid), t.k_start[ki], begin, **args))  # fmt: skip
            events.append(
                _x(k.name, "kernel", (pid, tid), max(begin, t.k_start[ki]), t.k_end[ki], **args)
            )
    for s in res.critical_path:
        events.append(_x(f"{s.kind.value}: {s.label[:100]}", "critical_path", (s.rank, _PATH_TID),
                         s.start_s, s.end_s, kind=s.kind.value))  # fmt: skip
    return events


def write_timeline(res: SimResult, path: str | Path) -> Path:
    """Write the timeline atomically (a crash never leaves half a file); returns the path."""
    p = Path(path)
    # the producer mark first: an existing file is replaced only when it carries it
    # (cli.output.timeline_target), never a profiler trace that happens to hold traceEvents
    doc = {"otherData": {"producer": TIMELINE_PRODUCER, "predicted_step_s": res.predicted_step_s},
           "traceEvents": timeline_events(res), "displayTimeUnit": "ms"}  # fmt: skip
    stream = is_stream(p)  # a FIFO or device (/dev/stdout) is written into and keeps its mode
    write_json_atomic(p, doc)
    if not stream:
        p.chmod(0o644)  # the temporary file was private; a timeline is meant to be opened and shared
    return p
