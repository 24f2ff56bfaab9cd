"""Model-driven DLRM step: embedding tables sharded over ranks, dense MLPs data-parallel.

The step follows facebookresearch/dlrm's distributed ``dlrm_s_pytorch.py`` (and TorchRec's
table-wise sharding): the rank that owns a table looks it up for the **global** batch, an
all-to-all(v) scatters the pooled embeddings by sample so that every rank holds its
``batch // world`` samples of every table, and the dense part is data-parallel. Per rank, in
issue order (:func:`build_dlrm_workload`)::

    forward   embedding_bag of each owned table (global batch)  → all_to_allv (pooled, seq 0)
              bottom MLP (gemm + relu per layer)                   overlaps the all-to-all
              interaction (dot: bmm + tril + concat; cat: concat)  waits for the all-to-all
              top MLP, loss
    backward  top MLP, interaction                                 → all_to_allv (grads, seq 1)
              bottom MLP                                           → all_reduce (dense grads)
              embedding backward (+ sparse SGD update on CPUs)     waits for the all-to-all
              dense SGD step                                       waits for the all-reduce

Every kernel's ``predicted_s`` comes from trainsim's kernel models for ``device``
(:func:`trainsim.kernels.predict_query`: calibrated where fitted, else spec-based; the
``embedding_bag`` heuristics of 002 §4.3.2.1 and 000 §III-E with the table's reuse factors),
with its provenance. Collectives are timed by :mod:`trainsim.comm` on ``system``, all-to-all
sized by 000 §III-C (max over ranks of max(sent, received)). Without a system: the catalog
system built of ``device`` if there is one, else a **host-local estimate** (ranks exchanging
through gloo over TCP loopback on one host, :data:`HOST_LINK_BANDWIDTH_BPS` and
:data:`HOST_LINK_LATENCY_S`, or the ``link_bandwidth_Bps``/``link_latency_s`` given).

GPU vs CPU (a device with SMs is a GPU). Defaults on GPUs: ``tbe`` — a rank's tables are one
FBGEMM TBE kernel per pass (the sum of the per-table predictions), its backward fused with SGD
(as the kernel models define ``embedding_bag`` bwd); ``overlap`` — collectives on their own
stream; each op pays the eager-PyTorch dispatch of :class:`trainsim.builders.costs.HostModel`.
Defaults on CPUs: one ``nn.EmbeddingBag(sparse=True)`` op per table and pass, the backward being
the sparse gradient followed by the sparse SGD update (an ``elementwise`` kernel over the
``B·L·D`` gradient values); collectives block the one stream (gloo on the calling thread); no
dispatch term (the measured CPU op times include it). ``tbe=True`` on a CPU models fbgemm's
CPU TBE (one op per pass, update fused: no separate update kernel).

``interaction="auto"``: DLRM's dot interaction when every table's dim equals the bottom MLP's
output, else concatenation.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainsim.errors import ConfigError, TrainsimError, yaml_error
from trainsim.hardware import DeviceSpec, SystemSpec, get_device, get_system, list_systems
from trainsim.ir.graph import Collective, Kernel, Op, RankGraph, Workload
from trainsim.ir.kinds import CollectiveKind, OpCategory
from trainsim.kernels import KernelModel, load_model, op_spec, predict_query, query
from trainsim.kernels.features import dtype_bytes

COMPUTE, COMM = 7, 20
RF_BINS = 17
# DLRM_2022 reuse histogram of shared/data/README.md: fraction of unique rows per bin (0,1], (1,2], (2,4], ...
DLRM_2022_REUSE = (
    0.342,
    0.144,
    0.149,
    0.138,
    0.112,
    0.068,
    0.029,
    0.010,
    0.004,
    0.002,
    0.001,
    0.001,
)
HEAVY_POOLING = 20.0  # 000 §II-A: a table with mean L >= 20 is "heavy"
HEAVY_FRACTION = 166 / 788  # 000 §II-A: heavy tables in the 2022 part of Meta's DLRM dataset
# Input sanity, not physics: Meta's DLRM tables pool at most a few hundred indices per bag, so
# a million is a typo (1e300 predicted a step of 1e293 s); fractions published to 4 decimals
# over 17 bins sum to 1 within 1e-3.
MAX_POOLING = 1e6
REUSE_SUM_TOLERANCE = 0.01
# Approximation: gloo over TCP loopback between processes of one host, per process and per
# step; probed on the 2-vCPU development VM (torch 2.13, world 2: 1-16 MiB all_to_all and
# all_reduce within ~30 %). Another host: measure and pass link_bandwidth_Bps/link_latency_s.
HOST_LINK_BANDWIDTH_BPS = 0.8e9
HOST_LINK_LATENCY_S = 100e-6
_INDEX_BYTES = 8  # int64 indices/offsets, as torch.nn.EmbeddingBag takes them


@dataclass(frozen=True, slots=True)
class TableSpec:
    """One embedding table: ``rows`` (E), ``dim`` (D), ``pooling`` (L, mean indices per bag) and
    ``reuse``: fraction of the unique rows a batch touches per reuse bin ((0,1], (1,2], (2,4],
    ... as in the data README, at most 17 bins); ``None`` = uniform random indices."""

    name: str
    rows: int
    dim: int
    pooling: float
    reuse: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        where = f"table {self.name!r}"
        if not isinstance(self.rows, int) or self.rows < 1:
            raise ConfigError(f"{where}: rows must be a positive integer, got {self.rows!r}")
        if not isinstance(self.dim, int) or self.dim < 1:
            raise ConfigError(f"{where}: dim must be a positive integer, got {self.dim!r}")
        if not (
            isinstance(self.pooling, int | float)
            and self.pooling > 0
            and math.isfinite(self.pooling)
        ):
            raise ConfigError(f"{where}: pooling must be a positive number, got {self.pooling!r}")
        if self.pooling > MAX_POOLING:
            raise ConfigError(f"{where}: pooling {self.pooling:g} indices per bag is implausible "
                              f"(at most {MAX_POOLING:g}); pooling is the mean bag length L")  # fmt: skip
        if self.reuse is not None:
            r = self.reuse
            if (
                not 1 <= len(r) <= RF_BINS
                or any(not (isinstance(x, int | float) and x >= 0) for x in r)
                or sum(r) <= 0
            ):
                raise ConfigError(
                    f"{where}: reuse must be 1-{RF_BINS} non-negative fractions, not all 0; got {r!r}"
                )
            if not abs(sum(r) - 1.0) <= REUSE_SUM_TOLERANCE:  # the heuristics read them as fractions
                raise ConfigError(f"{where}: reuse fractions must sum to 1 (the share of distinct rows "
                                  f"in each bin), got a sum of {sum(r):.4g}")  # fmt: skip

    def nbytes(self, dtype: str = "fp32") -> int:
        return self.rows * self.dim * dtype_bytes(dtype)


@dataclass(frozen=True, slots=True)
class DLRMSpec:
    """Tables, global batch (per-rank batch = batch // world for the data-parallel part) and the MLPs."""

    tables: tuple[TableSpec, ...]
    batch: int
    dense_features: int = 13
    bottom_mlp: tuple[int, ...] = (512, 256, 64)
    top_mlp: tuple[int, ...] = (512, 256, 1)
    dtype: str = "fp32"
    interaction: str = "auto"  # auto | dot | cat

    def __post_init__(self) -> None:
        if not self.tables:
            raise ConfigError("DLRM spec: tables must list at least one table")
        names = [t.name for t in self.tables]
        if len(set(names)) != len(names):
            raise ConfigError(
                f"DLRM spec: duplicate table names {sorted({n for n in names if names.count(n) > 1})}"
            )
        for what, v in (("batch", self.batch), ("dense_features", self.dense_features)):
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"DLRM spec: {what} must be a positive integer, got {v!r}")
        for what, mlp in (("bottom_mlp", self.bottom_mlp), ("top_mlp", self.top_mlp)):
            if not mlp or any(not isinstance(w, int) or w < 1 for w in mlp):
                raise ConfigError(
                    f"DLRM spec: {what} must be a non-empty list of positive widths, got {mlp!r}"
                )
        if self.interaction not in ("auto", "dot", "cat"):
            raise ConfigError(
                f"DLRM spec: interaction must be auto, dot or cat, got {self.interaction!r}"
            )
        if self.interaction == "dot" and any(t.dim != self.bottom_mlp[-1] for t in self.tables):
            raise ConfigError(
                f"DLRM spec: dot interaction needs every table dim = bottom_mlp[-1] = {self.bottom_mlp[-1]}"
            )
        try:
            dtype_bytes(self.dtype)
        except Exception:
            raise ConfigError(f"DLRM spec: unknown dtype {self.dtype!r}") from None

    @property
    def dot(self) -> bool:
        return self.interaction == "dot" or (
            self.interaction == "auto" and all(t.dim == self.bottom_mlp[-1] for t in self.tables)
        )


