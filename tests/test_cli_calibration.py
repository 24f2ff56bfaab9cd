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
    return subprocess.run([sys.executable, "-m", "trainsim", *args], capture_output=True, text=True, timeout=300)


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
