"""Paper 001's transformer operators timed by a GPU's own ``trainsim bench`` calibration.

Paper 001 benchmarks its operators (Table I) per GPU; where a device has no such data (an H100,
say) the LLM builder used to borrow a sibling's (the GH200's, bf16/fp16 only) or fall back to
the roofline. trainsim ships its own CUDA calibration samples (``bench/data/cuda_full_*``: every
kernel suite measured on one GPU, bf16 and fp32, fitted per operator), and those operators are
the torch calls a transformer layer is made of. :class:`BenchTranslator` answers a paper-001
query from them by writing the operator as the call(s) it runs:

=============================  ==========================================================
001 operator (inputs)          bench operator (inputs); ``t = b·l`` tokens, ``p = mp``
=============================  ==========================================================
linear1 (QKV)                  gemm ``m=t, k=dim, n=3·dim/p``, bias, weight ``[n, k]``
linear2 (attention output)     gemm ``m=t, k=dim/p, n=dim``, bias, weight ``[n, k]``
linear3 / linear4 (MLP)        gemm ``k=dim, n=4·dim/p`` / ``k=4·dim/p, n=dim``, bias, ``[n, k]``
linear_final (logits)          gemm ``k=dim, n=vocab/p``, no bias, weight ``[n, k]``
baddbmm / bmm (unfused core)   gemm ``batch=b·h/p``: ``l×(dim/h)·(dim/h)×l`` / ``l×l·l×(dim/h)``
flash_atten                    attention ``batch=b, heads=h/p, seq_len=l, head_dim=dim/h``,
                               causal (see below)
softmax, fused masked softmax  softmax ``b, h/p, l`` (the ``[b, h/p, l, l]`` scores)
layernorm / RMSlayernorm       the same operator on ``t`` rows of ``dim``
gelu                           gelu on ``[t, 4·dim/p]``
res_add                        elementwise on ``t·dim`` elements (forward: a two-input add;
                               backward: autograd passes the gradient on, one multiply-sized pass)
embedding                      index_select of ``t`` rows from a ``vocab/p × dim`` table
                               (vocabulary operators without a ``vocab`` input: 001's 50,257
                               padded, the size the builder's scaling assumes)
parallel_cross_entropy_128     cross_entropy of ``t`` rows over ``vocab/p`` classes
=============================  ==========================================================

Approximations (stated, not fitted): the bench's attention is unmasked; a causal FlashAttention
kernel skips the key blocks above the diagonal, so the unmasked time is scaled by the fraction
of ``128 × 128`` blocks it computes, ``(n + 1) / 2n`` with ``n = ⌈l / 128⌉`` (1 for one block,
→ ½ for long sequences). Megatron's fused scale-mask-softmax is timed as the plain softmax of
the same tensor. fp16 queries are answered by the bf16 measurements (equal tensor-core peaks).
Operators without a bench counterpart (RoPE, fillmask, ...) are not translated: the caller's
next source answers them. Nor is 001's optimizer operator: it times Megatron's FusedAdam (one
fused pass over parameters, gradients and moments), the bench's ``adam`` row torch's
multi-kernel ``torch.optim.Adam``, a different kernel sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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
    """001's benchmarked vocabulary (GPT-2's 50,257) padded to 128·mp (001 Eq. 1–2): what its
    vocabulary operators are queried with when no vocabulary is given (the LLM builder scales
    them to the model's own vocabulary)."""
    f = 128 * mp
    return math.ceil(50257 / f) * f


def translate(op: str, phase: str, x: dict[str, float]) -> Translation | None:
    """The bench operator that times paper-001 operator ``op`` (inputs ``x``), or None."""
    p, b, seq, dim = x.get("mp", 1.0), x.get("b", 1.0), x.get("l", 1.0), x.get("dim", 0.0)
    t = b * seq
    vocab = x.get("vocab") or _seed001_vocab(p)
    if op in ("linear1", "linear2", "linear3", "linear4", "linear_final"):
        shapes = {"linear1": (dim, 3 * dim / p), "linear2": (dim / p, dim), "linear3": (dim, 4 * dim / p),
                  "linear4": (4 * dim / p, dim), "linear_final": (dim, vocab / p)}  # fmt: skip
        k, n = shapes[op]
        if k <= 0 or n <= 0:
            return None
        return Translation("gemm", phase, _gemm(t, k, n, bias=op != "linear_final"))
    h = x.get("h", 0.0)
    if op in ("baddbmm", "bmm", "flash_atten") and h <= 0:
        return None
    if op == "baddbmm":
        return Translation("gemm", phase, _gemm(seq, dim / h, seq, batch=b * h / p, bias=False, wt=False))
    if op == "bmm":
        return Translation("gemm", phase, _gemm(seq, seq, dim / h, batch=b * h / p, bias=False, wt=False))
    if op == "flash_atten":
        n = math.ceil(seq / _FLASH_BLOCK)
        return Translation("attention", phase, {"batch": b, "heads": h / p, "seq_len": seq, "head_dim": dim / h},
                           (n + 1) / (2 * n), ";causal-from-unmasked")  # fmt: skip
    if op in ("softmax", "ScaledUpperTriangMaskedSoftmax"):
        note = ";as-softmax" if op != "softmax" else ""
        return Translation("softmax", phase, {"mp": 1.0, "b": b, "h": h / p, "l": seq}, 1.0, note)
    if op in ("layernorm", "RMSlayernorm"):
        return Translation(op, phase, {"b": t, "l": 1.0, "dim": dim})
    if op == "gelu":
        return Translation("gelu", phase, {"mp": p, "b": 1.0, "l": t, "dim": dim})
    if op == "res_add":
        return Translation("elementwise", phase, {"numel": t * dim})
    if op == "embedding":
        return Translation("index_select", phase, {"rows": vocab / p, "d": dim, "k": t})
    if op == "parallel_cross_entropy_128":
        return Translation("cross_entropy", phase, {"n": t, "v": vocab / p})
    return None


@dataclass(frozen=True)
class BenchCalibration:
    """A device's shipped bench calibration: its fitted models and the measured device."""

    models: tuple[Any, ...]
    device: DeviceSpec
    note: str


@cache
def _load(sample_device: str) -> BenchCalibration | None:
    from trainsim.bench.opspecs import register_bench_ops
    from trainsim.hardware import get_device
    from trainsim.kernels import load_model
    from trainsim.validate.gpu_e2e_suite import gpu_kernel_models

    found = gpu_kernel_models(sample_device)
    if found is None:
        return None
    device_file, artifact, note = found
    if artifact is None:
        return None
    register_bench_ops()
    return BenchCalibration((load_model(Path(artifact)),), get_device(str(device_file)), note)


def bench_calibration(device: DeviceSpec) -> BenchCalibration | None:
    """The shipped bench calibration of ``device`` (matched by its name or aliases), or None."""
    from trainsim.validate.gpu_e2e_suite import CUDA_SAMPLES

    for name in (device.name, *device.aliases):
        if name in CUDA_SAMPLES:
            return _load(name)
    return None


class BenchTranslator:
    """Answers paper-001 queries on one device from its bench calibration (see the module)."""

    def __init__(self, calibration: BenchCalibration) -> None:
        self.cal = calibration

    def time(self, op: str, phase: str, dtype: str, inputs: dict[str, float]) -> tuple[float, str] | None:
        """Seconds and provenance, or None when the operator has no bench counterpart or the
        calibration has no fitted model for it (then the caller's next source answers)."""
        from trainsim.errors import NotCalibratedError
        from trainsim.kernels import predict_query, query

        tr = translate(op, phase, inputs)
        if tr is None:
            return None
        dt, note = (("bf16", ";as-bf16") if dtype == "fp16" else (dtype, ""))
        try:
            q = query(tr.op, phase=tr.phase, dtype=dt, **tr.inputs)  # type: ignore[arg-type]
            p = predict_query(q, self.cal.device, models=self.cal.models)
        except NotCalibratedError:
            return None
        if not p.calibrated:
            return None
        return p.duration_s * tr.scale, f"{p.provenance};bench-as:{op}{tr.note}{note}"


__all__ = ["BenchCalibration", "BenchTranslator", "Translation", "bench_calibration", "translate"]
