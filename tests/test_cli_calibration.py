"""``--kernel-models`` / ``--comm-models`` on predict and search: a user's own fitted artifacts
answer before the shipped models (review finding: only ``shard`` could use them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

OPERATORS = "calibration/a100-sxm4-80gb_perlmutter/operator"


def _trainsim(*args: str) -> subprocess.CompletedProcess[str]:
    # a subprocess each: the options set environment variables the registries read
    return subprocess.run([sys.executable, "-m", "trainsim", *args], capture_output=True, text=True, timeout=300,
                          check=False)  # fmt: skip


@pytest.fixture(scope="module")
def artifact(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fit") / "my.npz"
    r = _trainsim("fit", str(shared_data / OPERATORS), "--op", "layernorm", "--kinds", "roofline",
                  "--name", "my-a100", "-o", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr
    return out


def test_predict_and_search_use_a_users_kernel_artifact(artifact: Path) -> None:
    r = _trainsim("predict", "gpt2", "--gpus", "8", "--kernel-models", str(artifact), "--format", "json")
    assert r.returncode == 0, r.stderr
    kernels = json.loads(r.stdout)["provenance"]["kernels"]
    assert any(k.startswith("calibrated:my-a100") for k in kernels)
    r = _trainsim("predict", "gpt2", "--gpus", "8", "--format", "json")
    assert not any("my-a100" in k for k in json.loads(r.stdout)["provenance"]["kernels"])
    r = _trainsim("search", "gpt2", "--gpus", "8", "--global-batch", "32", "--tp", "1,2", "--pp", "1",
                  "--micro-batch", "1", "--workers", "2", "--kernel-models", str(artifact), "--format", "json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["plans"]


def test_artifacts_of_another_device_or_system_are_refused(artifact: Path) -> None:
    r = _trainsim("predict", "gpt2", "--system", "dgx-h100", "--kernel-models", str(artifact))
    assert r.returncode == 1 and "fitted on device a100-sxm4-80gb" in r.stderr and "Traceback" not in r.stderr
    comm = Path(__file__).resolve().parents[1] / "src/trainsim/comm/data/perlmutter_a100_nccl.json"
    r = _trainsim("predict", "gpt2", "--comm-models", str(comm))
    assert r.returncode == 1 and "measured on system perlmutter, not dgx-a100" in r.stderr
    r = _trainsim("predict", "gpt2", "--system", "perlmutter", "--gpus", "8", "--tp", "4",
                  "--comm-models", str(comm), "--format", "json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = _trainsim("predict", "gpt2", "--kernel-models", "/nonexistent/x.npz")
    assert r.returncode == 1 and "does not exist" in r.stderr
    # another tool's JSON (here an overhead database) is named as not a comm model (walkthrough 2026-11-27)
    other = artifact.parent / "overheads.json"
    other.write_text('{"schema_version": "2.0", "per_op": {}}')
    r = _trainsim("predict", "gpt2", "--comm-models", str(other))
    assert r.returncode == 1 and "overheads.json: not a comm model" in " ".join(r.stderr.split())


def test_artifact_options_do_not_leak_into_later_calls_and_caches_follow_them(shared_data: Path, tmp_path: Path) -> None:
    """Review findings: the variables stayed set after an in-process call, and the collective
    cache (keyed by system name) answered a later call with the other models' times."""
    import os

    from typer.testing import CliRunner

    from trainsim.cli.main import _register, app
    from trainsim.comm.registry import USER_MODELS_ENV

    # a user's fit of Perlmutter's intra-node all-reduce from data 10x slower than 001's
    nccl = shared_data / "calibration/a100-sxm4-80gb_perlmutter/nccl"
    folder = tmp_path / "nccl"
    folder.mkdir()
    for name in ("NVIDIAA100-SXM4-80GB_allreduce_fp16_1_4.csv", "NVIDIAA100-SXM4-80GB_allreduce_large_fp16_1_4.csv"):
        lines = (nccl / name).read_text(encoding="utf-8-sig").splitlines()
        rows = [lines[0]] + [",".join([*r.split(",")[:-1], str(10 * float(r.split(",")[-1]))]) for r in lines[1:] if r]
        (folder / name).write_text("\n".join(rows) + "\n")
    slow = tmp_path / "slow.json"
    r = _trainsim("fit-comm", str(folder), "--system", "perlmutter", "-o", str(slow))
    assert r.returncode == 0, r.stderr
    _register()
    args = ["predict", "gpt2", "--system", "perlmutter", "--gpus", "8", "--tp", "4", "--format", "json"]

    def run(*extra: str) -> tuple[float, float]:
        r = CliRunner().invoke(app, [*args, *extra])
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        return doc["iteration_time_s"], doc["breakdown"]["tp_communication_s"]

    plain, plain_tp = run()
    # TP all-reduces from the 10x slower fit: what they add to the passes grows 4.4x here (GPT-2
    # at tp 4 is launch-bound: the dispatch of its kernels hides part of them), the step 9 %
    step, tp = run("--comm-models", str(slow))
    assert tp > 3 * plain_tp and step > 1.05 * plain
    assert USER_MODELS_ENV not in os.environ
    assert run() == pytest.approx((plain, plain_tp))


def test_kernel_artifact_for_a_system_naming_its_device_by_alias(artifact: Path, tmp_path: Path) -> None:
    import yaml

    from trainsim.hardware import get_system

    doc = get_system("dgx-a100").model_dump(mode="json")
    doc.update(name="my-a100-box", aliases=[], device="a100")  # an alias of a100-sxm4-80gb
    sysfile = tmp_path / "box.yaml"
    sysfile.write_text(yaml.safe_dump(doc))
    r = _trainsim("predict", "gpt2", "--system", str(sysfile), "--kernel-models", str(artifact))
    assert r.returncode == 0, r.stderr


def test_scheduler_with_local_artifacts_is_refused(artifact: Path) -> None:
    r = _trainsim("search", "gpt2", "--gpus", "8", "--global-batch", "32", "--kernel-models", str(artifact),
                  "--scheduler", "tcp://127.0.0.1:1")  # fmt: skip
    assert r.returncode == 2 and "Dask workers cannot read" in r.stderr  # options that do not go together


def test_a_kept_screening_pool_screens_under_artifacts_set_after_it_started(
    artifact: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The search keeps its worker processes between searches; --kernel-models set after they
    started must still reach them (each chunk carries the variables), and leave with the block."""
    from trainsim.builders.models import get_model
    from trainsim.cli.calibration import use_artifacts
    from trainsim.hardware import get_system
    from trainsim.search import llm
    from trainsim.search.llm import search_llm
    from trainsim.search.space import PlanSpace

    monkeypatch.setattr(llm, "_CHUNK", 2)  # several chunks: the pool screens them
    model, system = get_model("gpt2"), get_system("dgx-a100")
    space = PlanSpace(gpus=8, global_batch=32, tp=(1, 2), pp=(1, 2), micro_batch=(1, 2))

    def closed_forms(workers: int) -> list[tuple[str, float]]:
        r = search_llm(model, system, space, workers=workers, progress=False, top_k=6, simulate_top=6)
        return sorted((p["plan"], p["screened_s"]) for p in r["plans"])

    plain = closed_forms(2)  # starts the pool
    with use_artifacts([artifact], None, system=system):
        mine = closed_forms(2)
        assert mine == closed_forms(1)
    assert mine != plain
    assert closed_forms(2) == plain
