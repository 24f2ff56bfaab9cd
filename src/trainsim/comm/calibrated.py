"""Collective models fitted on measurements, moved to unmeasured group sizes by the hierarchy.

A :class:`CalibratedCommModel` holds one fitted curve per measured (collective, nodes, GPUs
per node) case. A measured case answers from its own curve. Another group size on the same
system answers from an *anchor*, the nearest measured case of the same collective, shifted by
what the hierarchical model says changes between the two (:func:`anchored_time`)::

    t(m) = t_anchor(m) + [lat(target) - lat(anchor)] + m * [pb(target) - pb(anchor)]

where ``lat`` and ``pb`` are the hierarchical model's best latency and per-byte cost. The
anchor's fitted curve keeps everything the hierarchy cannot express (protocol switches,
the bandwidth ramp of 000's sigmoid); the hierarchy only adds what scale changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from pydantic import ValidationError

from trainsim.comm.curves import Curve, family
from trainsim.comm.hierarchical import HierarchicalModel, HierParams
from trainsim.comm.model import CommModel, CommPrediction, canonical_kind, packed_placement
from trainsim.comm.samples import CaseKey
from trainsim.errors import ConfigError, ModelError
from trainsim.hardware import SystemSpec, get_system
from trainsim.hardware.catalog import validation_message
from trainsim.hardware.schema import SystemSpec as _SystemSchema
from trainsim.ir.kinds import CollectiveKind

ARTIFACT_SCHEMA = "trainsim.comm-model/1"
_FLOOR_FRACTION = 0.05  # an extrapolated time never drops below 5 % of the anchor's


BEYOND_SIZES = 4.0  # a message this many times the largest measured one is said to be carried beyond


def beyond_sizes(case: FittedCase, nbytes: ArrayLike) -> str:
    """``;beyond-sizes:<largest measured bytes>`` when a message is far above the sizes the case
    was fitted on (its curve's bandwidth is carried there, unmeasured), else empty."""
    top = float(np.max(np.asarray(nbytes, dtype=float))) if np.size(nbytes) else 0.0
    return f";beyond-sizes:{case.max_bytes:.0f}" if top > BEYOND_SIZES * case.max_bytes else ""


@dataclass(frozen=True, slots=True)
class FittedCase:
    """One fitted curve and the evidence for it."""

    key: CaseKey
    family: str
    curve: Curve
    samples: int
    min_bytes: float
    max_bytes: float
    heldout_gmae_pct: float | None = None
    heldout_mape_pct: float | None = None
    candidates: dict[str, float] = field(default_factory=dict)  # family -> held-out GMAE %
    excluded_samples: int = 0  # rows dropped as physically implausible

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.key.kind.value, "nodes": self.key.nodes, "gpus_per_node": self.key.gpus_per_node,
            "family": self.family, "params": self.curve.to_dict(), "samples": self.samples,
            "excluded_samples": self.excluded_samples, "min_bytes": self.min_bytes, "max_bytes": self.max_bytes,
            "heldout_gmae_pct": self.heldout_gmae_pct, "heldout_mape_pct": self.heldout_mape_pct,
            "candidates_heldout_gmae_pct": self.candidates,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FittedCase:
        try:
            key = CaseKey(CollectiveKind(d["kind"]), int(d["nodes"]), int(d["gpus_per_node"]))
            for name in ("nodes", "gpus_per_node"):  # log2 of a group size needs both positive
                if getattr(key, name) < 1:
                    raise ModelError(f"comm model artifact: {key.kind.value} case: field {name} must "
                                     f"be a positive integer, got {d[name]!r}")  # fmt: skip
            try:
                curve = family(d["family"]).load(d["params"])
            except ModelError as e:
                raise ModelError(f"comm model artifact: {key.label} case: {e}") from None
            return cls(key, d["family"], curve, int(d["samples"]),
                       float(d["min_bytes"]), float(d["max_bytes"]), d.get("heldout_gmae_pct"),
                       d.get("heldout_mape_pct"), dict(d.get("candidates_heldout_gmae_pct", {})),
                       int(d.get("excluded_samples", 0)))  # fmt: skip
        except (KeyError, TypeError, ValueError) as e:
            raise ModelError(f"comm model artifact: bad case entry ({e!r})") from None


def choose_anchor(target: CaseKey, available: list[CaseKey]) -> CaseKey | None:
    """The measured case to extrapolate ``target`` from: same collective, same regime (one
    rank, inside one node, across nodes) and GPUs per node if possible, then the nearest group size,
    from below on ties."""
    cands = [k for k in available if k.kind is target.kind and k != target]
    if not cands:
        return None

    def regime(k: CaseKey) -> int:  # one rank (a local copy), inside one node, across nodes
        return 0 if k.group_size == 1 else 1 if k.nodes == 1 else 2

    def score(k: CaseKey) -> tuple[bool, bool, float, bool]:
        return (regime(k) != regime(target), k.gpus_per_node != target.gpus_per_node,
                abs(math.log2(k.group_size / target.group_size)), k.group_size > target.group_size)  # fmt: skip

    return min(cands, key=score)


def _crossings(costs: list[tuple[float, float]]) -> list[float]:
    """Sizes where two algorithms' costs cross (where min() switches line)."""
    out = []
    for i, (l1, p1) in enumerate(costs):
        for l2, p2 in costs[i + 1 :]:
            if p1 != p2 and (l2 - l1) / (p1 - p2) > 0:
                out.append((l2 - l1) / (p1 - p2))
    return out


def anchored_time(
    hier: HierarchicalModel, anchor: CaseKey, curve: Curve, target: CaseKey, nbytes: ArrayLike
) -> np.ndarray:
    """The anchor's fitted curve moved to ``target``: ``t_anchor(m) + D(m)`` where
    ``D(m) = H_target(m) - H_anchor(m)`` and ``H`` is the hierarchical model's time (fastest
    algorithm at each size).

    Monotone in size by construction: ``D`` is piecewise linear (algorithms switch at known
    sizes) and is replaced by its running maximum, exact at the switch points; when the
    target is cheaper per byte than the anchor (extrapolating down), the anchor curve is scaled
    by the per-byte ratio instead of shifted. Never below 5 % of the anchor's time.
    """
    k = target.kind
    m = np.maximum(np.asarray(nbytes, dtype=float), 0.0)
    t_ref = np.asarray(curve(m), dtype=float)
    c_t = [
        (c.latency_s, c.per_byte_s)
        for c in hier.costs(k, target.nodes, target.gpus_per_node).values()
    ]
    c_a = [
        (c.latency_s, c.per_byte_s)
        for c in hier.costs(k, anchor.nodes, anchor.gpus_per_node).values()
    ]

    def delta(x: np.ndarray) -> np.ndarray:
        return np.min([lat + x * pb for lat, pb in c_t], axis=0) - np.min(
            [lat + x * pb for lat, pb in c_a], axis=0
        )

    pb_t, pb_a = min(pb for _, pb in c_t), min(pb for _, pb in c_a)
    if pb_t < pb_a:
        lat_t, lat_a = min(lat for lat, _ in c_t), min(lat for lat, _ in c_a)
        moved = t_ref * (pb_t / pb_a) + (lat_t - lat_a)
    else:
        d = delta(m)
        knots = np.array(sorted([0.0, *_crossings(c_t), *_crossings(c_a)]))
        d_knots = np.maximum.accumulate(delta(knots))
        before = np.searchsorted(knots, m, side="right") - 1  # last knot <= m (knots[0] = 0)
        moved = t_ref + np.maximum(d, d_knots[before])
    return np.maximum(moved, _FLOOR_FRACTION * t_ref)


class CalibratedCommModel(CommModel):
    model_type = "calibrated"

    def __init__(self, *, name: str, dataset: str, cases: list[FittedCase], system: SystemSpec | None = None,
                 hier_params: HierParams | None = None, provenance: dict[str, Any] | None = None) -> None:  # fmt: skip
        self.name = name
        self.dataset = dataset
        self.system = system
        self.cases = {c.key: c for c in cases}
        if len(self.cases) != len(cases):
            raise ModelError(f"comm model {name}: a case appears twice")
        self.hier = HierarchicalModel(system, hier_params) if system is not None else None
        self.provenance_info = dict(provenance or {})

    # --- resolution ----------------------------------------------------------------------------

    def _key(
        self, kind: CollectiveKind | str, group_size: int, gpus_per_node: int | None
    ) -> CaseKey:
        k = canonical_kind(kind)
        if self.hier is not None:
            nodes, g = self.hier.placement(group_size, gpus_per_node)
            return CaseKey(k, nodes, g)
        if gpus_per_node is None:
            measured = [c for c in self.cases if c.kind is k and c.group_size == group_size]
            if len(measured) == 1:
                return measured[0]
        nodes, g = packed_placement(group_size, gpus_per_node, None)
        return CaseKey(k, nodes, g)

    def resolve(
        self, kind: CollectiveKind | str, group_size: int, gpus_per_node: int | None = None
    ) -> tuple[CaseKey, CaseKey]:
        """(target case, the case whose curve answers it)."""
        key = self._key(kind, group_size, gpus_per_node)
        if key in self.cases:
            return key, key
        if self.hier is None:
            raise ModelError(
                f"comm model {self.name} has no curve for {key.label} and no system to extrapolate with"
            )
        anchor = choose_anchor(key, list(self.cases))
        if anchor is None:
            raise ModelError(
                f"comm model {self.name} has no measured {key.kind.value} to extrapolate from"
            )
        return key, anchor

    def supports(
        self, kind: CollectiveKind | str, group_size: int, *, gpus_per_node: int | None = None
    ) -> bool:
        try:
            self.resolve(kind, group_size, gpus_per_node)
        except ModelError:
            return False
        return True

    def measured(
        self, kind: CollectiveKind | str, group_size: int, *, gpus_per_node: int | None = None
    ) -> bool:
        """Whether this model has measurements of exactly this case (no extrapolation)."""
        try:
            key, anchor = self.resolve(kind, group_size, gpus_per_node)
        except ModelError:
            return False
        return key == anchor

    def predict_many(self, kind: CollectiveKind | str, nbytes: ArrayLike, group_size: int, *,
                     gpus_per_node: int | None = None) -> tuple[np.ndarray, str]:  # fmt: skip
        key, anchor = self.resolve(kind, group_size, gpus_per_node)
        case = self.cases[anchor]
        if key == anchor:
            return np.asarray(case.curve(nbytes), dtype=float), f"calibrated:{self.dataset}"
        assert self.hier is not None
        prov = f"calibrated:{self.dataset};extrapolated-from:{anchor.nodes}x{anchor.gpus_per_node}"
        return anchored_time(self.hier, anchor, case.curve, key, nbytes), prov

    def predict(self, kind: CollectiveKind | str, nbytes: float, group_size: int, *,
                gpus_per_node: int | None = None) -> CommPrediction:  # fmt: skip
        """One message; its provenance says when it is far beyond the sizes the case measured
        (a batch's, :meth:`predict_many`'s, names the model and case only)."""
        p = super().predict(kind, nbytes, group_size, gpus_per_node=gpus_per_node)
        far = beyond_sizes(self.cases[self.resolve(kind, group_size, gpus_per_node)[1]], [nbytes])
        return CommPrediction(p.duration_s, p.provenance + far, p.model) if far else p

    # --- artifact --------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": ARTIFACT_SCHEMA,
            "model": self.model_type,
            "name": self.name,
            "dataset": self.dataset,
            "provenance": self.provenance_info,
            "system": self.system.name if self.system else None,
            "system_spec": self.system.model_dump(mode="json") if self.system else None,
            "hierarchical": None if self.hier is None else {
                "eff_node": self.hier.params.eff_node, "eff_cluster": self.hier.params.eff_cluster,
                "latency_node_s": self.hier.params.latency_node_s,
                "latency_cluster_s": self.hier.params.latency_cluster_s,
                "fitted_on": self.hier.params.fitted_on,
            },
            "cases": [c.to_dict() for c in self.cases.values()],
        }  # fmt: skip

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> CalibratedCommModel:
        if doc.get("schema") != ARTIFACT_SCHEMA or doc.get("model") != cls.model_type:
            raise ModelError(
                f"not a calibrated comm model artifact (schema {doc.get('schema')!r}, model {doc.get('model')!r})"
            )
        try:
            system = _system(doc)
            hier = HierParams(**doc["hierarchical"]) if doc.get("hierarchical") else None
            cases = [FittedCase.from_dict(c) for c in doc["cases"]]
            if not cases:
                raise ModelError("calibrated comm model artifact: field cases is empty (no measured case)")
            return cls(name=doc["name"], dataset=doc["dataset"], cases=cases, system=system, hier_params=hier,
                       provenance=doc.get("provenance"))  # fmt: skip
        except (KeyError, TypeError, ValidationError) as e:
            raise ModelError(
                f"calibrated comm model artifact: bad or missing field ({e!r})"
            ) from None


def _system(doc: dict[str, Any]) -> SystemSpec | None:
    """The system an artifact was measured on: its ``system_spec``, else its catalog ``system``."""
    spec = doc.get("system_spec")
    if spec:
        try:
            return _SystemSchema.model_validate(spec)
        except ValidationError as e:
            raise ModelError(f"comm model artifact: {validation_message(e, 'system_spec')}") from None
    if not doc.get("system"):
        return None
    try:
        return get_system(doc["system"])
    except ConfigError as e:  # ModelError: the registry names the artifact file
        raise ModelError(f"comm model artifact: field system: {e}") from None
