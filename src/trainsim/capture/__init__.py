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

import re
from pathlib import Path

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


def capture(
    *,
    model: str,
    out_dir: str | Path,
    nproc: int = 1,
    steps: int = 3,
    warmup_steps: int = 2,
    batch_size: int | None = None,
    device: str = "cpu",
    timeout_s: float = 600.0,
    overwrite: bool = False,
) -> CaptureResult:
    """Capture ``steps`` training steps of example ``model`` on ``nproc`` ranks into ``out_dir``."""
    spec = CaptureSpec(
        model=model, out_dir=str(Path(out_dir).resolve()), nproc=nproc, steps=steps,
        warmup_steps=warmup_steps, batch_size=batch_size or 0, device=device,
        timeout_s=timeout_s,
    )  # fmt: skip
    validate(spec, batch_size=batch_size)
    _prepare_out_dir(Path(spec.out_dir), overwrite=overwrite)

    import torch

    from trainsim.capture.distributed import run_ranks

    ranks = run_ranks(spec)
    result = CaptureResult(
        spec=spec, ranks=tuple(sorted(ranks, key=lambda r: r.rank)),
        batch_size=spec.batch_size or example_info(model).default_batch_size,
        summary=example_info(model).summary, versions=_versions(torch.__version__),
    )  # fmt: skip
    write_manifest(result)
    return result


def validate(spec: CaptureSpec, *, batch_size: int | None = None) -> None:
    """Check a request before any process starts; raise :class:`CaptureError` with the fix."""
    example_info(spec.model)
    if spec.nproc < 1:
        raise CaptureError(f"--nproc must be at least 1, got {spec.nproc}")
    if spec.steps < 1:
        raise CaptureError(f"--steps must be at least 1, got {spec.steps}")
    if spec.warmup_steps < 1:
        raise CaptureError(f"--warmup must be at least 1, got {spec.warmup_steps}")
    if batch_size is not None and batch_size < 1:
        raise CaptureError(f"--batch-size must be at least 1, got {batch_size}")
    if spec.device not in DEVICES:
        raise CaptureError(f"unknown device {spec.device!r}; choose one of: {', '.join(DEVICES)}")
    if spec.device == "cuda":
        _check_cuda(spec.nproc)


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
    if out.exists() and not out.is_dir():
        raise CaptureError(f"--out {out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    ours = [p for p in out.iterdir() if _OUR_FILES.match(p.name)]
    if ours and not overwrite:
        raise CaptureError(
            f"--out {out} already holds a capture ({ours[0].name}, ...); "
            "choose an empty folder or pass --overwrite"
        )
    for p in ours:  # stale ranks of an earlier, larger capture would mix into this one
        p.unlink()


def _versions(torch_version: str) -> dict[str, str]:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    out = {"torch": torch_version, "python": platform.python_version()}
    try:
        out["transformers"] = version("transformers")
    except PackageNotFoundError:
        pass  # only the gpt2 example needs it
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
