"""The collectives of a transformer plan, placed on a system and timed by the comm models.

Rank layout (Megatron's): tensor parallel innermost, then context, data, pipeline outermost;
a group of ``size`` ranks ``stride`` apart has ``min(size, gpus_per_node // stride)`` members
per node (one when the stride spans a node). Each collective is timed by
:func:`trainsim.comm.predict_collective` on the system (calibrated on measurements of that
system where they exist, spec-based hierarchical alpha-beta otherwise; provenance kept).

Per layer and micro-batch (Megatron, Shoeybi et al. 2019 §3; Korthikanti et al. 2022 §4):

* TP without SP: one all-reduce of the ``[b, s, d]`` activation after attention and one after
  the MLP in the forward, two in the backward (the conjugate ``f``/``g`` operators); with a
  parallel residual (GPT-NeoX) one forward all-reduce serves both.
* TP with SP: each of those becomes an all-gather plus a reduce-scatter of the same tensor
  (the same bytes moved, no redundant norm/dropout work).
* TP outside the layers, per micro-batch (:meth:`PlanComm.tp_end`): the vocabulary-parallel
  embedding's output all-reduced in the forward (with SP reduce-scattered, its backward an
  all-gather), the output layer's input gradient all-reduced in the backward (with SP its input
  all-gathered in the forward and the gradient reduce-scattered), and the vocabulary-parallel
  cross-entropy's three fp32 ``[b, s]`` all-reduces (max, target logit, sum of exponentials).
* CP (ring attention): each rank passes its K/V block around the ring, ``cp - 1`` steps per
  layer forward (twice in the backward, K/V and their gradients; once more in a full or
  selective recomputation, which re-runs the attention core), overlapped with the attention
  of the block it holds; only the part longer than that attention is exposed. A sliding
  window's layers (flash attention) run TransformerEngine's KV all-gather CP instead, its
  p2p ring refusing a window: K and V all-gathered, exposed, again in the backward with dK/dV
  reduce-scattered (:meth:`PlanComm.cp_window_layer`). ``Plan.cp_comm`` (Megatron's
  ``--cp-comm-type``) ``all_gather`` runs that on every layer, ``a2a`` (DeepSpeed-Ulysses)
  all-to-alls Q, K, V and the output instead, exposed (:meth:`PlanComm.cp_exposed_layer`).
* EP (MoE): an all-to-all dispatch and combine of ``top_k`` token copies per layer, forward
  and backward.
* PP: one send/recv of the ``[b, s, d]`` activation (its gradient backward) per micro-batch and
  stage boundary, by every TP rank (``/tp`` with SP, whose activations are split already).
  Not modelled: Megatron-LM's older scatter-gather optimisation (Narayanan et al. 2021 §4.1:
  each TP rank sends 1/tp, then an all-gather over NVLink; Megatron-core dropped it) and
  DeepSpeed's partitioned pipeline sends, which do the same without SP; sends across nodes
  then cost up to tp× too much here.
* DP: the stage's gradients (``grad_bytes`` per parameter: 2 for fp16, 4 for bf16 as Megatron
  accumulates and reduces bf16 gradients in fp32) all-reduced once per iteration (ZeRO 0/1), or
  reduce-scattered (ZeRO 2); ZeRO 1/2 then all-gather the updated fp16/bf16 weights. ZeRO 1 is
  DeepSpeed's stage 1, which all-reduces the gradients although each rank keeps only its shard
  (DeepSpeed issue #264, "reduce_scatter for stage 1 is not implemented"; discussion #5560
  profiles GPT-NeoX's ZeRO-1 calling one large all-reduce): 1.5x the traffic of the ZeRO
  paper's reduce-scatter + all-gather (§7.2.1), which Megatron-LM's distributed optimizer
  does (``Plan.dist_optimizer``: ZeRO-1 with ZeRO-2's traffic). Paper 001's GPT-NeoX runs are
  DeepSpeed ZeRO-1. ZeRO 3
  all-gathers every layer's weights before its forward, backward and recomputation and
  reduce-scatters its gradients after the backward, every micro-batch, prefetched on a side
  stream: a layer pass takes the longer of its compute and its collectives.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import lru_cache

from trainsim.builders.memory import cp_attention_bytes
from trainsim.builders.plan import Plan
from trainsim.builders.spec import ModelSpec
from trainsim.comm import predict_collective
from trainsim.comm.registry import USER_MODELS_ENV as USER_COMM_MODELS_ENV
from trainsim.errors import ConfigError, ModelError
from trainsim.hardware import SystemSpec


@dataclass(frozen=True, slots=True)
class CommCost:
    name: str
    kind: str
    bytes: float
    group_size: int
    per_node: int
    seconds: float
    provenance: str


@dataclass(frozen=True, slots=True)
class CPWindow:
    """Layers whose context-parallel collectives are exposed (:meth:`PlanComm.cp_exposed_layer`):
    a sliding-window model's windowed layers under the p2p ring (:meth:`PlanComm.cp_window_layer`),
    or every layer under ``cp_comm`` ``all_gather`` or ``a2a``. ``layers`` the share of the
    layers that run them (the rest keep the ring); ``rank_share`` one such layer's attention
    work on the busiest rank over a causal layer's; ``work_fraction`` the attention work
    averaged over all layers (the share the attention core is costed at); ``comm`` one such
    layer's exposed collectives."""

    layers: float
    rank_share: float
    work_fraction: float
    comm: tuple[CommCost, ...]

    @property
    def exposed_s(self) -> float:
        return sum(c.seconds for c in self.comm)


