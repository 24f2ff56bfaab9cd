"""Embedding suite: ``embedding_bag`` (sum pooling) with index batches of a given reuse histogram.

Parameters: ``B`` bags, ``L`` lookups per bag (fixed pooling), ``E`` table rows, ``D`` embedding
dimension, ``hist`` the reuse-factor histogram the indices follow (:mod:`trainsim.bench.reuse`;
default the published DLRM locality ``dlrm2022``; the full sweep adds ``uniform`` indices), and
the derived ``unique_rows`` and ``mean_reuse`` (lookups per unique row). Kernel-model operator
``embedding_bag`` with one table (``T = 1``) and ``reuse = mean_reuse`` (a full sweep times the
same shapes with both index distributions); ``hist`` and ``unique_rows`` stay in the row's ``params``. Backward is the sparse
weight gradient (``sparse=True``, as DLRM trains its tables), not a dense E×D tensor.

Approximation (002 §4.3.2.1, without L2): FLOPs are the pooling adds (B·L·D); bytes count every
looked-up row read (B·L·D), the pooled output written (B·D) and the int64 indices and offsets —
reuse shows in ``unique_rows``, not in ``bytes``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from trainsim.bench.reuse import DLRM_2022, ReuseHistogram, reuse_indices, unique_rows
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
    torch_dtype,
)
from trainsim.ir.kinds import KernelFamily

NAME = "embedding"
UNIFORM = "uniform"


def _unique(p: Params, hist: ReuseHistogram | None) -> int:
    n, e = p["B"] * p["L"], p["E"]
    if hist is None:  # expected distinct rows of n uniform draws from e
        return round(e * -math.expm1(-n / e))
    return unique_rows(n, hist)


def _derive(p: Params, hist: ReuseHistogram | None) -> Params:
    u = _unique(p, hist)
    return {"hist": hist.name if hist else UNIFORM, "unique_rows": u,
            "mean_reuse": round(p["B"] * p["L"] / u, 3)}  # fmt: skip


def _cost(phase: Phase, p: Params, dtype: str) -> Cost:
    es = DTYPE_BYTES[dtype]
    n, b, d = p["B"] * p["L"], p["B"], p["D"]
    traffic = es * (n * d + b * d) + 8 * (n + b)
    table = es * p["E"] * d
    if phase is Phase.FWD:
        return Cost(flops=float(n * d), bytes=float(traffic), alloc_bytes=float(table + traffic))
    return Cost(flops=float(n * d), bytes=float(traffic), alloc_bytes=float(table + 2 * traffic))


def _build(hist: ReuseHistogram | None, phase: Phase, dtype: str, p: Params, device: Any) -> Timed:
    import torch
    import torch.nn.functional as nnf

    n, e = p["B"] * p["L"], p["E"]
    indices = torch.from_numpy(_indices(hist, p)).to(device)
    offsets = torch.arange(0, n, p["L"], device=device)
    # A constant table: filling is memset-fast, and values do not change the access pattern.
    weight = torch.full(
        (e, p["D"]), 0.01, dtype=torch_dtype(dtype), device=device, requires_grad=True
    )
    sparse = phase is Phase.BWD
    return autograd_call(
        phase, lambda w: nnf.embedding_bag(indices, w, offsets, mode="sum", sparse=sparse), [weight]
    )


def _op(hist: ReuseHistogram | None, spec: SweepSpec) -> OpSweep:
    dims: dict[str, Dim] = {
        "B": LogRange(16, 1 << 15, align=1), "L": LogRange(1, 128, align=1),
        "E": LogRange(1000, 100_000_000 if spec.cuda else 10_000_000, align=1),
        "D": Choice((16, 32, 64, 128, 256)),
    }  # fmt: skip
    return OpSweep(
        op="embedding_bag", model_op="embedding_bag", family=KernelFamily.EMBEDDING_FWD, dims=dims,
        quick_cases=24, features=lambda p: {"B": p["B"], "E": p["E"], "T": 1, "L": p["L"], "D": p["D"],
                                            "reuse": p["mean_reuse"]},
        backward_family=KernelFamily.EMBEDDING_BWD,
        valid=lambda p: _unique(p, hist) <= p["E"], derive=lambda p: _derive(p, hist),
        cost=_cost, shapes=lambda p: [(p["E"], p["D"]), (p["B"] * p["L"],), (p["B"],)],
        build=lambda phase, dtype, p, device: _build(hist, phase, dtype, p, device),
    )  # fmt: skip


def _indices(hist: ReuseHistogram | None, p: Params) -> Any:
    import numpy as np

    n, e = p["B"] * p["L"], p["E"]
    return (np.random.default_rng(0).integers(0, e, n) if hist is None
            else reuse_indices(n, e, hist, seed=0))  # fmt: skip


def tbe_available() -> bool:
    """Whether FBGEMM's CPU table-batched embedding loads (``fbgemm-gpu-cpu``)."""
    try:
        import warnings

        with warnings.catch_warnings():  # fbgemm-gpu-cpu warns about its GPU-only (SSD) ops
            warnings.simplefilter("ignore")
            from fbgemm_gpu.split_table_batched_embeddings_ops_training import (  # noqa: F401
                SplitTableBatchedEmbeddingBagsCodegen,
            )
    except Exception:  # ImportError, or an op library that fails to load against this torch
        return False
    return True


