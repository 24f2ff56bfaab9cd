"""Review findings of a `trainsim fit`/`bench` walkthrough (2026-12-01):

* the monotone checks took log2 of a 0 s prediction (numpy warned on every fit of `tril`, and
  a sweep holding two 0 s predictions turned NaN and was skipped whole, real violations with it);
* the CPU device file took a 10 MB STREAM copy that the 32 MiB L3 held (212 GB/s) for the
  memory bandwidth (an 83 MB copy: 43 GB/s).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import pytest

from trainsim.bench.devicespec import _sysfs_llc, last_level_cache_bytes, measured_device
from trainsim.bench.suites.roofline import roofline_peaks
from trainsim.hardware import get_device
from trainsim.kernels.features import Phase
from trainsim.kernels.monotone import extrapolation_violation, log2_time, monotone_violation
from trainsim.kernels.samples import EntryKey

A100 = get_device("a100")
LAYERNORM = EntryKey("layernorm", Phase.FWD, "fp32")


@dataclass
class _Entry:
    """What the monotone checks read of a learned entry: 0 s below b = 64, and a real
    violation (half the time at twice the rows) from b = 256 to 512."""

    key: EntryKey = LAYERNORM
    claims: dict[str, int] = field(default_factory=lambda: {"b": 1})
    ranges: dict[str, tuple[float, float]] = field(default_factory=lambda: {"b": (8.0, 1024.0)})

    def predict(self, batch, device):
        b = batch["b"]
        return np.where(b < 64, 0.0, np.where(b >= 512, 0.5e-6, 1e-6)), None


def _inputs() -> dict[str, np.ndarray]:
    b = np.exp2(np.arange(3, 11)).astype(float)  # 8 .. 1024
    return {"b": b, "l": np.ones_like(b), "dim": np.full_like(b, 256.0)}


def test_zero_second_predictions_neither_warn_nor_hide_a_violation():
    inputs, rows = _inputs(), np.arange(8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a log2(0) RuntimeWarning fails the test
        assert monotone_violation(_Entry(), inputs, rows, A100) == pytest.approx(1.0)
        assert extrapolation_violation(_Entry(), inputs, rows, A100) >= 1.0
        assert np.isfinite(log2_time(np.array([0.0, 1e-3]))).all()


def _probe(op: str, nbytes: float, gbps: float) -> dict:
    return {"suite": "roofline", "bench_op": op, "dtype": "fp32", "flops": 0.0, "bytes": nbytes,
            "duration_s": nbytes / (gbps * 1e9), "device": "Test CPU", "device_kind": "cpu",
            "fingerprint": "abc123"}  # fmt: skip


ROWS = [
    {**_probe("peak_mm", 1e6, 1.0), "flops": 2e9, "duration_s": 0.01},
    _probe("stream_copy", 10.4e6, 212.46),  # the 32 MiB L3 holds it
    _probe("stream_copy", 49.5e6, 61.9),  # 1.5x the L3: still partly cached
    _probe("stream_copy", 83.3e6, 43.4),  # 2.5x: memory
    _probe("stream_read", 66.5e6, 8.3),
]


def test_memory_bandwidth_comes_from_probes_well_beyond_the_last_level_cache():
    assert roofline_peaks(ROWS, cache_bytes=0)["bandwidth_Bps"] == pytest.approx(212.46e9)  # every probe
    peaks = roofline_peaks(ROWS, cache_bytes=32 * 2**20)
    assert peaks["bandwidth_Bps"] == pytest.approx(43.4e9)
    assert peaks["bandwidth_probes"]["qualifying"] == 1 and peaks["bandwidth_probes"]["note"] is None
    doc = measured_device(ROWS, fingerprint="abc123", cache_bytes=32 * 2**20)
    assert doc["memory_bandwidth_GBps"] == pytest.approx(43.4, abs=0.01)
    assert "32 MiB last-level cache" in doc["sources"][0]["note"]


def test_when_no_probe_is_large_enough_the_device_file_says_so():
    doc = measured_device(ROWS, fingerprint="abc123", cache_bytes=256 * 2**20)  # a server's L3
    assert doc["memory_bandwidth_GBps"] == pytest.approx(212.46, abs=0.01)  # none beyond it: best of all
    assert "no bandwidth probe's working set reached 2x" in doc["sources"][0]["note"]
    doc = measured_device(ROWS, fingerprint="abc123", cache_bytes=40 * 2**20)
    assert doc["memory_bandwidth_GBps"] == pytest.approx(61.9, abs=0.01)  # the best larger than it
    assert "may be the cache's" in doc["sources"][0]["note"]


def _cache(root, cpu: int, index: int, *, level: int, kind: str, size: str, shared: str) -> None:
    d = root / f"cpu{cpu}" / "cache" / f"index{index}"
    d.mkdir(parents=True)
    for name, text in (("level", str(level)), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
        (d / name).write_text(text + "\n")


def test_the_last_level_cache_is_read_from_sysfs_summed_over_its_instances(tmp_path):
    for cpu in range(4):
        _cache(tmp_path, cpu, 0, level=1, kind="Data", size="48K", shared=str(cpu))
        _cache(tmp_path, cpu, 1, level=1, kind="Instruction", size="32K", shared=str(cpu))
        _cache(tmp_path, cpu, 2, level=2, kind="Unified", size="1024K", shared=str(cpu))
        # two L3 slices (two CCXs) of 32 MiB, each shared by two CPUs
        _cache(tmp_path, cpu, 3, level=3, kind="Unified", size="32768K", shared="0-1" if cpu < 2 else "2-3")
    assert _sysfs_llc(tmp_path) == (64 * 2**20, 3)
    assert last_level_cache_bytes(sysfs=tmp_path) == (64 * 2**20, f"{tmp_path} (level-3 caches)")
    assert _sysfs_llc(tmp_path / "missing") is None
    size, how = last_level_cache_bytes(sysfs=tmp_path / "missing")  # sysconf, else the default
    assert size > 0 and how
