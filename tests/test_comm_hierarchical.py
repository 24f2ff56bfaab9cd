"""Hierarchical alpha-beta model: hand-computed costs on catalog systems; anchored moves."""

from __future__ import annotations

import numpy as np
import pytest

from trainsim.comm import (
    HierarchicalModel,
    HierParams,
    PiecewiseCurve,
    anchored_time,
    choose_anchor,
)
from trainsim.comm.samples import CaseKey
from trainsim.hardware import get_system
from trainsim.ir.kinds import CollectiveKind as C

DGX = HierarchicalModel(get_system("dgx-a100"))


def test_ring_all_reduce_inside_a_node():
    (ring,) = DGX.costs(C.ALL_REDUCE, 1, 8).values()
    assert ring.latency_s == pytest.approx(14 * 1.9e-6)  # 2(n-1) steps of the NVSwitch latency
    assert ring.per_byte_s == pytest.approx(1.75 / 300e9)  # 2(n-1)/n bytes per byte at 300 GB/s


def test_across_nodes_tree_for_small_ring_for_large():
    costs = DGX.costs(C.ALL_REDUCE, 4, 8)  # 32 GPUs
    ring, tree = costs["ring"], costs["tree"]
    assert ring.latency_s == pytest.approx((62 - 6) * 1.9e-6 + 6 * 8.5e-6)
    assert tree.latency_s == pytest.approx(2 * (7 * 1.9e-6 + 2 * 8.5e-6))
    assert ring.per_byte_s == pytest.approx(
        2 * 31 / 32 / 200e9
    )  # the NICs of a node (8 x 25 GB/s) bind
    small, large = DGX.time_s(C.ALL_REDUCE, [1024, 2**32], 4, 8)
    assert small == pytest.approx(tree.latency_s + 1024 * tree.per_byte_s)
    assert large == pytest.approx(ring.latency_s + 2**32 * ring.per_byte_s)


def test_mesh_nodes_share_links_among_peers():
    pm = HierarchicalModel(get_system("perlmutter"))  # 4 GPUs, 4 of 12 NVLinks to each peer
    assert pm.ring_bus_bw(1, 2) == pytest.approx(100e9)
    assert pm.ring_bus_bw(1, 4) == pytest.approx(300e9)
    assert pm.ring_bus_bw(2, 4) == pytest.approx(4 * 6.25e9)  # Slingshot: 4 x 50 Gb/s per node


def test_all_to_all_and_send():
    (a2a,) = DGX.costs(C.ALL_TO_ALLV, 2, 8).values()  # all_to_allv shares all_to_all's model
    assert a2a.per_byte_s == pytest.approx(max(7 / 16 / 300e9, 8 / 16 / 25e9))
    (p2p,) = DGX.costs(C.RECV, 2, 1).values()
    assert (p2p.latency_s, p2p.per_byte_s) == pytest.approx((8.5e-6, 1 / 25e9))


def test_efficiencies_and_fitted_latencies_apply():
    h = DGX.with_params(eff_cluster=0.5, latency_cluster_s=10e-6, fitted_on="x")
    assert h.ring_bus_bw(2, 8) == pytest.approx(100e9)
    assert h.provenance == "calibrated:x" and DGX.provenance == "spec-based:dgx-a100"
    assert h.costs(C.SEND, 2, 1)["direct"].latency_s == 10e-6


def test_unsupported_placements():
    assert not DGX.supports(
        C.ALL_REDUCE, 9, gpus_per_node=9
    )  # more GPUs per node than the system has
    assert not HierarchicalModel(get_system("vista")).supports(C.ALL_REDUCE, 2, gpus_per_node=2)
    assert DGX.supports(C.ALL_REDUCE, 12)  # packed: 2 nodes x 6


def test_anchor_rule_prefers_same_regime_then_nearest():
    keys = [CaseKey(C.ALL_REDUCE, 1, n) for n in (1, 2, 4, 8)] + [CaseKey(C.ALL_REDUCE, 2, 8)]
    assert choose_anchor(CaseKey(C.ALL_REDUCE, 16, 8), keys) == CaseKey(C.ALL_REDUCE, 2, 8)
    assert choose_anchor(CaseKey(C.ALL_REDUCE, 1, 6), keys) in (
        CaseKey(C.ALL_REDUCE, 1, 4),
        CaseKey(C.ALL_REDUCE, 1, 8),
    )
    assert choose_anchor(CaseKey(C.ALL_GATHER, 2, 8), keys) is None


@pytest.mark.parametrize("target", [(4, 8), (16, 8), (1, 4), (2, 4)])
def test_anchored_time_is_monotone_and_positive(target):
    curve = PiecewiseCurve.from_core(35e-6, 68e9, height=3.0, x0=17.7, k=0.36, b=7.9)
    anchor = CaseKey(C.ALL_REDUCE, 2, 8)
    m = np.sort(2.0 ** np.random.default_rng(0).uniform(0, 36, 400))
    t = anchored_time(
        DGX.with_params(eff_node=0.7, eff_cluster=0.62),
        anchor,
        curve,
        CaseKey(C.ALL_REDUCE, *target),
        m,
    )
    assert np.all(t > 0) and np.all(np.diff(t) >= 0)
    same = anchored_time(DGX, anchor, curve, anchor, m)
    assert np.allclose(same, curve(m))


def test_params_are_validated():
    with pytest.raises(Exception, match="efficiencies"):
        HierParams(eff_node=0.0)
