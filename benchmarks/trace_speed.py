"""Speed of ``trainsim analyze``, ``replay`` and ``validate replay`` on the shipped traces, as a
user runs them: each command a fresh process, wall and CPU time (user + system of the child).

Commands: the README's ``analyze`` of the 8-rank DLRM trace (``make run``), its ``--format json``,
``replay`` of it (JSON, and the README's ``--kernels measured --overheads stats`` table), and,
when ../shared/data is beside the repository, ``validate replay --format json``.

With ``--against OTHER_SRC`` (the ``src`` folder of another checkout, e.g. a ``git worktree`` of
the commit before a change) every round runs each command with that tree and with this one, in
turn, so that both see the same load on a shared machine; the ratio column is the median over
rounds of the per-round ratio other / this. ``--phases`` adds the in-process CPU time of the
pipeline's phases (best of the rounds). Not a unit test: timings vary by machine and load.

    python benchmarks/trace_speed.py [--runs 5] [--against ../old/src] [--phases] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DLRM = REPO / "examples" / "data" / "param_dlrm_8xv100"
SHARED = REPO.parent / "shared" / "data"

COMMANDS: dict[str, list[str]] = {
    "analyze (make run)": ["analyze", str(DLRM)],
    "analyze --format json": ["analyze", str(DLRM), "--format", "json"],
    "replay --format json": ["replay", str(DLRM), "--format", "json"],
    "replay measured/stats (README)": ["replay", str(DLRM), "--kernels", "measured", "--overheads", "stats"],
    "validate replay --format json": ["validate", "replay", "--format", "json"],
}

_PHASES = r"""
import json, sys, time
from trainsim.analyze.breakdown import workload_breakdown
from trainsim.ingest import load_traces
from trainsim.ingest.link import attach_execution_traces
from trainsim.sim import SimOptions, simulate
best = {}
for _ in range(int(sys.argv[2])):
    t = {}
    c = time.process_time(); loaded = load_traces([sys.argv[1]]); t["load_traces"] = time.process_time() - c
    c = time.process_time(); w, _ = attach_execution_traces(loaded); t["attach_execution_traces"] = time.process_time() - c
    c = time.process_time(); workload_breakdown(w); t["workload_breakdown"] = time.process_time() - c
    c = time.process_time(); simulate(w, SimOptions()).to_dict(); t["simulate + to_dict"] = time.process_time() - c
    best = {k: min(v, best.get(k, v)) for k, v in t.items()}
print(json.dumps(best))
"""


def _run(src: Path, args: list[str]) -> tuple[float, float]:
    """(wall s, CPU s) of one ``python -m trainsim ARGS`` with ``src`` on the path."""
    env = {**os.environ, "PYTHONPATH": str(src), "HF_HUB_OFFLINE": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "trainsim", *args], env=env, cwd=REPO, capture_output=True, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed with {src}:\n{proc.stderr.decode()[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="rounds (each command once per tree per round)")
    ap.add_argument("--against", type=Path, help="the src folder of another checkout, run in turn with this one")
    ap.add_argument("--phases", action="store_true", help="also the in-process CPU time of the pipeline's phases")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    a = ap.parse_args()
    trees = {"this": REPO / "src", **({"other": a.against.resolve()} if a.against else {})}
    commands = {k: v for k, v in COMMANDS.items() if k != "validate replay --format json" or SHARED.is_dir()}
    times: dict[str, dict[str, list[tuple[float, float]]]] = {c: {t: [] for t in trees} for c in commands}
    for r in range(a.runs):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))  # who goes first alternates too
        for c, args in commands.items():
            for t in order:
                times[c][t].append(_run(trees[t], args))
    out: dict[str, Any] = {"runs": a.runs, "load_1m": os.getloadavg()[0], "commands": {}}
    for c, by_tree in times.items():
        row: dict[str, Any] = {}
        for t, samples in by_tree.items():
            row[t] = {"wall_s": statistics.median(w for w, _ in samples), "cpu_s": statistics.median(u for _, u in samples)}
        if "other" in by_tree:
            pairs = list(zip(by_tree["other"], by_tree["this"], strict=True))
            row["speedup_wall"] = statistics.median(o[0] / n[0] for o, n in pairs)
            row["speedup_cpu"] = statistics.median(o[1] / n[1] for o, n in pairs)
        out["commands"][c] = row
    if a.phases:
        out["phases_s"] = {}
        for t, src in trees.items():
            env = {**os.environ, "PYTHONPATH": str(src)}
            proc = subprocess.run([sys.executable, "-c", _PHASES, str(DLRM), str(a.runs)], env=env, capture_output=True, text=True, check=True)
            out["phases_s"][t] = json.loads(proc.stdout)
    if a.json:
        print(json.dumps(out, indent=2))
        return
    head = "| command | " + " | ".join(f"{t} wall s | {t} CPU s" for t in trees) + (" | speed-up wall | speed-up CPU |" if a.against else " |")
    print(f"medians of {a.runs} fresh processes per tree (load average {out['load_1m']:.1f})\n")
    print(head)
    print("|---" * (1 + 2 * len(trees) + (2 if a.against else 0)) + "|")
    for c, row in out["commands"].items():
        cells = [f"{row[t]['wall_s']:.3f} | {row[t]['cpu_s']:.3f}" for t in trees]
        extra = f" | {row['speedup_wall']:.2f}× | {row['speedup_cpu']:.2f}×" if a.against else ""
        print(f"| {c} | " + " | ".join(cells) + extra + " |")
    for t, ph in out.get("phases_s", {}).items():
        print(f"\nphases ({t}, DLRM 8 ranks, best of {a.runs}, CPU s): " + ", ".join(f"{k} {v:.3f}" for k, v in ph.items()))


if __name__ == "__main__":
    main()
