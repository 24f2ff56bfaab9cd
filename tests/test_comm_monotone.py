"""The monotone regressor family (paper 001 §III-B's learned per-case regressor, kept monotone)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trainsim.comm.curves import FAMILIES, family
from trainsim.comm.fitting import fit_case
from trainsim.comm.metrics import mape_pct
from trainsim.comm.monotone import MonotoneCurve, fit_monotone, isotonic, mape_optimal
from trainsim.comm.piecewise import PiecewiseCurve, fit_piecewise
from trainsim.errors import ModelError

SIZES = np.concatenate([[0.0], 2.0 ** np.arange(0, 40, 0.25)])


def _sweep(seed: int = 0, n: int = 1500) -> tuple[np.ndarray, np.ndarray]:
    """A bandwidth-bound sweep with a protocol switch: 20 % slower above 2^28 bytes."""
    rng = np.random.default_rng(seed)
    m = np.sort(rng.uniform(2**26, 2**30, n))
    t = 10e-6 + m / 100e9 * np.where(m > 2**28, 1.2, 1.0)
    return m, t * np.exp(rng.normal(0, 0.01, n))


def test_registered():
    assert "monotone" in FAMILIES and family("monotone").fit is fit_monotone


def test_mape_optimal_is_the_inverse_weighted_median():
    t = np.array([1.0, 1.0, 1.0, 5.0, 9.0])
    assert mape_optimal(t) == 1.0  # the plain median (1.0) agrees here; the mean (3.4) would not
    t = np.array([1.0, 1.1, 6.0, 7.0, 8.0])
    p = mape_optimal(t)
    grid = np.linspace(0.5, 9, 2000)
    best = grid[np.argmin([np.mean(np.abs(g - t) / t) for g in grid])]
    assert np.mean(np.abs(p - t) / t) <= np.mean(np.abs(best - t) / t) + 1e-12
    assert p == 1.1  # the median (6.0) costs 2.4x more MAPE


def test_isotonic_pools_violators():
    y = isotonic(np.array([1.0, 3.0, 2.0, 4.0]), np.array([1.0, 1.0, 1.0, 1.0]))
    assert np.allclose(y, [1.0, 2.5, 2.5, 4.0])
    assert np.all(np.diff(isotonic(np.random.default_rng(0).normal(size=200), np.ones(200))) >= 0)


def test_follows_a_regime_change_the_piecewise_curve_smooths():
    m, t = _sweep()
    test = np.zeros(m.size, bool)
    test[::5] = True
    mono = fit_monotone(m[~test], t[~test])
    pw = fit_piecewise(m[~test], t[~test])
    assert mape_pct(mono(m[test]), t[test]) < 2.0
    assert mape_pct(mono(m[test]), t[test]) < mape_pct(pw(m[test]), t[test])
    name, _, scores = fit_case(m, t, holdout=0.25, seed=0, families=tuple(FAMILIES))
    assert name == "monotone" and scores["monotone"][0] < scores["piecewise"][0]


def test_keeps_to_the_fast_bulk_under_contention():
    """30 % of rows 2-10x slower (another job on the links): the fit stays near the clean time."""
    rng = np.random.default_rng(1)
    m = np.sort(rng.uniform(2**27, 2**30, 2000))
    clean = 5e-6 + m / 150e9
    slow = rng.random(m.size) < 0.3
    t = clean * np.where(slow, rng.uniform(2, 10, m.size), 1.0)
    c = fit_monotone(m, t)
    assert np.allclose(c(m[~slow]), clean[~slow], rtol=0.05)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_monotone_positive_and_continuous_everywhere(seed):
    rng = np.random.default_rng(seed)
    m = 2.0 ** rng.uniform(20, 32, 400)
    t = (20e-6 + m / 50e9) * np.exp(rng.normal(0, 0.3, m.size))  # very noisy
    c = fit_monotone(m, t)
    y = c(SIZES)
    assert np.all(np.isfinite(y)) and np.all(y > 0) and np.all(np.diff(y) >= 0)
    for end in (c.log2_bytes[0], c.log2_bytes[-1]):  # no jump where the base curve takes over
        lo, mid, hi = c(2.0 ** np.array([end - 1e-9, end, end + 1e-9]))
        assert lo == pytest.approx(mid, rel=1e-6) and hi == pytest.approx(mid, rel=1e-6)
    # beyond the data the time grows like the piecewise curve: ~linear in size far above
    far = c(np.array([2.0**38, 2.0**39]))
    assert far[1] / far[0] == pytest.approx(2.0, rel=0.05)


def test_round_trip_and_validation():
    m, t = _sweep(n=300)
    c = fit_monotone(m, t)
    back = MonotoneCurve.from_dict(json.loads(json.dumps(c.to_dict())))
    assert back == c and np.array_equal(back(SIZES), c(SIZES))
    base = c.base
    with pytest.raises(ModelError, match="not decrease"):
        MonotoneCurve((1.0, 2.0), (0.0, -1.0), base)
    with pytest.raises(ModelError, match="matching"):
        MonotoneCurve((1.0, 2.0), (0.0,), base)
    with pytest.raises(ModelError, match="misses"):
        MonotoneCurve.from_dict({"log2_bytes": [1.0], "log_s": [0.0]})
    with pytest.raises(ModelError, match="3 or more"):
        fit_monotone([1.0, 2.0], [1.0, 2.0])
    assert isinstance(base, PiecewiseCurve)


def test_fit_case_rejects_an_unknown_criterion():
    m, t = _sweep(n=100)
    with pytest.raises(ModelError, match="criterion"):
        fit_case(m, t, holdout=0.25, seed=0, families=("piecewise",), criterion="rmse")
    name, _, _ = fit_case(m, t, holdout=0.25, seed=0, families=tuple(FAMILIES), criterion="mape")
    assert name in FAMILIES
