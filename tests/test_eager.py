"""HuggingFace eager kernels (``Plan.impl = "hf"``, trainsim.builders.eager): the census, its
evaluation for a model, the plan's checks and what it changes in a prediction."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from trainsim.builders.eager import CENSUS, eager_bytes, family_of, symbols
from trainsim.builders.models import get_model, hf_config_from_dict
from trainsim.builders.plan import Plan
from trainsim.builders.predict import dense_family_notes, predict_llm
from trainsim.builders.spec import ModelSpec
from trainsim.errors import ConfigError


def test_census_families_follow_the_model_architecture():
    assert family_of(get_model("llama3-8b")) == "llama"
    assert family_of(get_model("gpt2")) == "gpt2"
    # an MoE model's census is its experts implementation's: transformers 5's default grouped_mm, or the loop
    assert family_of(get_model("mixtral-8x7b")) == "mixtral_grouped"
    assert family_of(get_model("mixtral-8x7b"), "eager") == "mixtral"
    # Qwen3-MoE runs its own modules (q/k norms, a router that casts its weights to bf16)
    assert family_of(get_model("qwen3-30b-a3b")) == "qwen3_moe_grouped"
    assert family_of(get_model("qwen3-30b-a3b"), "eager") == "qwen3_moe"
    assert family_of(get_model("llama3-8b"), "eager") == "llama"
    # a shared expert (Qwen2-MoE) or MLA (DeepSeek) runs other modules: no census
    for name in ("qwen1.5-moe-a2.7b", "deepseek-v2"):
        with pytest.raises(ConfigError, match=rf"impl 'hf' has a kernel census .*{name} is none of them"):
            family_of(get_model(name))


def test_eager_bytes_grow_with_tokens_and_the_backward_moves_more():
    m = get_model("llama3-8b")
    fwd1, k1 = eager_bytes(m, "layer", "fwd", tokens=4096, seq=4096, dtype_bytes=2)
    fwd2, k2 = eager_bytes(m, "layer", "fwd", tokens=8192, seq=4096, dtype_bytes=2)
    bwd, kb = eager_bytes(m, "layer", "bwd", tokens=4096, seq=4096, dtype_bytes=2)
    assert fwd2 == pytest.approx(2 * fwd1, rel=1e-3) and k1 == k2 >= 10
    assert bwd > 1.5 * fwd1 and kb > k1
    # LlamaRMSNorm alone upcasts [T, d] to fp32 and back: more than 8 bytes per hidden element a norm
    assert fwd1 > 2 * 8 * 4096 * m.hidden
    # fp32 training: the casts to fp32 copy nothing and are dropped
    f32, _ = eager_bytes(m, "layer", "fwd", tokens=4096, seq=4096, dtype_bytes=4)
    assert f32 < 2 * fwd1
    # the rest holds the loss's fp32 logits: at least [T, V] read and written in fp32
    rest, _ = eager_bytes(m, "rest", "fwd", tokens=4096, seq=4096, dtype_bytes=2)
    assert rest > 2 * 4 * 4096 * m.vocab


def test_census_symbols_cover_every_entry():
    doc = json.loads(CENSUS.read_text(encoding="utf-8"))
    models = {"llama": "llama3-8b", "qwen3": "qwen3-8b", "gpt2": "gpt2", "mixtral": "mixtral-8x7b", "mixtral_grouped": "mixtral-8x7b",
              "qwen3_moe": "qwen3-30b-a3b", "qwen3_moe_grouped": "qwen3-30b-a3b", "gemma2": "gemma2-9b",
              "gemma3": "gemma3-12b", "gemma": "llama3-8b", "granite": "llama3-8b", "mistral": "mistral-7b",
              "cohere": "llama3-8b", "phi": "llama3-8b", "glm": "llama3-8b", "glm4": "llama3-8b", "smollm3": "llama3-8b",
              "phi3": "phi3-mini", "olmoe": "mixtral-8x7b", "olmoe_grouped": "mixtral-8x7b"}  # fmt: skip
    parts = {"mixtral": ("layer", "expert", "rest"), "mixtral_grouped": ("layer", "experts", "rest"),
             "qwen3_moe": ("layer", "expert", "rest"), "qwen3_moe_grouped": ("layer", "experts", "rest"),
             "llama": ("layer", "rest", "tied"), "qwen3": ("layer", "rest", "tied"),
             "gemma": ("layer", "rest", "tied"), "granite": ("layer", "rest", "tied"),
             "gemma2": ("layer", "rest", "tied", "window", "logit_softcap", "attn_softcap"),
             "gemma3": ("layer", "rest", "tied", "window"), "mistral": ("layer", "rest", "tied", "window", "window_rest"),
             "cohere": ("layer", "rest", "tied"), "phi": ("layer", "rest", "tied"), "glm": ("layer", "rest", "tied"),
             "glm4": ("layer", "rest", "tied"), "smollm3": ("layer", "rest", "tied", "window", "window_rest", "rope"),
             "phi3": ("layer", "rest", "tied", "window", "window_rest", "full_rotary"),
             "olmoe": ("layer", "expert", "rest"), "olmoe_grouped": ("layer", "experts", "rest")}  # fmt: skip
    assert set(doc["families"]) == set(models)
    for name, fam in doc["families"].items():
        sym = symbols(get_model(models[name]), 1024.0, 1024.0)
        for part in parts.get(name, ("layer", "rest")):
            for phase, call, size, dtype, count in fam[part]:
                # an MoE layer's base part may count -1 per call where the first expert does less
                # (autograd adds each later expert's gradient into the first's); Phi-3's full_rotary
                # takes off the rotated slices' backward that a whole-head rotary does not run
                assert phase in ("fwd", "bwd") and size in sym and (count > 0 or part in ("layer", "full_rotary")), (call, size)
                assert dtype in ("bfloat16", "float32", "int64", "bool"), (call, dtype)
            assert set(fam["kernels"][part]) == {"fwd", "bwd"}, (name, part)
        assert set(fam) == {*parts.get(name, ("layer", "rest")), "kernels", "host", "routing", "experts_implementation"} - (
            set() if name.startswith(("mixtral", "qwen3_moe", "olmoe")) else {"host", "routing", "experts_implementation"}), name


# Qwen3-0.6B (the Hub's config): 16 heads of 128, twice its hidden size of 1,024
QWEN3_06B = {"model_type": "qwen3", "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936,
             "max_position_embeddings": 40960, "tie_word_embeddings": True}  # fmt: skip


def _qwen3_06b() -> ModelSpec:
    return hf_config_from_dict(QWEN3_06B, Path("Qwen3-0.6B/config.json"))


def test_dense_census_tells_the_query_width_from_the_hidden_size():
    """The llama and qwen3 censuses were recorded with a query width (heads x head size) that is
    neither d nor the key width: the rotary's query half, the attention output and o_proj's input
    are T*q (recorded with q = d, they were all T*d, and a model whose q is not d, Qwen3-0.6B's
    2 d or Gemma's, moved d-wide queries)."""
    fams = json.loads(CENSUS.read_text(encoding="utf-8"))["families"]
    for name in ("llama", "qwen3"):
        layer = {(ph, call, size) for ph, call, size, _, _ in fams[name]["layer"]}
        # apply_rotary_pos_emb on the queries: rotate_half's negated half, the cat, q * cos + ...
        assert {("fwd", "neg", "T*q/2"), ("fwd", "cat", "T*q"), ("fwd", "mul", "T*q"), ("fwd", "add", "T*q"),
                ("bwd", "neg", "T*q/2"), ("bwd", "slice_backward", "T*q")} <= layer, name  # fmt: skip
    # a LLaMA model: only the query width differs; the forward's rotary moves 10 query-wide
    # bf16 tensors (q*cos read and written, rotate_half's two halves negated and their cat, the
    # product with sin, the sum), the census's T*q entries
    m = get_model("llama3-8b")
    wide = replace(m, heads=2 * m.heads, head_dim=m.d_head)  # q = 2 d; kv the same
    assert wide.q_width == 2 * m.hidden and wide.kv_width == m.kv_width
    d, _ = eager_bytes(m, "layer", "fwd", tokens=4096, seq=4096, dtype_bytes=2)
    q, _ = eager_bytes(wide, "layer", "fwd", tokens=4096, seq=4096, dtype_bytes=2)
    assert q - d == 10 * 4096 * (wide.q_width - m.hidden) * 2


def test_qwen3_06b_hf_bytes_are_the_census_at_its_query_width():
    """Qwen3-0.6B under --impl hf: the census's bytes evaluated with q = heads x head size
    (2,048), not d (1,024)."""
    m = _qwen3_06b()
    assert family_of(m) == "qwen3" and m.q_width == 16 * 128 == 2 * m.hidden
    fam = json.loads(CENSUS.read_text(encoding="utf-8"))["families"]["qwen3"]
    tokens, size = 4096.0, {"d": 1024, "q": 2048, "kv": 1024, "f": 3072, "hd": 128, "h": 16}

    def by_hand(width: dict[str, int], phase: str) -> float:
        total = 0.0
        for ph, call, sym, dtype, count in fam["layer"]:
            if ph != phase or call in ("bernoulli_", "div_"):  # the CPU's dropout, dropped
                continue
            base, half = (sym[:-2], 0.5) if sym.endswith("/2") else (sym, 1.0)
            n = tokens if base == "T" else tokens * width[base.removeprefix("T*")]
            total += count * n * half * (2 if dtype == "bfloat16" else 4)
        return total

    for phase in ("fwd", "bwd"):
        got, kernels = eager_bytes(m, "layer", phase, tokens=tokens, seq=tokens, dtype_bytes=2)
        assert got == by_hand(size, phase) and kernels == fam["kernels"]["layer"][phase]
        assert got > by_hand(size | {"q": 1024}, phase)  # q taken as d: less
    # the op predict times carries that census
    r = predict_llm(m, Plan(micro_batch=1, seq_len=4096, impl="hf"), "dgx-h100", gpus=1, simulate=False)
    layer = [o for o in r.stages[0].layer_ops if o.name == "hf_eager_layer"]
    assert [o.launches for o in layer] == [fam["kernels"]["layer"]["fwd"], fam["kernels"]["layer"]["bwd"]]


def test_dense_qwen3_census_has_its_per_head_qk_norms():
    """Dense Qwen3 takes its own census (Qwen3ForCausalLM: LLaMA's calls and per-head q/k
    RMSNorms, fp32, statistics T*h), and predict no longer says its q/k norms are left out."""
    fams = json.loads(CENSUS.read_text(encoding="utf-8"))["families"]
    assert family_of(get_model("qwen3-8b")) == "qwen3"  # Gemma 3 has its own census since 2026-12-03
    assert family_of(get_model("olmo2-7b")) == "llama"  # its q/k norms span the projections: not Qwen3's
    llama = {tuple(e[:4]): e[4] for e in fams["llama"]["layer"]}
    qwen3 = {tuple(e[:4]): e[4] for e in fams["qwen3"]["layer"]}
    # the q norm: its fp32 upcast of T*q, the per-head statistics; the k norm's over T*kv
    assert ("fwd", "rsqrt", "T*h", "float32") in qwen3 and ("fwd", "pow", "T*q", "float32") in qwen3
    assert ("fwd", "pow", "T*kv", "float32") in qwen3 and ("fwd", "pow", "T*kv", "float32") not in llama
    assert fams["qwen3"]["rest"] == fams["llama"]["rest"]
    assert fams["qwen3"]["kernels"]["layer"]["fwd"] > fams["llama"]["kernels"]["layer"]["fwd"]
    m = get_model("qwen3-8b")
    hf = Plan(micro_batch=1, seq_len=4096, impl="hf")
    assert not any("q/k norms" in n for n in dense_family_notes(m, hf))
    b_qwen3, _ = eager_bytes(m, "layer", "fwd", tokens=4096, seq=4096, dtype_bytes=2)
    b_llama, _ = eager_bytes(replace(m, qk_norm="none"), "layer", "fwd", tokens=4096, seq=4096, dtype_bytes=2)
    # two more RMSNorms, each over at least its fp32 input read and written
    assert b_qwen3 - b_llama > 2 * 4 * 4096 * (m.q_width + m.kv_width)
    # OLMo 2's q/k norms are not in LLaMA's census (Gemma's four norms are in its own: tests/test_eager_gemma.py)
    assert any("LLaMA modules: this model's q/k norms are not in it" in n
               for n in dense_family_notes(get_model("olmo2-7b"), hf))  # fmt: skip


def test_mixtral_census_is_the_eager_expert_loop():
    """The mixtral census holds HF's eager expert loop per expert: the gather of its tokens,
    index_add_ into the output, and backward select_backward's zeroed [E, 2f, d] gradient and
    autograd's sum of those, so the layer's bytes grow with the experts hit and their tokens."""
    fam = json.loads(CENSUS.read_text(encoding="utf-8"))["families"]["mixtral"]
    expert = {(ph, call, size) for ph, call, size, _, _ in fam["expert"]}
    assert {("fwd", "index", "Te*d"), ("fwd", "index_add_", "Te*d"), ("bwd", "select_backward", "E*2f*d"),
            ("bwd", "add", "E*2f*d"), ("bwd", "index_put", "Te*d")} <= expert  # fmt: skip
    assert fam["experts_implementation"] == "eager" and "even" in fam["routing"]
    assert fam["host"]["expert"]["fwd_syncs"] >= 3 and fam["host"]["expert"]["bwd_nodes"] > 5
    m = get_model("mixtral-8x7b")
    one, k1 = eager_bytes(m, "expert", "bwd", tokens=4096, seq=4096, dtype_bytes=2, experts="eager")
    # select_backward writes the E experts' [2f, d] and [d, f] gradients, autograd adds them: >= 4 passes
    assert one > 4 * 2 * m.num_experts * 3 * m.hidden * m.expert_ffn and k1 > 5
    fwd2, _ = eager_bytes(m, "expert", "fwd", tokens=4096, seq=4096, dtype_bytes=2, experts="eager")
    fwd4, _ = eager_bytes(replace(m, top_k=4), "expert", "fwd", tokens=4096, seq=4096, dtype_bytes=2, experts="eager")
    assert fwd4 > 1.8 * fwd2  # twice the tokens per expert (the T*k routing tensors besides)


def test_hf_predicts_mixtral_with_its_eager_expert_loop():
    m = get_model("mixtral-8x7b")
    r = predict_llm(m, Plan(micro_batch=1, seq_len=4096, impl="hf", hf_experts="eager"), "dgx-h100", simulate=False)
    ops = {(o.name, o.phase): o for o in r.stages[0].layer_ops}
    assert {"hf_eager_layer", "hf_eager_experts", "router", "mlp_up", "mlp_down"} <= {n for n, _ in ops}
    assert not {n for n, _ in ops} & {"moe_permute", "moe_unpermute", "activation", "input_norm"}
    # one GEMM pair per expert, one after another, on its T k / E tokens
    assert ops[("mlp_up", "fwd")].launches == m.num_experts == ops[("hf_eager_experts", "fwd")].launches // 8
    assert "eager-factor-uncalibrated:moe-expert-loop" in ops[("hf_eager_experts", "bwd")].provenance
    assert "eager-factor:" in ops[("hf_eager_layer", "fwd")].provenance  # LLaMA's calls: the H100's factor
    assert ops[("hf_moe_syncs", "fwd")].seconds > 0 and ("hf_moe_syncs", "bwd") not in ops
    assert any('experts_implementation="eager"' in w and "grouped_mm" in w for w in r.warnings)
    # top-k up: each expert gets more tokens, the GEMMs and the loop's calls grow
    r4 = predict_llm(replace(m, top_k=4), Plan(micro_batch=1, seq_len=4096, impl="hf", hf_experts="eager"), "dgx-h100",
                     simulate=False)  # fmt: skip
    assert r4.iteration_time_s > 1.1 * r.iteration_time_s  # (select_backward's zeroed gradients do not grow)
    up4 = next(o for o in r4.stages[0].layer_ops if (o.name, o.phase) == ("mlp_up", "bwd"))
    assert up4.seconds > 1.7 * ops[("mlp_up", "bwd")].seconds and up4.launches == ops[("mlp_up", "bwd")].launches
    # the loop's dispatch: more experts hit, more host time (none for a dense model)
    from trainsim.builders.costs import HOST
    from trainsim.builders.eager import expert_loop_host

    f8, s8 = expert_loop_host(m, "fwd", tokens=4096, host=HOST, experts="eager")
    f16, s16 = expert_loop_host(replace(m, num_experts=16), "fwd", tokens=4096, host=HOST, experts="eager")
    assert 0 < f8 < f16 and 0 < s8 < s16 and expert_loop_host(get_model("llama3-8b"), "fwd", tokens=4096, host=HOST) == (0.0, 0)
    with pytest.raises(ConfigError, match=r"impl 'hf' runs one model replica per GPU, every expert on it \(ep = 1\)"):
        Plan(dp=8, ep=8, impl="hf").validate(m)


def test_mixtral_grouped_census_is_transformers_default_experts_path():
    """transformers 5 runs grouped_mm when no experts implementation is asked for, and the
    mixtral_grouped census is that path: the sort by expert, gathers of the T k token-expert
    rows and their scatters backward, fp32 routing products; no per-expert call, no zeroed
    [E, 2f, d] gradient, no device-to-host sync."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.MixtralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                                     num_key_value_heads=2, vocab_size=64, num_local_experts=4)  # fmt: skip
    assert transformers.MixtralForCausalLM(cfg).config._experts_implementation == "grouped_mm"
    fam = json.loads(CENSUS.read_text(encoding="utf-8"))["families"]["mixtral_grouped"]
    assert fam["experts_implementation"] == "grouped_mm" and "expert" not in fam and "expert" not in fam["host"]
    calls = {(ph, call, size) for ph, call, size, _, _ in fam["experts"]}
    assert {("fwd", "sort", "T*k"), ("fwd", "index", "T*k*d"), ("fwd", "silu", "T*k*f"), ("fwd", "sum", "T*k*d"),
            ("bwd", "index_put", "T*k*d"), ("bwd", "silu_backward", "T*k*f")} <= calls  # fmt: skip
    assert not any("Te" in size or "E" in size for _, _, size in calls)  # nothing per expert, no weight-sized buffer
    assert not fam["host"]["block"].get("fwd_syncs", 0) and not fam["host"]["block"].get("bwd_syncs", 0)
    # the grouped GEMMs are the builder's, not memory-bound calls of the census
    assert not any(call == "_grouped_mm" for part in ("layer", "experts", "rest") for _, call, *_ in fam[part])


def test_qwen3_moe_has_its_own_census_bf16_routing_and_qk_norms():
    """transformers' Qwen3-MoE router casts its top-k weights back to bf16 (Mixtral's stay fp32),
    so its experts' routing product, the gather back and the top-k sum are bf16; its layer
    runs per-head q/k RMSNorms and rotates q-wide queries (Qwen3-30B-A3B: 32 x 128 = 2 d). It
    had been priced with Mixtral's census: fp32 T k d tensors, no q/k norms, d-wide queries."""
    transformers = pytest.importorskip("transformers")
    import inspect

    from transformers.models.qwen3_moe import modeling_qwen3_moe

    src = inspect.getsource(modeling_qwen3_moe.Qwen3MoeTopKRouter.forward)
    assert "norm_topk_prob" in src and "router_top_value.to(router_logits.dtype)" in src
    assert transformers.Qwen3MoeConfig().norm_topk_prob is False  # the census sets it on, as Qwen3-30B-A3B's config
    doc = json.loads(CENSUS.read_text(encoding="utf-8"))["families"]
    for name in ("qwen3_moe_grouped", "qwen3_moe"):
        fam = doc[name]
        experts = fam["experts" if name.endswith("_grouped") else "expert"]
        assert not any(dt == "float32" and size in ("T*k*d", "Te*d", "T*d") for _, _, size, dt, _ in experts), name
        layer = {(ph, call, size, dt) for ph, call, size, dt, _ in fam["layer"]}
        assert {("fwd", "pow", "T*q", "float32"), ("fwd", "rsqrt", "T*h", "float32"), ("fwd", "pow", "T*kv", "float32"),
                ("fwd", "neg", "T*q/2", "bfloat16"), ("fwd", "_to_copy", "T*k", "bfloat16")} <= layer, name  # fmt: skip
    mix = {(ph, call, size, dt) for ph, call, size, dt, _ in doc["mixtral_grouped"]["experts"]}
    assert ("fwd", "mul", "T*k*d", "float32") in mix  # Mixtral's routing product is fp32
    m = get_model("qwen3-30b-a3b")
    assert m.q_width == 2 * m.hidden
    mix_like = replace(m, qk_norm="none")  # what it had been priced as: Mixtral's census

    def moved(model, part: str, ph: str) -> float:  # type: ignore[no-untyped-def]
        return eager_bytes(model, part, ph, tokens=4096, seq=4096, dtype_bytes=2)[0]

    # the experts' calls move less than Mixtral's census made of them: bf16 rows, not fp32
    for ph in ("fwd", "bwd"):
        assert moved(m, "experts", ph) < 0.8 * moved(mix_like, "experts", ph)
    # and its layer more (q/k norms; q = 2 d wide rotary)
    assert moved(m, "layer", "fwd") > 1.2 * moved(mix_like, "layer", "fwd")


