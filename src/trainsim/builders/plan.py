"""How a model is trained: :class:`Plan` (parallel degrees, batches, schedule, recompute, ZeRO).

Ranks are laid out as Megatron does: tensor parallel innermost (consecutive ranks, inside a
node when it fits), then context parallel, then data parallel, then pipeline stages
outermost; expert parallelism splits the data-parallel ranks (``ep`` divides ``dp``). World size
is ``tp × cp × dp × pp``.

``global_batch = micro_batch × dp × grad_accum`` (sequences); each pipeline runs
``grad_accum`` micro-batches per iteration. ``schedule``: ``1f1b`` (PipeDream-flush, Megatron's
default), ``interleaved`` (``vpp`` model chunks per stage, Megatron's interleaved 1F1B),
``gpipe`` (all forwards, then all backwards). ``recompute``: ``none``, ``selective`` (the
attention core is recomputed, Korthikanti et al.), ``full`` (every layer's forward is re-run
before its backward). ``zero``: 0 plain data parallel, 1 optimizer states sharded, 2 + gradients,
3 + parameters (FSDP full shard). ``dist_optimizer``: ZeRO-1 as Megatron-LM's distributed
optimizer runs it (``--use-distributed-optimizer``): the gradients reduce-scattered, each rank
updating its shard, the weights all-gathered (ZeRO-2's traffic, ZeRO §7.2.1) while every rank keeps
the whole gradient buffer (ZeRO-1's memory; Megatron-core docs: "6 + 12/d" bytes per bf16
parameter); without it ZeRO-1 is DeepSpeed's stage 1, which all-reduces the gradients. ``attention``: ``flash`` (FlashAttention), ``fused`` (QK^T and
·V batched GEMMs around Megatron's fused scale-mask-softmax kernel), ``unfused`` (GEMMs, fill-mask,
softmax as separate kernels), the three implementations paper 001 Table I models.
``wgrad_fusion``: weight gradients accumulate inside their GEMMs (Megatron-LM's
``--gradient-accumulation-fusion``); without it (PyTorch autograd, DeepSpeed, FSDP) every
micro-batch after the first adds each parameter tensor's gradient with a separate kernel.
``overlap_grad_reduce``: the data-parallel gradient reduction runs in buckets during the last
micro-batch's backward, as PyTorch DDP (25 MiB buckets, its default) and Megatron-core's
``--overlap-grad-reduce`` do; without it (Megatron-LM's local DDP, DeepSpeed's pipeline engine,
the default here) it starts after the last backward
(:func:`trainsim.builders.llm.reduction_tail_s`).
``overlap_param_gather`` (``dist_optimizer`` with ``overlap_grad_reduce``, ``dp × cp`` > 1): the
weights the update leaves sharded are all-gathered bucket by bucket during the next iteration's
first forward, as Megatron-core's ``--overlap-param-gather`` does (it needs the distributed
optimizer and asserts ``--overlap-grad-reduce``), instead of after the update
(:func:`trainsim.builders.llm.param_gather_delay_s`); without it, with ``overlap_grad_reduce``
the distributed optimizer's bucketed buffers gather after the update bucket after bucket
(:func:`trainsim.builders.llm._bucketed_param_gather`). Not with ZeRO-2: no framework modelled
here runs it there (DeepSpeed gathers inside its step; torchtitan's FSDP2 re-gathers every
micro-batch; Megatron-FSDP is left out, :mod:`trainsim.search.frameworks`).
``hidden_dropout``: a separate dropout kernel on the embedding output and on each sub-layer's
output before its residual add, as HuggingFace models run ``nn.Dropout`` (Megatron fuses it with
the bias and residual add: leave it 0 there, the residual-add operator stands for the fusion).
``impl``: ``fused`` (the fused kernels paper 001 times: Megatron, or any stack with fused norm,
activation, rotary and loss kernels; an RMSNorm is a fused kernel too), ``neox`` (GPT-NeoX, as
paper 001's runs: the same, except that its RMSNorm is a PyTorch module of several kernels,
which is what 001's RMSNorm operator measured) or ``hf`` (HuggingFace modules in eager PyTorch:
their norms, rotary embeddings, activations, residual adds, dropout and loss run as the many
aten calls :mod:`trainsim.builders.eager` counts; one GPU per model replica: tp = cp = 1, and ep = 1 for MoE).
``hf_experts`` (``impl`` ``hf``, MoE models): transformers 5's experts implementation,
``grouped_mm`` (its default: the tokens sorted by expert, one grouped GEMM per projection over
all experts) or ``eager`` (``experts_implementation="eager"``: a loop over the experts, one GEMM
pair each); None (the default) is ``grouped_mm``, as transformers picks when none is asked for.
``moe_grouped_gemm`` (MoE models, not ``impl`` ``hf``): Megatron-core's ``--moe-grouped-gemm``, the
local experts' GEMMs run by TransformerEngine's ``GroupedLinear`` (TEGroupedMLP: one call per
projection, one cuBLAS GEMM per expert issued from C++ over TE's four compute streams); without it
(Megatron's default, SequentialMLP) each local expert is a module of its own, called in a Python
loop (:meth:`trainsim.builders.costs.LayerCoster.expert_gemms`).
``partition``: how the layers are split over the pipeline stages: ``even`` (Megatron: equal
shares, the first stages taking any remainder) or ``001`` (GPT-NeoX's DeepSpeed pipeline as
paper 001 Eq. 3–5 gives it: the embedding blocks count as two layers of the first stage and the
final norm and head as three of the last, :func:`trainsim.builders.memory.stage_layers_001`).
``first_stage_layers`` / ``last_stage_layers`` (``even`` only, not interleaved; 0: an even share):
the layers of the first / last stage, the others splitting the rest evenly (it must divide), as Megatron-core's
``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers`` set them to offset
the embedding and the output head (LLaMA 3 405B: 126 layers on 16 stages, one layer fewer on
each end stage, Llama 3 paper §3.3.2).
``optimizer``: ``adam`` (mixed-precision Adam as Megatron runs it: fp32 master weights and two
moments, the step timed by paper 001's optimizer operator) or ``sgd`` (``torch.optim.SGD``
without momentum, as the ``capture`` examples train: the weights updated in place, no optimizer
state; the step one element-wise pass over the parameters: read weight and gradient, write the
weight, timed as the device's element-wise add of that many elements).
``moe_imbalance`` (MoE with ``ep`` > 1): the tokens the busiest expert-parallel rank is routed,
over the mean (1: balanced routing, the default). That rank sets the layer's pace, since the
combine all-to-all waits for it: its expert GEMMs and activation run on that many times the mean
tokens, the all-to-all moves that many times the mean bytes to and from it, and its experts'
activations take that much more memory. Measure it from the router's per-expert token counts
(Megatron-core logs them with ``--moe-per-layer-logging``), summed over each rank's experts;
a token-dropping capacity factor bounds it. With ``ep`` 1 every expert is on each rank and the
rank's work is the mean whatever the routing: it changes nothing there.
``cp_comm`` (with ``cp`` > 1): how the context-parallel ranks exchange K/V, as Megatron-core's
``--cp-comm-type`` picks TransformerEngine's variant: ``p2p`` (the default: the ring, each rank's
K/V block passed round, overlapped with the block computations), ``all_gather`` (Megatron's
``allgather``: K/V all-gathered before the attention, exposed; dK/dV reduce-scattered in the
backward) or ``a2a`` (DeepSpeed-Ulysses: all-to-alls of Q, K, V before the attention core and
of its output after it turn the sequence split into a head split, each rank attending over the
whole sequence with ``heads / (tp·cp)`` heads, exposed; TransformerEngine asserts that ``cp``
divides each tensor-parallel rank's attention and KV heads). Outside the attention core the
sequence stays split either way (:meth:`trainsim.builders.llm_comm.PlanComm.cp_exposed_layer`).
``contention``: communication hidden behind compute (the overlapped gradient reduction, ZeRO-3's
prefetched gathers and reduce-scatters, the context-parallel ring) slows the compute it
overlaps by the factor measured on real traces (:mod:`trainsim.builders.contention`); off, that
communication is free for the compute beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from trainsim.builders.spec import ModelSpec
from trainsim.errors import ConfigError

Schedule = Literal["1f1b", "interleaved", "gpipe"]
Recompute = Literal["none", "selective", "full"]
Attention = Literal["flash", "fused", "unfused"]
ATTENTION: tuple[str, ...] = ("flash", "fused", "unfused")
SCHEDULES: tuple[str, ...] = ("1f1b", "interleaved", "gpipe")
RECOMPUTE: tuple[str, ...] = ("none", "selective", "full")
DTYPES: tuple[str, ...] = ("fp16", "bf16", "fp32")
Impl = Literal["fused", "neox", "hf"]
IMPLS: tuple[str, ...] = ("fused", "neox", "hf")
Partition = Literal["even", "001"]
PARTITIONS: tuple[str, ...] = ("even", "001")
Optimizer = Literal["adam", "sgd"]
HfExperts = Literal["grouped_mm", "eager"]
OPTIMIZERS: tuple[str, ...] = ("adam", "sgd")
CPComm = Literal["p2p", "all_gather", "a2a"]
CP_COMMS: tuple[str, ...] = ("p2p", "all_gather", "a2a")


def check_moe_imbalance(value: object, model: ModelSpec, name: str = "plan: moe_imbalance") -> None:
    """``value`` as :attr:`Plan.moe_imbalance` of ``model`` (named ``name`` in the error): a
    number >= 1, and 1 for a dense model (a search checks it once for all its plans)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1.0 <= value < math.inf:
        raise ConfigError(f"{name} (the busiest expert-parallel rank's tokens over the mean) must be a number >= 1, "
                          f"got {value!r}")  # fmt: skip
    if value != 1.0 and not model.is_moe:
        raise ConfigError(f"{name} {value:g} needs a mixture-of-experts model; {model.name} is dense")


