"""Stage-latency regressors over stage graphs: the DAG Transformer (003 §IV) and GCN/GAT baselines.

**DAG Transformer** (003 §IV-A/B5–6, after Luo et al., "Transformers over Directed Acyclic
Graphs"): node features (Table I) are embedded linearly and the DAG positional encoding —
sinusoidal in the node's depth, the longest path from a source — is added; ``layers`` pre-norm
Transformer layers follow, whose attention is restricted by Eq. 1's reachability mask with
k = ∞ (a node attends to itself and to every node joined to it by a directed path, either way);
the node embeddings are summed (global add pool, Eq. 2) and an MLP with ReLU predicts the
latency. 003's setting: 4 layers of width 64.

**GCN** (6 ``GCNConv`` layers of 256) and **GAT** (6 ``GATConv`` layers of 32, 4 heads averaged)
are 003 §VII-D's baselines, from torch-geometric, on the same node features with the edges in
both directions, the same pooling and head.

**Readout.** ``readout="add"`` is Eq. 2 as written: ``MLP(Σ_n h_n)``. ``readout="logsumexp"``
(the default) is the same global add pool taken in the latency domain: every node gets ``d``
log-costs ``c_n = MLP_node([h_n, x_n])`` from its embedding and its own features, the pool is
``log Σ_n exp(c_n)`` (per channel) and the head MLP maps it to the prediction. 003's intuition
for add pooling is that nodes add up to the stage latency; they do so in seconds, not in
embedding space, and an operator's cost is a product of tensor dimensions — the exponential of
a sum of the log-scaled dimensions the nodes carry — so exponentiating before summing lets a
channel represent sums of such monomials over the graph. All three models share the readout
(including its view of the raw features), so the comparison is of the graph encoders.

``readout="sum"`` takes 003's "nodes add up to the stage latency" literally: one log-cost per
node (plus ln(1 + FLOPs) of the node when the FLOPs column is given: the node's time is its work
times a learned time per FLOP), the stage's latency is ``e^μ Σ_n e^{c_n}`` — a sum in seconds,
no head MLP — so a stage twice as deep costs what its layers cost, whatever depths were trained
on. The trainer leaves its target unscaled for it (``σ = 1``, see ``train.target_scaling``).

Every model maps a :class:`GraphBatch` to one value per graph: the standardized log latency
(the trainer's target).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional

from trainsim.errors import ConfigError

MODEL_KINDS = ("dag_transformer", "gcn", "gat")
READOUTS = ("logsumexp", "add", "work", "sum")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Architecture of one predictor (stored next to its weights as JSON)."""

    kind: str = "dag_transformer"
    in_dim: int = 0
    hidden: int = 64
    layers: int = 4
    heads: int = 4
    readout: str = "logsumexp"
    work_col: int = -1  # readouts "work", "sum": the feature column holding log2(1 + FLOPs)
    members: int = 1  # > 1: that many models of this architecture, their outputs averaged

    @classmethod
    def for_kind(cls, kind: str, in_dim: int, **kw: Any) -> ModelConfig:
        """003's settings per kind (§IV-B6, §VII-D), overridable by ``kw``."""
        base = {"dag_transformer": {"hidden": 64, "layers": 4, "heads": 4},
                "gcn": {"hidden": 256, "layers": 6, "heads": 1},
                "gat": {"hidden": 32, "layers": 6, "heads": 4}}  # fmt: skip
        if kind not in base:
            raise ConfigError(f"model kind must be one of {', '.join(MODEL_KINDS)}, got {kind!r}")
        return cls(kind=kind, in_dim=in_dim, **(base[kind] | kw))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class GraphBatch:
    """A batch of graphs in both layouts: flat (GNNs) and padded with masks (Transformer)."""

    x: torch.Tensor  # [total_nodes, F]
    edge_index: torch.Tensor  # [2, E] (both directions)
    batch: torch.Tensor  # [total_nodes] graph index
    num_graphs: int
    x_pad: torch.Tensor | None = None  # [B, N, F]
    depth_pad: torch.Tensor | None = None  # [B, N]
    attn_mask: torch.Tensor | None = None  # [B, 1, N, N] True = may attend
    valid: torch.Tensor | None = None  # [B, N] True = a real node


