"""Element-wise suite: ``gelu``, ``relu``, ``tanh``, ``add``, ``mul`` and ``dropout`` (p = 0.1).

Parameter: ``n`` elements (one contiguous tensor; binary ops take two). Approximation: FLOPs per
element are nominal (relu/add/mul 1, dropout 2, tanh 10, gelu (erf) 14) — these kernels are
memory-bound; bytes count every input read and output written once (dropout also writes its
one-byte mask). ``add`` has no backward kernel (autograd passes the gradient through), so it is
swept forward only.
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


def _cost(op: str, phase: Phase, p: Params, dtype: str) -> Cost:
    flops, fwd, bwd, extra = _OPS[op]
    n, es = p["n"], DTYPE_BYTES[dtype]
    tensors = fwd if phase is Phase.FWD else bwd
    return Cost(flops=float(flops * n), bytes=float(n * (tensors * es + extra)))


def _forward(op: str) -> Any:
    import torch
    import torch.nn.functional as F

    return {
        "gelu": F.gelu, "relu": F.relu, "tanh": torch.tanh, "add": torch.add, "mul": torch.mul,
        "dropout": lambda x: F.dropout(x, 0.1, training=True),
    }[op]  # fmt: skip


def _build(op: str, phase: Phase, dtype: str, p: Params, device: Any) -> Timed:
    arity = 2 if op in ("add", "mul") else 1
    inputs = [randn((p["n"],), dtype=dtype, device=device, grad=phase is Phase.BWD) for _ in range(arity)]
    return autograd_call(phase, _forward(op), inputs)


def _op(op: str, hi: int) -> OpSweep:
    return OpSweep(
        op=op, family=KernelFamily.ELEMENTWISE, dims={"n": LogRange(256, hi)}, quick_cases=16,
        phases=(Phase.FWD,) if op == "add" else (Phase.FWD, Phase.BWD),
        cost=lambda phase, p, dtype: _cost(op, phase, p, dtype),
        shapes=lambda p: [(p["n"],)] * (2 if op in ("add", "mul") else 1),
        build=lambda phase, dtype, p, device: _build(op, phase, dtype, p, device),
    )  # fmt: skip


def cases(spec: SweepSpec) -> Iterator[Case]:
    hi = 1 << 30 if spec.cuda else 1 << 26
    return expand(NAME, [_op(op, hi) for op in _OPS], spec)


SUITE = Suite(NAME, "gelu, relu, tanh, add, mul, dropout; forward and backward", cases)
