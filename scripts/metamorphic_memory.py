"""Metamorphic / physics sweep of the per-GPU memory model (``builders/memory.py``) and its uses
in ``trainsim predict`` (``memory{}``, ``fits_in_memory``, the does-not-fit hint) and
``trainsim search`` (memory screening, the infeasible counts).

Valid (model, plan) pairs are sampled over the catalog models and the impls (``fused``,
``neox``, and ``hf`` where the model has a census: tp = cp = ep = 1 there), and each relation
is checked on the plan and its variants. A violation prints one line; exit 1 on any.

Relations (``docs/llm.md`` item 8, the module docstring):

* terms — ``at_peak=False`` is every term at once: its phase "backward", its weights, gradients
  and optimizer bytes the stage's parameters (``stage_params_split``) times the ZeRO-sharded
  :class:`Precision`; under fused/neox ``at_peak`` changes nothing;
* hf peak — the phase named is one of the moments the stage can have (the last stage's loss,
  head, recompute, embedding moments; every stage's optimizer step), its total the reported
  total and the largest of the moments (docs/llm.md's formulas rebuilt here); the peak at least
  the optimizer step's and at most the every-term sum plus the largest phase-only transient
  (AdamW's foreach temporary, the loss's two fp32 ``[T, V]`` gradients, the head's logits and
  hidden-state gradients with its weight gradient, the tied embedding's two ``V d`` tensors);
* monotone — twice the micro-batch (same accumulation), a longer sequence, more accumulation
  steps, more layers (even split: every stage; 001's split moves layers between stages: the
  peak), dropout on, attention dropout, non-flash attention, Adam over SGD: never less memory,
  stage by stage;
* sharding — twice tp, pp, dp, cp or ep: the largest stage's weights + gradients + optimizer
  bytes never more; ZeRO s+1: every stage's states never more, and the total never more where
  the states it shards outweigh its buffers (narrowed: see :func:`check_zero`);
* recompute — full and selective never more activation bytes than none (fused, every stage;
  impl hf, the every-term sum's);
* context parallelism — cp 1 has no CP buffers and every ``cp_comm`` is the same plan there;
  under each scheme a longer sequence never fewer CP bytes nor less memory;
* peak / fits — ``peak_memory`` is the largest stage (the first on ties), ``fits`` is
  ``peak <= limit``; predict's ``fits_in_memory`` and ``memory_limit_bytes`` agree with
  ``fits`` under the same ``--memory-headroom`` (limits set one byte either side of the peak);
  a plan that fits has at least ``min_gpus_for_states`` GPUs (the hint's lower bound);
* search — for small spaces on several systems (one with a fractional capacity) and headrooms,
  the plans it counts as not fitting are exactly those ``fits`` refuses under its limit, its
  limit is predict's, and every ranked plan fits by predict under the same headroom;
* CLI — ``predict --format json``'s ``memory{}`` keys, ``memory_per_gpu_bytes ==
  memory.total_bytes`` (the sum of its parts, the largest of ``memory_per_stage_bytes``),
  ``fits_in_memory == (memory_per_gpu_bytes <= memory_limit_bytes)``, the hint iff it does
  not fit; ``search --format json``'s limit is predict's.

    python scripts/metamorphic_memory.py [--seed S] [--plans N] [--no-search] [--no-cli]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from trainsim.builders import memory as mm
from trainsim.builders.memory import (
    LOGITS_BYTES,
    MemoryBreakdown,
    Precision,
    cp_kept_bytes,
    cp_transient_bytes,
    fits,
    headroom_bytes,
    memory_per_gpu,
    min_gpus_for_states,
    peak_memory,
    stage_layers,
)
from trainsim.builders.models import get_model, list_models
from trainsim.builders.plan import Plan
from trainsim.builders.predict import predict_llm
from trainsim.builders.spec import ModelSpec
from trainsim.cli.output import _clean
from trainsim.errors import TrainsimError
from trainsim.hardware import get_device, get_system
from trainsim.search.llm import MEMORY_REASON, reason_key, search_llm
from trainsim.search.space import PlanSpace

REL = 1e-9
MEMORY_KEYS = {"stage", "weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes",
               "buffers_bytes", "phase", "total_bytes"}  # fmt: skip
HF_PHASES = {"optimizer-step", "loss-backward", "head-backward", "recompute", "embedding-backward", "backward"}

violations: list[str] = []
counts: Counter[str] = Counter()
narrowed: Counter[str] = Counter()  # relations skipped where they need not hold (see each check)


def count(what: str, n: int = 1) -> None:
    counts[what] += n


def bad(relation: str, detail: str) -> None:
    violations.append(f"{relation}: {detail}")
    print(f"VIOLATION {relation}: {detail}", flush=True)


def le(a: float, b: float) -> bool:
    """a <= b up to float rounding."""
    return a <= b + REL * max(abs(a), abs(b), 1.0)


def close(a: float, b: float) -> bool:
    return abs(a - b) <= REL * max(abs(a), abs(b), 1.0)


def gib(x: float) -> str:
    return f"{x / 2**30:.4f} GiB"


def states(m: MemoryBreakdown) -> float:
    return m.weights_bytes + m.gradients_bytes + m.optimizer_bytes


def mem(model: ModelSpec, plan: Plan, **kw: Any) -> list[MemoryBreakdown] | None:
    try:
        return memory_per_gpu(model, plan, **kw)
    except TrainsimError:
        return None


def valid(model: ModelSpec, plan: Plan) -> bool:
    try:
        plan.validate(model)
        return True
    except TrainsimError:
        return False


# --- sampling --------------------------------------------------------------------------------


def _pow2(limit: int) -> list[int]:
    return [p for p in (1, 2, 4, 8, 16) if p <= limit]


def sample_plan(model: ModelSpec, impl: str, rng: random.Random) -> Plan | None:
    """A random valid plan (None after a few tries)."""
    seqs = [s for s in (512, 1024, 2048, 4096, 8192) if model.position != "learned" or s <= model.seq_len]
    for _ in range(40):
        hf = impl == "hf"
        tp = 1 if hf else rng.choice([t for t in _pow2(8) if model.heads % t == 0])
        pp = rng.choice([p for p in _pow2(8) if p <= model.layers])
        cp = 1 if hf else rng.choice([1, 1, 2, 4])
        dp = rng.choice([1, 2, 4, 8])
        ep = 1
        if model.is_moe and not hf:
            ep = rng.choice([e for e in _pow2(dp) if model.num_experts % e == 0])
        zero = rng.choice([0, 1, 2, 3])
        mb = rng.choice([1, 2, 4])
        ga = rng.choice([1, 2, 4, 8])
        schedule = rng.choice(["1f1b", "1f1b", "gpipe", "interleaved"])
        vpp = 1
        if schedule == "interleaved":
            vpp = rng.choice([1, 2])
            if pp == 1:
                vpp = 1
        plan = Plan(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, sp=tp > 1 and rng.random() < 0.5, zero=zero,
                    dist_optimizer=zero == 1 and rng.random() < 0.3, micro_batch=mb, global_batch=mb * dp * ga,
                    seq_len=rng.choice(seqs), schedule=schedule, vpp=vpp,  # type: ignore[arg-type]
                    recompute=rng.choice(["none", "selective", "full"]),
                    dtype=rng.choice(["bf16", "bf16", "fp16", "fp32"]),
                    attention=rng.choice(["flash", "flash", "fused", "unfused"]),
                    attention_dropout=rng.choice([0.0, 0.1]), impl=impl,  # type: ignore[arg-type]
                    cp_comm=rng.choice(["p2p", "all_gather", "a2a"]),
                    partition="001" if schedule != "interleaved" and rng.random() < 0.2 else "even",
                    optimizer=rng.choice(["adam", "adam", "sgd"]),
                    moe_imbalance=rng.choice([1.0, 1.5]) if model.is_moe and ep > 1 else 1.0)  # fmt: skip
        if valid(model, plan):
            return plan
    return None


# --- relations on one plan -------------------------------------------------------------------


def check_terms(model: ModelSpec, plan: Plan, every: list[MemoryBreakdown], peak: list[MemoryBreakdown]) -> None:
    """at_peak=False: every term at once, the states the parameters' sharded bytes."""
    prec = Precision.for_dtype(plan.dtype, plan.impl)
    if plan.optimizer == "sgd":
        prec = Precision(prec.weight_bytes, prec.grad_bytes, 0.0)
    shards = plan.dp * plan.cp
    dp_, ep_ = prec.sharded(plan.zero, shards), prec.sharded(plan.zero, shards / plan.ep)
    layers = stage_layers(model, plan)
    for m in every:
        dense, expert = mm._stage_params_split(model, plan, m.stage, layers)
        want = (dense * dp_.weight_bytes + expert * ep_.weight_bytes,
                dense * dp_.grad_bytes + expert * ep_.grad_bytes,
                dense * dp_.optimizer_bytes + expert * ep_.optimizer_bytes)  # fmt: skip
        got = (m.weights_bytes, m.gradients_bytes, m.optimizer_bytes)
        if not all(close(a, b) for a, b in zip(got, want, strict=True)):
            bad("terms: states = params x sharded precision", f"{model.name} {plan.label()} stage {m.stage}: {got} vs {want}")
        parts = m.weights_bytes + m.gradients_bytes + m.optimizer_bytes + m.activations_bytes + m.buffers_bytes
        if m.phase != "backward" or not close(m.total_bytes, parts) or m.to_dict()["total_bytes"] != m.total_bytes:
            bad("terms: at_peak=False is the sum, phase backward", f"{model.name} {plan.label()} stage {m.stage}: {m}")
        if min(m.weights_bytes, m.gradients_bytes, m.optimizer_bytes, m.activations_bytes, m.buffers_bytes) < 0:
            bad("terms: non-negative", f"{model.name} {plan.label()} stage {m.stage}: {m}")
        count("terms (stages)")
    if plan.impl != "hf" and peak != every:
        bad("terms: at_peak changes nothing under fused/neox", f"{model.name} {plan.label()}")


