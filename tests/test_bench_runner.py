"""The benchmark runner: schedule, rows, resume, torn tails, and a sweep killed with SIGKILL."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import trainsim.bench
from trainsim.bench.dataset import iter_rows, noise_floor, relative_iqr, repair_tail
from trainsim.bench.runner import (
    CpuTimer,
    Schedule,
    SweepPlan,
    measured_quick,
    run_sweep,
    time_call,
)
from trainsim.bench.suites.base import Case, Phase
from trainsim.errors import ConfigError
from trainsim.ir.kinds import KernelFamily

FAST = Schedule(warmup=1, min_warmup_s=0.0, repeats=3, max_repeats=3, min_repeat_s=0.0, max_inner=1)

# The subprocess of the SIGKILL test builds its cases here: slow enough to be killed mid-sweep.
_CASES_SRC = textwrap.dedent(
    """
    import time
    from trainsim.bench.suites.base import Case, Phase
    from trainsim.ir.kinds import KernelFamily

    def _build(device):
        return lambda: time.sleep(0.02)

    def cases(n):
        return [
            Case(suite="fake", op="sleep", model_op="elementwise", features=(("numel", float(i + 1)),),
                 family=KernelFamily.ELEMENTWISE, phase=Phase.FWD, dtype="float32",
                 params=(("i", i),), shapes=((i + 1,),), flops=0.0, bytes=4.0 * (i + 1), build=_build)
            for i in range(n)
        ]
    """
)


def _case(i: int, build=None) -> Case:
    return Case(
        suite="fake", op="noop", model_op="elementwise", features=(("numel", float(i + 1)),),
        family=KernelFamily.ELEMENTWISE, phase=Phase.FWD, dtype="float32", params=(("i", i),),
        shapes=((i + 1,),), flops=float(i), bytes=4.0 * (i + 1),
        build=build or (lambda device: (lambda: None)),
    )  # fmt: skip


def _keys(path: Path) -> list[str]:
    return [r["key"] for r in iter_rows(path)]


def test_schedule_repeats_and_inner():
    t = time_call(lambda: None, schedule=Schedule.for_run(quick=True), timer=CpuTimer())
    assert 7 <= len(t.times_s) <= 15 and t.inner > 1  # a no-op is looped to last a repeat
    assert t.median_s == statistics.median(t.times_s)
    one = time_call(lambda: None, schedule=FAST, timer=CpuTimer())
    assert (len(one.times_s), one.inner) == (3, 1)


def test_rows_follow_the_kernel_dataset_format(tmp_path):
    path = tmp_path / "k.jsonl"
    r = run_sweep(path, [_case(i) for i in range(3)], schedule=FAST, progress=False)
    assert (r.samples, r.skipped, r.failed) == (3, 0, ())
    rows = list(iter_rows(path))
    assert [x["key"] for x in rows] == [_case(i).key for i in range(3)]
    for x in rows:
        assert x["op"] == "elementwise" and x["phase"] == "fwd" and x["dtype"] == "fp32"
        assert x["statistic"] == "median" and x["repeats"] == len(x["samples_s"]) == 3
        assert x["fingerprint"] == r.fingerprint and x["versions"]["torch"]
        assert x["device_kind"] == "cpu" and x["threads"] >= 1 and x["features"]["numel"] >= 1


def test_resume_skips_done_rows_and_failures_are_retried(tmp_path):
    path = tmp_path / "k.jsonl"
    run_sweep(path, [_case(0), _case(1)], schedule=FAST, progress=False)

    def boom(device):
        raise RuntimeError("not on this device\nmore detail")

    r = run_sweep(
        path, [_case(0), _case(1), _case(2, boom), _case(3)], schedule=FAST, progress=False
    )
    assert (r.samples, r.skipped) == (1, 2)
    assert r.failed == ((_case(2).key, "not on this device"),)
    r = run_sweep(path, [_case(i) for i in range(4)], schedule=FAST, progress=False)
    assert (r.samples, r.skipped) == (1, 3)
    assert sorted(_keys(path)) == sorted(_case(i).key for i in range(4))
    r = run_sweep(path, [_case(0), _case(0)], schedule=FAST, progress=False, resume=False)
    assert r.samples == 1  # a case listed twice is measured once


def test_on_start_counts_the_cases_left_and_reused(tmp_path):
    path = tmp_path / "k.jsonl"
    plans: list[SweepPlan] = []
    run_sweep(path, [_case(0), _case(1)], schedule=FAST, progress=False, on_start=plans.append)
    run_sweep(path, [_case(i) for i in range(5)], schedule=FAST, progress=False, on_start=plans.append)
    run_sweep(path, [_case(0)], schedule=FAST, progress=False, resume=False, on_start=plans.append)
    assert plans == [SweepPlan(cases=2, pending=2, reused=0), SweepPlan(cases=5, pending=3, reused=2),
                     SweepPlan(cases=1, pending=1, reused=0)]  # fmt: skip


def test_a_full_sweep_counts_the_quick_rows_it_reuses(tmp_path):
    path = tmp_path / "k.jsonl"
    quick = dataclasses.replace(FAST, quick=True)
    run_sweep(path, [_case(0), _case(1), _case(1)], schedule=quick, progress=False)
    assert [r["quick"] for r in iter_rows(path)] == [True, True]
    plans: list[SweepPlan] = []
    r = run_sweep(path, [_case(i) for i in (0, 1, 1, 2)], schedule=FAST, progress=False, on_start=plans.append)
    assert plans == [SweepPlan(cases=4, pending=1, reused=3, reused_quick=2)]  # case 1 counted once
    assert r.reused_quick == 2 and [x["quick"] for x in iter_rows(path)] == [True, True, False]
    r = run_sweep(path, [_case(i) for i in range(3)], schedule=quick, progress=False)
    assert r.reused_quick == 0  # a quick sweep reusing quick rows is no surprise


@pytest.mark.parametrize(("sample", "quick"), [("cpu_quick_f97e94a9cbddf655.jsonl", True),
                                               ("cpu_full_f97e94a9cbddf655.jsonl.gz", False)])  # fmt: skip
def test_rows_from_before_the_quick_field_are_told_by_their_schedule(sample, quick):
    rows = list(iter_rows(Path(trainsim.bench.__file__).parent / "data" / sample))
    assert rows and "quick" not in rows[0]
    assert {measured_quick(r) for r in rows} == {quick}


def test_torn_tail_is_ignored_by_readers_and_cut_on_resume(tmp_path):
    path = tmp_path / "k.jsonl"
    run_sweep(path, [_case(0)], schedule=FAST, progress=False)
    good = path.read_bytes()
    with path.open("ab") as fh:
        fh.write(b'{"schema": "trainsim.kernel-bench/1", "key": "fake/noop/fw')
    assert _keys(path) == [_case(0).key]
    run_sweep(path, [_case(0), _case(1)], schedule=FAST, progress=False)
    assert path.read_bytes().startswith(good) and _keys(path) == [_case(0).key, _case(1).key]
    assert repair_tail(path) == 0


def test_foreign_rows_are_an_error(tmp_path):
    path = tmp_path / "comm.jsonl"
    path.write_text('{"schema": "trainsim.comm-bench/1", "kind": "all_reduce"}\n')
    before = path.read_bytes()
    with pytest.raises(ConfigError, match=r"first line is a trainsim\.comm-bench/1 row"):
        run_sweep(path, [_case(0)], schedule=FAST, progress=False)
    assert path.read_bytes() == before


def test_noise_floor():
    assert relative_iqr([1.0, 1.0, 1.0]) == 0.0
    assert relative_iqr([1.0, 2.0, 3.0]) == pytest.approx(1.0 / 2.0)
    assert (
        noise_floor([{"samples_s": [1, 1, 1]}, {"samples_s": [1, 2, 3]}, {"samples_s": [1, 2, 3]}])
        == 0.5
    )
    assert noise_floor([]) is None


def test_relative_iqr_is_numpys_percentile_bit_for_bit_without_numpy(monkeypatch):
    """A dataset read takes every row's spread: np.percentile's per-call cost was 1.3 s of
    45,000 rows. The spread is numpy's linear percentile, the same bits, computed without it
    for finite samples (nan and inf keep numpy's answer)."""
    import math
    import random

    import numpy as np

    def numpys(xs: list[float]) -> float:
        q25, q50, q75 = np.percentile(np.asarray(xs, dtype=float), [25, 50, 75])
        return float((q75 - q25) / q50) if q50 > 0 else math.inf

    rng = random.Random(0)
    cases = [[rng.lognormvariate(-8, 2) for _ in range(n)] for n in (2, 3, 4, 5, 6, 7, 8, 9, 12, 33, 60, 61)]
    cases += [[rng.choice([0.0, 1e-6, 2e-6, 3e-6]) for _ in range(n)] for n in (2, 3, 5, 8, 13)]
    cases += [[rng.uniform(-1, 1) * 10.0 ** rng.randint(-300, 300) for _ in range(n)] for n in (2, 5, 9)]
    cases += [[3, 1, 2, 2], [1, 2, 3, 4, 5]]
    want = [numpys(xs) for xs in cases]
    with monkeypatch.context() as m:
        m.setattr(np, "percentile", lambda *a, **k: pytest.fail("numpy for finite samples"))
        got = [relative_iqr(xs) for xs in cases]
    assert got == want  # exact: the same float operations as numpy's linear method
    with np.errstate(invalid="ignore"):
        for odd in ([1.0, math.nan, 2.0], [1.0, math.inf, 2.0], [-math.inf, 1.0, 2.0, 3.0]):
            assert relative_iqr(odd) == numpys(odd), odd


@pytest.mark.slow
def test_sigkill_mid_sweep_then_resume_loses_and_duplicates_nothing(tmp_path):
    (tmp_path / "fakecases.py").write_text(_CASES_SRC)
    path = tmp_path / "k.jsonl"
    n = 40
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from fakecases import cases
        from trainsim.bench.runner import Schedule, run_sweep
        s = Schedule(warmup=1, min_warmup_s=0.0, repeats=3, max_repeats=3, min_repeat_s=0.0, max_inner=1)
        run_sweep({str(path)!r}, cases({n}), schedule=s, progress=False)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if path.exists() and path.read_bytes().count(b"\n") >= 5:
                break
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    before = path.read_bytes()
    complete = before[: before.rfind(b"\n") + 1]
    done_before = complete.count(b"\n")
    assert 5 <= done_before < n
    with path.open("ab") as fh:  # what a kill in the middle of a write leaves behind
        fh.write(b'{"schema":"trainsim.kernel-bench/1","key":"fake/sleep/fwd/float32/i=99')

    sys.path.insert(0, str(tmp_path))
    try:
        from fakecases import cases  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
    r = run_sweep(path, cases(n), schedule=FAST, progress=False)
    assert r.skipped == done_before and r.samples == n - done_before
    after = path.read_bytes()
    assert after.startswith(complete)  # every row completed before the kill is kept as it was
    keys = _keys(path)
    assert len(keys) == len(set(keys)) == n
    assert all(json.loads(line)["repeats"] == 3 for line in after.splitlines())
