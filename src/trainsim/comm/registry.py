"""Which comm model answers: shipped calibrated artifacts first, the spec-based hierarchy last.

Artifacts are JSON files (``trainsim.comm-model/1``) in ``trainsim/comm/data``; they load
lazily, once, and never unpickle anything. For a system, :func:`models_for` lists every
calibrated model measured on it, then :class:`HierarchicalModel` from the catalog alone; the
first model that supports a request answers it (:func:`predict_collective`).
"""

from __future__ import annotations

import copy
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from trainsim.comm.calibrated import CalibratedCommModel, anchored_time, beyond_sizes
from trainsim.comm.curves import Curve
from trainsim.comm.hierarchical import HierarchicalModel
from trainsim.comm.model import CommModel, CommPrediction, canonical_kind
from trainsim.comm.samples import CaseKey
from trainsim.comm.sizing import model_size_bytes
from trainsim.envvars import COMM_MODELS_ENV, split_paths
from trainsim.errors import ConfigError, ModelError, read_utf8
from trainsim.hardware import DeviceSpec, SystemSpec, get_system, list_systems
from trainsim.ir.graph import Collective

MODEL_TYPES: dict[str, Callable[[dict[str, Any]], CommModel]] = {
    CalibratedCommModel.model_type: CalibratedCommModel.from_dict,
    HierarchicalModel.model_type: HierarchicalModel.from_dict,
}


def model_from_dict(doc: dict[str, Any]) -> CommModel:
    loader = MODEL_TYPES.get(str(doc.get("model")))
    if "model" not in doc:
        keys = ", ".join(sorted(map(str, doc))[:5]) or "none"
        raise ModelError(f"not a comm model (a JSON `trainsim fit-comm -o` writes, with a 'model' field; "
                         f"this one's top-level keys: {keys})")  # fmt: skip
    if loader is None:
        raise ModelError(
            f"unknown comm model type {doc.get('model')!r}; known: {', '.join(MODEL_TYPES)}"
        )
    return loader(doc)


def _head(p: Path) -> bytes:
    with p.open("rb") as fh:
        return fh.read(4)


