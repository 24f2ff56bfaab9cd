"""Writing kernel micro-benchmark datasets: durable appends, torn-tail repair, resume keys.

The format is :mod:`trainsim.kernels.readers`' ``trainsim.kernel-bench/1`` (JSON lines), which
``trainsim fit`` reads; the runner writes its fields and keeps its own next to them::

    {"schema": "trainsim.kernel-bench/1", "device": "Intel(R) Xeon(R) Processor",
     "fingerprint": "f97e94a9cbddf655", "family": "gemm", "op": "gemm", "phase": "fwd",
     "dtype": "fp32", "features": {"batch": 1, "k": 256, "m": 64, "n": 128},
     "duration_s": 1.234e-05, "repeats": 7, "statistic": "median", "samples_s": [...],
     "key": "gemm/mm/fwd/float32/k=256,m=64,n=128", "suite": "gemm", "bench_op": "mm",
     "shapes": [[64, 256], [256, 128]], "flops": 4194304.0, "bytes": 229376.0, "inner": 80,
     "warmup": 2, "quick": true, "timer": "perf_counter", "device_kind": "cpu", "threads": 2,
     "versions": {"python": "3.11.7", "torch": "2.13.0+cpu", "trainsim": "0.1.0"},
     "timestamp": "2025-01-01T00:00:00+00:00"}

``op``/``features`` name the kernel-model operator the row calibrates and its inputs;
``bench_op`` the torch call that was timed; ``params`` (only when they say more than
``features``, e.g. an embedding batch's reuse histogram and unique rows) the swept parameters.
``duration_s`` is the median of ``samples_s``, one value per repeat, each the mean of ``inner``
back-to-back calls; ``quick`` says the --quick schedule timed the row. ``fingerprint`` is
:func:`trainsim.bench.comm.device_fingerprint`'s id.

Files are append-only: :func:`append_row` writes a row with one ``write`` on an ``O_APPEND``
descriptor and ``fsync``, so a crash can only leave a torn *last* line; :func:`iter_rows`
ignores it and :func:`repair_tail` cuts it off before a sweep resumes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from trainsim.errors import ConfigError, TraceFormatError

KERNEL_BENCH_SCHEMA = "trainsim.kernel-bench/1"  # = trainsim.kernels.readers.SCHEMA


def append_row(path: Path, row: Mapping[str, Any]) -> None:
    """Append one row durably: a single ``write`` on an ``O_APPEND`` descriptor, then ``fsync``."""
    append_rows(path, [row])


def append_rows(path: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """Append rows durably and together: one ``write`` of all their lines, then ``fsync``; a
    Ctrl-C (a Python exception, raised between calls) cannot land between two of them."""
    data = "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows).encode()
    if not data:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:  # a regular file takes it in one call; loop for the letter of POSIX
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def locked(path: Path, busy: str) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) for the block: one writer of an
    append-only dataset at a time; another gets ``ConfigError(f"{path}: {busy}")``."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, single writer assumed
        yield
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"{path}: {busy}") from None
        yield
    finally:
        os.close(fd)  # closing releases the lock


def sweep_lock(path: Path) -> contextlib.AbstractContextManager[None]:
    """The lock of a `trainsim bench` sweep (kernels or collectives) on its dataset."""
    return locked(path, "another benchmark sweep is writing this dataset; wait for it or use another --dataset")


def check_appendable(path: Path, schema: str, what: str) -> None:
    """Refuse to append to (and so to repair the tail of) a file that is not ``what``.

    The first non-blank line decides: a row of ``schema``. A file that is one torn line (a crash
    in the first write) is taken when it starts as a JSON object does, whatever its key order
    (``bench comm`` rows written before 2026-12-02 sort their keys, ``schema`` near the end).
    A user's notes given as a resume path would otherwise lose their last line to
    :func:`repair_tail` and gain rows they never asked for.
    """
    if path.name.endswith(".gz"):
        raise ConfigError(f"{path}: a .gz name; rows are appended to plain JSONL (give a name without .gz)")
    if not path.exists() or path.is_dir() or path.stat().st_size == 0:
        return
    with path.open("rb") as fh:
        head = fh.read(65536)
    if head.startswith(b"\x1f\x8b"):
        raise ConfigError(f"{path}: gzip-compressed; rows are appended to plain JSONL (gunzip it, or give a new file)")
    if head.startswith(b"\xef\xbb\xbf"):
        raise ConfigError(f"{path}: starts with a byte-order mark, which the dataset readers do not take; "
                          "give a new file")  # fmt: skip
    lines = head.split(b"\n")
    complete = lines[:-1] if len(head) == 65536 or not head.endswith(b"\n") else lines
    first = next((ln for ln in complete if ln.strip()), None)
    found = "not JSON"
    if first is None:  # no complete line: blank lines, then at most one torn line
        torn = lines[-1].strip()
        if not torn or torn.startswith(b'{"'):
            return
    else:
        try:
            row = json.loads(first.decode("utf-8"))
            if isinstance(row, dict) and row.get("schema") == schema:
                return
            found = (f"a {row['schema']} row" if isinstance(row, dict) and isinstance(row.get("schema"), str)
                     else "JSON without a trainsim schema")  # fmt: skip
        except (UnicodeDecodeError, json.JSONDecodeError):
            pass
    raise ConfigError(f"{path}: not {what}: its first line is {found}, not a {schema} row; give a new "
                      "file or one an earlier run wrote")  # fmt: skip


def repair_tail(path: Path) -> int:
    """Cut a torn last line (a crash mid-write) off ``path``; returns the bytes removed."""
    if not path.exists() or path.stat().st_size == 0:
        return 0
    size = path.stat().st_size
    with path.open("r+b") as fh:
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return 0
        end, pos = 0, size
        while pos > 0:  # back from the end, a block at a time, to the last newline
            start = max(0, pos - 65536)
            fh.seek(start)
            nl = fh.read(pos - start).rfind(b"\n")
            if nl >= 0:
                end = start + nl + 1
                break
            pos = start
        fh.truncate(end)
        fh.flush()
        os.fsync(fh.fileno())
    return size - end


def complete_lines(path: Path, raw: bytes | None = None) -> Iterator[tuple[int, Any]]:
    """(line number, decoded JSON) of every complete line of an append-only JSONL file (a torn
    last line is skipped, not repaired; blank lines too); bad bytes or JSON name the line."""
    raw = path.read_bytes() if raw is None else raw
    complete = raw[: raw.rfind(b"\n") + 1]
    for lineno, line in enumerate(complete.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise TraceFormatError(path, f"line {lineno}: not UTF-8 text (byte {e.start})") from None
        except json.JSONDecodeError as e:
            raise TraceFormatError(path, f"line {lineno}: not JSON ({e.msg})") from None


def iter_rows(path: Path) -> Iterator[dict[str, Any]]:
    """Every complete row of a dataset; a torn last line is skipped (not repaired)."""
    raw = path.read_bytes()
    if path.name.endswith(".gz"):  # a shipped snapshot, compressed (appending needs plain JSONL)
        import gzip

        raw = gzip.decompress(raw)
    for lineno, row in complete_lines(path, raw):
        if not isinstance(row, dict) or row.get("schema") != KERNEL_BENCH_SCHEMA:
            got = row.get("schema") if isinstance(row, dict) else type(row).__name__
            raise TraceFormatError(
                path, f"line {lineno}: not a {KERNEL_BENCH_SCHEMA} row (schema {got!r}); "
                "give each benchmark its own --dataset",
            )  # fmt: skip
        yield row


def _percentile(t: list[float], q: float) -> float:
    """``numpy.percentile(t, 100 q)`` of sorted finite ``t`` (its default ``linear`` method, the
    same float operations, so the same bits), without numpy's per-call cost: a dataset read
    takes the spread of every row (45,000 rows: 2.5 s in np.percentile)."""
    n = len(t)
    v = n * q + (1 + q * (1 - 1 - 1)) - 1  # numpy's _compute_virtual_index, alpha = beta = 1
    lo = math.floor(v)
    g = v - lo
    a, b = t[lo], t[min(lo + 1, n - 1)]
    d = b - a
    return b - d * (1 - g) if g >= 0.5 else a + d * g  # numpy's _lerp


def relative_iqr(times_s: Iterable[float]) -> float:
    """(p75 − p25) / median of repeat times: the repeat-to-repeat spread of one row."""
    t = sorted(float(x) for x in times_s)
    if len(t) < 2:
        return 0.0
    if not all(math.isfinite(x) for x in t):  # nan and inf: numpy's own answer
        import numpy as np

        q25, q50, q75 = np.percentile(np.asarray(t), [25, 50, 75])
    else:
        q25, q50, q75 = (_percentile(t, q) for q in (0.25, 0.5, 0.75))
    return float((q75 - q25) / q50) if q50 > 0 else math.inf


def noise_floor(rows: Iterable[Mapping[str, Any]]) -> float | None:
    """Median over rows of their spread (:func:`relative_iqr` of ``samples_s``); None if empty."""
    spreads = [relative_iqr(r["samples_s"]) for r in rows if r.get("samples_s")]
    return statistics.median(spreads) if spreads else None


def agreement(rows: Iterable[Mapping[str, Any]], other: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """How two measurements of the same cases agree: the rows of ``rows`` and ``other`` with the
    same case key and thread count, compared by their times (``other`` over ``rows``).

    The within-row noise floor says how steady the repeats of one row were; this says what a
    second run reproduces (another moment of a shared machine, or another machine): the
    geometric mean, median, p90 and max of ``|t_other / t − 1|`` taken in log space
    (``exp(|ln ratio|) − 1``), and the median ratio (a shift of one run against the other)."""
    mine = {(r["key"], r.get("threads")): float(r["duration_s"]) for r in rows if r.get("duration_s")}
    theirs = {(r["key"], r.get("threads")): float(r["duration_s"]) for r in other if r.get("duration_s")}
    common = sorted(k for k in mine.keys() & theirs.keys() if mine[k] > 0 and theirs[k] > 0)
    if not common:
        return {"cases": 0}
    logs = sorted(math.log(theirs[k] / mine[k]) for k in common)
    absl = sorted(abs(v) for v in logs)

    def pct(v: float) -> float:
        return 100.0 * math.expm1(v)

    return {"cases": len(common), "geomean_abs_pct": pct(statistics.fmean(absl)),
            "median_abs_pct": pct(statistics.median(absl)),
            "p90_abs_pct": pct(absl[min(len(absl) - 1, math.ceil(0.9 * len(absl)) - 1)]),
            "max_abs_pct": pct(absl[-1]), "median_ratio": math.exp(statistics.median(logs))}  # fmt: skip


__all__ = [
    "KERNEL_BENCH_SCHEMA",
    "agreement",
    "append_row",
    "append_rows",
    "iter_rows",
    "noise_floor",
    "relative_iqr",
    "repair_tail",
]
