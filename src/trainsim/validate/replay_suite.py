"""The ``replay`` suite: simulate every real GPU trace in ``shared/data/traces`` and compare the
predicted step with the measured one, beside the kernel-sum baseline of 000 §IV-B.

Cases are the table ``CASES`` (one source of truth): multi-rank jobs with every rank, single
ranks of multi-rank jobs (absent peers are taken to arrive on time: a collective's transfer is
its measured duration), single-GPU traces, and small fixtures. A case whose traces do not load
(an ingestion limitation) or hold no GPU kernel is reported as skipped with the reason and
left out of the summary.

``overheads``: ``stats`` (default) and ``trace`` as in ``trainsim replay``; ``shared`` builds
the overhead database of each case from the *other* cases recorded on the same device
(leave-one-out, 002-style IQR-filtered means, sampled as the simulator replays them:
``workload_overhead_db``), i.e. overheads shared
across workloads of one platform as in 000's experiments; a case without such a neighbour is
skipped.

**Replayable.** A trace can be replayed within target only if its traced causes explain its
step: every case is also replayed with each kernel starting as soon as its runtime call, its
stream and its dependencies allow (``trainsim.sim.unexplained``). When that replay is shorter
than the step by more than the suite's error target (``TARGET_PCT`` of the step), the rest is
kernels waiting on something the trace does not show (absent peers, untraced work), which no
statistic can reproduce: the case is marked ``replayable: false`` with the figure and its
largest late kernel, stays in ``cases``, and is left out of ``summary`` (replayable cases);
``summary_all`` covers every case.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainsim.errors import TrainsimError
from trainsim.sim.options import HostMode, KernelSource
from trainsim.validate.registry import error_summary

if TYPE_CHECKING:
    from trainsim.sim.unexplained import Explanation

TARGET_PCT = 5.0  # the suite's error target: |error| <= 5 % of the measured step


@dataclass(frozen=True, slots=True)
class ReplayCase:
    name: str
    paths: tuple[str, ...]  # relative to shared/data/traces
    note: str


CASES: tuple[ReplayCase, ...] = (
    ReplayCase("param_dlrm_8xv100", ("param_dlrm_8xv100/dlrm_kineto.tar.gz",),
               "8 ranks, DLRM, NCCL all_to_all + all_reduce"),
    ReplayCase("hta_misc/sampled_ranks_0_1", ("hta_misc/sampled_rank-0.json.gz", "hta_misc/sampled_rank-1.json.gz"),
               "ranks 0-1 of 128, sampled traces (skipped: incomplete steps)"),
    ReplayCase("hta_resnet50_ddp_a100", ("hta_resnet50_ddp_a100",), "rank 0 of 2, DDP; absent peer on time"),
    ReplayCase("hta_recsys_16rank_a100", ("hta_recsys_16rank_a100",), "rank 0 of 16, recsys; absent peers on time"),
    ReplayCase("hta_resnet50_v100", ("hta_resnet50_v100",), "1 GPU, GPU-bound"),
    ReplayCase("param_linear_2080ti", ("param_linear_2080ti/linear_kineto.json.gz",), "1 GPU, CPU-bound MLP"),
    ReplayCase("param_resnet_2080ti", ("param_resnet_2080ti",), "1 GPU, steps found without markers"),
    ReplayCase("hta_critical_path/alexnet", ("hta_critical_path/alexnet",), "1 GPU, whole trace"),
    ReplayCase("hta_critical_path/simple_add", ("hta_critical_path/simple_add",), "1 GPU, whole trace"),
    ReplayCase("hta_critical_path/cuda_event_sync", ("hta_critical_path/cuda_event_sync",), "sync fixture"),
    ReplayCase("hta_critical_path/cuda_event_sync_multi_stream", ("hta_critical_path/cuda_event_sync_multi_stream",),
               "multi-stream event-wait fixture"),
    ReplayCase("hta_misc/benchmark_simple_add", ("hta_misc/benchmark_simple_add_trace.json.gz",), "1 GPU, whole trace"),
    ReplayCase("hta_misc/triton_example", ("hta_misc/triton_example.json.gz",), "Triton kernels"),
    ReplayCase("hta_misc/mi250_minitoy_train", ("hta_misc/mi250_minitoy_train_ROCm6_2_kineto.json.gz",), "AMD MI250, ROCm"),
)  # fmt: skip


def _load(data_dir: Path, case: ReplayCase) -> tuple[Any, str | None, str]:
    """(workload or None, why not, status): ``skipped`` for what is absent or not replayable
    by nature, ``failed`` for a file that is there but does not load."""
    from trainsim.sim.replay import load_for_replay

    paths = [data_dir / "traces" / p for p in case.paths]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        return None, f"missing {', '.join(missing)}", "skipped"
    try:
        loaded = load_for_replay(paths, link_et=False)
    except TrainsimError as e:
        return None, f"does not load: {e}", "failed"
    workload = loaded.workload
    if loaded.sampled:
        return None, "sampled trace (a fraction of its events recorded): no complete step to replay", "skipped"
    if workload.measured_step_s is None:
        return None, "no measured step", "skipped"
    if not any(r.kernels() for r in workload.ranks):
        return None, "no GPU kernels in the step", "skipped"
    return workload, None, "ok"


def run_replay_suite(
    data_dir: Path, *, overheads: str = "stats", kernels: str = "measured"
) -> dict[str, Any]:
    from trainsim.sim import SimOptions, simulate
    from trainsim.sim.program import workload_overhead_db
    from trainsim.sim.replay import kernel_model_coverage, pct_error
    from trainsim.sim.unexplained import explain

    mode, source = HostMode(overheads), KernelSource(kernels)
    loaded = [(c, *_load(Path(data_dir), c)) for c in CASES]
    rows: list[dict[str, Any]] = []
    for case, workload, reason, status in loaded:
        row: dict[str, Any] = {"case": case.name, "note": case.note, "files": list(case.paths)}
        if workload is None:
            rows.append({**row, "status": status, "reason": reason})
            continue
        db = None
        if mode is HostMode.SHARED:
            device = workload.metadata.get("device", "")
            others = [
                w
                for c, w, _, _ in loaded
                if w is not None and c is not case and w.metadata.get("device", "") == device
            ]
            if not others:
                rows.append(
                    {
                        **row,
                        "status": "skipped",
                        "reason": f"no other trace recorded on {device or 'this device'}",
                    }
                )
                continue
            db = workload_overhead_db(others)
            row["overheads_from"] = [
                c.name for c, w, _, _ in loaded if w is not None and any(w is o for o in others)
            ]
        t0 = time.perf_counter()
        try:
            res = simulate(workload, SimOptions(kernels=source, overheads=mode, overhead_db=db))
            elapsed = time.perf_counter() - t0
            exact = mode is HostMode.TRACE and source is KernelSource.MEASURED
            why = explain(workload, trace_result=res if exact else None)
        except TrainsimError as e:
            rows.append({**row, "status": "failed", "reason": str(e)})
            continue
        measured = workload.measured_step_s
        rows.append({
            **row, "status": "ok", "ranks": len(workload.ranks), "device": workload.metadata.get("device", ""),
            "measured_step_s": measured, "predicted_step_s": res.predicted_step_s,
            "error_pct": pct_error(res.predicted_step_s, measured),
            "kernel_sum_baseline_s": res.device_kernel_sum_baseline_s,
            "baseline_error_pct": pct_error(res.device_kernel_sum_baseline_s, measured),
            **_replayability(why, measured), "simulate_s": elapsed,
            # --kernels model: the share of kernels a model timed (the rest kept their measured time)
            **({"kernel_model_coverage": kernel_model_coverage(res.diagnostics)}
               if source is KernelSource.MODEL else {}),
        })  # fmt: skip
    ok = [r for r in rows if r["status"] == "ok"]
    return {"suite": "replay", "params": {"overheads": mode.value, "kernels": source.value},
            "target_pct": TARGET_PCT, "cases": rows,
            "summary": _summary([r for r in ok if r["replayable"]], rows),
            "summary_all": _summary(ok, rows)}  # fmt: skip


def _replayability(why: Explanation, measured_s: float | None) -> dict[str, Any]:
    step = measured_s or why.trace_step_s
    pct = 100.0 * why.unexplained_step_s / step if step > 0 else 0.0
    out: dict[str, Any] = {
        "unexplained_step_s": why.unexplained_step_s, "unexplained_step_pct": pct,
        "unexplained_wait_s": why.unexplained_wait_s,
        "graph_internal_wait_s": why.graph_internal_wait_s, "replayable": pct <= TARGET_PCT,
    }  # fmt: skip
    top = why.largest()
    if top is not None:
        out["largest_unexplained"] = {"kernel": top[0], "start_s": top[1], "wait_s": top[2]}
    if not out["replayable"]:
        late = f"; largest: {top[0][:60]} idled the device {top[2] * 1e3:.3f} ms" if top else ""
        out["reason"] = (
            f"{pct:.1f} % of the step ({why.unexplained_step_s * 1e3:.3f} ms) is kernels waiting "
            f"beyond every traced cause (over the {TARGET_PCT:g} % target){late}"
        )
    return out


def _summary(cases: list[dict[str, Any]], rows: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = error_summary(r["error_pct"] for r in cases)
    base = error_summary(r["baseline_error_pct"] for r in cases)
    summary.update({f"baseline_{k}": v for k, v in base.items() if k != "cases"})
    summary["skipped"] = sum(r["status"] != "ok" for r in rows)
    summary["not_replayable"] = sum(r["status"] == "ok" and not r["replayable"] for r in rows)
    cover = [r["kernel_model_coverage"] for r in cases if "kernel_model_coverage" in r]
    if cover:  # --kernels model: cases no model touched are measured-kernel replays
        summary["cases_without_kernel_models"] = sum(not c for c in cover)
    return summary