# --- random tasks ----------------------------------------------------------------------------


def random_tables(n: int, *, seed: int, heavy: bool = False, max_rows: int = 1_000_000, min_rows: int = 1_000,
                  dims: Sequence[int] = (16, 32, 64, 128)) -> tuple[TableSpec, ...]:  # fmt: skip
    """``n`` tables drawn in the spirit of 000 §IV-B1 (tables sampled from Meta's DLRM dataset).

    The dataset itself is not shipped; what is published is drawn from:

    * pooling L (000 §II-A, Fig. 3): a table is heavy (L >= 20) with probability 166/788 (the
      2022 part), always with ``heavy=True`` (000's heavy tasks); heavy L is log-uniform in
      [20, 200] ("spreading to a few hundred"); light L is uniform in [0.05, 1] half of the
      time ("concentrate in [0, 10), especially [0, 1]") and log-uniform in (1, 20) otherwise.
    * rows E: log-uniform in [min_rows, max_rows] (Approximation: per-table row counts are not
      in the shared data; the default cap keeps a 26-table task under ~1 GB in fp32).
    * dim D: uniform over ``dims`` (the dataset has no D; DreamShard's generator also draws it).
    * reuse: the published DLRM_2022 histogram (data README) tilted per table by
      ``exp(s·(bin − mean bin))``, ``s ~ N(0, 0.3)``, times log-normal(0, 0.2) noise per bin,
      renormalised — tables differ in locality as 000 Fig. 7 shows.
    """
    if n < 1:
        raise ConfigError(f"random_tables: n must be >= 1, got {n}")
    if not 1 <= min_rows <= max_rows:
        raise ConfigError(
            f"random_tables: need 1 <= min_rows <= max_rows, got {min_rows}, {max_rows}"
        )
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if heavy or rng.random() < HEAVY_FRACTION:
            pooling = math.exp(rng.uniform(math.log(HEAVY_POOLING), math.log(200.0)))
        elif rng.random() < 0.5:
            pooling = rng.uniform(0.05, 1.0)
        else:
            pooling = math.exp(rng.uniform(0.0, math.log(HEAVY_POOLING)))
        rows = round(math.exp(rng.uniform(math.log(min_rows), math.log(max_rows))))
        tilt = rng.gauss(0.0, 0.3)
        mid = (len(DLRM_2022_REUSE) - 1) / 2
        w = [
            f * math.exp(tilt * (b - mid)) * rng.lognormvariate(0.0, 0.2)
            for b, f in enumerate(DLRM_2022_REUSE)
        ]
        reuse = tuple(round(x / sum(w), 5) for x in w)
        out.append(TableSpec(f"t{i}", rows, int(rng.choice(list(dims))), round(pooling, 3), reuse))
    return tuple(out)


