"""The ``cpu-e2e`` suite: predict a training step at batch sizes that were never captured
(002 §4.5.1.1 *resize*; target: 002's single-GPU E2E geomean error, 7.96 %), on this CPU.

For each shipped example (``dlrm``, ``gpt2``, ``resnet``; ``limit``: the first N), captured
with ``trainsim capture`` at its default batch B (``threads`` torch threads, ``steps`` traced
steps), and each factor of :data:`FACTORS` (B/2 and 2B: one smaller, one larger — 6 cases):

* **predicted**: every traced step of each baseline capture is loaded (Kineto + execution trace),
  resized with :func:`trainsim.sim.resize.resize_batch` and the CPU kernel models (fitted on the
  shipped full calibration sample of this machine, ``bench/data/cpu_full_*``; the fit is cached, see
  :func:`trainsim.validate.shard_suite.cpu_kernel_models`), then simulated with the workload's
  own host statistics (``HostMode.STATS``: T1 and other host gaps unchanged). A repeat's
  prediction is the median over its steps (a step whose ops another process preempted does not
  carry the prediction); the case's is the median over repeats;
* **measured**: captures at the new batch, the step ``trainsim analyze`` reports (the median
  traced step), median over repeats;
* **naive baseline**: the measured baseline step × the batch ratio.

The sequence models (:data:`SEQ_MODELS`: ``gpt2`` and the LLaMA CPU stand-in) add two cases of
the same kind along the sequence, with :func:`trainsim.sim.resize.resize_seq`: the base capture
(its default length S, or its own capture at :data:`SEQ_BASES`) predicted at S/2 and 2S
(``seq_cases``, summarised apart as ``seq_geomean_abs_err_pct``, outside the batch figure the
target is set for; naive baseline: × the length ratio). The models with a
width to choose (:data:`HIDDEN_MODELS`: ``gpt2`` and the LLaMA CPU stand-in, captured at its
batch 1 for this only) add cases along the hidden size, with
:func:`trainsim.sim.resize.resize_hidden`: the base capture (its default width H) predicted at
H/2 and 2H, every width with it, with the head size kept (the head count scales,
``scale_heads=True``, against captures with that many heads: LLaMA's GQA key/value heads too)
and, for :data:`KEEP_HEADS_MODELS`, with the heads kept (the head size scales)
(``hidden_cases``, ``hidden_geomean_abs_err_pct`` over all; naive baseline: × the width
ratio).

Paired error (``paired_error_pct``; ``paired_geomean_abs_err_pct`` and its ``seq_``/``hidden_``
forms): the (low) median over repeats of repeat r's prediction against repeat r's measured step, a
diagnostic that tells model error from a noisy host (captures are interleaved, so one pass's
captures share its machine phase); the unpaired ``error_pct`` stays the headline.

Noise floor: per (model, batch) the repeat-to-repeat spread (max − min) / median of the measured
steps, and the within-capture spread (p75 − p25) / median of the traced steps; the summary gives
their medians. ``base_replay`` reports, per model, the simulated unresized baseline (median
over steps and repeats) against its measured step: the error the simulator brings before any
resize.

Captures are kept under ``resume`` (default ``~/.cache/trainsim/cpu_e2e``), one folder per
(model, batch, threads, steps, repeat); a folder whose ``capture.json`` matches is reused, so a
rerun measures nothing twice (delete the folder to re-measure). Captures of repeats are
interleaved (repeat 1 of every configuration, then repeat 2, ...) so that drifting machine load
is shared across configurations.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainsim.errors import ConfigError
from trainsim.validate.registry import error_summary

if TYPE_CHECKING:
    from trainsim.ir.graph import Workload

MODELS = ("dlrm", "gpt2", "resnet")
FACTORS = (0.5, 2.0)  # new batch = factor × the example's default batch
SEQ_MODELS = ("gpt2", "llama")  # also resized along the sequence: length = factor × the base,
# the default unless named here: LLaMA's CPU stand-in is 64 long, as wide as its heads, which a
# resize cannot tell apart (resize_seq refuses it), so it is captured at 48 for these cases
SEQ_BASES = {"llama": 48}
HIDDEN_MODELS = ("gpt2", "llama")  # and along the hidden size: width = factor × the default,
KEEP_HEADS_MODELS = ("gpt2",)  # heads of the same size, and (these) as many heads, wider
TARGET_PCT = 8.0  # 002 §4.4.3: single-GPU E2E geomean error 7.96 %


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "trainsim" / "cpu_e2e"


def geomean_abs(errors_pct: list[float | None]) -> float | None:
    vals = [abs(e) for e in errors_pct if e is not None and math.isfinite(e)]
    if not vals:
        return None
    return math.exp(statistics.fmean(math.log(max(v, 1e-9)) for v in vals))


def paired_error(predicted: Sequence[float], measured: Sequence[float]) -> float | None:
    """The (low) median over repeats of repeat r's prediction (from its base capture) against repeat r's
    measured step; None with fewer than 2 repeats or unequal counts. Repeats are captured
    interleaved, so repeat r's base and target captures ran in the same pass over the
    configurations and mostly share the machine's slow or fast phase, which the unpaired medians
    mix across passes (a diagnostic beside ``error_pct``, which stays the headline)."""
    if len(predicted) != len(measured) or len(predicted) < 2:
        return None
    # median_low: with an even count, a real repeat's error, not the mean of two that may cancel
    return statistics.median_low(100.0 * (p / m - 1.0) for p, m in zip(predicted, measured, strict=True))


def _capture(cache: Path, model: str, batch: int, *, threads: int, steps: int, rep: int,
             seq_len: int | None = None, hidden: int | None = None, heads: int | None = None) -> Path:  # fmt: skip
    """The capture folder of one configuration and repeat (captured now unless cached);
    ``seq_len``, ``hidden``, ``heads``: another than the example's default length, width, heads."""
    from trainsim.capture import MANIFEST_NAME, capture

    out = cache / (f"{model}_b{batch}_t{threads}_s{steps}_r{rep}" + (f"_q{seq_len}" if seq_len else "")
                   + (f"_h{hidden}" if hidden else "") + (f"n{heads}" if heads else ""))  # fmt: skip
    man = out / MANIFEST_NAME
    if man.exists():
        try:
            doc = json.loads(man.read_text())
        except (OSError, json.JSONDecodeError):
            doc = {}
        if (doc.get("model"), doc.get("batch_size"), doc.get("threads_per_rank"), doc.get("steps")) == (
            model, batch, threads, steps,
        ) and (seq_len is None or doc.get("seq_len") == seq_len) and (
            hidden is None or doc.get("hidden") == hidden) and (heads is None or doc.get("heads") == heads):  # fmt: skip
            return out
    capture(model=model, out_dir=out, nproc=1, steps=steps, batch_size=batch,
            threads_per_rank=threads, overwrite=True, seq_len=seq_len, hidden=hidden, heads=heads)  # fmt: skip
    return out


