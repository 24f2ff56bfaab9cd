"""Reading trace inputs: .json, .json.gz, .tar.gz/.tgz/.tar archives, folders; content sniffing;
and one clear TraceFormatError (file + what was expected) for every kind of bad input."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from trainsim.errors import TraceFormatError
from trainsim.ingest import load_traces
from trainsim.ingest.sources import BlobKind, read_path, read_paths, sniff_kind

EPOCH_US = 1_700_000_000_000_000


def kineto_doc(rank: int = 0) -> bytes:
    """A minimal but complete Kineto trace: one step, one op, one launch, one kernel."""
    x = {"ph": "X", "pid": 1, "tid": 1}
    events = [
        {**x, "cat": "user_annotation", "name": "ProfilerStep#1", "ts": EPOCH_US, "dur": 100},
        {**x, "cat": "cpu_op", "name": "aten::relu", "ts": EPOCH_US + 1, "dur": 20},
        {
            **x,
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "ts": EPOCH_US + 5,
            "dur": 5,
            "args": {"correlation": 3},
        },
        {
            **x,
            "cat": "kernel",
            "name": "relu_kernel",
            "pid": 0,
            "tid": 7,
            "ts": EPOCH_US + 30,
            "dur": 10,
            "args": {"correlation": 3, "stream": 7},
        },
    ]
    return json.dumps(
        {"distributedInfo": {"rank": rank, "world_size": 2}, "traceEvents": events}
    ).encode()


ET_DOC = json.dumps({"schema": "1.0.1", "pid": 1, "time": "x", "nodes": []}).encode()


def _tar(members: dict[str, bytes], mode: str = "w:gz") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# Each input format: how to write it, and the blob names it must yield (relative to tmp_path).
FORMATS: dict[str, tuple[Callable[[Path], Path], list[str]]] = {
    ".json": (lambda d: _write(d / "rank0.json", kineto_doc()), ["rank0.json"]),
    ".json.gz": (
        lambda d: _write(d / "rank0.json.gz", gzip.compress(kineto_doc())),
        ["rank0.json.gz"],
    ),
    ".pt.trace.json with BOM": (
        lambda d: _write(d / "w.pt.trace.json", b"\xef\xbb\xbf" + kineto_doc()),
        ["w.pt.trace.json"],
    ),
    "gzip without suffix": (lambda d: _write(d / "trace", gzip.compress(kineto_doc())), ["trace"]),
    ".tar.gz": (
        lambda d: _write(
            d / "t.tar.gz",
            _tar(
                {
                    "t/rank1.json": kineto_doc(1),
                    "t/rank0.json.gz": gzip.compress(kineto_doc(0)),
                    "t/._rank0.json": b"\x00\x05",
                    "t/README.md": b"hi",
                }
            ),
        ),
        ["t.tar.gz:t/rank0.json.gz", "t.tar.gz:t/rank1.json"],
    ),
    ".tgz": (
        lambda d: _write(d / "t.tgz", _tar({"rank0.json": kineto_doc()})),
        ["t.tgz:rank0.json"],
    ),
    ".tar": (
        lambda d: _write(d / "t.tar", _tar({"rank0.json": kineto_doc()}, mode="w")),
        ["t.tar:rank0.json"],
    ),
    "folder": (
        lambda d: (
            _write(d / "f/a/rank1.json.gz", gzip.compress(kineto_doc(1))),
            _write(d / "f/rank0.json", kineto_doc(0)),
            _write(d / "f/.hidden.json", b"not json"),
            _write(d / "f/notes.txt", b"not a trace"),
            _write(d / "f/b/more.tar.gz", _tar({"rank2.json": kineto_doc(2)})),
            d / "f",
        )[-1],
        ["f/a/rank1.json.gz", "f/b/more.tar.gz:rank2.json", "f/rank0.json"],
    ),
}


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_input_format_yields_its_traces(tmp_path, fmt):
    make, names = FORMATS[fmt]
    blobs = read_path(make(tmp_path))
    assert [b.name.replace(f"{tmp_path}/", "") for b in blobs] == names
    for b in blobs:
        assert b.kind is BlobKind.KINETO
        assert json.loads(b.data)["traceEvents"]  # uncompressed, BOM removed


@pytest.mark.parametrize(("fmt", "said"), [(".tar.gz", ["t.tar.gz:t/README.md"]), ("folder", ["f/notes.txt"]),
                                           (".json", [])])  # fmt: skip
def test_files_left_out_by_name_are_said_and_dot_files_are_not(tmp_path, fmt, said):
    skipped: list[str] = []
    read_path(FORMATS[fmt][0](tmp_path), skipped)
    assert [x.split(": ", 1)[0].replace(f"{tmp_path}/", "") for x in skipped] == said
    assert all("not a trace file name" in x for x in skipped)


def test_analyze_and_replay_name_a_file_in_the_folder_they_did_not_read(tmp_path):
    from trainsim.analyze.report import analyze_paths
    from trainsim.ingest.multirank import skipped_note
    from trainsim.sim import SimOptions
    from trainsim.sim.replay import replay_paths

    _write(tmp_path / "run/rank0.json", kineto_doc(0))
    _write(tmp_path / "run/timings.csv", b"step,ms\n1,3.2\n")
    report = analyze_paths([tmp_path / "run"])
    assert report.to_dict()["skipped_inputs"] == [f"{tmp_path}/run/timings.csv: not a trace file name (.json, .json.gz, .tar.gz)"]
    assert any(w.startswith("1 input file not read: ") and "timings.csv" in w for w in report.warnings())
    rep = replay_paths([tmp_path / "run"], SimOptions())
    assert rep.to_dict()["skipped_inputs"] == report.to_dict()["skipped_inputs"]
    assert skipped_note([]) is None
    many = skipped_note([f"f{i}.csv: why" for i in range(5)])
    assert many is not None and many.startswith("5 input files not read: f0.csv: why; f1.csv: why; f2.csv: why; and 2 more")


def test_archive_of_ranks_loads_as_a_multi_rank_workload(tmp_path):
    path = _write(
        tmp_path / "job.tar.gz", _tar({"rank0.json": kineto_doc(0), "rank1.json": kineto_doc(1)})
    )
    loaded = load_traces([path])
    assert [r.rank for r in loaded.workload.ranks] == [0, 1]
    assert [len(r.kernels()) for r in loaded.workload.ranks] == [1, 1]


def test_read_paths_concatenates_in_argument_order(tmp_path):
    a = _write(tmp_path / "rank1.json", kineto_doc(1))
    b = _write(tmp_path / "rank0.json", kineto_doc(0))
    assert [x.name for x in read_paths([a, b])] == [str(a), str(b)]


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (kineto_doc(), BlobKind.KINETO),
        (
            b'{"deviceProperties": [' + b'{"name": "x"},' * 8000 + b'{}], "traceEvents": []}',
            BlobKind.KINETO,
        ),
        (ET_DOC, BlobKind.EXECUTION_TRACE),
        (b'{"workload_graph": {}}', BlobKind.CHAKRA),
        (b'{"foo": 1}', BlobKind.UNKNOWN),
        (b"[]", BlobKind.UNKNOWN),
    ],
    ids=[
        "kineto",
        "kineto after a large header",
        "execution trace",
        "chakra",
        "other object",
        "array",
    ],
)
def test_kinds_are_sniffed_from_content(data, kind):
    assert sniff_kind(data) is kind


def _corrupt_middle(data: bytes) -> bytes:
    mid = len(data) // 2
    return data[:mid] + bytes([data[mid] ^ 0xFF]) + data[mid + 1 :]


BIG = kineto_doc() * 1  # compressible payload for the gzip cases

# (case id, file name, content or None for "do not create", expected problem fragment)
BAD_INPUTS: list[tuple[str, str, bytes | None, str]] = [
    ("missing file", "nope.json", None, "no such file or folder"),
    ("empty file", "rank0.json", b"", "file is empty"),
    ("whitespace only", "rank0.json", b" \n\t\n", "file is empty"),
    (
        "zip archive",
        "rank0.json",
        b"PK\x03\x04" + b"\x00" * 40,
        "not JSON, gzip or tar (starts with b'PK\\x03\\x04",
    ),
    ("gzip of plain text", "rank0.json.gz", gzip.compress(b"hello\n"), "gzip data that is not JSON"),
    ("plain text", "rank0.json", b"hello, trace\n", "not JSON"),
    ("truncated gzip", "rank0.json.gz", gzip.compress(BIG)[:-9], "corrupt or truncated gzip"),
    (
        "corrupt gzip",
        "rank0.json.gz",
        _corrupt_middle(gzip.compress(BIG)),
        "corrupt or truncated gzip",
    ),
    ("gzip of nothing", "rank0.json.gz", gzip.compress(b""), "file is empty"),
    ("gzip of text", "rank0.json.gz", gzip.compress(b"col1,col2\n1,2\n"), "not JSON"),
    (
        "archive without traces",
        "t.tar.gz",
        _tar({"a.txt": b"x", "b.csv": b"1,2"}),
        "holds no .json or .json.gz trace files (it holds: a.txt, b.csv)",
    ),
    (
        "empty archive",
        "t.tar.gz",
        _tar({}),
        "holds no .json or .json.gz trace files (it holds: nothing)",
    ),
    ("truncated archive", "t.tar.gz", _tar({"rank0.json": BIG})[:-30], "corrupt or truncated"),
    # named like an archive but not one (walkthrough 2026-12-02: "corrupt or truncated tar archive")
    ("a CSV named .tar.gz", "t.tar.gz", b"a,b\n1,2\n", "not a tar archive (starts with b'a,b\\n1,2\\n')"),
    ("a gzipped CSV named .tar.gz", "t.tar.gz", gzip.compress(b"a,b\n1,2\n"), "gzip data that is not a tar archive"),
    (
        "corrupt archive",
        "t.tgz",
        _corrupt_middle(_tar({"rank0.json": BIG * 20})),
        "corrupt or truncated",
    ),
    (
        "archive member not JSON",
        "t.tar.gz",
        _tar({"rank0.json": b"\x00\x01binary"}),
        "t.tar.gz:rank0.json: not JSON",
    ),
    (
        "archive member empty",
        "t.tar.gz",
        _tar({"rank0.json": b""}),
        "t.tar.gz:rank0.json: file is empty",
    ),
    (
        "archive member bad gzip",
        "t.tar.gz",
        _tar({"rank0.json.gz": gzip.compress(BIG)[:-4]}),
        "t.tar.gz:rank0.json.gz: corrupt or truncated gzip",
    ),
]


@pytest.mark.parametrize(
    ("name", "content", "fragment"), [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS]
)
def test_bad_inputs_raise_one_clear_error(tmp_path, name, content, fragment):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(TraceFormatError) as info:
        load_traces([path])
    assert str(path) in str(info.value)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("files", "fragment"),
    [
        ({}, "folder holds no .json, .json.gz or .tar.gz trace files"),
        ({"notes.txt": b"x", ".rank0.json": b"{}"}, "folder holds no"),
    ],
    ids=["empty folder", "only other files"],
)
def test_folder_without_traces(tmp_path, files, fragment):
    for name, data in files.items():
        _write(tmp_path / "f" / name, data)
    (tmp_path / "f").mkdir(exist_ok=True)
    with pytest.raises(TraceFormatError, match=fragment) as info:
        load_traces([tmp_path / "f"])
    assert info.value.path == str(tmp_path / "f")


# JSON that is valid but not a Kineto trace: load_traces says what it got and what it expected.
NOT_A_TRACE: list[tuple[str, bytes, str]] = [
    ("empty array", b"[]", "expected an object with 'traceEvents'"),
    ("other object", b'{"foo": 1}', "no 'traceEvents' key (top-level keys: foo)"),
    ("execution trace only", ET_DOC, "only execution traces given"),
    (
        "traceEvents of numbers",
        b'{"traceEvents": [1, 2]}',
        "Expected `object`, got `int` - at `$.traceEvents[0]`",
    ),
    ("traceEvents not a list", b'{"traceEvents": {"a": 1}}', "at `$.traceEvents`"),
    (
        "wrong field type",
        b'{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1, "dur": "5"}]}',
        "at `$.traceEvents[0].dur`",
    ),
]


@pytest.mark.parametrize(
    ("data", "fragment"), [c[1:] for c in NOT_A_TRACE], ids=[c[0] for c in NOT_A_TRACE]
)
def test_json_that_is_not_a_trace(tmp_path, data, fragment):
    path = _write(tmp_path / "rank0.json", data)
    with pytest.raises(TraceFormatError) as info:
        load_traces([path])
    assert info.value.path == str(path)
    assert fragment in info.value.problem
