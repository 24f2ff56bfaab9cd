"""The event-driven evaluation of a compiled :class:`~trainsim.sim.program.Program`.

Every CPU thread and every stream of every rank is a *lane* that advances through its items
in order (ops and their runtime calls; kernels in FIFO order), computing each item's time as
the max over its constraints (see ``program.py``). A lane that needs a time not yet known —
a kernel whose launch call its thread has not reached, a blocking sync on a kernel still
queued, a collective whose peers have not all arrived — parks itself on the lane (or
collective instance) that will produce it and is woken when that one makes progress. Each item
is computed once, so the cost is linear in ops + kernels + edges; a rank graph that
``represents`` many identical ranks is evaluated once. When no lane can move while some are
unfinished, the wait-for graph of the stuck lanes names the cycle (a dependency cycle, or
ranks issuing collectives in different orders) in a :class:`SimulationError`.

Binding constraints are recorded per item so that the critical path can be walked back.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from trainsim.errors import SimulationError
from trainsim.sim.program import Program, RankProgram

NEG_INF = float("-inf")
# Kernel binding kinds (what decided a kernel's start), stored with their reference in one int
# (``bind(kind, ref)``; no tuple per kernel: the evaluation allocates nothing per item).
LAUNCH, STREAM, WAIT, INTRA = 0, 1, 2, 3


def bind(kind: int, ref: int) -> int:
    """``RankTimes.k_bind`` value: ``ref`` >= -1 (a call, kernel, or -1: none)."""
    return (ref + 1) * 4 + kind


def unbind(value: int) -> tuple[int, int]:
    """(kind, ref) of a ``RankTimes.k_bind`` value."""
    return value & 3, (value >> 2) - 1


@dataclass(slots=True)
class RankTimes:
    """Simulated times of one rank (seconds, same origin as the IR) and binding constraints."""

    op_start: list[float]
    op_end: list[float]
    op_bind: list[int]  # -1 thread start, -2 previous op of the thread, >= 0 cross-thread op
    op_last: list[int]  # call whose end set the clock before the op's tail, -1: the op start
    call_start: list[float]
    call_end: list[float]
    call_bind: list[int]  # awaited kernel that decided a blocking call's end, else -1
    call_prev: list[int]  # call whose end set the clock before this call's gap, -1: op start
    k_start: list[float]
    k_end: list[float]
    k_bind: list[int]  # bind(kind, ref): LAUNCH call, STREAM kernel/-1, WAIT/INTRA kernel


@dataclass(slots=True)
class _Lane:
    rank: int
    cpu: bool
    idx: int
    pos: int = 0
    cpos: int = -1
    clock: float = NEG_INF
    last: int = -1  # clock source inside the current op (call index, -1 op start)
    done: bool = False
    reason: tuple[str, int, str, int] = ("", -1, "", -1)  # (lane|inst, target, item kind, item)


@dataclass(slots=True)
class Evaluation:
    times: list[RankTimes]
    inst_end: list[float]  # the last-arriving member's end (every member's, but gloo's: collectives.Instance.tails)
    inst_bind: list[tuple[int, int]]  # latest member (rank index, kernel index)
    inst_start: list[float]  # the latest member's start (when the transfer begins)


def _none(n: int) -> list[Any]:
    return [None] * n


class Engine:
    def __init__(self, program: Program) -> None:
        self.p = program
        self.lanes: list[_Lane] = []
        self.cpu_base: list[int] = []
        self.stream_base: list[int] = []
        for r, rp in enumerate(program.ranks):
            self.cpu_base.append(len(self.lanes))
            for i in range(len(rp.cpu_lanes)):
                self.lanes.append(_Lane(r, True, i, clock=rp.cpu_start_s))
            self.stream_base.append(len(self.lanes))
            for i, busy in enumerate(rp.lane_busy_until):
                self.lanes.append(_Lane(r, False, i, clock=NEG_INF if busy is None else busy))
        self.t = [self._times(rp) for rp in program.ranks]
        n = len(program.instances)
        self.inst_arrived = [0] * n
        self.inst_max: list[float] = [NEG_INF] * n
        self.inst_bind: list[tuple[int, int]] = [(-1, -1)] * n
        self.inst_end: list[float] = [NEG_INF] * n
        self.inst_waiters: list[list[int]] = [[] for _ in range(n)]
        self.waiters: list[list[int]] = [[] for _ in self.lanes]
        self.queue: deque[int] = deque()
        self.queued = [False] * len(self.lanes)

    @staticmethod
    def _times(rp: RankProgram) -> RankTimes:
        no, nc, nk = len(rp.ops), len(rp.call_key), len(rp.kernels)
        return RankTimes(_none(no), _none(no), [-1] * no, [-1] * no, _none(nc), _none(nc),
                         [-1] * nc, [-1] * nc, _none(nk), _none(nk), [LAUNCH] * nk)  # fmt: skip

    def run(self) -> Evaluation:
        for g in range(len(self.lanes)):
            self._push(g)
        while self.queue:
            g = self.queue.popleft()
            self.queued[g] = False
            lane = self.lanes[g]
            before = (lane.pos, lane.cpos)
            wrote = self._run_cpu(g, lane) if lane.cpu else self._run_stream(g, lane)
            if wrote or (lane.pos, lane.cpos) != before or lane.done:
                ws = self.waiters[g]
                self.waiters[g] = []
                for w in ws:
                    self._push(w)
        stuck = [g for g, lane in enumerate(self.lanes) if not lane.done]
        if stuck:
            from trainsim.sim.deadlock import describe_deadlock

            raise SimulationError(describe_deadlock(self, stuck))
        return Evaluation(self.t, self.inst_end, self.inst_bind, self.inst_max)

    def _push(self, g: int) -> None:
        if not self.queued[g] and not self.lanes[g].done:
            self.queued[g] = True
            self.queue.append(g)

    def _park(self, g: int, lane: _Lane, target: int, item_kind: str, item: int) -> None:
        lane.reason = ("lane", target, item_kind, item)
        self.waiters[target].append(g)

    def _run_cpu(self, g: int, lane: _Lane) -> bool:
        """Advance a CPU lane; True when it set a time without moving (a call's start)."""
        rp = self.p.ranks[lane.rank]
        t = self.t[lane.rank]
        ops = rp.cpu_lanes[lane.idx]
        op_t1, op_cross, op_call0, op_tail = rp.op_t1, rp.op_cross, rp.op_call0, rp.op_tail
        call_gap, call_dur, call_block = rp.call_gap, rp.call_dur, rp.call_block
        call_wake = rp.call_wake
        op_start, op_end, op_bind, op_last = t.op_start, t.op_end, t.op_bind, t.op_last
        call_start, call_end, call_prev, call_bind = (
            t.call_start,
            t.call_end,
            t.call_prev,
            t.call_bind,
        )
        k_end = t.k_end
        pos, cpos, clock, last = lane.pos, lane.cpos, lane.clock, lane.last
        n = len(ops)
        while pos < n:
            o = ops[pos]
            if cpos < 0:
                start = clock + op_t1[o]
                b = -2 if pos else -1
                cross = op_cross[o]
                if cross:
                    for src, delay in cross:
                        e = op_end[src]
                        if e is None:
                            lane.pos, lane.cpos, lane.clock, lane.last = pos, cpos, clock, last
                            self._park(
                                g, lane, self.cpu_base[lane.rank] + rp.op_lane[src], "op", src
                            )
                            return False
                        if e + delay > start:
                            start, b = e + delay, src
                op_start[o] = start
                op_bind[o] = b
                clock, last, cpos = start, -1, op_call0[o]
            c1 = op_call0[o + 1]
            while cpos < c1:
                c = cpos
                cs = call_start[c]
                if cs is None:
                    cs = call_start[c] = clock + call_gap[c]
                    call_prev[c] = last
                    fresh = True
                else:
                    fresh = False
                ce = cs + call_dur[c]
                blk = call_block[c]
                if blk:
                    wake = call_wake[c]
                    cb = -1
                    for k in blk:
                        e = k_end[k]
                        if e is None:
                            lane.pos, lane.cpos, lane.clock, lane.last = pos, cpos, clock, last
                            self._park(
                                g, lane, self.stream_base[lane.rank] + rp.k_lane[k], "kernel", k
                            )
                            return fresh
                        if e + wake > ce:
                            ce, cb = e + wake, k
                    call_bind[c] = cb
                call_end[c] = ce
                if ce >= clock:
                    clock, last = ce, c
                cpos += 1
            op_last[o] = last
            clock = op_end[o] = clock + op_tail[o]
            cpos = -1
            pos += 1
        lane.pos, lane.cpos, lane.clock, lane.last = pos, cpos, clock, last
        lane.done = True
        return False

    def _run_stream(self, g: int, lane: _Lane) -> bool:
        """Advance a stream lane; True when it set a start without moving (a collective)."""
        r = lane.rank
        rp = self.p.ranks[r]
        t = self.t[r]
        ks = rp.stream_lanes[lane.idx]
        k_call, k_lat, k_gap, k_dur = rp.k_call, rp.k_lat, rp.k_gap, rp.k_dur
        k_waits, k_after, k_inst = rp.k_waits, rp.k_after, rp.k_inst
        k_start, k_end, k_bind, call_start = t.k_start, t.k_end, t.k_bind, t.call_start
        pos, clock = lane.pos, lane.clock
        prev = ks[pos - 1] if pos else -1
        n = len(ks)
        while pos < n:
            k = ks[pos]
            if k_start[k] is None:
                c = k_call[k]
                cs = call_start[c]
                if cs is None:
                    lane.pos, lane.clock = pos, clock
                    self._park(g, lane, self.cpu_base[r] + rp.op_lane[rp.call_op[c]], "call", c)
                    return False
                ready, rb = clock, (prev + 1) * 4 + STREAM  # bind(STREAM, prev)
                waits = k_waits[k]
                if waits:
                    for w in waits:
                        e = k_end[w]
                        if e is None:
                            lane.pos, lane.clock = pos, clock
                            self._park(g, lane, self.stream_base[r] + rp.k_lane[w], "kernel", w)
                            return False
                        if e > ready:
                            ready, rb = e, (w + 1) * 4 + WAIT
                launch = cs + k_lat[k]
                ready += k_gap[k]
                if launch >= ready:
                    start, b = launch, (c + 1) * 4 + LAUNCH
                else:
                    start, b = ready, rb
                after = k_after[k]
                if after:
                    for a in after:
                        s = k_start[a]
                        if s is None:
                            lane.pos, lane.clock = pos, clock
                            self._park(g, lane, self.stream_base[r] + rp.k_lane[a], "kernel", a)
                            return False
                        if s > start:
                            start, b = s, (a + 1) * 4 + INTRA
                k_start[k] = start
                k_bind[k] = b
                inst = k_inst[k]
                if inst < 0:
                    k_end[k] = start + k_dur[k]
                else:
                    self._arrive(inst, r, k, start)
            e = k_end[k]
            if e is None:
                lane.pos, lane.clock = pos, clock
                lane.reason = ("inst", k_inst[k], "kernel", k)
                self.inst_waiters[k_inst[k]].append(g)
                return True
            clock, prev = e, k
            pos += 1
        lane.pos, lane.clock = pos, clock
        lane.done = True
        return False

    def _arrive(self, inst: int, r: int, k: int, start: float) -> None:
        self.inst_arrived[inst] += 1
        if start > self.inst_max[inst]:
            self.inst_max[inst] = start
            self.inst_bind[inst] = (r, k)
        spec = self.p.instances[inst]
        if self.inst_arrived[inst] < len(spec.members):
            return
        end = self.inst_end[inst] = self.inst_max[inst] + spec.transfer_s
        if spec.tails is None:
            for ri, ki in spec.members:
                self.t[ri].k_end[ki] = end
        else:  # gloo: members end apart, none before the last arrival
            for (ri, ki), tail in zip(spec.members, spec.tails, strict=True):
                self.t[ri].k_end[ki] = max(self.inst_max[inst], end + tail)
        for w in self.inst_waiters[inst]:
            self._push(w)
        self.inst_waiters[inst] = []


def evaluate(program: Program) -> Evaluation:
    return Engine(program).run()
