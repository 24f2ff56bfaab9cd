"""The TP collectives of the model's ends (PlanComm.tp_end): the vocabulary-parallel embedding's
output reduction, the output layer's input all-gather (SP) and gradient reduction, and the
vocabulary-parallel cross-entropy's three small all-reduces, on the first / last stage and on
each MTP depth's lookup and head. They had not been modelled."""

from __future__ import annotations

import pytest

from trainsim.builders.costs import HOST
from trainsim.builders.llm import stage_costs
from trainsim.builders.llm_comm import PlanComm
from trainsim.builders.models import get_model
from trainsim.builders.plan import Plan
from trainsim.hardware import get_system

H100 = get_system("dgx-h100")


def _kinds(comm: PlanComm, part: str, phase: str) -> list[str]:
    return [c.kind for c in comm.tp_end(part, phase)]


def test_the_ends_collectives_follow_megatron_with_and_without_sp():
    m = get_model("llama3-8b")
    plain, sp = PlanComm(m, Plan(tp=4, dp=2), H100), PlanComm(m, Plan(tp=4, dp=2, sp=True), H100)
    assert _kinds(plain, "embedding", "fwd") == ["all_reduce"] and _kinds(plain, "embedding", "bwd") == []
    assert _kinds(sp, "embedding", "fwd") == ["reduce_scatter"] and _kinds(sp, "embedding", "bwd") == ["all_gather"]
    assert _kinds(plain, "head", "fwd") == ["all_reduce"] * 3 and _kinds(plain, "head", "bwd") == ["all_reduce"]
    assert _kinds(sp, "head", "fwd") == ["all_gather"] + ["all_reduce"] * 3 and _kinds(sp, "head", "bwd") == ["reduce_scatter"]
    tokens = m.seq_len  # micro-batch 1
    (emb,) = plain.tp_end("embedding", "fwd")
    assert emb.bytes == tokens * m.hidden * 2  # the [b, s, d] bf16 output
    assert [c.bytes for c in plain.tp_end("head", "fwd")] == [tokens * 4] * 3  # fp32 [b, s]
    assert PlanComm(m, Plan(dp=8), H100).tp_end("embedding", "fwd") == []


def test_the_ends_collectives_add_to_the_end_stages_and_the_mtp_depth(monkeypatch: pytest.MonkeyPatch):
    """Without them (tp_end answering nothing), only the first stage's forward and the last
    stage's passes change, by about their GPU time in a GPU-bound plan; the last stage of a
    DeepSeek-V3 plan also pays its MTP depth's lookup and head."""
    m = get_model("deepseek-v3")
    plan = Plan(tp=2, pp=16, dp=32, ep=32, zero=1, recompute="full", global_batch=4096)
    comm = PlanComm(m, plan, H100)
    emb_f = sum(c.seconds for c in comm.tp_end("embedding", "fwd"))
    head_f = sum(c.seconds for c in comm.tp_end("head", "fwd"))
    head_b = sum(c.seconds for c in comm.tp_end("head", "bwd"))
    with_ends = stage_costs(m, plan, H100)
    monkeypatch.setattr(PlanComm, "tp_end", lambda self, part, phase: [])
    without = stage_costs(m, plan, H100)
    diffs = {w.stage: (w.fwd_s - o.fwd_s, w.bwd_s - o.bwd_s) for w, o in zip(with_ends, without, strict=True)}
    assert diffs[7] == (0.0, 0.0)  # a middle stage holds no end
    # at least their GPU time, at most that and their dispatch (the end ops are few and short:
    # the host's enqueue of a collective can show)
    ar = HOST.collective_s("all_reduce")
    assert emb_f <= diffs[0][0] + 1e-12 <= emb_f + ar + 1e-9 and diffs[0][1] == pytest.approx(0.0, abs=1e-12)
    # the last stage: the head's and the MTP depth's lookup and head (one depth)
    gpu_f, gpu_b = head_f + emb_f + head_f, 2 * head_b
    assert gpu_f <= diffs[15][0] + 1e-12 <= gpu_f + 7 * ar + 1e-9
    assert gpu_b <= diffs[15][1] + 1e-12 <= gpu_b + 2 * ar + 1e-9
    assert with_ends[15].tp_comm_fwd_s > without[15].tp_comm_fwd_s
