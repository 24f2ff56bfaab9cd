"""Fit collective models on a dataset: per case, choose a curve family by held-out error;
then calibrate the hierarchical model that carries curves to unmeasured group sizes.

Per (collective, nodes, GPUs per node) case:

1. drop rows that beat the catalog's physical bound (:func:`implausible_mask`): a collective
   cannot move bytes faster than its links; such rows are timing failures;
2. hold out ``holdout`` of the distinct sizes (seed ``seed``; smallest and largest always
   train), fit every family on the rest, score held-out GMAE and MAPE;
3. keep the family with the lowest held-out GMAE and refit it on all rows.

The hierarchical model (when the system is known) gets bandwidth efficiencies from the
large messages and per-step latencies from leave-one-case-out anchored predictions
(:func:`calibrate_hierarchical`).
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainsim.comm.calibrated import CalibratedCommModel, FittedCase, anchored_time, choose_anchor
from trainsim.comm.curves import FAMILIES, Curve, family
from trainsim.comm.hierarchical import HierarchicalModel, HierParams
from trainsim.comm.metrics import gmae_pct, mape_pct
from trainsim.comm.samples import CaseKey, CommDataset, heldout_split
from trainsim.errors import ModelError
from trainsim.hardware import SystemSpec, find_device, list_systems

_BOUND_SLACK = 1.05  # rows more than 5 % faster than the physical bound are implausible
_BW_REGIME_BYTES = 16 * 2**20  # sizes from which a collective is bandwidth-bound
_LATENCY_GRID_S = np.geomspace(0.05e-6, 100e-6, 121)
_MIN_GAIN = 0.01  # a fitted latency must improve the transfer loss by 1 % to replace the catalog's
_LATENCY_REGIME_BYTES = 2**20  # latency is identifiable only from cases measured this small


@dataclass(frozen=True, slots=True)
class FitResult:
    model: CalibratedCommModel
    cases: list[FittedCase]
    # cases left out, each with its rows, the implausible ones and the distinct sizes left
    skipped: list[dict[str, Any]] = field(default_factory=list)


def guess_system(ds: CommDataset) -> SystemSpec | None:
    """The catalog system the data were measured on: one named in the paths, else the only
    system with the data's device."""
    hint = (ds.system_hint or "").lower()
    systems = list_systems()
    named = [s for s in systems if any(n.lower() in hint for n in (s.name, *s.aliases))]
    if len(named) == 1:
        return named[0]
    dev = find_device(ds.device) if ds.device else None
    if dev is not None:
        same = [s for s in systems if s.device == dev.name]
        if len(same) == 1:
            return same[0]
    return None


def implausible_mask(
    hier: HierarchicalModel, key: CaseKey, nbytes: np.ndarray, seconds: np.ndarray
) -> np.ndarray:
    """Rows faster than the links allow: time < bytes x (spec per-byte cost at full bandwidth)."""
    spec = HierarchicalModel(hier.system)  # efficiencies 1: the physical bound
    try:
        per_byte = spec.best_per_byte_s(key.kind, key.nodes, key.gpus_per_node)
    except ModelError:
        return np.zeros(nbytes.shape, dtype=bool)
    return seconds * _BOUND_SLACK < nbytes * per_byte


SELECTION_CRITERIA = ("gmae", "mape")


def fit_case(nbytes: np.ndarray, seconds: np.ndarray, *, holdout: float, seed: int,
             families: tuple[str, ...], criterion: str = "gmae",
             ) -> tuple[str, Curve, dict[str, tuple[float, float]]]:  # fmt: skip
    """(chosen family, its curve refit on all rows, family -> (held-out GMAE %, MAPE %)).

    The family with the lowest held-out ``criterion`` (GMAE or MAPE) wins; ties go to the
    family listed first."""
    if criterion not in SELECTION_CRITERIA:
        raise ModelError(f"selection criterion must be one of {SELECTION_CRITERIA}, got {criterion!r}")
    col = SELECTION_CRITERIA.index(criterion)
    test = heldout_split(nbytes, fraction=holdout, seed=seed)
    scores: dict[str, tuple[float, float]] = {}
    for name in families:
        try:
            c = family(name).fit(nbytes[~test], seconds[~test])
        except ModelError:
            continue
        p = c(nbytes[test])
        scores[name] = (
            (gmae_pct(p, seconds[test]), mape_pct(p, seconds[test]))
            if test.any()
            else (math.nan, math.nan)
        )
    if not scores:
        raise ModelError(f"no curve family could be fitted to {np.unique(nbytes).size} sizes")
    best = min(scores, key=lambda f: (math.isnan(scores[f][col]), scores[f][col], families.index(f)))
    return best, family(best).fit(nbytes, seconds), scores


