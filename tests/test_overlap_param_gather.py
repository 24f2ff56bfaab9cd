"""Megatron-core's --overlap-param-gather (Plan.overlap_param_gather): the ZeRO-1/2 weight
all-gathers run bucket by bucket in the next iteration's first forward instead of after the
update (builders/llm.py: param_gather_delay_s, _overlap_param_gather)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from trainsim.builders.llm import megatron_bucket_params, param_gather_delay_s, stage_costs
from trainsim.builders.llm_comm import PlanComm
from trainsim.builders.memory import embedding_params_per_gpu
from trainsim.builders.models import get_model
from trainsim.builders.plan import Plan
from trainsim.builders.predict import overlaps_comm, predict_llm
from trainsim.cli.main import _register, app
from trainsim.errors import ConfigError
from trainsim.hardware import get_system
from trainsim.search.frameworks import framework_plan
from trainsim.search.llm import search_llm
from trainsim.search.space import PlanSpace

SYSTEM = "dgx-a100"
MEGATRON_Z1 = {"zero": 1, "dist_optimizer": True, "overlap_grad_reduce": True}


def _gathers(plan: Plan, model: str) -> list[float]:
    """Each stage's weight all-gathers, seconds."""
    stages = stage_costs(get_model(model), plan, get_system(SYSTEM))
    return [sum(c.seconds for c in st.dp_comm if c.kind == "all_gather") for st in stages]


# --- the delay ------------------------------------------------------------------------------


@pytest.mark.parametrize(("seconds", "uses", "chained", "start", "want"), [
    ([2.0, 1.0, 1.0], [0.0, 1.0, 5.0], True, 0.0, 2.0),  # the first bucket exposed, the rest keep up
    ([1.0, 3.0], [0.0, 1.0], True, 0.0, 3.0),  # F_1 = 1 + 3, used at 1: 3 late
    # the chain is stricter: bucket 2 waits for bucket 1's wait (at 3 + 1), not its end (at 2)
    ([1.0, 1.0, 2.0], [0.0, 3.0, 4.0], True, 0.0, 2.0),
    ([1.0, 1.0, 2.0], [0.0, 3.0, 4.0], False, 0.0, 1.0),
    ([3.0], [0.0], False, -2.0, 1.0),  # dispatched 2 s before the forward starts (interleaved's fill)
    ([1.0], [0.0], False, -2.0, 0.0),
])  # fmt: skip
def test_delay_is_the_chain_by_hand(seconds: list[float], uses: list[float], chained: bool, start: float,
                                    want: float) -> None:  # fmt: skip
    got = param_gather_delay_s(np.array(seconds), np.array(uses), chained=chained, start_s=start)
    assert got == pytest.approx(want)


def test_bucket_is_megatrons_default() -> None:
    assert megatron_bucket_params(Plan(dp=8)) == 40_000_000
    assert megatron_bucket_params(Plan(dp=32, cp=2)) == 64_000_000  # the dp_cp group's 1,000,000 each


