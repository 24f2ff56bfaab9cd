"""Metamorphic / physics sweep over ``trainsim replay`` and its what-if passes on the shipped real
traces (shared/data/traces: the replay suite's cases, the 8-rank DLRM with its execution traces
linked; the shipped H100 captures for the resize what-ifs).

The simulator (docs/simulator.md, ``sim/engine.py``) is a max-plus system, not a list
scheduler: every lane runs its items in the traced order (CPU issue order, stream FIFO order by
measured start) and every time is a max over constraints plus a duration. It chooses no order,
so Graham's anomalies cannot occur: a shorter kernel or a faster network can only move times
earlier, on every rank. The relations below therefore hold exactly (up to float rounding);
none had to be narrowed for scheduling.

Relations (each counted; a violation prints one line with the case and the numbers):

- determinism: two simulations of one workload agree in every rank's figures and the path;
- trace mode reproduces the measured step and every rank's (docs: "in fact exactly");
- bounds per rank: each stream's kernels do not overlap and lie in the rank's step; a stream's
  busy time and the sum of its kernels' durations (a collective: its transfer) are <= the step;
  device busy, idle in [0, step]; exposed communication in [0, the union of comm kernels];
  collective wait >= 0; the workload step spans the earliest start to the latest end;
- critical path (global and per rank): segments contiguous, non-negative, covering exactly the
  step (their sum is the step), ``by_kind`` adds up to the step;
- identity what-ifs: network speedup 1, family scale 1 (each family present), straggler factor
  1 (each rank), resize to the traced batch: equal to the plain replay, in trace and stats host
  modes and, for the kernel what-ifs, with ``--kernels model`` too;
- monotone what-ifs (random settings, others fixed): a faster network, a smaller family factor,
  a smaller straggler factor, all kernels faster, a smaller fixed launch latency or kernel gap
  never lengthen the step nor any rank's step; zeroing every collective's transfer never does;
- one kernel shorter (random kernels, biased to the critical path; factor in [0, 1)) never
  lengthens any rank's step, one kernel longer never shortens it;
- translation: shifting every traced time by a constant leaves every figure unchanged;
- symmetry: a 1-rank trace duplicated as two identical ranks (or one rank representing two)
  gives both ranks the 1-rank replay's times;
- timeline (``write_timeline`` and once through the CLI): valid Chrome-trace JSON; events on
  each stream track do not overlap; the critical-path track spans exactly the predicted step;
  the latest kernel end minus the earliest step start is the predicted step; the CLI's JSON
  and the timeline's predicted step agree with the API's;
- resize (H100 captures): a larger batch never gives a shorter step.

Found on 2026-12-04 and fixed (tests/test_replay_metamorphic.py): 1. under ``--kernels model``
a what-if replaced each kernel's model time by its measured time × the factor, and a collective
instance took the longest such member (waiting for peers included) as its transfer: DLRM
``--network-speedup 1`` 20.25 → 27.98 ms, ``--network-speedup 2`` 23.61 ms, slower than no
what-if; now the factor scales the model's time. 2. in ``stats``/``shared`` host modes a resized
CPU-only op took its own measured CPU time × the ratio in place of its per-name mean, so a
resize to the traced batch moved the step (H100 LLaMA b1 +0.35 %, GPT-2 −0.014 %); now the
mean plus the predicted change. 3. a per-rank critical path stopped at a stream's first kernel
after the previous step's backlog, short of the rank's step (ResNet-50 V100 by 0.8 us, recsys
4 us), and the global path of a one-rank job called that gap ``rank_start``.

Narrowed (documented behaviour, docs/analysis.md): a rank's step starts when its CPU entered the
step and its device drained the previous one, so kernels on a stream without backlog may run
before the step start (recsys: from 0.428 s, its step from 0.587 s); they are checked against
the CPU's entry instead. The timeline is the plain replay's even with a what-if (documented in
docs/simulator.md), so the CLI check compares it with the JSON's baseline step.

    python scripts/metamorphic_replay.py [--seed S] [--samples N] [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from trainsim.ir.graph import Kernel, Op, RankGraph, SyncPoint, Workload
from trainsim.ir.kinds import KernelFamily
from trainsim.sim import HostMode, KernelSource, SimOptions, SimResult, simulate, whatif
from trainsim.sim.replay import load_for_replay
from trainsim.sim.timeline import write_timeline

REPO = Path(__file__).resolve().parents[1]
TRACES = Path(os.environ.get("TRAINSIM_TRACES", REPO.parent / "shared" / "data" / "traces"))
if not TRACES.exists():
    TRACES = Path("/work/shared/data/traces")
H100 = REPO / "src/trainsim/validate/data/gpu_e2e_h100.tar.xz"
REL, ABS = 1e-9, 1e-12  # float rounding: relative to the step, absolute seconds

violations: list[str] = []
counts: dict[str, int] = {}


def count(what: str, n: int = 1) -> None:
    counts[what] = counts.get(what, 0) + n


def bad(relation: str, detail: str) -> None:
    violations.append(f"{relation}: {detail}")
    print(f"VIOLATION {relation}: {detail}", flush=True)


def tol(*xs: float) -> float:
    return ABS + REL * max((abs(x) for x in xs), default=0.0)


def le(a: float, b: float, scale: float) -> bool:
    return a <= b + tol(scale)


def close(a: float, b: float, scale: float | None = None) -> bool:
    return abs(a - b) <= tol(scale if scale is not None else max(abs(a), abs(b)))


# ------------------------------------------------------------------------------------ cases


def load_cases(quick: bool) -> list[tuple[str, Workload]]:
    from trainsim.validate.replay_suite import CASES

    out = []
    for c in CASES:
        paths = [TRACES / p for p in c.paths]
        if not all(p.exists() for p in paths):
            print(f"skip {c.name}: missing", flush=True)
            continue
        got = load_for_replay(paths, link_et=False)
        if got.sampled or got.workload.measured_step_s is None:
            continue
        out.append((c.name, got.workload))
        if not quick and got.workload.ranks[0].metadata.get("step_from_marker"):  # another step too
            first = load_for_replay(paths, step="first", link_et=False).workload
            if first.ranks[0].metadata.get("step") != got.workload.ranks[0].metadata.get("step"):
                out.append((f"{c.name} (first step)", first))
    dlrm = TRACES / "param_dlrm_8xv100"
    if not quick and (dlrm / "dlrm_pytorch_et.tar.gz").exists():  # the Kineto+ET set, linked
        got = load_for_replay([dlrm / "dlrm_kineto.tar.gz", dlrm / "dlrm_pytorch_et.tar.gz"])
        out.append(("param_dlrm_8xv100+et", got.workload))
    return out


def res_equal(a: SimResult, b: SimResult) -> str | None:
    """None when two results agree in every figure (within rounding), else what differs."""
    if not close(a.predicted_step_s, b.predicted_step_s, a.predicted_step_s):
        return f"step {a.predicted_step_s!r} vs {b.predicted_step_s!r}"
    scale = a.predicted_step_s
    for ra, rb in zip(a.ranks, b.ranks, strict=True):
        for f in ("predicted_step_s", "device_busy_s", "exposed_comm_s", "collective_wait_s", "cpu_end_s"):
            x, y = getattr(ra, f), getattr(rb, f)
            if not close(x - (ra.start_s if f == "cpu_end_s" else 0.0), y - (rb.start_s if f == "cpu_end_s" else 0.0), scale):
                return f"rank {ra.rank} {f} {x!r} vs {y!r}"
        for sa, sb in zip(ra.streams, rb.streams, strict=True):
            if not close(sa.busy_s, sb.busy_s, scale):
                return f"rank {ra.rank} stream {sa.stream} busy {sa.busy_s!r} vs {sb.busy_s!r}"
    ka, kb = a.critical_path_by_kind(), b.critical_path_by_kind()
    for k in ka:
        if not close(ka[k], kb[k], scale):
            return f"critical path {k} {ka[k]!r} vs {kb[k]!r}"
    return None


def rank_steps(res: SimResult) -> dict[int, float]:
    return {r.rank: r.predicted_step_s for r in res.ranks}


def not_longer(rel: str, case: str, what: str, fast: SimResult, slow: SimResult) -> None:
    """``fast`` (the faster setting) has no rank, nor the step, longer than ``slow``."""
    count(rel)
    s = slow.predicted_step_s
    if not le(fast.predicted_step_s, s, s):
        bad(rel, f"{case} {what}: step {fast.predicted_step_s * 1e3:.6f} ms > {s * 1e3:.6f} ms")
        return
    sf, ss = rank_steps(fast), rank_steps(slow)
    for r, v in sf.items():
        if r in ss and not le(v, ss[r], s):
            bad(rel, f"{case} {what}: rank {r} step {v * 1e3:.6f} ms > {ss[r] * 1e3:.6f} ms")
            return


# ------------------------------------------------------------------------------- relations


def check_bounds(case: str, res: SimResult) -> None:
    """Per-rank physics of one result, and the path's consistency."""
    count("bounds")
    p, ev = res.program, res.evaluation
    step = res.predicted_step_s
    if not close(step, res.end_s - res.start_s, step):
        bad("bounds", f"{case}: step {step!r} != end - start")
    if not close(res.start_s, min(r.start_s for r in res.ranks), step) or not close(res.end_s, max(r.end_s for r in res.ranks), step):
        bad("bounds", f"{case}: the step does not span the earliest start to the latest end")
    for ri, (rp, rr) in enumerate(zip(p.ranks, res.ranks, strict=True)):
        t = ev.times[ri]
        rstep = rr.predicted_step_s
        where = f"{case} rank {rr.rank}"
        if not le(rstep, step, step) or rstep < -tol(step):
            bad("bounds", f"{where}: rank step {rstep!r} outside [0, step {step!r}]")
        for lane, ks in enumerate(rp.stream_lanes):
            prev_end = -math.inf
            for k in ks:
                s, e = t.k_start[k], t.k_end[k]
                if e < s - tol(step):
                    bad("bounds", f"{where}: kernel {rp.kernels[k].id} ends before it starts")
                if s < prev_end - tol(step):
                    bad("bounds", f"{where} stream {rp.lane_stream[lane]}: kernel {rp.kernels[k].id} starts "
                                  f"{(prev_end - s) * 1e6:.3f} us before its predecessor ends")  # fmt: skip
                    break
                # narrowed: a rank's step starts when its CPU entered it *and* the device drained
                # the previous step (docs/analysis.md), so a kernel on a stream without backlog may
                # run before it (recsys: from 0.428 s, the step from 0.587 s), not before the CPU
                lo = min(rp.cpu_start_s, rr.start_s)
                if s < lo - tol(step) or e > rr.end_s + tol(step):
                    bad("bounds", f"{where}: kernel {rp.kernels[k].id} [{s!r}, {e!r}] outside the rank's CPU "
                                  f"entry to its end [{lo!r}, {rr.end_s!r}]")  # fmt: skip
                    break
                prev_end = e
        for sr in rr.streams:
            if not le(sr.busy_s, rstep, step) or (not le(sr.kernel_sum_s, rstep, step) and not rr.cpu_only):
                bad("bounds", f"{where} stream {sr.stream}: busy {sr.busy_s!r} / kernel sum {sr.kernel_sum_s!r} "
                              f"> rank step {rstep!r}")  # fmt: skip
        comm = [k for k in range(len(rp.kernels)) if rp.kernels[k].family.is_communication]
        comm_union = _union([(t.k_start[k], t.k_end[k]) for k in comm])
        if not rr.cpu_only:
            if not (-tol(step) <= rr.device_busy_s <= rstep + tol(step)):
                bad("bounds", f"{where}: device busy {rr.device_busy_s!r} outside [0, {rstep!r}]")
            if rr.idle_s is None or not (-tol(step) <= rr.idle_s <= rstep + tol(step)):
                bad("bounds", f"{where}: idle {rr.idle_s!r} outside [0, {rstep!r}]")
            if max(sr.busy_s for sr in rr.streams) > rr.device_busy_s + tol(step):
                bad("bounds", f"{where}: a stream's busy time exceeds the device's")
        if not (-tol(step) <= rr.exposed_comm_s <= comm_union + tol(step)):
            bad("bounds", f"{where}: exposed comm {rr.exposed_comm_s!r} outside [0, comm union {comm_union!r}]")
        if rr.collective_wait_s < -tol(step):
            bad("bounds", f"{where}: negative collective wait {rr.collective_wait_s!r}")
    check_path(case, res.critical_path, res.start_s, res.end_s, step, which="global")
    for rr in res.ranks[:8]:
        check_path(case, res.critical_path_for(rr.rank), rr.start_s, rr.end_s, step, which=f"rank {rr.rank}")


