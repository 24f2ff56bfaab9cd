"""Readers for collective measurements, one table keyed by format.

=================  ==========================================================================
``nccl-tests``     the native text output of nccl-tests (``all_reduce_perf`` ...), with or
                   without an MPI prefix (``[1,0]<stdout>:``); ranks, hosts and the device
                   come from its header
``seed001-csv``    paper 001's ``<GPU>_<collective>_<dtype>_<nodes>_<gpus>.csv``
                   (``shape,nodes,GPUsPerNode,dur(us)``; ``shape`` counts elements)
``vtrain-lut``     vTrain's ``AR_GPU<n>_..._LUT`` all-reduce tables (ns)
``trainsim-bench`` our own ``trainsim bench comm`` JSONL rows
=================  ==========================================================================

A file is classified by its content, never by its name alone. Bad input raises
``TraceFormatError`` naming the file and the line or field. Times: nccl-tests reports an
out-of-place and an in-place time per size; by default (``timing="min"``) a row keeps the
smaller of the two, as benchmark noise only ever adds time (with one rank the in-place
all-reduce does nothing, so the out-of-place time is kept).
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from trainsim.comm.samples import CaseKey, CommDataset, CommSample
from trainsim.errors import ConfigError, TraceFormatError
from trainsim.ir.kinds import CollectiveKind as C

BENCH_SCHEMA = "trainsim.comm-bench/1"

_KIND_WORDS: dict[str, C] = {
    "all_reduce": C.ALL_REDUCE, "allreduce": C.ALL_REDUCE, "all_gather": C.ALL_GATHER,
    "allgather": C.ALL_GATHER, "reduce_scatter": C.REDUCE_SCATTER, "reducescatter": C.REDUCE_SCATTER,
    "alltoall": C.ALL_TO_ALL, "all_to_all": C.ALL_TO_ALL, "all_to_allv": C.ALL_TO_ALLV,
    "broadcast": C.BROADCAST, "reduce": C.REDUCE, "sendrecv": C.SEND, "p2p": C.SEND,
    "send": C.SEND, "recv": C.RECV,
}  # fmt: skip
_DTYPE_BYTES = {
    "fp16": 2,
    "bf16": 2,
    "half": 2,
    "fp32": 4,
    "float": 4,
    "fp64": 8,
    "double": 8,
    "int8": 1,
}


def kind_from_word(word: str) -> C | None:
    """A collective named the way benchmarks name them (``all_reduce_perf``, ``allgather_large``)."""
    w = word.lower().removesuffix("_perf")
    for key in sorted(_KIND_WORDS, key=len, reverse=True):
        if w == key or w.startswith(key + "_"):
            return _KIND_WORDS[key]
    return None


@dataclass(frozen=True, slots=True)
class FileRead:
    samples: list[CommSample]
    device: str | None = None
    warnings: tuple[str, ...] = ()  # odd but usable input, for the caller to say


# --- nccl-tests ------------------------------------------------------------------------------

# MPI output tags; interleaved output can splice one into the middle of a line.
_PREFIX = re.compile(r"\[\d+,\d+\]<std(?:out|err)>:|^\d+: ")
_RANK = re.compile(r"#\s+Rank\s+(\d+)\b.*?\bon\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]\s+(.+?)\s*$")
_MAX_BYTES = re.compile(r"\bmaxBytes\s+(\d+)")
_NGPUS = re.compile(r"nThread\s+(\d+)\s+nGpus\s+(\d+)")
_STARTING = re.compile(r"Collective test starting:\s*(\S+)")


def _sniff_nccl_tests(head: str) -> bool:
    return ("nThread" in head and "nGpus" in head) or ("out-of-place" in head and "busbw" in head)


def _ratio_kind(ratio: float, nranks: int, redop: str) -> C | None:
    """Which collective, from nccl-tests' busbw/algbw factor (NCCL's bus-bandwidth maths)."""
    if nranks < 2 or ratio <= 0:
        return None
    # one kind per distinct factor (all_gather and all_to_all share reduce_scatter's, reduce broadcast's)
    factors = {k: _bus_factor(k, nranks) or 0.0 for k in (C.ALL_REDUCE, C.REDUCE_SCATTER, C.BROADCAST)}
    best = min(factors, key=lambda k: abs(factors[k] - ratio))
    if abs(factors[best] - ratio) > 0.1 * factors[best]:
        return None
    if abs(factors[best] - 1.0) < 1e-9:
        # factor 1: broadcast (no op); reduce, sendrecv (which prints an op too) and, over 2 ranks,
        # all_reduce (an op): with an op the log leaves it open (its file name, or --kind, decides)
        return C.BROADCAST if redop in ("none", "n/a") else None
    if best is C.REDUCE_SCATTER and redop in ("none", "n/a"):
        return None  # all_gather and all_to_all share the factor: ambiguous
    return best


_REDUCING = frozenset({C.ALL_REDUCE, C.REDUCE_SCATTER, C.REDUCE})  # nccl-tests prints a redop for these
_REAL_OPS = ("sum", "prod", "max", "min", "avg", "mulsum", "premulsum")  # nccl-tests' op names


def _bus_factor(kind: C, nranks: int) -> float | None:
    """nccl-tests' busbw/algbw factor of ``kind`` over ``nranks`` (None: not one of its tests)."""
    if kind is C.ALL_REDUCE:
        return 2 * (nranks - 1) / nranks
    if kind in (C.REDUCE_SCATTER, C.ALL_GATHER, C.ALL_TO_ALL):
        return (nranks - 1) / nranks
    if kind in (C.BROADCAST, C.REDUCE):
        return 1.0
    return None


