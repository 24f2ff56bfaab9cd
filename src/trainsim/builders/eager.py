"""HuggingFace eager kernels: the memory-bound work an unfused model runs (``Plan.impl = "hf"``).

Paper 001's operators are Megatron's fused kernels: one per norm, activation, rotary embedding,
residual add and loss. A HuggingFace model trained in eager PyTorch runs each of them as several
aten calls: ``LlamaRMSNorm`` upcasts to fp32 and takes pow, mean, rsqrt, two multiplies and two
casts (forward), about twice that backward; ``apply_rotary_pos_emb`` slices, negates and
concatenates; the loss upcasts the whole ``[tokens, vocabulary]`` logits to fp32. On the H100
captures of ``validate llm`` (``h100-llama``, ``h100-gpt2``) this work took 2x what the fused
operators predict (docs/gpu.md).

``builders/data/hf_eager_census.json`` (``scripts/hf_eager_census.py``) lists, per family, the
tensors those calls read and write in one layer and in the rest of the model (embedding, final
norm, head, loss), each size a product of the model's symbols. Here the bytes are evaluated for
the model and plan, split evenly over the census's kernel count, and each kernel timed as an
element-wise add moving the same bytes (the device's own ``res_add``/``elementwise`` model, so a
small kernel keeps its launch-bound floor). GEMMs, attention, the embedding lookup and the loss's
gather are the builder's own operators and are not in the census.

The census's kernels run slower than the bench's contiguous adds at the same bytes: rotary and
norm multiplies broadcast and mix bf16 with fp32 (PyTorch's non-vectorized element-wise path),
``cat`` gathers strided halves, and ``fill_``/``copy_`` calls that zero and move gradients are
not in the census. Where a device has Kineto traces of such steps, the census time is scaled by
a measured factor (``builders/data/hf_eager_calibration.json``, written by
``scripts/hf_eager_factor.py``): on the H100, 1.33 (1.40 before the bench answers were held to
their best measured DRAM bandwidth, 2026-12-01), the median over the ten ``h100-llama``
captures of (the step's memory-bound kernel time less the builder's own memory-bound operators)
/ (the census's time); the other capture sets are held out (docs/gpu.md). A device without a
factor keeps 1.0 and its provenance says ``eager-factor-uncalibrated``.

MoE (Mixtral, Qwen3-MoE), two censuses, one per transformers 5 experts implementation
(``Plan.hf_experts``). ``mixtral_grouped`` (``experts_implementation="grouped_mm"``, what
transformers 5 picks when none is asked for: ``get_correct_experts_implementation``): the
token-expert pairs sorted by expert (``torch.sort``), the hidden states gathered in that order,
per-expert offsets (``histc`` and ``cumsum`` of E numbers), ``torch.nn.functional.grouped_mm``
over all experts for the gate/up and the down projections, the routing weights' product (fp32:
the router's weights are), the pairs gathered back to token order and summed over the top-k;
backward the gathers' scatters (``index_put``), and two grouped GEMMs per projection (input and
weight gradients, the latter written per expert by the kernel: nothing zeroed beyond it). Its
``experts`` part holds those calls but the grouped GEMMs (the builder's, :meth:`LayerCoster.mlp`);
the census is the same at each expert count it was taken at: no per-expert call. ``mixtral``
(``experts_implementation="eager"``): the eager expert loop. The census holds the layer's calls
but its experts' (``layer``), one expert's turn in
the loop (``expert``: the gather of its tokens, the routing weight's multiply, ``index_add_``;
backward ``select_backward``'s zeroed ``[E, 2f, d]`` and ``[E, d, f]`` gradients and autograd's
sum of them, a cost that grows as E²), and the rest. Both were recorded with even routing, so an
expert gets ``Te = T k / E`` tokens and every expert is hit (:func:`experts_hit`); the builder
runs one GEMM pair per expert on ``Te`` tokens one after another (``LayerCoster.mlp``: for the
grouped GEMM too, as the Megatron path times its experts) and the router's GEMM. The experts'
memory-bound calls get no eager factor (uncalibrated: the factor was measured on LLaMA's
calls); their host dispatch and device-to-host syncs are counted in the census (``host``) and
priced by :func:`expert_loop_host`. transformers 4.x's experts (an ``nn.ModuleList`` of
per-expert ``nn.Linear`` modules) are not modelled. Qwen3-MoE (per-head q/k norms) has its own
pair, ``qwen3_moe_grouped`` and ``qwen3_moe`` (since 2026-12-04; it had taken Mixtral's), taken
from transformers' ``Qwen3MoeForCausalLM`` with ``norm_topk_prob`` on (Qwen3-30B-A3B's): its
router casts the top-k weights back to bf16, so the routing product, the gather back and the
top-k sum are bf16 (Mixtral's weights stay fp32, and so do those ``T k d`` tensors); its layer
adds the q/k RMSNorms (fp32, over each head: ``T*h`` the statistics) and rotates ``q``-wide
queries (Qwen3-30B-A3B's 32 x 128 is twice its hidden size).

Dense models: ``llama`` (transformers' ``LlamaForCausalLM``) and, for per-head q/k norms
(Qwen3; Gemma 3 takes it too), ``qwen3`` (``Qwen3ForCausalLM``: LLaMA's calls and the q/k
RMSNorms), since 2026-12-03; both recorded with a query width (12 heads x 10) that is neither
the hidden size nor the key width, so the rotary's query half, the attention output and
o_proj's input are ``T*q`` (recorded with ``q = d`` until then, they were ``T*d``: Qwen3-0.6B's
``q = 2 d`` and Gemma's were undercounted; LLaMA's and Mistral's ``q = d``, unchanged).

Gemma 2 and Gemma 3 (``gemma2``, ``gemma3``, since 2026-12-03; LLaMA's and Qwen3's before):
``Gemma2ForCausalLM`` and ``Gemma3ForCausalLM`` at the dense censuses' sizes, four (1 + weight)
RMSNorms a layer in fp32, GeLU-tanh GeGLU, the embedding scaled by sqrt(d), Gemma 3's per-head
q/k norms. ``layer`` is a full-attention layer; ``window`` what a sliding-window layer adds under
SDPA with its mask (K and V repeated to the query heads, the boolean ``[B, 1, L, L]`` mask made
additive), added on :func:`sdpa_window_layers`' share of the layers (Gemma 2's too:
its modules refuse SDPA, so its census runs transformers' SDPA forward under another name, a
stand-in for the FlashAttention-2 or eager attention HF's Gemma 2 really runs); ``logit_softcap`` the final-logit cap (Gemma 2's),
added to the rest where the model has one; ``attn_softcap`` (Gemma 2) the attention-score cap in
HF's eager attention, ``T*h*L``: added to the attention core with a non-flash ``--attention``
(:meth:`trainsim.builders.costs.LayerCoster.attention_core`; FlashAttention-2 caps in the kernel). Every dense census but GPT-2's (whose config ties them, its rest has it) was recorded
with untied embeddings and has a part ``tied``: the add of a tied embedding's two gradients
(V*d), added to the rest of a model with ``tied_embeddings``.

Gemma 1 and Granite (``gemma``, ``granite``, since 2026-12-04): ``GemmaForCausalLM`` (two
(1 + weight) fp32 RMSNorms a layer, GeLU-tanh GeGLU, the embedding scaled by sqrt(d)) and
``GraniteForCausalLM`` (LLaMA's modules, its four multipliers: the embedding's and two residual
branches' multiplies, the logits divided by ``logits_scaling``, ``T*V``) at the dense censuses'
sizes. Their shapes are LLaMA's, so the reader names the family (``ModelSpec.hf_family``) and
:func:`family_of` takes it; a model whose ``hf_family`` has no census is refused rather than
priced by another family's calls. Every census family is a valid ``hf_family``
(:data:`HF_FAMILY_CENSUSES`: a YAML spec may name ``llama`` or ``mistral`` too, refused until
2026-12-04), an MoE one (:data:`HF_MOE_FAMILIES`) for an MoE model only. What a model runs and
its census has no part for (a window in Qwen3's or Mixtral's, a partial rotary or NoPE layers
in a census that rotates every layer's whole heads) is not modelled, and predict says so
(:func:`census_omissions`).

Cohere, Phi, GLM, GLM-4, SmolLM3 and OLMoE (since 2026-12-04; refused before), each from its
own ``*ForCausalLM`` by ``hf_family``: Cohere's parallel block on one bias-free fp32 LayerNorm,
its interleaved fp32 rotary and the ``logit_scale`` multiply of the ``[T, V]`` logits; Phi's
parallel block, LayerNorm, dense gelu_new MLP, biases (their gradients' sums, the output
bias's over ``[T, V]``) and partial rotary; GLM's and GLM-4's interleaved partial rotary, fused
gate/up and (GLM-4) the norms after attention and after the MLP. The partial rotary's sizes
are their own symbols (``T*qr``/``T*kvr`` the rotated query/key widths, ``T*qp``/``T*kvp``
those passed through, ``T*hdr`` its cos/sin: :attr:`ModelSpec.rotary_dims`, the config's
``partial_rotary_factor``). SmolLM3's ``layer`` is a NoPE layer and part ``rope`` the rotary's
calls, added on :attr:`ModelSpec.rope_share`. OLMoE has a pair of MoE censuses as Mixtral's
(``olmoe_grouped``, ``olmoe``: its q/k RMSNorms over the whole projections, the router's
weights cast back to bf16, ``norm_topk_prob`` off). A sliding window (Mistral; Qwen2 with
one, whose LLaMA-like modules take Mistral's census; Phi-3; SmolLM3 with
``use_sliding_window``) adds part ``window`` on the masked layers and ``window_rest``, the
mask transformers builds once for them (none is built without a sliding layer), from
``seq >= window`` (:func:`sdpa_window_layers`); Mistral's layer and rest are LLaMA's, call
for call.

Phi-3 (``phi3``, since 2026-12-04; Mistral's before, which priced LLaMA's separate projections
and whole-head rotary): ``Phi3ForCausalLM``'s fused ``qkv_proj``, whose q, k and v are slices
of one ``T*qkv`` output (``q + 2 kv`` wide: each slice's backward writes a zero-filled
``T*qkv`` gradient, and autograd adds the three), its fused ``gate_up_proj`` chunked in two,
and its ``apply_rotary_pos_emb``, which rotates ``rotary_dim`` of each head's dims and
concatenates the rest back whatever ``partial_rotary_factor`` is (the partial-rotary symbols).
Taken at a partial rotary; at a whole-head one (Phi-3-mini's 1.0) the concatenation still
copies q and k and the empty pass-through slice's gradient is still a zero-filled q- or k-wide
buffer, but ``q[..., :head_dim]`` is the tensor itself (PyTorch's indexing makes no slice), so
the rotated slices' backward is not run: part ``full_rotary`` (signed) takes it off there. Its
window parts are Mistral's kind.

Approximations (stated): one census per family, recorded at the family's default configuration
(GPT-2's dropout 0.1 on the residual stream; attention dropout runs inside the attention kernel);
the CPU's decomposition of dropout (``bernoulli_`` then ``div_``) is dropped, leaving the
multiply that a GPU's fused dropout kernel does in one pass; in fp32 training the casts to fp32
copy nothing and are dropped; small tensors with no token dimension (norm weights, the cos/sin
table) are not counted; the rest of the model is charged to the last pipeline stage (with
pipeline parallelism the embedding side belongs to the first; HF eager training rarely pipelines).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainsim.builders.spec import ModelSpec
from trainsim.errors import ConfigError

if TYPE_CHECKING:
    from trainsim.builders.costs import HostModel

CENSUS = Path(__file__).parent / "data" / "hf_eager_census.json"
CALIBRATION = Path(__file__).parent / "data" / "hf_eager_calibration.json"
_DTYPE_BYTES = {"float32": 4, "int64": 8, "bool": 1}
_CPU_DROPOUT = ("bernoulli_", "div_")  # the CPU's dropout decomposition (a GPU fuses it into one kernel)
# transformers 5's experts implementations priced (Plan.hf_experts), its default first
HF_EXPERTS: tuple[str, ...] = ("grouped_mm", "eager")
# ModelSpec.hf_family values, one for each family with a census (scripts/hf_eager_census.py's
# FAMILIES, an MoE family's pair under its own name): the families the architecture fields tell
# apart (:func:`family_of` takes them from the fields when hf_family is unset), then those they
# do not (their readers set hf_family); any other value is refused under impl hf
FIELD_FAMILIES: tuple[str, ...] = ("llama", "mistral", "qwen3", "gpt2", "gemma2", "gemma3", "mixtral", "qwen3_moe")
NAMED_FAMILIES: tuple[str, ...] = ("gemma", "granite", "cohere", "phi", "glm", "glm4", "smollm3", "olmoe", "phi3")
HF_FAMILY_CENSUSES: tuple[str, ...] = FIELD_FAMILIES + NAMED_FAMILIES
# each hf_family's modules as predict's notes name them (an MoE family's for both its censuses)
CENSUS_LABELS: dict[str, str] = {
    "llama": "LLaMA", "mistral": "Mistral", "qwen3": "Qwen3", "gpt2": "GPT-2", "gemma2": "Gemma 2", "gemma3": "Gemma 3",
    "mixtral": "Mixtral", "qwen3_moe": "Qwen3-MoE", "gemma": "Gemma", "granite": "Granite", "cohere": "Cohere",
    "phi": "Phi", "glm": "GLM", "glm4": "GLM-4", "smollm3": "SmolLM3", "olmoe": "OLMoE", "phi3": "Phi-3"}  # fmt: skip
# the MoE hf_family values, whose censuses come one per experts implementation (grouped_mm's
# has the suffix), for MoE models only
HF_MOE_FAMILIES: tuple[str, ...] = ("mixtral", "qwen3_moe", "olmoe")
# the census size symbols of a partial rotary (Phi's, GLM's): a census with none rotates whole heads
_PARTIAL_ROTARY_SYMBOLS = frozenset({"T*qr", "T*qr/2", "T*kvr", "T*kvr/2", "T*qp", "T*kvp", "T*hdr", "T*hdr/2"})


@cache
def _census() -> dict[str, Any]:
    try:
        doc = json.loads(CENSUS.read_text(encoding="utf-8"))
        families = doc["families"]
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"{CENSUS}: expected the JSON written by scripts/hf_eager_census.py ({e})") from None
    if not isinstance(families, dict):
        raise ConfigError(f"{CENSUS}: field 'families' must be an object")
    return families


@cache
def _factors() -> dict[str, float]:
    try:
        doc = json.loads(CALIBRATION.read_text(encoding="utf-8"))
        out = {str(name): float(entry["factor"]) for name, entry in doc["devices"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"{CALIBRATION}: expected the JSON written by scripts/hf_eager_factor.py, "
                          f"devices.<name>.factor a number ({e})") from None  # fmt: skip
    if not all(0.5 <= f <= 4.0 for f in out.values()):
        raise ConfigError(f"{CALIBRATION}: a factor outside [0.5, 4]: {out}")
    return out


def eager_factor(names: tuple[str, ...]) -> tuple[float, str]:
    """(factor, provenance note) for the census's time on the device known by ``names`` (its
    name and aliases): the measured factor where its traces gave one, else 1.0."""
    factors = _factors()
    for name in names:
        if name in factors:
            return factors[name], f";eager-factor:{factors[name]:.3f}"
    return 1.0, ";eager-factor-uncalibrated"


def family_of(model: ModelSpec, experts: str = "grouped_mm") -> str:
    """The census family whose modules ``model`` is built of, or a one-line error; an MoE
    model's is that of its ``experts`` implementation (:data:`HF_EXPERTS`). A model whose
    ``hf_family`` is set (a family whose modules the architecture fields do not tell from
    another's: Gemma 1, Granite, ...; or any census family a YAML spec names) takes that
    family's census, or is refused when there is none (its eager calls differ from the family
    the fields imply: a stand-in would mis-price)."""
    if model.hf_family:
        return _named_family(model, experts)
    llama_like = model.norm == "rmsnorm" and model.position == "rotary" and model.gated
    if llama_like and not model.is_moe and model.activation == "geglu" and model.layer_norms == 4:
        # Gemma 2 / Gemma 3 (per-head q/k norms): four (1 + weight) RMSNorms a layer, GeLU-tanh, their own censuses
        return "gemma3" if model.qk_norm == "head" else "gemma2"
    if llama_like and not model.is_moe:
        # Qwen3: LLaMA's modules and per-head q/k RMSNorms, its own census; a sliding window
        # (Mistral's; Qwen2's): Mistral's, LLaMA's calls and the window's mask calls (Phi-3's
        # reader names its own census, hf_family phi3: its fused projections and rotary differ)
        if model.qk_norm == "head":
            return "qwen3"
        return "mistral" if model.sliding_window else "llama"
    if model.norm == "layernorm" and model.position == "learned" and not model.gated and not model.is_moe:
        return "gpt2"
    if llama_like and model.is_moe and not (model.mla or model.shared_ffn_hidden or model.router_bias
                                            or model.attention_sinks):  # fmt: skip
        # Qwen3-MoE (per-head q/k norms): its own census, its router casting the routing
        # weights back to bf16 (Mixtral's stay fp32, and so does its experts' weighted sum)
        base = "qwen3_moe" if model.qk_norm == "head" else "mixtral"
        return base if experts == "eager" else f"{base}_grouped"
    raise ConfigError(f"plan: impl 'hf' has a kernel census for LLaMA-style (RMSNorm, rotary, gated MLP; Gemma 2/3), "
                      f"GPT-2-style (LayerNorm, learned positions, GELU) and Mixtral-style MoE (LLaMA's with routed "
                      f"experts only: no shared expert, router bias, MLA or attention sinks) models; "
                      f"{model.name} is none of them")  # fmt: skip


def _named_family(model: ModelSpec, experts: str) -> str:
    """:func:`family_of` for a model whose ``hf_family`` is set: that family's census (an MoE
    family's for ``experts``), or a one-line error naming the field."""
    fam = model.hf_family
    if fam not in HF_FAMILY_CENSUSES:
        raise ConfigError(f"model {model.name}: field 'hf_family' is {fam!r}, and impl 'hf' has no kernel census of "
                          f"transformers' {fam!r} modules (no other family's stands in for its eager calls); valid "
                          f"values: {', '.join(HF_FAMILY_CENSUSES)}, or none (the family the architecture fields "
                          f"describe); give --impl fused (Megatron-style kernels), or add the family to "
                          f"scripts/hf_eager_census.py and scripts/hf_activation_census.py")  # fmt: skip
    moe = fam in HF_MOE_FAMILIES
    if moe != model.is_moe:
        which = "an MoE family's (its census prices routed experts)" if moe else "a dense family's"
        raise ConfigError(f"model {model.name}: field 'hf_family' is {fam!r}, {which}, but the model "
                          f"{'has no' if moe else 'has'} experts (num_experts {model.num_experts}); MoE values: "
                          f"{', '.join(HF_MOE_FAMILIES)}")  # fmt: skip
    if moe:
        return fam if experts == "eager" else f"{fam}_grouped"
    return fam


