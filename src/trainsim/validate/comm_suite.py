"""The ``comm`` validation suite: collective models against measurements nobody here made.

Groups of cases (each case one curve's held-out predictions, errors per case, never only
averages):

``azure-heldout``
    Echo's nccl-tests all-reduce logs on Azure ND A100 v4, 1–128 GPUs. Per group size, 000's
    piecewise curve is fitted on 75 % of the message sizes and predicts the other 25 % (drawn
    with seed 0 among the interior sizes; the smallest and largest always train).
``azure-extrapolation``
    The same logs: fit on the 1–16 GPU logs only (curves plus the hierarchical model's
    efficiencies and latencies), predict every size at 32, 64 and 128 GPUs.
``seed001``
    Paper 001's NCCL sweeps on Perlmutter (A100) and Vista (GH200), one case per file
    (collective, nodes, GPUs per node): an 80/20 split of the sizes (seed 0, like the paper's
    80/20 validation), MAPE on the held-out 20 %, beside the paper's own error. Rows faster
    than the catalog's links allow are timing failures: they are dropped from fitting and the
    error is given on the plausible held-out rows (``mape_pct``) and on all of them
    (``mape_all_rows_pct``). ``neighbour_mape_pct``: the held-out rows predicted by the median
    of the 5 training rows nearest in size — the scatter between neighbouring measurements, a
    noise floor no curve of size gets far below.
``vtrain``
    vTrain's all-reduce tables (A100 and V100, 2–8 GPUs in a node), 25 % held out.

``azure-heldout`` and ``vtrain`` score 000's piecewise curve itself. ``seed001`` scores what
``fit-comm`` ships: the curve family (piecewise, alpha-beta, or the monotone regressor of
001 §III-B) is chosen by held-out GMAE on an inner 25 % split of the *training* rows
(:func:`trainsim.comm.fitting.fit_case`), refitted on all training rows, then scored on the
test rows; each case also carries the piecewise curve's MAPE on the same rows. No family
selection happens on any test split.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from trainsim.comm.curves import FAMILIES
from trainsim.comm.fitting import (
    SELECTION_CRITERIA,
    fit_case,
    fit_comm,
    guess_system,
    implausible_mask,
)
from trainsim.comm.hierarchical import HierarchicalModel
from trainsim.comm.metrics import abs_rel_errors, gmae_pct, mape_pct, max_abs_err_pct
from trainsim.comm.monotone import MonotoneCurve
from trainsim.comm.piecewise import PiecewiseCurve, fit_piecewise
from trainsim.comm.readers import PaperError, read_comm_dataset, read_seed001_errors
from trainsim.comm.samples import CommDataset, heldout_split
from trainsim.errors import ConfigError

AZURE = "comm/nccl_tests_allreduce_a100_40gb_azure"
SEED001 = ("calibration/a100-sxm4-80gb_perlmutter/nccl", "calibration/gh200-120gb_vista/nccl")
VTRAIN = ("comm/vtrain_allreduce_lut_a100", "comm/vtrain_allreduce_lut_v100")
SEED = 0
INNER_HOLDOUT = 0.25  # seed001: share of the training sizes that choose the curve family
CRITERION = "gmae"  # the held-out error that chooses it, the same as ``fit-comm``'s
_KIB64 = 64 * 1024


def _case(
    name: str, group: str, pred: np.ndarray, meas: np.ndarray, nbytes: np.ndarray, **extra: Any
) -> dict[str, Any]:
    big = nbytes >= _KIB64
    return {
        "name": name, "group": group, "points": int(meas.size),
        "gmae_pct": gmae_pct(pred, meas), "mape_pct": mape_pct(pred, meas), "max_abs_err_pct": max_abs_err_pct(pred, meas),
        "gmae_ge64KiB_pct": gmae_pct(pred[big], meas[big]) if big.any() else None,
        "errors": [{"bytes": float(b), "measured_s": float(t), "predicted_s": float(p), "err_pct": float((p - t) / t * 100)}
                   for b, t, p in zip(nbytes, meas, pred, strict=True)],
        **extra,
    }  # fmt: skip


def _azure_heldout(ds: CommDataset) -> list[dict[str, Any]]:
    out = []
    for key in ds.cases():
        m, t = ds.arrays(key)
        test = heldout_split(m, fraction=0.25, seed=SEED)
        curve = fit_piecewise(m[~test], t[~test])
        out.append(_case(f"all_reduce {key.group_size} GPUs ({key.nodes}x{key.gpus_per_node}), held-out sizes",
                         "azure-heldout", curve(m[test]), t[test], m[test], group_size=key.group_size))  # fmt: skip
    return out


def _azure_extrapolation(ds: CommDataset) -> list[dict[str, Any]]:
    small = CommDataset(f"{ds.name}[<=16 GPUs]", [s for s in ds if s.nodes * s.gpus_per_node <= 16],
                        ds.device, ds.system_hint, ds.formats)  # fmt: skip
    model = fit_comm(small, system=guess_system(ds)).model
    out = []
    for key in ds.cases():
        if key.group_size <= 16:
            continue
        m, t = ds.arrays(key)
        pred, prov = model.predict_many(
            key.kind, m, key.group_size, gpus_per_node=key.gpus_per_node
        )
        out.append(_case(f"all_reduce {key.group_size} GPUs from fits on <=16 GPUs", "azure-extrapolation",
                         pred, t, m, group_size=key.group_size, provenance=prov))  # fmt: skip
    return out


def _seed001(data_dir: Path, folder: str) -> list[dict[str, Any]]:
    root = data_dir / folder
    ds = read_comm_dataset([root])
    system = guess_system(ds)
    hier = HierarchicalModel(system) if system is not None else None
    paper: dict[tuple[str, int, int], PaperError] = {}
    for f in root.glob("*.csv"):
        if not f.read_text(encoding="utf-8-sig").startswith("GPU,Function,"):
            continue
        paper.update({(e.series, e.nodes, e.gpus_per_node): e for e in read_seed001_errors(f)})
    out = []
    for key in ds.cases():
        for series in ds.series_of(key):
            m, t = ds.arrays(key, series)
            test = heldout_split(m, fraction=0.2, seed=SEED, keep_ends=False)
            bad = implausible_mask(hier, key, m, t) if hier is not None else np.zeros(m.shape, bool)
            pe = paper.get((series, key.nodes, key.gpus_per_node))
            if np.unique(m[~test & ~bad]).size < 3 or not (test & ~bad).any():
                # every row (or every held-out row) is faster than the links allow: a timing
                # failure of the benchmark (e.g. GH200 all_gather 4x1, times falling with size)
                out.append({"name": f"{ds.device} {series} {key.nodes}x{key.gpus_per_node}", "group": "seed001",
                            "series": series, "nodes": key.nodes, "gpus_per_node": key.gpus_per_node,
                            "rows": int(m.size), "implausible_rows": int(bad.sum()), "points": 0,
                            "unusable": "too few rows the links allow (timing failures)",
                            "paper_error_pct": pe.error_pct if pe else None, "errors": []})  # fmt: skip
                continue
            train = ~test & ~bad
            fam, curve, inner = fit_case(m[train], t[train], holdout=INNER_HOLDOUT, seed=SEED,
                                         families=tuple(FAMILIES), criterion=CRITERION)  # fmt: skip
            ok = test & ~bad
            p_all = curve(m[test])
            case = _case(f"{ds.device} {series} {key.nodes}x{key.gpus_per_node}", "seed001", curve(m[ok]), t[ok], m[ok],
                         series=series, nodes=key.nodes, gpus_per_node=key.gpus_per_node,
                         system=system.name if system else None, implausible_rows=int(bad.sum()), rows=int(m.size),
                         mape_all_rows_pct=mape_pct(p_all, t[test]),
                         paper_error_pct=pe.error_pct if pe else None, paper_model=pe.model if pe else None,
                         neighbour_mape_pct=mape_pct(_neighbour_median(m[train], t[train], m[ok]), t[ok]),
                         family=fam, inner_heldout_pct={f: v[SELECTION_CRITERIA.index(CRITERION)] for f, v in inner.items()},
                         piecewise_mape_pct=mape_pct(_piecewise_of(curve, m[train], t[train])(m[ok]), t[ok]))  # fmt: skip
            case["abs_err_pct"] = case["mape_pct"]  # as the paper reports its own (abs_err_metric)
            case["abs_err_metric"] = "mape"
            out.append(case)
    return out


NEIGHBOURS = 5


def _neighbour_median(m: np.ndarray, t: np.ndarray, at: np.ndarray, k: int = NEIGHBOURS) -> np.ndarray:
    """Each size in ``at`` predicted by the median time of the ``k`` training sizes nearest to
    it (in log size): no curve, only the scatter between neighbouring measurements — where
    this errs by X %, a smooth model of size cannot do much better than X % either (the
    case's noise floor)."""
    order = np.argsort(np.abs(np.log2(at)[:, None] - np.log2(m)[None, :]), axis=1, kind="stable")
    return np.median(t[order[:, : min(k, m.size)]], axis=1)


def _piecewise_of(curve: Any, m: np.ndarray, t: np.ndarray) -> Any:
    """000's piecewise curve on these rows: the chosen curve itself, the one a monotone curve
    was built on (same rows), or a fit."""
    if isinstance(curve, PiecewiseCurve):
        return curve
    if isinstance(curve, MonotoneCurve):
        return curve.base
    return fit_piecewise(m, t)


def _vtrain(data_dir: Path, folder: str) -> list[dict[str, Any]]:
    ds = read_comm_dataset([data_dir / folder])
    out = []
    for key in ds.cases():
        m, t = ds.arrays(key)
        test = heldout_split(m, fraction=0.25, seed=SEED)
        curve = fit_piecewise(m[~test], t[~test])
        out.append(_case(f"{folder.rsplit('_', 1)[-1]} all_reduce {key.group_size} GPUs, held-out sizes", "vtrain",
                         curve(m[test]), t[test], m[test], group_size=key.group_size))  # fmt: skip
    return out


def _pooled(cases: list[dict[str, Any]], groups: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    rows = [e for c in cases if c["group"] in groups for e in c["errors"]]
    return np.array([e["predicted_s"] for e in rows]), np.array([e["measured_s"] for e in rows])


def run_comm_suite(data_dir: Path, *, include_errors: bool = False) -> dict[str, Any]:
    """Run every group; ``data_dir`` is ``shared/data``. Per-point errors are dropped from the
    result unless ``include_errors`` (they are long)."""
    data_dir = Path(data_dir)
    groups: list[tuple[str, Callable[[], list[dict[str, Any]]]]] = []
    if (data_dir / AZURE).is_dir():
        az = read_comm_dataset([data_dir / AZURE])
        groups += [
            ("azure-heldout", partial(_azure_heldout, az)),
            ("azure-extrapolation", partial(_azure_extrapolation, az)),
        ]
    groups += [
        ("seed001", partial(_seed001, data_dir, f)) for f in SEED001 if (data_dir / f).is_dir()
    ]
    groups += [("vtrain", partial(_vtrain, data_dir, f)) for f in VTRAIN if (data_dir / f).is_dir()]
    missing = [f for f in (AZURE, *SEED001, *VTRAIN) if not (data_dir / f).is_dir()]
    if not groups:
        raise ConfigError(f"{data_dir}: none of the suite's measurement folders ({', '.join((AZURE, *SEED001, *VTRAIN))}); "
                          "pass --data PATH (the shared/data folder)")  # fmt: skip
    cases: list[dict[str, Any]] = []
    for _, run in groups:
        cases.extend(run())
    for c in cases:
        if "abs_err_pct" not in c:  # the nccl-tests and vTrain cases: GMAE (their sizes span 10 decades)
            c["abs_err_pct"] = c.get("gmae_pct")
            c["abs_err_metric"] = "gmae" if c["abs_err_pct"] is not None else None  # an unusable case: none
    summary = _summary(cases)
    if missing:  # a partial data folder: the figures are of what was there
        summary["missing_folders"] = missing
        print(f"[comm] warning: {len(missing)} of the suite's folders are not under {data_dir} and were skipped: "
              f"{', '.join(missing)}", file=sys.stderr, flush=True)  # fmt: skip
    if not include_errors:
        for c in cases:
            c.pop("errors")
    return {"suite": "comm", "cases": cases, "summary": summary}


def _summary(cases: list[dict[str, Any]]) -> dict[str, Any]:
    p, m = _pooled(cases, ("azure-heldout", "azure-extrapolation", "seed001", "vtrain"))
    e = abs_rel_errors(p, m) * 100 if p.size else np.array([np.nan])
    out: dict[str, Any] = {"median_abs_err_pct": float(np.median(e)), "mape_pct": float(np.mean(e)),
                           "max_abs_err_pct": float(np.max(e)), "gmae_pct": gmae_pct(p, m), "cases": len(cases),
                           "predictions": int(p.size),
                           # what the pooled figures pool: the dense sweeps dominate them
                           "predictions_by_group": {g: int(_pooled(cases, (g,))[0].size) for g in
                                                    ("azure-heldout", "azure-extrapolation", "seed001", "vtrain")}}  # fmt: skip
    az_p, az_m = _pooled(cases, ("azure-heldout",))
    if az_p.size:
        sizes = np.array(
            [x["bytes"] for c in cases if c["group"] == "azure-heldout" for x in c["errors"]]
        )
        out["azure_heldout_gmae_pct"] = gmae_pct(az_p, az_m)
        out["azure_heldout_gmae_ge64KiB_pct"] = gmae_pct(
            az_p[sizes >= _KIB64], az_m[sizes >= _KIB64]
        )
    ex_p, ex_m = _pooled(cases, ("azure-extrapolation",))
    if ex_p.size:
        out["azure_extrapolation_gmae_pct"] = gmae_pct(ex_p, ex_m)
    s001 = [c for c in cases if c["group"] == "seed001"]
    if s001:
        out["seed001_cases"] = len(s001)
        out["seed001_cases_over_10pct"] = [c["name"] for c in s001 if c.get("mape_pct", 0) > 10]
        out["seed001_cases_unusable"] = [c["name"] for c in s001 if "unusable" in c]
        out["seed001_paper_cases_over_10pct"] = [
            c["name"] for c in s001 if (c["paper_error_pct"] or 0) > 10
        ]
        # over 10 % where even the neighbours' median is: the measurements' own scatter
        out["seed001_cases_over_10pct_noise_floor_over_10pct"] = [
            c["name"] for c in s001 if c.get("mape_pct", 0) > 10 and c.get("neighbour_mape_pct", 0) > 10
        ]
    return out
