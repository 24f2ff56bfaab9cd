"""``trainsim predict``'s engine: one model, one plan, one system → iteration time, memory, why.

>>> from trainsim.builders.predict import predict_llm
>>> r = predict_llm("gpt3-1.3b", Plan(tp=1, pp=1, dp=8, micro_batch=4, global_batch=256), "dgx-a100")  # doctest: +SKIP
>>> r.iteration_time_s, r.mfu, r.fits_in_memory                                                       # doctest: +SKIP

The iteration time is the simulator's on the IR of :func:`trainsim.builders.llm.build_workload`,
obtained by :func:`~trainsim.builders.llm.evaluate_pipeline` (the same program and semantics
without building the IR; equal to 1e-9, a test); ``full_simulation=True`` runs the simulator
itself on every micro-batch and keeps its result (``--timeline`` does). ``simulate=False``
gives paper 001's closed form (Eq. 7) instead, in well under a millisecond once the operator
costs are known. Both closed forms are always reported beside. Long 1F1B and interleaved
iterations evaluate fewer micro-batches and carry them forward by a certified period, which
equals evaluating them all (:func:`~trainsim.builders.llm.evaluate_pipeline`).

MFU counts model FLOPs only (no recomputation): the GEMM and attention FLOPs of every operator
(attention as the full ``s × s`` square, as Megatron's formula), over ``gpus × dense peak of
the dtype × iteration time``. A model's multi-token-prediction depths are trained work and
count (their blocks, ``eh_proj`` and logits GEMMs; Megatron-LM's FLOP formula counts the MTP
projections and logits as well).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trainsim.builders.costs import OpCoster
from trainsim.builders.llm import (
    StageCost,
    build_workload,
    closed_form_001,
    closed_form_003,
    evaluate_pipeline,
    stage_costs,
)
from trainsim.builders.memory import (
    MemoryBreakdown,
    fits_within,
    hf_activation_provenance,
    hf_window_layer_bytes,
    memory_limit,
    memory_per_gpu,
    min_gpus_for_states,
)
from trainsim.builders.models import get_model
from trainsim.builders.plan import Plan
from trainsim.builders.spec import ModelSpec
from trainsim.comm.calibrated import BEYOND_SIZES
from trainsim.errors import ConfigError, TrainsimError
from trainsim.hardware import DeviceSpec, SystemSpec, get_device, get_system
from trainsim.kernels.features import peak_flops


@dataclass(slots=True)
class LLMPrediction:
    model: ModelSpec
    plan: Plan
    system: SystemSpec
    device: DeviceSpec
    iteration_time_s: float
    method: str  # "simulation" | "closed-form-001"
    closed_form_s: dict[str, float]
    tokens_per_s: float
    mfu: float
    memory: list[MemoryBreakdown]
    breakdown: dict[str, float]
    stages: list[StageCost]
    provenance: dict[str, Any]
    timings_s: dict[str, float] = field(default_factory=dict)
    sim: Any = None  # SimResult when the IR was simulated (full_simulation)
    warnings: list[str] = field(default_factory=list)
    memory_headroom_bytes: float = 0.0  # kept free of the device's memory (--memory-headroom)
    system_ref: str = ""  # how the caller named the system (a catalog name or a YAML path)

    @property
    def peak_memory(self) -> MemoryBreakdown:
        return max(self.memory, key=lambda m: m.total_bytes)

    @property
    def memory_limit_bytes(self) -> int:
        """What the plan may use: the device's usable memory less the headroom (whole bytes)."""
        return memory_limit(self.device.memory_bytes, self.memory_headroom_bytes)

    @property
    def fits_in_memory(self) -> bool:
        return fits_within(self.peak_memory.total_bytes, self.memory_limit_bytes)

    def to_dict(self) -> dict[str, Any]:
        pk = self.peak_memory
        return {
            "model": self.model.name,
            "plan": self.plan.label(),
            "system": self.system.name,
            "device": self.device.name,
            "gpus": self.plan.gpus,
            "seq_len": self.plan.seq(self.model),
            "global_batch": self.plan.batch,
            "iteration_time_s": self.iteration_time_s,
            "method": self.method,
            "closed_form_s": self.closed_form_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "memory_per_gpu_bytes": pk.total_bytes,
            "memory_capacity_bytes": self.device.memory_bytes,
            "memory_limit_bytes": self.memory_limit_bytes,
            "fits_in_memory": self.fits_in_memory,
            "memory": pk.to_dict(),
            "memory_per_stage_bytes": [m.total_bytes for m in self.memory],
            "breakdown": self.breakdown,
            "stages": [
                {
                    "stage": s.stage,
                    "layers": s.layers,
                    "params": s.params,
                    "fwd_s": s.fwd_s,
                    "bwd_s": s.bwd_s,
                    "recompute_s": s.recompute_s,
                    "optimizer_s": s.optimizer_s,
                    "dp_comm_s": s.dp_comm_s,
                    "p2p_s": s.p2p_s,
                }
                for s in self.stages
            ],  # fmt: skip
            "provenance": self.provenance,
            "warnings": self.warnings,
            "timings_s": self.timings_s,
        }


def _share(x: float) -> str:
    """A fraction as a percentage with the digits it needs ('0.2 %' stays visible, not '0%')."""
    return f"{x:.0%}" if x >= 0.1 else f"{x * 100:.2g}%"


def default_seq_note(model: ModelSpec) -> str | None:
    """What to say when the model's own sequence length is used and it is long (> 16k tokens),
    or is a RoPE-scaled config's pre-training context rather than its max_position_embeddings."""
    if model.seq_source:
        return (f"the sequence length is {model.name}'s pre-training context, {model.seq_len:,} tokens (its "
                f"config's {model.seq_source}): give --seq-len for the length you train at")  # fmt: skip
    if model.seq_len <= 16384:
        return None
    whose = "the catalog's" if model.source == "catalog" else "its config's max_position_embeddings"
    return (f"the sequence length is {model.name}'s default, {model.seq_len:,} tokens ({whose}); "
            "give --seq-len for the length you train at")


