"""A RoPE-scaled config's default sequence length is its pre-training context.

``max_position_embeddings`` is the extended context (Llama 3.1: 131,072; DeepSeek-V3: 163,840),
which pre-training does not run at; predicting a config without ``--seq-len`` had costed that.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainsim.builders.models import get_model, hf_config_from_dict
from trainsim.builders.plan import Plan
from trainsim.builders.predict import default_seq_note, predict_llm
from trainsim.errors import ConfigError

LLAMA31_8B = {  # meta-llama/Llama-3.1-8B's config.json (the fields read)
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
    "hidden_act": "silu", "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}  # fmt: skip


def test_rope_scaled_config_defaults_to_its_pretraining_context() -> None:
    m = hf_config_from_dict(LLAMA31_8B, Path("llama31/config.json"))
    assert m.seq_len == 8192 and "original_max_position_embeddings" in m.seq_source
    note = default_seq_note(m)
    assert note is not None and "pre-training context, 8,192 tokens" in note and "131,072" in note
    # the length the user gives wins, and then nothing is said
    r = predict_llm(m, Plan(tp=8, dp=1, micro_batch=1, global_batch=8, seq_len=2048), "dgx-h100", simulate=False)
    assert r.plan.seq(m) == 2048


def test_config_without_rope_scaling_keeps_max_position_embeddings() -> None:
    doc = {**LLAMA31_8B, "rope_scaling": None, "max_position_embeddings": 8192}
    m = hf_config_from_dict(doc, Path("llama3/config.json"))
    assert m.seq_len == 8192 and m.seq_source == "" and default_seq_note(m) is None
    long = hf_config_from_dict({**doc, "max_position_embeddings": 32768}, Path("x/config.json"))
    assert long.seq_len == 32768 and "max_position_embeddings" in (default_seq_note(long) or "")


def test_gpt_oss_initial_context_length() -> None:
    doc = {"model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 24,
           "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 201088,
           "max_position_embeddings": 131072, "initial_context_length": 4096, "num_local_experts": 32,
           "num_experts_per_tok": 4, "sliding_window": 128, "tie_word_embeddings": False,
           "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                            "original_max_position_embeddings": 4096},
           "layer_types": ["sliding_attention", "full_attention"] * 12}  # fmt: skip
    m = hf_config_from_dict(doc, Path("gpt-oss-20b/config.json"))
    assert m.seq_len == 4096 and m.params(padded=False) == get_model("gpt-oss-20b").params(padded=False)
    del doc["rope_scaling"]
    assert hf_config_from_dict(doc, Path("g/config.json")).seq_source.startswith("initial_context_length")


@pytest.mark.parametrize("bad", [0, -4096, "4096", 4096.0, True])
def test_bad_original_context_is_one_line(bad: object) -> None:
    doc = {**LLAMA31_8B, "rope_scaling": {**LLAMA31_8B["rope_scaling"], "original_max_position_embeddings": bad}}  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match=r"^c/config.json: field 'rope_scaling.original_max_position_embeddings' "
                                          r"must be a positive integer \(tokens\), got"):  # fmt: skip
        hf_config_from_dict(doc, Path("c/config.json"))


def test_window_note_shows_a_small_share() -> None:
    """gpt-oss's 128-token window over 32k tokens read 'about 0% of the causal work'."""
    r = predict_llm("gpt-oss-20b", Plan(ep=8, dp=8, micro_batch=1, global_batch=64, seq_len=32768, recompute="full"),
                    "dgx-h100", simulate=False)  # fmt: skip
    (note,) = [n for n in r.warnings if "sliding window" in n]
    assert "about 0.78% of the causal work" in note
    from trainsim.builders.predict import _share

    assert _share(0.5) == "50%" and _share(0.0078) == "0.78%" and _share(0.0) == "0%"


def test_phi3_longrope_top_level_original_context() -> None:
    """Phi-3's LongRoPE configs (Phi-3-mini-128k-instruct, Phi-3.5-mini-instruct) keep
    original_max_position_embeddings at the top level, beside a rope_scaling of long/short
    factors only: 4,096 of 131,072 positions (it had read 131,072)."""
    doc = {"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064,
           "max_position_embeddings": 131072, "original_max_position_embeddings": 4096, "hidden_act": "silu",
           "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
           "rope_scaling": {"type": "longrope", "long_factor": [1.0] * 48, "short_factor": [1.0] * 48}}  # fmt: skip
    m = hf_config_from_dict(doc, Path("phi3-128k/config.json"))
    assert m.seq_len == 4096 and m.seq_source.startswith("original_max_position_embeddings")
    assert m.params(padded=False) == get_model("phi3-mini").params(padded=False)
    with pytest.raises(ConfigError, match=r"^p/config.json: field 'original_max_position_embeddings' must be"):
        hf_config_from_dict({**doc, "original_max_position_embeddings": "4k"}, Path("p/config.json"))
