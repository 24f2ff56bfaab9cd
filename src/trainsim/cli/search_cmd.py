"""``trainsim search MODEL``: rank the feasible parallel plans of an LLM on a system."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from trainsim.cli.main import app
from trainsim.cli.output import Format, emit_json, stderr


def _ints(text: str | None, what: str, minimum: int = 1, allowed: tuple[int, ...] = ()) -> tuple[int, ...]:
    """The comma-separated integers of a list option; None (the option left out) is ``()``;
    ``allowed``, when given, lists every value the option takes. A bad list is a usage error."""
    from trainsim.errors import UsageError

    if text is None:
        return ()
    try:
        vals = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise UsageError(f"{what} must be comma-separated integers, got {text!r}") from None
    if allowed and any(v not in allowed for v in vals):
        raise UsageError(f"{what} must be among {', '.join(map(str, allowed))}, got {text!r}")
    if any(v < minimum for v in vals):
        raise UsageError(f"{what} values must be >= {minimum}, got {text!r}")
    return vals


def _words(text: str, what: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    from trainsim.errors import UsageError

    vals = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in vals if v not in allowed]
    if bad or not vals:
        raise UsageError(f"{what} must be among {', '.join(allowed)}, got {text!r}")
    return vals


def _default_recompute(attention: str) -> tuple[str, ...]:
    """Flash attention keeps no scores: selective recompute would be the none plan, slower."""
    return ("none", "full") if attention == "flash" else ("none", "selective", "full")


TIGHT_MEMORY = 0.95  # plans above this share of the memory limit are marked: they may not fit


@app.command()
def search(
    *,
    model: str = typer.Argument(..., metavar="MODEL", help="Catalog model, HuggingFace config.json or YAML model spec (as for `trainsim predict`)."),
    system: str = typer.Option("dgx-a100", "--system", help="Catalog system (name or YAML)."),
    gpus: int = typer.Option(..., "--gpus", min=1, help="Total GPUs (dp = gpus / (tp×cp×pp))."),
    global_batch: int = typer.Option(..., "--global-batch", min=1, help="Sequences per iteration."),
    seq_len: int | None = typer.Option(None, "--seq-len", min=1, help="Sequence length (default: the model's)."),
    tp: str | None = typer.Option(None, "--tp", help="Tensor-parallel degrees to try, e.g. 1,2,4,8 (default: powers of two up to a node)."),
    pp: str | None = typer.Option(None, "--pp", help="Pipeline stages to try (default: powers of two up to the layers)."),
    cp: str = typer.Option("1", "--cp", help="Context-parallel degrees to try."),
    cp_comm_type: str = typer.Option("p2p", "--cp-comm-type", help="Context-parallel K/V exchanges to try with --cp > 1, comma-separated: p2p (the ring, the default), all_gather (or allgather) and a2a (Ulysses); see `trainsim predict --help`."),
    ep: str | None = typer.Option(None, "--ep", help="Expert-parallel degrees to try (MoE; default: 1 for a dense model, for MoE the powers of two dividing its experts)."),
    micro_batch: str = typer.Option("1,2,4,8", "--micro-batch", help="Micro-batch sizes to try."),
    zero: str = typer.Option("0,1,2,3", "--zero", help="ZeRO stages to try."),
    dist_optimizer: bool = typer.Option(False, "--dist-optimizer", help="ZeRO-1 plans use Megatron-LM's distributed optimizer (gradients reduce-scattered); see `trainsim predict --help`."),
    moe_imbalance: float = typer.Option(1.0, "--moe-imbalance", help="MoE: the tokens the busiest expert-parallel rank is routed, over the mean, in every plan with ep > 1 (not searched; 1: balanced); see `trainsim predict --help`."),
    recompute: str | None = typer.Option(None, "--recompute", help="Recompute modes to try (default: none, full, and selective where the attention keeps scores: not with flash)."),
    schedule: str = typer.Option("1f1b,interleaved", "--schedule", help="Pipeline schedules to try."),
    vpp: str = typer.Option("2,4", "--vpp", help="Chunks per stage for the interleaved schedule."),
    sp: str = typer.Option("both", "--sp", help="Sequence parallelism: on, off or both."),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16, fp16 or fp32."),
    attention: str = typer.Option("flash", "--attention", help="flash, fused or unfused."),
    wgrad_fusion: bool = typer.Option(False, "--wgrad-fusion", help="Weight gradients accumulate inside their GEMMs (Megatron-LM); see `trainsim predict --help`."),
    moe_grouped_gemm: bool = typer.Option(False, "--moe-grouped-gemm", help="MoE: every plan runs its experts' GEMMs as Megatron-core's --moe-grouped-gemm does (TransformerEngine's GroupedLinear), not SequentialMLP's loop; see `trainsim predict --help`."),
    trim_end_stages: int = typer.Option(0, "--trim-end-stages", min=0, help="Also try up to N layers taken off the first and last pipeline stages together, the middle ones even (Megatron-core's --decoder-first/last-pipeline-num-layers): offsets the embedding, the head and MTP depths there (1F1B, GPipe). Default 0: even splits only."),
    framework: str = typer.Option("any", "--framework", help="Rank only the plans one framework runs: megatron (DDP or its distributed optimizer for ZeRO-1; 1F1B, interleaved), deepspeed (ZeRO-1 at most with pipelining; 1F1B; context parallelism as Ulysses a2a only, without SP), torchtitan (DDP or FSDP2 as ZeRO-2/3; TP with SP; CP p2p or all_gather) or any."),
    overlap_grad_reduce: bool = typer.Option(False, "--overlap-grad-reduce", help="Data-parallel gradients reduced during the last backward (PyTorch DDP, Megatron-core); see `trainsim predict --help`."),
    overlap_param_gather: bool = typer.Option(False, "--overlap-param-gather", help="The distributed optimizer's weight gathers run bucket by bucket in the next iteration's first forward (Megatron-core's --overlap-param-gather), on every plan that can take it: ZeRO-1 with --dist-optimizer (or --framework megatron) and --overlap-grad-reduce, dp×cp > 1; the others run without it. See `trainsim predict --help`."),
    contention: bool = typer.Option(True, "--contention/--no-contention", help="Overlapped communication slows the compute beside it by the measured factor (default), or is free; see `trainsim predict --help`."),
    objective: str = typer.Option("time", "--objective", help="time (iteration), time-to-train (needs --train-tokens) or cost."),
    train_tokens: float | None = typer.Option(None, "--train-tokens", help="Tokens to train on (time-to-train, cost)."),
    gpu_hour_price: float | None = typer.Option(None, "--gpu-hour-price", help="Price of one GPU-hour (cost)."),
    top_k: int = typer.Option(10, "--top-k", min=1, help="Plans to report."),
    simulate_top: int = typer.Option(32, "--simulate-top", min=1, help="Best screened plans to simulate before ranking."),
    memory_headroom: str | None = typer.Option(None, "--memory-headroom", help="Memory to keep free on each GPU (a fraction 0.1, a percentage 10% or an amount 6GiB): plans that leave less are infeasible. Default: none (see `trainsim predict --help`)."),
    workers: int | None = typer.Option(None, "--workers", min=1, help="Local screening processes (default: every core this process may use; not with --scheduler)."),
    kernel_models: list[Path] | None = typer.Option(None, "--kernel-models", help="A `trainsim fit` .npz artifact of this system's device, answering before the shipped kernel models (repeatable)."),
    comm_models: list[Path] | None = typer.Option(None, "--comm-models", help="A `trainsim fit-comm` .json artifact of this system, answering before the shipped comm models (repeatable)."),
    scheduler: str | None = typer.Option(None, "--scheduler", help="Dask scheduler address (tcp://host:port) to screen on a cluster; its workers need this trainsim (the same source)."),
    fmt: Format = typer.Option(Format.TABLE, "--format", help="table or json (JSON goes to stdout alone)."),
) -> None:  # fmt: skip
    """Screen every plan of the space with the closed form, simulate the best, rank them."""
    import math

    from trainsim.builders.memory import headroom_bytes, parse_headroom
    from trainsim.builders.models import get_model
    from trainsim.builders.plan import ATTENTION, CP_COMMS, DTYPES, RECOMPUTE, SCHEDULES
    from trainsim.cli.usage import one_of, usage
    from trainsim.errors import ConfigError, UsageError
    from trainsim.hardware import get_system
    from trainsim.search.frameworks import check_framework
    from trainsim.search.llm import check_objective, scheduler_address, search_llm
    from trainsim.search.space import PlanSpace

    # the options alone first (usage errors, exit 2), then what the model and system make of them
    if scheduler and scheduler.startswith("inproc://"):
        raise UsageError(f"--scheduler {scheduler}: an in-process scheduler lives in the Python program that made it "
                         "(a LocalCluster(processes=False)), which a command cannot reach; give a tcp:// address, "
                         "or search from that program (trainsim.search.llm.search_llm)")  # fmt: skip
    if scheduler and (kernel_models or comm_models):
        raise UsageError("--kernel-models/--comm-models are local files the Dask workers cannot read; "
                         "screen locally (drop --scheduler) or install the artifacts on the workers")  # fmt: skip
    with usage():
        if scheduler:
            scheduler_address(scheduler)
        check_objective(objective, train_tokens=train_tokens, gpu_hour_price=gpu_hour_price)  # before any note
        check_framework(framework)
        if memory_headroom is not None:
            parse_headroom(memory_headroom)
    # a number the objective does not use would be dropped in silence: the ranking not the one asked for
    if train_tokens is not None and objective == "time":
        raise UsageError("--train-tokens counts for --objective time-to-train or cost, not time (the default, "
                         "which ranks by iteration time): add --objective time-to-train or cost")  # fmt: skip
    if gpu_hour_price is not None and objective != "cost":
        raise UsageError(f"--gpu-hour-price counts for --objective cost only, not {objective}"
                         f"{' (the default)' if objective == 'time' else ''}: add --objective cost")  # fmt: skip
    one_of(sp, ("on", "off", "both"), "--sp")
    one_of(dtype, DTYPES, "--dtype")
    one_of(attention, ATTENTION, "--attention")
    if not 1.0 <= moe_imbalance < math.inf:
        raise UsageError("--moe-imbalance (the busiest expert-parallel rank's tokens over the mean) must be a number "
                         f">= 1, got {moe_imbalance:g}")  # fmt: skip
    if moe_grouped_gemm and framework in ("deepspeed", "torchtitan"):
        raise UsageError(f"--moe-grouped-gemm is Megatron-core's (TransformerEngine's GroupedLinear), not "
                         f"{framework}'s: drop it or use --framework megatron or any")  # fmt: skip
    zeros = _ints(zero, "--zero", minimum=0, allowed=(0, 1, 2, 3))
    if dist_optimizer and 1 not in zeros:
        raise UsageError(f"--dist-optimizer changes the ZeRO-1 plans, and --zero {zero} tries none")
    lists = {"tp": _ints(tp, "--tp"), "pp": _ints(pp, "--pp"), "cp": _ints(cp, "--cp"), "ep": _ints(ep, "--ep"),
             "cp_comm": tuple(dict.fromkeys(_words(cp_comm_type.replace("allgather", "all_gather"), "--cp-comm-type", CP_COMMS))),
             "micro_batch": _ints(micro_batch, "--micro-batch"), "zero": zeros,
             "recompute": _words(recompute, "--recompute", RECOMPUTE) if recompute is not None else _default_recompute(attention),
             "schedule": _words(schedule, "--schedule", SCHEDULES), "vpp": _ints(vpp, "--vpp"),
             "sp": {"on": (True,), "off": (False,), "both": (False, True)}[sp]}  # fmt: skip
    spec = get_model(model)
    sysspec = get_system(system)
    from trainsim.cli.calibration import use_artifacts
    from trainsim.hardware import get_device

    headroom = headroom_bytes(memory_headroom, get_device(sysspec.device).memory_bytes)
    if simulate_top < top_k and fmt is Format.TABLE:
        stderr.print(f"--simulate-top {simulate_top} is below --top-k {top_k}: the best {top_k} screened plans are "
                     "simulated, so every reported plan is simulated")  # fmt: skip
    if objective == "cost" and (train_tokens is None or gpu_hour_price is None) and fmt is Format.TABLE:
        from trainsim.search.llm import objective_unit

        unit = objective_unit(objective, train_tokens=train_tokens, gpu_hour_price=gpu_hour_price)
        stderr.print(f"cost is counted in {unit}: give --train-tokens for a whole run and --gpu-hour-price for money")
    with use_artifacts(kernel_models, comm_models, system=sysspec):
        if moe_grouped_gemm and not spec.is_moe:
            raise ConfigError(f"--moe-grouped-gemm runs an MoE model's experts as grouped GEMMs; {spec.name} is dense")
        space = PlanSpace(
            gpus=gpus, global_batch=global_batch, seq_len=seq_len or 0, **lists, dtype=dtype, attention=attention,  # type: ignore[arg-type]
            wgrad_fusion=wgrad_fusion, overlap_grad_reduce=overlap_grad_reduce, dist_optimizer=dist_optimizer,
            moe_imbalance=moe_imbalance, framework=framework, contention=contention, trim_end_stages=trim_end_stages,
            moe_grouped_gemm=moe_grouped_gemm, overlap_param_gather=overlap_param_gather,
        )  # fmt: skip
        r = search_llm(spec, sysspec, space, objective=objective, top_k=top_k, simulate_top=simulate_top,
                       workers=workers, scheduler=scheduler, train_tokens=train_tokens, gpu_hour_price=gpu_hour_price,
                       memory_headroom_bytes=headroom)  # fmt: skip
        if fmt is Format.JSON:
            emit_json(r)  # the reasons too when nothing is feasible; the exit code still says so
        if not r["feasible"]:
            ex = r.get("infeasible_examples", {})
            top = "; ".join(f"{n}× {ex.get(why, why)}" for why, n in list(r["infeasible"].items())[:3])
            raise ConfigError(f"no feasible plan among {r['enumerated']} combinations ({top or 'none enumerated'})")
        if fmt is Format.JSON:
            return
        import sys

        from rich.console import Console

        for note in r.get("notes", ()):
            stderr.print(f"[yellow]note:[/] {escape(note)}")
        t = Table(title=f"{spec.name} on {gpus}× {sysspec.device} ({sysspec.name}), global batch {global_batch}, "
                        f"sequence {r['seq_len']:,}: "
                        f"best {len(r['plans'])} of {r['feasible']:,} feasible ({r['enumerated']:,} enumerated, "
                        f"{r['evaluated']:,} of them screened by the closed form)"
                        + (f", memory limit {r['memory_limit_bytes'] / 2**30:.1f} GiB per GPU" if headroom else ""))  # fmt: skip
        cols = ["#", "plan", "iteration", "closed form", "tokens/s", "MFU", "memory/GPU"]
        if objective != "time":
            cols.append(f"{objective} ({r['objective_unit']})")
        for col in cols:  # plan names whole where they fit (users copy them into `trainsim predict`); on a
            # narrow terminal the plan folds instead of the figures being cut to "1…" (--format json: whole)
            t.add_column(col, justify="right" if col != "plan" else "left", no_wrap=col != "plan",
                         overflow="fold" if col == "plan" else "ellipsis")
        uncalibrated = tight = 0
        capacity = r["memory_limit_bytes"]
        for i, p in enumerate(r["plans"], 1):
            mark = "" if p["provenance"]["summary"] == "calibrated" else " †"
            uncalibrated += bool(mark)
            if p["memory_per_gpu_bytes"] > TIGHT_MEMORY * capacity:
                mark += " ‡"
                tight += 1
            row = [str(i), p["plan"] + mark, f"{p['iteration_time_s'] * 1e3:,.1f} ms", f"{p['screened_s'] * 1e3:,.1f} ms",
                   f"{p['tokens_per_s']:,.0f}", f"{p['mfu'] * 100:.1f} %", f"{p['memory_per_gpu_bytes'] / 2**30:.1f} GiB"]  # fmt: skip
            if objective != "time":
                row.append(f"{p['objective']:,.4g}")
            t.add_row(*row)
        Console(width=None if sys.stdout.isatty() else 160).print(t)
        if uncalibrated:
            stderr.print("† some operators or collectives of this plan are spec-based (no measurements): its time "
                         "is optimistic beside the calibrated plans; `trainsim predict` with the plan lists them"
                         + ("; the unmarked plans are calibrated" if uncalibrated < len(r["plans"]) else ""))  # fmt: skip
        elif r["plans"]:  # the table states every prediction's provenance, as `predict` does
            from trainsim.cli.predict_cmd import carried

            why = list(dict.fromkeys(w for p in r["plans"] for w in carried(p["provenance"])))
            stderr.print("provenance: every plan listed is calibrated (its operators and collectives timed from "
                         + (f"measurements, some carried {' and '.join(why)}" if why else "measurements")
                         + "); `trainsim predict` with a plan details it")  # fmt: skip
        if tight:
            stderr.print(f"‡ the plan needs more than {TIGHT_MEMORY:.0%} of the {capacity / 2**30:.1f} GiB per GPU: the "
                         "memory model leaves out allocator fragmentation and temporaries, so it may not fit; "
                         "--memory-headroom 10% ranks only plans with room")  # fmt: skip
        tm = r["timings_s"]
        stderr.print(f"screened {r['evaluated']} plans in {tm['screen']:.2f} s ({r['screened_per_min']:,.0f}/min), "
                     f"simulated {r['simulated']} in {tm['simulate']:.2f} s")  # fmt: skip
        if r["infeasible"]:
            ex = r.get("infeasible_examples", {})
            # each reason once: its first full message where the generic one dropped numbers
            # ("N pipeline chunks exceed ..." read twice over as "N ... (e.g. 64 ...)")
            stderr.print(
                "infeasible: "
                + "; ".join(f"{n:,}× " + (f"such as {ex[why]}" if ex.get(why, why) != why else why)
                            for why, n in r["infeasible"].items())
            )
