"""The kernel-model registry: conformance of every default model, duplicates, fallbacks, and
the adapter that lets a ``trainsim.comm`` model answer for collective kernels."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from trainsim.comm.model import CommModel
from trainsim.errors import ConfigError
from trainsim.ir.graph import Collective, Kernel, Op, RankGraph, TensorMeta, Workload
from trainsim.ir.kinds import CollectiveKind, KernelFamily, OpCategory
from trainsim.sim import KernelSource, SimOptions, simulate
from trainsim.sim.durations import CommModelKernels, ModelRegistry, default_registry, device_spec
from trainsim.sim.synthetic import all_reduce, kernel, op

V100 = device_spec("Tesla V100-SXM2-32GB")


def _cases() -> list[tuple[Kernel, Op]]:
    """One supported (kernel, op) per default model, with a size knob to grow."""
    copy = Kernel(
        0, "Memcpy HtoD (Pinned -> Device)", KernelFamily.MEMCPY, 7, features={"bytes": 1 << 20}
    )
    dcopy = Kernel(
        1, "Memcpy DtoD (Device -> Device)", KernelFamily.MEMCPY, 7, features={"bytes": 1 << 20}
    )
    gemm = Kernel(2, "volta_sgemm_128x64_nn", KernelFamily.GEMM, 7)
    mm = Op(0, "aten::mm", 1, OpCategory.COMPUTE, kernels=(gemm,),
            inputs=(TensorMeta((512, 256), "float"), TensorMeta((256, 1024), "float")))  # fmt: skip
    ew = Kernel(3, "vectorized_elementwise_kernel", KernelFamily.ELEMENTWISE, 7)
    add = Op(1, "aten::add", 1, OpCategory.COMPUTE, kernels=(ew,),
             inputs=(TensorMeta((1 << 20,), "float"), TensorMeta((1 << 20,), "float")))  # fmt: skip
    coll = kernel(4, 84, 0.0, collective=all_reduce(0, 1 << 24, tuple(range(8))))
    nop = Op(2, "nccl:all_reduce", 1, OpCategory.COMMUNICATION, kernels=(coll,))
    return [(copy, nop), (dcopy, nop), (gemm, mm), (ew, add), (coll, nop)]


def _bigger(k: Kernel, o: Op) -> tuple[Kernel, Op]:
    if "bytes" in k.features:
        return replace(k, features={"bytes": int(k.features["bytes"]) * 4}), o
    if k.collective is not None:
        return replace(k, collective=replace(k.collective, bytes=k.collective.bytes * 4)), o
    return k, replace(
        o, inputs=tuple(TensorMeta(tuple(d * 2 for d in t.shape), t.dtype) for t in o.inputs)
    )


@pytest.mark.parametrize("case", range(5))
def test_default_models_are_non_negative_deterministic_and_monotone(case: int):
    reg = default_registry()
    k, o = _cases()[case]
    (m,) = [m for m in reg.models_for(k.family) if m.supports(k, o, V100)][:1]
    a, b = m.predict(k, o, V100), m.predict(k, o, V100)
    assert a == b and a >= 0
    k2, o2 = _bigger(k, o)
    assert m.predict(k2, o2, V100) >= a
    p = reg.predict(k, o, V100)
    assert p is not None and p.provenance.startswith("spec-based")
    assert not m.supports(k, o, None)  # no device spec: no spec-based answer


def test_registry_refuses_a_name_twice():
    reg = default_registry()
    with pytest.raises(ConfigError, match="already registered"):
        reg.register(reg.models_for(KernelFamily.GEMM)[0])


class _FixedComm(CommModel):
    """A test double: every collective takes 1 ms + 1 ns per byte."""

    name = "fixed"
    model_type = "fixed"

    def supports(self, kind: Any, group_size: int, *, gpus_per_node: int | None = None) -> bool:
        return CollectiveKind(kind) is CollectiveKind.ALL_REDUCE

    def predict_many(self, kind: Any, nbytes: Any, group_size: int, *,
                     gpus_per_node: int | None = None) -> tuple[np.ndarray, str]:  # fmt: skip
        return 1e-3 + np.asarray(nbytes, dtype=float) * 1e-9, "calibrated:test"

    def to_dict(self) -> dict[str, Any]:
        return {"model": "fixed"}


def test_a_comm_model_answers_for_collective_kernels_with_its_provenance():
    group = (0, 1)
    ranks = tuple(RankGraph(r, (op(0, kernels=[kernel(0, 84, 5.0, collective=all_reduce(0, 1000, group))]),))
                  for r in group)  # fmt: skip
    w = Workload(ranks=ranks, process_groups={"dp": group})
    reg = ModelRegistry([CommModelKernels(_FixedComm())])
    res = simulate(
        w,
        SimOptions(
            kernels=KernelSource.MODEL, kernel_models=reg, launch_latency_s=0.0, kernel_gap_s=0.0
        ),
    )
    assert res.predicted_step_s == pytest.approx(1e-3 + 1000e-9)
    assert res.program.instances[0].provenance == "calibrated:test"
    measured = simulate(w, SimOptions(launch_latency_s=0.0, kernel_gap_s=0.0))
    assert measured.predicted_step_s == pytest.approx(5.0)


def test_model_mode_falls_back_to_measured_and_counts_it():
    k = Kernel(0, "some_kernel", KernelFamily.OTHER, 7, duration_s=3e-6)
    res = simulate(Workload(ranks=(RankGraph(0, (op(0, kernels=[k]),)),)),
                   SimOptions(kernels=KernelSource.MODEL, launch_latency_s=0.0, kernel_gap_s=0.0))  # fmt: skip
    assert res.predicted_step_s == pytest.approx(3e-6)
    assert res.diagnostics["kernels_model_fallback_measured"] == 1
    assert res.program.ranks[0].k_prov == ["measured (no model)"]


def _instance(
    kind: CollectiveKind, per_rank: list[dict[str, Any]], *, device: str = ""
) -> Workload:
    """One collective instance across ``len(per_rank)`` ranks (fields of each rank's Collective)."""
    group = tuple(range(len(per_rank)))
    ranks = []
    for r, fields in enumerate(per_rank):
        c = Collective(kind=kind, group="g", group_ranks=group, seq=0, **fields)
        ranks.append(
            RankGraph(r, (op(0, kernels=[kernel(0, 84, 1.0, collective=c)]),), device=device)
        )
    return Workload(ranks=tuple(ranks), process_groups={"g": group})


MODEL = SimOptions(kernels=KernelSource.MODEL, launch_latency_s=0.0, kernel_gap_s=0.0)


def test_collectives_are_sized_like_every_comm_model():
    """nccl-tests sizes (trainsim.comm.model_size_bytes): an all-gather by its gathered output,
    an all-to-allv by its busiest device — here rank 2 receives 600 B though nobody sends
    more than 300 B (000 §III-C)."""
    seen: list[float] = []

    class Probe(_FixedComm):
        def supports(self, kind: Any, group_size: int, *, gpus_per_node: int | None = None) -> bool:
            return True

        def predict_many(self, kind: Any, nbytes: Any, group_size: int, *,
                         gpus_per_node: int | None = None) -> tuple[np.ndarray, str]:  # fmt: skip
            seen.append(float(np.asarray(nbytes)[0]))
            return super().predict_many(kind, nbytes, group_size)

    opts = replace(MODEL, kernel_models=ModelRegistry([CommModelKernels(Probe())]))
    simulate(_instance(CollectiveKind.ALL_GATHER, [{"bytes": 1000}] * 4), opts)
    assert set(seen) == {4000.0}
    seen.clear()
    sends = [(0, 0, 300), (0, 0, 300), (0, 0, 0)]
    a2a = _instance(CollectiveKind.ALL_TO_ALLV, [{"bytes": sum(s), "peer_bytes": s} for s in sends])
    res = simulate(a2a, opts)
    assert set(seen) == {600.0}
    assert res.program.instances[0].transfer_s == pytest.approx(1e-3 + 600e-9)
    # the spec-based alpha-beta model sizes the same way: 8x the bytes of one rank's input
    ag = _instance(
        CollectiveKind.ALL_GATHER, [{"bytes": 1 << 20}] * 8, device="Tesla V100-SXM2-32GB"
    )
    t = simulate(ag, MODEL).program.instances[0].transfer_s
    assert V100 is not None and V100.gpu_link_bandwidth_GBps is not None
    assert t == pytest.approx(
        10e-6 + 7 / 8 * 8 * (1 << 20) / (V100.gpu_link_bandwidth_GBps * 1e9 / 2)
    )


def test_model_mode_uses_the_comm_models_of_a_known_system_with_their_provenance():
    ar = _instance(
        CollectiveKind.ALL_REDUCE, [{"bytes": 1 << 24}] * 8, device="NVIDIA A100-SXM4-40GB"
    )
    given = simulate(ar, replace(MODEL, system="dgx-a100"))
    assert given.program.collective_system is not None
    assert given.program.collective_system.source == "given"
    # DGX A100's network is Azure ND A100 v4's (network_twins): the latter's measurements answer
    assert given.program.instances[0].provenance == "calibrated:nccl_tests_allreduce_a100_40gb_azure;twin-system:azure-nd-a100-v4"
    a2a = _instance(CollectiveKind.ALL_TO_ALL, [{"bytes": 1 << 24}] * 8, device="NVIDIA A100-SXM4-40GB")
    assert simulate(a2a, replace(MODEL, system="dgx-a100")).program.instances[0].provenance == "spec-based:dgx-a100"
    # replay resolves a collective as predict does: a reduce-scatter from the measured all-reduce
    rs = _instance(CollectiveKind.REDUCE_SCATTER, [{"bytes": 1 << 24}] * 8, device="NVIDIA A100-SXM4-40GB")
    rs_prov = simulate(rs, replace(MODEL, system="dgx-a100")).program.instances[0].provenance
    assert rs_prov.endswith(";derived-from:all_reduce/2")
    # no system given: the only catalog system built of A100-SXM4-40GB, whose calibrated
    # all-reduce answers first
    guessed = simulate(ar, MODEL)
    cs = guessed.program.collective_system
    assert cs is not None and cs.spec.name == "azure-nd-a100-v4"
    assert cs.source == "guessed from device NVIDIA A100-SXM4-40GB"
    assert guessed.program.instances[0].provenance.startswith("calibrated:")
    # a device no catalog system is built of: the device's own alpha-beta model
    v100 = _instance(
        CollectiveKind.ALL_REDUCE, [{"bytes": 1 << 24}] * 8, device="Tesla V100-SXM2-32GB"
    )
    res = simulate(v100, MODEL)
    assert res.program.collective_system is None
    assert res.program.instances[0].provenance == "spec-based:v100-sxm2-32gb"


def test_a_given_system_of_another_gpu_says_it_is_a_what_if():
    """Review (session 24): a V100 trace replayed with --system dgx-a100 timed its collectives
    on the A100 network without a word; memory-size variants of one GPU stay plain "given"."""
    from trainsim.sim.durations import collective_system

    other = collective_system(["Tesla V100-SXM2-32GB"] * 8, "dgx-a100")
    assert other is not None and "the trace ran on v100-sxm2-32gb" in other.source and "what-if" in other.source
    same = collective_system(["NVIDIA A100-SXM4-40GB"], "dgx-a100")
    assert same is not None and same.source == "given"
