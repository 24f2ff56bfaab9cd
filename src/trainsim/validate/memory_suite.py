"""The ``memory`` suite: predicted peak memory of eager HuggingFace training steps against the
peak measured of the same steps, run for real on this machine's CPU.

For each case (:data:`CASES`: five transformers families — LLaMA, Qwen2 with tied embeddings,
Mistral with a sliding window shorter than the sequence, Qwen3, GPT-2 — at three small shapes,
AdamW and SGD, with and without gradient checkpointing, fp32; two with two accumulated
micro-batches, four under DDP on two gloo ranks, six in bf16, eight under FSDP2 on two gloo
ranks, five full shard (zero 3) and three SHARD_GRAD_OP (zero 2)):

* **measured**: the model (``AutoModelForCausalLM.from_config``, fp32, SDPA attention) trains
  one step (forward with labels, backward, ``optimizer.step()``, ``zero_grad()``) to create its
  optimizer state, then one more under ``torch.profiler`` with ``profile_memory=True``. The
  peak is the bytes alive before the profiled step (the unique storages of the parameters,
  buffers, optimizer state and the batch) plus the highest running sum of the profiler's
  allocation events during it (what the CPU allocator handed out, not what it reserved). The
  operator running at the peak is reported with it.
* **baseline**: the same memory with every term alive at once (``at_peak=False``: weights,
  gradients, optimizer state, activations and buffers added, as the fused stacks keep them).
* **predicted**: ``trainsim predict`` of the same model read from its ``config.json``
  (:func:`trainsim.builders.models.read_hf_config`), ``impl hf``, ``dtype fp32``, one GPU:
  :func:`trainsim.builders.memory.memory_per_gpu` without the CUDA context and cuBLAS
  workspace (``overhead_bytes=0``; no communicator at one GPU), which the CPU has no analogue of.

The training loop keeps the model's output (its logits) until the step ends, as a loop that
reads ``outputs.loss`` does (HF Trainer's ``compute_loss`` drops it before the backward: the
logits' ``e·T·V`` bytes less there). DDP cases (``world`` 2): the ranks run as processes over
gloo, everything under the profiler from the model's construction (DDP's bucket tensors are
allocated there and no Python reference reaches them), five warm steps (DDP rebuilds its
buckets in its second), then the measured one; each DDP case is launched twice and the lower
peak taken (``measured_runs_mib`` has both): on a loaded machine 4 of 13 launches kept the
bucket set DDP allocates at construction alive beside the rebuilt one through the measured
step (one bucket set, 21.6 MiB, more; 0 of 13 on a quiet machine; cause not found); predicted at dp 2 without NCCL's per-communicator
buffers (:data:`~trainsim.builders.memory.NCCL_COMM_BYTES`), which gloo has no analogue of.
FSDP cases (``zero`` 3 or 2): ``fully_shard`` per decoder layer, then the root, with
``reshard_after_forward`` True or False (:func:`_fully_shard`, as accelerate wraps a transformers
model), measured the same way but only on the thread that runs the step, the collectives
staged through a buffer allocated before the profiler starts (:class:`_StagedComms`: gloo's own
copies, and frees the profiler misses in its threads, are no part of what NCCL would allocate);
predicted at ``zero`` 3 or 2, dp 2, without NCCL's buffers.

Why a CPU measures what a GPU would hold: the tensors a training step allocates are the same
shapes and dtypes on either device, with exceptions the cases avoid or the model states:
dropout (CPU's mask is the input's dtype, CUDA's a bool: no case trains with dropout); SDPA's
backend (the CPU flash kernel saves what CUDA's flash kernel saves, the activation census's
``backends`` note; no case has a mask SDPA's flash path refuses, but Mistral's window, whose
additive mask both devices keep); the caching allocator's rounding and fragmentation on CUDA,
which the model leaves out (``--memory-headroom``). Dtype: fp32, and six bf16 cases with the model
in bf16 (``model.to(torch.bfloat16)``: its gradients and AdamW's moments bf16 too, as
``Precision.for_dtype(..., "hf")`` has them); autocast over fp32 weights is not a case.
"""

from __future__ import annotations