def test_stage_delay_matches_a_hand_computation() -> None:
    """GPT-2 (124M parameters, 39.4M of them its embedding tables) at dp 8, Megatron's ZeRO-1: its
    40M-parameter buckets, cut from the end, give [0, 4.2M) and [4.2M, 44.2M) in forward order,
    both starting in the embedding, used at once; the forward (8 × 1,024 tokens) is long enough
    for the next buckets to keep up. Without contention the delay is their two gathers."""
    model, system = get_model("gpt2"), get_system(SYSTEM)
    plan = Plan(dp=8, micro_batch=8, global_batch=64, overlap_param_gather=True, contention=False, **MEGATRON_Z1)  # type: ignore[arg-type]
    (st,) = stage_costs(model, plan, system)
    # the whole gather, unbucketed (without --overlap-grad-reduce Megatron's buffer is one bucket)
    (ag,) = [c for c in stage_costs(model, replace(plan, overlap_param_gather=False, overlap_grad_reduce=False),
                                    system)[0].dp_comm if c.kind == "all_gather"]  # fmt: skip
    params = ag.bytes / 2
    emb = embedding_params_per_gpu(model, plan)
    first = params - 3 * 40e6  # the forward-first bucket: what is left once three full ones are cut
    assert 0 < first < emb and first + 40e6 > emb  # the premise: both start in the embedding
    comm = PlanComm(model, plan, system)

    def t(n: float) -> float:
        return comm.cost_placed(ag.name, ag.kind, ag.bytes * n / params, ag.group_size, ag.per_node).seconds

    (got,) = [c for c in st.dp_comm if c.kind == "all_gather"]
    assert got.name == "dp_all_gather_exposed" and got.provenance.endswith(";overlap_param_gather")
    assert got.bytes == ag.bytes
    assert got.seconds == pytest.approx(t(first) + t(40e6), rel=1e-9)
    # after the update (no --overlap-param-gather) the bucketed buffer gathers bucket after bucket
    (after,) = [c for c in stage_costs(model, replace(plan, overlap_param_gather=False), system)[0].dp_comm
                if c.kind == "all_gather"]  # fmt: skip
    assert after.name == "dp_all_gather" and after.provenance.endswith(";bucketed")
    assert after.seconds == pytest.approx(t(first) + 3 * t(40e6), rel=1e-9)
    assert got.seconds < after.seconds
    assert st.fwd_s > 4 * ag.seconds  # the premise of "keeps up"


# --- the iteration ---------------------------------------------------------------------------

PLANS = [
    ("llama2-7b", Plan(tp=2, dp=32, global_batch=512, **MEGATRON_Z1)),  # type: ignore[arg-type]
    ("gpt3-1.3b", Plan(pp=4, dp=16, global_batch=256, **MEGATRON_Z1)),  # type: ignore[arg-type]
    ("gpt3-1.3b", Plan(pp=4, dp=16, global_batch=256, schedule="interleaved", vpp=2, **MEGATRON_Z1)),  # type: ignore[arg-type]
    ("gpt3-1.3b", Plan(tp=2, dp=32, global_batch=256, micro_batch=2, recompute="full", **MEGATRON_Z1)),  # type: ignore[arg-type]
    ("mixtral-8x7b", Plan(tp=2, pp=4, dp=8, ep=4, global_batch=64, seq_len=4096, **MEGATRON_Z1)),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("model", "plan"), PLANS, ids=[f"{m}-{p.label()}" for m, p in PLANS])
def test_never_slower_and_the_gathers_shrink(model: str, plan: Plan) -> None:
    opg = replace(plan, overlap_param_gather=True)
    assert opg.label().endswith("-opg") and overlaps_comm(opg)
    before, after = predict_llm(model, plan, SYSTEM), predict_llm(model, opg, SYSTEM)
    assert after.iteration_time_s < before.iteration_time_s
    assert all(after.closed_form_s[k] < before.closed_form_s[k] for k in ("001_eq7", "003_eq4"))
    old, new = _gathers(plan, model), _gathers(opg, model)
    assert all(n < o for n, o in zip(new, old, strict=True))
    # the simulation charges the exposed gathers where it charged the whole ones: the saving is theirs
    saved = max(o - n for o, n in zip(old, new, strict=True))
    assert 0 < before.iteration_time_s - after.iteration_time_s <= saved * (1 + 1e-6)
    assert after.breakdown["exposed_dp_communication_s"] < before.breakdown["exposed_dp_communication_s"]
    for a, b in zip(before.stages, after.stages, strict=True):
        assert a.fwd_s == b.fwd_s and a.bwd_s == b.bwd_s  # the passes do not change


def test_breakdown_shows_the_rest() -> None:
    model, plan = "llama2-7b", Plan(tp=2, dp=32, global_batch=512, overlap_param_gather=True, **MEGATRON_Z1)  # type: ignore[arg-type]
    r = predict_llm(model, plan, SYSTEM)
    st = r.stages[0]
    red = sum(c.seconds for c in st.dp_comm if c.kind == "reduce_scatter")
    (ag,) = [c for c in st.dp_comm if c.kind == "all_gather"]
    assert ag.seconds > 0 and r.breakdown["exposed_dp_communication_s"] == pytest.approx(red + ag.seconds)


