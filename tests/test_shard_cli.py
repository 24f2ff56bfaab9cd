"""``trainsim shard`` edge cases: uneven world sizes, the default memory cap, device/system flags."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainsim.builders.dlrm import (
    DLRMSpec,
    TableSpec,
    build_dlrm_workload,
    padded_group,
    random_tables,
)
from trainsim.errors import ConfigError
from trainsim.hardware import get_device, get_system
from trainsim.search.sharders import select_sharder

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "dlrm_tables.json"
GPU = "a100-sxm4-80gb"
_ENTRY = "from trainsim.cli.main import app_entry; app_entry()"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _ENTRY, "shard", *args], capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip


def _one_line_error(p: subprocess.CompletedProcess[str], code: int = 1) -> str:
    """The one stderr line of an error: exit 1, or ``code`` 2 for a usage error."""
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    return lines[0]


@pytest.fixture()
def huge_spec(tmp_path: Path) -> Path:
    f = tmp_path / "huge.json"
    f.write_text(json.dumps({"batch": 4096, "tables": [
        {"name": "small", "rows": 1000, "dim": 16, "pooling": 1.0},
        {"name": "huge", "rows": 10**12, "dim": 128, "pooling": 2.0}]}))  # fmt: skip
    return f


# --- 1. world sizes that do not fill the system's nodes evenly -----------------------------------


@pytest.mark.parametrize(
    ("world", "padded"), [(1, 1), (8, 8), (12, 12), (26, 32), (27, 32), (40, 40), (100, 104)]
)
def test_padded_group(world, padded):
    assert padded_group(get_system("dgx-a100"), world) == padded


@pytest.mark.parametrize("world", [26, 27, 100])
def test_uneven_world_is_timed_on_padded_full_nodes(world):
    spec = DLRMSpec(random_tables(4, seed=1), batch=4096)
    w = build_dlrm_workload(spec, [i % world for i in range(4)], world, device=GPU)
    provs = {k.provenance for rg in w.ranks[:1] for k in rg.kernels() if k.collective is not None}
    # all-to-alls spec-based; the all-reduce from DGX A100's network twin (Azure ND A100 v4)
    assert provs and all(p.split(";padded:")[0] in ("spec-based:dgx-a100", "calibrated:nccl_tests_allreduce_a100_40gb_azure;twin-system:azure-nd-a100-v4")
                         or p.startswith("calibrated:nccl_tests_allreduce_a100_40gb_azure;twin-system:azure-nd-a100-v4;extrapolated-from:")
                         for p in provs)  # fmt: skip
    assert all(p.endswith(f";padded:{world}->{-(-world // 8) * 8} ranks") for p in provs)
    assert f"{world} ranks do not fill dgx-a100 nodes" in w.metadata["comm"]


def test_cli_world_26_works():
    p = _cli(str(EXAMPLE), "--world", "26", "--device", GPU, "--format", "json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["world"] == 26 and "32 ranks" in doc["comm"]
    assert all(len(s["assignment"]) == 26 for s in doc["sharders"] if s["assignment"] is not None)


# --- 2. memory capacity ----------------------------------------------------------------------------


def test_default_capacity_is_the_device_memory(huge_spec):
    line = _one_line_error(_cli(str(huge_spec), "--world", "4", "--device", GPU))
    assert "'huge'" in line and f"{get_device(GPU).memory_bytes / 1e9:.3g} GB per rank" in line and "memory_GB" in line


def test_capacity_override_and_json_fields():
    p = _cli(
        str(EXAMPLE), "--world", "2", "--device", GPU, "--sharders", "naive", "--format", "json"
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["capacity_gb"] == pytest.approx(get_device(GPU).memory_bytes / 1e9) and doc["capacity_source"].startswith(
        "default"
    )
    p = _cli(str(EXAMPLE), "--world", "2", "--device", GPU, "--sharders", "naive", "--capacity-gb", "0.001",
             "--format", "json")  # fmt: skip
    line = _one_line_error(p)
    assert "no sharder is feasible" in line and "--capacity-gb" in line


@pytest.mark.parametrize("bad", ["-1", "0", "nan"])
def test_nonpositive_capacity_is_rejected(bad):
    line = _one_line_error(
        _cli(str(EXAMPLE), "--world", "2", "--device", GPU, f"--capacity-gb={bad}"), code=2
    )
    assert "--capacity-gb must be a positive number" in line


def test_select_sharder_infeasible_message_names_largest_table_and_cap():
    spec = DLRMSpec(
        (TableSpec("a", 10_000, 16, 1.0), TableSpec("big", 1_000_000, 64, 1.0)), batch=64
    )
    with pytest.raises(
        ConfigError, match=r"largest table 'big'.*0\.1 GB per rank \(mine\); it alone"
    ):
        select_sharder(
            spec, 2, device=GPU, capacity_bytes=0.1e9, capacity_source="mine", sharders=["naive"]
        )
    with pytest.raises(ConfigError, match="positive"):
        select_sharder(spec, 2, device=GPU, capacity_bytes=-1.0)


# --- 3./4. --device and --system ----------------------------------------------------------------------


def test_neither_device_nor_system_is_one_line():
    line = _one_line_error(_cli(str(EXAMPLE)), code=2)  # a missing option: a usage error
    assert "--device" in line and "--system" in line


def test_device_not_of_the_system_is_an_error():
    line = _one_line_error(_cli(str(EXAMPLE), "--device", GPU, "--system", "dgx-h100"))
    assert "dgx-h100" in line and "h100-sxm5-80gb" in line and GPU in line


def test_system_alone_uses_its_device():
    p = _cli(
        str(EXAMPLE),
        "--world",
        "4",
        "--system",
        "dgx-h100",
        "--sharders",
        "naive",
        "--format",
        "json",
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["device"] == "h100-sxm5-80gb" and doc["comm"] == "system dgx-h100"