import gc
import json
import math
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trainsim.errors import ConfigError
from trainsim.validate.registry import error_summary

MiB = 1024**2


@dataclass(frozen=True, slots=True)
class Shape:
    hidden: int
    layers: int
    vocab: int
    batch: int
    seq: int

    @property
    def label(self) -> str:
        return f"d{self.hidden} L{self.layers} V{self.vocab} b{self.batch} s{self.seq}"


@dataclass(frozen=True, slots=True)
class Case:
    family: str  # a key of _CONFIGS
    shape: Shape
    optimizer: str  # "adam" (torch AdamW, foreach as on a GPU) or "sgd" (foreach, no momentum)
    checkpointing: bool  # transformers' gradient checkpointing: trainsim's recompute full
    accumulation: int = 1  # micro-batches per optimizer step
    world: int = 1  # > 1: PyTorch DDP over that many gloo ranks (processes) on this machine
    dtype: str = "fp32"  # or "bf16": the model trained in bf16 (model.to(torch.bfloat16))
    zero: int = 0  # with world > 1: 3 FSDP2 full shard, 2 FSDP2 without resharding after forward (SHARD_GRAD_OP)

    @property
    def name(self) -> str:
        ck = "-ckpt" if self.checkpointing else ""
        acc = f"-acc{self.accumulation}" if self.accumulation > 1 else ""
        ddp = (f"-fsdp{self.world}-zero{self.zero}" if self.zero >= 2 else f"-ddp{self.world}") if self.world > 1 else ""
        bf16 = "-bf16" if self.dtype == "bf16" else ""
        return f"{self.family}-{self.shape.label.replace(' ', '-')}-{self.optimizer}{ck}{acc}{ddp}{bf16}"


SHAPES = (Shape(256, 2, 8192, 4, 256), Shape(512, 4, 32000, 1, 128), Shape(384, 3, 16384, 2, 512))
FAMILIES = ("llama", "qwen2-tied", "mistral-window", "qwen3", "gpt2")
CASES: tuple[Case, ...] = tuple(
    Case(f, sh, opt, ck) for f in FAMILIES for sh in SHAPES for opt in ("adam", "sgd") for ck in (False, True)
) + tuple(Case("llama", SHAPES[0], opt, False, 2) for opt in ("adam", "sgd")) + (
    Case("llama", SHAPES[0], "adam", False, world=2), Case("llama", SHAPES[0], "sgd", True, world=2),
    Case("qwen2-tied", SHAPES[1], "sgd", False, world=2), Case("llama", SHAPES[1], "adam", False, world=2),
) + (  # bf16: the eager parameters, gradients and AdamW moments all in bf16
    Case("llama", SHAPES[0], "adam", False, dtype="bf16"), Case("llama", SHAPES[0], "sgd", True, dtype="bf16"),
    Case("llama", SHAPES[1], "adam", False, dtype="bf16"), Case("qwen2-tied", SHAPES[1], "sgd", False, dtype="bf16"),
    Case("qwen3", SHAPES[0], "adam", True, dtype="bf16"), Case("mistral-window", SHAPES[0], "sgd", False, dtype="bf16"),
) + (  # FSDP2 on two gloo ranks: full shard (zero 3) and SHARD_GRAD_OP (zero 2)
    Case("llama", SHAPES[0], "adam", False, world=2, zero=3), Case("llama", SHAPES[0], "sgd", True, world=2, zero=3),
    Case("qwen2-tied", SHAPES[1], "sgd", False, world=2, zero=3), Case("llama", SHAPES[1], "adam", False, world=2, zero=3),
    Case("llama", SHAPES[0], "adam", False, world=2, dtype="bf16", zero=3),
    Case("llama", SHAPES[0], "adam", False, world=2, zero=2), Case("qwen2-tied", SHAPES[1], "adam", False, world=2, zero=2),
    Case("llama", SHAPES[1], "adam", False, world=2, zero=2),
)  # fmt: skip


