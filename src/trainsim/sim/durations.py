"""Kernel and collective durations for the simulator: measured, or from a model registry.

The registry is the plug point for ``kernels/`` and ``comm/``: a model is a tiny object with
``families``, ``provenance``, ``supports(kernel, op, device)`` and ``predict(...) -> seconds``;
the first registered model of a kernel's family that supports it answers. The default
registry holds spec-based roofline models (peaks from datasheets, no fitted efficiency), so
their predictions are lower bounds and say so in their provenance.

Collectives (measured): a collective kernel's measured duration on one rank includes waiting
for its peers. The transfer time of one instance is the duration seen by its last-arriving
member (for NCCL, whose members end together, the minimum over members); members absent from
the workload (rank 0 of a 16-rank job) are assumed to arrive on time, so a lone member's
transfer is its own measured duration (see ``program._transfer``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from trainsim.errors import ConfigError, ModelError
from trainsim.ir.graph import Collective, Kernel, Op
from trainsim.ir.kinds import CollectiveKind, KernelFamily

if TYPE_CHECKING:
    from trainsim.comm.model import CommModel, CommPrediction
    from trainsim.hardware import DeviceSpec, SystemSpec


def device_spec(name: str) -> DeviceSpec | None:
    """The catalog device of a trace's device name (e.g. 'Tesla V100-SXM2-32GB'), or None."""
    if not name:
        return None
    from trainsim.hardware import find_device

    return find_device(name)


@runtime_checkable
class KernelModel(Protocol):
    """A duration model for some kernel families (``kernels/`` and ``comm/`` plug in here)."""

    name: str
    families: tuple[KernelFamily, ...]
    provenance: str  # "spec-based" or "calibrated:<dataset>"

    def supports(self, kernel: Kernel, op: Op, device: DeviceSpec | None) -> bool: ...

    def predict(self, kernel: Kernel, op: Op, device: DeviceSpec | None) -> float | Prediction:
        """Seconds, or a :class:`Prediction` when the provenance depends on the kernel.

        A model with ``instance_sizing = True`` (collectives) is also given ``members``: the
        instance's ``Collective`` of every member rank present, by rank, so that it can size
        the instance as a whole (:func:`trainsim.comm.model_size_bytes`)."""
        ...


@dataclass(frozen=True, slots=True)
class Prediction:
    seconds: float
    provenance: str


class ModelRegistry:
    """Family → models, first supporting model wins; registering a name twice is an error."""

    def __init__(self, models: Iterable[KernelModel] = ()) -> None:
        self._by_family: dict[KernelFamily, list[KernelModel]] = {}
        self._names: set[str] = set()
        for m in models:
            self.register(m)

    def register(self, model: KernelModel) -> None:
        if model.name in self._names:
            raise ConfigError(f"kernel model {model.name!r} is already registered")
        self._names.add(model.name)
        for fam in model.families:
            self._by_family.setdefault(fam, []).append(model)

    def models_for(self, family: KernelFamily) -> tuple[KernelModel, ...]:
        return tuple(self._by_family.get(family, ()))

    def predict(self, kernel: Kernel, op: Op, device: DeviceSpec | None, *,
                members: Mapping[int, Collective] | None = None) -> Prediction | None:  # fmt: skip
        """The first supporting model's answer; ``members``: a collective instance's members
        (rank → ``Collective``), given to models with ``instance_sizing``."""
        for m in self._by_family.get(kernel.family, ()):
            if m.supports(kernel, op, device):
                if getattr(m, "instance_sizing", False):
                    got = m.predict(kernel, op, device, members=members)  # type: ignore[call-arg]
                else:
                    got = m.predict(kernel, op, device)
                if isinstance(got, Prediction):
                    s, prov = got.seconds, got.provenance
                else:
                    dev = device.name if device is not None else "unknown"
                    s, prov = (
                        float(got),
                        m.provenance if ":" in m.provenance else f"{m.provenance}:{dev}",
                    )
                if not s >= 0.0:
                    raise ModelError(
                        f"kernel model {m.name} predicted {s!r} s for {kernel.name[:60]}"
                    )
                return Prediction(s, prov)
        return None


