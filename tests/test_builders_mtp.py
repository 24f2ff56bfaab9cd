"""Multi-token prediction (DeepSeek-V3 §2.2, HF ``num_nextn_predict_layers``): its parameters,
time, memory and FLOPs on the last pipeline stage, and nothing elsewhere."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from typer.testing import CliRunner

from trainsim.builders.costs import LayerCoster, OpCoster
from trainsim.builders.llm import stage_costs
from trainsim.builders.memory import _layer_params_per_gpu, embedding_params_per_gpu, memory_per_gpu
from trainsim.builders.models import get_model
from trainsim.builders.plan import Plan
from trainsim.builders.predict import predict_llm
from trainsim.builders.spec import ModelSpec
from trainsim.errors import ConfigError
from trainsim.hardware import get_device, get_system

H100 = get_system("dgx-h100")
PLAN = Plan(tp=2, pp=4, dp=2, ep=2, global_batch=32)


def _ds(mtp: int = 1, **kw: Any) -> ModelSpec:
    """DeepSeek-V3's shapes on 8 layers (fast), the first three dense, ``mtp`` MTP depths."""
    return replace(get_model("deepseek-v3"), **{"name": "ds3-8", "layers": 8, "dense_layers": (0, 1, 2),
                                                 "mtp_layers": mtp, **kw})  # fmt: skip


def _stage_fields(st: Any) -> tuple[float, ...]:
    return (st.fwd_s, st.bwd_s, st.recompute_s, st.params, st.optimizer_s, st.flops_fwd, st.flops_bwd,
            st.tp_comm_fwd_s, st.tp_comm_bwd_s, *st.ep_comm_s, *st.cp_comm_s)  # fmt: skip


def test_deepseek_v3_parameters_with_its_mtp_module():
    """671.0 B main model (transformers' count, ``params()``, unchanged), 11.6 B of the MTP
    module's own (DeepSeek's README_WEIGHTS: 11.5 B "excluding the shared 0.9B Embedding and
    0.9B output Head"); with the checkpoint's copies of those two, 684.5 B: the 685 B the HF
    model page gives (it also counts the FP8 block scales, one fp32 per 128 x 128 block)."""
    m = get_model("deepseek-v3")
    assert m.params(padded=False) / 1e9 == pytest.approx(671.03, abs=0.01)
    assert m.mtp_params() / 1e9 == pytest.approx(11.5, abs=0.15)
    d = m.hidden
    block = m.mtp_block()
    assert block.is_moe and block == m  # layer 61 is an MoE layer with MLA
    assert m.mtp_params() == block.layer_params() + 2 * d * d + 3 * d  # + eh_proj, enorm, hnorm, final norm
    assert m.trained_params(padded=False) == m.params(padded=False) + m.mtp_params()
    checkpoint = m.trained_params(padded=False) + 2 * m.vocab * d  # embed_tokens and shared_head.head again
    assert checkpoint / 1e9 == pytest.approx(685, abs=0.6)
    assert replace(m, mtp_layers=0).mtp_params() == 0
    with pytest.raises(ConfigError, match="mtp_layers must be a non-negative integer"):
        replace(m, mtp_layers=-1)


def test_mtp_block_is_the_last_layers_kind():
    assert _ds().mtp_block().is_moe
    last_dense = _ds(dense_layers=tuple(range(8)))
    assert not last_dense.mtp_block().is_moe
    assert last_dense.mtp_depth_params() == last_dense.dense_variant().layer_params() + 2 * 7168**2 + 3 * 7168


@pytest.mark.parametrize("plan", [PLAN, replace(PLAN, pp=2, dp=4, ep=4), replace(PLAN, schedule="interleaved", vpp=2),
                                  replace(PLAN, sp=True, recompute="full", global_batch=64)])  # fmt: skip
