"""Replay real traces: load, simulate, compare with the measured step (``trainsim replay``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainsim.errors import ConfigError
from trainsim.ir.graph import Workload
from trainsim.sim import SimOptions, SimResult, simulate


def pct_error(predicted_s: float | None, measured_s: float | None) -> float | None:
    """Signed relative error in percent (None without a measurement or a prediction)."""
    if predicted_s is None or measured_s is None or measured_s <= 0.0:
        return None
    return 100.0 * (predicted_s - measured_s) / measured_s


@dataclass(frozen=True, eq=False)
class Replay:
    """A simulated workload next to its measurement."""

    files: tuple[str, ...]
    workload: Workload
    result: SimResult
    collectives: dict[str, Any] = field(default_factory=dict)
    et_link: dict[str, Any] = field(default_factory=dict)
    whatif: dict[str, Any] = field(default_factory=dict)
    sampled: bool = False  # a sampled trace: its measured step is incomplete
    skipped: tuple[str, ...] = ()  # input files not read, each "<name>: <why>"
    notes: tuple[str, ...] = ()  # odd but usable input (ingestion's warnings), one line each

    @property
    def measured_step_s(self) -> float | None:
        return self.workload.measured_step_s

    @property
    def error_pct(self) -> float | None:
        return pct_error(self.result.predicted_step_s, self.measured_step_s)

    @property
    def baseline_error_pct(self) -> float | None:
        return pct_error(self.result.device_kernel_sum_baseline_s, self.measured_step_s)

    def to_dict(self, *, segments: bool = True) -> dict[str, Any]:
        res = self.result
        sim = res.to_dict(segments=segments)
        ranks = []
        for r in sim["ranks"]:
            r["error_pct"] = pct_error(r["predicted_step_s"], r["measured_step_s"])
            ranks.append(r)
        o = res.options
        return {
            "files": list(self.files),
            "device": self.workload.metadata.get("device", ""),
            "options": {"kernels": o.kernels.value, "overheads": o.overheads.value,
                        "intra_rank_sync": o.intra_rank_sync, "thread_edges": o.thread_edges},
            "measured_step_s": self.measured_step_s,
            "predicted_step_s": res.predicted_step_s,
            "error_pct": self.error_pct,
            "kernel_sum_baseline_s": res.device_kernel_sum_baseline_s,
            "baseline_error_pct": self.baseline_error_pct,
            "ranks": ranks,
            "critical_path": sim["critical_path"],
            "collectives_matched": self.collectives,
            "et_link": self.et_link,
            "whatif": self.whatif,
            "sampled_trace": self.sampled,
            "skipped_inputs": list(self.skipped),
            "input_warnings": list(self.notes),
            "diagnostics": sim["diagnostics"],
            "provenance": _provenance(o.kernels.value, sim["diagnostics"], _model_kinds(res)),
            "collective_system": _system(res),
        }  # fmt: skip


def kernel_counts(diagnostics: dict[str, int]) -> tuple[int, int]:
    """(kernels a model timed, kernels that kept their measured time for want of a model) of a
    ``--kernels model`` simulation, from its diagnostics."""
    return diagnostics.get("kernels_model", 0), diagnostics.get("kernels_model_fallback_measured", 0)


def _model_kinds(res: Any) -> dict[str, int]:
    """Kernels a model timed, by the kind of model: ``spec-based`` or ``calibrated`` (DESIGN:
    every prediction says which)."""
    out: dict[str, int] = {}
    for rp in res.program.ranks:
        for p in rp.k_prov:  # a model's answer; a builder's, a what-if's or a measured time is not counted
            kind = "calibrated" if p.startswith("calibrated") else "spec-based" if p.startswith("spec-based") else None
            if kind is not None:
                out[kind] = out.get(kind, 0) + 1
    return out


def _provenance(kernels: str, diagnostics: dict[str, int], kinds: dict[str, int] | None = None) -> str:
    """Where the kernel times came from: with ``--kernels model``, how many a model answered
    (a device without models leaves every kernel at its measured time), and by which kind."""
    if kernels == "measured":
        return "measured kernels"
    modelled, kept = kernel_counts(diagnostics)
    if not modelled:
        return f"measured kernels: no kernel model answered any of the {kept} kernels"
    by = f": {', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))}" if kinds else ""
    if not kept:
        return f"kernel models ({modelled} kernels{by})"
    return f"kernel models for {modelled} of {modelled + kept} kernels{by}; measured for the rest"


def kernel_model_coverage(diagnostics: dict[str, int]) -> float | None:
    """The fraction of kernels a model timed under ``--kernels model`` (None: no kernel asked)."""
    modelled, kept = kernel_counts(diagnostics)
    return modelled / (modelled + kept) if modelled + kept else None


def _system(res: SimResult) -> dict[str, str] | None:
    """The catalog system whose comm models timed the collectives (``--kernels model``)."""
    cs = res.program.collective_system
    if cs is None:
        return None
    from trainsim.comm.registry import shadowed_note

    note = shadowed_note(cs.spec)  # its calibrated models skipped: an edited copy of a catalog system
    return {"name": cs.spec.name, "source": cs.source, **({"note": note} if note else {})}


@dataclass(frozen=True, eq=False)
class Loaded:
    """A workload read from traces, with what ``replay`` reports about its ingestion."""

    workload: Workload
    collectives: dict[str, Any]
    et_link: dict[str, Any]
    sampled: bool  # some trace records only a sample of its events: no complete step
    skipped: tuple[str, ...] = ()  # input files not read, each "<name>: <why>"
    notes: tuple[str, ...] = ()  # odd but usable input (LoadedTraces.warnings)


def load_for_replay(
    paths: Sequence[str | Path], *, step: str | int = "median", link_et: bool = True
) -> Loaded:
    """The workload of some traces, with execution traces linked when given and linkable; or
    one workload IR file as ``analyze --save-workload`` writes it (re-simulated as saved)."""
    from trainsim.ingest import load_traces

    if len(paths) == 1 and _is_workload_ir(Path(paths[0])):
        from trainsim.ir import load_workload

        for flag, given in (("--step", step != "median"), ("--no-et", not link_et)):
            if given:  # the IR holds the one step it was saved with, its execution traces linked
                raise ConfigError(f"{flag} applies to traces; {paths[0]} is a saved workload IR (one step, as saved)")
        return Loaded(load_workload(paths[0]), {}, {}, False)
    loaded = load_traces(paths, step=step)
    workload = loaded.workload
    et_link: dict[str, Any] = {}
    if link_et and loaded.et_blobs:
        try:
            from trainsim.ingest.link import attach_execution_traces
        except ImportError:  # pragma: no cover - optional during development
            attach_execution_traces = None  # type: ignore[assignment]
        if attach_execution_traces is not None:
            workload, stats = attach_execution_traces(loaded)
            et_link = {
                str(r): (s.to_dict() if hasattr(s, "to_dict") else str(s)) for r, s in stats.items()
            }
    sampled = any(getattr(t, "is_sampled", False) for t in loaded.traces.values())
    return Loaded(workload, loaded.match.to_dict(), et_link, sampled, tuple(loaded.skipped), tuple(loaded.warnings))


def _is_workload_ir(path: Path) -> bool:
    """Whether ``path`` is a saved workload IR, by content whatever its name."""
    from trainsim.ir.serialize import is_trainsim_json

    if not path.is_file():
        return False
    with path.open("rb") as f:
        return is_trainsim_json(f.read(4096))


def replay_paths(
    paths: Sequence[str | Path],
    options: SimOptions,
    *,
    step: str | int = "median",
    link_et: bool = True,
) -> Replay:
    """Load and simulate; the CLI writes the timeline itself (after its what-ifs are checked)."""
    loaded = load_for_replay(paths, step=step, link_et=link_et)
    workload = loaded.workload
    result = simulate(workload, options)
    files = tuple(str(f) for f in workload.metadata.get("files", paths))
    return Replay(
        files, workload, result, loaded.collectives, loaded.et_link, sampled=loaded.sampled,
        skipped=loaded.skipped, notes=loaded.notes,
    )