@dataclass(slots=True)
class _Run:
    """One nccl-tests run of a log: its header and its result rows (a log may hold several,
    one after the other: ``cat``-ed logs, or a job that ran the tests in turn)."""

    line: int  # where its header starts
    ranks: dict[int, str] = field(default_factory=dict)
    device: str | None = None
    per_proc: int = 1
    kind: C | None = None  # its "Collective test starting" line's
    columns: list[str] = field(default_factory=list)
    rows: list[tuple[int, list[str]]] = field(default_factory=list)
    max_bytes: int | None = None  # the header's maxBytes
    summary: bool = False  # the "# Avg bus bandwidth" footer
    failed: str | None = None  # its "# Out of bounds values : N FAILED" line


def _nccl_runs(path: Path) -> list[_Run]:
    runs = [_Run(1)]
    with path.open(encoding="utf-8", errors="replace") as fh:
        for lineno, raw in enumerate(fh, 1):
            line = _PREFIX.sub("", raw.rstrip("\r\n"))
            s = line.strip()
            if not s:
                continue
            run = runs[-1]
            if s.startswith("#"):
                header = _NGPUS.search(s) or _RANK.match(s) or _STARTING.search(s)
                if header and run.rows:  # a header after results: the next run
                    run = _Run(lineno)
                    runs.append(run)
                if m := _MAX_BYTES.search(s):
                    run.max_bytes = int(m.group(1))
                if s.startswith("# Avg bus bandwidth"):
                    run.summary = True
                if s.startswith("# Out of bounds values") and "FAILED" in s:
                    run.failed = s.lstrip("# ")
                if m := _NGPUS.search(s):
                    run.per_proc = int(m.group(1)) * int(m.group(2))
                elif m := _RANK.match(s):
                    run.ranks[int(m.group(1))] = m.group(2)
                    run.device = m.group(3)
                elif m := _STARTING.search(s):
                    run.kind = run.kind or kind_from_word(m.group(1))
                elif "size" in s and "count" in s and "type" in s:
                    run.columns = s.lstrip("#").split()
                continue
            if not s[0].isdigit():
                continue
            if not run.columns:
                raise TraceFormatError(path, f"line {lineno}: data row before the column header")
            run.rows.append((lineno, s.split()))
    return runs


