"""2025 HuggingFace families (hf41): GLM-4.5 MoE (``glm4_moe``), Llama 4 (``llama4_text``,
``llama4``'s text_config), OLMo 3, Seed-OSS, EXAONE 4, ERNIE 4.5 (dense), dots.llm1, Ministral 3.

Their configs, written by transformers' own config classes at the published sizes, read as the
model transformers builds (the same parameters, on the meta device); Llama 4's chunked attention
(``ModelSpec.attention_chunk``) does its share of the causal work, to the token, unsplit and per
context-parallel rank, and is costed as a sliding window is; its weightless L2 q/k norm
(``qk_norm`` l2) adds time on the rotary layers and no parameters; what the operators cannot
express is refused with the file and field; ``--impl hf`` refuses the families (no census), as
it does DeepSeek's."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from tests.test_dense_families import (  # noqa: F401  (hf: a fixture)
    _config,
    _meta_params,
    hf,
    published_reads_as_transformers_builds,
)
from trainsim.builders.costs import LayerCoster, OpCoster
from trainsim.builders.models import read_hf_config
from trainsim.builders.plan import Plan
from trainsim.builders.predict import _warnings, predict_llm
from trainsim.builders.spec import ModelSpec
from trainsim.errors import ConfigError

# GLM-4.5 (zai-org/GLM-4.5 config.json): 355B-A32B; GLM-4.5-Air 106B-A12B; GLM-4.6: GLM-4.5's
# sizes at a 202,752-token context
_GLM45: dict[str, Any] = {
    "hidden_size": 5120, "num_hidden_layers": 92, "num_attention_heads": 96, "num_key_value_heads": 8,
    "head_dim": 128, "intermediate_size": 12288, "moe_intermediate_size": 1536, "n_routed_experts": 160,
    "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "vocab_size": 151552,
    "attention_bias": True, "partial_rotary_factor": 0.5, "use_qk_norm": True, "routed_scaling_factor": 2.5,
    "n_group": 1, "topk_group": 1, "num_nextn_predict_layers": 1, "max_position_embeddings": 131072,
}  # fmt: skip
_GLM45_AIR = {**_GLM45, "hidden_size": 4096, "num_hidden_layers": 46, "intermediate_size": 10944,
              "moe_intermediate_size": 1408, "n_routed_experts": 128, "first_k_dense_replace": 1,
              "use_qk_norm": False, "routed_scaling_factor": 1.0}  # fmt: skip
# Llama 4 Scout (meta-llama/Llama-4-Scout-17B-16E text_config): 16 experts in every layer, q/k
# L2 norms, an 8,192-token pre-training context RoPE-scaled to 10M; Maverick (-17B-128E): 128
# experts on every other layer, no q/k norm
_SCOUT: dict[str, Any] = {
    "hidden_size": 5120, "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8,
    "head_dim": 128, "intermediate_size": 8192, "intermediate_size_mlp": 16384, "vocab_size": 202048,
    "num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "use_qk_norm": True,
    "attention_chunk_size": 8192, "no_rope_layers": [], "max_position_embeddings": 10485760,
    "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}  # fmt: skip
_MAVERICK = {**_SCOUT, "num_local_experts": 128, "interleave_moe_layer_step": 2, "use_qk_norm": False,
             "max_position_embeddings": 1048576, "rope_scaling": None}  # fmt: skip

PUBLISHED: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "glm-4.5": ("Glm4MoeConfig", _GLM45,
                {"num_experts": 160, "top_k": 8, "expert_ffn": 1536, "shared_ffn_hidden": 1536, "dense_layers": (0, 1, 2),
                 "qkv_bias": True, "bias": False, "qk_norm": "head", "rope_fraction": 0.5, "d_head": 128, "n_kv": 8,
                 "mtp_layers": 1, "router_bias": False, "tied_embeddings": False}),
    "glm-4.5-air": ("Glm4MoeConfig", _GLM45_AIR,
                    {"num_experts": 128, "dense_layers": (0,), "qk_norm": "none", "qkv_bias": True, "mtp_layers": 1}),
    "glm-4.6": ("Glm4MoeConfig", {**_GLM45, "max_position_embeddings": 202752}, {"seq_len": 202752}),
    "glm4-moe-defaults": ("Glm4MoeConfig", {"head_dim": 128, "num_nextn_predict_layers": 0},
                          {"num_experts": 128, "dense_layers": (0,), "qkv_bias": False, "mtp_layers": 0}),
    "llama4-scout": ("Llama4TextConfig", _SCOUT,
                     {"num_experts": 16, "top_k": 1, "expert_ffn": 8192, "shared_ffn_hidden": 8192, "dense_layers": (),
                      "qk_norm": "l2", "nope_layers": 12, "attention_chunk": 8192, "chunked_layers": 36,
                      "n_kv": 8, "seq_len": 8192, "tied_embeddings": False, "bias": False}),
    "llama4-maverick": ("Llama4TextConfig", _MAVERICK,
                        {"num_experts": 128, "ffn": 16384, "dense_layers": tuple(range(0, 48, 2)), "qk_norm": "none",
                         "nope_layers": 12, "attention_chunk": 8192, "seq_len": 1048576}),
    "llama4-no-chunks": ("Llama4TextConfig", {**_SCOUT, "num_hidden_layers": 8, "attention_chunk_size": None,
                                              "moe_layers": [1, 5], "no_rope_layers": [1, 0, 1, 1, 0, 1, 1, 1]},
                         {"attention_chunk": 0, "chunked_layers": 0, "dense_layers": (0, 2, 3, 4, 6, 7),
                          "nope_layers": 2}),
    # OLMo 3 (allenai/Olmo-3-1025-7B, -32B): OLMo 2's layer, a 4,096-token window on 3 of 4 layers
    "olmo3-7b": ("Olmo3Config", {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                                 "num_key_value_heads": 32, "intermediate_size": 11008, "vocab_size": 100278,
                                 "max_position_embeddings": 65536, "sliding_window": 4096},
                 {"qk_norm": "full", "sliding_window": 4096, "sliding_layers": 24, "bias": False}),
    "olmo3-32b": ("Olmo3Config", {"hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 40,
                                  "num_key_value_heads": 8, "intermediate_size": 27648, "vocab_size": 100278,
                                  "max_position_embeddings": 65536},
                  {"n_kv": 8, "sliding_window": 4096, "sliding_layers": 48}),
    # Seed-OSS-36B (ByteDance-Seed/Seed-OSS-36B-Base): biases on q/k/v alone
    "seed-oss-36b": ("SeedOssConfig", {"hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 80,
                                       "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 27648,
                                       "vocab_size": 155136},
                     {"qkv_bias": True, "bias": False, "d_head": 128, "n_kv": 8, "seq_len": 524288}),
    # EXAONE 4.0 32B (LGAI-EXAONE/EXAONE-4.0-32B): LLLG windows of 4,096, the global layers NoPE;
    # 1.2B: no window, every layer global and rotary, tied
    "exaone4-32b": ("Exaone4Config", {"hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 40,
                                      "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 27392,
                                      "vocab_size": 102400, "sliding_window": 4096, "sliding_window_pattern": 4,
                                      "max_position_embeddings": 131072},
                    {"qk_norm": "head", "layer_norms": 2, "sliding_window": 4096, "sliding_layers": 48,
                     "nope_layers": 16}),
    "exaone4-1.2b": ("Exaone4Config", {"hidden_size": 2048, "num_hidden_layers": 30, "num_attention_heads": 32,
                                       "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 4096,
                                       "vocab_size": 102400, "sliding_window": None,
                                       "layer_types": ["full_attention"] * 30, "tie_word_embeddings": True,
                                       "max_position_embeddings": 65536},
                     {"sliding_window": 0, "nope_layers": 0, "tied_embeddings": True, "d_head": 64}),
    # ERNIE-4.5-0.3B (baidu/ERNIE-4.5-0.3B-PT): Ernie4_5Config's defaults are its sizes
    "ernie4.5-0.3b": ("Ernie4_5Config", {"hidden_size": 1024, "num_hidden_layers": 18, "num_attention_heads": 16,
                                         "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 3072,
                                         "vocab_size": 103424},
                      {"d_head": 128, "n_kv": 2, "tied_embeddings": True, "bias": False}),
    "ernie4.5-biased": ("Ernie4_5Config", {"use_bias": True}, {"bias": True}),
    # dots.llm1 (rednote-hilab/dots.llm1.base): 142B-A14B, 128 experts top 6, two shared, q/k norms
    "dots.llm1": ("Dots1Config", {"hidden_size": 4096, "num_hidden_layers": 62, "num_attention_heads": 32,
                                  "num_key_value_heads": 32, "intermediate_size": 10944, "moe_intermediate_size": 1408,
                                  "n_routed_experts": 128, "n_shared_experts": 2, "num_experts_per_tok": 6,
                                  "first_k_dense_replace": 1, "vocab_size": 152064, "max_position_embeddings": 32768,
                                  "sliding_window": None},
                  {"num_experts": 128, "top_k": 6, "shared_ffn_hidden": 2816, "dense_layers": (0,), "qk_norm": "head",
                   "sliding_window": 0}),
    # Ministral3Config's defaults (an 8B of 34 layers; YaRN from a 16,384-token pre-training context)
    "ministral3-defaults": ("Ministral3Config", {"hidden_size": 4096, "num_hidden_layers": 34, "num_attention_heads": 32,
                                                 "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 14336,
                                                 "vocab_size": 131072},
                            {"d_head": 128, "n_kv": 8, "seq_len": 16384, "sliding_window": 0}),
}  # fmt: skip


@pytest.mark.parametrize("case", PUBLISHED)
def test_published_sizes_have_transformers_parameter_count(hf, tmp_path, case):  # noqa: F811
    spec, n = published_reads_as_transformers_builds(hf, tmp_path, PUBLISHED[case])
    assert spec.active_params() <= n and (spec.active_params() == n) == (not spec.is_moe)


def _read(tmp_path, doc: dict[str, Any], name: str = "config.json") -> ModelSpec:
    (tmp_path / name).write_text(json.dumps(doc))  # None: null, as the Hub's configs write it
    return read_hf_config(tmp_path / name)


def test_published_totals(tmp_path):
    """The model cards' sizes: GLM-4.5 355B (352.8B and its 4.0B MTP layer) with 32B active,
    GLM-4.5-Air 106B (12B active without the embeddings), Llama 4 Maverick 400B and Scout's
    language model (109B with its vision tower), 17B active each."""
    glm = _read(tmp_path, {"model_type": "glm4_moe", **_GLM45})
    assert glm.trained_params(padded=False) == pytest.approx(355e9, rel=6e-3)
    assert glm.active_params() == pytest.approx(32e9, rel=0.06)
    air = _read(tmp_path, {"model_type": "glm4_moe", **_GLM45_AIR})
    assert air.params(padded=False) == pytest.approx(106e9, rel=0.01)
    assert air.active_params() - 2 * air.vocab * air.hidden == pytest.approx(12e9, rel=0.02)
    for doc, total in ((_MAVERICK, 400e9), (_SCOUT, 107.8e9)):
        m = _read(tmp_path, {"model_type": "llama4_text", **doc})
        assert m.params(padded=False) == pytest.approx(total, rel=2e-3)
        assert m.active_params() == pytest.approx(17e9, rel=0.02)


def test_llama4_reads_the_language_model_of_its_text_config(hf, tmp_path):  # noqa: F811
    """llama4 (multimodal): its text_config is the language model transformers builds; the Hub's
    own form (rope_scaling, ``"no_rope_layers": []``) reads the same, at the pre-training context."""
    torch, transformers = hf
    text = {k: v for k, v in _SCOUT.items() if k != "rope_scaling"}
    config = _config(transformers, "Llama4Config", {"text_config": text})
    config.to_json_file(tmp_path / "config.json")
    spec = read_hf_config(tmp_path / "config.json")
    n = _meta_params(torch, lambda: transformers.Llama4ForCausalLM(config.text_config))
    assert spec.params(padded=False) == n
    assert "vision tower" in spec.left_out
    hub = _read(tmp_path, {"model_type": "llama4", "text_config": {**_SCOUT, "model_type": "llama4_text"},
                           "vision_config": {"model_type": "llama4_vision_model"}}, "hub.json")  # fmt: skip
    assert hub.params(padded=False) == n
    assert (hub.seq_len, hub.nope_layers, hub.chunked_layers) == (8192, 12, 36)


def test_rope_parameters_give_the_pretraining_context(hf, tmp_path):  # noqa: F811
    """transformers 5 writes rope_scaling as rope_parameters: a Llama 3.1 config it writes
    trains at 8,192 tokens as the Hub's does (131,072 before)."""
    _, transformers = hf
    scaling = {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
               "original_max_position_embeddings": 8192, "rope_type": "llama3"}  # fmt: skip
    config = _config(transformers, "LlamaConfig", {"max_position_embeddings": 131072, "rope_scaling": scaling})
    config.to_json_file(tmp_path / "config.json")
    assert "rope_parameters" in json.loads((tmp_path / "config.json").read_text())
    spec = read_hf_config(tmp_path / "config.json")
    assert spec.seq_len == 8192 and spec.seq_source.startswith("rope_parameters.original_max_position_embeddings")


