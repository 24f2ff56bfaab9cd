"""predict_kernel: calibrated where a fitted model covers the kernel, spec-based otherwise,
NotCalibratedError when nothing can answer; artifacts are written atomically."""

from __future__ import annotations

import pytest

from trainsim.errors import ConfigError, ModelError, NotCalibratedError
from trainsim.ir.graph import Kernel
from trainsim.ir.kinds import KernelFamily as F
from trainsim.kernels import RooflineModel, load_model, predict_kernel, save_model
from trainsim.kernels.registry import MODEL_TYPES, register_model_type

LINEAR1 = {
    "op": "linear1",
    "phase": "fwd",
    "mp": 1,
    "b": 2,
    "l": 1024,
    "dim": 5632,
}  # 001's first A100 row


def _k(family: F, **features) -> Kernel:
    return Kernel(1, "k", family, 7, features=features)


def test_calibrated_on_the_measured_device():
    s, prov = predict_kernel(_k(F.GEMM, **LINEAR1), "a100")
    assert prov == "calibrated:a100-sxm4-80gb_perlmutter-operator"
    assert s == pytest.approx(1728.8e-6, rel=0.10)  # measured 1728.8 µs
    s_gh, prov_gh = predict_kernel(_k(F.GEMM, **LINEAR1), "gh200")
    assert prov_gh == "calibrated:gh200-120gb_vista-operator" and s_gh < s


def test_spec_based_elsewhere_and_a_lower_bound():
    _, prov = predict_kernel(_k(F.GEMM, **LINEAR1), "h100")
    assert prov == "spec-based:h100-sxm5-80gb"
    spec_a100, _ = predict_kernel(
        _k(F.GEMM, **LINEAR1), "a100", models=[RooflineModel(_dev("a100"))]
    )
    assert spec_a100 < 1728.8e-6  # datasheet peaks: faster than measured


def _dev(name: str):
    from trainsim.hardware import get_device

    return get_device(name)


def test_outside_the_measured_range_the_answer_grows_with_the_work():
    inside, _ = predict_kernel(_k(F.GEMM, **{**LINEAR1, "dim": 8192}), "a100")
    outside, prov = predict_kernel(_k(F.GEMM, **{**LINEAR1, "dim": 16384}), "a100")
    assert prov.endswith(";extrapolated") and outside > 3.0 * inside  # 4x the FLOPs


def _shipped_linear1():
    from trainsim.kernels.calibrated import LearnedKernelModel
    from trainsim.kernels.registry import models_for

    shipped = next(m for m in models_for("a100") if isinstance(m, LearnedKernelModel))
    return shipped, next(e for e in shipped.entries.values() if e.key.label == "linear1/fwd/fp16")


def test_below_the_measured_range_the_answer_follows_the_entry_efficiency_curve():
    """Outside its range an entry scales its answer at the clipped point by its efficiency
    curve's ratio; an entry without a curve (an older artifact) by the roofline's."""
    from dataclasses import replace

    import numpy as np

    from trainsim.kernels.features import derive, op_spec, roofline_s

    shipped, entry = _shipped_linear1()
    dev = shipped.spec
    assert entry.curve is not None and entry.curve.samples == entry.samples
    assert entry.metrics["carried_outside_range_along"] == "efficiency curve"
    small = {"mp": np.array([1.0]), "b": np.array([1.0]), "l": np.array([1024.0]), "dim": np.array([1024.0])}
    clip = {k: np.clip(v, *entry.ranges[k]) for k, v in small.items()}
    assert clip["b"][0] == 2 and clip["dim"][0] == 2048  # 001 measured b >= 2, dim >= 2048
    at_clip, inside = entry.predict(clip, dev)
    t, outside = entry.predict(small, dev)
    assert outside and not inside

    def roof(x):
        w = derive(op_spec("linear1"), x, "fp16")
        return roofline_s(w["flops"], w["bytes"], dev, "fp16")

    r_x, r_c = roof(small), roof(clip)
    assert t == pytest.approx(at_clip * entry.curve(r_x) / entry.curve(r_c), rel=1e-9)
    old, _ = replace(entry, curve=None).predict(small, dev)
    assert old == pytest.approx(at_clip * r_x / r_c, rel=1e-9)
    # 001's smaller GEMMs run further from the peak than its larger ones: the curve says so
    assert t > old


