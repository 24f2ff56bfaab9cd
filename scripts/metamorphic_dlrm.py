"""Metamorphic / physics sweep over the DLRM step predictor and the sharders (`trainsim shard`).

Samples random valid DLRM specs (random_tables, 000 §IV-B1; with and without reuse histograms,
dot and cat interactions, fp32/fp16) and sharding plans on catalog GPUs (002 §4.3.2.1 L2 and
000 §III-E reuse-factor heuristics) and a CPU device YAML (spec-based rooflines), and checks
relations a correct model must satisfy. A violation prints one line with the case and numbers;
exit 1 when any relation fails.

    python scripts/metamorphic_dlrm.py [--specs N] [--seed S]

Relations (the counts are printed at the end):

kernel    embedding_bag (both heuristics, fwd and bwd): more rows E, larger dim D, larger pooling
          L, larger batch B never faster; lower reuse (mass moved to the once-touched bin, more
          unique rows) never faster; the rows 002's model caches never exceed the L2.
step      same sharding: more rows / larger dim / larger pooling for one table, a larger batch,
          lower reuse, one more table (on the least-loaded rank) never make the step faster;
          interaction fixed (not ``auto``: a dim change can switch dot -> cat, another model).
          Overlapped collectives never slower than blocking ones; a faster / lower-latency
          host link never slower.
a2a       world 1 has no collectives; every rank's all-to-all(v) is timed at 000 §III-C's size
          (max over devices of max(sent, received)), recomputed here from the assignment, and
          the forward send matrix's row sums / column sums are each rank's bytes / out_bytes.
cost      the greedy's cost (table_costs) is the step's embedding time: per rank, the sum of
          the workload's embedding kernels equals select_sharder's embedding_load_s; table
          costs do not depend on the world.
greedy    LPT bounds on the cost it schedules: max load <= sum/world + max cost, and
          <= (4/3 - 1/(3 world)) x the max load of every other sharder's assignment (an upper
          bound of the optimum) -- *not* "its step is never worse than the six": the step adds
          the all-to-all (sized by dims, not costs) and greedy is a heuristic, so that is not
          claimed (docs/sharding.md); counted as info. Moving a table from the busiest rank to
          the idlest (when it fits below the old max) never raises the max load, and on a CPU
          rank (blocking collectives) never slows the step when the all-to-all does not grow.
shard     every sharder assigns every table exactly once to a rank in 0..world-1; under a cap,
          a returned assignment respects it (an index sharder that breaks it raises, and does
          break it); identical tables are spread evenly by every greedy sharder.
perm      permuting the tables (and the plan with them) never changes the step beyond
          rounding; the greedy sharders are order-insensitive by definition (ties aside, which
          random tables do not have), so their step is unchanged by a permutation; naive and
          random are order-sensitive by definition and are not checked. Renaming tables changes
          nothing.
scale     2x every table's L: lookup_greedy, norm_lookup_greedy and size_lookup_greedy give the
          same plan; 2x every E: size_greedy and norm_lookup_greedy do; 2x every D (cat):
          lookup_greedy and size_lookup_greedy do.
cli       `trainsim shard --format json`: the documented keys, sharders fastest first, `best` is
          the minimum, infeasible sharders last with null keys and an error.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from trainsim.builders.dlrm import (
    Coster,
    DLRMSpec,
    TableSpec,
    build_dlrm_workload,
    comm_setup,
    is_gpu,
    padded_group,
    predict_dlrm_step,
    random_tables,
    table_costs,
)
from trainsim.comm import predict_collective
from trainsim.errors import ConfigError
from trainsim.hardware import get_device, get_system, list_systems
from trainsim.ir.kinds import CollectiveKind, OpCategory
from trainsim.kernels.embedding import EmbeddingLookupModel, _log_comb_ratio
from trainsim.kernels.features import dtype_bytes
from trainsim.kernels.model import query
from trainsim.kernels.monotone import MONOTONE_SLACK
from trainsim.kernels.registry import load_model
from trainsim.search.sharders import SHARDERS, select_sharder

ROOT = Path(__file__).resolve().parents[1]
CPU_DEV = str(ROOT / "src/trainsim/bench/data/cpu_quick_f97e94a9cbddf655.device.yaml")
CPU_FULL = ROOT / "src/trainsim/bench/data/cpu_full_f97e94a9cbddf655.device.yaml"
CACHE = Path.home() / ".cache/trainsim"
GPUS = ("a100-sxm4-80gb", "h100-sxm5-80gb", "v100-sxm2-32gb")
GREEDY = (
    "size_greedy",
    "lookup_greedy",
    "norm_lookup_greedy",
    "size_lookup_greedy",
    "predicted_greedy",
)
REL = 1e-9
violations: list[str] = []
counts: dict[str, int] = {}
info: dict[str, int] = {}
worst: dict[str, float] = {}


def note(what: str, pct: float | None = None) -> None:
    """Count an information line; ``pct``: keep the largest such figure beside it."""
    info[what] = info.get(what, 0) + 1
    if pct is not None:
        worst[what] = max(worst.get(what, pct), pct)


def count(what: str) -> None:
    counts[what] = counts.get(what, 0) + 1


def bad(relation: str, detail: str) -> None:
    violations.append(f"{relation}: {detail}")
    print(f"VIOLATION {relation}: {detail}", flush=True)


def close(a: float, b: float, rel: float = REL) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-30)


def not_faster(relation: str, base: float, more: float, tag: str) -> None:
    """``more`` (the bigger problem) must not be below ``base`` beyond rounding."""
    count(relation)
    if more < base * (1 - REL):
        bad(relation, f"{tag}: {more:.9g} < {base:.9g} ({(more / base - 1) * 100:+.3f} %)")


# --- sampling --------------------------------------------------------------------------------------


def sample_spec(rng: random.Random) -> DLRMSpec:
    n = rng.randint(2, 28)
    tables = list(random_tables(n, seed=rng.randrange(10**9), heavy=rng.random() < 0.4,
                                max_rows=rng.choice((10**5, 10**6, 10**7))))  # fmt: skip
    uniform = rng.random()
    tables = [replace(t, reuse=None) if rng.random() < uniform * 0.6 else t for t in tables]
    # edge tables: a handful of rows (fewer than a bag's L: bags repeat rows), odd dims
    tables = [replace(t, rows=rng.randint(1, 8), pooling=float(rng.randint(1, 40))) if rng.random() < 0.08 else t
              for t in tables]  # fmt: skip
    tables = [
        replace(t, dim=rng.choice((1, 3, 5, 12))) if rng.random() < 0.05 else t for t in tables
    ]
    bottom = (rng.choice((128, 256, 512)), rng.choice((64, 128)), rng.choice((16, 32, 64)))
    if rng.random() < 0.35:  # the dot interaction: every dim equals the bottom MLP's output
        tables = [replace(t, dim=bottom[-1]) for t in tables]
        inter = rng.choice(("dot", "auto"))
    else:
        inter = "cat"
    batch = rng.choice((512, 1024, 2048, 4096, 8192)) + rng.choice((0, 0, rng.randrange(1, 300)))
    return DLRMSpec(tuple(tables), batch=batch, bottom_mlp=bottom, top_mlp=(rng.choice((256, 512)), 64, 1),
                    dtype=rng.choice(("fp32", "fp32", "fp16")), interaction=inter)  # fmt: skip


def sample_plan(spec: DLRMSpec, world: int, rng: random.Random) -> list[int]:
    name = rng.choice(list(SHARDERS))
    if name == "predicted_greedy":
        return [rng.randrange(world) for _ in spec.tables]
    return SHARDERS[name](spec, world, seed=rng.randrange(1000))


def emb_per_rank(w: object) -> list[float]:
    out = []
    for rg in w.ranks:  # type: ignore[attr-defined]
        out.append(
            sum(
                k.predicted_s
                for op in rg.ops
                if op.name.startswith("embedding_")
                for k in op.kernels
            )
        )
    return out


def collectives(w: object) -> list[tuple[int, object]]:
    return [(rg.rank, k) for rg in w.ranks for op in rg.ops  # type: ignore[attr-defined]
            if op.category is OpCategory.COMMUNICATION for k in op.kernels]  # fmt: skip


# --- kernel level ----------------------------------------------------------------------------------


def _one(a: object) -> float:
    return float(np.ravel(np.asarray(a))[0])


def check_kernels(rng: random.Random, n: int) -> None:
    for _ in range(n):
        dev = get_device(rng.choice(GPUS))
        reuse = rng.random() < 0.5
        m = EmbeddingLookupModel(dev, reuse_factors=reuse)
        t = random_tables(
            1, seed=rng.randrange(10**9), max_rows=10**7, min_rows=rng.choice((1, 1000))
        )[0]
        if rng.random() < 0.2:  # whole bag lengths (the thesis' L), some longer than a tiny table
            t = replace(t, pooling=float(rng.randint(1, 64)))
        dt = rng.choice(("fp32", "fp16"))
        x = {"B": float(rng.choice((64, 256, 1024, 2048, 4096, 8192, 65536))), "E": float(t.rows), "T": 1.0,
             "L": t.pooling, "D": float(t.dim)}  # fmt: skip
        rf = {f"rf_{i}": f for i, f in enumerate(t.reuse or ())}
        several = x["B"] < m.rows_per_block * float(dev.sm_count or 1)
        tag = f"{m.name} {dt} {x}"
        for phase in ("fwd", "bwd"):
            q = query("embedding_bag", phase=phase, dtype=dt, **x, **rf)  # type: ignore[arg-type]

            def t_of(q: object = q, m: EmbeddingLookupModel = m, x: dict[str, float] = x,
                     rf: dict[str, float] = rf, **ch: float) -> float:  # fmt: skip
                return _one(m.predict_many(q, {**x, **rf, **ch})[0])  # type: ignore[arg-type]

            base = t_of()
            for k, f in (
                ("E", 4.0),
                ("E", 1.3),
                ("D", 2.0),
                ("L", 2.0),
                ("L", 1.1),
                ("B", 2.0),
                ("B", 1.5),
            ):
                if k == "B" and not reuse and several:
                    # documented (features.py, embedding_bag: "No claim in B"): in 002's L2 model
                    # a larger batch leaves fewer tables sharing the L2 and can raise the hit rate
                    # more than the lookups grow; from rows_per_block x SMs samples on, one table
                    # has the whole L2 and the time is linear in B
                    note("kernel B not checked: several tables share the L2 (no claim in B)")
                    continue
                not_faster(
                    f"kernel: larger {k} never faster",
                    base,
                    t_of(**{k: x[k] * f}),
                    f"{tag} {phase} {k}x{f}",
                )
            if reuse:
                s = rng.uniform(0.1, 0.9)  # a share s of every bin above 0 moves to bin 0
                low = {f"rf_{i}": (f * (1 - s) if i else f) for i, f in enumerate(t.reuse or ())}
                low["rf_0"] += s * (1 - (t.reuse or (1.0,))[0])
                not_faster(
                    "kernel: lower reuse never faster",
                    base,
                    t_of(**low),
                    f"{tag} {phase} s={s:.2f}",
                )
        if not reuse:
            # 002's hit rate C(cached, L) / C(E, L) can be no higher than with as many rows cached
            # as the L2 holds (the formula as printed caches L2 / (num_tables D eb) rows, more
            # than the L2 holds once num_tables < 1)
            count("kernel: cached rows fit in the L2")
            eb = dtype_bytes(dt)
            arr = {k: np.asarray([v]) for k, v in x.items()}
            p_model = _one(m._hit_rate(arr, eb, {}))
            fit = min(float(dev.l2_cache_bytes or 0) / (x["D"] * eb), x["E"])
            p_fit = _one(np.exp(_log_comb_ratio(np.floor(np.asarray([fit])), arr["E"], arr["L"])))
            if p_model > p_fit * (1 + 1e-9) + 1e-15:
                bad("kernel: cached rows fit in the L2",
                    f"{tag}: hit rate {p_model:.4g}, above {p_fit:.4g} with all {fit:,.0f} rows the L2 holds cached")  # fmt: skip


# --- step level ------------------------------------------------------------------------------------


class Target:
    """Where steps are predicted: a device, its Coster (kernel models answer once), options,
    and the slack a relation allows (0 for spec-based models; learned ones: MONOTONE_SLACK)."""

    def __init__(
        self, device: str, kernel_models: str | None = None, tbe: bool | None = None
    ) -> None:
        self.device = device
        self.name = device.rsplit("/", 1)[-1].removesuffix(".device.yaml") + (
            " calibrated" if kernel_models else ""
        )
        self.kernel_models = [load_model(kernel_models)] if kernel_models else None  # loaded once
        self.coster = Coster(device, self.kernel_models)
        self.tbe = tbe
        self.gpu = is_gpu(self.coster.device)
        self.slack = MONOTONE_SLACK if kernel_models else 0.0

    def step(self, spec: DLRMSpec, a: list[int], world: int, **kw: object) -> float:
        return predict_dlrm_step(
            spec, a, world, device=self.coster.device, coster=self.coster, tbe=self.tbe, **kw
        )  # type: ignore[arg-type]

    def costs(self, spec: DLRMSpec) -> list[float]:
        return table_costs(spec, device=self.coster.device, coster=self.coster, tbe=self.tbe)

    def monotone(
        self, relation: str, base: float, more: float, tag: str, *, claimed: bool = True
    ) -> None:
        """Spec-based: strict. Learned (calibrated) models: twice the problem at most
        MONOTONE_SLACK faster (kernels/monotone.py), and only in the inputs the operator claims
        (embedding_bag / embedding_tbe claim L and D, not B, E or reuse): an unclaimed one is
        counted as information."""
        if not self.slack:
            not_faster(relation, base, more, tag)
            return
        if not claimed:
            count(relation + " [learned: no claim, info]")
            if more < base * (1 - REL):
                note(
                    f"{relation}: learned model faster where no claim is made",
                    (1 - more / base) * 100,
                )
            return
        count(relation + " [learned, 10 % slack]")
        if more < base * (1 - self.slack):
            bad(
                relation,
                f"{tag} ({self.name}): {more:.6g} < {base:.6g} by more than the learned models' slack",
            )


def check_spec(spec: DLRMSpec, world: int, tg: Target, rng: random.Random, tag: str) -> None:
    a = sample_plan(spec, world, rng)
    base = tg.step(spec, a, world)
    tag = f"{tag} {tg.name} w{world} B{spec.batch} {spec.dtype} {spec.interaction} n{len(spec.tables)} tbe={tg.tbe}"
    # --- step monotonicity, same sharding
    i = rng.randrange(len(spec.tables))
    t = spec.tables[i]

    def with_table(nt: TableSpec) -> DLRMSpec:
        return replace(spec, tables=(*spec.tables[:i], nt, *spec.tables[i + 1 :]))

    def grown(
        relation: str,
        other: DLRMSpec,
        what: str,
        claimed: bool = True,
        plan: list[int] | None = None,
    ) -> None:
        tg.monotone(
            relation, base, tg.step(other, plan or a, world), f"{tag} {what}", claimed=claimed
        )

    grown(
        "step: more rows never faster",
        with_table(replace(t, rows=t.rows * 3)),
        f"t{i} rows x3",
        claimed=False,
    )
    grown(
        "step: larger pooling never faster",
        with_table(replace(t, pooling=t.pooling * 2)),
        f"t{i} L x2",
    )
    if spec.interaction == "cat":  # dot/auto: every dim equals the bottom MLP's output
        grown("step: larger dim never faster", with_table(replace(t, dim=t.dim * 2)), f"t{i} D x2")
    if t.reuse is not None:
        s = rng.uniform(0.2, 0.9)
        low = [f * (1 - s) if b else f for b, f in enumerate(t.reuse)]
        low[0] += 1 - sum(low)
        grown("step: lower reuse never faster", with_table(replace(t, reuse=tuple(low))), f"t{i} reuse s={s:.2f}",
              claimed=False)  # fmt: skip
    grown(
        "step: larger batch never faster",
        replace(spec, batch=spec.batch * 2),
        "batch x2",
        claimed=False,
    )
    grown(
        "step: larger batch never faster",
        replace(spec, batch=spec.batch + 1),
        "batch +1",
        claimed=False,
    )
    costs = tg.costs(spec)
    load = [0.0] * world
    for c, r in zip(costs, a, strict=True):
        load[r] += c
    idle = min(range(world), key=lambda r: load[r])
    extra = replace(spec.tables[rng.randrange(len(spec.tables))], name="extra")
    grown("step: one more table never faster", replace(spec, tables=(*spec.tables, extra)), f"+table on rank {idle}",
          plan=[*a, idle])  # fmt: skip
    if tg.gpu and spec.dtype == "fp32":  # half the bytes, a higher peak
        not_faster("step: fp16 never slower than fp32 (GPU, spec-based)", tg.step(replace(spec, dtype="fp16"), a, world),
                   base, tag)  # fmt: skip
    if world > 1:
        not_faster("step: overlapped collectives never slower", tg.step(spec, a, world, overlap=True),
                   tg.step(spec, a, world, overlap=False), tag)  # fmt: skip
        if not tg.gpu:  # the host-local estimate
            not_faster("step: a slower host link never faster", tg.step(spec, a, world, link_bandwidth_Bps=1.6e9),
                       tg.step(spec, a, world, link_bandwidth_Bps=0.4e9), tag)  # fmt: skip
            not_faster("step: a higher link latency never faster", tg.step(spec, a, world, link_latency_s=10e-6),
                       tg.step(spec, a, world, link_latency_s=500e-6), tag)  # fmt: skip
    w = build_dlrm_workload(spec, a, world, device=tg.coster.device, coster=tg.coster, tbe=tg.tbe)
    check_a2a(spec, a, world, tg=tg, w=w, tag=tag)
    # --- the greedy's cost is the step's embedding time
    emb = emb_per_rank(w)
    count("cost: table_costs = the step's embedding kernels")
    if any(not close(x, y, 1e-9) for x, y in zip(load, emb, strict=True)):
        bad("cost: table_costs = the step's embedding kernels", f"{tag}: {load} vs {emb}")
    # --- moving a table from the busiest rank to the idlest
    if world > 1:
        hi, lo = max(range(world), key=lambda r: load[r]), idle
        mine = [j for j, r in enumerate(a) if r == hi]
        j = min(mine, key=lambda j: costs[j]) if mine else None
        if j is not None and load[lo] + costs[j] < load[hi]:
            b = list(a)
            b[j] = lo
            nl = [0.0] * world
            for c, r in zip(costs, b, strict=True):
                nl[r] += c
            count("greedy: moving busiest -> idlest never raises the max load")
            if max(nl) > max(load) * (1 + REL):
                bad(
                    "greedy: moving busiest -> idlest never raises the max load",
                    f"{tag}: {max(load)} -> {max(nl)}",
                )
            # blocking collectives (CPU): the step is the slowest rank's lookups between the
            # collectives plus shared work, so with an all-to-all no larger it cannot grow
            if not tg.gpu and a2a_bytes(spec, b, world) <= a2a_bytes(spec, a, world):
                not_faster("greedy: moving busiest -> idlest never slows a CPU step", tg.step(spec, b, world), base,
                           f"{tag} table {j} rank {hi}->{lo}")  # fmt: skip
    # --- permutation and renaming
    perm = list(range(len(spec.tables)))
    rng.shuffle(perm)
    ps = replace(spec, tables=tuple(spec.tables[p] for p in perm))
    count("perm: the same plan, tables permuted")
    got = tg.step(ps, [a[p] for p in perm], world)
    if not close(got, base, 1e-9):
        bad("perm: the same plan, tables permuted", f"{tag}: {got} vs {base}")
    rn = replace(
        spec, tables=tuple(replace(t, name=f"renamed_{k}") for k, t in enumerate(spec.tables))
    )
    count("perm: renaming tables")
    if tg.step(rn, a, world) != base:
        bad("perm: renaming tables", tag)


def shares_of(batch: int, world: int) -> list[int]:
    return [batch // world + (1 if r < batch % world else 0) for r in range(world)]


def a2a_bytes(spec: DLRMSpec, a: list[int], world: int) -> float:
    """000 §III-C: max over devices of max(sent, received), from the assignment: rank i sends
    every sample's pooled rows of its tables, rank j receives its samples of every table."""
    eb = dtype_bytes(spec.dtype)
    dim_on = [
        sum(t.dim for t, r in zip(spec.tables, a, strict=True) if r == o) for o in range(world)
    ]
    sent = [spec.batch * d * eb for d in dim_on]
    recv = [s * sum(dim_on) * eb for s in shares_of(spec.batch, world)]
    return float(max(*sent, *recv))


