"""Paper 001's operators timed by a GPU's own bench calibration (trainsim.builders.bench_costs),
the hidden-dropout plan option, and the shipped H100 GPT-2 cases of ``validate llm``."""

from __future__ import annotations

import math

import pytest

from trainsim.builders.bench_costs import bench_calibration, translate
from trainsim.builders.costs import LayerCoster, OpCoster
from trainsim.builders.models import get_model
from trainsim.builders.plan import Plan
from trainsim.errors import ConfigError
from trainsim.hardware import get_device


def test_translate_gemms_take_the_tokens_as_rows():
    x = {"mp": 2.0, "b": 4.0, "l": 512.0, "dim": 1024.0}
    t = 4 * 512
    expect = {"linear1": (1024, 1536, 1.0), "linear2": (512, 1024, 1.0), "linear3": (1024, 2048, 1.0),
              "linear4": (2048, 1024, 1.0)}  # fmt: skip
    for op, (k, n, bias) in expect.items():
        tr = translate(op, "fwd", x)
        assert tr is not None and tr.op == "gemm" and tr.scale == 1.0
        assert tr.inputs == {"batch": 1.0, "m": t, "n": n, "k": k, "bias": bias, "wt": 1.0}
    final = translate("linear_final", "bwd", x)
    assert final is not None and final.phase == "bwd"
    # no vocabulary given: 001's 50,257 padded to 128·mp, the size the builder scales from
    assert final.inputs["n"] == math.ceil(50257 / 256) * 256 / 2 and final.inputs["bias"] == 0.0
    assert translate("linear_final", "fwd", {**x, "vocab": 32000.0}).inputs["n"] == 16000  # type: ignore[union-attr]


def test_translate_attention_core_and_memory_bound_ops():
    x = {"mp": 2.0, "b": 2.0, "h": 16.0, "l": 2048.0, "dim": 2048.0}
    scores = translate("baddbmm", "fwd", x)
    assert scores is not None and scores.inputs == {"batch": 16.0, "m": 2048, "n": 2048, "k": 128, "bias": 0.0, "wt": 0.0}
    ctx = translate("bmm", "bwd", x)
    assert ctx is not None and (ctx.inputs["m"], ctx.inputs["k"], ctx.inputs["n"]) == (2048, 2048, 128)
    flash = translate("flash_atten", "fwd", x)
    assert flash is not None and flash.op == "attention"
    assert flash.inputs == {"batch": 2.0, "heads": 8.0, "seq_len": 2048.0, "head_dim": 128.0}
    assert flash.scale == pytest.approx(17 / 32)  # 16 key blocks: the causal kernel runs 136 of 256
    one_block = translate("flash_atten", "fwd", {**x, "l": 64.0})
    assert one_block is not None and one_block.scale == 1.0
    assert translate("layernorm", "bwd", x).inputs == {"b": 4096.0, "l": 1.0, "dim": 2048.0}  # type: ignore[union-attr]
    assert translate("gelu", "fwd", x).inputs == {"mp": 2.0, "b": 1.0, "l": 4096.0, "dim": 2048.0}  # type: ignore[union-attr]
    assert translate("res_add", "fwd", x).inputs == {"numel": 4096.0 * 2048}  # type: ignore[union-attr]
    sm = translate("ScaledUpperTriangMaskedSoftmax", "fwd", {"mp": 1.0, "b": 2.0, "h": 8.0, "l": 1024.0})
    assert sm is not None and sm.op == "softmax" and sm.note == ";as-softmax"
    for op in ("RoPE", "fillmask", "middleStage_optimizer", "optimizer"):
        assert translate(op, "fwd", x) is None


