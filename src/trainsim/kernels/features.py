"""What a kernel model sees: operators, the inputs a caller gives, and the physics derived from them.

An :class:`OpSpec` describes one operator: its kernel family, the inputs a caller must give
(paper 001 Table I for the GPT-NeoX operators: ``b`` batch, ``l`` sequence length, ``dim``
hidden size, ``h`` heads, ``mp`` model-parallel degree; plain ``m, n, k`` for a GEMM), how each
input moves the time where physics says so (``+1`` never faster when it grows, ``-1`` never
slower, ``0`` no claim: more heads at a fixed hidden size can go either way), and
:func:`derive`, which turns inputs into the work done: FLOPs, bytes moved, and the problem's
dimensions (GEMM ``m, n, k``, attention head size, ...). Everything is vectorized over numpy
arrays.

Monotone claims (``+1``/``-1``) are made only where the work grows with the input *and the
same kernel keeps running*: tokens (``b``, ``l``) and hidden size of the linear layers, norms
and element-wise operators; ``mp`` where it divides the work. The batched attention GEMMs
(``baddbmm``, ``bmm``, ``fillmask``) and FlashAttention claim only ``l``: cuBLAS and the
attention kernels choose tiles by batch (``b·h/mp``) and head size (``d/h``), and paper
001's A100 measurements show it — ``baddbmm`` forward at b=4, h=64, l=2560, d=5120 takes
487 µs at mp=8 and 704 µs at mp=16 (half the work, 45 % slower), and 518 µs at b=8 against
704 µs at b=4.

Models take :func:`model_columns` (log2 of inputs, dimensions, FLOPs, bytes, the device's
roofline time and GEMM tile/wave counts) and :func:`column_signs` says how each column moves
with the signed inputs, so tree models can be constrained to be monotone where physics says so.

Approximations (each FLOP/byte count is a first-order estimate of what the measured operator
does; learned models use them as features, so only their order of magnitude matters there):

* GEMMs move each operand once; element-wise kernels read every input and write one output.
* The padded vocabulary follows 001 Eq. 1–2: ``ceil(v / (128 mp)) * 128`` rows per partition.
* Optimizer stages update their parameters with Adam in mixed precision: ~16 bytes per
  parameter (fp32 master weight, two moments, fp16 gradient/weight); stage sizes from 001
  Table III with ``#encoder_parameters = 12 d^2 / mp`` (Eq. 6 without the bias terms).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from numpy.typing import ArrayLike

from trainsim.errors import ModelError
from trainsim.hardware import DeviceSpec
from trainsim.ir.kinds import KernelFamily as F

Arrays = dict[str, np.ndarray]

DEFAULT_VOCAB = 50257  # GPT-NeoX-20B tokenizer (001 §III-D)
_TILE = 128  # Approximation: a 128x128 output tile per thread block (cuBLAS' common tile)
_ATTN_BLOCK = 128  # FlashAttention's query block


class Phase(StrEnum):
    """Which pass of the operator was timed (001's ``F_dur`` / ``B_dur`` / optimizer ``dur``)."""

    FWD = "fwd"
    BWD = "bwd"
    STEP = "step"  # one optimizer update (fused kernels over many tensors)


_DTYPE_BYTES = {"fp16": 2, "bf16": 2, "half": 2, "float16": 2, "bfloat16": 2, "fp32": 4,
                "float": 4, "float32": 4, "tf32": 4, "fp8": 1, "fp64": 8, "double": 8}  # fmt: skip
_DTYPE_PEAK = {"fp16": "fp16", "bf16": "bf16", "half": "fp16", "float16": "fp16",
               "bfloat16": "bf16", "fp32": "fp32", "float": "fp32", "float32": "fp32",
               "tf32": "tf32", "fp8": "fp8"}  # fmt: skip
DEFAULT_DTYPE = "fp16"


def canonical_dtype(dtype: str) -> str:
    d = dtype.strip().lower().removeprefix("torch.").removeprefix("c10::")
    if d not in _DTYPE_BYTES:
        raise ModelError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(_DTYPE_BYTES))}")
    return _DTYPE_PEAK.get(d, d)


def dtype_bytes(dtype: str) -> int:
    return _DTYPE_BYTES[canonical_dtype(dtype)]