def hf_phases(model: ModelSpec, plan: Plan, m: MemoryBreakdown) -> dict[str, float]:
    """The moments of an impl-hf stage's step and their totals, as docs/llm.md item 8 states
    them (``m``: the every-term sum)."""
    prec = Precision.for_dtype(plan.dtype, "hf")
    last = m.stage == plan.pp - 1
    tokens = plan.micro_batch * plan.seq(model)
    e = 4 if plan.dtype == "fp32" else 2
    tv, td = tokens * model.vocab, tokens * model.hidden
    w, g, o, a, b = m.weights_bytes, m.gradients_bytes, m.optimizer_bytes, m.activations_bytes, m.buffers_bytes
    acc = g if plan.grad_accum > 1 else 0.0
    layers = stage_layers(model, plan)[m.stage]
    work = mm._hf_stage_work(model, plan, layers, mm.stage_dense_layers(model, plan)[m.stage])
    out = {"optimizer-step": w + g + o + b + o / 2}
    head_grad = model.vocab * model.hidden * prec.grad_bytes
    if last:
        saved = LOGITS_BYTES * tv
        out["loss-backward"] = w + acc + o + (a - work) + b + 2 * LOGITS_BYTES * tv
        grads = acc or head_grad
        out["head-backward"] = w + grads + o + max(a - work - saved, 0.0) + b + e * tv + e * td
        if work:
            out["recompute"] = w + grads + o + max(a - saved, 0.0) + b
        if model.tied_embeddings and plan.pp == 1:
            out["embedding-backward"] = w + g + o + b + 2 * head_grad
    else:
        out["backward"] = w + acc + o + a + b
    return out


