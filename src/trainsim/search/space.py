"""The plan space of an LLM search, defined once: values per dimension and the constraints.

A :class:`PlanSpace` lists the values each dimension may take (tensor, pipeline, context and
expert parallel degrees, sequence parallelism, ZeRO stage, micro-batch, recompute, schedule,
interleave, the context-parallel K/V exchange); the data-parallel degree follows from the GPU
count. :meth:`PlanSpace.plans`
enumerates every combination and sorts it into candidates and infeasible plans, each of the
latter with a short reason key (``tp does not divide heads``, ``does not fit in memory``, ...)
so a search can count them by reason. The structural rules are :meth:`Plan.validate`'s — one
definition for ``predict`` and ``search`` alike; memory is checked by the screening step.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from trainsim.builders.memory import stage_layers
from trainsim.builders.plan import Plan
from trainsim.builders.spec import ModelSpec
from trainsim.errors import ConfigError
from trainsim.search.frameworks import framework_plan

_POW2 = (1, 2, 4, 8, 16, 32, 64, 128)


def reason_key(message: str) -> str:
    """A countable reason from a ConfigError message: numbers and names dropped."""
    m = message.removeprefix("plan: ")
    m = re.sub(r"\b[\w.-]+'s\b", "the model's", m)
    m = re.sub(r"\b[\w.-]*\d[\w.×-]*\b", "N", m)
    m = re.sub(r"\([^)]*\)", "", m)
    return re.sub(r"\s+", " ", m).strip()


def end_stage_splits(layers: int, pp: int, trim: int) -> Iterator[tuple[int, int]]:
    """(first, last) stage layers with ``a + b <= trim`` layers taken off the first and last of
    ``pp`` stages, the middle ones holding ``m = (layers + a + b) / pp`` each (an integer, as
    Megatron-core's uneven split needs): the end stages carry the embedding, the head and the
    MTP depths, which ``--decoder-first/last-pipeline-num-layers`` offsets (Llama 3 405B: one
    layer off each end of 16 stages). DeepSeek-V3's 61 layers on 16 stages: (3, 2) and (2, 3).
    Each split once: with two stages there is no middle, and trims ``t`` and ``t + 2`` give the
    same splits (24 layers: 13/11 from t 2 as from t 4), which had been screened and ranked twice."""
    seen: set[tuple[int, int]] = set()
    # no new split past 2 x layers: with t = a + b = pp*m - layers, ends of >= 1 layer give
    # t < 2 x layers for pp >= 3, and pp 2 has every (first, layers - first) from t = layers - 2;
    # a larger trim (--trim-end-stages 1e11) had looped for ever over the t that add nothing
    for t in range(1, min(trim, 2 * layers) + 1):
        if (layers + t) % pp:
            continue
        m = (layers + t) // pp
        for a in range(t + 1):
            first, last = m - a, m - (t - a)
            if first >= 1 and last >= 1 and (first, last) not in seen:
                seen.add((first, last))
                yield first, last


@dataclass(frozen=True, slots=True)
class PlanSpace:
    """Values per dimension (see the module docstring). Empty tuples mean "the default"."""

    gpus: int
    global_batch: int
    seq_len: int = 0
    tp: tuple[int, ...] = ()  # default: powers of two up to the GPUs of a node
    pp: tuple[int, ...] = ()  # default: powers of two up to the layer count
    cp: tuple[int, ...] = (1,)
    # context-parallel K/V exchanges to try with cp > 1 (Plan.cp_comm; cp 1 plans once, as p2p)
    cp_comm: tuple[str, ...] = ("p2p",)
    ep: tuple[int, ...] = ()  # default: 1 for a dense model; for MoE, powers of two dividing the experts
    sp: tuple[bool, ...] = (False, True)
    zero: tuple[int, ...] = (0, 1, 2, 3)
    micro_batch: tuple[int, ...] = (1, 2, 4, 8)
    recompute: tuple[str, ...] = ("none", "selective", "full")
    schedule: tuple[str, ...] = ("1f1b", "interleaved")
    vpp: tuple[int, ...] = (2, 4)  # chunks per stage for the interleaved schedule
    dtype: str = "bf16"
    attention: str = "flash"
    attention_dropout: float = 0.0
    wgrad_fusion: bool = False
    overlap_grad_reduce: bool = False
    dist_optimizer: bool = False  # ZeRO-1 plans as Megatron-LM's distributed optimizer (Plan.dist_optimizer)
    moe_imbalance: float = 1.0  # every MoE plan's busiest-EP-rank load (Plan.moe_imbalance), not searched
    moe_grouped_gemm: bool = False  # every MoE plan's experts as TE's GroupedLinear (Plan.moe_grouped_gemm), not searched
    # the ZeRO-1/2 weight gathers in the next forward (Plan.overlap_param_gather), on every plan that can take it
    overlap_param_gather: bool = False
    framework: str = "any"  # only the plans this framework runs (trainsim.search.frameworks)
    # up to this many layers taken off the end stages (1F1B, GPipe): see :func:`end_stage_splits`
    trim_end_stages: int = 0
    contention: bool = True  # overlapped collectives stretch the compute beside them (Plan.contention)
    extra: dict[str, object] = field(default_factory=dict, compare=False)

    def dims(self, model: ModelSpec, gpus_per_node: int) -> dict[str, tuple[object, ...]]:
        tp = self.tp or tuple(t for t in _POW2 if t <= max(gpus_per_node, 1) and t <= self.gpus)
        pp = self.pp or tuple(p for p in _POW2 if p <= model.layers and p <= self.gpus)
        ep = self.ep or ((1,) if not model.num_experts else
                         tuple(e for e in _POW2 if model.num_experts % e == 0 and e <= self.gpus))  # fmt: skip
        return {"tp": tp, "pp": pp, "cp": self.cp, "ep": ep, "sp": self.sp, "zero": self.zero,
                "micro_batch": self.micro_batch, "recompute": self.recompute, "schedule": self.schedule,
                "cp_comm": self.cp_comm}  # fmt: skip

    def plans(self, model: ModelSpec, gpus_per_node: int) -> Iterator[tuple[Plan | None, str]]:
        """Every distinct combination: ``(plan, "")`` when structurally valid, else ``(None, message)``
        (count messages by :func:`reason_key`). Combinations that would repeat a plan are not
        yielded: sequence parallelism without TP, a K/V exchange other than the first listed at
        cp 1 (it exchanges nothing: the plan is p2p's), ZeRO stages above the smallest tried when
        dp×cp is 1 (nothing to shard over), selective recompute beside ``none`` with flash
        attention (it keeps no scores to drop: the same memory, more time), and the interleaved schedule without pipeline stages
        or with one chunk per stage (``vpp`` 1: the 1F1B plan, when 1F1B is in the space)."""
        d = self.dims(model, gpus_per_node)
        # without pipeline stages interleaving has nothing to interleave: with another schedule
        # in the list it is that plan (skipped), alone it is infeasible. GPipe stays its own
        # plan: the same time as 1F1B at pp 1, but every micro-batch's activations held
        flat = any(s != "interleaved" for s in self.schedule)
        for tp, pp, cp, ep, sp, zero, mb, rc, sched, cc in itertools.product(*d.values()):
            if cp == 1 and cc != self.cp_comm[0]:
                continue  # the K/V exchange changes nothing without context parallelism: one plan (p2p)
            if sp and tp == 1:
                continue  # sequence parallelism is a no-op without TP: not a distinct plan
            if rc == "selective" and self.attention == "flash" and "none" in self.recompute:
                continue  # flash attention keeps no scores: the none plan's memory, plus the recompute
            if pp == 1 and flat and sched == "interleaved":
                continue  # the same plan as with the other schedules (see above)
            base = int(tp) * int(cp) * int(pp)  # type: ignore[call-overload]
            if self.gpus % base:
                if not (self.tp or self.pp) and self.cp == (1,):
                    continue  # default degrees whose product outgrows the GPUs: never a plan to try
                yield None, f"GPUs {self.gpus} not divisible by tp×cp×pp = {base}"
                continue
            if self.gpus // base * int(cp) == 1 and zero != min(self.zero):  # type: ignore[call-overload]
                continue  # ZeRO shards over dp×cp: with one rank every stage is the same plan
            vpps = self.vpp if sched == "interleaved" else (1,)
            if sched == "interleaved" and "1f1b" in self.schedule:
                vpps = tuple(v for v in vpps if v != 1)  # one chunk per stage is the 1F1B plan
            if not self.ep and (self.gpus // base) % int(ep):  # type: ignore[call-overload]
                continue  # a default expert degree that cannot split this dp: not a plan to try
            for v in vpps:
                fields: dict[str, Any] = {
                    "tp": tp, "pp": pp, "dp": self.gpus // base, "cp": cp, "ep": ep, "sp": sp, "zero": zero,
                    "cp_comm": cc if cp != 1 else "p2p",
                    "micro_batch": mb, "global_batch": self.global_batch, "seq_len": self.seq_len,
                    "schedule": sched, "vpp": v, "recompute": rc, "dtype": self.dtype,
                    "attention": self.attention, "attention_dropout": self.attention_dropout,
                    "wgrad_fusion": self.wgrad_fusion, "overlap_grad_reduce": self.overlap_grad_reduce,
                    "dist_optimizer": self.dist_optimizer and zero == 1, "moe_imbalance": self.moe_imbalance,
                    "contention": self.contention, "moe_grouped_gemm": self.moe_grouped_gemm,
                }  # fmt: skip
                if self.overlap_param_gather:  # on the plans it applies to (Plan.overlap_param_gather_why_not)
                    fields["overlap_param_gather"] = not Plan(**{**fields, "overlap_param_gather": True}).overlap_param_gather_why_not()
                plan = Plan(**fields)
                if sched == "interleaved" and pp == 1:
                    yield None, "interleaved schedule needs two or more pipeline stages"
                    continue
                try:
                    plan.validate(model, gpus=self.gpus)
                except ConfigError as e:
                    yield None, str(e)
                    continue
                runs, why = framework_plan(plan, self.framework)
                if runs is not None and self.overlap_param_gather and not runs.overlap_param_gather:
                    runs = _with_param_gather(runs)  # Megatron's ZeRO-1, now with its distributed optimizer
                yield (runs, "") if runs is not None else (None, why)
                if runs is None or not self.trim_end_stages or sched == "interleaved" or int(pp) < 2:  # type: ignore[call-overload]
                    continue
                even = stage_layers(model, plan)
                for first, last in end_stage_splits(model.layers, int(pp), self.trim_end_stages):  # type: ignore[call-overload]
                    trimmed = Plan(**{**fields, "first_stage_layers": first, "last_stage_layers": last})
                    try:
                        trimmed.validate(model, gpus=self.gpus)
                    except ConfigError as e:
                        yield None, str(e)
                        continue
                    if stage_layers(model, trimmed) != even:  # pp 2, odd layers: the even split itself
                        t_runs = framework_plan(trimmed, self.framework)[0]
                        if t_runs is not None and self.overlap_param_gather:
                            t_runs = _with_param_gather(t_runs)
                        yield t_runs, ""


def _with_param_gather(plan: Plan) -> Plan:
    """``plan`` with ``overlap_param_gather`` where it can take it, else unchanged."""
    cand = replace(plan, overlap_param_gather=True)
    return plan if cand.overlap_param_gather_why_not() else cand
