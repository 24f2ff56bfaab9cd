"""MoE families beyond Mixtral: Qwen2-MoE, Qwen3-MoE, gpt-oss, DeepSeek-V2/V3 (readers, parameter
counts against transformers' models, the builder's shared experts, dense layers and MLA)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from typer.testing import CliRunner

from trainsim.builders.costs import LayerCoster, OpCoster
from trainsim.builders.llm import stage_costs
from trainsim.builders.memory import memory_per_gpu, stage_dense_layers, stage_params
from trainsim.builders.models import get_model, hf_config_from_dict, read_hf_config
from trainsim.builders.plan import Plan
from trainsim.builders.predict import predict_llm
from trainsim.builders.spec import ModelSpec
from trainsim.errors import ConfigError
from trainsim.hardware import get_system

NEW = (
    "qwen3-30b-a3b",
    "qwen1.5-moe-a2.7b",
    "gpt-oss-20b",
    "gpt-oss-120b",
    "deepseek-v3",
    "deepseek-v2",
)


@pytest.fixture(scope="module")
def hf() -> Iterator[tuple[ModuleType, ModuleType]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        torch = pytest.importorskip("torch")
        transformers = pytest.importorskip("transformers")
        yield torch, transformers


def _meta_params(
    torch: ModuleType, transformers: ModuleType, model_type: str, fields: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    """The parameter count of transformers' model of ``model_type`` built on the meta device, and
    its config as the dict a config.json holds; skips where this transformers lacks the family."""
    try:
        cfg = transformers.AutoConfig.for_model(model_type, **fields)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(cfg)
    except (ValueError, KeyError, ImportError) as e:  # an older transformers without the family
        pytest.skip(f"transformers cannot build {model_type}: {e}")
    return sum(p.numel() for p in model.parameters()), cfg.to_dict()


_SMALL = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "vocab_size": 100,
    "max_position_embeddings": 64,
}
# model type -> small config fields (non-trivial dense-layer patterns, shared experts, MLA with and
# without a q latent), and the spec attributes expected
SMALL: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "qwen3_moe": ("qwen3_moe", {**_SMALL, "num_hidden_layers": 4, "num_key_value_heads": 2, "head_dim": 16,
                                "intermediate_size": 96, "moe_intermediate_size": 32, "num_experts": 4,
                                "num_experts_per_tok": 2, "mlp_only_layers": [0], "decoder_sparse_step": 2},
                  {"qk_norm": "head", "dense_layers": (0, 2), "num_experts": 4, "top_k": 2, "expert_ffn": 32}),
    "qwen2_moe": ("qwen2_moe", {**_SMALL, "num_hidden_layers": 3, "num_key_value_heads": 2, "intermediate_size": 96,
                                "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48, "num_experts": 4,
                                "num_experts_per_tok": 2, "mlp_only_layers": [1]},
                  {"qkv_bias": True, "shared_ffn_hidden": 48, "shared_expert_gate": True, "dense_layers": (1,)}),
    "gpt_oss": ("gpt_oss", {**_SMALL, "num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 16,
                            "intermediate_size": 32, "num_local_experts": 4, "num_experts_per_tok": 2},
                {"bias": True, "router_bias": True, "attention_sinks": True, "d_head": 16, "n_kv": 2}),
    "deepseek_v3": ("deepseek_v3", {**_SMALL, "num_hidden_layers": 3, "num_key_value_heads": 4, "intermediate_size": 96,
                                    "moe_intermediate_size": 32, "n_routed_experts": 8, "n_shared_experts": 2,
                                    "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1,
                                    "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
                                    "qk_rope_head_dim": 4, "v_head_dim": 12},
                    {"mla": True, "d_head": 12, "v_dim": 12, "shared_ffn_hidden": 64, "dense_layers": (0,)}),
    "deepseek_v2-no-q-latent": ("deepseek_v2", {**_SMALL, "num_hidden_layers": 3, "num_key_value_heads": 4,
                                                "intermediate_size": 96, "moe_intermediate_size": 32,
                                                "n_routed_experts": 8, "n_shared_experts": 2, "num_experts_per_tok": 2,
                                                "first_k_dense_replace": 2, "q_lora_rank": None, "kv_lora_rank": 16,
                                                "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 16},
                                {"q_lora_rank": 0, "v_dim": 16, "core_head_dim": 14, "dense_layers": (0, 1)}),
}  # fmt: skip


@pytest.mark.parametrize("case", SMALL)
def test_small_configs_have_the_hf_models_parameter_count(hf, tmp_path, case):
    torch, transformers = hf
    model_type, fields, expected = SMALL[case]
    count, doc = _meta_params(torch, transformers, model_type, fields)
    (tmp_path / "config.json").write_text(json.dumps(doc))
    spec = read_hf_config(tmp_path / "config.json")
    assert {k: getattr(spec, k) for k in expected} == expected
    assert spec.params(padded=False) == count


# catalog entry -> (model type, the HF config fields that differ from the entry's shape fields)
def _hf_fields(spec: ModelSpec) -> tuple[str, dict[str, Any]]:
    common = {"hidden_size": spec.hidden, "num_hidden_layers": spec.layers, "num_attention_heads": spec.heads,
              "num_key_value_heads": spec.n_kv, "intermediate_size": spec.ffn, "vocab_size": spec.vocab,
              "max_position_embeddings": spec.seq_len, "num_experts_per_tok": spec.top_k}  # fmt: skip
    if spec.mla:
        return ("deepseek_v3" if spec.name == "deepseek-v3" else "deepseek_v2"), {
            **common, "moe_intermediate_size": spec.expert_ffn, "n_routed_experts": spec.num_experts,
            "n_shared_experts": spec.shared_ffn_hidden // spec.expert_ffn, "first_k_dense_replace": len(spec.dense_layers),
            "q_lora_rank": spec.q_lora_rank, "kv_lora_rank": spec.kv_lora_rank,
            "qk_nope_head_dim": spec.d_head - spec.qk_rope_head_dim, "qk_rope_head_dim": spec.qk_rope_head_dim,
            "v_head_dim": spec.v_dim, "n_group": 8, "topk_group": 4,
            "num_nextn_predict_layers": spec.mtp_layers}  # fmt: skip
    if spec.attention_sinks:
        return "gpt_oss", {**common, "head_dim": spec.d_head, "num_local_experts": spec.num_experts,
                           "sliding_window": spec.sliding_window}  # fmt: skip
    moe = {
        **common,
        "head_dim": spec.d_head,
        "num_experts": spec.num_experts,
        "moe_intermediate_size": spec.expert_ffn,
    }
    if spec.shared_ffn_hidden:
        return "qwen2_moe", {**moe, "shared_expert_intermediate_size": spec.shared_ffn_hidden}
    return "qwen3_moe", moe


@pytest.mark.parametrize("name", NEW)
def test_catalog_entries_agree_with_transformers(hf, tmp_path, name):
    """Each entry written as its HF config reads back as the entry, and transformers' model of it
    (meta device) has the entry's unpadded parameter count."""
    torch, transformers = hf
    spec = get_model(name)
    model_type, fields = _hf_fields(spec)
    count, doc = _meta_params(torch, transformers, model_type, fields)
    (tmp_path / "config.json").write_text(json.dumps(doc))
    read = read_hf_config(tmp_path / "config.json")
    assert replace(read, name=spec.name, source="catalog") == spec
    assert spec.params(padded=False) == count


