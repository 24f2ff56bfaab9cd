"""``trainsim predict MODEL``: iteration time, throughput, MFU and memory of an LLM plan."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from trainsim.cli.main import app
from trainsim.cli.output import Format, emit_json, stderr

# what the provenance summary says, in the table (the JSON keeps the bare label)
_PROVENANCE = {
    "calibrated": "calibrated (every operator and collective from measurements)",
    "mixed": "mixed (some operators or collectives spec-based: notes below)",
    "spec-based": "spec-based (no measurements: rooflines, a lower bound on time)",
}


def activations_cell(provenance: str) -> str:
    """The table's short form of ``provenance.activations`` (the JSON keeps the whole string)."""
    if not provenance.startswith("hf-activation-census:"):
        return "Korthikanti et al. 2022's formula (Megatron's fused kernels)"
    _, fam, rest = provenance.split(":", 2)
    stood = f", standing in for {m.group(1)}" if (m := re.search(r"standing in for (\w+)", rest)) else ""
    ckpt = ", checkpointed" if rest.startswith("checkpointed") else ""
    return f"measured census of transformers' modules ({fam}{ckpt}{stood}; CPU)"


def carried(provenance: dict[str, Any]) -> list[str]:
    """How a calibrated prediction's answers were carried past their measurements: beyond the
    measured sizes, to an edited device spec (none: every answer within what was measured)."""
    beyond = any("extrapolated" in k for part in ("kernels", "collectives") for k in provenance.get(part, {}))
    rescaled = any("spec-rescaled" in k for k in provenance.get("kernels", {}))
    return [w for w, c in (("beyond the measured sizes", beyond), ("to an edited device spec", rescaled)) if c]


def _gib(b: float) -> str:
    return f"{b / 2**30:.1f} GiB"


