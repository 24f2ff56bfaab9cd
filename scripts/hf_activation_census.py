"""Measure the activation bytes HuggingFace eager training keeps for the backward: the census
behind ``memory.py``'s activations for ``--impl hf``
(``src/trainsim/builders/data/hf_activation_census.json``).

A tiny model of each family ``scripts/hf_eager_census.py`` counts (transformers' LLaMA, dense
Qwen3, GPT-2, Mixtral and Qwen3-MoE, their experts run by ``grouped_mm`` or the eager loop, Gemma 2
and Gemma 3) is
built on the CPU in bf16 from a config made in code, with the census's SDPA attention and even
MoE routing. Its forward and loss run under ``torch.autograd.graph.saved_tensors_hooks``: every
tensor autograd saves is recorded once per storage (``untyped_storage().data_ptr()``), the
model's parameters and buffers left out, at the storage's size (a saved view holds its whole
storage). A two-layer model less a one-layer one gives one layer; the one-layer model less that
layer, the rest (embedding, final norm, head, loss). Each storage's element count is named as a
product of the model's symbols (``T`` tokens, ``d``, ``q``/``kv`` query/key widths, ``f``, ``V``,
``h``/``g`` attention/key heads, MoE ``T*k`` pairs ...; the tiny dimensions make every product
distinct), with its dtype: that list is the formula. It is then checked against fresh
measurements at other widths, sequence lengths and batch sizes: the formula's bytes must equal
the measured bytes exactly.

The hooks' count is cross-checked by a second measure that needs no hooks: every storage the
forward's aten calls create (a ``TorchDispatchMode``), kept by weak reference, and those still
alive once the forward's outputs but the loss are dropped. The two must agree without
checkpointing. With ``model.gradient_checkpointing_enable()`` (transformers 5: non-reentrant
``torch.utils.checkpoint`` around every decoder layer, trainsim's ``recompute="full"``) the
checkpoint's own hooks take the layer's saved tensors (an inner ``saved_tensors_hooks`` wins),
and what it keeps (the layer's inputs, in the recompute closure) is not a saved tensor: the
live-storage measure is the one recorded there.

What is not measured: CUDA. On the CPU, SDPA runs ``_scaled_dot_product_flash_attention_for_cpu``
(saves q, k, v, the output and the fp32 log-sum-exp, ``B x h x L``); see the JSON's ``backends``
for what CUDA's flash and memory-efficient kernels save instead.

Gemma 2 and Gemma 3 (``gemma2``, ``gemma3``: ``Gemma2ForCausalLM``, ``Gemma3ForCausalLM`` built as
``scripts/hf_eager_census.py`` builds them, SDPA registered under another attention name since
Gemma 2's modules refuse "sdpa"; tied embeddings, the real models'): ``layer`` is a full-attention
layer; a sliding-window layer (window 8, shorter than every sequence measured) keeps other
storages, recorded as part ``window`` (its ``layer`` entries signed: SDPA with a mask gets K and
V repeated to the query heads and keeps the additive ``[B, 1, L, L]`` mask; its ``rest`` what a
model with both kinds of layer keeps beyond the rest); Gemma 2's final-logit cap is part
``logit_softcap``. They are checked with the others on models of alternating sliding and full
layers (with Gemma 2's cap).

Mistral, Cohere, Phi, GLM, GLM-4, SmolLM3 and OLMoE (``MORE``, ``olmoe``/``olmoe_grouped``, since
2026-12-04; Phi-3, ``phi3``, since 2026-12-04, checked at a whole-head rotary too): as
``scripts/hf_eager_census.py`` builds them; Mistral's, Phi-3's and SmolLM3's ``window``
from models whose every layer slides (its ``rest`` the boolean mask, built once for the layers),
SmolLM3's ``rope`` (its ``layer`` a NoPE one), checked with the others on models of every
layer sliding and (SmolLM3) of alternating rotating and NoPE layers, the NoPE ones sliding or not.

    python scripts/hf_activation_census.py       # rewrites the JSON (needs torch, transformers)
    python scripts/hf_activation_census.py --families gemma2 gemma3   # those only, the others kept
"""

from __future__ import annotations

import datetime
import gc
import json
import sys
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "src" / "trainsim" / "builders" / "data" / "hf_activation_census.json"
FAMILIES = ("llama", "qwen3", "gpt2", "mixtral", "mixtral_grouped", "qwen3_moe", "qwen3_moe_grouped", "gemma2", "gemma3",
            "gemma", "granite", "mistral", "cohere", "phi", "glm", "glm4", "smollm3", "phi3", "olmoe", "olmoe_grouped")
