"""What a transformer is: :class:`ModelSpec`, the architecture facts a builder needs.

One frozen record covers GPT-2/GPT-3/Megatron GPT/GPT-NeoX (MHA, GeLU, LayerNorm, learned or
rotary positions, biases), LLaMA/Mistral/Qwen (GQA, SwiGLU, RMSNorm, rotary, no biases but
Qwen2's on q/k/v) and
Mixtral-style MoE (``num_experts`` experts of ``moe_ffn_hidden``, ``top_k`` active per token),
and the MoE families beyond it: shared experts (``shared_ffn_hidden``; Qwen2-MoE's gated one),
leading or interleaved dense layers (``dense_layers``), Multi-head Latent Attention
(``kv_lora_rank`` > 0; DeepSeek-V2/V3), q/k norms (Qwen3), router biases and attention sinks
(gpt-oss), Llama 4's chunked attention (``attention_chunk``, costed as a sliding window).
Catalog entries and HuggingFace ``config.json`` files both become a ModelSpec
(:mod:`trainsim.builders.models`).

Parameter counts follow the operators the builder emits (001 Table II generalised): per
layer, attention QKV ``d × (h + 2 h_kv) d_h`` and output ``h d_h × d``, the MLP (two matrices,
three for gated activations), two norms; plus the embedding, position table, final norm and
(untied) output projection. Qwen3/Gemma 3/OLMo 2 add q/k norms (``qk_norm``), Gemma four norms
a layer and Falcon-7B one (``layer_norms``); Cohere's LayerNorms have no bias (``norm_bias``), Phi's
output projection has one (``head_bias``). The vocabulary is padded as Megatron does (001 Eq. 1–2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from trainsim.errors import ConfigError

Activation = Literal["gelu", "swiglu", "geglu", "relu"]
Norm = Literal["layernorm", "rmsnorm"]
Position = Literal["learned", "rotary", "alibi", "none"]
QKNorm = Literal["none", "head", "full", "l2"]

GATED: frozenset[str] = frozenset({"swiglu", "geglu"})


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer (see the module docstring)."""

    name: str
    hidden: int
    layers: int
    heads: int
    vocab: int  # unpadded
    ffn_hidden: int = 0  # 0: 4 × hidden (dense models)
    kv_heads: int = 0  # 0: heads (MHA); fewer: GQA/MQA
    head_dim: int = 0  # 0: hidden / heads
    seq_len: int = 2048  # default training sequence length
    activation: Activation = "gelu"
    norm: Norm = "layernorm"
    position: Position = "learned"
    bias: bool = True  # linear layers carry biases (GPT) or not (LLaMA)
    qkv_bias: bool = False  # only the q/k/v projections carry biases (Qwen2); implied by ``bias``
    tied_embeddings: bool = False
    parallel_residual: bool = False  # GPT-NeoX/GPT-J: attention and MLP read the same input
    num_experts: int = 0  # 0: dense MLP in every layer
    top_k: int = 0
    moe_ffn_hidden: int = 0  # 0: ffn_hidden
    # dense-family details (h4)
    # RMSNorm of the queries and keys after their projections: "head" over each head's d_h
    # (Qwen3, Gemma 3), "full" over the whole q and k projections (OLMo 2), "l2" (Llama 4) over
    # each head without weights, on the rotary layers alone
    qk_norm: QKNorm = "none"
    # norms per layer: 2 (before attention and MLP, or after them as OLMo 2's), 4 (Gemma 2/3:
    # before and after each), 1 (Falcon-7B: one norm feeds the parallel attention and MLP)
    layer_norms: int = 2
    logit_softcap: float = 0.0  # cap · tanh(logits / cap) on the output logits (Gemma 2); 0: none
    attn_softcap: float = 0.0  # the same on the attention scores (Gemma 2); 0: none
    # layers of ``sliding_window`` (Gemma 2: every other; Gemma 3: 5 of 6); 0: all
    sliding_layers: int = 0
    source: str = "catalog"  # "catalog", or the config.json path it was read from
    # MoE-family details (h5): Qwen2-MoE/Qwen3-MoE, gpt-oss, DeepSeek-V2/V3
    shared_ffn_hidden: int = 0  # always-active shared expert(s), their total width (DeepSeek: n_shared x moe_ffn)
    shared_expert_gate: bool = False  # Qwen2-MoE: a sigmoid gate (a d x 1 linear) on the shared expert
    router_bias: bool = False  # gpt-oss: the router linear has a bias (its experts' biases: ``bias``)
    attention_sinks: bool = False  # gpt-oss: one learned sink logit per head and layer
    dense_layers: tuple[int, ...] = ()  # an MoE model's layers (0-based) with a dense MLP of ffn_hidden
    q_lora_rank: int = 0  # MLA: q through a rank-q_lora_rank latent (0: one full-rank projection)
    kv_lora_rank: int = 0  # > 0: Multi-head Latent Attention (DeepSeek-V2/V3), K/V from this latent
    qk_rope_head_dim: int = 0  # MLA: the rotary part of head_dim (K's shared by all heads)
    v_head_dim: int = 0  # 0: head_dim; MLA's value heads
    # DeepSeek-V3 multi-token prediction (HF num_nextn_predict_layers): MTP depths after the
    # main model, each two norms, a 2d -> d projection, one block of the last layer's kind and
    # the shared head (:meth:`mtp_params`; the builders cost them on the last pipeline stage)
    mtp_layers: int = 0
    aliases: tuple[str, ...] = field(default=(), compare=False)
    # a config's attention window (Mistral's sliding_window, Gemma's, gpt-oss's): with flash
    # attention its windowed kernel does less work (:meth:`window_work_fraction`); it changes
    # costs, so it is part of the model's identity (costers key their caches by the model)
    sliding_window: int = 0
    # where a config's default sequence length came from when it is not max_position_embeddings
    # (a RoPE-scaled model's pre-training context): predict's note says so
    seq_source: str = field(default="", compare=False)
    # what a config describes and the model leaves out (gemma3's vision tower), for predict's note
    left_out: str = field(default="", compare=False)
    # more families (h6): Cohere's LayerNorm has a weight and no bias; Phi's output projection
    # has a bias (V more parameters; its gradient a reduction over the logits' gradient);
    # SmolLM3's NoPE layers apply no rotary embedding
    norm_bias: bool = True  # a LayerNorm's bias (RMSNorm has none whatever this says)
    head_bias: bool = False
    nope_layers: int = 0  # layers without the rotary embedding (0: every layer rotates)
    # partial rotary (Phi's, GLM's, Phi-3's partial_rotary_factor): the share of each head's dims
    # that rotate, int(d_head x it) of them, the rest passed through (impl hf's Phi and GLM
    # censuses price the split, the others rotate whole heads, as predict notes; the fused
    # kernels are costed over the full width)
    rope_fraction: float = 1.0
    # the transformers model_type whose eager modules ``impl hf`` prices, where the fields above
    # do not tell them apart (Gemma 1's are LLaMA's shapes with GemmaRMSNorm and a scaled
    # embedding; Granite's LLaMA's with multipliers), or any family with a census a YAML spec
    # names (trainsim.builders.eager.HF_FAMILY_CENSUSES): "" for the family the fields tell
    # (:func:`trainsim.builders.eager.family_of`)
    hf_family: str = ""
    # chunked (block-local causal) attention (Llama 4's attention_chunk_size, hf41): on
    # ``chunked_layers`` layers (0: all) the sequence is cut into chunks of ``attention_chunk``
    # tokens, causal within each and none across them; 0: none. Costed as a sliding window is
    # (:meth:`window_work_fraction` and its neighbours take either); a model has one or the other
    attention_chunk: int = 0
    chunked_layers: int = 0

    def __post_init__(self) -> None:
        for f in ("hidden", "layers", "heads", "vocab", "seq_len"):
            v = getattr(self, f)
            if not isinstance(v, int) or v <= 0:
                raise ConfigError(f"model {self.name}: {f} must be a positive integer, got {v!r}")
        for f in ("ffn_hidden", "kv_heads", "head_dim", "num_experts", "top_k", "moe_ffn_hidden",
                  "shared_ffn_hidden", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "mtp_layers",
                  "nope_layers", "attention_chunk", "chunked_layers"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 0:
                raise ConfigError(
                    f"model {self.name}: {f} must be a non-negative integer, got {v!r}"
                )
        if not self.head_dim and self.hidden % self.heads:
            raise ConfigError(
                f"model {self.name}: hidden {self.hidden} is not divisible by heads {self.heads}"
            )
        if self.kv_heads and self.heads % self.kv_heads:
            raise ConfigError(
                f"model {self.name}: heads {self.heads} is not a multiple of kv_heads {self.kv_heads}"
            )
        if self.nope_layers and (self.position != "rotary" or self.nope_layers > self.layers):
            raise ConfigError(f"model {self.name}: nope_layers ({self.nope_layers}) are rotary layers left without it: "
                              f"at most layers ({self.layers}), with position rotary")  # fmt: skip
        self._check_local_attention()
        if isinstance(self.rope_fraction, bool) or not isinstance(self.rope_fraction, int | float) or not (
                0 < self.rope_fraction <= 1):  # fmt: skip
            raise ConfigError(f"model {self.name}: rope_fraction must be a number in (0, 1], got {self.rope_fraction!r}")
        if self.layer_norms not in (1, 2, 4):
            raise ConfigError(f"model {self.name}: layer_norms must be 1, 2 or 4, got {self.layer_norms!r}")
        for f in ("logit_softcap", "attn_softcap"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int | float) or not v >= 0:
                raise ConfigError(f"model {self.name}: {f} must be a non-negative number (0: none), got {v!r}")
        if self.num_experts and not 0 < self.top_k <= self.num_experts:
            raise ConfigError(
                f"model {self.name}: top_k must be in 1..num_experts ({self.num_experts}), got {self.top_k}"
            )
        self._check_moe_family()

    def _check_local_attention(self) -> None:
        """A sliding window or chunked attention, not both, on at most ``layers`` layers."""
        if self.attention_chunk and self.sliding_window:
            raise ConfigError(f"model {self.name}: attention_chunk ({self.attention_chunk}) and sliding_window "
                              f"({self.sliding_window}) together are not modelled: give one of them")  # fmt: skip
        if self.chunked_layers and not self.attention_chunk:
            raise ConfigError(f"model {self.name}: chunked_layers ({self.chunked_layers}) needs attention_chunk "
                              "(the chunk's tokens)")  # fmt: skip
        if self.chunked_layers > self.layers or self.sliding_layers > self.layers:
            raise ConfigError(f"model {self.name}: chunked_layers ({self.chunked_layers}) and sliding_layers "
                              f"({self.sliding_layers}) must be at most layers ({self.layers}) (0: all)")  # fmt: skip

    def _check_moe_family(self) -> None:
        """The MoE-family fields' own checks (dense layers inside the model, MLA's head split)."""
        if self.dense_layers and (
            not self.is_moe
            or any(not isinstance(i, int) or not 0 <= i < self.layers for i in self.dense_layers)
            or list(self.dense_layers) != sorted(set(self.dense_layers))
        ):
            raise ConfigError(
                f"model {self.name}: dense_layers must be distinct increasing layer indices in 0..{self.layers - 1} "
                f"of an MoE model, got {self.dense_layers!r}"
            )
        if (self.shared_ffn_hidden or self.router_bias or self.shared_expert_gate) and not self.is_moe:
            raise ConfigError(f"model {self.name}: shared experts and a router bias need num_experts")
        if self.kv_lora_rank and not 0 <= self.qk_rope_head_dim < self.d_head:
            raise ConfigError(
                f"model {self.name}: qk_rope_head_dim {self.qk_rope_head_dim} must be below head_dim {self.d_head} (MLA)"
            )
        if (self.q_lora_rank or self.qk_rope_head_dim) and not self.kv_lora_rank:
            raise ConfigError(f"model {self.name}: q_lora_rank and qk_rope_head_dim describe MLA: give kv_lora_rank")

    # --- derived sizes --------------------------------------------------------------------

    def window_work_fraction(self, seq: int) -> float:
        """The attention work of a sliding-window model at ``seq`` tokens over a causal one's,
        averaged over its layers: a window of W keys leaves N·W − W²/2 of the N²/2 causal
        scores, ``2w − w²`` of them (w = W / N), on its ``sliding_layers`` (0: all); 1 when
        the window covers the sequence."""
        share = self.window_layer_share(seq)
        n_win = self._local_layers()
        return (n_win * share + (self.layers - n_win)) / self.layers

    def _local_layers(self) -> int:
        """How many layers attend locally: ``sliding_layers`` or ``chunked_layers`` (0: all)."""
        return (self.chunked_layers if self.attention_chunk else self.sliding_layers) or self.layers

    def _local_span(self) -> int:
        """The window's or the chunk's tokens (0: neither)."""
        return self.attention_chunk or self.sliding_window

    def window_layer_share(self, seq: int) -> float:
        """One windowed layer's share of the causal attention work at ``seq`` tokens, ``2w − w²``
        (:meth:`window_work_fraction`); 1 without a window or within it. A chunked layer's
        (``attention_chunk`` C): the chunks' causal scores over the sequence's, to the token,
        ``Σ c_i (c_i + 1) / 2`` over ``S (S + 1) / 2`` (:meth:`_chunk_keys`), about C / S."""
        if not self._local_span() or seq <= self._local_span():
            return 1.0
        if self.attention_chunk:
            return self._chunk_keys(seq) / (seq * (seq + 1) / 2)
        w = self.sliding_window / seq
        return 2 * w - w * w

    def _chunk_keys(self, x: float) -> float:
        """The key products of the queries before position ``x`` under chunked attention: the
        query at ``p`` meets the ``p mod C + 1`` keys of its chunk up to itself, so ``q`` whole
        chunks and a part of ``r`` tokens make ``q C (C + 1) / 2 + r (r + 1) / 2`` (``x`` need not
        be whole: a context-parallel split's chunk edges)."""
        c = self.attention_chunk
        q = math.floor(x / c)
        r = x - q * c
        return q * c * (c + 1) / 2 + r * (r + 1) / 2

    def windowed_layers(self, seq: int) -> float:
        """The share of the layers whose window (or attention chunk) is shorter than ``seq`` (0:
        none)."""
        if not self._local_span() or seq <= self._local_span():
            return 0.0
        return self._local_layers() / self.layers

    def cp_window_rank_shares(self, seq: int, cp: int) -> tuple[float, ...]:
        """Each context-parallel rank's attention work on one windowed layer at ``seq`` tokens
        over its causal work (``seq²/2cp``), under the load-balanced split Megatron and
        TransformerEngine use (``2·cp`` chunks of ``L = seq/2cp`` tokens, rank ``r`` holding
        chunks ``r`` and ``2cp − 1 − r``) and TransformerEngine's KV all-gather CP
        (``cp_comm_type="all_gather"``, the variant with the sequence split that accepts a
        window): each of the rank's two query chunks meets the gathered K/V slice its window
        reaches, and FlashAttention's ``window_size`` skips the keys outside it. A query at
        position ``p`` does ``min(p, W)`` key products (to the token, as
        :meth:`window_work_fraction`: the kernel's tiles at the window's edges not counted),
        so chunk ``[a, b)`` does ``F(b) − F(a)`` with ``F(x) = ∫₀ˣ min(p, W) dp``. The shares
        average to :meth:`window_layer_share` (the ranks together do the unsplit layer's
        work), all 1 without a window or within it; the split that balances causal work
        leaves the window's work unbalanced (rank 0's first chunk has the fewest keys)."""
        if not self._local_span() or seq <= self._local_span():
            return (1.0,) * cp
        if self.attention_chunk:
            return self._cp_chunk_rank_shares(seq, cp)
        win, chunk = float(self.sliding_window), seq / (2 * cp)

        def f(x: float) -> float:
            return x * x / 2 if x <= win else win * x - win * win / 2

        def work(c: int) -> float:
            return f((c + 1) * chunk) - f(c * chunk)

        causal = seq * seq / (2 * cp)
        return tuple((work(r) + work(2 * cp - 1 - r)) / causal for r in range(cp))

    def _cp_chunk_rank_shares(self, seq: int, cp: int) -> tuple[float, ...]:
        """:meth:`cp_window_rank_shares` for chunked attention: rank ``r``'s two sequence chunks
        ``[a, b)`` each do ``K(b) − K(a)`` key products (:meth:`_chunk_keys`), over the rank's
        causal share ``S (S + 1) / 2cp``; they average to :meth:`window_layer_share`."""
        part, causal = seq / (2 * cp), seq * (seq + 1) / (2 * cp)

        def work(c: int) -> float:
            return self._chunk_keys((c + 1) * part) - self._chunk_keys(c * part)

        return tuple((work(r) + work(2 * cp - 1 - r)) / causal for r in range(cp))

    def cp_window_work_fraction(self, seq: int, cp: int) -> float:
        """:meth:`window_work_fraction` under context parallelism: the windowed layers at the
        busiest rank's share (:meth:`cp_window_rank_shares`; the layer's collectives make the
        ranks wait for it), the full layers at 1 (the p2p ring's split balances them); with
        ``cp`` 1 the unsplit fraction."""
        if cp == 1:
            return self.window_work_fraction(seq)
        phi = self.windowed_layers(seq)
        return phi * max(self.cp_window_rank_shares(seq, cp)) + (1.0 - phi)

    @property
    def d_head(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def n_kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn_hidden or self.ffn

    @property
    def gated(self) -> bool:
        return self.activation in GATED

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def q_width(self) -> int:
        return self.heads * self.d_head

    # --- MoE-family derived sizes (h5) ---

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def v_dim(self) -> int:
        """A value head's width (MLA's v_head_dim; otherwise the head dimension)."""
        return self.v_head_dim or self.d_head

    @property
    def core_head_dim(self) -> int | float:
        """The head width the attention core's two products see on average: (q·k width + v
        width) / 2, d_head unless MLA's value heads differ from its q/k heads (192 and 128 in
        DeepSeek-V3): the scores take d_qk, the weighted sum d_v."""
        return self.d_head if self.v_dim == self.d_head else (self.d_head + self.v_dim) / 2

    @property
    def moe_layers(self) -> int:
        """Layers with routed experts (all, less ``dense_layers``; none in a dense model)."""
        return self.layers - len(self.dense_layers) if self.is_moe else 0

    def dense_variant(self) -> ModelSpec:
        """The same model with a dense MLP of ``ffn_hidden`` in place of its experts: what one of
        its ``dense_layers`` is (the builder costs those from it). Its ``hf_family`` is unset: an
        MoE family's census (Mixtral's, OLMoE's) prices experts, so impl hf takes the dense
        family its fields describe (Qwen3-MoE's dense layers Qwen3's, as read from a config)."""
        return replace(self, num_experts=0, top_k=0, moe_ffn_hidden=0, shared_ffn_hidden=0, shared_expert_gate=False,
                       router_bias=False, dense_layers=(), hf_family="")  # fmt: skip

    def mla_params(self) -> int:
        """MLA's projections and latent norms (DeepSeek-V2 §2.1): q via a rank-r_q latent
        (d·r_q, its RMSNorm, r_q·h·d_qk) or directly (d·h·d_qk); the joint K/V latent and the
        shared rotary key (d·(r_kv + d_rope)), its RMSNorm, the K/V up-projection
        (r_kv·h·(d_nope + d_v)); the output h·d_v·d."""
        d, h, rq, rkv = self.hidden, self.heads, self.q_lora_rank, self.kv_lora_rank
        q = d * rq + rq + rq * h * self.d_head if rq else d * h * self.d_head
        kv = d * (rkv + self.qk_rope_head_dim) + rkv + rkv * h * (self.d_head - self.qk_rope_head_dim + self.v_dim)
        return q + kv + h * self.v_dim * d

    def router_params(self) -> int:
        return self.hidden * self.num_experts + (self.num_experts if self.router_bias else 0)

    def shared_expert_params(self) -> int:
        """The shared expert(s): a gated MLP without biases, and Qwen2-MoE's d x 1 sigmoid gate."""
        if not self.shared_ffn_hidden:
            return 0
        return (3 if self.gated else 2) * self.hidden * self.shared_ffn_hidden + (self.hidden if self.shared_expert_gate else 0)

    def _attention_extra_params(self) -> int:
        """Attention sinks (one per head), per layer (the q/k norms are :meth:`qk_norm_params`)."""
        return self.heads if self.attention_sinks else 0

    @property
    def kv_width(self) -> int:
        return self.n_kv * self.d_head

    def kv_width_tp(self, tp: int) -> int:
        """K (or V) width on one of ``tp`` ranks: KV heads are split over TP and replicated when
        TP exceeds them (Megatron)."""
        return -(-self.n_kv // tp) * self.d_head

    def padded_vocab(self, tp: int = 1, multiple: int = 128) -> int:
        """001 Eq. 1–2: the vocabulary rounded up to a multiple of ``multiple × tp``."""
        f = multiple * tp
        return math.ceil(self.vocab / f) * f

    # --- parameters (unsharded) ------------------------------------------------------------

    def attention_params(self) -> int:
        if self.mla:
            return self.mla_params() + self._attention_extra_params()
        d = self.hidden
        w = d * (self.q_width + 2 * self.kv_width) + self.q_width * d
        b = (self.q_width + 2 * self.kv_width if self.bias or self.qkv_bias else 0) + (d if self.bias else 0)
        return w + b + self._attention_extra_params()

    def mlp_params(self, ffn: int | None = None) -> int:
        d, f = self.hidden, ffn or self.ffn
        mats = 3 if self.gated else 2
        b = (f * (2 if self.gated else 1) + d) if self.bias else 0
        return mats * d * f + b

    @property
    def norm_tensors(self) -> int:
        """Parameter tensors of one norm: a LayerNorm's weight and bias, or the weight alone
        (RMSNorm; Cohere's LayerNorm without bias)."""
        return 2 if self.norm == "layernorm" and self.norm_bias else 1

    @property
    def rope_share(self) -> float:
        """The share of the layers that apply the rotary embedding (SmolLM3: 3 of 4)."""
        return 1.0 - self.nope_layers / self.layers if self.position == "rotary" else 0.0

    @property
    def rotary_dims(self) -> int:
        """A head's rotated dims, ``int(d_head x rope_fraction)`` as transformers takes them
        (Phi's ``rotary_ndims``, GLM's rotary embedding's ``dim``)."""
        return int(self.d_head * self.rope_fraction)

    def norm_params(self) -> int:
        return self.norm_tensors * self.hidden

    def head_bias_params(self, tp: int = 1, *, padded: bool = True) -> int:
        """The output projection's bias (Phi's): one per (padded) vocabulary entry."""
        if not self.head_bias:
            return 0
        return self.padded_vocab(tp) if padded else self.vocab

    def qk_norm_params(self) -> int:
        """The q and k norms' weights: one d_h vector each ("head"), or the projections' widths
        ("full")."""
        if self.qk_norm == "head":
            return 2 * self.d_head
        return self.q_width + self.kv_width if self.qk_norm == "full" else 0

    def layer_norm_params(self) -> int:
        """All of one layer's norm weights: ``layer_norms`` norms and the q/k norms."""
        return self.layer_norms * self.norm_params() + self.qk_norm_params()

    def layer_params(self) -> int:
        """One transformer layer; for MoE all experts plus the router (and any shared expert);
        a layer of ``dense_layers`` is :meth:`dense_variant`'s."""
        mlp = (
            self.num_experts * self.mlp_params(self.expert_ffn) + self.router_params() + self.shared_expert_params()
            if self.is_moe
            else self.mlp_params()
        )
        return self.attention_params() + mlp + self.layer_norm_params()

    def layer_active_params(self) -> int:
        """Parameters one token touches in a layer (MoE: ``top_k`` experts)."""
        if not self.is_moe:
            return self.layer_params()
        return (
            self.attention_params()
            + self.top_k * self.mlp_params(self.expert_ffn)
            + self.router_params()
            + self.shared_expert_params()
            + self.layer_norm_params()
        )

    def layers_params(self, *, active: bool = False) -> int:
        """All layers: the MoE ones and ``dense_layers`` (dense MLPs of ``ffn_hidden``)."""
        moe = self.layer_active_params() if active else self.layer_params()
        dense = self.dense_variant().layer_params() if self.dense_layers else 0
        return self.moe_layers * moe + len(self.dense_layers) * dense if self.is_moe else self.layers * moe

    def active_params(self) -> int:
        """Parameters one token touches (MoE: ``top_k`` routed experts per layer), unpadded
        vocabulary: the "active" count MoE papers quote."""
        out = 0 if self.tied_embeddings else self.vocab * self.hidden
        return (self.layers_params(active=True) + self.vocab * self.hidden + out + self.head_bias_params(padded=False)
                + self.position_params() + self.norm_params())  # fmt: skip

    def embedding_params(self, tp: int = 1) -> int:
        return self.padded_vocab(tp) * self.hidden

    def position_params(self) -> int:
        return self.seq_len * self.hidden if self.position == "learned" else 0

    def params(self, tp: int = 1, *, padded: bool = True) -> int:
        """All parameters: with the vocabulary padded for ``tp`` partitions as Megatron allocates
        it, or (``padded=False``) as the HuggingFace model has it."""
        emb = self.embedding_params(tp) if padded else self.vocab * self.hidden
        out = 0 if self.tied_embeddings else emb
        return (
            self.layers_params()
            + emb
            + out
            + self.head_bias_params(tp, padded=padded)
            + self.position_params()
            + self.norm_params()
        )

    # --- multi-token prediction (DeepSeek-V3 §2.2) ------------------------------------------

    def mtp_depths(self, impl: str = "fused") -> int:
        """The MTP depths a training stack of ``impl`` (:attr:`Plan.impl`) runs: ``mtp_layers``
        with Megatron-style kernels; none with ``hf``, as transformers' DeepSeek-V3 model does
        not build the MTP module (its checkpoint's layer 61 is dropped on loading)."""
        return 0 if impl == "hf" else self.mtp_layers

    def mtp_block(self) -> ModelSpec:
        """The model whose layer each MTP depth's transformer block is: the kind of the main
        model's last layer, as Megatron-core builds it (``get_gpt_mtp_block_spec`` takes the
        decoder's last layer spec; DeepSeek-V3's MTP layer is an MoE layer with MLA), a dense
        one where that layer is among ``dense_layers``."""
        return self.dense_variant() if self.is_moe and self.layers - 1 in self.dense_layers else self

    def mtp_depth_params(self) -> int:
        """One MTP depth's own parameters (DeepSeek-V3 §2.2, Megatron-core's
        MultiTokenPredictionLayer): RMSNorms of the previous depth's hidden state and of the
        shifted token's embedding (``hnorm``, ``enorm``), the projection ``M_k`` of their
        concatenation (``eh_proj``, 2d x d, no bias), one transformer block, and the norm before
        the shared head (Megatron's ``final_layernorm``, HF's ``shared_head.norm``). The
        embedding and output head are the main model's, not counted again."""
        d = self.hidden
        return 3 * self.norm_params() + 2 * d * d + self.mtp_block().layer_params()

    def mtp_params(self) -> int:
        """All MTP depths' own parameters (:meth:`mtp_depth_params`); DeepSeek-V3: 11.5 B
        (its README_WEIGHTS: "11.5B unique parameters, excluding the shared 0.9B Embedding and
        0.9B output Head")."""
        return self.mtp_layers * self.mtp_depth_params()

    def trained_params(self, tp: int = 1, *, padded: bool = True) -> int:
        """:meth:`params` and the MTP depths' own (:meth:`mtp_params`): what training updates.
        :meth:`params` stays the main model's count, transformers' model's (which has no MTP)."""
        return self.params(tp, padded=padded) + self.mtp_params()

    def with_seq_len(self, seq_len: int) -> ModelSpec:
        return replace(self, seq_len=seq_len)
