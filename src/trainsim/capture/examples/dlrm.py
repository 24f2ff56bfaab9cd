"""A small DLRM (Naumov et al. 2019): EmbeddingBag tables, bottom/top MLPs, dot interaction.

Sizes are tiny so that a multi-rank CPU capture finishes in seconds; the operator mix (embedding
bag forward/backward, GEMMs, bmm interaction, BCE loss) is the one of the real model.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn

from trainsim.capture.examples import TrainingStep

DENSE_FEATURES = 13
EMBEDDING_DIM = 32
TABLE_ROWS = (1000, 1000, 500, 500, 2000, 2000, 100, 100)
MAX_POOLING = 8  # indices per bag are drawn from 1..MAX_POOLING
PAD = 0  # row 0 of every table is padding: ignored by the bag sum


def _mlp(sizes: tuple[int, ...], *, last_activation: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2 or last_activation:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, *, table_rows: tuple[int, ...], dim: int, dense_features: int) -> None:
        super().__init__()
        self.tables = nn.ModuleList(
            nn.EmbeddingBag(n, dim, mode="sum", padding_idx=PAD) for n in table_rows
        )
        self.bottom = _mlp((dense_features, 64, dim), last_activation=True)
        features = len(table_rows) + 1
        pairs = features * (features - 1) // 2
        self.top = _mlp((dim + pairs, 64, 32, 1), last_activation=False)
        self.features = features

    def forward(
        self, dense: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor
    ) -> torch.Tensor:
        x = self.bottom(dense)
        pooled = [t(indices[i], offsets[i]) for i, t in enumerate(self.tables)]
        feats = torch.stack([x, *pooled], dim=1)  # (B, F, D)
        z = torch.bmm(feats, feats.transpose(1, 2))  # dot interaction
        # Index per call, as the reference DLRM does: a buffer would make DDP broadcast it.
        li, lj = torch.tril_indices(self.features, self.features, offset=-1, device=z.device)
        inter = z[:, li, lj]
        return self.top(torch.cat([x, inter], dim=1)).squeeze(1)


def _sparse_batch(
    g: torch.Generator, *, batch_size: int, rows: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per table, bags of 1..MAX_POOLING indices; tables are padded with PAD to one length so
    that they stack into ``(tables, n)`` index and ``(tables, batch)`` offset tensors."""
    lengths = torch.randint(1, MAX_POOLING + 1, (len(rows), batch_size), generator=g)
    total = int(lengths.sum(dim=1).max())
    indices = torch.full((len(rows), total), PAD, dtype=torch.long)
    offsets = torch.zeros(len(rows), batch_size, dtype=torch.long)
    for t, n in enumerate(rows):
        offsets[t, 1:] = torch.cumsum(lengths[t], 0)[:-1]
        used = int(lengths[t].sum())
        indices[t, :used] = torch.randint(1, n, (used,), generator=g)
    return indices, offsets


def _loss(module: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    dense, indices, offsets, labels = batch
    logits = module(dense, indices, offsets)
    return nn.functional.binary_cross_entropy_with_logits(logits, labels)


def build(*, batch_size: int, device: str, seed: int) -> TrainingStep:
    torch.manual_seed(0)  # same initial weights on every rank, as DDP expects
    model = DLRM(table_rows=TABLE_ROWS, dim=EMBEDDING_DIM, dense_features=DENSE_FEATURES)
    g = torch.Generator().manual_seed(seed)
    dense = torch.rand(batch_size, DENSE_FEATURES, generator=g)
    indices, offsets = _sparse_batch(g, batch_size=batch_size, rows=TABLE_ROWS)
    labels = torch.randint(0, 2, (batch_size,), generator=g).float()
    batch = tuple(t.to(device) for t in (dense, indices, offsets, labels))
    return TrainingStep(
        model=model.to(device), batch=batch, loss=_loss,
        summary=f"DLRM {len(TABLE_ROWS)} tables x {EMBEDDING_DIM} dim, batch {batch_size}",
    )  # fmt: skip
