"""Dense HuggingFace families beyond LLaMA (Qwen3, Phi-3, OLMo 2, Gemma 2/3, Falcon, StarCoder2):
their configs read at the published sizes give transformers' exact parameter count (meta device),
the reader's errors name the file and field, each catalog entry predicts, and what the
families add (q/k norms, four norms a layer, soft-capping) costs time and memory."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from types import ModuleType
from typing import Any

import pytest

from trainsim.builders.costs import LayerCoster, OpCoster
from trainsim.builders.memory import memory_per_gpu
from trainsim.builders.models import get_model, read_hf_config
from trainsim.builders.plan import Plan
from trainsim.builders.predict import predict_llm
from trainsim.builders.spec import ModelSpec
from trainsim.errors import ConfigError


@pytest.fixture(scope="module")
def hf() -> Iterator[tuple[ModuleType, ModuleType]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        torch = pytest.importorskip("torch")
        transformers = pytest.importorskip("transformers")
        yield torch, transformers


def _meta_params(torch: ModuleType, build: Any) -> int:
    """Parameters of the model ``build()`` makes on the meta device (no memory); tied tensors once."""
    try:
        with torch.device("meta"):
            model = build()
    except Exception as e:  # a transformers that cannot build it: skip, not fail
        pytest.skip(f"transformers cannot build the model: {e}")
    return sum(p.numel() for p in model.parameters())


def _config(transformers: ModuleType, cls: str, kwargs: dict[str, Any]) -> Any:
    if not hasattr(transformers, cls):
        pytest.skip(f"transformers has no {cls}")
    return getattr(transformers, cls)(**kwargs)


# id -> (config class, the published model's sizes, spec attributes it must read as). Sizes from
# the Hub configs, as transformers' config classes document them.
PUBLISHED: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "qwen3-8b": ("Qwen3Config", {"hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
                                 "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288,
                                 "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": False},
                 {"qk_norm": "head", "n_kv": 8, "d_head": 128, "tied_embeddings": False, "layer_norms": 2}),
    "qwen3-0.6b-tied": ("Qwen3Config", {"hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
                                        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072,
                                        "vocab_size": 151936, "tie_word_embeddings": True},
                        {"qk_norm": "head", "d_head": 128, "q_width": 2048, "tied_embeddings": True}),
    "phi3-mini": ("Phi3Config", {"hidden_size": 3072, "num_hidden_layers": 32, "num_attention_heads": 32,
                                 "num_key_value_heads": 32, "intermediate_size": 8192, "vocab_size": 32064,
                                 "max_position_embeddings": 4096, "sliding_window": 2047},
                  {"qk_norm": "none", "n_kv": 32, "bias": False, "sliding_window": 2047}),
    "olmo2-7b": ("Olmo2Config", {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                                 "num_key_value_heads": 32, "intermediate_size": 11008, "vocab_size": 100352,
                                 "max_position_embeddings": 4096},
                 {"qk_norm": "full", "layer_norms": 2, "tied_embeddings": False}),
    "gemma2-9b": ("Gemma2Config", {"hidden_size": 3584, "num_hidden_layers": 42, "num_attention_heads": 16,
                                   "num_key_value_heads": 8, "head_dim": 256, "intermediate_size": 14336,
                                   "vocab_size": 256000, "max_position_embeddings": 8192},
                  {"layer_norms": 4, "activation": "geglu", "d_head": 256, "tied_embeddings": True,
                   "logit_softcap": 30.0, "attn_softcap": 50.0, "sliding_window": 4096, "sliding_layers": 21}),
    "gemma3-1b": ("Gemma3TextConfig", {"hidden_size": 1152, "num_hidden_layers": 26, "num_attention_heads": 4,
                                       "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 6912,
                                       "vocab_size": 262144, "max_position_embeddings": 32768, "sliding_window": 512},
                  {"qk_norm": "head", "layer_norms": 4, "n_kv": 1, "logit_softcap": 0.0, "attn_softcap": 0.0,
                   "sliding_window": 512, "sliding_layers": 22}),
    "falcon-7b": ("FalconConfig", {},  # FalconConfig's defaults are Falcon-7B
                  {"n_kv": 1, "layer_norms": 1, "parallel_residual": True, "bias": False, "norm": "layernorm",
                   "tied_embeddings": True, "seq_len": 2048}),
    "falcon-40b": ("FalconConfig", {"hidden_size": 8192, "num_hidden_layers": 60, "num_attention_heads": 128,
                                    "num_kv_heads": 8, "new_decoder_architecture": True},
                   {"n_kv": 8, "layer_norms": 2, "parallel_residual": True}),
    "falcon-rw-1b-sequential-biased": ("FalconConfig", {"hidden_size": 2048, "num_hidden_layers": 24,
                                                        "num_attention_heads": 32, "multi_query": False,
                                                        "parallel_attn": False, "bias": True, "alibi": True},
                                       {"n_kv": 32, "layer_norms": 2, "parallel_residual": False, "bias": True,
                                        "position": "alibi"}),
    "starcoder2-7b": ("Starcoder2Config", {"hidden_size": 4608, "num_hidden_layers": 32, "num_attention_heads": 36,
                                           "num_key_value_heads": 4, "intermediate_size": 18432, "vocab_size": 49152,
                                           "max_position_embeddings": 16384, "bos_token_id": 0, "eos_token_id": 0},
                      {"n_kv": 4, "bias": True, "norm": "layernorm", "activation": "gelu", "tied_embeddings": True}),
}  # fmt: skip


@pytest.mark.parametrize("case", PUBLISHED)
def test_published_sizes_have_transformers_parameter_count(hf, tmp_path, case):
    """Each family's config, written as transformers writes it (only what differs from the
    config class's defaults), reads as the model transformers builds: the same parameters."""
    published_reads_as_transformers_builds(hf, tmp_path, PUBLISHED[case])


