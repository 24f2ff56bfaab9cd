"""More HuggingFace families (h6): Gemma 1, Granite, OLMoE, Cohere, GLM / GLM-4, Phi, SmolLM3.

Their configs, written by transformers' own config classes at the published sizes, read as the
model transformers builds (the same parameters, on the meta device); what the operators cannot
express is refused with the file and field; what the new ModelSpec fields add (Phi's output
bias, Cohere's bias-free LayerNorm, SmolLM3's NoPE layers) is costed; ``--impl hf`` takes
Gemma's and Granite's own censuses (the others': tests/test_hf_more_censuses.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from tests.test_dense_families import (  # noqa: F401  (hf: a fixture)
    hf,
    published_reads_as_transformers_builds,
)
from trainsim.builders.costs import LayerCoster, OpCoster
from trainsim.builders.eager import (
    HF_FAMILY_CENSUSES,
    HF_MOE_FAMILIES,
    _census,
    eager_bytes,
    family_of,
)
from trainsim.builders.memory import (
    _hf_activation_census,
    hf_activation_provenance,
    memory_per_gpu,
    stage_params,
)
from trainsim.builders.models import get_model, read_hf_config
from trainsim.builders.plan import Plan
from trainsim.builders.predict import predict_llm
from trainsim.errors import ConfigError

# id -> (config class, the published model's sizes (its Hub config), spec attributes it must read as)
PUBLISHED: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "gemma-7b": ("GemmaConfig", {"hidden_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
                                 "num_key_value_heads": 16, "head_dim": 256, "intermediate_size": 24576,
                                 "vocab_size": 256000, "hidden_act": "gelu"},
                 {"activation": "geglu", "d_head": 256, "n_kv": 16, "tied_embeddings": True, "layer_norms": 2,
                  "hf_family": "gemma", "seq_len": 8192}),
    "gemma-2b": ("GemmaConfig", {"hidden_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 8,
                                 "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 16384,
                                 "vocab_size": 256000},
                 {"n_kv": 1, "d_head": 256, "q_width": 2048}),
    "granite-3.0-8b": ("GraniteConfig", {"hidden_size": 4096, "num_hidden_layers": 40, "num_attention_heads": 32,
                                         "num_key_value_heads": 8, "intermediate_size": 12800, "vocab_size": 49155,
                                         "max_position_embeddings": 4096, "tie_word_embeddings": True,
                                         "embedding_multiplier": 12.0, "logits_scaling": 16.0,
                                         "residual_multiplier": 0.22, "attention_multiplier": 0.0078125},
                       {"activation": "swiglu", "n_kv": 8, "tied_embeddings": True, "bias": False,
                        "hf_family": "granite"}),
    "olmoe-1b-7b": ("OlmoeConfig", {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 16,
                                    "intermediate_size": 1024, "vocab_size": 50304, "num_experts": 64,
                                    "num_experts_per_tok": 8, "max_position_embeddings": 4096},
                    {"num_experts": 64, "top_k": 8, "expert_ffn": 1024, "qk_norm": "full", "shared_ffn_hidden": 0,
                     "router_bias": False, "dense_layers": ()}),
    "command-r": ("CohereConfig", {"hidden_size": 8192, "num_hidden_layers": 40, "num_attention_heads": 64,
                                   "num_key_value_heads": 64, "intermediate_size": 22528, "vocab_size": 256000,
                                   "logit_scale": 0.0625},
                  {"norm": "layernorm", "norm_bias": False, "parallel_residual": True, "layer_norms": 1,
                   "activation": "swiglu", "tied_embeddings": True, "bias": False}),
    "glm-4-9b": ("GlmConfig", {"hidden_size": 4096, "num_hidden_layers": 40, "num_attention_heads": 32,
                               "num_key_value_heads": 2, "intermediate_size": 13696, "vocab_size": 151552},
                 {"qkv_bias": True, "bias": False, "n_kv": 2, "d_head": 128, "layer_norms": 2,
                  "tied_embeddings": False}),
    "glm-4-9b-0414": ("Glm4Config", {"hidden_size": 4096, "num_hidden_layers": 40, "num_attention_heads": 32,
                                     "num_key_value_heads": 2, "intermediate_size": 13696, "vocab_size": 151552},
                      {"qkv_bias": True, "layer_norms": 4, "hf_family": "glm4"}),
    "glm-no-bias": ("GlmConfig", {"hidden_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
                                  "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 1024,
                                  "vocab_size": 1000, "pad_token_id": 0, "attention_bias": False},
                    {"qkv_bias": False}),
    "phi-2": ("PhiConfig", {"hidden_size": 2560, "num_hidden_layers": 32, "num_attention_heads": 32,
                            "intermediate_size": 10240, "vocab_size": 51200, "partial_rotary_factor": 0.4,
                            "resid_pdrop": 0.1},
              {"norm": "layernorm", "norm_bias": True, "activation": "gelu", "bias": True, "head_bias": True,
               "parallel_residual": True, "layer_norms": 1, "tied_embeddings": False, "d_head": 80}),
    "phi-1.5-tied": ("PhiConfig", {"hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 32,
                                   "intermediate_size": 8192, "vocab_size": 51200, "tie_word_embeddings": True},
                     {"tied_embeddings": True, "head_bias": True}),
    "smollm3-3b": ("SmolLM3Config", {"hidden_size": 2048, "num_hidden_layers": 36, "num_attention_heads": 16,
                                     "num_key_value_heads": 4, "intermediate_size": 11008, "vocab_size": 128256,
                                     "max_position_embeddings": 65536},
                   {"nope_layers": 9, "n_kv": 4, "tied_embeddings": True, "sliding_window": 0, "sliding_layers": 0}),
    "smollm3-windowed": ("SmolLM3Config", {"hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8,
                                           "num_key_value_heads": 2, "intermediate_size": 1024, "vocab_size": 1000, "pad_token_id": 0,
                                           "use_sliding_window": True, "sliding_window": 256,
                                           "no_rope_layers": [1, 0, 1, 0, 1, 1, 1, 0]},
                         {"nope_layers": 3, "sliding_window": 256, "sliding_layers": 3}),
}  # fmt: skip


@pytest.mark.parametrize("case", PUBLISHED)
def test_published_sizes_have_transformers_parameter_count(hf, tmp_path, case):  # noqa: F811
    spec, n = published_reads_as_transformers_builds(hf, tmp_path, PUBLISHED[case])
    assert spec.active_params() <= n and (spec.active_params() == n) == (not spec.is_moe)


def test_published_totals(tmp_path):
    """The published models' sizes (their model cards), as the counts above give them."""
    totals = {"gemma-7b": 8.54e9, "olmoe-1b-7b": 6.92e9, "command-r": 34.98e9, "phi-2": 2.78e9, "smollm3-3b": 3.08e9}
    for case, total in totals.items():
        assert _spec(tmp_path, case).params(padded=False) == pytest.approx(total, rel=2e-3)