def test_hf_moe_defaults_to_grouped_mm_far_cheaper_than_the_eager_loop():
    """--impl hf prices an MoE model as transformers 5 runs it by default (grouped_mm): the same
    expert GEMMs as the eager loop (the Megatron path's per-expert shapes), one kernel each, and
    the experts' calls once a layer; the eager loop's E² zeroed gradients and syncs are gone."""
    m = get_model("qwen3-30b-a3b")  # 128 experts
    plan = Plan(micro_batch=1, seq_len=4096, impl="hf")
    assert plan.experts_impl == "grouped_mm" and plan.label() == "tp1-pp1-dp1-mb1-gb1-hf"
    grouped = predict_llm(m, plan, "dgx-h100", simulate=False)
    eager = predict_llm(m, replace(plan, hf_experts="eager"), "dgx-h100", simulate=False)
    assert replace(plan, hf_experts="eager").label() == "tp1-pp1-dp1-mb1-gb1-hf-eagerexperts"
    g = {(o.name, o.phase): o for o in grouped.stages[0].layer_ops}
    e = {(o.name, o.phase): o for o in eager.stages[0].layer_ops}
    assert grouped.iteration_time_s < eager.iteration_time_s / 5
    assert not {n for n, _ in g} & {"hf_moe_syncs", "moe_permute", "moe_unpermute"}
    for ph in ("fwd", "bwd"):  # the router's GEMM is the same; the experts' are one grouped kernel on an H100
        assert g[("router", ph)].seconds == e[("router", ph)].seconds
        for name in ("mlp_up", "mlp_down"):
            assert g[(name, ph)].flops == e[(name, ph)].flops
            assert g[(name, ph)].seconds < e[(name, ph)].seconds / 2
    assert g[("mlp_up", "fwd")].launches == 1 and g[("mlp_up", "bwd")].launches == 2  # one grouped kernel
    assert "grouped-gemm-as-stacked:128x256rows" in g[("mlp_up", "fwd")].provenance
    assert "eager-factor-uncalibrated:moe-experts-grouped-mm" in g[("hf_eager_experts", "bwd")].provenance
    assert g[("hf_eager_experts", "bwd")].seconds < e[("hf_eager_experts", "bwd")].seconds / 20
    assert any("grouped_mm" in w and "--hf-experts eager" in w and "4.x" in w for w in grouped.warnings)
    mix = get_model("mixtral-8x7b")
    r = predict_llm(mix, plan, "dgx-h100", simulate=False)
    assert r.iteration_time_s < predict_llm(mix, replace(plan, hf_experts="eager"), "dgx-h100", simulate=False).iteration_time_s
    with pytest.raises(ConfigError, match=r"hf_experts .* needs impl 'hf' and a mixture-of-experts model; llama3-8b is dense"):
        Plan(impl="hf", hf_experts="eager").validate(get_model("llama3-8b"))
    with pytest.raises(ConfigError, match=r"needs impl 'hf' and a mixture-of-experts model; got impl 'fused'"):
        Plan(hf_experts="grouped_mm").validate(m)
    with pytest.raises(ConfigError, match=r"hf_experts must be one of grouped_mm, eager, got 'batched_mm'"):
        Plan(impl="hf", hf_experts="batched_mm").validate(m)  # type: ignore[arg-type]