MOE_BALANCED_NOTE = ("expert routing is taken as balanced (each expert gets tokens x top_k / experts of them) "
                     "with a GEMM pair per local expert (how they run: the expert-GEMM note) and the token "
                     "permutation as memory-bound passes; "
                     "uneven routing makes the busiest expert set the pace, so MoE times are lower bounds "
                     "(--moe-imbalance gives the busiest expert-parallel rank's load)")


def moe_note(plan: Plan) -> str:
    """What the prediction assumes of an MoE model's routing under ``plan``."""
    if plan.moe_imbalance == 1.0:
        return MOE_BALANCED_NOTE
    if plan.ep <= 1:
        return (f"--moe-imbalance {plan.moe_imbalance:g} changes nothing at ep 1: every rank holds every expert, so "
                "its work is the mean whatever the routing (the experts' GEMMs differ in size, which is not modelled)")
    return (f"the busiest of the {plan.ep} expert-parallel ranks is routed {plan.moe_imbalance:g}x the mean tokens "
            "(--moe-imbalance): its expert GEMMs, activation, all-to-all bytes and expert activations are scaled by "
            "that, and it sets the layer's pace")


def expert_gemms_note(model: ModelSpec, plan: Plan, architecture: str) -> str:
    """How an MoE model's expert GEMMs are costed under ``plan`` on a GPU of ``architecture``
    (:meth:`trainsim.builders.costs.LayerCoster.expert_gemms`), one line."""
    from trainsim.builders.costs import expert_gemm_path

    n = model.num_experts // plan.ep
    how = expert_gemm_path(plan, architecture)
    local, runs, owns = ("the one local expert", "runs", "'s") if n == 1 else (f"the {n} local experts", "run", "'")
    if how == "sequential":
        return (f"{local} {runs} as Megatron-core's SequentialMLP (its default): one GEMM pair per expert at "
                "the per-expert shape, one after another, each expert's calls dispatched by a Python loop (that "
                "dispatch is an estimate at the host model's rates); --moe-grouped-gemm prices TEGroupedMLP "
                "(Megatron-core's --moe-grouped-gemm)")  # fmt: skip
    if how == "multistream":
        return (f"--moe-grouped-gemm: {local}{owns} GEMMs run by TransformerEngine's GroupedLinear, one cuBLAS "
                "GEMM per expert over TE's 4 compute streams, each projection timed as the longer of one GEMM over all "
                "the experts' rows and 4 streams of the per-expert GEMMs (at most those GEMMs one after another), and "
                "one activation over all the rows; the "
                "C++ loop's launches are an estimate at the host model's aten rate. Not modelled: TE's CUTLASS "
                "(NVTE_USE_CUTLASS_GROUPED_GEMM=1) and cuBLASLt grouped GEMMs, Megatron's legacy GroupedMLP")  # fmt: skip
    if how == "grouped":
        return (f"transformers' grouped_mm runs torch._grouped_mm's CUTLASS kernel here ({architecture}, bf16): one "
                f"kernel per projection over the {n} experts, timed as one GEMM over all their rows, each expert's "
                "rows padded to the kernel's tile (64 or 128), with no host sync; that takes the grouped kernel to be "
                "as efficient as one GEMM of the stacked shape (optimistic for ragged groups)")  # fmt: skip
    if how == "fallback":
        why = f"bf16 on Hopper or Blackwell only, not {plan.dtype} on {architecture}"
        return (f"transformers' grouped_mm takes torch._grouped_mm's fallback here (its CUTLASS kernel needs {why}): "
                f"the group offsets read to the host (a sync per call: 2 forward, 4 backward) and one mm per expert, "
                f"{n} GEMMs of the per-expert shape one after another, launched from C++ (an estimate at the host "
                "model's aten rate)")  # fmt: skip
    return f"--hf-experts eager: the {n} experts' GEMM pairs run one after another in transformers' eager loop"


def hf_moe_note(model: ModelSpec, plan: Plan) -> str:
    """What ``--impl hf`` assumes of an MoE model (builders/eager.py's ``mixtral_grouped`` and
    ``mixtral`` censuses), one line: which experts implementation is costed."""
    from trainsim.builders.eager import experts_hit, tokens_per_expert

    tokens = plan.micro_batch * plan.seq(model)
    n, te = experts_hit(model, tokens), tokens_per_expert(model, tokens)
    tail = ("routing taken as even (uneven routing changes the GEMM sizes, not modelled); transformers 4.x's experts "
            "(a per-expert nn.Linear loop) are not modelled")
    if plan.experts_impl == "eager":
        return (f"--impl hf prices transformers 5's eager expert loop (--hf-experts eager: experts_implementation="
                f"\"eager\"; its default is grouped_mm): all {n} experts hit, each a GEMM pair on {te:,.0f} tokens "
                "(T x top_k / experts) run one after another, with its gathers, index_add_ and, backward, a zeroed "
                "gradient of all the experts' weights per expert (select_backward) summed by autograd; the loop's host "
                f"syncs are an estimate and its memory-bound calls carry no eager factor (uncalibrated); {tail}")
    return (f"--impl hf prices transformers 5's default experts implementation, grouped_mm (--hf-experts eager: its "
            f"eager expert loop): the tokens sorted by expert and gathered, one torch grouped_mm per projection over "
            f"all {n} experts ({te:,.0f} tokens each: T x top_k / experts; how its GEMMs run: the next note), the "
            f"gathers back and the top-k sum; "
            f"their memory-bound calls carry no eager factor (uncalibrated: no trace of them was measured); {tail}")


