"""Which transformer: the packaged model catalog and HuggingFace ``config.json`` files.

:func:`get_model` resolves a catalog name or alias (case, spaces, dashes and underscores do not
matter: "Llama-2-7b" == "llama2-7b"), a HuggingFace repository id listed as an alias
("meta-llama/Llama-2-7b-hf"), or a path to a ``config.json`` (or a directory holding one) read by
:func:`read_hf_config`. Nothing is built at import time; the catalog is built once on first use.

Catalog numbers come from the publications: GPT-2 (HF configs), GPT-3 (Brown et al. 2020,
Table 2.1, ``d_ff = 4 d_model``), Megatron GPT (Narayanan et al. 2021, Table 1: vocabulary 51,200,
sequence 2048), GPT-NeoX-20B (Black et al. 2022; HF config), LLaMA-1/2/3 (Touvron et al. 2023a/b,
Llama 3 herd paper, HF configs), Mistral 7B / Mixtral (Jiang et al. 2023/2024, Table 1), Llemma 7B
(Azerbayev et al. 2023; Code Llama 7B dimensions); Qwen3, Gemma 2/3, Phi-3, OLMo 2, Falcon and
StarCoder2 from their Hub configs (:func:`_dense_entries`). ``seq_len`` is the training context.
Two GPT-3 rows of Table 2.1 are inconsistent and are read as their parameter counts require:
GPT-3 XL has 16 heads of 128 (the table says 24 heads × 128 = 3072 ≠ d_model 2048) and GPT-3 13B
has d_model 5120 (the table says 5140, which 40 heads of 128 do not fill).

HuggingFace configs: ``gpt2``, ``gpt_bigcode`` (StarCoder; multi-query → one KV head),
``gpt_neox``, ``llama``, ``mistral``, ``qwen2``, ``mixtral``, the dense families ``qwen3``
(per-head q/k norms), ``phi3``, ``olmo2`` (q/k norms over the projections), ``gemma2``,
``gemma3_text`` and ``gemma3`` (its ``text_config``; four norms a layer, soft-capping, windows on
some layers), ``falcon`` (multi-query or GQA, parallel attention with one or two norms; also its
remote code's ``RefinedWebModel`` and ``RefinedWeb``, the Hub's Falcon configs before mid-2023) and
``starcoder2``, and the MoE families ``qwen3_moe``, ``qwen2_moe``, ``gpt_oss``, ``deepseek_v2``,
``deepseek_v3`` (shared experts, dense layers among the MoE ones, Multi-head Latent Attention:
:func:`_deepseek` and its neighbours), and (h6) ``gemma`` (Gemma 1), ``granite``, ``olmoe``,
``cohere`` (a parallel block, LayerNorm without bias), ``glm`` and ``glm4``, ``phi`` (phi-2: a
parallel block, biased output projection) and ``smollm3`` (NoPE layers), and (hf41, the 2025
families) ``glm4_moe``, ``llama4_text`` and ``llama4`` (its ``text_config``; chunked attention),
``olmo3``, ``seed_oss``, ``exaone4``, ``ernie4_5``, ``dots1`` and ``ministral3``; each reader's
docstring says what it maps, and the h6 readers refuse, naming the field, what the operators
cannot express (biases on the attention alone, Cohere's and Phi's per-head q/k LayerNorms). Fields a config
leaves out mean what its transformers config class defaults them to. A ModelSpec has a ``bias`` flag,
true when every linear layer has a bias, and ``qkv_bias`` for Qwen2's biases on q/k/v alone;
other partial biases are dropped: a LLaMA config with only one of ``attention_bias``/``mlp_bias``,
a GPT-NeoX config with ``attention_bias`` false (its MLP biases). Ignored because they change
neither shapes nor parameter counts:
GPT-NeoX's parallel residual and partial rotary, RoPE scaling; a sliding window is kept
(``ModelSpec.sliding_window``) only so that ``predict`` can say attention is costed over the
whole sequence, not the window.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

from trainsim.builders.spec import ModelSpec
from trainsim.errors import ConfigError, yaml_error

# --- the catalog -------------------------------------------------------------------------------

# GPT-2 / GPT-3 / Megatron GPT: MHA, GeLU, 4× MLP, LayerNorm, learned positions, biases, tied.
# name, hidden, layers, heads, vocab, seq_len, aliases
_GPT: tuple[tuple[str, int, int, int, int, int, tuple[str, ...]], ...] = (
    # GPT-2 (HF openai-community configs)
    ("gpt2",        768,  12, 12, 50257, 1024, ("gpt2-small", "openai-community/gpt2")),
    ("gpt2-medium", 1024, 24, 16, 50257, 1024, ("openai-community/gpt2-medium",)),
    ("gpt2-large",  1280, 36, 20, 50257, 1024, ("openai-community/gpt2-large",)),
    ("gpt2-xl",     1600, 48, 25, 50257, 1024, ("openai-community/gpt2-xl",)),
    # GPT-3, Brown et al. 2020 Table 2.1 (XL and 13B: see the module docstring)
    ("gpt3-125m", 768,   12, 12, 50257, 2048, ("gpt3-small",)),
    ("gpt3-350m", 1024,  24, 16, 50257, 2048, ("gpt3-medium",)),
    ("gpt3-760m", 1536,  24, 16, 50257, 2048, ("gpt3-large",)),
    ("gpt3-1.3b", 2048,  24, 16, 50257, 2048, ("gpt3-xl",)),
    ("gpt3-2.7b", 2560,  32, 32, 50257, 2048, ()),
    ("gpt3-6.7b", 4096,  32, 32, 50257, 2048, ()),
    ("gpt3-13b",  5120,  40, 40, 50257, 2048, ()),
    ("gpt3-175b", 12288, 96, 96, 50257, 2048, ("gpt3", "gpt3-davinci")),
    # Megatron GPT, Narayanan et al. 2021 Table 1 (vocabulary 51,200, sequence 2048)
    ("megatron-gpt-1.7b", 2304,  24,  24,  51200, 2048, ()),
    ("megatron-gpt-3.6b", 3072,  30,  32,  51200, 2048, ()),
    ("megatron-gpt-7.5b", 4096,  36,  32,  51200, 2048, ()),
    ("megatron-gpt-18b",  6144,  40,  48,  51200, 2048, ("megatron-gpt-18.4b",)),
    ("megatron-gpt-39b",  8192,  48,  64,  51200, 2048, ("megatron-gpt-39.1b",)),
    ("megatron-gpt-76b",  10240, 60,  80,  51200, 2048, ("megatron-gpt-76.1b",)),
    ("megatron-gpt-145b", 12288, 80,  96,  51200, 2048, ("megatron-gpt-145.6b",)),
    ("megatron-gpt-310b", 16384, 96,  128, 51200, 2048, ("megatron-gpt-310.1b",)),
    ("megatron-gpt-530b", 20480, 105, 128, 51200, 2048, ("megatron-gpt-529.6b",)),
    ("megatron-gpt-1t",   25600, 128, 160, 51200, 2048, ("megatron-gpt-1008b",)),
)  # fmt: skip

# LLaMA-style: SwiGLU, RMSNorm, rotary, no biases, untied; kv_heads == heads is MHA.
# name, hidden, layers, heads, kv_heads, ffn, vocab, seq_len, experts (top-2), aliases
_LLAMA: tuple[tuple[str, int, int, int, int, int, int, int, int, tuple[str, ...]], ...] = (
    # LLaMA-1 13B (2048 context; paper 001 Table IV) and LLaMA-2
    ("llama-13b",  5120, 40, 40, 40, 13824, 32000, 2048, 0, ("llama1-13b", "huggyllama/llama-13b")),
    ("llama2-7b",  4096, 32, 32, 32, 11008, 32000, 4096, 0, ("meta-llama/Llama-2-7b-hf",)),
    ("llama2-13b", 5120, 40, 40, 40, 13824, 32000, 4096, 0, ("meta-llama/Llama-2-13b-hf",)),
    ("llama2-70b", 8192, 80, 64, 8,  28672, 32000, 4096, 0, ("meta-llama/Llama-2-70b-hf",)),
    # LLaMA-3 / 3.1 (same shapes; 3.1 only extends the context with RoPE scaling)
    ("llama3-8b",   4096,  32,  32,  8, 14336, 128256, 8192, 0,
     ("llama3.1-8b", "meta-llama/Meta-Llama-3-8B", "meta-llama/Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B")),
    ("llama3-70b",  8192,  80,  64,  8, 28672, 128256, 8192, 0,
     ("llama3.1-70b", "meta-llama/Meta-Llama-3-70B", "meta-llama/Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B")),
    ("llama3-405b", 16384, 126, 128, 8, 53248, 128256, 8192, 0,
     ("llama3.1-405b", "meta-llama/Llama-3.1-405B", "meta-llama/Meta-Llama-3.1-405B")),
    # Mistral / Mixtral, Jiang et al. 2023/2024 Table 1 (Mixtral: 8 experts, top-2)
    ("mistral-7b",    4096, 32, 32, 8, 14336, 32000, 8192,  0, ("mistral-7b-v0.1", "mistralai/Mistral-7B-v0.1")),
    ("mixtral-8x7b",  4096, 32, 32, 8, 14336, 32000, 32768, 8, ("mixtral-8x7b-v0.1", "mistralai/Mixtral-8x7B-v0.1")),
    ("mixtral-8x22b", 6144, 56, 48, 8, 16384, 32768, 65536, 8, ("mixtral-8x22b-v0.1", "mistralai/Mixtral-8x22B-v0.1")),
    # Llemma 7B (Code Llama 7B shapes, vocabulary 32016; paper 001 Table IV)
    ("llemma-7b", 4096, 32, 32, 32, 11008, 32016, 4096, 0, ("EleutherAI/llemma_7b",)),
)  # fmt: skip


# Mistral 7B v0.1 (Jiang et al. 2023 §2, its HF config): a 4,096-token sliding window on every
# layer at its 8,192 context (Mixtral's configs have none)
_WINDOWS = {"mistral-7b": 4096}


def _moe_family_entries() -> list[ModelSpec]:
    """MoE families beyond Mixtral (h5), from their published HF configs; ``seq_len`` the
    pre-training context."""
    common: dict[str, Any] = {"activation": "swiglu", "norm": "rmsnorm", "position": "rotary", "bias": False}
    return [
        # Qwen3-30B-A3B (HF Qwen/Qwen3-30B-A3B config; Qwen3 technical report §3.1, 4,096 tokens
        # in pre-training stages 1-2): 128 experts of 768, top 8, q/k norms, every layer MoE
        ModelSpec(name="qwen3-30b-a3b", hidden=2048, layers=48, heads=32, kv_heads=4, head_dim=128,
                  ffn_hidden=6144, vocab=151936, seq_len=4096, num_experts=128, top_k=8, moe_ffn_hidden=768,
                  qk_norm="head", aliases=("Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B-Base"), **common),
        # Qwen1.5-MoE-A2.7B (HF Qwen/Qwen1.5-MoE-A2.7B config, model_type qwen2_moe; 8,192 context):
        # 60 experts of 1408, top 4, one gated shared expert of 5632, q/k/v biases
        ModelSpec(name="qwen1.5-moe-a2.7b", hidden=2048, layers=24, heads=16, ffn_hidden=5632, vocab=151936,
                  seq_len=8192, num_experts=60, top_k=4, moe_ffn_hidden=1408, qkv_bias=True,
                  shared_ffn_hidden=5632, shared_expert_gate=True, aliases=("Qwen/Qwen1.5-MoE-A2.7B", "Qwen/Qwen1.5-MoE-A2.7B-Chat"), **common),
        # gpt-oss-20b / -120b (HF openai/gpt-oss-* configs; model card: initial context 4,096):
        # GQA 64 heads of 64 (8 KV), biases on attention, experts and router, attention sinks,
        # a 128-token sliding window on every other layer (not modelled: the window note)
        *(ModelSpec(name=n, hidden=2880, layers=nl, heads=64, kv_heads=8, head_dim=64, ffn_hidden=2880,
                    vocab=201088, seq_len=4096, num_experts=e, top_k=4, moe_ffn_hidden=2880, activation="swiglu",
                    norm="rmsnorm", position="rotary", bias=True, router_bias=True, attention_sinks=True,
                    sliding_window=128, sliding_layers=nl // 2, aliases=(f"openai/{n}",))
          for n, nl, e in (("gpt-oss-20b", 24, 32), ("gpt-oss-120b", 36, 128))),
        # DeepSeek-V3 (HF deepseek-ai/DeepSeek-V3 config; DeepSeek-V3 report §4.2: 4K sequence in
        # pre-training): MLA (q rank 1536, KV rank 512, heads 128 + 64 rotary, values 128), 256
        # routed experts of 2048 top 8, one shared, first 3 layers dense of 18432; its one MTP
        # module is not modelled (671B without it, the HF model's count); DeepSeek-V3-0324 and R1 are
        # checkpoints of the same config
        ModelSpec(name="deepseek-v3", hidden=7168, layers=61, heads=128, head_dim=192, ffn_hidden=18432,
                  vocab=129280, seq_len=4096, num_experts=256, top_k=8, moe_ffn_hidden=2048,
                  shared_ffn_hidden=2048, dense_layers=(0, 1, 2), q_lora_rank=1536, kv_lora_rank=512,
                  qk_rope_head_dim=64, v_head_dim=128, mtp_layers=1,
                  aliases=("deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-V3-Base", "deepseek-ai/DeepSeek-V3-0324",
                           "deepseek-r1", "deepseek-ai/DeepSeek-R1"), **common),
        # DeepSeek-V2 (HF deepseek-ai/DeepSeek-V2 config; DeepSeek-V2 paper §3.1.2: 4K sequence):
        # MLA as V3's, 160 routed experts of 1536 top 6, two shared, the first layer dense of 12288
        ModelSpec(name="deepseek-v2", hidden=5120, layers=60, heads=128, head_dim=192, ffn_hidden=12288,
                  vocab=102400, seq_len=4096, num_experts=160, top_k=6, moe_ffn_hidden=1536,
                  shared_ffn_hidden=2 * 1536, dense_layers=(0,), q_lora_rank=1536, kv_lora_rank=512,
                  qk_rope_head_dim=64, v_head_dim=128, aliases=("deepseek-ai/DeepSeek-V2", "deepseek-ai/DeepSeek-V2-Chat"), **common),
    ]  # fmt: skip


@cache
def _entries() -> tuple[ModelSpec, ...]:
    """Every catalog model, in family and size order."""
    gpt = [
        ModelSpec(name=n, hidden=d, layers=nl, heads=h, vocab=v, seq_len=s,
                  tied_embeddings=True, aliases=a)
        for n, d, nl, h, v, s, a in _GPT
    ]  # fmt: skip
    neox = ModelSpec(  # GPT-NeoX-20B (HF EleutherAI/gpt-neox-20b: padded vocabulary 50432)
        name="gpt-neox-20b", hidden=6144, layers=44, heads=64, vocab=50432, seq_len=2048,
        position="rotary", parallel_residual=True, aliases=("neox-20b", "gpt-20b", "EleutherAI/gpt-neox-20b"),
    )  # fmt: skip
    llama = [
        ModelSpec(
            name=n, hidden=d, layers=nl, heads=h, kv_heads=0 if kv == h else kv, ffn_hidden=f,
            vocab=v, seq_len=s, activation="swiglu", norm="rmsnorm", position="rotary",
            bias=False, tied_embeddings=False, num_experts=e, top_k=2 if e else 0,
            moe_ffn_hidden=f if e else 0, aliases=a, sliding_window=_WINDOWS.get(n, 0),
        )
        for n, d, nl, h, kv, f, v, s, e, a in _LLAMA
    ]  # fmt: skip
    return (*gpt, neox, *llama, *_dense_entries(), *_moe_family_entries())


def _dense_entries() -> list[ModelSpec]:
    """Qwen3, Gemma 2/3, Phi-3, OLMo 2, Falcon, StarCoder2 (h4): each the sizes of its HF
    config on the Hub (= its transformers config class's docs), the context its report trains
    at; the parameter counts equal transformers' (tests)."""
    swiglu: dict[str, Any] = {"activation": "swiglu", "norm": "rmsnorm", "position": "rotary", "bias": False}
    gemma: dict[str, Any] = {**swiglu, "activation": "geglu", "tied_embeddings": True, "layer_norms": 4}
    falcon: dict[str, Any] = {"activation": "gelu", "position": "rotary", "bias": False, "tied_embeddings": True,
              "parallel_residual": True}  # fmt: skip
    return [
        # Qwen3 technical report (2025) §3.1: 4,096 tokens in pre-training stages 1-2 (as
        # qwen3-30b-a3b; its third, long-context stage runs 32,768: --seq-len 32768)
        ModelSpec(name="qwen3-8b", hidden=4096, layers=36, heads=32, kv_heads=8, ffn_hidden=12288,  # head_dim 128
                  vocab=151936, seq_len=4096, qk_norm="head", aliases=("Qwen/Qwen3-8B", "Qwen/Qwen3-8B-Base"),
                  **swiglu),
        # Gemma 2 report (2024): 8,192 context, soft-caps 30 (logits) and 50 (attention), a
        # 4,096-token window on every other layer
        ModelSpec(name="gemma2-9b", hidden=3584, layers=42, heads=16, kv_heads=8, head_dim=256,  # ffn 14,336: 4 x hidden
                  vocab=256000, seq_len=8192, logit_softcap=30.0, attn_softcap=50.0, sliding_window=4096,
                  sliding_layers=21, aliases=("gemma-2-9b", "google/gemma-2-9b", "google/gemma-2-9b-it"), **gemma),
        # Gemma 3 report (2025): pre-trained at 32k, extended to 128k; q/k norms, no soft-caps,
        # a 1,024-token window on 5 of 6 layers; the language model (the vision tower is not counted)
        ModelSpec(name="gemma3-12b", hidden=3840, layers=48, heads=16, kv_heads=8, head_dim=256,  # ffn 15,360: 4 x hidden
                  vocab=262208, seq_len=32768, qk_norm="head", sliding_window=1024, sliding_layers=40,
                  aliases=("gemma-3-12b", "google/gemma-3-12b-pt", "google/gemma-3-12b-it"), **gemma),
        # Phi-3-mini-4k (Abdin et al. 2024): 4k context, 2,047-token window in its config
        ModelSpec(name="phi3-mini", hidden=3072, layers=32, heads=32, ffn_hidden=8192, vocab=32064, seq_len=4096,
                  sliding_window=2047, hf_family="phi3", aliases=("phi-3-mini", "microsoft/Phi-3-mini-4k-instruct"),
                  **swiglu),
        # OLMo 2 7B (OLMo et al. 2024, "2 OLMo 2 Furious"): 4,096 context, q/k norms over the projections
        ModelSpec(name="olmo2-7b", hidden=4096, layers=32, heads=32, ffn_hidden=11008, vocab=100352, seq_len=4096,
                  qk_norm="full", aliases=("olmo-2-7b", "allenai/OLMo-2-1124-7B", "allenai/OLMo-2-1124-7B-Instruct"),
                  **swiglu),
        # Falcon (Almazrouei et al. 2023): 2,048 context; 7B multi-query with one norm per
        # layer, 40B GQA (8 KV heads) with two (new_decoder_architecture)
        ModelSpec(name="falcon-7b", hidden=4544, layers=32, heads=71, kv_heads=1, vocab=65024, seq_len=2048,
                  layer_norms=1, aliases=("tiiuae/falcon-7b", "tiiuae/falcon-7b-instruct"), **falcon),
        ModelSpec(name="falcon-40b", hidden=8192, layers=60, heads=128, kv_heads=8, vocab=65024, seq_len=2048,
                  aliases=("tiiuae/falcon-40b", "tiiuae/falcon-40b-instruct"), **falcon),
        # StarCoder2 (Lozhkov et al. 2024): 16,384 context, a 4,096-token window
        ModelSpec(name="starcoder2-7b", hidden=4608, layers=32, heads=36, kv_heads=4, vocab=49152, seq_len=16384,
                  activation="gelu", position="rotary", tied_embeddings=True, sliding_window=4096,
                  aliases=("bigcode/starcoder2-7b",)),
    ]  # fmt: skip


def _key(name: str) -> str:
    """Lookup key: case, spaces, dashes and underscores do not matter."""
    return re.sub(r"[\s_\-]+", "", name.strip().lower())


@cache
def _index() -> dict[str, ModelSpec]:
    out: dict[str, ModelSpec] = {}
    for spec in _entries():
        for name in (spec.name, *spec.aliases):
            k = _key(name)
            if out.get(k, spec) is not spec:
                raise ConfigError(
                    f"model catalog: name {name!r} is used by {out[k].name} and {spec.name}"
                )
            out[k] = spec
    return out


def list_models() -> list[ModelSpec]:
    """Every catalog model, in family and size order."""
    return list(_entries())


def get_model(name_or_path: str | Path) -> ModelSpec:
    """A model by catalog name or alias, from a HuggingFace ``config.json`` (file or directory), or
    from a YAML spec of :class:`ModelSpec` fields (:func:`read_model_yaml`)."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    hit = _index().get(_key(text))
    if _probe(path.is_dir):
        if (path / "config.json").is_file():
            return read_hf_config(path / "config.json")
        if hit is None:  # a folder that happens to share a catalog name is not the model
            raise ConfigError(f"model directory {path} has no config.json")
    if path.suffix.lower() in (".yaml", ".yml"):
        return read_model_yaml(path)
    if (_probe(path.is_file) and hit is None) or text.endswith(".json"):
        return read_hf_config(path)
    if hit is not None:
        return hit
    close = difflib.get_close_matches(_key(text), list(_index()), n=5, cutoff=0.6)
    names = list(dict.fromkeys(_index()[k].name for k in close))
    hint = f"close matches: {', '.join(names)}" if names else "no close match"
    raise ConfigError(
        f"unknown model {text!r} ({hint}); `trainsim models` lists the catalog, or give a "
        "HuggingFace config.json (or a directory holding one) or a YAML model spec"
    )


def _probe(test: Callable[[], bool]) -> bool:
    """``path.is_dir``/``is_file``, False where the name cannot be a path (longer than the file
    system allows): it is then looked up as a catalog name."""
    try:
        return test()
    except OSError:
        return False


# --- YAML model spec ------------------------------------------------------------------------


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read ({e})") from None


def read_model_yaml(path: str | Path) -> ModelSpec:
    """A :class:`ModelSpec` from a YAML file of its fields (``name``, ``hidden``, ``layers``,
    ``heads``, ``vocab`` required; ``ffn_hidden``, ``kv_heads``, ``activation``, ``norm``, ...
    optional), e.g.::

        name: my-7b
        hidden: 4096
        layers: 32
        heads: 32
        kv_heads: 8
        vocab: 32000
        ffn_hidden: 14336
        activation: swiglu
        norm: rmsnorm
        position: rotary
        bias: false

    Every error names the file and the field. A YAML file with a ``model_type`` key is read as
    a HuggingFace config written in YAML."""
    import dataclasses
    import typing

    import yaml

    path = Path(path)
    text = _read_text(path, "model spec")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise yaml_error(path, e) from None
    if doc is None:  # an empty file (or only comments)
        raise ConfigError(f"{path}: file is empty; expected a mapping of model fields (name, hidden, layers, heads, "
                          "vocab, ...: examples/models/gpt-1.3b.yaml)")  # fmt: skip
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a mapping of model fields at the top level")
    if "model_type" in doc:
        return hf_config_from_dict(doc, path)
    fields = {
        f.name: f for f in dataclasses.fields(ModelSpec) if f.name not in ("source", "aliases")
    }
    unknown = sorted(str(k) for k in set(doc) - set(fields))
    if unknown:
        raise ConfigError(
            f"{path}: unknown field(s) {', '.join(map(repr, unknown))}; known: {', '.join(fields)}"
        )
    missing = [n for n in ("name", "hidden", "layers", "heads", "vocab") if n not in doc]
    if missing:
        raise ConfigError(f"{path}: missing field(s) {', '.join(map(repr, missing))}")
    moe_only = [k for k in ("top_k", "moe_ffn_hidden") if doc.get(k) and not doc.get("num_experts")]
    if moe_only:
        raise ConfigError(f"{path}: field(s) {', '.join(map(repr, moe_only))} describe experts, but 'num_experts' is "
                          "not set (give it, or drop them for a dense model)")  # fmt: skip
    hints = typing.get_type_hints(ModelSpec)
    if "dense_layers" in doc:  # a YAML list of layer indices (h5)
        v = doc["dense_layers"]
        if not isinstance(v, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in v):
            raise ConfigError(f"{path}: field 'dense_layers' must be a list of layer indices, got {v!r}")
        doc["dense_layers"] = tuple(v)
    for k, v in doc.items():
        want = hints[k]
        allowed = typing.get_args(want) if typing.get_origin(want) is typing.Literal else None
        if allowed is not None and v not in allowed:
            raise ConfigError(f"{path}: field {k!r} must be one of {', '.join(allowed)}, got {v!r}")
        if want is bool and not isinstance(v, bool):
            raise ConfigError(f"{path}: field {k!r} must be true or false, got {v!r}")
        if want is int and (isinstance(v, bool) or not isinstance(v, int)):
            raise ConfigError(f"{path}: field {k!r} must be an integer, got {v!r}")
        if want is str and not isinstance(v, str):
            raise ConfigError(f"{path}: field {k!r} must be a string, got {v!r}")
    if doc.get("hf_family"):  # the modules impl hf prices: a family with a census (a typo would go unnoticed)
        from trainsim.builders.eager import HF_FAMILY_CENSUSES

        if doc["hf_family"] not in HF_FAMILY_CENSUSES:
            raise ConfigError(f"{path}: field 'hf_family' must be one of {', '.join(HF_FAMILY_CENSUSES)} (the "
                              f"transformers families --impl hf has a kernel census of), or be left out (the "
                              f"family the other fields describe), got {doc['hf_family']!r}")  # fmt: skip
    try:
        return ModelSpec(**doc, source=str(path))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


# --- HuggingFace config.json ---------------------------------------------------------------

# Field names HF model types use for the same quantity, first match wins.
_HIDDEN = ("hidden_size", "n_embd", "d_model")
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers")
_HEADS = ("num_attention_heads", "n_head")
_FFN = ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size")
_SEQ = ("max_position_embeddings", "n_positions", "n_ctx", "seq_length")


def _pretraining_context(doc: dict[str, Any], path: Path) -> tuple[int, str]:
    """A RoPE-scaled config's pre-training context and the field it is in, or ``(0, "")``:
    ``rope_scaling.original_max_position_embeddings`` (or ``rope_parameters``, where
    transformers 5 writes it; YaRN, Llama 3.1's ``llama3``: DeepSeek-V3
    4,096 of 163,840 positions; Llama 3.1 8,192 of 131,072), a top-level
    ``original_max_position_embeddings`` (Phi-3's LongRoPE configs keep it there: Phi-3-mini-128k
    and Phi-3.5-mini 4,096 of 131,072) or gpt-oss's ``initial_context_length``.
    ``max_position_embeddings`` is the extended context, which a long-context stage trains at
    and pre-training does not."""
    rs = doc.get("rope_scaling") or doc.get("rope_parameters")  # transformers 5 writes the latter
    key = "rope_scaling" if doc.get("rope_scaling") else "rope_parameters"
    for where, value in (((f"{key}.original_max_position_embeddings",
                           rs.get("original_max_position_embeddings") if isinstance(rs, dict) else None)),
                         ("original_max_position_embeddings", doc.get("original_max_position_embeddings")),
                         ("initial_context_length", doc.get("initial_context_length"))):  # fmt: skip
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{path}: field '{where}' must be a positive integer (tokens), got {value!r}")
        return value, where
    return 0, ""


class _Fields:
    """Typed reads of one config.json; every error names the file and the field."""

    def __init__(self, doc: dict[str, Any], path: Path) -> None:
        self.doc, self.path = doc, path

    def _find(self, keys: tuple[str, ...]) -> tuple[str, Any]:
        for k in keys:
            if self.doc.get(k) is not None:
                return k, self.doc[k]
        return keys[0], None

    def integer(self, *keys: str, default: int | None = None) -> int:
        k, v = self._find(keys)
        if v is None:
            if default is not None:
                return default
            also = f" (or {', '.join(repr(x) for x in keys[1:])})" if len(keys) > 1 else ""
            raise ConfigError(
                f"{self.path}: missing field {k!r}{also}, needed for model_type {self.doc['model_type']!r}"
            )
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ConfigError(f"{self.path}: field {k!r} must be a positive integer, got {v!r}")
        return v

    def flag(self, key: str, default: bool) -> bool:
        v = self.doc.get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise ConfigError(f"{self.path}: field {key!r} must be true or false, got {v!r}")
        return v

    def activation(self, key: str, default: str, *, gated: bool) -> str:
        v = self.doc.get(key)
        v = default if v is None else v
        if isinstance(v, str) and (v.startswith("gelu") or v == "quick_gelu"):
            return "geglu" if gated else "gelu"
        if gated and v in ("silu", "swish"):
            return "swiglu"
        if not gated and v == "relu":
            return "relu"
        known = "silu, swish, gelu*" if gated else "gelu*, relu"
        raise ConfigError(f"{self.path}: field {key!r} is {v!r}; supported here: {known}")


# --- MoE families (h5): Qwen2-MoE, Qwen3-MoE, gpt-oss, DeepSeek-V2/V3 ----------------------


def _count(f: _Fields, key: str, default: int) -> int:
    """A non-negative integer field (0 allowed: no shared experts, no dense layers)."""
    v = f.doc.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ConfigError(f"{f.path}: field {key!r} must be a non-negative integer, got {v!r}")
    return v


def _qwen_dense_layers(f: _Fields, layers: int) -> tuple[int, ...]:
    """Qwen2-MoE/Qwen3-MoE: layer i is dense when listed in ``mlp_only_layers`` or when
    ``(i + 1) % decoder_sparse_step`` is not 0 (transformers' Qwen*MoeDecoderLayer)."""
    step = f.integer("decoder_sparse_step", default=1)
    only = f.doc.get("mlp_only_layers") or []
    if not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in only):
        raise ConfigError(f"{f.path}: field 'mlp_only_layers' must be a list of layer indices, got {only!r}")
    if bad := [i for i in only if not 0 <= i < layers]:  # transformers never matches them: a typo, or another model's list
        raise ConfigError(f"{f.path}: field 'mlp_only_layers' lists layer(s) {', '.join(map(str, bad))}, outside the "
                          f"{layers} layers (indices 0..{layers - 1})")  # fmt: skip
    return tuple(i for i in range(layers) if i in only or (i + 1) % step)


def _qwen_moe(f: _Fields, *, kv_default: int) -> dict[str, Any]:
    """Routed experts of moe_intermediate_size (num_experts, top num_experts_per_tok), dense
    layers of intermediate_size where the config says (:func:`_qwen_dense_layers`)."""
    return {
        **_llama_like(f, kv_default=kv_default),
        "num_experts": f.integer("num_experts", "num_local_experts"),
        "top_k": f.integer("num_experts_per_tok"),
        "moe_ffn_hidden": f.integer("moe_intermediate_size"),
        "dense_layers": _qwen_dense_layers(f, f.integer(*_LAYERS)),
    }


def _qwen3_moe(f: _Fields) -> dict[str, Any]:
    """qwen3_moe: Qwen3's attention (GQA, RMSNorm on each q and k head, no biases) and
    experts (Qwen3MoeConfig: 4 KV heads by default); with use_sliding_window (false by
    default) the window on every layer (Qwen3MoeConfig has no max_window_layers)."""
    return {**_qwen_moe(f, kv_default=4), "qk_norm": "head", **_qwen_window(f, None)}


def _qwen2_moe(f: _Fields) -> dict[str, Any]:
    """qwen2_moe: Qwen2's attention (q/k/v biases unless qkv_bias is false) and experts, plus
    one shared expert of shared_expert_intermediate_size behind a sigmoid gate (Qwen2MoeConfig:
    16 KV heads by default); with use_sliding_window (false by default) the window on the even
    layers below max_window_layers (Qwen2MoeConfig's layer_types)."""
    return {
        **_qwen_moe(f, kv_default=16),
        "qkv_bias": f.flag("qkv_bias", True),
        "shared_ffn_hidden": _count(f, "shared_expert_intermediate_size", 0),
        "shared_expert_gate": _count(f, "shared_expert_intermediate_size", 0) > 0,
        **_qwen_window(f, lambda i, first: (i + 1) % 2 == 1 and i < first),
    }


def _gpt_oss(f: _Fields) -> dict[str, Any]:
    """gpt_oss: GQA with head_dim 64 (GptOssConfig's default), biases on q/k/v/o, on the
    experts and on the router, attention sinks, experts of intermediate_size."""
    return {
        **_llama_like(f, kv_default=8),
        "head_dim": f.integer("head_dim", default=64),
        "bias": f.flag("attention_bias", True),
        "router_bias": True,
        "attention_sinks": True,
        "num_experts": f.integer("num_local_experts"),
        "top_k": f.integer("num_experts_per_tok"),
        "moe_ffn_hidden": f.integer(*_FFN),
        # every other layer attends within the window (GptOssConfig's layer_types: even layers)
        "sliding_layers": _window_layers(f, lambda i: i % 2 == 0),
    }


def _deepseek(f: _Fields) -> dict[str, Any]:
    """deepseek_v2/deepseek_v3: MLA (q_lora_rank null or 0: a full-rank q projection),
    n_routed_experts of moe_intermediate_size (top num_experts_per_tok), n_shared_experts of
    the same width, the first first_k_dense_replace layers dense of intermediate_size and, from
    there, every layer whose index moe_layer_freq does not divide (DeepSeek's modeling code, which
    the checkpoints' auto_map names; transformers' DeepseekV2/V3 ignore the field, 1 in every
    published config). Dropped as other partial biases are: attention_bias (false in the
    published configs). Ignored: group-limited routing (n_group, topk_group), which changes no
    shape."""
    layers = f.integer(*_LAYERS)
    nope, rope = f.integer("qk_nope_head_dim"), f.integer("qk_rope_head_dim")
    moe = f.integer("moe_intermediate_size")
    first_dense = _count(f, "first_k_dense_replace", 0)
    if first_dense > layers:
        raise ConfigError(f"{f.path}: field 'first_k_dense_replace' is {first_dense}, more than the {layers} layers")
    freq = f.integer("moe_layer_freq", default=1)
    return {
        "kv_heads": 0,  # MLA: every head has its own K and V (from the shared latent)
        "head_dim": nope + rope,
        "activation": f.activation("hidden_act", "silu", gated=True),
        "norm": "rmsnorm",
        "position": "rotary",
        "bias": False,
        "tied_embeddings": f.flag("tie_word_embeddings", False),
        "q_lora_rank": _count(f, "q_lora_rank", 0),
        "kv_lora_rank": f.integer("kv_lora_rank"),
        "qk_rope_head_dim": rope,
        "v_head_dim": f.integer("v_head_dim"),
        "num_experts": f.integer("n_routed_experts"),
        "top_k": f.integer("num_experts_per_tok"),
        "moe_ffn_hidden": moe,
        "shared_ffn_hidden": _count(f, "n_shared_experts", 0) * moe,
        "dense_layers": tuple(i for i in range(layers) if i < first_dense or i % freq),
        "mtp_layers": _count(f, "num_nextn_predict_layers", 0),
    }


def _gpt2(f: _Fields) -> dict[str, Any]:
    """gpt2 and gpt_bigcode (StarCoder): learned positions, LayerNorm, biases, tied by default."""
    heads = f.integer(*_HEADS)
    kv = f.integer("num_key_value_heads", default=1 if f.flag("multi_query", False) else heads)
    return {
        "kv_heads": kv,
        "activation": f.activation("activation_function", "gelu_new", gated=False),
        "tied_embeddings": f.flag("tie_word_embeddings", True),
    }


def _gpt_neox(f: _Fields) -> dict[str, Any]:
    """gpt_neox: rotary, LayerNorm, biases (the MLP always; attention per attention_bias), untied."""
    return {
        "position": "rotary",
        "bias": f.flag("attention_bias", True),
        "activation": f.activation("hidden_act", "gelu", gated=False),
        "tied_embeddings": f.flag("tie_word_embeddings", False),
        "parallel_residual": f.flag("use_parallel_residual", True),
    }


def _llama_like(f: _Fields, kv_default: int | None = None) -> dict[str, Any]:
    """llama, mistral, qwen2: GQA, gated MLP, RMSNorm, rotary, untied by default. Without
    ``num_key_value_heads``: what transformers' config class defaults it to, ``kv_default``
    (MistralConfig and MixtralConfig 8, Qwen2Config 32), else the attention heads (LlamaConfig)."""
    return {
        "kv_heads": f.integer("num_key_value_heads", default=kv_default or f.integer(*_HEADS)),
        "head_dim": f.integer("head_dim", default=0),
        "activation": f.activation("hidden_act", "silu", gated=True),
        "norm": "rmsnorm",
        "position": "rotary",
        "bias": f.flag("attention_bias", False) and f.flag("mlp_bias", False),
        "tied_embeddings": f.flag("tie_word_embeddings", False),
    }


def _qwen2(f: _Fields) -> dict[str, Any]:
    """qwen2: as llama, and the q/k/v projections always carry biases (o_proj and the MLP do not);
    a window only with use_sliding_window (Qwen2Config's default false), on the layers from
    max_window_layers (28) on, as Qwen3's (every layer had taken it: Qwen2-7B's 28 layers with
    use_sliding_window true have none)."""
    return {**_llama_like(f, kv_default=32), "qkv_bias": True, **_qwen_window(f, lambda i, first: i >= first)}


def _qwen_window(f: _Fields, sliding: Callable[[int, int], bool] | None) -> dict[str, Any]:
    """A Qwen config's window, as transformers 5.24's config classes set it: only with
    use_sliding_window (false by default) and a sliding_window (4096 unless given; null: none),
    on the layers ``sliding(i, max_window_layers)`` picks (max_window_layers 28 unless given, 0
    accepted), or the config's own ``layer_types`` where it lists them (Qwen2Config and
    Qwen3Config: ``i >= max_window_layers``, 0 sliding every layer; Qwen2MoeConfig: the even
    layers below it); ``sliding`` None: every layer (Qwen3MoeConfig has no layer_types: each
    Qwen3MoeAttention takes config.sliding_window)."""
    window = f.doc.get("sliding_window", 4096)
    if not f.flag("use_sliding_window", False) or not window:  # null (or 0): no window (its type checked later)
        return {"sliding_layers": 0}
    first = _count(f, "max_window_layers", 28)
    layers = f.integer(*_LAYERS) if sliding is None else _window_layers(f, lambda i: sliding(i, first))
    return {"sliding_layers": layers, "sliding_window": window} if layers else {"sliding_layers": 0}


def _mistral(f: _Fields) -> dict[str, Any]:
    return _llama_like(f, kv_default=8)


def _mixtral_cfg(f: _Fields) -> dict[str, Any]:
    ffn = f.integer(*_FFN)
    return {
        **_llama_like(f, kv_default=8),
        "num_experts": f.integer("num_local_experts"),
        "top_k": f.integer("num_experts_per_tok"),
        "moe_ffn_hidden": ffn,
    }


# --- dense families (h4): Qwen3, Phi-3, OLMo 2, Gemma 2/3, Falcon, StarCoder2 ------------------

# Fields a family's config class defaults when a config.json leaves them out (Hub configs of
# Gemma 3 give only what differs from Gemma3TextConfig; Falcon-7B's has no context length).
_GEMMA3_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131_072,
}  # fmt: skip
# <Family>Config.max_position_embeddings
_SEQ_DEFAULTS: dict[str, int] = {"falcon": 2048, "gemma": 8192, "granite": 2048, "olmoe": 4096, "cohere": 8192,
                                 "glm": 131_072, "glm4": 131_072, "phi": 2048, "smollm3": 32_768,
                                 "glm4_moe": 131_072, "llama4_text": 131_072, "olmo3": 2048, "seed_oss": 524_288,
                                 "exaone4": 2048, "ernie4_5": 131_072, "dots1": 2048, "ministral3": 262_144}  # fmt: skip
