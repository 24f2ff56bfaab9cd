"""Every registered comm model honours the contract of ``trainsim.comm.model.CommModel``."""

from __future__ import annotations

import json
from importlib import resources

import numpy as np
import pytest

from trainsim.comm import CalibratedCommModel, CommModel, model_from_dict, registered_models
from trainsim.errors import ModelError
from trainsim.ir.kinds import CollectiveKind as C

SIZES = np.concatenate([[0.0], 2.0 ** np.arange(0, 37, 0.5)])  # 0 B, 1 B .. 64 GiB, half-doublings
MODELS = registered_models()


def _requests(model: CommModel) -> list[tuple[C, int, int | None]]:
    if isinstance(model, CalibratedCommModel):
        out = [(k.kind, k.group_size, k.gpus_per_node) for k in model.cases]
        out += [(k.kind, 4 * k.group_size, k.gpus_per_node) for k in model.cases]  # extrapolated
        return out
    g = model.system.gpus_per_node  # type: ignore[attr-defined]
    kinds = [
        C.ALL_REDUCE,
        C.ALL_GATHER,
        C.REDUCE_SCATTER,
        C.ALL_TO_ALL,
        C.ALL_TO_ALLV,
        C.BROADCAST,
        C.REDUCE,
        C.SEND,
        C.RECV,
    ]
    return [(k, n, None) for k in kinds for n in sorted({1, 2, g, 2 * g, 16 * g})]


def test_there_are_models_of_both_provenances():
    kinds = {type(m).__name__ for m in MODELS}
    assert kinds == {"CalibratedCommModel", "HierarchicalModel"}
    assert len([m for m in MODELS if isinstance(m, CalibratedCommModel)]) >= 3


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_non_negative_monotone_deterministic(model):
    for kind, n, g in _requests(model):
        assert model.supports(kind, n, gpus_per_node=g), (kind, n, g)
        t, prov = model.predict_many(kind, SIZES, n, gpus_per_node=g)
        assert np.all(np.isfinite(t)) and np.all(t >= 0), (kind, n)
        assert np.all(np.diff(t) >= -1e-15), f"{kind} on {n}: time decreases with size"
        again, _ = model.predict_many(kind, SIZES[::-1], n, gpus_per_node=g)
        assert np.array_equal(again[::-1], t)  # deterministic, order-independent
        assert prov.split(":")[0] in ("calibrated", "spec-based")
        one = model.predict(kind, float(SIZES[40]), n, gpus_per_node=g)
        assert one.duration_s == pytest.approx(t[40]) and one.provenance == prov


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_supports_is_honoured(model):
    g = model.system.gpus_per_node if model.system else 8  # type: ignore[attr-defined]
    bad = (C.ALL_REDUCE, 2 * (g + 1), g + 1)  # more GPUs per node than the system has
    assert not model.supports(*bad[:2], gpus_per_node=bad[2])
    with pytest.raises(ModelError):
        model.predict(bad[0], 1024.0, bad[1], gpus_per_node=bad[2])
    with pytest.raises(ModelError, match="non-negative"):
        model.predict(C.ALL_REDUCE, -1.0, 2)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_json_artifact_round_trip(model):
    doc = json.loads(json.dumps(model.to_dict()))  # plain JSON, nothing else
    back = model_from_dict(doc)
    assert type(back) is type(model) and back.to_dict() == doc
    for kind, n, g in _requests(model)[:6]:
        a, pa = model.predict_many(kind, SIZES, n, gpus_per_node=g)
        b, pb = back.predict_many(kind, SIZES, n, gpus_per_node=g)
        assert np.array_equal(a, b) and pa == pb


def test_packaged_artifacts_are_json_only():
    files = list(resources.files("trainsim.comm").joinpath("data").iterdir())
    assert files and all(f.name.endswith(".json") for f in files)
    for f in files:
        doc = json.loads(f.read_text(encoding="utf-8"))
        assert doc["schema"] == "trainsim.comm-model/1" and doc["provenance"]["dataset"]
