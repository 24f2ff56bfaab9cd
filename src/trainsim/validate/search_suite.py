"""The ``search`` validation suite: would our ranking have chosen the plan that measured fastest?

Ground truth (shared/data/ground_truth) holds, for the same model, GPU count and global batch,
several measured plans (vTrain: TP/PP/DP/micro-batch variants; paper 001: PP-TP-DP layouts).
Per such group: every plan is predicted (:func:`trainsim.builders.predict.predict_llm`, the
simulation a search ranks its finalists with); the predicted-best plan's *measured* time is
compared with the measured best (regret %), and Spearman's rank correlation between predicted
and measured times is reported for groups of three or more plans. Nothing is fitted.

The summary also carries the contract's ``median_abs_err_pct``/``mape_pct``/``max_abs_err_pct``
(``errors_of`` says over what): each ranked plan's predicted iteration time against its
measurement, as each group lists them (``plan_errors``), beside the ranking's regret.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from scipy.stats import spearmanr

from trainsim.builders.costs import OpCoster
from trainsim.builders.predict import predict_llm
from trainsim.builders.spec import ModelSpec
from trainsim.errors import ConfigError
from trainsim.hardware import get_device, get_system
from trainsim.validate.llm_cases import FILES, LLMCase, parse_tags, read_cases
from trainsim.validate.registry import error_summary

# The targets and Calculon's published figures on the same groups (mean regret %,
# median Spearman): multi-node 1.3 % / 0.84, single-node 10 % / 0.61.
TARGETS = {"vtrain-multi": (1.0, 0.9), "vtrain-single": (3.0, 0.9)}
PUBLISHED = {"vtrain-multi": {"Calculon": (1.3, 0.84)}, "vtrain-single": {"Calculon": (10.0, 0.61)}}


def _file(case: LLMCase) -> str:
    tag = case.id.split(":", 1)[0]
    return f"seed001-{case.system}" if tag.startswith("seed001") else tag


def run_search_suite(data_dir: Path, *, files: str | None = None) -> dict[str, Any]:
    """Group the ground-truth rows, predict each, report regret and rank correlation."""
    t0 = time.perf_counter()
    # default: the measured files, whose groups hold different plans (the shipped H100 captures
    # repeat one plan per batch: nothing to rank)
    cases = read_cases(Path(data_dir) / "ground_truth", parse_tags(files) or list(FILES))
    # the system too: a file of one's own runs may hold several clusters; and the model itself,
    # not its name: two config files may name different models alike (the k-th of a name is k)
    variant: dict[ModelSpec, int] = {}
    named: dict[str, int] = {}
    for c in cases:
        if c.model not in variant:
            variant[c.model] = named[c.model.name] = named.get(c.model.name, 0) + 1
    groups: dict[tuple[str, str, int, int, int, str], list[LLMCase]] = {}
    for c in cases:
        key = (_file(c), c.model.name, c.plan.gpus, c.plan.batch, variant[c.model], c.system)
        groups.setdefault(key, []).append(c)
    # a file whose groups differ only in system or model config: the table says which
    systems = {f: len({k[5] for k in groups if k[0] == f}) for f in {k[0] for k in groups}}
    costers: dict[str, OpCoster] = {}
    out_groups: list[dict[str, Any]] = []
    for (fname, name, gpus, gb, k, system_name), cs in sorted(groups.items()):
        if len(cs) < 2:
            continue
        model = name if named[name] == 1 else f"{name} (config {k} of {named[name]} so named)"
        if systems[fname] > 1:
            model = f"{model} on {system_name}"
        preds = []
        for c in cs:
            system = get_system(c.system)
            coster = costers.setdefault(system.device, OpCoster(get_device(system.device)))
            preds.append(predict_llm(c.model, c.plan, system, coster=coster).iteration_time_s)
        meas = [c.measured_s for c in cs]
        best = min(meas)
        pick = min(range(len(cs)), key=lambda i: preds[i])
        truth = min(range(len(cs)), key=lambda i: meas[i])
        regret = 100.0 * (meas[pick] - best) / best
        rho = float(spearmanr(preds, meas).statistic) if len(cs) >= 3 else None
        out_groups.append({
            "file": fname, "model": model, "gpus": gpus, "global_batch": gb, "plans": len(cs),
            "predicted_best": cs[pick].plan.label(), "predicted_best_measured_s": meas[pick],
            "measured_best": cs[truth].plan.label(), "measured_best_s": best, "regret_pct": regret,
            "picked_best": pick == truth, "spearman": rho,
            "plan_errors": [{"plan": c.plan.label(), "error_pct": 100.0 * (p - m) / m}
                            for c, p, m in zip(cs, preds, meas, strict=True)],
        })  # fmt: skip
    if cases and not out_groups:  # had read "validated no case under <the data folder>" of one's own CSV
        ex = next(iter(groups))
        raise ConfigError(
            f"--files {files or ','.join(FILES)}: no plans to rank: a group is two or more runs of one model, GPU "
            f"count, global batch and system in one file, and the {len(cases)} run(s) read form {len(groups)} "
            f"group(s) of one run (e.g. {ex[1]} on {ex[2]} GPUs, global batch {ex[3]}, {ex[5]}); "
            "`trainsim validate llm --files` checks single runs"
        )
    by_file: dict[str, Any] = {}
    for fname in sorted({g["file"] for g in out_groups}):
        gs = [g for g in out_groups if g["file"] == fname]
        rhos = [g["spearman"] for g in gs if g["spearman"] is not None]
        by_file[fname] = {
            "groups": len(gs), "mean_regret_pct": statistics.fmean(g["regret_pct"] for g in gs),
            "max_regret_pct": max(g["regret_pct"] for g in gs),
            "picked_best": sum(g["picked_best"] for g in gs),
            "median_spearman": statistics.median(rhos) if rhos else None, "spearman_groups": len(rhos),
            "target_mean_regret_pct": TARGETS.get(fname, (None, None))[0],
            "target_median_spearman": TARGETS.get(fname, (None, None))[1],
            "published": PUBLISHED.get(fname, {}),
        }  # fmt: skip
    regrets = [g["regret_pct"] for g in out_groups]
    rhos = [g["spearman"] for g in out_groups if g["spearman"] is not None]
    # over every group of every file (each file's own figures, and its targets, are in ``files``)
    errors = [e["error_pct"] for g in out_groups for e in g["plan_errors"]]
    summary = {**error_summary(errors), "plans": len(errors),
               "errors_of": "every ranked plan's predicted iteration time against its measurement",
               "mean_regret_pct": statistics.fmean(regrets) if regrets else None,
               "median_regret_pct": statistics.median(regrets) if regrets else None,
               "max_regret_pct": max(regrets, default=None), "picked_best": sum(g["picked_best"] for g in out_groups),
               "median_spearman": statistics.median(rhos) if rhos else None,
               "cases": len(out_groups), "wall_s": time.perf_counter() - t0}  # fmt: skip
    return {"suite": "search", "cases": out_groups, "files": by_file, "summary": summary}
