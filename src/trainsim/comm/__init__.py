"""Collective communication models: fitted piecewise curves (000 §III-C), an analytical
hierarchical alpha-beta model per algorithm, readers for published measurements.

>>> from trainsim.comm import predict_collective
>>> p = predict_collective("all_reduce", 2**30, 128, system="azure-nd-a100-v4")
>>> p.provenance.startswith("calibrated:")
True
"""

from trainsim.comm.calibrated import CalibratedCommModel, FittedCase, anchored_time, choose_anchor
from trainsim.comm.fitting import (
    FitResult,
    calibrate_hierarchical,
    fit_comm,
    guess_system,
    implausible_mask,
)
from trainsim.comm.hierarchical import HierarchicalModel, HierParams
from trainsim.comm.metrics import gmae_pct, mape_pct, max_abs_err_pct
from trainsim.comm.model import CommModel, CommPrediction, canonical_kind
from trainsim.comm.piecewise import PiecewiseCurve, fit_piecewise
from trainsim.comm.readers import FORMATS, read_comm_dataset, read_seed001_errors
from trainsim.comm.registry import (
    load_model,
    model_from_dict,
    models_for,
    predict_collective,
    predict_ir_collective,
    registered_models,
    save_model,
    shipped_models,
)
from trainsim.comm.samples import CaseKey, CommDataset, CommSample
from trainsim.comm.sizing import all_to_all_size_bytes, model_size_bytes

__all__ = [
    "FORMATS",
    "CalibratedCommModel",
    "CaseKey",
    "CommDataset",
    "CommModel",
    "CommPrediction",
    "CommSample",
    "FitResult",
    "FittedCase",
    "HierParams",
    "HierarchicalModel",
    "PiecewiseCurve",
    "all_to_all_size_bytes",
    "anchored_time",
    "calibrate_hierarchical",
    "canonical_kind",
    "choose_anchor",
    "fit_comm",
    "fit_piecewise",
    "gmae_pct",
    "guess_system",
    "implausible_mask",
    "load_model",
    "mape_pct",
    "max_abs_err_pct",
    "model_from_dict",
    "model_size_bytes",
    "models_for",
    "predict_collective",
    "predict_ir_collective",
    "read_comm_dataset",
    "read_seed001_errors",
    "registered_models",
    "save_model",
    "shipped_models",
]
