"""Review findings of a `trainsim fit` walkthrough (2026-12-01), at the command line:

* the summary printed ``mean MAPE nan %`` when one entry had no plausible held-out row, and that
  entry's model shipped looking like the others;
* `fit b2.jsonl` without --device failed beside the ``b2.device.yaml`` that `trainsim bench`
  had just written and announced.
"""

from __future__ import annotations

import json

import numpy as np
import yaml
from typer.testing import CliRunner

from tests.test_fit_review_split import KEY, _dataset, _shapes
from trainsim.cli.main import _register, app
from trainsim.errors import ModelError
from trainsim.hardware import get_device
from trainsim.kernels import write_kernel_dataset
from trainsim.kernels.samples import heldout_rows

DEVICE = "Review Test CPU"  # in no catalog


def _run(*args: str):
    _register()
    return CliRunner().invoke(app, list(args))


def _device_file(path, aliases: list[str]) -> None:
    doc = get_device("a100-sxm4-80gb").model_dump(mode="json", exclude_none=True)
    doc.update(name="review-test-cpu-0123abcd", aliases=aliases)
    path.write_text(yaml.safe_dump(doc))


def _data(tmp_path, *, bad_heldout: bool = False):
    shapes = _shapes()
    scale = None
    if bad_heldout:
        scale = np.where(heldout_rows(len(shapes), fraction=0.2, seed=0, label=KEY.label), 50.0, 1.0)
    return write_kernel_dataset(_dataset(shapes, scale=scale, device=DEVICE), tmp_path / "b2.jsonl")


def test_fit_uses_the_device_file_the_bench_wrote_beside_the_dataset(tmp_path):
    path = _data(tmp_path)
    _device_file(tmp_path / "b2.device.yaml", [DEVICE])
    res = _run("fit", str(path), "--kinds", "poly,roofline", "--format", "json")
    assert res.exit_code == 0, res.output
    assert "using" in res.stderr and "b2.device.yaml" in res.stderr
    assert json.loads(res.stdout)["device"] == "review-test-cpu-0123abcd"


def test_without_it_the_error_names_the_file_it_looked_for(tmp_path):
    path = _data(tmp_path)
    res = _run("fit", str(path), "--kinds", "poly")
    assert res.exit_code == 1 and isinstance(res.exception, ModelError)
    assert "b2.device.yaml" in str(res.exception) and "--device" in str(res.exception)
    _device_file(tmp_path / "b2.device.yaml", ["Another CPU"])  # a file of another machine: not taken
    res = _run("fit", str(path), "--kinds", "poly")
    assert res.exit_code == 1 and "another device" in str(res.exception)


def test_an_entry_without_a_heldout_score_is_flagged_and_the_mean_stays_a_number(tmp_path):
    path = _data(tmp_path, bad_heldout=True)
    res = _run("fit", str(path), "--kinds", "poly,roofline", "--device", "a100")
    assert res.exit_code == 0, res.output
    assert "nan" not in res.stdout.lower()
    assert "no held-out MAPE for any of the 1 entries" in res.stdout
    assert "(!)" in res.stdout and "more than 10x" in res.stdout  # in the table and below it
    assert "warning: layernorm/fwd/fp32" in res.stderr
    res = _run("fit", str(path), "--kinds", "poly,roofline", "--device", "a100", "--format", "json")
    doc = json.loads(res.stdout)
    (m,) = doc["models"]
    assert m["mape_pct"] is None and m["heldout_implausible_rows"] == m["heldout_rows"] == 8
    assert "more than 10x" in doc["entries_without_heldout_score"]["layernorm/fwd/fp32"]
    assert m["rows"] == m["heldout_rows"] + m["train_rows"] + m["excluded_rows"] + m["merged_rows"]