# --- spec files --------------------------------------------------------------------------------


def load_dlrm_spec(path: str | Path) -> DLRMSpec:
    """A :class:`DLRMSpec` from a JSON or YAML file (format: docs/sharding.md)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{p}: cannot read the DLRM spec ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not a text file (expected a JSON or YAML DLRM spec)") from None
    import yaml

    try:
        doc = json.loads(text) if p.suffix.lower() == ".json" else yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise yaml_error(p, e) from None
    except (json.JSONDecodeError, ValueError) as e:
        raise ConfigError(f"{p}: not valid JSON/YAML ({str(e).splitlines()[0]})") from None
    return dlrm_spec_from_dict(doc, origin=str(p))


def dlrm_spec_from_dict(doc: Any, *, origin: str = "DLRM spec") -> DLRMSpec:
    if not isinstance(doc, Mapping):
        raise ConfigError(
            f"{origin}: expected a mapping with 'tables' and 'batch' at the top level"
        )
    known = {"tables", "batch", "dense_features", "bottom_mlp", "top_mlp", "dtype", "interaction"}
    extra = sorted(set(doc) - known)
    if extra:
        raise ConfigError(
            f"{origin}: unknown field {extra[0]!r}; known: {', '.join(sorted(known))}"
        )
    for req in ("tables", "batch"):
        if req not in doc:
            raise ConfigError(f"{origin}: field {req!r} is missing")
    tables = doc["tables"]
    if not isinstance(tables, list) or not tables:
        raise ConfigError(f"{origin}: field tables: expected a non-empty list of tables")
    parsed = [_table(t, i, origin) for i, t in enumerate(tables)]
    kw: dict[str, Any] = {"batch": _int(doc["batch"], "batch", origin)}
    if "dense_features" in doc:
        kw["dense_features"] = _int(doc["dense_features"], "dense_features", origin)
    for mlp in ("bottom_mlp", "top_mlp"):
        if mlp in doc:
            v = doc[mlp]
            if not isinstance(v, list) or not v:
                raise ConfigError(
                    f"{origin}: field {mlp}: expected a non-empty list of layer widths"
                )
            kw[mlp] = tuple(_int(w, f"{mlp}[{j}]", origin) for j, w in enumerate(v))
    for s in ("dtype", "interaction"):
        if s in doc:
            kw[s] = str(doc[s])
    try:
        return DLRMSpec(tables=tuple(parsed), **kw)
    except ConfigError as e:
        raise ConfigError(f"{origin}: {e}") from None


# A spec's sizes feed int64 tensors (torch, fbgemm); anything larger is a typo, not a table.
_INT_MAX = 2**63 - 1
# Above 2**53 a float is no longer every integer: `rows: 1e30` would read as
# 1,000,000,000,000,000,019,884,624,838,656 rows.
_FLOAT_EXACT_MAX = 2**53


def _int(v: Any, where: str, origin: str) -> int:
    bad = f"{origin}: field {where}: expected a positive integer"
    if (isinstance(v, bool) or not isinstance(v, int | float)
            or (isinstance(v, float) and not math.isfinite(v)) or v != int(v) or v < 1):  # fmt: skip
        raise ConfigError(f"{bad}, got {v!r}")
    if v > _INT_MAX:
        raise ConfigError(f"{bad} of at most 2**63 - 1, got {v!r}")
    if isinstance(v, float) and v > _FLOAT_EXACT_MAX:
        raise ConfigError(f"{bad}, got the float {v!r}, which above 2**53 is not an exact integer; "
                          "write the integer out")  # fmt: skip
    return int(v)


def _table(t: Any, i: int, origin: str) -> TableSpec:
    where = f"tables[{i}]"
    if not isinstance(t, Mapping):
        raise ConfigError(f"{origin}: field {where}: expected a mapping with rows, dim, pooling")
    extra = sorted(set(t) - {"name", "rows", "dim", "pooling", "reuse"})
    if extra:
        raise ConfigError(
            f"{origin}: field {where}.{extra[0]}: unknown (known: name, rows, dim, pooling, reuse)"
        )
    for req in ("rows", "dim", "pooling"):
        if req not in t:
            raise ConfigError(f"{origin}: field {where}.{req} is missing")
    pooling = t["pooling"]
    if isinstance(pooling, bool) or not isinstance(pooling, int | float) or not pooling > 0:
        raise ConfigError(
            f"{origin}: field {where}.pooling: expected a positive number, got {pooling!r}"
        )
    reuse = t.get("reuse")
    if reuse is not None:
        if not isinstance(reuse, list) or not all(
            isinstance(x, int | float) and not isinstance(x, bool) for x in reuse
        ):
            raise ConfigError(
                f"{origin}: field {where}.reuse: expected a list of fractions per reuse bin"
            )
        reuse = tuple(float(x) for x in reuse)
    rows, dim = _int(t["rows"], f"{where}.rows", origin), _int(t["dim"], f"{where}.dim", origin)
    try:
        name = t.get("name")
        return TableSpec(f"t{i}" if name is None else str(name), rows, dim, float(pooling), reuse)
    except ConfigError as e:
        raise ConfigError(f"{origin}: field {where}: {e}") from None


# --- kernel costs ------------------------------------------------------------------------------


def resolve_device(device: str | Path | DeviceSpec) -> DeviceSpec:
    """A catalog device by name/alias, or a device YAML (e.g. ``trainsim bench``'s
    ``cpu_quick_<fingerprint>.device.yaml``)."""
    return device if isinstance(device, DeviceSpec) else get_device(device)


def is_gpu(dev: DeviceSpec) -> bool:
    return dev.sm_count is not None


KernelModels = str | Path | Sequence[KernelModel | str | Path] | None


class Coster:
    """Kernel-model answers on one device, cached: extra ``kernel_models`` (an ``.npz``
    artifact written by ``trainsim fit``, or model objects) first, then the device's own
    models (:func:`trainsim.kernels.models_for`: shipped calibrated, heuristics, roofline)."""

    def __init__(self, device: str | Path | DeviceSpec, kernel_models: KernelModels = None) -> None:
        from trainsim.bench.opspecs import register_bench_ops
        from trainsim.kernels import models_for

        register_bench_ops()  # relu, tril, concat, sgd: the operators the CPU suites calibrate
        self.device = resolve_device(device)
        extra: list[KernelModel] = []
        if isinstance(kernel_models, str | Path):
            extra = [load_model(kernel_models)]
        elif kernel_models is not None:  # models, or artifacts to load, first to answer first
            extra = [load_model(m) if isinstance(m, str | Path) else m for m in kernel_models]
        self.models = [*extra, *models_for(self.device)]
        self._cache: dict[tuple[Any, ...], tuple[float, str]] = {}

    def time(self, op: str, phase: str, dtype: str, **inputs: float) -> tuple[float, str]:
        key = (op, phase, dtype, tuple(sorted(inputs.items())))
        hit = self._cache.get(key)
        if hit is None:
            q = query(op, phase=phase, dtype=dtype, **inputs)  # type: ignore[arg-type]
            p = predict_query(q, self.device, models=self.models)
            hit = self._cache[key] = (p.duration_s, p.provenance)
        return hit


@dataclass(frozen=True, slots=True)
class _K:
    """One kernel to emit: operator, phase, inputs, predicted seconds, provenance."""

    op: str
    phase: str
    inputs: dict[str, float]
    seconds: float
    provenance: str


_LINEAR = {"bias": 1.0, "wt": 1.0}  # nn.Linear: a bias, the weight stored [out, in] (features.GEMM_VARIANT)


def _gemm_bwd(c: Coster, dtype: str, m: float, n: float, k: float, *, batch: float = 1.0,
              variant: dict[str, float] | None = None) -> _K:  # fmt: skip
    """Backward of ``(m,k) @ (k,n)``: the calibrated ``gemm`` bwd entry where one exists, else
    the two GEMMs it runs (dX = dY Wᵀ: m×k×n, dW = Xᵀ dY: k×n×m) — a spec roofline of one
    forward-shaped GEMM would count half the work. ``variant``: the call's ``bias``/``wt``
    inputs (an ``nn.Linear``: both 1)."""
    inputs = {"batch": batch, "m": m, "n": n, "k": k, **(variant or {})}
    s, prov = c.time("gemm", "bwd", dtype, **inputs)
    if not prov.startswith("calibrated"):
        s1, prov = c.time("gemm", "fwd", dtype, batch=batch, m=m, n=k, k=n)
        s2, _ = c.time("gemm", "fwd", dtype, batch=batch, m=k, n=n, k=m)
        s = s1 + s2
    return _K("gemm", "bwd", inputs, s, prov)


def _k(c: Coster, op: str, phase: str, dtype: str, **inputs: float) -> _K:
    s, prov = c.time(op, phase, dtype, **inputs)
    return _K(op, phase, inputs, s, prov)


def mean_reuse(t: TableSpec, batch: int) -> float:
    """Lookups per distinct row of one batch (the ``reuse`` input of the learned
    ``embedding_bag`` models, as ``trainsim bench`` measures it): from the table's reuse-factor
    bins (000 §III-E; bin 0 one access, bin i the mean of (2^(i-1), 2^i]), at most ``rows``
    distinct rows; uniform indices: ``n / (E (1 - e^(-n/E)))``, the expected distinct rows of
    ``n`` draws from ``E``."""
    import math

    import numpy as np

    from trainsim.kernels.embedding import RF_BINS, rf_mean_accesses

    n = max(1.0, batch * t.pooling)
    if t.reuse is not None and sum(t.reuse) > 0:
        rf = np.zeros(RF_BINS)
        rf[: len(t.reuse)] = t.reuse[:RF_BINS]
        unique = min(n / float(rf_mean_accesses(rf)), float(t.rows))
    else:
        unique = t.rows * -math.expm1(-n / t.rows)
    return n / max(1.0, unique)


def _table_kernels(
    c: Coster, t: TableSpec, batch: int, dtype: str, *, tbe: bool
) -> tuple[list[_K], list[_K]]:
    """Forward and backward(+update) kernels of one table looked up for ``batch`` samples;
    without TBE the sparse SGD update is a kernel of its own. With TBE, FBGEMM's kernel
    (``embedding_tbe``, calibrated by ``trainsim bench`` on CPUs) answers where a calibrated
    model has it, else ``embedding_bag`` (the same work; on GPUs 002's heuristics)."""
    inputs: dict[str, float] = {"B": batch, "E": t.rows, "T": 1, "L": t.pooling, "D": t.dim,
                                "reuse": mean_reuse(t, batch)}  # fmt: skip
    if t.reuse is not None:
        inputs.update({f"rf_{i}": f for i, f in enumerate(t.reuse)})
    op = "embedding_bag"
    if tbe:
        try:
            prov = c.time("embedding_tbe", "fwd", dtype, **inputs)[1]
        except TrainsimError:  # no model knows the operator
            prov = ""
        op = "embedding_tbe" if prov.startswith("calibrated") else op
    fwd = [_k(c, op, "fwd", dtype, **inputs)]
    bwd = [_k(c, op, "bwd", dtype, **inputs)]
    if not tbe:  # sparse SGD update: read the gradient rows, read+write the weights
        bwd.append(_k(c, "elementwise", "fwd", dtype, numel=max(1.0, batch * t.pooling * t.dim)))
    return fwd, bwd


def table_costs(spec: DLRMSpec, *, device: str | Path | DeviceSpec, kernel_models: KernelModels = None,
                coster: Coster | None = None, tbe: bool | None = None) -> list[float]:  # fmt: skip
    """Predicted forward + backward (+ update) seconds of each table's lookup on ``device``.

    Tables are looked up by their owner for the **global** batch (model parallelism), so that is
    the batch costed here; a table's cost does not depend on the world size.
    """
    c = coster or Coster(device, kernel_models)
    out = []
    for t in spec.tables:
        fwd, bwd = _table_kernels(
            c, t, spec.batch, spec.dtype, tbe=is_gpu(c.device) if tbe is None else tbe
        )
        out.append(sum(k.seconds for k in fwd + bwd))
    return out


# --- collectives ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CommSetup:
    """Who times the collectives: a catalog (or YAML, or in-memory) system."""

    system: SystemSpec
    note: str  # how it was chosen


def comm_setup(device: DeviceSpec, world: int, system: str | Path | SystemSpec | None = None, *,
               link_bandwidth_Bps: float | None = None, link_latency_s: float | None = None) -> CommSetup:  # fmt: skip  # noqa: N803
    """The system whose comm models answer (see the module docstring)."""
    if isinstance(system, SystemSpec):
        return CommSetup(system, f"system {system.name}")
    if system is not None:
        s = get_system(system)
        return CommSetup(s, f"system {s.name}")
    if link_bandwidth_Bps is None and link_latency_s is None:
        mine = [s for s in list_systems() if same_device(s.device, device)]
        if mine:
            return CommSetup(
                mine[0], f"system {mine[0].name} (the first catalog system of {device.name})"
            )
    bw = link_bandwidth_Bps or HOST_LINK_BANDWIDTH_BPS
    lat = HOST_LINK_LATENCY_S if link_latency_s is None else link_latency_s
    doc = {"schema_version": 1, "name": f"host-local-{device.name}", "description": "ranks as processes of one host",
           "device": device.name, "gpus_per_node": max(2, world),
           "tiers": [{"name": "loopback", "kind": "ethernet", "scope": "node",
                      "bandwidth_per_gpu_GBps": bw / 1e9, "latency_us": lat * 1e6}],
           "sources": [{"kind": "measurement", "title": "trainsim.builders.dlrm host-local estimate",
                        "note": f"{bw / 1e9:g} GB/s, {lat * 1e6:g} us per step"}]}  # fmt: skip
    return CommSetup(
        SystemSpec.model_validate(doc), f"host-local estimate ({bw / 1e9:g} GB/s, {lat * 1e6:g} us)"
    )


def same_device(name: str, dev: DeviceSpec) -> bool:
    """Whether the device ``name`` (catalog name, alias or YAML) is ``dev``; a name outside the
    catalog counts as ``dev`` only when it is ``dev``'s name."""
    try:
        return get_device(name).name == dev.name
    except ConfigError:
        return name == dev.name


def padded_group(system: SystemSpec, world: int) -> int:
    """The group size the comm models time ``world`` ranks as: ``world`` itself when it packs
    evenly onto the system's nodes (one partial node or equal nodes), else the ranks padded to
    ``ceil(world / gpus_per_node)`` full nodes — the packed placement (full nodes, the last one
    partial) has full nodes, whose GPUs send as much across the network as those of the padded
    group (an upper bound; e.g. 26 ranks on 8-GPU nodes are timed as 4 × 8 = 32)."""
    gpn = system.gpus_per_node
    if gpn is None or world <= gpn:
        return world
    nodes = -(-world // gpn)
    return world if world % nodes == 0 else nodes * gpn


def _collective_s(
    comm: CommSetup, kind: CollectiveKind, nbytes: float, world: int
) -> tuple[float, str]:
    from trainsim.comm import predict_collective

    if comm.system.name.startswith("host-local-"):
        p = predict_collective(kind, nbytes, world, system=comm.system, gpus_per_node=world)
        return p.duration_s, f"estimate:{comm.note}"
    group = padded_group(comm.system, world)
    p = predict_collective(kind, nbytes, group, system=comm.system)
    prov = p.provenance if group == world else f"{p.provenance};padded:{world}->{group} ranks"
    return p.duration_s, prov


# --- the workload ------------------------------------------------------------------------------------


def _split(batch: int, world: int) -> list[int]:
    return [batch // world + (1 if r < batch % world else 0) for r in range(world)]


def _mlp(
    c: Coster, dtype: str, b: int, widths: Sequence[int], *, last_relu: bool
) -> tuple[list[_K], list[_K]]:
    fwd: list[_K] = []
    bwd: list[_K] = []
    for i in range(1, len(widths)):
        k_in, n_out = widths[i - 1], widths[i]
        fwd.append(_k(c, "gemm", "fwd", dtype, batch=1, m=b, n=n_out, k=k_in, **_LINEAR))
        act = _k(c, "relu", "fwd", dtype, numel=b * n_out)
        actb = _k(c, "relu", "bwd", dtype, numel=b * n_out)
        if i < len(widths) - 1 or last_relu:
            fwd.append(act)
            bwd.append(actb)
        bwd.append(_gemm_bwd(c, dtype, b, n_out, k_in, variant=_LINEAR))
    bwd.reverse()
    return fwd, bwd


def _dense_params(spec: DLRMSpec) -> tuple[int, int]:
    """(parameters, tensors) of the bottom and top MLPs."""
    params, tensors = 0, 0
    for widths in ((spec.dense_features, *spec.bottom_mlp), (_top_in(spec), *spec.top_mlp)):
        for a, b in itertools.pairwise(widths):
            params += a * b + b
            tensors += 2
    return params, tensors


def _top_in(spec: DLRMSpec) -> int:
    d_bot = spec.bottom_mlp[-1]
    if spec.dot:
        f = 1 + len(spec.tables)
        return d_bot + f * (f - 1) // 2
    return d_bot + sum(t.dim for t in spec.tables)


def _interaction(c: Coster, spec: DLRMSpec, b: int) -> tuple[list[_K], list[_K]]:
    dt, f = spec.dtype, 1 + len(spec.tables)
    if spec.dot:
        d = spec.bottom_mlp[-1]
        pairs = f * (f - 1) // 2
        fwd = [_k(c, "gemm", "fwd", dt, batch=b, m=f, n=f, k=d), _k(c, "tril", "fwd", dt, B=b, F=f),
               _k(c, "concat", "fwd", dt, parts=2, rows=b, cols=(d + pairs) / 2)]  # fmt: skip
        bwd = [_k(c, "tril", "bwd", dt, B=b, F=f), _gemm_bwd(c, dt, f, f, d, batch=b)]
        return fwd, bwd
    cols = (spec.bottom_mlp[-1] + sum(t.dim for t in spec.tables)) / f
    return [_k(c, "concat", "fwd", dt, parts=f, rows=b, cols=cols)], []  # cat backward: views


def check_world(spec: DLRMSpec, world: int) -> None:
    """A world the spec's batch can be split over (each rank at least one sample): checked before
    anything is sized by it (a sharder's per-rank lists: ``--world 1e20`` was an OverflowError)."""
    if not isinstance(world, int) or world < 1:
        raise ConfigError(f"world must be a positive integer, got {world!r}")
    if spec.batch < world:
        raise ConfigError(
            f"batch {spec.batch} is smaller than the world size {world}: some rank has no samples"
        )


def _check_assignment(spec: DLRMSpec, assignment: Sequence[int], world: int) -> None:
    check_world(spec, world)
    if len(assignment) != len(spec.tables):
        raise ConfigError(f"assignment has {len(assignment)} entries for {len(spec.tables)} tables")
    bad = [
        (t.name, r)
        for t, r in zip(spec.tables, assignment, strict=True)
        if not (isinstance(r, int) and 0 <= r < world)
    ]
    if bad:
        raise ConfigError(
            f"assignment: table {bad[0][0]!r} on rank {bad[0][1]!r}, not in 0..{world - 1}"
        )


@dataclass(slots=True)
class _Rank:
    """Builds one rank's ops; kernels carry predicted_s and provenance."""

    rank: int
    dtype: str
    comm_stream: int
    ops: list[Op] = field(default_factory=list)
    kid: int = 0

    def add(self, name: str, ks: Sequence[_K], deps: Sequence[int | None] = ()) -> int | None:
        last = None
        for k in ks:
            fam = op_spec(k.op).family_for(k.phase)
            self.kid += 1
            feats: dict[str, int | float | str] = {
                "op": k.op,
                "phase": k.phase,
                "dtype": self.dtype,
                **k.inputs,
            }
            kern = Kernel(self.kid, f"{k.op}:{k.phase}", fam, COMPUTE, features=feats, predicted_s=k.seconds,
                          provenance=k.provenance)  # fmt: skip
            oid = len(self.ops) + 1
            d = tuple(sorted({x for x in deps if x is not None})) if last is None else (last,)
            self.ops.append(
                Op(oid, f"{name}:{k.op}", 1, OpCategory.COMPUTE, kernels=(kern,), deps=d)
            )
            last = oid
        return last

    def fused(self, name: str, ks: Sequence[_K], deps: Sequence[int | None] = ()) -> int | None:
        """One kernel for ``ks`` (FBGEMM TBE: every local table in one launch): their summed
        seconds, their provenances joined."""
        if not ks:
            return None
        provs = sorted({k.provenance for k in ks})
        merged = _K(ks[0].op, ks[0].phase, {"B": ks[0].inputs["B"], "T": len(ks)}, sum(k.seconds for k in ks),
                    provs[0] if len(provs) == 1 else "+".join(provs))  # fmt: skip
        return self.add(name, [merged], deps)

    def collective(
        self, name: str, c: Collective, seconds: float, prov: str, deps: Sequence[int | None]
    ) -> int:
        self.kid += 1
        kern = Kernel(self.kid, f"{c.kind.value}:{c.group}", c.kind.family, self.comm_stream, collective=c,
                      predicted_s=seconds, provenance=prov)  # fmt: skip
        oid = len(self.ops) + 1
        self.ops.append(Op(oid, name, 1, OpCategory.COMMUNICATION, kernels=(kern,),
                           deps=tuple(sorted({x for x in deps if x is not None}))))  # fmt: skip
        return oid


def build_dlrm_workload(spec: DLRMSpec, assignment: Sequence[int], world: int, *, device: str | Path | DeviceSpec,
                        system: str | Path | SystemSpec | None = None, kernel_models: KernelModels = None,
                        overlap: bool | None = None, link_bandwidth_Bps: float | None = None,  # noqa: N803
                        link_latency_s: float | None = None, tbe: bool | None = None,
                        coster: Coster | None = None) -> Workload:  # fmt: skip
    """The DLRM step as IR, one rank graph per rank (see the module docstring).

    ``assignment[i]`` is the rank owning ``spec.tables[i]``. ``overlap``: collectives on their
    own stream (default: on GPUs). ``tbe``: batched tables with the update fused (default: on GPUs). ``kernel_models``: a ``trainsim fit`` artifact (or models)
    that answers before the device's own models.
    """
    _check_assignment(spec, assignment, world)
    c = coster or Coster(device, kernel_models)
    dev = c.device
    gpu = is_gpu(dev)
    comm = comm_setup(
        dev, world, system, link_bandwidth_Bps=link_bandwidth_Bps, link_latency_s=link_latency_s
    )
    overlap = gpu if overlap is None else overlap
    dt, eb = spec.dtype, dtype_bytes(spec.dtype)
    shares = _split(spec.batch, world)
    dim_on = [
        sum(t.dim for t, r in zip(spec.tables, assignment, strict=True) if r == o)
        for o in range(world)
    ]
    # send[i][j]: bytes rank i sends to rank j in the forward all-to-all (pooled embeddings)
    send = [[float(shares[j] * dim_on[i] * eb) for j in range(world)] for i in range(world)]
    group = tuple(range(world))
    params, tensors = _dense_params(spec)
    if world > 1:
        from trainsim.comm import all_to_all_size_bytes

        a2a_s, a2a_prov = _collective_s(
            comm, CollectiveKind.ALL_TO_ALLV, all_to_all_size_bytes(send), world
        )
        ar_s, ar_prov = _collective_s(comm, CollectiveKind.ALL_REDUCE, params * eb, world)
    tbe = gpu if tbe is None else tbe
    tk = [_table_kernels(c, t, spec.batch, dt, tbe=tbe) for t in spec.tables]
    graphs = []
    for r in range(world):
        b = shares[r]
        g = _Rank(r, dt, COMM if overlap else COMPUTE)
        mine = [i for i, o in enumerate(assignment) if o == r]
        lookups = (
            g.fused if tbe else g.add
        )  # TBE: one kernel per pass; else an EmbeddingBag per table
        emb = lookups("embedding_fwd", [k for i in mine for k in tk[i][0]])
        a2a_f = a2a_b = None
        if world > 1:
            coll = Collective(CollectiveKind.ALL_TO_ALLV, "emb", group, int(sum(send[r])), 0, dt,
                              out_bytes=int(sum(send[i][r] for i in group)), peer_bytes=tuple(int(x) for x in send[r]))  # fmt: skip
            a2a_f = g.collective("all_to_all_fwd", coll, a2a_s, a2a_prov, [emb])
        bot_f, bot_b = _mlp(c, dt, b, (spec.dense_features, *spec.bottom_mlp), last_relu=True)
        top_f, top_b = _mlp(c, dt, b, (_top_in(spec), *spec.top_mlp), last_relu=False)
        int_f, int_b = _interaction(c, spec, b)
        bot = g.add("bottom_mlp_fwd", bot_f)
        last = g.add("interaction_fwd", int_f, [bot, a2a_f, emb])
        last = g.add("top_mlp_fwd", top_f, [last])
        loss = [_k(c, "elementwise", "fwd", dt, numel=b), _k(c, "elementwise", "bwd", dt, numel=b)]
        last = g.add("loss", loss, [last])
        last = g.add("top_mlp_bwd", top_b, [last])
        last = g.add("interaction_bwd", int_b, [last]) or last
        if world > 1:
            back = [float(b * dim_on[o] * eb) for o in range(world)]  # gradients back to each owner
            coll = Collective(CollectiveKind.ALL_TO_ALLV, "emb", group, int(sum(back)), 1, dt,
                              out_bytes=int(sum(send[r])), peer_bytes=tuple(int(x) for x in back))  # fmt: skip
            a2a_b = g.collective("all_to_all_bwd", coll, a2a_s, a2a_prov, [last])
        last = g.add("bottom_mlp_bwd", bot_b, [last])
        ar = None
        if world > 1:
            coll = Collective(CollectiveKind.ALL_REDUCE, "dp", group, params * eb, 0, dt)
            ar = g.collective("all_reduce_dense", coll, ar_s, ar_prov, [last])
        lookups("embedding_bwd", [k for i in mine for k in tk[i][1]], [a2a_b, last])
        g.add("optimizer", [_k(c, "sgd", "step", dt, params=params, tensors=tensors)], [ar, last])
        graphs.append(RankGraph(rank=r, ops=tuple(g.ops), streams=(COMPUTE, COMM), device=dev.name,
                                metadata={"tables": [spec.tables[i].name for i in mine], "batch": b}))  # fmt: skip
    note = comm.note
    if world > 1 and not comm.system.name.startswith("host-local-"):
        padded = padded_group(comm.system, world)
        if padded != world:
            note += (f"; {world} ranks do not fill {comm.system.name} nodes of {comm.system.gpus_per_node} evenly:"
                     f" collectives timed on {padded // comm.system.gpus_per_node} full nodes ({padded} ranks)")  # fmt: skip
    meta = {"source": "trainsim.builders.dlrm", "device": dev.name, "comm": note, "world": world,
            "assignment": list(assignment), "overlap": overlap, "tbe": tbe, "gpu": gpu}  # fmt: skip
    return Workload(ranks=tuple(graphs), process_groups={"emb": group, "dp": group}, metadata=meta)


def sim_options(workload: Workload) -> Any:
    """Simulation options: model durations; GPU ranks pay eager-PyTorch dispatch per op
    (HostModel's T1–T4 from the A100 recsys trace), CPU ranks none (already in the op times)."""
    from trainsim.builders.costs import HOST
    from trainsim.host.overheads import Overhead, OverheadDB, Stat
    from trainsim.sim import HostMode, KernelSource, SimOptions

    if not workload.metadata.get("gpu"):
        return SimOptions(kernels=KernelSource.MODEL, overheads=HostMode.STATS, thread_edges=False,
                          launch_latency_s=0.0, kernel_gap_s=0.0)  # fmt: skip
    t = {Overhead.T1: 3.1e-6, Overhead.T2: 13.3e-6, Overhead.T4: 3.9e-6, Overhead.T3: 2.4e-6}
    assert abs(sum(t.values()) - HOST.kernel_op_s) < 1e-9  # one source: HostModel's 22.7 us
    db = OverheadDB(
        global_={k: Stat(v, v, 0.0, 1, 1) for k, v in t.items()},
        sources=["HostModel (A100 recsys trace)"],
    )
    return SimOptions(
        kernels=KernelSource.MODEL, overheads=HostMode.SHARED, overhead_db=db, thread_edges=False
    )


def provenance_summary(workload: Workload) -> dict[str, int]:
    """Kernel counts by provenance (collectives included)."""
    out: dict[str, int] = {}
    for rg in workload.ranks:
        for k in rg.kernels():
            out[k.provenance] = out.get(k.provenance, 0) + 1
    return dict(sorted(out.items()))


def predict_dlrm_step(spec: DLRMSpec, assignment: Sequence[int], world: int, *, device: str | Path | DeviceSpec,
                      system: str | Path | SystemSpec | None = None, **kw: Any) -> float:  # fmt: skip
    """Predicted step seconds: :func:`trainsim.sim.simulate` of :func:`build_dlrm_workload`
    (``kw``: its keyword options)."""
    from trainsim.sim import simulate

    w = build_dlrm_workload(spec, assignment, world, device=device, system=system, **kw)
    return float(simulate(w, sim_options(w)).predicted_step_s)


__all__ = [
    "DLRM_2022_REUSE",
    "HOST_LINK_BANDWIDTH_BPS",
    "HOST_LINK_LATENCY_S",
    "CommSetup",
    "Coster",
    "DLRMSpec",
    "TableSpec",
    "build_dlrm_workload",
    "comm_setup",
    "dlrm_spec_from_dict",
    "is_gpu",
    "load_dlrm_spec",
    "padded_group",
    "predict_dlrm_step",
    "provenance_summary",
    "random_tables",
    "resolve_device",
    "sim_options",
    "table_costs",
]