# published totals / active (billions, rounded as published): DeepSeek-V3 report (671B / 37B,
# the MTP module apart), Qwen3 report Table 1 (30.5B / 3.3B), gpt-oss model card (20.9B / 3.61B and
# 116.8B / 5.13B active, the embedding excluded from active), DeepSeek-V2 paper (236B / 21B),
# Qwen1.5-MoE-A2.7B model card (14.3B / 2.7B)
PUBLISHED = {"deepseek-v3": (671.0, 37.0), "qwen3-30b-a3b": (30.5, 3.3), "gpt-oss-20b": (20.9, None),
             "gpt-oss-120b": (116.8, None), "deepseek-v2": (236.0, 21.0), "qwen1.5-moe-a2.7b": (14.3, 2.7)}  # fmt: skip


@pytest.mark.parametrize("name", PUBLISHED)
def test_published_sizes(name):
    total, active = PUBLISHED[name]
    m = get_model(name)
    assert m.params(padded=False) / 1e9 == pytest.approx(total, rel=0.01)
    if active is not None:
        assert m.active_params() / 1e9 == pytest.approx(active, rel=0.03)
    else:  # the card's active counts leave out the embedding (the unembedding counts)
        card = {"gpt-oss-20b": 3.61, "gpt-oss-120b": 5.13}[name]
        assert (m.active_params() - m.vocab * m.hidden) / 1e9 == pytest.approx(card, rel=0.01)


