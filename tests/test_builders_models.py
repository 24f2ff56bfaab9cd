"""Model catalog and HuggingFace config.json reading: published parameter counts, lookup, and
agreement with the transformers implementations (tiny models on CPU, catalog sizes on torch's
meta device, which allocates no memory)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from trainsim.builders.models import get_model, list_models, read_hf_config
from trainsim.builders.spec import ModelSpec
from trainsim.errors import ConfigError

# --- catalog against published totals -------------------------------------------------------

# name -> (published parameters in billions, relative tolerance). Sources: GPT-3 Table 2.1,
# Narayanan et al. 2021 Table 1, LLaMA-2/3 and Mistral/Mixtral model cards, NeoX-20B paper.
PUBLISHED = {
    "gpt3-125m": (0.125, 0.02), "gpt3-350m": (0.350, 0.02), "gpt3-760m": (0.760, 0.02),
    "gpt3-1.3b": (1.3, 0.02), "gpt3-2.7b": (2.7, 0.02), "gpt3-6.7b": (6.7, 0.02),
    "gpt3-13b": (13.0, 0.02), "gpt3-175b": (175.0, 0.02),
    "megatron-gpt-1.7b": (1.7, 0.03),  # the table rounds 1.65 up to 1.7
    "megatron-gpt-3.6b": (3.6, 0.02), "megatron-gpt-7.5b": (7.5, 0.02),
    "megatron-gpt-18b": (18.4, 0.01), "megatron-gpt-39b": (39.1, 0.01),
    "megatron-gpt-76b": (76.1, 0.01), "megatron-gpt-145b": (145.6, 0.01),
    "megatron-gpt-310b": (310.1, 0.01), "megatron-gpt-530b": (529.6, 0.01),
    "megatron-gpt-1t": (1008.0, 0.01),
    "gpt-neox-20b": (20.55, 0.005),
    "llama2-7b": (6.74, 0.02), "llama2-13b": (13.0, 0.02), "llama2-70b": (69.0, 0.02),
    "llama3-8b": (8.03, 0.02), "llama3-70b": (70.6, 0.02), "llama3-405b": (405.9, 0.02),
    "mistral-7b": (7.24, 0.02), "mixtral-8x7b": (46.7, 0.02), "mixtral-8x22b": (141.0, 0.02),
}  # fmt: skip


@pytest.mark.parametrize(("name", "published"), PUBLISHED.items())
def test_catalog_matches_published_parameter_counts(name, published):
    billions, tol = published
    assert get_model(name).params() / 1e9 == pytest.approx(billions, rel=tol)


MEGATRON = [m for m in list_models() if m.name.startswith("megatron")]


@pytest.mark.parametrize("spec", MEGATRON, ids=lambda s: s.name)
def test_megatron_matches_the_papers_formula(spec):
    """Narayanan et al. 2021 Eq. for P = 12 l h² (1 + 13/(12h) + (V+s)/(12lh)), plus the final norm."""
    n, h, v, s = spec.layers, spec.hidden, spec.vocab, spec.seq_len
    assert spec.params() == 12 * n * h * h + 13 * n * h + (v + s) * h + 2 * h


def test_active_parameters_of_moe():
    for name, active in (("mixtral-8x7b", 12.9), ("mixtral-8x22b", 39.1)):
        m = get_model(name)
        total = m.layers * m.layer_active_params() + 2 * m.embedding_params() + m.norm_params()
        assert total / 1e9 == pytest.approx(active, rel=0.02)


def test_catalog_entries_are_well_formed():
    models = list_models()
    assert len({m.name for m in models}) == len(models)
    for m in models:
        assert re.fullmatch(r"[a-z0-9][a-z0-9.\-]*", m.name), m.name
        assert m.source == "catalog" and m.params() > 0
        assert get_model(m.name) is m
        for alias in m.aliases:
            assert get_model(alias) is m
            assert get_model(alias.upper()) is m


def test_catalog_architecture_facts():
    l2, l3, mx = get_model("llama2-70b"), get_model("llama3-405b"), get_model("mixtral-8x7b")
    assert (l2.n_kv, l2.ffn, l2.vocab, l2.seq_len) == (8, 28672, 32000, 4096)
    assert (l3.hidden, l3.layers, l3.heads, l3.n_kv, l3.ffn) == (16384, 126, 128, 8, 53248)
    assert (mx.num_experts, mx.top_k, mx.expert_ffn, mx.n_kv) == (8, 2, 14336, 8)
    g, nx = get_model("gpt3-175b"), get_model("gpt-neox-20b")
    assert (g.d_head, g.ffn, g.tied_embeddings, g.position, g.bias) == (128, 49152, True, "learned", True)  # fmt: skip
    assert (nx.position, nx.norm, nx.tied_embeddings, nx.vocab) == (
        "rotary",
        "layernorm",
        False,
        50432,
    )


@pytest.mark.parametrize(
    ("query", "name"),
    [("Llama-2-7b", "llama2-7b"), ("meta-llama/Llama-2-7b-hf", "llama2-7b"),
     ("LLAMA3.1-70B", "llama3-70b"), ("Mixtral 8x7B", "mixtral-8x7b"), ("GPT3-XL", "gpt3-1.3b"),
     ("megatron_gpt_18.4b", "megatron-gpt-18b"), ("EleutherAI/gpt-neox-20b", "gpt-neox-20b")],
)  # fmt: skip
def test_lookup_by_alias_is_case_insensitive(query, name):
    assert get_model(query).name == name


def test_unknown_name_lists_close_matches():
    with pytest.raises(ConfigError, match=r"unknown model 'llama2-7'.*llama2-7b.*trainsim models"):
        get_model("llama2-7")
    with pytest.raises(ConfigError, match="no close match"):
        get_model("resnet50")


def test_a_folder_named_like_a_catalog_model_does_not_shadow_it(tmp_path, monkeypatch):
    """Review finding: an unrelated ./gpt2 folder made `predict gpt2` fail ('has no config.json')."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt2").mkdir()
    assert get_model("gpt2").source == "catalog"
    (tmp_path / "mine").mkdir()
    with pytest.raises(ConfigError, match=r"model directory mine has no config\.json"):
        get_model("mine")
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps(GPT2))
    assert get_model("gpt2").source.endswith("config.json")  # a real config folder is what was meant


