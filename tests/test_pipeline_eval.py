"""``evaluate_pipeline`` (the direct evaluation ``predict`` uses) against the IR simulator.

Both evaluate the program of ``build_workload``; the direct one builds no IR. They must agree
to 1e-9 on the iteration and on every stage's end, whatever the schedule, depth, micro-batch
count, ZeRO stage, tied embeddings or placement — otherwise ``predict`` would disagree with
``predict --timeline``.
"""

from __future__ import annotations

import itertools

import pytest

from trainsim.builders.costs import OpCoster
from trainsim.builders.llm import evaluate_pipeline, stage_costs
from trainsim.builders.models import get_model
from trainsim.builders.plan import Plan
from trainsim.builders.predict import _run, predict_llm
from trainsim.hardware import get_device, get_system


def _both(model: str, plan: Plan, system: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    spec, sys = get_model(model), get_system(system)
    stages = stage_costs(spec, plan, sys, OpCoster(get_device(sys.device)))
    fast = evaluate_pipeline(spec, plan, sys, stages)
    sim = _run(spec, plan, sys, stages)
    assert fast.predicted_step_s == pytest.approx(sim.predicted_step_s, rel=1e-9, abs=1e-15)
    return fast.stage_end_s, tuple(r.end_s for r in sim.ranks)


CASES = [
    # (schedule, vpp, pp, micro-batches per pipeline, zero, recompute, system)
    *[("1f1b", 1, pp, m, 1, "full", "dgx-a100") for pp, m in itertools.product((1, 2, 4, 8, 16), (1, 3, 8, 17))],
    *[("gpipe", 1, pp, m, 0, "none", "perlmutter") for pp, m in ((2, 1), (4, 4), (4, 9))],
    *[("interleaved", v, pp, m, 1, "selective", "dgx-a100") for v, pp, m in ((2, 2, 4), (2, 4, 8), (3, 4, 12))],
    *[("1f1b", 1, 4, 6, z, "full", "perlmutter") for z in (0, 2, 3)],
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_direct_evaluation_equals_the_simulator(
    case: tuple[str, int, int, int, int, str, str],
) -> None:
    sched, vpp, pp, m, zero, rc, system = case
    plan = Plan(tp=2, pp=pp, dp=2, micro_batch=1, global_batch=2 * m, schedule=sched, vpp=vpp,
                zero=zero, recompute=rc)  # fmt: skip
    fast, sim = _both("gpt3-1.3b", plan, system)
    assert fast == pytest.approx(sim, rel=1e-9, abs=1e-15)


def test_tied_embeddings_and_stage_boundaries_across_nodes() -> None:
    # GPT-2 ties its embedding (an all-reduce between the first and last stage); 8 stages of
    # tp 2 on 4-GPU Perlmutter nodes put every other boundary on a node edge
    plan = Plan(tp=2, pp=8, dp=1, micro_batch=2, global_batch=24)
    fast, sim = _both("gpt2-xl", plan, "perlmutter")
    assert fast == pytest.approx(sim, rel=1e-9)


def test_predict_uses_the_direct_evaluation_and_timeline_the_simulator() -> None:
    plan = Plan(tp=2, pp=4, dp=2, micro_batch=1, global_batch=12)
    direct = predict_llm("gpt3-1.3b", plan, "dgx-a100")
    full = predict_llm("gpt3-1.3b", plan, "dgx-a100", full_simulation=True)
    assert direct.sim is None and full.sim is not None
    assert direct.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-9)
    assert direct.breakdown == pytest.approx(full.breakdown, rel=1e-9)
