"""Session-31 walkthrough findings (capture / analyze / replay): each with the case it broke."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainsim.errors import ConfigError

DLRM = "examples/data/param_dlrm_8xv100"


def test_two_outputs_at_one_path_are_refused(tmp_path: Path) -> None:
    """analyze printed "wrote overhead_db" and "wrote kernel_samples" for one path; only the
    CSV survived."""
    from trainsim.cli.output import distinct_outputs

    x = tmp_path / "x.csv"
    with pytest.raises(ConfigError, match=r"^--export-kernels .*x\.csv: the same file as --overhead-db; "):
        distinct_outputs(((x, "--overhead-db"), (None, "--save-workload"), (x, "--export-kernels")))
    distinct_outputs(((x, "--overhead-db"), (tmp_path / "y.csv", "--export-kernels")))


def test_save_workload_replaces_only_a_file_trainsim_wrote(tmp_path: Path) -> None:
    """--save-workload overwrote any file silently (while --timeline refused a foreign one)."""
    import subprocess
    import sys

    def analyze(out: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "trainsim", "analyze", DLRM, "--save-workload", str(out)],
                              capture_output=True, text=True, timeout=300, check=False)  # fmt: skip

    mine = tmp_path / "notes.json"
    mine.write_text('{"my": "data"}', encoding="utf-8")
    r = analyze(mine)
    assert r.returncode == 1 and "exists and is not a workload trainsim wrote" in r.stderr
    assert mine.read_text(encoding="utf-8") == '{"my": "data"}'
    ir = tmp_path / "w.json"
    for _ in range(2):  # a workload trainsim wrote is replaced
        r = analyze(ir)
        assert r.returncode == 0, r.stderr
    # another trainsim artifact is not (review: an overhead database replaced a saved workload)

    db = subprocess.run([sys.executable, "-m", "trainsim", "analyze", DLRM, "--overhead-db", str(ir)],
                        capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert db.returncode == 1 and "is not a overhead database trainsim wrote" not in db.stderr
    assert "exists and is not an overhead database trainsim wrote" in db.stderr
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    assert analyze(empty).returncode == 0  # an empty file (mktemp's) is replaced


def _cli(*args: str) -> tuple[int, str]:
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "trainsim", *args], capture_output=True, text=True, timeout=300,
                       check=False)  # fmt: skip
    return p.returncode, " ".join((p.stdout + p.stderr).split())


SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"


@pytest.mark.skipif(not SHARED.is_dir(), reason="needs ../shared/data")
def test_what_ifs_that_change_nothing_say_so_and_one_rank_is_not_matched() -> None:
    """--network-speedup on a trace without collectives gave +0.00 % silently; a one-rank
    trace said "collectives matched across ranks: 7/7"; a Triton trace's empty window read
    "1.33e+04 ms"; a network slowdown read "network ×0.5 faster"."""
    code, out = _cli("replay", str(SHARED / "hta_resnet50_v100"), "--network-speedup", "2")
    assert code == 0 and "--network-speedup: the trace has no collectives: nothing was scaled" in out
    assert "% against the replayed step" in out
    code, out = _cli("replay", DLRM, "--network-speedup", "0.5")
    assert code == 0 and "network at ×0.5 speed (slower)" in out and "no collectives" not in out
    code, out = _cli("analyze", str(SHARED / "hta_resnet50_ddp_a100"))
    assert code == 0 and "collectives: 7 (broadcast 2, all_reduce 5; one rank: not matched)" in out
    assert "matched across ranks" not in out and "earliest rank start" not in out
    code, out = _cli("analyze", str(SHARED / "hta_misc" / "triton_example.json.gz"))
    assert code == 0 and "no op in the last 13.3 s (100 %)" in out


def test_suites_that_measure_here_do_not_need_the_data_folder() -> None:
    """validate predtop --data /nonexistent failed on a folder it never reads."""
    from trainsim.validate.registry import get_suite, run_suite

    assert {n for n in ("predtop", "cpu-e2e", "shard", "gpu-e2e") if not get_suite(n).reads_data} == {
        "predtop", "cpu-e2e", "shard", "gpu-e2e"}
    assert get_suite("llm").reads_data
    with pytest.raises(ConfigError, match="does not exist; pass --data"):
        run_suite("llm", Path("/nonexistent-data"))
    with pytest.raises(ConfigError, match="--members must be at least 1"):  # got past the data check
        run_suite("predtop", Path("/nonexistent-data"), members=0)


def test_a_missing_trace_is_the_error_before_what_ifs_read_beside_it() -> None:
    """`replay traces/my_capture --batch 128` asked for --old-batch; the path did not exist."""
    code, out = _cli("replay", "traces/no_such_capture", "--batch", "128")
    assert code == 1 and "traces/no_such_capture: no such file or folder" in out and "--old-batch" not in out


def test_the_tour_inputs_ship_with_the_repository() -> None:
    """The README's predict examples named ./config.json and my-model.yaml, which no clone has."""
    from trainsim.builders.models import get_model

    hf = get_model("examples/models/mistral-7b/config.json")
    assert (hf.hidden, hf.layers, hf.heads, hf.kv_heads, hf.vocab) == (4096, 32, 32, 8, 32000)
    y = get_model("examples/models/gpt-1.3b.yaml")
    assert (y.name, y.hidden, y.layers, y.heads) == ("gpt-1.3b", 2048, 24, 16)


def test_eager_pytorch_reduces_gradients_during_the_backward_by_default() -> None:
    """--impl hf is eager PyTorch, trained under DDP, whose gradient buckets overlap the backward
    by default; the plan reduced them after it unless --overlap-grad-reduce was given (ZeRO-0 was
    slower than ZeRO-3 on Mistral-7B over 8 H100s: 551 vs 389 ms)."""
    import json

    base = ["predict", "examples/models/mistral-7b", "--system", "dgx-h100", "--gpus", "8", "--seq-len", "1024",
            "--impl", "hf", "--closed-form", "--format", "json"]  # fmt: skip
    import subprocess
    import sys

    def run(*extra: str) -> tuple[dict, str]:
        p = subprocess.run([sys.executable, "-m", "trainsim", *base, *extra], capture_output=True, text=True,
                           timeout=300, check=True)  # fmt: skip
        return json.loads(p.stdout), " ".join(p.stderr.split())

    on, note = run()
    off, quiet = run("--no-overlap-grad-reduce")
    assert "reduced during the backward, as PyTorch DDP does by default" in note and "DDP does" not in quiet
    assert on["breakdown"]["exposed_dp_communication_s"] < off["breakdown"]["exposed_dp_communication_s"]
    assert on["iteration_time_s"] < off["iteration_time_s"]
