"""The ``analyze`` pipeline as one function: load traces, link ETs, break down every rank."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trainsim.analyze.breakdown import RankBreakdown, workload_breakdown
from trainsim.ingest.multirank import LoadedTraces, load_traces
from trainsim.ir.graph import Workload

CPU_ONLY_NOTE = (
    "no device kernels in this trace (a CPU-only capture): the whole step is CPU op time and ends "
    "with the step's CPU window{gloo}; device idle and GPU utilisation are null, top_ops ranks "
    "ops by CPU time; `trainsim replay TRACE --batch N` predicts a CPU capture at another batch "
    "(docs/capture.md)"
)
_CUT_TAIL_S, _CUT_TAIL_FRACTION = 1e-3, 0.10  # a window's op-free tail that says "cut trace"
_GLOO_NOTE = ", gloo collectives ran on CPU threads (communication, streams marked host_thread)"


@dataclass(slots=True)
class Analysis:
    loaded: LoadedTraces
    workload: Workload
    ranks: list[RankBreakdown]
    et_link: dict[int, dict[str, Any]] = field(default_factory=dict)
    written: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # warnings about what was written

    def warnings(self) -> list[str]:
        out = [*self.loaded.warnings, *self.notes]
        for r in self.workload.ranks:
            if r.metadata.get("sampled"):
                cov = r.metadata.get("event_coverage") or 0.0
                out.append(
                    f"rank {r.rank}: sampled or cut trace ({100 * cov:.1f} % of its events kept): "
                    "no step time, collectives not matched"
                )
            tail, win = r.metadata.get("window_tail_without_ops_s"), self._window_s(r.rank)
            if tail and win and r.metadata.get("step_from_marker") and tail > max(_CUT_TAIL_S, _CUT_TAIL_FRACTION * win):
                # complete traces leave ≤ 1 % of the window after the last op (8 shipped)
                span = f"{tail:.3g} s" if tail >= 1.0 else f"{tail * 1e3:.3g} ms"
                out.append(f"rank {r.rank}: no op in the last {span} ({100 * tail / win:.0f} %) of its "
                           f"ProfilerStep window: the trace may be cut short; its step time counts only the events present")  # fmt: skip
            if r.metadata.get("step_anchor"):
                out.append(f"rank {r.rank}: no ProfilerStep markers; iteration cut at {r.metadata['step_anchor']!r}")
        cpu = [r for r in self.workload.ranks if r.cpu_only]
        if cpu:
            gloo = _GLOO_NOTE if any(k.on_host for r in cpu for k in r.kernels()) else ""
            which = "" if len(cpu) == len(self.workload.ranks) else f"ranks {[r.rank for r in cpu]}: "
            out.append(which + CPU_ONLY_NOTE.format(gloo=gloo))
        if self.loaded.match.peers_missing:
            out.append("some collective peers are not among the input traces (single rank of a larger job)")
        from trainsim.ingest.link import pid_mismatch_warnings
        from trainsim.ingest.multirank import skipped_note

        out.extend(pid_mismatch_warnings(self.et_link))
        note = skipped_note(self.loaded.skipped)
        if note:
            out.append(note)
        return out

    def _window_s(self, rank: int) -> float | None:
        step = self.loaded.chosen.get(rank)
        trace = self.loaded.traces.get(rank)
        return (step.end - step.start) * trace.unit_to_s if step is not None and trace is not None else None

    def to_dict(self) -> dict[str, Any]:
        w = self.workload
        return {
            "measured_step_s": w.measured_step_s,
            "device": w.metadata.get("device", ""),
            "world_size": w.metadata.get("world_size"),
            "files": w.metadata.get("files", []),
            "steps": {
                str(r): [
                    {"number": s.number, "cpu_window_s": (s.end - s.start) * self.loaded.traces[r].unit_to_s,
                     "from_marker": s.from_marker}
                    for s in steps
                ]
                for r, steps in self.loaded.steps.items()
            },
            "chosen_step": {str(r): s.number for r, s in self.loaded.chosen.items()},
            "ranks": [b.to_dict() for b in self.ranks],
            "collectives_matched": self.loaded.match.to_dict(),
            "et_link": {str(k): v for k, v in self.et_link.items()},
            "skipped_inputs": self.loaded.skipped,
            "warnings": self.warnings(),
            "written": self.written,
            "provenance": "measured (real trace)",
        }  # fmt: skip


def analyze_paths(
    paths: Sequence[str | Path],
    *,
    step: str | int = "median",
    time_unit: str | None = None,
    link_et: bool = True,
    overhead_db: str | Path | None = None,
    export_kernels: str | Path | None = None,
    save_workload_to: str | Path | None = None,
) -> Analysis:
    loaded = load_traces(paths, step=step, time_unit=time_unit)
    workload = loaded.workload
    et_link: dict[int, dict[str, Any]] = {}
    if link_et and loaded.et_blobs:
        try:
            from trainsim.ingest.link import attach_execution_traces
        except ImportError:  # pragma: no cover - optional during development
            attach_execution_traces = None  # type: ignore[assignment]
        if attach_execution_traces is not None:
            workload, stats = attach_execution_traces(loaded)
            et_link = {r: _stats_dict(s) for r, s in stats.items()}
    analysis = Analysis(loaded=loaded, workload=workload, ranks=workload_breakdown(workload), et_link=et_link)
    if overhead_db is not None:
        from trainsim.sim.program import workload_overhead_db

        db = workload_overhead_db([workload])
        db.save(overhead_db)
        analysis.written["overhead_db"] = str(overhead_db)
        if bad := db.implausible():
            analysis.notes.append(f"{overhead_db}: {', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}: longer "
                                  "than one op's host overhead can be (a stall in the trace?); `replay "
                                  "--overhead-db` refuses such values: remove them from the file")  # fmt: skip
    if export_kernels is not None:
        from trainsim.analyze.samples import export_kernel_samples

        n = export_kernel_samples(workload, export_kernels)
        analysis.written["kernel_samples"] = f"{export_kernels} ({n} rows)"
    if save_workload_to is not None:
        from trainsim.ir.serialize import save_workload

        manifest = _capture_manifest([Path(p) for p in paths])
        if manifest and "capture" not in workload.metadata:  # what `trainsim capture` recorded (batch,
            # length, width), for replay's resizes; a saved IR re-saved keeps its own
            workload = replace(workload, metadata={**workload.metadata, "capture": manifest})
        save_workload(workload, save_workload_to)
        analysis.written["workload"] = str(save_workload_to)
    return analysis


def _capture_manifest(paths: list[Path]) -> dict[str, Any]:
    """The capture.json of a ``trainsim capture`` folder (the folder given, or the one holding
    the first trace file); {} when there is none or it cannot be read."""
    import json

    from trainsim.capture.manifest import MANIFEST_NAME

    first = paths[0]
    try:
        doc = json.loads(((first if first.is_dir() else first.parent) / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _stats_dict(s: Any) -> dict[str, Any]:
    if hasattr(s, "to_dict"):
        return dict(s.to_dict())
    from dataclasses import asdict, is_dataclass

    if is_dataclass(s) and not isinstance(s, type):
        return asdict(s)
    return dict(s)
