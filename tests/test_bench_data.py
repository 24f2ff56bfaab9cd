"""The shipped CPU calibration sample: readable by `trainsim fit`, consistent with its provenance."""

from __future__ import annotations

import json
from importlib import resources

from trainsim.bench.dataset import iter_rows, noise_floor
from trainsim.bench.opspecs import BENCH_OPS, register_bench_ops
from trainsim.hardware import get_device


def test_cpu_quick_sample_matches_its_provenance():
    from trainsim.kernels.features import OPS
    from trainsim.kernels.readers import read_kernel_dataset

    data = resources.files("trainsim.bench") / "data"
    provs = [p for p in data.iterdir() if p.name.endswith(".provenance.json")]
    assert provs, "no packaged calibration sample"
    added = [s.name for s in BENCH_OPS if s.name not in OPS]
    register_bench_ops()
    try:
        for prov_path in provs:
            prov = json.loads(prov_path.read_text())
            path = data / prov["dataset"]
            rows = list(iter_rows(path))  # type: ignore[arg-type]
            assert len(rows) == prov["rows"]
            assert {r["fingerprint"] for r in rows} == {prov["machine"]["fingerprint"]}
            assert round(noise_floor(rows), 4) == prov["noise_floor"]["all"]
            ds = read_kernel_dataset([path])  # type: ignore[list-item]
            assert len(ds) == prov["rows"]
            device = get_device(data / prov["device_file"])  # type: ignore[arg-type]
            assert device.peak_flops_per_s("fp32") > 0
    finally:
        for name in added:
            OPS.pop(name, None)
