"""Which kernel model answers: shipped calibrated artifacts first, spec-based models last.

Artifacts are npz files (schema ``trainsim.kernel-model/1``) in ``trainsim/kernels/data``: a
JSON manifest stored as bytes plus named numeric arrays, read with
``numpy.load(allow_pickle=False)`` — loading reads numbers and JSON, never code, never pickle.
They load lazily, once. For a device, :func:`models_for` lists, in order:

1. learned models fitted on that device (``calibrated:<dataset>``),
2. calibrated rooflines (efficiency curves) fitted on that device,
3. the embedding heuristics (000 §III-E with reuse factors, then 002 §4.3.2.1),
4. the spec-based roofline from the catalog's peaks (``spec-based:<device>``);

the first model that supports a query answers it (:func:`predict_kernel`).
"""

from __future__ import annotations

import io
import json
import os
import zipfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from trainsim.envvars import KERNEL_MODELS_ENV, split_paths
from trainsim.errors import ConfigError, ModelError, NotCalibratedError
from trainsim.hardware import DeviceSpec, catalog_name, get_device, list_devices
from trainsim.ir.graph import Kernel
from trainsim.kernels.calibrated import LearnedKernelModel
from trainsim.kernels.embedding import EmbeddingLookupModel
from trainsim.kernels.features import OPS, op_spec
from trainsim.kernels.model import KernelModel, KernelPrediction, KernelQuery, query_from_kernel
from trainsim.kernels.rescaled import RescaledKernelModel, edited_catalog_device, measured_on
from trainsim.kernels.roofline import RooflineModel

ARTIFACT_SCHEMA = "trainsim.kernel-model/1"
_MANIFEST = "manifest.json"

Loader = Callable[[dict[str, Any], Mapping[str, np.ndarray]], KernelModel]
MODEL_TYPES: dict[str, Loader] = {}


def register_model_type(name: str, loader: Loader) -> None:
    """Add an artifact loader; a name registered twice is an error (one source of truth)."""
    if name in MODEL_TYPES:
        raise ModelError(f"kernel model type {name!r} is registered twice")
    MODEL_TYPES[name] = loader


register_model_type(LearnedKernelModel.model_type, LearnedKernelModel.from_artifact)
register_model_type(RooflineModel.model_type, RooflineModel.from_artifact)
register_model_type(EmbeddingLookupModel.model_type, EmbeddingLookupModel.from_artifact)


def model_from_artifact(manifest: dict[str, Any], arrays: Mapping[str, np.ndarray]) -> KernelModel:
    if manifest.get("schema") != ARTIFACT_SCHEMA:
        raise ModelError(
            f"not a kernel model artifact (schema {manifest.get('schema')!r}, expected {ARTIFACT_SCHEMA})"
        )
    loader = MODEL_TYPES.get(str(manifest.get("model")))
    if loader is None:
        raise ModelError(
            f"unknown kernel model type {manifest.get('model')!r}; known: {', '.join(MODEL_TYPES)}"
        )
    return loader(manifest, arrays)


def artifact_bytes(model: KernelModel) -> bytes:
    """The npz artifact of ``model`` (compressed)."""
    manifest, arrays = model.to_artifact()
    doc = {"schema": ARTIFACT_SCHEMA, **manifest}
    if _MANIFEST in arrays:
        raise ModelError(f"array name {_MANIFEST!r} is reserved")
    for name, a in arrays.items():
        if a.dtype == object:
            raise ModelError(f"array {name!r} holds Python objects; artifacts hold numbers only")
    text = json.dumps(doc, sort_keys=True, allow_nan=True).encode("utf-8")
    buf = io.BytesIO()
    payload = {_MANIFEST: np.frombuffer(text, dtype=np.uint8), **arrays}
    # numpy's stub types **kwds as if they could be its own keyword (allow_pickle: bool)
    np.savez_compressed(buf, **payload)  # type: ignore[arg-type]
    return buf.getvalue()


def save_model(model: KernelModel, path: Path | str) -> Path:
    """Write the artifact atomically (temporary file in the same folder, then rename)."""
    p = Path(path)
    if p.suffix != ".npz":
        raise ConfigError(f"kernel model artifacts are .npz files, got {p.name}")
    from trainsim.ir.serialize import output_path, write_bytes_atomic

    write_bytes_atomic(output_path(p), artifact_bytes(model))
    return p