def test_a_dense_models_census_ignores_the_experts_implementation():
    """The experts implementation chooses between the MoE families' censuses only. (The eager
    loop's and dense models' figures were compared with 3c37ad3's, bit for bit, when the
    grouped_mm path landed; they are not pinned here, so that kernel-model changes elsewhere
    do not have to edit this file.)"""
    m = get_model("llama3-8b")
    for part in ("layer", "rest"):  # a dense model's census is its own whatever the experts implementation
        assert (eager_bytes(m, part, "bwd", tokens=4096, seq=4096, dtype_bytes=2, experts="eager")
                == eager_bytes(m, part, "bwd", tokens=4096, seq=4096, dtype_bytes=2))  # fmt: skip


@pytest.fixture(scope="module")
def census_script():
    """scripts/hf_eager_census.py as a module, with the transformers release the census was
    recorded with (another release may run other calls)."""
    transformers = pytest.importorskip("transformers")
    recorded = json.loads(CENSUS.read_text(encoding="utf-8"))["versions"]["transformers"]
    if transformers.__version__ != recorded:
        pytest.skip(f"census recorded with transformers {recorded}, {transformers.__version__} installed: "
                    "re-run scripts/hf_eager_census.py and compare")  # fmt: skip
    import importlib.util

    spec = importlib.util.spec_from_file_location("hf_eager_census", Path(__file__).resolve().parents[1] / "scripts" / "hf_eager_census.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def census_written(census_script, tmp_path_factory):
    """The families the script's main() writes, run once for the module (a grouped_mm family
    takes seconds; both tests below read this one run)."""
    census_script.OUT = tmp_path_factory.mktemp("census") / "census.json"  # the module's own copy
    assert census_script.main([]) == 0  # not pytest's argv
    return json.loads(census_script.OUT.read_text(encoding="utf-8"))["families"]


def test_mixtral_grouped_census_regenerates_identically(census_script, census_written):
    """scripts/hf_eager_census.py's grouped_mm family, taken twice in one process (main()'s
    and this one), is the shipped one; so is qwen3_moe_grouped."""
    doc = json.loads(CENSUS.read_text(encoding="utf-8"))
    second = census_script._grouped_family()
    assert census_written["mixtral_grouped"] == second == doc["families"]["mixtral_grouped"]
    assert census_written["qwen3_moe_grouped"] == doc["families"]["qwen3_moe_grouped"]


def test_plan_checks_impl():
    m = get_model("llama3-8b")
    with pytest.raises(ConfigError, match="impl must be one of fused, neox, hf, got 'eager'"):
        Plan(impl="eager").validate(m)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"impl 'hf' runs one model replica per GPU \(tp = cp = 1\), got tp 2"):
        Plan(tp=2, impl="hf").validate(m)
    Plan(dp=8, impl="hf").validate(m)
    assert Plan(dp=8, impl="hf").label() == "tp1-pp1-dp8-mb1-gb8-hf" and Plan(dp=8).label() == "tp1-pp1-dp8-mb1-gb8"


