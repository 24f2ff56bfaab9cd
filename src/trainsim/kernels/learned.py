"""Learned regressors of log(duration): the one table of kinds, their grids, portable forms.

================  ==========================================================================
kind              what, and its search space (``grid="quick"`` default / ``grid="paper"``)
================  ==========================================================================
``xgboost``       gradient-boosted trees (001 §III-B); monotone constraints where physics says
                  so. quick grid: squared and absolute (L1) error. paper grid: 001's ``Best_config`` space (depth 3/6/9, learning rate
                  0.1/0.2, min child weight 1/5/10, gamma 0/0.1/0.2, subsample 0.8/1)
``lightgbm``      gradient-boosted trees, leaf-wise; monotone constraints (not with the L1
                  objective: LightGBM refuses them, :func:`constrainable`). quick grid: squared
                  error, and L1 with 800 trees at rate 0.03
``rforest``       random forest (001 §III-B), monotone constraints (``monotonic_cst``);
                  paper grid: 100–500 trees, depth None/10/20
``mlp``           multi-layer perceptron, ReLU, MSE on standardized log features and log time
                  (002 §4.3.2.2); paper grid: Table 4.2 (3–7 layers x 128–1024 neurons x
                  Adam/SGD x 7 learning rates, SGD's rate x10)
``poly``          ridge regression on a degree-2/3 polynomial of the standardized log2 inputs
                  and roofline time: a smooth power law with interactions (tiny)
``roofline``      the calibrated roofline: the spec-based roofline time times an efficiency
                  curve of it (:mod:`trainsim.kernels.roofline`); monotone, tiny
================  ==========================================================================

Every kind fits ``(X, y, signs, config, seed)`` and returns a *portable* predictor (numpy
arrays only: :class:`~trainsim.kernels.trees.TreeEnsemble`, :class:`MLPNet`,
:class:`PolyRidge`, :class:`CurveRegressor`) that the artifact stores in npz. Trees and MLPs
learn the *efficiency*, log2(measured / roofline time) (:class:`OnRoofline`): held out, that is
more accurate than learning log2(time) (A100 ``baddbmm`` forward 6.0 → 5.7 %, GH200 ``fillmask``
forward 0.26 → 0.21 %), and between measured points time keeps the roofline's scaling. ``signs`` (+1/-1/0 per column, from
:func:`trainsim.kernels.features.column_signs`) become monotone constraints for the tree
kinds when fitting asks for strict monotonicity (all zeros otherwise); ``mlp`` and ``poly``
cannot be constrained. Fitting checks every candidate against physics either way
(:func:`trainsim.kernels.fitting.monotone_violation`).

Why L1 candidates: the error reported is MAPE, which is (to first order) mean absolute error
of log time — minimized by the conditional *median*, not the mean that squared error fits.
Several of 001's sweeps are bimodal (A100 ``layernorm`` forward: ~1 point in 4 runs ~12 %
faster than its neighbours at random shapes); a median fit follows the majority. Held out
(A100, seed 0, LightGBM): ``embedding`` forward 4.5 → 3.7 %, ``gelu`` forward 1.3 → 0.7 %,
``linear3`` forward 3.3 → 2.8 %. Which loss wins per entry is chosen on the training rows.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from trainsim.errors import ConfigError, ModelError
from trainsim.kernels.trees import TreeEnsemble, from_lightgbm, from_sklearn_forest, from_xgboost

Config = dict[str, Any]


class Portable(Protocol):
    def predict(self, x: np.ndarray) -> np.ndarray: ...

    def to_arrays(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]: ...


@dataclass(frozen=True, slots=True, eq=False)
class MLPNet:
    """``y = mean_y + std_y * f((x - mean_x) / std_x)``, f: ReLU layers then a linear output."""

    weights: tuple[np.ndarray, ...]
    biases: tuple[np.ndarray, ...]
    x_mean: np.ndarray
    x_scale: np.ndarray
    y_mean: float
    y_scale: float

    def predict(self, x: np.ndarray) -> np.ndarray:
        h = (np.asarray(x, dtype=float) - self.x_mean) / self.x_scale
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = h @ w + b
            if i < len(self.weights) - 1:
                h = np.maximum(h, 0.0)
        return self.y_mean + self.y_scale * h[:, 0]

    def to_arrays(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        arrays = {"x_mean": self.x_mean, "x_scale": self.x_scale}
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            arrays[f"w{i}"], arrays[f"b{i}"] = w, b
        return {"layers": len(self.weights), "y_mean": self.y_mean, "y_scale": self.y_scale}, arrays

    @classmethod
    def from_arrays(cls, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> MLPNet:
        n = int(meta["layers"])
        return cls(tuple(arrays[f"w{i}"] for i in range(n)), tuple(arrays[f"b{i}"] for i in range(n)),
                   arrays["x_mean"], arrays["x_scale"], float(meta["y_mean"]), float(meta["y_scale"]))  # fmt: skip


@dataclass(frozen=True, slots=True, eq=False)
class PolyRidge:
    """``y = intercept + sum_j coef_j * prod_i z_i ** powers_ji`` with ``z`` standardized x."""

    powers: np.ndarray  # terms x columns
    coef: np.ndarray
    intercept: float
    x_mean: np.ndarray
    x_scale: np.ndarray

    def predict(self, x: np.ndarray) -> np.ndarray:
        z = (np.asarray(x, dtype=float) - self.x_mean) / self.x_scale
        return poly_terms(z, self.powers) @ self.coef + self.intercept

    def to_arrays(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        return {"intercept": self.intercept}, {"powers": self.powers.astype(np.int8), "coef": self.coef,
                                               "x_mean": self.x_mean, "x_scale": self.x_scale}  # fmt: skip

    @classmethod
    def from_arrays(cls, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> PolyRidge:
        return cls(arrays["powers"].astype(np.int64), arrays["coef"], float(meta["intercept"]),
                   arrays["x_mean"], arrays["x_scale"])  # fmt: skip


def poly_terms(z: np.ndarray, powers: np.ndarray) -> np.ndarray:
    """Rows x terms: ``prod_i z_i ** powers[term, i]`` (one column of z at a time)."""
    stack = np.stack([z**d for d in range(int(powers.max(initial=0)) + 1)])  # degree x rows x cols
    terms = np.ones((z.shape[0], powers.shape[0]))
    for i in range(z.shape[1]):
        terms *= stack[powers[:, i], :, i].T
    return terms


@dataclass(frozen=True, slots=True, eq=False)
class CurveRegressor:
    """``y = u + interp(u, knots_u, knots_g)`` with ``u`` the (only) column: log2 roofline time."""

    u: np.ndarray
    g: np.ndarray

    def predict(self, x: np.ndarray) -> np.ndarray:
        u = np.asarray(x, dtype=float)[:, 0]
        return u + np.interp(u, self.u, self.g)

    def to_arrays(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        return {}, {"u": self.u, "g": self.g}

    @classmethod
    def from_arrays(cls, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> CurveRegressor:
        return cls(np.asarray(arrays["u"], dtype=float), np.asarray(arrays["g"], dtype=float))


@dataclass(frozen=True, slots=True, eq=False)
class OnRoofline:
    """``y = inner(x) + x[:, column]``: a regressor of log2(measured / roofline time) (the
    column is log2 of the roofline time), so time follows the roofline's physics between and
    beyond the measured points and the regressor only learns the efficiency."""

    inner: Portable
    column: int

    def predict(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        return self.inner.predict(x) + x[:, self.column]

    def to_arrays(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        meta, arrays = self.inner.to_arrays()
        return {"on_roofline_column": self.column, "inner": meta}, arrays


def _scale(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean, std = x.mean(axis=0), x.std(axis=0)
    return mean, np.where(std > 1e-12, std, 1.0)


# --- fitters ------------------------------------------------------------------------------------


def _need(module: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"fitting this kind needs {module}; install trainsim[learned] (scikit-learn, xgboost-cpu, lightgbm)"
        ) from None


def fit_xgboost(
    x: np.ndarray, y: np.ndarray, signs: list[int], cfg: Config, seed: int
) -> TreeEnsemble:
    xgb = _need("xgboost")
    m = xgb.XGBRegressor(objective=cfg.pop("objective", "reg:squarederror"), monotone_constraints=tuple(signs), random_state=seed,
                         n_jobs=cfg.pop("n_jobs", 1), tree_method="hist", **cfg)  # fmt: skip
    m.fit(x, y)
    return from_xgboost(m.get_booster())


def fit_lightgbm(
    x: np.ndarray, y: np.ndarray, signs: list[int], cfg: Config, seed: int
) -> TreeEnsemble:
    lgb = _need("lightgbm")
    mono = {"monotone_constraints": list(signs)} if any(signs) else {}  # L1 refuses the option
    m = lgb.LGBMRegressor(**mono, random_state=seed, verbose=-1,
                          n_jobs=cfg.pop("n_jobs", 1), deterministic=True, force_row_wise=True, **cfg)  # fmt: skip
    m.fit(x, y)
    return from_lightgbm(m.booster_)


def fit_rforest(
    x: np.ndarray, y: np.ndarray, signs: list[int], cfg: Config, seed: int
) -> TreeEnsemble:
    ens = _need("sklearn.ensemble")
    m = ens.RandomForestRegressor(
        monotonic_cst=list(signs), random_state=seed, n_jobs=cfg.pop("n_jobs", 1), **cfg
    )
    m.fit(x, y)
    return from_sklearn_forest(m)


def fit_mlp(x: np.ndarray, y: np.ndarray, signs: list[int], cfg: Config, seed: int) -> MLPNet:
    nn = _need("sklearn.neural_network")
    x_mean, x_scale = _scale(x)
    y_mean, y_scale = float(y.mean()), float(y.std() or 1.0)
    layers, width = int(cfg["num_layers"]), int(cfg["neurons"])
    solver = str(cfg.get("optimizer", "adam")).lower()
    lr = float(cfg["learning_rate"]) * (10.0 if solver == "sgd" else 1.0)  # 002 §4.3.2.2
    m = nn.MLPRegressor(hidden_layer_sizes=(width,) * layers, activation="relu", solver=solver,
                        learning_rate_init=lr, max_iter=int(cfg.get("max_iter", 400)), early_stopping=True,
                        validation_fraction=0.1, n_iter_no_change=20, tol=1e-6, alpha=1e-6,
                        batch_size=min(256, len(y)), random_state=seed)  # fmt: skip
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning: max_iter is part of the budget
        m.fit((x - x_mean) / x_scale, (y - y_mean) / y_scale)
    return MLPNet(tuple(np.asarray(w) for w in m.coefs_), tuple(np.asarray(b) for b in m.intercepts_),
                  x_mean, x_scale, y_mean, y_scale)  # fmt: skip


def fit_curve(
    x: np.ndarray, y: np.ndarray, signs: list[int], cfg: Config, seed: int
) -> CurveRegressor:
    from trainsim.kernels.roofline import efficiency_knots

    u = x[:, 0]
    return CurveRegressor(*efficiency_knots(u, y - u, int(cfg["knots"])))


def monomial_powers(columns: int, degree: int) -> list[tuple[int, ...]]:
    """The exponents of every monomial of total degree 1..``degree`` in ``columns`` variables,
    in lexicographic order (that of ``itertools.product(range(degree + 1), repeat=columns)``
    filtered by degree, without enumerating its (degree + 1)^columns tuples: 3^22 = 3·10^10 for
    a degree-2 fit on 22 columns, against 275 monomials)."""
    out: set[tuple[int, ...]] = set()
    for d in range(1, degree + 1):
        for combo in itertools.combinations_with_replacement(range(columns), d):
            p = [0] * columns
            for c in combo:
                p[c] += 1
            out.add(tuple(p))
    return sorted(out)


def fit_poly(x: np.ndarray, y: np.ndarray, signs: list[int], cfg: Config, seed: int) -> PolyRidge:
    x_mean, x_scale = _scale(x)
    z = (x - x_mean) / x_scale
    degree = int(cfg["degree"])
    powers = np.array(monomial_powers(x.shape[1], degree), dtype=np.int64).reshape(-1, x.shape[1])
    terms = poly_terms(z, powers)
    t_mean = terms.mean(axis=0)
    a = terms - t_mean
    alpha = float(cfg["alpha"]) * len(y)
    coef = np.linalg.solve(a.T @ a + alpha * np.eye(a.shape[1]), a.T @ (y - y.mean()))
    return PolyRidge(powers, coef, float(y.mean() - t_mean @ coef), x_mean, x_scale)


# --- the table --------------------------------------------------------------------------------


def _grid(**axes: list[Any]) -> tuple[Config, ...]:
    keys = list(axes)
    return tuple(dict(zip(keys, vals, strict=True)) for vals in itertools.product(*axes.values()))


@dataclass(frozen=True, slots=True)
class Kind:
    name: str
    fit: Callable[[np.ndarray, np.ndarray, list[int], Config, int], Portable]
    load: Callable[[dict[str, Any], dict[str, np.ndarray]], Portable]
    quick: tuple[Config, ...]
    paper: tuple[Config, ...]
    monotone: bool  # honours monotone constraints (strict mode) by construction
    threads: bool = True  # takes n_jobs
    on_roofline: bool = False  # learns log2(t / roofline) (see :class:`OnRoofline`)
    reads: str = (
        "all"  # columns: "all", "inputs" (the op's inputs and the roofline time), "roofline"
    )


KINDS: dict[str, Kind] = {}


def _register(k: Kind) -> None:
    if k.name in KINDS:
        raise ModelError(f"learned kind {k.name!r} is registered twice")
    KINDS[k.name] = k


_register(Kind("xgboost", fit_xgboost, TreeEnsemble.from_arrays,
               _grid(n_estimators=[300], learning_rate=[0.1], max_depth=[5], subsample=[0.8],
                     colsample_bytree=[0.8], min_child_weight=[3])
               + _grid(objective=["reg:absoluteerror"], n_estimators=[300], learning_rate=[0.1], max_depth=[5],
                       subsample=[0.8], colsample_bytree=[0.8], min_child_weight=[3]),
               _grid(n_estimators=[100, 200, 300], learning_rate=[0.1, 0.2], max_depth=[3, 6, 9],
                     min_child_weight=[1, 5, 10], gamma=[0, 0.1, 0.2], subsample=[0.8, 1.0],
                     colsample_bytree=[0.8, 1.0]), monotone=True, on_roofline=True))  # fmt: skip
_register(Kind("lightgbm", fit_lightgbm, TreeEnsemble.from_arrays,
               _grid(n_estimators=[300], learning_rate=[0.1], num_leaves=[15], min_child_samples=[10],
                     subsample=[0.8], subsample_freq=[1], colsample_bytree=[0.8])
               + _grid(objective=["l1"], n_estimators=[800], learning_rate=[0.03], num_leaves=[31],
                       min_child_samples=[5], subsample=[0.8], subsample_freq=[1], colsample_bytree=[0.8]),
               _grid(n_estimators=[200, 400], learning_rate=[0.05, 0.1, 0.2], num_leaves=[15, 31, 63],
                     min_child_samples=[5, 10, 20], subsample=[0.8, 1.0], subsample_freq=[1],
                     colsample_bytree=[0.8, 1.0]), monotone=True, on_roofline=True))  # fmt: skip
_register(Kind("rforest", fit_rforest, TreeEnsemble.from_arrays,
               _grid(n_estimators=[40], max_features=[0.6], min_samples_leaf=[4], max_depth=[12]),
               _grid(n_estimators=[100, 200, 300, 400, 500], max_depth=[None, 10, 20], max_features=[None],
                     min_samples_leaf=[1], min_samples_split=[2]), monotone=True, on_roofline=True))  # fmt: skip
_register(Kind("mlp", fit_mlp, MLPNet.from_arrays,
               _grid(num_layers=[3], neurons=[128], optimizer=["adam"], learning_rate=[1e-3, 5e-3]),
               _grid(num_layers=[3, 4, 5, 6, 7], neurons=[128, 256, 512, 1024], optimizer=["adam", "sgd"],
                     learning_rate=[1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2]), monotone=False, threads=False,
               on_roofline=True))  # fmt: skip
_register(Kind("poly", fit_poly, PolyRidge.from_arrays,
               _grid(degree=[2, 3], alpha=[1e-6, 1e-4]), _grid(degree=[1, 2, 3], alpha=[1e-6, 1e-4, 1e-2]),
               monotone=False, threads=False, reads="inputs"))  # fmt: skip
_register(Kind("roofline", fit_curve, CurveRegressor.from_arrays, _grid(knots=[6, 12, 24]),
               _grid(knots=[4, 6, 8, 12, 16, 24, 32]), monotone=True, threads=False, reads="roofline"))  # fmt: skip

DEFAULT_KINDS: tuple[str, ...] = ("xgboost", "lightgbm", "rforest", "poly", "roofline")
GRIDS = ("quick", "paper")


def kind(name: str) -> Kind:
    try:
        return KINDS[name]
    except KeyError:
        raise ConfigError(f"unknown learned kind {name!r}; known: {', '.join(KINDS)}") from None


def constrainable(k: Kind, cfg: Config) -> bool:
    """Whether kind ``k`` accepts monotone constraints with ``cfg`` (LightGBM refuses them
    with the L1 objective)."""
    return k.monotone and not (k.name == "lightgbm" and cfg.get("objective") in ("l1", "quantile"))


def configs(k: Kind, grid: str) -> tuple[Config, ...]:
    if grid not in GRIDS:
        raise ConfigError(f"unknown grid {grid!r}; known: {', '.join(GRIDS)}")
    return k.quick if grid == "quick" else k.paper


def size_bytes(p: Portable) -> int:
    return sum(int(a.nbytes) for a in p.to_arrays()[1].values())


def kind_columns(k: Kind, cols: list[str]) -> list[int]:
    """Indices of the columns kind ``k`` reads."""
    if k.reads == "roofline":
        return [cols.index("roofline_s")] if "roofline_s" in cols else []
    return [
        i
        for i, c in enumerate(cols)
        if k.reads == "all" or c.startswith("in:") or c == "roofline_s"
    ]


def fit_kind(k: Kind, x: np.ndarray, y: np.ndarray, *, cols: list[str], signs: list[int], cfg: Config,
             seed: int, on_roofline: bool = True) -> Portable:  # fmt: skip
    """Fit kind ``k`` on the columns ``cols`` (those :func:`kind_columns` selects); kinds that
    learn the efficiency do so unless ``on_roofline`` is false (they then learn log2 time, the
    roofline time one of their columns)."""
    if k.on_roofline and on_roofline and "roofline_s" in cols:
        j = cols.index("roofline_s")
        return OnRoofline(k.fit(x, y - x[:, j], signs, cfg, seed), j)
    return k.fit(x, y, signs, cfg, seed)


def load_portable(kind_name: str, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> Portable:
    k = kind(kind_name)
    if "on_roofline_column" in meta:
        return OnRoofline(k.load(meta["inner"], arrays), int(meta["on_roofline_column"]))
    return k.load(meta, arrays)