def tokens_per_expert(model: ModelSpec, tokens: float) -> float:
    """``Te``: the tokens one expert gets from ``tokens`` under even routing, ``T k / E``."""
    return tokens * model.top_k / model.num_experts if model.is_moe else 0.0


def experts_hit(model: ModelSpec, tokens: float) -> int:
    """The experts HF's loop runs (those that got a token): all of them under even routing once
    the ``T k`` token-expert pairs cover them."""
    return min(model.num_experts, int(tokens * model.top_k)) if model.is_moe else 0


def symbols(model: ModelSpec, tokens: float, seq: float) -> dict[str, float]:
    """Each census symbol's value: ``T`` tokens of one micro-batch on one GPU, ``L`` its sequence;
    an MoE model's also ``Te`` (:func:`tokens_per_expert`), ``k``, ``E``, its expert width ``f``
    (``ffn_hidden`` elsewhere) and the expert weights' sizes."""
    d, f = float(model.hidden), float(model.expert_ffn if model.is_moe else model.ffn)
    r = float(model.rotary_dims)  # partial rotary (Phi, GLM, Phi-3): the rotated and passed widths
    # qkv: Phi-3's fused q/k/v projection's output, q + 2 kv wide (its slices' gradients)
    per_token = {"d": d, "f": f, "q": float(model.q_width), "kv": float(model.kv_width), "hd": float(model.d_head),
                 "qkv": float(model.q_width + 2 * model.kv_width),
                 "V": float(model.vocab), "2f": 2 * f, "3d": 3 * d, "4d": 4 * d, "qr": model.heads * r,
                 "kvr": model.n_kv * r, "hdr": r, "qp": model.q_width - model.heads * r,
                 "kvp": model.kv_width - model.n_kv * r}  # fmt: skip
    out = {"T": tokens, "L*d": seq * d, "L*L": seq * seq, "T*L": tokens * seq, "V*d": model.vocab * d,
           "T*h": tokens * model.heads, "T*h*L": tokens * model.heads * seq}  # fmt: skip
    for name, w in per_token.items():
        out[f"T*{name}"] = tokens * w
        out[f"T*{name}/2"] = tokens * w / 2
    if model.is_moe:
        te, k, e = tokens_per_expert(model, tokens), float(model.top_k), float(model.num_experts)
        out |= {"Te": te, "Te*d": te * d, "Te*f": te * f, "Te*2f": te * 2 * f, "T*k": tokens * k, "T*E": tokens * e,
                "T*k*(E+1)": tokens * k * (e + 1), "2f*d": 2 * f * d, "d*f": d * f, "E*2f*d": e * 2 * f * d,
                "E*d*f": e * d * f, "T*k*d": tokens * k * d, "T*k*f": tokens * k * f,
                "T*k*2f": tokens * k * 2 * f}  # fmt: skip
    return out


