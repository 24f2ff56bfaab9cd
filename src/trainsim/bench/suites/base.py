"""What a suite is: a deterministic list of :class:`Case` s, each able to build its timed call.

Sampling follows 001 §III-A: each op is swept over shapes that span realistic sizes, but every
case is kept short on the device at hand. Shape parameters are spread log-uniformly by a
shifted Halton sequence seeded per (suite, op, phase, dtype) (sizes from 8 up are multiples of
8, like real layer sizes), and a point is kept only if its estimated time (roofline with
conservative peaks) and memory fit the device's :class:`SweepSpec`. The draws do not depend on ``quick``: a quick sweep
is a prefix of the full one, so a full run after a quick one measures only what is new.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from typing import Any

from trainsim.ir.kinds import KernelFamily

Timed = Callable[[], object]
Builder = Callable[[Any], Timed]  # (torch.device) -> the zero-argument call that is timed
Params = dict[str, Any]


class Phase(StrEnum):
    """The pass timed; the values are :class:`trainsim.kernels.features.Phase`'s."""

    FWD = "fwd"  # the op itself (probes too)
    BWD = "bwd"  # the gradients of its differentiable inputs
    STEP = "step"  # one optimizer update


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
DTYPE_LABEL = {
    "float32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
}  # as kernel models name them


@dataclass(frozen=True, slots=True)
class Case:
    """One measurement: an op at one shape, phase and dtype, and how to build its timed call.

    ``op`` is the torch call benchmarked (``mm``, ``addmm``...); ``model_op`` and ``features``
    are the operator of :data:`trainsim.kernels.features.OPS` whose model the row calibrates
    and that operator's inputs (``gemm`` with ``batch, m, n, k`` for all four GEMM calls).
    """

    suite: str
    op: str
    model_op: str
    features: tuple[tuple[str, float], ...]
    family: KernelFamily
    phase: Phase
    dtype: str
    params: tuple[tuple[str, Any], ...]  # sorted (name, value)
    shapes: tuple[tuple[int, ...], ...]
    flops: float
    bytes: float
    build: Builder = field(compare=False, repr=False)

    @property
    def key(self) -> str:
        """Identity of the case inside a dataset (with the device fingerprint)."""
        p = ",".join(f"{k}={v}" for k, v in self.params)
        return f"{self.suite}/{self.op}/{self.phase.value}/{self.dtype}/{p}"


@dataclass(frozen=True, slots=True)
class SweepSpec:
    """Where and how big: the device kind, quick or full, and what one case may cost there."""

    device: str = "cpu"
    quick: bool = False
    density: int = 1  # a full sweep draws this many times its usual shapes (they extend them)

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    def count(self, quick_n: int, full_factor: int = 5) -> int:
        """Cases per (op, phase, dtype): ``quick_n`` in a quick sweep, ``density × full_factor``×
        that (5× unless the op asks for more) in a full one."""
        return quick_n if self.quick else self.density * full_factor * quick_n

    @property
    def dtypes(self) -> tuple[str, ...]:
        """Floating dtypes swept by ops that support reduced precision."""
        if self.cuda:
            return ("bfloat16", "float16", "float32") if not self.quick else ("bfloat16", "float32")
        return ("float32",) if self.quick else ("float32", "bfloat16")

    # Conservative speeds (lower than peak) so the estimate errs towards "too slow".
    @property
    def flops_per_s(self) -> float:
        return 100e12 if self.cuda else 60e9

    @property
    def bandwidth_Bps(self) -> float:  # noqa: N802 - unit in the name (STYLE.md)
        return 1e12 if self.cuda else 5e9

    @property
    def max_case_s(self) -> float:
        """Longest estimated duration of one call: µs to tens of ms per measurement."""
        return 0.02

    @property
    def max_alloc_bytes(self) -> float:
        return 8e9 if self.cuda else 4e8

    def estimate_s(self, flops: float, nbytes: float) -> float:
        return max(flops / self.flops_per_s, nbytes / self.bandwidth_Bps)

    def fits(self, *, flops: float, nbytes: float, alloc_bytes: float | None = None) -> bool:
        alloc = nbytes if alloc_bytes is None else alloc_bytes
        return self.estimate_s(flops, nbytes) <= self.max_case_s and alloc <= self.max_alloc_bytes


