"""``--impl hf`` for Gemma 2 and Gemma 3: their own censuses (Gemma2ForCausalLM,
Gemma3ForCausalLM: four (1 + weight) RMSNorms a layer, GeLU-tanh GeGLU, the embedding scaled by
sqrt(d), Gemma 3's q/k norms, Gemma 2's final-logit cap, a sliding-window layer's mask under
SDPA) and the tied-embedding gradient add of the dense censuses (builders/eager.py)."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from trainsim.builders.eager import CENSUS, eager_bytes, family_of, symbols
from trainsim.builders.models import get_model, hf_config_from_dict
from trainsim.builders.plan import Plan
from trainsim.builders.predict import dense_family_notes, predict_llm

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "hf_eager_census.py"


def _families() -> dict[str, Any]:
    return json.loads(CENSUS.read_text(encoding="utf-8"))["families"]


def _script() -> ModuleType:
    """scripts/hf_eager_census.py, where the installed transformers is the one the census was
    recorded with (another release may run other calls)."""
    transformers = pytest.importorskip("transformers")
    recorded = json.loads(CENSUS.read_text(encoding="utf-8"))["versions"]["transformers"]
    if transformers.__version__ != recorded:
        pytest.skip(f"census recorded with transformers {recorded}, {transformers.__version__} installed")
    spec = importlib.util.spec_from_file_location("hf_eager_census", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gemma_models_take_their_own_census():
    """Gemma 2 and Gemma 3 had taken LLaMA's and Qwen3's censuses (two norms a layer, SiLU,
    no embedding scale, no logit cap)."""
    assert family_of(get_model("gemma2-9b")) == "gemma2"
    assert family_of(get_model("gemma3-12b")) == "gemma3"
    assert family_of(get_model("gemma3-12b"), "eager") == "gemma3"  # the experts implementation is the MoE's only
    text = {"model_type": "gemma3_text", "hidden_size": 640, "num_hidden_layers": 18, "num_attention_heads": 4,
            "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 2048, "vocab_size": 262144,
            "max_position_embeddings": 32768}  # fmt: skip
    assert family_of(hf_config_from_dict(text, Path("gemma-3-270m/config.json"))) == "gemma3"
    g2 = {"model_type": "gemma2", "hidden_size": 2304, "num_hidden_layers": 26, "num_attention_heads": 8,
          "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 9216, "vocab_size": 256000,
          "max_position_embeddings": 8192}  # fmt: skip
    assert family_of(hf_config_from_dict(g2, Path("gemma-2-2b/config.json"))) == "gemma2"
    # the others keep theirs
    assert [family_of(get_model(n)) for n in ("llama3-8b", "qwen3-8b", "olmo2-7b")] == ["llama", "qwen3", "llama"]


def test_gemma_census_has_gemmas_own_calls():
    fams = _families()
    g2, g3, qwen3 = ({tuple(e[:4]): e[4] for e in fams[f]["layer"]} for f in ("gemma2", "gemma3", "qwen3"))
    # four RMSNorms a layer (each one rsqrt over the tokens' statistics: 2 tensors a call), two in Qwen3's
    assert g2[("fwd", "rsqrt", "T", "float32")] == g3[("fwd", "rsqrt", "T", "float32")] == 8
    assert qwen3[("fwd", "rsqrt", "T", "float32")] == 4
    # GeLU-tanh GeGLU, not SiLU
    assert ("fwd", "gelu", "T*f", "bfloat16") in g2 and ("bwd", "gelu_backward", "T*f", "bfloat16") in g3
    assert not any(k[1].startswith("silu") for k in (*g2, *g3))
    # Gemma 3's per-head q/k norms (statistics T*h); none in Gemma 2
    assert ("fwd", "rsqrt", "T*h", "float32") in g3 and ("fwd", "rsqrt", "T*h", "float32") not in g2
    # the rest: the embedding scaled by sqrt(d), a bf16 multiply of [T, d] forward and backward
    # (Gemma's norms multiply by 1 + weight in fp32, LLaMA's by the weight in bf16: the
    # layer has no bf16 [T, d] multiply, the rest one forward, that of the scale)
    rest = {tuple(e[:4]): e[4] for e in fams["gemma3"]["rest"]}
    assert rest[("fwd", "mul", "T*d", "bfloat16")] == rest[("bwd", "mul", "T*d", "bfloat16")] == 2
    assert ("fwd", "mul", "T*d", "bfloat16") not in g3 and ("fwd", "mul", "T*d", "bfloat16") not in g2
    # Gemma 2's final-logit cap: divide, tanh, multiply on [T, V], and their backward
    cap = {tuple(e[:4]): e[4] for e in fams["gemma2"]["logit_softcap"]}
    assert cap[("fwd", "tanh", "T*V", "bfloat16")] == 2 and ("bwd", "tanh_backward", "T*V", "bfloat16") in cap
    assert fams["gemma2"]["kernels"]["logit_softcap"] == {"fwd": 3, "bwd": 3} and "logit_softcap" not in fams["gemma3"]
    # its attention-score cap on [B, h, L, L] (eager attention), recorded, not part of the layer
    assert {e[2] for e in fams["gemma2"]["attn_softcap"]} == {"T*h*L"}
    # a sliding-window layer under SDPA: the window's boolean mask made additive (T*L), the keys
    # and values repeated to the query heads (no enable_gqa with a mask) and summed back
    window = {tuple(e[:4]) for e in fams["gemma3"]["window"]}
    assert {("fwd", "where", "T*L", "bool"), ("fwd", "clone", "T*q", "bfloat16"), ("bwd", "sum", "T*q", "bfloat16")} <= window


def test_tied_embedding_gradient_add_is_counted_for_tied_dense_models():
    """A tied embedding's two gradients (the lookup's and the head's) are added by autograd: one
    add of V*d (read two, write one). GPT-2's census (tied, as its config) had it; the dense
    LLaMA/Qwen3 censuses were recorded untied and missed it for tied models (Qwen3-0.6B,
    Llama 3.2, Gemma)."""
    fams = _families()
    for name in ("llama", "qwen3", "gemma2", "gemma3"):
        assert fams[name]["tied"] == [["bwd", "add", "V*d", "bfloat16", 3]]
        assert fams[name]["kernels"]["tied"] == {"fwd": 0, "bwd": 1}
    assert ["bwd", "add", "V*d", "bfloat16", 3] in fams["gpt2"]["rest"]
    q = {"model_type": "qwen3", "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
         "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936,
         "max_position_embeddings": 40960, "tie_word_embeddings": True}  # fmt: skip
    tied = hf_config_from_dict(q, Path("Qwen3-0.6B/config.json"))
    untied = hf_config_from_dict(q | {"tie_word_embeddings": False}, Path("Qwen3-0.6B/config.json"))
    kw: dict[str, Any] = {"tokens": 4096.0, "seq": 4096.0, "dtype_bytes": 2}
    b_tied, k_tied = eager_bytes(tied, "rest", "bwd", **kw)
    b_untied, k_untied = eager_bytes(untied, "rest", "bwd", **kw)
    assert b_tied - b_untied == 3 * 151936 * 1024 * 2 and k_tied == k_untied + 1
    assert eager_bytes(tied, "rest", "fwd", **kw) == eager_bytes(untied, "rest", "fwd", **kw)
    assert eager_bytes(tied, "layer", "bwd", **kw) == eager_bytes(untied, "layer", "bwd", **kw)


def test_gemma_window_part_applies_to_windowed_layers_beyond_the_window():
    """The window part on the layers transformers masks: a sequence shorter than the window has
    none (SDPA's is_causal), one of exactly the window has it (masking_utils makes the mask once
    kv_length >= sliding_window), a longer one too."""
    m = get_model("gemma3-12b")  # 40 of 48 layers windowed at 1,024 tokens
    kw: dict[str, Any] = {"dtype_bytes": 2}

    def census(part: str, n: int) -> float:
        sym = symbols(m, n, n)
        return sum(c * sym[s] * (2 if dt == "bfloat16" else 4 if dt == "float32" else 1 if dt == "bool" else 8)
                   for ph, _, s, dt, c in _families()["gemma3"][part] if ph == "fwd")  # fmt: skip

    inside, _ = eager_bytes(m, "layer", "fwd", tokens=1023, seq=1023, **kw)
    assert inside == census("layer", 1023)
    at, _ = eager_bytes(m, "layer", "fwd", tokens=1024, seq=1024, **kw)
    assert at == pytest.approx(census("layer", 1024) + 40 / 48 * census("window", 1024))
    beyond, _ = eager_bytes(m, "layer", "fwd", tokens=4096, seq=4096, **kw)
    assert beyond == pytest.approx(census("layer", 4096) + 40 / 48 * census("window", 4096))


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_gemma_census_reproduces_a_live_step(family):
    """A Gemma model unlike the recorded ones (three layers, windowed and full, tied embeddings,
    Gemma 2's logit cap on), run live under the census's dispatch mode: its memory-bound bytes
    and calls are the census's as the predictor evaluates them for that config."""
    mod = _script()
    types = ["sliding_attention", "full_attention", "sliding_attention"]
    calls, _ = mod.census(family, 3, tied=True, layer_type=types)
    cfg = {"model_type": "gemma2" if family == "gemma2" else "gemma3_text", "hidden_size": mod.D,
           "num_hidden_layers": 3, "num_attention_heads": mod.H, "num_key_value_heads": mod.KV,
           "head_dim": mod.HD_DENSE, "intermediate_size": mod.F, "vocab_size": mod.V,
           "sliding_window": mod.GEMMA_WINDOW, "layer_types": types, "tie_word_embeddings": True,
           "max_position_embeddings": mod.L}  # fmt: skip
    spec = hf_config_from_dict(cfg, Path(f"{family}-tiny/config.json"))
    assert family_of(spec) == family and spec.sliding_layers == 2 and spec.tied_embeddings
    assert bool(spec.logit_softcap) == (family == "gemma2")
    sym = symbols(spec, float(mod.T), float(mod.L))
    width = {"bfloat16": 2, "float32": 4, "int64": 8, "bool": 1}
    for phase in ("fwd", "bwd"):
        live = sum(sym[s] * width[dt] for ph, _, moved, _ in calls if ph == phase for s, dt in moved)
        n_live = sum(1 for ph, *_ in calls if ph == phase)
        layer, k_layer = eager_bytes(spec, "layer", phase, tokens=mod.T, seq=mod.L, dtype_bytes=2)
        rest, k_rest = eager_bytes(spec, "rest", phase, tokens=mod.T, seq=mod.L, dtype_bytes=2)
        assert live == pytest.approx(3 * layer + rest, rel=1e-12), phase
        assert n_live == 3 * k_layer + k_rest, phase


def test_gemma_census_regenerates_identically():
    mod = _script()
    fams = _families()
    for family in ("gemma2", "gemma3"):
        assert mod._dense_family(family) == fams[family], family


def test_predict_gemma_hf_notes_what_the_census_leaves_out():
    hf = Plan(micro_batch=1, seq_len=4096, impl="hf")
    g3 = " ".join(dense_family_notes(get_model("gemma3-12b"), hf))
    assert "are not in it" not in g3  # its norms and q/k norms are in its census
    g2 = " ".join(dense_family_notes(get_model("gemma2-9b"), hf))
    assert "are not in it" not in g2 and "soft-cap (cap 50) runs inside FlashAttention-2" in g2
    # eager attention (a non-flash --attention) pays the census's three passes over the scores
    unf = replace(hf, attention="unfused")
    assert "FlashAttention-2" not in " ".join(dense_family_notes(get_model("gemma2-9b"), unf))
    ru = predict_llm(get_model("gemma2-9b"), unf, "dgx-h100", gpus=1, simulate=False)
    caps = [o for o in ru.stages[0].layer_ops if o.name == "hf_attention_softcap"]
    assert [o.phase for o in caps] == ["fwd", "bwd"] and all(o.category == "attention" and o.seconds > 0 for o in caps)
    assert not [o for o in predict_llm(get_model("gemma2-9b"), hf, "dgx-h100", gpus=1, simulate=False).stages[0].layer_ops
                if o.name == "hf_attention_softcap"]  # fmt: skip
    # (shorter than the window: no sliding layer's mask calls, which 4,096 tokens, the window, has)
    r = predict_llm(get_model("gemma2-9b"), replace(hf, seq_len=4000), "dgx-h100", gpus=1, simulate=False)
    fam = _families()["gemma2"]
    layer = [o for o in r.stages[0].layer_ops if o.name == "hf_eager_layer"]
    assert [o.launches for o in layer] == [fam["kernels"]["layer"]["fwd"], fam["kernels"]["layer"]["bwd"]]
    rest = [o for o in r.stages[-1].ops if o.name == "hf_eager_rest"]
    assert [o.launches for o in rest] == [sum(fam["kernels"][p][ph] for p in ("rest", "tied", "logit_softcap"))
                                          for ph in ("fwd", "bwd")]  # fmt: skip


@pytest.mark.parametrize(("model", "seq", "mb"), [("gemma3-12b", 1024, 1), ("gemma3-12b", 512, 2),
                                                  ("gemma2-9b", 512, 1), ("gemma2-9b", 4096, 2)])  # fmt: skip
def test_a_windows_mask_calls_never_make_the_layer_faster(model: str, seq: int, mb: int) -> None:
    """The eager layer with a sliding window's mask calls (more bytes, more kernels) is slower
    than without them: the window's calls are timed on their own kernels. Spread over the
    layer's, they had made each kernel a little smaller and gemma3-12b's layer at 1,024 tokens
    (window 512) faster: forward 297.9 -> 282.4 us, backward 672.7 -> 642.9 us."""
    from trainsim.builders.costs import LayerCoster, OpCoster
    from trainsim.hardware import get_device

    coster = OpCoster(get_device("h100-sxm5-80gb"))
    plan = Plan(impl="hf", micro_batch=mb, global_batch=mb, seq_len=seq)
    m = get_model(model)
    for phase in ("fwd", "bwd"):
        bare = LayerCoster(replace(m, sliding_window=0), plan, coster).hf_eager("x", "layer", phase)
        windowed = LayerCoster(replace(m, sliding_window=seq // 2), plan, coster).hf_eager("x", "layer", phase)
        assert windowed.seconds > bare.seconds and windowed.launches > bare.launches
