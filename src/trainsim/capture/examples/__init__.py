"""Example training steps that ``trainsim capture`` can record: the one registry of them.

Each example module exposes ``build(*, batch_size, device, seed) -> TrainingStep``; the
sequence models (``default_seq_len`` set) also take ``seq_len``, and the ones with a width
to choose (``default_hidden`` set) ``hidden`` and ``heads``. Modules are imported only when
an example is built, so listing the registry never imports torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from trainsim.errors import CaptureError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class TrainingStep:
    """A model, one fixed synthetic batch on its device, and how to compute the loss.

    ``loss(module, batch)`` must call ``module`` (which may be the DDP wrapper of ``model``).
    """

    model: torch.nn.Module
    batch: tuple[torch.Tensor, ...]
    loss: Callable[[torch.nn.Module, tuple[torch.Tensor, ...]], torch.Tensor]
    summary: str


@dataclass(frozen=True, slots=True)
class ExampleInfo:
    module: str
    default_batch_size: int
    summary: str
    # more keyword arguments of the module's build (read-only; not part of the hash)
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    # tokens per sequence when not asked (None: the example takes no --seq-len), and the longest it
    # takes (learned positions; None: any)
    default_seq_len: int | None = None
    max_seq_len: int | None = None
    # hidden size and attention heads when not asked (None: the example takes no --hidden, --heads);
    # the width must be a multiple of the heads. ``head_size`` set: the heads follow the width
    # (no --heads; the width a multiple of ``hidden_multiple``)
    default_hidden: int | None = None
    default_heads: int | None = None
    head_size: int | None = None
    hidden_multiple: int = 1
    # where --seq-len, --hidden and --heads apply, and the defaults above describe the model
    sized_devices: tuple[str, ...] = ("cpu", "cuda")

    def seq(self, device: str, seq_len: int | None) -> int | None:
        """The sequence length a capture on ``device`` asked for ``seq_len`` has (None: the
        example has none to choose there)."""
        if self.default_seq_len is None or device not in self.sized_devices:
            return None
        return seq_len or self.default_seq_len

    def width(self, device: str, hidden: int | None, heads: int | None) -> tuple[int | None, int | None]:
        """The (hidden size, heads) a capture on ``device`` asked for ``hidden``/``heads`` has
        (None, None: the example has no width to choose there)."""
        if self.default_hidden is None or device not in self.sized_devices:
            return None, None
        h = hidden or self.default_hidden
        return h, (h // self.head_size if self.head_size else heads or self.default_heads)

    def build(self, *, batch_size: int, device: str, seed: int, seq_len: int | None = None,
              hidden: int | None = None, heads: int | None = None) -> TrainingStep:  # fmt: skip
        builder: Any = importlib.import_module(self.module).build
        asked = {"seq_len": seq_len, "hidden": hidden, "heads": heads}  # capture.validate checks them
        more = {**self.options, **{k: v for k, v in asked.items() if v is not None}}
        step: TrainingStep = builder(batch_size=batch_size, device=device, seed=seed, **more)
        return step


EXAMPLES: Mapping[str, ExampleInfo] = MappingProxyType({
    "dlrm": ExampleInfo(
        "trainsim.capture.examples.dlrm", 64,
        "small DLRM: 8 EmbeddingBag tables, bottom/top MLPs, dot interaction",
    ),
    "gpt2": ExampleInfo(
        "trainsim.capture.examples.gpt2", 4,
        "tiny GPT-2 (transformers GPT2LMHeadModel): 2 layers, vocab 1000; by default 128 hidden, 4 heads, seq 64 "
        "(at most 128)",
        default_seq_len=64, max_seq_len=128, default_hidden=128, default_heads=4,
    ),
    "llama": ExampleInfo(
        "trainsim.capture.examples.llama", 1,
        "LLaMA-style decoder (transformers LlamaForCausalLM): on CUDA 2 layers of LLaMA-3 8B's widths, "
        "bf16, seq 2048; on CPU an fp32 stand-in, by default 256 wide (4 heads of 64, GQA 2, MLP 512; --hidden "
        "keeps those ratios), seq 64 (any: rotary positions)", default_seq_len=64, default_hidden=256,
        default_heads=4, head_size=64, hidden_multiple=128, sized_devices=("cpu",),
    ),
    "llama13": ExampleInfo(
        "trainsim.capture.examples.llama", 1,
        "LLaMA-style decoder: on CUDA 2 layers of LLaMA-2 13B's widths (no GQA), bf16, seq 4096; "
        "on CPU the llama stand-in", MappingProxyType({"shape": "cuda-13b"}),
    ),
    "llama70": ExampleInfo(
        "trainsim.capture.examples.llama", 1,
        "LLaMA-style decoder: on CUDA 2 layers of LLaMA-3 70B's widths (GQA 64/8, vocab 128256), bf16, "
        "seq 2048; on CPU the llama stand-in", MappingProxyType({"shape": "cuda-70b"}),
    ),
    "resnet": ExampleInfo(
        "trainsim.capture.examples.resnet", 8,
        "ResNet-style CNN: 3 stages of basic blocks on 32x32 images, 10 classes",
    ),
})  # fmt: skip


def example_info(name: str) -> ExampleInfo:
    try:
        return EXAMPLES[name]
    except KeyError:
        raise CaptureError(
            f"unknown example model {name!r}; choose one of: {', '.join(sorted(EXAMPLES))}"
        ) from None


__all__ = ["EXAMPLES", "ExampleInfo", "TrainingStep", "example_info"]
