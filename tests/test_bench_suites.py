"""Kernel suites: deterministic shape sampling, kernel-model operators, one tiny run per op."""

from __future__ import annotations

from collections import defaultdict

import pytest

from trainsim.bench.opspecs import BENCH_OPS, register_bench_ops
from trainsim.bench.runner import CpuTimer, Schedule, measure, run_sweep
from trainsim.bench.suites import SUITES, SweepSpec, get_suite, suite_cases
from trainsim.bench.suites.base import LogRange, draw_params
from trainsim.errors import ConfigError
from trainsim.kernels.features import Phase as ModelPhase
from trainsim.kernels.features import as_inputs, op_spec

QUICK = SweepSpec(device="cpu", quick=True)
FAST = Schedule(warmup=1, min_warmup_s=0.0, repeats=1, max_repeats=1, min_repeat_s=0.0, max_inner=1)
EXPECTED_OPS = {
    "mm", "addmm", "bmm", "linear", "sdpa", "layer_norm", "rms_norm", "batch_norm", "softmax",
    "cross_entropy", "gelu", "relu", "tanh", "add", "mul", "dropout", "embedding_bag", "copy",
    "concat", "transpose", "tril", "index_select", "conv2d", "adam", "sgd", "peak_mm",
    "stream_copy", "stream_triad", "stream_read",
}  # fmt: skip


@pytest.fixture(scope="module")
def quick_cases():
    return list(suite_cases(list(SUITES), QUICK))


def test_every_requested_op_is_swept_with_unique_keys(quick_cases):
    from trainsim.bench.suites.embedding import tbe_available

    assert {c.op for c in quick_cases} == EXPECTED_OPS | ({"embedding_tbe"} if tbe_available() else set())
    keys = [c.key for c in quick_cases]
    assert len(keys) == len(set(keys))
    assert [c.key for c in suite_cases(list(SUITES), QUICK)] == keys  # deterministic


def test_quick_is_a_prefix_of_full_per_op_phase_dtype():
    full = defaultdict(list)
    for c in get_suite("gemm").cases(SweepSpec(quick=False)):
        full[(c.op, c.phase, c.dtype)].append(c.key)
    quick = defaultdict(list)
    for c in get_suite("gemm").cases(QUICK):
        quick[(c.op, c.phase, c.dtype)].append(c.key)
    for k, keys in quick.items():
        assert full[k][: len(keys)] == keys and len(full[k]) > len(keys)


def test_cases_stay_within_the_device_budget(quick_cases):
    for c in quick_cases:
        assert c.flops >= 0 and c.bytes > 0
        # the sizing estimate (before an op's known slowdown) stays within a few budgets
        assert QUICK.estimate_s(c.flops, c.bytes) <= 8 * QUICK.max_case_s, c.key


def test_rows_calibrate_registered_kernel_model_operators(quick_cases, bench_ops):
    for c in quick_cases:
        spec = op_spec(c.model_op)
        features = dict(c.features)
        assert set(features) <= set(spec.inputs), c.key
        as_inputs(spec, features)  # every input present (or defaulted) and positive
        assert spec.family_for(ModelPhase(c.phase.value)) is c.family, c.key


def test_bench_ops_do_not_shadow_the_kernel_table(bench_ops):
    register_bench_ops()  # idempotent
    for spec in BENCH_OPS:
        assert op_spec(spec.name).inputs == spec.inputs


def test_one_tiny_case_per_op_and_phase_runs_on_cpu(quick_cases):
    import torch

    smallest = {}
    for c in quick_cases:
        k = (c.op, c.phase)
        if k not in smallest or QUICK.estimate_s(c.flops, c.bytes) < QUICK.estimate_s(
            smallest[k].flops, smallest[k].bytes
        ):
            smallest[k] = c
    for c in smallest.values():
        t = measure(c, device=torch.device("cpu"), schedule=FAST, timer=CpuTimer())
        assert t.median_s > 0, c.key


def test_sweep_rows_are_read_by_trainsim_fit(tmp_path, bench_ops):
    from trainsim.kernels.readers import read_kernel_dataset

    cases = list(suite_cases(["index", "optimizer"], QUICK))[::10]
    path = tmp_path / "k.jsonl"
    run_sweep(path, cases, schedule=FAST, progress=False)
    ds = read_kernel_dataset([path])
    assert len(ds) == len(cases)
    assert {s.key.op for s in ds} == {"tril", "index_select", "adam", "sgd"}
    assert all(s.statistic == "median" for s in ds)


def test_sampling_and_registry_edges():
    draws = draw_params(seed="x", n=50, dims={"n": LogRange(8, 4096)}, accept=lambda p: True)
    assert all(8 <= p["n"] <= 4096 for p in draws)
    assert all(p["n"] % 8 == 0 for p in draws)
    assert draws == draw_params(
        seed="x", n=50, dims={"n": LogRange(8, 4096)}, accept=lambda p: True
    )
    with pytest.raises(ConfigError, match="available"):
        get_suite("nope")


