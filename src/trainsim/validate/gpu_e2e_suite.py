"""The ``gpu-e2e`` suite: ``cpu-e2e``'s resize what-if on steps captured on a CUDA GPU.

This machine has no GPU, so the suite reads captures made on one: ``scripts/gpu_session.sh``
runs ``trainsim capture --device cuda`` for each shipped example at a base batch and at half and
double it (two repeats each, 20 untraced warm-up steps). The package ships one such set,
captured on an H100 at GPU-bound batches (ResNet 512/1024/2048, GPT-2 512/1024/2048, DLRM
8192/16384/32768; :data:`SHIPPED`, 3 MB, unpacked once into ``~/.cache/trainsim/gpu_e2e``);
``--resume DIR`` reads another folder of captures instead (one sub-folder per capture, as the
script names them). Batches far above the calibration sweep's (convolutions were swept up to
n = 256) are answered by the element-wise rule of the resize pass, not the conv model
(a model's extrapolation is not used; :mod:`trainsim.sim.resize`).

Per model, the middle captured batch is the base; every traced step of each base capture is
resized to the other captured batches with :func:`trainsim.sim.resize.resize_batch`, its kernels
re-timed by kernel models fitted on the shipped CUDA calibration sample of the same GPU
(``bench/data/cuda_full_*``, :data:`CUDA_SAMPLES`; the fit is cached), and simulated with the
capture's own host statistics — the same evaluation as ``cpu-e2e``
(:func:`trainsim.validate.cpu_e2e_suite.evaluate`), with its naive baseline (measured base ×
batch ratio) and noise floor. A GPU whose sample is not shipped is an error, not a guess.
"""

from __future__ import annotations

import json
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainsim.bench import samples
from trainsim.errors import ConfigError

_DATA = Path(__file__).parent / "data"
SHIPPED = _DATA / "gpu_e2e_h100.tar.xz"
# GPU name (as the Kineto trace's deviceProperties give it) -> its shipped calibration sample
CUDA_SAMPLES = samples.CUDA_SAMPLES  # GPU name -> its shipped CUDA sample (trainsim.bench.samples)


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "trainsim" / "gpu_e2e"


def _unpack_shipped(cache: Path) -> Path:
    """The shipped captures, unpacked once (a folder per archive content digest; unpacked
    beside it, then renamed, so a folder that exists is complete)."""
    import hashlib
    import shutil

    if not SHIPPED.is_file():
        raise ConfigError(f"{SHIPPED}: the shipped GPU captures are missing; pass --resume DIR of captures")
    digest = hashlib.sha256(SHIPPED.read_bytes()).hexdigest()[:12]
    out = cache / f"shipped-{digest}"
    if not out.is_dir():
        tmp = cache / f".shipped-{digest}.partial"
        shutil.rmtree(tmp, ignore_errors=True)  # a run killed while unpacking
        tmp.mkdir(parents=True)
        with tarfile.open(SHIPPED, "r:xz") as tar:
            tar.extractall(tmp, filter="data")  # plain files only: no links, no absolute paths
        try:
            tmp.rename(out)
        except OSError:  # another run renamed its copy first
            shutil.rmtree(tmp, ignore_errors=True)
    return out / "captures"


def discover(root: Path) -> dict[tuple[str, int], list[Path]]:
    """CUDA captures under ``root`` by (model, batch), each list in folder-name order."""
    from trainsim.capture import MANIFEST_NAME

    if not root.is_dir():
        raise ConfigError(f"--resume {root}: no such folder of captures")
    found: dict[tuple[str, int], list[Path]] = {}
    for man in sorted(root.glob(f"*/{MANIFEST_NAME}")):
        try:
            doc = json.loads(man.read_text(encoding="utf-8"))
            key = (str(doc["model"]), int(doc["batch_size"]))
            device = doc["device"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"{man}: not a trainsim capture manifest ({e})") from None
        if device == "cuda" and doc.get("nproc") == 1:
            found.setdefault(key, []).append(man.parent)
    if not found:
        raise ConfigError(f"{root}: no single-GPU CUDA capture (*/{MANIFEST_NAME} with device cuda)")
    return found


def gpu_kernel_models(gpu: str) -> tuple[Path, Path | None, str] | None:
    """(device file, fitted models, provenance note) of the CUDA calibration sample shipped for
    GPU ``gpu`` (its name as traces give it), or None where none ships."""
    from trainsim.validate.shard_suite import sample_kernel_models

    sample = CUDA_SAMPLES.get(gpu)
    if sample is None:
        return None
    device_file = samples.BENCH_DATA / f"{sample}.device.yaml"
    artifact, note = sample_kernel_models(default_cache_dir().parent, (sample,), device_file)
    return device_file, artifact, note


def resize_timer(device_file: Path, artifact: Path | None, extra: Sequence[Any] = ()) -> Any:
    """The resize timer of a GPU's shipped calibration: its fitted models (after ``extra``
    models, a user's), with the carry beyond the measured work where its bench calibration is
    current (:class:`trainsim.builders.bench_costs.CarriedTimer`), else the models alone."""
    from trainsim.builders.bench_costs import CarriedTimer, bench_calibration
    from trainsim.builders.dlrm import Coster
    from trainsim.hardware import get_device
    coster = Coster(str(device_file), [*extra, *([artifact] if artifact is not None else [])])
    cal = bench_calibration(get_device(str(device_file)))
    return coster.time if cal is None else CarriedTimer(cal, coster.time).time


def _gpu_name(folder: Path) -> str:
    from trainsim.sim.replay import load_for_replay

    w = load_for_replay([folder], link_et=False).workload
    return next((r.device for r in w.ranks if r.device), "")


def run_gpu_e2e_suite(data_dir: Path, *, resume: str | None = None, limit: int | None = None) -> dict[str, Any]:
    del data_dir  # the captures are shipped or given; shared/data is not read
    from trainsim.validate.cpu_e2e_suite import evaluate

    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be at least 1, got {limit}")
    t0 = time.perf_counter()
    root = Path(resume).expanduser() if resume else _unpack_shipped(default_cache_dir())
    folders = discover(root)
    models = sorted({m for m, _ in folders})[:limit]  # limit None: all of them
    bases: dict[str, int] = {}
    for m in models:
        batches = sorted(b for mm, b in folders if mm == m)
        if len(batches) < 2:
            raise ConfigError(f"{root}: model {m} was captured at one batch only ({batches[0]}); need two or more")
        bases[m] = batches[(len(batches) - 1) // 2]  # the middle one (the lower middle of an even count)
    folders = {k: v for k, v in folders.items() if k[0] in bases}
    gpu = _gpu_name(next(iter(folders.values()))[0])
    calibration = gpu_kernel_models(gpu)
    if calibration is None:
        known = ", ".join(CUDA_SAMPLES)
        raise ConfigError(f"{root}: captured on {gpu or 'an unnamed GPU'}; CUDA calibration samples ship for: {known}")
    device_file, artifact, kernel_note = calibration
    out = evaluate(folders, bases, resize_timer(device_file, artifact))
    out["summary"]["wall_s"] = time.perf_counter() - t0
    return {
        "suite": "gpu-e2e",
        "params": {"captures": str(root), "models": models, "bases": bases, "gpu": gpu,
                   "repeats": {f"{m}_b{b}": len(v) for (m, b), v in sorted(folders.items())}},
        "kernel_models": kernel_note, **out,
    }  # fmt: skip