# --- sampling ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogRange:
    """An integer log-uniform in [lo, hi]; from ``align`` up, a multiple of ``align``."""

    lo: int
    hi: int
    align: int = 8

    def at(self, u: float) -> int:
        """The value at quantile ``u`` in [0, 1)."""
        v = math.exp(math.log(self.lo) + u * (math.log(self.hi) - math.log(self.lo)))
        if v >= self.align:
            return min(self.hi, max(self.lo, round(v / self.align) * self.align))
        return max(self.lo, round(v))


@dataclass(frozen=True, slots=True)
class Choice:
    values: tuple[Any, ...]

    def at(self, u: float) -> Any:
        return self.values[min(int(u * len(self.values)), len(self.values) - 1)]


Dim = LogRange | Choice
_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29)


def _radical_inverse(i: int, base: int) -> float:
    f, r = 1.0, 0.0
    while i:
        f /= base
        r += f * (i % base)
        i //= base
    return r


def draw_params(
    *,
    seed: str,
    n: int,
    dims: Mapping[str, Dim],
    accept: Callable[[Params], bool],
    max_tries: int = 200,
) -> list[Params]:
    """Up to ``n`` distinct accepted draws, in draw order (deterministic for a given ``seed``).

    Points come from a Halton sequence (one prime base per dimension) rotated by a seeded random
    shift: space-filling like a Latin hypercube, but extensible, so the first ``n`` accepted
    points are the same whatever ``n`` — a quick sweep is a prefix of the full one.
    """
    import numpy as np

    if len(dims) > len(_PRIMES):
        raise ValueError(f"at most {len(_PRIMES)} swept dimensions, got {len(dims)}")
    shift = np.random.default_rng(zlib.crc32(seed.encode())).random(len(dims))
    out: list[Params] = []
    seen: set[tuple[Any, ...]] = set()
    for i in range(1, n * max_tries + 1):
        if len(out) >= n:
            break
        p = {
            name: d.at((_radical_inverse(i, base) + off) % 1.0)
            for (name, d), base, off in zip(dims.items(), _PRIMES, shift, strict=False)
        }
        ident = tuple(sorted(p.items()))
        if ident not in seen and accept(p):
            seen.add(ident)
            out.append(p)
    return out


PROBE_BASES = 8  # base points per swept dimension, drawn and at the dimension's low end


def doubling_probes(drawn: Sequence[Params], dims: Mapping[str, Dim], accept: Callable[[Params], bool]) -> list[Params]:  # fmt: skip
    """Pairs of points that differ only in one swept size, by a factor of two (full sweeps).

    The kernel models claim that twice the problem is never faster (``OpSpec.inputs`` signs)
    and keep a claim unless measured doublings contradict it
    (:func:`trainsim.kernels.monotone.data_claims`); a space-filling design almost never holds
    such pairs. For every :class:`LogRange` dimension: the first :data:`PROBE_BASES` drawn
    points and the same points with that dimension at its low end (where vector-width and
    blocking specializations show: torch's CPU softmax over rows of 8 takes 4x as long as over
    rows of 16), each with its double. Both points of a pair must be accepted; points already
    drawn are not repeated."""
    seen = {tuple(sorted(p.items())) for p in drawn}
    out: list[Params] = []
    for name, d in dims.items():
        if not isinstance(d, LogRange):
            continue
        lo = d.at(0.0)
        bases = [dict(p) for p in drawn[:PROBE_BASES]] + [
            {**p, name: lo} for p in drawn[:PROBE_BASES]
        ]
        for base in bases:
            twin = {**base, name: 2 * base[name]}
            if twin[name] > d.hi or not (accept(base) and accept(twin)):
                continue
            for p in (base, twin):
                ident = tuple(sorted(p.items()))
                if ident not in seen:
                    seen.add(ident)
                    out.append(p)
    return out


# --- building timed calls ------------------------------------------------------------------------


def torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def randn(shape: Sequence[int], *, dtype: str, device: Any, grad: bool = False) -> Any:
    import torch

    return torch.randn(*shape, dtype=torch_dtype(dtype), device=device, requires_grad=grad)