def check_hf_peak(model: ModelSpec, plan: Plan, every: list[MemoryBreakdown], peak: list[MemoryBreakdown]) -> None:
    if plan.zero >= 2 and plan.dp * plan.cp > 1:
        return  # FSDP's moments (memory._hf_fsdp_phases: unsharded units beside the shards) are not rebuilt here; validate memory measures them
    for m, p in zip(every, peak, strict=True):
        where = f"{model.name} {plan.label()} stage {p.stage} ({p.phase})"
        phases = hf_phases(model, plan, m)
        if p.phase not in phases:
            bad("hf: the phase is one the stage has", f"{where}: not in {sorted(phases)}")
            continue
        if not close(phases[p.phase], p.total_bytes):
            bad("hf: the named phase's total is the total", f"{where}: {gib(phases[p.phase])} vs {gib(p.total_bytes)}")
        if not close(max(phases.values()), p.total_bytes):
            bad("hf: the peak is the largest moment", f"{where}: {gib(p.total_bytes)}, phases "
                f"{ {k: round(v / 2**30, 4) for k, v in phases.items()} }")  # fmt: skip
        if p.weights_bytes != m.weights_bytes or p.optimizer_bytes != m.optimizer_bytes:
            bad("hf: weights and optimizer state live through the step", where)
        if not le(p.activations_bytes, m.activations_bytes):
            bad("hf: no more activations than the sum's", f"{where}: {gib(p.activations_bytes)} > {gib(m.activations_bytes)}")
        if p.phase == "optimizer-step" and (p.activations_bytes or p.gradients_bytes != m.gradients_bytes):
            bad("hf: the optimizer step holds every gradient, no activations", where)
        # bounds: at least the optimizer step; at most the sum and the largest phase-only transient
        if not le(m.total_bytes - m.activations_bytes + m.optimizer_bytes / 2, p.total_bytes):
            bad("hf: peak >= the optimizer step", where)
        prec = Precision.for_dtype(plan.dtype, "hf")
        tokens = plan.micro_batch * plan.seq(model)
        e = 4 if plan.dtype == "fp32" else 2
        head_grad = model.vocab * model.hidden * prec.grad_bytes
        transient = m.optimizer_bytes / 2
        if p.stage == plan.pp - 1:
            head_more = max(head_grad - m.gradients_bytes, 0.0)  # the head's whole gradient over the stage's
            transient = max(transient, 2 * LOGITS_BYTES * tokens * model.vocab,
                            e * tokens * (model.vocab + model.hidden) + head_more, head_more,
                            2 * head_grad if model.tied_embeddings and plan.pp == 1 else 0.0)  # fmt: skip
        if not le(p.total_bytes, m.total_bytes + transient):
            bad("hf: peak <= sum + the phase-only transients", f"{where}: {gib(p.total_bytes)} > {gib(m.total_bytes)} "
                f"+ {gib(transient)}")  # fmt: skip
        count("hf peak (stages)")


def check_peak_fits(model: ModelSpec, plan: Plan, peak: list[MemoryBreakdown]) -> None:
    pk = peak_memory(model, plan)
    first = max(peak, key=lambda m: m.total_bytes)
    if pk != first or any(m.total_bytes > pk.total_bytes for m in peak):
        bad("peak_memory is the largest stage", f"{model.name} {plan.label()}: {pk.stage} vs {first.stage}")
    # fits: monotone in the limit, true from the peak's whole bytes up (as the JSON rounds them:
    # round(peak) <= limit), false a byte below the peak
    t = pk.total_bytes
    verdicts = {}
    for limit in sorted({t - 1.0, math.floor(t) - 1, math.floor(t), round(t), t, math.ceil(t), math.ceil(t) + 1}):
        ok, at = fits(model, plan, limit)
        verdicts[limit] = ok
        if at != pk:
            bad("fits: its breakdown is the peak stage's", f"{model.name} {plan.label()}")
    vs = list(verdicts.values())
    if vs != sorted(vs) or not verdicts[max(round(t), t)] or verdicts[t - 1.0] or verdicts[math.floor(t) - 1]:
        bad("fits: monotone, true at the peak's whole bytes, false a byte below", f"{model.name} {plan.label()} "
            f"peak {t!r}: {verdicts}")  # fmt: skip
    count("peak/fits")


