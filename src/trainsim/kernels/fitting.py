"""Fit kernel models on a dataset: per entry, choose a regressor by validation error inside
the training rows, measure it on held-out rows, refit it on everything (001 §III-B).

Per entry (operator, phase, dtype):

1. **Split.** ``holdout`` (20 %) of the entry's distinct inputs are held out with every row
   that has them (seeded by ``seed`` and the entry's label,
   :func:`~trainsim.kernels.samples.heldout_rows` over the distinct inputs in file order, so
   data without repeats split exactly row by row); nothing below looks at them until step 5.
   Drawing shapes, not rows, keeps a shape timed twice (a sweep appended again with
   ``--no-resume``) from sitting on both sides, which scored the model on shapes it was
   trained on.
2. **Screen.** Training rows more than 10x away from a smooth fit of the others (a degree-2
   power law, refitted on the 80 % closest to it, then on the rows within 10x) are timing
   failures, not physics (paper 001's GH200 ``firstStage_optimizer`` sweep has rows 1000x
   slower than their neighbours); they are left out and counted. Training rows with
   identical inputs (001's A100 FlashAttention times 85 shapes twice, 11-12 % apart) are
   merged into one, at their mean log time.
3. **Select.** The training rows are split again 80/20 (validation); every configuration of
   every kind (``grid``) is fitted on the 80 % and scored by MAPE on the 20 %. A candidate is
   rejected when sweeping any *claimed* input along the data's range finds twice the problem
   more than 10 % faster than the problem
   (:func:`~trainsim.kernels.monotone.monotone_violation`). The claims are the operator
   spec's signed inputs, less those the training rows themselves contradict
   (:func:`~trainsim.kernels.monotone.data_claims`: paper 001's GH200
   ``middleStage_optimizer`` is more than 10 % *slower* at twice the model-parallel degree in
   31 of 303 measured pairs; a model faithful to those measurements cannot honour that claim,
   and the entry records why it was dropped). Every tree kind is also tried *constrained*
   (``"constrained": true`` in its config: monotone constraints on every column that moves
   with a claimed input), which honours the claims by construction (except through a GPU
   GEMM's alignment columns, which have no sign: such a candidate is checked like an
   unconstrained one, and strict fits leave those columns out); the ``roofline`` kind is
   monotone too, so some candidate always qualifies. Constrained trees that learn the
   efficiency are monotone in time only if efficiency never improves with size, which per-call
   overhead contradicts on a CPU; so each is also tried on log2 time itself (``"target":
   "time"``, the roofline time one of its columns; ``time_target=False`` leaves that out).
   ``folds > 1`` scores each candidate by k-fold cross-validation on the training rows instead
   of the one 80/20 split. The best score wins; a candidate within
   2 % of it that is smaller wins instead (artifacts stay small).

   Why "twice" and a 10 % allowance, not strict monotonicity: the measurements themselves
   are not monotone at fine steps — cuBLAS switches kernels, e.g. 001's A100 ``baddbmm``
   forward at mp=16, b=4, h=16, d=4608 takes 443 µs at l=4608 and 364 µs at l=5120 — and are
   noisy (repeated A100 FlashAttention configurations differ by 12 % at the median). Trees
   constrained to be strictly monotone in every signed input (``strict_monotone=True``)
   cannot follow such steps and lose accuracy (A100 ``baddbmm`` forward held-out MAPE 6.0 %
   unconstrained, 7.9 % constrained, measured before the efficiency target).
4. **Fit** the winner on all training rows; fit the calibrated roofline's efficiency curve too.
5. **Measure** both on the held-out rows: MAPE, GMAE, max error — on plausible rows (within 10x
   of the prediction) and on all of them.
6. **Refit** the winner on every plausible row (``refit_all``): that is the shipped entry,
   as in 001 ("once selected, the final regressor is built on the entire dataset").
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import math
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from trainsim.comm.metrics import gmae_pct, mape_pct, max_abs_err_pct
from trainsim.errors import ModelError
from trainsim.hardware import DeviceSpec, find_device
from trainsim.ir.kinds import KernelFamily
from trainsim.kernels.calibrated import LearnedEntry, LearnedKernelModel
from trainsim.kernels.features import (
    ALIGN_COLUMNS,
    Arrays,
    column_signs,
    derive,
    device_inputs,
    model_columns,
    op_spec,
    roofline_s,
)
from trainsim.kernels.learned import (
    DEFAULT_KINDS,
    Config,
    configs,
    constrainable,
    fit_kind,
    fit_poly,
    kind,
    kind_columns,
    size_bytes,
)
from trainsim.kernels.monotone import (
    LOG_SLACK,
    MONOTONE_SLACK,
    MONOTONE_STEP,
    claim_signs,
    data_claims,
    extrapolation_violation,
    log2_time,
    monotone_violation,
)
from trainsim.kernels.roofline import EfficiencyCurve, RooflineModel, fit_efficiency
from trainsim.kernels.samples import EntryKey, KernelDataset, heldout_rows, kfold_ids

IMPLAUSIBLE_FACTOR = 10.0  # a timing failure, not noise: an order of magnitude off
_LOG_BAD = math.log2(IMPLAUSIBLE_FACTOR)
_OCCAM = 1.02  # a smaller candidate within 2 % of the best validation MAPE wins
_MIN_ROWS = 10


@dataclass(frozen=True, slots=True)
class Candidate:
    kind: str
    config: Config
    val_mape_pct: float
    size_bytes: int
    rejected: str = ""  # why it cannot be chosen (not monotone, failed to fit)


@dataclass(frozen=True, slots=True)
class EntryReport:
    key: EntryKey
    family: KernelFamily
    kind: str | None
    config: Config
    heldout_mape_pct: float | None
    heldout_gmae_pct: float | None
    heldout_max_pct: float | None
    heldout_mape_all_rows_pct: float | None
    roofline_mape_pct: float | None
    heldout_rows: int
    train_rows: int
    samples: int
    excluded: int  # implausible training rows left out
    size_bytes: int
    seconds: float  # wall time of this entry's fit
    candidates: list[Candidate] = field(default_factory=list)
    heldout: list[tuple[float, float]] = field(default_factory=list)  # (measured s, predicted s)
    contradicted: dict[str, str] = field(default_factory=dict)  # monotone claims the data refute
    row_spreads: tuple[float, ...] = ()  # each row's repeat spread, where the data keep repeats
    heldout_spreads: tuple[float, ...] = ()  # the same, of the held-out rows
    # The entry's rows add up as rows = heldout_rows + train_rows + excluded + merged (training
    # rows whose inputs repeat another's are merged into it); ``samples`` is what the shipped
    # model was fitted on: with the refit, the distinct rows of all of them after the same 10x
    # screen over all rows, which left ``final_excluded`` out (it runs on 20 rows or more, so it
    # can drop rows the screen of the training rows alone kept). 0: set by older callers.
    rows: int = 0
    merged: int = 0
    heldout_implausible: int = 0  # held-out rows more than 10x off the prediction (not in MAPE)
    final_excluded: int = 0

    @property
    def noise_pct(self) -> float | None:
        """The entry's noise floor: median repeat spread (p75 − p25)/median of its rows, in %."""
        return _median_pct(self.row_spreads)

    @property
    def unscored(self) -> str | None:
        """Why the entry has no held-out MAPE (None when it has one): a model shipped without
        one was never checked on rows it did not see, and callers should say so."""
        if self.heldout_mape_pct is not None and math.isfinite(self.heldout_mape_pct):
            return None
        if self.kind is None:
            if self.train_rows < _MIN_ROWS:
                return f"no model: {self.train_rows} training rows, at least {_MIN_ROWS} needed"
            return "no model: no candidate fitted and qualified"
        if self.heldout_rows == 0:
            return "no held-out rows (too few rows for the split)"
        return (f"all {self.heldout_rows} held-out rows are more than {IMPLAUSIBLE_FACTOR:g}x off the model's "
                f"prediction (MAPE over them {_fmt_pct(self.heldout_mape_all_rows_pct)} %)")  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        return {
            "entry": self.key.label, "op": self.key.op, "phase": self.key.phase.value, "dtype": self.key.dtype,
            "family": self.family.value, "kind": self.kind, "config": self.config,
            "gmae_pct": self.heldout_gmae_pct, "mape_pct": self.heldout_mape_pct,
            "max_abs_err_pct": self.heldout_max_pct, "mape_all_rows_pct": self.heldout_mape_all_rows_pct,
            "roofline_mape_pct": self.roofline_mape_pct, "samples": self.samples, "rows": self.rows,
            "heldout_rows": self.heldout_rows, "train_rows": self.train_rows, "excluded_rows": self.excluded,
            "merged_rows": self.merged, "heldout_implausible_rows": self.heldout_implausible,
            "final_excluded_rows": self.final_excluded, "heldout_unscored": self.unscored,
            "size_bytes": self.size_bytes, "fit_seconds": round(self.seconds, 2),
            "claims_contradicted_by_data": self.contradicted,
            "noise_pct": self.noise_pct, "heldout_noise_pct": _median_pct(self.heldout_spreads),
            "candidates": [{"kind": c.kind, "config": c.config, "val_mape_pct": c.val_mape_pct,
                            "size_bytes": c.size_bytes, "rejected": c.rejected} for c in self.candidates],
        }  # fmt: skip


