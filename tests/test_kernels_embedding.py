"""Embedding-lookup heuristics: 002 §4.3.2.1 (L2 hit rate) and 000 §III-E (reuse factors)."""

from __future__ import annotations

import numpy as np
import pytest

from trainsim.hardware import get_device
from trainsim.kernels.embedding import L2_OVER_DRAM, EmbeddingLookupModel, rf_mean_accesses
from trainsim.kernels.model import query

V100 = get_device("v100")
ONCE = {f"rf_{i}": (1.0 if i == 0 else 0.0) for i in range(17)}
DLRM = dict(zip([f"rf_{i}" for i in range(17)],
                [0.342, 0.144, 0.149, 0.138, 0.112, 0.068, 0.029, 0.010, 0.004, 0.002, 0.001, 0.001, 0, 0, 0, 0, 0],
                strict=True))  # fmt: skip


def test_forward_traffic_matches_the_formulas_when_nothing_is_cached():
    m = EmbeddingLookupModel(V100)
    b, e, t, pool, d = 2048, 10**8, 8, 32, 64  # huge tables: p = 0
    q = query("embedding_bag", phase="fwd", dtype="fp32", B=b, E=e, T=t, L=pool, D=d)
    per_warp_dram = (
        np.ceil(4 * pool / 32) * 32 + np.ceil(4 * d / 32) * 32 + pool * np.ceil(4 * d / 32) * 32
    )
    per_warp_l2 = 32 + 64
    expect = (
        b
        * t
        * (
            per_warp_dram / V100.memory_bandwidth_Bps
            + per_warp_l2 / (L2_OVER_DRAM * V100.memory_bandwidth_Bps)
        )
    )
    assert m.predict(q).duration_s == pytest.approx(expect, rel=1e-9)
    assert m.predict(q).provenance == "spec-based:v100-sxm2-32gb"


def test_small_tables_hit_the_l2():
    m = EmbeddingLookupModel(V100)
    big = m.predict(
        query("embedding_bag", dtype="fp32", B=2048, E=10**8, T=8, L=32, D=64)
    ).duration_s
    small = m.predict(
        query("embedding_bag", dtype="fp32", B=2048, E=100, T=8, L=32, D=64)
    ).duration_s
    assert small < big / 1.5


def test_backward_reads_and_writes_the_rows():
    m = EmbeddingLookupModel(V100)
    kw = {"dtype": "fp32", "B": 2048, "E": 10**8, "T": 8, "L": 32, "D": 64}
    assert (
        m.predict(query("embedding_bag", phase="bwd", **kw)).duration_s
        > m.predict(query("embedding_bag", **kw)).duration_s
    )


def test_reuse_factors_mean_accesses():
    assert float(rf_mean_accesses(np.array(list(ONCE.values())))) == 1.0
    # the README's DLRM histogram: several accesses per distinct row on average
    assert 3.0 < float(rf_mean_accesses(np.array(list(DLRM.values())))) < 20.0


def test_reused_rows_are_faster_than_rows_read_once():
    m = EmbeddingLookupModel(V100, reuse_factors=True)
    kw = {"dtype": "fp32", "B": 2048, "E": 10**7, "T": 8, "L": 32, "D": 64}
    once = m.predict(query("embedding_bag", **kw, **ONCE)).duration_s
    reused = m.predict(query("embedding_bag", **kw, **DLRM)).duration_s
    assert reused < once
    assert not m.supports(query("embedding_bag", **kw))  # no reuse factors: the 002 model answers
