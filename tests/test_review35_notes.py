"""Session 35: the note that an edited YAML copy of a catalog system is not answered by that
system's calibrated comm models, printed by ``search`` and ``replay`` as ``predict`` prints it."""

from __future__ import annotations

from pathlib import Path

import yaml

from trainsim.builders.models import get_model
from trainsim.hardware import get_system
from trainsim.search.llm import search_llm
from trainsim.search.space import PlanSpace

CATALOG_AZURE = Path(__file__).resolve().parents[1] / "src/trainsim/hardware/data/system_azure_nd_a100_v4.yaml"
SLOW = [{"name": "nvswitch", "kind": "nvswitch", "scope": "node", "bandwidth_per_gpu_GBps": 30, "latency_us": 1.9},
        {"name": "infiniband-hdr", "kind": "infiniband", "scope": "cluster", "bandwidth_per_gpu_GBps": 1,
         "latency_us": 8.5}]  # fmt: skip


def _copy(tmp_path: Path, **edits: object) -> Path:
    doc = yaml.safe_load(CATALOG_AZURE.read_text(encoding="utf-8"))
    doc.update(edits)
    path = tmp_path / "azure_edited.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def test_search_notes_an_edited_catalog_system(tmp_path: Path) -> None:
    space = PlanSpace(gpus=16, global_batch=32)
    edited = search_llm(get_model("gpt3-350m"), get_system(_copy(tmp_path, tiers=SLOW)), space, progress=False)
    assert any("do not answer for this system" in n and "tiers" in n for n in edited["notes"])
    catalog = search_llm(get_model("gpt3-350m"), "azure-nd-a100-v4", space, progress=False)
    assert not any("do not answer" in n for n in catalog["notes"])


def test_replay_notes_an_edited_catalog_system(tmp_path: Path) -> None:
    from dataclasses import replace

    from trainsim.ir.graph import Collective, RankGraph, Workload
    from trainsim.ir.kinds import CollectiveKind
    from trainsim.sim import KernelSource, SimOptions, simulate
    from trainsim.sim.replay import _system
    from trainsim.sim.synthetic import kernel, op

    group = tuple(range(8))
    c = Collective(kind=CollectiveKind.ALL_REDUCE, group="g", group_ranks=group, seq=0, bytes=1 << 24)
    w = Workload(ranks=tuple(RankGraph(r, (op(0, kernels=[kernel(0, 84, 1.0, collective=c)]),),
                                       device="NVIDIA A100-SXM4-40GB") for r in group),
                 process_groups={"g": group})  # fmt: skip
    opts = SimOptions(kernels=KernelSource.MODEL, launch_latency_s=0.0, kernel_gap_s=0.0)
    edited = _system(simulate(w, replace(opts, system=str(_copy(tmp_path, tiers=SLOW)))))
    assert edited is not None and "do not answer for this system" in edited["note"]
    catalog = _system(simulate(w, replace(opts, system="azure-nd-a100-v4")))
    assert catalog is not None and "note" not in catalog
