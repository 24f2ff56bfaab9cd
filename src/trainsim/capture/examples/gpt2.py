"""A tiny GPT-2 built from a local ``transformers.GPT2Config`` (nothing is downloaded).

transformers is imported at module level so that a capture's forkserver preloads it once.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from trainsim.capture.examples import TrainingStep
from trainsim.errors import CaptureError

VOCAB = 1000
SEQ_LEN = 64
HIDDEN = 128
HEADS = 4


def _loss(module: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    (tokens,) = batch
    loss: torch.Tensor = module(input_ids=tokens, labels=tokens).loss
    return loss


def build(*, batch_size: int, device: str, seed: int, seq_len: int = SEQ_LEN, hidden: int = HIDDEN,
          heads: int = HEADS) -> TrainingStep:  # fmt: skip
    if heads < 1 or hidden < heads or hidden % heads:
        raise CaptureError(f"gpt2 example: --hidden must be a positive multiple of its {heads} heads, got {hidden}")
    config = GPT2Config(
        n_layer=2, n_embd=hidden, n_head=heads, vocab_size=VOCAB, n_positions=128,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    if not 1 <= seq_len <= config.n_positions:
        raise CaptureError(f"gpt2 example: --seq-len must be 1..{config.n_positions} (its learned positions), got {seq_len}")
    torch.manual_seed(0)  # same initial weights on every rank, as DDP expects
    hf_model = GPT2LMHeadModel(config)
    hf_model.loss_type = "ForCausalLM"  # the class name does not name a loss; avoids a warning
    model: nn.Module = hf_model.train()
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (batch_size, seq_len), generator=g)
    return TrainingStep(
        model=model.to(device), batch=(tokens.to(device),), loss=_loss,
        summary=f"GPT-2 2 layers x {hidden} hidden ({heads} heads), batch {batch_size} x seq {seq_len}",
    )  # fmt: skip
