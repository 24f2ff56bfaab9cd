"""Named kinds used throughout the IR (enums, never bare strings)."""

from __future__ import annotations

from enum import StrEnum


class OpCategory(StrEnum):
    """What an operator mostly does (DESIGN.md, IR contract)."""

    COMPUTE = "compute"
    MEMORY = "memory"
    COMMUNICATION = "communication"
    CPU_ONLY = "cpu-only"
    SYNC = "sync"


class KernelFamily(StrEnum):
    """Kernel families: one performance model is registered per family."""

    GEMM = "gemm"
    CONV = "conv"
    ATTENTION = "attention"
    EMBEDDING_FWD = "embedding_fwd"
    EMBEDDING_BWD = "embedding_bwd"
    NORM = "norm"
    SOFTMAX = "softmax"
    ELEMENTWISE = "elementwise"
    REDUCTION = "reduction"
    OPTIMIZER = "optimizer"
    INDEX = "index"
    SORT_SCAN = "sort_scan"
    MEMCPY = "memcpy"
    MEMSET = "memset"
    NCCL_ALL_REDUCE = "nccl_all_reduce"
    NCCL_ALL_GATHER = "nccl_all_gather"
    NCCL_REDUCE_SCATTER = "nccl_reduce_scatter"
    NCCL_ALL_TO_ALL = "nccl_all_to_all"
    NCCL_BROADCAST = "nccl_broadcast"
    NCCL_REDUCE = "nccl_reduce"
    NCCL_SEND_RECV = "nccl_send_recv"
    NCCL_OTHER = "nccl_other"
    CPU = "cpu"
    OTHER = "other"

    @property
    def is_communication(self) -> bool:
        return self.value.startswith("nccl_")

    @property
    def group(self) -> FamilyGroup:
        """The coarse group used by breakdowns (002 §4.3.1 Fig. 4.3)."""
        return _GROUP_OF[self]


class FamilyGroup(StrEnum):
    """Coarse kernel groups of a breakdown: GEMM, embedding, memory ops, element-wise/other, comm."""

    GEMM = "gemm"
    EMBEDDING = "embedding"
    MEMORY = "memory"
    OTHER = "elementwise_other"
    COMMUNICATION = "communication"


_GROUP_OF: dict[KernelFamily, FamilyGroup] = {
    **dict.fromkeys(KernelFamily, FamilyGroup.OTHER),
    KernelFamily.GEMM: FamilyGroup.GEMM,
    KernelFamily.CONV: FamilyGroup.GEMM,
    KernelFamily.ATTENTION: FamilyGroup.GEMM,
    KernelFamily.EMBEDDING_FWD: FamilyGroup.EMBEDDING,
    KernelFamily.EMBEDDING_BWD: FamilyGroup.EMBEDDING,
    KernelFamily.MEMCPY: FamilyGroup.MEMORY,
    KernelFamily.MEMSET: FamilyGroup.MEMORY,
    **{f: FamilyGroup.COMMUNICATION for f in KernelFamily if f.value.startswith("nccl_")},
}


class CollectiveKind(StrEnum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    ALL_TO_ALLV = "all_to_allv"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    SEND = "send"
    RECV = "recv"
    BARRIER = "barrier"

    @property
    def family(self) -> KernelFamily:
        return _COLLECTIVE_FAMILY[self]


_COLLECTIVE_FAMILY: dict[CollectiveKind, KernelFamily] = {
    CollectiveKind.ALL_REDUCE: KernelFamily.NCCL_ALL_REDUCE,
    CollectiveKind.ALL_GATHER: KernelFamily.NCCL_ALL_GATHER,
    CollectiveKind.REDUCE_SCATTER: KernelFamily.NCCL_REDUCE_SCATTER,
    CollectiveKind.ALL_TO_ALL: KernelFamily.NCCL_ALL_TO_ALL,
    CollectiveKind.ALL_TO_ALLV: KernelFamily.NCCL_ALL_TO_ALL,
    CollectiveKind.BROADCAST: KernelFamily.NCCL_BROADCAST,
    CollectiveKind.REDUCE: KernelFamily.NCCL_REDUCE,
    CollectiveKind.SEND: KernelFamily.NCCL_SEND_RECV,
    CollectiveKind.RECV: KernelFamily.NCCL_SEND_RECV,
    CollectiveKind.BARRIER: KernelFamily.NCCL_OTHER,
}


class SyncKind(StrEnum):
    """Synchronisation points: stream→stream (event wait) and stream→CPU (blocking)."""

    STREAM_WAIT_EVENT = "stream_wait_event"  # a stream waits for an event recorded on another
    EVENT_RECORD = "event_record"
    EVENT_SYNC = "event_sync"  # CPU blocks on an event
    STREAM_SYNC = "stream_sync"  # CPU blocks on a stream
    DEVICE_SYNC = "device_sync"  # CPU blocks on the whole device

    @property
    def blocks_cpu(self) -> bool:
        return self in (SyncKind.EVENT_SYNC, SyncKind.STREAM_SYNC, SyncKind.DEVICE_SYNC)
