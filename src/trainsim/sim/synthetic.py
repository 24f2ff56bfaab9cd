"""Small builders of synthetic workloads, for tests, benchmarks and examples.

``training_step`` makes a data-parallel-style step without any trace: a forward pass of
compute kernels, a backward pass whose gradient buckets are all-reduced on a communication
stream (event waits both ways), and an optimizer step that waits for the last all-reduce.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from trainsim.ir.graph import Collective, Kernel, Op, RankGraph, SyncPoint, Workload
from trainsim.ir.kinds import CollectiveKind, KernelFamily, OpCategory, SyncKind

COMPUTE_STREAM = 7
COMM_STREAM = 84


def kernel(kid: int, stream: int, duration_s: float, *, family: KernelFamily = KernelFamily.ELEMENTWISE,
           collective: Collective | None = None, name: str = "") -> Kernel:  # fmt: skip
    fam = collective.kind.family if collective is not None else family
    return Kernel(id=kid, name=name or f"{fam.value}_{kid}", family=fam, stream=stream,
                  duration_s=duration_s, collective=collective, provenance="synthetic")  # fmt: skip


def op(oid: int, *, kernels: Sequence[Kernel] = (), syncs: Sequence[SyncPoint] = (), deps: Sequence[int] = (),
       thread: int = 1, name: str = "") -> Op:  # fmt: skip
    if any(k.collective is not None for k in kernels):
        cat = OpCategory.COMMUNICATION
    elif kernels:
        cat = OpCategory.COMPUTE
    elif syncs:
        cat = OpCategory.SYNC
    else:
        cat = OpCategory.CPU_ONLY
    return Op(id=oid, name=name or f"op{oid}", thread=thread, category=cat, kernels=tuple(kernels),
              syncs=tuple(syncs), deps=tuple(deps))  # fmt: skip


def all_reduce(seq: int, nbytes: int, group: tuple[int, ...], name: str = "dp") -> Collective:
    return Collective(
        kind=CollectiveKind.ALL_REDUCE, group=name, group_ranks=group, bytes=nbytes, seq=seq
    )


def training_step(
    rank: int,
    *,
    group: tuple[int, ...],
    layers: int = 16,
    buckets: int = 4,
    seed: int = 0,
    represents: int = 1,
    slowdown: float = 1.0,
) -> RankGraph:
    """One rank of a data-parallel step (see the module docstring); ``seed`` varies durations,
    ``slowdown`` scales every compute kernel (a slower rank role)."""
    rng = random.Random(seed)
    ops: list[Op] = []
    kid = 0

    def compute(name: str, n: int = 1) -> None:
        nonlocal kid
        ks = []
        for _ in range(n):
            ks.append(
                kernel(
                    kid,
                    COMPUTE_STREAM,
                    slowdown * rng.uniform(5e-6, 200e-6),
                    family=KernelFamily.GEMM,
                )
            )
            kid += 1
        ops.append(op(len(ops), kernels=ks, name=name))

    for i in range(layers):
        compute(f"forward_{i}", 2)
    per_bucket = max(1, layers // buckets)
    seq = 0
    for i in reversed(range(layers)):
        compute(f"backward_{i}", 3)
        if i % per_bucket == 0:
            last_compute = kid - 1
            coll = all_reduce(seq, 1 << 22, group)
            ops.append(op(len(ops), name="all_reduce", kernels=[kernel(kid, COMM_STREAM, 50e-6, collective=coll)],
                          syncs=[SyncPoint(SyncKind.STREAM_WAIT_EVENT, stream=COMM_STREAM,
                                           wait_on_stream=COMPUTE_STREAM, wait_on_kernel=last_compute)]))  # fmt: skip
            kid += 1
            seq += 1
    ops.append(op(len(ops), name="wait_gradients", syncs=[SyncPoint(
        SyncKind.STREAM_WAIT_EVENT, stream=COMPUTE_STREAM, wait_on_stream=COMM_STREAM, wait_on_kernel=kid - 1)]))  # fmt: skip
    for i in range(layers):
        compute(f"optimizer_{i}")
    ops.append(
        op(
            len(ops),
            name="aten::item",
            syncs=[SyncPoint(SyncKind.STREAM_SYNC, stream=COMPUTE_STREAM)],
        )
    )
    return RankGraph(
        rank=rank, ops=tuple(ops), streams=(COMPUTE_STREAM, COMM_STREAM), represents=represents
    )


def data_parallel(
    roles: int, *, world: int | None = None, layers: int = 16, seed: int = 0
) -> Workload:
    """``roles`` distinct rank graphs standing for ``world`` ranks (default: one each)."""
    world = world or roles
    if world % roles:
        raise ValueError(f"{world} ranks cannot be split into {roles} equal roles")
    group = tuple(range(world))
    ranks = tuple(
        training_step(
            r,
            group=group,
            layers=layers,
            seed=seed + r,
            represents=world // roles,
            slowdown=1.0 + 0.05 * r,
        )  # fmt: skip
        for r in range(roles)
    )
    return Workload(ranks=ranks, process_groups={"dp": group}, metadata={"source": "synthetic"})
