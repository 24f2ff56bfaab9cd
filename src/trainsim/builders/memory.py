"""How much memory one GPU needs to train a model with a plan: :func:`memory_per_gpu`.

Per pipeline stage, one GPU holds (:class:`MemoryBreakdown`):

* **Model states** — weights, gradients and optimizer state of the parameters it owns
  (:func:`stage_params`: 001 Table III generalised, TP-sharded, experts ÷ ep), in the bytes per
  parameter of :class:`Precision`, sharded over the data-parallel ranks by ZeRO (Rajbhandari et
  al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", §5: stage 1
  shards optimizer states, 2 also gradients, 3 also parameters). The shard group is ``dp × cp``
  (Megatron's distributed optimizer reduces over the data-parallel group *with* context
  parallelism, whose ranks hold the same weights); expert parameters shard over ``dp·cp/ep``.
* **Activations** — Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
  Transformer Models", §4, Table 2) per layer and micro-batch, times the micro-batches in
  flight under the schedule (§4.2.3 and Megatron's warm-up counts), plus the recompute working
  set and the embedding/output-layer extras (§4.3).
  With ``plan.impl == "hf"`` (HuggingFace eager training) the per-layer and rest-of-model
  activations are instead those measured of transformers' own modules
  (``builders/data/hf_activation_census.json``, ``scripts/hf_activation_census.py``: the bytes
  autograd saves, per storage, evaluated for the model), in the same schedule counting
  (:func:`hf_activation_provenance` says so).
* **Buffers** — transient and fixed allocations (see :func:`_buffers_bytes`; every constant
  below is an estimate with its source), among them, with context parallelism, one layer's
  TransformerEngine attention buffers (:func:`cp_transient_bytes`: the ring's received K/V
  blocks and partial outputs, the all-gathered K/V, Ulysses' re-laid-out Q/K/V/O).

Approximations (each also noted where it is used):

* Activations are 2 bytes per element (4 for fp32 training); dropout masks 1 byte
  (Korthikanti §4.1). ``dropout=False`` drops the masks (LLaMA-style training uses none).
* Gradients of activations during backward, the optimizer step's temporaries and allocator
  fragmentation are not modelled for the fused stacks (their persistent gradient buffers and
  fused optimizers are; leave headroom when using :func:`fits`). With ``impl == "hf"`` the
  breakdown is of the step's largest moment instead (:func:`_hf_peak`: the loss's and the
  head's backward, gradient checkpointing's re-run, a tied embedding's gradient sum, AdamW's
  foreach temporaries; DDP's gradient buckets), as measured of real eager steps
  (``trainsim validate memory``); the allocator's fragmentation is still left out.
* MoE routing is dropless, and balanced unless ``plan.moe_imbalance`` says by how much the busiest
  expert-parallel rank is over the mean: each rank processes ``top_k`` copies of its own tokens on
  average, whatever ``ep`` is, and that rank ``moe_imbalance`` times as many.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from trainsim.builders.plan import Plan
from trainsim.builders.spec import ModelSpec
from trainsim.errors import ConfigError

MiB = 1024**2
GiB = 1024**3

# Approximation: device memory the CUDA context takes before any tensor exists (kernel images,
# driver state). Reported 0.3–0.75 GiB depending on CUDA version and GPU (PyTorch forum
# "What is the reason for pytorch's GPU memory floor?": 723 MiB for one tiny tensor; CUDA 12's
# lazy module loading lowers it). Not measured here.
CUDA_CONTEXT_BYTES = 512 * MiB
# cuBLAS workspace PyTorch allocates per handle on Hopper (32 MiB; 4 MiB on older GPUs).
CUBLAS_WORKSPACE_BYTES = 32 * MiB
# Default fixed overhead per GPU: context + cuBLAS workspace.
DEFAULT_OVERHEAD_BYTES = CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES
# Approximation: NCCL buffers per communicator that runs collectives: NCCL_BUFFSIZE (4 MiB
# default, NCCL environment-variable docs) × 2 protocols/directions × ~16 channels.
NCCL_COMM_BYTES = 128 * MiB
# Dropout mask element (torch stores a uint8/bool mask): Korthikanti §4.1.
MASK_BYTES = 1
# Cross-entropy logits are kept in fp32 for the loss: Korthikanti §4.3 ("4sbv/t").
LOGITS_BYTES = 4
# FlashAttention keeps the softmax log-sum-exp, fp32, one per query row and head.
LSE_BYTES = 4
# impl hf: the activation census (scripts/hf_activation_census.py)
HF_ACTIVATIONS = Path(__file__).parent / "data" / "hf_activation_census.json"
# its dtypes' bytes on a GPU ("bfloat16" stands for the training dtype): a dropout's mask is
# CUDA native_dropout's bool, a LayerNorm's mean and rstd fp32 (the CPU it was measured on keeps
# both in the activations' dtype; the census's "backends" note)
_HF_DTYPE_BYTES = {"float32": 4, "int64": 8, "int32": 4, "bool": 1, "mask": 1, "stat": 4}


@dataclass(frozen=True, slots=True)
class Precision:
    """Bytes per parameter of weights, gradients and optimizer state (Adam)."""

    weight_bytes: float
    grad_bytes: float
    optimizer_bytes: float  # fp32 master weights (mixed precision) + Adam's two moments

    @classmethod
    def for_dtype(cls, dtype: str, impl: str = "fused") -> Precision:
        """Defaults per training dtype (``impl`` ``hf``: eager PyTorch's, below).

        * ``bf16``: 2 + 4 + 12 — Megatron accumulates and all-reduces bf16 gradients in an fp32
          ``main_grad`` buffer (``accumulate_allreduce_grads_in_fp32`` is forced on for bf16);
          Megatron Core "Distributed Optimizer" docs: "float16 param, fp32 grads: 18 / 6 + 12/d".
        * ``fp16``: 2 + 2 + 12 — ZeRO §3.1's mixed-precision Adam (K = 12: fp32 master, momentum,
          variance). Megatron's table counts 20 (4 + 16/d) because its optimizer also keeps an
          fp32 copy of the gradients; pass ``Precision(2, 2, 16)`` for that.
        * ``fp32``: 4 + 4 + 8 — no master copy, two fp32 moments (Megatron: "fp32 param, fp32
          grads: 16 / 8 + 8/d").

        ``impl`` ``hf`` (eager PyTorch, the model in its training dtype: ``model.to(torch.bfloat16)``,
        as the activation census and trainsim's H100 captures train it): 2 + 2 + 4 for bf16 and
        fp16 — gradients in the parameters' dtype, ``torch.optim.AdamW``'s ``exp_avg`` and
        ``exp_avg_sq`` made ``zeros_like`` the parameter, no master copy (measured: a bf16 CPU
        step's parameters and moments are 6 bytes a parameter); fp32 as above.
        """
        table = {"bf16": (2, 4, 12), "fp16": (2, 2, 12), "fp32": (4, 4, 8)}
        if impl == "hf":
            table = {"bf16": (2, 2, 4), "fp16": (2, 2, 4), "fp32": (4, 4, 8)}
        if dtype not in table:
            raise ConfigError(f"memory: dtype must be one of {', '.join(table)}, got {dtype!r}")
        return cls(*table[dtype])

    def sharded(self, zero: int, shards: float) -> Precision:
        """Bytes per parameter on one rank after ZeRO stage ``zero`` over ``shards`` ranks."""
        n = max(shards, 1)
        return Precision(
            self.weight_bytes / (n if zero >= 3 else 1),
            self.grad_bytes / (n if zero >= 2 else 1),
            self.optimizer_bytes / (n if zero >= 1 else 1),
        )

    @property
    def total_bytes(self) -> float:
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Memory of one GPU of one pipeline stage (see the module docstring)."""

    stage: int  # pipeline stage (0-based)
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float  # master weights + Adam moments, as sharded by ZeRO
    activations_bytes: float  # peak in-flight activations under the schedule
    buffers_bytes: float  # communication buffers, loss workspace, CUDA context/workspaces
    # the moment of the step the breakdown is of: "backward" (everything at once: the fused
    # stacks' persistent gradient buffers and fused optimizers); impl hf the largest of
    # "loss-backward", "head-backward", "recompute", "embedding-backward", "optimizer-step" and,
    # on a stage without the loss, "backward" (:func:`_hf_peak`; under FSDP also
    # "backward-gather", :func:`_hf_fsdp_phases`)
    phase: str = "backward"

    @property
    def total_bytes(self) -> float:
        return (
            self.weights_bytes
            + self.gradients_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.buffers_bytes
        )

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "total_bytes": self.total_bytes}


# --- pipeline partitions -------------------------------------------------------------------


@lru_cache(maxsize=4096)
def _stage_layers(model: ModelSpec, plan: Plan) -> tuple[int, ...]:
    """Transformer layers per pipeline stage (all of a stage's ``vpp`` chunks together).

    The layers are split evenly over the ``pp × vpp`` model chunks, chunk ``c`` living on stage
    ``c mod pp``. Megatron asserts ``layers % chunks == 0`` unless told where the extra layers go
    (``--decoder-first/last-pipeline-num-layers``); here a remainder goes one layer each to the
    first ``layers % chunks`` chunks, so with ``vpp = 1`` the first ``layers % pp`` stages hold
    one layer more. ``plan.partition == "001"``: GPT-NeoX's split, :func:`stage_layers_001`;
    ``plan.first_stage_layers`` / ``last_stage_layers``: those end stages as given, the others even.
    """
    if plan.partition == "001":
        return tuple(stage_layers_001(model, plan))
    if plan.first_stage_layers or plan.last_stage_layers:
        # Megatron-core's uneven split: the given end stages, the rest even (Plan.validate
        # checks that it divides; a remainder would go to the earlier stages, as below)
        f, last = plan.first_stage_layers, plan.last_stage_layers
        inner = plan.pp - (f > 0) - (last > 0)
        base, extra = divmod(model.layers - f - last, max(inner, 1))
        mid = [base + (1 if i < extra else 0) for i in range(inner)]
        return tuple(([f] if f else []) + mid + ([last] if last else []))
    vpp = plan.chunks
    chunks = plan.pp * vpp
    base, extra = divmod(model.layers, chunks)
    per_stage = [0] * plan.pp
    for c in range(chunks):
        per_stage[c % plan.pp] += base + (1 if c < extra else 0)
    return tuple(per_stage)


def stage_layers(model: ModelSpec, plan: Plan) -> list[int]:
    """Transformer layers per pipeline stage (see :func:`_stage_layers`; cached: searches ask
    for the same split many times)."""
    return list(_stage_layers(model, plan))


def stage_layers_001(model: ModelSpec, plan: Plan) -> list[int]:
    """GPT-NeoX's partition, 001 §III-D Eq. 3–5: with ``f = ceil((L + 5) / pp)`` (two blocks
    before the encoders, three after), the first stage holds ``f − 2`` layers, the middle ones
    ``f``, the last ``f − 3``.

    The equations sum to ``pp·f − 5``, which is ``L`` only when ``pp`` divides ``L + 5``. We keep
    Eq. 3 and 5 for the end stages (clipped to ``0..L``) and spread the remaining layers evenly
    over the middle stages, earlier stages taking any remainder — Eq. 4 exactly whenever the
    equations sum to ``L``. E.g. 44 layers on 4 stages: ``f = 13``, Eq. 3–5 give 11, 13, 13, 10
    (47); we return 11, 12, 11, 10. With two stages the last takes ``L − first``.
    """
    n_layers, pp = model.layers, plan.pp
    if pp == 1:
        return [n_layers]
    f = math.ceil((n_layers + 5) / pp)
    first = min(max(f - 2, 0), n_layers)
    if pp == 2:
        return [first, n_layers - first]
    last = min(max(f - 3, 0), n_layers - first)
    base, extra = divmod(n_layers - first - last, pp - 2)
    middle = [base + (1 if i < extra else 0) for i in range(pp - 2)]
    return [first, *middle, last]


# --- parameters per GPU --------------------------------------------------------------------


def _mlp_params_per_gpu(model: ModelSpec, ffn: int, tp: int) -> float:
    """Column-parallel up (and gate) and row-parallel down projection; the down bias is whole."""
    d, f = model.hidden, ffn / tp
    mats = 3 if model.gated else 2
    bias = (f * (2 if model.gated else 1) + d) if model.bias else 0
    return mats * d * f + bias


def _norm_params_per_gpu(model: ModelSpec, tp: int) -> float:
    """One layer's norm weights on one GPU: the layer's norms and per-head q/k norms are
    replicated over TP; OLMo 2's q/k norms over the whole projections are split with them."""
    if model.qk_norm == "full":
        return model.layer_norms * model.norm_params() + model.q_width / tp + model.kv_width_tp(tp)
    return float(model.layer_norm_params())


_LAYER_PARAMS: dict[tuple[int, int, int], tuple[ModelSpec, tuple[float, float]]] = {}


def _layer_params_per_gpu(model: ModelSpec, tp: int, ep: int) -> tuple[float, float]:
    """(dense, expert) parameters of one layer on one GPU (Megatron's TP layout, Table II),
    kept per (model object, tp, ep): a search asks for them several times per plan."""
    key = (id(model), tp, ep)
    hit = _LAYER_PARAMS.get(key)
    if hit is None or hit[0] is not model:  # the model is held, so its id is not reused while kept
        if len(_LAYER_PARAMS) >= 4096:
            _LAYER_PARAMS.clear()
        hit = _LAYER_PARAMS[key] = (model, _layer_params_uncached(model, tp, ep))
    return hit[1]


def _layer_params_uncached(model: ModelSpec, tp: int, ep: int) -> tuple[float, float]:
    d = model.hidden
    q = model.q_width / tp
    kv = model.kv_width_tp(tp)
    attn = d * (q + 2 * kv) + q * d + ((q + 2 * kv) if model.bias or model.qkv_bias else 0) + (d if model.bias else 0)
    if model.mla or model.attention_sinks:
        attn = _moe_family_attention_per_gpu(model, tp, attn)
    dense = attn + _norm_params_per_gpu(model, tp)
    if not model.is_moe:
        return dense + _mlp_params_per_gpu(model, model.ffn, tp), 0.0
    router = model.router_params()  # replicated
    experts = model.num_experts / ep * _mlp_params_per_gpu(model, model.expert_ffn, tp)
    return dense + router + _shared_expert_params_per_gpu(model, tp), experts


# --- MoE families (h5): MLA, shared experts, dense layers among MoE ones ----------------------


def _moe_family_attention_per_gpu(model: ModelSpec, tp: int, attn: float) -> float:
    """One GPU's attention parameters where the MoE families differ: MLA (its down projections
    and latent norms replicated over TP, the up and output projections split by heads; see
    :meth:`ModelSpec.mla_params`) and gpt-oss's sinks (per head); the q/k norms are
    :func:`_norm_params_per_gpu`'s."""
    d, h = model.hidden, model.heads
    if model.mla:
        rq, rkv, rope = model.q_lora_rank, model.kv_lora_rank, model.qk_rope_head_dim
        down = d * (rq + rkv + rope) + rq + rkv
        up = ((rq or d) * h * model.d_head + rkv * h * (model.d_head - rope + model.v_dim)) / tp
        attn = down + up + h * model.v_dim / tp * d
    return attn + (h / tp if model.attention_sinks else 0)


def _shared_expert_params_per_gpu(model: ModelSpec, tp: int) -> float:
    """The shared expert(s), TP-split like a dense MLP (not expert-parallel), and a replicated gate."""
    if not model.shared_ffn_hidden:
        return 0.0
    return (3 if model.gated else 2) * model.hidden * model.shared_ffn_hidden / tp + (
        model.hidden if model.shared_expert_gate else 0
    )


@lru_cache(maxsize=4096)
def _stage_dense_layers(model: ModelSpec, plan: Plan, layers: tuple[int, ...]) -> tuple[int, ...]:
    """How many of ``model.dense_layers`` each pipeline stage holds, the stages holding
    ``layers`` layers: in layer order the default even split's ``pp x vpp`` chunks (chunk ``c``
    on stage ``c mod pp``, :func:`_stage_layers`), otherwise contiguous runs of ``layers``."""
    if plan.chunks > 1 and layers == _stage_layers(model, plan) and plan.partition != "001" \
            and not (plan.first_stage_layers or plan.last_stage_layers):  # fmt: skip
        chunks = plan.pp * plan.chunks
        base, extra = divmod(model.layers, chunks)
        blocks = [(c % plan.pp, base + (1 if c < extra else 0)) for c in range(chunks)]
    else:
        blocks = list(enumerate(layers))
    out, start, dense = [0] * plan.pp, 0, set(model.dense_layers)
    for stage, n in blocks:
        out[stage] += sum(1 for i in range(start, start + n) if i in dense)
        start += n
    return tuple(out)


def stage_dense_layers(model: ModelSpec, plan: Plan, layers: Sequence[int] | None = None) -> list[int]:
    """Per pipeline stage, its layers among ``model.dense_layers`` (all 0 for models without)."""
    if not model.dense_layers:
        return [0] * plan.pp
    return list(_stage_dense_layers(model, plan, tuple(layers if layers is not None else _stage_layers(model, plan))))


_DENSE_VARIANTS: dict[int, tuple[ModelSpec, ModelSpec]] = {}  # id(model) -> (model, its dense variant)


def dense_variant(model: ModelSpec) -> ModelSpec:
    """:meth:`ModelSpec.dense_variant`, kept per model object (a search asks for it on every
    plan and stage; building one runs the spec's validation, ~0.2 ms)."""
    hit = _DENSE_VARIANTS.get(id(model))
    if hit is None or hit[0] is not model:  # the model is held, so its id is not reused while kept
        if len(_DENSE_VARIANTS) >= 64:
            _DENSE_VARIANTS.clear()
        hit = _DENSE_VARIANTS[id(model)] = (model, model.dense_variant())
    return hit[1]


def dense_layer_extra_params(model: ModelSpec, plan: Plan) -> tuple[float, float]:
    """What one of ``model.dense_layers`` holds on a GPU beyond an MoE layer's (dense, expert)
    parameters: its dense MLP less the router and shared expert, and no experts."""
    dense_moe, expert = _layer_params_per_gpu(model, plan.tp, plan.ep)
    dense_dense, _ = _layer_params_per_gpu(dense_variant(model), plan.tp, plan.ep)
    return dense_dense - dense_moe, -expert


def embedding_params_per_gpu(model: ModelSpec, plan: Plan) -> float:
    """The first stage's parameters before its layers, on one GPU: the token embedding's shard
    (001 Eq. 1–2 padding, ÷ tp rows) and the replicated position table."""
    return model.embedding_params(plan.tp) / plan.tp + model.position_params()


def _zero_groups(layer_params: tuple[float, float], ep: int) -> tuple[float, float]:
    """:func:`_layer_params_per_gpu`'s (dense, expert) split as ZeRO shards it: the experts
    apart (over dp·cp/ep ranks) only with expert parallelism; without it they shard with the
    rest over dp·cp."""
    dense, experts = layer_params
    return (dense + experts, 0.0) if ep <= 1 else (dense, experts)


def _stage_params_split(
    model: ModelSpec, plan: Plan, stage: int, layers: Sequence[int],
    layer_params: tuple[float, float] | None = None, *, dense_counts: Sequence[int] | None = None,
    dense_extra: tuple[float, float] | None = None,
) -> tuple[float, float]:  # fmt: skip
    """``layer_params``: :func:`_layer_params_per_gpu` of the plan, ``dense_counts``:
    :func:`stage_dense_layers` of ``layers``, ``dense_extra``: :func:`dense_layer_extra_params`,
    when the caller has them (once per plan, not per stage)."""
    if not 0 <= stage < plan.pp:
        raise ConfigError(f"memory: stage {stage} is not in 0..{plan.pp - 1} (pp {plan.pp})")
    dense_layer, expert_layer = layer_params or _layer_params_per_gpu(model, plan.tp, plan.ep)
    n = layers[stage]
    dense, expert = n * dense_layer, n * expert_layer
    if model.dense_layers and (nd := (dense_counts or stage_dense_layers(model, plan, layers))[stage]):
        more_dense, more_expert = dense_extra or dense_layer_extra_params(model, plan)
        dense, expert = dense + nd * more_dense, expert + nd * more_expert
    vocab_shard = model.embedding_params(plan.tp) / plan.tp  # 001 Eq. 1–2 padding, ÷ tp rows
    if stage == 0:
        dense += embedding_params_per_gpu(model, plan)
    if stage == plan.pp - 1:
        dense += model.norm_params()
        # Untied: the output projection. Tied with pp > 1: Megatron keeps a copy of the
        # embedding on the last stage and all-reduces its gradient with the first stage's.
        if not model.tied_embeddings or plan.pp > 1:
            dense += vocab_shard
        dense += model.head_bias_params(plan.tp) / plan.tp  # Phi's output bias, vocabulary-parallel
        if model.mtp_depths(plan.impl):
            more_dense, more_expert = mtp_params_per_gpu(model, plan)
            dense, expert = dense + more_dense, expert + more_expert
    return dense, expert


def mtp_params_per_gpu(model: ModelSpec, plan: Plan) -> tuple[float, float]:
    """(dense, expert) parameters the last stage's GPU holds for the model's MTP depths
    (:meth:`ModelSpec.mtp_depth_params`, as Megatron-core lays them out): per depth the block
    (:func:`_layer_params_per_gpu` of :meth:`ModelSpec.mtp_block`), ``eh_proj`` column-parallel
    (2d x d / tp) and three replicated norms; and, with pp > 1 and untied embeddings, the copy of
    the embedding Megatron builds on the last stage for the depths' lookups (``mtp_process``;
    its gradient all-reduced with the first stage's). A tied model's last stage holds that copy
    already (its output projection)."""
    depths = model.mtp_depths(plan.impl)
    if not depths:
        return 0.0, 0.0
    block_dense, block_expert = _layer_params_per_gpu(model.mtp_block(), plan.tp, plan.ep)
    d = model.hidden
    dense = depths * (block_dense + 2 * d * d / plan.tp + 3 * model.norm_params())
    if plan.pp > 1 and not model.tied_embeddings:
        dense += embedding_params_per_gpu(model, plan)
    return dense, depths * block_expert


def stage_params(
    model: ModelSpec, plan: Plan, stage: int, *, layers_per_stage: Sequence[int] | None = None
) -> float:
    """Parameters one GPU of pipeline stage ``stage`` holds (001 Table III, generalised).

    Table III: first stage ``v d/mp + n·#encoder``, middle ``n·#encoder``, last ``n·#encoder +
    2d + v d/mp``. Here ``#encoder`` is this model's layer (GQA, gated MLP, biases or not, MoE
    experts ÷ ep), the learned position table joins the first stage, and with tied embeddings
    the last stage holds an embedding copy when ``pp > 1`` (none when ``pp = 1``).
    """
    layers = list(layers_per_stage) if layers_per_stage is not None else stage_layers(model, plan)
    return sum(_stage_params_split(model, plan, stage, layers))


def stage_params_split(model: ModelSpec, plan: Plan, stage: int) -> tuple[float, float]:
    """(dense, expert) parameters one GPU of ``stage`` holds; see :func:`stage_params`."""
    return _stage_params_split(model, plan, stage, stage_layers(model, plan))


# --- activations ---------------------------------------------------------------------------


def _act_element_bytes(plan: Plan) -> int:
    return 4 if plan.dtype == "fp32" else 2


def _layer_activation_terms(
    model: ModelSpec, plan: Plan, *, dropout: bool
) -> tuple[float, float, float]:
    """(kept without recompute, attention scores, layer input) bytes of one layer, one
    micro-batch, one GPU — Korthikanti §4.1 generalised:

    * sequence-shaped tensors (÷ t only with sequence parallelism): both norm inputs, the QKV
      and MLP inputs (their outputs), two dropout masks — ``10 sbh`` for GPT; an MoE layer also
      keeps the ``top_k`` dispatched token copies (÷ t with SP: an approximation); Gemma's
      four norms keep 6 sbh-sized copies, Falcon-7B's one 2 (:func:`_norm_activation_copies`);
    * TP-split tensors: Q and K, V, the output-projection input (``2·sb(q + 2 kv) + 2·sbq``,
      ``kv`` per rank replicated when tp > KV heads) and the MLP's activation input and down
      input (``2·c·sbf``, c = 2, or 3 for gated units which keep gate and up) — ``24 sbh / t``
      for MHA with ``f = 4h``; q/k norms (Qwen3, Gemma 3, OLMo 2) keep their inputs too,
      ``e·sb(q + kv)``;
    * attention scores ``(2 + 1 + 2)·a s² b / t`` (softmax output, dropout mask and output; only
      the softmax output when ``plan.attention_dropout`` is 0 or ``dropout`` is off) — absent
      with FlashAttention, which keeps the fp32 log-sum-exp instead (``4·a s b / t``); Gemma 2's
      soft-capped scores keep their tanh, one more ``e·a s² b / t`` (not with FlashAttention).

    Context parallelism divides the local sequence: queries ``s / cp`` against all ``s`` keys;
    the layers running TransformerEngine's KV all-gather CP also keep its per-step partial
    outputs (:func:`cp_kept_bytes`).
    """
    e, mk = _act_element_bytes(plan), (MASK_BYTES if dropout else 0)
    t, b, h = plan.tp, plan.micro_batch, model.hidden
    s_full = plan.seq(model)
    s = s_full / plan.cp
    sp_div = t if plan.sp and t > 1 else 1
    kv = model.kv_width_tp(t)
    q = model.q_width / t
    c = 3 if model.gated else 2
    if model.is_moe:
        load = plan.moe_load  # the busiest expert-parallel rank's tokens over the mean (Plan.moe_imbalance)
        mlp_width = model.top_k * model.expert_ffn / t * load
        dispatched = model.top_k * e * s * b * h * load
    else:
        mlp_width, dispatched = model.ffn / t, 0.0
    seq_shaped = (_norm_activation_copies(model) * e * s * b * h + 2 * mk * s * b * h + dispatched) / sp_div
    tp_split = e * s * b * (2 * q + 2 * kv) + c * e * s * b * mlp_width
    if model.qk_norm != "none":  # the q/k norms' inputs (their outputs are the Q and K above)
        tp_split += e * s * b * (q + kv)
    if model.mla or model.shared_ffn_hidden:
        tp_split += _moe_family_activation_bytes(model, plan, e * s * b) - (e * s * b * (2 * q + 2 * kv) if model.mla else 0.0)
    tp_split += cp_kept_bytes(model, plan)  # the KV all-gather CP's saved partial outputs
    heads = model.heads / t
    if plan.attention == "flash":
        scores, tp_split = 0.0, tp_split + LSE_BYTES * heads * s * b
    else:
        attn_mk = mk if plan.attention_dropout > 0 else 0  # no dropout: no mask, no second copy
        scores = (e + attn_mk * (1 + e)) * heads * s * s_full * b
        if model.attn_softcap:  # Gemma 2's capped scores: the saved tanh, one more copy
            scores += e * heads * s * s_full * b
    layer_input = e * s * b * h / sp_div
    return seq_shaped + tp_split + scores, scores, layer_input


def _norm_activation_copies(model: ModelSpec) -> int:
    """``[s, b, h]`` tensors one layer's norms keep (:func:`_layer_activation_terms`): 4 for
    two norms before attention and MLP, each keeping its input and its output (the next GEMM's
    input; Korthikanti §4.1), as OLMo 2's two after them (their inputs; the GEMMs keep the
    residual stream); 6 for Gemma's four (the two norms after attention and MLP keep their
    inputs, their outputs feed residual adds, which keep nothing); 2 for Falcon-7B's one
    (its output feeds both attention and MLP)."""
    return {1: 2, 2: 4, 4: 6}[model.layer_norms]


def _moe_family_activation_bytes(model: ModelSpec, plan: Plan, esb: float) -> float:
    """What the MoE families keep beyond a plain layer, per GPU (``esb``: element bytes x
    tokens): MLA's in place of Q, K, V and the output-projection input — this rank's q and k
    heads (``h d_qk / t`` each), values and output-projection input (``h d_v / t`` each), the
    two latents before and after their norms and the shared rotary key (replicated); the
    shared expert's activation and down inputs (``c·f_shared / t``)."""
    t, h = plan.tp, model.heads
    out = 0.0
    if model.mla:
        out += esb * (h * (2 * model.d_head + 2 * model.v_dim) / t + 2 * (model.q_lora_rank + model.kv_lora_rank)
                      + model.qk_rope_head_dim)  # fmt: skip
    if model.shared_ffn_hidden:
        out += (3 if model.gated else 2) * esb * model.shared_ffn_hidden / t
    return out


def activation_bytes_per_layer(model: ModelSpec, plan: Plan, *, dropout: bool = True) -> float:
    """Bytes one layer keeps for its backward, per micro-batch and GPU, under ``plan.recompute``.

    Korthikanti Table 2 for GPT (``a`` heads, MHA, ``f = 4h``, dropout, non-flash attention):
    none ``sbh(34 + 5as/h)``; TP ``sbh(10 + 24/t + 5as/(ht))``; TP+SP ``sbh(34/t + 5as/(ht))``;
    selective recompute drops the ``5as/h`` term; full recompute keeps the layer input ``2sbh``
    (÷ t with SP). FlashAttention never keeps the scores, so ``none`` equals ``selective`` there.
    """
    return _kept_bytes(plan, _layer_activation_terms(model, plan, dropout=dropout))


def _kept_bytes(plan: Plan, terms: tuple[float, float, float]) -> float:
    """:func:`activation_bytes_per_layer` from :func:`_layer_activation_terms`' ``terms``."""
    kept, scores, layer_input = terms
    if plan.recompute == "full":
        return layer_input
    if plan.recompute == "selective":
        return kept - scores
    return kept


def _working_bytes(plan: Plan, terms: tuple[float, float, float]) -> float:
    """What backward re-materialises for one layer of one micro-batch (``terms``:
    :func:`_layer_activation_terms`): the scores (selective) or the whole layer except its
    already-kept input (full)."""
    kept, scores, layer_input = terms
    if plan.recompute == "full":
        return kept - layer_input
    if plan.recompute == "selective":
        return scores
    return 0.0


@cache
def _hf_activation_census() -> dict[str, Any]:
    try:
        doc = json.loads(HF_ACTIVATIONS.read_text(encoding="utf-8"))
        families = doc["families"]
        for fam in families.values():
            for mode in ("none", "checkpointed"):
                m = fam[mode]
                parts = [m["layer"], m["rest"], m.get("logit_softcap", [])]
                for extra in ("window", "rope"):  # Gemma's, Mistral's, SmolLM3's windows; SmolLM3's rotary
                    if extra in m:
                        parts += [m[extra]["layer"], m[extra]["rest"]]
                for size, dtype, count in (entry for part in parts for entry in part):
                        if not (isinstance(size, str) and (dtype == "bfloat16" or dtype in _HF_DTYPE_BYTES)
                                and isinstance(count, int)):  # fmt: skip
                            raise ValueError(f"bad entry {[size, dtype, count]}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"{HF_ACTIVATIONS}: expected the JSON written by scripts/hf_activation_census.py ({e})") from None
    return families


def _hf_symbols(model: ModelSpec, plan: Plan) -> dict[str, float]:
    """The activation census's symbols for one micro-batch on one GPU (tp = cp = 1 with impl hf)."""
    s = float(plan.seq(model))
    t = s * plan.micro_batch
    d, f = float(model.hidden), float(model.expert_ffn if model.is_moe else model.ffn)
    k, e = float(model.top_k if model.is_moe else 0), float(model.num_experts)
    r = float(model.rotary_dims)
    return {"1": 1.0, "d": d, "hd": float(model.d_head), "L": s, "L*L": s * s, "T*L": t * s,
            "L*hd": s * model.d_head, "T": t, "T*d": t * d, "T*V": t * model.vocab,
            "T*h": t * model.heads, "T*3d": 3 * t * d, "T*4d": 4 * t * d, "T*q": t * model.q_width,
            "T*kv": t * model.kv_width, "T*g": t * model.n_kv, "T*f": t * f, "T*2f": 2 * t * f, "E": e,
            "T*k": t * k, "T*E": t * e, "T*k*d": t * k * d, "T*k*f": t * k * f, "T*k*2f": 2 * t * k * f,
            # partial rotary (Phi, GLM): the rotated and passed widths, the rotated cos/sin table
            "T*qr": t * model.heads * r, "T*kvr": t * model.n_kv * r, "T*qp": t * (model.q_width - model.heads * r),
            "T*kvp": t * (model.kv_width - model.n_kv * r), "L*hdr": s * r}  # fmt: skip


# kernel-census families without an activation census of their own: the family whose
# activations stand in, stated in the provenance (none now: Gemma 2/3, which had LLaMA's and
# Qwen3's until 2026-12-03, have their own)
_HF_ACTIVATION_STAND_INS: dict[str, str] = {}


def _hf_activation_family(model: ModelSpec, plan: Plan) -> tuple[str, str]:
    """(the activation census family for ``model`` under impl hf, the kernel census's family
    when another stands in for it, else "")."""
    from trainsim.builders.eager import family_of

    fam = family_of(model, plan.experts_impl)
    families = _hf_activation_census()
    if fam in families:
        return fam, ""
    stand_in = _HF_ACTIVATION_STAND_INS.get(fam)
    if stand_in is None or stand_in not in families:
        raise ConfigError(f"{HF_ACTIVATIONS}: no activation census for family {fam!r} ({model.name}); "
                          "run scripts/hf_activation_census.py with it")  # fmt: skip
    return stand_in, fam


def hf_activation_parts(model: ModelSpec, plan: Plan) -> tuple[float, float, float]:
    """impl hf: (one layer's kept bytes, one layer's working set under recompute, the rest of the
    model's bytes) for one micro-batch, from the activation census of the model's family
    (:func:`trainsim.builders.eager.family_of`). ``recompute="full"`` is HF's gradient
    checkpointing (the census's ``checkpointed``: a layer keeps its input; the backward re-runs
    one layer at a time, holding what it saves, the ``none`` layer); ``selective`` has no HF
    counterpart and SDPA keeps no scores: as ``none``. fp32 training: the bf16 entries at 4
    bytes (an approximation: the norms' fp32 copies are then the same tensors). A Gemma
    census's ``window`` (what a sliding-window layer keeps beyond a full one: the additive mask,
    K and V repeated to the query heads) is added on the share of layers transformers masks
    (:func:`~trainsim.builders.eager.sdpa_window_layers`: 0 where the sequence is shorter than the
    window; at exactly the window the mask is made too), its rest part (what a model with both
    kinds of layer keeps beyond the rest) once, and the recompute working set is then a
    sliding layer's; ``logit_softcap`` (Gemma 2's final-logit cap) to the rest of a model with one.
    Mistral's and SmolLM3's ``window`` the same way; SmolLM3's ``rope`` (its ``layer`` a NoPE
    one: what a rotating layer keeps beyond it, and the cos/sin table the rest keeps once a layer
    rotates) on :attr:`ModelSpec.rope_share` of the layers."""
    from trainsim.builders.eager import sdpa_window_layers

    fam = _hf_activation_census()[_hf_activation_family(model, plan)[0]]
    sym = _hf_symbols(model, plan)
    e = _act_element_bytes(plan)

    def evaluate(entries: list[list[Any]]) -> float:
        try:
            return sum(count * sym[size] * (e if dtype == "bfloat16" else _HF_DTYPE_BYTES[dtype])
                       for size, dtype, count in entries)  # fmt: skip
        except KeyError as err:
            raise ConfigError(f"{HF_ACTIVATIONS}: unknown size symbol or dtype {err}") from None

    share = sdpa_window_layers(model, int(plan.seq(model))) if "window" in fam["none"] else 0.0
    rope = model.rope_share if "rope" in fam["none"] else 0.0  # SmolLM3: its layer a NoPE one

    def parts(mode: str) -> tuple[float, float, float]:
        """(a layer's bytes averaged over the layers, the largest layer's, the rest's) in ``mode``."""
        m = fam[mode]
        layer, rest = evaluate(m["layer"]), evaluate(m["rest"])
        window = evaluate(m["window"]["layer"]) if share else 0.0
        rotating = evaluate(m["rope"]["layer"]) if rope else 0.0
        if share:
            rest += evaluate(m["window"]["rest"])
        if rope:
            rest += evaluate(m["rope"]["rest"])
        if model.logit_softcap:
            rest += evaluate(m.get("logit_softcap", []))
        return layer + share * window + rope * rotating, layer + max(window, 0.0) + max(rotating, 0.0), rest

    plain, largest, rest = parts("none")
    if plan.recompute == "full":
        kept, _, ckpt_rest = parts("checkpointed")
        return kept, largest, ckpt_rest
    return plain, 0.0, rest


def hf_window_layer_bytes(model: ModelSpec, plan: Plan) -> float:
    """impl hf: what one sliding-window layer keeps beyond a full-attention one for a micro-batch
    (the census's ``window`` layer part, without checkpointing: SDPA's additive ``[B, 1, L, L]``
    mask and K/V repeated to the query heads); 0 where none applies (a sequence shorter than the
    window, :func:`~trainsim.builders.eager.sdpa_window_layers`, or a census without that part).
    For predict's note."""
    from trainsim.builders.eager import sdpa_window_layers

    if plan.impl != "hf" or not sdpa_window_layers(model, int(plan.seq(model))):
        return 0.0
    fam = _hf_activation_census()[_hf_activation_family(model, plan)[0]]["none"]
    if "window" not in fam:
        return 0.0
    sym, e = _hf_symbols(model, plan), _act_element_bytes(plan)
    return float(sum(count * sym[size] * (e if dtype == "bfloat16" else _HF_DTYPE_BYTES[dtype])
                     for size, dtype, count in fam["window"]["layer"]))  # fmt: skip


def hf_activation_provenance(model: ModelSpec, plan: Plan) -> str:
    """Where :func:`memory_per_gpu`'s activations come from, for predict's provenance."""
    if plan.impl != "hf":
        return "korthikanti-2022 (Megatron's fused kernels)"
    ckpt = "checkpointed (gradient checkpointing: recompute full)" if plan.recompute == "full" else "none"
    fam, stood_for = _hf_activation_family(model, plan)
    as_ = f"; standing in for {stood_for}, which has none of its own" if stood_for else ""
    return (f"hf-activation-census:{fam}:{ckpt} (measured on the CPU: SDPA's flash kernel; mask and "
            f"LayerNorm-statistics bytes as CUDA's{as_})")  # fmt: skip


def _hf_stage_activations_bytes(model: ModelSpec, plan: Plan, stage: int, n_layers: int,
                                dense_layers: int = 0) -> float:  # fmt: skip
    """impl hf: a stage's activations (:func:`hf_activation_parts`), its layers times the
    micro-batches in flight, one layer's working set under recompute, and on the last stage the
    rest of the model (embedding side, final norm, head, loss; all of it there, as the eager
    census charges it). ``dense_layers``: how many of its layers are ``model.dense_layers``
    (their own family's census, LLaMA's or Qwen3's)."""
    kept, _, rest = hf_activation_parts(model, plan)
    n = in_flight_microbatches(plan, stage)
    total = (n_layers - dense_layers) * n * kept
    if dense_layers:
        dkept, _, _ = hf_activation_parts(dense_variant(model), plan)
        total += dense_layers * n * dkept
    total += _hf_stage_work(model, plan, n_layers, dense_layers)
    if stage == plan.pp - 1:
        total += (plan.grad_accum if plan.schedule == "gpipe" else 1) * rest
    return total


def _hf_stage_work(model: ModelSpec, plan: Plan, n_layers: int, dense_layers: int = 0) -> float:
    """impl hf: the recompute working set :func:`_hf_stage_activations_bytes` counts (one layer's,
    the largest kind's; 0 without recompute or layers)."""
    if not n_layers:
        return 0.0
    work = hf_activation_parts(model, plan)[1]
    if dense_layers:
        dwork = hf_activation_parts(dense_variant(model), plan)[1]
        work = max(work, dwork) if dense_layers < n_layers else dwork
    return work


def in_flight_microbatches(plan: Plan, stage: int) -> float:
    """Micro-batches whose activations stage ``stage`` holds at its peak, in units of the
    stage's layers.

    1F1B (Megatron's PipeDream-flush): warm-up ``pp − i − 1`` forwards plus one → ``min(pp − i,
    m)``. GPipe: all ``m``. Interleaved with ``v`` chunks: Megatron's warm-up ``2(pp − i − 1) +
    (v − 1)·pp`` chunk-forwards plus one, at most ``m·v``, each chunk holding ``1/v`` of the
    stage's layers — on stage 0 this is Korthikanti §4.2.3's ``pp·(1 + (pp − 1)/(pp·v))``.
    """
    m, pp = plan.grad_accum, plan.pp
    if plan.schedule == "gpipe":
        return float(m)
    if plan.schedule == "interleaved" and plan.vpp > 1:
        v = plan.vpp
        return min(2 * (pp - stage - 1) + (v - 1) * pp + 1, m * v) / v
    return float(min(pp - stage, m))


def _stage_activations_bytes(
    model: ModelSpec, plan: Plan, stage: int, n_layers: int, *, dropout: bool,
    terms: tuple[float, float, float],
) -> float:  # fmt: skip
    """``terms``: :func:`_layer_activation_terms` of the plan (computed once per plan)."""
    s, b, h = plan.seq(model) / plan.cp, plan.micro_batch, model.hidden
    sp_div = plan.tp if plan.sp and plan.tp > 1 else 1
    n = in_flight_microbatches(plan, stage)
    total = n_layers * n * _kept_bytes(plan, terms)
    if n_layers:
        total += _working_bytes(plan, terms)
    if stage == 0 and dropout:  # embedding dropout mask, Korthikanti §4.3 ("sbhp/t" with SP)
        total += n * MASK_BYTES * s * b * h / sp_div
    if stage == plan.pp - 1:
        # Korthikanti §4.3: final norm and output-projection inputs and the fp32 logits,
        # "4sbh/t (1 + v/h)"; one micro-batch in flight at the end of the pipe (all m: GPipe).
        n_out = plan.grad_accum if plan.schedule == "gpipe" else 1
        vocab_shard = model.padded_vocab(plan.tp) / plan.tp
        e = _act_element_bytes(plan)
        total += n_out * (2 * e * s * b * h / sp_div + LOGITS_BYTES * s * b * vocab_shard)
        if model.logit_softcap:  # Gemma 2's capped logits: the saved tanh
            total += n_out * e * s * b * vocab_shard
        if model.mtp_depths(plan.impl):
            kept, work = _mtp_activation_bytes(model, plan, dropout=dropout)
            # the backward re-materialises one layer at a time: the larger of a main layer's
            # working set (counted above when the stage has layers) and an MTP depth's
            total += n_out * kept + (max(0.0, work - _working_bytes(plan, terms)) if n_layers else work)
    return total


def _mtp_activation_bytes(model: ModelSpec, plan: Plan, *, dropout: bool) -> tuple[float, float]:
    """(kept for the backward by all MTP depths of one micro-batch, one depth's working set
    under recompute) on the last stage's GPU (DeepSeek-V3 §2.2 as Megatron-core runs it; ``e``
    element bytes, ``sbh`` ÷ t with SP). Per depth: the shifted embedding's dropout mask (the
    lookup runs outside the depth's checkpoint); the two norms' inputs, which full recompute
    keeps as the checkpoint's inputs (``2 e sbh``); without full recompute also ``eh_proj``'s
    ``[s, b, 2h]`` input (``2 e sbh``) and the block's activations (:func:`_kept_bytes` of
    :meth:`ModelSpec.mtp_block`'s layer); then the head's, as the main head's: the final norm's
    and the output projection's inputs (``2 e sbh``) and the fp32 logits for the loss
    (``4 s b v / t``; Gemma 2's capped ones their tanh too). The working set: what full
    recompute re-materialises (``eh_proj``'s input and the whole block), or the block's
    attention scores (selective)."""
    e, mk = _act_element_bytes(plan), (MASK_BYTES if dropout else 0)
    s, b, h = plan.seq(model) / plan.cp, plan.micro_batch, model.hidden
    sp_div = plan.tp if plan.sp and plan.tp > 1 else 1
    vocab_shard = model.padded_vocab(plan.tp) / plan.tp
    sbh = s * b * h / sp_div
    bterms = _layer_activation_terms(model.mtp_block(), plan, dropout=dropout)
    head = 2 * e * sbh + LOGITS_BYTES * s * b * vocab_shard + (e * s * b * vocab_shard if model.logit_softcap else 0.0)
    full = plan.recompute == "full"
    depth = mk * sbh + 2 * e * sbh + (0.0 if full else 2 * e * sbh + _kept_bytes(plan, bterms)) + head
    work = 2 * e * sbh + bterms[0] if full else _working_bytes(plan, bterms)
    return model.mtp_depths(plan.impl) * depth, work


def _dense_layers_activation_delta(model: ModelSpec, plan: Plan, stage: int, layers: Sequence[int], *,
                                   dropout: bool, terms: tuple[float, float, float],
                                   dense_counts: Sequence[int] | None = None,
                                   dense_terms: tuple[float, float, float] | None = None) -> float:  # fmt: skip
    """A stage's activations for its ``dense_layers`` less what :func:`_stage_activations_bytes`
    counted for them as MoE layers (``terms``); the working set (one layer's) the larger of
    the kinds the stage holds. ``dense_counts``, ``dense_terms``: :func:`stage_dense_layers` and
    the dense variant's :func:`_layer_activation_terms`, when the caller has them."""
    nd = (dense_counts or stage_dense_layers(model, plan, layers))[stage]
    if not nd:
        return 0.0
    dterms = dense_terms or _layer_activation_terms(dense_variant(model), plan, dropout=dropout)
    n = in_flight_microbatches(plan, stage)
    extra = nd * n * (_kept_bytes(plan, dterms) - _kept_bytes(plan, terms))
    work_d, work_moe = _working_bytes(plan, dterms), _working_bytes(plan, terms)
    return extra + (work_d - work_moe if nd == layers[stage] else max(0.0, work_d - work_moe))


# --- context parallelism: TransformerEngine's attention buffers ----------------------------


@dataclass(frozen=True, slots=True)
class CPAttentionBytes:
    """One layer's attention tensors on one GPU for one micro-batch under context parallelism:
    the rank's ``s/cp`` tokens, ``h/t`` query heads, ``ceil(n_kv/t)`` KV heads (replicated past
    the KV heads, Megatron), q/k heads ``d_head`` wide (MLA's ``d_qk``), value and output heads
    ``v_dim`` (MLA's ``d_v``), ``e`` bytes an element; the softmax log-sum-exp fp32 per query row
    and head. :class:`~trainsim.builders.llm_comm.PlanComm` sizes the CP collectives from the
    same numbers."""

    q_bytes: int
    k_bytes: int
    v_bytes: int
    o_bytes: int
    lse_bytes: int

    @property
    def kv_bytes(self) -> int:
        return self.k_bytes + self.v_bytes


_CP_BYTES: dict[tuple[int, int, int, int], tuple[ModelSpec, CPAttentionBytes]] = {}


def cp_attention_bytes(model: ModelSpec, plan: Plan) -> CPAttentionBytes:
    """:class:`CPAttentionBytes` of ``plan`` (whole bytes: Plan.validate makes ``2·cp`` divide
    the sequence and ``tp`` the heads), kept per model object and shape (a search asks for
    them on every plan)."""
    e, tok = _act_element_bytes(plan), plan.micro_batch * (plan.seq(model) // plan.cp)
    key = (id(model), e, tok, plan.tp)
    hit = _CP_BYTES.get(key)
    if hit is None or hit[0] is not model:  # the model is held, so its id is not reused while kept
        if len(_CP_BYTES) >= 4096:
            _CP_BYTES.clear()
        hq, hkv = model.heads // plan.tp, -(-model.n_kv // plan.tp)
        t = CPAttentionBytes(e * tok * hq * model.d_head, e * tok * hkv * model.d_head, e * tok * hkv * model.v_dim,
                             e * tok * hq * model.v_dim, LSE_BYTES * tok * hq)  # fmt: skip
        hit = _CP_BYTES[key] = (model, t)
    return hit[1]


def _cp_layer_shares(model: ModelSpec, plan: Plan) -> tuple[float, float, float]:
    """The shares of the layers whose attention runs TransformerEngine's (p2p ring, KV
    all-gather, a2a) CP: ``Plan.cp_comm``'s, except that under ``p2p`` a sliding-window model's
    windowed layers run the all-gather (flash attention; the ring refuses a window,
    :meth:`~trainsim.builders.llm_comm.PlanComm.cp_window_layer`). All 0 with ``cp`` 1."""
    if plan.cp <= 1:
        return 0.0, 0.0, 0.0
    if plan.cp_comm == "a2a":
        return 0.0, 0.0, 1.0
    if plan.cp_comm == "all_gather":
        return 0.0, 1.0, 0.0
    phi = model.windowed_layers(plan.seq(model)) if model.sliding_window and plan.attention == "flash" else 0.0
    return 1.0 - phi, phi, 0.0


def cp_kept_bytes(model: ModelSpec, plan: Plan) -> float:
    """What one layer keeps for its backward under context parallelism beyond the unsplit
    layer's tensors (:func:`_layer_activation_terms`), averaged over the layers: the KV
    all-gather's two per-chunk partial outputs (TE ``AttnFuncWithCPAndKVAllGather.forward``
    saves ``out_per_step`` beside the output it copies them into, ``O``). The ring saves ``q``,
    the last K/V it received, the output and the corrected LSE (the same sizes as without CP);
    a2a the re-laid-out ``q, k, v`` and the output (the same again)."""
    if plan.cp <= 1 or not (share := _cp_layer_shares(model, plan)[1]):
        return 0.0
    return share * cp_attention_bytes(model, plan).o_bytes


def cp_transient_bytes(model: ModelSpec, plan: Plan) -> float:
    """The largest transient allocation of one layer's context-parallel attention, forward or
    backward (one layer at a time, freed when its attention returns; a full recomputation
    re-runs the forward's), beyond what the layer keeps and the gradients it returns (activation
    gradients are not modelled: module docstring). From TransformerEngine's
    ``dot_product_attention/context_parallel.py`` (``Q K V O L``: :class:`CPAttentionBytes`,
    ``KV = K + V``, ``cp`` ranks):

    * p2p (``AttnFuncWithCPAndKVP2P``): forward ``cp·(KV + O + L)`` — ``p2p_comm_buffers``
      holds every K/V block received (one is saved, the rank's own K/V dropped after the
      layer), ``out_per_step`` and ``softmax_lse_per_step`` every step's partial output and LSE
      until the correction after the loop (the last rank's steps all full-chunk tiles; the
      busiest GPU sets the peak); backward ``Q + 4·KV`` — two ``[K/V, dK/dV]`` ring buffers
      (one dK/dV is the gradient returned) and one step's partial dQ, dK, dV;
    * all_gather (``AttnFuncWithCPAndKVAllGather``): forward ``cp·KV + cp·max(K, V)`` — the
      gathered full-sequence K and V and one ``index_select`` reordering copy; backward
      ``(3 cp + ½)·KV + cp·max(K, V) + Q`` — K and V gathered again, the full-sequence dK/dV
      accumulators, both steps' dK/dV over their key ranges (rank r's chunks reach ``(r+1)``
      and ``(2cp−r)`` of the ``2cp`` chunks), both steps' dQ halves and the reordering copy
      before the reduce-scatter;
    * a2a (``AttnFuncWithCPAndQKVOA2A``, ``flash_attn_a2a_communicate``): forward
      ``Q + KV + max(Q + KV + max(Q, K, V), 3·O)`` — the sequence-split Q, K, V, while the
      re-laid-out sends are alive (one reordering copy), then the core's output, its re-laid-out
      send and the receive; backward ``max(5·O, 2·O + 3·(Q + KV))`` — O and dO's sends,
      receives and a reordering copy, then the re-laid-out O and dO, the core's dQ, dK, dV,
      their sends and receives.

    Approximations: the worst rank's steps and the causal split without a window (a window
    shrinks the all-gather's per-step key ranges); the contiguous half-chunk copies a step
    makes for its kernel and fp8 left out; a model mixing kinds (windowed layers under p2p)
    takes the larger. 0 with ``cp`` 1. ``a2a+p2p`` (hierarchical CP) is not a ``Plan.cp_comm``."""
    p2p, ag, a2a = _cp_layer_shares(model, plan)
    if not (p2p or ag or a2a):
        return 0.0
    t, cp = cp_attention_bytes(model, plan), plan.cp
    q, k, v, o, kv = t.q_bytes, t.k_bytes, t.v_bytes, t.o_bytes, t.kv_bytes
    out = 0.0
    if p2p:
        out = max(out, cp * (kv + o + t.lse_bytes), q + 4 * kv)
    if ag:
        out = max(out, cp * kv + cp * max(k, v), (3 * cp + 0.5) * kv + cp * max(k, v) + q)
    if a2a:
        out = max(out, q + kv + max(q + kv + max(q, k, v), 3 * o), 5 * o, 2 * o + 3 * (q + kv))  # fwd, bwd
    return out


# --- buffers -------------------------------------------------------------------------------


def _buffers_bytes(
    model: ModelSpec, plan: Plan, stage: int, precision: Precision, *, overhead_bytes: float,
    layer_params: tuple[float, float], cp_bytes: float = 0.0,
) -> float:  # fmt: skip
    """Fixed and transient allocations outside weights/gradients/optimizer/activations:

    * ``overhead_bytes`` (default CUDA context + cuBLAS workspace, see the constants);
    * :data:`NCCL_COMM_BYTES` per communicator in use (tp, pp, dp×cp gradient reduction, cp, ep);
    * pipeline: the activation gradient received and the one sent, ``2·e·sbh`` (÷ t with SP);
    * last stage: the 16-bit logits of the output projection before the fp32 cast for the loss
      (``e·s b v/t``);
    * context parallelism: ``cp_bytes``, one layer's attention transients
      (:func:`cp_transient_bytes`), once: they live while one layer's attention runs (forward,
      its recomputation, backward), beside the pipeline's and ZeRO's buffers, which are added,
      but never beside the last stage's logits (the loss runs between the last layer's forward
      and its backward), so that stage takes the larger of the two;
    * ZeRO-3 (FSDP): two layers' gathered parameters (current + prefetched) and one layer's
      unsharded gradients before reduce-scatter; ZeRO-2: the latter only (bucketed
      reduce-scatter, as FSDP's SHARD_GRAD_OP). Approximation: one layer per bucket
      (:func:`_zero_buffers_bytes`; impl hf at the step's peak places FSDP's tensors in their
      moments instead, :func:`_hf_fsdp_phases`).
    """
    e = _act_element_bytes(plan)
    s, b, h = plan.seq(model) / plan.cp, plan.micro_batch, model.hidden
    sp_div = plan.tp if plan.sp and plan.tp > 1 else 1
    groups = [plan.tp, plan.pp, plan.dp * plan.cp, plan.cp, plan.ep]
    total = overhead_bytes + NCCL_COMM_BYTES * sum(1 for g in groups if g > 1)
    if plan.pp > 1:
        total += 2 * e * s * b * h / sp_div
    logits = e * s * b * model.padded_vocab(plan.tp) / plan.tp if stage == plan.pp - 1 else 0.0
    total += max(logits, cp_bytes)
    return total + _zero_buffers_bytes(plan, precision, layer_params)


def _sharded_layer_params(plan: Plan, layer_params: tuple[float, float]) -> float:
    """The parameters of one layer that ZeRO shards, hence gathers and reduce-scatters: the
    dense ones over dp·cp ranks, the experts over dp·cp/ep (Megatron's expert-data-parallel
    group; none when it is one rank)."""
    dense, experts = _zero_groups(layer_params, plan.ep)
    return (dense if plan.dp * plan.cp > 1 else 0.0) + (experts if plan.dp * plan.cp // plan.ep > 1 else 0.0)


def _zero_buffers_bytes(plan: Plan, precision: Precision, layer_params: tuple[float, float]) -> float:
    """:func:`_buffers_bytes`'s ZeRO-2/3 term (every moment at once; impl hf's phases,
    :func:`_hf_fsdp_phases`, place FSDP's buffers in their moments instead)."""
    layer = _sharded_layer_params(plan, layer_params)
    if layer <= 0 or plan.zero < 2:
        return 0.0
    return layer * precision.grad_bytes + (2 * layer * precision.weight_bytes if plan.zero == 3 else 0.0)


# --- per GPU -------------------------------------------------------------------------------


def _largest_layer(model: ModelSpec, plan: Plan, layer_params: tuple[float, float],
                   dense_extra: tuple[float, float] | None = None) -> tuple[float, float]:  # fmt: skip
    """``layer_params`` (an MoE layer's), or a dense layer's where ``model.dense_layers`` are
    the larger or the only layers (ZeRO's per-layer buffers hold the largest layer);
    ``dense_extra``: :func:`dense_layer_extra_params`, when the caller has it."""
    if not model.dense_layers:
        return layer_params
    more_dense, more_expert = dense_extra or dense_layer_extra_params(model, plan)
    dense = (layer_params[0] + more_dense, layer_params[1] + more_expert)
    return dense if sum(dense) > sum(layer_params) or not model.moe_layers else layer_params


def memory_per_gpu(
    model: ModelSpec,
    plan: Plan,
    *,
    precision: Precision | None = None,
    layers_per_stage: Sequence[int] | None = None,
    dropout: bool = True,
    overhead_bytes: float = DEFAULT_OVERHEAD_BYTES,
    at_peak: bool = True,
) -> list[MemoryBreakdown]:
    """Memory of one GPU of each pipeline stage (see the module docstring).

    ``at_peak``: impl hf, each stage's breakdown at its step's largest moment (:func:`_hf_peak`);
    False: every term at once (the fused stacks' figure). For impl hf that is not an upper bound:
    the moments' own transients (AdamW's foreach temporary, the loss's two fp32 ``[T, V]``
    gradients, the head's logits gradient, a tied embedding's out-of-place sum) are in no term,
    so the peak can exceed it (llama3-8b, 1,024 tokens, dp 2, ZeRO 0: the optimizer step's
    90.6 GiB against 82.3 GiB); it is at most the sum plus the largest of those.

    ``precision`` defaults to :meth:`Precision.for_dtype` of ``plan.dtype`` (no optimizer state
    with ``plan.optimizer == "sgd"``);
    ``layers_per_stage`` to :func:`stage_layers` (``plan.partition`` chooses Megatron's or GPT-NeoX's).
    """
    plan.validate(model)
    prec = precision or Precision.for_dtype(plan.dtype, plan.impl)
    if precision is None and plan.optimizer == "sgd":  # plain SGD keeps no state
        prec = Precision(prec.weight_bytes, prec.grad_bytes, 0.0)
    layers = list(layers_per_stage) if layers_per_stage is not None else stage_layers(model, plan)
    if len(layers) != plan.pp or sum(layers) != model.layers or min(layers) < 0:
        raise ConfigError(
            f"memory: layers_per_stage {layers} must be {plan.pp} non-negative counts summing to "
            f"{model.name}'s {model.layers} layers"
        )
    shards = plan.dp * plan.cp
    dense_prec = prec.sharded(plan.zero, shards)
    expert_prec = prec.sharded(plan.zero, shards / plan.ep)
    out = []
    # per plan, not per stage (a search asks for ~10^5 plans of up to ~100 stages)
    layer_params = _layer_params_per_gpu(model, plan.tp, plan.ep)
    terms = _layer_activation_terms(model, plan, dropout=dropout)
    counts: list[int] | None = None
    extra: tuple[float, float] | None = None
    dterms: tuple[float, float, float] | None = None
    if model.dense_layers:
        counts = stage_dense_layers(model, plan, layers)
        extra = dense_layer_extra_params(model, plan)
        dterms = _layer_activation_terms(dense_variant(model), plan, dropout=dropout)
    cp_bytes = cp_transient_bytes(model, plan)
    buffers: dict[bool, float] = {}  # only the last stage's differ
    for i in range(plan.pp):
        dense, expert = _stage_params_split(model, plan, i, layers, layer_params, dense_counts=counts,
                                            dense_extra=extra)
        last = i == plan.pp - 1
        if last not in buffers:
            buffers[last] = _buffers_bytes(model, plan, i, prec, overhead_bytes=overhead_bytes,
                                           layer_params=_largest_layer(model, plan, layer_params, extra),
                                           cp_bytes=cp_bytes)  # fmt: skip
        out.append(
            MemoryBreakdown(
                stage=i,
                weights_bytes=dense * dense_prec.weight_bytes + expert * expert_prec.weight_bytes,
                gradients_bytes=dense * dense_prec.grad_bytes + expert * expert_prec.grad_bytes,
                optimizer_bytes=dense * dense_prec.optimizer_bytes
                + expert * expert_prec.optimizer_bytes,
                activations_bytes=_hf_stage_activations_bytes(model, plan, i, layers[i], counts[i] if counts else 0)
                if plan.impl == "hf" else _stage_activations_bytes(
                    model, plan, i, layers[i], dropout=dropout, terms=terms
                ) + (_dense_layers_activation_delta(model, plan, i, layers, dropout=dropout, terms=terms,
                                                    dense_counts=counts, dense_terms=dterms)
                     if model.dense_layers else 0.0),
                buffers_bytes=buffers[last] + _ddp_bucket_bytes(plan, dense * dense_prec.grad_bytes
                                                                + expert * expert_prec.grad_bytes),
            )
        )
        if plan.impl == "hf" and at_peak:
            fsdp = None
            if _hf_fsdp(plan):
                largest = _largest_layer(model, plan, layer_params, extra)
                in_layers = layers[i] * sum(layer_params) + ((counts[i] if counts else 0) * sum(extra) if extra else 0.0)
                fsdp = _HfFsdp(shard_weights=dense * prec.sharded(3, shards).weight_bytes
                               + expert * prec.sharded(3, shards / plan.ep).weight_bytes,
                               full_weights=(dense + expert) * prec.weight_bytes,
                               root_params=dense + expert - in_layers, layer_params=_sharded_layer_params(plan, largest),
                               layers=layers[i], zero_buffers=_zero_buffers_bytes(plan, prec, largest))  # fmt: skip
            out[-1] = _hf_peak(model, plan, out[-1], prec,
                               _hf_stage_work(model, plan, layers[i], counts[i] if counts else 0), fsdp=fsdp)
    return out


def _hf_fsdp(plan: Plan) -> bool:
    """impl hf with sharded gradients over more than one rank: PyTorch FSDP (zero 3 full shard,
    zero 2 SHARD_GRAD_OP), not DDP."""
    return plan.impl == "hf" and plan.zero >= 2 and plan.dp * plan.cp > 1


@dataclass(frozen=True, slots=True)
class _HfFsdp:
    """One stage's FSDP units for :func:`_hf_fsdp_phases`: its weights sharded and whole (bytes),
    the root unit's parameters (the stage's outside its layers: embedding, final norm, head), the
    largest layer's sharded parameters, the stage's layers, and the every-moment ZeRO buffers
    :func:`_buffers_bytes` put in the breakdown (taken out again)."""

    shard_weights: float
    full_weights: float
    root_params: float
    layer_params: float
    layers: int
    zero_buffers: float


def _ddp_bucket_bytes(plan: Plan, grads: float) -> float:
    """impl hf with data parallelism and unsharded gradients (zero <= 1: PyTorch DDP): the
    Reducer's flat bucket tensors, a copy of every gradient, allocated with the module and kept
    (``gradient_as_bucket_view`` is False by default: autograd's ``.grad`` tensors are copied in
    for the all-reduce and back after it). Measured on 2 gloo ranks (``trainsim validate
    memory``'s ``ddp`` cases): one gradient's bytes more in every moment of the step."""
    return grads if plan.impl == "hf" and plan.dp * plan.cp > 1 and plan.zero <= 1 else 0.0


def _hf_peak(model: ModelSpec, plan: Plan, m: MemoryBreakdown, prec: Precision, work: float, *,
             fsdp: _HfFsdp | None = None) -> MemoryBreakdown:  # fmt: skip
    """impl hf: the stage's memory at the largest of the step's peaks (``m``: every term summed).

    Eager PyTorch frees what the fused stacks keep: ``optimizer.zero_grad()`` sets the
    gradients to None (its default since torch 2.0), so they exist from the backward on, while
    the activations are freed layer by layer as the backward passes them, and the optimizer is
    torch's AdamW as it runs by default on a GPU (``foreach``, not ``fused``). The peaks:

    * **loss-backward** (last stage): every activation, the gradients of earlier micro-batches
      only (none without accumulation), and the loss's backward: ``F.cross_entropy`` is
      ``log_softmax`` (its fp32 ``[T, V]`` output saved: the census's) and ``nll_loss``, whose
      backward allocates the fp32 ``[T, V]`` gradient it scatters into, and
      ``_log_softmax_backward_data`` a second for its result: ``8 T V`` bytes.
    * **head-backward** (last stage, no accumulated gradients): the output projection's
      backward allocates its weight's gradient (``V d`` at the gradient bytes) and the hidden
      states' (``T d``) while the logits' gradient (``T V`` in the logits' dtype) is alive and
      the saved log-softmax output freed. Past it the backward frees a layer's activations as
      it allocates that layer's gradients, so the alive bytes move monotonically between this
      moment and the end of the backward, which the optimizer step exceeds.
    * **recompute** (``recompute="full"``, gradient checkpointing): the two moments above come
      before the backward re-runs any layer, so they hold the layers' inputs without ``work``
      (one layer's re-materialised activations); the first re-run layer then holds it, beside
      the output projection's gradient, the loss's tensors freed.
    * **embedding-backward** (tied embeddings, one stage): the output projection's gradient
      of the shared weight waits in autograd's input buffer for the embedding's, and the two
      are summed out of place (the head's ``mm`` gradient is a transposed view, which
      ``InputBuffer::accumulate`` does not add into): every other gradient and three ``V d``
      tensors at once.
    * **optimizer-step**: the gradients of every parameter, no activations, the logits still
      referenced by the model's output, and ``torch.optim._multi_tensor_adam``'s temporaries:
      ``torch._foreach_sqrt(exp_avg_sqs)`` allocates one second-moment-sized tensor per
      parameter (half the optimizer state: 4 bytes a parameter in fp32, 2 in bf16); SGD
      (``--optimizer sgd``, no momentum) updates in place.

    Under FSDP (``fsdp``: zero 2 or 3 over more than one rank) the same moments hold FSDP's
    parameters and gradients where :func:`_hf_fsdp_phases` says.

    Checked against the peaks of real training steps measured on this machine's CPU
    (``trainsim validate memory``)."""
    if fsdp is not None:
        return _hf_fsdp_phases(model, plan, m, prec, work=work, f=fsdp)
    last = m.stage == plan.pp - 1
    tokens = float(plan.micro_batch * plan.seq(model))
    vocab, d, e = float(model.vocab), float(model.hidden), _act_element_bytes(plan)
    accumulated = m.gradients_bytes if plan.grad_accum > 1 else 0.0
    temps = m.optimizer_bytes / 2  # one of AdamW's two moments (no master copy in eager PyTorch)
    phases = [
        MemoryBreakdown(m.stage, m.weights_bytes, m.gradients_bytes, m.optimizer_bytes, 0.0,
                        m.buffers_bytes + temps, "optimizer-step"),
    ]  # fmt: skip
    head_grad = vocab * d * prec.grad_bytes  # whole, also under FSDP (reduce-scattered after)
    if last:
        saved = LOGITS_BYTES * tokens * vocab  # the log-softmax output
        before = m.activations_bytes - work  # no layer re-run yet
        phases.append(MemoryBreakdown(m.stage, m.weights_bytes, accumulated, m.optimizer_bytes, before,
                                      m.buffers_bytes + 2 * LOGITS_BYTES * tokens * vocab, "loss-backward"))  # fmt: skip
        grads = accumulated or head_grad
        phases.append(MemoryBreakdown(m.stage, m.weights_bytes, grads, m.optimizer_bytes, max(before - saved, 0.0),
                                      m.buffers_bytes + e * tokens * vocab + e * tokens * d, "head-backward"))  # fmt: skip
        if work:
            phases.append(MemoryBreakdown(m.stage, m.weights_bytes, grads, m.optimizer_bytes,
                                          max(m.activations_bytes - saved, 0.0), m.buffers_bytes, "recompute"))  # fmt: skip
        if model.tied_embeddings and plan.pp == 1:
            phases.append(MemoryBreakdown(m.stage, m.weights_bytes, m.gradients_bytes, m.optimizer_bytes, 0.0,
                                          m.buffers_bytes + 2 * head_grad, "embedding-backward"))  # fmt: skip
    else:
        phases.append(MemoryBreakdown(m.stage, m.weights_bytes, accumulated, m.optimizer_bytes, m.activations_bytes,
                                      m.buffers_bytes, "backward"))  # fmt: skip
    return max(phases, key=lambda p: p.total_bytes)


def _hf_fsdp_phases(model: ModelSpec, plan: Plan, m: MemoryBreakdown, prec: Precision, *, work: float,
                    f: _HfFsdp) -> MemoryBreakdown:  # fmt: skip
    """impl hf under PyTorch FSDP2 (``fully_shard`` per decoder layer, then the root with the
    same ``reshard_after_forward``, as accelerate's ``fsdp2_prepare_model`` wraps a transformers
    model: True for zero 3, False for zero 2 / SHARD_GRAD_OP): :func:`_hf_peak`'s moments with
    FSDP's tensors where torch's ``_fsdp_param_group.py`` / ``_fsdp_collectives.py`` (2.13)
    allocate and free them. Persistent: every parameter's shard and the optimizer state of the
    shards (zero 2 too: the unsharded parameters are freed after each unit's backward,
    ``reshard_after_backward``). With ``W`` shards, ``R`` the root unit's parameters (embedding,
    final norm, head) and ``Lp`` the largest layer's, ``w``/``g`` the weight and gradient bytes:

    * zero 3, the start of the backward (*backward-gather*, last stage): the root's
      ``pre_backward`` re-gathers it, the all-gather output and the unsharded copy both alive
      in ``foreach_all_gather_copy_out`` (``2 R w``), every activation there;
    * then (*loss-backward*, *head-backward*): the root unsharded and the last layer's
      all-gather output its ``_backward_prefetch`` started (``(R + Lp) w``); zero 2: every unit
      unsharded since the forward (``P w``, beside the shards);
    * *recompute*: zero 3 the root, the re-run layer and the next one prefetched
      (``(R + 2 Lp) w``);
    * *embedding-backward* (every model: the root's ``post_backward`` runs in the final
      callback, its input ids needing no gradient): the root unsharded with all its gradients
      (``R (w + g)``; tied, the two contributions to the shared weight beside their sum,
      ``2 V d g`` more), every layer's gradient reduce-scattered to its shard, the last
      reduce-scatter's input still held (``reduce_scatter_states``, ``Lp g``). Its own
      reduce-scatter (``2 R g`` once the root is resharded) is smaller while ``w ≥ g``;
    * *optimizer-step*: shards only (weights, gradients, state and the foreach temporary).

    Not measured: pp > 1 (an earlier stage's *backward* takes the root and two layers gathered,
    zero 2 every unit, and a layer's reduce-scatter input), MoE, other wrappings (torchtitan
    wraps the embedding and the head apart and leaves the root unsharded after forward).
    Measured on two gloo ranks (``trainsim validate memory``'s ``fsdp`` cases)."""
    last = m.stage == plan.pp - 1
    tokens = float(plan.micro_batch * plan.seq(model))
    vocab, d, e = float(model.vocab), float(model.hidden), _act_element_bytes(plan)
    w, g = prec.weight_bytes, prec.grad_bytes
    base = m.buffers_bytes - f.zero_buffers  # the logits, NCCL's and the context, not FSDP's
    sw, rw, lw = f.shard_weights, f.root_params * w, f.layer_params * w
    accumulated = m.gradients_bytes if plan.grad_accum > 1 else 0.0  # earlier micro-batches', sharded
    held = f.full_weights if plan.zero == 2 else rw + min(f.layers, 1) * lw  # during the backward
    phases = [MemoryBreakdown(m.stage, sw, m.gradients_bytes, m.optimizer_bytes, 0.0, base + m.optimizer_bytes / 2,
                              "optimizer-step")]  # fmt: skip
    if last:
        head_grad = vocab * d * g
        saved = LOGITS_BYTES * tokens * vocab
        before = m.activations_bytes - work
        if plan.zero == 3:
            phases.append(MemoryBreakdown(m.stage, sw + 2 * rw, accumulated, m.optimizer_bytes, before, base,
                                          "backward-gather"))  # fmt: skip
        phases.append(MemoryBreakdown(m.stage, sw + held, accumulated, m.optimizer_bytes, before,
                                      base + 2 * LOGITS_BYTES * tokens * vocab, "loss-backward"))  # fmt: skip
        phases.append(MemoryBreakdown(m.stage, sw + held, accumulated + head_grad, m.optimizer_bytes,
                                      max(before - saved, 0.0), base + e * tokens * vocab + e * tokens * d,
                                      "head-backward"))  # fmt: skip
        if work:
            rerun = f.full_weights if plan.zero == 2 else rw + min(f.layers, 2) * lw
            phases.append(MemoryBreakdown(m.stage, sw + rerun, accumulated + head_grad, m.optimizer_bytes,
                                          max(m.activations_bytes - saved, 0.0), base, "recompute"))  # fmt: skip
        root_g = f.root_params * g + (2 * head_grad if model.tied_embeddings and plan.pp == 1 else 0.0)
        # every gradient's shard (the root's own not yet, unless an earlier micro-batch made it)
        shards = m.gradients_bytes - (0.0 if accumulated else f.root_params * g / (plan.dp * plan.cp))
        phases.append(MemoryBreakdown(m.stage, sw + rw, shards + root_g, m.optimizer_bytes, 0.0,
                                      base + (f.layer_params * g if f.layers else 0.0), "embedding-backward"))  # fmt: skip
    else:
        phases.append(MemoryBreakdown(m.stage, sw + held + (0.0 if plan.zero == 2 else lw), accumulated,
                                      m.optimizer_bytes, m.activations_bytes, base + f.layer_params * g, "backward"))  # fmt: skip
    return max(phases, key=lambda p: p.total_bytes)


def peak_memory(
    model: ModelSpec,
    plan: Plan,
    *,
    precision: Precision | None = None,
    layers_per_stage: Sequence[int] | None = None,
    dropout: bool = True,
    overhead_bytes: float = DEFAULT_OVERHEAD_BYTES,
) -> MemoryBreakdown:
    """The stage with the largest total (the first on ties); keywords as :func:`memory_per_gpu`."""
    stages = memory_per_gpu(
        model,
        plan,
        precision=precision,
        layers_per_stage=layers_per_stage,
        dropout=dropout,
        overhead_bytes=overhead_bytes,
    )
    return max(stages, key=lambda m: m.total_bytes)


def fits(
    model: ModelSpec,
    plan: Plan,
    device_memory_bytes: float,
    *,
    precision: Precision | None = None,
    layers_per_stage: Sequence[int] | None = None,
    dropout: bool = True,
    overhead_bytes: float = DEFAULT_OVERHEAD_BYTES,
) -> tuple[bool, MemoryBreakdown]:
    """Whether the peak stage fits in ``device_memory_bytes`` (:func:`fits_within`), and that
    stage's breakdown."""
    peak = peak_memory(
        model,
        plan,
        precision=precision,
        layers_per_stage=layers_per_stage,
        dropout=dropout,
        overhead_bytes=overhead_bytes,
    )
    return fits_within(peak.total_bytes, device_memory_bytes), peak


def min_gpus_for_states(model: ModelSpec, plan: Plan, capacity_bytes: float) -> int:
    """A lower bound on the GPUs of ``capacity_bytes`` each that can hold the model at all: its
    weights, gradients and optimizer states (``plan.dtype``'s bytes per parameter, none with
    SGD; the multi-token-prediction depths' included) sharded evenly over every GPU, as ZeRO-3 with TP and PP would at best, beside the CUDA
    context; activations and buffers come on top, so more may be needed."""
    prec = Precision.for_dtype(plan.dtype, plan.impl)
    per_param = prec.weight_bytes + prec.grad_bytes + (prec.optimizer_bytes if plan.optimizer != "sgd" else 0.0)
    room = capacity_bytes - DEFAULT_OVERHEAD_BYTES
    if room <= 0:
        return 0  # not even the context fits: no GPU count helps
    params = model.params() + (model.mtp_params() if model.mtp_depths(plan.impl) else 0)  # the MTP depths train too
    return max(1, math.ceil(params * per_param / room))


_UNITS = {"gib": GiB, "gb": 1e9, "mib": MiB, "mb": 1e6}


def parse_headroom(text: str | float) -> tuple[float, bool]:
    """``--memory-headroom``'s form alone, whatever the GPU: ``(fraction, False)`` for a fraction
    below 1 or a percentage, ``(bytes, True)`` for an amount (at least 0); a ConfigError naming
    the option otherwise (:func:`headroom_bytes` checks an amount against the GPU)."""
    raw = str(text).strip()
    s = raw.lower().replace(" ", "")
    expected = "expected a fraction below 1 (0.1), a percentage (10%) or an amount (6GiB, 512MiB, 8GB)"
    try:
        if s.endswith("%"):
            frac = float(s[:-1]) / 100.0
        else:
            unit = next((u for u in _UNITS if s.endswith(u)), None)
            if unit is not None:
                amount = float(s[: -len(unit)]) * _UNITS[unit]
                if not (math.isfinite(amount) and amount >= 0):
                    raise ConfigError(f"--memory-headroom {raw!r}: an amount must be at least 0")
                return amount, True
            frac = float(s)
    except ValueError:
        raise ConfigError(f"--memory-headroom {raw!r}: {expected}") from None
    if not (math.isfinite(frac) and 0 <= frac < 1):
        if s.endswith("%"):  # a percentage, out of range: say the range, not the forms
            raise ConfigError(f"--memory-headroom {raw!r}: a percentage must be at least 0 and below 100%")
        raise ConfigError(f"--memory-headroom {raw!r}: {expected}")
    return frac, False


def fits_within(total_bytes: float, limit_bytes: float) -> bool:
    """Whether a plan needing ``total_bytes`` a GPU fits in ``limit_bytes`` (:func:`memory_limit`),
    its need taken in the whole bytes the JSON reports it in (``memory_per_gpu_bytes``, rounded:
    layer shares can leave a fraction of a byte), so that ``fits_in_memory`` is always
    ``memory_per_gpu_bytes <= memory_limit_bytes`` as printed. :func:`fits`, ``predict`` and
    ``search`` all decide with it; a need that is not finite never fits."""
    return math.isfinite(total_bytes) and round(total_bytes) <= limit_bytes


def memory_limit(capacity_bytes: float, headroom: float = 0.0) -> int:
    """What a plan may use per GPU: ``capacity_bytes`` less ``headroom`` (:func:`headroom_bytes`),
    in whole bytes, rounded down (at least the headroom stays free; some devices' capacities,
    e.g. the H200's 139.2 GiB, are not whole bytes). ``predict``'s ``memory_limit_bytes`` /
    ``fits_in_memory`` and ``search``'s screening both take it, so a plan fits in one exactly
    when it fits in the other."""
    return math.floor(capacity_bytes - headroom)


def headroom_bytes(text: str | float | None, capacity_bytes: float) -> int:
    """Bytes of ``capacity_bytes`` to keep free (``--memory-headroom``): the allocator's
    fragmentation and, for the fused stacks, the backward's activation gradients and the
    optimizer's temporaries, which :func:`memory_per_gpu` does not count (module docstring). ``text`` is a fraction below 1
    (``0.1``), a percentage (``10%``) or an amount (``6GiB``, ``6GB``, ``512MiB``); ``None`` or
    0 keeps none. Whole bytes, rounded up (at least what was asked stays free)."""
    if text is None:
        return 0
    value, amount = parse_headroom(text)
    if not amount:
        return math.ceil(value * capacity_bytes)
    if value >= capacity_bytes:
        raise ConfigError(f"--memory-headroom {str(text).strip()!r}: must be at least 0 and below the GPU's "
                          f"{capacity_bytes / GiB:.1f} GiB")  # fmt: skip
    return math.ceil(value)
