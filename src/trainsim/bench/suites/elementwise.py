"""Element-wise suite: ``gelu``, ``relu``, ``tanh``, ``add``, ``mul`` and ``dropout`` (p = 0.1).

Parameters: ``n`` elements (one contiguous tensor; binary ops take two); ``gelu`` runs on
``rows`` × ``cols`` activations (kernel-model operator ``gelu``: 001's ``(mp, b, l, dim)`` with
``cols = 4·dim``). Kernel-model operators: ``add`` and ``mul`` → ``elementwise`` (two inputs,
one output), the others their own. Approximation: FLOPs per element are nominal (relu/add/mul
1, dropout 2, tanh 10, gelu (erf) 14) — these kernels are memory-bound; bytes count every input
read and output written once (dropout also writes its one-byte mask). ``add`` has no backward
kernel (autograd passes the gradient through), so it is swept forward only.
"""

from __future__ import annotations

from collections.abc import Iterator
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

NAME = "elementwise"
# op: (FLOPs per element, tensors read+written forward, backward, extra bytes per element)
_OPS: dict[str, tuple[int, int, int, int]] = {
    "gelu": (14, 2, 3, 0),
    "relu": (1, 2, 3, 0),
    "tanh": (10, 2, 3, 0),
    "add": (1, 3, 0, 0),
    "mul": (1, 3, 6, 0),
    "dropout": (2, 2, 2, 1),
}
_MODEL_OP = {"add": "elementwise", "mul": "elementwise"}


def _numel(p: Params) -> int:
    return p["rows"] * p["cols"] if "rows" in p else p["n"]


def _shape(p: Params) -> tuple[int, ...]:
    return (p["rows"], p["cols"]) if "rows" in p else (p["n"],)


def _features(op: str, p: Params) -> dict[str, float]:
    if op == "gelu":
        return {"mp": 1, "b": 1, "l": p["rows"], "dim": p["cols"] / 4}
    return {"numel": p["n"]}


def _cost(op: str, phase: Phase, p: Params, dtype: str) -> Cost:
    flops, fwd, bwd, extra = _OPS[op]
    n, es = _numel(p), DTYPE_BYTES[dtype]
    tensors = fwd if phase is Phase.FWD else bwd
    return Cost(flops=float(flops * n), bytes=float(n * (tensors * es + extra)))


def _forward(op: str) -> Any:
    import torch
    import torch.nn.functional as nnf

    return {
        "gelu": nnf.gelu, "relu": nnf.relu, "tanh": torch.tanh, "add": torch.add, "mul": torch.mul,
        "dropout": lambda x: nnf.dropout(x, 0.1, training=True),
    }[op]  # fmt: skip


def _build(op: str, phase: Phase, dtype: str, p: Params, device: Any) -> Timed:
    arity = 2 if op in ("add", "mul") else 1
    inputs = [
        randn(_shape(p), dtype=dtype, device=device, grad=phase is Phase.BWD) for _ in range(arity)
    ]
    return autograd_call(phase, _forward(op), inputs)


def _op(op: str, hi: int) -> OpSweep:
    dims: dict[str, Any] = {"n": LogRange(256, hi)}
    if op == "gelu":  # transformer MLP activations: tokens x 4·hidden
        dims = {"rows": LogRange(1, 1 << 16, align=1), "cols": LogRange(32, 1 << 16)}
    return OpSweep(
        op=op, model_op=_MODEL_OP.get(op, op), family=KernelFamily.ELEMENTWISE, dims=dims,
        quick_cases=16, phases=(Phase.FWD,) if op == "add" else (Phase.FWD, Phase.BWD),
        valid=lambda p: _numel(p) <= hi, features=lambda p: _features(op, p),
        cost=lambda phase, p, dtype: _cost(op, phase, p, dtype),
        shapes=lambda p: [_shape(p)] * (2 if op in ("add", "mul") else 1),
        build=lambda phase, dtype, p, device: _build(op, phase, dtype, p, device),
    )  # fmt: skip


def cases(spec: SweepSpec) -> Iterator[Case]:
    hi = 1 << 30 if spec.cuda else 1 << 26
    return expand(NAME, [_op(op, hi) for op in _OPS], spec)


SUITE = Suite(NAME, "gelu, relu, tanh, add, mul, dropout; forward and backward", cases)
