"""``trainsim analyze PATH…``: per-rank breakdown of real traces."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from trainsim.cli.main import app
from trainsim.cli.output import (
    Format,
    distinct_outputs,
    emit_json,
    json_target,
    not_an_input,
    stderr,
    writable_path,
)


@app.command()
def analyze(
    paths: list[Path] = typer.Argument(..., metavar="PATH", help="Kineto traces (.json/.json.gz), archives (.tar.gz) or folders; execution traces among them (given as files, or inside a given folder or archive) are linked."),
    fmt: Format = typer.Option(Format.TABLE, "--format", help="table or json (JSON goes to stdout alone)."),
    step: str = typer.Option("median", help="Which iteration: median (steady state), first, last, or a ProfilerStep number."),
    time_unit: str = typer.Option("auto", help="Trace time unit: auto, us or ns."),
    no_et: bool = typer.Option(False, "--no-et", help="Do not link execution traces."),
    overhead_db: Path | None = typer.Option(None, help="Write the T1–T5 host-overhead database (JSON) here."),
    export_kernels: Path | None = typer.Option(None, help="Write kernel samples here: .csv, .jsonl or .parquet (needs pyarrow)."),
    save_workload: Path | None = typer.Option(None, help="Write the workload IR (JSON) here."),
) -> None:
    """Explain where the time of a real step goes, per rank and stream."""
    from trainsim.analyze.report import analyze_paths
    from trainsim.analyze.samples import SUFFIXES
    from trainsim.cli.usage import usage
    from trainsim.errors import UsageError
    from trainsim.ingest.iterations import check_step_selector

    if time_unit not in ("auto", "us", "ns"):
        raise UsageError(f"--time-unit must be auto, us or ns, got {time_unit!r}")
    with usage():
        check_step_selector(step)
    if export_kernels is not None and export_kernels.suffix.lower() not in SUFFIXES:
        raise UsageError(f"--export-kernels {export_kernels}: kernel samples are written as .csv, .jsonl or .parquet, "
                         f"got {export_kernels.suffix or 'no suffix'!r}")  # fmt: skip
    for out, flag in ((overhead_db, "--overhead-db"), (export_kernels, "--export-kernels"),
                      (save_workload, "--save-workload")):  # fmt: skip
        not_an_input(out, paths, flag)
    distinct_outputs(((overhead_db, "--overhead-db"), (export_kernels, "--export-kernels"),
                      (save_workload, "--save-workload")))  # fmt: skip
    json_target(overhead_db, "--overhead-db", "overhead database")
    json_target(save_workload, "--save-workload", "workload")
    if export_kernels is not None:  # before the analysis: a refused path costs nothing
        from trainsim.analyze.samples import samples_target

        samples_target(export_kernels)
        writable_path(export_kernels, "--export-kernels")
    a = analyze_paths(
        paths, step=step, time_unit=None if time_unit == "auto" else time_unit,
        link_et=not no_et, overhead_db=overhead_db, export_kernels=export_kernels,
        save_workload_to=save_workload,
    )  # fmt: skip
    doc = a.to_dict()
    if fmt is Format.JSON:
        emit_json(doc)
        return
    _print_table(doc)


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x * 1e3:.3f}"


def _print_table(doc: dict) -> None:
    from rich.console import Console

    out = Console(width=None if sys.stdout.isatty() else 120)
    out.print(
        f"[bold]{len(doc['ranks'])} rank(s)[/]  device: {doc['device'] or 'unknown'}  "
        f"measured step: [bold]{_ms(doc['measured_step_s'])} ms[/]"
        + (" (earliest rank start → latest rank end)" if len(doc["ranks"]) > 1 else "")
    )
    t = Table(title="Per-rank breakdown (ms)", title_justify="left")
    for col in ("rank", "step", "busy", "idle", "util%", "exp.comm", "gemm", "emb", "mem",
                "other", "comm", "max stream"):
        t.add_column(col, justify="right")
    for r in doc["ranks"]:
        f = r["families"]
        busy = None if r["cpu_only"] else r["device_busy_s"]  # a CPU rank has no device
        t.add_row(
            str(r["rank"]), _ms(r["step_time_s"]), _ms(busy), _ms(r["idle_s"]),
            "—" if r["gpu_utilization"] is None else f"{100 * r['gpu_utilization']:.1f}", _ms(r["exposed_comm_s"]),
            # device-kernel families: a CPU rank has none (its CPU time is in top_ops), so "—", not 0
            *(("—",) * 4 if r["cpu_only"] else (_ms(f["gemm"]), _ms(f["embedding"]), _ms(f["memory"]),
                                                  _ms(f["elementwise_other"]))),
            _ms(f["communication"]), _ms(r["busiest_stream_s"]),
        )  # fmt: skip
    out.print(t)
    m = doc["collectives_matched"]
    kinds = ", ".join(f"{k} {v.get('matched', 0)}/{v['instances']}" for k, v in m["by_kind"].items())
    note = " (some group members not in the input)" if m["peers_missing"] else ""
    if len(doc["ranks"]) > 1:
        out.print(f"collectives matched across ranks: {m['matched']}/{m['instances']} ({kinds}){note}")
    elif m["instances"]:  # one rank: nothing to match its collectives with
        counts = ", ".join(f"{k} {v['instances']}" for k, v in m["by_kind"].items())
        out.print(f"collectives: {m['instances']} ({counts}; one rank: not matched){note}")
    for p in m["problems"][:5]:
        out.print(f"  [yellow]unmatched:[/] {p}")
    if doc["et_link"]:
        rates = [v.get("link_rate", 0.0) for v in doc["et_link"].values()]
        out.print(f"execution traces linked on {len(rates)} rank(s); link rate min {100 * min(rates):.2f} %")
        from trainsim.ingest.link import low_link_warnings

        for line in low_link_warnings(doc["et_link"]):
            out.print(f"[yellow]warning:[/] {line}")
    cpu_rank = next((r for r in doc["ranks"] if r["cpu_only"]), None)
    if cpu_rank is not None and cpu_rank["top_ops"]:
        parts = [f"{o['op']} {_ms(o['cpu_s'])}" for o in cpu_rank["top_ops"][:5]]
        out.print(f"most CPU time (rank {cpu_rank['rank']}, ms): " + ", ".join(parts))
    ov = doc["ranks"][0]["overheads"] if doc["ranks"] else {}
    if ov:
        parts = [f"{k} {v['mean_s'] * 1e6:.1f} µs" for k, v in ov.items()]
        out.print(f"host overheads (rank {doc['ranks'][0]['rank']}, IQR-filtered means): " + ", ".join(parts))
    for w in doc["warnings"]:
        stderr.print(f"[yellow]note:[/] {escape(w)}")
    for k, v in doc["written"].items():
        stderr.print(f"wrote {k}: {v}")
