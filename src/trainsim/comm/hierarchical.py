"""Analytical hierarchical alpha-beta model per algorithm, driven by the system catalog.

A group of ``n`` ranks sits on ``N`` nodes with ``g`` ranks each. Each algorithm costs
``latency + bytes * per_byte`` (bytes in the nccl-tests convention, :mod:`.sizing`), and NCCL
is assumed to pick the fastest algorithm for each size, as its own cost model does
(NVIDIA/nccl ``src/graph/tuning.cc``, whose structure this follows):

* **ring** (every collective but all-to-all and send/recv): ``s`` sequential steps, of which
  ``s_inter`` cross nodes, pay ``(s - s_inter) * a_node + s_inter * a_cluster``; all-reduce
  has ``s = 2(n-1)``, ``s_inter = 2(N-1)``, all-gather/reduce-scatter/broadcast/reduce
  ``n-1`` and ``N-1``. Bytes move at the ring's bus bandwidth, the slower tier:
  ``min(eff_node * B_node(g), eff_cluster * g * B_nic)`` where ``B_node(g)`` is a GPU's
  NVLink bandwidth towards the other ``g-1`` members (all of it through a switch, the share of
  links wired to them in a mesh) and ``g * B_nic`` is what the group's GPUs of one node can
  send off it. Bus factor per byte: ``2(n-1)/n`` (all-reduce), ``(n-1)/n`` (gather, scatter),
  1 (broadcast, reduce).
* **tree** (all-reduce across nodes): a chain inside each node and a binary tree across
  them: ``2((g-1) a_node + ceil(log2 N) a_cluster)``; per byte ``2 / (0.9 B_ring)`` (NCCL's
  tree reaches ~0.9 of the ring's bus bandwidth and moves every byte up and down).
* **direct** (all-to-all, send/recv): one step on the outermost tier spanned; an all-to-all
  rank sends ``(g-1)/n`` of its buffer over NVLink and ``(n-g)/n`` over its NIC at once.

``a_*`` are the catalog's per-step latencies and ``B`` its bandwidths; ``eff_*`` (bandwidth
efficiencies) and the two latencies can be fitted where measurements exist
(:func:`trainsim.comm.fitting.calibrate_hierarchical`); with none fitted the model is
spec-based: an optimistic bound, since real collectives reach 60–80 % of link bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from trainsim.comm.model import CommModel, canonical_kind, packed_placement
from trainsim.errors import ModelError
from trainsim.hardware import SystemSpec, TierKind, get_device, get_system
from trainsim.ir.kinds import CollectiveKind as C

_TREE_BW_FRACTION = 0.9  # Approximation: NCCL's own model scales tree bus bandwidth by 0.9.


@dataclass(frozen=True, slots=True)
class HierParams:
    """What can be fitted on top of the catalog; ``None`` latencies mean "the catalog's"."""

    eff_node: float = 1.0
    eff_cluster: float = 1.0
    latency_node_s: float | None = None
    latency_cluster_s: float | None = None
    fitted_on: str | None = None  # dataset name when anything here was fitted

    def __post_init__(self) -> None:
        if not (0 < self.eff_node <= 1.5 and 0 < self.eff_cluster <= 1.5):
            raise ModelError(
                f"bandwidth efficiencies must be in (0, 1.5], got {self.eff_node}, {self.eff_cluster}"
            )
        for v in (self.latency_node_s, self.latency_cluster_s):
            if v is not None and not (math.isfinite(v) and v >= 0):
                raise ModelError(f"latencies must be non-negative seconds, got {v}")


@dataclass(frozen=True, slots=True)
class Cost:
    """latency + bytes * per_byte of one algorithm."""

    latency_s: float
    per_byte_s: float


class HierarchicalModel(CommModel):
    model_type = "hierarchical"

    def __init__(self, system: SystemSpec, params: HierParams | None = None) -> None:
        self.system = system
        self.params = params or HierParams()
        self.name = f"hierarchical:{system.name}"
        node, cluster = system.node_tier, system.cluster_tier
        self._a_node = (
            self.params.latency_node_s
            if self.params.latency_node_s is not None
            else (node.latency_s if node else 0.0)
        )
        self._a_cluster = (
            self.params.latency_cluster_s
            if self.params.latency_cluster_s is not None
            else (cluster.latency_s if cluster else 0.0)
        )

    @property
    def provenance(self) -> str:
        fitted = self.params.fitted_on
        return f"calibrated:{fitted}" if fitted else f"spec-based:{self.system.name}"

    def with_params(self, **changes: Any) -> HierarchicalModel:
        return HierarchicalModel(self.system, replace(self.params, **changes))

    # --- placement and bandwidths ----------------------------------------------------------

    def placement(self, group_size: int, gpus_per_node: int | None = None) -> tuple[int, int]:
        nodes, g = packed_placement(group_size, gpus_per_node, self.system.gpus_per_node)
        if g > self.system.gpus_per_node:
            raise ModelError(
                f"{self.system.name} has {self.system.gpus_per_node} GPUs per node, not {g}"
            )
        if nodes > 1 and self.system.cluster_tier is None:
            raise ModelError(f"{self.system.name} has no network tier across nodes")
        if self.system.max_nodes is not None and nodes > self.system.max_nodes:
            raise ModelError(
                f"{self.system.name} has at most {self.system.max_nodes} nodes, not {nodes}"
            )
        return nodes, g

    def _node_bw(self, g: int, *, pair: bool = False) -> float:
        """Bytes/s one GPU can send to the other g-1 group members in its node (or to one peer)."""
        tier = self.system.node_tier
        assert tier is not None  # placement() guarantees a node tier when g > 1
        bw = tier.bandwidth_per_gpu_Bps
        if tier.kind is TierKind.NVLINK_MESH and self.system.gpus_per_node > 1:
            bw *= (1 if pair else g - 1) / (self.system.gpus_per_node - 1)
        return self.params.eff_node * bw

    def _nic_bw(self) -> float:
        tier = self.system.cluster_tier
        assert tier is not None
        return self.params.eff_cluster * tier.bandwidth_per_gpu_Bps

    def ring_bus_bw(self, nodes: int, g: int) -> float:
        """Bus bandwidth (bytes/s) of a ring over ``nodes`` x ``g`` ranks: the slower tier."""
        limits = []
        if g > 1:
            limits.append(self._node_bw(g))
        if nodes > 1:
            limits.append(g * self._nic_bw())
        if not limits:  # one rank: a local copy, read + write of device memory
            return get_device(self.system.device).memory_bandwidth_Bps / 2
        return min(limits)

    # --- algorithms --------------------------------------------------------------------------

    def costs(self, kind: C | str, nodes: int, g: int) -> dict[str, Cost]:
        """Cost of every algorithm that can run ``kind`` on ``nodes`` x ``g`` ranks."""
        k = canonical_kind(kind)
        n = nodes * g
        a0, a1 = self._a_node, self._a_cluster
        if k in (C.SEND, C.ALL_TO_ALL):
            if n == 1:
                return {"direct": Cost(0.0, 1.0 / self.ring_bus_bw(1, 1))}
            if k is C.SEND:
                return {
                    "direct": Cost(a1, 1.0 / self._nic_bw())
                    if nodes > 1
                    else Cost(a0, 1.0 / self._node_bw(2, pair=True))
                }
            per_byte = 0.0
            if g > 1:
                per_byte = max(per_byte, (g - 1) / n / self._node_bw(g))
            if nodes > 1:
                per_byte = max(per_byte, (n - g) / n / self._nic_bw())
            return {"direct": Cost(a1 if nodes > 1 else a0, per_byte)}
        bus = self.ring_bus_bw(nodes, g)
        if k is C.ALL_REDUCE or k is C.BARRIER:
            steps, inter, factor = 2 * (n - 1), 2 * (nodes - 1), 2 * (n - 1) / n
        elif k in (C.ALL_GATHER, C.REDUCE_SCATTER):
            steps, inter, factor = n - 1, nodes - 1, (n - 1) / n
        elif k in (C.BROADCAST, C.REDUCE):
            steps, inter, factor = n - 1, nodes - 1, 1.0
        else:  # pragma: no cover - every CollectiveKind is handled above
            raise ModelError(f"no hierarchical model for {k}")
        if n == 1:
            factor = 1.0  # one rank: out-of-place copy of the buffer
        out = {"ring": Cost((steps - inter) * a0 + inter * a1, factor / bus)}
        if k in (C.ALL_REDUCE, C.BARRIER) and nodes > 1:
            depth = math.ceil(math.log2(nodes))
            out["tree"] = Cost(2 * ((g - 1) * a0 + depth * a1), 2.0 / (_TREE_BW_FRACTION * bus))
        if k is C.BARRIER:
            out = {a: Cost(c.latency_s, 0.0) for a, c in out.items()}
        return out

    def best_latency_s(self, kind: C | str, nodes: int, g: int) -> float:
        return min(c.latency_s for c in self.costs(kind, nodes, g).values())

    def best_per_byte_s(self, kind: C | str, nodes: int, g: int) -> float:
        return min(c.per_byte_s for c in self.costs(kind, nodes, g).values())

    def time_s(self, kind: C | str, nbytes: ArrayLike, nodes: int, g: int) -> np.ndarray:
        m = np.maximum(np.asarray(nbytes, dtype=float), 0.0)
        costs = self.costs(kind, nodes, g).values()
        return np.min([c.latency_s + m * c.per_byte_s for c in costs], axis=0)

    # --- CommModel -----------------------------------------------------------------------------

    def supports(self, kind: C | str, group_size: int, *, gpus_per_node: int | None = None) -> bool:
        try:
            canonical_kind(kind)
            self.placement(group_size, gpus_per_node)
        except ModelError:
            return False
        return True

    def predict_many(self, kind: C | str, nbytes: ArrayLike, group_size: int, *,
                     gpus_per_node: int | None = None) -> tuple[np.ndarray, str]:  # fmt: skip
        nodes, g = self.placement(group_size, gpus_per_node)
        return self.time_s(kind, nbytes, nodes, g), self.provenance

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "trainsim.comm-model/1", "model": self.model_type, "system": self.system.name,
                "params": asdict(self.params)}  # fmt: skip

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> HierarchicalModel:
        try:
            return cls(get_system(doc["system"]), HierParams(**doc.get("params", {})))
        except (KeyError, TypeError) as e:
            raise ModelError(
                f"hierarchical comm model artifact: bad or missing field ({e})"
            ) from None