def read_nccl_tests(path: Path, *, timing: str = "min", kind: C | None = None,
                    fallback: C | None = None) -> FileRead:  # fmt: skip
    """``kind``: the caller's --kind, checked against what the log says of itself; ``fallback``:
    a kind to take only when the log leaves it open (the other logs' one), checked against nothing.

    A log of several runs (a header after results starts the next) reads as those runs, each
    with its own ranks, hosts and collective, as if they were files of their own."""
    runs = _nccl_runs(path)
    if not any(r.rows for r in runs):
        raise TraceFormatError(
            path,
            "no nccl-tests result rows found (expected lines of size, count, type, ... time, algbw, busbw)",
        )
    if len(runs) > 1 and (empty := next((r for r in runs if not r.rows), None)) is not None:
        raise TraceFormatError(path, f"line {empty.line}: this log holds {len(runs)} nccl-tests runs, and the one "
                                     "whose header starts here has no result rows (it failed?): remove it, or "
                                     "split the log into one file per run")  # fmt: skip
    devices = {r.device for r in runs if r.device}
    if len({_norm_device(d) for d in devices}) > 1:
        raise TraceFormatError(path, f"its runs were measured on {' and '.join(sorted(devices))}: fit one system "
                                     "at a time (split the log)")  # fmt: skip
    samples: list[CommSample] = []
    warnings: list[str] = []
    for run in runs:
        where = f"the run at line {run.line}: " if len(runs) > 1 else ""
        samples.extend(_run_samples(path, run, where, timing=timing, given=kind, fallback=fallback))
        if run.failed:  # nccl-tests checks the results apart from timing them: the times may hold
            warnings.append(f"{path}: {where}nccl-tests' check of the results failed ({run.failed}): its times "
                            "are fitted all the same, but that NCCL setup computed wrong values")  # fmt: skip
    return FileRead(samples, next(iter(sorted(devices)), None), tuple(warnings))


