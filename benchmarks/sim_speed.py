"""Simulation speed of ``trainsim.sim.simulate`` (not a unit test: timings vary by machine).

Measures, best of ``--repeat`` runs each in CPU time of this process (the minimum filters out
other processes' noise; wall time on a shared machine also counts their turns on the cores):

* the real DLRM 8×V100 workload (shipped in examples/), host gaps from ``stats`` and
  ``trace``: simulated ops + kernels per second of ``simulate()`` (compile, evaluate,
  summarise), and with the critical path walked as well;
* a large synthetic data-parallel workload (8 ranks × ~10k ops + kernels) for throughput at
  scale;
* a 1,024-rank job made of 8 distinct rank roles (``represents`` = 128) against the same 8
  roles as an 8-rank job: the two should take about the same time.

Target: ≥ 200k simulated ops + kernels per second.

    python benchmarks/sim_speed.py [--repeat 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainsim.ingest import load_traces
from trainsim.ir.graph import Workload
from trainsim.sim import HostMode, SimOptions, simulate
from trainsim.sim.synthetic import data_parallel

REPO = Path(__file__).resolve().parents[1]
DLRM = REPO / "examples" / "data" / "param_dlrm_8xv100"


def _size(w: Workload) -> int:
    return sum(len(r.ops) + len(r.kernels()) for r in w.ranks)


def _best(fn: Callable[[], Any], repeat: int) -> float:
    """Best of ``repeat`` runs, in CPU seconds of this process (``time.process_time``): on a
    shared machine wall time also counts other processes' turns on the cores."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def _row(name: str, w: Workload, seconds: float, **extra: Any) -> dict[str, Any]:
    n = _size(w)
    return {"case": name, "rank_graphs": len(w.ranks), "ranks": sum(r.represents for r in w.ranks),
            "ops_kernels": n, "seconds": seconds, "per_s": n / seconds, **extra}  # fmt: skip


def run(repeat: int) -> list[dict[str, Any]]:
    rows = []
    dlrm = load_traces([DLRM]).workload
    for mode in (HostMode.STATS, HostMode.TRACE):
        opts = SimOptions(overheads=mode)
        rows.append(
            _row(
                f"dlrm 8xV100, {mode.value}", dlrm, _best(lambda o=opts: simulate(dlrm, o), repeat)
            )
        )  # type: ignore[misc]
    opts = SimOptions()
    rows.append(_row("dlrm 8xV100, stats + critical path", dlrm,
                     _best(lambda: simulate(dlrm, opts).critical_path, repeat)))  # fmt: skip
    big = data_parallel(8, layers=1200)
    rows.append(_row("synthetic 8 ranks, 1200 layers", big, _best(lambda: simulate(big), repeat)))
    eight = data_parallel(8, world=8, layers=200)
    many = data_parallel(8, world=1024, layers=200)
    t8 = _best(lambda: simulate(eight), repeat)
    t1024 = _best(lambda: simulate(many), repeat)
    rows.append(_row("synthetic 8 roles as 8 ranks", eight, t8))
    rows.append(_row("synthetic 8 roles as 1,024 ranks", many, t1024, vs_8_ranks=t1024 / t8))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", action="store_true", help="print JSON instead of a markdown table")
    args = ap.parse_args()
    rows = run(args.repeat)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print("| case | ranks (graphs) | ops+kernels | best time | ops+kernels/s |")
    print("|---|---|---|---|---|")
    for r in rows:
        extra = f" ({r['vs_8_ranks']:.2f}× the 8-rank time)" if "vs_8_ranks" in r else ""
        print(f"| {r['case']} | {r['ranks']} ({r['rank_graphs']}) | {r['ops_kernels']:,} | "
              f"{r['seconds'] * 1e3:.1f} ms{extra} | {r['per_s'] / 1e3:,.0f}k |")  # fmt: skip


if __name__ == "__main__":
    main()