def _vary(model: ModelSpec, plan: Plan, **changes: Any) -> Plan | None:
    p = replace(plan, **changes)
    return p if valid(model, p) else None


def _each_stage_le(relation: str, model: ModelSpec, small: Plan, big: Plan, *,
                   small_model: ModelSpec | None = None) -> None:  # fmt: skip
    """Every stage of ``big`` needs at least what that stage of ``small`` needs (``small`` of
    ``small_model`` when given)."""
    a = mem(small_model or model, small)
    b = mem(model, big)
    if a is None or b is None:
        return
    for x, y in zip(a, b, strict=True):
        if not le(x.total_bytes, y.total_bytes):
            bad(relation, f"{model.name} {small.label()} -> {big.label()} stage {x.stage} ({x.phase} -> {y.phase}): "
                f"{gib(x.total_bytes)} > {gib(y.total_bytes)}")  # fmt: skip
    count(relation)


def check_monotone(model: ModelSpec, plan: Plan) -> None:
    if (p := _vary(model, plan, micro_batch=2 * plan.micro_batch, global_batch=2 * plan.batch)) is not None:
        _each_stage_le("monotone: micro-batch x2", model, plan, p)
    if (p := _vary(model, plan, global_batch=2 * plan.batch)) is not None:
        _each_stage_le("monotone: accumulation x2", model, plan, p)
    if (p := _vary(model, plan, seq_len=2 * plan.seq(model))) is not None:
        _each_stage_le("monotone: sequence x2", model, plan, p)
    if (p := _vary(model, plan, attention_dropout=0.1)) is not None and plan.attention_dropout == 0:
        _each_stage_le("monotone: attention dropout", model, plan, p)
    # flash keeps the fp32 LSE a layer where materialised scores keep none; selective recompute
    # drops the scores to one layer's working set, so there L x m layers' LSE can outweigh one
    # layer's s^2 scores (short sequences, many layers in flight): only without selective
    if plan.attention == "flash" and plan.recompute != "selective":
        for att in ("fused", "unfused"):
            if (p := _vary(model, plan, attention=att)) is not None:
                _each_stage_le("monotone: flash <= materialised scores", model, plan, p)
    if plan.optimizer == "sgd" and (p := _vary(model, plan, optimizer="adam")) is not None:
        _each_stage_le("monotone: sgd <= adam", model, plan, p)
    a, b = mem(model, plan, dropout=False), mem(model, plan)
    if a is not None and b is not None:
        for x, y in zip(a, b, strict=True):
            if not le(x.total_bytes, y.total_bytes):
                bad("monotone: dropout masks", f"{model.name} {plan.label()} stage {x.stage}")
        count("monotone: dropout masks")
    # more layers: the same model with pp x vpp more (each chunk one more) or one more. A model
    # whose windowed / NoPE / chunked layers are a count spreads their share over every layer
    # (cp_kept_bytes, the hf census's window part): a layer added elsewhere lowers a stage's
    # share. Those models double their layers and those counts together (the same share).
    kinds = ("sliding_layers", "nope_layers", "chunked_layers")
    if any(getattr(model, k) for k in kinds):
        variants = [replace(model, layers=2 * model.layers, **{k: 2 * getattr(model, k) for k in kinds})]
    else:
        variants = [replace(model, layers=model.layers + extra) for extra in (plan.pp * plan.chunks, 1)]
    for bigger in variants:
        if not valid(bigger, plan):
            continue
        if plan.partition == "even" and not (plan.first_stage_layers or plan.last_stage_layers):
            _each_stage_le("monotone: more layers (each stage)", bigger, plan, plan, small_model=model)
        else:  # 001's split moves layers between the stages: only the peak must grow
            pa, pb = peak_memory(model, plan), peak_memory(bigger, plan)
            if not le(pa.total_bytes, pb.total_bytes):
                bad("monotone: more layers (peak, 001 split)", f"{model.name} {plan.label()} {model.layers} -> "
                    f"{bigger.layers} layers: {gib(pa.total_bytes)} > {gib(pb.total_bytes)}")  # fmt: skip
            count("monotone: more layers (peak, 001 split)")


