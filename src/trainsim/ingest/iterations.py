"""Iteration (step) windows of a Kineto trace.

``ProfilerStep#N`` annotations give the windows directly. Traces recorded without them (the
PARAM ResNet and linear traces) are cut by PyTorch's own once-per-iteration record functions
(DataLoader fetch, optimizer zero_grad/step), or else at the repeating pattern of top-level
events (see ``detect_repeating_steps``).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from itertools import pairwise

from trainsim.errors import ConfigError, TraceFormatError
from trainsim.ingest.kineto import Event, KinetoTrace, short_text

WHOLE_TRACE = "<whole trace: no markers, no repetition>"
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


@dataclass(frozen=True, slots=True)
class StepWindow:
    """A CPU-side iteration window in the trace's raw time unit."""

    number: int
    start: float
    end: float
    from_marker: bool
    anchor: str = ""


def top_level(events: list[Event]) -> list[Event]:
    """Events (sorted by ts, -dur) not contained in an earlier event of the same list."""
    out: list[Event] = []
    end = float("-inf")
    for e in events:
        ts = float(e.ts)  # type: ignore[arg-type]
        if ts >= end:
            out.append(e)
            end = ts + e.dur
    return out


def find_steps(trace: KinetoTrace) -> list[StepWindow]:
    marked = []
    for e in trace.cpu:
        m = _STEP_RE.match(e.name)
        if m:
            marked.append(StepWindow(int(m.group(1)), float(e.ts), float(e.ts) + e.dur, True))  # type: ignore[arg-type]
    if marked:
        marked.sort(key=lambda w: w.start)
        _check_marked_once(trace, marked)
        return marked
    return detect_repeating_steps(trace)


def _check_marked_once(trace: KinetoTrace, marked: list[StepWindow]) -> None:
    """The profiler marks each step once: a number twice is a corrupt or merged trace (the
    selectors would pick either window, e.g. a 100 µs one)."""
    counts = Counter(w.number for w in marked)
    if counts.most_common(1)[0][1] < 2:
        return
    number, n = counts.most_common(1)[0]
    at = ", ".join(f"ts={w.start:.0f} dur={w.end - w.start:.0f}" for w in marked if w.number == number)
    more = len([k for k, c in counts.items() if c > 1]) - 1
    also = f"; {more} other step number{'s' * (more > 1)} too" if more else ""
    times = "twice" if n == 2 else f"{n} times"
    raise TraceFormatError(trace.source, f"ProfilerStep#{number} appears {times} ({short_text(at)}{also}): each step "
                                         "is marked once; a corrupt or merged trace")  # fmt: skip


def _main_thread_events(trace: KinetoTrace) -> list[Event]:
    by_tid: dict[object, list[Event]] = defaultdict(list)
    for e in trace.cpu:
        by_tid[(e.pid, e.tid)].append(e)
    if not by_tid:
        raise TraceFormatError(trace.source, "no CPU events to find iterations in")
    tid = max(by_tid, key=lambda t: len(by_tid[t]))
    return top_level(by_tid[tid])


# PyTorch names these record functions itself, once per training iteration (optimizer hooks,
# DataLoader iteration): the most reliable iteration boundaries when markers are missing.
_SEMANTIC_ANCHORS: tuple[tuple[str, bool], ...] = (
    ("enumerate(DataLoader)#", False),  # (name prefix, window ends at the anchor's end)
    ("Optimizer.zero_grad#", False),
    ("Optimizer.step#", True),
)


def _semantic_steps(trace: KinetoTrace) -> list[StepWindow] | None:
    by_tid: dict[object, list[Event]] = defaultdict(list)
    for e in trace.cpu:
        by_tid[(e.pid, e.tid)].append(e)
    tops = [e for evs in by_tid.values() for e in top_level(evs)]
    for prefix, ends_window in _SEMANTIC_ANCHORS:
        hits = sorted((e for e in tops if e.name.startswith(prefix)), key=lambda e: float(e.ts))  # type: ignore[arg-type]
        if len(hits) < 2:
            continue
        first = min(float(e.ts) for e in tops)  # type: ignore[arg-type]
        last = max(float(e.ts) + e.dur for e in tops)  # type: ignore[arg-type]
        if ends_window:
            bounds = [first] + [float(e.ts) + e.dur for e in hits]  # type: ignore[arg-type]
        else:
            bounds = [float(e.ts) for e in hits] + [last]  # type: ignore[arg-type]
        return [
            StepWindow(i, a, b, False, hits[0].name)
            for i, (a, b) in enumerate(pairwise(bounds))
            if b > a
        ]
    return None