def _steps(folder: Path) -> list[int]:
    from trainsim.ingest import load_traces
    from trainsim.ingest.iterations import find_steps

    loaded = load_traces([folder])
    return [s.number for t in loaded.traces.values() for s in find_steps(t)]


def _measured(folder: Path) -> tuple[float, float]:
    """The median traced step (as ``trainsim analyze`` reports it) and the capture's
    within-run spread (p75 − p25) / median over its traced steps."""
    from trainsim.capture import MANIFEST_NAME
    from trainsim.sim.replay import load_for_replay

    w = load_for_replay([folder], link_et=False).workload
    if w.measured_step_s is None:
        raise ConfigError(f"{folder}: no measured step in the capture")
    times = json.loads((folder / MANIFEST_NAME).read_text())["ranks"][0]["step_times_s"]
    q = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
    return w.measured_step_s, (q[2] - q[0]) / statistics.median(times)


def _predict(folder: Path, news: list[int], resize: Callable[[Workload, int], Workload]) -> dict[str, Any]:
    """Resize every traced step of one capture to each value of ``news`` (a batch, length or
    width: ``resize(workload, new)``) and simulate it.

    Each step is loaded and its unresized baseline simulated once, shared by every new value.
    Returns ``{"base_simulated_s", "by_batch": {new: {"predicted_s", "per_step_s", "rules"}}}``.
    """
    from trainsim.sim import SimOptions, simulate
    from trainsim.sim.replay import load_for_replay

    bases: list[float] = []
    preds: dict[int, list[float]] = {n: [] for n in news}
    rules: dict[int, Any] = {}
    for step in _steps(folder):
        w = load_for_replay([folder], step=step).workload
        bases.append(simulate(w, SimOptions()).predicted_step_s)
        for n in news:
            r = resize(w, n)
            preds[n].append(simulate(r, SimOptions()).predicted_step_s)
            rules[n] = r.metadata["resize"]["rules"]
    return {"base_simulated_s": statistics.median(bases),
            "by_batch": {n: {"predicted_s": statistics.median(p), "per_step_s": p, "rules": rules[n]}
                         for n, p in preds.items()}}  # fmt: skip


