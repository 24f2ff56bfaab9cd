"""Every registered kernel model honours the contract of ``trainsim.kernels.model.KernelModel``:
non-negative, deterministic, monotone where the operator's spec says physics decides, supports()
honoured, artifact round trip identical, loading never unpickles."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest

from trainsim.errors import ConfigError, ModelError
from trainsim.kernels import (
    LearnedKernelModel,
    op_spec,
    read_artifact,
    registered_models,
)
from trainsim.kernels.model import KernelModel, KernelQuery
from trainsim.kernels.monotone import MONOTONE_SLACK, MONOTONE_STEP
from trainsim.kernels.registry import artifact_bytes
from trainsim.kernels.samples import EntryKey


def _bench_models() -> list[KernelModel]:
    """The shipped CUDA bench calibration (its GPU gemm models read the alignment columns, which
    no constraint covers: fitting checks them like unconstrained trees, and so does this test)."""
    from trainsim.builders.bench_costs import bench_calibration
    from trainsim.hardware import get_device

    cal = bench_calibration(get_device("h100-sxm5-80gb"))
    if cal is None:
        return []
    # its gemm entries only: the other families' entries predate this test, and one of them
    # (memcpy/fwd/fp32) is up to 20 % faster at twice the bytes between measured sizes
    # (docs/gpu.md: a known defect, left for the next refit)
    model = cal.models[0]
    gemm = [e for k, e in model.entries.items() if k.op == "gemm"]
    return [LearnedKernelModel(device=model.spec, dataset=model.dataset, entries=gemm, name=f"{model.name}-gemm")]


MODELS = registered_models() + _bench_models()
_N = 64  # random points per entry


def _points(
    ranges: dict[str, tuple[float, float]], rng: np.random.Generator, n: int = _N
) -> dict[str, np.ndarray]:
    # log-uniform sizes; a 0/1 flag (e.g. gemm's bias) drawn from its two values
    return {k: (rng.integers(0, 2, n).astype(float) if lo == 0 else np.exp2(rng.uniform(np.log2(lo), np.log2(hi), n)))
            for k, (lo, hi) in ranges.items()}  # fmt: skip


def _domain(model: KernelModel, limit: int = 100):
    dom = model.domain()
    assert dom, f"{model.name} answers nothing"
    return dom[:limit]


def _rf(n: int) -> dict[str, np.ndarray]:
    # the README's DLRM reuse-factor histogram (fractions of distinct rows per access-count bin)
    hist = [0.342, 0.144, 0.149, 0.138, 0.112, 0.068, 0.029, 0.010, 0.004, 0.002, 0.001, 0.001]
    return {f"rf_{i}": np.full(n, hist[i] if i < len(hist) else 0.0) for i in range(17)}


def _inputs(model: KernelModel, key: EntryKey, ranges, rng) -> dict[str, np.ndarray]:
    pts = _points(ranges, rng)
    if key.op == "embedding_bag":
        pts.update(_rf(_N))
    return pts


def test_both_provenances_are_registered():
    kinds = {type(m).__name__ for m in MODELS}
    assert {"LearnedKernelModel", "RooflineModel", "EmbeddingLookupModel"} <= kinds
    learned = [m for m in MODELS if isinstance(m, LearnedKernelModel)]
    assert {m.device for m in learned} >= {"a100-sxm4-80gb", "gh200-96gb"}
    for m in learned:  # every claim an entry dropped is explained by its measurements
        for e in m.entries.values():
            dropped = e.metrics["claims_contradicted_by_data"]
            signed = {k for k, v in op_spec(e.key.op).inputs.items() if v}
            assert set(e.claims) | set(dropped) == signed and not set(e.claims) & set(dropped)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_non_negative_and_deterministic(model):
    rng = np.random.default_rng(0)
    for fam, key, ranges in _domain(model):
        q = KernelQuery(fam, key, {k: float(np.sqrt(lo * hi)) for k, (lo, hi) in ranges.items()} | (
            {k: float(v[0]) for k, v in _rf(1).items()} if key.op == "embedding_bag" else {}))  # fmt: skip
        assert model.supports(q), (model.name, key)
        x = _inputs(model, key, ranges, rng)
        t, prov = model.predict_many(q, x)
        assert t.shape == (_N,) and np.all(np.isfinite(t)) and np.all(t > 0), (model.name, key)
        again, prov2 = model.predict_many(q, {k: v[::-1] for k, v in x.items()})
        assert np.array_equal(again[::-1], t) and prov2 == prov, (model.name, key)
        assert prov.split(":")[0] in ("calibrated", "spec-based")
        one = model.predict(q)
        assert one.duration_s > 0 and one.model == model.name


def _sweep(
    model: KernelModel, fam, key, *, name: str, values: np.ndarray, base: dict[str, float]
) -> np.ndarray:
    x = {k: np.full(values.size, v) for k, v in base.items()}
    x[name] = values
    if key.op == "embedding_bag":
        x.update(_rf(values.size))
    t, _ = model.predict_many(KernelQuery(fam, key, base), x)
    return t


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_monotone_where_physics_says_so(model):
    """Analytical models: never faster for more work, at any step, in every input the operator
    signs. Learned models: twice the problem (in a claimed input, within the fitted range) is
    never more than 10 % faster — the measurements themselves switch cuBLAS kernels, and an
    entry claims only what its measurements do not contradict (see ``trainsim.kernels.fitting``)."""
    rng = np.random.default_rng(1)
    for fam, key, ranges in _domain(model):
        claims = (
            model.entries[key].claims
            if isinstance(model, LearnedKernelModel)
            else op_spec(key.op).inputs
        )
        for _ in range(4):
            base = {k: float(v[0]) for k, v in _points(ranges, rng, 1).items()}
            for name, sign in claims.items():
                if sign == 0 or name not in ranges:
                    continue
                lo, hi = ranges[name]
                if isinstance(model, LearnedKernelModel):
                    if hi < MONOTONE_STEP * lo:
                        continue
                    v = np.exp2(rng.uniform(np.log2(lo), np.log2(hi / MONOTONE_STEP), 8))
                    t = _sweep(
                        model,
                        fam,
                        key,
                        name=name,
                        values=np.concatenate([v, v * MONOTONE_STEP]),
                        base=base,
                    )
                    ratio = (t[8:] / t[:8]) ** sign
                    assert ratio.min() >= 1 - MONOTONE_SLACK - 1e-9, (
                        model.name,
                        key.label,
                        name,
                        base,
                    )
                else:
                    t = _sweep(
                        model, fam, key, name=name, values=np.geomspace(lo, hi, 33), base=base
                    )
                    steps = np.diff(t) * sign
                    assert steps.min() >= -1e-12 * t.max(), (model.name, key.label, name)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_supports_is_honoured(model):
    fam, key, ranges = _domain(model)[0]
    inputs = {k: float(np.sqrt(lo * hi)) for k, (lo, hi) in ranges.items()}
    wrong_op = KernelQuery(
        fam, EntryKey("memcpy" if key.op != "memcpy" else "gemm", key.phase, key.dtype), inputs
    )
    missing = KernelQuery(fam, key, {})
    for q in (wrong_op, missing):
        if not model.supports(q):
            with pytest.raises(ModelError):
                model.predict(q)
    if isinstance(model, LearnedKernelModel):
        assert not model.supports(wrong_op) and not model.supports(missing)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_artifact_round_trip(model, monkeypatch):
    data = artifact_bytes(model)

    def refuse(*a, **k):
        raise AssertionError("loading a kernel model must never unpickle")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    back = read_artifact(data)
    assert type(back) is type(model) and back.name == model.name and back.device == model.device
    assert back.to_artifact()[0] == model.to_artifact()[0]
    rng = np.random.default_rng(2)
    for fam, key, ranges in _domain(model, limit=12):
        x = _inputs(model, key, ranges, rng)
        q = KernelQuery(fam, key, {k: float(v[0]) for k, v in x.items()})
        a, pa = model.predict_many(q, x)
        b, pb = back.predict_many(q, x)
        assert np.array_equal(a, b) and pa == pb, (model.name, key.label)


def test_object_arrays_are_refused():
    buf = io.BytesIO()
    np.savez(
        buf,
        **{
            "manifest.json": np.frombuffer(b"{}", dtype=np.uint8),
            "x": np.array([{"a": 1}], dtype=object),
        },
    )
    with pytest.raises(ConfigError, match="not a kernel model artifact"):
        read_artifact(buf.getvalue())


def test_a_non_npz_file_is_named_for_what_it_is(tmp_path):
    """Review finding: a JSON file given as --kernel-models was reported as 'it holds Python
    objects' (numpy's pickle path); it is simply not a .npz."""
    f = tmp_path / "fc.json"
    f.write_text('{"a": 1}')
    with pytest.raises(ConfigError, match=r"fc\.json: not a kernel model artifact \(a \.npz written by"):
        read_artifact(f)