def _union(iv: list[tuple[float, float]]) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(iv):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s  # type: ignore[operator]
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s  # type: ignore[operator]
    return total


def check_path(case: str, path: Any, start: float, end: float, scale: float, *, which: str) -> None:
    count("critical path")
    where = f"{case} ({which} path)"
    if not path:
        if end > start + tol(scale):
            bad("critical path", f"{where}: empty for a step of {end - start!r} s")
        return
    if not close(path[0].start_s, start, scale) or not close(path[-1].end_s, end, scale):
        bad("critical path", f"{where}: spans [{path[0].start_s!r}, {path[-1].end_s!r}], the step [{start!r}, {end!r}]")
    total = 0.0
    for a, b in itertools.pairwise(path):
        if not close(a.end_s, b.start_s, scale):
            bad("critical path", f"{where}: gap/overlap of {(b.start_s - a.end_s) * 1e6:.4f} us after {a.kind.value} {a.label[:50]}")
            break
    for s in path:
        if s.duration_s < -tol(scale):
            bad("critical path", f"{where}: negative segment {s}")
            break
        total += s.duration_s
    if not close(total, end - start, scale):
        bad("critical path", f"{where}: segments sum {total!r}, step {end - start!r}")


def check_timeline(case: str, res: SimResult, tmp: Path) -> None:
    count("timeline")
    f = tmp / "tl.json"
    write_timeline(res, f)
    doc = json.loads(f.read_text(encoding="utf-8"))
    evs = doc["traceEvents"]
    step_us = res.predicted_step_s * 1e6
    by_track: dict[tuple[int, int], list[tuple[float, float]]] = {}
    path_iv, kernel_end = [], -math.inf
    for e in evs:
        if e.get("ph") == "M":
            continue
        if e.get("ph") != "X" or not all(isinstance(e.get(k), int | float) for k in ("ts", "dur")) or e["dur"] < 0:
            bad("timeline", f"{case}: malformed event {str(e)[:120]}")
            return
        if not isinstance(e.get("pid"), int) or not isinstance(e.get("tid"), int):
            bad("timeline", f"{case}: event without integer pid/tid {str(e)[:120]}")
            return
        if e["cat"] in ("kernel", "collective_wait"):
            by_track.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
            kernel_end = max(kernel_end, e["ts"] + e["dur"])
        elif e["cat"] == "critical_path":
            path_iv.append((e["ts"], e["ts"] + e["dur"]))
    eps = 1e-6 * max(1.0, step_us) + 1e-3  # microsecond floats of epoch-sized times
    for (pid, tid), iv in by_track.items():
        iv.sort()
        for (_, e0), (s1, _) in itertools.pairwise(iv):
            if s1 < e0 - eps:
                bad("timeline", f"{case}: rank {pid} track {tid}: events overlap by {e0 - s1:.4f} us")
                break
    if path_iv:
        lo, hi = min(s for s, _ in path_iv), max(e for _, e in path_iv)
        if abs((hi - lo) - step_us) > eps:
            bad("timeline", f"{case}: critical-path track spans {hi - lo:.4f} us, step {step_us:.4f} us")
    if not all(r.cpu_only for r in res.ranks):
        first = res.start_s * 1e6
        if abs(kernel_end - first - step_us) > eps:
            bad("timeline", f"{case}: kernels end {kernel_end - first:.4f} us after the step start; step {step_us:.4f} us")
    if not close(doc["otherData"]["predicted_step_s"], res.predicted_step_s):
        bad("timeline", f"{case}: otherData.predicted_step_s differs")


