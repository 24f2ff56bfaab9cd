"""Record the PyTorch execution trace and the Kineto trace of a training step on this machine.

::

    from trainsim.capture import capture
    result = capture(model="dlrm", out_dir="traces/dlrm", nproc=2, steps=3)
    result.measured_step_s      # median step time, max over ranks (Kineto-only run)

The folder then holds ``rank{r}.kineto.json`` and ``rank{r}.et.json`` per rank plus a
``capture.json`` manifest, and loads with ``trainsim.ingest.load_traces([folder])``.
Importing this package does not import torch; capturing does.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from trainsim.capture.distributed import usable_cores
from trainsim.capture.examples import EXAMPLES, example_info
from trainsim.capture.manifest import (
    MANIFEST_NAME,
    CaptureResult,
    CaptureSpec,
    RankCapture,
    write_manifest,
)
from trainsim.errors import CaptureError

DEVICES = ("cpu", "cuda")
_OUR_FILES = re.compile(r"^(rank\d+\.(kineto|et)\.json|" + re.escape(MANIFEST_NAME) + ")$")
# a rank's half-written trace (recorder._tmp_beside: ".rank0.et.json.<pid>.tmp")
_OUR_TEMP = re.compile(r"^\.rank\d+\.(kineto|et)\.json\.\d+\.tmp$")


def capture(
    *,
    model: str,
    out_dir: str | Path,
    nproc: int = 1,
    steps: int = 3,
    warmup_steps: int = 2,
    batch_size: int | None = None,
    device: str = "cpu",
    threads_per_rank: int | None = None,
    timeout_s: float = 600.0,
    overwrite: bool = False,
    seq_len: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> CaptureResult:
    """Capture ``steps`` training steps of example ``model`` on ``nproc`` ranks into ``out_dir``.

    ``batch_size`` is per rank (default: the example's); ``seq_len`` (sequence models only)
    tokens per sequence, ``hidden`` and ``heads`` (gpt2) its width and attention heads
    (default: the example's).
    ``threads_per_rank`` sets torch's intra-op threads in each rank (default: the usable cores
    shared evenly); on a loaded machine fewer threads avoid OpenMP oversubscription, which slows
    CPU steps down severalfold.
    ``progress`` receives one line once the request is validated (the CLI prints it).
    """
    spec = CaptureSpec(
        model=model, out_dir=str(Path(out_dir).resolve()), nproc=nproc, steps=steps,
        warmup_steps=warmup_steps, batch_size=batch_size, device=device,
        threads_per_rank=threads_per_rank, timeout_s=timeout_s, seq_len=seq_len, hidden=hidden,
        heads=heads,
    )  # fmt: skip
    validate(spec)
    spec = replace(
        spec,
        batch_size=batch_size or example_info(model).default_batch_size,
        threads_per_rank=threads_per_rank or max(1, usable_cores() // nproc),
    )
    existed = Path(spec.out_dir).exists()
    _prepare_out_dir(Path(spec.out_dir), overwrite=overwrite)
    if progress is not None:
        progress(_describe(spec))
        busy = _busy_warning(spec)
        if busy:
            progress(busy)

    try:
        # numpy first, in Python: torch's C initialisation imports it itself and swallows what
        # that import raises ("Failed to initialize NumPy"), so a Ctrl-C in the first second of
        # a capture, while torch was loading, was lost and the capture ran on (exit 0)
        import numpy  # noqa: F401
        import torch

        from trainsim.capture.distributed import run_ranks

        ranks = run_ranks(spec)
    except BaseException:  # a failed, timed-out or interrupted capture leaves no part of itself
        _remove_partial(Path(spec.out_dir), created=not existed)
        raise
    result = CaptureResult(
        spec=spec, ranks=tuple(sorted(ranks, key=lambda r: r.rank)),
        batch_size=spec.batch_size or 0, threads_per_rank=spec.threads_per_rank or 0,
        summary=example_info(model).summary + _asked(seq_len=seq_len, hidden=hidden, heads=heads),
        versions=_versions(torch.__version__), seq_len=example_info(model).seq(device, seq_len),
        **dict(zip(("hidden", "heads"), example_info(model).width(device, hidden, heads), strict=True)),
    )  # fmt: skip
    write_manifest(result)
    return result


def _asked(**values: int | None) -> str:
    """What this capture changed from the example's defaults ("; this capture: seq_len 48, ...")."""
    asked = [f"{k} {v}" for k, v in values.items() if v is not None]
    return f"; this capture: {', '.join(asked)}" if asked else ""


def validate(spec: CaptureSpec) -> None:
    """Check a request before any process starts; raise :class:`CaptureError` with the fix."""
    example_info(spec.model)
    for flag, value in (
        ("--nproc", spec.nproc), ("--steps", spec.steps), ("--warmup", spec.warmup_steps),
        ("--batch-size", spec.batch_size), ("--threads", spec.threads_per_rank), ("--seq-len", spec.seq_len),
        ("--hidden", spec.hidden), ("--heads", spec.heads),
    ):  # fmt: skip
        if value is not None and value < 1:
            raise CaptureError(f"{flag} must be at least 1, got {value}")
    if spec.timeout_s <= 0:
        raise CaptureError(f"--timeout must be positive, got {spec.timeout_s}")
    if spec.device not in DEVICES:
        raise CaptureError(f"unknown device {spec.device!r}; choose one of: {', '.join(DEVICES)}")
    info = example_info(spec.model)
    if spec.seq_len is not None:
        if info.default_seq_len is None:
            raise CaptureError(f"--seq-len: the {spec.model} example takes none (gpt2 and llama do)")
        if info.max_seq_len is not None and spec.seq_len > info.max_seq_len:
            raise CaptureError(f"--seq-len: the {spec.model} example takes at most {info.max_seq_len} "
                               f"(its learned positions), got {spec.seq_len}")  # fmt: skip
    for flag, value in (("--hidden", spec.hidden), ("--heads", spec.heads)):
        if value is not None and info.default_hidden is None:
            takers = "gpt2 does" if flag == "--heads" else "gpt2 and llama do"
            raise CaptureError(f"{flag}: the {spec.model} example takes none ({takers})")
    for flag, value in (("--seq-len", spec.seq_len), ("--hidden", spec.hidden), ("--heads", spec.heads)):
        if value is not None and spec.device not in info.sized_devices:
            raise CaptureError(f"{flag}: the {spec.model} example takes it on {', '.join(info.sized_devices)} only")
    if spec.heads is not None and info.head_size is not None:
        raise CaptureError(f"--heads: the {spec.model} example's heads follow its width ({info.head_size} per head)")
    width, heads = info.width(spec.device, spec.hidden, spec.heads)
    if width is not None and heads is not None:
        need = math.lcm(info.hidden_multiple, 1 if info.head_size else heads)
        if width % need:
            what = "" if info.head_size else f" (its {heads} attention heads)"
            flag = "--heads" if spec.hidden is None else "--hidden"
            raise CaptureError(f"{flag}: the {spec.model} example's width must be a multiple of {need}{what}, got {width}")
    if spec.device == "cuda":
        _check_cuda(spec.nproc)


def _describe(spec: CaptureSpec) -> str:
    ranks = f"{spec.nproc} ranks ({spec.backend})" if spec.nproc > 1 else "1 rank"
    return (
        f"capturing {spec.model} on {spec.device}, {ranks}, {spec.threads_per_rank} thread{'s' if spec.threads_per_rank != 1 else ''}/rank: "
        f"{spec.warmup_steps} warm-up + "
        f"{spec.steps} traced steps, a Kineto run then an ET run -> {spec.out_dir}"
    )


def _busy_warning(spec: CaptureSpec) -> str:
    """A warning when other processes already use the cores this capture's threads need."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # not available on this platform
        return ""
    cores = usable_cores()
    wanted = spec.nproc * (spec.threads_per_rank or 1)
    if load < 1.0 or cores - load >= wanted:
        return ""
    hint = " (try --threads 1)" if (spec.threads_per_rank or 1) > 1 else ""
    return (
        f"warning: load average {load:.1f} on {cores} cores: other processes compete with "
        f"the capture's {wanted} thread(s), so step times will be inflated{hint}"
    )


def _check_cuda(nproc: int) -> None:
    import torch

    if not torch.cuda.is_available():
        raise CaptureError(
            f"--device cuda requested but torch {torch.__version__} sees no CUDA device; "
            "install a CUDA build of torch on a GPU machine, or use --device cpu"
        )
    count = torch.cuda.device_count()
    if nproc > count:
        raise CaptureError(
            f"--nproc {nproc} needs one GPU per rank with NCCL, but only {count} are visible"
        )


def _prepare_out_dir(out: Path, *, overwrite: bool) -> None:
    from trainsim.ir.serialize import output_folder

    output_folder(out, "--out ")
    ours = [p for p in out.iterdir() if _OUR_FILES.match(p.name)]
    if ours and not overwrite:
        raise CaptureError(
            f"--out {out} already holds a capture ({ours[0].name}, ...); "
            "choose an empty folder or pass --overwrite"
        )
    for p in ours:  # stale ranks of an earlier, larger capture would mix into this one
        p.unlink()
    for p in out.iterdir():  # an interrupted earlier capture's half-written traces
        if _OUR_TEMP.match(p.name):
            p.unlink(missing_ok=True)


def _remove_partial(out: Path, *, created: bool = False) -> None:
    """The traces a failed capture wrote (the folder held none of ours before it: see
    :func:`_prepare_out_dir`) and its ranks' half-written ones: without a capture.json they
    would read as a capture of unknown batch. A folder the capture ``created`` goes too when
    that leaves it empty."""
    if not out.is_dir():
        return
    for p in out.iterdir():
        if _OUR_FILES.match(p.name) or _OUR_TEMP.match(p.name):
            p.unlink(missing_ok=True)
    from trainsim.ir.serialize import remove_if_created_empty

    remove_if_created_empty(out, existed=not created)


def _versions(torch_version: str) -> dict[str, str]:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    out = {"torch": torch_version, "python": platform.python_version()}
    with contextlib.suppress(PackageNotFoundError):  # only the gpt2 example needs it
        out["transformers"] = version("transformers")
    return out


__all__ = [
    "DEVICES",
    "EXAMPLES",
    "MANIFEST_NAME",
    "CaptureResult",
    "CaptureSpec",
    "RankCapture",
    "capture",
    "validate",
]