def test_hf_replaces_the_fused_memory_operators_and_adds_their_eager_work():
    m = get_model("llama3-8b")
    fused = predict_llm(m, Plan(micro_batch=2, seq_len=2048), "dgx-h100", simulate=False)
    hf = predict_llm(m, Plan(micro_batch=2, seq_len=2048, impl="hf"), "dgx-h100", simulate=False)
    names = {o.name for o in hf.stages[0].layer_ops}
    assert "hf_eager_layer" in names and not names & {"input_norm", "post_attention_norm", "rotary", "activation",
                                                        "residual_add"}  # fmt: skip
    assert {o.name for o in hf.stages[0].ops} >= {"hf_eager_rest", "output_proj", "embedding"}
    assert all("hf-eager-census" in o.provenance for o in hf.stages[0].layer_ops if o.name == "hf_eager_layer")
    # the GEMMs and attention are the same operators
    g = {(o.name, o.phase): o.seconds for o in fused.stages[0].layer_ops if o.name.endswith("proj") or "mlp" in o.name}
    h = {(o.name, o.phase): o.seconds for o in hf.stages[0].layer_ops if o.name.endswith("proj") or "mlp" in o.name}
    assert g == h
    assert hf.iteration_time_s > fused.iteration_time_s


def test_shipped_census_is_what_the_script_writes(census_written):
    """The census is reproducible: the script, run again, finds the same calls (with the
    transformers release it was recorded with; another release may run other calls)."""
    assert census_written == json.loads(CENSUS.read_text(encoding="utf-8"))["families"]


