"""Paper 001's transformer operators timed by a GPU's own ``trainsim bench`` calibration.

Paper 001 benchmarks its operators (Table I) per GPU; where a device has no such data (an H100,
say) the LLM builder used to borrow a sibling's (the GH200's, bf16/fp16 only) or fall back to
the roofline. trainsim ships its own CUDA calibration samples (``bench/data/cuda_full_*``: every
kernel suite measured on one GPU, bf16 and fp32, fitted per operator,
:mod:`trainsim.bench.samples`), and those operators are the torch calls a transformer layer is
made of. :class:`BenchTranslator` answers a paper-001 query from them by writing the operator as
the call it runs (``t = b·l`` tokens, ``p = mp``):

=============================  ==========================================================
001 operator (inputs)          bench operator (inputs)
=============================  ==========================================================
linear1 (QKV)                  gemm ``m=t, k=dim, n=3·dim/p``, bias, weight ``[n, k]``
linear2 (attention output)     gemm ``m=t, k=dim/p, n=dim``, bias, weight ``[n, k]``
linear3 / linear4 (MLP)        gemm ``k=dim, n=4·dim/p`` / ``k=4·dim/p, n=dim``, bias, ``[n, k]``
linear_final (logits)          gemm ``k=dim, n=vocab/p``, no bias, weight ``[n, k]``
baddbmm / bmm (unfused core)   gemm ``batch=b·h/p``: ``l×hd·hd×l`` / ``l×l·l×hd``, ``hd=dim/h``
flash_atten                    attention ``batch=b, heads=h/p, seq_len=l, head_dim=hd``,
                               causal (see below)
softmax, fused masked softmax  softmax ``b, h/p, l`` (the ``[b, h/p, l, l]`` scores)
layernorm / RMSlayernorm       the same operator on ``t`` rows of ``dim``
gelu                           gelu on ``[t, 4·dim/p]``
res_add                        one two-input add of ``t·dim`` elements (forward; backward: where
                               the residual and the branch gradients meet, one add again)
dropout (builder's own)        dropout of ``t·dim`` elements
embedding                      index_select of ``t`` rows from a ``vocab/p × dim`` table
parallel_cross_entropy_128     cross_entropy of ``t`` rows over ``vocab/p`` classes
=============================  ==========================================================

The builder may give the exact shape where 001's operator set has none (``n``/``k`` of a GQA or
SwiGLU projection, ``head_dim``, the model's padded ``vocab``); without them the defaults above
hold (001's 50,257 padded to 128·p for the vocabulary operators, the size the builder scales
from).

Approximations (stated, not fitted): the bench's attention is unmasked; a causal FlashAttention
kernel skips the key blocks above the diagonal, so the unmasked time is scaled by the fraction
of ``128 × 128`` blocks it computes, ``(n + 1) / 2n`` with ``n = ⌈l / 128⌉`` (1 for one block,
→ ½ for long sequences). Megatron's fused scale-mask-softmax is timed as the plain softmax of
the same tensor. fp16 queries are answered by the bf16 measurements (equal tensor-core peaks).

Beyond the measured work: the fitted trees are flat past the largest measured call, and a call
with every input inside the sweep can still hold far more work than any measured one (attention
at batch 8 × 32 heads × 4,096 tokens; unchecked, such answers ran at 1.4–2.4× the peak). A call
whose roofline time (at the measured device's own peaks) exceeds that of the entry's fifth
largest measured call is carried along the roofline from its own shape shrunk to that work: its
batch-like size (GEMM rows or batch, attention batch, norm/softmax/loss rows, element count,
gathered rows) scaled down until the roofline time equals the threshold, the model asked there,
and the answer scaled by the two roofline times (``;beyond-measured-work``) — continuous at the
threshold, growing with the work beyond it, and at the shape's own efficiency (head size, GEMM
variant), not another shape's. Sizes beyond the sweep shrink first, towards the entry's largest
measured value (since 2026-12-01): an attention of 32k tokens is asked at the sample's longest
sequence and fewer heads, not at one or two heads and 32k tokens, where the trees are flat and
its efficiency had fallen to 0.8x that of 16k tokens (context parallelism came out superlinear).
The resize what-if on a GPU capture carries the same way (:class:`CarriedTimer`,
:func:`carried_time`).

Not answered (the caller's next source answers): operators without a bench counterpart (RoPE,
fill-mask) and 001's optimizer operator, which times Megatron's FusedAdam (one fused pass) where
the bench's ``adam`` row is torch's multi-kernel Adam.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from trainsim.hardware import DeviceSpec

_FLASH_BLOCK = 128  # FlashAttention-2/3 key-block size on Ampere/Hopper (the causal skip unit)


@dataclass(frozen=True, slots=True)
class Translation:
    """A bench query standing for a paper-001 operator: ``op`` with ``inputs``, times ``scale``."""

    op: str
    phase: str
    inputs: dict[str, float]
    scale: float = 1.0
    note: str = ""


def _gemm(m: float, k: float, n: float, *, batch: float = 1.0, bias: bool = True, wt: bool = True) -> dict[str, float]:  # fmt: skip
    return {"batch": batch, "m": m, "n": n, "k": k, "bias": float(bias), "wt": float(wt)}


def _seed001_vocab(mp: float) -> float:
    """001's benchmarked vocabulary (GPT-2's 50,257) padded to 128·mp (001 Eq. 1–2)."""
    f = 128 * mp
    return math.ceil(50257 / f) * f


def translate(op: str, phase: str, x: dict[str, float]) -> Translation | None:
    """The bench operator that times paper-001 operator ``op`` (inputs ``x``), or None."""
    p, b, seq, dim = x.get("mp", 1.0), x.get("b", 1.0), x.get("l", 1.0), x.get("dim", 0.0)
    t = b * seq
    vocab = x.get("vocab") or _seed001_vocab(p)
    if op in ("linear1", "linear2", "linear3", "linear4", "linear_final"):
        default = {"linear1": (dim, 3 * dim / p), "linear2": (dim / p, dim), "linear3": (dim, 4 * dim / p),
                   "linear4": (4 * dim / p, dim), "linear_final": (dim, vocab / p)}  # fmt: skip
        k, n = x.get("k", default[op][0]), x.get("n", default[op][1])
        if k <= 0 or n <= 0:
            return None
        return Translation("gemm", phase, _gemm(t, k, n, bias=op != "linear_final"))
    h = x.get("h", 0.0)
    if op in ("baddbmm", "bmm", "flash_atten") and h <= 0:
        return None
    hd = x.get("head_dim", dim / h if h > 0 else 0.0)
    if op == "baddbmm":
        return Translation("gemm", phase, _gemm(seq, hd, seq, batch=b * h / p, bias=False, wt=False))
    if op == "bmm":
        return Translation("gemm", phase, _gemm(seq, seq, hd, batch=b * h / p, bias=False, wt=False))
    if op == "flash_atten":
        n = math.ceil(seq / _FLASH_BLOCK)
        return Translation("attention", phase, {"batch": b, "heads": h / p, "seq_len": seq, "head_dim": hd},
                           (n + 1) / (2 * n), ";causal-from-unmasked")  # fmt: skip
    if op in ("softmax", "ScaledUpperTriangMaskedSoftmax"):
        note = ";as-softmax" if op != "softmax" else ""
        return Translation("softmax", phase, {"mp": 1.0, "b": b, "h": h / p, "l": seq}, 1.0, note)
    if op in ("layernorm", "RMSlayernorm"):
        return Translation(op, phase, {"b": t, "l": 1.0, "dim": dim})
    if op == "gelu":
        return Translation("gelu", phase, {"mp": p, "b": 1.0, "l": t, "dim": dim})
    if op == "res_add":  # the bench's element-wise backward rows are mul's (two products)
        return Translation("elementwise", "fwd", {"numel": t * dim}, 1.0, f";add-{phase}")
    if op == "dropout":  # the builder's own: the residual stream's, or ``numel`` given
        return Translation("dropout", phase, {"numel": x.get("numel", t * dim)})
    if op == "embedding":
        return Translation("index_select", phase, {"rows": vocab / p, "d": dim, "k": t})
    if op == "parallel_cross_entropy_128":
        return Translation("cross_entropy", phase, {"n": t, "v": vocab / p})
    return None


_TOP = 5  # beyond the fifth largest measured call of an entry, calls are carried (see the module)
_CARRIED_KEPT = 1 << 16  # answers kept per calibration (carried_time) before the memo starts over
_SPLITS = 4  # the carry is no less efficient than the shape at 1/2 .. 1/16 of the limit's work (see there)


@dataclass(frozen=True)
class BenchCalibration:
    """A device's shipped bench calibration: its fitted models and the measured device."""

    sample: str
    models: tuple[Any, ...]
    device: DeviceSpec
    # carried_time's answers by (op, phase, dtype, inputs): plans of different shapes ask many
    # of the same calls (a search asked 1,040, 614 of them distinct), and each carried answer
    # costs ~20 shrunk queries through the trees
    _carried: dict[tuple[Any, ...], tuple[float, str] | None] = field(
        default_factory=dict, compare=False, hash=False, repr=False)

    def work_threshold(self, op: str, phase: str, dtype: str) -> float | None:
        """Roofline seconds of the entry's fifth largest measured call (at the measured device's
        peaks), or None when the sample has no such entry."""
        shipped = _shipped_figures(self.sample, "thresholds")
        if shipped is not None:
            return shipped.get(f"{op}/{phase}/{dtype}")
        return _threshold(self.sample, self.device, op, phase, dtype)

    def efficiency_cap(self, op: str, phase: str, dtype: str) -> float | None:
        """The best efficiency (roofline time over measured time) of the entry's DRAM-bound
        calls (:func:`_efficiency_cap`), or None: memory-bound entries only."""
        shipped = _shipped_figures(self.sample, "efficiency_caps")
        if shipped is not None:
            return shipped.get(f"{op}/{phase}/{dtype}")
        return _efficiency_cap(self.sample, self.device, op, phase, dtype)

    def measured_range(self, op: str, phase: str, dtype: str) -> dict[str, tuple[float, float]]:
        """Each input's measured (lowest, highest) value in the entry's rows; {} without one."""
        return _ranges(self.models).get(f"{op}/{phase}/{dtype}", {})


