"""Pipeline stages of GPT and MoE (GShard) models written in JAX, and how one is timed on a CPU.

A stage (:class:`StageSpec`) is ``layers`` consecutive transformer layers of a model, optionally
with the token/position embedding in front (the first pipeline stage) and the final layer norm,
LM head and cross-entropy loss behind (the last stage), for one micro-batch, as one device of a
tensor-parallel group of ``shard`` devices sees it (Megatron-style local shard: heads, FFN width
and vocabulary divided by ``shard``; MoE experts divided by ``shard`` as in expert parallelism).
Communication is not part of a stage (003 §V ignores it too). What is timed is the stage's
training work: forward, then backward from an upstream gradient (an input of the stage) to the
gradients of every parameter and of the stage input — the computation a pipeline stage runs per
micro-batch (``jax.value_and_grad`` of ``sum(out * upstream_grad)``; last stage: of the loss).

MoE stages follow GShard: every other layer (odd model-layer index) replaces the dense FFN by a
mixture of experts with top-2 gating, token groups of ``group_size`` tokens and an expert
capacity of ``capacity_factor · 2 · group_size / experts`` tokens per group, dispatch and combine
as one-hot einsums.

**Timing** (:func:`measure_stage`). Set the environment *before* ``jax`` is imported (the
collector does it in its own process, see :func:`single_thread_env`)::

    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"

and pin the process to one core (``os.sched_setaffinity``), so that a stage runs on one core and
its latency does not depend on what the other core does. The function is ``jax.jit``-compiled
ahead of time (``lower().compile()``, the compile time is recorded), run ``warmup`` times, then
timed ``repeats`` times (``time.perf_counter`` around a call and ``block_until_ready``); the
number of repeats is chosen so that the timed runs take at least ``min_total_s`` (between
``min_repeats`` and ``max_repeats``), and a stage whose repeats spread more than
``target_spread`` (relative IQR) is repeated further (up to ``max_total_s`` of timed runs). The
stage latency is the median; the spread (relative IQR and (max − min)/median) is stored with it.
The allocator settings of :data:`MALLOC_ENV` are part of the environment (see there).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

from trainsim.errors import ConfigError

FAMILIES = ("gpt", "moe")
PARTS = ("train", "forward")  # what a stage graph shows: the training step, or its forward
XLA_SINGLE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
# glibc keeps freed buffers (up to 32 MiB from the heap, no trimming) instead of returning them to
# the OS, so a timed run reuses memory like a framework's caching allocator instead of paying
# fresh page faults; measured here: 3-5 % faster and half the repeat-to-repeat spread.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "4294967296",
              "MALLOC_TOP_PAD_": "268435456"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class StageSpec:
    """One pipeline stage of a GPT or MoE model for one micro-batch (see the module docstring)."""

    family: str
    hidden: int
    heads: int
    seq: int
    micro_batch: int
    layers: int
    first_layer: int = 0  # model index of the stage's first layer (MoE: odd layers are MoE)
    shard: int = 1  # tensor/expert-parallel degree; this stage is one device's shard
    embed: bool = False  # the first stage: token and position embedding
    head: bool = False  # the last stage: final norm, LM head, cross-entropy
    vocab: int = 16384
    ffn_mult: int = 4
    experts: int = 0  # MoE only
    group_size: int = 0  # MoE: tokens per gating group
    capacity_factor: float = 0.0  # MoE

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ConfigError(f"stage family must be one of {', '.join(FAMILIES)}, got {self.family!r}")
        for name in ("hidden", "heads", "seq", "micro_batch", "shard", "vocab", "ffn_mult"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.layers < 0 or (self.layers == 0 and not (self.embed or self.head)):
            raise ConfigError(f"a stage needs layers >= 1 or an embedding/head, got {self}")
        if self.hidden % self.heads or self.heads % self.shard:
            raise ConfigError(f"heads must divide hidden and shard must divide heads: {self}")
        if self.vocab % self.shard or (self.hidden * self.ffn_mult) % self.shard:
            raise ConfigError(f"shard must divide the vocabulary and the FFN width: {self}")
        if self.family == "moe":
            if self.experts < 2 or self.experts % self.shard:
                raise ConfigError(f"MoE stages need experts >= 2, divisible by shard: {self}")
            tokens = self.micro_batch * self.seq
            if self.group_size <= 0 or tokens % self.group_size:
                raise ConfigError(f"group_size must divide micro_batch * seq: {self}")

    def __str__(self) -> str:
        """A one-line description for messages (the repr lists every field)."""
        parts = [f"{self.family} layers {self.first_layer}-{self.first_layer + self.layers - 1}"
                 if self.layers else f"{self.family} (no layers)",
                 f"hidden {self.hidden}, {self.heads} heads, seq {self.seq}, micro-batch {self.micro_batch}"]  # fmt: skip
        if self.shard > 1:
            parts.append(f"shard 1/{self.shard}")
        if self.family == "moe":
            parts.append(f"{self.experts} experts, groups of {self.group_size}")
        parts += [w for w, on in (("+ embedding", self.embed), ("+ head", self.head)) if on]
        return ", ".join(parts)

    @property
    def moe_layers(self) -> int:
        if self.family != "moe":
            return 0
        return sum((self.first_layer + i) % 2 == 1 for i in range(self.layers))

    @property
    def capacity(self) -> int:
        """Expert capacity per group (GShard: top-2, ``capacity_factor``)."""
        return max(1, math.ceil(self.capacity_factor * 2 * self.group_size / self.experts))

    def flops(self) -> float:
        """Forward + backward FLOPs of the stage (3x forward; matmuls and attention only)."""
        tok, h, s = self.micro_batch * self.seq, self.hidden, self.seq
        t = self.shard
        attn = 2 * tok * h * (3 * h // t) + 2 * tok * (h // t) * h + 4 * tok * s * (h // t)
        dense_ffn = 4 * tok * h * (self.ffn_mult * h // t)
        f = self.layers * attn + (self.layers - self.moe_layers) * dense_ffn
        if self.moe_layers:
            groups = tok // self.group_size
            el = self.experts // t
            cap = self.capacity
            expert = 4 * el * groups * cap * h * self.ffn_mult * h
            dispatch = 2 * 2 * tok * el * cap * h + 2 * tok * h * self.experts
            f += self.moe_layers * (expert + dispatch)
        if self.embed:
            f += 2 * tok * h  # gather + add: memory bound, counted lightly
        if self.head:
            f += 2 * tok * h * (self.vocab // t)
        return 3.0 * f

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> StageSpec:
        """A spec from its :meth:`to_dict` (one-line :class:`ConfigError` naming a bad field)."""
        if not isinstance(d, dict):
            raise ConfigError(f"a stage spec is an object of fields, got {type(d).__name__}")
        types = {f.name: f.type for f in fields(cls)}
        unknown = set(d) - set(types)
        if unknown:
            raise ConfigError(f"unknown stage fields {sorted(unknown)}")
        missing = [f.name for f in fields(cls) if f.name not in d and f.default is MISSING]
        if missing:
            raise ConfigError(f"stage fields {missing} missing")
        for name, value in d.items():
            want = types[name]
            ok = (isinstance(value, bool) if want == "bool" else isinstance(value, str) if want == "str"
                  else not isinstance(value, bool) and isinstance(value, int if want == "int" else (int, float)))  # fmt: skip
            if not ok or (want == "float" and not math.isfinite(value)):
                what = {"bool": "true or false", "str": "text", "int": "an integer"}.get(str(want), "a finite number")
                raise ConfigError(f"{name} must be {what}, got {value!r}")
        return cls(**d)

    def key(self) -> str:
        """A stable text id of the stage (equal stages have equal keys)."""
        return ",".join(f"{k}={v}" for k, v in sorted(self.to_dict().items()))

    def digest(self) -> str:
        """:meth:`key` as 12 hex digits (a predictor's ``split_specs`` records these)."""
        import hashlib

        return hashlib.sha256(self.key().encode()).hexdigest()[:12]


def single_thread_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a timing process needs (set before ``import jax``)."""
    out = dict(os.environ if env is None else env)
    flags = out.get("XLA_FLAGS", "")
    if "xla_cpu_multi_thread_eigen" not in flags:
        out["XLA_FLAGS"] = (flags + " " + XLA_SINGLE_THREAD).strip()
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        out[var] = "1"
    out |= MALLOC_ENV
    out.setdefault("JAX_PLATFORMS", "cpu")
    return out


# --- the stage as a JAX function -------------------------------------------------------------


def _layer_norm(x: Any, g: Any, b: Any) -> Any:
    import jax.numpy as jnp

    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * (1.0 / jnp.sqrt(var + 1e-5)) * g + b


def _attention(p: dict[str, Any], x: Any, spec: StageSpec) -> Any:
    import jax
    import jax.numpy as jnp

    b, s, _ = x.shape
    nh = spec.heads // spec.shard
    hd = spec.hidden // spec.heads
    qkv = x @ p["wqkv"] + p["bqkv"]
    q, k, v = jnp.split(qkv.reshape(b, s, 3, nh, hd), 3, axis=2)
    q, k, v = (t.reshape(b, s, nh, hd).transpose(0, 2, 1, 3) for t in (q, k, v))
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) * (1.0 / math.sqrt(hd))
    causal = jnp.tril(jnp.ones((s, s), dtype=bool))
    scores = jnp.where(causal, scores, -1e9)
    probs = jax.nn.softmax(scores, axis=-1)
    ctx = jnp.einsum("bhqk,bhkd->bhqd", probs, v).transpose(0, 2, 1, 3).reshape(b, s, nh * hd)
    return ctx @ p["wo"] + p["bo"]


def _dense_ffn(p: dict[str, Any], x: Any) -> Any:
    import jax

    return jax.nn.gelu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def _moe_ffn(p: dict[str, Any], x: Any, spec: StageSpec) -> Any:
    """GShard top-2 MoE over this device's ``experts / shard`` experts."""
    import jax
    import jax.numpy as jnp

    b, s, h = x.shape
    gs, e, c = spec.group_size, spec.experts, spec.capacity
    el = e // spec.shard
    xg = x.reshape(b * s // gs, gs, h)
    probs = jax.nn.softmax(jnp.einsum("gsm,me->gse", xg, p["wg"]), axis=-1)
    gate, idx = jax.lax.top_k(probs, 2)
    m1 = jax.nn.one_hot(idx[..., 0], e, dtype=x.dtype)
    m2 = jax.nn.one_hot(idx[..., 1], e, dtype=x.dtype)
    pos1 = jnp.cumsum(m1, axis=1) - 1.0
    pos2 = jnp.cumsum(m2, axis=1) - 1.0 + jnp.sum(m1, axis=1, keepdims=True)
    m1 = m1 * (pos1 < c)
    m2 = m2 * (pos2 < c)
    p1 = jax.nn.one_hot(jnp.sum(pos1 * m1, axis=-1).astype(jnp.int32), c, dtype=x.dtype)
    p2 = jax.nn.one_hot(jnp.sum(pos2 * m2, axis=-1).astype(jnp.int32), c, dtype=x.dtype)
    combine = (gate[..., 0:1, None] * m1[..., None] * p1[:, :, None, :]
               + gate[..., 1:2, None] * m2[..., None] * p2[:, :, None, :])  # fmt: skip
    combine = combine[:, :, :el, :]  # this device's experts
    dispatch = (combine > 0).astype(x.dtype)
    xe = jnp.einsum("gsec,gsm->egcm", dispatch, xg)
    he = jax.nn.gelu(jnp.einsum("egcm,emf->egcf", xe, p["we1"]))
    ye = jnp.einsum("egcf,efm->egcm", he, p["we2"])
    return jnp.einsum("gsec,egcm->gsm", combine, ye).reshape(b, s, h)


def _layer(p: dict[str, Any], x: Any, spec: StageSpec, moe: bool) -> Any:
    x = x + _attention(p, _layer_norm(x, p["ln1_g"], p["ln1_b"]), spec)
    y = _layer_norm(x, p["ln2_g"], p["ln2_b"])
    return x + (_moe_ffn(p, y, spec) if moe else _dense_ffn(p, y))


def _param_layout(spec: StageSpec) -> dict[str, Any]:
    """The stage's parameters as ``name -> (kind, shape)`` (``kind``: ``w`` random, ``ones``,
    ``zeros``), nested per layer, in the order :func:`init_params` draws them."""
    h, t = spec.hidden, spec.shard
    f = spec.ffn_mult * h
    params: dict[str, Any] = {}
    for i in range(spec.layers):
        moe = spec.family == "moe" and (spec.first_layer + i) % 2 == 1
        lp = {"ln1_g": ("ones", (h,)), "ln1_b": ("zeros", (h,)), "ln2_g": ("ones", (h,)), "ln2_b": ("zeros", (h,)),
              "wqkv": ("w", (h, 3 * h // t)), "bqkv": ("zeros", (3 * h // t,)), "wo": ("w", (h // t, h)),
              "bo": ("zeros", (h,))}  # fmt: skip
        if moe:
            el = spec.experts // t
            lp |= {"wg": ("w", (h, spec.experts)), "we1": ("w", (el, h, f)), "we2": ("w", (el, f, h))}  # fmt: skip
        else:
            lp |= {"w1": ("w", (h, f // t)), "b1": ("zeros", (f // t,)), "w2": ("w", (f // t, h)),
                   "b2": ("zeros", (h,))}  # fmt: skip
        params[f"layer{i}"] = lp
    if spec.embed:
        params["wte"] = ("w", (spec.vocab // t, h))
        params["wpe"] = ("w", (spec.seq, h))
    if spec.head:
        params["lnf_g"], params["lnf_b"] = ("ones", (h,)), ("zeros", (h,))
        params["lm_head"] = ("w", (h, spec.vocab // t))
    return params


def init_params(spec: StageSpec, seed: int = 0) -> dict[str, Any]:
    """Random parameters of the stage's local shard (float32)."""
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(seed)  # numpy: no XLA compilation for initialisation

    def make(leaf: Any) -> Any:
        if isinstance(leaf, dict):
            return {k: make(v) for k, v in leaf.items()}
        kind, shape = leaf
        if kind == "w":
            return jnp.asarray(rng.standard_normal(shape, dtype=np.float32) / math.sqrt(shape[-2]))
        return jnp.ones(shape) if kind == "ones" else jnp.zeros(shape)

    return make(_param_layout(spec))


def _abstract_params(spec: StageSpec) -> dict[str, Any]:
    """:func:`init_params`' shapes and dtypes without values (``jax.ShapeDtypeStruct``): enough
    to trace the stage (drawing an LM head's random weights took most of a trace's time)."""
    import jax
    import jax.numpy as jnp

    def make(leaf: Any) -> Any:
        if isinstance(leaf, dict):
            return {k: make(v) for k, v in leaf.items()}
        return jax.ShapeDtypeStruct(leaf[1], jnp.float32)

    return make(_param_layout(spec))


def stage_function(
    spec: StageSpec, *, part: str = "train", abstract: bool = False
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """``(fn, args)``: the stage's training step (loss and gradients) and example inputs.

    ``part="forward"`` gives the forward computation alone (the scalar the step differentiates).
    ``abstract``: the inputs as ``jax.ShapeDtypeStruct`` (shapes and dtypes, no values), for
    tracing only.
    """
    if part not in PARTS:
        raise ConfigError(f"part must be one of {PARTS}, got {part!r}")
    import jax
    import jax.numpy as jnp
    import numpy as np

    b, s, h = spec.micro_batch, spec.seq, spec.hidden
    rng = np.random.default_rng(1)
    params = _abstract_params(spec) if abstract else init_params(spec)

    def data(shape: tuple[int, ...], dtype: Any, draw: Callable[[], Any]) -> Any:
        return jax.ShapeDtypeStruct(shape, dtype) if abstract else jnp.asarray(draw())

    def forward(p: dict[str, Any], x: Any) -> Any:
        if spec.embed:
            x = jnp.take(p["wte"], x, axis=0) + p["wpe"][None]
        for i in range(spec.layers):
            moe = spec.family == "moe" and (spec.first_layer + i) % 2 == 1
            x = _layer(p[f"layer{i}"], x, spec, moe)
        return x

    if spec.embed:
        x0 = data((b, s), jnp.int32, lambda: rng.integers(0, spec.vocab // spec.shard, (b, s), dtype=np.int32))  # fmt: skip
    else:
        x0 = data((b, s, h), jnp.float32, lambda: rng.standard_normal((b, s, h), dtype=np.float32))
    if spec.head:
        labels = data((b, s), jnp.int32, lambda: rng.integers(0, spec.vocab // spec.shard, (b, s), dtype=np.int32))  # fmt: skip

        def loss(p: dict[str, Any], x: Any, y: Any) -> Any:
            z = _layer_norm(forward(p, x), p["lnf_g"], p["lnf_b"]) @ p["lm_head"]
            logp = jax.nn.log_softmax(z, axis=-1)
            return -jnp.mean(jnp.take_along_axis(logp, y[..., None], axis=-1))

        extra = labels
    else:
        cot = data((b, s, h), jnp.float32, lambda: rng.standard_normal((b, s, h), dtype=np.float32))

        def loss(p: dict[str, Any], x: Any, y: Any) -> Any:  # y: the output's cotangent
            return jnp.sum(forward(p, x) * y)

        extra = cot
    if part == "forward":
        return loss, (params, x0, extra)
    argnums = 0 if spec.embed else (0, 1)
    return jax.value_and_grad(loss, argnums=argnums), (params, x0, extra)


def stage_jaxpr(spec: StageSpec, *, part: str = "train") -> Any:
    """The stage's training step (or its forward ``part``) as a ``ClosedJaxpr``; nothing runs."""
    import jax

    fn, args = stage_function(spec, part=part, abstract=True)  # shapes suffice: no weights drawn
    return jax.make_jaxpr(fn)(*args)


def stage_graph(spec: StageSpec, *, part: str = "train") -> Any:
    """The stage's full (unpruned) :class:`~trainsim.learn.graphs.StageGraph` of ``part``: what
    ``stages collect`` stores and a predictor reads (one builder for both; nothing runs)."""
    from trainsim.learn.graphs import graph_from_jaxpr

    return graph_from_jaxpr(stage_jaxpr(spec, part=part))


@dataclass(frozen=True, slots=True)
class Timing:
    median_s: float
    samples_s: tuple[float, ...]
    compile_s: float
    warmup: int

    @property
    def rel_iqr(self) -> float:
        from trainsim.bench.dataset import relative_iqr

        return relative_iqr(self.samples_s)

    @property
    def rel_range(self) -> float:
        return (max(self.samples_s) - min(self.samples_s)) / self.median_s


def measure_stage(spec: StageSpec, *, warmup: int = 2, min_repeats: int = 5, max_repeats: int = 60,
                  min_total_s: float = 1.0, target_spread: float = 0.02,
                  max_total_s: float = 6.0) -> Timing:  # fmt: skip
    """Compile and time the stage's training step (see the module docstring).

    After the planned repeats, a stage whose relative IQR exceeds ``target_spread`` is repeated
    further, until it does not, ``max_repeats`` or ``max_total_s`` of timed runs.
    """
    import jax

    from trainsim.bench.dataset import relative_iqr

    fn, args = stage_function(spec)
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    first = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    one = time.perf_counter() - first
    for _ in range(warmup - 1):
        jax.block_until_ready(compiled(*args))
    repeats = min(max_repeats, max(min_repeats, math.ceil(min_total_s / max(one, 1e-6))))
    samples: list[float] = []
    while len(samples) < repeats or (
        relative_iqr(samples) > target_spread
        and len(samples) < max_repeats
        and sum(samples) < max_total_s
    ):
        t = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        samples.append(time.perf_counter() - t)
    return Timing(statistics.median(samples), tuple(samples), compile_s, warmup)


__all__ = [
    "FAMILIES",
    "PARTS",
    "StageSpec",
    "Timing",
    "init_params",
    "measure_stage",
    "single_thread_env",
    "stage_function",
    "stage_graph",
    "stage_jaxpr",
]
