"""Iteration windows: ProfilerStep markers, detected repetition, whole-trace fallback."""

from __future__ import annotations

import pytest

from trainsim.ingest.iterations import WHOLE_TRACE, StepWindow, choose_step, find_steps
from trainsim.ingest.kineto import decode_kineto
from trainsim.ingest.multirank import load_traces
from trainsim.ingest.sources import read_path


def _trace(path):
    b = read_path(path)[0]
    return decode_kineto(b.name, b.data)


def test_markers_give_windows(shared_data):
    steps = find_steps(_trace(shared_data / "traces/hta_resnet50_v100/rank0.json.gz"))
    assert [s.number for s in steps] == [101, 102, 103, 104, 105]
    assert all(s.from_marker for s in steps)
    # Default: steady state (median duration), not the 35 ms warm-up step.
    assert choose_step(steps).number in (103, 104, 105)


@pytest.mark.parametrize(
    ("folder", "iterations", "step_ms"),
    [("param_linear_2080ti", 40, 24.5), ("param_resnet_2080ti", 30, None)],
)
def test_repeating_iteration_detected_without_markers(shared_data, folder, iterations, step_ms):
    path = shared_data / "traces" / folder
    steps = find_steps(_trace(next(path.glob("*kineto*"))))
    assert len(steps) == iterations
    assert not steps[0].from_marker and steps[0].anchor
    if step_ms is not None:
        loaded = load_traces([next(path.glob("*kineto*"))])
        assert loaded.workload.measured_step_s * 1e3 == pytest.approx(step_ms, rel=0.1)


def test_single_iteration_trace_is_used_whole(shared_data):
    steps = find_steps(_trace(next((shared_data / "traces/hta_critical_path/alexnet").glob("*.gz"))))
    assert len(steps) == 1 and steps[0].anchor == WHOLE_TRACE


def test_choose_step_selectors():
    steps = [StepWindow(n, n * 10.0, n * 10.0 + d, True) for n, d in [(1, 5), (2, 9), (3, 7)]]
    assert choose_step(steps, "first").number == 1
    assert choose_step(steps, "last").number == 3
    assert choose_step(steps, "2").number == 2
    assert choose_step(steps, "median").number == 3
    from trainsim.errors import TraceFormatError

    with pytest.raises(TraceFormatError, match="step 9"):
        choose_step(steps, 9)
    with pytest.raises(TraceFormatError, match="unknown step selector"):
        choose_step(steps, "best")