def test_density_extends_the_full_sweep_without_changing_its_draws() -> None:
    """--density N draws N times the shapes; the default draws are a prefix (resumed rows kept)."""
    from trainsim.bench.suites import suite_cases
    from trainsim.bench.suites.base import SweepSpec

    one = [c.key for c in suite_cases(["gemm"], SweepSpec(device="cuda"), ops=["mm"], dtypes=["bf16"])]
    three = [c.key for c in suite_cases(["gemm"], SweepSpec(device="cuda", density=3), ops=["mm"], dtypes=["bf16"])]
    assert set(one) < set(three)
    assert len(three) > 2 * len(one)  # 3x the draws; the doubling probes come once
    quick = [c.key for c in suite_cases(["gemm"], SweepSpec(device="cuda", quick=True, density=3), ops=["mm"])]
    assert quick == [c.key for c in suite_cases(["gemm"], SweepSpec(device="cuda", quick=True), ops=["mm"])]


def test_conv_full_factor_is_cpu_only() -> None:
    from trainsim.bench.suites import suite_cases
    from trainsim.bench.suites.base import SweepSpec

    gpu = list(suite_cases(["conv"], SweepSpec(device="cuda"), dtypes=["fp32"]))
    cpu = list(suite_cases(["conv"], SweepSpec(device="cpu"), dtypes=["fp32"]))
    assert len(cpu) > 8 * len(gpu)


def test_linear_tokens_sweeps_llm_token_rows_on_cuda_only() -> None:
    """The CUDA gemm suite adds linear over 8k-131k token rows (the LLM regime beyond the other
    sweeps' 16,384); the other ops' draws are unchanged by it and CPU sweeps do not get it."""
    from trainsim.bench.suites import suite_cases
    from trainsim.bench.suites.base import SweepSpec
    from trainsim.bench.suites.gemm import _shapes

    spec = SweepSpec(device="cuda")
    tok = list(suite_cases(["gemm"], spec, ops=["linear_tokens"], dtypes=["bf16"]))
    assert tok and all(8192 <= dict(c.params)["m"] <= 131072 for c in tok)
    assert max(dict(c.params)["m"] for c in tok) > 65536
    assert all(dict(c.features)["bias"] == 1.0 and dict(c.features)["wt"] == 1.0 for c in tok)
    assert all(spec.fits(flops=c.flops, nbytes=c.bytes) for c in tok)
    assert _shapes("linear_tokens", {"m": 8192, "n": 64, "k": 32}) == [(8192, 32), (64, 32), (64,)]
    cpu = {c.op for c in suite_cases(["gemm"], SweepSpec(device="cpu"), dtypes=["fp32"])}
    assert "linear_tokens" not in cpu and "linear" in cpu


def test_aligned_and_llm_gemm_sweeps_are_cuda_bf16_and_aligned() -> None:
    """linear_aligned draws m in multiples of 1,024 and n, k in multiples of 128 (some of 512
    and up, which cuBLAS runs fastest); linear_llm takes published LLMs' widths without a bias.
    Both are bf16 only, on CUDA only, and their cases may take up to 1/0.35 of the usual budget."""
    from trainsim.bench.suites import suite_cases
    from trainsim.bench.suites.base import SweepSpec
    from trainsim.bench.suites.gemm import LLM_TOKENS, LLM_WIDTHS, _shapes

    spec = SweepSpec(device="cuda")
    al = list(suite_cases(["gemm"], spec, ops=["linear_aligned"]))
    assert al and {c.dtype for c in al} == {"bfloat16"}
    p = [dict(c.params) for c in al]
    assert all(x["m"] % 1024 == 0 and x["n"] % 128 == 0 and x["k"] % 128 == 0 for x in p)
    assert sum(x["n"] % 512 == 0 and x["k"] % 512 == 0 for x in p) >= len(p) // 20
    assert any(not spec.fits(flops=c.flops, nbytes=c.bytes) for c in al)  # larger than the usual budget
    llm = list(suite_cases(["gemm"], spec, ops=["linear_llm"]))
    assert llm and {c.dtype for c in llm} == {"bfloat16"}
    assert all(dict(c.params)["m"] in LLM_TOKENS and {dict(c.params)["n"], dict(c.params)["k"]} <= set(LLM_WIDTHS)
               for c in llm)  # fmt: skip
    assert all(dict(c.features)["bias"] == 0.0 and dict(c.features)["wt"] == 1.0 for c in llm)
    assert 14336 in LLM_WIDTHS and 14336 // 8 in LLM_WIDTHS and 32000 in LLM_WIDTHS
    assert _shapes("linear_llm", {"m": 1024, "n": 4096, "k": 512}) == [(1024, 512), (4096, 512)]
    cpu = {c.op for c in suite_cases(["gemm"], SweepSpec(device="cpu"), dtypes=["fp32"])}
    assert not {"linear_aligned", "linear_llm"} & cpu
