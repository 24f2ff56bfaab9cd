"""Readers for kernel measurements, one table keyed by format, and our own dataset format.

=================  ==========================================================================
``seed001-op``     paper 001's ``<GPU>_<op>_<dtype>.csv``: Table I inputs (``mp,b,l,dim``...)
                   then ``F_dur(us),B_dur(us)`` (forward, backward) or ``dur(us)`` (one
                   optimizer step); microseconds. One row gives one sample per phase.
``kernel-jsonl``   our dataset, JSON lines of schema ``trainsim.kernel-bench/1`` (below)
``kernel-csv``     the same rows as CSV: ``op,phase,duration_s`` [``family,dtype,device,
                   fingerprint,repeats,statistic``] and one column per operator input
=================  ==========================================================================

Our format, one measurement per line (``write_kernel_dataset`` writes it)::

    {"schema": "trainsim.kernel-bench/1", "device": "NVIDIA A100-SXM4-80GB",
     "fingerprint": "3f2a9c...", "family": "gemm", "op": "gemm", "phase": "fwd",
     "dtype": "fp16", "features": {"batch": 1, "m": 4096, "n": 4096, "k": 4096},
     "duration_s": 0.000512, "repeats": 20, "statistic": "median"}

``op`` names an operator of :data:`trainsim.kernels.features.OPS` and ``features`` holds its
inputs; ``family`` may be left out (the operator's); ``fingerprint`` identifies the machine and
software stack (``trainsim.bench.comm.device_fingerprint``); extra keys (``samples_s``,
``timestamp``, ``host``) are kept out of the fit. A file is classified by its content, never by
its name alone; bad input raises ``TraceFormatError`` naming the file and line.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainsim.errors import ModelError, TraceFormatError
from trainsim.ir.kinds import KernelFamily
from trainsim.kernels.features import DEFAULT_DTYPE, GEMM_VARIANT, Phase, canonical_dtype, op_spec
from trainsim.kernels.samples import EntryKey, KernelDataset, KernelSample

SCHEMA = "trainsim.kernel-bench/1"
_PHASE_COLUMNS = {
    "F_dur(us)": Phase.FWD,
    "B_dur(us)": Phase.BWD,
    "dur(us)": Phase.STEP,
    "dur": Phase.STEP,
}
_OURS_META = ("schema", "device", "fingerprint", "family", "op", "phase", "dtype", "duration_s",
              "repeats", "statistic")  # fmt: skip


@dataclass(frozen=True, slots=True)
class FileRead:
    samples: list[KernelSample]
    device: str | None = None
    fingerprint: str | None = None
    setups: frozenset[tuple[str, int | None]] = frozenset()  # (fingerprint, threads) of bench rows


@dataclass(frozen=True, slots=True)
class Format:
    name: str
    sniff: Callable[[str], bool]  # first line of the file -> is it this format?
    read: Callable[[Path], FileRead]


@dataclass(frozen=True, slots=True)
class PaperError:
    """One row of paper 001's ``<GPU>.csv``: its chosen regressor's validation error."""

    op: str
    phase: Phase
    model: str
    error_pct: float


def _sample(path: Path, lineno: int, *, op: str, phase: Phase, dtype: str, features: dict[str, float],
            duration_s: float, family: str | None = None, repeats: int = 1, statistic: str = "mean",
            spread: float | None = None) -> KernelSample:  # fmt: skip
    where = f"{path}:{lineno}"
    try:
        spec = op_spec(op)
        key = EntryKey(op, phase, canonical_dtype(dtype))
    except ModelError as e:
        raise TraceFormatError(path, f"line {lineno}: {e}") from None
    expected = spec.family_for(phase)
    if family is not None and family != expected.value:
        raise TraceFormatError(path, f"line {lineno}: operator {op} {phase.value} belongs to family "
                               f"{expected.value}, not {family!r}")  # fmt: skip
    unknown = sorted(set(features) - set(spec.inputs))
    if unknown:
        raise TraceFormatError(path, f"line {lineno}: {op} has no input(s) {unknown} "
                               f"(inputs: {', '.join(spec.inputs)})")  # fmt: skip
    for name, v in features.items():  # as the fit's inputs are checked, but here with the line
        if name in spec.flags:
            if v not in (0, 1):
                raise TraceFormatError(path, f"line {lineno}: input {name!r} of {op} is a 0/1 flag, got {v!r}")
        elif not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
            raise TraceFormatError(path, f"line {lineno}: input {name!r} of {op} must be a positive number, got {v!r}")
    if not (duration_s > 0 and duration_s < float("inf")):
        raise TraceFormatError(
            path, f"line {lineno}: duration must be positive, got {duration_s!r}"
        )
    return KernelSample(expected, key, features, duration_s, where, repeats, statistic, spread)


def _spread(samples: Any) -> float | None:
    """The bench's repeat spread (:func:`~trainsim.bench.dataset.relative_iqr`) of a row's
    ``samples_s``; None without two of them or without a positive median."""
    from trainsim.bench.dataset import relative_iqr

    if not isinstance(samples, list) or len(samples) < 2:
        return None
    v = relative_iqr(samples)
    return v if math.isfinite(v) else None


# --- paper 001 ---------------------------------------------------------------------------------

_SEED001_NAME = re.compile(r"^(?P<gpu>[^_]+)_(?P<op>.+)_(?P<dtype>fp16|bf16|fp32)$")


_COLLECTIVE_COLUMNS = {"nodes", "GPUsPerNode"}  # paper 001's NCCL CSVs: shape, nodes, GPUsPerNode, dur(us)


def _sniff_seed001(first: str) -> bool:
    cols = [c.strip() for c in first.split(",")]
    # the NCCL CSVs share the duration column: collective timings, not operators
    return bool(set(cols) & set(_PHASE_COLUMNS)) and "duration_s" not in cols and not set(cols) >= _COLLECTIVE_COLUMNS


def read_seed001_operator(path: Path) -> FileRead:
    """One of paper 001's per-operator CSVs (µs converted to seconds)."""
    m = _SEED001_NAME.match(path.stem)
    if m is None:
        raise TraceFormatError(path, "expected a name like <GPU>_<op>_<dtype>.csv (paper 001)")
    op, dtype = m["op"], m["dtype"]
    out: list[KernelSample] = []
    with path.open(encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(fh)
        header = [h.strip() for h in next(reader, [])]
        phases = {i: _PHASE_COLUMNS[h] for i, h in enumerate(header) if h in _PHASE_COLUMNS}
        inputs = {i: h for i, h in enumerate(header) if i not in phases}
        try:
            known = set(op_spec(op).inputs)
        except ModelError:
            known = None  # _sample names the unknown operator
        stray = [h for h in inputs.values() if known is not None and h not in known]
        if stray:  # a renamed duration column would otherwise be named as an input on line 2
            raise TraceFormatError(path, f"line 1: header column(s) {', '.join(map(repr, stray))} are neither inputs of "
                                         f"{op} ({', '.join(sorted(known or ()))}) nor durations "
                                         f"({', '.join(_PHASE_COLUMNS)})")  # fmt: skip
        for lineno, row in enumerate(reader, 2):
            if not row or not "".join(row).strip():
                continue
            try:
                values = [float(v) for v in row]
            except ValueError:
                raise TraceFormatError(path, f"line {lineno}: not a number in {row}") from None
            if len(values) != len(header):
                raise TraceFormatError(
                    path, f"line {lineno}: {len(values)} fields, header has {len(header)}"
                )
            feats = {name: values[i] for i, name in inputs.items()}
            for i, phase in phases.items():
                out.append(_sample(path, lineno, op=op, phase=phase, dtype=dtype, features=feats,
                                   duration_s=values[i] * 1e-6, statistic="mean-of-middle-5"))  # fmt: skip
    return FileRead(out, m["gpu"])


def read_seed001_errors(path: Path) -> list[PaperError]:
    """Paper 001's ``<GPU>.csv``; its ``Best_error%`` column holds fractions (0.119 = 11.9 %)."""
    out: list[PaperError] = []
    with path.open(encoding="utf-8-sig", newline="") as fh:
        for lineno, row in enumerate(csv.DictReader(fh), 2):
            try:
                phase = _PHASE_COLUMNS.get(row["Propagation"] + "(us)") or Phase(row["Propagation"])
                out.append(PaperError(row["Function"], phase, row["Best_model"],
                                      float(row["Best_error%"]) * 100.0))  # fmt: skip
            except (KeyError, TypeError, ValueError) as e:
                raise TraceFormatError(path, f"line {lineno}: cannot read field {e}") from None
    return out


# --- ours ------------------------------------------------------------------------------------


def _sniff_jsonl(first: str) -> bool:
    return SCHEMA in first


def _sniff_csv(first: str) -> bool:
    cols = {c.strip() for c in first.split(",")}
    return {"op", "phase", "duration_s"} <= cols


def _open_text(path: Path, encoding: str = "utf-8", **kw: Any) -> Any:
    """``path`` opened as text; ``*.gz`` files (a shipped dataset, compressed) through gzip."""
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding=encoding, **kw)
    return path.open(encoding=encoding, **kw)


