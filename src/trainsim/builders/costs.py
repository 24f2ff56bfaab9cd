"""What each operator of a transformer costs on one GPU: kernel-model queries per layer and stage.

A transformer layer is decomposed into paper 001's operators (Table I) — norm, QKV projection
(``linear1``), rotary embedding, the attention core (FlashAttention; or QK^T ``baddbmm``, the
fused scale-mask-softmax and ·V ``bmm``; or the unfused chain with ``fillmask`` and
``softmax``), output projection (``linear2``), residual add, second norm, MLP up (``linear3``),
activation (``gelu``), MLP down (``linear4``), residual add — each forward and backward, each
timed by the device's kernel models (:mod:`trainsim.kernels`: calibrated on micro-benchmarks
where they exist, spec-based rooflines otherwise). The first stage adds the embedding, the last
the final norm, the output projection (``linear_final``) and the parallel cross-entropy.

Shapes outside 001's operator set are **scaled from a sister operator** (one documented
approximation): a GQA QKV projection from ``linear1``, a SwiGLU/odd-width MLP from
``linear3``/``linear4``/``gelu``, another vocabulary from ``linear_final``/``cross_entropy``, each
by the ratio of FLOPs (GEMMs) or elements (element-wise) — the sister's measured efficiency
applied to the new width. Their provenance gains ``;scaled-from:<op>``.

Tensor-parallel and sequence-parallel communication is not here (see
:mod:`trainsim.builders.llm_comm`); it is synchronous in Megatron and adds to these times.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import cast

from trainsim.builders.bench_costs import BenchCalibration, BenchTranslator, bench_calibration
from trainsim.builders.plan import Plan
from trainsim.builders.spec import ModelSpec
from trainsim.errors import ModelError
from trainsim.hardware import DeviceSpec, get_device, list_devices
from trainsim.kernels import predict_query, query
from trainsim.kernels.rescaled import RESCALED, edited_catalog_device, roofline_ratio, same_roofline

_SEED001_VOCAB = 50257  # the vocabulary paper 001 benchmarked linear_final / cross-entropy with
FLASH_BWD_WORK = 2.5  # FlashAttention-2 §3.2: backward = 5 of the forward's 2 products (+ recompute)
FLASH_BWD_PLAUSIBLE = 1.5  # a measured backward below this multiple of its forward is a timing failure
# The least memory traffic of a mixed-precision Adam step, per parameter: the fp32 master weight,
# first and second moments each read and written (24 B), the 16-bit gradient read and the 16-bit
# weight written (4 B). No step can beat it at the device's peak bandwidth.
ADAM_MIN_BYTES_PER_PARAM = 28


@dataclass(frozen=True, slots=True)
class OpCost:
    """One operator of one pass: name, seconds, where the number came from, its FLOPs."""

    name: str
    phase: str  # fwd | bwd
    seconds: float
    provenance: str
    flops: float = 0.0
    category: str = "compute"  # compute | attention | memory
    launches: int = 1  # framework ops (each launching its kernels) the CPU dispatches for it


@dataclass(slots=True)
class PassCost:
    """A list of operator costs (one layer's forward, a stage's extras, ...)."""

    ops: list[OpCost] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(o.seconds for o in self.ops)

    @property
    def flops(self) -> float:
        return sum(o.flops for o in self.ops)

    def extend(self, other: Iterable[OpCost]) -> None:
        self.ops.extend(other)


_MISSING = object()


class OpCoster:
    """Kernel-model answers for paper 001's operators on one device, cached.

    Calibrated models are looked up for the device; when there are none for it, a sibling
    device of the same architecture and tensor-core peak that has them answers (e.g. the
    A100-SXM4-40GB from the 80 GB part's micro-benchmarks) and the provenance says
    ``;transferred-from:<device>``. bf16 queries fall back to the fp16 entries on devices whose
    fp16 and bf16 peaks are equal (``;as-fp16``). A device with a shipped ``trainsim bench``
    calibration (:mod:`trainsim.builders.bench_costs`) answers from its own measurements before
    any sibling's (``;bench-as:<op>``); ``bench=False`` skips it. A device without one borrows a
    sibling's (the H200 the H100's: the same silicon, clocks and power as the SXM part, where
    the GH200's 001 data, the other sibling, is a different module with broken FlashAttention
    backward rows), with ``;transferred-from:<sibling>``, so its memory-bound answers are
    scaled by the two bandwidths like any sibling's; the order is then the device's own 001
    data, the sibling's bench sample, other siblings' 001 data, the roofline. A device with
    calibrated models of its own (GH200's 001 data, a user's artifact) borrows no sample.
    """

    def __init__(self, device: DeviceSpec | str, *, bench: bool = True) -> None:
        self.device = get_device(device) if isinstance(device, str) else device
        self._cached = lru_cache(maxsize=4096)(self._predict)
        self._bandwidth_ratio: dict[tuple[str, bool], float] = {}
        self._bench: BenchTranslator | None = None
        # the device whose bench calibration answers: this one, or a sibling without which
        # only 001 data of another sibling would (an H200 from the H100's own sample)
        self.bench_device: DeviceSpec | None = None
        self._bench_note = ""
        # an edited copy's catalog part: its siblings answer for the copy as they do for the
        # part, carried to the copy's roofline (an H200 or A100-40GB copy with other peaks
        # had matched no sibling, its fp16 peak no longer equal, and gone spec-based whole)
        self._catalog = edited_catalog_device(self.device)
        cal: BenchCalibration | None = None
        if bench:
            source: DeviceSpec | None = self.device
            cal = bench_calibration(self.device)
            if cal is None and not _has_own_models(self.device):  # GH200 keeps its 001 data alone
                cal, source = _sibling_bench(self._catalog or self.device)
                if cal is not None and source is not None:
                    self._bench_note = f";transferred-from:{source.name}"
            if cal is not None:
                self._bench, self.bench_device = BenchTranslator(cal), source
        # an edited YAML copy of a catalog device (its peaks or bandwidth): the bench sample
        # measured the catalog part, so its answers move by the roofline ratio, as the learned
        # models' do in kernels.registry.models_for (trainsim.kernels.rescaled)
        # (not when this device is the very device file the sample measured)
        self._edited_from = (self._catalog if cal is not None and not self._bench_note
                             and not same_roofline(cal.device, self.device) else None)  # fmt: skip
        self._shaped: dict[tuple[object, ...], tuple[OpCost, ...]] = {}
        self._kept: dict[tuple[object, ...], object] = {}  # kept()'s

    SHAPED_MAX = 4096  # layer / embedding / head operator lists kept (oldest dropped first)

    def shaped(self, key: tuple[object, ...], make: Callable[[], list[OpCost]]) -> list[OpCost]:
        """``make()``, kept under ``key`` (:class:`LayerCoster`'s operator lists per plan
        shape); a fresh list of the frozen costs each call."""
        ops = self._shaped.get(key)
        if ops is None:
            while len(self._shaped) >= self.SHAPED_MAX:
                del self._shaped[next(iter(self._shaped))]
            ops = self._shaped[key] = tuple(make())
        return list(ops)

    def kept(self, key: tuple[object, ...], make: Callable[[], object]) -> object:
        """``make()``, kept under ``key`` (an immutable per-shape result a caller derives from
        :meth:`shaped` lists; oldest dropped first, as those)."""
        hit = self._kept.get(key, _MISSING)
        if hit is _MISSING:
            while len(self._kept) >= self.SHAPED_MAX:
                del self._kept[next(iter(self._kept))]
            hit = self._kept[key] = make()
        return hit

    def time(self, op: str, phase: str, dtype: str, *, bench: dict[str, float] | None = None,
             bench_op: str | None = None, **inputs: float) -> tuple[float, str]:  # fmt: skip
        """Seconds and provenance of 001 operator ``op``. For a bench calibration
        (:func:`trainsim.builders.bench_costs.translate`): ``bench``, the exact shape's extra
        inputs; ``bench_op``, the operator the bench times instead of ``op``."""
        extra = tuple(sorted(bench.items())) if bench else ()
        return self._cached(op, phase, dtype, tuple(sorted(inputs.items())), extra=extra, bench_op=bench_op)

    def memory_bound(self, seconds: float, provenance: str) -> tuple[float, str]:
        """A memory-bound operator's answer borrowed from a sibling device, scaled by the two
        devices' memory bandwidths (the sibling matches architecture and tensor-core peak, not
        bandwidth: GH200 4.0 TB/s answering for H100-SXM 3.35 TB/s); others unchanged."""
        marker = ";transferred-from:"
        if marker not in provenance:
            return seconds, provenance
        name = provenance.split(marker, 1)[1].split(";", 1)[0]
        # carried to an edited copy (_to_edited): the roofline ratio took the part to the copy,
        # so the sibling's bandwidth scales to the part's
        to = self._catalog if self._catalog is not None and RESCALED in provenance else self.device
        key = (name, to is self._catalog)  # an edited copy keeps its part's name
        ratio = self._bandwidth_ratio.get(key)
        if ratio is None:  # once per sibling: a search asks this hundreds of thousands of times
            source = get_device(name)
            ratio = self._bandwidth_ratio[key] = source.memory_bandwidth_GBps / to.memory_bandwidth_GBps
        return seconds * ratio, provenance + ";bandwidth-scaled"

    def _candidates(self) -> list[tuple[DeviceSpec, str]]:
        out: list[tuple[DeviceSpec, str]] = [(self.device, "")]
        d = self._catalog or self.device  # an edited copy: its catalog part's siblings
        for other in list_devices():
            if other.name != d.name and other.is_sibling_of(d):
                out.append((other, f";transferred-from:{other.name}"))
        return out

    def _to_edited(self, op: str, dtype: str, inputs: dict[str, float], answer: tuple[float, str]) -> tuple[float, str]:
        """A sibling's answer for the catalog part, carried to this edited copy's roofline
        (``t × roofline_copy / roofline_part``); :meth:`memory_bound` then scales memory-bound
        answers by the sibling's bandwidth over the part's. Unchanged for any other device."""
        if self._catalog is None:
            return answer
        ratio = float(roofline_ratio(op, dtype, inputs, self._catalog, self.device))
        return answer[0] * ratio, f"{answer[1]}{RESCALED}{self.device.name}"

    def _predict(self, op: str, phase: str, dtype: str, items: tuple[tuple[str, float], ...], *,
                 extra: tuple[tuple[str, float], ...], bench_op: str | None) -> tuple[float, str]:  # fmt: skip
        inputs = dict(items)
        dtypes = [dtype]
        if dtype == "bf16" and self.device.peak_flops_per_s("bf16") == self.device.peak_flops_per_s(
            "fp16"
        ):
            dtypes.append("fp16")
        first: tuple[float, str] | None = None
        own = None
        if self._bench is not None:  # the device's own measurements: before a sibling's, or the roofline
            own = self._bench.time(bench_op or op, phase, dtype, {**inputs, **dict(extra)})
            if own is not None and self._bench_note:  # a sibling's sample: memory_bound() scales it
                own = self._to_edited(op, dtype, inputs, (own[0], own[1] + self._bench_note))
            elif own is not None and self._edited_from is not None:  # an edited copy: its roofline
                ratio = float(roofline_ratio(op, dtype, inputs, self._edited_from, self.device))
                if ratio != 1.0:
                    own = (own[0] * ratio, f"{own[1]}{RESCALED}{self.device.name}")
        for dev, note in self._candidates():
            if note and own is not None:
                return own
            for dt in dtypes:
                p = predict_query(query(op, phase=phase, dtype=dt, **inputs), dev)  # type: ignore[arg-type]
                prov = p.provenance + note + (";as-fp16" if dt != dtype else "")
                if p.calibrated:
                    return self._to_edited(op, dtype, inputs, (p.duration_s, prov)) if note else (p.duration_s, prov)
                if first is None and not note:
                    first = (p.duration_s, prov)
        if own is not None:
            return own  # no sibling: the bench calibration still answers before the roofline
        if first is None:  # pragma: no cover - the device's own spec model always answers
            raise ModelError(f"no kernel model answers {op} {phase} on {self.device.name}")
        return first


def _has_own_models(device: DeviceSpec) -> bool:
    """Whether calibrated kernel models of ``device`` itself answer (shipped 001 data, or a
    user's ``--kernel-models``)."""
    from trainsim.kernels.calibrated import LearnedKernelModel
    from trainsim.kernels.registry import models_for

    return any(isinstance(m, LearnedKernelModel) or getattr(m, "calibrated", False) for m in models_for(device))


def _sibling_bench(device: DeviceSpec) -> tuple[BenchCalibration | None, DeviceSpec | None]:
    """The shipped bench calibration of a sibling of ``device`` (same architecture and
    tensor-core peak) and that sibling: the H100's, the one sample shipped; with several, the
    sibling nearest in memory bandwidth (the least to scale); (None, None) when none has."""
    found = [(abs(d.memory_bandwidth_GBps - device.memory_bandwidth_GBps), d.name, d)
             for d in list_devices() if d.name != device.name and d.is_sibling_of(device)]  # fmt: skip
    for _, _, sib in sorted(found, key=lambda f: f[:2]):
        cal = bench_calibration(sib)
        if cal is not None:
            return cal, sib
    return None, None


@dataclass(frozen=True, slots=True)
class HostModel:
    """CPU dispatch time of eager PyTorch training, per transformer layer pass (002 §4.3.3).

    Per framework op, over all top-level ops of the shared A100 production recsys trace
    (hta_recsys_16rank_a100, 002 §4.4.2's IQR-filtered means): ``kernel_op_s`` for an op that
    launches a kernel (T1 + T2 + T4 + T3: 3.1 + 13.3 + 3.9 + 2.4 = 22.7 us; the V100 DLRM traces
    agree: 23.6 us), ``view_op_s`` for one that launches none (views, reshapes, detach: T1 + CPU
    3.1 + 0.8 = 3.9 us). These price ops outside the layers (embedding, head) and DLRM's.

    A layer pass is priced from its parts. Ops per layer are counted in the shared HF GPT-2
    (36-layer) training execution trace (param_et_schemas/hf_gpt2_et), the ops outside the
    layers (embeddings, ln_f, head, loss) left out: top-level aten ops, forward 28 launching + 23
    not (every layer alike), backward 38 + 51, and 65 autograd nodes per layer backward
    (``autograd::engine::evaluate_function``: 53 backward functions and 12 AccumulateGrad;
    ``tests/test_builders_llm.py`` recounts all of them). The same recsys trace gives each
    part's CPU time (the test recomputes them):

    * an aten op, the autograd nodes left out of the means: T1 ``aten_gap_s`` 2.47 us, T2 + T4 +
      T3 ``aten_launch_s`` 10.93 + 3.70 + 2.00 = 16.63 us, a view's CPU ``aten_view_s`` 0.76 us;
    * an autograd node (``autograd_node_s``): the engine's own time around the aten ops the node
      runs (the node's duration less theirs, 8.78 us; 825 of the trace's 1,170 nodes are
      AccumulateGrad running DDP's hook, the others 9.9 us) and the gap to the next node
      (6.55 us), 15.33 us. In the backward the aten ops run inside the nodes, so there they pay
      no gap of their own.

    A forward is ``28 (T1 + T2 + T4 + T3) + 23 (T1 + CPU)`` = 0.61 ms, a backward ``65 node +
    38 (T2 + T4 + T3) + 51 CPU`` = 1.67 ms (before 2026-11-27 the backward priced only its aten
    ops, at the all-op means: 1.07 ms). Both traces were recorded under the profiler, which adds
    a few us per op. Known to be rough: the trace's view ops inside nodes take 1.5-3 us (the
    model's 0.76 us comes mostly from a tight C++ loop of ``as_strided``/``select``), and its
    nodes run 2.7 aten ops each against GPT-2's 1.4.

    ``collective_op_s``: the CPU time of one ``torch.distributed`` collective call (its
    ``c10d::*_`` op: stream-event bookkeeping, NCCL enqueue, the work object), the median per
    kind over the same recsys trace (rank 0: 10 all-reduces, 10 all-gathers, 10
    reduce-scatters, 55 all-to-alls; the V100 DLRM traces give 70-95 us for theirs). The host
    waits for none of the TP collectives: their kernels run when the GPU reaches them. (An
    all-to-all with variable splits first copies its split sizes to the host, a sync; the
    builder keeps MoE all-to-alls added to the pass rather than in the flow shop.)
    """

    kernel_op_s: float = 22.7e-6
    view_op_s: float = 3.9e-6
    fwd_ops: tuple[float, float] = (28, 23)  # (launching, not) per layer forward
    bwd_ops: tuple[float, float] = (38, 51)
    bwd_nodes: float = 65  # autograd nodes per layer backward
    aten_gap_s: float = 2.47e-6
    aten_launch_s: float = 16.63e-6
    aten_view_s: float = 0.76e-6
    autograd_node_s: float = 15.33e-6
    collective_op_s: tuple[tuple[str, float], ...] = (
        ("all_reduce", 77.5e-6), ("all_gather", 81.5e-6), ("reduce_scatter", 98.0e-6), ("all_to_all", 83.0e-6),
    )  # fmt: skip

    def collective_s(self, kind: str) -> float:
        """CPU time of one collective call of ``kind`` (others: the all-reduce's)."""
        costs = dict(self.collective_op_s)
        return costs.get(kind, costs["all_reduce"])

    def layer_s(self, phase: str) -> float:
        """CPU time of one layer's forward (``fwd``) or backward pass (class doc)."""
        if phase == "fwd":
            k, v = self.fwd_ops
            return k * (self.aten_gap_s + self.aten_launch_s) + v * (self.aten_gap_s + self.aten_view_s)
        k, v = self.bwd_ops
        return self.bwd_nodes * self.autograd_node_s + k * self.aten_launch_s + v * self.aten_view_s

    def extra_s(self, op: OpCost) -> float:
        """Ops outside the layers (embedding, head): their launches at the kernel-op rate."""
        return op.launches * self.kernel_op_s


HOST = HostModel()


def flow_shop_s(ops: Iterable[OpCost], cpu_s: Iterable[float] | float, repeat: int = 1) -> float:
    """Time of a pass when the CPU dispatches each op (``cpu_s`` each, or per op) and the GPU
    runs its kernels in order: 002 Alg. 3's two-stage flow shop without gaps. GPU-bound passes
    take the kernels' sum, CPU-bound ones the dispatch sum, mixed ones in between.

    ``repeat`` runs the sequence that many times (a stage's layers), in closed form: with ``C``
    and ``D`` the sequence's CPU and GPU sums, and ``M`` one pass's end, the latest over its ops
    of (CPU time when the op is dispatched + the GPU time from it on), pass ``r`` ends at
    ``max(end of pass r-1 + D, (r - 1) C + M)``, so ``repeat`` passes end at
    ``M + (repeat - 1) max(C, D)`` (the recurrence ``gpu = max(gpu, cpu) + d`` unrolled).
    """
    return flow_shop_repeat(flow_shop_parts(ops, cpu_s), repeat)


def flow_shop_parts(ops: Iterable[OpCost], cpu_s: Iterable[float] | float) -> tuple[float, float, float] | None:
    """One pass's ``(M, C, D)`` of :func:`flow_shop_s` (``None`` for no ops), for a caller that
    repeats one sequence several ways (:func:`flow_shop_repeat`; a search's stages of different depth)."""
    durs = [o.seconds for o in ops]
    cpus = [float(cpu_s)] * len(durs) if isinstance(cpu_s, int | float) else list(cpu_s)
    if len(cpus) != len(durs):
        raise ValueError(f"flow_shop_s: {len(durs)} ops but {len(cpus)} CPU times")
    if not durs:
        return None
    c_sum = sum(cpus)
    d_sum = sum(durs)
    end = cpu = 0.0
    rest = d_sum  # GPU time from op k on
    for c, d in zip(cpus, durs, strict=True):
        cpu += c
        x = cpu + rest
        end = x if x > end else end  # (max() is slower in this hot loop)
        rest -= d
    return end, c_sum, d_sum


def flow_shop_repeat(parts: tuple[float, float, float] | None, repeat: int = 1) -> float:
    """:func:`flow_shop_s` of the sequence whose :func:`flow_shop_parts` are ``parts``."""
    if parts is None or repeat <= 0:
        return 0.0
    end, c_sum, d_sum = parts
    return end + (repeat - 1) * (c_sum if c_sum > d_sum else d_sum)


# TransformerEngine's compute streams, over which GroupedLinear issues its per-expert cuBLAS GEMMs
# (transformer_engine/common/util/multi_stream.cpp: get_num_compute_streams returns 4)
TE_COMPUTE_STREAMS = 4


def expert_gemm_path(plan: Plan, architecture: str) -> str:
    """How ``plan``'s MoE expert GEMMs run on a GPU of ``architecture``: ``sequential``,
    ``multistream``, ``grouped``, ``fallback`` or ``loop`` (:meth:`LayerCoster.expert_gemms`)."""
    if plan.impl == "hf":
        if plan.experts_impl == "eager":
            return "loop"
        return "grouped" if architecture in ("hopper", "blackwell") and plan.dtype == "bf16" else "fallback"
    return "multistream" if plan.moe_grouped_gemm else "sequential"


def _gemm_flops(m: float, n: float, k: float) -> float:
    return 2.0 * m * n * k


# One layer's (and the embedding's and head's) operators do not depend on how the plan
# pipelines, replicates or shards the model, nor on its batch count: a search's plans share
# them, so the coster keeps them per (model, plan with these fields at their defaults, part).
_NOT_SHAPING = {"pp": 1, "dp": 1, "zero": 0, "global_batch": 0, "schedule": "1f1b", "vpp": 1,
                "partition": "even", "optimizer": "adam"}  # fmt: skip


class LayerCoster:
    """Per-GPU operator costs of ``model`` under ``plan`` for one micro-batch."""

    def __init__(self, model: ModelSpec, plan: Plan, coster: OpCoster) -> None:
        self.model, self.plan, self.c = model, plan, coster
        self.t = plan.tp
        self.b = plan.micro_batch
        self.l = plan.seq(model) // plan.cp  # context parallelism splits the sequence
        self.dtype = "fp32" if plan.dtype == "fp32" else plan.dtype
        self.tokens = self.b * self.l
        self._shape: Plan | None = None

    def _shared(self, part: str, phase: str, make: Callable[[str], list[OpCost]]) -> list[OpCost]:
        """``make(phase)``, kept by the coster for plans of the same shape (``_NOT_SHAPING``)."""
        if self._shape is None:
            self._shape = replace(self.plan, **_NOT_SHAPING)  # type: ignore[arg-type]
        return self.c.shaped((self.model, self._shape, part, phase), lambda: make(phase))

    # --- helpers ---------------------------------------------------------------------------

    def _q(self, name: str, op: str, phase: str, *, flops: float = 0.0, scale: float = 1.0,
           times: float = 1.0, category: str = "compute", bench: dict[str, float] | None = None,
           bench_op: str | None = None, **inputs: float) -> OpCost:  # fmt: skip
        """One operator: 001's ``op`` on ``inputs``, its answer times ``scale`` (a shape 001 did
        not measure, from its sister) and ``times`` (copies, e.g. MoE top-k). ``bench``: the
        exact shape for a bench calibration, which then answers unscaled."""
        s, prov = self.c.time(op, phase, self.dtype, bench=bench, bench_op=bench_op, **inputs)
        if bench is not None and ";bench-as:" in prov:
            scale = 1.0  # the device's own measurements of the exact shape
        if category == "memory":
            s, prov = self.c.memory_bound(s, prov)
        if scale != 1.0:
            prov += f";scaled-from:{op}"
        # backward of a GEMM or norm: input- and weight-gradient ops (autograd runs both)
        launches = (
            2
            if phase == "bwd" and (flops or category == "memory") and name not in ("residual_add", "hidden_dropout")
            else 1
        )
        # copies are kernels of their own (an MoE rank's experts, context parallelism's ring
        # steps): each is dispatched, which a launch-bound pass pays per copy
        launches *= max(1, round(times))
        return OpCost(name, phase, s * scale * times, prov, flops, category, launches)

    def _norm(self, name: str, phase: str, dim: float | None = None) -> OpCost:
        """A norm of the ``[b, l, hidden]`` residual stream (÷ t with sequence parallelism), or
        with ``dim`` of a TP-split ``[b, l, dim]`` tensor (the q/k norms: :meth:`qk_norms`)."""
        l_sp = self.l // self.t if self.plan.sp and self.t > 1 and dim is None else self.l
        width = self.model.hidden if dim is None else dim

        def norm(op: str) -> OpCost:
            return self._q(name, op, phase, b=self.b, l=l_sp, dim=width, category="memory")

        if self.model.norm != "rmsnorm":
            return norm("layernorm")
        op = norm("RMSlayernorm")
        if self.plan.impl == "fused" and ";bench-as:" not in op.provenance:
            # 001's RMSNorm rows time GPT-NeoX's RMSNorm, a PyTorch module of several kernels
            # (norm, scale, divide, multiply: 8-30x its bytes at HBM speed on the A100); a fused
            # RMSNorm (Megatron/TE, apex) moves the bytes a fused LayerNorm moves with less
            # arithmetic, so 001's LayerNorm of the same tensor times it (`neox` keeps 001's)
            ln = norm("layernorm")
            return replace(ln, provenance=ln.provenance + ";rmsnorm-as-fused-layernorm")
        return op

    # --- one transformer layer ---------------------------------------------------------------

    def layer(self, phase: str) -> list[OpCost]:
        """One layer's operators, forward or backward (without TP communication)."""
        return self._shared("layer", phase, self._layer)

    def _layer(self, phase: str) -> list[OpCost]:
        m, t, b, seq, d = self.model, self.t, self.b, self.l, self.model.hidden
        bwd = 2.0 if phase == "bwd" else 1.0  # backward GEMMs: input and weight gradients
        hf = self.plan.impl == "hf"  # norms, rotary, activation, residual adds: HF's eager calls instead
        ops = [] if hf else [self._norm("input_norm", phase)]
        if m.mla:
            ops.extend(self.mla_projections(phase))
        else:
            # QKV projection, 001 linear1 = [bl, d, 3d/mp]
            n_qkv = m.q_width / t + 2 * m.kv_width_tp(t)
            fl = bwd * _gemm_flops(self.tokens, n_qkv, d)
            ops.append(self._q("qkv_proj", "linear1", phase, flops=fl, scale=n_qkv / (3 * d / t),
                               bench={"n": n_qkv}, mp=t, b=b, l=seq, dim=d))  # fmt: skip
        if not hf:
            ops.extend(self.qk_norms(phase))
        ops.extend(self.attention_core(phase))
        # output projection, 001 linear2 = [bl, d/mp, d] (its input: the heads' values)
        o_in = m.heads * m.v_dim
        fl = bwd * _gemm_flops(self.tokens, d, o_in / t)
        ops.append(
            self._q("out_proj", "linear2", phase, flops=fl, scale=o_in / d,
                    bench={"k": o_in / t}, mp=t, b=b, l=seq, dim=d)  # fmt: skip
        )
        if hf:
            ops.extend(self.mlp(phase))
            ops.append(self.hf_eager("hf_eager_layer", "layer", phase))
            if m.is_moe:
                ops.extend(self.hf_expert_loop(phase))
            return ops
        ops.extend(self.sublayer_output_norm("attention_output_norm", phase))
        ops.extend(self.hidden_dropout(phase))
        l_sp = seq // t if self.plan.sp and t > 1 else seq
        ops.append(self._q("residual_add", "res_add", phase, category="memory", b=b, l=l_sp, dim=d))
        if m.layer_norms > 1:  # Falcon-7B: the MLP reads the input norm's output
            ops.append(self._norm("post_attention_norm", phase))
        ops.extend(self.mlp(phase))
        ops.extend(self.sublayer_output_norm("mlp_output_norm", phase))
        ops.extend(self.hidden_dropout(phase))
        ops.append(self._q("residual_add", "res_add", phase, category="memory", b=b, l=l_sp, dim=d))
        return ops

    def qk_norms(self, phase: str) -> list[OpCost]:
        """The RMSNorms of one rank's queries and keys after their projection (``qk_norm``):
        Qwen3/Gemma 3 normalise each head's d_h values, OLMo 2 each token's whole projection.
        Both are timed as the model's norm on ``[b, l, width]``, width the rank's q (or k)
        projection: the same bytes; per head the rows are h/t times as many and d_h long, a
        shape 001 did not sweep (``;qk-norm-as-[b,l,width]``). OLMo 2's norm over the whole
        projection also needs, with tp > 1, an all-reduce of each token's sum of squares over
        the TP ranks (b·l values): not modelled (predict says so). Llama 4's (``l2``) has no
        weights and runs on the rotary layers alone: the same norm on their share of the layers
        (:meth:`_rope_layers`)."""
        m, t = self.model, self.t
        if m.qk_norm == "none":
            return []
        out = []
        for name, width in (("q_norm", m.q_width / t), ("k_norm", m.kv_width_tp(t))):
            op = self._norm(name, phase, dim=width)
            op = replace(op, provenance=op.provenance + ";qk-norm-as-[b,l,width]")
            out.append(self._rope_layers(op) if m.qk_norm == "l2" else op)
        return out

    def sublayer_output_norm(self, name: str, phase: str) -> list[OpCost]:
        """Gemma's norm of the attention's (or the MLP's) output before its residual add
        (``layer_norms`` 4; OLMo 2's two norms sit there too, in place of the input norms: the
        same operators, already counted): a norm of the residual stream's shape."""
        return [self._norm(name, phase)] if self.model.layer_norms == 4 else []

    def softcap(self, name: str, phase: str, elements: float, category: str) -> OpCost:
        """Soft-capping ``cap · tanh(x / cap)`` of ``elements`` values as one fused pass
        (Gemma 2's logits and attention scores): the forward reads and writes each value, the
        backward reads the gradient and the saved tanh and writes one, timed as element-wise
        adds moving the same bytes (an add of n moves 3n). HF's eager code runs three kernels
        (divide, tanh, multiply) for the forward."""
        moved = (2.0 if phase == "fwd" else 3.0) * elements
        op = self._elementwise(name, phase, moved / 3)
        return replace(op, provenance=op.provenance + ";softcap-as-elementwise", category=category)

    def hf_eager(self, name: str, part: str, phase: str, *, calibrated: bool = True) -> OpCost:
        """HuggingFace's eager memory-bound calls of one layer or of the rest of the model
        (:mod:`trainsim.builders.eager`): each census part's bytes over its kernel count
        (:func:`~trainsim.builders.eager.eager_parts`: the part and its extras, a sliding-window
        layer's mask calls, a tied embedding's add, the logit cap), each kernel timed as an
        element-wise add moving the same bytes, times the part's share; ``calibrated=False``:
        without the device's eager factor (calls unlike those it was measured on). The extras
        are timed on their own kernels: spread over the part's, their few small calls had made
        every kernel a little smaller, and below a step of the add's curve (gemma3-12b at 1,024
        tokens, its window's mask calls) the layer came out faster with them than without."""
        from trainsim.builders.eager import eager_factor, eager_parts

        a = 4 if self.dtype == "fp32" else 2
        parts = eager_parts(self.model, part, phase, tokens=self.tokens, seq=self.l, dtype_bytes=a,
                            experts=self.plan.experts_impl)  # fmt: skip
        seconds, kernels, op = 0.0, 0.0, None
        for share, nbytes, k in parts:
            if share <= 0 or (nbytes <= 0 and op is not None):
                continue
            one = self._elementwise(name, phase, nbytes / (3 * a) / max(k, 1))  # an add reads two, writes one
            seconds, kernels = seconds + share * (one.seconds * max(k, 1)), kernels + share * k
            op = op or one
        assert op is not None  # the part itself has share 1
        launches = max(round(kernels), 1)
        dev = self.c.bench_device or self.c.device  # the factor was measured against that sample's adds
        factor, note = eager_factor((dev.name, *dev.aliases))
        if factor != 1.0 and ";bench-as:" not in op.provenance:  # measured against the bench's adds only
            factor, note = 1.0, ";eager-factor-not-applied:not-bench-timed"
        if not calibrated:
            what = "moe-expert-loop" if self.plan.experts_impl == "eager" else "moe-experts-grouped-mm"
            factor, note = 1.0, f";eager-factor-uncalibrated:{what}"
        return OpCost(name, phase, seconds * factor, op.provenance + ";hf-eager-census" + note, 0.0,
                      "memory", launches)  # fmt: skip

    def hf_expert_loop(self, phase: str) -> list[OpCost]:
        """An MoE layer's HuggingFace experts beyond their GEMMs (:meth:`mlp` times them as
        :meth:`expert_gemms` says they run), as ``plan.experts_impl`` runs them.

        ``grouped_mm`` (transformers 5's default): the census's ``experts`` calls once a layer
        (the sort by expert, the gathers into expert order and back, the activation, the fp32
        routing weights' product, the sum over the top-k; backward their scatters), timed as
        :meth:`hf_eager`'s with no eager factor (measured on LLaMA's calls, none of these); it
        makes no device-to-host sync, but for the GEMMs' own off a Hopper or Blackwell GPU in bf16
        (:meth:`expert_gemms`' ``fallback``: one per grouped_mm call, two forward and four backward).

        ``eager`` (``experts_implementation="eager"``): each expert hit
        runs the census's ``expert`` calls (the gather of its tokens, the routing weights'
        multiply, ``index_add_``; backward ``select_backward``'s zeroed ``[E, 2f, d]`` gradient
        per expert and autograd's sum of them), timed as :meth:`hf_eager`'s but with no eager
        factor (it was measured on LLaMA's calls, none of these); and in the forward the
        GPU's idle time at the loop's device-to-host syncs (the hit test, ``torch.where``,
        the expert index read back), each taken as one aten call's dispatch
        (HostModel's gap and launch), an estimate: no trace of the loop was measured."""
        from trainsim.builders.eager import expert_loop_host, experts_hit

        experts = self.plan.experts_impl
        if experts == "eager":
            n = experts_hit(self.model, self.tokens)
            one = self.hf_eager("hf_eager_experts", "expert", phase, calibrated=False)
            ops = [replace(one, seconds=one.seconds * n, launches=one.launches * n)]
        else:
            ops = [self.hf_eager("hf_eager_experts", "experts", phase, calibrated=False)]
        _, syncs = expert_loop_host(self.model, phase, tokens=self.tokens, host=HOST, experts=experts)
        if self.expert_gemms() == "fallback":  # _grouped_mm_fallback's offs.cpu(), once per grouped_mm call
            syncs += 2 if phase == "fwd" else 4
        if syncs:
            ops.append(OpCost("hf_moe_syncs", phase, syncs * (HOST.aten_gap_s + HOST.aten_launch_s),
                              f"hf-moe-syncs:{syncs}-x-one-dispatch;estimate", 0.0, "memory", 0))  # fmt: skip
        return ops

    def hidden_dropout(self, phase: str) -> list[OpCost]:
        """An unfused dropout on the ``[b, l, dim]`` residual stream (``plan.hidden_dropout``):
        one memory-bound pass; a bench calibration times it as dropout, 001's data as its
        residual add on the same tensor (its sister: forward reads one tensor and writes the
        output and a 1-byte mask, the add reads two and writes one; backward multiplies the
        gradient by the saved mask)."""
        if self.plan.hidden_dropout <= 0:
            return []
        l_sp = self.l // self.t if self.plan.sp and self.t > 1 else self.l
        return [self._q("hidden_dropout", "res_add", phase, category="memory", bench_op="dropout",
                        b=self.b, l=l_sp, dim=self.model.hidden)]  # fmt: skip

    def attention_core(self, phase: str) -> list[OpCost]:
        m, t, b, seq, d = self.model, self.t, self.b, self.l, self.model.hidden
        h = m.heads
        bwd = 2.0 if phase == "bwd" else 1.0
        # attention FLOPs of a causal-masked implementation that computes the full square
        # (Megatron's baddbmm/bmm do; FlashAttention skips the masked half, counted the same
        # here for MFU, as Megatron's own FLOP formula does)
        # context parallelism (ring attention): a rank's s/cp queries meet all s keys, one
        # (s/cp) x (s/cp) block per ring step, cp steps (Megatron balances causal work by giving
        # each rank two mirrored chunks, so each rank does 1/cp of it): every s^2-sized operator
        # below runs cp times at the local length seq = s/cp (`cp` copies, FLOPs included)
        cp = self.plan.cp
        dh = m.core_head_dim  # d_head; MLA: the mean of its q/k and v head widths
        # the kernels' shape: (tp ranks' heads split, sequence, copies); DeepSpeed-Ulysses
        # (cp_comm a2a, PlanComm.cp_exposed_layer): the all-to-alls hand each rank the whole
        # sequence on heads / (tp·cp) heads, one kernel, the same FLOPs (rotary runs before
        # them, on the rank's s/cp tokens and heads / tp heads)
        mp, sq, copies = (t * cp, self.plan.seq(m), 1) if cp > 1 and self.plan.cp_comm == "a2a" else (t, seq, cp)
        core = bwd * 2 * _gemm_flops(sq, sq, dh) * b * h / mp * copies
        # head_dim other than d/h: scale the d/h-shaped measurements by the head-size ratio
        hd_scale = dh / (d / h)
        ops: list[OpCost] = []
        if m.position == "rotary" and self.plan.impl == "neox":
            ops.append(
                self._rope_layers(self._q("rotary", "RoPE", phase, category="memory", mp=t, b=b, h=h, l=seq, dim=d))
            )
        elif m.position == "rotary" and self.plan.impl == "fused":
            ops.append(self._rope_layers(self.fused_rotary(phase)))
        if self.plan.attention == "flash":
            kw = {"flops": core, "category": "attention", "scale": hd_scale, "times": copies, "bench": {"head_dim": dh}}
            op = self._q("flash_attention", "flash_atten", phase, **kw, mp=mp, b=b, h=h, l=sq, dim=d)  # type: ignore[arg-type]
            if phase == "bwd":
                # FlashAttention's backward recomputes the scores and takes five products to the
                # forward's two (2.5x the work); measured backwards take 1.9-3.1x the forward
                # (the H100 sample; 001's A100 rows), so one under 1.5x is a broken measurement
                # (GH200's 001 rows: 0.08-1.4x, the timer caught part of it): it is replaced by
                # the forward's time scaled by the work ratio
                fwd = self._q("flash_attention", "flash_atten", "fwd", **kw, mp=mp, b=b, h=h, l=sq, dim=d)  # type: ignore[arg-type]
                if op.seconds < FLASH_BWD_PLAUSIBLE * fwd.seconds:
                    op = replace(op, seconds=FLASH_BWD_WORK * fwd.seconds,
                                 provenance=fwd.provenance + ";bwd-as-2.5x-fwd")  # fmt: skip
            frac = m.cp_window_work_fraction(self.plan.seq(m), copies)  # a2a: the unsplit window
            if frac < 1.0:
                # a sliding window (FlashAttention's window_size): the kernel skips the key blocks
                # outside it, so it does that share of the causal work; timed as the measured
                # causal kernel scaled by the work (its windowed runs are not measured here),
                # averaged over the model's windowed and full layers; with context parallelism
                # the windowed layers' busiest rank under TransformerEngine's KV all-gather CP
                # (ModelSpec.cp_window_rank_shares; PlanComm.cp_window_layer: TE's p2p ring
                # refuses a window), the full layers the ring's balanced 1/cp; with cp_comm a2a
                # every rank the unsplit fraction over the whole sequence
                op = replace(op, seconds=op.seconds * frac, flops=op.flops * frac,
                             provenance=op.provenance + ";windowed-work")  # fmt: skip
            ops.append(op)
            return ops
        ops.append(self._q("attention_scores", "baddbmm", phase, flops=core / 2, category="attention",
                           scale=hd_scale, times=copies, bench={"head_dim": dh}, mp=mp, b=b, h=h, l=sq, dim=d))  # fmt: skip
        if m.attn_softcap and self.plan.impl != "hf":
            # Gemma 2's cap on the [b, h/t, s, s] scores before the mask and softmax (with
            # FlashAttention the kernel applies it: not costed, predict notes it)
            ops.append(self.softcap("attention_softcap", phase, b * h / mp * sq * sq * copies, "attention"))
        elif m.attn_softcap and self.plan.attention != "flash":
            # HF's Gemma 2 eager attention: the cap as its census's three passes over the
            # [b, h, s, s] scores (divide, tanh, multiply; FlashAttention-2 caps in its kernel)
            ops.append(replace(self.hf_eager("hf_attention_softcap", "attn_softcap", phase), category="attention"))
        if self.plan.attention == "fused":
            # 001's fused-softmax data vary heads at mp=1: b(h/mp) is what the kernel sees
            ops.append(self._q("scale_mask_softmax", "ScaledUpperTriangMaskedSoftmax", phase,
                               category="attention", times=copies, mp=1, b=b, h=max(h // mp, 1), l=sq))  # fmt: skip
        else:
            ops.append(
                self._q(
                    "fill_mask",
                    "fillmask",
                    phase,
                    category="attention",
                    times=copies,
                    mp=mp,
                    b=b,
                    h=h,
                    l=sq,
                    dim=d,
                )
            )
            ops.append(
                self._q("softmax", "softmax", phase, category="attention", times=copies, mp=mp, b=b, h=h, l=sq)
            )
        if self.plan.attention_dropout > 0:
            # dropout over the [b, h/t, s, s] probabilities (Megatron's attention_dropout): one
            # memory-bound pass reading 2 B and writing 2 B plus a 1 B mask per element, as the
            # fill-mask operator 001 measured on the same tensor (its sister here, same bytes);
            # backward multiplies the gradient by the saved mask: the same bytes again, so
            # both phases take the forward measurement (fill-mask's own backward does more)
            # (a bench calibration times the dropout kernel itself, each phase, on b·h/t·l² elements)
            own = self._q("attention_dropout", "fillmask", phase, category="attention", bench_op="dropout",
                          times=copies, bench={"numel": b * (h / mp) * sq * sq}, mp=mp, b=b, h=h, l=sq, dim=d)  # fmt: skip
            if ";bench-as:" in own.provenance:
                ops.append(own)
            else:
                fwd_cost = self._q("attention_dropout", "fillmask", "fwd", category="attention",
                                   times=copies, mp=mp, b=b, h=h, l=sq, dim=d)  # fmt: skip
                ops.append(
                    OpCost(
                        fwd_cost.name, phase, fwd_cost.seconds, fwd_cost.provenance, 0.0, "attention"
                    )
                )
        ops.append(self._q("attention_values", "bmm", phase, flops=core / 2, category="attention",
                           scale=hd_scale, times=copies, bench={"head_dim": dh}, mp=mp, b=b, h=h, l=sq, dim=d))  # fmt: skip
        return ops

    def expert_gemms(self) -> str:
        """How an MoE layer's expert GEMMs run on this rank (the GEMM code each stack calls):

        * ``sequential`` — Megatron-core's SequentialMLP (its default): each local expert a
          module of its own, its GEMMs timed at the per-expert shape one after another, and
          its calls dispatched by a Python loop (:func:`expert_gemms_host_s`).
        * ``multistream`` — ``--moe-grouped-gemm`` (``plan.moe_grouped_gemm``): TransformerEngine's
          ``GroupedLinear``, one cuBLAS GEMM per expert issued from C++ over TE's four compute
          streams (``get_num_compute_streams`` is 4; TE's docs: "one cuBLAS GEMM per expert is
          launched on a pool of CUDA streams"). Up to four GEMMs overlap, and the set runs no
          faster than one GEMM over all the experts' rows: the longer of the two, and no longer
          than the per-expert GEMMs one after another (what the streams run).
        * ``grouped`` — ``impl`` ``hf`` with transformers' ``grouped_mm`` on a Hopper or
          Blackwell GPU in bf16: ``torch._grouped_mm``'s fast path (aten GroupedBlas.cpp: compute
          capability 9.x or 10.x and bf16 operands), one CUTLASS grouped kernel per projection
          with no host sync, timed as one GEMM over every expert's rows, each expert's rows
          padded to the kernel's tile (GroupMM.cu: 64 rows on SM100, and on SM90 when the mean
          rows per expert or N are at most 128, else 128).
        * ``fallback`` — ``grouped_mm`` elsewhere (an A100, fp16 or fp32):
          ``_grouped_mm_fallback`` reads the offsets to the host (a device-to-host sync per call)
          and runs one ``mm`` per expert: the per-expert GEMMs, launched from C++.
        * ``loop`` — ``impl`` ``hf`` with ``--hf-experts eager``: the eager loop's GEMM pairs.

        Not modelled: TE's CUTLASS grouped GEMM (``NVTE_USE_CUTLASS_GROUPED_GEMM=1``, Hopper) and
        its cuBLASLt grouped GEMM (cuBLAS 13.3+), Megatron's legacy GroupedMLP (the
        ``grouped_gemm`` package), and a grouped kernel's own efficiency beyond the stacked
        GEMM's (taken as one GEMM of that shape: an optimistic bound for ragged groups)."""
        return expert_gemm_path(self.plan, self.c.device.architecture)

    def mlp(self, phase: str) -> list[OpCost]:
        m, t, b, seq, d = self.model, self.t, self.b, self.l, self.model.hidden
        bwd = 2.0 if phase == "bwd" else 1.0
        if m.is_moe:
            # balanced routing: each of this rank's num_experts / ep experts runs its own GEMMs
            # over the tokens routed to it from the ep ranks, tokens x top_k x ep / num_experts
            # of them; the same FLOPs as top_k dense passes, at the smaller GEMMs' efficiency
            # (x plan.moe_load on the rank routed the most, which sets the pace: Plan.moe_imbalance)
            ffn, copies = m.expert_ffn, m.num_experts / self.plan.ep
            per_expert = self.tokens * m.top_k * self.plan.ep / m.num_experts * self.plan.moe_load
            seq_e = max(1.0, round(per_expert / b))  # the expert GEMM's rows, as b x l
        else:
            ffn, copies, per_expert, seq_e = m.ffn, 1.0, float(self.tokens), seq
        up = (2 if m.gated else 1) * ffn / t  # gated: gate and up projections side by side

        def gemms(rows_l: float, times: float) -> tuple[OpCost, OpCost]:
            """The up and down projections at ``rows_l`` rows per ``b`` (``copies`` of them one
            after another: ``times``), with the layer's true FLOPs whatever the rows timed."""
            return (
                self._q("mlp_up", "linear3", phase, flops=copies * bwd * _gemm_flops(per_expert, up, d),
                        scale=up / (4 * d / t), times=times, bench={"n": up}, mp=t, b=b, l=rows_l, dim=d),
                self._q("mlp_down", "linear4", phase, flops=copies * bwd * _gemm_flops(per_expert, d, ffn / t),
                        scale=ffn / (4 * d), times=times, bench={"k": ffn / t}, mp=t, b=b, l=rows_l, dim=d),
            )  # fmt: skip

        def activation(rows_l: float, times: float) -> OpCost:
            return self._q("activation", "gelu", phase, category="memory", times=times,
                           scale=(1.5 if m.gated else 1.0) * ffn / (4 * d), mp=t, b=b, l=rows_l, dim=d)  # fmt: skip

        ups = gemms(seq_e, copies)
        act = None if self.plan.impl == "hf" else activation(seq_e, copies)  # SequentialMLP: each expert's own
        if m.is_moe:
            ups = self._expert_gemms(ups, gemms, copies, per_expert, up, seq_e=seq_e)
            if act is not None and self.expert_gemms() == "multistream":
                # TEGroupedMLP: one activation over every expert's rows (the per-expert GEMMs'
                # rows, stacked); the same bytes as the per-expert passes in one kernel, so no
                # slower than they are (the kernel model's carry beyond the measured work can
                # put the one pass below the best-measured bandwidth the smaller passes get)
                one = activation(copies * seq_e, 1.0)
                act = one if one.seconds <= act.seconds else replace(
                    one, seconds=act.seconds, provenance=act.provenance + ";te-grouped-mlp:as-per-expert-passes")  # fmt: skip
        ops = [ups[0], *([] if act is None else [act]), ups[1]]
        if m.is_moe:
            # token permutation (Megatron's moe_utils.permute / unpermute): each token's hidden
            # state gathered into its top_k experts' order, then the expert outputs scattered back
            # and summed with the router's weights; each pass reads and writes (1 + top_k) x
            # tokens x d elements, memory-bound, in the forward and again in the backward
            # (HF's eager loop gathers and index_add_s per expert instead: hf_expert_loop's census)
            moved = (1 + m.top_k) * self.tokens * d
            for name in ("moe_permute", "moe_unpermute") if self.plan.impl != "hf" else ():
                ops.append(self._elementwise(name, phase, moved / 3))  # an add of n moves 3n
            # router: a [tokens, d] x [d, experts] GEMM and its softmax, tiny (Qwen2-MoE's
            # shared-expert gate, a d x 1 linear, one column more)
            n_router = m.num_experts + (1 if m.shared_expert_gate else 0)
            fl = bwd * _gemm_flops(self.tokens, n_router, d)
            ops.append(
                self._q(
                    "router",
                    "linear3",
                    phase,
                    flops=fl,
                    scale=n_router / (4 * d),
                    bench={"n": n_router},
                    mp=1,
                    b=b,
                    l=seq,
                    dim=d,
                )
            )
            ops.extend(self.shared_expert(phase))
        return ops

    def _expert_gemms(self, per: tuple[OpCost, OpCost], gemms: Callable[[float, float], tuple[OpCost, OpCost]],
                      copies: float, per_expert: float, up: float, *, seq_e: float) -> tuple[OpCost, OpCost]:  # fmt: skip
        """The MoE layer's up and down projections as :meth:`expert_gemms` says they run, from
        ``per`` (``copies`` per-expert GEMMs of ``seq_e`` rows per ``b``, one after another) and
        ``gemms`` (the two at other rows): one GEMM over the stacked rows for a grouped kernel
        (``grouped``: each expert's rows padded to the tile; ``multistream``: the per-expert
        GEMMs' rows, no faster than four streams of those GEMMs and no slower than running them
        one after another, which is what the streams run), the per-expert ones otherwise.
        ``launches``: kernels, per projection."""
        how, b, n_calls = self.expert_gemms(), self.b, 2 if per[0].phase == "bwd" else 1
        if how in ("sequential", "loop"):
            return per
        if how == "fallback":
            return tuple(replace(o, provenance=o.provenance + ";grouped-mm-fallback:per-expert-mm") for o in per)  # type: ignore[return-value]
        rows = seq_e * b
        if how == "grouped":
            small = per_expert <= 128 or min(up, self.model.hidden) <= 128
            tile = 64 if self.c.device.architecture == "blackwell" or small else 128
            rows = math.ceil(per_expert / tile) * tile
        stacked = gemms(copies * rows / b, 1.0)
        out = []
        for one, many in zip(per, stacked, strict=True):
            if how == "grouped":
                out.append(replace(many, launches=n_calls, provenance=many.provenance + f";grouped-gemm-as-stacked:{copies:g}x{rows:g}rows"))
            else:  # multistream: the longer of one stacked GEMM and four streams of per-expert GEMMs,
                # at most the per-expert GEMMs one after another (the stacked shape's kernel model
                # can come out slower than its pieces: 8 x 1,024-row GEMMs vs one of 8,192 rows)
                streams = one.seconds / min(TE_COMPUTE_STREAMS, max(copies, 1.0))
                s, note = (many.seconds, "stacked") if many.seconds >= streams else (streams, f"{TE_COMPUTE_STREAMS}-streams")
                if s > one.seconds:
                    s, note = one.seconds, "as-per-expert-gemms"
                out.append(replace(one, seconds=s, provenance=one.provenance + f";te-grouped-linear:{note}"))
        return out[0], out[1]

    def expert_gemms_host_s(self, phase: str, host: HostModel) -> float:
        """CPU time one MoE layer's expert GEMMs take to dispatch in ``phase`` beyond what the
        per-layer host count holds (a dense layer's: one MLP), as :meth:`expert_gemms` runs
        them, at HostModel's rates (an estimate: no trace of these loops was measured):

        * ``sequential``: every further local expert's module calls from Megatron-core's
          Python loop: forward its fc1, activation and fc2 (three launching aten calls) and
          two views (its token split, its output); backward three autograd nodes, five launches
          (two per GEMM, one for the activation) and two views. TransformerEngine modules' own
          Python overhead would add to it.
        * ``multistream`` and ``fallback``: the C++ loop's one GEMM launch per further expert,
          per grouped call (forward the two projections, backward their input and weight
          gradients: four), each an aten kernel launch.
        * ``grouped`` and ``loop``: none (one kernel per call; the eager loop's calls are the
          census's, :func:`trainsim.builders.eager.expert_loop_host`)."""
        if not self.model.is_moe:
            return 0.0
        how = self.expert_gemms()
        extra = max(self.model.num_experts / self.plan.ep - 1.0, 0.0)
        if how == "sequential":
            if phase == "fwd":
                return extra * (3 * (host.aten_gap_s + host.aten_launch_s) + 2 * (host.aten_gap_s + host.aten_view_s))
            return extra * (3 * host.autograd_node_s + 5 * host.aten_launch_s + 2 * host.aten_view_s)
        if how in ("multistream", "fallback"):
            return extra * (2 if phase == "fwd" else 4) * host.aten_launch_s
        return 0.0

    # --- MoE-family operators (h5): MLA, q/k norms, shared experts ----------------------------

    def _gemm(self, name: str, phase: str, n: float, k: float) -> OpCost:
        """A ``[tokens, k] x [k, n]`` GEMM of one rank, timed as 001's linear1 (``[bl, d, 3d/mp]``)
        scaled by the FLOP ratio, or by a bench calibration's GEMM of that exact shape."""
        t, d = self.t, self.model.hidden
        fl = (2.0 if phase == "bwd" else 1.0) * _gemm_flops(self.tokens, n, k)
        return self._q(name, "linear1", phase, flops=fl, scale=n * k / (d * 3 * d / t), bench={"n": n, "k": k},
                       mp=t, b=self.b, l=self.l, dim=d)  # fmt: skip

    def mla_projections(self, phase: str) -> list[OpCost]:
        """Multi-head Latent Attention's projections (DeepSeek-V2 §2.1.2-2.1.3) as Megatron-core's
        MLA runs them under TP: the down projections to the q latent, the joint K/V latent and
        the shared rotary key (``d -> r_q + r_kv + d_rope``, one GEMM, replicated over TP: it
        is named ``qkv_proj``, where the TP collectives anchor), RMSNorms on the two latents,
        then the column-parallel up projections of this rank's ``h / tp`` heads: q
        (``r_q -> h d_qk``, or ``d -> h d_qk`` without a q latent) and K/V
        (``r_kv -> h (d_nope + d_v)``). Not modelled: the backward's TP all-reduce is of the
        latents' gradients (``r_q + r_kv`` wide), costed as the hidden state's."""
        m, t, d = self.model, self.t, self.model.hidden
        rq, rkv, rope = m.q_lora_rank, m.kv_lora_rank, m.qk_rope_head_dim
        h_t = m.heads / t
        ops = [self._gemm("qkv_proj", phase, rq + rkv + rope, d),
               replace(self._elementwise("latent_norm", phase, 2 * self.tokens * (rq + rkv) / 3), category="memory")]
        ops.append(self._gemm("q_up_proj", phase, h_t * m.d_head, rq or d))
        ops.append(self._gemm("kv_up_proj", phase, h_t * (m.d_head - rope + m.v_dim), rkv))
        return ops

    def shared_expert(self, phase: str) -> list[OpCost]:
        """The shared expert(s) (DeepSeekMoE §2, Qwen2-MoE): a dense gated MLP of
        ``shared_ffn_hidden`` over every token, TP-split like a dense MLP and not expert-
        parallel, run beside the routed experts (Megatron's shared_experts; its overlap of
        them with the dispatch all-to-all is not modelled)."""
        m, t, b, seq, d = self.model, self.t, self.b, self.l, self.model.hidden
        if not m.shared_ffn_hidden:
            return []
        bwd = 2.0 if phase == "bwd" else 1.0
        f = m.shared_ffn_hidden
        up = (2 if m.gated else 1) * f / t
        return [
            self._q("shared_up", "linear3", phase, flops=bwd * _gemm_flops(self.tokens, up, d),
                    scale=up / (4 * d / t), bench={"n": up}, mp=t, b=b, l=seq, dim=d),
            *([] if self.plan.impl == "hf" else [
                self._q("shared_activation", "gelu", phase, category="memory",
                        scale=(1.5 if m.gated else 1.0) * f / (4 * d), mp=t, b=b, l=seq, dim=d)]),
            self._q("shared_down", "linear4", phase, flops=bwd * _gemm_flops(self.tokens, d, f / t),
                    scale=f / (4 * d), bench={"k": f / t}, mp=t, b=b, l=seq, dim=d),
        ]  # fmt: skip

    # --- gradient accumulation -------------------------------------------------------------

    def _rope_layers(self, op: OpCost) -> OpCost:
        """The rotary embedding averaged over the layers: SmolLM3's NoPE layers (``nope_layers``)
        run none, so a layer's op is the rotating layers' share of it (the layers' operators are
        one list, costed once and repeated; a sliding window is averaged the same way)."""
        share = self.model.rope_share
        if share == 1.0:
            return op
        return replace(op, seconds=op.seconds * share, provenance=op.provenance + f";rope-on-{share:.3g}-of-layers")

    def fused_rotary(self, phase: str) -> OpCost:
        """A fused rotary embedding (Megatron-core's / Transformer Engine's kernel, apex's): one
        pass over q and over k, each read and written once (the cos/sin table is small), the
        backward the same pass over their gradients; timed as element-wise adds moving the same
        bytes (``;rope-as-fused-elementwise``). 001's RoPE rows time GPT-NeoX's PyTorch rotary
        (slices, negation, concatenation, two products and a sum: 20x the bytes of one pass at
        HBM speed on the A100, 31 % of a LLaMA-2 7B layer on an H100 that borrowed them), which
        ``impl="neox"`` keeps."""
        m, t = self.model, self.t
        # one rank's q and k (Megatron replicates KV heads when tp exceeds their count), each
        # read and written: an add of n elements moves 3n, so each pass is an add of 2/3 its size
        widths = (m.q_width / t, m.kv_width_tp(t))
        if m.mla:  # MLA rotates only the heads' rotary parts of q and the one shared rotary key
            widths = (m.heads * m.qk_rope_head_dim / t, m.qk_rope_head_dim)
        calls = [self._elementwise("rotary", phase, 2 * self.tokens * w / 3) for w in widths]
        return OpCost("rotary", phase, sum(c.seconds for c in calls), calls[0].provenance + ";rope-as-fused-elementwise",
                      0.0, "memory", 2)  # fmt: skip

    def _elementwise(self, name: str, phase: str, elements: float) -> OpCost:
        """An element-wise add of ``elements`` (two read, one written), timed by 001's res_add
        model on a ``[b, l, dim]`` shape of that count placed inside its sweep (b 2-8, l up to
        5,120, dim 2,048-8,192) where the count allows (beyond it the answer says
        ``extrapolated``), or by a bench calibration's element-wise add."""
        dim = min(max(self.model.hidden, 2048), 8192)

        def make() -> OpCost:
            rows = max(elements / dim, 1.0)
            b = min(max(-(-rows // 5120), 2), 8)
            s, prov = self.c.memory_bound(*self.c.time("res_add", "fwd", self.dtype, b=b, l=rows / b, dim=dim))
            return OpCost(name, phase, s, prov, 0.0, "memory", 1)

        # kept by the coster: an MoE layer's gradient accumulation asks for one add per local
        # expert weight (64 alike on a DeepSeek-V3 rank at ep 8), a search on every plan
        return cast(OpCost, self.c.kept(("elementwise", name, phase, self.dtype, dim, elements), make))

    def _accumulate(self, name: str, elements: float) -> OpCost:
        """Adding one parameter tensor's gradient into the accumulated one: an element-wise add,
        timed by 001's res_add model (also an add of two tensors) on a ``[b, l, dim]`` shape of
        the same element count, placed inside that benchmark's sweep (b 2-8, l up to 5,120,
        dim 2,048-8,192) where the count allows; beyond it the answer says ``extrapolated``."""
        return self._elementwise(name, "bwd", elements)

    def _small_tensors(self) -> int:
        """Per layer: norm weights (and LayerNorm biases), linear biases."""
        m = self.model
        norms = m.layer_norms * m.norm_tensors + (2 if m.qk_norm in ("head", "full") else 0)  # l2: no weights
        biases = (4 if m.bias else 0) + (1 if m.qkv_bias and not m.bias else 0)
        if m.is_moe:
            biases += 1  # the router's weight: d × experts, small
        return norms + biases + self._moe_family_small_tensors()

    def _moe_family_small_tensors(self) -> int:
        """MLA's latent norms, attention sinks, router bias, shared-expert gate (the q/k norms
        are counted with the layer's norms above)."""
        m = self.model
        return ((1 + (m.q_lora_rank > 0)) * m.mla + m.attention_sinks + m.router_bias
                + m.shared_expert_gate)  # fmt: skip

    def layer_weights(self) -> list[tuple[str, float]]:
        """One layer's weight matrices on this GPU, (name, elements), in Megatron's fused layout:
        qkv, output, fc1 (gate and up side by side), fc2; an MoE layer holds ``num_experts / ep``
        experts."""
        m, t, d = self.model, self.t, self.model.hidden
        g = 2 if m.gated else 1
        out = [("qkv", d * (m.q_width / t + 2 * m.kv_width_tp(t))), ("out", m.heads * m.v_dim / t * d)]
        if m.mla:
            rq, rkv, rope = m.q_lora_rank, m.kv_lora_rank, m.qk_rope_head_dim
            out[0:1] = [("qkv_down", d * (rq + rkv + rope)), ("q_up", (rq or d) * m.heads * m.d_head / t),
                        ("kv_up", rkv * m.heads * (m.d_head - rope + m.v_dim) / t)]  # fmt: skip
        if m.is_moe:
            out += [("expert_up", d * g * m.expert_ffn / t), ("expert_down", m.expert_ffn / t * d)] * (
                m.num_experts // self.plan.ep
            )
            if m.shared_ffn_hidden:
                out += [("shared_up", d * g * m.shared_ffn_hidden / t), ("shared_down", m.shared_ffn_hidden / t * d)]
        else:
            out += [("mlp_up", d * g * m.ffn / t), ("mlp_down", m.ffn / t * d)]
        return out

    def _grad_shard(self) -> int:
        """ZeRO-3/FSDP reduce-scatters each layer's gradients every micro-batch (llm_comm's
        ``zero3_layer``): the full gradient is freed and only this rank's 1/(dp·cp) shard is
        accumulated."""
        return self.plan.dp * self.plan.cp if self.plan.zero >= 3 else 1

    def grad_accumulation(self) -> tuple[list[OpCost], int]:
        """One layer's gradient accumulation for one micro-batch: the weight-matrix adds (timed)
        and how many small tensors (biases, norm weights) are added too (their kernels are
        negligible; the host model charges their dispatch). Nothing with ``wgrad_fusion`` (the
        weight-gradient GEMMs accumulate in place; the few small adds left are not charged) or a
        single micro-batch. Gradients are added in the training dtype (DeepSpeed and Megatron
        train a cast model; torch AMP, which keeps fp32 parameters, would add in fp32)."""
        key = self.grad_accumulation_key()
        if key is None:
            return [], 0
        k, ke = self._grad_shards()

        def adds() -> list[OpCost]:
            return [self._accumulate(f"grad_acc_{n}", e / (ke if n.startswith("expert_") else k))
                    for n, e in self.layer_weights()]  # fmt: skip

        return self.c.shaped(key, adds), self._small_tensors()

    def grad_accumulation_key(self) -> tuple[object, ...] | None:
        """What :meth:`grad_accumulation`'s adds depend on (every plan of the layer's shape and
        gradient shard has the same ones: a search's), or ``None`` when there are none."""
        if self.plan.wgrad_fusion or self.plan.grad_accum <= 1:
            return None
        return ("grad_acc", self.model, self.t, self.plan.ep, *self._grad_shards(), self.dtype)

    def _grad_shards(self) -> tuple[int, int]:
        """The dense weights' gradient shard (:meth:`_grad_shard`) and the experts', which shard
        over the expert-data-parallel group."""
        k = self._grad_shard()
        return k, max(k // self.plan.ep, 1)

    def extra_grad_accumulation(self, first: bool, last: bool) -> tuple[list[OpCost], int]:
        """The stage's tensors outside the layers: the word (and learned position) embedding on
        the first stage; the output projection on the last when untied, or Megatron's tied copy
        there when the stages differ; the final norm (small). Gradient-accumulation fusion covers
        the linear layers' weight GEMMs (the output projection too): the embedding lookup's
        gradients still add."""
        m, t, d = self.model, self.t, self.model.hidden
        if self.plan.grad_accum <= 1:
            return [], 0
        ops, small = [], 0
        k = self._grad_shard()
        table = m.padded_vocab(t) / t * d / k
        if first:
            ops.append(self._accumulate("grad_acc_embedding", table))
            if m.position == "learned":
                ops.append(self._accumulate("grad_acc_position", m.seq_len * d / k))
        if last:
            if (not m.tied_embeddings or not first) and not self.plan.wgrad_fusion:  # a linear layer's GEMM
                ops.append(self._accumulate("grad_acc_output", table))
            small += m.norm_tensors + m.head_bias  # the final norm, Phi's output bias
        return ops, small

    # --- stage extras --------------------------------------------------------------------------

    def embedding(self, phase: str) -> list[OpCost]:
        """The first stage's embedding lookup (and dropout)."""
        return self._shared("embedding", phase, self._embedding)

    def _embedding(self, phase: str) -> list[OpCost]:
        t, b, seq, d = self.t, self.b, self.l, self.model.hidden
        v = self.model.padded_vocab(t)
        return [
            self._q("embedding", "embedding", phase, category="memory", bench={"vocab": v},
                    mp=t, b=b, l=seq, dim=d),
            *([] if self.plan.impl == "hf" else self.hidden_dropout(phase)),
        ]  # fmt: skip

    def head(self, phase: str) -> list[OpCost]:
        """Final norm, output projection and loss (the last stage)."""
        return self._shared("head", phase, self._head)

    def _head(self, phase: str) -> list[OpCost]:
        m, t, b, seq, d = self.model, self.t, self.b, self.l, self.model.hidden
        bwd = 2.0 if phase == "bwd" else 1.0
        v = m.padded_vocab(t)
        # 001's vocabulary padded alike (the padding needs no heads: one, whatever hidden is,
        # as GLM-4.5's 96 heads of 128 do not divide its 5,120)
        v001 = ModelSpec("seed001", d, 1, 1, _SEED001_VOCAB).padded_vocab(t)
        r = v / v001
        proj = self._q("output_proj", "linear_final", phase, flops=bwd * _gemm_flops(self.tokens, v / t, d),
                       scale=r, bench={"vocab": v}, mp=t, b=b, l=seq, dim=d)  # fmt: skip
        if self.plan.impl == "hf":  # final norm, loss (its fp32 logits), embedding-side eager calls
            return [proj, self.hf_eager("hf_eager_rest", "rest", phase)]
        cap = [self.softcap("logit_softcap", phase, self.tokens * v / t, "memory")] if m.logit_softcap else []
        return [
            self._norm("final_norm", phase),
            proj,
            *cap,
            *self.head_bias_grad(phase),
            self._q("cross_entropy", "parallel_cross_entropy_128", phase, category="memory", scale=r,
                    bench={"vocab": v}, mp=t, b=b, l=seq),
        ]  # fmt: skip

    def head_bias_grad(self, phase: str) -> list[OpCost]:
        """Phi's output-projection bias (``head_bias``): its forward add runs in the GEMM's
        epilogue (cuBLASLt's bias epilogue, which ``addmm`` takes), its gradient is a reduction of
        the rank's ``[b·l, V/t]`` logits' gradient over the tokens (``grad_output.sum(0)``),
        one memory-bound pass reading it, timed as an element-wise add moving the same bytes (an
        add of n reads and writes 3n)."""
        if not self.model.head_bias or phase != "bwd":
            return []
        op = self._elementwise("output_bias_grad", phase, self.tokens * self.model.padded_vocab(self.t) / self.t / 3)
        return [replace(op, provenance=op.provenance + ";bias-grad-as-elementwise")]

    # --- multi-token prediction (DeepSeek-V3 §2.2; Megatron-core's MultiTokenPredictionLayer) ---

    def mtp_extras(self, phase: str) -> tuple[list[OpCost], list[OpCost]]:
        """One MTP depth's operators outside its transformer block, in forward order: before it
        (the shared embedding's lookup of the tokens shifted by the depth, RMSNorms of that
        embedding and of the previous depth's hidden state, their concatenation, the
        column-parallel projection ``M_k`` 2d -> d/tp, Megatron's ``eh_proj``) and after it (the
        norm before the head, the shared output projection over the vocabulary and its
        cross-entropy, as :meth:`head`'s). The concatenation is one memory-bound copy of both
        halves in the forward; its backward is a split into views (no kernel). The TP
        collectives around ``eh_proj`` are :mod:`.llm_comm`'s (:func:`trainsim.builders.llm.stage_costs`),
        and so are the lookup's and the head's, the main model's ends' (``PlanComm.tp_end``)."""
        return self._shared("mtp_pre", phase, self._mtp_pre), self._shared("mtp_post", phase, self._mtp_post)

    def _mtp_pre(self, phase: str) -> list[OpCost]:
        d = self.model.hidden
        ops = [replace(o, name="mtp_" + o.name) for o in self._embedding(phase)]
        ops += [self._norm("mtp_enorm", phase), self._norm("mtp_hnorm", phase)]
        if phase == "fwd":  # reads both halves, writes the [tokens, 2d] input; an add of n moves 3n
            sp = self.t if self.plan.sp and self.t > 1 else 1
            ops.append(self._elementwise("mtp_concat", phase, 4 * self.tokens * d / sp / 3))
        ops.append(self._gemm("mtp_eh_proj", phase, d / self.t, 2 * d))
        return ops

    def _mtp_post(self, phase: str) -> list[OpCost]:
        return [replace(o, name="mtp_" + o.name) for o in self._head(phase)]

    def mtp_grad_accumulation(self, depths: int, embedding_copy: bool) -> tuple[list[OpCost], int]:
        """The MTP depths' gradient accumulation outside their blocks, per micro-batch (as
        :meth:`grad_accumulation`): each depth's ``eh_proj`` weight (a linear layer's: none with
        ``wgrad_fusion``) and three norms (small); with ``embedding_copy``, the word embedding
        the last stage holds for the MTP when the stages differ (Megatron keeps a copy there
        and all-reduces its gradient with the first stage's): an embedding's gradient, which
        adds even with ``wgrad_fusion``, once for all depths."""
        if self.plan.grad_accum <= 1 or depths <= 0:
            return [], 0
        m, t, d = self.model, self.t, self.model.hidden
        k = self._grad_shard()
        ops = [] if self.plan.wgrad_fusion else [self._accumulate("grad_acc_mtp_eh_proj", 2 * d * d / t / k)] * depths
        if embedding_copy:
            ops.append(self._accumulate("grad_acc_mtp_embedding", m.padded_vocab(t) / t * d / k))
        return ops, 3 * depths * m.norm_tensors

    def optimizer(self, params: float, layers: int) -> OpCost:
        """One optimizer step over ``params`` parameters held by this GPU (after ZeRO sharding).
        With ``plan.optimizer == "sgd"``: one element-wise add over the parameters (see
        :class:`~trainsim.builders.plan.Plan`); otherwise Adam, as follows.

        001 Table I's optimizer operator is timed per pipeline stage on ``[mp, dim, encoders]``
        (FusedAdam, mixed precision, the step of ``encoders`` layers of width ``dim`` split
        ``mp`` ways: ``12 dim^2 / mp`` parameters each, Eq. 6). We take its middle-stage
        benchmark as the cost of updating that many parameters and scale it by the parameters
        this GPU actually updates (embedding or head included, ZeRO shard applied): the step is
        memory-bound, linear in parameters. (The first-stage files differ by the embedding's
        parameters only; GH200's are timing failures: 5.6 s for 11 encoders of width 2048.)
        Without that benchmark, 001's whole-model optimizer benchmark (layers, width, tensors,
        parameters) answers.
        """
        if self.plan.optimizer == "sgd":  # p -= lr * g in place: an add's bytes (two read, one written)
            op = self._elementwise("optimizer", "step", params)
            return OpCost("optimizer", "step", op.seconds, op.provenance + ";sgd-as-add", 0.0, "optimizer")
        n = max(layers, 1)
        s, prov = self.c.time(
            "middleStage_optimizer", "step", "fp16", mp=self.t, dim=self.model.hidden, encoders=n
        )
        if prov.startswith("calibrated:"):
            s *= params / (n * 12.0 * self.model.hidden**2 / self.t)
            prov += ";scaled-by-parameters"
        else:
            tensors = 12 * n + 4
            s, prov = self.c.time("optimizer", "step", "fp16", num_layers=n, hidden_size=self.model.hidden,
                                  param_tensors=tensors, params=params)  # fmt: skip
        # physical floor (spec-derived): GH200's middle-stage rows run down to 0.18x of it at
        # large widths (timing failures like its first-stage files), and H100 borrows them;
        # 001's A100 rows all lie at 1.4x it or above
        floor = params * ADAM_MIN_BYTES_PER_PARAM / self.c.device.memory_bandwidth_Bps
        if s < floor:
            s, prov = floor, prov + ";bandwidth-floor"
        return OpCost("optimizer", "step", s, prov, 0.0, "optimizer")
