"""Metamorphic / physics sweep over the 2026-12-03 LLM features: search --framework and
--trim-end-stages, multi-token prediction, compute/comm contention, the interleaved schedule's
end-part chunk, the busiest stage's breakdown, a 2x-FLOP/s device copy; context-parallel
schemes (--cp-comm-type) with and without sliding windows, --impl hf MoE paths, and the MoE
expert GEMM paths (--moe-grouped-gemm, SequentialMLP, hf grouped_mm / fallback / eager loop);
review 40 (check_today40): SequentialMLP's host loop, the ends' TP collectives (tp_end),
--overlap-param-gather, --impl hf memory, windows and soft-caps, the bench carry, invariance under
renaming and field order, predict's JSON against its table.

Each relation is checked over sampled plans of several models and systems; a violation prints
one line with the plan and the numbers. Exit 1 when any relation fails.

    python scripts/metamorphic_today.py [--plans N] [--seed S] [--no-search] [--only-moe] [--only-40]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import yaml

from trainsim.builders.contention import measured_factor
from trainsim.builders.llm import StageCost
from trainsim.builders.models import get_model
from trainsim.builders.plan import Plan
from trainsim.builders.predict import _breakdown, overlaps_comm, predict_llm
from trainsim.builders.spec import ModelSpec
from trainsim.errors import TrainsimError
from trainsim.hardware import get_system
from trainsim.search.frameworks import framework_plan
from trainsim.search.llm import search_llm
from trainsim.search.space import PlanSpace

DATA = Path(__file__).resolve().parents[1] / "src/trainsim/hardware/data"
REL = 1e-9
CASES = [  # model, system, gpus, global batch
    ("gpt3-1.3b", "dgx-a100", 16, 64),
    ("llama2-7b", "dgx-h100", 32, 128),
    ("mixtral-8x7b", "dgx-h100", 64, 128),
    ("qwen3-30b-a3b", "dgx-h100", 32, 128),
    ("deepseek-v3", "dgx-h100", 256, 512),
]
violations: list[str] = []
counts: dict[str, int] = {}


def count(what: str) -> None:
    counts[what] = counts.get(what, 0) + 1


def bad(relation: str, detail: str) -> None:
    violations.append(f"{relation}: {detail}")
    print(f"VIOLATION {relation}: {detail}", flush=True)


def close(a: float, b: float, rel: float = REL) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-30)


def sample_plans(model: str, gpus: int, batch: int, n: int, rng: random.Random) -> list[Plan]:
    spec = get_model(model)
    space = PlanSpace(gpus=gpus, global_batch=batch, micro_batch=(1, 2), vpp=(2, 3, 4),
                      schedule=("1f1b", "interleaved", "gpipe"), cp=(1, 2), trim_end_stages=2)  # fmt: skip
    plans = [p for p, _ in space.plans(spec, 8) if p is not None]
    more = []
    for p in rng.sample(plans, min(n, len(plans))):
        ogr = rng.random() < 0.5 and p.dp * p.cp > 1 and p.zero < 3
        more.append(replace(p, overlap_grad_reduce=True) if ogr else p)
    return more


def _doubled_system(tmp: Path, system: str) -> Path:
    sys_doc = yaml.safe_load((DATA / f"system_{system.replace('-', '_')}.yaml").read_text(encoding="utf-8"))
    dev_file = {"h100-sxm5-80gb": "device_h100_sxm5.yaml", "a100-sxm4-80gb": "device_a100_sxm4_80gb.yaml"}[sys_doc["device"]]
    dev = yaml.safe_load((DATA / dev_file).read_text(encoding="utf-8"))
    dev["peak_tflops"] = {k: 2 * v for k, v in dev["peak_tflops"].items()}
    if "measured_gemm_bf16_tflops" in dev:
        dev["measured_gemm_bf16_tflops"] *= 2
    dev["aliases"] = []
    (tmp / f"dev2x_{system}.yaml").write_text(yaml.safe_dump(dev), encoding="utf-8")
    sys_doc["device"] = str(tmp / f"dev2x_{system}.yaml")
    sys_doc["aliases"] = []
    path = tmp / f"sys2x_{system}.yaml"
    path.write_text(yaml.safe_dump(sys_doc), encoding="utf-8")
    return path


def check_plan(model: str, system: str, sys2x: Path, plan: Plan, *, simulate: bool, full: bool) -> None:
    tag = f"{model} {system} {plan.label()}"
    try:
        on = predict_llm(model, plan, system, simulate=simulate)
    except TrainsimError:
        return
    off = predict_llm(model, replace(plan, contention=False), system, simulate=simulate)
    t_on, t_off = on.iteration_time_s, off.iteration_time_s
    if t_on < t_off * (1 - REL):
        bad("contention on >= off", f"{tag} sim={simulate}: on {t_on:.6g} < off {t_off:.6g}")
    if not overlaps_comm(plan) and t_on != t_off:
        bad("contention equal when nothing overlaps", f"{tag} sim={simulate}: on {t_on!r} off {t_off!r}")
    for a, b in zip(on.stages, off.stages, strict=True):
        # (to rounding: DeepSeek-V3 tp2-pp16-dp4-cp2-zero2-mb2 rc-full's stages 13-15 forward came
        # out one ulp below without contention, 0.051126073676882586 vs ...59)
        if a.fwd_s < b.fwd_s * (1 - 1e-12) or a.bwd_s < b.bwd_s * (1 - 1e-12):
            bad("contention stage passes", f"{tag} stage {a.stage}: fwd {a.fwd_s}/{b.fwd_s} bwd {a.bwd_s}/{b.bwd_s}")
    # breakdown parts sum to the iteration; its stage is the one with the least bubble
    bd = on.breakdown
    parts = sum(v for k, v in bd.items() if k != "stage")
    if not close(parts, t_on, 1e-9):
        bad("breakdown sums to iteration", f"{tag} sim={simulate}: parts {parts:.9g} vs {t_on:.9g}")
    if any(v < -1e-12 * t_on for k, v in bd.items() if k != "stage"):
        bad("breakdown parts >= 0", f"{tag} sim={simulate}: {bd}")
    stages = on.stages
    if not simulate:
        stages = [replace(s, embedding_comm=None) for s in stages]
    # among the stages whose parts fit the iteration (001 Eq. 7 syncs the first stage alone)
    parts_of = [_breakdown(s, plan, t_on) for s in stages]
    fit = [b for b in parts_of if sum(v for k, v in b.items() if k != "stage") <= t_on * (1 + 1e-12)] or parts_of
    bubbles = [b["pipeline_bubble_s"] for b in parts_of]
    if bubbles[int(bd["stage"])] > min(b["pipeline_bubble_s"] for b in fit) + 1e-9 * t_on:
        bad("breakdown stage has least bubble", f"{tag} sim={simulate}: stage {bd['stage']} bubble "
            f"{bubbles[int(bd['stage'])]:.6g}, min {min(bubbles):.6g} at {bubbles.index(min(bubbles))}")  # fmt: skip
    # interleaved: chunks sum to the stage pass; the end part sits in one chunk
    chunks = plan.vpp if plan.schedule == "interleaved" else 1
    for s in on.stages:
        f, b = s.chunk_seconds(chunks, plan.pp)
        if not (close(sum(f), s.fwd_s, 1e-12) and close(sum(b), s.bwd_s, 1e-12)):
            bad("chunks sum to the pass", f"{tag} stage {s.stage}: {sum(f)} vs {s.fwd_s}, {sum(b)} vs {s.bwd_s}")
        if min(f + b) < 0:
            bad("chunk times >= 0", f"{tag} stage {s.stage}: {f} {b}")
        if 0 < s.stage < plan.pp - 1 and (s.end_fwd_s or s.end_bwd_s):
            bad("middle stages hold no end part", f"{tag} stage {s.stage}: end {s.end_fwd_s} {s.end_bwd_s}")
        if s.end_fwd_s > s.fwd_s or s.end_bwd_s > s.bwd_s:
            bad("end part within the pass", f"{tag} stage {s.stage}")
    if t_on > measured_factor() * t_off * (1 + REL):
        bad("contention <= k x no contention", f"{tag} sim={simulate}: on {t_on:.6g} > k {measured_factor()} x off {t_off:.6g}")
    # a last stage of a middle stage's layers (and the head, MTP depths) reduces a superset of its
    # gradients, its layers' backward ending with the middle's: it exposes no less (contention off)
    # (dense 1F1B/GPipe plans: MoE and interleaved ones show near-ties, up to 2 % the other way at
    # 30-100 us, not investigated)
    if plan.overlap_grad_reduce and plan.zero < 3 and plan.pp >= 3 and plan.chunks == 1 and not on.model.num_experts:
        mid, last = off.stages[1], off.stages[-1]
        if mid.layers == last.layers:
            ex = [sum(c.seconds for c in st.dp_comm if c.provenance.endswith(";overlapped")) for st in (mid, last)]
            if ex[1] < ex[0] * (1 - 1e-9):
                bad("last stage exposes >= a middle stage of its layers", f"{tag}: last {ex[1]:.6g} < middle {ex[0]:.6g}")
            count("overlapped reduction, last vs middle stage")
    if simulate:
        m = plan.grad_accum
        busy = max(m * (s.fwd_s + s.bwd_s) + s.optimizer_s for s in on.stages)
        if t_on < busy * (1 - 1e-9):
            bad("iteration >= busiest stage", f"{tag}: {t_on:.6g} < {busy:.6g}")
    count("simulated" if simulate else "closed form")
    if full:
        count(f"IR simulation ({plan.schedule})")
        ir = predict_llm(model, plan, system, simulate=True, full_simulation=True)
        ev = on if simulate else predict_llm(model, plan, system, simulate=True)
        if not close(ir.iteration_time_s, ev.iteration_time_s):
            bad("IR simulation == evaluator", f"{tag}: IR {ir.iteration_time_s!r} evaluator {ev.iteration_time_s!r}")
    fast = predict_llm(model, plan, str(sys2x), simulate=simulate)
    if fast.iteration_time_s > t_on * (1 + 1e-9):
        bad("2x FLOP/s never slower", f"{tag} sim={simulate}: {fast.iteration_time_s:.6g} > {t_on:.6g}")


def check_mtp(rng: random.Random, n: int) -> None:
    cases = [("deepseek-v3", "dgx-h100", 256, 512), ("gpt3-1.3b", "dgx-a100", 16, 64)]
    for model, system, gpus, batch in cases:
        base = get_model(model)
        plans = sample_plans(model, gpus, batch, n, rng)
        for plan in plans:
            tag = f"{model} {system} {plan.label()}"
            prev = None
            for k in range(4):
                spec = replace(base, mtp_layers=k)
                try:
                    r = predict_llm(spec, plan, system, simulate=plan.grad_accum * plan.pp < 2000)
                except TrainsimError:
                    break
                if k == base.mtp_layers == 0 or (k == 0 and model == "gpt3-1.3b"):
                    ref = predict_llm(model, plan, system, simulate=plan.grad_accum * plan.pp < 2000)
                    if r.iteration_time_s != ref.iteration_time_s:
                        bad("mtp 0 == no MTP", f"{tag}: {r.iteration_time_s!r} vs {ref.iteration_time_s!r}")
                flops = sum(s.flops_fwd + s.flops_bwd for s in r.stages)
                row = (r.iteration_time_s, r.peak_memory.total_bytes, flops, r.memory, r.stages)
                if prev is not None:
                    for name, i in (("time", 0), ("memory", 1), ("flops", 2)):
                        if row[i] < prev[i] * (1 - 1e-12):
                            bad(f"mtp k+1 >= k ({name})", f"{tag} k={k}: {row[i]:.6g} < {prev[i]:.6g}")
                    for a, b in zip(row[4][:-1], prev[4][:-1], strict=True):
                        # Megatron's embedding copy on the last stage adds an all-reduce of the
                        # first stage's embedding gradients (pp > 1, untied): by design
                        dp = [c.seconds for c in a.dp_comm], [c.seconds for c in b.dp_comm]
                        if (a.fwd_s, a.bwd_s, a.params, a.optimizer_s, dp[0]) != (b.fwd_s, b.bwd_s, b.params, b.optimizer_s, dp[1]):
                            bad("mtp changes only the last stage", f"{tag} k={k}: stage {a.stage} changed")
                    for ma, mb in zip(row[3][:-1], prev[3][:-1], strict=True):
                        if ma.total_bytes != mb.total_bytes:
                            bad("mtp changes only the last stage (memory)", f"{tag} k={k}: {ma.total_bytes} vs {mb.total_bytes}")
                    last, plast = row[4][-1], prev[4][-1]
                    if not (last.fwd_s > plast.fwd_s and last.params > plast.params):
                        bad("mtp adds to the last stage", f"{tag} k={k}: fwd {last.fwd_s} vs {plast.fwd_s}")
                prev = row
                count("MTP depths")


LLAMA31_8B = {  # meta-llama/Llama-3.1-8B's config.json (the fields read)
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
    "hidden_act": "silu", "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}  # fmt: skip


def check_rope() -> None:
    """A RoPE-scaled config's default length is min(original context, max positions), and
    predicting it without a length equals predicting it at that length."""
    from trainsim.builders.models import hf_config_from_dict

    plan = Plan(tp=8, pp=1, dp=1, micro_batch=1, global_batch=8)
    for orig, top in ((8192, False), (4096, True), (262144, False), (131072, False)):
        doc = dict(LLAMA31_8B)
        if top:
            doc["rope_scaling"] = {"type": "longrope", "long_factor": [1.0] * 64, "short_factor": [1.0] * 64}
            doc["original_max_position_embeddings"] = orig
        else:
            doc["rope_scaling"] = {**doc["rope_scaling"], "original_max_position_embeddings": orig}
        m = hf_config_from_dict(doc, Path("cfg/config.json"))
        want = min(orig, doc["max_position_embeddings"])
        if m.seq_len != want:
            bad("RoPE default seq", f"original {orig} (top-level {top}): seq_len {m.seq_len}, want {want}")
            continue
        a = predict_llm(m, plan, "dgx-h100", simulate=False).iteration_time_s
        b = predict_llm(m, replace(plan, seq_len=want), "dgx-h100", simulate=False).iteration_time_s
        if a != b:
            bad("RoPE default seq == explicit", f"original {orig}: {a!r} vs {b!r}")
        count("RoPE configs")


def check_cp_and_hf_moe() -> None:
    """Context-parallel schemes (Plan.cp_comm) and --impl hf MoE paths (Plan.hf_experts):
    at cp 1 every scheme is the ring-less plan; a longer sequence is never faster under any
    scheme; a bigger window (below seq) is never faster under any scheme; the grouped_mm path is
    never slower than the eager loop; more tokens never make an hf MoE step faster."""
    for model, system, tp in (("llama3-8b", "dgx-h100", 1), ("llama2-7b", "dgx-h100", 4), ("mistral-7b", "dgx-h100", 1)):
        base = Plan(tp=tp, dp=1, micro_batch=1, global_batch=2, seq_len=16384)
        ref = predict_llm(model, base, system, simulate=False).iteration_time_s
        for comm in ("all_gather", "a2a"):
            t = predict_llm(model, replace(base, cp_comm=comm), system, simulate=False).iteration_time_s
            if t != ref:
                bad("cp 1: every cp_comm is the same plan", f"{model} {comm}: {t!r} vs p2p {ref!r}")
            count("cp schemes")
        for cp in (2, 4):
            for comm in ("p2p", "all_gather", "a2a"):
                prev = 0.0
                for seq in (8192, 16384, 32768):
                    plan = replace(base, cp=cp, cp_comm=comm, seq_len=seq)
                    try:
                        t = predict_llm(model, plan, system, simulate=False).iteration_time_s
                    except TrainsimError:
                        continue
                    if t < prev * (1 - REL):
                        bad("longer seq never faster (cp)", f"{model} {plan.label()}: {t:.6g} < {prev:.6g}")
                    prev = t
                    count("cp schemes")
    for cp in (2, 4):
        for comm in ("p2p", "all_gather", "a2a"):
            prev = 0.0
            for w in (512, 2048, 8192, 16000):
                m = replace(get_model("mistral-7b"), sliding_window=w)
                t = predict_llm(m, Plan(tp=1, cp=cp, cp_comm=comm, dp=1, micro_batch=1, global_batch=2,
                                        seq_len=16384), "dgx-h100", simulate=False).iteration_time_s  # fmt: skip
                if t < prev * (1 - REL):
                    bad("bigger window never faster (cp)", f"cp {cp} {comm} window {w}: {t:.6g} < {prev:.6g}")
                prev = t
                count("cp windows")
    for model in ("mixtral-8x7b", "qwen3-30b-a3b"):
        prev = {"grouped_mm": 0.0, "eager": 0.0}
        for mb, seq in ((1, 1024), (1, 4096), (2, 4096)):
            t = {e: predict_llm(model, Plan(impl="hf", hf_experts=e, micro_batch=mb, global_batch=mb, seq_len=seq),
                                "dgx-h100", simulate=False).iteration_time_s for e in ("grouped_mm", "eager")}  # fmt: skip
            if t["grouped_mm"] > t["eager"] * (1 + REL):
                bad("hf grouped_mm <= eager loop", f"{model} mb {mb} seq {seq}: {t}")
            for e, v in t.items():
                if v < prev[e] * (1 - REL):
                    bad("hf MoE: more tokens never faster", f"{model} {e} mb {mb} seq {seq}: {v:.6g} < {prev[e]:.6g}")
                prev[e] = v
            count("hf MoE")


def check_expert_gemms(rng: random.Random, n: int, search: bool) -> None:
    """The MoE expert GEMM paths (LayerCoster.expert_gemms): --moe-grouped-gemm (TEGroupedMLP) is
    never slower than SequentialMLP for the same plan, layer by layer too (each projection within
    [per-expert GEMMs / 4 streams, per-expert GEMMs one after another], the activation no slower);
    with one local expert (ep = experts) both are the same plan; more tokens and a larger
    moe_imbalance never make either faster; hf grouped_mm (the CUTLASS kernel on H100 bf16, the
    fallback on an A100 or in fp32) is never slower than --hf-experts eager; a search with
    --moe-grouped-gemm is never worse than without and re-predicts bit for bit (its costs are
    kept by plan shape: the field must reach every key)."""
    from trainsim.builders.costs import LayerCoster, OpCoster
    from trainsim.hardware import get_device

    def t(model: str, plan: Plan, system: str = "dgx-h100", simulate: bool = False) -> float | None:
        try:
            return predict_llm(model, plan, system, simulate=simulate).iteration_time_s
        except TrainsimError:
            return None

    moe_cases = [c for c in CASES if get_model(c[0]).is_moe]
    for model, system, gpus, batch in moe_cases:
        for i, plan in enumerate(sample_plans(model, gpus, batch, n, rng)):
            if plan.impl == "hf":
                continue
            sim = i % 4 == 0 and plan.grad_accum * plan.pp <= 512
            a, b = t(model, plan, system, sim), t(model, replace(plan, moe_grouped_gemm=True), system, sim)
            if a is None or b is None:
                continue
            if b > a * (1 + REL):
                bad("--moe-grouped-gemm <= SequentialMLP", f"{model} {system} {plan.label()} sim={sim}: {b:.6g} > {a:.6g}")
            if get_model(model).num_experts == plan.ep and a != b:
                bad("one local expert: grouped == sequential", f"{model} {plan.label()}: {b!r} vs {a!r}")
            count("expert GEMMs: grouped vs sequential")
    # layer by layer, over shapes: tp, ep, micro-batch, sequence, imbalance, dtype
    dev = get_device("h100-sxm5-80gb")
    coster = OpCoster(dev)
    for model in ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"):
        m = get_model(model)
        for tp in (1, 2, 4):
            for ep in sorted({1, 2, 4, 8, m.num_experts}):
                for mb, seq, imb, dtype in ((1, 4096, 1.0, "bf16"), (2, 1001, 1.37, "bf16"), (1, 128, 1.0, "fp32"),
                                            (1, 16, 1.0, "bf16")):  # fmt: skip
                    plan = Plan(tp=tp, dp=max(ep, 1), ep=ep, sp=tp > 1, micro_batch=mb, global_batch=mb * ep,
                                seq_len=seq, moe_imbalance=imb if ep > 1 else 1.0, dtype=dtype)  # fmt: skip
                    try:
                        plan.validate(m, gpus=plan.gpus)
                    except TrainsimError:
                        continue
                    for phase in ("fwd", "bwd"):
                        seq_ops = {o.name: o for o in LayerCoster(m, plan, coster).mlp(phase)}
                        grp_ops = {o.name: o for o in LayerCoster(m, replace(plan, moe_grouped_gemm=True), coster).mlp(phase)}
                        tag = f"{model} {plan.label()} {phase}"
                        for name in ("mlp_up", "mlp_down", "activation"):
                            s_, g_ = seq_ops[name].seconds, grp_ops[name].seconds
                            if g_ > s_ * (1 + REL):
                                bad("grouped op <= sequential op", f"{tag} {name}: {g_:.6g} > {s_:.6g}")
                            if name != "activation" and g_ < s_ / 4 * (1 - REL):
                                bad("grouped GEMM >= per-expert GEMMs / 4 streams", f"{tag} {name}: {g_:.6g} < {s_ / 4:.6g}")
                            if name != "activation" and grp_ops[name].flops != seq_ops[name].flops:
                                bad("grouped GEMM keeps the FLOPs", f"{tag} {name}")
                            if m.num_experts == ep and g_ != s_:
                                bad("one local expert: op equal", f"{tag} {name}: {g_!r} vs {s_!r}")
                        count("expert GEMMs: layer ops")
    def never_faster(model: str, plans: list[Plan], relation: str, counter: str) -> None:
        """Each plan (a growing load) no faster than the one before it that could run."""
        prev = 0.0
        for plan in plans:
            v = t(model, plan)
            if v is None:
                continue
            if v < prev * (1 - REL):
                bad(relation, f"{model} {plan.label()}: {v:.6g} < {prev:.6g}")
            prev = v
            count(counter)

    # more tokens never faster; moe_imbalance never faster (both paths)
    for model, tp, ep in (("mixtral-8x7b", 2, 4), ("qwen3-30b-a3b", 1, 8), ("qwen3-30b-a3b", 2, 2), ("deepseek-v3", 1, 64)):
        pp = 4 if model == "deepseek-v3" else 1
        for ggemm in (False, True):
            base = Plan(tp=tp, pp=pp, dp=ep, ep=ep, sp=tp > 1, micro_batch=1, global_batch=ep * 4 * pp, seq_len=4096,
                        moe_grouped_gemm=ggemm)  # fmt: skip
            never_faster(model, [replace(base, micro_batch=mb, global_batch=mb * ep * 4 * pp, seq_len=seq)
                                 for mb, seq in ((1, 512), (1, 1024), (1, 2048), (2, 2048), (1, 4096), (2, 4096))],
                         "MoE: more tokens never faster", "expert GEMMs: tokens")  # fmt: skip
            never_faster(model, [replace(base, moe_imbalance=imb) for imb in (1.0, 1.1, 1.37, 2.0)],
                         "moe_imbalance never faster", "expert GEMMs: imbalance")
    # hf: grouped_mm (kernel or fallback) never slower than the eager loop, more tokens never faster
    for model in ("mixtral-8x7b", "qwen3-30b-a3b"):
        for system, dtype in (("dgx-h100", "bf16"), ("dgx-a100", "bf16"), ("dgx-h100", "fp32")):
            prev = {"grouped_mm": 0.0, "eager": 0.0}
            for mb, seq in ((1, 256), (1, 1024), (1, 4096), (2, 4096)):
                v = {e: t(model, Plan(impl="hf", hf_experts=e, micro_batch=mb, global_batch=mb, seq_len=seq, dtype=dtype),
                          system) for e in ("grouped_mm", "eager")}  # fmt: skip
                if None in v.values():
                    continue
                if v["grouped_mm"] > v["eager"] * (1 + REL):  # type: ignore[operator]
                    bad("hf grouped_mm <= eager loop", f"{model} {system} {dtype} mb {mb} seq {seq}: {v}")
                for e, x in v.items():
                    if x < prev[e] * (1 - REL):  # type: ignore[operator]
                        bad("hf MoE: more tokens never faster", f"{model} {system} {dtype} {e} mb {mb} seq {seq}")
                    prev[e] = x  # type: ignore[assignment]
                count("expert GEMMs: hf paths")
    if not search:
        return
    for model, system, gpus, batch in (("qwen3-30b-a3b", "dgx-h100", 16, 64), ("mixtral-8x7b", "dgx-h100", 32, 64)):
        kw = {"micro_batch": (1,), "pp": (1, 2)}
        off = _search(model, system, PlanSpace(gpus=gpus, global_batch=batch, **kw))
        on = _search(model, system, PlanSpace(gpus=gpus, global_batch=batch, moe_grouped_gemm=True, **kw))
        if best(on) > best(off) * (1 + 1e-9):
            bad("search --moe-grouped-gemm best <= without", f"{model}: {best(on):.6g} > {best(off):.6g}")
        t_off = {p["plan"]: p["iteration_time_s"] for p in off["plans"]}
        for p in on["plans"]:
            fields = p["plan_fields"]
            if not fields.get("moe_grouped_gemm"):
                bad("search --moe-grouped-gemm plans carry it", f"{model} {p['plan']}")
            base = Plan(**{**fields, "moe_grouped_gemm": False}).label()
            if base in t_off and p["iteration_time_s"] > t_off[base] * (1 + REL):
                bad("search: grouped plan <= its sequential twin", f"{model} {p['plan']}: {p['iteration_time_s']:.6g} > {t_off[base]:.6g}")
        for p in on["plans"][:4] + off["plans"][:2]:
            r = predict_llm(model, Plan(**p["plan_fields"]), system)
            if (r.iteration_time_s, r.closed_form_s["001_eq7"]) != (p["iteration_time_s"], p["screened_s"]):
                bad("search == predict (expert GEMMs)", f"{model} {p['plan']}: {p['iteration_time_s']!r} vs {r.iteration_time_s!r}")
            count("expert GEMMs: search plans re-predicted")
        print(f"search {model} --moe-grouped-gemm: {best(on):.6g} (SequentialMLP {best(off):.6g})", flush=True)


# --- review 40: the newest features' relations (check_today40) --------------------------------


def _ag(st: StageCost) -> float:
    """A stage's weight all-gathers, seconds (ZeRO-1/2's; with --overlap-param-gather the exposed part)."""
    return sum(c.seconds for c in st.dp_comm if c.kind == "all_gather")


def check_expert_host() -> None:
    """SequentialMLP's Python loop: more local experts per rank (lower ep, the same tokens per
    rank) never less host time; one local expert none; for the same plan SequentialMLP's host
    time >= TEGroupedMLP's C++ launches >= the CUTLASS grouped kernel's none (and the eager
    loop's, which the census holds); the hf grouped kernel keeps the fallback's FLOPs."""
    from trainsim.builders.costs import HOST, LayerCoster, OpCoster
    from trainsim.hardware import get_device

    coster = OpCoster(get_device("h100-sxm5-80gb"))
    for model in ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"):
        m = get_model(model)
        eps = [e for e in (256, 128, 64, 32, 16, 8, 4, 2, 1) if e <= m.num_experts and m.num_experts % e == 0]
        for phase in ("fwd", "bwd"):
            prev = {False: -1.0, True: -1.0}
            for ep in eps:  # fewer expert-parallel ranks: more local experts
                plan = Plan(tp=1, dp=ep, ep=ep, micro_batch=1, global_batch=ep, seq_len=2048)
                h = {g: LayerCoster(m, replace(plan, moe_grouped_gemm=g), coster).expert_gemms_host_s(phase, HOST)
                     for g in (False, True)}  # fmt: skip
                tag = f"{model} ep {ep} ({m.num_experts // ep} local) {phase}"
                for g, v in h.items():
                    if v < prev[g] * (1 - REL):
                        bad("more local experts never less host time", f"{tag} grouped={g}: {v:.6g} < {prev[g]:.6g}")
                    prev[g] = v
                if ep == m.num_experts and any(h.values()):
                    bad("one local expert: no extra host time", f"{tag}: {h}")
                if h[True] > h[False] * (1 + REL):
                    bad("SequentialMLP host >= TEGroupedMLP host", f"{tag}: {h[False]:.6g} < {h[True]:.6g}")
                count("expert GEMMs: host")
        for dtype in ("bf16", "fp16"):  # fp16 takes grouped_mm's fallback on an H100
            hf = Plan(impl="hf", micro_batch=1, global_batch=1, seq_len=2048, dtype=dtype)
            if model == "deepseek-v3":
                continue
            lc = LayerCoster(m, hf, coster)
            seq_mlp = LayerCoster(m, Plan(micro_batch=1, global_batch=1, seq_len=2048), coster)  # the same local experts
            for ph in ("fwd", "bwd"):
                hs, how = lc.expert_gemms_host_s(ph, HOST), lc.expert_gemms()
                if (how == "grouped" and hs) or (how == "fallback" and not 0 < hs <= seq_mlp.expert_gemms_host_s(ph, HOST)):
                    bad("hf grouped_mm host: none (kernel), C++ launches <= SequentialMLP's loop (fallback)", f"{model} {dtype} {how}: {hs}")
            fl = {o.name: o.flops for o in lc.mlp("fwd") if o.name.startswith("mlp_")}
            fl_loop = {o.name: o.flops for o in LayerCoster(m, replace(hf, hf_experts="eager"), coster).mlp("fwd")
                       if o.name.startswith("mlp_")}  # fmt: skip
            if fl != fl_loop:
                bad("hf expert GEMM paths keep the FLOPs", f"{model} {dtype}: {fl} vs {fl_loop}")
            count("expert GEMMs: host")


def check_tp_end() -> None:
    """The ends' TP collectives (PlanComm.tp_end): none at tp 1; vocabulary-parallel, so the same
    for a larger vocabulary (they move [b, s, d] and fp32 [b, s]); never fewer seconds for more
    tokens; the end stages' TP share no less than a middle stage's of the same layers (contention
    off), the last stage's no less with more MTP depths; at tp 1 every stage's TP share is 0."""
    from trainsim.builders.llm_comm import PlanComm

    for model, system in (("gpt3-1.3b", "dgx-a100"), ("llama2-7b", "dgx-h100"), ("mixtral-8x7b", "dgx-h100")):
        m = get_model(model)
        sysm = get_system(system)
        for tp in (1, 2, 8):
            for sp in (False, True) if tp > 1 else (False,):
                base = Plan(tp=tp, pp=4, dp=1, sp=sp, micro_batch=1, global_batch=8, seq_len=2048, contention=False)

                def total(mm: object, plan: Plan, sysm: object = sysm) -> float:
                    pc = PlanComm(mm, plan, sysm)  # type: ignore[arg-type]
                    return sum(c.seconds for part in ("embedding", "head") for ph in ("fwd", "bwd") for c in pc.tp_end(part, ph))

                tag = f"{model} tp {tp} sp {sp}"
                t0 = total(m, base)
                if tp == 1 and t0 != 0:
                    bad("tp_end: none at tp 1", f"{tag}: {t0}")
                if total(replace(m, vocab=2 * m.vocab), base) != t0:
                    bad("tp_end: vocabulary-parallel, the same for a larger vocabulary", tag)
                prev = 0.0
                for mb, seq in ((1, 512), (1, 1024), (2, 1024), (1, 4096)):
                    v = total(m, replace(base, micro_batch=mb, global_batch=8 * mb, seq_len=seq))
                    if v < prev * (1 - REL):
                        bad("tp_end: more tokens never less", f"{tag} mb {mb} seq {seq}: {v:.6g} < {prev:.6g}")
                    prev = v
                r = predict_llm(model, base, system, simulate=False)
                share = [s.tp_comm_fwd_s + s.tp_comm_bwd_s + s.tp_comm_recompute_s for s in r.stages]
                if tp == 1 and any(share):
                    bad("tp 1: no TP share", f"{tag}: {share}")
                for end in (0, -1):
                    if r.stages[end].layers == r.stages[1].layers and share[end] < share[1] * (1 - 1e-9):
                        bad("end stage's TP share >= a middle stage's", f"{tag} stage {end}: {share[end]:.6g} < {share[1]:.6g}")
                if model == "gpt3-1.3b":
                    prev = -1.0
                    for k in range(3):
                        rk = predict_llm(replace(m, mtp_layers=k), base, system, simulate=False)
                        last = rk.stages[-1]
                        v = last.tp_comm_fwd_s + last.tp_comm_bwd_s + last.tp_comm_recompute_s
                        if v < prev * (1 - 1e-9) or (tp > 1 and k and v <= prev):
                            bad("MTP depth adds the ends' TP collectives", f"{tag} k {k}: {v:.6g} vs {prev:.6g}")
                        prev = v
                count("tp_end")


def check_overlap_param_gather(rng: random.Random, sys2x: dict[str, Path], n: int) -> None:
    """--overlap-param-gather on sampled ZeRO-1 + distributed optimizer + overlapped-reduction
    plans: never slower than the same plan without it (closed form, and simulated on some); each
    stage's exposed gathers no more than its bucketed ones; faster compute (the 2x-FLOP/s copy)
    never hides more of them; the breakdown sums to the iteration; every stage as stage_costs
    gives it alone (its shared computation of stages alike keyed by all it depends on)."""
    from trainsim.builders.llm import stage_costs

    cases = [("gpt3-1.3b", "dgx-a100", 16, 64), ("llama2-7b", "dgx-h100", 32, 128), ("mixtral-8x7b", "dgx-h100", 64, 128)]
    for model, system, gpus, batch in cases:
        spec, sysm = get_model(model), get_system(system)
        done = 0
        # middle stages alike; LLaMA-2 7B's interleaved one on 64 GPUs exposes some of stage 1's gathers
        fixed = [Plan(tp=2, pp=4, dp=2 * gpus // 8 if model == "llama2-7b" else gpus // 8, vpp=2, schedule="interleaved",
                      micro_batch=1, global_batch=64 if model == "llama2-7b" else batch),
                 Plan(tp=1, pp=4, dp=gpus // 4, micro_batch=1, global_batch=batch)]  # fmt: skip
        for plan in fixed + sample_plans(model, gpus, batch, 3 * n, rng):
            if plan.zero > 1 or plan.dp * plan.cp <= 1 or done >= n + len(fixed):
                continue
            base = replace(plan, zero=1, dist_optimizer=True, overlap_grad_reduce=True)
            opg = replace(base, overlap_param_gather=True)
            try:
                a = predict_llm(model, base, system, simulate=False)
            except TrainsimError:
                continue
            b = predict_llm(model, opg, system, simulate=False)
            done += 1
            tag = f"{model} {system} {opg.label()}"
            if b.iteration_time_s > a.iteration_time_s * (1 + REL):
                bad("--overlap-param-gather never slower", f"{tag}: {b.iteration_time_s:.6g} > {a.iteration_time_s:.6g}")
            for sa, sb in zip(a.stages, b.stages, strict=True):
                if _ag(sb) > _ag(sa) * (1 + REL):
                    bad("opg: exposed gathers <= bucketed", f"{tag} stage {sa.stage}: {_ag(sb):.6g} > {_ag(sa):.6g}")
            parts = sum(v for k, v in b.breakdown.items() if k != "stage")
            if not close(parts, b.iteration_time_s):
                bad("opg: breakdown sums to iteration", f"{tag}: {parts:.9g} vs {b.iteration_time_s:.9g}")
            fast = predict_llm(model, opg, str(sys2x[system]), simulate=False)
            for sf, sb in zip(fast.stages, b.stages, strict=True):
                if _ag(sf) < _ag(sb) * (1 - REL):
                    bad("opg: faster compute never hides more", f"{tag} stage {sb.stage}: 2x {_ag(sf):.6g} < {_ag(sb):.6g}")
            if opg.pp >= 3:
                for s in sorted({1, opg.pp - 2, rng.randrange(1, opg.pp - 1)}):
                    (alone,) = stage_costs(spec, opg, sysm, only=frozenset({s}))
                    listed = b.stages[s]
                    if (alone.fwd_s, alone.bwd_s, [c.seconds for c in alone.dp_comm]) != (
                            listed.fwd_s, listed.bwd_s, [c.seconds for c in listed.dp_comm]):
                        bad("stage costed alone == listed", f"{tag} stage {s}: gathers {_ag(alone):.6g} vs {_ag(listed):.6g}")
            if done % 4 == 1 and opg.grad_accum * opg.pp <= 512:
                ta, tb = (predict_llm(model, p, system).iteration_time_s for p in (base, opg))
                if tb > ta * (1 + REL):
                    bad("--overlap-param-gather never slower (simulated)", f"{tag}: {tb:.6g} > {ta:.6g}")
            count("overlap-param-gather")


def check_hf_memory() -> None:
    """--impl hf memory from the activation census: activations grow with the sequence and the
    micro-batch, never fall with more layers, full recompute (gradient checkpointing) keeps no
    more, fp32 no less than bf16; a sliding window: for windows up to the sequence the memory is
    the same (SDPA's [b, 1, s, s] mask whatever the window) and the time never falls as the window
    grows; a window beyond the sequence is no window (transformers skips the mask, kv_length <
    window); the window's mask calls never make the eager layer faster; Gemma 2's logit cap adds
    memory and time, its score cap time only with eager (non-flash) attention."""
    from trainsim.builders.costs import LayerCoster, OpCoster
    from trainsim.builders.memory import memory_per_gpu
    from trainsim.hardware import get_device

    def run(m: object, **kw: object) -> tuple[float, float]:
        r = predict_llm(m, Plan(impl="hf", **{"micro_batch": 1, "global_batch": 1, **kw}), "dgx-h100", simulate=False)  # type: ignore[arg-type]
        # the activation accounting (every term at once): the reported breakdown is of the step's
        # largest moment, which may hold none (the optimizer step)
        return r.iteration_time_s, max(x.activations_bytes for x in memory_per_gpu(r.model, r.plan, at_peak=False))

    for model in ("llama3-8b", "gemma2-9b", "gemma3-12b", "mixtral-8x7b", "qwen3-30b-a3b"):
        m = get_model(model)
        for rc in ("none", "full"):
            prev_seq = 0.0
            for seq in (512, 1024, 2048, 4096, 8192):
                a = run(m, seq_len=seq, recompute=rc)[1]
                a2 = run(m, seq_len=seq, recompute=rc, micro_batch=2, global_batch=2)[1]
                if not a > prev_seq or not a2 > a:
                    bad("hf activations grow with seq and micro-batch", f"{model} {rc} seq {seq}: {prev_seq:.6g} {a:.6g} {a2:.6g}")
                prev_seq = a
                count("hf memory")
        prev = 0.0
        for layers in (2, 3, 4, 8, 16):
            mm = replace(m, layers=layers, sliding_layers=min(m.sliding_layers, layers // 2) if m.sliding_layers else 0)
            a, full = run(mm, seq_len=4096)[1], run(mm, seq_len=4096, recompute="full")[1]
            if a < prev * (1 - REL):
                bad("hf activations never fall with more layers", f"{model} {layers} layers: {a:.6g} < {prev:.6g}")
            if full > a * (1 + REL):
                bad("hf: checkpointing keeps no more", f"{model} {layers} layers: {full:.6g} > {a:.6g}")
            prev = a
        if run(m, seq_len=2048, dtype="fp32")[1] < run(m, seq_len=2048)[1]:
            bad("hf: fp32 activations >= bf16", model)
        count("hf memory")
    coster = OpCoster(get_device("h100-sxm5-80gb"))
    for model in ("gemma2-9b", "gemma3-12b"):
        m0 = get_model(model)
        for att in ("flash", "unfused"):
            seq = 8192
            none = run(replace(m0, sliding_window=0), seq_len=seq, attention=att)
            prev_t, mem = 0.0, None
            for w in (256, 1024, 4096, 8191, 8192):
                t, a = run(replace(m0, sliding_window=w), seq_len=seq, attention=att)
                if t < prev_t * (1 - REL):
                    bad("hf: a larger window (<= seq) never faster", f"{model} {att} window {w}: {t:.6g} < {prev_t:.6g}")
                if mem is not None and a != mem:
                    bad("hf: window memory the same for every window <= seq", f"{model} {att} window {w}: {a} vs {mem}")
                if a < none[1]:
                    bad("hf: a window's mask keeps memory", f"{model} {att} window {w}: {a} < {none[1]}")
                prev_t, mem = t, a
                count("hf windows")
            if run(replace(m0, sliding_window=seq + 1), seq_len=seq, attention=att) != none:
                bad("hf: a window beyond the sequence is no window", f"{model} {att}")
        for seq, mb in ((512, 1), (1024, 1), (1024, 2), (4096, 1)):
            plan = Plan(impl="hf", micro_batch=mb, global_batch=mb, seq_len=seq)
            for phase in ("fwd", "bwd"):
                bare = LayerCoster(replace(m0, sliding_window=0), plan, coster).hf_eager("x", "layer", phase).seconds
                win = LayerCoster(replace(m0, sliding_window=seq // 2), plan, coster).hf_eager("x", "layer", phase).seconds
                if win < bare * (1 - REL):
                    bad("hf: a window's mask calls never make the layer faster", f"{model} seq {seq} mb {mb} {phase}: {win:.6g} < {bare:.6g}")
                count("hf windows")
    g2 = get_model("gemma2-9b")
    for att in ("flash", "unfused"):
        off = run(replace(g2, logit_softcap=0.0, attn_softcap=0.0), seq_len=4096, attention=att)
        logit = run(replace(g2, attn_softcap=0.0), seq_len=4096, attention=att)
        score = run(replace(g2, logit_softcap=0.0), seq_len=4096, attention=att)
        if not (logit[0] > off[0] and logit[1] > off[1]):
            bad("hf: the logit cap adds time and memory", f"{att}: {logit} vs {off}")
        if score[1] != off[1] or (score[0] > off[0]) != (att != "flash") or score[0] < off[0]:
            bad("hf: the score cap costs time under eager attention only", f"{att}: {score} vs {off}")
        count("hf softcaps")


def check_bench_carry() -> None:
    """The bench carry beyond the measured work (builders/bench_costs.carried_time): of two calls
    both carried, twice the rows never takes less (to the 0.5 % its docstring allows) nor more
    than twice the time (one call never slower than its two halves)."""
    from trainsim.builders.costs import OpCoster
    from trainsim.hardware import get_device

    c = OpCoster(get_device("h100-sxm5-80gb"))
    for op in ("linear1", "linear3", "linear4", "gelu", "layernorm", "res_add"):
        for phase in ("fwd", "bwd"):
            for dim, mp in ((4096, 1), (8192, 4), (16384, 8)):
                prev = None
                for b in (1, 2, 4, 8, 16, 32):
                    t, prov = c.time(op, phase, "bf16", mp=mp, b=b, l=4096, dim=dim)
                    carried = "beyond-measured-work" in prov
                    if prev is not None and carried and prev[1]:
                        if t < prev[0] * (1 - 5e-3) or t > 2 * prev[0] * (1 + 1e-9):
                            bad("bench carry: 2x rows in [1, 2] x time", f"{op} {phase} dim {dim} mp {mp} b {b}: {t:.6g} vs {prev[0]:.6g}")
                        count("bench carry pairs")
                    prev = (t, carried)


def check_invariance() -> None:
    """Predictions do not depend on what names nothing: a renamed model (no aliases), a plan
    rebuilt from its fields in another order, hf_experts None and its default grouped_mm."""
    import json

    cases = [("gemma2-9b", Plan(impl="hf", micro_batch=1, global_batch=2, seq_len=8192)),
             ("mixtral-8x7b", Plan(tp=2, pp=2, dp=4, ep=4, sp=True, micro_batch=1, global_batch=32, moe_grouped_gemm=True)),
             ("llama2-7b", Plan(tp=2, pp=4, dp=8, vpp=2, schedule="interleaved", global_batch=64, zero=1,
                                dist_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True)),
             ("qwen3-30b-a3b", Plan(impl="hf", micro_batch=1, global_batch=1, seq_len=2048))]  # fmt: skip
    for model, plan in cases:
        ref = predict_llm(model, plan, "dgx-h100")
        key = (ref.iteration_time_s, ref.peak_memory.total_bytes, ref.breakdown)
        renamed = replace(get_model(model), name=f"renamed-{model}", aliases=())
        fields = json.loads(json.dumps({k: getattr(plan, k) for k in reversed(Plan.__dataclass_fields__)}))
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
        others: list[tuple[str, ModelSpec | str, Plan]] = [("renamed model", renamed, plan),
                                                            ("fields reordered", model, Plan(**fields))]  # fmt: skip
        if plan.impl == "hf" and get_model(model).is_moe:
            others.append(("hf_experts grouped_mm == None", model, replace(plan, hf_experts="grouped_mm")))
        for what, m, p in others:
            r = predict_llm(m, p, "dgx-h100")
            if (r.iteration_time_s, r.peak_memory.total_bytes, r.breakdown) != key:
                bad(f"invariant: {what}", f"{model} {plan.label()}: {r.iteration_time_s!r} vs {ref.iteration_time_s!r}")
            count("invariance")
    # a stage costed alone (stage_costs only=) is the listed one, for a model with dense layers too
    from trainsim.builders.llm import stage_costs

    spec, sysm = get_model("deepseek-v3"), get_system("dgx-h100")
    plan = Plan(tp=2, pp=4, dp=8, ep=8, micro_batch=1, global_batch=64)
    listed = stage_costs(spec, plan, sysm)
    for only in ({0}, {1, 3}):
        try:
            alone = stage_costs(spec, plan, sysm, only=frozenset(only))
        except (TrainsimError, ValueError) as e:
            bad("stage costed alone (dense layers)", f"deepseek-v3 {plan.label()} {sorted(only)}: {e}")
            continue
        if [(a.fwd_s, a.bwd_s) for a in alone] != [(listed[i].fwd_s, listed[i].bwd_s) for i in sorted(only)]:
            bad("stage costed alone (dense layers)", f"deepseek-v3 {plan.label()} {sorted(only)}")
        count("invariance")


def check_json_table() -> None:
    """`trainsim predict --format json` is predict_llm's answer, and the table shows the same
    figures (iteration ms, breakdown ms, GiB to its rounding) for the newest options."""
    import json
    import os
    import re
    import subprocess

    env = {**os.environ, "COLUMNS": "200"}
    cases = [["qwen3-30b-a3b", "--tp", "1", "--dp", "8", "--ep", "8", "--global-batch", "16", "--moe-grouped-gemm"],
             ["llama2-7b", "--tp", "2", "--pp", "4", "--dp", "1", "--global-batch", "8", "--sp"],
             ["gemma2-9b", "--gpus", "1", "--impl", "hf", "--seq-len", "4096", "--global-batch", "1"],
             ["llama2-7b", "--tp", "2", "--pp", "2", "--dp", "2", "--global-batch", "16", "--zero", "1",
              "--dist-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]]  # fmt: skip
    for args in cases:
        cmd = [sys.executable, "-m", "trainsim", "predict", *args, "--system", "dgx-h100"]
        js = subprocess.run([*cmd, "--format", "json"], capture_output=True, env=env, check=False)
        tab = subprocess.run(cmd, capture_output=True, env=env, check=False)
        if js.returncode or tab.returncode:
            bad("predict runs", f"{' '.join(args)}: {js.stderr.decode()[-200:]} {tab.stderr.decode()[-200:]}")
            continue
        d = json.loads(js.stdout)
        text = tab.stdout.decode()
        rows = {"iteration time": d["iteration_time_s"] * 1e3}
        names = {"forward_s": "forward", "backward_s": "backward", "tp_communication_s": "tp communication",
                 "ep_communication_s": "ep communication", "exposed_dp_communication_s": "exposed dp communication",
                 "optimizer_s": "optimizer", "pipeline_bubble_s": "pipeline bubble"}  # fmt: skip
        rows.update({names[k]: v * 1e3 for k, v in d["breakdown"].items() if k in names})
        for label, ms in rows.items():
            m = re.search(rf"│\s+{re.escape(label)}\s+│\s+([\d,]+\.\d) ms", text)
            if m is None and ms == 0:
                continue  # a part the plan has none of (ep without experts) is left out of the table
            if m is None or abs(float(m.group(1).replace(",", "")) - ms) > 0.051:
                bad("JSON == table", f"{' '.join(args)} {label}: JSON {ms:.4f} ms, table {m.group(1) if m else None}")
        gib = d["memory_per_gpu_bytes"] / 2**30
        m = re.search(r"memory per GPU \(peak stage\)\s+│\s+([\d,]+\.\d) GiB", text)
        if m is None or abs(float(m.group(1).replace(",", "")) - gib) > 0.051:
            bad("JSON == table (memory)", f"{' '.join(args)}: JSON {gib:.3f} GiB, table {m.group(1) if m else None}")
        parts = sum(v for k, v in d["breakdown"].items() if k != "stage")
        if not close(parts, d["iteration_time_s"]):
            bad("JSON breakdown sums to iteration", f"{' '.join(args)}: {parts!r} vs {d['iteration_time_s']!r}")
        count("JSON vs table")


def check_today40(rng: random.Random, sys2x: dict[str, Path], n: int) -> None:
    check_expert_host()
    check_tp_end()
    check_overlap_param_gather(rng, sys2x, n)
    check_hf_memory()
    check_bench_carry()
    check_invariance()
    check_json_table()


def best(res: dict) -> float:
    return min((p["iteration_time_s"] for p in res["plans"]), default=float("inf"))


def _search(model: str, system: str, space: PlanSpace) -> dict:
    return search_llm(get_model(model), system, space, top_k=1000, workers=1, progress=False)


def check_search(full: bool) -> None:
    cases = [("gpt3-1.3b", "dgx-a100", 16, 64, {}), ("mixtral-8x7b", "dgx-h100", 64, 128, {"micro_batch": (1, 2)})]
    if full:
        cases.append(("deepseek-v3", "dgx-h100", 256, 1024, {"micro_batch": (1,)}))
    for model, system, gpus, batch, kw in cases:
        out: dict[str, float] = {}
        ranked: dict[str, dict[str, float]] = {}
        res_n: dict[str, int] = {}
        plans_of: dict[str, list[dict]] = {}
        for fw in ("any", "megatron", "deepspeed", "torchtitan"):
            res = _search(model, system, PlanSpace(gpus=gpus, global_batch=batch, framework=fw, **kw))
            out[fw] = best(res)
            ranked[fw] = {p["plan"]: p["iteration_time_s"] for p in res["plans"]}
            plans_of[fw] = res["plans"]
            res_n[fw] = res["feasible"]
            for p in res["plans"][:3]:  # search's time and screening are predict's, bit for bit
                r = predict_llm(model, Plan(**p["plan_fields"]), system)
                if (r.iteration_time_s, r.closed_form_s["001_eq7"], r.peak_memory.total_bytes) != (
                        p["iteration_time_s"], p["screened_s"], p["memory_per_gpu_bytes"]):
                    bad("search == predict", f"{model} {fw} {p['plan']}: {p['iteration_time_s']!r} vs {r.iteration_time_s!r}")
                count("search plans re-predicted")
            labels = [p["plan"] for p in res["plans"]]
            if len(labels) != len(set(labels)):
                bad("ranked plans distinct", f"{model} --framework {fw}: {len(labels) - len(set(labels))} repeated")
            for p in res["plans"]:
                plan = Plan(**p["plan_fields"])
                runs, why = framework_plan(plan, fw)
                if runs != plan:
                    bad("ranked plan passes its framework", f"{model} --framework {fw}: {p['plan']} ({why or 'changed'})")
        for fw in ("megatron", "deepspeed", "torchtitan"):
            # every plan a framework ranks is one of any's (Megatron's ZeRO-1 as its distributed optimizer)
            for p in plans_of[fw]:
                base = replace(Plan(**p["plan_fields"]), dist_optimizer=False).label()
                if p["plan"] in ranked["any"] and ranked["any"][p["plan"]] != p["iteration_time_s"]:
                    bad("same plan, same time across --framework", f"{model} {fw} {p['plan']}")
                elif p["plan"] not in ranked["any"] and base not in ranked["any"] and len(ranked["any"]) == res_n["any"]:
                    bad("--framework X plans within any's", f"{model} {fw} {p['plan']}")
            if out["any"] > out[fw] * (1 + 1e-9):
                bad("best(any) <= best(framework)", f"{model} {system} {gpus} gpus gb {batch}: any {out['any']:.6g} > {fw} {out[fw]:.6g}")
        off = best(_search(model, system, PlanSpace(gpus=gpus, global_batch=batch, contention=False, **kw)))
        if off > out["any"] * (1 + 1e-9):
            bad("search --no-contention best <= contention best", f"{model}: off {off:.6g} > on {out['any']:.6g}")
        print(f"search {model}: no-contention {off:.6g}, " + ", ".join(f"{k} {v:.6g}" for k, v in out.items()), flush=True)
    # trimming pays where pipelining wins: DeepSeek-V3 (61 layers, MTP) on 256 H100s under Megatron's rules
    trims = [("deepseek-v3", "dgx-h100", 256, 1024, {"micro_batch": (1,), "framework": "megatron"}),
             ("gpt3-1.3b", "dgx-a100", 16, 64, {"pp": (2,), "micro_batch": (1,)})]
    for model, system, gpus, batch, kw in trims:
        prev = None
        for n in range(5):
            res = _search(model, system, PlanSpace(gpus=gpus, global_batch=batch, trim_end_stages=n, **kw))
            b = best(res)
            labels = [p["plan"] for p in res["plans"]]
            if len(labels) != len(set(labels)):
                bad("ranked plans distinct", f"{model} --trim-end-stages {n}: {len(labels) - len(set(labels))} repeated")
            if prev is not None and b > prev * (1 + 1e-9):
                bad("trim N <= trim N-1", f"{model} {system} {gpus} gpus gb {batch}: trim {n} {b:.6g} > trim {n - 1} {prev:.6g}")
            print(f"search {model} {kw} trim {n}: {b:.6g}", flush=True)
            prev = b


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", type=int, default=50, help="sampled plans per case")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-search", action="store_true")
    ap.add_argument("--deepseek-search", action="store_true", help="also search DeepSeek-V3 on 256 H100s (slow)")
    ap.add_argument("--only-moe", action="store_true", help="only the MoE expert GEMM relations")
    ap.add_argument("--only-40", action="store_true", help="only review 40's relations (check_today40)")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    checked = 0
    if a.only_40:
        with tempfile.TemporaryDirectory() as td:
            check_today40(rng, {s: _doubled_system(Path(td), s) for s in ("dgx-a100", "dgx-h100")}, max(a.plans // 4, 4))
        print(f"({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}), {len(violations)} violations")
        return 1 if violations else 0
    if a.only_moe:
        check_expert_gemms(rng, max(a.plans // 2, 6), not a.no_search)
        print(f"({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}), {len(violations)} violations")
        return 1 if violations else 0
    with tempfile.TemporaryDirectory() as td:
        doubled: dict[str, Path] = {}
        for model, system, gpus, batch in CASES:
            sys2x = doubled[system] = _doubled_system(Path(td), system)
            get_system(str(sys2x))
            for i, plan in enumerate(sample_plans(model, gpus, batch, a.plans, rng)):
                sim = i % 3 == 0
                full = sim and (i % 9 == 0 or plan.schedule == "interleaved" or plan.first_stage_layers > 0)
                check_plan(model, system, sys2x, plan, simulate=sim, full=full and plan.grad_accum * plan.pp <= 512)
                checked += 1
            print(f"{model} {system}: {checked} plans so far, {len(violations)} violations", flush=True)
        if "dgx-a100" not in doubled:
            doubled["dgx-a100"] = _doubled_system(Path(td), "dgx-a100")
        check_today40(rng, doubled, max(a.plans // 4, 4))
        print(f"review 40 relations: {len(violations)} violations so far", flush=True)
    check_mtp(rng, max(a.plans // 6, 4))
    check_rope()
    check_cp_and_hf_moe()
    check_expert_gemms(rng, max(a.plans // 2, 6), not a.no_search)
    if not a.no_search:
        check_search(a.deepseek_search)
    print(f"{checked} plans ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}), {len(violations)} violations")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
