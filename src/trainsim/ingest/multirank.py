"""Per-rank traces → one Workload: rank identification, a shared clock origin, one iteration
window per rank, and collectives matched across ranks by (process group, sequence number)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trainsim.errors import GraphError, TraceFormatError, TraceMismatchError
from trainsim.gcpause import gc_paused
from trainsim.ingest.iterations import StepWindow, choose_step, find_steps
from trainsim.ingest.kineto import KinetoTrace, decode_kineto
from trainsim.ingest.rank_builder import RankBuilder
from trainsim.ingest.sources import BlobKind, TraceBlob, read_paths
from trainsim.ir.graph import RankGraph, Workload

MANIFEST_NAME = "capture.json"  # written by `trainsim capture` beside the traces


@dataclass(slots=True)
class CollectiveMatch:
    instances: int = 0
    matched: int = 0
    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    peers_missing: bool = False  # some group members were not among the input traces

    def to_dict(self) -> dict[str, Any]:
        return {
            "instances": self.instances, "matched": self.matched, "by_kind": self.by_kind,
            "problems": self.problems[:20], "peers_missing": self.peers_missing,
        }  # fmt: skip


@dataclass(slots=True)
class LoadedTraces:
    """Everything ``analyze``/``replay`` need: the workload plus the raw per-rank tables."""

    workload: Workload
    traces: dict[int, KinetoTrace]
    steps: dict[int, list[StepWindow]]
    chosen: dict[int, StepWindow]
    origin: float
    match: CollectiveMatch
    et_blobs: list[TraceBlob]
    skipped: list[str]
    warnings: list[str] = field(default_factory=list)  # odd but usable input, one line each


def _explain_unknown(blob: TraceBlob) -> str:
    """Why a blob is neither a Kineto nor an execution trace: invalid JSON, or the wrong JSON."""
    import msgspec

    try:
        doc = msgspec.json.decode(blob.data)
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        return f"not valid JSON ({e}); expected a Kineto trace (.json/.json.gz/.tar.gz)"
    if isinstance(doc, dict) and {"schema_version", "ranks"} <= set(doc):
        return ("a trainsim workload IR (analyze --save-workload), not a trace: re-simulate it with "
                "`trainsim replay FILE` (alone), or load it with trainsim.ir.load_workload")
    if isinstance(doc, dict):
        keys = ", ".join(sorted(doc)[:5]) or "none"
        return f"JSON is not a Kineto trace: no 'traceEvents' key (top-level keys: {keys})"
    return f"JSON is not a Kineto trace: top level is a {type(doc).__name__}, expected an object with 'traceEvents'"


def skipped_note(skipped: Sequence[str]) -> str | None:
    """One line naming the input files that were not read (``None`` when none were); each entry
    of ``skipped`` is ``"<name>: <why>"``."""
    if not skipped:
        return None
    shown = "; ".join(skipped[:3]) + (f"; and {len(skipped) - 3} more (--format json: skipped_inputs)" if len(skipped) > 3 else "")
    return f"{len(skipped)} input file{'s' * (len(skipped) > 1)} not read: {shown}"


def _assign_ranks(traces: list[KinetoTrace]) -> dict[int, KinetoTrace]:
    out: dict[int, KinetoTrace] = {}
    for i, t in enumerate(traces):
        r = t.rank
        if r is None:
            if len(traces) == 1:
                r = 0
            else:
                raise TraceMismatchError(
                    t.source,
                    "cannot tell which rank this trace is (no distributedInfo.rank and no rank "
                    "number in the file name, e.g. rank3.json or worker3_*.json)",
                )
        if r in out:
            raise TraceMismatchError(
                t.source, f"rank {r} appears twice (also {out[r].source}); pass one trace per rank"
            )
        out[r] = t
        del i
    sizes = {t.world_size for t in out.values() if t.world_size is not None}
    if len(sizes) > 1:
        raise TraceMismatchError(
            next(iter(out.values())).source, f"ranks disagree on world_size: {sorted(sizes)}"
        )
    return out


def load_traces(
    paths: Iterable[str | Path], *, step: str | int = "median", time_unit: str | None = None
) -> LoadedTraces:
    with gc_paused():  # tens of thousands of acyclic events, ops and kernels (gcpause.py)
        return _load_traces(paths, step=step, time_unit=time_unit)


def _load_traces(paths: Iterable[str | Path], *, step: str | int, time_unit: str | None) -> LoadedTraces:
    skipped: list[str] = []
    blobs = read_paths(paths, skipped)
    kineto_blobs = [b for b in blobs if b.kind is BlobKind.KINETO]
    et_blobs = [b for b in blobs if b.kind is BlobKind.EXECUTION_TRACE]
    skipped += [
        f"{b.name}: {b.kind.value}"
        for b in blobs
        if b.kind in (BlobKind.CHAKRA, BlobKind.UNKNOWN) and not b.name.endswith(MANIFEST_NAME)
    ]
    if not kineto_blobs:
        first = blobs[0].name if blobs else str(list(paths))
        if et_blobs:
            raise TraceFormatError(
                first, "only execution traces given; analyze/replay need the Kineto trace too"
            )
        raise TraceFormatError(first, _explain_unknown(blobs[0]) if blobs else "no input")
    traces = _assign_ranks([decode_kineto(b.name, b.data, time_unit=time_unit) for b in kineto_blobs])
    return build_workload(traces, step=step, et_blobs=et_blobs, skipped=skipped)


def build_workload(
    traces: dict[int, KinetoTrace],
    *,
    step: str | int = "median",
    et_blobs: list[TraceBlob] | None = None,
    skipped: list[str] | None = None,
) -> LoadedTraces:
    # A shared clock: ranks of one job on one host share it; across hosts it is NTP-aligned.
    origins = {r: t.origin() * t.unit_to_s for r, t in traces.items()}
    origin_s = min(origins.values())
    world_size = max((t.world_size or 0) for t in traces.values()) or len(traces)
    world = tuple(range(world_size))
    ranks: list[RankGraph] = []
    steps: dict[int, list[StepWindow]] = {}
    chosen: dict[int, StepWindow] = {}
    for r in sorted(traces):
        steps[r] = find_steps(traces[r])
    which = _common_step(steps, step)
    for r in sorted(traces):
        chosen[r] = _pick(steps[r], which, traces[r])
    warnings = _check_windows_meet(traces, chosen)
    for r in sorted(traces):
        t = traces[r]
        builder = RankBuilder(t, origin=origin_s / t.unit_to_s, world=world)
        i = steps[r].index(chosen[r])
        previous = steps[r][i - 1] if i > 0 else None
        try:
            graph = builder.build(chosen[r], rank=r, previous=previous)
        except GraphError as e:  # safety net: corrupt values that slipped past decoding
            raise TraceFormatError(t.source, f"inconsistent trace content: {e}") from e
        if t.is_sampled:
            # ~1 % of events kept (sampled profiling): kernels and collectives are unreliable,
            # so the rank gives no step time and takes no part in collective matching.
            graph = replace(
                graph, step_start_s=None, step_end_s=None,
                metadata={**graph.metadata, "sampled": True, "event_coverage": t.event_coverage},
            )  # fmt: skip
        ranks.append(graph)
    groups = _process_groups(ranks, world)
    workload = Workload(
        ranks=tuple(ranks),
        process_groups=groups,
        metadata={
            "source": "kineto",
            "files": [traces[r].source for r in sorted(traces)],
            "device": _device(traces, warnings),
            "time_origin_us": origin_s * 1e6,
            "world_size": world_size,
            "time_unit": "s",
        },
    )
    return LoadedTraces(
        workload=workload, traces=traces, steps=steps, chosen=chosen, origin=origin_s,
        match=match_collectives(workload), et_blobs=et_blobs or [], skipped=skipped or [],
        warnings=warnings,
    )  # fmt: skip


# The ranks' steps of one job overlap in time: their collectives wait for each other. Hosts'
# clocks may disagree by milliseconds to seconds, and ranks choose iterations on their own
# when there are no markers, so a gap of a few steps is noted; one of a minute and a hundred
# steps is another run's (or another day's) trace.
RANK_GAP_NOTE_STEPS = 5.0
RANK_GAP_ERROR_STEPS, RANK_GAP_ERROR_S = 100.0, 60.0


def _check_windows_meet(traces: dict[int, KinetoTrace], chosen: dict[int, StepWindow]) -> list[str]:
    """Warnings (or a TraceMismatchError) when the ranks' chosen step windows lie apart."""
    if len(chosen) < 2:
        return []
    spans = {r: (w.start * traces[r].unit_to_s, w.end * traces[r].unit_to_s) for r, w in chosen.items()}
    first_end = min(spans, key=lambda r: spans[r][1])
    last_start = max(spans, key=lambda r: spans[r][0])
    gap_s = spans[last_start][0] - spans[first_end][1]
    longest_s = max(b - a for a, b in spans.values())
    if gap_s <= RANK_GAP_NOTE_STEPS * longest_s:
        return []
    # the odd rank: the one farthest from the others' middle
    centres = sorted((a + b) / 2 for a, b in spans.values())
    middle = centres[len(centres) // 2]
    odd = max(spans, key=lambda r: abs(sum(spans[r]) / 2 - middle))
    other = first_end if odd == last_start else last_start
    apart = (f"rank {odd}'s step {chosen[odd].number} lies {_span(gap_s)} away from rank {other}'s "
             f"(no overlap; steps last at most {_span(longest_s)})")  # fmt: skip
    if gap_s > max(RANK_GAP_ERROR_S, RANK_GAP_ERROR_STEPS * longest_s):
        raise TraceMismatchError(traces[odd].source, f"{apart}: a trace of another run or time, not "
                                 "this job's; pass the rank traces of one capture")  # fmt: skip
    return [f"{apart}: hosts' clocks disagree, or the traces are of different runs; the measured step "
            "(earliest rank start → latest rank end) includes the gap"]  # fmt: skip


def _span(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1.0 else f"{seconds:.3g} s" if seconds < 1e3 else f"{seconds:,.0f} s"


def _device(traces: dict[int, KinetoTrace], warnings: list[str]) -> str:
    """The first named device; "cpu" when no trace shows a device at all (a CPU-only job).
    Ranks naming different devices add a line to ``warnings``."""
    names: dict[str, list[int]] = defaultdict(list)
    for r in sorted(traces):
        if traces[r].device_name:
            names[traces[r].device_name].append(r)
    if len(names) > 1:
        shown = "; ".join(f"rank{'s' * (len(rs) > 1)} {_ranks_text(rs)}: {n}" for n, rs in names.items())
        warnings.append(f"ranks report different devices ({shown}): traces of different machines or jobs, or "
                        f"a mixed cluster; the workload is labelled {next(iter(names))!r}")  # fmt: skip
    named = next(iter(names), "")
    if named or any(t.records_device for t in traces.values()):
        return named
    return "cpu"


def _ranks_text(ranks: list[int]) -> str:
    """``0-6`` for a run of consecutive ranks, else ``0, 2, 5`` (the first eight)."""
    if len(ranks) > 2 and ranks[-1] - ranks[0] == len(ranks) - 1:
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks[:8])) + (", …" if len(ranks) > 8 else "")


