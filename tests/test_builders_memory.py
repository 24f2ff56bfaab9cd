"""Per-GPU training memory: published numbers (Korthikanti 2022 Table 2, ZeRO §5.1, 001
Eq. 3–5 / Tables II–III) and properties (partitions sum to L, more TP or recompute never adds)."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsim.builders.memory import (
    MemoryBreakdown,
    Precision,
    activation_bytes_per_layer,
    fits,
    headroom_bytes,
    in_flight_microbatches,
    memory_per_gpu,
    peak_memory,
    stage_layers,
    stage_layers_001,
    stage_params,
)
from trainsim.builders.models import get_model
from trainsim.builders.plan import Plan
from trainsim.builders.spec import ModelSpec
from trainsim.errors import ConfigError

GPT3 = ModelSpec(name="gpt3-175b", hidden=12288, layers=96, heads=96, vocab=51200, seq_len=2048)
NEOX = ModelSpec(name="neox-20b", hidden=6144, layers=44, heads=64, vocab=50257, position="rotary")
LLAMA = ModelSpec(
    name="llama-ish", hidden=4096, layers=32, heads=32, kv_heads=8, vocab=32000, ffn_hidden=11008,
    activation="swiglu", norm="rmsnorm", position="rotary", bias=False, seq_len=4096,
)  # fmt: skip
MOE = ModelSpec(
    name="moe-ish", hidden=1024, layers=8, heads=16, kv_heads=4, vocab=32000, ffn_hidden=2816,
    activation="swiglu", norm="rmsnorm", position="rotary", bias=False, num_experts=8, top_k=2,
)  # fmt: skip

# --- Korthikanti et al. 2022, Table 2 ---------------------------------------------------------
# GPT-3 175B: s = 2048, b = 1, h = 12288, a = 96, t = 8. sbh = 25,165,824; 5as/h = 80;
# 24/t = 3; 34/t = 4.25; 5as/(ht) = 10.
SBH = 2048 * 1 * 12288
assert SBH == 25_165_824


@pytest.mark.parametrize(
    ("tp", "sp", "recompute", "coefficient", "expected_bytes"),
    [
        (1, False, "none", 34 + 80, 2_868_903_936),  # sbh(34 + 5as/h)
        (8, False, "none", 10 + 3 + 10, 578_813_952),  # sbh(10 + 24/t + 5as/(ht))
        (8, True, "none", 4.25 + 10, 358_612_992),  # sbh(34/t + 5as/(ht))
        (1, False, "selective", 34, 855_638_016),  # sbh·34
        (8, False, "selective", 10 + 3, 327_155_712),  # sbh(10 + 24/t)
        (8, True, "selective", 4.25, 106_954_752),  # sbh·34/t
        (1, False, "full", 2, 50_331_648),  # 2sbh
        (8, False, "full", 2, 50_331_648),  # 2sbh: the input is whole without SP
        (8, True, "full", 2 / 8, 6_291_456),  # 2sbh/t
    ],
)
def test_korthikanti_table2_per_layer(tp, sp, recompute, coefficient, expected_bytes):
    # Korthikanti's GPT trains with attention dropout (its 5as/h: softmax output, mask, output)
    plan = Plan(tp=tp, sp=sp, recompute=recompute, attention="fused", attention_dropout=0.1)
    assert coefficient * SBH == expected_bytes  # the hand arithmetic
    assert activation_bytes_per_layer(GPT3, plan) == pytest.approx(expected_bytes, rel=1e-12)


@pytest.mark.parametrize("attention", ["fused", "unfused"])
def test_attention_without_dropout_keeps_only_the_softmax_output(attention):
    """No attention dropout: no mask and no dropped copy, so the scores term is 2as²b/t
    instead of 5as²b/t (sbh·2as/(ht) = 4 sbh at GPT-3's a = 96, t = 8), whatever the recompute
    keeps besides."""
    for recompute in ("none", "selective"):
        with_d = Plan(tp=8, recompute=recompute, attention=attention, attention_dropout=0.1)
        without = replace(with_d, attention_dropout=0.0)
        kept = activation_bytes_per_layer(GPT3, with_d) - activation_bytes_per_layer(GPT3, without)
        assert kept == pytest.approx((10 - 4) * SBH if recompute == "none" else 0.0, abs=1.0)


def test_flash_attention_keeps_no_scores():
    none, sel = (Plan(tp=8, sp=True, recompute=r, attention="flash") for r in ("none", "selective"))
    assert activation_bytes_per_layer(GPT3, none) == activation_bytes_per_layer(GPT3, sel)
    # selective Table 2 value plus the fp32 log-sum-exp, 4·a·s·b/t
    lse = 4 * 96 * 2048 / 8
    assert activation_bytes_per_layer(GPT3, sel) == pytest.approx(4.25 * SBH + lse)


def test_first_stage_activations_1f1b():
    """Korthikanti §4.2.3: stage 0 of 1F1B keeps pp micro-batches of L/pp layers = L layers."""
    plan = Plan(tp=8, pp=8, sp=True, recompute="selective", attention="fused", attention_dropout=0.1,
                global_batch=64)  # fmt: skip
    stage0 = memory_per_gpu(GPT3, plan)[0]
    # 96 layers × 34sbh/t + embedding dropout mask pp·sbh/t + one layer's recomputed scores
    # 5as²b/t = 10 sbh during its backward: (408 + 1 + 10) sbh.
    assert stage0.activations_bytes == pytest.approx(419 * SBH)


def test_interleaved_in_flight_matches_korthikanti():
    plan = Plan(pp=8, schedule="interleaved", vpp=2, global_batch=16)
    plan.validate(GPT3)
    factor = 1 + (8 - 1) / (8 * 2)  # Korthikanti §4.2.3: (1 + (p − 1)/(p·m))
    assert in_flight_microbatches(plan, 0) == pytest.approx(8 * factor)
    assert in_flight_microbatches(replace(plan, schedule="1f1b", vpp=1), 0) == 8
    assert in_flight_microbatches(replace(plan, schedule="gpipe", vpp=1), 7) == 16
    assert [in_flight_microbatches(Plan(pp=4, global_batch=2), i) for i in range(4)] == [2, 2, 2, 1]


# --- ZeRO (Rajbhandari et al. 2020), §5.1 / Figure 1 ---------------------------------------
# Ψ = 7.5B, N_d = 64, mixed-precision Adam (K = 12): 2Ψ + 2Ψ + KΨ = 120 GB; P_os 31.4 GB;
# P_os+g 16.6 GB; P_os+g+p 1.9 GB (the paper rounds 1.875 to 1.9).
ZERO_TABLE = [(0, 120.0, 120.0), (1, 31.4, 31.40625), (2, 16.6, 16.640625), (3, 1.9, 1.875)]


@pytest.mark.parametrize(("zero", "printed_gb", "exact_gb"), ZERO_TABLE)
def test_zero_paper_model_states(zero, printed_gb, exact_gb):
    per_param = Precision.for_dtype("fp16").sharded(zero, 64).total_bytes
    assert per_param * 7.5e9 / 1e9 == pytest.approx(exact_gb, rel=1e-12)
    assert per_param * 7.5e9 / 1e9 == pytest.approx(printed_gb, abs=0.05)


@pytest.mark.parametrize(("zero", "printed_gb", "exact_gb"), ZERO_TABLE)
def test_zero_end_to_end_on_a_7_5b_model(zero, printed_gb, exact_gb):
    model = ModelSpec(name="7.5b", hidden=4096, layers=36, heads=32, vocab=50257,
                      tied_embeddings=True)  # fmt: skip
    plan = Plan(dp=64, zero=zero, dtype="fp16")
    params = stage_params(model, plan, 0)
    assert params == model.params()
    assert params == pytest.approx(7.5e9, rel=0.01)
    m = memory_per_gpu(model, plan)[0]
    states_gb = (m.weights_bytes + m.gradients_bytes + m.optimizer_bytes) / 1e9
    assert states_gb == pytest.approx(exact_gb * params / 7.5e9, rel=1e-12)
    assert states_gb == pytest.approx(printed_gb, rel=0.01, abs=0.05)


def test_precision_defaults_follow_megatron_table():
    # Megatron Core distributed-optimizer docs: bf16 param + fp32 grads 18 B (6 + 12/d).
    assert Precision.for_dtype("bf16").total_bytes == 18
    assert Precision.for_dtype("bf16").sharded(1, 8).total_bytes == 6 + 12 / 8
    assert Precision.for_dtype("fp32").sharded(1, 4).total_bytes == 8 + 8 / 4
    with pytest.raises(ConfigError, match="dtype"):
        Precision.for_dtype("fp8")


# --- pipeline partitions --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("layers", "pp", "expected"),
    [
        (44, 4, [11, 12, 11, 10]),  # Eq. 3–5 give 11, 13, 13, 10 (47): middles take 44 − 21
        (43, 4, [10, 12, 12, 9]),  # 4 | 48: Eq. 3–5 verbatim (f = 12)
        (44, 1, [44]),
        (44, 2, [23, 21]),  # f = 25: first 23, the last the rest (Eq. 5 says 22)
        (4, 4, [1, 2, 1, 0]),  # f = 3: first 1, last 0, two layers over the middles
    ],
)
def test_stage_layers_001(layers, pp, expected):
    assert stage_layers_001(replace(NEOX, layers=layers), Plan(pp=pp)) == expected


@settings(max_examples=200, deadline=None)
@given(layers=st.integers(1, 200), pp=st.integers(1, 64))
def test_partitions_sum_to_layers(layers, pp):
    pp = min(pp, layers)
    model, plan = replace(NEOX, layers=layers), Plan(pp=pp)
    even = stage_layers(model, plan)
    assert sum(even) == layers
    assert max(even) - min(even) <= 1
    assert even == sorted(even, reverse=True)  # the first layers % pp stages take one more
    neox = stage_layers_001(model, plan)
    assert sum(neox) == layers
    assert min(neox) >= 0
    f = math.ceil((layers + 5) / pp)
    if pp > 2 and (layers + 5) % pp == 0 and f >= 3:  # the equations sum to L, none < 0
        assert neox == [f - 2, *[f] * (pp - 2), f - 3]


def test_interleaved_stage_layers():
    plan = Plan(pp=4, schedule="interleaved", vpp=3, global_batch=8)
    assert stage_layers(replace(NEOX, layers=48), plan) == [12] * 4


# --- parameters per stage (001 Tables II–III) -------------------------------------------------


def test_stage_params_match_001_table_ii_and_iii():
    d, mp, pp = NEOX.hidden, 4, 4
    plan = Plan(tp=mp, pp=pp)
    # Table II, one encoder on one GPU: 3 LayerNorms... two per layer ([d], [d] each),
    # Linear1 [d, 3d/mp] + [3d/mp], Linear2 [d/mp, d] + [d], Linear3 [d, 4d/mp] + [4d/mp],
    # Linear4 [4d/mp, d] + [d]. (Eq. 6 divides the two row-parallel [d] biases by mp; Table II
    # and Megatron keep them whole.)
    encoder = 2 * 2 * d + (d * 3 * d + 3 * d) / mp + (d * d / mp + d)
    encoder += (d * 4 * d + 4 * d) / mp + (4 * d * d / mp + d)
    v = NEOX.padded_vocab(mp)  # 001 Eq. 1–2: 50257 → 50688 for mp = 4
    assert v == 50688
    n = stage_layers(NEOX, plan)
    assert stage_params(NEOX, plan, 0) == pytest.approx(v * d / mp + n[0] * encoder)
    assert stage_params(NEOX, plan, 1) == pytest.approx(n[1] * encoder)
    assert stage_params(NEOX, plan, 3) == pytest.approx(n[3] * encoder + 2 * d + v * d / mp)
    with pytest.raises(ConfigError, match="stage 4"):
        stage_params(NEOX, plan, 4)


@pytest.mark.parametrize(
    "model", [GPT3, NEOX, LLAMA, MOE, replace(LLAMA, name="qwen2-like", qkv_bias=True)], ids=lambda m: m.name
)
@pytest.mark.parametrize("pp", [1, 2, 4])
def test_stage_params_sum_to_model_params(model, pp):
    plan = Plan(pp=pp)
    total = sum(stage_params(model, plan, i) for i in range(pp))
    assert total == model.params()
    tied = replace(model, tied_embeddings=True)
    copy = tied.embedding_params() if pp > 1 else 0  # Megatron's last-stage embedding copy
    assert sum(stage_params(tied, plan, i) for i in range(pp)) == tied.params() + copy


def test_experts_divide_by_ep():
    one, two = Plan(dp=2), Plan(dp=2, ep=2)
    experts = MOE.layers * MOE.num_experts * MOE.mlp_params(MOE.expert_ffn)
    assert stage_params(MOE, one, 0) - stage_params(MOE, two, 0) == pytest.approx(experts / 2)


# --- whole-GPU properties ----------------------------------------------------------------------

plans = st.builds(
    Plan,
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.sampled_from([1, 2, 4]),
    dp=st.sampled_from([1, 2, 8]),
    sp=st.booleans(),
    zero=st.integers(0, 3),
    micro_batch=st.sampled_from([1, 2]),
    schedule=st.sampled_from(["1f1b", "gpipe"]),
    dtype=st.sampled_from(["bf16", "fp16", "fp32"]),
    attention=st.sampled_from(["flash", "fused", "unfused"]),
).filter(lambda p: p.tp > 1 or not p.sp)  # sequence parallelism needs tensor parallelism


def _with_accum(plan: Plan, accum: int) -> Plan:
    return replace(plan, global_batch=plan.micro_batch * plan.dp * accum)


@settings(max_examples=150, deadline=None)
@given(plan=plans, accum=st.integers(1, 8), model=st.sampled_from([GPT3, NEOX, LLAMA, MOE]))
def test_recompute_never_adds_activations(plan, accum, model):
    plan = _with_accum(plan, accum)
    act = {
        r: [m.activations_bytes for m in memory_per_gpu(model, replace(plan, recompute=r))]
        for r in ("none", "selective", "full")
    }
    for full, sel, none in zip(act["full"], act["selective"], act["none"], strict=True):
        assert 0 < full <= sel * (1 + 1e-12) <= none * (1 + 1e-12)


@settings(max_examples=150, deadline=None)
@given(plan=plans, model=st.sampled_from([GPT3, NEOX, LLAMA, MOE]))
def test_more_tp_never_adds_weights(plan, model):
    tps = [t for t in (1, 2, 4, 8) if model.heads % t == 0 and model.ffn % t == 0]
    plan = replace(plan, sp=False)
    weights = [[m.weights_bytes for m in memory_per_gpu(model, replace(plan, tp=t))] for t in tps]
    for fewer, more in itertools.pairwise(weights):
        assert all(b <= a for a, b in zip(fewer, more, strict=True))


@settings(max_examples=100, deadline=None)
@given(plan=plans, model=st.sampled_from([GPT3, LLAMA, MOE]))
def test_higher_zero_never_adds_model_states(plan, model):
    def states(z: int) -> list[float]:
        ms = memory_per_gpu(model, replace(plan, zero=z))
        return [m.weights_bytes + m.gradients_bytes + m.optimizer_bytes for m in ms]

    for lo, hi in zip(range(3), range(1, 4), strict=True):
        assert all(b <= a for a, b in zip(states(lo), states(hi), strict=True))


def test_gpipe_keeps_more_than_1f1b():
    plan = Plan(tp=8, pp=4, sp=True, global_batch=16)
    f1b, gp = memory_per_gpu(LLAMA, plan), memory_per_gpu(LLAMA, replace(plan, schedule="gpipe"))
    assert all(g.activations_bytes > f.activations_bytes for f, g in zip(f1b, gp, strict=True))


def test_breakdown_peak_and_fits():
    plan = Plan(tp=8, pp=4, dp=2, sp=True, zero=1, global_batch=32)
    stages = memory_per_gpu(LLAMA, plan)
    assert [m.stage for m in stages] == [0, 1, 2, 3]
    peak = peak_memory(LLAMA, plan)
    assert peak.total_bytes == max(m.total_bytes for m in stages)
    d = peak.to_dict()
    assert set(d) == {"stage", "weights_bytes", "gradients_bytes", "optimizer_bytes",
                      "activations_bytes", "buffers_bytes", "phase", "total_bytes"}  # fmt: skip
    assert d["total_bytes"] == pytest.approx(sum(v for k, v in d.items() if k.endswith("_bytes")
                                                 and k != "total_bytes"))  # fmt: skip
    assert fits(LLAMA, plan, peak.total_bytes) == (True, peak)
    assert fits(LLAMA, plan, peak.total_bytes - 1)[0] is False
    # A 175B model without any parallelism does not fit an 80 GB GPU.
    assert fits(GPT3, Plan(), 80e9)[0] is False
    assert isinstance(peak, MemoryBreakdown)


def test_plan_partition_chooses_the_split_everywhere():
    """Plan.partition "001" is GPT-NeoX's split (Eq. 3–5) for stage layers, parameters, memory."""
    from trainsim.builders.llm import resolve_system, stage_costs
    from trainsim.builders.memory import stage_params_split

    even, neox = Plan(pp=4, tp=4, micro_batch=1), Plan(pp=4, tp=4, micro_batch=1, partition="001")
    assert stage_layers(NEOX, neox) == stage_layers_001(NEOX, even) == [11, 12, 11, 10]
    assert stage_layers(NEOX, even) == [11, 11, 11, 11]
    assert [s.layers for s in stage_costs(NEOX, neox, resolve_system("perlmutter"))] == [11, 12, 11, 10]
    assert sum(stage_params_split(NEOX, neox, 1)) > sum(stage_params_split(NEOX, even, 1))
    by_plan = memory_per_gpu(NEOX, neox)
    by_list = memory_per_gpu(NEOX, even, layers_per_stage=[11, 12, 11, 10])
    assert [m.weights_bytes for m in by_plan] == [m.weights_bytes for m in by_list]
    assert neox.label().endswith("-part001") and "part" not in even.label()
    with pytest.raises(ConfigError, match="partition must be one of even, 001"):
        Plan(pp=2, partition="uniform").validate(NEOX)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="not with --schedule interleaved"):
        Plan(pp=4, schedule="interleaved", vpp=2, global_batch=8, partition="001").validate(NEOX)
    with pytest.raises(ConfigError, match="without transformer layers"):
        Plan(pp=4, partition="001").validate(replace(NEOX, layers=4))  # Eq. 5 leaves the last stage 0