def published_reads_as_transformers_builds(hf: tuple[ModuleType, ModuleType], tmp_path: Any,
                                           case: tuple[str, dict[str, Any], dict[str, Any]]) -> tuple[ModelSpec, int]:  # fmt: skip
    """``case`` (config class, its arguments, the ModelSpec fields expected) written as a
    config.json reads with those fields and transformers' parameter count (meta device); the
    spec and that count, for more checks."""
    torch, transformers = hf
    cls, kwargs, expected = case
    config = _config(transformers, cls, kwargs)
    config.to_json_file(tmp_path / "config.json")
    spec = read_hf_config(tmp_path / "config.json")
    assert {k: getattr(spec, k) for k in expected} == expected
    n = _meta_params(torch, lambda: transformers.AutoModelForCausalLM.from_config(config))
    assert spec.params(padded=False) == n
    return spec, n


def test_gemma3_reads_the_language_model_of_its_text_config(hf, tmp_path):
    """gemma3 (multimodal): the text_config (Gemma-3-4B's, given as the Hub gives it: only what
    differs from Gemma3TextConfig) is the language model transformers builds from it."""
    torch, transformers = hf
    text = {
        "hidden_size": 2560,
        "num_hidden_layers": 34,
        "intermediate_size": 10240,
        "sliding_window": 1024,
    }
    config = _config(transformers, "Gemma3Config", {"text_config": text})
    config.to_json_file(tmp_path / "config.json")
    spec = read_hf_config(tmp_path / "config.json")
    assert (spec.heads, spec.n_kv, spec.d_head, spec.vocab, spec.qk_norm, spec.layer_norms) == (
        8,
        4,
        256,
        262208,
        "head",
        4,
    )
    assert (spec.sliding_window, spec.sliding_layers) == (1024, 29)
    n = _meta_params(torch, lambda: transformers.Gemma3ForCausalLM(config.text_config))
    assert spec.params(padded=False) == n
    # the Hub's own sparse form, written by hand
    (tmp_path / "hub.json").write_text(
        json.dumps({"model_type": "gemma3", "text_config": {**text, "model_type": "gemma3_text"}})
    )
    assert read_hf_config(tmp_path / "hub.json").params(padded=False) == n


