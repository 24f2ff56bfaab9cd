"""The simulator's plug point for kernel models (``trainsim.sim.durations.KernelModel``).

:class:`SimKernelModels` answers for every non-collective kernel :func:`predict_kernel` can
answer: kernels whose ``features`` say what they compute (``op`` + inputs, or ``flops``/
``bytes``), and traced GEMMs and element-wise kernels whose launching op's input shapes say it
(:func:`features_from_op`: ``aten::mm/addmm/bmm/matmul/linear`` -> ``gemm`` m, n, k, batch;
a single-kernel op -> ``elementwise`` numel). Register it ahead of the spec-based defaults::

    registry = ModelRegistry([SimKernelModels(), *default_registry_models])
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainsim.errors import ModelError
from trainsim.hardware import DeviceSpec
from trainsim.ir.graph import Kernel, Op, TensorMeta
from trainsim.ir.kinds import KernelFamily
from trainsim.kernels.features import gemm_inputs
from trainsim.kernels.model import KernelQuery, query_from_kernel
from trainsim.kernels.registry import predict_query

if TYPE_CHECKING:
    from trainsim.sim.durations import Prediction

_GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"})
_DTYPES = {"c10::half": "fp16", "c10::bfloat16": "bf16", "float": "fp32", "half": "fp16", "bfloat16": "bf16",
           "float16": "fp16", "float32": "fp32"}  # fmt: skip


def _dtype(t: TensorMeta) -> str:
    return _DTYPES.get(t.dtype.lower(), "fp32")


def features_from_op(op: Op, kernel: Kernel) -> dict[str, float | str]:
    """Operator inputs derived from the launching op's input shapes, or {} when they do not say."""
    shapes = [t for t in op.inputs if t.shape]
    if kernel.family is KernelFamily.GEMM and op.name in _GEMM_OPS and len(shapes) >= 2:
        if sum(k.family is KernelFamily.GEMM for k in op.kernels) != 1:
            return {}  # several GEMMs under one op (e.g. a backward): shapes do not say which
        inputs = gemm_inputs(op.name.removeprefix("aten::"), [t.shape for t in shapes])
        if inputs is None:
            return {}
        a = shapes[1] if op.name == "aten::addmm" else shapes[0]  # the left operand (addmm: after the bias)
        return {"op": "gemm", **inputs, "dtype": _dtype(a)}
    if kernel.family is KernelFamily.ELEMENTWISE and len(op.kernels) == 1 and shapes:
        return {
            "op": "elementwise",
            "numel": max(t.numel for t in shapes),
            "dtype": _dtype(shapes[0]),
        }
    return {}


class SimKernelModels:
    """Adapter: trainsim's kernel models behind the simulator's ``KernelModel`` protocol."""

    name = "kernels"
    families: tuple[KernelFamily, ...] = tuple(
        f for f in KernelFamily if not f.is_communication and f is not KernelFamily.CPU
    )
    provenance = "kernels"  # each prediction carries its own (calibrated:... / spec-based:...)

    def _query(self, kernel: Kernel, op: Op) -> KernelQuery | None:
        k = kernel
        if "op" not in k.features and "flops" not in k.features and "bytes" not in k.features:
            extra = features_from_op(op, k)
            if not extra:
                return None
            k = Kernel(k.id, k.name, k.family, k.stream, features={**k.features, **extra})
        try:
            return query_from_kernel(k)
        except ModelError:
            return None

    def supports(self, kernel: Kernel, op: Op, device: DeviceSpec | None) -> bool:
        if device is None:
            return False
        q = self._query(kernel, op)
        if q is None:
            return False
        try:
            predict_query(q, device)
        except ModelError:
            return False
        return True

    def predict(self, kernel: Kernel, op: Op, device: DeviceSpec | None) -> Prediction:
        from trainsim.sim.durations import Prediction

        q = self._query(kernel, op)
        if q is None or device is None:
            raise ModelError(
                f"kernel {kernel.id} ({kernel.name[:40]}): no features a kernel model can use"
            )
        p = predict_query(q, device)
        return Prediction(p.duration_s, p.provenance)