def _run_samples(path: Path, run: _Run, where: str, *, timing: str, given: C | None,
                 fallback: C | None) -> list[CommSample]:  # fmt: skip
    """One run's rows as samples (``where``: which run, in a log of several)."""
    rows, columns, kind = run.rows, run.columns, given or run.kind
    largest = max((int(tok[0]) for _, tok in rows if tok[0].isdigit()), default=0)
    if not run.summary and run.max_bytes is not None and largest < run.max_bytes:
        raise TraceFormatError(path, f"{where}the log ends at {largest:,} bytes, before its header's maxBytes "
                                     f"{run.max_bytes:,}, and has no '# Avg bus bandwidth' summary: truncated (re-run, "
                                     "or trim the header's maxBytes to what was measured)")  # fmt: skip
    nranks = len(run.ranks) or run.per_proc
    nodes = len(set(run.ranks.values())) or 1
    # nccl-tests' binaries name the collective (all_gather_perf), which a saved log's name often
    # keeps: it decides what the bus-bandwidth factor leaves open (all_gather or all_to_all)
    name_kind = kind_from_word(path.name.split(".")[0])
    if nranks % nodes:
        raise TraceFormatError(path, f"{where}{nranks} ranks do not split evenly over {nodes} hosts")
    t_cols = [i for i, c in enumerate(columns) if c == "time"]
    try:
        i_size, i_alg, i_bus = columns.index("size"), columns.index("algbw"), columns.index("busbw")
    except ValueError as e:
        raise TraceFormatError(
            path, f"{where}column header lacks {e.args[0].split()[0]}: {' '.join(columns)}"
        ) from None
    if not t_cols:
        raise TraceFormatError(path, f"{where}column header has no 'time' column: {' '.join(columns)}")
    i_redop = columns.index("redop") if "redop" in columns else None
    first_ratio: float | None = None
    parsed: list[tuple[int, float, float, float | None]] = []
    for lineno, tok in rows:
        try:
            size = int(tok[i_size])
            oop = float(tok[t_cols[0]])
            ip = float(tok[t_cols[1]]) if len(t_cols) > 1 and len(tok) > t_cols[1] else None
            alg, bus = float(tok[i_alg]), float(tok[i_bus])
            ratio = bus / alg if alg > 0 else 0.0
        except (IndexError, ValueError):
            raise TraceFormatError(
                path, f"line {lineno}: cannot read size/time/algbw/busbw from {' '.join(tok)!r}"
            ) from None
        bad = next((c for c, v in (("time", oop), ("in-place time", ip), ("algbw", alg), ("busbw", bus))
                    if v is not None and not math.isfinite(v)), None)  # fmt: skip
        if bad is not None:
            raise TraceFormatError(path, f"line {lineno}: {bad} is not a finite number in {' '.join(tok)!r}")
        if oop <= 0 or size < 0:
            raise TraceFormatError(
                path, f"line {lineno}: non-positive time {oop} us or negative size"
            )
        if size >= 1 << 20 and first_ratio is None:
            first_ratio = ratio
            if kind is None:
                kind = _ratio_kind(ratio, nranks, tok[i_redop].lower() if i_redop is not None else "")
        parsed.append((lineno, size, oop, ip))
    want = _bus_factor(given, nranks) if given is not None and nranks > 1 else None
    if given is not None and want is not None and first_ratio and abs(first_ratio - want) > 0.1 * want:
        raise TraceFormatError(path, f"{where}--kind {given.value} contradicts the log: its busbw/algbw is "
                                     f"{first_ratio:.2f}, not {given.value}'s {want:.2f} over {nranks} ranks; drop "
                                     "--kind or give the collective it measured")  # fmt: skip
    if kind is None:
        kind = name_kind or fallback
    redop = rows[0][1][i_redop].lower() if i_redop is not None and len(rows[0][1]) > i_redop else ""
    # sendrecv_perf prints its (unused) op in the redop column; unknown tokens ("-") say nothing
    if (given is not None and given not in (C.SEND, C.RECV) and redop in (*_REAL_OPS, "none", "n/a")
            and (redop in ("none", "n/a")) == (given in _REDUCING)):  # fmt: skip
        does = "reduces (redop " + redop + ")" if redop not in ("none", "n/a") else "does not reduce (redop none)"
        raise TraceFormatError(path, f"{where}--kind {given.value} contradicts the log: it {does}; drop --kind or "
                                     "give the collective it measured")  # fmt: skip
    if kind is None:
        raise TraceFormatError(path, f"{where}cannot tell which collective this log measured (no 'Collective test starting' line, "
                               "no collective in the file name, ambiguous bus-bandwidth factor); give the collective (--kind all_reduce, ...; kind= in Python)")  # fmt: skip
    use_min = timing == "min" and nranks > 1
    gpn = nranks // nodes
    return [
        CommSample(
            kind,
            float(size),
            nodes,
            gpn,
            (min(oop, ip) if use_min and ip and ip > 0 else oop) * 1e-6,
            f"{path}:{ln}",
        )
        for ln, size, oop, ip in parsed
    ]


# --- paper 001 CSVs --------------------------------------------------------------------------

_SEED001_NAME = re.compile(
    r"^(?P<gpu>.+?)_(?P<func>[a-z0-9]+(?:_large)?)_(?P<dtype>fp16|bf16|fp32)(?:_(?P<nodes>\d+)_(?P<gpn>\d+))?\.csv$"
)
_SEED001_HEADER = ["shape", "nodes", "GPUsPerNode", "dur(us)"]


def _sniff_seed001(head: str) -> bool:
    # a header that starts like paper 001's is read as one, so that a missing or renamed column
    # gets the reader's "expected columns ..., got ..." rather than "not a known format"
    return head.lstrip("\ufeff").startswith("shape,")


