"""``--impl hf`` for the families added in h6 (Cohere, Phi, GLM, GLM-4, OLMoE, SmolLM3), which it
had refused for want of a census, and Mistral's sliding window, which LLaMA's census (Mistral's
stand-in) did not have: each now has kernel and activation censuses taken from transformers'
own modules (``scripts/hf_eager_census.py``, ``scripts/hf_activation_census.py``), and each
part of them moves the prediction where the model has it."""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from trainsim.builders.costs import LayerCoster, OpCoster
from trainsim.builders.eager import CENSUS, _census, eager_bytes, family_of
from trainsim.builders.memory import (
    HF_ACTIVATIONS,
    hf_activation_parts,
    hf_activation_provenance,
    memory_per_gpu,
)
from trainsim.builders.models import get_model, hf_config_from_dict
from trainsim.builders.plan import Plan
from trainsim.builders.predict import dense_family_notes, predict_llm

# the published models' sizes (their Hub configs, as tests/test_more_families.py has them)
CONFIGS: dict[str, dict[str, Any]] = {
    "command-r": {"model_type": "cohere", "hidden_size": 8192, "num_hidden_layers": 40, "num_attention_heads": 64,
                  "num_key_value_heads": 64, "intermediate_size": 22528, "vocab_size": 256000, "logit_scale": 0.0625},
    "phi-2": {"model_type": "phi", "hidden_size": 2560, "num_hidden_layers": 32, "num_attention_heads": 32,
              "intermediate_size": 10240, "vocab_size": 51200, "rope_parameters": {"partial_rotary_factor": 0.4}},
    "glm-4-9b": {"model_type": "glm", "hidden_size": 4096, "num_hidden_layers": 40, "num_attention_heads": 32,
                 "num_key_value_heads": 2, "intermediate_size": 13696, "vocab_size": 151552},
    "glm-4-9b-0414": {"model_type": "glm4", "hidden_size": 4096, "num_hidden_layers": 40, "num_attention_heads": 32,
                      "num_key_value_heads": 2, "intermediate_size": 13696, "vocab_size": 151552},
    "olmoe-1b-7b": {"model_type": "olmoe", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 16,
                    "intermediate_size": 1024, "vocab_size": 50304, "num_experts": 64, "num_experts_per_tok": 8,
                    "max_position_embeddings": 4096},
    "smollm3-3b": {"model_type": "smollm3", "hidden_size": 2048, "num_hidden_layers": 36, "num_attention_heads": 16,
                   "num_key_value_heads": 4, "intermediate_size": 11008, "vocab_size": 128256,
                   "max_position_embeddings": 65536},
}  # fmt: skip
# the census each reads as (its experts' default, transformers 5's grouped_mm, for OLMoE)
FAMILY = {"command-r": "cohere", "phi-2": "phi", "glm-4-9b": "glm", "glm-4-9b-0414": "glm4",
          "olmoe-1b-7b": "olmoe_grouped", "smollm3-3b": "smollm3"}  # fmt: skip
HF = Plan(tp=1, dp=1, micro_batch=1, global_batch=1, seq_len=2048, impl="hf")


def _spec(case: str):
    return hf_config_from_dict(CONFIGS[case], Path(f"{case}/config.json"))


def _layer_op(model, plan: Plan, part: str = "layer", phase: str = "fwd"):
    lc = LayerCoster(model, plan, OpCoster("h100-sxm5-80gb"))
    ops = lc.layer(phase) if part == "layer" else lc.head(phase)
    (op,) = [o for o in ops if o.name == f"hf_eager_{part}"]
    return op


# --- every family predicts, with its own census ----------------------------------------------


@pytest.mark.parametrize("case", CONFIGS)
def test_each_family_predicts_under_impl_hf_with_its_own_census(case):
    spec = _spec(case)
    HF.validate(spec)  # refused until 2026-12-04 ("no kernel census of transformers' ... modules")
    assert family_of(spec) == FAMILY[case]
    r = predict_llm(spec, HF, "dgx-h100", gpus=1, simulate=False)
    assert r.iteration_time_s > 0 and all(m.total_bytes > 0 for m in r.memory)
    assert hf_activation_provenance(spec, HF).startswith(f"hf-activation-census:{FAMILY[case]}:")
    # their own modules' census: no note that a feature of theirs (GLM-4's extra norms, OLMoE's
    # q/k norms) is left out of another family's
    assert not [n for n in dense_family_notes(spec, HF) if "are not in it" in n]


