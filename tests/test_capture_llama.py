"""The LLaMA-style capture example: its CUDA shape is what ``trainsim predict`` reads from the
same config (parameters to the one), and its CPU stand-in trains one step."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.mark.parametrize(("shape", "seq_len", "widths"), [
    ("cuda", 2048, (4096, 2, 32, 8, 14336)),  # the llama example: LLaMA-3 8B's widths
    ("cuda-13b", 4096, (5120, 2, 40, 40, 13824)),  # llama13: LLaMA-2 13B's, no GQA
    ("cuda-70b", 2048, (8192, 2, 64, 8, 28672)),  # llama70: LLaMA-3 70B's
])  # fmt: skip
def test_cuda_shape_is_the_config_trainsim_predict_reads(tmp_path, shape, seq_len, widths):
    from transformers import LlamaForCausalLM

    from trainsim.builders.models import read_hf_config
    from trainsim.capture.examples.llama import config

    cfg, seq, dtype = config(shape)
    assert (seq, dtype) == (seq_len, torch.bfloat16)
    path = tmp_path / "config.json"
    path.write_text(cfg.to_json_string())
    spec = read_hf_config(path)
    with torch.device("meta"):
        hf = LlamaForCausalLM(cfg)
    assert spec.params(padded=False) == sum(p.numel() for p in hf.parameters())
    assert (spec.hidden, spec.layers, spec.heads, spec.n_kv, spec.ffn) == widths
    assert json.loads(path.read_text())["model_type"] == "llama"


def test_llama13_passes_its_shape_to_the_builder():
    from trainsim.capture.examples import example_info, llama
    from trainsim.errors import CaptureError

    assert dict(example_info("llama13").options) == {"shape": "cuda-13b"}
    assert dict(example_info("llama70").options) == {"shape": "cuda-70b"}
    assert dict(example_info("llama").options) == {}
    step = example_info("llama13").build(batch_size=1, device="cpu", seed=0)  # the CPU stand-in
    assert step.batch[0].shape == (1, 64)
    with pytest.raises(CaptureError, match="llama example: unknown shape 'cuda-9b'; known: cpu, cuda, cuda-13b"):
        llama.build(batch_size=1, device="cuda", seed=0, shape="cuda-9b")


def test_cpu_stand_in_trains_a_step():
    from trainsim.capture.examples import example_info

    step = example_info("llama").build(batch_size=2, device="cpu", seed=0)
    (tokens,) = step.batch
    assert tokens.shape == (2, 64)
    loss = step.loss(step.model, step.batch)
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in step.model.parameters() if p.requires_grad)


def test_cpu_stand_in_widths_follow_the_registry_and_hidden_keeps_its_ratios():
    """The registry repeats the stand-in's widths so that listing it imports no torch: they agree,
    and ``hidden`` keeps heads of 64, half of them key/value heads, an MLP twice as wide."""
    from trainsim.capture.examples import example_info, llama

    info = example_info("llama")
    fields = llama.SHAPES["cpu"][0]
    assert (fields["hidden_size"], fields["num_attention_heads"]) == (info.default_hidden, info.default_heads)
    assert info.head_size == llama.CPU_HEAD_SIZE and info.hidden_multiple == 2 * llama.CPU_HEAD_SIZE
    cfg = info.build(batch_size=1, device="cpu", seed=0, hidden=512).model.config
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size) == (512, 8, 4, 1024)
    default = llama.config("cpu")[0]
    assert default.hidden_size // default.num_attention_heads == llama.CPU_HEAD_SIZE
    assert (default.num_key_value_heads, default.intermediate_size) == (default.num_attention_heads // 2, 2 * 256)
    assert info.default_seq_len == llama.SHAPES["cpu"][1] and info.max_seq_len is None  # rotary: any length
    step = info.build(batch_size=1, device="cpu", seed=0, seq_len=48)
    assert step.batch[0].shape == (1, 48) and step.model.config.max_position_embeddings == 48