def eager_bytes(model: ModelSpec, part: str, phase: str, *, tokens: float, seq: float,
                dtype_bytes: int, experts: str = "grouped_mm") -> tuple[float, int]:  # fmt: skip
    """(bytes moved, kernels) by one micro-batch's eager calls of ``part`` ("layer": one layer,
    its experts' calls left out for an MoE family; "expert": one expert's turn in the eager
    loop; "experts": the grouped_mm experts module's calls; "rest": the rest of the model) in
    ``phase`` ("fwd" or "bwd"); kernels: the census's calls of that part and phase (the fp32
    casts dropped in fp32 training are still counted: a few). ``experts``: an MoE model's
    experts implementation (:func:`family_of`). The sum of :func:`eager_parts`."""
    parts = eager_parts(model, part, phase, tokens=tokens, seq=seq, dtype_bytes=dtype_bytes, experts=experts)
    total = sum(share * nbytes for share, nbytes, _ in parts)
    return total, max(round(sum(share * kernels for share, _, kernels in parts)), 1)


def eager_parts(model: ModelSpec, part: str, phase: str, *, tokens: float, seq: float,
                dtype_bytes: int, experts: str = "grouped_mm") -> list[tuple[float, float, int]]:  # fmt: skip
    """:func:`eager_bytes`' census parts one by one, (share, bytes, kernels) each: ``part``
    itself at share 1 and the extras that make it for ``model`` (:func:`_with_extras`: a
    sliding-window layer's calls on the share of layers masked, a tied embedding's add, the
    final-logit cap), each part's bytes and kernels those of one whole instance of it (a
    windowed layer's window calls, not their average over the layers)."""
    family = family_of(model, experts)
    fam = _census()[family]
    if part not in fam:
        raise ConfigError(f"{CENSUS}: family {family!r} has no part {part!r}")
    sym = symbols(model, tokens, seq)
    out = []
    for name, share in _with_extras(model, fam, part, seq):
        total = 0.0
        for ph, call, size, dtype, count in fam[name]:
            if ph != phase or call in _CPU_DROPOUT or (call == "_to_copy" and dtype_bytes == 4):
                continue
            if size not in sym:
                raise ConfigError(f"{CENSUS}: unknown size symbol {size!r} in family {family!r}")
            total += count * sym[size] * (dtype_bytes if dtype == "bfloat16" else _DTYPE_BYTES.get(dtype, 4))
        out.append((share, total, int(fam["kernels"][name][phase])))
    return out


