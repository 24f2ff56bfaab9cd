"""Workload IR (DESIGN.md "The IR")."""

from trainsim.ir.graph import Collective, Kernel, Op, RankGraph, SyncPoint, TensorMeta, Workload
from trainsim.ir.kinds import (
    CollectiveKind,
    FamilyGroup,
    KernelFamily,
    OpCategory,
    SyncKind,
)
from trainsim.ir.serialize import load_workload, save_workload, workload_from_dict, workload_to_dict

__all__ = [
    "Collective", "CollectiveKind", "FamilyGroup", "Kernel", "KernelFamily", "Op", "OpCategory",
    "RankGraph", "SyncKind", "SyncPoint", "TensorMeta", "Workload", "load_workload",
    "save_workload", "workload_from_dict", "workload_to_dict",
]  # fmt: skip
