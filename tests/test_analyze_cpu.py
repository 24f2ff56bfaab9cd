"""analyze and replay of real CPU captures (torch.distributed with gloo, no GPU), made here.

A gloo rank's "kernels" are its collectives, run by CPU worker threads: the rank's step is its
ProfilerStep window (the optimizer step runs after the last all-reduce), it has no device idle
time or GPU utilisation, and its collectives are gloo's, not NCCL's. The expected step comes
from the raw Kineto JSON (standard-library parsing), not from the ingestion under test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainsim.analyze.report import analyze_paths
from trainsim.capture import capture
from trainsim.ingest import load_traces

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True, scope="module")
def _offline() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")  # the GPT-2 config is built locally; never download
        yield


def _capture(tmp_path_factory: pytest.TempPathFactory, nproc: int) -> Path:
    out = tmp_path_factory.mktemp(f"gpt2-{nproc}")
    capture(model="gpt2", out_dir=out, nproc=nproc, steps=2, warmup_steps=1, batch_size=2,
            threads_per_rank=1, timeout_s=300)  # fmt: skip
    return out


@pytest.fixture(scope="module")
def gloo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _capture(tmp_path_factory, 2)


@pytest.fixture(scope="module")
def single_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _capture(tmp_path_factory, 1)


def _annotations(folder: Path, rank: int, prefix: str) -> list[tuple[str, float, float]]:
    """(name, start, end in µs) of the user annotations named ``prefix…``, from the raw JSON."""
    doc = json.loads((folder / f"rank{rank}.kineto.json").read_text(encoding="utf-8"))
    return [
        (e["name"], e["ts"], e["ts"] + e["dur"])
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e["name"].startswith(prefix)
    ]


def _profiler_steps(folder: Path, rank: int) -> dict[int, tuple[float, float]]:
    """ProfilerStep number → (start, end) in µs."""
    return {int(n.split("#")[1]): (lo, hi) for n, lo, hi in _annotations(folder, rank, "ProfilerStep#")}


def test_a_gloo_rank_step_is_its_profiler_step_window(gloo_dir: Path) -> None:
    loaded = load_traces([gloo_dir])
    w = loaded.workload
    starts, ends = [], []
    for r in w.ranks:
        lo, hi = _profiler_steps(gloo_dir, r.rank)[loaded.chosen[r.rank].number]
        starts.append(lo)
        ends.append(hi)
        assert r.measured_step_s == pytest.approx((hi - lo) * 1e-6, abs=2e-6)
        assert any(k.on_host for k in r.kernels()) and r.cpu_only  # collectives, no device kernel
        # the optimizer step, after the main thread waited for the last all-reduce, is in it
        (opt_end,) = [e for _, s, e in _annotations(gloo_dir, r.rank, "Optimizer.step#") if lo <= s < hi]
        assert r.step_end_s is not None and r.step_end_s >= opt_end * 1e-6 - loaded.origin - 2e-6
    assert w.measured_step_s == pytest.approx((max(ends) - min(starts)) * 1e-6, abs=2e-6)
    assert w.metadata["device"] == "cpu"


def test_analyze_reports_a_gloo_capture_as_cpu(gloo_dir: Path) -> None:
    doc = analyze_paths([gloo_dir]).to_dict()
    assert doc["device"] == "cpu"
    assert any("no device kernels" in n and "gloo" in n for n in doc["warnings"])
    for r in doc["ranks"]:
        assert r["cpu_only"]
        assert r["device_busy_s"] == 0.0 and r["idle_s"] is None and r["gpu_utilization"] is None
        assert r["family_detail"] and all(f.startswith("gloo_") for f in r["family_detail"])
        assert "gloo_all_reduce" in r["family_detail"]  # DDP's gradient buckets (and buffer broadcasts)
        assert sum(r["family_detail"].values()) == pytest.approx(r["families"]["communication"])
        assert all(s["host_thread"] for s in r["streams"].values())
        comm_s = sum(s["busy_s"] for s in r["streams"].values())  # ≥ the union of the collectives
        assert 0.0 <= r["exposed_comm_s"] <= comm_s + 1e-9
        cpu = [o["cpu_s"] for o in r["top_ops"]]
        assert cpu == sorted(cpu, reverse=True) and all(o["device_s"] == 0.0 for o in r["top_ops"])


def test_replay_of_a_gloo_capture_scores_against_the_whole_step(gloo_dir: Path) -> None:
    """With the trace's own delays the simulator reproduces the measured step: both end with
    the CPU window, not with the last gloo collective."""
    from trainsim.sim import SimOptions
    from trainsim.sim.options import HostMode
    from trainsim.sim.replay import replay_paths

    rep = replay_paths([gloo_dir], SimOptions(overheads=HostMode.TRACE))
    windows = [_profiler_steps(gloo_dir, r.rank)[r.metadata["step"]] for r in rep.workload.ranks]
    expected_s = (max(hi for _, hi in windows) - min(lo for lo, _ in windows)) * 1e-6
    assert rep.measured_step_s == pytest.approx(expected_s, abs=2e-6)
    # ending at the last collective instead would drop the optimizer step and gradient copies:
    # ~1 ms, 2-4 % of these steps
    assert rep.result.predicted_step_s == pytest.approx(rep.measured_step_s, rel=1e-3)
    assert rep.to_dict()["device"] == "cpu"


def test_stats_mode_ends_a_bucket_record_with_its_collective(gloo_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DDP's buckets are recorded only on the gloo worker thread (no ``c10d::`` op): the record
    is the collective. In ``stats`` mode it starts the collective at once and ends with it, so
    the ops tied to it wait for the simulated collective, not for the record's mean wall time
    replayed as a launch call (the old replay: a call of the records' mean, the collective
    after a launch latency derived from it, +7.7 % on a 2-rank GPT-2 capture)."""
    from trainsim.sim import SimOptions
    from trainsim.sim.host import HostModel
    from trainsim.sim.replay import replay_paths

    # a host whose typical runtime call is long (a capture with explicit c10d ops, whose one
    # call lasts the op): a bucket record has no call time of its own for it to take (review)
    monkeypatch.setattr(HostModel, "blocking_call_duration", lambda self: 5e-3)
    rep = replay_paths([gloo_dir], SimOptions())
    res = rep.result
    runs = 0
    for rp, t in zip(res.program.ranks, res.evaluation.times, strict=True):
        for ki, k in enumerate(rp.kernels):
            ci = rp.k_call[ki]
            oi = rp.call_op[ci]
            if not (k.on_host and rp.ops[oi].thread == k.stream):
                continue
            runs += 1
            assert ci in rp.worker_runs and rp.call_block[ci] == (ki,)
            assert t.k_start[ki] == pytest.approx(t.call_start[ci], abs=1e-12)  # starts with its record
            assert t.op_end[oi] >= t.k_end[ki] - 1e-12  # the record ends with (after) its collective
            assert t.op_end[oi] - t.k_end[ki] < 1e-4  # ... not a mean wall time later
    assert runs >= 2  # both ranks' buckets
    for r in rep.to_dict()["ranks"]:
        # a CPU rank, read as analyze reads it: no device busy or idle time
        assert r["cpu_only"] and r["device_busy_s"] == 0.0 and r["idle_s"] is None
        comm_s = sum(s["busy_s"] for s in r["streams"].values())
        assert 0.0 <= r["exposed_comm_s"] <= comm_s + 1e-9


