"""GEMM suite: ``mm``, ``addmm``, ``bmm`` and ``linear``, forward and backward.

Parameters: ``m``, ``n``, ``k`` (``C[m, n] = A[m, k] · B[k, n]``) and ``b`` (bmm batch). Every
call calibrates the kernel-model operator ``gemm`` (``batch, m, n, k``). On CUDA one more sweep,
``linear_tokens``, is ``linear`` with ``m`` the token rows of a transformer micro-batch (8,192 to
131,072, beyond the other sweeps' 16,384): an LLM's projections and, in their backward, the
weight-gradient GEMMs that reduce over those rows (docs/gpu.md).
Approximation: FLOPs count the multiply-adds (2·m·n·k per product; backward computes dA and dB,
twice that) plus the bias add/reduction; bytes count each operand read once and each result
written once (no cache reuse, no workspace).
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
from trainsim.kernels.features import GEMM_VARIANT

NAME = "gemm"


def _shapes(op: str, p: Params) -> list[tuple[int, ...]]:
    m, n, k = p["m"], p["n"], p["k"]
    if op == "bmm":
        return [(p["b"], m, k), (p["b"], k, n)]
    if op in ("linear", "linear_tokens"):
        return [(m, k), (n, k), (n,)]
    if op == "addmm":
        return [(n,), (m, k), (k, n)]
    return [(m, k), (k, n)]


def _cost(op: str, phase: Phase, p: Params, dtype: str) -> Cost:
    es = DTYPE_BYTES[dtype]
    b, m, n, k = p.get("b", 1), p["m"], p["n"], p["k"]
    bias = n if op in ("addmm", "linear", "linear_tokens") else 0
    times = 1 if phase is Phase.FWD else 2
    return Cost(
        flops=times * 2.0 * b * m * n * k + (m * bias),
        bytes=times * es * (b * (m * k + k * n + m * n) + bias),
    )


def _build(op: str, phase: Phase, dtype: str, p: Params, device: Any) -> Timed:
    import torch
    import torch.nn.functional as nnf

    forward: dict[str, Any] = {
        "mm": torch.mm,
        "addmm": torch.addmm,
        "bmm": torch.bmm,
        "linear": nnf.linear,
        "linear_tokens": nnf.linear,
    }
    grad = phase is Phase.BWD
    inputs = [randn(s, dtype=dtype, device=device, grad=grad) for s in _shapes(op, p)]
    return autograd_call(phase, forward[op], inputs)


def _op(op: str, hi: int) -> OpSweep:
    dims: dict[str, Any] = {"m": LogRange(8, hi), "n": LogRange(8, hi), "k": LogRange(8, hi)}
    if op == "bmm":
        dims["b"] = LogRange(1, 512, align=1)
    if op == "linear_tokens":
        dims = {"m": LogRange(8192, 131072), "n": LogRange(256, hi), "k": LogRange(256, hi)}
    return OpSweep(
        op=op, model_op="gemm", family=KernelFamily.GEMM, dims=dims, quick_cases=8 if op == "linear_tokens" else 24,
        features=lambda p: {"batch": p.get("b", 1), "m": p["m"], "n": p["n"], "k": p["k"], **GEMM_VARIANT[op]},
        cost=lambda phase, p, dtype: _cost(op, phase, p, dtype),
        shapes=lambda p: _shapes(op, p),
        build=lambda phase, dtype, p, device: _build(op, phase, dtype, p, device),
    )  # fmt: skip


def cases(spec: SweepSpec) -> Iterator[Case]:
    hi = 16384 if spec.cuda else 4096
    ops = ("mm", "addmm", "bmm", "linear", *(("linear_tokens",) if spec.cuda else ()))
    return expand(NAME, [_op(op, hi) for op in ops], spec)


SUITE = Suite(NAME, "mm, addmm, bmm, linear; forward and backward", cases)
