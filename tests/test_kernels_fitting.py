"""Fitting: selection never sees the held-out rows, timing failures are screened out, the
chosen model is refitted on every plausible row, strict monotonicity is available."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from trainsim.hardware import get_device
from trainsim.kernels import fit_entry, fit_kernels, read_kernel_dataset
from trainsim.kernels.fitting import Candidate, _choose
from trainsim.kernels.monotone import monotone_violation
from trainsim.kernels.samples import KernelDataset, heldout_rows

A100 = get_device("a100")
KINDS = ("poly", "roofline", "xgboost")


@pytest.fixture(scope="module")
def layernorm(shared_data) -> KernelDataset:
    return read_kernel_dataset(
        [shared_data / "calibration/a100-sxm4-80gb_perlmutter/operator"], ops=["layernorm"]
    )


def _with_durations(ds: KernelDataset, key, scale: np.ndarray) -> KernelDataset:
    rows = ds.select(key)
    changed = {
        id(r): dataclasses.replace(r, duration_s=r.duration_s * f)
        for r, f in zip(rows, scale, strict=True)
    }
    return KernelDataset(
        ds.name, [changed.get(id(s), s) for s in ds], ds.device, ds.fingerprint, set(ds.formats)
    )


@pytest.mark.shared_data
def test_held_out_rows_never_influence_the_choice(layernorm):
    key = layernorm.entry_keys()[0]
    n = len(layernorm.select(key))
    test = heldout_rows(n, fraction=0.2, seed=0, label=key.label)
    _, _, a = fit_entry(layernorm, key, device=A100, kinds=KINDS, refit_all=False)
    corrupted = _with_durations(layernorm, key, np.where(test, 50.0, 1.0))
    _, _, b = fit_entry(corrupted, key, device=A100, kinds=KINDS, refit_all=False)
    assert (a.kind, a.config) == (b.kind, b.config)
    assert [c.val_mape_pct for c in a.candidates] == [c.val_mape_pct for c in b.candidates]
    assert [p for _, p in a.heldout] == [p for _, p in b.heldout]  # same predictions ...
    assert b.heldout_mape_all_rows_pct > 90  # ... of rows that now measure 50x longer
    assert (
        a.heldout_rows == int(test.sum()) == round(0.2 * n) and a.train_rows == n - a.heldout_rows
    )
    assert a.heldout_mape_pct is not None and a.heldout_mape_pct < 10


@pytest.mark.shared_data
def test_timing_failures_are_left_out(layernorm):
    key = layernorm.entry_keys()[1]
    n = len(layernorm.select(key))
    scale = np.ones(n)
    scale[np.flatnonzero(~heldout_rows(n, fraction=0.2, seed=0, label=key.label))[:5]] = 1000.0
    entry, _, r = fit_entry(
        _with_durations(layernorm, key, scale), key, device=A100, kinds=("poly", "roofline")
    )
    assert r.excluded == 5 and entry is not None and entry.samples == n - 5
    assert r.heldout_mape_pct < 10


@pytest.mark.shared_data
def test_fit_kernels_refits_on_all_rows_and_records_evidence(layernorm):
    res = fit_kernels(layernorm, kinds=("poly", "roofline"))
    assert res.model is not None and len(res.model.entries) == 2
    for e in res.model.entries.values():
        assert e.samples == 351 and e.metrics["mape_pct"] is not None and e.metrics["candidates"]
        assert e.ranges["dim"] == (2048.0, 8192.0)
    assert res.model.provenance_info["dataset"] == layernorm.name


@pytest.mark.shared_data
def test_strict_monotone_trees(layernorm):
    key = layernorm.entry_keys()[0]
    entry, _, r = fit_entry(layernorm, key, device=A100, kinds=("xgboost",), strict_monotone=True)
    assert r.kind == "xgboost" and entry is not None
    raw, _, _ = layernorm.arrays(key)
    assert monotone_violation(entry, raw, np.arange(351), A100, step=None) == 0.0


def test_a_smaller_model_within_two_percent_wins():
    big = Candidate("xgboost", {}, 5.00, 100_000)
    small = Candidate("poly", {}, 5.09, 1_000)
    worse = Candidate("roofline", {}, 5.20, 100)
    rejected = Candidate("mlp", {}, 1.0, 10, "not monotone")
    assert _choose([big, small, worse, rejected]) is small
    assert _choose([rejected]) is None


def test_duplicate_shapes_are_one_training_point():
    from trainsim.kernels.fitting import _merge_duplicates

    inputs = {"b": np.array([1.0, 2.0, 1.0, 3.0, 2.0]), "l": np.array([4.0, 4.0, 4.0, 4.0, 4.0])}
    y = np.array([1.0, 5.0, 3.0, 7.0, 9.0])
    rows, merged = _merge_duplicates(inputs, y, np.array([0, 1, 2, 3]))  # row 4 held out
    assert rows.tolist() == [0, 1, 3]
    assert merged[0] == 2.0 and merged[1] == 5.0 and merged[4] == 9.0  # held-out row untouched
    assert y[0] == 1.0  # the caller's array is not modified


def test_l1_lightgbm_is_offered_but_never_constrained():
    from trainsim.kernels.learned import configs, constrainable, kind

    lgb, xgb = kind("lightgbm"), kind("xgboost")
    l1 = [c for c in configs(lgb, "quick") if c.get("objective") == "l1"]
    assert l1 and not constrainable(lgb, l1[0])
    assert all(constrainable(xgb, c) for c in configs(xgb, "quick"))
    assert any(c.get("objective") == "reg:absoluteerror" for c in configs(xgb, "quick"))
