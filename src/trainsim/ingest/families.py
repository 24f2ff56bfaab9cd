"""Kernel name (and launching op name) → kernel family.

One ordered table of (pattern, family); the first match wins. Patterns are matched against the
lower-cased kernel name, then the op name; names come from CUDA (cuBLAS/cuDNN/ATen/FBGEMM/NCCL)
and ROCm (rocBLAS/hipBLASLt/MIOpen/RCCL) libraries as they appear in Kineto traces.
"""

from __future__ import annotations

import re
from functools import lru_cache

from trainsim.ir.kinds import KernelFamily as F

_NCCL_TABLE: tuple[tuple[str, F], ...] = (
    ("allreduce", F.NCCL_ALL_REDUCE),
    ("all_reduce", F.NCCL_ALL_REDUCE),
    ("allgather", F.NCCL_ALL_GATHER),
    ("all_gather", F.NCCL_ALL_GATHER),
    ("reducescatter", F.NCCL_REDUCE_SCATTER),
    ("reduce_scatter", F.NCCL_REDUCE_SCATTER),
    ("alltoall", F.NCCL_ALL_TO_ALL),
    ("all_to_all", F.NCCL_ALL_TO_ALL),
    ("broadcast", F.NCCL_BROADCAST),
    ("sendrecv", F.NCCL_SEND_RECV),
    ("send", F.NCCL_SEND_RECV),
    ("recv", F.NCCL_SEND_RECV),
    ("reduce", F.NCCL_REDUCE),
)

_KERNEL_TABLE: tuple[tuple[re.Pattern[str], F], ...] = tuple(
    (re.compile(p), f)
    for p, f in (
        (r"flash|fmha|attention|sdpa|mha_", F.ATTENTION),
        (r"embedding_backward|split_embedding_backward|embedding_dense_backward"
         r"|backward_.*embedding|embedding.*_backward|_bwd_.*tbe", F.EMBEDDING_BWD),
        (r"embedding|embedding_bag|split_embedding|tbe_|batched_embedding", F.EMBEDDING_FWD),
        (r"conv|winograd|implicit_gemm|cudnn::|miopen|implicit_convolve|fft2d|scudnn|"
         r"xmma_fprop|xmma_dgrad|xmma_wgrad|sm\d+_xmma_fprop|dgrad|wgrad", F.CONV),
        (r"(?<!fb)gemm|gemv|sgemm|hgemm|cutlass|cublas|ampere_.*_tn|volta_.*_(nn|nt|tn|tt)|turing_|"
         r"sm\d+_xmma|magma|rocblas|hipblaslt|tensile|cijk_|nvjet|matmul|bmm", F.GEMM),
        (r"layer_norm|layernorm|rms_?norm|batch_norm|batchnorm|bn_fw|bn_bw|group_norm|"
         r"instance_norm|welford", F.NORM),
        (r"softmax", F.SOFTMAX),
        (r"adam|adagrad|sgd_|multi_tensor_apply|fused_optim|lamb_|rowwise_adagrad", F.OPTIMIZER),
        (r"radixsort|radix_sort|devicescan|devicesegmented|cub::|sort_|scan_|unique|thrust",
         F.SORT_SCAN),
        (r"index|gather|scatter|take|masked|nonzero|embedding_permute|permute_2d|cat_array|"
         r"catarraybatchedcopy|linearize", F.INDEX),
        (r"reduce_kernel|reduction|sum_functor|norm_kernel|mean_|max_pool|avg_pool|pool", F.REDUCTION),
        (r"elementwise|vectorized|unrolled|functor|pointwise|triton_|activation|relu|gelu|"
         r"silu|sigmoid|tanh|dropout|fill|copy|add|mul|div|exp|sqrt|clamp|where|threshold", F.ELEMENTWISE),
    )
)


@lru_cache(maxsize=65536)
def classify_kernel(name: str, category: str = "kernel", op_name: str = "") -> F:
    """Family of a device activity. ``category`` is the Kineto category (kernel/gpu_memcpy/...)."""
    if category in ("gpu_memcpy", "Memcpy"):
        return F.MEMCPY
    if category in ("gpu_memset", "Memset"):
        return F.MEMSET
    low = name.lower()
    if "nccl" in low or "rccl" in low or low.startswith("c10d"):
        return nccl_family(low)
    for pat, fam in _KERNEL_TABLE:
        if pat.search(low):
            return fam
    op_low = op_name.lower()
    if op_low:
        for pat, fam in _KERNEL_TABLE:
            if pat.search(op_low):
                return fam
    return F.OTHER


def nccl_family(text: str) -> F:
    low = text.lower().replace("ncclkernel_", "").replace("nccldevkernel_", "")
    for key, fam in _NCCL_TABLE:
        if key in low:
            return fam
    return F.NCCL_OTHER