def test_an_artifact_keeps_each_entry_curve_and_refuses_a_broken_one(tmp_path):
    import json

    import numpy as np

    from trainsim.kernels.calibrated import LearnedKernelModel

    shipped, entry = _shipped_linear1()
    path = save_model(LearnedKernelModel(device=shipped.spec, dataset=shipped.dataset, entries=[entry]),
                      tmp_path / "m.npz")  # fmt: skip
    (back,) = load_model(path).entries.values()
    assert np.array_equal(back.curve.u, entry.curve.u) and np.array_equal(back.curve.g, entry.curve.g)
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    manifest = json.loads(arrays["manifest.json"].tobytes())

    def rewrite(name, edit):
        doc = json.loads(json.dumps(manifest))
        edit(doc["entries"][0])
        out = tmp_path / name
        np.savez(out, **{**arrays, "manifest.json": np.frombuffer(json.dumps(doc).encode(), dtype=np.uint8)})
        return out

    # an artifact written before entries kept curves loads, and carries along the roofline
    (old,) = load_model(rewrite("old.npz", lambda e: e.pop("curve"))).entries.values()
    assert old.curve is None
    for name, edit in (("reversed.npz", lambda e: e["curve"].update(u=e["curve"]["u"][::-1])),
                       ("unsized.npz", lambda e: e["curve"].pop("samples"))):  # fmt: skip
        with pytest.raises(ConfigError, match=rf"{name.replace('.', '[.]')}: entry linear1/fwd/fp16: efficiency curve: "
                                              r"expected .* with u increasing"):  # fmt: skip
            load_model(rewrite(name, edit))


def test_fitting_drops_a_curve_whose_carry_breaks_a_monotone_claim():
    """A curve whose factor swings with the clipped point: fitting checks the carry across and
    beyond the range and falls back to the roofline, saying why."""
    from dataclasses import replace

    import numpy as np

    from trainsim.kernels.fitting import _carrying
    from trainsim.kernels.roofline import EfficiencyCurve

    shipped, entry = _shipped_linear1()
    # efficiency that jumps eightfold up and down across the measured sizes: carried answers jump too
    u = np.linspace(entry.curve.u.min(), entry.curve.u.max(), 12)
    jagged = replace(entry, curve=EfficiencyCurve(u, np.where(np.arange(12) % 2, 3.0, 0.0), entry.samples))
    rng = np.random.default_rng(0)
    inputs = {k: np.exp2(rng.uniform(np.log2(a), np.log2(b), 200)) for k, (a, b) in entry.ranges.items()}
    rows = np.arange(200)
    kept, why = _carrying(jagged, inputs, rows, shipped.spec, seed=0, strict=False)
    assert kept.curve is None and why.startswith("roofline (along the efficiency curve a claimed input moved")
    assert _carrying(entry, inputs, rows, shipped.spec, seed=0, strict=False) == (entry, "efficiency curve")
    assert _carrying(replace(entry, curve=None), inputs, rows, shipped.spec, seed=0, strict=False)[1] == "roofline"


def test_an_entry_reading_a_column_its_operator_lacks_names_it():
    # an artifact fitted by another trainsim version: a clear error, not an index failure
    from dataclasses import replace

    from trainsim.kernels.calibrated import LearnedKernelModel
    from trainsim.kernels.registry import models_for

    shipped = next(m for m in models_for("a100") if isinstance(m, LearnedKernelModel))
    entries = [replace(e, columns=(*e.columns, "in:nonesuch")) if e.key.op == "linear1" else e
               for e in shipped.entries.values()]  # fmt: skip
    model = LearnedKernelModel(device=shipped.spec, dataset=shipped.dataset, entries=entries)
    with pytest.raises(ModelError, match=r"reads column 'in:nonesuch', which operator linear1 does not make on a100"):
        predict_kernel(_k(F.GEMM, **LINEAR1), "a100", models=[model])


