"""``trainsim replay PATH…``: simulate traced workloads and compare with the measured step."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from trainsim.cli.main import app
from trainsim.cli.output import Format, emit_json, log, stderr, timeline_target
from trainsim.sim.options import HostMode, KernelSource


def _step(value: str) -> str | int:
    return int(value) if value.isdigit() else value


def _pair(text: str, what: str, form: str = "NAME:FACTOR") -> tuple[str, float]:
    from trainsim.errors import UsageError

    name, sep, value = text.partition(":")
    try:
        if not sep:
            raise ValueError
        factor = float(value)
    except ValueError:
        raise UsageError(f"{what} must look like {form}, got {text!r}") from None
    _factor(factor, what)
    return name, factor


def _factor(value: float, what: str) -> None:
    import math

    from trainsim.errors import UsageError

    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{what}: the factor must be a positive finite number, got {value:g}")


@app.command()
def replay(
    *,
    paths: list[Path] = typer.Argument(..., metavar="PATH", help="Kineto traces (.json/.json.gz), archives (.tar.gz) or folders; one per rank for multi-rank jobs."),
    fmt: Format = typer.Option(Format.TABLE, "--format", help="table or json (JSON goes to stdout alone)."),
    kernels: KernelSource = typer.Option(KernelSource.MEASURED, "--kernels", help="Kernel durations: measured (from the trace) or model (registry; measured where no model applies)."),
    overheads: HostMode | None = typer.Option(None, "--overheads", help="Host gaps: trace (exact, sanity check), stats (per-op means of this workload; the default) or shared (--overhead-db; the default when one is given)."),
    overhead_db: Path | None = typer.Option(None, "--overhead-db", help="T1–T5 database (JSON, from `trainsim analyze --overhead-db`) for --overheads shared."),
    timeline: Path | None = typer.Option(None, "--timeline", help="Write the predicted timeline here (Chrome trace JSON; open in Perfetto)."),
    step: str = typer.Option("median", "--step", help="Which iteration: median, first, last or a ProfilerStep number."),
    no_et: bool = typer.Option(False, "--no-et", help="Do not link the execution traces given with the Kineto traces (as files, or inside a given folder or archive)."),
    no_intra_rank_sync: bool = typer.Option(False, "--no-intra-rank-sync", help="Drop 000 §III-D's intra-rank rule (for comparison)."),
    stats_iqr: bool = typer.Option(False, "--stats-iqr", help="stats: 002's IQR-filtered means instead of plain means (for comparison)."),
    system: str | None = typer.Option(None, "--system", help="--kernels model: catalog system (name or YAML) whose collective models answer; default: the only catalog system of the trace's device."),
    straggler: str | None = typer.Option(None, "--straggler", help="What-if: RANK:FACTOR, e.g. 3:1.5 (rank 3's kernels 1.5× slower)."),
    network: float | None = typer.Option(None, "--network-speedup", help="What-if: collectives this many times faster (0.5: twice slower)."),
    family: str | None = typer.Option(None, "--scale-family", help="What-if: FAMILY:FACTOR, e.g. gemm:0.5 (GEMMs twice as fast). One kernel family (gemm, conv, attention, norm, elementwise, nccl_all_reduce, ...: the IR's KernelFamily); analyze's GEMM column groups gemm, conv and attention, so scale each."),
    batch: int | None = typer.Option(None, "--batch", help="What-if: the step at this per-rank batch size (002 §4.5.1.1 resize: shapes rescaled, kernels re-timed by kernel models)."),
    old_batch: int | None = typer.Option(None, "--old-batch", help="--batch: the traced batch size (default: the capture.json beside the trace)."),
    seq_len: int | None = typer.Option(None, "--seq-len", help="What-if: the step at this sequence length (resize along the sequence: shapes rescaled, kernels re-timed, attention by its s² work)."),
    old_seq_len: int | None = typer.Option(None, "--old-seq-len", help="--seq-len: the traced sequence length (default: the capture.json beside the trace)."),
    hidden: int | None = typer.Option(None, "--hidden", help="What-if: the step at this hidden size (one rank; every width scales with it: weights, activations, the head size; kernels re-timed)."),
    scale_heads: bool = typer.Option(False, "--scale-heads", help="--hidden: the head count scales and the head size stays (as model families grow); default: the heads stay, the head size scales."),
    old_hidden: int | None = typer.Option(None, "--old-hidden", help="--hidden: the traced hidden size (default: capture.json, else the width of the trace's embedding tables)."),
    kernel_models: list[Path] | None = typer.Option(None, "--kernel-models", help="A `trainsim fit` .npz artifact answering the resize what-ifs (--batch, --seq-len, --hidden) before the shipped calibrations (repeatable): of this CPU for a CPU trace, of the trace's GPU for a GPU trace."),
    segments: bool = typer.Option(False, "--segments", help="Show every critical-path segment, in path order (table: one row each; JSON: critical_path.path)."),
) -> None:  # fmt: skip
    """Simulate the traced step (critical path over CPU threads, streams and ranks)."""
    from trainsim.errors import ConfigError, UsageError
    from trainsim.host.overheads import OverheadDB
    from trainsim.sim import SimOptions
    from trainsim.sim.replay import kernel_counts, replay_paths

    timeline_target(timeline, paths)
    from trainsim.cli.usage import usage
    from trainsim.ingest.iterations import check_step_selector

    with usage():
        check_step_selector(step)
    # what-if arguments checked before the (long) load and simulation
    if straggler is not None:
        _straggler_rank(straggler)
    if family is not None:
        _family(family)
    if network is not None:
        _factor(network, "--network-speedup")
    for flag, v in (("--batch", batch), ("--old-batch", old_batch), ("--seq-len", seq_len), ("--old-seq-len", old_seq_len),
                    ("--hidden", hidden), ("--old-hidden", old_hidden)):  # fmt: skip
        if v is not None and v < 1:
            raise UsageError(f"{flag} must be a positive integer, got {v}")
    if old_batch is not None and batch is None:
        raise UsageError("--old-batch is the traced batch of the --batch what-if; give --batch too")
    if old_seq_len is not None and seq_len is None:
        raise UsageError("--old-seq-len is the traced length of the --seq-len what-if; give --seq-len too")
    if old_hidden is not None and hidden is None:
        raise UsageError("--old-hidden is the traced hidden size of the --hidden what-if; give --hidden too")
    if scale_heads and hidden is None:
        raise UsageError("--scale-heads chooses how the --hidden what-if grows the attention; give --hidden too")
    asked = [f for f, v in (("--batch", batch), ("--seq-len", seq_len), ("--hidden", hidden)) if v is not None]
    if len(asked) > 1:
        raise UsageError(f"{' and '.join(asked)}: one resize at a time")
    if overheads is None:
        overheads = HostMode.SHARED if overhead_db is not None else HostMode.STATS
    if stats_iqr and (overheads is not HostMode.STATS or overhead_db is not None):
        raise UsageError("--stats-iqr applies to --overheads stats without --overhead-db")
    if overheads is HostMode.SHARED and overhead_db is None:
        raise UsageError(
            "--overheads shared needs --overhead-db FILE (write one with `trainsim analyze --overhead-db`)"
        )
    if overhead_db is not None and overheads is not HostMode.SHARED:
        raise UsageError(f"--overhead-db is read by --overheads shared, not {overheads.value}")
    if system is not None and kernels is not KernelSource.MODEL:
        raise UsageError("--system chooses the collective models of --kernels model")
    for p in paths:  # before the what-ifs read what lies beside them (a missing trace is the error)
        if not Path(p).exists():
            raise ConfigError(f"{p}: no such file or folder")
    recorded = _manifest_batch(paths, strict=old_batch is None) if batch is not None else None
    if old_batch is not None and recorded is not None and old_batch != recorded:
        stderr.print(f"[yellow]warning:[/] --old-batch {old_batch} differs from the batch capture.json records "
                     f"({recorded}): resizing from {old_batch}, every dimension equal to it")  # fmt: skip
    traced_batch = (old_batch or recorded) if batch is not None else None
    if batch is not None and traced_batch is None:
        raise ConfigError("--batch: which batch was traced? give --old-batch (no capture.json beside the trace says)")
    traced_seq = (old_seq_len or _manifest_field(paths, "seq_len")) if seq_len is not None else None  # strict: no --old-seq-len
    if seq_len is not None and traced_seq is None:
        raise ConfigError("--seq-len: which length was traced? give --old-seq-len (no capture.json beside the trace "
                          "records a sequence length: none there, not a sequence model, or captured before 2026-11-27)")
    if seq_len is not None and (longest := _example_max_seq(paths)) is not None and seq_len > longest[1]:
        stderr.print(f"[yellow]warning:[/] --seq-len {seq_len}: the captured {longest[0]} example takes at most "
                     f"{longest[1]} tokens (its learned positions); resized anyway, as a model with a longer "
                     "position table would run")  # fmt: skip
    db = OverheadDB.load(overhead_db) if overhead_db is not None else None
    options = SimOptions(kernels=kernels, overheads=overheads, overhead_db=db,
                         intra_rank_sync=not no_intra_rank_sync, stats_iqr=stats_iqr, system=system)  # fmt: skip
    user_models = _user_kernel_models(kernel_models)
    if user_models and batch is None and seq_len is None and hidden is None:
        stderr.print("[yellow]warning:[/] --kernel-models answers the resize what-ifs (--batch, --seq-len, "
                     "--hidden); this replay has none, so they are not used")  # fmt: skip
    with stderr.status("loading and simulating...", spinner="dots"):
        rep = replay_paths(paths, options, step=_step(step), link_et=not no_et)
        whatif = _whatifs(rep, options, straggler=straggler, network=network, family=family, user_models=user_models,
                          resize=(traced_batch, batch) if batch is not None and traced_batch else None,
                          resize_seq=(traced_seq, seq_len, _manifest_batch(paths, strict=False)) if seq_len is not None and traced_seq else None,
                          resize_hidden=(old_hidden or _manifest_field(paths, "hidden"), hidden, scale_heads) if hidden is not None else None)  # fmt: skip
    if timeline is not None:  # after the what-ifs: a refused one leaves no file behind
        from trainsim.sim.timeline import write_timeline

        write_timeline(rep.result, timeline)
    doc = rep.to_dict(segments=segments)
    doc["whatif"] = whatif
    if timeline is not None:
        stderr.print(f"wrote timeline: {timeline}")
    modelled, fallback = kernel_counts(rep.result.diagnostics)
    if fallback:
        what = (f"none of the {fallback} kernels had an applicable model (device {doc['device'] or 'unknown'}): "
                "every one kept its measured duration, so this is the measured-kernel replay"
                if not modelled else
                f"{fallback} of {fallback + modelled} kernels had no applicable model and kept their measured duration")  # fmt: skip
        stderr.print(f"[yellow]warning:[/] {what}")
    resized = (whatif.get("resize") or {}) if whatif else {}
    if resized.get("warning"):
        stderr.print(f"[yellow]warning:[/] {resized['warning']}")
    cs = doc["collective_system"]
    if cs is not None:
        stderr.print(
            f"collectives: comm models of system {cs['name']} ({cs['source']}; --system to choose)"
        )
        if cs.get("note"):  # an edited YAML copy of a catalog system (as predict notes it)
            stderr.print(f"note: {cs['note']}")
    if rep.sampled:
        stderr.print(
            "[yellow]warning:[/] a sampled trace (a fraction of its events recorded): the step is incomplete"
        )
    from trainsim.ingest.link import low_link_warnings, pid_mismatch_warnings
    from trainsim.ingest.multirank import skipped_note

    for line in [*rep.notes, *pid_mismatch_warnings(doc.get("et_link") or {}), *low_link_warnings(doc.get("et_link") or {})]:
        stderr.print(f"[yellow]warning:[/] {line}")
    skipped = skipped_note(rep.skipped)
    if skipped:  # as `analyze` notes it
        stderr.print(f"note: {skipped}")
    if (doc.get("collectives_matched") or {}).get("peers_missing"):
        # as `analyze` notes it; the simulator lets an absent peer arrive on time (docs/simulator.md)
        stderr.print("note: some collective peers are not among the input traces: they are taken to arrive on "
                     "time, so waits for them are not predicted")  # fmt: skip
    if fmt is Format.JSON:
        emit_json(doc)
        return
    _print_table(doc, rep, segments=segments)


def _manifest_batch(paths: list[Path], *, strict: bool = True) -> int | None:
    """The per-rank batch a ``trainsim capture`` folder records (the folder given, or the one
    holding the first trace file), else None."""
    return _manifest_field(paths, "batch_size", strict=strict)


def _manifest(paths: list[Path]) -> dict[str, Any]:
    """What a ``trainsim capture`` folder's capture.json records (the folder given, or the one
    holding the first trace file), or what a saved workload IR kept of it (``analyze
    --save-workload`` of a capture: ``metadata.capture``); {} when there is none."""
    import json

    from trainsim.analyze.report import _capture_manifest
    from trainsim.sim.replay import _is_workload_ir

    if len(paths) == 1 and _is_workload_ir(paths[0]):  # its own record, not a capture.json beside it
        try:
            got = json.loads(paths[0].read_text(encoding="utf-8")).get("metadata", {}).get("capture")
        except (OSError, ValueError, AttributeError):
            return {}
        return got if isinstance(got, dict) else {}
    return _capture_manifest(paths)


def _manifest_field(paths: list[Path], key: str, *, strict: bool = True) -> int | None:
    """A positive integer a ``trainsim capture`` folder's capture.json records (None where it
    records none); any other value is an error naming the file and key (a what-if would have
    resized from it), or None when not ``strict`` (the user gave the traced value)."""
    from trainsim.errors import ConfigError
    from trainsim.sim.replay import _is_workload_ir

    v = _manifest(paths).get(key)
    if v is None:
        return None
    if not isinstance(v, bool) and isinstance(v, int | float) and v >= 1 and float(v).is_integer():
        return int(v)
    if not strict:
        return None
    if len(paths) == 1 and _is_workload_ir(paths[0]):
        where = f"{paths[0]}: metadata.capture.{key}"
    else:
        from trainsim.capture.manifest import MANIFEST_NAME

        first = paths[0]
        where = f"{(first if first.is_dir() else first.parent) / MANIFEST_NAME}: {key}"
    raise ConfigError(f"{where} must be a positive integer, got {v!r} (fix or remove it, or give the traced value "
                      "with --old-batch/--old-seq-len/--old-hidden)")  # fmt: skip


def _example_max_seq(paths: list[Path]) -> tuple[str, int] | None:
    """(example, the longest sequence it takes) of a ``trainsim capture`` of a shipped example
    with learned positions, else None."""
    from trainsim.capture.examples import example_info
    from trainsim.errors import CaptureError

    name = str(_manifest(paths).get("model"))
    try:
        longest = example_info(name).max_seq_len
    except CaptureError:  # not a shipped example (or no capture.json): nothing to say
        return None
    return (name, longest) if longest is not None else None


def _user_kernel_models(paths: list[Path] | None) -> tuple[tuple[Path, Any], ...]:
    """``--kernel-models`` loaded (numbers and JSON only), each with its path."""
    if not paths:  # the kernel-model package is not imported by a replay that names none
        return ()
    from trainsim.kernels import load_model

    return tuple((p, load_model(p)) for p in paths or ())


def _resize_timer(w: Any, user: tuple[tuple[Path, Any], ...] = ()) -> tuple[Any, str]:
    """Kernel-model answers for resizing ``w``: ``user`` artifacts first (``--kernel-models``),
    then the shipped calibration of its GPU (H100) or of this host's CPU (a CPU trace), else its
    catalog device's models; None (work ratios) when the trace names no known device."""
    from trainsim.builders.dlrm import Coster
    from trainsim.errors import ConfigError
    from trainsim.hardware import find_device
    from trainsim.validate.gpu_e2e_suite import default_cache_dir, gpu_kernel_models, resize_timer
    from trainsim.validate.shard_suite import cpu_device_file, cpu_kernel_models

    gpu = next((r.device for r in w.ranks if r.device), "")
    cpu_trace = not gpu and not any(not k.family.is_communication for r in w.ranks for o in r.ops for k in o.kernels)
    spec = find_device(gpu) if gpu else None
    if gpu and spec is None:  # a GPU the catalog lacks: the user's artifact may name it (alias)
        spec = next((m.spec for _, m in user if getattr(m, "spec", None) is not None
                     and gpu in (m.spec.name, *m.spec.aliases, (getattr(m, "provenance_info", None) or {}).get("device_as_measured"))), None)  # fmt: skip
    for p, m in user:  # a CPU trace takes CPU artifacts, a GPU trace those of its GPU's architecture
        fitted_on = getattr(m, "spec", None) or find_device(m.device)
        on_gpu = fitted_on is not None and fitted_on.sm_count is not None
        if cpu_trace and on_gpu:
            raise ConfigError(f"--kernel-models {p}: fitted on {m.device}, a GPU; this is a CPU trace")
        if not cpu_trace and (spec is None or not on_gpu or fitted_on.architecture != spec.architecture):  # type: ignore[union-attr]
            raise ConfigError(f"--kernel-models {p}: fitted on {m.device}, but the trace ran on {gpu or 'an unnamed device'}")
    mine = [m for _, m in user]
    named = f"{', '.join(p.name for p, _ in user)}, then " if user else ""
    calibration = gpu_kernel_models(gpu) if gpu else None
    if calibration is not None:
        device_file, artifact, note = calibration
        return resize_timer(device_file, artifact, mine), named + note
    # a CPU trace: no device kernels (gloo collectives are recorded as communication "kernels")
    if cpu_trace:
        artifact, note = cpu_kernel_models(default_cache_dir().parent, log=log)
        return Coster(str(cpu_device_file()), [*mine, *([artifact] if artifact is not None else [])]).time, named + note
    if spec is not None:
        return Coster(spec, mine or None).time, (f"{named}the catalog models of {spec.name} (calibrated where "
                                                  "shipped, else spec-based)")  # fmt: skip
    return None, f"no kernel models for device {gpu or '(unnamed)'}: each op scaled by its work"