def test_olmoe_takes_a_census_per_experts_implementation():
    """As Mixtral's: the eager loop (a zeroed [E, 2f, d] gradient per expert, its syncs) is slower
    than grouped_mm; both are OLMoE's own (its q/k norms over the whole projections): more bytes
    a layer than Mixtral's census, which the same shapes would have taken."""
    spec = _spec("olmoe-1b-7b")
    assert family_of(spec, "eager") == "olmoe"
    grouped = predict_llm(spec, HF, "dgx-h100", gpus=1, simulate=False).iteration_time_s
    eager = predict_llm(spec, replace(HF, hf_experts="eager"), "dgx-h100", gpus=1, simulate=False).iteration_time_s
    assert eager > grouped
    as_mixtral = replace(spec, hf_family="")
    assert family_of(as_mixtral) == "mixtral_grouped"
    kw: dict[str, Any] = {"tokens": 4096.0, "seq": 4096.0, "dtype_bytes": 2}
    assert eager_bytes(spec, "layer", "fwd", **kw)[0] > eager_bytes(as_mixtral, "layer", "fwd", **kw)[0]


# --- each part matters -----------------------------------------------------------------------


def test_mistral_window_costs_time_and_memory_from_the_window_on():
    """Mistral 7B's 4,096-token window: transformers builds the sliding mask once kv_length >=
    window, and SDPA then gets K/V repeated to the query heads and an additive mask a layer (the
    window part), the mask built once in the rest (window_rest). At the window − 1 the model is
    LLaMA's to the bit (its layer and rest are LLaMA's calls); from the window on it costs more
    time in the eager calls and more activation memory than the same model without a window."""
    mistral = get_model("mistral-7b")
    assert mistral.sliding_window == 4096 and family_of(mistral) == "mistral"
    plain = replace(mistral, sliding_window=0)
    assert family_of(plain) == "llama"
    for seq, more in ((4095, False), (4096, True), (8192, True)):
        plan = replace(HF, seq_len=seq)
        for part in ("layer", "rest"):
            a, b = _layer_op(mistral, plan, part).seconds, _layer_op(plain, plan, part).seconds
            assert (a > b) if more else (a == b), (seq, part)
        mem, mem0 = hf_activation_parts(mistral, plan), hf_activation_parts(plain, plan)
        assert (mem[0] > mem0[0] and mem[2] == mem0[2]) if more else mem == mem0, seq
        # checkpointed, the layers' recompute closures hold the boolean [L, L] mask (the rest's)
        ckpt = replace(plan, recompute="full")
        assert (hf_activation_parts(mistral, ckpt)[2] > hf_activation_parts(plain, ckpt)[2]) == more
    below = predict_llm(mistral, replace(HF, seq_len=4095), "dgx-h100", gpus=1, simulate=False)
    at = predict_llm(mistral, replace(HF, seq_len=4096), "dgx-h100", gpus=1, simulate=False)
    act = [sum(m.activations_bytes for m in memory_per_gpu(mistral, r.plan, at_peak=False)) / r.plan.seq(mistral)
           for r in (below, at)]
    assert act[1] > act[0] and at.iteration_time_s > below.iteration_time_s


def test_other_llama_like_windows_take_mistral_s_census():
    """Phi-3-mini's 2,047-token window (LLaMA's census before, Mistral's from 2026-12-04, its own
    from 2026-12-04, with a window part as Mistral's) and a LLaMA-like model's without a family of
    its own (Mistral's): the window's mask calls from the window on."""
    phi3 = get_model("phi3-mini")
    assert phi3.sliding_window == 2047 and family_of(phi3) == "phi3"
    plan = replace(HF, seq_len=4096)
    assert _layer_op(phi3, plan).seconds > _layer_op(replace(phi3, sliding_window=0), plan).seconds
    plain = replace(phi3, hf_family="")
    assert family_of(plain) == "mistral"
    assert _layer_op(plain, plan).seconds > _layer_op(replace(plain, sliding_window=0), plan).seconds


def test_smollm3_more_nope_layers_spend_less_on_rotary():
    """SmolLM3's census layer is a NoPE one and part rope the rotary's calls, on the rotating
    share (ModelSpec.rope_share): every 4th layer NoPE (9 of 36) costs less than none, more than
    every other; a model with no rotating layer has no rope part at all."""
    smol = _spec("smollm3-3b")
    assert smol.nope_layers == 9 and "rope" in _census()["smollm3"]
    times = [_layer_op(replace(smol, nope_layers=n), HF).seconds for n in (0, 9, 18, 36)]
    assert times == sorted(times, reverse=True) and len(set(times)) == 4
    kw: dict[str, Any] = {"tokens": 2048.0, "seq": 2048.0, "dtype_bytes": 2}
    full, none = (eager_bytes(replace(smol, nope_layers=n), "layer", "bwd", **kw)[0] for n in (0, 36))
    rope = sum(c * 2048 * (smol.q_width if "q" in s else smol.kv_width) / (2 if s.endswith("/2") else 1) * 2
               for ph, _, s, _, c in _census()["smollm3"]["rope"] if ph == "bwd")  # fmt: skip
    assert full - none == pytest.approx(rope)
    # memory: a rotating layer keeps the cos/sin table once (the rope part's rest)
    assert hf_activation_parts(replace(smol, nope_layers=0), HF)[2] > hf_activation_parts(
        replace(smol, nope_layers=36), HF)[2]  # fmt: skip