_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})  # what layer_types may say here


def _softcap(f: _Fields, key: str, default: float | None) -> float:
    """A soft-capping constant: a positive number, null for none (0 here), ``default`` if absent."""
    v = f.doc.get(key, default)  # an explicit null stays None
    if v is None:
        return 0.0
    if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
        raise ConfigError(f"{f.path}: field {key!r} must be a positive number or null, got {v!r}")
    return float(v)


def _window_layers(f: _Fields, sliding: Callable[[int], bool]) -> int:
    """How many layers attend within the sliding window: the config's ``layer_types`` where it
    lists them, else the family's pattern (``sliding(i)`` for layer ``i``, as its config class
    fills ``layer_types``)."""
    layers = f.integer(*_LAYERS)
    types = f.doc.get("layer_types")
    if types is None:
        return sum(sliding(i) for i in range(layers))
    if not isinstance(types, list) or len(types) != layers or not all(isinstance(t, str) for t in types):
        raise ConfigError(f"{f.path}: field 'layer_types' must list one attention type per layer ({layers}), "
                          f"got {types!r}")  # fmt: skip
    if bad := sorted(set(types) - _LAYER_TYPES):  # e.g. Llama 4's chunked_attention: another attention
        i = types.index(bad[0])
        raise ConfigError(f"{f.path}: field 'layer_types' has {bad[0]!r} (layer {i}); supported here: "
                          f"{', '.join(sorted(_LAYER_TYPES))}")  # fmt: skip
    return sum(t == "sliding_attention" for t in types)


