"""``trainsim capture``: every example on 1 and 2 ranks (gloo) writes traces that load.

Sizes are tiny (2 traced steps, 1 thread per rank) so the whole file runs in well under two
minutes on two cores; the captures are shared by the tests through module-scoped fixtures.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainsim.capture import EXAMPLES, MANIFEST_NAME, CaptureResult, capture
from trainsim.errors import CaptureError

pytestmark = pytest.mark.slow

STEPS = 2
# llama13 and llama70 build llama's CPU stand-in on the CPU: capturing them would test nothing new
CASES = [(model, nproc) for model in sorted(EXAMPLES) if model not in ("llama13", "llama70") for nproc in (1, 2)]
SMALL_BATCH = {"dlrm": 32, "gpt2": 2, "llama": 1, "resnet": 4}
# What torch 2.13 writes for gloo collectives (CPU ops; no record_param_comms with gloo).
GLOO_NAMES = {"c10d::allreduce_", "gloo:all_reduce"}


@pytest.fixture(autouse=True, scope="module")
def _offline() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")  # the GPT-2 config is built locally; never download
        yield


@pytest.fixture(scope="module", params=CASES, ids=[f"{m}-{n}rank" for m, n in CASES])
def captured(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    model, nproc = request.param
    out = tmp_path_factory.mktemp(f"{model}-{nproc}")
    return capture(
        model=model, out_dir=out, nproc=nproc, steps=STEPS, warmup_steps=1,
        batch_size=SMALL_BATCH[model], threads_per_rank=1, timeout_s=300,
    )  # fmt: skip


def _read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_writes_one_kineto_and_one_et_per_rank(captured: CaptureResult) -> None:
    nproc = captured.spec.nproc
    names = sorted(p.name for p in captured.trace_dir.iterdir())
    expected = [f"rank{r}.{kind}.json" for r in range(nproc) for kind in ("et", "kineto")]
    assert names == sorted([*expected, MANIFEST_NAME])  # no temporary files left behind
    manifest = _read(captured.trace_dir / MANIFEST_NAME)
    assert manifest["nproc"] == nproc
    assert manifest["versions"]["torch"].startswith("2.")
    assert [r["rank"] for r in manifest["ranks"]] == list(range(nproc))
    assert all(len(r["step_times_s"]) == STEPS for r in manifest["ranks"])
    assert manifest["measured_step_s"] == pytest.approx(captured.measured_step_s)
    assert captured.measured_step_s > 0


def test_traces_load_as_one_workload(captured: CaptureResult) -> None:
    from trainsim.ingest import load_traces

    loaded = load_traces([captured.trace_dir])
    nproc = captured.spec.nproc
    assert sorted(r.rank for r in loaded.workload.ranks) == list(range(nproc))
    assert len(loaded.et_blobs) == nproc
    for r in range(nproc):
        steps = loaded.steps[r]
        assert len(steps) == STEPS
        assert all(s.from_marker and s.end > s.start for s in steps)  # ProfilerStep#N markers
    # One iteration is chosen for all ranks, and gloo collectives (c10d op → gloo worker
    # annotation) become collectives matched across the ranks.
    assert len({s.number for s in loaded.chosen.values()}) == 1
    gloo = [k for r in loaded.workload.ranks for k in r.kernels() if k.features.get("backend") == "gloo"]
    if nproc == 1:
        assert not gloo and loaded.match.instances == 0
    else:
        assert gloo and all(k.collective is not None and k.collective.bytes > 0 for k in gloo)
        assert loaded.match.instances >= 1
        assert loaded.match.matched == loaded.match.instances, loaded.match.problems


def test_model_replay_without_models_is_the_measured_replay(captured: CaptureResult) -> None:
    """Walkthrough finding (2026-12-02): on a 2-rank gloo capture `replay --kernels model` said
    no kernel had a model, so this is the measured-kernel replay, yet predicted +10 % where the
    measured replay gave -5 %: a gloo collective's transfer was its longest member's measured
    duration (which includes waiting for the peer), not the last-arriving member's."""
    from trainsim.ingest import load_traces
    from trainsim.sim import simulate
    from trainsim.sim.options import KernelSource, SimOptions

    w = load_traces([captured.trace_dir]).workload
    measured = simulate(w, SimOptions(kernels=KernelSource.MEASURED))
    model = simulate(w, SimOptions(kernels=KernelSource.MODEL))
    assert model.predicted_step_s == pytest.approx(measured.predicted_step_s, rel=1e-9)
    # a CPU trace has no device kernels to sum: no kernel-sum baseline (it read as -79..-100 %)
    assert measured.device_kernel_sum_baseline_s is None and measured.to_dict()["kernel_sum_baseline_s"] is None