def test_pipeline_fill_hides_interleaved_gathers() -> None:
    """Interleaved: Megatron's aligned gathers start with the schedule, before a later stage's
    first activation arrives: its fill hides them; 1F1B's chain starts at the stage's first
    forward pre-hook (after the activation), so every stage exposes its first bucket."""
    model = "gpt3-1.3b"
    flat = Plan(pp=4, dp=16, global_batch=256, overlap_param_gather=True, contention=False, **MEGATRON_Z1)  # type: ignore[arg-type]
    inter = replace(flat, schedule="interleaved", vpp=2)  # (contention off: the delays alone)
    assert all(g > 0 for g in _gathers(flat, model))
    g = _gathers(inter, model)
    assert g[0] > 0 and all(x == 0.0 for x in g[1:])


def test_interleaved_middle_stages_take_their_own_fill() -> None:
    """Interleaved: each middle stage's exposed gathers are its own fill's (stage s waits s
    chunk-0 forwards), not those of the first middle stage of its depth that stage_costs
    computed (it shares one computation among stages alike: the stage must be in that key).
    LLaMA-2 7B tp2 pp4 vpp2 dp8: stage 2 had shown stage 1's 0.26 ms; costed alone it hides all."""
    model, system = get_model("llama2-7b"), get_system(SYSTEM)
    plan = Plan(tp=2, pp=4, dp=8, vpp=2, schedule="interleaved", global_batch=64, overlap_param_gather=True,
                **MEGATRON_Z1)  # type: ignore[arg-type]  # fmt: skip
    listed = stage_costs(model, plan, system)
    for s in range(plan.pp):
        (alone,) = stage_costs(model, plan, system, only=frozenset({s}))
        assert [c.seconds for c in alone.dp_comm] == [c.seconds for c in listed[s].dp_comm]
    g = [sum(c.seconds for c in st.dp_comm if c.kind == "all_gather") for st in listed]
    assert g[1] > 0 and g[2] < g[1]  # a longer fill hides more


def test_contention_stretches_the_forward_beside_the_gathers() -> None:
    model, plan = "llama2-7b", Plan(tp=2, dp=32, global_batch=512, overlap_param_gather=True, **MEGATRON_Z1)  # type: ignore[arg-type]
    (free,), (stretched,) = _gathers(replace(plan, contention=False), model), _gathers(plan, model)
    assert stretched > free > 0


# --- validation, CLI, search -----------------------------------------------------------------


@pytest.mark.parametrize(("fields", "match"), [
    ({"zero": 0}, "zero 1 with the distributed optimizer"),
    ({"zero": 2}, "zero 1 with the distributed optimizer"),  # no framework here overlaps ZeRO-2's
    ({"zero": 3}, "zero 1 with the distributed optimizer"),
    ({"zero": 1}, "zero 1 with the distributed optimizer.*without it"),
    ({"zero": 1, "dist_optimizer": True, "overlap_grad_reduce": True, "dp": 1}, "dp×cp > 1"),
    ({"zero": 1, "dist_optimizer": True}, "overlap_grad_reduce"),
    ({"overlap_param_gather": "yes", **MEGATRON_Z1}, "true or false"),
])  # fmt: skip
def test_invalid_combinations_are_refused(fields: dict[str, object], match: str) -> None:
    kw: dict[str, object] = {"dp": 8, "global_batch": 8, "overlap_param_gather": True, **fields}
    with pytest.raises(ConfigError, match=f"overlap_param_gather.*{match}"):
        Plan(**kw).validate(get_model("gpt2"))  # type: ignore[arg-type]


def test_valid_combinations() -> None:
    for p in (Plan(dp=1, cp=2, overlap_param_gather=True, **MEGATRON_Z1),  # type: ignore[arg-type]
              Plan(dp=8, overlap_param_gather=True, **MEGATRON_Z1)):  # type: ignore[arg-type]  # fmt: skip
        p.validate(get_model("gpt2"))