def _median_pct(spreads: Sequence[float]) -> float | None:
    return float(np.median(spreads)) * 100.0 if len(spreads) else None


def _fmt_pct(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:.0f}"


def family_summary(reports: Sequence[EntryReport]) -> dict[str, dict[str, Any]]:
    """Per kernel family: entries, held-out rows, held-out GMAE and the noise floor.

    GMAE pools the entries' held-out GMAE geometrically, weighted by their held-out rows (the
    geometric mean of every plausible held-out row's error); the noise floor is the median
    repeat spread (p75 − p25)/median over all the family's rows (the bench runner's definition)
    and over its held-out rows — what a perfect model of the true median still scores, to
    first order."""
    out: dict[str, dict[str, Any]] = {}
    for fam in sorted({r.family.value for r in reports}):
        rs = [r for r in reports if r.family.value == fam]
        fitted = [(r, g) for r in rs if (g := r.heldout_gmae_pct) is not None and r.heldout_rows > 0
                  and math.isfinite(g)]  # fmt: skip
        n = sum(r.heldout_rows for r, _ in fitted)
        gmae = (
            math.exp(sum(r.heldout_rows * math.log(max(g, 1e-9)) for r, g in fitted) / n)
            if n
            else None
        )
        worst = max(fitted, key=lambda rg: rg[1])[0].key.label if fitted else None
        out[fam] = {
            "entries": len(fitted), "entries_without_model": len(rs) - len(fitted), "heldout_rows": n,
            # every row of the entries (duplicates merged for training included)
            "rows": sum(r.rows or r.train_rows + r.heldout_rows + r.excluded for r in rs),
            "gmae_pct": gmae,
            "noise_pct": _median_pct([s for r in rs for s in r.row_spreads]),
            "heldout_noise_pct": _median_pct([s for r, _ in fitted for s in r.heldout_spreads]),
            "worst_entry": worst,
        }  # fmt: skip
    return out