def test_mtp_adds_time_and_parameters_to_the_last_stage_only(plan):
    with_mtp = stage_costs(_ds(1), plan, H100)
    without = stage_costs(_ds(0), plan, H100)
    for a, b in zip(with_mtp[:-1], without[:-1], strict=True):
        assert _stage_fields(a) == _stage_fields(b)  # bit-identical
    a, b = with_mtp[-1], without[-1]
    assert a.fwd_s > b.fwd_s and a.bwd_s > b.bwd_s and a.params > b.params and a.optimizer_s > b.optimizer_s
    assert a.flops_fwd > b.flops_fwd and a.flops_bwd > b.flops_bwd
    assert a.tp_comm_fwd_s > b.tp_comm_fwd_s and a.ep_comm_s[0] > b.ep_comm_s[0]  # eh_proj's gather, the block's a2a
    assert a.dp_comm_s > b.dp_comm_s
    # Megatron keeps an embedding copy on the last stage for the depths' lookups: its gradient is
    # all-reduced with the first stage's (an untied model had none before)
    assert b.embedding_comm is None and a.embedding_comm is not None and with_mtp[0].embedding_comm is not None
    assert any(o.name == "mtp_eh_proj" for o in a.ops) and not any(o.name.startswith("mtp_") for o in b.ops)
    if plan.recompute == "full":
        assert a.recompute_s > b.recompute_s
    else:
        assert a.recompute_s == b.recompute_s


def test_one_stage_and_more_depths():
    plan = Plan(tp=2, dp=4, ep=4, global_batch=16)
    s0, s1, s2 = (stage_costs(_ds(k), plan, H100)[0] for k in (0, 1, 2))
    assert s0.embedding_comm is s1.embedding_comm is None  # one stage: the embedding is shared in place
    d1, d2 = s1.params - s0.params, s2.params - s0.params
    assert d1 == sum(_layer_params_per_gpu(_ds(), 2, 4)) + 2 * 7168**2 / 2 + 3 * 7168  # no embedding copy with pp 1
    assert d2 == 2 * d1 and s2.fwd_s > s1.fwd_s > s0.fwd_s
    assert s2.fwd_s - s1.fwd_s == pytest.approx(s1.fwd_s - s0.fwd_s, rel=0.05)
    assert s2.flops_fwd - s1.flops_fwd == pytest.approx(s1.flops_fwd - s0.flops_fwd, rel=1e-12)


def test_parameters_on_the_last_stage_as_megatron_lays_them_out():
    m, plan = _ds(1), PLAN
    last = stage_costs(m, plan, H100)[-1].params - stage_costs(_ds(0), plan, H100)[-1].params
    block = sum(_layer_params_per_gpu(m, plan.tp, plan.ep))
    d = m.hidden
    assert last == pytest.approx(block + 2 * d * d / plan.tp + 3 * d + embedding_params_per_gpu(m, plan), rel=1e-12)


def test_mtp_flops_are_the_blocks_projection_and_logits():
    """MFU counts the depths' GEMMs: one layer's, eh_proj's (2d -> d/tp) and the logits'."""
    m, plan = _ds(1), PLAN
    lc = LayerCoster(m, plan, OpCoster(get_device(H100.device)))
    tokens, d, t = plan.micro_batch * m.seq_len, m.hidden, plan.tp
    expect = sum(o.flops for o in lc.layer("fwd")) + 2 * tokens * (d / t) * 2 * d + 2 * tokens * m.padded_vocab(t) / t * d
    got = stage_costs(m, plan, H100)[-1].flops_fwd - stage_costs(_ds(0), plan, H100)[-1].flops_fwd
    assert got == pytest.approx(expect, rel=1e-12)
    r1, r0 = predict_llm(m, plan, H100), predict_llm(_ds(0), plan, H100)
    assert r1.iteration_time_s > r0.iteration_time_s