def peak_flops(device: DeviceSpec, dtype: str) -> float:
    """Dense peak of ``device`` for ``dtype`` (FP32 where the device has no such unit)."""
    p = device.peak_flops_per_s(canonical_dtype(dtype))
    return p if p is not None else device.peak_flops_per_s("fp32")  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class OpSpec:
    """One operator: its family per phase, its inputs with monotone signs, and its physics."""

    name: str
    family: F
    inputs: dict[str, int]  # input -> +1 / -1 / 0 (see the module docstring)
    derive: Callable[[Arrays, int], Arrays]  # (inputs, element bytes) -> flops, bytes, dims
    example: dict[str, float]  # a typical point (docs, tests, sweeps)
    defaults: dict[str, float] | None = None  # optional inputs and their values
    bwd_family: F | None = None  # when the backward kernels belong to another family
    note: str = ""
    flags: frozenset[str] = frozenset()  # 0/1 inputs (a variant of the op): log2(1 + v) columns

    @property
    def required(self) -> tuple[str, ...]:
        """The inputs a caller must give (those without a default)."""
        return tuple(n for n in self.inputs if not (self.defaults and n in self.defaults))

    def family_for(self, phase: Phase | str) -> F:
        # a plain "bwd" too: ``"bwd" is Phase.BWD`` is False, and builders pass strings
        return self.bwd_family if phase == Phase.BWD and self.bwd_family else self.family


OPS: dict[str, OpSpec] = {}


def _register(spec: OpSpec) -> None:
    if spec.name in OPS:
        raise ModelError(f"operator {spec.name!r} is registered twice")
    OPS[spec.name] = spec


def op_spec(name: str) -> OpSpec:
    try:
        return OPS[name]
    except KeyError:
        raise ModelError(f"unknown operator {name!r}; known: {', '.join(sorted(OPS))}") from None


# --- physics helpers (vectorized) --------------------------------------------------------------


def vocab_partition(mp: np.ndarray, vocab: np.ndarray | float = DEFAULT_VOCAB) -> np.ndarray:
    """Rows of one model-parallel vocabulary partition (001 Eq. 1–2)."""
    return np.ceil(vocab / (128.0 * mp)) * 128.0


def _gemm(batch: np.ndarray, m: np.ndarray, n: np.ndarray, k: np.ndarray, eb: int) -> Arrays:
    return {"batch": batch, "m": m, "n": n, "k": k, "flops": 2.0 * batch * m * n * k,
            "bytes": eb * batch * (m * k + k * n + m * n)}  # fmt: skip


def _elementwise(numel: np.ndarray, eb: int, *, reads: float, writes: float, flops_per: float) -> Arrays:  # fmt: skip
    return {"numel": numel, "flops": flops_per * numel, "bytes": (reads + writes) * eb * numel}


def _linear(k_of: Callable[[Arrays], np.ndarray], n_of: Callable[[Arrays], np.ndarray]) -> Callable[[Arrays, int], Arrays]:  # fmt: skip
    def derive(x: Arrays, eb: int) -> Arrays:
        return _gemm(np.ones_like(x["b"]), x["b"] * x["l"], n_of(x), k_of(x), eb)

    return derive


def _heads(x: Arrays) -> tuple[np.ndarray, np.ndarray]:
    """(attention batch b·h/mp, head size d/h)."""
    return x["b"] * x["h"] / x["mp"], x["dim"] / x["h"]


def _qk(x: Arrays, eb: int) -> Arrays:  # scores = Q K^T: [bh/mp, l, d/h] x [bh/mp, d/h, l]
    bh, hd = _heads(x)
    return _gemm(bh, x["l"], x["l"], hd, eb)


def _pv(x: Arrays, eb: int) -> Arrays:  # context = P V: [bh/mp, l, l] x [bh/mp, l, d/h]
    bh, hd = _heads(x)
    return _gemm(bh, x["l"], hd, x["l"], eb)


def _fillmask(x: Arrays, eb: int) -> Arrays:
    """001's fillmask benchmark: QK^T (baddbmm), masked_fill and softmax of the scores."""
    g = _qk(x, eb)
    scores = g["batch"] * g["m"] * g["n"]
    return {**g, "numel": scores, "flops": g["flops"] + 6.0 * scores,
            "bytes": g["bytes"] + 4.0 * eb * scores}  # fmt: skip


