"""impl hf's activation memory (builders/memory.py, builders/data/hf_activation_census.json):
the census's formula against a fresh measurement, and what it changes in memory_per_gpu."""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from trainsim.builders.memory import HF_ACTIVATIONS, hf_activation_parts, memory_per_gpu
from trainsim.builders.models import get_model
from trainsim.builders.plan import Plan
from trainsim.builders.predict import predict_llm

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "hf_activation_census.py"


def _script() -> ModuleType:
    """scripts/hf_activation_census.py, where the installed transformers is the recorded one."""
    transformers = pytest.importorskip("transformers")
    recorded = json.loads(HF_ACTIVATIONS.read_text(encoding="utf-8"))["versions"]["transformers"]
    if transformers.__version__ != recorded:
        pytest.skip(f"activation census recorded with transformers {recorded}, {transformers.__version__} installed: "
                    "re-run scripts/hf_activation_census.py and compare")  # fmt: skip
    spec = importlib.util.spec_from_file_location("hf_activation_census", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("family", ["llama", "mixtral_grouped"])
def test_census_formula_is_a_fresh_measurement_at_new_dimensions(family):
    """A model of dimensions the census never saw (batch 2, 24 tokens, d 72, head size 8):
    the bytes alive after the forward equal the shipped formula's, two layers, with and
    without gradient checkpointing; and the hooks' saved tensors are among them."""
    mod = _script()
    doc = json.loads(HF_ACTIVATIONS.read_text(encoding="utf-8"))["families"][family]
    x = replace(mod.BASE[family], b=2, s=24, d=72, hd=8, f=136, v=257)
    for mode, ckpt in (("none", False), ("checkpointed", True)):
        saved, alive = mod.measure(family, 2, x, checkpoint=ckpt)
        want = 2 * mod.formula_bytes(doc[mode]["layer"], x, family) + mod.formula_bytes(doc[mode]["rest"], x, family)
        assert mod.total(alive) == want, mode
        assert saved.items() <= alive.items() or ckpt  # checkpointing keeps its inputs outside autograd's hooks


def test_llama_layer_is_what_hf_saves_not_megatrons():
    """LLaMA's layer, as measured: two RMSNorms each keep their fp32 input and bf16 output (the
    second the next GEMM's input too) and fp32 rsqrt; q (roped) and the attention output at q
    width, k and v at kv width, SDPA's fp32 log-sum-exp; gate, up, silu(gate) and the product
    at f width. Megatron's fused kernels keep 8d + 4q + 4kv + 6f + 4h bytes a token."""
    m = get_model("llama3-8b")
    d, f, q, kv, h = m.hidden, m.ffn, m.q_width, m.kv_width, m.heads
    plan = Plan(micro_batch=2, seq_len=4096, impl="hf")
    kept, work, rest = hf_activation_parts(m, plan)
    t = 2 * 4096
    assert kept == t * (4 * 2 * d + 2 * 4 * d + 2 * 4 + 2 * 2 * q + 2 * 2 * kv + 4 * 2 * f + 4 * h) and work == 0
    assert rest >= t * 4 * m.vocab  # the loss's fp32 log-softmax of the logits
    ckpt, ckpt_work, _ = hf_activation_parts(m, replace(plan, recompute="full"))
    assert ckpt == t * 2 * d and ckpt_work == kept  # checkpointing keeps the layer input; the backward re-runs one


def test_hf_memory_differs_from_fused_and_fused_does_not_move():
    m = get_model("llama3-8b")
    fused = memory_per_gpu(m, Plan(micro_batch=1, seq_len=4096))[0]
    hf = memory_per_gpu(m, Plan(micro_batch=1, seq_len=4096, impl="hf"), at_peak=False)[0]
    assert fused.activations_bytes == 21529362432.0  # Korthikanti's figure, as before impl hf had its own
    kept, _, rest = hf_activation_parts(m, Plan(micro_batch=1, seq_len=4096, impl="hf"))
    assert hf.activations_bytes == m.layers * kept + rest > 1.3 * fused.activations_bytes
    # eager bf16: AdamW's two bf16 moments, not Megatron's fp32 master and moments (12 bytes)
    assert (hf.weights_bytes, hf.optimizer_bytes) == (fused.weights_bytes, fused.optimizer_bytes / 3)
    # the other impls' figures do not move: pipeline + full recompute, MoE with ZeRO-3
    pp = Plan(micro_batch=2, seq_len=2048, pp=2, global_batch=8, recompute="full")
    assert [s.activations_bytes for s in memory_per_gpu(m, pp)] == [1678245888.0, 3276275712.0]
    moe = Plan(micro_batch=1, seq_len=4096, dp=8, zero=3, global_batch=8)
    assert memory_per_gpu(get_model("mixtral-8x7b"), moe)[0].activations_bytes == 33374076928.0


def test_hf_schedule_counts_layers_in_flight_and_the_rest_on_the_last_stage():
    m = get_model("llama3-8b")
    plan = Plan(micro_batch=1, seq_len=2048, pp=2, global_batch=8, impl="hf", recompute="full")
    kept, work, rest = hf_activation_parts(m, plan)
    first, last = memory_per_gpu(m, plan, at_peak=False)
    assert first.activations_bytes == 16 * 2 * kept + work  # 1F1B: two micro-batches in flight on stage 0
    assert last.activations_bytes == 16 * 1 * kept + work + rest


def test_hf_moe_keeps_its_token_expert_pairs_and_predict_says_where_memory_comes_from():
    m = get_model("mixtral-8x7b")
    plan = Plan(micro_batch=1, seq_len=4096, impl="hf", dp=8, zero=3, global_batch=8)
    grouped, _, _ = hf_activation_parts(m, plan)
    t, k, d = 4096, m.top_k, m.hidden
    assert grouped > t * k * (2 * 2 * d + 2 * 2 * m.expert_ffn)  # the sorted pairs' rows: gathered input, gate/up, ...
    r = predict_llm(m, plan, "dgx-h100", simulate=False)
    assert r.provenance["activations"].startswith("hf-activation-census:mixtral_grouped:none")
    fused = predict_llm(get_model("llama3-8b"), Plan(micro_batch=1, seq_len=4096), "dgx-h100", simulate=False)
    assert fused.provenance["activations"].startswith("korthikanti-2022")


def test_every_kernel_census_family_has_activations_or_a_stated_stand_in():
    """A model --impl hf prices (eager.family_of) always gets its memory: Gemma 2/3's kernel
    censuses came without activation censuses, and predict raised a KeyError for them."""
    import json

    from trainsim.builders import memory
    from trainsim.builders.eager import CENSUS

    kernel_families = {k for k, v in json.loads(CENSUS.read_text()).items() if isinstance(v, dict) and "kernels" in v}
    have = set(memory._hf_activation_census())
    assert kernel_families <= have | {k for k, v in memory._HF_ACTIVATION_STAND_INS.items() if v in have}
    for name in ("gemma2-9b", "gemma3-12b"):
        plan = Plan(micro_batch=1, seq_len=4096, impl="hf")
        _fam, stood_for = memory._hf_activation_family(get_model(name), plan)
        if stood_for:
            assert f"standing in for {stood_for}" in memory.hf_activation_provenance(get_model(name), plan)
        assert memory.memory_per_gpu(get_model(name), plan, at_peak=False)[0].activations_bytes > 0


def test_gemma_census_is_a_fresh_measurement_with_windowed_layers_and_the_cap():
    """Gemma 2 at dimensions the census never saw, as the real models are built (sliding and
    full layers alternating, the final-logit cap, tied embeddings): the bytes alive after the
    forward are the formula's, its window part on the two sliding layers of three, its rest
    part and the cap's once; with and without gradient checkpointing."""
    mod = _script()
    doc = json.loads(HF_ACTIVATIONS.read_text(encoding="utf-8"))["families"]["gemma2"]
    x = replace(mod.BASE["gemma2"], b=2, s=24, d=72, hd=8, f=136, v=257)
    assert x.s > mod.GEMMA_WINDOW
    for mode, ckpt in (("none", False), ("checkpointed", True)):
        saved, alive = mod.measure("gemma2", 3, x, checkpoint=ckpt, variant="mixed+cap")
        want = mod.model_bytes(doc[mode], x, "gemma2", 3, "mixed+cap")
        assert mod.total(alive) == want, mode
        assert want > mod.model_bytes(doc[mode], x, "gemma2", 3, ""), mode  # the window's and the cap's bytes
        assert saved.items() <= alive.items() or ckpt


def test_gemma_layers_keep_their_own_bytes_and_windowed_layers_more():
    """Gemma 2's layer, its own census (LLaMA's stood in until 2026-12-03): four (1 + weight)
    RMSNorms keep their fp32 input and normalised output and an fp32 rsqrt each (32d + 16 bytes
    a token, LLaMA's two norms 8d + 8); beyond the window (gemma2-9b: 4,096 tokens on every
    other layer) a sliding layer also keeps SDPA's additive mask and K/V repeated to the query
    heads; the rest keeps the final-logit cap's bf16 tanh of the logits."""
    m = get_model("gemma2-9b")
    d, f, q, kv, h, v = m.hidden, m.ffn, m.q_width, m.kv_width, m.heads, m.vocab
    plan = Plan(micro_batch=1, seq_len=4095, impl="hf")
    kept, work, rest = hf_activation_parts(m, plan)
    t = 4095
    layer = t * (2 * 2 * d + 8 * 4 * d + 4 * 4 + 4 * 2 * f + 4 * h + 2 * 2 * kv + 2 * 2 * q) + 4 * 4 * d
    assert kept == layer and work == 0  # 4,095 tokens: shorter than the window, no sliding layer's extra
    assert rest >= t * v * (4 + 2)  # the loss's fp32 log-softmax and the cap's bf16 tanh
    # exactly the window: transformers still makes the mask (kv_length >= sliding_window)
    t = 4096
    layer = t * (2 * 2 * d + 8 * 4 * d + 4 * 4 + 4 * 2 * f + 4 * h + 2 * 2 * kv + 2 * 2 * q) + 4 * 4 * d
    window = 2 * t * t + 2 * t * 2 * (q - kv)
    assert hf_activation_parts(m, replace(plan, seq_len=4096))[0] == layer + 0.5 * window
    long = replace(plan, seq_len=8192)
    t = 8192
    layer = t * (2 * 2 * d + 8 * 4 * d + 4 * 4 + 4 * 2 * f + 4 * h + 2 * 2 * kv + 2 * 2 * q) + 4 * 4 * d
    window = 2 * t * t + 2 * t * 2 * (q - kv)
    assert m.windowed_layers(8192) == 0.5
    assert hf_activation_parts(m, long)[:2] == (layer + 0.5 * window, 0.0)
    ckpt, ckpt_work, _ = hf_activation_parts(m, replace(long, recompute="full"))
    assert ckpt == t * 2 * d and ckpt_work == layer + window  # the backward re-runs a sliding layer
    r = predict_llm(m, plan, "dgx-h100", simulate=False)
    assert r.provenance["activations"].startswith("hf-activation-census:gemma2:none")
    assert "standing in" not in r.provenance["activations"]


def test_a_family_without_an_activation_census_takes_its_stated_stand_in(monkeypatch):
    """The stand-in mechanism (no family needs it now): a kernel-census family missing from the
    activation census takes the one named for it, and predict's provenance says so; with none
    named it is an error that says which census to run."""
    from trainsim.builders import memory
    from trainsim.errors import ConfigError

    families = {k: v for k, v in memory._hf_activation_census().items() if k != "gemma3"}
    monkeypatch.setattr(memory, "_hf_activation_census", lambda: families)
    m, plan = get_model("gemma3-12b"), Plan(micro_batch=1, seq_len=4096, impl="hf")
    with pytest.raises(ConfigError, match="no activation census for family 'gemma3'"):
        memory.hf_activation_parts(m, plan)
    monkeypatch.setattr(memory, "_HF_ACTIVATION_STAND_INS", {"gemma3": "qwen3"})
    assert memory._hf_activation_family(m, plan) == ("qwen3", "gemma3")
    assert "standing in for gemma3" in memory.hf_activation_provenance(m, plan)
    assert memory.hf_activation_parts(m, plan)[0] > 0
