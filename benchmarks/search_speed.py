"""Plan-search speed: screening throughput and a full GPT-3 175B search on 1,024 A100s.

Targets (LLM search issue): >= 100k configurations per minute screened here (2 cores), and a
full search for GPT-3 175B on 1,024 A100s in <= 60 s. Screening throughput is measured on a
large space (every dimension open) after a warm-up that loads the kernel models in each worker;
the full search is the whole `search_llm` call (enumerate, screen, simulate the best 32).

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
    big = PlanSpace(gpus=2048, global_batch=2048, micro_batch=(1, 2, 4, 8, 16), cp=(1, 2), vpp=(2, 3, 4))
    model = get_model("llama3-70b")
    search_llm(model, "dgx-h100", PlanSpace(gpus=64, global_batch=64), workers=workers, progress=False, simulate_top=1)
    r = search_llm(model, "dgx-h100", big, workers=workers, progress=False, simulate_top=0, top_k=0)
    print(f"screening: {r['evaluated']:,} plans ({r['enumerated']:,} enumerated) in {r['timings_s']['screen']:.2f} s "
          f"with {workers} processes = {r['screened_per_min']:,.0f} plans/min")  # fmt: skip
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