def moe_family_note(model: ModelSpec) -> str | None:
    """What the prediction leaves out of an MoE family's model (h5), one line; None if nothing."""
    left = []
    if model.attention_sinks:
        left.append("attention sinks (one logit per head added to the softmax; their parameters are counted)")
    if model.shared_ffn_hidden:
        left.append("overlap of the shared expert with the expert all-to-all (they run one after the other)")
    if model.mla:
        left.append("MLA's backward TP all-reduce on its latents (costed as the hidden state's)")
    return ("not modelled for " + model.name + ": " + "; ".join(left)) if left else None


def mtp_note(model: ModelSpec, plan: Plan) -> str | None:
    """What predict says of a model's multi-token prediction (None without one)."""
    if not model.mtp_layers:
        return None
    if not model.mtp_depths(plan.impl):
        return (f"{model.name}'s {model.mtp_layers} multi-token-prediction depth(s) are not run with --impl hf: "
                "transformers' model has no MTP module (its checkpoint's MTP layer is dropped on loading)")  # fmt: skip
    copy = " and a copy of the embedding" if plan.pp > 1 and not model.tied_embeddings else ""
    return (f"the {model.mtp_layers} multi-token-prediction depth(s) (num_nextn_predict_layers; "
            f"{model.mtp_params() / 1e9:,.2f} B parameters of their own{copy}) run on the last pipeline stage after "
            "the main head, as Megatron places them; not modelled: the shifted embedding lookup's TP all-reduce and "
            "the MTP loss's small reductions")  # fmt: skip


def _provenance(stages: list[StageCost]) -> dict[str, Any]:
    """Counts of operator and collective answers by where they came from."""
    kern: dict[str, int] = {}
    comm: dict[str, int] = {}
    for st in stages:
        for o in st.layer_ops:
            kern[o.provenance] = kern.get(o.provenance, 0) + st.layers
        for o in st.ops:
            kern[o.provenance] = kern.get(o.provenance, 0) + 1
        for c in [*st.comm, *st.dp_comm]:
            if c.provenance != "none":
                comm[c.provenance] = comm.get(c.provenance, 0) + 1
    calibrated = all(k.startswith("calibrated:") for k in kern) and all(
        c.startswith("calibrated:") for c in comm
    )
    return {"summary": "calibrated" if calibrated else "mixed" if any(k.startswith("calibrated:") for k in kern) else "spec-based",
            "kernels": dict(sorted(kern.items())), "collectives": dict(sorted(comm.items()))}  # fmt: skip


def _breakdown(st: StageCost, plan: Plan, iteration_s: float) -> dict[str, float]:
    """Where one GPU of stage ``st`` spends the iteration (the remainder is pipeline bubble and
    waiting for neighbours)."""
    m = plan.grad_accum
    z3 = st.zero3_exposed_fwd_s + st.zero3_exposed_bwd_s
    (ef, eb, er), (cf, cb, cr) = st.ep_comm_s, st.cp_comm_s
    out = {
        "forward_s": m * (st.fwd_s - st.tp_comm_fwd_s - st.zero3_exposed_fwd_s - ef - cf),
        "backward_s": m * (st.bwd_s - st.recompute_s - st.tp_comm_bwd_s - st.zero3_exposed_bwd_s - eb - cb),
        "recompute_s": m * (st.recompute_s - st.tp_comm_recompute_s - er - cr),
        "tp_communication_s": m * (st.tp_comm_fwd_s + st.tp_comm_bwd_s + st.tp_comm_recompute_s),
        "ep_communication_s": m * (ef + eb + er),
        "cp_communication_s": m * (cf + cb + cr),
        "exposed_dp_communication_s": st.dp_comm_s + m * z3,
        "optimizer_s": st.optimizer_s,
    }
    bubble = iteration_s - sum(out.values())
    # below rounding (1e-12 of the iteration: sums in another order) there is no bubble
    out["pipeline_bubble_s"] = bubble if bubble > 1e-12 * iteration_s else 0.0
    return {"stage": st.stage, **out}


def _run(spec: ModelSpec, plan: Plan, sys: SystemSpec, stages: list[StageCost]) -> Any:
    from trainsim.sim import HostMode, KernelSource, SimOptions
    from trainsim.sim import simulate as run_sim

    w = build_workload(spec, plan, sys, stages)
    return run_sim(w, SimOptions(kernels=KernelSource.MODEL, overheads=HostMode.STATS, thread_edges=False,
                                 launch_latency_s=0.0, kernel_gap_s=0.0))  # fmt: skip


GPIPE_MAX_PASSES = 1_000_000  # ~0.5 GB and ~7 s of evaluation; 1F1B/interleaved carry a certified period


def _simulate(spec: ModelSpec, plan: Plan, sys: SystemSpec, stages: list[StageCost], *, full: bool) -> tuple[float, tuple[float, ...], Any, str]:  # fmt: skip
    """Iteration time, each stage's end, the SimResult (``full`` only) and how it was obtained.

    ``full``: the simulator runs the IR of every micro-batch (``--timeline`` needs its result).
    Otherwise :func:`~trainsim.builders.llm.evaluate_pipeline` evaluates the same program
    without building the IR (equal to the simulator's time to 1e-9, a test); with many
    micro-batches it evaluates fewer and carries them forward by a certified period, which
    equals evaluating them all (see its docstring).
    """
    if full:
        sim = _run(spec, plan, sys, stages)
        return sim.predicted_step_s, tuple(r.end_s for r in sim.ranks), sim, "simulation"
    m = plan.grad_accum
    if plan.schedule == "gpipe" and m * plan.pp > GPIPE_MAX_PASSES:  # no period to carry (all forwards first)
        raise ConfigError(f"GPipe with {m:,} micro-batches × {plan.pp} stages: too many stage passes to simulate "
                          f"(at most {GPIPE_MAX_PASSES:,}); use --closed-form, 1F1B, or a smaller --global-batch "
                          "(sequences, not tokens)")  # fmt: skip
    r = evaluate_pipeline(spec, plan, sys, stages, periodic=True)
    how = "simulation"
    if r.evaluated_micro_batches < m:
        how += f": {r.evaluated_micro_batches} of {m} micro-batches evaluated, the rest certified to repeat (to 1e-10)"
    return r.predicted_step_s, r.stage_end_s, None, how


