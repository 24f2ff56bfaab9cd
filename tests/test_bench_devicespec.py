"""The measured device file: roofline rows become a catalog device that `trainsim fit` accepts."""

from __future__ import annotations

import pytest

from trainsim.bench.devicespec import measured_device, write_device_yaml
from trainsim.errors import ConfigError
from trainsim.hardware import get_device


def _row(op: str, *, flops: float, nbytes: float, duration_s: float, dtype: str = "fp32") -> dict:
    return {"suite": "roofline", "bench_op": op, "dtype": dtype, "flops": flops, "bytes": nbytes,
            "duration_s": duration_s, "device": "Test CPU", "device_kind": "cpu", "fingerprint": "abc123"}  # fmt: skip


def test_best_probes_become_the_peaks(tmp_path):
    rows = [
        _row("peak_mm", flops=2e9, nbytes=1e6, duration_s=0.02),  # 100 GFLOP/s
        _row("peak_mm", flops=2e9, nbytes=1e6, duration_s=0.01),  # 200 GFLOP/s: the peak
        _row("stream_copy", flops=0, nbytes=1e9, duration_s=0.1),  # 10 GB/s
        _row("stream_triad", flops=0, nbytes=1.5e9, duration_s=0.1),  # 15 GB/s: the peak
        {**_row("stream_copy", flops=0, nbytes=1e12, duration_s=0.1), "fingerprint": "other"},
    ]
    doc = measured_device(rows, fingerprint="abc123")
    assert doc["peak_tflops"] == {"fp32": 0.2} and doc["memory_bandwidth_GBps"] == 15.0
    assert doc["aliases"] == ["Test CPU"] and doc["sources"][0]["kind"] == "measurement"
    spec = get_device(write_device_yaml(doc, tmp_path / "cpu.device.yaml"))
    assert spec.peak_flops_per_s("fp32") == pytest.approx(2e11)


def test_without_probes_it_says_what_to_run():
    with pytest.raises(ConfigError, match="bench roofline"):
        measured_device(
            [_row("peak_mm", flops=2e9, nbytes=1e6, duration_s=0.01)], fingerprint="abc123"
        )


def test_vector_width_is_read_from_the_cpu_flags():
    from trainsim.bench.devicespec import _vector_bits

    assert _vector_bits("processor : 0\nflags : fpu sse2 avx avx2 avx512f avx512bw\n") == 512
    assert _vector_bits("flags\t\t: fpu sse2 avx avx2 fma\n") == 256
    assert _vector_bits("flags : fpu sse2\n") == 128
    assert _vector_bits("processor : 0\n") is None  # nothing to read (not x86)