def _whatifs(rep: Any, options: Any, *, straggler: str | None, network: float | None, family: str | None,
             user_models: tuple[tuple[Path, Any], ...] = (),
             resize: tuple[int, int] | None = None, resize_seq: tuple[int, int, int | None] | None = None,
             resize_hidden: tuple[int | None, int, bool] | None = None) -> dict[str, Any]:  # fmt: skip
    from trainsim.errors import ConfigError
    from trainsim.sim import simulate, whatif

    w = rep.workload
    applied: list[str] = []
    if resize is not None:
        from trainsim.sim.resize import resize_batch

        timer, note = _resize_timer(w, user_models)
        w = resize_batch(w, resize[1], old_batch=resize[0], timer=timer)
        applied.append(f"batch {resize[0]} → {resize[1]} (kernel models: {note})")
    if resize_seq is not None:
        from trainsim.sim.resize import resize_seq as resize_sequence

        timer, note = _resize_timer(w, user_models)
        w = resize_sequence(w, resize_seq[1], old_seq=resize_seq[0], batch=resize_seq[2], timer=timer)
        applied.append(f"sequence {resize_seq[0]} → {resize_seq[1]} tokens (kernel models: {note})")
    if resize_hidden is not None:
        from trainsim.sim.resize import resize_hidden as resize_width

        timer, note = _resize_timer(w, user_models)
        w = resize_width(w, resize_hidden[1], old_hidden=resize_hidden[0], timer=timer, scale_heads=resize_hidden[2])
        heads = w.metadata["resize"]["heads"]
        how = ("heads " + ", ".join(f"{a} → {b}" for a, b in heads.items())) if isinstance(heads, dict) else "heads kept"
        applied.append(f"hidden {w.metadata['resize']['old_hidden']} → {resize_hidden[1]}, {how} (kernel models: {note})")
    if straggler is not None:
        r, f = _straggler_rank(straggler)
        if r not in {g.rank for g in w.ranks}:
            raise ConfigError(f"--straggler: rank {r} is not in the trace (ranks {', '.join(str(g.rank) for g in w.ranks)})")
        target = next(g for g in w.ranks if g.rank == r)
        if not any(not k.family.is_communication for op in target.ops for k in op.kernels):
            stderr.print(f"[yellow]warning:[/] --straggler: rank {r} has no device compute kernels (a CPU trace: "
                         "its CPU ops are not scaled): nothing was slowed")  # fmt: skip
        w = whatif.straggler(w, r, f)
        applied.append(f"rank {r} kernels ×{f:g}")
    if network is not None:
        colls = [k for g in w.ranks for op in g.ops for k in op.kernels if k.collective is not None]
        if not colls:
            stderr.print("[yellow]warning:[/] --network-speedup: the trace has no collectives: nothing was scaled")
        elif options.overheads.value == "trace" and all(k.on_host for k in colls):
            stderr.print("[yellow]warning:[/] --network-speedup with --overheads trace: gloo bucket records replay "
                         "their measured spans there, so a faster network barely reaches the step; use the "
                         "default --overheads stats")  # fmt: skip
        w = whatif.faster_network(w, network)
        applied.append(f"network ×{network:g} faster" if network >= 1 else f"network at ×{network:g} speed (slower)")
    if family is not None:
        fam, f = _family(family)
        n = sum(k.family is fam for r in w.ranks for op in r.ops for k in op.kernels)
        if not n:
            stderr.print(f"[yellow]warning:[/] --scale-family: the trace has no {fam.value} kernels: nothing was scaled")
        w = whatif.scale_family(w, fam, f)
        applied.append(f"{fam.value} kernels ×{f:g} ({n} kernels)")
    if not applied:
        return {}
    res = simulate(w, options)
    base = rep.result.predicted_step_s
    out = {"applied": applied, "predicted_step_s": res.predicted_step_s,
           "change_pct": 100.0 * (res.predicted_step_s - base) / base if base > 0 else None,
           "critical_path_by_kind_s": res.critical_path_by_kind()}  # fmt: skip
    if resize is not None or resize_seq is not None or resize_hidden is not None:
        out["resize"] = _resize_report(w.metadata["resize"])
    return out


