"""A coster kept across plans (a search's) answers each plan as a fresh one would.

The coster memoises element-wise adds and whole gradient-accumulation lists (an MoE layer asks
for one add per local expert weight); a key that missed a field the answer depends on would
give one plan another's costs. Each plan here is predicted on a coster warmed by every other
plan and on a fresh one, and the answers must be equal to the bit.
"""

from __future__ import annotations

import pytest

from trainsim.builders.costs import LayerCoster, OpCoster
from trainsim.builders.models import get_model
from trainsim.builders.plan import Plan
from trainsim.builders.predict import predict_llm
from trainsim.hardware import get_device, get_system

# plans that differ in what the accumulation depends on: the gradient shard (ZeRO-3's dp),
# ep (local experts), tp (weight shapes), dtype, and a single micro-batch (no adds)
PLANS = [
    Plan(tp=1, pp=2, dp=4, ep=4, micro_batch=1, global_batch=64, recompute="full"),
    Plan(tp=1, pp=2, dp=4, ep=4, micro_batch=1, global_batch=64, recompute="full", zero=3),
    Plan(tp=1, pp=2, dp=4, ep=2, micro_batch=1, global_batch=64, recompute="full", zero=3),
    Plan(tp=2, pp=2, dp=2, ep=2, micro_batch=1, global_batch=64, recompute="full", sp=True),
    Plan(tp=1, pp=2, dp=4, ep=4, micro_batch=1, global_batch=64, recompute="full", dtype="fp16"),
    Plan(tp=1, pp=2, dp=4, ep=4, micro_batch=2, global_batch=8, recompute="full"),
]


@pytest.mark.parametrize("name", ["qwen1.5-moe-a2.7b", "mixtral-8x7b"])
def test_warm_coster_answers_as_a_fresh_one(name: str) -> None:
    model, system = get_model(name), get_system("dgx-h100")
    warm = OpCoster(get_device(system.device))
    for plan in PLANS:  # warm the coster on every plan first
        predict_llm(model, plan, system, coster=warm, simulate=False)
    for plan in PLANS:
        fresh = predict_llm(model, plan, system, coster=OpCoster(get_device(system.device)), simulate=False)
        again = predict_llm(model, plan, system, coster=warm, simulate=False)
        assert again.iteration_time_s == fresh.iteration_time_s, plan
        assert again.breakdown == fresh.breakdown, plan


def test_accumulation_adds_follow_the_gradient_shard() -> None:
    model = get_model("qwen1.5-moe-a2.7b")
    coster = OpCoster(get_device("h100-sxm5-80gb"))
    z0 = LayerCoster(model, PLANS[0], coster).grad_accumulation()[0]
    z3 = LayerCoster(model, PLANS[1], coster).grad_accumulation()[0]  # same shapes, 1/4 of each gradient
    assert len(z0) == len(z3) and len(z0) > 2 * 60 // 4  # one add per local expert weight
    pairs = list(zip(z0, z3, strict=True))
    # dense weights shard over dp 4; experts over dp / ep = 1 (each rank's experts are its own)
    assert all(b.seconds < a.seconds for a, b in pairs if not a.name.startswith("grad_acc_expert"))
    assert all(b == a for a, b in pairs if a.name.startswith("grad_acc_expert"))