@app.command()
def predict(
    *,
    model: str = typer.Argument(..., metavar="MODEL", help="Catalog model (e.g. llama2-7b, llama3-70b, gpt3-175b, mixtral-8x7b; `trainsim models` lists them), a HuggingFace config.json / folder holding one, or a YAML spec of ModelSpec fields (examples/models/gpt-1.3b.yaml)."),
    system: str = typer.Option("dgx-a100", "--system", help="Catalog system (name or YAML): device, GPUs per node, network tiers."),
    gpus: int | None = typer.Option(None, "--gpus", min=1, help="Total GPUs; checked against tp×cp×dp×pp (dp is derived from it when not given)."),
    tp: int = typer.Option(1, "--tp", min=1, help="Tensor-parallel degree."),
    pp: int = typer.Option(1, "--pp", min=1, help="Pipeline-parallel stages."),
    dp: int | None = typer.Option(None, "--dp", min=1, help="Data-parallel degree (default: gpus / (tp×cp×pp), else 1)."),
    cp: int = typer.Option(1, "--cp", min=1, help="Context-parallel degree (ring attention by default; see --cp-comm-type)."),
    cp_comm_type: str = typer.Option("p2p", "--cp-comm-type", help="With --cp > 1, how the ranks exchange K/V (Megatron-core's --cp-comm-type, TransformerEngine's variants): p2p (the ring, overlapped with the attention blocks), all_gather (also spelt allgather: K/V all-gathered before the attention, exposed) or a2a (DeepSpeed-Ulysses: all-to-alls of Q, K, V and the output, the attention over the whole sequence on heads/(tp×cp) heads, exposed)."),
    ep: int = typer.Option(1, "--ep", min=1, help="Expert-parallel degree (MoE; divides dp)."),
    sp: bool = typer.Option(False, "--sp", help="Megatron sequence parallelism (with tp > 1)."),
    zero: int = typer.Option(0, "--zero", min=0, max=3, help="ZeRO stage 0–3 (3 = FSDP full shard). 1 is DeepSpeed's: gradients all-reduced, then the updated weights all-gathered (Megatron-LM's distributed optimizer: add --dist-optimizer)."),
    dist_optimizer: bool = typer.Option(False, "--dist-optimizer", help="With --zero 1: Megatron-LM's distributed optimizer (--use-distributed-optimizer): gradients reduce-scattered instead of all-reduced, each rank keeping the whole gradient buffer."),
    recompute: str = typer.Option("none", "--recompute", help="Activation recomputation: none, selective, full."),
    micro_batch: int = typer.Option(1, "--micro-batch", min=1, help="Sequences per micro-batch."),
    global_batch: int | None = typer.Option(None, "--global-batch", min=1, help="Sequences per iteration (default: micro-batch × dp)."),
    seq_len: int | None = typer.Option(None, "--seq-len", min=1, help="Sequence length (default: the model's)."),
    schedule: str = typer.Option("1f1b", "--schedule", help="Pipeline schedule: 1f1b, interleaved, gpipe."),
    vpp: int = typer.Option(1, "--vpp", min=1, help="Model chunks per stage (interleaved schedule)."),
    dtype: str = typer.Option("bf16", "--dtype", help="Training precision: bf16, fp16, fp32."),
    attention: str = typer.Option("flash", "--attention", help="Attention kernels: flash, fused (Megatron softmax), unfused."),
    attention_dropout: float = typer.Option(0.0, "--attention-dropout", help="Attention dropout probability (non-flash attention adds a dropout kernel)."),
    hidden_dropout: float = typer.Option(0.0, "--hidden-dropout", help="Dropout probability on the residual stream as separate kernels (HuggingFace models' nn.Dropout with the fused kernels of --impl fused; Megatron fuses it into the residual add: leave 0; --impl hf counts the dropout its census of HF's modules ran instead)."),
    partition: str = typer.Option("even", "--partition", help="Layers per pipeline stage: even (Megatron) or 001 (GPT-NeoX's DeepSpeed pipeline, paper 001 Eq. 3–5: embedding and head count as layers of the end stages)."),
    first_stage_layers: int = typer.Option(0, "--first-stage-layers", min=0, help="Layers of the first pipeline stage, the others splitting the rest evenly (Megatron-core's --decoder-first-pipeline-num-layers; 0: an even share)."),
    last_stage_layers: int = typer.Option(0, "--last-stage-layers", min=0, help="Layers of the last pipeline stage (Megatron-core's --decoder-last-pipeline-num-layers; 0: an even share)."),
    moe_imbalance: float = typer.Option(1.0, "--moe-imbalance", help="MoE with --ep > 1: the tokens the busiest expert-parallel rank is routed, over the mean (1: balanced, the default; from the router's per-expert token counts summed over each rank's experts). That rank's expert GEMMs, all-to-all bytes and expert activations scale by it, and it sets the pace."),
    optimizer: str = typer.Option("adam", "--optimizer", help="adam (mixed-precision Adam, Megatron's) or sgd (plain SGD on the weights, no state: one element-wise pass over the parameters)."),
    impl: str = typer.Option("fused", "--impl", help="Kernel implementation: fused (Megatron-style fused norm/activation/rotary/loss kernels, paper 001's operators), neox (GPT-NeoX: the same with its unfused RMSNorm module, as paper 001 measured it) or hf (HuggingFace modules in eager PyTorch: their many small aten calls, counted from HF's code; tp = cp = 1)."),
    hf_experts: str | None = typer.Option(None, "--hf-experts", help="With --impl hf and an MoE model: transformers 5's experts implementation, grouped_mm (its default: tokens sorted by expert, one grouped GEMM per projection) or eager (experts_implementation=\"eager\": a loop over the experts, one GEMM pair each). Default: grouped_mm."),
    moe_grouped_gemm: bool = typer.Option(False, "--moe-grouped-gemm", help="MoE models (not --impl hf): Megatron-core's --moe-grouped-gemm, the local experts' GEMMs run by TransformerEngine's GroupedLinear (one call per projection, one cuBLAS GEMM per expert over four streams); default: Megatron's SequentialMLP, a Python loop over the local experts' modules."),
    wgrad_fusion: bool = typer.Option(False, "--wgrad-fusion", help="Weight gradients accumulate inside their GEMMs (Megatron-LM's --gradient-accumulation-fusion); default: a separate add per parameter tensor and micro-batch, as PyTorch autograd, DeepSpeed and FSDP do."),
    contention: bool = typer.Option(True, "--contention/--no-contention", help="Communication hidden behind compute (the overlapped gradient reduction, ZeRO-3's prefetched gathers and reduce-scatters, the context-parallel ring) slows the compute it overlaps by the factor measured on the shipped multi-rank traces (docs/llm.md, Contention); --no-contention: that communication is free."),
    overlap_grad_reduce: bool | None = typer.Option(None, "--overlap-grad-reduce/--no-overlap-grad-reduce", help="Reduce data-parallel gradients in buckets during the last backward (PyTorch DDP's default; Megatron-core's --overlap-grad-reduce) or after it (Megatron-LM's local DDP, DeepSpeed's pipeline engine). Default: during it with --impl hf (eager PyTorch under DDP), else after it."),
    overlap_param_gather: bool = typer.Option(False, "--overlap-param-gather", help="With --zero 1 --dist-optimizer --overlap-grad-reduce (Megatron-core asserts them): all-gather the updated weights bucket by bucket during the next iteration's first forward, as Megatron-core's --overlap-param-gather does, instead of after the update; only the part the forward cannot hide is charged."),
    memory_headroom: str | None = typer.Option(None, "--memory-headroom", help="Memory to keep free on each GPU for the plan to count as fitting: a fraction (0.1), a percentage (10%) or an amount (6GiB). The memory model leaves out allocator fragmentation, and for --impl fused/neox the backward's and the optimizer's temporaries (--impl hf counts them at the step's largest moment). Default: none."),
    closed_form: bool = typer.Option(False, "--closed-form", help="Skip the simulation: paper 001's Eq. 7 only (sub-millisecond)."),
    kernel_models: list[Path] | None = typer.Option(None, "--kernel-models", help="A `trainsim fit` .npz artifact of this system's device, answering before the shipped kernel models (repeatable)."),
    comm_models: list[Path] | None = typer.Option(None, "--comm-models", help="A `trainsim fit-comm` .json artifact of this system, answering before the shipped comm models (repeatable)."),
    timeline: Path | None = typer.Option(None, "--timeline", help="Write the simulated iteration here (Chrome trace JSON; open in Perfetto)."),
    timeline_max_passes: int = typer.Option(65536, "--timeline-max-passes", min=1, help="Largest timeline, in stage passes (micro-batches × stages × chunks; 65,536 ≈ 2 GB of memory, 200 MB of JSON)."),
    fmt: Format = typer.Option(Format.TABLE, "--format", help="table or json (JSON goes to stdout alone)."),
) -> None:  # fmt: skip
    """Predict one training iteration of a transformer under a parallel plan, before running it."""
    from trainsim.builders.memory import headroom_bytes
    from trainsim.builders.models import get_model
    from trainsim.builders.plan import Plan
    from trainsim.builders.predict import overlaps_comm, predict_llm
    from trainsim.errors import ConfigError
    from trainsim.hardware import get_system

    cp_comm = "all_gather" if cp_comm_type == "allgather" else cp_comm_type  # Megatron's spelling
    _check_options(locals())
    spec = get_model(model)
    sysspec = get_system(system)
    from trainsim.hardware import get_device

    headroom = headroom_bytes(memory_headroom, get_device(sysspec.device).memory_bytes)
    from trainsim.cli.calibration import use_artifacts

    with use_artifacts(kernel_models, comm_models, system=sysspec):
        if dp is None:
            base = tp * cp * pp
            if gpus is not None and gpus % base:
                raise ConfigError(f"--gpus {gpus} is not a multiple of tp×cp×pp = {base}")
            dp = gpus // base if gpus is not None else 1
        overlap_note = overlap_grad_reduce is None and impl == "hf" and dp * cp > 1 and zero < 3
        if overlap_grad_reduce is None:  # eager PyTorch trains under DDP, which overlaps by default
            overlap_grad_reduce = impl == "hf"
        plan = Plan(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, cp_comm=cp_comm, sp=sp, zero=zero, dist_optimizer=dist_optimizer, micro_batch=micro_batch,  # type: ignore[arg-type]
                    global_batch=global_batch or 0, seq_len=seq_len or 0, schedule=schedule,  # type: ignore[arg-type]
                    vpp=vpp, recompute=recompute, dtype=dtype, attention=attention,  # type: ignore[arg-type]
                    attention_dropout=attention_dropout, wgrad_fusion=wgrad_fusion,
                    overlap_grad_reduce=overlap_grad_reduce, hidden_dropout=hidden_dropout, impl=impl, partition=partition,  # type: ignore[arg-type]
                    optimizer=optimizer, first_stage_layers=first_stage_layers, last_stage_layers=last_stage_layers,  # type: ignore[arg-type]
                    moe_imbalance=moe_imbalance, contention=contention, hf_experts=hf_experts,  # type: ignore[arg-type]
                    moe_grouped_gemm=moe_grouped_gemm, overlap_param_gather=overlap_param_gather)  # fmt: skip
        if overlap_note:
            plan.validate(spec, gpus=gpus)  # a plan that cannot run gets its error, not this note first
            stderr.print("[yellow]note:[/] --impl hf: data-parallel gradients are reduced during the backward, as "
                         "PyTorch DDP does by default (--no-overlap-grad-reduce: after it)")  # fmt: skip
        if timeline is not None:
            from trainsim.cli.output import timeline_target

            inputs = [p for p in (model, system) if Path(p).expanduser().exists()]
            timeline_target(timeline, [*inputs, *(kernel_models or []), *(comm_models or [])])
            plan.validate(spec, gpus=gpus)
            passes = plan.grad_accum * plan.pp * plan.vpp
            if passes > timeline_max_passes:
                raise ConfigError(
                    f"--timeline records every micro-batch: {plan.grad_accum:,} micro-batches × {plan.pp} stages"
                    f" × {plan.vpp} chunks = {passes:,} stage passes, over --timeline-max-passes {timeline_max_passes:,};"
                    " lower --global-batch for the timeline (the steady state repeats per micro-batch) or raise the limit"
                )
        r = predict_llm(
            spec,
            plan,
            sysspec,
            simulate=not closed_form,
            gpus=gpus,
            full_simulation=timeline is not None,
            memory_headroom_bytes=headroom,
            system_ref=system,
        )
        if timeline is not None:
            if r.sim is None:
                raise ConfigError("--timeline needs the simulation; drop --closed-form")
            from trainsim.sim.timeline import write_timeline

            write_timeline(r.sim, timeline)
            stderr.print(f"wrote timeline: {timeline}")
        doc = r.to_dict()
        if fmt is Format.JSON:
            emit_json(doc)
            return
        t = Table(title=f"{spec.name} on {plan.gpus}× {r.device.name} ({sysspec.name}), {plan.label()}, "
                        f"{plan.batch:,} × {plan.seq(spec):,} tokens")  # fmt: skip
        t.add_column("quantity")
        t.add_column("value", justify="right")
        t.add_row("iteration time", f"{r.iteration_time_s * 1e3:,.1f} ms ({r.method})")
        t.add_row("closed form 001 Eq. 7 / 003 Eq. 4",
                  f"{r.closed_form_s['001_eq7'] * 1e3:,.1f} / {r.closed_form_s['003_eq4'] * 1e3:,.1f} ms")  # fmt: skip
        t.add_row("tokens/s", f"{r.tokens_per_s:,.0f}")
        spec = sum(n for k, n in r.provenance["kernels"].items() if k.startswith("spec-based"))
        t.add_row("MFU", f"{r.mfu * 100:.1f} %" + (" (upper bound: spec-based operators)" if spec else ""))
        pk = r.peak_memory
        fits = "fits" if r.fits_in_memory else "DOES NOT FIT"
        t.add_row(
            "memory per GPU (peak stage)",
            f"{_gib(pk.total_bytes)} of {_gib(r.device.memory_bytes)}"
            + (f" less {_gib(r.memory_headroom_bytes)} headroom" if r.memory_headroom_bytes else "")
            + f": {fits}",
        )
        if pk.phase != "backward":  # impl hf: the moment of the step it is of
            t.add_row("  at the step's largest moment", pk.phase.replace("-", " "))
        t.add_row(
            "  weights / grads / optimizer",
            f"{_gib(pk.weights_bytes)} / {_gib(pk.gradients_bytes)} / {_gib(pk.optimizer_bytes)}",
        )
        t.add_row("  activations / buffers", f"{_gib(pk.activations_bytes)} / {_gib(pk.buffers_bytes)}")
        t.add_row("  activations from", activations_cell(str(r.provenance["activations"])))
        t.add_row(f"breakdown (stage {r.breakdown['stage']:.0f})", "")
        for k, v in r.breakdown.items():
            if k in ("ep_communication_s", "cp_communication_s") and v == 0.0:
                continue  # no expert / context parallelism (the JSON keeps the zero)
            if k != "stage":
                t.add_row("  " + k.removesuffix("_s").replace("_", " "), f"{v * 1e3:,.1f} ms")
        label = _PROVENANCE.get(str(r.provenance["summary"]), str(r.provenance["summary"]))
        if r.provenance["summary"] == "calibrated" and (why := carried(r.provenance)):
            label = f"calibrated (from measurements, some carried {' and '.join(why)}: notes below)"
        t.add_row("provenance", label)
        if overlaps_comm(r.plan) or not r.plan.contention:
            from trainsim.builders.contention import short as contention_cell

            # the table's short form; --format json keeps the whole provenance
            t.add_row("contention", contention_cell() if r.plan.contention else str(r.provenance["contention"]))
        from rich.console import Console

        Console().print(t)
        sys.stdout.flush()  # the table before the notes (stderr) when both go to one terminal or file
        for w in r.warnings:
            stderr.print(f"[yellow]note:[/] {escape(w)}")