def check_sharding(model: ModelSpec, plan: Plan) -> None:
    """Twice a degree: the largest stage's states never more (the every-term sum's: an impl-hf
    peak's moment holds only some gradients)."""
    base = mem(model, plan, at_peak=False)
    if base is None:
        return
    top = max(states(m) for m in base)
    for dim in ("tp", "pp", "dp", "cp", "ep"):
        v = getattr(plan, dim)
        changes: dict[str, Any] = {dim: 2 * v}
        if dim == "dp":
            changes["global_batch"] = 2 * plan.batch  # the same accumulation
        if dim == "tp" and plan.sp and plan.seq(model) % (2 * v):
            continue
        p = _vary(model, plan, **changes)
        if p is None or (got := mem(model, p, at_peak=False)) is None:
            continue
        after = max(states(m) for m in got)
        if not le(after, top):
            bad(f"sharding: {dim} x2 never more states", f"{model.name} {plan.label()} -> {p.label()}: "
                f"{gib(top)} -> {gib(after)}")  # fmt: skip
        count(f"sharding: {dim} x2")


def _zero_must_shrink(model: ModelSpec, plan: Plan, stage_layers_: list[int]) -> bool:
    """Where ZeRO s+1 must need no more in total: the stage shards (1 - 1/n) of its layers'
    gradients (s 2) or weights (s 3) over n = dp x cp ranks and adds one layer's gradients
    (ZeRO-2's bucket) or two layers' weights (ZeRO-3's gathered current and prefetched layer):
    with 4 or more layers a stage and n >= 2 the saving is at least 2 layers' (n = 2: 4 x 1/2).
    Narrowed out: fewer than 4 layers on some stage (ZeRO-3 at dp 2 with 1-3 layers a stage
    does need more: two gathered layers beside half of 2-3 sharded ones), expert parallelism
    (the experts shard over dp x cp / ep ranks, 1 at ep = dp x cp, while the buffers hold the
    largest layer's), models with dense layers beside MoE ones (the buffers hold the largest
    layer, a stage may hold only smaller ones) and impl hf (its FSDP moments, another
    review's)."""
    return (min(stage_layers_) >= 4 and plan.ep == 1 and not model.dense_layers and plan.impl != "hf")


def check_zero(model: ModelSpec, plan: Plan) -> None:
    if plan.zero >= 3 or plan.dist_optimizer:
        return
    p = _vary(model, plan, zero=plan.zero + 1)
    if p is None:
        return
    a, b = mem(model, plan, at_peak=False), mem(model, p, at_peak=False)  # the states as sharded, not a moment's
    if a is None or b is None:
        return
    layers = stage_layers(model, plan)
    for x, y in zip(a, b, strict=True):
        if not le(states(y), states(x)):
            bad(f"zero {plan.zero}->{p.zero}: states never more", f"{model.name} {plan.label()} stage {x.stage}: "
                f"{gib(states(x))} -> {gib(states(y))}")  # fmt: skip
        # zero 0 -> 1 adds no buffers (impl hf: DDP's bucket stays through zero 1)
        if plan.zero == 0 or _zero_must_shrink(model, plan, layers):
            if not le(y.total_bytes, x.total_bytes):
                bad(f"zero {plan.zero}->{p.zero}: total never more", f"{model.name} {plan.label()} stage {x.stage}"
                    f" ({x.phase} -> {y.phase}): {gib(x.total_bytes)} -> {gib(y.total_bytes)}")  # fmt: skip
        elif y.total_bytes > x.total_bytes * (1 + REL):
            why = ("<4 layers a stage" if min(layers) < 4 else "ep > 1" if plan.ep > 1 else
                   "dense + MoE layers" if model.dense_layers else "impl hf")  # fmt: skip
            narrowed[f"zero {plan.zero}->{p.zero} total more ({why})"] += 1
            if os.environ.get("MEMMETA_VERBOSE"):
                print(f"narrowed zero {plan.zero}->{p.zero} {model.name} {plan.label()} stage {x.stage} "
                      f"({x.phase} -> {y.phase}): {gib(x.total_bytes)} -> {gib(y.total_bytes)}")
    count(f"zero {plan.zero}->{p.zero}")


def check_recompute(model: ModelSpec, plan: Plan) -> None:
    if plan.recompute != "none":
        return
    none = mem(model, plan, at_peak=False)
    if none is None:
        return
    for rc in ("selective", "full"):
        p = _vary(model, plan, recompute=rc)
        if p is None or (got := mem(model, p, at_peak=False)) is None:
            continue
        layers = stage_layers(model, plan)
        for x, y in zip(none, got, strict=True):
            # impl hf, full: a checkpointed layer keeps its input and the backward re-runs one
            # layer whole (the census's none layer, input included), so a stage whose layers x
            # micro-batches in flight are 1 keeps one input more than without: narrowed out
            if plan.impl == "hf" and rc == "full" and layers[x.stage] * mm.in_flight_microbatches(plan, x.stage) < 2:
                narrowed["hf recompute full: one layer in flight keeps its input more"] += 1
                continue
            if not le(y.activations_bytes, x.activations_bytes):
                bad(f"recompute {rc} never more activations ({plan.impl})", f"{model.name} {plan.label()} stage "
                    f"{x.stage}: {gib(x.activations_bytes)} -> {gib(y.activations_bytes)}")  # fmt: skip
        count(f"recompute {rc} <= none ({'hf, every-term' if plan.impl == 'hf' else 'fused'})")
        if plan.impl == "hf":  # the peak's moment can change: reported, not a violation
            a, b = peak_memory(model, plan), peak_memory(model, p)
            if b.total_bytes > a.total_bytes * (1 + REL):
                narrowed[f"hf recompute {rc} peak more than none's (phase {a.phase} -> {b.phase})"] += 1


