"""Context parallelism's attention buffers in the per-GPU memory (``builders/memory.py``):
TransformerEngine's ``AttnFuncWithCPAndKVP2P`` (the ring), ``AttnFuncWithCPAndKVAllGather``
and ``AttnFuncWithCPAndQKVOA2A`` (Ulysses), one layer's at a time (:func:`cp_transient_bytes`),
and the all-gather's saved per-step outputs (:func:`cp_kept_bytes`). Until 2026-12-04 none was
counted: every scheme had the cp 1 plan's buffers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainsim.builders.llm_comm import PlanComm
from trainsim.builders.memory import (
    CUBLAS_WORKSPACE_BYTES,
    CUDA_CONTEXT_BYTES,
    NCCL_COMM_BYTES,
    cp_attention_bytes,
    cp_transient_bytes,
    memory_per_gpu,
)
from trainsim.builders.models import get_model
from trainsim.builders.plan import Plan
from trainsim.builders.spec import ModelSpec
from trainsim.hardware import get_system

# a small GQA model: 8 query heads of 32, 4 KV heads
TINY = ModelSpec(name="tiny-gqa", hidden=256, layers=4, heads=8, kv_heads=4, vocab=1000, ffn_hidden=704,
                 activation="swiglu", norm="rmsnorm", position="rotary", bias=False, seq_len=1024)  # fmt: skip
# tp 2, pp 2, cp 2, micro-batch 2 (4 a pipeline), bf16: tok = 2 x 1024/2 = 1024 a GPU, 4 query heads, 2 KV heads:
# Q = O = 2·1024·4·32 = 262,144; K = V = 2·1024·2·32 = 131,072 (KV 262,144); L = 4·1024·4 = 16,384
BASE = Plan(tp=2, pp=2, cp=2, micro_batch=2, global_batch=8)  # 4 micro-batches
HAND = {
    # p2p: forward cp·(KV + O + L) = 2·(262,144 + 262,144 + 16,384); backward Q + 4·KV = 1,310,720
    "p2p": max(2 * (262_144 + 262_144 + 16_384), 262_144 + 4 * 262_144),
    # all_gather: forward cp·KV + cp·max(K, V) = 786,432; backward (3cp + ½)·KV + cp·max(K, V) + Q
    "all_gather": max(2 * 262_144 + 2 * 131_072, 6.5 * 262_144 + 2 * 131_072 + 262_144),
    # a2a: forward Q + KV + max(Q + KV + max(Q, K, V), 3·O) = 1,310,720; backward max(5·O, 2·O + 3·(Q + KV))
    "a2a": max(524_288 + max(524_288 + 262_144, 3 * 262_144), 5 * 262_144, 2 * 262_144 + 3 * 524_288),
}
# stage 0's other buffers: context + cuBLAS, NCCL for the tp, pp, dp·cp and cp groups, the
# pipeline's received and sent activation gradients 2·e·(s/cp)·b·h = 2·2·512·2·256
STAGE0_REST = CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES + 4 * NCCL_COMM_BYTES + 2 * 2 * 512 * 2 * 256


def test_the_hand_figures() -> None:
    t = cp_attention_bytes(TINY, BASE)
    assert (t.q_bytes, t.k_bytes, t.v_bytes, t.o_bytes, t.lse_bytes) == (262_144, 131_072, 131_072, 262_144, 16_384)
    assert HAND == {"p2p": 1_310_720, "all_gather": 2_228_224, "a2a": 2_097_152}


@pytest.mark.parametrize("cp_comm", ["p2p", "all_gather", "a2a"])
def test_each_scheme_adds_its_transient_once_to_a_middle_stage(cp_comm: str) -> None:
    plan = replace(BASE, cp_comm=cp_comm)
    assert cp_transient_bytes(TINY, plan) == HAND[cp_comm]
    assert memory_per_gpu(TINY, plan)[0].buffers_bytes == STAGE0_REST + HAND[cp_comm]
    # one layer's at a time: as many layers, or full recompute (the buffers come again in the
    # recomputation, still one layer's), change nothing
    for other in (replace(plan, recompute="full"), replace(plan, recompute="selective")):
        assert memory_per_gpu(TINY, other)[0].buffers_bytes == STAGE0_REST + HAND[cp_comm]
    deeper = replace(TINY, layers=12)
    assert memory_per_gpu(deeper, plan)[0].buffers_bytes == STAGE0_REST + HAND[cp_comm]


def test_cp_1_adds_nothing() -> None:
    """At cp 1 cp_comm changes nothing and no CP buffer is counted: the stage's buffers are the
    context, cuBLAS, NCCL (tp, pp) and pipeline ones, as before."""
    one = replace(BASE, cp=1)
    assert cp_transient_bytes(TINY, one) == 0.0
    ref = memory_per_gpu(TINY, one)
    assert ref[0].buffers_bytes == CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES + 2 * NCCL_COMM_BYTES + 2 * 2 * 1024 * 2 * 256
    for cp_comm in ("all_gather", "a2a"):
        assert memory_per_gpu(TINY, replace(one, cp_comm=cp_comm)) == ref


def test_the_last_stage_takes_the_larger_of_logits_and_cp_buffers() -> None:
    """The loss runs between the last layer's forward and backward: its 16-bit logits
    (e·(s/cp)·b·v/t = 2·512·2·1024/2, the vocabulary padded to 1,024) never sit beside an
    attention's buffers."""
    logits = 2 * 512 * 2 * 1024 / 2
    for cp_comm in ("p2p", "all_gather", "a2a"):
        plan = replace(BASE, cp_comm=cp_comm)
        last, first = memory_per_gpu(TINY, plan)[1], memory_per_gpu(TINY, plan)[0]
        assert last.buffers_bytes - first.buffers_bytes == max(logits, HAND[cp_comm]) - HAND[cp_comm]
    assert logits < min(HAND.values())  # so here the CP buffers count on both stages
    big_vocab = replace(TINY, vocab=64_000)
    last = memory_per_gpu(big_vocab, BASE)[1]
    assert last.buffers_bytes == STAGE0_REST + 2 * 512 * 2 * big_vocab.padded_vocab(2) / 2


