"""Findings of the session-34 fuzzing review of the comm readers, registry and ``fit-comm``."""

from __future__ import annotations

from pathlib import Path

import yaml

from trainsim.comm import predict_collective
from trainsim.hardware import get_system

CATALOG_AZURE = Path(__file__).resolve().parents[1] / "src/trainsim/hardware/data/system_azure_nd_a100_v4.yaml"


def _azure_copy(tmp_path: Path, file: str, **edits: object) -> Path:
    doc = yaml.safe_load(CATALOG_AZURE.read_text(encoding="utf-8"))
    doc.update(edits)
    path = tmp_path / file
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def test_an_edited_catalog_system_keeping_its_name_is_not_answered_by_its_measurements(tmp_path) -> None:
    """A YAML copy of azure-nd-a100-v4 with 30 and 1 GB/s tiers predicted the catalog's 1.4 s
    (its calibrated models matched by name alone); a renamed copy 7.3 s. The YAML's tiers are
    what is modelled, with a note saying why the calibrated models stand aside."""
    slow = [{"name": "nvswitch", "kind": "nvswitch", "scope": "node", "bandwidth_per_gpu_GBps": 30, "latency_us": 1.9},
            {"name": "infiniband-hdr", "kind": "infiniband", "scope": "cluster", "bandwidth_per_gpu_GBps": 1,
             "latency_us": 8.5}]  # fmt: skip
    same = get_system(_azure_copy(tmp_path, "shadow_same_name.yaml", tiers=slow))
    renamed = get_system(_azure_copy(tmp_path, "shadow_renamed.yaml", tiers=slow, name="my-slow-azure", aliases=[]))
    catalog = predict_collective("all_reduce", 2**30, 16, system="azure-nd-a100-v4")
    shadow = predict_collective("all_reduce", 2**30, 16, system=same)
    assert catalog.calibrated and not shadow.calibrated
    assert shadow.provenance == "spec-based:azure-nd-a100-v4"
    assert shadow.duration_s == predict_collective("all_reduce", 2**30, 16, system=renamed).duration_s
    from trainsim.comm.registry import shadowed_note

    note = shadowed_note(same)
    assert note is not None and "nccl_tests_allreduce_a100_40gb_azure" in note and "tiers" in note
    assert shadowed_note(renamed) is None and shadowed_note(get_system("azure-nd-a100-v4")) is None
    # its documentation edited only, a copy is the catalog's system still: measured
    doc_only = get_system(_azure_copy(tmp_path, "doc_only.yaml", description="mine", aliases=[]))
    assert predict_collective("all_reduce", 2**30, 16, system=doc_only).provenance == catalog.provenance
    assert shadowed_note(doc_only) is None