def _qwen3(f: _Fields) -> dict[str, Any]:
    """qwen3: as llama, with an RMSNorm over each query and key head (q_norm, k_norm) and head_dim
    128 unless given (Qwen3Config); a window only with use_sliding_window, on the layers from
    max_window_layers on."""
    return {**_llama_like(f), "head_dim": f.integer("head_dim", default=128), "qk_norm": "head",
            **_qwen_window(f, lambda i, first: i >= first)}  # fmt: skip


def _phi3(f: _Fields) -> dict[str, Any]:
    """phi3: as llama with fused qkv and gate/up projections (the same shapes), never biased;
    ``head_dim`` where given (:func:`_llama_like` reads it, as Phi3Attention takes
    ``getattr(config, "head_dim", hidden_size // num_attention_heads)``); partial rotary
    (``rope_fraction``: Phi-4-mini's 0.75, Phi3Config's 1.0 unless given; Phi3's rotary
    embedding and ``apply_rotary_pos_emb`` take ``int(head_dim x it)`` dims); its own kernel census (``hf_family`` phi3: the fused projections' slices and
    Phi3's rotary, which concatenates the passed dims back even when none are passed)."""
    return {**_llama_like(f), "bias": False, "rope_fraction": _partial_rotary(f, 1.0), "hf_family": "phi3"}


