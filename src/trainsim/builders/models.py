"""Which transformer: the packaged model catalog and HuggingFace ``config.json`` files.

:func:`get_model` resolves a catalog name or alias (case, spaces, dashes and underscores do not
matter: "Llama-2-7b" == "llama2-7b"), a HuggingFace repository id listed as an alias
("meta-llama/Llama-2-7b-hf"), or a path to a ``config.json`` (or a directory holding one) read by
:func:`read_hf_config`. Nothing is built at import time; the catalog is built once on first use.

Catalog numbers come from the publications: GPT-2 (HF configs), GPT-3 (Brown et al. 2020,
Table 2.1, ``d_ff = 4 d_model``), Megatron GPT (Narayanan et al. 2021, Table 1: vocabulary 51,200,
sequence 2048), GPT-NeoX-20B (Black et al. 2022; HF config), LLaMA-1/2/3 (Touvron et al. 2023a/b,
Llama 3 herd paper, HF configs), Mistral 7B / Mixtral (Jiang et al. 2023/2024, Table 1), Llemma 7B
(Azerbayev et al. 2023; Code Llama 7B dimensions). ``seq_len`` is the training context.
Two GPT-3 rows of Table 2.1 are inconsistent and are read as their parameter counts require:
GPT-3 XL has 16 heads of 128 (the table says 24 heads × 128 = 3072 ≠ d_model 2048) and GPT-3 13B
has d_model 5120 (the table says 5140, which 40 heads of 128 do not fill).

HuggingFace configs: ``gpt2``, ``gpt_bigcode`` (StarCoder; multi-query → one KV head),
``gpt_neox``, ``llama``, ``mistral``, ``qwen2``, ``mixtral``. A ModelSpec has a ``bias`` flag,
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
            moe_ffn_hidden=f if e else 0, aliases=a,
        )
        for n, d, nl, h, kv, f, v, s, e, a in _LLAMA
    ]  # fmt: skip
    return (*gpt, neox, *llama)


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
    try:
        return ModelSpec(**doc, source=str(path))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


# --- HuggingFace config.json ---------------------------------------------------------------

# Field names HF model types use for the same quantity, first match wins.
_HIDDEN = ("hidden_size", "n_embd", "d_model")
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers")
_HEADS = ("num_attention_heads", "n_head")
_FFN = ("intermediate_size", "n_inner", "ffn_dim")
_SEQ = ("max_position_embeddings", "n_positions", "n_ctx", "seq_length")


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
    """qwen2: as llama, and the q/k/v projections always carry biases (o_proj and the MLP do not)."""
    return {**_llama_like(f, kv_default=32), "qkv_bias": True}


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


_READERS: dict[str, Callable[[_Fields], dict[str, Any]]] = {
    "gpt2": _gpt2,
    "gpt_bigcode": _gpt2,
    "gpt_neox": _gpt_neox,
    "llama": _llama_like,
    "mistral": _mistral,
    "qwen2": _qwen2,
    "mixtral": _mixtral_cfg,
}
_GATED_TYPES = frozenset({"llama", "mistral", "qwen2", "mixtral"})  # intermediate_size required


def read_hf_config(path: str | Path) -> ModelSpec:
    """The ModelSpec of a HuggingFace ``config.json`` (plain JSON; no network, no transformers).

    Raises ConfigError naming the file and field for unreadable JSON, an unsupported
    ``model_type``, or a missing or wrongly typed field.
    """
    path = Path(path)
    text = _read_text(path, "model config")
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
    if mtype is None:
        raise ConfigError(f"{path}: missing field 'model_type' (supported: {', '.join(sorted(_READERS))})")
    if reader is None:
        raise ConfigError(
            f"{path}: field 'model_type' is {mtype!r}; supported: {', '.join(sorted(_READERS))}"
        )
    f = _Fields(doc, path)
    hidden, heads = f.integer(*_HIDDEN), f.integer(*_HEADS)
    ffn = f.integer(*_FFN) if mtype in _GATED_TYPES else f.integer(*_FFN, default=0)
    kw = reader(f)
    # Canonical form: defaults as 0, so a config equals the catalog entry it describes.
    if kw.get("kv_heads") == heads:
        kw["kv_heads"] = 0
    if kw.get("head_dim") and hidden % heads == 0 and kw["head_dim"] == hidden // heads:
        kw["head_dim"] = 0
    window = doc.get("sliding_window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 0):
        raise ConfigError(f"{path}: field 'sliding_window' must be a positive integer (tokens) or null, got {window!r}")
    if isinstance(window, int) and not isinstance(window, bool) and window > 0 and doc.get("use_sliding_window", True) is not False:
        kw["sliding_window"] = window  # Qwen2 configs carry a window with use_sliding_window false
    name = doc.get("_name_or_path")
    if not isinstance(name, str) or not name:
        full = path.resolve()  # `../config.json` and `./config.json` are named by their folder too
        name = full.parent.name if full.name == "config.json" and full.parent.name else full.stem
    try:
        return ModelSpec(
            name=name, hidden=hidden, layers=f.integer(*_LAYERS), heads=heads,
            vocab=f.integer("vocab_size"), ffn_hidden=0 if ffn == 4 * hidden else ffn,
            seq_len=f.integer(*_SEQ), source=str(path), **kw,
        )  # fmt: skip
    except ConfigError as e:
        msg = str(e)  # field errors name the file already; ModelSpec's own checks do not
        raise ConfigError(msg if msg.startswith(f"{path}:") else f"{path}: {msg}") from None
