"""Relations scripts/metamorphic_dlrm.py found broken in the DLRM step's GPU embedding model
(kernels/embedding.py, 002 §4.3.2.1 and 000 §III-E) on 2026-12-04."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainsim.builders.dlrm import DLRMSpec, TableSpec, predict_dlrm_step
from trainsim.hardware import get_device
from trainsim.kernels.embedding import EmbeddingLookupModel, _log_comb_ratio
from trainsim.kernels.model import query
from trainsim.search.sharders import select_sharder

A100, H100 = get_device("a100-sxm4-80gb"), get_device("h100-sxm5-80gb")


def _t(m: EmbeddingLookupModel, phase: str = "fwd", dtype: str = "fp32", **x: float) -> float:
    return m.predict(query("embedding_bag", phase=phase, dtype=dtype, **x)).duration_s  # type: ignore[arg-type]


def _hit(m: EmbeddingLookupModel, eb: int = 4, **x: float) -> float:
    return float(np.ravel(m._hit_rate({k: np.asarray([v]) for k, v in x.items()}, eb, {}))[0])


# 002's num_tables = rows_per_block x SMs / B fell below 1 beyond 3,456 samples on an A100
# (4,224 on an H100): one table was given more rows of cache than the L2 holds (2.4x at B 8192
# on an A100), and a larger batch came out faster.
@pytest.mark.parametrize("phase", ["fwd", "bwd"])
def test_a_larger_batch_is_never_faster_once_one_table_has_the_l2(phase: str) -> None:
    m = EmbeddingLookupModel(H100)
    # the sweep's case: twice the batch came out 18 % faster
    x = {"E": 284372.0, "T": 1.0, "L": 102.192, "D": 128.0}
    t1, t2 = _t(m, phase, B=8192.0, **x), _t(m, phase, B=16384.0, **x)
    assert t2 >= t1
    # past rows_per_block x SMs the hit rate no longer depends on B: the time is linear in it
    assert t2 == pytest.approx(2 * t1, rel=1e-12)


def test_the_l2_model_caches_no_more_rows_than_the_l2_holds() -> None:
    m = EmbeddingLookupModel(A100)
    e, pool, d = 175855.0, 3.0, 128.0  # 90 MB: more than twice the 40 MB L2
    fit = math.floor(A100.l2_cache_bytes / (d * 4))  # type: ignore[operator]
    most = float(np.exp(_log_comb_ratio(np.asarray([fit]), np.asarray([e]), np.asarray([pool])))[0])
    for b in (4096.0, 8192.0, 65536.0):
        assert _hit(m, B=b, E=e, T=1.0, L=pool, D=d) <= most * (1 + 1e-12)
    # was 1: the whole 90 MB table "cached"
    assert _hit(m, B=65536.0, E=e, T=1.0, L=pool, D=d) < 0.1


# The backward rounded the bag's whole read+write traffic up to 32 bytes, ceil(2 eb L D / 32) * 32;
# with a fractional mean L that total stood still while the reuse model's L2 hits grew, so a
# longer bag took less time (bwd, B 65536, E 5159, L 0.526 -> 0.579: -0.43 %).
def test_a_longer_bag_is_never_faster_in_the_backward() -> None:
    m = EmbeddingLookupModel(A100, reuse_factors=True)
    rf = {f"rf_{i}": (0.5 if i < 2 else 0.0) for i in range(17)}
    for pool in (0.526, 1.053, 2.5, 7.3):
        x = {"B": 65536.0, "E": 5159.0, "T": 1.0, "D": 16.0, **rf}
        assert _t(m, "bwd", L=pool * 1.1, **x) >= _t(m, "bwd", L=pool, **x)
    # a whole bag of rows whose bytes are a multiple of 32: the thesis' bytes exactly
    m2 = EmbeddingLookupModel(A100)
    kw = {"B": 2048.0, "E": 1e8, "T": 8.0, "D": 64.0}
    per_warp_dram = 4 * 32 + 4 * 64 + 2 * 4 * 32 * 64  # indices, outputs, weights 2 eb L D (p ~ 0)
    expect = 2048 * 8 * (per_warp_dram / A100.memory_bandwidth_Bps + 96 / m2.l2_bw)
    assert _t(m2, "bwd", L=32.0, **kw) == pytest.approx(expect, rel=1e-9)


# A table with fewer rows than its bags' L (bags repeat rows) crashed 002's hit rate:
# lgamma(E - L + 1) of a non-positive integer is a math domain error; `trainsim shard` on any
# catalog GPU exited with a ValueError traceback.
def test_a_table_smaller_than_its_bag_is_wholly_cached() -> None:
    m = EmbeddingLookupModel(A100)
    for e, pool in ((1.0, 2.0), (2.0, 3.0), (5.0, 30.0), (30.0, 30.0)):
        assert _hit(m, B=4096.0, E=e, T=1.0, L=pool, D=64.0) == 1.0
    spec = DLRMSpec(
        (TableSpec("tiny", 2, 64, 3.0), TableSpec("big", 100_000, 64, 20.0)), batch=4096
    )
    assert predict_dlrm_step(spec, [0, 1], 2, device="a100-sxm4-80gb") > 0
    assert all(r["predicted_step_s"] for r in select_sharder(spec, 2, device="h100-sxm5-80gb"))


def test_fewer_cached_rows_than_a_bag_hit_never() -> None:
    # C(cached, L) = 0 when cached < L < E: no bag of L distinct rows is all in the L2. The old
    # clamp cached = max(cached, L) made it 1 / C(E, L) instead, which is 1 at E = L.
    assert _log_comb_ratio(np.asarray([10.0]), np.asarray([30.0]), np.asarray([30.0]))[0] == -np.inf
    assert _log_comb_ratio(np.asarray([10.0]), np.asarray([40.0]), np.asarray([20.0]))[0] == -np.inf
    assert _log_comb_ratio(np.asarray([40.0]), np.asarray([40.0]), np.asarray([50.0]))[0] == 0.0
    got = _log_comb_ratio(np.asarray([100.0]), np.asarray([1000.0]), np.asarray([3.0]))[0]
    assert got == pytest.approx(math.log(100 * 99 * 98 / (1000 * 999 * 998)), rel=1e-12)
