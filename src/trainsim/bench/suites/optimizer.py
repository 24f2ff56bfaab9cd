"""Optimizer suite: one ``step()`` of ``adam`` and ``sgd`` (momentum 0.9) over a list of tensors.

Parameters: ``numel`` parameters in total, split evenly over ``tensors`` tensors (float32, with
gradients set; torch's default implementation for the device: for-each on CUDA). Approximation:
bytes count what the update reads and writes (Adam: p, g, m, v read, p, m, v written — 7 per
parameter; SGD: p, g, buf read, p, buf written — 5); FLOPs are nominal (Adam 12, SGD 3 per
parameter). The first step (state allocation) is part of the warm-up.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from trainsim.bench.suites.base import (
    Case,
    Cost,
    LogRange,
    OpSweep,
    Params,
    Phase,
    Suite,
    SweepSpec,
    Timed,
    expand,
)
from trainsim.ir.kinds import KernelFamily

NAME = "optimizer"
# optimizer: (tensors read+written per parameter, FLOPs per parameter, state tensors, slowdown)
# Slowdown: the for-loop Adam of torch on CPU makes about ten passes over its tensors.
_OPS = {"adam": (7, 12, 2, 8.0), "sgd": (5, 3, 1, 2.0)}


def _cost(op: str, p: Params) -> Cost:
    moved, flops, state, _ = _OPS[op]
    n = p["numel"]
    return Cost(flops=float(flops * n), bytes=4.0 * moved * n, alloc_bytes=4.0 * (2 + state) * n)


def _build(op: str, p: Params, device: Any) -> Timed:
    import torch

    per = p["numel"] // p["tensors"]
    params = []
    for _ in range(p["tensors"]):
        t = torch.randn(per, device=device, requires_grad=True)
        t.grad = torch.randn(per, device=device) * 1e-3
        params.append(t)
    opt = (torch.optim.Adam(params, lr=1e-4) if op == "adam"
           else torch.optim.SGD(params, lr=1e-4, momentum=0.9))  # fmt: skip
    return opt.step


def _op(op: str, hi: int) -> OpSweep:
    return OpSweep(
        op=op, model_op=op, family=KernelFamily.OPTIMIZER, phases=(Phase.STEP,), dtypes=("float32",),
        features=lambda p: {"params": p["numel"], "tensors": p["tensors"]},
        dims={"numel": LogRange(1 << 12, hi), "tensors": LogRange(1, 512, align=1)},
        valid=lambda p: p["numel"] >= 8 * p["tensors"], quick_cases=20, slowdown=_OPS[op][3],
        cost=lambda phase, p, dtype: _cost(op, p),
        shapes=lambda p: [(p["numel"] // p["tensors"],)],  # one of the tensors
        build=lambda phase, dtype, p, device: _build(op, p, device),
    )  # fmt: skip


def cases(spec: SweepSpec) -> Iterator[Case]:
    hi = 1 << 30 if spec.cuda else 1 << 26
    return expand(NAME, [_op(op, hi) for op in _OPS], spec)


SUITE = Suite(NAME, "Adam and SGD steps over many parameter tensors", cases)