def evaluate(folders: dict[tuple[str, int], list[Path]], bases: dict[str, int],
             timer: Callable[..., tuple[float, str]], *,
             seq_folders: dict[tuple[str, int], list[Path]] | None = None,
             seq_bases: dict[str, int] | None = None,
             hidden_folders: dict[tuple[str, int], list[Path]] | None = None,
             hidden_bases: dict[str, int] | None = None,
             heads_folders: dict[tuple[str, int], list[Path]] | None = None,
             heads_bases: dict[str, int] | None = None) -> dict[str, Any]:  # fmt: skip
    """Per model, the captures at its base batch resized to each other captured batch and
    simulated, against those captures' measured steps: ``cases``, ``base_replay``, ``noise``
    and ``summary`` (see the module docstring). ``seq_folders`` (model, length) and
    ``seq_bases`` (model: its base length) add the ``seq_cases`` from the same base captures;
    ``hidden_folders`` and ``hidden_bases`` the ``hidden_cases`` with the heads kept,
    ``heads_folders`` and ``heads_bases`` those with the head size kept."""
    from trainsim.sim.replay import pct_error
    from trainsim.sim.resize import resize_batch

    measured: dict[tuple[str, int], list[tuple[float, float]]] = {
        c: [_measured(f) for f in fs] for c, fs in folders.items()
    }
    noise = {f"{m}_b{b}": {"repeat_spread_pct": 100.0 * (max(v) - min(v)) / statistics.median(v) if len(v) > 1 else None,
                           "within_capture_iqr_pct": 100.0 * statistics.median(s for _, s in ms)}
             for (m, b), ms in measured.items() for v in [[x for x, _ in ms]]}  # fmt: skip
    med = {c: statistics.median(x for x, _ in ms) for c, ms in measured.items()}
    spreads = [float(x) for n in noise.values() if (x := n["repeat_spread_pct"]) is not None]

    cases: list[dict[str, Any]] = []
    base_replay: list[dict[str, Any]] = []
    for m, base in bases.items():
        news = sorted(b for mm, b in folders if mm == m and b != base)
        reps = [_predict(p, news, partial(resize_batch, old_batch=base, timer=timer)) for p in folders[(m, base)]]
        for new in news:
            per_rep = [r["by_batch"][new] for r in reps]
            preds = [r["predicted_s"] for r in per_rep]
            meas_reps = [x for x, _ in measured[(m, new)]]
            predicted = statistics.median(preds)
            naive = med[(m, base)] * new / base
            meas = med[(m, new)]
            cases.append({
                "case": f"{m} b{base}->b{new}", "model": m, "batch_from": base, "batch_to": new,
                "measured_s": meas, "predicted_s": predicted,  # not *_step_s: the CLI's replay table
                "error_pct": pct_error(predicted, meas),
                "naive_error_pct": pct_error(naive, meas), "naive_step_s": naive,
                "measured_base_step_s": med[(m, base)],
                "measured_repeats_s": meas_reps, "predicted_repeats_s": preds,
                "paired_error_pct": paired_error(preds, meas_reps),
                "rules": per_rep[0]["rules"], "status": "ok",
            })  # fmt: skip
        sim = statistics.median(r["base_simulated_s"] for r in reps)
        base_replay.append({"model": m, "batch": base, "measured_step_s": med[(m, base)],
                            "simulated_step_s": sim, "error_pct": pct_error(sim, med[(m, base)])})  # fmt: skip
    seq_cases = _dim_cases("seq", dim_folders=seq_folders or {}, dim_bases=seq_bases or {}, folders=folders,
                           bases=bases, med=med, timer=timer)  # fmt: skip
    hidden_cases = [
        *_dim_cases("hidden", dim_folders=hidden_folders or {}, dim_bases=hidden_bases or {},
                    folders=folders, bases=bases, med=med, timer=timer),
        *_dim_cases("hidden", dim_folders=heads_folders or {}, dim_bases=heads_bases or {},
                    folders=folders, bases=bases, med=med, timer=timer, scale_heads=True),
    ]  # fmt: skip
    errors = [c["error_pct"] for c in cases]
    naive_errors = [c["naive_error_pct"] for c in cases]
    summary: dict[str, Any] = {
        "geomean_abs_err_pct": geomean_abs(errors), **error_summary(errors),
        "paired_geomean_abs_err_pct": geomean_abs([c["paired_error_pct"] for c in cases]),
        "naive_geomean_abs_err_pct": geomean_abs(naive_errors),
        "naive_mape_pct": error_summary(naive_errors)["mape_pct"],
        "target_geomean_pct": TARGET_PCT,
        "noise_repeat_spread_median_pct": statistics.median(spreads) if spreads else None,  # None: one repeat
        "noise_within_capture_iqr_median_pct": statistics.median(
            100.0 * statistics.median(s for _, s in ms) for ms in measured.values()),
    }  # fmt: skip
    for dim, dcases in (("seq", seq_cases), ("hidden", hidden_cases)):
        if dcases:
            summary[f"{dim}_geomean_abs_err_pct"] = geomean_abs([c["error_pct"] for c in dcases])
            summary[f"{dim}_paired_geomean_abs_err_pct"] = geomean_abs([c["paired_error_pct"] for c in dcases])
            summary[f"{dim}_naive_geomean_abs_err_pct"] = geomean_abs([c["naive_error_pct"] for c in dcases])
    return {"cases": cases, "seq_cases": seq_cases, "hidden_cases": hidden_cases, "base_replay": base_replay,
            "noise": noise, "summary": summary}  # fmt: skip