def _check_options(o: dict[str, Any]) -> None:
    """The options' own domains and the options that go together, before any input is read: a
    usage error (exit 2) naming the option. What depends on the model or the GPU count
    (divisibility, layers, MoE) is :meth:`Plan.validate`'s, exit 1."""
    import math

    from trainsim.builders.eager import HF_EXPERTS
    from trainsim.builders.memory import parse_headroom
    from trainsim.builders.plan import (
        ATTENTION,
        CP_COMMS,
        DTYPES,
        IMPLS,
        OPTIMIZERS,
        PARTITIONS,
        RECOMPUTE,
        SCHEDULES,
    )
    from trainsim.cli.usage import fraction, one_of, usage
    from trainsim.errors import UsageError

    for flag, key, choices in (("--cp-comm-type", "cp_comm", CP_COMMS), ("--recompute", "recompute", RECOMPUTE),
                               ("--schedule", "schedule", SCHEDULES), ("--dtype", "dtype", DTYPES),
                               ("--attention", "attention", ATTENTION), ("--partition", "partition", PARTITIONS),
                               ("--optimizer", "optimizer", OPTIMIZERS), ("--impl", "impl", IMPLS)):  # fmt: skip
        one_of(o[key], choices, flag)
    if o["hf_experts"] is not None:
        one_of(o["hf_experts"], HF_EXPERTS, "--hf-experts")
    fraction(o["attention_dropout"], "--attention-dropout")
    fraction(o["hidden_dropout"], "--hidden-dropout")
    if not 1.0 <= o["moe_imbalance"] < math.inf:
        raise UsageError("--moe-imbalance (the busiest expert-parallel rank's tokens over the mean) must be a number "
                         f">= 1, got {o['moe_imbalance']:g}")  # fmt: skip
    if o["memory_headroom"] is not None:
        with usage():
            parse_headroom(o["memory_headroom"])
    needs = (  # (refused, why): an option given without the one it goes with, or with one it excludes
        (o["sp"] and o["tp"] == 1, "--sp splits the activations over the tensor-parallel group: it needs --tp > 1"),
        (o["dist_optimizer"] and o["zero"] != 1, f"--dist-optimizer is a ZeRO-1: it needs --zero 1, got --zero {o['zero']}"),
        (o["overlap_param_gather"] and not (o["dist_optimizer"] and o["zero"] == 1 and o["overlap_grad_reduce"] is not False
                                            and (o["overlap_grad_reduce"] or o["impl"] == "hf")),
         "--overlap-param-gather needs --zero 1 --dist-optimizer --overlap-grad-reduce (Megatron-core asserts them)"),
        (o["vpp"] > 1 and o["schedule"] != "interleaved", "--vpp > 1 needs --schedule interleaved"),
        (o["partition"] != "even" and o["schedule"] == "interleaved",
         "--partition 001 (GPT-NeoX's) splits one chunk per stage: not with --schedule interleaved"),
        ((o["first_stage_layers"] or o["last_stage_layers"]) and (o["partition"] != "even" or o["schedule"] == "interleaved"),
         "--first-stage-layers/--last-stage-layers set the end stages of the even partition with one chunk per stage: "
         "not with --partition 001 or --schedule interleaved"),
        (o["impl"] == "hf" and max(o["tp"], o["cp"], o["ep"]) > 1,
         f"--impl hf runs one model replica per GPU (--tp, --cp and --ep 1), got --tp {o['tp']}, --cp {o['cp']}, --ep {o['ep']}"),
        (o["hf_experts"] is not None and o["impl"] != "hf", f"--hf-experts needs --impl hf, got --impl {o['impl']}"),
        (o["moe_grouped_gemm"] and o["impl"] == "hf",
         "--moe-grouped-gemm is Megatron-core's (not with --impl hf, whose experts --hf-experts picks)"),
        (o["timeline"] is not None and o["closed_form"], "--timeline needs the simulation; drop --closed-form"),
    )  # fmt: skip
    why = next((w for refused, w in needs if refused), None)
    if why:
        raise UsageError(why)


