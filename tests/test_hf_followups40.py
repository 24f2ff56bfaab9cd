"""Follow-ups to a review of the HF readers and ``--impl hf`` (session 40).

Every family with a census is an ``hf_family`` (Mistral's and LLaMA's were refused as "no kernel
census"); the Qwen readers' windows are transformers 5.24's config classes' (``max_window_layers``
0, Qwen2-MoE's even layers, Qwen3-MoE's flag); Phi-3's ``partial_rotary_factor`` is read as
Phi3Config reads it; what a census has no part for (a window, a partial rotary, NoPE layers) is
said in a predict note; ``stage_costs`` refuses a stage outside the pipeline."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from trainsim.builders.eager import (
    HF_FAMILY_CENSUSES,
    HF_MOE_FAMILIES,
    _census,
    census_omissions,
    eager_bytes,
    family_of,
)
from trainsim.builders.llm import stage_costs
from trainsim.builders.memory import _hf_activation_census, hf_activation_parts
from trainsim.builders.models import get_model, hf_config_from_dict
from trainsim.builders.plan import Plan
from trainsim.builders.predict import predict_llm
from trainsim.builders.spec import ModelSpec
from trainsim.errors import ConfigError
from trainsim.hardware import get_system

HF = Plan(tp=1, dp=1, micro_batch=1, global_batch=1, seq_len=4096, impl="hf")
LLAMA_YAML = ("name: my-7b\nhidden: 4096\nlayers: 32\nheads: 32\nkv_heads: 8\nvocab: 32000\nffn_hidden: 14336\n"
              "activation: swiglu\nnorm: rmsnorm\nposition: rotary\nbias: false\n")  # fmt: skip


def _notes(model: ModelSpec, plan: Plan = HF) -> list[str]:
    return predict_llm(model, plan, "dgx-h100", gpus=1, simulate=False).warnings


# --- 1. every family with a census is an hf_family -----------------------------------------------


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_yaml_hf_family_llama_and_mistral_take_their_censuses(tmp_path, family):
    """Refused until now ("no kernel census of transformers' 'llama' modules"): they are the
    censuses the fields pick. Mistral's without a window is LLaMA's call for call."""
    path = tmp_path / "m.yaml"
    path.write_text(LLAMA_YAML + f"hf_family: {family}\n")
    spec = get_model(path)
    HF.validate(spec)
    assert family_of(spec) == family
    plain = replace(spec, hf_family="")
    assert predict_llm(spec, HF, "dgx-h100", gpus=1, simulate=False).iteration_time_s == pytest.approx(
        predict_llm(plain, HF, "dgx-h100", gpus=1, simulate=False).iteration_time_s, rel=1e-12)


def _model_for(family: str) -> ModelSpec:
    base = get_model("mixtral-8x7b") if family in HF_MOE_FAMILIES else get_model("llama3-8b")
    return replace(base, hf_family=family)


@pytest.mark.parametrize("family", HF_FAMILY_CENSUSES)
def test_every_census_family_is_an_hf_family(family):
    """Each name takes its own census (an MoE one's per experts implementation), both censuses
    evaluate on it, and it predicts."""
    spec = _model_for(family)
    moe = family in HF_MOE_FAMILIES
    assert family_of(spec) == (f"{family}_grouped" if moe else family)
    assert family_of(spec, "eager") == family
    assert family_of(spec) in _census() and family_of(spec) in _hf_activation_census()
    assert eager_bytes(spec, "layer", "fwd", tokens=4096, seq=4096, dtype_bytes=2)[0] > 0
    assert hf_activation_parts(spec, HF)[0] > 0
    # every census is one of these (the MoE pairs under one name)
    assert {f.removesuffix("_grouped") for f in _census()} == set(HF_FAMILY_CENSUSES)


def test_unknown_hf_family_is_a_one_line_error_naming_the_field(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(LLAMA_YAML + "hf_family: lama\n")
    with pytest.raises(ConfigError) as e:
        get_model(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: field 'hf_family'") and "'lama'" in msg and "\n" not in msg
    assert all(f in msg for f in HF_FAMILY_CENSUSES)
    # a ModelSpec built in code: refused under impl hf, the same way
    with pytest.raises(ConfigError) as e:
        HF.validate(replace(get_model("llama3-8b"), hf_family="lama"))
    msg = str(e.value)
    assert "field 'hf_family' is 'lama'" in msg and "\n" not in msg and all(f in msg for f in HF_FAMILY_CENSUSES)


def test_moe_hf_family_on_a_dense_model_and_back_are_refused():
    for spec in (replace(get_model("llama3-8b"), hf_family="mixtral"),
                 replace(get_model("mixtral-8x7b"), hf_family="llama")):  # fmt: skip
        with pytest.raises(ConfigError, match="field 'hf_family'") as e:
            HF.validate(spec)
        assert "\n" not in str(e.value)


def test_an_moe_hf_family_s_dense_layers_take_the_dense_family_of_their_fields():
    """Qwen3-MoE-shaped experts with dense layers, hf_family qwen3_moe: its dense layers are
    Qwen3's (as a config read without hf_family gives), not an MoE census on a dense layer."""
    spec = replace(get_model("qwen3-30b-a3b"), dense_layers=(0, 1))
    named = replace(spec, hf_family="qwen3_moe")
    assert family_of(named.dense_variant()) == family_of(spec.dense_variant()) == "qwen3"
    a = predict_llm(named, HF, "dgx-h100", gpus=1, simulate=False).iteration_time_s
    assert a == predict_llm(spec, HF, "dgx-h100", gpus=1, simulate=False).iteration_time_s


# --- 2. the Qwen readers' windows are transformers' ----------------------------------------------

QWEN = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 6, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 1000, "max_position_embeddings": 8192}  # fmt: skip
QWEN_MOE = {**QWEN, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
            "shared_expert_intermediate_size": 256}  # fmt: skip
