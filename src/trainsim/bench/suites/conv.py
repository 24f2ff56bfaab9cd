"""Convolution suite: ``conv2d`` (NCHW, square images and filters, "same" padding), forward and
backward.

Parameters: batch ``n``, input channels ``c``, output channels ``k``, image side ``hw``, filter
side ``r`` (1, 3, 5, 7) and ``stride`` (1, 2). Approximation: FLOPs are 2·n·k·c·r²·ho² (direct
convolution; backward computes the input and weight gradients, twice that); bytes count input,
weights and output once (backward twice), not im2col or workspace buffers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from trainsim.bench.suites.base import (
    DTYPE_BYTES,
    Case,
    Choice,
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

NAME = "conv"


def out_side(p: Params) -> int:
    r = p["r"]
    return (p["hw"] + 2 * (r // 2) - r) // p["stride"] + 1


def _cost(phase: Phase, p: Params, dtype: str) -> Cost:
    n, c, k, hw, r, ho = p["n"], p["c"], p["k"], p["hw"], p["r"], out_side(p)
    times = 1 if phase is Phase.FWD else 2
    return Cost(
        flops=times * 2.0 * n * k * c * r * r * ho * ho,
        bytes=times * DTYPE_BYTES[dtype] * (n * c * hw * hw + k * c * r * r + n * k * ho * ho),
    )


def _build(phase: Phase, dtype: str, p: Params, device: Any) -> Timed:
    import torch.nn.functional as nnf

    grad = phase is Phase.BWD
    x = randn((p["n"], p["c"], p["hw"], p["hw"]), dtype=dtype, device=device, grad=grad)
    w = randn((p["k"], p["c"], p["r"], p["r"]), dtype=dtype, device=device, grad=grad)
    pad, stride = p["r"] // 2, p["stride"]
    return autograd_call(phase, lambda x, w: nnf.conv2d(x, w, stride=stride, padding=pad), [x, w])


def cases(spec: SweepSpec) -> Iterator[Case]:
    # A full sweep draws 80x the quick one (~2,600 shapes per phase with the probes, ~16 min on
    # one core), not the default 5x: six inputs, and a CPU switches kernels by shape (torch's
    # oneDNN or native path, oneDNN's 1x1 / direct / strided kernels, channel blocking). Held-out
    # GMAE on an AMD EPYC, with the path features: 18.0 % at 5x, 9.5 % at 40x, 9.97 % at 80x
    # (other measurements; docs/benchmarks.md). A GPU runs cuDNN, not those paths: 5x there.
    conv = OpSweep(
        op="conv2d", model_op="conv2d", features=dict, family=KernelFamily.CONV, cost=_cost, build=_build,
        quick_cases=32, full_factor=5 if spec.cuda else 80,
        dims={"n": LogRange(1, 256, align=1), "c": LogRange(3, 1024), "k": LogRange(8, 1024),
              "hw": LogRange(4, 256, align=1), "r": Choice((1, 3, 5, 7)), "stride": Choice((1, 2))},
        valid=lambda p: p["hw"] >= p["r"],
        shapes=lambda p: [(p["n"], p["c"], p["hw"], p["hw"]), (p["k"], p["c"], p["r"], p["r"])],
    )  # fmt: skip
    return expand(NAME, [conv], spec)


SUITE = Suite(NAME, "conv2d; forward and backward", cases)
