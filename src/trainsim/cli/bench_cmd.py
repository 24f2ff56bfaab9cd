"""``trainsim bench SUITE…``: run micro-benchmarks on this machine into a dataset."""

from __future__ import annotations

from pathlib import Path

import typer

from trainsim.cli.main import app
from trainsim.cli.output import Format, emit_json, log

BENCH_SUITES = ("comm",)  # one table of suites; kernel suites join it with the kernel-model issue


@app.command()
def bench(
    suites: list[str] = typer.Argument(..., help=f"Suites to run: {', '.join(BENCH_SUITES)}."),
    dataset: Path = typer.Option(Path("bench/comm.jsonl"), "--dataset", help="Dataset file (JSONL, appended; resumable)."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    nproc: int = typer.Option(2, help="Ranks for collective suites (ignored under torchrun)."),
    quick: bool = typer.Option(False, "--quick", help="Fewer sizes and repeats."),
    resume: bool = typer.Option(True, "--resume/--no-resume", help="Skip rows already in the dataset."),
    fmt: Format = typer.Option(Format.TABLE, "--format", help="table or json."),
) -> None:
    """Benchmark collectives (gloo here, NCCL on GPUs) into a dataset for `trainsim fit-comm`."""
    from trainsim.errors import ConfigError

    unknown = [s for s in suites if s not in BENCH_SUITES]
    if unknown:
        raise ConfigError(f"unknown bench suite(s) {unknown}; available: {', '.join(BENCH_SUITES)}")
    from trainsim.bench.comm import run_comm_bench

    log(f"benchmarking collectives with {nproc} ranks on {device} → {dataset}")
    r = run_comm_bench(dataset, world_size=nproc, device=device, quick=quick, resume=resume)
    doc = {
        "dataset": str(r.dataset), "samples": r.samples, "skipped_existing": r.skipped,
        "unsupported": list(r.unsupported), "device": r.device,
    }  # fmt: skip
    if fmt is Format.JSON:
        emit_json(doc)
    else:
        log(f"wrote {r.samples} rows to {r.dataset} ({r.skipped} already there); device {r.device}")
        if r.unsupported:
            log(f"backend refused: {', '.join(r.unsupported)}")