# --- chunked attention -----------------------------------------------------------------------


def _chunked(chunk: int, layers: int = 4, chunked: int = 0) -> ModelSpec:
    return ModelSpec("c", hidden=256, layers=layers, heads=4, vocab=100, position="rotary", attention_chunk=chunk,
                     chunked_layers=chunked)  # fmt: skip


def _keys(positions, chunk: int) -> int:
    """Key products of the queries at ``positions`` under a block-local causal mask, counted."""
    return sum(p % chunk + 1 for p in positions)


@pytest.mark.parametrize(("seq", "chunk"), [(10, 4), (4096, 1000), (8192, 8192), (100, 150), (32768, 8192)])
def test_chunked_layer_share_is_the_masks_share_to_the_token(seq, chunk):
    m = _chunked(chunk)
    assert m.window_layer_share(seq) == pytest.approx(_keys(range(seq), chunk) / (seq * (seq + 1) / 2), rel=1e-12)
    assert m.windowed_layers(seq) == (1.0 if seq > chunk else 0.0)


@pytest.mark.parametrize(("seq", "chunk", "cp"), [(32768, 8192, 2), (32768, 3000, 4), (24, 5, 3), (4096, 8192, 2)])
def test_chunked_cp_rank_shares_count_each_ranks_two_chunks(seq, chunk, cp):
    """The load-balanced split (rank r holds sequence chunks r and 2cp-1-r): each rank's key
    products counted over its positions, over its causal share; they average to the unsplit."""
    m = _chunked(chunk)
    shares = m.cp_window_rank_shares(seq, cp)
    part = seq // (2 * cp)
    if seq <= chunk:
        assert shares == (1.0,) * cp
        return
    for r in range(cp):
        pos = [*range(r * part, (r + 1) * part), *range((2 * cp - 1 - r) * part, (2 * cp - r) * part)]
        assert shares[r] == pytest.approx(_keys(pos, chunk) / (seq * (seq + 1) / (2 * cp)), rel=1e-12)
    assert sum(shares) / cp == pytest.approx(m.window_layer_share(seq), rel=1e-12)