def check_cp(model: ModelSpec, plan: Plan) -> None:
    if plan.cp == 1:
        if cp_transient_bytes(model, plan) or cp_kept_bytes(model, plan):
            bad("cp 1 adds no CP buffers", f"{model.name} {plan.label()}")
        base = mem(model, plan)
        for cc in ("p2p", "all_gather", "a2a"):
            same = replace(plan, cp_comm=cc)
            if valid(model, same) and mem(model, same) != base:
                bad("cp 1: every cp_comm the same plan", f"{model.name} {plan.label()} {cc}")
        count("cp 1: no CP buffers, cp_comm moot")
        return
    for cc in ("p2p", "all_gather", "a2a"):
        p = _vary(model, plan, cp_comm=cc)
        if p is None:
            continue
        q = _vary(model, p, seq_len=2 * p.seq(model))
        if q is None:
            continue
        ta, tb = cp_transient_bytes(model, p), cp_transient_bytes(model, q)
        ka, kb = cp_kept_bytes(model, p), cp_kept_bytes(model, q)
        if not (le(ta, tb) and le(ka, kb)) or ta <= 0:
            bad(f"cp {cc}: CP bytes grow with the sequence", f"{model.name} {p.label()}: transient {ta} -> {tb}, "
                f"kept {ka} -> {kb}")  # fmt: skip
        _each_stage_le(f"cp {cc}: memory grows with the sequence", model, p, q)


def check_predict(model: ModelSpec, plan: Plan, sysname: str) -> None:
    """predict's fits_in_memory / limit against fits() with limits either side of the peak."""
    sysspec = get_system(sysname)
    cap = get_device(sysspec.device).memory_bytes
    pk = peak_memory(model, plan).total_bytes
    heads = {0, math.ceil(0.1 * cap)}
    if pk < cap:  # headrooms leaving the peak just inside, at and just outside the limit
        room = cap - pk
        heads |= {max(math.floor(room) + d, 0) for d in (-1, 0, 1)} | {math.ceil(room)}
    for h in sorted(x for x in heads if x < cap):
        text = f"{h}B"
        try:
            r = predict_llm(model, plan, sysspec, simulate=False, memory_headroom_bytes=h)
        except TrainsimError:  # a plan the system cannot place (not whole nodes)
            return
        ok, at = fits(model, plan, r.memory_limit_bytes)
        d = r.to_dict()
        if r.fits_in_memory != ok or at != r.peak_memory:
            bad("predict fits_in_memory == fits()", f"{model.name} {plan.label()} {sysname} headroom {text}: "
                f"{r.fits_in_memory} vs {ok}")  # fmt: skip
        if r.memory_limit_bytes != math.floor(cap - h) or not isinstance(r.memory_limit_bytes, int):
            bad("predict limit: whole bytes, capacity - headroom rounded down", f"{r.memory_limit_bytes!r} vs {cap - h!r}")
        check_json(_clean(d), f"{model.name} {plan.label()} headroom {text} (as printed)")
        hint = any(w.startswith("the plan needs") for w in r.warnings)
        if hint == r.fits_in_memory:
            bad("predict: the does-not-fit hint iff it does not fit", f"{model.name} {plan.label()} {text}")
        if r.fits_in_memory and plan.gpus < min_gpus_for_states(model, plan, r.memory_limit_bytes):
            bad("min_gpus_for_states is a lower bound", f"{model.name} {plan.label()}: fits on {plan.gpus}, bound "
                f"{min_gpus_for_states(model, plan, r.memory_limit_bytes)}")  # fmt: skip
        count("predict fits/limit/hint")


def check_json(d: dict[str, Any], where: str) -> None:
    m = d["memory"]
    if set(m) != MEMORY_KEYS:
        bad("JSON memory{} keys", f"{where}: {sorted(set(m) ^ MEMORY_KEYS)}")
        return
    parts = sum(m[k] for k in ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "buffers_bytes"))
    per = d["memory_per_stage_bytes"]
    if not (d["memory_per_gpu_bytes"] == m["total_bytes"] and close(parts, m["total_bytes"])
            and max(per) == m["total_bytes"] and per[m["stage"]] == m["total_bytes"]):  # fmt: skip
        bad("JSON memory_per_gpu_bytes == memory.total_bytes (the parts, the largest stage)", where)
    if d["fits_in_memory"] != (d["memory_per_gpu_bytes"] <= d["memory_limit_bytes"]):
        bad("JSON fits_in_memory == (memory_per_gpu_bytes <= memory_limit_bytes)", where)
    if m["phase"] not in HF_PHASES:
        bad("JSON memory.phase", f"{where}: {m['phase']}")
    count("JSON memory{}")


# --- search ----------------------------------------------------------------------------------

