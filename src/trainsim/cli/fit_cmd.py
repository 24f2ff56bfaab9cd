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
from trainsim.cli.output import Format, emit_json, log, not_an_input, writable_path


def _out() -> Console:
    return Console(width=None if sys.stdout.isatty() else 160)


def _check_device(spec: Any, ds: Any, *, arch_only: bool = False) -> None:
    """A catalog --device must be the device the data say they were measured on (review
    finding: A100 data stamped H100): another architecture or tensor-core peak is an error;
    a sibling part (A100 40 GB for 80 GB data) is accepted. ``arch_only``: a device YAML (a
    `bench roofline` file names its own measured peaks) need only share the architecture."""
    from trainsim.errors import ConfigError
    from trainsim.hardware import find_device

    stated = find_device(ds.device) if ds.device else None
    if stated is None:
        return
    # `bench roofline` names the architecture of what it measured generically ("gpu"): a GPU's data
    generic = spec.architecture == "gpu" and stated.sm_count is not None
    if arch_only and stated.architecture != spec.architecture and not generic:
        raise ConfigError(f"--device {spec.name} ({spec.architecture}) contradicts the data: {ds.name} was measured "
                          f"on {ds.device} ({stated.name}, {stated.architecture}); drop --device or fit data of "
                          "that device")  # fmt: skip
    if not arch_only and not stated.is_sibling_of(spec):
        raise ConfigError(f"--device {spec.name} contradicts the data: {ds.name} was measured on {ds.device} "
                          f"({stated.name}); drop --device or fit data of that device")  # fmt: skip


def _device_files(datasets: list[Path]) -> list[Path]:
    """Where `trainsim bench` puts the device it measured for each dataset: ``<dataset stem>.device.yaml``
    beside the file (``b2.jsonl`` → ``b2.device.yaml``; ``x.jsonl.gz`` → ``x.jsonl.device.yaml``
    as the bench names it, or ``x.device.yaml`` as the shipped samples are); for a folder, those
    of the files directly inside it."""
    out: list[Path] = []
    for d in datasets:
        files = sorted(f for f in d.iterdir() if f.is_file()) if d.is_dir() else [d]
        for f in files:
            if f.name.endswith(".device.yaml"):
                continue
            bare = f.name.split(".", 1)[0]
            for c in (f.with_suffix(".device.yaml"), f.with_name(f"{bare}.device.yaml")):
                if c not in out:
                    out.append(c)
    return out


def _device_beside(ds: Any, datasets: list[Path]) -> Any:
    """The device of a dataset fitted without --device whose stated device the catalog lacks
    (any CPU): the ``<dataset stem>.device.yaml`` that `trainsim bench` wrote beside it, when it
    names that device (review finding: `fit b2.jsonl` failed beside the b2.device.yaml the bench had
    just announced). None when the catalog has the device; an error naming the file otherwise."""
    from trainsim.errors import ModelError
    from trainsim.hardware import find_device, get_device

    if ds.device and find_device(ds.device) is not None:
        return None
    wanted = (ds.device or "").strip().lower()
    expected = _device_files(datasets)
    found = [(c, get_device(str(c))) for c in expected if c.is_file()]
    mine = [(c, d) for c, d in found if not wanted or wanted in {n.lower() for n in (d.name, *d.aliases)}]
    if len(mine) == 1:
        log(f"note: device {ds.device!r} is not in the hardware catalog; using {mine[0][0]} (measured by "
            "`trainsim bench` beside the dataset)")  # fmt: skip
        return mine[0][1]
    if len(mine) > 1:
        why = f"{', '.join(str(c) for c, _ in mine)} all describe it; pass one as --device"
    elif found:
        why = (f"{', '.join(str(c) for c, _ in found)} beside it describe(s) another device; pass --device "
               "(a catalog name, or the device file of these measurements)")  # fmt: skip
    else:
        names = ", ".join(c.name for c in expected[:2]) or "<dataset>.device.yaml"
        why = (f"no {names} beside it; pass --device (a catalog name, or the <dataset>.device.yaml that "
               "`trainsim bench roofline --dataset <dataset>` measures on this machine)")
    raise ModelError(f"dataset {ds.name}: device {ds.device!r} is not in the hardware catalog and {why}")