@dataclass(slots=True)
class GraphTensors:
    """One graph's tensors, precomputed once (features, undirected edges, depth, Eq. 1 mask)."""

    x: np.ndarray
    edge_index: np.ndarray
    depth: np.ndarray
    reach: np.ndarray | None  # [N, N] bool, only for the DAG Transformer
    log_work: float = (
        0.0  # ln of the graph's operator FLOPs (0: unknown), the per-work target's offset
    )

    @property
    def num_nodes(self) -> int:
        return int(self.x.shape[0])


def collate(graphs: list[GraphTensors], *, padded: bool) -> GraphBatch:
    """Stack graphs: flat layout always, padded layout with masks when ``padded``."""
    sizes = [g.num_nodes for g in graphs]
    offsets = np.cumsum([0, *sizes[:-1]])
    x = torch.from_numpy(np.concatenate([g.x for g in graphs]))
    ei = torch.from_numpy(
        np.concatenate([g.edge_index + o for g, o in zip(graphs, offsets, strict=True)], axis=1)
    )
    batch = torch.repeat_interleave(torch.arange(len(graphs)), torch.tensor(sizes))
    out = GraphBatch(x, ei, batch, len(graphs))
    if padded:
        b, n, f = len(graphs), max(sizes), graphs[0].x.shape[1]
        xp = np.zeros((b, n, f), dtype=np.float32)
        dp = np.zeros((b, n), dtype=np.int64)
        mask = np.zeros((b, n, n), dtype=bool)
        valid = np.zeros((b, n), dtype=bool)
        idx = np.arange(n)
        for i, g in enumerate(graphs):
            k = g.num_nodes
            if g.reach is None:
                raise ValueError("graph tensors built without the reachability mask")
            xp[i, :k], dp[i, :k], valid[i, :k] = g.x, g.depth, True
            mask[i, :k, :k] = g.reach
            mask[i, idx[k:], idx[k:]] = True  # padding attends to itself only (no empty rows)
        out.x_pad, out.depth_pad = torch.from_numpy(xp), torch.from_numpy(dp)
        out.attn_mask, out.valid = torch.from_numpy(mask).unsqueeze(1), torch.from_numpy(valid)
    return out


def size_chunks(sizes: list[int], *, overhead_nodes: int = 128) -> list[list[int]]:
    """Split a batch of graphs into size-sorted chunks that waste the least padded attention.

    The padded layout costs each graph ``max_n²`` of its chunk in the attention (and ``max_n`` in
    the rest); a chunk also has a fixed cost (taken as ``overhead_nodes²``). The partition of the
    size-sorted graphs into contiguous chunks that minimizes ``Σ_chunks (count · max_n² +
    overhead_nodes²)`` is found exactly by dynamic programming (a batch holds ≤ a few dozen
    graphs). Chunks do not change what a model computes for a graph (padding is masked out and
    no layer mixes graphs), only how much padding it computes on: a batch of 15 GPT stages of
    215–1,058 nodes costs 2.7× less attention in chunks than padded to 1,058.
    Returns positions into ``sizes``.
    """
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    s = [sizes[i] for i in order]
    k, fixed = len(s), float(overhead_nodes) ** 2
    best, cut = [0.0] + [math.inf] * k, [0] * (k + 1)
    for j in range(1, k + 1):  # best[j]: the first j graphs; the last chunk is order[i:j]
        for i in range(j):
            c = best[i] + (j - i) * float(s[j - 1]) ** 2 + fixed
            if c < best[j]:
                best[j], cut[j] = c, i
    chunks, j = [], k
    while j > 0:
        chunks.append(order[cut[j] : j])
        j = cut[j]
    return chunks[::-1]