def _olmo2(f: _Fields) -> dict[str, Any]:
    """olmo2: as llama, its two norms after attention and after the MLP (the same operators and
    shapes), and an RMSNorm over the whole query and key projections."""
    return {**_llama_like(f), "qk_norm": "full"}


def _gemma(f: _Fields, *, qk_norm: str, caps: tuple[float | None, float | None], every: int) -> dict[str, Any]:
    """gemma2 / gemma3_text: GQA with head_dim 256 unless given, gated GeLU-tanh MLP, RMSNorm
    before and after attention and MLP (four a layer), tied embeddings; soft-capped logits and
    attention scores (Gemma 2: 30 and 50 unless given); a sliding window (4096 unless given) on
    all layers but every ``every``-th."""
    kw = {
        **_llama_like(f, kv_default=4),
        "head_dim": f.integer("head_dim", default=256),
        "activation": f.activation("hidden_activation", "gelu_pytorch_tanh", gated=True),
        "tied_embeddings": f.flag("tie_word_embeddings", True),
        "layer_norms": 4,
        "qk_norm": qk_norm,
        "logit_softcap": _softcap(f, "final_logit_softcapping", caps[0]),
        "attn_softcap": _softcap(f, "attn_logit_softcapping", caps[1]),
        "sliding_layers": _window_layers(f, lambda i: (i + 1) % every != 0),
    }
    if "sliding_window" not in f.doc:
        kw["sliding_window"] = 4096
    return kw