def shift(w: Workload, d: float) -> Workload:
    """Every traced time moved by ``d`` seconds."""

    def t(x: float | None) -> float | None:
        return None if x is None else x + d

    def k_(k: Kernel) -> Kernel:
        return replace(k, start_s=t(k.start_s), launch_start_s=t(k.launch_start_s))

    def s_(s: SyncPoint) -> SyncPoint:
        return replace(s, start_s=t(s.start_s))

    def o_(o: Op) -> Op:
        return replace(o, start_s=t(o.start_s), kernels=tuple(map(k_, o.kernels)), syncs=tuple(map(s_, o.syncs)))

    def r_(r: RankGraph) -> RankGraph:
        md = dict(r.metadata)
        if md.get("cpu_step_start_s") is not None:
            md["cpu_step_start_s"] = md["cpu_step_start_s"] + d
        if md.get("stream_busy_until_s"):
            md["stream_busy_until_s"] = {s: v + d for s, v in md["stream_busy_until_s"].items()}
        return replace(r, ops=tuple(map(o_, r.ops)), step_start_s=t(r.step_start_s), step_end_s=t(r.step_end_s), metadata=md)

    return replace(w, ranks=tuple(map(r_, w.ranks)))


def one_kernel(w: Workload, rank: int, kid: int, factor: float) -> Workload:
    """Kernel ``kid`` of ``rank`` ``factor`` × as long (0: zero), as a what-if pass sets it."""

    def k_(k: Kernel) -> Kernel:
        if k.id != kid:
            return k
        base = k.predicted_s if k.predicted_s is not None else k.duration_s
        return replace(k, predicted_s=(base or 0.0) * factor, provenance=f"{whatif.WHATIF} ×{factor:g} of measured")

    ranks = tuple(
        replace(r, ops=tuple(replace(o, kernels=tuple(map(k_, o.kernels))) if any(k.id == kid for k in o.kernels) else o for o in r.ops))
        if r.rank == rank else r
        for r in w.ranks
    )  # fmt: skip
    return replace(w, ranks=ranks)