SEARCHES = [  # (model, system, gpus, global batch, seq, headroom)
    ("llama3-8b", "dgx-h100", 8, 32, 8192, None),
    ("llama3-8b", "dgx-h200", 8, 32, 8192, "5%"),
    ("gpt3-13b", "dgx-a100", 16, 64, 2048, "6GiB"),
    ("mixtral-8x7b", "dgx-h100", 16, 32, 4096, "2GiB"),
    ("qwen3-8b", "vista", 8, 16, 4096, "3%"),
]
# a peak with a third of a byte (gemma3's windowed share of cp_kept_bytes) on the H200's
# fractional capacity, the headroom leaving it inside the fraction: 2026-12-04 search ranked
# it while predict said it did not fit (search's limit kept the capacity's 0.4 byte)
EDGE = ("gemma3-12b", Plan(dp=4, cp=2, zero=1, global_batch=16, seq_len=4096, recompute="full"), "dgx-h200")


def check_search(case: tuple[str, str, int, int, int, str | None]) -> None:
    """One of :data:`SEARCHES`."""
    model_name, sysname, gpus, gb, seq, text = case
    model = get_model(model_name)
    sysspec = get_system(sysname)
    cap = get_device(sysspec.device).memory_bytes
    h = headroom_bytes(text, cap)
    space = PlanSpace(gpus=gpus, global_batch=gb, seq_len=seq, cp=(1, 2), cp_comm=("p2p", "all_gather", "a2a"),
                      micro_batch=(1, 2, 4), vpp=(2,))  # fmt: skip
    res = search_llm(model, sysspec, space, workers=1, progress=False, top_k=3, simulate_top=3,
                     memory_headroom_bytes=h)  # fmt: skip
    # predict's limit for the same GPU and headroom
    probe = Plan(**res["plans"][0]["plan_fields"]) if res["plans"] else None
    if probe is not None:
        r = predict_llm(model, probe, sysspec, simulate=False, memory_headroom_bytes=h)
        if r.memory_limit_bytes != res["memory_limit_bytes"]:
            bad("search memory_limit_bytes == predict's", f"{model_name} {sysname} headroom {text}: search "
                f"{res['memory_limit_bytes']!r}, predict {r.memory_limit_bytes!r}")  # fmt: skip
    # every plan the space holds: search's verdict (the infeasible count) is fits() under
    # predict's limit for the same GPU and headroom
    plimit = math.floor(cap - h)  # LLMPrediction.memory_limit_bytes
    refused = 0
    for plan, _why in space.plans(model, sysspec.gpus_per_node):
        if plan is None:
            continue
        try:
            refused += not fits(model, plan, plimit)[0]
        except TrainsimError:
            continue
    got = res["infeasible"].get(reason_key(MEMORY_REASON), 0)
    if got != refused:
        bad("search: out-of-memory count == plans fits() refuses", f"{model_name} {sysname} headroom {text}: "
            f"{got} vs {refused}")  # fmt: skip
    if res["enumerated"] != res["feasible"] + sum(res["infeasible"].values()):
        bad("search: enumerated = feasible + infeasible", f"{model_name} {sysname}")
    for p in res["plans"]:
        plan = Plan(**p["plan_fields"])
        r = predict_llm(model, plan, sysspec, simulate=False, memory_headroom_bytes=h)
        if not r.fits_in_memory or p["memory_per_gpu_bytes"] != r.peak_memory.total_bytes:
            bad("search ranks only plans predict fits", f"{model_name} {p['plan']} {sysname} headroom {text}")
        count("search ranked plans re-predicted")
    count("search spaces")
    print(f"search {model_name} {sysname} headroom {text}: {res['feasible']} fit, {got} out of memory "
          f"of {res['enumerated']}", flush=True)  # fmt: skip


def check_edge() -> None:
    """:data:`EDGE`: search and predict decide the same, and predict's JSON as printed agrees
    with itself, where the peak and the capacity are fractional and the limit falls between."""
    name, plan, sysname = EDGE
    model, sysspec = get_model(name), get_system(sysname)
    cap = get_device(sysspec.device).memory_bytes
    pk = peak_memory(model, plan).total_bytes
    if pk == math.floor(pk) or cap == math.floor(cap):
        bad("edge case still fractional", f"peak {pk!r}, capacity {cap!r} (pick another plan)")
        return
    for h in (math.floor(cap) - math.floor(pk) + d for d in (-1, 0, 1)):
        space = PlanSpace(gpus=plan.gpus, global_batch=plan.batch, seq_len=plan.seq_len, tp=(1,), pp=(1,), cp=(plan.cp,),
                          zero=(plan.zero,), micro_batch=(plan.micro_batch,), recompute=(plan.recompute,),
                          schedule=("1f1b",), sp=(False,))  # fmt: skip
        res = search_llm(model, sysspec, space, workers=1, progress=False, top_k=1, simulate_top=1,
                         memory_headroom_bytes=h)  # fmt: skip
        r = predict_llm(model, plan, sysspec, simulate=False, memory_headroom_bytes=h)
        if bool(res["feasible"]) != r.fits_in_memory or res["memory_limit_bytes"] != r.memory_limit_bytes:
            bad("edge: search and predict decide the same", f"{name} {plan.label()} {sysname} headroom {h}: search "
                f"feasible {res['feasible']} limit {res['memory_limit_bytes']!r}, predict fits {r.fits_in_memory} "
                f"limit {r.memory_limit_bytes!r} (peak {pk!r})")  # fmt: skip
        check_json(_clean(r.to_dict()), f"edge {name} {plan.label()} headroom {h} (as printed)")
        count("edge: fractional peak and capacity")


