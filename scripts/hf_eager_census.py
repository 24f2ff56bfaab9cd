"""Count the memory-bound kernels HuggingFace's eager PyTorch models run: the census behind
``trainsim predict --impl hf`` (``src/trainsim/builders/data/hf_eager_census.json``).

A fused stack (Megatron, what paper 001 times) runs one kernel per norm, activation, rotary
embedding and loss; HuggingFace's modules run them as many eager aten calls (LlamaRMSNorm
upcasts to fp32 and takes pow, mean, rsqrt, two muls and two casts; ``apply_rotary_pos_emb``
slices, negates, concatenates; the loss upcasts the logits to fp32). This script runs a tiny
model of each family on the CPU in bf16 under a ``TorchDispatchMode`` and records every aten call
of one training step (forward, loss, backward) with its tensors' sizes and dtypes. Two models
that differ by one layer give one layer's calls; the one-layer model less that layer gives the
rest (embedding, final norm, head, loss). GEMMs, attention, the embedding lookup and the loss's
gather are left out (the builder times them); views cost nothing. Every other call becomes bytes
moved: each tensor it reads and writes, once. Sizes are written as products of the model's
symbols (``T`` tokens, ``d`` hidden, ``q``/``kv`` query/key widths, ``f`` MLP width, ``V``
vocabulary, ``hd`` head size); the tiny model's dimensions are chosen so that every product
the step makes has a distinct value, and a large size with no symbol stops the script.

    python scripts/hf_eager_census.py            # rewrites the JSON (needs torch, transformers)
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "trainsim" / "builders" / "data" / "hf_eager_census.json"
# B, L, d, heads, kv heads, head size, MLP width, vocabulary: every product below distinct
B, L, D, H, KV, HD, F, V = 3, 20, 48, 12, 3, 4, 112, 331
T = B * L
SKIP = {"view", "_unsafe_view", "t", "transpose", "expand", "slice", "unsqueeze", "reshape", "as_strided", "detach",
        "alias", "permute", "squeeze", "select", "_reshape_alias", "split", "unbind", "lift_fresh", "split_with_sizes",
        # timed by the builder itself
        "mm", "bmm", "addmm", "embedding", "embedding_dense_backward", "nll_loss_forward", "nll_loss_backward",
        "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
        # no data moved, or a handful of elements
        "zeros", "empty", "ones", "arange", "_local_scalar_dense", "scalar_tensor", "new_empty", "new_zeros", "full",
        "zeros_like", "ones_like", "empty_like", "new_empty_strided", "empty_strided", "_to_copy_scalar"}  # fmt: skip


def _symbols(d: int, f: int, *, q: int, kv: int, hd: int, v: int) -> dict[int, str]:
    """Element count -> symbol; the first name of a count wins (``q`` equals ``d`` in HF's LLaMA)."""
    per_token = {"d": d, "f": f, "q": q, "kv": kv, "hd": hd, "V": v, "2f": 2 * f, "3d": 3 * d, "4d": 4 * d}
    sym: dict[int, str] = {T: "T"}
    for name, w in per_token.items():
        sym.setdefault(T * w, f"T*{name}")
    for name, w in per_token.items():
        if w % 2 == 0:
            sym.setdefault(T * w // 2, f"T*{name}/2")
    sym.setdefault(L * d, "L*d")  # one sequence's learned positions (broadcast over the batch)
    sym.setdefault(L * L, "L*L")  # an attention mask built in eager code
    sym.setdefault(v * d, "V*d")  # a tied embedding: its two gradients added
    sym.setdefault(B * L * L, "T*L")
    return sym


def census(family: str, layers: int) -> tuple[list[tuple[str, str, tuple[tuple[str, str], ...]]], int]:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    torch.manual_seed(0)
    if family == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(hidden_size=D, num_attention_heads=H, num_key_value_heads=KV, head_dim=HD, intermediate_size=F,
                          num_hidden_layers=layers, vocab_size=V, max_position_embeddings=L, tie_word_embeddings=False,
                          bos_token_id=0, eos_token_id=0, pad_token_id=0, attn_implementation="sdpa")  # fmt: skip
        model = LlamaForCausalLM(cfg)
        sym = _symbols(D, F, q=H * HD, kv=KV * HD, hd=HD, v=V)
    elif family == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        # attention dropout runs inside the fused attention kernel on a GPU (the builder times it);
        # on the CPU SDPA with dropout falls back to the math path, so the census leaves it at 0
        cfg = GPT2Config(n_embd=D, n_head=H, n_layer=layers, vocab_size=V, n_positions=L, bos_token_id=0, eos_token_id=0, attn_pdrop=0.0,
                         attn_implementation="sdpa")  # fmt: skip
        model = GPT2LMHeadModel(cfg)
        sym = _symbols(D, 4 * D, q=D, kv=D, hd=D // H, v=V)
    else:
        raise SystemExit(f"unknown family {family!r}")
    model = model.to(torch.bfloat16).train()
    tokens = torch.randint(0, V, (B, L))
    calls: list[tuple[str, str, tuple[tuple[str, str], ...]]] = []
    phase = ["fwd"]

    def size(t: torch.Tensor) -> str | None:
        n = t.numel()
        if n in sym:
            return sym[n]
        if n >= 8 * T:  # a large tensor with no symbol: the census would be wrong
            raise SystemExit(f"{family}: a tensor of {n} elements ({tuple(t.shape)}) has no symbol")
        return None  # no token dimension: weights, biases, one cos/sin table, scalars (little data)

    class Census(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            name = func.__name__.split(".")[0]
            if name in SKIP:
                return out
            flat = [a for a in args if isinstance(a, torch.Tensor)]
            flat += [x for a in args if isinstance(a, list | tuple) for x in a if isinstance(x, torch.Tensor)]
            flat += [o for o in (out if isinstance(out, list | tuple) else [out]) if isinstance(o, torch.Tensor)]
            moved = tuple((s, str(t.dtype).removeprefix("torch.")) for t in flat if (s := size(t)) is not None)
            if moved:
                calls.append((phase[0], name, moved))
            return out

    with Census():
        loss = model(input_ids=tokens, labels=tokens).loss
        phase[0] = "bwd"
        loss.backward()
    return calls, len(calls)


def _tally(calls: list[tuple[str, str, tuple[tuple[str, str], ...]]]) -> Counter[tuple[str, str, str, str]]:
    c: Counter[tuple[str, str, str, str]] = Counter()
    for phase, name, moved in calls:
        for s, dt in moved:
            c[(phase, name, s, dt)] += 1
    return c


def main() -> int:
    import torch
    import transformers

    doc: dict[str, object] = {
        "what": "bytes moved by the memory-bound kernels of HuggingFace eager training steps (forward, loss, backward), "
                "per layer and for the rest of the model; each entry: phase, aten call, tensor size (product of symbols: "
                "T tokens, d hidden, q/kv query/key widths, f MLP width, V vocabulary, hd head size), dtype (bfloat16 "
                "stands for the training dtype), count (tensors of that size read or written by those calls); kernels: the calls per part and phase",
        "command": "python scripts/hf_eager_census.py",
        "versions": {"torch": torch.__version__.split("+")[0], "transformers": transformers.__version__},
        "families": {},
    }
    for family in ("llama", "gpt2"):
        one, _ = census(family, 1)
        two, _ = census(family, 2)
        t1, t2 = _tally(one), _tally(two)
        layer = {k: t2[k] - t1[k] for k in t2 if t2[k] - t1[k]}
        rest = {k: t1[k] - layer.get(k, 0) for k in t1 if t1[k] - layer.get(k, 0)}
        if any(v < 0 for v in (*layer.values(), *rest.values())):
            raise SystemExit(f"{family}: the two-layer step is not the one-layer step plus a layer")
        kernels = {}  # calls (kernels) per part and phase: one layer = two layers less one
        for ph in ("fwd", "bwd"):
            n1, n2 = sum(1 for p, *_ in one if p == ph), sum(1 for p, *_ in two if p == ph)
            kernels.setdefault("layer", {})[ph] = n2 - n1
            kernels.setdefault("rest", {})[ph] = 2 * n1 - n2
        doc["families"][family] = {  # type: ignore[index]
            part: [[*k, v] for k, v in sorted(d.items())] for part, d in (("layer", layer), ("rest", rest))
        } | {"kernels": kernels}
    tmp = OUT.with_suffix(".json.tmp")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, OUT)
    print(OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
