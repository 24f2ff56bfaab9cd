"""Tree ensembles as plain arrays: one evaluator for RandomForest, XGBoost and LightGBM.

A fitted forest or boosted ensemble is converted once into flat node arrays (``feature``,
``threshold``, ``left``, ``right``, ``value``; ``feature == -1`` marks a leaf) plus the root
of each tree, how trees combine (``mean`` for a forest, ``sum`` + ``base`` for boosting) and the
split rule of the library that grew them:

============  ===================  ==================================================
library       goes left when       inputs compared as
============  ===================  ==================================================
scikit-learn  ``x <= threshold``   float32 (sklearn casts X; thresholds rounded down
                                   to float32 so the comparison is unchanged)
XGBoost       ``x < threshold``    float32 (thresholds are float32 in the model JSON)
LightGBM      ``x <= threshold``   float64
============  ===================  ==================================================

Saved in npz (``numpy.load(..., allow_pickle=False)``): loading reads numbers, never code, and
prediction needs numpy only — the learning libraries are needed to *fit*, not to predict.
The converters are checked against each library's own ``predict`` in the tests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainsim.errors import ModelError

_RULES = ("le", "lt")


@dataclass(frozen=True, slots=True, eq=False)
class TreeEnsemble:
    feature: np.ndarray  # int32 per node, -1 at leaves
    threshold: np.ndarray  # per node
    left: np.ndarray  # int32 per node (absolute index), -1 at leaves
    right: np.ndarray
    value: np.ndarray  # float64 per node (leaves)
    roots: np.ndarray  # int32 per tree
    combine: str  # "mean" or "sum"
    base: float  # added to the combined leaves
    rule: str  # "le" or "lt"
    float32_inputs: bool

    def __post_init__(self) -> None:
        if self.combine not in ("mean", "sum") or self.rule not in _RULES:
            raise ModelError(f"tree ensemble: bad combine/rule {self.combine!r}/{self.rule!r}")
        n = self.feature.size
        if not (self.threshold.size == self.left.size == self.right.size == self.value.size == n):
            raise ModelError("tree ensemble: node arrays differ in length")
        inner = self.feature >= 0
        for arr in (self.left, self.right):
            if np.any(inner & ((arr <= np.arange(n)) | (arr >= n))):
                raise ModelError("tree ensemble: a child index points backwards or out of range")
        if self.roots.size == 0 or np.any((self.roots < 0) | (self.roots >= n)):
            raise ModelError("tree ensemble: bad root indices")

    @property
    def n_nodes(self) -> int:
        return int(self.feature.size)

    @property
    def n_features_used(self) -> int:
        return int(self.feature.max()) + 1 if self.n_nodes else 0

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Vectorized over rows and trees: every row walks every tree one level per step."""
        x = np.asarray(x, dtype=float)
        if x.ndim != 2 or x.shape[1] < self.n_features_used:
            raise ModelError(f"tree ensemble needs {self.n_features_used} columns, got shape {x.shape}")
        if self.float32_inputs:
            x = x.astype(np.float32).astype(np.float64)
        rows = np.arange(x.shape[0])[:, None]
        node = np.broadcast_to(self.roots, (x.shape[0], self.roots.size)).copy()
        while True:
            f = self.feature[node]
            inner = f >= 0
            if not inner.any():
                break
            xv = x[rows, np.where(inner, f, 0)]
            thr = self.threshold[node]
            go_left = xv <= thr if self.rule == "le" else xv < thr
            node = np.where(inner, np.where(go_left, self.left[node], self.right[node]), node)
        leaves = self.value[node]
        agg = leaves.mean(axis=1) if self.combine == "mean" else leaves.sum(axis=1)
        return agg + self.base

    # --- storage ---------------------------------------------------------------------------

    def to_arrays(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        meta = {"combine": self.combine, "base": self.base, "rule": self.rule,
                "float32_inputs": self.float32_inputs, "nodes": self.n_nodes, "trees": int(self.roots.size)}  # fmt: skip
        small = self.n_nodes < 2**31
        arrays = {
            "feature": self.feature.astype(np.int16 if self.feature.max(initial=0) < 2**15 else np.int32),
            "threshold": self.threshold.astype(np.float32) if self.float32_inputs else self.threshold,
            "left": self.left.astype(np.int32 if small else np.int64),
            "right": self.right.astype(np.int32 if small else np.int64),
            "value": self.value,
            "roots": self.roots.astype(np.int32),
        }
        return meta, arrays

    @classmethod
    def from_arrays(cls, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> TreeEnsemble:
        try:
            return cls(arrays["feature"].astype(np.int64), arrays["threshold"].astype(np.float64),
                       arrays["left"].astype(np.int64), arrays["right"].astype(np.int64),
                       arrays["value"].astype(np.float64), arrays["roots"].astype(np.int64),
                       str(meta["combine"]), float(meta["base"]), str(meta["rule"]), bool(meta["float32_inputs"]))  # fmt: skip
        except KeyError as e:
            raise ModelError(f"tree ensemble artifact: missing {e}") from None


def _floor_float32(t: np.ndarray) -> np.ndarray:
    """The largest float32 <= t: for float32 x, ``x <= t`` iff ``x <= floor32(t)``."""
    t32 = t.astype(np.float32)
    over = t32.astype(np.float64) > t
    t32[over] = np.nextafter(t32[over], np.float32(-np.inf))
    return t32.astype(np.float64)


def _stack(trees: list[tuple[np.ndarray, ...]], *, combine: str, base: float, rule: str,
           float32_inputs: bool) -> TreeEnsemble:  # fmt: skip
    """Concatenate per-tree (feature, threshold, left, right, value) with local child indices."""
    feats, thrs, lefts, rights, vals, roots = [], [], [], [], [], []
    offset = 0
    for f, t, lc, rc, v in trees:
        leaf = f < 0
        roots.append(offset)
        feats.append(np.where(leaf, -1, f))
        thrs.append(np.where(leaf, 0.0, t))
        lefts.append(np.where(leaf, -1, lc + offset))
        rights.append(np.where(leaf, -1, rc + offset))
        vals.append(np.where(leaf, v, 0.0))
        offset += f.size
    return TreeEnsemble(np.concatenate(feats).astype(np.int64), np.concatenate(thrs).astype(float),
                        np.concatenate(lefts).astype(np.int64), np.concatenate(rights).astype(np.int64),
                        np.concatenate(vals).astype(float), np.array(roots, dtype=np.int64),
                        combine, float(base), rule, float32_inputs)  # fmt: skip


def from_sklearn_forest(forest: Any) -> TreeEnsemble:
    """A fitted ``RandomForestRegressor`` (or any bagged sklearn regression trees)."""
    trees = []
    for est in forest.estimators_:
        t = est.tree_
        leaf = t.children_left < 0
        trees.append((np.where(leaf, -1, t.feature), _floor_float32(t.threshold),
                      t.children_left, t.children_right, t.value[:, 0, 0]))  # fmt: skip
    return _stack(trees, combine="mean", base=0.0, rule="le", float32_inputs=True)


def _xgb_base_score(learner: dict[str, Any]) -> float:
    raw = str(learner["learner_model_param"]["base_score"]).strip("[]")
    return float(raw.split(",")[0])


def from_xgboost(booster: Any) -> TreeEnsemble:
    """A fitted ``xgboost.Booster`` with an identity link (``reg:squarederror``)."""
    doc = json.loads(bytes(booster.save_raw("json")))
    learner = doc["learner"]
    objective = learner["objective"]["name"]
    if objective not in ("reg:squarederror", "reg:absoluteerror", "reg:pseudohubererror"):
        raise ModelError(f"cannot convert an XGBoost model with objective {objective}")
    trees = []
    for t in learner["gradient_booster"]["model"]["trees"]:
        lc = np.array(t["left_children"], dtype=np.int64)
        leaf = lc < 0
        cond = np.array(t["split_conditions"], dtype=np.float32).astype(np.float64)
        trees.append((np.where(leaf, -1, np.array(t["split_indices"], dtype=np.int64)), cond, lc,
                      np.array(t["right_children"], dtype=np.int64), cond))  # fmt: skip
    return _stack(trees, combine="sum", base=_xgb_base_score(learner), rule="lt", float32_inputs=True)


def from_lightgbm(booster: Any) -> TreeEnsemble:
    """A fitted ``lightgbm.Booster`` (numerical splits, no missing values, no linear trees)."""
    doc = booster.dump_model()
    trees = []
    for info in doc["tree_info"]:
        f: list[int] = []
        thr: list[float] = []
        lc: list[int] = []
        rc: list[int] = []
        val: list[float] = []

        def walk(node: dict[str, Any], f=f, thr=thr, lc=lc, rc=rc, val=val) -> int:
            i = len(f)
            f.append(-1)
            thr.append(0.0)
            lc.append(-1)
            rc.append(-1)
            val.append(0.0)
            if "leaf_value" in node or "split_feature" not in node:
                val[i] = float(node.get("leaf_value", 0.0))
                return i
            if node.get("decision_type", "<=") != "<=":
                raise ModelError(f"cannot convert LightGBM split {node.get('decision_type')!r}")
            f[i] = int(node["split_feature"])
            thr[i] = float(node["threshold"])
            lc[i] = walk(node["left_child"])
            rc[i] = walk(node["right_child"])
            return i

        walk(info["tree_structure"])
        trees.append((np.array(f), np.array(thr), np.array(lc), np.array(rc), np.array(val)))
    return _stack(trees, combine="sum", base=0.0, rule="le", float32_inputs=False)
