"""000 Eq. 2–4 piecewise curve and the alpha-beta baseline: shape, fit, bounds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsim.comm.alphabeta import fit_alphabeta
from trainsim.comm.piecewise import PiecewiseCurve, fit_piecewise
from trainsim.errors import ModelError

SIZES = 2.0 ** np.arange(3, 35)  # 8 B .. 16 GiB
TRUE = PiecewiseCurve.from_core(30e-6, 120e9, height=3.0, x0=20.0, k=0.35, b=7.8)


def test_three_regions():
    t = TRUE(SIZES)
    assert TRUE.m1_bytes < TRUE.m2_bytes
    small, large = TRUE.m1_bytes / 4 > SIZES, TRUE.m2_bytes * 4 < SIZES
    assert np.allclose(t[small], TRUE.ts_s, rtol=0.02)  # region 1: constant latency
    assert np.allclose(
        t[large], TRUE.ts_s + SIZES[large] / TRUE.bw_max_Bps
    )  # region 3: saturated bandwidth
    mid = (TRUE.m1_bytes < SIZES) & (TRUE.m2_bytes > SIZES)
    bw = SIZES[mid] / t[mid]
    assert np.all(np.diff(bw) > 0)  # region 2: bandwidth ramps up (the sigmoid)


def test_fit_recovers_a_known_curve_despite_outliers():
    rng = np.random.default_rng(0)
    t = TRUE(SIZES) * np.exp(rng.normal(0, 0.01, SIZES.size))
    t[[5, 20]] *= 3.0  # two timing outliers: the soft-L1 loss ignores them
    fit = fit_piecewise(SIZES, t)
    ok = np.ones(SIZES.size, bool)
    ok[[5, 20]] = False
    assert np.max(np.abs(fit(SIZES[ok]) / TRUE(SIZES[ok]) - 1)) < 0.05


def test_fit_is_deterministic():
    t = TRUE(SIZES)
    assert fit_piecewise(SIZES, t) == fit_piecewise(SIZES, t)


def test_fit_needs_three_sizes():
    with pytest.raises(ModelError, match="3 or more"):
        fit_piecewise([1024, 1024, 2048], [1e-5, 1e-5, 2e-5])


def test_decreasing_curves_are_rejected():
    with pytest.raises(ModelError, match="would not increase"):
        PiecewiseCurve(1e-5, 1e11, 4.0, 20.0, 1.0, 7.0, 1e3, 1e8)  # L*k = 4 > 1.2


@settings(max_examples=60, deadline=None)
@given(
    ts=st.floats(1e-7, 1e-3),
    bw=st.floats(1e8, 1e13),
    height=st.floats(0.01, 6.0),
    x0=st.floats(5, 35),
    u=st.floats(0.01, 0.99),
    b=st.floats(5.0, 11.0),
)
def test_any_valid_curve_is_positive_and_non_decreasing(ts, bw, height, x0, u, b):  # noqa: PLR0917 - hypothesis draws
    c = PiecewiseCurve.from_core(ts, bw, height=height, x0=x0, k=1.2 * u / height, b=b)
    m = np.sort(np.concatenate([SIZES, 2.0 ** np.random.default_rng(1).uniform(0, 40, 200)]))
    t = c(m)
    assert np.all(t > 0) and np.all(np.diff(t) >= -1e-12 * t[1:])
    assert PiecewiseCurve.from_dict(c.to_dict()) == c


def test_alpha_beta_recovers_its_parameters():
    m = 2.0 ** np.arange(10, 31)
    c = fit_alphabeta(m, 20e-6 + m / 100e9)
    assert c.ts_s == pytest.approx(20e-6, rel=1e-3) and c.bw_Bps == pytest.approx(100e9, rel=1e-3)
