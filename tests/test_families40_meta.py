"""Relations scripts/metamorphic_families40.py found broken under the fused path (2026-12-04).

The selective recomputation re-runs the attention core alone; its dispatch was the core's share
of the layer's forward dispatch spread over the layer's operators, so a layer with fewer other
operators (Phi's and Cohere's parallel block on one norm, a layer without a rotary) recomputed
its core more slowly when CPU-bound, and the parallel block came out slower in the backward
than the same model sequential with one more norm."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainsim.builders.costs import HOST, LayerCoster, OpCoster
from trainsim.builders.llm import TRACED_LAYER_OPS, UNCOUNTED_DISPATCH, stage_costs
from trainsim.builders.models import get_model
from trainsim.builders.plan import Plan
from trainsim.builders.spec import ModelSpec
from trainsim.hardware import get_device, get_system

SYS = get_system("dgx-h100")
# phi-1.5 (PhiConfig's sizes): parallel block on one LayerNorm, biases, output bias, partial rotary
PHI15 = ModelSpec("phi-1.5", hidden=2048, layers=24, heads=32, vocab=51200, ffn_hidden=8192, position="rotary",
                  parallel_residual=True, layer_norms=1, head_bias=True, tied_embeddings=True, rope_fraction=0.5)  # fmt: skip
# a CPU-bound backward: small layers split four ways
CPU_BOUND = Plan(tp=4, dp=2, micro_batch=1, global_batch=2, recompute="selective", seq_len=2048)


def _stage(model: ModelSpec, plan: Plan):  # type: ignore[no-untyped-def]
    (st,) = stage_costs(model, plan, SYS)
    return st


@pytest.mark.parametrize("sp", [False, True])
def test_parallel_block_never_slower_than_sequential_under_selective_recompute(sp):
    plan = replace(CPU_BOUND, sp=sp)
    par, seq = _stage(PHI15, plan), _stage(replace(PHI15, parallel_residual=False, layer_norms=2), plan)
    # the same attention core re-run: the same recomputation (was 1.481 ms against 1.348 ms)
    assert par.recompute_s == pytest.approx(seq.recompute_s, rel=1e-12)
    assert par.bwd_s <= seq.bwd_s * (1 + 1e-12)
    assert par.fwd_s <= seq.fwd_s


def test_selective_recompute_does_not_depend_on_the_layers_other_operators():
    base = replace(PHI15, parallel_residual=False, layer_norms=2)
    ref = _stage(base, CPU_BOUND).recompute_s
    for other in (replace(base, layer_norms=4), replace(base, position="learned"), replace(base, qk_norm="head")):
        assert _stage(other, CPU_BOUND).recompute_s == pytest.approx(ref, rel=1e-12), other


def test_traced_layer_ops_is_the_gpt_layers_operator_count():
    """The share the recomputation takes is one operator's of the GPT-2 layer HostModel was
    counted on: the builder's GPT layer (FlashAttention) has that many dispatched operators, so
    GPT models' selective recomputation is priced as before."""
    m = get_model("gpt3-1.3b")
    lc = LayerCoster(m, Plan(tp=2), OpCoster(get_device(SYS.device)))
    counted = [o for o in lc.layer("fwd") if o.name not in UNCOUNTED_DISPATCH]
    assert len(counted) == TRACED_LAYER_OPS
    plan = Plan(tp=8, dp=1, global_batch=1, recompute="selective", seq_len=512)
    st = _stage(m, plan)
    share = HOST.layer_s("fwd") / TRACED_LAYER_OPS
    assert st.recompute_s >= m.layers * share * (1 - 1e-12)  # at least the core's dispatch a layer


def test_overlapped_reduction_buckets_an_exact_multiple_to_rounding():
    """phi-1.5 tied at tp 8: the embedding shard's gradients are 51,200 x 2,048 / 8 fp32 values,
    50 MiB, two DDP buckets; taken as the reduction's bytes times the embedding's share, they came
    out above two buckets with the output bias (three buckets) and at two without, so adding the
    bias's parameters left 17 us less of the reduction exposed (1.4286 ms against 1.4456 ms)."""
    plan = Plan(tp=8, dp=2, sp=True, micro_batch=2, global_batch=16, recompute="full", overlap_grad_reduce=True,
                seq_len=2048, contention=False)  # fmt: skip
    on, off = _stage(PHI15, plan), _stage(replace(PHI15, head_bias=False), plan)
    assert PHI15.padded_vocab(8) * PHI15.hidden / 8 * 4 == 2 * 25 * 2**20
    # the tail is the embedding's buckets, ready last: the same with and without the bias (to rounding)
    assert on.dp_comm_s == pytest.approx(off.dp_comm_s, rel=1e-12)
    assert on.dp_comm_s + on.bwd_s >= off.dp_comm_s + off.bwd_s
