"""What a transformer is: :class:`ModelSpec`, the architecture facts a builder needs.

One frozen record covers GPT-2/GPT-3/Megatron GPT/GPT-NeoX (MHA, GeLU, LayerNorm, learned or
rotary positions, biases), LLaMA/Mistral/Qwen (GQA, SwiGLU, RMSNorm, rotary, no biases but
Qwen2's on q/k/v) and
Mixtral-style MoE (``num_experts`` experts of ``moe_ffn_hidden``, ``top_k`` active per token).
Catalog entries and HuggingFace ``config.json`` files both become a ModelSpec
(:mod:`trainsim.builders.models`).

Parameter counts follow the operators the builder emits (001 Table II generalised): per
layer, attention QKV ``d × (h + 2 h_kv) d_h`` and output ``h d_h × d``, the MLP (two matrices,
three for gated activations), two norms; plus the embedding, position table, final norm and
(untied) output projection. Qwen3/Gemma 3/OLMo 2 add q/k norms (``qk_norm``), Gemma four norms
a layer and Falcon-7B one (``layer_norms``). The vocabulary is padded as Megatron does (001 Eq. 1–2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from trainsim.errors import ConfigError

Activation = Literal["gelu", "swiglu", "geglu", "relu"]
Norm = Literal["layernorm", "rmsnorm"]
Position = Literal["learned", "rotary", "alibi", "none"]
QKNorm = Literal["none", "head", "full"]

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
    # (Qwen3, Gemma 3), "full" over the whole q and k projections (OLMo 2)
    qk_norm: QKNorm = "none"
    # norms per layer: 2 (before attention and MLP, or after them as OLMo 2's), 4 (Gemma 2/3:
    # before and after each), 1 (Falcon-7B: one norm feeds the parallel attention and MLP)
    layer_norms: int = 2
    logit_softcap: float = 0.0  # cap · tanh(logits / cap) on the output logits (Gemma 2); 0: none
    attn_softcap: float = 0.0  # the same on the attention scores (Gemma 2); 0: none
    # layers of ``sliding_window`` (Gemma 2: every other; Gemma 3: 5 of 6); 0: all. Recorded only
    # for predict's note, as sliding_window is
    sliding_layers: int = field(default=0, compare=False)
    source: str = "catalog"  # "catalog", or the config.json path it was read from
    aliases: tuple[str, ...] = field(default=(), compare=False)
    # a config's attention window (Mistral's sliding_window): recorded to say it is not
    # modelled (attention is costed over the whole sequence); not part of the model's identity
    sliding_window: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        for f in ("hidden", "layers", "heads", "vocab", "seq_len"):
            v = getattr(self, f)
            if not isinstance(v, int) or v <= 0:
                raise ConfigError(f"model {self.name}: {f} must be a positive integer, got {v!r}")
        for f in ("ffn_hidden", "kv_heads", "head_dim", "num_experts", "top_k", "moe_ffn_hidden"):
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

    # --- derived sizes --------------------------------------------------------------------

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
        d = self.hidden
        w = d * (self.q_width + 2 * self.kv_width) + self.q_width * d
        b = (self.q_width + 2 * self.kv_width if self.bias or self.qkv_bias else 0) + (d if self.bias else 0)
        return w + b

    def mlp_params(self, ffn: int | None = None) -> int:
        d, f = self.hidden, ffn or self.ffn
        mats = 3 if self.gated else 2
        b = (f * (2 if self.gated else 1) + d) if self.bias else 0
        return mats * d * f + b

    def norm_params(self) -> int:
        return 2 * self.hidden if self.norm == "layernorm" else self.hidden

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
        """One transformer layer; for MoE all experts plus the router."""
        mlp = (
            self.num_experts * self.mlp_params(self.expert_ffn) + self.hidden * self.num_experts
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
            + self.hidden * self.num_experts
            + self.layer_norm_params()
        )

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
            self.layers * self.layer_params()
            + emb
            + out
            + self.position_params()
            + self.norm_params()
        )

    def with_seq_len(self, seq_len: int) -> ModelSpec:
        return replace(self, seq_len=seq_len)
