"""``trainsim shard SPEC``: rank DLRM embedding-table sharders by predicted step time (000 §V-A).

SPEC is a JSON or YAML file (docs/sharding.md)::

    {"batch": 4096, "dense_features": 13, "bottom_mlp": [512, 256, 64], "top_mlp": [512, 256, 1],
     "dtype": "fp32", "interaction": "auto",
     "tables": [{"name": "t0", "rows": 100000, "dim": 64, "pooling": 2.5,
                 "reuse": [0.342, 0.144, 0.149, ...]}, ...]}

Only ``batch`` and ``tables`` (each with ``rows``, ``dim``, ``pooling``) are required.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from trainsim.cli.main import app
from trainsim.cli.output import Format, emit_json, stderr

if TYPE_CHECKING:
    from trainsim.hardware import DeviceSpec, SystemSpec


@app.command("shard")
def shard(
    spec_file: Path = typer.Argument(..., metavar="SPEC", help="DLRM spec: JSON or YAML with batch and tables (docs/sharding.md)."),
    world: int = typer.Option(8, "--world", help="Ranks (GPUs, or CPU processes) the tables are sharded over."),
    device: str | None = typer.Option(None, "--device", help="Catalog device or device YAML (e.g. a `trainsim bench` CPU device file); default with --system: the system's device. Give --device, --system or both."),
    system: str | None = typer.Option(None, "--system", help="Catalog system or YAML whose comm models time the collectives (its device must be --device's); default: the first catalog system built of --device, else a host-local estimate."),
    kernel_models: Path | None = typer.Option(None, "--kernel-models", help="A `trainsim fit` .npz artifact answering before the device's own kernel models."),
    capacity_gb: float | None = typer.Option(None, "--capacity-gb", help="Cap on table memory per rank (GB, 1e9 bytes; > 0); sharders that break it are listed as infeasible. Default: the device's memory (memory_GB of the catalog/YAML; CPU ranks of one host share it)."),
    sharders: str | None = typer.Option(None, "--sharders", help="Comma-separated subset (default: all)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random sharder."),
    tbe: bool | None = typer.Option(None, "--tbe/--no-tbe", help="Tables as one FBGEMM TBE op per pass with the SGD update fused (default: on GPUs; CPUs: one EmbeddingBag per table + sparse SGD update)."),
    fmt: Format = typer.Option(Format.TABLE, "--format", help="table or json (JSON goes to stdout alone)."),
) -> None:  # fmt: skip
    """Predict the DLRM step under every sharder of 000 Table III (plus predicted_greedy) and rank them."""
    from trainsim.builders.dlrm import comm_setup, is_gpu, load_dlrm_spec, resolve_device
    from trainsim.errors import ConfigError, UsageError
    from trainsim.hardware import get_system
    from trainsim.search.sharders import SHARDERS, select_sharder

    if capacity_gb is not None and not (math.isfinite(capacity_gb * 1e9) and capacity_gb > 0):
        raise UsageError(f"--capacity-gb must be a positive number of GB, got {capacity_gb:g}")
    if world < 1:
        raise UsageError(f"--world must be >= 1, got {world}")
    if device is None and system is None:
        raise UsageError(
            "give --device (catalog name or device YAML, e.g. --device a100-sxm4-80gb) or --system (e.g. --system dgx-a100)"
        )
    names = list(dict.fromkeys(s.strip() for s in sharders.split(",") if s.strip())) if sharders else None
    if names == []:
        raise UsageError(f"--sharders names no sharder: {sharders!r}")
    unknown = [n for n in names or () if n not in SHARDERS]
    if unknown:
        raise UsageError(f"--sharders: unknown sharder {unknown[0]!r}; known: {', '.join(SHARDERS)}")
    spec = load_dlrm_spec(spec_file)
    if world > spec.batch:  # before anything is sized by it (--world 1e20 was an OverflowError)
        raise ConfigError(f"--world {world}: more ranks than {spec_file}'s batch {spec.batch}: "
                          "some rank would have no samples")  # fmt: skip
    sys_spec = get_system(system) if system is not None else None
    dev = resolve_device(device if device is not None else sys_spec.device)  # type: ignore[union-attr]
    if sys_spec is not None and device is not None:
        _check_system_device(dev, sys_spec)
    if capacity_gb is not None:
        cap, cap_src = capacity_gb * 1e9, "--capacity-gb"
    else:
        cap, cap_src = _device_capacity(dev, world, comm_setup(dev, world, sys_spec).system)
    odd = [(i, tb.dim) for i, tb in enumerate(spec.tables) if tb.dim % 4]
    if odd and is_gpu(dev):
        i, d = odd[0]
        more = f" (and {len(odd) - 1} more tables)" if len(odd) > 1 else ""
        stderr.print(f"[yellow]warning:[/] {spec_file}: tables[{i}].dim {d}{more} is not a multiple of 4, "
                     "which FBGEMM's GPU TBE and TorchRec require; predicted as given")  # fmt: skip
    res = select_sharder(spec, world, device=dev, system=sys_spec, capacity_bytes=cap, kernel_models=kernel_models,
                         sharders=names, seed=seed, tbe=tbe, capacity_source=cap_src)  # fmt: skip
    best = res[0]
    doc = {"spec": str(spec_file), "world": world, "device": dev.name, "comm": best["comm"],
           "tables": len(spec.tables), "batch": spec.batch, "capacity_gb": cap / 1e9, "capacity_source": cap_src,
           "sharders": res, "best": best["name"]}  # fmt: skip
    if fmt is Format.JSON:
        emit_json(doc)
        return
    t = Table(
        title=f"{len(spec.tables)} tables, batch {spec.batch}, {world}× {dev.name} ({best['comm']})"
    )
    for col in ("sharder", "predicted step", "vs best", "lookup imbalance", "host-bound", "tables per rank"):
        t.add_column(col, justify="left" if col == "sharder" else "right", no_wrap=col == "sharder")
    for r in res:
        if r["predicted_step_s"] is None:  # the reason, whole, goes under the table
            t.add_row(r["name"], "infeasible", "", "", "", "— (see below)")
            continue
        per = [r["assignment"].count(k) for k in range(world)]
        t.add_row(r["name"], f"{r['predicted_step_s'] * 1e3:,.3f} ms",
                  f"{(r['predicted_step_s'] / best['predicted_step_s'] - 1) * 100:+.1f} %",
                  f"{r['imbalance']:.2f}", f"{_host_share(r) * 100:.0f} %", _per_rank(per))  # fmt: skip
    import sys

    from rich.console import Console
    from rich.markup import escape

    out = Console(width=None if sys.stdout.isatty() else 160)  # piped: sharder names whole
    out.print(t)
    for r in res:
        if r["predicted_step_s"] is None:
            out.print(f"[yellow]infeasible[/] {escape(r['error'])}")
    over = "" if capacity_gb is not None else "; --capacity-gb overrides"
    stderr.print(f"capacity: {cap / 1e9:.4g} GB of tables per rank ({cap_src}{over}); tables only "
                 "(rows x dim x element size), activations and workspace not counted")  # fmt: skip
    if _host_share(best) > 0.5:
        stderr.print(f"[yellow]note:[/] {_host_share(best):.0%} of {best['name']}'s critical path is CPU time (dispatch, "
                     "launches): the step is host-bound, so the sharders' embedding work moves it little")  # fmt: skip
    prov = best["provenance"]
    if any(k.startswith("spec-based") for k in prov):
        stderr.print(
            "[yellow]note:[/] some kernels are spec-based (datasheet or probed peaks): optimistic lower bounds"
        )
    if any(k.startswith("estimate:") for k in prov):
        stderr.print(
            "[yellow]note:[/] collectives use the host-local estimate; give --system for a modelled network"
        )


def _host_share(r: dict[str, object]) -> float:
    """The share of a sharder's critical path spent on the CPU (host gaps and launch delays)."""
    cp = r.get("critical_path_s") or {}
    assert isinstance(cp, dict)
    total = sum(cp.values())
    return (cp.get("host_gap", 0.0) + cp.get("launch_delay", 0.0)) / total if total else 0.0


