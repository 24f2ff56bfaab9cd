"""Memory suite: ``copy`` (same-device ``copy_``), ``concat`` and ``transpose``; on CUDA also
``h2d`` and ``d2h`` (pinned host memory, non-blocking).

Parameters: copy ``n`` float32 elements (kernel-model operator ``memcpy`` with ``bytes``);
concat ``parts`` tensors of ``rows`` × ``cols`` joined along the columns (DLRM's feature concat;
joining along rows is a plain copy); transpose ``b`` × ``m`` × ``n`` → swap of the last two axes
made contiguous (the only permutation DLRM has, 002 §4.3.2). Bytes: every element read once and
written once; no FLOPs. Forward only: their backward is the same kind of copy.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
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
    expand,
    randn,
)
from trainsim.ir.kinds import KernelFamily

NAME = "memory"
_FWD = (Phase.FWD,)


def _numel(op: str, p: Params) -> int:
    if op == "concat":
        return p["parts"] * p["rows"] * p["cols"]
    if op == "transpose":
        return p["b"] * p["m"] * p["n"]
    return p["n"]


def _shapes(op: str, p: Params) -> list[tuple[int, ...]]:
    if op == "concat":
        return [(p["rows"], p["cols"])] * p["parts"]
    if op == "transpose":
        return [(p["b"], p["m"], p["n"])]
    return [(p["n"],)]


def _cost(op: str, p: Params, dtype: str) -> Cost:
    return Cost(flops=0.0, bytes=2.0 * DTYPE_BYTES[dtype] * _numel(op, p))


def _copy(phase: Phase, dtype: str, p: Params, device: Any) -> Timed:
    src = randn((p["n"],), dtype=dtype, device=device)
    dst = src.clone()
    return lambda: dst.copy_(src)


def _host_copy(to_device: bool, phase: Phase, dtype: str, p: Params, device: Any) -> Timed:
    host = randn((p["n"],), dtype=dtype, device="cpu").pin_memory()
    dev = randn((p["n"],), dtype=dtype, device=device)
    src, dst = (host, dev) if to_device else (dev, host)
    return lambda: dst.copy_(src, non_blocking=True)


def _concat(phase: Phase, dtype: str, p: Params, device: Any) -> Timed:
    import torch

    parts = [randn((p["rows"], p["cols"]), dtype=dtype, device=device) for _ in range(p["parts"])]
    return lambda: torch.cat(parts, dim=1)


def _transpose(phase: Phase, dtype: str, p: Params, device: Any) -> Timed:
    x = randn((p["b"], p["m"], p["n"]), dtype=dtype, device=device)
    return lambda: x.transpose(1, 2).contiguous()


def cases(spec: SweepSpec) -> Iterator[Case]:
    hi = 1 << 30 if spec.cuda else 1 << 26
    flat = {"n": LogRange(256, hi)}

    def sweep(op: str, model_op: str, family: KernelFamily, dims: dict[str, Any], *, build: Any,
              n: int) -> OpSweep:  # fmt: skip
        copy = model_op.startswith("memcpy")
        return OpSweep(
            op=op, model_op=model_op, family=family, dims=dims, phases=_FWD, quick_cases=n,
            build=build, dtypes=("float32",) if copy else None,
            features=(lambda p: {"bytes": 4 * p["n"]}) if copy else dict,
            cost=lambda phase, p, dtype: _cost(op, p, dtype), shapes=lambda p: _shapes(op, p),
        )  # fmt: skip

    ops = [
        sweep("copy", "memcpy", KernelFamily.MEMCPY, flat, build=_copy, n=20),
        sweep("concat", "concat", KernelFamily.INDEX, {
            "parts": LogRange(2, 64, align=1), "rows": LogRange(1, 1 << 16, align=1),
            "cols": LogRange(1, 4096)}, build=_concat, n=24),
        sweep("transpose", "transpose", KernelFamily.ELEMENTWISE, {
            "b": LogRange(1, 1024, align=1), "m": LogRange(8, 4096), "n": LogRange(8, 4096)},
            build=_transpose, n=24),
    ]  # fmt: skip
    if spec.cuda:
        ops += [
            sweep(
                "h2d",
                "memcpy_h2d",
                KernelFamily.MEMCPY,
                flat,
                build=partial(_host_copy, True),
                n=16,
            ),
            sweep(
                "d2h",
                "memcpy_d2h",
                KernelFamily.MEMCPY,
                flat,
                build=partial(_host_copy, False),
                n=16,
            ),
        ]
    return expand(NAME, ops, spec)


SUITE = Suite(NAME, "copy, concat, transpose (and h2d/d2h on CUDA)", cases)
