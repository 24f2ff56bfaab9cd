"""Explain why the engine stopped: the wait-for cycle among stuck lanes, in ops and ranks."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainsim.sim.engine import Engine


def _item(engine: Engine, rank: int, kind: str, item: int) -> str:
    rp = engine.p.ranks[rank]
    r = rp.graph.rank
    if kind == "op":
        op = rp.ops[item]
        return f"rank {r} op {op.id} ({op.name}, thread {op.thread})"
    if kind == "call":
        op = rp.ops[rp.call_op[item]]
        return f"rank {r} op {op.id} ({op.name}, thread {op.thread})"
    k = rp.kernels[item]
    op = rp.ops[rp.call_op[rp.k_call[item]]]
    return f"rank {r} kernel {k.id} ({k.name[:50]}, stream {k.stream}, op {op.id} {op.name})"


def _head(engine: Engine, g: int) -> str:
    """The item a stuck lane is parked at."""
    lane = engine.lanes[g]
    rp = engine.p.ranks[lane.rank]
    if lane.cpu:
        oi = rp.cpu_lanes[lane.idx][lane.pos]
        return _item(engine, lane.rank, "op", oi)
    return _item(engine, lane.rank, "kernel", rp.stream_lanes[lane.idx][lane.pos])


def _edges(engine: Engine, g: int) -> list[int]:
    kind, target, _, _ = engine.lanes[g].reason
    if kind == "lane":
        return [target]
    if kind == "inst":
        out = []
        for ri, ki in engine.p.instances[target].members:
            if engine.t[ri].k_start[ki] is None:
                rp = engine.p.ranks[ri]
                out.append(engine.stream_base[ri] + rp.k_lane[ki])
        return out
    return []


def _why(engine: Engine, g: int) -> str:
    lane = engine.lanes[g]
    kind, target, item_kind, item = lane.reason
    if kind == "inst":
        inst = engine.p.instances[target]
        late = sorted(
            engine.p.ranks[ri].graph.rank
            for ri, ki in inst.members
            if engine.t[ri].k_start[ki] is None
        )
        return (f"{_head(engine, g)} waits in collective {inst.kind.value} of group {inst.group!r} "
                f"seq {inst.seq} for rank(s) {late}")  # fmt: skip
    what = {"op": "the end of", "call": "the launch by", "kernel": "the end of"}[item_kind]
    return f"{_head(engine, g)} waits for {what} {_item(engine, engine.lanes[target].rank, item_kind, item)}"


def describe_deadlock(engine: Engine, stuck: list[int]) -> str:
    """One message naming the cycle (or, failing that, the first stuck lanes)."""
    stuck_set = set(stuck)
    cycle: list[int] = []
    for start in stuck:
        path: list[int] = []
        seen: dict[int, int] = {}
        g = start
        while g in stuck_set and g not in seen:
            seen[g] = len(path)
            path.append(g)
            nxt = [h for h in _edges(engine, g) if h in stuck_set]
            if not nxt:
                break
            g = nxt[0]
        if g in seen:
            cycle = path[seen[g] :]
            break
    ranks = sorted({engine.p.ranks[engine.lanes[g].rank].graph.rank for g in (cycle or stuck)})
    if cycle:
        chain = "; ".join(_why(engine, g) for g in cycle)
        return (f"simulation deadlock (dependency cycle) on rank(s) {ranks}: {chain}. Check the "
                "op dependencies and that every rank issues its collectives in the same order")  # fmt: skip
    chain = "; ".join(_why(engine, g) for g in stuck[:6])
    return f"simulation cannot progress on rank(s) {ranks}: {chain}"
