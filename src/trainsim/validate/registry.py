"""The one table of validation suites, and what they share (data location, error summary).

A suite is a function ``run(data_dir: Path, **params) -> dict`` returning at least
``{"suite": name, "cases": [...], "summary": {"median_abs_err_pct", "mape_pct",
"max_abs_err_pct", ...}}``; each case reports its own error (never only averages). Suites are
imported on first use; a suite's optional parameters are the keyword arguments its function
accepts.
"""

from __future__ import annotations

import importlib
import inspect
import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainsim.errors import ConfigError


@dataclass(frozen=True, slots=True)
class SuiteSpec:
    name: str
    module: str
    function: str
    help: str
    reads_data: bool = True  # False: measures on this host or reads shipped files, not --data

    def load(self) -> Callable[..., dict[str, Any]]:
        fn: Callable[..., dict[str, Any]] = getattr(
            importlib.import_module(self.module), self.function
        )
        return fn

    def parameters(self) -> tuple[str, ...]:
        sig = inspect.signature(self.load())
        return tuple(p.name for p in list(sig.parameters.values())[1:] if p.kind is p.KEYWORD_ONLY)


SUITES: tuple[SuiteSpec, ...] = (
    SuiteSpec("replay", "trainsim.validate.replay_suite", "run_replay_suite",
              "simulate every real GPU trace in shared/data/traces against its measured step"),
    SuiteSpec("kernels", "trainsim.validate.kernels_suite", "run_kernels_suite",
              "kernel models against paper 001's held-out operator measurements (A100, GH200)"),
    SuiteSpec("comm", "trainsim.validate.comm_suite", "run_comm_suite",
              "collective models against nccl-tests logs and published sweeps"),
    SuiteSpec("llm", "trainsim.validate.llm_suite", "run_llm_suite",
              "model-driven LLM iteration times against measured Megatron/GPT-NeoX runs (vTrain, paper 001)"),
    SuiteSpec("shard", "trainsim.validate.shard_suite", "run_shard_suite",
              "embedding-sharder choice by predicted step vs real sharded DLRM steps on 2 gloo CPU ranks (000 §V-A)", reads_data=False),
    SuiteSpec("search", "trainsim.validate.search_suite", "run_search_suite",
              "plan ranking: regret of the predicted-best measured plan and Spearman, per ground-truth group"),
    SuiteSpec("cpu-e2e", "trainsim.validate.cpu_e2e_suite", "run_cpu_e2e_suite",
              "resize what-if: captured CPU examples predicted at B/2 and 2B vs captured steps (002 §4.5.1.1)", reads_data=False),
    SuiteSpec("gpu-e2e", "trainsim.validate.gpu_e2e_suite", "run_gpu_e2e_suite",
              "resize what-if on steps captured on a CUDA GPU (shipped: H100) with that GPU's kernel models", reads_data=False),
    SuiteSpec("memory", "trainsim.validate.memory_suite", "run_memory_suite",
              "peak memory of eager HF training steps measured on this CPU vs the impl-hf memory model", reads_data=False),
    SuiteSpec("predtop", "trainsim.learn.suite", "run_predtop_suite",
              "DAG Transformer / GCN / GAT stage-latency MRE vs training fraction on CPU-measured stages (003)", reads_data=False),
)  # fmt: skip


def suite_names() -> list[str]:
    return [s.name for s in SUITES]


def get_suite(name: str) -> SuiteSpec:
    names = suite_names()
    if len(names) != len(set(names)):  # the table is the one source of truth: no duplicates
        raise ConfigError(
            f"validation suites registered twice: {sorted(n for n in names if names.count(n) > 1)}"
        )
    for s in SUITES:
        if s.name == name:
            return s
    raise ConfigError(f"unknown validation suite {name!r}; known: {', '.join(names)}")


# the suite parameters `trainsim validate` exposes as options (others are for library callers)
CLI_OPTIONS = frozenset({"overheads", "kernels", "files", "limit", "sets", "repeats", "seed", "device", "resume",
                         "fractions", "models", "features", "dataset", "protocol", "readout",
                         "members", "per", "stop", "epochs"})  # fmt: skip


def check_params(name: str, **params: Any) -> SuiteSpec:
    """The suite ``name`` (a one-line error for an unknown one) once it accepts every one of
    ``params`` not left at None."""
    spec = get_suite(name)
    given = {k for k, v in params.items() if v is not None}
    accepted = spec.parameters()
    unknown = sorted(given - set(accepted))
    if unknown:
        opts = ", ".join("--" + u.replace("_", "-") for u in unknown)
        flags = [f"--{a.replace('_', '-')}" for a in accepted if a in CLI_OPTIONS]
        raise ConfigError(
            f"suite {name} does not take {opts} (it takes: {', '.join(flags) or 'no options'})"
        )
    return spec


def run_suite(name: str, data_dir: Path, **params: Any) -> dict[str, Any]:
    """Run a suite; ``params`` left at None are not passed, others must be accepted."""
    spec = check_params(name, **params)
    given = {k: v for k, v in params.items() if v is not None}
    if spec.reads_data and not data_dir.is_dir():
        raise ConfigError(
            f"data folder {data_dir} does not exist; pass --data PATH (the shared/data folder)"
        )
    return spec.load()(data_dir, **given)


def default_data_dir() -> Path:
    """``<repo>/../shared/data`` for a source checkout (src layout)."""
    return Path(__file__).resolve().parents[3].parent / "shared" / "data"


def error_summary(errors_pct: Iterable[float | None]) -> dict[str, float | int | None]:
    """median |e|, mean |e| (MAPE) and max |e| over signed percentage errors."""
    abs_e = [abs(e) for e in errors_pct if e is not None and math.isfinite(e)]
    if not abs_e:
        return {"median_abs_err_pct": None, "mape_pct": None, "max_abs_err_pct": None, "cases": 0}
    return {"median_abs_err_pct": statistics.median(abs_e), "mape_pct": statistics.fmean(abs_e),
            "max_abs_err_pct": max(abs_e), "cases": len(abs_e)}  # fmt: skip
