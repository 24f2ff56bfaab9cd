"""Sliding-window attention under context parallelism (cp > 1).

TransformerEngine's p2p ring (Megatron's default ``--cp-comm-type``) refuses a window, so the
windowed layers are costed as its KV all-gather CP: the load-balanced ``2·cp`` chunks, each
rank's two query chunks attending within the window over the gathered K/V, the all-gathers
(and the backward's reduce-scatters) exposed; full layers keep the ring. Until 2026-12-04 a
windowed model under CP was priced as full causal attention.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from trainsim.builders.costs import LayerCoster, OpCoster
from trainsim.builders.llm import stage_costs
from trainsim.builders.llm_comm import PlanComm
from trainsim.builders.models import get_model
from trainsim.builders.plan import Plan
from trainsim.builders.predict import predict_llm
from trainsim.hardware import get_device, get_system

SEQ = 32768
SYSTEM = "dgx-h100"


def _plan(cp: int, **kw) -> Plan:
    return Plan(tp=1, cp=cp, dp=1, micro_batch=1, global_batch=1, seq_len=SEQ, attention="flash", **kw)


def _windowed(name: str, window: int):
    m = get_model(name)
    return replace(m, sliding_window=window, sliding_layers=m.sliding_layers if window else 0)


def _attention_s(model, plan: Plan) -> float:
    """One stage's attention operators, forward and backward, one micro-batch."""
    (st,) = stage_costs(model, plan, get_system(SYSTEM))
    return sum(o.seconds for o in st.layer_ops if o.category == "attention") * st.layers


@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("window", [64, 1000, 4096, 16384, 30000])
def test_ranks_together_do_the_unsplit_windowed_work(cp: int, window: int) -> None:
    """The ranks' shares average to the unsplit layer's 2w − w² (the window's work is only
    redistributed); cp 1 is the unsplit share; each share matches a token count of the rank's
    two chunks (r and 2cp − 1 − r), each query attending to min(p, W) keys."""
    m = _windowed("mistral-7b", window)
    seq = 24576 if window < 24576 else 49152  # 2·cp chunks of whole tokens
    shares = m.cp_window_rank_shares(seq, cp)
    assert len(shares) == cp
    assert sum(shares) / cp == pytest.approx(m.window_layer_share(seq), rel=1e-12)
    assert m.cp_window_rank_shares(seq, 1) == pytest.approx((m.window_layer_share(seq),), rel=1e-12)
    assert m.cp_window_work_fraction(seq, 1) == m.window_work_fraction(seq)
    # brute force at the token: query p (midpoint p + ½) meets min(p + ½, W) keys
    p = np.arange(seq) + 0.5
    keys = np.minimum(p, window)
    chunk = seq // (2 * cp)
    for r, share in enumerate(shares):
        mine = np.r_[r * chunk:(r + 1) * chunk, (2 * cp - 1 - r) * chunk:(2 * cp - r) * chunk]
        assert keys[mine].sum() / (seq * seq / (2 * cp)) == pytest.approx(share, rel=1e-9)


def test_shares_are_one_within_the_window_and_grow_with_it() -> None:
    """A window covering the sequence leaves every rank its causal share; a larger window never
    less work on any rank; the busiest rank is past the first chunk's short history."""
    for cp in (2, 4, 8):
        assert _windowed("mistral-7b", SEQ).cp_window_rank_shares(SEQ, cp) == (1.0,) * cp
        assert get_model("llama2-7b").cp_window_rank_shares(SEQ, cp) == (1.0,) * cp
        prev = (0.0,) * cp
        for w in (128, 1024, 4096, 8192, 16384, 24576, SEQ - 1):
            now = _windowed("mistral-7b", w).cp_window_rank_shares(SEQ, cp)
            assert all(b >= a - 1e-15 for a, b in zip(prev, now, strict=True)) and max(now) <= 1.0 + 1e-12
            prev = now
        small = _windowed("mistral-7b", 1024).cp_window_rank_shares(SEQ, cp)
        assert small[0] == min(small) < max(small) == pytest.approx(2 * 1024 / SEQ)  # 2LW over seq²/2cp


def test_a_window_covering_the_sequence_is_full_attention_under_cp() -> None:
    """window ≥ seq: the same prediction as no window at all (the ring, full causal work)."""
    for cp in (2, 4):
        a = predict_llm(_windowed("mistral-7b", SEQ), _plan(cp), SYSTEM, simulate=False)
        b = predict_llm(_windowed("mistral-7b", 0), _plan(cp), SYSTEM, simulate=False)
        assert a.iteration_time_s == b.iteration_time_s and a.breakdown == b.breakdown
        assert PlanComm(_windowed("mistral-7b", SEQ), _plan(cp), get_system(SYSTEM)).cp_window_layer("fwd") is None


