"""Kineto decoding: event roles, order, time units, ROCm, lazy shapes, completeness, and the
plausibility checks that turn corrupt values into TraceFormatError (docs/ingestion.md)."""

from __future__ import annotations

import gc
import json
from typing import Any

import msgspec
import pytest

from trainsim.errors import ConfigError, TraceFormatError
from trainsim.ingest.kineto import Event, decode_kineto, rank_from_name

EPOCH_US = 1_700_000_000_000_000.0  # 2023 in epoch microseconds


def _x(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    e: dict[str, Any] = {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "dur": dur,
    }
    if args:
        e["args"] = args
    return e


def _doc(*events: dict[str, Any], t0: float = EPOCH_US, **top: Any) -> bytes:
    """A small but complete trace: one op launching one kernel, plus ``events``."""
    base = [
        _x(
            "cpu_op",
            "aten::mm",
            t0,
            50,
            **{
                "External id": 1,
                "Ev Idx": 0,
                "Input Dims": [[4, 8], [8, 2]],
                "Input type": ["float", "float"],
            },
        ),
        _x("cuda_runtime", "cudaLaunchKernel", t0 + 10, 5, correlation=7),
        {
            **_x(
                "kernel",
                "volta_sgemm_128x64_nn",
                t0 + 20,
                3,
                correlation=7,
                stream=7,
                grid=[1, 2, 3],
                block=[128, 1, 1],
            ),
            "pid": 0,
            "tid": 7,
        },
        {
            "ph": "f",
            "cat": "ac2g",
            "name": "ac2g",
            "id": 7,
            "pid": 0,
            "tid": 7,
            "ts": t0 + 20,
            "bp": "e",
        },
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}},
    ]
    return json.dumps({"schemaVersion": 1, **top, "traceEvents": base + list(events)}).encode()


def test_events_are_split_by_role_and_sorted_parent_first():
    data = _doc(
        _x(
            "cpu_op", "aten::child", EPOCH_US, 20, **{"Ev Idx": 1}
        ),  # same ts, shorter: after parent
        _x("user_annotation", "ProfilerStep#3", EPOCH_US - 5, 100),
        _x("cuda_sync", "Stream Wait Event", EPOCH_US + 30, 0, stream=7),
    )
    t = decode_kineto("rank3.json", data)
    assert [e.name for e in t.cpu] == ["ProfilerStep#3", "aten::mm", "aten::child"]
    assert [e.name for e in t.runtime] == ["cudaLaunchKernel"]
    assert [e.name for e in t.gpu] == ["volta_sgemm_128x64_nn"]
    assert len(t.sync) == 1 and t.rank == 3
    assert t.counts == {
        "cpu_op": 2,
        "user_annotation": 1,
        "cuda_runtime": 1,
        "kernel": 1,
        "cuda_sync": 1,
    }
    assert all(type(e) is Event for e in t.cpu)  # flow and metadata events are not kept


def test_operator_shapes_are_decoded_on_access():
    t = decode_kineto("t.json", _doc())
    mm = t.cpu[0].args
    assert (
        mm is not None and mm.input_dims == [[4, 8], [8, 2]] and mm.input_type == ["float", "float"]
    )
    launch = t.runtime[0].args
    assert launch is not None and launch.input_dims is None and launch.input_type is None


@pytest.mark.parametrize(
    ("t0", "display", "override", "unit_to_s"),
    [
        (EPOCH_US, None, None, 1e-6),  # epoch µs (PyTorch ≤ 2.x)
        (EPOCH_US + 0.123, "ns", None, 1e-6),  # fractional µs: displayTimeUnit is a display hint
        (4.2e12, "ms", None, 1e-6),  # µs since boot (ROCm, Triton traces)
        (EPOCH_US * 1000, None, None, 1e-9),  # epoch ns
        (EPOCH_US, None, "ns", 1e-9),  # explicit override wins
        (EPOCH_US / 1000, None, "ms", 1e-3),  # epoch ms (epoch µs read as ms is refused: 0.25 ms steps)
    ],
)
def test_time_unit_detection(t0, display, override, unit_to_s):
    top = {"displayTimeUnit": display} if display else {}
    assert decode_kineto("t.json", _doc(t0=t0, **top), time_unit=override).unit_to_s == unit_to_s