def check_job_placement(gpus: int, system: SystemSpec) -> None:
    """A job of ``gpus`` GPUs on ``system``: whole nodes beyond one, a network tier across them,
    no more nodes than the system has (one-line ConfigErrors)."""
    gpn = system.gpus_per_node
    if gpus > gpn and gpus % gpn:
        raise ConfigError(f"plan: {gpus} GPUs do not fill whole nodes of {gpn} on {system.name}")
    nodes = -(-gpus // gpn)
    if nodes > 1 and system.cluster_tier is None:
        raise ConfigError(f"plan: {gpus} GPUs take {nodes} nodes of {gpn}, but {system.name} has no "
                          "network tier across nodes (a tier with scope: cluster)")  # fmt: skip
    if system.max_nodes is not None and nodes > system.max_nodes:
        raise ConfigError(f"plan: {gpus} GPUs take {nodes} nodes of {gpn}; {system.name} has "
                          f"{system.max_nodes} (its max_nodes)")  # fmt: skip


def per_node(size: int, stride: int, gpus_per_node: int) -> int:
    """Members per node of a group of ``size`` ranks ``stride`` apart (Megatron layout)."""
    if size <= 1:
        return 1
    if stride >= gpus_per_node:
        return 1
    k = min(size, max(gpus_per_node // stride, 1))
    return math.gcd(size, k)


_SYSTEMS: dict[str, SystemSpec] = {}


def _predict(system: SystemSpec, kind: str, nbytes: float, size: int, pn: int, *, user: str) -> tuple[float, str]:
    """One collective's time (cached across plans: searches ask the same ones again; keyed by
    the system's name, since hashing the pydantic spec costs more than the lookup, and by
    ``user``, the ``--comm-models`` setting, which changes the answers)."""
    if _SYSTEMS.setdefault(system.name, system) is not system:
        _SYSTEMS[system.name] = system
        _predict_named.cache_clear()  # another spec under the same name (a YAML edit): start over
    return _predict_named(system.name, kind, nbytes, size, pn, user)


@lru_cache(maxsize=65536)
def _predict_named(name: str, kind: str, nbytes: float, size: int, pn: int, _user: str = "") -> tuple[float, str]:  # fmt: skip
    system = _SYSTEMS[name]
    if size <= 1 or nbytes <= 0:
        return 0.0, "none"
    try:
        p = predict_collective(kind, nbytes, size, system=system, gpus_per_node=pn)
    except ModelError as e:
        raise ModelError(f"{kind} of {nbytes:.3g} B on {size} ranks ({pn} per node) of {system.name}: {e}") from None  # fmt: skip
    return p.duration_s, p.provenance


class PlanComm:
    """Times of the plan's collectives on ``system`` (cached per kind, size, placement)."""

    def __init__(self, model: ModelSpec, plan: Plan, system: SystemSpec) -> None:
        self.model, self.plan, self.system = model, plan, system
        self.gpn = system.gpus_per_node
        check_job_placement(plan.gpus, system)
        self.act_bytes = 2 if plan.dtype in ("fp16", "bf16") else 4
        self.user = os.environ.get(USER_COMM_MODELS_ENV, "")  # --comm-models, once per plan
        self._p2p: dict[bool, CommCost] = {}  # pp_p2p by placement: on one node or not

    def _time(self, kind: str, nbytes: float, size: int, pn: int) -> tuple[float, str]:
        return _predict(self.system, kind, nbytes, size, pn, user=self.user)

    def cost(self, name: str, kind: str, nbytes: float, size: int, stride: int) -> CommCost:
        pn = per_node(size, stride, self.gpn)
        s, prov = self._time(kind, float(nbytes), size, pn)
        return CommCost(name, kind, nbytes, size, pn, s, prov)

    # --- per layer, per micro-batch ---------------------------------------------------------

    def _tokens(self) -> int:
        return self.plan.micro_batch * (self.plan.seq(self.model) // self.plan.cp)

    def tp_layer(self, phase: str) -> list[CommCost]:
        """TP collectives of one layer's forward or backward (2 each, see the module doc)."""
        t = self.plan.tp
        if t <= 1:
            return []
        nbytes = self._tokens() * self.model.hidden * self.act_bytes
        if self.plan.sp:
            ag = self.cost("tp_all_gather", "all_gather", nbytes, t, 1)
            rs = self.cost("tp_reduce_scatter", "reduce_scatter", nbytes, t, 1)
            return [ag, rs, ag, rs]
        ar = self.cost("tp_all_reduce", "all_reduce", nbytes, t, 1)
        if self.model.parallel_residual and phase == "fwd":
            # x + attn(ln1 x) + mlp(ln2 x): both partial sums are reduced together (GPT-NeoX;
            # 001 Table IV: GPT-20B has one forward sync per encoder, two backward)
            return [ar]
        return [ar, ar]

    def tp_end(self, part: str, phase: str) -> list[CommCost]:
        """TP collectives of the model's ends, per micro-batch (``part`` ``embedding`` or
        ``head``), as Megatron-core runs them: VocabParallelEmbedding ends in
        ``reduce_from_tensor_model_parallel_region`` (forward all-reduce of the ``[b, s, d]``
        output; backward none) or with SP ``reduce_scatter_to_sequence_parallel_region``
        (backward its all-gather); the output layer, a ColumnParallelLinear, takes its input
        through ``copy_to_tensor_model_parallel_region`` (backward all-reduce of the gradient)
        or with SP ``gather_from_sequence_parallel_region`` (forward all-gather, backward
        reduce-scatter), and ``vocab_parallel_cross_entropy`` all-reduces three fp32 ``[b, s]``
        tensors in the forward (the logits' max, the target's logit, the sum of exponentials)."""
        t = self.plan.tp
        if t <= 1:
            return []
        nbytes = self._tokens() * self.model.hidden * self.act_bytes
        sp = self.plan.sp
        if part == "embedding":
            if phase == "fwd":
                kind = "reduce_scatter" if sp else "all_reduce"
                return [self.cost(f"tp_embedding_{kind}", kind, nbytes, t, 1)]
            return [self.cost("tp_embedding_all_gather", "all_gather", nbytes, t, 1)] if sp else []
        if phase == "fwd":
            ce = self.cost("tp_cross_entropy_all_reduce", "all_reduce", self._tokens() * 4, t, 1)
            return ([self.cost("tp_head_all_gather", "all_gather", nbytes, t, 1)] if sp else []) + [ce, ce, ce]
        kind = "reduce_scatter" if sp else "all_reduce"
        return [self.cost(f"tp_head_{kind}", kind, nbytes, t, 1)]

    def cp_layer(self, phase: str) -> CommCost | None:
        """Ring-attention K/V exchange of one layer (all ``cp - 1`` steps; ``cp_comm`` p2p only)."""
        cp = self.plan.cp
        if cp <= 1 or self.plan.cp_comm != "p2p":
            return None
        kv = cp_attention_bytes(self.model, self.plan).kv_bytes  # K and V (MLA's values d_v wide)
        step = self.cost("cp_send_recv", "send", kv, 2, self.plan.tp)
        mult = (cp - 1) * (2 if phase == "bwd" else 1)
        return CommCost(
            "cp_ring", "send", kv * mult, cp, step.per_node, step.seconds * mult, step.provenance
        )

    def cp_window_layer(self, phase: str) -> CPWindow | None:
        """Context parallelism on a sliding-window model's windowed layers (flash attention,
        ``cp > 1``, a window shorter than the sequence), as TransformerEngine runs it.

        TransformerEngine's p2p ring (Megatron's default ``--cp-comm-type``, the one
        :meth:`cp_layer` costs) refuses a window: ``attn_forward_func_with_cp`` asserts that a
        sliding window comes with ``cp_comm_type`` ``a2a`` or ``all_gather`` only (TE
        ``dot_product_attention/context_parallel.py``; TE PR #1060 added the all-gather variant
        for it; Megatron-LM PR #1160 exposed the choice, and ``--cp-comm-type`` takes one type
        per layer). So the windowed layers are costed as the all-gather variant (Llama 3's,
        Dubey et al. 2024 §3.3.2; the sequence split stays the load-balanced ``2·cp`` chunks),
        the other layers keep the ring. Its collectives are exposed (TE: "KV all-gather between
        CP ranks is exposed"; nothing overlaps them): the forward all-gathers K and V over the
        ``cp`` ranks before its two chunk kernels; the backward gathers them again (only the
        local K/V are saved) and reduce-scatters dK and dV. There is no ring step to skip:
        every rank gathers the whole K/V, though its window reads only a slice
        (:meth:`ModelSpec.cp_window_rank_shares` for the work). ``cp_comm`` a2a (Ulysses), which
        also takes a window, and all_gather run every layer their way (:meth:`cp_exposed_layer`)."""
        m, cp = self.model, self.plan.cp
        if cp <= 1 or self.plan.attention != "flash" or not (phi := m.windowed_layers(self.plan.seq(m))):
            return None
        seq = self.plan.seq(m)
        return CPWindow(phi, max(m.cp_window_rank_shares(seq, cp)), m.cp_window_work_fraction(seq, cp),
                        self._kv_all_gathers(phase))  # fmt: skip

    def _kv_all_gathers(self, phase: str) -> tuple[CommCost, ...]:
        """TransformerEngine's KV all-gather CP, one layer: K and V all-gathered over the ``cp``
        ranks (two calls), again in the backward with dK and dV reduce-scattered (this rank's K
        and V: :func:`~trainsim.builders.memory.cp_attention_bytes`, MLA's values ``d_v`` wide)."""
        cp, t = self.plan.cp, cp_attention_bytes(self.model, self.plan)
        ag_k, ag_v = (self.cost("cp_kv_all_gather", "all_gather", n * cp, cp, self.plan.tp) for n in (t.k_bytes, t.v_bytes))
        if phase != "bwd":
            return (ag_k, ag_v)
        rs_k, rs_v = (self.cost("cp_dkv_reduce_scatter", "reduce_scatter", n * cp, cp, self.plan.tp)
                      for n in (t.k_bytes, t.v_bytes))  # fmt: skip
        return (ag_k, ag_v, rs_k, rs_v)

    def _a2a(self, phase: str) -> tuple[CommCost, ...]:
        """TransformerEngine's a2a CP (DeepSpeed-Ulysses), one layer: in the forward Q, K and V
        all-to-all'd from the sequence split to the head split before the attention core and
        its output back after it (TE's ``flash_attn_a2a_communicate``, one call per tensor);
        in the backward the output's gradient before the core's backward and dQ, dK, dV after
        it. Each call moves one rank's ``[b, s/cp, heads/tp, d]`` tensor (nccl-tests' size,
        as the expert all-to-alls), over the ``cp`` ranks ``tp`` apart."""
        tp, cp, t = self.plan.tp, self.plan.cp, cp_attention_bytes(self.model, self.plan)
        q = self.cost("cp_a2a_q", "all_to_all", t.q_bytes, cp, tp)
        k = self.cost("cp_a2a_k", "all_to_all", t.k_bytes, cp, tp)
        v = self.cost("cp_a2a_v", "all_to_all", t.v_bytes, cp, tp)
        o = self.cost("cp_a2a_out", "all_to_all", t.o_bytes, cp, tp)
        return (q, k, v, o) if phase != "bwd" else (o, q, k, v)

    def cp_exposed_layer(self, phase: str) -> CPWindow | None:
        """The layers whose context-parallel collectives are exposed, and those collectives, by
        ``Plan.cp_comm`` (Megatron-core's ``--cp-comm-type``, TransformerEngine's variants):

        * ``p2p`` (the ring, :meth:`cp_layer`): only a sliding-window model's windowed layers
          (:meth:`cp_window_layer`; the ring refuses a window), else None;
        * ``all_gather``: every layer (:meth:`_kv_all_gathers`), its attention at the busiest
          rank's share of the load-balanced ``2·cp`` split (1/cp of the causal work without a
          window: the same as the ring's; :meth:`ModelSpec.cp_window_work_fraction` with one);
        * ``a2a``: every layer (:meth:`_a2a`); the attention core runs over the whole sequence
          on ``heads / (tp·cp)`` heads (:meth:`LayerCoster.attention_core`), a window at its
          unsplit share on every rank (FlashAttention's ``window_size``).

        Exposed: TransformerEngine issues them on the compute stream before (after) the
        kernels that need (make) their data, with nothing to overlap."""
        p, m = self.plan, self.model
        if p.cp <= 1 or p.cp_comm == "p2p":
            return self.cp_window_layer(phase)
        seq, flash = p.seq(m), p.attention == "flash"
        if p.cp_comm == "all_gather":
            wf = m.cp_window_work_fraction(seq, p.cp) if flash else 1.0
            return CPWindow(1.0, wf, wf, self._kv_all_gathers(phase))
        wf = m.window_work_fraction(seq) if flash else 1.0
        return CPWindow(1.0, wf, wf, self._a2a(phase))

    def ep_layer(self, phase: str) -> list[CommCost]:
        m, ep = self.model, self.plan.ep
        if not m.is_moe or ep <= 1:
            return []
        # the busiest rank's share, which an all-to-all's time follows (Plan.moe_imbalance)
        nbytes = self._tokens() * m.top_k * m.hidden * self.act_bytes / self.plan.tp * self.plan.moe_load
        a2a = self.cost("ep_all_to_all", "all_to_all", nbytes, ep, self.plan.tp * self.plan.cp)
        return [a2a, a2a]

    def cost_placed(self, name: str, kind: str, nbytes: float, size: int, pn: int) -> CommCost:
        s, prov = self._time(kind, float(nbytes), size, pn)
        return CommCost(name, kind, nbytes, size, pn, s, prov)

    def pp_p2p(self, boundary: int = 0) -> CommCost | None:
        """One activation (or gradient) across the boundary between stage ``boundary`` and the
        next (``(boundary + 1) mod pp``: the interleaved schedule wraps around), per micro-batch.
        Stage ``s`` holds ranks ``[s S, (s + 1) S)`` with ``S = tp cp dp``; rank ``r`` talks to
        ``r + S``, on its node unless the boundary falls on a node edge."""
        p = self.plan
        if p.pp <= 1:
            return None
        nbytes = float(self._tokens() * self.model.hidden * self.act_bytes)
        if p.sp and p.tp > 1:
            nbytes /= p.tp
        stride = p.tp * p.cp * p.dp
        a, b = boundary * stride, ((boundary + 1) % p.pp) * stride
        same = stride < self.gpn and a // self.gpn == b // self.gpn
        c = self._p2p.get(same)
        if c is None:
            c = self._p2p[same] = self.cost_placed("pp_send_recv", "send", nbytes, 2, 2 if same else 1)
        return c

    # --- per iteration ----------------------------------------------------------------------

    def grad_bytes_per_param(self) -> int:
        """Megatron reduces bf16 training's gradients in fp32 (its main_grad buffers); eager
        PyTorch (impl hf) in the parameters' dtype (:meth:`Precision.for_dtype`)."""
        if self.plan.impl == "hf":
            return {"fp16": 2, "bf16": 2, "fp32": 4}[self.plan.dtype]
        return {"fp16": 2, "bf16": 4, "fp32": 4}[self.plan.dtype]

    def dp_grads(self, stage_params: float, expert_params: float = 0.0) -> list[CommCost]:
        """Gradient reduction and (ZeRO) weight gathering of one stage per iteration.

        ``stage_params`` are reduced over the ``dp × cp`` ranks holding the same weights; MoE
        ``expert_params`` (included in ``stage_params``) over Megatron's smaller expert-data-
        parallel group, ``dp × cp / ep`` ranks ``tp cp ep`` apart."""
        p = self.plan
        out = []
        if expert_params and p.ep > 1:
            stage_params -= expert_params
            ne = p.dp * p.cp // p.ep
            if ne > 1 and p.zero < 3:  # ZeRO-3 reduce-scatters them per layer (zero3_layer)
                eb = expert_params * self.grad_bytes_per_param()
                kind = "reduce_scatter" if p.zero == 2 or p.dist_optimizer else "all_reduce"
                estride = p.tp * p.cp * p.ep
                out.append(self.cost(f"ep_dp_{kind}", kind, eb, ne, estride))
                if p.zero in (1, 2):  # each rank updated its shard: gather the experts' weights
                    out.append(self.cost("ep_dp_all_gather", "all_gather", expert_params * self.act_bytes, ne, estride))
        n = p.dp * p.cp  # CP ranks hold the same weights and reduce gradients together
        if n <= 1:
            return out
        gb = stage_params * self.grad_bytes_per_param()
        stride = p.tp
        if p.zero == 3:
            # ZeRO-3/FSDP reduce-scatter each layer's gradients as its backward ends, every
            # micro-batch (:meth:`zero3_layer`): nothing is left for the end of the iteration
            # but the (small) non-layer parameters, folded in there as well
            return out
        if p.zero == 2 or p.dist_optimizer:
            out.append(self.cost("dp_reduce_scatter", "reduce_scatter", gb, n, stride))
        else:
            out.append(self.cost("dp_all_reduce", "all_reduce", gb, n, stride))
        if p.zero in (1, 2):
            out.append(
                self.cost("dp_all_gather", "all_gather", stage_params * self.act_bytes, n, stride)
            )
        return out

    def zero3_layer(self, dense_params: float, expert_params: float = 0.0) -> list[CommCost] | None:
        """ZeRO-3/FSDP, one layer of one GPU: the all-gather of its weights (before its forward,
        again before its backward and any recomputation) and the reduce-scatter of its gradients
        (after its backward), every micro-batch. ``dense_params`` (after TP) shard over the
        ``dp × cp`` ranks holding the same weights; MoE ``expert_params`` (this GPU's experts,
        after TP and EP) over the expert-data-parallel group, ``dp × cp / ep`` ranks ``tp cp ep``
        apart (as :meth:`dp_grads`), nothing when that group is one rank. ``None``: no ZeRO-3
        collectives."""
        p = self.plan
        if p.zero < 3:
            return None
        out = []
        for tag, params, n, stride in (("", dense_params, p.dp * p.cp, p.tp),
                                       ("_expert", expert_params, p.dp * p.cp // p.ep, p.tp * p.cp * p.ep)):  # fmt: skip
            if params > 0 and n > 1:
                out.append(self.cost(f"zero3{tag}_all_gather", "all_gather", params * self.act_bytes, n, stride))
                out.append(self.cost(f"zero3{tag}_reduce_scatter", "reduce_scatter",
                                     params * self.grad_bytes_per_param(), n, stride))  # fmt: skip
        return out or None

    def embedding_grads(self) -> CommCost | None:
        """Tied embeddings, or multi-token prediction, with pp > 1: first and last stage
        all-reduce the embedding gradient (the last stage holds a copy for the output head or
        the MTP depths' lookups; Megatron's ``_allreduce_word_embedding_grads``)."""
        p, m = self.plan, self.model
        if not (m.tied_embeddings or m.mtp_depths(p.impl)) or p.pp <= 1:
            return None
        nbytes = m.padded_vocab(p.tp) * m.hidden / p.tp * self.grad_bytes_per_param()
        # rank r of the first stage pairs with r + (pp - 1) S: on one node only when the whole
        # job is (whole-node placement, power-of-two degrees)
        return self.cost_placed(
            "embedding_all_reduce", "all_reduce", nbytes, 2, 2 if p.gpus <= self.gpn else 1
        )