def _dim_cases(dim: str, *, dim_folders: dict[tuple[str, int], list[Path]], dim_bases: dict[str, int],
               folders: dict[tuple[str, int], list[Path]], bases: dict[str, int],
               med: dict[tuple[str, int], float], timer: Callable[..., tuple[float, str]],
               scale_heads: bool = False) -> list[dict[str, Any]]:  # fmt: skip
    """The cases along the sequence (``dim`` "seq") or the hidden size ("hidden"): each model's
    base-batch captures (at its base length or width ``dim_bases[m]``; its captures of
    ``dim_folders`` at that value, if any, are the base instead) resized to every other value
    captured in ``dim_folders`` (model, value), against those captures' measured steps
    (``scale_heads``: the hidden resize grows the head count, not the head size)."""
    from trainsim.sim.replay import pct_error
    from trainsim.sim.resize import resize_hidden, resize_seq

    out: list[dict[str, Any]] = []
    for m, base_val in dim_bases.items():
        measured = {v: [_measured(f)[0] for f in fs] for (mm, v), fs in dim_folders.items() if mm == m}
        resize: Callable[[Workload, int], Workload] = (
            partial(resize_seq, old_seq=base_val, batch=bases[m], timer=timer) if dim == "seq"
            else partial(resize_hidden, old_hidden=base_val, timer=timer, scale_heads=scale_heads))  # fmt: skip
        # the base captures: the model's base batch at its default length/width, or its own
        # captures at ``base_val`` (SEQ_BASES), which are no case
        own = measured.pop(base_val, None)
        news = sorted(measured)
        base_folders = dim_folders[(m, base_val)] if own is not None else folders[(m, bases[m])]
        base_med = statistics.median(own) if own is not None else med[(m, bases[m])]
        reps = [_predict(p, news, resize) for p in base_folders]
        for new in news:
            per_rep = [r["by_batch"][new] for r in reps]
            preds = [r["predicted_s"] for r in per_rep]
            predicted = statistics.median(preds)
            meas = statistics.median(measured[new])
            naive = base_med * new / base_val
            out.append({
                "case": f"{m} {dim} {base_val}->{new}" + (" (heads scaled)" if scale_heads else ""), "model": m,
                f"{dim}_from": base_val, f"{dim}_to": new, **({"heads": "scaled" if scale_heads else "kept"}
                                                              if dim == "hidden" else {}),
                "measured_s": meas, "predicted_s": predicted, "error_pct": pct_error(predicted, meas),
                "naive_error_pct": pct_error(naive, meas), "naive_step_s": naive,
                "measured_repeats_s": measured[new], "predicted_repeats_s": preds,
                "paired_error_pct": paired_error(preds, measured[new]),
                "rules": per_rep[0]["rules"], "status": "ok",
            })  # fmt: skip
    return out