def check_a2a(spec: DLRMSpec, a: list[int], world: int, *, tg: Target, w: object, tag: str) -> None:
    colls = collectives(w)
    if world == 1:
        count("a2a: world 1 has no collectives")
        if colls:
            bad("a2a: world 1 has no collectives", f"{tag}: {len(colls)} collective kernels")
        return
    shares = shares_of(spec.batch, world)
    count("a2a: shares sum to the batch")
    if sum(shares) != spec.batch or [rg.metadata["batch"] for rg in w.ranks] != shares:  # type: ignore[attr-defined]
        bad("a2a: shares sum to the batch", tag)
    size = a2a_bytes(spec, a, world)
    cs = comm_setup(tg.coster.device, world)
    if cs.system.name.startswith("host-local-"):
        want = predict_collective(
            CollectiveKind.ALL_TO_ALLV, size, world, system=cs.system, gpus_per_node=world
        )
    else:
        want = predict_collective(
            CollectiveKind.ALL_TO_ALLV, size, padded_group(cs.system, world), system=cs.system
        )
    a2a = [(r, k) for r, k in colls if k.collective.kind is CollectiveKind.ALL_TO_ALLV]
    count("a2a: 000 §III-C size")
    if len(a2a) != 2 * world or any(not close(k.predicted_s, want.duration_s) for _, k in a2a):
        bad(
            "a2a: 000 §III-C size",
            f"{tag}: {sorted({k.predicted_s for _, k in a2a})} vs {want.duration_s} at {size} B",
        )
    eb = dtype_bytes(spec.dtype)
    dim_on = [
        sum(t.dim for t, r in zip(spec.tables, a, strict=True) if r == o) for o in range(world)
    ]
    fwd = {r: k.collective for r, k in a2a if k.collective.seq == 0}
    count("a2a: send matrix consistent")
    for r, c in fwd.items():
        col = sum(fwd[i].peer_bytes[r] for i in fwd)
        if (c.bytes != sum(c.peer_bytes) or c.out_bytes != col or c.bytes != spec.batch * dim_on[r] * eb
                or col != shares[r] * sum(dim_on) * eb):  # fmt: skip
            bad("a2a: send matrix consistent", f"{tag} rank {r}: bytes {c.bytes} out {c.out_bytes}")
            break


