"""Collective instances across ranks: membership checks and transfer times (see ``program.py``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainsim.errors import SimulationError
from trainsim.ir.graph import Collective, Kernel, Op, Workload
from trainsim.ir.kinds import CollectiveKind
from trainsim.sim.options import HostMode, KernelSource, SimOptions

if TYPE_CHECKING:
    from trainsim.sim.program import RankProgram

# (kernel, its op, its rank, the instance's members rank → Collective) → (seconds, provenance)
DurationFn = Callable[
    [Kernel, Op, "RankProgram", Mapping[int, Collective] | None], tuple[float, str]
]


# the provenance of a kernel `--kernels model` kept at its measured duration (no model answered)
NO_MODEL = "measured (no model)"


@dataclass(slots=True)
class Instance:
    """One collective instance across ranks."""

    group: str
    seq: int
    kind: CollectiveKind
    members: list[tuple[int, int]]  # (rank program index, kernel index)
    transfer_s: float = 0.0  # from the latest member's start to every member's end
    provenance: str = ""
    # gloo: each member's measured end minus the last-arriving member's (None: members end together)
    tails: list[float] | None = None


def build_instances(
    w: Workload, ranks: list[RankProgram], opts: SimOptions, duration: DurationFn
) -> list[Instance]:
    by_key: dict[tuple[str, int], Instance] = {}
    for ri, rp in enumerate(ranks):
        for ki, k in enumerate(rp.kernels):
            c = k.collective
            if c is None:
                continue
            inst = by_key.get((c.group, c.seq))
            if inst is None:
                inst = by_key[(c.group, c.seq)] = Instance(c.group, c.seq, c.kind, [])
            if inst.members and inst.members[-1][0] == ri:
                raise SimulationError(
                    f"rank {rp.graph.rank} issues collective {c.kind.value} of group {c.group!r} "
                    f"seq {c.seq} twice (kernels {rp.kernels[inst.members[-1][1]].id} and {k.id}); "
                    "sequence numbers must be unique per group and rank"
                )
            inst.members.append((ri, ki))
    present = {rp.graph.rank for rp in ranks}
    expected_of: dict[tuple[str, int], frozenset[int]] = {}
    instances = list(by_key.values())
    for n, inst in enumerate(instances):
        ri0, ki0 = inst.members[0]
        c0 = ranks[ri0].kernels[ki0].collective
        assert c0 is not None
        ck = (inst.group, id(c0.group_ranks))
        expected = expected_of.get(ck)
        if expected is None:
            group = c0.group_ranks or tuple(w.process_groups.get(inst.group, ())) or tuple(present)
            expected = expected_of[ck] = frozenset(r for r in group if r in present)
        have = {ranks[ri].graph.rank for ri, _ in inst.members}
        missing = sorted(expected - have)
        if missing:
            raise SimulationError(
                f"collective {inst.kind.value} of group {inst.group!r} seq {inst.seq}: issued by "
                f"ranks {sorted(have)} but never by member rank(s) {missing}; the traces do not "
                "belong to one step of one job, or a rank's trace is truncated"
            )
        durs = []
        members = None
        if opts.kernels is KernelSource.MODEL:  # models size the instance as a whole
            members = {
                ranks[ri].graph.rank: ranks[ri].kernels[ki].collective for ri, ki in inst.members
            }
        for ri, ki in inst.members:
            rp = ranks[ri]
            rp.k_inst[ki] = n
            d = duration(rp.kernels[ki], rp.ops[rp.call_op[rp.k_call[ki]]], rp, members)  # type: ignore[arg-type]
            rp.k_dur[ki], rp.k_prov[ki] = d
            durs.append(d)
        _transfer(inst, [ranks[ri].kernels[ki] for ri, ki in inst.members], durs, opts)
    return instances


def _transfer(
    inst: Instance, members: list[Kernel], durs: list[tuple[float, str]], opts: SimOptions
) -> None:
    """The transfer time of an instance: all members end at the latest start plus it.

    Models: the largest member prediction (members a model did not size are left out: their
    measured durations count waiting); an instance no model sized is read as measured. Measured: a member's duration includes waiting for
    its peers, so the transfer is the duration of the member that arrived last (latest measured
    start) — for NCCL, whose members end together, the shortest duration; without measured
    starts, the shortest duration. A what-if pass scales it through that member's duration.
    gloo's members end apart: in trace mode each keeps its measured end's offset from that
    member's (``tails``), never before the last arrival.
    """
    modelled = [d for d in durs if not d[1].endswith(NO_MODEL)]  # "what-if ×F of measured (no model)" too
    if opts.kernels is KernelSource.MODEL and modelled:  # a kept measured duration counts waiting
        inst.transfer_s, inst.provenance = max(modelled)
        return
    # measured durations (models had none for this instance): a member's includes its wait
    starts = [k.start_s for k in members]
    if any(s is None for s in starts):
        inst.transfer_s, inst.provenance = min(durs)
        return
    last = max(range(len(members)), key=lambda i: starts[i])  # type: ignore[arg-type,return-value]
    inst.transfer_s, inst.provenance = durs[last]
    if opts.overheads is HostMode.TRACE and all(k.on_host and k.duration_s is not None for k in members):
        # gloo's members do not end together (NCCL's do): on a 2-rank CPU capture one rank's
        # all_reduce ended 16 ms before its peer's. With the trace's own host gaps (the ranks
        # arrive as measured) each keeps its measured end relative to the last-arriving
        # member's, so trace mode reproduces every rank, not only the step. Other modes change
        # the order of arrival, which a rank's measured offset does not follow: they keep the
        # common end (stats mode on three 2-rank captures: per-rank errors no better with it).
        # From the measured durations: a what-if's scaled ones would scale an early member's wait
        # for its peer into its tail (a 10x faster network made a rank 27 % slower).
        ends = [k.start_s + k.duration_s for k in members]  # type: ignore[operator]
        inst.tails = [e - ends[last] for e in ends]