# --- reader errors ---------------------------------------------------------------------------

GEMMA = {"model_type": "gemma", "hidden_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 8,
         "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 16384, "vocab_size": 256000}  # fmt: skip
LLAMA_LIKE = {**GEMMA, "head_dim": None}

BAD = [
    ({**GEMMA, "attention_bias": True}, "field 'attention_bias' is true and the other linear layers have no bias"),
    ({**LLAMA_LIKE, "model_type": "granite", "mlp_bias": True}, "field 'mlp_bias' is true and the other"),
    ({**LLAMA_LIKE, "model_type": "olmoe", "attention_bias": True}, "field 'attention_bias' is true"),
    ({**LLAMA_LIKE, "model_type": "cohere", "use_qk_norm": True}, "field 'use_qk_norm' is true: a LayerNorm over each"),
    ({**LLAMA_LIKE, "model_type": "phi", "qk_layernorm": True}, "field 'qk_layernorm' is true: LayerNorms with biases"),
    ({k: v for k, v in LLAMA_LIKE.items() if k != "intermediate_size"} | {"model_type": "phi"},
     "missing field 'intermediate_size'"),
    ({k: v for k, v in LLAMA_LIKE.items() if k != "hidden_size"} | {"model_type": "glm4"}, "missing field 'hidden_size'"),
    ({**LLAMA_LIKE, "model_type": "olmoe", "num_experts": "64"}, "field 'num_experts' must be a positive integer"),
    ({**LLAMA_LIKE, "model_type": "smollm3", "no_rope_layers": [1, 0]},
     "field 'no_rope_layers' must list 1 \\(rotary\\) or 0 \\(none\\) for each of the 18 layers"),
    ({**LLAMA_LIKE, "model_type": "smollm3", "no_rope_layers": [True] * 18}, "field 'no_rope_layers' must list"),
    ({**LLAMA_LIKE, "model_type": "glm", "attention_bias": "yes"}, "field 'attention_bias' must be true or false"),
    ({**LLAMA_LIKE, "model_type": "cohere", "hidden_act": "tanh"}, "field 'hidden_act' is 'tanh'"),
]  # fmt: skip


@pytest.mark.parametrize(("doc", "message"), BAD, ids=[m[:40] for _, m in BAD])
def test_bad_configs_name_the_file_and_field(tmp_path, doc, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in doc.items() if v is not None}))
    with pytest.raises(ConfigError, match=message) as e:
        read_hf_config(path)
    assert str(e.value).startswith(f"{path}:")
    assert "\n" not in str(e.value)


