"""Metamorphic relations of `trainsim predict` found broken by review 35's property sweep."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainsim.builders.llm import stage_costs
from trainsim.builders.models import get_model
from trainsim.builders.plan import Plan
from trainsim.builders.predict import predict_llm
from trainsim.hardware import get_system

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
    first = r.stages[0]
    sync = sum(c.seconds for c in first.dp_comm)
    assert parts["exposed_dp_communication_s"] == pytest.approx(sync, rel=1e-12)
    # the simulation keeps the embedding all-reduce (it runs, after the DP reduction)
    sim = predict_llm("megatron-gpt-7.5b", plan, "perlmutter")
    sim_parts = {k: v for k, v in sim.breakdown.items() if k != "stage"}
    assert sum(sim_parts.values()) == pytest.approx(sim.iteration_time_s, rel=1e-12)