# below this share of kernel time in ops with shapes, a resize mostly keeps the traced times
RESIZE_SHAPED_MIN = 0.5


def _resize_report(meta: dict[str, Any]) -> dict[str, Any]:
    """The resize's rule counts, and a warning when ops with recorded shapes hold little of the
    traced kernel time (the rest is re-predicted as weight-sized, unchanged)."""
    share = meta.get("shaped_time_fraction")
    out = {"rules": meta.get("rules", {}), "shaped_time_fraction": share}
    if "widths" in meta:  # --hidden: the traced and new hidden size, every width and what it became
        out.update(old_hidden=meta["old_hidden"], new_hidden=meta["new_hidden"], widths=meta["widths"],
                   heads=meta["heads"])
    warnings = []
    if share is not None and share < RESIZE_SHAPED_MIN:
        warnings.append(f"ops with recorded tensor shapes hold only {100 * share:.0f} % of the traced kernel time: "
                        "the rest was kept as it was traced (record shapes, or link the execution trace)")  # fmt: skip
    kept = meta.get("collectives_kept") or 0
    out["collectives_kept"] = kept
    if kept:
        kinds = ", ".join(f"{k} {n}" for k, n in (meta.get("collectives_kept_kinds") or {}).items())
        warnings.append(f"{kept} collective op{'s' if kept > 1 else ''} (all ranks{': ' + kinds if kinds else ''}) kept "
                        "their traced times: no payload shape was recorded for them (e.g. a backward all_to_all); "
                        "where the payload grows with the resized dimension the prediction is low")  # fmt: skip
    if warnings:
        out["warning"] = "; ".join(warnings)
    return out