@pytest.mark.parametrize("name,window", [("mistral-7b", 4096), ("gemma3-12b", 1024)])
def test_a_small_window_under_cp_costs_less_than_full_attention(name: str, window: int) -> None:
    """With cp 2/4/8 the windowed model's attention and iteration are below the full model's
    (they had been equal: priced as full causal attention); the attention core is the full
    one's times the busiest-rank work fraction."""
    m, full = _windowed(name, window), _windowed(name, 0)
    coster = OpCoster(get_device("h100-sxm5-80gb"))
    for cp in (2, 4, 8):
        plan = _plan(cp)
        assert _attention_s(m, plan) < 0.5 * _attention_s(full, plan)
        a = predict_llm(m, plan, SYSTEM, simulate=False).iteration_time_s
        assert a < predict_llm(full, plan, SYSTEM, simulate=False).iteration_time_s
        (win_op,) = [o for o in LayerCoster(m, plan, coster).attention_core("fwd") if o.category == "attention"]
        (full_op,) = [o for o in LayerCoster(full, plan, coster).attention_core("fwd") if o.category == "attention"]
        assert win_op.seconds == pytest.approx(full_op.seconds * m.cp_window_work_fraction(SEQ, cp))
        assert win_op.flops == pytest.approx(full_op.flops * m.cp_window_work_fraction(SEQ, cp))


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_more_window_never_less_time(cp: int) -> None:
    """Within the sequence, a larger window never predicts a faster iteration (more work, the
    same all-gathers)."""
    times = [predict_llm(_windowed("gemma3-12b", w), _plan(cp), SYSTEM, simulate=False).iteration_time_s
             for w in (128, 512, 1024, 4096, 8192, 16384, 24576, SEQ - 1)]  # fmt: skip
    assert times == sorted(times)


def test_the_all_gather_collectives_are_exposed_and_listed() -> None:
    """Windowed layers all-gather K and V (forward; again with dK/dV's reduce-scatters in the
    backward), exposed: a Mistral layer (every layer windowed) lists no ring; Gemma 3 (40 of 48
    windowed) lists both; the breakdown's CP share counts the all-gathers."""
    system = get_system(SYSTEM)
    plan = _plan(4)
    (st,) = stage_costs(get_model("mistral-7b"), plan, system)
    names = [c.name for c in st.comm]
    assert names.count("cp_kv_all_gather") == 4 and names.count("cp_dkv_reduce_scatter") == 2
    assert "cp_ring" not in names
    cw = PlanComm(get_model("mistral-7b"), plan, system).cp_window_layer("bwd")
    assert cw is not None and cw.layers == 1.0 and cw.exposed_s > 0
    # every layer windowed: the all-gathers add in full, per layer and pass
    assert st.cp_comm_s[1] == pytest.approx(st.layers * cw.exposed_s, rel=1e-6)
    (sg,) = stage_costs(get_model("gemma3-12b"), plan, system)
    assert {"cp_ring", "cp_kv_all_gather", "cp_dkv_reduce_scatter"} <= {c.name for c in sg.comm}
    # unfused/fused attention: no windowed kernel, the ring for every layer as before
    assert PlanComm(get_model("mistral-7b"), replace(plan, attention="fused"), system).cp_window_layer("fwd") is None


def test_the_note_says_the_ring_refuses_a_window() -> None:
    plan = _plan(4)
    r = predict_llm(get_model("gemma3-12b"), plan, SYSTEM, simulate=False)
    (note,) = [w for w in r.warnings if "sliding window" in w]
    assert "p2p ring (Megatron's default --cp-comm-type) refuses a window" in note
    assert "--cp-comm-type allgather" in note and "the full layers keep the p2p ring" in note
    assert "6.2% of a causal layer's work on the busiest rank" in note
    m = predict_llm(get_model("mistral-7b"), plan, SYSTEM, simulate=False)
    (note_m,) = [w for w in m.warnings if "sliding window" in w]
    assert "25% of a causal layer's work on the busiest rank (23% averaged" in note_m
    assert "full layers" not in note_m
    fused = predict_llm(get_model("mistral-7b"), replace(plan, attention="fused"), SYSTEM, simulate=False)
    (note_f,) = [w for w in fused.warnings if "sliding window" in w]
    assert "saves nothing with --attention fused" in note_f
