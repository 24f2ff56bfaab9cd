"""Normalisation suite: ``layer_norm``, ``rms_norm`` (rows × d) and ``batch_norm`` (NCHW, training).

Parameters: ``n`` rows and ``d`` features (kernel-model operators ``layernorm`` and
``RMSlayernorm`` with ``b = n, l = 1, dim = d``); batch norm ``n``, ``c``, ``hw`` (square images).
Approximation: FLOPs ≈ 8 per element for layer/batch norm (mean, variance, normalise, affine)
and 5 for RMS norm, backward twice that; bytes count the input read and output written once
(backward: dy and x read, dx written) plus the affine parameters.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from trainsim.bench.suites.base import (
    DTYPE_BYTES,
    Case,
    Cost,
    LogRange,
    OpSweep,
    Params,
    Phase,
    Suite,
    SweepSpec,
    Timed,
    autograd_call,
    expand,
    randn,
)
from trainsim.ir.kinds import KernelFamily

NAME = "norm"
_FLOPS_PER_ELEM = {"layer_norm": 8, "rms_norm": 5, "batch_norm": 8}


def _numel_and_params(op: str, p: Params) -> tuple[int, int]:
    if op == "batch_norm":
        return p["n"] * p["c"] * p["hw"] ** 2, 2 * p["c"]
    return p["n"] * p["d"], (p["d"] if op == "rms_norm" else 2 * p["d"])


def _shapes(op: str, p: Params) -> list[tuple[int, ...]]:
    if op == "batch_norm":
        return [(p["n"], p["c"], p["hw"], p["hw"]), (p["c"],), (p["c"],)]
    return [(p["n"], p["d"]), (p["d"],)] + ([(p["d"],)] if op == "layer_norm" else [])


def _cost(op: str, phase: Phase, p: Params, dtype: str) -> Cost:
    es = DTYPE_BYTES[dtype]
    numel, nparams = _numel_and_params(op, p)
    if phase is Phase.FWD:
        return Cost(flops=_FLOPS_PER_ELEM[op] * numel, bytes=es * (2 * numel + nparams))
    return Cost(flops=2 * _FLOPS_PER_ELEM[op] * numel, bytes=es * (3 * numel + 2 * nparams))


def _build(op: str, phase: Phase, dtype: str, p: Params, device: Any) -> Timed:
    import torch
    import torch.nn.functional as nnf

    grad = phase is Phase.BWD
    x, *affine = (randn(s, dtype=dtype, device=device, grad=grad) for s in _shapes(op, p))
    if op == "layer_norm":
        return autograd_call(
            phase, lambda x, w, b: nnf.layer_norm(x, (p["d"],), w, b), [x, *affine]
        )
    if op == "rms_norm":
        return autograd_call(phase, lambda x, w: nnf.rms_norm(x, (p["d"],), w), [x, *affine])
    mean = torch.zeros(p["c"], dtype=x.dtype, device=device)
    var = torch.ones(p["c"], dtype=x.dtype, device=device)
    return autograd_call(
        phase, lambda x, w, b: nnf.batch_norm(x, mean, var, w, b, training=True), [x, *affine]
    )


_MODEL_OP = {"layer_norm": "layernorm", "rms_norm": "RMSlayernorm", "batch_norm": "batch_norm"}


def _features(op: str, p: Params) -> dict[str, float]:
    if op == "batch_norm":
        return {"n": p["n"], "c": p["c"], "hw": p["hw"]}
    return {"b": p["n"], "l": 1, "dim": p["d"]}  # 001's (b, l, dim) with all rows in b


def _op(op: str, dims: dict[str, Any]) -> OpSweep:
    return OpSweep(
        op=op, model_op=_MODEL_OP[op], family=KernelFamily.NORM, dims=dims, quick_cases=20,
        features=lambda p: _features(op, p),
        cost=lambda phase, p, dtype: _cost(op, phase, p, dtype),
        shapes=lambda p: _shapes(op, p),
        build=lambda phase, dtype, p, device: _build(op, phase, dtype, p, device),
    )  # fmt: skip


def cases(spec: SweepSpec) -> Iterator[Case]:
    rows = {"n": LogRange(1, 1 << 17, align=1), "d": LogRange(32, 16384)}
    images = {
        "n": LogRange(1, 256, align=1),
        "c": LogRange(3, 1024),
        "hw": LogRange(1, 224, align=1),
    }
    # training-mode batch norm needs more than one value per channel
    batch_norm = replace(_op("batch_norm", images), valid=lambda p: p["n"] * p["hw"] ** 2 > 1)
    ops = [_op("layer_norm", rows), _op("rms_norm", rows), batch_norm]
    return expand(NAME, ops, spec)


SUITE = Suite(NAME, "layer_norm, rms_norm, batch_norm (training); forward and backward", cases)