def fit_comm(ds: CommDataset, *, system: SystemSpec | None = None, holdout: float = 0.25, seed: int = 0,
             families: tuple[str, ...] = tuple(FAMILIES), name: str | None = None) -> FitResult:  # fmt: skip
    """Fit every case of ``ds`` (see the module docstring)."""
    if not 0 <= holdout < 1:
        raise ModelError(f"holdout must be in [0, 1), got {holdout}")
    hier = HierarchicalModel(system) if system is not None else None
    cases: list[FittedCase] = []
    skipped: list[dict[str, Any]] = []
    data: dict[CaseKey, tuple[np.ndarray, np.ndarray]] = {}
    for key in ds.cases():
        m, t = ds.arrays(key)
        bad = (
            implausible_mask(hier, key, m, t)
            if hier is not None
            and hier.supports(key.kind, key.group_size, gpus_per_node=key.gpus_per_node)
            else np.zeros(m.shape, bool)
        )
        rows = int(m.size)
        m, t = m[~bad], t[~bad]
        if np.unique(m).size < 3:
            skipped.append({"collective": key.kind.value, "nodes": key.nodes, "gpus_per_node": key.gpus_per_node,
                            "rows": rows, "implausible_rows": int(bad.sum()), "sizes_left": int(np.unique(m).size)})  # fmt: skip
            continue
        data[key] = (m, t)
        fam, curve, scores = fit_case(m, t, holdout=holdout, seed=seed, families=families)
        cases.append(FittedCase(key, fam, curve, int(m.size), float(m.min()), float(m.max()), scores[fam][0],
                                scores[fam][1], {f: s[0] for f, s in scores.items()}, int(bad.sum())))  # fmt: skip
    if not cases:
        bad = sum(x["implausible_rows"] for x in skipped)
        why = (f"{bad} of {sum(x['rows'] for x in skipped)} rows are faster than the system's links allow "
               "(times in another unit than the file says?)" if bad else "")  # fmt: skip
        raise ModelError(f"dataset {ds.name}: no case has plausible measurements at 3 or more sizes"
                         + (f": {why}" if why else ""))
    params = calibrate_hierarchical(hier, cases, data, ds.name) if hier is not None else None
    prov = {
        "dataset": ds.name, "device": ds.device, "formats": sorted(ds.formats), "rows": len(ds),
        "fitted_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "split": f"{holdout:.0%} of distinct sizes held out per case, seed {seed}, smallest and largest kept",
    }  # fmt: skip
    model = CalibratedCommModel(name=name or f"calibrated:{ds.name}", dataset=ds.name, cases=cases, system=system,
                                hier_params=params, provenance=prov)  # fmt: skip
    return FitResult(model, cases, skipped)


# --- hierarchical calibration ----------------------------------------------------------------


def _efficiency(
    hier: HierarchicalModel, data: dict[CaseKey, tuple[np.ndarray, np.ndarray]], cross: bool
) -> float | None:
    """Median ratio of measured to spec per-byte speed over bandwidth-bound rows of the cases
    inside one node (``cross=False``) or across nodes (``cross=True``)."""
    ratios = []
    for key, (m, t) in data.items():
        if (key.nodes > 1) != cross or key.group_size < 2:
            continue
        big = m >= max(_BW_REGIME_BYTES, np.percentile(m, 75))
        if not big.any():
            continue
        pb = hier.best_per_byte_s(key.kind, key.nodes, key.gpus_per_node)
        ratios.append(float(np.median(m[big] * pb / t[big])))
    return float(np.median(ratios)) if ratios else None


def _transfer_loss(hier: HierarchicalModel, curves: dict[CaseKey, Curve], data: dict[CaseKey, tuple[np.ndarray, np.ndarray]],
                   targets: list[CaseKey]) -> float:  # fmt: skip
    total = 0.0
    for key in targets:
        anchor = choose_anchor(key, list(curves))
        if anchor is None:
            continue
        m, t = data[key]
        r = np.log(anchored_time(hier, anchor, curves[anchor], key, m) / t) / 0.05
        total += float(np.sum(2.0 * (np.sqrt(1.0 + r * r) - 1.0)))
    return total


def at_latency_grid_bound(latency_s: float) -> bool:
    """Whether a fitted step latency is an end of the grid it is searched on: a boundary hit,
    which says the data do not pin the latency, not a fitted value."""
    return math.isclose(latency_s, float(_LATENCY_GRID_S[0])) or math.isclose(latency_s, float(_LATENCY_GRID_S[-1]))


def _fit_latency(hier: HierarchicalModel, field: str, curves: dict[CaseKey, Curve],
                 data: dict[CaseKey, tuple[np.ndarray, np.ndarray]], targets: list[CaseKey]) -> float | None:  # fmt: skip
    if not targets:
        return None
    base = _transfer_loss(hier, curves, data, targets)
    losses = [
        _transfer_loss(hier.with_params(**{field: float(a)}), curves, data, targets)
        for a in _LATENCY_GRID_S
    ]
    best = int(np.argmin(losses))
    return float(_LATENCY_GRID_S[best]) if losses[best] < (1 - _MIN_GAIN) * base else None


def calibrate_hierarchical(hier: HierarchicalModel, cases: list[FittedCase],
                           data: dict[CaseKey, tuple[np.ndarray, np.ndarray]], dataset: str) -> HierParams:  # fmt: skip
    """Bandwidth efficiencies from large messages; per-step latencies by leave-one-case-out:
    each measured case is predicted from its anchor (the same rule predictions use) and the
    latency that predicts them best is kept if it beats the catalog's by 1 %. Only cases
    measured down to 1 MiB inform latencies; sweeps of large messages leave the catalog's."""
    eff_node = _efficiency(hier, data, cross=False)
    h = hier.with_params(eff_node=min(eff_node or 1.0, 1.5))
    eff_cluster = _efficiency(h, data, cross=True)
    h = h.with_params(eff_cluster=min(eff_cluster or 1.0, 1.5))
    curves = {c.key: c.curve for c in cases}
    small = {c.key for c in cases if c.min_bytes <= _LATENCY_REGIME_BYTES}
    inside = [k for k in curves if k.nodes == 1 and k.group_size > 1 and k in small]
    across = [k for k in curves if k.nodes > 1 and k in small]
    a_node = _fit_latency(h, "latency_node_s", curves, data, inside)
    if a_node is not None:
        h = h.with_params(latency_node_s=a_node)
    a_cluster = _fit_latency(h, "latency_cluster_s", curves, data, across)
    fitted = any(v is not None for v in (eff_node, eff_cluster, a_node, a_cluster))
    return HierParams(
        h.params.eff_node, h.params.eff_cluster, a_node, a_cluster, dataset if fitted else None
    )
