"""Review 34 (fuzzing of ingestion): inputs that used to load silently into wrong answers, or
hang or crash, now give a one-line error or a warning."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from trainsim.analyze.report import analyze_paths
from trainsim.errors import TraceFormatError, TraceMismatchError
from trainsim.ingest import load_traces


def _write_ranks(folder: Path, docs: dict[int, dict]) -> Path:
    folder.mkdir()
    for r, d in docs.items():
        (folder / f"worker{r}_step_12.pt.trace.json").write_text(json.dumps(d))
    return folder


def _shifted(dlrm_raw: dict[int, dict], rank: int, by_us: float) -> dict[int, dict]:
    docs = dict(dlrm_raw)
    docs[rank] = copy.deepcopy(dlrm_raw[rank])
    for e in docs[rank]["traceEvents"]:
        if "ts" in e:
            e["ts"] += by_us
    return docs


# -- ranks of different times, runs or machines ------------------------------------------------


def test_a_rank_an_hour_off_is_another_runs_trace(tmp_path, dlrm_raw):
    """Rank 7 an hour later gave 'measured step 3600019.9 ms' and a replay of +0.00 %."""
    folder = _write_ranks(tmp_path / "t", _shifted(dlrm_raw, 7, 3600e6))
    with pytest.raises(TraceMismatchError) as info:
        load_traces([folder])
    assert info.value.path.endswith("worker7_step_12.pt.trace.json")
    assert "rank 7's step 10 lies 3,600 s away" in info.value.problem
    assert "another run or time" in info.value.problem


def test_ranks_half_a_second_apart_are_noted(tmp_path, dlrm_raw):
    """Hosts' clocks may disagree: usable, but the measured step includes the gap."""
    folder = _write_ranks(tmp_path / "t", _shifted(dlrm_raw, 7, 0.5e6))
    a = analyze_paths([folder])
    (line,) = [w for w in a.warnings() if "away from" in w]
    assert line.startswith("rank 7's step 10 lies 488 ms away from rank 1's") and "clocks" in line
    from trainsim.sim import SimOptions
    from trainsim.sim.replay import replay_paths

    assert line in replay_paths([folder], SimOptions()).to_dict()["input_warnings"]  # replay says it too


def test_ranks_on_different_devices_are_noted(tmp_path, dlrm_raw):
    docs = dict(dlrm_raw)
    docs[7] = copy.deepcopy(dlrm_raw[7])
    docs[7]["deviceProperties"][0]["name"] = "NVIDIA A100-SXM4-40GB"
    a = analyze_paths([_write_ranks(tmp_path / "t", docs)])
    assert ("ranks report different devices (ranks 0-6: Tesla V100-SXM2-32GB; rank 7: NVIDIA A100-SXM4-40GB)"
            in " ".join(a.warnings()))  # fmt: skip


def test_one_jobs_ranks_load_without_a_note(dlrm_loaded):
    assert dlrm_loaded.warnings == []


# -- impossible trace content --------------------------------------------------------------------


def _rank0(dlrm_raw: dict[int, dict]) -> dict:
    return copy.deepcopy(dlrm_raw[0])


def _load_one(tmp_path: Path, doc: dict) -> None:
    path = tmp_path / "worker0_step_12.pt.trace.json"
    path.write_text(json.dumps(doc))
    load_traces([path], step="last")


def test_a_step_marked_twice_is_an_error(tmp_path, dlrm_raw):
    """A second ProfilerStep#10 of 100 µs made `analyze --step last` report 0.000 ms."""
    doc = _rank0(dlrm_raw)
    (step,) = [e for e in doc["traceEvents"] if e.get("name") == "ProfilerStep#10"]
    doc["traceEvents"].append({**step, "ts": step["ts"] + 50, "dur": 100})
    with pytest.raises(TraceFormatError, match=r"ProfilerStep#10 appears twice \(ts=\d+ dur=14455, ts=\d+ dur=100\)"):
        _load_one(tmp_path, doc)


