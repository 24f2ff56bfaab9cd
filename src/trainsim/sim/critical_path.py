"""Walk a simulated step back from its end along the binding constraints.

The global path (``rank=None``) starts at the latest rank end and, at a collective, continues
on the member that arrived last (possibly another rank): every instant of it is work, a gap or
a wait that the step could not avoid. A per-rank path (``rank=r``) stays on rank r and shows a
collective's wait for the latest peer as ``COLLECTIVE_WAIT``. Segments are contiguous and
non-overlapping; consecutive host gaps of one op are merged into one segment.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from trainsim.sim.engine import INTRA, LAUNCH, STREAM, WAIT
from trainsim.sim.options import SegmentKind

if TYPE_CHECKING:
    from trainsim.sim.result import Segment, SimResult

K_END, K_START, CALL_START, CALL_END, OP_START, OP_END = range(6)


def _end_node(res: SimResult, ri: int) -> tuple[int, int, int]:
    rp = res.program.ranks[ri]
    t = res.evaluation.times[ri]
    o = max(rp.window_ops or range(len(rp.ops)), key=lambda i: t.op_end[i])
    if rp.kernels:
        k = max(range(len(rp.kernels)), key=lambda i: t.k_end[i])
        # a rank without device kernels (gloo only) ends with its CPU window when that is later
        if not rp.graph.cpu_only or t.k_end[k] >= t.op_end[o] + rp.end_tail_s:
            return (K_END, ri, k)
    return (OP_END, ri, o)


def critical_path(res: SimResult, rank: int | None = None) -> list[Segment]:
    from trainsim.sim.result import Segment

    program, ev = res.program, res.evaluation
    if not any(rp.ops for rp in program.ranks):
        return []
    if rank is None:
        ri = max(range(len(program.ranks)), key=lambda i: res.ranks[i].end_s)
        floor = res.start_s
    else:
        ri = next(i for i, rp in enumerate(program.ranks) if rp.graph.rank == rank)
        floor = res.ranks[ri].start_s
    prev_cache: dict[int, list[int]] = {}

    def prev_in_lane(r: int) -> list[int]:
        got = prev_cache.get(r)
        if got is None:
            got = prev_cache[r] = _previous_op(program.ranks[r])
        return got

    out: list[list] = []  # [kind, rank, start, end, label], latest first; Segments at the end
    host_gap = SegmentKind.HOST_GAP

    def emit(kind: SegmentKind, r: int, start: float, end: float, label: str) -> bool:
        """Add a segment (clipped at the floor); False once the floor is reached."""
        lo = start if start > floor else floor
        if end > lo:
            rr = program.ranks[r].graph.rank
            last = out[-1] if out else None
            if (
                last is not None
                and kind is host_gap
                and last[0] is kind
                and last[1] == rr
                and last[4] == label
                and abs(last[2] - end) < 1e-12
            ):
                last[2] = lo  # consecutive host gaps of one op: one segment
            else:
                out.append([kind, rr, lo, end, label])
        return start > floor

    end_node = _end_node(res, ri)
    tail = program.ranks[ri].end_tail_s
    if end_node[0] == OP_END and tail > 0:  # a rank without device kernels ends after its last op
        last_end = ev.times[ri].op_end[end_node[2]]
        emit(
            SegmentKind.HOST_GAP,
            ri,
            last_end,
            last_end + tail,
            "after the last op (step window end)",
        )
    node: tuple[int, int, int] | None = end_node
    while node is not None:
        kind, r, i = node
        rp, t = program.ranks[r], ev.times[r]
        if kind == K_END:
            inst = rp.k_inst[i]
            k = rp.kernels[i]
            if inst < 0:
                node = (
                    (K_START, r, i)
                    if emit(SegmentKind.KERNEL, r, t.k_start[i], t.k_end[i], k.name)
                    else None
                )
                continue
            spec = program.instances[inst]
            br, bk = ev.inst_bind[inst]
            latest = ev.times[br].k_start[bk]
            label = f"{spec.kind.value} {spec.group} seq {spec.seq} (transfer)"
            # globally the transfer belongs to the member whose arrival decided it
            if not emit(
                SegmentKind.KERNEL, r if rank is not None else br, latest, t.k_end[i], label
            ):
                break
            if rank is not None and br != r:
                peer = program.ranks[br].graph.rank
                wait_label = f"{spec.kind.value} {spec.group} seq {spec.seq}: waits for rank {peer}"
                node = (
                    (K_START, r, i)
                    if emit(SegmentKind.COLLECTIVE_WAIT, r, t.k_start[i], latest, wait_label)
                    else None
                )
            else:
                node = (K_START, br, bk)
        elif kind == K_START:
            v = t.k_bind[i]
            b, ref = v & 3, (v >> 2) - 1  # engine.unbind
            s = t.k_start[i]
            if b == LAUNCH:
                ok = emit(SegmentKind.LAUNCH_DELAY, r, t.call_start[ref], s, rp.kernels[i].name)
                node = (CALL_START, r, ref) if ok else None
            elif b == STREAM:
                if ref < 0:  # the previous step's backlog on this stream: its gap, then the step start
                    busy = rp.lane_busy_until[rp.k_lane[i]]
                    if busy is not None:  # (before: dropped; the global path called it rank_start)
                        emit(SegmentKind.KERNEL_GAP, r, busy, s,
                             f"stream {rp.kernels[i].stream} after the previous step's backlog")  # fmt: skip
                    break
                ok = emit(
                    SegmentKind.KERNEL_GAP, r, t.k_end[ref], s, f"stream {rp.kernels[i].stream}"
                )
                node = (K_END, r, ref) if ok else None
            elif b == WAIT:
                w = rp.kernels[ref]
                ok = emit(SegmentKind.STREAM_WAIT, r, t.k_end[ref], s,
                          f"stream {rp.kernels[i].stream} waits for stream {w.stream}")  # fmt: skip
                node = (K_END, r, ref) if ok else None
            else:
                assert b == INTRA
                ok = emit(SegmentKind.STREAM_WAIT, r, t.k_start[ref], s,
                          "next collective after the first dependent (000 §III-D)")  # fmt: skip
                node = (K_START, r, ref) if ok else None
        elif kind == CALL_START:
            prev, o = t.call_prev[i], rp.call_op[i]
            name = rp.ops[o].name
            if prev >= 0:
                node = (
                    (CALL_END, r, prev)
                    if emit(SegmentKind.HOST_GAP, r, t.call_end[prev], t.call_start[i], name)
                    else None
                )
            else:
                node = (
                    (OP_START, r, o)
                    if emit(SegmentKind.HOST_GAP, r, t.op_start[o], t.call_start[i], name)
                    else None
                )
        elif kind == CALL_END:
            cb = t.call_bind[i]
            name = rp.ops[rp.call_op[i]].name
            if cb >= 0:
                ok = emit(
                    SegmentKind.STREAM_WAIT,
                    r,
                    t.k_end[cb],
                    t.call_end[i],
                    f"{name}: CPU blocked on stream {rp.kernels[cb].stream}",
                )
                node = (K_END, r, cb) if ok else None
            else:
                node = (
                    (CALL_START, r, i)
                    if emit(SegmentKind.HOST_GAP, r, t.call_start[i], t.call_end[i], name)
                    else None
                )
        elif kind == OP_START:
            b = t.op_bind[i]
            name = rp.ops[i].name
            if b == -1:
                emit(SegmentKind.HOST_GAP, r, rp.cpu_start_s, t.op_start[i], name)
                break
            src = prev_in_lane(r)[i] if b == -2 else b
            node = (
                (OP_END, r, src)
                if emit(SegmentKind.HOST_GAP, r, t.op_end[src], t.op_start[i], name)
                else None
            )
        else:  # OP_END
            last = t.op_last[i]
            name = rp.ops[i].name
            if last >= 0:
                node = (
                    (CALL_END, r, last)
                    if emit(SegmentKind.HOST_GAP, r, t.call_end[last], t.op_end[i], name)
                    else None
                )
            else:
                node = (
                    (OP_START, r, i)
                    if emit(SegmentKind.HOST_GAP, r, t.op_start[i], t.op_end[i], name)
                    else None
                )
    if rank is None and out and out[-1][2] > floor:
        first = out[-1]
        out.append([SegmentKind.RANK_START, first[1], floor, first[2],
                    f"rank {first[1]} starts its step later (traced offset)"])  # fmt: skip
    return [Segment(*seg) for seg in reversed(out)]


def _previous_op(rp: object) -> list[int]:
    """For each op, the previous op of its CPU thread (-1 for the first)."""
    prev = [-1] * len(rp.ops)  # type: ignore[attr-defined]
    for lane in rp.cpu_lanes:  # type: ignore[attr-defined]
        for a, b in itertools.pairwise(lane):
            prev[b] = a
    return prev