def test_trace_mode_reproduces_every_rank_not_only_the_step(captured: CaptureResult) -> None:
    """gloo's members do not end together: with the trace's host gaps each keeps its measured
    end (walkthrough 2026-12-02: a rank's own step was +64 % on a torchrun DDP trace, +2.4 % on
    a resnet capture, while the step, the slowest rank's, was exact)."""
    from trainsim.ingest import load_traces
    from trainsim.sim import simulate
    from trainsim.sim.options import HostMode, SimOptions
    from trainsim.sim.whatif import faster_network

    w = load_traces([captured.trace_dir]).workload
    res = simulate(w, SimOptions(overheads=HostMode.TRACE))
    for r in res.ranks:
        assert r.measured_step_s is not None
        assert r.predicted_step_s == pytest.approx(r.measured_step_s, rel=5e-3), r.rank
    # the members' measured end offsets are the measurement's, whatever a what-if does to the
    # transfer (review 2026-12-02: taken from scaled durations, they scaled an early member's wait
    # for its peer: a 10x slower network made a rank 27 % slower than the transfers alone)
    for f in (0.1, 10.0):
        scaled = simulate(faster_network(w, f), SimOptions(overheads=HostMode.TRACE))
        assert [i.tails for i in scaled.program.instances] == [i.tails for i in res.program.instances]


def test_execution_traces_have_schema_nodes_and_steps(captured: CaptureResult) -> None:
    for r in captured.ranks:
        et = _read(captured.trace_dir / r.et_file)
        assert isinstance(et["schema"], str)
        assert isinstance(et["nodes"], list)
        assert et["nodes"]
        steps = [n["name"] for n in et["nodes"] if n["name"].startswith("ProfilerStep#")]
        assert len(steps) == STEPS


def test_gloo_collectives_appear_with_two_ranks_only(captured: CaptureResult) -> None:
    nproc = captured.spec.nproc
    for r in captured.ranks:
        kineto = _read(captured.trace_dir / r.kineto_file)
        kineto_names = {e.get("name") for e in kineto["traceEvents"]}
        et_names = {n["name"] for n in _read(captured.trace_dir / r.et_file)["nodes"]}
        if nproc == 1:  # no process group, no DDP
            assert "distributedInfo" not in kineto
            assert not {n for n in kineto_names | et_names if "c10d::" in str(n)}
            continue
        info = kineto["distributedInfo"]
        assert (info["rank"], info["world_size"], info["backend"]) == (r.rank, 2, "gloo")
        assert kineto_names >= GLOO_NAMES
        assert et_names >= {*GLOO_NAMES, "## process_group:init ##"}


def test_cli_json_contract(tmp_path: Path) -> None:
    out = tmp_path / "cli"
    proc = subprocess.run(
        [sys.executable, "-m", "trainsim", "capture", "--model", "dlrm", "--steps", "2",
         "--warmup", "1", "--threads", "1", "--batch-size", "16", "--out", str(out),
         "--format", "json"],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)  # stdout holds the JSON document alone
    assert doc["trace_dir"] == str(out.resolve())
    assert doc["measured_step_s"] > 0
    assert [r["rank"] for r in doc["ranks"]] == [0]
    assert "capturing dlrm" in proc.stderr


def test_cli_error_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "trainsim", "capture", "--model", "bert", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2  # a usage error: --model's value is not in its list
    assert proc.stderr.strip().splitlines() == [
        "trainsim: error: --model must be one of dlrm, gpt2, llama, llama13, llama70, resnet, got 'bert'"
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": "bert"}, "unknown example model 'bert'"),
        ({"nproc": 0}, "--nproc must be at least 1"),
        ({"steps": 0}, "--steps must be at least 1"),
        ({"batch_size": 0}, "--batch-size must be at least 1"),
        ({"device": "tpu"}, "unknown device 'tpu'"),
    ],
)
def test_rejects_bad_requests_before_running(tmp_path: Path, kwargs: dict, message: str) -> None:
    args = {"model": "dlrm", "out_dir": tmp_path / "out", **kwargs}
    with pytest.raises(CaptureError, match=message):
        capture(**args)
    assert not (tmp_path / "out").exists()