def test_annotations_renamed_to_a_step_are_an_error(tmp_path, dlrm_raw):
    doc = _rank0(dlrm_raw)
    for e in doc["traceEvents"]:
        if e.get("cat") == "user_annotation":
            e["name"] = "ProfilerStep#10"
    with pytest.raises(TraceFormatError, match=r"ProfilerStep#10 appears 40 times \(.{100,120}\): each step is marked once"):
        _load_one(tmp_path, doc)


def test_every_kernel_twice_is_an_error(tmp_path, dlrm_raw):
    """Replay predicted +33 % for a trace whose kernels were all exported twice."""
    doc = _rank0(dlrm_raw)
    doc["traceEvents"] += [copy.deepcopy(e) for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    with pytest.raises(TraceFormatError, match=r"exported twice on streams 7, 24, 84 \(245 pairs; first .* twice\)"):
        _load_one(tmp_path, doc)


def test_one_correlation_id_for_every_launch_is_an_error(tmp_path, dlrm_raw):
    """Every correlation 1 made replay predict 3050 ms for a 14 ms step."""
    doc = _rank0(dlrm_raw)
    for e in doc["traceEvents"]:
        if "correlation" in e.get("args", {}):
            e["args"]["correlation"] = 1
    with pytest.raises(TraceFormatError, match="correlation id 1 is used by 525 runtime calls"):
        _load_one(tmp_path, doc)


@pytest.mark.parametrize("field", ["ts", "dur"])
def test_kernels_without_times_are_an_error(tmp_path, shared_data, field):
    """Without 'ts' the 4 kernels were dropped ('a CPU-only capture'); without 'dur', busy 0 s."""
    import gzip

    doc = json.loads(gzip.decompress((shared_data / "traces/hta_misc/benchmark_simple_add_trace.json.gz").read_bytes()))
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            del e[field]
    with pytest.raises(TraceFormatError, match=f"4 kernel events lack '{field}'"):
        _load_one(tmp_path, doc)


# -- messages and limits ---------------------------------------------------------------------------

LONG = "void cutlass::Kernel<" + "cutlass_80_tensorop_s1688gemm_" * 180 + ">"  # ~5,400 characters


@pytest.mark.parametrize(
    "change",
    [
        lambda k: k["args"].update(stream="seven"),
        lambda k: k.update(ts=k["ts"] * 5),  # far outside the trace's time range
        lambda k: k["args"].update(grid=["a", 1, 1]),
        lambda k: k["args"].update({"Process Group Ranks": list(range(2000)) * 2}),
    ],
)
def test_messages_cut_long_names_and_values(tmp_path, dlrm_raw, change):
    """A message about one event embedded its whole 5,300-character kernel name."""
    doc = _rank0(dlrm_raw)
    kernel = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
    kernel["name"] = LONG
    change(kernel)
    with pytest.raises(TraceFormatError) as info:
        _load_one(tmp_path, doc)
    assert "void cutlass::Kernel<cutlass_80" in info.value.problem and "…" in info.value.problem
    assert len(info.value.problem) < 500


def _no_memory(*args, **kwargs):
    raise MemoryError


def test_a_gzip_too_large_for_memory_is_one_line(tmp_path, monkeypatch):
    """A 3 MB gzip expanding to 3.3 GB under `ulimit -v 6000000` gave a MemoryError traceback."""
    import gzip

    from trainsim.ingest import sources

    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * 5_000_000 + b"]}"))
    monkeypatch.setattr(sources.gzip, "decompress", _no_memory)
    with pytest.raises(TraceFormatError) as info:
        load_traces([path])
    assert info.value.path == str(path)
    assert info.value.problem.startswith("too large to load in this memory (its gzip trailer records 0.01 GB uncompressed)")


def test_json_too_large_to_decode_is_one_line(tmp_path, monkeypatch):
    import msgspec

    path = tmp_path / "rank0.json"
    path.write_text('{"traceEvents": []}')
    monkeypatch.setattr(msgspec.json, "decode", _no_memory)
    with pytest.raises(TraceFormatError, match=r"rank0.json: too large to load in this memory \(0.00 GB of JSON\)"):
        load_traces([path])