@pytest.mark.parametrize(("model_type", "cls"), [("qwen3_moe", "Qwen3MoeConfig"), ("qwen2_moe", "Qwen2MoeConfig"),
                                                 ("gpt_oss", "GptOssConfig")])  # fmt: skip
def test_missing_kv_heads_default_as_transformers_does(hf, tmp_path, model_type, cls):
    _, transformers = hf
    if not hasattr(transformers, cls):
        pytest.skip(f"transformers has no {cls}")
    fields = {"hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 64, "intermediate_size": 2048,
              "vocab_size": 1000, "max_position_embeddings": 128, "num_experts_per_tok": 2}  # fmt: skip
    expected = getattr(transformers, cls)(**fields).num_key_value_heads
    doc = {
        "model_type": model_type,
        **fields,
        "num_experts": 4,
        "num_local_experts": 4,
        "moe_intermediate_size": 64,
    }
    p = tmp_path / "config.json"
    p.write_text(json.dumps(doc))
    assert read_hf_config(p).n_kv == expected


_DS = {"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
       "intermediate_size": 96, "moe_intermediate_size": 32, "n_routed_experts": 8, "n_shared_experts": 1,
       "num_experts_per_tok": 2, "first_k_dense_replace": 1, "q_lora_rank": 24, "kv_lora_rank": 16,
       "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 12, "vocab_size": 100,
       "max_position_embeddings": 64}  # fmt: skip
_QW = {"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
       "intermediate_size": 96, "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2,
       "vocab_size": 100, "max_position_embeddings": 64}  # fmt: skip


@pytest.mark.parametrize(("doc", "message"), [
    ({**_DS, "n_routed_experts": None}, "missing field 'n_routed_experts'"),
    ({k: v for k, v in _DS.items() if k != "kv_lora_rank"}, "missing field 'kv_lora_rank'"),
    ({**_DS, "first_k_dense_replace": 9}, "field 'first_k_dense_replace' is 9, more than the 3 layers"),
    ({**_DS, "n_shared_experts": -1}, "field 'n_shared_experts' must be a non-negative integer"),
    ({**_DS, "qk_rope_head_dim": "64"}, "field 'qk_rope_head_dim' must be a positive integer"),
    ({**_QW, "mlp_only_layers": "0"}, "field 'mlp_only_layers' must be a list of layer indices"),
    ({**_QW, "moe_intermediate_size": 0}, "field 'moe_intermediate_size' must be a positive integer"),
    ({**_QW, "decoder_sparse_step": 0}, "field 'decoder_sparse_step' must be a positive integer"),
    ({**_QW, "model_type": "qwen3_moe", "num_experts": None}, "missing field 'num_experts' (or 'num_local_experts')"),
    ({**_QW, "model_type": "gpt_oss"}, "missing field 'num_local_experts'"),
    # an index outside the model (transformers never matches it: read as all-MoE, silently)
    ({**_QW, "mlp_only_layers": [0, 5]}, "field 'mlp_only_layers' lists layer(s) 5, outside the 2 layers"),
    ({**_QW, "mlp_only_layers": [-1]}, "field 'mlp_only_layers' lists layer(s) -1, outside the 2 layers"),
    ({**_DS, "moe_layer_freq": 0}, "field 'moe_layer_freq' must be a positive integer"),
    # ModelSpec's own checks name the config.json fields they read (they named its own fields alone)
    ({**_QW, "num_key_value_heads": 3},
     "heads 4 is not a multiple of kv_heads 3 (config.json fields: num_attention_heads 4, num_key_value_heads 3)"),
    ({**_DS, "num_experts_per_tok": 9},
     "top_k must be in 1..num_experts (8), got 9 (config.json fields: num_experts_per_tok 9, n_routed_experts 8)"),
])  # fmt: skip
def test_bad_configs_name_the_file_and_field(tmp_path, doc, message):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=re.escape(str(p)) + ".*" + re.escape(message)):
        read_hf_config(p)


