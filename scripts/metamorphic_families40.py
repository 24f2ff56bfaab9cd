"""Metamorphic sweep over the 2026-12-04 HF families (gemma, granite, olmoe, cohere, glm, glm4,
phi, smollm3; hf41's dense olmo3, seed_oss, exaone4, ernie4_5) under the default Megatron-style
path (``impl fused``) and with parallelism: the new ModelSpec fields (``head_bias``,
``norm_bias``, ``nope_layers``, ``rope_fraction``, ``parallel_residual`` with one norm; hf41's
chunked attention, ``attention_chunk``, put on each rotary model without a window) against
their twins without them, parameter totals over
stages and ranks, the search's memory and screening, and predict's JSON contract
(shared/DESIGN.md, CLI contract).

Each relation runs over a grid of plans (tp 1/2/4/8, pp 1/2/4, dp, ZeRO 0-3, recompute,
sp, micro-batch, sequence); a violation prints one line with the plan and the numbers. Exit 1
when any relation fails.

Found on 2026-12-04 and fixed (tests/test_families40_meta.py): the selective recomputation's
dispatch was its operators' share of the layer's spread dispatch, so a layer with one norm fewer
(the parallel block) recomputed more slowly when CPU-bound; an overlapped reduction's bucket
count took a 50 MiB embedding shard at a rounding error above two buckets (Phi's output bias
then exposed less, a bias-free LayerNorm more). Left as a tolerance (PASS_SLACK): the pass
times' dependence on the layer's operator count through the even dispatch spread.

    python scripts/metamorphic_families40.py [--plans N] [--seed S] [--no-search] [--no-cli]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from trainsim.builders.llm import StageCost, stage_costs
from trainsim.builders.memory import MemoryBreakdown, Precision, memory_per_gpu, stage_layers
from trainsim.builders.models import read_hf_config
from trainsim.builders.plan import Plan
from trainsim.builders.predict import predict_llm
from trainsim.builders.spec import ModelSpec
from trainsim.errors import TrainsimError
from trainsim.hardware import get_device, get_system
from trainsim.search.llm import search_llm
from trainsim.search.space import PlanSpace

SYSTEM = "dgx-h100"
REL = 1e-12
PASS_SLACK = 1e-3  # see check_parallel_residual
# the published sizes (as tests/test_more_families.py builds them), read through the HF readers
CONFIGS: dict[str, dict[str, Any]] = {
    "gemma-2b": {"model_type": "gemma", "hidden_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 8,
                 "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 16384, "vocab_size": 256000,
                 "max_position_embeddings": 8192},
    "granite-3.0-8b": {"model_type": "granite", "hidden_size": 4096, "num_hidden_layers": 40,
                       "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 12800,
                       "vocab_size": 49155, "max_position_embeddings": 4096, "tie_word_embeddings": True,
                       "embedding_multiplier": 12.0, "logits_scaling": 16.0, "residual_multiplier": 0.22,
                       "attention_multiplier": 0.0078125},
    "olmoe-1b-7b": {"model_type": "olmoe", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 16,
                    "num_key_value_heads": 16, "intermediate_size": 1024, "vocab_size": 50304, "num_experts": 64,
                    "num_experts_per_tok": 8, "max_position_embeddings": 4096},
    "command-r": {"model_type": "cohere", "hidden_size": 8192, "num_hidden_layers": 40, "num_attention_heads": 64,
                  "num_key_value_heads": 64, "intermediate_size": 22528, "vocab_size": 256000,
                  "logit_scale": 0.0625, "max_position_embeddings": 8192},
    "glm-4-9b": {"model_type": "glm", "hidden_size": 4096, "num_hidden_layers": 40, "num_attention_heads": 32,
                 "num_key_value_heads": 2, "intermediate_size": 13696, "vocab_size": 151552,
                 "partial_rotary_factor": 0.5, "max_position_embeddings": 8192},
    "glm-4-9b-0414": {"model_type": "glm4", "hidden_size": 4096, "num_hidden_layers": 40, "num_attention_heads": 32,
                      "num_key_value_heads": 2, "intermediate_size": 13696, "vocab_size": 151552,
                      "partial_rotary_factor": 0.5, "max_position_embeddings": 8192},
    "phi-2": {"model_type": "phi", "hidden_size": 2560, "num_hidden_layers": 32, "num_attention_heads": 32,
              "intermediate_size": 10240, "vocab_size": 51200, "partial_rotary_factor": 0.4,
              "max_position_embeddings": 2048},
    "phi-1.5-tied": {"model_type": "phi", "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 32,
                     "intermediate_size": 8192, "vocab_size": 51200, "tie_word_embeddings": True,
                     "max_position_embeddings": 2048},
    "smollm3-3b": {"model_type": "smollm3", "hidden_size": 2048, "num_hidden_layers": 36, "num_attention_heads": 16,
                   "num_key_value_heads": 4, "intermediate_size": 11008, "vocab_size": 128256,
                   "max_position_embeddings": 65536},
    # the dense 2025 families (hf41; tests/test_families41.py): windows with NoPE global layers
    # (EXAONE 4), post-norms and q/k norms over the projections with windows (OLMo 3), q/k/v biases
    "olmo3-7b": {"model_type": "olmo3", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                 "num_key_value_heads": 32, "intermediate_size": 11008, "vocab_size": 100278,
                 "max_position_embeddings": 65536, "sliding_window": 4096},
    "seed-oss-36b": {"model_type": "seed_oss", "hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 80,
                     "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 27648, "vocab_size": 155136,
                     "max_position_embeddings": 524288},
    "exaone4-32b": {"model_type": "exaone4", "hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 40,
                    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 27392, "vocab_size": 102400,
                    "sliding_window": 4096, "sliding_window_pattern": "LLLG", "max_position_embeddings": 131072},
    "ernie4.5-0.3b": {"model_type": "ernie4_5", "hidden_size": 1024, "num_hidden_layers": 18, "num_attention_heads": 16,
                      "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 3072, "vocab_size": 103424},
}  # fmt: skip
CONTRACT_KEYS = ("iteration_time_s", "tokens_per_s", "mfu", "memory_per_gpu_bytes", "fits_in_memory", "breakdown",
                 "provenance")  # fmt: skip

violations: list[str] = []
counts: dict[str, int] = {}


def count(what: str, n: int = 1) -> None:
    counts[what] = counts.get(what, 0) + n


def bad(relation: str, detail: str) -> None:
    violations.append(f"{relation}: {detail}")
    print(f"VIOLATION {relation}: {detail}", flush=True)


def close(a: float, b: float, rel: float = 1e-9, absolute: float = 0.0) -> bool:
    return abs(a - b) <= max(rel * max(abs(a), abs(b)), absolute)


def read_models(tmp: Path) -> dict[str, ModelSpec]:
    out = {}
    for name, doc in CONFIGS.items():
        path = tmp / f"{name}.json"
        path.write_text(json.dumps(doc), encoding="utf-8")
        out[name] = replace(read_hf_config(path), name=name)
    return out


def plan_grid(model: ModelSpec, rng: random.Random, n: int) -> list[Plan]:
    """Up to ``n`` valid plans over tp 1/2/4/8, pp 1/2/4, dp 1/2/4, ZeRO 0-3, recompute, sp,
    micro-batch 1/2, two sequence lengths, ep for MoE; the corners always included."""
    seqs = (2048, 4096)
    plans, seen = [], set()
    corners: list[dict[str, Any]] = [
        {"tp": 1, "pp": 1, "dp": 1}, {"tp": 8, "pp": 4, "dp": 2, "sp": True, "zero": 3, "recompute": "full"},
        {"tp": 2, "pp": 2, "dp": 4, "zero": 1, "recompute": "selective", "micro_batch": 2}]  # fmt: skip
    tries = 0
    while len(plans) < n and tries < 40 * n:
        tries += 1
        if corners:
            kw = corners.pop(0)
        else:
            kw = {"tp": rng.choice((1, 2, 4, 8)), "pp": rng.choice((1, 2, 4)), "dp": rng.choice((1, 2, 4)),
                  "zero": rng.choice((0, 1, 2, 3)), "recompute": rng.choice(("none", "selective", "full")),
                  "sp": rng.random() < 0.5, "micro_batch": rng.choice((1, 2))}  # fmt: skip
        kw.setdefault("micro_batch", 1)
        kw["sp"] = bool(kw.get("sp")) and kw["tp"] > 1
        kw["seq_len"] = rng.choice(seqs)
        if model.is_moe:
            kw["ep"] = rng.choice([e for e in (1, 2, 4) if kw["dp"] % e == 0])
        accum = rng.choice((1, 4)) if kw["pp"] == 1 else 2 * kw["pp"]
        kw["global_batch"] = kw["micro_batch"] * kw["dp"] * accum
        kw["wgrad_fusion"] = rng.random() < 0.3
        kw["overlap_grad_reduce"] = rng.random() < 0.3 and kw["dp"] > 1 and kw["zero"] < 3
        if rng.random() < 0.15 and kw["seq_len"] == 4096 and not model.is_moe:
            kw["cp"] = 2
        if kw["pp"] > 1 and rng.random() < 0.3:
            kw["schedule"], kw["vpp"] = "interleaved", 2
        key = tuple(sorted(kw.items()))
        if key in seen:
            continue
        seen.add(key)
        plan = Plan(**kw)
        try:
            plan.validate(model)
        except TrainsimError:
            continue
        plans.append(plan)
    return plans


def busy(st: StageCost, plan: Plan) -> float:
    """A stage's own time in an iteration: its passes, the optimizer, its DP collectives (the
    exposed part where they overlap the last backward)."""
    return plan.grad_accum * (st.fwd_s + st.bwd_s) + st.optimizer_s + st.dp_comm_s


def state_bytes(plan: Plan) -> float:
    """Bytes one parameter of a dense tensor costs one GPU (weights, gradients, optimizer
    state) after ZeRO sharding over dp x cp (memory.Precision)."""
    prec = Precision.for_dtype(plan.dtype)
    if plan.optimizer == "sgd":
        prec = Precision(prec.weight_bytes, prec.grad_bytes, 0.0)
    p = prec.sharded(plan.zero, plan.dp * plan.cp)
    return p.weight_bytes + p.grad_bytes + p.optimizer_bytes


def costs(model: ModelSpec, plan: Plan, sysspec: Any) -> tuple[list[StageCost], list[MemoryBreakdown]]:
    return stage_costs(model, plan, sysspec), memory_per_gpu(model, plan)


# --- relations -------------------------------------------------------------------------------


def check_head_bias(model: ModelSpec, plan: Plan, sysspec: Any) -> None:
    """Phi's output bias: padded_vocab(tp)/tp more parameters on one GPU of the last stage, none
    elsewhere; its time only in the last stage's backward (the bias gradient's reduction), no
    forward anywhere, nothing on the other stages."""
    tag = f"{model.name} {plan.label()}"
    on, off = model, replace(model, head_bias=False)
    (s1, m1), (s0, m0) = costs(on, plan, sysspec), costs(off, plan, sysspec)
    want = model.padded_vocab(plan.tp) / plan.tp
    for a, b in zip(s1, s0, strict=True):
        last = a.stage == plan.pp - 1
        d = a.params - b.params
        if d != (want if last else 0):
            bad("head_bias: +padded_vocab/tp params on the last stage only", f"{tag} stage {a.stage}: +{d} (want {want if last else 0})")
        if a.fwd_s != b.fwd_s:
            bad("head_bias: no forward time", f"{tag} stage {a.stage}: fwd {a.fwd_s!r} vs {b.fwd_s!r}")
        if not last and (a.bwd_s, a.optimizer_s, a.dp_comm_s) != (b.bwd_s, b.optimizer_s, b.dp_comm_s):
            bad("head_bias: other stages unchanged", f"{tag} stage {a.stage}: bwd {a.bwd_s!r}/{b.bwd_s!r}")
        if last and not a.bwd_s > b.bwd_s:
            bad("head_bias: last stage's backward grows", f"{tag}: bwd {a.bwd_s!r} vs {b.bwd_s!r}")
        if last and not close(a.bwd_s - b.bwd_s, a.end_bwd_s - b.end_bwd_s, 1e-9, 1e-15):
            bad("head_bias: the growth is the end part's", f"{tag}: bwd +{a.bwd_s - b.bwd_s:.6g}, end +{a.end_bwd_s - b.end_bwd_s:.6g}")
        if a.layer_ops != b.layer_ops:
            bad("head_bias: layer operators unchanged", f"{tag} stage {a.stage}")
    for a, b in zip(m1, m0, strict=True):
        last = a.stage == plan.pp - 1
        if not last and a.total_bytes != b.total_bytes:
            bad("head_bias: other stages' memory unchanged", f"{tag} stage {a.stage}: {a.total_bytes} vs {b.total_bytes}")
        if last and a.activations_bytes != b.activations_bytes:
            bad("head_bias: activations unchanged", f"{tag}: {a.activations_bytes} vs {b.activations_bytes}")
        if last and not a.weights_bytes > b.weights_bytes:
            bad("head_bias: last stage's weights grow", f"{tag}: {a.weights_bytes} vs {b.weights_bytes}")
        if last:
            states = (a.weights_bytes + a.gradients_bytes + a.optimizer_bytes) - (b.weights_bytes + b.gradients_bytes + b.optimizer_bytes)
            if not close(states, want * state_bytes(plan), 1e-9):
                bad("head_bias: states grow by padded_vocab/tp params' bytes (ZeRO-sharded)",
                    f"{tag}: +{states:.6g} B, want {want * state_bytes(plan):.6g}")
    # (the exposed part of an overlapped reduction alone may shrink: a longer backward hides more;
    # the backward and what it leaves exposed together may not)
    last_on, last_off = s1[-1], s0[-1]
    if last_on.optimizer_s < last_off.optimizer_s or busy(last_on, plan) < busy(last_off, plan) * (1 - REL):
        bad("head_bias: last stage's optimizer and busy time never shrink", tag)
    count("head_bias plans")


def check_norm_bias(model: ModelSpec, plan: Plan, sysspec: Any) -> None:
    """Cohere's bias-free LayerNorm: strictly fewer parameters than the same model with biases,
    never more time or memory, on every stage."""
    tag = f"{model.name} {plan.label()}"
    (s0, m0), (s1, m1) = costs(model, plan, sysspec), costs(replace(model, norm_bias=True), plan, sysspec)
    if not model.params(plan.tp) < replace(model, norm_bias=True).params(plan.tp):
        bad("norm_bias: fewer params (spec)", tag)
    for a, b in zip(s0, s1, strict=True):
        n_norms = a.layers * model.layer_norms + (1 if a.stage == plan.pp - 1 else 0)
        if b.params - a.params != n_norms * model.hidden:
            bad("norm_bias: d params per norm", f"{tag} stage {a.stage}: -{b.params - a.params} (want {n_norms * model.hidden})")
        for f in ("fwd_s", "bwd_s", "optimizer_s"):
            if getattr(a, f) > getattr(b, f) * (1 + REL):
                bad(f"norm_bias False: never more time ({f})", f"{tag} stage {a.stage}: {getattr(a, f)!r} > {getattr(b, f)!r}")
        if busy(a, plan) > busy(b, plan) * (1 + REL):
            bad("norm_bias False: never more busy time", f"{tag} stage {a.stage}: {busy(a, plan)!r} > {busy(b, plan)!r}")
        if not plan.overlap_grad_reduce and a.dp_comm_s > b.dp_comm_s * (1 + REL):
            bad("norm_bias False: never more DP time (not overlapped)", f"{tag} stage {a.stage}")
    for a, b, st in zip(m0, m1, s0, strict=True):
        if a.total_bytes > b.total_bytes:
            bad("norm_bias False: never more memory", f"{tag} stage {a.stage}: {a.total_bytes} > {b.total_bytes}")
        n_norms = st.layers * model.layer_norms + (1 if a.stage == plan.pp - 1 else 0)
        states = (b.weights_bytes + b.gradients_bytes + b.optimizer_bytes) - (a.weights_bytes + a.gradients_bytes + a.optimizer_bytes)
        if not close(states, n_norms * model.hidden * state_bytes(plan), 1e-9):
            bad("norm_bias: states differ by the biases' bytes", f"{tag} stage {a.stage}: {states:.6g}")
        if a.activations_bytes != b.activations_bytes:
            bad("norm_bias: activations equal", f"{tag} stage {a.stage}")
    count("norm_bias plans")


def check_nope(model: ModelSpec, plan: Plan, sysspec: Any) -> None:
    """SmolLM3's NoPE layers: more of them never more time (the rotary op on fewer layers);
    parameters and memory equal."""
    tag = f"{model.name} {plan.label()}"
    ks = sorted({0, model.nope_layers, model.layers // 2, model.layers})
    prev = None
    for k in ks:
        s, m = costs(replace(model, nope_layers=k), plan, sysspec)
        rot = [sum(o.seconds for o in st.layer_ops if o.name == "rotary") for st in s]
        row = (s, m, rot)
        if prev is not None:
            ps, pm, prot = prev
            for a, b, ra, rb in zip(s, ps, rot, prot, strict=True):
                if ra > rb * (1 + REL):
                    bad("nope_layers more: never more rotary time", f"{tag} k={k} stage {a.stage}: {ra!r} > {rb!r}")
                if a.fwd_s > b.fwd_s * (1 + REL) or a.bwd_s > b.bwd_s * (1 + REL):
                    bad("nope_layers more: never more time", f"{tag} k={k} stage {a.stage}")
                if a.params != b.params:
                    bad("nope_layers: params equal", f"{tag} k={k} stage {a.stage}")
            for a, b in zip(m, pm, strict=True):
                if a.total_bytes != b.total_bytes:
                    bad("nope_layers: memory equal", f"{tag} k={k} stage {a.stage}: {a.total_bytes} vs {b.total_bytes}")
        if k == model.layers and any(rot):
            bad("nope_layers all: no rotary op", f"{tag}: {rot}")
        prev = row
    count("nope_layers plans")


def check_chunks(model: ModelSpec, plan: Plan, sysspec: Any) -> None:
    """Chunked attention (ModelSpec.attention_chunk, Llama 4's; hf41) on a model without a
    window: a chunk as long as the sequence is plain causal attention (the same stages); a
    shorter one never more time, attention time less when flash attention skips the other
    chunks, on more chunked layers never more; parameters and memory equal."""
    tag = f"{model.name} {plan.label()}"
    seq = plan.seq(model)
    s0, m0 = costs(model, plan, sysspec)
    same, _ = costs(replace(model, attention_chunk=seq), plan, sysspec)
    for a, b in zip(same, s0, strict=True):
        if (a.fwd_s, a.bwd_s, a.params) != (b.fwd_s, b.bwd_s, b.params):
            bad("attention_chunk >= seq: plain causal", f"{tag} stage {a.stage}: fwd {a.fwd_s!r}/{b.fwd_s!r}")
    prev = s0
    for layers in (model.layers // 2, 0):  # half the layers, then all (0)
        s, m = costs(replace(model, attention_chunk=seq // 4, chunked_layers=layers), plan, sysspec)
        for a, b in zip(s, prev, strict=True):
            if a.fwd_s > b.fwd_s * (1 + REL) or a.bwd_s > b.bwd_s * (1 + REL) or a.params != b.params:
                bad("attention_chunk: more chunked layers never more time", f"{tag} layers {layers} stage {a.stage}: "
                    f"fwd {a.fwd_s!r}/{b.fwd_s!r} bwd {a.bwd_s!r}/{b.bwd_s!r}")  # fmt: skip
        attn = [sum(o.seconds for o in st.layer_ops if o.category == "attention") for st in s]
        base = [sum(o.seconds for o in st.layer_ops if o.category == "attention") for st in s0]
        if plan.attention == "flash" and plan.cp == 1 and not all(x < y for x, y in zip(attn, base, strict=True)):
            bad("attention_chunk < seq: less attention with flash", f"{tag} layers {layers}: {attn} vs {base}")
        for a, b in zip(m, m0, strict=True):
            if a.total_bytes != b.total_bytes:
                bad("attention_chunk: memory equal", f"{tag} stage {a.stage}")
        prev = s
    count("attention_chunk plans")


def check_rope_fraction(model: ModelSpec, plan: Plan, sysspec: Any) -> None:
    """docs/llm.md: partial rotary is costed at the full width under the fused kernels: the
    stages and memory of any rope_fraction equal the whole-head model's."""
    tag = f"{model.name} {plan.label()}"
    s1, m1 = costs(replace(model, rope_fraction=1.0), plan, sysspec)
    for frac in (0.25, 0.5, 0.75):
        s, m = costs(replace(model, rope_fraction=frac), plan, sysspec)
        for a, b in zip(s, s1, strict=True):
            if (a.fwd_s, a.bwd_s, a.params, a.optimizer_s) != (b.fwd_s, b.bwd_s, b.params, b.optimizer_s):
                bad("rope_fraction: no effect under fused", f"{tag} frac={frac} stage {a.stage}: "
                    f"fwd {a.fwd_s!r}/{b.fwd_s!r} bwd {a.bwd_s!r}/{b.bwd_s!r}")  # fmt: skip
        for a, b in zip(m, m1, strict=True):
            if a.total_bytes != b.total_bytes:
                bad("rope_fraction: memory unchanged under fused", f"{tag} frac={frac} stage {a.stage}")
    count("rope_fraction plans")


def check_parallel_residual(model: ModelSpec, plan: Plan, sysspec: Any) -> None:
    """Cohere/Phi's parallel block on one norm against the same model sequential (two norms):
    the same parameters but one norm per layer, on every stage; the parallel block never
    slower (one norm fewer and, without SP, one forward all-reduce fewer: 001 Table IV)."""
    tag = f"{model.name} {plan.label()}"
    seq_model = replace(model, parallel_residual=False, layer_norms=2)
    if seq_model.params(plan.tp) - model.params(plan.tp) != model.layers * model.norm_params():
        bad("parallel_residual: spec params differ by one norm a layer", tag)
    (sp_, mp_), (ss, ms) = costs(model, plan, sysspec), costs(seq_model, plan, sysspec)
    for a, b in zip(sp_, ss, strict=True):
        if b.params - a.params != a.layers * model.norm_params():
            bad("parallel_residual: stage params differ by the dropped norms", f"{tag} stage {a.stage}: "
                f"{b.params - a.params} vs {a.layers * model.norm_params()}")  # fmt: skip
        gpu_a, gpu_b = (sum(o.seconds for o in x.layer_ops) for x in (a, b))
        if gpu_a > gpu_b * (1 + REL):
            bad("parallel_residual: never more kernel time", f"{tag} stage {a.stage}: {gpu_a!r} > {gpu_b!r}")
        # the passes: HostModel's fixed per-layer dispatch is spread evenly over the layer's
        # operators (llm._spread), so the one norm fewer gives each other operator a larger
        # share and can move a ring wait's overlap: within PASS_SLACK, not exactly (see the report)
        for f in ("fwd_s", "bwd_s"):
            if getattr(a, f) > getattr(b, f) * (1 + PASS_SLACK):
                bad(f"parallel_residual: never slower ({f})", f"{tag} stage {a.stage}: {getattr(a, f)!r} > {getattr(b, f)!r}")
            elif getattr(a, f) > getattr(b, f) * (1 + REL):
                count("parallel_residual: slower within PASS_SLACK (dispatch spread)")
    for a, b in zip(mp_, ms, strict=True):
        if a.total_bytes > b.total_bytes:
            bad("parallel_residual: never more memory", f"{tag} stage {a.stage}: {a.total_bytes} > {b.total_bytes}")
    count("parallel_residual plans")


def replicated_layer_params(m: ModelSpec) -> float:
    """One layer's parameters every TP rank holds whole (Megatron's layout): its norms, per-head
    q/k norms, the row-parallel output and down projections' biases, the router."""
    r = m.layer_norms * m.norm_params() + (m.qk_norm_params() if m.qk_norm == "head" else 0)
    r += 2 * m.hidden if m.bias else 0
    return r + (m.router_params() if m.is_moe else 0)


def check_totals(model: ModelSpec, plan: Plan, sysspec: Any) -> None:
    """All stages' parameters over their TP (and EP) ranks, the replicated tensors once and
    replicated KV heads (tp > kv heads) once, equal ModelSpec.params(tp) plus Megatron's copy of
    a tied embedding on the last stage when pp > 1."""
    tag = f"{model.name} {plan.label()}"
    t, layers = plan.tp, stage_layers(model, plan)
    stages = stage_costs(model, plan, sysspec)
    kv_rep = 0.0
    if model.kv_width_tp(t) * t > model.kv_width:  # replicated KV heads: counted once
        extra_width = model.kv_width_tp(t) * t - model.kv_width
        kv_rep = 2 * extra_width * model.hidden + (2 * extra_width if model.bias or model.qkv_bias else 0)
    total = 0.0
    for st, n in zip(stages, layers, strict=True):
        rep = n * replicated_layer_params(model)
        if st.stage == 0:
            rep += model.position_params()
        if st.stage == plan.pp - 1:
            rep += model.norm_params()
        per_gpu = st.params
        if model.is_moe:  # experts split over ep: the stage's GPU holds 1/ep of them
            experts = n * model.num_experts * (model.mlp_params(model.expert_ffn) / t) / plan.ep
            total += (per_gpu - experts - rep) * t + rep + experts * plan.ep * t - n * kv_rep
        else:
            total += (per_gpu - rep) * t + rep - n * kv_rep
    want = model.params(t) + (model.embedding_params(t) if model.tied_embeddings and plan.pp > 1 else 0)
    if not close(total, want, 1e-12):
        bad("params over stages and ranks == ModelSpec.params", f"{tag}: {total:.12g} vs {want:.12g} ({total - want:+.6g})")
    count("parameter totals")


def check_spec(model: ModelSpec) -> None:
    """ModelSpec's own counts: a dense model's active parameters are all of them (unpadded);
    the new fields' parameters where the docstrings put them."""
    if not model.is_moe and model.active_params() != model.params(padded=False):
        bad("dense: active == params (unpadded)", f"{model.name}: {model.active_params()} vs {model.params(padded=False)}")
    if model.head_bias and model.params(padded=False) - replace(model, head_bias=False).params(padded=False) != model.vocab:
        bad("head_bias: V more parameters (unpadded)", model.name)
    for tp in (1, 2, 4, 8):
        if model.head_bias and model.params(tp) - replace(model, head_bias=False).params(tp) != model.padded_vocab(tp):
            bad("head_bias: padded V more parameters", f"{model.name} tp {tp}")
    count("spec relations")


def check_plan(model: ModelSpec, plan: Plan, sysspec: Any) -> None:
    check_totals(model, plan, sysspec)
    if model.head_bias:
        check_head_bias(model, plan, sysspec)
    if model.norm == "layernorm" and not model.norm_bias:
        check_norm_bias(model, plan, sysspec)
    if model.nope_layers:
        check_nope(model, plan, sysspec)
    if (model.position == "rotary" and model.rope_fraction < 1) or model.name.startswith("phi"):
        check_rope_fraction(model, plan, sysspec)
    if model.parallel_residual and model.layer_norms == 1:
        check_parallel_residual(model, plan, sysspec)
    if model.position == "rotary" and not model.sliding_window:
        check_chunks(model, plan, sysspec)
    # predict: the closed form never above the memory the stages report, simulate >= busiest stage
    r = predict_llm(model, plan, sysspec, simulate=plan.grad_accum * plan.pp <= 64)
    if r.peak_memory.total_bytes != max(m.total_bytes for m in memory_per_gpu(model, plan)):
        bad("predict's peak memory == memory_per_gpu's", f"{model.name} {plan.label()}")
    count("predict")


def check_search(model: ModelSpec, sysspec: Any, gpus: int) -> None:
    """search_llm over a small space: no ranked plan exceeds the device's memory (the limit, and
    predict's own peak); the screening's closed form is predict's 001 Eq. 7, bit for bit; the
    ranking is by the simulated time."""
    cap = get_device(sysspec.device).memory_bytes
    space = PlanSpace(gpus=gpus, global_batch=4 * gpus, seq_len=4096, tp=(1, 2, 4, 8), pp=(1, 2, 4),
                      micro_batch=(1, 2), schedule=("1f1b",), zero=(0, 1, 3))  # fmt: skip
    res = search_llm(model, sysspec, space, workers=1, progress=False, top_k=6, simulate_top=6)
    times = [p["iteration_time_s"] for p in res["plans"]]
    if times != sorted(times):
        bad("search ranked by time", f"{model.name}: {times}")
    if res["feasible"] and not res["plans"]:
        bad("search returns plans when some fit", model.name)
    for p in res["plans"]:
        plan = Plan(**p["plan_fields"])
        r = predict_llm(model, plan, sysspec)
        mem = max(m.total_bytes for m in memory_per_gpu(model, plan))
        if p["memory_per_gpu_bytes"] > cap or mem > res["memory_limit_bytes"]:
            bad("search plan fits the device", f"{model.name} {p['plan']}: {p['memory_per_gpu_bytes'] / 2**30:.2f} GiB "
                f"(memory_per_gpu {mem / 2**30:.2f}) > {cap / 2**30:.2f}")  # fmt: skip
        if (r.iteration_time_s, r.closed_form_s["001_eq7"], r.peak_memory.total_bytes) != (
                p["iteration_time_s"], p["screened_s"], p["memory_per_gpu_bytes"]):  # fmt: skip
            bad("search screening == predict", f"{model.name} {p['plan']}: screened {p['screened_s']!r} vs "
                f"{r.closed_form_s['001_eq7']!r}, time {p['iteration_time_s']!r} vs {r.iteration_time_s!r}")  # fmt: skip
        count("search plans re-predicted")
    # the screening's closed form ranks the simulated plans nearly as the simulation does: the
    # screened best's simulated time within 10 % of the best simulated (001 Eq. 7 vs the schedule)
    if res["plans"]:
        by_screen = min(res["plans"], key=lambda p: p["screened_s"])
        if by_screen["iteration_time_s"] > 1.10 * times[0]:
            bad("search: screened best near the simulated best", f"{model.name}: {by_screen['plan']} "
                f"{by_screen['iteration_time_s']:.6g} vs {res['plans'][0]['plan']} {times[0]:.6g}")  # fmt: skip
        count("search screened vs simulated best")
    print(f"search {model.name}: {res['feasible']}/{res['evaluated']} fit, best "
          f"{times[0] if times else float('nan'):.6g} s", flush=True)  # fmt: skip


def check_cli(tmp: Path) -> None:
    """``python -m trainsim predict CONFIG.json --format json``: every contract key, for each family."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    for name in CONFIGS:
        path = tmp / f"{name}.json"
        cmd = [sys.executable, "-m", "trainsim", "predict", str(path), "--system", SYSTEM, "--gpus", "8",
               "--tp", "8" if "olmoe" not in name else "1", "--format", "json"]  # fmt: skip
        if "olmoe" in name:
            cmd += ["--ep", "8"]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, check=False)
        if p.returncode != 0:
            bad("cli predict runs", f"{name}: rc {p.returncode}: {p.stderr.strip()[-300:]}")
            continue
        try:
            doc = json.loads(p.stdout)
        except json.JSONDecodeError as e:
            bad("cli predict stdout is JSON", f"{name}: {e}")
            continue
        missing = [k for k in CONTRACT_KEYS if k not in doc]
        if missing:
            bad("cli predict JSON has the contract keys", f"{name}: missing {missing}")
        elif not (isinstance(doc["breakdown"], dict) and doc["iteration_time_s"] > 0):
            bad("cli predict JSON types", f"{name}: breakdown {type(doc['breakdown'])}, time {doc['iteration_time_s']}")
        count("cli predict JSON")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plans", type=int, default=40, help="plans per model")
    ap.add_argument("--seed", type=int, default=40)
    ap.add_argument("--no-search", action="store_true")
    ap.add_argument("--no-cli", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rng = random.Random(args.seed)
    sysspec = get_system(SYSTEM)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        models = read_models(tmp)
        for name, model in models.items():
            check_spec(model)
            for plan in plan_grid(model, rng, args.plans):
                try:
                    check_plan(model, plan, sysspec)
                except TrainsimError as e:
                    bad("plan runs", f"{name} {plan.label()}: {e}")
            print(f"{name}: done ({time.perf_counter() - t0:.1f} s)", flush=True)
        if not args.no_search:
            for name in ("phi-2", "command-r", "smollm3-3b", "olmoe-1b-7b"):
                check_search(models[name], sysspec, 16)
        if not args.no_cli:
            check_cli(tmp)
    print("\nrelations checked:")
    for k, v in sorted(counts.items()):
        print(f"  {k}: {v}")
    print(f"{len(violations)} violation(s) in {time.perf_counter() - t0:.1f} s")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