def test_unknown_time_unit_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown time unit 's'"):
        decode_kineto("t.json", _doc(), time_unit="s")


def test_rocm_hex_streams_become_integers():
    data = _doc(
        _x(
            "cuda_runtime",
            "hipMemcpyWithStream",
            EPOCH_US + 30,
            5,
            correlation=9,
            stream="0x1a",
            size="2560",
        ),
        {
            **_x(
                "gpu_memcpy",
                "Memcpy HtoD (Host -> Device)",
                EPOCH_US + 40,
                2,
                correlation=9,
                stream=26,
            ),
            "pid": 2,
        },
        _x("cuda_runtime", "hipLaunchKernel", EPOCH_US + 45, 5, correlation=10, stream="0"),
    )
    t = decode_kineto("mi250.json", data)
    assert [e.args.stream for e in t.runtime if e.args] == [None, 26, 0]


@pytest.mark.parametrize(
    ("ev_idx", "coverage", "sampled"),
    [
        ({1: list(range(100))}, 1.0, False),
        ({1: list(range(0, 1000, 10))}, 100 / 991, True),  # every 10th event kept
        ({1: [0, 1, 2], 2: [36777]}, 1.0, False),  # per process: two processes in one file
    ],
)
def test_event_coverage_detects_sampled_traces(ev_idx, coverage, sampled):
    events = [
        {**_x("cpu_op", f"op{i}", EPOCH_US + 100 + i, 1, **{"Ev Idx": i}), "pid": pid}
        for pid, idx in ev_idx.items()
        for i in idx
    ]
    data = json.dumps({"traceEvents": events}).encode()
    t = decode_kineto("t.json", data)
    assert t.event_coverage == pytest.approx(coverage) and t.is_sampled is sampled


def test_truncated_process_group_lists_are_accepted():
    # PyTorch shortens long lists to "[0, 1, ..., ...]": not JSON, not an error.
    data = _doc(
        _x(
            "cpu_op",
            "record_param_comms",
            EPOCH_US + 5,
            1,
            **{"Process Group Ranks": "[0, 1, ..., ...]"},
        )
    )
    decode_kineto("t.json", data)


@pytest.mark.parametrize("enabled", [True, False])
def test_garbage_collector_state_is_restored(enabled):
    (gc.enable if enabled else gc.disable)()
    try:
        decode_kineto("t.json", _doc())
        assert gc.isenabled() is enabled
        with pytest.raises(TraceFormatError):
            decode_kineto("t.json", b"[]")
        assert gc.isenabled() is enabled
    finally:
        gc.enable()


def _bad_kernel(**args: Any) -> dict[str, Any]:
    return {**_x("kernel", "k", EPOCH_US + 30, 1, correlation=99, **args), "pid": 0}


def _stream7(name: str, at_us: float, dur: float, corr: int) -> dict[str, Any]:
    """A kernel on stream 7, ``at_us`` after the base op starts (no runtime call launched it)."""
    return {**_x("kernel", name, EPOCH_US + at_us, dur, correlation=corr, stream=7), "pid": 0}


