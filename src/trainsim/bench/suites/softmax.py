"""Softmax suite: ``softmax`` over the last dimension and ``cross_entropy`` (logits × classes).

Parameters: softmax over the last axis of attention scores ``(b, h, l, l)`` (kernel-model
operator ``softmax`` with ``mp = 1``); cross-entropy ``n`` samples × ``v`` classes (int64
targets, mean reduction). Approximation: softmax ≈ 5 FLOPs per element forward (max, subtract,
exp, sum, divide) and 4 backward, bytes one read and one write (backward: y and dy read, dx
written); cross-entropy ≈ log-softmax plus the gather, with the logits read and written once
forward and twice backward.
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

NAME = "softmax"


def _softmax_cost(phase: Phase, p: Params, dtype: str) -> Cost:
    numel = p["b"] * p["h"] * p["l"] ** 2
    es = DTYPE_BYTES[dtype]
    if phase is Phase.FWD:
        return Cost(flops=5.0 * numel, bytes=2.0 * es * numel)
    return Cost(flops=4.0 * numel, bytes=3.0 * es * numel)


def _softmax(phase: Phase, dtype: str, p: Params, device: Any) -> Timed:
    x = randn((p["b"], p["h"], p["l"], p["l"]), dtype=dtype, device=device, grad=phase is Phase.BWD)
    return autograd_call(phase, lambda x: x.softmax(-1), [x])


def _ce_cost(phase: Phase, p: Params, dtype: str) -> Cost:
    numel, n = p["n"] * p["v"], p["n"]
    es = DTYPE_BYTES[dtype]
    if phase is Phase.FWD:
        return Cost(flops=5.0 * numel + 2 * n, bytes=2.0 * es * numel + 8 * n)
    return Cost(flops=3.0 * numel, bytes=4.0 * es * numel + 8 * n)


def _cross_entropy(phase: Phase, dtype: str, p: Params, device: Any) -> Timed:
    import torch
    import torch.nn.functional as nnf

    logits = randn((p["n"], p["v"]), dtype=dtype, device=device, grad=phase is Phase.BWD)
    target = torch.randint(p["v"], (p["n"],), device=device)
    return autograd_call(phase, lambda x: nnf.cross_entropy(x, target), [logits])


def cases(spec: SweepSpec) -> Iterator[Case]:
    softmax = OpSweep(
        op="softmax", model_op="softmax", family=KernelFamily.SOFTMAX, cost=_softmax_cost,
        build=_softmax, features=lambda p: {"mp": 1, "b": p["b"], "h": p["h"], "l": p["l"]},
        dims={"b": LogRange(1, 64, align=1), "h": LogRange(1, 64, align=1),
              "l": LogRange(8, 1 << 14 if spec.cuda else 4096)},
        shapes=lambda p: [(p["b"], p["h"], p["l"], p["l"])], quick_cases=24,
    )  # fmt: skip
    cross_entropy = OpSweep(
        op="cross_entropy", model_op="cross_entropy", family=KernelFamily.SOFTMAX, cost=_ce_cost,
        build=_cross_entropy, features=lambda p: {"n": p["n"], "v": p["v"]},
        dims={"n": LogRange(1, 1 << 16, align=1), "v": LogRange(2, 1 << 18, align=1)},
        shapes=lambda p: [(p["n"], p["v"]), (p["n"],)], quick_cases=20,
    )  # fmt: skip
    return expand(NAME, [softmax, cross_entropy], spec)


SUITE = Suite(NAME, "softmax, cross_entropy; forward and backward", cases)