def _straggler_rank(text: str) -> tuple[int, float]:
    from trainsim.errors import UsageError

    r, f = _pair(text, "--straggler", "RANK:FACTOR (e.g. 3:1.5)")
    if not r.isdigit():
        raise UsageError(f"--straggler: {r!r} is not a rank number")
    return int(r), f


def _family(text: str) -> tuple[Any, float]:
    from trainsim.errors import UsageError
    from trainsim.ir.kinds import KernelFamily

    name, f = _pair(text, "--scale-family")
    try:
        return KernelFamily(name), f
    except ValueError:
        known = ", ".join(k.value for k in KernelFamily)
        raise UsageError(f"--scale-family: unknown family {name!r}; known: {known}") from None


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x * 1e3:.3f}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:+.2f}"


CPU_ONLY_NOTE = (
    "[yellow]note:[/] no device kernels in this trace (a CPU-only capture): the whole step is CPU op "
    "time, shown as host time (host_gap) on the CPU threads; `trainsim replay TRACE --batch N` predicts "
    "a CPU capture at another batch with this host's CPU kernel models (docs/capture.md)"
)


def _print_table(doc: dict[str, Any], rep: Any, *, segments: bool = False) -> None:
    from rich.console import Console

    out = Console(width=None if sys.stdout.isatty() else 120)
    o = doc["options"]
    out.print(
        f"[bold]{len(doc['ranks'])} rank graph(s)[/]  device: {doc['device'] or 'unknown'}  "
        f"kernels: {o['kernels']}  host gaps: {o['overheads']}"
    )
    # no device kernels (gloo collectives run on CPU threads: they are not device work)
    cpu_only = bool(rep.workload.ranks) and all(r.cpu_only for r in rep.workload.ranks)
    out.print(
        f"measured step [bold]{_ms(doc['measured_step_s'])} ms[/]   predicted [bold]{_ms(doc['predicted_step_s'])} ms[/] "
        f"({_pct(doc['error_pct'])} %)"
        + ("" if cpu_only else f"   kernel-sum baseline {_ms(doc['kernel_sum_baseline_s'])} ms "
                               f"({_pct(doc['baseline_error_pct'])} %)")
    )  # fmt: skip
    if cpu_only:
        stderr.print(CPU_ONLY_NOTE)
    if o["kernels"] != "measured":  # which kernel times are a model's, and which kind (DESIGN)
        out.print(f"provenance: {doc['provenance']}")
    t = Table(title="Per rank (ms)", title_justify="left")
    for col in (
        "rank",
        "measured",
        "predicted",
        "err %",
        "busy",
        "idle",
        "exp.comm",
        "coll.wait",
        "busiest stream",
    ):
        t.add_column(col, justify="right")
    for r in doc["ranks"]:
        streams = r["streams"]
        top = max(streams, key=lambda s: streams[s]["busy_s"], default=None)
        t.add_row(
            str(r["rank"]) + (f" ×{r['represents']}" if r["represents"] > 1 else ""),
            _ms(r["measured_step_s"]), _ms(r["predicted_step_s"]), _pct(r["error_pct"]),
            _ms(None if r.get("cpu_only") else r["device_busy_s"]), _ms(r["idle_s"]), _ms(r["exposed_comm_s"]),
            _ms(r["collective_wait_s"]),
            f"{top}: {_ms(streams[top]['busy_s'])}" if top is not None else "—",
        )  # fmt: skip
    out.print(t)
    by_kind = doc["critical_path"]["by_kind_s"]
    step = doc["predicted_step_s"] or 1.0
    parts = [f"{k} {_ms(v)} ({100 * v / step:.0f}%)" for k, v in by_kind.items() if v > 0]
    out.print("critical path (ms): " + ", ".join(parts))
    top = sorted(rep.result.critical_path, key=lambda s: s.duration_s, reverse=True)[:8]
    for s in top:
        out.print(
            f"  {s.kind.value:15s} rank {s.rank:<4d} {_ms(s.duration_s):>9s} ms  {s.label[:70]}"
        )
    if segments:
        out.print(_segment_table(doc["critical_path"]["path"], out.width))
    if doc["whatif"]:
        w = doc["whatif"]
        out.print(
            f"what-if ({'; '.join(w['applied'])}): {_ms(w['predicted_step_s'])} ms "
            f"({_pct(w['change_pct'])} % against the replayed step)"
        )


def _segment_table(path: list[dict[str, Any]], width: int) -> Table:
    """``--segments``: the critical path's segments in path order, one compact row each (the
    JSON's ``critical_path.path``), the numbers whole and a label cut to the ``width`` they
    leave."""
    from rich import box

    rows = [(str(i), _ms(s["start_s"]), _ms(s["duration_s"]), s["kind"], str(s["rank"])) for i, s in enumerate(path, 1)]
    heads = ("#", "start", "ms", "kind", "rank")
    widths = [max([len(h), *(len(r[c]) for r in rows)]) for c, h in enumerate(heads)]
    t = Table(title=f"Critical path: {len(path)} segments (ms)", title_justify="left", box=box.SIMPLE_HEAD,
              padding=(0, 1), pad_edge=False, collapse_padding=True)  # fmt: skip
    for h, w in zip(heads, widths, strict=True):
        t.add_column(h, justify="left" if h == "kind" else "right", no_wrap=True, width=w)
    label_w = max(16, width - sum(widths) - 2 * len(heads) - 1)
    t.add_column("label", overflow="ellipsis", no_wrap=True, max_width=label_w)
    for r, s in zip(rows, path, strict=True):
        t.add_row(*r, escape(s["label"]))
    return t