def sinusoidal_encoding(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Transformer sinusoids of integer positions (here: node depths), shape ``[..., dim]``."""
    half = dim // 2
    freq = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
    ang = positions.to(torch.float32).unsqueeze(-1) * freq
    pe = torch.cat([torch.sin(ang), torch.cos(ang)], dim=-1)
    return functional.pad(pe, (0, dim - 2 * half))


class _Readout(nn.Module):
    """Global add pool (plain, or of per-node latencies in the exponential domain) + MLP head."""

    def __init__(self, dim: int, in_dim: int, readout: str, work_col: int = -1) -> None:
        super().__init__()
        if readout not in READOUTS:
            raise ValueError(f"readout must be one of {READOUTS}, got {readout!r}")
        if readout == "work" and not 0 <= work_col < in_dim:
            raise ValueError("readout 'work' needs the FLOPs feature column (table1+work features)")
        self.readout = readout
        self.work_col = work_col
        # logsumexp / work: a node's d log-costs from its embedding and its own Table I features;
        # sum: one log-cost per node, the stage is their sum in seconds (no head)
        width = 1 if readout == "sum" else dim
        self.node = (nn.Sequential(nn.Linear(dim + in_dim, dim), nn.ReLU(), nn.Linear(dim, width))
                     if readout != "add" else None)  # fmt: skip
        self.mlp = (nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim // 2), nn.ReLU(),
                                  nn.Linear(dim // 2, 1))
                    if readout != "sum" else None)  # fmt: skip

    def _z(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if self.node is None:
            return h
        z = self.node(torch.cat([h, x], dim=-1))
        with_work = self.readout == "work" or (self.readout == "sum" and self.work_col >= 0)
        return z + self._lw(x).unsqueeze(-1) if with_work else z

    def _lw(self, x: torch.Tensor) -> torch.Tensor:
        """ln(1 + FLOPs) of every node (readout "work")."""
        return x[..., self.work_col] * math.log(2.0)

    def pool_flat(
        self, h: torch.Tensor, x: torch.Tensor, batch: torch.Tensor, num_graphs: int
    ) -> torch.Tensor:
        z = self._z(h, x)
        if self.readout == "add":
            out = torch.zeros(num_graphs, z.shape[1], dtype=z.dtype)
            return out.index_add_(0, batch, z)
        m = torch.full((num_graphs, z.shape[1]), -math.inf, dtype=z.dtype)
        m = m.scatter_reduce(0, batch.unsqueeze(1).expand_as(z), z, reduce="amax").detach()
        s = torch.zeros_like(m).index_add_(0, batch, torch.exp(z - m[batch]))
        pooled = m + torch.log(s)
        if self.readout == "work":  # per FLOP: ln Σ F_n e^{g_n} - ln Σ F_n
            lw = self._lw(x)
            mw = torch.full((num_graphs,), -math.inf, dtype=lw.dtype)
            mw = mw.scatter_reduce(0, batch, lw, reduce="amax").detach()
            sw = torch.zeros_like(mw).index_add_(0, batch, torch.exp(lw - mw[batch]))
            pooled = pooled - (mw + torch.log(sw)).unsqueeze(-1)
        return pooled

    def pool_padded(self, h: torch.Tensor, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        z = self._z(h, x)
        if self.readout == "add":
            return (z * valid.unsqueeze(-1)).sum(dim=1)
        pooled = torch.logsumexp(z.masked_fill(~valid.unsqueeze(-1), -math.inf), dim=1)
        if self.readout == "work":
            lw = self._lw(x).masked_fill(~valid, -math.inf)
            pooled = pooled - torch.logsumexp(lw, dim=1, keepdim=True)
        return pooled

    def head(self, pooled: torch.Tensor) -> torch.Tensor:
        return (self.mlp(pooled) if self.mlp is not None else pooled).squeeze(-1)


class DAGAttentionLayer(nn.Module):
    """Pre-norm Transformer layer whose attention follows Eq. 1's mask."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"hidden {dim} is not divisible by heads {heads}")
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.ffn = nn.Sequential(nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = (
            self.qkv(self.norm1(x))
            .view(b, n, 3, self.heads, d // self.heads)
            .permute(2, 0, 3, 1, 4)
        )
        a = functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.out(a.transpose(1, 2).reshape(b, n, d))
        return x + self.ffn(self.norm2(x))


class DAGTransformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Linear(cfg.in_dim, cfg.hidden)
        self.blocks = nn.ModuleList(
            DAGAttentionLayer(cfg.hidden, cfg.heads) for _ in range(cfg.layers)
        )
        self.norm = nn.LayerNorm(cfg.hidden)
        self.readout = _Readout(cfg.hidden, cfg.in_dim, cfg.readout, cfg.work_col)

    def forward(self, g: GraphBatch) -> torch.Tensor:
        if g.x_pad is None or g.attn_mask is None or g.valid is None or g.depth_pad is None:
            raise ValueError("the DAG Transformer needs a padded batch (collate(..., padded=True))")
        h = self.embed(g.x_pad) + sinusoidal_encoding(g.depth_pad, self.cfg.hidden)
        # the mask as an additive bias once, not converted from bool in every layer's attention
        bias = torch.zeros(g.attn_mask.shape, dtype=h.dtype).masked_fill_(~g.attn_mask, -math.inf)
        for blk in self.blocks:
            h = blk(h, bias)
        return self.readout.head(self.readout.pool_padded(self.norm(h), g.x_pad, g.valid))


class GNN(nn.Module):
    """GCN or GAT encoder (torch-geometric) with the shared readout."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        from torch_geometric.nn import GATConv, GCNConv

        self.cfg = cfg
        dims = [cfg.in_dim] + [cfg.hidden] * cfg.layers
        if cfg.kind == "gcn":
            self.convs = nn.ModuleList(GCNConv(a, b) for a, b in itertools.pairwise(dims))
            self.act: nn.Module = nn.ReLU()
        else:
            self.convs = nn.ModuleList(
                GATConv(a, b, heads=cfg.heads, concat=False) for a, b in itertools.pairwise(dims)
            )
            self.act = nn.ELU()
        self.readout = _Readout(cfg.hidden, cfg.in_dim, cfg.readout, cfg.work_col)

    def forward(self, g: GraphBatch) -> torch.Tensor:
        h = g.x
        for conv in self.convs:
            h = self.act(conv(h, g.edge_index))
        return self.readout.head(self.readout.pool_flat(h, g.x, g.batch, g.num_graphs))


class Members(nn.Module):
    """Models of one architecture whose outputs (standardized log latencies) are averaged: a
    cross-validated bag (``train.train_members``), i.e. the geometric mean of their latencies."""

    def __init__(self, models: list[nn.Module]) -> None:
        super().__init__()
        self.members = nn.ModuleList(models)

    def forward(self, g: GraphBatch) -> torch.Tensor:
        return torch.stack([m(g) for m in self.members]).mean(dim=0)


def build_model(cfg: ModelConfig) -> nn.Module:
    if cfg.members < 1:
        raise ValueError(f"members must be at least 1, got {cfg.members}")
    if cfg.members > 1:
        one = replace(cfg, members=1)
        return Members([build_model(one) for _ in range(cfg.members)])
    if cfg.kind == "dag_transformer":
        return DAGTransformer(cfg)
    if cfg.kind in ("gcn", "gat"):
        return GNN(cfg)
    raise ValueError(f"model kind must be one of {MODEL_KINDS}, got {cfg.kind!r}")


__all__ = [
    "GNN",
    "MODEL_KINDS",
    "READOUTS",
    "DAGAttentionLayer",
    "DAGTransformer",
    "GraphBatch",
    "GraphTensors",
    "Members",
    "ModelConfig",
    "build_model",
    "collate",
    "sinusoidal_encoding",
    "size_chunks",
]