# --- CLI -------------------------------------------------------------------------------------


def _cli(args: list[str]) -> dict[str, Any] | None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    p = subprocess.run([sys.executable, "-m", "trainsim", *args, "--format", "json"], capture_output=True, text=True,
                       env=env, timeout=120, check=False)  # fmt: skip
    if p.returncode != 0:
        bad("cli runs", f"{' '.join(args)}: rc {p.returncode}: {p.stderr.strip()[-300:]}")
        return None
    return json.loads(p.stdout)


def check_cli() -> None:
    runs = [
        ["predict", "llama3-8b", "--gpus", "8", "--tp", "8", "--closed-form"],
        ["predict", "llama3-8b", "--gpus", "8", "--impl", "hf", "--recompute", "full", "--closed-form"],
        ["predict", "gpt3-13b", "--gpus", "16", "--tp", "2", "--pp", "4", "--cp", "2", "--cp-comm-type", "allgather",
         "--zero", "1", "--closed-form", "--memory-headroom", "10%"],
        ["predict", "llama3-70b", "--gpus", "8", "--closed-form", "--system", "dgx-h200", "--memory-headroom", "1GiB"],
    ]
    for args in runs:
        d = _cli(args)
        if d is None:
            continue
        check_json(d, " ".join(args))
        hint = any(str(w).startswith("the plan needs") for w in d["warnings"])
        if hint == d["fits_in_memory"]:
            bad("cli: the does-not-fit hint iff it does not fit", " ".join(args))
        count("cli predict")
    s = _cli(["search", "llama3-8b", "--gpus", "8", "--global-batch", "16", "--system", "dgx-h200",
              "--memory-headroom", "5%", "--top-k", "2", "--simulate-top", "2", "--workers", "1"])  # fmt: skip
    if s is not None and s["plans"]:
        f = s["plans"][0]["plan_fields"]
        p = _cli(["predict", "llama3-8b", "--gpus", "8", "--system", "dgx-h200", "--memory-headroom", "5%",
                  "--tp", str(f["tp"]), "--pp", str(f["pp"]), "--micro-batch", str(f["micro_batch"]),
                  "--global-batch", "16", "--zero", str(f["zero"]), "--recompute", f["recompute"], "--closed-form"]
                 + (["--sp"] if f["sp"] else []))  # fmt: skip
        if p is not None:
            if p["memory_limit_bytes"] != s["memory_limit_bytes"]:
                bad("cli: search memory_limit_bytes == predict's", f"{s['memory_limit_bytes']!r} vs "
                    f"{p['memory_limit_bytes']!r}")  # fmt: skip
            if not p["fits_in_memory"] or p["memory_per_gpu_bytes"] != s["plans"][0]["memory_per_gpu_bytes"]:
                bad("cli: search's best plan fits by predict", s["plans"][0]["plan"])
        count("cli search vs predict")


# --- main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plans", type=int, default=12, help="plans per model and impl")
    ap.add_argument("--no-search", action="store_true")
    ap.add_argument("--no-cli", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rng = random.Random(args.seed)
    sampled: Counter[str] = Counter()
    systems = ["dgx-h100", "dgx-h200", "dgx-a100", "azure-nd-a100-v4", "vista"]
    for spec in list_models():
        model = get_model(spec.name)
        for impl in ("fused", "neox", "hf"):
            n = args.plans if impl != "neox" else max(args.plans // 3, 1)
            for k in range(n):
                plan = sample_plan(model, impl, rng)
                if plan is None:
                    break
                sampled[impl] += 1
                try:
                    every = memory_per_gpu(model, plan, at_peak=False)
                    peak = memory_per_gpu(model, plan)
                    check_terms(model, plan, every, peak)
                    if impl == "hf":
                        check_hf_peak(model, plan, every, peak)
                    check_peak_fits(model, plan, peak)
                    check_monotone(model, plan)
                    check_sharding(model, plan)
                    check_zero(model, plan)
                    check_recompute(model, plan)
                    check_cp(model, plan)
                    if k < 2:
                        check_predict(model, plan, rng.choice(systems))
                except TrainsimError as e:
                    bad("plan runs", f"{model.name} {plan.label()}: {e}")
    print(f"sampled plans: {dict(sampled)} ({time.perf_counter() - t0:.1f} s)", flush=True)
    if not args.no_search:
        for s in SEARCHES:
            check_search(s)
        check_edge()
    if not args.no_cli:
        check_cli()
    print("\nrelations checked:")
    for what, n in sorted(counts.items()):
        print(f"  {what}: {n}")
    if narrowed:
        print("narrowed out (need not hold; not violations):")
        for what, n in sorted(narrowed.items()):
            print(f"  {what}: {n}")
    print(f"{len(violations)} violation(s) in {time.perf_counter() - t0:.1f} s")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