def test_all_gather_keeps_its_per_step_outputs() -> None:
    """TE's KV all-gather saves out_per_step beside the output: O a layer kept; with full
    recompute the layers keep their inputs only, and the one layer re-run at a time saves it
    again (O once); the ring and a2a keep what cp 1 keeps."""
    p2p, ag, a2a = (memory_per_gpu(TINY, replace(BASE, cp_comm=c))[0] for c in ("p2p", "all_gather", "a2a"))
    in_flight = 2  # 1F1B, stage 0 of 2, two or more micro-batches
    assert ag.activations_bytes - p2p.activations_bytes == 2 * in_flight * 262_144  # 2 layers
    assert a2a.activations_bytes == p2p.activations_bytes
    full = [memory_per_gpu(TINY, replace(BASE, cp_comm=c, recompute="full"))[0].activations_bytes for c in ("p2p", "all_gather")]
    assert full[1] - full[0] == 262_144


@pytest.mark.parametrize("cp_comm", ["p2p", "all_gather", "a2a"])
def test_grows_with_micro_batch_and_sequence(cp_comm: str) -> None:
    plan = replace(BASE, cp_comm=cp_comm)
    sizes = [cp_transient_bytes(TINY, replace(plan, micro_batch=b)) for b in (1, 2, 4)]
    assert 0 < sizes[0] < sizes[1] < sizes[2]
    assert sizes[2] == 2 * sizes[1]  # linear in the tokens
    seqs = [cp_transient_bytes(replace(TINY, seq_len=s), plan) for s in (512, 1024, 4096)]
    assert 0 < seqs[0] < seqs[1] < seqs[2]
    # the whole stage too
    totals = [memory_per_gpu(TINY, replace(plan, micro_batch=b))[0].total_bytes for b in (1, 2, 4)]
    assert totals == sorted(totals) and len(set(totals)) == 3


def test_a_windowed_model_under_p2p_takes_the_larger_of_ring_and_all_gather() -> None:
    """TE's ring refuses a window: a windowed model's windowed layers run the KV all-gather
    (PlanComm.cp_window_layer), so under p2p it holds the larger of the two kinds' buffers."""
    win = replace(TINY, sliding_window=256)
    plan = replace(BASE, cp_comm="p2p")
    assert cp_transient_bytes(win, plan) == max(HAND["p2p"], HAND["all_gather"])
    assert cp_transient_bytes(win, replace(plan, attention="fused")) == HAND["p2p"]  # no window kernel


def test_mla_and_the_collectives_share_the_byte_counts() -> None:
    """MLA (DeepSeek-V2): q/k heads 192 wide, values 128; TE flattens K and V into one ring
    buffer (K + V, not 2K). PlanComm sizes the ring, the all-gathers and the all-to-alls from
    the same counts as the memory."""
    ds = get_model("deepseek-v2")
    plan = Plan(tp=8, cp=2, dp=8, ep=8, seq_len=16384, sp=True, recompute="full")
    t = cp_attention_bytes(ds, plan)
    tok, h = 16384 // 2, 128 // 8
    assert (t.q_bytes, t.k_bytes, t.v_bytes, t.o_bytes) == (2 * tok * h * 192, 2 * tok * h * 192, 2 * tok * h * 128,
                                                             2 * tok * h * 128)  # fmt: skip
    comm = PlanComm(ds, plan, get_system("dgx-h100"))
    ring = comm.cp_layer("fwd")
    assert ring is not None and ring.bytes == (plan.cp - 1) * 2 * tok * h * (192 + 128)
    ag = PlanComm(ds, replace(plan, cp_comm="all_gather"), comm.system)
    assert [c.bytes for c in ag._kv_all_gathers("fwd")] == [2 * t.k_bytes, 2 * t.v_bytes]
    a2a = PlanComm(ds, replace(plan, cp_comm="a2a"), comm.system)._a2a("fwd")
    assert [c.bytes for c in a2a] == [t.q_bytes, t.k_bytes, t.v_bytes, t.o_bytes]
    # the memory: the ring's forward holds every block, cp·(K + V + O + L)
    assert cp_transient_bytes(ds, plan) == max(2 * (t.kv_bytes + t.o_bytes + t.lse_bytes), t.q_bytes + 4 * t.kv_bytes)


def test_gqa_replicates_kv_heads_beyond_tp() -> None:
    """Megatron replicates the KV heads when tp exceeds them: ceil(n_kv / tp) per rank."""
    plan = replace(BASE, tp=8, cp=2, pp=1)
    t = cp_attention_bytes(TINY, plan)
    assert t.k_bytes == 2 * 1024 * 1 * 32 and t.q_bytes == 2 * 1024 * 1 * 32  # 1 query head, 1 KV head a rank