def test_yaml_spec_takes_dense_layers_as_a_list(tmp_path):
    p = tmp_path / "m.yaml"
    base = ("name: x\nhidden: 64\nlayers: 4\nheads: 4\nvocab: 100\nactivation: swiglu\nnum_experts: 4\ntop_k: 2\n"
            "moe_ffn_hidden: 32\nffn_hidden: 96\n")  # fmt: skip
    p.write_text(base + "dense_layers: [0, 1]\nshared_ffn_hidden: 32\n")
    m = get_model(p)
    assert (m.dense_layers, m.moe_layers) == ((0, 1), 2)
    for text, msg in (
        ("dense_layers: 0\n", "field 'dense_layers' must be a list of layer indices"),
        (
            "dense_layers: [3, 4]\n",
            "dense_layers must be distinct increasing layer indices in 0..3",
        ),
    ):
        p.write_text(base + text)
        with pytest.raises(ConfigError, match=re.escape(f"{p}: ") + ".*" + re.escape(msg)):
            get_model(p)


# --- the builder ------------------------------------------------------------------------------

H100 = "dgx-h100"
PLAN = Plan(tp=2, pp=2, dp=2, ep=2, global_batch=16)


def _small_ds(**kw: Any) -> ModelSpec:
    """DeepSeek-V2's shapes on 8 layers (fast), the first three dense."""
    return replace(
        get_model("deepseek-v2"), **{"name": "ds-8", "layers": 8, "dense_layers": (0, 1, 2), **kw}
    )


def test_more_shared_expert_width_takes_more_time_and_memory():
    times, mems = [], []
    for shared in (0, 1536, 3072, 6144):
        r = predict_llm(_small_ds(shared_ffn_hidden=shared), PLAN, H100)
        times.append(r.iteration_time_s)
        mems.append(r.peak_memory.total_bytes)
    assert times == sorted(times) and len(set(times)) == 4
    assert mems == sorted(mems) and len(set(mems)) == 4


def test_dense_first_layers_are_costed_as_dense_layers():
    """More leading dense layers of a larger intermediate size: more time on the stage holding
    them; a model whose every layer is dense predicts exactly as its dense variant."""
    times = {}
    for k in (0, 2, 4):
        for f in (6144, 24576):
            st = stage_costs(
                _small_ds(dense_layers=tuple(range(k)), ffn_hidden=f), PLAN, get_system(H100)
            )
            times[k, f] = st[0].fwd_s + st[0].bwd_s
    assert times[0, 6144] == times[0, 24576]  # no dense layer: the dense width is nowhere
    assert times[2, 24576] > times[2, 6144] and times[4, 24576] > times[4, 6144]
    assert times[4, 24576] - times[4, 6144] > times[2, 24576] - times[2, 6144]
    every = _small_ds(dense_layers=tuple(range(8)))
    for plan in (Plan(tp=2, pp=2, dp=2, global_batch=16, zero=1, overlap_grad_reduce=True, recompute="full"),
                 Plan(tp=2, pp=2, dp=2, global_batch=16, zero=3, sp=True, recompute="selective")):  # fmt: skip
        a, b = predict_llm(every, plan, H100), predict_llm(every.dense_variant(), plan, H100)
        assert a.iteration_time_s == b.iteration_time_s
        assert a.peak_memory.total_bytes == b.peak_memory.total_bytes


