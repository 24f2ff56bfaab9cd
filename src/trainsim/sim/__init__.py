"""Multi-rank critical-path simulation of a Workload (DESIGN.md "Simulation semantics").

>>> from trainsim.sim import simulate, SimOptions, HostMode
>>> result = simulate(workload, SimOptions(overheads=HostMode.STATS))   # doctest: +SKIP
>>> result.predicted_step_s, result.kernel_sum_baseline_s               # doctest: +SKIP

See docs/simulator.md for the semantics, the host modes and the what-if passes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainsim.gcpause import gc_paused
from trainsim.sim.options import HostMode, KernelSource, SegmentKind, SimOptions

if TYPE_CHECKING:
    from trainsim.ir.graph import Workload
    from trainsim.sim.program import Program
    from trainsim.sim.result import RankResult, Segment, SimResult, StreamResult

_LAZY_RESULT = frozenset({"RankResult", "Segment", "SimResult", "StreamResult"})


def __getattr__(name: str) -> object:
    # the result types pull in the engine, numpy and the hardware catalog: imported on first
    # use, so that `from trainsim.sim.options import ...` (the CLI's start-up) stays cheap
    if name in _LAZY_RESULT:
        from trainsim.sim import result

        return getattr(result, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def simulate(workload: Workload, options: SimOptions | None = None) -> SimResult:
    """Compile the workload, evaluate it, and summarise the predicted step.

    Python's cyclic garbage collector is paused meanwhile: the simulator allocates many small
    objects without cycles, and full collections over a large workload would double the run
    time (benchmarks/sim_speed.py); it is restored, and runs as usual, afterwards.
    """
    from trainsim.sim.program import compile_workload

    with gc_paused():
        return simulate_program(compile_workload(workload, options or SimOptions()))


def simulate_program(program: Program) -> SimResult:
    """Evaluate an already compiled program (e.g. one whose timings a diagnostic adjusted)."""
    from trainsim.sim.engine import evaluate
    from trainsim.sim.result import build_result

    with gc_paused():
        return build_result(program, evaluate(program))


__all__ = [
    "HostMode",
    "KernelSource",
    "RankResult",
    "Segment",
    "SegmentKind",
    "SimOptions",
    "SimResult",
    "StreamResult",
    "simulate",
    "simulate_program",
]
