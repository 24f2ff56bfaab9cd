"""``trainsim fit-comm DATASET…`` and ``trainsim hw list|show NAME``."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from trainsim.cli.main import app
from trainsim.cli.output import (
    Format,
    emit_json,
    json_target,
    log,
    not_an_input,
    searchable_output,
    writable_path,
)

hw_app = typer.Typer(name="hw", help="Hardware catalog: devices and systems.", no_args_is_help=True)
app.add_typer(hw_app, name="hw")


def _out() -> Console:
    return Console(width=None if sys.stdout.isatty() else 120)


@app.command("fit-comm")
def fit_comm_cmd(
    datasets: list[Path] = typer.Argument(
        ...,
        metavar="DATASET",
        help="nccl-tests logs, paper-001 NCCL CSVs, vTrain LUTs, `trainsim bench comm` JSONL, or folders of them.",
    ),
    fmt: Format = typer.Option(
        Format.TABLE, "--format", help="table or json (JSON goes to stdout alone)."
    ),
    system: str | None = typer.Option(
        None,
        help="Catalog system (or YAML) the data were measured on; guessed from paths/device if omitted.",
    ),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Write the fitted model (JSON artifact) here."
    ),
    holdout: float = typer.Option(
        0.25,
        help="Fraction of distinct message sizes held out per case to choose the curve family.",
    ),
    seed: int = typer.Option(0, min=0, help="Seed of the held-out split."),
    kind: str | None = typer.Option(
        None, help="Collective measured, when a log does not say (all_reduce, all_gather, ...)."
    ),
    timing: str = typer.Option(
        "min", help="nccl-tests time column: min (of out-of-place and in-place) or out-of-place."
    ),
    name: str | None = typer.Option(
        None, help="Dataset name used in provenance (default: the folder name)."
    ),
) -> None:
    """Fit collective models on measurements; print each case's held-out error."""
    from trainsim.cli.usage import fraction, one_of, usage
    from trainsim.comm import fit_comm, guess_system, read_comm_dataset, save_model
    from trainsim.comm.model import canonical_kind
    from trainsim.errors import ConfigError, UsageError
    from trainsim.hardware import get_device, get_system

    fraction(holdout, "--holdout")
    one_of(timing, ("min", "out-of-place"), "--timing")
    if kind:
        with usage():
            canonical_kind(kind)
    if output is not None:  # before the fit: a wrong path should not cost the fitting time
        searchable_output(output, "--output")
        if output.is_dir():
            raise ConfigError(f"--output {output}: is a folder; give a file path (e.g. {output / 'comm.json'})")
        if output.suffix != ".json":
            raise UsageError(f"--output {output}: collective model artifacts are .json files")
        not_an_input(output, datasets, "--output")
        json_target(output, "--output", "comm model")  # a previous fit's artifact only
        # a folder that takes no file: refused before the fit; its folder is made when it is written
        # (made here, a failed or interrupted fit left it behind empty)
        writable_path(output, "--output")
    ds = read_comm_dataset(
        datasets, name=name, timing=timing, kind=canonical_kind(kind) if kind else None
    )
    for w in ds.warnings:
        log(f"warning: {w}")
    spec = get_system(system) if system else guess_system(ds)
    if system and spec is not None and get_device(spec.device).sm_count is not None and any(
            x.series == "gloo" for x in ds.samples):  # fmt: skip
        raise ConfigError(f"--system {spec.name} is a GPU system ({spec.device}), and {ds.name}'s rows were measured "
                          f"with gloo between CPU processes ({ds.device or 'a CPU'}): they time host collectives, "
                          "not this system's links; drop --system (or fit NCCL measurements of that system)")  # fmt: skip
    if system and spec is not None and ds.device:
        from trainsim.hardware import find_device

        stated = find_device(ds.device)
        if stated is not None and not stated.is_sibling_of(get_device(spec.device)):
            raise ConfigError(f"--system {spec.name} ({spec.device}) contradicts the data: {ds.name} was measured "
                              f"on {ds.device}; drop --system or give a system of that device")  # fmt: skip
    log(
        f"{len(ds)} rows, {len(ds.cases())} case(s) from {ds.name}; system: {spec.name if spec else 'unknown (no extrapolation)'}"
    )
    if holdout == 0:
        log("--holdout 0: no sizes are held out, so there is no error to choose a curve family by; "
            "each case takes the first curve that fits (errors print as —, and null in the artifact)")
    result = fit_comm(ds, system=spec, holdout=holdout, seed=seed)
    for x in result.skipped:  # a case left out is said, not dropped silently
        why = (f"{x['implausible_rows']} of its {x['rows']} rows are faster than {spec.name}'s links allow "
               "(another unit than the file says?)" if x["implausible_rows"] and spec else
               f"{x['sizes_left']} distinct size(s) of {x['rows']} rows")  # fmt: skip
        log(f"warning: {x['collective']} {x['nodes']}×{x['gpus_per_node']} not fitted: {why}; "
            "it needs plausible measurements at 3 or more sizes")  # fmt: skip
    if output is not None:
        save_model(result.model, output)
        log(f"wrote {output}")
    doc = _fit_doc(result, ds.name, spec.name if spec else None, output)
    h = doc["hierarchical"] or {}
    low = [f"{t} {h[k]:.3g}" for t, k in (("node", "eff_node"), ("cluster", "eff_cluster"))
           if h.get(k) is not None and h[k] < LOW_EFFICIENCY]  # fmt: skip
    doc["warnings"] = [f"the data reach {', '.join(low)} of the system's link bandwidth: times in another unit than "
                       "the file says (ns as µs?), or another system than the one named?"] if low else []  # fmt: skip
    for w in doc["warnings"]:  # measured links this slow are a unit mix-up more often than a network
        log(f"warning: {w}")
    if fmt is Format.JSON:
        emit_json(doc)
        return
    t = Table(
        title=f"Held-out errors ({holdout:.0%} of sizes per case, seed {seed})",
        title_justify="left",
    )
    for col in (
        "collective",
        "nodes×gpus",
        "curve",
        "GMAE %",
        "MAPE %",
        "samples",
        "dropped",
        "other curves (GMAE %)",
    ):
        t.add_column(
            col,
            justify="left"
            if col in ("collective", "curve", "other curves (GMAE %)")
            else "right",
        )
    for m in doc["models"]:
        others = ", ".join(f"{f} {'—' if g is None or math.isnan(g) else f'{g:.1f}'}"
                           for f, g in m["candidates"].items() if f != m["curve"])
        t.add_row(m["collective"], f"{m['nodes']}×{m['gpus_per_node']}", m["curve"], _pct(m["gmae_pct"]), _pct(m["mape_pct"]),
                  str(m["samples"]), str(m["excluded_samples"]), others)  # fmt: skip
    _out().print(t)
    log("note: a case's error is that of the curve family it chose on these held-out sizes (the choice's own "
        "score, so optimistic); `trainsim validate comm` scores on sizes the choice never saw")  # fmt: skip
    if doc["hierarchical"]:
        h = doc["hierarchical"]
        if max(m["nodes"] for m in doc["models"]) > 1:
            cluster = f"{h['eff_cluster']:.3f}"
        else:  # one node measured: the inter-node efficiency is not fitted (its default stands)
            cluster = f"{h['eff_cluster']:.3f} (not measured: no multi-node case)"
        _out().print(f"hierarchical: bandwidth efficiency node {h['eff_node']:.3f}, cluster {cluster}; "
                     f"latency node {_us(h['latency_node_s'])}, cluster {_us(h['latency_cluster_s'])}")  # fmt: skip