def _gemma2(f: _Fields) -> dict[str, Any]:
    return _gemma(f, qk_norm="none", caps=(30.0, 50.0), every=2)


def _gemma3_text(f: _Fields) -> dict[str, Any]:
    """gemma3_text: Gemma 2's layer with q/k RMSNorms per head and no soft-capping (unless
    given); five sliding-window layers to one global (sliding_window_pattern 6)."""
    every = f.integer("sliding_window_pattern", default=6)
    return _gemma(f, qk_norm="head", caps=(None, None), every=every)


def _gemma3(doc: dict[str, Any], path: Path) -> ModelSpec:
    """gemma3 (the multimodal checkpoint): its language model, the ``text_config`` with
    Gemma3TextConfig's defaults for what it leaves out; the vision tower is not modelled."""
    text = doc.get("text_config") or {}
    if not isinstance(text, dict):
        raise ConfigError(f"{path}: field 'text_config' must be an object (the language model's config), got {text!r}")
    inner = {**_GEMMA3_TEXT_DEFAULTS, "tie_word_embeddings": doc.get("tie_word_embeddings", True),
             **text, "model_type": "gemma3_text", "_name_or_path": doc.get("_name_or_path")}  # fmt: skip
    try:
        model = hf_config_from_dict(inner, path)
    except ConfigError as e:
        raise ConfigError(f"{e} (in 'text_config')") from None
    vision = doc.get("vision_config")
    if isinstance(vision, dict) or "mm_tokens_per_image" in doc:
        # Gemma 3's SigLIP encoder (400M-class) and projector, and the image tokens it feeds in
        model = replace(model, left_out="its vision tower (vision_config: the SigLIP image encoder and its "
                                        "projector) and image tokens: the language model alone is predicted")  # fmt: skip
    return model


def _falcon(f: _Fields) -> dict[str, Any]:
    """falcon: LayerNorm, GeLU MLP, rotary (or ALiBi), biases per ``bias`` (default none), tied.
    Attention as FalconAttention builds it: ``num_kv_heads`` KV heads with
    new_decoder_architecture (Falcon-40B/180B), else one (multi_query, Falcon-7B) or all. With
    parallel_attn, attention and MLP read one norm's output (Falcon-7B) or two norms'
    (num_ln_in_parallel_attn 2, new_decoder_architecture's default); without it, two in sequence."""
    heads = f.integer(*_HEADS)
    new = f.flag("new_decoder_architecture", False)
    if new:
        kv = f.integer("num_kv_heads", "n_head_kv", default=heads)
    else:
        kv = 1 if f.flag("multi_query", True) else heads
    parallel = f.flag("parallel_attn", True)
    n_ln = f.integer("num_ln_in_parallel_attn", default=2 if new else 1)
    return {
        "kv_heads": kv,
        "activation": f.activation("activation", "gelu", gated=False),
        "position": "alibi" if f.flag("alibi", False) else "rotary",
        "bias": f.flag("bias", False),
        "tied_embeddings": f.flag("tie_word_embeddings", True),
        "parallel_residual": parallel,
        "layer_norms": 2 if not parallel or n_ln == 2 else 1,
    }


def _starcoder2(f: _Fields) -> dict[str, Any]:
    """starcoder2: GQA (2 KV heads unless given), GeLU-tanh MLP (two matrices), LayerNorm,
    rotary, biases on every linear layer (use_bias), tied embeddings."""
    return {
        "kv_heads": f.integer("num_key_value_heads", default=2),
        "activation": f.activation("hidden_act", "gelu_pytorch_tanh", gated=False),
        "position": "rotary",
        "bias": f.flag("use_bias", True),
        "tied_embeddings": f.flag("tie_word_embeddings", True),
    }


# --- more families (h6): Gemma, Granite, OLMoE, Cohere, GLM / GLM-4, Phi, SmolLM3 --------------
# Each as transformers 5's modeling code builds it (models/<family>/modeling_*.py); defaults
# are its config class's. Biases on the attention alone (LLaMA-style ``attention_bias`` with no
# MLP bias: q, k, v and o) are refused here rather than dropped: ModelSpec's ``bias`` is every
# linear layer's, ``qkv_bias`` q/k/v's alone, and neither is o_proj's alone.


def _all_biases(f: _Fields, attention: str, mlp: str | None) -> bool:
    """``bias`` from a config's attention and MLP bias flags (``mlp`` None: the MLP never has
    one); a ConfigError naming the field where only the attention's are on."""
    attn, ffn = f.flag(attention, False), mlp is not None and f.flag(mlp, False)
    if attn != ffn:
        which = attention if attn else mlp
        raise ConfigError(f"{f.path}: field {which!r} is true and the other linear layers have no bias: biases on "
                          f"some layers alone are not modelled here (ModelSpec.bias is every linear layer's)")  # fmt: skip
    return attn and ffn


def _refuse(f: _Fields, key: str, what: str) -> None:
    """A ConfigError naming ``key`` when the config turns on a feature the operators cannot express."""
    if f.doc.get(key) not in (None, False):
        raise ConfigError(f"{f.path}: field {key!r} is {json.dumps(f.doc[key])}: {what} is not modelled (the reader refuses it "
                          f"rather than predict another model)")  # fmt: skip