def read_seed001_csv(path: Path, *, timing: str = "min", kind: C | None = None) -> FileRead:
    m = _SEED001_NAME.match(path.name)
    if m is None:
        raise TraceFormatError(
            path, "expected a name like <GPU>_<collective>_<dtype>_<nodes>_<gpus>.csv (paper 001)"
        )
    kind = kind or kind_from_word(m.group("func"))
    if kind is None:
        raise TraceFormatError(path, f"unknown collective {m.group('func')!r} in the file name")
    elem = _DTYPE_BYTES[m.group("dtype")]
    # ``shape`` is what each rank passes in. For all-gather that is its shard, so the gathered
    # output (the nccl-tests size, :mod:`trainsim.comm.sizing`) is group size x shape: paper
    # 001's DP_Allgather takes #Stage_Parameters/|dp| (001 §III-D), and on A100 1x4 at shapes
    # 1.1-1.2e9 the all-gather's fastest rows take 46.7 ms against a median 15.5 ms for the
    # all-reduce — 3.0x slower, which only ~4x the bytes explain (bus 154 vs 232 GB/s).
    gather = kind is C.ALL_GATHER
    samples: list[CommSample] = []
    with path.open(encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, [])
        if header != _SEED001_HEADER:
            raise TraceFormatError(
                path,
                f"line 1: expected columns {','.join(_SEED001_HEADER)}, got {','.join(header)}",
            )
        for lineno, row in enumerate(reader, 2):
            if not row:
                continue
            try:
                shape, nodes, gpn, dur_us = (float(v) for v in row)
            except ValueError:
                raise TraceFormatError(
                    path, f"line {lineno}: expected 4 numbers, got {row}"
                ) from None
            if not all(map(math.isfinite, (shape, nodes, gpn, dur_us))):
                raise TraceFormatError(path, f"line {lineno}: expected 4 finite numbers, got {row}")
            if shape <= 0 or dur_us <= 0 or nodes < 1 or gpn < 1:
                raise TraceFormatError(path, f"line {lineno}: non-positive value in {row}")
            samples.append(
                CommSample(
                    kind,
                    shape * elem * (nodes * gpn if gather else 1),
                    int(nodes),
                    int(gpn),
                    dur_us * 1e-6,
                    f"{path}:{lineno}",
                    m.group("func"),
                )
            )
    return FileRead(samples, m.group("gpu"))


@dataclass(frozen=True, slots=True)
class PaperError:
    """One row of paper 001's ``<GPU>.csv``: its regressor's validation error for one case."""

    series: str
    nodes: int
    gpus_per_node: int
    model: str
    error_pct: float


def read_seed001_errors(path: Path) -> list[PaperError]:
    """Paper 001's error table. Its ``Best_error%`` column holds fractions (0.768 = 76.8 %)."""
    out: list[PaperError] = []
    with path.open(encoding="utf-8-sig", newline="") as fh:
        reader = csv.DictReader(fh)
        for lineno, row in enumerate(reader, 2):
            try:
                out.append(PaperError(row["Function"], int(row["Nodes"]), int(row["GPUsPerNode"]),
                                      row["Best_model"], float(row["Best_error%"]) * 100.0))  # fmt: skip
            except (KeyError, TypeError, ValueError) as e:
                raise TraceFormatError(path, f"line {lineno}: cannot read field {e}") from None
    return out


# --- vTrain look-up tables -------------------------------------------------------------------

_VTRAIN_NAME = re.compile(r"AR_GPU(\d+)_")


def _sniff_vtrain(head: str) -> bool:
    return head.lstrip("\ufeff").startswith("size(B),count,type,time(ns)")


def read_vtrain_lut(path: Path, *, timing: str = "min", kind: C | None = None) -> FileRead:
    m = _VTRAIN_NAME.search(path.name)
    if m is None:
        raise TraceFormatError(path, "expected a vTrain LUT named AR_GPU<n>_..._LUT")
    n = int(m.group(1))
    samples: list[CommSample] = []
    with path.open(encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, [])
        t_cols = [i for i, c in enumerate(header) if c == "time(ns)"]
        if not header or header[0] != "size(B)" or not t_cols:
            raise TraceFormatError(
                path, f"line 1: expected size(B),count,type,time(ns),..., got {','.join(header)}"
            )
        for lineno, row in enumerate(reader, 2):
            if not row:
                continue
            try:
                size = float(row[0])
                times = [float(row[i]) for i in t_cols if i < len(row)]
            except ValueError:
                raise TraceFormatError(
                    path, f"line {lineno}: expected numbers, got {row}"
                ) from None
            if not times or not all(map(math.isfinite, (size, *times))):
                raise TraceFormatError(path, f"line {lineno}: expected finite numbers, got {row}")
            t_ns = min(times) if timing == "min" else times[0]
            if t_ns <= 0:
                raise TraceFormatError(path, f"line {lineno}: non-positive time {t_ns} ns")
            samples.append(
                CommSample(kind or C.ALL_REDUCE, size, 1, n, t_ns * 1e-9, f"{path}:{lineno}")
            )
    return FileRead(samples, None)