def load_model(path: Path | str) -> CommModel:
    p = Path(path)
    if p.is_file() and _head(p) == b"PK\x03\x04":  # an .npz (zip): kernel models
        raise ConfigError(f"{p}: a zip archive (kernel models from trainsim fit are .npz), not a comm model "
                          "(the JSON trainsim fit-comm writes)")  # fmt: skip
    try:
        doc = json.loads(read_utf8(p, "comm model"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p}: not JSON (line {e.lineno}: {e.msg})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{p}: expected a JSON object")
    try:
        return model_from_dict(doc)
    except ModelError as e:
        raise ConfigError(f"{p}: {e}") from None


def save_model(model: CommModel, path: Path | str) -> Path:
    """Write the artifact atomically (temporary file, then rename)."""
    from trainsim.ir.serialize import write_text_atomic

    p = Path(path)
    if p.suffix != ".json":
        raise ConfigError(f"collective model artifacts are .json files, got {p.name}")
    write_text_atomic(p, json.dumps(_finite(model.to_dict()), indent=1, allow_nan=False) + "\n")
    return p


def _finite(doc: Any) -> Any:
    """``doc`` with NaN numbers as ``null`` (a held-out error that could not be measured, e.g.
    ``--holdout 0``): standard JSON has no NaN, and other readers refuse it."""
    if isinstance(doc, float) and math.isnan(doc):
        return None
    if isinstance(doc, dict):
        return {k: _finite(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [_finite(v) for v in doc]
    return doc


@cache
def shipped_models() -> tuple[CalibratedCommModel, ...]:
    """The calibrated artifacts inside the package, by file name."""
    out: list[CalibratedCommModel] = []
    for entry in sorted(
        resources.files("trainsim.comm").joinpath("data").iterdir(), key=lambda e: e.name
    ):
        if entry.name.endswith(".json"):
            try:
                model = model_from_dict(json.loads(entry.read_text(encoding="utf-8")))
            except (ModelError, json.JSONDecodeError) as e:
                raise ModelError(f"packaged comm model {entry.name} is broken: {e}") from None
            if not isinstance(model, CalibratedCommModel):
                raise ModelError(f"packaged comm model {entry.name} is not a calibrated model")
            out.append(model)
    return tuple(out)


USER_MODELS_ENV = COMM_MODELS_ENV  # the user's artifacts (envvars.joined_paths)


@cache
def _user_models(paths: str) -> tuple[CalibratedCommModel, ...]:
    out = []
    for p in split_paths(paths):
        m = load_model(p)
        if not isinstance(m, CalibratedCommModel):
            raise ConfigError(f"{p}: not a calibrated comm model (a `trainsim fit-comm` artifact)")
        out.append(m)
    return tuple(out)


def user_models() -> tuple[CalibratedCommModel, ...]:
    """Artifacts a user fitted (``$TRAINSIM_COMM_MODELS``, set by ``--comm-models``): they
    answer before the shipped ones on the system they were measured on."""
    return _user_models(os.environ.get(USER_MODELS_ENV, ""))


def models_for(system: SystemSpec | str) -> list[CommModel]:
    """The user's and the shipped calibrated models measured on ``system``, then those measured
    on a network twin of it (:func:`network_twins`), then its spec-based hierarchical model."""
    spec = get_system(system) if isinstance(system, str) else system
    return list(_models_for(spec, os.environ.get(USER_MODELS_ENV, "")))


@lru_cache(maxsize=64)
def _models_for(spec: SystemSpec, _user_env: str) -> tuple[CommModel, ...]:
    """Cached per system and user artifacts (a search asks for every plan's collectives)."""
    every = (*user_models(), *shipped_models())
    calibrated: list[CommModel] = [m for m in every if m.system is not None and same_system(m.system, spec)]
    twins: list[CommModel] = [_as_twin(m) for m in every
                              if m.system is not None and not same_system(m.system, spec) and network_twins(m.system, spec)]  # fmt: skip
    return (*calibrated, *twins, HierarchicalModel(spec))


_DOCUMENTARY = {"aliases", "description", "sources"}  # what no collective's time depends on


def _device_name(device: str) -> str:
    """The GPU a system's ``device`` field resolves to, by name: the collectives measured on a
    network stand for it with a copy of its GPU that edits FLOP/s, memory or link fields (the
    tiers carry the network's rates; kernels carry a compute edit, trainsim.kernels.rescaled)."""
    from trainsim.hardware import catalog_name, get_device

    return catalog_name(get_device(device).name)  # a copy named by an alias of the part is the part


def _differing(a: SystemSpec, b: SystemSpec) -> list[str]:
    """The fields in which ``a`` and ``b`` differ as networks: documentation (aliases,
    description, sources) aside, and the device by its name and links, not by how it is
    spelled (a YAML path to a copy of the catalog part is that part, :func:`_device_name`)."""
    da, db = a.model_dump(exclude=_DOCUMENTARY | {"device"}), b.model_dump(exclude=_DOCUMENTARY | {"device"})
    out = [k for k in da if da[k] != db.get(k)]
    if a.device != b.device and _device_name(a.device) != _device_name(b.device):
        out.append("device")
    return out


def same_system(a: SystemSpec, b: SystemSpec) -> bool:
    """Whether ``a`` and ``b`` are one system: the same name and the same network
    (:func:`_differing`). A YAML copy of a catalog system that keeps its name but edits its
    tiers, or names another GPU, is another network, and its measurements do not stand for it."""
    return a.name == b.name and not _differing(a, b)


def shadowed_note(system: SystemSpec) -> str | None:
    """Why calibrated models measured on a system of ``system``'s name do not answer for it
    (its spec differs from theirs, and not as a network twin), else None."""
    return _shadowed_note(system, os.environ.get(USER_MODELS_ENV, ""))


@lru_cache(maxsize=64)
def _shadowed_note(system: SystemSpec, _user_env: str) -> str | None:
    spec_models = [m for m in (*user_models(), *shipped_models()) if m.system is not None
                   and m.system.name == system.name and not same_system(m.system, system)
                   and not network_twins(m.system, system)]  # fmt: skip
    if not spec_models:
        return None
    assert spec_models[0].system is not None
    fields = _differing(system, spec_models[0].system)
    names = ", ".join(m.dataset for m in spec_models)
    return (f"the comm models calibrated on {system.name} ({names}) do not answer for this system: it keeps "
            f"that name, but differs from theirs in {', '.join(fields)}")  # fmt: skip


def network_twins(a: SystemSpec, b: SystemSpec) -> bool:
    """Whether collectives measured on ``a`` stand for ``b``: the same GPUs per node, sibling
    GPUs (:meth:`~trainsim.hardware.schema.DeviceSpec.is_sibling_of`: A100 40 and 80 GB), and
    tier for tier the same kind, scope, bandwidth, latency and NICs (the catalog's DGX A100
    and Azure ND A100 v4: NVSwitch and one 200 Gb/s HDR NIC per GPU). Names aside. A GPU that
    is a YAML copy of a catalog part (by name or alias) is judged as that part, as
    :func:`same_system` takes it: a FLOP/s edit is no network's."""
    from trainsim.hardware import find_device, get_device

    def gpu(device: str) -> DeviceSpec:
        d = get_device(device)
        return find_device(d.name) or d

    if a.gpus_per_node != b.gpus_per_node or len(a.tiers) != len(b.tiers):
        return False
    if not gpu(a.device).is_sibling_of(gpu(b.device)):
        return False
    return all(x.model_dump(exclude={"name"}) == y.model_dump(exclude={"name"}) for x, y in zip(a.tiers, b.tiers, strict=True))


def _as_twin(model: CalibratedCommModel) -> CalibratedCommModel:
    """``model`` answering for a twin system: the same curves, provenance naming where they
    were measured (``calibrated:<dataset>;twin-system:<system>``)."""
    twin = copy.copy(model)
    assert model.system is not None
    twin.dataset = f"{model.dataset};twin-system:{model.system.name}"
    return twin


def registered_models() -> list[CommModel]:
    """Every model trainsim can answer with out of the box (what the conformance test checks)."""
    return [*shipped_models(), *(HierarchicalModel(s) for s in list_systems())]


def predict_collective(kind: str, nbytes: float, group_size: int, *, system: SystemSpec | str,
                       gpus_per_node: int | None = None, models: Sequence[CommModel] | None = None) -> CommPrediction:  # fmt: skip
    """Seconds for one collective on ``system``: from the first model that measured this very
    case (collective, nodes, GPUs per node), else the first that supports it (extrapolating
    from another case, or the hierarchical model). A user's artifact with one case thus
    answers that case and leaves the others to the models that measured them."""
    spec = system if isinstance(system, SystemSpec) else None
    if spec is not None and spec.max_nodes is not None:
        nodes = -(-group_size // max(gpus_per_node or spec.gpus_per_node, 1))
        if nodes > spec.max_nodes:  # a calibrated model would answer it: the catalog says no
            raise ConfigError(f"{kind} on {group_size} ranks spans {nodes} nodes; {spec.name} has {spec.max_nodes} (its max_nodes)")  # fmt: skip
    candidates = list(models if models is not None else models_for(system))
    for model in candidates:
        if isinstance(model, CalibratedCommModel) and model.measured(
            kind, group_size, gpus_per_node=gpus_per_node
        ):
            return model.predict(kind, nbytes, group_size, gpus_per_node=gpus_per_node)
    calibrated = [m for m in candidates if isinstance(m, CalibratedCommModel)]
    if not any(m.supports(kind, group_size, gpus_per_node=gpus_per_node) for m in calibrated):
        derived = _derived(kind, nbytes, group_size, calibrated, gpus_per_node)
        if derived is not None:
            return derived
    for model in candidates:
        if model.supports(kind, group_size, gpus_per_node=gpus_per_node):
            return model.predict(kind, nbytes, group_size, gpus_per_node=gpus_per_node)
    name = system if isinstance(system, str) else system.name
    raise ModelError(f"no comm model for {kind} on {group_size} ranks of {name}")


# A collective no calibrated model covers, from a sibling one measured on the same system: in
# the ring algorithm NCCL runs, reduce-scatter and all-gather of an n-byte buffer take the same
# g - 1 steps of n/g bytes, and all-reduce is the two in turn (2(g - 1) steps). Better than the
# spec-based model at full link rates beside a measured sibling (Perlmutter: a 470 MB
# reduce-scatter at 56 ms spec-based against a measured 579 ms all-reduce made ZeRO-2 the
# fastest plan by accident). Approximation: NCCL's tree all-reduce is not two ring halves.
_SIBLINGS = {"reduce_scatter": (("all_gather", 1.0), ("all_reduce", 0.5)),
             "all_gather": (("reduce_scatter", 1.0), ("all_reduce", 0.5))}  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Scaled:
    """A measured curve times a constant (a sibling collective's, :data:`_SIBLINGS`)."""

    curve: Curve
    factor: float

    def __call__(self, nbytes: ArrayLike) -> np.ndarray:
        return self.factor * np.asarray(self.curve(nbytes), dtype=float)

    def to_dict(self) -> dict[str, Any]:
        return {"scaled_by": self.factor, "curve": self.curve.to_dict()}


def _derived(kind: str, nbytes: float, group_size: int, calibrated: Sequence[CalibratedCommModel],
             gpus_per_node: int | None) -> CommPrediction | None:  # fmt: skip
    """``kind`` from a sibling: measured on this very case, else measured on another and
    derived there, then moved to this case by the hierarchical model *of ``kind``* (as a
    measured ``kind`` would be, :func:`~trainsim.comm.calibrated.anchored_time`): the relation
    holds on the measured case, and beyond it the algorithms part (a tree all-reduce's latency
    grows with log g, a ring all-gather's with g: half an all-reduce extrapolated to 100k GPUs
    made a 404 MB all-gather 3.7 ms)."""
    for sibling, factor in _SIBLINGS.get(kind, ()):
        for m in calibrated:
            if m.measured(sibling, group_size, gpus_per_node=gpus_per_node):
                p = m.predict(sibling, nbytes, group_size, gpus_per_node=gpus_per_node)
                how = f";derived-from:{sibling}" + ("/2" if factor != 1.0 else "")
                return CommPrediction(p.duration_s * factor, p.provenance + how, p.model)
    for sibling, factor in _SIBLINGS.get(kind, ()):
        for m in calibrated:
            if not m.supports(sibling, group_size, gpus_per_node=gpus_per_node) or m.hier is None:
                continue
            key, anchor = m.resolve(sibling, group_size, gpus_per_node)
            curve = m.cases[anchor].curve  # the sibling's, measured on the anchor case
            target = canonical_kind(kind)
            t = anchored_time(m.hier, CaseKey(target, anchor.nodes, anchor.gpus_per_node), _Scaled(curve, factor),
                              CaseKey(target, key.nodes, key.gpus_per_node), [nbytes])[0]  # fmt: skip
            how = (f"calibrated:{m.dataset};extrapolated-from:{anchor.nodes}x{anchor.gpus_per_node}"
                   f"{beyond_sizes(m.cases[anchor], [nbytes])}"
                   f";derived-from:{sibling}" + ("/2" if factor != 1.0 else ""))  # fmt: skip
            return CommPrediction(float(t), how, m.name)
    return None


def collective_supported(kind: str, group_size: int, models: Sequence[CommModel], *,
                         gpus_per_node: int | None = None) -> bool:
    """Whether :func:`predict_collective` over ``models`` answers ``kind`` on ``group_size``
    ranks: a model supports it, or a calibrated one a sibling it derives from."""
    if any(m.supports(kind, group_size, gpus_per_node=gpus_per_node) for m in models):
        return True
    return any(isinstance(m, CalibratedCommModel) and m.supports(sib, group_size, gpus_per_node=gpus_per_node)
               for sib, _ in _SIBLINGS.get(kind, ()) for m in models)  # fmt: skip


def predict_ir_collective(c: Collective, *, system: SystemSpec | str, members: dict[int, Collective] | None = None,
                          gpus_per_node: int | None = None) -> CommPrediction:  # fmt: skip
    """An IR collective, sized by :func:`trainsim.comm.sizing.model_size_bytes` (000 §III-C)."""
    return predict_collective(c.kind, model_size_bytes(c, members), max(c.group_size, 1), system=system,
                              gpus_per_node=gpus_per_node)  # fmt: skip