def _build_tbe(hist: ReuseHistogram | None, phase: Phase, dtype: str, p: Params, device: Any) -> Timed:
    """One table in FBGEMM's TBE, as the sharded DLRM runs it (``trainsim.bench.dlrm_shard``):
    host-resident fp32 weights, sum pooling, exact SGD fused into the backward."""
    import torch
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        EmbeddingLocation,
        OptimType,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    emb = SplitTableBatchedEmbeddingBagsCodegen(
        [(p["E"], p["D"], EmbeddingLocation.HOST, ComputeDevice.CPU)], optimizer=OptimType.EXACT_SGD,
        learning_rate=0.01, pooling_mode=PoolingMode.SUM,
    )  # fmt: skip
    indices = torch.from_numpy(_indices(hist, p))
    offsets = torch.arange(0, p["B"] * p["L"] + 1, p["L"])
    if phase is Phase.FWD:
        return lambda: emb(indices, offsets)
    out = emb(indices, offsets)
    grad = torch.randn_like(out)
    return lambda: out.backward(grad, retain_graph=True)  # the fused update runs in here


def _tbe_op(hist: ReuseHistogram | None, spec: SweepSpec) -> OpSweep:
    base = _op(hist, spec)
    return OpSweep(
        op="embedding_tbe", model_op="embedding_tbe", family=KernelFamily.EMBEDDING_FWD,
        dims={**base.dims, "E": LogRange(1000, 10_000_000, align=1)}, quick_cases=base.quick_cases,
        features=base.features, backward_family=KernelFamily.EMBEDDING_BWD, valid=base.valid,
        derive=base.derive, cost=_cost, shapes=base.shapes, dtypes=("float32",),
        build=lambda phase, dtype, p, device: _build_tbe(hist, phase, dtype, p, device),
    )  # fmt: skip


def embedding_cases(spec: SweepSpec, *, hist: ReuseHistogram = DLRM_2022) -> Iterator[Case]:
    """The suite's cases with indices following ``hist`` (plus uniform indices in a full sweep);
    on a CPU with ``fbgemm-gpu-cpu`` also FBGEMM's TBE (fp32), the kernel DLRM training runs."""
    hists: list[ReuseHistogram | None] = [hist] + ([] if spec.quick else [None])
    ops = [_op(h, spec) for h in hists]
    if not spec.cuda and tbe_available():
        ops += [_tbe_op(h, spec) for h in hists]
    return expand(NAME, ops, spec)


def cases(spec: SweepSpec) -> Iterator[Case]:
    return embedding_cases(spec)


SUITE = Suite(NAME, "embedding_bag (sum) and FBGEMM TBE (CPU) with DLRM-like index reuse; forward and backward", cases)
