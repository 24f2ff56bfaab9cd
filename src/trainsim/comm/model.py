"""The plug point of collective models: a tiny base class and the prediction it returns.

A comm model answers "how long does this collective take": ``predict(kind, nbytes,
group_size, gpus_per_node=None) -> CommPrediction`` (seconds plus where the number came from),
``supports(...)`` says whether it can, ``predict_many`` is the vectorized form, and
``to_dict``/``from_dict`` make the JSON artifact (never pickle). Every model is
non-negative, deterministic and non-decreasing in message size; ``tests/test_comm_conformance.py``
checks that for every registered model.

Provenance is one of ``calibrated:<dataset>`` (a curve fitted on measurements of this very
configuration), ``calibrated:<dataset>;extrapolated-from:<nodes>x<gpus>`` (a fitted curve moved
to another group size by the hierarchical model) or ``spec-based:<system>`` (catalog peaks
only, no measurement).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from trainsim.errors import ModelError
from trainsim.ir.kinds import CollectiveKind

# Collectives that share a model with another: the receive side of a pair is the send.
KIND_ALIAS: dict[CollectiveKind, CollectiveKind] = {
    CollectiveKind.RECV: CollectiveKind.SEND,
    CollectiveKind.ALL_TO_ALLV: CollectiveKind.ALL_TO_ALL,
}


def canonical_kind(kind: CollectiveKind | str) -> CollectiveKind:
    try:
        k = CollectiveKind(kind)
    except ValueError:
        known = ", ".join(k.value for k in CollectiveKind)
        raise ModelError(f"unknown collective {kind!r}; known: {known}") from None
    return KIND_ALIAS.get(k, k)


@dataclass(frozen=True, slots=True)
class CommPrediction:
    duration_s: float
    provenance: str
    model: str

    @property
    def calibrated(self) -> bool:
        return self.provenance.startswith("calibrated:")


class CommModel(ABC):
    """Base class of collective models (see the module docstring for the contract)."""

    name: str
    model_type: str  # the artifact's "model" field; the registry loads by it

    @abstractmethod
    def supports(
        self, kind: CollectiveKind | str, group_size: int, *, gpus_per_node: int | None = None
    ) -> bool: ...

    @abstractmethod
    def predict_many(self, kind: CollectiveKind | str, nbytes: ArrayLike, group_size: int, *,
                     gpus_per_node: int | None = None) -> tuple[np.ndarray, str]:  # fmt: skip
        """Seconds for each size, and the provenance string shared by all of them."""

    @abstractmethod
    def to_dict(self) -> dict[str, Any]: ...

    def predict(self, kind: CollectiveKind | str, nbytes: float, group_size: int, *,
                gpus_per_node: int | None = None) -> CommPrediction:  # fmt: skip
        if not (math.isfinite(nbytes) and nbytes >= 0):
            raise ModelError(f"message size must be a non-negative number of bytes, got {nbytes!r}")
        if not self.supports(kind, group_size, gpus_per_node=gpus_per_node):
            where = f"{group_size} ranks" + (f", {gpus_per_node} per node" if gpus_per_node else "")
            raise ModelError(f"comm model {self.name} cannot predict {kind} on {where}")
        t, prov = self.predict_many(
            kind, np.array([nbytes], dtype=float), group_size, gpus_per_node=gpus_per_node
        )
        return CommPrediction(float(t[0]), prov, self.name)


def packed_placement(
    group_size: int, gpus_per_node: int | None, system_gpus_per_node: int | None
) -> tuple[int, int]:
    """(nodes, ranks per node) of a group: as given, else packed onto as few nodes as possible."""
    if group_size < 1:
        raise ModelError(f"group size must be at least 1, got {group_size}")
    if gpus_per_node is not None:
        if gpus_per_node < 1 or group_size % gpus_per_node:
            raise ModelError(f"{group_size} ranks cannot be placed {gpus_per_node} per node")
        return group_size // gpus_per_node, gpus_per_node
    if system_gpus_per_node is None:
        raise ModelError(f"say how many of the {group_size} ranks share a node (gpus_per_node)")
    nodes = -(-group_size // system_gpus_per_node)
    if group_size % nodes:
        raise ModelError(
            f"{group_size} ranks do not fill {nodes} nodes of {system_gpus_per_node} GPUs evenly; give gpus_per_node"
        )
    return nodes, group_size // nodes
