"""The ``shard`` validation suite: choosing an embedding sharder by predicted step time, checked
against real sharded DLRM steps on this host (000 §V-A, Table IV; CPU stand-in).

For each of ``sets`` random table sets (000 §IV-B1: (0.7–1.3) × world × 13 tables, drawn by
:func:`trainsim.builders.dlrm.random_tables`; heavy tables only by default, as 000's sharding
experiment picks its heavy tasks so that lookups dominate), every sharder of
:data:`trainsim.search.sharders.SHARDERS` assigns the tables to ``world`` ranks, then

* **predicted**: :func:`trainsim.search.sharders.select_sharder`'s simulated step on the CPU
  device measured by ``trainsim bench`` on this machine (``bench/data/cpu_full_*.device.yaml``)
  with kernel models fitted on its calibration sample (``kernel_models="auto"``: fitted once,
  cached next to the results) or the device's spec-based models (``kernel_models=None``);
  every case reports the kernels' provenance;
* **measured**: :func:`trainsim.bench.dlrm_shard.measure_assignments`, a table-wise sharded DLRM
  on ``world`` gloo ranks (fbgemm's CPU TBE, one thread per rank), ``repeats`` blocks per
  sharder of ``steps`` clean timed steps each (steps during which another process took a
  rank's core are flagged and timed again, up to ``max_steps``), blocks of all sharders
  interleaved in a random order per repeat (machine noise is shared rather than pinned on one
  sharder). Sharders that give the same assignment share one measurement. A sharder's measured
  step is the median of its clean steps (``all_steps_measured_s``: of every step).

Per set (one case): the predicted choice (fastest predicted), the measured fastest, the regret
(measured time of the choice over the fastest, − 1: 000 Table IV's "abs error"), success (000's
criterion: the choice is the fastest or within 10 %), Spearman's ρ between predicted and
measured times over the sharders, the per-sharder prediction errors, and the noise: each
sharder's repeat-to-repeat spread ((max − min) / median of its repeat medians, over the
repeats with clean steps; None, shown "—", with fewer than 2 such repeats, e.g. ``repeats=1``:
there is no spread to measure; the set's ``noise_pct`` is their median) and
``success_per_repeat`` (the criterion re-evaluated on each repeat's times alone). A set where
some sharder has fewer than :data:`MIN_CLEAN_FRACTION` of its timed steps clean is
``contended`` and says so in its ``warnings`` (and the summary's). The summary gives the
success rate, regret (mean, median, max), median ρ, the error of every (set, sharder)
prediction (median / MAPE / max), and, as a baseline, how often always choosing one fixed
sharder would have met the criterion.

Measurements are appended, one JSON line per (set, sharder), a set's lines in a single ``write``
+ ``fsync``, to ``resume`` (default ``~/.cache/trainsim/shard_suite.jsonl``). A set's rows are
written once all of its assignments' interleaved repeats are measured (one ``measure_assignments``
call), so an interrupted set is lost and measured again on resume (a write the process was killed
in, which kept some of the set's rows, reads as none: ``write_id``/``write_rows``) (on Ctrl-C the suite says how many
sets the file holds). A row is reused when its set key (the tables, batch, MLPs and measurement
settings) and its assignment match; so a rerun measures nothing twice (a torn last line is cut
off). The summary counts this run's rows by origin: ``rows_measured_now``, ``rows_from_file``
(read back from ``resume``) and ``rows_copied_identical`` (copied from a row already in the
file for another sharder's identical assignment; identical assignments measured in this run
share one measurement and count as measured now; ``rows_reused`` is the same count as
``rows_copied_identical``, kept for older readers). Predictions are
recomputed on every run (they take seconds).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import random
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from trainsim.bench.samples import BENCH_DATA, fit_digest, sample_files, shipped_models
from trainsim.errors import ConfigError

SCHEMA = "trainsim.shard-suite/1"
CRITERION = 0.10  # 000 §V-A: chosen sharder within 10 % of the fastest
TABLES_PER_RANK = 13  # 000 §IV-B1: (0.7 ~ 1.3) x #GPU x 13 tables
# Below this share of clean timed steps a sharder's time is mostly of steps on which another
# process took a rank's core: the set's choice is checked against contended times, so it is
# flagged (``warnings``) rather than silently counted as a clean success or failure.
MIN_CLEAN_FRACTION = 0.5
_BENCH_DATA = BENCH_DATA
# The shipped 1-thread full calibration samples (bench/data, docs/benchmarks.md) by the CPU model
# their rows name, each with its FBGEMM TBE rows (fitted together): the host's own is used
# when it ships, else the first (the development machine the suites' figures come from).
CPU_SAMPLES: dict[str, tuple[str, str]] = {
    "Intel(R) Xeon(R) Processor": ("cpu_full_f97e94a9cbddf655", "cpu_tbe_f97e94a9cbddf655"),
    "AMD EPYC": ("cpu_full_97317d12607a0598", "cpu_tbe_97317d12607a0598"),
}
CPU_SAMPLE, CPU_EXTRA = CPU_SAMPLES["Intel(R) Xeon(R) Processor"]


def default_results_path() -> Path:
    return Path.home() / ".cache" / "trainsim" / "shard_suite.jsonl"


def table_set(index: int, *, seed: int, world: int, heavy: bool, batch: int,
              bottom_mlp: Sequence[int], top_mlp: Sequence[int]) -> Any:  # fmt: skip
    """Set ``index``'s DLRM spec: (0.7–1.3) × world × 13 random tables (reproducible)."""
    from trainsim.builders.dlrm import DLRMSpec, random_tables

    s = seed * 7919 + index
    lo = round(0.7 * world * TABLES_PER_RANK)
    hi = round(1.3 * world * TABLES_PER_RANK)
    n = random.Random(s).randint(lo, hi)
    tables = random_tables(n, seed=s, heavy=heavy)
    return DLRMSpec(tables, batch=batch, bottom_mlp=tuple(bottom_mlp), top_mlp=tuple(top_mlp))