@dataclass(frozen=True, slots=True)
class FitResult:
    model: LearnedKernelModel | None  # None when no entry had enough rows
    roofline: RooflineModel
    reports: list[EntryReport]


def guess_device(ds: KernelDataset) -> DeviceSpec:
    dev = find_device(ds.device) if ds.device else None
    if dev is None:
        raise ModelError(
            f"dataset {ds.name}: device {ds.device!r} is not in the hardware catalog; pass --device (a catalog name, "
            "or the <dataset>.device.yaml that `trainsim bench roofline --dataset <dataset>` measures on this machine)"
        )
    return dev


def _layout(spec_name: str, inputs: Arrays, device: DeviceSpec, dtype: str) -> tuple[list[str], list[int], np.ndarray]:  # fmt: skip
    """Columns a model of this entry reads (conflicting and constant ones left out), their
    monotone signs and the design matrix."""
    spec = op_spec(spec_name)
    names, mat = model_columns(spec, inputs, device=device, dtype=dtype)
    sub = {k: v[:: max(1, v.size // 256)] for k, v in inputs.items()}
    _, signs, conflicts = column_signs(spec, sub, device=device, dtype=dtype)
    keep = [i for i, n in enumerate(names) if n not in conflicts and np.ptp(mat[:, i]) > 1e-12]
    return [names[i] for i in keep], [signs[i] for i in keep], mat[:, keep]


def _implausible(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Rows more than 10x from a degree-2 power law of the others: fitted on all rows, refitted
    on the 80 % closest to it (trimmed least squares), then on the rows within 10x of that."""
    bad = np.zeros(y.size, dtype=bool)
    if y.size < 20:
        return bad
    keep = np.ones(y.size, dtype=bool)
    for step in range(3):
        fit = fit_poly(x[keep], y[keep], [], {"degree": 2, "alpha": 1e-4}, 0)
        res = np.abs(fit.predict(x) - y)
        bad = res > _LOG_BAD
        keep = res <= np.quantile(res, 0.8) if step == 0 else ~bad
    return bad


def _heldout_by_inputs(inputs: Arrays, n: int, *, fraction: float, seed: int, label: str) -> np.ndarray:
    """Held-out mask over ``n`` rows drawn by distinct inputs: ``round(fraction * shapes)`` of the
    entry's distinct input tuples, each with every row that has it, so no held-out shape is also
    a training row (review finding: in a CPU layernorm sweep appended to itself, each of the 8
    held-out rows per phase had its repeat in training; forward scored 4.4 %, the unique rows
    55 %). Shapes are numbered in file order:
    without repeats this is :func:`heldout_rows` of the rows themselves, unchanged."""
    if not inputs or n == 0:
        return heldout_rows(n, fraction=fraction, seed=seed, label=label)
    shape = _shape_ids(inputs)
    return heldout_rows(int(shape.max()) + 1, fraction=fraction, seed=seed, label=label)[shape]


def _shape_ids(inputs: Arrays) -> np.ndarray:
    """Each row's distinct input tuple as an id, numbered in order of first appearance."""
    x = np.column_stack([inputs[k] for k in sorted(inputs)])
    _, first, inv = np.unique(x, axis=0, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.intp)
    rank[np.argsort(first)] = np.arange(first.size)  # np.unique sorts by value: back to file order
    return rank[inv.ravel()]


def _merge_duplicates(
    inputs: Arrays, y: np.ndarray, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(rows, y): each group of ``rows`` with identical ``inputs`` kept once, its log2 time the
    group's mean (one shape timed twice is one point, not two votes; the spread between the
    repeats is measurement noise — 85 of 001's A100 FlashAttention shapes, 11-12 % apart)."""
    if rows.size == 0:
        return rows, y
    _, first, inv = np.unique(_shape_ids(inputs)[rows], return_index=True, return_inverse=True)
    inv = inv.ravel()
    if first.size == rows.size:
        return rows, y
    out = y.copy()
    out[rows[first]] = np.bincount(inv, weights=y[rows]) / np.bincount(inv)
    return np.sort(rows[first]), out


def _ranges(inputs: Arrays, rows: np.ndarray) -> dict[str, tuple[float, float]]:
    return {k: (float(v[rows].min()), float(v[rows].max())) for k, v in inputs.items()}


def _entry(key: EntryKey, family: KernelFamily, *, kname: str, cfg: Config, cols: list[str], reg: Any,
           inputs: Arrays, rows: np.ndarray, claims: dict[str, int], roof: np.ndarray, y: np.ndarray) -> LearnedEntry:  # fmt: skip
    """The entry of a regressor fitted on ``rows``, with the efficiency curve of the same rows
    (``roof``: every row's roofline time, ``y``: log2 seconds) that carries its answers
    outside their range (:mod:`trainsim.kernels.calibrated`)."""
    curve = fit_efficiency(roof[rows], np.exp2(y[rows]))
    return LearnedEntry(key, family, kname, dict(cfg), tuple(cols), reg, _ranges(inputs, rows), int(rows.size),
                        {}, dict(claims), curve)  # fmt: skip


def _carrying(entry: LearnedEntry, inputs: Arrays, rows: np.ndarray, device: DeviceSpec, *, seed: int,
              strict: bool) -> tuple[LearnedEntry, str]:  # fmt: skip
    """The entry with its efficiency curve if carrying answers along it outside the range keeps
    the claims (:func:`extrapolation_violation` within the monotone slack, or no worse than the
    roofline carry), else without it (the roofline carry); and what it carries along, and why."""
    if entry.curve is None:
        return entry, "roofline"
    curve = extrapolation_violation(entry, inputs, rows, device, seed=seed)
    if curve <= (1e-9 if strict else LOG_SLACK):
        return entry, "efficiency curve"
    plain = replace(entry, curve=None)
    roof = extrapolation_violation(plain, inputs, rows, device, seed=seed)
    if curve <= roof + 1e-9:
        return entry, "efficiency curve"
    return plain, (f"roofline (along the efficiency curve a claimed input moved {1 - 2**-curve:.0%} the wrong way "
                   f"across or beyond the range, along the roofline {1 - 2**-roof:.0%})")


def _take(inputs: Arrays, rows: np.ndarray) -> Arrays:
    return {k: v[rows] for k, v in inputs.items()}


def _select(key: EntryKey, family: KernelFamily, *, kinds: Sequence[str], grid: str, cols: list[str], signs: list[int],
            x: np.ndarray, y: np.ndarray, roof: np.ndarray, inputs: Arrays, rows: np.ndarray, device: DeviceSpec, seed: int,
            n_jobs: int, strict: bool, claims: dict[str, int], time_target: bool = True,
            folds: int = 1) -> list[Candidate]:  # fmt: skip
    val = heldout_rows(rows.size, fraction=0.2, seed=seed + 1, label=key.label)
    fit_rows, val_rows = rows[~val], rows[val]
    # folds > 1: each candidate is scored on every training row, predicted by a fit of the
    # other folds (k-fold cross-validation), not on one 20 % draw — steadier on a few dozen rows
    splits = [(fit_rows, val_rows)]
    folds = min(folds, rows.size)  # more folds than rows would fit on empty folds (leave-one-out at most)
    if folds > 1:
        ids = kfold_ids(rows.size, folds=folds, seed=seed + zlib.crc32(key.label.encode()))
        splits = [(rows[ids != f], rows[ids == f]) for f in range(folds)]
    out: list[Candidate] = []
    for kname in kinds:
        k = kind(kname)
        idx = kind_columns(k, cols)
        if strict:  # the alignment columns move both ways with the sizes: no strict model reads them
            idx = [i for i in idx if cols[i] not in ALIGN_COLUMNS]
        kx, kcols, ksigns = x[:, idx], [cols[i] for i in idx], [signs[i] for i in idx]
        # constraints make a tree monotone in every claimed input only through columns with a sign
        by_construction = not ALIGN_COLUMNS & set(kcols)
        variants = (
            (True,)
            if strict and k.monotone
            else (False, True)
            if k.monotone and any(ksigns)
            else (False,)
        )
        # A constrained tree that learns the efficiency is monotone in time only if the
        # efficiency never improves with size; where per-call overhead dominates small problems
        # (CPU operators) it does, so constrained trees are also tried on log2 time itself.
        targets = [(c, False) for c in variants] + [
            (True, True) for c in variants if c and k.on_roofline and time_target
        ]
        for cfg, (constrained, on_time) in itertools.product(configs(k, grid), targets):
            if constrained and not constrainable(k, cfg):
                continue
            label = {**cfg, "constrained": True} if constrained else dict(cfg)
            if on_time:
                label["target"] = "time"
            preds, meas = [], []
            try:
                for fit_rows, val_rows in splits:
                    reg = fit_kind(
                        k,
                        kx[fit_rows],
                        y[fit_rows],
                        cols=kcols,
                        signs=ksigns if constrained else [0] * len(ksigns),
                        cfg={**cfg, **({"n_jobs": n_jobs} if k.threads else {})},
                        seed=seed,
                        on_roofline=not on_time,
                    )
                    entry = _entry(key, family, kname=kname, cfg=label, cols=kcols, reg=reg, inputs=inputs,
                                   rows=fit_rows, claims=claims, roof=roof, y=y)  # fmt: skip
                    preds.append(entry.predict(_take(inputs, val_rows), device)[0])
                    meas.append(np.exp2(y[val_rows]))
            except (ValueError, np.linalg.LinAlgError) as e:
                out.append(Candidate(kname, label, math.inf, 0, f"fit failed: {e}"))
                continue
            score = mape_pct(np.concatenate(preds), np.concatenate(meas))
            why = ""
            if not ((constrained and by_construction) or k.name == "roofline") and monotone_violation(
                entry, inputs, fit_rows, device, step=None if strict else MONOTONE_STEP, seed=seed
            ) > (1e-9 if strict else LOG_SLACK):
                why = (
                    "not monotone in a claimed input"
                    if strict
                    else (f"more than {MONOTONE_SLACK:.0%} faster at twice the problem size")
                )
            out.append(
                Candidate(
                    kname, label, score if math.isfinite(score) else math.inf, size_bytes(reg), why
                )
            )
    return out


def _finite(v: np.ndarray) -> tuple[float, ...]:
    return tuple(float(x) for x in v if np.isfinite(x))


def _choose(cands: list[Candidate]) -> Candidate | None:
    ok = [c for c in cands if not c.rejected and math.isfinite(c.val_mape_pct)]
    if not ok:
        return None
    best = min(c.val_mape_pct for c in ok)
    near = [c for c in ok if c.val_mape_pct <= best * _OCCAM]
    return min(near, key=lambda c: (c.size_bytes, c.val_mape_pct))


def _plausible(pred: np.ndarray, meas: np.ndarray) -> np.ndarray:
    """Rows predicted within 10x of their measurement (a 0 s prediction is not, without a
    log2(0) warning)."""
    return np.abs(log2_time(pred) - log2_time(meas)) <= _LOG_BAD


def _errors(pred: np.ndarray, meas: np.ndarray, ok: np.ndarray) -> tuple[float | None, float | None, float | None, float]:
    """(MAPE, GMAE, max) on the plausible rows ``ok`` (:func:`_plausible`) — None, not NaN,
    when there is none, so that no mean over entries turns NaN — and MAPE on all rows."""
    if not ok.any():
        return None, None, None, mape_pct(pred, meas)
    p, m = pred[ok], meas[ok]
    return mape_pct(p, m), gmae_pct(p, m), max_abs_err_pct(p, m), mape_pct(pred, meas)


def fit_entry(ds: KernelDataset, key: EntryKey, *, device: DeviceSpec, kinds: Sequence[str] = DEFAULT_KINDS,
              grid: str = "quick", holdout: float = 0.2, seed: int = 0, refit_all: bool = True,
              n_jobs: int = 1, strict_monotone: bool = False,
              time_target: bool = True, folds: int = 1) -> tuple[LearnedEntry | None, EfficiencyCurve, EntryReport]:  # fmt: skip
    """One entry (see the module docstring)."""
    t0 = time.perf_counter()
    spec = op_spec(key.op)
    family = spec.family_for(key.phase)
    raw, secs, _ = ds.arrays(key)
    spreads = ds.spreads(key)
    inputs = device_inputs(spec, raw, device, key.dtype)
    cols, signs, x = _layout(key.op, inputs, device, key.dtype)
    y = np.log2(secs)
    test = _heldout_by_inputs(inputs, y.size, fraction=holdout, seed=seed, label=key.label)
    train_all = np.flatnonzero(~test)
    bad = _implausible(x[train_all], y[train_all])
    train, y = _merge_duplicates(inputs, y, train_all[~bad])
    merged = int((~bad).sum()) - int(train.size)
    w = derive(spec, inputs, key.dtype)
    roof = roofline_s(w["flops"], w["bytes"], device, key.dtype)
    curve = fit_efficiency(roof[train], secs[train])
    test_rows = np.flatnonzero(test)
    r_mape = mape_pct(curve(roof[test_rows]), secs[test_rows]) if test_rows.size else None
    claims, contradicted = data_claims(key.op, inputs, secs, train)
    if strict_monotone:
        claims, contradicted = {k: s for k, s in spec.inputs.items() if s}, {}
    signs = claim_signs(key.op, inputs, cols, claims, device=device, dtype=key.dtype)
    cands: list[Candidate] = []
    chosen = None
    if train.size >= _MIN_ROWS and cols:
        cands = _select(key, family, kinds=kinds, grid=grid, cols=cols, signs=signs, x=x, y=y, roof=roof, inputs=inputs,
                        rows=train, device=device, seed=seed, n_jobs=n_jobs, strict=strict_monotone, claims=claims,
                        time_target=time_target, folds=folds)  # fmt: skip
        chosen = _choose(cands)
    entry = None
    errs: tuple[float | None, ...] = (None, None, None, None)
    heldout: list[tuple[float, float]] = []
    size = 0
    implausible_heldout = 0
    final_excluded = int(bad.sum())  # without the refit the shipped fit is the training fit
    if chosen is not None:
        k = kind(chosen.kind)
        cfg = {c: v for c, v in chosen.config.items() if c not in ("constrained", "target")}
        on_roofline = chosen.config.get("target") != "time"
        extra = {"n_jobs": n_jobs} if k.threads else {}
        idx = kind_columns(k, cols)
        cols, x = [cols[i] for i in idx], x[:, idx]
        signs = [signs[i] for i in idx] if chosen.config.get("constrained") else [0] * len(idx)
        fit = functools.partial(fit_kind, k, cols=cols, signs=signs, cfg={**cfg, **extra}, seed=seed,
                                on_roofline=on_roofline)  # fmt: skip
        reg = fit(x[train], y[train])
        trained = _entry(key, family, kname=chosen.kind, cfg=chosen.config, cols=cols, reg=reg, inputs=inputs,
                         rows=train, claims=claims, roof=roof, y=y)  # fmt: skip
        trained, carry = _carrying(trained, inputs, train, device, seed=seed, strict=strict_monotone)
        if test_rows.size:
            pred, _ = trained.predict(_take(inputs, test_rows), device)
            ok = _plausible(pred, secs[test_rows])
            errs = _errors(pred, secs[test_rows], ok)
            implausible_heldout = int((~ok).sum())
            heldout = [(float(m), float(p)) for m, p in zip(secs[test_rows], pred, strict=True)]
        entry, size = trained, size_bytes(reg)
        if refit_all:
            y = np.log2(secs)
            every = np.arange(y.size)
            bad_all = _implausible(x, y)
            final_excluded = int(bad_all.sum())
            keep, y = _merge_duplicates(inputs, y, every[~bad_all])
            reg = fit(x[keep], y[keep])
            entry = _entry(key, family, kname=chosen.kind, cfg=chosen.config, cols=cols, reg=reg, inputs=inputs,
                           rows=keep, claims=claims, roof=roof, y=y)  # fmt: skip
            entry, carry = _carrying(entry, inputs, keep, device, seed=seed, strict=strict_monotone)
            size = size_bytes(reg)
            curve = fit_efficiency(roof[keep], secs[keep])
    curve = EfficiencyCurve(curve.u, curve.g, curve.samples, r_mape)
    report = EntryReport(key, family, chosen.kind if chosen else None, dict(chosen.config) if chosen else {},
                         errs[0], errs[1], errs[2], errs[3], r_mape, int(test_rows.size), int(train.size),
                         entry.samples if entry else 0, int(bad.sum()), size, time.perf_counter() - t0,
                         cands, heldout, contradicted, _finite(spreads),
                         _finite(spreads[test_rows]) if chosen is not None else (), rows=int(secs.size),
                         merged=merged, heldout_implausible=implausible_heldout,
                         final_excluded=final_excluded if chosen is not None else 0)  # fmt: skip
    if entry is not None:
        metrics = {
            k: v
            for k, v in report.as_dict().items()
            if (k.endswith("_pct") and not (k.endswith("noise_pct") and v is None))
            or k in ("heldout_rows", "train_rows", "excluded_rows", "heldout_implausible_rows")
        }
        metrics["candidates"] = [{"kind": c.kind, "config": c.config, "val_mape_pct": c.val_mape_pct,
                                  "rejected": c.rejected} for c in cands]  # fmt: skip
        metrics["claims_contradicted_by_data"] = contradicted
        metrics["carried_outside_range_along"] = carry
        entry = LearnedEntry(entry.key, entry.family, entry.kind, entry.config, entry.columns, entry.regressor,
                             entry.ranges, entry.samples, metrics, entry.claims, entry.curve)  # fmt: skip
    return entry, curve, report


def fit_kernels(ds: KernelDataset, *, device: DeviceSpec | None = None, kinds: Sequence[str] = DEFAULT_KINDS,
                grid: str = "quick", holdout: float = 0.2, seed: int = 0, families: Iterable[KernelFamily] | None = None,
                ops: Iterable[str] | None = None, refit_all: bool = True, n_jobs: int = 1,
                strict_monotone: bool = False, progress: Callable[[EntryReport], None] | None = None,
                time_target: bool = True, folds: int = 1) -> FitResult:  # fmt: skip
    """Fit every entry of ``ds`` (optionally only some families or operators)."""
    dev = device or guess_device(ds)
    for k in kinds:
        kind(k)
    fams = set(families) if families is not None else None
    keep_ops = set(ops) if ops is not None else None
    keys = [k for k in ds.entry_keys()
            if (fams is None or op_spec(k.op).family_for(k.phase) in fams) and (keep_ops is None or k.op in keep_ops)]  # fmt: skip
    if not keys:
        raise ModelError(f"dataset {ds.name}: no rows of the requested families/operators")
    entries, curves, reports = [], {}, []
    for key in keys:
        entry, curve, report = fit_entry(ds, key, device=dev, kinds=kinds, grid=grid, holdout=holdout, seed=seed,
                                         refit_all=refit_all, n_jobs=n_jobs, strict_monotone=strict_monotone,
                                         time_target=time_target, folds=folds)  # fmt: skip
        if entry is not None:
            entries.append(entry)
        curves[key] = curve
        reports.append(report)
        if progress is not None:
            progress(report)
    prov = {
        "dataset": ds.name, "device_as_measured": ds.device, "fingerprint": ds.fingerprint,
        "formats": sorted(ds.formats), "rows": len(ds), "kinds": list(kinds), "grid": grid,
        "monotone": "strict (constrained trees)" if strict_monotone else f"never faster at {MONOTONE_STEP:g}x a signed input",
        "fitted_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "split": f"{holdout:.0%} of distinct inputs held out per entry with all their rows (seed {seed} + CRC-32 of the entry label); "
                 + ("selection on an 80/20 split of the rest" if folds <= 1 else f"selection by {folds}-fold cross-validation on the rest")
                 + "; final fit on all plausible rows" if refit_all else
                 f"{holdout:.0%} of distinct inputs held out per entry with all their rows (seed {seed}); fitted on the rest",
        "ranges": {e.key.label: {k: list(v) for k, v in e.ranges.items()} for e in entries},
    }  # fmt: skip
    model = (
        LearnedKernelModel(device=dev, dataset=ds.name, entries=entries, provenance=prov)
        if entries
        else None
    )
    roof = RooflineModel(dev, curves=curves, dataset=ds.name, provenance=prov)
    return FitResult(model, roof, reports)