def read_artifact(data: bytes | Path | str, origin: str = "") -> KernelModel:
    """Load an artifact: numbers and JSON only (``allow_pickle=False``)."""
    where = origin or (str(data) if not isinstance(data, bytes) else "(bytes)")
    src = io.BytesIO(data) if isinstance(data, bytes) else Path(data)
    try:
        if isinstance(data, bytes):
            head = data[:4]
        else:
            with Path(data).open("rb") as fh:
                head = fh.read(4)
    except FileNotFoundError:
        raise ConfigError(f"kernel model {where} does not exist") from None
    except OSError as e:
        raise ConfigError(f"{where}: cannot read ({e.strerror or e})") from None
    if head != b"PK\x03\x04":  # an .npz is a zip of arrays; anything else would reach pickle's path
        raise ConfigError(f"{where}: not a kernel model artifact (a .npz written by `trainsim fit`; "
                          f"this file starts with {head!r})")  # fmt: skip
    try:
        with np.load(src, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise ConfigError(f"kernel model {where} does not exist") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        # ValueError: object arrays refused, not an npz; BadZipFile, zlib.error: truncated or corrupt
        # numpy's own message suggests allow_pickle=True: never for artifacts (no code on load)
        why = (
            "it holds Python objects, which trainsim never loads"
            if "pickle" in str(e)
            else str(e).splitlines()[0]
        )
        raise ConfigError(f"{where}: not a kernel model artifact ({why})") from None
    raw = arrays.pop(_MANIFEST, None)
    if raw is None or raw.dtype != np.uint8:
        raise ConfigError(f"{where}: no {_MANIFEST} in the artifact")
    for name, a in arrays.items():  # a NaN leaf would surface later as a NaN prediction
        if a.dtype.kind in "fc" and not np.isfinite(a).all():
            raise ConfigError(f"{where}: array {name!r} holds NaN or infinite values; "
                              "refit the model with `trainsim fit`")  # fmt: skip
    try:
        manifest = json.loads(raw.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{where}: manifest is not JSON ({e})") from None
    try:
        model = model_from_artifact(manifest, arrays)
    except ModelError as e:
        raise ConfigError(f"{where}: {e}") from None
    if isinstance(model, LearnedKernelModel):
        model.origin = where
    return model


def is_kernel_artifact(path: Path | str) -> bool:
    """Whether ``path`` looks like an artifact ``trainsim fit`` wrote (a zip holding its manifest),
    without loading it: a cheap check before replacing a file."""
    try:
        with zipfile.ZipFile(path) as z:
            return f"{_MANIFEST}.npy" in z.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def load_model(path: Path | str) -> KernelModel:
    return read_artifact(Path(path))


@cache
def _shipped_files() -> tuple[tuple[str, bytes, str | None], ...]:
    """(file name, bytes, manifest device or None where unreadable) of each packaged artifact."""
    folder = resources.files("trainsim.kernels").joinpath("data")
    if not folder.is_dir():
        return ()
    out = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".npz"):
            data = entry.read_bytes()
            try:  # the manifest alone: an npz decompresses its arrays one by one, on access
                with np.load(io.BytesIO(data), allow_pickle=False) as z:
                    device = json.loads(z[_MANIFEST].tobytes().decode("utf-8")).get("device")
            except (OSError, ValueError, KeyError, zipfile.BadZipFile):  # read_artifact says what, on load
                device = None
            out.append((entry.name, data, device if isinstance(device, str) else None))
    return tuple(out)


@cache
def _shipped_for(device_name: str | None) -> tuple[KernelModel, ...]:
    """The packaged artifacts whose manifest names ``device_name`` (all of them for None)."""
    out: list[KernelModel] = []
    for name, data, device in _shipped_files():
        if device_name is not None and device is not None and device != device_name:
            continue
        try:
            out.append(read_artifact(data, f"packaged kernel model {name}"))
        except ConfigError as e:
            raise ModelError(f"{e} (the package is broken; reinstall trainsim)") from None
    return tuple(out)


def shipped_models() -> tuple[KernelModel, ...]:
    """The calibrated artifacts inside the package, by file name."""
    return _shipped_for(None)


def _build_spec_models(dev: DeviceSpec) -> tuple[KernelModel, ...]:
    out: list[KernelModel] = []
    if dev.l2_cache_bytes is not None and dev.sm_count is not None:
        out += [EmbeddingLookupModel(dev, reuse_factors=True), EmbeddingLookupModel(dev)]
    out.append(RooflineModel(dev))
    return tuple(out)


@cache
def _spec_models(device_name: str) -> tuple[KernelModel, ...]:
    return _build_spec_models(get_device(device_name))


USER_MODELS_ENV = KERNEL_MODELS_ENV  # the user's artifacts (envvars.joined_paths)


@cache
def _user_models(paths: str) -> tuple[KernelModel, ...]:
    return tuple(load_model(p) for p in split_paths(paths))


def user_models() -> tuple[KernelModel, ...]:
    """Artifacts a user calibrated (``$TRAINSIM_KERNEL_MODELS``, set by ``--kernel-models``):
    they answer before the shipped ones for the device they were fitted on. An environment
    variable, so that screening worker processes see them too."""
    return _user_models(os.environ.get(USER_MODELS_ENV, ""))


def models_for(device: DeviceSpec | str) -> list[KernelModel]:
    """The user's calibrated models of ``device``, the shipped ones (learned, then rooflines),
    then its spec-based models."""
    spec = device if isinstance(device, DeviceSpec) else get_device(device)
    # models and devices meet by catalog name: a YAML copy named by an alias of its part
    # (``name: NVIDIA A100-SXM4-80GB``) is that part, as the catalog's lookups have it
    name = catalog_name(spec.name)
    mine = [m for m in (*user_models(), *_shipped_for(name)) if catalog_name(m.device) == name]
    learned: list[KernelModel] = [m for m in mine if isinstance(m, LearnedKernelModel)]
    rest = [m for m in mine if not isinstance(m, LearnedKernelModel)]
    cataloged = any(d.name == spec.name and d == spec for d in list_devices())
    spec_based = _spec_models(spec.name) if cataloged else _build_spec_models(spec)
    if not cataloged and (source := edited_catalog_device(spec)) is not None:
        # an edited copy of a catalog device: the measured answers carried to its roofline
        # (:mod:`trainsim.kernels.rescaled`); the spec-based ones are its own already
        # (a model measured on this very spec, e.g. a user's artifact fitted on the device file
        # they give here, answers as it is)
        learned, rest = ([m if measured_on(m, spec) else RescaledKernelModel(m, source, spec) for m in ms]
                         for ms in (learned, rest))  # fmt: skip
    return [*learned, *rest, *spec_based]


def registered_models() -> list[KernelModel]:
    """Every model trainsim can answer with out of the box (what the conformance test checks)."""
    return [*shipped_models(), *(m for d in list_devices() for m in _spec_models(d.name))]


def predict_query(q: KernelQuery, device: DeviceSpec | str, *,
                  models: Sequence[KernelModel] | None = None) -> KernelPrediction:  # fmt: skip
    """The first model for ``device`` that supports ``q`` answers it."""
    for m in models if models is not None else models_for(device):
        if m.supports(q):
            return m.predict(q)
    spec = op_spec(q.op) if q.op in OPS else None
    need = ", ".join(spec.inputs) if spec else "?"
    have = ", ".join(sorted(q.inputs)) or "none"
    name = device if isinstance(device, str) else device.name
    raise NotCalibratedError(
        f"no kernel model for {q.family.value} {q.key.label} on {name}: operator {q.op} needs inputs "
        f"{need} (the kernel has: {have}); give them in Kernel.features, or flops and bytes"
    )


def predict_kernel(kernel: Kernel, device: DeviceSpec | str, *,
                   models: Sequence[KernelModel] | None = None) -> tuple[float, str]:  # fmt: skip
    """Seconds for ``kernel`` on ``device`` and where the number came from:
    ``calibrated:<dataset>`` when a fitted model covers it, else ``spec-based:<device>``.

    Raises :class:`~trainsim.errors.NotCalibratedError` when no model can answer (the kernel's
    features do not say what the operator needs, see :mod:`trainsim.kernels.model`)."""
    p = predict_query(query_from_kernel(kernel), device, models=models)
    return p.duration_s, p.provenance