def test_a_gloo_worker_span_past_the_step_window_is_not_in_the_step(
    gloo_dir: Path, tmp_path: Path
) -> None:
    """On a loaded host a gloo worker thread can close its collective's span milliseconds after
    the main thread had the result and left the step (seen here about 1 capture in 6). The
    step is the CPU window: ingestion cuts such a record at it, and the replay reproduces the
    step. The capture is made so: each rank's last collective of every step ends 5 ms after
    the last rank's window (uncut, the replay said 64.4 ms for a 59.4 ms step).
    """
    from trainsim.sim import SimOptions
    from trainsim.sim.options import HostMode
    from trainsim.sim.replay import replay_paths

    late = tmp_path / "late"
    late.mkdir()
    docs = {}
    for f in gloo_dir.iterdir():
        if f.name.endswith(".kineto.json"):
            docs[f.name] = json.loads(f.read_text(encoding="utf-8"))
        else:
            (late / f.name).write_bytes(f.read_bytes())
    ends: dict[str, float] = {}  # step name -> the last rank's window end (µs)
    for doc in docs.values():
        for e in doc["traceEvents"]:
            if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#"):
                ends[e["name"]] = max(ends.get(e["name"], 0.0), e["ts"] + e["dur"])
    stretched = 0
    for name, doc in docs.items():
        xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
        for e in xs:
            if not e["name"].startswith("ProfilerStep#"):
                continue
            lo, hi = e["ts"], e["ts"] + e["dur"]
            gloo = [g for g in xs if g["name"].startswith("gloo:") and lo <= g["ts"] < hi]
            if gloo:
                last = max(gloo, key=lambda g: g["ts"])
                last["dur"] = ends[e["name"]] + 5000.0 - last["ts"]
                stretched += 1
        (late / name).write_text(json.dumps(doc), encoding="utf-8")
    assert stretched >= 2

    rep = replay_paths([late], SimOptions(overheads=HostMode.TRACE))
    windows = [_profiler_steps(late, r.rank)[r.metadata["step"]] for r in rep.workload.ranks]
    expected_s = (max(hi for _, hi in windows) - min(lo for lo, _ in windows)) * 1e-6
    assert rep.measured_step_s == pytest.approx(expected_s, abs=2e-6)
    assert rep.result.predicted_step_s == pytest.approx(rep.measured_step_s, rel=1e-3)
    # a collective ends on every member when its last member's (cut) record does, so a rank
    # may end with it after its own window, but no rank ends after the last window
    assert max(r.end_s for r in rep.result.ranks) == pytest.approx(rep.result.end_s, abs=1e-9)
    assert rep.result.end_s - rep.result.start_s <= rep.measured_step_s * (1 + 1e-3)