# --- trainsim bench JSONL --------------------------------------------------------------------


def _sniff_bench(head: str) -> bool:
    return BENCH_SCHEMA in head.splitlines()[0] if head.strip() else False


def read_bench_jsonl(path: Path, *, timing: str = "min", kind: C | None = None) -> FileRead:
    samples: list[CommSample] = []
    device = None
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if row.get("schema") != BENCH_SCHEMA:
                    raise ValueError(f"schema {row.get('schema')!r}")
                k = C(row["kind"])
                for f in ("nbytes", "duration_s"):
                    if not math.isfinite(float(row[f])):
                        raise ValueError(f"{f} {row[f]!r} is not a finite number")
                samples.append(CommSample(k, float(row["nbytes"]), int(row["nodes"]), int(row["gpus_per_node"]),
                                          float(row["duration_s"]), f"{path}:{lineno}", row.get("backend", "")))  # fmt: skip
                device = row.get("device", device)
            except (ValueError, KeyError, TypeError) as e:
                raise TraceFormatError(
                    path, f"line {lineno}: not a {BENCH_SCHEMA} row ({e})"
                ) from None
    return FileRead(samples, device)


# --- the table -------------------------------------------------------------------------------

Reader = Callable[..., FileRead]


@dataclass(frozen=True, slots=True)
class Format:
    name: str
    sniff: Callable[[str], bool]
    read: Reader


FORMATS: tuple[Format, ...] = (
    Format("trainsim-bench", _sniff_bench, read_bench_jsonl),
    Format("seed001-csv", _sniff_seed001, read_seed001_csv),
    Format("vtrain-lut", _sniff_vtrain, read_vtrain_lut),
    Format("nccl-tests", _sniff_nccl_tests, read_nccl_tests),
)


def sniff_format(path: Path) -> Format | None:
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            head = fh.read(8192)
    except OSError as e:
        raise TraceFormatError(path, f"cannot read ({e.strerror})") from None
    return next((f for f in FORMATS if f.sniff(head)), None)


def _expand(paths: Iterable[Path]) -> list[tuple[Path, bool]]:
    """(file, named explicitly) for files and the files inside folders (recursively, sorted)."""
    out: dict[Path, tuple[Path, bool]] = {}  # by resolved path: a file given twice is read once
    for p in paths:
        if p.is_dir():
            for f in sorted(p.rglob("*")):
                if f.is_file() and not f.name.startswith("."):
                    out.setdefault(f.resolve(), (f, False))
        elif p.is_file():
            r = p.resolve()
            out[r] = (out[r][0], True) if r in out else (p, True)  # named explicitly: its errors are said
        else:
            raise TraceFormatError(p, "no such file or folder")
    return list(out.values())


def _is_seed001_aggregate(path: Path) -> bool:
    """Paper 001's per-collective aggregate CSVs repeat the per-configuration files."""
    m = _SEED001_NAME.match(path.name)
    return m is not None and m.group("nodes") is None