def _flash(x: Arrays, eb: int) -> Arrays:
    """FlashAttention (non-causal): 4·b·(h/mp)·l²·(d/h) FLOPs; Q, K, V, O move once. The
    kernel pads the head size to a multiple of 32 (``head_dim_padded``)."""
    bh, hd = _heads(x)
    l = x["l"]  # noqa: E741 - 001's name for the sequence length
    hp = np.ceil(hd / 32.0) * 32.0
    return {"batch": bh, "seq": l, "head_dim": hd, "head_dim_padded": hp,
            "flops": 4.0 * bh * l * l * hd, "flops_padded": 4.0 * bh * l * l * hp,
            "bytes": 4.0 * eb * bh * l * hd, "q_blocks": bh * np.ceil(l / _ATTN_BLOCK)}  # fmt: skip


def _scores_softmax(x: Arrays, eb: int) -> Arrays:
    bh = x["b"] * x["h"] / x.get("mp", np.ones_like(x["b"]))
    rows = bh * x["l"]
    return {"rows": rows, "cols": x["l"],
            **_elementwise(rows * x["l"], eb, reads=1, writes=1, flops_per=5)}  # fmt: skip


def _fused_softmax(x: Arrays, eb: int) -> Arrays:
    """Megatron's fused upper-triangular softmax sizes each warp's work by the next power of
    two of the row length (``log2_ceil`` in its kernel), so ``cols_padded`` drives the time."""
    out = _scores_softmax(x, eb)
    padded = np.exp2(np.ceil(np.log2(out["cols"])))
    return {**out, "cols_padded": padded, "numel_padded": out["rows"] * padded}


def _rows_cols(cols_of: Callable[[Arrays], np.ndarray], **kw: float) -> Callable[[Arrays, int], Arrays]:  # fmt: skip
    def derive(x: Arrays, eb: int) -> Arrays:
        rows, cols = x["b"] * x["l"], cols_of(x)
        return {"rows": rows, "cols": cols, **_elementwise(rows * cols, eb, **kw)}

    return derive


def _rope(x: Arrays, eb: int) -> Arrays:
    bh, hd = _heads(x)
    numel = x["b"] * x["l"] * x["dim"] / x["mp"]  # one of Q, K; both are rotated
    return {"rows": bh * x["l"], "cols": hd,
            **_elementwise(2.0 * numel, eb, reads=1, writes=1, flops_per=3)}  # fmt: skip


def _embedding(x: Arrays, eb: int) -> Arrays:
    """Gather ``b·l`` rows of ``d`` from a ``v/mp``-row partition (backward: scatter-add into a
    zeroed table gradient, which is why the table size is a feature)."""
    tokens, table_rows = x["b"] * x["l"], vocab_partition(x["mp"], x["vocab"])
    return {"tokens": tokens, "dim": x["dim"], "table_rows": table_rows,
            "table_bytes": eb * table_rows * x["dim"], "flops": tokens * x["dim"],
            "bytes": eb * 2.0 * tokens * x["dim"]}  # fmt: skip


def _cross_entropy(x: Arrays, eb: int) -> Arrays:
    tokens, vp = x["b"] * x["l"], vocab_partition(x["mp"], x["vocab"])
    return {"tokens": tokens, "vocab_partition": vp,
            **_elementwise(tokens * vp, eb, reads=2, writes=1, flops_per=6)}  # fmt: skip


def _stage_params(first: bool, last: bool) -> Callable[[Arrays, int], Arrays]:
    """Parameters of one pipeline stage (001 Table III), updated by Adam (~16 B/param)."""

    def derive(x: Arrays, eb: int) -> Arrays:
        d, mp = x["dim"], x["mp"]
        vd = vocab_partition(mp, x["vocab"]) * d
        params = (
            x["encoders"] * 12.0 * d * d / mp
            + (vd if first else 0.0)
            + (vd + 2 * d if last else 0.0)
        )
        return {"params": params, "flops": 12.0 * params, "bytes": 16.0 * params}

    return derive


def _optimizer(x: Arrays, eb: int) -> Arrays:
    p = x["params"]
    return {"params": p, "tensors": x["param_tensors"], "flops": 12.0 * p, "bytes": 16.0 * p}