def test_yaml_spec_takes_the_new_fields(tmp_path):
    p = tmp_path / "m.yaml"
    base = "name: x\nhidden: 64\nlayers: 4\nheads: 4\nvocab: 99\nposition: rotary\n"
    p.write_text(base + "nope_layers: 5\n")
    with pytest.raises(ConfigError, match="nope_layers \\(5\\)") as e:
        get_model(p)
    assert str(e.value).startswith(f"{p}:")
    p.write_text(base + "nope_layers: 1\nnorm_bias: false\nhead_bias: true\n")
    m = get_model(p)
    assert (m.nope_layers, m.norm_bias, m.head_bias, m.rope_share) == (1, False, True, 0.75)
    assert m.params() - replace(m, norm_bias=True, head_bias=False).params() == m.padded_vocab() - (2 * 4 + 1) * 64


# --- what the new fields cost ------------------------------------------------------------------

LLAMA = get_model("llama2-7b")
PLAN = Plan(tp=2, micro_batch=1, global_batch=8, dp=1, seq_len=2048)
COSTER = OpCoster("a100-sxm4-80gb")


def _ops(model, plan=PLAN, part="layer"):
    lc = LayerCoster(model, plan, COSTER)
    return [o for ph in ("fwd", "bwd") for o in getattr(lc, part)(ph)]


def test_head_bias_adds_parameters_memory_and_a_backward_reduction():
    neox = get_model("gpt-neox-20b")
    biased = replace(neox, head_bias=True)
    assert biased.params(tp=2) - neox.params(tp=2) == neox.padded_vocab(2)
    plan = replace(PLAN, pp=2, global_batch=16)
    last = plan.pp - 1
    assert stage_params(biased, plan, last) - stage_params(neox, plan, last) == neox.padded_vocab(2) / 2
    assert stage_params(biased, plan, 0) == stage_params(neox, plan, 0)
    (grad,) = [o for o in _ops(biased, part="head") if o.name == "output_bias_grad"]
    assert grad.phase == "bwd" and grad.seconds > 0 and "bias-grad-as-elementwise" in grad.provenance
    assert not [o for o in _ops(neox, part="head") if o.name == "output_bias_grad"]
    assert memory_per_gpu(biased, plan)[-1].total_bytes > memory_per_gpu(neox, plan)[-1].total_bytes


def test_layernorm_without_bias_has_half_the_norm_weights():
    neox = get_model("gpt-neox-20b")
    plain = replace(neox, norm_bias=False)
    assert neox.params() - plain.params() == (2 * neox.layers + 1) * neox.hidden
    assert (neox.norm_tensors, plain.norm_tensors) == (2, 1)
    plan = replace(PLAN, global_batch=16, micro_batch=1)  # gradient accumulation: the small tensors' adds
    assert LayerCoster(plain, plan, COSTER)._small_tensors() == LayerCoster(neox, plan, COSTER)._small_tensors() - 2
    assert memory_per_gpu(plain, plan)[0].total_bytes < memory_per_gpu(neox, plan)[0].total_bytes
    # RMSNorm has one tensor whatever norm_bias says
    assert replace(LLAMA, norm_bias=False).params() == LLAMA.params()