def _pick(steps: list[StepWindow], which: str | int, t: KinetoTrace) -> StepWindow:
    try:
        return choose_step(steps, which)
    except TraceFormatError as e:
        raise TraceFormatError(t.source, e.problem) from e


def _common_step(steps: dict[int, list[StepWindow]], which: str | int) -> str | int:
    """Across ranks a step selector must name the same iteration on every rank.

    With ProfilerStep markers on every rank, ``median`` is resolved once: the step numbers all
    ranks share, ranked by their slowest rank's window, median taken — then used everywhere.
    """
    if which != "median" or len(steps) < 2:
        return which
    if not all(s and s[0].from_marker for s in steps.values()):
        return which
    common = set.intersection(*({w.number for w in s} for s in steps.values()))
    if not common:
        return which
    slowest = {
        n: max(w.end - w.start for s in steps.values() for w in s if w.number == n) for n in common
    }
    pool = [StepWindow(n, 0.0, d, True) for n, d in slowest.items()]
    return choose_step(sorted(pool, key=lambda w: w.number), "median").number


def _process_groups(ranks: list[RankGraph], world: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    groups: dict[str, tuple[int, ...]] = {}
    for r in ranks:
        for k in r.kernels():
            c = k.collective
            if c is not None and c.group not in groups:
                groups[c.group] = c.group_ranks or world
    return groups


def match_collectives(w: Workload) -> CollectiveMatch:
    """Every collective instance (group, seq) must appear on every loaded member rank."""
    sampled = [r.rank for r in w.ranks if r.metadata.get("sampled")]
    loaded = {r.rank for r in w.ranks} - set(sampled)
    inst: dict[tuple[str, int], dict[int, str]] = defaultdict(dict)
    for r in w.ranks:
        if r.rank in sampled:
            continue
        for k in r.kernels():
            c = k.collective
            if c is not None:
                inst[(c.group, c.seq)][r.rank] = c.kind.value
    m = CollectiveMatch()
    if sampled:
        m.problems.append(
            f"ranks {sampled} are sampled traces (a small share of events kept): "
            "their collectives cannot be matched by sequence number and are not counted"
        )
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    for (group, seq), members in sorted(inst.items()):
        expected = set(w.process_groups.get(group, ())) or loaded
        if not expected <= loaded:
            m.peers_missing = True
        expected &= loaded
        kinds = set(members.values())
        kind = next(iter(kinds)) if len(kinds) == 1 else "mixed"
        m.instances += 1
        by_kind[kind]["instances"] += 1
        if set(members) == expected and len(kinds) == 1:
            m.matched += 1
            by_kind[kind]["matched"] += 1
        else:
            missing = sorted(expected - set(members))
            m.problems.append(
                f"group {group} seq {seq}: kinds {sorted(kinds)}, missing on ranks {missing}"
            )
    m.by_kind = {k: dict(v) for k, v in by_kind.items()}
    return m