def predict_llm(model: ModelSpec | str, plan: Plan, system: SystemSpec | str, *, simulate: bool = True,
                gpus: int | None = None, coster: OpCoster | None = None,
                full_simulation: bool = False, memory_headroom_bytes: float = 0.0,
                system_ref: str | None = None) -> LLMPrediction:  # fmt: skip
    """One iteration of ``model`` under ``plan`` on ``system``: the simulated time (or 001
    Eq. 7's with ``simulate=False``), both closed forms, throughput, MFU, memory per stage and
    the breakdown of the busiest stage. ``memory_headroom_bytes``: memory the plan must leave
    free for it to fit (:func:`~trainsim.builders.memory.headroom_bytes`). ``system_ref``: how
    the user named ``system`` (a YAML path), for the commands the notes suggest."""
    t0 = time.perf_counter()
    spec = get_model(model) if isinstance(model, str) else model
    sys = get_system(system) if isinstance(system, str) else system
    plan.validate(spec, gpus=gpus)
    device = get_device(sys.device)
    stages = stage_costs(spec, plan, sys, coster)
    t1 = time.perf_counter()
    cf = {"001_eq7": closed_form_001(stages, plan), "003_eq4": closed_form_003(stages, plan)}
    t2 = time.perf_counter()
    sim = None
    if simulate:
        iteration, ends, sim, method = _simulate(spec, plan, sys, stages, full=full_simulation)
        crit = max(range(len(ends)), key=ends.__getitem__)  # the stage whose GPUs finish last
    else:
        iteration, method = cf["001_eq7"], "closed-form-001"
        crit = 0
    def bare(st: StageCost) -> StageCost:
        if not simulate and st.embedding_comm is not None:
            # 001 Eq. 7 synchronises the first stage's gradients by its DP all-reduce alone (001
            # §III-D): the tied-embedding all-reduce is not in its time, so not in its breakdown
            # either (counted there, the parts had summed to more than the iteration)
            return replace(st, embedding_comm=None)
        return st

    # the breakdown is of the busiest stage, the pipeline's bottleneck: the one whose GPUs
    # wait least. In 1F1B the first stage finishes last whatever paces it, so its breakdown
    # had shown the slower stages' pace as bubble (DeepSeek-V3 with its three dense layers on
    # stage 0: 14.6 s "bubble" of 32.9 s). Ties (a balanced pipeline) keep the stage that ends last
    parts = {i: _breakdown(bare(st), plan, iteration) for i, st in enumerate(stages)}
    # a stage whose parts add up to more than the iteration is not the one the time describes:
    # 001 Eq. 7 syncs the first stage's gradients alone, so with --closed-form a last stage
    # of a longer DP sync (MTP, an extra layer) summed past it (DeepSeek-V3 pp 2: 22.93 s of
    # parts in a 21.70 s iteration); the simulation's stages all fit in it
    fits = [i for i, b in parts.items() if sum(v for k, v in b.items() if k != "stage") <= iteration * (1 + 1e-12)]
    crit = min(fits or [crit], key=lambda i: (round(parts[i]["pipeline_bubble_s"] / iteration, 9), i != crit))
    crit_stage = bare(stages[crit])
    t3 = time.perf_counter()
    tokens = plan.batch * plan.seq(spec)
    flops = (
        sum(plan.grad_accum * (s.flops_fwd + s.flops_bwd) for s in stages)
        * plan.tp
        * plan.cp
        * plan.dp
    )
    mfu = flops / (plan.gpus * peak_flops(device, plan.dtype) * iteration)
    memory = memory_per_gpu(spec, plan)
    prov = _provenance(stages)
    prov["contention"] = contention_note(plan)
    prov["activations"] = hf_activation_provenance(spec, plan)
    r = LLMPrediction(
        spec, plan, sys, device, iteration, method, cf, tokens / iteration, mfu, memory,
        _breakdown(crit_stage, plan, iteration), stages, prov,
        {"costs": t1 - t0, "closed_form": t2 - t1, "simulation": t3 - t2}, sim,
        memory_headroom_bytes=memory_headroom_bytes, system_ref=system_ref or (system if isinstance(system, str) else sys.name),
    )  # fmt: skip
    r.warnings = _warnings(r)
    return r


def overlaps_comm(plan: Plan) -> bool:
    """Whether ``plan`` hides communication behind compute (what contention applies to): the
    gradient reduction during the backward, ZeRO-3's prefetched collectives, ZeRO-1/2's weight
    gathers in the next forward (all with more than one data-parallel rank), or the context-parallel ring (``cp_comm`` p2p: the all-gather and
    all-to-all variants expose theirs)."""
    shards = plan.dp * plan.cp > 1
    hidden = plan.zero == 3 or plan.overlap_grad_reduce or plan.overlap_param_gather
    return (shards and hidden) or (plan.cp > 1 and plan.cp_comm == "p2p")


def contention_note(plan: Plan) -> str:
    """Predict's provenance of the compute/communication contention (builders/contention.py)."""
    from trainsim.builders import contention

    if not plan.contention:
        return "off: overlapped communication is free for the compute beside it"
    return contention.provenance() + ("" if overlaps_comm(plan) else " (nothing overlapped in this plan)")