# below this fraction of the catalog's link bandwidth a fit says its data are suspect
LOW_EFFICIENCY = 0.05


def _pct(x: float | None) -> str:
    return "—" if x is None or math.isnan(x) else f"{x:.2f}"


def _us(x: float | None) -> str:
    from trainsim.comm.fitting import at_latency_grid_bound

    if x is None:
        return "catalog"
    if at_latency_grid_bound(x):
        return f"{x * 1e6:.2f} µs (fitted at the search grid's bound: these data do not pin it)"
    return f"{x * 1e6:.2f} µs (fitted)"


def _fit_doc(result: Any, dataset: str, system: str | None, output: Path | None) -> dict[str, Any]:
    models = [
        # the CLI contract's fit keys as `trainsim fit` fills them: family = what is timed (the
        # collective), kind = the model kind (the curve family chosen); also named plainly
        {"family": c.key.kind.value, "kind": c.family, "collective": c.key.kind.value, "curve": c.family,
         "nodes": c.key.nodes, "gpus_per_node": c.key.gpus_per_node,
         "group_size": c.key.group_size, "gmae_pct": c.heldout_gmae_pct, "mape_pct": c.heldout_mape_pct,
         "samples": c.samples, "excluded_samples": c.excluded_samples, "candidates": c.candidates}
        for c in result.cases
    ]  # fmt: skip
    hier = result.model.to_dict()["hierarchical"]
    return {"dataset": dataset, "system": system, "models": models, "not_fitted": list(result.skipped),
            "hierarchical": hier, "artifact": str(output) if output else None}  # fmt: skip


