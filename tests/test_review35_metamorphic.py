"""Metamorphic relations of `trainsim predict` found broken by review 35's property sweep."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from trainsim.builders.llm import stage_costs
from trainsim.builders.models import get_model
from trainsim.builders.plan import Plan
from trainsim.builders.predict import predict_llm
from trainsim.hardware import get_device, get_system

# --hidden-dropout adds unfused dropout passes: more GPU work, the same dispatch (HostModel's
# per-layer counts already hold HF's dropouts). Spread over them too, the layer's dispatch time
# was taken off the other operators, so these plans came out faster with the dropout
# (1.07287 -> 1.07237 s; 0.17593 -> 0.17549 s, its selective recompute 3.12 -> 2.63 ms).
_DROPOUT_CASES = [
    ("gpt3-1.3b", "perlmutter", Plan(tp=2, pp=4, dp=8, micro_batch=1, global_batch=64, seq_len=1024,
                                     recompute="full", attention="fused")),
    ("gpt2", "perlmutter", Plan(tp=2, dp=2, sp=True, zero=2, micro_batch=4, global_batch=32, dtype="fp16",
                                recompute="selective", overlap_grad_reduce=True)),
    ("megatron-gpt-18b", "dgx-h200", Plan(tp=4, dp=32, zero=2, micro_batch=1, global_batch=32, seq_len=1024,
                                          dtype="fp16", recompute="selective", wgrad_fusion=True)),
]  # fmt: skip


@pytest.mark.parametrize(("model", "system", "plan"), _DROPOUT_CASES)
def test_hidden_dropout_never_makes_an_iteration_faster(model: str, system: str, plan: Plan) -> None:
    without = predict_llm(model, plan, system)
    for p in (0.1, 0.5):
        with_dropout = predict_llm(model, replace(plan, hidden_dropout=p), system)
        assert with_dropout.iteration_time_s >= without.iteration_time_s
        for a, b in zip(without.stages, with_dropout.stages, strict=True):
            assert b.fwd_s >= a.fwd_s and b.bwd_s >= a.bwd_s


def test_attention_dropout_takes_no_share_of_the_layers_dispatch() -> None:
    """The attention dropout is dispatched within HostModel's per-layer counts (HF GPT-2's
    attention runs its dropout), as the hidden dropout is: spread over it too, the layer's
    dispatch was taken off the other operators and this context-parallel plan came out 0.04 %
    faster with the dropout (0.88211 -> 0.88176 s before session 35)."""
    plan = Plan(cp=4, pp=4, dp=8, micro_batch=1, global_batch=64, seq_len=4096, recompute="full",
                attention="fused", dtype="fp16")  # fmt: skip
    without = predict_llm("llama2-7b", plan, "vista")
    with_dropout = predict_llm("llama2-7b", replace(plan, attention_dropout=0.1), "vista")
    assert with_dropout.iteration_time_s >= without.iteration_time_s


def test_hidden_dropout_does_not_change_the_selective_recompute() -> None:
    """Selective recompute re-runs the attention core, which the residual-stream dropout is not
    part of: its time must not move."""
    model, system, plan = _DROPOUT_CASES[1]
    sys = get_system(system)
    spec = get_model(model)
    base = stage_costs(spec, plan, sys)[0].recompute_s
    assert base > 0
    assert stage_costs(spec, replace(plan, hidden_dropout=0.1), sys)[0].recompute_s == pytest.approx(base, rel=1e-12)


def test_closed_form_breakdown_sums_to_its_iteration() -> None:
    """`--closed-form`: 001 Eq. 7 syncs the first stage by its DP all-reduce alone, so the
    tied-embedding all-reduce is not in its breakdown either. It had been, and with the bubble
    (the remainder) floored at 0 the parts summed to 6.113 s against 5.955 s."""
    plan = Plan(pp=4, dp=16, zero=1, micro_batch=1, global_batch=128, attention="fused")
    r = predict_llm("megatron-gpt-7.5b", plan, "perlmutter", simulate=False)
    assert r.stages[0].embedding_comm is not None  # a tied embedding over stages: the case
    parts = {k: v for k, v in r.breakdown.items() if k != "stage"}
    assert sum(parts.values()) == pytest.approx(r.iteration_time_s, rel=1e-12)
    assert parts["pipeline_bubble_s"] > 0
    shown = r.stages[int(r.breakdown["stage"])]  # the busiest stage (it holds the embedding's tied copy)
    assert shown.embedding_comm is not None
    sync = sum(c.seconds for c in shown.dp_comm)
    assert parts["exposed_dp_communication_s"] == pytest.approx(sync, rel=1e-12)
    # the simulation keeps the embedding all-reduce (it runs, after the DP reduction)
    sim = predict_llm("megatron-gpt-7.5b", plan, "perlmutter")
    sim_parts = {k: v for k, v in sim.breakdown.items() if k != "stage"}
    assert sum(sim_parts.values()) == pytest.approx(sim.iteration_time_s, rel=1e-12)


# Ring attention (context parallelism): the K/V exchange overlaps the attention's blocks. Its
# unhidden part had been added after the pass, hidden by attention GPU time that the pass's CPU
# dispatch may already have hidden: an attention dropout made this plan faster (0.7937 ->
# 0.7829 s), and faster GPUs made the next one slower (2.674 -> 2.713 s at 2x -> 4x FLOP/s).
_CP_PLAN = Plan(pp=4, dp=32, cp=4, micro_batch=2, global_batch=1024, seq_len=1024, dtype="fp16",
                recompute="selective", attention="unfused")  # fmt: skip


def test_attention_dropout_never_makes_a_context_parallel_plan_faster() -> None:
    without = predict_llm("llama2-7b", _CP_PLAN, "vista")
    with_dropout = predict_llm("llama2-7b", replace(_CP_PLAN, attention_dropout=0.1), "vista")
    assert without.breakdown["cp_communication_s"] > 0  # the ring is not all hidden: the case
    assert with_dropout.iteration_time_s >= without.iteration_time_s
    for r in (without, with_dropout):
        parts = {k: v for k, v in r.breakdown.items() if k != "stage"}
        assert all(v >= 0 for v in parts.values())
        assert sum(parts.values()) == pytest.approx(r.iteration_time_s, rel=1e-9)


def _faster_vista(tmp_path: Path, flops: float) -> str:
    """A copy of vista whose GPU (renamed: no calibrated kernels, rooflines) has ``flops`` x
    the tensor-core peaks."""
    sys = get_system("vista")
    dev = get_device(sys.device).model_dump(mode="json", exclude_none=True)
    dev["peak_tflops"] = {k: v * flops for k, v in dev["peak_tflops"].items()}
    if "measured_gemm_bf16_tflops" in dev:
        dev["measured_gemm_bf16_tflops"] *= flops
    dev["name"], dev["aliases"] = "review35-gpu", []
    (tmp_path / f"dev{flops}.yaml").write_text(yaml.safe_dump(dev))
    doc = sys.model_dump(mode="json", exclude_none=True)
    doc["device"] = f"dev{flops}.yaml"
    path = tmp_path / f"sys{flops}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_faster_gpus_never_make_a_context_parallel_plan_slower(tmp_path: Path) -> None:
    plan = Plan(dp=1, cp=2, zero=1, micro_batch=1, global_batch=16, seq_len=4096, recompute="full")
    times = [predict_llm("llama3-8b", plan, _faster_vista(tmp_path, f)).iteration_time_s for f in (1.0, 2.0, 4.0, 8.0)]
    assert times == sorted(times, reverse=True), times


@pytest.mark.parametrize(("cp", "pp", "micro_batch"), [(2, 4, 2), (2, 4, 1), (4, 4, 1), (2, 1, 2)])
def test_attention_dropout_never_makes_a_ring_bound_backward_faster(cp: int, pp: int, micro_batch: int) -> None:
    """The backward's ring wait had sat on the attention core's last operator in the order the
    backward runs (the wait was placed before the list was reversed), so the dropout's backward,
    ahead of it, moved GPU time earlier: gpt3-1.3b on vista (cp 2, pp 4) was 0.24 % faster with
    an attention dropout (0.22127 -> 0.22074 s). Equal to rounding where the ring bounds it."""
    plan = Plan(cp=cp, pp=pp, dp=8, micro_batch=micro_batch, global_batch=64 * micro_batch, seq_len=1024,
                attention="fused", dtype="fp16")  # fmt: skip
    without = predict_llm("gpt3-1.3b", plan, "vista")
    with_dropout = predict_llm("gpt3-1.3b", replace(plan, attention_dropout=0.1), "vista")
    assert with_dropout.iteration_time_s >= without.iteration_time_s * (1 - 1e-12)
    for a, b in zip(without.stages, with_dropout.stages, strict=True):
        assert b.bwd_s >= a.bwd_s * (1 - 1e-12) and b.fwd_s >= a.fwd_s * (1 - 1e-12)


# Selective recompute re-runs the attention core with the forward's dispatch shares, and the
# attention dropout's is 0 (HostModel's per-layer counts hold it, as above). It had taken the
# counted share there, so a CPU-bound recomputation took one share more per layer with a
# dropout (gpt2 on perlmutter: 1.834 -> 2.444 ms, 3.3x what the dropout's kernels add).
_SELECTIVE_CASES = [
    ("gpt2", "perlmutter", Plan(dp=1, micro_batch=1, global_batch=8, seq_len=512, recompute="selective",
                                attention="fused", dtype="fp16")),
    ("gpt3-1.3b", "vista", Plan(cp=2, dp=4, micro_batch=1, global_batch=32, seq_len=1024, recompute="selective",
                                attention="fused", dtype="fp16")),
    ("llama2-7b", "dgx-a100", Plan(tp=8, micro_batch=1, global_batch=8, seq_len=1024, recompute="selective",
                                   attention="unfused")),
    ("llama3-8b", "vista", Plan(cp=4, pp=2, dp=2, micro_batch=1, global_batch=32, seq_len=8192,
                                recompute="selective", attention="fused")),
]  # fmt: skip


@pytest.mark.parametrize(("model", "system", "plan"), _SELECTIVE_CASES)
def test_attention_dropout_adds_no_dispatch_to_the_selective_recompute(
    model: str, system: str, plan: Plan
) -> None:
    """One operator more with no dispatch of its own lengthens a dispatch/GPU flow shop by at
    most its GPU time: the recomputation grows by no more than the dropout's forward kernels,
    and no plan gets faster with the dropout."""
    spec, sys = get_model(model), get_system(system)
    dropped = replace(plan, attention_dropout=0.1)
    for a, b in zip(stage_costs(spec, plan, sys), stage_costs(spec, dropped, sys), strict=True):
        drop = next(o for o in b.layer_ops if o.name == "attention_dropout" and o.phase == "fwd")
        assert a.recompute_s > 0
        kernels = b.layers * drop.seconds  # what the dropout's kernels add at most
        assert a.recompute_s * (1 - 1e-12) <= b.recompute_s <= a.recompute_s + kernels * (1 + 1e-9)
    with_dropout = predict_llm(spec, dropped, sys).iteration_time_s
    assert with_dropout >= predict_llm(spec, plan, sys).iteration_time_s * (1 - 1e-12)


def test_closed_form_breakdown_is_of_a_stage_that_fits_its_iteration() -> None:
    """The breakdown's busiest stage (2026-12-03) under --closed-form had been DeepSeek-V3's last
    stage, whose DP sync (MTP, one layer more) 001 Eq. 7 does not count: 22.93 s of parts in a
    21.70 s iteration (metamorphic review)."""
    plan = Plan(tp=1, pp=2, cp=2, dp=64, ep=4, micro_batch=2, global_batch=512, overlap_grad_reduce=True,
                first_stage_layers=30, last_stage_layers=31)  # fmt: skip
    r = predict_llm("deepseek-v3", plan, "dgx-h100", simulate=False)
    parts = {k: v for k, v in r.breakdown.items() if k != "stage"}
    assert sum(parts.values()) == pytest.approx(r.iteration_time_s, rel=1e-12)
    sim = predict_llm("deepseek-v3", plan, "dgx-h100")
    assert sum(v for k, v in sim.breakdown.items() if k != "stage") == pytest.approx(sim.iteration_time_s, rel=1e-12)