def dense_family_notes(model: ModelSpec, plan: Plan) -> list[str]:
    """What predict says about Qwen3/Gemma/OLMo 2 features it does not cost (builders/costs.py)."""
    out = []
    if model.left_out:
        out.append(f"not modelled for {model.name}: {model.left_out}")
    if model.attn_softcap and plan.attention == "flash" and plan.impl != "hf":
        out.append(f"the model soft-caps its attention scores (cap {model.attn_softcap:g}): costed as plain "
                   "FlashAttention, whose kernel (FlashAttention-2 >= 2.6) applies the cap; PyTorch's SDPA "
                   "cannot, and HuggingFace's Gemma 2 then runs eager attention (give --attention unfused)")  # fmt: skip
    if model.qk_norm == "full" and plan.tp > 1:
        out.append("the q/k norms over the whole projections (OLMo 2) need each token's sum of squares all-reduced "
                   f"over the {plan.tp} TP ranks: that small all-reduce is not modelled")  # fmt: skip
    from trainsim.builders.eager import CENSUS_LABELS, NAMED_FAMILIES, census_omissions, family_of

    fam = ""
    if plan.impl == "hf":
        fam = family_of(model, plan.experts_impl)
        if left := census_omissions(model, plan.seq(model), plan.experts_impl):
            out.append(f"--impl hf times the census of HuggingFace's {fam} modules (builders/data/hf_eager_census.json "
                       f"and hf_activation_census.json), which has no part for {'; nor for '.join(left)}: not "
                       "modelled")  # fmt: skip
    gemma = fam.startswith("gemma")  # Gemma 2/3's own censuses: four norms a layer, Gemma 3's q/k norms, Gemma 2's logit cap
    qwen3 = fam.startswith("qwen3") or fam == "gemma3"  # its census records the model's own per-head q/k norms
    # its own modules' census (GLM-4's norms, OLMoE's q/k norms): a family its reader names
    own = model.hf_family in NAMED_FAMILIES and fam.startswith(model.hf_family)
    extra = [n for n, on in (("q/k norms", model.qk_norm != "none" and not qwen3), ("norms after attention and MLP",
             model.layer_norms == 4 and not gemma), ("soft-capping", bool(model.attn_softcap or model.logit_softcap)
             and not gemma), ("final-logit soft-capping", bool(model.logit_softcap) and fam == "gemma3")) if on]  # fmt: skip
    if plan.impl == "hf" and model.attn_softcap and gemma and plan.attention == "flash":
        out.append(f"--impl hf with flash attention: the attention-score soft-cap (cap {model.attn_softcap:g}) runs "
                   "inside FlashAttention-2 (>= 2.6), not costed; HF's Gemma 2 otherwise runs eager attention, where "
                   "it is three passes over the b·h·s² scores (give --attention unfused: the census's attn_softcap part "
                   "costs them)")  # fmt: skip
    if plan.impl == "hf" and extra and not own:
        # the census family's own name (it fell back to "LLaMA" for any other: GPT-2's, Mistral's, ...)
        which = CENSUS_LABELS.get(fam.removesuffix("_grouped"), fam)
        out.append(f"--impl hf times the census of HuggingFace's {which} modules: this model's {', '.join(extra)} "
                   "are not in it")  # fmt: skip
    return out


def chunk_note(r: LLMPrediction) -> str | None:
    """How a model's chunked attention (Llama 4's ``attention_chunk``) is costed at the plan's
    sequence; None without chunks or when the sequence fits in one (plain causal attention)."""
    m, p = r.model, r.plan
    seq = p.seq(m)
    if not m.attention_chunk or seq <= m.attention_chunk:
        return None
    n = m.chunked_layers or m.layers
    head = (f"the config's chunked attention ({m.attention_chunk:,}-token chunks, causal within each and none "
            f"across, on {n} of its {m.layers} layers)")  # fmt: skip
    share, over = _share(m.window_layer_share(seq)), _share(m.window_work_fraction(seq))
    if p.attention != "flash":
        return (f"{head} saves nothing with --attention {p.attention} (it computes every score): attention is costed "
                f"over all {seq:,} tokens (a chunked flash kernel does about {share} of the causal work)")  # fmt: skip
    if p.cp == 1 or p.cp_comm == "a2a":
        return (f"{head} is costed as FlashAttention over each chunk as its own sequence (varlen, the chunk edges as "
                f"cu_seqlens): the attention core's time and FLOPs scaled by the work it does, {share} of the causal "
                f"work on those layers ({over} over all layers){' on every a2a rank' if p.cp > 1 else ''}; an "
                "estimate from the measured causal kernel")  # fmt: skip
    busiest = _share(max(m.cp_window_rank_shares(seq, p.cp)))
    return (f"{head} with context parallelism: costed as a sliding window is, the chunked layers on "
            "TransformerEngine's KV all-gather CP (the p2p ring's causal blocks are not its mask) with each rank's "
            f"two sequence chunks attending within their attention chunks, {busiest} of a causal layer's work on the "
            f"busiest rank ({share} averaged over the ranks); an estimate (TransformerEngine has no chunked mask: a "
            "varlen kernel per chunk is assumed)")  # fmt: skip


