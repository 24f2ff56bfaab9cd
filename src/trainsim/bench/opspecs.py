"""Kernel-model operators for the benchmark ops that :data:`trainsim.kernels.features.OPS` lacks.

The kernel suites calibrate existing operators where one fits (``gemm``, ``attention``,
``layernorm``, ``RMSlayernorm``, ``softmax``, ``gelu``, ``elementwise``, ``embedding_bag``,
``memcpy``); the ops below have no operator there yet. They are written in the same form as that
table so they can move into it; until then :func:`register_bench_ops` adds them (idempotent: an
operator already registered under the same name is left alone).

Approximations: FLOPs and bytes are first-order counts (each tensor read or written once,
nominal FLOPs per element for transcendental functions); learned models use them as features.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from trainsim.ir.kinds import KernelFamily as F
from trainsim.kernels.features import OPS, Arrays, OpSpec

Derive = Callable[[Arrays, int], Arrays]


def _elementwise(flops_per: float, reads: float, writes: float, extra_bytes: float = 0.0) -> Derive:
    def derive(x: Arrays, eb: int) -> Arrays:
        n = x["numel"]
        return {
            "numel": n,
            "flops": flops_per * n,
            "bytes": ((reads + writes) * eb + extra_bytes) * n,
        }

    return derive


def _conv2d(x: Arrays, eb: int) -> Arrays:
    """Direct convolution, "same" padding (odd r): FLOPs 2·n·k·c·r²·ho²; as an implicit GEMM
    m = n·ho², n = k, k = c·r². Approximation: ho = (hw − 1)/stride + 1 without the floor, so
    that it moves smoothly (and monotonically) with its inputs.

    On a CPU, torch runs a convolution one of two ways, by a fixed rule on the shapes and the
    thread count (``ConvParams::use_mkldnn``, aten/src/ATen/native/Convolution.cpp; it gives the
    path oneDNN's verbose log shows for all 467 shapes of a full fp32 conv sweep, one thread, and
    a test checks it against torch): oneDNN, which
    reorders the input and output into channel blocks of ``lanes`` (the SIMD width: 16 fp32 on
    AVX-512) and computes on the padded channels, or torch's native kernel (per-image im2col
    and GEMM; no unfold for a 1x1 stride-1 filter). ``host_onednn`` (2 on that path, 1 on the
    native one), the padded FLOPs and the bytes the path moves besides the convolution's own
    are features on a CPU (``host_`` columns: a device with SMs drops them)."""
    n, c, k, hw, r, s = x["n"], x["c"], x["k"], x["hw"], x["r"], x["stride"]
    ho = (hw - 1) / s + 1
    lanes = x["lanes"]
    pointwise = (r == 1) & (s == 1)
    onednn = (~pointwise | (n >= 16) | (x["threads"] > 1)) & ((r > 3) | (n > 1) | (n * c * hw * hw > 20480))
    cp, kp = np.ceil(c / lanes) * lanes, np.ceil(k / lanes) * lanes
    im2col = eb * n * ho * ho * c * r * r
    moved = np.where(onednn, eb * n * ((c + cp) * hw * hw + (k + kp) * ho * ho),
                     np.where(pointwise, 0.0, 2.0 * im2col))  # fmt: skip
    flops = 2.0 * n * k * c * r * r * ho * ho
    return {"out_hw": ho, "gemm_m": n * ho * ho, "gemm_n": k, "gemm_k": c * r * r,
            "flops": flops, "bytes": eb * (n * c * hw * hw + k * c * r * r + n * k * ho * ho),
            # the unfolded input an im2col GEMM reads (r² copies of each input pixel) and the
            # output; a direct kernel avoids the first, which is why both are features
            "im2col_bytes": im2col, "out_bytes": eb * n * k * ho * ho,
            "host_onednn": 1.0 + onednn, "host_padded_flops": np.where(onednn, flops * (cp / c) * (kp / k), flops),
            "host_path_bytes": moved + eb}  # fmt: skip


def _batch_norm(x: Arrays, eb: int) -> Arrays:
    numel = x["n"] * x["c"] * x["hw"] ** 2
    # statistics are reduced per channel over n·hw² values: the length of each reduction
    return {"numel": numel, "plane": x["n"] * x["hw"] ** 2, "flops": 8.0 * numel,
            "bytes": 2.0 * eb * numel}  # fmt: skip


def _cross_entropy(x: Arrays, eb: int) -> Arrays:
    numel = x["n"] * x["v"]
    return {"rows": x["n"], "cols": x["v"], "numel": numel, "flops": 6.0 * numel,
            "bytes": 3.0 * eb * numel}  # fmt: skip


def _concat(x: Arrays, eb: int) -> Arrays:
    numel = x["parts"] * x["rows"] * x["cols"]
    return {"numel": numel, "part_bytes": eb * x["rows"] * x["cols"], "row_bytes": eb * x["cols"],
            "flops": np.zeros_like(numel), "bytes": 2.0 * eb * numel}  # fmt: skip


def _transpose(x: Arrays, eb: int) -> Arrays:
    numel = x["b"] * x["m"] * x["n"]
    return {"numel": numel, "flops": np.zeros_like(numel), "bytes": 2.0 * eb * numel}


def _tril(x: Arrays, eb: int) -> Arrays:
    pairs = x["F"] * (x["F"] - 1) / 2
    return {"pairs": pairs, "numel": x["B"] * pairs, "flops": np.zeros_like(pairs),
            "bytes": 2.0 * eb * x["B"] * pairs + 16.0 * pairs}  # fmt: skip


def _index_select(x: Arrays, eb: int) -> Arrays:
    """Gather ``k`` rows of ``d`` from ``rows``; backward zero-fills the (rows, d) gradient and
    adds into it. ``unique_rows``: the expected distinct rows of ``k`` uniform draws,
    ``rows·(1 − e^(−k/rows))``: a repeated row is a cache hit forward and a read-modify-write of
    the same line backward; ``touched_bytes`` is their data."""
    gathered = x["k"] * x["d"]
    unique = x["rows"] * -np.expm1(-x["k"] / x["rows"])
    return {"numel": gathered, "source_bytes": eb * x["rows"] * x["d"], "unique_rows": unique,
            "touched_bytes": eb * unique * x["d"], "row_bytes": eb * x["d"],
            "flops": np.zeros_like(gathered), "bytes": 2.0 * eb * gathered + 8.0 * x["k"]}  # fmt: skip


def _optimizer(bytes_per_param: float, flops_per_param: float) -> Derive:
    def derive(x: Arrays, eb: int) -> Arrays:
        p = x["params"]
        # a for-loop optimizer pays a per-tensor cost (dispatch of each tensor's ops) beside
        # the per-parameter traffic: per_tensor is the work between two such costs
        return {"params": p, "per_tensor": p / x["tensors"], "per_tensor_bytes": bytes_per_param * p / x["tensors"],
                "flops": flops_per_param * p, "bytes": bytes_per_param * p}  # fmt: skip

    return derive


def _copy(x: Arrays, eb: int) -> Arrays:
    return {"flops": np.zeros_like(x["bytes"]), "bytes": 2.0 * x["bytes"]}


_N = {"numel": 1}
BENCH_OPS: tuple[OpSpec, ...] = (
    OpSpec("relu", F.ELEMENTWISE, _N, _elementwise(1, 1, 1), {"numel": 2.0**24}),
    OpSpec("tanh", F.ELEMENTWISE, _N, _elementwise(10, 1, 1), {"numel": 2.0**24}),
    OpSpec("dropout", F.ELEMENTWISE, _N, _elementwise(2, 1, 1, extra_bytes=1), {"numel": 2.0**24},
           note="training mode: also writes a one-byte mask per element"),
    OpSpec("sum", F.REDUCTION, _N, _elementwise(1, 1, 0), {"numel": 2.0**24}),
    OpSpec("conv2d", F.CONV, {"n": 1, "c": 1, "k": 1, "hw": 1, "r": 1, "stride": -1, "threads": 0, "lanes": 0},
           _conv2d, {"n": 32.0, "c": 64.0, "k": 64.0, "hw": 56.0, "r": 3.0, "stride": 1.0},
           {"threads": 1.0, "lanes": 16.0},
           note="threads: torch's intra-op threads (the CPU path rule); lanes: the SIMD width in "
                "elements, from the device's vector_bits where it has them"),
    OpSpec("batch_norm", F.NORM, {"n": 1, "c": 1, "hw": 1}, _batch_norm,
           {"n": 32.0, "c": 64.0, "hw": 56.0}, note="training mode (batch statistics)"),
    OpSpec("cross_entropy", F.SOFTMAX, {"n": 1, "v": 1}, _cross_entropy, {"n": 4096.0, "v": 32000.0},
           note="torch cross_entropy: log-softmax over v classes, then the target's log-probability"),
    OpSpec("concat", F.INDEX, {"parts": 0, "rows": 1, "cols": 1}, _concat,
           {"parts": 8.0, "rows": 2048.0, "cols": 128.0}, note="torch.cat along the columns"),
    OpSpec("transpose", F.ELEMENTWISE, {"b": 1, "m": 1, "n": 1}, _transpose,
           {"b": 64.0, "m": 512.0, "n": 512.0}, note="x.transpose(1, 2).contiguous() of (b, m, n)"),
    OpSpec("tril", F.INDEX, {"B": 1, "F": 1}, _tril, {"B": 2048.0, "F": 27.0},
           note="DLRM interaction: the strictly lower triangle of (B, F, F) by advanced indexing"),
    OpSpec("index_select", F.INDEX, {"rows": 0, "d": 1, "k": 1}, _index_select,
           {"rows": 1e5, "d": 128.0, "k": 1e4}, note="rows of a (rows, d) source; backward index_add"),
    OpSpec("adam", F.OPTIMIZER, {"params": 1, "tensors": 0}, _optimizer(28, 12),
           {"params": 1e7, "tensors": 100.0}, note="torch.optim.Adam step, fp32 (p, g, m, v)"),
    OpSpec("sgd", F.OPTIMIZER, {"params": 1, "tensors": 0}, _optimizer(20, 3),
           {"params": 1e7, "tensors": 100.0}, note="torch.optim.SGD step with momentum, fp32"),
    OpSpec("memcpy_h2d", F.MEMCPY, {"bytes": 1}, _copy, {"bytes": 2.0**26},
           note="pinned host to device, non-blocking"),
    OpSpec("memcpy_d2h", F.MEMCPY, {"bytes": 1}, _copy, {"bytes": 2.0**26},
           note="device to pinned host, non-blocking"),
    OpSpec("embedding_tbe", F.EMBEDDING_FWD, {"B": 0, "E": 0, "T": 1, "L": 1, "D": 1, "reuse": 0},
           OPS["embedding_bag"].derive, {"B": 2048.0, "E": 1e6, "T": 1.0, "L": 32.0, "D": 128.0},
           {"reuse": 1.0}, bwd_family=F.EMBEDDING_BWD,
           note="FBGEMM's table-batched embedding bag (SplitTableBatchedEmbeddingBagsCodegen, CPU, sum "
                "pooling), one table; backward includes its fused exact-SGD row update. Same work as "
                "embedding_bag, another kernel (what DLRM training runs)"),
)  # fmt: skip


def register_bench_ops() -> None:
    """Add :data:`BENCH_OPS` to the kernel-model operator table (names already there are kept)."""
    for spec in BENCH_OPS:
        OPS.setdefault(spec.name, spec)


__all__ = ["BENCH_OPS", "register_bench_ops"]
