"""Heuristic embedding-lookup models: 002 §4.3.2.1 (L2 hit rate) and 000 §III-E (reuse factors).

Both answer the ``embedding_bag`` operator (a batched embedding-bag lookup as in FBGEMM's TBE):
``B`` samples x ``T`` tables, each sample pooling ``L`` rows of ``D`` elements from a table of
``E`` rows. Both are spec-based: memory traffic divided by catalog bandwidths.

**002 §4.3.2.1** — one warp per output vector (``B·T`` warps), per-warp traffic::

    table_offsets 32 B, offsets 64 B                    (always in L2)
    indices       ceil(4 L / 32) * 32 B                 (DRAM)
    outputs       ceil(eb D / 32) * 32 B                (DRAM)
    weights       L * ceil(eb D / 32) * 32 B            forward: read L rows
                  2 L * ceil(eb D / 32) * 32 B          backward (SGD): read + write them

Reading: the thesis prints the forward weights as ``ceil(4D/32)*32`` (one row); a warp that
pools L rows reads L rows, so we multiply by L. Its backward rounds the whole
``ceil(2 * 4 L D / 32) * 32``; the rows are not contiguous, so we round each row as the forward
does (the same bytes when ``eb D`` is a multiple of 32 and L an integer; with a fractional mean L
the rounded total stood still while the L2 hits grew, and more lookups took less time). ``eb``
is the element size of the dtype (the thesis' 4 is fp32). With ``rows_per_block`` output vectors
per thread block and one block per SM, ``num_tables = rows_per_block * SMs / B`` tables share
the L2 at a time, at least one (beyond ``rows_per_block * SMs`` samples one table's bags fill the
GPU; the ratio alone would cache more rows than the L2 holds, 2.4x at B 8192 on an A100),
``cached = min(L2 / (num_tables * D * eb), E)`` rows of each are cached, and a lookup
of L rows hits with probability ``p = C(cached, L) / C(E, L)``; ``p`` of the weight traffic
goes to L2, the rest to DRAM::

    t = B T (DRAM_traffic / DRAM_bandwidth + L2_traffic / L2_bandwidth)

**000 §III-E** — the same traffic, but the L2 hit rate comes from the batch's *reuse factors*:
``rf_0 .. rf_16``, the fraction of the distinct rows accessed once (bin 0), 2 times (bin 1),
3–4 times (bin 2), ..., (2^(i-1), 2^i] times (bin i), as Meta's DLRM dataset publishes them.
With ``r`` = the mean accesses per distinct row, a batch touches ``U = B T L / r`` distinct
rows; the first access of each comes from DRAM, the other ``B T L - U`` from L2 while the
distinct rows fit in it (a fraction ``min(1, L2 / (U D eb))`` of them otherwise).

Approximations: the catalog has no L2 bandwidth; we take 2.5x the DRAM bandwidth (V100 ≈2.2
TB/s over 0.9 TB/s, A100 ≈5 TB/s over 2 TB/s, from published microbenchmarks) unless one is
given. Indices are int32 (``index_bytes`` 4).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from trainsim.errors import ModelError
from trainsim.hardware import DeviceSpec
from trainsim.hardware.schema import DeviceSpec as _DeviceSchema
from trainsim.ir.kinds import KernelFamily
from trainsim.kernels.features import Phase, as_inputs, dtype_bytes, op_spec
from trainsim.kernels.model import KernelModel, KernelQuery
from trainsim.kernels.samples import EntryKey

L2_OVER_DRAM = 2.5  # Approximation: L2 bandwidth / DRAM bandwidth (see the module docstring)
RF_BINS = 17
RF_NAMES = tuple(f"rf_{i}" for i in range(RF_BINS))
_OP = "embedding_bag"


def _round32(nbytes: np.ndarray) -> np.ndarray:
    return np.ceil(nbytes / 32.0) * 32.0


def rf_mean_accesses(rf: np.ndarray) -> np.ndarray:
    """Mean accesses per distinct row from reuse-factor fractions (rows x 17): bin 0 counts 1,
    bin i the mean of the integers in (2^(i-1), 2^i]."""
    reps = np.array([1.0] + [(2.0 ** (i - 1) + 1 + 2.0**i) / 2 for i in range(1, RF_BINS)])
    total = rf.sum(axis=-1)
    if np.any(total <= 0):
        raise ModelError("reuse factors must not all be zero")
    return (rf @ reps) / total


def _log_comb_ratio(cached: np.ndarray, e: np.ndarray, l: np.ndarray) -> np.ndarray:  # noqa: E741
    """log(C(cached, L) / C(E, L)) via log-gamma, elementwise: 0 when cached >= E (the whole
    table is cached, whatever L: a bag may repeat rows of a table smaller than L), -inf when
    fewer rows than L are cached (no bag of L distinct rows is all cached; this also covers
    E < L with part of the table cached)."""
    cached, e, l = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (cached, e, l)))  # noqa: E741
    out = np.where(cached >= e, 0.0, -np.inf)
    ratio = (cached < e) & (cached >= l)  # then E > cached >= L: every log-gamma argument >= 1
    if ratio.any():
        lg = np.vectorize(math.lgamma)
        c, n, k = cached[ratio], e[ratio], l[ratio]
        out[ratio] = np.minimum(lg(c + 1) - lg(c - k + 1) - lg(n + 1) + lg(n - k + 1), 0.0)
    return out


class EmbeddingLookupModel(KernelModel):
    """002 §4.3.2.1 (``reuse_factors=False``) or 000 §III-E (``reuse_factors=True``)."""

    model_type = "embedding-heuristic"

    def __init__(self, device: DeviceSpec, *, reuse_factors: bool = False, rows_per_block: int = 32,
                 l2_bandwidth_Bps: float | None = None, index_bytes: int = 4) -> None:  # fmt: skip  # noqa: N803
        if device.l2_cache_bytes is None or device.sm_count is None:
            raise ModelError(
                f"device {device.name}: the embedding heuristic needs l2_cache_MB and sm_count"
            )
        self.spec = device
        self.device = device.name
        self.reuse_factors = reuse_factors
        self.rows_per_block = rows_per_block
        self.l2_bw = l2_bandwidth_Bps or L2_OVER_DRAM * device.memory_bandwidth_Bps
        self.index_bytes = index_bytes
        self.name = f"embedding-{'reuse-factors' if reuse_factors else 'l2'}:{device.name}"

    def supports(self, q: KernelQuery) -> bool:
        if q.op != _OP or q.key.phase not in (Phase.FWD, Phase.BWD):
            return False
        need = (*op_spec(_OP).required, *RF_NAMES[: int(self.reuse_factors)])  # reuse is optional
        return all(n in q.inputs for n in need)

    def _hit_rate(
        self, x: dict[str, np.ndarray], eb: int, inputs: Mapping[str, ArrayLike]
    ) -> np.ndarray:
        l2 = float(self.spec.l2_cache_bytes or 0.0)
        if self.reuse_factors:
            rf = np.stack([np.broadcast_to(np.asarray(inputs.get(n, 0.0), dtype=float), x["B"].shape)
                           for n in RF_NAMES], axis=-1)  # fmt: skip
            lookups = x["B"] * x["T"] * x["L"]
            unique = np.minimum(lookups / rf_mean_accesses(rf), x["E"] * x["T"])
            fits = np.minimum(1.0, l2 / (unique * x["D"] * eb))
            return fits * (1.0 - unique / lookups)  # share of row reads served by L2
        sms = float(self.spec.sm_count or 1)
        # at least one table: beyond rows_per_block * SMs samples one table's bags fill the GPU
        # and its rows alone share the L2 (the ratio alone cached more rows than the L2 holds)
        num_tables = np.maximum(self.rows_per_block * sms / x["B"], 1.0)
        cached = np.minimum(l2 / (num_tables * x["D"] * eb), x["E"])
        return np.exp(_log_comb_ratio(np.floor(cached), x["E"], x["L"]))

    def predict_many(
        self, q: KernelQuery, inputs: Mapping[str, ArrayLike]
    ) -> tuple[np.ndarray, str]:
        x = as_inputs(op_spec(_OP), inputs)
        eb = dtype_bytes(q.key.dtype)
        row = _round32(eb * x["D"])
        if q.key.phase is Phase.FWD:
            weights, outputs = x["L"] * row, row
        else:
            weights, outputs = 2.0 * x["L"] * row, row  # each of the L rows read and written
        p = self._hit_rate(x, eb, inputs)
        indices = _round32(self.index_bytes * x["L"])
        tr_l2 = 32.0 + 64.0 + p * weights
        tr_dram = indices + outputs + (1.0 - p) * weights
        warps = x["B"] * x["T"]
        t = warps * (tr_dram / self.spec.memory_bandwidth_Bps + tr_l2 / self.l2_bw)
        return t, f"spec-based:{self.device}"

    def domain(self) -> list[tuple[KernelFamily, EntryKey, dict[str, tuple[float, float]]]]:
        ranges = {
            "B": (256.0, 65536.0),
            "E": (1e3, 1e8),
            "T": (1.0, 64.0),
            "L": (1.0, 128.0),
            "D": (16.0, 512.0),
        }
        return [
            (op_spec(_OP).family_for(p), EntryKey(_OP, p, "fp32"), ranges)
            for p in (Phase.FWD, Phase.BWD)
        ]

    def to_artifact(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        return {"model": self.model_type, "name": self.name, "device": self.device,
                "device_spec": self.spec.model_dump(mode="json"), "reuse_factors": self.reuse_factors,
                "rows_per_block": self.rows_per_block, "l2_bandwidth_Bps": self.l2_bw,
                "index_bytes": self.index_bytes}, {}  # fmt: skip

    @classmethod
    def from_artifact(
        cls, manifest: dict[str, Any], arrays: Mapping[str, np.ndarray]
    ) -> EmbeddingLookupModel:
        try:
            return cls(_DeviceSchema.model_validate(manifest["device_spec"]),
                       reuse_factors=bool(manifest["reuse_factors"]), rows_per_block=int(manifest["rows_per_block"]),
                       l2_bandwidth_Bps=float(manifest["l2_bandwidth_Bps"]), index_bytes=int(manifest["index_bytes"]))  # fmt: skip
        except (KeyError, TypeError, ValueError) as e:
            raise ModelError(f"embedding model artifact: bad or missing field ({e!r})") from None