def cp_comm_note(r: LLMPrediction) -> str:
    """Which context-parallel scheme the prediction costs (``Plan.cp_comm``, Megatron-core's
    ``--cp-comm-type``), and what it leaves out."""
    p, m = r.plan, r.model
    cp, seq = p.cp, p.seq(m)
    if p.cp_comm == "a2a":
        heads = f"{m.heads // (p.tp * cp)} of {m.heads} heads" + (f" ({-(-m.n_kv // p.tp) // cp} KV)" if m.n_kv != m.heads else "")
        return (f"context parallelism (cp {cp}) is costed as DeepSpeed-Ulysses, TransformerEngine's a2a CP "
                f"(--cp-comm-type a2a): Q, K and V all-to-all'd from the sequence split to a head split before the "
                f"attention core and its output back after it (the reverse in the backward), exposed; each rank's "
                f"attention runs over all {seq:,} tokens on {heads}; the all-to-alls' output buffers are not "
                "counted in memory (the activations kept are the p2p ring's)")  # fmt: skip
    if p.cp_comm == "all_gather":
        return (f"context parallelism (cp {cp}) is costed as TransformerEngine's KV all-gather CP (--cp-comm-type "
                f"allgather): K and V all-gathered over the {cp} ranks before the attention, exposed (again in the "
                "backward, dK/dV reduce-scattered); each rank's two load-balanced chunks attend over the gathered "
                "K/V, the ring's share of the work; the gathered K/V buffers are not counted in memory")  # fmt: skip
    return (f"context parallelism (cp {cp}) is costed as TransformerEngine's p2p ring, Megatron-core's default "
            "--cp-comm-type: each rank's K/V block passed round the ring, overlapped with the attention of the block "
            "it holds, the part longer than it exposed; --cp-comm-type allgather or a2a (Ulysses) costs the others")  # fmt: skip


