"""``trainsim shard SPEC``: rank DLRM embedding-table sharders by predicted step time (000 §V-A).

SPEC is a JSON or YAML file (docs/sharding.md)::

    {"batch": 4096, "dense_features": 13, "bottom_mlp": [512, 256, 64], "top_mlp": [512, 256, 1],
     "dtype": "fp32", "interaction": "auto",
     "tables": [{"name": "t0", "rows": 100000, "dim": 64, "pooling": 2.5,
                 "reuse": [0.342, 0.144, 0.149, ...]}, ...]}

Only ``batch`` and ``tables`` (each with ``rows``, ``dim``, ``pooling``) are required.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from trainsim.cli.main import app
from trainsim.cli.output import Format, emit_json, stderr


@app.command("shard")
def shard(
    spec_file: Path = typer.Argument(..., metavar="SPEC", help="DLRM spec: JSON or YAML with batch and tables (docs/sharding.md)."),
    world: int = typer.Option(8, "--world", help="Ranks (GPUs, or CPU processes) the tables are sharded over."),
    device: str | None = typer.Option(None, "--device", help="Catalog device or device YAML (e.g. a `trainsim bench` CPU device file); default: the system's."),
    system: str | None = typer.Option(None, "--system", help="Catalog system or YAML whose comm models time the collectives; default: the device's catalog system, else a host-local estimate."),
    kernel_models: Path | None = typer.Option(None, "--kernel-models", help="A `trainsim fit` .npz artifact answering before the device's own kernel models."),
    capacity_gb: float | None = typer.Option(None, "--capacity-gb", help="Cap on table memory per rank (GB, 1e9 bytes); sharders that break it are listed as infeasible."),
    sharders: str | None = typer.Option(None, "--sharders", help="Comma-separated subset (default: all)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random sharder."),
    tbe: bool | None = typer.Option(None, "--tbe/--no-tbe", help="Tables as one FBGEMM TBE op per pass with the SGD update fused (default: on GPUs; CPUs: one EmbeddingBag per table + sparse SGD update)."),
    fmt: Format = typer.Option(Format.TABLE, "--format", help="table or json (JSON goes to stdout alone)."),
) -> None:  # fmt: skip
    """Predict the DLRM step under every sharder of 000 Table III (plus predicted_greedy) and rank them."""
    from trainsim.builders.dlrm import load_dlrm_spec, resolve_device
    from trainsim.errors import ConfigError
    from trainsim.hardware import get_system
    from trainsim.search.sharders import select_sharder

    spec = load_dlrm_spec(spec_file)
    if device is None and system is None:
        raise ConfigError("give --device (catalog name or device YAML) or --system")
    if world < 1:
        raise ConfigError(f"--world must be >= 1, got {world}")
    dev = resolve_device(device if device is not None else get_system(system).device)  # type: ignore[arg-type]
    names = [s.strip() for s in sharders.split(",") if s.strip()] if sharders else None
    cap = capacity_gb * 1e9 if capacity_gb is not None else None
    res = select_sharder(spec, world, device=dev, system=system, capacity_bytes=cap, kernel_models=kernel_models,
                         sharders=names, seed=seed, tbe=tbe)  # fmt: skip
    best = res[0]
    doc = {"spec": str(spec_file), "world": world, "device": dev.name, "comm": best["comm"],
           "tables": len(spec.tables), "batch": spec.batch, "sharders": res, "best": best["name"]}  # fmt: skip
    if fmt is Format.JSON:
        emit_json(doc)
        return
    t = Table(
        title=f"{len(spec.tables)} tables, batch {spec.batch}, {world}× {dev.name} ({best['comm']})"
    )
    for col in ("sharder", "predicted step", "vs best", "lookup imbalance", "tables per rank"):
        t.add_column(col, justify="left" if col == "sharder" else "right")
    for r in res:
        if r["predicted_step_s"] is None:
            t.add_row(r["name"], "infeasible", "", "", r["error"][:60])
            continue
        per = [r["assignment"].count(k) for k in range(world)]
        t.add_row(r["name"], f"{r['predicted_step_s'] * 1e3:,.3f} ms",
                  f"{(r['predicted_step_s'] / best['predicted_step_s'] - 1) * 100:+.1f} %",
                  f"{r['imbalance']:.2f}", " ".join(map(str, per)))  # fmt: skip
    from rich.console import Console

    Console().print(t)
    prov = best["provenance"]
    if any(k.startswith("spec-based") for k in prov):
        stderr.print(
            "[yellow]note:[/] some kernels are spec-based (datasheet or probed peaks): optimistic lower bounds"
        )
    if any(k.startswith("estimate:") for k in prov):
        stderr.print(
            "[yellow]note:[/] collectives use the host-local estimate; give --system for a modelled network"
        )