def check_comm_curves() -> None:
    """The collectives' times never fall as the message grows (every catalog system, the
    worlds the sweep uses; all-to-all(v) and all-reduce) -- what makes a larger dim never faster."""
    sizes = [2.0**k for k in range(2, 34)] + [3 * 2.0**k for k in range(2, 33)]
    sizes.sort()
    for sysname in [s.name for s in list_systems()]:
        system = get_system(sysname)
        for world in (2, 3, 4, 8, 16, 26, 64):
            for kind in (CollectiveKind.ALL_TO_ALLV, CollectiveKind.ALL_REDUCE):
                prev = 0.0
                group = padded_group(system, world)
                for m in sizes:
                    t = predict_collective(kind, m, group, system=system).duration_s
                    count("comm: time never falls as the message grows")
                    if t < prev * (1 - REL):
                        bad(
                            "comm: time never falls as the message grows",
                            f"{sysname} {kind.value} w{world}: {m:g} B {t:.6g} < {prev:.6g}",
                        )
                        break
                    prev = t


def check_sharders(spec: DLRMSpec, world: int, tg: Target, rng: random.Random, tag: str) -> None:
    tag = f"{tag} {tg.name} w{world} n{len(spec.tables)}"
    kw = {"device": tg.coster.device, "kernel_models": tg.kernel_models, "tbe": tg.tbe}
    n = len(spec.tables)
    seed0 = rng.randrange(100)
    res = select_sharder(spec, world, seed=seed0, **kw)  # type: ignore[arg-type]
    by = {r["name"]: r for r in res}
    costs = tg.costs(spec)
    # every table once, on a rank of the world
    for r in res:
        count("shard: each table exactly once")
        a = r["assignment"]
        if len(a) != n or any(not (isinstance(x, int) and 0 <= x < world) for x in a):
            bad("shard: each table exactly once", f"{tag} {r['name']}: {a}")
        count("cost: embedding_load_s and imbalance")
        load = [0.0] * world
        for c, x in zip(costs, a, strict=True):
            load[x] += c
        mean = sum(load) / world
        if any(
            not close(p, q) for p, q in zip(load, r["embedding_load_s"], strict=True)
        ) or not close(r["imbalance"], max(load) / mean):
            bad("cost: embedding_load_s and imbalance", f"{tag} {r['name']}")
    for r in res[:3]:
        count("cost: select_sharder step = predict_dlrm_step")
        if not close(r["predicted_step_s"], tg.step(spec, r["assignment"], world), 1e-12):
            bad("cost: select_sharder step = predict_dlrm_step", f"{tag} {r['name']}")
        count("cost: critical path parts sum to the step")
        cp = r["critical_path_s"]
        if not close(sum(cp.values()), r["predicted_step_s"], 1e-9) or min(cp.values()) < 0:
            bad(
                "cost: critical path parts sum to the step",
                f"{tag} {r['name']}: {cp} vs {r['predicted_step_s']}",
            )
    count("shard: fastest first")
    steps = [r["predicted_step_s"] for r in res]
    if steps != sorted(steps):
        bad("shard: fastest first", f"{tag}: {steps}")
    # LPT bounds on its own cost
    pg = max(by["predicted_greedy"]["embedding_load_s"])
    count("greedy: max load <= sum/world + max cost")
    if pg > (sum(costs) / world + max(costs)) * (1 + REL):
        bad(
            "greedy: max load <= sum/world + max cost",
            f"{tag}: {pg} vs {sum(costs) / world + max(costs)}",
        )
    ratio = 4 / 3 - 1 / (3 * world)
    for r in res:
        if r["name"] == "predicted_greedy":
            continue
        count("greedy: within 4/3 of every other sharder's max load")
        if pg > ratio * max(r["embedding_load_s"]) * (1 + REL):
            bad(
                "greedy: within 4/3 of every other sharder's max load",
                f"{tag} vs {r['name']}: {pg} > {ratio:.3f} x {max(r['embedding_load_s'])}",
            )
    best_other = min(r["predicted_step_s"] for r in res if r["name"] != "predicted_greedy")
    note("select_sharder runs")
    if by["predicted_greedy"]["predicted_step_s"] > best_other * (1 + 1e-9):
        pct = (by["predicted_greedy"]["predicted_step_s"] / best_other - 1) * 100
        note("predicted_greedy's step above the best of the six (not claimed)", pct)
    # greedy sharders are order-insensitive (ties aside): a permutation leaves their steps alone
    perm = list(range(n))
    rng.shuffle(perm)
    ps = replace(spec, tables=tuple(spec.tables[p] for p in perm))
    pres = {r["name"]: r for r in select_sharder(ps, world, sharders=list(GREEDY), **kw)}  # type: ignore[arg-type]
    pcosts = {
        "size_greedy": [float(t.rows) for t in spec.tables],
        "lookup_greedy": [t.pooling * t.dim for t in spec.tables],
        "norm_lookup_greedy": [t.pooling / t.rows for t in spec.tables],
        "size_lookup_greedy": [
            t.pooling * t.dim * math.log10(t.rows) if t.rows > 1 else 0.0 for t in spec.tables
        ],
        "predicted_greedy": costs,
    }
    for name in GREEDY:
        if len(set(pcosts[name])) < n:  # a tie: the table order breaks it, by definition
            note(f"perm skipped for a cost tie ({name})")
            continue
        count("perm: greedy sharders order-insensitive")
        a, b = by[name]["assignment"], pres[name]["assignment"]
        if [a[p] for p in perm] != b or not close(
            by[name]["predicted_step_s"], pres[name]["predicted_step_s"], 1e-9
        ):
            bad(
                "perm: greedy sharders order-insensitive",
                f"{tag} {name}: {by[name]['predicted_step_s']} vs {pres[name]['predicted_step_s']}",
            )
    # uniform scaling of the cost variable leaves the plan alone
    scalings = [("L x2", lambda t: replace(t, pooling=t.pooling * 2), ("lookup_greedy", "norm_lookup_greedy", "size_lookup_greedy")),
                ("E x2", lambda t: replace(t, rows=t.rows * 2), ("size_greedy", "norm_lookup_greedy"))]  # fmt: skip
    if spec.interaction == "cat":
        scalings.append(
            ("D x2", lambda t: replace(t, dim=t.dim * 2), ("lookup_greedy", "size_lookup_greedy"))
        )
    for what, f, names in scalings:
        ss = replace(spec, tables=tuple(f(t) for t in spec.tables))
        for name in names:
            count("scale: cost-proportional scaling keeps the plan")
            if SHARDERS[name](ss, world) != by[name]["assignment"]:
                bad("scale: cost-proportional scaling keeps the plan", f"{tag} {name} {what}")
    # capacity: a returned plan respects it; an index sharder that raises does break it
    eb = dtype_bytes(spec.dtype)
    sizes = [t.rows * t.dim * eb for t in spec.tables]
    cap = rng.uniform(max(sizes), max(sizes) + sum(sizes) / world * 1.3)
    for name in SHARDERS:
        count("shard: capacity respected")
        try:
            a = SHARDERS[name](
                spec,
                world,
                seed=3,
                device=tg.coster.device,
                coster=tg.coster,
                tbe=tg.tbe,
                capacity_bytes=cap,
            )
        except ConfigError:
            if name in ("naive", "random"):
                a = SHARDERS[name](spec, world, seed=3)
                used = [
                    sum(s for s, r in zip(sizes, a, strict=True) if r == o) for o in range(world)
                ]
                if max(used) <= cap:
                    bad(
                        "shard: capacity respected",
                        f"{tag} {name} raised though {max(used)} <= {cap}",
                    )
            continue
        used = [sum(s for s, r in zip(sizes, a, strict=True) if r == o) for o in range(world)]
        if max(used) > cap:
            bad("shard: capacity respected", f"{tag} {name}: {max(used)} > {cap}")
    # a cap no rank can reach changes no plan; a subset of sharders gives the same entries
    for name in SHARDERS:
        count("shard: an unreachable cap changes nothing")
        capped = SHARDERS[name](spec, world, seed=3, device=tg.coster.device, coster=tg.coster, tbe=tg.tbe,
                                capacity_bytes=float(sum(sizes)))  # fmt: skip
        if capped != SHARDERS[name](
            spec, world, seed=3, device=tg.coster.device, coster=tg.coster, tbe=tg.tbe
        ):
            bad("shard: an unreachable cap changes nothing", f"{tag} {name}")
    sub = rng.sample(list(SHARDERS), 2)
    one_by_one = {r["name"]: r for r in select_sharder(spec, world, seed=seed0, sharders=sub, **kw)}  # type: ignore[arg-type]
    for name in sub:
        count("shard: a subset of sharders, the same entries")
        if one_by_one[name] != by[name]:
            bad("shard: a subset of sharders, the same entries", f"{tag} {name}")
    # identical tables: every greedy spreads them evenly
    same = replace(spec, tables=tuple(replace(spec.tables[0], name=f"s{k}") for k in range(n)))
    for name in GREEDY:
        count("shard: identical tables spread evenly")
        a = SHARDERS[name](same, world, device=tg.coster.device, coster=tg.coster, tbe=tg.tbe)
        per = [a.count(r) for r in range(world)]
        if max(per) - min(per) > 1:
            bad("shard: identical tables spread evenly", f"{tag} {name}: {per}")
    # world 1: one plan, one step for every sharder
    if spec.batch >= 1:
        one = select_sharder(spec, 1, **kw)  # type: ignore[arg-type]
        count("a2a: world 1, every sharder the same step")
        if len({r["predicted_step_s"] for r in one}) != 1 or any(
            set(r["assignment"]) != {0} for r in one
        ):
            bad(
                "a2a: world 1, every sharder the same step",
                f"{tag}: {[r['predicted_step_s'] for r in one]}",
            )