# --- the catalog --------------------------------------------------------------------------

DENSE = (
    "qwen3-8b",
    "gemma2-9b",
    "gemma3-12b",
    "phi3-mini",
    "olmo2-7b",
    "falcon-7b",
    "falcon-40b",
    "starcoder2-7b",
)


def hf_config_for_dense(transformers: ModuleType, spec: ModelSpec) -> Any | None:
    """The HF config of a catalog entry of the families above (None for others)."""
    common = {"hidden_size": spec.hidden, "num_hidden_layers": spec.layers, "num_attention_heads": spec.heads,
              "vocab_size": spec.vocab, "max_position_embeddings": spec.seq_len}  # fmt: skip
    gated = {
        **common,
        "intermediate_size": spec.ffn,
        "num_key_value_heads": spec.n_kv,
        "head_dim": spec.d_head,
    }
    family = spec.name.split("-")[0]
    if family == "falcon":
        return transformers.FalconConfig(**{k: v for k, v in common.items() if k != "max_position_embeddings"},
                                         num_kv_heads=spec.n_kv, new_decoder_architecture=spec.n_kv > 1)  # fmt: skip
    if family == "starcoder2":
        return transformers.Starcoder2Config(**common, intermediate_size=spec.ffn, num_key_value_heads=spec.n_kv,
                                             sliding_window=spec.sliding_window or None, bos_token_id=0, eos_token_id=0)  # fmt: skip
    classes = {"qwen3": "Qwen3Config", "gemma2": "Gemma2Config", "gemma3": "Gemma3TextConfig", "phi3": "Phi3Config",
               "olmo2": "Olmo2Config"}  # fmt: skip
    if family not in classes:
        return None
    extra = {"sliding_window": spec.sliding_window} if spec.sliding_window else {}
    if family == "olmo2":
        gated.pop("head_dim")
    return getattr(transformers, classes[family])(**gated, **extra)


@pytest.mark.parametrize("name", DENSE)
def test_catalog_entries_are_their_hf_configs(hf, tmp_path, name):
    """Each new catalog entry, written as its HF config, reads back as the entry, and the HF model
    has its parameters (less the vocabulary padding)."""
    torch, transformers = hf
    spec = get_model(name)
    config = hf_config_for_dense(transformers, spec)
    config.to_json_file(tmp_path / "config.json")
    read = read_hf_config(tmp_path / "config.json")
    assert replace(read, name=spec.name, source="catalog") == spec
    assert (read.sliding_window, read.sliding_layers) == (spec.sliding_window, spec.sliding_layers)
    n = _meta_params(torch, lambda: transformers.AutoModelForCausalLM.from_config(config))
    assert spec.params(padded=False) == n


