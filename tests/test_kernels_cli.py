"""CLI contract of ``trainsim fit``: JSON alone on stdout, artifact written, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainsim.kernels import load_model, read_kernel_dataset, write_kernel_dataset

# Until the lead lists trainsim.cli.fit_cmd in COMMAND_MODULES, import it before the entry point.
_ENTRY = "import trainsim.cli.fit_cmd; from trainsim.cli.main import app_entry; app_entry()"
LN = "calibration/a100-sxm4-80gb_perlmutter/operator/NVIDIAA100-SXM4-80GB_layernorm_fp16.csv"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _ENTRY, *args], capture_output=True, text=True, timeout=300,
                          check=False)  # fmt: skip


@pytest.mark.shared_data
def test_fit_seed001_csv_json_and_artifact(shared_data, tmp_path):
    out = tmp_path / "ln.npz"
    p = _cli(
        "fit", str(shared_data / LN), "--kinds", "poly,roofline", "--format", "json", "-o", str(out)
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert [m["entry"] for m in doc["models"]] == ["layernorm/bwd/fp16", "layernorm/fwd/fp16"]
    for m in doc["models"]:
        assert {"family", "kind", "gmae_pct", "mape_pct", "samples"} <= set(m)
        assert m["family"] == "norm" and m["kind"] in ("poly", "roofline") and m["samples"] == 351
    model = load_model(out)
    assert model.device == "a100-sxm4-80gb" and len(model.entries) == 2  # type: ignore[attr-defined]


@pytest.mark.shared_data
def test_fit_our_format_with_family_filter(shared_data, tmp_path):
    ds = read_kernel_dataset(
        [shared_data / "calibration/a100-sxm4-80gb_perlmutter/operator"],
        ops=["layernorm", "res_add"],
    )
    path = write_kernel_dataset(ds, tmp_path / "mine.jsonl")
    p = _cli("fit", str(path), "--family", "elementwise", "--kinds", "roofline", "--format", "json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert {m["op"] for m in doc["models"]} == {"res_add"} and doc["artifact"] is None


def test_bad_input_is_one_line_exit_1(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("op,phase,duration_s\ngemm,fwd,-1\n")
    p = _cli("fit", str(bad))
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.strip().count("\n") == 0 and "bad.csv" in p.stderr


def test_validate_kernels_device_option():
    p = _cli("validate", "kernels", "--device", "tpu")
    assert p.returncode == 2 and "--device must be one of a100, gh200, all, got 'tpu'" in p.stderr  # a usage error


def test_fit_checks_its_output_and_options_before_fitting(shared_data, tmp_path):
    """Review findings: -o x.json failed only after the fit; --folds 0/-2 ran as 1 and 5000 fitted
    empty folds; a negative --seed was a numpy traceback."""
    csv = shared_data / "calibration" / "a100-sxm4-80gb_perlmutter" / "operator" / "NVIDIAA100-SXM4-80GB_softmax_fp16.csv"
    p = _cli("fit", str(csv), "--kinds", "poly", "-o", str(tmp_path / "x.json"))
    assert p.returncode == 2 and ".npz files" in p.stderr and "rows" not in p.stderr  # a usage error: nothing fitted
    p = _cli("fit", str(csv), "--kinds", "poly", "--folds", "0")
    assert p.returncode == 2 and "--folds" in p.stderr  # typer's own range check (min=1)
    assert _cli("fit", str(csv), "--kinds", "poly", "--seed", "-1").returncode == 2
