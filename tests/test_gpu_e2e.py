"""``trainsim validate gpu-e2e`` on the shipped H100 captures, and its input checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainsim.errors import ConfigError
from trainsim.validate import gpu_e2e_suite as suite


@pytest.fixture(scope="module")
def doc(tmp_path_factory: pytest.TempPathFactory) -> dict:
    cache = tmp_path_factory.mktemp("gpu_e2e")
    mp = pytest.MonkeyPatch()
    mp.setattr(suite, "default_cache_dir", lambda: cache)
    try:
        return suite.run_gpu_e2e_suite(Path())
    finally:
        mp.undo()


def test_shipped_captures_resize_and_simulate(doc: dict) -> None:
    assert doc["params"]["gpu"] == "NVIDIA H100 80GB HBM3"
    assert doc["params"]["bases"] == {"dlrm": 16384, "gpt2": 1024, "llama": 4, "resnet": 1024}
    assert "(shipped cuda_full_03b482ae582e2c80.models.npz)" in doc["kernel_models"], (
        "the shipped H100 models no longer match their sample or FIT_REVISION: refit them with "
        "`trainsim fit` on the sample and record the digest in its provenance (docs/gpu.md)"
    )
    by = {(c["model"], c["batch_to"]): c for c in doc["cases"]}
    assert len(by) == 10 and all(c["error_pct"] is not None and c["rules"] for c in by.values())
    base = {b["model"]: b["simulated_step_s"] for b in doc["base_replay"]}
    for model, small, large in (("gpt2", 512, 2048), ("resnet", 512, 2048), ("llama", 2, 8)):
        # GPU-bound steps: a resized kernel's prediction reaches the simulator (it once fell
        # back to the measured duration, so every batch predicted the base step)
        assert by[(model, small)]["predicted_s"] < 0.8 * base[model] < 0.8 * by[(model, large)]["predicted_s"]
    assert all(abs(b["error_pct"]) < 10 for b in doc["base_replay"])  # unresized replay
    # LLaMA at 4x its base: every kernel scales with the tokens (two real-size layers, GPU-bound),
    # so the prediction grows by nearly 4x: casts and slice backwards launch kernels (no views),
    # and the loss and attention beyond the measured work are carried (they grew 1.2-2x before)
    assert 3.5 * base["llama"] < by[("llama", 16)]["predicted_s"] < 4.2 * base["llama"]


def test_discover_rejects_folders_without_gpu_captures(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such folder"):
        suite.discover(tmp_path / "nope")
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "capture.json").write_text(json.dumps(
        {"model": "dlrm", "batch_size": 64, "device": "cpu", "nproc": 1}))  # fmt: skip
    with pytest.raises(ConfigError, match="no single-GPU CUDA capture"):
        suite.discover(tmp_path)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "capture.json").write_text("{")
    with pytest.raises(ConfigError, match="not a trainsim capture manifest"):
        suite.discover(tmp_path)


def test_one_batch_per_model_is_refused(tmp_path: Path) -> None:
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "capture.json").write_text(json.dumps(
        {"model": "gpt2", "batch_size": 8, "device": "cuda", "nproc": 1}))  # fmt: skip
    with pytest.raises(ConfigError, match="one batch only"):
        suite.run_gpu_e2e_suite(Path(), resume=str(tmp_path))


def _trainsim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainsim", *args], capture_output=True, text=True, timeout=300,
                          check=False, env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip


def test_replay_batch_what_if_on_a_gpu_capture(tmp_path: Path) -> None:
    """`trainsim replay CAPTURE --batch N`: the traced batch from capture.json, the H100 models."""
    folder = suite._unpack_shipped(tmp_path) / "resnet_b1024_t1_s5_r0"
    p = _trainsim("replay", str(folder), "--batch", "2048", "--format", "json")
    assert p.returncode == 0, p.stderr
    w = json.loads(p.stdout)["whatif"]
    assert w["applied"][0].startswith("batch 1024 → 2048 (kernel models: calibrated")
    assert 60 < w["change_pct"] < 130  # a GPU-bound step: about twice the work
    for args, message in ((("--old-batch", "8"), "give --batch too"), (("--batch", "0"), "positive integer")):
        p = _trainsim("replay", str(folder), *args)
        assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr  # usage errors
    # an --old-batch that contradicts capture.json is used, and said so (walkthrough 2026-11-27)
    p = _trainsim("replay", str(folder), "--batch", "2048", "--old-batch", "512", "--format", "json")
    assert p.returncode == 0, p.stderr
    assert "--old-batch 512 differs from the batch capture.json records (1024)" in " ".join(p.stderr.split())
