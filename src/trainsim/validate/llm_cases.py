"""End-to-end LLM training cases: measured iteration times with the model and plan that ran.

Three files under ``shared/data/ground_truth`` (``shared/data/README.md``), each row one
:class:`LLMCase`:

``vtrain-multi``  ``vtrain_megatron_a100_multi_node.csv`` (109 rows, 64–512 GPUs)
``vtrain-single`` ``vtrain_megatron_a100_single_node.csv`` (1,440 rows, 2–8 GPUs)
    Megatron-DeepSpeed GPT on vTrain's A100 cluster (catalog system ``vtrain-a100``). The files
    give the parallel layout, batches and shape; the rest is what vTrain's validation configs
    state (VIA-Research/vTrain ``config/validation/*``: fp16, ``use_checkpoint: true``, i.e.
    Megatron's full per-layer activation recompute, ``pipeline_scheduling: "1f1b"``) plus
    Megatron GPT defaults: vocabulary 50257 (padded by the builder), learned positions, GeLU,
    LayerNorm, biases, input/output embeddings tied, fused scale-mask-softmax (no
    FlashAttention), no ZeRO. Micro-batches are the row's even when pp = 1: vTrain's *simulator*
    then resets micro = global / dp, but the measured runs differ by micro-batch at pp = 1
    (rows 1–3 of the multi-node file), so the measurement used the row's value.
``seed001``       ``seed001_llm_perlmutter_vista.csv`` (paper 001, Tables IV/VIII/IX)
    GPT-NeoX runs on Perlmutter and Vista. The measured value is ``min_iteration_s``, the
    target paper 001 predicts; its published error per row is kept in
    ``reference["paper001_error_pct"]``.

One more set ships inside the package instead (:data:`SHIPPED_TAGS`):

``h100-gpt2``     the GPT-2 captures of ``validate gpu-e2e`` (``validate/data/gpu_e2e_h100.tar.xz``):
    a 2-layer, 128-wide HuggingFace ``GPT2LMHeadModel`` (vocabulary 1,000, sequence 64; the
    ``gpt2`` capture example) trained in fp32 with SGD on one H100 at batch 512, 1,024 and 2,048,
    two captures each; the measured value is the capture's median profiled step. Plan: one GPU,
    no recompute, SDPA attention (``flash``), HuggingFace's dropout 0.1 on the residual stream
    (``hidden_dropout``; attention dropout runs inside the SDPA kernel), eager HF modules
    (``impl="hf"``, :mod:`trainsim.builders.eager`; before 2026-11-26 the fused operators). Since 2026-11-26 the plan's
    optimizer is SGD (``optimizer="sgd"``), as the capture's. Not modelled: the loss's shifted-logits copy.
``h100-llama``    the ``llama`` capture example on one H100 (``validate/data/h100_llama_steps.json``):
    a 2-layer ``LlamaForCausalLM`` at LLaMA-3 8B's widths (hidden 4,096, GQA 32/8 heads, SwiGLU
    14,336, vocabulary 32,000, untied), sequence 2,048, bf16, eager PyTorch with SDPA, at
    micro-batch 1, 2, 4, 8 and 16, two captures each (two H100 machines); the measured value is
    the capture's median profiled step. Plan: one GPU, no recompute, ``flash`` attention, no
    dropout, eager HF modules (``impl="hf"``), SGD (``optimizer="sgd"``, as the capture's, since 2026-11-26).
``h100-llama13``, ``h100-llama70``  the same on two held-out shapes, measured with predictions
    registered before (``h100_llama13_steps.json``: LLaMA-2 13B's widths, no GQA, sequence 4,096,
    micro-batch 1, 2, 4, two captures each; ``h100_llama70_steps.json``: LLaMA-3 70B's widths,
    vocabulary 128,256, sequence 2,048, micro-batch 1, 2, 4, one capture each). Each file names
    its model (``config``) and ``seq_len``.

Ids are ``"<tag>:<row>"`` with ``row`` the 1-based data row (line ``row + 1`` of the file).
Every problem in a file is a one-line :class:`~trainsim.errors.TraceFormatError` naming the
file, the row (and line) and the column.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import get_args

from trainsim.builders.eager import HF_EXPERTS
from trainsim.builders.plan import (
    ATTENTION,
    CP_COMMS,
    DTYPES,
    IMPLS,
    OPTIMIZERS,
    PARTITIONS,
    RECOMPUTE,
    SCHEDULES,
    Attention,
    Plan,
    Recompute,
)
from trainsim.builders.spec import Activation, ModelSpec, Norm
from trainsim.errors import ConfigError, TraceFormatError
from trainsim.hardware import get_system

__all__ = [
    "FILES",
    "SHIPPED_TAGS",
    "LLMCase",
    "ground_truth_files",
    "read_cases",
    "read_runs",
    "read_seed001",
    "read_vtrain",
]

VTRAIN_VOCAB = 50257  # vTrain's vTrainConfig default (GPT-2 BPE); Megatron pads it per tp

# tag -> file name under shared/data/ground_truth
FILES: dict[str, str] = {
    "vtrain-multi": "vtrain_megatron_a100_multi_node.csv",
    "vtrain-single": "vtrain_megatron_a100_single_node.csv",
    "seed001": "seed001_llm_perlmutter_vista.csv",
}

# Paper 001's runs are GPT-NeoX (DeepSpeed) jobs. Recompute: full, one layer per checkpoint.
# Sources: EleutherAI/gpt-neox configs/20B.yml (the GPT-20B of Table IV: "checkpoint-activations":
# true, "checkpoint-num-layers": 1, "partition-activations": false, ZeRO stage 1, reduce bucket
# 1.26e9), and paper 001's own estimator (DebarghaG/estimate-train-time,
# estimator/mml_3d_prediction.py: ``encoder_bwd += encoder_fwd``, one extra forward per layer in
# every backward, with comm_bucket 1260000000 as in that config). The paper text does not name
# the recompute setting; the LLaMA-13B/Llemma-7B rows are assumed to use the same GPT-NeoX setting.
SEED001_RECOMPUTE: Recompute = "full"

SEED001_SYSTEMS: dict[str, str] = {"perlmutter": "perlmutter", "vista": "vista"}

_TRUE = frozenset({"true", "1", "yes", "y", "t"})
_FALSE = frozenset({"false", "0", "no", "n", "f"})


@dataclass(frozen=True, slots=True)
class LLMCase:
    """One measured training iteration: what ran, where, and how long it took."""

    id: str  # "<file tag>:<1-based data row>", e.g. "vtrain-multi:17"
    source: str  # the file it was read from
    row: int  # 1-based data row (line row + 1)
    model: ModelSpec
    plan: Plan
    system: str  # hardware catalog system name
    measured_s: float  # measured iteration time, seconds
    reference: dict[str, float] = field(default_factory=dict, hash=False)  # published errors


# --- parsing helpers ---------------------------------------------------------------------------


class _Row:
    """One CSV data row with typed, error-naming accessors."""

    __slots__ = ("index", "line", "path", "values")

    def __init__(self, path: Path, index: int, line: int, values: dict[str, str]) -> None:
        self.path, self.index, self.line, self.values = path, index, line, values

    def fail(self, problem: str, column: str | None = None) -> TraceFormatError:
        where = f"row {self.index} (line {self.line})"
        if column is not None:
            where += f", column {column!r}"
        return TraceFormatError(self.path, f"{where}: {problem}")

    def text(self, column: str) -> str:
        v = self.values[column].strip()
        if not v:
            raise self.fail("empty value", column)
        return v

    def integer(self, column: str, *, minimum: int = 1) -> int:
        v = self.text(column)
        try:
            f = float(v)
        except ValueError:
            raise self.fail(f"{v!r} is not a number", column) from None
        if not f.is_integer():
            raise self.fail(f"{v!r} is not an integer", column)
        if f < minimum:
            raise self.fail(f"{v!r} is below {minimum}", column)
        return int(f)

    def number(self, column: str, *, positive: bool = True) -> float:
        v = self.text(column)
        try:
            f = float(v)
        except ValueError:
            raise self.fail(f"{v!r} is not a number", column) from None
        if not math.isfinite(f) or (positive and f <= 0):
            raise self.fail(
                f"{v!r} is not a {'positive ' if positive else ''}finite number", column
            )
        return f

    def boolean(self, column: str) -> bool:
        v = self.text(column).lower()
        if v in _TRUE:
            return True
        if v in _FALSE:
            return False
        raise self.fail(f"{v!r} is not a boolean (true/false)", column)

    def choice(self, column: str, allowed: Iterable[str]) -> str:
        v = self.text(column).lower()
        options = tuple(allowed)
        if v not in options:
            raise self.fail(f"{v!r} is not one of {', '.join(options)}", column)
        return v


def _rows(path: Path, required: Iterable[str]) -> Iterator[_Row]:
    """Data rows of a CSV (BOM, blank lines and padded headers tolerated), required columns checked."""
    if not path.is_file():
        raise TraceFormatError(path, "no such file")
    try:
        fh = path.open(encoding="utf-8-sig", newline="")
    except OSError as e:
        raise TraceFormatError(path, f"cannot open ({e.strerror})") from None
    with fh:
        reader = csv.reader(fh)
        try:
            header = next(reader, None)
        except (csv.Error, UnicodeDecodeError) as e:
            raise TraceFormatError(path, f"line 1: not a CSV header ({e})") from None
        if header is None:
            raise TraceFormatError(path, "empty file (no header)")
        names = [h.replace("\ufeff", "").strip().lower() for h in header]
        missing = [c for c in required if c not in names]
        if missing:
            raise TraceFormatError(
                path, f"line 1: missing column{'s' if len(missing) > 1 else ''} "
                + ", ".join(repr(m) for m in missing)
            )  # fmt: skip
        dupes = sorted({n for n in names if n and names.count(n) > 1})
        if dupes:
            raise TraceFormatError(path, f"line 1: duplicate column {dupes[0]!r}")
        index = 0
        while True:
            try:
                fields = next(reader)
            except StopIteration:
                break
            except (csv.Error, UnicodeDecodeError) as e:
                raise TraceFormatError(path, f"line {reader.line_num}: not CSV ({e})") from None
            if not any(f.strip() for f in fields):
                continue
            index += 1
            if len(fields) != len(names):
                raise TraceFormatError(
                    path,
                    f"row {index} (line {reader.line_num}): {len(fields)} fields, header has {len(names)}",
                )
            yield _Row(path, index, reader.line_num, dict(zip(names, fields, strict=True)))
        if index == 0:
            raise TraceFormatError(path, "no data rows")


def _check_layout(r: _Row, *, gpus_col: str, gpus: int, tp: int, pp: int, dp: int) -> None:
    if gpus != tp * pp * dp:
        raise r.fail(f"{gpus} GPUs is not tp×pp×dp = {tp}×{pp}×{dp} = {tp * pp * dp}", gpus_col)


def _check_batch(r: _Row, *, column: str, global_batch: int, micro: int, dp: int) -> None:
    if global_batch % (micro * dp):
        raise r.fail(
            f"global batch {global_batch} is not a multiple of micro batch × dp = {micro}×{dp}",
            column,
        )


def _validated(r: _Row, model: ModelSpec, plan: Plan, gpus: int) -> None:
    try:
        plan.validate(model, gpus=gpus)
    except ConfigError as e:
        raise r.fail(str(e)) from None


def _make_model(r: _Row, **kw: object) -> ModelSpec:
    try:
        return ModelSpec(**kw)  # type: ignore[arg-type]
    except ConfigError as e:
        raise r.fail(str(e)) from None


# --- vTrain ------------------------------------------------------------------------------------

_V_GPUS = "# gpus"
_V_GB = "global batch"
_V_MB = "micro batch"
_V_HIDDEN = "hidden size"
_V_HEADS = "attention heads"
_V_LAYERS = "# layers"
_V_SEQ = "sequence length"
_V_TP = "tensor parallelism"
_V_DP = "data parallelism"
_V_PP = "pipeline parallelism"
_V_TIME = "iteration time (ms)"
_VTRAIN_COLUMNS = (_V_GPUS, _V_GB, _V_MB, _V_HIDDEN, _V_HEADS, _V_LAYERS, _V_SEQ,
                   _V_TP, _V_DP, _V_PP, _V_TIME)  # fmt: skip


# vTrain's files do not state dropout; Megatron-DeepSpeed's default (--attention-dropout 0.1,
# megatron/arguments.py) is assumed. GPT-NeoX's 20B config sets attention-dropout 0 (seed001).
VTRAIN_ATTENTION_DROPOUT = 0.1


def read_vtrain(
    path: Path | str, *, system: str = "vtrain-a100", tag: str | None = None
) -> list[LLMCase]:
    """vTrain's measured Megatron-DeepSpeed GPT iterations (single- or multi-node file).

    ``tag`` prefixes the case ids; by default it is taken from the file name (``vtrain-multi``,
    ``vtrain-single``) or is the file's stem. The optional ``parameters (billion)`` column of the
    multi-node file is not used.
    """
    path = Path(path)
    tag = tag or _tag_of(path)
    sys_name = get_system(system).name
    out: list[LLMCase] = []
    for r in _rows(path, _VTRAIN_COLUMNS):
        tp, pp, dp = r.integer(_V_TP), r.integer(_V_PP), r.integer(_V_DP)
        gpus, micro, gb = r.integer(_V_GPUS), r.integer(_V_MB), r.integer(_V_GB)
        hidden, layers, heads, seq = (
            r.integer(_V_HIDDEN),
            r.integer(_V_LAYERS),
            r.integer(_V_HEADS),
            r.integer(_V_SEQ),
        )
        measured = r.number(_V_TIME) * 1e-3
        _check_layout(r, gpus_col=_V_GPUS, gpus=gpus, tp=tp, pp=pp, dp=dp)
        _check_batch(r, column=_V_GB, global_batch=gb, micro=micro, dp=dp)
        model = _make_model(
            r, name=f"gpt-{hidden}h-{layers}l", hidden=hidden, layers=layers, heads=heads,
            vocab=VTRAIN_VOCAB, seq_len=seq, activation="gelu", norm="layernorm",
            position="learned", bias=True, tied_embeddings=True, source=str(path),
        )  # fmt: skip
        plan = Plan(
            tp=tp, pp=pp, dp=dp, micro_batch=micro, global_batch=gb, recompute="full",
            dtype="fp16", attention="fused", schedule="1f1b", zero=0,
            attention_dropout=VTRAIN_ATTENTION_DROPOUT,
        )  # fmt: skip
        _validated(r, model, plan, gpus)
        out.append(
            LLMCase(f"{tag}:{r.index}", str(path), r.index, model, plan, sys_name, measured, {})
        )
    return out


# --- paper 001 ---------------------------------------------------------------------------------

_SEED001_COLUMNS = (
    "model", "hidden", "seq_len", "heads", "layers", "vocab_unpadded", "pp", "tp", "dp",
    "num_gpus", "micro_batch", "grad_accum_steps", "global_batch", "fused_softmax",
    "flash_attention", "norm", "activation", "zero_stage", "precision", "cluster",
    "gpus_per_node", "min_iteration_s",
)  # fmt: skip
_SEED001_ERROR = "paper_predicted_error_pct"


# 001 Table IV: "Encoder_fwd Syncs" is 1 for GPT-20B (GPT-NeoX-20B's parallel residual,
# ``gpt_j_residual: true`` in gpt-neox configs/20B.yml) and 2 for LLaMA-13B and Llemma-7B.
SEED001_PARALLEL_RESIDUAL = frozenset({"GPT-20B"})


def read_seed001(path: Path | str, *, tag: str = "seed001") -> list[LLMCase]:
    """Paper 001's measured GPT-NeoX iterations on Perlmutter and Vista (``min_iteration_s``).

    Models are GPT-NeoX style (rotary positions, untied embeddings, biases, MHA) with the row's
    norm, activation and unpadded vocabulary; recompute is ``full`` (:data:`SEED001_RECOMPUTE`).
    """
    path = Path(path)
    out: list[LLMCase] = []
    for r in _rows(path, _SEED001_COLUMNS):
        tp, pp, dp = r.integer("tp"), r.integer("pp"), r.integer("dp")
        gpus, micro, accum, gb = (r.integer("num_gpus"), r.integer("micro_batch"),
                                  r.integer("grad_accum_steps"), r.integer("global_batch"))  # fmt: skip
        _check_layout(r, gpus_col="num_gpus", gpus=gpus, tp=tp, pp=pp, dp=dp)
        _check_batch(r, column="global_batch", global_batch=gb, micro=micro, dp=dp)
        if gb != micro * dp * accum:
            raise r.fail(
                f"global batch {gb} is not micro batch × dp × grad accum = {micro}×{dp}×{accum}",
                "global_batch",
            )
        flash, fused = r.boolean("flash_attention"), r.boolean("fused_softmax")
        attention: Attention = "flash" if flash else "fused" if fused else "unfused"
        cluster = r.choice("cluster", SEED001_SYSTEMS)
        system = get_system(SEED001_SYSTEMS[cluster])
        per_node = r.integer("gpus_per_node")
        if per_node != system.gpus_per_node:
            raise r.fail(
                f"{per_node} GPUs per node, but catalog system {system.name} has {system.gpus_per_node}",
                "gpus_per_node",
            )
        model = _make_model(
            r, name=r.text("model"), hidden=r.integer("hidden"), layers=r.integer("layers"),
            heads=r.integer("heads"), vocab=r.integer("vocab_unpadded"), seq_len=r.integer("seq_len"),
            activation=r.choice("activation", get_args(Activation)),
            norm=r.choice("norm", get_args(Norm)), position="rotary", bias=True,
            tied_embeddings=False, parallel_residual=r.text("model") in SEED001_PARALLEL_RESIDUAL,
            source=str(path),
        )  # fmt: skip
        plan = Plan(
            tp=tp, pp=pp, dp=dp, micro_batch=micro, global_batch=gb,
            recompute=SEED001_RECOMPUTE, dtype=r.text("precision").lower(), attention=attention,
            schedule="1f1b", zero=r.integer("zero_stage", minimum=0),
            # GPT-NeoX's pipeline partition, as 001 §III-D Eq. 3–5 states it for these runs
            partition="001",
            impl="neox",  # GPT-NeoX's own (unfused) RMSNorm, the operator 001 measured
        )  # fmt: skip
        _validated(r, model, plan, gpus)
        reference: dict[str, float] = {}
        if _SEED001_ERROR in r.values and r.values[_SEED001_ERROR].strip():
            reference["paper001_error_pct"] = r.number(_SEED001_ERROR, positive=False)
        out.append(LLMCase(f"{tag}:{r.index}", str(path), r.index, model, plan, system.name,
                           r.number("min_iteration_s"), reference))  # fmt: skip
    return out


# --- the set -----------------------------------------------------------------------------------

_READERS: dict[str, Callable[[Path], list[LLMCase]]] = {
    "vtrain-multi": lambda p: read_vtrain(p, tag="vtrain-multi"),
    "vtrain-single": lambda p: read_vtrain(p, tag="vtrain-single"),
    "seed001": read_seed001,
}


# --- shipped H100 captures ----------------------------------------------------------------------

# trainsim.capture.examples.gpt2's model (tests/test_llm_cases.py checks it against the example)
H100_GPT2_CONFIG: dict[str, object] = {
    "model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 1000,
    "n_positions": 128, "activation_function": "gelu_new", "tie_word_embeddings": True,
}  # fmt: skip
H100_GPT2_SEQ = 64
H100_GPT2_DROPOUT = 0.1  # GPT2Config's resid_pdrop and embd_pdrop defaults


def read_h100_gpt2(tag: str = "h100-gpt2") -> list[LLMCase]:
    """The shipped single-H100 GPT-2 captures as cases (see the module docstring)."""
    import json

    from trainsim.builders.models import hf_config_from_dict
    from trainsim.validate.gpu_e2e_suite import _unpack_shipped, default_cache_dir, discover

    root = _unpack_shipped(default_cache_dir())
    model = hf_config_from_dict(dict(H100_GPT2_CONFIG), root / "gpt2-2l-128h")
    out: list[LLMCase] = []
    for (name, batch), folders in sorted(discover(root).items()):
        if name != "gpt2":
            continue
        for k, folder in enumerate(folders):
            man = folder / "capture.json"
            doc = json.loads(man.read_text(encoding="utf-8"))
            measured = doc.get("measured_step_s")
            if not isinstance(measured, int | float) or measured <= 0:
                raise ConfigError(f"{man}: field 'measured_step_s' must be a positive number, got {measured!r}")
            plan = Plan(micro_batch=batch, global_batch=batch, seq_len=H100_GPT2_SEQ, dtype="fp32",
                        attention="flash", hidden_dropout=H100_GPT2_DROPOUT, impl="hf", optimizer="sgd")  # fmt: skip
            plan.validate(model, gpus=1)
            out.append(LLMCase(f"{tag}:b{batch}-r{k}", str(man), k + 1, model, plan, "dgx-h100",
                               float(measured), {}))  # fmt: skip
    return out


# trainsim.capture.examples.llama's CUDA model (tests/test_bench_costs.py checks it against the example)
H100_LLAMA_CONFIG: dict[str, object] = {
    "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
    "intermediate_size": 14336, "num_hidden_layers": 2, "vocab_size": 32000, "max_position_embeddings": 2048,
    "tie_word_embeddings": False, "hidden_act": "silu",
}  # fmt: skip
H100_LLAMA_SEQ = 2048
H100_LLAMA_FILE = "h100_llama_steps.json"


def read_h100_llama(tag: str = "h100-llama", path: Path | None = None) -> list[LLMCase]:
    """The shipped single-H100 LLaMA captures as cases (see the module docstring)."""
    import json

    from trainsim.builders.models import hf_config_from_dict

    path = path or Path(__file__).parent / "data" / H100_LLAMA_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        caps = doc["captures"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path}: expected a JSON object with a list 'captures' ({e})") from None
    if not isinstance(caps, list) or not all(isinstance(c, dict) for c in caps):
        raise ConfigError(f"{path}: field 'captures' must be a list of objects")
    # a file may name its own model ('config', an HF config.json's fields) and 'seq_len'
    fields, seq = doc.get("config", H100_LLAMA_CONFIG), doc.get("seq_len", H100_LLAMA_SEQ)
    if not isinstance(fields, dict) or not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise ConfigError(f"{path}: field 'config' must be an object and 'seq_len' a positive integer, "
                          f"got {type(fields).__name__} and {seq!r}")  # fmt: skip
    model = hf_config_from_dict(dict(fields), path.parent / f"llama-{tag}")  # a name, never read
    out: list[LLMCase] = []
    for k, c in enumerate(caps, 1):
        batch, measured = c.get("batch_size"), c.get("measured_step_s")
        if (not isinstance(batch, int) or isinstance(batch, bool) or batch < 1
                or not isinstance(measured, int | float) or measured <= 0):  # fmt: skip
            raise ConfigError(f"{path}: captures[{k - 1}] needs a positive integer 'batch_size' and a positive "
                              f"'measured_step_s', got {batch!r} and {measured!r}")  # fmt: skip
        plan = Plan(micro_batch=batch, global_batch=batch, seq_len=seq, dtype="bf16", attention="flash",
                    impl="hf", optimizer="sgd")  # fmt: skip
        plan.validate(model, gpus=1)
        out.append(LLMCase(f"{tag}:{c.get('name', k)}", str(path), k, model, plan, "dgx-h100", float(measured), {}))
    return out


SHIPPED_TAGS: dict[str, Callable[[], list[LLMCase]]] = {
    "h100-gpt2": read_h100_gpt2, "h100-llama": read_h100_llama,
    **{f"h100-{m}": partial(read_h100_llama, f"h100-{m}", Path(__file__).parent / "data" / f"h100_{m}_steps.json")
       for m in ("llama13", "llama70")},
}  # fmt: skip


# --- a user's own measured runs -------------------------------------------------------------

# Plan fields a runs CSV may set, by how a cell is read (a test checks that this covers Plan)
RUN_INT_FIELDS: dict[str, int] = {  # field -> least value
    "tp": 1, "pp": 1, "dp": 1, "cp": 1, "ep": 1, "zero": 0, "micro_batch": 1, "global_batch": 1, "seq_len": 1,
    "vpp": 1, "first_stage_layers": 0, "last_stage_layers": 0,
}  # fmt: skip
RUN_BOOL_FIELDS = ("sp", "dist_optimizer", "wgrad_fusion", "overlap_grad_reduce", "overlap_param_gather", "contention",
                   "moe_grouped_gemm")
RUN_FLOAT_FIELDS = ("attention_dropout", "hidden_dropout", "moe_imbalance")
RUN_CHOICE_FIELDS: dict[str, tuple[str, ...]] = {
    "schedule": SCHEDULES, "recompute": RECOMPUTE, "dtype": DTYPES, "attention": ATTENTION, "impl": IMPLS,
    "partition": PARTITIONS, "optimizer": OPTIMIZERS, "cp_comm": CP_COMMS, "hf_experts": HF_EXPERTS,
}  # fmt: skip
RUN_COLUMNS = ("id", "model", "system", "gpus", "iteration_ms", "iteration_s")


def read_runs(path: Path | str, *, tag: str | None = None) -> list[LLMCase]:
    """Measured iterations of one's own, one per CSV row (docs/llm.md, *Your own measurements*).

    Columns: ``model`` (a catalog name, or a config.json / YAML path), ``system`` (a catalog name
    or YAML path; a relative path in the CSV's folder first, then the working directory), the measured time as ``iteration_ms`` or
    ``iteration_s``, and optionally ``id`` (a label for the row), ``gpus`` and any field of
    :class:`~trainsim.builders.plan.Plan` by its name (``tp``, ``pp``, ``dp``, ``micro_batch``,
    ``global_batch``, ``recompute``, ``zero``, ``dtype``, ``attention``, ...). An empty cell, or a
    column left out, is ``trainsim predict``'s default; ``dp`` defaults to ``gpus / (tp×cp×pp)``.
    Another column is an error (a misspelt field would be ignored otherwise)."""
    from trainsim.builders.models import get_model

    path = Path(path)
    tag = tag or path.stem
    fields = {*RUN_INT_FIELDS, *RUN_BOOL_FIELDS, *RUN_FLOAT_FIELDS, *RUN_CHOICE_FIELDS}
    models: dict[str, ModelSpec] = {}
    systems: set[str] = set()  # checked once each
    out: list[LLMCase] = []
    seen: dict[str, int] = {}

    def ref(r: _Row, column: str) -> str:
        """A catalog name as given; a path (one with a separator or suffix) from the CSV's folder."""
        v = r.text(column)
        p = Path(v).expanduser()
        if not p.is_absolute() and (path.parent / p).exists():
            return str(path.parent / p)
        return v

    for r in _rows(path, ("model", "system")):
        if r.index == 1:
            unknown = [c for c in r.values if c and c not in fields and c not in RUN_COLUMNS]
            if unknown:
                raise TraceFormatError(path, f"line 1: unknown column {unknown[0]!r}: expected model, system, "
                                             "iteration_ms or iteration_s, and optionally id, gpus or plan fields "
                                             f"({', '.join(sorted(fields))})")  # fmt: skip
            times = [c for c in ("iteration_ms", "iteration_s") if c in r.values]
            if len(times) != 1:
                raise TraceFormatError(path, "line 1: give the measured time as one column, iteration_ms or "
                                             f"iteration_s (found {', '.join(times) or 'neither'})")  # fmt: skip
        given = {c: v for c, v in r.values.items() if v.strip()}
        measured = r.number("iteration_ms") * 1e-3 if "iteration_ms" in r.values else r.number("iteration_s")
        kw: dict[str, object] = {}
        for c in given:
            if c in RUN_INT_FIELDS:
                kw[c] = r.integer(c, minimum=RUN_INT_FIELDS[c])
            elif c in RUN_BOOL_FIELDS:
                kw[c] = r.boolean(c)
            elif c in RUN_FLOAT_FIELDS:
                kw[c] = r.number(c, positive=False)
            elif c in RUN_CHOICE_FIELDS:
                kw[c] = r.choice(c, RUN_CHOICE_FIELDS[c])
        gpus = r.integer("gpus") if "gpus" in given else None
        if "dp" not in kw:
            base = int(kw.get("tp", 1)) * int(kw.get("cp", 1)) * int(kw.get("pp", 1))  # type: ignore[call-overload]
            if gpus is not None and gpus % base:
                raise r.fail(f"{gpus} GPUs is not a multiple of tp×cp×pp = {base}", "gpus")
            kw["dp"] = gpus // base if gpus is not None else 1
        try:
            name = ref(r, "model")
            if name not in models:
                models[name] = get_model(name)
            sys_ref = ref(r, "system")
            if sys_ref not in systems:
                get_system(sys_ref)  # a one-line error here, naming the row
                systems.add(sys_ref)
        except (ConfigError, TraceFormatError) as e:
            raise r.fail(str(e)) from None
        plan = Plan(**kw)  # type: ignore[arg-type]
        _validated(r, models[name], plan, gpus if gpus is not None else plan.gpus)
        label = r.text("id") if "id" in given else str(r.index)
        if label in seen:
            raise r.fail(f"id {label!r} is row {seen[label]}'s too", "id")
        seen[label] = r.index
        out.append(LLMCase(f"{tag}:{label}", str(path), r.index, models[name], plan, sys_ref, measured, {}))
    return out


def _tag_of(path: Path) -> str:
    return next((t for t, name in FILES.items() if path.name == name), path.stem)


def _ground_truth_dir(root: Path | str) -> Path:
    root = Path(root)
    if (root / "ground_truth").is_dir():  # shared/data given instead of shared/data/ground_truth
        root = root / "ground_truth"
    if not root.is_dir():
        raise ConfigError(f"ground-truth directory {root} does not exist")
    return root


def ground_truth_files(root: Path | str) -> dict[str, Path]:
    """Tag -> path of the three ground-truth files under ``root`` (``shared/data/ground_truth``,
    or ``shared/data``); ConfigError naming any that is missing."""
    base = _ground_truth_dir(root)
    files = {tag: base / name for tag, name in FILES.items()}
    missing = [p.name for p in files.values() if not p.is_file()]
    if missing:
        raise ConfigError(f"{base}: missing ground-truth file(s) {', '.join(missing)}")
    return files


def parse_tags(files: str | None) -> list[str] | None:
    """``--files``: comma-separated ground-truth tags (empty items skipped); None for all."""
    return [t.strip() for t in files.split(",") if t.strip()] if files else None


def _is_folder(text: str) -> bool:
    try:
        return Path(text).expanduser().is_dir()
    except OSError:
        return False


def read_cases(root: Path | str, tags: Iterable[str] | None = None) -> list[LLMCase]:
    """All cases of the chosen sets (the three files, then the shipped ones, by default), in
    set then row order."""
    known = [*FILES, *SHIPPED_TAGS]
    chosen = known if tags is None else list(dict.fromkeys(tags))
    runs = {t for t in chosen if t not in known and (t.lower().endswith(".csv") or Path(t).expanduser().is_file())}
    unknown = [t for t in chosen if t not in known and t not in runs]
    if not chosen:
        raise ConfigError(f"no ground-truth tag given; known: {', '.join(known)}")
    folders = [t for t in unknown if _is_folder(t)]
    if folders:  # a path, not a misspelt tag: say what it is
        raise ConfigError(f"--files {folders[0]}: is a folder; give a CSV file of measured runs (docs/llm.md)")
    if unknown:
        raise ConfigError(
            f"unknown ground-truth tag(s) {', '.join(unknown)}; known: {', '.join(known)}, or a CSV of your own "
            "measured runs (docs/llm.md)"
        )
    out: list[LLMCase] = []
    named: set[str] = set()
    for tag in chosen:
        if tag in runs:
            own = Path(tag).expanduser()
            name = base_name = own.stem if own.stem not in known else f"runs-{own.stem}"
            k = 1
            while name in named:  # two files of one stem (a/runs.csv, b/runs.csv): runs, runs-2
                k += 1
                name = f"{base_name}-{k}"
            named.add(name)
            out.extend(read_runs(own, tag=name))
            continue
        if tag in SHIPPED_TAGS:
            out.extend(SHIPPED_TAGS[tag]())
            continue
        base = _ground_truth_dir(root)
        p = base / FILES[tag]
        if not p.is_file():
            raise ConfigError(f"{base}: missing ground-truth file {FILES[tag]} ({tag})")
        out.extend(_READERS[tag](p))
    return out