# the families added 2026-12-04, built as scripts/hf_eager_census.py builds them (untied, their config
# classes' defaults but for the sizes): Mistral and SmolLM3 with a window part (WINDOWED: every layer
# sliding against none, the window GEMMA_WINDOW shorter than every sequence measured), SmolLM3's layer a
# NoPE one and part rope (a rotating layer's storages beyond it), Phi and GLM with partial rotary (Dims.r
# of each head's hd dims rotate), OLMoE as Mixtral (its q norm an RMSNorm of hidden_size: q = d)
# Phi-3 (since 2026-12-04; Mistral's before): its fused qkv_proj and gate_up_proj (autograd keeps the
# latter's T*2f output whole: the gate and up halves are views of it; no T*qkv storage is kept, a size
# that would stop the script), partial rotary (GLM's sizes), a window part as Mistral's; also checked at
# a whole-head rotary (partial_rotary_factor 1.0, Phi-3-mini's: Dims.r = hd)
MORE = ("mistral", "cohere", "phi", "glm", "glm4", "smollm3", "phi3")
WINDOWED = ("mistral", "smollm3", "phi3")
PARTIAL = ("phi", "glm", "glm4", "phi3")
Q_IS_D = ("phi", "olmoe", "olmoe_grouped")  # head size d / h by construction: T*q is T*d
# Gemma 1 and Granite (GemmaForCausalLM, GraniteForCausalLM, as scripts/hf_eager_census.py builds
# them: untied as LLaMA's, Granite with its multipliers)
DENSE_HF = ("gemma", "granite")
MOE = ("mixtral", "mixtral_grouped", "qwen3_moe", "qwen3_moe_grouped", "olmoe", "olmoe_grouped")
# Gemma 2 / Gemma 3 (Gemma2ForCausalLM, Gemma3ForCausalLM, as scripts/hf_eager_census.py builds
# them): tied embeddings (the real models'; untied ones keep the same bytes, compared once at the base
# dimensions with both kinds of layer, with and without checkpointing), SDPA under another name (Gemma 2's modules refuse
# "sdpa", which cannot soft-cap the scores: the score cap is left off, as SDPA runs it), a window
# shorter than every sequence measured (so that a sliding layer's mask is built)
GEMMA = ("gemma2", "gemma3")
GEMMA_WINDOW, GEMMA2_LOGIT_CAP = 8, 30.0


@dataclass(frozen=True)
class Dims:
    """A tiny model's dimensions: batch, sequence, hidden, heads, key heads, head size, MLP (or
    expert) width, vocabulary, experts, top-k."""

    b: int = 3
    s: int = 20
    d: int = 48
    h: int = 12
    g: int = 3
    hd: int = 10
    f: int = 112
    v: int = 331
    e: int = 0
    k: int = 0
    r: int = 0  # rotated dims of a head (partial rotary: Phi, GLM); 0: all hd

    @property
    def t(self) -> int:
        return self.b * self.s


# the formula's dimensions (the census's, whose products are distinct); the checks' others
BASE = {"llama": Dims(), "qwen3": Dims(), "gpt2": Dims(hd=4),
        "mixtral": Dims(g=4, e=5, k=3), "mixtral_grouped": Dims(g=4, e=15, k=8),
        "qwen3_moe": Dims(h=21, hd=4, g=7, e=5, k=3), "qwen3_moe_grouped": Dims(h=21, hd=4, e=15, k=8),
        "gemma2": Dims(), "gemma3": Dims(), "gemma": Dims(), "granite": Dims(),
        "mistral": Dims(), "cohere": Dims(), "smollm3": Dims(), "phi": Dims(d=126, h=18, hd=7, r=4),
        "glm": Dims(h=9, hd=22, r=12), "glm4": Dims(h=9, hd=22, r=12), "phi3": Dims(h=9, hd=22, r=12),
        "olmoe": Dims(hd=4, g=4, e=5, k=3), "olmoe_grouped": Dims(hd=4, g=4, e=15, k=8)}  # fmt: skip
LABELS_B1 = 8  # bytes: see family_census
CHECKS = ({"b": 2, "s": 36}, {"b": 5, "s": 12, "d": 72, "f": 152}, {"b": 1, "s": 56, "v": 419, "hd": 14})
# a family whose head size is d / h changes d with it; Phi's rotated dims stay 4 (even, below hd)
FAMILY_CHECKS = {
    "phi": ({"b": 2, "s": 36}, {"b": 5, "s": 12, "d": 144, "hd": 8, "f": 152}, {"b": 1, "s": 56, "v": 419, "d": 90, "hd": 5}),
    "olmoe": ({"b": 2, "s": 36}, {"b": 5, "s": 12, "d": 72, "hd": 6, "f": 152}, {"b": 1, "s": 56, "v": 419}),
    "olmoe_grouped": ({"b": 2, "s": 36}, {"b": 5, "s": 12, "d": 72, "hd": 6, "f": 152}, {"b": 1, "s": 56, "v": 419}),
    # Phi-3's also at a whole-head rotary (r = hd: partial_rotary_factor 1.0, Phi-3-mini's)
    "phi3": (*CHECKS, {"r": 22}, {"b": 2, "s": 36, "hd": 14, "r": 14}),
}  # fmt: skip