@pytest.mark.parametrize("name", DENSE)
def test_predict_runs_for_each_new_catalog_entry(name):
    spec = get_model(name)
    tp = 1 if spec.heads % 2 else 2  # Falcon-7B's 71 heads
    plan = Plan(tp=tp, pp=2, dp=8 // (2 * tp), micro_batch=1, global_batch=16, seq_len=2048)
    r = predict_llm(spec, plan, "dgx-a100")
    assert r.iteration_time_s > 0 and r.mfu > 0
    assert all(m.total_bytes > 0 for m in r.memory)


# --- reader errors ----------------------------------------------------------------------------

GEMMA2 = {"model_type": "gemma2", "hidden_size": 3584, "num_hidden_layers": 42, "num_attention_heads": 16,
          "num_key_value_heads": 8, "head_dim": 256, "intermediate_size": 14336, "vocab_size": 256000,
          "max_position_embeddings": 8192}  # fmt: skip

BAD = [
    ({**GEMMA2, "final_logit_softcapping": "30"}, "field 'final_logit_softcapping' must be a positive number or null"),
    ({**GEMMA2, "attn_logit_softcapping": -1.0}, "field 'attn_logit_softcapping' must be a positive number"),
    ({**GEMMA2, "layer_types": ["full_attention"]}, "field 'layer_types' must list one attention type per layer"),
    ({**GEMMA2, "hidden_activation": "relu"}, "field 'hidden_activation' is 'relu'"),
    ({k: v for k, v in GEMMA2.items() if k != "intermediate_size"}, "missing field 'intermediate_size'"),
    ({**GEMMA2, "model_type": "qwen3", "head_dim": 0}, "field 'head_dim' must be a positive integer"),
    ({"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71, "vocab_size": 65024,
      "parallel_attn": "yes"}, "field 'parallel_attn' must be true or false"),
    ({"model_type": "falcon", "num_attention_heads": 71}, "missing field 'hidden_size'"),
    ({"model_type": "gemma3", "text_config": [1]}, "field 'text_config' must be an object"),
    ({"model_type": "gemma3", "text_config": {"hidden_size": "big"}},
     r"field 'hidden_size' must be a positive integer, got 'big' \(in 'text_config'\)"),
    ({**GEMMA2, "model_type": "gemma4"}, "'model_type' is 'gemma4'; supported: cohere, deepseek_v2, deepseek_v3, dots1, ernie4_5, exaone4, falcon, gemma, gemma2, gemma3, gemma3_text"),
    # a type the window count does not know (it had counted as a full-attention layer, silently)
    ({**GEMMA2, "layer_types": ["sliding_attention", "chunked_attention"] * 21},
     r"field 'layer_types' has 'chunked_attention' \(layer 1\); supported here: full_attention, sliding_attention"),
]  # fmt: skip


@pytest.mark.parametrize(("doc", "message"), BAD, ids=[m[:40] for _, m in BAD])
def test_bad_configs_name_the_file_and_field(tmp_path, doc, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=message) as e:
        read_hf_config(path)
    assert str(e.value).startswith(f"{path}:")
    assert "\n" not in str(e.value)


def test_qwen3_window_only_with_use_sliding_window(tmp_path):
    """Qwen3 configs carry sliding_window 4096 with use_sliding_window false: no window; with it
    true, the layers from max_window_layers on."""
    doc = {**GEMMA2, "model_type": "qwen3", "num_hidden_layers": 36, "sliding_window": 4096}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**doc, "use_sliding_window": False}))
    assert (read_hf_config(path).sliding_window, read_hf_config(path).sliding_layers) == (0, 0)
    path.write_text(json.dumps({**doc, "use_sliding_window": True, "max_window_layers": 28}))
    assert (read_hf_config(path).sliding_window, read_hf_config(path).sliding_layers) == (4096, 8)


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_qwen_window_on_no_layer_is_no_window(tmp_path, model_type):
    """Qwen2Config and Qwen3Config slide the layers from max_window_layers on, and only with
    use_sliding_window (false by default): 28 layers with use_sliding_window true and
    max_window_layers 28 (the default) have none. sliding_layers 0 means every layer, so the
    window had applied to all 28 (Qwen2's reader had ignored max_window_layers and the flag's
    default too): under --impl hf every layer's mask calls and K/V repeats, under flash the
    windowed kernel's shorter attention."""
    doc = {**GEMMA2, "model_type": model_type, "num_hidden_layers": 28, "sliding_window": 4096, "head_dim": 128}
    path = tmp_path / "config.json"
    for extra, want in (({"use_sliding_window": True}, (0, 0)),
                        ({"use_sliding_window": True, "max_window_layers": 20}, (4096, 8)),
                        ({}, (0, 0)),  # the flag's default: false
                        ({"use_sliding_window": False, "max_window_layers": 4}, (0, 0))):  # fmt: skip
        path.write_text(json.dumps({**doc, **extra}))
        spec = read_hf_config(path)
        assert (spec.sliding_window, spec.sliding_layers) == want, extra
        assert spec.windowed_layers(8192) == (8 / 28 if want[0] else 0.0)