_DTYPE_BYTES = {"float": 4, "double": 8, "c10::half": 2, "c10::bfloat16": 2, "half": 2,
                "bfloat16": 2, "float16": 2, "float32": 4, "int": 4, "long int": 8, "long": 8}  # fmt: skip
_GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::linear", "aten::bmm", "aten::matmul"})
_MIN_KERNEL_S = 2e-6  # Approximation: no kernel finishes faster than ~2 µs on these GPUs.


def _elem_bytes(dtype: str) -> int:
    return _DTYPE_BYTES.get(dtype.lower(), 4)


class RooflineMemcpy:
    """bytes / bandwidth: PCIe for host copies, device memory (read+write) otherwise."""

    name = "roofline-memcpy"
    families: tuple[KernelFamily, ...] = (KernelFamily.MEMCPY, KernelFamily.MEMSET)
    provenance = "spec-based"

    def supports(self, kernel: Kernel, op: Op, device: DeviceSpec | None) -> bool:
        if device is None or not isinstance(kernel.features.get("bytes"), int | float):
            return False
        return not _host_copy(kernel) or device.pcie_bandwidth_GBps is not None

    def predict(self, kernel: Kernel, op: Op, device: DeviceSpec | None) -> float:
        assert device is not None
        nbytes = float(kernel.features["bytes"])
        if _host_copy(kernel):
            assert device.pcie_bandwidth_GBps is not None
            bw = device.pcie_bandwidth_GBps * 1e9
        else:  # a device copy reads and writes device memory
            bw = device.memory_bandwidth_Bps / 2
        return max(_MIN_KERNEL_S, nbytes / bw)


def _host_copy(kernel: Kernel) -> bool:
    return "HtoD" in kernel.name or "DtoH" in kernel.name


def _gemm_flops(op: Op) -> tuple[float, int] | None:
    """FLOPs and element size of a matmul-like op from its input shapes, or None."""
    shapes = [t for t in op.inputs if t.shape]
    if len(shapes) < 2:
        return None
    name = op.name
    a, b = (
        (shapes[1], shapes[2])
        if name == "aten::addmm" and len(shapes) >= 3
        else (shapes[0], shapes[1])
    )
    if name == "aten::linear":  # weight is [out, in]
        m = a.numel // a.shape[-1]
        return 2.0 * m * a.shape[-1] * b.shape[0], _elem_bytes(a.dtype)
    if len(a.shape) < 2 or len(b.shape) < 2 or a.shape[-1] != b.shape[-2]:
        return None
    batch = a.numel // (a.shape[-1] * a.shape[-2])
    return 2.0 * batch * a.shape[-2] * a.shape[-1] * b.shape[-1], _elem_bytes(a.dtype)


class RooflineGemm:
    """max(FLOPs / peak, bytes / bandwidth) for matmul ops that launch one GEMM kernel."""

    name = "roofline-gemm"
    families: tuple[KernelFamily, ...] = (KernelFamily.GEMM,)
    provenance = "spec-based"

    def supports(self, kernel: Kernel, op: Op, device: DeviceSpec | None) -> bool:
        if device is None or op.name not in _GEMM_OPS or _gemm_flops(op) is None:
            return False
        return sum(k.family is KernelFamily.GEMM for k in op.kernels) == 1

    def predict(self, kernel: Kernel, op: Op, device: DeviceSpec | None) -> float:
        assert device is not None
        fl = _gemm_flops(op)
        assert fl is not None
        flops, eb = fl
        peak = device.peak_flops_per_s("fp16" if eb == 2 else "fp32") or device.peak_flops_per_s(
            "fp32"
        )
        assert peak is not None
        nbytes = sum(t.numel for t in op.inputs) * eb
        return max(_MIN_KERNEL_S, flops / peak, nbytes / device.memory_bandwidth_Bps)