_PER_RANK_SHOWN = 16  # ranks listed one by one in "tables per rank"; more are summarised


def _per_rank(per: list[int]) -> str:
    """Tables per rank, space-separated; a long list as its first ranks, "…", and the counts
    (a 1000-rank world would otherwise print a 1000-number cell)."""
    if len(per) <= _PER_RANK_SHOWN:
        return " ".join(map(str, per))
    empty = per.count(0)
    head = " ".join(map(str, per[: _PER_RANK_SHOWN // 2]))
    lo, hi = min(x for x in per if x), max(per)  # some rank holds a table: there is one
    each = f"{lo} each" if lo == hi else f"{lo}–{hi} each"
    return f"{head} … ({len(per) - empty} of {len(per)} ranks hold tables, {each}; {empty} empty)"


def _check_system_device(dev: DeviceSpec, system: SystemSpec) -> None:
    """--device and --system together must describe one machine: the system's device."""
    from trainsim.builders.dlrm import same_device
    from trainsim.errors import ConfigError

    if not same_device(system.device, dev):
        raise ConfigError(
            f"--device {dev.name} is not the device of --system {system.name} ({system.device}); "
            f"drop --device, or give a system built of {dev.name}"
        )


def _device_capacity(dev: DeviceSpec, world: int, system: SystemSpec) -> tuple[float, str]:
    """Default per-rank table cap: a GPU's own memory; CPU ranks on one host share its memory."""
    if dev.sm_count is not None:
        return dev.memory_bytes, f"default: {dev.name} memory_GB"
    per_host = max(1, min(world, system.gpus_per_node or world))
    return dev.memory_bytes / per_host, f"default: {dev.name} memory_GB / {per_host} ranks per host"
