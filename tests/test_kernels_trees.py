"""Tree ensembles converted to plain arrays predict what the libraries that grew them predict."""

from __future__ import annotations

import numpy as np
import pytest

from trainsim.errors import ModelError
from trainsim.kernels.trees import TreeEnsemble, from_lightgbm, from_sklearn_forest, from_xgboost


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = np.log2(rng.uniform(1, 5000, (400, 4)))
    y = x @ [1.0, 0.5, -0.3, 0.2] + np.sin(x[:, 0]) + rng.normal(0, 0.05, 400)
    test = np.log2(rng.uniform(1, 5000, (300, 4)))
    return x, y, test


def test_sklearn_forest(data):
    from sklearn.ensemble import RandomForestRegressor

    x, y, test = data
    rf = RandomForestRegressor(n_estimators=20, max_features=0.7, random_state=0).fit(x, y)
    te = from_sklearn_forest(rf)
    assert np.allclose(te.predict(test), rf.predict(test), rtol=0, atol=1e-5)  # float32 leaves
    assert te.combine == "mean" and te.roots.size == 20


def test_xgboost(data):
    xgb = pytest.importorskip("xgboost")
    x, y, test = data
    m = xgb.XGBRegressor(n_estimators=60, max_depth=4, learning_rate=0.2, n_jobs=1).fit(x, y)
    te = from_xgboost(m.get_booster())
    assert np.allclose(
        te.predict(test), m.predict(test), rtol=0, atol=1e-4
    )  # XGBoost sums in float32


def test_lightgbm(data):
    lgb = pytest.importorskip("lightgbm")
    x, y, test = data
    m = lgb.LGBMRegressor(n_estimators=60, num_leaves=15, verbose=-1, n_jobs=1).fit(x, y)
    te = from_lightgbm(m.booster_)
    assert np.allclose(te.predict(test), m.predict(test), rtol=0, atol=1e-5)


def test_arrays_round_trip_is_exact(data):
    from sklearn.ensemble import RandomForestRegressor

    x, y, test = data
    te = from_sklearn_forest(RandomForestRegressor(n_estimators=5, random_state=0).fit(x, y))
    meta, arrays = te.to_arrays()
    back = TreeEnsemble.from_arrays(meta, arrays)
    assert np.array_equal(back.predict(test), te.predict(test))


def test_bad_children_are_rejected():
    one = np.array([0, -1, -1])
    with pytest.raises(ModelError, match="child"):
        TreeEnsemble(
            one,
            np.zeros(3, np.float32),
            np.array([1, -1, -1]),
            np.array([0]),
            "sum",
            0.0,
            "le",
            False,
        )


@pytest.mark.parametrize("objective", ["reg:absoluteerror", "l1"])
def test_l1_objectives_convert(data, objective):
    """The L1 (median) objectives fitting offers convert like the squared-error ones (their
    base score is the median, not the mean)."""
    x, y, test = data
    if objective == "l1":
        lgb = pytest.importorskip("lightgbm")
        m = lgb.LGBMRegressor(
            objective="l1", n_estimators=40, num_leaves=15, verbose=-1, n_jobs=1
        ).fit(x, y)
        te, want = from_lightgbm(m.booster_), m.predict(test)
    else:
        xgb = pytest.importorskip("xgboost")
        m = xgb.XGBRegressor(objective=objective, n_estimators=40, max_depth=4, n_jobs=1).fit(x, y)
        te, want = from_xgboost(m.get_booster()), m.predict(test)
    assert np.allclose(te.predict(test), want, rtol=0, atol=1e-4)
