"""Calibrated kernel answers on an edited copy of a catalog device.

A device YAML that keeps a catalog device's name but edits its peaks or memory bandwidth (a
what-if: "an A100 with twice the tensor-core FLOP/s") used to be answered by the calibrated
models of that name unchanged, so the edit did nothing where the measurements answered. The
models were measured on the catalog part, not on the edited one: their answer stands for the
catalog spec. Here it is carried to the edited spec at the same efficiency (the fraction of
the roofline the kernel reached when measured)::

    t_edited(q) = t_calibrated(q) * roofline_edited(q) / roofline_catalog(q)

with ``roofline = max(FLOPs / peak, bytes / bandwidth)`` of the query's operator at its
inputs (:func:`trainsim.kernels.features.roofline_s`). A compute-bound GEMM on a copy with 2x
the peak takes half the time; a memory-bound norm does not move until the bandwidth is edited;
an operator near the ridge moves by the part of its roofline that changed. The roofline of the
forward pass stands for the backward too (their FLOP and byte counts scale alike for the
operators here, so the ratio is the same up to where the ridge falls). Edits the roofline does
not read (memory size, L2, SMs, links) leave calibrated answers as they are; the spec-based
models are built from the edited spec itself and need no carry.

Provenance keeps ``calibrated:<dataset>`` and adds ``;spec-rescaled:<device>`` so a prediction
says its calibrated answers were moved by spec ratios, not measured on that spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from trainsim.hardware import DeviceSpec, find_device
from trainsim.ir.kinds import KernelFamily
from trainsim.kernels.features import derive, op_spec, roofline_s
from trainsim.kernels.model import KernelModel, KernelQuery
from trainsim.kernels.samples import EntryKey

RESCALED = ";spec-rescaled:"

# the fields the roofline reads: an edit elsewhere moves no kernel time
_ROOFLINE_FIELDS = ("peak_tflops", "memory_bandwidth_GBps")


def edited_catalog_device(spec: DeviceSpec) -> DeviceSpec | None:
    """The catalog device ``spec`` is an edited copy of: named by that device's name or an
    alias (:func:`~trainsim.hardware.catalog_name`), with other peaks or memory bandwidth; None
    for a catalog device itself, an edit the roofline does not read, or a name the catalog
    lacks (a user's own device, answered by its own models as given)."""
    d = find_device(spec.name)
    if d is None or not any(getattr(d, f) != getattr(spec, f) for f in _ROOFLINE_FIELDS):
        return None
    return d


def same_roofline(a: DeviceSpec, b: DeviceSpec) -> bool:
    return all(getattr(a, f) == getattr(b, f) for f in _ROOFLINE_FIELDS)


def measured_on(model: KernelModel, spec: DeviceSpec) -> bool:
    """Whether ``model`` was fitted on a device with ``spec``'s roofline (its artifact records
    the measured device's spec)."""
    own = getattr(model, "spec", None)
    return isinstance(own, DeviceSpec) and same_roofline(own, spec)


def edited_fields(spec: DeviceSpec, catalog: DeviceSpec) -> list[str]:
    """The roofline fields of ``spec`` that differ from ``catalog``'s (for notes)."""
    return [f for f in _ROOFLINE_FIELDS if getattr(spec, f) != getattr(catalog, f)]


def roofline_ratio(op: str, dtype: str, inputs: Mapping[str, ArrayLike],
                   source: DeviceSpec, target: DeviceSpec) -> np.ndarray:  # fmt: skip
    """``roofline_target / roofline_source`` of ``op`` at ``inputs`` (arrays broadcast)."""
    w = derive(op_spec(op), inputs, dtype)
    r_src = roofline_s(w["flops"], w["bytes"], source, dtype)
    r_tgt = roofline_s(w["flops"], w["bytes"], target, dtype)
    return np.asarray(
        np.where(r_src > 0, r_tgt / np.where(r_src > 0, r_src, 1.0), 1.0), dtype=float
    )


class RescaledKernelModel(KernelModel):
    """``inner`` (a calibrated model of the catalog device ``source``) answering for
    ``target``, an edited copy of it: each answer times the roofline ratio (module doc)."""

    model_type = "rescaled"  # never written: to_artifact refuses

    def __init__(self, inner: KernelModel, source: DeviceSpec, target: DeviceSpec) -> None:
        self.inner, self.source, self.target = inner, source, target
        self.device = target.name
        self.name = f"{inner.name}{RESCALED}{target.name}"

    @property
    def calibrated(self) -> bool:  # what _has_own_models and provenance summaries ask
        return True

    def supports(self, q: KernelQuery) -> bool:
        return self.inner.supports(q)

    def predict_many(
        self, q: KernelQuery, inputs: Mapping[str, ArrayLike]
    ) -> tuple[np.ndarray, str]:
        t, prov = self.inner.predict_many(q, inputs)
        ratio = roofline_ratio(q.op, q.key.dtype, inputs, self.source, self.target)
        if np.all(ratio == 1.0):
            return t, prov
        return t * ratio, prov + RESCALED + self.target.name

    def domain(self) -> list[tuple[KernelFamily, EntryKey, dict[str, tuple[float, float]]]]:
        return self.inner.domain()

    def to_artifact(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        from trainsim.errors import ModelError

        raise ModelError(
            f"{self.name}: a rescaled view of {self.inner.name} is not an artifact; save the inner model"
        )


def _describe(field: str, old: Any, new: Any) -> str:
    if field == "peak_tflops":  # the precisions that changed, in TFLOP/s
        a, b = old.model_dump(), new.model_dump()

        def peak(v: float | None) -> str:  # a precision the part lacks: its math runs at fp32's
            return "none" if v is None else f"{v:g} TFLOP/s"

        return ", ".join(f"{k} peak {peak(a.get(k))} -> {peak(b.get(k))}" for k in b if a.get(k) != b.get(k))
    return f"{field} {old:g} -> {new:g}"


def rescaled_note(spec: DeviceSpec) -> str | None:
    """Why calibrated kernel answers for ``spec`` were moved (an edited copy), else None."""
    catalog = edited_catalog_device(spec)
    if catalog is None:
        return None
    fields = ", ".join(
        _describe(f, getattr(catalog, f), getattr(spec, f)) for f in edited_fields(spec, catalog)
    )
    return (f"device {spec.name} is an edited copy of the catalog's (its {fields}): the kernel models "
            f"measured on the catalog part answer at the efficiency they measured, carried to the edited "
            f"roofline (time x edited roofline / catalog roofline, per operator: ;spec-rescaled in provenance)")  # fmt: skip