def detect_repeating_steps(trace: KinetoTrace, *, min_repeats: int = 2) -> list[StepWindow]:
    """Iteration windows without ProfilerStep markers.

    1. PyTorch's own once-per-iteration record functions (DataLoader fetch, optimizer
       zero_grad/step), when present;
    2. otherwise the repeating pattern of top-level events on the busiest thread: an event that
       recurs with identical segments between its occurrences. Exact periodicity wins over
       near-periodicity (an op that recurs once per layer leaves one odd segment per
       iteration), then the most repeats;
    3. otherwise the whole trace is one window (a single-iteration trace).
    """
    semantic = _semantic_steps(trace)
    if semantic:
        return semantic
    seq = _main_thread_events(trace)
    names = [e.name for e in seq]
    counts = Counter(names)
    best: tuple[float, int, int, str] | None = None  # (score, repeats, -first index, name)
    first_index = {n: i for i, n in reversed(list(enumerate(names)))}
    for name, k in counts.items():
        if k < min_repeats:
            continue
        idx = [i for i, n in enumerate(names) if n == name]
        segments = [tuple(names[a:b]) for a, b in pairwise(idx)]
        mode, mode_count = Counter(segments).most_common(1)[0]
        score = mode_count / len(segments)
        if score < 0.8 or len(mode) < 2:
            continue
        key = (round(score, 2), k, -first_index[name], name)
        if best is None or key > best:
            best = key
    if best is None:
        # A trace of a single iteration (e.g. one forward pass): the whole trace is the window.
        start = min(float(e.ts) for e in seq)  # type: ignore[arg-type]
        end = max(float(e.ts) + e.dur for e in seq)  # type: ignore[arg-type]
        return [StepWindow(0, start, end, False, WHOLE_TRACE)]
    anchor = best[3]
    starts = [float(e.ts) for e in seq if e.name == anchor]  # type: ignore[arg-type]
    last_end = max(float(e.ts) + e.dur for e in seq)  # type: ignore[arg-type]
    ends = [*starts[1:], last_end]
    return [
        StepWindow(i, s, e, False, anchor) for i, (s, e) in enumerate(zip(starts, ends, strict=True))
    ]


STEP_SELECTORS = ("median", "first", "last")


def check_step_selector(which: str, flag: str = "--step") -> None:
    """Refuse a step selector :func:`choose_step` would not take, naming the option (before any
    trace is read: the error had named the first trace file, as if the file were at fault)."""
    if which not in STEP_SELECTORS and not which.isdigit():
        raise ConfigError(f"{flag} must be median, first, last or a ProfilerStep number (0, 1, ...), got {which!r}")


def choose_step(steps: list[StepWindow], which: str | int = "median") -> StepWindow:
    """Pick one window: ``median`` (steady state, default), ``last``, ``first`` or a step number."""
    if not steps:
        raise ValueError("no steps")
    if isinstance(which, int) or (isinstance(which, str) and which.isdigit()):
        n = int(which)
        for s in steps:
            if s.number == n:
                return s
        raise TraceFormatError("<steps>", f"step {n} not in trace (have {[s.number for s in steps]})")
    if which == "first":
        return steps[0]
    if which == "last":
        return steps[-1]
    if which == "median":
        # Drop the final window when detected (it may be cut by the end of the recording).
        pool = steps if steps[0].from_marker or len(steps) < 3 else steps[:-1]
        ordered = sorted(pool, key=lambda s: (s.end - s.start, s.number))
        return ordered[(len(ordered) - 1) // 2 + (1 if len(ordered) % 2 == 0 else 0)]
    raise TraceFormatError("<steps>", f"unknown step selector {which!r} (median|first|last|N)")