def _config(family: str, sh: Shape) -> Any:
    """The transformers config of a case (fp32, SDPA attention, no dropout)."""
    import transformers as tf

    d, heads = sh.hidden, sh.hidden // 64
    common: dict[str, Any] = {"hidden_size": d, "num_hidden_layers": sh.layers, "num_attention_heads": heads,
                              "vocab_size": sh.vocab, "max_position_embeddings": max(sh.seq, 128),
                              "intermediate_size": (8 * d // 3 + 63) // 64 * 64}  # fmt: skip
    gqa: dict[str, Any] = {"num_key_value_heads": max(heads // 2, 1)}
    cfg: Any
    if family == "llama":
        cfg = tf.LlamaConfig(**common, **gqa, tie_word_embeddings=False)
    elif family == "qwen2-tied":  # Qwen2-0.5B's layout: q/k/v biases, tied embeddings
        cfg = tf.Qwen2Config(**common, **gqa, tie_word_embeddings=True)
    elif family == "mistral-window":
        cfg = tf.MistralConfig(**common, **gqa, sliding_window=sh.seq // 2, tie_word_embeddings=False)
    elif family == "qwen3":
        cfg = tf.Qwen3Config(**common, **gqa, head_dim=64, tie_word_embeddings=False)
    elif family == "gpt2":
        cfg = tf.GPT2Config(n_embd=d, n_layer=sh.layers, n_head=heads, vocab_size=sh.vocab,
                            n_positions=max(sh.seq, 128), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    else:
        raise ConfigError(f"memory suite: unknown family {family!r}; known: {', '.join(FAMILIES)}")
    cfg._attn_implementation = "sdpa"
    return cfg


def _checkpoint(model: Any) -> None:
    """Gradient checkpointing as the activation census took it (non-reentrant, every layer;
    transformers 5 calls the method deprecated in favour of activation_checkpointing_enable)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _storage_bytes(tensors: list[Any]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def measure_step_peak(model: Any, batch: Any, optimizer: Any, accumulation: int = 1) -> dict[str, Any]:
    """The peak bytes of one training step of ``model`` on ``batch`` (token ids, also the labels):
    ``accumulation`` forward/backward passes, the optimizer step and ``zero_grad()``. Runs one
    step first (the optimizer's state), then profiles one: ``persistent_bytes`` alive before it,
    ``transient_bytes`` the highest running sum of its CPU allocations, ``peak_at`` the innermost
    operator running then."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    def step() -> None:
        for _ in range(accumulation):
            out = model(input_ids=batch, labels=batch)
            out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    state = [v for st in optimizer.state.values() for v in st.values() if torch.is_tensor(v)]
    persistent = _storage_bytes([*model.parameters(), *model.buffers(), *state, batch])
    with tempfile.TemporaryDirectory() as td:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step()
        path = Path(td) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text(encoding="utf-8"))["traceEvents"]
    memory = sorted((e for e in events if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 0),
                    key=lambda e: e["ts"])  # fmt: skip
    if not memory:
        raise ConfigError("memory suite: the profiler recorded no CPU allocation (profile_memory)")
    running, peak, peak_ts = 0, 0, memory[0]["ts"]
    for e in memory:
        running += int(e["args"]["Bytes"])
        if running > peak:
            peak, peak_ts = running, e["ts"]
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"
           and e["ts"] <= peak_ts <= e["ts"] + e.get("dur", 0)]  # fmt: skip
    at = max(ops, key=lambda e: e["ts"])["name"] if ops else ""
    return {"persistent_bytes": persistent, "transient_bytes": peak,
            "peak_at": at.replace("autograd::engine::evaluate_function: ", "")}


def measure_lifetime_peak(build: Any, accumulation: int = 1, warm: int = 5, *, main_thread: bool = False) -> dict[str, Any]:
    """As :func:`measure_step_peak`, with everything under the profiler: ``build()`` makes
    ``(model, optimizer, batch)`` inside it, ``warm`` steps run (DDP rebuilds its buckets in
    its second; :func:`run_case` says what some launches kept beside them), then the measured
    one; ``persistent_bytes`` is the running sum of the
    allocations as it starts (what exists then, DDP's buckets included, which no Python
    reference reaches), ``transient_bytes`` the highest rise above it during the step,
    ``persistent_by_op`` the largest groups of the persistent bytes by the operator that
    allocated them. ``main_thread``: only the allocations of the thread that runs the step (the
    FSDP cases: not gloo's own buffers in its runloop threads, which NCCL's counterpart keeps
    outside PyTorch's allocator)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with tempfile.TemporaryDirectory() as td:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            model, optimizer, batch = build()
            for i in range(warm + 1):
                if i == warm:
                    gc.collect()  # what a long run's collector has freed by then (see the docstring)
                with record_function("trainsim-measured-step" if i == warm else "trainsim-warm-step"):
                    for _ in range(accumulation):
                        out = model(input_ids=batch, labels=batch)  # kept, as measure_step_peak's loop does
                        out.loss.backward()
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    del out
        path = Path(td) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text(encoding="utf-8"))["traceEvents"]
    [mark] = [e for e in events if e.get("name") == "trainsim-measured-step"]
    start, end = mark["ts"], mark["ts"] + mark["dur"]
    memory = sorted((e for e in events if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 0
                     and (not main_thread or e.get("tid") == mark.get("tid"))), key=lambda e: e["ts"])  # fmt: skip
    spans = sorted((e["ts"], e["ts"] + e.get("dur", 0), e["name"]) for e in events
                   if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation"))  # fmt: skip

    def op_at(ts: float) -> str:
        inner = [name for a, b, name in spans if a <= ts <= b]
        return " > ".join(inner[-2:]).replace("autograd::engine::evaluate_function: ", "")

    running, before, peak, peak_ts = 0, None, 0, start
    live: dict[int, tuple[int, float]] = {}
    alive_at_start: dict[int, tuple[int, float]] = {}
    for e in memory:
        if before is None and e["ts"] >= start:
            before = peak = running
            alive_at_start = dict(live)
        n = int(e["args"]["Bytes"])
        running += n
        if n > 0:
            live[e["args"]["Addr"]] = (n, e["ts"])
        else:
            live.pop(e["args"]["Addr"], None)
        if start <= e["ts"] <= end and running > peak:
            peak, peak_ts = running, e["ts"]
    if before is None:
        raise ConfigError("memory suite: the profiler recorded no CPU allocation in the measured step")
    by_op: dict[str, int] = {}
    for n, ts in alive_at_start.values():
        key = op_at(ts)
        by_op[key] = by_op.get(key, 0) + n
    top = sorted(by_op.items(), key=lambda kv: -kv[1])[:6]
    ops = [name for a, b, name in spans if a <= peak_ts <= b and not name.startswith("trainsim-")]
    return {"persistent_bytes": before, "transient_bytes": peak - before,
            "peak_at": (ops[-1] if ops else "").replace("autograd::engine::evaluate_function: ", ""),
            "persistent_by_op": [{"allocated_in": k, "bytes": v} for k, v in top]}


def _build(case: Case, ddp: bool) -> Any:
    """A builder of ``case``'s (model, optimizer, batch) for :func:`measure_lifetime_peak`."""

    def build() -> tuple[Any, Any, Any]:
        import torch
        from transformers import AutoModelForCausalLM

        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(_config(case.family, case.shape))
        if case.dtype == "bf16":
            model = model.to(torch.bfloat16)
        model.train()
        if case.checkpointing:
            _checkpoint(model)
        if ddp and case.zero >= 2:
            _fully_shard(model, reshard_after_forward=case.zero == 3)
        elif ddp:
            model = torch.nn.parallel.DistributedDataParallel(model)
        params = list(model.parameters())
        opt = (torch.optim.AdamW(params, lr=1e-4, foreach=True) if case.optimizer == "adam"
               else torch.optim.SGD(params, lr=1e-3, foreach=True))  # fmt: skip
        return model, opt, torch.randint(0, case.shape.vocab, (case.shape.batch, case.shape.seq))

    return build


def _decoder_layers(model: Any) -> list[Any]:
    """The decoder layers of a transformers causal LM (``model.model.layers``, GPT-2's
    ``model.transformer.h``): accelerate's transformer wrap policy's units (``_no_split_modules``)."""
    inner = getattr(model, "model", None) or model.transformer
    return list(inner.layers if hasattr(inner, "layers") else inner.h)


def _fully_shard(model: Any, *, reshard_after_forward: bool) -> None:
    """FSDP2 as accelerate's ``fsdp2_prepare_model`` applies it to a transformers model: each
    decoder layer, then the root (embedding, final norm, head) with the same
    ``reshard_after_forward`` (True for FULL_SHARD, False for SHARD_GRAD_OP); no mixed-precision
    policy (the parameters' own dtype). The collectives go through :class:`_StagedComms`."""
    from torch.distributed.fsdp import fully_shard

    for layer in _decoder_layers(model):
        fully_shard(layer, reshard_after_forward=reshard_after_forward)
    fully_shard(model, reshard_after_forward=reshard_after_forward)
    comms = _StagedComms.instance
    if comms is None:
        raise ConfigError("memory suite: FSDP cases need their staging buffer (_StagedComms.setup) first")
    for module in model.modules():
        if hasattr(module, "set_custom_all_gather"):
            module.set_custom_all_gather(comms.all_gather())
            module.set_custom_reduce_scatter(comms.reduce_scatter())


class _StagedComms:
    """FSDP2's all-gather and reduce-scatter through one staging buffer allocated before the
    profiler starts, so that gloo never holds a tensor FSDP allocates. gloo's reduce-scatter
    clones its input and its all-gather allocates a temporary output on the calling thread (the
    clone is released in gloo's runloop thread, whose frees the profiler does not record: the
    running sum then kept 3–32 MiB of freed gradients, differently on the two ranks); NCCL
    does neither. FSDP's own buffers (``foreach_all_gather``'s output, ``foreach_reduce``'s
    input and output) are allocated as its default comms allocate them (``torch.empty``);
    the data are copied through the staging buffer (``all_reduce``, in place), which allocates
    nothing. Results equal gloo's collectives (sum, then ``AVG``'s division)."""

    instance: _StagedComms | None = None

    def __init__(self, nbytes: int) -> None:
        import torch

        self.buffer = torch.empty(nbytes, dtype=torch.uint8)

    @classmethod
    def setup(cls, case: Case, world: int) -> None:
        """A buffer as large as every parameter padded to ``world`` rows (no unit is larger)."""
        import torch
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(_config(case.family, case.shape))
        size = 2 if case.dtype == "bf16" else 4
        cls.instance = cls(sum(-(-p.shape[0] // world) * world * (p.numel() // max(p.shape[0], 1)) * size
                               for p in model.parameters()))  # fmt: skip

    def _view(self, numel: int, dtype: Any) -> Any:
        import torch

        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if nbytes > self.buffer.numel():
            raise ConfigError(f"memory suite: FSDP staging buffer of {self.buffer.numel()} bytes, {nbytes} needed")
        return self.buffer[:nbytes].view(dtype)

    def all_gather(self) -> Any:
        import torch.distributed as dist
        from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather

        comms = self

        class Staged(AllGather):
            def allocate(self, size: Any, *, dtype: Any, device: Any) -> Any:
                import torch

                return torch.empty(*size, dtype=dtype, device=device)

            def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, async_op: bool = False) -> None:
                n, rank = input_tensor.numel(), dist.get_rank(group)
                buf = comms._view(output_tensor.numel(), output_tensor.dtype)
                buf.zero_()
                buf[rank * n:(rank + 1) * n].copy_(input_tensor)
                dist.all_reduce(buf, group=group)
                output_tensor.copy_(buf)

        return Staged()

    def reduce_scatter(self) -> Any:
        import torch.distributed as dist
        from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

        comms = self

        class Staged(ReduceScatter):
            def allocate(self, size: Any, *, dtype: Any, device: Any) -> Any:
                import torch

                return torch.empty(*size, dtype=dtype, device=device)

            def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, op: Any,
                         async_op: bool = False) -> None:  # fmt: skip
                m, rank = output_tensor.numel(), dist.get_rank(group)
                buf = comms._view(input_tensor.numel(), input_tensor.dtype)
                buf.copy_(input_tensor)
                dist.all_reduce(buf, group=group)
                if op == dist.ReduceOp.AVG:
                    buf.div_(dist.get_world_size(group))
                output_tensor.copy_(buf[rank * m:(rank + 1) * m])

        return Staged()


def _ddp_rank(rank: int, case: Case, port: int, out_dir: str, parent: int) -> None:
    """One gloo rank of a DDP case: its measurement to ``out_dir/rank<rank>.json``. It ends with
    process ``parent`` (:func:`trainsim.lifetime.exit_with_parent`: a suite killed outright left
    both ranks training and their folder behind), and keeps the profiler's start/stop notices
    off the terminal it shares with the suite."""
    import os

    from trainsim.capture.distributed import _quiet_profiler_logs
    from trainsim.lifetime import exit_with_parent

    exit_with_parent(parent, Path(out_dir))
    tempfile.tempdir = out_dir  # the profiler's trace too: a rank stopped or orphaned leaves nothing elsewhere
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HF_HUB_OFFLINE="1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=case.world)
    try:
        with _quiet_profiler_logs():
            if case.zero >= 2:
                _StagedComms.setup(case, case.world)  # before the profiler: no part of the measurement
            m = measure_lifetime_peak(_build(case, ddp=True), case.accumulation, main_thread=case.zero >= 2)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    out = Path(out_dir) / f"rank{rank}.json"
    out.with_suffix(".tmp").write_text(json.dumps(m), encoding="utf-8")
    os.replace(out.with_suffix(".tmp"), out)


def measure_ddp_case(case: Case, timeout_s: float = 600.0) -> dict[str, Any]:
    """A DDP case's rank-0 measurement, its ``world`` ranks started as processes here. The ranks
    ignore Ctrl-C (it reaches the whole process group: each printed the start of a traceback
    under the suite's interrupt line); the suite answers it, stopping them."""
    import os

    import torch.multiprocessing as mp

    from trainsim.capture.distributed import free_port, stop_processes
    from trainsim.lifetime import main_module_hidden

    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="trainsim-memory-") as td:
        port = free_port()
        procs = [ctx.Process(target=_ddp_rank, args=(r, case, port, td, os.getpid())) for r in range(case.world)]
        try:
            with main_module_hidden(), _started_deaf_to_ctrl_c():
                for p in procs:
                    p.start()
            for p in procs:
                p.join(timeout_s)
        finally:
            stop_processes(procs)
        bad = [r for r, p in enumerate(procs) if p.exitcode != 0]
        if bad:
            raise ConfigError(f"memory suite: {case.name}: DDP rank {bad[0]} failed (exit code {procs[bad[0]].exitcode})")
        results = [json.loads((Path(td) / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(case.world)]
    result: dict[str, Any] = results[0]
    result["ranks_bytes"] = [r["persistent_bytes"] + r["transient_bytes"] for r in results]
    return result


@contextmanager
def _started_deaf_to_ctrl_c() -> Iterator[None]:
    """For the block (main thread): SIGINT ignored, which the processes it spawns inherit through
    exec; a Ctrl-C meanwhile is held (:func:`trainsim.lifetime.sigint_held`) and reaches this
    process's own handler after it."""
    import signal
    import threading

    from trainsim.lifetime import sigint_held

    if threading.current_thread() is not threading.main_thread():
        yield  # signal dispositions are the main thread's to change
        return
    with sigint_held():
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, old if old is not None else signal.SIG_DFL)


def predict_case(case: Case, config_path: Path, *, at_peak: bool = True) -> Any:
    """trainsim's memory for ``case`` (the stage's MemoryBreakdown, one GPU, no CUDA context;
    ``at_peak=False``: every term at once, the baseline)."""
    from trainsim.builders.memory import NCCL_COMM_BYTES, memory_per_gpu
    from trainsim.builders.models import read_hf_config
    from trainsim.builders.plan import Plan

    spec = read_hf_config(config_path)
    sh = case.shape
    plan = Plan(tp=1, pp=1, dp=case.world, zero=case.zero, micro_batch=sh.batch, global_batch=sh.batch * case.accumulation * case.world,
                seq_len=sh.seq, dtype="bf16" if case.dtype == "bf16" else "fp32", impl="hf", recompute="full" if case.checkpointing else "none",
                optimizer="adam" if case.optimizer == "adam" else "sgd")  # fmt: skip
    m = memory_per_gpu(spec, plan, overhead_bytes=0, at_peak=at_peak)[0]
    # NCCL's per-communicator device buffers have no gloo counterpart, as the CUDA context has none
    return replace(m, buffers_bytes=m.buffers_bytes - (NCCL_COMM_BYTES if case.world > 1 else 0.0))


def run_case(case: Case) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from trainsim.capture.distributed import _quiet_profiler_logs

    cfg = _config(case.family, case.shape)
    with tempfile.TemporaryDirectory() as td:
        cfg.save_pretrained(td)
        pred = predict_case(case, Path(td) / "config.json")
        every = predict_case(case, Path(td) / "config.json", at_peak=False)
    runs: list[float] = []
    if case.world > 1:
        # two launches, the lower taken: on a loaded machine some launches kept the bucket set
        # DDP allocates at construction alive beside the one its second step rebuilds (4 of 13
        # under load, 0 of 13 otherwise), through the measured step; both are reported
        launches = [measure_ddp_case(case) for _ in range(2)]
        runs = [(r["persistent_bytes"] + r["transient_bytes"]) / MiB for r in launches]
        m = min(launches, key=lambda r: r["persistent_bytes"] + r["transient_bytes"])
    else:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg)
        if case.dtype == "bf16":
            model = model.to(torch.bfloat16)
        model.train()
        if case.checkpointing:
            _checkpoint(model)
        params = list(model.parameters())
        opt = (torch.optim.AdamW(params, lr=1e-4, foreach=True) if case.optimizer == "adam"
               else torch.optim.SGD(params, lr=1e-3, foreach=True))  # fmt: skip
        batch = torch.randint(0, case.shape.vocab, (case.shape.batch, case.shape.seq))
        with _quiet_profiler_logs():  # the profiler's start/stop notices: 2 lines a case on the terminal
            m = measure_step_peak(model, batch, opt, case.accumulation)
    measured = m["persistent_bytes"] + m["transient_bytes"]
    err = 100.0 * (pred.total_bytes - measured) / measured
    return {
        "case": case.name, "family": case.family, "shape": case.shape.label, "optimizer": case.optimizer,
        "recompute": "full" if case.checkpointing else "none", "dtype": case.dtype, "measured_mib": measured / MiB,
        "predicted_mib": pred.total_bytes / MiB, "err_pct": err, "phase": pred.phase, "peak_at": m["peak_at"],
        "accumulation": case.accumulation, "world": case.world, "measured_runs_mib": runs,
        "measured_persistent_mib": m["persistent_bytes"] / MiB,
        "measured_transient_mib": m["transient_bytes"] / MiB,
        **({"measured_ranks_mib": [b / MiB for b in m["ranks_bytes"]]} if "ranks_bytes" in m else {}),
        "every_term_mib": every.total_bytes / MiB,
        "every_term_err_pct": 100.0 * (every.total_bytes - measured) / measured,
        "predicted": {k: v / MiB if isinstance(v, float) else v for k, v in pred.to_dict().items()},
    }  # fmt: skip


def run_memory_suite(data_dir: Path, *, limit: int | None = None) -> dict[str, Any]:
    """Every case of :data:`CASES` (``limit``: the first N), measured and predicted here."""
    del data_dir  # measures on this host
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    transformers.logging.set_verbosity_error()
    cases = [run_case(c) for c in CASES[:limit]]
    by_phase: dict[str, list[float]] = {}
    for c in cases:
        by_phase.setdefault(c["phase"], []).append(c["err_pct"])
    summary = {**error_summary(c["err_pct"] for c in cases),
               "mean_signed_err_pct": sum(c["err_pct"] for c in cases) / len(cases) if cases else math.nan,
               "by_predicted_phase": {p: error_summary(v) for p, v in sorted(by_phase.items())},
               # the baseline: every term alive at once (the fused stacks' figure, impl hf's before)
               "every_term": error_summary(c["every_term_err_pct"] for c in cases)}  # fmt: skip
    import torch

    return {"suite": "memory", "cases": cases, "summary": summary,
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
            "what": "peak bytes of eager fp32 training steps (SDPA, no dropout) measured on this CPU with "
                    "torch.profiler's allocation events, against trainsim's impl-hf memory without the CUDA context"}  # fmt: skip
