"""`trainsim search --trim-end-stages N`: uneven splits that take layers off the end stages."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainsim.builders.memory import stage_layers
from trainsim.builders.models import get_model
from trainsim.builders.plan import Plan
from trainsim.builders.predict import predict_llm
from trainsim.search.llm import MEMORY_REASON, search_llm
from trainsim.search.space import PlanSpace, end_stage_splits


def test_splits_keep_the_middle_even() -> None:
    assert sorted(end_stage_splits(61, 16, 3)) == [(1, 4), (2, 3), (3, 2), (4, 1)]  # DeepSeek-V3
    # Llama 3 405B: 126 layers on 16 stages, one off each end (§3.3.2): middle 8, ends 7
    assert (7, 7) in set(end_stage_splits(126, 16, 2))
    for layers, pp, trim in [(61, 16, 3), (32, 4, 4), (24, 2, 3), (80, 6, 4)]:
        splits = list(end_stage_splits(layers, pp, trim))
        assert splits
        for first, last in splits:
            rest = layers - first - last
            assert first >= 1 and last >= 1 and rest >= 0
            middle = rest // (pp - 2) if pp > 2 else None
            assert (rest == 0) if pp == 2 else (rest % (pp - 2) == 0 and first <= middle and last <= middle)  # type: ignore[operator]
            if middle is not None:
                assert 0 < (middle - first) + (middle - last) <= trim  # what the ends give up
    assert list(end_stage_splits(32, 4, 0)) == []


def test_two_stage_splits_come_once() -> None:
    """pp 2 has no middle: trims t and t + 2 reach the same splits, each yielded (and so screened
    and ranked) once; the ranked table had held tp1-pp2-...-first13-last11 twice."""
    assert list(end_stage_splits(24, 2, 4)) == [(13, 11), (12, 12), (11, 13), (14, 10), (10, 14)]
    for layers, pp, trim in [(24, 2, 6), (61, 2, 5), (61, 16, 9), (32, 4, 8)]:
        splits = list(end_stage_splits(layers, pp, trim))
        assert len(splits) == len(set(splits))
    space = {**SPACE, "tp": (1,), "pp": (2,), "zero": (0,)}
    res = search_llm(get_model("gpt3-1.3b"), "dgx-a100", PlanSpace(**space, trim_end_stages=4), workers=1,  # type: ignore[arg-type]
                     progress=False, top_k=10_000, simulate_top=1)  # fmt: skip
    labels = [p["plan"] for p in res["plans"]]
    assert len(labels) == len(set(labels)) and any("first14-last10" in x for x in labels)


SPACE = {"gpus": 16, "global_batch": 64, "tp": (1, 2), "pp": (2, 4), "micro_batch": (1,), "zero": (0, 1),
         "recompute": ("full",), "vpp": (2,)}  # fmt: skip


def test_trimmed_plans_are_searched_and_rank_as_predict() -> None:
    model = get_model("gpt3-1.3b")  # 24 layers
    base = search_llm(model, "dgx-a100", PlanSpace(**SPACE), workers=1, progress=False, top_k=10_000, simulate_top=1)  # type: ignore[arg-type]
    trim = search_llm(model, "dgx-a100", PlanSpace(**SPACE, trim_end_stages=2), workers=1, progress=False,  # type: ignore[arg-type]
                      top_k=10_000, simulate_top=4)  # fmt: skip
    assert trim["enumerated"] > base["enumerated"]
    assert trim["evaluated"] + sum(n for why, n in trim["infeasible"].items() if why != MEMORY_REASON) == trim["enumerated"]
    labels = {p["plan"] for p in trim["plans"]}
    assert {p["plan"] for p in base["plans"]} <= labels  # the even splits are all still there
    uneven = [p for p in trim["plans"] if p["plan_fields"]["last_stage_layers"]]
    assert uneven and all(p["plan_fields"]["schedule"] != "interleaved" for p in uneven)
    for p in uneven:
        plan = Plan(**p["plan_fields"])
        layers = stage_layers(model, plan)
        assert sum(layers) == 24 and layers[0] + layers[-1] < 2 * max(layers)
        assert p["screened_s"] == pytest.approx(predict_llm(model, plan, "dgx-a100", simulate=False).iteration_time_s,
                                                rel=1e-12)  # fmt: skip
    assert len(labels) == len(trim["plans"]), "no plan twice (pp 2: a split equal to the even one is skipped)"


def test_deepseek_v3_light_last_stage_wins() -> None:
    """DeepSeek-V3's last stage holds the head and the MTP depth: a split with fewer layers there
    is faster than any even split of the same plan (Megatron-core's recipes set the last stage's
    layers for this)."""
    model = get_model("deepseek-v3")
    even = Plan(tp=1, pp=16, dp=16, ep=8, zero=1, dist_optimizer=True, micro_batch=1, global_batch=1024, recompute="full")
    t_even = predict_llm(model, even, "dgx-h100", simulate=False).iteration_time_s
    trimmed = [replace(even, first_stage_layers=f, last_stage_layers=last) for f, last in end_stage_splits(61, 16, 3)]
    best = min(predict_llm(model, p, "dgx-h100", simulate=False).iteration_time_s for p in trimmed)
    assert best < t_even