class RooflineElementwise:
    """Memory-bound kernels of single-kernel ops: (inputs + one output) bytes / bandwidth.

    Approximation: the output is as large as the largest input.
    """

    name = "roofline-elementwise"
    families: tuple[KernelFamily, ...] = (KernelFamily.ELEMENTWISE, KernelFamily.NORM, KernelFamily.SOFTMAX,
                KernelFamily.REDUCTION, KernelFamily.OPTIMIZER)  # fmt: skip
    provenance = "spec-based"

    def supports(self, kernel: Kernel, op: Op, device: DeviceSpec | None) -> bool:
        return device is not None and len(op.kernels) == 1 and any(t.shape for t in op.inputs)

    def predict(self, kernel: Kernel, op: Op, device: DeviceSpec | None) -> float:
        assert device is not None
        sizes = [t.numel * _elem_bytes(t.dtype) for t in op.inputs if t.shape]
        return max(_MIN_KERNEL_S, (sum(sizes) + max(sizes)) / device.memory_bandwidth_Bps)


# Ring-algorithm bus-traffic factors per byte of the message, for n ranks (NCCL's busBw maths).
_RING_FACTOR = {
    CollectiveKind.ALL_REDUCE: lambda n: 2.0 * (n - 1) / n,
    CollectiveKind.ALL_GATHER: lambda n: (n - 1) / n,
    CollectiveKind.REDUCE_SCATTER: lambda n: (n - 1) / n,
    CollectiveKind.ALL_TO_ALL: lambda n: (n - 1) / n,
    CollectiveKind.ALL_TO_ALLV: lambda n: (n - 1) / n,
}
_COLLECTIVE_LATENCY_S = 10e-6  # Approximation: NCCL launch + one ring step inside a node.


class AlphaBetaCollective:
    """latency + bus factor × bytes / link bandwidth (one node; the device's NVLink/fabric
    bandwidth per direction from the catalog). Sized like every comm model
    (:func:`trainsim.comm.model_size_bytes`, the nccl-tests convention): all-gather by its
    gathered output, all-to-all(v) by its busiest device (000 §III-C)."""

    name = "alpha-beta-collective"
    families: tuple[KernelFamily, ...] = tuple(f for f in KernelFamily if f.is_communication)
    provenance = "spec-based"
    instance_sizing = True

    def supports(self, kernel: Kernel, op: Op, device: DeviceSpec | None) -> bool:
        return (
            device is not None
            and device.gpu_link_bandwidth_GBps is not None
            and kernel.collective is not None
        )

    def predict(self, kernel: Kernel, op: Op, device: DeviceSpec | None, *,
                members: Mapping[int, Collective] | None = None) -> float:  # fmt: skip
        from trainsim.comm.sizing import model_size_bytes

        assert device is not None and kernel.collective is not None
        c = kernel.collective
        n = max(c.group_size, 2)
        factor = _RING_FACTOR.get(c.kind, lambda _n: 1.0)(n)
        assert device.gpu_link_bandwidth_GBps is not None
        one_way = device.gpu_link_bandwidth_GBps * 1e9 / 2  # bytes/s in one direction
        return _COLLECTIVE_LATENCY_S + factor * model_size_bytes(c, members) / one_way


class CommModelKernels:
    """Adapter: a ``trainsim.comm`` collective model answering for collective kernels, sized
    by :func:`trainsim.comm.model_size_bytes` over the instance's members, with the model's
    own provenance (``calibrated:<dataset>`` or ``spec-based:<system>``)."""

    families: tuple[KernelFamily, ...] = tuple(f for f in KernelFamily if f.is_communication)
    instance_sizing = True

    def __init__(self, model: CommModel, *, gpus_per_node: int | None = None) -> None:
        self.model = model
        self.gpus_per_node = gpus_per_node
        self.name = f"comm:{model.name}"
        self.provenance = "comm"

    def _supported(self, kind: str, group_size: int) -> bool:
        return self.model.supports(kind, group_size, gpus_per_node=self.gpus_per_node)

    def _predict(self, kind: str, nbytes: float, group_size: int) -> CommPrediction:
        return self.model.predict(kind, nbytes, group_size, gpus_per_node=self.gpus_per_node)

    def supports(self, kernel: Kernel, op: Op, device: DeviceSpec | None) -> bool:
        c = kernel.collective
        return c is not None and self._supported(c.kind, max(c.group_size, 1))

    def predict(self, kernel: Kernel, op: Op, device: DeviceSpec | None, *,
                members: Mapping[int, Collective] | None = None) -> Prediction:  # fmt: skip
        from trainsim.comm.sizing import model_size_bytes

        c = kernel.collective
        assert c is not None
        try:
            p = self._predict(c.kind, model_size_bytes(c, members), max(c.group_size, 1))
        except ModelError as e:
            raise ModelError(f"kernel {kernel.id} ({kernel.name[:40]}): {e}") from e
        return Prediction(p.duration_s, p.provenance)


