"""Error metrics of the comm models: GMAE (000 Table I), MAPE (001 Table IX), max error.

All take predicted and measured durations (any unit, the same for both) and return percent.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

# Approximation: a geometric mean of |error| is dragged to zero by one exact hit, so errors
# below 0.01 % count as 0.01 % (a floor far under any measurement's noise).
_GMAE_FLOOR = 1e-4


def abs_rel_errors(pred: ArrayLike, meas: ArrayLike) -> np.ndarray:
    """|pred - meas| / meas, elementwise (fractions, not percent)."""
    p = np.asarray(pred, dtype=float)
    m = np.asarray(meas, dtype=float)
    return np.abs(p - m) / m


def gmae_pct(pred: ArrayLike, meas: ArrayLike) -> float:
    """Geometric mean of the absolute relative errors, in percent (000 §IV-A)."""
    e = abs_rel_errors(pred, meas)
    if e.size == 0:
        return float("nan")
    return float(np.exp(np.mean(np.log(np.maximum(e, _GMAE_FLOOR)))) * 100.0)


def mape_pct(pred: ArrayLike, meas: ArrayLike) -> float:
    """Mean absolute percentage error (what 001's ``Best_error`` column holds, as a fraction)."""
    e = abs_rel_errors(pred, meas)
    return float(np.mean(e) * 100.0) if e.size else float("nan")


def max_abs_err_pct(pred: ArrayLike, meas: ArrayLike) -> float:
    e = abs_rel_errors(pred, meas)
    return float(np.max(e) * 100.0) if e.size else float("nan")