@pytest.mark.parametrize("impl", ["fused", "neox"])
def test_nope_layers_cost_the_rotary_on_the_rotating_share(impl):
    plan = replace(PLAN, impl=impl)
    nope = replace(LLAMA, nope_layers=8)  # 8 of 32 layers without rotary
    (a,) = [o for o in _ops(nope, plan) if o.name == "rotary" and o.phase == "fwd"]
    (b,) = [o for o in _ops(LLAMA, plan) if o.name == "rotary" and o.phase == "fwd"]
    assert a.seconds == pytest.approx(0.75 * b.seconds) and "rope-on-0.75-of-layers" in a.provenance
    assert nope.params() == LLAMA.params()
    others = [o.seconds for o in _ops(nope, plan) if o.name != "rotary"]
    assert others == [o.seconds for o in _ops(LLAMA, plan) if o.name != "rotary"]
    with pytest.raises(ConfigError, match="nope_layers"):
        replace(get_model("gpt2"), nope_layers=1)  # learned positions: nothing to leave out


@pytest.mark.parametrize("case", ["gemma-7b", "granite-3.0-8b", "olmoe-1b-7b", "command-r", "glm-4-9b",
                                  "glm-4-9b-0414", "phi-2", "smollm3-3b"])  # fmt: skip
def test_predict_runs_for_each_family(tmp_path, case):
    cls, kwargs, _ = PUBLISHED[case]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": _TYPES[cls], **kwargs}))
    spec = read_hf_config(tmp_path / "config.json")
    tp = 2
    plan = Plan(tp=tp, pp=2, dp=2, micro_batch=1, global_batch=16, seq_len=2048)
    r = predict_llm(spec, plan, "dgx-a100")
    assert r.iteration_time_s > 0 and r.mfu > 0
    assert all(m.total_bytes > 0 for m in r.memory)


_TYPES = {"GemmaConfig": "gemma", "GraniteConfig": "granite", "OlmoeConfig": "olmoe", "CohereConfig": "cohere",
          "GlmConfig": "glm", "Glm4Config": "glm4", "PhiConfig": "phi", "SmolLM3Config": "smollm3"}  # fmt: skip


# --- impl hf ---------------------------------------------------------------------------------

HF_PLAN = Plan(tp=1, dp=1, micro_batch=1, global_batch=1, seq_len=2048, impl="hf")


def _spec(tmp_path, case):
    cls, kwargs, _ = PUBLISHED[case]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": _TYPES[cls], **kwargs}))
    return read_hf_config(tmp_path / "config.json")


@pytest.mark.parametrize("case", ["gemma-7b", "granite-3.0-8b"])
def test_impl_hf_takes_gemma_and_granite_censuses(tmp_path, case):
    """Their own censuses, not LLaMA's (whose shapes they share): Gemma's norms multiply in fp32,
    Granite divides its [T, V] logits by logits_scaling; each kernel and activation census holds them."""
    spec = _spec(tmp_path, case)
    assert family_of(spec) == spec.hf_family
    own = eager_bytes(spec, "rest", "fwd", tokens=2048, seq=2048, dtype_bytes=2)[0]
    as_llama = eager_bytes(replace(spec, hf_family=""), "rest", "fwd", tokens=2048, seq=2048, dtype_bytes=2)[0]
    assert own > as_llama
    r = predict_llm(spec, HF_PLAN, "dgx-h100", gpus=1, simulate=False)
    assert r.iteration_time_s > predict_llm(replace(spec, hf_family=""), HF_PLAN, "dgx-h100", gpus=1,
                                            simulate=False).iteration_time_s  # fmt: skip
    assert hf_activation_provenance(spec, HF_PLAN).startswith(f"hf-activation-census:{spec.hf_family}:")


def test_every_hf_family_census_is_in_both_censuses():
    """Each hf_family's censuses (an MoE family's one per experts implementation, without a tied
    part: the MoE censuses are recorded untied and add none, as Mixtral's; GPT-2's is recorded
    tied, as its config is, its rest having the add)."""
    for fam in HF_FAMILY_CENSUSES:
        names = (fam, f"{fam}_grouped") if fam in HF_MOE_FAMILIES else (fam,)
        for name in names:
            want = {"layer", "rest", "kernels"} | (set() if fam in (*HF_MOE_FAMILIES, "gpt2") else {"tied"})
            assert want <= set(_census()[name])
            assert name in _hf_activation_census()
