"""ZeRO-3 against ZeRO-0, with and without compute/communication contention: how many plan pairs
the contention factor (builders/contention.py) flips, over a sweep of models, systems and
data-parallel degrees (tp 1, pp 1; one micro-batch per GPU, 4 micro-batches per iteration; the
gradient reduction overlapped with the backward, as FSDP and DDP run, and not).

    python scripts/zero3_vs_zero0.py            # prints every pair and the counts
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import replace

from trainsim.builders.plan import Plan
from trainsim.builders.predict import predict_llm
from trainsim.errors import TrainsimError

MODELS = ("gpt2", "llama2-7b", "llama2-13b", "llama3-8b")
SYSTEMS = ("dgx-a100", "dgx-h100", "perlmutter", "vista")
DPS = (2, 8, 16, 64)


def main() -> int:
    pairs, flips, z3_faster = {True: 0, False: 0}, {"to_slower": 0, "to_faster": 0}, {True: 0, False: 0}
    for model, system, dp, ogr in itertools.product(MODELS, SYSTEMS, DPS, (True, False)):
        base = Plan(dp=dp, micro_batch=1, global_batch=4 * dp, overlap_grad_reduce=ogr)
        t: dict[tuple[int, bool], float] = {}
        try:
            for zero, cont in itertools.product((0, 3), (True, False)):
                t[zero, cont] = predict_llm(model, replace(base, zero=zero, contention=cont), system).iteration_time_s
        except TrainsimError as e:  # a plan the model cannot run is skipped, and said
            print(f"skip {model} {system} dp{dp}: {e}", file=sys.stderr)
            continue
        faster = {c: t[3, c] < t[0, c] for c in (True, False)}
        for c in (True, False):
            pairs[c] += 1
            z3_faster[c] += faster[c]
        if faster[True] != faster[False]:
            flips["to_slower" if faster[False] else "to_faster"] += 1
        print(f"{model:11s} {system:11s} dp{dp:<3d} ogr={int(ogr)}  zero0 {t[0, False] * 1e3:9.2f} -> {t[0, True] * 1e3:9.2f} ms"
              f"  zero3 {t[3, False] * 1e3:9.2f} -> {t[3, True] * 1e3:9.2f} ms"
              f"  zero3 faster: {faster[False]} -> {faster[True]}")  # fmt: skip
    print(f"pairs {pairs[True]}: ZeRO-3 faster than ZeRO-0 in {z3_faster[False]} without contention, {z3_faster[True]} with; "
          f"flipped to ZeRO-3 slower: {flips['to_slower']}, to ZeRO-3 faster: {flips['to_faster']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
