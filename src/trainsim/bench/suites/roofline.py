"""Roofline probes: peak FLOP/s (large square ``mm``) and memory bandwidth (STREAM-like ``copy``,
``triad`` a = b + 2·c, and ``read`` = sum), each over a few sizes.

:func:`roofline_peaks` reads them back as the device's measured peaks: the best FLOP/s per dtype
and the best bytes/s of the bandwidth probes whose working set is at least twice the last-level
cache (002 §4.3.2.1 uses "the maximum measured bandwidth of the benchmark as the corrected peak
bandwidth"; a probe the cache holds measures the cache: review finding, a 10 MB copy on a CPU
with 32 MiB of L3 ran at 212 GB/s, an 83 MB one at 43 GB/s). Rows carry the family of the
kernel each probe runs, so they are also ordinary samples of that family.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
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
    expand,
    randn,
)
from trainsim.ir.kinds import KernelFamily

NAME = "roofline"
_FWD = (Phase.FWD,)
BANDWIDTH_PROBES = ("stream_copy", "stream_triad", "stream_read")
# probe: (family, tensors read+written)
# A bandwidth probe counts as memory bandwidth when everything it reads and writes is at least
# this many times the last-level cache. Why 2, not STREAM's 4 arrays x 4: a CPU case is capped
# at an estimated 20 ms (~100 MB at the conservative 5 GB/s), and measured on the 2-vCPU dev VM
# (32 MiB L3) a copy reaches DRAM speed from ~1.2x on: 92 GB/s at 10 MB, 38 at 40 MB, ~30 from
# 60 MB to 320 MB (numpy, one thread, median of 21).
CACHE_FACTOR = 2.0
_STREAM = {
    "stream_copy": (KernelFamily.MEMCPY, 2),
    "stream_triad": (KernelFamily.ELEMENTWISE, 3),
    "stream_read": (KernelFamily.REDUCTION, 1),
}
# probe -> (kernel-model operator, its inputs)
_MODEL_OP = {
    "stream_copy": ("memcpy", lambda p: {"bytes": 4 * p["n"]}),
    "stream_triad": ("elementwise", lambda p: {"numel": p["n"]}),
    "stream_read": ("sum", lambda p: {"numel": p["n"]}),
}


def _mm(phase: Phase, dtype: str, p: Params, device: Any) -> Timed:
    import torch

    a = randn((p["n"], p["n"]), dtype=dtype, device=device)
    b = randn((p["n"], p["n"]), dtype=dtype, device=device)
    out = torch.empty_like(a)
    return lambda: torch.mm(a, b, out=out)


def _stream(op: str, phase: Phase, dtype: str, p: Params, device: Any) -> Timed:
    import torch

    a, b, c = (randn((p["n"],), dtype=dtype, device=device) for _ in range(3))
    if op == "stream_copy":
        return lambda: a.copy_(b)
    if op == "stream_triad":
        return lambda: torch.add(b, c, alpha=2.0, out=a)
    return b.sum


def _stream_op(op: str, lo: int, hi: int) -> OpSweep:
    family, tensors = _STREAM[op]
    model_op, features = _MODEL_OP[op]
    return OpSweep(
        op=op, model_op=model_op, features=features, family=family, dims={"n": LogRange(lo, hi)}, phases=_FWD, dtypes=("float32",),
        quick_cases=4, shapes=lambda p: [(p["n"],)] * tensors,
        cost=lambda phase, p, dtype: Cost(flops=float(p["n"] * (tensors - 1)),
                                          bytes=float(tensors * DTYPE_BYTES[dtype] * p["n"])),
        build=lambda phase, dtype, p, device: _stream(op, phase, dtype, p, device),
    )  # fmt: skip


def cases(spec: SweepSpec) -> Iterator[Case]:
    mm = OpSweep(
        op="peak_mm", model_op="gemm", family=KernelFamily.GEMM,
        features=lambda p: {"batch": 1, "m": p["n"], "n": p["n"], "k": p["n"]}, phases=_FWD, quick_cases=4, build=_mm,
        slowdown=0.15,  # a large square mm runs near peak: allow ~7x the conservative budget
        dims={"n": Choice((2048, 4096, 6144, 8192, 12288, 16384) if spec.cuda
                          else (512, 768, 1024, 1536, 2048, 3072, 4096))},
        shapes=lambda p: [(p["n"], p["n"])] * 2,
        cost=lambda phase, p, dtype: Cost(flops=2.0 * p["n"] ** 3,
                                          bytes=3.0 * DTYPE_BYTES[dtype] * p["n"] ** 2),
    )  # fmt: skip
    # Streams well beyond the last-level cache of a CPU (hundreds of MB here) and of a GPU's L2.
    lo, hi = (1 << 24, 1 << 30) if spec.cuda else (1 << 20, 1 << 26)
    return expand(NAME, [mm, *(_stream_op(op, lo, hi) for op in _STREAM)], spec)


def roofline_peaks(rows: Iterable[Mapping[str, Any]], *, cache_bytes: float | None = None) -> dict[str, Any]:
    """Measured peaks from a dataset's roofline rows (dicts as written by the runner):
    ``{"flops_per_s": {dtype: best}, "bandwidth_Bps": best or None, "device": name,
    "bandwidth_probes": {...}}``.

    ``bandwidth_Bps`` is the best of the probes whose working set (``bytes``: every byte read
    and written) is at least :data:`CACHE_FACTOR` x ``cache_bytes``, the last-level cache
    (None: this machine's, for the rows' device kind — the rows the bench just measured here;
    0: every probe counts). When none is that large it is the best of those larger than the
    cache, else of all, and ``bandwidth_probes["note"]`` says it may be a cache's bandwidth."""
    flops: dict[str, float] = {}
    probes: list[tuple[float, float]] = []  # (working set bytes, bytes/s)
    device, kind = "", "cpu"
    for r in rows:
        if r.get("suite") != NAME or not r["duration_s"] > 0:
            continue
        device = device or r["device"]
        kind = r.get("device_kind") or kind
        if r["bench_op"] == "peak_mm":
            flops[r["dtype"]] = max(flops.get(r["dtype"], 0.0), r["flops"] / r["duration_s"])
        elif r["bench_op"] in BANDWIDTH_PROBES:
            probes.append((float(r["bytes"]), r["bytes"] / r["duration_s"]))
    how = "given"
    if cache_bytes is None:
        from trainsim.bench.devicespec import last_level_cache_bytes

        cache_bytes, how = last_level_cache_bytes(kind)
    bandwidth, info = _memory_bandwidth(probes, cache_bytes)
    return {"flops_per_s": flops, "bandwidth_Bps": bandwidth, "device": device,
            "bandwidth_probes": {**info, "cache_source": how}}  # fmt: skip