def test_predict_cli_takes_impl():
    from typer.testing import CliRunner

    from trainsim.cli.main import _register, app

    _register()
    res = CliRunner().invoke(app, ["predict", "llama3-8b", "--system", "dgx-h100", "--gpus", "8", "--impl", "hf",
                                   "--format", "json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert any("hf-eager-census" in k for k in doc["provenance"]["kernels"])
    res = CliRunner().invoke(app, ["predict", "llama3-8b", "--system", "dgx-h100", "--gpus", "8", "--tp", "8",
                                   "--impl", "hf"])  # fmt: skip
    assert res.exit_code == 2 and "--impl hf runs one model replica per GPU" in res.stderr  # a usage error
    res = CliRunner().invoke(app, ["predict", "mixtral-8x7b", "--system", "dgx-h100", "--gpus", "1", "--impl", "hf",
                                   "--seq-len", "4096", "--format", "json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    kernels = json.loads(res.stdout)["provenance"]["kernels"]  # the default: transformers 5's grouped_mm
    assert any("moe-experts-grouped-mm" in k for k in kernels) and not any("moe-expert-loop" in k for k in kernels)
    res = CliRunner().invoke(app, ["predict", "mixtral-8x7b", "--system", "dgx-h100", "--gpus", "1", "--impl", "hf",
                                   "--seq-len", "4096", "--hf-experts", "eager", "--format", "json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert any("eager-factor-uncalibrated:moe-expert-loop" in k for k in json.loads(res.stdout)["provenance"]["kernels"])
    res = CliRunner().invoke(app, ["predict", "llama3-8b", "--impl", "hf", "--system", "dgx-h100", "--gpus", "1",
                                   "--hf-experts", "eager"])  # fmt: skip
    assert res.exit_code == 1 and "needs impl 'hf' and a mixture-of-experts model; llama3-8b is dense" in str(res.exception)
    res = CliRunner().invoke(app, ["predict", "mixtral-8x7b", "--system", "dgx-h100", "--gpus", "1", "--hf-experts", "eager"])
    assert res.exit_code == 2 and "--hf-experts needs --impl hf, got --impl fused" in res.stderr  # a usage error


def test_eager_factor_is_the_devices_measured_one_or_one(tmp_path, monkeypatch):
    """The census's time is scaled by the factor measured on the device's traces (H100), and
    left alone elsewhere, the provenance saying which."""
    from trainsim.builders import eager
    from trainsim.hardware import get_device, get_system

    doc = json.loads(eager.CALIBRATION.read_text(encoding="utf-8"))
    h100 = get_device(get_system("dgx-h100").device)
    factor, note = eager.eager_factor((h100.name, *h100.aliases))
    assert factor == doc["devices"]["h100-sxm5-80gb"]["factor"] and 1.0 < factor < 2.0
    assert note == f";eager-factor:{factor:.3f}"
    assert eager.eager_factor(("a100-sxm4-80gb",)) == (1.0, ";eager-factor-uncalibrated")
    m = get_model("llama3-8b")
    plan = Plan(micro_batch=2, seq_len=2048, impl="hf")
    on_h100 = predict_llm(m, plan, "dgx-h100", simulate=False).stages[0].layer_ops
    assert all(note in o.provenance for o in on_h100 if o.name == "hf_eager_layer")
    bad = tmp_path / "cal.json"
    bad.write_text('{"devices": {"h100-sxm5-80gb": {"factor": 9}}}', encoding="utf-8")
    monkeypatch.setattr(eager, "CALIBRATION", bad)
    eager._factors.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"cal\.json: a factor outside \[0\.5, 4\]"):
            eager.eager_factor(("h100",))
    finally:
        monkeypatch.undo()
        eager._factors.cache_clear()


@pytest.mark.slow
def test_shipped_eager_factor_is_what_the_script_measures():
    """scripts/hf_eager_factor.py, run on the shipped h100-llama captures, gives the shipped
    factor (the median over the ten captures of measured over census memory-bound time)."""
    import importlib.util
    import statistics
    import tarfile
    import tempfile
    from pathlib import Path

    from trainsim.builders import eager

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("hf_eager_factor", root / "scripts" / "hf_eager_factor.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(root / "src" / "trainsim" / "validate" / "data" / "gpu_e2e_h100.tar.xz", "r:xz") as tar:
            tar.extractall(tmp, filter="data", members=[m for m in tar.getmembers()
                                                        if "/llama_" in m.name and m.name.endswith("kineto.json")])
        rows = mod.capture_factors("h100-llama", Path(tmp) / "captures")
    assert len(rows) == 10
    doc = json.loads(eager.CALIBRATION.read_text(encoding="utf-8"))["devices"]["h100-sxm5-80gb"]
    assert statistics.median(r[4] for r in rows) == pytest.approx(doc["factor"], abs=1e-4)
    assert {r[0]: round(r[4], 4) for r in rows} == doc["captures"]


def test_hf_note_names_what_the_census_leaves_out_for_qwen3_models():
    """The Qwen3-MoE census records its per-head q/k norms: predict's note no longer says they
    are missing; nor for a dense Qwen3, which has its own census since 2026-12-03 (it took
    LLaMA's, whose note said its q/k norms were left out)."""
    from trainsim.builders.predict import dense_family_notes

    moe = " ".join(dense_family_notes(get_model("qwen3-30b-a3b"), Plan(impl="hf", micro_batch=1, seq_len=4096)))
    assert "q/k norms" not in moe
    dense = " ".join(dense_family_notes(get_model("qwen3-8b"), Plan(impl="hf", micro_batch=1, seq_len=4096)))
    assert "q/k norms" not in dense


def test_hf_grouped_mm_runs_its_cutlass_kernel_on_hopper_in_bf16_and_falls_back_elsewhere():
    """torch._grouped_mm's fast path (aten GroupedBlas.cpp) needs compute capability 9.x/10.x and
    bf16: there one kernel per projection over the stacked rows, each expert's padded to the
    tile; on an A100, or in fp16, _grouped_mm_fallback: the per-expert mm's one after another and
    a device-to-host sync per call (2 forward, 4 backward), its launches on the host."""
    from trainsim.builders.costs import HOST, LayerCoster, OpCoster

    m = get_model("qwen3-30b-a3b")
    plan = Plan(micro_batch=1, seq_len=4096, impl="hf")

    def mlp(p: Plan, device: str, phase: str) -> dict[str, object]:
        lc = LayerCoster(m, p, OpCoster(device))
        return {o.name: o for o in lc.mlp(phase) + lc.hf_expert_loop(phase)} | {"host": lc.expert_gemms_host_s(phase, HOST)}

    eager = replace(plan, hf_experts="eager")
    for device, p in (("a100-sxm4-80gb", plan), ("h100-sxm5-80gb", replace(plan, dtype="fp16"))):
        for ph, syncs in (("fwd", 2), ("bwd", 4)):
            fb, loop = mlp(p, device, ph), mlp(replace(p, hf_experts="eager"), device, ph)
            assert fb["mlp_up"].seconds == loop["mlp_up"].seconds  # type: ignore[attr-defined]
            assert "grouped-mm-fallback:per-expert-mm" in fb["mlp_up"].provenance  # type: ignore[attr-defined]
            assert fb["hf_moe_syncs"].provenance.startswith(f"hf-moe-syncs:{syncs}-")  # type: ignore[attr-defined]
            assert fb["host"] == pytest.approx(127 * syncs * HOST.aten_launch_s)  # one launch per further expert and call
    fast = mlp(plan, "h100-sxm5-80gb", "fwd")
    assert "hf_moe_syncs" not in fast and fast["host"] == 0.0
    assert fast["mlp_up"].seconds < mlp(eager, "h100-sxm5-80gb", "fwd")["mlp_up"].seconds / 2  # type: ignore[attr-defined]
    # the tile: 256 rows per expert pad to nothing at 128; 40 rows (mb 1, 640 tokens) to 64 (the small tile)
    small = mlp(replace(plan, seq_len=640), "h100-sxm5-80gb", "fwd")
    assert "grouped-gemm-as-stacked:128x64rows" in small["mlp_up"].provenance  # type: ignore[attr-defined]
    r = predict_llm(m, replace(plan, dtype="fp16"), "dgx-h100", simulate=False)
    assert any("fallback" in w and "fp16 on hopper" in w for w in r.warnings)
    r = predict_llm(m, plan, "dgx-h100", simulate=False)
    assert any("CUTLASS kernel here (hopper, bf16)" in w for w in r.warnings)