def test_h100_answers_from_its_own_bench_sample_others_do_not():
    h100, a100 = get_device("h100-sxm5-80gb"), get_device("a100-sxm4-80gb")
    assert bench_calibration(h100) is not None and bench_calibration(a100) is None
    q = {"mp": 1.0, "b": 2.0, "l": 2048.0, "dim": 4096.0}
    s, prov = OpCoster(h100).time("linear1", "fwd", "bf16", **q)
    assert prov.startswith("calibrated:cuda_full_") and prov.endswith(";bench-as:linear1")
    # 2·m·n·k at no more than the H100's bf16 peak, and not absurdly slow either
    flops = 2 * 4096 * 3 * 4096 * 4096
    assert flops / 989e12 < s < flops / 100e12
    _, fp16 = OpCoster(h100).time("linear1", "fwd", "fp16", **q)
    assert fp16.endswith(";bench-as:linear1;as-bf16")
    _, off = OpCoster(h100, bench=False).time("linear1", "fwd", "bf16", **q)
    assert "bench-as" not in off and "transferred-from:gh200" in off
    _, a = OpCoster(a100).time("linear1", "fwd", "fp16", **q)
    assert a.startswith("calibrated:") and "bench-as" not in a
    # no bench counterpart: the sibling's 001 measurements still answer
    _, rope = OpCoster(h100).time("RoPE", "fwd", "bf16", mp=1.0, b=2.0, h=32.0, l=2048.0, dim=4096.0)
    assert "bench-as" not in rope and "transferred-from:gh200" in rope


def test_hidden_dropout_adds_a_pass_per_sublayer_and_after_the_embedding():
    model = get_model("llama2-7b")
    coster = OpCoster(get_device("a100-sxm4-80gb"))
    plain = LayerCoster(model, Plan(micro_batch=1), coster)
    drop = LayerCoster(model, Plan(micro_batch=1, hidden_dropout=0.1), coster)
    for phase in ("fwd", "bwd"):
        extra = [o for o in drop.layer(phase) if o.name == "hidden_dropout"]
        assert len(extra) == 2 and len(drop.layer(phase)) == len(plain.layer(phase)) + 2
        add = next(o for o in plain.layer(phase) if o.name == "residual_add")
        assert all(o.seconds == add.seconds and o.launches == 1 for o in extra)
        assert [o.name for o in drop.embedding(phase)] == ["embedding", "hidden_dropout"]
    with pytest.raises(ConfigError, match="hidden_dropout must be in"):
        Plan(hidden_dropout=1.0).validate(model)


@pytest.fixture(scope="module")
def h100_cases():
    from trainsim.validate.llm_cases import read_h100_gpt2

    return read_h100_gpt2()


def test_shipped_h100_cases_describe_the_captured_model(h100_cases):
    assert [c.id for c in h100_cases] == [f"h100-gpt2:b{b}-r{r}" for b in (512, 1024, 2048) for r in (0, 1)]
    m = h100_cases[0].model
    try:  # the capture example's own config, where transformers is installed
        from trainsim.capture.examples import gpt2
    except ImportError:
        pytest.skip("transformers is not installed")
    from trainsim.validate.llm_cases import H100_GPT2_SEQ

    cfg = gpt2.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=gpt2.VOCAB, n_positions=128)
    import inspect

    src = inspect.getsource(gpt2.build)
    assert "n_layer=2, n_embd=128, n_head=4" in src and "n_positions=128" in src
    assert (m.layers, m.hidden, m.heads, m.vocab) == (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.vocab_size)
    assert H100_GPT2_SEQ == gpt2.SEQ_LEN and m.seq_len == cfg.n_positions
    for c in h100_cases:
        assert c.plan.dtype == "fp32" and c.plan.gpus == 1 and c.plan.micro_batch == c.plan.batch
        assert c.plan.hidden_dropout == cfg.resid_pdrop == cfg.embd_pdrop
        assert 0.005 < c.measured_s < 0.05


def test_h100_cases_bench_calibration_beats_the_sibling_and_roofline(h100_cases):
    from trainsim.builders.predict import predict_llm
    from trainsim.hardware import get_system

    system = get_system("dgx-h100")
    mape = {}
    for bench in (True, False):
        coster = OpCoster(get_device(system.device), bench=bench)
        errs = [abs(predict_llm(c.model, c.plan, system, coster=coster).iteration_time_s / c.measured_s - 1)
                for c in h100_cases]  # fmt: skip
        mape[bench] = 100 * sum(errs) / len(errs)
    assert mape[True] < mape[False] / 2, mape
