"""Export kernel samples from any trace, so traces users already have become calibration data.

Each row is one measured kernel with its family (a collective's is ``nccl_<kind>`` whatever ran
it; ``backend`` says gloo for one a CPU thread ran, nccl for a device's: NCCL or RCCL), the launching op and its input shapes
(from Kineto ``record_shapes`` or a linked execution trace) and launch geometry (``grid``: the
kernel's blocks in all, ``block``: its threads per block). Written atomically as CSV (missing
values empty, shapes as JSON text), JSON lines (missing values null, shapes as lists) or Parquet,
so pandas and spreadsheets read it without code. ``trainsim fit`` does not: it fits operator
measurements keyed by their inputs, as ``trainsim bench`` writes them, and says so when given
one of these files.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainsim.errors import ConfigError
from trainsim.ir.graph import Workload
from trainsim.ir.serialize import write_bytes_atomic, write_text_atomic

COLUMNS = (
    "device", "rank", "family", "kernel", "op", "stream", "duration_s", "input_shapes",
    "input_dtypes", "grid", "block", "bytes", "collective", "collective_bytes", "group_size", "backend",
)  # fmt: skip


def kernel_samples(w: Workload) -> Iterator[dict[str, Any]]:
    for r in w.ranks:
        device = r.device or str(w.metadata.get("device", ""))
        for op in r.ops:
            shapes = json.dumps([list(t.shape) for t in op.inputs])
            dtypes = json.dumps([t.dtype for t in op.inputs])
            for k in op.kernels:
                if k.duration_s is None:
                    continue
                c = k.collective
                yield {
                    "device": device, "rank": r.rank, "family": k.family.value, "kernel": k.name,
                    "op": op.name, "stream": k.stream, "duration_s": k.duration_s,
                    "input_shapes": shapes, "input_dtypes": dtypes,
                    "grid": k.features.get("grid", ""), "block": k.features.get("block", ""),
                    "bytes": k.features.get("bytes", ""),
                    "collective": c.kind.value if c else "", "collective_bytes": c.bytes if c else "",
                    "group_size": c.group_size if c else "",
                    # the IR family of a collective is nccl_<kind> whatever ran it: gloo's run on CPU threads
                    "backend": ("gloo" if k.on_host else "nccl") if c else "",
                }  # fmt: skip


_MARK = ("device", "rank", "family", "kernel", "op", "stream", "duration_s")  # what every export version opens with


SUFFIXES = (".csv", ".jsonl", ".parquet")  # the formats kernel samples are written in


def samples_target(path: str | Path, flag: str = "--export-kernels") -> None:
    """Refuse a samples path of the wrong suffix, or one that holds a file other than an empty
    one or an earlier kernel-samples export (a user's CSV or Parquet would be replaced)."""
    p = Path(path).expanduser()
    if p.suffix.lower() not in SUFFIXES:
        raise ConfigError(
            f"{p}: kernel samples are written as .csv, .jsonl or .parquet, got {p.suffix or 'no suffix'!r}"
        )
    if p.is_dir():
        raise ConfigError(f"{flag} {path}: is a folder; give a file path")
    if not p.is_file() or p.stat().st_size == 0:
        return
    if not _is_samples_export(p):
        raise ConfigError(f"{flag} {path}: exists and is not a kernel-samples export trainsim wrote; "
                          "remove it or write elsewhere")  # fmt: skip


def _is_samples_export(p: Path) -> bool:
    try:
        if p.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            names: list[str] = list(pq.read_schema(p).names)
        else:
            with p.open("r", encoding="utf-8", errors="replace") as f:
                first = f.readline()
            if p.suffix.lower() == ".jsonl":
                doc = json.loads(first)
                names = list(doc) if isinstance(doc, dict) else []
            else:
                names = next(csv.reader([first]), [])
    except (OSError, ValueError, ImportError):  # unreadable as an export of that format: not one
        return False
    return tuple(names[: len(_MARK)]) == _MARK


def export_kernel_samples(w: Workload, path: str | Path) -> int:
    """Write the samples as CSV (``.csv``), JSON lines (``.jsonl``) or Parquet (``.parquet``,
    needs pyarrow); returns the row count. An existing file is replaced only when it is an
    earlier export (:func:`samples_target`)."""
    p = Path(path)
    samples_target(p)
    rows = list(kernel_samples(w))
    if p.suffix.lower() == ".parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise ConfigError(
                f"{p}: writing Parquet needs pyarrow (pip install pyarrow), or use .csv"
            ) from None
        # CSV writes a missing value as ""; a Parquet column has one type, so missing is null
        cols = {c: [None if r[c] == "" else r[c] for r in rows] for c in COLUMNS}
        buf = pa.BufferOutputStream()
        try:
            pq.write_table(pa.table(cols), buf)
        except pa.ArrowException as e:
            raise ConfigError(f"{p}: cannot write Parquet ({e})") from None
        write_bytes_atomic(p, buf.getvalue().to_pybytes())
        return len(rows)
    if p.suffix.lower() == ".jsonl":
        # plain JSON: missing values null, shapes and dtypes as lists (CSV keeps them as text)
        def plain(r: dict[str, Any]) -> dict[str, Any]:
            out = {c: None if r[c] == "" else r[c] for c in COLUMNS}
            out["input_shapes"], out["input_dtypes"] = json.loads(r["input_shapes"]), json.loads(r["input_dtypes"])
            return out

        text = "".join(json.dumps(plain(r)) + "\n" for r in rows)
    else:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
        text = buf.getvalue()
    write_text_atomic(p, text)
    return len(rows)


__all__ = ["COLUMNS", "export_kernel_samples", "kernel_samples"]
