"""Index batches with a reuse-factor histogram (000 §III-E): the DLRM locality is reproduced."""

from __future__ import annotations

import numpy as np
import pytest

from trainsim.bench.reuse import (
    DLRM_2022,
    ReuseHistogram,
    measured_histogram,
    reuse_counts,
    reuse_indices,
    unique_rows,
)
from trainsim.errors import ConfigError


@pytest.mark.parametrize("n", [1, 17, 1000, 50_000, 1_000_000])
def test_counts_sum_to_the_batch(n):
    c = reuse_counts(n, DLRM_2022)
    assert int(c.sum()) == n and c.min() >= 1 and c.size == unique_rows(n, DLRM_2022)


def test_large_batches_match_the_published_histogram():
    idx = reuse_indices(200_000, 10**7, DLRM_2022, seed=3)
    got = measured_histogram(idx, DLRM_2022)
    want = [f for _, _, f in DLRM_2022.buckets]
    assert np.allclose(got, want, atol=2e-3)
    assert idx.min() >= 0 and idx.max() < 10**7 and idx.size == 200_000
    assert 11 < idx.size / np.unique(idx).size < 12  # ≈ mean_reuse()


def test_batches_are_reproducible_and_shuffled():
    a = reuse_indices(5000, 10**6, DLRM_2022, seed=1)
    assert np.array_equal(a, reuse_indices(5000, 10**6, DLRM_2022, seed=1))
    assert not np.array_equal(a, np.sort(a))


def test_custom_histograms_and_errors():
    flat = ReuseHistogram("twice", ((1, 2, 1.0),))
    c = reuse_counts(1000, flat)
    assert (c == 2).all() and c.size == 500
    with pytest.raises(ConfigError, match="sum to"):
        ReuseHistogram("bad", ((0, 1, 0.5),))
    with pytest.raises(ConfigError, match="unique rows"):
        reuse_indices(100_000, 100, DLRM_2022)
