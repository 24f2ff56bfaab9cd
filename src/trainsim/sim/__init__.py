"""Multi-rank critical-path simulation of a Workload (DESIGN.md "Simulation semantics").

>>> from trainsim.sim import simulate, SimOptions, HostMode
>>> result = simulate(workload, SimOptions(overheads=HostMode.STATS))   # doctest: +SKIP
>>> result.predicted_step_s, result.kernel_sum_baseline_s               # doctest: +SKIP

See docs/simulator.md for the semantics, the host modes and the what-if passes.
"""

from __future__ import annotations

import gc

from trainsim.ir.graph import Workload
from trainsim.sim.options import HostMode, KernelSource, SegmentKind, SimOptions
from trainsim.sim.result import RankResult, Segment, SimResult, StreamResult


def simulate(workload: Workload, options: SimOptions | None = None) -> SimResult:
    """Compile the workload, evaluate it, and summarise the predicted step.

    Python's cyclic garbage collector is paused meanwhile: the simulator allocates many small
    objects without cycles, and full collections over a large workload would double the run
    time (benchmarks/sim_speed.py); it is restored, and runs as usual, afterwards.
    """
    from trainsim.sim.engine import evaluate
    from trainsim.sim.program import compile_workload
    from trainsim.sim.result import build_result

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        program = compile_workload(workload, options or SimOptions())
        return build_result(program, evaluate(program))
    finally:
        if was_enabled:
            gc.enable()


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
]