def test_generic_kernels_and_work():
    s, prov = predict_kernel(_k(F.GEMM, m=4096, n=4096, k=4096, dtype="bf16"), "h100")
    assert prov == "spec-based:h100-sxm5-80gb" and s == pytest.approx(2 * 4096**3 / 989e12)
    s, prov = predict_kernel(_k(F.ELEMENTWISE, flops=1e6, bytes=4e9), "a100")
    assert prov.startswith("spec-based") and s == pytest.approx(4e9 / 2039e9)


def test_not_calibrated_says_what_is_missing():
    with pytest.raises(NotCalibratedError, match="op="):
        predict_kernel(_k(F.SOFTMAX), "a100")
    with pytest.raises(NotCalibratedError, match="needs inputs mp, b, l, dim"):
        predict_kernel(_k(F.GEMM, op="linear1", b=2), "a100")
    with pytest.raises(ConfigError, match="unknown device"):
        predict_kernel(_k(F.GEMM, **LINEAR1), "no-such-gpu")


def test_save_is_atomic_and_npz_only(tmp_path):
    model = RooflineModel(_dev("a100"))
    out = save_model(model, tmp_path / "m.npz")
    assert [p.name for p in tmp_path.iterdir()] == ["m.npz"]
    back = load_model(out)
    assert back.name == model.name
    with pytest.raises(ConfigError, match=r"\.npz"):
        save_model(model, tmp_path / "m.pkl")
    with pytest.raises(ConfigError, match="does not exist"):
        load_model(tmp_path / "missing.npz")


def test_model_types_have_a_duplicate_guard():
    with pytest.raises(ModelError, match="registered twice"):
        register_model_type("learned", MODEL_TYPES["learned"])


def test_simulator_adapter_reads_traced_gemm_shapes():
    from trainsim.ir.graph import Op, TensorMeta
    from trainsim.ir.kinds import OpCategory
    from trainsim.kernels.adapter import SimKernelModels, features_from_op
    from trainsim.sim.durations import KernelModel, Prediction

    kern = Kernel(3, "ampere_sgemm_128x64_nn", F.GEMM, 7)
    op = Op(1, "aten::mm", 1, OpCategory.COMPUTE, kernels=(kern,),
            inputs=(TensorMeta((512, 1024), "float"), TensorMeta((1024, 256), "float")))  # fmt: skip
    assert features_from_op(op, kern) == {
        "op": "gemm",
        "batch": 1,
        "m": 512,
        "k": 1024,
        "n": 256,
        "dtype": "fp32",
    }
    adapter = SimKernelModels()
    assert isinstance(adapter, KernelModel)
    v100 = _dev("v100")
    assert adapter.supports(kern, op, v100) and not adapter.supports(kern, op, None)
    p = adapter.predict(kern, op, v100)
    assert isinstance(p, Prediction) and p.provenance == "spec-based:v100-sxm2-32gb"
    assert p.seconds == pytest.approx(max(2e-6, 2 * 512 * 1024 * 256 / 15.7e12))


def test_gemm_inputs_of_each_torch_call():
    from trainsim.kernels.features import gemm_inputs

    assert gemm_inputs("linear", [(4, 8, 16), (32, 16), (32,)]) == {"batch": 1, "m": 32, "k": 16, "n": 32, "bias": 1, "wt": 1}
    assert gemm_inputs("linear", [(4, 16), (32, 16)])["bias"] == 0  # type: ignore[index]
    assert gemm_inputs("addmm", [(32,), (4, 16), (16, 32)]) == {"batch": 1, "m": 4, "k": 16, "n": 32, "bias": 1}
    assert gemm_inputs("bmm", [(3, 4, 16), (3, 16, 32)]) == {"batch": 3, "m": 4, "k": 16, "n": 32}
    assert gemm_inputs("mm", [(4, 16), (8, 32)]) is None  # inner sizes differ
    assert gemm_inputs("conv2d", [(1, 3, 8, 8), (4, 3, 3, 3)]) is None