def test_dense_layers_are_placed_on_their_stages():
    m = _small_ds()
    assert stage_dense_layers(m, Plan(tp=1, pp=2, global_batch=8)) == [3, 0]
    # interleaved: chunks of two layers, chunk c on stage c mod 2 -> layers 0,1 | 2,3 | ...
    assert stage_dense_layers(
        m, Plan(tp=1, pp=2, global_batch=8, schedule="interleaved", vpp=2)
    ) == [2, 1]
    uneven = Plan(tp=1, pp=4, global_batch=8, first_stage_layers=1, last_stage_layers=1)
    assert stage_dense_layers(m, uneven) == [1, 2, 0, 0]
    for plan in (
        Plan(tp=1, pp=2, global_batch=8),
        Plan(tp=1, pp=2, global_batch=8, schedule="interleaved", vpp=2),
        uneven,
    ):
        assert sum(stage_params(m, plan, s) for s in range(plan.pp)) == m.params()
    # the stage with the dense layers holds their MLPs, not experts
    two = Plan(tp=1, pp=2, global_batch=8)
    assert stage_params(m, two, 0) < stage_params(m, two, 1)


def test_stage_costs_hold_each_stages_own_parameters():
    """Middle stages of equal depth share their passes, not their parameters when only some
    hold dense layers (layers 2-3 of 8 on 4 stages: stage 1 only)."""
    m = _small_ds(dense_layers=(2, 3))
    plan = Plan(tp=1, pp=4, dp=2, ep=2, global_batch=16, zero=1, overlap_grad_reduce=True)
    stages = stage_costs(m, plan, get_system(H100))
    assert stage_dense_layers(m, plan) == [0, 2, 0, 0]
    assert [st.params for st in stages] == [stage_params(m, plan, s) for s in range(4)]
    assert stages[1].params < stages[2].params and stages[1].fwd_s != stages[2].fwd_s


def test_expert_parallelism_splits_only_the_routed_experts():
    m = get_model("deepseek-v3")
    w = {
        ep: memory_per_gpu(m, Plan(tp=1, pp=16, dp=64, ep=ep, global_batch=1024))[5].weights_bytes
        for ep in (8, 64)
    }
    dense, expert = (
        (m.layer_params() - m.num_experts * m.mlp_params(m.expert_ffn)),
        m.num_experts * m.mlp_params(m.expert_ffn),
    )
    per_layer_saved = expert * (1 / 8 - 1 / 64) * 2  # bf16 weights
    assert w[8] - w[64] == pytest.approx(
        4 * per_layer_saved, rel=1e-9
    )  # a middle stage: 4 MoE layers
    assert dense > 0


def test_mla_projections_and_tp_split_heads():
    m = get_model("deepseek-v3")
    c = OpCoster("h100-sxm5-80gb")
    plans = {t: Plan(tp=t, global_batch=8, attention="flash") for t in (1, 4)}
    ops = {t: {o.name: o for o in LayerCoster(m, p, c).layer("fwd")} for t, p in plans.items()}
    tokens = 4096
    d, h = m.hidden, m.heads
    assert ops[1]["qkv_proj"].flops == 2 * tokens * d * (1536 + 512 + 64)
    assert (
        ops[4]["qkv_proj"].flops == ops[1]["qkv_proj"].flops
    )  # the down projections are replicated
    assert ops[1]["q_up_proj"].flops == 2 * tokens * 1536 * h * 192
    assert ops[1]["kv_up_proj"].flops == 2 * tokens * 512 * h * (128 + 128)
    assert ops[1]["out_proj"].flops == 2 * tokens * h * 128 * d
    for name in ("q_up_proj", "kv_up_proj", "out_proj"):
        assert ops[4][name].flops == ops[1][name].flops / 4  # heads split over TP
    # the attention core: scores over d_qk 192, values over d_v 128
    assert ops[1]["flash_attention"].flops == 2 * tokens * 4096 * (192 + 128) * h


