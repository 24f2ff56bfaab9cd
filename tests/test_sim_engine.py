"""Simulator semantics on small synthetic workloads, one rule per test (DESIGN.md "Simulation
semantics"): streams, launch latency, event waits, blocking syncs, data dependencies,
collective rendezvous, 000 §III-D's intra-rank rule, represented ranks, host gaps."""

from __future__ import annotations

import pytest

from trainsim.host.overheads import Overhead, OverheadDB, Stat
from trainsim.ir.graph import RankGraph, SyncPoint, Workload
from trainsim.ir.kinds import SyncKind
from trainsim.sim import HostMode, SegmentKind, SimOptions, simulate
from trainsim.sim.synthetic import all_reduce, data_parallel, kernel, op

US = 1e-6
EXACT = SimOptions(launch_latency_s=0.0, kernel_gap_s=0.0)  # no host gaps (empty DB), no GPU gaps


def _w(*ranks: RankGraph) -> Workload:
    return Workload(ranks=tuple(ranks))


def _times(res, rank: int = 0) -> dict[int, tuple[float, float]]:
    ri = next(i for i, rp in enumerate(res.program.ranks) if rp.graph.rank == rank)
    rp, t = res.program.ranks[ri], res.evaluation.times[ri]
    return {k.id: (t.k_start[i], t.k_end[i]) for i, k in enumerate(rp.kernels)}


def test_one_stream_runs_kernels_back_to_back():
    ops = [op(i, kernels=[kernel(i, 7, (i + 1) * US)]) for i in range(5)]
    res = simulate(_w(RankGraph(0, tuple(ops))), EXACT)
    assert res.predicted_step_s == pytest.approx(15 * US)
    assert res.ranks[0].streams[0].busy_s == pytest.approx(15 * US)
    assert res.ranks[0].idle_s == pytest.approx(0.0, abs=1e-15)


def test_two_streams_overlap_and_event_wait_orders_them():
    free = [op(0, kernels=[kernel(0, 7, 10 * US)]), op(1, kernels=[kernel(1, 8, 10 * US)])]
    assert simulate(_w(RankGraph(0, tuple(free))), EXACT).predicted_step_s == pytest.approx(10 * US)
    wait = SyncPoint(SyncKind.STREAM_WAIT_EVENT, stream=8, wait_on_stream=7, wait_on_kernel=0)
    ordered = [free[0], op(1, kernels=[kernel(1, 8, 10 * US)], syncs=[wait])]
    res = simulate(_w(RankGraph(0, tuple(ordered))), EXACT)
    assert res.predicted_step_s == pytest.approx(20 * US)
    assert _times(res)[1][0] == pytest.approx(10 * US)
    on_path = [s.label for s in res.critical_path if s.kind is SegmentKind.KERNEL]
    assert on_path == ["elementwise_0", "elementwise_1"]  # the path follows the wait


def test_launch_latency_and_kernel_gap_delay_kernels():
    ops = [op(i, kernels=[kernel(i, 7, 10 * US)]) for i in range(3)]
    res = simulate(
        _w(RankGraph(0, tuple(ops))), SimOptions(launch_latency_s=5 * US, kernel_gap_s=1 * US)
    )
    starts = [s for s, _ in _times(res).values()]
    assert starts == pytest.approx([5 * US, 16 * US, 27 * US])
    assert res.critical_path[0].kind is SegmentKind.LAUNCH_DELAY


def _db(**means_us: float) -> OverheadDB:
    stat = {Overhead(k): Stat(v * US, v * US, 0.0, 1, 1) for k, v in means_us.items()}
    return OverheadDB(per_op={}, global_=stat)


def test_host_gaps_follow_002_algorithm_3():
    """T1 before each op, T2 before its first launch, T4 per launch, T5 between, T3 after."""
    ops = [op(0, kernels=[kernel(0, 7, 1 * US), kernel(1, 7, 1 * US)]), op(1)]
    db = _db(T1=10, T2=3, T3=4, T4=5, T5=2, cpu=7)
    res = simulate(
        _w(RankGraph(0, tuple(ops))),
        SimOptions(
            overheads=HostMode.SHARED, overhead_db=db, launch_latency_s=0.0, kernel_gap_s=0.0
        ),
    )
    t = res.evaluation.times[0]
    assert t.op_start[0] == pytest.approx(10 * US)  # T1
    assert t.call_start == pytest.approx([13 * US, 20 * US])  # + T2; + T4 + T5
    assert t.op_end[0] == pytest.approx(29 * US)  # + T4 + T3
    assert t.op_end[1] == pytest.approx(29 * US + 10 * US + 7 * US)  # T1 + CPU-only duration


def test_blocking_sync_holds_the_cpu_until_the_stream_is_done():
    sync = SyncPoint(SyncKind.STREAM_SYNC, stream=7)
    ops = [
        op(0, kernels=[kernel(0, 7, 100 * US)], syncs=[sync]),
        op(1, kernels=[kernel(1, 8, 1 * US)]),
    ]
    res = simulate(_w(RankGraph(0, tuple(ops))), EXACT)
    assert _times(res)[1][0] == pytest.approx(100 * US)  # launched only after the sync returned
    nonblocking = [op(0, kernels=[kernel(0, 7, 100 * US)]), ops[1]]
    assert _times(simulate(_w(RankGraph(0, tuple(nonblocking))), EXACT))[1][0] == pytest.approx(0.0)