def check_cli(spec: DLRMSpec, world: int, device: str, cap_gb: float | None, tag: str) -> None:
    doc = {"batch": spec.batch, "bottom_mlp": list(spec.bottom_mlp), "top_mlp": list(spec.top_mlp),
           "dtype": spec.dtype, "interaction": spec.interaction,
           "tables": [{"name": t.name, "rows": t.rows, "dim": t.dim, "pooling": t.pooling,
                       **({"reuse": list(t.reuse)} if t.reuse else {})} for t in spec.tables]}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "spec.json"
        p.write_text(json.dumps(doc), encoding="utf-8")
        args = ["shard", str(p), "--world", str(world), "--device", device, "--format", "json"]
        if cap_gb is not None:
            args += ["--capacity-gb", repr(cap_gb)]
        r = subprocess.run([sys.executable, "-c", "from trainsim.cli.main import app_entry; app_entry()", *args],
                           capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    count("cli: shard --format json contract")
    if r.returncode != 0:
        if r.returncode == 1 and "no sharder is feasible" in r.stderr:
            return
        bad("cli: shard --format json contract", f"{tag}: exit {r.returncode} {r.stderr[-300:]}")
        return
    out = json.loads(r.stdout)
    top = {
        "world",
        "device",
        "comm",
        "tables",
        "batch",
        "capacity_gb",
        "capacity_source",
        "sharders",
        "best",
    }
    keys = {
        "name",
        "predicted_step_s",
        "assignment",
        "embedding_load_s",
        "imbalance",
        "provenance",
        "comm",
        "critical_path_s",
    }
    problems = []
    if not top <= set(out):
        problems.append(f"top keys missing {top - set(out)}")
    feas = [s for s in out["sharders"] if s.get("predicted_step_s") is not None]
    infeas = [s for s in out["sharders"] if s.get("predicted_step_s") is None]
    if out["sharders"] != feas + infeas:
        problems.append("infeasible not last")
    for s in feas:
        if not keys <= set(s):
            problems.append(f"{s.get('name')}: keys missing {keys - set(s)}")
    for s in infeas:
        if (
            not (keys | {"error"}) <= set(s)
            or any(s[k] is not None for k in keys - {"name"})
            or not s["error"]
        ):
            problems.append(f"{s.get('name')}: infeasible entry {s}")
    steps = [s["predicted_step_s"] for s in feas]
    if (
        steps != sorted(steps)
        or not feas
        or out["best"] != feas[0]["name"]
        or feas[0]["predicted_step_s"] != min(steps)
    ):
        problems.append(f"best {out['best']} not the minimum of {steps}")
    if (out["world"], out["tables"], out["batch"]) != (world, len(spec.tables), spec.batch):
        problems.append("echoed world/tables/batch")
    if sorted(s["name"] for s in out["sharders"]) != sorted(SHARDERS):
        problems.append("not every sharder listed once")
    if problems:
        bad("cli: shard --format json contract", f"{tag}: {'; '.join(problems)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--specs",
        type=int,
        default=30,
        help="random specs (each on a GPU, the CPU device, and calibrated)",
    )
    ap.add_argument("--kernels", type=int, default=1000, help="random embedding_bag kernel cases")
    ap.add_argument("--kernel-models", default=None,
                    help="a `trainsim fit` artifact of CPU_FULL's machine for the calibrated checks (default: the "
                         "one validate shard caches in ~/.cache/trainsim, when there; else skipped)")  # fmt: skip
    args = ap.parse_args()
    rng = random.Random(args.seed)
    t0 = time.time()

    def guarded(fn: object, *a: object) -> None:
        """A relation that raises (not a ConfigError of a bad input) is a violation too."""
        try:
            fn(*a)  # type: ignore[operator]
        except Exception as e:
            bad(
                "no crash on a valid spec",
                f"{fn.__name__}{tuple(str(x)[:80] for x in a[-1:])}: {e!r}",
            )  # type: ignore[attr-defined]

    for _ in range(args.kernels // 50):
        guarded(check_kernels, rng, 50)
    guarded(check_comm_curves)
    npz = args.kernel_models or next(
        iter(sorted(CACHE.glob(f"{CPU_FULL.name.removesuffix('.device.yaml')}-*.npz"))), None
    )
    targets = {g: Target(g) for g in GPUS}
    cpu = [Target(CPU_DEV), Target(CPU_DEV, tbe=True)]
    calibrated = Target(str(CPU_FULL), str(npz), tbe=True) if npz else None
    if calibrated is None:
        print(
            "no calibrated CPU kernel models (run `trainsim validate shard` once, or --kernel-models): skipped"
        )
    for s in range(args.specs):
        spec = sample_spec(rng)
        for tg in (targets[rng.choice(GPUS)], rng.choice(cpu), calibrated):
            if tg is None:
                continue
            worlds = (
                (1, 2, 3, 4, 8, 16, 26, 64) if tg.gpu else (1, 2, 3, 4, 8)
            )  # 26: padded to 4 full nodes
            world = rng.choice([w for w in worlds if w <= spec.batch])
            guarded(check_spec, spec, world, tg, rng, f"spec {s}")
            guarded(check_sharders, spec, max(world, 2), tg, rng, f"spec {s}")
        if s % 6 == 0:
            eb = dtype_bytes(spec.dtype)
            big = max(t.rows * t.dim * eb for t in spec.tables)
            cap = rng.choice((None, big * rng.uniform(1.0, 2.5) / 1e9))
            guarded(check_cli, spec, rng.choice((2, 4)), rng.choice(GPUS), cap, f"spec {s}")
    print(f"{sum(counts.values())} checks over {args.specs} specs and {args.kernels} kernel cases "
          f"in {time.time() - t0:.1f} s (seed {args.seed}; calibrated: {npz or 'skipped'}):")  # fmt: skip
    for k, v in sorted(counts.items()):
        print(f"  {v:6d}  {k}")
    for k, v in sorted(info.items()):
        most = f" (largest {worst[k]:.2f} %)" if k in worst else ""
        print(f"  info    {k}: {v}{most}")
    print(f"{len(violations)} violations")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