@hw_app.command("list")
def hw_list(fmt: Format = typer.Option(Format.TABLE, "--format", help="table or json (JSON goes to stdout alone).")) -> None:
    """List catalog devices and systems."""
    from trainsim.hardware import list_devices, list_systems

    devices, systems = list_devices(), list_systems()
    if fmt is Format.JSON:
        emit_json({
            "devices": [{"name": d.name, "aliases": list(d.aliases), "memory_GB": d.memory_GB,
                         "memory_bandwidth_GBps": d.memory_bandwidth_GBps, "bf16_tflops": d.peak_tflops.bf16, "fp32_tflops": d.peak_tflops.fp32}
                        for d in devices],
            "systems": [{"name": s.name, "device": s.device, "gpus_per_node": s.gpus_per_node,
                         "tiers": [t.name for t in s.tiers]} for s in systems],
        })  # fmt: skip
        return
    td = Table(title="Devices", title_justify="left")
    for col in ("name", "memory GB", "HBM GB/s", "BF16 TFLOP/s", "FP32 TFLOP/s"):
        td.add_column(col, justify="left" if col == "name" else "right")
    for d in devices:
        td.add_row(
            d.name,
            f"{d.memory_GB:g}",
            f"{d.memory_bandwidth_GBps:g}",
            _opt(d.peak_tflops.bf16),
            f"{d.peak_tflops.fp32:g}",
        )
    ts = Table(title="Systems", title_justify="left")
    for col in ("name", "device", "GPUs/node", "tiers (GB/s per GPU, µs per step)"):
        ts.add_column(col, justify="right" if col == "GPUs/node" else "left")
    for s in systems:
        tiers = "; ".join(
            f"{t.name} {t.bandwidth_per_gpu_GBps:g}, {t.latency_us:g}" for t in s.tiers
        )
        ts.add_row(s.name, s.device, str(s.gpus_per_node), tiers)
    out = _out()
    out.print(td)
    out.print(ts)


def _opt(x: float | None) -> str:
    return "—" if x is None else f"{x:g}"


_SYSTEM_KEYS = frozenset({"tiers", "gpus_per_node", "device", "max_nodes"})


def _looks_like_system(path: Path) -> bool:
    """A hardware file that names a system's fields (tiers, GPUs per node, its device) is a
    system; anything else is read as a device (safe YAML: no code runs)."""
    import yaml

    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8", errors="replace"))
    except yaml.YAMLError:
        return False
    return isinstance(doc, dict) and bool(_SYSTEM_KEYS & set(map(str, doc)))


def _edit_notes(spec: Any) -> list[str]:
    """What predict would say about a YAML copy of a catalog device or system that keeps its
    name but edits it: kernel answers carried to the edited roofline, comm models set aside."""
    from trainsim.comm.registry import shadowed_note
    from trainsim.hardware import DeviceSpec, SystemSpec, get_device
    from trainsim.kernels.rescaled import rescaled_note

    if isinstance(spec, SystemSpec):
        found = [shadowed_note(spec), rescaled_note(get_device(spec.device))]
    elif isinstance(spec, DeviceSpec):
        found = [rescaled_note(spec)]
    else:  # pragma: no cover - hw show resolves one of the two
        found = []
    return [n for n in found if n]


@hw_app.command("show")
def hw_show(
    name: str = typer.Argument(..., metavar="NAME", help="Device or system name, alias, or YAML path."),
    fmt: Format = typer.Option(Format.TABLE, "--format", help="table or json (JSON goes to stdout alone)."),
) -> None:
    """Show one device or system with its sources."""
    from trainsim.errors import ConfigError
    from trainsim.hardware import get_device, get_system

    spec: Any
    try:
        spec = get_system(name)
    except ConfigError as sys_err:
        try:
            spec = get_device(name)
        except ConfigError as dev_err:
            if Path(name).is_file():  # a file: the error of what it looks like
                if "file is empty" in str(sys_err):  # neither kind: say so, not "a device"
                    raise ConfigError(f"{name}: file is empty; expected a device or system YAML mapping "
                                      "(`trainsim hw show dgx-a100 --format json` shows a system's fields)") from None
                raise (sys_err if _looks_like_system(Path(name)) else dev_err) from None
            if Path(name).is_dir():
                raise ConfigError(f"{name}: is a folder; give a device or system YAML file, or a catalog name") from None
            if Path(name).suffix.lower() in (".yaml", ".yml"):
                raise sys_err from None  # a missing file or a folder: its own one-line error
            from trainsim.hardware import list_devices, list_systems
            from trainsim.hardware.catalog import close_names

            close = close_names(name)
            raise ConfigError(
                f"unknown device or system {name!r}" + (f" (close matches: {', '.join(close)})" if close else "")
                + f"; devices: {', '.join(d.name for d in list_devices())}; "
                f"systems: {', '.join(s.name for s in list_systems())} (or give a YAML file)"
            ) from None
    doc = spec.model_dump(mode="json")
    notes = _edit_notes(spec)
    if fmt is Format.JSON:
        emit_json({**doc, "notes": notes} if notes else doc)
        return
    t = Table(title=spec.name, title_justify="left", show_header=False)
    t.add_column("field")
    t.add_column("value")
    for k, v in doc.items():
        if k in ("sources", "tiers"):
            continue
        t.add_row(k, str(v))
    for tier in doc.get("tiers", []):
        t.add_row(
            f"tier {tier['name']}",
            ", ".join(f"{k}={v}" for k, v in tier.items() if k != "name" and v is not None),
        )
    for src in doc["sources"]:
        t.add_row(
            f"source ({src['kind']})", src["title"] + (f" <{src['url']}>" if src.get("url") else "")
        )
    _out().print(t)
    for n in notes:
        log(f"note: {n}")