def test_dense_layers_leave_the_mtp_block_whole():
    """The stage holding dense layers weighs its passes between the MoE and dense variants: the
    MTP depth (an MoE block) must come out the same whatever the dense layers."""
    plan = Plan(tp=2, dp=4, ep=4, global_batch=16, recompute="full")
    deltas = []
    for dense in ((0, 1, 2), ()):
        a, b = stage_costs(_ds(1, dense_layers=dense), plan, H100)[0], stage_costs(_ds(0, dense_layers=dense), plan, H100)[0]
        deltas.append((a.fwd_s - b.fwd_s, a.bwd_s - b.bwd_s, a.recompute_s - b.recompute_s, a.ep_comm_s[0] - b.ep_comm_s[0],
                       a.flops_fwd - b.flops_fwd))  # fmt: skip
    assert all(x > 0 for x in deltas[0])
    assert deltas[0] == pytest.approx(deltas[1], rel=1e-9)


def test_memory_rises_on_the_last_stage_only():
    for plan in (PLAN, replace(PLAN, zero=1, recompute="full"), replace(PLAN, schedule="gpipe")):
        with_mtp, without = memory_per_gpu(_ds(1), plan), memory_per_gpu(_ds(0), plan)
        assert [m.to_dict() for m in with_mtp[:-1]] == [m.to_dict() for m in without[:-1]]
        a, b = with_mtp[-1], without[-1]
        assert a.weights_bytes > b.weights_bytes and a.gradients_bytes > b.gradients_bytes
        assert a.optimizer_bytes > b.optimizer_bytes
        # at least the depth's fp32 logits for the loss, per micro-batch held (all m under GPipe)
        held = plan.grad_accum if plan.schedule == "gpipe" else 1
        logits = 4 * plan.micro_batch * _ds().seq_len * _ds().padded_vocab(plan.tp) / plan.tp
        assert a.activations_bytes - b.activations_bytes > held * logits
        assert a.buffers_bytes == b.buffers_bytes


def test_impl_hf_runs_no_mtp():
    """transformers' DeepSeek-V3 has no MTP module: --impl hf predicts the model without it (a
    LLaMA-shaped model with one MTP depth, as --impl hf takes no MoE model); --impl fused runs it."""
    plan = Plan(dp=8, global_batch=16, impl="hf")
    small = replace(get_model("llama2-7b"), layers=4, mtp_layers=1)
    a = predict_llm(small, plan, H100)
    b = predict_llm(replace(small, mtp_layers=0), plan, H100)
    assert a.iteration_time_s == b.iteration_time_s
    assert [m.to_dict() for m in a.memory] == [m.to_dict() for m in b.memory]
    assert any("not run with --impl hf" in w for w in a.warnings)
    fused = replace(plan, impl="fused")
    assert predict_llm(small, fused, H100).iteration_time_s > predict_llm(replace(small, mtp_layers=0), fused, H100).iteration_time_s


def test_no_mtp_predicts_as_before():
    """mtp_layers 0 is the model without it: the same prediction as a spec that never had the field."""
    spec = get_model("deepseek-v2")
    assert spec.mtp_layers == 0
    plan = Plan(tp=2, pp=4, dp=8, ep=8, zero=1, global_batch=128, recompute="full")
    a = predict_llm(spec, plan, H100).to_dict()
    b = predict_llm(replace(spec, mtp_layers=0), plan, H100).to_dict()
    a.pop("timings_s"), b.pop("timings_s")
    assert a == b
    assert not any("multi-token" in w for w in a["warnings"])


def test_search_screens_and_ranks_an_mtp_model_as_predict_does():
    from trainsim.search.llm import screen_plans, search_llm
    from trainsim.search.space import PlanSpace

    model = _ds(1, layers=4, dense_layers=(0,), num_experts=16, top_k=2)
    space = PlanSpace(gpus=8, global_batch=16, tp=(1, 2), pp=(1, 2), micro_batch=(1,), zero=(0, 1),
                      recompute=("none", "full"), schedule=("1f1b",), ep=(1, 2))  # fmt: skip
    plans = [p for p, _ in space.plans(model, 8) if p is not None]
    assert len(plans) >= 8
    for s in screen_plans(model, H100, list(enumerate(plans))):
        r = predict_llm(model, plans[s.index], H100, simulate=False)
        assert s.closed_form_s == pytest.approx(r.iteration_time_s, rel=1e-12)
        assert s.memory_bytes == pytest.approx(r.peak_memory.total_bytes, rel=1e-12)
    r = search_llm(model, H100, space, workers=1, progress=False, top_k=4, simulate_top=4)
    times = [p["iteration_time_s"] for p in r["plans"]]
    assert times == sorted(times) and len(times) == 4
    for p in r["plans"]:
        plan = Plan(**p["plan_fields"])
        assert predict_llm(model, plan, H100).iteration_time_s == pytest.approx(p["iteration_time_s"], rel=1e-9)
        # and the MTP depth is in it
        assert predict_llm(replace(model, mtp_layers=0), plan, H100).iteration_time_s < p["iteration_time_s"]


