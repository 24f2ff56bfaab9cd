"""Review findings of a `trainsim fit` walkthrough (2026-12-01): the held-out split, entries
without a held-out score, and the row counts of the report.

* A dataset appended to itself (a sweep rerun with ``--no-resume``) put held-out shapes into
  training: layernorm fwd scored 4.4 % held out on the doubled file, 55 % on the unique one.
* An entry whose held-out rows were all more than 10x off its prediction had a NaN MAPE, which
  made the summary's mean NaN and shipped the model looking like any other.
"""

from __future__ import annotations

import numpy as np
import pytest

from trainsim.hardware import get_device
from trainsim.ir.kinds import KernelFamily
from trainsim.kernels import fit_entry
from trainsim.kernels.features import Phase
from trainsim.kernels.fitting import _heldout_by_inputs
from trainsim.kernels.samples import EntryKey, KernelDataset, KernelSample, heldout_rows

A100 = get_device("a100")
KEY = EntryKey("layernorm", Phase.FWD, "fp32")
KINDS = ("poly", "roofline")


def _shapes(n: int = 40) -> list[dict[str, float]]:
    rng = np.random.default_rng(7)
    b = np.unique(np.round(np.geomspace(16, 65536, 4 * n) * rng.uniform(0.9, 1.1, 4 * n)))
    picked = rng.choice(b, size=n, replace=False)
    dims = rng.choice([64.0, 256.0, 1024.0, 4096.0], size=n)
    return [{"b": float(x), "l": 1.0, "dim": float(d)} for x, d in zip(picked, dims, strict=True)]


def _dataset(shapes: list[dict[str, float]], *, scale: np.ndarray | None = None, device: str = "a100",
             copies: int = 1) -> KernelDataset:  # fmt: skip
    """Layernorm rows timed as 4 µs plus 3 passes over the tensor at 1 TB/s, 5 % noise."""
    rng = np.random.default_rng(3)
    noise = rng.uniform(0.95, 1.05, len(shapes))
    f = np.ones(len(shapes)) if scale is None else scale
    rows = [
        KernelSample(KernelFamily.NORM, KEY, s, (4e-6 + 3 * 4 * s["b"] * s["dim"] / 1e12) * e * k, f"synthetic:{i}")
        for i, (s, e, k) in enumerate(zip(shapes, noise, f, strict=True))
    ]  # fmt: skip
    return KernelDataset("synthetic", rows * copies, device)


def test_every_row_of_a_shape_is_on_one_side_and_unique_data_split_as_before():
    shapes = _shapes()
    n = len(shapes)
    inputs = {k: np.array([s[k] for s in shapes] * 2) for k in ("b", "l", "dim")}
    mask = _heldout_by_inputs(inputs, 2 * n, fraction=0.2, seed=0, label=KEY.label)
    assert mask.sum() == 2 * round(0.2 * n)
    assert (mask[:n] == mask[n:]).all()  # a shape and its repeat: the same side
    once = {k: v[:n] for k, v in inputs.items()}
    same = _heldout_by_inputs(once, n, fraction=0.2, seed=0, label=KEY.label)
    assert (same == heldout_rows(n, fraction=0.2, seed=0, label=KEY.label)).all()


def test_a_dataset_appended_to_itself_scores_as_the_unique_one():
    shapes = _shapes()
    _, _, once = fit_entry(_dataset(shapes), KEY, device=A100, kinds=KINDS, refit_all=False)
    _, _, twice = fit_entry(_dataset(shapes, copies=2), KEY, device=A100, kinds=KINDS, refit_all=False)
    assert sorted(m for m, _ in twice.heldout) == sorted(2 * [m for m, _ in once.heldout])
    assert twice.heldout_mape_pct == pytest.approx(once.heldout_mape_pct, rel=1e-9)
    assert (twice.kind, twice.config) == (once.kind, once.config)
    # the report's rows add up: the repeats of training shapes are merged, not lost
    assert once.rows == once.heldout_rows + once.train_rows + once.excluded + once.merged
    assert twice.rows == twice.heldout_rows + twice.train_rows + twice.excluded + twice.merged
    assert (twice.rows, twice.train_rows, twice.merged) == (80, once.train_rows, once.train_rows)


def test_an_entry_whose_heldout_rows_are_all_implausible_has_no_score_and_says_why():
    shapes = _shapes()
    test = heldout_rows(len(shapes), fraction=0.2, seed=0, label=KEY.label)
    ds = _dataset(shapes, scale=np.where(test, 50.0, 1.0))  # held-out rows 50x slow: timing failures
    entry, _, r = fit_entry(ds, KEY, device=A100, kinds=KINDS)
    assert entry is not None and r.kind is not None  # a model is shipped ...
    assert r.heldout_mape_pct is None and r.heldout_gmae_pct is None  # ... without a score, not NaN
    assert r.heldout_implausible == r.heldout_rows == int(test.sum())
    assert r.unscored is not None and "more than 10x" in r.unscored
    assert r.heldout_mape_all_rows_pct is not None and r.heldout_mape_all_rows_pct > 90  # 50x: 98 %
    assert r.as_dict()["heldout_unscored"] == r.unscored
