"""A LLaMA-style decoder (transformers ``LlamaForCausalLM``) built from a local config.

On CUDA it has LLaMA-3 8B's layer widths (hidden 4,096, 32 heads, 8 KV heads, MLP 14,336,
SwiGLU, RMSNorm, rotary) with 2 layers, a 32,000-token vocabulary and sequences of 2,048, in
bf16 with SDPA attention: one real-size transformer layer stack whose measured step
``trainsim predict`` can be checked against (``trainsim predict CONFIG --system dgx-h100 --gpus 1
--dtype bf16 --seq-len 2048 --micro-batch B``; the capture's optimizer is SGD, the builder's Adam).
On the CPU a 256-wide stand-in (fp32, sequence 64; ``--hidden``, ``--seq-len`` change them) keeps
tests fast. Nothing is downloaded.

The ``llama13`` example is a second CUDA shape, LLaMA-2 13B's widths (hidden 5,120, 40 heads
without GQA, MLP 13,824) at sequence 4,096, 2 layers, bf16: a held-out check of ``trainsim
predict`` on a shape and sequence length that nothing was fitted or tuned on (docs/gpu.md); ``llama70``
has LLaMA-3 70B's widths (hidden 8,192, GQA 64/8, MLP 28,672, vocabulary 128,256) at 2,048.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from trainsim.capture.examples import TrainingStep
from trainsim.errors import CaptureError

# shape -> (config fields, sequence length, dtype)
SHAPES: dict[str, tuple[dict[str, Any], int, torch.dtype]] = {
    "cuda": ({"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
              "intermediate_size": 14336, "num_hidden_layers": 2, "vocab_size": 32000}, 2048, torch.bfloat16),
    "cpu": ({"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 512, "num_hidden_layers": 2, "vocab_size": 1000}, 64, torch.float32),
    "cuda-13b": ({"hidden_size": 5120, "num_attention_heads": 40, "num_key_value_heads": 40,
                  "intermediate_size": 13824, "num_hidden_layers": 2, "vocab_size": 32000}, 4096, torch.bfloat16),
    "cuda-70b": ({"hidden_size": 8192, "num_attention_heads": 64, "num_key_value_heads": 8,
                  "intermediate_size": 28672, "num_hidden_layers": 2, "vocab_size": 128256}, 2048, torch.bfloat16),
}  # fmt: skip


def config(kind: str, **override: int) -> tuple[LlamaConfig, int, torch.dtype]:
    fields, seq, dtype = SHAPES[kind]
    cfg = LlamaConfig(**{**fields, **override}, max_position_embeddings=seq, tie_word_embeddings=False,
                      bos_token_id=0, eos_token_id=0, pad_token_id=0)  # fmt: skip
    return cfg, seq, dtype


def _loss(module: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    (tokens,) = batch
    loss: torch.Tensor = module(input_ids=tokens, labels=tokens).loss
    return loss


CPU_HEAD_SIZE = 64  # the stand-in's heads: 64 wide, half of them key/value heads, MLP 2x the width


def build(*, batch_size: int, device: str, seed: int, shape: str = "", hidden: int | None = None,
          seq_len: int | None = None) -> TrainingStep:  # fmt: skip
    """The step on ``device``; ``shape`` names a CUDA shape of :data:`SHAPES` (on the CPU the
    stand-in is built whatever it says). CPU only: ``hidden``, the stand-in at that width, its
    ratios kept (heads of 64, GQA 2, MLP 2x), as a model family grows; ``seq_len``, its tokens
    per sequence (rotary positions: any length)."""
    kind = "cpu" if not device.startswith("cuda") else shape or "cuda"
    if kind not in SHAPES:
        raise CaptureError(f"llama example: unknown shape {shape!r}; known: {', '.join(sorted(SHAPES))}")
    if hidden is not None and (kind != "cpu" or hidden % (2 * CPU_HEAD_SIZE)):
        raise CaptureError(f"llama example: --hidden applies to the CPU stand-in, a multiple of {2 * CPU_HEAD_SIZE}; "
                           f"got {hidden} on {device}")  # fmt: skip
    if seq_len is not None and (kind != "cpu" or seq_len < 1):
        raise CaptureError(f"llama example: --seq-len applies to the CPU stand-in, at least 1; got {seq_len} on {device}")
    heads = (hidden or 0) // CPU_HEAD_SIZE
    cfg, seq, dtype = config(kind, **({} if hidden is None else {
        "hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": heads // 2,
        "intermediate_size": 2 * hidden}))  # fmt: skip
    if seq_len is not None:
        seq = cfg.max_position_embeddings = seq_len
    torch.manual_seed(0)  # same initial weights on every rank, as DDP expects
    hf_model: nn.Module = LlamaForCausalLM(cfg)
    model = hf_model.to(dtype=dtype).train()
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab_size, (batch_size, seq), generator=g)
    return TrainingStep(
        model=model.to(device), batch=(tokens.to(device),), loss=_loss,
        summary=f"LLaMA-style {cfg.num_hidden_layers} layers x {cfg.hidden_size} hidden ({kind} shape), "
                f"batch {batch_size} x seq {seq}, {str(dtype).removeprefix('torch.')}",
    )  # fmt: skip
