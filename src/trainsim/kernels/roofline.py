"""The roofline model (002 §4.3.2.1.2): spec-based from catalog peaks, or calibrated with
measured efficiency curves.

Spec-based (``spec-based:<device>``)::

    t = max(t_min, w * FLOPs / peak[dtype], w * bytes / memory bandwidth)

with the datasheet peaks of the catalog device: a lower bound (real kernels reach 50–90 % of
the peaks). ``t_min`` = 2 µs: no kernel launch finishes faster (Approximation). FLOPs and bytes
come from the operator's inputs (:func:`trainsim.kernels.features.derive`); what each operator
needs is its :class:`~trainsim.kernels.features.OpSpec` ``inputs``, e.g. ``m, n, k`` for
``gemm``, ``numel`` for ``elementwise``, or plain ``flops``/``bytes`` (the ``work`` operator).
Those describe the forward pass; a backward query costs ``w`` times that work (Approximation,
:data:`BACKWARD_WORK`): 2 for most operators (a GEMM's backward is two GEMMs of the forward's
size, dX and dW; an element-wise or norm backward reads the output gradient and the input and
writes the input gradient), 2.5 for FlashAttention (its backward runs five matmuls of the
forward's two: FlashAttention-2, Dao 2023, §3.1.2). Without it a spec-based backward took the
forward's time and fp32 predictions reported an MFU above 100 %.

Calibrated (``calibrated:<dataset>``): per (operator, phase, dtype) an *efficiency curve* —
``log2(measured / roofline)`` against ``log2(roofline time)``, the median of quantile bins of
the measurements, linear between knots and flat beyond — so the model keeps the roofline's
physics and learns how far below the peaks the operator runs at each size (002: "the maximum
measured bandwidth of the benchmark as the corrected peak", generalized to a curve). The best
measured fraction of the roofline is kept as ``peak_fraction``. Monotone by construction: the
curve's slope is clipped to >= -1, so time never decreases as the roofline time grows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from trainsim.errors import ModelError
from trainsim.hardware import DeviceSpec
from trainsim.hardware.schema import DeviceSpec as _DeviceSchema
from trainsim.ir.kinds import KernelFamily
from trainsim.kernels.features import OPS, Phase, derive, op_spec, roofline_s
from trainsim.kernels.model import KernelModel, KernelQuery
from trainsim.kernels.samples import EntryKey

MIN_KERNEL_S = 2e-6  # Approximation: no kernel launch completes faster on current GPUs
BACKWARD_WORK = {"flash_atten": 2.5}  # backward / forward work per operator; others: 2.0
_BACKWARD_DEFAULT = 2.0
_KNOTS = 12
_SPEC_RANGE = 4.0  # spec-based domain: each input from example/4 to example*4 (for sweeps)
# Families a spec-based roofline does not answer: collectives have their own models (comm/).
_NOT_ROOFLINE = frozenset(f for f in KernelFamily if f.is_communication) | {KernelFamily.CPU}


@dataclass(frozen=True, slots=True)
class EfficiencyCurve:
    """``log2(t / roofline)`` as a function of ``u = log2(roofline seconds)``."""

    u: np.ndarray
    g: np.ndarray
    samples: int
    heldout_mape_pct: float | None = None

    def __call__(self, roof_s: np.ndarray) -> np.ndarray:
        u = np.log2(np.maximum(roof_s, 1e-30))
        return np.exp2(u + np.interp(u, self.u, self.g))

    @property
    def peak_fraction(self) -> float:
        """The best measured fraction of the roofline (1 = at the datasheet peak)."""
        return float(np.exp2(-self.g.min()))


def efficiency_knots(
    u: np.ndarray, v: np.ndarray, knots: int = _KNOTS
) -> tuple[np.ndarray, np.ndarray]:
    """Knots of ``v = log2(t / roofline)`` against ``u = log2(roofline)``: medians of up to
    ``knots`` equal-count bins of u, then the slope clipped to >= -1 (so ``u + v`` never
    decreases: time never drops as the roofline time grows)."""
    order = np.argsort(u, kind="stable")
    u, v = u[order], v[order]
    bins = np.array_split(np.arange(u.size), min(knots, max(1, u.size // 10)))
    ku = np.array([np.median(u[b]) for b in bins if b.size])
    kg = np.array([np.median(v[b]) for b in bins if b.size])
    ku, idx = np.unique(ku, return_index=True)
    kg = kg[idx]
    for i in range(1, kg.size):
        kg[i] = max(kg[i], kg[i - 1] - (ku[i] - ku[i - 1]))
    return ku, kg


def fit_efficiency(roof_s: np.ndarray, seconds: np.ndarray) -> EfficiencyCurve:
    ku, kg = efficiency_knots(np.log2(roof_s), np.log2(seconds / roof_s))
    return EfficiencyCurve(ku, kg, int(seconds.size))


class RooflineModel(KernelModel):
    """Spec-based when ``curves`` is None, else calibrated on the entries it has curves for."""

    model_type = "roofline"

    def __init__(self, device: DeviceSpec, *, curves: Mapping[EntryKey, EfficiencyCurve] | None = None,
                 dataset: str | None = None, provenance: dict[str, Any] | None = None) -> None:  # fmt: skip
        if curves is not None and not dataset:
            raise ModelError("a calibrated roofline needs the dataset name it was fitted on")
        self.spec = device
        self.device = device.name
        self.curves = dict(curves) if curves is not None else None
        self.dataset = dataset
        self.provenance_info = dict(provenance or {})
        self.name = f"roofline:{dataset}" if curves is not None else f"roofline:{device.name}"

    @property
    def calibrated(self) -> bool:
        return self.curves is not None

    def supports(self, q: KernelQuery) -> bool:
        if self.curves is not None:
            return q.key in self.curves and self._has_inputs(q)
        return q.family not in _NOT_ROOFLINE and q.op in OPS and self._has_inputs(q)

    @staticmethod
    def _has_inputs(q: KernelQuery) -> bool:
        return all(n in q.inputs for n in op_spec(q.op).required)

    def predict_many(
        self, q: KernelQuery, inputs: Mapping[str, ArrayLike]
    ) -> tuple[np.ndarray, str]:
        w = derive(op_spec(q.op), inputs, q.key.dtype)
        roof = roofline_s(w["flops"], w["bytes"], self.spec, q.key.dtype)
        if self.curves is None:
            if q.key.phase is Phase.BWD:
                roof = roof * BACKWARD_WORK.get(q.op, _BACKWARD_DEFAULT)
            return np.maximum(roof, MIN_KERNEL_S), f"spec-based:{self.device}"
        if q.key not in self.curves:
            raise ModelError(f"{self.name} has no efficiency curve for {q.key.label}")
        return self.curves[q.key](roof), f"calibrated:{self.dataset}"

    def domain(self) -> list[tuple[KernelFamily, EntryKey, dict[str, tuple[float, float]]]]:
        out = []
        keys = self.curves if self.curves is not None else {
            EntryKey(name, phase, "fp16"): None for name in OPS for phase in _phases(name)
        }  # fmt: skip
        for key in keys:
            spec = op_spec(key.op)
            fam = spec.family_for(key.phase)
            if self.curves is None and fam in _NOT_ROOFLINE:
                continue
            rng = self.provenance_info.get("ranges", {}).get(key.label)
            ranges = {k: (float(v[0]), float(v[1])) for k, v in rng.items()} if rng else {
                k: (v / _SPEC_RANGE, v * _SPEC_RANGE) for k, v in spec.example.items() if k not in spec.flags
            }  # fmt: skip (a 0/1 flag has a default: the domain is the sizes)
            out.append((fam, key, ranges))
        return out

    def to_artifact(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        manifest: dict[str, Any] = {"model": self.model_type, "name": self.name, "dataset": self.dataset,
                                    "device": self.device, "device_spec": self.spec.model_dump(mode="json"),
                                    "provenance": self.provenance_info, "curves": []}  # fmt: skip
        arrays: dict[str, np.ndarray] = {}
        for i, (key, c) in enumerate(sorted((self.curves or {}).items())):
            manifest["curves"].append({"entry": key.label, "samples": c.samples, "peak_fraction": c.peak_fraction,
                                       "heldout_mape_pct": c.heldout_mape_pct, "arrays": f"c{i}/"})  # fmt: skip
            arrays[f"c{i}/u"], arrays[f"c{i}/g"] = c.u, c.g
        if self.curves is None:
            manifest["curves"] = None
        return manifest, arrays

    @classmethod
    def from_artifact(
        cls, manifest: dict[str, Any], arrays: Mapping[str, np.ndarray]
    ) -> RooflineModel:
        try:
            spec = _DeviceSchema.model_validate(manifest["device_spec"])
            curves = None
            if manifest["curves"] is not None:
                curves = {
                    EntryKey.parse(c["entry"]): EfficiencyCurve(
                        np.asarray(arrays[c["arrays"] + "u"], dtype=float),
                        np.asarray(arrays[c["arrays"] + "g"], dtype=float),
                        int(c["samples"]), c.get("heldout_mape_pct"))
                    for c in manifest["curves"]
                }  # fmt: skip
            return cls(
                spec,
                curves=curves,
                dataset=manifest.get("dataset"),
                provenance=manifest.get("provenance"),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ModelError(f"roofline artifact: bad or missing field ({e!r})") from None


def _phases(op: str) -> tuple[Any, ...]:
    from trainsim.kernels.features import Phase

    fam = op_spec(op).family
    return (Phase.STEP,) if fam is KernelFamily.OPTIMIZER else (Phase.FWD, Phase.BWD)