def test_cuda_requested_without_a_gpu(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(CaptureError, match="--device cuda requested but"):
        capture(model="dlrm", out_dir=tmp_path, device="cuda")


def test_refuses_to_mix_with_an_earlier_capture(tmp_path: Path) -> None:
    (tmp_path / "rank3.kineto.json").write_text("{}")
    with pytest.raises(CaptureError, match="--overwrite"):
        capture(model="dlrm", out_dir=tmp_path)


def test_failed_worker_is_reported_with_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainsim.capture import distributed

    with socket.socket() as busy:  # rank 0 cannot host the rendezvous on a taken port
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        monkeypatch.setattr(distributed, "free_port", lambda: busy.getsockname()[1])
        with pytest.raises(CaptureError, match=r"rank \d of 2 failed .*its log ends with"):
            capture(model="dlrm", out_dir=tmp_path, nproc=2, threads_per_rank=1, timeout_s=60)
    assert not list(tmp_path.glob("*.json"))


def test_hung_capture_times_out(tmp_path: Path) -> None:
    with pytest.raises(CaptureError, match="timed out after") as e:
        # Many warm-up steps: the ranks cannot finish within the 1 s limit even on a fast machine.
        capture(model="dlrm", out_dir=tmp_path, nproc=2, warmup_steps=100_000, threads_per_rank=1, timeout_s=1.0)
    assert "\n" not in str(e.value) and "give a longer --timeout" in str(e.value)  # one line (walkthrough)


def test_a_failed_capture_leaves_no_part_of_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A capture that fails after some rank wrote its traces (the ET run timing out after the
    Kineto run) removes them and the ranks' half-written temp files: without a capture.json
    they would read as a capture of unknown batch (walkthrough finding, 2026-12-02). A user's
    own files stay."""
    from trainsim.capture import distributed

    def partial(spec: object) -> list[object]:
        (tmp_path / "rank0.kineto.json").write_text("{}", encoding="utf-8")
        (tmp_path / ".rank0.et.json.12345.tmp").write_text("{", encoding="utf-8")
        raise CaptureError("capture of 'dlrm' on 2 ranks timed out after 0.5 s")

    (tmp_path / "notes.txt").write_text("mine", encoding="utf-8")
    monkeypatch.setattr(distributed, "run_ranks", partial)
    with pytest.raises(CaptureError, match="timed out"):
        capture(model="dlrm", out_dir=tmp_path, nproc=2, threads_per_rank=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    fresh = tmp_path / "new"  # a folder the failed capture created itself goes with it (it was left empty)

    def fails(spec: object) -> list[object]:
        (fresh / "rank0.kineto.json").write_text("{}", encoding="utf-8")
        raise KeyboardInterrupt

    monkeypatch.setattr(distributed, "run_ranks", fails)
    with pytest.raises(KeyboardInterrupt):
        capture(model="dlrm", out_dir=fresh, nproc=2, threads_per_rank=1)
    assert not fresh.exists()
    # an earlier interrupted capture's temp file is cleared by the next one's preparation
    (tmp_path / ".rank1.kineto.json.999.tmp").write_text("{", encoding="utf-8")
    from trainsim.capture import _prepare_out_dir

    _prepare_out_dir(tmp_path, overwrite=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_profiler_notices_are_held_back_and_everything_else_passes(tmp_path: Path) -> None:
    """libkineto and the execution-trace observer print 4 routine lines to fd 2 per in-process
    capture (250 in a cpu-e2e run); anything else written there, from C or Python, still shows."""
    code = (
        "import os, sys\n"
        "from trainsim.capture.distributed import _quiet_profiler_logs\n"
        "with _quiet_profiler_logs():\n"
        "    os.write(2, b'USDT:2026 SyncActivityProfilerHandler.cpp:52] profiler_start\\n')\n"
        "    os.write(2, b'[W1202 x.cpp:989] Enabling Execution Trace Observer\\n')\n"
        "    os.write(2, b'a real warning from C\\n')\n"
        "    print('a Python warning', file=sys.stderr)\n"
        "print('after', file=sys.stderr)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert p.stderr.splitlines() == ["a real warning from C", "a Python warning", "after"]