def values(x: Dims, family: str) -> dict[str, int]:
    """Each symbol's element count at ``x`` (the names memory.py evaluates); GPT-2's queries
    and keys are ``d`` wide (no ``q``, ``kv``, ``g``); the eager expert loop's per-expert sizes
    (``Te = T k / E`` tokens under even routing) are :data:`PER_EXPERT`'s."""
    t, d, q, kv, f = x.t, x.d, x.h * x.hd, x.g * x.hd, x.f
    out = {"1": 1, "L": x.s, "T": t, "T*d": t * d, "T*V": t * x.v, "T*h": t * x.h}
    if family == "gpt2":  # its MLP is 4 d wide, its fused QKV 3 d
        out |= {"T*3d": t * 3 * d, "T*4d": t * 4 * d}
    else:
        out |= {"L*hd": x.s * x.hd, "T*q": t * q, "T*kv": t * kv, "T*g": t * x.g, "T*f": t * f, "T*2f": t * 2 * f}
    if family in Q_IS_D:
        del out["T*q"]
    if family in PARTIAL:  # the rotated and passed widths, the rotated cos/sin table
        r = x.r or x.hd
        out |= {"T*qr": t * x.h * r, "T*kvr": t * x.g * r, "T*qp": t * x.h * (x.hd - r), "T*kvp": t * x.g * (x.hd - r),
                "L*hdr": x.s * r}  # fmt: skip
    if family in WINDOWED:  # the additive [B, 1, L, L] mask, the boolean [1, 1, L, L] one
        out |= {"T*L": t * x.s, "L*L": x.s * x.s}
    if family in ("gemma", "cohere"):  # its (1 + weight) norm's fp32 factor; CohereLayerNorm's fp32 weight
        out |= {"d": d}
    if family in GEMMA:  # a windowed layer's additive [B, 1, L, L] mask, the boolean [1, 1, L, L] one; a
        out |= {"T*L": t * x.s, "L*L": x.s * x.s, "d": d, "hd": x.hd}  # (1 + weight) norm's fp32 factor
    if family in MOE:
        out |= {"E": x.e, "T*k": t * x.k, "T*E": t * x.e, "T*k*d": t * x.k * d, "T*k*f": t * x.k * f,
                "T*k*2f": t * x.k * 2 * f}  # fmt: skip
    if family in ("mixtral", "qwen3_moe", "olmoe"):
        te = t * x.k // x.e
        out |= {"Te": te, "2Te": 2 * te, "Te*d": te * d, "Te*f": te * f, "Te*2f": te * 2 * f}
    return out


# the eager loop's per-expert sizes: (the pairs' size they sum to over the E experts, multiple)
PER_EXPERT = {"Te": ("T*k", 1), "2Te": ("T*k", 2), "Te*d": ("T*k*d", 1), "Te*f": ("T*k*f", 1), "Te*2f": ("T*k*2f", 1)}
# dtypes the CPU and CUDA kernels keep differently (the JSON's names): a dropout's mask (the
# CPU's dropout multiplies by its noise, a tensor of the activations' dtype; CUDA's
# native_dropout keeps a bool mask) and a LayerNorm's mean and rstd (the activations' dtype on
# the CPU, fp32 on CUDA: torch/_refs native_layer_norm)
CPU_TAGGED = {"mask": "bool", "stat": "float32"}


