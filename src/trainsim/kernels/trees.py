"""Tree ensembles as plain arrays: one evaluator for RandomForest, XGBoost and LightGBM.

A fitted forest or boosted ensemble is converted once into flat node arrays in pre-order
(``feature``, -1 at a leaf; ``split``, the threshold of an inner node or the value of a leaf;
``right``, the right child — the left one is the next node) plus the root of each tree, how
trees combine (``mean`` for a forest, ``sum`` + ``base`` for boosting) and the split rule of
the library that grew them:

============  ===================  ==================================================
library       goes left when       inputs compared as
============  ===================  ==================================================
scikit-learn  ``x <= threshold``   float32 (sklearn casts X; thresholds rounded down
                                   to float32 so the comparison is unchanged)
XGBoost       ``x < threshold``    float32 (thresholds are float32 in the model JSON)
LightGBM      ``x <= threshold``   float64
============  ===================  ==================================================

Thresholds and leaf values are stored as float32 (9–10 bytes a node): thresholds rounded so
that decisions on float32 inputs are unchanged (LightGBM compares float64 inputs; they differ
only within 1e-7 of a threshold, where no training value lies). Saved in npz
(``numpy.load(..., allow_pickle=False)``): loading reads numbers, never code, and prediction
needs numpy only — the learning libraries are needed to *fit*, not to predict. The converters
are checked against each library's own ``predict`` in the tests.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainsim.errors import ModelError

_RULES = ("le", "lt")


@dataclass(frozen=True, slots=True, eq=False)
class TreeEnsemble:
    """Trees in pre-order: an inner node's left child is the next node, ``right`` names the
    other; ``split`` holds the threshold at inner nodes and the value at leaves (float32)."""

    feature: np.ndarray  # int per node, -1 at leaves
    split: np.ndarray  # float32: threshold (inner) or leaf value
    right: np.ndarray  # int per node (absolute index), -1 at leaves
    roots: np.ndarray  # int per tree
    combine: str  # "mean" or "sum"
    base: float  # added to the combined leaves
    rule: str  # "le" or "lt"
    float32_inputs: bool
    # the walk's arrays (made once): a leaf loops on itself (threshold +inf, both children it)
    _walk: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.combine not in ("mean", "sum") or self.rule not in _RULES:
            raise ModelError(f"tree ensemble: bad combine/rule {self.combine!r}/{self.rule!r}")
        self._validate()
        idx = np.arange(self.feature.size)
        leaf = self.feature < 0
        value = np.asarray(self.split, dtype=np.float64)
        thr = np.where(leaf, np.inf, value)
        feat = np.where(leaf, 0, self.feature)
        left = np.where(leaf, idx, idx + 1)
        right = np.where(leaf, idx, self.right)
        object.__setattr__(self, "_walk", (feat, thr, left, right, value, self._depth()))

    def _depth(self) -> int:
        """The most inner nodes on any root-to-leaf path: the levels walked from the roots
        while some node of the level is inner."""
        depth, level = 0, self.roots
        while True:
            inner = level[self.feature[level] >= 0]
            if inner.size == 0:
                return depth
            depth += 1
            level = np.concatenate((inner + 1, self.right[inner]))

    def _validate(self) -> None:
        arrays = {"feature": self.feature, "split": self.split, "right": self.right, "roots": self.roots}
        flat = [k for k, a in arrays.items() if np.ndim(a) != 1]
        if flat:
            raise ModelError(f"tree ensemble: array {flat[0]!r} must be one-dimensional, got shape {np.shape(arrays[flat[0]])}")
        n = self.feature.size
        if not (self.split.size == self.right.size == n):
            raise ModelError("tree ensemble: node arrays differ in length")
        inner = self.feature >= 0
        idx = np.arange(n)
        if np.any(inner & ((self.right <= idx + 1) | (self.right >= n))) or np.any(
            inner & (idx + 1 >= n)
        ):
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
        """Vectorized over rows and trees: every row walks every tree one level per step, as
        many steps as the deepest tree (a leaf loops on itself)."""
        x = np.asarray(x, dtype=float)
        if x.ndim != 2 or x.shape[1] < self.n_features_used:
            raise ModelError(
                f"tree ensemble needs {self.n_features_used} columns, got shape {x.shape}"
            )
        if self.float32_inputs:
            x = x.astype(np.float32).astype(np.float64)
        feat, thr, left, right, value, depth = self._walk
        n_rows, n_trees = x.shape[0], self.roots.size
        # one flat walk over (row, tree) pairs: 1-D gathers are the cheapest numpy has (a
        # single-row query, the LLM coster's, walks just the roots' vector)
        flat = np.ascontiguousarray(x).ravel()
        node = np.tile(self.roots, n_rows)
        at = np.repeat(np.arange(n_rows) * x.shape[1], n_trees) if n_rows > 1 else 0
        le = self.rule == "le"
        for _ in range(depth):
            xv = flat[at + feat[node]]
            t = thr[node]
            node = np.where(xv <= t if le else xv < t, left[node], right[node])
        leaves = value[node].reshape(n_rows, n_trees)
        agg = leaves.mean(axis=1) if self.combine == "mean" else leaves.sum(axis=1)
        return agg + self.base

    # --- storage ---------------------------------------------------------------------------

    def to_arrays(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        meta = {"combine": self.combine, "base": self.base, "rule": self.rule,
                "float32_inputs": self.float32_inputs, "nodes": self.n_nodes, "trees": int(self.roots.size)}  # fmt: skip
        arrays = {
            "feature": self.feature.astype(
                np.int8 if self.feature.max(initial=0) < 127 else np.int32
            ),
            "split": self.split.astype(np.float32),
            "right": self.right.astype(np.int32),
            "roots": self.roots.astype(np.int32),
        }
        return meta, arrays

    @classmethod
    def from_arrays(cls, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> TreeEnsemble:
        try:
            return cls(arrays["feature"].astype(np.int64), arrays["split"].astype(np.float32),
                       arrays["right"].astype(np.int64), arrays["roots"].astype(np.int64),
                       str(meta["combine"]), float(meta["base"]), str(meta["rule"]), bool(meta["float32_inputs"]))  # fmt: skip
        except KeyError as e:
            raise ModelError(f"tree ensemble artifact: missing {e}") from None


def _floor_float32(t: np.ndarray) -> np.ndarray:
    """The largest float32 <= t: for float32 x, ``x <= t`` iff ``x <= floor32(t)``."""
    t32 = t.astype(np.float32)
    over = t32.astype(np.float64) > t
    t32[over] = np.nextafter(t32[over], np.float32(-np.inf))
    return t32.astype(np.float64)


def _ceil_float32(t: np.ndarray) -> np.ndarray:
    """The smallest float32 >= t: for float32 x, ``x < t`` iff ``x < ceil32(t)``."""
    t32 = t.astype(np.float32)
    under = t32.astype(np.float64) < t
    t32[under] = np.nextafter(t32[under], np.float32(np.inf))
    return t32.astype(np.float64)


def _preorder(f: np.ndarray, t: np.ndarray, lc: np.ndarray, rc: np.ndarray, v: np.ndarray, *,
              offset: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """One tree (root 0, any node order) as pre-order (feature, split, right) arrays."""
    order: list[int] = []
    stack = [0]
    while stack:
        i = stack.pop()
        order.append(i)
        if f[i] >= 0:
            stack += [int(rc[i]), int(lc[i])]  # left is visited next
    new = np.full(f.size, -1, dtype=np.int64)
    new[order] = np.arange(len(order))
    o = np.array(order)
    leaf = f[o] < 0
    feature = np.where(leaf, -1, f[o])
    split = np.where(leaf, v[o], t[o]).astype(np.float32)
    right = np.where(leaf, -1, new[np.where(leaf, 0, rc[o])] + offset)
    return feature, split, right


def _stack(trees: Sequence[tuple[Any, ...]], *, combine: str, base: float, rule: str,
           float32_inputs: bool) -> TreeEnsemble:  # fmt: skip
    """Concatenate trees given as (feature, threshold, left, right, value) with local indices,
    root 0. Thresholds become float32 (rounded down for ``<=``, up for ``<``: decisions on
    float32 inputs are unchanged), leaf values float32."""
    feats, splits, rights, roots = [], [], [], []
    offset = 0
    for f, thr, lc, rc, v in trees:
        t64 = np.asarray(thr, dtype=np.float64)
        t32 = _floor_float32(t64) if rule == "le" else _ceil_float32(t64)
        fe, sp, ri = _preorder(np.asarray(f), t32, np.asarray(lc), np.asarray(rc), np.asarray(v, dtype=np.float64),
                               offset=offset)  # fmt: skip
        roots.append(offset)
        feats.append(fe)
        splits.append(sp)
        rights.append(ri)
        offset += fe.size
    return TreeEnsemble(np.concatenate(feats).astype(np.int64), np.concatenate(splits).astype(np.float32),
                        np.concatenate(rights).astype(np.int64), np.array(roots, dtype=np.int64),
                        combine, float(base), rule, float32_inputs)  # fmt: skip


def from_sklearn_forest(forest: Any) -> TreeEnsemble:
    """A fitted ``RandomForestRegressor`` (or any bagged sklearn regression trees)."""
    trees = []
    for est in forest.estimators_:
        t = est.tree_
        leaf = t.children_left < 0
        trees.append((np.where(leaf, -1, t.feature), t.threshold, t.children_left, t.children_right,
                      t.value[:, 0, 0]))  # fmt: skip
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
    return _stack(
        trees, combine="sum", base=_xgb_base_score(learner), rule="lt", float32_inputs=True
    )


def _flatten_lightgbm(root: dict[str, Any]) -> tuple[np.ndarray, ...]:
    """One LightGBM tree (nested dicts) as (feature, threshold, left, right, value), root 0."""
    f: list[int] = []
    thr: list[float] = []
    lc: list[int] = []
    rc: list[int] = []
    val: list[float] = []

    def walk(node: dict[str, Any]) -> int:
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

    walk(root)
    return np.array(f), np.array(thr), np.array(lc), np.array(rc), np.array(val)


def from_lightgbm(booster: Any) -> TreeEnsemble:
    """A fitted ``lightgbm.Booster`` (numerical splits, no missing values, no linear trees)."""
    trees = [
        _flatten_lightgbm(info["tree_structure"]) for info in booster.dump_model()["tree_info"]
    ]
    return _stack(trees, combine="sum", base=0.0, rule="le", float32_inputs=False)
