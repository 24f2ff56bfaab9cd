"""The plug point of kernel models: a query, a prediction, and a tiny base class.

A kernel model answers "how long does this operator (or kernel) take on this device":
``predict_many(query, inputs) -> (seconds, provenance)`` for arrays of inputs, ``supports``
says whether it can, ``to_artifact``/``from_artifact`` make the npz/JSON artifact (numbers
only, never pickle). Every model is non-negative, deterministic and monotone in the inputs
the operator's :class:`~trainsim.kernels.features.OpSpec` signs; ``tests/test_kernels_conformance.py``
checks that for every registered model.

Provenance is ``calibrated:<dataset>`` (fitted on measurements of this device),
``calibrated:<dataset>;extrapolated`` (outside the measured range, carried from the nearest
measured point along the entry's measured efficiency curve: :mod:`trainsim.kernels.calibrated`)
or ``spec-based:<device>`` (catalog peaks only).

A :class:`KernelQuery` is what a model sees of an IR :class:`~trainsim.ir.graph.Kernel`
(:func:`query_from_kernel`): its family and, from ``Kernel.features``, the operator
(``op``; default: the family's generic operator, or ``work`` when ``flops``/``bytes`` are
given), the phase (``phase``: fwd/bwd/step; default fwd, step for optimizers), the dtype
(``dtype``; default fp16) and every numeric feature.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from trainsim.errors import ModelError, NotCalibratedError
from trainsim.ir.graph import Kernel
from trainsim.ir.kinds import KernelFamily
from trainsim.kernels.features import (
    DEFAULT_DTYPE,
    GENERIC_OP,
    OPS,
    WORK_OP,
    Phase,
    canonical_dtype,
    op_spec,
)
from trainsim.kernels.samples import EntryKey


@dataclass(frozen=True, slots=True)
class KernelQuery:
    family: KernelFamily
    key: EntryKey
    inputs: Mapping[str, float] = field(default_factory=dict)

    @property
    def op(self) -> str:
        return self.key.op


@dataclass(frozen=True, slots=True)
class KernelPrediction:
    duration_s: float
    provenance: str
    model: str

    @property
    def calibrated(self) -> bool:
        return self.provenance.startswith("calibrated:")


def query_from_kernel(kernel: Kernel) -> KernelQuery:
    """The query a model answers for ``kernel`` (see the module docstring for the defaults)."""
    f = kernel.features
    numeric = {
        k: float(v) for k, v in f.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }
    op = str(f.get("op", ""))
    if not op:
        if "flops" in numeric or "bytes" in numeric:
            op = WORK_OP
        elif kernel.family in GENERIC_OP:
            op = GENERIC_OP[kernel.family]
        else:
            raise NotCalibratedError(
                f"kernel {kernel.id} ({kernel.name[:40]}): family {kernel.family.value} has no generic "
                f"operator; give features op=<one of {', '.join(sorted(OPS))}> with its inputs, or flops/bytes"
            )
    default_phase = Phase.STEP if kernel.family is KernelFamily.OPTIMIZER else Phase.FWD
    try:
        phase = Phase(str(f.get("phase", default_phase.value)))
        key = EntryKey(op, phase, canonical_dtype(str(f.get("dtype", DEFAULT_DTYPE))))
    except ValueError as e:
        raise ModelError(f"kernel {kernel.id} ({kernel.name[:40]}): {e}") from None
    return KernelQuery(kernel.family, key, numeric)


def query(op: str, *, phase: Phase | str = Phase.FWD, dtype: str = DEFAULT_DTYPE,
          family: KernelFamily | None = None, **inputs: float) -> KernelQuery:  # fmt: skip
    """A query built by hand: ``query("linear1", b=4, l=2048, dim=4096, mp=2)``."""
    p = Phase(phase)
    fam = family or (op_spec(op).family_for(p) if op != WORK_OP else KernelFamily.OTHER)
    return KernelQuery(fam, EntryKey(op, p, canonical_dtype(dtype)), dict(inputs))


class KernelModel(ABC):
    """Base class of kernel models (see the module docstring for the contract)."""

    name: str
    model_type: str  # the artifact's "model" field; the registry loads by it
    device: str  # catalog device name

    @abstractmethod
    def supports(self, q: KernelQuery) -> bool: ...

    @abstractmethod
    def predict_many(
        self, q: KernelQuery, inputs: Mapping[str, ArrayLike]
    ) -> tuple[np.ndarray, str]:
        """Seconds for each row of ``inputs`` (arrays broadcast together) of query ``q``'s
        operator, phase and dtype, and the provenance shared by all of them."""

    @abstractmethod
    def domain(self) -> list[tuple[KernelFamily, EntryKey, dict[str, tuple[float, float]]]]:
        """What the model answers: (family, entry, input -> (low, high) range) triples."""

    @abstractmethod
    def to_artifact(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """(JSON-able manifest, named numpy arrays)."""

    def predict(self, q: KernelQuery) -> KernelPrediction:
        if not self.supports(q):
            raise ModelError(
                f"kernel model {self.name} cannot predict {q.family.value} {q.key.label}"
            )
        t, prov = self.predict_many(q, {k: np.array([v]) for k, v in q.inputs.items()})
        s = float(t[0])
        if not (math.isfinite(s) and s >= 0):
            raise ModelError(f"kernel model {self.name} predicted {s!r} s for {q.key.label}")
        return KernelPrediction(s, prov, self.name)
