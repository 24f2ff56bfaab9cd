"""Property tests of the simulator on random synthetic workloads (STYLE.md "Tests")."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainsim.host.overheads import Overhead, OverheadDB, Stat
from trainsim.ir.graph import Kernel, RankGraph, SyncPoint, Workload
from trainsim.ir.kinds import SyncKind
from trainsim.sim import HostMode, SimOptions, simulate
from trainsim.sim.synthetic import all_reduce, kernel, op

US = 1e-6
EXACT = SimOptions(launch_latency_s=0.0, kernel_gap_s=0.0)
_STATS = {Overhead(k): Stat(v * US, v * US, 0.0, 1, 1) for k, v in
          {"T1": 3, "T2": 2, "T3": 1, "T4": 4, "T5": 1, "cpu": 6}.items()}  # fmt: skip
WITH_HOST = SimOptions(overheads=HostMode.SHARED, overhead_db=OverheadDB(global_=_STATS),
                       launch_latency_s=2 * US, kernel_gap_s=1 * US)  # fmt: skip
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def rank_graphs(draw: st.DrawFn, rank: int, collectives: int, group: tuple[int, ...]) -> RankGraph:
    n_ops = draw(st.integers(1, 10))
    coll_at = sorted(
        draw(st.lists(st.integers(0, n_ops - 1), min_size=collectives, max_size=collectives))
    )
    ops = []
    kid = 0
    issued: list[Kernel] = []
    for i in range(n_ops):
        ks = []
        for _ in range(draw(st.integers(0, 3))):
            ks.append(kernel(kid, draw(st.sampled_from([7, 8, 9])), draw(st.floats(0, 100)) * US))
            kid += 1
        for seq, at in enumerate(coll_at):
            if at == i:
                ks.append(
                    kernel(
                        kid, 84, draw(st.floats(0, 50)) * US, collective=all_reduce(seq, 64, group)
                    )
                )
                kid += 1
        syncs = []
        if issued and draw(st.booleans()):
            target = draw(st.sampled_from(issued))
            kind = draw(st.sampled_from([SyncKind.STREAM_WAIT_EVENT, SyncKind.STREAM_SYNC]))
            stream = (
                draw(st.sampled_from([7, 8, 9]))
                if kind is SyncKind.STREAM_WAIT_EVENT
                else target.stream
            )
            syncs.append(
                SyncPoint(
                    kind, stream=stream, wait_on_stream=target.stream, wait_on_kernel=target.id
                )
            )
        deps = draw(st.lists(st.integers(0, i - 1), max_size=2, unique=True)) if i else []
        ops.append(
            op(i, kernels=ks, syncs=syncs, deps=deps, thread=draw(st.sampled_from([1, 1, 2])))
        )
        issued.extend(ks)
    return RankGraph(rank, tuple(ops))


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    n = draw(st.integers(1, 3))
    group = tuple(range(n))
    colls = draw(st.integers(0, 3))
    ranks = tuple(draw(rank_graphs(r, colls, group)) for r in range(n))
    return Workload(ranks=ranks, process_groups={"dp": group} if colls else {})


def _kernels(w: Workload) -> list[tuple[int, int, int]]:
    return [
        (r, o, k)
        for r, rg in enumerate(w.ranks)
        for o, op_ in enumerate(rg.ops)
        for k in range(len(op_.kernels))
    ]


@SETTINGS
@given(st.lists(st.floats(0, 1000), min_size=1, max_size=30))
def test_one_stream_makespan_is_the_sum_of_durations(durations_us: list[float]) -> None:
    ops = tuple(op(i, kernels=[kernel(i, 7, d * US)]) for i, d in enumerate(durations_us))
    res = simulate(Workload(ranks=(RankGraph(0, ops),)), EXACT)
    assert abs(res.predicted_step_s - sum(durations_us) * US) <= 1e-12 * max(1, len(durations_us))


@SETTINGS
@given(workloads(), st.sampled_from([EXACT, WITH_HOST]))
def test_makespan_covers_the_critical_path_which_covers_the_longest_kernel(
    w: Workload, opts: SimOptions
) -> None:
    res = simulate(w, opts)
    path = sum(s.duration_s for s in res.critical_path)
    assert abs(path - res.predicted_step_s) <= 1e-9
    longest = max(
        (k.duration_s or 0.0 for rg in w.ranks for k in rg.kernels() if k.collective is None),
        default=0.0,
    )
    assert res.predicted_step_s + 1e-12 >= path - 1e-9 >= longest - 2e-9
    for a, b in zip(res.critical_path, res.critical_path[1:], strict=False):
        assert abs(a.end_s - b.start_s) <= 1e-12 and a.end_s >= a.start_s


@SETTINGS
@given(workloads(), st.sampled_from([EXACT, WITH_HOST]), st.data())
def test_adding_a_dependency_never_shortens_the_step(
    w: Workload, opts: SimOptions, data: st.DataObject
) -> None:
    r = data.draw(st.integers(0, len(w.ranks) - 1))
    rg = w.ranks[r]
    if len(rg.ops) < 2:
        return
    b = data.draw(st.integers(1, len(rg.ops) - 1))
    a = data.draw(st.integers(0, b - 1))
    ops = list(rg.ops)
    ops[b] = replace(ops[b], deps=tuple(sorted(set(ops[b].deps) | {a})))
    w2 = replace(
        w, ranks=tuple(replace(x, ops=tuple(ops)) if i == r else x for i, x in enumerate(w.ranks))
    )
    assert simulate(w2, opts).predicted_step_s >= simulate(w, opts).predicted_step_s - 1e-12


@SETTINGS
@given(workloads(), st.sampled_from([EXACT, WITH_HOST]), st.floats(1.0, 10.0), st.data())
def test_a_slower_kernel_never_speeds_the_step_up(w: Workload, opts: SimOptions, factor: float,
                                                  data: st.DataObject) -> None:  # fmt: skip
    ks = _kernels(w)
    if not ks:
        return
    r, o, k = data.draw(st.sampled_from(ks))
    rg = w.ranks[r]
    target = rg.ops[o]
    kern = list(target.kernels)
    kern[k] = replace(kern[k], duration_s=(kern[k].duration_s or 0.0) * factor + 1 * US)
    ops = tuple(replace(x, kernels=tuple(kern)) if j == o else x for j, x in enumerate(rg.ops))
    w2 = replace(
        w, ranks=tuple(replace(x, ops=ops) if i == r else x for i, x in enumerate(w.ranks))
    )
    assert simulate(w2, opts).predicted_step_s >= simulate(w, opts).predicted_step_s - 1e-12