def _embedding_bag(x: Arrays, eb: int) -> Arrays:
    """A batched embedding-bag lookup (DLRM/FBGEMM TBE): B samples x T tables x L rows of D."""
    lookups = x["B"] * x["T"] * x["L"]
    reuse = x.get("reuse", np.ones_like(lookups))
    # distinct rows fetched (first touches: from DRAM unless cached) against the tables' size
    return {"lookups": lookups, "dim": x["D"], "flops": lookups * x["D"],
            "unique_bytes": eb * lookups / reuse * x["D"], "table_bytes": eb * x["T"] * x["E"] * x["D"],
            "bytes": eb * (lookups * x["D"] + x["B"] * x["T"] * x["D"])}  # fmt: skip


def _generic_gemm(x: Arrays, eb: int) -> Arrays:
    return _gemm(x["batch"], x["m"], x["n"], x["k"], eb)


def _generic_attention(x: Arrays, eb: int) -> Arrays:
    return _flash({"b": x["batch"], "h": x["heads"], "mp": np.ones_like(x["batch"]),
                   "l": x["seq_len"], "dim": x["heads"] * x["head_dim"]}, eb)  # fmt: skip


# --- the table ------------------------------------------------------------------------------

_LIN = {"mp": -1, "b": 1, "l": 1, "dim": 1}
_ATT = {"mp": 0, "b": 0, "h": 0, "l": 1, "dim": 0}  # see "Monotone claims" in the docstring
_BLD = {"b": 1, "l": 1, "dim": 1}
_EX_LIN = {"mp": 2.0, "b": 4.0, "l": 2048.0, "dim": 4096.0}
_EX_ATT = {"mp": 2.0, "b": 4.0, "h": 32.0, "l": 2048.0, "dim": 4096.0}
_EX_BLD = {"b": 4.0, "l": 2048.0, "dim": 4096.0}
_VOCAB = {"vocab": float(DEFAULT_VOCAB)}

for _name, _k, _n in (
    ("linear1", lambda x: x["dim"], lambda x: 3 * x["dim"] / x["mp"]),  # QKV projection
    ("linear2", lambda x: x["dim"] / x["mp"], lambda x: x["dim"]),  # attention output
    ("linear3", lambda x: x["dim"], lambda x: 4 * x["dim"] / x["mp"]),  # MLP up
    ("linear4", lambda x: 4 * x["dim"] / x["mp"], lambda x: x["dim"]),  # MLP down
):
    _register(OpSpec(_name, F.GEMM, _LIN, _linear(_k, _n), _EX_LIN))
_register(OpSpec("linear_final", F.GEMM, {**_LIN, "vocab": 1},
                 _linear(lambda x: x["dim"], lambda x: vocab_partition(x["mp"], x["vocab"])),
                 _EX_LIN, _VOCAB, note="logits over the vocabulary partition"))  # fmt: skip
_register(OpSpec("baddbmm", F.GEMM, _ATT, _qk, _EX_ATT, note="attention scores Q K^T"))
_register(OpSpec("bmm", F.GEMM, _ATT, _pv, _EX_ATT, note="attention context P V"))
_register(OpSpec("fillmask", F.ELEMENTWISE, _ATT, _fillmask, _EX_ATT,
                 note="001's benchmark times Q K^T, masked_fill and softmax together"))  # fmt: skip
_register(OpSpec("flash_atten", F.ATTENTION, _ATT, _flash, _EX_ATT))
_register(OpSpec("softmax", F.SOFTMAX, {"mp": -1, "b": 1, "h": 1, "l": 1}, _scores_softmax,
                 {"mp": 2.0, "b": 4.0, "h": 32.0, "l": 2048.0}))  # fmt: skip
_register(OpSpec("ScaledUpperTriangMaskedSoftmax", F.SOFTMAX, {"mp": -1, "b": 1, "h": 1, "l": 1},
                 _fused_softmax, {"mp": 1.0, "b": 4.0, "h": 32.0, "l": 2048.0}, {"mp": 1.0},
                 note="Megatron's fused causal softmax"))  # fmt: skip
_register(
    OpSpec("RoPE", F.ELEMENTWISE, {"mp": -1, "b": 1, "h": 0, "l": 1, "dim": 1}, _rope, _EX_ATT)
)
_register(OpSpec("layernorm", F.NORM, _BLD,
                 _rows_cols(lambda x: x["dim"], reads=1, writes=1, flops_per=8), _EX_BLD))  # fmt: skip