def census_omissions(model: ModelSpec, seq: int, experts: str = "grouped_mm") -> list[str]:
    """What ``model`` runs in transformers that its kernel census (:func:`family_of`) has no
    part for, one phrase each, for predict's note (never left out silently): a sliding window's
    mask calls on the layers transformers masks at ``seq`` (:func:`sdpa_window_layers`) in a
    census without a ``window`` part (Qwen3's, Mixtral's, LLaMA's: their layers are costed as
    full-attention ones); a partial rotary (``rope_fraction`` < 1) in a census whose rotary
    turns whole heads (no partial-rotary symbol: its rotary calls are evaluated at the full
    head width); NoPE layers (``nope_layers``) in a census without a ``rope`` part (every layer
    costed as rotating). The activation census of each family has the same parts (a test
    checks it), so the memory leaves out the same."""
    fam = _census()[family_of(model, experts)]
    out = []
    share = sdpa_window_layers(model, seq)
    if share and "window" not in fam:
        n = round(share * model.layers)
        out.append(f"the sliding window's mask ({model.sliding_window:,} tokens, on {n} of its {model.layers} layers: "
                   "SDPA with the window's additive [b, 1, s, s] mask, K/V repeated to the query heads, and the "
                   "boolean mask built once), its calls and the memory they keep; those layers are costed as "
                   "full-attention ones")  # fmt: skip
    partial = any(size in _PARTIAL_ROTARY_SYMBOLS for ph in ("layer", "rope") for _, _, size, _, _ in fam.get(ph, []))
    if model.rope_fraction < 1 and not partial:
        out.append(f"its partial rotary (rope_fraction {model.rope_fraction:g}: {model.rotary_dims} of each head's "
                   f"{model.d_head} dims rotate, the rest pass through, and transformers' partial-rotary modules "
                   "slice q and k and concatenate the two parts back): the census's rotary turns whole heads and "
                   "is evaluated at the full head width")  # fmt: skip
    if model.nope_layers and "rope" not in fam:
        out.append(f"its {model.nope_layers} NoPE layers (nope_layers: no rotary embedding there): every layer is "
                   "costed with the census's rotary calls")  # fmt: skip
    return out


