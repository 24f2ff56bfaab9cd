"""PredTOP end to end on this machine: collect stage latencies, evaluate, run the search integration.

    python benchmarks/predtop_run.py collect  [--root DIR]        # ~40 min, resumable
    python benchmarks/predtop_run.py evaluate [--root DIR] [--results DIR] [--part train|forward]
    python benchmarks/predtop_run.py search   [--root DIR] [--results DIR] [--part ...]
    python benchmarks/predtop_run.py report   [--results DIR]      # Markdown tables for docs/predtop.md

``--root`` (default: the packaged dataset folder ``src/trainsim/learn/data/predtop``) holds
``gpt/``, ``moe/`` (random stages) and ``gpt-search/``, ``moe-search/`` (every candidate stage of
the search models). Every step resumes where an interrupted run stopped. Collection runs each
family in its own process (``python -m trainsim.learn.dataset``: single-threaded XLA, one core).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "src" / "trainsim" / "learn" / "data" / "predtop"
COUNTS = {"gpt": 340, "moe": 180}


def collect(root: Path) -> None:
    jobs = [[f, "--count", str(n)] for f, n in COUNTS.items()]
    jobs += [[f, "--search"] for f in COUNTS]
    for job in jobs:
        folder = root / (job[0] + ("-search" if "--search" in job else ""))
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "trainsim.learn.dataset", str(folder), "--family", *job]
        subprocess.run(cmd, check=True)
        print(f"{folder.name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)


def evaluate(root: Path, results: Path, *, part: str, fractions: list[float], kinds: list[str], threads: int,
             features: str) -> None:  # fmt: skip
    from trainsim.learn.evaluate import evaluate as run
    from trainsim.learn.evaluate import features_flag
    from trainsim.learn.train import TrainConfig

    out = run({f: root / f for f in COUNTS}, results, fractions=fractions, kinds=kinds, part=part,
              input_features=features_flag(features), train_config=TrainConfig(threads=threads),
              log=lambda m: print(m, file=sys.stderr, flush=True))  # fmt: skip
    (results / f"summary-{part}.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


def search(root: Path, results: Path, part: str, threads: int, features: str) -> None:
    from trainsim.learn.provider import run_search_integration
    from trainsim.learn.train import Predictor, TrainConfig

    out = {}
    for fam in COUNTS:
        preds = {}
        for kind in ("dag_transformer", "gcn", "gat"):
            p = results / "predictors" / f"{fam}-{kind}-s0"
            if (p / "predictor.json").exists():
                preds[kind] = Predictor.load(p)
        out[fam] = run_search_integration(root / f"{fam}-search", family=fam, family_predictors=preds, part=part,
                                          train_config=TrainConfig(threads=threads),
                                          input_features=features == "table1+work")  # fmt: skip
        for name, a in out[fam]["approaches"].items():
            print(f"{fam} {name}: regret mean {a['mean_regret_pct']:.2f} % max {a['max_regret_pct']:.2f} %, "
                  f"same plan {a['same_plan']}/{len(out[fam]['cases'])}, cost {a['cost_s']:.0f} s "
                  f"(saved {a['saved_pct']:.1f} %), MRE {a['mre_pct']:.2f} %", file=sys.stderr)  # fmt: skip
    (results / f"search-{part}.json").write_text(json.dumps(out, indent=1))


def report(results: Path, part: str, features: str) -> None:
    from trainsim.learn.evaluate import read_cases, summarize

    s = summarize(read_cases(results), part=part, features=features)
    names = {"dag_transformer": "DAG Tr.", "gcn": "GCN", "gat": "GAT"}
    for fam, rows in s["mre_pct"].items():
        print(f"\n{fam.upper()} — MRE % (test)\n\n| train | " + " | ".join(names.values()) + " |")
        print("|---|" + "---|" * len(names))
        for fr in sorted(rows, reverse=True):
            cell = rows[fr]
            best = min(cell.values())
            vals = [f"**{cell[k]:.2f}**" if cell.get(k) == best else f"{cell[k]:.2f}" if k in cell else "—"
                    for k in names]  # fmt: skip
            print(f"| {float(fr):.0%} | " + " | ".join(vals) + " |")
    print(json.dumps({k: v for k, v in s.items() if k != "mre_pct"}, indent=1))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("step", choices=["collect", "evaluate", "search", "report"])
    ap.add_argument("--root", type=Path, default=ROOT)
    ap.add_argument("--results", type=Path, default=ROOT / "results")
    ap.add_argument("--part", default="train")
    ap.add_argument("--features", default="table1+work", choices=["table1", "table1+work"])
    ap.add_argument("--fractions", default="0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8")
    ap.add_argument("--models", default="dag_transformer,gcn,gat")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    if a.step == "collect":
        collect(a.root)
    elif a.step == "evaluate":
        evaluate(a.root, a.results, part=a.part, fractions=[float(x) for x in a.fractions.split(",")],
                 kinds=a.models.split(","), threads=a.threads, features=a.features)  # fmt: skip
    elif a.step == "search":
        search(a.root, a.results, a.part, a.threads, a.features)
    else:
        report(a.results, a.part, a.features)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
