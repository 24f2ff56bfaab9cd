"""A coster kept across plans (a search's) answers each plan as a fresh one would.

The coster memoises element-wise adds and whole gradient-accumulation lists (an MoE layer asks
for one add per local expert weight); a key that missed a field the answer depends on would
give one plan another's costs. Each plan here is predicted on a coster warmed by every other
plan and on a fresh one, and the answers must be equal to the bit.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainsim.builders import memory
from trainsim.builders.costs import (
    HOST,
    HostModel,
    LayerCoster,
    OpCost,
    OpCoster,
    flow_shop_parts,
    flow_shop_repeat,
    flow_shop_s,
)
from trainsim.builders.llm import _averaged, _layer_accumulation, closed_form_001, stage_costs
from trainsim.builders.memory import dense_variant, memory_per_gpu
from trainsim.builders.models import get_model
from trainsim.builders.plan import Plan
from trainsim.builders.predict import predict_llm
from trainsim.builders.spec import ModelSpec
from trainsim.hardware import SystemSpec, get_device, get_system

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


# --- the screening's per-shape caches (search_llm's _screen: stage_costs + closed_form_001) ---

# DeepSeek-V3 holds dense layers among its MoE ones and an MTP depth whose block is the model's
# layer; these plans differ in every field the kept results are keyed by: the micro-batch count
# (global_batch, micro_batch, dp), ep and the gradient shard (zero 3's dp), tp / sp, dtype,
# wgrad_fusion (no adds), pp (stage depths share one flow shop), recompute, cp
SCREEN_PLANS = [
    Plan(tp=2, pp=4, dp=8, ep=8, micro_batch=1, global_batch=64, recompute="full"),
    Plan(tp=2, pp=4, dp=8, ep=8, micro_batch=1, global_batch=128, recompute="full"),
    Plan(tp=2, pp=4, dp=8, ep=8, micro_batch=2, global_batch=128, recompute="full"),
    Plan(tp=2, pp=4, dp=8, ep=4, micro_batch=1, global_batch=64, recompute="full"),
    Plan(tp=2, pp=4, dp=8, ep=4, micro_batch=1, global_batch=64, recompute="full", zero=3),
    Plan(tp=2, pp=4, dp=16, ep=4, micro_batch=1, global_batch=64, recompute="full", zero=3),
    Plan(tp=4, pp=4, dp=4, ep=4, micro_batch=1, global_batch=64, recompute="full", sp=True),
    Plan(tp=2, pp=4, dp=8, ep=8, micro_batch=1, global_batch=64, recompute="full", dtype="fp16"),
    Plan(tp=2, pp=4, dp=8, ep=8, micro_batch=1, global_batch=64, recompute="full", wgrad_fusion=True),
    Plan(tp=2, pp=8, dp=8, ep=8, micro_batch=1, global_batch=64, recompute="full"),
    Plan(tp=2, pp=8, dp=8, ep=8, micro_batch=1, global_batch=64, recompute="selective"),
    Plan(tp=2, pp=4, dp=4, cp=2, ep=4, micro_batch=1, global_batch=64, recompute="full"),
    Plan(tp=2, pp=4, dp=8, ep=8, micro_batch=8, global_batch=64, recompute="full"),  # one micro-batch
]
OTHER_HOST = HostModel(kernel_op_s=30e-6, aten_launch_s=20e-6, aten_view_s=1e-6)  # another host's dispatch (the kept key)


def _screened(model: ModelSpec, plan: Plan, system: SystemSpec, coster: OpCoster, host: HostModel) -> tuple:
    stages = stage_costs(model, plan, system, coster, host, tp_shares=False)
    per_stage = [(s.layers, s.params, s.fwd_s, s.bwd_s, s.recompute_s, s.end_fwd_s, s.end_bwd_s, s.optimizer_s,
                  s.p2p_s, s.flops_fwd, s.flops_bwd, len(s.layer_ops), len(s.ops)) for s in stages]  # fmt: skip
    return closed_form_001(stages, plan), per_stage


@pytest.mark.parametrize("name", ["deepseek-v3", "qwen3-30b-a3b"])
def test_warm_coster_screens_as_a_fresh_one(name: str) -> None:
    model, system = get_model(name), get_system("dgx-h100")
    plans = [p for p in SCREEN_PLANS if model.num_experts % p.ep == 0 and model.layers >= p.pp]
    warm = OpCoster(get_device(system.device))
    for host in (HOST, OTHER_HOST):  # warm on every plan and both hosts first
        for plan in plans:
            _screened(model, plan, system, warm, host)
    for host in (OTHER_HOST, HOST):
        for plan in plans:
            fresh = _screened(model, plan, system, OpCoster(get_device(system.device)), host)
            assert _screened(model, plan, system, warm, host) == fresh, (plan, host)
            if host is HOST:  # the breakdown's fields too, through predict
                a = predict_llm(model, plan, system, coster=warm, simulate=False)
                b = predict_llm(model, plan, system, coster=OpCoster(get_device(system.device)), simulate=False)
                assert (a.iteration_time_s, a.breakdown) == (b.iteration_time_s, b.breakdown), plan


def test_the_averaged_accumulation_is_kept_per_micro_batch_count_and_host() -> None:
    model, coster = get_model("deepseek-v3"), OpCoster(get_device("h100-sxm5-80gb"))
    p64, p128 = SCREEN_PLANS[0], SCREEN_PLANS[1]  # the same adds, 16 and 32 micro-batches
    lc = LayerCoster(model, p64, coster)
    ops, cpus = _layer_accumulation(lc, p64, HOST)
    again, _ = _layer_accumulation(LayerCoster(model, p64, coster), p64, HOST)
    assert len(ops) > 2 * 256 // 8 and all(a is b for a, b in zip(ops, again, strict=True))  # kept, not rebuilt
    assert (ops, cpus) == _averaged(*lc.grad_accumulation(), p64, HOST)
    more, _ = _layer_accumulation(LayerCoster(model, p128, coster), p128, HOST)
    assert more[0].seconds > ops[0].seconds  # (M - 1) / M of the adds: a larger share
    _, other = _layer_accumulation(lc, p64, OTHER_HOST)
    assert other != cpus and other == _averaged(*lc.grad_accumulation(), p64, OTHER_HOST)[1]


def test_flow_shop_parts_repeat_as_the_flow_shop() -> None:
    ops = [OpCost(f"op{i}", "fwd", s, "x") for i, s in enumerate((3e-5, 1e-6, 4e-5, 2e-6, 7e-6))]
    for cpus in (1e-5, [2e-5, 1e-6, 3e-6, 4e-5, 1e-5]):
        parts = flow_shop_parts(ops, cpus)
        assert all(flow_shop_repeat(parts, n) == flow_shop_s(ops, cpus, n) for n in range(6))
    assert flow_shop_parts([], 1e-5) is None and flow_shop_repeat(None, 3) == flow_shop_s([], 1e-5, 3) == 0.0


def test_memory_caches_follow_the_model_object() -> None:
    """The dense variant and a layer's parameters are kept per model object: an edited copy of
    a model (a wider dense MLP) answers as it would with nothing kept."""
    model = get_model("deepseek-v3")
    wider = replace(model, ffn_hidden=2 * model.ffn_hidden)
    plan = SCREEN_PLANS[0]
    assert dense_variant(model) is dense_variant(model) and dense_variant(model) == model.dense_variant()
    before = [m.total_bytes for m in memory_per_gpu(model, plan)]
    warm = [m.total_bytes for m in memory_per_gpu(wider, plan)]
    memory._DENSE_VARIANTS.clear()
    memory._LAYER_PARAMS.clear()
    assert [m.total_bytes for m in memory_per_gpu(wider, plan)] == warm != before
    assert [m.total_bytes for m in memory_per_gpu(model, plan)] == before