def read_kernel_jsonl(path: Path) -> FileRead:
    out: list[KernelSample] = []
    device = fingerprint = None
    setups: set[tuple[str, int | None]] = set()
    with _open_text(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if row.get("schema") != SCHEMA:
                    raise ValueError(f"schema {row.get('schema')!r}")
                feats = {str(k): float(v) for k, v in row["features"].items()}
                if row["op"] == "gemm" and "bias" not in feats and row.get("bench_op") in GEMM_VARIANT:
                    # rows measured before the variant inputs: the call they timed says it
                    feats.update({k: float(v) for k, v in GEMM_VARIANT[row["bench_op"]].items()})
                out.append(_sample(path, lineno, op=row["op"], phase=Phase(row["phase"]),
                                   dtype=row.get("dtype", DEFAULT_DTYPE), features=feats,
                                   duration_s=float(row["duration_s"]), family=row.get("family"),
                                   repeats=int(row.get("repeats", 1)), statistic=str(row.get("statistic", "mean")),
                                   spread=_spread(row.get("samples_s"))))  # fmt: skip
            except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
                raise TraceFormatError(path, f"line {lineno}: not a {SCHEMA} row ({e})") from None
            device = device or row.get("device")
            fingerprint = fingerprint or row.get("fingerprint")
            if row.get("fingerprint"):
                threads = row.get("threads")
                setups.add((str(row["fingerprint"]), threads if isinstance(threads, int) else None))
    return FileRead(out, device, fingerprint, frozenset(setups))


def read_kernel_csv(path: Path) -> FileRead:
    out: list[KernelSample] = []
    device = fingerprint = None
    with path.open(encoding="utf-8-sig", newline="") as fh:
        for lineno, row in enumerate(csv.DictReader(fh), 2):
            try:
                feats = {
                    k: float(v)
                    for k, v in row.items()
                    if k not in _OURS_META and v not in ("", None)
                }
                out.append(_sample(path, lineno, op=row["op"], phase=Phase(row["phase"]),
                                   dtype=row.get("dtype") or DEFAULT_DTYPE, features=feats,
                                   duration_s=float(row["duration_s"]), family=row.get("family") or None,
                                   repeats=int(row.get("repeats") or 1), statistic=row.get("statistic") or "mean"))  # fmt: skip
            except (KeyError, TypeError, ValueError) as e:
                raise TraceFormatError(path, f"line {lineno}: cannot read field ({e})") from None
            device = device or row.get("device") or None
            fingerprint = fingerprint or row.get("fingerprint") or None
    return FileRead(out, device, fingerprint)


def kernel_rows(ds: KernelDataset) -> Iterable[dict[str, Any]]:
    """The dataset as rows of our JSONL format."""
    for s in ds.samples:
        yield {"schema": SCHEMA, "device": ds.device, "fingerprint": ds.fingerprint,
               "family": s.family.value, "op": s.key.op, "phase": s.key.phase.value,
               "dtype": s.key.dtype, "features": s.features, "duration_s": s.duration_s,
               "repeats": s.repeats, "statistic": s.statistic, "origin": s.origin}  # fmt: skip


def write_kernel_dataset(ds: KernelDataset, path: Path | str) -> Path:
    """Write ``ds`` as our JSONL format, atomically (temporary file, then rename)."""
    p = Path(path)
    buf = io.StringIO()
    for row in kernel_rows(ds):
        buf.write(json.dumps(row) + "\n")
    from trainsim.ir.serialize import write_text_atomic

    write_text_atomic(p, buf.getvalue())
    return p


# --- the table -------------------------------------------------------------------------------

FORMATS: tuple[Format, ...] = (
    Format("kernel-jsonl", _sniff_jsonl, read_kernel_jsonl),
    Format("kernel-csv", _sniff_csv, read_kernel_csv),
    Format("seed001-op", _sniff_seed001, read_seed001_operator),
)


def sniff_format(path: Path) -> Format | None:
    try:
        with _open_text(path, encoding="utf-8-sig", errors="replace") as fh:
            first = fh.readline()
    except (OSError, EOFError) as e:
        raise TraceFormatError(path, f"cannot read: {getattr(e, 'strerror', None) or e}") from None
    return next((f for f in FORMATS if f.sniff(first)), None)


def _expand(paths: list[Path]) -> list[tuple[Path, bool]]:
    out: list[tuple[Path, bool]] = []
    for p in paths:
        if p.is_dir():
            out += [
                (f, False)
                for f in sorted(p.rglob("*"))
                if f.is_file() and (f.suffix in (".csv", ".jsonl") or f.name.endswith(".jsonl.gz"))
            ]
        elif p.is_file():
            out.append((p, True))
        else:
            raise TraceFormatError(p, "no such file or folder")
    return out


def dataset_name(paths: list[Path]) -> str:
    """The folder's name (``<parent>-operator`` for 001's ``operator`` folders), else the file's stem."""
    p = paths[0].resolve()
    if p.is_file():
        if p.name.endswith(".jsonl.gz"):
            return p.name[: -len(".jsonl.gz")]
        return (
            p.stem
            if p.suffix == ".jsonl" or p.parent.name != "operator"
            else f"{p.parent.parent.name}-operator"
        )
    return f"{p.parent.name}-{p.name}" if p.name == "operator" and p.parent.name else p.name


def _is_kernel_export(path: Path) -> bool:
    """Whether ``path`` starts like :func:`trainsim.analyze.samples.export_kernel_samples`'s CSV
    or JSON lines."""
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            head = f.readline()
    except OSError:
        return False
    return head.startswith("device,rank,family,kernel,op,") or ('"family"' in head and '"kernel"' in head
                                                                and '"input_shapes"' in head)  # fmt: skip


def _is_collective_csv(path: Path) -> bool:
    """Whether ``path`` starts like paper 001's NCCL CSVs (``shape,nodes,GPUsPerNode,dur(us)``)."""
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            return {c.strip() for c in f.readline().lstrip("\ufeff").split(",")} >= _COLLECTIVE_COLUMNS
    except OSError:
        return False


def read_kernel_dataset(paths: Iterable[Path | str], *, name: str | None = None,
                        ops: Iterable[str] | None = None) -> KernelDataset:  # fmt: skip
    """Read kernel measurements from files and folders into one dataset.

    Inside folders, files of no known format (READMEs, paper 001's error tables) are skipped; a
    file named explicitly must be readable. ``ops`` keeps only those operators' rows."""
    plist = [Path(p) for p in paths]
    if not plist:
        raise TraceFormatError("(no paths)", "give at least one dataset file or folder")
    keep = set(ops) if ops is not None else None
    seen: set[str] = set()  # every operator the inputs hold (for an --op that matches none)
    ds = KernelDataset(name or dataset_name(plist))
    passed: list[Path] = []  # files inside folders of no known format (said when nothing is read)
    for path, explicit in _expand(plist):
        try:
            fmt = sniff_format(path)
        except UnicodeDecodeError as e:
            raise TraceFormatError(path, f"not UTF-8 text (byte {e.start})") from None
        if fmt is None:
            if explicit:
                what = f"not a known kernel-measurement format ({', '.join(f.name for f in FORMATS)})"
                if _is_collective_csv(path):  # paper 001's NCCL timings sit beside its operators
                    what = "collective timings (paper 001's NCCL CSV), not operators: fit them with `trainsim fit-comm`"
                elif _is_kernel_export(path):
                    what = ("kernel samples that `trainsim analyze --export-kernels` wrote (one row per traced kernel, "
                            "no operator inputs): `trainsim fit` reads operator measurements, as `trainsim bench` "
                            "writes them (docs/kernels.md, Datasets)")  # fmt: skip
                raise TraceFormatError(path, what)
            passed.append(path)
            continue
        if keep is not None and fmt.name == "seed001-op":
            m = _SEED001_NAME.match(path.stem)
            if m is not None and m["op"] not in keep:
                seen.add(m["op"])
                continue
        try:
            got = fmt.read(path)
        except UnicodeDecodeError as e:
            raise TraceFormatError(path, f"not UTF-8 text (byte {e.start})") from None
        seen.update(s.key.op for s in got.samples)
        rows = [s for s in got.samples if keep is None or s.key.op in keep]
        ds.extend(rows)
        if got.device and ds.device and got.device != ds.device:
            raise TraceFormatError(
                path,
                f"measured on {got.device}, but other files on {ds.device}; fit one device at a time",
            )
        ds.device = ds.device or got.device
        ds.fingerprint = ds.fingerprint or got.fingerprint
        ds.setups |= got.setups
        ds.formats.add(fmt.name)
    if not ds.samples and keep is not None and seen:
        raise TraceFormatError(plist[0], f"no rows of operator(s) {', '.join(sorted(keep))}; the data hold "
                                         f"{', '.join(sorted(seen))}")  # fmt: skip
    if not ds.samples:
        why = ""
        if passed:
            first = _first_line(passed[0])
            why = (f": {len(passed)} file(s) of no known format skipped, e.g. {passed[0].name}"
                   + (f" (header {first!r})" if first else "")
                   + "; expected paper 001's operator CSVs (<GPU>_<op>_<dtype>.csv with inputs, then F_dur(us),"
                   "B_dur(us) or dur(us)) or the JSONL rows `trainsim bench` writes")  # fmt: skip
        raise TraceFormatError(plist[0], f"no kernel measurements found{why}")
    return ds


def _first_line(path: Path) -> str:
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            return f.readline().strip()[:80]
    except OSError:
        return ""


def family_of(op: str, phase: Phase) -> KernelFamily:
    return op_spec(op).family_for(phase)
