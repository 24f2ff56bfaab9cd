"""The operator table: Table I shapes, physics per operator, monotone column signs."""

from __future__ import annotations

import numpy as np
import pytest

from trainsim.errors import ModelError
from trainsim.hardware import get_device
from trainsim.kernels import OPS, derive, op_spec
from trainsim.kernels.features import (
    OpSpec,
    _register,
    column_signs,
    model_columns,
    roofline_s,
    vocab_partition,
)

A100 = get_device("a100")


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_operator_derives_positive_work(name):
    spec = op_spec(name)
    w = derive(spec, spec.example)
    assert np.all(w["bytes"] > 0) and np.all(w["flops"] >= 0)
    names, mat = model_columns(
        spec, {k: np.array([v, 2 * v]) for k, v in spec.example.items()}, device=A100
    )
    assert mat.shape == (2, len(names)) and np.all(np.isfinite(mat))
    _, signs, conflicts = column_signs(spec, spec.example, device=A100)
    assert not conflicts, (name, conflicts)
    assert len(signs) == len(names)


def test_table_one_shapes():
    x = {"mp": 2.0, "b": 4.0, "l": 2048.0, "dim": 4096.0, "h": 32.0}
    w = derive(op_spec("linear1"), x)  # [bl, d, 3d/mp]
    assert (float(w["m"]), float(w["k"]), float(w["n"])) == (8192.0, 4096.0, 6144.0)
    w = derive(op_spec("linear4"), x)  # [bl, 4d/mp, d]
    assert (float(w["m"]), float(w["k"]), float(w["n"])) == (8192.0, 8192.0, 4096.0)
    w = derive(op_spec("baddbmm"), x)  # QK^T: [b(h/mp), l, d/h, l]
    assert (float(w["batch"]), float(w["m"]), float(w["k"]), float(w["n"])) == (
        64.0,
        2048.0,
        128.0,
        2048.0,
    )
    w = derive(op_spec("flash_atten"), x)  # [b, l, h/mp, d/h]: 4·b·(h/mp)·l²·(d/h) FLOPs
    assert float(w["flops"]) == 4 * 4 * 16 * 2048**2 * 128


def test_vocabulary_partition_follows_eq_1_2():
    assert float(vocab_partition(np.array(1.0))) == 50304.0  # 50257 -> multiple of 128
    assert float(vocab_partition(np.array(8.0))) == 6400.0  # ceil(50257 / 1024) * 128


def test_roofline_is_max_of_compute_and_memory():
    w = derive(op_spec("gemm"), {"m": 8192, "n": 8192, "k": 8192})
    t = float(roofline_s(w["flops"], w["bytes"], A100, "fp16"))
    assert t == pytest.approx(2 * 8192**3 / 312e12)
    w = derive(op_spec("elementwise"), {"numel": 2**28})
    assert float(roofline_s(w["flops"], w["bytes"], A100, "fp16")) == pytest.approx(
        3 * 2 * 2**28 / 2039e9
    )


def test_signed_inputs_move_columns_one_way():
    names, signs, _ = column_signs(
        op_spec("linear2"), {"mp": 2.0, "b": 4.0, "l": 2048.0, "dim": 4096.0}, device=A100
    )
    s = dict(zip(names, signs, strict=True))
    assert s["in:mp"] == -1 and s["d:k"] == 1 and s["d:flops"] == 1 and s["tiles"] == 1


def test_missing_input_is_named():
    with pytest.raises(ModelError, match="needs input 'dim'"):
        derive(op_spec("linear1"), {"mp": 1, "b": 1, "l": 1})


def test_operator_registered_twice_is_an_error():
    with pytest.raises(ModelError, match="registered twice"):
        _register(OpSpec("gemm", OPS["gemm"].family, {"m": 1}, OPS["gemm"].derive, {"m": 1.0}))


def test_gpu_gemm_alignment_columns():
    """On a GPU the generic gemm reads each size's largest power-of-two divisor (up to 256): LLM
    shapes aligned to 128-1,024 run faster than the draws aligned to 8. The columns have no
    monotone sign and never conflict; a CPU and the paper-001 operators do not get them."""
    import numpy as np

    from trainsim.hardware import get_device
    from trainsim.kernels.features import (
        ALIGN_COLUMNS,
        column_signs,
        model_columns,
        op_spec,
        pow2_divisor,
    )

    assert list(pow2_divisor(np.array([8192.0, 14336.0, 4000.0, 50257.0, 1.0, 24.4]))) == [256, 256, 32, 1, 1, 8]
    assert list(pow2_divisor(np.array([0.0, -8.0, np.nan, np.inf, 2.0**70, 2.0**70 + 2.0**20 * 3]))) == [
        1, 1, 1, 1, 256, 256]  # fmt: skip
    from trainsim.bench.samples import BENCH_DATA

    gpu, cpu = get_device("h100-sxm5-80gb"), get_device(str(BENCH_DATA / "cpu_full_97317d12607a0598.device.yaml"))
    x = {"batch": np.array([1.0, 1.0]), "m": np.array([8192.0, 8200.0]), "n": np.array([4096.0, 4104.0]),
         "k": np.array([14336.0, 14344.0]), "bias": np.array([0.0, 0.0]), "wt": np.array([1.0, 1.0])}  # fmt: skip
    names, mat = model_columns(op_spec("gemm"), x, device=gpu, dtype="bf16")
    assert set(names) >= ALIGN_COLUMNS
    col = names.index("align_m")
    assert list(mat[:, col]) == [8.0, 3.0]  # log2 of 256 and of 8
    signs_names, signs, conflicts = column_signs(op_spec("gemm"), x, device=gpu, dtype="bf16")
    assert not ALIGN_COLUMNS & set(conflicts)
    assert all(s == 0 for n, s in zip(signs_names, signs, strict=True) if n in ALIGN_COLUMNS)
    lin = {"b": np.array([1.0]), "l": np.array([2048.0]), "dim": np.array([4096.0]), "mp": np.array([1.0])}
    assert not ALIGN_COLUMNS & set(model_columns(op_spec("linear1"), lin, device=gpu, dtype="bf16")[0])
    assert not ALIGN_COLUMNS & set(model_columns(op_spec("gemm"), x, device=cpu, dtype="fp32")[0])