def test_smollm3_window_applies_on_its_windowed_layers():
    doc = {**CONFIGS["smollm3-3b"], "use_sliding_window": True, "sliding_window": 1024}
    smol = hf_config_from_dict(doc, Path("smollm3/config.json"))
    assert (smol.sliding_window, smol.sliding_layers) == (1024, 9)  # its NoPE layers
    plain = replace(smol, sliding_window=0, sliding_layers=0)
    plan = replace(HF, seq_len=2048)
    assert _layer_op(smol, plan).seconds > _layer_op(plain, plan).seconds
    assert hf_activation_parts(smol, plan)[0] > hf_activation_parts(plain, plan)[0]


def test_partial_rotary_rotates_the_configured_share():
    """Phi-2 rotates 32 of each head's 80 dims (partial_rotary_factor 0.4), GLM half of 128: the
    census's rotated widths follow ModelSpec.rotary_dims, fewer rotated dims fewer bytes."""
    phi, glm = _spec("phi-2"), _spec("glm-4-9b")
    assert (phi.rope_fraction, phi.rotary_dims, glm.rotary_dims) == (0.4, 32, 64)
    kw: dict[str, Any] = {"tokens": 2048.0, "seq": 2048.0, "dtype_bytes": 2}
    for spec in (phi, glm):
        less, full = (eager_bytes(replace(spec, rope_fraction=f), "layer", "fwd", **kw)[0] for f in (0.25, 1.0))
        assert less < eager_bytes(spec, "layer", "fwd", **kw)[0] < full
    sizes = {s for *_, s, _, _ in _census()["phi"]["layer"]}
    assert {"T*qr", "T*qp", "T*kvr", "T*kvp"} <= sizes


def test_family_features_are_in_their_censuses():
    """Cohere multiplies its [T, V] logits by logit_scale; Phi's output bias has its gradient
    summed over the [T, V] logits' gradient; GLM-4's two extra norms make its layer dearer than
    GLM's at the same shapes; Cohere's tied embedding adds its gradients' add."""
    rest = {fam: {(ph, call, s) for ph, call, s, _, _ in _census()[fam]["rest"]} for fam in ("cohere", "phi")}
    assert ("fwd", "mul", "T*V") in rest["cohere"] and ("bwd", "sum", "T*V") in rest["phi"]
    glm, glm4 = _spec("glm-4-9b"), _spec("glm-4-9b-0414")
    assert _layer_op(glm4, HF).seconds > _layer_op(replace(glm4, hf_family="glm", layer_norms=2), HF).seconds
    assert _layer_op(glm, HF).seconds == _layer_op(replace(glm4, hf_family="glm", layer_norms=2), HF).seconds
    cohere = _spec("command-r")
    assert cohere.tied_embeddings
    untied = replace(cohere, tied_embeddings=False)
    assert _layer_op(cohere, HF, "rest", "bwd").seconds > _layer_op(untied, HF, "rest", "bwd").seconds


# --- the scripts re-run a family alone, keeping the others -------------------------------------


def _script(name: str, monkeypatch: pytest.MonkeyPatch):
    transformers = pytest.importorskip("transformers")
    shipped = json.loads((CENSUS if "eager" in name else HF_ACTIVATIONS).read_text(encoding="utf-8"))
    if transformers.__version__ != shipped["versions"]["transformers"]:
        pytest.skip(f"recorded with transformers {shipped['versions']['transformers']}")
    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, mod)  # its dataclass looks its module up
    spec.loader.exec_module(mod)
    return mod, shipped


@pytest.mark.parametrize(("script", "families"), [("hf_eager_census", ["mistral", "phi", "smollm3"]),
                                                  ("hf_activation_census", ["phi"])])  # fmt: skip
def test_census_scripts_rerun_the_new_families_alone(tmp_path, monkeypatch, script, families):
    """``--families`` re-counts those and keeps the JSON's others as they are: the shipped entries
    are what the script finds again."""
    mod, shipped = _script(script, monkeypatch)
    out = tmp_path / "census.json"
    out.write_text(json.dumps(shipped))
    monkeypatch.setattr(mod, "OUT", out)
    assert mod.main(["--families", *families]) == 0
    assert json.loads(out.read_text(encoding="utf-8"))["families"] == shipped["families"]


def test_every_shipped_activation_family_was_taken_at_the_scripts_dims(monkeypatch):
    """Each family's recorded base dims are the script's ``BASE`` for it, every field included:
    a family re-run alone leaves the others as they were, so a field added to ``Dims`` (``r``,
    the rotated dims) had been missing from the eleven families not re-run with it."""
    mod, shipped = _script("hf_activation_census", monkeypatch)
    for family, entry in shipped["families"].items():
        assert entry["dims"] == mod.BASE[family].__dict__, family