def _gemma1(f: _Fields) -> dict[str, Any]:
    """gemma (Gemma 1): GemmaConfig's 16 KV heads and head_dim 256 unless given, a GeLU-tanh
    GeGLU (its ``hidden_act``; the legacy "gelu" means tanh too), two (1 + weight) RMSNorms a
    layer, the embedding scaled by sqrt(d) (one multiply: no parameters), tied embeddings."""
    return {
        **_llama_like(f, kv_default=16),
        "head_dim": f.integer("head_dim", default=256),
        "activation": f.activation("hidden_act", "gelu_pytorch_tanh", gated=True),
        "bias": _all_biases(f, "attention_bias", None),
        "tied_embeddings": f.flag("tie_word_embeddings", True),
        "hf_family": "gemma",
    }


def _granite(f: _Fields) -> dict[str, Any]:
    """granite: LLaMA's layer; its embedding_multiplier, residual_multiplier,
    attention_multiplier and logits_scaling scale activations (no shapes, no parameters: a
    fused stack folds each into a neighbouring kernel, the GEMMs' alpha or the softmax scale)."""
    return {**_llama_like(f), "bias": _all_biases(f, "attention_bias", "mlp_bias"), "hf_family": "granite"}


def _olmoe(f: _Fields) -> dict[str, Any]:
    """olmoe: OLMo's MoE, every layer routed: num_experts (64) experts of intermediate_size, top
    num_experts_per_tok (8), no shared expert, a router without bias; RMSNorms over the whole q
    and k projections (as OLMo 2's). clip_qkv clamps in place (no shapes)."""
    return {
        **_llama_like(f),
        "bias": _all_biases(f, "attention_bias", None),
        "qk_norm": "full",
        "num_experts": f.integer("num_experts", default=64),
        "top_k": f.integer("num_experts_per_tok", default=8),
        "moe_ffn_hidden": f.integer(*_FFN),
        "hf_family": "olmoe",
    }


def _cohere(f: _Fields) -> dict[str, Any]:
    """cohere (Command R): a parallel block (attention and MLP read one LayerNorm's output and
    add to the residual together, as Falcon-7B's), LayerNorms with a weight and no bias, SwiGLU,
    rotary (interleaved: the same work), tied embeddings; logit_scale multiplies the logits (the
    head GEMM's alpha). use_qk_norm (Command R+: a LayerNorm per head with per-head weights) is
    refused."""
    _refuse(f, "use_qk_norm", "a LayerNorm over each query and key head with per-head weights (use_qk_norm)")
    return {
        **_llama_like(f),
        "norm": "layernorm",
        "norm_bias": False,
        "bias": _all_biases(f, "attention_bias", None),
        "tied_embeddings": f.flag("tie_word_embeddings", True),
        "parallel_residual": True,
        "layer_norms": 1,
        "hf_family": "cohere",
    }


def _partial_rotary(f: _Fields, default: float) -> float:
    """``partial_rotary_factor`` as transformers 5.24's configs take it: from the RoPE dict
    (``rope_scaling`` where the config has one, else ``rope_parameters``: transformers writes it
    there), else the top level (older configs, Phi-4-mini's), else ``default`` (the config
    class's: PhiConfig's and GlmConfig's 0.5, Phi3Config's 1.0). ``convert_rope_params_to_dict``
    takes ``rope_scaling or rope_parameters`` and ``setdefault``s the top-level factor into it,
    so the dict's wins."""
    rope = f.doc.get("rope_scaling") or f.doc.get("rope_parameters")
    where = "rope_scaling" if f.doc.get("rope_scaling") else "rope_parameters"
    key, v = "partial_rotary_factor", None
    if isinstance(rope, dict) and rope.get("partial_rotary_factor") is not None:
        key, v = f"{where}.partial_rotary_factor", rope["partial_rotary_factor"]
    elif f.doc.get("partial_rotary_factor") is not None:
        v = f.doc["partial_rotary_factor"]
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 1:
        raise ConfigError(f"{f.path}: field {key!r} must be a number in (0, 1], got {v!r}")
    return float(v)


def _glm(f: _Fields, *, norms: int) -> dict[str, Any]:
    """glm (GLM-4-9B) and glm4 (GLM-4-0414): GQA with GlmConfig's 2 KV heads and head_dim 128
    unless given, biases on q/k/v (attention_bias, true by default; o_proj and the MLP have none),
    SwiGLU with gate and up fused (the same shapes), RMSNorm, partial rotary (``rope_fraction``, half of each head:
    no shapes; costed as the full width, which a fused kernel reads and writes), untied; glm4
    adds the norms after attention and after the MLP (four a layer, as Gemma's)."""
    return {
        **_llama_like(f, kv_default=2),
        "head_dim": f.integer("head_dim", default=128),
        "bias": False,
        "qkv_bias": f.flag("attention_bias", True),
        "layer_norms": norms,
        "rope_fraction": _partial_rotary(f, 0.5),
        "hf_family": f.doc["model_type"],
    }


def _phi(f: _Fields) -> dict[str, Any]:
    """phi (phi-1.5, phi-2): a parallel block on one LayerNorm (with bias), biases on every
    linear layer and on the output projection (``head_bias``), a dense GeLU MLP (gelu_new),
    partial rotary (``rope_fraction``; no shapes), untied. qk_layernorm (LayerNorms over each query and key head,
    with biases) is refused; resid_pdrop and embd_pdrop are the plan's dropout (``--hidden-dropout``)."""
    _refuse(f, "qk_layernorm", "LayerNorms with biases over each query and key head (qk_layernorm)")
    heads = f.integer(*_HEADS)
    return {
        "kv_heads": f.integer("num_key_value_heads", default=heads),
        "head_dim": f.integer("head_dim", default=0),
        "activation": f.activation("hidden_act", "gelu_new", gated=False),
        "position": "rotary",
        "bias": True,
        "head_bias": True,
        "tied_embeddings": f.flag("tie_word_embeddings", False),
        "parallel_residual": True,
        "layer_norms": 1,
        "rope_fraction": _partial_rotary(f, 0.5),
        "hf_family": "phi",
    }


def _smollm3(f: _Fields) -> dict[str, Any]:
    """smollm3: LLaMA's layer (4 KV heads unless given, tied by default) with no rotary embedding
    on the layers ``no_rope_layers`` marks 0 (by default every ``no_rope_layer_interval``-th, 4);
    with use_sliding_window, the window on those NoPE layers (SmolLM3Config's layer_types)."""
    layers = f.integer(*_LAYERS)
    interval = f.integer("no_rope_layer_interval", default=4)
    rope = f.doc.get("no_rope_layers")
    if rope is None:
        rope = [int((i + 1) % interval != 0) for i in range(layers)]
    if not isinstance(rope, list) or len(rope) != layers or any(r not in (0, 1) or isinstance(r, bool) for r in rope):
        raise ConfigError(f"{f.path}: field 'no_rope_layers' must list 1 (rotary) or 0 (none) for each of the "
                          f"{layers} layers, got {rope!r}")  # fmt: skip
    # the window applies where use_sliding_window is on and layer_types (or, without them,
    # SmolLM3Config's rule: the NoPE layers) says sliding_attention; none if no layer does
    on = f.flag("use_sliding_window", False) and f.doc.get("sliding_window") is not None
    windowed = _window_layers(f, lambda i: not rope[i]) if on else 0
    kw = {
        **_llama_like(f, kv_default=4),
        "bias": _all_biases(f, "attention_bias", "mlp_bias"),
        "tied_embeddings": f.flag("tie_word_embeddings", True),
        "nope_layers": rope.count(0),
        "sliding_layers": windowed,
        "hf_family": "smollm3",
    }
    if not windowed:
        kw["sliding_window"] = 0  # a sliding_window field the layers do not use
    return kw


# --- 2025 families (hf41): GLM-4.5 MoE, Llama 4 ------------------------------------------------


def _glm4_moe(f: _Fields) -> dict[str, Any]:
    """glm4_moe (GLM-4.5, GLM-4.5-Air, GLM-4.6): GQA (Glm4MoeConfig's 8 KV heads unless given;
    head_dim where given, else hidden / heads), biases on q/k/v per attention_bias (false by
    default, true in the published configs; o_proj has none), partial rotary (``rope_fraction``,
    Glm4MoeConfig's 0.5 unless given), with use_qk_norm an RMSNorm with weights over each query
    and key head (Glm4MoeAttention's q_norm/k_norm: ``qk_norm`` head), two norms a layer; the
    first first_k_dense_replace layers (1 unless given) dense of intermediate_size, every other
    layer n_routed_experts of moe_intermediate_size (top num_experts_per_tok; its router's weight
    has no bias, e_score_correction_bias is a buffer, not a parameter) and n_shared_experts of the
    same width; num_nextn_predict_layers MTP depths (``mtp_layers``, 1 unless given:
    Glm4MoeConfig's num_mtp_layers; transformers' model does not build them, as DeepSeek-V3's).
    Ignored, as for DeepSeek (:func:`_deepseek`): group-limited routing (n_group, topk_group),
    routed_scaling_factor and norm_topk_prob, which scale routing weights and change no shape."""
    layers = f.integer(*_LAYERS)
    first_dense = _count(f, "first_k_dense_replace", 1)
    if first_dense > layers:
        raise ConfigError(f"{f.path}: field 'first_k_dense_replace' is {first_dense}, more than the {layers} layers")
    moe = f.integer("moe_intermediate_size", default=1408)
    return {
        **_llama_like(f, kv_default=8),
        "bias": False,
        "qkv_bias": f.flag("attention_bias", False),
        "qk_norm": "head" if f.flag("use_qk_norm", False) else "none",
        "rope_fraction": _partial_rotary(f, 0.5),
        "num_experts": f.integer("n_routed_experts", "num_local_experts", default=128),
        "top_k": f.integer("num_experts_per_tok", default=8),
        "moe_ffn_hidden": moe,
        "shared_ffn_hidden": _count(f, "n_shared_experts", 1) * moe,
        "dense_layers": tuple(range(first_dense)),
        "mtp_layers": _count(f, "num_nextn_predict_layers", 1),
    }


