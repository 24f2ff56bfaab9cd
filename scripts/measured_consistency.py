"""How much of a measured-iteration file no work-monotone model can match (docs/llm.md).

Physically, one micro-batch of the same model and parallel layout cannot get faster when it
holds more tokens. For each chain of rows alike in model, tp, pp, dp and global batch, sorted by
micro-batch size, the per-micro-batch time is taken as ``T / (m + pp - 1)`` (1F1B: ``m``
micro-batches per pipeline, ``pp - 1`` more slots of bubble; the once-per-iteration gradient
reduction and optimizer step are left in, small beside the passes here). A chain whose time
falls as the micro-batch grows contradicts every model that charges more work at least as much
time. The smallest mean relative error such a model can reach on the chain is an isotonic fit
(exhaustive here: the optimal values lie on the data, and chains have at most five rows).
Summed over the file, divided by its rows, it is a floor on the file's MAPE from these
contradictions alone (other noise adds to it).

    python scripts/measured_consistency.py               # vTrain single- and multi-node
    python scripts/measured_consistency.py --files vtrain-single --worst 10
"""

from __future__ import annotations

import argparse
import itertools
from collections import defaultdict
from pathlib import Path

from trainsim.validate.llm_cases import LLMCase, parse_tags, read_cases


def isotonic_l1_relative(values: list[float]) -> float:
    """The least sum of ``|p_i - v_i| / v_i`` over non-decreasing ``p`` (exhaustive over data
    values: an optimum lies on them)."""
    best = float("inf")
    for combo in itertools.product(sorted(set(values)), repeat=len(values)):
        if all(a <= b for a, b in itertools.pairwise(combo)):
            best = min(best, sum(abs(p - v) / v for p, v in zip(combo, values, strict=True)))
    return best


def chains(cases: list[LLMCase]) -> dict[tuple[object, ...], list[tuple[int, float, str]]]:
    out: dict[tuple[object, ...], list[tuple[int, float, str]]] = defaultdict(list)
    for c in cases:
        p = c.plan
        slots = p.grad_accum + p.pp - 1
        out[(c.model.name, p.tp, p.pp, p.dp, p.batch)].append((p.micro_batch, c.measured_s / slots, c.id))
    return {k: sorted(v) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"),
                    help="shared/data or its ground_truth folder (default: ../shared/data)")  # fmt: skip
    ap.add_argument("--files", default="vtrain-single,vtrain-multi", help="ground-truth tags")
    ap.add_argument("--worst", type=int, default=5, help="chains to print per file")
    args = ap.parse_args()
    for tag in parse_tags(args.files) or []:
        cases = read_cases(args.root, [tag])
        per = chains(cases)
        floors = {k: isotonic_l1_relative([u for _, u, _ in v]) for k, v in per.items()}
        broken = {k: f for k, f in floors.items() if f > 1e-12}
        print(f"{tag}: {len(cases)} rows, {len(per)} chains, {len(broken)} contradict a work-monotone model; "
              f"floor on the file's MAPE from them {100 * sum(floors.values()) / len(cases):.2f} %")  # fmt: skip
        for k, f in sorted(broken.items(), key=lambda kv: -kv[1])[: args.worst]:
            steps = ", ".join(f"mb{mb} {u * 1e3:.1f} ms" for mb, u, _ in per[k])
            print(f"  {k[0]} tp{k[1]} pp{k[2]} dp{k[3]} gb{k[4]}: {100 * f:.1f} % over the chain ({steps})")


if __name__ == "__main__":
    main()
