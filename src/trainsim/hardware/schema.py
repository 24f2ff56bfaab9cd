"""Catalog schemas: one device or one system per YAML file, validated with pydantic.

Units live in key names (``memory_bandwidth_GBps``, ``latency_us``) as a person writes them;
properties convert once to SI (``memory_bandwidth_Bps``, ``latency_s``). Unknown keys are
errors, so a typo never silently becomes a default. ``schema_version`` is checked first.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

SCHEMA_VERSION = 1


# Field and property names carry units as people write them (GBps, Gbps, MB, Bps): STYLE.md
# asks for units in names, so N802/N815 are silenced on those lines.


USABLE_FRACTION = 40441 / 40960  # deviceQuery total / marketed GiB, A100 40 GB (see memory_bytes)


class _Strict(BaseModel):
    # allow_inf_nan: `gt=0` alone lets `.inf` through (a latency of .inf made every time NaN)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# Upper bounds far above any hardware (2026: HBM ~10 TB/s, NVLink 1.8 TB/s per GPU, NICs 800
# Gb/s; a wafer-scale chip's 21 PB/s on-chip is 2.1e7 GB/s), per field: a value above one was
# written in another unit than the field's name says (25000000000 bytes/s in a GB/s field is
# 1e9x; a latency in ns 1e3x), which would otherwise run as a machine that much faster.
_PLAUSIBLE = {  # field: (limit, unit, the slip it catches)
    "memory_GB": (1e6, "GB", "bytes"), "memory_bandwidth_GBps": (1e8, "GB/s", "bytes/s or bits/s"),
    "l2_cache_MB": (1e6, "MB", "bytes"), "gpu_link_bandwidth_GBps": (1e8, "GB/s", "bytes/s or bits/s"),
    "pcie_bandwidth_GBps": (1e6, "GB/s", "bytes/s or bits/s"),
    "bandwidth_per_gpu_GBps": (1e8, "GB/s", "bytes/s or bits/s"), "nic_bandwidth_Gbps": (1e8, "Gb/s", "bits/s"),
    "latency_us": (1e6, "µs", "ns"), "fp32": (1e7, "TFLOP/s", "FLOP/s"), "tf32": (1e7, "TFLOP/s", "FLOP/s"),
    "fp16": (1e7, "TFLOP/s", "FLOP/s"), "bf16": (1e7, "TFLOP/s", "FLOP/s"), "fp8": (1e7, "TFLOP/s", "FLOP/s"),
    "measured_gemm_bf16_tflops": (1e7, "TFLOP/s", "FLOP/s"),
}  # fmt: skip


def _plausible(v: float | None, info: ValidationInfo) -> float | None:
    limit, unit, slip = _PLAUSIBLE[str(info.field_name)]
    if v is not None and v > limit:
        raise ValueError(f"{v:g} is beyond any hardware (at most {limit:g} {unit}); the field is in {unit}: "
                         f"was it written in {slip}?")  # fmt: skip
    return v


class SourceKind(StrEnum):
    DATASHEET = "datasheet"
    WHITEPAPER = "whitepaper"
    PAPER = "paper"
    MEASUREMENT = "measurement"
    DOCUMENTATION = "documentation"
    SOFTWARE = "software"


class Source(_Strict):
    """Where a number comes from."""

    kind: SourceKind
    title: str
    url: str | None = None
    note: str | None = None


class PeakTflops(_Strict):
    """Dense peak throughput in TFLOP/s per precision; null where the device has none."""

    fp32: float = Field(gt=0)
    tf32: float | None = Field(default=None, gt=0)
    fp16: float | None = Field(default=None, gt=0)
    bf16: float | None = Field(default=None, gt=0)
    fp8: float | None = Field(default=None, gt=0)

    _scale = field_validator("fp32", "tf32", "fp16", "bf16", "fp8")(_plausible)


class DeviceSpec(_Strict):
    """One accelerator model (datasheet peaks, measured best where known)."""

    schema_version: int
    name: str
    aliases: tuple[str, ...] = ()
    vendor: str
    architecture: str
    memory_GB: float = Field(gt=0, description="marketed HBM capacity (GiB in practice; see memory_bytes)")  # noqa: N815
    memory_bandwidth_GBps: float = Field(gt=0)  # noqa: N815
    l2_cache_MB: float | None = Field(default=None, gt=0, description="null where not published")  # noqa: N815
    sm_count: int | None = Field(
        default=None, gt=0, description="SMs (NVIDIA) or compute units (AMD)"
    )
    peak_tflops: PeakTflops
    measured_gemm_bf16_tflops: float | None = Field(default=None, gt=0)
    gpu_link_bandwidth_GBps: float | None = Field(  # noqa: N815
        default=None, gt=0, description="NVLink/Infinity Fabric per GPU, both directions together"
    )
    pcie_bandwidth_GBps: float | None = Field(default=None, gt=0, description="one direction")  # noqa: N815
    vector_bits: int | None = Field(
        default=None, gt=0, description="host CPU: its widest SIMD registers (512 AVX-512, 256 AVX2); null for GPUs"
    )
    sources: tuple[Source, ...] = Field(min_length=1)

    _scale = field_validator("memory_GB", "memory_bandwidth_GBps", "l2_cache_MB", "gpu_link_bandwidth_GBps",
                             "pcie_bandwidth_GBps", "measured_gemm_bf16_tflops")(_plausible)  # fmt: skip

    @property
    def memory_bytes(self) -> float:
        """Usable device memory. NVIDIA's marketed "80 GB" of HBM is 80 GiB (nvidia-smi: 81920
        MiB on A100-SXM4-80GB), of which the driver keeps a little: CUDA's deviceQuery reports
        42,405,855,232 bytes (40,441 MiB) on an A100 40 GB, 98.7 % of 40 GiB (PC2 wiki, "NVIDIA
        A100 40GB with NVLINK"). Approximation: that fraction for every device."""
        return self.memory_GB * 2**30 * USABLE_FRACTION

    @property
    def memory_bandwidth_Bps(self) -> float:  # noqa: N802
        return self.memory_bandwidth_GBps * 1e9

    @property
    def l2_cache_bytes(self) -> float | None:
        return None if self.l2_cache_MB is None else self.l2_cache_MB * 1e6

    def peak_flops_per_s(self, precision: str) -> float | None:
        v = getattr(self.peak_tflops, precision, None)
        return None if v is None else v * 1e12

    def is_sibling_of(self, other: DeviceSpec) -> bool:
        """Same architecture and tensor-core (fp16) peak: parts whose kernel measurements stand
        for each other (A100 40 GB and 80 GB; GH200 and H100-SXM), memory aside."""
        return self.architecture == other.architecture and self.peak_flops_per_s(
            "fp16"
        ) == other.peak_flops_per_s("fp16")


class TierKind(StrEnum):
    NVSWITCH = "nvswitch"
    NVLINK_MESH = "nvlink_mesh"  # GPUs wired directly to each other, links split among peers
    PCIE = "pcie"
    INFINIBAND = "infiniband"
    SLINGSHOT = "slingshot"
    ETHERNET = "ethernet"


class TierScope(StrEnum):
    NODE = "node"  # inside one node
    CLUSTER = "cluster"  # across nodes


class NetworkTier(_Strict):
    """One level of the interconnect, innermost first.

    ``bandwidth_per_gpu_GBps`` is what one GPU can inject into this tier in one direction: its
    NVLink bandwidth inside a node, its share of the node's NICs across nodes.
    ``latency_us`` is the latency one step of a collective pays on this tier (software
    included), as in NCCL's own cost model.
    """

    name: str
    kind: TierKind
    scope: TierScope
    bandwidth_per_gpu_GBps: float = Field(gt=0)  # noqa: N815
    latency_us: float = Field(ge=0)
    nics_per_node: int | None = Field(default=None, gt=0)
    nic_bandwidth_Gbps: float | None = Field(default=None, gt=0)  # noqa: N815

    _scale = field_validator("bandwidth_per_gpu_GBps", "nic_bandwidth_Gbps", "latency_us")(_plausible)

    @property
    def bandwidth_per_gpu_Bps(self) -> float:  # noqa: N802
        return self.bandwidth_per_gpu_GBps * 1e9

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6


class SystemSpec(_Strict):
    """A cluster: one device type, GPUs per node, and its network tiers (innermost first)."""

    schema_version: int
    name: str
    aliases: tuple[str, ...] = ()
    description: str
    device: str
    gpus_per_node: int = Field(gt=0)
    max_nodes: int | None = Field(default=None, gt=0)
    tiers: tuple[NetworkTier, ...] = Field(min_length=1)
    sources: tuple[Source, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _check_tiers(self) -> SystemSpec:
        scopes = [t.scope for t in self.tiers]
        if (
            scopes != sorted(scopes, key=lambda s: s is TierScope.CLUSTER)
            or scopes.count(TierScope.NODE) > 1
            or scopes.count(TierScope.CLUSTER) > 1
        ):
            raise ValueError(
                "tiers must be at most one 'node' tier followed by at most one 'cluster' tier"
            )
        if self.gpus_per_node > 1 and self.node_tier is None:
            raise ValueError(f"{self.gpus_per_node} GPUs per node need a 'node' tier")
        for t in self.tiers:
            if t.scope is TierScope.CLUSTER and t.nics_per_node and t.nic_bandwidth_Gbps:
                implied = t.nics_per_node * t.nic_bandwidth_Gbps / 8 / self.gpus_per_node
                if abs(implied - t.bandwidth_per_gpu_GBps) > 0.02 * implied:
                    raise ValueError(
                        f"tier {t.name}: bandwidth_per_gpu_GBps {t.bandwidth_per_gpu_GBps} disagrees with "
                        f"{t.nics_per_node} NICs x {t.nic_bandwidth_Gbps} Gb/s / {self.gpus_per_node} GPUs = {implied:.3g}"
                    )
        return self

    @property
    def node_tier(self) -> NetworkTier | None:
        return next((t for t in self.tiers if t.scope is TierScope.NODE), None)

    @property
    def cluster_tier(self) -> NetworkTier | None:
        return next((t for t in self.tiers if t.scope is TierScope.CLUSTER), None)