_register(OpSpec("RMSlayernorm", F.NORM, _BLD,
                 _rows_cols(lambda x: x["dim"], reads=1, writes=1, flops_per=6), _EX_BLD))  # fmt: skip
_register(OpSpec("res_add", F.ELEMENTWISE, _BLD,
                 _rows_cols(lambda x: x["dim"], reads=2, writes=1, flops_per=1), _EX_BLD))  # fmt: skip
_register(OpSpec("gelu", F.ELEMENTWISE, _LIN,
                 _rows_cols(lambda x: 4 * x["dim"] / x["mp"], reads=1, writes=1, flops_per=10),
                 _EX_LIN))  # fmt: skip
_register(OpSpec("embedding", F.EMBEDDING_FWD, {"mp": 0, "b": 1, "l": 1, "dim": 1, "vocab": 0},
                 _embedding, {"mp": 2.0, "b": 4.0, "l": 2048.0, "dim": 4096.0}, _VOCAB,
                 bwd_family=F.EMBEDDING_BWD, note="vocabulary-parallel word embedding"))  # fmt: skip
_register(OpSpec("parallel_cross_entropy_128", F.SOFTMAX, {"mp": -1, "b": 1, "l": 1, "vocab": 1},
                 _cross_entropy, {"mp": 2.0, "b": 4.0, "l": 2048.0}, _VOCAB,
                 note="vocabulary-parallel cross-entropy, vocabulary padded to 128·mp"))  # fmt: skip
for _name, _first, _last in (("firstStage_optimizer", True, False),
                             ("middleStage_optimizer", False, False),
                             ("lastStage_optimizer", False, True)):  # fmt: skip
    _register(OpSpec(_name, F.OPTIMIZER, {"mp": -1, "dim": 1, "encoders": 1, "vocab": 1},
                     _stage_params(_first, _last), {"mp": 2.0, "dim": 4096.0, "encoders": 8.0},
                     _VOCAB, note="one FusedAdam step over a pipeline stage's parameters"))  # fmt: skip
_register(OpSpec("optimizer", F.OPTIMIZER,
                 {"num_layers": 0, "hidden_size": 0, "param_tensors": 0, "params": 1}, _optimizer,
                 {"num_layers": 24.0, "hidden_size": 2048.0, "param_tensors": 292.0, "params": 1.3e9},
                 note="one optimizer step over a whole model"))  # fmt: skip
# Generic operators, for datasets of single kernels (ours, or exported from traces).
# The ``gemm`` operator's variant inputs of each torch call (benchmark rows name the call).
GEMM_VARIANT: dict[str, dict[str, int]] = {
    "mm": {"bias": 0, "wt": 0}, "addmm": {"bias": 1, "wt": 0}, "matmul": {"bias": 0, "wt": 0},
    "bmm": {"bias": 0, "wt": 0}, "linear": {"bias": 1, "wt": 1}, "peak_mm": {"bias": 0, "wt": 0},
    "linear_tokens": {"bias": 1, "wt": 1},  # the CUDA sweeps of linear: LLM token counts,
    "linear_aligned": {"bias": 1, "wt": 1},  # aligned shapes,
    "linear_llm": {"bias": 0, "wt": 1},  # published LLMs' shapes, bias-free
}  # fmt: skip