@cache
def _ranges(models: tuple[Any, ...]) -> dict[str, dict[str, tuple[float, float]]]:
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for m in models:
        for _, key, ranges in m.domain():
            out.setdefault(f"{key.op}/{key.phase.value}/{key.dtype}", dict(ranges))
    return out


def thresholds_path(sample: str) -> Path:
    from trainsim.bench.samples import BENCH_DATA

    return BENCH_DATA / f"{sample}.thresholds.json"


@cache
def _shipped_doc(sample: str) -> dict[str, Any] | None:
    """``<sample>.thresholds.json`` (written by :func:`write_thresholds`) while it belongs to
    the sample (its fit digest), else None: then its figures are computed from the rows (~1.5 s
    a process)."""
    import json

    from trainsim.bench.samples import fit_digest

    try:
        doc = json.loads(thresholds_path(sample).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("digest") != fit_digest((sample,)):
        return None
    return doc


@cache
def _shipped_figures(sample: str, section: str) -> dict[str, float] | None:
    """One section of the figures shipped beside the sample (``thresholds``,
    ``efficiency_caps``), or None (:func:`_shipped_doc`)."""
    doc = _shipped_doc(sample)
    values = doc.get(section) if doc is not None else None
    return {str(k): float(v) for k, v in values.items()} if isinstance(values, dict) else None


def compute_thresholds(sample: str, device: DeviceSpec) -> dict[str, float]:
    """Every entry's threshold (:meth:`BenchCalibration.work_threshold`) the translations use,
    from the rows."""
    return {f"{k.op}/{k.phase.value}/{k.dtype}": v for k in _dataset(sample).entry_keys()
            if k.op in _WORK_DIMS and (v := _threshold(sample, device, k.op, k.phase.value, k.dtype)) is not None}  # fmt: skip


def compute_efficiency_caps(sample: str, device: DeviceSpec) -> dict[str, float]:
    """Every memory-bound entry's cap (:meth:`BenchCalibration.efficiency_cap`), from the rows."""
    return {f"{k.op}/{k.phase.value}/{k.dtype}": v for k in _dataset(sample).entry_keys()
            if k.op in _MEMORY_BOUND
            and (v := _efficiency_cap(sample, device, k.op, k.phase.value, k.dtype)) is not None}  # fmt: skip


def write_thresholds(sample: str) -> Path:
    """Write ``<sample>.thresholds.json`` (atomically) for a shipped sample."""
    import json
    import os

    from trainsim.bench.samples import BENCH_DATA, fit_digest
    from trainsim.hardware import get_device

    device = get_device(str(BENCH_DATA / f"{sample}.device.yaml"))
    doc = {"what": "per (operator/phase/dtype): roofline seconds, at the measured device's peaks, of the "
                   "fifth largest measured call; calls beyond it are carried (trainsim.builders.bench_costs)",
           "digest": fit_digest((sample,)), "thresholds": compute_thresholds(sample, device),
           "efficiency_caps_what": "per memory-bound (operator/phase/dtype): the best roofline-over-measured "
                                   "time of its calls moving more than twice the L2; no answer of a call that "
                                   "large is more efficient (trainsim.builders.bench_costs)",
           "efficiency_caps": compute_efficiency_caps(sample, device)}  # fmt: skip
    path = thresholds_path(sample)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


@cache
def _dataset(sample: str) -> Any:
    """The sample's rows, read as fitting reads them (used only where no current thresholds ship)."""
    from trainsim.bench.opspecs import register_bench_ops
    from trainsim.bench.samples import sample_files
    from trainsim.kernels import read_kernel_dataset

    register_bench_ops()
    return read_kernel_dataset(sample_files((sample,)))


@cache
def _entry_rows(sample: str, device: DeviceSpec, op: str, phase: str, dtype: str) -> tuple[Any, Any] | None:
    """The entry's measured calls as (roofline seconds at ``device``'s peaks, measured seconds),
    or None when the sample has no such entry."""
    import numpy as np

    from trainsim.kernels import query
    from trainsim.kernels.roofline import RooflineModel
    from trainsim.kernels.samples import EntryKey

    ds, key = _dataset(sample), EntryKey.parse(f"{op}/{phase}/{dtype}")
    if key not in ds.entry_keys():
        return None
    x, y, _ = ds.arrays(key)
    roof, _ = RooflineModel(device).predict_many(query(op, phase=phase, dtype=dtype), x)
    return np.asarray(roof, dtype=float), np.asarray(y, dtype=float)


@cache
def _threshold(sample: str, device: DeviceSpec, op: str, phase: str, dtype: str) -> float | None:
    import numpy as np

    rows = _entry_rows(sample, device, op, phase, dtype)
    if rows is None:
        return None
    return float(np.sort(rows[0])[-min(_TOP, len(rows[0]))])


# memory-bound bench operators: their answers are capped at the best measured DRAM efficiency
_MEMORY_BOUND = frozenset({"layernorm", "RMSlayernorm", "softmax", "gelu", "elementwise", "dropout", "cross_entropy",
                           "index_select"})  # fmt: skip
_L2_MARGIN = 2.0  # calls moving more than this many times the L2 stream from DRAM


def _dram_roof_s(device: DeviceSpec) -> float:
    """Roofline seconds of moving ``_L2_MARGIN`` times the device's L2 at its DRAM bandwidth."""
    l2 = device.l2_cache_bytes or 0.0
    return _L2_MARGIN * l2 / (device.memory_bandwidth_GBps * 1e9)


@cache
def _efficiency_cap(sample: str, device: DeviceSpec, op: str, phase: str, dtype: str) -> float | None:
    """The best efficiency (roofline over measured seconds) among the entry's calls whose
    roofline time exceeds :func:`_dram_roof_s` (they stream from DRAM); None for an entry that
    is not memory-bound or has no such call. The fitted trees can interpolate above it (the
    H100 sample's RMSNorm at 16,384 × 4,096: 3.78 TB/s, where no measured call of that size beat
    2.7 TB/s and the datasheet peak is 3.35)."""
    import numpy as np

    rows = _entry_rows(sample, device, op, phase, dtype) if op in _MEMORY_BOUND else None
    if rows is None:
        return None
    roof, measured = rows
    big = roof > _dram_roof_s(device)
    return float(np.max(roof[big] / measured[big])) if big.any() else None


# the inputs a call's work grows with, in the order the carry beyond the measured work shrinks
# them, each with the power the work grows by (attention: the square of the sequence)
_WORK_DIMS: dict[str, tuple[tuple[str, float], ...]] = {
    "gemm": (("batch", 1.0), ("m", 1.0), ("n", 1.0), ("k", 1.0)),
    "attention": (("batch", 1.0), ("heads", 1.0), ("seq_len", 2.0)),
    "softmax": (("b", 1.0), ("h", 1.0), ("l", 2.0)), "layernorm": (("b", 1.0),), "RMSlayernorm": (("b", 1.0),),
    "gelu": (("l", 1.0),), "elementwise": (("numel", 1.0),), "dropout": (("numel", 1.0),),
    "index_select": (("k", 1.0),), "cross_entropy": (("n", 1.0),),
}  # fmt: skip


@cache
def _load(sample: str) -> BenchCalibration | None:
    from trainsim.bench.opspecs import register_bench_ops
    from trainsim.bench.samples import BENCH_DATA, shipped_models
    from trainsim.hardware import get_device
    from trainsim.kernels import load_model

    artifact = shipped_models((sample,))
    if artifact is None:  # the sample changed since its models were fitted: nothing is refitted here
        return None
    register_bench_ops()
    return BenchCalibration(sample, (load_model(artifact),), get_device(str(BENCH_DATA / f"{sample}.device.yaml")))


def bench_calibration(device: DeviceSpec) -> BenchCalibration | None:
    """The shipped bench calibration of ``device`` (matched by its name or aliases, or those of
    the catalog device of its name: a YAML copy of the part that drops its aliases), or None."""
    from trainsim.bench.samples import cuda_sample
    from trainsim.hardware import find_device

    catalog = find_device(device.name)
    sample = cuda_sample((device.name, *device.aliases, *(catalog.aliases if catalog is not None else ())))
    return _load(sample) if sample else None


def _aligned_like(size: float, original: float) -> float:
    """The largest size up to ``size`` (at least one step) whose alignment
    (:func:`~trainsim.kernels.features.pow2_divisor`) is exactly ``original``'s, never above
    ``original``: an odd multiple of that power of two, or any multiple of the cap."""
    import math

    from trainsim.kernels.features import ALIGN_CAP, pow2_divisor

    align = float(pow2_divisor(original))
    q = max(1, math.floor(size / align))
    if align < ALIGN_CAP and q % 2 == 0:
        q -= 1
    return min(q * align, original)


def _split_seconds(cal: BenchCalibration, queries: list[Any]) -> list[float | None]:
    """The calibration's seconds for ``queries`` (one operator, phase and dtype: the shrunk
    shapes of one call), None where no calibrated model answers: in one batch through the
    first model that supports them (a tree model's predict over many rows costs about what one
    row does: :func:`carried_time` asks 20 shapes per call), else one by one."""
    import numpy as np

    from trainsim.errors import NotCalibratedError
    from trainsim.kernels import predict_query

    if not queries:
        return []
    model = next((m for m in cal.models if m.supports(queries[0])), None)
    names = tuple(queries[0].inputs)
    many = getattr(model, "predict_many", None)
    if many is not None and all(q.key == queries[0].key and tuple(q.inputs) == names for q in queries):
        t, prov = many(queries[0], {k: np.array([q.inputs[k] for q in queries], dtype=float) for k in names})
        if prov.startswith("calibrated:"):
            return [float(x) for x in np.ravel(t)]
    out: list[float | None] = []
    for q in queries:
        try:
            p = predict_query(q, cal.device, models=cal.models)
        except NotCalibratedError:
            out.append(None)
            continue
        out.append(p.duration_s if p.calibrated else None)
    return out


def carried_time(cal: BenchCalibration, op: str, phase: str, dtype: str, inputs: dict[str, float], *,
                 roofline: tuple[Any, ...]) -> tuple[float, str] | None:  # fmt: skip
    """The calibration's answer for bench operator ``op`` on ``inputs`` (seconds, provenance),
    carried along the roofline beyond the measured work (see the module), or None when the
    calibration has no model for it. ``roofline``: a :class:`~trainsim.kernels.roofline.RooflineModel`
    of the calibration's device, in a tuple. Answers are kept on ``cal`` (the same call is
    asked by many plans) for the spec-based roofline of ``cal.device`` alone: a calibrated one
    (its efficiency curves bend the carry) or another device's is computed each time."""
    from trainsim.kernels.roofline import RooflineModel

    r = roofline[0] if len(roofline) == 1 else None
    if type(r) is not RooflineModel or r.calibrated or r.spec is not cal.device:  # not the memo's roofline
        return _carried_time(cal, op, phase, dtype, inputs, roofline=roofline)
    key = (op, phase, dtype, tuple(sorted(inputs.items())))
    if key in cal._carried:
        return cal._carried[key]
    if len(cal._carried) >= _CARRIED_KEPT:
        cal._carried.clear()
    got = _carried_time(cal, op, phase, dtype, inputs, roofline=roofline)
    cal._carried[key] = got
    return got


def _carried_time(cal: BenchCalibration, op: str, phase: str, dtype: str, inputs: dict[str, float], *,
                  roofline: tuple[Any, ...]) -> tuple[float, str] | None:  # fmt: skip
    from trainsim.errors import NotCalibratedError
    from trainsim.kernels import predict_query, query
    from trainsim.kernels.roofline import MIN_KERNEL_S

    try:
        q = query(op, phase=phase, dtype=dtype, **inputs)  # type: ignore[arg-type]
        p = predict_query(q, cal.device, models=cal.models)
        roof = predict_query(q, cal.device, models=roofline).duration_s
    except NotCalibratedError:
        return None
    if not p.calibrated:
        return None
    seconds, prov = p.duration_s, p.provenance
    limit = cal.work_threshold(q.key.op, q.key.phase.value, q.key.dtype)
    dims = _WORK_DIMS.get(op, ())
    if limit is not None and dims and roof > limit and roof > MIN_KERNEL_S:
        top = cal.measured_range(q.key.op, q.key.phase.value, q.key.dtype)

        def shrunk(target: float) -> tuple[Any, float]:
            """The query with its work sizes shrunk in turn until its roofline time is
            ``target``, and that roofline time. First pass: only the sizes beyond the sweep,
            towards its largest measured value, so the shape is asked where it was measured (a
            FlashAttention of 32k tokens shrunk in heads alone had been asked at one or two
            heads and 32k tokens, flat there in the trees, and ran at 0.8x the efficiency of
            16k tokens: context parallelism came out superlinear); then any size."""
            small, at_roof, qs = dict(inputs), roof, q
            for beyond_sweep in (True, False):
                for dim, power in dims:
                    if at_roof <= target * (1 + 1e-9) or dim not in small:
                        continue
                    floor = top.get(dim, (0.0, math.inf))[1] if beyond_sweep else 1.0
                    if beyond_sweep and small[dim] <= floor:
                        continue  # measured at this size already
                    small[dim] = max(floor, small[dim] * (target / at_roof) ** (1 / power))
                    if op == "gemm" and dim in ("m", "n", "k"):  # keep the size's alignment: the GPU models read it
                        small[dim] = _aligned_like(small[dim], inputs[dim])
                    qs = query(op, phase=phase, dtype=dtype, **small)  # type: ignore[arg-type]
                    at_roof = predict_query(qs, cal.device, models=roofline).duration_s
            return qs, at_roof

        # Asked at the limit's work (as before), then at no lower efficiency than the trees give
        # the shape at 1/2 to 1/16 of it (_SPLITS octaves, half-octave steps): one call never
        # takes longer than calls of a smaller share it could be split into (the carry at the
        # limit alone had run an element-wise pass over 8x the bytes below the bandwidth the
        # trees give 1x, and a GEMM over 32k rows below the efficiency of 4k rows), nor less
        # than the call at the limit. The steps hang off the limit, so beyond it the time is
        # linear in the work, and the call's own 2^j halvings there are asked too, so it never
        # takes longer than 2^j calls of 1/2^j; where one of those beats every step, the time
        # can fall by a fraction of a per cent as the work grows (tree steps; <0.5 % on the
        # sweeps of scripts/bench_monotone.py).
        qs, at_roof = shrunk(limit)
        at = predict_query(qs, cal.device, models=cal.models)
        per_roof, prov, floor = at.duration_s / at_roof, at.provenance, at.duration_s
        first = max(1, math.ceil(math.log2(roof / limit) - 1e-9))  # the call's own halvings within the limit
        targets = [limit / 2.0 ** (i / 2) for i in range(1, 2 * _SPLITS + 1)]
        splits = [shrunk(target) for target in targets + [roof / 2.0**j for j in range(first, first + _SPLITS)]]
        best = -1
        for i, seconds_i in enumerate(_split_seconds(cal, [qs for qs, _ in splits])):
            if seconds_i is not None and seconds_i / splits[i][1] < per_roof * (1 - 1e-9):
                per_roof, best = seconds_i / splits[i][1], i
        if best >= 0:  # the winner's own provenance (the batch says only whether any row was outside)
            qs, at_roof = splits[best]
            split = predict_query(qs, cal.device, models=cal.models)
            per_roof, prov = split.duration_s / at_roof, f"{split.provenance};as-calls-of-1/{roof / at_roof:.3g}"
        if per_roof * roof < floor:  # just past the limit: the call at the limit's time
            per_roof, prov = floor / roof, at.provenance
        seconds, prov = per_roof * roof, prov + ";beyond-measured-work"
    if roof > _dram_roof_s(cal.device):
        cap = cal.efficiency_cap(q.key.op, q.key.phase.value, q.key.dtype)
        if cap is not None and seconds < roof / cap:
            seconds, prov = roof / cap, prov + ";at-best-measured-bandwidth"
    return seconds, prov


class BenchTranslator:
    """Answers paper-001 queries on one device from its bench calibration (see the module)."""

    def __init__(self, calibration: BenchCalibration) -> None:
        from trainsim.kernels.roofline import RooflineModel

        self.cal = calibration
        self._roofline = (RooflineModel(calibration.device),)

    def time(self, op: str, phase: str, dtype: str, inputs: dict[str, float]) -> tuple[float, str] | None:
        """Seconds and provenance, or None when the operator has no bench counterpart or the
        calibration has no model for it; beyond the measured work, carried (see the module)."""
        tr = translate(op, phase, inputs)
        if tr is None:
            return None
        dt, note = ("bf16", ";as-bf16") if dtype == "fp16" else (dtype, "")
        got = carried_time(self.cal, tr.op, tr.phase, dt, tr.inputs, roofline=self._roofline)
        if got is None:
            return None
        return got[0] * tr.scale, f"{got[1]};bench-as:{op}{tr.note}{note}"


class CarriedTimer:
    """A resize timer (``timer(op, phase, dtype, **inputs)``, :mod:`trainsim.sim.resize`) that
    answers a bench operator from ``calibration`` with the carry beyond the measured work, and
    everything else from ``fallback`` (a :class:`trainsim.builders.dlrm.Coster`'s ``time``): the
    fitted trees are flat past the largest measured call, so without the carry a call four times
    the size of any measured one (LLaMA's loss at micro-batch 16) grows by a fraction of its
    work."""

    def __init__(self, calibration: BenchCalibration, fallback: Any) -> None:
        from trainsim.kernels.roofline import RooflineModel

        self.cal, self.fallback = calibration, fallback
        self._roofline = (RooflineModel(calibration.device),)

    def time(self, op: str, phase: str, dtype: str, **inputs: float) -> tuple[float, str]:
        if op in _WORK_DIMS:
            got = carried_time(self.cal, op, phase, dtype, dict(inputs), roofline=self._roofline)
            if got is not None:
                return got
        result: tuple[float, str] = self.fallback(op, phase, dtype, **inputs)
        return result


__all__ = ["BenchCalibration", "BenchTranslator", "CarriedTimer", "Translation", "bench_calibration", "carried_time",
           "compute_thresholds", "thresholds_path", "translate", "write_thresholds"]  # fmt: skip


if __name__ == "__main__":  # python -m trainsim.builders.bench_costs SAMPLE...: ship the thresholds
    import sys

    for name in sys.argv[1:]:
        print(write_thresholds(name))
