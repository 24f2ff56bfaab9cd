"""``trainsim bench [SUITE…]``: run micro-benchmarks on this machine into a dataset.

Kernel suites (:data:`trainsim.bench.suites.SUITES`, all of them when none is named) write
``trainsim.kernel-bench/1`` rows for ``trainsim fit``; ``comm`` runs the collective benchmark
(:func:`trainsim.bench.comm.run_comm_bench`) into its own ``trainsim.comm-bench/1`` dataset, so
it is run on its own. Both are resumable: a rerun measures only what the dataset lacks.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from trainsim.cli.main import app
from trainsim.cli.output import Format, emit_json, log

COMM_SUITE = "comm"


def _suite_names() -> tuple[str, ...]:
    from trainsim.bench.suites import SUITES

    return tuple(SUITES)


def _run_comm(
    dataset: Path | None, *, nproc: int, device: str, quick: bool, resume: bool
) -> dict[str, Any]:
    from trainsim.bench.comm import run_comm_bench

    path = dataset or Path("bench/comm.jsonl")
    log(f"benchmarking collectives with {nproc} ranks on {device} → {path}")
    r = run_comm_bench(path, world_size=nproc, device=device, quick=quick, resume=resume)
    return {
        "dataset": str(r.dataset), "samples": r.samples, "skipped_existing": r.skipped,
        "unsupported": list(r.unsupported), "device": r.device,
    }  # fmt: skip


def _run_kernels(
    suites: list[str], dataset: Path | None, *, device: str, quick: bool, resume: bool,
    threads: int | None, ops: list[str], progress: bool, dtypes: list[str] | None = None,
    density: int = 1,
) -> dict[str, Any]:  # fmt: skip
    from trainsim.bench.dataset import iter_rows, noise_floor
    from trainsim.bench.devicespec import measured_device, write_device_yaml
    from trainsim.bench.runner import Schedule, SweepPlan, run_sweep
    from trainsim.bench.suites import DTYPE_LABEL, SweepSpec, get_suite, suite_cases
    from trainsim.bench.suites.roofline import roofline_peaks
    from trainsim.errors import UsageError

    for name in suites:
        get_suite(name)  # unknown names fail before anything runs
    path = dataset or Path(f"bench/kernels-{device}.jsonl")
    spec = SweepSpec(device=device, quick=quick, density=density)
    cases = list(suite_cases(suites, spec, ops=ops, dtypes=dtypes or ()))
    if not cases:
        every = list(suite_cases(suites, spec))
        known = sorted({c.op for c in every})
        kinds = sorted({DTYPE_LABEL[c.dtype] for c in every})  # the names --dtype takes
        raise UsageError(
            f"no case of {', '.join(suites)} runs op(s) {ops or 'any'} in dtype(s) {dtypes or 'any'}; "
            f"their ops: {', '.join(known)}; their dtypes: {', '.join(kinds) or 'n/a'}"
        )
    what = f"{', '.join(suites)} on {device}{' (quick)' if quick else ''}"

    def start(plan: SweepPlan) -> None:  # once the dataset's rows are known: a resume says what is left
        if not plan.reused:
            log(f"benchmarking {plan.cases} cases of {what} → {path}")
        else:
            log(f"benchmarking {plan.pending} of {plan.cases} cases of {what} → {path} "
                f"({plan.reused} already in it)")  # fmt: skip
        if plan.reused_quick:  # intended (a quick sweep is a prefix of the full one), but said
            log(f"{plan.reused_quick} of the rows kept were measured by a --quick sweep (fewer warm-up calls "
                "and repeats); to measure them with the full schedule, sweep into a new --dataset")  # fmt: skip

    r = run_sweep(path, cases, device=device, resume=resume, threads=threads, on_start=start,
                  schedule=Schedule.for_run(quick=quick, cuda=device == "cuda"), progress=progress)  # fmt: skip
    mine = [
        x
        for x in iter_rows(path)
        if x.get("fingerprint") == r.fingerprint and x.get("suite") in suites
    ]
    per_suite = {
        name: {"rows": len(rows), "written": r.per_suite.get(name, 0), "noise_floor": noise_floor(rows)}
        for name in suites
        for rows in [[x for x in mine if x["suite"] == name]]
    }  # fmt: skip
    device_spec = None
    if "roofline" in suites:
        device_spec = path.with_suffix(".device.yaml")
        write_device_yaml(measured_device(mine, fingerprint=r.fingerprint), device_spec)
    return {
        "dataset": str(r.dataset), "samples": r.samples, "skipped_existing": r.skipped,
        "reused_quick": r.reused_quick, "device": r.device, "fingerprint": r.fingerprint, "wall_s": round(r.wall_s, 1),
        "rows": len(mine), "noise_floor": noise_floor(mine), "suites": per_suite,
        "roofline": roofline_peaks(mine) if "roofline" in suites else None,
        "device_spec": str(device_spec) if device_spec else None,
        "failed": [{"key": k, "error": e} for k, e in r.failed],
    }  # fmt: skip


def _compare(dataset: Path, other: Path) -> dict[str, Any]:
    """:func:`trainsim.bench.dataset.agreement` of ``dataset`` with ``other``, and their devices."""
    from trainsim.bench.dataset import agreement, iter_rows

    mine, theirs = list(iter_rows(dataset)), list(iter_rows(other))
    devices = lambda rows: sorted({str(r.get("device")) for r in rows})  # noqa: E731
    return {"dataset": str(other), "devices": devices(mine), "other_devices": devices(theirs),
            **agreement(mine, theirs)}  # fmt: skip


def _table(doc: dict[str, Any]) -> None:
    out = Console(width=None if sys.stdout.isatty() else 120)
    t = Table(title=f"{doc['dataset']} — {doc['device']}")
    for col in ("suite", "rows", "written now", "noise floor %"):
        t.add_column(col, justify="left" if col == "suite" else "right")
    for name, s in doc["suites"].items():
        nf = s["noise_floor"]
        t.add_row(name, str(s["rows"]), str(s["written"]), "—" if nf is None else f"{100 * nf:.1f}")
    out.print(t)
    nf = doc["noise_floor"]
    log(f"wrote {doc['samples']} rows ({doc['skipped_existing']} already there) in {doc['wall_s']} s; "
        f"noise floor (median (p75−p25)/median of repeats): {'—' if nf is None else f'{100 * nf:.1f} %'}")  # fmt: skip
    roof = doc.get("roofline")
    if roof and (roof["flops_per_s"] or roof["bandwidth_Bps"]):
        peaks = ", ".join(f"{d} {v / 1e9:.1f} GFLOP/s" for d, v in roof["flops_per_s"].items())
        bw = roof["bandwidth_Bps"]
        log(
            f"roofline: {peaks or 'no FLOP/s probe'}; {f'{bw / 1e9:.1f} GB/s' if bw else 'no bandwidth probe'}"
        )
    if doc.get("device_spec"):
        log(f"device file for `trainsim fit --device`: {doc['device_spec']}")
    cmp = doc.get("compared_with")
    if cmp is not None:
        if not cmp["cases"]:
            log(f"--compare-with {cmp['dataset']}: no case in common")
        else:
            where = "" if cmp["devices"] == cmp["other_devices"] else (
                f" (other device: {', '.join(cmp['other_devices'])})")
            log(f"against {cmp['dataset']}{where}: {cmp['cases']} common cases differ by a geometric mean of "
                f"{cmp['geomean_abs_pct']:.1f} % (median {cmp['median_abs_pct']:.1f} %, p90 "
                f"{cmp['p90_abs_pct']:.1f} %, max {cmp['max_abs_pct']:.1f} %); median ratio "
                f"{cmp['median_ratio']:.3f} (theirs / this run's)")  # fmt: skip
    if doc["failed"]:
        log(f"{len(doc['failed'])} case(s) failed (retried on the next run), first: "
            f"{doc['failed'][0]['key']}: {doc['failed'][0]['error']}")  # fmt: skip


@app.command()
def bench(
    suites: list[str] | None = typer.Argument(
        None,
        metavar="SUITE",
        help="Suites: comm, or kernel suites (gemm, attention, norm, softmax, elementwise, "
        "embedding, memory, index, conv, optimizer, roofline); all kernel suites when omitted.",
    ),
    dataset: Path | None = typer.Option(
        None,
        "--dataset",
        help="Dataset file (JSONL, appended; resumable). Default bench/kernels-DEVICE.jsonl or bench/comm.jsonl.",
    ),
    device: str = typer.Option("cpu", help="cpu or cuda (a CUDA case is timed as CUDA-graph replays of its calls)."),
    quick: bool = typer.Option(
        False, "--quick", help="Fewer shapes and repeats (a CPU run takes minutes)."
    ),
    resume: bool = typer.Option(
        True, "--resume/--no-resume", help="Skip rows already in the dataset."
    ),
    threads: int | None = typer.Option(
        None, help="torch intra-op threads for kernel suites (default: torch's)."
    ),
    ops: list[str] = typer.Option(
        [], "--op", help="Only these ops of the kernel suites (repeatable), e.g. --op mm."
    ),
    dtypes: list[str] = typer.Option(
        [],
        "--dtype",
        help="Only these dtypes (repeatable), e.g. --dtype fp32 (a full CPU sweep adds bf16).",
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar on stderr."),
    nproc: int | None = typer.Option(None, help="Ranks for the comm suite (default 2; ignored under torchrun)."),
    fmt: Format = typer.Option(Format.TABLE, "--format", help="table or json (JSON goes to stdout alone)."),
    density: int = typer.Option(
        1, "--density",
        help="A full sweep draws N times each op's shapes (the draws extend the default ones: a denser "
             "rerun keeps the rows already measured).",
    ),
    compare_with: Path | None = typer.Option(
        None, "--compare-with",
        help="After the sweep, compare the dataset's times with this dataset's (JSONL, .jsonl.gz) on "
             "the cases both hold: what a second run reproduces, beside the within-row noise floor.",
    ),  # fmt: skip
) -> None:
    """Benchmark kernels (and, as suite `comm`, collectives) into a dataset for `trainsim fit`."""
    from trainsim.errors import ConfigError, UsageError

    if device not in ("cpu", "cuda"):
        raise UsageError(f"--device must be cpu or cuda, got {device!r}")
    names = list(suites or _suite_names())
    known = {*_suite_names(), COMM_SUITE}
    unknown = [s for s in names if s not in known]
    if unknown:
        raise UsageError(
            f"unknown bench suite(s) {unknown}; available: {', '.join(sorted(known))}"
        )
    if COMM_SUITE in names and len(names) > 1:
        raise UsageError(
            "the comm suite writes its own dataset format; run `trainsim bench comm` separately from kernel suites"
        )
    if threads is not None and threads < 1:
        raise UsageError(f"--threads must be at least 1, got {threads}")
    if density < 1:
        raise UsageError(f"--density must be at least 1, got {density}")
    if names == [COMM_SUITE]:
        given = [f for f, v in (("--op", ops), ("--dtype", dtypes), ("--threads", threads),
                                ("--compare-with", compare_with), ("--density", density > 1)) if v]  # fmt: skip
        if given:
            raise UsageError(f"{', '.join(given)} apply to the kernel suites, not comm")
        if nproc is not None and nproc < 2:
            raise UsageError(f"--nproc must be at least 2 for collectives, got {nproc}")
        doc = _run_comm(dataset, nproc=nproc or 2, device=device, quick=quick, resume=resume)
        if fmt is Format.JSON:
            emit_json(doc)
            return
        out = Console(width=None if sys.stdout.isatty() else 120)  # the result: stdout, as a table would be
        out.print(
            f"wrote {doc['samples']} rows to {doc['dataset']} ({doc['skipped_existing']} already there); device {doc['device']}"
        )
        if doc["unsupported"]:
            out.print(f"backend refused: {', '.join(doc['unsupported'])}")
        return
    if nproc is not None:  # given for a kernel suite, it would be silently ignored
        raise UsageError("--nproc applies to the comm suite only")
    if quick and density > 1:
        raise UsageError("--density applies to full sweeps; a quick sweep draws the quick shapes")
    if compare_with is not None and not compare_with.is_file():
        raise ConfigError(f"--compare-with {compare_with}: no such dataset file")
    doc = _run_kernels(names, dataset, device=device, quick=quick, resume=resume, threads=threads,
                       ops=ops, progress=progress, dtypes=dtypes, density=density)  # fmt: skip
    if compare_with is not None:
        doc["compared_with"] = _compare(Path(doc["dataset"]), compare_with)
    if fmt is Format.JSON:
        emit_json(doc)
    else:
        _table(doc)
