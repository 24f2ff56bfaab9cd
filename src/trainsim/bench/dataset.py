"""The kernel micro-benchmark dataset: one JSON object per line, schema ``trainsim.kernel-bench/1``.

A row is one measured case (op, phase, dtype, shape parameters) on one device::

    {"schema": "trainsim.kernel-bench/1", "key": "gemm/mm/fwd/float32/k=256,m=64,n=128",
     "suite": "gemm", "op": "mm", "phase": "fwd", "family": "gemm", "dtype": "float32",
     "params": {"k": 256, "m": 64, "n": 128}, "shapes": [[64, 256], [256, 128]],
     "flops": 4194304.0, "bytes": 229376.0,
     "duration_s": 1.234e-05, "times_s": [...], "inner": 80, "warmup": 2, "repeats": 5,
     "timer": "perf_counter", "device": "cpu", "device_name": "Intel(R) Xeon(R) Processor",
     "threads": 2, "fingerprint": "1f0c…", "versions": {"torch": "2.13.0+cpu", …},
     "timestamp": "2025-01-01T00:00:00+00:00"}

``duration_s`` is the median of ``times_s`` (one value per repeat, each the mean of ``inner``
back-to-back calls). ``params`` hold the op's shape parameters (the features a kernel model is
fitted on, besides ``flops`` and ``bytes``); ``family`` is the :class:`KernelFamily` a trace
kernel of that op is classified as, so a model fitted on the rows serves those kernels.
``fingerprint`` is :func:`trainsim.bench.comm.device_fingerprint`'s id (host, CPU/GPU model,
software versions): rows of different machines can share a file.

Files are append-only. :func:`append_row` writes a row with one ``write`` on an ``O_APPEND``
descriptor and ``fsync``; a crash can only leave a torn *last* line, which
:func:`read_kernel_dataset` ignores and :func:`repair_tail` cuts off before a sweep resumes.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainsim.errors import TraceFormatError
from trainsim.ir.kinds import KernelFamily

KERNEL_BENCH_SCHEMA = "trainsim.kernel-bench/1"

_REQUIRED = ("key", "suite", "op", "phase", "family", "dtype", "params", "flops", "bytes",
             "duration_s", "times_s", "device", "fingerprint")  # fmt: skip


@dataclass(frozen=True, slots=True)
class KernelSample:
    """One measured case, as read back from a dataset."""

    key: str
    suite: str
    op: str
    phase: str  # "fwd" or "bwd" (optimizer steps and probes are "fwd")
    family: KernelFamily
    dtype: str
    params: Mapping[str, Any]
    shapes: tuple[tuple[int, ...], ...]
    flops: float
    bytes: float
    duration_s: float
    times_s: tuple[float, ...]
    device: str  # "cpu" or "cuda"
    device_name: str
    fingerprint: str
    threads: int | None

    def features(self) -> dict[str, float]:
        """Numeric features for a model: the numeric parameters (flags as 0/1), flops, bytes."""
        out = {k: float(v) for k, v in self.params.items() if isinstance(v, int | float)}
        out["flops"] = self.flops
        out["bytes"] = self.bytes
        return out

    @property
    def spread(self) -> float:
        """Repeat-to-repeat noise of this row: (p75 − p25) / median of ``times_s``."""
        return relative_iqr(self.times_s)


def relative_iqr(times_s: Iterable[float]) -> float:
    import numpy as np

    t = np.asarray(list(times_s), dtype=float)
    if t.size < 2:
        return 0.0
    q25, q50, q75 = np.percentile(t, [25, 50, 75])
    return float((q75 - q25) / q50) if q50 > 0 else math.inf


def noise_floor(samples: Iterable[KernelSample]) -> float:
    """Median over rows of the repeat-to-repeat spread ((p75 − p25) / median); 0 when empty."""
    import statistics

    spreads = [s.spread for s in samples]
    return statistics.median(spreads) if spreads else 0.0


# --- writing ------------------------------------------------------------------------------------


def append_row(path: Path, row: Mapping[str, Any]) -> None:
    """Append one row durably: a single ``write`` on an ``O_APPEND`` descriptor, then ``fsync``."""
    data = (json.dumps(row, sort_keys=True, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:  # a regular file takes it in one call; loop for the letter of POSIX
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def repair_tail(path: Path) -> int:
    """Cut a torn last line (a crash mid-write) off ``path``; returns the bytes removed."""
    if not path.exists():
        return 0
    size = path.stat().st_size
    if size == 0:
        return 0
    with path.open("r+b") as fh:
        # Scan back from the end for the last newline, a block at a time.
        end = size
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return 0
        pos = size
        while pos > 0:
            start = max(0, pos - 65536)
            fh.seek(start)
            block = fh.read(pos - start)
            nl = block.rfind(b"\n")
            if nl >= 0:
                end = start + nl + 1
                break
            pos = start
        else:
            end = 0
        fh.truncate(end)
        fh.flush()
        os.fsync(fh.fileno())
    return size - end


# --- reading ------------------------------------------------------------------------------------


def iter_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) of every complete row; a torn last line is skipped, not repaired."""
    raw = path.read_bytes()
    complete = raw[: raw.rfind(b"\n") + 1]  # everything up to the last newline
    for lineno, line in enumerate(complete.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceFormatError(path, f"line {lineno}: not JSON ({e.msg})") from None
        if not isinstance(row, dict) or row.get("schema") != KERNEL_BENCH_SCHEMA:
            got = row.get("schema") if isinstance(row, dict) else type(row).__name__
            raise TraceFormatError(
                path, f"line {lineno}: not a {KERNEL_BENCH_SCHEMA} row (schema {got!r})"
            )
        yield lineno, row


def _sample(path: Path, lineno: int, r: dict[str, Any]) -> KernelSample:
    missing = [k for k in _REQUIRED if k not in r]
    if missing:
        raise TraceFormatError(path, f"line {lineno}: missing {', '.join(missing)}")
    try:
        return KernelSample(
            key=str(r["key"]), suite=str(r["suite"]), op=str(r["op"]), phase=str(r["phase"]),
            family=KernelFamily(r["family"]), dtype=str(r["dtype"]), params=dict(r["params"]),
            shapes=tuple(tuple(int(d) for d in s) for s in r.get("shapes", ())),
            flops=float(r["flops"]), bytes=float(r["bytes"]), duration_s=float(r["duration_s"]),
            times_s=tuple(float(t) for t in r["times_s"]), device=str(r["device"]),
            device_name=str(r.get("device_name", "")), fingerprint=str(r["fingerprint"]),
            threads=int(r["threads"]) if r.get("threads") is not None else None,
        )  # fmt: skip
    except (TypeError, ValueError) as e:
        raise TraceFormatError(path, f"line {lineno}: bad value ({e})") from None


def read_kernel_dataset(
    paths: Iterable[str | Path], *, device: str | None = None
) -> list[KernelSample]:
    """Samples of one or more datasets (files or folders of ``*.jsonl``), first copy of a key wins.

    ``device`` keeps only rows of that device kind (``cpu`` or ``cuda``).
    """
    files: list[Path] = []
    for p in map(Path, paths):
        files.extend(sorted(p.glob("*.jsonl")) if p.is_dir() else [p])
    seen: set[tuple[str, str, int | None]] = set()
    out: list[KernelSample] = []
    for f in files:
        if not f.exists():
            raise TraceFormatError(f, "no such dataset file")
        for lineno, row in iter_rows(f):
            s = _sample(f, lineno, row)
            ident = (s.key, s.fingerprint, s.threads)
            if (device is None or s.device == device) and ident not in seen:
                seen.add(ident)
                out.append(s)
    return out


def is_kernel_dataset(path: str | Path) -> bool:
    """Whether the first line of ``path`` is a row of this schema (for format sniffing)."""
    try:
        with Path(path).open("rb") as fh:
            head = fh.readline(1 << 16)
    except OSError:
        return False
    return KERNEL_BENCH_SCHEMA.encode() in head


__all__ = [
    "KERNEL_BENCH_SCHEMA",
    "KernelSample",
    "append_row",
    "is_kernel_dataset",
    "iter_rows",
    "noise_floor",
    "read_kernel_dataset",
    "relative_iqr",
    "repair_tail",
]
