"""GEMM suite: ``mm``, ``addmm``, ``bmm`` and ``linear``, forward and backward.

Parameters: ``m``, ``n``, ``k`` (``C[m, n] = A[m, k] · B[k, n]``) and ``b`` (bmm batch). Every
call calibrates the kernel-model operator ``gemm`` (``batch, m, n, k``). On CUDA one more sweep,
``linear_tokens``, is ``linear`` with ``m`` the token rows of a transformer micro-batch (8,192 to
131,072, beyond the other sweeps' 16,384): an LLM's projections and, in their backward, the
weight-gradient GEMMs that reduce over those rows (docs/gpu.md). Two more CUDA sweeps, bf16 only,
cover the aligned shapes real models run, which the draws (multiples of 8) rarely hit and cuBLAS
runs faster: ``linear_aligned`` draws ``m`` in multiples of 1,024 and ``n``, ``k`` in multiples
of 128 (half of them multiples of 256, a quarter of 512, ...); ``linear_llm`` takes the token
counts and widths of published LLMs (:data:`LLM_WIDTHS`, with their tensor-parallel slices),
without a bias, as LLaMA's projections run.
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
from trainsim.kernels.features import GEMM_VARIANT

NAME = "gemm"
_LINEAR = ("linear", "linear_tokens", "linear_aligned", "linear_llm")
# hidden, MLP, fused-QKV and vocabulary widths of GPT-2/3, LLaMA-1/2/3, Mistral and NeoX models
_LLM_BASE = (768, 1024, 1280, 1536, 2048, 2560, 3072, 4096, 5120, 6144, 8192, 11008, 12288, 13824, 14336,
             16384, 20480, 24576, 28672, 32000, 49152, 50304)  # fmt: skip
# ... and their tensor-parallel slices (2, 4, 8 ways) of at least 256
LLM_WIDTHS = tuple(sorted({w // t for w in _LLM_BASE for t in (1, 2, 4, 8) if w % t == 0 and w // t >= 256}))
LLM_TOKENS = tuple(2**i for i in range(10, 18))  # micro-batch x sequence: 1,024 to 131,072


def _shapes(op: str, p: Params) -> list[tuple[int, ...]]:
    m, n, k = p["m"], p["n"], p["k"]
    if op == "bmm":
        return [(p["b"], m, k), (p["b"], k, n)]
    if op == "linear_llm":
        return [(m, k), (n, k)]
    if op in _LINEAR:
        return [(m, k), (n, k), (n,)]
    if op == "addmm":
        return [(n,), (m, k), (k, n)]
    return [(m, k), (k, n)]


def _cost(op: str, phase: Phase, p: Params, dtype: str) -> Cost:
    es = DTYPE_BYTES[dtype]
    b, m, n, k = p.get("b", 1), p["m"], p["n"], p["k"]
    bias = n if op == "addmm" or (op in _LINEAR and op != "linear_llm") else 0
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
        **dict.fromkeys(_LINEAR, nnf.linear),
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
    if op == "linear_aligned":
        dims = {"m": LogRange(1024, 131072, align=1024), "n": LogRange(128, 65536, align=128),
                "k": LogRange(128, 65536, align=128)}  # fmt: skip
    if op == "linear_llm":
        dims = {"m": Choice(LLM_TOKENS), "n": Choice(LLM_WIDTHS), "k": Choice(LLM_WIDTHS)}
    new = op in ("linear_aligned", "linear_llm")
    return OpSweep(
        op=op, model_op="gemm", family=KernelFamily.GEMM, dims=dims, quick_cases=24 if op in ("mm", "addmm", "bmm", "linear") else 8,
        # below 1: these aligned bf16 shapes run near the peak, ~3x the budget's conservative
        # speed, so cases up to ~3x the usual estimate still take ~the usual time
        dtypes=("bfloat16",) if new else None, slowdown=0.35 if new else 1.0,
        features=lambda p: {"batch": p.get("b", 1), "m": p["m"], "n": p["n"], "k": p["k"], **GEMM_VARIANT[op]},
        cost=lambda phase, p, dtype: _cost(op, phase, p, dtype),
        shapes=lambda p: _shapes(op, p),
        build=lambda phase, dtype, p, device: _build(op, phase, dtype, p, device),
    )  # fmt: skip


def cases(spec: SweepSpec) -> Iterator[Case]:
    hi = 16384 if spec.cuda else 4096
    ops = ("mm", "addmm", "bmm", "linear", *(("linear_tokens", "linear_aligned", "linear_llm") if spec.cuda else ()))
    return expand(NAME, [_op(op, hi) for op in ops], spec)


SUITE = Suite(NAME, "mm, addmm, bmm, linear; forward and backward", cases)