def test_op_dependency_orders_kernels_across_streams():
    ops = [op(0, kernels=[kernel(0, 7, 50 * US)]), op(1, kernels=[kernel(1, 8, 5 * US)], deps=[0])]
    res = simulate(_w(RankGraph(0, tuple(ops))), EXACT)
    assert _times(res)[1][0] == pytest.approx(50 * US)


def _two_ranks(delay_us: float, transfer_us: float = 20.0) -> Workload:
    group = (0, 1)
    ranks = []
    for r in (0, 1):
        pre = kernel(0, 7, (100 + delay_us * r) * US)
        coll = kernel(1, 84, transfer_us * US, collective=all_reduce(0, 1 << 20, group))
        wait = SyncPoint(SyncKind.STREAM_WAIT_EVENT, stream=84, wait_on_stream=7, wait_on_kernel=0)
        ranks.append(RankGraph(r, (op(0, kernels=[pre]), op(1, kernels=[coll], syncs=[wait]))))
    return Workload(ranks=tuple(ranks), process_groups={"dp": group})


def test_collective_members_finish_together_after_the_latest_arrival():
    res = simulate(_two_ranks(delay_us=300), EXACT)
    end0, end1 = _times(res, 0)[1][1], _times(res, 1)[1][1]
    assert end0 == end1 == pytest.approx((400 + 20) * US)
    assert res.rank(0).collective_wait_s == pytest.approx(300 * US)
    assert res.rank(1).collective_wait_s == pytest.approx(0.0, abs=1e-12)
    # the global path runs through the late rank; rank 0's own path shows its wait
    assert {s.rank for s in res.critical_path} == {1}
    waits = [s for s in res.critical_path_for(0) if s.kind is SegmentKind.COLLECTIVE_WAIT]
    assert sum(s.duration_s for s in waits) == pytest.approx(300 * US)


def test_measured_collective_transfer_is_the_last_arrivals_duration():
    """Members' measured durations include waiting: the transfer is the shortest of them."""
    w = _two_ranks(delay_us=0)
    ranks = []
    for rg, dur in zip(w.ranks, (500 * US, 20 * US), strict=True):
        o = rg.ops[1]
        k = o.kernels[0]
        ranks.append(RankGraph(rg.rank, (rg.ops[0], op(1, kernels=[kernel(1, 84, dur, collective=k.collective)],
                                                       syncs=o.syncs))))  # fmt: skip
    res = simulate(Workload(ranks=tuple(ranks), process_groups=w.process_groups), EXACT)
    assert res.program.instances[0].transfer_s == pytest.approx(20 * US)
    assert res.predicted_step_s == pytest.approx(120 * US)


def test_intra_rank_rule_of_000_starts_the_next_collective_after_the_first_dependent():
    """C1 on the comm stream, D (compute) waits for C1 but is queued behind a long kernel;
    C2 may start only once D starts (000 §III-D), not right after C1."""
    group = (0,)
    c1 = kernel(0, 84, 10 * US, collective=all_reduce(0, 8, group))
    long = kernel(1, 7, 100 * US)
    d = kernel(2, 7, 5 * US)
    c2 = kernel(3, 84, 10 * US, collective=all_reduce(1, 8, group))
    wait_d = SyncPoint(SyncKind.STREAM_WAIT_EVENT, stream=7, wait_on_stream=84, wait_on_kernel=0)
    ops = (
        op(0, kernels=[c1]),
        op(1, kernels=[long]),
        op(2, kernels=[d], syncs=[wait_d]),
        op(3, kernels=[c2]),
    )
    w = Workload(ranks=(RankGraph(0, ops),), process_groups={"dp": group})
    with_rule = _times(simulate(w, EXACT))
    assert with_rule[3][0] == pytest.approx(100 * US)  # D starts at 100 µs
    without = _times(
        simulate(w, SimOptions(launch_latency_s=0.0, kernel_gap_s=0.0, intra_rank_sync=False))
    )
    assert without[3][0] == pytest.approx(10 * US)


def test_represented_ranks_are_simulated_once_with_the_same_result():
    small = data_parallel(4, world=4, layers=6)
    big = data_parallel(4, world=4096, layers=6)
    a, b = simulate(small), simulate(big)
    assert a.predicted_step_s == pytest.approx(b.predicted_step_s)
    assert [r.represents for r in b.ranks] == [1024] * 4
    assert len(b.program.ranks) == 4


def test_kernel_sum_baseline_is_the_busiest_stream_of_the_busiest_rank():
    res = simulate(data_parallel(3, layers=8), EXACT)
    sums = [
        sum(k.duration_s for k in rg.kernels() if k.stream == 7)
        for rg in res.program.workload.ranks
    ]
    assert res.kernel_sum_baseline_s == pytest.approx(max(sums))
    assert res.predicted_step_s > res.kernel_sum_baseline_s


def test_a_rank_without_kernels_ends_with_its_cpu_window():
    """CPU-only ranks end at ``step_end_s`` (Python after the last op), as measured."""
    from dataclasses import replace

    ops = tuple(replace(op(i), start_s=i * 10 * US, duration_s=5 * US) for i in range(3))
    rg = RankGraph(0, ops, step_start_s=0.0, step_end_s=40 * US)
    for mode in (HostMode.TRACE, HostMode.STATS):
        res = simulate(_w(rg), SimOptions(overheads=mode))
        assert res.predicted_step_s == pytest.approx(40 * US)
        assert sum(s.duration_s for s in res.critical_path) == pytest.approx(40 * US)