def read_comm_dataset(paths: Iterable[Path | str], *, name: str | None = None, timing: str = "min",
                      kind: C | None = None) -> CommDataset:  # fmt: skip
    """Read collective measurements from files and folders into one dataset.

    Inside folders, files of no known format (READMEs, paper 001's error tables) and paper
    001's aggregate CSVs (which repeat its per-configuration files) are skipped; a file
    named explicitly must be readable. An nccl-tests log whose collective cannot be told
    (one rank) takes the collective of the other logs beside it.
    """
    if timing not in ("min", "out-of-place"):
        raise ConfigError(f"timing must be 'min' or 'out-of-place', got {timing!r}")
    plist = [Path(p) for p in paths]
    if not plist:
        raise TraceFormatError("(no paths)", "give at least one dataset file or folder")
    ds = CommDataset(
        name or _dataset_name(plist), system_hint=" ".join(str(p.resolve()) for p in plist)
    )
    deferred: list[Path] = []
    sources: dict[CaseKey, tuple[Path, str | None]] = {}  # each case's first folder and device
    for path, explicit in _expand(plist):
        try:
            fmt = sniff_format(path)
        except UnicodeDecodeError as e:
            raise TraceFormatError(path, f"not UTF-8 text (byte {e.start})") from None
        if fmt is None or (
            not explicit and fmt.name == "seed001-csv"
            # in a folder scan, a CSV is paper 001's by its name too (a stray "shape,..." CSV is not)
            and (_is_seed001_aggregate(path) or not _SEED001_NAME.match(path.name))
        ):
            if explicit and fmt is None:
                raise TraceFormatError(
                    path,
                    "not a known collective-benchmark format: trainsim-bench JSON lines (`trainsim bench comm`), "
                    f"paper 001's CSV (header {','.join(_SEED001_HEADER)}), vTrain's LUT "
                    "(size(B),count,type,time(ns),...) or an nccl-tests log",
                )
            continue
        try:
            got = fmt.read(path, timing=timing, kind=kind)
        except UnicodeDecodeError as e:
            raise TraceFormatError(path, f"not UTF-8 text (byte {e.start})") from None
        except TraceFormatError as e:
            if fmt.name == "nccl-tests" and "cannot tell which collective" in e.problem:
                deferred.append(path)
                continue
            raise
        _check_same_setup(path, got, sources, ds.device)
        ds.extend(got.samples)
        ds.warnings.extend(got.warnings)
        ds.device = ds.device or got.device
        ds.formats.add(fmt.name)
    if deferred:
        kinds = {s.kind for s in ds.samples}
        if len(kinds) != 1:
            raise TraceFormatError(
                deferred[0], "cannot tell which collective this log measured; give the collective (--kind all_reduce, ...; kind= in Python)"
            )
        for path in deferred:
            got = read_nccl_tests(path, timing=timing, fallback=next(iter(kinds)))
            ds.extend(got.samples)
            ds.warnings.extend(got.warnings)
            ds.formats.add("nccl-tests")
    if not ds.samples:
        raise TraceFormatError(plist[0], "no collective measurements found")
    return ds


def _check_same_setup(path: Path, got: FileRead, sources: dict[CaseKey, tuple[Path, str | None]],
                      device: str | None) -> None:  # fmt: skip
    """One dataset is one system: files stating different devices, or two folders measuring the
    same case (collective, nodes, GPUs per node) without both naming the same device, are
    refused rather than pooled into one curve (vTrain's A100 and V100 tables fitted together
    as one 2-GPU all-reduce)."""
    if got.device and device and _norm_device(got.device) != _norm_device(device):
        raise TraceFormatError(path, f"measured on {got.device}, but other inputs on {device}: fit one system at a time")
    for key in {CaseKey(x.kind, x.nodes, x.gpus_per_node) for x in got.samples}:
        folder, first_device = sources.setdefault(key, (path.parent, got.device))
        if folder != path.parent and not (got.device and first_device):
            raise TraceFormatError(path, f"{key.label} is measured in {folder} too, and the two do not both name one device "
                                         "(the same system): fit one system (one folder) at a time")  # fmt: skip


def _norm_device(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def _dataset_name(paths: list[Path]) -> str:
    p = paths[0].resolve()
    given = list(dict.fromkeys(x.resolve() for x in paths))  # the paths that add data: a repeat, or a
    folders = [g for g in given if g.is_dir()]  # file inside a given folder (in any order), adds none
    paths = [q for q in given if not any(f in q.parents for f in folders)]
    base = p if p.is_dir() else p.parent
    if base.name in ("nccl", "comm", "data") and base.parent.name:
        base = base.parent / f"{base.parent.name}-{base.name}"
    return (
        base.name
        if len(paths) == 1 or all(q.resolve().parent == p.parent for q in paths)
        else f"{base.name}+{len(paths) - 1}"
    )