def _layer_list(f: _Fields, key: str, layers: int, values: tuple[int, ...] | None) -> list[int] | None:
    """A per-layer list field: None when absent or empty (the config class then fills its
    default; Llama 4's published configs give ``"no_rope_layers": []``), else checked as
    ``values`` per layer (``None``: layer indices, each in 0..layers-1)."""
    v = f.doc.get(key)
    if v is None or v == []:
        return None
    if values is not None:
        if not isinstance(v, list) or len(v) != layers or any(isinstance(x, bool) or x not in values for x in v):
            raise ConfigError(f"{f.path}: field {key!r} must list {' or '.join(map(str, values))} for each of the "
                              f"{layers} layers, got {v!r}")  # fmt: skip
    elif not isinstance(v, list) or any(isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < layers
                                        for x in v):  # fmt: skip
        raise ConfigError(f"{f.path}: field {key!r} must list layer indices in 0..{layers - 1}, got {v!r}")
    return v


def _llama4_text(f: _Fields) -> dict[str, Any]:
    """llama4_text (Llama 4 Scout / Maverick's language model): GQA (Llama4TextConfig's 8 KV
    heads and head_dim 128 unless given), SwiGLU, two RMSNorms a layer, untied. MoE layers
    (``moe_layers``, else every interleave_moe_layer_step-th from step − 1: Scout all, Maverick
    every other) have num_local_experts routed experts of intermediate_size, top
    num_experts_per_tok (1; a sigmoid of the top logit, its router without bias) and one shared
    expert of intermediate_size; the others (``dense_layers``) a dense MLP of
    intermediate_size_mlp. NoPE layers where ``no_rope_layers`` says 0 (by default every
    no_rope_layer_interval-th, 4; an empty list is the default, as Llama4TextConfig takes it);
    the rotary layers attend in chunks of attention_chunk_size (``attention_chunk``; null: none)
    unless ``layer_types`` says otherwise, and with use_qk_norm (true unless given) L2-normalise
    each query and key head without weights (``qk_norm`` l2, on the rotary layers).
    attention_bias (q, k, v and o) is refused as the other families' attention-only biases are.
    Not modelled (no shapes): attn_temperature_tuning's per-position scale of the NoPE layers'
    queries (one multiply), the router's sigmoid on the input rather than the output."""
    layers = f.integer(*_LAYERS)
    step = f.integer("interleave_moe_layer_step", default=1)
    moe = _layer_list(f, "moe_layers", layers, None)
    moe = list(range(step - 1, layers, step)) if moe is None else moe
    rope = _layer_list(f, "no_rope_layers", layers, (0, 1))
    rope = [int((i + 1) % f.integer("no_rope_layer_interval", default=4) != 0) for i in range(layers)] if rope is None else rope
    chunk = f.doc.get("attention_chunk_size", 8192)
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk <= 0):
        raise ConfigError(f"{f.path}: field 'attention_chunk_size' must be a positive integer (tokens) or null, "
                          f"got {chunk!r}")  # fmt: skip
    types = f.doc.get("layer_types")
    if types is None:
        types = ["chunked_attention" if r and chunk else "full_attention" for r in rope]
    if not isinstance(types, list) or len(types) != layers or any(t not in _LLAMA4_TYPES for t in types):
        raise ConfigError(f"{f.path}: field 'layer_types' must list one of {', '.join(sorted(_LLAMA4_TYPES))} for "
                          f"each of the {layers} layers, got {types!r}")  # fmt: skip
    chunked = types.count("chunked_attention")
    if chunked and not chunk:
        raise ConfigError(f"{f.path}: field 'layer_types' has chunked_attention layers and 'attention_chunk_size' is "
                          "null (no chunk to attend in)")  # fmt: skip
    experts = f.integer("num_local_experts", default=16)
    width = f.integer(*_FFN)
    return {
        **_llama_like(f, kv_default=8),
        "head_dim": f.integer("head_dim", default=128),
        "bias": _all_biases(f, "attention_bias", None),
        "qk_norm": "l2" if f.flag("use_qk_norm", True) and rope.count(1) else "none",
        "nope_layers": rope.count(0),
        "num_experts": experts,
        "top_k": f.integer("num_experts_per_tok", default=1),
        "moe_ffn_hidden": width,
        "shared_ffn_hidden": width,
        "ffn_hidden": f.integer("intermediate_size_mlp", default=16384),
        "dense_layers": tuple(i for i in range(layers) if i not in moe),
        "attention_chunk": chunk if chunked else 0,
        "chunked_layers": chunked if chunked < layers else 0,
    }


_LLAMA4_TYPES = frozenset({"full_attention", "chunked_attention"})


def _llama4(doc: dict[str, Any], path: Path) -> ModelSpec:
    """llama4 (the multimodal checkpoint, Llama4ForConditionalGeneration): its language model,
    the ``text_config`` read as llama4_text; the vision tower is not modelled."""
    text = doc.get("text_config") or {}
    if not isinstance(text, dict):
        raise ConfigError(f"{path}: field 'text_config' must be an object (the language model's config), got {text!r}")
    inner = {"tie_word_embeddings": doc.get("tie_word_embeddings", False), **text, "model_type": "llama4_text",
             "_name_or_path": doc.get("_name_or_path")}  # fmt: skip
    try:
        model = hf_config_from_dict(inner, path)
    except ConfigError as e:
        raise ConfigError(f"{e} (in 'text_config')") from None
    if isinstance(doc.get("vision_config"), dict):
        model = replace(model, left_out="its vision tower (vision_config: the image encoder and its projector) and "
                                        "image tokens: the language model alone is predicted")  # fmt: skip
    return model


# --- more 2025 families (hf41): OLMo 3, Seed-OSS, EXAONE 4, ERNIE 4.5, dots.llm1, Ministral 3 ---


def _olmo3(f: _Fields) -> dict[str, Any]:
    """olmo3: OLMo 2's layer (norms after attention and after the MLP, RMSNorms over the whole q
    and k projections), biases on q/k/v/o per attention_bias (refused alone, as the h6
    families'), and a sliding window (Olmo3Config's 4096 unless given; null: none) on the
    ``layer_types`` sliding layers, by default three of every four (Olmo3Config's). Its per-layer
    RoPE parameters (YaRN on the full layers) change no shape."""
    kw = {**_olmo2(f), "bias": _all_biases(f, "attention_bias", None)}
    if "sliding_window" not in f.doc:
        kw["sliding_window"] = 4096
    if f.doc.get("sliding_window", 4096) is None:
        return {**kw, "sliding_window": 0, "sliding_layers": 0}
    return {**kw, "sliding_layers": _window_layers(f, lambda i: (i + 1) % 4 != 0)}


def _seed_oss(f: _Fields) -> dict[str, Any]:
    """seed_oss (Seed-OSS-36B): LLaMA's layer with SeedOssConfig's 8 KV heads and head_dim 128
    unless given, biases on q/k/v (attention_bias, true unless given; ``qkv_bias``); o_proj's
    (attention_out_bias) and the MLP's (mlp_bias) only together with them (``bias``), refused
    otherwise. residual_dropout is the plan's dropout (``--hidden-dropout``)."""
    qkv, out, mlp = f.flag("attention_bias", True), f.flag("attention_out_bias", False), f.flag("mlp_bias", False)
    if (out or mlp) and not (qkv and out and mlp):
        which = "attention_out_bias" if out else "mlp_bias"
        raise ConfigError(f"{f.path}: field {which!r} is true and the other linear layers' biases are not all on: "
                          "biases on some layers alone are not modelled here (ModelSpec.bias is every linear "
                          "layer's, qkv_bias q/k/v's)")  # fmt: skip
    return {**_llama_like(f, kv_default=8), "head_dim": f.integer("head_dim", default=128), "bias": qkv and out,
            "qkv_bias": qkv}  # fmt: skip


def _exaone4(f: _Fields) -> dict[str, Any]:
    """exaone4 (EXAONE 4.0): GQA (Exaone4Config: KV heads as the attention heads unless given),
    RMSNorms after attention and after the MLP (two a layer, OLMo 2's places) and over each
    query and key head (``qk_norm`` head), no biases, untied unless given. With a
    sliding_window (4096 unless given; null: none and every layer global) the layers
    ``layer_types`` (or sliding_window_pattern: an int p, every p-th global; a string such as
    "LLLG", repeated) marks sliding attend within it, and the global ones apply no rotary
    embedding (Exaone4Attention rotates only sliding layers then: ``nope_layers``)."""
    layers = f.integer(*_LAYERS)
    kw = {**_llama_like(f), "bias": False, "qk_norm": "head"}
    window = f.doc.get("sliding_window", 4096)
    if window is None:
        return {**kw, "sliding_window": 0, "sliding_layers": 0}
    pattern = f.doc.get("sliding_window_pattern", 4)
    if isinstance(pattern, str) and pattern and set(pattern) <= {"L", "G"}:
        sliding = lambda i: pattern[i % len(pattern)] == "L"  # noqa: E731
    elif isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
        sliding = lambda i: (i + 1) % pattern != 0  # noqa: E731
    else:
        raise ConfigError(f"{f.path}: field 'sliding_window_pattern' must be a positive integer or a string of L "
                          f"(local) and G (global), got {pattern!r}")  # fmt: skip
    windowed = _window_layers(f, sliding)
    return {**kw, "sliding_window": window, "sliding_layers": windowed, "nope_layers": layers - windowed}


def _ernie4_5(f: _Fields) -> dict[str, Any]:
    """ernie4_5 (ERNIE-4.5-0.3B): LLaMA's layer with Ernie4_5Config's 2 KV heads and head_dim
    128 unless given, biases on every linear layer with use_bias (false unless given), tied
    unless given. Its interleaved rotary changes no shape."""
    return {**_llama_like(f, kv_default=2), "head_dim": f.integer("head_dim", default=128),
            "bias": f.flag("use_bias", False), "tied_embeddings": f.flag("tie_word_embeddings", True)}  # fmt: skip


