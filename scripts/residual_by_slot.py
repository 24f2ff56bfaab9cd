"""Where the vTrain single-node under-prediction sits: per layer, or per pipeline slot (docs/llm.md).

For each group of rows alike in tensor-parallel degree, pipeline depth, width and micro-batch,
the residual (measured − predicted iteration time) is divided by the number of 1F1B pipeline
slots, ``m + pp − 1`` (``m`` micro-batches per pipeline), and fitted by least squares against the
layers one stage holds: ``residual per slot = a + b · layers per stage``. A cost the model misses
on every layer shows as a slope ``b``; one it misses once per micro-batch and stage (whatever the
stage's layers) as an intercept ``a`` with a flat slope. Nothing here changes the model; it reads
the predictions ``trainsim validate llm`` makes.

    python scripts/residual_by_slot.py                    # micro-batch 1, tp 1/2/4, pp 1/2/4
    python scripts/residual_by_slot.py --micro-batch 2
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

import numpy as np

from trainsim.validate.llm_suite import run_llm_suite

_PLAN = re.compile(r"tp(\d+)-pp(\d+)-dp(\d+)-mb(\d+)-gb(\d+)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    ap.add_argument("--micro-batch", type=int, default=1)
    args = ap.parse_args()
    doc = run_llm_suite(args.data, files="vtrain-single")
    groups: dict[tuple[int, int, int], list[tuple[float, float]]] = defaultdict(list)
    for c in doc["cases"]:
        m = _PLAN.match(c["plan"])
        if m is None:
            continue
        tp, pp, dp, mb, gb = map(int, m.groups())
        if mb != args.micro_batch:
            continue
        hidden = int(re.search(r"(\d+)h", c["model"]).group(1))  # type: ignore[union-attr]
        layers = int(re.search(r"(\d+)l", c["model"]).group(1))  # type: ignore[union-attr]
        slots = gb // (mb * dp) + pp - 1
        groups[(tp, pp, hidden)].append((layers / pp, (c["measured_s"] - c["predicted_s"]) * 1e3 / slots))
    print(f"micro-batch {args.micro_batch}: residual (measured - predicted) per pipeline slot, ms")
    print(f"{'tp':>3} {'pp':>3} {'hidden':>6} {'rows':>5} {'layers/stage':>12} {'a (ms/slot)':>11} "
          f"{'b (ms/layer)':>12} {'median':>7}")  # fmt: skip
    for (tp, pp, hidden), pts in sorted(groups.items()):
        x, y = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
        if len(set(x)) < 2:
            continue
        (a, b), *_ = np.linalg.lstsq(np.c_[np.ones_like(x), x], y, rcond=None)
        span = f"{x.min():g}-{x.max():g}"
        print(f"{tp:>3} {pp:>3} {hidden:>6} {len(x):>5} {span:>12} {a:>11.2f} {b:>12.3f} {np.median(y):>7.2f}")


if __name__ == "__main__":
    main()
