"""Monotone claims: which inputs cannot make an operator faster, checked against its data.

An operator's :class:`~trainsim.kernels.features.OpSpec` signs the inputs where physics says
more work cannot take less time. :func:`data_claims` keeps the claims an entry's measurements
do not contradict; :func:`monotone_violation` checks a fitted entry against them (twice the
problem never more than 10 % faster, or strictly); :func:`claim_signs` turns claims into
monotone constraints for trees. See :mod:`trainsim.kernels.fitting` for how fitting uses them.
"""

from __future__ import annotations

import math

import numpy as np

from trainsim.hardware import DeviceSpec
from trainsim.kernels.calibrated import LearnedEntry
from trainsim.kernels.features import Arrays, column_signs, op_spec

_SWEEP_BASES = 32
_SWEEP_VALUES = 24
MONOTONE_STEP = 2.0  # twice the problem (in any signed input) ...
MONOTONE_SLACK = 0.10  # ... is never more than 10 % faster (learned models; noise allowance)
LOG_SLACK = -math.log2(1.0 - MONOTONE_SLACK)
# Shortest time a prediction is compared at: far below any timed kernel (a CPU call takes
# microseconds). A model that predicts 0 s does so outside its data (the roofline carry of
# tril at F=1, a quarter of its lowest F, has no element below the diagonal): 0 s compared at
# this floor is still far faster than any neighbour — a violation where twice the problem is
# that fast — without numpy warning of log2(0) and turning the whole sweep's steps into NaN.
TIME_FLOOR_S = 1e-12


def log2_time(seconds: np.ndarray) -> np.ndarray:
    """log2 of times, at least :data:`TIME_FLOOR_S` (see there)."""
    return np.log2(np.maximum(seconds, TIME_FLOOR_S))