def test_chunked_layers_average_with_the_full_ones():
    m = _chunked(1024, layers=4, chunked=3)
    share = m.window_layer_share(8192)
    assert m.window_work_fraction(8192) == pytest.approx((3 * share + 1) / 4)
    assert m.windowed_layers(8192) == 0.75
    assert m.cp_window_work_fraction(8192, 2) == pytest.approx(0.75 * max(m.cp_window_rank_shares(8192, 2)) + 0.25)


@pytest.mark.parametrize(("kw", "message"), [
    ({"attention_chunk": 8192, "sliding_window": 4096}, "attention_chunk \\(8192\\) and sliding_window"),
    ({"chunked_layers": 2}, "chunked_layers \\(2\\) needs attention_chunk"),
    ({"attention_chunk": 8192, "chunked_layers": 9}, "chunked_layers \\(9\\) and sliding_layers"),
    ({"attention_chunk": -1}, "attention_chunk must be a non-negative integer"),
])  # fmt: skip
def test_modelspec_checks_the_chunk_fields(kw, message):
    with pytest.raises(ConfigError, match=message):
        ModelSpec("c", hidden=256, layers=4, heads=4, vocab=100, position="rotary", **kw)


COSTER = OpCoster("h100-sxm5-80gb")


def _core(model: ModelSpec, plan: Plan) -> float:
    lc = LayerCoster(model, plan, COSTER)
    return sum(o.seconds for o in lc.layer("fwd") if o.name == "flash_attention")


