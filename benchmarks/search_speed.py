"""Plan-search speed: screening throughput and a full GPT-3 175B search on 1,024 A100s.

Targets (LLM search issue): >= 100k configurations per minute screened here (2 cores), and a
full search for GPT-3 175B on 1,024 A100s in <= 60 s. Screening throughput is measured on a
large space (every dimension open), twice: cold (the first search starts the worker processes,
which import trainsim and load the kernel models) and warm (a search of another model reuses
them, as every later search of one program does); the full search is the whole `search_llm` call
(enumerate, screen, simulate the best 32) on the warm processes.

    python benchmarks/search_speed.py
"""

from __future__ import annotations

import os
import time

from trainsim.builders.models import get_model
from trainsim.search.llm import search_llm
from trainsim.search.space import PlanSpace


def main() -> None:
    workers = os.cpu_count() or 1
    # fused (Megatron softmax) attention: with flash attention the search drops selective
    # recompute beside none (the same memory, more time), a third of this space; fused keeps
    # the 8,052 plans the figures before 2026-12-02 were measured on
    big = PlanSpace(gpus=2048, global_batch=2048, micro_batch=(1, 2, 4, 8, 16), cp=(1, 2), vpp=(2, 3, 4),
                    attention="fused")
    # cold: the processes start, import and load the kernel models; warm: another model (none
    # of its layer shapes cached yet) on the same processes
    for label, model in (("cold", get_model("llama3-70b")), ("warm", get_model("llama2-70b"))):
        r = search_llm(model, "dgx-h100", big, workers=workers, progress=False, simulate_top=0, top_k=0)
        print(f"screening ({label}, {model.name}): {r['evaluated']:,} plans ({r['enumerated']:,} enumerated) in "
              f"{r['timings_s']['screen']:.2f} s with {workers} processes = {r['screened_per_min']:,.0f} plans/min")  # fmt: skip
    t = time.perf_counter()
    r = search_llm(get_model("gpt3-175b"), "dgx-a100", PlanSpace(gpus=1024, global_batch=1536), workers=workers,
                   progress=False)  # fmt: skip
    wall = time.perf_counter() - t
    best = r["plans"][0]
    print(f"GPT-3 175B on 1,024 A100s: {r['enumerated']:,} plans enumerated, {r['evaluated']:,} screened, "
          f"{r['feasible']:,} feasible, {r['simulated']} simulated, {wall:.1f} s total "
          f"(screen {r['timings_s']['screen']:.1f} s, simulate {r['timings_s']['simulate']:.1f} s); "
          f"best {best['plan']} {best['iteration_time_s']:.2f} s, MFU {best['mfu'] * 100:.1f} %")  # fmt: skip


if __name__ == "__main__":
    main()
