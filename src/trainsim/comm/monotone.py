"""A learned, monotone regressor of collective time on log message size (paper 001 §III-B).

Paper 001 fits one regressor per (collective, nodes, GPUs per node) on the message size (a
random forest or XGBoost). A tree is a step function of size and need not increase with it;
this family keeps what the tree buys (no assumed shape: any protocol switch, any bandwidth
ramp) and adds the contract every comm model honours (time never falls as size grows, never
negative):

1. rows sorted by size are grouped into at most ``max_knots`` bins of about equal count
   (rows of one size never split across bins);
2. each bin gives one knot: the median log2 size and the *MAPE-optimal* time of its rows,
   the median weighted by 1 / time (the minimiser of sum |p - t| / t; on clean sweeps it is the
   median, on sweeps with slow outliers it keeps to the bulk of fast rows);
3. weighted isotonic regression (pool adjacent violators, weights = rows per knot) makes the
   knot times non-decreasing;
4. between knots the curve is linear in (log size, log time); outside the knots it follows
   the shape of 000's piecewise curve fitted on the same rows (``base``), scaled to meet the
   end knot: ``t(m) = base(m) * t(knot) / base(knot)``. A learned regressor knows nothing
   beyond its data (a tree is flat there), while the piecewise curve carries the startup
   latency below and the saturated bandwidth above; a positive factor keeps it increasing.

Fitted and stored per case like the piecewise curve; :func:`trainsim.comm.fitting.fit_case`
keeps it only where it predicts held-out sizes better.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from trainsim.comm.piecewise import PiecewiseCurve, fit_piecewise
from trainsim.errors import ModelError

MAX_KNOTS = 64
# What a stored knot may hold: a message of 1 B to 16 EiB, a time of 1 ps to ~12 days (ln s)
_KNOT_RANGES = {"log2_bytes": (0.0, 64.0, "a size of 1 B to 16 EiB (log2 bytes"),
                "log_s": (math.log(1e-12), math.log(1e6), "a time of 1 ps to 12 days (ln seconds")}  # fmt: skip


@dataclass(frozen=True, slots=True)
class MonotoneCurve:
    """Knots (log2 bytes, log seconds), non-decreasing in both; the piecewise curve that
    extrapolates beyond them."""

    log2_bytes: tuple[float, ...]
    log_s: tuple[float, ...]
    base: PiecewiseCurve

    def __post_init__(self) -> None:
        x, y = np.asarray(self.log2_bytes, float), np.asarray(self.log_s, float)
        if (
            x.size < 1
            or x.size != y.size
            or not (np.all(np.isfinite(x)) and np.all(np.isfinite(y)))
        ):
            raise ModelError(
                f"monotone curve needs matching finite knots, got {x.size} and {y.size}"
            )
        if np.any(np.diff(x) <= 0) or np.any(np.diff(y) < 0):
            raise ModelError("monotone curve knots must increase in size and not decrease in time")

    def __call__(self, nbytes: ArrayLike) -> np.ndarray:
        """Seconds for each message size (bytes); sizes below 1 byte count as 1 byte."""
        m = np.maximum(np.asarray(nbytes, dtype=float), 1.0)
        x = np.log2(m)
        kx, ky = np.asarray(self.log2_bytes), np.asarray(self.log_s)
        y = np.interp(x, kx, ky)
        ends = np.exp2(np.array([kx[0], kx[-1]]))
        b_lo, b_hi = self.base(ends)
        with np.errstate(divide="ignore"):
            shape = np.log(self.base(m))
        y = np.where(x < kx[0], ky[0] + shape - math.log(b_lo), y)
        y = np.where(x > kx[-1], ky[-1] + shape - math.log(b_hi), y)
        return np.exp(y)

    def to_dict(self) -> dict[str, Any]:
        return {
            "log2_bytes": list(self.log2_bytes),
            "log_s": list(self.log_s),
            "base": self.base.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MonotoneCurve:
        try:
            knots = {k: tuple(float(v) for v in d[k]) for k in _KNOT_RANGES}
            for k, (lo, hi, what) in _KNOT_RANGES.items():  # an edited artifact: inf ms, an overflow
                if (bad := next((v for v in knots[k] if not lo <= v <= hi), None)) is not None:
                    raise ModelError(f"monotone curve: field {k}: {bad!r} is not {what} {lo:.3g} to {hi:.3g})")
            return cls(knots["log2_bytes"], knots["log_s"], PiecewiseCurve.from_dict(d["base"]))
        except KeyError as e:
            raise ModelError(f"monotone curve misses parameter {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise ModelError(f"monotone curve: bad parameters ({e})") from None


def mape_optimal(seconds: np.ndarray) -> float:
    """The time p minimising sum |p - t| / t: the median of t weighted by 1 / t."""
    t = np.sort(np.asarray(seconds, dtype=float))
    w = np.cumsum(1.0 / t)
    return float(t[int(np.searchsorted(w, 0.5 * w[-1]))])


def isotonic(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted least-squares non-decreasing fit of ``y`` (pool adjacent violators)."""
    vals: list[float] = []
    wts: list[float] = []
    lens: list[int] = []
    for yi, wi in zip(y.tolist(), w.tolist(), strict=True):
        vals.append(yi)
        wts.append(wi)
        lens.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            w2 = wts[-2] + wts[-1]
            v = (vals[-2] * wts[-2] + vals[-1] * wts[-1]) / w2
            n = lens[-2] + lens[-1]
            del vals[-1], wts[-1], lens[-1]
            vals[-1], wts[-1], lens[-1] = v, w2, n
    return np.repeat(np.array(vals), lens)


def fit_monotone(
    nbytes: ArrayLike, seconds: ArrayLike, *, max_knots: int = MAX_KNOTS
) -> MonotoneCurve:
    """Fit the knots to measurements (bytes, seconds); see the module docstring."""
    m = np.asarray(nbytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    ok = np.isfinite(m) & np.isfinite(t) & (m > 0) & (t > 0)
    m, t = m[ok], t[ok]
    sizes, counts = np.unique(m, return_counts=True)
    if sizes.size < 3:
        raise ModelError(
            f"need measurements at 3 or more message sizes to fit a monotone curve, got {sizes.size}"
        )
    order = np.argsort(m, kind="stable")
    m, t = m[order], t[order]
    # bins of whole sizes, about equal row counts
    target = max(1.0, m.size / max_knots)
    edges = [0]
    acc = 0
    for c in counts.tolist():
        acc += c
        if acc >= target:
            edges.append(edges[-1] + acc)
            acc = 0
    if acc:
        if len(edges) > 1 and acc < 0.5 * target:
            edges[-1] += acc  # a short last bin joins the previous one
        else:
            edges.append(edges[-1] + acc)
    x = np.log2(m)
    kx = np.array([float(np.median(x[a:b])) for a, b in itertools.pairwise(edges)])
    ky = np.array([math.log(mape_optimal(t[a:b])) for a, b in itertools.pairwise(edges)])
    kw = np.diff(np.array(edges, dtype=float))
    ky = isotonic(ky, kw)
    return MonotoneCurve(tuple(kx.tolist()), tuple(ky.tolist()), fit_piecewise(m, t))