def claim_signs(spec_name: str, inputs: Arrays, cols: list[str], claims: dict[str, int], *, device: DeviceSpec,
                 dtype: str) -> list[int]:  # fmt: skip
    """Monotone-constraint signs of ``cols`` that make a tree monotone in the ``claims``."""
    sub = {k: v[:: max(1, v.size // 256)] for k, v in inputs.items()}
    names, signs, _ = column_signs(
        op_spec(spec_name), sub, device=device, dtype=dtype, claims=claims
    )
    by = dict(zip(names, signs, strict=True))
    return [by[c] for c in cols]


def data_claims(spec_name: str, inputs: Arrays, seconds: np.ndarray, rows: np.ndarray) -> tuple[dict[str, int], dict[str, str]]:  # fmt: skip
    """(claims kept, claims dropped with the evidence): the operator's monotone claims checked
    against the measurements of ``rows``. For each signed input, every pair of rows that differ
    only in that input, by a factor of 2, is a test; the claim is dropped when more than 1 % of
    them (and at least 2) measure twice the problem more than 10 % faster."""
    spec = op_spec(spec_name)
    kept: dict[str, int] = {}
    dropped: dict[str, str] = {}
    logt = np.log2(seconds[rows])
    for name, sign in spec.inputs.items():
        if sign == 0 or name not in inputs:
            continue
        others = [k for k in inputs if k != name]
        groups: dict[tuple[float, ...], dict[float, float]] = {}
        for i, r in enumerate(rows):
            groups.setdefault(tuple(float(inputs[k][r]) for k in others), {})[
                float(inputs[name][r])
            ] = float(logt[i])
        steps = [sign * (g[2 * v] - t) for g in groups.values() for v, t in g.items() if 2 * v in g]
        bad = sum(st < -LOG_SLACK for st in steps)
        if bad >= 2 and bad > 0.01 * len(steps):
            dropped[name] = (
                f"{bad} of {len(steps)} measured doublings more than {MONOTONE_SLACK:.0%} the wrong way"
            )
        else:
            kept[name] = sign
    return kept, dropped


def monotone_violation(entry: LearnedEntry, inputs: Arrays, rows: np.ndarray, device: DeviceSpec,
                       *, step: float | None = MONOTONE_STEP, seed: int = 0) -> float:  # fmt: skip
    """Largest move against the entry's claims (in log2 time) over sweeps of every claimed
    input along its values in ``rows``, from up to 32 base rows; 0 when there is none.

    ``step=2``: compares each value with its double (when both are in the range): twice the
    problem is never faster. ``step=None``: compares neighbouring values (strict monotonicity)."""
    rng = np.random.default_rng(seed)
    bases = rng.choice(rows, size=min(_SWEEP_BASES, rows.size), replace=False)
    worst = 0.0
    for name, sign in entry.claims.items():
        if sign == 0 or name not in inputs:
            continue
        values = np.unique(inputs[name][rows])
        if values.size > _SWEEP_VALUES:
            values = np.unique(np.quantile(values, np.linspace(0, 1, _SWEEP_VALUES)))
        if step is None:
            lo, hi = values[:-1], values[1:]
        else:
            lo = values[values * step <= values[-1] * (1 + 1e-12)]
            hi = lo * step
        if lo.size == 0:
            continue
        pts = np.concatenate([lo, hi])
        batch = {k: np.repeat(v[bases], pts.size) for k, v in inputs.items()}
        batch[name] = np.tile(pts, bases.size)
        t, _ = entry.predict(batch, device)
        lt = log2_time(t).reshape(bases.size, pts.size)
        steps = (lt[:, lo.size :] - lt[:, : lo.size]) * sign
        worst = max(worst, float(-steps.min(initial=0.0)))
    return worst


def extrapolation_violation(entry: LearnedEntry, inputs: Arrays, rows: np.ndarray, device: DeviceSpec,
                            *, step: float = MONOTONE_STEP, seed: int = 0) -> float:  # fmt: skip
    """:func:`monotone_violation` where the entry carries its answers outside its range
    (:mod:`trainsim.kernels.calibrated`): from 16 of ``rows`` and 16 points drawn log-uniformly in
    the range, each as drawn or with one signed input taken beyond its range (a quarter of its
    lowest value or four times its highest), each claimed input at 12 values from a quarter of
    its lowest to four times its highest, against its double. Largest move against a claim in
    log2 time; 0 when there is none. A sampled check, as inside the range."""
    rng = np.random.default_rng(seed)
    picked = rng.choice(rows, size=min(16, rows.size), replace=False)
    drawn = rng.choice(rows, size=16)  # inputs without a range keep a measured row's values
    base: dict[str, np.ndarray] = {}
    for k, v in inputs.items():
        extra = v[drawn]
        if k in entry.ranges and entry.ranges[k][0] > 0:
            lo, hi = entry.ranges[k]
            extra = np.exp2(rng.uniform(np.log2(lo), np.log2(hi), drawn.size))
        base[k] = np.concatenate([v[picked], extra])
    n = picked.size + drawn.size
    signed = [k for k, s in op_spec(entry.key.op).inputs.items() if s and k in entry.ranges and k in inputs]
    pushes: list[tuple[str, float] | None] = [None]
    for k in signed:
        lo, hi = entry.ranges[k]
        pushes += [(k, lo / 4.0), (k, hi * 4.0)]
    worst = 0.0
    for name, sign in entry.claims.items():
        if sign == 0 or name not in entry.ranges or name not in inputs or entry.ranges[name][0] <= 0:
            continue
        lo, hi = entry.ranges[name]
        pts = np.geomspace(lo / 4.0, hi * 4.0 / step, 12)
        pts = np.concatenate([pts, pts * step])
        for push in pushes:
            if push is not None and push[0] == name:
                continue
            batch = {k: np.repeat(v, pts.size) for k, v in base.items()}
            if push is not None:
                batch[push[0]] = np.full(n * pts.size, push[1])
            batch[name] = np.tile(pts, n)
            t, _ = entry.predict(batch, device)
            lt = log2_time(t).reshape(n, pts.size)
            half = pts.size // 2
            worst = max(worst, float(-((lt[:, half:] - lt[:, :half]) * sign).min(initial=0.0)))
    return worst
