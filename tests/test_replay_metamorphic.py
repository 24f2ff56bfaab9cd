"""Metamorphic relations of the replay and its what-ifs that scripts/metamorphic_replay.py found
broken on the shipped traces (2026-12-04): what-ifs under ``--kernels model``, a resize to the
traced batch in ``stats`` mode, per-rank critical paths after a previous step's backlog."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainsim.ir.graph import Op, RankGraph, Workload
from trainsim.ir.kinds import KernelFamily, OpCategory
from trainsim.sim import HostMode, KernelSource, SegmentKind, SimOptions, simulate, whatif
from trainsim.sim.replay import load_for_replay
from trainsim.sim.synthetic import kernel, op

from .conftest import DLRM_DIR

MODEL = SimOptions(kernels=KernelSource.MODEL)


@pytest.fixture(scope="module")
def dlrm_et() -> Workload:
    """The 8-rank DLRM with its execution traces linked (shapes: its GEMMs get models)."""
    return load_for_replay([DLRM_DIR]).workload


def test_network_what_ifs_scale_the_model_transfer_under_kernels_model(dlrm_et: Workload) -> None:
    base = simulate(dlrm_et, MODEL)
    same = simulate(whatif.faster_network(dlrm_et, 1.0), MODEL)
    # before: each member's measured time (waiting for peers included) × 1, the longest the
    # transfer: 20.25 -> 27.98 ms, and a network twice as fast 23.61 ms
    assert same.predicted_step_s == pytest.approx(base.predicted_step_s, rel=1e-12)
    fast = simulate(whatif.faster_network(dlrm_et, 2.0), MODEL)
    slow = simulate(whatif.faster_network(dlrm_et, 0.5), MODEL)
    assert fast.predicted_step_s <= base.predicted_step_s <= slow.predicted_step_s
    for a, b in zip(base.program.instances, fast.program.instances, strict=True):
        assert b.transfer_s == pytest.approx(a.transfer_s / 2, rel=1e-12)
        assert b.provenance == f"what-if ×0.5 of {a.provenance}"


def test_kernel_what_ifs_scale_the_model_time_under_kernels_model(dlrm_et: Workload) -> None:
    base = simulate(dlrm_et, MODEL)
    gemm = [i for i, k in enumerate(base.program.ranks[0].kernels) if k.family is KernelFamily.GEMM]
    assert any(base.program.ranks[0].k_prov[i].startswith("spec-based") for i in gemm)
    for w in (whatif.scale_family(dlrm_et, KernelFamily.GEMM, 1.0), whatif.straggler(dlrm_et, 0, 1.0)):
        same = simulate(w, MODEL)  # before: rank 0's GEMMs took their measured times (busy +22 us)
        assert [r.device_busy_s for r in same.ranks] == pytest.approx([r.device_busy_s for r in base.ranks], rel=1e-12)
        assert same.predicted_step_s == pytest.approx(base.predicted_step_s, rel=1e-12)
    half = simulate(whatif.scale_family(dlrm_et, KernelFamily.GEMM, 0.5), MODEL).program.ranks[0]
    for i in gemm:
        assert half.k_dur[i] == pytest.approx(base.program.ranks[0].k_dur[i] / 2, rel=1e-12)
    assert simulate(whatif.scale_family(dlrm_et, KernelFamily.GEMM, 0.5), MODEL).predicted_step_s <= base.predicted_step_s
    # measured kernels: unchanged semantics (the factor scales the measured time)
    meas = simulate(whatif.scale_family(dlrm_et, KernelFamily.GEMM, 0.5), SimOptions()).program.ranks[0]
    for i in gemm:
        measured = meas.kernels[i].duration_s
        assert measured is not None
        assert meas.k_dur[i] == pytest.approx(measured / 2, rel=1e-12)


def _cpu_rank(resized: dict[int, float] | None = None) -> Workload:
    """One thread of CPU-only ops: two ``x`` of 1 and 3 ms (mean 2 ms) and a ``y`` of 1 ms;
    ``resized`` gives ops a resize ratio as ``sim.resize`` sets it (their own time × ratio)."""
    ms = 1e-3
    spans = [(0, "x", 0.0, 1 * ms), (1, "y", 1.5 * ms, 1 * ms), (2, "x", 3.0 * ms, 3 * ms)]
    ops = []
    for oid, name, start, dur in spans:
        o = Op(id=oid, name=name, thread=1, category=OpCategory.CPU_ONLY, start_s=start, duration_s=dur)
        r = (resized or {}).get(oid)
        if r is not None:
            o = replace(o, predicted_s=dur * r, provenance=f"resize ×{r:.4g} test of measured")
        ops.append(o)
    return Workload(ranks=(RankGraph(0, tuple(ops), step_start_s=0.0, step_end_s=6 * ms),))


@pytest.mark.parametrize("overheads", [HostMode.STATS, HostMode.TRACE])
def test_a_resize_by_one_is_the_plain_replay(overheads: HostMode) -> None:
    opts = SimOptions(overheads=overheads)
    plain = simulate(_cpu_rank(), opts).predicted_step_s
    # before (stats): the first x took its own 1 ms for the per-name mean 2 ms: -1 ms
    assert simulate(_cpu_rank({0: 1.0}), opts).predicted_step_s == pytest.approx(plain, rel=1e-12)


def test_a_resized_cpu_op_adds_its_predicted_change_to_the_host_models_time() -> None:
    stats = SimOptions(overheads=HostMode.STATS)
    res = simulate(_cpu_rank({0: 2.0, 2: 0.5}), stats)
    tails = res.program.ranks[0].op_tail
    ms = 1e-3
    assert tails[0] == pytest.approx(2 * ms + 1 * ms)  # mean 2 ms + 1 ms × (2 - 1)
    assert tails[2] == pytest.approx(2 * ms - 1.5 * ms)  # mean 2 ms + 3 ms × (0.5 - 1)
    # one thread: the step is the own-time prediction's (per-name means sum to the measured total)
    own = 1 * ms * 2 + 3 * ms * 0.5
    plain = simulate(_cpu_rank(), stats)
    assert res.predicted_step_s - plain.predicted_step_s == pytest.approx(own - 4 * ms, rel=1e-9)
    assert simulate(_cpu_rank({2: 0.01}), stats).program.ranks[0].op_tail[2] == 0.0  # never below 0


def test_a_resize_to_the_traced_batch_is_the_plain_replay_on_a_gpu_capture(tmp_path_factory: pytest.TempPathFactory) -> None:
    from trainsim.cli.replay_cmd import _resize_timer
    from trainsim.sim.resize import resize_batch
    from trainsim.validate import gpu_e2e_suite as suite

    folder = suite._unpack_shipped(tmp_path_factory.mktemp("h100")) / "llama_b1_t1_s5_r0"
    w = load_for_replay([folder]).workload
    timer, _ = _resize_timer(w)
    for overheads in (HostMode.STATS, HostMode.TRACE):
        opts = SimOptions(overheads=overheads)
        same = resize_batch(w, 1, old_batch=1, timer=timer)
        # before (stats): 18.478 against 18.414 ms (+0.35 %): the two threads' views and
        # weight-sized ops took their own times for their per-name means
        assert simulate(same, opts).predicted_step_s == pytest.approx(simulate(w, opts).predicted_step_s, rel=1e-12)


def test_a_per_rank_critical_path_covers_the_step_after_a_backlog() -> None:
    us = 1e-6
    ops: tuple[Op, ...] = (op(0, kernels=[kernel(0, 7, 5 * us)]), op(1, kernels=[kernel(1, 7, 5 * us)]))
    ops = tuple(replace(o, start_s=i * us, duration_s=1 * us, kernels=tuple(
        replace(k, start_s=(20 + 6 * i) * us, launch_start_s=(i + 0.2) * us, launch_duration_s=0.5 * us)
        for k in o.kernels)) for i, o in enumerate(ops))  # fmt: skip
    # the previous step's kernel on stream 7 runs until 19 us; the first kernel starts 1 us later
    rank = RankGraph(0, ops, step_start_s=19 * us, step_end_s=31 * us,
                     metadata={"cpu_step_start_s": 0.0, "stream_busy_until_s": {"7": 19 * us}})  # fmt: skip
    res = simulate(Workload(ranks=(rank,)), SimOptions(overheads=HostMode.TRACE))
    assert res.predicted_step_s == pytest.approx(12 * us)
    for path in (res.critical_path, res.critical_path_for(0)):
        # before: the per-rank path began at the first kernel (11 of the 12 us); the global
        # path called the 1 us gap "rank 0 starts its step later", on a one-rank job
        assert path[0].start_s == pytest.approx(res.start_s)
        assert sum(s.duration_s for s in path) == pytest.approx(res.predicted_step_s)
        assert path[0].kind is SegmentKind.KERNEL_GAP and "backlog" in path[0].label
        assert all(s.kind is not SegmentKind.RANK_START for s in path)
