"""Latency of ``predict_llm`` per configuration: simulation vs. 001's closed form.

Runs every vTrain ground-truth configuration (shared/data/ground_truth, 1,549 rows) twice —
with the simulator and closed form only — after a warm-up that loads the kernel models, and
prints median / p95 / max per method, plus a few large catalog plans. The issue's targets are
<= 50 ms per configuration with simulation and <= 1 ms for the closed form; the closed-form
figure here is the formula itself (``timings_s["closed_form"]``) and the whole call
(operator costs included) beside it.

    python benchmarks/llm_latency.py [path/to/shared/data]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from trainsim.builders.costs import OpCoster
from trainsim.builders.plan import Plan
from trainsim.builders.predict import predict_llm
from trainsim.hardware import get_device, get_system
from trainsim.validate.llm_cases import read_cases


def _q(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    data = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "shared" / "data"
    cases = read_cases(data / "ground_truth", ["vtrain-multi", "vtrain-single"])
    system = get_system("vtrain-a100")
    coster = OpCoster(get_device(system.device))
    predict_llm(cases[0].model, cases[0].plan, system, coster=coster)  # warm-up: load models
    sim, cf_call, cf_formula = [], [], []
    for c in cases:
        t = time.perf_counter()
        predict_llm(c.model, c.plan, system, coster=coster)
        sim.append(time.perf_counter() - t)
    coster = OpCoster(get_device(system.device))  # cold operator cache for the closed form
    predict_llm(cases[0].model, cases[0].plan, system, coster=coster, simulate=False)
    for c in cases:
        t = time.perf_counter()
        r = predict_llm(c.model, c.plan, system, coster=coster, simulate=False)
        cf_call.append(time.perf_counter() - t)
        cf_formula.append(r.timings_s["closed_form"])
    for name, xs in (("simulation (whole call)", sim), ("closed form (whole call)", cf_call),
                     ("closed form (formula)", cf_formula)):  # fmt: skip
        print(f"{name:28s} n={len(xs)} median {statistics.median(xs) * 1e3:8.3f} ms  "
              f"p95 {_q(xs, 0.95) * 1e3:8.3f} ms  max {max(xs) * 1e3:8.3f} ms  "
              f"over 50 ms: {sum(x > 0.05 for x in xs)}")  # fmt: skip
    for model, plan in (("gpt3-175b", Plan(tp=8, pp=16, dp=8, micro_batch=1, global_batch=1536, recompute="full")),
                        ("llama3-70b", Plan(tp=8, pp=4, dp=16, micro_batch=1, global_batch=1024))):  # fmt: skip
        t = time.perf_counter()
        r = predict_llm(model, plan, "dgx-a100")
        print(f"{model} {plan.label()}: {(time.perf_counter() - t) * 1e3:.1f} ms "
              f"({plan.grad_accum} micro-batches x {plan.pp} stages; sim {r.timings_s['simulation'] * 1e3:.1f} ms)")  # fmt: skip


if __name__ == "__main__":
    main()