CLASSES = {"qwen2": "Qwen2Config", "qwen3": "Qwen3Config", "qwen2_moe": "Qwen2MoeConfig", "qwen3_moe": "Qwen3MoeConfig"}
WINDOWS: list[dict[str, Any]] = [
    {"use_sliding_window": True, "max_window_layers": 0},  # every layer (refused by the reader before)
    {"use_sliding_window": True, "max_window_layers": 0, "sliding_window": 1024},
    {"use_sliding_window": True, "max_window_layers": 4, "sliding_window": 1024},
    {"use_sliding_window": True, "max_window_layers": 5},  # the window's default, 4096
    {"use_sliding_window": True, "sliding_window": None},
    {"sliding_window": 1024},  # use_sliding_window false by default
    {"use_sliding_window": False, "max_window_layers": 0, "sliding_window": 1024},
]


def _transformers_window(model_type: str, doc: dict[str, Any]) -> tuple[int, int]:
    """(window, sliding layers) of transformers' own config class for ``doc``."""
    transformers = pytest.importorskip("transformers")
    kw = {k: v for k, v in doc.items() if k != "model_type"}
    cfg = getattr(transformers, CLASSES[model_type])(**kw)
    window = cfg.sliding_window or 0
    if model_type == "qwen3_moe":  # no layer_types: every Qwen3MoeAttention takes config.sliding_window
        return window, cfg.num_hidden_layers if window else 0
    layers = sum(t == "sliding_attention" for t in cfg.layer_types)
    return (window, layers) if window and layers else (0, 0)


@pytest.mark.parametrize("model_type", CLASSES)
@pytest.mark.parametrize("window", WINDOWS, ids=[json.dumps(w) for w in WINDOWS])
def test_qwen_windows_are_the_config_classes(model_type, window):
    doc = {**(QWEN_MOE if model_type.endswith("_moe") else QWEN), "model_type": model_type, **window}
    spec = hf_config_from_dict(doc, Path("config.json"))
    assert (spec.sliding_window, spec.sliding_layers) == _transformers_window(model_type, doc)


def test_qwen3_max_window_layers_0_slides_every_layer():
    doc = {**QWEN, "model_type": "qwen3", "use_sliding_window": True, "max_window_layers": 0, "sliding_window": 1024}
    spec = hf_config_from_dict(doc, Path("config.json"))
    assert spec.windowed_layers(4096) == 1.0 and spec.window_work_fraction(4096) < 1.0


# --- 3. Phi-3's partial rotary -------------------------------------------------------------------

PHI4_MINI = {"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
             "num_attention_heads": 24, "num_key_value_heads": 8, "vocab_size": 200064,
             "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
             "partial_rotary_factor": 0.75, "sliding_window": 262144,
             "rope_scaling": {"type": "longrope", "long_factor": [1.0] * 48, "short_factor": [1.0] * 48}}  # fmt: skip