def build(family: str, layers: int, x: Dims, *, checkpoint: bool, variant: str = "") -> tuple[Any, Any, Any]:
    """(model, input ids, restore: undoes the even-routing patch) of a tiny bf16 model; a Gemma
    ``variant``, words joined by "+": none, every layer full attention and (Gemma 2) no
    final-logit cap (the formula's ``layer`` and ``rest``); "window", every layer a sliding one;
    "mixed", the layers alternating sliding and full (sliding first: Gemma 2's pattern, and
    both of Gemma 3's rotary tables in use); "cap", Gemma 2's final-logit cap (30, its config's)."""
    import torch

    torch.manual_seed(0)
    common: dict[str, Any] = {
        "hidden_size": x.d, "num_attention_heads": x.h, "num_key_value_heads": x.g, "head_dim": x.hd,
        "intermediate_size": x.f, "num_hidden_layers": layers, "vocab_size": x.v, "max_position_embeddings": x.s,
        "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0,
        "attn_implementation": "sdpa"}  # fmt: skip
    restore = lambda: None  # noqa: E731
    if family == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        model = LlamaForCausalLM(LlamaConfig(**common))
    elif family == "qwen3":
        from transformers import Qwen3Config, Qwen3ForCausalLM

        model = Qwen3ForCausalLM(Qwen3Config(**common))
    elif family in DENSE_HF:
        import importlib

        census = importlib.import_module("hf_eager_census")  # its multipliers (this script's folder is on the path)
        if family == "gemma":
            from transformers import GemmaConfig, GemmaForCausalLM

            model = GemmaForCausalLM(GemmaConfig(**common))
        else:
            from transformers import GraniteConfig, GraniteForCausalLM

            model = GraniteForCausalLM(GraniteConfig(**common, **census.GRANITE_MULTIPLIERS))
    elif family in MORE:
        import transformers

        words = set(variant.split("+")) - {""}
        allowed = {"mistral": {"window"}, "phi3": {"window"}, "smollm3": {"window", "rope", "mixed"}}.get(family, set())
        if words - allowed or {"rope", "mixed"} <= words:
            raise SystemExit(f"{family}: unknown variant {variant!r}")
        cfg = common | {"num_attention_heads": x.h, "num_key_value_heads": x.g}
        if family == "phi":  # PhiAttention's head size is d / h
            del cfg["head_dim"]
            if x.d != x.h * x.hd:
                raise SystemExit(f"phi: d {x.d} is not h {x.h} x hd {x.hd}")
        if family in PARTIAL:  # int(hd * factor) == r; r = hd: a whole-head rotary, factor 1
            cfg["partial_rotary_factor"] = 1.0 if x.r == x.hd else (x.r + 0.5) / x.hd
        window = GEMMA_WINDOW if "window" in words else None
        if family in ("mistral", "phi3"):
            cfg["sliding_window"] = window
        if family == "smollm3":  # NoPE layers but with "rope" (every layer) or "mixed" (every other, the first)
            rope = [int("rope" in words or ("mixed" in words and i % 2 == 0)) for i in range(layers)]
            cfg |= {"no_rope_layers": rope, "use_sliding_window": window is not None, "sliding_window": window,
                    "layer_types": ["sliding_attention" if window and not r else "full_attention" for r in rope]}  # fmt: skip
        cls = {"mistral": "Mistral", "cohere": "Cohere", "phi": "Phi", "glm": "Glm", "glm4": "Glm4",
               "smollm3": "SmolLM3", "phi3": "Phi3"}[family]  # fmt: skip
        model = getattr(transformers, f"{cls}ForCausalLM")(getattr(transformers, f"{cls}Config")(**cfg))
        attn = model.model.layers[0].self_attn
        if attn.head_dim != x.hd or (family in PARTIAL and model.model.rotary_emb.inv_freq.numel() * 2 != x.r):
            raise SystemExit(f"{family}: the model's head size or rotated dims are not {x}")
    elif family in GEMMA:
        from transformers import AttentionInterface
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register("census_attention", sdpa_attention_forward)
        AttentionMaskInterface.register("census_attention", sdpa_mask)  # SDPA's masks (the window's)
        kinds = ("sliding_attention", "full_attention")
        words = set(variant.split("+")) - {""}
        if words - {"window", "mixed", "cap"} or {"window", "mixed"} <= words or ("cap" in words and family != "gemma2"):
            raise SystemExit(f"{family}: unknown variant {variant!r}")
        types = ([kinds[i % 2] for i in range(layers)] if "mixed" in words
                 else [kinds["window" not in words]] * layers)  # fmt: skip
        gemma = common | {"tie_word_embeddings": True, "sliding_window": GEMMA_WINDOW, "layer_types": types,
                          "attn_implementation": "census_attention"}  # fmt: skip
        if family == "gemma2":
            from transformers import Gemma2Config, Gemma2ForCausalLM

            cap = GEMMA2_LOGIT_CAP if "cap" in words else None
            if Gemma2Config().final_logit_softcapping != GEMMA2_LOGIT_CAP:
                raise SystemExit("gemma2: transformers' default final-logit cap changed")
            model = Gemma2ForCausalLM(Gemma2Config(attn_logit_softcapping=None, final_logit_softcapping=cap, **gemma))
        else:
            from transformers import Gemma3ForCausalLM, Gemma3TextConfig

            model = Gemma3ForCausalLM(Gemma3TextConfig(**gemma))
            if model.config.final_logit_softcapping or model.config.attn_logit_softcapping:
                raise SystemExit("gemma3: transformers' defaults changed (no soft-caps)")
    elif family == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        # the census's: its default residual/embedding dropout 0.1, attention dropout 0 (on a GPU
        # inside the attention kernel; on the CPU SDPA with dropout takes the math path)
        model = GPT2LMHeadModel(GPT2Config(n_embd=x.d, n_head=x.h, n_layer=layers, vocab_size=x.v, n_positions=x.s,
                                           bos_token_id=0, eos_token_id=0, attn_pdrop=0.0,
                                           attn_implementation="sdpa"))  # fmt: skip
    else:
        impl = "grouped_mm" if family.endswith("_grouped") else "eager"
        moe = common | {"num_experts_per_tok": x.k, "experts_implementation": impl}
        if family.startswith("mixtral"):
            from transformers import MixtralConfig, MixtralForCausalLM
            from transformers.models.mixtral import modeling_mixtral

            model = MixtralForCausalLM(MixtralConfig(num_local_experts=x.e, **moe))
            router: Any = modeling_mixtral.MixtralTopKRouter
        elif family.startswith("olmoe"):  # head size d / h (its q norm is an RMSNorm of hidden_size)
            from transformers import OlmoeConfig, OlmoeForCausalLM
            from transformers.models.olmoe import modeling_olmoe

            if x.d != x.h * x.hd:
                raise SystemExit(f"olmoe: d {x.d} is not h {x.h} x hd {x.hd}")
            model = OlmoeForCausalLM(OlmoeConfig(num_experts=x.e, **{k: v for k, v in moe.items() if k != "head_dim"}))
            router = modeling_olmoe.OlmoeTopKRouter
        else:
            from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
            from transformers.models.qwen3_moe import modeling_qwen3_moe

            model = Qwen3MoeForCausalLM(Qwen3MoeConfig(num_experts=x.e, moe_intermediate_size=x.f, norm_topk_prob=True,
                                                       decoder_sparse_step=1, mlp_only_layers=[], **moe))  # fmt: skip
            router = modeling_qwen3_moe.Qwen3MoeTopKRouter
        if model.config._experts_implementation != impl:
            raise SystemExit(f"{family}: transformers chose experts_implementation {model.config._experts_implementation!r}")
        # even routing (the kernel census's): token i to experts (i k + j) mod E; scores its own
        route = (torch.arange(x.t)[:, None] * x.k + torch.arange(x.k)[None, :]) % x.e
        forward = router.forward

        def routed(self, hidden_states):  # type: ignore[no-untyped-def]
            logits, scores, _ = forward(self, hidden_states)
            return logits, scores, route

        router.forward = routed

        def restore() -> None:
            router.forward = forward

    model = model.to(torch.bfloat16).train()
    if checkpoint:
        model.gradient_checkpointing_enable()
    return model, torch.randint(0, x.v, (x.b, x.s)), restore


