"""Hardware catalogs: packaged YAML validated, lookup by name/alias/path, published peaks."""

from __future__ import annotations

import pytest

from trainsim.errors import ConfigError
from trainsim.hardware import get_device, get_system, list_devices, list_systems
from trainsim.hardware.schema import TierScope


def test_catalog_has_the_required_entries():
    assert {d.name for d in list_devices()} >= {"v100-sxm2-32gb", "a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm5-80gb",
                                                 "h200-sxm-141gb", "gh200-96gb", "b200", "mi300x"}  # fmt: skip
    assert {s.name for s in list_systems()} >= {
        "dgx-a100",
        "dgx-h100",
        "dgx-h200",
        "perlmutter",
        "vista",
        "azure-nd-a100-v4",
    }


@pytest.mark.parametrize("spec", list_systems(), ids=lambda s: s.name)
def test_every_system_is_consistent(spec):
    assert get_device(spec.device)  # its device is in the catalog
    assert spec.sources and spec.schema_version == 1
    assert [t.scope for t in spec.tiers][-1] is TierScope.CLUSTER
    assert all(t.latency_us > 0 and t.bandwidth_per_gpu_GBps > 0 for t in spec.tiers)


# Published figures (shared/data/README.md, vendor datasheets): name -> (BF16 or FP16 dense TFLOP/s, HBM GB/s, GB)
PUBLISHED = {
    "v100-sxm2-32gb": (125, 900, 32), "a100-sxm4-40gb": (312, 1555, 40), "a100-sxm4-80gb": (312, 2039, 80),
    "h100-sxm5-80gb": (989, 3350, 80), "h200-sxm-141gb": (989, 4800, 141), "gh200-96gb": (989, 4000, 96),
    "b200": (2250, 8000, 180), "mi300x": (1300, 5300, 192),
}  # fmt: skip


@pytest.mark.parametrize(("name", "figures"), PUBLISHED.items())
def test_device_peaks_match_published_numbers(name, figures):
    d = get_device(name)
    tflops, gbps, gb = figures
    assert (d.peak_tflops.bf16 or d.peak_tflops.fp16) == tflops
    assert d.memory_bandwidth_Bps == pytest.approx(gbps * 1e9)
    assert d.memory_GB == gb


def test_system_bandwidths_in_si():
    s = get_system("DGX A100")  # alias, case and spacing do not matter
    assert s.name == "dgx-a100" and s.gpus_per_node == 8
    assert s.node_tier.bandwidth_per_gpu_Bps == 300e9
    assert s.cluster_tier.bandwidth_per_gpu_Bps == 25e9  # 8 x 200 Gb/s over 8 GPUs
    assert get_system("vista").node_tier is None


def test_lookup_by_alias_as_devices_name_themselves():
    assert get_device("NVIDIA A100-SXM4-40GB").name == "a100-sxm4-40gb"
    assert get_device("NVIDIAGH200120GB").name == "gh200-96gb"  # paper 001's file names


def test_unknown_name_lists_known_ones():
    with pytest.raises(ConfigError, match=r"unknown system 'dgx-z9'.*dgx-a100"):
        get_system("dgx-z9")


_SYSTEM_YAML = """schema_version: 1
name: my-cluster
description: test
device: h100-sxm5-80gb
gpus_per_node: 4
tiers:
  - {name: nvl, kind: nvswitch, scope: node, bandwidth_per_gpu_GBps: 450, latency_us: 2}
  - {name: ib, kind: infiniband, scope: cluster, bandwidth_per_gpu_GBps: 50, latency_us: 8, nics_per_node: 4, nic_bandwidth_Gbps: 400}
sources: [{kind: measurement, title: ours}]
"""


def test_system_from_a_yaml_file(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text(_SYSTEM_YAML)
    assert get_system(f).cluster_tier.bandwidth_per_gpu_GBps == 50


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            ("gpus_per_node: 4", "gpus_per_node: 4\nbogus_key: 1"),
            "bogus_key",
        ),  # unknown keys are rejected
        (("schema_version: 1", "schema_version: 7"), "schema_version 7"),
        (
            ("nic_bandwidth_Gbps: 400", "nic_bandwidth_Gbps: 100"),
            "disagrees",
        ),  # 4 x 100 Gb/s / 4 GPUs != 50 GB/s
        (("latency_us: 8", "latency_us: -1"), "latency_us"),
        (("sources: [{kind: measurement, title: ours}]", "sources: []"), "sources"),
    ],
)
def test_bad_system_yaml_names_the_field(tmp_path, edit, message):
    f = tmp_path / "bad.yaml"
    f.write_text(_SYSTEM_YAML.replace(*edit))
    with pytest.raises(ConfigError, match=message) as e:
        get_system(f)
    assert str(f) in str(e.value)


def test_missing_yaml_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        get_system(tmp_path / "nope.yaml")