PARTIAL: list[tuple[str, dict[str, Any]]] = [
    ("phi3", PHI4_MINI),
    ("phi3", {**PHI4_MINI, "rope_scaling": None, "partial_rotary_factor": None}),  # Phi3Config's 1.0
    ("phi3", {**PHI4_MINI, "rope_scaling": None, "partial_rotary_factor": 0.75,
              "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}}),  # the dict's wins
    ("phi", {"model_type": "phi", "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 4,
             "num_attention_heads": 32, "vocab_size": 51200, "partial_rotary_factor": 0.75,
             "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.25}}),
    ("glm", {"model_type": "glm", "hidden_size": 4096, "intermediate_size": 13696, "num_hidden_layers": 4,
             "num_attention_heads": 32, "num_key_value_heads": 2, "vocab_size": 151552,
             "rope_scaling": {"rope_type": "default", "partial_rotary_factor": 0.25}}),
]  # fmt: skip
CONFIG_CLASS = {"phi3": "Phi3Config", "phi": "PhiConfig", "glm": "GlmConfig"}


@pytest.mark.parametrize(("model_type", "doc"), PARTIAL, ids=[f"{t}-{i}" for i, (t, _) in enumerate(PARTIAL)])
def test_partial_rotary_factor_is_read_as_transformers_reads_it(model_type, doc):
    transformers = pytest.importorskip("transformers")
    doc = {k: v for k, v in doc.items() if v is not None}
    cfg = getattr(transformers, CONFIG_CLASS[model_type])(**{k: v for k, v in doc.items() if k != "model_type"})
    spec = hf_config_from_dict(doc, Path("config.json"))
    assert spec.rope_fraction == cfg.rope_parameters["partial_rotary_factor"]
    assert spec.rotary_dims == int(spec.d_head * spec.rope_fraction)


def test_phi4_mini_partial_rotary_is_noted_under_impl_hf():
    """Phi-4-mini rotates 96 of 128 dims. Since 2026-12-04 it takes Phi-3's own census, which
    has the partial rotary's parts (tests/test_phi3_census.py): no note; under a census whose
    rotary turns whole heads (Mistral's, which it took before) the rotary calls are priced at
    the full width and predict says so (the fused path's full-width rotary is documented)."""
    spec = hf_config_from_dict(PHI4_MINI, Path("phi-4-mini/config.json"))
    assert (spec.rope_fraction, spec.rotary_dims) == (0.75, 96)
    assert family_of(spec) == "phi3" and not [n for n in _notes(spec) if "partial rotary" in n]
    mistral = replace(spec, hf_family="mistral")
    notes = [n for n in _notes(mistral) if "partial rotary" in n]
    assert len(notes) == 1 and "rope_fraction 0.75" in notes[0] and "mistral" in notes[0]
    assert not [n for n in _notes(replace(mistral, rope_fraction=1.0)) if "partial rotary" in n]


# --- 4. nope_layers / rope_fraction without a census part: said, not dropped silently -------------


@pytest.mark.parametrize(("extra", "word"), [("rope_fraction: 0.5\n", "rope_fraction 0.5"),
                                             ("nope_layers: 8\n", "8 NoPE layers")])  # fmt: skip
def test_yaml_rotary_fields_the_census_lacks_are_noted(tmp_path, extra, word):
    path = tmp_path / "m.yaml"
    path.write_text(LLAMA_YAML + extra)
    spec = get_model(path)
    assert family_of(spec) == "llama"
    assert len([n for n in _notes(spec) if word in n and "not modelled" in n]) == 1
    assert not [n for n in _notes(spec, replace(HF, impl="fused")) if word in n]


def test_families_whose_census_models_them_get_no_note():
    """GLM's census has the partial-rotary symbols, SmolLM3's a rope part: nothing to say."""
    glm = replace(get_model("llama3-8b"), hf_family="glm", rope_fraction=0.5)
    smol = replace(get_model("llama3-8b"), hf_family="smollm3", nope_layers=8)
    assert census_omissions(glm, 4096) == [] and census_omissions(smol, 4096) == []
    assert census_omissions(replace(glm, hf_family=""), 4096) != []


def test_the_activation_census_has_the_kernel_census_s_parts():
    """census_omissions reads the kernel census and speaks for the memory too."""
    act = _hf_activation_census()
    for name, fam in _census().items():
        kernel_sizes = {e[2] for part in ("layer", "rope") for e in fam.get(part, [])}
        kept = act[name]["none"]
        act_sizes = {e[0] for e in kept["layer"] + kept["rest"]}
        assert ("window" in fam) == ("window" in kept), name
        assert ("rope" in fam) == ("rope" in kept), name
        # a partial rotary: its rotated and passed widths in the calls, its cos/sin table kept
        assert bool(kernel_sizes & {"T*qr", "T*qp"}) == bool(act_sizes & {"T*qr", "T*qp", "L*hdr"}), name


# --- 5. Qwen3 / Mixtral windows under impl hf: said ----------------------------------------------


@pytest.mark.parametrize("name", ["qwen3-8b", "mixtral-8x7b"])
def test_a_window_the_census_lacks_is_noted(name):
    spec = replace(get_model(name), sliding_window=2048, sliding_layers=0)
    assert "window" not in _census()[family_of(spec)]
    notes = [n for n in _notes(spec) if "sliding window's mask" in n]
    assert len(notes) == 1 and "not modelled" in notes[0]
    # a sequence shorter than the window: transformers builds no sliding mask, nothing left out
    assert not [n for n in _notes(spec, replace(HF, seq_len=1024)) if "sliding window's mask" in n]
    # Mistral's census has the window part: no such note
    assert not [n for n in _notes(replace(get_model("llama3-8b"), sliding_window=2048)) if "sliding window's mask" in n]


# --- 6. stage_costs' only= ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["llama2-7b", "deepseek-v2"])
def test_stage_costs_refuses_a_stage_outside_the_pipeline(name):
    plan = Plan(tp=1, pp=2, dp=1, micro_batch=1, global_batch=4, seq_len=1024)
    system = get_system("dgx-h100")
    for only in ({2}, {1, 5}, {-1}):
        with pytest.raises(ConfigError, match=r"stage -?\d+ .*pp 2") as e:
            stage_costs(get_model(name), plan, system, only=frozenset(only))
        assert "\n" not in str(e.value)
    assert [s.stage for s in stage_costs(get_model(name), plan, system, only=frozenset({1}))] == [1]