def test_shared_expert_ops_sit_beside_the_routed_ones_and_ignore_ep():
    m = get_model("qwen1.5-moe-a2.7b")
    c = OpCoster("h100-sxm5-80gb")
    names = {ep: {o.name: o for o in LayerCoster(m, Plan(tp=1, dp=4, ep=ep, global_batch=8), c).layer("fwd")}
             for ep in (1, 4)}  # fmt: skip
    for ep in (1, 4):
        assert {"shared_up", "shared_down", "mlp_up", "router"} <= set(names[ep])
        assert names[ep]["shared_up"].flops == 2 * 8192 * 2 * 5632 * m.hidden
    assert names[1]["shared_up"].seconds == names[4]["shared_up"].seconds
    assert names[4]["router"].flops == 2 * 8192 * (60 + 1) * m.hidden  # the sigmoid gate's column


def test_predict_notes_what_is_not_modelled_once():
    notes = predict_llm(
        get_model("deepseek-v3"), Plan(tp=2, pp=8, dp=32, ep=32, global_batch=512), H100
    ).warnings
    mine = [n for n in notes if n.startswith("not modelled for deepseek-v3")]
    assert len(mine) == 1 and "multi-token-prediction" not in mine[0]  # modelled since 2026-12-03
    assert sum("multi-token-prediction depth(s)" in n and "run on the last pipeline stage" in n for n in notes) == 1
    oss = predict_llm(
        get_model("gpt-oss-20b"), Plan(tp=1, dp=8, ep=8, global_batch=64), H100
    ).warnings
    assert any("attention sinks" in n for n in oss)
    # the window is on every other layer: the window note counts them (12 of 24)
    assert any("sliding window (128 tokens on 12 of its 24 layers)" in n for n in oss)


def test_gpt_oss_config_reads_its_window_layers(tmp_path):
    from trainsim.builders.models import hf_config_from_dict

    doc = {"model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 6, "num_attention_heads": 64,
           "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880, "vocab_size": 201088,
           "num_local_experts": 32, "num_experts_per_tok": 4, "sliding_window": 128,
           "max_position_embeddings": 4096}  # fmt: skip
    assert hf_config_from_dict(doc, tmp_path / "config.json").sliding_layers == 3  # layers 0, 2, 4
    types = ["full_attention"] * 5 + ["sliding_attention"]
    assert hf_config_from_dict({**doc, "layer_types": types}, tmp_path / "config.json").sliding_layers == 1