def _dots1(f: _Fields) -> dict[str, Any]:
    """dots1 (dots.llm1): DeepSeek-V3's MoE without MLA: GQA (Dots1Config: KV heads as the
    attention heads unless given) with an RMSNorm over each query and key head, biases on
    q/k/v/o per attention_bias (refused alone), n_routed_experts of moe_intermediate_size (top
    num_experts_per_tok; its router's weight alone, e_score_correction_bias a buffer),
    n_shared_experts of the same width, the first first_k_dense_replace layers (0 unless given)
    dense of intermediate_size; a sliding window on the layers from max_window_layers (62 unless
    given) on where sliding_window is set (Dots1Config's layer_types). Ignored, as for DeepSeek:
    group-limited routing and routed_scaling_factor."""
    layers = f.integer(*_LAYERS)
    first_dense = _count(f, "first_k_dense_replace", 0)
    if first_dense > layers:
        raise ConfigError(f"{f.path}: field 'first_k_dense_replace' is {first_dense}, more than the {layers} layers")
    moe = f.integer("moe_intermediate_size", default=1408)
    kw = {
        **_llama_like(f),
        "bias": _all_biases(f, "attention_bias", None),
        "qk_norm": "head",
        "num_experts": f.integer("n_routed_experts"),
        "top_k": f.integer("num_experts_per_tok"),
        "moe_ffn_hidden": moe,
        "shared_ffn_hidden": _count(f, "n_shared_experts", 0) * moe,
        "dense_layers": tuple(range(first_dense)),
    }
    if f.doc.get("sliding_window", 4096) is None:
        return {**kw, "sliding_window": 0, "sliding_layers": 0}
    first = _count(f, "max_window_layers", 62)
    if "sliding_window" not in f.doc:
        kw["sliding_window"] = 4096
    return {**kw, "sliding_layers": _window_layers(f, lambda i: i >= first)}


def _ministral3(f: _Fields) -> dict[str, Any]:
    """ministral3 (Ministral 3): Mistral's layer with Ministral3Config's 8 KV heads and head_dim
    128 unless given, a sliding window on every layer only where sliding_window is set (null by
    default), untied unless given; its YaRN and llama_4_scaling_beta query scaling change no
    shape (the pre-training context: rope_parameters' original_max_position_embeddings)."""
    kw = {**_llama_like(f, kv_default=8), "head_dim": f.integer("head_dim", default=128)}
    return kw if f.doc.get("sliding_window") else {**kw, "sliding_window": 0}


_READERS: dict[str, Callable[[_Fields], dict[str, Any]]] = {
    "gpt2": _gpt2,
    "gpt_bigcode": _gpt2,
    "gpt_neox": _gpt_neox,
    "llama": _llama_like,
    "mistral": _mistral,
    "qwen2": _qwen2,
    "mixtral": _mixtral_cfg,
    "qwen3": _qwen3,
    "phi3": _phi3,
    "olmo2": _olmo2,
    "gemma2": _gemma2,
    "gemma3_text": _gemma3_text,
    "gemma3": _gemma3_text,  # its text_config, read by _gemma3
    "falcon": _falcon,
    "starcoder2": _starcoder2,
    "qwen3_moe": _qwen3_moe,
    "qwen2_moe": _qwen2_moe,
    "gpt_oss": _gpt_oss,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "gemma": _gemma1,
    "granite": _granite,
    "olmoe": _olmoe,
    "cohere": _cohere,
    "glm": lambda f: _glm(f, norms=2),
    "glm4": lambda f: _glm(f, norms=4),
    "phi": _phi,
    "smollm3": _smollm3,
    "glm4_moe": _glm4_moe,
    "llama4_text": _llama4_text,
    "llama4": _llama4_text,  # its text_config, read by _llama4
    "olmo3": _olmo3,
    "seed_oss": _seed_oss,
    "exaone4": _exaone4,
    "ernie4_5": _ernie4_5,
    "dots1": _dots1,
    "ministral3": _ministral3,
}
# Falcon's configs before transformers took the family in (its remote code: the Hub's
# tiiuae/falcon-7b and -40b snapshots up to mid-2023, and models fine-tuned from them): n_head,
# n_layer, n_head_kv; RefinedWeb is Falcon-40B's layer (new_decoder_architecture), RefinedWebModel
# Falcon-7B's, as transformers' conversion of them sets it
_REFINED_WEB = {"RefinedWeb": True, "RefinedWebModel": False}
# intermediate_size required
_GATED_TYPES = frozenset({"llama", "mistral", "qwen2", "mixtral", "qwen3", "phi3", "olmo2", "gemma2", "gemma3_text",
                          "starcoder2",
                          "qwen3_moe", "qwen2_moe", "gpt_oss", "deepseek_v2", "deepseek_v3",
                          "gemma", "granite", "olmoe", "cohere", "glm", "glm4", "phi", "smollm3",
                          "glm4_moe", "llama4_text", "olmo3", "seed_oss", "exaone4", "ernie4_5", "dots1",
                          "ministral3"})  # fmt: skip


def read_hf_config(path: str | Path) -> ModelSpec:
    """The ModelSpec of a HuggingFace ``config.json`` (plain JSON; no network, no transformers).

    Raises ConfigError naming the file and field for unreadable JSON, an unsupported
    ``model_type``, or a missing or wrongly typed field.
    """
    path = Path(path)
    text = _read_text(path, "model config")
    if not text.strip():
        raise ConfigError(f"{path}: file is empty; expected a HuggingFace config.json (a JSON object with "
                          "model_type, hidden_size, num_hidden_layers, ...)")  # fmt: skip
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a JSON object at the top level")
    return hf_config_from_dict(doc, path)


def hf_config_from_dict(doc: dict[str, Any], path: Path) -> ModelSpec:
    """The ModelSpec of a parsed HuggingFace config (``path`` names it in errors)."""
    mtype = doc.get("model_type")
    reader = _READERS.get(mtype) if isinstance(mtype, str) else None
    reader = _READERS["falcon"] if mtype in _REFINED_WEB else reader
    if mtype == "gemma3_text":
        doc = {**_GEMMA3_TEXT_DEFAULTS, **doc}
    if mtype is None:
        raise ConfigError(f"{path}: missing field 'model_type' (supported: {', '.join(sorted(_READERS))})")
    if reader is None:
        raise ConfigError(
            f"{path}: field 'model_type' is {mtype!r}; supported: {', '.join(sorted(_READERS))}"
        )
    if mtype == "gemma3":
        return _gemma3(doc, path)
    if mtype == "llama4":
        return _llama4(doc, path)
    if mtype in _REFINED_WEB:
        mtype = "falcon"
        doc = {**doc, "model_type": mtype, "new_decoder_architecture": _REFINED_WEB[doc["model_type"]]}
    f = _Fields(doc, path)
    hidden, heads = f.integer(*_HIDDEN), f.integer(*_HEADS)
    ffn = f.integer(*_FFN) if mtype in _GATED_TYPES else f.integer(*_FFN, default=0)
    kw = reader(f)
    ffn = kw.pop("ffn_hidden", ffn)  # Llama 4: its dense layers' width is another field
    if kw.get("sliding_layers", 1) == 0:  # the reader counted the windowed layers: none (0 would read "all")
        kw["sliding_window"] = 0
    # Canonical form: defaults as 0, so a config equals the catalog entry it describes.
    if kw.get("kv_heads") == heads:
        kw["kv_heads"] = 0
    if kw.get("head_dim") and hidden % heads == 0 and kw["head_dim"] == hidden // heads:
        kw["head_dim"] = 0
    window = doc.get("sliding_window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 0):
        raise ConfigError(f"{path}: field 'sliding_window' must be a positive integer (tokens) or null, got {window!r}")
    if (isinstance(window, int) and not isinstance(window, bool) and window > 0 and "sliding_window" not in kw
            and doc.get("use_sliding_window", True) is not False):  # fmt: skip
        kw["sliding_window"] = window  # Qwen2 configs carry a window with use_sliding_window false
    seq = f.integer(*_SEQ, default=_SEQ_DEFAULTS.get(mtype))
    pre, pre_field = _pretraining_context(doc, path)
    if pre and pre < seq:  # a RoPE-scaled config: trained at its original context, extended after
        kw["seq_len"], kw["seq_source"] = pre, f"{pre_field}; max_position_embeddings {seq:,}"
    else:
        kw["seq_len"] = seq
    name = doc.get("_name_or_path")
    if not isinstance(name, str) or not name:
        full = path.resolve()  # `../config.json` and `./config.json` are named by their folder too
        name = full.parent.name if full.name == "config.json" and full.parent.name else full.stem
    try:
        return ModelSpec(
            name=name, hidden=hidden, layers=f.integer(*_LAYERS), heads=heads,
            vocab=f.integer("vocab_size"), ffn_hidden=0 if ffn == 4 * hidden else ffn, source=str(path), **kw,
        )  # fmt: skip
    except ConfigError as e:
        msg = str(e)  # field errors name the file already; ModelSpec's own checks do not
        if msg.startswith(f"{path}:"):
            raise
        raise ConfigError(f"{path}: {msg}{_config_fields(doc, msg)}") from None


# ModelSpec field -> the config.json fields it is read from (first present wins), to name them in
# ModelSpec's own checks ("heads 64 is not a multiple of kv_heads 7" reads "num_key_value_heads")
_SPEC_FROM: dict[str, tuple[str, ...]] = {
    "hidden": _HIDDEN, "heads": _HEADS, "layers": _LAYERS, "vocab": ("vocab_size",),
    "kv_heads": ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query"),
    "top_k": ("num_experts_per_tok",), "num_experts": ("num_experts", "num_local_experts", "n_routed_experts"),
    "head_dim": ("head_dim", "qk_nope_head_dim"), "qk_rope_head_dim": ("qk_rope_head_dim",),
    "dense_layers": ("mlp_only_layers", "decoder_sparse_step", "first_k_dense_replace", "moe_layer_freq"),
}  # fmt: skip


def _config_fields(doc: dict[str, Any], msg: str) -> str:
    """`` (config.json fields: name value, ...)`` for the ModelSpec fields ``msg`` names."""
    named = [f for f in _SPEC_FROM if re.search(rf"\b{f}\b", msg)]
    found = [(k, doc[k]) for f in named for k in _SPEC_FROM[f] if doc.get(k) is not None]
    return f" (config.json fields: {', '.join(f'{k} {v!r}' for k, v in dict(found).items())})" if found else ""