def _split(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


@app.command("fit")
def fit_cmd(
    datasets: list[Path] = typer.Argument(
        ..., metavar="DATASET", help="Paper-001 operator CSVs, `trainsim bench` JSONL/CSV datasets, or folders of them."
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
    folds: int = typer.Option(1, "--folds", min=1, help="Score candidates by k-fold cross-validation on the training rows (1: one 80/20 split)."),
    max_spread: float | None = typer.Option(None, "--max-spread", help="Leave out rows whose repeat spread (p75 − p25)/median exceeds this (e.g. 0.25), before any split; rows without repeats are kept."),
) -> None:  # fmt: skip
    """Fit kernel models (per operator, phase and dtype); print each one's held-out error.

    Each entry's regressor is chosen by validation error inside the training rows, scored on
    held-out rows, then refit on all rows."""
    from trainsim.cli.usage import fraction, one_of, positive, usage
    from trainsim.errors import ConfigError, UsageError
    from trainsim.hardware import get_device
    from trainsim.ir.kinds import KernelFamily
    from trainsim.kernels import (
        DEFAULT_KINDS,
        family_summary,
        fit_kernels,
        read_kernel_dataset,
        save_model,
    )
    from trainsim.kernels.learned import GRIDS
    from trainsim.kernels.learned import kind as learned_kind

    fraction(holdout, "--holdout")
    positive(max_spread, "--max-spread")
    one_of(grid, GRIDS, "--grid")
    fams = None
    if family:
        try:
            fams = [KernelFamily(f) for f in _split(family) or []]
        except ValueError as e:
            raise UsageError(
                f"--family: {e}; known: {', '.join(f.value for f in KernelFamily)}"
            ) from None
    kind_list = tuple(_split([kinds]) or ()) if kinds else DEFAULT_KINDS
    with usage():
        for k in kind_list:
            learned_kind(k)
    if output is not None:  # before the fit: a wrong path should not cost the fitting time
        if output.suffix != ".npz":
            raise UsageError(f"--output {output}: kernel model artifacts are .npz files")
        not_an_input(output, datasets, "--output")
        # a folder that takes no file: refused before the fit; its folder is made when it is written
        # (made here, a failed or interrupted fit left it behind empty)
        writable_path(output, "--output")
        from trainsim.kernels.registry import is_kernel_artifact

        if output.is_file() and output.stat().st_size and not is_kernel_artifact(output):
            raise ConfigError(f"--output {output}: exists and is not a kernel model artifact trainsim wrote; "
                              "remove it or write elsewhere")  # fmt: skip
    _register_bench_ops()
    ds = read_kernel_dataset(datasets, name=name, ops=_split(op))
    dropped_noisy = 0
    if max_spread is not None:
        ds, dropped_noisy = ds.without_spread_above(max_spread)
        log(f"--max-spread {max_spread:g}: left out {dropped_noisy} rows whose repeats spread more")
    if len(ds.setups) > 1:
        seen = ", ".join(f"{fp[:8]}/{'?' if t is None else t} threads" for fp, t in sorted(ds.setups, key=str))
        log(f"warning: {ds.name} holds rows of {len(ds.setups)} machine/thread setups ({seen}): they are fitted "
            "together and a shape's repeats averaged across them; fit one setup at a time (bench --threads "
            "changes CPU timings a lot)")  # fmt: skip
    spec = get_device(device) if device else _device_beside(ds, datasets)
    if device and spec is not None:  # a measured device file (`bench roofline`) names its own peaks
        _check_device(spec, ds, arch_only=device.endswith((".yaml", ".yml")) or Path(device).is_file())
    log(f"{len(ds)} rows, {len(ds.entry_keys())} entries from {ds.name} ({', '.join(sorted(ds.formats))}); "
        f"device {spec.name if spec else ds.device}")  # fmt: skip

    def progress(r: Any) -> None:
        score = (f"{r.kind}  held-out MAPE {_pct(r.heldout_mape_pct)} %" if r.unscored is None
                 else f"{r.kind}  no held-out MAPE: {r.unscored}" if r.kind else r.unscored)  # fmt: skip
        log(f"  {r.key.label}: {score}  ({r.seconds:.0f} s)")

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
        "entries_without_heldout_score": {r.key.label: r.unscored for r in result.reports if r.unscored},
        "artifact": str(output) if output else None,
    }  # fmt: skip
    # An entry whose model ships without a held-out score looks fine in a table of numbers:
    # say so on stderr, whatever the format.
    for r in result.reports:
        if r.kind is not None and r.unscored:
            log(f"warning: {r.key.label}: its {r.kind} model ships without a held-out score: {r.unscored}; "
                "its predictions are unchecked")  # fmt: skip
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
    t = Table(title=f"{doc['dataset']} on {doc['device']}: held-out errors ({doc['holdout']:.0%} of each entry's distinct inputs, seed {doc['seed']})",
              title_justify="left")  # fmt: skip
    merged = any(m["merged_rows"] for m in doc["models"])
    cols = ("entry", "family", "kind", "MAPE %", "GMAE %", "max %", "all rows MAPE %", "roofline MAPE %",
            "rows", "held-out", "train", "excluded", *(("merged",) if merged else ()), "final fit")  # fmt: skip
    for c in cols:  # names never fold or shorten (wide tables wrap the numeric headers instead)
        t.add_column(c, justify="left" if c in ("entry", "family", "kind") else "right",
                     no_wrap=c in ("entry", "family", "kind"))  # fmt: skip
    for m in doc["models"]:
        bad = m["heldout_implausible_rows"]
        flag = " (!)" if m["kind"] and m["heldout_unscored"] else ""
        t.add_row(m["entry"] + flag, m["family"], m["kind"] or "—", _pct(m["mape_pct"]), _pct(m["gmae_pct"]),
                  _pct(m["max_abs_err_pct"]), _pct(m["mape_all_rows_pct"]), _pct(m["roofline_mape_pct"]),
                  str(m["rows"]), f"{m['heldout_rows']}" + (f" ({bad} >10x)" if bad else ""), str(m["train_rows"]),
                  str(m["excluded_rows"]), *((str(m["merged_rows"]),) if merged else ()),
                  (f"{m['samples']}" + (f" ({fx} >10x)" if (fx := m["final_excluded_rows"]) else "")) if m["kind"] else "—")  # fmt: skip
    out = _out()
    out.print(t)
    out.print(f"rows = held-out + train + excluded (training rows >10x off a smooth fit){' + merged (training repeats of a shape, averaged into one row)' if merged else ''}; "
              "final fit: the distinct rows the shipped model was refitted on (all rows, screened again: (n >10x) left out); "
              "held-out rows >10x off the prediction are left out of MAPE/GMAE/max, not of all-rows MAPE")  # fmt: skip
    _print_summary(out, doc)
    f = Table(title="per family: held-out GMAE (entries pooled, weighted by held-out rows) beside the "
              "noise floor (median repeat spread (p75 − p25)/median)", title_justify="left")  # fmt: skip
    for c in ("family", "entries", "rows", "held-out rows", "GMAE %", "noise floor %",
              "held-out noise %", "worst entry"):  # fmt: skip
        f.add_column(c, justify="left" if c in ("family", "worst entry") else "right")
    for fam, s in doc["families"].items():
        f.add_row(fam, str(s["entries"]), str(s["rows"]), str(s["heldout_rows"]), _pct(s["gmae_pct"]),
                  _pct(s["noise_pct"]), _pct(s["heldout_noise_pct"]), s["worst_entry"] or "—")  # fmt: skip
    out.print(f)


def _print_summary(out: Console, doc: dict[str, Any]) -> None:
    """Mean and max held-out MAPE over the entries that have one, and which have none and why
    (review finding: one entry without a plausible held-out row made the mean NaN)."""
    models = doc["models"]
    done = [m["mape_pct"] for m in models if m["mape_pct"] is not None and math.isfinite(m["mape_pct"])]
    line = (f"mean MAPE {sum(done) / len(done):.2f} %, max {max(done):.2f} % over {len(done)} of {len(models)} entries"
            if done else f"no held-out MAPE for any of the {len(models)} entries")  # fmt: skip
    unscored = doc["entries_without_heldout_score"]
    if unscored and done:
        line += f"; {len(unscored)} without one (below)"
    bad = [m for m in models if m["heldout_implausible_rows"] and m["mape_pct"] is not None]
    if bad:
        every = [m["mape_all_rows_pct"] for m in models if m["mape_pct"] is not None and math.isfinite(m["mape_pct"])
                 and m["mape_all_rows_pct"] is not None]  # fmt: skip
        line += (f"; {sum(m['heldout_implausible_rows'] for m in bad)} held-out rows of {len(bad)} scored "
                 f"entr{'y' if len(bad) == 1 else 'ies'} >10x off are not in it"
                 + (f": with them, mean MAPE {sum(every) / len(every):.2f} % (all rows MAPE)" if every else ""))  # fmt: skip
    out.print(line)
    shipped = {m["entry"] for m in models if m["kind"]}
    for label, why in unscored.items():
        out.print(f"  {label}{' (!) shipped without a held-out score' if label in shipped else ''}: {why}")


def _register_bench_ops() -> None:
    """Operators the micro-benchmark suites calibrate beyond the kernel table (if installed)."""
    try:
        from trainsim.bench.opspecs import register_bench_ops
    except ImportError:
        return
    register_bench_ops()