def gemm_inputs(call: str, shapes: Sequence[Sequence[int]]) -> dict[str, float] | None:
    """The ``gemm`` operator's inputs of torch call ``call`` (``mm``, ``addmm``, ``bmm``,
    ``matmul``, ``linear``) on input tensors of ``shapes`` (those that have one, in order), or
    None when they do not form a product. ``linear``'s weight is ``[out, in]`` and a third input
    its bias; ``addmm``'s first input is the bias. Variant inputs only where they are not 0."""
    if len(shapes) < 2:
        return None
    if call == "linear":
        x, w = shapes[0], shapes[1]
        return {"batch": 1, "m": math.prod(x) // x[-1], "k": x[-1], "n": w[0], "bias": int(len(shapes) >= 3), "wt": 1}
    if call not in ("mm", "addmm", "bmm", "matmul"):
        return None
    a, b = (shapes[1], shapes[2]) if call == "addmm" and len(shapes) >= 3 else (shapes[0], shapes[1])
    if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
        return None
    return {"batch": math.prod(a) // (a[-1] * a[-2]), "m": a[-2], "k": a[-1], "n": b[-1],
            **({"bias": 1} if call == "addmm" else {})}  # fmt: skip


# ``bias``: the call adds a bias (addmm, linear: a fused epilogue forward, a bias-gradient
# reduction backward); ``wt``: B is stored transposed ([n, k], linear's weight). cuBLAS picks
# other kernels for each layout: on an H100 the four calls of one (m, n, k) differ by up to 2x
# in backward, and pooled without these inputs the bf16 backward's cross-validated MAPE was
# 22.5 % (9.2 % with the call named; docs/gpu.md).
_register(OpSpec("gemm", F.GEMM, {"batch": 1, "m": 1, "n": 1, "k": 1, "bias": 0, "wt": 0}, _generic_gemm,
                 {"batch": 1.0, "m": 4096.0, "n": 4096.0, "k": 4096.0, "bias": 0.0, "wt": 0.0},
                 {"batch": 1.0, "bias": 0.0, "wt": 0.0}, flags=frozenset({"bias", "wt"})))  # fmt: skip
_register(OpSpec("attention", F.ATTENTION, {"batch": 1, "heads": 1, "seq_len": 1, "head_dim": 1},
                 _generic_attention, {"batch": 4.0, "heads": 16.0, "seq_len": 2048.0, "head_dim": 128.0}))  # fmt: skip
_register(OpSpec("elementwise", F.ELEMENTWISE, {"numel": 1},
                 lambda x, eb: _elementwise(x["numel"], eb, reads=2, writes=1, flops_per=1),
                 {"numel": 2.0**24}, note="Approximation: two inputs, one output"))  # fmt: skip
_register(OpSpec("embedding_bag", F.EMBEDDING_FWD, {"B": 0, "E": 0, "T": 1, "L": 1, "D": 1, "reuse": 0},
                 _embedding_bag, {"B": 2048.0, "E": 1e6, "T": 8.0, "L": 32.0, "D": 128.0}, {"reuse": 1.0},
                 bwd_family=F.EMBEDDING_BWD,
                 note="batched embedding-bag (FBGEMM TBE). No claim in B: in 002's L2 model a larger "
                      "batch leaves fewer tables sharing the L2 and can raise the hit rate enough to "
                      "outweigh the extra lookups. Optional ``reuse``: lookups per distinct row of the "
                      "batch (000 §III-E's mean reuse factor; 1 = every lookup a different row), which "
                      "sets how many lookups hit in cache"))  # fmt: skip
_register(OpSpec("memcpy", F.MEMCPY, {"bytes": 1},
                 lambda x, eb: {"flops": np.zeros_like(x["bytes"]), "bytes": 2.0 * x["bytes"]},
                 {"bytes": 2.0**26}, note="a device-to-device copy reads and writes each byte"))  # fmt: skip

_register(OpSpec("work", F.OTHER, {"flops": 1, "bytes": 1},
                 lambda x, eb: {"flops": x["flops"], "bytes": x["bytes"]}, {"flops": 1e12, "bytes": 1e9},
                 {"flops": 1.0, "bytes": 1.0}, note="any kernel given by its FLOPs and bytes moved"))  # fmt: skip
WORK_OP = "work"

GENERIC_OP: dict[F, str] = {F.GEMM: "gemm", F.ATTENTION: "attention", F.ELEMENTWISE: "elementwise",
                            F.EMBEDDING_FWD: "embedding_bag", F.EMBEDDING_BWD: "embedding_bag",
                            F.MEMCPY: "memcpy"}  # fmt: skip


# --- evaluation -------------------------------------------------------------------------------


def as_inputs(spec: OpSpec, features: Mapping[str, ArrayLike]) -> Arrays:
    """The op's inputs as float arrays (defaults filled in); raises naming what is missing."""
    out: Arrays = {}
    for name in spec.inputs:
        if name in features:
            v = np.asarray(features[name], dtype=float)
        elif spec.defaults and name in spec.defaults:
            v = np.asarray(spec.defaults[name], dtype=float)
        else:
            raise ModelError(
                f"operator {spec.name} needs input {name!r} (inputs: {', '.join(spec.inputs)})"
            )
        if name in spec.flags:
            if not np.all((v == 0) | (v == 1)):
                raise ModelError(f"operator {spec.name}: input {name!r} is a 0/1 flag, got {v!r}")
        elif not np.all(np.isfinite(v) & (v > 0)):
            raise ModelError(f"operator {spec.name}: input {name!r} must be positive, got {v!r}")
        out[name] = v
    shapes = {v.shape for v in out.values()}
    if len(shapes) == 1:  # one shape already (every scalar query): a copy each, as below
        return {k: v.astype(float) for k, v in out.items()}
    shape = np.broadcast_shapes(*shapes)
    return {k: np.broadcast_to(v, shape).astype(float) for k, v in out.items()}


def derive(spec: OpSpec, features: Mapping[str, ArrayLike], dtype: str = DEFAULT_DTYPE) -> Arrays:
    """FLOPs, bytes and dimensions of ``spec`` at ``features`` (arrays broadcast together)."""
    x = as_inputs(spec, features)
    return spec.derive(x, dtype_bytes(dtype))


def roofline_s(flops: np.ndarray, nbytes: np.ndarray, device: DeviceSpec, dtype: str) -> np.ndarray:
    """max(FLOPs / peak, bytes / memory bandwidth) with datasheet peaks: a lower bound."""
    return np.maximum(flops / peak_flops(device, dtype), nbytes / device.memory_bandwidth_Bps)


def device_inputs(spec: OpSpec, features: Mapping[str, ArrayLike], device: DeviceSpec, dtype: str) -> Arrays:
    """:func:`as_inputs` on ``device``: an input the device fixes, where the op takes it and the
    caller did not give it, is the device's (``lanes``: the SIMD width in elements of a CPU that
    declares ``vector_bits``), not the op's default."""
    if "lanes" in spec.inputs and "lanes" not in features and device.vector_bits:
        features = {**features, "lanes": device.vector_bits / (8 * dtype_bytes(dtype))}
    return as_inputs(spec, features)


ALIGN_CAP = 256
# columns that move both ways with the sizes by design (alignment): sign 0, never a conflict
ALIGN_COLUMNS = frozenset({"align_m", "align_n", "align_k"})


def pow2_divisor(v: ArrayLike, cap: int = ALIGN_CAP) -> np.ndarray:
    """The largest power of two, up to ``cap`` (a power of two), that divides each size rounded
    to an integer; 1 for a size under 1 or not finite. It depends only on the size modulo
    ``cap``, so sizes of any magnitude are exact."""
    r = np.rint(np.asarray(v, dtype=float))
    r = np.where(np.isfinite(r) & (r >= 1), r, 1.0)
    rem = np.fmod(r, cap).astype(np.int64)
    return np.where(rem == 0, cap, rem & -rem).astype(float)


def model_columns(spec: OpSpec, features: Mapping[str, ArrayLike], *, device: DeviceSpec,
                  dtype: str = DEFAULT_DTYPE) -> tuple[list[str], np.ndarray]:  # fmt: skip
    """(column names, matrix): log2 of inputs, derived quantities and the roofline time; for
    GEMMs also log2 of 128x128 output tiles and of waves over the device's SMs (both grow in
    steps with the problem: tile and wave quantization, 002 §4.2.3)."""
    x = device_inputs(spec, features, device, dtype)
    cols = named_columns(spec, x, spec.derive(x, dtype_bytes(dtype)), device, dtype)
    names = sorted(cols)
    return names, log2_columns(cols, names)


def log2_columns(cols: Mapping[str, np.ndarray], names: Sequence[str]) -> np.ndarray:
    """The matrix of ``names``' columns, each log2 (floored at 1e-30)."""
    return np.column_stack([np.log2(np.maximum(cols[n], 1e-30)) for n in names])


def named_columns(spec: OpSpec, x: Arrays, w: Arrays, device: DeviceSpec, dtype: str) -> dict[str, np.ndarray]:
    """:func:`model_columns` before the log: by name, from the op's inputs ``x`` (as
    :func:`device_inputs` gives them) and what ``spec.derive`` makes of them."""
    cols: dict[str, np.ndarray] = {f"in:{k}": v + 1.0 if k in spec.flags else v for k, v in x.items()}
    # ``host_`` quantities describe how a CPU runs the op (its library's path): not on a GPU
    host = device.sm_count is None
    cols.update({f"d:{k}": np.broadcast_to(v, next(iter(x.values())).shape) for k, v in w.items()
                 if host or not k.startswith("host_")})  # fmt: skip
    cols["roofline_s"] = roofline_s(w["flops"], w["bytes"], device, dtype)
    sms = float(device.sm_count or 100)
    if {"m", "n", "batch"} <= w.keys():
        tiles = w["batch"] * np.ceil(w["m"] / _TILE) * np.ceil(w["n"] / _TILE)
        cols["tiles"], cols["waves"] = tiles, np.ceil(tiles / sms)
    if "q_blocks" in w:
        cols["waves"] = np.ceil(w["q_blocks"] / sms)
    if spec.name == "gemm" and not host:
        # On a GPU a GEMM whose sizes are multiples of cuBLAS's tiles runs its fastest kernels:
        # LLM shapes (multiples of 128 to 1,024) ran 16 % faster on the H100 than the models
        # fitted on draws aligned to 8 predicted (docs/gpu.md). The largest power of two that
        # divides each size, up to 256, tells them apart (ALIGN_COLUMNS: no monotone sign).
        for d in ("m", "n", "k"):
            cols[f"align_{d}"] = pow2_divisor(w[d])
    if device.sm_count is None:
        # A host CPU (no SMs; the tile and wave columns above stay, so models fitted before
        # these columns still evaluate). Its cores reach their peak only at a high arithmetic
        # intensity, and trees on log columns cannot form log(flops) − log(bytes) themselves;
        # the smallest GEMM dimension bounds the register blocking the same way.
        cols["intensity"] = w["flops"] / np.maximum(w["bytes"], 1.0) + 1.0
        # one core rarely overlaps its arithmetic with its memory traffic: the two times added
        cols["serial_s"] = (w["flops"] / peak_flops(device, dtype)
                            + w["bytes"] / device.memory_bandwidth_Bps)  # fmt: skip
        if {"m", "n", "k"} <= w.keys():
            cols["min_dim"] = np.minimum(np.minimum(w["m"], w["n"]), w["k"])
    return cols


def column_signs(spec: OpSpec, example: Mapping[str, ArrayLike], *, device: DeviceSpec, dtype: str = DEFAULT_DTYPE,
                 claims: Mapping[str, int] | None = None) -> tuple[list[str], list[int], list[str]]:  # fmt: skip
    """(column names, sign per column, conflicting columns).

    A column's sign is +1 if it never decreases when a ``+1`` input grows or a ``-1`` input
    shrinks (at every row of ``example``), -1 if it never increases, 0 if no signed input moves
    it. A column that moves both ways is *conflicting*: a monotone model must leave it out.
    A model non-decreasing in the +1 columns and non-increasing in the -1 columns, without the
    conflicting ones, is monotone in every signed input (the chain rule, term by term). The
    alignment columns (:data:`ALIGN_COLUMNS`) are the exception: sign 0 and never conflicting, so
    a model may use them, and its monotonicity is then the measured one (twice the problem is
    never more than 10 % faster, the conformance test), not the chain rule's.
    ``claims`` replaces the spec's signs (e.g. those its measurements do not contradict)."""
    names, base = model_columns(spec, example, device=device, dtype=dtype)
    x = device_inputs(spec, example, device, dtype)
    up = np.zeros(len(names), dtype=bool)
    down = np.zeros(len(names), dtype=bool)
    for name, sign in (spec.inputs if claims is None else claims).items():
        if sign == 0:
            continue
        moved = dict(x)
        moved[name] = x[name] * (1.5 if sign > 0 else 1 / 1.5)  # the direction of "more work"
        _, m = model_columns(spec, moved, device=device, dtype=dtype)
        up |= np.any(m - base > 1e-12, axis=0)
        down |= np.any(m - base < -1e-12, axis=0)
    up &= ~np.isin(names, list(ALIGN_COLUMNS))
    down &= ~np.isin(names, list(ALIGN_COLUMNS))
    signs = [1 if u and not d else -1 if d and not u else 0 for u, d in zip(up, down, strict=True)]
    conflicts = [n for n, u, d in zip(names, up, down, strict=True) if u and d]
    return names, signs, conflicts


def sweep_values(lo: float, hi: float, n: int = 9) -> np.ndarray:
    """``n`` points from ``lo`` to ``hi``, evenly spaced in log2 (for monotonicity sweeps)."""
    if lo <= 0 or hi < lo:
        raise ModelError(f"bad sweep range [{lo}, {hi}]")
    return np.unique(np.exp2(np.linspace(math.log2(lo), math.log2(hi), n)))