def test_yaml_spec_checks_the_new_fields(tmp_path):
    p = tmp_path / "m.yaml"
    base = "name: x\nhidden: 64\nlayers: 2\nheads: 4\nvocab: 99\n"
    for text, msg in (("qk_norm: rms\n", "field 'qk_norm' must be one of none, head, full"),
                      ("layer_norms: 3\n", "layer_norms must be 1, 2 or 4"),
                      ("logit_softcap: -3\n", "logit_softcap must be a non-negative number")):  # fmt: skip
        p.write_text(base + text)
        with pytest.raises(ConfigError, match=msg) as e:
            get_model(p)
        assert str(e.value).startswith(f"{p}:")
    p.write_text(base + "qk_norm: head\nlayer_norms: 4\nattn_softcap: 50\n")
    m = get_model(p)
    assert (m.qk_norm, m.layer_norms, m.attn_softcap) == ("head", 4, 50)


# --- what the features cost ---------------------------------------------------------------------

LLAMA = get_model("llama2-7b")
PLAN = Plan(tp=2, micro_batch=1, global_batch=8, dp=1, seq_len=2048)
COSTER = OpCoster("a100-sxm4-80gb")


def _layer_s(model: ModelSpec, plan: Plan = PLAN) -> float:
    lc = LayerCoster(model, plan, COSTER)
    return sum(o.seconds for ph in ("fwd", "bwd") for o in lc.layer(ph))


def _head_s(model: ModelSpec, plan: Plan = PLAN) -> float:
    lc = LayerCoster(model, plan, COSTER)
    return sum(o.seconds for ph in ("fwd", "bwd") for o in lc.head(ph))


def _mem(model: ModelSpec, plan: Plan = PLAN) -> float:
    return memory_per_gpu(model, plan)[0].total_bytes


@pytest.mark.parametrize("qk", ["head", "full"])
def test_qk_norm_adds_time_memory_and_parameters(qk):
    m = replace(LLAMA, qk_norm=qk)
    assert _layer_s(m) > _layer_s(LLAMA)
    assert _mem(m) > _mem(LLAMA)
    assert m.params() - LLAMA.params() == LLAMA.layers * (2 * 128 if qk == "head" else 2 * 4096)
    names = [o.name for o in LayerCoster(m, PLAN, COSTER).layer("fwd")]
    assert names[names.index("qkv_proj") + 1 : names.index("qkv_proj") + 3] == ["q_norm", "k_norm"]
    # predict's time grows too (the plan is GPU-bound)
    assert (
        predict_llm(m, PLAN, "dgx-a100").iteration_time_s
        > predict_llm(LLAMA, PLAN, "dgx-a100").iteration_time_s
    )


def test_four_norms_cost_more_than_two_and_one_less():
    four, one = replace(LLAMA, layer_norms=4), replace(LLAMA, layer_norms=1)
    assert _layer_s(four) > _layer_s(LLAMA) > _layer_s(one)
    assert _mem(four) > _mem(LLAMA) > _mem(one)
    assert four.params() - LLAMA.params() == LLAMA.layers * 2 * 4096
    for plan in (
        PLAN,
        replace(PLAN, sp=True),
    ):  # with SP the two extra norms run on the split sequence
        fwd = [o.name for o in LayerCoster(four, plan, COSTER).layer("fwd")]
        assert fwd.index("out_proj") + 1 == fwd.index("attention_output_norm")
        assert fwd.index("mlp_down") + 1 == fwd.index("mlp_output_norm")
    assert "post_attention_norm" not in [
        o.name for o in LayerCoster(one, PLAN, COSTER).layer("fwd")
    ]


