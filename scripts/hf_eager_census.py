"""Count the memory-bound kernels HuggingFace's eager PyTorch models run: the census behind
``trainsim predict --impl hf`` (``src/trainsim/builders/data/hf_eager_census.json``).

A fused stack (Megatron, what paper 001 times) runs one kernel per norm, activation, rotary
embedding and loss; HuggingFace's modules run them as many eager aten calls (LlamaRMSNorm
upcasts to fp32 and takes pow, mean, rsqrt, two muls and two casts; ``apply_rotary_pos_emb``
slices, negates, concatenates; the loss upcasts the logits to fp32). This script runs a tiny
model of each family on the CPU in bf16 under a ``TorchDispatchMode`` and records every aten call
of one training step (forward, loss, backward) with its tensors' sizes and dtypes. Two models
that differ by one layer give one layer's calls; the one-layer model less that layer gives the
rest (embedding, final norm, head, loss). GEMMs, attention, the embedding lookup and the loss's
gather are left out (the builder times them); views cost nothing. Every other call becomes bytes
moved: each tensor it reads and writes, once. Sizes are written as products of the model's
symbols (``T`` tokens, ``d`` hidden, ``q``/``kv`` query/key widths, ``f`` MLP width, ``V``
vocabulary, ``hd`` head size); the tiny model's dimensions are chosen so that every product
the step makes has a distinct value, and a large size with no symbol stops the script.

MoE (``mixtral``: transformers' ``MixtralSparseMoeBlock`` with ``experts_implementation="eager"``,
the loop over the experts hit, one GEMM pair per expert on its tokens): the router is made to
route evenly (token i to experts ``(i k + j) mod E``, j < k, its scores kept), so every expert
gets ``Te = T k / E`` tokens and the per-expert sizes are products of ``Te``; the step is recorded
at three expert counts, E = 5 and 10 giving one expert's calls (the difference over 5) and the
layer's others, E = 18 checking that the layer is those plus E experts. Gathers
(``index``/``index_select``) move the rows they gather, scatters (``index_add_``,
``index_put``) the rows they add, not the whole ``[T, d]`` they index; the gradient buffers the
loop zeroes (``new_zeros``, ``select_backward``'s ``[E, 2f, d]``) are written once. It also
counts, per expert and for the rest of the layer, the host's work: launching aten calls, views,
device-to-host syncs (``_local_scalar_dense``, and ``nonzero``, whose CUDA kernel copies its
count to the host) and backward autograd nodes.

MoE (``mixtral_grouped``: transformers 5's default ``experts_implementation="grouped_mm"``,
``integrations/moe.py``'s ``grouped_mm_experts_forward``): the same even routing at k = 8, taken
at E = 15, 30 and 32, which must give the same census (the path sorts the ``T k`` token-expert
pairs by expert, gathers their rows, takes per-expert offsets from ``histc`` and ``cumsum`` of
E numbers, and runs ``torch.nn.functional.grouped_mm`` over all experts: no per-expert call).
The experts module's calls (part ``experts``) are told from the layer's others by module hooks
in the forward and, in the backward, by the autograd node running
(``torch._C._current_autograd_node``, among the nodes the experts' forward made). The grouped
GEMMs (``_grouped_mm``: torch 2.13 runs it on the CPU, the same call CUDA runs, two of them
backward per projection) are left to the builder, as the other GEMMs are.

Phi-3 (``phi3``: ``Phi3ForCausalLM``, since 2026-12-04; it took Mistral's): LLaMA's modules but
a fused ``qkv_proj`` (``T*qkv``: q, k, v its slices, whose gradients are zero-filled ``T*qkv``
buffers added), a fused ``gate_up_proj`` chunked in two and Phi3's ``apply_rotary_pos_emb``
(the passed dims concatenated back at any factor), taken at a partial rotary (PARTIAL_DIMS) with
Mistral's window parts; part ``full_rotary`` is a step at factor 1.0 (Phi-3-mini's) less the census
read at ``rd = hd``, which must differ only by the rotated slices' backward and leave the rest as it is.

    python scripts/hf_eager_census.py            # rewrites the JSON (needs torch, transformers)
    python scripts/hf_eager_census.py --families mistral phi   # those only, the others kept
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "src" / "trainsim" / "builders" / "data" / "hf_eager_census.json"
# B, L, d, heads, kv heads, head size, MLP width, vocabulary: every product below distinct
B, L, D, H, KV, HD, F, V = 3, 20, 48, 12, 3, 4, 112, 331
T = B * L
VIEWS = {"view", "_unsafe_view", "t", "transpose", "expand", "slice", "unsqueeze", "reshape", "as_strided", "detach",
         "alias", "permute", "squeeze", "select", "_reshape_alias", "split", "unbind", "lift_fresh", "split_with_sizes"}
NO_KERNEL = {"empty", "new_empty", "empty_like", "new_empty_strided", "empty_strided", "_local_scalar_dense"}
# MoE census (mixtral): top-k, the expert counts it is taken at (E_CHECK checks the fit), the
# zero-fills it counts (a gradient buffer the expert loop zeroes is a memset of real size)
K_MOE, E_FIT, E_CHECK = 3, (5, 10), 18
# the grouped_mm census (mixtral_grouped): its top-k and the expert counts it is taken at (the
# same calls at each: no per-expert call); k = 8 (Qwen3-MoE's) keeps T k d, T k f apart from the
# dense sizes (k = 3 would make T k d equal T 3d)
K_GROUPED, E_GROUPED = 8, (15, 30, 32)
# the Qwen3-MoE censuses (qwen3_moe, qwen3_moe_grouped): its attention heads, so that the query
# width (21 x 4) differs from d, as Qwen3-30B-A3B's (32 x 128 = 2 d) does: its q/k norms, rotary
# and o_proj input are T*q, and the q norm's per-head statistics T*h
H_QWEN = 21
# the dense censuses (llama, qwen3): head size 10, so that the query width (12 x 10 = 120) is
# neither d (48) nor the key width (3 x 10 = 30), as in Qwen3-0.6B/4B (16 x 128 = 2 d,
# 32 x 128 = 1.6 d) and Gemma (16 x 256 > d): the rotary's query half, the attention output and
# o_proj's input are T*q, not T*d (with head size 4, 12 x 4 = d, and the first name of a size,
# d, took them all until 2026-12-03); 12 heads, since LlamaConfig wants d a multiple of them
HD_DENSE = 10
# Gemma 1 and Granite (transformers' GemmaForCausalLM, GraniteForCausalLM; ModelSpec.hf_family
# names them, as their shapes are LLaMA's): Gemma's two (1 + weight) fp32 RMSNorms a layer,
# GeLU-tanh GeGLU and sqrt(d)-scaled embedding; Granite's LLaMA modules with its multipliers
# (GRANITE_MULTIPLIERS, granite-3.0-8b's: not 1, so each multiply is made as the real model's is)
DENSE_FAMILIES = ("llama", "qwen3", "gemma", "granite")
GRANITE_MULTIPLIERS = {"embedding_multiplier": 12.0, "logits_scaling": 16.0, "residual_multiplier": 0.22,
                       "attention_multiplier": 0.0078125}  # fmt: skip
# Gemma 2 and Gemma 3 (transformers' Gemma2ForCausalLM, Gemma3ForCausalLM): the dense censuses'
# dimensions, GeLU-tanh GeGLU, four (1 + weight) RMSNorms a layer, the embedding scaled by
# sqrt(d); Gemma 2's final-logit cap (30) in the rest, its attention-score cap (50) a part of
# its own (attn_softcap: HF's eager attention with the cap less without it, on [B, h, L, L]
# scores, T*h*L); a window (GEMMA_WINDOW < L, so the sliding mask is built) on every layer,
# checked against full-attention layers
GEMMA_FAMILIES = ("gemma2", "gemma3")
GEMMA_WINDOW, GEMMA2_ATTN_CAP = 8, 50.0
# the dense families whose rest is also taken with a tied embedding (the head's weight the
# embedding's: autograd adds the two gradients, one add of V*d), as part "tied"
MOE_FAMILIES = ("mixtral", "mixtral_grouped", "qwen3_moe", "qwen3_moe_grouped", "olmoe", "olmoe_grouped")
# the families added 2026-12-04 (transformers' MistralForCausalLM, CohereForCausalLM, PhiForCausalLM,
# GlmForCausalLM, Glm4ForCausalLM, SmolLM3ForCausalLM; OlmoeForCausalLM is among MOE_FAMILIES, with
# Mixtral's heads: its q norm is an RMSNorm of hidden_size, so q = d, as in OLMoE-1B-7B):
# Mistral's and SmolLM3's also with a window part (WINDOW_FAMILIES: every layer sliding, the window
# GEMMA_WINDOW < L, against none), SmolLM3 a rope part (ROPE_FAMILIES: its layer is a NoPE one, the
# rotary's calls a part of their own, added on the rotating share of the layers)
MORE_FAMILIES = ("mistral", "cohere", "phi", "glm", "glm4", "smollm3", "phi3")
WINDOW_FAMILIES = ("mistral", "smollm3", "phi3")
ROPE_FAMILIES = ("smollm3",)
# partial rotary (Phi, GLM: the first ``rd`` of each head's ``hd`` dims rotate, the rest pass
# through and are concatenated back): the tiny model's hidden size, heads, key heads, head size
# and rotated dims, chosen so that the rotated and passed widths (T*qr, T*qp, T*kvr, T*kvp, their
# halves, T*hdr the cos/sin) differ from every other size (Phi's head size is d / h: its d is its own)
PARTIAL_DIMS = {"phi": (126, 18, 3, 7, 4), "glm": (48, 9, 3, 22, 12), "glm4": (48, 9, 3, 22, 12),
                "phi3": (48, 9, 3, 22, 12)}
# Phi-3 (transformers' Phi3ForCausalLM, since 2026-12-04; Mistral's census before): LLaMA's modules
# but a fused qkv_proj (q, k and v sliced from one T*(q+2kv) output, ``T*qkv``: the slices'
# gradients are zero-filled T*qkv buffers added), a fused gate_up_proj chunked in two, Phi3's
# apply_rotary_pos_emb (the first ``rd`` dims rotate, the rest concatenated back, whatever the
# factor: at 1.0 the pass-through is empty and the concatenation a copy), a window part as
# Mistral's; taken at a partial rotary (PARTIAL_DIMS) and checked at the full one (PHI3_FULL)
FUSED_QKV = ("phi3",)
PHI3_FULL = 1.0
TIED_FAMILIES = ("llama", "qwen3", "gemma", "granite", *GEMMA_FAMILIES, *MORE_FAMILIES)
ZEROS = {"zeros", "new_zeros", "zeros_like"}
GATHERS = {"index", "index_select"}
SCATTERS = {"index_add_", "index_add", "index_put", "index_put_", "_index_put_impl_"}
SKIP = {"view", "_unsafe_view", "t", "transpose", "expand", "slice", "unsqueeze", "reshape", "as_strided", "detach",
        "alias", "permute", "squeeze", "select", "_reshape_alias", "split", "unbind", "lift_fresh", "split_with_sizes",
        # timed by the builder itself
        "mm", "bmm", "addmm", "_grouped_mm", "embedding", "embedding_dense_backward", "nll_loss_forward", "nll_loss_backward",
        "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
        # no data moved, or a handful of elements
        "zeros", "empty", "ones", "arange", "_local_scalar_dense", "scalar_tensor", "new_empty", "new_zeros", "full",
        "zeros_like", "ones_like", "empty_like", "new_empty_strided", "empty_strided", "_to_copy_scalar"}  # fmt: skip


def _symbols(d: int, f: int, *, q: int, kv: int, hd: int, v: int, h: int = 0) -> dict[int, str]:
    """Element count -> symbol; the first name of a count wins (``q`` equals ``d`` in HF's LLaMA);
    ``h``: the attention heads, named ``T*h`` (a per-head norm's statistics) where given."""
    per_token = {"d": d, "f": f, "q": q, "kv": kv, "hd": hd, "V": v, "2f": 2 * f, "3d": 3 * d, "4d": 4 * d}
    sym: dict[int, str] = {T: "T"}
    for name, w in per_token.items():
        sym.setdefault(T * w, f"T*{name}")
    for name, w in per_token.items():
        if w % 2 == 0:
            sym.setdefault(T * w // 2, f"T*{name}/2")
    sym.setdefault(L * d, "L*d")  # one sequence's learned positions (broadcast over the batch)
    sym.setdefault(L * L, "L*L")  # an attention mask built in eager code
    sym.setdefault(v * d, "V*d")  # a tied embedding: its two gradients added
    sym.setdefault(B * L * L, "T*L")
    if h:
        sym.setdefault(T * h, "T*h")
    return sym


def _dense(heads: int, hd: int = HD) -> dict[int, str]:
    """The dense symbols of a census's tiny model with ``heads`` attention heads of ``hd``;
    where ``heads x hd`` is not ``d`` (Qwen3-MoE's ``H_QWEN`` heads, the dense censuses'
    ``HD_DENSE``) the query and key sizes and ``T*h`` must be their own (Mixtral's ``q`` is ``d``)."""
    if heads * hd == D:
        return _symbols(D, F, q=D, kv=KV * hd, hd=hd, v=V)
    sym = _symbols(D, F, q=heads * hd, kv=KV * hd, hd=hd, v=V, h=heads)
    own = {"T*q", "T*q/2", "T*kv", "T*kv/2", "T*hd", "T*h"}
    if not own <= set(sym.values()) or T * KV in sym:  # T*KV: the k norm's statistics, left unnamed
        raise SystemExit(f"{heads} heads of {hd}: a query or key size equals another symbol's; pick other dimensions")
    return sym


def _partial_symbols(family: str) -> dict[int, str]:
    """A partial-rotary family's symbols (:data:`PARTIAL_DIMS`): the dense ones at its own sizes
    and the rotated and passed widths (:func:`_partial_widths`); every one distinct, or the
    census could not tell them apart."""
    d, heads, g, hd, rd = PARTIAL_DIMS[family]
    sym = _symbols(d, F, q=heads * hd, kv=g * hd, hd=hd, v=V, h=heads)
    named = _partial_widths(family, rd)
    if rd % 2 or len(set(named.values()) | set(sym)) != len(named) + len(sym) or T * g in sym:
        raise SystemExit(f"{family}: a rotated or passed width equals another symbol's; pick other dimensions")
    return sym | {n: name for name, n in named.items()}


def _partial_widths(family: str, rd: int) -> dict[str, int]:
    """The element counts of a partial-rotary family's own symbols in its tiny model
    (PARTIAL_DIMS' sizes) with ``rd`` of each head's dims rotating: the rotated and passed widths
    (none passed at ``rd = hd``), the rotated cos/sin and, for :data:`FUSED_QKV`, the fused
    projection's output ``T*qkv``."""
    _, heads, g, hd, _ = PARTIAL_DIMS[family]
    widths = {"T*qr": heads * rd, "T*qr/2": heads * rd // 2, "T*kvr": g * rd, "T*kvr/2": g * rd // 2,
              "T*qp": heads * (hd - rd), "T*kvp": g * (hd - rd), "T*hdr": rd, "T*hdr/2": rd // 2}  # fmt: skip
    if family in FUSED_QKV:
        widths["T*qkv"] = (heads + 2 * g) * hd
    return {name: T * w for name, w in widths.items()}


def _moe_symbols(d: int, f: int, experts: int, k: int, heads: int = H) -> dict[int, str]:
    """The MoE block's sizes (even routing: ``Te = T k / E`` tokens per expert); each must be
    new to the dense symbols, or the census could not tell them apart."""
    te = T * k // experts
    named = {te: "Te", te * d: "Te*d", te * f: "Te*f", te * 2 * f: "Te*2f", T * k: "T*k", T * experts: "T*E",
             T * k * (experts + 1): "T*k*(E+1)", 2 * f * d: "2f*d", d * f: "d*f", experts * 2 * f * d: "E*2f*d",
             experts * d * f: "E*d*f"}  # fmt: skip
    dense = _dense(heads)
    if len(named) < 11 or set(named) & set(dense):
        raise SystemExit(f"mixtral with {experts} experts: an MoE size equals another symbol's; pick other dimensions")
    return dense | named


def _grouped_symbols(d: int, f: int, experts: int, k: int, heads: int = H) -> dict[int, str]:
    """The grouped_mm block's sizes: its ``T k`` token-expert pairs sorted by expert and their
    rows (``T k d``, ``T k f``, ``T k 2f``), the router's ``T E``, the experts' weights; each must
    be new to the dense symbols."""
    named = {T * k: "T*k", T * k * d: "T*k*d", T * k * f: "T*k*f", T * k * 2 * f: "T*k*2f", T * experts: "T*E",
             2 * f * d: "2f*d", d * f: "d*f", experts * 2 * f * d: "E*2f*d", experts * d * f: "E*d*f"}  # fmt: skip
    dense = _dense(heads)
    if len(named) < 9 or set(named) & set(dense):
        raise SystemExit(f"mixtral_grouped with {experts} experts: an MoE size equals another symbol's; pick other dimensions")
    return dense | named


# phase, aten call, (size, dtype) of each tensor it moves, part ("layer", or "experts": the
# MoE experts module's own calls, forward and backward, in the mixtral_grouped census)
Calls = list[tuple[str, str, tuple[tuple[str, str], ...], str]]


def census(family: str, layers: int, experts: int = 0, hd: int = HD_DENSE, *, tied: bool = False,
           layer_type: str | list[str] = "sliding_attention", attn: str = "sdpa", attn_cap: float | None = None,
           final_cap: float | None = 30.0, window: bool = False, rope: bool = True,
           factor: float | None = None) -> tuple[Calls, dict[str, int]]:  # fmt: skip
    """One training step's memory-bound calls, and its host work (calls by kind per phase,
    ``nodes``: the backward's autograd nodes); ``hd``: a dense LLaMA or Qwen3 model's head
    size (an MoE family's is ``HD``); ``tied``: a dense model's embedding and head share one
    weight; a Gemma model's ``layer_type`` (every layer's, or a list of one a layer), attention implementation and
    Gemma 2's attention-score cap (SDPA takes none) and final-logit cap (its config's 30);
    ``window``: a :data:`WINDOW_FAMILIES` model's layers all sliding (window GEMMA_WINDOW), else
    none; ``rope``: SmolLM3's layers all rotating, else all NoPE; ``factor``: a partial-rotary
    family's ``partial_rotary_factor`` other than its PARTIAL_DIMS' (Phi-3's check at 1.0)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    torch.manual_seed(0)
    route = None
    if family in DENSE_FAMILIES:
        # llama: transformers' LLaMA; qwen3: its dense Qwen3 (LLaMA's modules and per-head q/k
        # RMSNorms, Qwen3Attention's, as Qwen3-MoE's); untied embeddings (LLaMA-3's, Qwen3-8B's)
        dense: dict[str, Any] = {
            "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": KV, "head_dim": hd,
            "intermediate_size": F, "num_hidden_layers": layers, "vocab_size": V, "max_position_embeddings": L,
            "tie_word_embeddings": tied, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0,
            "attn_implementation": "sdpa"}  # fmt: skip
        if family == "llama":
            from transformers import LlamaConfig, LlamaForCausalLM

            model = LlamaForCausalLM(LlamaConfig(**dense))
        elif family == "gemma":
            from transformers import GemmaConfig, GemmaForCausalLM

            model = GemmaForCausalLM(GemmaConfig(**dense))
            if model.config.hidden_act != "gelu_pytorch_tanh":
                raise SystemExit("gemma: transformers' default activation changed (GeLU-tanh)")
        elif family == "granite":
            from transformers import GraniteConfig, GraniteForCausalLM

            model = GraniteForCausalLM(GraniteConfig(**dense, **GRANITE_MULTIPLIERS))
        else:
            from transformers import Qwen3Config, Qwen3ForCausalLM

            model = Qwen3ForCausalLM(Qwen3Config(**dense))
        sym = _dense(H, hd)
    elif family in GEMMA_FAMILIES:
        # Gemma 2 / Gemma 3: the dense censuses' sizes; every layer of ``layer_type`` (the
        # window's mask is built in the rest whatever the layers); SDPA for the attention core
        # (the builder's): Gemma 2's modules refuse "sdpa" (it cannot soft-cap the scores), so
        # transformers' own sdpa_attention_forward and sdpa_mask are registered under another
        # name and the score cap left off there (``attn_cap``, with eager attention, is part attn_softcap)
        from transformers import AttentionInterface
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register("census_attention", sdpa_attention_forward)
        AttentionMaskInterface.register("census_attention", sdpa_mask)  # SDPA's masks (the window's)
        gemma: dict[str, Any] = {
            "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": KV, "head_dim": hd,
            "intermediate_size": F, "num_hidden_layers": layers, "vocab_size": V, "max_position_embeddings": L,
            "tie_word_embeddings": tied, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0,
            "sliding_window": GEMMA_WINDOW,
            "layer_types": [layer_type] * layers if isinstance(layer_type, str) else layer_type,
            "attn_implementation": "census_attention" if attn == "sdpa" else attn}  # fmt: skip
        if family == "gemma2":
            from transformers import Gemma2Config, Gemma2ForCausalLM

            if Gemma2Config().final_logit_softcapping != 30.0 or Gemma2Config().hidden_activation != "gelu_pytorch_tanh":
                raise SystemExit("gemma2: transformers' defaults changed (final-logit cap, GeLU-tanh)")
            model = Gemma2ForCausalLM(Gemma2Config(attn_logit_softcapping=attn_cap, final_logit_softcapping=final_cap,
                                                   **gemma))  # fmt: skip
        else:
            from transformers import Gemma3ForCausalLM, Gemma3TextConfig

            model = Gemma3ForCausalLM(Gemma3TextConfig(**gemma))
            cfg = model.config
            if cfg.final_logit_softcapping or cfg.attn_logit_softcapping or cfg.hidden_activation != "gelu_pytorch_tanh":
                raise SystemExit("gemma3: transformers' defaults changed (no soft-caps, GeLU-tanh)")
        sym = _dense(H, hd)
        sym.setdefault(T * H * L, "T*h*L")  # the attention scores (eager attention only)
        if sym[T * H * L] != "T*h*L":
            raise SystemExit("gemma: the attention scores' size equals another symbol's; pick other dimensions")
    elif family in MORE_FAMILIES:
        # their config classes' defaults but for the sizes (Cohere's logit_scale 0.0625, Phi's
        # gelu_new and dropout 0, GLM's attention biases); untied as LLaMA's (part tied: the add);
        # SDPA. Phi and GLM at PARTIAL_DIMS (their partial rotary), the others the dense sizes
        d, heads, g, hd, rd = PARTIAL_DIMS.get(family, (D, H, KV, hd, hd))
        cfg: dict[str, Any] = {
            "hidden_size": d, "num_attention_heads": heads, "num_key_value_heads": g,
            "intermediate_size": F, "num_hidden_layers": layers, "vocab_size": V, "max_position_embeddings": L,
            "tie_word_embeddings": tied, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0,
            "attn_implementation": "sdpa"}  # fmt: skip
        if family != "phi":  # PhiAttention's head size is d / h
            cfg["head_dim"] = hd
        if family in PARTIAL_DIMS:  # int(hd * factor) == rd
            cfg["partial_rotary_factor"] = (rd + 0.5) / hd
        if factor is not None:
            cfg["partial_rotary_factor"], rd = factor, int(hd * factor)
        import transformers

        cls = {"mistral": "Mistral", "cohere": "Cohere", "phi": "Phi", "glm": "Glm", "glm4": "Glm4",
               "smollm3": "SmolLM3", "phi3": "Phi3"}[family]  # fmt: skip
        if family in ("mistral", "phi3"):
            cfg["sliding_window"] = GEMMA_WINDOW if window else None
        if family == "smollm3":
            cfg |= {"no_rope_layers": [int(rope)] * layers, "use_sliding_window": window,
                    "sliding_window": GEMMA_WINDOW if window else None,
                    "layer_types": [("sliding_attention" if window else "full_attention")] * layers}  # fmt: skip
        elif not rope:
            raise SystemExit(f"{family}: every layer rotates")
        config = getattr(transformers, f"{cls}Config")(**cfg)
        model = getattr(transformers, f"{cls}ForCausalLM")(config)
        if family in PARTIAL_DIMS:
            attn = model.model.layers[0].self_attn
            got = getattr(attn, "rotary_ndims", None) or int(model.model.rotary_emb.inv_freq.numel() * 2)
            if got != rd or model.model.layers[0].self_attn.head_dim != hd:
                raise SystemExit(f"{family}: rotary dims {got}, head size {attn.head_dim}; expected {rd}, {hd}")
        sym = _partial_symbols(family) if family in PARTIAL_DIMS and factor is None else _dense(H, hd)
        if factor is not None:  # the whole-head rotary (factor 1.0): the dense symbols and the fused qkv
            sym = _symbols(d, F, q=heads * hd, kv=g * hd, hd=hd, v=V, h=heads) | {T * (heads + 2 * g) * hd: "T*qkv"}
        if window and sym.setdefault(T * L, "T*L") != "T*L":
            raise SystemExit(f"{family}: the window mask's size equals another symbol's; pick other dimensions")
    elif family == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        # attention dropout runs inside the fused attention kernel on a GPU (the builder times it);
        # on the CPU SDPA with dropout falls back to the math path, so the census leaves it at 0
        cfg = GPT2Config(n_embd=D, n_head=H, n_layer=layers, vocab_size=V, n_positions=L, bos_token_id=0, eos_token_id=0, attn_pdrop=0.0,
                         attn_implementation="sdpa")  # fmt: skip
        model = GPT2LMHeadModel(cfg)
        sym = _symbols(D, 4 * D, q=D, kv=D, hd=D // H, v=V)
    elif family in MOE_FAMILIES:
        # mixtral*: transformers' Mixtral; qwen3_moe*: its Qwen3-MoE (q/k norms; routing weights
        # cast back to the activations' dtype, norm_topk_prob on, as Qwen3-30B-A3B's config has)
        # no suffix: eager experts (the loop); _grouped: transformers 5's default, grouped_mm
        # (sort, gather, torch.nn.functional.grouped_mm over all experts); no router aux loss
        # (output_router_logits off, the default)
        grouped = family.endswith("_grouped")
        impl = "grouped_mm" if grouped else "eager"
        k = K_GROUPED if grouped else K_MOE
        heads = H_QWEN if family.startswith("qwen3_moe") else H
        common: dict[str, Any] = {
            "hidden_size": D, "num_attention_heads": heads, "num_key_value_heads": KV, "head_dim": HD,
            "intermediate_size": F, "num_hidden_layers": layers, "vocab_size": V, "max_position_embeddings": L,
            "tie_word_embeddings": False, "num_experts_per_tok": k, "bos_token_id": 0, "eos_token_id": 0,
            "pad_token_id": 0, "attn_implementation": "sdpa", "experts_implementation": impl}  # fmt: skip
        if family.startswith("mixtral"):
            from transformers import MixtralConfig, MixtralForCausalLM
            from transformers.models.mixtral import modeling_mixtral

            model = MixtralForCausalLM(MixtralConfig(num_local_experts=experts, **common))
            router_cls: Any = modeling_mixtral.MixtralTopKRouter
        elif family.startswith("olmoe"):
            # olmoe*: transformers' OLMoE (q/k RMSNorms over the whole projections, the router's
            # weights cast back to bf16 as Qwen3-MoE's; norm_topk_prob off, OlmoeConfig's and
            # OLMoE-1B-7B's; no clip_qkv, the default)
            from transformers import OlmoeConfig, OlmoeForCausalLM
            from transformers.models.olmoe import modeling_olmoe

            model = OlmoeForCausalLM(OlmoeConfig(num_experts=experts, **common))
            if model.config.norm_topk_prob or model.config.clip_qkv is not None:
                raise SystemExit("olmoe: transformers' defaults changed (norm_topk_prob, clip_qkv)")
            router_cls = modeling_olmoe.OlmoeTopKRouter
        else:
            from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
            from transformers.models.qwen3_moe import modeling_qwen3_moe

            model = Qwen3MoeForCausalLM(Qwen3MoeConfig(num_experts=experts, moe_intermediate_size=F,
                                                       norm_topk_prob=True, decoder_sparse_step=1,
                                                       mlp_only_layers=[], **common))  # fmt: skip
            router_cls = modeling_qwen3_moe.Qwen3MoeTopKRouter
        if model.config._experts_implementation != impl:
            raise SystemExit(f"{family}: transformers chose experts_implementation {model.config._experts_implementation!r}")
        sym = _grouped_symbols(D, F, experts, k, heads) if grouped else _moe_symbols(D, F, experts, k, heads)
        # even routing: token i to experts (i k + j) mod E; the router's scores (and their
        # gradient) are its own, only the chosen indices are replaced
        route = (torch.arange(T)[:, None] * k + torch.arange(k)[None, :]) % experts
        top_k_router = router_cls.forward

        def routed(self, hidden_states):  # type: ignore[no-untyped-def]
            logits, scores, _ = top_k_router(self, hidden_states)
            return logits, scores, route

        router_cls.forward = routed
    else:
        raise SystemExit(f"unknown family {family!r}")
    model = model.to(torch.bfloat16).train()
    tokens = torch.randint(0, V, (B, L))
    calls: Calls = []
    host: Counter[str] = Counter()
    phase, part = ["fwd"], ["layer"]
    # mixtral_grouped: the experts modules' calls are told apart, forward by module hooks,
    # backward by the autograd node running (the nodes their forward made, up to their inputs')
    expert_nodes: set[Any] = set()
    if family.endswith("_grouped"):

        def enter(module, args):  # type: ignore[no-untyped-def]
            part[0] = "experts"

        def leave(module, args, out):  # type: ignore[no-untyped-def]
            part[0] = "layer"
            stop = {a.grad_fn for a in args if isinstance(a, torch.Tensor) and a.grad_fn is not None}
            todo = [out.grad_fn]
            while todo:
                n = todo.pop()
                if n is not None and n not in stop and n not in expert_nodes:
                    expert_nodes.add(n)
                    todo.extend(f for f, _ in n.next_functions)

        for layer in model.model.layers:
            layer.mlp.experts.register_forward_pre_hook(enter)
            layer.mlp.experts.register_forward_hook(leave)

    def size(t: torch.Tensor) -> str | None:
        n = t.numel()
        if n in sym:
            return sym[n]
        if n >= 8 * T:  # a large tensor with no symbol: the census would be wrong
            raise SystemExit(f"{family}: a tensor of {n} elements ({tuple(t.shape)}) has no symbol")
        return None  # no token dimension: weights, biases, one cos/sin table, scalars (little data)

    class Census(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            name = func.__name__.split(".")[0]
            kind = "views" if name in VIEWS else "syncs" if name == "_local_scalar_dense" else "launching"
            if name not in NO_KERNEL or kind == "syncs":
                host[f"{phase[0]}_{kind}"] += 1
            if name == "nonzero":  # on a GPU it copies its count to the host: a sync too
                host[f"{phase[0]}_syncs"] += 1
            if name in SKIP and not (route is not None and name in ZEROS):
                return out
            ins = [a for a in args if isinstance(a, torch.Tensor)]
            ins += [x for a in args if isinstance(a, list | tuple) for x in a if isinstance(x, torch.Tensor)]
            outs = [o for o in (out if isinstance(out, list | tuple) else [out]) if isinstance(o, torch.Tensor)]
            if route is not None and name in ZEROS:  # a memset: the buffer written once
                ins = []
            elif route is not None and name in GATHERS:  # the rows gathered read, and written
                ins = [a for a in ins[1:] if a.dtype == torch.int64] + outs
            elif route is not None and name in SCATTERS:  # the rows added read, read and written at the target
                src = ins[-1] if name in {"index_add_", "index_add"} else ins[1]  # source / values
                idx = [a for a in ins[1:] if a.dtype == torch.int64 and a is not src]
                ins, outs = [*idx, src, src], [src]
            flat = ins + outs
            moved = tuple((s, str(t.dtype).removeprefix("torch.")) for t in flat if (s := size(t)) is not None)
            if moved:
                node = torch._C._current_autograd_node() if phase[0] == "bwd" and expert_nodes else None
                calls.append((phase[0], name, moved, "experts" if node in expert_nodes else part[0]))
            return out

    try:
        with Census():
            loss = model(input_ids=tokens, labels=tokens).loss
            phase[0] = "bwd"
            nodes, todo = set(), [loss.grad_fn]
            while todo:  # the backward's autograd nodes (AccumulateGrad included)
                n = todo.pop()
                if n is not None and n not in nodes:
                    nodes.add(n)
                    todo.extend(f for f, _ in n.next_functions)
            host["bwd_nodes"] = len(nodes)
            loss.backward()
    finally:
        if route is not None:
            router_cls.forward = top_k_router
    return calls, dict(host)


def _tally(calls: Calls, part: str | None = None) -> Counter[tuple[str, str, str, str]]:
    """(phase, call, size, dtype) -> tensors moved, over the calls of ``part`` (None: all)."""
    c: Counter[tuple[str, str, str, str]] = Counter()
    for phase, name, moved, where in calls:
        if part is None or where == part:
            for s, dt in moved:
                c[(phase, name, s, dt)] += 1
    return c


def _counts(calls: Calls, host: dict[str, int]) -> Counter[tuple[str, ...]]:
    """A step's tally with its kernel and host counts, as one counter (keys of one or four fields)."""
    c: Counter[tuple[str, ...]] = Counter(_tally(calls))
    for ph in ("fwd", "bwd"):
        c[("kernels", ph)] = sum(1 for p, *_ in calls if p == ph)
    for k, v in host.items():
        c[("host", k)] = v
    return c


def _moe_family(family: str) -> dict[str, object]:
    """An MoE family's census: ``layer`` (one layer's calls but its experts'), ``expert`` (one
    expert's, as many times as experts are hit), ``rest``; the fit over E_FIT is checked at
    E_CHECK. Counts in ``layer`` may be negative where the first expert does less than the
    others (autograd adds each later expert's gradient into the first's)."""
    steps = {e: (_counts(*census(family, 1, e)), _counts(*census(family, 2, e))) for e in (*E_FIT, E_CHECK)}
    lay = {e: Counter({k: two[k] - one[k] for k in two.keys() | one.keys()}) for e, (one, two) in steps.items()}
    (e1, e2), keys = E_FIT, set().union(*lay.values())
    expert: dict[tuple[str, ...], int] = {}
    for k in keys:
        d, r = divmod(lay[e2][k] - lay[e1][k], e2 - e1)
        if r:
            raise SystemExit(f"{family}: {k} does not grow by whole calls per expert ({lay[e1][k]} at E {e1}, {lay[e2][k]} at E {e2})")
        expert[k] = d
    base = {k: lay[e1][k] - e1 * expert[k] for k in keys}
    for k in keys:
        if base[k] + E_CHECK * expert[k] != lay[E_CHECK][k]:
            raise SystemExit(f"{family}: the layer at E {E_CHECK} is not its calls plus {E_CHECK} experts' ({k})")
    rest = {e: Counter({k: one[k] - lay[e][k] for k in one.keys() | lay[e].keys()}) for e, (one, _) in steps.items()}
    if any(rest[e] != rest[e1] for e in rest):
        raise SystemExit(f"{family}: the rest of the model changes with the expert count")

    def entries(d: dict[tuple[str, ...], int]) -> list[list[object]]:
        return [[*k, v] for k, v in sorted(d.items()) if len(k) == 4 and v]

    def meta(d: dict[tuple[str, ...], int], what: str) -> dict[str, int]:
        return {k[1]: v for k, v in sorted(d.items()) if k[0] == what}

    parts = {"layer": base, "expert": expert, "rest": dict(rest[e1])}
    # a LLaMA layer of the same size (its host counts: the calls, not their sizes)
    one, two = (_counts(*census("llama", n, hd=HD)) for n in (1, 2))
    dense = {k: two[k] - one[k] for k in two if k[0] == "host"}
    block = {k: base.get(k, 0) - dense.get(k, 0) for k in base.keys() | dense.keys() if k[0] == "host"}
    return {part: entries(d) for part, d in parts.items()} | {
        "kernels": {part: meta(d, "kernels") for part, d in parts.items()},
        "host": {part: meta(d, "host") for part, d in (*parts.items(), ("block", block))},
        "routing": f"even: token i to experts (i k + j) mod E, k = {K_MOE}; fit at E = {E_FIT}, checked at E = {E_CHECK}",
        "experts_implementation": "eager",
    }


def _grouped_family(family: str = "mixtral_grouped") -> dict[str, object]:
    """A grouped_mm MoE census (``mixtral_grouped``, ``qwen3_moe_grouped``): ``layer`` (one layer's calls but the
    experts module's), ``experts`` (the experts module's: the sort by expert, the gathers, the
    activation, the routing weights' product, the restoring gather and the sum over the top-k,
    and their backward; its grouped GEMMs are the builder's), ``rest``. Taken at each of
    E_GROUPED expert counts, which must give the same census: the path makes no per-expert call
    (its per-expert offsets are E numbers, no tensor of a token's size)."""
    found = []
    for e in E_GROUPED:
        (c1, h1), (c2, h2) = census(family, 1, e), census(family, 2, e)
        parts: dict[str, Counter[tuple[str, ...]]] = {}
        for p in ("layer", "experts"):
            one, two = _tally(c1, p), _tally(c2, p)
            parts[p] = Counter({k: two[k] - one[k] for k in two.keys() | one.keys() if two[k] - one[k]})
            for ph in ("fwd", "bwd"):
                n1 = sum(1 for q, _, _, w in c1 if q == ph and w == p)
                n2 = sum(1 for q, _, _, w in c2 if q == ph and w == p)
                parts[p][("kernels", ph)] = n2 - n1
                if p == "experts" and n1 != n2 - n1:
                    raise SystemExit(f"{family}: the one-layer model's experts are not the two-layer's less a layer's ({ph})")
        lay = parts["layer"]
        one = _tally(c1, "layer")
        rest = Counter({k: one[k] - lay[k] for k in one.keys() | lay.keys() if one[k] - lay[k]})
        for ph in ("fwd", "bwd"):
            rest[("kernels", ph)] = sum(1 for q, _, _, w in c1 if q == ph and w == "layer") - lay[("kernels", ph)]
        if any(v < 0 for k, v in (*lay.items(), *rest.items(), *parts["experts"].items()) if len(k) == 4):
            raise SystemExit(f"{family}: the two-layer step is not the one-layer step plus a layer")
        host = Counter({k: h2.get(k, 0) - h1.get(k, 0) for k in h1.keys() | h2.keys()})
        found.append((parts["layer"], parts["experts"], rest, host))
    if any(f != found[0] for f in found):
        raise SystemExit(f"{family}: the census changes with the expert count ({E_GROUPED}): a per-expert call?")
    lay, experts, rest, host = found[0]
    one, two = (census("llama", n, hd=HD)[1] for n in (1, 2))  # a LLaMA layer of the same size
    block = {k: host[k] - (two.get(k, 0) - one.get(k, 0)) for k in host.keys() | one.keys() | two.keys()}

    def entries(d: Counter[tuple[str, ...]]) -> list[list[object]]:
        return [[*k, v] for k, v in sorted(d.items()) if len(k) == 4 and v]

    return {"layer": entries(lay), "experts": entries(experts), "rest": entries(rest),
            "kernels": {p: {ph: d[("kernels", ph)] for ph in ("fwd", "bwd")}
                        for p, d in (("layer", lay), ("experts", experts), ("rest", rest))},
            "host": {"block": dict(sorted(block.items()))},
            "routing": f"even: token i to experts (i k + j) mod E, k = {K_GROUPED}; the same census at E = {E_GROUPED}",
            "experts_implementation": "grouped_mm"}  # fmt: skip


def _layer_rest(family: str, **kw: Any) -> tuple[Counter[tuple[str, str, str, str]], ...]:
    """One layer's tally (two layers less one), the rest's (one layer less that layer), and
    each part's kernels per phase (``("kernels", phase)`` keys), of ``census(family, n, **kw)``."""
    one, _ = census(family, 1, **kw)
    two, _ = census(family, 2, **kw)
    t1, t2 = _tally(one), _tally(two)
    layer: Counter[tuple[str, ...]] = Counter({k: t2[k] - t1[k] for k in t2 if t2[k] - t1[k]})
    rest: Counter[tuple[str, ...]] = Counter({k: t1[k] - layer.get(k, 0) for k in t1 if t1[k] - layer.get(k, 0)})
    if any(v < 0 for v in (*layer.values(), *rest.values())):
        raise SystemExit(f"{family}: the two-layer step is not the one-layer step plus a layer")
    for ph in ("fwd", "bwd"):  # calls (kernels) per part and phase: one layer = two layers less one
        n1, n2 = sum(1 for p, *_ in one if p == ph), sum(1 for p, *_ in two if p == ph)
        layer[("kernels", ph)], rest[("kernels", ph)] = n2 - n1, 2 * n1 - n2
    return layer, rest


def _difference(family: str, more: Counter[tuple[str, ...]], less: Counter[tuple[str, ...]], what: str,
                sizes: set[str] | None = None) -> Counter[tuple[str, ...]]:  # fmt: skip
    """``more`` less ``less``: the calls one configuration adds to another (``what``), none
    negative and, where ``sizes`` is given, each of one of those sizes."""
    diff = Counter({k: more[k] - less[k] for k in more.keys() | less.keys() if more[k] - less[k]})
    bad = [k for k, v in diff.items() if v < 0 or (len(k) == 4 and sizes is not None and k[2] not in sizes)]
    if bad or not any(len(k) == 4 for k in diff):
        raise SystemExit(f"{family}: {what} is not a set of added calls ({bad or 'none'})")
    return diff


def _dense_family(family: str) -> dict[str, object]:
    """A dense family's census: ``layer`` and ``rest`` (untied embeddings, but GPT-2's, whose
    config ties them) and their kernels; for :data:`TIED_FAMILIES` also ``tied``, the calls a
    tied embedding adds (the rest with the head's weight the embedding's, less the rest
    without: the add of its two gradients, V*d). Gemma's (:data:`GEMMA_FAMILIES`): every layer
    a full-attention one (SDPA's causal path) and ``window``, what a sliding-window layer runs
    beyond it (SDPA with the window's mask: the boolean mask turned into an additive one, the
    keys and values repeated to the query heads, since transformers passes ``enable_gqa`` only
    without a mask, and their gradients summed back); the rest is checked to be the same with
    either layer; ``logit_softcap``: the final-logit cap's calls (Gemma 2's 30; the rest is
    without it); Gemma 2 also ``attn_softcap``: one layer's attention-score cap (50) in HF's
    eager attention (with the cap less without it: divide, tanh, multiply on the ``[B, h, L, L]``
    scores and their backward). :data:`WINDOW_FAMILIES` (Mistral, SmolLM3): ``layer`` without a
    window, ``window`` a sliding layer's calls beyond it, ``window_rest`` the rest's beyond the
    rest (the mask built once for the layers: none is built without a sliding layer);
    :data:`ROPE_FAMILIES` (SmolLM3): ``layer`` a NoPE layer, ``rope`` a rotating layer's calls
    beyond it (the rest is checked to be the same)."""
    gemma = family in GEMMA_FAMILIES
    kw: dict[str, Any] = {"layer_type": "full_attention"} if gemma else {}
    if family in ROPE_FAMILIES:
        kw["rope"] = False
    if family == "gemma2":
        kw["final_cap"] = None
    layer, rest = _layer_rest(family, **kw)
    parts = {"layer": layer, "rest": rest}
    if family in TIED_FAMILIES:
        _, tied = _layer_rest(family, tied=True, **kw)
        parts["tied"] = _difference(family, tied, rest, "the tied embedding's rest", {"V*d"})
    if gemma:
        window, window_rest = _layer_rest(family, **(kw | {"layer_type": "sliding_attention"}))
        if window_rest != rest:
            raise SystemExit(f"{family}: the rest changes with the layers' attention type")
        parts["window"] = _difference(family, window, layer, "a sliding-window layer beyond a full one")
    if family in WINDOW_FAMILIES:  # every layer sliding, against none: the layers' mask calls and the rest's
        window, window_rest = _layer_rest(family, **(kw | {"window": True}))
        parts["window"] = _difference(family, window, layer, "a sliding-window layer beyond a full one")
        parts["window_rest"] = _difference(family, window_rest, rest, "the sliding window's mask in the rest")
    if family in ROPE_FAMILIES:  # the layer a NoPE one (kw), the rotary's calls a part
        rotating, rotating_rest = _layer_rest(family, **(kw | {"rope": True}))
        if rotating_rest != rest:
            raise SystemExit(f"{family}: the rest changes with the layers' rotary")
        parts["rope"] = _difference(family, rotating, layer, "a rotating layer beyond a NoPE one")
    if family in FUSED_QKV:  # Phi-3-mini's whole-head rotary beyond the partial census at rd = hd
        parts["full_rotary"] = _full_rotary(family, layer, rest)
    if family == "gemma2":
        _, capped = _layer_rest(family, **(kw | {"final_cap": 30.0}))
        parts["logit_softcap"] = _difference(family, capped, rest, "the final-logit cap", {"T*V"})
        def step(n: int, cap: float | None) -> Counter[tuple[str, ...]]:  # its calls and kernels, not its host work
            c = _counts(*census(family, n, **kw, attn="eager", attn_cap=cap))
            return Counter({k: v for k, v in c.items() if k[0] != "host"})

        one = _difference(family, step(1, GEMMA2_ATTN_CAP), step(1, None), "the attention-score cap", {"T*h*L"})
        if _difference(family, step(2, GEMMA2_ATTN_CAP), step(2, None), "the attention-score cap") != one + one:
            raise SystemExit(f"{family}: two layers' attention-score cap is not twice one layer's")
        parts["attn_softcap"] = one
    out: dict[str, object] = {part: [[*k, v] for k, v in sorted(d.items()) if len(k) == 4] for part, d in parts.items()}
    out["kernels"] = {part: {ph: d.get(("kernels", ph), 0) for ph in ("fwd", "bwd")} for part, d in parts.items()}
    return out


def _full_rotary(family: str, layer: Counter[tuple[str, ...]],
                 rest: Counter[tuple[str, ...]]) -> Counter[tuple[str, ...]]:  # fmt: skip
    """Phi-3's part ``full_rotary``: its census is taken at a partial rotary (PARTIAL_DIMS), while
    Phi-3-mini rotates whole heads (``partial_rotary_factor`` 1.0, PHI3_FULL). There Phi3's
    apply_rotary_pos_emb still concatenates the (empty) pass-through part back and its empty
    slice's gradient is a zero-filled q- or k-sized buffer, but ``q[..., :rotary_dim]`` covering
    the whole head is no slice (PyTorch's indexing returns the tensor itself), so the rotated
    slices' backward is not run. The part is the step at that factor (its sizes named by the
    dense symbols and ``T*qkv``) less the census with ``rd = hd`` (the rotated widths read as the
    whole heads', the passed ones as none), signed; the rest must not change."""
    whole = {"T*qr": "T*q", "T*qr/2": "T*q/2", "T*kvr": "T*kv", "T*kvr/2": "T*kv/2", "T*hdr": "T*hd",
             "T*hdr/2": "T*hd/2"}  # fmt: skip

    def at_whole(c: Counter[tuple[str, ...]]) -> Counter[tuple[str, ...]]:
        out: Counter[tuple[str, ...]] = Counter()
        for k, v in c.items():
            if len(k) == 4 and k[2] in ("T*qp", "T*kvp"):
                continue  # no element passed through
            out[(*k[:2], whole.get(k[2], k[2]), k[3]) if len(k) == 4 else k] += v
        return out

    full_layer, full_rest = _layer_rest(family, factor=PHI3_FULL)
    if at_whole(rest) != full_rest:
        raise SystemExit(f"{family}: the rest changes with the rotary factor")
    partial = at_whole(layer)
    keys = full_layer.keys() | partial.keys()
    diff = Counter({k: full_layer[k] - partial[k] for k in keys if full_layer[k] - partial[k]})
    if not diff or any(len(k) == 4 and (k[0] != "bwd" or k[1] != "slice_backward") for k in diff):
        raise SystemExit(f"{family}: the whole-head rotary is not the partial one less its slices' backward: {diff}")
    return diff


FAMILIES = ("llama", "qwen3", "gpt2", "gemma", "granite", "mixtral", "mixtral_grouped", "qwen3_moe",
            "qwen3_moe_grouped", *GEMMA_FAMILIES, *MORE_FAMILIES, "olmoe", "olmoe_grouped")  # the JSON's order


def family_entry(family: str) -> dict[str, object]:
    """One family's census, as :func:`main` writes it."""
    if family in ("mixtral", "qwen3_moe", "olmoe"):
        return _moe_family(family)
    if family.endswith("_grouped"):
        return _grouped_family(family)
    return _dense_family(family)


def main(argv: list[str] | None = None) -> int:
    import argparse

    import torch
    import transformers

    from trainsim.ir.serialize import write_text_atomic

    ap = argparse.ArgumentParser(description="rewrite the eager kernel census JSON")
    ap.add_argument("--families", nargs="+", choices=FAMILIES, metavar="FAMILY",
                    help=f"count only these ({', '.join(FAMILIES)}); the JSON's others are kept as they are "
                         "(its transformers version must be the installed one)")  # fmt: skip
    args = ap.parse_args(argv)
    only = tuple(args.families or FAMILIES)

    doc: dict[str, object] = {
        "what": "bytes moved by the memory-bound kernels of HuggingFace eager training steps (forward, loss, backward), "
                "per layer and for the rest of the model; each entry: phase, aten call, tensor size (product of symbols: "
                "T tokens, d hidden, q/kv query/key widths, f MLP width, V vocabulary, hd head size), dtype (bfloat16 "
                "stands for the training dtype), count (tensors of that size read or written by those calls); kernels: the calls per part and phase; "
                "an MoE family (mixtral) also: Te tokens per expert, k top-k, E experts, weight sizes (2f*d, E*2f*d, ...); part expert: "
                "one expert's turn in the loop (times the experts hit); mixtral_grouped (transformers 5's default grouped_mm): T*k token-expert "
                "pairs and their rows (T*k*d, ...), qwen3_moe and qwen3_moe_grouped the same for Qwen3-MoE (T*h: tokens x heads); qwen3: dense Qwen3 (LLaMA's and per-head q/k norms), part experts: the experts module's calls but its grouped GEMMs; host: aten calls by kind, syncs and autograd nodes per part "
                "(block: the layer's beyond a LLaMA layer's); llama, qwen3, gemma2, gemma3 (untied in layer and rest): part tied, the add "
                "of a tied embedding's two gradients (V*d); gemma2, gemma3 (Gemma2ForCausalLM, Gemma3ForCausalLM; layer: a full-attention "
                "layer): part window, a sliding-window layer's calls beyond it (SDPA with the window's mask, T*L: tokens x keys), "
                "logit_softcap (gemma2: the final-logit cap), attn_softcap (gemma2: one layer's attention-score cap in HF's eager "
                "attention, T*h*L: tokens x heads x keys); gemma, granite (GemmaForCausalLM, GraniteForCausalLM with granite-3.0-8b's "
                "multipliers; ModelSpec.hf_family): as llama's; mistral, cohere, phi, glm, glm4, smollm3, phi3 (their *ForCausalLM, "
                "untied, part tied): mistral, smollm3 and phi3 also part window (a sliding layer's calls beyond a full one) and "
                "window_rest (the rest's beyond the rest: the window's mask, built once a layer slides), smollm3's layer a "
                "NoPE one and part rope (a rotating layer's calls beyond it), phi, glm, glm4 partial rotary (T*qr, T*kvr the "
                "rotated query/key widths, T*qp, T*kvp those passed through, T*hdr the rotated head dims); phi3 (Phi3ForCausalLM) "
                "partial rotary too, T*qkv its fused q/k/v projection's output (q + 2 kv wide), part full_rotary "
                "(signed): a whole-head rotary's calls beyond the census at rd = hd (q[..., :hd] is no slice: the rotated "
                "slices' backward is not run); olmoe, "
                "olmoe_grouped (OlmoeForCausalLM): as mixtral's and mixtral_grouped",
        "command": "python scripts/hf_eager_census.py",
        "versions": {"torch": torch.__version__.split("+")[0], "transformers": transformers.__version__},
        "families": {},
    }
    if only != FAMILIES:  # the other families as the JSON has them
        old = json.loads(OUT.read_text(encoding="utf-8"))
        if old["versions"] != doc["versions"]:
            raise SystemExit(f"{OUT} was counted with {old['versions']}, {doc['versions']} installed: re-run all families")
        doc["families"] = {f: v for f, v in old["families"].items() if f not in only}
    for family in only:
        print(family, file=sys.stderr)
        doc["families"][family] = family_entry(family)  # type: ignore[index]
    doc["families"] = {f: doc["families"][f] for f in FAMILIES if f in doc["families"]}  # type: ignore[index]
    write_text_atomic(OUT, json.dumps(doc, indent=1) + "\n")  # (creates the folder)
    print(OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