def test_first_and_last_stage_layers_as_megatron_core_sets_them():
    """--first/last-stage-layers: the given end stages, the others even (LLaMA 3 405B's 126
    layers on 16 stages: 7 on each end, 8 between), used by memory and the stage costs alike."""
    from trainsim.builders.llm import resolve_system, stage_costs

    m = get_model("llama3-405b")
    meta = Plan(pp=16, tp=8, micro_batch=1, first_stage_layers=7, last_stage_layers=7)
    assert stage_layers(m, meta) == [7, *[8] * 14, 7]
    assert stage_layers(m, replace(meta, first_stage_layers=6, last_stage_layers=8)) == [6, *[8] * 14, 8]
    assert stage_layers(m, replace(meta, first_stage_layers=0, last_stage_layers=6)) == [*[8] * 15, 6]
    # Megatron-core refuses middle layers that do not divide over the middle stages (review:
    # 119 over 15 was accepted and split 8...8, 7)
    with pytest.raises(ConfigError, match="leave 119 of llama3-405b's 126 layers for 15 other stage"):
        replace(meta, first_stage_layers=0).validate(m)
    assert stage_layers(m, replace(meta, first_stage_layers=0, last_stage_layers=0)) == [8] * 14 + [7] * 2
    assert stage_layers(NEOX, Plan(pp=2, first_stage_layers=20, last_stage_layers=24)) == [20, 24]
    assert [s.layers for s in stage_costs(m, meta, resolve_system("dgx-h100"))] == stage_layers(m, meta)
    assert [x.weights_bytes for x in memory_per_gpu(m, meta)] == \
        [x.weights_bytes for x in memory_per_gpu(m, replace(meta, first_stage_layers=0, last_stage_layers=0),
                                                 layers_per_stage=[7, *[8] * 14, 7])]  # fmt: skip
    assert meta.label().endswith("-first7-last7")
    bad = [
        (Plan(pp=1, first_stage_layers=4), "need more pipeline stages"),
        (Plan(pp=2, first_stage_layers=4, last_stage_layers=4), "leave 36 of"),  # 44 layers: 36 unplaced
        (Plan(pp=4, first_stage_layers=40, last_stage_layers=3), "for 2 other stage"),  # 1 left for 2
        (Plan(pp=4, first_stage_layers=7), "leave 37 of"),  # 37 over 3 stages
        (Plan(pp=4, first_stage_layers=-1), "first_stage_layers must be a non-negative integer"),
        (Plan(pp=4, first_stage_layers=8, partition="001"), "not with --partition 001"),
        (Plan(pp=4, first_stage_layers=8, schedule="interleaved", vpp=2, global_batch=8), "--schedule interleaved"),
    ]
    for plan, message in bad:
        with pytest.raises(ConfigError, match=message):
            plan.validate(NEOX)