def _memory_bandwidth(probes: list[tuple[float, float]], cache_bytes: float) -> tuple[float | None, dict[str, Any]]:
    """(best bytes/s of the probes beyond the cache, what was used and why); see
    :func:`roofline_peaks`."""
    need = CACHE_FACTOR * cache_bytes
    beyond = [bw for ws, bw in probes if ws >= need]
    info: dict[str, Any] = {
        "cache_bytes": cache_bytes, "min_working_set_bytes": need, "probes": len(probes),
        "qualifying": len(beyond), "largest_working_set_bytes": max((ws for ws, _ in probes), default=None),
        "best_any_Bps": max((bw for _, bw in probes), default=None), "note": None,
    }  # fmt: skip
    if beyond or not probes:
        return (max(beyond) if beyond else None), info
    larger = [bw for ws, bw in probes if ws > cache_bytes]
    info["note"] = (f"no bandwidth probe's working set reached {CACHE_FACTOR:g}x the {cache_bytes / 2**20:.0f} MiB "
                    f"last-level cache (largest {info['largest_working_set_bytes'] / 1e6:.0f} MB): the bandwidth is "
                    f"the best of the probes {'larger than the cache' if larger else 'of any size'} and may be "
                    "the cache's, not memory's")  # fmt: skip
    return max(larger or [bw for _, bw in probes]), info


SUITE = Suite(NAME, "peak FLOP/s and memory-bandwidth probes for rooflines", cases)