def test_softcapping_costs_where_it_applies():
    unfused = replace(PLAN, attention="unfused")
    cap = replace(LLAMA, attn_softcap=50.0)
    assert _layer_s(cap, unfused) > _layer_s(LLAMA, unfused)
    assert _mem(cap, unfused) > _mem(LLAMA, unfused)
    # with FlashAttention the kernel caps: not costed, and predict says so
    assert _layer_s(cap) == _layer_s(LLAMA)
    notes = predict_llm(cap, PLAN, "dgx-a100").warnings
    assert any("soft-caps its attention scores" in n for n in notes)
    assert not any("soft-caps" in n for n in predict_llm(cap, unfused, "dgx-a100").warnings)
    logits = replace(LLAMA, logit_softcap=30.0)
    assert _head_s(logits) > _head_s(LLAMA)
    assert (
        memory_per_gpu(logits, PLAN)[-1].activations_bytes
        > memory_per_gpu(LLAMA, PLAN)[-1].activations_bytes
    )
    assert _layer_s(logits) == _layer_s(LLAMA)


def test_notes_for_what_is_not_modelled():
    gemma3 = get_model("gemma3-12b")
    r = predict_llm(
        gemma3, Plan(tp=2, micro_batch=1, global_batch=8, dp=1, seq_len=4096), "dgx-a100"
    )
    assert any(
        "sliding window (1,024 tokens on 40 of its 48 layers) is costed as FlashAttention's windowed kernel" in n
        for n in r.warnings
    )
    olmo = get_model("olmo2-7b")
    r = predict_llm(olmo, Plan(tp=2, micro_batch=1, global_batch=8, dp=1, seq_len=2048), "dgx-a100")
    assert any("sum of squares all-reduced over the 2 TP ranks" in n for n in r.warnings)
    r = predict_llm(
        olmo,
        Plan(tp=1, micro_batch=1, global_batch=8, dp=2, seq_len=2048, impl="hf"),
        "dgx-a100",
        gpus=2,
    )
    assert any("this model's q/k norms are not in it" in n for n in r.warnings)


def test_existing_models_are_unchanged_by_the_new_fields():
    """Defaults mean the old layer: LLaMA's operator list and memory are those of a spec with
    the new fields at their defaults, written out."""
    explicit = replace(LLAMA, qk_norm="none", layer_norms=2, logit_softcap=0.0, attn_softcap=0.0)
    assert explicit == LLAMA
    assert [o.name for o in LayerCoster(LLAMA, PLAN, COSTER).layer("fwd")] == [
        "input_norm", "qkv_proj", "rotary", "flash_attention", "out_proj", "residual_add", "post_attention_norm",
        "mlp_up", "activation", "mlp_down", "residual_add"]  # fmt: skip


# tiiuae/falcon-7b and -40b as the Hub held them before transformers took the family in (their
# remote code's model types; config.json as published then)
_RW_7B = {"alibi": False, "apply_residual_connection_post_layernorm": False, "architectures": ["RWForCausalLM"],
          "attention_dropout": 0.0, "bias": False, "bos_token_id": 11, "eos_token_id": 11, "hidden_dropout": 0.0,
          "hidden_size": 4544, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "RefinedWebModel",
          "multi_query": True, "n_head": 71, "n_layer": 32, "parallel_attn": True, "torch_dtype": "bfloat16",
          "transformers_version": "4.27.4", "use_cache": True, "vocab_size": 65024}  # fmt: skip
_RW_40B = {**{k: v for k, v in _RW_7B.items() if k != "multi_query"}, "model_type": "RefinedWeb", "hidden_size": 8192,
           "n_head": 128, "n_head_kv": 8, "n_layer": 60}  # fmt: skip


