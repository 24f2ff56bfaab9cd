"""Resize what-if: a captured workload at another batch size, sequence length or hidden size
(002 §4.5.1.1, *resize*).

:func:`resize_batch`, :func:`resize_seq` and :func:`resize_hidden` are pure passes Workload →
Workload. They rewrite every op's input and output shapes along the batch (sequence, hidden)
dimension, then re-predict the op's work as its measured duration times a ratio, with a
provenance naming the rule used (first that applies):

1. ``optimizer`` ×1 — ops under an ``Optimizer.*`` annotation update parameters: weight-sized
   (a hidden resize changes the parameters: ``optimizer <rule>``, the rules below on its shapes);
2. ``view`` ×1 — ops that only reinterpret a tensor (view, reshape, transpose, select, ...)
   and their backward nodes (``ViewBackward0``, ...), unless the op launched device kernels or
   ran a nested ``aten::copy_``, ``fill_`` or ``zero_`` (``Op.moved_data``, what shows it in a
   CPU trace): then it moved data (``to`` with a dtype change, ``SliceBackward0``'s zero-fill and copy,
   ``reshape`` of a non-contiguous tensor) and the rules below apply;
3. ``AccumulateGrad`` ×1 — accumulates a parameter's gradient: weight-sized (hidden resize:
   ``AccumulateGrad (parameter elements)``, the ratio of all parameter elements);
4. ``model <op> <phase>`` — a kernel model answers the op's old and new features (GEMMs,
   convolutions, norms, attention, dropout, element-wise, losses, embedding bags):
   ratio = model(new) / model(old), so the model's bias on this machine cancels and the
   measured baseline is kept. An answer the model marks ``extrapolated`` (outside the
   features it was calibrated on) is not used: the next rule applies. A backward node (``autograd::engine::evaluate_function: XBackward0``)
   has no shapes in the trace: it is paired with the forward op that created it and takes the
   model's ``bwd`` phase on that op's features. The trace says which op that is where it has
   autograd's sequence numbers (Kineto's ``Sequence number``: the node carries the number its
   forward op drew; the op is the last top-level forward op whose number is at most the node's);
   an op of another kind (a ``MulBackward0`` of a step inside ``scaled_dot_product_attention``'s
   math path or, on the CPU, ``dropout``'s mask) leaves the node to rule 7, its work
   proportional, as does a numbered node whose op came before the traced window or recorded no
   shapes (``aten::cat``'s tensor lists, without the execution trace). Without
   them, by position: the k-th of m backward nodes of a name with forward op ⌊(m−1−k)·n/m⌋ of
   the n ops of a matching name (backward runs in reverse order; Approximation: exact for
   chains, wrong where ops of that name need no gradient or branches interleave);
5. ``elementwise`` — an op (or paired backward node) whose tensors scale but that no specific
   model covers takes the element-wise model's ratio at the numel of its largest batch-sized
   tensor (keeps the fixed per-call cost of small ops), or without models the ratio of
   batch-sized elements (``numel``);
6. ``weight-sized`` ×1 — none of the op's tensors changed (no batch dimension);
7. ``batch`` (``seq``, ``hidden``) ×factor — a backward node with no matching forward op, or
   whose forward op is of another kind (Approximation: its work is proportional to the batch,
   the sequence length or the width).

Rules 4–5 are clamped to [1, work] (or [work, 1] when shrinking), ``work`` being the ratio of
the op's batch-sized elements (Approximation: an op's time is affine in its batch-sized work —
a fixed per-call cost plus a proportional part — so it never grows faster than its work; a
model ratio outside says the microbenchmark crossed a cache regime that the op, running with
cold caches inside a training step, already pays).

Sequence dimension (:func:`resize_seq`; Approximation, from shapes alone): every dimension of
a non-parameter tensor equal to the traced length (``[B, S, H]``, token ids ``[B, S]``, scores
``[B, h, S, S]``: both), and a leading dimension that is a multiple of it (flattened tokens
``[B·S, H]``), scale to the new length. The work bound of an attention op, and of a GEMM (an
unfused ``QKᵀ`` matmul), is its FLOP ratio (``s²``), not its elements'. A traced length equal
to a dimension of a parameter (a hidden or head size) or to the batch cannot be told apart from
it: refused.

Hidden dimension (:func:`resize_hidden`, one rank of a transformer-like step — it has a
``scaled_dot_product_attention`` — without collectives; Approximation, from shapes alone):
every width scales with the hidden size H → H' — H itself, every dimension of a parameter other
than an embedding table's rows and the vocabulary (the loss's classes: an untied lm head's
``[V, H]``) (3H, 4H, a GQA projection's kv·d), and the attention head size (the heads stay;
RoPE's half-head slices do not scale) or, with ``scale_heads``, the head count of the per-head
tensors (the head size stays) — wherever it appears, in parameters and activations alike (an
embedding table keeps its rows: ``[P, H]`` → ``[P, H']`` even when P equals a width; so do the
tensors of its shape in the same op, its gradient and optimizer state). The parameters change,
so the optimizer's ops take the rules above on their new shapes (a foreach kernel by all its
elements) and AccumulateGrad the ratio of all parameter elements, and a GEMM's work bound is
its FLOP ratio (×4 for a ``[4H, H]`` weight at 2H). A width equal to a token count (the
dimensions of the embedding lookups' indices, B, S and B·S) or, the heads kept, to the head
count cannot be told apart from it: refused (with ``scale_heads``: a head count equal to S, a
head size equal to a width or to H, one key/value head), as is a width that would not stay an
integer. Widths not proportional to H in the real
family (LLaMA's MLP rounding) are scaled proportionally anyway.

Batch dimension (Approximation, from shapes alone): parameters are the tensors the optimizer
updates in place (their tensor ids); every other tensor whose leading dimension is a multiple
of the old batch is scaled there (``[B, ...]``, ``[B·S, H]``), and a 1-D integer tensor (a
per-sample index list such as embedding-bag indices) is scaled by the factor. Non-parameter
buffers whose size happens to be a multiple of the batch (BatchNorm running statistics) are
scaled too; models that read them (batch_norm reads its input only) are unaffected.

A pass never rewrites a measurement: a CPU-only op (its own CPU time is its work: CPU traces)
gets ``Op.predicted_s``; an op's device kernels get ``Kernel.predicted_s`` (each kernel the
op's ratio). Host overheads (T1–T5, per op) are unchanged: the simulator takes them from the
host model as before; in its ``STATS``/``SHARED`` modes a resized CPU-only op takes the host
model's time plus the predicted change (``timings.resized_cpu_s``).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from trainsim.errors import ConfigError, TrainsimError
from trainsim.ir.graph import Op, RankGraph, TensorMeta, Workload
from trainsim.kernels.features import gemm_inputs
from trainsim.sim.whatif import RESIZE

# (kernel-model operator, phase, dtype, inputs) -> (seconds, provenance); e.g. ``Coster.time``.
OpTimer = Callable[..., tuple[float, str]]

_BWD = re.compile(r"^autograd::engine::evaluate_function: (?:torch::autograd::)?(\w+?)(?:Backward\d*)?$")
_VIEW_OPS = frozenset({
    "view", "reshape", "unsafeview", "transpose", "t", "permute", "expand", "expandas",
    "unsqueeze", "squeeze", "select", "slice", "narrow", "asstrided", "split", "splitwithsizes",
    "chunk", "unbind", "unflatten", "flatten", "detach", "alias", "to", "liftfresh", "viewas",
    "reshapealias", "numpyt", "empty", "emptylike", "zeroslike", "oneslike",
})  # fmt: skip
_VIEW_BWD = frozenset({
    "view", "reshape", "reshapealias", "unsafeview", "transpose", "t", "permute", "squeeze",
    "unsqueeze", "select", "slice", "asstrided", "alias", "detach", "unbind",
})  # fmt: skip
# Backward node name (lower case, no underscores) -> forward op names it may come from.
_BWD_FORWARD: dict[str, tuple[str, ...]] = {
    "addmm": ("addmm", "linear"), "mm": ("mm", "linear", "matmul"),
    "bmm": ("bmm", "matmul", "scaleddotproductattention"),
    "convolution": ("conv2d", "conv1d", "conv3d", "convolution"),
    "nativebatchnorm": ("batchnorm",), "cudnnbatchnorm": ("batchnorm",), "miopenbatchnorm": ("batchnorm",),
    "nativelayernorm": ("layernorm",), "nativedropout": ("dropout",), "maxpool2dwithindices": ("maxpool2d",),
    "logsoftmax": ("logsoftmax", "crossentropyloss"), "nllloss": ("nllloss", "crossentropyloss"),
    "safesoftmax": ("softmax", "scaleddotproductattention"),
    "softmax": ("softmax", "scaleddotproductattention"), "mean": ("mean", "adaptiveavgpool2d"),
    "stack": ("stack",), "cat": ("cat",), "index": ("index",),
    # the fused attention kernels' backward nodes (review 2026-11-27: unpaired, they scaled with
    # the length, not its square)
    **dict.fromkeys(("scaleddotproductflashattention", "scaleddotproductefficientattention", "scaleddotproductcudnnattention", "scaleddotproductflashattentionforcpu"), ("scaleddotproductattention",)),
}  # fmt: skip
_FLOAT = {"float": "fp32", "float32": "fp32", "c10::half": "fp16", "half": "fp16",
          "c10::bfloat16": "bf16", "bfloat16": "bf16"}  # fmt: skip


def _norm(name: str) -> str:
    """'aten::_scaled_dot_product_attention' -> 'scaleddotproductattention'."""
    return name.rsplit("::", 1)[-1].replace("_", "").lower()


def _is_int(t: TensorMeta) -> bool:
    return "int" in t.dtype.lower() or t.dtype.lower() in ("long", "short", "byte")


@dataclass(frozen=True, slots=True)
class _Query:
    op: str
    dtype: str
    inputs: dict[str, float]


def _model_query(name: str, ins: Sequence[TensorMeta], outs: Sequence[TensorMeta]) -> _Query | None:
    """The kernel-model operator and inputs of a forward op's shapes, or None."""
    sh = [t for t in ins if t.shape]
    if not sh:
        return None
    dt = _FLOAT.get(sh[0].dtype.lower())
    if dt is None:
        return None
    n = _norm(name)
    if n in ("linear", "mm", "addmm", "matmul", "bmm"):
        g = gemm_inputs(n, [t.shape for t in sh])
        return _Query("gemm", dt, g) if g else None
    if n == "conv2d" and len(sh) >= 2 and len(sh[0].shape) == 4 and outs and len(outs[0].shape) == 4:
        x, w, o = sh[0], sh[1], outs[0]
        stride = max(1, round(x.shape[2] / max(1, o.shape[2])))
        return _Query("conv2d", dt, {"n": x.shape[0], "c": x.shape[1], "k": w.shape[0],
                                     "hw": x.shape[2], "r": w.shape[2], "stride": stride})  # fmt: skip
    if n == "batchnorm" and len(sh[0].shape) == 4:
        x = sh[0]
        return _Query("batch_norm", dt, {"n": x.shape[0], "c": x.shape[1], "hw": x.shape[2]})
    if n == "layernorm":
        x = sh[0]
        lead = x.shape[0] if len(x.shape) >= 3 else 1
        return _Query("layernorm", dt, {"b": lead, "l": x.numel // (lead * x.shape[-1]), "dim": x.shape[-1]})
    if n == "crossentropyloss":
        x = sh[0]
        return _Query("cross_entropy", dt, {"n": x.numel // x.shape[-1], "v": x.shape[-1]})
    if n == "scaleddotproductattention" and len(sh[0].shape) == 4:
        bsz, heads, seq, hd = sh[0].shape
        return _Query("attention", dt, {"batch": bsz, "heads": heads, "seq_len": seq, "head_dim": hd})
    if n == "embeddingbag" and len(sh) >= 3:
        w, idx, off = sh[0], sh[1], sh[2]
        bsz = max(1, off.numel)
        return _Query("embedding_bag", dt, {"B": bsz, "E": w.shape[0], "T": 1,
                                            "L": idx.numel / bsz, "D": w.shape[-1]})  # fmt: skip
    if n in ("dropout", "relu", "tanh"):
        return _Query(n, dt, {"numel": max(t.numel for t in sh)})
    return None


class _Resizer:
    def __init__(self, old: int, new: int, timer: OpTimer | None, *, dim: str = "batch",
                 widths: dict[int, int] | None = None, tables: frozenset[int] = frozenset(),
                 param_ratio: float = 1.0, head_size: int | None = None,
                 heads: dict[int, int] | None = None) -> None:  # fmt: skip
        self.old, self.new, self.factor = old, new, new / old
        self.timer = timer
        self.dim = dim  # "batch", "seq" or "hidden"
        # hidden: every width (old -> new; hidden, its multiples, the head size), the tensor ids
        # of embedding tables (rows kept, width resized) and new / old parameter elements
        self.widths, self.tables, self.param_ratio = widths or {}, tables, param_ratio
        # hidden with the head size kept: the head counts (old -> new) of [B, h, S, d] tensors
        self.head_size, self.heads = head_size, heads or {}
        self._cache: dict[tuple[str, str, str, tuple[tuple[str, float], ...]], float | None] = {}

    # --- shapes ---------------------------------------------------------------------------
    def tensor(self, t: TensorMeta, params: set[int], table_shapes: frozenset[tuple[int, ...]] = frozenset()) -> TensorMeta:
        if self.dim == "hidden":  # parameters too: their widths are the model's
            if not t.shape:
                return t
            if (t.tensor_id is not None and t.tensor_id in self.tables) or t.shape in table_shapes:  # [rows, width]
                shape = (*t.shape[:-1], self.widths.get(t.shape[-1], t.shape[-1]))
            elif self.heads and len(t.shape) in (4, 5) and self.head_size and t.shape[-1] in (
                    self.head_size, self.head_size // 2):  # RoPE's half-head slices too
                # per-head tensors, [B, h, S, d] or [B, S, h, d] (GQA's expand: [B, kv, rep, S, d]):
                # the head count scales, the head size stays
                at = (1, 2) if len(t.shape) == 4 else (1,)
                shape = tuple(self.heads.get(d, d) if i in at else d if i == len(t.shape) - 1
                              else self.widths.get(d, d) for i, d in enumerate(t.shape))  # fmt: skip
            else:
                shape = tuple(self.widths.get(d, d) for d in t.shape)
            return t if shape == t.shape else replace(t, shape=shape)
        if not t.shape or (t.tensor_id is not None and t.tensor_id in params):
            return t
        if self.dim == "seq":
            shape = tuple(self.new if d == self.old
                          else d // self.old * self.new if i == 0 and d > self.old and d % self.old == 0
                          else d for i, d in enumerate(t.shape))  # fmt: skip
            return t if shape == t.shape else replace(t, shape=shape)
        d0 = t.shape[0]
        if d0 > 0 and d0 % self.old == 0:
            new0 = d0 // self.old * self.new
        elif len(t.shape) == 1 and _is_int(t) and d0 > 0:
            new0 = max(1, round(d0 * self.factor))
        else:
            return t
        return replace(t, shape=(new0, *t.shape[1:]))

    # --- models -----------------------------------------------------------------------------
    def time(self, q: _Query, phase: str) -> float | None:
        if self.timer is None:
            return None
        key = (q.op, phase, q.dtype, tuple(sorted(q.inputs.items())))
        if key not in self._cache:
            try:
                s, prov = self.timer(q.op, phase, q.dtype, **q.inputs)
                ok = s > 0.0 and math.isfinite(s) and "extrapolated" not in prov
                self._cache[key] = s if ok else None
            except TrainsimError:
                self._cache[key] = None
        return self._cache[key]

    def model_ratio(self, old: _Query | None, new: _Query | None, phase: str) -> tuple[float, str] | None:
        if old is None or new is None or old.op != new.op:
            return None
        t0, t1 = self.time(old, phase), self.time(new, phase)
        if t0 is None or t1 is None:
            return None
        return t1 / t0, f"model {old.op} {phase}"

    def predict(self, old: Op, new: Op, phase: str) -> tuple[float, str]:
        """A kernel model's ratio for the op, else the element-wise model's at its largest
        batch-sized tensor, else the ratio of batch-sized elements; clamped to [1, work]."""
        pairs = _changed(old, new)
        if not pairs:
            return 1.0, "weight-sized"
        s0 = sum(a.numel for a, _ in pairs)
        work = sum(b.numel for _, b in pairs) / s0 if s0 else self.factor
        q0, q1 = _model_query(old.name, old.inputs, old.outputs), _model_query(new.name, new.inputs, new.outputs)
        if q0 is not None and q1 is not None and q0.op == q1.op and q0.op in _FLOPS:
            # work by FLOPs where they outgrow the elements: attention's s², a GEMM whose
            # weight is resized too (hidden: h² FLOPs on h-sized tensors)
            flops = _FLOPS[q0.op](q1) / _FLOPS[q0.op](q0)
            work = max(work, flops) if flops >= 1.0 else min(work, flops)
        got = self.model_ratio(q0, q1, phase)
        if got is None:  # a multi-tensor (foreach) kernel sweeps all its tensors: their sum
            agg = sum if "_foreach_" in old.name else max
            n0 = agg(a.numel for a, _ in pairs)
            n1 = agg(b.numel for _, b in pairs)
            dt = next((_FLOAT[a.dtype.lower()] for a, _ in pairs if a.dtype.lower() in _FLOAT), "fp32")
            got = self.model_ratio(_Query("elementwise", dt, {"numel": n0}),
                                   _Query("elementwise", dt, {"numel": n1}), phase)  # fmt: skip
        if got is None:
            return work, "numel"
        lo, hi = min(1.0, work), max(1.0, work)
        r = min(hi, max(lo, got[0]))
        return r, got[1] if r == got[0] else f"{got[1]} clamped to work ×{work:.4g}"


def _attention_flops(q: _Query) -> float:
    x = q.inputs
    return x["batch"] * x["heads"] * x["seq_len"] ** 2 * x["head_dim"]


def _gemm_flops(q: _Query) -> float:
    x = q.inputs
    return x["batch"] * x["m"] * x["n"] * x["k"]


_FLOPS: dict[str, Callable[[_Query], float]] = {"attention": _attention_flops, "gemm": _gemm_flops}


def _changed(old: Op, new: Op) -> list[tuple[TensorMeta, TensorMeta]]:
    """(old, new) tensor pairs of the op whose shape the resize changed."""
    return [(a, b) for a, b in zip((*old.inputs, *old.outputs), (*new.inputs, *new.outputs),
                                   strict=True) if a.shape != b.shape]  # fmt: skip


def _param_ids(rg: RankGraph) -> set[int]:
    """Tensor ids the optimizer updates in place: the first input of its in-place ops, or the
    whole first list of a foreach one (``aten::_foreach_add_(params, grads)``, the two lists
    flattened: its first half; review 2026-11-27: taking the first input only left every other
    weight to be resized as an activation). The other inputs are left out: gradient tensor ids
    are recycled for activations in the traces (an H100 LLaMA capture's [4, 2048, 4096]
    activations share ids with its gradients), parameters live the whole step."""
    out: set[int] = set()
    for op in rg.ops:
        if op.annotation.startswith("Optimizer.") and op.inputs and op.name.endswith("_"):
            shaped = [t for t in op.inputs if t.shape]
            first = shaped[: max(1, len(shaped) // 2)] if "_foreach_" in op.name else op.inputs[:1]
            out.update(t.tensor_id for t in first if t.tensor_id is not None)
    return out


def _pair_backward(rg: RankGraph) -> dict[int, tuple[int, bool]]:
    """Backward node index -> (index of the forward op it differentiates, whether that op is of
    the node's kind; see the module doc). By autograd's sequence numbers where the trace has
    them, else by position (always of its kind)."""
    forward: dict[str, list[int]] = defaultdict(list)
    backward: dict[str, list[int]] = defaultdict(list)
    for i, op in enumerate(rg.ops):
        m = _BWD.match(op.name)
        if m:
            backward[m.group(1).replace("_", "").lower()].append(i)
        elif not op.name.startswith("autograd::") and op.inputs:
            forward[_norm(op.name)].append(i)
    pairs: dict[int, tuple[int, bool]] = {}
    for key, nodes in backward.items():
        cands = sorted(i for name in _BWD_FORWARD.get(key, (key,)) for i in forward.get(name, ()))
        if not cands:
            continue
        n_fwd, n_bwd = len(cands), len(nodes)
        for k, node in enumerate(nodes):
            pairs[node] = cands[(n_bwd - 1 - k) * n_fwd // n_bwd], True
    for node, pair in _pair_by_sequence(rg, backward).items():
        if pair is None:
            pairs.pop(node, None)
        else:
            pairs[node] = pair
    return pairs


def _pair_by_sequence(rg: RankGraph, backward: dict[str, list[int]]) -> dict[int, tuple[int, bool] | None]:
    """The pairs autograd's sequence numbers give (Kineto's "Sequence number", the link the
    profiler itself draws from forward to backward): a backward node carries the number its
    forward op drew when it created the node, and every top-level forward op in grad mode
    records the counter as it started, so the node's op is the last numbered forward op (issue
    order, on the forward thread: the thread with the most numbered ops, the counter being per
    thread) whose number is at most the node's. It may be of another kind (a ``MulBackward0`` of
    a step inside ``scaled_dot_product_attention``'s math path): then an op of the node's kind
    issued unnumbered right after it is taken instead (PyTorch before 2.4 numbered no op under
    autocast), else the pair says so. None: a numbered node with no op to pair — its op came
    before the traced window, or recorded no shapes. Empty where the forward thread's numbers do
    not rise in issue order."""
    import bisect
    from itertools import pairwise

    by_thread: dict[int, list[tuple[int, int]]] = defaultdict(list)  # thread -> (number, op index)
    for i, op in enumerate(rg.ops):
        if op.seq_nr is not None and not op.name.startswith("autograd::"):
            by_thread[op.thread].append((op.seq_nr, i))
    if not by_thread:
        return {}
    seqs, idx = zip(*max(by_thread.values(), key=len), strict=True)
    if any(a > b for a, b in pairwise(seqs)):
        return {}
    out: dict[int, tuple[int, bool] | None] = {}
    for key, nodes in backward.items():
        kinds = _BWD_FORWARD.get(key, (key,))
        for node in nodes:
            s = rg.ops[node].seq_nr
            if s is None:
                continue
            k = bisect.bisect_right(seqs, s) - 1
            if k < 0 or idx[k] > node:  # created before the traced window
                out[node] = None
                continue
            j = idx[k]
            same = _norm(rg.ops[j].name) in kinds
            if not same:
                stop = min(idx[k + 1] if k + 1 < len(idx) else node, node)
                alt = [i for i in range(j + 1, stop) if rg.ops[i].seq_nr is None and rg.ops[i].thread == rg.ops[j].thread
                       and _norm(rg.ops[i].name) in kinds]  # fmt: skip
                if len(alt) == 1:
                    j, same = alt[0], True
            shaped = any(t.shape for t in (*rg.ops[j].inputs, *rg.ops[j].outputs))
            out[node] = (j, same) if shaped else None
    return out


def _resize_rank(rg: RankGraph, rz: _Resizer) -> RankGraph:
    params = _param_ids(rg)
    new_ops = [
        replace(op, inputs=tuple(rz.tensor(t, params, ts) for t in op.inputs),
                outputs=tuple(rz.tensor(t, params, ts) for t in op.outputs))
        if rz.dim == "hidden" or not op.annotation.startswith("Optimizer.") else op
        for op in rg.ops for ts in [_table_shapes(op, rz.tables)]
    ]  # fmt: skip
    pairs = _pair_backward(rg)
    out: list[Op] = []
    for i, (old, new) in enumerate(zip(rg.ops, new_ops, strict=True)):
        ratio, rule = _ratio(i, old, new, olds=rg.ops, news=new_ops, pairs=pairs, rz=rz)
        out.append(_apply(new, ratio, rule))
    return replace(rg, ops=tuple(out))


def _table_shapes(op: Op, tables: frozenset[int]) -> frozenset[tuple[int, ...]]:
    """Shapes of the embedding tables among ``op``'s tensors: the op's other tensors of that
    shape are the table's gradient or optimizer state (``add_(table, grad)``), rows kept too."""
    if not tables:
        return frozenset()
    return frozenset(t.shape for t in (*op.inputs, *op.outputs) if t.tensor_id is not None and t.tensor_id in tables)


def _ratio(i: int, old: Op, new: Op, *, olds: Sequence[Op], news: Sequence[Op],
           pairs: dict[int, tuple[int, bool]], rz: _Resizer) -> tuple[float, str]:  # fmt: skip
    if old.annotation.startswith("Optimizer."):
        if rz.dim != "hidden":
            return 1.0, "optimizer (weight-sized)"
        r, rule = rz.predict(old, new, "fwd")  # the parameters it updates were resized
        return r, f"optimizer {rule}"
    m = _BWD.match(old.name)
    if m is not None:
        key = m.group(1).replace("_", "").lower()
        if key in _VIEW_BWD and not old.kernels and not old.moved_data:
            return 1.0, "view"
        if key == "accumulategrad":
            if rz.dim == "hidden":  # which parameter is not recorded: the mean
                return rz.param_ratio, "AccumulateGrad (parameter elements)"
            return 1.0, "AccumulateGrad (weight-sized)"
        pair = pairs.get(i)
        if pair is None:  # its work taken as proportional
            return rz.factor, f"{rz.dim} (unpaired backward)"
        j, same_kind = pair
        if not same_kind:  # a step inside op j: no model of its own, its work proportional too
            return rz.factor, f"{rz.dim} (a backward step inside op {olds[j].id} {olds[j].name})"
        fo = olds[j]
        r, rule = rz.predict(fo, news[j], "bwd")
        return r, f"{rule} (of op {fo.id} {fo.name})"
    if _norm(old.name) in _VIEW_OPS and not old.kernels and not old.moved_data:
        return 1.0, "view"
    return rz.predict(old, new, "fwd")


def _apply(op: Op, ratio: float, rule: str) -> Op:
    tag = f"{RESIZE} ×{ratio:.4g} {rule}"
    if op.kernels:
        ks = []
        for k in op.kernels:
            base = k.predicted_s if k.predicted_s is not None else k.duration_s
            if base is None:
                ks.append(k)
                continue
            prev = k.provenance or ("measured" if k.duration_s is not None else "predicted")
            ks.append(replace(k, predicted_s=base * ratio, provenance=f"{tag} of {prev}"))
        return replace(op, kernels=tuple(ks))
    base = op.predicted_s if op.predicted_s is not None else op.duration_s
    if base is None:
        return op
    prev = op.provenance or "measured"
    return replace(op, predicted_s=base * ratio, provenance=f"{tag} of {prev}")


def rule_of(provenance: str) -> str:
    """The rule named in a resize provenance ('model gemm bwd', 'view', ...)."""
    rule = provenance.split(" ", 2)[2] if provenance.startswith(RESIZE) else provenance
    return rule.split(" (of op")[0].split(" (a backward step")[0].split(" clamped")[0].split(" of ")[0]


def _op_time(op: Op) -> float:
    """An op's traced device time (its kernels'), or its CPU time when it launched none."""
    if op.kernels:
        return sum(k.duration_s or 0.0 for k in op.kernels if not k.family.is_communication)
    return op.duration_s or 0.0


def _needs_no_shapes(op: Op, *, hidden: bool = False) -> bool:
    """Ops whose rule is their name (:func:`_ratio`: the optimizer's, but for a hidden resize,
    which changes the parameters; AccumulateGrad, views): resized right without shapes."""
    if op.annotation.startswith("Optimizer."):
        return not hidden
    m = _BWD.match(op.name)
    if m is not None:
        key = m.group(1).replace("_", "").lower()
        return key == "accumulategrad" or (key in _VIEW_BWD and not op.kernels and not op.moved_data)
    return _norm(op.name) in _VIEW_OPS and not op.kernels and not op.moved_data


def _shaped_time_fraction(w: Workload, *, hidden: bool = False) -> float | None:
    """The share of the traced op time in ops the resize can re-predict: ops that recorded a
    tensor shape, backward nodes whose paired forward op did (:func:`_pair_backward`; nodes
    never carry shapes), and ops whose rule is their name (or the ops' share when no time was
    traced; None for an empty workload)."""
    total = shaped = 0.0
    count = with_shapes = 0
    for rg in w.ranks:
        own = [bool(op.inputs or op.outputs) for op in rg.ops]  # recorded tensors (0-d ones too)
        pairs = _pair_backward(rg)  # a backward node is resized through the forward op it pairs with
        for i, op in enumerate(rg.ops):
            pair = pairs.get(i)
            has = own[i] or (pair is not None and own[pair[0]]) or _needs_no_shapes(op, hidden=hidden)
            t = _op_time(op)
            total += t
            shaped += t if has else 0.0
            count += 1
            with_shapes += has
    if total > 0:
        return shaped / total
    return with_shapes / count if count else None


def resize_batch(w: Workload, new_batch: int, *, old_batch: int, timer: OpTimer | None = None) -> Workload:
    """``w`` (captured at batch ``old_batch`` per rank) at batch ``new_batch`` per rank.

    ``timer(op, phase, dtype, **inputs) -> (seconds, provenance)`` answers kernel-model
    queries for the workload's device (e.g. :class:`trainsim.builders.dlrm.Coster`'s ``time``);
    without it only the shape rules apply (``numel``). ``metadata["resize"]`` records the
    request, how many ops each rule re-predicted and ``shaped_time_fraction``, the share of the
    traced time in ops with recorded shapes (the others cannot be resized and keep their times);
    a trace with no shapes at all is refused.
    """
    for flag, v in (("--batch-size", new_batch), ("captured batch size", old_batch)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{flag} must be a positive integer, got {v!r}")
    return _resize(w, _Resizer(old_batch, new_batch, timer), "--batch",
                   {"old_batch": old_batch, "new_batch": new_batch})  # fmt: skip


_OTHER_LENGTH = " (resize a capture taken at another length)"  # what a refused --seq-len can do instead


def resize_seq(w: Workload, new_seq: int, *, old_seq: int, batch: int | None = None,
               timer: OpTimer | None = None) -> Workload:  # fmt: skip
    """``w`` (captured at ``old_seq`` tokens per sequence) at ``new_seq`` (module docstring:
    the sequence dimension; ``batch``, the traced batch when known, must differ from
    ``old_seq``). As :func:`resize_batch` otherwise."""
    for flag, v in (("--seq-len", new_seq), ("captured sequence length", old_seq)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{flag} must be a positive integer, got {v!r}")
    if old_seq < 2:
        raise ConfigError("--seq-len: a traced length of 1 cannot be told apart from the unit dimensions")
    if batch is not None and batch % old_seq == 0:
        raise ConfigError(f"--seq-len: the traced batch {batch} is a multiple of the sequence length {old_seq}: a "
                          f"resize cannot tell [B, S] from flattened tokens [B·S]{_OTHER_LENGTH}")  # fmt: skip
    seen = False  # some activation has the traced length (else it was not the traced one)
    for rg in w.ranks:
        params = _param_ids(rg)
        heads: set[int] = set()  # attention head counts whose head size is twice the traced length
        for op in rg.ops:
            q = _model_query(op.name, op.inputs, op.outputs)
            if q is not None and q.op == "attention" and old_seq in (q.inputs["head_dim"], q.inputs["heads"]):
                raise ConfigError(f"--seq-len: the traced sequence length {old_seq} is also the attention head count "
                                  f"or size (op {op.name}): a resize cannot tell them apart{_OTHER_LENGTH}")  # fmt: skip
            if q is not None and q.op == "attention" and q.inputs["head_dim"] == 2 * old_seq:
                heads.add(int(q.inputs["heads"]))
            seen = seen or any(old_seq in t.shape for t in (*op.inputs, *op.outputs)
                               if t.tensor_id is None or t.tensor_id not in params)  # fmt: skip
            for t in (*op.inputs, *op.outputs):
                if t.tensor_id is not None and t.tensor_id in params and old_seq in t.shape:
                    raise ConfigError(f"--seq-len: the traced sequence length {old_seq} is also a dimension of a "
                                      f"parameter {list(t.shape)} (op {op.name}): a resize cannot tell them apart{_OTHER_LENGTH}")  # fmt: skip
        # rotary embeddings work on half-heads ([B, h, S, d/2] slices, rotate_half): at S = d/2
        # those are [B, h, S, S], and a resize would scale the half-head size as a sequence
        for op in rg.ops if heads else ():
            for t in (*op.inputs, *op.outputs):
                if len(t.shape) == 4 and t.shape[-1] == old_seq and {t.shape[1], t.shape[2]} & heads and (
                        t.tensor_id is None or t.tensor_id not in params):  # fmt: skip
                    raise ConfigError(f"--seq-len: the traced sequence length {old_seq} is also half the attention "
                                      f"head size, which {op.name} {list(t.shape)} slices (rotary embeddings): a "
                                      f"resize cannot tell them apart{_OTHER_LENGTH}")  # fmt: skip
    if not seen and any(t.shape for rg in w.ranks for op in rg.ops for t in (*op.inputs, *op.outputs)):
        raise ConfigError(f"--seq-len: no activation of the trace has a dimension of {old_seq}: is that the traced "
                          "sequence length?")  # fmt: skip
    return _resize(w, _Resizer(old_seq, new_seq, timer, dim="seq"), "--seq-len",
                   {"old_seq_len": old_seq, "new_seq_len": new_seq})  # fmt: skip


_EMBEDDING_OPS = frozenset({"embedding", "embeddingbag"})


def resize_hidden(w: Workload, new_hidden: int, *, old_hidden: int | None = None,
                  timer: OpTimer | None = None, scale_heads: bool = False) -> Workload:  # fmt: skip
    """``w`` (one rank of a transformer-like step) with hidden size ``new_hidden`` (module
    docstring: the hidden dimension). ``old_hidden``: the traced one (default: the width of the
    trace's embedding tables, when they agree). ``scale_heads``: the head count scales and the
    head size stays (as model families grow), else the heads stay and the head size scales.
    As :func:`resize_batch` otherwise."""
    for flag, v in (("--hidden", new_hidden), ("--old-hidden", old_hidden)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(f"{flag} must be a positive integer, got {v!r}")
    if len(w.ranks) != 1:
        raise ConfigError(f"--hidden: resizes the step of one rank (the payloads of a multi-rank step's collectives are "
                          f"not derived from shapes); this trace has {len(w.ranks)} ranks")  # fmt: skip
    comm = sum(1 for op in w.ranks[0].ops if any(k.family.is_communication for k in op.kernels))
    if comm:
        raise ConfigError(f"--hidden: resizes a step without collectives (their payloads are not derived from shapes); "
                          f"this rank runs {comm} collective ops")  # fmt: skip
    rg = w.ranks[0]
    tables: set[int] = set()
    rows: dict[int, int] = {}  # table tensor id -> its rows
    table_widths: set[int] = set()
    tokens: dict[int, str] = {}  # the lookups' index dimensions (batch, sequence) and their product
    heads: set[int] = set()  # head counts: the queries', and the keys' and values' (GQA)
    head_dims: set[int] = set()
    seqs: set[int] = set()  # sequence lengths: the queries' [B, h, S, d], the lookups' [B, S]
    vocab: int | None = None  # the loss's classes
    for op in rg.ops:
        n = _norm(op.name)
        sh = [t for t in op.inputs if t.shape]
        if n in _EMBEDDING_OPS and len(sh) >= 2 and len(sh[0].shape) == 2:
            if sh[0].tensor_id is not None:
                tables.add(sh[0].tensor_id)
                rows[sh[0].tensor_id] = sh[0].shape[0]
            table_widths.add(sh[0].shape[1])
            idx = sh[1].shape
            names = ("batch", "sequence length") if len(idx) == 2 else ("index count",) * len(idx)
            if len(idx) == 2:
                seqs.add(idx[1])
            for d, name in zip(idx, names, strict=True):
                tokens.setdefault(d, name)
            tokens.setdefault(math.prod(idx), "tokens per step")
            if n == "embeddingbag" and len(sh) >= 3:  # offsets: one per bag (the batch)
                tokens.setdefault(sh[2].numel, "bags")
        q = _model_query(op.name, op.inputs, op.outputs)
        if q is not None and q.op == "attention":
            heads.update(int(t.shape[1]) for t in sh[:3] if len(t.shape) == 4)
            head_dims.add(int(q.inputs["head_dim"]))
            seqs.add(int(q.inputs["seq_len"]))
        elif q is not None and q.op == "cross_entropy" and vocab is None:
            vocab = int(q.inputs["v"])
    if not head_dims:
        raise ConfigError("--hidden: resizes transformer-like steps, whose attention op "
                          "(aten::scaled_dot_product_attention) gives the head size; this trace has none")  # fmt: skip
    if old_hidden is None:
        if len(table_widths) != 1:
            raise ConfigError("--hidden: which width was traced? give --old-hidden (" + (
                f"the embedding tables are {sorted(table_widths)} wide)" if table_widths
                else "the trace has no embedding lookup to read it from)"))  # fmt: skip
        old_hidden = next(iter(table_widths))
    elif table_widths and old_hidden not in table_widths:
        raise ConfigError(f"--old-hidden {old_hidden}: the trace's embedding tables are {sorted(table_widths)} wide, "
                          "which is its hidden size")  # fmt: skip
    h = old_hidden
    params = _param_ids(rg)
    param_shapes: dict[int, tuple[int, ...]] = {}
    for op in rg.ops:
        for t in (*op.inputs, *op.outputs):
            if t.shape and t.tensor_id is not None and t.tensor_id in params:
                param_shapes[t.tensor_id] = t.shape
    if not param_shapes:
        raise ConfigError("--hidden: the trace names no parameter (the optimizer's updates carry no tensor ids: keep "
                          "the execution trace beside the Kineto trace, as `trainsim capture` does, and drop --no-et)")  # fmt: skip
    if not any(h in s for s in param_shapes.values()):
        raise ConfigError(f"--hidden: no parameter of the trace has a dimension of {h}: is that the traced hidden size?")
    if vocab is None and rows:
        vocab = max(rows.values())  # no loss recorded: the largest table's rows
    if vocab == h:
        raise ConfigError(f"--hidden: the traced hidden size {h} is also the vocabulary: a resize cannot tell them apart")
    # widths: the hidden size, every dimension of a parameter but an embedding table's rows and
    # the vocabulary (an untied lm head's [V, H]), and the attention head size; never 1
    dims = {d for i, s in param_shapes.items() for d in (s[-1:] if i in tables else s)}
    odd = sorted(s for i, s in param_shapes.items()  # (a [V] bias is the head's)
                 if i not in tables and len(s) == 2 and vocab in s and sorted(s) != sorted((vocab, h)))
    if odd:
        raise ConfigError(f"--hidden: the vocabulary {vocab} is also a dimension of a parameter {list(odd[0])} that is "
                          "not an lm head: a resize cannot tell a width from it")  # fmt: skip
    head_counts: dict[int, int] = {}
    if scale_heads:
        if len(head_dims) != 1:
            raise ConfigError(f"--scale-heads: the attention ops have head sizes {sorted(head_dims)}: one is kept")
        hd = next(iter(head_dims))
        also = ("a unit dimension" if hd == 1 else "the hidden size" if hd == h
                else "a width of the parameters (one key/value head?)" if hd in dims else "")  # fmt: skip
        if also:
            raise ConfigError(f"--scale-heads: the head size {hd} is also {also}: a resize cannot keep the one and "
                              "scale the other")  # fmt: skip
        if 1 in heads:
            raise ConfigError("--scale-heads: one key/value head (multi-query attention) cannot be told apart from "
                              "unit dimensions")  # fmt: skip
        # GQA repeats the key/value heads before the attention op in some traces: every count
        # beside the head size in a per-head tensor ([B, h, S, d], [B, S, h, d], [B, kv, rep, S, d])
        for op in rg.ops:
            for t in (*op.inputs, *op.outputs):
                if len(t.shape) in (4, 5) and t.shape[-1] in (hd, hd // 2):
                    heads.update(d for d in (t.shape[1:3] if len(t.shape) == 4 else t.shape[1:2]) if d not in seqs)
        heads.discard(1)  # unit dimensions (a mask's, rotary tables')
        for c in sorted(heads):
            if (c * new_hidden) % h:
                raise ConfigError(f"--hidden {new_hidden} --scale-heads: the traced head count {c} would become "
                                  f"{c * new_hidden / h:g}; choose a multiple of {h // math.gcd(c, h)}")  # fmt: skip
            head_counts[c] = c * new_hidden // h
        seq = sorted(heads & seqs)
        if seq:
            raise ConfigError(f"--scale-heads: the traced head count {seq[0]} is also the sequence length: a resize "
                              "cannot tell them apart in [B, h, S, d] tensors")  # fmt: skip
    named = {d: "width" for d in dims if d != vocab} | {h: "hidden size"}
    if not scale_heads:
        named |= dict.fromkeys(head_dims, "head size")
    named.pop(1, None)
    widths: dict[int, int] = {}
    for d in sorted(named):
        if (d * new_hidden) % h:
            raise ConfigError(f"--hidden {new_hidden}: the traced {named[d]} {d} would become {d * new_hidden / h:g} "
                              f"(every width scales with the hidden size {h}); choose a multiple of {h // math.gcd(d, h)}")  # fmt: skip
        widths[d] = d * new_hidden // h
    others = {**({} if scale_heads else dict.fromkeys(heads, "head count")), **tokens}
    others.pop(1, None)
    clash = sorted(set(named) & set(others))
    if clash:
        d = clash[0]
        hint = "; --scale-heads keeps the head size" if named[d] == "head size" else ""
        raise ConfigError(f"--hidden: the traced {named[d]} {d} is also the trace's {others[d]}: a resize cannot tell "
                          "them apart (a trace whose batch, sequence length, their product and head count differ from "
                          f"every width can be resized{hint})")  # fmt: skip
    old_elems = sum(math.prod(s) for s in param_shapes.values())
    new_elems = sum(math.prod((*s[:-1], widths.get(s[-1], s[-1])) if i in tables else tuple(widths.get(d, d) for d in s))
                    for i, s in param_shapes.items())  # fmt: skip
    rz = _Resizer(h, new_hidden, timer, dim="hidden", widths=widths, tables=frozenset(tables),
                  param_ratio=new_elems / old_elems if old_elems else 1.0,
                  head_size=next(iter(head_dims)) if scale_heads else None, heads=head_counts)  # fmt: skip
    return _resize(w, rz, "--hidden", {"old_hidden": h, "new_hidden": new_hidden,
                                       "widths": {str(a): b for a, b in widths.items()},
                                       "heads": {str(a): b for a, b in head_counts.items()} or "kept"})  # fmt: skip


def _kept_collectives(ranks: Sequence[RankGraph]) -> dict[str, int]:
    """Collective ops (by kind, all ranks) whose traced time the resize kept without knowing
    their payload: no recorded shapes and no rule that re-timed them (a backward all_to_all
    paired with its forward's wait, e.g. the DLRM's). Not counted: ops re-timed by their
    shapes (the forward all_to_alls), ops whose recorded payload did not change (a scalar
    all-reduce), gradient all-reduces inside AccumulateGrad and gloo bucket records (DDP's
    buckets are weight-sized)."""
    kept: dict[str, int] = defaultdict(int)
    for r in ranks:
        for op in r.ops:
            ks = [k for k in op.kernels if k.collective is not None]
            if not ks or op.is_worker_record:
                continue
            prov = ks[0].provenance or ""
            if prov.startswith(RESIZE) and not prov.startswith(f"{RESIZE} ×1 "):
                continue  # re-timed by the resize
            if "AccumulateGrad" in prov or any(t.shape for t in (*op.inputs, *op.outputs)):
                continue  # a gradient bucket, or a payload whose recorded size stayed
            kept[ks[0].collective.kind.value] += 1  # type: ignore[union-attr]
    return dict(sorted(kept.items()))


def _resize(w: Workload, rz: _Resizer, flag: str, request: dict[str, Any]) -> Workload:
    shaped = _shaped_time_fraction(w, hidden=rz.dim == "hidden")
    if not any(t.shape for rg in w.ranks for op in rg.ops for t in (*op.inputs, *op.outputs)):
        raise ConfigError(f"{flag}: the trace records no tensor shapes, so nothing can be resized (profile with "
                          "record_shapes=True, or keep the execution trace beside it, as `trainsim capture` does)")  # fmt: skip
    ranks = tuple(_resize_rank(r, rz) for r in w.ranks)
    rules: dict[str, int] = defaultdict(int)
    for r in ranks:
        for op in r.ops:
            prov = op.provenance if not op.kernels else (op.kernels[0].provenance or "")
            if prov.startswith(RESIZE):
                rules[rule_of(prov)] += 1
    kept = _kept_collectives(ranks)
    meta = {**w.metadata, "resize": {**request, "factor": rz.factor, "rules": dict(sorted(rules.items())),
                                     "shaped_time_fraction": shaped, "collectives_kept": sum(kept.values()),
                                     "collectives_kept_kinds": kept}}  # fmt: skip
    return replace(w, ranks=ranks, metadata=meta)