def test_analyze_cli_notes_a_multi_rank_cpu_capture(gloo_dir: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "trainsim", "analyze", str(gloo_dir)],
                       capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "device: cpu" in p.stdout and "most CPU time" in p.stdout
    assert "CPU-only capture" in " ".join(p.stderr.split())


def test_a_single_cpu_rank_ranks_its_top_ops_by_cpu_time(single_dir: Path) -> None:
    doc = analyze_paths([single_dir]).to_dict()
    (r,) = doc["ranks"]
    assert r["cpu_only"] and r["kernels"] == 0 and doc["device"] == "cpu"
    lo, hi = _profiler_steps(single_dir, 0)[doc["chosen_step"]["0"]]
    assert r["step_time_s"] == pytest.approx((hi - lo) * 1e-6, abs=2e-6)
    cpu = [o["cpu_s"] for o in r["top_ops"]]
    assert len(cpu) == 10 and cpu == sorted(cpu, reverse=True)
    # the heaviest op name: the largest summed CPU time of any op name in the step
    totals: dict[str, float] = {}
    for o in load_traces([single_dir]).workload.ranks[0].ops:
        totals[o.name] = totals.get(o.name, 0.0) + (o.duration_s or 0.0)
    assert r["top_ops"][0]["op"] == max(totals, key=lambda n: totals[n])
    assert any("no device kernels" in n for n in doc["warnings"])


def test_a_timeline_names_gloo_workers_and_their_collectives(gloo_dir: Path, tmp_path: Path) -> None:
    """The timeline labelled gloo collectives ``nccl_all_reduce`` and showed each worker thread
    twice under anonymous names (walkthrough, 2026-12-02)."""
    from trainsim.sim import SimOptions
    from trainsim.sim.replay import replay_paths
    from trainsim.sim.timeline import write_timeline

    rep = replay_paths([gloo_dir], SimOptions())
    doc = json.loads(write_timeline(rep.result, tmp_path / "t.json").read_text(encoding="utf-8"))
    names = {e["args"]["name"] for e in doc["traceEvents"] if e.get("ph") == "M" and e["name"] == "thread_name"}
    assert any(n.endswith("(collectives)") for n in names) and any(n.endswith("(CPU records)") for n in names)
    families = {e["args"]["family"] for e in doc["traceEvents"] if e.get("cat") == "kernel"}
    assert families and all(f.startswith("gloo_") for f in families)


def test_a_saved_workload_keeps_what_its_capture_recorded(single_dir: Path, tmp_path: Path) -> None:
    """`replay w.json --batch N` needed --old-batch: the IR dropped the capture.json beside
    the traces it came from (walkthrough, 2026-12-02)."""
    from trainsim.cli.replay_cmd import _manifest_batch
    from trainsim.ir import load_workload

    ir = tmp_path / "w.json"
    analyze_paths([single_dir], save_workload_to=ir)
    assert load_workload(ir).metadata["capture"]["batch_size"] == 2
    assert _manifest_batch([ir]) == 2 and _manifest_batch([tmp_path]) is None
    # an unrelated capture.json beside the saved file does not win over its own record (review)
    (tmp_path / "capture.json").write_text(json.dumps({"batch_size": 7}), encoding="utf-8")
    assert _manifest_batch([ir]) == 2 and _manifest_batch([tmp_path]) == 7
