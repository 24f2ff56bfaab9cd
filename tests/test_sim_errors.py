"""Bad input ends in one SimulationError that names the ops and ranks involved."""

from __future__ import annotations

import pytest

from trainsim.errors import ConfigError, SimulationError
from trainsim.ir.graph import Kernel, RankGraph, SyncPoint, Workload
from trainsim.ir.kinds import KernelFamily, SyncKind
from trainsim.sim import HostMode, KernelSource, SimOptions, simulate
from trainsim.sim.synthetic import all_reduce, kernel, op

US = 1e-6


def test_dependency_cycle_across_threads_names_both_ops():
    ops = (op(0, kernels=[kernel(0, 7, US)], deps=[1], thread=1, name="aten::mm"),
           op(1, kernels=[kernel(1, 7, US)], deps=[0], thread=2, name="aten::add"))  # fmt: skip
    with pytest.raises(SimulationError) as e:
        simulate(Workload(ranks=(RankGraph(3, ops),)))
    msg = str(e.value)
    assert "cycle" in msg and "rank(s) [3]" in msg
    assert "aten::mm" in msg and "aten::add" in msg


def test_blocking_sync_on_a_kernel_launched_later_is_a_cycle():
    sync = SyncPoint(SyncKind.EVENT_SYNC, stream=7, wait_on_kernel=1)
    ops = (
        op(0, syncs=[sync], name="aten::item"),
        op(1, kernels=[kernel(1, 7, US)], name="aten::relu"),
    )
    with pytest.raises(SimulationError, match=r"aten::item.*aten::relu"):
        simulate(Workload(ranks=(RankGraph(0, ops),)))


def _coll_rank(rank: int, seqs: list[int], group: tuple[int, ...]) -> RankGraph:
    ops = tuple(op(i, kernels=[kernel(i, 84, 10 * US, collective=all_reduce(s, 8, group))], name=f"allreduce_{s}")
                for i, s in enumerate(seqs))  # fmt: skip
    return RankGraph(rank, ops)


def test_collective_with_a_missing_member_names_group_seq_and_ranks():
    group = (0, 1, 2)
    w = Workload(ranks=(_coll_rank(0, [0, 1], group), _coll_rank(1, [0, 1], group), _coll_rank(2, [0], group)),
                 process_groups={"dp": group})  # fmt: skip
    with pytest.raises(
        SimulationError, match=r"group 'dp' seq 1.*ranks \[0, 1\].*member rank\(s\) \[2\]"
    ):
        simulate(w)


def test_collectives_issued_in_different_orders_deadlock():
    group = (0, 1)
    w = Workload(
        ranks=(_coll_rank(0, [0, 1], group), _coll_rank(1, [1, 0], group)),
        process_groups={"dp": group},
    )
    with pytest.raises(SimulationError) as e:
        simulate(w)
    msg = str(e.value)
    assert "deadlock" in msg and "rank(s) [0, 1]" in msg
    assert "seq 0" in msg and "seq 1" in msg and "allreduce_" in msg


def test_absent_group_members_are_assumed_on_time():
    """Rank 0 of a 16-rank job replays alone: the collective takes its own duration."""
    w = Workload(ranks=(_coll_rank(0, [0], tuple(range(16))),))
    res = simulate(w, SimOptions(launch_latency_s=0.0, kernel_gap_s=0.0))
    assert res.predicted_step_s == pytest.approx(10 * US)


def test_a_kernel_without_any_duration_is_reported():
    k = Kernel(id=0, name="mystery", family=KernelFamily.OTHER, stream=7)
    with pytest.raises(SimulationError, match=r"rank 0: kernel 0 \(mystery\)"):
        simulate(Workload(ranks=(RankGraph(0, (op(0, kernels=[k]),)),)))
    # no model applies either: still an error in model mode
    with pytest.raises(SimulationError, match="no prediction"):
        simulate(
            Workload(ranks=(RankGraph(0, (op(0, kernels=[k]),)),)),
            SimOptions(kernels=KernelSource.MODEL),
        )


def test_trace_mode_needs_measured_times():
    with pytest.raises(ConfigError, match="no measured CPU time"):
        simulate(Workload(ranks=(RankGraph(0, (op(0),)),)), SimOptions(overheads=HostMode.TRACE))
    with pytest.raises(ConfigError, match="needs an overhead database"):
        simulate(Workload(ranks=(RankGraph(0, (op(0),)),)), SimOptions(overheads=HostMode.SHARED))
