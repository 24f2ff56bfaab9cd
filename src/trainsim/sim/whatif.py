"""What-if passes: pure functions Workload → new Workload, to be re-simulated.

A pass never rewrites a measurement: it sets the targeted kernels' ``predicted_s`` to their
current duration (prediction, else measurement) times the factor, with provenance
``what-if ×F of <previous provenance>``. The simulator uses such a prediction in every kernel
mode — but for a kernel whose what-ifs started from its measured time, ``KernelSource.MODEL``
scales the model's time by the factor instead (``program._duration``: the mode's own
baseline, so a factor of 1 is the plain replay) — while everything it infers from the trace
(which waits the measurement contradicts, launch latencies) keeps seeing the real measured
times. For measured collectives the transfer time is the last-arriving member's duration,
which scales exactly by the factor; waiting for peers is re-simulated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from trainsim.errors import ConfigError
from trainsim.ir.graph import Kernel, RankGraph, Workload
from trainsim.ir.kinds import KernelFamily


def _check(factor: float, what: str) -> None:
    if not factor > 0.0:
        raise ConfigError(f"{what} must be a positive factor, got {factor!r}")


WHATIF = "what-if"
# The resize passes' (trainsim.sim.resize) provenance prefix; here, with this one, so that the
# simulator reads both without importing the resize and its kernel models.
RESIZE = "resize"


def _scaled(k: Kernel, factor: float) -> Kernel:
    base = k.predicted_s if k.predicted_s is not None else k.duration_s
    if base is None:
        return k
    prev = k.provenance or ("measured" if k.duration_s is not None else "predicted")
    return replace(k, predicted_s=base * factor, provenance=f"{WHATIF} ×{factor:g} of {prev}")


def _map_kernels(rg: RankGraph, pick: Callable[[Kernel], bool], factor: float) -> RankGraph:
    ops = tuple(
        replace(op, kernels=tuple(_scaled(k, factor) if pick(k) else k for k in op.kernels))
        if any(pick(k) for k in op.kernels) else op
        for op in rg.ops
    )  # fmt: skip
    return replace(rg, ops=ops)


def scale_family(w: Workload, family: KernelFamily, factor: float) -> Workload:
    """Kernels of one family run ``factor`` × as long (0.5: twice as fast), on every rank."""
    _check(factor, f"the {family.value} scale factor")
    return replace(
        w, ranks=tuple(_map_kernels(r, lambda k: k.family is family, factor) for r in w.ranks)
    )


def scale_collectives(w: Workload, factor: float) -> Workload:
    """Every collective transfer takes ``factor`` × as long (a slower or faster network)."""
    _check(factor, "network factor")
    return replace(
        w, ranks=tuple(_map_kernels(r, lambda k: k.collective is not None, factor) for r in w.ranks)
    )


def faster_network(w: Workload, speedup: float) -> Workload:
    """A network ``speedup`` × faster (bandwidth and latency alike): collectives / speedup."""
    _check(speedup, "network speedup")
    return scale_collectives(w, 1.0 / speedup)


def straggler(w: Workload, rank: int, factor: float) -> Workload:
    """One rank's compute and memory kernels run ``factor`` × as long (a slow GPU).

    When that rank's graph stands for several identical ranks (``represents`` > 1), one copy
    is split off as the straggler, under the id of a represented rank not already present.
    """
    _check(factor, "straggler factor")
    target = w.rank(rank)
    pick = lambda k: not k.family.is_communication  # noqa: E731
    if target.represents == 1:
        return replace(
            w, ranks=tuple(_map_kernels(r, pick, factor) if r.rank == rank else r for r in w.ranks)
        )
    present = {r.rank for r in w.ranks}
    members = sorted(
        {m for k in target.kernels() if k.collective for m in k.collective.group_ranks} - present
    )
    new_id = members[0] if members else max(present) + 1
    slow = replace(_map_kernels(target, pick, factor), rank=new_id, represents=1)
    rest = replace(target, represents=target.represents - 1)
    ranks = (*(rest if r.rank == rank else r for r in w.ranks), slow)
    return replace(w, ranks=ranks)