# --- the results file -------------------------------------------------------------------------


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Complete rows of a results file (a torn last line is skipped; foreign rows ignored)."""
    if not path.exists():
        return []
    raw = path.read_bytes()
    out = []
    for line in raw[: raw.rfind(b"\n") + 1].decode("utf-8").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line damaged by hand; never fatal, the row is re-measured
        if isinstance(row, dict) and row.get("schema") == SCHEMA:
            out.append(row)
    # a set's measured rows are written together, each naming its write (``write_id``) and how
    # many rows it holds: one that lost some of them (the process killed inside that write) is
    # measured again whole rather than completed by a measurement that was not interleaved
    # (a write_id or write_rows edited into another type reads as a damaged write: re-measured)
    held = Counter(r["write_id"] for r in out if isinstance(r.get("write_id"), str) and r["write_id"])

    def kept(r: dict[str, Any]) -> bool:
        wid, n = r.get("write_id"), r.get("write_rows")
        if not wid:  # not part of a set's write (older files, copied rows)
            return True
        return isinstance(wid, str) and isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= held[wid]

    return [r for r in out if kept(r)]


def _locked(path: Path) -> contextlib.AbstractContextManager[None]:
    from trainsim.bench.dataset import locked

    return locked(path, "another shard suite is writing these results; wait for it or give another resume path")


def _assign_key(a: Sequence[int]) -> str:
    return ",".join(str(r) for r in a)


# --- predictions -------------------------------------------------------------------------------


def cpu_sample() -> tuple[str, str, bool]:
    """(calibration sample, its TBE sample, whether they were measured on this host's CPU model)."""
    from trainsim.bench.comm import _cpu_model

    mine = CPU_SAMPLES.get(_cpu_model())
    return (*mine, True) if mine else (CPU_SAMPLE, CPU_EXTRA, False)


def cpu_device_file() -> Path:
    return _BENCH_DATA / f"{cpu_sample()[0]}.device.yaml"


def cpu_kernel_models(cache_dir: Path, log: Callable[[str], None] | None = None) -> tuple[Path | None, str]:
    """Kernel models fitted on the shipped CPU calibration sample (cached), and a note."""
    sample, extra, here = cpu_sample()
    return sample_kernel_models(cache_dir, (sample, extra), cpu_device_file(),
                                "" if here else " (another CPU model than this host's)", log=log)  # fmt: skip


def sample_kernel_models(cache_dir: Path, names: Sequence[str], device_file: Path, note: str = "",
                         log: Callable[[str], None] | None = None) -> tuple[Path | None, str]:  # fmt: skip
    """Kernel models fitted on shipped calibration samples ``names`` (``bench/data/NAME.jsonl*``)
    measured on ``device_file``'s device, cached in ``cache_dir`` by the samples' content and
    :data:`trainsim.bench.samples.FIT_REVISION`; and a provenance note. ``log`` hears of a fit
    before it starts (it takes 1-2 minutes on 2 cores, once per cache)."""
    samples = sample_files(names)
    used = " + ".join(p.name for p in samples) + note
    digest = fit_digest(names)
    shipped = shipped_models(names)  # fitted once and shipped, while data and fitting still match
    if shipped is not None:
        return shipped, f"calibrated: trainsim fit on {used} (shipped {shipped.name})"
    out = cache_dir / f"{names[0]}-{digest}.npz"
    if out.exists():
        return out, f"calibrated: trainsim fit on {used} (cached {out.name})"
    try:
        from trainsim.bench.opspecs import register_bench_ops
        from trainsim.hardware import get_device
        from trainsim.kernels import fit_kernels, read_kernel_dataset, save_model

        if log is not None:
            log(f"fitting kernel models on {used} (first run only, 1-4 min; cached as {out})")
        register_bench_ops()
        ds = read_kernel_dataset(samples)
        result = fit_kernels(ds, device=get_device(str(device_file)), n_jobs=1)
        if result.model is None:
            return None, "spec-based: the calibration sample fitted no model"
        cache_dir.mkdir(parents=True, exist_ok=True)
        save_model(result.model, out)
    except ImportError as e:  # the learned extra (xgboost, lightgbm, scikit-learn) is missing
        return None, f"spec-based: cannot fit the calibration sample ({e}); pip install trainsim[learned]"
    return out, f"calibrated: trainsim fit on {used} (fitted now, cached {out.name})"


def _predict(
    spec: Any, world: int, names: Sequence[str], kernel_models: Path | None, seed: int, *, tbe: bool
) -> dict[str, dict[str, Any]]:
    """Every sharder's predicted step; ``tbe``: the runs use FBGEMM's TBE (fused update)."""
    from trainsim.search.sharders import select_sharder

    rows = select_sharder(spec, world, device=str(cpu_device_file()), kernel_models=kernel_models,
                          sharders=list(names), seed=seed, tbe=tbe)  # fmt: skip
    return {r["name"]: r for r in rows}


# --- statistics ----------------------------------------------------------------------------------


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's ρ (average ranks for ties); None when either side is constant or n < 2."""

    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    if len(x) < 2:
        return None
    rx, ry = ranks(x), ranks(y)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else None


def _choice(times: dict[str, float]) -> str:
    """The fastest name (ties: the first in the dict's order)."""
    return min(times, key=lambda k: times[k])


def _regret(chosen: str, measured: dict[str, float]) -> float:
    best = min(measured.values())
    return (measured[chosen] - best) / best


def _row_spread(row: dict[str, Any]) -> float | None:
    """A row's repeat-to-repeat spread, recomputed from its samples when it has them: rows
    written before :func:`~trainsim.bench.dlrm_shard.repeat_spread_pct` returned None for a
    single repeat stored 0.0 there, which read as a noiseless measurement."""
    if "repeat_steps" in row and "repeat_medians_s" in row:
        from trainsim.bench.dlrm_shard import repeat_spread_pct

        clean = row.get("clean") or []
        return repeat_spread_pct(row["repeat_medians_s"], row["repeat_steps"], clean)
    v = row.get("spread_pct")
    return None if v is None else float(v)


def _clean_warning(index: int, rows: dict[str, dict[str, Any]], names: Sequence[str]) -> str | None:
    """A line when some sharder's share of clean steps is below :data:`MIN_CLEAN_FRACTION`."""
    low = {n: float(rows[n]["clean_fraction"]) for n in names
           if rows[n].get("clean_fraction") is not None
           and float(rows[n]["clean_fraction"]) < MIN_CLEAN_FRACTION}  # fmt: skip
    if not low:
        return None
    which = ", ".join(f"{n} {100 * f:.0f} %" for n, f in low.items())
    return (f"set {index}: contended measurement: clean timed steps below {100 * MIN_CLEAN_FRACTION:.0f} % "
            f"({which}); another process shared a rank's core, so these times (and this set's "
            "success) are not clean figures")  # fmt: skip


def _case(index: int, spec: Any, sharders: dict[str, dict[str, Any]], rows: dict[str, dict[str, Any]],
          pred_note: str) -> dict[str, Any]:  # fmt: skip
    names = [n for n in sharders if n in rows and sharders[n].get("predicted_step_s") is not None]
    spread = {n: _row_spread(row) for n, row in rows.items()}
    measured = {n: float(rows[n]["median_s"]) for n in names}
    predicted = {n: float(sharders[n]["predicted_step_s"]) for n in names}
    per: list[dict[str, Any]] = []
    for n, p in sharders.items():
        row = rows.get(n)
        m = float(row["median_s"]) if row else None
        pr = p.get("predicted_step_s")
        per.append({"sharder": n, "predicted_s": pr, "measured_s": m,
                    "err_pct": (pr - m) / m * 100 if pr is not None and m else None,
                    "spread_pct": spread.get(n),
                    "clean_fraction": row.get("clean_fraction") if row else None,
                    "all_steps_measured_s": row.get("all_median_s") if row else None,
                    "repeat_medians_s": row.get("repeat_medians_s") if row else None,
                    "assignment": p.get("assignment"), "tables_per_rank": _counts(p.get("assignment")),
                    "imbalance_predicted": p.get("imbalance"),
                    "per_rank_measured": row.get("per_rank") if row else None,
                    "error": p.get("error")})  # fmt: skip
    case: dict[str, Any] = {"case": f"set {index}", "tables": len(spec.tables)}
    if len(names) < 2:
        case.update(status="incomplete", reason="fewer than 2 sharders both predicted and measured",
                    sharders=per)  # fmt: skip
        return case
    chosen, fastest = _choice(predicted), _choice(measured)
    regret = _regret(chosen, measured)
    errs: list[float] = [e["err_pct"] for e in per if e["err_pct"] is not None]
    spreads = [v for n in names if (v := spread[n]) is not None]
    warn = _clean_warning(index, rows, names)
    reps = min(len(rows[n]["repeat_medians_s"]) for n in names)
    per_rep = [
        _regret(chosen, {n: rows[n]["repeat_medians_s"][k] for n in names}) <= CRITERION
        for k in range(reps)
    ]
    ordered = sorted(measured.values())
    case.update({
        "predicted": chosen, "fastest": fastest, "regret_pct": regret * 100,
        "success": regret <= CRITERION, "spearman": spearman([predicted[n] for n in names], [measured[n] for n in names]),
        "noise_pct": statistics.median(spreads) if spreads else None,
        "abs_err_pct": statistics.median(abs(e) for e in errs) if errs else None,
        "status": "ok",
        "predicted_choice_s": predicted[chosen], "measured_choice_s": measured[chosen],
        "measured_fastest_s": measured[fastest],
        "measured_range_pct": (ordered[-1] - ordered[0]) / ordered[0] * 100,
        "runner_up_gap_pct": (ordered[1] - ordered[0]) / ordered[0] * 100,
        "all_within_criterion": ordered[-1] <= ordered[0] * (1 + CRITERION),
        "success_per_repeat": sum(per_rep) / len(per_rep),
        "max_spread_pct": max(spreads) if spreads else None,
        "clean_fraction": statistics.fmean(rows[n].get("clean_fraction", 1.0) for n in names),
        "contended": warn is not None, "warnings": [warn] if warn else [],
        "batch": spec.batch, "prediction": pred_note, "sharders": per,
    })  # fmt: skip
    return case


def _counts(a: Sequence[int] | None) -> list[int] | None:
    if a is None:
        return None
    world = max(a) + 1 if a else 0
    return [sum(1 for r in a if r == q) for q in range(world)]


def _summary(cases: list[dict[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    from trainsim.validate.registry import error_summary

    ok = [c for c in cases if c.get("status") == "ok"]
    errs = [e["err_pct"] for c in ok for e in c["sharders"] if e["err_pct"] is not None]
    out: dict[str, Any] = {
        **error_summary(errs),
        "predictions": len(errs),
        "sets": len(cases),
        "sets_ok": len(ok),
        "warnings": [],
    }
    if not ok:
        return out
    regrets = [c["regret_pct"] for c in ok]
    noise = [c["max_spread_pct"] for c in ok if c.get("max_spread_pct") is not None]
    contended = [c["case"] for c in ok if c.get("contended")]
    rhos = [c["spearman"] for c in ok if c["spearman"] is not None]
    out.update({
        "success_rate": sum(c["success"] for c in ok) / len(ok),
        "success_target": 0.90, "paper_success_rate": 0.85,
        "exact_choice_rate": sum(c["predicted"] == c["fastest"] for c in ok) / len(ok),
        "mean_regret_pct": statistics.fmean(regrets), "median_regret_pct": statistics.median(regrets),
        "max_regret_pct": max(regrets),
        "median_spearman": statistics.median(rhos) if rhos else None,
        "min_spearman": min(rhos) if rhos else None,
        "success_per_repeat_mean": statistics.fmean(c["success_per_repeat"] for c in ok),
        # None, not 0 %, when no set had 2 repeats with clean steps (--repeats 1): no noise measured
        "median_noise_pct": _median_or_none(c["noise_pct"] for c in ok),
        "max_noise_pct": max(noise, default=None),
        "mean_clean_fraction": statistics.fmean(c["clean_fraction"] for c in ok),
        "sets_contended": len(contended),
        "sets_all_within_criterion": sum(c["all_within_criterion"] for c in ok),
        "median_measured_range_pct": statistics.median(c["measured_range_pct"] for c in ok),
        "predicted_choices": dict(sorted({n: sum(c["predicted"] == n for c in ok) for n in names}.items())),
        "measured_fastest": dict(sorted({n: sum(c["fastest"] == n for c in ok) for n in names}.items())),
    })  # fmt: skip
    fixed = {}
    for n in names:  # baseline: always pick n
        regs = []
        for c in ok:
            m = {
                e["sharder"]: e["measured_s"] for e in c["sharders"] if e["measured_s"] is not None
            }
            if n in m:
                regs.append(_regret(n, m) <= CRITERION)
        if regs:
            fixed[n] = sum(regs) / len(regs)
    out["fixed_sharder_success_rate"] = fixed
    if contended:  # the headline keeps every set; beside it, the sets measured on quiet cores
        quiet = [c for c in ok if not c.get("contended")]
        out["success_rate_uncontended"] = sum(c["success"] for c in quiet) / len(quiet) if quiet else None
        out["sets_uncontended"] = len(quiet)
    warnings = []
    if contended:
        warnings.append(f"{len(contended)} of {len(ok)} sets were measured contended (clean timed steps "
                        f"below {100 * MIN_CLEAN_FRACTION:.0f} % for some sharder): {', '.join(contended)}; "
                        "their success and errors are not clean figures")  # fmt: skip
    if not noise:
        clean = out.get("mean_clean_fraction")
        warnings.append("no set has 2 repeats with clean steps: repeat-to-repeat noise is not measured "
                        "(noise_pct —): with --repeats 1 there is one repeat (give --repeats 2 or more); otherwise other "
                        "processes took the ranks' cores" + (f" ({100 * clean:.0f} % of the timed steps clean)"
                                                           if clean is not None else ""))  # fmt: skip
    out["warnings"] = warnings
    return out


def _median_or_none(values: Any) -> float | None:
    v = [x for x in values if x is not None]
    return statistics.median(v) if v else None


# --- the suite ---------------------------------------------------------------------------------------


def run_shard_suite(
    data_dir: Path,
    *,
    sets: int = 10,
    seed: int = 0,
    repeats: int = 4,
    steps: int = 5,
    max_steps: int | None = None,
    warmup: int = 1,
    batch: int = 4096,
    world: int = 2,
    heavy: bool = True,
    bottom_mlp: Sequence[int] = (64, 32),
    top_mlp: Sequence[int] = (64, 1),
    optimizer: str = "sgd",
    backend: str = "fbgemm",
    sharders: Sequence[str] | None = None,
    kernel_models: str | Path | None = "auto",
    resume: str | None = None,
    measure: bool = True,
    limit: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run the suite (see the module docstring). ``data_dir`` is unused (the suite measures on
    this host). ``limit``: only the first ``limit`` sets (quick runs). ``measure=False``:
    predict and report from the results file only (sets without rows are ``incomplete``).
    ``kernel_models``: ``"auto"`` (fit the shipped CPU sample, cached), None (spec-based), or a
    ``trainsim fit`` artifact."""
    from trainsim.bench.dataset import append_row, append_rows, check_appendable, repair_tail
    from trainsim.bench.dlrm_shard import (
        ShardRun,
        measure_assignments,
        measurement_info,
        spec_digest,
        spec_payload,
    )
    from trainsim.ir.serialize import output_path
    from trainsim.search.sharders import SHARDERS

    del data_dir
    t_start = time.monotonic()
    names = list(sharders) if sharders is not None else list(SHARDERS)
    unknown = [n for n in names if n not in SHARDERS]
    if unknown:
        raise ConfigError(f"unknown sharder {unknown[0]!r}; known: {', '.join(SHARDERS)}")
    if sets < 1:
        raise ConfigError(f"--sets {sets}: the number of random table sets must be at least 1")
    if repeats < 1:
        raise ConfigError(f"--repeats {repeats}: each sharder is measured at least once (1 or more)")
    n_sets = min(sets, limit) if limit is not None else sets
    path = Path(resume).expanduser() if resume else default_results_path()
    if path.is_dir():
        raise ConfigError(f"--resume {path}: a folder; the shard suite resumes from a JSONL file "
                          f"(e.g. {path / 'shard_results.jsonl'})")  # fmt: skip
    output_path(path)  # its folder creatable: one line
    check_appendable(path, SCHEMA, "a shard-suite results file")
    run = ShardRun(steps=steps, max_steps=max_steps, warmup=warmup, repeats=repeats, threads=1,
                   optimizer=optimizer, backend=backend, seed=seed)  # fmt: skip
    info = measurement_info(run, world)
    if backend == "fbgemm" and info["embedding_backend"] != "fbgemm":
        raise ConfigError("backend fbgemm: fbgemm_gpu does not import here; pip install fbgemm-gpu-cpu==1.8.0 "
                          "(or pass backend='torch')")  # fmt: skip
    key_info = {
        k: v for k, v in info.items() if k not in ("repeats", "torch", "fbgemm_gpu", "cpu", "cores")
    }
    if isinstance(kernel_models, str) and kernel_models == "auto":
        km, pred_note = cpu_kernel_models(default_results_path().parent, log=_log if progress else None)
    elif kernel_models is None:
        km, pred_note = None, "spec-based: the CPU device's own models (no calibration)"
    else:
        km, pred_note = Path(kernel_models), f"calibrated: {kernel_models}"

    cases: list[dict[str, Any]] = []
    # rows of this run's sets by where they came from: measured now, read back from the results
    # file (an earlier run's), or copied from another sharder that gave the identical assignment
    count = {"measured_now": 0, "from_file": 0, "copied_identical": 0}
    other_repeats: dict[int, int] = {}  # rows read back that were measured with another --repeats
    with _locked(path), _interrupt_note(path, n_sets, cases):
        repair_tail(path)
        for i in range(n_sets):
            spec = table_set(i, seed=seed, world=world, heavy=heavy, batch=batch,
                             bottom_mlp=bottom_mlp, top_mlp=top_mlp)  # fmt: skip
            set_key = spec_digest({"spec": spec_payload(spec), "measure": key_info})
            preds = _predict(spec, world, names, km, seed + i, tbe=info["embedding_backend"] == "fbgemm")
            have = {
                (r["sharder"], r["assignment_key"]): r
                for r in read_rows(path)
                if r.get("set_key") == set_key
            }
            by_assign = {r["assignment_key"]: r for r in have.values()}
            rows: dict[str, dict[str, Any]] = {}
            todo: dict[str, list[int]] = {}  # assignment key -> assignment, to measure
            for n in names:
                a = preds[n].get("assignment")
                if a is None:
                    continue
                ak = _assign_key(a)
                if (n, ak) in have:
                    rows[n] = have[(n, ak)]
                    count["from_file"] += 1
                    held = (rows[n].get("measure") or {}).get("repeats")
                    if held is not None and held != repeats:
                        other_repeats[held] = other_repeats.get(held, 0) + 1
                elif ak in by_assign:  # another sharder's identical assignment was measured
                    rows[n] = _copy_row(by_assign[ak], n)
                    append_row(path, rows[n])
                    count["copied_identical"] += 1
                else:
                    todo[ak] = list(a)
            if todo and measure:
                if progress:
                    _log(f"set {i}: {len(spec.tables)} tables, measuring {len(todo)} assignments "
                         f"x {repeats} repeats ({time.monotonic() - t_start:.0f} s so far)")  # fmt: skip
                res = measure_assignments(spec, todo, world=world, run=run)
                new: list[dict[str, Any]] = []
                for n in names:
                    a = preds[n].get("assignment")
                    if a is None or n in rows:
                        continue
                    ak = _assign_key(a)
                    m = res[ak]
                    first = next(x for x in names if preds[x].get("assignment") is not None
                                 and _assign_key(preds[x]["assignment"]) == ak)  # fmt: skip
                    md = m.to_dict()
                    for k in ("name", "assignment"):
                        md.pop(k)
                    row = {"schema": SCHEMA, "set": i, "set_key": set_key, "seed": seed, "sharder": n,
                           "assignment_key": ak, "assignment": list(a), "tables": len(spec.tables),
                           "batch": spec.batch, **md, "measure": info, "same_as": first if first != n else None,
                           "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}  # fmt: skip
                    new.append(row)
                    rows[n] = row
                write_id = f"{set_key}-{uuid.uuid4().hex[:12]}"
                for row in new:
                    row.update(write_id=write_id, write_rows=len(new))
                append_rows(path, new)  # the set's rows at once: a Ctrl-C keeps all of them or none
                count["measured_now"] += len(new)
            cases.append(_case(i, spec, preds, rows, pred_note))
            if progress and cases[-1].get("status") == "ok":
                c = cases[-1]
                # None: fewer than 2 repeats with clean steps, no noise measured
                noise = "—" if c["noise_pct"] is None else f"{c['noise_pct']:.1f} %"
                _log(f"set {i}: predicted {c['predicted']}, fastest {c['fastest']}, regret {c['regret_pct']:.1f} %, "
                     f"rho {c['spearman'] if c['spearman'] is None else round(c['spearman'], 2)}, noise {noise}")  # fmt: skip
                for w in c["warnings"]:
                    _log(f"warning: {w}")
    summary = _summary(cases, names)
    if other_repeats:
        held_as = ", ".join(f"{k} ({v} rows)" for k, v in sorted(other_repeats.items()))
        w = (f"{sum(other_repeats.values())} rows read back from {path} were measured with --repeats "
             f"{held_as}, not {repeats}; they are reused as measured (give another --resume file to "
             "measure at this count)")  # fmt: skip
        summary["warnings"].append(w)
        if progress:
            _log(f"warning: {w}")
    summary.update({"rows_measured_now": count["measured_now"], "rows_from_file": count["from_file"],
                    "rows_copied_identical": count["copied_identical"],
                    # kept for readers of older results: the identical-assignment copies only
                    # (not the rows read from the file; those are rows_from_file)
                    "rows_reused": count["copied_identical"],
                    "wall_s": time.monotonic() - t_start})  # fmt: skip
    return {"suite": "shard", "cases": cases, "summary": summary,
            "params": {"sets": n_sets, "seed": seed, "repeats": repeats, "steps": steps, "warmup": warmup,
                       "batch": batch, "world": world, "heavy": heavy, "bottom_mlp": list(bottom_mlp),
                       "top_mlp": list(top_mlp), "sharders": names, "results": str(path),
                       "prediction": pred_note, "measure": info}}  # fmt: skip


@contextlib.contextmanager
def _interrupt_note(path: Path, n_sets: int, cases: list[dict[str, Any]]) -> Iterator[None]:
    """On Ctrl-C, one line saying which sets the results file holds and how to go on; then the
    interrupt goes on to the CLI (exit 130). A set's rows are written only once its interleaved
    repeats are all measured, so the set in flight is lost and measured again on resume."""
    try:
        yield
    except KeyboardInterrupt:
        done = len(cases)
        held = (f"none of the {n_sets} sets" if not done else f"set 0 (1 of {n_sets})" if done == 1
                else f"sets 0-{done - 1} ({done} of {n_sets})")  # fmt: skip
        _log(f"interrupted in set {done}: {held} complete in {path}; rerun with --resume {path} to "
             f"continue (set {done} starts over)")  # fmt: skip
        raise


def _copy_row(row: dict[str, Any], sharder: str) -> dict[str, Any]:
    """Another sharder's row for an identical assignment (a write of its own: no batch)."""
    return {**row, "write_id": None, "write_rows": None, "sharder": sharder, "same_as": row.get("same_as") or row["sharder"],
            "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}  # fmt: skip


def _log(msg: str) -> None:
    import sys

    print(f"[shard] {msg}", file=sys.stderr, flush=True)


__all__ = ["run_shard_suite", "spearman", "table_set"]
