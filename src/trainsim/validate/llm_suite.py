"""The ``llm`` validation suite: model-driven predictions against measured iteration times.

Cases are the rows of shared/data/ground_truth (:mod:`trainsim.validate.llm_cases`): vTrain's
Megatron-DeepSpeed runs on A100 (109 multi-node rows, 1,440 single-node rows) and paper 001's
GPT-NeoX runs on Perlmutter (A100) and Vista (GH200); and trainsim's own GPT-2 captures on one
H100 (shipped with the package). Each is predicted from micro-benchmarks
and hardware data only — kernel models fitted on paper 001's operator measurements (the H100's
on trainsim's own bench sample, :mod:`trainsim.builders.bench_costs`), collective
models fitted on the systems' NCCL measurements or spec-based — never from these iteration
times (the honesty rule of the LLM issue): nothing in this suite fits anything.

Per case: measured, predicted (simulation), both closed forms, signed error, provenance
summary. Summaries per file (``groups``) and over all cases; the published tools' errors on
the same files are given beside ours.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trainsim.builders.costs import OpCoster
from trainsim.builders.predict import predict_llm
from trainsim.errors import TrainsimError
from trainsim.hardware import get_device, get_system
from trainsim.validate.llm_cases import LLMCase, parse_tags, read_cases
from trainsim.validate.registry import error_summary

# Published MAPEs on the same files (data README; paper 001 §IV)
PUBLISHED: dict[str, dict[str, float]] = {
    "vtrain-multi": {"vTrain": 14.73, "Calculon": 11.1, "llm-analysis": 17.0},
    "vtrain-single": {"vTrain": 8.37, "Calculon": 38.9},
    "seed001-perlmutter": {"paper 001": 4.98},
    "seed001-vista": {"paper 001": 9.38},
}
TARGETS = {
    "vtrain-multi": 6.0,
    "vtrain-single": 8.0,
    "seed001-perlmutter": 5.0,
    "seed001-vista": 9.0,
}


def _group(case: LLMCase) -> str:
    tag = case.id.split(":", 1)[0]
    if tag.startswith("seed001"):
        return f"seed001-{case.system}"
    return tag


def _pct(pred: float, meas: float) -> float:
    return 100.0 * (pred - meas) / meas


def run_llm_suite(data_dir: Path, *, files: str | None = None, limit: int | None = None,
                  simulate: bool = True, progress: bool = False) -> dict[str, Any]:  # fmt: skip
    """Predict every ground-truth row; ``files``: comma-separated tags (default all),
    ``limit``: the first N rows of each file (quick runs)."""
    cases = read_cases(data_dir / "ground_truth", parse_tags(files))
    if limit:
        seen: dict[str, int] = {}
        kept = []
        for c in cases:
            g = c.id.split(":", 1)[0]
            if seen.get(g, 0) < limit:
                kept.append(c)
                seen[g] = seen.get(g, 0) + 1
        cases = kept
    costers: dict[str, OpCoster] = {}
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    bar = _progress(len(cases)) if progress else None
    for case in cases:
        system = get_system(case.system)
        coster = costers.setdefault(system.device, OpCoster(get_device(system.device)))
        row: dict[str, Any] = {"id": case.id, "group": _group(case), "model": case.model.name,
                               "plan": case.plan.label(), "system": case.system, "gpus": case.plan.gpus,
                               "measured_s": case.measured_s, "reference": case.reference}  # fmt: skip
        try:
            t = time.perf_counter()
            r = predict_llm(case.model, case.plan, system, simulate=simulate, coster=coster)
            row.update({
                "predicted_s": r.iteration_time_s, "err_pct": _pct(r.iteration_time_s, case.measured_s),
                "closed_form_001_err_pct": _pct(r.closed_form_s["001_eq7"], case.measured_s),
                "closed_form_003_err_pct": _pct(r.closed_form_s["003_eq4"], case.measured_s),
                "memory_per_gpu_bytes": r.peak_memory.total_bytes, "fits_in_memory": r.fits_in_memory,
                "breakdown": r.breakdown, "provenance": r.provenance["summary"],
                "latency_s": time.perf_counter() - t,
            })  # fmt: skip
        except TrainsimError as e:
            row.update({"predicted_s": None, "err_pct": None, "error": str(e)})
        rows.append(row)
        if bar:
            bar(1)
    groups: dict[str, Any] = {}
    for g in sorted({r["group"] for r in rows}):
        rs = [r for r in rows if r["group"] == g]
        groups[g] = {
            **error_summary(r["err_pct"] for r in rs),
            "closed_form_001": error_summary(r.get("closed_form_001_err_pct") for r in rs),
            "closed_form_003": error_summary(r.get("closed_form_003_err_pct") for r in rs),
            "mean_signed_err_pct": _mean(r["err_pct"] for r in rs),
            "failed": sum(r["predicted_s"] is None for r in rs),
            "target_mape_pct": TARGETS.get(g),
            "published_mape_pct": PUBLISHED.get(g, {}),
        }
    lat = [r["latency_s"] for r in rows if r.get("latency_s") is not None]
    return {
        "suite": "llm",
        "cases": rows,
        "groups": groups,
        "summary": {
            **error_summary(r["err_pct"] for r in rows),
            "median_latency_s": sorted(lat)[len(lat) // 2] if lat else None,
            "wall_s": time.perf_counter() - t0,
        },  # fmt: skip
    }


def _mean(xs: Iterable[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return sum(v) / len(v) if v else None


def _progress(total: int) -> Any:
    """A rich progress bar on stderr (advance with the returned callable)."""
    import sys

    if not sys.stderr.isatty():
        return None
    from rich.console import Console
    from rich.progress import Progress

    p = Progress(transient=True, console=Console(stderr=True))  # stdout may hold the JSON
    p.start()
    task = p.add_task("llm cases", total=total)

    def advance(n: int) -> None:
        p.advance(task, n)
        if p.tasks[0].finished:
            p.stop()

    return advance