Storages = dict[int, tuple[int, str]]  # data_ptr -> (bytes, dtype: "mask"/"stat" as CPU_TAGGED)


def measure(family: str, layers: int, x: Dims, *, checkpoint: bool = False, variant: str = "") -> tuple[Storages, Storages]:
    """(saved by autograd, alive after the forward) storages of one forward and loss, the
    parameters' and buffers' left out; the second by weak references to every storage an aten
    call made (the loss's own left out)."""
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode

    model, ids, restore = build(family, layers, x, checkpoint=checkpoint, variant=variant)
    held = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    saved: Storages = {}
    # the batch is held by the step (and saved by the embedding's backward): counted as made
    made: dict[int, tuple[Any, int, str]] = {ids.untyped_storage().data_ptr(): (
        StorageWeakRef(ids.untyped_storage()), ids.untyped_storage().nbytes(), "int64")}

    tags: dict[int, str] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.nbytes() and st.data_ptr() not in held:
            saved.setdefault(st.data_ptr(), (st.nbytes(), str(t.dtype).removeprefix("torch.")))
        return t

    class Made(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            outs = [o for o in (out if isinstance(out, list | tuple) else [out]) if isinstance(o, torch.Tensor)]
            name = func.__name__.split(".")[0]
            for o in outs:
                st = o.untyped_storage()
                p = st.data_ptr()
                if st.nbytes() and (p not in made or made[p][0].expired()):  # new (in-place ops keep theirs)
                    tags.pop(p, None)  # a freed storage's address reused
                    made[p] = (StorageWeakRef(st), st.nbytes(), str(o.dtype).removeprefix("torch."))
            if name.startswith("bernoulli"):  # the CPU dropout's noise (CUDA: native_dropout's bool mask)
                tags[outs[0].untyped_storage().data_ptr()] = "mask"
            if name == "native_layer_norm":  # mean, rstd
                tags.update((o.untyped_storage().data_ptr(), "stat") for o in outs[1:])
            return out

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), Made():
            out = model(input_ids=ids, labels=ids)
        loss = out.loss
        del out
        gc.collect()
        own = loss.untyped_storage().data_ptr()
        alive = {p: (n, tags.get(p, dt)) for p, (ref, n, dt) in made.items()
                 if not ref.expired() and p not in held and p != own}  # fmt: skip
        saved = {p: (n, tags.get(p, dt)) for p, (n, dt) in saved.items()}
        loss.backward()  # the graph runs: what was saved was enough
    finally:
        restore()
    return saved, alive


def named(storages: Storages, x: Dims, family: str) -> Counter[tuple[str, str]]:
    """(symbol, dtype) -> storages of that size; a size with no symbol stops the script."""
    sym: dict[int, str] = {}
    for name, n in values(x, family).items():
        if n in sym:
            raise SystemExit(f"{family} at {x}: {name} and {sym[n]} are both {n} elements; pick other dimensions")
        sym[n] = name
    out: Counter[tuple[str, str]] = Counter()
    for nbytes, dtype in storages.values():
        n = nbytes // _itemsize(dtype)
        if n not in sym:
            raise SystemExit(f"{family} at {x}: a saved {dtype} storage of {n} elements has no symbol")
        out[(sym[n], dtype)] += 1
    return out


def _itemsize(dtype: str) -> int:
    """Bytes of an element on the CPU, where it was measured (a tagged dtype: the bf16 activations')."""
    return {"bfloat16": 2, "float32": 4, "int64": 8, "bool": 1, "int32": 4, "mask": 2, "stat": 2}[dtype]


