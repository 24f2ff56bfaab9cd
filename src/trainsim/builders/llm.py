"""Model-driven LLM prediction: stage costs, the pipeline workload in IR, simulation, closed forms.

:func:`stage_costs` times one micro-batch of every pipeline stage — its layers' operators
(:mod:`.costs`, kernel models), their synchronous TP/CP/EP collectives (:mod:`.llm_comm`),
recomputation — plus the stage's once-per-iteration work: gradient reduction, optimizer step,
ZeRO gathers.

:func:`build_workload` turns them into the IR: one :class:`~trainsim.ir.graph.RankGraph` per
pipeline stage (each standing for its ``tp × cp × dp`` identical ranks), ops in the order the
schedule issues them (:mod:`.schedules`), activations and gradients as send/recv pairs between
stages, the data-parallel reduction on a communication stream after the stage's last backward,
then the optimizer. Megatron's point-to-point calls are synchronous (the compute after a send
waits for it); each direction to each neighbour has its own stream (NCCL orders each pair's
operations, not unrelated ones). The simulator (:func:`trainsim.sim.simulate`) then gives the
iteration time, the critical path and a timeline.

Closed forms reported beside it: 001 Eq. 7 (1F1B + DP) and 003 Eq. 4 (pipeline latency).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from trainsim.builders.costs import HOST, HostModel, LayerCoster, OpCost, OpCoster, flow_shop_s
from trainsim.builders.llm_comm import CommCost, PlanComm
from trainsim.builders.plan import Plan
from trainsim.builders.schedules import Action, schedule
from trainsim.builders.spec import ModelSpec
from trainsim.hardware import SystemSpec, get_device, get_system
from trainsim.ir.graph import Collective, Kernel, Op, RankGraph, Workload
from trainsim.ir.kinds import CollectiveKind, KernelFamily, OpCategory

COMPUTE, DP_STREAM = 7, 20
# per-direction p2p streams: send to next / send to previous / receive from previous / from next
SEND_NEXT, SEND_PREV, RECV_PREV, RECV_NEXT = 30, 31, 32, 33


@dataclass(slots=True)
class StageCost:
    """One pipeline stage (one GPU of it): per micro-batch and per iteration costs, seconds."""

    stage: int
    layers: int
    params: float  # parameters one GPU of this stage holds (before ZeRO sharding)
    fwd_s: float = 0.0  # one micro-batch forward, compute + synchronous TP/CP/EP comm
    bwd_s: float = 0.0  # one micro-batch backward, incl. recomputation
    recompute_s: float = 0.0  # the part of bwd_s that re-runs forward work
    tp_comm_fwd_s: float = 0.0
    tp_comm_bwd_s: float = 0.0
    tp_comm_recompute_s: float = 0.0  # forward collectives re-run by full recomputation
    p2p_s: float = 0.0  # one activation transfer to the next stage
    optimizer_s: float = 0.0
    dp_comm: list[CommCost] = field(default_factory=list)
    embedding_comm: CommCost | None = None
    flops_fwd: float = 0.0  # model FLOPs of one micro-batch (no recompute), one GPU
    flops_bwd: float = 0.0
    layer_ops: list[OpCost] = field(default_factory=list)  # one layer, one micro-batch (× layers)
    ops: list[OpCost] = field(default_factory=list)  # the stage's other operators, one micro-batch
    comm: list[CommCost] = field(default_factory=list)  # one micro-batch, TP/CP/EP

    @property
    def dp_comm_s(self) -> float:
        return sum(c.seconds for c in self.dp_comm) + (self.embedding_comm.seconds if self.embedding_comm else 0.0)


def _sum(ops: Iterable[OpCost]) -> float:
    return sum(o.seconds for o in ops)


def stage_costs(model: ModelSpec, plan: Plan, system: SystemSpec, coster: OpCoster | None = None,
                host: HostModel = HOST) -> list[StageCost]:  # fmt: skip
    from trainsim.builders.memory import stage_layers, stage_params_split

    coster = coster or OpCoster(get_device(system.device))
    lc = LayerCoster(model, plan, coster)
    comm = PlanComm(model, plan, system)
    lf, lb = lc.layer("fwd"), lc.layer("bwd")
    tpf, tpb = comm.tp_layer("fwd"), comm.tp_layer("bwd")
    epf, epb = comm.ep_layer("fwd"), comm.ep_layer("bwd")
    cpf, cpb = comm.cp_layer("fwd"), comm.cp_layer("bwd")

    def exposed_cp(c: CommCost | None, ops: list[OpCost]) -> float:
        attn = sum(o.seconds for o in ops if o.category == "attention")
        return max(0.0, c.seconds - attn) if c else 0.0

    layer_comm_f = sum(c.seconds for c in tpf + epf) + exposed_cp(cpf, lf)
    layer_comm_b = sum(c.seconds for c in tpb + epb) + exposed_cp(cpb, lb)
    if plan.recompute == "full":
        re_ops, re_comm = lf, layer_comm_f
    elif plan.recompute == "selective":
        re_ops, re_comm = [o for o in lf if o.category == "attention"], 0.0
    else:
        re_ops, re_comm = [], 0.0
    # the layer's dispatch time spread evenly over its operators (HostModel's per-layer counts)
    cpu_f, cpu_b = host.layer_s("fwd") / len(lf), host.layer_s("bwd") / len(lb)
    cpu_sel = cpu_f
    out = []
    layers = stage_layers(model, plan)
    per_n: dict[int, tuple[float, float, float]] = {}  # stages of equal depth share their passes
    tp_f, tp_b = sum(c.seconds for c in tpf), sum(c.seconds for c in tpb)
    fl_f, fl_b = sum(o.flops for o in lf), sum(o.flops for o in lb)
    shard = plan.dp * plan.cp if plan.zero >= 1 else 1
    layer_comm = [*tpf, *tpb, *epf, *epb, *([cpf] if cpf else []), *([cpb] if cpb else [])]
    z3 = comm.zero3_layer(model.layer_params() / plan.tp)
    if z3 is not None:
        layer_comm = [*layer_comm, *z3]
    for s, n in enumerate(layers):
        first, last = s == 0, s == plan.pp - 1
        extra_f = (lc.embedding("fwd") if first else []) + (lc.head("fwd") if last else [])
        extra_b = (lc.embedding("bwd") if first else []) + (lc.head("bwd") if last else [])
        passes = per_n.get(n)
        if passes is None:
            # each pass is a CPU-dispatch / GPU flow shop (small models are launch-bound)
            f = flow_shop_s(lf, cpu_f, n) + n * layer_comm_f
            r = (flow_shop_s(re_ops, cpu_f if re_ops is lf else cpu_sel, n) + n * re_comm) if re_ops else 0.0
            b = flow_shop_s(lb, cpu_b, n) + n * layer_comm_b
            if z3 is not None:  # prefetched weight gathers / gradient scatters bound each pass
                ag, rs = z3[0].seconds, z3[1].seconds
                f, b = max(f, n * ag), max(b, n * (ag + rs))
                r = max(r, n * ag) if plan.recompute == "full" else r
            passes = per_n[n] = (f, r, b)
        f, recompute, b = passes
        fwd = f + (flow_shop_s(extra_f, [host.extra_s(o) for o in extra_f]) if extra_f else 0.0)
        bwd = b + (flow_shop_s(extra_b, [host.extra_s(o) for o in extra_b]) if extra_b else 0.0) + recompute
        dense, expert = stage_params_split(model, plan, s)
        params = dense + expert
        st = StageCost(s, n, params, fwd, bwd, recompute)
        st.tp_comm_fwd_s = n * tp_f
        st.tp_comm_bwd_s = n * tp_b
        st.tp_comm_recompute_s = n * tp_f if plan.recompute == "full" else 0.0
        bp = comm.pp_p2p(s) if plan.pp > 1 else None
        st.p2p_s = bp.seconds if bp else 0.0  # towards the next stage
        st.optimizer_s = lc.optimizer(params / shard, n).seconds
        st.dp_comm = comm.dp_grads(params, expert)
        st.embedding_comm = comm.embedding_grads() if (first or last) else None
        st.flops_fwd = n * fl_f + sum(o.flops for o in extra_f)
        st.flops_bwd = n * fl_b + sum(o.flops for o in extra_b)
        st.layer_ops = lf + lb
        st.ops = [*extra_f, *extra_b]
        st.comm = layer_comm
        out.append(st)
    return out


# --- closed forms ------------------------------------------------------------------------------


def closed_form_001(stages: list[StageCost], plan: Plan) -> float:
    """001 §III-D Eq. 7: ``(M - 1 + S)(max fwd + max bwd) + first-stage DP all-reduce + max
    update``, update = optimizer + ZeRO all-gather; P2P time is charged to the sender stages
    (added to each stage's forward and backward)."""
    m, s = plan.grad_accum, plan.pp
    fwd = max(st.fwd_s + (st.p2p_s if st.stage < s - 1 else 0.0) for st in stages)
    bwd = max(st.bwd_s + (stages[st.stage - 1].p2p_s if st.stage > 0 else 0.0) for st in stages)
    first = stages[0]
    sync = sum(c.seconds for c in first.dp_comm if c.kind in ("all_reduce", "reduce_scatter"))
    update = max(st.optimizer_s + sum(c.seconds for c in st.dp_comm if c.kind == "all_gather") for st in stages)
    return (m - 1 + s) * (fwd + bwd) + sync + update


def closed_form_003(stages: list[StageCost], plan: Plan) -> float:
    """003 §V Eq. 4: ``T = Σ_i t_i + (B - 1) max_j t_j`` with ``t_i`` a stage's forward and
    backward of one micro-batch (inter-stage communication ignored, as the paper does), plus
    the once-per-iteration gradient reduction and update of the slowest stage."""
    t = [st.fwd_s + st.bwd_s for st in stages]
    tail = max(st.dp_comm_s + st.optimizer_s for st in stages)
    return sum(t) + (plan.grad_accum - 1) * max(t) + tail


# --- the workload --------------------------------------------------------------------------------


class _Ids:
    def __init__(self) -> None:
        self.op = 0
        self.kernel = 0

    def next_op(self) -> int:
        self.op += 1
        return self.op

    def next_kernel(self) -> int:
        self.kernel += 1
        return self.kernel


def build_workload(model: ModelSpec, plan: Plan, system: SystemSpec, stages: list[StageCost]) -> Workload:
    """The iteration as IR: one rank graph per pipeline stage (see the module docstring)."""
    chunks = plan.vpp if plan.schedule == "interleaved" else 1
    represents = plan.tp * plan.cp * plan.dp
    sched = schedule(plan.schedule, plan.pp, plan.grad_accum, chunks)
    comm = PlanComm(model, plan, system)
    bcost = [comm.pp_p2p(b) for b in range(plan.pp)] if plan.pp > 1 else []
    graphs = []
    for s, st in enumerate(stages):
        ids = _Ids()
        ops: list[Op] = []
        last_send: int | None = None

        def add(name: str, kernel: Kernel | None, deps: list[int], cat: OpCategory) -> int:
            oid = ids.next_op()
            ops.append(Op(id=oid, name=name, thread=1, category=cat,
                          kernels=(kernel,) if kernel else (), deps=tuple(d for d in deps if d)))  # fmt: skip
            return oid

        def compute(name: str, seconds: float) -> Kernel:
            return Kernel(ids.next_kernel(), name, KernelFamily.GEMM, COMPUTE, predicted_s=seconds,
                          provenance="builder")  # fmt: skip

        def p2p(kind: CollectiveKind, stream: int, group: str, seq: int, peer: int, boundary: int) -> Kernel:
            c_ = bcost[boundary % plan.pp]
            seconds, prov = (c_.seconds, c_.provenance) if c_ else (0.0, "none")
            c = Collective(kind=kind, group=group, group_ranks=tuple(sorted((s, peer))),
                           bytes=p2p_bytes, seq=seq, peer=peer)  # fmt: skip
            return Kernel(ids.next_kernel(), f"{kind.value}:{group}", kind.family, stream,
                          collective=c, predicted_s=seconds, provenance=prov)  # fmt: skip

        last_compute: int | None = None
        p2p_bytes = int(bcost[0].bytes) if bcost and bcost[0] else 0
        for act in sched[s]:
            v = act.chunk * plan.pp + s  # virtual stage
            nv = plan.pp * chunks
            share = 1.0 / chunks
            deps: list[int] = []
            if act.kind == "F":
                if v > 0:
                    prev_rank = (v - 1) % plan.pp
                    r = add(f"recv_act mb{act.mb} v{v}", p2p(CollectiveKind.RECV, RECV_PREV, f"act{v - 1}", act.mb,
                            prev_rank, v - 1), [], OpCategory.COMMUNICATION)  # fmt: skip
                    deps.append(r)
                if last_send:
                    deps.append(last_send)
                last_compute = add(f"forward mb{act.mb} v{v}", compute(f"fwd mb{act.mb} v{v}", st.fwd_s * share),
                                   deps + ([last_compute] if last_compute else []), OpCategory.COMPUTE)  # fmt: skip
                if v < nv - 1:
                    last_send = add(f"send_act mb{act.mb} v{v}", p2p(CollectiveKind.SEND, SEND_NEXT, f"act{v}", act.mb,
                                    (v + 1) % plan.pp, v), [last_compute], OpCategory.COMMUNICATION)  # fmt: skip
            else:
                if v < nv - 1:
                    r = add(f"recv_grad mb{act.mb} v{v}", p2p(CollectiveKind.RECV, RECV_NEXT, f"grad{v + 1}", act.mb,
                            (v + 1) % plan.pp, v), [], OpCategory.COMMUNICATION)  # fmt: skip
                    deps.append(r)
                if last_send:
                    deps.append(last_send)
                last_compute = add(f"backward mb{act.mb} v{v}", compute(f"bwd mb{act.mb} v{v}", st.bwd_s * share),
                                   deps + ([last_compute] if last_compute else []), OpCategory.COMPUTE)  # fmt: skip
                if v > 0:
                    last_send = add(f"send_grad mb{act.mb} v{v}", p2p(CollectiveKind.SEND, SEND_PREV, f"grad{v}", act.mb,
                                    (v - 1) % plan.pp, v - 1), [last_compute], OpCategory.COMMUNICATION)  # fmt: skip
        # once per iteration: gradient reduction (comm stream), tied-embedding sync, update
        tail = [last_compute] + ([last_send] if last_send else [])
        reduce_dep = [d for d in tail if d]
        for i, c in enumerate(x for x in st.dp_comm if x.kind != "all_gather"):
            k = Kernel(ids.next_kernel(), c.name, CollectiveKind(c.kind).family, DP_STREAM,
                       collective=Collective(kind=CollectiveKind(c.kind), group=f"dp{s}", group_ranks=(s,),
                                             bytes=int(c.bytes), seq=i),
                       predicted_s=c.seconds, provenance=c.provenance)  # fmt: skip
            reduce_dep = [add(c.name, k, reduce_dep, OpCategory.COMMUNICATION)]
        if st.embedding_comm is not None:
            c = st.embedding_comm
            k = Kernel(ids.next_kernel(), c.name, KernelFamily.NCCL_ALL_REDUCE, DP_STREAM,
                       collective=Collective(kind=CollectiveKind.ALL_REDUCE, group="embedding",
                                             group_ranks=(0, plan.pp - 1), bytes=int(c.bytes), seq=0),
                       predicted_s=c.seconds, provenance=c.provenance)  # fmt: skip
            reduce_dep = [add(c.name, k, reduce_dep, OpCategory.COMMUNICATION)]
        opt = add("optimizer.step", Kernel(ids.next_kernel(), "optimizer", KernelFamily.OPTIMIZER, COMPUTE,
                  predicted_s=st.optimizer_s, provenance="builder"), reduce_dep, OpCategory.COMPUTE)  # fmt: skip
        for i, c in enumerate(x for x in st.dp_comm if x.kind == "all_gather"):
            k = Kernel(ids.next_kernel(), c.name, KernelFamily.NCCL_ALL_GATHER, COMPUTE,
                       collective=Collective(kind=CollectiveKind.ALL_GATHER, group=f"dp{s}-ag", group_ranks=(s,),
                                             bytes=int(c.bytes), seq=i),
                       predicted_s=c.seconds, provenance=c.provenance)  # fmt: skip
            opt = add(c.name, k, [opt], OpCategory.COMMUNICATION)
        graphs.append(RankGraph(rank=s, ops=tuple(ops), streams=(COMPUTE, DP_STREAM, SEND_NEXT, SEND_PREV, RECV_PREV, RECV_NEXT),
                                represents=represents, device=system.device,
                                metadata={"role": f"pipeline stage {s}", "layers": st.layers}))  # fmt: skip
    groups = {f"dp{s}": (s,) for s in range(plan.pp)}
    return Workload(ranks=tuple(graphs), process_groups=groups,
                    metadata={"source": "trainsim.builders.llm", "model": model.name, "plan": plan.label(),
                              "system": system.name})  # fmt: skip


def resolve_system(system: SystemSpec | str) -> SystemSpec:
    return get_system(system) if isinstance(system, str) else system


__all__ = ["Action", "StageCost", "build_workload", "closed_form_001", "closed_form_003", "stage_costs"]