def autograd_call(phase: Phase, forward: Callable[..., Any], inputs: Sequence[Any]) -> Timed:
    """The forward call (grad mode on, as in training), or the backward of one forward output.

    Backward times ``torch.autograd.grad`` of the retained graph with a fixed random gradient,
    for every input that requires grad.
    """
    import torch

    if phase is Phase.FWD:
        return lambda: forward(*inputs)
    out = forward(*inputs)
    grad_out = torch.randn_like(out)
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    return lambda: torch.autograd.grad(out, leaves, grad_out, retain_graph=True)


@dataclass(frozen=True, slots=True)
class Cost:
    """What one call does: FLOPs, bytes moved, and memory allocated (default: ``bytes``)."""

    flops: float
    bytes: float
    alloc_bytes: float | None = None


@dataclass(frozen=True, slots=True)
class OpSweep:
    """How one op is swept: its shape space, cost and shapes per draw, and its timed call;
    ``model_op`` and ``features(params)`` say which kernel-model operator the rows calibrate.

    ``cost(phase, params, dtype)``, ``shapes(params)``, ``build(phase, dtype, params, device)``;
    ``valid(params)`` rejects draws the op cannot take (before the cost check); ``derive(params)``
    adds parameters computed from the drawn ones (features such as unique rows of a batch).
    """

    op: str
    model_op: str
    features: Callable[[Params], Mapping[str, float]]
    family: KernelFamily
    dims: Mapping[str, Dim]
    cost: Callable[[Phase, Params, str], Cost]
    shapes: Callable[[Params], Sequence[Sequence[int]]]
    build: Callable[[Phase, str, Params, Any], Timed]
    quick_cases: int = 16  # per (phase, dtype)
    full_factor: int = 5  # a full sweep draws this many times quick_cases
    phases: tuple[Phase, ...] = (Phase.FWD, Phase.BWD)
    dtypes: tuple[str, ...] | None = None  # None: the spec's floating dtypes
    valid: Callable[[Params], bool] | None = None
    derive: Callable[[Params], Params] | None = None
    backward_family: KernelFamily | None = None  # when its backward kernel is another family
    slowdown: float = 1.0  # how much slower than its roofline estimate the op is (sizing only)


def expand(suite: str, ops: Sequence[OpSweep], spec: SweepSpec) -> Iterator[Case]:
    """Every case of ``ops`` under ``spec``, op by op, phase by phase, dtype by dtype."""
    for o in ops:
        for phase in o.phases:
            for dtype in o.dtypes or spec.dtypes:

                def accept(
                    p: Params, o: OpSweep = o, phase: Phase = phase, dtype: str = dtype
                ) -> bool:
                    if o.valid is not None and not o.valid(p):
                        return False
                    c = o.cost(phase, {**p, **o.derive(p)} if o.derive else p, dtype)
                    return spec.fits(
                        flops=c.flops * o.slowdown,
                        nbytes=c.bytes * o.slowdown,
                        alloc_bytes=c.alloc_bytes,
                    )

                seed = f"{suite}/{o.op}/{phase.value}/{dtype}"
                points = draw_params(
                    seed=seed, n=spec.count(o.quick_cases, o.full_factor), dims=o.dims, accept=accept
                )
                if not spec.quick:
                    points += doubling_probes(points, o.dims, accept)
                for drawn in points:
                    p = {**drawn, **o.derive(drawn)} if o.derive else drawn
                    c = o.cost(phase, p, dtype)
                    yield Case(
                        suite=suite, op=o.op, model_op=o.model_op, phase=phase, dtype=dtype,
                        features=tuple(sorted((k, float(v)) for k, v in o.features(p).items())),
                        family=o.backward_family if phase is Phase.BWD and o.backward_family else o.family,
                        params=tuple(sorted(p.items())),
                        shapes=tuple(tuple(int(d) for d in s) for s in o.shapes(p)),
                        flops=float(c.flops), bytes=float(c.bytes),
                        build=partial(o.build, phase, dtype, p),
                    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Suite:
    """A named family of cases; ``cases(spec)`` lists them without allocating anything."""

    name: str
    doc: str
    cases: Callable[[SweepSpec], Iterator[Case]]


__all__ = [
    "DTYPE_BYTES",
    "DTYPE_LABEL",
    "Case",
    "Choice",
    "Cost",
    "Dim",
    "LogRange",
    "OpSweep",
    "Phase",
    "Suite",
    "SweepSpec",
    "autograd_call",
    "doubling_probes",
    "draw_params",
    "expand",
    "randn",
    "torch_dtype",
]