class SystemCommKernels(CommModelKernels):
    """Adapter: every ``trainsim.comm`` model of ``system`` answering for collective kernels
    as :func:`trainsim.comm.predict_collective` resolves them (a measured case first, then a
    sibling collective measured there, then any model that extrapolates, then spec-based), so
    replay and ``predict`` time one collective alike."""

    def __init__(self, system: SystemSpec, *, gpus_per_node: int | None = None) -> None:
        from trainsim.comm.registry import models_for

        self.system = system
        self.models = models_for(system)
        self.gpus_per_node = gpus_per_node
        self.name = f"comm:{system.name}"
        self.provenance = "comm"

    def _supported(self, kind: str, group_size: int) -> bool:
        from trainsim.comm.registry import collective_supported

        return collective_supported(kind, group_size, self.models, gpus_per_node=self.gpus_per_node)

    def _predict(self, kind: str, nbytes: float, group_size: int) -> CommPrediction:
        from trainsim.comm.registry import predict_collective

        return predict_collective(kind, nbytes, group_size, system=self.system, gpus_per_node=self.gpus_per_node,
                                  models=self.models)  # fmt: skip


def default_registry(system: SystemSpec | None = None) -> ModelRegistry:
    """Spec-based roofline models for memory copies, GEMMs, element-wise kernels; for
    collectives, the ``trainsim.comm`` models of ``system`` when one is known, resolved as
    :func:`trainsim.comm.predict_collective` does (:class:`SystemCommKernels`), then the
    device's alpha-beta."""
    comm: list[KernelModel] = []
    if system is not None:
        comm = [SystemCommKernels(system)]
    return ModelRegistry(
        [RooflineMemcpy(), RooflineGemm(), RooflineElementwise(), *comm, AlphaBetaCollective()]
    )


@dataclass(frozen=True, slots=True)
class CollectiveSystem:
    """The catalog system whose collective models answer in ``--kernels model`` mode."""

    spec: SystemSpec
    source: str  # "given", or "guessed from device <name>"


def collective_system(devices: Iterable[str], given: str | None) -> CollectiveSystem | None:
    """``given`` (a catalog name or YAML path), else the only catalog system built of the
    workload's device (as ``trainsim.comm.guess_system`` does), else None."""
    from trainsim.hardware import get_system, list_systems

    names = {d for d in devices if d}
    if given:
        spec = get_system(given)
        import re

        def part(name: str) -> str:  # the GPU without its memory size: a100-sxm4-40gb -> a100-sxm4
            return re.sub(r"-\d+gb$", "", name)

        traced = {dev.name for d in names if (dev := device_spec(d)) is not None and part(dev.name) != part(spec.device)}
        if traced:  # another GPU than the system's (its memory size aside): another node, another network
            return CollectiveSystem(spec, f"given; the trace ran on {', '.join(sorted(traced))}, not its "
                                          f"{spec.device}: a what-if of that network")  # fmt: skip
        return CollectiveSystem(spec, "given")
    if len(names) != 1:
        return None
    (name,) = names
    dev = device_spec(name)
    if dev is None:
        return None
    same = [s for s in list_systems() if s.device == dev.name]
    return CollectiveSystem(same[0], f"guessed from device {name}") if len(same) == 1 else None
