"""MoE expert GEMMs as each stack runs them (LayerCoster.expert_gemms): Megatron-core's
SequentialMLP (its default: per-expert GEMMs, a Python loop dispatching every expert's calls) and
``--moe-grouped-gemm`` (TransformerEngine's GroupedLinear: per-expert cuBLAS GEMMs over four
streams, no faster than one GEMM over every expert's rows; one activation over all the rows)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.test_cli_review import _run
from trainsim.builders.costs import HOST, TE_COMPUTE_STREAMS, LayerCoster, OpCoster
from trainsim.builders.models import get_model
from trainsim.builders.plan import Plan
from trainsim.builders.predict import predict_llm
from trainsim.errors import ConfigError, TrainsimError
from trainsim.validate.llm_cases import read_runs

QWEN = get_model("qwen3-30b-a3b")  # 128 experts of 768, top-8
H100 = "h100-sxm5-80gb"


def _mlp(plan: Plan, phase: str, model=QWEN, device: str = H100):
    lc = LayerCoster(model, plan, OpCoster(device))
    return {o.name: o for o in lc.mlp(phase)}, lc


def test_grouped_gemm_is_the_longer_of_one_stacked_gemm_and_four_streams_of_per_expert_gemms():
    plan = Plan(micro_batch=1, seq_len=4096)
    for ph in ("fwd", "bwd"):
        seq, _ = _mlp(plan, ph)
        grp, _ = _mlp(replace(plan, moe_grouped_gemm=True), ph)
        # the stacked GEMM: all 128 experts' 256 rows, as one GEMM of tokens x top_k rows
        stacked, _ = _mlp(replace(plan, seq_len=4096 * 8), ph, model=replace(QWEN, num_experts=1, top_k=1))
        for name in ("mlp_up", "mlp_down"):
            g, s = grp[name], seq[name]
            assert g.flops == s.flops  # the same work, timed another way
            assert g.seconds == pytest.approx(max(stacked[name].seconds, s.seconds / TE_COMPUTE_STREAMS))
            assert g.seconds < s.seconds / 2 and ";te-grouped-linear:" in g.provenance
            assert g.launches == s.launches  # one cuBLAS kernel per expert still
        # SequentialMLP: an activation per expert; TEGroupedMLP: one over every expert's rows
        assert seq["activation"].launches == 128 * (2 if ph == "bwd" else 1)
        assert grp["activation"].launches == (2 if ph == "bwd" else 1)


def test_sequential_experts_dispatch_a_python_loop_and_grouped_ones_a_cpp_loop():
    plan = Plan(micro_batch=1, seq_len=4096)
    _, seq = _mlp(plan, "fwd")
    _, grp = _mlp(replace(plan, moe_grouped_gemm=True), "fwd")
    fwd_one = 3 * (HOST.aten_gap_s + HOST.aten_launch_s) + 2 * (HOST.aten_gap_s + HOST.aten_view_s)
    bwd_one = 3 * HOST.autograd_node_s + 5 * HOST.aten_launch_s + 2 * HOST.aten_view_s
    assert seq.expert_gemms_host_s("fwd", HOST) == pytest.approx(127 * fwd_one)  # beyond the dense count's MLP
    assert seq.expert_gemms_host_s("bwd", HOST) == pytest.approx(127 * bwd_one)
    assert grp.expert_gemms_host_s("fwd", HOST) == pytest.approx(127 * 2 * HOST.aten_launch_s)
    assert grp.expert_gemms_host_s("bwd", HOST) == pytest.approx(127 * 4 * HOST.aten_launch_s)
    # one local expert (ep = experts) is the dense count's MLP: nothing beyond it; dense models none
    _, one = _mlp(replace(plan, ep=128, dp=128), "fwd")
    assert one.expert_gemms_host_s("fwd", HOST) == 0.0
    _, dense = _mlp(Plan(micro_batch=1), "fwd", model=get_model("llama3-8b"))
    assert dense.expert_gemms_host_s("bwd", HOST) == 0.0


def test_a_host_bound_expert_loop_sets_the_pace():
    """128 local experts at micro-batch 1: SequentialMLP's dispatch (about 8 ms a layer forward)
    outlasts the GPU's work, so the forward is at least the layers' dispatch; the grouped GEMM
    is faster, and both are slower than their GPU work alone would be."""
    plan = Plan(micro_batch=1, seq_len=4096, zero=1, recompute="full")
    seq = predict_llm(QWEN, plan, "dgx-h100", simulate=False)
    grp = predict_llm(QWEN, replace(plan, moe_grouped_gemm=True), "dgx-h100", simulate=False)
    _, lc = _mlp(plan, "fwd")
    fwd_host = QWEN.layers * (HOST.layer_s("fwd") + lc.expert_gemms_host_s("fwd", HOST))
    assert seq.stages[0].fwd_s >= fwd_host
    assert grp.iteration_time_s < seq.iteration_time_s
    assert grp.plan.label().endswith("-ggemm") and "ggemm" not in seq.plan.label()
    assert any("SequentialMLP" in w and "--moe-grouped-gemm" in w for w in seq.warnings)
    assert any("GroupedLinear" in w and "4 compute streams" in w for w in grp.warnings)


def test_moe_grouped_gemm_needs_an_moe_model_and_a_megatron_style_impl():
    with pytest.raises(ConfigError, match=r"moe_grouped_gemm .* needs a mixture-of-experts model .*; llama3-8b is dense"):
        Plan(moe_grouped_gemm=True).validate(get_model("llama3-8b"))
    with pytest.raises(ConfigError, match=r"impl 'hf' runs transformers' experts: --hf-experts picks them"):
        Plan(moe_grouped_gemm=True, impl="hf").validate(QWEN)
    with pytest.raises(ConfigError, match=r"moe_grouped_gemm must be true or false, got 'yes'"):
        Plan(moe_grouped_gemm="yes").validate(QWEN)  # type: ignore[arg-type]


def test_cli_moe_grouped_gemm_in_predict_and_search():
    res = _run("predict", "qwen3-30b-a3b", "--system", "dgx-h100", "--gpus", "8", "--ep", "8", "--zero", "1",
               "--recompute", "full", "--moe-grouped-gemm", "--closed-form", "--format", "json")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert '"ggemm"' in res.output or "-ggemm" in res.output
    res = _run("predict", "llama3-8b", "--system", "dgx-h100", "--moe-grouped-gemm")
    assert res.exit_code == 1 and isinstance(res.exception, TrainsimError)
    assert "llama3-8b is dense" in str(res.exception)
    res = _run("search", "llama3-8b", "--system", "dgx-h100", "--gpus", "8", "--global-batch", "64", "--moe-grouped-gemm")
    assert res.exit_code == 1 and "llama3-8b is dense" in str(res.exception)
    res = _run("search", "qwen3-30b-a3b", "--system", "dgx-h100", "--gpus", "8", "--global-batch", "64",
               "--moe-grouped-gemm", "--framework", "deepspeed")  # fmt: skip
    assert res.exit_code == 2 and "not deepspeed's" in res.stderr  # options that do not go together: a usage error
    res = _run("search", "qwen3-30b-a3b", "--system", "dgx-h100", "--gpus", "8", "--global-batch", "64",
               "--moe-grouped-gemm", "--tp", "1", "--pp", "1", "--micro-batch", "1", "--recompute", "full",
               "--top-k", "2", "--simulate-top", "2", "--format", "json")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "-ggemm" in res.output


def test_runs_csv_takes_moe_grouped_gemm(tmp_path):
    f = tmp_path / "runs.csv"
    f.write_text("model,system,iteration_ms,tp,pp,dp,ep,zero,recompute,moe_grouped_gemm\n"
                 "qwen3-30b-a3b,dgx-h100,1000,1,1,8,8,1,full,true\n")  # fmt: skip
    (case,) = read_runs(f)
    assert case.plan.moe_grouped_gemm is True


def test_search_api_refuses_grouped_gemm_for_a_dense_model():
    """Through the API (not the CLI) a dense model's space had yielded no plan, each refused."""
    from trainsim.hardware import get_system
    from trainsim.search.llm import search_llm
    from trainsim.search.space import PlanSpace

    with pytest.raises(ConfigError, match=r"--moe-grouped-gemm .* llama3-8b is dense"):
        search_llm(get_model("llama3-8b"), get_system("dgx-h100"), PlanSpace(gpus=8, global_batch=64, moe_grouped_gemm=True))


def test_search_notes_say_how_the_experts_run():
    from trainsim.search.llm import search_notes
    from trainsim.search.space import PlanSpace

    seq = " ".join(search_notes(QWEN, PlanSpace(gpus=8, global_batch=64)))
    assert "SequentialMLP" in seq and "--moe-grouped-gemm ranks" in seq
    grp = " ".join(search_notes(QWEN, PlanSpace(gpus=8, global_batch=64, moe_grouped_gemm=True)))
    assert "GroupedLinear" in grp and "SequentialMLP" not in grp
    assert "SequentialMLP" not in " ".join(search_notes(get_model("llama3-8b"), PlanSpace(gpus=8, global_batch=64)))
