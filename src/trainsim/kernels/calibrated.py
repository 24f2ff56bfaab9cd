"""Learned kernel models fitted on one device's measurements: one regressor per entry.

An entry (operator, phase, dtype) holds the regressor chosen for it (a kind of
:mod:`trainsim.kernels.learned`), the model columns it reads
(:func:`trainsim.kernels.features.model_columns`, by name), the range of every input it was
fitted on, the monotone claims it honours (the operator's, less those its measurements
contradict, :func:`trainsim.kernels.fitting.data_claims`), and the evidence: held-out errors,
the candidates' validation errors, row counts.

Prediction: ``t = 2 ** f(columns(x))``. Inside the fitted range that is all. Outside it (a
larger model than was benchmarked, a new parallel degree) trees would answer flat, so the
inputs are clipped to the range and the answer is carried along the entry's calibrated
efficiency curve (:class:`~trainsim.kernels.roofline.EfficiencyCurve`, fitted on the same rows)::

    t(x) = t(clip(x)) * curve(x) / curve(clip(x))

that is, the measured time at the nearest measured point, scaled by how the entry's own
measurements say time changes between the two problem sizes (efficiency falls on smaller
problems and levels off on large ones; beyond the curve's end knots it stays constant, and the
ratio is the roofline's). An entry saved without a curve (artifacts before 2026-11-27) carries
along the roofline alone, ``roofline(x) / roofline(clip(x))``. On paper 001's data, with each
input's lowest or highest measured value held out in turn (564 slices), the curve lowers the
mean error from 9.2 to 7.1 % and halves the roofline carry's bias (``scripts/extrapolation_carry.py``;
docs/kernels.md). The curve carry can break a monotone claim where the roofline carry does not
(its factor depends on where the clipped point sits on the curve): fitting keeps an entry's
curve only where a sweep across and beyond its range finds no such break
(:func:`trainsim.kernels.monotone.extrapolation_violation`). Neither carry is monotone by
construction beyond the range (a tree non-monotone near its edge carries its dip out). The
provenance then reads ``calibrated:<dataset>;extrapolated``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from trainsim.errors import ConfigError, ModelError
from trainsim.hardware import DeviceSpec
from trainsim.hardware.schema import DeviceSpec as _DeviceSchema
from trainsim.ir.kinds import KernelFamily
from trainsim.kernels.features import (
    ALIGN_COLUMNS,
    OpSpec,
    device_inputs,
    dtype_bytes,
    log2_columns,
    named_columns,
    op_spec,
    pow2_divisor,
    roofline_s,
)
from trainsim.kernels.learned import Portable, load_portable
from trainsim.kernels.model import KernelModel, KernelQuery
from trainsim.kernels.roofline import EfficiencyCurve
from trainsim.kernels.samples import EntryKey


@dataclass(frozen=True, slots=True, eq=False)
class LearnedEntry:
    key: EntryKey
    family: KernelFamily
    kind: str
    config: dict[str, Any]
    columns: tuple[str, ...]
    regressor: Portable
    ranges: dict[str, tuple[float, float]]
    samples: int  # rows of the final fit
    metrics: dict[str, Any] = field(default_factory=dict)  # held-out errors, candidates, ...
    claims: dict[str, int] = field(default_factory=dict)  # monotone claims the data support
    curve: EfficiencyCurve | None = None  # carries answers outside ``ranges`` (module doc)

    def design(self, spec: OpSpec, x: dict[str, np.ndarray], w: dict[str, np.ndarray], device: DeviceSpec,
               aligned: Mapping[str, np.ndarray] | None = None) -> np.ndarray:  # fmt: skip
        """The entry's columns (only those) for the op's inputs ``x``, as :func:`device_inputs`
        gives them, and ``w``, their ``spec.derive``; ``aligned``: the inputs the alignment
        columns read instead (the unclipped sizes: a clipped size has its bound's alignment,
        not its own)."""
        cols = named_columns(spec, x, w, device, self.key.dtype)
        missing = [c for c in self.columns if c not in cols]
        if missing:
            raise ModelError(f"entry {self.key.label} reads column {missing[0]!r}, which operator {spec.name} "
                             f"does not make on {device.name}: refit the model with this trainsim")  # fmt: skip
        out = log2_columns(cols, self.columns)
        if aligned is not None:
            for j, c in enumerate(self.columns):
                if c in ALIGN_COLUMNS:
                    out[:, j] = np.log2(pow2_divisor(aligned[c.removeprefix("align_")]))
        return out

    def predict(
        self, inputs: Mapping[str, ArrayLike], device: DeviceSpec
    ) -> tuple[np.ndarray, bool]:
        """(seconds, whether any row was outside the fitted range)."""
        spec = op_spec(self.key.op)
        eb = dtype_bytes(self.key.dtype)
        x = device_inputs(spec, inputs, device, self.key.dtype)
        shape = next(iter(x.values())).shape
        x = {k: np.atleast_1d(v).ravel() for k, v in x.items()}
        clipped = {k: np.clip(v, *self.ranges[k]) if k in self.ranges else v for k, v in x.items()}
        outside = any(bool(np.any(clipped[k] != x[k])) for k in x)
        # the op's derived quantities once per input set (the design and the roofline share them)
        w_c = spec.derive(clipped, eb)
        t = np.exp2(self.regressor.predict(self.design(spec, clipped, w_c, device, x if outside else None)))
        if outside:
            w_x = spec.derive(x, eb)
            r_x = roofline_s(w_x["flops"], w_x["bytes"], device, self.key.dtype)
            r_c = roofline_s(w_c["flops"], w_c["bytes"], device, self.key.dtype)
            t = t * (self.curve(r_x) / self.curve(r_c) if self.curve is not None else r_x / r_c)
        return t.reshape(shape) if shape else t, outside


class LearnedKernelModel(KernelModel):
    model_type = "learned"

    def __init__(self, *, device: DeviceSpec, dataset: str, entries: list[LearnedEntry],
                 provenance: dict[str, Any] | None = None, name: str | None = None) -> None:  # fmt: skip
        self.spec = device
        self.device = device.name
        self.dataset = dataset
        self.entries = {e.key: e for e in entries}
        if len(self.entries) != len(entries):
            raise ModelError(f"learned kernel model {dataset}: an entry appears twice")
        self.provenance_info = dict(provenance or {})
        self.name = name or f"learned:{dataset}"
        self.origin: str | None = None  # the artifact it was read from (read_artifact sets it)

    def supports(self, q: KernelQuery) -> bool:
        e = self.entries.get(q.key)
        if e is None:
            return False
        return all(n in q.inputs for n in op_spec(q.op).required)

    def predict_many(
        self, q: KernelQuery, inputs: Mapping[str, ArrayLike]
    ) -> tuple[np.ndarray, str]:
        e = self.entries.get(q.key)
        if e is None:
            raise ModelError(f"{self.name} has no model for {q.key.label}")
        try:
            t, outside = e.predict(inputs, self.spec)
        except ModelError as err:  # a damaged or hand-edited artifact shows at its first query: name it
            raise ModelError(f"{self.origin}: {err}" if self.origin else str(err)) from None
        return t, f"calibrated:{self.dataset}" + (";extrapolated" if outside else "")

    def domain(self) -> list[tuple[KernelFamily, EntryKey, dict[str, tuple[float, float]]]]:
        return [(e.family, e.key, dict(e.ranges)) for e in self.entries.values()]

    # --- artifact ----------------------------------------------------------------------------

    def to_artifact(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        manifest: dict[str, Any] = {"model": self.model_type, "name": self.name, "dataset": self.dataset,
                                    "device": self.device, "device_spec": self.spec.model_dump(mode="json"),
                                    "provenance": self.provenance_info, "entries": []}  # fmt: skip
        arrays: dict[str, np.ndarray] = {}
        for i, e in enumerate(sorted(self.entries.values(), key=lambda e: e.key)):
            meta, arr = e.regressor.to_arrays()
            prefix = f"e{i}/"
            manifest["entries"].append({
                "entry": e.key.label, "family": e.family.value, "kind": e.kind, "config": e.config,
                "columns": list(e.columns), "ranges": {k: list(v) for k, v in e.ranges.items()},
                "samples": e.samples, "metrics": e.metrics, "claims": e.claims, "regressor": meta, "arrays": prefix,
                **({"curve": {"u": e.curve.u.tolist(), "g": e.curve.g.tolist(), "samples": e.curve.samples}}
                   if e.curve is not None else {}),
            })  # fmt: skip
            arrays.update({prefix + k: v for k, v in arr.items()})
        return manifest, arrays

    @classmethod
    def from_artifact(
        cls, manifest: dict[str, Any], arrays: Mapping[str, np.ndarray]
    ) -> LearnedKernelModel:
        try:
            spec = _DeviceSchema.model_validate(manifest["device_spec"])
            entries = []
            for d in manifest["entries"]:
                prefix = d["arrays"]
                arr = {
                    k[len(prefix) :]: np.asarray(v)
                    for k, v in arrays.items()
                    if k.startswith(prefix)
                }
                entries.append(LearnedEntry(
                    EntryKey.parse(d["entry"]), KernelFamily(d["family"]), d["kind"], dict(d["config"]),
                    tuple(d["columns"]), load_portable(d["kind"], d["regressor"], arr),
                    {k: (float(v[0]), float(v[1])) for k, v in d["ranges"].items()}, int(d["samples"]),
                    dict(d.get("metrics", {})), {k: int(v) for k, v in d.get("claims", {}).items()},
                    _curve(d.get("curve"), d["entry"])))  # fmt: skip
            return cls(device=spec, dataset=manifest["dataset"], entries=entries,
                       provenance=manifest.get("provenance"), name=manifest.get("name"))  # fmt: skip
        except (KeyError, TypeError, ValueError, ConfigError) as e:
            raise ModelError(
                f"learned kernel model artifact: bad or missing field ({e!r})"
            ) from None


def _curve(doc: Any, entry: str) -> EfficiencyCurve | None:
    """An entry's saved efficiency curve (its knots), or None where the artifact has none."""
    if doc is None:
        return None
    bad = (f"entry {entry}: efficiency curve: expected {{'u': [...], 'g': [...], 'samples': n}} with u increasing, "
           "u and g finite and of one length")  # fmt: skip
    try:
        u, g, n = np.asarray(doc["u"], dtype=float), np.asarray(doc["g"], dtype=float), int(doc["samples"])
    except (KeyError, TypeError, ValueError):
        raise ModelError(bad) from None
    if u.ndim != 1 or u.shape != g.shape or not u.size or not np.all(np.isfinite(u) & np.isfinite(g)) or np.any(np.diff(u) <= 0):
        raise ModelError(bad)
    return EfficiencyCurve(u, g, n)