def per_pair(counts: dict[tuple[str, str], int], x: Dims) -> dict[tuple[str, str], int]:
    """The eager loop's per-expert storages (E of each under even routing) as the ``T*k``
    pair sizes they sum to."""
    out: Counter[tuple[str, str]] = Counter()
    for (size, dtype), c in counts.items():
        if size in PER_EXPERT:
            pairs, times = PER_EXPERT[size]
            if (c * times) % x.e:
                raise SystemExit(f"{c} storages of {size} are not a whole number of pair-sized ones at E {x.e}")
            out[(pairs, dtype)] += c * times // x.e
        else:
            out[(size, dtype)] += c
    return dict(out)


def difference(two: Counter[tuple[str, str]], one: Counter[tuple[str, str]]) -> tuple[dict, dict]:
    """(one layer, the rest) from the two- and one-layer models' counts."""
    layer = Counter({k: two[k] - one[k] for k in two.keys() | one.keys() if two[k] - one[k]})
    rest = Counter({k: one[k] - layer[k] for k in one.keys() | layer.keys() if one[k] - layer[k]})
    if any(v < 0 for v in (*layer.values(), *rest.values())):
        raise SystemExit(f"the two-layer model is not the one-layer model plus a layer: {layer}, {rest}")
    return dict(layer), dict(rest)


def formula_bytes(entries: list[list[Any]], x: Dims, family: str) -> int:
    vals = values(x, family)
    return sum(count * vals[size] * _itemsize(dtype) for size, dtype, count in entries)


def total(storages: Storages) -> int:
    return sum(n for n, _ in storages.values())


