"""Shared fixtures: real data locations and cached loads of the shipped traces."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
DLRM_DIR = REPO / "examples" / "data" / "param_dlrm_8xv100"  # shipped in the repo


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not beside the repository")
    return SHARED_DATA


@pytest.fixture(scope="session")
def dlrm_loaded():
    from trainsim.ingest import load_traces

    return load_traces([DLRM_DIR])


@pytest.fixture(scope="session")
def dlrm_raw() -> dict[int, dict]:
    """The DLRM Kineto JSON documents, parsed with the standard library (independent path)."""
    import json
    import re
    import tarfile

    out: dict[int, dict] = {}
    with tarfile.open(DLRM_DIR / "dlrm_kineto.tar.gz") as tar:
        for m in tar.getmembers():
            base = Path(m.name).name
            if m.isfile() and base.endswith(".json") and not base.startswith("._"):
                rank = int(re.search(r"worker(\d+)", base).group(1))  # type: ignore[union-attr]
                out[rank] = json.load(tar.extractfile(m))  # type: ignore[arg-type]
    return out


@pytest.fixture
def bench_ops():
    """The bench operators registered for one test, then removed (the table is global)."""
    from trainsim.bench.opspecs import BENCH_OPS, register_bench_ops
    from trainsim.kernels.features import OPS

    added = [s.name for s in BENCH_OPS if s.name not in OPS]
    register_bench_ops()
    yield
    for name in added:
        OPS.pop(name, None)
