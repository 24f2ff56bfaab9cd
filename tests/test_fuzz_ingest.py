"""Fuzzing ingestion with corrupted real traces (Hypothesis, derandomized, ~20 s in total).

Policy (docs/ingestion.md, "Corrupt input"): ``load_traces`` either raises a ``TraceFormatError``
(or a subclass) or returns a workload; never another exception. What a returned workload may be:

* compressed input (``.json.gz``, ``.tar.gz``): CRC-32 and length checks cover every byte, so a
  corrupted or truncated file is an error, or (a flipped bit in an unchecked gzip header field
  such as the modification time) the result is identical to the original's;
* truncated JSON is always an error;
* raw JSON with a changed byte or a wrong-typed value: an error, or a workload that satisfies
  every structural invariant below. A changed digit that leaves a plausible value (a kernel
  3 µs longer) is indistinguishable from a real trace; only checksums (gzip) catch those.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import tarfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainsim.errors import TraceFormatError
from trainsim.ingest import LoadedTraces, load_traces
from trainsim.ingest.kineto import LAUNCH_SKEW_S, MAX_TIME_RANGE_S

from .conftest import SHARED_DATA

TRACES = SHARED_DATA / "traces"
# Small real traces covering CUDA + cuda_sync, ROCm, Triton, CPU-only (gloo), sampled, NCCL.
SMALL = [
    "hta_critical_path/cuda_event_sync/event_sync_trace.json.gz",
    "hta_critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz",
    "hta_misc/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "hta_misc/triton_example.json.gz",
    "hta_misc/benchmark_simple_add_trace.json.gz",
    "hta_misc/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
]
DLRM = "param_dlrm_8xv100/dlrm_kineto.tar.gz"  # 8 ranks with NCCL annotations (~0.9 MB each)

pytestmark = [pytest.mark.shared_data, pytest.mark.slow]
FUZZ = settings(
    derandomize=True, deadline=None, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)  # fmt: skip
TOL_S = 2e-6  # seconds: workload times are relative to an origin held in float seconds


def check_invariants(loaded: LoadedTraces) -> list[str]:
    """Structural facts every workload built from a trace must satisfy (empty list: all hold)."""
    problems: list[str] = []
    for r in loaded.workload.ranks:
        trace, window = loaded.traces[r.rank], loaded.chosen[r.rank]
        ws = window.start * trace.unit_to_s - loaded.origin
        we = window.end * trace.unit_to_s - loaded.origin
        step = r.measured_step_s
        if step is None and r.metadata.get("sampled"):
            pass  # sampled/cut traces report no step time by design
        elif step is None or not (math.isfinite(step) and 0 <= step <= 2 * MAX_TIME_RANGE_S):
            problems.append(f"rank {r.rank}: step time {step}")
        for op in r.ops:
            if not (ws - TOL_S <= op.start_s <= we + TOL_S):  # type: ignore[operator]
                problems.append(
                    f"op {op.name} starts at {op.start_s} outside its step [{ws}, {we}]"
                )
            if not (op.duration_s is not None and 0 <= op.duration_s < math.inf):
                problems.append(f"op {op.name} duration {op.duration_s}")
            problems += [
                f"op {op.name} input shape {t.shape}"
                for t in op.inputs
                if min(t.shape, default=0) < 0
            ]
            for k in op.kernels:
                problems += _kernel_problems(k, ws, we, r.step_end_s)
    return problems


def _kernel_problems(k: Any, ws: float, we: float, step_end: float | None) -> list[str]:
    out = []
    if not (k.duration_s is not None and 0 <= k.duration_s < math.inf):
        out.append(f"kernel {k.name} duration {k.duration_s}")
    if not (ws - TOL_S <= k.launch_start_s <= we + TOL_S):
        out.append(f"kernel {k.name} launched at {k.launch_start_s} outside its step")
    if k.start_s < k.launch_start_s - LAUNCH_SKEW_S - TOL_S:
        out.append(f"kernel {k.name} starts at {k.start_s} before its launch {k.launch_start_s}")
    # (a gloo collective's record on its worker thread may outlast a CPU rank's step window)
    if step_end is not None and k.end_s > step_end + TOL_S and not k.on_host:
        out.append(f"kernel {k.name} ends after the step")
    c = k.collective
    if c is not None:
        if c.bytes < 0 or any(b < 0 for b in c.peer_bytes or ()):
            out.append(f"collective {c.kind} bytes {c.bytes} {c.peer_bytes}")
        if len(set(c.group_ranks)) != len(c.group_ranks) or min(c.group_ranks, default=0) < 0:
            out.append(f"collective {c.kind} group {c.group_ranks}")
    return out


def fingerprint(loaded: LoadedTraces) -> tuple[Any, ...]:
    return tuple(
        (r.rank, len(r.ops), len(r.kernels()), r.measured_step_s, loaded.traces[r.rank].unit_to_s)
        for r in loaded.workload.ranks
    )


def load(path: Path, data: bytes) -> LoadedTraces | TraceFormatError:
    """Only TraceFormatError (and subclasses) may escape as an error; anything else fails."""
    path.write_bytes(data)
    try:
        return load_traces([path])
    except TraceFormatError as e:
        assert str(path) in str(e)  # every error names the file
        return e


class Corpus(dict[str, tuple[bytes, bytes]]):
    def __repr__(self) -> str:  # Hypothesis prints the arguments of a failing example
        return f"Corpus({sorted(self)})"


@pytest.fixture(scope="module")
def originals() -> Corpus:
    """(JSON, gzip) bytes of each small trace and of DLRM rank 0."""
    if not TRACES.is_dir():
        pytest.skip("../shared/data is not beside the repository")
    out = Corpus(
        (rel, (gzip.decompress((TRACES / rel).read_bytes()), (TRACES / rel).read_bytes()))
        for rel in SMALL
    )
    with tarfile.open(TRACES / DLRM) as tar:
        member = next(
            m for m in tar.getmembers() if m.name.endswith(".json") and "worker0_" in m.name
        )
        raw = tar.extractfile(member).read()  # type: ignore[union-attr]
    out["dlrm_rank0"] = (raw, gzip.compress(raw, mtime=0))
    return out


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def baseline(originals, work) -> dict[str, tuple[Any, ...]]:
    out = {}
    for rel, (raw, _) in originals.items():
        loaded = load(work / "rank0.json", raw)
        assert isinstance(loaded, LoadedTraces) and not check_invariants(loaded), rel
        out[rel] = fingerprint(loaded)
    return out


SOURCE = st.sampled_from([*SMALL, *SMALL, "dlrm_rank0"])  # DLRM is 30× larger: draw it less


@settings(FUZZ, max_examples=120)
@given(rel=SOURCE, data=st.data())
def test_truncated_gzip_is_an_error(originals, work, rel, data):
    gz = originals[rel][1]
    cut = data.draw(st.integers(0, len(gz) - 1), label="cut")
    assert isinstance(load(work / "rank0.json.gz", gz[:cut]), TraceFormatError)


@settings(FUZZ, max_examples=200)
@given(rel=SOURCE, data=st.data())
def test_corrupt_gzip_is_an_error_or_harmless(originals, work, baseline, rel, data):
    gz = bytearray(originals[rel][1])
    for _ in range(data.draw(st.integers(1, 3), label="flips")):
        pos = data.draw(st.integers(0, len(gz) - 1), label="pos")
        gz[pos] ^= data.draw(st.integers(1, 255), label="xor")
    out = load(work / "rank0.json.gz", bytes(gz))
    assert isinstance(out, TraceFormatError) or fingerprint(out) == baseline[rel]


@settings(FUZZ, max_examples=120)
@given(rel=SOURCE, data=st.data())
def test_truncated_json_is_an_error(originals, work, rel, data):
    raw = originals[rel][0].rstrip()
    cut = data.draw(st.integers(0, len(raw) - 1), label="cut")
    assert isinstance(load(work / "rank0.json", raw[:cut]), TraceFormatError)


JSON_BYTES = st.one_of(st.sampled_from(b'0123456789-.+eE,:"{}[] \\'), st.integers(0, 255))


@settings(FUZZ, max_examples=450)
@given(rel=SOURCE, data=st.data())
def test_corrupt_json_is_an_error_or_consistent(originals, work, rel, data):
    # One changed byte per example: the smallest corruption, the hardest to notice. (Two or more
    # can combine a broken key with invalid UTF-8; see test_unknown_json_with_invalid_utf8.)
    raw = bytearray(originals[rel][0])
    raw[data.draw(st.integers(0, len(raw) - 1), label="pos")] = data.draw(JSON_BYTES, label="byte")
    out = load(work / "rank0.json", bytes(raw))
    assert isinstance(out, TraceFormatError) or not check_invariants(out), check_invariants(out)  # type: ignore[arg-type]


WRONG_VALUES = st.sampled_from(
    [-1, -7.5, 0, 10**20, 1e300, "x", "0x1g", "[0, 0]", "[-1, 2]", "[1, 2", None, True, {}, [],
     ["a", "b", "c"], [1, "a", 2], [-1, 2, 3], [[-4, 2]], [[2, 3], "z"], [0, 0]]
)  # fmt: skip
ARG_KEYS = st.sampled_from(
    ["correlation", "stream", "device", "External id", "Ev Idx", "Input Dims", "Input type", "grid", "block",
     "In msg nelems", "Out msg nelems", "Group size", "dtype", "In split size", "Out split size",
     "Process Group Name", "Process Group Ranks", "Collective name", "wait_on_stream"]
)  # fmt: skip


@settings(FUZZ, max_examples=200)
@given(rel=SOURCE, data=st.data())
def test_wrong_types_are_an_error_or_consistent(originals, work, rel, data):
    doc = json.loads(originals[rel][0])
    by_cat: dict[str, list[dict[str, Any]]] = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X":
            by_cat.setdefault(e.get("cat", ""), []).append(e)
    for _ in range(data.draw(st.integers(1, 3), label="edits")):
        # Category first: kernels and runtime calls are few but read the most.
        e = data.draw(
            st.sampled_from(by_cat[data.draw(st.sampled_from(sorted(by_cat)), label="cat")]),
            label="event",
        )
        if data.draw(st.booleans(), label="in args"):
            if not isinstance(e.get("args"), dict):
                e["args"] = {}
            keys = st.one_of(st.sampled_from(sorted(e["args"]) or ["correlation"]), ARG_KEYS)
            e["args"][data.draw(keys, label="key")] = data.draw(WRONG_VALUES, label="value")
        else:
            e[data.draw(st.sampled_from(sorted(e)), label="field")] = data.draw(
                WRONG_VALUES, label="value"
            )
    out = load(work / "rank0.json", json.dumps(doc).encode())
    assert isinstance(out, TraceFormatError) or not check_invariants(out), check_invariants(out)  # type: ignore[arg-type]


@settings(FUZZ, max_examples=60)
@given(data=st.data())
def test_corrupt_archive_is_an_error_or_harmless(originals, work, data):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, content in [("job/rank0.json", originals[SMALL[0]][0]), ("job/notes.txt", b"x")]:
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    archive = bytearray(buf.getvalue())
    intact = load(work / "job.tar.gz", bytes(archive))
    assert isinstance(intact, LoadedTraces)
    if data.draw(st.booleans(), label="truncate"):
        archive = archive[: data.draw(st.integers(0, len(archive) - 1), label="cut")]
    else:
        archive[data.draw(st.integers(0, len(archive) - 1), label="pos")] ^= data.draw(
            st.integers(1, 255)
        )
    out = load(work / "job.tar.gz", bytes(archive))
    assert isinstance(out, TraceFormatError) or fingerprint(out) == fingerprint(intact)


def test_unknown_json_with_invalid_utf8(work):
    assert isinstance(load(work / "rank0.json", b'{"foo": "\xff"}'), TraceFormatError)
