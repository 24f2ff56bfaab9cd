"""``Plan.moe_imbalance`` / ``--moe-imbalance``: the busiest expert-parallel rank's routed tokens
over the mean, which sets an MoE layer's pace (the combine all-to-all waits for it)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from trainsim.builders.llm_comm import PlanComm
from trainsim.builders.memory import activation_bytes_per_layer
from trainsim.builders.models import get_model
from trainsim.builders.plan import Plan
from trainsim.builders.predict import predict_llm
from trainsim.errors import ConfigError

MIXTRAL = get_model("mixtral-8x7b")
BASE = Plan(tp=2, pp=4, dp=8, ep=8, micro_batch=1, global_batch=64, seq_len=4096, recompute="full")


def _predict(plan: Plan):
    return predict_llm(MIXTRAL, plan, "dgx-a100")


def test_a_busier_rank_takes_longer_and_holds_more_and_balanced_is_the_default():
    times, mems = [], []
    for f in (1.0, 1.25, 2.0):
        r = _predict(replace(BASE, moe_imbalance=f))
        times.append(r.iteration_time_s)
        mems.append(r.peak_memory.total_bytes)
    assert times[0] < times[1] < times[2] and mems[0] < mems[1] < mems[2]
    assert _predict(BASE).iteration_time_s == times[0]  # 1.0 is the balanced default, bit for bit
    # only the MoE part scales: doubling the busiest rank's load less than doubles the iteration
    assert times[2] < 2 * times[0]


def test_the_expert_gemms_and_all_to_all_scale_by_the_load():
    from trainsim.builders.costs import LayerCoster, OpCoster
    from trainsim.hardware import get_device, get_system

    coster = OpCoster(get_device("a100-sxm4-80gb"))
    ops = {f: {o.name: o for o in LayerCoster(MIXTRAL, replace(BASE, moe_imbalance=f), coster).mlp("fwd")}
           for f in (1.0, 1.5)}  # fmt: skip
    for name in ("mlp_up", "mlp_down"):
        assert ops[1.5][name].flops == pytest.approx(1.5 * ops[1.0][name].flops)
        assert ops[1.5][name].seconds > ops[1.0][name].seconds
    assert ops[1.5]["router"].seconds == ops[1.0]["router"].seconds  # every rank routes its own tokens
    system = get_system("dgx-a100")
    a2a = {f: PlanComm(MIXTRAL, replace(BASE, moe_imbalance=f), system).ep_layer("fwd")[0] for f in (1.0, 1.5)}
    assert a2a[1.5].bytes == pytest.approx(1.5 * a2a[1.0].bytes)
    assert activation_bytes_per_layer(MIXTRAL, replace(BASE, recompute="none", moe_imbalance=1.5)) > \
        activation_bytes_per_layer(MIXTRAL, replace(BASE, recompute="none"))


def test_without_expert_parallelism_it_changes_nothing_and_says_so():
    one = replace(BASE, ep=1)
    r = _predict(replace(one, moe_imbalance=1.5))
    assert r.iteration_time_s == _predict(one).iteration_time_s
    assert any("changes nothing at ep 1" in n for n in r.warnings)
    assert any("routed 1.5x the mean" in n for n in _predict(replace(BASE, moe_imbalance=1.5)).warnings)


@pytest.mark.parametrize(("model", "f", "message"), [
    ("mixtral-8x7b", 0.5, "must be a number >= 1, got 0.5"),
    ("mixtral-8x7b", math.nan, "must be a number >= 1, got nan"),
    ("mixtral-8x7b", 9.0, "moe_imbalance 9 is more than ep 8"),
    ("llama2-7b", 1.2, "moe_imbalance 1.2 needs a mixture-of-experts model; llama2-7b is dense"),
])  # fmt: skip
def test_an_impossible_load_is_a_one_line_error(model, f, message):
    plan = replace(BASE, moe_imbalance=f) if model != "llama2-7b" else Plan(tp=2, dp=4, moe_imbalance=f)
    with pytest.raises(ConfigError, match=message):
        plan.validate(get_model(model))


def test_the_label_names_it_only_when_given():
    assert "imb" not in BASE.label()
    assert replace(BASE, moe_imbalance=1.25).label().endswith("-imb1.25")
    assert "imb" not in replace(BASE, ep=1, moe_imbalance=1.25).label()  # changes nothing at ep 1


def test_search_applies_it_to_every_expert_parallel_plan():
    from trainsim.search.llm import search_llm
    from trainsim.search.space import PlanSpace

    space = PlanSpace(gpus=16, global_batch=16, seq_len=2048, tp=(2,), pp=(1,), ep=(1, 2, 8), zero=(1,),
                      micro_batch=(1,), recompute=("full",), schedule=("1f1b",), sp=(False,), moe_imbalance=1.5)  # fmt: skip
    r = search_llm(MIXTRAL, "dgx-a100", space, progress=False, top_k=10, simulate_top=10)
    assert {p["plan_fields"]["moe_imbalance"] for p in r["plans"]} == {1.5}
    assert any("routed 1.5x" in n for n in r["notes"])
    for p in r["plans"]:  # each ranked time is predict's of that plan, the load included
        plan = Plan(**{k: v for k, v in p["plan_fields"].items() if k != "seq_len"}, seq_len=2048)
        assert p["iteration_time_s"] == pytest.approx(_predict(plan).iteration_time_s, rel=1e-9)
    with pytest.raises(ConfigError, match="needs a mixture-of-experts model"):
        search_llm(get_model("llama2-7b"), "dgx-a100", replace(space, ep=(1,)), progress=False)
