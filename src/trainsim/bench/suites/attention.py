"""Attention suite: ``scaled_dot_product_attention``, forward and backward.

Parameters: batch ``b``, heads ``h``, sequence ``s``, head dim ``d``; q, k and v are
``(b, h, s, d)``, no mask (the kernel-model operator ``attention`` has no causal input yet).
Approximation: FLOPs are the two products QKᵀ and PV (4·b·h·s²·d; backward 2.5× forward, as
flash attention recomputes the scores); bytes count q, k, v and the output once (backward:
also dO, dq, dk, dv), not a materialised s×s score matrix.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from trainsim.bench.suites.base import (
    DTYPE_BYTES,
    Case,
    Choice,
    Cost,
    Dim,
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

NAME = "attention"


def _cost(phase: Phase, p: Params, dtype: str) -> Cost:
    es = DTYPE_BYTES[dtype]
    b, h, s, d = p["b"], p["h"], p["s"], p["d"]
    flops = 4.0 * b * h * s * s * d
    io = b * h * s * d * es
    scores = b * h * s * s * 4  # the math fallback materialises fp32 scores: memory cap only
    if phase is Phase.FWD:
        return Cost(flops=flops, bytes=4.0 * io, alloc_bytes=4.0 * io + scores)
    return Cost(flops=2.5 * flops, bytes=8.0 * io, alloc_bytes=8.0 * io + 2 * scores)


def _build(phase: Phase, dtype: str, p: Params, device: Any) -> Timed:
    import torch.nn.functional as nnf

    shape = (p["b"], p["h"], p["s"], p["d"])
    qkv = [randn(shape, dtype=dtype, device=device, grad=phase is Phase.BWD) for _ in range(3)]
    return autograd_call(phase, nnf.scaled_dot_product_attention, qkv)


def cases(spec: SweepSpec) -> Iterator[Case]:
    dims: dict[str, Dim] = {
        "b": LogRange(1, 64, align=1), "h": LogRange(1, 64, align=1),
        "s": LogRange(16, 16384 if spec.cuda else 4096), "d": Choice((32, 64, 80, 128)),
    }  # fmt: skip
    sdpa = OpSweep(
        op="sdpa", model_op="attention", family=KernelFamily.ATTENTION, dims=dims, cost=_cost,
        build=_build, features=lambda p: {"batch": p["b"], "heads": p["h"], "seq_len": p["s"],
                                          "head_dim": p["d"]},
        shapes=lambda p: [(p["b"], p["h"], p["s"], p["d"])] * 3, quick_cases=32,
    )  # fmt: skip
    return expand(NAME, [sdpa], spec)


SUITE = Suite(NAME, "scaled_dot_product_attention; forward and backward", cases)