@dataclass(frozen=True, slots=True)
class Plan:
    """A parallelization and batching plan (see the module docstring)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    cp_comm: CPComm = "p2p"  # the context-parallel K/V exchange: ring, all-gather or Ulysses a2a (see above)
    sp: bool = False  # Megatron sequence parallelism (needs tp > 1 to matter)
    zero: int = 0
    dist_optimizer: bool = False  # ZeRO-1 the Megatron way: reduce-scatter, not all-reduce (above)
    micro_batch: int = 1
    global_batch: int = 0  # 0: micro_batch × dp (no accumulation)
    seq_len: int = 0  # 0: the model's
    schedule: Schedule = "1f1b"
    vpp: int = 1  # model chunks per stage (interleaved)
    recompute: Recompute = "none"
    dtype: str = "bf16"
    attention: Attention = (
        "flash"  # FlashAttention, fused scale-mask-softmax (Megatron), or unfused
    )
    attention_dropout: float = (
        0.0  # > 0: a dropout kernel over the [b, h, s, s] probabilities (non-flash)
    )
    wgrad_fusion: bool = False  # Megatron-LM's gradient-accumulation fusion (see the docstring)
    overlap_grad_reduce: bool = False  # DP gradient buckets reduced during the last backward (see above)
    overlap_param_gather: bool = False  # the distributed optimizer's weight gathers in the next forward (see above)
    hidden_dropout: float = 0.0  # > 0: unfused dropout kernels on the residual stream (see above)
    impl: Impl = "fused"  # fused kernels, or HuggingFace eager modules (see above)
    partition: Partition = "even"  # layers per pipeline stage: Megatron's, or 001 Eq. 3–5 (see above)
    optimizer: Optimizer = "adam"  # mixed-precision Adam, or plain SGD on the weights (see above)
    first_stage_layers: int = 0  # 0: an even share (see above)
    last_stage_layers: int = 0
    moe_imbalance: float = 1.0  # the busiest EP rank's routed tokens over the mean (see above)
    contention: bool = True  # overlapped collectives stretch the compute beside them (see above)
    hf_experts: HfExperts | None = None  # impl hf, MoE: transformers' experts implementation; None: grouped_mm
    moe_grouped_gemm: bool = False  # Megatron-core's --moe-grouped-gemm (TEGroupedMLP), not SequentialMLP (see above)

    @property
    def experts_impl(self) -> str:
        """The transformers experts implementation ``impl`` ``hf`` prices: ``hf_experts``, or
        transformers 5's default ``grouped_mm``."""
        return self.hf_experts or "grouped_mm"

    @property
    def moe_load(self) -> float:
        """How many times the mean tokens the pace-setting rank's experts run: ``moe_imbalance``
        with expert parallelism, 1 without (each rank then holds every expert)."""
        return self.moe_imbalance if self.ep > 1 else 1.0

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def batch(self) -> int:
        return self.global_batch or self.micro_batch * self.dp

    @property
    def chunks(self) -> int:
        """Model chunks per pipeline stage: ``vpp`` with the interleaved schedule, else 1."""
        return self.vpp if self.schedule == "interleaved" else 1

    @property
    def grad_accum(self) -> int:
        """Micro-batches per pipeline per iteration."""
        return self.batch // (self.micro_batch * self.dp)

    def seq(self, model: ModelSpec) -> int:
        return self.seq_len or model.seq_len

    def label(self) -> str:
        parts = [f"tp{self.tp}", f"pp{self.pp}", f"dp{self.dp}"]
        if self.cp > 1:  # at cp 1 cp_comm changes nothing: not in the label
            parts.append(f"cp{self.cp}" + {"all_gather": "-allgather", "a2a": "-a2a"}.get(self.cp_comm, ""))
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.sp:
            parts.append("sp")
        if self.zero:
            parts.append(f"zero{self.zero}")
        if self.dist_optimizer:
            parts.append("distopt")
        if self.schedule == "interleaved":
            parts.append(f"vpp{self.vpp}")
        elif self.schedule != "1f1b":
            parts.append(self.schedule)
        parts.append(f"mb{self.micro_batch}")
        parts.append(f"gb{self.batch}")
        if self.recompute != "none":
            parts.append(f"rc-{self.recompute}")
        if self.wgrad_fusion:
            parts.append("wgf")
        if self.overlap_grad_reduce:
            parts.append("ogr")
        if self.overlap_param_gather:
            parts.append("opg")
        if self.impl != "fused":
            parts.append(self.impl)
        if self.hf_experts == "eager":  # grouped_mm, the default, is not named
            parts.append("eagerexperts")
        if self.moe_grouped_gemm:
            parts.append("ggemm")
        if self.partition != "even":
            parts.append(f"part{self.partition}")
        if self.first_stage_layers:
            parts.append(f"first{self.first_stage_layers}")
        if self.last_stage_layers:
            parts.append(f"last{self.last_stage_layers}")
        if self.optimizer != "adam":
            parts.append(self.optimizer)
        if self.moe_load != 1.0:  # at ep 1 it changes nothing (Plan.moe_imbalance): not in the label
            parts.append(f"imb{self.moe_imbalance:g}")
        # precision and attention kernels change the time as much as the degrees: two plans that
        # differ only there had one label (`--dtype fp16` and `--attention unfused` read alike)
        if self.dtype != "bf16":
            parts.append(self.dtype)
        if self.attention != "flash":
            parts.append(f"attn-{self.attention}")
        if not self.contention:
            parts.append("nocontention")
        return "-".join(parts)

    def overlap_param_gather_why_not(self) -> str:
        """Why ``overlap_param_gather`` cannot be set on this plan ("" when it can): Megatron-core's
        needs the distributed optimizer (ZeRO-1, weights gathered after the update) over more
        than one rank, and asserts the overlapped gradient reduction."""
        if not self.dist_optimizer or self.zero != 1:
            return (f"it needs zero 1 with the distributed optimizer (dist_optimizer), got zero {self.zero}"
                    + ("" if self.dist_optimizer else " without it"))  # fmt: skip
        if self.dp * self.cp <= 1:
            return f"it needs more than one data-parallel rank (dp×cp > 1), got dp {self.dp}, cp {self.cp}"
        if not self.overlap_grad_reduce:
            return "Megatron-core asserts --overlap-grad-reduce with it: set overlap_grad_reduce"
        return ""

    def _check_overlap_param_gather(self) -> None:
        if not isinstance(self.overlap_param_gather, bool):
            raise ConfigError(f"plan: overlap_param_gather must be true or false, got {self.overlap_param_gather!r}")
        why = self.overlap_param_gather_why_not() if self.overlap_param_gather else ""
        if why:
            raise ConfigError(f"plan: overlap_param_gather (Megatron-core's --overlap-param-gather): {why}")

    def _check_end_stages(self, model: ModelSpec) -> None:
        """``first_stage_layers`` / ``last_stage_layers``: with stages to hold them, and every
        other stage left the same number of layers, at least one (Megatron-core's rules for its
        uneven split: the middle layers must divide evenly over the middle stages)."""
        f, last = self.first_stage_layers, self.last_stage_layers
        for name, v in (("first_stage_layers", f), ("last_stage_layers", last)):
            if not isinstance(v, int) or v < 0:
                raise ConfigError(f"plan: {name} must be a non-negative integer, got {v!r}")
        if self.partition != "even" or self.schedule == "interleaved":
            raise ConfigError("plan: first/last stage layers set the end stages of the even partition with one chunk "
                              "per stage: not with --partition 001 or --schedule interleaved")  # fmt: skip
        given = (f > 0) + (last > 0)
        if self.pp < given + (0 if given == 2 else 1):
            raise ConfigError(f"plan: first/last stage layers need more pipeline stages than the ends they set, got pp {self.pp}")
        rest, others = model.layers - f - last, self.pp - given
        if rest < 0:
            raise ConfigError(f"plan: first/last stage layers ({f}, {last}) are more than {model.name}'s "
                              f"{model.layers} layers")  # fmt: skip
        if rest < others or (others == 0 and rest) or (others and rest % others):
            raise ConfigError(
                f"plan: first/last stage layers ({f}, {last}) leave {rest} of {model.name}'s {model.layers} layers "
                f"for {others} other stage(s): each needs at least one, the same number (Megatron-core), and all "
                "must be placed"
            )

    def validate(self, model: ModelSpec, *, gpus: int | None = None) -> None:
        """Raise ConfigError (one line, naming the field) when the plan cannot run ``model``."""
        for f in ("tp", "pp", "dp", "cp", "ep", "micro_batch", "vpp"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"plan: {f} must be a positive integer, got {v!r}")
        if self.zero not in (0, 1, 2, 3):
            raise ConfigError(f"plan: zero must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.sp and self.tp == 1:
            raise ConfigError("plan: sequence parallelism splits the activations over the tensor-parallel group: "
                              "it needs tp > 1, got tp 1 (Megatron ignores it there); drop sp or raise tp")
        if self.dist_optimizer and self.zero != 1:
            raise ConfigError(f"plan: the distributed optimizer (Megatron-LM's) is a ZeRO-1: it needs zero 1, got zero {self.zero}")
        self._check_overlap_param_gather()
        if self.schedule not in SCHEDULES:
            raise ConfigError(
                f"plan: schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}"
            )
        if self.recompute not in RECOMPUTE:
            raise ConfigError(
                f"plan: recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}"
            )
        if self.attention not in ATTENTION:
            raise ConfigError(
                f"plan: attention must be one of {', '.join(ATTENTION)}, got {self.attention!r}"
            )
        if not 0.0 <= self.attention_dropout < 1.0:
            raise ConfigError(
                f"plan: attention_dropout must be in [0, 1), got {self.attention_dropout!r}"
            )
        if not 0.0 <= self.hidden_dropout < 1.0:
            raise ConfigError(f"plan: hidden_dropout must be in [0, 1), got {self.hidden_dropout!r}")
        if self.impl not in IMPLS:
            raise ConfigError(f"plan: impl must be one of {', '.join(IMPLS)}, got {self.impl!r}")
        if self.impl == "hf":
            from trainsim.builders.eager import family_of

            family_of(model, self.experts_impl)  # a one-line error for a model with no census
            if self.tp > 1 or self.cp > 1:
                raise ConfigError(f"plan: impl 'hf' runs one model replica per GPU (tp = cp = 1), got tp {self.tp}, cp {self.cp}")
            if self.ep > 1:
                raise ConfigError(f"plan: impl 'hf' runs one model replica per GPU, every expert on it (ep = 1), got ep {self.ep}")
        if self.hf_experts is not None:
            from trainsim.builders.eager import HF_EXPERTS

            if self.hf_experts not in HF_EXPERTS:
                raise ConfigError(f"plan: hf_experts must be one of {', '.join(HF_EXPERTS)}, got {self.hf_experts!r}")
            if self.impl != "hf" or not model.is_moe:
                why = f"{model.name} is dense" if self.impl == "hf" else f"got impl {self.impl!r}"
                raise ConfigError(f"plan: hf_experts (transformers' experts implementation) needs impl 'hf' and a "
                                  f"mixture-of-experts model; {why}")  # fmt: skip
        if not isinstance(self.moe_grouped_gemm, bool):
            raise ConfigError(f"plan: moe_grouped_gemm must be true or false, got {self.moe_grouped_gemm!r}")
        if self.moe_grouped_gemm and (self.impl == "hf" or not model.is_moe):
            why = f"{model.name} is dense" if not model.is_moe else "impl 'hf' runs transformers' experts: --hf-experts picks them"
            raise ConfigError(f"plan: moe_grouped_gemm (Megatron-core's --moe-grouped-gemm) needs a mixture-of-experts "
                              f"model and a Megatron-style impl (fused or neox); {why}")  # fmt: skip
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"plan: optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.partition not in PARTITIONS:
            raise ConfigError(f"plan: partition must be one of {', '.join(PARTITIONS)}, got {self.partition!r}")
        if self.partition != "even" and self.schedule == "interleaved":
            raise ConfigError("plan: partition '001' (GPT-NeoX's) splits one chunk per stage: not with --schedule interleaved")
        if self.first_stage_layers or self.last_stage_layers:
            self._check_end_stages(model)
        if self.partition == "001":
            from trainsim.builders.memory import stage_layers_001

            split = stage_layers_001(model, self)
            if min(split) < 1:
                raise ConfigError(f"plan: partition '001' leaves a pipeline stage of {model.name} without transformer "
                                  f"layers at pp {self.pp} ({split})")  # fmt: skip
        if self.dtype not in DTYPES:
            raise ConfigError(f"plan: dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if gpus is not None and gpus != self.gpus:
            raise ConfigError(
                f"plan: --gpus {gpus} is not tp×cp×dp×pp = {self.tp}×{self.cp}×{self.dp}×{self.pp} = {self.gpus}"
            )
        if model.heads % self.tp:
            raise ConfigError(
                f"plan: tp {self.tp} does not divide {model.name}'s {model.heads} attention heads"
            )
        if model.n_kv % self.tp and self.tp % model.n_kv:
            raise ConfigError(
                f"plan: tp {self.tp} and {model.name}'s {model.n_kv} KV heads do not divide one another"
            )
        if model.ffn % self.tp or (model.is_moe and model.expert_ffn % self.tp):
            raise ConfigError(
                f"plan: tp {self.tp} does not divide {model.name}'s MLP width {model.ffn}"
            )
        chunks = self.pp * self.chunks
        if chunks > model.layers:
            raise ConfigError(
                f"plan: {chunks} pipeline chunks (pp {self.pp}"
                + (f" × vpp {self.vpp}" if self.schedule == "interleaved" else "")
                + f") exceed {model.name}'s {model.layers} layers"
            )
        if self.schedule != "interleaved" and self.vpp != 1:
            raise ConfigError("plan: vpp > 1 needs --schedule interleaved")
        if self.schedule == "interleaved" and self.vpp > 1 and self.pp < 2:
            raise ConfigError(
                f"plan: interleaved schedule with vpp {self.vpp} needs two or more pipeline stages, got pp {self.pp}"
            )
        if self.schedule == "interleaved" and model.layers % chunks:
            raise ConfigError(
                f"plan: interleaved schedule needs layers ({model.layers}) divisible by pp×vpp ({chunks})"
            )
        seq = self.seq(model)
        if model.position == "learned" and seq > model.seq_len:
            raise ConfigError(
                f"plan: seq_len {seq} exceeds {model.name}'s {model.seq_len} learned positions"
            )
        if self.cp > 1 and seq % (2 * self.cp):
            raise ConfigError(
                f"plan: sequence length {seq} is not divisible by 2×cp = {2 * self.cp}"
            )
        if self.cp_comm not in CP_COMMS:
            raise ConfigError(f"plan: cp_comm must be one of {', '.join(CP_COMMS)}, got {self.cp_comm!r}")
        if self.cp > 1 and self.cp_comm == "a2a":  # TransformerEngine's a2a asserts both
            for what, n in (("attention heads", model.heads // self.tp), ("KV heads", -(-model.n_kv // self.tp))):
                if n % self.cp:
                    raise ConfigError(f"plan: cp_comm a2a splits each tensor-parallel rank's {what} over the cp ranks: "
                                      f"cp {self.cp} does not divide {model.name}'s {n} {what} per rank (tp {self.tp})")  # fmt: skip
        if self.sp and self.tp > 1 and seq % self.tp:
            raise ConfigError(
                f"plan: sequence parallelism needs seq_len {seq} divisible by tp {self.tp}"
            )
        if self.ep > 1:
            if not model.is_moe:
                raise ConfigError(
                    f"plan: ep {self.ep} needs a mixture-of-experts model; {model.name} is dense"
                )
            if model.num_experts % self.ep:
                raise ConfigError(
                    f"plan: ep {self.ep} does not divide {model.name}'s {model.num_experts} experts"
                )
            if self.dp % self.ep:
                raise ConfigError(
                    f"plan: ep {self.ep} must divide dp {self.dp} (experts split the data-parallel ranks)"
                )
        imb = self.moe_imbalance
        check_moe_imbalance(imb, model)
        if self.ep > 1 and imb > self.ep:
            raise ConfigError(f"plan: moe_imbalance {imb:g} is more than ep {self.ep}: the busiest of {self.ep} "
                              f"expert-parallel ranks gets at most all the tokens, {self.ep}x the mean")  # fmt: skip
        if self.batch % (self.micro_batch * self.dp):
            raise ConfigError(
                f"plan: global batch {self.batch} is not a multiple of micro_batch×dp = {self.micro_batch * self.dp}"
            )
        if self.schedule == "interleaved" and self.grad_accum % self.pp:
            raise ConfigError(
                f"plan: interleaved schedule needs micro-batches per iteration ({self.grad_accum}) divisible by pp ({self.pp})"
            )