def sdpa_window_layers(model: ModelSpec, seq: int) -> float:
    """The share of ``model``'s layers that transformers runs with a sliding-window mask at
    ``seq`` tokens: its masking_utils builds one whenever the keys reach the window,
    ``kv_length >= sliding_window`` (``_ignore_causal_mask_sdpa``: "if local_attention_size is
    not None and kv_length >= local_attention_size: return False", transformers 5.24), at a
    sequence of exactly the window too, where the mask is the causal one but still made (and
    SDPA then gets K/V repeated). :meth:`ModelSpec.windowed_layers` is the kernel's view, whose
    window covers such a sequence: the attention work is the causal work there."""
    if not model.sliding_window or seq < model.sliding_window:
        return 0.0
    return (model.sliding_layers or model.layers) / model.layers


def _with_extras(model: ModelSpec, fam: dict[str, Any], part: str, seq: float) -> list[tuple[str, float]]:
    """The census parts that make ``part`` for ``model``, each with its share: ``layer`` and,
    in a census with one (Gemma 2/3, Mistral, SmolLM3), ``window`` on the share of layers
    transformers masks at ``seq`` (:func:`sdpa_window_layers`: SDPA with the window's mask), in
    SmolLM3's (whose ``layer`` is a NoPE one) ``rope`` on the rotating share
    (:attr:`ModelSpec.rope_share`), in Phi-3's (taken at a partial rotary) ``full_rotary`` where
    the whole head rotates (signed: the rotated slices' backward that a whole-head
    ``q[..., :rotary_dim]``, no slice, does not run); ``rest`` and, in a dense census, ``tied`` for tied
    embeddings (the add of their two gradients), ``logit_softcap`` for a final-logit cap
    (Gemma 2's) and, where the census has it (Mistral's, SmolLM3's: their model builds the
    window's mask only for a sliding layer; Gemma's always does, in its rest), ``window_rest``
    once some layer is masked."""
    out = [(part, 1.0)]
    share = sdpa_window_layers(model, int(seq)) if "window" in fam else 0.0
    if part == "layer" and share:
        out.append(("window", share))
    if part == "layer" and "rope" in fam and model.rope_share:
        out.append(("rope", model.rope_share))
    if part == "layer" and "full_rotary" in fam and model.rotary_dims == model.d_head:
        out.append(("full_rotary", 1.0))
    if part == "rest" and share and "window_rest" in fam:
        out.append(("window_rest", 1.0))
    if part == "rest":
        out += [(name, 1.0) for name, on in (("tied", model.tied_embeddings), ("logit_softcap", model.logit_softcap))
                if on and name in fam]  # fmt: skip
    return out


