"""Collective metadata from Kineto: kernel args (recent PyTorch), ``record_param_comms`` ops and
``nccl:<collective>`` annotations (older PyTorch, e.g. the PARAM DLRM trace)."""

from __future__ import annotations

import json
import math
from typing import Any

from trainsim.ingest.kineto import Args
from trainsim.ir.kinds import CollectiveKind as C
from trainsim.ir.kinds import KernelFamily

_KIND_BY_NAME: dict[str, C] = {
    "allreduce": C.ALL_REDUCE, "all_reduce": C.ALL_REDUCE, "allreduce_coalesced": C.ALL_REDUCE,
    "all_to_all": C.ALL_TO_ALL, "alltoall": C.ALL_TO_ALL, "all_to_allv": C.ALL_TO_ALLV,
    "alltoall_base": C.ALL_TO_ALL, "all_to_all_single": C.ALL_TO_ALL,
    "allgather": C.ALL_GATHER, "all_gather": C.ALL_GATHER, "_allgather_base": C.ALL_GATHER,
    "all_gather_into_tensor": C.ALL_GATHER, "allgather_into_tensor_coalesced": C.ALL_GATHER,
    "reduce_scatter": C.REDUCE_SCATTER, "reducescatter": C.REDUCE_SCATTER,
    "_reduce_scatter_base": C.REDUCE_SCATTER, "reduce_scatter_tensor": C.REDUCE_SCATTER,
    "reduce_scatter_tensor_coalesced": C.REDUCE_SCATTER,
    "broadcast": C.BROADCAST, "reduce": C.REDUCE, "send": C.SEND, "recv": C.RECV,
    "barrier": C.BARRIER,
}  # fmt: skip

_FAMILY_KIND: dict[KernelFamily, C] = {
    KernelFamily.NCCL_ALL_REDUCE: C.ALL_REDUCE,
    KernelFamily.NCCL_ALL_GATHER: C.ALL_GATHER,
    KernelFamily.NCCL_REDUCE_SCATTER: C.REDUCE_SCATTER,
    KernelFamily.NCCL_ALL_TO_ALL: C.ALL_TO_ALL,
    KernelFamily.NCCL_BROADCAST: C.BROADCAST,
    KernelFamily.NCCL_REDUCE: C.REDUCE,
    KernelFamily.NCCL_SEND_RECV: C.SEND,
}

DTYPE_BYTES: dict[str, int] = {
    "float": 4, "float32": 4, "float16": 2, "half": 2, "c10::half": 2, "bfloat16": 2,
    "c10::bfloat16": 2, "double": 8, "float64": 8, "int": 4, "int32": 4, "long int": 8,
    "long": 8, "int64": 8, "short int": 2, "int16": 2, "signed char": 1, "int8": 1,
    "unsigned char": 1, "uint8": 1, "bool": 1, "byte": 1, "char": 1, "float8_e4m3fn": 1,
    "float8_e5m2": 1, "c10::complex<float>": 8,
}  # fmt: skip


def dtype_bytes(dtype: str | None) -> int | None:
    if not dtype:
        return None
    return DTYPE_BYTES.get(dtype.strip().lower())


def kind_from_name(name: str) -> C | None:
    """Collective kind from ``nccl:all_to_all``, ``c10d::allreduce_`` or a 'Collective name'."""
    low = name.lower().strip()
    for prefix in ("nccl:", "gloo:", "c10d::", "c10d:"):
        if low.startswith(prefix):
            low = low[len(prefix) :]
    low = low.rstrip("_")
    return _KIND_BY_NAME.get(low)


def kind_from_family(family: KernelFamily) -> C | None:
    return _FAMILY_KIND.get(family)


def parse_ranks(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return tuple(value)
    return None


def _splits(value: Any) -> tuple[int, ...] | None:
    parsed = parse_ranks(value)
    return parsed if parsed else None


def first_tensor_bytes(args: Args | None) -> tuple[int | None, str]:
    """Bytes of the first tensor input of an op/annotation with record_shapes."""
    if args is None or not isinstance(args.input_dims, list) or not args.input_dims:
        return None, ""
    dims = args.input_dims[0]
    types = args.input_type if isinstance(args.input_type, list) else []
    dtype = str(types[0]) if types else ""
    if not isinstance(dims, list) or not all(isinstance(d, int) for d in dims):
        return None, dtype
    size = dtype_bytes(dtype)
    if size is None:
        return None, dtype
    return math.prod(dims) * size, dtype


def message(
    kernel_args: Args | None, context_args: Args | None
) -> tuple[int | None, int | None, str, tuple[int, ...] | None]:
    """(in bytes, out bytes, dtype, per-peer split sizes) from kernel args, else the context op."""
    for a in (kernel_args, context_args):
        if a is not None and a.in_nelems is not None:
            size = dtype_bytes(a.dtype) or 1
            out = a.out_nelems * size if a.out_nelems is not None else None
            return a.in_nelems * size, out, a.dtype or "", _splits(a.in_split)
    nbytes, dtype = first_tensor_bytes(context_args)
    return nbytes, None, dtype, None
