"""Index suite: DLRM's ``tril`` (the interaction's lower triangle, gathered by advanced
indexing) and ``index_select`` along rows; forward and backward (an accumulating scatter).

Parameters: tril ``B`` samples of an ``F`` × ``F`` interaction matrix (``P = F(F−1)/2`` pairs
kept); index_select a ``rows`` × ``d`` source and ``k`` indices. Bytes: gathered elements read and
written once plus the int64 indices; backward also zero-fills the gradient of the source.
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

NAME = "index"


def _tril_cost(phase: Phase, p: Params, dtype: str) -> Cost:
    es, b, f = DTYPE_BYTES[dtype], p["B"], p["F"]
    pairs = f * (f - 1) // 2
    gathered = 2.0 * es * b * pairs + 16 * pairs
    if phase is Phase.FWD:
        return Cost(flops=0.0, bytes=gathered)
    return Cost(flops=float(b * pairs), bytes=gathered + es * b * f * f)


def _tril(phase: Phase, dtype: str, p: Params, device: Any) -> Timed:
    import torch

    li, lj = torch.tril_indices(p["F"], p["F"], offset=-1, device=device)
    z = randn((p["B"], p["F"], p["F"]), dtype=dtype, device=device, grad=phase is Phase.BWD)
    return autograd_call(phase, lambda z: z[:, li, lj], [z])


def _select_cost(phase: Phase, p: Params, dtype: str) -> Cost:
    es = DTYPE_BYTES[dtype]
    gathered = 2.0 * es * p["k"] * p["d"] + 8 * p["k"]
    if phase is Phase.FWD:
        return Cost(flops=0.0, bytes=gathered)
    return Cost(flops=float(p["k"] * p["d"]), bytes=gathered + es * p["rows"] * p["d"])


def _index_select(phase: Phase, dtype: str, p: Params, device: Any) -> Timed:
    import torch

    x = randn((p["rows"], p["d"]), dtype=dtype, device=device, grad=phase is Phase.BWD)
    idx = torch.randint(p["rows"], (p["k"],), device=device)
    return autograd_call(phase, lambda x: x.index_select(0, idx), [x])


def cases(spec: SweepSpec) -> Iterator[Case]:
    tril = OpSweep(
        op="tril", model_op="tril", features=lambda p: {"B": p["B"], "F": p["F"]},
        family=KernelFamily.INDEX, cost=_tril_cost, build=_tril, quick_cases=20,
        dims={"B": LogRange(1, 1 << 15, align=1), "F": LogRange(3, 128, align=1)},
        shapes=lambda p: [(p["B"], p["F"], p["F"])],
    )  # fmt: skip
    select = OpSweep(
        op="index_select", model_op="index_select", features=dict, family=KernelFamily.INDEX, cost=_select_cost, build=_index_select,
        dims={"rows": LogRange(16, 1 << 22, align=1), "d": LogRange(1, 1024),
              "k": LogRange(1, 1 << 20, align=1)},
        shapes=lambda p: [(p["rows"], p["d"]), (p["k"],)], quick_cases=20,
    )  # fmt: skip
    return expand(NAME, [tril, select], spec)


SUITE = Suite(NAME, "tril (DLRM interaction), index_select; forward and backward", cases)