def test_layers_per_stage_override_and_errors():
    plan = Plan(pp=4)
    neox = memory_per_gpu(NEOX, plan, layers_per_stage=stage_layers_001(NEOX, plan))
    even = memory_per_gpu(NEOX, plan)
    assert neox[1].weights_bytes > even[1].weights_bytes  # 12 layers against 11
    with pytest.raises(ConfigError, match="layers_per_stage"):
        memory_per_gpu(NEOX, plan, layers_per_stage=[11, 11, 11, 10])
    with pytest.raises(ConfigError, match="tp"):
        memory_per_gpu(NEOX, Plan(tp=3))


@pytest.mark.parametrize(("text", "expected"), [
    (None, 0.0), ("0", 0.0), ("0.1", 0.1 * 80 * 2**30), ("10%", 0.1 * 80 * 2**30), (" 12.5 % ", 0.125 * 80 * 2**30),
    ("6GiB", 6 * 2**30), ("6gb", 6e9), ("512MiB", 512 * 2**20), ("500MB", 5e8), (0.25, 20 * 2**30),
])  # fmt: skip
def test_headroom_accepts_fractions_percentages_and_amounts(text, expected):
    got = headroom_bytes(text, 80 * 2**30)
    assert got == pytest.approx(expected) and isinstance(got, int)  # whole bytes (JSON prints no fractions)
    assert headroom_bytes("0.3", 10**9 + 1) == 300_000_001  # rounded up: at least what was asked stays free


def test_sequence_parallelism_needs_tensor_parallelism():
    with pytest.raises(ConfigError, match=r"sequence parallelism .* needs tp > 1, got tp 1"):
        Plan(tp=1, sp=True).validate(NEOX)
    Plan(tp=2, sp=True).validate(NEOX)


@pytest.mark.parametrize(("text", "message"), [
    ("1", "expected a fraction below 1"), ("-0.1", "expected a fraction below 1"), ("120%", "a percentage must be at least 0 and below 100%"),
    ("ten", "expected a fraction"), ("6 TB", "expected a fraction"), ("nan", "expected a fraction"),
    ("80GiB", "below the GPU's 80.0 GiB"), ("-1GiB", "must be at least 0"), ("", "expected a fraction"),
])  # fmt: skip
def test_headroom_rejects_what_is_not_below_the_capacity(text, message):
    with pytest.raises(ConfigError, match=message):
        headroom_bytes(text, 80 * 2**30)
