"""``trainsim capture``: record ET + Kineto traces of an example training step on this machine."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from trainsim.capture.examples import EXAMPLES
from trainsim.cli.main import app
from trainsim.cli.output import Format, emit_json, log, stderr

if TYPE_CHECKING:
    from trainsim.capture import CaptureResult

_MODELS = ", ".join(sorted(EXAMPLES))


@app.command("capture")
def capture_cmd(
    *,
    model: str = typer.Option(..., "--model", help=f"Example training step: {_MODELS}."),
    out: Path = typer.Option(..., "--out", help="Folder for rank{r}.kineto.json, rank{r}.et.json, capture.json."),
    nproc: int = typer.Option(1, "--nproc", min=1, help="Ranks (processes) on this host; >1 wraps the model in DDP."),
    steps: int = typer.Option(3, "--steps", min=1, help="Traced steps, in each of the Kineto and ET runs."),
    warmup: int = typer.Option(2, "--warmup", min=1, help="Untraced steps before the traced ones (at least 1: the profiler warms up on the last)."),
    device: str = typer.Option("cpu", "--device", help="cpu (gloo) or cuda (NCCL, one GPU per rank)."),
    batch_size: int | None = typer.Option(None, "--batch-size", min=1, help="Per-rank batch size (default: the example's)."),
    seq_len: int | None = typer.Option(None, "--seq-len", min=1, help="Tokens per sequence (gpt2: 1-128; llama: on CPU, any; default: the example's 64)."),
    hidden: int | None = typer.Option(None, "--hidden", min=1, help="Hidden size (gpt2: a multiple of its heads, default 128; llama: the CPU stand-in, a multiple of 128, heads following, default 256)."),
    heads: int | None = typer.Option(None, "--heads", min=1, help="Attention heads (gpt2, dividing --hidden; default: the example's 4)."),
    threads: int | None = typer.Option(None, "--threads", min=1, help="CPU threads per rank (default: cores // nproc)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an earlier capture in --out."),
    timeout_s: float = typer.Option(600.0, "--timeout", help="Seconds before a hung multi-rank capture is stopped (--nproc 1 runs in this process, without a deadline: Ctrl-C stops it)."),
    fmt: Format = typer.Option(Format.TABLE, "--format", help="table or json (JSON goes to stdout alone)."),
) -> None:  # fmt: skip
    """Record the execution trace and the Kineto trace of a training step (separate runs)."""
    from trainsim.capture import DEVICES, capture
    from trainsim.cli.usage import one_of
    from trainsim.errors import UsageError

    one_of(model, sorted(EXAMPLES), "--model")
    one_of(device, DEVICES, "--device")
    if not timeout_s > 0:  # NaN too; inf: no deadline
        raise UsageError(f"--timeout must be a positive number of seconds, got {timeout_s:g}")
    with stderr.status("recording traces...", spinner="dots"):
        result = capture(
            model=model, out_dir=out, nproc=nproc, steps=steps, warmup_steps=warmup,
            batch_size=batch_size, device=device, threads_per_rank=threads, timeout_s=timeout_s, seq_len=seq_len,
            hidden=hidden, heads=heads, overwrite=overwrite,
            progress=log,
        )  # fmt: skip
    log(f"wrote {2 * len(result.ranks)} traces and capture.json to {result.trace_dir}")
    if fmt is Format.JSON:
        emit_json(_json_doc(result))
    else:
        _print_table(result)


def _json_doc(result: CaptureResult) -> dict[str, Any]:
    doc = result.to_dict()
    doc.pop("manifest_version", None)
    doc["manifest"] = str(result.trace_dir / "capture.json")
    return doc


def _print_table(result: CaptureResult) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"capture {result.spec.model}: {result.summary}")
    table.add_column("rank", justify="right")
    table.add_column("median step (ms)", justify="right")
    table.add_column("steps (ms)")
    table.add_column("with ET (ms)")
    table.add_column("files")
    for r in result.ranks:
        table.add_row(
            str(r.rank), f"{r.median_step_s * 1e3:.2f}",
            " ".join(f"{t * 1e3:.1f}" for t in r.step_times_s),
            " ".join(f"{t * 1e3:.1f}" for t in r.et_step_times_s),
            f"{r.kineto_file}, {r.et_file}",
        )  # fmt: skip
    console = Console()
    console.print(table)
    console.print(
        f"measured step: {result.measured_step_s * 1e3:.2f} ms (median over steps, max over "
        f"ranks; Kineto-only run)   traces: {result.trace_dir}",
        highlight=False,
    )