def test_chunked_attention_costs_its_share_of_the_flash_kernel(tmp_path):
    """Scout above its 8,192-token chunk: the attention core at the layers' average share
    (three of four layers chunked); at the chunk or below it, plain causal attention."""
    scout = _read(tmp_path, {"model_type": "llama4_text", **_SCOUT})
    full = replace(scout, attention_chunk=0, chunked_layers=0)
    for seq, frac in ((32768, scout.window_work_fraction(32768)), (8192, 1.0)):
        plan = Plan(tp=4, ep=2, dp=1, micro_batch=1, global_batch=1, seq_len=seq)
        assert _core(scout, plan) == pytest.approx(frac * _core(full, plan), rel=1e-9)
    assert scout.window_work_fraction(32768) == pytest.approx((36 * 0.25 * 32768 / 32769 * 8193 / 8192 + 12) / 48,
                                                              rel=1e-3)  # fmt: skip


def test_l2_qk_norm_has_no_weights_and_runs_on_the_rotary_layers(tmp_path):
    scout = _read(tmp_path, {"model_type": "llama4_text", **_SCOUT})
    plain = replace(scout, qk_norm="none")
    assert scout.params() == plain.params()
    plan = Plan(tp=4, ep=2, dp=1, micro_batch=1, global_batch=1, seq_len=4096)
    lc, head = LayerCoster(scout, plan, COSTER), LayerCoster(replace(scout, qk_norm="head"), plan, COSTER)
    norms = {o.name: o for o in lc.layer("fwd") if o.name in ("q_norm", "k_norm")}
    ref = {o.name: o for o in head.layer("fwd") if o.name in ("q_norm", "k_norm")}
    assert set(norms) == {"q_norm", "k_norm"}
    for k, o in norms.items():
        assert o.seconds == pytest.approx(scout.rope_share * ref[k].seconds) and "rope-on-0.75" in o.provenance
    assert lc._small_tensors() == LayerCoster(plain, plan, COSTER)._small_tensors()