# --- config.json without transformers --------------------------------------------------------

# As published on the Hub (meta-llama/Llama-2-7b-hf, openai-community/gpt2).
LLAMA2_7B = {
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "tie_word_embeddings": False, "torch_dtype": "float16", "vocab_size": 32000,
}  # fmt: skip
GPT2 = {
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
    "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
    "vocab_size": 50257,
}  # fmt: skip


def _write(tmp_path: Path, doc: Any, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return path


@pytest.mark.parametrize(("doc", "name"), [(LLAMA2_7B, "llama2-7b"), (GPT2, "gpt2")])
def test_hub_config_equals_catalog_entry(tmp_path, doc, name):
    spec = read_hf_config(_write(tmp_path, doc))
    assert spec.source == str(tmp_path / "config.json")
    assert spec.name == tmp_path.name
    assert replace(spec, name=name, source="catalog") == get_model(name)


def test_a_config_without_a_name_is_named_by_its_folder_however_the_path_is_written(tmp_path, monkeypatch):
    folder = tmp_path / "my-mistral"
    (folder / "runs").mkdir(parents=True)
    _write(folder, LLAMA2_7B)
    monkeypatch.chdir(folder)
    assert get_model("./config.json").name == "my-mistral"
    monkeypatch.chdir(folder / "runs")
    assert get_model("../config.json").name == get_model("..").name == "my-mistral"  # not ".."


def test_get_model_reads_a_file_or_a_directory(tmp_path):
    path = _write(tmp_path, {**LLAMA2_7B, "_name_or_path": "meta-llama/Llama-2-7b-hf"})
    assert get_model(path) == get_model(tmp_path) == get_model(str(tmp_path))
    assert get_model(path).name == "meta-llama/Llama-2-7b-hf"
    with pytest.raises(ConfigError, match=r"has no config\.json"):
        get_model(tmp_path / "..")
    with pytest.raises(ConfigError, match="does not exist"):
        get_model(tmp_path / "missing.json")


BAD = [
    ("{not json", "not valid JSON"),
    ([1, 2], "JSON object"),
    ({**LLAMA2_7B, "model_type": "bert"}, "'model_type' is 'bert'; supported: cohere, deepseek_v2, deepseek_v3, dots1, ernie4_5, exaone4, falcon, gemma, gemma2.*qwen3_moe"),
    ({k: v for k, v in LLAMA2_7B.items() if k != "model_type"}, "missing field 'model_type'"),
    ({k: v for k, v in LLAMA2_7B.items() if k != "hidden_size"}, "missing field 'hidden_size'"),
    ({k: v for k, v in LLAMA2_7B.items() if k != "intermediate_size"}, "missing field 'intermediate_size'"),
    ({k: v for k, v in GPT2.items() if k != "n_layer"}, r"missing field 'num_hidden_layers' \(or 'n_layer'"),
    ({**LLAMA2_7B, "num_hidden_layers": "32"}, "'num_hidden_layers' must be a positive integer, got '32'"),
    ({**LLAMA2_7B, "vocab_size": 32000.0}, "'vocab_size' must be a positive integer"),
    ({**LLAMA2_7B, "num_key_value_heads": True}, "'num_key_value_heads' must be a positive integer"),
    ({**LLAMA2_7B, "tie_word_embeddings": "no"}, "'tie_word_embeddings' must be true or false"),
    ({**LLAMA2_7B, "hidden_act": "relu"}, "'hidden_act' is 'relu'"),
    ({**GPT2, "activation_function": "silu"}, "'activation_function' is 'silu'"),
    ({**LLAMA2_7B, "num_key_value_heads": 5}, "not a multiple of kv_heads"),
    ({**LLAMA2_7B, "model_type": "mixtral"}, "missing field 'num_local_experts'"),
]  # fmt: skip


@pytest.mark.parametrize(("doc", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_configs_name_the_file_and_field(tmp_path, doc, message):
    path = _write(tmp_path, doc)
    with pytest.raises(ConfigError, match=message) as e:
        read_hf_config(path)
    assert str(e.value).startswith(f"{path}:")
    assert "\n" not in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"config\.json does not exist"):
        read_hf_config(tmp_path / "config.json")


# --- against transformers ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf() -> Iterator[tuple[ModuleType, ModuleType]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        torch = pytest.importorskip("torch")
        transformers = pytest.importorskip("transformers")
        yield torch, transformers


def _hf_params(torch: ModuleType, transformers: ModuleType, config: Any, *, meta: bool) -> int:
    with torch.device("meta" if meta else "cpu"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())  # shared (tied) tensors count once


_TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256,
         "max_position_embeddings": 32}  # fmt: skip
_GPT2_TINY = {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256, "n_positions": 32}
_LLAMA_TINY = {**_TINY, "intermediate_size": 96, "num_key_value_heads": 2}

# id -> (config class, its arguments, expected spec attributes, HF parameters minus spec.params())
TINY: dict[str, tuple[str, dict[str, Any], dict[str, Any], Callable[[ModelSpec], int]]] = {
    "gpt2": ("GPT2Config", _GPT2_TINY,
             {"activation": "gelu", "position": "learned", "tied_embeddings": True, "ffn": 256, "n_kv": 4},
             lambda s: 0),
    "gpt2-relu-untied": ("GPT2Config", {**_GPT2_TINY, "n_inner": 96, "activation_function": "relu",
                                        "tie_word_embeddings": False},
                         {"activation": "relu", "ffn": 96, "tied_embeddings": False}, lambda s: 0),
    "gpt_bigcode-mqa": ("GPTBigCodeConfig", _GPT2_TINY,
                        {"n_kv": 1, "bias": True, "position": "learned", "tied_embeddings": True},
                        lambda s: 0),
    "gpt_neox": ("GPTNeoXConfig", {**_TINY, "intermediate_size": 256},
                 {"position": "rotary", "norm": "layernorm", "bias": True, "tied_embeddings": False},
                 lambda s: 0),
    "llama-gqa": ("LlamaConfig", _LLAMA_TINY,
                  {"activation": "swiglu", "norm": "rmsnorm", "n_kv": 2, "ffn": 96, "bias": False},
                  lambda s: 0),
    "llama-tied-biased": ("LlamaConfig", {**_LLAMA_TINY, "tie_word_embeddings": True,
                                          "attention_bias": True, "mlp_bias": True},
                          {"tied_embeddings": True, "bias": True}, lambda s: 0),
    "mistral-head-dim": ("MistralConfig", {**_LLAMA_TINY, "head_dim": 32},
                         {"d_head": 32, "q_width": 128, "n_kv": 2}, lambda s: 0),
    "qwen2": ("Qwen2Config", {**_LLAMA_TINY, "tie_word_embeddings": True},
              {"bias": False, "qkv_bias": True, "tied_embeddings": True}, lambda s: 0),
    "mixtral": ("MixtralConfig", {**_LLAMA_TINY, "num_local_experts": 4, "num_experts_per_tok": 2},
                {"num_experts": 4, "top_k": 2, "expert_ffn": 96, "is_moe": True}, lambda s: 0),
}  # fmt: skip


@pytest.mark.parametrize("case", TINY)
def test_tiny_hf_models_have_the_spec_parameter_count(hf, tmp_path, case):
    torch, transformers = hf
    cls, kwargs, expected, extra = TINY[case]
    config = getattr(transformers, cls)(**kwargs)
    config.to_json_file(tmp_path / "config.json")
    spec = read_hf_config(tmp_path / "config.json")
    assert (spec.hidden, spec.layers, spec.heads, spec.vocab, spec.seq_len) == (64, 2, 4, 256, 32)
    assert {k: getattr(spec, k) for k in expected} == expected
    assert _hf_params(torch, transformers, config, meta=False) == spec.params() + extra(spec)


def _config_for(transformers: ModuleType, spec: ModelSpec) -> Any:
    """The HF config describing a catalog entry (GPT-3 and Megatron GPT as GPT-2 configs)."""
    from tests.test_dense_families import hf_config_for_dense

    if (dense := hf_config_for_dense(transformers, spec)) is not None:  # Qwen3, Gemma, Falcon, ...
        return dense
    if spec.position == "learned":
        return transformers.GPT2Config(n_embd=spec.hidden, n_layer=spec.layers, n_head=spec.heads,
                                       vocab_size=spec.vocab, n_positions=spec.seq_len)  # fmt: skip
    common = {"hidden_size": spec.hidden, "num_hidden_layers": spec.layers,
              "num_attention_heads": spec.heads, "intermediate_size": spec.ffn,
              "vocab_size": spec.vocab, "max_position_embeddings": spec.seq_len}  # fmt: skip
    if spec.norm == "layernorm":
        return transformers.GPTNeoXConfig(**common)
    common["num_key_value_heads"] = spec.n_kv
    if spec.is_moe:
        return transformers.MixtralConfig(
            **common, num_local_experts=spec.num_experts, num_experts_per_tok=spec.top_k
        )
    mistral = spec.name.startswith("mistral")
    return (transformers.MistralConfig if mistral else transformers.LlamaConfig)(**common)


# the MoE families beyond Mixtral: tests/test_builders_moe_families.py writes their configs
_MOE_FAMILIES = {"qwen3-30b-a3b", "qwen1.5-moe-a2.7b", "gpt-oss-20b", "gpt-oss-120b", "deepseek-v3", "deepseek-v2"}


@pytest.mark.parametrize("spec", [m for m in list_models() if m.name not in _MOE_FAMILIES], ids=lambda s: s.name)
def test_catalog_agrees_with_transformers(hf, tmp_path, spec):
    """Write each catalog entry as its HF config: reading it back gives the entry, and the HF
    model (on the meta device: no memory) has spec.params() less the vocabulary padding."""
    torch, transformers = hf
    config = _config_for(transformers, spec)
    config.to_json_file(tmp_path / "config.json")
    read = read_hf_config(tmp_path / "config.json")
    assert replace(read, name=spec.name, source="catalog") == spec
    padding = (spec.padded_vocab() - spec.vocab) * spec.hidden * (1 if spec.tied_embeddings else 2)
    assert _hf_params(torch, transformers, config, meta=True) == spec.params(padded=False) == spec.params() - padding


def test_yaml_model_spec(tmp_path):
    """DESIGN.md: MODEL may be a YAML spec (ModelSpec fields, or a HF config in YAML)."""
    from trainsim.builders.models import get_model

    p = tmp_path / "m.yaml"
    p.write_text("name: my-7b\nhidden: 4096\nlayers: 32\nheads: 32\nkv_heads: 8\nvocab: 32000\n"
                 "ffn_hidden: 14336\nactivation: swiglu\nnorm: rmsnorm\nposition: rotary\nbias: false\n")  # fmt: skip
    m = get_model(p)
    assert (m.name, m.n_kv, m.gated, m.source) == ("my-7b", 8, True, str(p))
    assert m.params() == get_model("mistral-7b").params()
    bad = tmp_path / "bad.yml"
    for text, msg in (("name: x\nhidden: 64\nlayerz: 2\n", "unknown field(s) 'layerz'"),
                      ("name: x\nhidden: 64\nlayers: 2\nheads: 4\nvocab: 9\nnorm: batch\n", "'norm' must be one of"),
                      ("name: x\nhidden: 64\nlayers: two\nheads: 4\nvocab: 9\n", "'layers' must be an integer"),
                      ("name: x\nhidden: 64\n", "missing field(s) 'layers', 'heads', 'vocab'"),
                      ("name: x\nhidden: 64\nlayers: 2\nheads: 4\nvocab: 9\ntop_k: 2\n",
                       "field(s) 'top_k' describe experts, but 'num_experts' is not set"),
                      ("[1, 2", "not valid YAML")):  # fmt: skip
        bad.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(msg)):
            get_model(bad)
    hf = tmp_path / "hf.yaml"
    hf.write_text("model_type: gpt2\nn_embd: 768\nn_layer: 12\nn_head: 12\nvocab_size: 50257\nn_positions: 1024\n")
    assert get_model(hf).params() == get_model("gpt2").params()


@pytest.mark.parametrize(("model_type", "cls"), [("llama", "LlamaConfig"), ("mistral", "MistralConfig"),
                                                 ("mixtral", "MixtralConfig"), ("qwen2", "Qwen2Config")])  # fmt: skip
def test_missing_kv_heads_default_as_transformers_does(hf, tmp_path, model_type, cls):
    """A config without ``num_key_value_heads`` means what transformers' config class defaults it
    to: 8 for Mistral and Mixtral, 32 for Qwen2, the attention heads for LLaMA (MHA)."""
    _, transformers = hf
    fields = {"hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 64, "intermediate_size": 2048,
              "vocab_size": 1000, "max_position_embeddings": 128}  # fmt: skip
    expected = getattr(transformers, cls)(**fields).num_key_value_heads
    doc = {"model_type": model_type, **fields}
    if model_type == "mixtral":
        doc |= {"num_local_experts": 4, "num_experts_per_tok": 2}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(doc))
    assert read_hf_config(p).n_kv == expected
