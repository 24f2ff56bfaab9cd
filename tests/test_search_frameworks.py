"""`trainsim search --framework`: only the plans one training framework runs are ranked."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from trainsim.builders.models import get_model
from trainsim.builders.plan import Plan
from trainsim.cli.main import _register, app
from trainsim.errors import ConfigError
from trainsim.search.frameworks import FRAMEWORKS, check_framework, framework_plan
from trainsim.search.llm import search_llm
from trainsim.search.space import PlanSpace


def _p(**kw: object) -> Plan:
    base: dict[str, object] = {"tp": 2, "pp": 2, "dp": 4, "micro_batch": 1, "global_batch": 64, "sp": True}
    return Plan(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(("framework", "fields", "runs"), [
    ("megatron", {"zero": 0}, True),
    ("megatron", {"zero": 2}, False),  # no ZeRO-2/3 (DDP or the distributed optimizer)
    ("megatron", {"zero": 3, "dp": 1, "tp": 8}, True),  # one data-parallel rank: nothing to shard
    ("megatron", {"schedule": "gpipe"}, False),
    ("megatron", {"schedule": "interleaved", "vpp": 2}, True),
    ("deepspeed", {"zero": 1}, True),
    ("deepspeed", {"zero": 2}, False),  # its pipeline engine: ZeRO-1 at most
    ("deepspeed", {"zero": 3, "pp": 1, "dp": 8}, True),  # without pipelining every stage
    ("deepspeed", {"schedule": "interleaved", "vpp": 2}, False),
    ("deepspeed", {"cp": 2, "dp": 2}, False),
    ("torchtitan", {"zero": 1}, False),  # FSDP2 shards parameters: no ZeRO-1
    ("torchtitan", {"zero": 3, "schedule": "gpipe"}, True),
    ("torchtitan", {"zero": 2, "cp": 2, "dp": 2}, True),
    ("torchtitan", {"sp": False}, False),  # its TP shards the norms' sequence
    ("torchtitan", {"sp": False, "tp": 1, "dp": 8}, True),
    ("any", {"zero": 2}, True),
])  # fmt: skip
def test_framework_rules(framework: str, fields: dict[str, object], runs: bool) -> None:
    plan, why = framework_plan(_p(**fields), framework)
    assert (plan is not None) == runs, why
    assert bool(why) == (not runs)
    if not runs:
        assert "'s " not in why, "a possessive reads as 'the model's' in the search's reason keys"


def test_megatron_zero1_is_its_distributed_optimizer() -> None:
    plan, _ = framework_plan(_p(zero=1), "megatron")
    assert plan is not None and plan.dist_optimizer and plan.label().endswith("-zero1-distopt-mb1-gb64")
    assert framework_plan(_p(zero=1), "deepspeed")[0] == _p(zero=1)  # others keep the plan as given


def test_unknown_framework_is_one_line() -> None:
    with pytest.raises(ConfigError, match="--framework must be one of any, megatron, deepspeed, torchtitan, got 'jax'"):
        check_framework("jax")


SPACE = {"gpus": 16, "global_batch": 64, "micro_batch": (1, 2), "recompute": ("full",), "vpp": (2,)}


@pytest.mark.parametrize("framework", FRAMEWORKS[1:])
def test_search_ranks_only_the_frameworks_plans(framework: str) -> None:
    model = get_model("gpt3-1.3b")
    every = search_llm(model, "dgx-a100", PlanSpace(**SPACE), workers=1, progress=False, top_k=10_000, simulate_top=1)  # type: ignore[arg-type]
    only = search_llm(model, "dgx-a100", PlanSpace(**SPACE, framework=framework), workers=1, progress=False,  # type: ignore[arg-type]
                      top_k=10_000, simulate_top=1)  # fmt: skip
    assert only["framework"] == framework and 0 < only["feasible"] < every["feasible"]
    assert only["enumerated"] == every["enumerated"], "a framework's refusals are counted, not dropped"
    for p in only["plans"]:
        plan = Plan(**p["plan_fields"])
        assert framework_plan(plan, framework) == (plan, "")
    assert any(framework.lower() in why.lower() or "deepspeed" in why.lower() for why in only["infeasible"])


def test_any_framework_notes_plans_only_fsdp_runs() -> None:
    model = get_model("gpt3-1.3b")
    space = PlanSpace(gpus=16, global_batch=64, tp=(2,), pp=(2,), zero=(0, 2), micro_batch=(1,), recompute=("full",),
                      schedule=("1f1b",), sp=(True,))  # fmt: skip
    r = search_llm(model, "dgx-a100", space, workers=1, progress=False, top_k=2, simulate_top=2)
    zero2 = [i for i, p in enumerate(r["plans"], 1) if p["plan_fields"]["zero"] == 2]
    assert zero2
    note = next(n for n in r["notes"] if "--framework" in n)
    assert all(f"#{i}" in note for i in zero2) and "torchtitan" in note
    r = search_llm(model, "dgx-a100", replace_zero(space, (0,)), workers=1, progress=False, top_k=2, simulate_top=2)
    assert not any("--framework" in n for n in r["notes"])


def replace_zero(space: PlanSpace, zero: tuple[int, ...]) -> PlanSpace:
    from dataclasses import replace

    return replace(space, zero=zero)


def test_cli_framework() -> None:
    _register()
    args = ["search", "gpt3-1.3b", "--gpus", "16", "--global-batch", "64", "--micro-batch", "1", "--recompute", "full",
            "--workers", "1", "--top-k", "3"]  # fmt: skip
    res = CliRunner().invoke(app, [*args, "--framework", "megatron", "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["framework"] == "megatron" and all(p["plan_fields"]["zero"] <= 1 for p in doc["plans"])
    res = CliRunner().invoke(app, [*args, "--framework", "nemo"])
    assert res.exit_code != 0 and "--framework must be one of" in str(res.exception) + res.output
