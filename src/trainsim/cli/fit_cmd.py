"""``trainsim fit DATASET…``: fit kernel models on measurements; print every entry's held-out error."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from trainsim.cli.main import app
from trainsim.cli.output import Format, emit_json, log, not_an_input


def _out() -> Console:
    return Console(width=None if sys.stdout.isatty() else 160)


def _check_device(spec: Any, ds: Any) -> None:
    """A catalog --device must be the device the data say they were measured on (review
    finding: A100 data stamped H100): another architecture or tensor-core peak is an error;
    a sibling part (A100 40 GB for 80 GB data) is accepted."""
    from trainsim.errors import ConfigError
    from trainsim.hardware import find_device

    stated = find_device(ds.device) if ds.device else None
    if stated is not None and not stated.is_sibling_of(spec):
        raise ConfigError(f"--device {spec.name} contradicts the data: {ds.name} was measured on {ds.device} "
                          f"({stated.name}); drop --device or fit data of that device")  # fmt: skip


def _split(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


@app.command("fit")
def fit_cmd(
    datasets: list[Path] = typer.Argument(
        ..., help="Paper-001 operator CSVs, `trainsim bench` JSONL/CSV datasets, or folders of them."
    ),
    fmt: Format = typer.Option(Format.TABLE, "--format", help="table or json (JSON goes to stdout alone)."),
    family: list[str] | None = typer.Option(None, "--family", "-f", help="Only these kernel families (repeat or comma-separate)."),
    op: list[str] | None = typer.Option(None, "--op", help="Only these operators (repeat or comma-separate)."),
    kinds: str | None = typer.Option(None, "--kinds", help="Candidate kinds, comma-separated (default: xgboost,lightgbm,rforest,poly,roofline; also mlp)."),
    grid: str = typer.Option("quick", "--grid", help="Hyperparameter grid: quick, or paper (001's and 002 Table 4.2's full spaces; slow)."),
    device: str | None = typer.Option(None, "--device", help="Catalog device (or YAML) the data were measured on; read from the data if omitted."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write the fitted model here (.npz artifact, atomically)."),
    holdout: float = typer.Option(0.2, help="Fraction of each entry's rows held out to measure the chosen model."),
    seed: int = typer.Option(0, min=0, help="Seed of the held-out and validation splits."),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Threads per tree fit (1 is fastest on small data and busy machines)."),
    strict_monotone: bool = typer.Option(False, "--strict-monotone", help="Constrain trees to be monotone in every signed input (less accurate on cuBLAS kernel switches)."),
    name: str | None = typer.Option(None, help="Dataset name used in provenance (default: the folder name)."),
    folds: int = typer.Option(1, "--folds", help="Score candidates by k-fold cross-validation on the training rows (1: one 80/20 split)."),
    max_spread: float | None = typer.Option(None, "--max-spread", help="Leave out rows whose repeat spread (p75 − p25)/median exceeds this (e.g. 0.25), before any split; rows without repeats are kept."),
) -> None:  # fmt: skip
    """Fit kernel models (per operator, phase and dtype): choose a regressor by validation error
    inside the training rows, report its error on held-out rows, refit it on all rows."""
    from trainsim.errors import ConfigError
    from trainsim.hardware import get_device
    from trainsim.ir.kinds import KernelFamily
    from trainsim.ir.serialize import output_path
    from trainsim.kernels import (
        DEFAULT_KINDS,
        family_summary,
        fit_kernels,
        read_kernel_dataset,
        save_model,
    )

    if output is not None:  # before the fit: a wrong path should not cost the fitting time
        if output.suffix != ".npz":
            raise ConfigError(f"--output {output}: kernel model artifacts are .npz files")
        not_an_input(output, datasets, "--output")
        output_path(output)
    if folds < 1:
        raise ConfigError(f"--folds must be at least 1, got {folds}")
    _register_bench_ops()
    fams = None
    if family:
        try:
            fams = [KernelFamily(f) for f in _split(family) or []]
        except ValueError as e:
            raise ConfigError(
                f"--family: {e}; known: {', '.join(f.value for f in KernelFamily)}"
            ) from None
    kind_list = tuple(_split([kinds]) or ()) if kinds else DEFAULT_KINDS
    ds = read_kernel_dataset(datasets, name=name, ops=_split(op))
    dropped_noisy = 0
    if max_spread is not None:
        if not max_spread > 0:
            raise ConfigError(f"--max-spread must be positive, got {max_spread}")
        ds, dropped_noisy = ds.without_spread_above(max_spread)
        log(f"--max-spread {max_spread:g}: left out {dropped_noisy} rows whose repeats spread more")
    spec = get_device(device) if device else None
    if spec is not None and device and not (device.endswith((".yaml", ".yml")) or Path(device).is_file()):
        _check_device(spec, ds)  # a measured device file (`bench roofline`) names its own peaks
    log(f"{len(ds)} rows, {len(ds.entry_keys())} entries from {ds.name} ({', '.join(sorted(ds.formats))}); "
        f"device {spec.name if spec else ds.device}")  # fmt: skip

    def progress(r: Any) -> None:
        log(
            f"  {r.key.label}: {r.kind or 'no model'}  held-out MAPE {_pct(r.heldout_mape_pct)} %  ({r.seconds:.0f} s)"
        )

    result = fit_kernels(ds, device=spec, kinds=kind_list, grid=grid, holdout=holdout, seed=seed, families=fams,
                         n_jobs=jobs, strict_monotone=strict_monotone, progress=progress, folds=folds)  # fmt: skip
    if output is not None:
        if result.model is None:
            raise ConfigError("no entry had enough rows to fit a model; nothing to write")
        save_model(result.model, output)
        log(f"wrote {output}")
    doc = {
        "dataset": ds.name, "device": result.roofline.device, "rows": len(ds), "kinds": list(kind_list),
        "grid": grid, "holdout": holdout, "seed": seed, "folds": folds,
        "max_spread": max_spread, "rows_left_out_noisy": dropped_noisy,
        "models": [_model_row(r) for r in result.reports],
        "families": family_summary(result.reports),
        "artifact": str(output) if output else None,
    }  # fmt: skip
    if fmt is Format.JSON:
        emit_json(doc)
        return
    _print(doc)


def _model_row(r: Any) -> dict[str, Any]:
    d = r.as_dict()
    d.pop("candidates")
    d["candidates_val_mape_pct"] = {f"{c.kind}{_cfg(c.config)}": (None if c.rejected else c.val_mape_pct)
                                    for c in r.candidates}  # fmt: skip
    return d


def _cfg(cfg: dict[str, Any]) -> str:
    return "" if not cfg else "(" + ",".join(f"{k}={v}" for k, v in cfg.items()) + ")"


def _pct(x: float | None) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def _print(doc: dict[str, Any]) -> None:
    t = Table(title=f"{doc['dataset']} on {doc['device']}: held-out errors ({doc['holdout']:.0%} of rows, seed {doc['seed']})",
              title_justify="left")  # fmt: skip
    cols = ("entry", "family", "kind", "MAPE %", "GMAE %", "max %", "all rows MAPE %", "roofline MAPE %",
            "samples", "excluded")  # fmt: skip
    for c in cols:
        t.add_column(c, justify="left" if c in ("entry", "family", "kind") else "right")
    for m in doc["models"]:
        t.add_row(m["entry"], m["family"], m["kind"] or "—", _pct(m["mape_pct"]), _pct(m["gmae_pct"]),
                  _pct(m["max_abs_err_pct"]), _pct(m["mape_all_rows_pct"]), _pct(m["roofline_mape_pct"]),
                  str(m["samples"]), str(m["excluded_rows"]))  # fmt: skip
    out = _out()
    out.print(t)
    done = [m["mape_pct"] for m in doc["models"] if m["mape_pct"] is not None]
    if done:
        out.print(
            f"mean MAPE {sum(done) / len(done):.2f} %, max {max(done):.2f} % over {len(done)} entries"
        )
    f = Table(title="per family: held-out GMAE (entries pooled, weighted by held-out rows) beside the "
              "noise floor (median repeat spread (p75 − p25)/median)", title_justify="left")  # fmt: skip
    for c in ("family", "entries", "rows", "held-out rows", "GMAE %", "noise floor %",
              "held-out noise %", "worst entry"):  # fmt: skip
        f.add_column(c, justify="left" if c in ("family", "worst entry") else "right")
    for fam, s in doc["families"].items():
        f.add_row(fam, str(s["entries"]), str(s["rows"]), str(s["heldout_rows"]), _pct(s["gmae_pct"]),
                  _pct(s["noise_pct"]), _pct(s["heldout_noise_pct"]), s["worst_entry"] or "—")  # fmt: skip
    out.print(f)


def _register_bench_ops() -> None:
    """Operators the micro-benchmark suites calibrate beyond the kernel table (if installed)."""
    try:
        from trainsim.bench.opspecs import register_bench_ops
    except ImportError:
        return
    register_bench_ops()
