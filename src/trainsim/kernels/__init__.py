"""Kernel performance models: spec-based roofline, embedding heuristics (002 §4.3.2.1, 000
§III-E) and learned models (MLP, RandomForest, XGBoost, LightGBM, power laws, calibrated
rooflines) fitted per operator, phase and dtype on micro-benchmarks, selected by held-out error.

>>> from trainsim.ir.graph import Kernel
>>> from trainsim.ir.kinds import KernelFamily
>>> k = Kernel(0, "gemm", KernelFamily.GEMM, 7, features={"op": "gemm", "m": 4096, "n": 4096, "k": 4096})
>>> seconds, provenance = predict_kernel(k, "h100")
>>> provenance
'spec-based:h100-sxm5-80gb'
"""

from trainsim.kernels.calibrated import LearnedEntry, LearnedKernelModel
from trainsim.kernels.embedding import EmbeddingLookupModel
from trainsim.kernels.features import OPS, OpSpec, Phase, derive, op_spec
from trainsim.kernels.fitting import EntryReport, FitResult, family_summary, fit_entry, fit_kernels
from trainsim.kernels.learned import DEFAULT_KINDS, KINDS
from trainsim.kernels.model import (
    KernelModel,
    KernelPrediction,
    KernelQuery,
    query,
    query_from_kernel,
)
from trainsim.kernels.readers import (
    FORMATS,
    read_kernel_dataset,
    read_seed001_errors,
    write_kernel_dataset,
)
from trainsim.kernels.registry import (
    load_model,
    models_for,
    predict_kernel,
    predict_query,
    read_artifact,
    registered_models,
    save_model,
    shipped_models,
)
from trainsim.kernels.roofline import RooflineModel
from trainsim.kernels.samples import EntryKey, KernelDataset, KernelSample

__all__ = [
    "DEFAULT_KINDS",
    "FORMATS",
    "KINDS",
    "OPS",
    "EmbeddingLookupModel",
    "EntryKey",
    "EntryReport",
    "FitResult",
    "KernelDataset",
    "KernelModel",
    "KernelPrediction",
    "KernelQuery",
    "KernelSample",
    "LearnedEntry",
    "LearnedKernelModel",
    "OpSpec",
    "Phase",
    "RooflineModel",
    "derive",
    "family_summary",
    "fit_entry",
    "fit_kernels",
    "load_model",
    "models_for",
    "op_spec",
    "predict_kernel",
    "predict_query",
    "query",
    "query_from_kernel",
    "read_artifact",
    "read_kernel_dataset",
    "read_seed001_errors",
    "registered_models",
    "save_model",
    "shipped_models",
    "write_kernel_dataset",
]