def run_cpu_e2e_suite(
    data_dir: Path, *, repeats: int = 3, resume: str | None = None, limit: int | None = None,
    threads: int = 1, steps: int = 9,
) -> dict[str, Any]:  # fmt: skip
    del data_dir  # everything is captured on this machine
    from trainsim.builders.dlrm import Coster
    from trainsim.capture.examples import example_info
    from trainsim.validate.shard_suite import cpu_device_file, cpu_kernel_models

    for flag, v in (("--repeats", repeats), ("threads", threads), ("steps", steps)):
        if v < 1:
            raise ConfigError(f"{flag} must be at least 1, got {v}")
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be at least 1, got {limit}")
    t0 = time.perf_counter()
    cache = Path(resume).expanduser() if resume else default_cache_dir()
    models = MODELS[:limit] if limit else MODELS
    hidden_models = [m for m in HIDDEN_MODELS if m in models or not limit or limit >= len(MODELS)]
    batches = {m: example_info(m).default_batch_size for m in (*models, *hidden_models)}
    configs = [(m, b) for m in models
               for b in (batches[m], *(max(1, round(f * batches[m])) for f in FACTORS))]  # fmt: skip
    configs += [(m, batches[m]) for m in hidden_models if m not in models]  # a base for its hidden cases
    seq_bases = {m: SEQ_BASES.get(m) or int(example_info(m).default_seq_len or 0)
                 for m in (*models, *hidden_models) if m in SEQ_MODELS}  # fmt: skip
    seq_configs = [(m, max(1, round(f * s))) for m, s in seq_bases.items() for f in FACTORS]
    seq_configs += [(m, s) for m, s in seq_bases.items() if s != example_info(m).default_seq_len]  # own bases
    folders: dict[tuple[str, int], list[Path]] = {c: [] for c in configs}
    seq_folders: dict[tuple[str, int], list[Path]] = {c: [] for c in seq_configs}
    heads_bases = {m: int(example_info(m).default_hidden or 0) for m in hidden_models}
    hidden_bases = {m: h for m, h in heads_bases.items() if m in KEEP_HEADS_MODELS}
    heads_configs = [(m, max(1, round(f * h))) for m, h in heads_bases.items() for f in FACTORS]
    hidden_configs = [(m, h) for m, h in heads_configs if m in hidden_bases]
    hidden_folders: dict[tuple[str, int], list[Path]] = {c: [] for c in hidden_configs}
    heads_folders: dict[tuple[str, int], list[Path]] = {c: [] for c in heads_configs}
    info = {m: example_info(m) for m in heads_bases}
    head_size = {m: int(i.default_hidden or 0) // int(i.default_heads or 1) for m, i in info.items()}
    for rep in range(repeats):  # interleaved: repeat r of every configuration, then r + 1
        for m, b in configs:
            folders[(m, b)].append(_capture(cache, m, b, threads=threads, steps=steps, rep=rep))
        for m, s in seq_configs:
            seq_folders[(m, s)].append(_capture(cache, m, batches[m], threads=threads, steps=steps, rep=rep, seq_len=s))
        for m, h in hidden_configs:
            hidden_folders[(m, h)].append(_capture(cache, m, batches[m], threads=threads, steps=steps, rep=rep, hidden=h))
        for m, h in heads_configs:  # an example whose heads follow its width takes no --heads
            heads = None if info[m].head_size else h // head_size[m]
            heads_folders[(m, h)].append(_capture(cache, m, batches[m], threads=threads, steps=steps, rep=rep, hidden=h,
                                                  heads=heads))  # fmt: skip
    t_capture = time.perf_counter() - t0

    artifact, kernel_note = cpu_kernel_models(  # shared with shard
        default_cache_dir().parent, log=lambda m: print(f"[cpu-e2e] {m}", file=sys.stderr, flush=True))
    timer = Coster(str(cpu_device_file()), artifact).time
    bases = {m: batches[m] for m in batches}  # the hidden-only models (llama) have their base capture too
    out = evaluate(folders, bases, timer, seq_folders=seq_folders, seq_bases=seq_bases,
                   hidden_folders=hidden_folders, hidden_bases=hidden_bases, heads_folders=heads_folders,
                   heads_bases=heads_bases)
    out["summary"]["capture_s"], out["summary"]["wall_s"] = t_capture, time.perf_counter() - t0
    return {
        "suite": "cpu-e2e",
        "params": {"repeats": repeats, "threads": threads, "steps": steps, "factors": list(FACTORS),
                   "models": list(models), "hidden_models": hidden_models, "cache": str(cache)},
        "kernel_models": kernel_note, **out,
    }  # fmt: skip
