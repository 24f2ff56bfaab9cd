"""The calibration samples shipped in ``bench/data`` and the models fitted on them.

A sample is ``bench/data/<name>.jsonl[.gz]`` (rows of ``trainsim bench``) with its
``<name>.device.yaml`` (the measured device) and ``<name>.provenance.json``; a CUDA sample also
ships ``<name>.models.npz``, fitted once by ``trainsim fit``. The shipped models stand for the
sample only while the sample's bytes and :data:`FIT_REVISION` still give the digest its
provenance records (``fit.digest``); otherwise whoever needs models fits them again
(:func:`trainsim.validate.shard_suite.sample_kernel_models`, cached).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

BENCH_DATA = Path(__file__).resolve().parent / "data"
FIT_REVISION = 6  # part of the fit cache key: bump when kernel fitting changes what it returns

# GPU name as traces and torch give it -> the CUDA sample measured on that GPU
CUDA_SAMPLES: dict[str, str] = {"NVIDIA H100 80GB HBM3": "cuda_full_03b482ae582e2c80"}


def sample_files(names: Sequence[str]) -> list[Path]:
    return [p for name in names for p in sorted(BENCH_DATA.glob(f"{name}.jsonl*"))]


def fit_digest(names: Sequence[str]) -> str:
    """What a fit of shipped samples ``names`` depends on: their bytes and :data:`FIT_REVISION`
    (12 hex digits; the cache key, and the ``fit.digest`` a sample's shipped models record)."""
    data = b"".join(p.read_bytes() for p in sample_files(names))
    return hashlib.sha256(data + f"fit-r{FIT_REVISION}".encode()).hexdigest()[:12]


def shipped_fit_digest(name: str) -> str | None:
    """The fit digest a shipped sample's provenance records for its shipped models."""
    try:
        doc = json.loads((BENCH_DATA / f"{name}.provenance.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    fit = doc.get("fit") if isinstance(doc, dict) else None
    return fit.get("digest") if isinstance(fit, dict) else None


def shipped_models(names: Sequence[str]) -> Path | None:
    """The models shipped for samples ``names`` (``<first name>.models.npz``) when they still
    match the samples (:func:`fit_digest`), else None: nothing is fitted here."""
    path = BENCH_DATA / f"{names[0]}.models.npz"
    if path.is_file() and shipped_fit_digest(names[0]) == fit_digest(names):
        return path
    return None


def cuda_sample(names: Sequence[str]) -> str | None:
    """The CUDA sample of the first of ``names`` (a GPU's name and aliases) that has one."""
    return next((CUDA_SAMPLES[n] for n in names if n in CUDA_SAMPLES), None)


__all__ = ["BENCH_DATA", "CUDA_SAMPLES", "FIT_REVISION", "cuda_sample", "fit_digest", "sample_files",
           "shipped_fit_digest", "shipped_models"]  # fmt: skip