def expert_loop_host(model: ModelSpec, phase: str, *, tokens: float, host: HostModel,
                     experts: str = "grouped_mm") -> tuple[float, int]:  # fmt: skip
    """(CPU dispatch seconds, device-to-host syncs) of one MoE layer's eager router and experts
    in ``phase``, beyond the layer HostModel prices (its counts are a dense layer's): the
    census's host counts of the MoE layer's calls beyond a LLaMA layer's of the same size
    (``block``: router, sort and gathers (grouped_mm) or one-hot and the hit test (eager loop),
    less the dense MLP's calls, none below zero) and, for the eager loop, of each expert hit
    (``expert``), at HostModel's rates (forward: an aten call's gap and launch, a view's gap and
    CPU; backward: an autograd node's time, the launches and views inside it). Syncs:
    ``_local_scalar_dense`` and ``nonzero`` calls (the grouped_mm path makes none). (0, 0) for
    a dense model."""
    if not model.is_moe:
        return 0.0, 0
    counts = _census()[family_of(model, experts)]["host"]
    n = experts_hit(model, tokens)

    def count(name: str) -> float:
        return max(counts["block"].get(name, 0), 0) + n * counts.get("expert", {}).get(name, 0)

    if phase == "fwd":
        s = (count("fwd_launching") * (host.aten_gap_s + host.aten_launch_s)
             + count("fwd_views") * (host.aten_gap_s + host.aten_view_s))  # fmt: skip
    else:
        s = (count("bwd_nodes") * host.autograd_node_s + count("bwd_launching") * host.aten_launch_s
             + count("bwd_views") * host.aten_view_s)  # fmt: skip
    return s, int(count(f"{phase}_syncs"))