def _warnings(r: LLMPrediction) -> list[str]:
    out = []
    kern = r.provenance["kernels"]
    spec = sum(n for k, n in kern.items() if k.startswith("spec-based"))
    if spec:
        out.append(f"{spec} operator(s) have no micro-benchmarks on {r.device.name}: spec-based rooflines "
                   "(peak FLOP/s and bandwidth), so those times are optimistic lower bounds")  # fmt: skip
    ext = sum(n for k, n in kern.items() if "extrapolated" in k)
    if ext:
        out.append(f"{ext} operator(s) lie outside the benchmarked sizes: carried from the nearest measured point along their entries' efficiency curves, or the roofline where a curve would break monotonicity")  # fmt: skip
    # a spec-based sister is a roofline, not a benchmark: those are counted in `spec` above
    sc = sum(n for k, n in kern.items() if "scaled-from" in k and not k.startswith("spec-based"))
    if sc:
        out.append(f"{sc} operator(s) (GQA/SwiGLU/MoE/vocabulary shapes) are scaled from a benchmarked sister operator")  # fmt: skip
    tr: dict[str, int] = {}
    for k, n in kern.items():
        if ";transferred-from:" in k and ";bench-as:" not in k:  # a sibling's bench sample: its own note
            src = k.split(";transferred-from:", 1)[1].split(";", 1)[0]
            tr[src] = tr.get(src, 0) + n
    bench: dict[tuple[str, str], int] = {}  # (sample, the sibling that measured it or "")
    for k, n in kern.items():
        if ";bench-as:" in k:
            src = k.split(":", 1)[1].split(";", 1)[0]
            sib = k.split(";transferred-from:", 1)[1].split(";", 1)[0] if ";transferred-from:" in k else ""
            bench[src, sib] = bench.get((src, sib), 0) + n
    for (src, sib), n in bench.items():
        whose = f"of {sib}, a sibling of this GPU" if sib else "of this GPU"
        out.append(f"{n} operator(s) are timed by trainsim bench's own measurements {whose} ({src}), "
                   "each written as the torch calls it runs (builders/bench_costs.py)")  # fmt: skip
    for src, n in tr.items():
        out.append(f"{n} operator(s) on {r.device.name} are timed with {src}'s micro-benchmarks (same "
                   "architecture and tensor-core peak; memory-bound ones scaled by the two memory bandwidths, "
                   "clocks may differ)")  # fmt: skip
    if r.plan.zero >= 2 and r.plan.pp > 1:
        out.append(f"ZeRO-{r.plan.zero} with pipeline parallelism: DeepSpeed's pipeline engine takes ZeRO-1 at most "
                   "and Megatron-LM's distributed optimizer is ZeRO-1 (--zero 1 --dist-optimizer); the plan needs a framework that combines "
                   "them (PyTorch FSDP2 with pipelining, e.g. torchtitan)")  # fmt: skip
    if r.plan.tp > r.system.gpus_per_node:
        out.append(f"tensor parallelism (tp {r.plan.tp}) spans nodes of {r.system.gpus_per_node} GPUs: its "
                   "all-reduces cross the inter-node network in every layer")  # fmt: skip
    if note := mtp_note(r.model, r.plan):
        out.append(note)
    if r.model.is_moe and r.plan.impl == "hf":
        out.append(hf_moe_note(r.model, r.plan))
    elif r.model.is_moe:
        out.append(moe_note(r.plan))
        if note := moe_family_note(r.model):
            out.append(note)
    if r.model.is_moe:
        from trainsim.hardware import get_device

        out.append(expert_gemms_note(r.model, r.plan, get_device(r.system.device).architecture))
    dp_s = r.breakdown.get("exposed_dp_communication_s", 0.0)
    if r.plan.dtype == "bf16" and r.plan.dp * r.plan.cp > 1 and dp_s > 0.1 * r.iteration_time_s:
        out.append(f"bf16: gradients are kept and reduced in fp32 here, 4 bytes a parameter, as Megatron does (it "
                   f"forces accumulate_allreduce_grads_in_fp32 for bf16): twice fp16's data-parallel bytes, "
                   f"{dp_s * 1e3:,.0f} ms exposed in this plan")  # fmt: skip
    if r.plan.recompute == "selective" and r.plan.attention == "flash":
        out.append("selective recompute with flash attention saves no memory (flash attention keeps no "
                   "attention scores to drop) and adds the attention's recompute: --recompute none is the "
                   "same memory, faster")  # fmt: skip
    if r.plan.seq_len == 0 and (note := default_seq_note(r.model)):
        out.append(note)
    seq = r.plan.seq(r.model)
    if r.model.sliding_window and seq > r.model.sliding_window:
        n_win = r.model.sliding_layers  # Gemma: some layers only (0: all)
        where = f" on {n_win} of its {r.model.layers} layers" if 0 < n_win < r.model.layers else ""
        share = _share(r.model.window_layer_share(seq))
        if r.plan.attention == "flash" and r.plan.cp == 1:
            out.append(f"the config's sliding window ({r.model.sliding_window:,} tokens{where}) is costed as FlashAttention's "
                       f"windowed kernel: the attention core's time and FLOPs scaled by the work it does, about {share} "
                       f"of the causal work on those layers ({_share(r.model.window_work_fraction(seq))} over all "
                       "layers), an estimate from the measured causal kernel")  # fmt: skip
            if win := hf_window_layer_bytes(r.model, r.plan):
                out.append(f"--impl hf memory: each sliding-window layer keeps {win / 2**30:,.2f} GiB a micro-batch more "
                           "than a full one, the activation census's SDPA path with the window's mask (the additive "
                           "[b, 1, s, s] mask and K/V repeated to the query heads, growing with s²); the windowed "
                           "flash kernel its time is costed as keeps neither")  # fmt: skip
        elif r.plan.attention == "flash" and r.plan.cp_comm == "a2a":
            out.append(f"the config's sliding window ({r.model.sliding_window:,} tokens{where}) with the a2a (Ulysses) "
                       f"context parallelism: each rank runs FlashAttention's windowed kernel over all {seq:,} tokens on "
                       f"its heads, about {share} of the causal work on those layers on every rank "
                       f"({_share(r.model.window_work_fraction(seq))} over all layers); an estimate from the measured "
                       "causal kernel")  # fmt: skip
        elif r.plan.attention == "flash" and r.plan.cp_comm == "all_gather":
            ranks = r.model.cp_window_rank_shares(seq, r.plan.cp)
            out.append(f"the config's sliding window ({r.model.sliding_window:,} tokens{where}) with the KV all-gather "
                       "context parallelism: each rank's two chunks attend within the window over the gathered K/V, "
                       f"about {_share(max(ranks))} of a causal layer's work on the busiest rank ({share} averaged over "
                       "the ranks, as unsplit); an estimate from the measured causal kernel")  # fmt: skip
        elif r.plan.attention == "flash":
            cp = r.plan.cp
            ranks = r.model.cp_window_rank_shares(seq, cp)
            rest = ("; the full layers keep the p2p ring (--cp-comm-type takes one type per layer)"
                    if 0 < n_win < r.model.layers else "")  # fmt: skip
            out.append(f"the config's sliding window ({r.model.sliding_window:,} tokens{where}) with context parallelism: "
                       "TransformerEngine's p2p ring (Megatron's default --cp-comm-type) refuses a window (it takes "
                       "a2a or all_gather), so the windowed layers are costed as its KV all-gather CP "
                       f"(--cp-comm-type allgather): K and V all-gathered over the {cp} ranks, exposed (again in the "
                       "backward, with a reduce-scatter of their gradients; no ring step is skipped, every rank "
                       "gathers all of K/V), and each rank's two chunks attend within the window, about "
                       f"{_share(max(ranks))} of a causal layer's work on the busiest rank ({share} averaged over the "
                       f"ranks, as unsplit){rest}; an estimate from the measured causal kernel")  # fmt: skip
        else:
            out.append(f"the config's sliding window ({r.model.sliding_window:,} tokens{where}) saves nothing with "
                       f"--attention {r.plan.attention} (it computes every score): attention is costed over all "
                       f"{seq:,} tokens (a windowed flash kernel does about {share} of the causal work)")  # fmt: skip
    elif win := hf_window_layer_bytes(r.model, r.plan):  # a sequence of exactly the window: masked all the same
        out.append(f"--impl hf memory: the sequence is exactly the sliding window ({seq:,} tokens), which transformers "
                   "still masks (it skips the mask only for a shorter one): each sliding-window layer keeps "
                   f"{win / 2**30:,.2f} GiB a micro-batch more than a full one (the additive [b, 1, s, s] mask and K/V "
                   "repeated to the query heads); the attention is the causal work")  # fmt: skip
    if note := chunk_note(r):
        out.append(note)
    if r.plan.cp > 1:
        out.append(cp_comm_note(r))
    out.extend(dense_family_notes(r.model, r.plan))
    if r.plan.partition == "001" and r.plan.pp == 1:
        out.append("--partition 001 splits layers over pipeline stages: it changes nothing with pp 1")
    if r.plan.schedule == "interleaved" and r.plan.vpp == 1:
        out.append("--schedule interleaved with --vpp 1 is the 1F1B schedule (one model chunk per stage); "
                   "give --vpp 2 or more to interleave")  # fmt: skip
    if r.plan.zero >= 1 and r.plan.dp * r.plan.cp == 1:
        out.append(f"ZeRO-{r.plan.zero} has nothing to shard with dp × cp = 1: it changes nothing here")
    if r.plan.impl == "hf":
        from trainsim.builders.eager import family_of

        # the census counts the dropout HF's modules ran when it was taken: GPT-2's resid/embd
        # dropout (its config's 0.1), none in LLaMA's; --hidden-dropout does not change it
        census_p = 0.1 if family_of(r.model) == "gpt2" else 0.0
        if r.plan.hidden_dropout > 0 and r.plan.hidden_dropout != census_p:
            out.append(f"--hidden-dropout {r.plan.hidden_dropout:g} is not applied with --impl hf: the dropout passes are "
                       f"those of HuggingFace's {family_of(r.model, r.plan.experts_impl)} modules as counted (dropout {census_p:g}), "
                       "builders/data/hf_eager_census.json")  # fmt: skip
    if r.plan.sp and r.plan.tp == 1:
        out.append(
            "sequence parallelism has no effect with tp 1 (it splits the TP group's activations)"
        )
    m, pp = r.plan.grad_accum, r.plan.pp
    if pp > 1 and m < pp:
        out.append(f"only {m} micro-batch(es) for {pp} pipeline stages: the pipeline is mostly bubble "
                   f"(raise --global-batch to at least {pp * r.plan.micro_batch * r.plan.dp})")  # fmt: skip
    comm = r.provenance["collectives"]
    far = sorted({k.split(";extrapolated-from:")[1].split(";")[0] for k in comm if ";extrapolated-from:" in k})
    if far:
        n = sum(v for k, v in comm.items() if ";extrapolated-from:" in k)
        out.append(f"{n} collective(s) span more GPUs than their comm models measured (largest measured: "
                   f"{', '.join(far)} nodes×GPUs): carried beyond the measurements, less certain")  # fmt: skip
    big = [(k, v) for k, v in comm.items() if ";beyond-sizes:" in k]
    if big:
        top = max(float(k.split(";beyond-sizes:")[1].split(";")[0]) for k, _ in big)
        out.append(f"{sum(v for _, v in big)} collective(s) move more than {BEYOND_SIZES:g}x the largest message "
                   f"their comm models measured (largest: {top / 1e6:,.0f} MB): the fitted curve's bandwidth is "
                   "carried beyond the measurements")  # fmt: skip
    if any(k.startswith("spec-based") for k in comm):
        out.append(
            f"some collectives on {r.system.name} are spec-based (the stated link rates at 100 % efficiency, "
            "NCCL's ring and tree steps at the stated latencies; no measurement): usually optimistic for large messages, "
            "and less certain either way for small ones, whose many steps' latencies add up"
        )
    from trainsim.comm.registry import shadowed_note

    if (shadowed := shadowed_note(r.system)) is not None:  # a YAML copy of a catalog system, edited
        out.append(shadowed)
    from trainsim.kernels.rescaled import rescaled_note

    if (rescaled := rescaled_note(r.device)) is not None:  # a YAML copy of a catalog device, edited
        out.append(rescaled)
    if r.device.peak_flops_per_s(r.plan.dtype) is None:
        trains = next((d for d in ("bf16", "fp16") if d != r.plan.dtype and r.device.peak_flops_per_s(d)), None)
        out.append(f"{r.device.name} has no {r.plan.dtype} tensor cores: its matrix math is costed at the "
                   "fp32 peak (frameworks emulate it or refuse"
                   + (f"; {trains} is what this GPU trains in)" if trains else ")"))  # fmt: skip
    if not r.fits_in_memory:
        # a config's own path when it came from a file (what `search` takes too)
        name = r.model.name if _in_catalog(r.model) else (r.model.source if Path(r.model.source).is_file() else "MODEL")
        room = (f" ({r.memory_limit_bytes / 2**30:.1f} GiB after the {r.memory_headroom_bytes / 2**30:.1f} GiB headroom)"
                if r.memory_headroom_bytes else "")  # fmt: skip
        # the same headroom, rounded up so the search keeps at least as much free
        hr = f" --memory-headroom {math.ceil(r.memory_headroom_bytes / 2**20)}MiB" if r.memory_headroom_bytes else ""
        need = min_gpus_for_states(r.model, r.plan, r.memory_limit_bytes)
        gpus, why = r.plan.gpus, "lists the plans that fit"
        if need == 0:
            why = "lists the plans that fit, if any: the memory left after the headroom is below the CUDA context's"
        elif need > gpus:
            # no plan on this many GPUs holds the weights, gradients and optimizer states: suggest
            # the first count that could and that the search can split (power-of-two degrees: a
            # power of two up to a node, a power of two of nodes beyond; a lower bound, activations add)
            gpn = r.system.gpus_per_node
            gpus = 1 << (need - 1).bit_length() if need <= gpn else gpn << (math.ceil(need / gpn) - 1).bit_length()
            why = (f"searches {gpus} GPUs: the weights, gradients and optimizer states alone need at least {need} "
                   f"GPUs of this memory even fully sharded, so none of the {r.plan.gpus}-GPU plans fits")  # fmt: skip
        # what the search must share with this plan: its sequence length, precision, attention
        p = r.plan
        same = "".join(f" {flag} {v}" for flag, v, default in (
            ("--seq-len", p.seq_len, 0), ("--dtype", p.dtype, "bf16"), ("--attention", p.attention, "flash"))
            if v != default)  # fmt: skip
        sysname = r.system_ref if r.system_ref and Path(r.system_ref).expanduser().is_file() else r.system.name
        # what the search cannot share: it plans fused kernels and Adam
        unsearched = [f"--{k} {v}" for k, v, d in (("impl", p.impl, "fused"), ("optimizer", p.optimizer, "adam")) if v != d]
        # no --global-batch given: the plan's default (micro-batch x dp) would pin the search to
        # this plan's dp, so it gets the default at dp = all the GPUs; a given one is kept
        batch = r.plan.batch if p.global_batch else p.micro_batch * gpus
        batch_why = ("" if p.global_batch else
                     f"; global batch {batch} is micro-batch x {gpus} GPUs, as left out here: give yours")  # fmt: skip
        caveat = (f"; it plans fused kernels and Adam, not this plan's {' and '.join(unsearched)}, so its memory "
                  "and times differ") if unsearched else ""  # fmt: skip
        out.append(f"the plan needs {r.peak_memory.total_bytes / 2**30:.1f} GiB per GPU; {r.device.name} has "
                   f"{r.device.memory_bytes / 2**30:.1f} GiB{room} (`trainsim search {name} --gpus {gpus} "
                   f"--system {sysname} --global-batch {batch}{same}{hr}` {why}{caveat}{batch_why})")  # fmt: skip
    return out


def _in_catalog(model: ModelSpec) -> bool:
    """Whether the catalog's model of that name is this one (a config.json's may not be)."""
    try:
        return get_model(model.name) == model
    except TrainsimError:
        return False
