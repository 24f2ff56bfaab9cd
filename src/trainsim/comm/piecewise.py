"""The piecewise collective curve of paper 000 §III-C (Eq. 2–4), and its robust fit.

000 observes that, for any collective and interconnect, effective bandwidth against message size
has three regions: (1) constant latency ``ts`` for small messages, (2) an S-shaped bandwidth
ramp, (3) saturated bandwidth ``BWmax``. Its Eq. 2::

    t(m) = ts                      m <= m1
           f(m, param)             m1 <= m <= m2
           ts + m / BWmax          m >= m2

with 4 sigmoid parameters (Eq. 4: ``sigmoid(x) = L / (1 + exp(-k (x - x0))) + b``), 2 region
boundaries, ``ts`` and ``BWmax``: 8 parameters per (collective, group size, tier).

Eq. 3 is garbled in the PDF extraction ("f(m, param) = logm2 / 10sigmoid(m,param)"). From the
text around it (region 2 is an "S-shape bandwidth curve" of message size) we read it as
``f(m) = m / 10**sigmoid(log2 m)``: the log10 of the effective bandwidth is a sigmoid of the
log2 of the size. Bandwidth here is bytes per second.

Deliberate deviation, for continuity and monotonicity: Eq. 2 as printed jumps at m1 and m2
unless the parameters satisfy two equalities. We evaluate the continuous envelope
``t(m) = max(ts + m / BWmax, f(m))`` and define m1 and m2 as the first and last sizes where
``f`` crosses the line: below m1 the time is ts (+ m/BWmax, under 2 % there), between them the
sigmoid governs, above m2 the saturated line does. m1 and m2 are thus fitted through the
other six parameters, and all eight are stored. Both branches increase with m (the fit bounds
``L·k <= 1.2 < 4·log10(2)`` so that ``f`` does), hence so does ``t``: no collective gets
faster by sending more.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from numpy.typing import ArrayLike

from trainsim.errors import ModelError

_LOG10_2 = math.log10(2.0)
_MAX_SLOPE = 1.2  # bound on L*k; f increases in m iff L*k/4 < log10(2) (= 0.301)
_SOFT_L1_SCALE = 0.05  # robust-loss scale on log-time residuals: ~5 % errors count fully


@dataclass(frozen=True, slots=True)
class PiecewiseCurve:
    """The eight parameters of 000 Eq. 2–4 (SI units: seconds, bytes, bytes per second)."""

    ts_s: float  # startup latency (region 1)
    bw_max_Bps: float  # noqa: N815 - unit in the name (STYLE.md); saturated bandwidth (region 3)
    sig_height: float  # the paper's L: sigmoid height, in decades of bandwidth
    sig_x0: float  # sigmoid midpoint, log2(bytes)
    sig_k: float  # sigmoid steepness, per doubling
    sig_b: float  # sigmoid floor, log10(bytes per second)
    m1_bytes: float  # end of region 1 (derived by the fit)
    m2_bytes: float  # start of region 3 (derived by the fit)

    def __post_init__(self) -> None:
        vals = (self.ts_s, self.bw_max_Bps, self.sig_height, self.sig_k)
        if not all(math.isfinite(v) for v in vals) or self.ts_s < 0 or self.bw_max_Bps <= 0:
            raise ModelError(f"invalid piecewise curve parameters: {self}")
        if (
            self.sig_height < 0
            or self.sig_k < 0
            or self.sig_height * self.sig_k > _MAX_SLOPE * 1.0001
        ):
            raise ModelError(
                f"piecewise curve would not increase with size (L*k = "
                f"{self.sig_height * self.sig_k:.3f} > {_MAX_SLOPE}); refit it"
            )

    @classmethod
    def from_core(
        cls, ts_s: float, bw_max_bps: float, *, height: float, x0: float, k: float, b: float
    ) -> PiecewiseCurve:
        """A curve from its six free parameters; the region boundaries m1, m2 follow."""
        m1, m2 = _boundaries((ts_s, bw_max_bps, height, x0, k, b))
        return cls(ts_s, bw_max_bps, height, x0, k, b, m1, m2)

    def sigmoid_log10_bw(self, x: np.ndarray) -> np.ndarray:
        """Eq. 4 at x = log2(bytes): log10 of the region-2 bandwidth (bytes/s)."""
        with np.errstate(over="ignore"):  # exp -> inf far below x0 gives the floor b, as it should
            return self.sig_height / (1.0 + np.exp(-self.sig_k * (x - self.sig_x0))) + self.sig_b

    def __call__(self, nbytes: ArrayLike) -> np.ndarray:
        """Seconds for each message size (bytes); sizes below 1 byte count as 1 byte."""
        m = np.maximum(np.asarray(nbytes, dtype=float), 1.0)
        line = self.ts_s + m / self.bw_max_Bps
        with np.errstate(over="ignore"):
            f = m / 10.0 ** self.sigmoid_log10_bw(np.log2(m))
        return np.maximum(line, f)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, float]) -> PiecewiseCurve:
        try:
            return cls(**{k: float(d[k]) for k in cls.__dataclass_fields__})
        except KeyError as e:
            raise ModelError(f"piecewise curve misses parameter {e.args[0]!r}") from None


def _boundaries(core: tuple[float, float, float, float, float, float]) -> tuple[float, float]:
    """First and last sizes (bytes) where the sigmoid branch rises above the saturated line."""
    ts, bw, height, x0, k, b = core
    x = np.linspace(0.0, 48.0, 4801)  # 1 B .. 256 TiB in 1/100 doublings
    m = 2.0**x
    with np.errstate(over="ignore"):
        f = m / 10.0 ** (height / (1.0 + np.exp(-k * (x - x0))) + b)
    above = f > ts + m / bw
    if not above.any():
        return 1.0, 1.0  # a pure alpha-beta curve: no transition region
    idx = np.flatnonzero(above)
    return float(m[idx[0]]), float(m[min(idx[-1] + 1, m.size - 1)])


# --- fitting -------------------------------------------------------------------------------


def _unpack(p: np.ndarray) -> tuple[float, float, float, float, float, float]:
    """Unconstrained vector -> (ts, bw, height, x0, k, b) inside their bounds."""
    ts = math.exp(min(max(p[0], -40.0), 5.0))  # 4e-18 s .. 150 s
    bw = math.exp(min(max(p[1], 0.0), 60.0))  # 1 B/s .. 1e26 B/s
    height = math.exp(min(max(p[3], -20.0), 3.0))  # at most 20 decades of bandwidth
    u = 1.0 / (1.0 + math.exp(-min(max(p[5], -30.0), 30.0)))
    return ts, bw, height, float(p[4]), _MAX_SLOPE * u / height, float(p[2])


def _log_model(
    p: np.ndarray, m: np.ndarray, x: np.ndarray, jac: bool = False
) -> tuple[np.ndarray, np.ndarray | None]:
    """log t(m) and, with ``jac``, its derivatives by the six unconstrained parameters."""
    ts, bw, height, x0, k, b = _unpack(p)
    line = ts + m / bw
    with np.errstate(over="ignore"):
        sig = 1.0 / (1.0 + np.exp(-k * (x - x0)))
    ln10 = math.log(10.0)
    y_line, y_sig = np.log(line), np.log(m) - ln10 * (height * sig + b)
    use_sig = y_sig > y_line
    y = np.where(use_sig, y_sig, y_line)
    if not jac:
        return y, None
    u = k * height / _MAX_SLOPE  # the logistic of p[5]
    ds = sig * (1.0 - sig)
    jac_m = np.zeros((m.size, 6))
    jac_m[:, 0] = np.where(use_sig, 0.0, ts / line)
    jac_m[:, 1] = np.where(use_sig, 0.0, -(m / bw) / line)
    jac_m[:, 2] = np.where(use_sig, -ln10, 0.0)
    jac_m[:, 3] = np.where(use_sig, -ln10 * height * (sig - k * ds * (x - x0)), 0.0)
    jac_m[:, 4] = np.where(use_sig, ln10 * height * k * ds, 0.0)
    jac_m[:, 5] = np.where(use_sig, -ln10 * height * ds * (x - x0) * k * (1.0 - u), 0.0)
    return y, jac_m


def _lm(
    p: np.ndarray, data: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], iters: int
) -> tuple[np.ndarray, float]:
    """Levenberg–Marquardt with IRLS soft-L1 weights on log-time residuals.

    ``data`` is (sizes, log2 sizes, log times, row weights)."""
    m, x, y, wt = data
    lam = 1e-2
    rel = 1.0

    def loss(q: np.ndarray) -> float:
        r = (_log_model(q, m, x)[0] - y) / _SOFT_L1_SCALE
        val = float(np.sum(wt * 2.0 * (np.sqrt(1.0 + r * r) - 1.0)))
        return val if math.isfinite(val) else math.inf

    cur = loss(p)
    for _ in range(iters):
        pred, jac_m = _log_model(p, m, x, jac=True)
        assert jac_m is not None
        r = pred - y
        w = wt / np.sqrt(1.0 + (r / _SOFT_L1_SCALE) ** 2)
        jw = jac_m * w[:, None]
        normal = jw.T @ jac_m
        g = jw.T @ r
        improved = False
        for _ in range(8):
            try:
                step = np.linalg.solve(normal + lam * np.diag(np.diag(normal) + 1e-12), -g)
            except np.linalg.LinAlgError:
                lam *= 10.0
                continue
            cand = p + step
            new = loss(cand)
            if new < cur:
                p, lam, improved = cand, max(lam / 3.0, 1e-9), True
                rel = (cur - new) / max(cur, 1e-12)
                cur = new
                break
            lam *= 10.0
        if not improved or rel < 1e-9:
            break
    return p, cur


def _binned(
    x: np.ndarray, y: np.ndarray, max_points: int = 256
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Large sweeps (paper 001 has ~1,700 sizes per case) become ``max_points // 2`` bins of
    equal count in log size: median log size, median log time, weight = rows in the bin. The
    fit then costs the same for any sweep; small sweeps are used as they are."""
    if x.size <= max_points:
        return x, y, np.ones_like(x)
    order = np.argsort(x)
    bins = np.array_split(order, max_points // 2)
    return (np.array([np.median(x[b]) for b in bins]), np.array([np.median(y[b]) for b in bins]),
            np.array([float(b.size) for b in bins]))  # fmt: skip


def fit_piecewise(nbytes: ArrayLike, seconds: ArrayLike, *, iters: int = 60) -> PiecewiseCurve:
    """Fit the eight parameters to measurements (bytes, seconds) by robust log-space least squares.

    Deterministic: a fixed grid of starting points (sigmoid midpoint across the measured size
    range, two steepnesses), each refined by Levenberg–Marquardt with a soft-L1 loss on
    log-time residuals (so one noisy repeat does not bend the curve); the best wins.
    """
    m = np.asarray(nbytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    ok = np.isfinite(m) & np.isfinite(t) & (m > 0) & (t > 0)
    m, t = m[ok], t[ok]
    if np.unique(m).size < 3:
        raise ModelError(
            f"need measurements at 3 or more message sizes to fit a piecewise curve, got {np.unique(m).size}"
        )
    x, y, wt = _binned(np.log2(m), np.log(t))
    m = 2.0**x
    bw_eff = m / np.exp(y)
    ts0 = float(np.exp(np.median(y[m <= np.percentile(m, 10)])))
    bw0 = float(np.max(bw_eff))
    b0 = math.log10(float(np.min(bw_eff)))
    height0 = max(math.log10(bw0) - b0, 0.05)
    best: tuple[float, np.ndarray] | None = None
    for x0 in np.linspace(x.min(), x.max(), 6):
        for u in (0.3, 0.9):
            p0 = np.array(
                [math.log(ts0), math.log(bw0), b0, math.log(height0), x0, math.log(u / (1 - u))]
            )
            p, cur = _lm(p0, (m, x, y, wt), iters)
            if best is None or cur < best[0]:
                best = (cur, p)
    assert best is not None
    ts, bw, height, x0, k, b = _unpack(best[1])
    return PiecewiseCurve.from_core(ts, bw, height=height, x0=x0, k=k, b=b)