def signed(more: Counter[tuple[str, str]], less: Counter[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """``more`` less ``less``, entry by entry, negative counts kept (a part that replaces storages)."""
    return {k: more[k] - less[k] for k in sorted(more.keys() | less.keys()) if more[k] - less[k]}


def as_entries(d: dict[tuple[str, str], int]) -> list[list[Any]]:
    return [[s, dt, c] for (s, dt), c in sorted(d.items())]


def counted_variant(family: str, n: int, variant: str, *, checkpoint: bool) -> Counter[tuple[str, str]]:
    """The storages alive after the forward of ``family``'s ``n``-layer ``variant`` at its base
    dims, named; outside checkpointing every saved tensor's storage must be among them."""
    base = BASE[family]
    saved, alive = measure(family, n, base, checkpoint=checkpoint, variant=variant)
    if not checkpoint and not saved.items() <= alive.items():
        raise SystemExit(f"{family} ({variant}): a saved tensor's storage is not alive after the forward")
    return named(alive, base, family)


def gemma_parts(family: str, ckpt: bool, layer: dict, rest: dict) -> dict[str, Any]:
    """A Gemma family's parts beyond its full-attention ``layer`` and ``rest``: ``window``, what a
    sliding-window layer keeps beyond a full one (``layer``; signed: SDPA with the window's mask
    gets K and V repeated to the query heads, ``T*q`` for ``T*kv``, and keeps the additive mask)
    and what a model with both kinds of layer keeps beyond the rest (``rest``: checkpointed, the
    boolean mask the layers' recompute closures hold; Gemma 3's second rotary table);
    ``logit_softcap`` (Gemma 2): its final-logit cap's, beyond the rest."""
    def counted(n: int, variant: str) -> Counter[tuple[str, str]]:
        return counted_variant(family, n, variant, checkpoint=ckpt)

    full = Counter(layer) + Counter(rest)  # the one-layer full-attention model
    window = {n: counted(n, "window") for n in (1, 2)}
    sliding = Counter(signed(window[2], window[1]))  # one sliding layer
    if any(v < 0 for v in sliding.values()):
        raise SystemExit(f"{family}: the two-layer sliding model is not the one-layer one plus a layer")
    mixed = counted(2, "mixed")  # a sliding and a full layer
    window_rest = signed(mixed, sliding + full)
    if any(v < 0 for v in window_rest.values()):
        raise SystemExit(f"{family}: a model with both kinds of layer keeps less than its layers and rest: {window_rest}")
    parts: dict[str, Any] = {"window": {"layer": as_entries(signed(sliding, Counter(layer))),
                                        "rest": as_entries(window_rest)}}  # fmt: skip
    if family == "gemma2":
        cap = signed(counted(1, "cap"), full)
        if not cap or any(v < 0 for v in cap.values()):
            raise SystemExit(f"{family}: the final-logit cap is not a set of added storages: {cap}")
        parts["logit_softcap"] = as_entries(cap)
    return parts


def more_parts(family: str, ckpt: bool, layer: dict, rest: dict) -> dict[str, Any]:
    """A :data:`WINDOWED` family's ``window``: what a sliding layer keeps beyond a full one
    (``layer``, signed: K and V repeated to the query heads, the additive mask) and what the model
    keeps beyond the rest once a layer slides (``rest``: the mask, built once for every layer),
    from models whose every layer slides; SmolLM3's ``rope`` (its ``layer`` a NoPE one): what a
    rotating layer keeps beyond it (``layer``) and what the model keeps beyond the rest once a
    layer rotates (``rest``: the cos/sin table the layers' products hold)."""
    def counted(n: int, variant: str) -> Counter[tuple[str, str]]:
        return counted_variant(family, n, variant, checkpoint=ckpt)

    parts: dict[str, Any] = {}
    if family in WINDOWED:
        window = {n: counted(n, "window") for n in (1, 2)}
        sliding = Counter(signed(window[2], window[1]))  # one sliding layer
        window_rest = signed(window[1], sliding + Counter(rest))
        if any(v < 0 for v in (*sliding.values(), *window_rest.values())):
            raise SystemExit(f"{family}: the sliding model is not its rest, the window's rest and its layers: {window_rest}")
        parts["window"] = {"layer": as_entries(signed(sliding, Counter(layer))), "rest": as_entries(window_rest)}
    if family == "smollm3":
        rope = {n: counted(n, "rope") for n in (1, 2)}
        rotating = Counter(signed(rope[2], rope[1]))
        rope_rest = signed(rope[1], rotating + Counter(rest))  # the cos/sin table, kept once a layer rotates
        if any(v < 0 for v in rope_rest.values()):
            raise SystemExit(f"{family}: the rotating model keeps less than its layers and rest: {rope_rest}")
        parts["rope"] = {"layer": as_entries(signed(rotating, Counter(layer))), "rest": as_entries(rope_rest)}
    return parts


def model_bytes(entries: dict[str, Any], x: Dims, family: str, n: int, variant: str) -> int:
    """The formula's bytes of an ``n``-layer model of ``variant``: a Gemma model's none, or
    "mixed" with Gemma 2's "cap" (the window's layer part on its sliding layers, every other,
    the first, its rest part once, the cap's once); a :data:`WINDOWED` one's "window" (every
    layer sliding); SmolLM3's "mixed" (every other layer rotating, the first: the rope part on
    those) and "mixed+window" (its NoPE layers sliding too)."""
    want = n * formula_bytes(entries["layer"], x, family) + formula_bytes(entries["rest"], x, family)
    if family in WINDOWED:
        sliding = n if variant == "window" else n // 2 if "window" in variant else 0
        if sliding:
            want += sliding * formula_bytes(entries["window"]["layer"], x, family)
            want += formula_bytes(entries["window"]["rest"], x, family)
        if "mixed" in variant:
            want += (n + 1) // 2 * formula_bytes(entries["rope"]["layer"], x, family)
            want += formula_bytes(entries["rope"]["rest"], x, family)
        return want
    if "mixed" in variant:
        want += (n + 1) // 2 * formula_bytes(entries["window"]["layer"], x, family)
        want += formula_bytes(entries["window"]["rest"], x, family)
    if "cap" in variant:
        want += formula_bytes(entries["logit_softcap"], x, family)
    return want


def family_census(family: str) -> dict[str, Any]:
    """One family's formula (``layer``, ``rest``; ``checkpointed``: the same under HF's
    gradient checkpointing) and the checks it passed."""
    base = BASE[family]
    doc: dict[str, Any] = {"dims": base.__dict__}
    for mode, ckpt in (("none", False), ("checkpointed", True)):
        runs = {n: measure(family, n, base, checkpoint=ckpt) for n in (1, 2)}
        if not ckpt and any(not saved.items() <= alive.items() for saved, alive in runs.values()):
            raise SystemExit(f"{family}: a saved tensor's storage is not alive after the forward")
        counted = {n: named(alive, base, family) for n, (_, alive) in runs.items()}
        layer, rest = difference(counted[2], counted[1])
        if not ckpt:  # the hooks give the same layer: the storages alive but not saved are the rest's
            hooked = difference(*(named(runs[n][0], base, family) for n in (2, 1)))[0]
            if hooked != layer:
                raise SystemExit(f"{family}: one layer's saved tensors {hooked} are not its storages alive {layer}")
            doc["alive_not_saved"] = {" ".join(k): v for k, v in (Counter(counted[1]) - Counter(
                named(runs[1][0], base, family))).items()}  # fmt: skip
        layer, rest = per_pair(layer, base), per_pair(rest, base)
        entries: dict[str, Any] = {"layer": as_entries(layer), "rest": as_entries(rest)}
        # the configurations checked: the formula's own; a Gemma model as the real ones are
        # (sliding and full layers, Gemma 2's cap), at 2 and 3 layers (both kinds in use)
        runs_checked: list[tuple[str, tuple[int, ...]]] = [("", (1, 3))]
        if family in GEMMA:
            entries |= gemma_parts(family, ckpt, layer, rest)
            runs_checked.append(("mixed+cap" if family == "gemma2" else "mixed", (2, 3)))
        if family in WINDOWED or family == "smollm3":
            entries |= more_parts(family, ckpt, layer, rest)
            runs_checked.append(("window", (1, 3)))
            if family == "smollm3":
                runs_checked += [("mixed", (2, 3)), ("mixed+window", (2, 3))]
        checks = []
        for change in FAMILY_CHECKS.get(family, CHECKS):
            x = replace(base, **change)
            for variant, layer_counts in runs_checked:
                for n in layer_counts:
                    got = total(measure(family, n, x, checkpoint=ckpt, variant=variant)[1])
                    want = model_bytes(entries, x, family, n, variant)
                    # batch 1: the loss's shifted labels are a view of the [1, L + 1] padded labels
                    # (a contiguous slice, not copied as at b > 1), one int64 more than T: the one
                    # difference allowed (LABELS_B1)
                    if got != want + (LABELS_B1 if x.b == 1 else 0):
                        raise SystemExit(f"{family} ({mode}, {variant or 'formula'}) at {x}, {n} layer(s): "
                                         f"measured {got} bytes, formula {want}")  # fmt: skip
                    checks.append({"dims": change, "layers": n, "bytes": got, "formula_bytes": want}
                                  | ({"variant": variant} if variant else {}))  # fmt: skip
        doc[mode] = entries | {"checked": checks}
    return doc


def main(argv: list[str] | None = None) -> int:
    import argparse

    import torch
    import transformers

    from trainsim.ir.serialize import write_text_atomic

    ap = argparse.ArgumentParser(description="rewrite the activation census JSON")
    ap.add_argument("--families", nargs="+", choices=FAMILIES, metavar="FAMILY",
                    help=f"measure only these ({', '.join(FAMILIES)}); the JSON's others are kept as they are "
                         "(its transformers version must be the installed one)")  # fmt: skip
    args = ap.parse_args(argv)
    only = tuple(args.families or FAMILIES)

    doc: dict[str, Any] = {
        "what": "bytes autograd keeps for the backward of one HuggingFace eager training step (forward and loss, "
                "bf16 on the CPU, SDPA attention), per decoder layer and for the rest of the model (embedding, "
                "final norm, head, loss); each entry: size (product of symbols: T tokens of the micro-batch, d hidden, "
                "q/kv query/key widths, f MLP or expert width, V vocabulary, h/g attention/key heads, hd head size, "
                "k top-k, E experts; Gemma's: L*L and T*L a window's boolean [1, 1, L, L] and additive [B, 1, L, L] "
                "masks, d and hd a (1 + weight) norm's fp32 factor), dtype (bfloat16 stands for the training dtype), storages of that size; "
                "none: no checkpointing; checkpointed: model.gradient_checkpointing_enable() (non-reentrant "
                "torch.utils.checkpoint per layer: recompute full); checked: other dimensions where the formula's "
                "bytes equal the measured bytes exactly; gemma2, gemma3 (tied embeddings, as the real models; SDPA, "
                "Gemma 2's attention-score cap left off as SDPA runs it): layer is a full-attention layer, part window "
                "a sliding-window layer's storages beyond it (layer, signed: K and V repeated to the query heads) and a "
                "model with both kinds' beyond the rest (rest), logit_softcap Gemma 2's final-logit cap's (rest); mistral, "
                "cohere, phi, glm, glm4, smollm3, phi3, olmoe, olmoe_grouped (their *ForCausalLM, untied): mistral, phi3 and smollm3 "
                "part window (layer: a sliding layer's storages beyond a full one; rest: the model's beyond the rest once a "
                "layer slides), smollm3's layer a NoPE one and part rope (layer: a rotating layer's beyond it; rest: the "
                "cos/sin table kept once a layer rotates), phi, glm, glm4, phi3 partial rotary (T*qr, T*kvr rotated query/key "
                "widths, T*qp, T*kvp passed through, L*hdr the rotated cos/sin), cohere's d its LayerNorm's fp32 weight",
        "command": "python scripts/hf_activation_census.py",
        "date": datetime.date.today().isoformat(),
        "versions": {"torch": torch.__version__.split("+")[0], "transformers": transformers.__version__},
        "backends": {
            "measured": "CPU: aten::_scaled_dot_product_flash_attention_for_cpu, which saves query, key, value, "
                        "output and an fp32 logsumexp of B x h x L (T*h)",
            "cuda_flash": "aten::_scaled_dot_product_flash_attention (bf16, head size <= 256): its derivative "
                          "(tools/autograd/derivatives.yaml) reads query, key, value, output, logsumexp "
                          "(fp32, B x h x L), cum_seq_q/k (undefined for dense batches) and philox_seed/offset "
                          "(two int64 scalars): the same storages as the CPU kernel's",
            "cuda_efficient": "aten::_scaled_dot_product_efficient_attention: query, key, value, output and "
                              "logsumexp fp32 B x h x ceil(L/32)*32 (padded to 32 rows), philox seed/offset",
        },
        "families": {},
    }
    if only != FAMILIES:  # the other families as the JSON has them
        old = json.loads(OUT.read_text(encoding="utf-8"))
        if old["versions"] != doc["versions"]:
            raise SystemExit(f"{OUT} was measured with {old['versions']}, {doc['versions']} installed: re-run all families")
        doc["families"] = {f: v for f, v in old["families"].items() if f not in only}
    for family in only:
        print(family, file=sys.stderr)
        doc["families"][family] = family_census(family)
    doc["families"] = {f: doc["families"][f] for f in FAMILIES if f in doc["families"]}
    write_text_atomic(OUT, json.dumps(doc, indent=1) + "\n")
    print(OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