BAD_DOCUMENTS: list[tuple[str, bytes, str]] = [
    ("array", b"[]", "expected an object with 'traceEvents'"),
    ("number", b"3", "expected an object with 'traceEvents'"),
    ("other object", b'{"foo": 1}', "no 'traceEvents' list"),
    ("traceEvents not a list", b'{"traceEvents": 5}', "$.traceEvents"),
    ("event not an object", b'{"traceEvents": [1, 2]}', "$.traceEvents[0]"),
    (
        "ts is a string",
        b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": "1"}]}',
        "$.traceEvents[0].ts",
    ),
    ("missing ph", b'{"traceEvents": [{"cat": "cpu_op", "ts": 1}]}', "`ph`"),
    ("unknown ph", b'{"traceEvents": [{"ph": "Q", "ts": 1}]}', "$.traceEvents[0].ph"),
    ("truncated", _doc()[:-40], "invalid or truncated JSON"),
    ("not UTF-8", _doc().replace(b"aten::mm", b"aten::\xff\xfe"),
     f"invalid UTF-8 in a JSON string at byte {_doc().index(b'aten::mm') + 6}"),
    ("no events", b'{"traceEvents": []}', "no CPU op, runtime or GPU events"),
    ("only flows", b'{"traceEvents": [{"ph": "f", "ts": 1}]}', "no CPU op, runtime or GPU events"),
    ("negative dur", _doc(_x("cpu_op", "a", EPOCH_US, -3)), "$.traceEvents[5].dur"),
    ("negative ts", _doc(_x("cpu_op", "a", -EPOCH_US, 3)), "$.traceEvents[5].ts"),
    ("far timestamp", _doc(_x("cpu_op", "a", EPOCH_US * 5, 3)), "outside the trace's time range"),
    ("huge duration", _doc(_x("cpu_op", "a", EPOCH_US, 1e12)), "outside the trace's time range"),
    # review 34: at 1e20 float64 steps are 16 µs: read as ns, a 19.7 s step became 19.7 ms
    ("timestamps past float64 µs", _doc(t0=1e20), "timestamps reach 1e+20 ns: so large that float64 values there lie 16.4 µs apart"),
    (
        "kernel before launch",
        _doc(
            _bad_kernel(), _x("cuda_runtime", "cudaLaunchKernel", EPOCH_US + 900, 1, correlation=99)
        ),
        "before the runtime call",
    ),
    ("stream not a number", _doc(_bad_kernel(stream="seven")), "'stream' is 'seven'"),
    ("grid of strings", _doc(_bad_kernel(grid=["a", "b", "c"])), "'grid'"),
    ("negative block", _doc(_bad_kernel(block=[-1, 1, 1])), "'block'"),
    ("negative bytes", _doc(_bad_kernel(bytes=-8)), "args.bytes"),
    ("absurd message", _doc(_bad_kernel(**{"In msg nelems": 1 << 60})), "args.In msg nelems"),
    (
        "negative shape",
        _doc(_x("cpu_op", "nccl:all_reduce", EPOCH_US, 3, **{"Input Dims": [[2, -3]]})),
        "negative size in 'Input Dims'",
    ),
    (
        "negative split",
        _doc(_x("cpu_op", "c10d::alltoall_", EPOCH_US, 3, **{"In split size": "[-5, 3]"})),
        "'In split size'",
    ),
    ("repeated rank", _doc(_bad_kernel(**{"Process Group Ranks": "[0, 0]"})), "lists a rank twice"),
    ("negative rank", _doc(_bad_kernel(**{"Process Group Ranks": [0, -1]})), "non-rank value"),
    (
        "rank beyond world",
        _doc(
            _bad_kernel(**{"Process Group Ranks": "[0, 5]"}),
            distributedInfo={"rank": 0, "world_size": 2},
        ),
        "exceeds world_size 2",
    ),
    ("world size 0", _doc(distributedInfo={"rank": 0, "world_size": 0}), "world_size is 0"),
    ("absurd world size", _doc(distributedInfo={"rank": 0, "world_size": 10**20}), "world_size is"),
    ("rank beyond world size", _doc(distributedInfo={"rank": 8, "world_size": 8}), "rank is 8"),
    # review 34: impossible content that replayed as a plausible step
    ("kernel twice", _doc(json.loads(_doc())["traceEvents"][2]),
     f"device activities exported twice on stream 7 (1 pair; first 'volta_sgemm_128x64_nn' at ts={EPOCH_US + 20} dur=3.0"),
    ("kernel twice under a longer one", _doc(_stream7("a", 100, 100, 8), _stream7("b", 110, 10, 9), _stream7("b", 110, 10, 9)),
     "device activities exported twice on stream 7 (1 pair; first 'b' at ts="),
    ("kernel without ts", _doc({k: v for k, v in _stream7("k", 100, 5, 8).items() if k != "ts"}),
     "1 kernel event lacks 'ts', e.g. 'k'"),
    ("kernels without dur", _doc(*({k: v for k, v in _stream7(f"k{i}", 100 * i, 5, i).items() if k != "dur"} for i in (8, 9))),
     "2 kernel events lack 'dur', e.g. 'k8'"),
    ("correlation reused", _doc(_x("cuda_runtime", "cudaLaunchKernel", EPOCH_US + 30, 1, correlation=7)),
     f"correlation id 7 is used by 2 runtime calls, e.g. 'cudaLaunchKernel' at ts={EPOCH_US + 30}"),
]


