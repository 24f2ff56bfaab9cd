"""Embedding index batches with a prescribed reuse-factor histogram (000 §III-E, Fig. 6).

A histogram gives, per bucket of lookups-per-unique-row ``(lo, hi]``, the fraction of the unique
rows of a batch that fall in it. :data:`DLRM_2022` is the published locality of Meta's open DLRM
dataset (2022 part, 788 tables, batch 131,072: ≈1.405e9 indices, ≈1.10e8 unique rows, 12.7
lookups per unique row on average). :func:`reuse_counts` turns a histogram and a batch size
into lookups per unique row whose bucket fractions match the histogram and whose sum is the
batch size exactly; :func:`reuse_indices` places those rows at random in a table and shuffles.

Approximation: within a bucket, counts are spread evenly over its integers, so the mean reuse
of :data:`DLRM_2022` is ≈11.3 rather than the measured 12.7 (the real within-bucket shape is
not published). A batch of ``n`` indices has only ``n / 11.3`` unique rows, so buckets holding
0.1 % of the rows are only represented from roughly 10⁴ indices up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from trainsim.errors import ConfigError


@dataclass(frozen=True, slots=True)
class ReuseHistogram:
    """Fraction of unique rows per bucket ``(lo, hi]`` of lookups per row; fractions sum to 1."""

    name: str
    buckets: tuple[tuple[int, int, float], ...]  # (lo, hi, fraction of unique rows)

    def __post_init__(self) -> None:
        total = sum(f for _, _, f in self.buckets)
        if not self.buckets or abs(total - 1.0) > 1e-3:
            raise ConfigError(f"reuse histogram {self.name!r}: fractions sum to {total:.4f}, not 1")
        for lo, hi, f in self.buckets:
            if not (0 <= lo < hi) or f < 0:
                raise ConfigError(f"reuse histogram {self.name!r}: bad bucket ({lo}, {hi}] {f}")

    def mean_reuse(self) -> float:
        """Mean lookups per unique row when counts are spread evenly inside each bucket."""
        return sum(f * (lo + 1 + hi) / 2 for lo, hi, f in self.buckets)


DLRM_2022 = ReuseHistogram(
    "dlrm2022",
    ((0, 1, 0.342), (1, 2, 0.144), (2, 4, 0.149), (4, 8, 0.138), (8, 16, 0.112),
     (16, 32, 0.068), (32, 64, 0.029), (64, 128, 0.010), (128, 256, 0.004),
     (256, 512, 0.002), (512, 1024, 0.001), (1024, 2048, 0.001)),
)  # fmt: skip


def unique_rows(n_indices: int, hist: ReuseHistogram) -> int:
    """Unique rows of a batch of ``n_indices`` lookups under ``hist``."""
    return max(1, min(n_indices, round(n_indices / hist.mean_reuse())))


def _apportion(total: int, fractions: list[float]) -> list[int]:
    """Largest-remainder split of ``total`` by ``fractions``."""
    raw = [total * f for f in fractions]
    out = [math.floor(x) for x in raw]
    order = sorted(range(len(raw)), key=lambda i: raw[i] - out[i], reverse=True)
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out


def reuse_counts(n_indices: int, hist: ReuseHistogram) -> Any:
    """Lookups per unique row (int64 array, sum ``n_indices``) following ``hist``."""
    import numpy as np

    if n_indices < 1:
        raise ConfigError(f"an index batch needs at least one index, got {n_indices}")
    per_bucket = _apportion(unique_rows(n_indices, hist), [f for _, _, f in hist.buckets])
    parts, lows, highs = [], [], []
    for (lo, hi, _), rows in zip(hist.buckets, per_bucket, strict=True):
        if rows:
            # evenly over the integers lo+1..hi
            parts.append(
                lo + 1 + np.floor((hi - lo) * (np.arange(rows) + 0.5) / rows).astype(np.int64)
            )
            lows.append(np.full(rows, lo + 1))
            highs.append(np.full(rows, hi))
    counts, low, high = (np.concatenate(x) for x in (parts, lows, highs))
    _adjust(counts, low, high, n_indices - int(counts.sum()))
    return counts


def _adjust(counts: Any, low: Any, high: Any, diff: int) -> None:
    """Add (or remove) ``diff`` lookups in place, inside the buckets' bounds where possible."""
    import numpy as np

    if diff:
        slack = (high - counts) if diff > 0 else (counts - low)
        room = int(slack.sum())
        if room:
            step = np.floor(slack * min(1.0, abs(diff) / room)).astype(np.int64)
            rest = min(abs(diff), room) - int(step.sum())
            spare = np.flatnonzero(slack - step > 0)[:rest]  # one more where room remains
            step[spare] += 1
            counts += np.sign(diff) * step
            diff -= int(np.sign(diff) * step.sum())
    if diff:  # too few rows to stay inside the buckets (tiny batches): the busiest row absorbs it
        i = int(np.argmax(counts))
        counts[i] = max(1, counts[i] + diff)


def reuse_indices(n_indices: int, num_rows: int, hist: ReuseHistogram, *, seed: int = 0) -> Any:
    """A shuffled int64 index batch of ``n_indices`` lookups into ``num_rows`` rows under ``hist``."""
    import numpy as np

    counts = reuse_counts(n_indices, hist)
    if counts.size > num_rows:
        raise ConfigError(
            f"{n_indices} lookups under {hist.name!r} need {counts.size} unique rows; "
            f"the table has {num_rows}"
        )
    rng = np.random.default_rng(seed)
    rows = rng.choice(num_rows, size=counts.size, replace=False)
    out = np.repeat(rows, counts)
    rng.shuffle(out)
    return out


def measured_histogram(indices: Any, hist: ReuseHistogram) -> list[float]:
    """Fraction of unique rows of ``indices`` in each bucket of ``hist`` (to check a batch)."""
    import numpy as np

    _, counts = np.unique(np.asarray(indices), return_counts=True)
    return [float(np.mean((counts > lo) & (counts <= hi))) for lo, hi, _ in hist.buckets]


__all__ = [
    "DLRM_2022",
    "ReuseHistogram",
    "measured_histogram",
    "reuse_counts",
    "reuse_indices",
    "unique_rows",
]