def test_cli_predict() -> None:
    _register()
    base = ["predict", "gpt3-1.3b", "--gpus", "16", "--global-batch", "64", "--zero", "1", "--dist-optimizer",
            "--overlap-grad-reduce", "--format", "json"]  # fmt: skip
    a, b = CliRunner().invoke(app, base), CliRunner().invoke(app, [*base, "--overlap-param-gather"])
    assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
    da, db = json.loads(a.stdout), json.loads(b.stdout)
    assert db["plan"].endswith("-opg") and db["iteration_time_s"] < da["iteration_time_s"]
    r = CliRunner().invoke(app, ["predict", "gpt3-1.3b", "--gpus", "16", "--global-batch", "64", "--overlap-param-gather"])
    assert r.exit_code == 2 and r.stderr == ("trainsim: error: --overlap-param-gather needs --zero 1 --dist-optimizer "
                                             "--overlap-grad-reduce (Megatron-core asserts them)\n")  # a usage error


def test_search_applies_it_to_the_plans_that_can_take_it() -> None:
    model = get_model("gpt3-1.3b")
    space = PlanSpace(gpus=16, global_batch=64, tp=(1, 16), pp=(1,), zero=(0, 1), micro_batch=(1,), recompute=("full",),
                      schedule=("1f1b",), sp=(False,), dist_optimizer=True, overlap_grad_reduce=True,
                      overlap_param_gather=True)  # fmt: skip
    r = search_llm(model, SYSTEM, space, workers=1, progress=False, top_k=100, simulate_top=2)
    plans = [Plan(**p["plan_fields"]) for p in r["plans"]]
    assert {p.dp for p in plans} == {1, 16}
    assert {p.zero for p in plans if p.dp > 1} == {0, 1}
    # dp 1 gathers nothing, ZeRO 0 gathers nothing: those run without it
    assert all(p.overlap_param_gather == (p.dp > 1 and p.zero == 1) for p in plans)
    # Megatron's ZeRO-1 is its distributed optimizer: the framework sets it, and the gathers with it
    mega = search_llm(model, SYSTEM, replace(space, dist_optimizer=False, framework="megatron", zero=(1,)), workers=1,
                      progress=False, top_k=100, simulate_top=1)  # fmt: skip
    assert mega["plans"] and all(Plan(**p["plan_fields"]).overlap_param_gather for p in mega["plans"]
                                 if p["plan_fields"]["dp"] > 1)  # fmt: skip
    assert any(p["plan_fields"]["dp"] > 1 for p in mega["plans"])


@pytest.mark.parametrize(("fields", "match"), [
    ({"zero": (0, 3)}, "has none"),
    ({"zero": (1,), "overlap_grad_reduce": False}, "has none"),
    ({"zero": (2,)}, "has none"),
    ({"framework": "deepspeed"}, "deepspeed has no such plan"),
    ({"framework": "torchtitan"}, "torchtitan has no such plan"),
])  # fmt: skip
def test_search_refuses_a_space_without_such_plans(fields: dict[str, object], match: str) -> None:
    kw: dict[str, object] = {"gpus": 16, "global_batch": 64, "dist_optimizer": True, "overlap_grad_reduce": True,
                             "overlap_param_gather": True, **fields}  # fmt: skip
    with pytest.raises(ConfigError, match=match):
        search_llm(get_model("gpt3-1.3b"), SYSTEM, PlanSpace(**kw), workers=1, progress=False)  # type: ignore[arg-type]
    ds = Plan(dp=8, overlap_param_gather=True, **MEGATRON_Z1)  # type: ignore[arg-type]
    assert framework_plan(ds, "deepspeed")[0] is None and framework_plan(ds, "megatron") == (ds, "")


def test_cli_search() -> None:
    _register()
    r = CliRunner().invoke(app, ["search", "gpt3-1.3b", "--gpus", "16", "--global-batch", "64", "--tp", "1", "--pp", "1",
                                 "--zero", "1", "--dist-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
                                 "--micro-batch", "1", "--recompute", "full", "--workers", "1", "--format", "json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert all(p["plan"].endswith("-opg") for p in json.loads(r.stdout)["plans"])