# --- reader errors -----------------------------------------------------------------------------

BAD = [
    ({"model_type": "llama4_text", **_SCOUT, "attention_bias": True}, "field 'attention_bias' is true"),
    ({"model_type": "llama4_text", **_SCOUT, "layer_types": ["sliding_attention"] * 48},
     "field 'layer_types' must list one of chunked_attention, full_attention"),
    ({"model_type": "llama4_text", **_SCOUT, "attention_chunk_size": "8k"}, "field 'attention_chunk_size' must be"),
    ({"model_type": "llama4_text", **_SCOUT, "moe_layers": [1, 48]}, "field 'moe_layers' must list layer indices"),
    ({"model_type": "llama4_text", **_SCOUT, "no_rope_layers": [1, 0]}, "field 'no_rope_layers' must list 0 or 1"),
    ({"model_type": "llama4_text", **_SCOUT, "attention_chunk_size": None, "layer_types": ["chunked_attention"] * 48},
     "'attention_chunk_size' is null"),
    ({"model_type": "llama4", "text_config": {**_SCOUT, "num_local_experts": 0}},
     "field 'num_local_experts' must be a positive integer.*\\(in 'text_config'\\)"),
    ({"model_type": "glm4_moe", **_GLM45, "first_k_dense_replace": 93}, "field 'first_k_dense_replace' is 93"),
    ({"model_type": "glm4_moe", **_GLM45, "use_qk_norm": "yes"}, "field 'use_qk_norm' must be true or false"),
    ({"model_type": "olmo3", **_SCOUT, "attention_bias": True}, "field 'attention_bias' is true and the other"),
    ({"model_type": "seed_oss", **_SCOUT, "attention_out_bias": True}, "field 'attention_out_bias' is true"),
    ({"model_type": "exaone4", **_SCOUT, "sliding_window_pattern": "LLXG"}, "field 'sliding_window_pattern' must"),
    ({"model_type": "exaone4", **_SCOUT, "layer_types": ["chunked_attention"] * 48}, "field 'layer_types' has"),
    ({"model_type": "dots1", **_GLM45, "first_k_dense_replace": 93}, "field 'first_k_dense_replace' is 93"),
    ({"model_type": "glm4_moe", **{k: v for k, v in _GLM45.items() if k != "head_dim"}},
     "hidden 5120 is not divisible by heads 96"),
]  # fmt: skip


@pytest.mark.parametrize(("doc", "message"), BAD, ids=[m[:40] for _, m in BAD])
def test_bad_configs_name_the_file_and_field(tmp_path, doc, message):
    path = tmp_path / "config.json"
    with pytest.raises(ConfigError, match=message) as e:
        _read(tmp_path, doc)
    assert str(e.value).startswith(f"{path}:")
    assert "\n" not in str(e.value)