@pytest.mark.parametrize(("doc", "name"), [(_RW_7B, "falcon-7b"), (_RW_40B, "falcon-40b")])
def test_falcon_remote_code_configs_read_as_falcon(tmp_path, doc, name):
    """RefinedWebModel (Falcon-7B's layer) and RefinedWeb (Falcon-40B's: the new decoder
    architecture) are the Falcon family (they had been refused as unsupported model types)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    spec = get_model(name)
    assert replace(read_hf_config(path), name=spec.name, source=spec.source, aliases=spec.aliases) == spec


def test_qwen3_catalog_entries_share_the_pretraining_context() -> None:
    """qwen3-8b said 32,768 (the report's long-context stage), qwen3-30b-a3b 4,096 (stages 1-2)
    citing the same report (review finding): both are the pre-training context now."""
    assert get_model("qwen3-8b").seq_len == get_model("qwen3-30b-a3b").seq_len == 4096


def test_gemma3_multimodal_config_notes_its_vision_tower(tmp_path):
    """A gemma3 config with a vision_config is predicted as its language model, and predict
    now says the vision tower and image tokens are left out (review finding: silent)."""
    from trainsim.builders.plan import Plan
    from trainsim.builders.predict import predict_llm

    text = {"hidden_size": 2560, "num_hidden_layers": 34, "intermediate_size": 10240, "sliding_window": 1024,
            "model_type": "gemma3_text"}  # fmt: skip
    (tmp_path / "mm.json").write_text(json.dumps({"model_type": "gemma3", "text_config": text,
                                                  "vision_config": {"model_type": "siglip_vision_model"},
                                                  "mm_tokens_per_image": 256}))  # fmt: skip
    (tmp_path / "text.json").write_text(json.dumps({"model_type": "gemma3", "text_config": text}))
    mm, plain = read_hf_config(tmp_path / "mm.json"), read_hf_config(tmp_path / "text.json")
    from dataclasses import replace as _replace

    assert _replace(mm, name=plain.name, source=plain.source) == plain  # the same language model
    assert "vision tower" in mm.left_out and plain.left_out == ""
    plan = Plan(tp=1, dp=8, micro_batch=1, global_batch=8, seq_len=2048)
    notes = predict_llm(mm, plan, "dgx-h100", simulate=False).warnings
    assert any(n.startswith(f"not modelled for {mm.name}: its vision tower") for n in notes)
    assert not any("vision tower" in n for n in predict_llm(plain, plan, "dgx-h100", simulate=False).warnings)



def test_windowed_flash_attention_does_the_windows_share_of_the_work():
    """A sliding window (Gemma 3: 1,024 tokens on 40 of 48 layers) with flash attention: the
    attention core's time and FLOPs are the causal kernel's times the work it does, averaged over
    the windowed and full layers (with context parallelism, the busiest rank's); nothing changes
    within the window or with an attention that computes every score."""
    from dataclasses import replace as _replace

    from trainsim.builders.costs import LayerCoster, OpCoster
    from trainsim.builders.plan import Plan
    from trainsim.hardware import get_device

    g = get_model("gemma3-12b")
    full = _replace(g, sliding_window=0, sliding_layers=0)
    assert g != full  # the window is part of the model's identity (costers key caches by it)
    w = 1024 / 8192
    assert g.window_work_fraction(8192) == pytest.approx((40 * (2 * w - w * w) + 8) / 48)
    assert g.window_work_fraction(1024) == 1.0 and full.window_work_fraction(8192) == 1.0
    coster = OpCoster(get_device("h100-sxm5-80gb"))

    def core(model, **kw):
        plan = Plan(tp=2, micro_batch=1, global_batch=8, dp=1, seq_len=8192, **kw)
        (op,) = [o for o in LayerCoster(model, plan, coster).attention_core("fwd") if o.category == "attention"]
        return op

    a, b = core(g), core(full)
    frac = g.window_work_fraction(8192)
    assert a.seconds == pytest.approx(b.seconds * frac) and a.flops == pytest.approx(b.flops * frac)
    assert "windowed-work" in a.provenance and "windowed-work" not in b.provenance
    # context parallelism (2026-12-04: it had been priced as full causal attention): the
    # windowed layers at TransformerEngine's all-gather CP's busiest rank (tests/test_cp_window.py)
    cp_frac = g.cp_window_work_fraction(8192, 2)
    assert core(g, cp=2).seconds == pytest.approx(core(full, cp=2).seconds * cp_frac) and cp_frac < 0.5