@app.command("models")
def models(
    fmt: Format = typer.Option(Format.TABLE, "--format", help="table or json (JSON goes to stdout alone)."),
) -> None:  # fmt: skip
    """List the model catalog (`trainsim predict NAME` takes any of these, a config.json or a YAML spec)."""
    import sys

    from rich.console import Console

    from trainsim.builders.models import list_models

    rows: list[dict[str, Any]] = [{"name": m.name, "params": m.params(), "params_unpadded": m.params(padded=False), "hidden": m.hidden, "layers": m.layers, "heads": m.heads,
             "kv_heads": m.n_kv, "ffn": m.ffn, "vocab": m.vocab, "seq_len": m.seq_len, "activation": m.activation,
             "norm": m.norm, "experts": m.num_experts, "top_k": m.top_k, "mtp_layers": m.mtp_layers,
             "mtp_params": m.mtp_params(), "aliases": list(m.aliases)}
            for m in list_models()]  # fmt: skip
    if fmt is Format.JSON:
        emit_json({"models": rows})
        return
    t = Table(title=f"{len(rows)} catalog models")
    for col in ("name", "params", "hidden", "layers", "heads", "kv", "ffn", "vocab", "seq", "MLP", "norm", "experts"):
        t.add_column(col, justify="left" if col in ("name", "MLP", "norm") else "right")
    for r in rows:
        mtp = f" +{r['mtp_params'] / 1e9:.1f} B MTP" if r["mtp_layers"] else ""  # its own, beside the main model
        t.add_row(r["name"], f"{r['params'] / 1e9:.2f} B{mtp}", str(r["hidden"]), str(r["layers"]), str(r["heads"]),
                  str(r["kv_heads"]), str(r["ffn"]), str(r["vocab"]), str(r["seq_len"]), str(r["activation"]),
                  str(r["norm"]), f"{r['experts']}×top{r['top_k']}" if r["experts"] else "—")  # fmt: skip
    Console(width=None if sys.stdout.isatty() else 140).print(t)
