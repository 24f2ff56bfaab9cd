"""CPU calibration: repeat spreads read from bench rows, the noisy-row screen, the per-family
summary, constrained trees on log time, and the CPU operators' derived features."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from trainsim.bench.suites import SUITES, SweepSpec, suite_cases
from trainsim.hardware import get_device
from trainsim.ir.kinds import KernelFamily
from trainsim.kernels.features import OPS, derive, model_columns
from trainsim.kernels.fitting import EntryReport, family_summary, fit_entry
from trainsim.kernels.monotone import monotone_violation
from trainsim.kernels.readers import read_kernel_dataset
from trainsim.kernels.samples import EntryKey

A100 = get_device("a100")


def _row(op: str, phase: str, feats: dict, dur: float, samples: list[float] | None) -> str:
    row = {"schema": "trainsim.kernel-bench/1", "device": "cpu-x", "fingerprint": "f", "op": op,
           "phase": phase, "dtype": "fp32", "features": feats, "duration_s": dur,
           "repeats": 7, "statistic": "median"}  # fmt: skip
    if samples is not None:
        row["samples_s"] = samples
    return json.dumps(row)


def test_spread_is_read_from_the_repeats_and_noisy_rows_are_screened(tmp_path: Path):
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join([
        _row("memcpy", "fwd", {"bytes": 1024}, 1e-6, [1e-6, 1e-6, 1e-6, 1e-6, 1e-6]),
        _row("memcpy", "fwd", {"bytes": 2048}, 2e-6, [1e-6, 2e-6, 2e-6, 3e-6, 4e-6]),
        _row("memcpy", "fwd", {"bytes": 4096}, 4e-6, None),
    ]) + "\n")  # fmt: skip
    ds = read_kernel_dataset([p])
    key = EntryKey.parse("memcpy/fwd/fp32")
    s = ds.spreads(key)
    assert s[0] == 0.0
    assert s[1] == pytest.approx((3e-6 - 2e-6) / 2e-6)  # (p75 − p25) / median
    assert math.isnan(s[2])  # no repeats kept: unknown
    kept, dropped = ds.without_spread_above(0.25)
    assert dropped == 1 and len(kept) == 2  # the unknown one is kept
    assert [r.features["bytes"] for r in kept] == [1024, 4096]


def _report(
    fam: KernelFamily, n: int, gmae: float | None, spreads: tuple[float, ...]
) -> EntryReport:
    return EntryReport(EntryKey.parse(f"x{n}/fwd/fp32"), fam, "poly", {}, gmae, gmae, gmae, gmae, None,
                       n, 4 * n, 5 * n, 0, 0, 0.0, row_spreads=spreads, heldout_spreads=spreads[:n])  # fmt: skip


def test_family_summary_pools_gmae_by_heldout_rows_and_reports_the_noise_floor():
    reps = [
        _report(KernelFamily.NORM, 10, 4.0, (0.01, 0.02, 0.03)),
        _report(KernelFamily.NORM, 30, 16.0, (0.05,)),
        _report(
            KernelFamily.NORM, 5, None, (0.5,)
        ),  # no model: counted apart, its rows' noise kept
        _report(KernelFamily.GEMM, 20, 2.0, ()),
    ]
    s = family_summary(reps)
    norm = s["norm"]
    assert norm["entries"] == 2 and norm["entries_without_model"] == 1
    assert norm["heldout_rows"] == 40
    assert norm["gmae_pct"] == pytest.approx(math.exp((10 * math.log(4) + 30 * math.log(16)) / 40))
    assert norm["noise_pct"] == pytest.approx(100 * np.median([0.01, 0.02, 0.03, 0.05, 0.5]))
    assert norm["worst_entry"] == "x30/fwd/fp32"
    assert s["gemm"]["gmae_pct"] == pytest.approx(2.0) and s["gemm"]["noise_pct"] is None


def test_dtype_filter_of_the_suites():
    spec = SweepSpec(device="cpu", quick=False)
    every = list(suite_cases(["norm"], spec))
    fp32 = list(suite_cases(["norm"], spec, dtypes=["fp32"]))
    same = list(suite_cases(["norm"], spec, dtypes=["float32"]))
    assert {c.dtype for c in every} == {"float32", "bfloat16"}
    assert {c.dtype for c in fp32} == {"float32"} and len(fp32) == len(same) > 0
    assert len(fp32) < len(every)
    assert list(suite_cases(list(SUITES), spec, dtypes=["fp8"])) == []


def test_index_select_unique_rows_follow_the_birthday_estimate(bench_ops):
    w = derive(
        OPS["index_select"], {"rows": [100.0, 1e6, 10.0], "d": 4.0, "k": [100.0, 10.0, 1e4]}, "fp32"
    )
    u = w["unique_rows"]
    assert u[0] == pytest.approx(100 * (1 - math.exp(-1)))  # k = rows: 63 % distinct
    assert u[1] == pytest.approx(10.0, rel=1e-4)  # k ≪ rows: nearly all distinct
    assert u[2] == pytest.approx(10.0)  # k ≫ rows: every row touched
    assert np.all(w["touched_bytes"] <= w["source_bytes"] + 1e-9)


def test_conv_features_count_the_unfolded_input(bench_ops):
    w = derive(OPS["conv2d"], {"n": 2, "c": 3, "k": 8, "hw": 9, "r": 3, "stride": 1}, "fp32")
    assert float(w["im2col_bytes"]) == pytest.approx(4 * 2 * 81 * 3 * 9)
    assert float(w["out_bytes"]) == pytest.approx(4 * 2 * 8 * 81)
    one = derive(OPS["conv2d"], {"n": 2, "c": 3, "k": 8, "hw": 9, "r": 1, "stride": 1}, "fp32")
    assert float(one["im2col_bytes"]) == pytest.approx(4 * 2 * 81 * 3)  # a 1x1 conv unfolds nothing


def test_optimizer_per_tensor_work(bench_ops):
    w = derive(OPS["adam"], {"params": [1e6, 1e6], "tensors": [1.0, 100.0]}, "fp32")
    assert w["per_tensor_bytes"][0] == pytest.approx(100 * w["per_tensor_bytes"][1])
    assert np.all(w["bytes"] == w["bytes"][0])


def test_constrained_trees_on_time_are_monotone_where_efficiency_rises_with_size(tmp_path: Path):
    """Small problems pay a fixed per-call cost (t = 20 µs + bytes / 10 GB/s): efficiency rises
    with size, so a tree constrained on the efficiency cannot follow it; one on log time can,
    and stays monotone."""
    rng = np.random.default_rng(0)
    nbytes = np.exp2(rng.uniform(10, 28, 120)).round()
    t = (20e-6 + nbytes / 10e9) * np.exp(rng.normal(0, 0.03, nbytes.size))
    p = tmp_path / "m.jsonl"
    p.write_text("".join(_row("memcpy", "fwd", {"bytes": float(b)}, float(s), None) + "\n"
                         for b, s in zip(nbytes, t, strict=True)))  # fmt: skip
    ds = read_kernel_dataset([p])
    key = EntryKey.parse("memcpy/fwd/fp32")
    entry, _, rep = fit_entry(ds, key, device=A100, kinds=("xgboost",))
    labels = [c.config for c in rep.candidates]
    assert any(c.get("target") == "time" and c.get("constrained") for c in labels)
    assert not any(c.get("target") == "time" and not c.get("constrained") for c in labels)
    on_time = [c for c in rep.candidates if c.config.get("target") == "time"]
    on_eff = [c for c in rep.candidates if c.config.get("constrained") and "target" not in c.config]
    assert min(c.val_mape_pct for c in on_time) < min(c.val_mape_pct for c in on_eff)
    assert rep.heldout_gmae_pct is not None and rep.heldout_gmae_pct < 10.0
    raw, _, _ = ds.arrays(key)
    if entry is not None and entry.config.get("target") == "time":
        assert monotone_violation(entry, raw, np.arange(nbytes.size), A100, step=None) < 0.15
    _, _, off = fit_entry(ds, key, device=A100, kinds=("xgboost",), time_target=False)
    assert not any(c.config.get("target") == "time" for c in off.candidates)


def test_full_sweeps_hold_doubling_probes_and_quick_sweeps_do_not():
    from trainsim.bench.suites.base import PROBE_BASES

    full = [c for c in suite_cases(["softmax"], SweepSpec(device="cpu", quick=False), dtypes=["fp32"])
            if c.op == "softmax" and c.phase.value == "fwd"]  # fmt: skip
    quick = [c for c in suite_cases(["softmax"], SweepSpec(device="cpu", quick=True))
             if c.op == "softmax" and c.phase.value == "fwd"]  # fmt: skip
    assert len(quick) == 24  # quick sweeps are unchanged: a prefix of the full one
    assert [c.key for c in full[:24]] == [c.key for c in quick]
    pts = {tuple(dict(c.params)[k] for k in ("b", "h", "l")) for c in full}
    low = [(b, h) for (b, h, n) in pts if n == 8 and (b, h, 16) in pts]
    assert len(low) >= PROBE_BASES - 1  # rows of 8 and of 16 at the same (b, h)
    probes = full[120:]
    assert probes and len(probes) % 2 == 0


def test_measured_doublings_refute_a_false_claim():
    """Softmax over rows of 8 is slower than over rows of 16 on a CPU: the probes' pairs make
    data_claims drop the claim in l, and only that one."""
    from trainsim.kernels.monotone import data_claims

    b = np.array([3.0, 3.0, 6.0, 6.0, 2.0, 2.0, 9.0, 9.0])
    h = np.array([14.0, 14.0, 3.0, 3.0, 5.0, 5.0, 1.0, 1.0])
    l = np.array([8.0, 16.0, 8.0, 16.0, 8.0, 16.0, 64.0, 128.0])  # noqa: E741
    rows = b * h * l
    t = np.where(l == 8, 140e-9 * rows, 25e-9 * rows * (l / 16))
    inputs = {"mp": np.ones_like(b), "b": b, "h": h, "l": l}
    kept, dropped = data_claims("softmax", inputs, t, np.arange(b.size))
    assert "l" in dropped and "l" not in kept
    assert kept.get("b") == 1 and kept.get("h") == 1


def test_embedding_bag_reuse_is_optional_and_sets_the_distinct_bytes():
    base = {"B": 1024.0, "E": 1e5, "T": 1.0, "L": 8.0, "D": 64.0}
    none = derive(OPS["embedding_bag"], base, "fp32")
    reused = derive(OPS["embedding_bag"], {**base, "reuse": 8.0}, "fp32")
    assert float(none["unique_bytes"]) == pytest.approx(4 * 1024 * 8 * 64)  # default: no reuse
    assert float(reused["unique_bytes"]) == pytest.approx(float(none["unique_bytes"]) / 8)
    assert float(reused["bytes"]) == float(none["bytes"])
    assert float(none["table_bytes"]) == pytest.approx(4 * 1e5 * 64)
    case = next(c for c in suite_cases(["embedding"], SweepSpec(device="cpu", quick=True)))
    feats = dict(case.features)
    assert feats["reuse"] == pytest.approx(dict(case.params)["mean_reuse"])


def test_cpu_columns_add_intensity_and_serial_time():
    from trainsim.bench.devicespec import measured_device  # noqa: F401 - the CPU device path
    from trainsim.kernels.features import model_columns

    cpu = get_device(
        Path(__file__).parents[1] / "src/trainsim/bench/data/cpu_quick_f97e94a9cbddf655.device.yaml"
    )
    assert cpu.sm_count is None
    x = {"batch": [1.0, 1.0], "m": [64.0, 4096.0], "n": [8.0, 4096.0], "k": [512.0, 4096.0]}
    names, mat = model_columns(OPS["gemm"], x, device=cpu, dtype="fp32")
    assert {"intensity", "min_dim", "serial_s", "tiles"} <= set(
        names
    )  # tiles kept: old fits evaluate
    assert mat[1, names.index("min_dim")] > mat[0, names.index("min_dim")]
    gpu_names, _ = model_columns(OPS["gemm"], x, device=A100, dtype="fp16")
    assert "tiles" in gpu_names and "intensity" not in gpu_names  # GPU columns unchanged


def test_a_gzipped_jsonl_dataset_reads_like_the_plain_one(tmp_path: Path):
    import gzip

    from trainsim.bench.dataset import iter_rows

    text = "".join(_row("memcpy", "fwd", {"bytes": float(b)}, 1e-6 * b / 1024, [1e-6, 1.1e-6]) + "\n"
                   for b in (1024, 2048, 4096))  # fmt: skip
    plain, packed = tmp_path / "s.jsonl", tmp_path / "s.jsonl.gz"
    plain.write_text(text)
    packed.write_bytes(gzip.compress(text.encode()))
    a, b = read_kernel_dataset([plain]), read_kernel_dataset([packed])
    assert b.name == "s" and len(b) == len(a) == 3
    assert [s.duration_s for s in b] == [s.duration_s for s in a]
    assert [s.spread for s in b] == [s.spread for s in a]
    assert list(iter_rows(packed)) == list(iter_rows(plain))
    assert len(read_kernel_dataset([tmp_path])) == 6  # a folder holds both


def test_conv_padded_work_uses_the_devices_vector_width(bench_ops):
    """oneDNN computes on channels padded to the SIMD width: 16 fp32 lanes on AVX-512, 8 on
    AVX2 (`lanes`, filled from the device's vector_bits); torch's native path pads nothing."""
    from trainsim.kernels.features import device_inputs

    shape = {"n": 2, "c": 3, "k": 8, "hw": 9, "r": 3, "stride": 1}
    w = derive(OPS["conv2d"], shape, "fp32")
    assert float(w["host_onednn"]) == 2.0
    assert float(w["host_padded_flops"]) == pytest.approx(float(w["flops"]) * 16 / 3 * 16 / 8)
    avx2 = A100.model_copy(update={"sm_count": None, "vector_bits": 256})
    narrow = derive(OPS["conv2d"], device_inputs(OPS["conv2d"], shape, avx2, "fp32"), "fp32")
    assert float(narrow["host_padded_flops"]) == pytest.approx(float(w["flops"]) * 8 / 3)
    native = derive(OPS["conv2d"], {**shape, "n": 1, "hw": 8, "r": 1}, "fp32")  # 1x1, one small image
    assert float(native["host_onednn"]) == 1.0 and float(native["host_padded_flops"]) == float(native["flops"])
    gpu_cols, _ = model_columns(OPS["conv2d"], shape, device=A100)
    cpu_cols, _ = model_columns(OPS["conv2d"], shape, device=avx2)
    assert "d:host_onednn" in cpu_cols and not any("host_" in c for c in gpu_cols)


@pytest.mark.parametrize("shape", [
    {"n": 1, "c": 8, "k": 16, "hw": 8, "r": 1, "stride": 1},    # 1x1, one small image: native
    {"n": 9, "c": 8, "k": 248, "hw": 7, "r": 1, "stride": 1},   # 1x1 stride 1, batch < 16: native
    {"n": 16, "c": 8, "k": 16, "hw": 7, "r": 1, "stride": 1},   # batch 16: oneDNN
    {"n": 2, "c": 16, "k": 16, "hw": 26, "r": 1, "stride": 2},  # strided: oneDNN
    {"n": 1, "c": 64, "k": 56, "hw": 4, "r": 3, "stride": 1},   # 3x3, one image of 1,024 values: native
    {"n": 1, "c": 64, "k": 56, "hw": 32, "r": 3, "stride": 1},  # 3x3, 65,536 values: oneDNN
    {"n": 1, "c": 4, "k": 8, "hw": 8, "r": 5, "stride": 1},     # 5x5: oneDNN
])  # fmt: skip
def test_conv_path_is_the_one_torch_takes(bench_ops, capfd, shape):
    """The `host_onednn` feature follows torch's own choice: oneDNN's verbose log names a
    convolution primitive exactly when derive says the oneDNN path (one thread)."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x = torch.randn(shape["n"], shape["c"], shape["hw"], shape["hw"])
        w = torch.randn(shape["k"], shape["c"], shape["r"], shape["r"])
        capfd.readouterr()
        with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
            torch.nn.functional.conv2d(x, w, stride=shape["stride"], padding=shape["r"] // 2)
        log = capfd.readouterr().out
    finally:
        torch.set_num_threads(threads)
    ran_onednn = ",convolution," in log
    assert float(derive(OPS["conv2d"], shape, "fp32")["host_onednn"]) == (2.0 if ran_onednn else 1.0), log[-500:]


def test_polynomial_monomials_match_the_filtered_product():
    """The degree-limited monomials, generated directly, are exactly those of the filtered
    (degree + 1)^columns product, in its order (that enumeration took minutes on 22 columns)."""
    import itertools

    from trainsim.kernels.learned import monomial_powers

    for columns in range(1, 7):
        for degree in range(1, 4):
            want = [p for p in itertools.product(range(degree + 1), repeat=columns) if 0 < sum(p) <= degree]
            assert monomial_powers(columns, degree) == want
    assert len(monomial_powers(22, 2)) == 22 + 22 * 23 // 2
