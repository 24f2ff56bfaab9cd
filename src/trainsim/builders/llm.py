"""Model-driven LLM prediction: stage costs, the pipeline workload in IR, simulation, closed forms.

:func:`stage_costs` times one micro-batch of every pipeline stage — its layers' operators
(:mod:`.costs`, kernel models), their TP/CP/EP collectives (:mod:`.llm_comm`; TP's in the
CPU-dispatch flow shop, CP's exposed ring and EP's all-to-alls added to the pass),
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

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from itertools import chain
from operator import attrgetter
from typing import NamedTuple, cast

import numpy as np

from trainsim.builders.contention import factor as contention_factor
from trainsim.builders.contention import hidden_cost_s
from trainsim.builders.costs import (
    HOST,
    HostModel,
    LayerCoster,
    OpCost,
    OpCoster,
    flow_shop_parts,
    flow_shop_repeat,
    flow_shop_s,
)
from trainsim.builders.eager import expert_loop_host
from trainsim.builders.llm_comm import CommCost, CPWindow, PlanComm
from trainsim.builders.plan import Plan
from trainsim.builders.schedules import Action, schedule, schedule_arrays
from trainsim.builders.spec import ModelSpec
from trainsim.errors import ConfigError
from trainsim.gcpause import gc_paused
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
    fwd_s: float = 0.0  # one micro-batch forward: compute, dispatch, TP/CP/EP comm
    bwd_s: float = 0.0  # one micro-batch backward, incl. recomputation
    recompute_s: float = 0.0  # the part of bwd_s that re-runs forward work
    # what the TP collectives add to each pass (their time the CPU's dispatch does not hide,
    # and their own dispatch): fwd_s less the same pass without them
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
    zero3_exposed_fwd_s: float = 0.0  # ZeRO-3 gathers/scatters compute cannot hide, per micro-batch
    zero3_exposed_bwd_s: float = 0.0
    # per micro-batch, (forward, backward, recompute): expert all-to-alls (added to the passes),
    # and what the context-parallel ring adds to them (the part its attention does not hide)
    ep_comm_s: tuple[float, float, float] = (0.0, 0.0, 0.0)
    cp_comm_s: tuple[float, float, float] = (0.0, 0.0, 0.0)
    # the part of fwd_s / bwd_s outside the transformer layers: the first stage's embedding, the
    # last stage's final norm, head, loss and MTP depths. The interleaved schedule runs it in
    # the first / last model chunk only (Megatron's first and last virtual stages hold them)
    end_fwd_s: float = 0.0
    end_bwd_s: float = 0.0

    def chunk_seconds(self, chunks: int, pp: int) -> tuple[list[float], list[float]]:
        """One micro-batch's forward and backward of each of this stage's ``chunks`` model
        chunks: the layers split evenly, the end part (:attr:`end_fwd_s`) in the chunk that
        holds it (stage 0's first, stage ``pp - 1``'s last); one chunk: the whole pass."""
        if chunks == 1:
            return [self.fwd_s], [self.bwd_s]
        f = [(self.fwd_s - self.end_fwd_s) / chunks] * chunks
        b = [(self.bwd_s - self.end_bwd_s) / chunks] * chunks
        own = 0 if self.stage == 0 else chunks - 1 if self.stage == pp - 1 else None
        if own is not None:
            f[own] += self.end_fwd_s
            b[own] += self.end_bwd_s
        return f, b

    @property
    def dp_comm_s(self) -> float:
        return sum(c.seconds for c in self.dp_comm) + (
            self.embedding_comm.seconds if self.embedding_comm else 0.0
        )


_STAGE_FIELDS = attrgetter(*(f.name for f in fields(StageCost)))  # in __init__'s order


def _sum(ops: Iterable[OpCost]) -> float:
    return sum(o.seconds for o in ops)


UNCOUNTED_DISPATCH = frozenset({"hidden_dropout", "attention_dropout"})  # dispatched within HostModel's per-layer counts
# the operators this builder gives the layer HostModel's per-layer dispatch counts were taken from
# (HF GPT-2's, with FlashAttention: two norms, QKV, the attention core, the output projection, two
# residual adds, up, activation, down): one operator's share of a layer pass's dispatch where an
# operator runs outside its pass (the selective recomputation's attention core)
TRACED_LAYER_OPS = 10


def _with_ring(ops: list[OpCost], ring: CommCost | None, stretch: float = 1.0,
               window: CPWindow | None = None) -> list[OpCost]:
    """A layer pass's operators with the attention core lasting as long as the context-parallel
    ring ``ring`` when the ring is the longer (its K/V exchange overlaps their block
    computations): the wait goes on the core's first operator, so that the pass's flow shop is
    never shorter for longer operators or a longer ring; with no attention operator to overlap,
    the ring ends the pass. The ring's overlap stretches the attention it hides behind by the
    contention factor ``stretch`` (:func:`~trainsim.builders.contention.hidden_cost_s`): the core lasts
    ``max(attn + (stretch - 1)·min(ring, attn), ring)``. A sliding-window model's ``window``
    (:meth:`PlanComm.cp_window_layer`): its windowed layers (share φ) run TransformerEngine's
    KV all-gather CP instead, their attention (``rank_share`` of a full layer's) plus the
    exposed collectives; the full layers the ring as above; the core is the layers' average,
    as the attention operators are (costed at ``work_fraction`` of a full layer's). With
    ``Plan.cp_comm`` all_gather or a2a there is no ring: every layer is such a layer
    (φ = 1), its collectives added to the core."""
    if ring is None and window is None:
        return ops
    attn = sum(o.seconds for o in ops if o.category == "attention")
    if window is not None:
        phi = window.layers
        full = attn / window.work_fraction  # one full layer's attention, the ring beside it
        ringed = max(full + hidden_cost_s(ring.seconds, full, stretch), ring.seconds) if ring and phi < 1.0 else 0.0
        core = phi * (window.rank_share * full + window.exposed_s) + (1.0 - phi) * ringed
    elif ring is not None:
        core = max(attn + hidden_cost_s(ring.seconds, attn, stretch), ring.seconds)
    else:  # pragma: no cover - returned above
        return ops
    if core <= attn:
        return ops
    if attn <= 0.0:  # pragma: no cover - every layer has an attention core
        return [*ops[:-1], replace(ops[-1], seconds=ops[-1].seconds + (ring.seconds if ring else core))]
    i = next(j for j, o in enumerate(ops) if o.category == "attention")
    return [*ops[:i], replace(ops[i], seconds=ops[i].seconds + core - attn), *ops[i + 1:]]


def _spread(cpu_s: float, ops: list[OpCost]) -> list[float]:
    """A layer pass's dispatch time ``cpu_s`` spread evenly over its operators, those of
    :data:`UNCOUNTED_DISPATCH` left out (they get 0): see :func:`stage_costs`."""
    counted = sum(o.name not in UNCOUNTED_DISPATCH for o in ops)
    share = cpu_s / counted if counted else 0.0
    return [0.0 if o.name in UNCOUNTED_DISPATCH else share for o in ops]


# Where Megatron issues a layer's TP collectives: (before/after, operator) per collective, for
# the collective lists :meth:`PlanComm.tp_layer` returns, in the pass's own order (the backward
# runs the layer's operators in reverse). Forward: an all-reduce after each row-parallel GEMM,
# or (parallel residual) one joint reduce after the MLP's; with sequence parallelism an
# all-gather after each half's norm and a reduce-scatter after its row-parallel GEMM.
# Backward: each column-parallel GEMM's input gradient is all-reduced (reduce-scattered with
# sequence parallelism, after the all-gather of the gradient that enters the half).
_TP_ANCHORS: dict[tuple[str, tuple[str, ...]], tuple[tuple[str, str], ...]] = {
    ("fwd", ("all_reduce",)): (("after", "mlp_down"),),
    ("fwd", ("all_reduce", "all_reduce")): (("after", "out_proj"), ("after", "mlp_down")),
    ("fwd", ("all_gather", "reduce_scatter", "all_gather", "reduce_scatter")): (
        ("before", "qkv_proj"), ("after", "out_proj"), ("before", "mlp_up"), ("after", "mlp_down")),
    ("bwd", ("all_reduce", "all_reduce")): (("after", "mlp_up"), ("after", "qkv_proj")),
    ("bwd", ("all_gather", "reduce_scatter", "all_gather", "reduce_scatter")): (
        ("before", "mlp_down"), ("after", "mlp_up"), ("before", "out_proj"), ("after", "qkv_proj")),
}  # fmt: skip


def with_tp_comm(ops: list[OpCost], cpus: list[float], comms: list[CommCost], phase: str,
                 host: HostModel = HOST) -> tuple[list[OpCost], list[float]]:  # fmt: skip
    """One layer pass's operators (``ops``, in the order the pass runs them) with its TP
    collectives placed where Megatron issues them (``_TP_ANCHORS``), and the CPU time of each:
    the collectives' is :meth:`HostModel.collective_s` (the CPU enqueues them and goes on).
    A collective whose anchor the layer lacks ends the pass.

    Not modelled: Megatron overlaps the backward's collectives with the weight-gradient GEMMs
    (they run here one after another on the GPU), and with sequence parallelism re-gathers
    each column-parallel GEMM's input for its weight gradient (two all-gathers more).
    """
    if not comms:
        return ops, cpus
    anchors = _TP_ANCHORS.get((phase, tuple(c.kind for c in comms)), ())
    names = [o.name for o in ops]  # index(): a recurring name (residual_add) anchors its first
    seq = list(zip(ops, cpus, strict=True))
    at = []
    for i, c in enumerate(comms):
        where, name = anchors[i] if i < len(anchors) else ("after", "")
        pos = names.index(name) + (where == "after") if name in names else len(ops)
        at.append((pos, i, OpCost(c.name, phase, c.seconds, c.provenance, 0.0, "comm"), host.collective_s(c.kind)))
    for pos, _, op, cpu in sorted(at, key=lambda a: a[:2], reverse=True):  # later first: positions hold
        seq.insert(pos, (op, cpu))
    return [o for o, _ in seq], [t for _, t in seq]


class _LayerPasses(NamedTuple):
    """One layer's passes as :func:`stage_costs` runs them (:func:`_layer_passes`)."""

    lf: list[OpCost]  # forward operators
    lb: list[OpCost]  # backward operators, in the order they run (reversed)
    lf_t: list[OpCost]  # ... with the CP ring's wait on the attention core
    lb_t: list[OpCost]
    cpu_f: list[float]  # dispatch time per operator
    cpu_b: list[float]
    lf_tp: list[OpCost]  # ... and the TP collectives where Megatron issues them
    cpu_f_tp: list[float]
    lb_tp: list[OpCost]
    cpu_b_tp: list[float]
    re_ops: list[OpCost]  # what the recomputation re-runs
    re_cpu: list[float]
    sel: list[int]  # selective recompute: the attention core's operators in lf
    acc: list[OpCost]  # gradient accumulation, averaged over the micro-batches
    acc_cpu: list[float]
    lb_acc: list[OpCost]  # lb_tp + acc
    cpu_b_acc: list[float]
    tpf: list[CommCost]
    tpb: list[CommCost]
    epf: list[CommCost]
    epb: list[CommCost]
    cpf: CommCost | None
    cpb: CommCost | None
    cwf: CPWindow | None  # layers with exposed CP collectives: windowed ones under the ring, or all (cp_comm)
    cwb: CPWindow | None
    ep_f: float  # expert all-to-alls added to each pass
    ep_b: float
    re_comm: float  # ... and to a full recomputation
    full_rc: bool


def _cp_comm(lp: _LayerPasses) -> list[CommCost]:
    """A layer's context-parallel collectives, forward and backward: the ring's where some
    layers run it, a windowed layer's all-gathers where some are windowed (:func:`_with_ring`)."""
    ring = [c for c in (lp.cpf, lp.cpb) if c is not None]
    if lp.cwf is None or lp.cwb is None:
        return ring
    return [*(ring if lp.cwf.layers < 1.0 else []), *lp.cwf.comm, *lp.cwb.comm]


def _averaged(ops: list[OpCost], small: int, plan: Plan, host: HostModel) -> tuple[list[OpCost], list[float]]:
    """Gradient-accumulation adds averaged over the micro-batches, and their dispatch: autograd's
    AccumulateGrad assigns the first micro-batch's gradients (a detach, counted as a view op in
    HostModel's trace) and adds every later one (a launching op), so (M - 1) / M of the adds and
    of the extra dispatch per tensor; the ``small`` tensors' dispatch rides on the timed adds."""
    if not ops:
        return [], []
    frac = (plan.grad_accum - 1) / plan.grad_accum if plan.grad_accum > 0 else 0.0
    extra_dispatch = frac * (host.aten_launch_s - host.aten_view_s)  # inside AccumulateGrad's node: no gap
    scaled: dict[int, OpCost] = {}  # one copy per distinct cost (an MoE rank's experts repeat theirs)
    ops = [scaled.get(id(o)) or scaled.setdefault(id(o), replace(o, seconds=o.seconds * frac)) for o in ops]
    return ops, [extra_dispatch * (1 + small / len(ops))] * len(ops)


def _layer_accumulation(lc: LayerCoster, plan: Plan, host: HostModel) -> tuple[list[OpCost], list[float]]:
    """:func:`_averaged` of the layer's gradient accumulation, kept by the coster per what it
    depends on: the adds' key (:meth:`LayerCoster.grad_accumulation_key`), the micro-batch count
    and the host model (an MoE layer's list holds one add per local expert weight)."""
    key = lc.grad_accumulation_key()
    if key is None:
        return [], []

    def make() -> tuple[tuple[OpCost, ...], tuple[float, ...]]:
        ops, cpus = _averaged(*lc.grad_accumulation(), plan, host)
        return tuple(ops), tuple(cpus)

    kept = cast(tuple[tuple[OpCost, ...], tuple[float, ...]], lc.c.kept((*key, "averaged", plan.grad_accum, host), make))
    return list(kept[0]), list(kept[1])


def _layer_passes(lc: LayerCoster, comm: PlanComm, plan: Plan, host: HostModel) -> _LayerPasses:
    """One layer's forward, backward and recomputation as :func:`stage_costs` times them: the
    operators with the CP ring, the TP collectives, the dispatch times and the gradient
    accumulation (the main model's layers, and an MTP depth's block)."""
    lf, lb = lc.layer("fwd"), lc.layer("bwd")
    tpf, tpb = comm.tp_layer("fwd"), comm.tp_layer("bwd")
    epf, epb = comm.ep_layer("fwd"), comm.ep_layer("bwd")
    cpf, cpb = comm.cp_layer("fwd"), comm.cp_layer("bwd")
    cwf, cwb = comm.cp_exposed_layer("fwd"), comm.cp_exposed_layer("bwd")

    # TP collectives and CP's ring run inside the pass (below); expert all-to-alls add
    ep_f, ep_b = float(sum(c.seconds for c in epf)), float(sum(c.seconds for c in epb))
    # ring attention: the K/V exchange overlaps the attention's block computations, so on the
    # GPU the attention core lasts as long as the longer of the two (the wait on its first
    # operator, inside the pass's flow shop). Added after the flow shop, the ring's unhidden
    # part had been hidden by attention time that a dispatch-bound pass's CPU already hid, so
    # faster attention kernels (or an attention dropout) could make the iteration slower (faster).
    stretch = contention_factor(plan)  # overlapped collectives stretch the compute beside them
    lf_t = _with_ring(lf, cpf, stretch, cwf)
    full_rc = plan.recompute == "full"
    re_comm = ep_f if full_rc else 0.0
    # the layer's dispatch time spread evenly over its operators (HostModel's per-layer counts,
    # taken from HF GPT-2's trace, whose layers run their dropouts: --hidden-dropout's passes
    # are dispatched within that count and get no share of their own, so that adding them
    # only adds GPU work; spread over them too, they had taken CPU time off the other
    # operators, and a CPU-bound pass or the selective recompute came out faster with them)
    # (an MoE layer with impl "hf": plus its eager router and experts' calls, eager.expert_loop_host)
    # (and the expert GEMMs' own dispatch beyond one MLP's: LayerCoster.expert_gemms_host_s)
    loop_f, loop_b = ((expert_loop_host(lc.model, ph, tokens=lc.tokens, host=host, experts=plan.experts_impl)[0]
                       if plan.impl == "hf" else 0.0) + lc.expert_gemms_host_s(ph, host) for ph in ("fwd", "bwd"))  # fmt: skip
    cpu_f, cpu_b = _spread(host.layer_s("fwd") + loop_f, lf), _spread(host.layer_s("bwd") + loop_b, lb)
    # the backward runs the layer's operators in reverse
    lb, cpu_b = lb[::-1], cpu_b[::-1]
    # the backward's ring wait on its attention core's first operator in the order it runs
    # (reversed): on the last, an attention dropout's backward moved GPU time ahead of the
    # wait and a CPU-bound backward came out faster with the dropout
    lb_t = _with_ring(lb, cpb, stretch, cwb)
    lf_tp, cpu_f_tp = with_tp_comm(lf_t, cpu_f, tpf, "fwd", host)
    lb_tp, cpu_b_tp = with_tp_comm(lb_t, cpu_b, tpb, "bwd", host)
    # selective recompute re-runs the attention core's forward (Korthikanti et al. §5): its
    # operators with their own dispatch (below; the attention dropout's is 0, as above: with
    # the counted share it had, the recomputation's dispatch grew with a dropout the
    # forward's does not, and a CPU-bound recomputation took one share more per layer), and
    # with context parallelism the core's ring as well, its wait on the core's first operator
    # as in the forward: Megatron-core's Attention._checkpointed_attention_forward runs the
    # core attention (TransformerEngine's DotProductAttention, CP p2p rounds and all) under
    # tensor_parallel.checkpoint, so the recomputation passes the K/V blocks round the ring
    # once more (left out until 2026-12-02: a layer's ring ran in the forward and twice in
    # the backward, not a fourth time); full recompute re-runs the forward, ring included
    selective = plan.recompute == "selective"
    sel = [i for i, o in enumerate(lf) if o.category == "attention"] if selective else []
    if plan.recompute == "full":
        re_ops, re_cpu = lf_tp, cpu_f_tp
    else:
        # each re-run operator at one share of the traced layer's forward dispatch
        # (:data:`TRACED_LAYER_OPS`), not at its share of this layer's (_spread): that share
        # grows as the layer has fewer other operators, and a layer without a norm (Cohere's,
        # Phi's parallel block on one norm) or without a rotary had recomputed its attention
        # core more slowly when CPU-bound (scripts/metamorphic_families40.py; until 2026-12-04)
        share = host.layer_s("fwd") / TRACED_LAYER_OPS
        re_ops = [lf_t[i] for i in sel]
        re_cpu = [0.0 if o.name in UNCOUNTED_DISPATCH else share for o in re_ops]
    # gradient accumulation, averaged over the micro-batches (:func:`_averaged`)
    acc, acc_cpu = _layer_accumulation(lc, plan, host)
    lb_acc, cpu_b_acc = lb_tp + acc, cpu_b_tp + acc_cpu
    return _LayerPasses(lf, lb, lf_t, lb_t, cpu_f, cpu_b, lf_tp, cpu_f_tp, lb_tp, cpu_b_tp, re_ops, re_cpu, sel,
                        acc, acc_cpu, lb_acc, cpu_b_acc, tpf, tpb, epf, epb, cpf, cpb, cwf, cwb, ep_f, ep_b,
                        re_comm, full_rc)  # fmt: skip


def stage_costs(model: ModelSpec, plan: Plan, system: SystemSpec, coster: OpCoster | None = None,
                host: HostModel = HOST, *, tp_shares: bool = True,
                mtp: _MTPCost | None = None, only: frozenset[int] | None = None) -> list[StageCost]:  # fmt: skip
    """Every pipeline stage's costs under ``plan`` (with ``only``, those stages alone, in order:
    :func:`_with_dense_layers` needs its dense variant's stages that hold dense layers). ``tp_shares=False`` skips what only the
    breakdown reads, the TP collectives' share of each pass (two more flow shops per depth;
    the search's screening), and leaves those fields NaN. A model with multi-token prediction
    runs its MTP depths on the last stage (:func:`_mtp_costs`); ``mtp``: their costs where the
    caller has them (:func:`_with_dense_layers` gives the model's to its dense variant). A
    stage in ``only`` outside the plan's ``0..pp-1`` is a ConfigError."""
    if only is not None and (bad := sorted(s for s in only if not (isinstance(s, int) and 0 <= s < plan.pp))):
        raise ConfigError(f"stage_costs: stage {bad[0]!r} is not a stage of the plan's pipeline (pp {plan.pp}: "
                          f"stages 0..{plan.pp - 1}); ask for stages in that range")  # fmt: skip
    from trainsim.builders.memory import (
        _layer_params_per_gpu,
        _stage_params_split,
        _zero_groups,
        dense_layer_extra_params,
        embedding_params_per_gpu,
        stage_dense_layers,
        stage_layers,
    )

    coster = coster or OpCoster(get_device(system.device))
    lc = LayerCoster(model, plan, coster)
    comm = PlanComm(model, plan, system)
    passes = _layer_passes(lc, comm, plan, host)
    (lf, lb, lf_t, lb_t, cpu_f, cpu_b, lf_tp, cpu_f_tp, _, _, re_ops, re_cpu, sel, acc, acc_cpu,
     lb_acc, cpu_b_acc, tpf, tpb, epf, epb, cpf, cpb, cwf, _, ep_f, ep_b, re_comm, full_rc) = passes
    layer_comm_f, layer_comm_b = ep_f, ep_b
    stretch = contention_factor(plan)  # overlapped collectives stretch the compute beside them

    def averaged(ops: list[OpCost], small: int) -> tuple[list[OpCost], list[float]]:
        return _averaged(ops, small, plan, host)

    # multi-token prediction: its depths run on the last stage, after the main head (Megatron)
    depths = model.mtp_depths(plan.impl)
    if mtp is None and depths:
        block = model.mtp_block()
        mtp = _mtp_costs(model, plan, system, coster, host, block=block, depths=depths, tp_shares=tp_shares,
                         main=(lc, comm, passes) if block is model else None)  # fmt: skip

    out = []
    layers = stage_layers(model, plan)
    layer_params = _layer_params_per_gpu(model, plan.tp, plan.ep)
    # per plan, not per stage (memory.memory_per_gpu's)
    dense_counts = stage_dense_layers(model, plan, layers) if model.dense_layers else None
    dense_extra = dense_layer_extra_params(model, plan) if model.dense_layers else None
    # stages of equal depth share their passes
    per_n: dict[int, tuple[float, float, float, float, float, tuple[float, float, float], tuple[float, float, float]]] = {}
    shops: list[tuple[float, float, float] | None] = []
    fl_f, fl_b = sum(o.flops for o in lf), sum(o.flops for o in lb)
    shard = plan.dp * plan.cp if plan.zero >= 1 else 1
    layer_comm = [*tpf, *tpb, *epf, *epb, *_cp_comm(passes)]
    z3 = comm.zero3_layer(*_zero_groups(_layer_params_per_gpu(model, plan.tp, plan.ep), plan.ep))
    if z3 is not None:
        layer_comm = [*layer_comm, *z3]
    def _stage(s: int, n: int, first: bool, last: bool) -> StageCost:
        extra_f = (lc.embedding("fwd") if first else []) + (lc.head("fwd") if last else [])
        extra_b = (lc.embedding("bwd") if first else []) + (lc.head("bwd") if last else [])
        ext_acc, ext_acc_cpu = averaged(*lc.extra_grad_accumulation(first, last))
        passes = per_n.get(n)
        if passes is None:
            # each pass is a CPU-dispatch / GPU flow shop (small models are launch-bound); the
            # TP collectives are in it: the CPU enqueues each and goes on, the GPU runs it in
            # order, so a launch-bound pass hides their time behind its dispatch
            if not shops:  # one pass's parts, for every depth (flow_shop_repeat)
                shops.extend((flow_shop_parts(lf_tp, cpu_f_tp), flow_shop_parts(re_ops, re_cpu),
                              flow_shop_parts(lb_acc, cpu_b_acc)))  # fmt: skip
            f = flow_shop_repeat(shops[0], n) + n * layer_comm_f
            r = (flow_shop_repeat(shops[1], n) + n * re_comm) if re_ops else 0.0
            b = flow_shop_repeat(shops[2], n) + n * layer_comm_b
            # what the TP collectives add to each pass (dispatch included): the breakdown's share
            tp_x = (0.0, 0.0, 0.0) if tp_shares else (math.nan,) * 3
            if (tpf or tpb) and tp_shares:
                f_bare = flow_shop_s(lf_t, cpu_f, n)
                b_bare = flow_shop_s(lb_t + acc, cpu_b + acc_cpu, n)
                tp_x = (f - n * layer_comm_f - f_bare, b - n * layer_comm_b - b_bare,  # full recompute: the forward again
                        (r - n * re_comm - f_bare) if plan.recompute == "full" else 0.0)  # fmt: skip
            # what the CP ring adds to each pass (the part its attention does not hide)
            cp_x = (0.0, 0.0, 0.0) if tp_shares else (math.nan,) * 3
            if (cpf or cpb or cwf) and tp_shares:
                cf = flow_shop_s(lf_t, cpu_f, n) - flow_shop_s(lf, cpu_f, n)
                cb = flow_shop_s(lb_t + acc, cpu_b + acc_cpu, n) - flow_shop_s(lb + acc, cpu_b + acc_cpu, n)
                cr = cf if full_rc else 0.0
                if sel:  # the selective recomputation's ring: its pass less the same without it
                    bare = [lf[i] for i in sel]
                    cr = flow_shop_s(re_ops, re_cpu, n) - flow_shop_s(bare, re_cpu, n)
                cp_x = (cf, cb, cr)
            z3f = z3b = 0.0
            if z3 is not None:
                # ZeRO-3/FSDP with one-layer prefetch: each layer's weight all-gather runs on the
                # comm stream while the previous layer computes, so a pass takes the longer of
                # its compute and its collectives — except the first gather (nothing to hide
                # it) and, in the backward, the last layer's gradient reduce-scatter (nothing
                # after it); collectives of one communicator run one at a time (ag + rs per
                # layer in the backward); the hidden collectives stretch the compute they overlap
                # by the contention factor (builders/contention.py)
                ag = sum(c.seconds for c in z3 if c.kind == "all_gather")
                rs = sum(c.seconds for c in z3 if c.kind == "reduce_scatter")
                f0, b0 = f, b
                f = ag + max(f + hidden_cost_s((n - 1) * ag, f, stretch), (n - 1) * ag)
                b = ag + max(b + hidden_cost_s((n - 1) * (ag + rs), b, stretch), (n - 1) * (ag + rs)) + rs
                r = max(r + hidden_cost_s(n * ag, r, stretch), n * ag) if plan.recompute == "full" else r
                z3f, z3b = f - f0, b - b0
            passes = per_n[n] = (f, r, b, z3f, z3b, tp_x, cp_x)
        f, recompute, b, z3f, z3b, tp_x, cp_x = passes
        def bare_ends() -> tuple[float, float]:
            """The end passes without the ends' TP collectives."""
            bare_f = flow_shop_s(extra_f, [host.extra_s(o) for o in extra_f]) if extra_f else 0.0
            bare_b = (flow_shop_s(extra_b + ext_acc, [host.extra_s(o) for o in extra_b] + ext_acc_cpu)
                      if extra_b or ext_acc else 0.0)  # fmt: skip
            return bare_f, bare_b

        if not (plan.tp > 1 and (first or last)):
            end_f, end_b = bare_ends()
        else:
            # the ends' TP collectives (PlanComm.tp_end) in the order they run: the embedding's
            # after its lookup (backward: its all-gather before the lookup's gradient), the
            # head's input all-gather before the output projection, the cross-entropy's after it
            # (backward: the input gradient's reduction after the head's backward)
            def coll(part: str, phase: str, on: bool) -> list[tuple[OpCost, float]]:
                return [(OpCost(c.name, phase, c.seconds, c.provenance, 0.0, "comm"), host.collective_s(c.kind))
                        for c in comm.tp_end(part, phase)] if on else []  # fmt: skip

            def ext(ops: list[OpCost]) -> list[tuple[OpCost, float]]:
                return [(o, host.extra_s(o)) for o in ops]

            hf_c = coll("head", "fwd", last)
            n_ag = sum(o.name == "tp_head_all_gather" for o, _ in hf_c)
            seq_f = [*ext(lc.embedding("fwd") if first else []), *coll("embedding", "fwd", first), *hf_c[:n_ag],
                     *ext(lc.head("fwd") if last else []), *hf_c[n_ag:]]  # fmt: skip
            seq_b = [*coll("embedding", "bwd", first), *ext(lc.embedding("bwd") if first else []),
                     *ext(lc.head("bwd") if last else []), *coll("head", "bwd", last),
                     *zip(ext_acc, ext_acc_cpu, strict=True)]  # fmt: skip
            end_f = flow_shop_s([o for o, _ in seq_f], [c for _, c in seq_f]) if seq_f else 0.0
            end_b = flow_shop_s([o for o, _ in seq_b], [c for _, c in seq_b]) if seq_b else 0.0
            if tp_shares:  # the breakdown's share: the passes less the same without them (screening skips it)
                bare_f, bare_b = bare_ends()
                tp_x = (tp_x[0] + end_f - bare_f, tp_x[1] + end_b - bare_b, tp_x[2])
        fwd = f + end_f
        bwd = b + end_b + recompute
        mx = mtp if last else None
        if mx is not None:
            fwd, bwd, recompute = fwd + mx.fwd_s, bwd + mx.bwd_s + mx.recompute_s, recompute + mx.recompute_s
            end_f, end_b = end_f + mx.fwd_s, end_b + mx.bwd_s + mx.recompute_s
        dense, expert = _stage_params_split(model, plan, s, layers, layer_params, dense_counts=dense_counts,
                                            dense_extra=dense_extra)
        params = dense + expert
        st = StageCost(s, n, params, fwd, bwd, recompute)
        st.end_fwd_s, st.end_bwd_s = end_f, end_b
        st.zero3_exposed_fwd_s, st.zero3_exposed_bwd_s = z3f, z3b
        st.ep_comm_s = (n * ep_f, n * ep_b, n * ep_f if full_rc else 0.0)
        st.cp_comm_s = cp_x
        st.tp_comm_fwd_s, st.tp_comm_bwd_s, st.tp_comm_recompute_s = tp_x
        # ZeRO shards experts over the expert-data-parallel group only (dp·cp/ep ranks)
        st.optimizer_s = lc.optimizer(dense / shard + expert / max(shard // plan.ep, 1), n).seconds
        st.dp_comm = comm.dp_grads(params, expert)
        if plan.overlap_grad_reduce and plan.zero < 3:  # ZeRO-3 reduces inside the passes already
            outside = dense - n * layer_params[0]  # embedding (first stage), final norm and head (last)
            if dense_counts is not None and dense_extra is not None:  # a dense layer's MLP is a layer's too
                outside -= dense_counts[s] * dense_extra[0]
            # the first stage's embedding ends the backward; the rest (a last stage's final norm
            # and head, or its tied copy) starts it; pp 1 has both (memory._stage_params_split)
            end = embedding_params_per_gpu(model, plan) if first else 0.0
            # the layers ready theirs over their own backward (a chunk's: chunk_seconds' split),
            # not over the end part's: the first stage's embedding backward runs after them, the
            # last stage's head, loss and MTP depths before them (pp 1: both)
            emb_b = 0.0
            if first and last:
                emb = lc.embedding("bwd")
                emb_b = min(flow_shop_s(emb, [host.extra_s(o) for o in emb]) if emb else 0.0, end_b)
            after = end_b if first and not last else emb_b  # the last stage's rest precedes the layers
            st.dp_comm = _overlap_reduction(
                st.dp_comm, comm, window_s=(bwd - end_b) / chunks, chunks=chunks, pp=plan.pp,
                outside_end=end / dense if dense > 0 else 0.0,
                outside_start=(outside - end) / dense if dense > 0 else 0.0, stretch=stretch,
                after_s=after)  # fmt: skip
        if plan.dist_optimizer and plan.overlap_grad_reduce:  # Megatron's bucketed buffers: gathers per bucket
            emb_f = end_f if first and not last else 0.0
            if first and last:
                emb = lc.embedding("fwd")
                emb_f = min(flow_shop_s(emb, [host.extra_s(o) for o in emb]) if emb else 0.0, end_f)
            outside = dense - n * layer_params[0]  # as the reduction's: embedding, final norm, head, MTP
            if dense_counts is not None and dense_extra is not None:
                outside -= dense_counts[s] * dense_extra[0]
            embedding = embedding_params_per_gpu(model, plan) if first else 0.0
            lay = _GatherLayout(stage=s, layers_s=f, embedding_s=emb_f, forward_s=fwd, embedding=embedding,
                                tail=max(outside - embedding, 0.0))  # fmt: skip
            if plan.overlap_param_gather:  # the gathers move into the next iteration's first forward
                st.dp_comm = _overlap_param_gather(st.dp_comm, comm, plan, lay, stretch=stretch)
            else:
                st.dp_comm = _bucketed_param_gather(st.dp_comm, comm, plan, lay)
        st.embedding_comm = emb_comm if (first or last) else None
        st.flops_fwd = n * fl_f + sum(o.flops for o in extra_f)
        st.flops_bwd = n * fl_b + sum(o.flops for o in extra_b)
        st.layer_ops = lf + lb + acc
        st.ops = [*extra_f, *extra_b, *ext_acc]
        st.comm = layer_comm
        if mx is not None:
            _add_mtp(st, mx)
        return st

    emb_comm = comm.embedding_grads()
    chunks = plan.chunks  # the last backward: one chunk's
    # a stage's costs depend on its depth and on being first or last, and its p2p transfer on
    # where its boundary falls: stages alike in those share one computation (pp up to ~100)
    alike: dict[tuple[int, bool, bool, int, int], StageCost] = {}
    # and on how many of an MoE model's dense layers it holds (its parameters; h5); and with
    # the interleaved schedule's overlapped weight gathers on the stage itself (the fill before
    # its first activation, which hides the aligned gathers, grows with it: _overlap_param_gather)
    n_dense = stage_dense_layers(model, plan) if model.dense_layers else [0] * plan.pp
    by_stage = plan.overlap_param_gather and plan.chunks > 1
    for s, n in enumerate(layers):
        if only is not None and s not in only:
            continue
        first, last = s == 0, s == plan.pp - 1
        key = (n, first, last, n_dense[s], s if by_stage else -1)
        st = alike.get(key)
        if st is not None:
            st = StageCost(*_STAGE_FIELDS(st))  # a copy (dataclasses.replace costs 6x more)
            st.stage = s  # and lists of its own, as a caller may change a stage's
            st.dp_comm, st.layer_ops, st.ops, st.comm = [*st.dp_comm], [*st.layer_ops], [*st.ops], [*st.comm]
        else:
            st = alike[key] = _stage(s, n, first, last)
        bp = comm.pp_p2p(s) if plan.pp > 1 else None
        st.p2p_s = bp.seconds if bp else 0.0  # towards the next stage
        out.append(st)
    if model.dense_layers:  # the stages' passes so far count every layer as an MoE one
        return _with_dense_layers(out, model, plan, system, coster=coster, host=host, tp_shares=tp_shares, mtp=mtp,
                                  only=only)  # fmt: skip
    return out


# --- multi-token prediction (DeepSeek-V3 §2.2) on the last stage ------------------------------


@dataclass(frozen=True, slots=True)
class _MTPCost:
    """A model's MTP depths on the last stage, one micro-batch and GPU (:func:`_mtp_costs`)."""

    fwd_s: float
    bwd_s: float  # without the recomputation
    recompute_s: float
    tp: tuple[float, float, float]  # what the TP collectives add (forward, backward, recompute)
    ep: tuple[float, float, float]  # the blocks' expert all-to-alls
    cp: tuple[float, float, float]  # what the blocks' CP rings add
    zero3: tuple[float, float]  # ZeRO-3 gathers of the blocks' weights not hidden (forward, backward)
    flops_fwd: float
    flops_bwd: float
    ops: list[OpCost]
    comm: list[CommCost]


def _mtp_costs(model: ModelSpec, plan: Plan, system: SystemSpec, coster: OpCoster, host: HostModel, *,
               block: ModelSpec, depths: int, tp_shares: bool,
               main: tuple[LayerCoster, PlanComm, _LayerPasses] | None = None) -> _MTPCost:  # fmt: skip
    """The ``depths`` MTP depths of ``model`` (DeepSeek-V3 §2.2, Megatron-core's
    MultiTokenPredictionLayer and ``process_mtp_loss``), run by the last pipeline stage after
    the main head, one after another (depth k takes depth k - 1's hidden state), each:

    * forward: the shared embedding's lookup of the tokens shifted by k, RMSNorms of it and of
      the previous hidden state, their concatenation, ``eh_proj`` (column-parallel 2d -> d/tp;
      with TP its output all-gathered, with SP its input all-gathered first and the output
      scattered back to the sequence split), one transformer block of ``block``'s layer (its
      operators, TP/CP/EP collectives and dispatch as the main layers'), the norm before the
      head, the shared output projection and the cross-entropy (:meth:`LayerCoster.mtp_extras`);
    * backward: the same in reverse (``eh_proj``'s input gradient all-reduced, reduce-scattered
      with SP after the scatter's gather), the block's gradient accumulation, and once for all
      depths ``eh_proj``'s and an embedding copy's (:meth:`LayerCoster.mtp_grad_accumulation`);
    * recomputation: ``full`` re-runs what Megatron's MTP checkpoint holds (norms,
      concatenation, ``eh_proj`` and the block; not the embedding lookup or the head);
      ``selective`` the block's attention core, as in every layer;
    * ZeRO-3: the block's weights are gathered while the stage computes before it: only the
      part of the gathers (and the backward's reduce-scatters) longer than the depths' passes
      shows.

    Each pass is one CPU-dispatch / GPU flow shop of a depth's operators (the extras at
    :meth:`HostModel.extra_s`, the block at the layers' dispatch), repeated ``depths`` times.
    ``main``: the caller's coster, collectives and layer passes when ``block`` is the model
    itself (its last layer an MoE one), which the block's would repeat.
    """
    from trainsim.builders.memory import _layer_params_per_gpu, _zero_groups

    if main is not None:  # the block is the model's layer: the main layers' coster and passes
        lc, comm, lp = main
    else:
        lc, comm = LayerCoster(block, plan, coster), PlanComm(block, plan, system)
        lp = _layer_passes(lc, comm, plan, host)
    pre_f, post_f = lc.mtp_extras("fwd")
    pre_b, post_b = lc.mtp_extras("bwd")
    t = plan.tp
    eh_in_f: list[CommCost] = []  # before eh_proj's forward / after its backward
    eh_out_f: list[CommCost] = []  # after its forward / before its backward
    eh_in_b: list[CommCost] = []
    eh_out_b: list[CommCost] = []
    if t > 1:
        nb = lc.tokens * model.hidden * comm.act_bytes  # one [tokens, d] activation
        gather = comm.cost("mtp_tp_all_gather", "all_gather", nb, t, 1)
        eh_out_f = [gather]  # gather_from_tensor_model_parallel_region of the d/tp columns
        if plan.sp:
            eh_in_f = [comm.cost("mtp_tp_all_gather", "all_gather", 2 * nb, t, 1)]  # the [tokens, 2d] input
            eh_out_b = [gather]  # scatter_to_sequence_parallel_region's backward
            eh_in_b = [comm.cost("mtp_tp_reduce_scatter", "reduce_scatter", 2 * nb, t, 1)]
        else:
            eh_in_b = [comm.cost("mtp_tp_all_reduce", "all_reduce", 2 * nb, t, 1)]
    n_emb = sum(o.name in ("mtp_embedding", "mtp_hidden_dropout") for o in pre_f)  # outside the checkpoint
    n_emb_b = sum(o.name in ("mtp_embedding", "mtp_hidden_dropout") for o in pre_b)

    def ext(ops: list[OpCost]) -> list[tuple[OpCost, float]]:
        return [(o, host.extra_s(o)) for o in ops]

    def coll(cs: list[CommCost], phase: str, tp: bool) -> list[tuple[OpCost, float]]:
        return [(OpCost(c.name, phase, c.seconds, c.provenance, 0.0, "comm"), host.collective_s(c.kind))
                for c in cs] if tp else []  # fmt: skip

    # the depth's lookup and head take the main model's end collectives (PlanComm.tp_end)
    emb_f, emb_b = comm.tp_end("embedding", "fwd"), comm.tp_end("embedding", "bwd")
    head_f, head_b = comm.tp_end("head", "fwd"), comm.tp_end("head", "bwd")
    n_ag = sum(c.kind == "all_gather" for c in head_f)

    def fwd(blk: list[tuple[OpCost, float]], tp: bool, start: int = 0) -> list[tuple[OpCost, float]]:
        lookup = ext(pre_f[:n_emb]) + coll(emb_f, "fwd", tp) if start == 0 else []
        return (lookup + ext(pre_f[max(start, n_emb):-1]) + coll(eh_in_f, "fwd", tp) + ext(pre_f[-1:])
                + coll(eh_out_f, "fwd", tp) + blk)  # fmt: skip

    def post(tp: bool) -> list[tuple[OpCost, float]]:
        return coll(head_f[:n_ag], "fwd", tp) + ext(post_f) + coll(head_f[n_ag:], "fwd", tp)

    def bwd(blk: list[tuple[OpCost, float]], tp: bool) -> list[tuple[OpCost, float]]:
        return (ext(post_b[::-1]) + coll(head_b, "bwd", tp) + blk + coll(eh_out_b, "bwd", tp) + ext(pre_b[-1:])
                + coll(eh_in_b, "bwd", tp) + ext(pre_b[n_emb_b:-1][::-1]) + coll(emb_b, "bwd", tp)
                + ext(pre_b[:n_emb_b][::-1]))  # fmt: skip

    def shop(seq: list[tuple[OpCost, float]]) -> float:
        return flow_shop_s([o for o, _ in seq], [c for _, c in seq], depths)

    acc, acc_cpu = _averaged(*lc.mtp_grad_accumulation(depths, plan.pp > 1 and not model.tied_embeddings), plan, host)
    acc_s = flow_shop_s(acc, acc_cpu) if acc else 0.0
    seq_f = fwd(list(zip(lp.lf_tp, lp.cpu_f_tp, strict=True)), True) + post(True)
    seq_b = bwd(list(zip(lp.lb_acc, lp.cpu_b_acc, strict=True)), True)
    f = shop(seq_f) + depths * lp.ep_f
    b = shop(seq_b) + acc_s + depths * lp.ep_b
    if lp.full_rc:
        seq_r = fwd(list(zip(lp.lf_tp, lp.cpu_f_tp, strict=True)), True, n_emb)
    else:
        seq_r = list(zip(lp.re_ops, lp.re_cpu, strict=True))
    r = (shop(seq_r) + depths * lp.re_comm) if seq_r else 0.0
    tp_x = (0.0, 0.0, 0.0) if tp_shares else (math.nan,) * 3
    if t > 1 and tp_shares:
        f_bare = shop(fwd(list(zip(lp.lf_t, lp.cpu_f, strict=True)), False) + post(False))
        b_bare = shop(bwd(list(zip(lp.lb_t + lp.acc, lp.cpu_b + lp.acc_cpu, strict=True)), False)) + acc_s
        r_bare = shop(fwd(list(zip(lp.lf_t, lp.cpu_f, strict=True)), False, n_emb)) if lp.full_rc else 0.0
        tp_x = (f - depths * lp.ep_f - f_bare, b - depths * lp.ep_b - b_bare,
                (r - depths * lp.re_comm - r_bare) if lp.full_rc else 0.0)  # fmt: skip
    cp_x = (0.0, 0.0, 0.0) if tp_shares else (math.nan,) * 3
    if (lp.cpf or lp.cpb or lp.cwf) and tp_shares:
        def with_block(ring: bool, phase: str) -> list[tuple[OpCost, float]]:
            if phase == "fwd":
                return fwd(list(zip(lp.lf_t if ring else lp.lf, lp.cpu_f, strict=True)), False) + post(False)
            return bwd(list(zip((lp.lb_t if ring else lp.lb) + lp.acc, lp.cpu_b + lp.acc_cpu, strict=True)), False)

        cf = shop(with_block(True, "fwd")) - shop(with_block(False, "fwd"))
        cb = shop(with_block(True, "bwd")) - shop(with_block(False, "bwd"))
        cr = cf if lp.full_rc else 0.0
        if lp.sel:
            cr = shop(seq_r) - shop(list(zip([lp.lf[i] for i in lp.sel], lp.re_cpu, strict=True)))
        cp_x = (cf, cb, cr)
    z3 = comm.zero3_layer(*_zero_groups(_layer_params_per_gpu(block, plan.tp, plan.ep), plan.ep))
    z3_x = (0.0, 0.0)
    if z3 is not None:  # prefetched while the stage computes before each block: the longer shows
        ag = sum(c.seconds for c in z3 if c.kind == "all_gather")
        rs = sum(c.seconds for c in z3 if c.kind == "reduce_scatter")
        f0, b0 = f, b
        stretch = contention_factor(plan)  # the hidden gathers stretch the compute, as the layers'
        f = max(f + hidden_cost_s(depths * ag, f, stretch), depths * ag)
        b = max(b + hidden_cost_s(depths * (ag + rs), b, stretch), depths * (ag + rs))
        r = max(r + hidden_cost_s(depths * ag, r, stretch), depths * ag) if lp.full_rc else r
        z3_x = (f - f0, b - b0)
    per_depth = [*pre_f, *post_f, *pre_b, *post_b, *lp.lf, *lp.lb, *lp.acc]
    comms = [*eh_in_f, *eh_out_f, *eh_in_b, *eh_out_b, *lp.tpf, *lp.tpb, *lp.epf, *lp.epb,
             *_cp_comm(lp), *(z3 or [])]  # fmt: skip
    return _MTPCost(
        f, b, r, tp_x, (depths * lp.ep_f, depths * lp.ep_b, depths * lp.ep_f if lp.full_rc else 0.0), cp_x, z3_x,
        depths * sum(o.flops for o, _ in seq_f), depths * sum(o.flops for o, _ in seq_b),
        per_depth * depths + acc, comms * depths,
    )  # fmt: skip


def _add_mtp(st: StageCost, mx: _MTPCost) -> None:
    """The last stage ``st`` with its MTP depths' shares, FLOPs and operators added (the passes'
    times are added by :func:`stage_costs`)."""
    st.tp_comm_fwd_s, st.tp_comm_bwd_s, st.tp_comm_recompute_s = (
        a + b for a, b in zip((st.tp_comm_fwd_s, st.tp_comm_bwd_s, st.tp_comm_recompute_s), mx.tp, strict=True))
    st.ep_comm_s = tuple(a + b for a, b in zip(st.ep_comm_s, mx.ep, strict=True))  # type: ignore[assignment]
    st.cp_comm_s = tuple(a + b for a, b in zip(st.cp_comm_s, mx.cp, strict=True))  # type: ignore[assignment]
    st.zero3_exposed_fwd_s += mx.zero3[0]
    st.zero3_exposed_bwd_s += mx.zero3[1]
    st.flops_fwd += mx.flops_fwd
    st.flops_bwd += mx.flops_bwd
    st.ops = [*st.ops, *mx.ops]
    st.comm = [*st.comm, *mx.comm]


# --- dense layers among MoE ones (h5: DeepSeek's first_k_dense_replace, Qwen's mlp_only_layers) --

# the per-micro-batch fields that sum a stage's layer passes (with its embedding and head)
_PASS_FIELDS = ("fwd_s", "bwd_s", "recompute_s", "tp_comm_fwd_s", "tp_comm_bwd_s", "tp_comm_recompute_s",
                "zero3_exposed_fwd_s", "zero3_exposed_bwd_s", "flops_fwd", "flops_bwd", "end_fwd_s",
                "end_bwd_s")  # fmt: skip


def _with_dense_layers(stages: list[StageCost], model: ModelSpec, plan: Plan, system: SystemSpec, *,
                       coster: OpCoster, host: HostModel, tp_shares: bool,
                       mtp: _MTPCost | None = None, only: frozenset[int] | None = None) -> list[StageCost]:  # fmt: skip
    """``stages`` (the plan's, or with ``only`` those stages in order) with the stages holding
    some of ``model.dense_layers``: each pass is the MoE stage's (every layer
    an MoE layer; ``stages``) and the same stage of :meth:`ModelSpec.dense_variant` (every layer
    dense) weighed by the stage's MoE and dense layers, ``(n - n_d) / n`` and ``n_d / n``: the
    layer passes sum to ``(n - n_d)`` MoE and ``n_d`` dense layers, the embedding and head
    counted once (both stages have them), the flow shop's start-up shared. Parameters,
    optimizer and gradient reduction are the stage's own already (:mod:`.memory` counts the
    dense layers). Not modelled: an overlapped gradient reduction's window is the MoE
    stage's backward, and overlapped weight gathers' forward the MoE stage's."""
    from trainsim.builders.memory import dense_variant, stage_dense_layers

    counts = stage_dense_layers(model, plan)
    if not any(counts):
        return stages
    # the dense variant's MTP depths are the model's (``mtp``: their blocks MoE ones where the
    # model's last layer is), so that the weighing below leaves them whole
    # (only the stages that hold dense layers: the others take the MoE stage whole)
    index = sorted(only) if only is not None else list(range(plan.pp))  # each of ``stages``' stage
    wanted = frozenset(s for s in index if counts[s])
    dense = dict(zip(sorted(wanted), stage_costs(dense_variant(model), plan, system, coster, host,
                                                 tp_shares=tp_shares, mtp=mtp, only=wanted), strict=True))  # fmt: skip
    out = []
    for s, moe in zip(index, stages, strict=True):
        nd = counts[s]
        if not nd:
            out.append(moe)
            continue
        dn = dense[s]
        w = nd / moe.layers
        st = replace(moe, **{f: (1 - w) * getattr(moe, f) + w * getattr(dn, f) for f in _PASS_FIELDS})
        # dense layers have no all-to-all: the dense stage's is its MTP blocks' only (if any)
        (ef, eb, er), (def_, deb, der) = moe.ep_comm_s, dn.ep_comm_s
        st.ep_comm_s = ((1 - w) * ef + w * def_, (1 - w) * eb + w * deb, (1 - w) * er + w * der)
        (cf, cb, cr), (df, db, dr) = moe.cp_comm_s, dn.cp_comm_s
        st.cp_comm_s = ((1 - w) * cf + w * df, (1 - w) * cb + w * db, (1 - w) * cr + w * dr)
        st.ops = [*moe.ops, *dn.layer_ops]  # the dense layer's operators, for the provenance counts
        out.append(st)
    return out


# --- gradient reduction overlapped with the last backward ----------------------------------------

DDP_BUCKET_BYTES = 25 * 2**20  # PyTorch DDP's default bucket_cap_mb


def reduction_tail_s(ready: np.ndarray, seconds: np.ndarray) -> float:
    """How long a gradient reduction runs on after the backward ends: bucket ``i`` is ready at
    ``ready[i]`` (measured from that end, ≤ 0) and takes ``seconds[i]``; one communication
    stream reduces them in the order they are ready, each once the previous one is done. It
    ends at ``max_k (r_k + Σ_{i ≥ k} t_i)`` over the buckets sorted by readiness (the stream
    is last idle just before some bucket ``k``)."""
    if len(ready) == 0:
        return 0.0
    order = np.argsort(ready, kind="stable")
    suffix = np.cumsum(seconds[order][::-1])[::-1]
    return max(float(np.max(ready[order] + suffix)), 0.0)


def _overlap_reduction(dp: list[CommCost], comm: PlanComm, *, window_s: float, chunks: int, pp: int,
                       outside_end: float, outside_start: float, stretch: float = 1.0,
                       after_s: float = 0.0) -> list[CommCost]:  # fmt: skip
    """``dp`` (a stage's gradient collectives) with the reductions' seconds cut to what
    :func:`reduction_tail_s` leaves after the last backward (the gathers after the update stay
    whole). Each reduction goes in :data:`DDP_BUCKET_BYTES` buckets, each timed by the
    collective models at its own size (the latency counts once per bucket):

    * the layers' gradients are readied evenly over each model chunk's layers' last backward
      (``window_s``, without the end part): chunk 0's ends ``after_s`` before the stage's
      backward does (the first stage's embedding backward follows it), chunk ``k``'s ``k·pp``
      backward slots before that (interleaved 1F1B's cool-down runs the chunks' last backwards
      ``pp`` micro-batches apart; every chunk holds ``1/chunks`` of the layers);
    * the parameters outside the layers (their shares of the dense ones): the first stage's
      embedding (``outside_end``) is ready last, its backward ending the pass; a last stage's
      final norm, head and MTP depths (``outside_start``) first, once their backward (which
      precedes the layers' in the last chunk) is done (one stage has both
      with pp 1; before 2026-11-27 its head was taken as ready last too; until 2026-12-04 the
      layers' window included the end part's backward, so a last stage's layers, behind its
      head and MTP depths, were taken as ready up to twice as early: DeepSeek-V3 pp 16). An
      expert reduction holds layer parameters only (an MTP block's experts among them).

    A stream of buckets that cannot keep up leaves more than one bucket exposed; a very short
    backward can leave more than the unbucketed reduction (the buckets' latency).

    Contention (``stretch``, :mod:`.contention`): the buckets' time that the backward hides (all of it
    less the tail) stretches the compute it overlaps, at most the backward from the first
    bucket's readiness to its end, by ``stretch``; the backward ends that much later, and the
    reduction with it (charged to the exposed reduction; the buckets' readiness is not moved)."""
    red = [i for i, c in enumerate(dp) if c.kind in ("all_reduce", "reduce_scatter")]
    if not red:
        return dp
    ready: list[np.ndarray] = []
    seconds: list[np.ndarray] = []
    per: dict[int, float] = {}

    def bucketed(i: int, nbytes: float, start: float, span: float) -> None:
        """Reduction ``i``'s ``nbytes``, bucket ``j`` of ``b`` ready at ``start + j·span/b``."""
        c = dp[i]
        if nbytes <= 0:
            return
        # (to rounding, as _line_buckets: the part's bytes are the reduction's times a share, and
        # a tied 50 MiB embedding shard came out a hair above two buckets and took three when the
        # head's share grew, Phi's output bias exposing less: scripts/metamorphic_families40.py)
        b = max(math.ceil(nbytes / DDP_BUCKET_BYTES - 1e-9), 1)
        t = comm.cost_placed(c.name, c.kind, nbytes / b, c.group_size, c.per_node).seconds
        ready.append(start + np.arange(1, b + 1) * (span / b))
        seconds.append(np.full(b, t))
        per[i] = per.get(i, 0.0) + b * t

    start = -after_s - (chunks - 1) * pp * window_s - window_s  # the last chunk's layers' last backward begins
    for i in red:
        c = dp[i]
        dense = c.name.startswith("dp_")  # the expert reduction: layers only
        end_part, start_part = (outside_end, outside_start) if dense else (0.0, 0.0)
        for k in range(chunks):
            bucketed(i, c.bytes * (1.0 - end_part - start_part) / chunks, -after_s - k * pp * window_s - window_s,
                     window_s)  # fmt: skip
        bucketed(i, c.bytes * start_part, start, 0.0)
        bucketed(i, c.bytes * end_part, 0.0, 0.0)
    all_ready = np.concatenate(ready) if ready else np.zeros(0)
    exposed = reduction_tail_s(all_ready, np.concatenate(seconds)) if ready else 0.0
    total = sum(per.values())
    span = -float(np.min(all_ready)) if len(all_ready) else 0.0  # compute from the first ready bucket on
    exposed = exposed + hidden_cost_s(total - exposed, span, stretch)
    out = list(dp)
    for i in red:
        share = per.get(i, 0.0) / total if total > 0 else 0.0
        # named as what it is: the reduction's (whole) bytes, the part of its time left exposed
        out[i] = replace(dp[i], name=f"{dp[i].name}_exposed", seconds=exposed * share,
                         provenance=f"{dp[i].provenance};overlapped")  # fmt: skip
    return out


# --- ZeRO-1/2 weight gathers overlapped with the next forward (--overlap-param-gather) -------


def megatron_bucket_params(plan: Plan) -> float:
    """Megatron-core's default DDP bucket, in parameters: ``max(40_000_000, 1_000_000 · dp_cp)``
    (``DistributedDataParallelConfig.bucket_size``: "larger DP sizes need larger buckets to
    ensure collectives do not become latency-bound"); the gathers run bucket by bucket."""
    return float(max(40_000_000, 1_000_000 * plan.dp * plan.cp))


@dataclass(frozen=True, slots=True)
class _GatherLayout:
    """Where a stage's gathered weights are first used in its first micro-batch's forward: the
    first stage's ``embedding`` parameters at its start, then the layers' (their pass
    ``layers_s`` long, each layer's parameters used evenly over its share), then the ``tail``
    (final norm, head, MTP depths) after them; ``embedding_s`` the embedding's forward."""

    stage: int
    layers_s: float
    embedding_s: float
    forward_s: float  # the whole forward of one micro-batch (what a hidden gather can stretch)
    embedding: float
    tail: float


def param_gather_delay_s(seconds: np.ndarray, use_s: np.ndarray, *, chained: bool, start_s: float = 0.0) -> float:
    """How much later a forward ends when bucket ``k`` (forward order) must be gathered, taking
    ``seconds[k]``, before ``use_s[k]`` (its first use, measured in the undelayed forward from
    its start). One stream gathers them in order. ``chained`` (Megatron-core's
    ``finish_param_sync``): the first bucket is dispatched at its first use, bucket ``k + 1``
    when bucket ``k`` has been waited for (``W_k = max(F_k, f_k + D_{k-1})``, ``D_k = W_k -
    f_k``, ``F_{k+1} = W_k + t_{k+1}``); else all are dispatched at ``start_s`` (Megatron's
    aligned gathers of the interleaved schedule, ``start_s < 0``: before the stage's first
    activation arrives), ``F_k = start_s + Σ_{i ≤ k} t_i``. Returns ``D = max_k (F_k - f_k, 0)``."""
    delay, finish, waited = 0.0, start_s, start_s
    for k, (t, use) in enumerate(zip(seconds.tolist(), use_s.tolist(), strict=True)):
        begin = (use if k == 0 else waited) if chained else finish
        finish = max(begin, finish) + t
        waited = max(finish, use + delay)
        delay = waited - use
    return max(delay, 0.0)


def _line_buckets(total: float, size: float) -> tuple[np.ndarray, np.ndarray]:
    """Buckets of ``size`` over ``total`` parameters in forward order, cut from the end as
    Megatron fills them (parameters in reverse, the backward's order): (starts, params)."""
    if total <= 0:
        return np.zeros(0), np.zeros(0)
    nb = max(math.ceil(total / size - 1e-9), 1)
    ends = total - size * np.arange(nb - 1, -1, -1, dtype=float)
    starts = np.maximum(ends - size, 0.0)
    return starts, ends - starts


@dataclass(frozen=True, slots=True)
class _Buckets:
    """A stage's weight-gather buckets in forward order (:func:`_gather_buckets`)."""

    seconds: np.ndarray
    use_s: np.ndarray  # first use in the undelayed first forward, from the stage's first forward start
    chunk: np.ndarray
    gather: np.ndarray  # index of its all-gather in the stage's ``dp_comm``


def _gather_buckets(dp: list[CommCost], comm: PlanComm, plan: Plan, lay: _GatherLayout) -> _Buckets:
    """Megatron's buckets of each weight all-gather in ``dp`` (the dense weights' and an MoE
    stage's experts', each model chunk its own buffers), :func:`megatron_bucket_params` each,
    cut from the end of the chunk's parameters as Megatron fills them (in reverse, the
    backward's order), each timed by the collective models at its size; sorted by first use
    (ties: dense first). Chunk ``c``'s first forward is taken ``c·pp`` chunk-0 forwards in."""
    chunks = plan.chunks
    size = megatron_bucket_params(plan)
    chunk_layers_s = lay.layers_s / chunks
    chunk0_s = lay.embedding_s + chunk_layers_s
    rows: list[tuple[float, int, float, int, int]] = []  # (use, dense first, seconds, chunk, gather)
    for i, c in enumerate(dp):
        if c.kind != "all_gather":
            continue
        params = c.bytes / comm.act_bytes
        dense = c.name.startswith("dp_")  # the experts' gather: layers only
        emb, tail = (lay.embedding, lay.tail) if dense else (0.0, 0.0)
        layer_part = max(params - emb - tail, 0.0) / chunks
        for k in range(chunks):
            head = emb if k == 0 else 0.0
            starts, counts = _line_buckets(head + layer_part + (tail if k == chunks - 1 else 0.0), size)
            frac = np.clip((starts - head) / layer_part, 0.0, 1.0) if layer_part > 0 else np.ones_like(starts)
            use = np.where(starts < head, 0.0, (lay.embedding_s if k == 0 else 0.0) + frac * chunk_layers_s)
            for n, u in zip(counts.tolist(), (use + k * plan.pp * chunk0_s).tolist(), strict=True):
                t = comm.cost_placed(c.name, c.kind, c.bytes * n / params, c.group_size, c.per_node).seconds
                rows.append((u, 0 if dense else 1, t, k, i))
    rows.sort(key=lambda r: (r[0], r[1]))
    return _Buckets(np.array([r[2] for r in rows]), np.array([r[0] for r in rows]),
                    np.array([r[3] for r in rows], dtype=np.int64), np.array([r[4] for r in rows], dtype=np.int64))  # fmt: skip


def _charged(dp: list[CommCost], bk: _Buckets, seconds: float, suffix: str, tag: str) -> list[CommCost]:
    """``dp`` with ``seconds`` charged to its all-gathers, each its share of the buckets' time."""
    out = list(dp)
    total = float(bk.seconds.sum())
    for i, c in enumerate(dp):
        if c.kind == "all_gather":
            share = float(bk.seconds[bk.gather == i].sum()) / total if total > 0 else 0.0
            out[i] = replace(c, name=f"{c.name}{suffix}", seconds=seconds * share, provenance=f"{c.provenance};{tag}")
    return out


def _bucketed_param_gather(dp: list[CommCost], comm: PlanComm, plan: Plan, lay: _GatherLayout) -> list[CommCost]:
    """The distributed optimizer's gathers after the update with ``--overlap-grad-reduce`` (its
    buffers bucketed) and no ``--overlap-param-gather``: ``start_param_sync(force_sync=True)``
    gathers bucket after bucket, synchronously: the buckets' time, one after another."""
    bk = _gather_buckets(dp, comm, plan, lay)
    return _charged(dp, bk, float(bk.seconds.sum()), "", "bucketed") if len(bk.seconds) else dp


def _overlap_param_gather(dp: list[CommCost], comm: PlanComm, plan: Plan, lay: _GatherLayout, *,
                          stretch: float) -> list[CommCost]:  # fmt: skip
    """``dp`` with the weight all-gathers' seconds cut to what delays the next iteration's
    first forward (:func:`param_gather_delay_s`), as Megatron-core's ``--overlap-param-gather``
    runs them: the buckets of :func:`_gather_buckets` (dense and expert ones as one chain, on
    one stream). 1F1B and GPipe: the chain of :func:`param_gather_delay_s`, started by the
    stage's first forward pre-hook (after its first activation has arrived: the non-interleaved
    schedule dispatches nothing earlier; Megatron turns ``align_param_gather`` off there).
    Interleaved: the aligned gathers of model chunks 0 and 1 (``config.param_sync_func``), all
    dispatched as the schedule starts, before stage ``s``'s first activation arrives (taken as
    ``s`` of its own chunk-0 forwards); chunks from 2 on, dispatched a micro-batch group ahead in
    the warm-up, are taken as hidden. Contention: the gather time beside forward compute (not
    beside the fill's wait, nor the part exposed) stretches it
    (:func:`~trainsim.builders.contention.hidden_cost_s`). It never exceeds the bucketed gathers
    after the update (:func:`_bucketed_param_gather`), so the option never slows a plan."""
    bk = _gather_buckets(dp, comm, plan, lay)
    if not len(bk.seconds):
        return dp
    if plan.chunks == 1:
        fill = 0.0
        delay = param_gather_delay_s(bk.seconds, bk.use_s, chained=True)
        busy = float(bk.seconds.sum())
    else:
        early = bk.chunk < 2
        fill = lay.stage * (lay.embedding_s + lay.layers_s / plan.chunks)
        delay = param_gather_delay_s(bk.seconds[early], bk.use_s[early], chained=False, start_s=-fill)
        busy = float(bk.seconds[early].sum())
    beside = max(busy - min(busy, fill) - delay, 0.0)  # gathering while the forward computes
    exposed = delay + hidden_cost_s(beside, lay.forward_s, stretch)
    return _charged(dp, bk, exposed, "_exposed", "overlap_param_gather")


# --- closed forms ------------------------------------------------------------------------------


def closed_form_001(stages: list[StageCost], plan: Plan) -> float:
    """001 §III-D Eq. 7: ``(M - 1 + S)(max fwd + max bwd) + first-stage DP all-reduce + max
    update``, update = optimizer + ZeRO all-gather (with ``overlap_param_gather`` its exposed
    part, :func:`_overlap_param_gather`); P2P time is charged to the sender stages
    (added to each stage's forward and backward)."""
    m, s = plan.grad_accum, plan.pp
    fwd = max(st.fwd_s + (st.p2p_s if st.stage < s - 1 else 0.0) for st in stages)
    bwd = max(st.bwd_s + (stages[st.stage - 1].p2p_s if st.stage > 0 else 0.0) for st in stages)
    first = stages[0]
    sync = sum(c.seconds for c in first.dp_comm if c.kind in ("all_reduce", "reduce_scatter"))
    update = max(
        st.optimizer_s + sum(c.seconds for c in st.dp_comm if c.kind == "all_gather")
        for st in stages
    )
    return (m - 1 + s) * (fwd + bwd) + sync + update


def closed_form_003(stages: list[StageCost], plan: Plan) -> float:
    """003 §V Eq. 4: ``T = Σ_i t_i + (B - 1) max_j t_j`` with ``t_i`` a stage's forward and
    backward of one micro-batch (inter-stage communication ignored, as the paper does), plus
    the once-per-iteration gradient reduction and update of the slowest stage."""
    t = [st.fwd_s + st.bwd_s for st in stages]
    tail = max(st.dp_comm_s + st.optimizer_s for st in stages)
    return sum(t) + (plan.grad_accum - 1) * max(t) + tail


# --- the workload --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Link:
    """One point-to-point transfer of a stage: direction, stream, peer and boundary."""

    kind: CollectiveKind
    stream: int
    group: str
    peer: int
    boundary: int


class _StageEmitter:
    """Ops of one stage's rank graph, in issue order, with fresh op and kernel ids."""

    def __init__(self, stage: int, bcost: list[CommCost | None]) -> None:
        self.stage, self.bcost = stage, bcost
        self.ops: list[Op] = []
        self.kernel_id = 0

    def kernel_ids(self) -> int:
        self.kernel_id += 1
        return self.kernel_id

    def add(self, name: str, kernel: Kernel | None, deps: list[int | None], cat: OpCategory) -> int:
        oid = len(self.ops) + 1
        self.ops.append(Op(id=oid, name=name, thread=1, category=cat, kernels=(kernel,) if kernel else (),
                           deps=tuple(d for d in deps if d)))  # fmt: skip
        return oid

    def compute(
        self, what: str, tag: tuple[int, int], seconds: float, deps: list[int | None]
    ) -> int:
        name = f"{what} mb{tag[0]} v{tag[1]}"
        k = Kernel(
            self.kernel_ids(),
            name,
            KernelFamily.GEMM,
            COMPUTE,
            predicted_s=seconds,
            provenance="builder",
        )
        return self.add(name, k, deps, OpCategory.COMPUTE)

    def p2p(
        self, what: str, tag: tuple[int, int], link: _Link, seq: int, deps: list[int | None]
    ) -> int:
        name = f"{what} mb{tag[0]} v{tag[1]}"
        cost = self.bcost[link.boundary % len(self.bcost)]
        seconds, prov, nbytes = (
            (cost.seconds, cost.provenance, int(cost.bytes)) if cost else (0.0, "none", 0)
        )
        c = Collective(kind=link.kind, group=link.group, group_ranks=tuple(sorted((self.stage, link.peer))),
                       bytes=nbytes, seq=seq, peer=link.peer)  # fmt: skip
        k = Kernel(self.kernel_ids(), f"{link.kind.value}:{link.group}", link.kind.family, link.stream,
                   collective=c, predicted_s=seconds, provenance=prov)  # fmt: skip
        return self.add(name, k, deps, OpCategory.COMMUNICATION)

    def optimizer(self, seconds: float, deps: list[int | None]) -> int:
        k = Kernel(self.kernel_ids(), "optimizer", KernelFamily.OPTIMIZER, COMPUTE,
                   predicted_s=seconds, provenance="builder")  # fmt: skip
        return self.add("optimizer.step", k, deps, OpCategory.COMPUTE)

    def collective(self, c: CommCost, kind: CollectiveKind, *, group: str, ranks: tuple[int, ...], seq: int,
                   stream: int, deps: list[int | None]) -> int:  # fmt: skip
        k = Kernel(self.kernel_ids(), c.name, kind.family, stream,
                   collective=Collective(kind=kind, group=group, group_ranks=ranks, bytes=int(c.bytes), seq=seq),
                   predicted_s=c.seconds, provenance=c.provenance)  # fmt: skip
        return self.add(c.name, k, deps, OpCategory.COMMUNICATION)


# the kind of a micro-batch's step (its class is kind + 8 × virtual stage): what
# :func:`_steady_end` finds a stage's actions by
_WHAT = {"forward": 0, "backward": 1, "recv_act": 2, "send_act": 3, "recv_grad": 4, "send_grad": 5}
# a transfer's instance group: (gradients?, virtual stage offset): recv_act of v is act{v - 1}
_P2P_GROUP = {"recv_act": (False, -1), "send_act": (False, 0), "recv_grad": (True, 1), "send_grad": (True, 0)}


class _StepRecorder:
    """The same program as :class:`_StageEmitter` emits, as plain lists (no IR objects): what
    :func:`evaluate_pipeline` evaluates. Step ids are 1-based like the IR's op ids; a step's
    dependencies (at most three, each -1 where none) are 0-based indices in ``d0``–``d2``."""

    def __init__(self, stage: int, bcost: list[CommCost | None], instances: _Instances) -> None:
        self.stage, self.bcost = stage, bcost
        self.instances = instances  # shared by the stages of one program
        self.lane: list[int] = []
        self.dur: list[float] = []
        self.d0: list[int] = []
        self.d1: list[int] = []
        self.d2: list[int] = []
        self.inst: list[int] = []  # a collective's instance, else -1
        # a micro-batch's step: its micro-batch and class (kind + 8 × virtual stage); -1 for
        # the iteration's tail
        self.mb: list[int] = []
        self.cls: list[int] = []
        # 000 §III-D's intra-rank rule as trainsim.sim.edges.intra_rank_rule applies it, kept
        # while emitting: a collective starts no earlier than the first-issued step (on another
        # stream) that depends on the previous collective of its stream, if issued before it
        self.after: list[int] = []  # that step, else -1
        self._cover: list[int] = []  # per step: the last collective of its stream at or before it
        self._last_coll: dict[int, int] = {}
        self._first_dep: dict[int, int] = {}

    def _add(self, lane: int, seconds: float, deps: list[int | None], *, inst: int = -1,
             mb: int = -1, cls: int = -1) -> int:  # fmt: skip
        """``inst``: a collective's instance (:class:`_Instances`)."""
        self.mb.append(mb)
        self.cls.append(cls)
        lanes, cover, first = self.lane, self._cover, self._first_dep
        i = len(lanes)
        ds = [-1 if d is None else d - 1 for d in deps]
        if len(ds) > 3:  # pragma: no cover - the emitter passes at most three
            raise ValueError("a pipeline step has at most three dependencies")
        for w in ds:
            if w >= 0:
                c = cover[w]
                if c >= 0 and c not in first and lanes[w] != lane:
                    first[c] = i
        last_coll = self._last_coll
        if inst < 0:
            self.after.append(-1)
            cover.append(last_coll.get(lane, -1))
        else:
            prev = last_coll.get(lane)
            self.after.append(-1 if prev is None else first.get(prev, -1))
            last_coll[lane] = i
            cover.append(i)
        self.inst.append(inst)
        lanes.append(lane)
        self.dur.append(seconds)
        ds += [-1] * (3 - len(ds))
        self.d0.append(ds[0])
        self.d1.append(ds[1])
        self.d2.append(ds[2])
        return i + 1

    def compute(
        self, what: str, tag: tuple[int, int], seconds: float, deps: list[int | None]
    ) -> int:
        return self._add(COMPUTE, seconds, deps, mb=tag[0], cls=_WHAT[what] + 8 * tag[1])

    def optimizer(self, seconds: float, deps: list[int | None]) -> int:
        return self._add(COMPUTE, seconds, deps)

    def p2p(
        self, what: str, tag: tuple[int, int], link: _Link, seq: int, deps: list[int | None]
    ) -> int:
        cost = self.bcost[link.boundary % len(self.bcost)]
        grad, offset = _P2P_GROUP[what]
        iid = self.instances.p2p_one(grad, tag[1] + offset, seq)
        return self._add(link.stream, cost.seconds if cost else 0.0, deps, inst=iid, mb=tag[0],
                         cls=_WHAT[what] + 8 * tag[1])  # fmt: skip

    def collective(self, c: CommCost, kind: CollectiveKind, *, group: str, ranks: tuple[int, ...], seq: int,
                   stream: int, deps: list[int | None]) -> int:  # fmt: skip
        return self._add(stream, c.seconds, deps, inst=self.instances.named((group, seq), len(set(ranks))))

    def take_schedule(self, prog: _SchedulePart) -> tuple[int | None, int | None]:
        """The schedule part of this stage's program from ``prog`` (all stages' at once, as
        :func:`_emit_schedule` emits it through :meth:`compute` and :meth:`p2p`); returns its
        (last, last_send). Equality with the step-by-step emission, every list and the
        intra-rank state, is a test."""
        if self.lane:  # pragma: no cover - the intra-rank state below starts empty
            raise ValueError("the schedule is a stage program's first part")
        s = self.stage
        lo, hi = int(prog.step_base[s]), int(prog.step_base[s + 1])
        glob = slice(lo, hi)
        inst = np.full(hi - lo, -1, np.int64)
        # instances in this stage's issue order, stage after stage (numbering as step by step)
        pa = slice(int(prog.p2p_base[s]), int(prog.p2p_base[s + 1]))
        inst[prog.p2p_at[pa] - lo] = self.instances.p2p(prog.p2p_grad[pa], prog.p2p_group[pa], prog.p2p_mb[pa])
        self.lane += prog.lane[glob].tolist()
        self.dur += prog.dur[glob].tolist()
        self.d0 += prog.d0[glob].tolist()
        self.d1 += prog.d1[glob].tolist()
        self.d2 += prog.d2[glob].tolist()
        self.inst += inst.tolist()
        self.mb += prog.step_mb[glob].tolist()
        self.cls += prog.cls[glob].tolist()
        self.after += prog.after[glob].tolist()
        self._cover += prog.cover[glob].tolist()
        self._last_coll.update(prog.last_coll[s])
        fd = slice(int(prog.first_dep_base[s]), int(prog.first_dep_base[s + 1]))
        self._first_dep.update(zip(prog.first_dep_key[fd].tolist(), prog.first_dep_value[fd].tolist(), strict=True))
        last_send = prog.last_send[s]
        return int(prog.last_compute[s]) + 1, (int(last_send) + 1 if last_send >= 0 else None)


class _SchedulePart:
    """The micro-batches' part of every stage's program (what :func:`_emit_schedule` emits), as
    global arrays over all stages — one set of numpy calls for the whole pipeline, not one per
    stage. Steps are numbered globally, stage after stage (``step_base[s]``: stage ``s``'s
    first); the step arrays' values that name steps (dependencies, the intra-rank rule, cover,
    first dependents, each stage's last collective, compute and send) are each stage's own
    indices (0-based in its program, -1 for none). :meth:`_StepRecorder.take_schedule` copies a
    stage's slice; the point-to-point steps (``p2p_at``, global) get their instances there.

    An action is [receive] compute [send]. The compute depends on the last send before it,
    the previous compute and its receive; a send on its compute. The intra-rank rule: a
    receive starts after the compute that consumed the previous receive of its stream; a
    send after the first compute issued after the previous send of its stream."""

    def __init__(self, plan: Plan, stages: list[StageCost], bcost: list[CommCost | None]) -> None:
        chunks = plan.chunks
        pp, nv = plan.pp, plan.pp * chunks
        sa = schedule_arrays(plan.schedule, pp, plan.grad_accum, chunks)
        n_stages = len(stages)  # == pp (_record checks)
        na = len(sa.stage) // pp  # actions per stage: 2 m per model chunk (m >= 1, _record checks)
        fwd, mb = sa.forward, sa.mb
        stage = sa.stage
        v = sa.chunk * pp + stage
        has_r = np.where(fwd, v > 0, v < nv - 1)
        has_s = np.where(fwd, v < nv - 1, v > 0)
        count = has_r + 1 + has_s
        step_base = np.zeros(n_stages + 1, np.int64)
        np.cumsum(count.reshape(n_stages, na).sum(axis=1), out=step_base[1:])
        n = int(step_base[-1])
        base = step_base[:-1][stage]  # each action's stage's first step (global)
        first_step = np.cumsum(count) - count  # global
        cs = first_step + has_r  # the compute of each action (global)
        first_action = np.zeros(len(stage), bool)
        first_action[::na] = True
        last_action = np.zeros(len(stage), bool)
        last_action[na - 1 :: na] = True
        rs = np.flatnonzero(has_r)  # actions with a receive (at first_step), with a send (cs + 1)
        ss = np.flatnonzero(has_s)
        r_at, s_at = first_step[rs], cs[ss] + 1
        bsec = np.array([c.seconds if c else 0.0 for c in bcost])
        nb = len(bcost)
        fr, fs = fwd[rs], fwd[ss]
        # each action's chunk's pass (StageCost.chunk_seconds: the end part in its own chunk)
        per_f, per_b = zip(*(st.chunk_seconds(chunks, pp) for st in stages), strict=True)
        fwd_s = np.array(per_f, dtype=float)[stage, sa.chunk]
        bwd_s = np.array(per_b, dtype=float)[stage, sa.chunk]

        lane, dur, cls = np.empty(n, np.int64), np.empty(n), np.empty(n, np.int64)
        d0, d1, d2 = np.full(n, -1, np.int64), np.full(n, -1, np.int64), np.full(n, -1, np.int64)
        after, cover = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
        lane[cs] = COMPUTE
        dur[cs] = np.where(fwd, fwd_s, bwd_s)
        cls[cs] = np.where(fwd, _WHAT["forward"], _WHAT["backward"]) + 8 * v
        # the last send before each compute, on its stage: a running maximum of the sends'
        # steps in which each stage starts below its first step (earlier stages' steps are)
        sends = np.where(has_s, cs + 1, base - 1)
        before = np.concatenate(([-1], np.maximum.accumulate(sends)[:-1]))
        d0[cs] = np.where(~first_action & (before >= base), before, -1)
        d1[cs] = np.where(first_action, -1, np.concatenate(([-1], cs[:-1])))
        d2[cs[rs]] = r_at
        lane[r_at] = np.where(fr, RECV_PREV, RECV_NEXT)
        dur[r_at] = bsec[np.where(fr, v[rs] - 1, v[rs]) % nb]
        cls[r_at] = np.where(fr, _WHAT["recv_act"], _WHAT["recv_grad"]) + 8 * v[rs]
        lane[s_at] = np.where(fs, SEND_NEXT, SEND_PREV)
        dur[s_at] = bsec[np.where(fs, v[ss], v[ss] - 1) % nb]
        cls[s_at] = np.where(fs, _WHAT["send_act"], _WHAT["send_grad"]) + 8 * v[ss]
        d0[s_at] = cs[ss]
        cover[r_at], cover[s_at] = r_at, s_at
        # the intra-rank rule, per stage and stream (receives: per direction, likewise sends); a
        # send's later compute is the next action's (a stage's last send has none: it is never
        # a previous send, so its own compute only fills the place)
        next_compute = cs[np.where(last_action[ss], ss, ss + 1)]
        streams = ((fr, r_at, cs[rs], rs), (~fr, r_at, cs[rs], rs), (fs, s_at, next_compute, ss),
                   (~fs, s_at, next_compute, ss))  # fmt: skip
        self.last_coll: list[dict[int, int]] = [{} for _ in range(n_stages)]
        for sel, at, later, act in streams:
            k = np.flatnonzero(sel)
            if not len(k):
                continue
            same = stage[act[k[1:]]] == stage[act[k[:-1]]]
            after[at[k[1:]][same]] = later[k[:-1]][same]
            ends = np.flatnonzero(np.append(~same, True))  # each stage's last on the stream
            for e in ends.tolist():
                g = int(at[k[e]])
                self.last_coll[int(stage[act[k[e]]])][int(lane[g])] = g
        # global step indices → each stage's own
        step_stage = np.repeat(np.arange(n_stages), np.diff(step_base))
        own = step_base[:-1][step_stage]
        for arr in (d0, d1, d2, after, cover):
            np.subtract(arr, own, out=arr, where=arr >= 0)
        self.lane, self.dur, self.cls, self.d0, self.d1, self.d2 = lane, dur, cls, d0, d1, d2
        self.after, self.cover = after, cover
        self.step_mb = np.repeat(mb, count)
        self.step_base = step_base
        for last in self.last_coll:
            for ln, g in last.items():
                last[ln] = g - int(own[g])
        # instances: (direction, group's virtual stage, micro-batch), in issue order per stage;
        # groups act{v - 1} and act{v} (receive / send of activations), grad{v + 1} and grad{v}
        at = np.concatenate((r_at, s_at))
        group = np.concatenate((np.where(fr, v[rs] - 1, v[rs] + 1), v[ss]))
        is_grad = np.concatenate((~fr, ~fs))
        p2p_mb = np.concatenate((mb[rs], mb[ss]))
        order = np.argsort(at, kind="stable")
        self.p2p_at, self.p2p_group, self.p2p_grad, self.p2p_mb = at[order], group[order], is_grad[order], p2p_mb[order]
        self.p2p_base = np.searchsorted(self.p2p_at, step_base)
        # first dependents: a receive's is its compute, a send's the next action's compute
        more = ~last_action[ss]
        key = np.concatenate((r_at, s_at[more]))
        value = np.concatenate((cs[rs], cs[ss[more] + 1]))
        order = np.argsort(key, kind="stable")
        key, value = key[order], value[order]
        self.first_dep_base = np.searchsorted(key, step_base)
        self.first_dep_key = key - own[key]
        self.first_dep_value = value - own[value]
        self.last_compute = cs[na - 1 :: na] - step_base[:-1]
        last_send = np.full(n_stages, -1, np.int64)
        np.maximum.at(last_send, stage[ss], s_at - own[s_at])
        self.last_send = last_send.tolist()


class _Instances:
    """The collective instances of one pipeline program, numbered in order of first issue:
    point-to-point ones in a table by (direction, group's virtual stage, micro-batch) — groups
    ``act<g>`` and ``grad<g>``, ``g`` in 0..nv —, the others (gradient reduction, embedding
    sync, ZeRO gathers) by (group, seq)."""

    def __init__(self, nv: int, micro_batches: int) -> None:
        self.members: list[int] = []  # per instance: how many ranks take part
        self._named: dict[tuple[str, int], int] = {}
        self._groups, self._width = nv + 1, max(micro_batches, 1)
        self._table = np.full(2 * self._groups * self._width, -1, np.int64)

    def named(self, key: tuple[str, int], members: int) -> int:
        iid = self._named.get(key)
        if iid is None:
            iid = self._named[key] = len(self.members)
            self.members.append(members)
        return iid

    def p2p_one(self, grad: bool, group: int, mb: int) -> int:
        code = (int(grad) * self._groups + group) * self._width + mb
        iid = int(self._table[code])
        if iid < 0:
            iid = len(self.members)
            self._table[code] = iid
            self.members.append(2)
        return iid

    def p2p(self, grad: np.ndarray, group: np.ndarray, mb: np.ndarray) -> np.ndarray:
        """Instance ids of point-to-point steps given in issue order (new ones numbered in it)."""
        code = (grad.astype(np.int64) * self._groups + group) * self._width + mb
        ids = self._table[code]
        new = ids < 0
        if new.any():
            u, first = np.unique(code[new], return_index=True)
            u = u[np.argsort(first)]
            self._table[u] = np.arange(len(self.members), len(self.members) + len(u))
            self.members += [2] * len(u)
            ids = self._table[code]
        return ids


@dataclass(frozen=True, slots=True)
class PipelineTimes:
    """What :func:`evaluate_pipeline` returns: the iteration time, each stage's end and how many
    micro-batches were evaluated step by step (fewer than the plan's when the rest was carried
    forward by the certified period)."""

    predicted_step_s: float
    stage_end_s: tuple[float, ...]
    evaluated_micro_batches: int = 0


def evaluate_pipeline(model: ModelSpec, plan: Plan, system: SystemSpec, stages: list[StageCost],
                      *, periodic: bool = False) -> PipelineTimes:  # fmt: skip
    """The iteration time of :func:`build_workload`'s program without building the IR.

    Evaluates the same max-plus system as the simulator does on that workload (model-timed
    kernels, no host time, zero launch latency and kernel gap): a step starts at the latest of
    its stream's previous end, its dependencies' ends and — 000 §III-D's intra-rank rule, as
    :func:`trainsim.sim.edges.intra_rank_rule` applies it — the start of the first dependent of
    the previous collective on its stream; a collective's members all end at the latest
    member's start plus the largest member's duration. Each stage advances through its steps in
    issue order and parks on a collective whose peers have not arrived. Agreement with the
    simulator is a test (``tests/test_pipeline_eval.py``); the simulator stays the reference
    (timelines, critical paths). ~50× faster.

    ``periodic`` (1F1B and interleaved schedules, many micro-batches): evaluate a shorter
    iteration of ``m`` micro-batches (``m ≡ M`` modulo the period ``c``: 1 micro-batch, ``pp``
    interleaved; 1F1B from ``pp + 4``, interleaved from ``4 pp``) and carry it forward when
    :func:`_extrapolate` certifies it: the state at the end of each stage's steady part repeats
    exactly from one period to the next, and the program one period longer — recorded, not
    evaluated — satisfies every one of its equations at the short run's times with that period
    inserted. Then every further period moves each stage's end by the same ``Δ``: the result
    equals the full evaluation to ~1e-10 of it (a test, on random stage costs and on every
    vTrain configuration), not an extrapolation of a trend. Without a certificate (the pipeline is
    still settling: stages whose periods nearly tie), ``m`` doubles while all runs together
    stay within ``M / 2``, then all ``M`` are evaluated.
    """
    with gc_paused():  # tens of thousands of short-lived lists, no cycles
        return _evaluate_pipeline(model, plan, system, stages, periodic)


def _evaluate_pipeline(model: ModelSpec, plan: Plan, system: SystemSpec, stages: list[StageCost],
                       periodic: bool) -> PipelineTimes:  # fmt: skip
    m = plan.grad_accum
    if periodic and plan.schedule in ("1f1b", "interleaved"):
        c = plan.pp if plan.schedule == "interleaved" else 1
        # short runs that hold warm-up, two steady periods and cool-down (1F1B: pp - 1 warm-up
        # forwards; interleaved: about 2.5 pp micro-batches, then a period of pp); multiples of
        # c, as M is (Plan.validate)
        run = 4 * plan.pp if plan.schedule == "interleaved" else plan.pp + 4
        spent = 0
        # the first run if it is at most 0.6 M; longer ones while all runs stay within 0.5 M:
        # without any certificate the work is at most 1.6 M (1.5 M after a second run)
        while 5 * run <= 3 * m if not spent else 2 * (spent + run) <= m:
            spent += run
            short = replace(plan, global_batch=run * plan.micro_batch * plan.dp)
            longer = replace(plan, global_batch=(run + c) * plan.micro_batch * plan.dp)
            recs = _record(model, short, system, stages)
            starts, ends = _evaluate(recs, in_order=plan.chunks == 1)
            delta = _extrapolate(recs, starts, ends, _record(model, longer, system, stages), (m - run) // c)
            if delta is not None:
                shift = (m - run) // c * delta
                stage_end = tuple(_last(en) + shift for en in ends)
                return PipelineTimes(max(stage_end), stage_end, run)
            run *= 2
    _, ends = _evaluate(_record(model, plan, system, stages), in_order=plan.chunks == 1)
    stage_end = tuple(_last(en) for en in ends)
    return PipelineTimes(max(stage_end, default=0.0), stage_end, m)


def _last(ends: list[float | None]) -> float:
    return max((e for e in ends if e is not None), default=0.0)


# actions of a stage from which the schedule part is recorded as arrays, when the pipeline
# has six times as many: below, numpy's per-call cost outweighs the loop's (a stage's share
# of the arrays costs ~40 us to copy out, its steps ~2.5 us each step by step; 2026-11-27)
_VECTORIZED_FROM = 16
_LANES_BY_NUMPY_FROM = 192  # steps of a stage: its lanes found by a sort, not a loop


def _record(model: ModelSpec, plan: Plan, system: SystemSpec, stages: list[StageCost],
            *, vectorize_from: int = _VECTORIZED_FROM) -> list[_StepRecorder]:  # fmt: skip
    """The program of every stage: the schedule part as arrays for all stages at once
    (:class:`_SchedulePart`) when a stage has at least ``vectorize_from`` actions and the pipeline
    six times as many, else step by step through :func:`_emit_schedule`, as the IR emitter."""
    if len(stages) != plan.pp:
        raise ValueError(f"{len(stages)} stage costs for a plan of {plan.pp} pipeline stages")
    bcost = _p2p_costs(model, plan, system)
    chunks = plan.chunks
    instances = _Instances(plan.pp * chunks, plan.grad_accum)
    recs = []
    # every stage runs as many actions: 2 m per model chunk
    per_stage = 2 * plan.grad_accum * chunks
    vectorize = per_stage > 0 and per_stage >= vectorize_from and per_stage * plan.pp >= 6 * vectorize_from
    part = _SchedulePart(plan, stages, bcost) if vectorize else None
    sched = _schedule(plan) if part is None else None
    for s, st in enumerate(stages):
        r = _StepRecorder(s, bcost, instances)
        if part is not None:
            last, last_send = r.take_schedule(part)
        else:
            assert sched is not None
            last, last_send = _emit_schedule(r, s, st, plan, sched[s])
        _emit_tail(r, s, st, plan, last=last, last_send=last_send)
        recs.append(r)
    return recs


def _columns(recs: list[_StepRecorder]) -> dict[str, np.ndarray]:
    """The program of every stage as global arrays: indices shifted by each stage's offset
    (-1 stays -1), the lane made unique per stage, and each step's previous step on its lane."""
    sizes = [len(r.lane) for r in recs]
    n = sum(sizes)
    stage = np.repeat(np.arange(len(recs)), sizes)
    base = np.repeat(np.cumsum([0, *sizes[:-1]]), sizes)

    def column(name: str, dtype: type = np.int64) -> np.ndarray:
        return np.fromiter(chain.from_iterable(getattr(r, name) for r in recs), dtype, n)

    out = {"stage": stage, "base": base, "dur": column("dur", np.float64), "inst": column("inst"),
           "lane": column("lane") + (stage << 8)}  # fmt: skip
    for name in ("d0", "d1", "d2", "after"):
        d = column(name)
        out[name] = np.where(d >= 0, d + base, -1)
    order = np.lexsort((np.arange(n), out["lane"]))
    same = out["lane"][order[1:]] == out["lane"][order[:-1]]
    prev = np.full(n, -1, np.int64)
    prev[order[1:][same]] = order[:-1][same]
    out["prev"] = prev
    return out


def _steady_end(r: _StepRecorder) -> int:
    """The first step after the stage's steady part — after the backward that follows its last
    forward (the cool-down's first action, else the iteration's tail): a program one period
    longer has the same steps up to here, then one more period."""
    cls, mb = np.asarray(r.cls), np.asarray(r.mb)
    kind = cls % 8
    # each action's first step: its receive (the step before its compute), else its compute
    comp = np.flatnonzero((mb >= 0) & ((kind == _WHAT["forward"]) | (kind == _WHAT["backward"])))
    prev = np.maximum(comp - 1, 0)
    recv = (comp > 0) & (mb[prev] >= 0) & ((kind[prev] == _WHAT["recv_act"]) | (kind[prev] == _WHAT["recv_grad"]))
    starts = np.where(recv, prev, comp)
    forwards = np.flatnonzero((kind[starts] == _WHAT["forward"]) | (kind[starts] == _WHAT["recv_act"]))
    after = int(forwards[-1]) + 2 if len(forwards) else len(starts)
    return int(starts[after]) if after < len(starts) else int(np.count_nonzero(mb >= 0))


def _extrapolate(short: list[_StepRecorder], starts: list[list[float | None]],
                 ends: list[list[float | None]], longer: list[_StepRecorder], periods: int = 1) -> float | None:  # fmt: skip
    """``Δ`` if the iteration repeats with period ``Δ`` from the end of each stage's steady
    part (:func:`_steady_end`) on, else None. Two conditions, both checked on arrays:

    1. *The state repeats.* Every step before the cut that a later step reads — a dependency,
       a stream predecessor, the intra-rank rule's step on the same stage, or a collective peer
       on another stage — lies within ``reach`` periods of its stage's cut (``k`` steps each, the
       stage's extra steps in ``longer``); each step of those periods of ``short`` starts and
       ends exactly ``Δ`` after its counterpart one period earlier (Δ read off stage 0 at the
       cut; to the precision the carried ``periods`` allow, see below).
    2. *One inserted period obeys the program.* ``longer`` (one period more, recorded, not
       evaluated) at a candidate — a step before the cut at its time in ``short``, a later one
       at its counterpart's a period earlier plus Δ — satisfies every equation: each start the
       latest of its dependencies' and stream predecessor's ends, the intra-rank rule's start
       and zero; each end its start plus its duration, or a collective's latest start plus its
       largest duration. A DAG's max-plus system has one solution, so the candidate *is*
       ``longer``'s evaluation.

    Both hold to a tolerance: a residual recurs at every carried period, so it must stay
    within 1e-10 of the carried iteration divided by ``periods`` (and within 1e-12 of each
    step's time), but need not go below 64 ulps of the times compared (rounding, which a real
    steady state shows). The carried result is the full evaluation to ~1e-10 of it.

    The schedules' steady parts repeat their period, so a further inserted period meets the
    same equations around the cut — they read only the repeating state — and every stage's
    end moves by Δ per period (the max-plus argument: a state that repeats once repeats
    forever). Condition 1 is what the second half needs: the equations of (2) can hold while a
    path that is nowhere the latest grows a little faster than Δ and takes over many periods
    on (a review's case)."""
    k_steps, cuts = [], []
    for r, rl in zip(short, longer, strict=True):
        k = len(rl.lane) - len(r.lane)
        cut = _steady_end(r)
        if k <= 0 or cut - k < 1:  # a whole period (and a step before it) precedes the cut
            return None
        k_steps.append(k)
        cuts.append(cut)
    col = _columns(longer)
    stage, local = col["stage"], np.arange(len(col["dur"])) - col["base"]
    cut_of, k_of = np.asarray(cuts)[stage], np.asarray(k_steps)[stage]
    later = local >= cut_of
    short_base = np.cumsum([0] + [len(r.lane) for r in short[:-1]])
    src = short_base[stage] + local - np.where(later, k_of, 0)
    s_short = np.fromiter(chain.from_iterable(starts), np.float64)
    e_short = np.fromiter(chain.from_iterable(ends), np.float64)
    c0 = cuts[0] - 1  # stage 0's last step before the cut, and its counterpart a period earlier
    delta = float(e_short[c0] - e_short[c0 - k_steps[0]])
    if not np.isfinite(delta) or delta < 0:
        return None
    # the state at the cut: every step before it that a step after it reads — on the same
    # stage, or a collective peer on another — lies within ``reach`` periods of its stage's
    # cut; all of them must repeat exactly, one period to the next. Without this, a path that
    # is not the latest at the cut but grows faster (nearly tied periods) can take over many
    # periods on while the equations around one inserted period still hold.
    read = [col[name][later] for name in ("d0", "d1", "d2", "prev", "after")]
    inst = col["inst"]
    coll = np.flatnonzero(inst >= 0)
    if len(coll):
        crossing = np.zeros(inst.max() + 1, bool)
        crossing[inst[coll[later[coll]]]] = True
        read.append(coll[crossing[inst[coll]]])
    read_before = np.concatenate(read)
    read_before = read_before[read_before >= 0]
    read_before = read_before[~later[read_before]]
    reach = int(np.max(-(-(cut_of - local)[read_before] // k_of[read_before]), initial=1))
    window: list[np.ndarray] = []
    offset = 0
    for r, cut, k in zip(short, cuts, k_steps, strict=True):
        if cut - (reach + 1) * k < 0:
            return None
        window.append(np.arange(cut - reach * k, cut) + offset)
        offset += len(r.lane)
    w = np.concatenate(window)
    k_w = np.concatenate([np.full(len(x), k) for x, k in zip(window, k_steps, strict=True)])
    # the tolerance (see the docstring; a review's case: two paths whose periods differ by
    # 2e-8 s, inside 1e-12 of the window's 37,000 s, came out 1.7e-9 off after 10,000 periods)
    end = float(max(e_short.max(), 0.0))
    carried = 1e-10 * (end + periods * delta) / max(periods, 1)

    def within(err: np.ndarray, mag: np.ndarray) -> bool:
        return bool(np.all(np.abs(err) <= np.maximum(np.minimum(1e-12 * mag, carried), 64 * np.spacing(mag))))

    if not all(within(t[w] - t[w - k_w] - delta, np.abs(t[w])) for t in (s_short, e_short)):
        return None
    st = s_short[src] + np.where(later, delta, 0.0)
    en = e_short[src] + np.where(later, delta, 0.0)
    # the equations of ``longer`` at the candidate; index n reads 0.0 (no such predecessor)
    en_x, st_x = np.append(en, 0.0), np.append(st, 0.0)
    rhs_start = np.maximum.reduce([en_x[col[d]] for d in ("d0", "d1", "d2", "prev")] + [st_x[col["after"]]])
    rhs_start = np.maximum(rhs_start, 0.0)
    rhs_end = st + col["dur"]
    if len(coll):
        first, longest = np.full(inst.max() + 1, -np.inf), np.full(inst.max() + 1, -np.inf)
        np.maximum.at(first, inst[coll], st[coll])
        np.maximum.at(longest, inst[coll], col["dur"][coll])
        rhs_end[coll] = first[inst[coll]] + longest[inst[coll]]
    # the same budget: a residual recurs at every inserted period
    ok = all(within(have - want, np.maximum(np.abs(have), np.abs(want))) for have, want in ((st, rhs_start), (en, rhs_end)))
    return delta if ok else None


class _Arrivals:
    """The collective instances of one evaluation: members still to come, the latest start and
    the largest duration so far, and who arrived ((stage, step) pairs). Every member ends at the
    latest member's start plus the largest member's duration."""

    __slots__ = ("arrived", "dur", "expected", "start")

    def __init__(self, recs: list[_StepRecorder]) -> None:
        self.expected = list(recs[0].instances.members) if recs else []
        self.start = [0.0] * len(self.expected)
        self.dur = [0.0] * len(self.expected)
        self.arrived: list[list[tuple[int, int]]] = [[] for _ in self.expected]

    def arrive(self, k: int, s: int, i: int, t: float, d: float) -> float | None:
        """Step ``i`` of stage ``s`` joins instance ``k`` at ``t`` for ``d``; the members' end
        once it was the last to come (its members are ``arrived[k]``), else None."""
        arr = self.arrived[k]
        if not arr or t > self.start[k]:
            self.start[k] = t
        if d > self.dur[k]:  # noqa: PLR1730 (hot path: a call to max costs more)
            self.dur[k] = d
        arr.append((s, i))
        self.expected[k] -= 1
        return None if self.expected[k] else self.start[k] + self.dur[k]


def _evaluate(
    recs: list[_StepRecorder], *, in_order: bool = True
) -> tuple[list[list[float | None]], list[list[float | None]]]:
    """Every step's start and end, per stage: by :func:`_evaluate_in_order` when ``in_order``
    (1F1B and GPipe programs; it gives up on a program it cannot order), else — or then — by
    :func:`_evaluate_lanes`. The two compute the same maxima of the same terms, so the same
    floats (a test); the first visits each stage's steps once, in issue order, and is ~2.5×
    faster on long pipelines."""
    if in_order and (done := _evaluate_in_order(recs)) is not None:
        return done
    return _evaluate_lanes(recs)


def _evaluate_in_order(
    recs: list[_StepRecorder],
) -> tuple[list[list[float | None]], list[list[float | None]]] | None:
    """Each stage's program evaluated in issue order, one position per stage: a step needs
    its stream's previous step, its dependencies and its intra-rank step, all issued before it
    on its stage, so only a collective's end (peers on other stages not yet arrived) can hold a
    stage up; it parks on that step and is woken when the collective completes. Equivalent to
    :func:`_evaluate_lanes` — the same equations, solved in another order — but one position
    per stage instead of one per stream: ~8× fewer resumptions (1,375 against 10,656 on a
    32-stage, 36-micro-batch run), ~2.5× faster. A stage held at a step stops
    the steps issued after it on its other streams. 1F1B and GPipe programs never deadlock so
    (in random programs of up to 16 stages and 40 micro-batches, a test); interleaved ones can
    (a stage held at a receive whose sender waits for a step this stage issues later), and a
    program that deadlocks returns None."""
    n_stages = len(recs)
    starts: list[list[float | None]] = [[None] * len(r.lane) for r in recs]
    ends: list[list[float | None]] = [[None] * len(r.lane) for r in recs]
    pos = [0] * n_stages
    last_on_lane: list[dict[int, int]] = [{} for _ in recs]  # per stage: stream → its last step so far
    parked: list[dict[int, list[int]]] = [{} for _ in recs]  # per stage: step → stages held by its end
    coll = _Arrivals(recs)
    queue = list(range(n_stages - 1, -1, -1))  # popped from the end: stage 0 first
    queued = [True] * n_stages
    while queue:
        s = queue.pop()
        queued[s] = False
        r = recs[s]
        st, en, lanes, d0, d1, d2 = starts[s], ends[s], r.lane, r.d0, r.d1, r.d2
        af, durs, insts, last, held = r.after, r.dur, r.inst, last_on_lane[s], parked[s]
        p, n = pos[s], len(lanes)
        while p < n:
            ln = lanes[p]
            t = 0.0
            q = last.get(ln, -1)
            if q >= 0:
                e = en[q]
                if e is None:
                    held.setdefault(q, []).append(s)
                    break
                t = e
            # the dependencies unrolled (hot loop); each -1 where none
            w = d0[p]
            if w >= 0:
                e = en[w]
                if e is None:
                    held.setdefault(w, []).append(s)
                    break
                if e > t:  # noqa: PLR1730 (hot loop: a call to max costs more)
                    t = e
            w = d1[p]
            if w >= 0:
                e = en[w]
                if e is None:
                    held.setdefault(w, []).append(s)
                    break
                if e > t:  # noqa: PLR1730
                    t = e
            w = d2[p]
            if w >= 0:
                e = en[w]
                if e is None:
                    held.setdefault(w, []).append(s)
                    break
                if e > t:  # noqa: PLR1730
                    t = e
            a = af[p]
            if a >= 0:
                sa = st[a]  # issued before this step: started
                if sa is not None and sa > t:
                    t = sa
            st[p] = t
            last[ln] = p
            k = insts[p]
            if k < 0:
                en[p] = t + durs[p]
            else:
                end = coll.arrive(k, s, p, t, durs[p])
                if end is not None:
                    for ms, mi in coll.arrived[k]:
                        ends[ms][mi] = end
                        waiting = parked[ms].pop(mi, None)
                        for h in waiting or ():
                            if not queued[h]:
                                queued[h] = True
                                queue.append(h)
            p += 1
        pos[s] = p
    if any(pos[s] < len(r.lane) for s, r in enumerate(recs)):
        return None
    return starts, ends


def _evaluate_lanes(
    recs: list[_StepRecorder],
) -> tuple[list[list[float | None]], list[list[float | None]]]:
    """Every stream of every stage is a lane advancing through its steps in issue order (as in
    :mod:`trainsim.sim.engine`); a lane needing a time not yet known parks on that step — on
    its start (the intra-rank rule) or on its end (dependencies, the stream's previous step: a
    collective's end waits for its peers) — and is woken when the step gets it. Returns every
    step's start and end, per stage."""
    starts: list[list[float | None]] = [[None] * len(r.lane) for r in recs]
    ends: list[list[float | None]] = [[None] * len(r.lane) for r in recs]
    lanes: list[tuple[int, list[int]]] = []  # (stage, its steps on this stream)
    for s, r in enumerate(recs):
        if len(r.lane) < _LANES_BY_NUMPY_FROM:
            by_lane: dict[int, list[int]] = {}
            for i, ln in enumerate(r.lane):
                by_lane.setdefault(ln, []).append(i)
            lanes.extend((s, steps) for steps in by_lane.values())
        else:
            order = np.argsort(np.asarray(r.lane), kind="stable")
            cuts = np.flatnonzero(np.diff(np.asarray(r.lane)[order])) + 1
            lanes.extend((s, steps.tolist()) for steps in np.split(order, cuts))
    pos = [0] * len(lanes)
    clock = [0.0] * len(lanes)
    # per stage: step → lanes parked until it starts / until it ends
    on_start: list[dict[int, list[int]]] = [{} for _ in recs]
    on_end: list[dict[int, list[int]]] = [{} for _ in recs]
    coll = _Arrivals(recs)
    queue = list(range(len(lanes)))
    queued = [True] * len(lanes)

    def wake(lanes_parked: list[int]) -> None:
        for w in lanes_parked:
            if not queued[w]:
                queued[w] = True
                queue.append(w)

    # per lane, what its loop reads (looked up once, not at every resumption)
    deps = [list(zip(r.d0, r.d1, r.d2, strict=True)) for r in recs]
    context = [(s, steps, len(steps), starts[s], ends[s], on_start[s], on_end[s], recs[s].after,
                deps[s], recs[s].dur, recs[s].inst) for s, steps in lanes]  # fmt: skip

    while queue:
        g = queue.pop()
        queued[g] = False
        s, steps, n, st, en, ws, we, af, dep, durs, insts = context[g]
        p, t0 = pos[g], clock[g]
        while p < n:
            i = steps[p]
            if st[i] is None:
                t = t0
                for w in dep[i]:
                    if w >= 0:
                        e = en[w]
                        if e is None:
                            we.setdefault(w, []).append(g)
                            break
                        if e > t:  # noqa: PLR1730 (hot loop: a call to max costs more)
                            t = e
                else:
                    a = af[i]
                    if a >= 0:
                        sa = st[a]
                        if sa is None:
                            ws.setdefault(a, []).append(g)
                            break
                        if sa > t:  # noqa: PLR1730
                            t = sa
                    st[i] = t
                    if ws and i in ws:
                        wake(ws.pop(i))
                    k = insts[i]
                    if k < 0:
                        en[i] = t + durs[i]
                        if we and i in we:
                            wake(we.pop(i))
                    else:
                        end = coll.arrive(k, s, i, t, durs[i])
                        if end is not None:
                            for ms, mi in coll.arrived[k]:
                                ends[ms][mi] = end
                                if mi in on_end[ms]:
                                    wake(on_end[ms].pop(mi))
                    e = en[i]
                    if e is not None:
                        t0 = e
                        p += 1
                        continue
                    we.setdefault(i, []).append(g)  # a collective whose peers have not all arrived
                    break
                break  # a dependency has not ended
            e = en[i]  # started earlier; parked until its peers arrived
            if e is None:  # pragma: no cover - woken only once it ends
                we.setdefault(i, []).append(g)
                break
            t0 = e
            p += 1
        pos[g], clock[g] = p, t0
    if any(pos[g] < len(steps) for g, (_, steps) in enumerate(lanes)):  # pragma: no cover
        raise RuntimeError("pipeline program deadlocked: a collective's peers never arrive")
    return starts, ends


def _emit_stage(
    e: _StageEmitter | _StepRecorder, s: int, st: StageCost, plan: Plan, actions: list[Action]
) -> None:
    """One stage's program in issue order, through either emitter (IR or light steps)."""
    last, last_send = _emit_schedule(e, s, st, plan, actions)
    _emit_tail(e, s, st, plan, last=last, last_send=last_send)


def _emit_schedule(
    e: _StageEmitter | _StepRecorder, s: int, st: StageCost, plan: Plan, actions: list[Action]
) -> tuple[int | None, int | None]:
    """The micro-batches' part of a stage's program: returns its (last step, last send)."""
    chunks = plan.chunks
    nv, pp = plan.pp * chunks, plan.pp
    last_send: int | None = None
    last: int | None = None
    links: dict[tuple[str, int], _Link] = {}  # per virtual stage, shared by its micro-batches

    def link(kind: str, v: int) -> _Link:
        ln = links.get((kind, v))
        if ln is None:
            ln = links[(kind, v)] = {
                "recv_act": lambda: _Link(CollectiveKind.RECV, RECV_PREV, f"act{v - 1}", (v - 1) % pp, v - 1),
                "send_act": lambda: _Link(CollectiveKind.SEND, SEND_NEXT, f"act{v}", (v + 1) % pp, v),
                "recv_grad": lambda: _Link(CollectiveKind.RECV, RECV_NEXT, f"grad{v + 1}", (v + 1) % pp, v),
                "send_grad": lambda: _Link(CollectiveKind.SEND, SEND_PREV, f"grad{v}", (v - 1) % pp, v - 1),
            }[kind]()  # fmt: skip
        return ln

    chunk_f, chunk_b = st.chunk_seconds(chunks, pp)  # the end part in its own chunk
    for act in actions:
        v = act.chunk * pp + s  # virtual stage
        tag = (act.mb, v)  # the IR emitter names ops "<what> mb<mb> v<v>"
        deps: list[int | None] = [last_send, last]
        if act.kind == "F":
            if v > 0:
                deps.append(e.p2p("recv_act", tag, link("recv_act", v), act.mb, []))
            last = e.compute("forward", tag, chunk_f[act.chunk], deps)
            if v < nv - 1:
                last_send = e.p2p("send_act", tag, link("send_act", v), act.mb, [last])
        else:
            if v < nv - 1:
                deps.append(e.p2p("recv_grad", tag, link("recv_grad", v), act.mb, []))
            last = e.compute("backward", tag, chunk_b[act.chunk], deps)
            if v > 0:
                last_send = e.p2p("send_grad", tag, link("send_grad", v), act.mb, [last])
    return last, last_send


def _emit_tail(e: _StageEmitter | _StepRecorder, s: int, st: StageCost, plan: Plan, *,
               last: int | None, last_send: int | None) -> None:  # fmt: skip
    """Once per iteration, after the micro-batches: gradient reduction (comm stream), the
    tied-embedding sync, the update and ZeRO's gathers (with ``overlap_param_gather`` their
    part the next iteration's first forward does not hide, :func:`_overlap_param_gather`)."""
    pp = plan.pp
    dep: list[int | None] = [last, last_send]
    for i, c in enumerate(x for x in st.dp_comm if x.kind != "all_gather"):
        dep = [e.collective(c, CollectiveKind(c.kind), group=f"dp{s}", ranks=(s,), seq=i,
                            stream=DP_STREAM, deps=dep)]  # fmt: skip
    if st.embedding_comm is not None:
        dep = [e.collective(st.embedding_comm, CollectiveKind.ALL_REDUCE, group="embedding", ranks=(0, pp - 1), seq=0, stream=DP_STREAM, deps=dep)]  # fmt: skip
    opt = e.optimizer(st.optimizer_s, dep)
    for i, c in enumerate(x for x in st.dp_comm if x.kind == "all_gather"):
        opt = e.collective(c, CollectiveKind.ALL_GATHER, group=f"dp{s}-ag", ranks=(s,), seq=i,
                           stream=COMPUTE, deps=[opt])  # fmt: skip


def _p2p_costs(model: ModelSpec, plan: Plan, system: SystemSpec) -> list[CommCost | None]:
    comm = PlanComm(model, plan, system)
    return [comm.pp_p2p(b) for b in range(plan.pp)] if plan.pp > 1 else [None]


def _schedule(plan: Plan) -> list[list[Action]]:
    chunks = plan.chunks
    return schedule(plan.schedule, plan.pp, plan.grad_accum, chunks)


def build_workload(
    model: ModelSpec, plan: Plan, system: SystemSpec, stages: list[StageCost]
) -> Workload:
    """The iteration as IR: one rank graph per pipeline stage (see the module docstring)."""
    sched = _schedule(plan)
    bcost = _p2p_costs(model, plan, system)
    graphs = []
    for s, st in enumerate(stages):
        e = _StageEmitter(s, bcost)
        _emit_stage(e, s, st, plan, sched[s])
        graphs.append(RankGraph(rank=s, ops=tuple(e.ops), streams=(COMPUTE, DP_STREAM, SEND_NEXT, SEND_PREV, RECV_PREV, RECV_NEXT),
                                represents=plan.tp * plan.cp * plan.dp, device=system.device,
                                metadata={"role": f"pipeline stage {s}", "layers": st.layers}))  # fmt: skip
    groups = {f"dp{s}": (s,) for s in range(plan.pp)}
    return Workload(ranks=tuple(graphs), process_groups=groups,
                    metadata={"source": "trainsim.builders.llm", "model": model.name, "plan": plan.label(),
                              "system": system.name})  # fmt: skip


def resolve_system(system: SystemSpec | str) -> SystemSpec:
    return get_system(system) if isinstance(system, str) else system


__all__ = [
    "Action",
    "StageCost",
    "build_workload",
    "closed_form_001",
    "closed_form_003",
    "stage_costs",
]