# --- predict and search --------------------------------------------------------------------------


@pytest.mark.parametrize("doc", [{"model_type": "glm4_moe", **_GLM45_AIR}, {"model_type": "llama4_text", **_SCOUT}],
                         ids=["glm-4.5-air", "llama4-scout"])  # fmt: skip
def test_predict_runs_and_impl_hf_refuses(tmp_path, doc):
    spec = _read(tmp_path, doc)
    plan = Plan(tp=4, ep=8, dp=16, pp=1, micro_batch=1, global_batch=256, seq_len=4096, zero=1, recompute="full")
    r = predict_llm(spec, plan, "dgx-h100", gpus=64, simulate=False)
    assert r.iteration_time_s > 0 and 0 < r.mfu < 1
    with pytest.raises(ConfigError, match="impl 'hf' has a kernel census for") as e:
        predict_llm(spec, replace(plan, impl="hf"), "dgx-h100", gpus=64, simulate=False)
    assert "\n" not in str(e.value)


def test_exaone4_string_pattern_reads_as_its_layer_types(tmp_path):
    """The Hub's "LLLG" (three local layers, one global, repeated) is sliding_window_pattern 4."""
    doc = {"model_type": "exaone4", **PUBLISHED["exaone4-32b"][1]}
    text, number = _read(tmp_path, {**doc, "sliding_window_pattern": "LLLG"}), _read(tmp_path, doc, "int.json")
    assert replace(text, name="", source="") == replace(number, name="", source="")
    assert (text.sliding_layers, text.nope_layers) == (48, 16)


@pytest.mark.parametrize("case", ["olmo3-7b", "seed-oss-36b", "exaone4-32b", "ernie4.5-0.3b", "dots.llm1",
                                  "ministral3-defaults"])  # fmt: skip
def test_predict_runs_for_the_other_families(tmp_path, case):
    cls, kwargs, _ = PUBLISHED[case]
    spec = _read(tmp_path, {"model_type": _TYPES[cls], **kwargs})
    plan = Plan(tp=4, pp=2, dp=8, ep=8 if spec.is_moe else 1, micro_batch=1, global_batch=64, seq_len=8192,
                recompute="full", zero=1)  # fmt: skip
    r = predict_llm(spec, plan, "dgx-h100", gpus=64, simulate=False)
    assert r.iteration_time_s > 0 and 0 < r.mfu < 1
    assert all(m.total_bytes > 0 for m in r.memory)


_TYPES = {"Olmo3Config": "olmo3", "SeedOssConfig": "seed_oss", "Exaone4Config": "exaone4",
          "Ernie4_5Config": "ernie4_5", "Dots1Config": "dots1", "Ministral3Config": "ministral3"}  # fmt: skip


def test_predict_notes_chunked_attention_above_the_chunk(tmp_path):
    scout = _read(tmp_path, {"model_type": "llama4_text", **_SCOUT})
    for seq, cp, said in ((8192, 1, False), (32768, 1, "varlen"), (32768, 2, "KV all-gather CP")):
        plan = Plan(tp=4, ep=8, dp=16 // cp, cp=cp, micro_batch=1, global_batch=256, seq_len=seq, recompute="full")
        r = predict_llm(scout, plan, "dgx-h100", gpus=64, simulate=False)
        notes = [n for n in _warnings(r) if "chunked attention" in n]
        assert bool(notes) == bool(said) and all(said in n for n in notes)


def test_search_ranks_glm45_air_plans_as_predict_does(tmp_path):
    from trainsim.search.llm import search_llm
    from trainsim.search.space import PlanSpace

    spec = _read(tmp_path, {"model_type": "glm4_moe", **_GLM45_AIR})
    space = PlanSpace(gpus=64, global_batch=256, seq_len=4096, tp=(2, 4), pp=(1, 2), ep=(8,), micro_batch=(1,),
                      zero=(1,), recompute=("full",), schedule=("1f1b",), sp=(True,))  # fmt: skip
    r = search_llm(spec, "dgx-h100", space, workers=1, progress=False, top_k=2, simulate_top=2)
    times = [p["iteration_time_s"] for p in r["plans"]]
    assert times == sorted(times) and len(times) == 2
    best = Plan(**r["plans"][0]["plan_fields"])
    assert predict_llm(spec, best, "dgx-h100").iteration_time_s == pytest.approx(times[0], rel=1e-9)