def zero_collectives(w: Workload) -> Workload:
    def k_(k: Kernel) -> Kernel:
        return replace(k, predicted_s=0.0, provenance=f"{whatif.WHATIF} ×0 of measured") if k.collective else k

    return replace(w, ranks=tuple(replace(r, ops=tuple(replace(o, kernels=tuple(map(k_, o.kernels))) for o in r.ops)) for r in w.ranks))


def all_kernels(w: Workload, factor: float) -> Workload:
    for fam in {k.family for r in w.ranks for k in r.kernels()}:
        w = whatif.scale_family(w, fam, factor)
    return w


def families(w: Workload) -> list[KernelFamily]:
    return sorted({k.family for r in w.ranks for k in r.kernels()}, key=lambda f: f.value)


def has_collectives(w: Workload) -> bool:
    return any(k.collective is not None for r in w.ranks for k in r.kernels())


def loguniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def check_case(case: str, w: Workload, rng: random.Random, samples: int, tmp: Path) -> None:
    big = sum(len(r.ops) for r in w.ranks) > 1500
    n = max(2, samples // (2 if big else 1))
    modes = (HostMode.TRACE, HostMode.STATS)
    base: dict[HostMode, SimResult] = {}
    for mode in modes:
        o = SimOptions(overheads=mode)
        a, b = simulate(w, o), simulate(w, o)
        base[mode] = a
        count("determinism")
        if (d := res_equal(a, b)) is not None or [s.to_dict() for s in a.critical_path] != [s.to_dict() for s in b.critical_path]:
            bad("determinism", f"{case} {mode.value}: {d or 'critical paths differ'}")
        check_bounds(f"{case} {mode.value}", a)
    tr = base[HostMode.TRACE]
    count("trace reproduces")
    m = w.measured_step_s
    if m is not None and not close(tr.predicted_step_s, m, m):
        bad("trace reproduces", f"{case}: trace step {tr.predicted_step_s * 1e3:.6f} ms, measured {m * 1e3:.6f} ms")
    for rr in tr.ranks:
        if rr.measured_step_s is not None and not close(rr.predicted_step_s, rr.measured_step_s, m):
            bad("trace reproduces", f"{case} rank {rr.rank}: {rr.predicted_step_s * 1e3:.6f} vs {rr.measured_step_s * 1e3:.6f} ms")
    check_timeline(case, base[HostMode.STATS], tmp)
    fams = families(w)
    comm = has_collectives(w)
    ranks = [r.rank for r in w.ranks]

    # identity what-ifs (every kernel source; the model mode with stats host gaps)
    model = SimOptions(kernels=KernelSource.MODEL)
    base_model = simulate(w, model)
    check_bounds(f"{case} model", base_model)
    for label, opts, ref in [(m_.value, SimOptions(overheads=m_), base[m_]) for m_ in modes] + [("model", model, base_model)]:
        idents = [("network ×1", whatif.faster_network(w, 1.0))] if comm else []
        idents += [(f"{f.value} ×1", whatif.scale_family(w, f, 1.0)) for f in rng.sample(fams, min(len(fams), 3))]
        idents += [(f"straggler {r}:1", whatif.straggler(w, r, 1.0)) for r in rng.sample(ranks, min(len(ranks), 2))]
        for what, w2 in idents:
            count("identity what-if")
            if (d := res_equal(simulate(w2, opts), ref)) is not None:
                bad("identity what-if", f"{case} {label} {what}: {d}")

    # monotone knobs, others fixed
    for mode in modes:
        opts, ref = SimOptions(overheads=mode), base[mode]
        if comm:
            xs = sorted(loguniform(rng, 0.2, 10.0) for _ in range(3))
            rs = [simulate(whatif.faster_network(w, x), opts) for x in xs]
            for (x0, r0), (x1, r1) in zip(zip(xs, rs, strict=True), zip(xs[1:], rs[1:], strict=True), strict=False):
                not_longer("monotone network", case, f"{mode.value} speedup {x1:.3g} vs {x0:.3g}", r1, r0)
            not_longer("zero comm", case, f"{mode.value} every transfer 0", simulate(zero_collectives(w), opts), ref)
        for fam in rng.sample(fams, min(len(fams), 2)):
            fs = sorted(loguniform(rng, 0.05, 4.0) for _ in range(3))
            rs = [simulate(whatif.scale_family(w, fam, f), opts) for f in fs]
            for i in range(len(fs) - 1):
                not_longer("monotone family", case, f"{mode.value} {fam.value} ×{fs[i]:.3g} vs ×{fs[i + 1]:.3g}", rs[i], rs[i + 1])
        r = rng.choice(ranks)
        fs = sorted(loguniform(rng, 0.3, 5.0) for _ in range(2))
        rs = [simulate(whatif.straggler(w, r, f), opts) for f in fs]
        not_longer("monotone straggler", case, f"{mode.value} rank {r} ×{fs[0]:.3g} vs ×{fs[1]:.3g}", rs[0], rs[1])
        f = loguniform(rng, 0.1, 0.99)
        fast = simulate(all_kernels(w, f), opts)
        not_longer("faster device", case, f"{mode.value} all kernels ×{f:.3g}", fast, ref)
        check_bounds(f"{case} {mode.value} all kernels ×{f:.3g}", fast)
        check_bounds(f"{case} {mode.value} straggler {r} ×{fs[1]:.3g}", rs[1])
    if comm:
        xs = sorted(loguniform(rng, 0.3, 8.0) for _ in range(2))
        r0, r1 = (simulate(whatif.faster_network(w, x), model) for x in xs)
        not_longer("monotone network", case, f"model speedup {xs[1]:.3g} vs {xs[0]:.3g}", r1, r0)
        if xs[1] >= 1:
            not_longer("monotone network", case, f"model speedup {xs[1]:.3g} vs none", r1, base_model)
    for knob in ("launch_latency_s", "kernel_gap_s"):
        vs = sorted(rng.uniform(0.0, 2e-5) for _ in range(2))
        r0, r1 = (simulate(w, SimOptions(launch_latency_s=v) if knob == "launch_latency_s" else SimOptions(kernel_gap_s=v)) for v in vs)
        not_longer(f"monotone {knob}", case, f"stats {vs[0] * 1e6:.2f} vs {vs[1] * 1e6:.2f} us", r0, r1)

    # one kernel shorter / longer, biased to kernels on the critical path
    on_path = {(s.rank, s.label) for s in base[HostMode.STATS].critical_path if s.kind.value == "kernel"}
    pool = [(r.rank, k) for r in w.ranks for k in r.kernels() if k.duration_s]
    hot = [(r, k) for r, k in pool if (r, k.name) in on_path] or pool
    for i in range(n):
        mode = modes[i % 2]
        r, k = rng.choice(hot if i % 3 else pool)
        u = 0.0 if i % 4 == 0 else rng.random()
        ref = base[mode]
        not_longer("one kernel shorter", case, f"{mode.value} rank {r} kernel {k.id} {k.name[:40]} ×{u:.3g}",
                   simulate(one_kernel(w, r, k.id, u), SimOptions(overheads=mode)), ref)  # fmt: skip
        up = 1.0 + loguniform(rng, 0.01, 10.0)
        not_longer("one kernel longer", case, f"{mode.value} rank {r} kernel {k.id} {k.name[:40]} ×{up:.3g}",
                   ref, simulate(one_kernel(w, r, k.id, up), SimOptions(overheads=mode)))  # fmt: skip

    # translation invariance
    dt = rng.choice((1.0, -0.25, 3.5)) * 1e-3
    for mode in modes:
        count("translation")
        got = simulate(shift(w, dt), SimOptions(overheads=mode))
        ref = base[mode]
        # rounding grows with the absolute times (epoch offsets of seconds, thousands of items)
        if not close(got.predicted_step_s, ref.predicted_step_s, 1e3 * max(abs(ref.end_s), ref.predicted_step_s)):
            bad("translation", f"{case} {mode.value} shifted {dt * 1e3:g} ms: step {got.predicted_step_s!r} vs {ref.predicted_step_s!r}")


def check_symmetry(case: str, w: Workload) -> None:
    """A 1-rank trace as two identical ranks, and as one rank representing two."""
    if len(w.ranks) != 1:
        return
    g = w.ranks[0]
    twin = replace(g, rank=g.rank + 1 if g.rank + 1 not in _group_ranks(g) else max(_group_ranks(g)) + 1)
    if _group_ranks(g):  # its collectives name their members: the twin must be one of them
        twin = replace(g, rank=next(r for r in sorted(_group_ranks(g)) if r != g.rank))
    pair = replace(w, ranks=(g, twin))
    rep = replace(w, ranks=(replace(g, represents=2),))
    for mode in (HostMode.TRACE, HostMode.STATS):
        opts = SimOptions(overheads=mode)
        one = simulate(w, opts)
        two = simulate(pair, opts)
        count("symmetry")
        a, b = two.ranks
        if not close(a.predicted_step_s, b.predicted_step_s, one.predicted_step_s) or not close(a.predicted_step_s, one.predicted_step_s):
            bad("symmetry", f"{case} {mode.value}: twins {a.predicted_step_s!r} / {b.predicted_step_s!r}, alone {one.predicted_step_s!r}")
        for ra, rb in ((a, b), (one.ranks[0], a)):
            for f in ("device_busy_s", "exposed_comm_s", "collective_wait_s"):
                if not close(getattr(ra, f), getattr(rb, f), one.predicted_step_s):
                    bad("symmetry", f"{case} {mode.value}: {f} {getattr(ra, f)!r} vs {getattr(rb, f)!r}")
        count("symmetry")
        if (d := res_equal(simulate(rep, opts), one)) is not None:
            bad("symmetry", f"{case} {mode.value} represents=2: {d}")


def _group_ranks(g: RankGraph) -> set[int]:
    return {r for k in g.kernels() if k.collective for r in k.collective.group_ranks}


def check_resize(rng: random.Random, tmp: Path) -> None:
    """Resize to the traced size is the plain replay; a larger batch (sequence, width) never
    gives a shorter step: the resize's ratios are clamped to [1, work] when growing (resize.py)."""
    import re

    from trainsim.cli.replay_cmd import _manifest, _manifest_batch, _resize_timer
    from trainsim.sim.resize import resize_batch, resize_hidden, resize_seq

    if not H100.exists():
        return
    with tarfile.open(H100) as tf:
        tf.extractall(tmp, filter="data")
    caps = sorted((tmp / "captures").iterdir())
    picked = rng.sample(caps, min(3, len(caps)))
    picked += [c for c in caps if c.name in ("llama_b1_t1_s5_r0", "llama_b2_t1_s5_r0") and c not in picked]
    for cap in picked:
        w = load_for_replay([cap]).workload
        b = _manifest_batch([cap])
        assert b is not None
        timer, _ = _resize_timer(w)
        passes: list[tuple[str, int, Any]] = [("batch", b, _batch(resize_batch, b, timer))]
        m = re.search(r"seq (\d+)", str(_manifest([cap]).get("summary", "")))
        if cap.name.startswith("llama") and m and b > 1:  # the capture.json predates its seq_len field
            s0 = int(m.group(1))
            passes.append(("seq", s0, _seq(resize_seq, s0, b, timer)))
        if cap.name.startswith("llama") and b == 1:  # hidden: tokens per step (2048) != the width (4096)
            heads = rng.random() < 0.5
            passes.append(("hidden", 4096, _hidden(resize_hidden, timer, heads)))
        for dim, n0, rz in passes:
            for mode in (HostMode.TRACE, HostMode.STATS):
                opts = SimOptions(overheads=mode)
                ref = simulate(w, opts)
                count("identity what-if")
                if (d := res_equal(simulate(rz(w, n0), opts), ref)) is not None:
                    bad("identity what-if", f"{cap.name} {mode.value} {dim} {n0} → {n0}: {d}")
                step = 512 if dim == "hidden" else 1
                sizes = sorted({max(step, round(n0 * loguniform(rng, 0.25, 4.0) / step) * step) for _ in range(3)} | {n0})
                rs = [ref if n == n0 else simulate(rz(w, n), opts) for n in sizes]
                for i in range(len(sizes) - 1):
                    not_longer(f"monotone {dim}", cap.name, f"{mode.value} {dim} {sizes[i]} vs {sizes[i + 1]}", rs[i], rs[i + 1])
                check_bounds(f"{cap.name} {mode.value} {dim} {sizes[-1]}", rs[-1])


def _batch(rz: Any, old: int, timer: Any) -> Any:
    return lambda w, n: rz(w, n, old_batch=old, timer=timer)


def _seq(rz: Any, old: int, batch: int, timer: Any) -> Any:
    return lambda w, n: rz(w, n, old_seq=old, batch=batch, timer=timer)


def _hidden(rz: Any, timer: Any, heads: bool) -> Any:
    return lambda w, n: rz(w, n, old_hidden=4096, timer=timer, scale_heads=heads)


def check_cli(tmp: Path) -> None:
    """The CLI's JSON and timeline against the API (one subprocess)."""
    dlrm = TRACES / "param_dlrm_8xv100" / "dlrm_kineto.tar.gz"
    if not dlrm.exists():
        return
    tl = tmp / "cli_tl.json"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    out = subprocess.run([sys.executable, "-m", "trainsim", "replay", str(dlrm), "--no-et", "--format", "json",
                          "--network-speedup", "2", "--timeline", str(tl)],
                         capture_output=True, text=True, env=env, check=False)  # fmt: skip
    count("cli")
    if out.returncode != 0:
        bad("cli", f"replay exited {out.returncode}: {out.stderr[-300:]}")
        return
    doc = json.loads(out.stdout)
    w = load_for_replay([dlrm], link_et=False).workload
    api = simulate(w, SimOptions())
    if not close(doc["predicted_step_s"], api.predicted_step_s):
        bad("cli", f"JSON step {doc['predicted_step_s']!r}, API {api.predicted_step_s!r}")
    fast = simulate(whatif.faster_network(w, 2.0), SimOptions())
    if not close(doc["whatif"]["predicted_step_s"], fast.predicted_step_s):
        bad("cli", f"JSON what-if step {doc['whatif']['predicted_step_s']!r}, API {fast.predicted_step_s!r}")
    tdoc = json.loads(tl.read_text(encoding="utf-8"))
    if not close(tdoc["otherData"]["predicted_step_s"], doc["predicted_step_s"]):
        bad("cli", "the timeline's predicted step is not the JSON's (it is the baseline's: docs/simulator.md)")
    idle = [r["idle_s"] for r in doc["ranks"]]
    if any(i is None or i < 0 for i in idle):
        bad("cli", f"idle {idle}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--samples", type=int, default=8, help="single-kernel samples per case")
    ap.add_argument("--quick", action="store_true", help="the replay suite's cases only, no CLI, no resize")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    cases = load_cases(args.quick)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name, w in cases:
            t = time.perf_counter()
            check_case(name, w, rng, args.samples, tmp)
            check_symmetry(name, w)
            print(f"  {name}: {time.perf_counter() - t:.1f} s", flush=True)
        if not args.quick:
            check_resize(rng, tmp)
            check_cli(tmp)
    total = sum(counts.values())
    print(f"{len(cases)} cases, {total} checks in {time.perf_counter() - t0:.0f} s (seed {args.seed}):")
    for k, v in sorted(counts.items()):
        print(f"  {k}: {v}")
    print(f"{len(violations)} violation(s)")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