@pytest.mark.parametrize("name", NEW)
def test_cli_predict_and_search_run_on_each_new_entry(name):
    from trainsim.cli.main import _register, app

    _register()
    big = name in ("deepseek-v3", "deepseek-v2", "gpt-oss-120b")
    gpus, gb = ("256", "256") if big else ("16", "64")
    pred = CliRunner().invoke(app, ["predict", name, "--system", H100, "--gpus", gpus, "--tp", "2", "--pp", "4",
                                    "--ep", "8" if big else "2", "--global-batch", gb, "--format", "json"])  # fmt: skip
    assert pred.exit_code == 0, pred.output
    doc = json.loads(pred.stdout)
    assert doc["iteration_time_s"] > 0 and 0 < doc["mfu"] < 1
    # (ep 16: DeepSeek-V3's last stage holds its MTP depth too, 81 GiB at pp 8, ep 8)
    res = CliRunner().invoke(app, ["search", name, "--system", H100, "--gpus", gpus, "--global-batch", gb,
                                   "--tp", "2", "--pp", "4,8", "--ep", "1,8,16", "--micro-batch", "1", "--zero", "1",
                                   "--recompute", "full", "--schedule", "1f1b", "--workers", "1",
                                   "--simulate-top", "2", "--format", "json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["plans"]


def test_hf_config_dict_of_the_catalog_entry_reads_back(tmp_path):
    """No transformers needed: a DeepSeek-V3 config.json as published reads as the catalog entry."""
    doc = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
           "num_key_value_heads": 128, "intermediate_size": 18432, "moe_intermediate_size": 2048,
           "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
           "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
           "v_head_dim": 128, "vocab_size": 129280, "max_position_embeddings": 4096, "num_nextn_predict_layers": 1,
           "tie_word_embeddings": False}  # fmt: skip
    spec = hf_config_from_dict(doc, Path(tmp_path / "config.json"))
    assert replace(spec, name="deepseek-v3", source="catalog") == get_model("deepseek-v3")
    # and `trainsim predict path/to/config.json` predicts it as the catalog entry
    from trainsim.cli.main import _register, app

    _register()
    (tmp_path / "config.json").write_text(json.dumps(doc))
    args = ["--system", H100, "--gpus", "1024", "--tp", "2", "--pp", "16", "--ep", "32", "--zero", "1",
            "--global-batch", "1024", "--closed-form", "--format", "json"]  # fmt: skip
    by_path = CliRunner().invoke(app, ["predict", str(tmp_path / "config.json"), *args])
    by_name = CliRunner().invoke(app, ["predict", "deepseek-v3", *args])
    assert by_path.exit_code == 0, by_path.output
    assert (
        json.loads(by_path.stdout)["iteration_time_s"]
        == json.loads(by_name.stdout)["iteration_time_s"]
    )


def test_deepseek_moe_layer_freq_makes_the_layers_it_skips_dense(hf, tmp_path):
    """moe_layer_freq 2: from first_k_dense_replace on, only the even layers are MoE, as
    DeepSeek's modeling code (the checkpoints' auto_map) builds them; it had been ignored, every
    layer from there read as MoE (DeepSeek-V3 at freq 2: 671.0B read, 354.2B built). 1, every
    published config's value, is unchanged."""
    doc = {**_DS, "num_hidden_layers": 7, "first_k_dense_replace": 1, "moe_layer_freq": 2}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(doc))
    spec = read_hf_config(p)
    assert spec.dense_layers == (0, 1, 3, 5) and spec.moe_layers == 3
    p.write_text(json.dumps({**doc, "moe_layer_freq": 1}))
    assert read_hf_config(p).dense_layers == (0,)
    # the count of a model built that way: transformers' model with those layers dense
    torch, transformers = hf
    count, _ = _meta_params(torch, transformers, "deepseek_v3", {k: v for k, v in doc.items() if k != "model_type"})
    dense_mlp = 3 * doc["hidden_size"] * doc["intermediate_size"]
    moe_mlp = (doc["n_routed_experts"] + doc["n_shared_experts"]) * 3 * doc["hidden_size"] * doc["moe_intermediate_size"]
    router = doc["n_routed_experts"] * doc["hidden_size"]  # its score-correction bias is a buffer
    moved = 3 * (moe_mlp + router - dense_mlp)  # layers 2, 4, 6 here MoE there (transformers ignores the field)
    assert spec.params(padded=False) == count - moved


@pytest.mark.parametrize(("alias", "name"), [
    ("deepseek-ai/DeepSeek-R1", "deepseek-v3"), ("deepseek-ai/DeepSeek-V3-0324", "deepseek-v3"),
    ("deepseek-ai/DeepSeek-V2-Chat", "deepseek-v2"), ("Qwen/Qwen1.5-MoE-A2.7B-Chat", "qwen1.5-moe-a2.7b"),
    ("google/gemma-2-9b-it", "gemma2-9b"), ("google/gemma-3-12b-it", "gemma3-12b"),
    ("allenai/OLMo-2-1124-7B-Instruct", "olmo2-7b"), ("tiiuae/falcon-7b-instruct", "falcon-7b"),
    ("tiiuae/falcon-40b-instruct", "falcon-40b"),
])  # fmt: skip
def test_checkpoints_of_the_same_config_resolve_to_the_entry(alias, name):
    """The Hub's instruction-tuned and later checkpoints of an entry's very config (same shapes)
    are its aliases: `trainsim predict deepseek-ai/DeepSeek-R1` needs no config.json."""
    assert get_model(alias) is get_model(name)
