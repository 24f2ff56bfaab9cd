"""The classic message-passing cost ``t = ts + m / BW`` (000 Eq. 1, after Grama et al.).

Kept as a baseline family: fitted with the same robust log-space loss as the piecewise curve,
and chosen over it only where it predicts held-out sizes better (narrow, bandwidth-bound
sweeps sometimes do).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from numpy.typing import ArrayLike

from trainsim.errors import ModelError

_SOFT_L1_SCALE = 0.05


@dataclass(frozen=True, slots=True)
class AlphaBetaCurve:
    ts_s: float
    bw_Bps: float  # noqa: N815 - unit in the name (STYLE.md)

    def __post_init__(self) -> None:
        if not (
            math.isfinite(self.ts_s)
            and self.ts_s >= 0
            and math.isfinite(self.bw_Bps)
            and self.bw_Bps > 0
        ):
            raise ModelError(f"invalid alpha-beta parameters: {self}")

    def __call__(self, nbytes: ArrayLike) -> np.ndarray:
        m = np.maximum(np.asarray(nbytes, dtype=float), 0.0)
        return self.ts_s + m / self.bw_Bps

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, float]) -> AlphaBetaCurve:
        try:
            return cls(float(d["ts_s"]), float(d["bw_Bps"]))
        except KeyError as e:
            raise ModelError(f"alpha-beta curve misses parameter {e.args[0]!r}") from None


def fit_alphabeta(nbytes: ArrayLike, seconds: ArrayLike, *, iters: int = 30) -> AlphaBetaCurve:
    """Robust fit (IRLS, soft-L1 on relative residuals) of ``ts >= 0`` and ``BW > 0``."""
    m = np.asarray(nbytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    ok = np.isfinite(m) & np.isfinite(t) & (t > 0)
    m, t = m[ok], t[ok]
    if np.unique(m).size < 2:
        raise ModelError("need measurements at 2 or more message sizes to fit an alpha-beta curve")
    design = np.column_stack([np.ones_like(m), m])
    w = np.ones_like(t)
    coef = np.array([float(np.min(t)), float(np.median(t / np.maximum(m, 1.0)))])
    for _ in range(iters):
        # relative residuals: divide each row by its measurement
        wcol = (w / t)[:, None]
        coef, *_ = np.linalg.lstsq(design * wcol, np.ones_like(t) * (w / t) * t, rcond=None)
        coef[0] = max(coef[0], 0.0)
        coef[1] = max(coef[1], 1e-30)
        r = (design @ coef - t) / t / _SOFT_L1_SCALE
        w_new = 1.0 / np.sqrt(np.sqrt(1.0 + r * r))  # sqrt of the IRLS weight: lstsq squares it
        if np.allclose(w_new, w, rtol=1e-6):
            break
        w = w_new
    return AlphaBetaCurve(float(coef[0]), float(1.0 / coef[1]))