@pytest.mark.parametrize(
    ("data", "fragment"), [c[1:] for c in BAD_DOCUMENTS], ids=[c[0] for c in BAD_DOCUMENTS]
)
def test_bad_documents_raise_trace_format_error_naming_the_file(data, fragment):
    with pytest.raises(TraceFormatError) as info:
        decode_kineto("some/rank0.json", data)
    assert info.value.path == "some/rank0.json"
    assert fragment in info.value.problem


def test_kernels_a_stream_overlaps_or_that_round_to_one_time_are_read():
    """Review of 2026-12-02: Hopper's programmatic dependent launch starts a kernel before the
    one ahead ends (its own launch), and an integer-µs trace rounds two sub-µs launches of one
    kernel to one ts with dur 0: both are real traces, not duplicates."""
    pdl = decode_kineto("pdl.json", _doc(_stream7("primary", 100, 20, 8), _stream7("dependent", 103, 20, 9)))
    assert {k.name for k in pdl.gpu} >= {"primary", "dependent"}
    rounded = decode_kineto("int.json", _doc(_stream7("fill", 100, 0, 8), _stream7("fill", 100, 0, 9)))
    assert sum(k.name == "fill" for k in rounded.gpu) == 2


def test_error_messages_name_the_bad_event():
    with pytest.raises(
        TraceFormatError,
        match=r"event .late. \(cpu_op\) at ts=8500000000000000\.0 dur=3\.0 lies outside",
    ):
        decode_kineto("t.json", _doc(_x("cpu_op", "late", EPOCH_US * 5, 3)))


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("dlrm_kineto.tar.gz:dlrm_kineto/worker3_step_12.1694128201557.pt.trace.json", 3),
        ("/x/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", 34),
        ("/x/rank0_of_16.json.gz", 0),
        ("/x/trace_5.json", 5),
        ("/x/trace.json", None),
    ],
)
def test_rank_from_file_name(name, rank):
    assert rank_from_name(name) == rank


def test_decoded_values_round_trip_through_msgspec():
    # The struct layout stays a faithful view of the file for the fields we keep.
    t = decode_kineto("t.json", _doc())
    k = t.gpu[0]
    assert (k.ts, k.dur, k.args.correlation, k.args.grid) == (EPOCH_US + 20, 3.0, 7, [1, 2, 3])  # type: ignore[union-attr]
    assert msgspec.json.decode(msgspec.json.encode(k), type=Event) == k


def test_a_trace_whose_events_have_no_duration_is_refused():
    """Review 2026-11-27: X events without 'dur' decoded as 0 and analyzed as a 0 ms step."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": EPOCH_US + i} for i in range(3)]
    with pytest.raises(TraceFormatError, match="no 'X' event has a duration"):
        decode_kineto("t.json", json.dumps({"traceEvents": events}).encode())


@pytest.mark.parametrize(
    "events",
    [
        # a shipped A100 trace: a copy starts 2 µs before the kernel ahead of it ends
        (_stream7("reduce_kernel", 100, 35, 8), _stream7("Memcpy DtoH", 133, 7, 9)),
        # one launch (a CUDA graph) may run its branches side by side on the launch stream
        (_stream7("branch_a", 100, 50, 8), _stream7("branch_b", 100, 40, 8)),
        # other streams, other devices
        (_stream7("a", 100, 50, 8), {**_stream7("b", 100, 50, 9), "pid": 1}),
    ],
)
def test_device_activities_that_a_stream_can_hold_are_accepted(events):
    assert len(decode_kineto("t.json", _doc(*events)).gpu) == 3


def test_events_of_unused_categories_may_lack_times():
    """Only the roles trainsim reads must be timed; a python_function without ts is skipped."""
    t = decode_kineto("t.json", _doc({"ph": "X", "cat": "python_function", "name": "f", "pid": 1, "tid": 1}))
    assert t.counts.get("python_function") is None and len(t.cpu) == 1