def test_predict_on_a_config_with_num_nextn_predict_layers(tmp_path):
    from trainsim.cli.main import _register, app

    _register()
    doc = {"model_type": "deepseek_v3", "hidden_size": 2048, "num_hidden_layers": 4, "num_attention_heads": 16,
           "num_key_value_heads": 16, "intermediate_size": 8192, "moe_intermediate_size": 1024,
           "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
           "q_lora_rank": 768, "kv_lora_rank": 256, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
           "v_head_dim": 64, "vocab_size": 32000, "max_position_embeddings": 2048, "tie_word_embeddings": False}  # fmt: skip
    out = {}
    for k in (0, 1):
        folder = tmp_path / str(k)
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**doc, "num_nextn_predict_layers": k}))
        res = CliRunner().invoke(app, ["predict", str(folder / "config.json"), "--system", "dgx-h100", "--gpus", "8",
                                       "--pp", "2", "--ep", "2", "--global-batch", "16", "--format", "json"])  # fmt: skip
        assert res.exit_code == 0, res.output
        out[k] = json.loads(res.stdout)
    assert out[1]["iteration_time_s"] > out[0]["iteration_time_s"]
    assert out[1]["stages"][0]["params"] == out[0]["stages"][0]["params"]
    assert out[1]["stages"][1]["params"] > out[0]["stages"][1]["params"]
    assert out[1]["memory_per_stage_bytes"][1] > out[0]["memory_per_stage_bytes"][1]
    assert any("multi-token-prediction depth(s)" in w for w in out[1]["warnings"])
    assert not any("multi-token" in w for w in out[0]["warnings"])


def test_mtp_blocks_zero3_gathers_stretch_the_compute_under_contention():
    """The MTP block's prefetched ZeRO-3 gathers stretch the compute they hide behind, as the
    layers' do (builders/contention.py); they had been free beside it (merge of the two)."""
    from trainsim.builders.costs import HOST
    from trainsim.builders.llm import _mtp_costs

    m = _ds()
    plan = replace(PLAN, zero=3, recompute="full")
    coster = OpCoster(get_device(H100.device))
    on = _mtp_costs(m, plan, H100, coster, HOST, block=m.mtp_block(), depths=1, tp_shares=True)
    off = _mtp_costs(m, replace(plan, contention=False), H100, coster, HOST, block=m.mtp_block(), depths=1,
                     tp_shares=True)  # fmt: skip
    assert on.zero3[0] >= off.zero3[0] and on.zero3[1] >= off.zero3[1]
    assert on.zero3 != off.zero3


def test_models_lists_the_mtp_parameters_beside_the_main_model() -> None:
    """`trainsim models` gave DeepSeek-V3's 671.03 B alone (review finding: MTP's 11.6 B left out)."""
    from trainsim.cli.main import _register, app

    _register()
    res = CliRunner().invoke(app, ["models", "--format", "json"])
    assert res.exit_code == 0, res.output
    (ds,) = [m for m in json.loads(res.stdout)["models"] if m["name"] == "deepseek-v3"]
    assert ds["mtp_layers"] == 1 and ds["mtp_params"] == get_model("deepseek-v3").mtp_params()
    table = CliRunner().invoke(app, ["models"])
    assert "671.03 B +11.6 B MTP" in table.output
